/*
 * deposit.c: Direct Deposit's C API between two guests (tests/tests/dd_qemu.rs).
 *
 *   deposit recv SENDER_NODE   accept connection 7, receive 24 messages with
 *                              dd_recv, check each one's offset, length,
 *                              order and bytes (dd_read), release it
 *   deposit send RECV_NODE     connect, check that a send past the buffer is
 *                              refused, send the 24 messages at offsets of
 *                              its choosing (both edges of the buffer
 *                              included) and wait for each
 *
 * Prints "deposit ok: ..." and exits 0 when everything checked out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dd.h>

#define TAG 7
#define BUFFER (64 * 1024)
#define COUNT 24

static unsigned char byte_of(uint64_t seq, size_t i) { return (unsigned char)(i * 31 + seq * 7); }

/* Message i (from 0): its offset and length. The first is at offset 0,
 * the last ends exactly at the buffer's end, the rest in between. */
static void plan(int i, uint64_t *off, size_t *len) {
    if (i == 0) { *off = 0; *len = 5; return; }
    if (i == COUNT - 1) { *off = BUFFER - 24; *len = 24; return; }
    *len = 1 + (size_t)i * 397 % 3000;
    *off = ((uint64_t)i * 2653) % (BUFFER - 4096) / 8 * 8;
}

static int die(const char *what, long code) {
    fprintf(stderr, "deposit: %s: %ld (%s)\n", what, code, dd_errmsg());
    return 1;
}

static int recv_side(int sender) {
    dd_queue *q;
    int r = dd_queue_open(&q);
    if (r < 0) return die("dd_queue_open", r);
    int64_t id = dd_accept(q, sender, TAG, BUFFER);
    if (id != TAG) return die("dd_accept", id);
    static unsigned char buf[BUFFER];
    for (int i = 0; i < COUNT; i++) {
        dd_note_t n;
        r = dd_recv(q, &n, 60000);
        if (r < 0) return die("dd_recv", r);
        uint64_t off; size_t len;
        plan(i, &off, &len);
        if (n.seq != (uint64_t)i + 1 || n.offset != off || n.len != len || n.conn != TAG) {
            fprintf(stderr, "deposit: note %d: seq %llu offset %u len %u conn %u, want offset %llu len %zu\n", i,
                    (unsigned long long)n.seq, n.offset, n.len, n.conn, (unsigned long long)off, len);
            return 1;
        }
        int64_t got = dd_read(q, &n, buf, sizeof buf);
        if (got != (int64_t)len) return die("dd_read", got);
        for (size_t k = 0; k < len; k++)
            if (buf[k] != byte_of(n.seq, k)) {
                fprintf(stderr, "deposit: message %d byte %zu is %u, want %u\n", i, k, buf[k], byte_of(n.seq, k));
                return 1;
            }
        printf("note seq=%llu offset=%u len=%u ok\n", (unsigned long long)n.seq, n.offset, n.len);
        r = dd_release(q, &n);
        if (r < 0) return die("dd_release", r);
    }
    dd_note_t n;
    memset(&n, 0, sizeof n);
    n.conn = TAG;
    n.seq = 1;
    r = dd_release(q, &n);
    if (r != DD_ENOTOUTSTANDING) return die("a second release of note 1 was not refused", r);
    printf("deposit ok: received %d messages in order at the sender's offsets\n", COUNT);
    dd_queue_close(q);
    return 0;
}

static int send_side(int receiver) {
    dd_conn *c;
    int r = dd_connect(&c, receiver, TAG, 60000);
    if (r < 0) return die("dd_connect", r);
    if (dd_buffer_size(c) != BUFFER) return die("dd_buffer_size", dd_buffer_size(c));
    static unsigned char msg[BUFFER];
    int64_t t = dd_send(c, BUFFER - 8, msg, 9);
    if (t != DD_EOUTOFBUFFER) return die("a send past the buffer was not refused", t);
    printf("refused: %s\n", dd_errmsg());
    for (int i = 0; i < COUNT; i++) {
        uint64_t off; size_t len;
        plan(i, &off, &len);
        for (size_t k = 0; k < len; k++) msg[k] = byte_of((uint64_t)i + 1, k);
        for (int tries = 0;; tries++) {
            t = dd_send(c, off, msg, len);
            if (t != DD_EBUSY || tries > 100000) break;
        }
        if (t != i + 1) return die("dd_send", t);
        r = dd_wait(c, t, 10000);
        if (r < 0) return die("dd_wait", r);
        if (dd_test(c, t) != 1) return die("dd_test", dd_test(c, t));
    }
    printf("deposit ok: sent %d messages\n", COUNT);
    /* Stay until the receiver has released everything (it reads our pages). */
    for (int k = 0; k < 2000000 && dd_outstanding(c) > 0; k++) {}
    dd_close(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: deposit recv|send NODE\n");
        return 2;
    }
    int node = atoi(argv[2]);
    if (strcmp(argv[1], "recv") == 0) return recv_side(node);
    if (strcmp(argv[1], "send") == 0) return send_side(node);
    fprintf(stderr, "usage: deposit recv|send NODE\n");
    return 2;
}
