/* Communicators and their extras: the MPI_TAG_UB attribute, a Cartesian
 * grid and a shift along it, a keyval whose copy and delete callbacks run
 * on dup and free, a group of the even ranks and MPI_Comm_create over it,
 * matched probes, a subarray type, a type's envelope and contents.
 * Prints " No Errors" on rank 0. */
#include <mpi.h>
#include <stdio.h>
static int copies = 0, deletes = 0;
static int cp(MPI_Comm c, int k, void *e, void *in, void *out, int *flag) { copies++; *(void**)out = in; *flag = 1; return MPI_SUCCESS; }
static int del(MPI_Comm c, int k, void *v, void *e) { deletes++; return MPI_SUCCESS; }
int main(int argc, char **argv) {
    int rank, size, errs = 0, *ub, flag;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (!flag || *ub < 32767) errs++;
    int dims[2] = {0, 0}; MPI_Dims_create(size, 2, dims);
    int periods[2] = {1, 0}; MPI_Comm cart;
    MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &cart);
    int src, dst; MPI_Cart_shift(cart, 0, 1, &src, &dst);
    int v = rank, got = -1;
    MPI_Sendrecv(&v, 1, MPI_INT, dst, 0, &got, 1, MPI_INT, src, 0, cart, MPI_STATUS_IGNORE);
    if (got != src) errs++;
    int key; MPI_Comm_create_keyval(cp, del, &key, NULL);
    MPI_Comm_set_attr(cart, key, (void*)42);
    MPI_Comm dup; MPI_Comm_dup(cart, &dup);
    void *val; MPI_Comm_get_attr(dup, key, &val, &flag);
    if (!flag || val != (void*)42 || copies != 1) errs++;
    MPI_Comm_free(&dup); MPI_Comm_free(&cart);
    if (deletes != 2) errs++;
    MPI_Group wg, g; MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int even[8], n = 0; for (int i = 0; i < size; i += 2) even[n++] = i;
    MPI_Group_incl(wg, n, even, &g);
    MPI_Comm ec; MPI_Comm_create(MPI_COMM_WORLD, g, &ec);
    if (rank % 2 == 0) { int s; MPI_Comm_size(ec, &s); if (s != n) errs++; int x = 1, t; MPI_Allreduce(&x, &t, 1, MPI_INT, MPI_SUM, ec); if (t != n) errs++; MPI_Comm_free(&ec);} else if (ec != MPI_COMM_NULL) errs++;
    /* Matched probes: rank 0 takes each message by MPI_Mprobe, sizes its
     * buffer from the status, then receives exactly that message. */
    if (rank != 0) {
        int msg[8]; for (int i = 0; i < rank; i++) msg[i] = rank;
        MPI_Send(msg, rank, MPI_INT, 0, 5, MPI_COMM_WORLD);
    } else {
        for (int i = 1; i < size; i++) {
            MPI_Message m; MPI_Status st; int cnt, got[8] = {0};
            MPI_Mprobe(MPI_ANY_SOURCE, 5, MPI_COMM_WORLD, &m, &st);
            MPI_Get_count(&st, MPI_INT, &cnt);
            if (cnt != st.MPI_SOURCE) errs++;
            MPI_Mrecv(got, cnt, MPI_INT, &m, &st);
            if (m != MPI_MESSAGE_NULL) errs++;
            for (int k = 0; k < cnt; k++) if (got[k] != st.MPI_SOURCE) errs++;
        }
    }
    /* A 2x2 block at (1,1) of a 4x4 matrix, as a subarray type. */
    int mat[16], blk[4], sz[2] = {4, 4}, sub[2] = {2, 2}, st0[2] = {1, 1};
    for (int i = 0; i < 16; i++) mat[i] = i;
    MPI_Datatype sa; MPI_Type_create_subarray(2, sz, sub, st0, MPI_ORDER_C, MPI_INT, &sa); MPI_Type_commit(&sa);
    MPI_Sendrecv(mat, 1, sa, rank, 6, blk, 4, MPI_INT, rank, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (blk[0] != 5 || blk[1] != 6 || blk[2] != 9 || blk[3] != 10) errs++;
    MPI_Type_free(&sa);
    /* Envelope and contents: a struct of a vector and a double gives back
     * its arguments; the vector comes back as a new handle to free. */
    MPI_Datatype vec, str, parts[2], back[2]; MPI_Type_vector(3, 2, 5, MPI_INT, &vec);
    int bl[2] = {1, 4}; MPI_Aint dp[2] = {0, 64}; parts[0] = vec; parts[1] = MPI_DOUBLE;
    MPI_Type_create_struct(2, bl, dp, parts, &str);
    int ni, na, nd, comb, ints[8]; MPI_Aint adr[4];
    MPI_Type_get_envelope(str, &ni, &na, &nd, &comb);
    if (comb != MPI_COMBINER_STRUCT || ni != 3 || na != 2 || nd != 2) errs++;
    MPI_Type_get_contents(str, 8, 4, 2, ints, adr, back);
    if (ints[0] != 2 || ints[1] != 1 || ints[2] != 4 || adr[1] != 64 || back[1] != MPI_DOUBLE) errs++;
    MPI_Type_get_envelope(back[0], &ni, &na, &nd, &comb);
    if (comb != MPI_COMBINER_VECTOR || ni != 3 || na != 0 || nd != 1) errs++;
    MPI_Type_get_contents(back[0], 8, 4, 2, ints, adr, parts);
    if (ints[0] != 3 || ints[1] != 2 || ints[2] != 5 || parts[0] != MPI_INT) errs++;
    MPI_Type_get_envelope(MPI_INT, &ni, &na, &nd, &comb);
    if (comb != MPI_COMBINER_NAMED || ni || na || nd) errs++;
    MPI_Type_free(&back[0]); MPI_Type_free(&str); MPI_Type_free(&vec);
    int all; MPI_Allreduce(&errs, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf(all ? "Found %d errors\n" : " No Errors\n", all);
    MPI_Finalize(); return 0;
}
