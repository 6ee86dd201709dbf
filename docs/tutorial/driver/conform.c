/*
 * A MEMORY CHANNEL adapter driver in C taking part in the driver
 * conformance suite (docs/adapter.md, "The conformance suite"). It builds
 * on the lab course's reference driver (solution.c, same folder): the same
 * way to find the function, hand it to vfio-pci and map its BARs, plus
 * what a driver that runs for a while needs: the adapter's interrupt and
 * the kernel's release request on eventfds, one poll() loop, the
 * notification FIFO, and the transmit DMA ring.
 *
 *   conform reset PAGE        receive with interrupt on PAGE
 *   conform errors            report and clear every error
 *   conform link              report link and membership changes
 *   conform fifo PAGE         receive with interrupt on PAGE, NOTIFY
 *                             interrupts off until "drain" on stdin
 *   conform dma PAGE COUNT    COUNT one-page DMA descriptors to PAGE
 *   conform removal           let go when the kernel asks for the adapter
 *
 * Every scenario prints "ready" once set up, then one line per event:
 * "notify PAGE", "error 0xBITS", "link UP 0xMEMBERS", "fifo COUNT LOST",
 * "dma failed INDEX STATUS", "dma done COUNT ok OK failed FAILED",
 * "released". End of file on stdin means stop (exit 0). Failures say why
 * on stderr and exit 1; a wrong command line exits 2.
 *
 * Built statically on the host and run in a guest without imcd:
 *   cc -static -O2 -Wall -Wextra -o .run/NAME/share/conform docs/tutorial/driver/conform.c
 *   mc-cluster --name NAME conform --driver /share/conform
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

/* docs/adapter.md, "PCI identity", "Registers (BAR 0)" (protocol/regs/src/lib.rs). */
#define MC_VENDOR 0x1011
#define MC_DEVICE 0x0018
#define MC_ID_VALUE 0x4d430001
#define REG_ID 0x00
#define REG_LINK 0x08
#define REG_ASPACE_PAGES 0x10
#define REG_ERR_STATUS 0x14
#define REG_CTRL 0x1c
#define REG_MEMBERS_LO 0x20
#define REG_MEMBERS_HI 0x24
#define REG_INT_CAUSE 0x28
#define REG_INT_MASK 0x2c
#define REG_NOTIFY_FIFO 0x30
#define REG_NOTIFY_LOST 0x4c
#define REG_CAPS 0x58
#define REG_DMA_RING_LO 0x60
#define REG_DMA_RING_HI 0x64
#define REG_DMA_RING_SIZE 0x68
#define REG_DMA_TAIL 0x6c
#define REG_DMA_HEAD 0x70
#define REG_DMA_STATUS 0x74
#define CTRL_RESET 0x1
#define CAPS_TX_DMA 0x1
#define NOTIFY_EMPTY 0xffffffffu
#define NOTIFY_DEPTH 256
/* INT_CAUSE and INT_MASK bits. */
#define INT_NOTIFY 0x1
#define INT_LINK 0x2
#define INT_ERROR 0x4
#define INT_DMA 0x8
#define INT_ALL 0xf
/* Page control table, word 0. */
#define PCT_TX 0x1
#define PCT_RX 0x2
#define PCT_INT 0x8
#define PAGE 8192
/* Transmit DMA: descriptor flag, written-back status, DMA_STATUS. */
#define DESC_INT 0x1
#define DESC_DONE 0x80000000u
#define DMA_BUSY 0x80000000u
#define PCI_COMMAND 0x04
#define PCI_COMMAND_MEMORY 0x2
#define PCI_COMMAND_MASTER 0x4

/* Where our buffers sit in the adapter's view (any free IOVAs will do). */
#define RX_IOVA 0x10000000ULL   /* the receive buffer, one page */
#define RING_IOVA 0x10100000ULL /* the transmit DMA ring */
#define SRC_IOVA 0x10200000ULL  /* the page the DMA descriptors send */
/* A small ring, so that COUNT descriptors wrap it many times. */
#define RING_MAX 8

