/* Latency distributions, for hosts too noisy for averages: ranks 0 and 1
 * ping-pong 8 bytes (the others wait in a barrier meanwhile), then every
 * rank runs barriers and 8-byte allreduces. Each call is timed on its own;
 * rank 0 prints the median, the 90th percentile and the mean, one line
 * per measurement:
 *
 *   latency pingpong8 <median> <p90> <mean>   (one way: half a round trip, µs)
 *   latency barrier <median> <p90> <mean>     (µs per call)
 *   latency allreduce8 <median> <p90> <mean>
 *
 * Every allreduce's sum is checked; a wrong one prints FAILED and exits 1.
 * Built once against the MPI standard ABI, it runs on either library.
 * Usage: latency [-r ROUNDS] [-c]   (default 2000 round trips, 500
 * collectives; -c: the collectives only) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts t[0..n) and prints its median, 90th percentile and mean. */
static void report(const char *what, double *t, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    qsort(t, n, sizeof *t, cmp);
    printf("latency %s %.1f %.1f %.1f\n", what, t[n / 2], t[n * 9 / 10], sum / n);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int rounds = 2000, rank, size, pingpong = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-c")) pingpong = 0;
    }
    if (rounds < 10) rounds = 10;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int colls = rounds / 4;
    double *t = malloc(sizeof(double) * rounds);
    char buf[8] = {0};

    MPI_Barrier(MPI_COMM_WORLD);
    if (pingpong && rank < 2 && size > 1) {
        int peer = 1 - rank;
        for (int i = -20; i < rounds; i++) {
            double t0 = MPI_Wtime();
            if (rank == 0) {
                MPI_Send(buf, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                MPI_Recv(buf, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, 8, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            }
            if (i >= 0) t[i] = (MPI_Wtime() - t0) * 1e6 / 2;
        }
        if (rank == 0) report("pingpong8", t, rounds);
    }

    for (int i = -20; i < colls; i++) {
        double t0 = MPI_Wtime();
        MPI_Barrier(MPI_COMM_WORLD);
        if (i >= 0) t[i] = (MPI_Wtime() - t0) * 1e6;
    }
    if (rank == 0) report("barrier", t, colls);

    int bad = 0;
    for (int i = -20; i < colls; i++) {
        long mine = rank + i + 1, sum = 0, want = (long)size * (i + 1) + (long)size * (size - 1) / 2;
        double t0 = MPI_Wtime();
        MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (i >= 0) t[i] = (MPI_Wtime() - t0) * 1e6;
        if (sum != want) bad++;
    }
    if (rank == 0) report("allreduce8", t, colls);
    int all = 0;
    MPI_Reduce(&bad, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (all) printf("latency FAILED: %d wrong sums\n", all);
        else printf("latency ok %d\n", size);
    }
    free(t);
    MPI_Finalize();
    return all ? 1 : 0;
}
