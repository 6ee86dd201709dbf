/*
 * pvm3.h: the PVM 3.4 interface of this project's PVM on UMP and MEMORY
 * CHANNEL (libpvm3.so.3; docs/pvm.md). Its constants, type codes, error
 * codes and structures have PVM 3.4.6's values and layouts, so programs
 * built against Debian's PVM run on this library unchanged, and the other
 * way round (tests/tests/pvm_host.rs checks both ways).
 */
#ifndef _PVM3_H_
#define _PVM3_H_

#include <sys/time.h>

#define PVM_MAJOR_VERSION 3
#define PVM_MINOR_VERSION 4
#define PVM_PATCH_VERSION 6
#define PVM_VER "3.4.6"

/* Message encodings (pvm_initsend, pvm_mkbuf). */
#define PvmDataDefault 0
#define PvmDataRaw 1
#define PvmDataInPlace 2
#define PvmDataTrace 4
#define PvmDataFoo PvmDataDefault

/* pvm_spawn flags. */
#define PvmTaskDefault 0
#define PvmTaskHost 1
#define PvmTaskArch 2
#define PvmTaskDebug 4
#define PvmTaskTrace 8
#define PvmMppFront 16
#define PvmHostCompl 32
#define PvmNoSpawnParent 64

/* pvm_notify kinds. */
#define PvmTaskExit 1
#define PvmHostDelete 2
#define PvmHostAdd 3
#define PvmRouteAdd 4
#define PvmRouteDelete 5
#define PvmNotifyCancel 256

/* pvm_setopt / pvm_getopt options. */
#define PvmRoute 1
#define PvmDebugMask 2
#define PvmAutoErr 3
#define PvmOutputTid 4
#define PvmOutputCode 5
#define PvmTraceTid 6
#define PvmTraceCode 7
#define PvmTraceBuffer 8
#define PvmTraceOptions 9
#define PvmFragSize 10
#define PvmResvTids 11
#define PvmSelfOutputTid 12
#define PvmSelfOutputCode 13
#define PvmSelfTraceTid 14
#define PvmSelfTraceCode 15
#define PvmSelfTraceBuffer 16
#define PvmSelfTraceOptions 17
#define PvmShowTids 18
#define PvmPollType 19
#define PvmPollTime 20
#define PvmOutputContext 21
#define PvmTraceContext 22
#define PvmSelfOutputContext 23
#define PvmSelfTraceContext 24
#define PvmNoReset 25

/* pvm_settmask targets, PvmTraceOptions values. */
#define PvmTaskSelf 0
#define PvmTaskChild 1
#define PvmTraceFull 1
#define PvmTraceTime 2
#define PvmTraceCount 3

/* PvmRoute values. */
#define PvmDontRoute 1
#define PvmAllowDirect 2
#define PvmRouteDirect 3

/* PvmPollType values. */
#define PvmPollConstant 1
#define PvmPollSleep 2

/* Base message context. */
#define PvmBaseContext 0

/* Mailbox (pvm_putinfo) flags. */
#define PvmMboxDefault 0
#define PvmMboxPersistent 1
#define PvmMboxMultiInstance 2
#define PvmMboxOverWritable 4
#define PvmMboxFirstAvail 8
#define PvmMboxReadAndDelete 16
#define PvmMboxWaitForInfo 32
#define PvmMboxMaxFlag 512
#define PvmMboxDirectIndexShift 10
#define PvmMboxMaxDirectIndex ((unsigned) 1 << (31 - PvmMboxDirectIndexShift))
/* An index too large is reported on stderr and gives 0, as in PVM. */
#define PvmMboxDirectIndex(_index) \
    (((unsigned)(_index) >= PvmMboxMaxDirectIndex) \
         ? (fprintf(stderr, "mailbox direct index %d is not below %u\n", (_index), PvmMboxMaxDirectIndex), 0) \
         : ((_index) << PvmMboxDirectIndexShift))
#define PvmMboxDirectIndexOf(_flags) \
    (((_flags) >> PvmMboxDirectIndexShift) & (PvmMboxMaxDirectIndex - 1))

/* Reserved mailbox classes. */
#define PVMNORESETCLASS "###_PVM_NO_RESET_###"
#define PVMHOSTERCLASS "###_PVM_HOSTER_###"
#define PVMTASKERCLASS "###_PVM_TASKER_###"
#define PVMTRACERCLASS "###_PVM_TRACER_###"
#define PVMRMCLASS "###_PVM_RM_###"

