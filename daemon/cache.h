/* cache: what the cache means, on the loop thread. Owns the host arena, the
 * index, the namespace registry and the lease table, and implements match,
 * get/put leases, delete, eviction (watermarks, LRU) and the reaper. It
 * knows nothing of the wire: ops.c translates messages into these calls.
 *
 * Lease owners are `struct lease_list`s embedded in connections: a lease can
 * only be ended through the list that owns it, and cache_release_owner()
 * ends them all when the connection goes.
 *
 * Loop thread only. */
#ifndef KVNODE_CACHE_H
#define KVNODE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "config.h"
#include "lease.h"
#include "namespace.h"

struct event_base;
struct cache;

/* A block's place as the wire describes it. */
struct cache_loc {
    uint32_t arena;
    uint64_t offset;
    bool     present;   /* put_begin: false = already stored, nothing reserved */
};

/* An arena as clients see it (HELLO). */
struct cache_arena_info {
    uint32_t id;
    int      tier;      /* KVNODE_TIER_* */
    int      device;
    uint64_t size;
    int      fd;
};

int  cache_create(struct event_base *base, const struct kvn_config *cfg, struct cache **out,
                  char *err, size_t errlen);
void cache_destroy(struct cache *c);
/* Apply the reloadable subset (watermarks, TTLs, reaper interval, limits,
 * namespace quota: a lowered quota applies at each namespace's next put). */
void cache_apply_config(struct cache *c, const struct kvn_config *cfg);

/* Namespaces. bind checks the block size fits the allocator. */
int  cache_bind(struct cache *c, const struct ns_layout *layout, kv_namespace **ns,
                char *err, size_t errlen);
void cache_unbind(struct cache *c, kv_namespace *ns);
size_t cache_arenas(const struct cache *c, struct cache_arena_info *out, size_t max);
void *cache_arena_base(const struct cache *c, uint32_t arena);

/* Operations. All return 0 or a negative KVNODE_E* code with err set. */
size_t cache_match(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n);
int  cache_get_begin(struct cache *c, kv_namespace *ns, struct lease_list *owner,
                     const int64_t *keys, size_t n, uint64_t *lease_id,
                     struct cache_loc *locs, size_t *got, char *err, size_t errlen);
int  cache_put_begin(struct cache *c, kv_namespace *ns, struct lease_list *owner,
                     const int64_t *keys, size_t n, int tier, uint64_t *lease_id,
                     struct cache_loc *locs, char *err, size_t errlen);
/* End a lease of the given kind: LEASE_READ (get_end), LEASE_WRITE with
 * commit=true (seal) or false (abort). *blocks = entries released. */
int  cache_lease_end(struct cache *c, struct lease_list *owner, uint64_t lease_id, int kind,
                     bool commit, uint32_t *blocks, char *err, size_t errlen);
int  cache_delete(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n,
                  uint32_t *deleted);
/* End every lease of a closing connection at once. */
void cache_release_owner(struct cache *c, struct lease_list *owner);

struct metrics_keys;
/* Keys looked up by match and get (those that returned a result): matched,
 * and missed by reason (see metrics.h). */
void cache_key_metrics(const struct cache *c, struct metrics_keys *out);

/* Add "tiers", "namespaces", "leases", "evictions" to a stats document. */
void cache_stats_json(struct cache *c, json_t *root);

#endif
