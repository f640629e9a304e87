/* devmem: backend choice, argument checks and dispatch (see devmem.h), and
 * the none backend. Backends live in devmem_sim.c and devmem_cuda.c. */
#include "gpu/devmem_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/errmsg.h"
#include "kvnode.h"

/* --- none --------------------------------------------------------------- */

static void none_close(struct devmem *dm)
{
    free(dm);
}

static int none_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen)
{
    (void)dm;
    (void)ptr;
    (void)len;
    errmsg_set(why, whylen, "devmem none: no GPU to pin host memory for");
    return -KVNODE_EINVAL;
}

static void none_host_unregister(struct devmem *dm, void *ptr)
{
    (void)dm;
    (void)ptr;
}

/* Every device-taking op is refused by the range check before it gets here
 * (none has 0 devices), so only the pin calls need bodies. */
static const struct devmem_ops none_ops = {
    .kind = DEVMEM_NONE,
    .close = none_close,
    .host_register = none_host_register,
    .host_unregister = none_host_unregister,
};

static int none_open(struct devmem **out, char *why, size_t whylen)
{
    struct devmem *dm = calloc(1, sizeof(*dm));
    if (!dm) {
        errmsg_set(why, whylen, "devmem: out of memory");
        return -KVNODE_ENOMEM;
    }
    dm->ops = &none_ops;
    dm->ndev = 0;
    *out = dm;
    return 0;
}

/* --- open / accessors ----------------------------------------------------- */

const char *devmem_kind_name(int kind)
{
    switch (kind) {
    case DEVMEM_NONE: return "none";
    case DEVMEM_SIM:  return "sim";
    case DEVMEM_CUDA: return "cuda";
    default:          return "unknown";
    }
}

int devmem_open(int kind, struct devmem **out, char *why, size_t whylen)
{
    if (!out) {
        errmsg_set(why, whylen, "devmem: no output pointer");
        return -KVNODE_EINVAL;
    }
    *out = NULL;
    errmsg_set(why, whylen, "%s", "");
    switch (kind) {
    case DEVMEM_NONE:
        return none_open(out, why, whylen);
    case DEVMEM_SIM:
        return devmem_sim_open(out, why, whylen);
    case DEVMEM_CUDA:
        return devmem_cuda_open(out, why, whylen);
    default:
        errmsg_set(why, whylen, "devmem: unknown backend kind %d", kind);
        return -KVNODE_EINVAL;
    }
}

int devmem_open_auto(struct devmem **out, char *why, size_t whylen)
{
    int rc = devmem_open(DEVMEM_CUDA, out, why, whylen);
    if (rc == 0 || rc == -KVNODE_ENOMEM || !out)
        return rc;
    /* why keeps cuda's reason: it is what the caller reports. */
    return none_open(out, why, whylen);
}

void devmem_close(struct devmem *dm)
{
    if (dm)
        dm->ops->close(dm);
}

int devmem_kind(const struct devmem *dm)
{
    return dm ? dm->ops->kind : DEVMEM_NONE;
}

int devmem_device_count(const struct devmem *dm)
{
    return dm ? dm->ndev : 0;
}

bool devmem_can_pin(const struct devmem *dm)
{
    return dm && dm->ops->kind != DEVMEM_NONE;
}

/* --- argument checks ------------------------------------------------------ */

static int check_device(const struct devmem *dm, int device, char *why, size_t whylen)
{
    if (!dm) {
        errmsg_set(why, whylen, "devmem: no backend");
        return -KVNODE_EINVAL;
    }
    if (dm->ndev == 0) {
        errmsg_set(why, whylen, "devmem %s: no GPU device", devmem_kind_name(dm->ops->kind));
        return -KVNODE_EINVAL;
    }
    if (device < 0 || device >= dm->ndev) {
        errmsg_set(why, whylen, "devmem %s: device %d out of range (%d device%s: 0..%d)",
                   devmem_kind_name(dm->ops->kind), device, dm->ndev, dm->ndev == 1 ? "" : "s",
                   dm->ndev - 1);
        return -KVNODE_EINVAL;
    }
    return 0;
}

static int check_copy(void *dst, const void *src, size_t len, char *why, size_t whylen)
{
    if (len > 0 && (!dst || !src)) {
        errmsg_set(why, whylen, "devmem: copy of %zu bytes with a NULL %s", len,
                   !dst ? "destination" : "source");
        return -KVNODE_EINVAL;
    }
    return 0;
}

