/* copier: the copy workers. Threads on a workq, each owning a non-blocking
 * devmem stream per device, that run batches of copies between device and
 * host memory for the loop: HBM -> host demotion today. With a thread per
 * device, batches of different devices (or two of one device) overlap
 * instead of queueing behind each other's event wait. A batch is one job:
 * its copies are queued on the device's stream (adjacent source and
 * destination runs merged into one transfer, split again where the host
 * side crosses a pin chunk boundary), then one event is waited
 * for; done() runs on the loop with the outcome. The loop never waits for
 * a copy.
 *
 * create/submit/stats/destroy: loop thread only. */
#ifndef KVNODE_COPIER_H
#define KVNODE_COPIER_H

#include <stddef.h>
#include <stdint.h>

#include "core/workq.h"

struct event_base;
struct devmem;
struct copier;

struct copier_item {
    void       *dst;
    const void *src;
    size_t      len;
};

/* A batch, owned by the submitter until done() (which may free it). */
struct copier_batch {
    int     device;                  /* whose stream runs it */
    size_t  n;
    struct copier_item *items;
    /* The host arena the copies read or write, pinned in chunks of
     * host_chunk from host_base (hostpin_chunk_bytes; 0: not pinned). A
     * transfer never crosses a chunk boundary of [host_base,
     * host_base + host_len), so it is wholly pinned or wholly not while
     * pinning runs or after it failed part-way: the driver refuses a copy
     * that straddles registrations. */
    const void *host_base;
    uint64_t    host_len, host_chunk;
    /* done(batch) on the loop: rc 0 when every byte was copied, else a
     * negative KVNODE_E* code and why set (cancelled at stop: -KVNODE_ESHUTDOWN). */
    void  (*done)(struct copier_batch *b);
    void   *arg;
    int     rc;
    char    why[256];
    uint64_t elapsed_ns;             /* first copy queued .. event complete */
    /* private */
    struct copier *cp;
    size_t transfers;                /* copy calls issued (worker, then loop) */
    size_t splits;                   /* of them, split at a pin chunk boundary */
    struct workq_job job;
};

struct copier_stats {
    uint64_t batches, failed;        /* batches completed (ok + failed), failed of them */
    uint64_t transfers;              /* copy calls after merging adjacent items */
    uint64_t chunk_splits;           /* transfers split at a pin chunk boundary */
    uint64_t bytes;                  /* bytes copied by batches that succeeded */
    uint64_t busy_ns;                /* summed elapsed_ns of those batches */
    size_t   pending;                /* submitted, done() not yet called */
};

/* queue: batches outstanding at most (>= 1). dm must have a device (not
 * none). 0, or a negative code with err set. */
#define COPIER_MAX_THREADS 16u
int  copier_create(struct event_base *loop, struct devmem *dm, unsigned threads, size_t queue,
                   struct copier **out, char *err, size_t errlen);
/* 0; -KVNODE_ELIMIT when the queue is full; -KVNODE_EINVAL for a bad batch
 * (why says why): no done(), a device out of devmem_device_count()'s range,
 * items NULL with n > 0, an item with len > 0 and a NULL pointer, a
 * host_chunk without host_base and host_len;
 * -KVNODE_ESHUTDOWN once copier_destroy has begun. On failure done() is not
 * called. A batch of n == 0 (or only empty items) completes with rc 0.
 * Errors of the runtime (stream creation, a copy, the wait) come back in
 * done() as rc < 0 with why; copies already queued are waited for first,
 * so the batch's memory is never in use once done() runs. */
int  copier_submit(struct copier *cp, struct copier_batch *b);
void copier_stats(struct copier *cp, struct copier_stats *out);
/* Waits for the running batch, cancels the queued ones (done() with
 * -KVNODE_ESHUTDOWN), destroys the streams. NULL is ignored. */
void copier_destroy(struct copier *cp);

#endif
