/*
 * Your MEMORY CHANNEL adapter driver, from docs/adapter.md alone (the lab
 * course's chapter 3). Fill in the functions marked TODO, in order; the
 * rest is done. Check it with docs/tutorial/driver/check.sh driver.c.
 * (solution.c is a reference solution: try without it first.) A VFIO user-space driver,
 * as the adapter's guests use it: find the function, hand it to vfio-pci,
 * open it through a type-1 IOMMU container, map its BARs, reset it, turn
 * bus mastering on, and program the page control table.
 *
 *   driver info                       the adapter's identity and link
 *   driver rx PAGE OFFSET VALUE [S]   receive PAGE into a buffer of ours;
 *                                     wait up to S seconds (default 30) for
 *                                     VALUE at OFFSET
 *   driver tx PAGE OFFSET VALUE       one 8-byte store of VALUE at OFFSET
 *
 * Built statically on the host (docs/tutorial/driver/check.sh does it)
 * and run inside a guest of a cluster without imcd.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* docs/adapter.md, "PCI identity", "Registers (BAR 0)", "Page control table". */
#define MC_VENDOR 0x1011
#define MC_DEVICE 0x0018
#define REG_ID 0x00
#define REG_NODE 0x04
#define REG_LINK 0x08
#define REG_PAGE_SIZE 0x0c
#define REG_ASPACE_PAGES 0x10
#define REG_ERR_STATUS 0x14
#define REG_CTRL 0x1c
#define REG_MEMBERS_LO 0x20
#define REG_TX_PACKETS 0x40
#define REG_RX_PACKETS 0x44
#define REG_RX_DROPPED 0x48
#define CTRL_RESET 0x1
#define PCT_TX 0x1
#define PCT_RX 0x2
#define PAGE 8192
#define PCI_COMMAND 0x04
#define PCI_COMMAND_MEMORY 0x2
#define PCI_COMMAND_MASTER 0x4
/* Where our receive buffer sits in the adapter's view (any free IOVA). */
#define RX_IOVA 0x10000000ULL

struct adapter {
    int container, group, device;
    volatile uint32_t *regs;  /* BAR 0 */
    volatile uint64_t *pct;   /* BAR 2: two words per page */
    volatile uint8_t *tx;     /* BAR 4: the transmit window */
    uint64_t config_offset;   /* the PCI configuration region in the device fd */
};

static void die(const char *what)
{
    fprintf(stderr, "driver: %s: %s\n", what, errno ? strerror(errno) : "failed");
    exit(1);
}

__attribute__((unused)) static int read_hex(const char *path, unsigned *v)
{
    FILE *f = fopen(path, "r");
    int ok = f && fscanf(f, "%x", v) == 1;
    if (f)
        fclose(f);
    return ok ? 0 : -1;
}

__attribute__((unused)) static int write_str(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, s, strlen(s));
    close(fd);
    return n == (ssize_t)strlen(s) ? 0 : -1;
}

/* Step 1: the PCI function with the adapter's vendor and device ids. */
static int find_adapter(char *bdf, size_t len)
{
    /* TODO: look through /sys/bus/pci/devices/<bdf>/vendor and .../device
     * (hex text; read_hex() reads them) for the adapter's ids (docs/adapter.md,
     * "PCI identity"); copy its name (the <bdf>) into bdf and return 0. */
    (void)bdf;
    (void)len;
    return -1;
}

/* Step 2: hand it to vfio-pci through driver_override. */
static int bind_vfio(const char *bdf)
{
    /* TODO: hand the function to vfio-pci ("How a guest reaches the adapter",
     * step 2): write "vfio-pci" to its driver_override, unbind it from its
     * driver if it has one (and it is not vfio-pci already), then write its
     * name to /sys/bus/pci/drivers_probe. write_str() writes a file. */
    (void)bdf;
    return -1;
}

/* Step 3: container, group, IOMMU, device fd. */
static int open_vfio(struct adapter *a, const char *bdf)
{
    /* TODO: step 3: the IOMMU group is the last part of the link
     * /sys/bus/pci/devices/<bdf>/iommu_group. Open /dev/vfio/vfio (the
     * container) and /dev/vfio/<group>; check the group is viable
     * (VFIO_GROUP_GET_STATUS), put it in the container
     * (VFIO_GROUP_SET_CONTAINER), choose a type-1 IOMMU (VFIO_SET_IOMMU) and
     * get the device fd (VFIO_GROUP_GET_DEVICE_FD with the <bdf>). Keep the
     * fds in a->container, a->group, a->device. See <linux/vfio.h>. */
    (void)a;
    (void)bdf;
    return -1;
}

/* Step 4: a region of the device fd: its offset, and a mapping of it. */
static void *map_region(struct adapter *a, unsigned index, uint64_t *offset)
{
    /* TODO: ask for the region's size and offset in the device fd
     * (VFIO_DEVICE_GET_REGION_INFO), store the offset in *offset, and mmap
     * the region (MAP_SHARED, from the device fd at that offset). The
     * configuration region is not mapped: return (void *)1 for it. */
    (void)a;
    (void)index;
    (void)offset;
    return NULL;
}

