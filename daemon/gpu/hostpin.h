/* hostpin: page-locks the host arena for GPU copies (devmem_host_register)
 * in chunks on a background thread, so the daemon is ready long before a
 * large arena is fully pinned (registering hundreds of GiB takes seconds).
 * Owns that thread and the record of which chunks are registered; the loop
 * reads progress with hostpin_progress() (atomics, never waits).
 *
 * start/stop: main thread. progress: any thread. */
#ifndef KVNODE_HOSTPIN_H
#define KVNODE_HOSTPIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct devmem;
struct hostpin;

enum hostpin_state {
    HOSTPIN_RUNNING = 0,   /* chunks still being registered */
    HOSTPIN_DONE    = 1,   /* the whole range is pinned */
    HOSTPIN_FAILED  = 2,   /* a chunk failed: the rest stays unpinned (why says why) */
    HOSTPIN_STOPPED = 3,   /* stopped before the end (shutdown) */
};

struct hostpin_progress {
    int      state;        /* enum hostpin_state */
    uint64_t pinned_bytes; /* registered so far */
    uint64_t total_bytes;
    char     why[256];     /* HOSTPIN_FAILED */
};

/* Register [base, base+len) in chunks of chunk_bytes (the last may be
 * shorter). base must be page-aligned and chunk_bytes a multiple of the
 * page size, so no two chunks share a page. With align_bytes (the host
 * arena's slab size; 0: none) the chunk is rounded up to a multiple of it
 * (and of the page), counted from base: a slab, and so every block in it,
 * lies in one chunk, and a copy of a block is never part pinned, part not
 * (the driver refuses a copy that straddles registrations). When first_sync is true the
 * first chunk is registered before returning and its failure is returned
 * (-KVNODE_EIO, why set; nothing left running); the rest always runs on the
 * thread ("kvnode-pin", in the liveness registry: a chunk should take well
 * under [server] worker_stall_timeout). A backend that cannot pin (none,
 * devmem_can_pin false) fails here with -KVNODE_EINVAL, whatever
 * first_sync. 0, or a negative code with why set. */
int  hostpin_start(struct devmem *dm, void *base, uint64_t len, uint64_t chunk_bytes,
                   uint64_t align_bytes, bool first_sync, struct hostpin **out, char *why, size_t whylen);
void hostpin_progress(struct hostpin *hp, struct hostpin_progress *out);
/* The chunk size in use (chunk_bytes after rounding; every chunk starts at
 * base + i * it): copies split there (copier_batch.host_chunk). Any thread. */
uint64_t hostpin_chunk_bytes(const struct hostpin *hp);
/* Ask the thread to stop after its current chunk and wait for it to exit;
 * what is registered stays registered. Progress then says STOPPED (or
 * DONE/FAILED when it had already ended). hostpin_stop does this first. */
void hostpin_cancel(struct hostpin *hp);
/* Stop the thread (between chunks), unregister every chunk, free. NULL ok. */
void hostpin_stop(struct hostpin *hp);

#endif