/* One transmit DMA descriptor ("Transmit DMA (extension)", "The ring"). */
struct mc_desc {
    uint64_t src;    /* +0  source IOVA */
    uint64_t dest;   /* +8  MEMORY CHANNEL address */
    uint32_t len;    /* +16 bytes */
    uint32_t flags;  /* +20 DESC_INT */
    uint32_t bytes;  /* +24 written back: bytes sent */
    uint32_t status; /* +28 written back: DESC_DONE | code */
};
_Static_assert(sizeof(struct mc_desc) == 32, "a descriptor is 32 bytes");

/* Status codes by name, as the suite prints them (regs::dma::status). */
static const char *const dma_status_names[] = {
    "ok", "src-unmapped", "range", "tx-disabled", "tx-dest", "ack-page",
    "link-down", "aborted", "bad-desc", "no-bus-master", "ring", "overflow",
};

static const char *dma_status_name(uint32_t code)
{
    return code < sizeof dma_status_names / sizeof *dma_status_names ? dma_status_names[code] : "unknown";
}

struct adapter {
    int container, group, device;
    volatile uint32_t *regs; /* BAR 0 */
    volatile uint64_t *pct;  /* BAR 2: two words per page */
    uint64_t config_offset;  /* the PCI configuration region in the device fd */
    int irq;                 /* eventfd: the adapter's one interrupt vector */
    int release;             /* eventfd: the kernel asks for the device back */
    uint32_t mask;           /* what we wrote to INT_MASK */
};

/* The dma scenario's progress; indices are free-running, like the engine's. */
struct sender {
    int active;       /* descriptors still to retire */
    volatile struct mc_desc *ring;
    uint32_t size, count, page;
    uint32_t posted;  /* descriptors handed to the engine (DMA_TAIL) */
    uint32_t retired; /* descriptors whose status we have read */
    uint32_t ok, failed;
};

/* The adapter did something a driver cannot go on from. */
__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
    va_list ap;
    fputs("conform: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* A system call failed: say which, and why. */
__attribute__((noreturn)) static void die(const char *what)
{
    fail("%s: %s", what, errno ? strerror(errno) : "failed");
}

static uint32_t rd(struct adapter *a, unsigned off)
{
    return a->regs[off / 4];
}

static void wr(struct adapter *a, unsigned off, uint32_t v)
{
    a->regs[off / 4] = v;
}

/* ---- Finding and opening the adapter: as in solution.c. ---- */

static int read_hex(const char *path, unsigned *v)
{
    FILE *f = fopen(path, "r");
    int ok = f && fscanf(f, "%x", v) == 1;
    if (f)
        fclose(f);
    return ok ? 0 : -1;
}

static int write_str(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, s, strlen(s));
    close(fd);
    return n == (ssize_t)strlen(s) ? 0 : -1;
}

/* The PCI function with the adapter's vendor and device ids. */
static int find_adapter(char *bdf, size_t len)
{
    DIR *d = opendir("/sys/bus/pci/devices");
    struct dirent *e;
    char path[512];
    unsigned vendor, device;
    if (!d)
        return -1;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/vendor", e->d_name);
        if (read_hex(path, &vendor))
            continue;
        snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/device", e->d_name);
        if (read_hex(path, &device))
            continue;
        if (vendor == MC_VENDOR && device == MC_DEVICE) {
            snprintf(bdf, len, "%s", e->d_name);
            closedir(d);
            return 0;
        }
    }
    closedir(d);
    return -1;
}

/* Hand it to vfio-pci through driver_override. */
static int bind_vfio(const char *bdf)
{
    char path[512], target[512];
    ssize_t n;
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/driver", bdf);
    n = readlink(path, target, sizeof target - 1);
    if (n > 0) {
        target[n] = 0;
        if (strstr(target, "/vfio-pci"))
            return 0;
        snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/driver/unbind", bdf);
        if (write_str(path, bdf))
            return -1;
    }
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/driver_override", bdf);
    if (write_str(path, "vfio-pci"))
        return -1;
    return write_str("/sys/bus/pci/drivers_probe", bdf);
}

