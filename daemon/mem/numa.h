/* numa: where a host arena's memory lives on a machine of several NUMA
 * nodes (memory.numa). Owns reading the topology from sysfs (the nodes, and
 * the node of every GPU from its PCI device), the plan for one arena and
 * applying it.
 *
 * The plan (memory.numa = auto):
 *   one node            nothing to place; says so.
 *   GPUs on known nodes "per GPU": the arena is split into one region per
 *                       node that has GPUs, sized in proportion to its GPUs
 *                       (whole slabs), each preferring its node
 *                       (MPOL_PREFERRED: a full node spills over instead of
 *                       failing). Blocks a client on a GPU puts, and blocks
 *                       demoted from a GPU, land in that GPU's region while
 *                       it has room (arena_alloc_near).
 *   no GPU node known   the whole arena interleaved across all nodes.
 * memory.numa = off leaves placement to the kernel's default policy.
 *
 * A GPU is a PCI device of vendor 0x10de (NVIDIA) and class 0x0300 (VGA)
 * or 0x0302 (3D controller) under <sysfs>/bus/pci/devices; nodes are the
 * <sysfs>/devices/system/node/node<N> directories. <sysfs> is /sys, or
 * $KVNODE_SYSFS_ROOT (tests: a fake machine).
 *
 * Main thread at start, except numa_thread_policy (populate threads). */
#ifndef KVNODE_NUMA_H
#define KVNODE_NUMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NUMA_MAX_GPUS 64
#define NUMA_MAX_REGIONS 8    /* == ARENA_MAX_REGIONS */
#define NUMA_MAX_NODES 64

struct numa_gpu {
    char bus_id[32];          /* "0000:3b:00.0" as sysfs names it */
    int  node;                /* -1: unknown */
};

struct numa_topology {
    unsigned nodes;           /* NUMA nodes (1 when sysfs does not say) */
    uint64_t node_mask;       /* bit N: node N exists (nodes below 64) */
    size_t   ngpus;           /* in PCI bus id order */
    struct numa_gpu gpus[NUMA_MAX_GPUS];
};

enum numa_mode { NUMA_MODE_OFF = 0, NUMA_MODE_ONE_NODE, NUMA_MODE_INTERLEAVE, NUMA_MODE_PER_GPU };

struct numa_region {
    int      node;
    uint64_t start, end;      /* bytes of the arena */
    unsigned gpus;            /* GPUs on this node */
    bool     placed;          /* mbind succeeded */
    char     why[160];        /* why not placed */
};

struct numa_plan {
    int      mode;            /* enum numa_mode */
    unsigned nodes;
    uint64_t node_mask;
    size_t   nregions;        /* NUMA_MODE_PER_GPU: >= 1 */
    struct numa_region regions[NUMA_MAX_REGIONS];
    bool     interleaved;     /* NUMA_MODE_INTERLEAVE: mbind succeeded */
    char     why[160];        /* NUMA_MODE_INTERLEAVE: why not interleaved */
};

/* The topology under sysfs_root (NULL: $KVNODE_SYSFS_ROOT, else /sys). */
void numa_read_topology(const char *sysfs_root, struct numa_topology *out);
/* The plan for an arena of size bytes in slabs of slab_bytes. */
void numa_plan_make(const struct numa_topology *t, bool numa_auto, uint64_t size, uint64_t slab_bytes,
                    struct numa_plan *out);
/* Bind [base, base + size) as planned (before any page is reserved);
 * failures are recorded in the plan (placed/why) and logged, never fatal.
 * label names the arena in the log ("the" or "tenant NAME"). */
void numa_plan_apply(struct numa_plan *p, void *base, uint64_t size, const char *label);
/* "off", "one node", "interleaved" or "per GPU" (for /stats). */
const char *numa_mode_name(int mode);
/* The region of the GPU with this PCI bus id (any case, 4- or 8-digit
 * domain), else of the ordinal-th GPU in PCI order (engines number GPUs so
 * under CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA's default order matches it on
 * machines of one GPU model). -1 when there is no such region. */
int  numa_region_of_gpu(const struct numa_plan *p, const struct numa_topology *t, const char *bus_id,
                        int ordinal);
/* Where the region holding offset ends (UINT64_MAX: no regions), so a
 * caller reserving a range can switch policy at region boundaries. */
uint64_t numa_region_end(const struct numa_plan *p, uint64_t offset);
/* Make the calling thread allocate the memory at offset where the plan
 * puts it: the region's node (MPOL_PREFERRED), all nodes (interleaved), or
 * the default policy. hugetlbfs allocates from the task's policy, not the
 * mapping's, so the populate threads call this before each fallocate.
 * *last remembers the policy set (start at NUMA_THREAD_UNSET), so unchanged
 * calls cost nothing. p NULL: the default policy. 0 or errno. */
enum { NUMA_THREAD_UNSET = -3, NUMA_THREAD_INTERLEAVE = -2, NUMA_THREAD_DEFAULT = -1 };
int  numa_thread_policy(const struct numa_plan *p, uint64_t offset, int *last);

#endif
