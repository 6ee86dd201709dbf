/* PVM ping-pong, for hosts too noisy for averages: the master spawns one
 * partner (on the host named by -w, else where PVM chooses) and bounces
 * messages of 8 bytes to MAX bytes (powers of two) off it, timing every
 * round trip on its own. Built once against pvm3.h, the same binary runs
 * on our libpvm3.so.3 and on Debian's PVM (LD_LIBRARY_PATH and PVM_ROOT
 * choose). For each size it prints
 *
 *   pingpong MODE BYTES <median one-way us> <p90 one-way us> <MB/s at the median>
 *
 * and with -o FILE also writes NetPIPE's format there (bytes, Mbps,
 * one-way seconds), for the plots. MODE is "psend" (pvm_psend/pvm_precv
 * of bytes, straight from and to the caller's buffer) or "pack"
 * (pvm_initsend, pvm_pkbyte, pvm_send / pvm_recv, pvm_upkbyte, with
 * PvmDataDefault). Every byte of each size's last reply is checked; a
 * wrong one prints FAILED and exits 1.
 *
 * Usage: pingpong [-m psend|pack] [-w HOST] [-x MAX] [-r ROUNDS] [-o FILE]
 *   (defaults: psend, PVM's choice, 1048576, 200 round trips up to 64 KiB,
 *   fewer above, at least 5) */
#include <pvm3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TAG 7

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void send_msg(int pack, int to, char *buf, int n)
{
    if (pack) {
        pvm_initsend(PvmDataDefault);
        pvm_pkbyte(buf, n, 1);
        pvm_send(to, TAG);
    } else {
        pvm_psend(to, TAG, buf, n, PVM_BYTE);
    }
}

static void recv_msg(int pack, int from, char *buf, int n)
{
    if (pack) {
        pvm_recv(from, TAG);
        pvm_upkbyte(buf, n, 1);
    } else {
        pvm_precv(from, TAG, buf, n, PVM_BYTE, NULL, NULL, NULL);
    }
}

/* The partner: for each size, a message with tag TAG + 2 (size, round
 * trips), then echoes that many messages; tag TAG + 1 ends it. */
static int partner(int pack, int max)
{
    int parent = pvm_parent();
    char *buf = malloc(max);
    for (;;) {
        int bid = pvm_recv(parent, -1), bytes, tag, src, n, rounds;
        if (bid < 0)
            return 1;
        pvm_bufinfo(bid, &bytes, &tag, &src);
        if (tag != TAG + 2)
            break;
        pvm_upkint(&n, 1, 1);
        pvm_upkint(&rounds, 1, 1);
        for (int r = 0; r < rounds; r++) {
            recv_msg(pack, parent, buf, n);
            send_msg(pack, parent, buf, n);
        }
    }
    pvm_exit();
    return 0;
}

int main(int argc, char **argv)
{
    int pack = 0, max = 1 << 20, rounds8 = 200, c;
    const char *where = NULL, *file = NULL;
    if (argc > 1 && strcmp(argv[1], "partner") == 0)
        return partner(argc > 2 && strcmp(argv[2], "pack") == 0, atoi(argv[3]));
    while ((c = getopt(argc, argv, "m:w:x:r:o:")) != -1) {
        switch (c) {
        case 'm': pack = strcmp(optarg, "pack") == 0; break;
        case 'w': where = optarg; break;
        case 'x': max = atoi(optarg); break;
        case 'r': rounds8 = atoi(optarg); break;
        case 'o': file = optarg; break;
        default:
            fprintf(stderr, "usage: pingpong [-m psend|pack] [-w HOST] [-x MAX] [-r ROUNDS] [-o FILE]\n");
            return 2;
        }
    }
    if (max < 8 || rounds8 < 1) {
        fprintf(stderr, "pingpong: -x must be at least 8 and -r at least 1\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    pvm_mytid();
    char maxs[16], *args[] = { "partner", pack ? "pack" : "psend", maxs, NULL };
    snprintf(maxs, sizeof maxs, "%d", max);
    int other;
    if (pvm_spawn(argv[0], args, where ? PvmTaskHost : PvmTaskDefault, where ? (char *)where : "", 1, &other) != 1) {
        fprintf(stderr, "pingpong: spawning the partner%s%s failed: %d\n", where ? " on " : "", where ? where : "",
                other);
        pvm_exit();
        return 1;
    }
    FILE *out = file ? fopen(file, "w") : NULL;
    if (file && !out) {
        perror(file);
        return 1;
    }
    char *buf = malloc(max), *back = malloc(max);
    double *t = malloc(sizeof(double) * rounds8);
    int failed = 0;
    for (int n = 8; n <= max && !failed; n *= 2) {
        /* Fewer round trips for large sizes: about rounds8 x 64 KiB at most. */
        long r = (long)rounds8 * 65536 / n;
        int rounds = r > rounds8 ? rounds8 : r < 5 ? 5 : (int)r;
        pvm_initsend(PvmDataDefault);
        pvm_pkint(&n, 1, 1);
        pvm_pkint(&rounds, 1, 1);
        pvm_send(other, TAG + 2);
        for (int i = 0; i < n; i++)
            buf[i] = (char)(i * 7 + n);
        for (int k = 0; k < rounds; k++) {
            double t0 = now_us();
            send_msg(pack, other, buf, n);
            recv_msg(pack, other, back, n);
            t[k] = (now_us() - t0) / 2;
        }
        if (memcmp(buf, back, n) != 0) {
            printf("pingpong FAILED: the reply of %d bytes differs\n", n);
            failed = 1;
        }
        qsort(t, rounds, sizeof *t, cmp);
        double med = t[rounds / 2], p90 = t[rounds * 9 / 10];
        printf("pingpong %s %d %.1f %.1f %.2f\n", pack ? "pack" : "psend", n, med, p90, n / med);
        if (out)
            fprintf(out, "%d %f %.9f\n", n, n * 8 / med, med / 1e6);
    }
    pvm_initsend(PvmDataDefault);
    pvm_send(other, TAG + 1);
    if (out)
        fclose(out);
    pvm_exit();
    return failed;
}
