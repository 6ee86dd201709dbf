/*
 * A MEMORY CHANNEL adapter driver written from docs/adapter.md alone: the
 * lab course's reference solution (chapter 3). A VFIO user-space driver,
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

/* Step 2: hand it to vfio-pci through driver_override. */
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

/* Step 3: container, group, IOMMU, device fd. */
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

/* Step 4: a region of the device fd: its offset, and a mapping of it. */
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
    uint16_t cmd;
    a->regs[REG_CTRL / 4] = CTRL_RESET;
    if (pread(a->device, &cmd, 2, a->config_offset + PCI_COMMAND) != 2)
        die("reading the PCI command register");
    cmd |= PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
    if (pwrite(a->device, &cmd, 2, a->config_offset + PCI_COMMAND) != 2)
        die("writing the PCI command register");
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
        /* Step 7: word 1 (the buffer's IOVA) before RX. */
        a.pct[page * 2 + 1] = RX_IOVA;
        a.pct[page * 2] = PCT_RX;
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
        /* Step 8: transmit on the page, one 8-byte store into the window. */
        a.pct[page * 2] = PCT_TX;
        *(volatile uint64_t *)(a.tx + page * PAGE + offset) = value;
        /* A register read sends the stores before it (docs/adapter.md, "Transmit window"). */
        uint32_t err = a.regs[REG_ERR_STATUS / 4];
        printf("sent 0x%" PRIx64 " to page %" PRIu64 " +0x%" PRIx64 ": tx_packets %u err_status 0x%x\n", value, page,
               offset, a.regs[REG_TX_PACKETS / 4], err);
        return err ? 1 : 0;
    }
    fprintf(stderr, "driver: unknown command %s\n", argv[1]);
    return 2;
}
