/* Rank 3 calls MPI_Abort(7); the others sleep: the launcher must end
 * them and exit 7. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank; MPI_Init(&argc, &argv); MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 3) MPI_Abort(MPI_COMM_WORLD, 7);
    sleep(600);
    MPI_Finalize(); return 0;
}
