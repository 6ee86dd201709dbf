/* Ping-pong bandwidth between rank 0 and the last rank (on another guest
 * when there is one), with buffers from MPI_Alloc_mem (-a) or malloc: an
 * MPI that can move a message from registered memory straight into
 * registered memory does it with -a. The other ranks wait in a barrier.
 * For each size, rank 0 prints one line:
 *
 *   bw <bytes> <MB/s one way at the median> <median µs one way> <MB/s mean>
 *
 * One way is half a round trip. Each size runs one round trip to warm up,
 * then ROUNDS timed ones, then one more with fresh bytes and a cleared
 * buffer on both sides, whose every byte is checked (a wrong one prints
 * FAILED and exits 1); with -c every round is such a round (timed too).
 * Built once against the MPI standard ABI, it runs on either library.
 * Usage: bw [-a] [-c] [-s SIZE,SIZE,...] [-r ROUNDS]
 *   (default sizes 256K,1M,4M with K/M suffixes allowed, 10 rounds) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static long parse_size(const char *s, char **end) {
    long n = strtol(s, end, 10);
    if (**end == 'K' || **end == 'k') n <<= 10, (*end)++;
    else if (**end == 'M' || **end == 'm') n <<= 20, (*end)++;
    return n;
}

/* The byte at i of the message rank `from` sends in round `round`. */
static unsigned char pattern(long i, int from, int round) {
    return (unsigned char)(i * 131 + (i >> 9) * 7 + from * 29 + round * 17);
}

int main(int argc, char **argv) {
    int rounds = 10, alloc = 0, every = 0, rank, size, bad = 0;
    long sizes[32], nsizes = 0, biggest = 0;
    const char *list = "256K,1M,4M";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) list = argv[++i];
        else if (!strcmp(argv[i], "-a")) alloc = 1;
        else if (!strcmp(argv[i], "-c")) every = 1;
    }
    for (const char *p = list; *p && nsizes < 32;) {
        char *end;
        long n = parse_size(p, &end);
        if (end == p || n <= 0) break;
        sizes[nsizes++] = n;
        if (n > biggest) biggest = n;
        p = *end == ',' ? end + 1 : end;
    }
    if (rounds < 1) rounds = 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int peer = rank == 0 ? size - 1 : 0, active = size > 1 && (rank == 0 || rank == size - 1);
    unsigned char *out = NULL, *in = NULL;
    if (alloc) {
        MPI_Alloc_mem(biggest, MPI_INFO_NULL, &out);
        MPI_Alloc_mem(biggest, MPI_INFO_NULL, &in);
    } else {
        out = malloc(biggest);
        in = malloc(biggest);
    }
    double *t = malloc(sizeof(double) * rounds);
    MPI_Barrier(MPI_COMM_WORLD);
    for (long k = 0; k < nsizes && active; k++) {
        long n = sizes[k];
        for (long i = 0; i < n; i++) out[i] = pattern(i, rank, 0);
        for (int r = -1; r <= rounds; r++) {
            int check = r == rounds || (every && r >= 0);
            if (check) {
                for (long i = 0; i < n; i++) out[i] = pattern(i, rank, r);
                memset(in, 0, n);
            }
            double t0 = MPI_Wtime();
            if (rank == 0) {
                MPI_Send(out, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                MPI_Recv(in, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(in, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(out, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            }
            if (r >= 0 && r < rounds) t[r] = (MPI_Wtime() - t0) / 2;
            if (check) {
                for (long i = 0; i < n; i++) {
                    if (in[i] != pattern(i, peer, r)) {
                        printf("bw FAILED: rank %d, %ld bytes: byte %ld is %d, not %d\n", rank, n, i, in[i],
                               pattern(i, peer, r));
                        bad = 1;
                        break;
                    }
                }
            }
        }
        if (rank == 0) {
            double sum = 0;
            for (int r = 0; r < rounds; r++) sum += t[r];
            qsort(t, rounds, sizeof *t, cmp);
            double med = t[rounds / 2];
            printf("bw %ld %.1f %.1f %.1f\n", n, n / med / 1e6, med * 1e6, n * rounds / sum / 1e6);
            fflush(stdout);
        }
    }
    int all = 0;
    MPI_Reduce(&bad, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (all) printf("bw FAILED\n");
        else printf("bw ok %d %s\n", size, alloc ? "alloc_mem" : "malloc");
    }
    if (alloc) {
        MPI_Free_mem(out);
        MPI_Free_mem(in);
    } else {
        free(out);
        free(in);
    }
    free(t);
    MPI_Finalize();
    return all ? 1 : 0;
}