/* Type codes (pvm_psend, pvm_reduce, ...). */
#define PVM_STR 0
#define PVM_BYTE 1
#define PVM_SHORT 2
#define PVM_INT 3
#define PVM_FLOAT 4
#define PVM_CPLX 5
#define PVM_DOUBLE 6
#define PVM_DCPLX 7
#define PVM_LONG 8
#define PVM_USHORT 9
#define PVM_UINT 10
#define PVM_ULONG 11

/* Error codes. */
#define PvmOk 0
#define PvmBadParam -2
#define PvmMismatch -3
#define PvmOverflow -4
#define PvmNoData -5
#define PvmNoHost -6
#define PvmNoFile -7
#define PvmDenied -8
#define PvmNoMem -10
#define PvmBadMsg -12
#define PvmSysErr -14
#define PvmNoBuf -15
#define PvmNoSuchBuf -16
#define PvmNullGroup -17
#define PvmDupGroup -18
#define PvmNoGroup -19
#define PvmNotInGroup -20
#define PvmNoInst -21
#define PvmHostFail -22
#define PvmNoParent -23
#define PvmNotImpl -24
#define PvmDSysErr -25
#define PvmBadVersion -26
#define PvmOutOfRes -27
#define PvmDupHost -28
#define PvmCantStart -29
#define PvmAlready -30
#define PvmNoTask -31
#define PvmNotFound -32
#define PvmExists -33
#define PvmHostrNMstr -34
#define PvmParentNotSet -35
#define PvmIPLoopback -36
#define PvmDupEntry PvmDenied
#define PvmNoEntry PvmNotFound

/* Temporary file names, as PVM 3.4 has them. */
#define PVMTMPNAMFUN(x) tmpnam(x)
#ifdef L_tmpnam
#define PVMTMPNAMLEN L_tmpnam
#else
#define PVMTMPNAMLEN 128
#endif

/* A host of the virtual machine (pvm_config). */
struct pvmhostinfo {
    int hi_tid;
    char *hi_name;
    char *hi_arch;
    int hi_speed;
    int hi_dsig;
};

/* A task (pvm_tasks). */
struct pvmtaskinfo {
    int ti_tid;
    int ti_ptid;
    int ti_host;
    int ti_flag;
    char *ti_a_out;
    int ti_pid;
};

/* A message header (pvm_getminfo, pvm_setminfo). */
struct pvmminfo {
    int len;
    int ctx;
    int tag;
    int wid;
    int enc;
    int crc;
    int src;
    int dst;
};

/* A mailbox class (pvm_getmboxinfo). */
struct pvmmboxinfo {
    char *mi_name;
    int mi_nentries;
    int *mi_indices;
    int *mi_owners;
    int *mi_flags;
};

