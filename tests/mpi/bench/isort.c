/*
 * Parallel integer sort (a bucket sort in the manner of the NAS Parallel
 * Benchmarks' IS kernel), the application of the MPI comparison
 * (scripts/mpi-bench.sh). Built once against the standard ABI's mpi.h.
 *
 * N keys in [0, MAXKEY) come from a fixed generator by global index, so
 * the input, and therefore the answer, does not depend on the number of
 * ranks. Each round: every rank buckets its keys by destination rank
 * (equal key ranges), the counts go by MPI_Alltoall, the keys by
 * MPI_Alltoallv, and each rank counting-sorts what it got.
 *
 * Verified after the last round: each rank's keys are sorted, the last key
 * of rank r is at most the first of rank r+1, the total is N, and the sum
 * and a position-weighted checksum of the sorted sequence equal the values
 * rank 0 computes from the generator alone.
 *
 * Output (rank 0):
 *   isort keys N maxkey M ranks P rounds R
 *   isort round K SECONDS
 *   isort best SECONDS mkeys_per_s X
 *   isort verified sum S checksum C        (or a line starting "isort FAILED")
 *
 * Usage: isort [-n KEYS] [-k MAXKEY] [-r ROUNDS]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The key at global index i: a 64-bit mix of i, reduced to the key range
 * with a bias towards the middle (the sum of two draws, as IS does). */
static uint32_t key_at(uint64_t i, uint32_t maxkey)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    uint64_t a = (z & 0xFFFFFFFFull) % maxkey, b = (z >> 32) % maxkey;
    return (uint32_t)((a + b) / 2);
}

static void *xmalloc(size_t n, int rank)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "isort: rank %d: out of memory for %zu bytes\n", rank, n);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

