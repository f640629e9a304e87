/* kvcm_types: the values kvcm takes and gives -- its settings, its states,
 * the node status the heartbeat reports, its stats. No code: kvcm.h (the
 * door, on top) and the pieces below it (kvcm_shared, kvcm_events,
 * kvcm_publisher, kvcm_heartbeat) all build on this header, so none of
 * them needs the door's. */
#ifndef KVNODE_KVCM_TYPES_H
#define KVNODE_KVCM_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVCM_MAX_ENDPOINTS 8
#define KVCM_MAX_CACHES 17          /* one per tenant */
#define KVCM_MAX_DEPLOYMENTS 256
#define KVCM_ERR_MAX 512

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
static inline const char *kvcm_state_name(int state)
{
    static const char *const names[] = { "DISABLED", "STARTING", "REGISTERING", "RESYNCING",
                                         "READY", "DEGRADED", "STOPPED", "STALLED" };
    return state >= 0 && state <= KVCM_STATE_STALLED ? names[state] : "UNKNOWN";
}

/* What the heartbeat reports about the node (set from the loop). */
struct kvcm_node_status {
    uint64_t host_blocks, host_free_bytes, store_blocks;
    uint64_t clients;
};
typedef void (*kvcm_status_fn)(void *arg, struct kvcm_node_status *out);

/* "kvcm" of the stats document, read under the publisher's lock. Strings
 * are copies or belong to the kvcm (its settings and deployments, which
 * live as long as it). */
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

#endif
