/* Point-to-point and collectives across every rank: an 800 KB ring
 * exchange (rendezvous), Allreduce, Bcast, Gather, Alltoall, Ssend and
 * ANY_SOURCE, a vector datatype, Alltoall in place. Prints " No Errors" on rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N 100000

int main(int argc, char **argv) {
    int rank, size, errs = 0, len;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    printf("rank %d of %d on %s\n", rank, size, name);

    double *out = malloc(N * sizeof(double)), *in = malloc(N * sizeof(double));
    for (int i = 0; i < N; i++) out[i] = rank * 1e6 + i;
    MPI_Status st;
    int left = (rank + size - 1) % size, right = (rank + 1) % size;
    MPI_Sendrecv(out, N, MPI_DOUBLE, right, 7, in, N, MPI_DOUBLE, left, 7, MPI_COMM_WORLD, &st);
    int count;
    MPI_Get_count(&st, MPI_DOUBLE, &count);
    if (count != N || st.MPI_SOURCE != left) errs++;
    for (int i = 0; i < N; i++) if (in[i] != left * 1e6 + i) { errs++; break; }

    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (sum != (long)size * (size + 1) / 2) errs++;

    int b = rank == 0 ? 4242 : 0;
    MPI_Bcast(&b, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (b != 4242) errs++;

    int *all = malloc(size * sizeof(int));
    MPI_Gather(&rank, 1, MPI_INT, all, 1, MPI_INT, size - 1, MPI_COMM_WORLD);
    if (rank == size - 1) for (int i = 0; i < size; i++) if (all[i] != i) errs++;

    int *sa = malloc(size * sizeof(int)), *ra = malloc(size * sizeof(int));
    for (int i = 0; i < size; i++) sa[i] = rank * 100 + i;
    MPI_Alltoall(sa, 1, MPI_INT, ra, 1, MPI_INT, MPI_COMM_WORLD);
    for (int i = 0; i < size; i++) if (ra[i] != i * 100 + rank) errs++;
    /* The same exchange in place. */
    for (int i = 0; i < size; i++) sa[i] = rank * 100 + i;
    MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sa, 1, MPI_INT, MPI_COMM_WORLD);
    for (int i = 0; i < size; i++) if (sa[i] != i * 100 + rank) errs++;

    /* Every rank sends its rank synchronously to 0, which takes them in
     * any order. */
    if (rank != 0) {
        MPI_Ssend(&rank, 1, MPI_INT, 0, 9, MPI_COMM_WORLD);
    } else {
        int seen = 0;
        for (int i = 1; i < size; i++) {
            int v;
            MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 9, MPI_COMM_WORLD, &st);
            if (v != st.MPI_SOURCE) errs++;
            seen |= 1 << v;
        }
        if (seen != ((1 << size) - 2)) errs++;
    }

    /* A column of a 4x4 matrix, as a vector type. */
    int m[16], col[4];
    MPI_Datatype column;
    MPI_Type_vector(4, 1, 4, MPI_INT, &column);
    MPI_Type_commit(&column);
    for (int i = 0; i < 16; i++) m[i] = rank * 16 + i;
    MPI_Sendrecv(m + 1, 1, column, right, 3, col, 4, MPI_INT, left, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (int i = 0; i < 4; i++) if (col[i] != left * 16 + 1 + 4 * i) errs++;
    MPI_Type_free(&column);

    int total;
    MPI_Reduce(&errs, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (total) printf(" Found %d errors\n", total);
        else printf(" No Errors\n");
    }
    MPI_Finalize();
    return 0;
}
