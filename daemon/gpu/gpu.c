/* gpu: see gpu.h. */
#include "gpu/gpu.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "gpu/copier.h"
#include "gpu/devmem.h"
#include "core/errmsg.h"
#include "gpu/hostpin.h"
#include "core/log.h"

/* Demotion batches queued for the copy worker, at most. */
#define GPU_COPY_QUEUE 64u

struct gpu {
    struct devmem *dm;
    struct gpu_cache caches[GPU_MAX_CACHES];
    size_t ncaches;
    struct devmem_region *regions;      /* GPU_MAX_CACHES * DEVMEM_MAX_DEVICES */
    unsigned nregions;
    struct copier *copier;
    struct hostpin *hostpins[GPU_MAX_CACHES];   /* by cache; NULL: not pinned */
    char why_off[256];          /* why there is no HBM tier ("" when there is one) */
};

/* "tenant X: " before a log line about a named cache, nothing otherwise. */
static const char *gpu_who(const struct gpu_cache *gc, char *buf, size_t len)
{
    return log_tenant_prefix(gc->name, buf, len);
}

/* The backend [hbm] backend names; falls back to none (why set) when an
 * explicitly named cuda cannot start. */
static int gpu_open_backend(const struct kvn_config *cfg, struct gpu *g, char *why, size_t whylen)
{
    char ignored[64];
    switch (cfg->hbm_backend) {
    case CONFIG_HBM_SIM:
        return devmem_open(DEVMEM_SIM, &g->dm, why, whylen);
    case CONFIG_HBM_NONE:
        snprintf(why, whylen, "hbm.backend = none");
        return devmem_open(DEVMEM_NONE, &g->dm, ignored, sizeof ignored);
    case CONFIG_HBM_CUDA:
        if (devmem_open(DEVMEM_CUDA, &g->dm, why, whylen) == 0)
            return 0;
        return devmem_open(DEVMEM_NONE, &g->dm, ignored, sizeof ignored);
    default:
        return devmem_open_auto(&g->dm, why, whylen);
    }
}

/* HBM arenas on the configured devices, for each cache that asks for some.
 * 0, or -1 (err set) when the start must fail; without required, what
 * could not be had is logged. */
static int gpu_start_hbm(const struct kvn_config *cfg, struct gpu *g, const char *backend_why,
                         char *err, size_t errlen)
{
    int devs[CONFIG_HBM_DEVICES_MAX];
    size_t ndevs = 0;
    char why[512], who[CONFIG_TENANT_NAME_MAX + 16];
    int count = devmem_device_count(g->dm);
    bool wanted = false;

    for (size_t t = 0; t < g->ncaches; t++)
        wanted |= g->caches[t].hbm_bytes > 0;
    if (!wanted) {
        snprintf(g->why_off, sizeof g->why_off, "hbm.bytes = 0");
        log_info("HBM tier off: hbm.bytes = 0 (GPU memory stays the engines')");
        return 0;
    }
    if (count <= 0) {
        snprintf(g->why_off, sizeof g->why_off, "%s", backend_why[0] ? backend_why : "no GPU");
        goto unavailable;
    }
    /* hbm.devices as parsed with the config; none listed: every visible one. */
    ndevs = cfg->hbm_device_list.n;
    memcpy(devs, cfg->hbm_device_list.dev, ndevs * sizeof devs[0]);
    if (ndevs == 0)
        for (int d = 0; d < count && d < DEVMEM_MAX_DEVICES; d++)
            devs[ndevs++] = d;
    for (size_t t = 0; t < g->ncaches; t++) {
        const struct gpu_cache *gc = &g->caches[t];
        if (gc->hbm_bytes == 0)
            continue;
        gpu_who(gc, who, sizeof who);
        for (size_t i = 0; i < ndevs && i < DEVMEM_MAX_DEVICES; i++) {
            struct devmem_region *r = &g->regions[g->nregions];
            if (devs[i] >= count) {
                snprintf(why, sizeof why, "GPU %d is not visible (%d visible to the %s backend)",
                         devs[i], count, devmem_kind_name(devmem_kind(g->dm)));
            } else if (devmem_region_alloc(g->dm, devs[i], gc->hbm_bytes, r, why, sizeof why) == 0) {
                g->nregions++;
                if (cache_add_hbm(gc->cache, g->dm, r, cfg->slab_bytes, why, sizeof why) == 0) {
                    log_info("%sHBM tier: GPU %d, %" PRIu64 " MiB (%s backend, lent through %s)",
                             who, devs[i], r->size >> 20, devmem_kind_name(devmem_kind(g->dm)),
                             r->ipc_len ? "CUDA IPC" : "a mapped memfd");
                    continue;
                }
            }
            if (cfg->hbm_required) {
                errmsg_set(err, errlen, "hbm.required = on but the %sHBM tier on GPU %d is unavailable: %s",
                           who, devs[i], why);
                return -1;
            }
            log_warn("%sHBM tier: GPU %d left out: %s", who, devs[i], why);
        }
    }
    if (g->nregions > 0)
        return 0;
    snprintf(g->why_off, sizeof g->why_off, "no configured GPU could be used");
unavailable:
    if (cfg->hbm_required) {
        errmsg_set(err, errlen, "hbm.required = on but HBM is unavailable: %s", g->why_off);
        return -1;
    }
    log_info("HBM tier off: %s", g->why_off);
    return 0;
}

