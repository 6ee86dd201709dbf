/*
 * PVM notification of faults, across three guests (node0, node1, node2),
 * started on node0 as `fault` (it spawns itself as the workers):
 *
 *   - two workers on node1 and two on node2 join group "fault", each
 *     puts a mailbox entry "fault-<tid>" and says it is ready;
 *   - the master asks for PvmTaskExit on the four and PvmHostDelete on
 *     both hosts;
 *   - a worker on node1 is killed (pvm_kill): its exit is reported;
 *   - the master prints "waiting for node2 to fail" and waits in pvm_recv
 *     from a worker on node2 while the test kills node2's QEMU: the recv
 *     returns PvmNoTask, node2's PvmHostDelete and both its workers'
 *     PvmTaskExit arrive; pvm_config no longer lists node2, pvm_tasks
 *     lists none of its tasks, group "fault" is down to the one worker
 *     left, and so is the mailbox; a spawn on node2 is PvmNoHost;
 *   - it prints "waiting for node1's pvmd to go" while the test kills
 *     node1's pvmd: node1's PvmHostDelete arrives (its worker frees the
 *     daemon's entry) and node1 leaves pvm_config.
 *
 * Each step prints a line; a failure prints what and exits 1; the last
 * line is "fault: ok".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <pvm3.h>

#define READY 1
#define STOP 99
#define NEVER 5
#define EXITED 10
#define HOSTDEL 11

static int failures;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            printf("fault: FAILED at line %d: ", __LINE__);                \
            printf(__VA_ARGS__);                                           \
            printf("\n");                                                  \
            fflush(stdout);                                                \
            failures++;                                                    \
        }                                                                  \
    } while (0)

static double now(void)
{
    struct timeval tv;
    gettimeofday(&tv, 0);
    return tv.tv_sec + tv.tv_usec / 1e6;
}

static int worker(int parent)
{
    int me = pvm_mytid();
    char name[64];
    snprintf(name, sizeof name, "fault-%x", me);
    if (pvm_joingroup("fault") < 0)
        return 1;
    pvm_initsend(PvmDataDefault);
    pvm_pkint(&me, 1, 1);
    if (pvm_putinfo(name, pvm_getsbuf(), PvmMboxDefault) < 0)
        return 1;
    pvm_initsend(PvmDataDefault);
    pvm_pkint(&me, 1, 1);
    pvm_send(parent, READY);
    /* Until told to stop (or killed, or its guest fails). */
    pvm_recv(parent, STOP);
    pvm_exit();
    return 0;
}

/* The daemon TID of host `name` in pvm_config, or 0. */
static int host_dtid(const char *name, int *nhost)
{
    struct pvmhostinfo *hi;
    int narch, i, found = 0;
    if (pvm_config(nhost, &narch, &hi) < 0)
        return 0;
    for (i = 0; i < *nhost; i++)
        if (strcmp(hi[i].hi_name, name) == 0)
            found = hi[i].hi_tid;
    return found;
}

/* Waits up to `secs` for a message with `tag`; its first int in *v, the
 * second in *v2 (if not null), its source in *src. */
static int wait_tag(int tag, int secs, int *v, int *v2, int *src)
{
    struct timeval tv = { secs, 0 };
    int bytes, t, bufid = pvm_trecv(-1, tag, &tv);
    if (bufid <= 0)
        return bufid;
    pvm_upkint(v, 1, 1);
    if (v2)
        pvm_upkint(v2, 1, 1);
    pvm_bufinfo(bufid, &bytes, &t, src);
    return bufid;
}

