/* devmem_internal: what the devmem backends (devmem_sim.c, devmem_cuda.c) share
 * with the dispatcher (devmem.c). Private to those files.
 *
 * devmem.c checks every argument the API can check without the runtime
 * (device in range, non-NULL pointers, sizes) before calling a backend, so
 * a backend op only ever sees a valid device and non-empty copies. */
#ifndef KVNODE_DEVMEM_INTERNAL_H
#define KVNODE_DEVMEM_INTERNAL_H

#include "gpu/devmem.h"

struct devmem_ops {
    int  kind;
    void (*close)(struct devmem *dm);
    int  (*region_alloc)(struct devmem *dm, int device, uint64_t bytes, struct devmem_region *out,
                         char *why, size_t whylen);
    void (*region_free)(struct devmem *dm, struct devmem_region *r);
    int  (*host_register)(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen);
    void (*host_unregister)(struct devmem *dm, void *ptr);
    /* Returns a backend-allocated stream whose first member is struct devmem_stream. */
    int  (*stream_create)(struct devmem *dm, int device, struct devmem_stream **out,
                          char *why, size_t whylen);
    void (*stream_destroy)(struct devmem_stream *s);
    int  (*copy_async)(struct devmem_stream *s, void *dst, const void *src, size_t len,
                       char *why, size_t whylen);
    int  (*stream_wait)(struct devmem_stream *s, char *why, size_t whylen);
    int  (*copy_to_host)(struct devmem *dm, int device, void *dst, const void *src, size_t len,
                         char *why, size_t whylen);
    /* Optional (NULL: accepted and ignored / never down). */
    int  (*set_pin_device)(struct devmem *dm, int device, char *why, size_t whylen);
    bool (*device_down)(struct devmem *dm, int device, char *why, size_t whylen);
};

/* Backends embed these as their first member. */
struct devmem {
    const struct devmem_ops *ops;
    int ndev;
};

struct devmem_stream {
    struct devmem *dm;
    int device;
};

int devmem_sim_open(struct devmem **out, char *why, size_t whylen);
int devmem_cuda_open(struct devmem **out, char *why, size_t whylen);

#endif
