/* cache_hbm_setup: the cache and the GPU side started as kvnoded starts them
 * (gpu_start), and HBM puts, for the unit tests of demotion on the sim
 * backend (test_cache_hbm) and on the fake CUDA (test_cache_hbm_cuda). */
#ifndef KVNODE_TEST_CACHE_HBM_SETUP_H
#define KVNODE_TEST_CACHE_HBM_SETUP_H

#include <check.h>
#include <stdint.h>
#include <unistd.h>

#include <event2/event.h>

#include "devmem_spy.h"
#include "cache/cache.h"
#include "cache_calls.h"
#include "config/config.h"
#include "gpu/gpu.h"
#include "kvnode.h"

/* cfg's defaults, with the limits the HBM tests share: blocks of
 * block_bytes in slabs of slab_bytes, no reservation limit, host eviction
 * only when full, hbm_bytes per device demoted from 75 % down to 50 % in
 * batches of 8 blocks, no store. The caller sets host memory, pinning and
 * the HBM backend. */
static inline void cache_hbm_config(struct kvn_config *cfg, uint64_t block_bytes, uint64_t slab_bytes,
                                    uint64_t hbm_bytes)
{
    config_defaults(cfg);
    cfg->max_reserved_per_client = 1.0;
    cfg->slab_bytes = slab_bytes;
    cfg->high_watermark = 1.0;
    cfg->low_watermark = 0.9;
    cfg->hbm_bytes = hbm_bytes;
    cfg->hbm_high_watermark = 0.75;
    cfg->hbm_low_watermark = 0.5;
    cfg->hbm_copy_batch_bytes = 8 * block_bytes;
    cfg->persist_backend = CONFIG_BACKEND_OFF;
}

/* The devmem spy reset, a new event base, the cache and the GPU side of cfg
 * (hbm_bytes per device) on it, namespace l bound: into *base, *cache,
 * *gpu, *ns. */
static inline void cache_hbm_start(const struct kvn_config *cfg, uint64_t hbm_bytes, const struct ns_layout *l,
                                   struct event_base **base, struct cache **cache, struct gpu **gpu,
                                   struct kv_namespace **ns)
{
    char err[512];

    spy_reset();
    *base = event_base_new();
    ck_assert_ptr_nonnull(*base);
    ck_assert_int_eq(cache_create(*base, cfg, cache, err, sizeof err), 0);
    const struct gpu_cache gc = { .cache = *cache, .ops = &cache_gpu_ops, .hbm_bytes = hbm_bytes, .name = NULL };
    ck_assert_msg(gpu_start(*base, cfg, &gc, 1, gpu, err, sizeof err) == 0, "gpu_start: %s", err);
    ck_assert_int_eq(cache_bind(*cache, l, ns, err, sizeof err), 0);
}

/* Put keys [first, first+n) (n <= 128) asking for HBM, for `who`: each
 * block written with fill(its location, its key) when fill is given (every
 * key must then get a block), left unwritten otherwise. How many landed in
 * HBM (arena != 0). */
static inline size_t cache_hbm_put(struct cache *cache, struct kv_namespace *ns, struct lease_list *who,
                                   int64_t first, size_t n,
                                   void (*fill)(const struct cache_loc *loc, int64_t key))
{
    int64_t keys[128] = { 0 };   /* (gcc cannot see n <= 128 once inlined) */
    struct cache_loc locs[128];
    uint64_t lid;
    uint32_t blocks;
    char err[512];
    size_t in_hbm = 0;

    ck_assert_uint_le(n, 128);
    for (size_t i = 0; i < n; i++)
        keys[i] = first + (int64_t)i;
    ck_assert_msg(cache_put_begin(cache, PUT_REQ(ns, who, keys, n, KVNODE_TIER_HBM), &lid, locs, err,
                                  sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < n; i++) {
        if (fill) {
            ck_assert(locs[i].present);
            fill(&locs[i], keys[i]);
        }
        in_hbm += locs[i].present && locs[i].arena != 0;
    }
    ck_assert_int_eq(cache_lease_end(cache, who, lid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    return in_hbm;
}

/* After device `device` went down: none of cache's HBM arenas on it is
 * still lent (how many arenas the cache has), and while base runs its loop
 * for 50 ms no more copies reach the device (the spy still counts copies). */
static inline size_t cache_hbm_expect_device_gone(struct cache *cache, struct event_base *base, int device,
                                                  uint64_t copies)
{
    struct cache_arena_info arenas[8];
    size_t n = cache_arenas(cache, arenas, 8);

    for (size_t i = 0; i < n; i++)
        ck_assert_msg(!(arenas[i].tier == KVNODE_TIER_HBM && arenas[i].device == device),
                      "device %d is still lent (arena %u)", device, arenas[i].id);
    for (int i = 0; i < 50; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(1000);
    }
    ck_assert_uint_eq(spy_copy_count(device), copies);
    return n;
}

#endif
