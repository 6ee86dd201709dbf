/*
 * PVM calls end to end between processes, on our libpvm3.so.3 (and, the
 * same binary, on Debian's): run without arguments it is the master; it
 * spawns two copies of itself as workers (argument "worker") and checks:
 *   - every pk/upk type, with strides, through a worker and back;
 *   - pvm_packf / pvm_unpackf (values, counted arrays with a stride, strings);
 *   - PvmDataRaw and PvmDataInPlace (data changed after packing but before
 *     sending is sent changed);
 *   - pvm_mcast, pvm_probe, pvm_nrecv, pvm_trecv's timeout, tag and TID
 *     wildcards, pvm_psend/pvm_precv, a message of 1 MiB;
 *   - pvm_parent, pvm_siblings, pvm_tasks, pvm_config, pvm_bufinfo;
 *   - pvm_notify(PvmTaskExit): a task killed with pvm_kill is reported,
 *     and a task already gone at once;
 *   - errors: spawning a program that is not there (none started,
 *     PvmNoFile in tids), sending to a task that is not there (PvmNoTask;
 *     0 on Debian's PVM, which drops it: run with API_PEER=debian there),
 *     a bad buffer (PvmNoSuchBuf).
 * Prints "api: ok" at the end; any failure prints what and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pvm3.h>

static int failures;
/* With API_TRACE set, each part announces itself on stderr (to see where a
 * PVM stops). */
#define STEP(name) do { if (getenv("API_TRACE")) fprintf(stderr, "api: %s\n", name); } while (0)
#define CHECK(c, ...) do { if (!(c)) { printf("api: FAILED %s: ", #c); printf(__VA_ARGS__); printf("\n"); failures++; } } while (0)

enum { N = 6, BIG = 1 << 20 };

