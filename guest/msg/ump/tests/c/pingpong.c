/* Two processes (fork) talk over a UMP channel through the C API:
 * messages of many sizes there and back, every byte checked, then events,
 * errors and close. Usage: pingpong BASE_HANDLE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <ump.h>

#define CHECK(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); \
    printf(" (%s)\n", ump_errmsg()); exit(1); } } while (0)

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 9));
}

static ump_channel_t open_and_wait(ump_handle_t me, ump_handle_t peer) {
    ump_channel_t ch; ump_event_t ev;
    CHECK(ump_open(me, peer, UMP_SHM, &ch) == UMP_SUCCESS, "open");
    CHECK(ump_wait(ch, 30000, &ev) == UMP_SUCCESS && ev.kind == UMP_EV_OPEN, "open event %d", ev.kind);
    return ch;
}

int main(int argc, char **argv) {
    ump_handle_t base = argc > 1 ? strtoull(argv[1], 0, 0) : 1000;
    static const size_t sizes[] = {0, 1, 3, 4, 5, 8, 1000, 65536, 300000, 2000000};
    const int n = sizeof sizes / sizeof sizes[0];
    static unsigned char buf[2000000], want[2000000];
    size_t len;
    pid_t kid = fork();
    CHECK(kid >= 0, "fork");
    CHECK(ump_init() == UMP_SUCCESS, "init");
    if (kid == 0) {                       /* the echo side */
        ump_channel_t ch = open_and_wait(base + 1, base);
        for (int i = 0; i < n; i++) {
            CHECK(ump_read(ch, buf, sizeof buf, &len) == UMP_SUCCESS, "child read %d", i);
            CHECK(ump_write(ch, buf, len) == UMP_SUCCESS, "child write %d", i);
        }
        ump_close(ch);
        ump_exit();
        _exit(0);
    }
    ump_channel_t ch = open_and_wait(base, base + 1);
    ump_info_t info;
    CHECK(ump_info(&info) == UMP_SUCCESS && info.channels == 1, "info");
    CHECK(ump_transport(ch) == UMP_SHM, "transport");
    for (int i = 0; i < n; i++) {
        fill(want, sizes[i], i);
        CHECK(ump_write(ch, want, sizes[i]) == UMP_SUCCESS, "write %zu", sizes[i]);
        if (sizes[i] > 100) {
            /* Too small a buffer: UMP_ETOOBIG with the size, nothing lost. */
            CHECK(ump_read(ch, buf, 10, &len) == UMP_ETOOBIG && len == sizes[i], "too big %zu", len);
        }
        CHECK(ump_read(ch, buf, sizeof buf, &len) == UMP_SUCCESS, "read %d", i);
        CHECK(len == sizes[i] && memcmp(buf, want, len) == 0, "echo of %zu bytes differs", sizes[i]);
    }
    printf("echoed %d sizes intact\n", n);
    ump_event_t ev;
    CHECK(ump_wait(ch, 30000, &ev) == UMP_SUCCESS && ev.kind == UMP_EV_CLOSED, "closed event %d", ev.kind);
    CHECK(ump_read(ch, buf, sizeof buf, &len) == UMP_ECLOSED, "read after close");
    CHECK(ump_read(99, buf, 1, &len) == UMP_ECHANNEL, "bad channel");
    CHECK(ump_open(base, base, UMP_SHM, &ch) == UMP_EINVAL, "same handles");
    int st; waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child");
    CHECK(ump_exit() == UMP_SUCCESS, "exit");
    CHECK(ump_write(ch, buf, 1) == UMP_EINIT, "after exit");
    printf("all checks passed\n");
    return 0;
}
