/* Intercommunicators: the world split into a low and a high group joined by
 * MPI_Intercomm_create; point-to-point across it (ranks name the remote
 * group), the collectives that cross it (root MPI_ROOT / MPI_PROC_NULL /
 * remote rank), dup, split and create on it, and MPI_Intercomm_merge.
 * Needs at least 2 ranks. Prints " No Errors" on rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int wrank, wsize, errs = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    int low = wrank < wsize / 2 + (wsize % 2); /* the low group may be one larger */
    int nlow = wsize / 2 + (wsize % 2), nhigh = wsize - nlow;
    MPI_Comm local, inter;
    MPI_Comm_split(MPI_COMM_WORLD, low, wrank, &local);
    /* Leaders: world rank 0 for the low group, world rank nlow for the high. */
    MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, low ? nlow : 0, 77, &inter);
    int flag, rsize, size, rank;
    MPI_Comm_test_inter(inter, &flag);
    MPI_Comm_remote_size(inter, &rsize);
    MPI_Comm_size(inter, &size);
    MPI_Comm_rank(inter, &rank);
    if (!flag || rsize != (low ? nhigh : nlow) || size != (low ? nlow : nhigh)) errs++;

    /* Point to point: each low rank r < nhigh swaps with high rank r. */
    if (rank < (low ? nhigh : nlow) && rank < (low ? nlow : nhigh)) {
        int out = wrank, in = -1;
        MPI_Status st;
        MPI_Sendrecv(&out, 1, MPI_INT, rank, 5, &in, 1, MPI_INT, MPI_ANY_SOURCE, 5, inter, &st);
        if (in != (low ? nlow + rank : rank) || st.MPI_SOURCE != rank) errs++;
    }

    /* Bcast from low rank 0 to the whole high group. */
    int v = -1;
    if (low) { v = 4242; MPI_Bcast(&v, 1, MPI_INT, rank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter); }
    else { MPI_Bcast(&v, 1, MPI_INT, 0, inter); if (v != 4242) errs++; }

    /* Allreduce: each group gets the other group's sum of world ranks. */
    int sum = -1, lowsum = nlow * (nlow - 1) / 2, highsum = wsize * (wsize - 1) / 2 - lowsum;
    MPI_Allreduce(&wrank, &sum, 1, MPI_INT, MPI_SUM, inter);
    if (sum != (low ? highsum : lowsum)) errs++;

    /* Reduce to high rank 0 of the low group's world ranks. */
    sum = -1;
    if (low) MPI_Reduce(&wrank, NULL, 1, MPI_INT, MPI_SUM, 0, inter);
    else { MPI_Reduce(NULL, &sum, 1, MPI_INT, MPI_SUM, rank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter); if (rank == 0 && sum != lowsum) errs++; }

    /* Allgather: everyone gets the other group's world ranks in order. */
    int *all = malloc(sizeof(int) * wsize);
    MPI_Allgather(&wrank, 1, MPI_INT, all, 1, MPI_INT, inter);
    for (int i = 0; i < rsize; i++) if (all[i] != (low ? nlow + i : i)) errs++;

    /* Alltoall: block i goes to remote rank i. */
    int *sb = malloc(sizeof(int) * wsize);
    for (int i = 0; i < rsize; i++) sb[i] = wrank * 100 + i;
    MPI_Alltoall(sb, 1, MPI_INT, all, 1, MPI_INT, inter);
    for (int i = 0; i < rsize; i++) if (all[i] != (low ? nlow + i : i) * 100 + rank) errs++;

    /* Gather at low rank 0 from the high group; a non-blocking barrier. */
    if (low) { MPI_Gather(NULL, 0, MPI_INT, all, 1, MPI_INT, rank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter);
               if (rank == 0) for (int i = 0; i < nhigh; i++) if (all[i] != nlow + i) errs++; }
    else MPI_Gather(&wrank, 1, MPI_INT, NULL, 0, MPI_INT, 0, inter);
    MPI_Request b;
    MPI_Ibarrier(inter, &b);
    MPI_Wait(&b, MPI_STATUS_IGNORE);

    /* Dup keeps the groups; traffic on it does not mix with the original. */
    MPI_Comm dup;
    MPI_Comm_dup(inter, &dup);
    MPI_Comm_remote_size(dup, &flag);
    if (flag != rsize) errs++;
    sum = -1;
    MPI_Allreduce(&wrank, &sum, 1, MPI_INT, MPI_SUM, dup);
    if (sum != (low ? highsum : lowsum)) errs++;
    MPI_Comm_free(&dup);

    /* Split by parity of the local rank: each new intercommunicator joins
     * the even (odd) ranks of both groups. */
    MPI_Comm half;
    MPI_Comm_split(inter, rank % 2, rank, &half);
    int want = ((low ? nhigh : nlow) + (rank % 2 ? 0 : 1)) / 2;
    if (want == 0) { if (half != MPI_COMM_NULL) errs++; }
    else { MPI_Comm_remote_size(half, &flag); if (flag != want) errs++; MPI_Comm_free(&half); }

    /* Merge: the high group passes high = 1, so it comes second. */
    MPI_Comm merged;
    MPI_Intercomm_merge(inter, !low, &merged);
    int mrank, msize;
    MPI_Comm_rank(merged, &mrank);
    MPI_Comm_size(merged, &msize);
    if (msize != wsize || mrank != wrank) errs++;
    int total = 0;
    MPI_Allreduce(&errs, &total, 1, MPI_INT, MPI_SUM, merged);
    if (wrank == 0) {
        if (total == 0) printf(" No Errors\n");
        else printf(" Found %d errors\n", total);
    }
    free(all); free(sb);
    MPI_Comm_free(&merged);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&local);
    MPI_Finalize();
    return 0;
}
