/* gpu: the daemon's GPU side, wired from [hbm] and [memory] pin_host. Opens
 * the devmem backend, gives each cache it is handed (one per tenant) its own
 * HBM region on every configured device (a region short of memory retried
 * for hbm.alloc_retry), starts pinning in the background the host arena of
 * each cache that got HBM (only the daemon's own copies use pinned memory:
 * without HBM nothing is pinned and no GPU context taken) and runs the copy
 * workers that demote HBM blocks (shared: a batch carries its own memory and
 * completion). Decides what "required" means: when HBM is asked for
 * (hbm.bytes > 0) and cannot be had, start fails under required = on and
 * otherwise one log line says HBM is off and why.
 *
 * Main (loop) thread, at start and stop. */
#ifndef KVNODE_GPU_H
#define KVNODE_GPU_H

#include <stddef.h>


#include "config/config.h"

struct event_base;
struct gpu;
struct devmem;
struct devmem_region;
struct copier;
struct hostpin;

/* What the GPU side does to a cache it serves. The cache sits above gpu/
 * (it uses devmem, copier and hostpin), so whoever wires the two (tenants)
 * hands these in and gpu never includes cache/. */
struct gpu_cache_ops {
    /* A region as one more HBM arena of the cache: 0, or < 0 with why set. */
    int  (*add_hbm)(void *cache, struct devmem *dm, const struct devmem_region *r, uint64_t slab_bytes,
                    char *why, size_t whylen);
    void (*set_copier)(void *cache, struct copier *cp);      /* NULL: none any more */
    void (*set_hostpin)(void *cache, struct hostpin *hp);    /* NULL: not pinned any more */
    /* The host arena: its memory and slab size (pin chunks fall on slab boundaries). */
    void (*host_arena)(void *cache, void **base, uint64_t *size, uint64_t *slab_bytes);
};

/* A cache the GPU side serves, through ops: its HBM bytes per device (0:
 * none) and a name for log lines (NULL: the single-tenant node's cache,
 * logged as before tenants). */
#define GPU_MAX_CACHES 17
struct gpu_cache {
    void *cache;
    const struct gpu_cache_ops *ops;
    uint64_t hbm_bytes;
    const char *name;
};

/* For n (<= GPU_MAX_CACHES) caches. 0, or -1 with err set (the start must
 * fail). *out is set either way (gpu_stop/gpu_destroy accept it). */
int  gpu_start(struct event_base *base, const struct kvn_config *cfg, const struct gpu_cache *caches,
               size_t n, struct gpu **out, char *err, size_t errlen);
/* Before cache_destroy: finish or cancel demotions, stop pinning (the host
 * arenas are unregistered), and detach them from the caches. NULL is ignored. */
void gpu_stop(struct gpu *g);
/* After cache_destroy: free the HBM regions and close the backend. */
void gpu_destroy(struct gpu *g);
/* "gpu" of the stats document. Strings belong to g (valid while it lives). */
struct gpu_stats {
    const char *backend;         /* devmem backend: "cuda", "sim", ... */
    int devices_visible;
    unsigned hbm_arenas;
    const char *hbm_off_reason;  /* why there is no HBM tier; NULL when there is one */
};
void gpu_get_stats(const struct gpu *g, struct gpu_stats *out);

#endif
