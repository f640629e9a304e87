/* memcheck: admission of the memory tiers — can this machine give kvnoded
 * the host memory its configuration asks for?
 *
 * The host tier is a memfd whose pages are all reserved at start. While
 * they are reserved those pages count toward no process's OOM score, so
 * asking for more than the machine has gets other processes (on a GPU node:
 * the engines) killed before kvnoded. So before anything is reserved,
 * main.c (and --check-config)
 * compares what the configuration reserves in host memory with
 *   - MemAvailable (/proc/meminfo), and
 *   - the memory limit of kvnoded's cgroup and of each of its ancestors
 *     (cgroup v2 memory.max, or v1 memory.limit_in_bytes), less what each
 *     already holds apart from reclaimable page cache,
 * each less a margin (memcheck_margin) kept free for the kernel, kvnoded's
 * own index and buffers and other processes. With memory.huge_pages auto
 * or on, when the default-size hugetlb pool (Hugepagesize) has free pages
 * for the whole host arena, the arena takes them (see arena.c) and only the
 * rest of the demand is held against MemAvailable: pool pages are not in it.
 * A 1GiB pool is not counted (the check stays the stricter one).
 *
 * No state; any thread; reads a few small files. */
#ifndef KVNODE_MEMCHECK_H
#define KVNODE_MEMCHECK_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

#define MEMCHECK_UNKNOWN UINT64_MAX        /* a figure that could not be read, or no limit */
#define MEMCHECK_MARGIN_MIN (UINT64_C(256) << 20)   /* smallest margin: 256 MiB */
#define MEMCHECK_MARGIN_SHARE 64           /* margin: 1/64 of the memory it is kept in */

/* Where the figures come from; a NULL member (or a NULL struct) means the
 * real file. Tests point them at fake files. */
struct memcheck_sources {
    const char *meminfo;       /* "/proc/meminfo" */
    const char *self_cgroup;   /* "/proc/self/cgroup" */
    const char *cgroup_root;   /* "/sys/fs/cgroup" (v1 hierarchies below it, e.g. memory/) */
};

/* What this machine can give, as read by memcheck_probe. */
struct memcheck_room {
    uint64_t mem_total;        /* MemTotal in bytes (MEMCHECK_UNKNOWN: not read) */
    uint64_t mem_available;    /* MemAvailable in bytes (MEMCHECK_UNKNOWN: not read) */
    uint64_t cgroup_limit;     /* the binding cgroup's limit (MEMCHECK_UNKNOWN: no limit) */
    uint64_t cgroup_usage;     /* what that cgroup holds, less reclaimable page cache */
    char     cgroup_file[PATH_MAX + 32];   /* the binding limit's file ("" without one) */
    uint64_t hugetlb_page;     /* Hugepagesize in bytes (0: not read) */
    uint64_t hugetlb_free;     /* that pool's free, unreserved pages in bytes (0: none) */
    char     unread[256];      /* what could not be read and why ("" when everything was) */
};

/* Reads MemTotal, MemAvailable and the cgroup limits of the calling process
 * (the tightest of its cgroup and their ancestors: v2 and v1 memory
 * hierarchies alike). Never fails: what cannot be read is MEMCHECK_UNKNOWN
 * and named in room->unread. */
void memcheck_probe(const struct memcheck_sources *src, struct memcheck_room *room);

/* Memory kept free out of `total` bytes (MemTotal or a cgroup limit):
 * total / MEMCHECK_MARGIN_SHARE, at least MEMCHECK_MARGIN_MIN. */
uint64_t memcheck_margin(uint64_t total);

/* Bytes of host memory the configuration reserves at start: the host arena
 * (memory.host_bytes in whole slabs) and, with [hbm] backend = sim, each
 * simulated device's region (hbm.bytes each; the devices as config_resolve
 * parsed [hbm] devices into hbm_device_list). `what` (may be NULL) names
 * the options it comes from, e.g. "memory.host_bytes". Saturates at
 * UINT64_MAX. */
uint64_t memcheck_demand(const struct kvn_config *cfg, char *what, size_t whatlen);

/* Whether the demand fits the room. 0 with msg a one-line summary for the
 * log ("reserving ... of host memory ...; ... available ..."), or -1 with
 * msg naming the size asked for, what is available (and where that figure
 * comes from) and the remedy. A figure that could not be read does not
 * refuse the start. */
int memcheck_admit(const struct kvn_config *cfg, const struct memcheck_room *room, char *msg, size_t msglen);

/* A size for messages: an exact binary unit when there is one ("64MiB"),
 * else one decimal ("22.9GiB"); "unknown" for MEMCHECK_UNKNOWN. */
void memcheck_format_size(uint64_t bytes, char *buf, size_t len);

#endif
