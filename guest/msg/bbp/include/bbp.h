/*
 * bbp.h - the Billboard Protocol (SCRAMNet's BBP) on MEMORY CHANNEL.
 *
 * A job's processes share one billboard: each owns a share that only it
 * writes (its message buffers, their descriptors, and its MESSAGE and ACK
 * flags) and every process reads all of them. A message is written once
 * into the sender's share and read by each receiver straight from there;
 * a multicast flags the same buffer for several receivers. See
 * docs/bbp.md for the layout, ordering and fault behaviour.
 *
 * Every call returns BBP_OK (0), a count (>= 0), or a negative BBP_E*
 * status; bbp_errmsg() says what went wrong in words. Messages from one
 * sender to one receiver arrive in the order sent. Calls from several
 * threads are serialized.
 *
 * Link with -lbbp (pkg-config bbp).
 */
#ifndef BBP_H
#define BBP_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define BBP_OK 0
#define BBP_ETOOBIG (-1)  /* larger than a buffer (the data partition)  */
#define BBP_ERANK (-2)    /* a rank out of range, or the caller itself  */
#define BBP_EINVAL (-3)   /* a bad argument (NULL buffer, empty list...) */
#define BBP_ETRUNC (-4)   /* the message does not fit; left unreceived  */
#define BBP_EPEER (-5)    /* a process waited on died, left or finalized */
#define BBP_ESETUP (-6)   /* the billboard could not be set up (imcd)   */
#define BBP_EAGAIN (-7)   /* bbp_tryrecv: no message yet                */
#define BBP_EINIT (-8)    /* not initialized, or already finalized      */

/* Wildcards. */
#define BBP_ANY (-1) /* src of bbp_recv/bbp_tryrecv/bbp_msgavail: any rank */
#define BBP_ALL (-1) /* ndests of bbp_mcast: every rank but the caller     */

/*
 * Joins the job's billboard as process `rank` of `nprocs`. rank < 0 and
 * nprocs <= 0 take them from the environment mpiexec sets (MCMPI_RANK,
 * MCMPI_SIZE); job < 0 takes MCMPI_JOB (0 when unset). Processes of one
 * job must agree on nprocs. With BBP_SHM=FILE in the environment the
 * billboard is that shared file (one machine) instead of MEMORY CHANNEL.
 * Returns BBP_OK, BBP_EINVAL, BBP_ERANK or BBP_ESETUP.
 */
int bbp_init(int rank, int nprocs, long job);

/* This process's rank, or BBP_EINIT. */
int bbp_rank(void);

/* Processes in the job, or BBP_EINIT. */
int bbp_nprocs(void);

/* The largest message in bytes (the data partition), or BBP_EINIT. */
long bbp_max_message(void);

/*
 * Sends len bytes at buf to rank dest (not the caller). Returns when the
 * message is posted (buf may be reused); waits only when every buffer is
 * still unread, until a receiver reads one. BBP_ETOOBIG, BBP_ERANK,
 * BBP_EINVAL, BBP_EPEER (dest finalized, or died while we waited).
 */
int bbp_send(int dest, const void *buf, size_t len);

/*
 * Sends len bytes at buf to each of the ndests ranks at dests (each once,
 * never the caller), or to every other rank when ndests is BBP_ALL
 * (dests ignored). One buffer serves every receiver. Errors as bbp_send;
 * an empty or repeating list is BBP_EINVAL.
 */
int bbp_mcast(const int *dests, int ndests, const void *buf, size_t len);

/*
 * Waits for the oldest message from rank src (or BBP_ANY) and copies it
 * into buf (cap bytes). Returns its length, and its sender in *from
 * (when from is not NULL). A message longer than cap is BBP_ETRUNC and
 * stays unreceived. BBP_EPEER when src died or finalized (for BBP_ANY:
 * when one died, or all finalized) with nothing left from it.
 */
long bbp_recv(int src, void *buf, size_t cap, int *from);

/* As bbp_recv, but returns BBP_EAGAIN at once when nothing waits. */
long bbp_tryrecv(int src, void *buf, size_t cap, int *from);

/* 1 when a message from src (or BBP_ANY) waits, 0 when none, or a status. */
int bbp_msgavail(int src);

/*
 * Returns when every rank has called it: each sends rank 0 a null
 * message, rank 0 multicasts one back. A message sent before the barrier
 * is there, at its receiver, when the barrier returns there.
 */
int bbp_barrier(void);

/*
 * Waits (up to 10 s) until the messages we sent were read, then leaves
 * the billboard. BBP_EPEER when a receiver did not read them in time (we
 * leave anyway). bbp_init may be called again afterwards.
 */
int bbp_finalize(void);

/* The last error in words (valid until the next failing call). */
const char *bbp_errmsg(void);

/*
 * Counters of this process into out[5]: messages sent, received, buffers
 * collected, reposts (stores of our words again, after a possible loss),
 * and messages found not intact (a lost store, waited out).
 */
int bbp_stats(unsigned long out[5]);

#ifdef __cplusplus
}
#endif

#endif /* BBP_H */
