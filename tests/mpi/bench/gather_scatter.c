/*
 * Rounds of a gather to rank 0 and a scatter back, one small message per
 * rank each way: the pattern of MPICH's pt2pt/sendflood, with the number
 * of rounds as an argument, so the cost of a round can be measured
 * without 100,000 of them. Built once against the standard ABI's mpi.h;
 * the same binary runs on MPICH (docs/mpi.md, "MPICH's suite across
 * guests").
 *
 * Checked: every message carries its round and sender, and rank 0's reply
 * its round and receiver.
 *
 * Output (rank 0):
 *   gather_scatter ranks P rounds R: SECONDS s, US us/round
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, size, rounds = argc > 1 ? atoi(argv[1]) : 4096;
    int buf[3];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double t = MPI_Wtime();
    for (int i = 0; i < rounds; i++) {
        if (rank == 0) {
            for (int j = 1; j < size; j++) {
                MPI_Recv(buf, 3, MPI_INT, j, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (buf[0] != i || buf[1] != j) {
                    fprintf(stderr, "round %d: from %d got round %d sender %d\n", i, j, buf[0], buf[1]);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            }
            for (int j = 1; j < size; j++) {
                buf[0] = i;
                buf[1] = j;
                MPI_Send(buf, 3, MPI_INT, j, 9, MPI_COMM_WORLD);
            }
        } else {
            buf[0] = i;
            buf[1] = rank;
            MPI_Send(buf, 3, MPI_INT, 0, 9, MPI_COMM_WORLD);
            MPI_Recv(buf, 3, MPI_INT, 0, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (buf[0] != i || buf[1] != rank) {
                fprintf(stderr, "rank %d round %d: got round %d receiver %d\n", rank, i, buf[0], buf[1]);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
    t = MPI_Wtime() - t;
    if (rank == 0)
        printf("gather_scatter ranks %d rounds %d: %.2f s, %.0f us/round\n", size, rounds, t, t / rounds * 1e6);
    MPI_Finalize();
    return 0;
}
