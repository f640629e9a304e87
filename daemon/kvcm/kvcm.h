/* kvcm: keeps the KV Cache Manager's view of this node correct and current
 * (docs/PROTOCOLS.md §2) without ever slowing an engine down.
 *
 * Owns two threads, each with its own kvcm_client:
 *   publisher  registers each deployment (registerInstance, then
 *              NODE_REGISTER), sends a full snapshot, then batched ADD/DELETE
 *              of complete keys, coalesced per key to their final state;
 *              periodic snapshots; every status handled (re-register,
 *              retry_after_ms, snapshot_required, backoff with a cap).
 *   heartbeat  EVENT_HEARTBEAT per registered deployment on its own cadence,
 *              so it never waits behind a snapshot upload.
 * A deployment registers when the HELLO of its first complete TP group
 * binds (so an empty one heartbeats too), under an instance id that must be
 * its own: a deployment whose id another one already uses is refused,
 * naming both. Each complete key is reported in the medium of its tier
 * (medium_hbm when every rank's copy is in GPU memory, else medium_host); a
 * demotion is a DELETE from one medium and an ADD to the other, coalesced
 * like any change; NODE_REGISTER names every medium the node has.
 *
 * The loop feeds the publisher through a bounded queue (a mutex held for
 * O(1) only; never blocks): when it is full the event is dropped, counted,
 * and the publisher resynchronises — the loop queues a marker and walks the
 * index in chunks (cache_walk_complete); once the publisher has dequeued the
 * marker and the walk has ended it replaces its mirror of complete keys
 * with the result plus every event queued after the marker, then sends a
 * snapshot. One resync at a time. Snapshots are built from that mirror on
 * the publisher thread and never mixed with deltas.
 *
 * Liveness: work (events, deltas, a snapshot, a registration) that has
 * waited longer than stall_timeout without anything reaching KVCM shows as
 * state STALLED (unless DEGRADED already says why), in kvcm_stalled() for
 * /readyz, and in the stats ("stalled", "stalled_ms").
 *
 * Stop: threads end, then HOST_DOWN (alone in its request) for every
 * deployment KVCM may know, all within host_down_timeout.
 *
 * The pieces, each below the one before (dependencies point down only):
 *   kvcm.c            this door: builds the others, stops them (HOST_DOWN)
 *   kvcm_events.c     the loop side: block observers, resync walks, status
 *   kvcm_publisher.c  the publisher thread    kvcm_heartbeat.c  the heartbeat
 *   kvcm_shared.c     the state they share, its one owner (one mutex)
 *   kvcm_types.h      the values they all take and give
 *
 * kvcm_create/kvcm_stop/kvcm_destroy/kvcm_get_stats: loop thread only. */
#ifndef KVNODE_KVCM_H
#define KVNODE_KVCM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcm/kvcm_types.h"

struct event_base;
struct cache;
struct kvcm;

/* Start the threads (no network call happens on the calling thread) for
 * the deployments of n caches (one per tenant; at most KVCM_MAX_CACHES):
 * each gets the block observers, and a resync walks them one after the
 * other. Tenants' deployments differ by fingerprint, so they never merge.
 * The status callback runs on the loop once per heartbeat interval. 0, or
 * a negative KVNODE_E* code with err set. */
int  kvcm_create(struct event_base *base, struct cache *const *caches, size_t n,
                 const struct kvcm_settings *st, kvcm_status_fn status, void *status_arg,
                 struct kvcm **out, char *err, size_t errlen);
/* End the threads and send HOST_DOWN, bounded by host_down_timeout (plus
 * the call in flight on each thread, which its own timeout bounds). */
void kvcm_stop(struct kvcm *k);
/* The same without HOST_DOWN: the host tier was handed to the next start
 * (warm restart), whose first snapshot says what it holds. */
void kvcm_stop_handed_over(struct kvcm *k);
void kvcm_destroy(struct kvcm *k);
/* "kvcm" of the stats document (struct kvcm_stats, kvcm_types.h). NULL k:
 * not on, state KVCM_STATE_DISABLED. */
void kvcm_get_stats(struct kvcm *k, struct kvcm_stats *out);
/* Whether work has waited longer than stall_timeout without reaching KVCM;
 * why (when not NULL) says how long and what is known. NULL k: false. */
bool kvcm_stalled(struct kvcm *k, char *why, size_t len);
/* This incarnation's epoch (trace ids carry it). */
uint64_t kvcm_epoch(const struct kvcm *k);
/* The caches hold blocks no event told the publisher of (a warm restart
 * adopted them before it existed): it walks them before its first snapshot,
 * as after dropped events. NULL k: nothing. */
void kvcm_resync(struct kvcm *k);

#endif