/* Container, group, IOMMU, device fd. */
static int open_vfio(struct adapter *a, const char *bdf)
{
    char path[512], target[512];
    struct vfio_group_status status = { .argsz = sizeof status };
    ssize_t n;
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/iommu_group", bdf);
    n = readlink(path, target, sizeof target - 1);
    if (n < 0)
        return -1;
    target[n] = 0;
    snprintf(path, sizeof path, "/dev/vfio/%s", strrchr(target, '/') + 1);
    a->container = open("/dev/vfio/vfio", O_RDWR);
    a->group = open(path, O_RDWR);
    if (a->container < 0 || a->group < 0)
        return -1;
    if (ioctl(a->group, VFIO_GROUP_GET_STATUS, &status) || !(status.flags & VFIO_GROUP_FLAGS_VIABLE))
        return -1;
    if (ioctl(a->group, VFIO_GROUP_SET_CONTAINER, &a->container))
        return -1;
    if (ioctl(a->container, VFIO_SET_IOMMU,
              ioctl(a->container, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) > 0 ? VFIO_TYPE1v2_IOMMU : VFIO_TYPE1_IOMMU))
        return -1;
    a->device = ioctl(a->group, VFIO_GROUP_GET_DEVICE_FD, bdf);
    return a->device < 0 ? -1 : 0;
}

/* A region of the device fd: its offset, and a mapping of it. */
static void *map_region(struct adapter *a, unsigned index, uint64_t *offset)
{
    struct vfio_region_info info = { .argsz = sizeof info, .index = index };
    void *p;
    if (ioctl(a->device, VFIO_DEVICE_GET_REGION_INFO, &info))
        return NULL;
    *offset = info.offset;
    if (index == VFIO_PCI_CONFIG_REGION_INDEX)
        return (void *)1; /* read and written with pread/pwrite, not mapped */
    p = mmap(NULL, info.size, PROT_READ | PROT_WRITE, MAP_SHARED, a->device, info.offset);
    return p == MAP_FAILED ? NULL : p;
}

/* BARs 0 and 2; no scenario stores into the transmit window (BAR 4). */
static void open_adapter(struct adapter *a)
{
    char bdf[256];
    uint64_t off;
    if (find_adapter(bdf, sizeof bdf))
        die("no MEMORY CHANNEL adapter (1011:0018) in /sys/bus/pci/devices");
    if (bind_vfio(bdf))
        die("binding the adapter to vfio-pci");
    if (open_vfio(a, bdf))
        die("opening the adapter through VFIO (is imcd running? use a cluster without it)");
    if (!(a->regs = map_region(a, VFIO_PCI_BAR0_REGION_INDEX, &off)))
        die("mapping BAR 0");
    if (!(a->pct = map_region(a, VFIO_PCI_BAR2_REGION_INDEX, &off)))
        die("mapping BAR 2");
    if (!map_region(a, VFIO_PCI_CONFIG_REGION_INDEX, &a->config_offset))
        die("finding the configuration region");
    uint32_t id = rd(a, REG_ID);
    if (id != MC_ID_VALUE)
        fail("ID reads 0x%x, not 0x%x (all ones: the adapter is gone)", id, MC_ID_VALUE);
}

/*
 * Bring-up, on every open: nothing reset the adapter since its last user,
 * so reset it (PCT, INT_MASK, INT_CAUSE, ERR_STATUS, the FIFO, the counters
 * and the DMA ring), then turn memory decoding and bus mastering on:
 * vfio-pci turns bus mastering off at every open, and the reset does not
 * touch the configuration space.
 */