int main(int argc, char **argv)
{
    long nkeys = 1 << 21;
    long maxkey = 1 << 19;
    int rounds = 5, rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) nkeys = atol(argv[++i]);
        else if (strcmp(argv[i], "-k") == 0 && i + 1 < argc) maxkey = atol(argv[++i]);
        else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
        else {
            if (rank == 0) fprintf(stderr, "usage: isort [-n KEYS] [-k MAXKEY] [-r ROUNDS]\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nkeys < size || maxkey < size || maxkey > (1l << 31) || rounds < 1) {
        if (rank == 0) fprintf(stderr, "isort: need KEYS >= ranks, ranks <= MAXKEY <= 2^31, ROUNDS >= 1\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* This rank's slice of the global input. */
    long lo = nkeys * rank / size, hi = nkeys * (rank + 1) / size, mine = hi - lo;
    uint32_t *keys = xmalloc(sizeof(uint32_t) * mine, rank);
    for (long i = 0; i < mine; i++) keys[i] = key_at((uint64_t)(lo + i), (uint32_t)maxkey);
    /* Rank r owns keys in [r*span, (r+1)*span). */
    long span = (maxkey + size - 1) / size;
    int *scount = xmalloc(sizeof(int) * size, rank), *rcount = xmalloc(sizeof(int) * size, rank);
    int *sdisp = xmalloc(sizeof(int) * size, rank), *rdisp = xmalloc(sizeof(int) * size, rank);
    int *fill = xmalloc(sizeof(int) * size, rank);
    uint32_t *sendbuf = xmalloc(sizeof(uint32_t) * mine, rank);
    uint32_t *got = NULL, *sorted = NULL;
    long *hist = xmalloc(sizeof(long) * (span + 1), rank);
    long ngot = 0;
    if (rank == 0) {
        printf("isort keys %ld maxkey %ld ranks %d rounds %d\n", nkeys, maxkey, size, rounds);
        fflush(stdout);
    }
    double best = 1e30;
    for (int round = 1; round <= rounds; round++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        memset(scount, 0, sizeof(int) * size);
        for (long i = 0; i < mine; i++) scount[keys[i] / span]++;
        sdisp[0] = 0;
        for (int r = 1; r < size; r++) sdisp[r] = sdisp[r - 1] + scount[r - 1];
        memcpy(fill, sdisp, sizeof(int) * size);
        for (long i = 0; i < mine; i++) sendbuf[fill[keys[i] / span]++] = keys[i];
        MPI_Alltoall(scount, 1, MPI_INT, rcount, 1, MPI_INT, MPI_COMM_WORLD);
        rdisp[0] = 0;
        for (int r = 1; r < size; r++) rdisp[r] = rdisp[r - 1] + rcount[r - 1];
        ngot = rdisp[size - 1] + rcount[size - 1];
        free(got);
        free(sorted);
        got = xmalloc(sizeof(uint32_t) * ngot, rank);
        sorted = xmalloc(sizeof(uint32_t) * ngot, rank);
        MPI_Alltoallv(sendbuf, scount, sdisp, MPI_UINT32_T, got, rcount, rdisp, MPI_UINT32_T, MPI_COMM_WORLD);
        /* Counting sort of this rank's key range. */
        long base = span * rank;
        memset(hist, 0, sizeof(long) * (span + 1));
        for (long i = 0; i < ngot; i++) hist[got[i] - base + 1]++;
        for (long k = 1; k <= span; k++) hist[k] += hist[k - 1];
        for (long i = 0; i < ngot; i++) sorted[hist[got[i] - base]++] = got[i];
        t = MPI_Wtime() - t;
        double tmax;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (tmax < best) best = tmax;
        if (rank == 0) {
            printf("isort round %d %.4f\n", round, tmax);
            fflush(stdout);
        }
    }
    /* Verification. */
    int ok = 1;
    long base = span * rank;
    for (long i = 0; i < ngot; i++) {
        if (sorted[i] < base || sorted[i] >= base + span || (i > 0 && sorted[i - 1] > sorted[i])) {
            ok = 0;
            break;
        }
    }
    /* Global positions: the keys before this rank's. */
    long before = 0, total = 0;
    MPI_Exscan(&ngot, &before, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) before = 0;
    MPI_Allreduce(&ngot, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    uint64_t sum = 0, check = 0;
    for (long i = 0; i < ngot; i++) {
        sum += sorted[i];
        check += (uint64_t)sorted[i] * (uint64_t)(before + i + 1);
    }
    /* Order across ranks: my last key against the next non-empty rank's first. */
    long edge[2] = {ngot ? (long)sorted[0] : -1, ngot ? (long)sorted[ngot - 1] : -1};
    long *edges = xmalloc(sizeof(long) * 2 * size, rank);
    MPI_Allgather(edge, 2, MPI_LONG, edges, 2, MPI_LONG, MPI_COMM_WORLD);
    long last = -1;
    for (int r = 0; r < size; r++) {
        if (edges[2 * r] < 0) continue;
        if (edges[2 * r] < last) ok = 0;
        last = edges[2 * r + 1];
    }
    uint64_t gsum = 0, gcheck = 0;
    int allok = 0;
    MPI_Reduce(&sum, &gsum, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&check, &gcheck, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&ok, &allok, 1, MPI_INT, MPI_LAND, 0, MPI_COMM_WORLD);
    int code = 0;
    if (rank == 0) {
        /* The expected values, from the generator alone: count keys per
         * value, then walk the values in order. */
        long *count = xmalloc(sizeof(long) * maxkey, rank);
        memset(count, 0, sizeof(long) * maxkey);
        for (long i = 0; i < nkeys; i++) count[key_at((uint64_t)i, (uint32_t)maxkey)]++;
        uint64_t esum = 0, echeck = 0, pos = 0;
        for (long k = 0; k < maxkey; k++)
            for (long c = 0; c < count[k]; c++) {
                pos++;
                esum += (uint64_t)k;
                echeck += (uint64_t)k * pos;
            }
        free(count);
        printf("isort best %.4f mkeys_per_s %.2f\n", best, nkeys / best / 1e6);
        if (allok && total == nkeys && gsum == esum && gcheck == echeck) {
            printf("isort verified sum %llu checksum %llu\n", (unsigned long long)gsum, (unsigned long long)gcheck);
        } else {
            printf("isort FAILED: order %s, %ld of %ld keys, sum %llu (expected %llu), checksum %llu (expected %llu)\n",
                   allok ? "ok" : "wrong", total, nkeys, (unsigned long long)gsum, (unsigned long long)esum,
                   (unsigned long long)gcheck, (unsigned long long)echeck);
            code = 1;
        }
        fflush(stdout);
    }
    MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(keys);
    free(sendbuf);
    free(got);
    free(sorted);
    free(hist);
    free(edges);
    free(scount);
    free(rcount);
    free(sdisp);
    free(rdisp);
    free(fill);
    MPI_Finalize();
    return code;
}
