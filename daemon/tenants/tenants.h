/* tenants: who owns which memory (issue 15). A tenant is a named set of peer
 * credentials ([tenant.NAME] uids / gids) whose engines trust each other;
 * each tenant has its own cache (its own host arena and memfd, HBM regions,
 * index, namespaces, LRU, eviction, quotas and reaper) and its own persister,
 * so nothing of one tenant's is in another's address space or reach. A
 * client listed in no section belongs to "default", which gets what the
 * sections leave of memory.host_bytes and hbm.bytes and the [server] /
 * [leases] limits. No section at all: one tenant, "default", with everything
 * (a single-tenant node, exactly as before tenants existed).
 *
 * Owns the tenants (name, limits, cache, persister, connection count),
 * creates and destroys them in order, maps a peer to its tenant at accept
 * (tenants_for_peer), and gives the rest of the daemon iteration over them
 * for stats, metrics, KVCM, reload and shutdown.
 *
 * Main (loop) thread only. */
#ifndef KVNODE_TENANTS_H
#define KVNODE_TENANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"

struct event_base;
struct cache;
struct persist;
struct gpu;

#define TENANTS_MAX (CONFIG_TENANTS_MAX + 1)   /* the sections and "default" */

struct tenant {
    char     name[CONFIG_TENANT_NAME_MAX];
    bool     named;                  /* a [tenant.NAME] section; false: "default" */
    uint64_t host_bytes;             /* its host tier (0: none, its clients are refused) */
    uint64_t hbm_bytes;              /* its HBM per device */
    /* limits in force (reloadable); "default" takes [server] / [leases] */
    uint32_t max_clients;            /* connections of the tenant at once: a section's own, else its
                                        memory's share of server.max_clients; "default" what the
                                        sections leave (config_tenant_default_clients) */
    uint32_t max_namespaces;
    double   max_reserved_per_client;
    uint64_t max_output_bytes;       /* its unread replies, all its connections together: its memory's
                                        share of server.max_buffered_output_bytes ("default" what the
                                        sections leave) */
    struct cache   *cache;           /* NULL when host_bytes is 0 */
    struct persist *persist;         /* NULL: [persist] backend = off, or no cache */
    uint32_t clients;                /* connections now */
    uint64_t refused;                /* connections refused at max_clients */
    uint64_t output_bytes;           /* unread replies of its connections now (the server keeps it) */
};

struct tenants;

/* Warm restart (warm.c reads the hand-over): per tenant name, the host
 * memfd and the blocks a previous daemon handed over. */
struct cache_ho;
struct tenants_warm {
    size_t n;
    struct tenants_warm_one {
        char name[CONFIG_TENANT_NAME_MAX];   /* "default" or a section's name */
        uint64_t host_bytes;                 /* its host tier then */
        int fd;                              /* its host memfd (tenants_create takes it) */
        const struct cache_ho *ho;
    } t[TENANTS_MAX];
    /* What tenants_create made of it: */
    bool adopted;                            /* the blocks were adopted */
    uint64_t dropped_blocks;                 /* blocks of tenants that are gone (or have no memory) */
    char why[512];                           /* why nothing was adopted ("" when adopted) */
};
/* The tenants of cfg, each with its cache (no store yet). warm (NULL: a
 * cold start): each tenant listed there gets a cache over its handed-over
 * memfd with its blocks adopted; a tenant no longer configured has its
 * blocks dropped; anything else that does not fit (memory.* geometry, a
 * block) starts every tenant cold, with warm->why set. Every fd in warm is
 * taken. 0, or -1 with err naming the tenant and the problem. */
int  tenants_create(struct event_base *base, const struct kvn_config *cfg, struct tenants_warm *warm,
                    struct tenants **out, char *err, size_t errlen);
/* GPU: HBM per tenant and device, host pinning of every tenant's arena, the
 * copy workers (gpu_start). *out as gpu_start sets it. 0, or -1 with err. */
int  tenants_start_gpu(struct tenants *ts, struct event_base *base, const struct kvn_config *cfg,
                       struct gpu **out, char *err, size_t errlen);
/* One persister per tenant with memory (file: "default" at persist.path, a
 * named tenant at <persist.path>/tenants/<NAME>). 0, or -1 with err. */
int  tenants_start_persist(struct tenants *ts, struct event_base *base, const struct kvn_config *cfg,
                           char *err, size_t errlen);
/* Recovery: scan each tenant's store (when it can be listed) into its own
 * cache, while the daemon serves. */
void tenants_start_recovery(struct tenants *ts);
/* Shutdown, once no client is left: every tenant's committed blocks that
 * the store lacks are written (cache_persist_flush), all within timeout_ms
 * together, each tenant getting its share of what is left; then the
 * persisters stop and what could not be written is counted and logged per
 * tenant (cache_persist_unwritten). Then the persisters end. */
void tenants_stop_persist(struct tenants *ts, unsigned timeout_ms);
/* Free the caches (after gpu_stop). NULL ok. */
void tenants_destroy(struct tenants *ts);
/* Reload: limits, watermarks, TTLs and the uid/gid lists (new connections)
 * from cfg, which the caller keeps as the effective config. A section that
 * was not there at start is not served until a restart. */
void tenants_apply_config(struct tenants *ts, const struct kvn_config *cfg);

/* The tenant of a peer: a tenant listing uid wins; else the first section
 * (file order) listing its primary group gid or one of its ngroups
 * supplementary groups (sorted ascending: the groups admission checked);
 * else "default". Never NULL. */
struct tenant *tenants_for_peer(struct tenants *ts, uid_t uid, gid_t gid, const gid_t *groups, size_t ngroups);
/* Whether cfg had [tenant.NAME] sections (a multi-tenant node). */
bool tenants_configured(const struct tenants *ts);
/* Iteration: 0 is "default", then the sections in file order. */
size_t tenants_count(const struct tenants *ts);
struct tenant *tenants_at(const struct tenants *ts, size_t i);
struct tenant *tenants_default(const struct tenants *ts);
/* t's share of a node-wide limit of `pool` (connections, leases): a named
 * tenant's is in proportion to its host memory (at least 1; 0 without
 * memory), "default" takes what the sections' shares leave, so the shares
 * add up to the pool and one tenant at its share never refuses another.
 * cfg: the configuration in force (its memory.host_bytes). */
uint32_t tenants_share_of(const struct tenants *ts, const struct kvn_config *cfg, const struct tenant *t,
                          uint32_t pool);
/* Node totals of every tenant's cache (cache_stats_add); false when no
 * tenant has memory (*out zeroed). */
struct cache_stats;
bool tenants_cache_totals(const struct tenants *ts, struct cache_stats *out);
/* The caches there are, in tenants_at order (tenants without memory left
 * out); returns how many (at most max). */
size_t tenants_caches(const struct tenants *ts, struct cache **out, size_t max);

#endif
