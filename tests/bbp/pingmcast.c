/*
 * BBP's C API across a job (every rank runs this, under mpiexec, or by
 * hand with BBP_SHM and explicit ranks): rank 0 ping-pongs with every
 * other rank for sizes 0 B .. the largest message, then every rank
 * multicasts to every subset of the others and to all (BBP_ALL), with
 * polling receives (bbp_msgavail, bbp_tryrecv) and receives from any;
 * contents checked everywhere; then the refusals; then a barrier.
 * Prints "OK rank R of N" at the end; any failure exits 1 naming it.
 *
 * Usage: pingmcast [RANK NPROCS JOB]   (default: mpiexec's environment)
 */
#include <bbp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int me, n;

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        fprintf(stderr, "rank %d: ", me);                                                                              \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fprintf(stderr, " (%s)\n", bbp_errmsg());                                                                      \
        exit(1);                                                                                                       \
    } while (0)

static void fill(unsigned char *b, int from, int tag, size_t len) {
    for (size_t i = 0; i < len; i++)
        b[i] = (unsigned char)(from * 131 + tag * 17 + i * 7 + len);
}

static unsigned char want[65536], got[65536];

static void expect(int src, int from, int tag, size_t len, const char *what) {
    int who = -9;
    long r = bbp_recv(src, got, sizeof got, &who);
    if (r < 0)
        FAIL("%s: bbp_recv returned %ld", what, r);
    fill(want, from, tag, len);
    if ((size_t)r != len || who != from || memcmp(got, want, len) != 0)
        FAIL("%s: %ld bytes from %d, expected %zu from %d", what, r, who, len, from);
}

int main(int argc, char **argv) {
    int rc = argc == 4 ? bbp_init(atoi(argv[1]), atoi(argv[2]), atol(argv[3])) : bbp_init(-1, 0, -1);
    if (rc != BBP_OK)
        FAIL("bbp_init returned %d", rc);
    me = bbp_rank();
    n = bbp_nprocs();
    long max = bbp_max_message();
    if (n < 2 || max < 4096)
        FAIL("%d ranks, largest message %ld", n, max);

    /* Ping-pong between rank 0 and each other rank. */
    size_t sizes[] = {0, 1, 4, 8, 13, 256, 4096, (size_t)max};
    for (int other = 1; other < n; other++) {
        for (int k = 0; k < 8; k++) {
            size_t len = sizes[k];
            if (me == 0) {
                fill(want, 0, k, len);
                if ((rc = bbp_send(other, want, len)) != BBP_OK)
                    FAIL("bbp_send to %d returned %d", other, rc);
                expect(other, other, k, len, "pong");
            } else if (me == other) {
                expect(0, 0, k, len, "ping");
                fill(want, me, k, len);
                if ((rc = bbp_send(0, want, len)) != BBP_OK)
                    FAIL("bbp_send back returned %d", rc);
            }
        }
    }
    if (bbp_barrier() != BBP_OK)
        FAIL("barrier after pingpong");

    /* Multicast: each rank to every nonempty subset of the others, then to all. */
    int others[64], list[64];
    for (int s = 0; s < n; s++) {
        int m = 0;
        for (int r = 0; r < n; r++)
            if (r != s)
                others[m++] = r;
        for (int bits = 1; bits < 1 << m; bits++) {
            int k = 0, mine = 0;
            for (int i = 0; i < m; i++)
                if (bits & 1 << i) {
                    list[k++] = others[i];
                    mine |= others[i] == me;
                }
            size_t len = 5 + 11 * bits;
            if (me == s) {
                fill(want, s, 100 + bits, len);
                if ((rc = bbp_mcast(list, k, want, len)) != BBP_OK)
                    FAIL("bbp_mcast to subset %d returned %d", bits, rc);
            } else if (mine) {
                /* Polling: wait with bbp_msgavail, take with bbp_tryrecv. */
                while ((rc = bbp_msgavail(s)) == 0)
                    ;
                if (rc != 1)
                    FAIL("bbp_msgavail returned %d", rc);
                int who = -9;
                long r = bbp_tryrecv(s, got, sizeof got, &who);
                fill(want, s, 100 + bits, len);
                if (r != (long)len || who != s || memcmp(got, want, len) != 0)
                    FAIL("multicast %d from %d: %ld bytes from %d", bits, s, r, who);
            }
        }
    }
    fill(want, me, 999, 777);
    if ((rc = bbp_mcast(NULL, BBP_ALL, want, 777)) != BBP_OK)
        FAIL("bbp_mcast to all returned %d", rc);
    for (int k = 0; k < n - 1; k++) {
        int who = -9;
        long r = bbp_recv(BBP_ANY, got, sizeof got, &who);
        fill(want, who, 999, 777);
        if (r != 777 || who < 0 || who >= n || who == me || memcmp(got, want, 777) != 0)
            FAIL("broadcast: %ld bytes from %d", r, who);
    }

    /* Refusals: each a clear status, nothing sent. */
    if ((rc = bbp_send(n, want, 1)) != BBP_ERANK)
        FAIL("send to rank %d returned %d", n, rc);
    if ((rc = bbp_send(me, want, 1)) != BBP_ERANK)
        FAIL("send to self returned %d", rc);
    if ((rc = bbp_send((me + 1) % n, want, (size_t)max + 1)) != BBP_ETOOBIG)
        FAIL("a message of %ld bytes returned %d", max + 1, rc);
    if ((rc = bbp_send((me + 1) % n, NULL, 8)) != BBP_EINVAL)
        FAIL("a NULL buffer returned %d", rc);
    if ((rc = bbp_mcast(list, 0, want, 1)) != BBP_EINVAL)
        FAIL("an empty list returned %d", rc);
    if ((rc = (int)bbp_tryrecv(BBP_ANY, got, sizeof got, NULL)) != BBP_EAGAIN)
        FAIL("tryrecv with nothing sent returned %d", rc);
    if ((rc = bbp_msgavail(-5)) != BBP_ERANK)
        FAIL("msgavail(-5) returned %d", rc);

    if (bbp_barrier() != BBP_OK)
        FAIL("last barrier");
    unsigned long st[5];
    bbp_stats(st);
    printf("OK rank %d of %d: sent %lu received %lu collected %lu reposts %lu\n", me, n, st[0], st[1], st[2], st[3]);
    if ((rc = bbp_finalize()) != BBP_OK)
        FAIL("bbp_finalize returned %d", rc);
    if (bbp_rank() != BBP_EINIT)
        FAIL("bbp_rank after finalize");
    return 0;
}
