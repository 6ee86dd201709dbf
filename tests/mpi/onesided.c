/* One-sided communication across guests: every window flavour and every
 * synchronisation, with results checked.
 *
 *  1. fence:   Win_allocate; each rank puts its rank into a slot of every
 *              other rank's window, gets a block from its right neighbour
 *              (strided, a vector type at the target) and accumulates
 *              into rank 0.
 *  2. PSCW:    rank r exposes to r-1 and accesses r+1 (a ring), twice.
 *  3. passive: MPI_Fetch_and_op tickets from rank 0 under lock_all (each
 *              ticket handed out once), and a counter at the last rank
 *              read and written back under exclusive locks (no update
 *              lost), and a compare-and-swap election.
 *  4. dynamic: Win_create_dynamic with attached memory, Rput and Rget.
 *  5. shared:  Win_allocate_shared over each guest's ranks, loads and
 *              stores through MPI_Win_shared_query.
 *
 * Prints " No Errors" from rank 0 when every check passed. Usage:
 * onesided [rounds] (default 20).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int errs;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            errs++;                                                                                \
            if (errs < 10) {                                                                       \
                printf("rank %d: ", rank);                                                         \
                printf(__VA_ARGS__);                                                               \
                printf("\n");                                                                      \
            }                                                                                      \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    int rank, size, rounds = argc > 1 ? atoi(argv[1]) : 20;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    char host[MPI_MAX_PROCESSOR_NAME];
    int hlen;
    MPI_Get_processor_name(host, &hlen);
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);

    /* 1. Fence. */
    const int N = 4096;
    long *base;
    MPI_Win win;
    MPI_Win_allocate((MPI_Aint)(size + 2 * N) * sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD,
                     &base, &win);
    for (int i = 0; i < size + 2 * N; i++)
        base[i] = (i >= size && i < size + N) ? (long)rank * 1000000 + i : 0;
    MPI_Win_fence(0, win);
    long me = rank;
    for (int t = 0; t < size; t++)
        MPI_Put(&me, 1, MPI_LONG, t, rank, 1, MPI_LONG, win);
    /* Every other long of the neighbour's block (a vector at the target). */
    MPI_Datatype every_other;
    MPI_Type_vector(N / 2, 1, 2, MPI_LONG, &every_other);
    MPI_Type_commit(&every_other);
    long *got = calloc(N / 2, sizeof(long));
    MPI_Get(got, N / 2, MPI_LONG, right, size, 1, every_other, win);
    long *ones = malloc(N * sizeof(long));
    for (int i = 0; i < N; i++)
        ones[i] = rank + 1;
    MPI_Accumulate(ones, N, MPI_LONG, 0, size + N, N, MPI_LONG, MPI_SUM, win);
    MPI_Win_fence(0, win);
    for (int t = 0; t < size; t++)
        CHECK(base[t] == t, "fence: slot %d holds %ld", t, base[t]);
    for (int i = 0; i < N / 2; i++)
        CHECK(got[i] == (long)right * 1000000 + size + 2 * i, "fence: got[%d] = %ld", i, got[i]);
    if (rank == 0)
        for (int i = 0; i < N; i++)
            CHECK(base[size + N + i] == (long)size * (size + 1) / 2, "fence: sum[%d] = %ld", i, base[size + N + i]);
    MPI_Win_fence(0, win);

    /* 2. Post, start, complete, wait: a ring, twice. */
    MPI_Group world, gl, gr;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, 1, &left, &gl);
    MPI_Group_incl(world, 1, &right, &gr);
    for (int round = 0; round < 2; round++) {
        MPI_Win_post(gl, 0, win);
        MPI_Win_start(gr, 0, win);
        long v = rank * 10 + round;
        MPI_Put(&v, 1, MPI_LONG, right, 0, 1, MPI_LONG, win);
        MPI_Win_complete(win);
        MPI_Win_wait(win);
        CHECK(base[0] == left * 10 + round, "pscw round %d: %ld from %d", round, base[0], left);
    }

    /* 3. Passive target. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0 || rank == size - 1) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, win);
        base[1] = 0;
        base[2] = -1;
        base[3] = 0;
        MPI_Win_unlock(rank, win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    long *tickets = malloc(rounds * sizeof(long));
    long one = 1;
    MPI_Win_lock_all(0, win);
    for (int i = 0; i < rounds; i++) {
        MPI_Fetch_and_op(&one, &tickets[i], MPI_LONG, 0, 1, MPI_SUM, win);
        MPI_Win_flush(0, win);
    }
    MPI_Win_unlock_all(win);
    long *all = malloc((size_t)rounds * size * sizeof(long));
    MPI_Gather(tickets, rounds, MPI_LONG, all, rounds, MPI_LONG, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        char *seen = calloc((size_t)rounds * size, 1);
        for (int i = 0; i < rounds * size; i++) {
            CHECK(all[i] >= 0 && all[i] < rounds * size && !seen[all[i]], "ticket %ld twice or out of range",
                  all[i]);
            if (all[i] >= 0 && all[i] < rounds * size)
                seen[all[i]] = 1;
        }
        free(seen);
    }
    int last = size - 1;
    for (int i = 0; i < rounds; i++) {
        long v;
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, last, 0, win);
        MPI_Get(&v, 1, MPI_LONG, last, 3, 1, MPI_LONG, win);
        MPI_Win_flush(last, win);
        v++;
        MPI_Put(&v, 1, MPI_LONG, last, 3, 1, MPI_LONG, win);
        MPI_Win_unlock(last, win);
    }
    long cand = rank, old;
    MPI_Win_lock(MPI_LOCK_SHARED, last, 0, win);
    MPI_Compare_and_swap(&cand, &(long){-1}, &old, MPI_LONG, last, 2, win);
    MPI_Win_unlock(last, win);
    int won = old == -1, winners;
    MPI_Allreduce(&won, &winners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(winners == 1, "compare-and-swap: %d winners", winners);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == last) {
        MPI_Win_lock(MPI_LOCK_SHARED, last, 0, win);
        CHECK(base[3] == (long)rounds * size, "exclusive counter %ld, not %ld", base[3], (long)rounds * size);
        CHECK(base[2] >= 0 && base[2] < size, "elected %ld", base[2]);
        MPI_Win_unlock(last, win);
    }
    MPI_Type_free(&every_other);
    MPI_Win_free(&win);

    /* 4. Dynamic window, request-based operations. */
    MPI_Win dyn;
    MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &dyn);
    int *mem = calloc(N, sizeof(int));
    MPI_Win_attach(dyn, mem, N * sizeof(int));
    MPI_Aint addr, *addrs = malloc(size * sizeof(MPI_Aint));
    MPI_Get_address(mem, &addr);
    MPI_Allgather(&addr, 1, MPI_AINT, addrs, 1, MPI_AINT, MPI_COMM_WORLD);
    int *src = malloc(N * sizeof(int)), *back = calloc(N, sizeof(int));
    for (int i = 0; i < N; i++)
        src[i] = rank * 7 + i;
    MPI_Request rq;
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, right, 0, dyn);
    MPI_Rput(src, N, MPI_INT, right, addrs[right], N, MPI_INT, dyn, &rq);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    MPI_Win_flush(right, dyn);
    MPI_Rget(back, N, MPI_INT, right, addrs[right], N, MPI_INT, dyn, &rq);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    MPI_Win_unlock(right, dyn);
    CHECK(memcmp(src, back, N * sizeof(int)) == 0, "dynamic: what came back differs");
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mem[N - 1] == left * 7 + N - 1, "dynamic: mem[N-1] = %d", mem[N - 1]);
    MPI_Win_detach(dyn, mem);
    MPI_Win_free(&dyn);

    /* 5. Shared memory among the ranks of one guest. */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int nr, ns;
    MPI_Comm_rank(node, &nr);
    MPI_Comm_size(node, &ns);
    int *mine;
    MPI_Win shw;
    MPI_Win_allocate_shared(64 * sizeof(int), sizeof(int), MPI_INFO_NULL, node, &mine, &shw);
    MPI_Win_lock_all(0, shw);
    for (int i = 0; i < 64; i++)
        mine[i] = rank * 100 + i;
    MPI_Win_sync(shw);
    MPI_Barrier(node);
    MPI_Win_sync(shw);
    for (int p = 0; p < ns; p++) {
        MPI_Aint sz;
        int du, *theirs;
        MPI_Win_shared_query(shw, p, &sz, &du, &theirs);
        int their_world;
        MPI_Group ng, wg;
        MPI_Comm_group(node, &ng);
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        MPI_Group_translate_ranks(ng, 1, &p, wg, &their_world);
        MPI_Group_free(&ng);
        MPI_Group_free(&wg);
        CHECK(sz == 64 * sizeof(int) && du == sizeof(int), "shared: size %ld unit %d", (long)sz, du);
        CHECK(theirs[63] == their_world * 100 + 63, "shared: rank %d's memory holds %d", p, theirs[63]);
    }
    MPI_Win_unlock_all(shw);
    MPI_Win_free(&shw);
    MPI_Comm_free(&node);

    int total;
    MPI_Allreduce(&errs, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        if (total == 0)
            printf(" No Errors\n");
        else
            printf(" Found %d errors\n", total);
    }
    free(got);
    free(ones);
    free(tickets);
    free(all);
    free(mem);
    free(addrs);
    free(src);
    free(back);
    MPI_Group_free(&gl);
    MPI_Group_free(&gr);
    MPI_Group_free(&world);
    MPI_Finalize();
    return total != 0;
}
