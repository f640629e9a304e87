/* stats: one typed snapshot of every module's counters (each module fills
 * its own part: cache_get_stats, server_get_stats, ops_get_stats,
 * admin_get_stats, kvcm_get_stats, kvcm_querier_get_stats, gpu_get_stats),
 * and the STATS document built from it (the STATS op and /stats). The
 * /metrics page (metrics.c) and the systemd STATUS line (sdnotify.c) read the
 * same structs; nothing reads numbers back out of the JSON.
 *
 * A snapshot's strings belong to the modules: use it before the loop runs
 * again. Collecting walks no index; the document walks the namespaces.
 *
 * Loop thread only. */
#ifndef KVNODE_STATS_H
#define KVNODE_STATS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "net/admin.h"
#include "net/kvs_server.h"
#include "cache/cache.h"
#include "gpu/gpu.h"
#include "kvcm/kvcm.h"
#include "kvcm/query.h"
#include "net/ops.h"
#include "net/server.h"
#include "tenants/tenants.h"

struct daemon;
struct tenant;

/* What a reader may see. On a node with [tenant.NAME] sections namespaces
 * (their layouts, models, deployment ids) are shown only to root and the
 * daemon's user in full, to another client only its own tenant's (and of
 * "tenants" and the memory, key, lease and store figures only its own
 * tenant's; the connection, frame and request counters stay the node's), and on
 * the admin pages not at all (tenants by name and counts); the error texts
 * that may name a deployment (persist.last_error, kvcm.last_error,
 * kvcm.query.last_error) only to root and the daemon's user (the others
 * read a note that they are hidden). Without sections everybody sees
 * everything, as before tenants. */
struct stats_view {
    bool layouts;                    /* namespaces and KVCM deployments may be shown */
    const struct tenant *only;       /* only this tenant's namespaces (NULL: every tenant's) */
};

/* One tenant's line of "tenants". */
struct stats_tenant {
    const char *name;
    uint32_t clients;
    uint64_t refused;                /* connections refused at its max_clients */
    uint32_t max_clients;            /* its limit in force */
    uint64_t output_buffered;        /* its connections' unread replies */
    uint64_t host_capacity, host_used, hbm_capacity, hbm_used;   /* hbm: all devices */
    uint64_t namespaces, namespaces_active;
    uint64_t blocks;                 /* in memory (host and HBM) */
    uint64_t store_blocks;           /* only in its store */
    uint64_t evictions;              /* host blocks evicted (to the store, dropped, quota) */
    uint64_t keys_matched, keys_missed;   /* its match and get lookups: its hit rate */
    uint64_t check_mismatches;            /* its lookups that met another check word */
};

/* A cache whose namespaces the document lists. */
struct stats_ns_source {
    struct cache *cache;
    const char *tenant;              /* NULL: not named in the document (no sections) */
    size_t n;                        /* cache_namespace_stats(0 .. n - 1) */
};

struct stats_snapshot {
    struct ops_stats ops;            /* head of the document, "requests" */
    struct cache_stats cache_stats;  /* node totals: the sum over the tenants' caches */
    struct stats_ns_source ns[TENANTS_MAX];   /* "namespaces", in this order */
    size_t nns;
    bool show_deployments;           /* "kvcm"."deployments" (they name models) */
    bool has_tenants;                /* [tenant.NAME] sections: "tenants" below */
    struct stats_tenant tenants[TENANTS_MAX];
    size_t ntenants;
    bool has_server;
    struct server_stats server;      /* "clients", "frames" */
    const char *admin_address;       /* "admin"; NULL: [admin] listen = off */
    struct admin_stats admin;        /* "admin_connections", when admin_address */
    bool has_kvs;                    /* "kvs_server" (null when [kvs_server] enabled = off) */
    struct kvs_server_stats kvs;
    uint64_t reloads_ok, reloads_failed;
    uint32_t worker_stall_timeout_ms; /* kvnode_worker_up: a worker silent longer is down */
    const char *last_reload_error;   /* "" after a successful reload */
    struct kvcm_stats kvcm;
    bool has_query;
    struct kvcm_query_stats query;   /* "kvcm"."query" */
    bool has_gpu;
    struct gpu_stats gpu;
};

/* Fill s from d's modules, for a reader who may see what view says. */
void stats_collect(struct daemon *d, const struct stats_view *view, struct stats_snapshot *s);
/* What the admin pages (/stats, /metrics) may show. */
struct stats_view stats_admin_view(const struct daemon *d);
/* What the client of a connection may see (the STATS op): everything for
 * root and the daemon's user, else its own tenant's namespaces. */
struct stats_view stats_client_view(const struct daemon *d, const struct tenant *t, uid_t uid);
/* The STATS document of a snapshot: a new reference, or NULL when out of memory. */
json_t *stats_json(const struct stats_snapshot *s);
/* stats_collect + stats_json for view. */
json_t *stats_document_for(struct daemon *d, const struct stats_view *view);
/* The admin page /stats: stats_document_for(d, stats_admin_view(d)). */
json_t *stats_document(struct daemon *d);
/* The cache's part of the document alone ("tiers", "demotions",
 * "namespaces", "namespaces_active", "namespaces_reclaimed_total",
 * "leases", "evictions", "persist"), added to root. */
void stats_cache_json(struct cache *c, json_t *root);

#endif