static void worker(void)
{
    int parent = pvm_parent();
    int *sib, nsib = pvm_siblings(&sib);
    int bufid, bytes, tag, src;

    pvm_initsend(PvmDataDefault);
    pvm_pkint(&nsib, 1, 1);
    pvm_pkint(sib, nsib, 1);
    pvm_send(parent, 1);
    /* Echo every message back with tag + 100 until tag 99. */
    for (;;) {
        bufid = pvm_recv(parent, -1);
        if (bufid < 0)
            break; /* the master is gone */
        pvm_bufinfo(bufid, &bytes, &tag, &src);
        if (tag == 99)
            break;
        if (tag == 50) { /* psend/precv: double every int */
            static int v[BIG / 4];
            int rtid, rtag, rlen;
            /* The length comes in bytes, as under Debian's PVM. */
            pvm_precv(parent, 50, v, BIG / 4, PVM_INT, &rtid, &rtag, &rlen);
            for (int i = 0; i < rlen / 4; i++)
                v[i] *= 2;
            pvm_psend(parent, 150, v, rlen / 4, PVM_INT);
            continue;
        }
        pvm_setsbuf(pvm_getrbuf());
        pvm_setrbuf(0);
        pvm_send(parent, tag + 100);
        pvm_freebuf(pvm_getsbuf());
        pvm_setsbuf(0);
    }
    pvm_exit();
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "worker") == 0) {
        worker();
        return 0;
    }
    int me = pvm_mytid();
    int tids[2], n, bufid, bytes, tag, src;
    char *wargs[] = { "worker", NULL };

    pvm_setopt(PvmAutoErr, 0);
    CHECK(me > 0, "mytid %d", me);
    CHECK(pvm_parent() == PvmNoParent, "parent %d", pvm_parent());
    /* None started, the reason in tids. */
    CHECK(pvm_spawn("no-such-program-here", NULL, 0, "", 1, tids) == 0 && tids[0] == PvmNoFile, "%d", tids[0]);
    n = pvm_spawn(argv[0], wargs, 0, "", 2, tids);
    CHECK(n == 2, "spawned %d (%d %d)", n, tids[0], tids[1]);
    if (n != 2)
        return 1;
    for (int w = 0; w < 2; w++) {
        int nsib, sib[2];
        bufid = pvm_recv(tids[w], 1);
        pvm_upkint(&nsib, 1, 1);
        pvm_upkint(sib, nsib, 1);
        CHECK(nsib == 2 && sib[0] == tids[0] && sib[1] == tids[1], "worker %d: siblings %d", w, nsib);
    }
    int ntask;
    struct pvmtaskinfo *ti;
    CHECK(pvm_tasks(0, &ntask, &ti) == 0 && ntask >= 3, "tasks %d", ntask);
    int seen = 0;
    for (int i = 0; i < ntask; i++)
        if ((ti[i].ti_tid == tids[0] || ti[i].ti_tid == tids[1]) && ti[i].ti_ptid == me && ti[i].ti_pid > 0)
            seen++;
    CHECK(seen == 2, "pvm_tasks lists %d of the 2 workers with their parent", seen);
    int nhost, narch;
    struct pvmhostinfo *hi;
    CHECK(pvm_config(&nhost, &narch, &hi) == 0 && nhost >= 1 && strcmp(hi[0].hi_arch, "LINUX64") == 0, "config");

    STEP("types");
    /* Every type, with a stride of 2 on the way out. */
    char b[2 * N]; short s[2 * N]; int i4[2 * N]; long l[2 * N]; float f[2 * N]; double d[2 * N];
    unsigned short us[2 * N]; unsigned int ui[2 * N]; unsigned long ul[2 * N]; float c[4 * N]; double dc[4 * N];
    for (int k = 0; k < 2 * N; k++) {
        /* Longs of 31 bits: Debian's PVM packs them with XDR in 4 bytes
         * and does not extend the sign back (64-bit and negative values
         * go raw, below). */
        b[k] = k; s[k] = -k; i4[k] = k * 1000; l[k] = k * 100000000L; f[k] = k / 4.0f; d[k] = k / 8.0;
        us[k] = k + 60000; ui[k] = k + 4000000000u; ul[k] = k + 4000000000ul;
        c[2 * k] = k; c[2 * k + 1] = -k; dc[2 * k] = k / 3.0; dc[2 * k + 1] = -k / 3.0;
    }
    pvm_initsend(PvmDataDefault);
    pvm_pkbyte(b, N, 2); pvm_pkshort(s, N, 2); pvm_pkint(i4, N, 2); pvm_pklong(l, N, 2);
    pvm_pkfloat(f, N, 2); pvm_pkdouble(d, N, 2); pvm_pkushort(us, N, 2); pvm_pkuint(ui, N, 2);
    pvm_pkulong(ul, N, 2); pvm_pkcplx(c, N, 2); pvm_pkdcplx(dc, N, 2); pvm_pkstr("a string");
    CHECK(pvm_send(tids[0], 7) == 0, "send");
    bufid = pvm_recv(-1, 107);
    pvm_bufinfo(bufid, &bytes, &tag, &src);
    CHECK(tag == 107 && src == tids[0], "tag %d src %x", tag, src);
    {
        char b2[N]; short s2[N]; int i2[N]; long l2[N]; float f2[N]; double d2[N]; unsigned short us2[N];
        unsigned int ui2[N]; unsigned long ul2[N]; float c2[2 * N]; double dc2[2 * N]; char str[20];
        pvm_upkbyte(b2, N, 1); pvm_upkshort(s2, N, 1); pvm_upkint(i2, N, 1); pvm_upklong(l2, N, 1);
        pvm_upkfloat(f2, N, 1); pvm_upkdouble(d2, N, 1); pvm_upkushort(us2, N, 1); pvm_upkuint(ui2, N, 1);
        pvm_upkulong(ul2, N, 1); pvm_upkcplx(c2, N, 1); pvm_upkdcplx(dc2, N, 1);
        CHECK(pvm_upkstr(str) == 0 && strcmp(str, "a string") == 0, "string");
        for (int k = 0; k < N; k++) {
            CHECK(b2[k] == b[2 * k] && s2[k] == s[2 * k] && i2[k] == i4[2 * k] && l2[k] == l[2 * k], "ints %d", k);
            CHECK(f2[k] == f[2 * k] && d2[k] == d[2 * k], "floats %d", k);
            CHECK(us2[k] == us[2 * k] && ui2[k] == ui[2 * k] && ul2[k] == ul[2 * k], "unsigned %d", k);
            CHECK(c2[2 * k] == c[4 * k] && c2[2 * k + 1] == c[4 * k + 1], "complex %d", k);
            CHECK(dc2[2 * k] == dc[4 * k] && dc2[2 * k + 1] == dc[4 * k + 1], "double complex %d", k);
        }
        CHECK(pvm_upkint(i2, 1, 1) == PvmNoData, "reading past the end");
    }

    STEP("in place");
    /* PvmDataRaw: 64-bit longs as they are. */
    {
        long wide[2] = { -123456789012345L, 0 }, wide2[2];
        unsigned long uwide = 10000000000000000000ul, uwide2 = 0;
        pvm_initsend(PvmDataRaw);
        pvm_pklong(wide, 2, 1);
        pvm_pkulong(&uwide, 1, 1);
        pvm_send(tids[1], 11);
        pvm_recv(tids[1], 111);
        pvm_upklong(wide2, 2, 1);
        pvm_upkulong(&uwide2, 1, 1);
        CHECK(wide2[0] == wide[0] && wide2[1] == 0 && uwide2 == uwide, "raw longs %ld %lu", wide2[0], uwide2);
    }

    /* In place: the data as it is when sent. */
    int live[3] = { 1, 2, 3 };
    pvm_initsend(PvmDataInPlace);
    pvm_pkint(live, 3, 1);
    live[1] = 20;
    pvm_send(tids[1], 8);
    pvm_recv(tids[1], 108);
    int back[3];
    pvm_upkint(back, 3, 1);
    CHECK(back[0] == 1 && back[1] == 20 && back[2] == 3, "in place %d %d %d", back[0], back[1], back[2]);

    STEP("packf");
    /* pvm_packf / pvm_unpackf: values, counted arrays with a stride, a
     * string, through a worker and back. */
    {
        int five[10] = { 1, 0, 2, 0, 3, 0, 4, 0, 5, 0 }, got5[5] = { 0 }, seven = 0;
        double half = 0;
        short sh = 0;
        char word[16] = "";
        CHECK(pvm_packf("%+ %d %5.2d %lf %hd %s", PvmDataDefault, 7, five, 2.5, (short)-3, "packf") == 0, "packf");
        pvm_send(tids[0], 10);
        pvm_recv(tids[0], 110);
        CHECK(pvm_unpackf("%d %5d %lf %hd %s", &seven, got5, &half, &sh, word) == 0, "unpackf");
        CHECK(seven == 7 && half == 2.5 && sh == -3 && strcmp(word, "packf") == 0, "unpackf values %d %g %d %s", seven,
              half, sh, word);
        for (int k = 0; k < 5; k++)
            CHECK(got5[k] == k + 1, "packf stride: item %d is %d", k, got5[k]);
        CHECK(pvm_packf("%q", 1) == PvmBadParam, "a bad conversion");
    }

    STEP("mcast");
    /* Multicast, then probe and receive in the other order. */
    int x = 42;
    pvm_initsend(PvmDataRaw);
    pvm_pkint(&x, 1, 1);
    CHECK(pvm_mcast(tids, 2, 9) == 0, "mcast");
    struct timeval tv = { 5, 0 };
    CHECK(pvm_trecv(tids[1], 109, &tv) > 0, "reply from worker 1");
    while (pvm_probe(tids[0], 109) == 0)
        ;
    CHECK(pvm_nrecv(tids[0], 109) > 0, "nrecv after probe");
    CHECK(pvm_nrecv(-1, 1234) == 0, "nothing with tag 1234");
    struct timeval short_wait = { 0, 200000 };
    CHECK(pvm_trecv(-1, 1234, &short_wait) == 0, "trecv times out");

    STEP("psend");
    /* psend/precv, 1 MiB. */
    static int big[BIG / 4], twice[BIG / 4];
    for (int k = 0; k < BIG / 4; k++)
        big[k] = k;
    pvm_initsend(PvmDataDefault);
    pvm_send(tids[0], 50);
    pvm_psend(tids[0], 50, big, BIG / 4, PVM_INT);
    int rtid, rtag, rlen;
    CHECK(pvm_precv(tids[0], 150, twice, BIG / 4, PVM_INT, &rtid, &rtag, &rlen) == 0, "precv");
    CHECK(rtid == tids[0] && rtag == 150 && rlen == BIG, "precv %x %d %d", rtid, rtag, rlen);
    for (int k = 0; k < BIG / 4; k++)
        if (twice[k] != 2 * k) {
            CHECK(0, "1 MiB item %d: %d", k, twice[k]);
            break;
        }

    STEP("notify");
    /* Notification: a killed task is reported, and one already gone at
     * once; both from a daemon TID. */
    CHECK(pvm_notify(PvmTaskExit, 66, 1, &tids[1]) == 0, "notify");
    CHECK(pvm_kill(tids[1]) == 0, "kill");
    struct timeval ten = { 10, 0 };
    bufid = pvm_trecv(-1, 66, &ten);
    CHECK(bufid > 0, "no exit notification within 10 s");
    if (bufid > 0) {
        int gone = 0;
        pvm_upkint(&gone, 1, 1);
        pvm_bufinfo(bufid, &bytes, &tag, &src);
        /* From a daemon TID (ours: of the host that saw the task go;
         * Debian's: 0x80000000). */
        CHECK(gone == tids[1] && (src & 0x80000000),
              "notification of %x from %x", gone, src);
    }
    CHECK(pvm_notify(PvmTaskExit, 67, 1, &tids[1]) == 0, "notify on a task gone");
    /* At once, from this task or (in a cluster) from whichever task or
     * daemon looked first: within seconds either way. */
    CHECK(pvm_trecv(-1, 67, &ten) > 0, "a task already gone is reported at once");
    CHECK(pvm_pstat(tids[1]) == PvmNoTask, "pstat of a killed task");

    STEP("errors");
    /* Errors. */
    CHECK(pvm_freebuf(123456) == PvmNoSuchBuf, "freebuf");
    pvm_initsend(PvmDataDefault);
    pvm_initsend(PvmDataDefault);
    pvm_send(tids[0], 99);
    /* Ours reports it; Debian's PVM drops the message and returns 0
     * (API_PEER=debian, docs/pvm.md "Differences"). */
    int nobody = pvm_send(me + 1000, 1);
    CHECK(nobody == PvmNoTask || (getenv("API_PEER") && nobody == 0), "send to nobody: %d", nobody);
    pvm_exit();
    printf(failures ? "api: %d failures\n" : "api: ok\n", failures);
    return failures != 0;
}