static int open_adapter(struct adapter *a)
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
    if (!(a->tx = map_region(a, VFIO_PCI_BAR4_REGION_INDEX, &off)))
        die("mapping BAR 4");
    if (!map_region(a, VFIO_PCI_CONFIG_REGION_INDEX, &a->config_offset))
        die("finding the configuration region");
    return 0;
}

/* Step 5: reset, then memory decoding and bus mastering (vfio-pci clears it on every open). */
static void take_into_service(struct adapter *a)
{
    /* TODO: step 5 ("How a guest reaches the adapter", after every open):
     * reset the adapter (CTRL, "Registers"), then set memory decoding and
     * bus mastering in the PCI command register, read and written with
     * pread/pwrite on the device fd at a->config_offset + PCI_COMMAND. */
    (void)a;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t number(const char *s)
{
    char *end;
    errno = 0;
    uint64_t v = strtoull(s, &end, 0);
    if (errno || *end) {
        fprintf(stderr, "driver: %s is not a number\n", s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    struct adapter a;
    if (argc < 2 || (strcmp(argv[1], "info") && argc < 5)) {
        fprintf(stderr, "usage: driver info | rx PAGE OFFSET VALUE [SECONDS] | tx PAGE OFFSET VALUE\n");
        return 2;
    }
    open_adapter(&a);
    if (!strcmp(argv[1], "info")) {
        printf("id 0x%08x node %u link %u page %u pages %u members 0x%x\n", a.regs[REG_ID / 4],
               a.regs[REG_NODE / 4] & 0xffff, a.regs[REG_LINK / 4] & 1, a.regs[REG_PAGE_SIZE / 4],
               a.regs[REG_ASPACE_PAGES / 4], a.regs[REG_MEMBERS_LO / 4]);
        return 0;
    }
    uint64_t page = number(argv[2]), offset = number(argv[3]), value = number(argv[4]);
    if (page >= a.regs[REG_ASPACE_PAGES / 4] || offset > PAGE - 8 || offset % 8) {
        fprintf(stderr, "driver: page %" PRIu64 " offset %" PRIu64 " is not an aligned word of the address space\n",
                page, offset);
        return 2;
    }
    take_into_service(&a);
    if (!strcmp(argv[1], "rx")) {
        double limit = argc > 5 ? (double)number(argv[5]) : 30.0;
        /* Step 6: a page-sized buffer, mapped for the adapter's DMA. */
        volatile uint64_t *buf = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        struct vfio_iommu_type1_dma_map map = {
            .argsz = sizeof map,
            .flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            .vaddr = (uintptr_t)buf,
            .iova = RX_IOVA,
            .size = PAGE,
        };
        if (buf == MAP_FAILED)
            die("allocating the receive buffer");
        memset((void *)buf, 0, PAGE);
        if (ioctl(a.container, VFIO_IOMMU_MAP_DMA, &map))
            die("VFIO_IOMMU_MAP_DMA of the receive buffer");
        /* TODO: step 7: program the page's PCT entry so that writes to it
         * land in buf ("Page control table": word 1 first, then word 0). */
        printf("listening on page %" PRIu64 "\n", page);
        fflush(stdout);
        double t0 = now();
        while (buf[offset / 8] != value) {
            if (now() - t0 > limit) {
                printf("nothing after %.0f s: rx_packets %u rx_dropped %u err_status 0x%x\n", limit,
                       a.regs[REG_RX_PACKETS / 4], a.regs[REG_RX_DROPPED / 4], a.regs[REG_ERR_STATUS / 4]);
                return 1;
            }
            usleep(1000);
        }
        printf("got 0x%" PRIx64 " at page %" PRIu64 " +0x%" PRIx64 " after %.0f ms: rx_packets %u rx_dropped %u "
               "err_status 0x%x\n",
               value, page, offset, (now() - t0) * 1e3, a.regs[REG_RX_PACKETS / 4], a.regs[REG_RX_DROPPED / 4],
               a.regs[REG_ERR_STATUS / 4]);
        return 0;
    }
    if (!strcmp(argv[1], "tx")) {
        /* TODO: step 8: enable transmit on the page ("Page control table")
         * and make one 8-byte store of value at offset of the page in the
         * transmit window ("Transmit window"). */
        /* A register read sends the stores before it (docs/adapter.md, "Transmit window"). */
        uint32_t err = a.regs[REG_ERR_STATUS / 4];
        printf("sent 0x%" PRIx64 " to page %" PRIu64 " +0x%" PRIx64 ": tx_packets %u err_status 0x%x\n", value, page,
               offset, a.regs[REG_TX_PACKETS / 4], err);
        return err ? 1 : 0;
    }
    fprintf(stderr, "driver: unknown command %s\n", argv[1]);
    return 2;
}
