/*
 * Collective benchmark for the MPI comparison (scripts/mpi-bench.sh):
 * time per call of MPI_Barrier, MPI_Bcast, MPI_Allreduce and MPI_Alltoall
 * against message size, on MPI_COMM_WORLD. Built once against the
 * standard ABI's mpi.h; LD_LIBRARY_PATH picks the library it runs on.
 *
 * Every call's result is checked (broadcast contents, reduction sums,
 * all-to-all blocks), so a fast wrong answer fails instead of winning.
 *
 * Output (rank 0), one line per point:
 *   coll OP BYTES USEC_PER_CALL ITERATIONS
 * where BYTES is the message size per rank (Bcast: the buffer; Allreduce:
 * the vector; Alltoall: the block sent to each rank) and the time is the
 * slowest rank's mean. The last line is "collbench ok RANKS".
 *
 * Usage: collbench [-m MAX_BYTES] [-t SECONDS_PER_POINT]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what, long at)
{
    fprintf(stderr, "collbench: rank %d: wrong result of %s at %ld\n", rank, what, at);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static unsigned char pattern(int root, long i, int round)
{
    return (unsigned char)(root * 31 + i * 7 + round * 13 + 1);
}

/* One call of OP with BYTES, checked; ROUND varies the data. */
static void one(const char *op, long bytes, int round, unsigned char *a, unsigned char *b)
{
    if (strcmp(op, "barrier") == 0) {
        MPI_Barrier(MPI_COMM_WORLD);
    } else if (strcmp(op, "bcast") == 0) {
        int root = round % size;
        if (rank == root)
            for (long i = 0; i < bytes; i++) a[i] = pattern(root, i, round);
        MPI_Bcast(a, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
        for (long i = 0; i < bytes; i += 61)
            if (a[i] != pattern(root, i, round)) fail(op, i);
        if (bytes > 0 && a[bytes - 1] != pattern(root, bytes - 1, round)) fail(op, bytes - 1);
    } else if (strcmp(op, "allreduce") == 0) {
        long n = bytes / 8;
        int64_t *x = (int64_t *)a, *y = (int64_t *)b;
        for (long i = 0; i < n; i++) x[i] = (int64_t)(rank + 1) * (i + round);
        MPI_Allreduce(x, y, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        int64_t ranks = (int64_t)size * (size + 1) / 2;
        for (long i = 0; i < n; i += 7)
            if (y[i] != ranks * (i + round)) fail(op, i);
    } else if (strcmp(op, "alltoall") == 0) {
        for (int r = 0; r < size; r++)
            for (long i = 0; i < bytes; i++) a[r * bytes + i] = (unsigned char)(rank * 5 + r * 3 + i + round);
        MPI_Alltoall(a, (int)bytes, MPI_BYTE, b, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
        for (int r = 0; r < size; r++)
            for (long i = 0; i < bytes; i += 53)
                if (b[r * bytes + i] != (unsigned char)(r * 5 + rank * 3 + i + round)) fail(op, r * bytes + i);
    }
}

int main(int argc, char **argv)
{
    long max = 1 << 20;
    double secs = 0.3;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-m") == 0 && i + 1 < argc) max = atol(argv[++i]);
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) secs = atof(argv[++i]);
        else {
            if (rank == 0) fprintf(stderr, "usage: collbench [-m MAX_BYTES] [-t SECONDS_PER_POINT]\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (max < 8) max = 8;
    unsigned char *a = malloc((size_t)max * size), *b = malloc((size_t)max * size);
    if (!a || !b) {
        fprintf(stderr, "collbench: rank %d: out of memory for %ld bytes\n", rank, max * size * 2);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *ops[] = {"barrier", "bcast", "allreduce", "alltoall"};
    for (int o = 0; o < 4; o++) {
        for (long bytes = 8; bytes <= max; bytes *= 8) {
            if (o == 0 && bytes > 8) break; /* a barrier has no size */
            /* Warm up once, then pick the count from the slowest rank's time
             * so that a point takes about SECS. */
            double t = MPI_Wtime();
            one(ops[o], bytes, 0, a, b);
            t = MPI_Wtime() - t;
            double tmax;
            MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            int iters = tmax > 0 ? (int)(secs / tmax) : 300;
            if (iters < 3) iters = 3;
            if (iters > 300) iters = 300;
            MPI_Barrier(MPI_COMM_WORLD);
            t = MPI_Wtime();
            for (int k = 1; k <= iters; k++) one(ops[o], bytes, k, a, b);
            t = (MPI_Wtime() - t) / iters;
            MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (rank == 0) {
                printf("coll %s %ld %.2f %d\n", ops[o], o == 0 ? 0 : bytes, tmax * 1e6, iters);
                fflush(stdout);
            }
        }
    }
    if (rank == 0) printf("collbench ok %d\n", size);
    free(a);
    free(b);
    MPI_Finalize();
    return 0;
}
