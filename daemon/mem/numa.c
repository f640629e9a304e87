/* numa: NUMA topology, placement plan and binding of a host arena (see
 * numa.h). Uses the raw mbind/set_mempolicy system calls: libnuma would be
 * a dependency for three calls. */
#include "mem/numa.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/busid.h"
#include "core/errmsg.h"
#include "core/log.h"

#ifndef MPOL_DEFAULT
#define MPOL_DEFAULT 0
#define MPOL_PREFERRED 1
#define MPOL_INTERLEAVE 3
#endif

#define PCI_VENDOR_NVIDIA 0x10de
#define PCI_CLASS_VGA 0x0300
#define PCI_CLASS_3D 0x0302

static const char *sysfs_root(const char *given)
{
    const char *env = getenv("KVNODE_SYSFS_ROOT");
    return given ? given : env && *env ? env : "/sys";
}

/* The first line of a small sysfs file as a number (base 0: "0x10de",
 * "-1"); false when it cannot be read. */
static bool read_number(const char *path, long *out)
{
    char buf[64], *end;
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok)
        return false;
    errno = 0;
    *out = strtol(buf, &end, 0);
    return errno == 0 && end != buf && (*end == '\n' || *end == '\0');
}

static int gpu_cmp(const void *x, const void *y)
{
    struct pci_busid a = { 0 }, b = { 0 };
    busid_parse(((const struct numa_gpu *)x)->bus_id, &a);
    busid_parse(((const struct numa_gpu *)y)->bus_id, &b);
    return busid_cmp(&a, &b);
}

void numa_read_topology(const char *root, struct numa_topology *out)
{
    char path[512];
    struct dirent *e;
    DIR *d;

    memset(out, 0, sizeof *out);
    root = sysfs_root(root);
    snprintf(path, sizeof path, "%s/devices/system/node", root);
    if ((d = opendir(path))) {
        while ((e = readdir(d))) {
            unsigned id;
            char tail;
            if (sscanf(e->d_name, "node%u%c", &id, &tail) == 1) {
                out->nodes++;
                if (id < NUMA_MAX_NODES)
                    out->node_mask |= UINT64_C(1) << id;
            }
        }
        closedir(d);
    }
    if (out->nodes == 0) {
        out->nodes = 1;
        out->node_mask = 1;
    }
    snprintf(path, sizeof path, "%s/bus/pci/devices", root);
    if (!(d = opendir(path)))
        return;
    while ((e = readdir(d)) && out->ngpus < NUMA_MAX_GPUS) {
        struct pci_busid id;
        long vendor, cls, node;
        if (!busid_parse(e->d_name, &id) || strlen(e->d_name) >= sizeof out->gpus[0].bus_id)
            continue;
        snprintf(path, sizeof path, "%s/bus/pci/devices/%s/vendor", root, e->d_name);
        if (!read_number(path, &vendor) || vendor != PCI_VENDOR_NVIDIA)
            continue;
        snprintf(path, sizeof path, "%s/bus/pci/devices/%s/class", root, e->d_name);
        if (!read_number(path, &cls) || ((cls >> 8) != PCI_CLASS_VGA && (cls >> 8) != PCI_CLASS_3D))
            continue;
        snprintf(path, sizeof path, "%s/bus/pci/devices/%s/numa_node", root, e->d_name);
        if (!read_number(path, &node) || node < 0 || node >= NUMA_MAX_NODES ||
            !(out->node_mask & (UINT64_C(1) << node)))
            node = -1;
        struct numa_gpu *g = &out->gpus[out->ngpus++];
        memcpy(g->bus_id, e->d_name, strlen(e->d_name) + 1);   /* length checked above */
        g->node = (int)node;
    }
    closedir(d);
    qsort(out->gpus, out->ngpus, sizeof out->gpus[0], gpu_cmp);
}

const char *numa_mode_name(int mode)
{
    switch (mode) {
    case NUMA_MODE_ONE_NODE:   return "one node";
    case NUMA_MODE_INTERLEAVE: return "interleaved";
    case NUMA_MODE_PER_GPU:    return "per GPU";
    default:                   return "off";
    }
}

void numa_plan_make(const struct numa_topology *t, bool numa_auto, uint64_t size, uint64_t slab_bytes,
                    struct numa_plan *out)
{
    unsigned per_node[NUMA_MAX_NODES] = { 0 }, gpus = 0;

    memset(out, 0, sizeof *out);
    out->nodes = t->nodes;
    out->node_mask = t->node_mask;
    if (!numa_auto) {
        out->mode = NUMA_MODE_OFF;
        return;
    }
    if (t->nodes <= 1) {
        out->mode = NUMA_MODE_ONE_NODE;
        return;
    }
    for (size_t i = 0; i < t->ngpus; i++)
        if (t->gpus[i].node >= 0) {
            per_node[t->gpus[i].node]++;
            gpus++;
        }
    for (int n = 0; n < NUMA_MAX_NODES; n++)
        if (per_node[n] && out->nregions < NUMA_MAX_REGIONS)
            out->regions[out->nregions++].node = n;
    uint64_t slabs = slab_bytes ? size / slab_bytes : 0;
    if (out->nregions == 0 || slabs < out->nregions) {
        out->nregions = 0;
        out->mode = NUMA_MODE_INTERLEAVE;
        return;
    }
    /* Whole slabs in proportion to each node's GPUs, at least one each; the
     * last region takes what rounding left. */
    out->mode = NUMA_MODE_PER_GPU;
    uint64_t start = 0, left = slabs;
    for (size_t r = 0; r < out->nregions; r++) {
        struct numa_region *g = &out->regions[r];
        g->gpus = per_node[g->node];
        uint64_t n = slabs * g->gpus / gpus;
        size_t after = out->nregions - r - 1;
        if (n < 1)
            n = 1;
        if (n > left - after)
            n = left - after;
        if (after == 0)
            n = left;
        g->start = start;
        g->end = start + n * slab_bytes;
        start = g->end;
        left -= n;
    }
}

