/* gpu_ops: the cache as the GPU side drives it (cache_gpu_ops, cache.h).
 * gpu/ sits below cache/: it gets these through struct gpu_cache instead of
 * calling into cache.h. Main (loop) thread, as gpu_start/gpu_stop. */
#include "cache/cache.h"

#include "gpu/gpu.h"
#include "mem/arena.h"

static int gpu_ops_add_hbm(void *cache, struct devmem *dm, const struct devmem_region *r, uint64_t slab_bytes,
                           char *why, size_t whylen)
{
    return cache_add_hbm(cache, dm, r, slab_bytes, why, whylen);
}

static void gpu_ops_set_copier(void *cache, struct copier *cp)
{
    cache_set_copier(cache, cp);
}

static void gpu_ops_set_hostpin(void *cache, struct hostpin *hp)
{
    cache_set_hostpin(cache, hp);
}

static void gpu_ops_host_arena(void *cache, void **base, uint64_t *size, uint64_t *slab_bytes)
{
    struct arena_stats host;
    cache_host_stats(cache, &host);
    *base = cache_host_base(cache);
    *size = cache_host_size(cache);
    *slab_bytes = host.slab_bytes;
}

const struct gpu_cache_ops cache_gpu_ops = {
    .add_hbm = gpu_ops_add_hbm,
    .set_copier = gpu_ops_set_copier,
    .set_hostpin = gpu_ops_set_hostpin,
    .host_arena = gpu_ops_host_arena,
};