static void take_into_service(struct adapter *a)
{
    uint16_t cmd;
    wr(a, REG_CTRL, CTRL_RESET);
    if (pread(a->device, &cmd, 2, a->config_offset + PCI_COMMAND) != 2)
        die("reading the PCI command register");
    cmd |= PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
    if (pwrite(a->device, &cmd, 2, a->config_offset + PCI_COMMAND) != 2)
        die("writing the PCI command register");
}

/* ---- Interrupts: eventfds through VFIO_DEVICE_SET_IRQS. ---- */

static uint32_t irq_count(struct adapter *a, unsigned index)
{
    struct vfio_irq_info info = { .argsz = sizeof info, .index = index };
    return ioctl(a->device, VFIO_DEVICE_GET_IRQ_INFO, &info) ? 0 : info.count;
}

/* A new eventfd, signalled by vector 0 of interrupt `index`. */
static int irq_eventfd(struct adapter *a, unsigned index)
{
    char buf[sizeof(struct vfio_irq_set) + sizeof(int32_t)] __attribute__((aligned(8)));
    struct vfio_irq_set *set = (struct vfio_irq_set *)buf;
    int32_t fd = eventfd(0, EFD_CLOEXEC);
    if (fd < 0)
        return -1;
    set->argsz = sizeof buf;
    set->flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    set->index = index;
    set->start = 0;
    set->count = 1;
    memcpy(set->data, &fd, sizeof fd);
    if (ioctl(a->device, VFIO_DEVICE_SET_IRQS, set)) {
        close(fd);
        return -1;
    }
    return fd;
}

/*
 * The adapter has one vector: MSI-X, or MSI on a hot-plug slot (which
 * offers no MSI-X: docs/adapter.md, "Surprise removal"). Setting the
 * eventfd makes the guest kernel enable MSI-X or MSI on the function.
 * The release request (VFIO_PCI_REQ_IRQ_INDEX) is how the kernel asks for
 * the device back when it is unplugged; without it the removal waits.
 */
static void route_interrupts(struct adapter *a)
{
    unsigned index = irq_count(a, VFIO_PCI_MSIX_IRQ_INDEX) > 0 ? VFIO_PCI_MSIX_IRQ_INDEX : VFIO_PCI_MSI_IRQ_INDEX;
    if (irq_count(a, index) == 0)
        fail("the adapter offers neither MSI-X nor MSI vectors");
    if ((a->irq = irq_eventfd(a, index)) < 0)
        die(index == VFIO_PCI_MSIX_IRQ_INDEX ? "routing MSI-X vector 0 to an eventfd"
                                             : "routing the MSI vector to an eventfd");
    if ((a->release = irq_eventfd(a, VFIO_PCI_REQ_IRQ_INDEX)) < 0)
        die("registering the release request (VFIO_PCI_REQ_IRQ_INDEX)");
}

/* Clears the causes latched so far, then enables `mask`. */
static void enable(struct adapter *a, uint32_t mask)
{
    wr(a, REG_INT_CAUSE, INT_ALL);
    a->mask = mask;
    wr(a, REG_INT_MASK, mask);
}

/* ---- Memory the adapter reaches by DMA. ---- */

/* `size` bytes of zeroed memory, mapped for the adapter at `iova`. */
static void *dma_alloc(struct adapter *a, uint64_t iova, size_t size, int writable)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct vfio_iommu_type1_dma_map map = {
        .argsz = sizeof map,
        .flags = VFIO_DMA_MAP_FLAG_READ | (writable ? VFIO_DMA_MAP_FLAG_WRITE : 0),
        .iova = iova,
        .size = size,
    };
    if (p == MAP_FAILED)
        die("allocating memory for DMA");
    memset(p, 0, size);
    map.vaddr = (uintptr_t)p;
    if (ioctl(a->container, VFIO_IOMMU_MAP_DMA, &map))
        die("VFIO_IOMMU_MAP_DMA");
    return p;
}

