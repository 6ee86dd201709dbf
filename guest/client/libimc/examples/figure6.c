/*
 * Figure 6 of "TruCluster MEMORY CHANNEL Software" (seed 000): a global
 * process counter in coherent MEMORY CHANNEL space, guarded by a cluster
 * spinlock. The program text is the paper's, with these changes only:
 *
 *  1. mb(): the Alpha `asm("mb")` becomes a portable full barrier.
 *  2. Erratum: the paper assigns region_read = write_ptr and
 *     region_write = read_ptr. Loads from a transmit mapping cannot work
 *     (on the real adapter either: transmit pages are write-only), so the
 *     two are swapped back here.
 *  3. Erratum: the creator sets processes = 0 and never counts itself, so
 *     N copies would end at -1; it starts the count at 1 here.
 *  4. "(Body of program goes here)" is a call to body(), below main, which
 *     waits until FIG6_COPIES copies have joined, checks the whole pattern
 *     and reports; main prints the counter values it wrote.
 *  5. main is declared int, and the two mb()-loops print what they wrote.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define mb() __atomic_thread_fence(__ATOMIC_SEQ_CST)

#include <sys/types.h>
#include <sys/imc.h>

typedef struct {
    volatile int processes;
    volatile int pattern[2047];
} shared_region;

static void body(shared_region *region_read);

int main ()
{
    int status, i, locks=4, temp, errors;
    imc_asid_t region_id;
    imc_lkid_t lock_id;
    shared_region *region_read, *region_write;
    caddr_t read_ptr = 0, write_ptr = 0;

    /* Allocate a region of coherent MC address space and attach to */
    /* process VA */
    imc_asalloc(123, 8192, IMC_URW, IMC_COHERENT, &region_id);
    imc_asattach(region_id, IMC_TRANSMIT, IMC_SHARED, IMC_LOOPBACK, &write_ptr);
    imc_asattach(region_id, IMC_RECEIVE, IMC_SHARED, 0, &read_ptr);

    region_read = (shared_region *)read_ptr;   /* erratum 2 */
    region_write = (shared_region *)write_ptr;

    /* Allocate a set of spinlocks and atomically acquire the first lock */
    status = imc_lkalloc(456, &locks, IMC_LKU, IMC_CREATOR, &lock_id);
    errors = imc_rderrcnt();
    if (status == IMC_SUCCESS) {
        do {
            region_write->processes = 1;   /* erratum 3 */
            for (i=0; i<2047; i++)
                region_write->pattern[i] = i;
            i--;
            mb();
        } while (imc_ckerrcnt(&errors) || region_read->pattern[i] != i);
        printf("creator: initialized, processes 1\n");
        imc_lkrelease(lock_id, 0);
    } else if (status == IMC_EXISTS) {
        imc_lkalloc(456, &locks, IMC_LKU, 0, &lock_id);
        imc_lkacquire(lock_id, 0, 0, IMC_LOCKWAIT);
        temp = region_read->processes + 1; /* Increment the process counter */
        errors = imc_rderrcnt();
        do {
            region_write->processes = temp;
            mb();
        } while (imc_ckerrcnt(&errors) || region_read->processes != temp);
        printf("joined: processes %d\n", temp);
        imc_lkrelease(lock_id, 0);
    } else {
        printf("imc_lkalloc: status %d: %s\n", status, imc_errmsg());
        return 1;
    }

    /* (Body of program goes here) */
    body(region_read);

    /* clean up */
    imc_lkacquire(lock_id, 0, 0, IMC_LOCKWAIT);
    temp = region_read->processes - 1; /* Decrement the process counter */
    errors = imc_rderrcnt();
    do {
        region_write->processes = temp;
        mb();
    } while (imc_ckerrcnt(&errors) || region_read->processes != temp);
    printf("left: processes %d\n", temp);

    imc_lkrelease(lock_id, 0);
    imc_lkdealloc(lock_id);
    imc_asdetach(region_id);
    imc_asdealloc(region_id);
    return 0;
}

/* The work: wait until every copy has joined (FIG6_COPIES, default 1),
 * then check the pattern the creator wrote, as this copy's node sees it. */
static void body(shared_region *region_read)
{
    const char *c = getenv("FIG6_COPIES");
    int copies = c ? atoi(c) : 1, i, bad = 0, most = 0;
    time_t give_up = time(NULL) + 120;

    while (region_read->processes < copies && time(NULL) < give_up) {
        if (region_read->processes > most)
            most = region_read->processes;
        usleep(1000);
    }
    if (region_read->processes > most)
        most = region_read->processes;
    for (i = 0; i < 2047; i++)
        bad += region_read->pattern[i] != i;
    printf("body: saw processes %d of %d; pattern %s (%d words wrong)\n",
           most, copies, bad ? "BAD" : "ok", bad);
    fflush(stdout);
    /* Stay until everyone has seen the full count. */
    sleep(5);
}