#ifdef __cplusplus
extern "C" {
#endif

extern int pvm_errno;
extern int pvm_nerr;
extern char *pvm_errlist[];

char *pvmgetrsh(void);
char *pvmgettmp(void);
char *pvm_strerror(void);
int pvm_addhosts(char **names, int count, int *infos);
int pvm_addmhf(int src, int tag, int ctx, int (*handler)(int));
int pvm_archcode(char *arch);
int pvm_barrier(char *group, int count);
int pvm_bcast(char *group, int tag);
int pvm_bufinfo(int bufid, int *bytes, int *tag, int *tid);
#if defined(EOF)
int pvm_catchout(FILE *ff);
#endif
int pvm_config(int *nhost, int *narch, struct pvmhostinfo **hostp);
int pvm_delhosts(char **names, int count, int *infos);
int pvm_delinfo(char *name, int index, int flags);
int pvm_delmhf(int mhid);
int pvm_exit(void);
int pvm_export(char *name);
int pvm_freebuf(int bufid);
int pvm_freecontext(int ctx);
int pvm_freezegroup(char *group, int size);
int pvm_gather(void *result, void *data, int count, int datatype, int tag, char *group, int root);
int pvm_getcontext(void);
int pvm_getfds(int **fds);
int pvm_getinst(char *group, int tid);
int pvm_getminfo(int bufid, struct pvmminfo *info);
int pvm_getnoresets(int **tids, int *ntids);
int pvm_getopt(int what);
int pvm_getrbuf(void);
int pvm_getsbuf(void);
int pvm_gettid(char *group, int inst);
int pvm_gsize(char *group);
int pvm_halt(void);
int pvm_hostsync(int host, struct timeval *clk, struct timeval *delta);
int pvm_initsend(int encoding);
int pvm_joingroup(char *group);
int pvm_kill(int tid);
int pvm_lvgroup(char *group);
int pvm_getmboxinfo(char *pattern, int *nclasses, struct pvmmboxinfo **classes);
int pvm_mcast(int *tids, int ntask, int tag);
int pvm_mkbuf(int encoding);
int pvm_mstat(char *host);
int pvm_mytid(void);
int pvm_newcontext(void);
int pvm_notify(int what, int tag, int count, int *tids);
int pvm_nrecv(int tid, int tag);
int pvm_packf(const char *fmt, ...);
int pvm_parent(void);
int pvm_perror(char *msg);
int pvm_pkbyte(char *xp, int nitem, int stride);
int pvm_pkcplx(float *xp, int nitem, int stride);
int pvm_pkdcplx(double *xp, int nitem, int stride);
int pvm_pkdouble(double *xp, int nitem, int stride);
int pvm_pkfloat(float *xp, int nitem, int stride);
int pvm_pkint(int *xp, int nitem, int stride);
int pvm_pklong(long *xp, int nitem, int stride);
int pvm_pkshort(short *xp, int nitem, int stride);
int pvm_pkstr(char *cp);
int pvm_pkuint(unsigned int *xp, int nitem, int stride);
int pvm_pkulong(unsigned long *xp, int nitem, int stride);
int pvm_pkushort(unsigned short *xp, int nitem, int stride);
int pvm_pkmesg(int bufid);
int pvm_pkmesgbody(int bufid);
int pvm_precv(int tid, int tag, void *buf, int len, int datatype, int *rtid, int *rtag, int *rlen);
int pvm_probe(int tid, int tag);
int pvm_psend(int tid, int tag, void *buf, int len, int datatype);
int pvm_pstat(int tid);
int pvm_putinfo(char *name, int bufid, int flags);
int pvm_recv(int tid, int tag);
/* As PVM 3.4.6 declares it: the old matcher comes back typed as a
 * function of a matcher (programs cast it). */
int (*pvm_recvf(int (*new)(int, int, int)))(int (*)(int, int, int));
int pvm_recvinfo(char *name, int index, int flags);
int pvm_reduce(void (*func)(int *, void *, void *, int *, int *), void *data, int count, int datatype, int tag,
               char *group, int root);
void PvmMax(int *datatype, void *x, void *y, int *num, int *info);
void PvmMin(int *datatype, void *x, void *y, int *num, int *info);
void PvmSum(int *datatype, void *x, void *y, int *num, int *info);
void PvmProduct(int *datatype, void *x, void *y, int *num, int *info);
int pvm_reg_hoster(void);
int pvm_reg_rm(struct pvmhostinfo **hip);
int pvm_reg_tasker(void);
int pvm_reg_tracer(int tctx, int ttag, int octx, int otag, char *tmask, int tbuf, int topt);
int pvm_scatter(void *result, void *data, int count, int datatype, int tag, char *group, int root);
int pvm_send(int tid, int tag);
int pvm_sendsig(int tid, int signum);
int pvm_setcontext(int ctx);
int pvm_setminfo(int bufid, struct pvmminfo *info);
int pvm_setopt(int what, int val);
int pvm_setrbuf(int bufid);
int pvm_setsbuf(int bufid);
int pvm_siblings(int **tids);
int pvm_spawn(char *task, char **argv, int flag, char *where, int ntask, int *tids);
int pvm_start_pvmd(int argc, char **argv, int block);
int pvm_tasks(int where, int *ntask, struct pvmtaskinfo **taskp);
int pvm_tickle(int narg, int *argp, int *nresp, int *resp);
int pvm_tidtohost(int tid);
int pvm_trecv(int tid, int tag, struct timeval *tmout);
int pvm_unexport(char *name);
int pvm_unpackf(const char *fmt, ...);
int pvm_upkbyte(char *xp, int nitem, int stride);
int pvm_upkcplx(float *xp, int nitem, int stride);
int pvm_upkdcplx(double *xp, int nitem, int stride);
int pvm_upkdouble(double *xp, int nitem, int stride);
int pvm_upkfloat(float *xp, int nitem, int stride);
int pvm_upkint(int *xp, int nitem, int stride);
int pvm_upklong(long *xp, int nitem, int stride);
int pvm_upkshort(short *xp, int nitem, int stride);
int pvm_upkstr(char *cp);
int pvm_upkuint(unsigned int *xp, int nitem, int stride);
int pvm_upkulong(unsigned long *xp, int nitem, int stride);
int pvm_upkushort(unsigned short *xp, int nitem, int stride);
int pvm_upkmesg(void);
char *pvm_version(void);
int pvm_delete(char *name, int req);
int pvm_insert(char *name, int req, int data);
int pvm_lookup(char *name, int req, int *data);

#ifdef __cplusplus
}
#endif

#endif /* _PVM3_H_ */