/* Receive with interrupt on `page`: word 1 (the buffer's IOVA) before RX. */
static void receive(struct adapter *a, uint32_t page)
{
    dma_alloc(a, RX_IOVA, PAGE, 1);
    a->pct[page * 2 + 1] = RX_IOVA;
    a->pct[page * 2] = PCT_RX | PCT_INT;
}

/* ---- The dma scenario: COUNT descriptors through a ring kept full. ---- */

static void dma_setup(struct adapter *a, struct sender *s, uint32_t page, uint32_t count)
{
    uint8_t *src;
    /* The largest power of two up to COUNT/2, and at most RING_MAX. */
    s->size = 1;
    while (s->size * 2 <= count / 2 && s->size * 2 <= RING_MAX)
        s->size *= 2;
    s->count = count;
    s->page = page;
    /* The page the descriptors send (the adapter only reads it), and the
     * ring (the adapter writes the statuses back): both mapped for DMA. */
    src = dma_alloc(a, SRC_IOVA, PAGE, 0);
    for (int i = 0; i < PAGE; i++)
        src[i] = (uint8_t)i;
    s->ring = dma_alloc(a, RING_IOVA, 4096, 1);
    a->pct[page * 2] = PCT_TX;
    wr(a, REG_DMA_RING_LO, (uint32_t)RING_IOVA);
    wr(a, REG_DMA_RING_HI, (uint32_t)(RING_IOVA >> 32));
    wr(a, REG_DMA_RING_SIZE, s->size); /* (re)starts the ring at index 0 */
}

/*
 * Posts descriptors while the ring has room, then rings the doorbell once.
 * Room is counted from DMA_HEAD, as read by dma_progress after it took the
 * statuses of every slot before it: the engine moves DMA_HEAD past a
 * descriptor as it writes its status back, and a doorbell more than the
 * ring's size beyond DMA_HEAD is refused (OVERFLOW).
 */
static void dma_post(struct adapter *a, struct sender *s, uint32_t head)
{
    uint32_t before = s->posted;
    while (s->posted != s->count && s->posted - head < s->size) {
        volatile struct mc_desc *d = &s->ring[s->posted & (s->size - 1)];
        d->src = SRC_IOVA;
        d->dest = (uint64_t)s->page * PAGE;
        d->len = PAGE;
        d->flags = DESC_INT;
        d->bytes = 0;
        d->status = 0;
        s->posted++;
    }
    if (s->posted == before)
        return;
    __sync_synchronize(); /* the descriptors are in memory before the doorbell */
    wr(a, REG_DMA_TAIL, s->posted);
}

/* Reads the statuses of the descriptors retired, reports them, posts more. */
static void dma_progress(struct adapter *a, struct sender *s)
{
    /* DMA_STATUS before DMA_HEAD: the engine idle then, and DMA_HEAD still
     * short of what we posted, means it dropped the rest (RING, NO_BUS_MASTER). */
    uint32_t st = rd(a, REG_DMA_STATUS), head = rd(a, REG_DMA_HEAD);
    if (head - s->retired > s->posted - s->retired)
        fail("DMA_HEAD reads %u with %u descriptors posted", head, s->posted);
    while (s->retired != head) {
        uint32_t status = s->ring[s->retired & (s->size - 1)].status;
        if (!(status & DESC_DONE))
            fail("descriptor %u retired without DONE (0x%x)", s->retired, status);
        if ((status & 0xff) == 0) {
            s->ok++;
        } else {
            s->failed++;
            printf("dma failed %u %s\n", s->retired, dma_status_name(status & 0xff));
        }
        s->retired++;
    }
    if (s->retired == s->count) {
        printf("dma done %u ok %u failed %u\n", s->count, s->ok, s->failed);
        s->active = 0;
        return;
    }
    if (!(st & DMA_BUSY) && head != s->posted)
        fail("the DMA engine dropped %u descriptors: DMA_STATUS %s", s->posted - head, dma_status_name(st & 0xff));
    dma_post(a, s, head);
}

