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
 * kvcm_create/kvcm_block_event/kvcm_stop/kvcm_destroy/kvcm_get_stats: loop
 * thread only. */
#ifndef KVNODE_KVCM_H
#define KVNODE_KVCM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "mem/namespace.h"

struct event_base;
struct cache;
struct kvcm;

#define KVCM_MAX_ENDPOINTS 8

/* What kvcm needs from [kvcm] (filled by the daemon from its config). */
struct kvcm_settings {
    const char *endpoints[KVCM_MAX_ENDPOINTS];
    size_t   n_endpoints;
    const char *instance_group;
    const char *instance_id_template;   /* {model} {dtype} {block_tokens} {tp_size} {fingerprint} */
    const char *host_ip_port;
    const char *storage_type;           /* ST_EVENT_REPORT_L1P5 | ST_EVENT_REPORT_L2 */
    const char *medium_hbm;             /* "hbm": blocks whose every rank is in GPU memory */
    const char *medium_host;            /* "dram": the others */
    bool        has_hbm;                /* the node has an HBM tier: register medium_hbm too */
    const char *spec_name_template;     /* "rtp_llm_hbm_{block_tokens}" */
    const char *location_uri_template;  /* "rtp-llm://{host_ip_port}/{medium}?size={block_bytes}" */
    uint32_t connect_timeout_ms, request_timeout_ms, snapshot_timeout_ms;
    uint32_t flush_interval_ms, heartbeat_interval_ms, snapshot_interval_ms;
    uint32_t retry_base_ms, retry_max_ms, host_down_timeout_ms;
    uint32_t batch_events, queue_events;
    uint32_t stall_timeout_ms;          /* work waiting longer without progress: STALLED */
};

enum kvcm_state {
    KVCM_STATE_DISABLED = 0, KVCM_STATE_STARTING, KVCM_STATE_REGISTERING, KVCM_STATE_RESYNCING,
    KVCM_STATE_READY, KVCM_STATE_DEGRADED, KVCM_STATE_STOPPED, KVCM_STATE_STALLED,
};
const char *kvcm_state_name(int state);

/* What the heartbeat reports about the node (set from the loop). */
struct kvcm_node_status {
    uint64_t host_blocks, host_free_bytes, store_blocks;
    uint64_t clients;
};
typedef void (*kvcm_status_fn)(void *arg, struct kvcm_node_status *out);

/* Start the threads (no network call happens on the calling thread) for
 * the deployments of n caches (one per tenant; at most KVCM_MAX_CACHES):
 * each gets the block observers, and a resync walks them one after the
 * other. Tenants' deployments differ by fingerprint, so they never merge.
 * The status callback runs on the loop once per heartbeat interval. 0, or
 * a negative KVNODE_E* code with err set. */
#define KVCM_MAX_CACHES 17
int  kvcm_create(struct event_base *base, struct cache *const *caches, size_t n,
                 const struct kvcm_settings *st, kvcm_status_fn status, void *status_arg,
                 struct kvcm **out, char *err, size_t errlen);
/* The cache's observers (cache_set_block_observer): a key's completeness and
 * medium (enum cache_medium), and a deployment whose TP group connected. */
void kvcm_block_event(void *kvcm, const struct kv_namespace *ns, int64_t key, int medium);
void kvcm_deployment_event(void *kvcm, const struct kv_namespace *ns);
/* End the threads and send HOST_DOWN, bounded by host_down_timeout (plus
 * the call in flight on each thread, which its own timeout bounds). */
void kvcm_stop(struct kvcm *k);
void kvcm_destroy(struct kvcm *k);
/* "kvcm" of the stats document, read under the publisher's lock. Strings
 * are copies or belong to k (its settings and deployments, which live as
 * long as k). */
#define KVCM_MAX_DEPLOYMENTS 256
#define KVCM_ERR_MAX 512
struct kvcm_deployment_stats {
    const char *deployment_id, *instance_id;
    bool registered;          /* NODE_REGISTER went through: it is heartbeaten */
    const char *refused;      /* why it is never published; NULL: it is */
};
struct kvcm_stats {
    bool on;                  /* [kvcm] enabled = on; nothing below state is set otherwise */
    int state;                /* enum kvcm_state as shown (STALLED while stalled) */
    bool stalled;
    uint64_t stalled_ms;      /* how long work has waited without reaching KVCM (0: none) */
    uint64_t stall_timeout_ms, epoch, generation;
    uint64_t queue, queue_capacity, accepted, dropped, snapshots;
    uint64_t heartbeats_ok, heartbeats_failed, last_snapshot_unix_ms;
    char last_error[KVCM_ERR_MAX];
    const char *host_ip_port;
    const char *media[2];     /* wire names: the HBM medium (when there is an HBM tier), host */
    size_t nmedia;
    struct kvcm_deployment_stats deployments[KVCM_MAX_DEPLOYMENTS];
    size_t ndeployments;
};
/* NULL k: not on, state KVCM_STATE_DISABLED. */
void kvcm_get_stats(struct kvcm *k, struct kvcm_stats *out);
/* Whether work has waited longer than stall_timeout without reaching KVCM;
 * why (when not NULL) says how long and what is known. NULL k: false. */
bool kvcm_stalled(struct kvcm *k, char *why, size_t len);
/* This incarnation's epoch (trace ids carry it). */
uint64_t kvcm_epoch(const struct kvcm *k);

#endif
