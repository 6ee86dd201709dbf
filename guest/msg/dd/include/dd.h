/*
 * dd.h: Direct Deposit (seed 001, Avalanche, "Sender-Based Protocols")
 * over MEMORY CHANNEL. docs/dd.md is the full text.
 *
 * A receiving process opens a notification queue and accepts connections
 * on it: each reserves a receive buffer in the receiver for one sending
 * process on another node. The sender places each message at an offset it
 * chooses in that buffer; a note (valid flag, offset, size, connection)
 * then appears in the queue. Set-up goes through imcd (the trusted party);
 * sends and receives do not.
 *
 * Every call returns a non-negative value on success and a negative DD_E*
 * code on failure; dd_errmsg() says what went wrong in words (per thread).
 * A refused send has written nothing.
 *
 * Environment: DD_DMA_THRESHOLD (bytes; messages of at least this many go
 * by the transmit DMA engine, smaller ones by stores; 0 never uses DMA;
 * default 256).
 *
 * Link with `pkg-config --libs dd` (add --static for libdd.a).
 */
#ifndef _DD_H
#define _DD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes (negative). */
#define DD_EOUTOFBUFFER   (-1)  /* offset + length past the buffer: nothing written */
#define DD_EMISALIGNED    (-2)  /* offset not a multiple of 8: nothing written */
#define DD_EBUSY          (-3)  /* overlaps a message not yet released: nothing written */
#define DD_ENOTESFULL     (-4)  /* all 255 notes hold unreleased messages: nothing written */
#define DD_EBUFFERSIZE    (-5)  /* a buffer of 0 bytes or more than 64 MiB */
#define DD_ELOST          (-6)  /* a note was lost on the way (a fault) */
#define DD_EDAMAGED       (-7)  /* a message's bytes failed their CRC (a fault) */
#define DD_EBADNOTE       (-8)  /* a malformed note */
#define DD_ENOTOUTSTANDING (-9) /* release of a note not received or released already */
#define DD_ENOCONN        (-10) /* no such connection on the queue */
#define DD_EINVAL         (-11) /* a bad argument */
#define DD_ETIMEOUT       (-12) /* a wait ran out of time */
#define DD_EIMC           (-13) /* imcd refused or could not be reached */
#define DD_EPERM          (-14) /* imcd refused: another process owns the connection */
#define DD_EDMA           (-15) /* the transmit DMA engine failed */
#define DD_EOS            (-16) /* a system call or mapping failed */

/* Note flags. */
#define DD_NOTE_DMA 1u          /* the bytes came by DMA */

typedef struct dd_queue dd_queue;  /* a receiver's notification queue */
typedef struct dd_conn dd_conn;    /* a sender's end of one connection */

/* A note: what arrived where. */
typedef struct {
    uint32_t conn;     /* connection id (the tag it was accepted with) */
    uint32_t offset;   /* offset of the bytes in the connection's buffer */
    uint32_t len;      /* bytes */
    uint32_t flags;    /* DD_NOTE_DMA */
    uint64_t seq;      /* sequence number on the connection, from 1 */
    uint32_t crc;      /* CRC-32 the bytes were checked against */
    uint32_t reserved;
} dd_note_t;

/* The calling thread's last error, in words. */
const char *dd_errmsg(void);

/* --- receiver ------------------------------------------------------- */

/* Opens an empty notification queue in *q (connects to imcd). */
int dd_queue_open(dd_queue **q);
/* This node's MEMORY CHANNEL node number. */
int dd_queue_node(dd_queue *q);
/* Reserves a receive buffer of `bytes` (rounded up to 8 KiB pages, at most
 * 64 MiB) for connection `tag` from the process on node `sender` that
 * calls dd_connect, and puts its notes on q. Returns the connection id. */
int64_t dd_accept(dd_queue *q, int sender, uint32_t tag, uint64_t bytes);
/* User-level receive: checks the valid flag of each connection's next
 * note. 1 and *note when one arrived (its bytes checked), 0 when none. */
int dd_poll(dd_queue *q, dd_note_t *note);
/* Blocking receive: sleeps until a note arrives (woken by the adapter's
 * interrupt), up to timeout_ms (negative: for ever). 0 and *note. */
int dd_recv(dd_queue *q, dd_note_t *note, int timeout_ms);
/* Copies up to len bytes of a received, unreleased note into dst;
 * returns the bytes copied. */
int64_t dd_read(dd_queue *q, const dd_note_t *note, void *dst, size_t len);
/* Hands a received note's buffer space back to its sender (it may reuse
 * the space once every earlier note of the connection is released too). */
int dd_release(dd_queue *q, const dd_note_t *note);
/* Closes the queue and lets go of its connections. */
void dd_queue_close(dd_queue *q);

/* --- sender --------------------------------------------------------- */

/* Connects to connection `tag` that node `receiver` accepted, waiting up
 * to timeout_ms (negative: for ever) for the accept. Only this process
 * may send on it: imcd refuses the connection's transmit mapping to any
 * other (DD_EPERM). */
int dd_connect(dd_conn **c, int receiver, uint32_t tag, int timeout_ms);
/* Bytes of the receiver's buffer. */
int64_t dd_buffer_size(dd_conn *c);
/* Sends len bytes from src to `offset` (a multiple of 8) of the
 * receiver's buffer: by stores below the DMA threshold, by DMA from it.
 * Returns the send's ticket (> 0), or DD_EOUTOFBUFFER, DD_EMISALIGNED,
 * DD_EBUSY, DD_ENOTESFULL with nothing written. src may be reused at once. */
int64_t dd_send(dd_conn *c, uint64_t offset, const void *src, size_t len);
/* Completion of a send: 1 done, 0 in flight (DMA), or DD_EDMA. */
int dd_test(dd_conn *c, int64_t ticket);
/* Waits up to timeout_ms (negative: an hour) for a send to be done. */
int dd_wait(dd_conn *c, int64_t ticket, int timeout_ms);
/* Messages of at least `bytes` go by DMA from now on (0: never). */
int dd_set_dma_threshold(dd_conn *c, size_t bytes);
/* Messages sent and not yet released by the receiver. */
int dd_outstanding(dd_conn *c);
/* Closes the connection. */
void dd_close(dd_conn *c);

#ifdef __cplusplus
}
#endif

#endif /* _DD_H */