/* ---- Events. ---- */

/*
 * One interrupt: read INT_CAUSE, clear the enabled causes it shows (write
 * 1 to clear) before handling them, so that one arriving meanwhile raises
 * the interrupt again, then handle them. Causes we have not enabled stay
 * latched (the fifo scenario's NOTIFY, until "drain").
 */
static void service(struct adapter *a, struct sender *s)
{
    uint32_t cause = rd(a, REG_INT_CAUSE);
    if (cause == 0xffffffffu)
        fail("INT_CAUSE reads all ones: the adapter is gone");
    cause &= a->mask;
    wr(a, REG_INT_CAUSE, cause);
    if (cause & INT_NOTIFY) {
        /* Pop until empty; bounded, as a FIFO that never empties is a dead device. */
        for (int i = 0; i < 2 * NOTIFY_DEPTH; i++) {
            uint32_t page = rd(a, REG_NOTIFY_FIFO);
            if (page == NOTIFY_EMPTY)
                break;
            printf("notify %u\n", page);
        }
    }
    if (cause & INT_LINK) {
        uint64_t members = (uint64_t)rd(a, REG_MEMBERS_HI) << 32 | rd(a, REG_MEMBERS_LO);
        printf("link %u 0x%" PRIx64 "\n", rd(a, REG_LINK) & 1, members);
    }
    if (cause & INT_ERROR) {
        uint32_t err = rd(a, REG_ERR_STATUS);
        wr(a, REG_ERR_STATUS, err); /* LINK_DOWN stays set while the link is down */
        printf("error 0x%x\n", err);
    }
    if ((cause & INT_DMA) && s->active)
        dma_progress(a, s);
}

/*
 * The fifo scenario's "drain": a driver that fell behind catches up. Clear
 * NOTIFY first, then pop everything, then enable NOTIFY: a notification
 * that arrives after our last pop leaves NOTIFY pending, and enabling a
 * pending cause raises the interrupt.
 */
static void drain(struct adapter *a)
{
    uint32_t n = 0;
    wr(a, REG_INT_CAUSE, INT_NOTIFY);
    while (rd(a, REG_NOTIFY_FIFO) != NOTIFY_EMPTY) {
        if (++n > 2 * NOTIFY_DEPTH)
            fail("the notification FIFO did not empty after %u reads", n);
    }
    printf("fifo %u %u\n", n, rd(a, REG_NOTIFY_LOST));
    a->mask |= INT_NOTIFY;
    wr(a, REG_INT_MASK, a->mask);
}

/*
 * Letting go: a reset turns every page, the DMA ring and the interrupt
 * off, so nothing points at our memory once it is unmapped; then the files
 * of the device are closed, and the BAR mappings (which hold it open too)
 * go when the process exits, right after. Only then can an unplug complete.
 */
static void let_go(struct adapter *a)
{
    wr(a, REG_CTRL, CTRL_RESET);
    close(a->irq);
    close(a->release);
    close(a->device);
    close(a->group);
    close(a->container);
}

static uint32_t number(const char *s)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 0);
    if (errno || !*s || *end || v > UINT32_MAX) {
        fprintf(stderr, "conform: %s is not a number\n", s);
        exit(2);
    }
    return (uint32_t)v;
}

static int usage(void)
{
    fprintf(stderr, "usage: conform reset PAGE | errors | link | fifo PAGE | dma PAGE COUNT | removal\n");
    return 2;
}

