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
    struct devmem_region regions[DEVMEM_MAX_DEVICES];
    unsigned nregions;
    struct copier *copier;
    struct hostpin *hostpin;
    char why_off[256];          /* why there is no HBM tier ("" when there is one) */
};

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

/* HBM arenas on the configured devices. 0, or -1 (err set) when the start
 * must fail; without required, what could not be had is logged. */
static int gpu_start_hbm(const struct kvn_config *cfg, struct gpu *g, struct cache *cache,
                         const char *backend_why, char *err, size_t errlen)
{
    int devs[CONFIG_HBM_DEVICES_MAX];
    size_t ndevs = 0;
    char why[512];
    int count = devmem_device_count(g->dm);

    if (cfg->hbm_bytes == 0) {
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
    for (size_t i = 0; i < ndevs; i++) {
        struct devmem_region *r = &g->regions[g->nregions];
        if (devs[i] >= count) {
            snprintf(why, sizeof why, "GPU %d is not visible (%d visible to the %s backend)",
                     devs[i], count, devmem_kind_name(devmem_kind(g->dm)));
        } else if (devmem_region_alloc(g->dm, devs[i], cfg->hbm_bytes, r, why, sizeof why) == 0) {
            g->nregions++;
            if (cache_add_hbm(cache, g->dm, r, cfg->slab_bytes, why, sizeof why) == 0) {
                log_info("HBM tier: GPU %d, %" PRIu64 " MiB (%s backend, lent through %s)",
                         devs[i], r->size >> 20, devmem_kind_name(devmem_kind(g->dm)),
                         r->ipc_len ? "CUDA IPC" : "a mapped memfd");
                continue;
            }
        }
        if (cfg->hbm_required) {
            errmsg_set(err, errlen, "hbm.required = on but the HBM tier on GPU %d is unavailable: %s",
                       devs[i], why);
            return -1;
        }
        log_warn("HBM tier: GPU %d left out: %s", devs[i], why);
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

static int gpu_start_pinning(const struct kvn_config *cfg, struct gpu *g, struct cache *cache,
                             const char *backend_why, char *err, size_t errlen)
{
    char why[256];

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
    if (hostpin_start(g->dm, cache_host_base(cache), cache_host_size(cache), cfg->pin_chunk_bytes,
                      cfg->pin_host == CONFIG_PIN_ON, &g->hostpin, why, sizeof why) < 0) {
        g->hostpin = NULL;
        if (cfg->pin_host == CONFIG_PIN_ON) {
            errmsg_set(err, errlen, "memory.pin_host = on but the host arena cannot be pinned: %s",
                       why);
            return -1;
        }
        log_info("host arena not pinned: %s", why);
        return 0;
    }
    cache_set_hostpin(cache, g->hostpin);
    return 0;
}

int gpu_start(struct event_base *base, const struct kvn_config *cfg, struct cache *cache,
              struct gpu **out, char *err, size_t errlen)
{
    struct gpu *g = calloc(1, sizeof *g);
    char backend_why[256] = "";

    *out = g;
    if (!g) {
        errmsg_set(err, errlen, "out of memory");
        return -1;
    }
    if (gpu_open_backend(cfg, g, backend_why, sizeof backend_why) < 0) {
        errmsg_set(err, errlen, "GPU backend: %s", backend_why);
        return -1;
    }
    if (devmem_kind(g->dm) != DEVMEM_NONE)
        backend_why[0] = '\0';
    if (gpu_start_hbm(cfg, g, cache, backend_why, err, errlen) < 0)
        return -1;
    if (g->nregions > 0) {
        /* A copy thread per device: one device's demotions never wait for another's. */
        if (copier_create(base, g->dm, g->nregions, GPU_COPY_QUEUE, &g->copier, err, errlen) < 0)
            return -1;
        cache_set_copier(cache, g->copier);
    }
    return gpu_start_pinning(cfg, g, cache, backend_why, err, errlen);
}

void gpu_stop(struct gpu *g, struct cache *cache)
{
    if (!g)
        return;
    if (g->copier) {
        copier_destroy(g->copier);   /* demotions in flight come back first */
        g->copier = NULL;
        if (cache)
            cache_set_copier(cache, NULL);
    }
    if (g->hostpin) {
        hostpin_stop(g->hostpin);
        g->hostpin = NULL;
        if (cache)
            cache_set_hostpin(cache, NULL);
    }
}

void gpu_destroy(struct gpu *g)
{
    if (!g)
        return;
    gpu_stop(g, NULL);
    for (unsigned i = 0; i < g->nregions; i++)
        devmem_region_free(g->dm, &g->regions[i]);
    if (g->dm)
        devmem_close(g->dm);
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
