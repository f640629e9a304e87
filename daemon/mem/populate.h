/* populate: reserves and populates a host arena's memory on background
 * threads after the daemon already serves (issue 16). The arena is created
 * with its full size but nothing reserved (arena_create_host_deferred); the
 * threads reserve chunks (fallocate; by faulting them in for THP arenas,
 * see populate.c for why) in order from the start and raise the arena's reserved
 * prefix (arena_mark_reserved) as chunks complete, so the allocator only
 * ever hands out reserved memory. A chunk that cannot be had stops the job:
 * the tier keeps what was reserved, progress says why.
 *
 * start/stop: loop thread (with the arena). progress: any thread. */
#ifndef KVNODE_POPULATE_H
#define KVNODE_POPULATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct arena;
struct numa_plan;
struct populate;

enum populate_state {
    POPULATE_RUNNING = 0,
    POPULATE_DONE    = 1,
    POPULATE_FAILED  = 2,   /* a chunk could not be had: the tier stays at reserved_bytes */
    POPULATE_STOPPED = 3,   /* stopped before the end (shutdown) */
};

struct populate_progress {
    int      state;          /* enum populate_state */
    uint64_t reserved_bytes; /* contiguous prefix reserved and populated */
    uint64_t total_bytes;
    double   seconds;        /* since start, until done/failed */
    char     why[256];       /* POPULATE_FAILED */
};

#define POPULATE_CHUNK_BYTES (UINT64_C(256) << 20)

/* Threads for this machine: min(online cores / 4, 8), at least 1. */
unsigned populate_default_threads(void);

/* Populate arena a (a deferred host arena), each range on the NUMA node
 * plan puts it (NULL: the default policy; the plan is copied): its first chunk (64 MiB, or
 * the chunk size if smaller) before returning, the rest on `threads` threads
 * (in the liveness registry as "kvnode-populate"). label names it in the log
 * ("host" or "tenant NAME"). Test-only environment knobs:
 * KVNODE_POPULATE_SIM_CHUNK_BYTES (chunk size, a multiple of the page size)
 * KVNODE_POPULATE_SIM_DELAY_MS (sleep after each chunk) and
 * KVNODE_POPULATE_SIM_FAIL_AT_BYTES (a chunk reaching past this offset fails
 * as if fallocate had said ENOSPC). 0, or a
 * negative KVNODE_E* code with why set (nothing left running). */
int  populate_start(struct arena *a, const struct numa_plan *plan, unsigned threads, const char *label,
                    struct populate **out, char *why, size_t whylen);
void populate_progress(struct populate *p, struct populate_progress *out);
/* Map the pages of [p, p+len) into this process's page tables now, in one
 * call (MADV_POPULATE_WRITE; best effort, nothing before Linux 5.14): for a
 * copy about to fill arena memory the daemon has not touched yet (the arena
 * is reserved but not faulted into the daemon's own mapping), which would
 * otherwise fault once per page inside the copy. */
void populate_touch(void *p, size_t len);
/* Stop the threads (joins; a chunk in progress finishes) and free. NULL ok. */
void populate_stop(struct populate *p);

#endif
