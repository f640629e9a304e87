/* kvcm_client: a client of the KV Cache Manager (KVCM) over HTTP/JSON,
 * exactly as docs/PROTOCOLS.md §2 describes it: POST <leader>/api/<rpc>
 * with the protobuf JSON mapping (snake_case, enums by name, int64 as
 * decimal strings), the outcome in header.status.code. Owns one persistent
 * libcurl easy handle (connections reused), the endpoint list and the
 * current leader (getClusterInfo; rediscovered once on SERVER_NOT_LEADER),
 * connect and total timeouts on every call, and a cap on response bodies.
 *
 * Calls block (network) and so run only on the publisher, heartbeat and
 * query threads; one kvcm_client belongs to one thread at a time. Every
 * call is bounded by its timeout. Trace ids are "<trace_prefix>-<n>" with
 * n counting per client, so a per-boot epoch in the prefix makes them
 * unique across restarts. */
#ifndef KVNODE_KVCM_CLIENT_H
#define KVNODE_KVCM_CLIENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* header.status.code values (docs/PROTOCOLS.md §2). */
enum kvcm_status {
    KVCM_TRANSPORT = -1,              /* no valid answer: connect/timeout/HTTP status/garbage */
    KVCM_UNSPECIFIED = 0, KVCM_OK = 1, KVCM_UNSUPPORTED = 2, KVCM_INTERNAL_ERROR = 3,
    KVCM_SERVICE_NOT_READY = 4, KVCM_INVALID_ARGUMENT = 5, KVCM_DUPLICATE_ENTITY = 6,
    KVCM_REACH_MAX_ENTITY_CAPACITY = 7, KVCM_INSTANCE_NOT_EXIST = 8, KVCM_SERVER_NOT_LEADER = 9,
    KVCM_NODE_NOT_REGISTERED = 10, KVCM_SNAPSHOT_IN_PROGRESS = 11, KVCM_SNAPSHOT_RATE_LIMITED = 13,
    KVCM_SNAPSHOT_REQUIRED = 14, KVCM_IO_ERROR = 20, KVCM_UNKNOWN_ERROR = 100,
};

/* "OK", "SERVER_NOT_LEADER", ..., "TRANSPORT" for KVCM_TRANSPORT, "UNKNOWN" otherwise. */
const char *kvcm_status_name(int status);
/* Parse a status name (or its number as a string/JSON integer); -2 when unknown. */
int kvcm_status_parse(json_t *code);

struct kvcm_client_config {
    const char *const *endpoints;     /* base URLs, "http://host:port" (no trailing /api) */
    size_t   n_endpoints;
    uint32_t connect_timeout_ms;
    uint32_t request_timeout_ms;      /* default bound of one call */
    size_t   max_response_bytes;      /* larger bodies fail the call (KVCM_TRANSPORT) */
    const char *trace_prefix;         /* e.g. "<host_ip_port>-<epoch>" */
};

/* What a call came back with. */
struct kvcm_result {
    int      status;                  /* enum kvcm_status */
    int      http_status;             /* 0 when no HTTP answer */
    char     message[512];            /* the server's message, or why the transport failed */
    uint64_t retry_after_ms;          /* reportEvent */
    bool     snapshot_required;       /* reportEvent */
    char     snapshot_version[64];    /* reportEvent: committed_snapshot_version */
    char     trace_id[96];            /* the trace id this call sent */
};

struct kvcm_client;

/* 0, or a negative KVNODE_E* code with err set (no endpoints, bad URL, out
 * of memory). Makes no network call. */
int  kvcm_client_create(const struct kvcm_client_config *cfg, struct kvcm_client **out,
                        char *err, size_t errlen);
void kvcm_client_destroy(struct kvcm_client *c);
/* A flag another thread may set to abandon the call in flight (it then
 * fails with KVCM_TRANSPORT at once, within curl's progress interval) and
 * every later one until it is cleared. NULL: none. */
void kvcm_client_set_cancel(struct kvcm_client *c, const atomic_bool *flag);

/* getClusterInfo on each endpoint in turn until one answers OK; the leader
 * (leader_endpoint host + meta_http_port) becomes the target of later
 * calls. Returns the status of the last answer (KVCM_OK when found). */
int  kvcm_discover_leader(struct kvcm_client *c, uint32_t timeout_ms, struct kvcm_result *r);
/* The current leader's base URL ("" before a discovery). */
const char *kvcm_leader(const struct kvcm_client *c);

/* registerInstance. model_deployment and location specs as docs/PROTOCOLS.md §2;
 * spec sizes are bytes of one block across the ranks it describes. */
struct kvcm_instance {
    const char *instance_group, *instance_id;
    uint32_t    block_size;           /* tokens per block */
    const char *model_name, *dtype, *extra;
    uint32_t    tp_size;
    const char *const *spec_names;    /* location_spec_infos[i].name, also the "default" group */
    const uint64_t    *spec_sizes;
    size_t      n_specs;
};

/* Every RPC: discovers the leader first when none is known; on
 * SERVER_NOT_LEADER rediscovers once and retries once. timeout_ms 0: the
 * config's request_timeout_ms. Returns r->status. */
int  kvcm_register_instance(struct kvcm_client *c, const struct kvcm_instance *inst,
                            uint32_t timeout_ms, struct kvcm_result *r);
/* reportEvent with `events` (a JSON array of EventItem objects, borrowed). */
int  kvcm_report_events(struct kvcm_client *c, const char *instance_id, const char *host_ip_port,
                        const char *storage_type, json_t *events, uint32_t timeout_ms,
                        struct kvcm_result *r);

/* getHostCacheState (QT_PREFIX_MATCH): up to max hosts with their matched
 * counts, in the server's order. */
struct kvcm_host_match {
    char     host_ip_port[128];
    uint64_t matched;                 /* "local" */
};
int  kvcm_host_cache_state(struct kvcm_client *c, const char *instance_id, const int64_t *keys,
                           size_t n, uint32_t timeout_ms, struct kvcm_host_match *hosts,
                           size_t max, size_t *nhosts, struct kvcm_result *r);

/* EventItem builders (new references; NULL when out of memory). Keys go out
 * as decimal strings. */
json_t *kvcm_event_node_register(const char *const *mediums, size_t n);
json_t *kvcm_event_block_add(int64_t key, const char *medium, const char *spec_name,
                             const char *uri);
json_t *kvcm_event_block_delete(int64_t key, const char *medium, const char *spec_name);
json_t *kvcm_event_heartbeat(json_t *system_status);   /* steals system_status (string->string) */
json_t *kvcm_event_host_down(void);
/* A snapshot: blocks is an array of {block_key, medium, specs:[{name, uri}]} (stolen). */
json_t *kvcm_event_snapshot(json_t *blocks);
json_t *kvcm_snapshot_block(int64_t key, const char *medium, const char *spec_name,
                            const char *uri);

#endif
