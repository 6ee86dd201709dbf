/* The course's MPI program: every rank says where it runs, rank 0 sums the ranks. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size, sum = 0;
    char host[64];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    printf("rank %d of %d on %s\n", rank, size, host);
    MPI_Reduce(&rank, &sum, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("sum of ranks %d\n", sum);
    MPI_Finalize();
    return 0;
}
