/* gpu: the daemon's GPU side, wired from [hbm] and [memory] pin_host. Opens
 * the devmem backend, gives the cache one HBM arena per configured device,
 * starts pinning the host arena in the background and runs the copy worker
 * that demotes HBM blocks. Decides what "required" means: when HBM is
 * asked for (hbm.bytes > 0) and cannot be had, start fails under
 * required = on and otherwise one log line says HBM is off and why.
 *
 * Main (loop) thread, at start and stop. */
#ifndef KVNODE_GPU_H
#define KVNODE_GPU_H

#include <stddef.h>


#include "config.h"

struct event_base;
struct cache;
struct gpu;

/* 0, or -1 with err set (the start must fail). *out is set either way
 * (gpu_stop/gpu_destroy accept it). */
int  gpu_start(struct event_base *base, const struct kvn_config *cfg, struct cache *cache,
               struct gpu **out, char *err, size_t errlen);
/* Before cache_destroy: finish or cancel demotions, stop pinning (the host
 * arena is unregistered). NULL is ignored. */
void gpu_stop(struct gpu *g, struct cache *cache);
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