/* Node masks as the system calls take them: maxnode is one more than the
 * bits they read (the kernel subtracts one), so a mask of NUMA_MAX_NODES
 * bits is passed as two words with maxnode NUMA_MAX_NODES + 1. */
static long sys_mbind(void *addr, uint64_t len, int mode, uint64_t mask)
{
    uint64_t words[2] = { mask, 0 };
    return syscall(SYS_mbind, addr, (unsigned long)len, mode, words, (unsigned long)NUMA_MAX_NODES + 1,
                   0u);
}

static long sys_set_mempolicy(int mode, uint64_t mask)
{
    uint64_t words[2] = { mask, 0 };
    return syscall(SYS_set_mempolicy, mode, words, (unsigned long)NUMA_MAX_NODES + 1);
}

void numa_plan_apply(struct numa_plan *p, void *base, uint64_t size, const char *label)
{
    switch (p->mode) {
    case NUMA_MODE_OFF:
        log_info("memory.numa=off: %s host memory placed by the kernel's default policy", label);
        return;
    case NUMA_MODE_ONE_NODE:
        log_info("memory.numa=auto: one NUMA node, %s host memory needs no placement", label);
        return;
    case NUMA_MODE_INTERLEAVE:
        if (sys_mbind(base, size, MPOL_INTERLEAVE, p->node_mask) != 0) {
            errmsg_set(p->why, sizeof p->why, "mbind MPOL_INTERLEAVE: %s", strerror(errno));
            log_warn("memory.numa=auto: cannot interleave %s host memory across %u NUMA nodes (%s); "
                     "the kernel's default policy applies", label, p->nodes, p->why);
        } else {
            p->interleaved = true;
            log_info("memory.numa=auto: no GPU's NUMA node is known: %s host memory interleaved "
                     "across %u NUMA nodes", label, p->nodes);
        }
        return;
    default:
        break;
    }
    for (size_t r = 0; r < p->nregions; r++) {
        struct numa_region *g = &p->regions[r];
        if (sys_mbind((char *)base + g->start, g->end - g->start, MPOL_PREFERRED,
                      UINT64_C(1) << g->node) != 0) {
            errmsg_set(g->why, sizeof g->why, "mbind MPOL_PREFERRED node %d: %s", g->node,
                       strerror(errno));
            log_warn("memory.numa=auto: %s host memory for the %u GPU%s of NUMA node %d "
                     "(%llu MiB) cannot be placed there (%s); the kernel's default policy applies",
                     label, g->gpus, g->gpus == 1 ? "" : "s", g->node,
                     (unsigned long long)((g->end - g->start) >> 20), g->why);
        } else {
            g->placed = true;
            log_info("memory.numa=auto: %s host memory for the %u GPU%s of NUMA node %d: %llu MiB "
                     "at offset %llu MiB, on that node", label, g->gpus, g->gpus == 1 ? "" : "s",
                     g->node, (unsigned long long)((g->end - g->start) >> 20),
                     (unsigned long long)(g->start >> 20));
        }
    }
}

int numa_region_of_gpu(const struct numa_plan *p, const struct numa_topology *t, const char *bus_id,
                       int ordinal)
{
    struct pci_busid want, have;
    int node = -1;

    if (p->mode != NUMA_MODE_PER_GPU)
        return -1;
    if (busid_parse(bus_id, &want)) {
        for (size_t i = 0; i < t->ngpus; i++)
            if (busid_parse(t->gpus[i].bus_id, &have) && busid_cmp(&want, &have) == 0)
                node = t->gpus[i].node;
    } else if (ordinal >= 0 && (size_t)ordinal < t->ngpus) {
        node = t->gpus[ordinal].node;
    }
    for (size_t r = 0; node >= 0 && r < p->nregions; r++)
        if (p->regions[r].node == node)
            return (int)r;
    return -1;
}

uint64_t numa_region_end(const struct numa_plan *p, uint64_t offset)
{
    for (size_t r = 0; p->mode == NUMA_MODE_PER_GPU && r < p->nregions; r++)
        if (offset >= p->regions[r].start && offset < p->regions[r].end)
            return p->regions[r].end;
    return UINT64_MAX;
}

int numa_thread_policy(const struct numa_plan *p, uint64_t offset, int *last)
{
    int want = NUMA_THREAD_DEFAULT, mode = MPOL_DEFAULT;
    uint64_t mask = 0;

    if (p && p->mode == NUMA_MODE_INTERLEAVE && p->interleaved) {
        want = NUMA_THREAD_INTERLEAVE;
        mode = MPOL_INTERLEAVE;
        mask = p->node_mask;
    }
    for (size_t r = 0; p && p->mode == NUMA_MODE_PER_GPU && r < p->nregions; r++)
        if (offset >= p->regions[r].start && offset < p->regions[r].end && p->regions[r].placed) {
            want = p->regions[r].node;
            mode = MPOL_PREFERRED;
            mask = UINT64_C(1) << want;
        }
    /* A thread starts with the default policy: nothing to set. */
    if (want == *last || (want == NUMA_THREAD_DEFAULT && *last == NUMA_THREAD_UNSET)) {
        *last = want;
        return 0;
    }
    if (sys_set_mempolicy(mode, mask) != 0)
        return errno;
    *last = want;
    return 0;
}