static int gpu_start_pinning(const struct kvn_config *cfg, struct gpu *g, const char *backend_why,
                             char *err, size_t errlen)
{
    char why[256], who[CONFIG_TENANT_NAME_MAX + 16];

    if (cfg->pin_host == CONFIG_PIN_OFF)
        return 0;
    if (!devmem_can_pin(g->dm)) {
        if (cfg->pin_host == CONFIG_PIN_ON) {
            errmsg_set(err, errlen, "memory.pin_host = on but the host arena cannot be pinned: %s",
                       backend_why[0] ? backend_why : "no GPU backend");
            return -1;
        }
        log_info("host arena not pinned: %s", backend_why[0] ? backend_why : "no GPU backend");
        return 0;
    }
    for (size_t t = 0; t < g->ncaches; t++) {
        const struct gpu_cache *gc = &g->caches[t];
        struct arena_stats host;
        gpu_who(gc, who, sizeof who);
        /* Chunks on slab boundaries: no block is in two registrations. */
        cache_host_stats(gc->cache, &host);
        if (hostpin_start(g->dm, cache_host_base(gc->cache), cache_host_size(gc->cache),
                          cfg->pin_chunk_bytes, host.slab_bytes, cfg->pin_host == CONFIG_PIN_ON,
                          &g->hostpins[t], why, sizeof why) < 0) {
            g->hostpins[t] = NULL;
            if (cfg->pin_host == CONFIG_PIN_ON) {
                errmsg_set(err, errlen, "memory.pin_host = on but the %shost arena cannot be pinned: %s",
                           who, why);
                return -1;
            }
            log_info("%shost arena not pinned: %s", who, why);
            continue;
        }
        cache_set_hostpin(gc->cache, g->hostpins[t]);
    }
    return 0;
}

int gpu_start(struct event_base *base, const struct kvn_config *cfg, const struct gpu_cache *caches,
              size_t n, struct gpu **out, char *err, size_t errlen)
{
    struct gpu *g = calloc(1, sizeof *g);
    char backend_why[256] = "";

    *out = g;
    if (!g || n > GPU_MAX_CACHES ||
        !(g->regions = calloc((size_t)GPU_MAX_CACHES * DEVMEM_MAX_DEVICES, sizeof *g->regions))) {
        errmsg_set(err, errlen, g && n > GPU_MAX_CACHES ? "more caches than the GPU side serves"
                                                        : "out of memory");
        return -1;
    }
    memcpy(g->caches, caches, n * sizeof *caches);
    g->ncaches = n;
    if (gpu_open_backend(cfg, g, backend_why, sizeof backend_why) < 0) {
        errmsg_set(err, errlen, "GPU backend: %s", backend_why);
        return -1;
    }
    if (devmem_kind(g->dm) != DEVMEM_NONE)
        backend_why[0] = '\0';
    if (gpu_start_hbm(cfg, g, backend_why, err, errlen) < 0)
        return -1;
    if (g->nregions > 0) {
        /* A copy thread per region (device and tenant), up to the copier's
         * bound: one device's demotions never wait for another's. */
        unsigned threads = g->nregions < COPIER_MAX_THREADS ? g->nregions : COPIER_MAX_THREADS;
        if (copier_create(base, g->dm, threads, GPU_COPY_QUEUE, &g->copier, err, errlen) < 0)
            return -1;
        for (size_t t = 0; t < g->ncaches; t++)
            if (g->caches[t].hbm_bytes > 0)
                cache_set_copier(g->caches[t].cache, g->copier);
    }
    return gpu_start_pinning(cfg, g, backend_why, err, errlen);
}

void gpu_stop(struct gpu *g)
{
    if (!g)
        return;
    if (g->copier) {
        copier_destroy(g->copier);   /* demotions in flight come back first */
        g->copier = NULL;
        for (size_t t = 0; t < g->ncaches; t++)
            cache_set_copier(g->caches[t].cache, NULL);
    }
    for (size_t t = 0; t < g->ncaches; t++) {
        if (!g->hostpins[t])
            continue;
        hostpin_stop(g->hostpins[t]);
        g->hostpins[t] = NULL;
        cache_set_hostpin(g->caches[t].cache, NULL);
    }
}

void gpu_destroy(struct gpu *g)
{
    if (!g)
        return;
    /* The caches are gone by now: only the threads are stopped here. */
    if (g->copier)
        copier_destroy(g->copier);
    for (size_t t = 0; t < g->ncaches; t++)
        hostpin_stop(g->hostpins[t]);
    for (unsigned i = 0; i < g->nregions; i++)
        devmem_region_free(g->dm, &g->regions[i]);
    if (g->dm)
        devmem_close(g->dm);
    free(g->regions);
    free(g);
}

void gpu_get_stats(const struct gpu *g, struct gpu_stats *out)
{
    *out = (struct gpu_stats){
        .backend = devmem_kind_name(devmem_kind(g->dm)),
        .devices_visible = devmem_device_count(g->dm),
        .hbm_arenas = g->nregions,
        .hbm_off_reason = g->nregions ? NULL : g->why_off,
    };
}