int main(int argc, char **argv)
{
    int me = pvm_mytid();
    int parent = pvm_parent();
    int nhost, d1, d2, w[4], i, n, v, src, got;
    struct pvmtaskinfo *ti;
    struct pvmmboxinfo *mi;
    double t0;
    (void)argc;

    if (me < 0)
        return 1;
    setvbuf(stdout, 0, _IOLBF, 0);
    if (parent > 0)
        return worker(parent);

    d1 = host_dtid("node1", &nhost);
    d2 = host_dtid("node2", &nhost);
    CHECK(nhost == 3 && d1 > 0 && d2 > 0, "pvm_config: %d hosts, node1 t%x, node2 t%x", nhost, d1, d2);
    CHECK(pvm_spawn(argv[0], 0, PvmTaskHost, "node1", 2, &w[0]) == 2, "spawn on node1: %x %x", w[0], w[1]);
    CHECK(pvm_spawn(argv[0], 0, PvmTaskHost, "node2", 2, &w[2]) == 2, "spawn on node2: %x %x", w[2], w[3]);
    for (i = 0; i < 4; i++) {
        CHECK(wait_tag(READY, 60, &v, 0, &src) > 0, "worker %d not ready", i);
    }
    CHECK(pvm_gsize("fault") == 4, "gsize %d, not 4", pvm_gsize("fault"));
    CHECK(pvm_getmboxinfo("fault-*", &n, &mi) == 0 && n == 4, "mailbox: %d classes, not 4", n);
    printf("fault: 4 workers t%x t%x on node1 (t%x), t%x t%x on node2 (t%x)\n", w[0], w[1], d1, w[2], w[3], d2);
    fflush(stdout);

    int hosts[2] = { d1, d2 };
    CHECK(pvm_notify(PvmTaskExit, EXITED, 4, w) == 0, "notify task exit");
    CHECK(pvm_notify(PvmHostDelete, HOSTDEL, 2, hosts) == 0, "notify host delete");

    /* A task killed. */
    t0 = now();
    CHECK(pvm_kill(w[0]) == 0, "kill");
    got = wait_tag(EXITED, 10, &v, 0, &src);
    CHECK(got > 0 && v == w[0] && (src & 0x80000000), "exit of killed t%x: got %d, t%x from %x", w[0], got, v, src);
    printf("fault: killed t%x reported after %.1f s\n", w[0], now() - t0);

    /* A host that fails, while this task waits for a message from one of
     * its tasks: the wait ends. */
    printf("fault: waiting for node2 to fail, in pvm_recv from t%x\n", w[2]);
    fflush(stdout);
    pvm_setopt(PvmAutoErr, 0);
    t0 = now();
    got = pvm_recv(w[2], NEVER);
    CHECK(got == PvmNoTask, "pvm_recv from t%x on the failed host returned %d", w[2], got);
    printf("fault: pvm_recv from t%x returned %d\n", w[2], got);
    pvm_setopt(PvmAutoErr, 1);
    got = wait_tag(HOSTDEL, 10, &v, 0, &src);
    CHECK(got > 0 && v == d2 && (src & 0x80000000), "host delete: got %d, t%x from %x", got, v, src);
    printf("fault: host delete t%x from t%x\n", v, src);
    int seen2 = 0, seen3 = 0;
    for (i = 0; i < 2; i++) {
        got = wait_tag(EXITED, 10, &v, 0, &src);
        CHECK(got > 0 && (v == w[2] || v == w[3]), "exit of a node2 task: got %d, t%x", got, v);
        seen2 |= got > 0 && v == w[2];
        seen3 |= got > 0 && v == w[3];
    }
    CHECK(seen2 && seen3, "exits of t%x and t%x", w[2], w[3]);
    printf("fault: node2's tasks reported %.1f s after the wait began\n", now() - t0);
    /* Nothing more: no exit of the node1 worker still there, and no
     * delete of node1. */
    struct timeval zero = { 0, 0 };
    CHECK(pvm_trecv(-1, EXITED, &zero) == 0 && pvm_trecv(-1, HOSTDEL, &zero) == 0, "a notification too many");

    CHECK(host_dtid("node2", &nhost) == 0 && nhost == 2, "pvm_config still lists node2 (%d hosts)", nhost);
    CHECK(pvm_tasks(0, &n, &ti) == 0, "pvm_tasks");
    for (i = 0; i < n; i++) {
        CHECK(ti[i].ti_host != d2, "pvm_tasks lists t%x of node2", ti[i].ti_tid);
        CHECK(ti[i].ti_tid != w[0], "pvm_tasks lists the killed t%x", w[0]);
    }
    CHECK(pvm_pstat(w[1]) == PvmOk, "the node1 worker t%x is gone", w[1]);
    CHECK(pvm_gsize("fault") == 1 && pvm_gettid("fault", pvm_getinst("fault", w[1])) == w[1],
          "group fault: %d members", pvm_gsize("fault"));
    CHECK(pvm_getmboxinfo("fault-*", &n, &mi) == 0 && n == 1, "mailbox: %d classes, not 1", n);
    pvm_setopt(PvmAutoErr, 0);
    CHECK(pvm_spawn(argv[0], 0, PvmTaskHost, "node2", 1, &v) == PvmNoHost || v == PvmNoHost,
          "spawn on the failed node2: %x", v);
    pvm_setopt(PvmAutoErr, 1);
    printf("fault: node2 is out: %d hosts, group fault of %d\n", nhost, pvm_gsize("fault"));

    /* A host whose daemon dies leaves. */
    printf("fault: waiting for node1's pvmd to go\n");
    got = wait_tag(HOSTDEL, 60, &v, 0, &src);
    CHECK(got > 0 && v == d1, "host delete of node1: got %d, t%x", got, v);
    CHECK(host_dtid("node1", &nhost) == 0 && nhost == 1, "pvm_config after node1's pvmd went: %d hosts", nhost);
    printf("fault: host delete of t%x, %d host(s)\n", v, nhost);

    pvm_initsend(PvmDataDefault);
    pvm_send(w[1], STOP);
    pvm_exit();
    printf(failures ? "fault: %d failures\n" : "fault: ok\n", failures);
    return failures ? 1 : 0;
}
