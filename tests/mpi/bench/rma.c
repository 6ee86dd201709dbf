/* One-sided benchmark in the style of the OSU micro-benchmarks
 * (osu_put_latency, osu_get_latency, osu_put_bw, osu_get_bw): rank 0
 * accesses rank 1's window (MPI_Win_allocate) under a shared lock, rank 1
 * waits in a barrier. For each size, powers of two from 1 byte:
 *
 *   rma put_lat SIZE <median us> <mean us>   one MPI_Put then MPI_Win_flush
 *   rma get_lat SIZE <median us> <mean us>   one MPI_Get then MPI_Win_flush
 *   rma put_bw SIZE <MB/s>                   64 puts, then one flush
 *   rma get_bw SIZE <MB/s>                   64 gets, then one flush
 *   rma fence_put SIZE <median us>           a put between two fences (both ranks)
 *
 * Every get's bytes are checked against what rank 1 wrote; a wrong one
 * prints FAILED and exits 1. Built once against the MPI standard ABI, it
 * runs on either library. Usage: rma [-m MAX] [-r ROUNDS] (default 1 MiB,
 * 200 rounds for small sizes, fewer for large). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, long size, double *t, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    qsort(t, n, sizeof *t, cmp);
    printf("rma %s %ld %.1f %.1f\n", what, size, t[n / 2], sum / n);
    fflush(stdout);
}

int main(int argc, char **argv) {
    long max = 1 << 20;
    int rounds = 200, rank, size;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) max = atol(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) rounds = atoi(argv[++i]);
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "rma: run with 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    unsigned char *win_buf, *local = malloc(WINDOW * max);
    MPI_Win win;
    MPI_Win_allocate(WINDOW * max, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win_buf, &win);
    for (long i = 0; i < WINDOW * max; i++) win_buf[i] = (unsigned char)(i * 7 + 3);
    memset(local, 0, WINDOW * max);
    double *t = malloc(sizeof(double) * (rounds + 1));
    MPI_Barrier(MPI_COMM_WORLD);
    int bad = 0;
    for (long s = 1; s <= max; s *= 2) {
        int n = s >= 65536 ? (rounds / 10 > 5 ? rounds / 10 : 5) : rounds;
        if (rank == 0) {
            MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, win);
            for (int i = -5; i < n; i++) {
                double t0 = MPI_Wtime();
                MPI_Put(local, s, MPI_BYTE, 1, 0, s, MPI_BYTE, win);
                MPI_Win_flush(1, win);
                if (i >= 0) t[i] = (MPI_Wtime() - t0) * 1e6;
            }
            report("put_lat", s, t, n);
            for (int i = -5; i < n; i++) {
                double t0 = MPI_Wtime();
                MPI_Get(local, s, MPI_BYTE, 1, s, s, MPI_BYTE, win);
                MPI_Win_flush(1, win);
                if (i >= 0) t[i] = (MPI_Wtime() - t0) * 1e6;
            }
            for (long k = 0; k < s; k++)
                if (local[k] != (unsigned char)((s + k) * 7 + 3)) bad = 1;
            report("get_lat", s, t, n);
            int w = s * WINDOW > (64 << 20) ? (int)((64 << 20) / s) : WINDOW;
            if (w < 1) w = 1;
            int reps = n / 10 > 2 ? n / 10 : 2;
            double t0 = MPI_Wtime();
            for (int r = 0; r < reps; r++) {
                for (int k = 0; k < w; k++)
                    MPI_Put(local + k * s, s, MPI_BYTE, 1, k * s, s, MPI_BYTE, win);
                MPI_Win_flush(1, win);
            }
            printf("rma put_bw %ld %.1f\n", s, (double)s * w * reps / (MPI_Wtime() - t0) / 1e6);
            t0 = MPI_Wtime();
            for (int r = 0; r < reps; r++) {
                for (int k = 0; k < w; k++)
                    MPI_Get(local + k * s, s, MPI_BYTE, 1, k * s, s, MPI_BYTE, win);
                MPI_Win_flush(1, win);
            }
            printf("rma get_bw %ld %.1f\n", s, (double)s * w * reps / (MPI_Wtime() - t0) / 1e6);
            fflush(stdout);
            MPI_Win_unlock(1, win);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        /* Puts re-wrote the start of rank 1's window: restore it for the
         * next size's get check. */
        if (rank == 1)
            for (long i = 0; i < WINDOW * max; i++) win_buf[i] = (unsigned char)(i * 7 + 3);
        int nf = n / 4 > 5 ? n / 4 : 5;
        MPI_Win_fence(0, win);
        for (int i = -2; i < nf; i++) {
            double t0 = MPI_Wtime();
            if (rank == 0) MPI_Put(local, s, MPI_BYTE, 1, WINDOW * max - s, s, MPI_BYTE, win);
            MPI_Win_fence(0, win);
            if (i >= 0) t[i] = (MPI_Wtime() - t0) * 1e6;
        }
        if (rank == 0) report("fence_put", s, t, nf);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 1)
            for (long i = 0; i < WINDOW * max; i++) win_buf[i] = (unsigned char)(i * 7 + 3);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Win_free(&win);
    if (bad) printf("rma FAILED: a get brought wrong bytes\n");
    MPI_Finalize();
    return bad;
}
