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

#include <jansson.h>

#include "net/admin.h"
#include "cache/cache.h"
#include "gpu/gpu.h"
#include "kvcm/kvcm.h"
#include "kvcm/query.h"
#include "net/ops.h"
#include "net/server.h"

struct daemon;

struct stats_snapshot {
    struct ops_stats ops;            /* head of the document, "requests" */
    struct cache *cache;             /* where cache_namespace_stats reads "namespaces" */
    struct cache_stats cache_stats;
    bool has_server;
    struct server_stats server;      /* "clients", "frames" */
    const char *admin_address;       /* "admin"; NULL: [admin] listen = off */
    struct admin_stats admin;        /* "admin_connections", when admin_address */
    uint64_t reloads_ok, reloads_failed;
    uint32_t worker_stall_timeout_ms; /* kvnode_worker_up: a worker silent longer is down */
    const char *last_reload_error;   /* "" after a successful reload */
    struct kvcm_stats kvcm;
    bool has_query;
    struct kvcm_query_stats query;   /* "kvcm"."query" */
    bool has_gpu;
    struct gpu_stats gpu;
};

/* Fill s from d's modules. */
void stats_collect(struct daemon *d, struct stats_snapshot *s);
/* The STATS document of a snapshot: a new reference, or NULL when out of memory. */
json_t *stats_json(const struct stats_snapshot *s);
/* stats_collect + stats_json: what the STATS op and /stats serve. */
json_t *stats_document(struct daemon *d);
/* The cache's part of the document alone ("tiers", "demotions",
 * "namespaces", "namespaces_active", "namespaces_reclaimed_total",
 * "leases", "evictions", "persist"), added to root. */
void stats_cache_json(struct cache *c, json_t *root);

#endif
