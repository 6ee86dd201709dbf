/* The collectives that run on the job's billboard (docs/mpi.md,
 * "Collectives on the billboard"), at their edges: several non-blocking
 * ones in flight at once, a non-commutative user operation (rank order),
 * in-place allgatherv with unequal blocks, a broadcast of exactly the
 * board's 56 bytes next to one of 57 (which goes by messages), and a
 * duplicate of MPI_COMM_WORLD (never on the board) interleaved with the
 * world's. Every result is checked; rank 0 prints " No Errors". */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int errors;

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            errors++;                                      \
            if (errors < 10) {                             \
                fprintf(stderr, "rank %d: ", rank);        \
                fprintf(stderr, __VA_ARGS__);              \
                fputc('\n', stderr);                       \
            }                                              \
        }                                                  \
    } while (0)

/* inout = in * 7 + inout: the order of the operands shows. */
static void affine(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    uint64_t *a = in, *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = a[i] * 7 + b[i];
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 64) {
        if (rank == 0)
            fprintf(stderr, "board: at most 64 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Op op;
    MPI_Op_create(affine, 0, &op);

    for (int round = 0; round < 100; round++) {
        /* Three non-blocking collectives in flight at once. */
        MPI_Request rq[3];
        uint64_t b = rank == size - 1 ? 1000 + round : 0;
        int64_t mine = rank + round, sum = -1;
        MPI_Ibarrier(MPI_COMM_WORLD, &rq[0]);
        MPI_Ibcast(&b, 1, MPI_UINT64_T, size - 1, MPI_COMM_WORLD, &rq[1]);
        MPI_Iallreduce(&mine, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD, &rq[2]);
        MPI_Waitall(3, rq, MPI_STATUSES_IGNORE);
        CHECK(b == (uint64_t)(1000 + round), "round %d: ibcast gave %llu", round, (unsigned long long)b);
        CHECK(sum == (int64_t)size * (size - 1) / 2 + (int64_t)size * round, "round %d: iallreduce %lld", round,
              (long long)sum);

        /* Rank order with a non-commutative operation. */
        uint64_t x[2] = {rank + 1 + round, 3 * rank + round}, got[2], want[2] = {1 + round, round};
        for (int r = 1; r < size; r++) {
            want[0] = want[0] * 7 + (uint64_t)(r + 1 + round);
            want[1] = want[1] * 7 + (uint64_t)(3 * r + round);
        }
        MPI_Allreduce(x, got, 2, MPI_UINT64_T, op, MPI_COMM_WORLD);
        CHECK(got[0] == want[0] && got[1] == want[1], "round %d: user op out of rank order", round);

        /* In-place allgatherv, rank r contributes r + 1 ints. */
        int counts[64], displs[64], all[64 * 65 / 2], at = 0;
        for (int r = 0; r < size; r++) {
            counts[r] = r + 1;
            displs[r] = at;
            at += r + 1;
        }
        for (int i = 0; i < at; i++)
            all[i] = -1;
        for (int i = 0; i < rank + 1; i++)
            all[displs[rank] + i] = rank * 100 + i + round;
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, counts, displs, MPI_INT, MPI_COMM_WORLD);
        for (int r = 0; r < size; r++)
            for (int i = 0; i < r + 1; i++)
                CHECK(all[displs[r] + i] == r * 100 + i + round, "round %d: allgatherv block %d[%d]", round, r, i);

        /* 56 bytes (the board's most) and 57 (by messages), from a moving root. */
        for (int len = 56; len <= 57; len++) {
            unsigned char buf[57];
            int root = (round + len) % size;
            for (int i = 0; i < len; i++)
                buf[i] = rank == root ? (unsigned char)(i * 3 + round + len) : 0;
            MPI_Bcast(buf, len, MPI_BYTE, root, MPI_COMM_WORLD);
            for (int i = 0; i < len; i++)
                CHECK(buf[i] == (unsigned char)(i * 3 + round + len), "round %d: bcast of %d byte %d", round, len, i);
        }

        /* The duplicate's collectives interleave with the world's. */
        int one = 1, n = 0;
        MPI_Allreduce(&one, &n, 1, MPI_INT, MPI_SUM, dup);
        CHECK(n == size, "round %d: allreduce on the duplicate gave %d", round, n);
        MPI_Barrier(MPI_COMM_WORLD);
    }

    MPI_Op_free(&op);
    MPI_Comm_free(&dup);
    int total = 0;
    MPI_Allreduce(&errors, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        if (total == 0)
            printf(" No Errors\n");
        else
            printf(" Found %d errors\n", total);
    }
    MPI_Finalize();
    return total != 0;
}
