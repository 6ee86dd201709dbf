/* A wait that lasts: rank 0 waits in MPI_Recv for a message rank 1 sends
 * only after 3 s, then in a barrier rank 1 enters 3 s late. Run with
 * MCMPI_STALL_REPORT=1, rank 0 says on stderr what each wait waited for
 * (tests/tests/mpi_host.rs). */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, v = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        MPI_Recv(&v, 1, MPI_INT, 1, 42, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        sleep(3);
        v = 7;
        MPI_Send(&v, 1, MPI_INT, 0, 42, MPI_COMM_WORLD);
        sleep(3);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("stall ok: got %d\n", v);
    MPI_Finalize();
    return 0;
}
