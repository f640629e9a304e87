/* ops: request handlers — the only place that turns protocol messages into
 * cache calls and cache results into replies. Owns per-connection sessions
 * (tenant, namespace binding, leases, peer identity) and per-op request
 * counters. A session's tenant is decided at accept (ops_server_handler's
 * admit: tenants_for_peer, the tenant's max_clients) and every request of
 * it goes to that tenant's cache.
 *
 * Loop thread only. */
#ifndef KVNODE_OPS_H
#define KVNODE_OPS_H

#include <stdbool.h>
#include <sys/types.h>

#include <jansson.h>

#include "cache/cache.h"
#include "config/config.h"
#include "core/counters.h"
#include "kvnode.pb-c.h"
#include "mem/lease.h"
#include "net/server.h"
#include "net/session.h"

struct conn;
struct server;
struct ops;
struct ops_pending;
struct tenants;

int  ops_create(struct tenants *tenants, const struct kvn_config *cfg, struct ops **out);
void ops_destroy(struct ops *o);
void ops_set_server(struct ops *o, struct server *s);
/* Who performs RELOAD: returns 0 when the new configuration was applied
 * (not_applied lists changed restart-only options), -1 with error set. */
typedef int (*ops_reload_fn)(void *arg, char *error, size_t errlen, char *not_applied,
                             size_t nalen);
void ops_set_reload(struct ops *o, ops_reload_fn fn, void *arg);
/* Who builds the STATS document (stats_document; main wires it, so that ops,
 * whose counters it includes, does not include it) for the client of
 * session `viewer` (what it may see depends on who it is): a new reference,
 * or NULL when out of memory. Until set, STATS fails with ENOMEM. */
typedef json_t *(*ops_stats_fn)(void *arg, const struct session *viewer);
void ops_set_stats_hook(struct ops *o, ops_stats_fn fn, void *arg);
/* The counters ops owns: the document's head and "requests", and the
 * requests by status with latency (for /metrics). */
struct ops_stats {
    double uptime_s;
    const char *socket_path;                    /* the effective config's */
    struct { uint64_t ok, error; } requests[METRICS_OP_SLOTS];  /* by op (oneof field number) */
    const struct metrics_requests *by_status;   /* by op and status, with latency; lives with o */
    uint64_t hbm_unusable_clients;              /* HELLOs with hbm_unusable (reconnected host-only) */
    const char *hbm_unusable_last;              /* "pid N (name): reason" of the latest ("" none); lives with o */
};
void ops_get_stats(const struct ops *o, struct ops_stats *out);
void ops_apply_config(struct ops *o, const struct kvn_config *cfg);
struct kvcm_querier;
/* Who answers MATCH_REMOTE's peer part (NULL: [kvcm] off, local answer only). */
void ops_set_querier(struct ops *o, struct kvcm_querier *q);

/* Whether HELLO lends HBM arena a to a client on CUDA device `device`
 * (its own numbering) whose GPU has PCI bus id `bus_id`: with a bus id, only
 * the arena of that GPU (compared as numbers, core/busid.h, so spellings of
 * CUDA, nvidia-smi and sysfs agree; a name that is not a PCI bus id, such
 * as the sim backend's "sim:N", only as written), never an ordinal guess;
 * without one ("" or NULL), the arena of the daemon's device `device`.
 * Never for a client without a device or for host arenas. */
bool ops_arena_is_clients_gpu(const struct cache_arena_info *a, int device, const char *bus_id);

/* Handle one decoded request; the reply goes out through server_reply. */
void ops_handle(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
/* The connection is gone: end its leases, unbind its namespace. */
void ops_session_end(struct ops *o, struct session *s);
/* The tenant of a new connection (tenants_for_peer of its uid, gid and its
 * ngroups supplementary groups, sorted) into s->tenant, or -KVNODE_ELIMIT
 * with msg set when that tenant has max_clients connections. */
int  ops_admit(struct ops *o, struct session *s, const gid_t *groups, size_t ngroups, char *msg, size_t msglen);
/* ops_admit, ops_handle and ops_session_end as the server's handler (server_create). */
struct server_handler ops_server_handler(struct ops *o);

#endif
