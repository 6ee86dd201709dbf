/* Every rank but the last floods the last with M non-blocking sends
 * (100 bytes to 20 KB, tags 0..M-1, some synchronous) that it does not
 * receive yet: it only probes for a while. Then it receives them in
 * reverse tag order and checks every byte. What waits unmatched at the
 * receiver is bounded by the senders' credit (MCMPI_STATS shows it); the
 * messages past the credit wait at their senders. Prints " No Errors" on
 * rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define M 1500

static int len_of(int from, int i) { return i % 50 == 7 ? 20000 : 100 + (i * 37 + from * 11) % 3900; }
static unsigned char byte_of(int from, int i, int j) { return (unsigned char)(j * 31 + i * 7 + from); }

int main(int argc, char **argv) {
    int rank, size, errs = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int last = size - 1;
    if (rank != last) {
        MPI_Request *req = malloc(M * sizeof *req);
        unsigned char **buf = malloc(M * sizeof *buf);
        for (int i = 0; i < M; i++) {
            int n = len_of(rank, i);
            buf[i] = malloc(n);
            for (int j = 0; j < n; j++) buf[i][j] = byte_of(rank, i, j);
            if (i % 13 == 5)
                MPI_Issend(buf[i], n, MPI_BYTE, last, i, MPI_COMM_WORLD, &req[i]);
            else
                MPI_Isend(buf[i], n, MPI_BYTE, last, i, MPI_COMM_WORLD, &req[i]);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Waitall(M, req, MPI_STATUSES_IGNORE);
        for (int i = 0; i < M; i++) free(buf[i]);
        free(buf);
        free(req);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        /* Everything is sent: let what can arrive, arrive, unmatched. */
        double t0 = MPI_Wtime();
        int flag;
        while (MPI_Wtime() - t0 < 1.0) MPI_Iprobe(MPI_ANY_SOURCE, M + 1, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        unsigned char *in = malloc(20000);
        for (int i = M - 1; i >= 0; i--) {
            for (int from = 0; from < last; from++) {
                MPI_Status st;
                int n = len_of(from, i), count;
                MPI_Recv(in, 20000, MPI_BYTE, from, i, MPI_COMM_WORLD, &st);
                MPI_Get_count(&st, MPI_BYTE, &count);
                if (count != n) {
                    if (errs++ < 5) printf("message %d from %d: %d bytes, not %d\n", i, from, count, n);
                    continue;
                }
                for (int j = 0; j < n; j++)
                    if (in[j] != byte_of(from, i, j)) {
                        if (errs++ < 5) printf("message %d from %d differs at byte %d\n", i, from, j);
                        break;
                    }
            }
        }
        free(in);
    }
    int all = 0;
    MPI_Reduce(&errs, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (all == 0) printf(" No Errors\n");
        else printf(" Found %d errors\n", all);
    }
    MPI_Finalize();
    return 0;
}