/* --- dispatch --------------------------------------------------------------- */

int devmem_region_alloc(struct devmem *dm, int device, uint64_t bytes, struct devmem_region *out,
                        char *why, size_t whylen)
{
    int rc;

    if (!out) {
        errmsg_set(why, whylen, "devmem: no output region");
        return -KVNODE_EINVAL;
    }
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    out->device = device;
    if ((rc = check_device(dm, device, why, whylen)) < 0)
        return rc;
    if (bytes == 0 || bytes > (uint64_t)SIZE_MAX || bytes > (uint64_t)INT64_MAX) {
        errmsg_set(why, whylen, "devmem %s: cannot allocate a region of %llu bytes",
                   devmem_kind_name(dm->ops->kind), (unsigned long long)bytes);
        return -KVNODE_EINVAL;
    }
    rc = dm->ops->region_alloc(dm, device, bytes, out, why, whylen);
    if (rc < 0) {
        memset(out, 0, sizeof(*out));
        out->fd = -1;
        out->device = device;
    }
    return rc;
}

void devmem_region_free(struct devmem *dm, struct devmem_region *r)
{
    if (!dm || !r || !r->base)
        return;
    dm->ops->region_free(dm, r);
    memset(r, 0, sizeof(*r));
    r->fd = -1;
}

int devmem_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen)
{
    if (!dm || !ptr || len == 0) {
        errmsg_set(why, whylen, "devmem: host_register needs a backend and a non-empty range");
        return -KVNODE_EINVAL;
    }
    return dm->ops->host_register(dm, ptr, len, why, whylen);
}

void devmem_host_unregister(struct devmem *dm, void *ptr)
{
    if (dm && ptr)
        dm->ops->host_unregister(dm, ptr);
}

int devmem_set_pin_device(struct devmem *dm, int device, char *why, size_t whylen)
{
    int rc;

    if ((rc = check_device(dm, device, why, whylen)) < 0)
        return rc;
    return dm->ops->set_pin_device ? dm->ops->set_pin_device(dm, device, why, whylen) : 0;
}

bool devmem_device_down(struct devmem *dm, int device, char *why, size_t whylen)
{
    if (!dm || device < 0 || device >= dm->ndev || !dm->ops->device_down)
        return false;
    return dm->ops->device_down(dm, device, why, whylen);
}

int devmem_stream_create(struct devmem *dm, int device, struct devmem_stream **out,
                         char *why, size_t whylen)
{
    int rc;

    if (!out) {
        errmsg_set(why, whylen, "devmem: no output stream");
        return -KVNODE_EINVAL;
    }
    *out = NULL;
    if ((rc = check_device(dm, device, why, whylen)) < 0)
        return rc;
    rc = dm->ops->stream_create(dm, device, out, why, whylen);
    if (rc == 0) {
        (*out)->dm = dm;
        (*out)->device = device;
    }
    return rc;
}

void devmem_stream_destroy(struct devmem_stream *s)
{
    if (s)
        s->dm->ops->stream_destroy(s);
}

int devmem_copy_async(struct devmem_stream *s, void *dst, const void *src, size_t len,
                      char *why, size_t whylen)
{
    int rc;

    if (!s) {
        errmsg_set(why, whylen, "devmem: no stream");
        return -KVNODE_EINVAL;
    }
    if ((rc = check_copy(dst, src, len, why, whylen)) < 0)
        return rc;
    if (len == 0)
        return 0;
    return s->dm->ops->copy_async(s, dst, src, len, why, whylen);
}

int devmem_stream_wait(struct devmem_stream *s, char *why, size_t whylen)
{
    if (!s) {
        errmsg_set(why, whylen, "devmem: no stream");
        return -KVNODE_EINVAL;
    }
    return s->dm->ops->stream_wait(s, why, whylen);
}

int devmem_copy_to_host(struct devmem *dm, int device, void *dst, const void *src, size_t len,
                        char *why, size_t whylen)
{
    int rc;

    if ((rc = check_device(dm, device, why, whylen)) < 0)
        return rc;
    if ((rc = check_copy(dst, src, len, why, whylen)) < 0)
        return rc;
    if (len == 0)
        return 0;
    return dm->ops->copy_to_host(dm, device, dst, src, len, why, whylen);
}
