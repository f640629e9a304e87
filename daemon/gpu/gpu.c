/* gpu: see gpu.h. */
#include "gpu/gpu.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "gpu/copier.h"
#include "gpu/devmem.h"
#include "core/errmsg.h"
#include "gpu/hostpin.h"
#include "kvnode.h"
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
    bool has_hbm[GPU_MAX_CACHES];               /* by cache: it got at least one HBM arena */
    char why_off[256];          /* why there is no HBM tier ("" when there is one) */
    int pin_device;             /* the device whose context pins host memory; -1: none has HBM */
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

/* A region on device dev; out of device memory is retried for up to
 * hbm.alloc_retry (a daemon restarted under engines that still map the old
 * one's regions waits for them to let go), each wait logged with why. */
static int gpu_alloc_region(const struct kvn_config *cfg, struct gpu *g, const char *who, int dev,
                            uint64_t bytes, struct devmem_region *r, char *why, size_t whylen)
{
    uint64_t start = clock_now_ms(), wait_ms = 250;
    unsigned tries = 1;
    int rc;

    while ((rc = devmem_region_alloc(g->dm, dev, bytes, r, why, whylen)) == -KVNODE_ENOMEM) {
        uint64_t spent = clock_now_ms() - start;
        if (spent >= cfg->hbm_alloc_retry_ms)
            break;
        if (wait_ms > cfg->hbm_alloc_retry_ms - spent)
            wait_ms = cfg->hbm_alloc_retry_ms - spent;
        log_warn("%sHBM tier: GPU %d has no room for %" PRIu64 " MiB (%s); trying again in %" PRIu64 " ms, for up "
                 "to hbm.alloc_retry = %" PRIu32 " ms in all (engines of a daemon that stopped may still hold its "
                 "GPU memory)", who, dev, bytes >> 20, why, wait_ms, cfg->hbm_alloc_retry_ms);
        clock_sleep_ms(wait_ms);
        wait_ms = wait_ms * 2 > 2000 ? 2000 : wait_ms * 2;
        tries++;
    }
    if (rc == -KVNODE_ENOMEM && tries > 1) {
        char first[640];
        snprintf(first, sizeof first, "%.600s", why);
        errmsg_set(why, whylen, "%s (still after %u tries over %.1f s, hbm.alloc_retry)", first, tries,
                   (double)(clock_now_ms() - start) / 1000.0);
    } else if (rc == 0 && tries > 1) {
        log_info("%sHBM tier: GPU %d had room on try %u", who, dev, tries);
    }
    return rc;
}

/* HBM arenas on the configured devices, for each cache that asks for some.
 * 0, or -1 (err set) when the start must fail; without required, what
 * could not be had is logged. */
static int gpu_start_hbm(const struct kvn_config *cfg, struct gpu *g, const char *backend_why,
                         char *err, size_t errlen)
{
    int devs[CONFIG_HBM_DEVICES_MAX];
    size_t ndevs = 0;
    char why[640], who[CONFIG_TENANT_NAME_MAX + 16];
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
            } else if (gpu_alloc_region(cfg, g, who, devs[i], gc->hbm_bytes, r, why, sizeof why) == 0) {
                g->nregions++;
                if (gc->ops->add_hbm(gc->cache, g->dm, r, cfg->slab_bytes, why, sizeof why) == 0) {
                    log_info("%sHBM tier: GPU %d%s%s%s, %" PRIu64 " MiB (%s backend, lent %s)",
                             who, devs[i], r->pci_bus_id[0] ? " (" : "", r->pci_bus_id,
                             r->pci_bus_id[0] ? ")" : "", r->size >> 20, devmem_kind_name(devmem_kind(g->dm)),
                             r->vmm ? "as a CUDA VMM file descriptor (crosses PID namespaces)"
                             : r->ipc_len ? "through a legacy CUDA IPC handle (engines in this PID namespace only)"
                             : "as a mapped memfd");
                    if (!g->has_hbm[t]) {
                        g->has_hbm[t] = true;
                        /* Pinning needs a context: the first HBM device's (portable: every context's). */
                        if (g->pin_device < 0)
                            g->pin_device = devs[i];
                    }
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

/* Pinning is per process: it speeds up only the daemon's own copies between
 * host and GPU memory (demotions), never the engines' (they pin in their own
 * process, kvnode_pin_host). So a cache's host arena is pinned only when the
 * cache has an HBM tier, with the context of a GPU that has one: without,
 * pinning would only take a context (and GPU memory) on some GPU. */
static int gpu_start_pinning(const struct kvn_config *cfg, struct gpu *g, char *err, size_t errlen)
{
    char why[256], who[CONFIG_TENANT_NAME_MAX + 16];

    if (cfg->pin_host == CONFIG_PIN_OFF)
        return 0;
    if (g->pin_device < 0) {
        if (cfg->pin_host == CONFIG_PIN_ON)
            log_info("memory.pin_host = on, but there is no HBM tier: host memory is not pinned (pinning is per "
                     "process, and no copy of the daemon's would use it; engines pin with kvnode_pin_host)");
        else
            log_info("host arena not pinned: no HBM tier (pinning is per process; only the daemon's own copies "
                     "to and from GPU memory would use it)");
        return 0;
    }
    if (devmem_set_pin_device(g->dm, g->pin_device, why, sizeof why) < 0) {
        if (cfg->pin_host == CONFIG_PIN_ON) {
            errmsg_set(err, errlen, "memory.pin_host = on but the host arena cannot be pinned: %s", why);
            return -1;
        }
        log_info("host arena not pinned: %s", why);
        return 0;
    }
    for (size_t t = 0; t < g->ncaches; t++) {
        const struct gpu_cache *gc = &g->caches[t];
        void *base;
        uint64_t size, slab_bytes;
        gpu_who(gc, who, sizeof who);
        if (!g->has_hbm[t]) {
            log_info("%shost arena not pinned: no HBM tier of its own (no copy of the daemon's would use it)", who);
            continue;
        }
        /* Chunks on slab boundaries: no block is in two registrations. */
        gc->ops->host_arena(gc->cache, &base, &size, &slab_bytes);
        if (hostpin_start(g->dm, base, size, cfg->pin_chunk_bytes, slab_bytes, cfg->pin_host == CONFIG_PIN_ON,
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
        gc->ops->set_hostpin(gc->cache, g->hostpins[t]);
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
    g->pin_device = -1;
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
                g->caches[t].ops->set_copier(g->caches[t].cache, g->copier);
    }
    return gpu_start_pinning(cfg, g, err, errlen);
}

void gpu_stop(struct gpu *g)
{
    if (!g)
        return;
    if (g->copier) {
        copier_destroy(g->copier);   /* demotions in flight come back first */
        g->copier = NULL;
        for (size_t t = 0; t < g->ncaches; t++)
            g->caches[t].ops->set_copier(g->caches[t].cache, NULL);
    }
    for (size_t t = 0; t < g->ncaches; t++) {
        if (!g->hostpins[t])
            continue;
        hostpin_stop(g->hostpins[t]);
        g->hostpins[t] = NULL;
        g->caches[t].ops->set_hostpin(g->caches[t].cache, NULL);
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