int main(int argc, char **argv)
{
    struct adapter a = { 0 };
    struct sender s = { 0 };
    const char *sc = argc > 1 ? argv[1] : "";
    uint32_t page = 0, count = 0;
    char line[256];
    size_t len = 0;

    /* The runner reads our lines as they come. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(sc, "reset") || !strcmp(sc, "fifo")) {
        if (argc != 3)
            return usage();
        page = number(argv[2]);
    } else if (!strcmp(sc, "dma")) {
        if (argc != 4)
            return usage();
        page = number(argv[2]);
        count = number(argv[3]);
        if (count < 2) {
            fprintf(stderr, "conform: dma COUNT must be at least 2 (the ring holds at most COUNT/2)\n");
            return 2;
        }
    } else if (strcmp(sc, "errors") && strcmp(sc, "link") && strcmp(sc, "removal")) {
        return usage();
    } else if (argc != 2) {
        return usage();
    }

    open_adapter(&a);
    if (page >= rd(&a, REG_ASPACE_PAGES)) {
        fprintf(stderr, "conform: page %u is outside the address space (%u pages)\n", page,
                rd(&a, REG_ASPACE_PAGES));
        return 2;
    }
    if (!strcmp(sc, "dma") && !(rd(&a, REG_CAPS) & CAPS_TX_DMA)) {
        printf("unsupported the adapter has no transmit DMA engine (CAPS bit 0 clear)\n");
        return 0;
    }
    take_into_service(&a);
    route_interrupts(&a);

    /* The scenario's set-up, then "ready". */
    if (!strcmp(sc, "reset")) {
        receive(&a, page);
        enable(&a, INT_NOTIFY | INT_LINK | INT_ERROR);
    } else if (!strcmp(sc, "fifo")) {
        receive(&a, page);
        enable(&a, INT_LINK | INT_ERROR); /* NOTIFY off until "drain" */
    } else if (!strcmp(sc, "link")) {
        enable(&a, INT_LINK | INT_ERROR);
    } else if (!strcmp(sc, "dma")) {
        dma_setup(&a, &s, page, count);
        enable(&a, INT_NOTIFY | INT_LINK | INT_ERROR | INT_DMA);
    } else { /* errors, removal */
        enable(&a, INT_NOTIFY | INT_LINK | INT_ERROR);
    }
    printf("ready\n");
    if (!strcmp(sc, "dma")) {
        s.active = 1;
        dma_post(&a, &s, 0); /* fill the ring: DMA_HEAD is 0 after DMA_RING_SIZE */
    }

    for (;;) {
        struct pollfd fds[3] = {
            { .fd = a.irq, .events = POLLIN },
            { .fd = a.release, .events = POLLIN },
            { .fd = 0, .events = POLLIN },
        };
        uint64_t n;
        /* While descriptors are in flight, look at DMA_HEAD every 10 ms as
         * well: the DMA interrupt can come before DMA_HEAD moves. */
        if (poll(fds, 3, s.active ? 10 : -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        if (fds[1].revents) {
            /* The kernel wants the device back: it is being unplugged. */
            printf("released\n");
            let_go(&a);
            return 0;
        }
        if (fds[0].revents) {
            if (read(a.irq, &n, sizeof n) != sizeof n)
                die("reading the interrupt eventfd");
            service(&a, &s);
        } else if (s.active) {
            dma_progress(&a, &s);
        }
        if (fds[2].revents & POLLNVAL) {
            let_go(&a); /* no standard input at all: nothing can tell us to go on */
            return 0;
        }
        if (fds[2].revents) {
            ssize_t got = read(0, line + len, sizeof line - 1 - len);
            if (got < 0 && errno != EINTR && errno != EAGAIN)
                die("reading standard input");
            if (got == 0) {
                let_go(&a); /* end of file: stop */
                return 0;
            }
            len += got > 0 ? (size_t)got : 0;
            line[len] = 0;
            /* Commands are whole lines; "drain" (fifo) is the only one. */
            char *nl;
            while ((nl = strchr(line, '\n'))) {
                *nl = 0;
                line[strcspn(line, " \t\r")] = 0;
                if (!strcmp(line, "drain") && !strcmp(sc, "fifo"))
                    drain(&a);
                len -= nl + 1 - line;
                memmove(line, nl + 1, len + 1);
            }
            if (len == sizeof line - 1)
                len = 0; /* a line longer than any command: dropped */
        }
    }
}
