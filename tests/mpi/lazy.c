/* Channels opened on first use: every rank but 0 sends its rank to rank 0,
 * which receives them from MPI_ANY_SOURCE (channels it never opened itself)
 * and answers each; then each rank passes a value to the next, around the
 * ring. Rank 0 talks to every rank; the others to a few. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, errs = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0) {
        unsigned long long seen = 0;
        for (int i = 1; i < size; i++) {
            int v;
            MPI_Status st;
            MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, &st);
            if (v != st.MPI_SOURCE) errs++;
            seen |= 1ULL << (v % 64);
            int back = v * 10;
            MPI_Send(&back, 1, MPI_INT, v, 8, MPI_COMM_WORLD);
        }
        if (size < 64 && seen != ((1ULL << size) - 2)) errs++;
    } else {
        int back;
        MPI_Send(&rank, 1, MPI_INT, 0, 7, MPI_COMM_WORLD);
        MPI_Recv(&back, 1, MPI_INT, 0, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (back != rank * 10) errs++;
    }
    int next = (rank + 1) % size, prev = (rank + size - 1) % size, got = -1;
    MPI_Sendrecv(&rank, 1, MPI_INT, next, 9, &got, 1, MPI_INT, prev, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (got != prev) errs++;
    if (errs) printf("rank %d: %d errors\n", rank, errs);
    else if (rank == 0) printf(" No Errors\n");
    MPI_Finalize();
    return errs != 0;
}
