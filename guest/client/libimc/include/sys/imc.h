/*
 * imc.h: the TruCluster MEMORY CHANNEL API (Digital Technical Journal,
 * "Cluster Support and Replication Management for...", seed 000, Table 1),
 * as implemented by libimc over imcd in a guest of the MEMORY CHANNEL
 * emulator.
 *
 * Set-up calls talk to imcd (/run/imcd.sock, or $IMCD_SOCKET); data never
 * does: a process stores into its transmit mapping and loads from its
 * receive mapping. Every function returns IMC_SUCCESS (0) or an IMC_*
 * status; imc_errmsg() says what went wrong in words.
 *
 * Link with `pkg-config --libs imc` (add --static for libimc.a).
 */
#ifndef _SYS_IMC_H
#define _SYS_IMC_H

#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int imc_asid_t;  /* clusterwide region id */
typedef int imc_lkid_t;  /* clusterwide spinlock set id */
typedef long imc_key_t;  /* user key: processes rendezvous on it */

/* Status codes. */
#define IMC_SUCCESS     0
#define IMC_EXISTS      1   /* exclusive creation, but the key exists */
#define IMC_PERMISSION  2   /* the region's mode does not allow it */
#define IMC_NOTALLOC    3   /* this process has not allocated that id */
#define IMC_NOSPACE     4   /* no run of free MEMORY CHANNEL pages is long enough */
#define IMC_TABLEFULL   5   /* the clusterwide directory is full */
#define IMC_SIZE        6   /* the key exists with another size */
#define IMC_INVALID     7   /* a bad argument */
#define IMC_NODAEMON    8   /* imcd is not running */
#define IMC_CLUSTER     9   /* the cluster did not answer in time (link down?) */
#define IMC_LOCKBUSY    10  /* imc_lkacquire without IMC_LOCKWAIT: the lock is held */
#define IMC_NOHOST      11  /* imc_kill: no such host (running imcd) */
#define IMC_ERRNO       12  /* imc_kill: the remote kill(2) failed; see imc_errmsg() */
#define IMC_NOMEM       13  /* no memory for a receive buffer */
#define IMC_FAIL        14  /* anything else; see imc_errmsg() */
#define IMC_DMA_PENDING 15  /* extension: the transfer is in flight */
#define IMC_DMA_FAILED  16  /* extension: the adapter stopped the transfer */
#define IMC_DMA_FULL    17  /* extension: the node's DMA ring is full; retry */

/* Permissions (imc_asalloc, imc_lkalloc): System V style. */
#define IMC_URW   0600      /* owner may read and write */
#define IMC_GRW   0060      /* group may read and write */
#define IMC_ORW   0006      /* others may read and write */
#define IMC_LKU   0600      /* spinlocks: owner */
#define IMC_LKG   0060      /* spinlocks: group */
#define IMC_LKO   0006      /* spinlocks: others */

/* imc_asalloc / imc_lkalloc flags. */
#define IMC_COHERENT  0x1   /* every node receives the region from its creation */
#define IMC_EXCL      0x2   /* fail with IMC_EXISTS if the key exists */
#define IMC_CREATOR   0x4   /* imc_lkalloc: create exclusively and hold lock 0 */

/* imc_asattach: direction, sharing, flags. */
#define IMC_TRANSMIT  1
#define IMC_RECEIVE   2
#define IMC_SHARED    0     /* attachments are always shared among processes */
#define IMC_LOOPBACK  0x1   /* transmit: our writes also reach our receive copy */

/* imc_lkacquire flags. */
#define IMC_LOCKNOWAIT 0    /* try (1 + retries) times, then IMC_LOCKBUSY */
#define IMC_LOCKWAIT   1    /* wait until the lock is ours */

#define IMC_HOSTNAME_LEN 32
typedef struct {
    int node;                        /* MEMORY CHANNEL node id */
    char name[IMC_HOSTNAME_LEN];     /* host name, NUL-terminated */
} imc_host_t;

int imc_asalloc(imc_key_t key, size_t size, int perm, int flag, imc_asid_t *id);
int imc_asattach(imc_asid_t id, int dir, int share, int flag, caddr_t *addr);
int imc_asdetach(imc_asid_t id);
int imc_asdealloc(imc_asid_t id);

int imc_lkalloc(imc_key_t key, int *nlocks, int perm, int flag, imc_lkid_t *id);
int imc_lkacquire(imc_lkid_t id, int lock, int retries, int flag);
int imc_lkrelease(imc_lkid_t id, int lock);
int imc_lkdealloc(imc_lkid_t id);

/* The clusterwide error count, as this node's imcd last summed it (one
 * load from a mapping after the first call; not guaranteed current), or -1
 * (and imc_errmsg()) if it cannot be mapped. */
int imc_rderrcnt(void);
/* Asks every node, through an ACK page, for errors not yet counted.
 * Nonzero when errors happened since *errors was read (*errors becomes the
 * count now), 0 when none, -1 on failure. */
int imc_ckerrcnt(int *errors);

int imc_kill(const char *host, pid_t pid, int sig);
/* Fills up to max entries; returns the number of hosts (or -1). */
int imc_gethosts(imc_host_t *hosts, int max);

/* The last failure of this process's imc_* calls, in words. */
const char *imc_errmsg(void);

/*
 * EXTENSION, NOT IN THE PAPER'S TABLE 1: transmit DMA. The adapter's DMA
 * engine copies a buffer into a region, so the CPU does not store each
 * word. Set-up goes through imcd (imc_dma_open, and the first transfer to
 * each region); transfers do not.
 *
 * imc_dma_open: sets up DMA for this process with a buffer of `size`
 *   bytes (at most 16 MiB); *addr and *len get the buffer. Fill it, then
 * imc_dma_start: copies `len` bytes at `src` (inside that buffer) into
 *   region `id` (attached for transmit by this process, else
 *   IMC_NOTALLOC) at byte `offset`. Asynchronous: leave the bytes alone
 *   until the transfer is done. Stores made after it returns reach every
 *   node after the transfer's bytes.
 * imc_dma_test: IMC_SUCCESS when the transfer was sent whole,
 *   IMC_DMA_PENDING while in flight, IMC_DMA_FAILED if the adapter stopped
 *   it (imc_errmsg() says why).
 * imc_dma_wait: imc_dma_test after waiting up to timeout_ms.
 */
typedef struct { unsigned long _w[3]; } imc_dma_t;
int imc_dma_open(size_t size, caddr_t *addr, size_t *len);
int imc_dma_start(imc_asid_t id, size_t offset, const void *src, size_t len, imc_dma_t *handle);
int imc_dma_test(const imc_dma_t *handle);
int imc_dma_wait(const imc_dma_t *handle, int timeout_ms);

/* One connection to imcd per process, opened by the first call. A child of
 * fork() starts afresh with its own connection: it holds none of the
 * parent's allocations, attachments or locks (ids are clusterwide, so it
 * may imc_asalloc / imc_lkalloc the same keys again). */

#ifdef __cplusplus
}
#endif
#endif
