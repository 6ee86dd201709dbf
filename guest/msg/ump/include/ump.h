/*
 * ump.h: UMP, Universal Message Passing (seed 000, "Universal Message
 * Passing", Table 3), over shared memory inside a guest and MEMORY CHANNEL
 * between guests of the emulated cluster.
 *
 * Channels join two endpoints named by 64-bit handles. A channel is
 * complete once both ends have opened it; UMP_ANY picks shared memory when
 * the other end is on this guest and MEMORY CHANNEL otherwise. Every call
 * returns UMP_SUCCESS (0) or a UMP_E* status; ump_errmsg() says what went
 * wrong in words. Environment: UMP_SHM_BUFFER, UMP_MC_BUFFER (ring bytes
 * per direction; 4 KiB to 64 MiB; defaults 256K and 32K), UMP_OUTBUF
 * (multicast outbuf, default 1M), UMP_MAX_CHANNELS (default 64).
 *
 * Link with `pkg-config --libs ump` (add --static for libump.a).
 */
#ifndef _UMP_H
#define _UMP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t ump_handle_t;  /* endpoint handle, chosen by the user */
typedef int ump_channel_t;      /* channel descriptor */

/* Status codes. */
#define UMP_SUCCESS       0
#define UMP_EINIT         1   /* ump_init not called (or called twice) */
#define UMP_EINVAL        2   /* a bad argument or setting */
#define UMP_ECHANNEL      3   /* no such channel */
#define UMP_ETOOMANY      4   /* UMP_MAX_CHANNELS reached */
#define UMP_EBUSY         5   /* already open, or a non-blocking call still runs */
#define UMP_ENOTRANSPORT  6   /* MEMORY CHANNEL without imcd */
#define UMP_ECLOSED       7   /* the other end closed (mid-message: the message is dropped) */
#define UMP_EPEERDEAD     8   /* the other end's process or node is gone */
#define UMP_ETOOBIG       9   /* the message does not fit the buffer (*len says its size) */
#define UMP_ECORRUPT      10  /* the channel buffer holds garbage */
#define UMP_ETIMEOUT      11
#define UMP_EOS           12  /* the operating system refused; see ump_errmsg() */
#define UMP_ENOTOPEN      13  /* the other end has not opened the channel */

/* Transports. */
#define UMP_ANY  0
#define UMP_SHM  1
#define UMP_MC   2

/* ump_wait: any channel. */
#define UMP_ALL  (-1)

/* Events. */
#define UMP_EV_NONE        0  /* timeout */
#define UMP_EV_OPEN        1  /* the channel is complete (or a listener's new channel) */
#define UMP_EV_MESSAGE     2  /* a message is there to read */
#define UMP_EV_WRITE_DONE  3  /* a non-blocking write finished */
#define UMP_EV_READ_DONE   4  /* a non-blocking read finished */
#define UMP_EV_CLOSED      5  /* the other end closed or died */

typedef struct {
    int kind;      /* UMP_EV_* */
    int channel;
} ump_event_t;

typedef struct {
    int channels;
    int mc_channels;
    long shm_buffer;
    long mc_buffer;
    int max_channels;
    int node;
    int mc_available;
} ump_info_t;

int ump_init(void);
int ump_exit(void);
int ump_open(ump_handle_t local, ump_handle_t remote, int transport, ump_channel_t *channel);
int ump_close(ump_channel_t channel);
int ump_listen(ump_handle_t local, int transport);
int ump_wait(ump_channel_t channel, int timeout_ms, ump_event_t *ev);
int ump_read(ump_channel_t channel, void *buf, size_t size, size_t *len);
int ump_write(ump_channel_t channel, const void *buf, size_t len);
/* Returns once `min` bytes (or the whole message) are in buf; buf must stay
 * valid until UMP_EV_READ_DONE, then ump_nbread_done gives the length. */
int ump_nbread(ump_channel_t channel, void *buf, size_t size, size_t min, size_t *got);
/* The message is copied at once; UMP_EV_WRITE_DONE when it is all sent. */
int ump_nbwrite(ump_channel_t channel, const void *buf, size_t len);
int ump_mcast(const ump_channel_t *channels, int n, const void *buf, size_t len);
int ump_info(ump_info_t *info);

int ump_nbread_done(ump_channel_t channel, size_t *len);
int ump_nbwrite_done(ump_channel_t channel);
int ump_transport(ump_channel_t channel);
const char *ump_errmsg(void);

#ifdef __cplusplus
}
#endif
#endif
