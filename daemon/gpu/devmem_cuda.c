/* devmem cuda backend (see devmem.h): the CUDA driver API through the table
 * cudadrv loads at run time.
 *
 * Contexts: a device's primary context is retained the first time the
 * device is given work (region, stream, pinning, a copy) and released at
 * close; a device never given work never gets one. Contexts are current per
 * thread, so every call makes its device's current first (the calling
 * worker may have used another device last, or none).
 *
 * Compute mode and MIG are read at open with cuDeviceGetAttribute and
 * cuDeviceGetName, which need no context: a refused device never gets one.
 *
 * A sticky error marks the device down (release store after the reason is
 * written, so device_down's acquire load sees the whole reason). */
#include "gpu/devmem_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "core/log.h"
#include "gpu/cudadrv.h"
#include "kvnode.h"

_Static_assert(sizeof(CUipcMemHandle) == DEVMEM_IPC_HANDLE_BYTES,
               "DEVMEM_IPC_HANDLE_BYTES must match CUipcMemHandle");

struct cuda_dev {
    CUdevice    dev;
    char        name[128];
    char        bus_id[32];
    char        refused[512];       /* compute mode or MIG: why it gets no context ("" when usable) */
    bool        vmm;                /* VMM with POSIX-fd handles (attributes 102 and 103) */
    CUcontext   ctx;                /* retained primary context; NULL until first use (under lock) */
    atomic_bool down;
    char        down_why[256];      /* written once, before down */
};

struct cuda_devmem {
    struct devmem base;
    struct cudadrv api;
    pthread_mutex_t lock;           /* ctx retain, down_why */
    int pin_device;                 /* -1: none chosen */
    struct cuda_dev devs[DEVMEM_MAX_DEVICES];
};

struct cuda_stream {
    struct devmem_stream base;
    CUstream stream;
    CUevent  event;
};

static struct cuda_devmem *cdm(struct devmem *dm)
{
    return (struct cuda_devmem *)dm;
}

/* A failed call on device d: the message, the device down when the error
 * is sticky, and the KVNODE code. */
static int cu_fail(struct cuda_devmem *m, int d, CUresult e, const char *what, char *why, size_t whylen)
{
    char ebuf[128];

    cudadrv_error(&m->api, e, ebuf, sizeof ebuf);
    if (d >= 0 && cudadrv_is_sticky(e)) {
        struct cuda_dev *cd = &m->devs[d];
        pthread_mutex_lock(&m->lock);
        if (!atomic_load(&cd->down)) {
            snprintf(cd->down_why, sizeof cd->down_why, "%s: %s", what, ebuf);
            atomic_store_explicit(&cd->down, true, memory_order_release);
        }
        pthread_mutex_unlock(&m->lock);
        errmsg_set(why, whylen, "devmem cuda: GPU %d is down (the CUDA context is lost for the life of the "
                   "process): %s: %s", d, what, ebuf);
        return -KVNODE_EIO;
    }
    errmsg_set(why, whylen, "devmem cuda: %s: %s", what, ebuf);
    return e == CUDA_ERROR_OUT_OF_MEMORY ? -KVNODE_ENOMEM : -KVNODE_EIO;
}

/* Make device d's primary context current on this thread, retaining it on
 * first use. Refused and down devices fail at once, without a driver call. */
static int use_device(struct cuda_devmem *m, int d, char *why, size_t whylen)
{
    struct cuda_dev *cd = &m->devs[d];
    CUcontext ctx;
    CUresult e = CUDA_SUCCESS;
    char what[64];

    if (cd->refused[0]) {
        errmsg_set(why, whylen, "%s", cd->refused);
        return -KVNODE_EDENIED;
    }
    if (atomic_load_explicit(&cd->down, memory_order_acquire)) {
        errmsg_set(why, whylen, "devmem cuda: GPU %d is down: %s", d, cd->down_why);
        return -KVNODE_EIO;
    }
    pthread_mutex_lock(&m->lock);
    if (!cd->ctx && (e = m->api.cuDevicePrimaryCtxRetain(&ctx, cd->dev)) == CUDA_SUCCESS)
        cd->ctx = ctx;
    ctx = cd->ctx;
    pthread_mutex_unlock(&m->lock);
    if (e != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuDevicePrimaryCtxRetain(GPU %d)", d);
        int rc = cu_fail(m, d, e, what, why, whylen);
        if (e == CUDA_ERROR_DEVICE_UNAVAILABLE)
            errmsg_set(why, whylen, "GPU %d (%s) is unavailable: another process holds it in EXCLUSIVE_PROCESS "
                       "compute mode, or it is PROHIBITED", d, cd->name);
        return rc;
    }
    if ((e = m->api.cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuCtxSetCurrent(GPU %d)", d);
        return cu_fail(m, d, e, what, why, whylen);
    }
    return 0;
}

/* --- regions ------------------------------------------------------------------ */

static void vmm_prop(const struct cuda_dev *cd, CUmemAllocationProp *prop)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = cd->dev;
}

/* A VMM allocation exported as a POSIX fd, mapped read-write for this
 * device at an address of the daemon's own. */
static int vmm_alloc(struct cuda_devmem *m, int d, uint64_t bytes, struct devmem_region *out,
                     char *why, size_t whylen)
{
    const struct cudadrv *a = &m->api;
    struct cuda_dev *cd = &m->devs[d];
    CUmemAllocationProp prop;
    CUmemAccessDesc access = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, cd->dev },
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    size_t gran = 0, size;
    int fd = -1, rc;
    bool mapped = false;
    CUresult e;
    char what[96];

    vmm_prop(cd, &prop);
    if ((e = a->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) != CUDA_SUCCESS ||
        gran == 0) {
        snprintf(what, sizeof what, "cuMemGetAllocationGranularity(GPU %d)", d);
        return cu_fail(m, d, e != CUDA_SUCCESS ? e : CUDA_ERROR_INVALID_VALUE, what, why, whylen);
    }
    if (bytes > SIZE_MAX - gran) {
        errmsg_set(why, whylen, "devmem cuda: %llu bytes cannot be rounded to the granularity", (unsigned long long)bytes);
        return -KVNODE_EINVAL;
    }
    size = ((size_t)bytes + gran - 1) / gran * gran;
    if ((e = a->cuMemCreate(&h, size, &prop, 0)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemCreate of %zu bytes on GPU %d", size, d);
        return cu_fail(m, d, e, what, why, whylen);
    }
    if ((e = a->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemExportToShareableHandle(GPU %d)", d);
        fd = -1;
        goto fail;
    }
    if ((e = a->cuMemAddressReserve(&va, size, gran, 0, 0)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemAddressReserve of %zu bytes", size);
        va = 0;
        goto fail;
    }
    if ((e = a->cuMemMap(va, size, 0, h, 0)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemMap of %zu bytes on GPU %d", size, d);
        goto fail;
    }
    mapped = true;
    if ((e = a->cuMemSetAccess(va, size, &access, 1)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemSetAccess(GPU %d)", d);
        goto fail;
    }
    out->base = (void *)(uintptr_t)va;
    out->size = size;
    out->fd = fd;
    out->vmm = true;
    out->handle = h;
    out->ipc_len = 0;
    return 0;

fail:
    rc = cu_fail(m, d, e, what, why, whylen);
    if (mapped)
        a->cuMemUnmap(va, size);
    if (va)
        a->cuMemAddressFree(va, size);
    if (fd >= 0)
        close(fd);
    a->cuMemRelease(h);
    return rc;
}

/* cuMemAlloc lent through a legacy IPC handle (same PID namespace only). */
static int legacy_alloc(struct cuda_devmem *m, int d, uint64_t bytes, struct devmem_region *out,
                        char *why, size_t whylen)
{
    CUdeviceptr p = 0;
    CUipcMemHandle h;
    CUresult e;
    char what[96];
    int rc;

    if ((e = m->api.cuMemAlloc(&p, (size_t)bytes)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemAlloc of %llu bytes on GPU %d", (unsigned long long)bytes, d);
        return cu_fail(m, d, e, what, why, whylen);
    }
    if ((e = m->api.cuIpcGetMemHandle(&h, p)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuIpcGetMemHandle(GPU %d)", d);
        rc = cu_fail(m, d, e, what, why, whylen);
        m->api.cuMemFree(p);
        return rc;
    }
    out->base = (void *)(uintptr_t)p;
    out->size = bytes;
    out->fd = -1;
    out->vmm = false;
    memcpy(out->ipc_handle, &h, sizeof h);
    out->ipc_len = sizeof h;
    return 0;
}

static int cuda_region_alloc(struct devmem *dm, int device, uint64_t bytes, struct devmem_region *out,
                             char *why, size_t whylen)
{
    struct cuda_devmem *m = cdm(dm);
    struct cuda_dev *cd = &m->devs[device];
    char vmm_why[256] = "";
    int rc;

    if ((rc = use_device(m, device, why, whylen)) < 0)
        return rc;
    if (cd->vmm) {
        rc = vmm_alloc(m, device, bytes, out, vmm_why, sizeof vmm_why);
        /* Out of memory or a lost device: legacy IPC would not do better. */
        if (rc == 0 || rc == -KVNODE_ENOMEM || atomic_load(&cd->down)) {
            if (rc < 0)
                errmsg_set(why, whylen, "%s", vmm_why);
            goto done;
        }
    }
    rc = legacy_alloc(m, device, bytes, out, why, whylen);
    if (rc == 0 && vmm_why[0])
        log_warn("GPU %d: its memory could not be exported as a VMM file descriptor (%s); lent through a legacy "
                 "CUDA IPC handle instead (engines in kvnoded's PID namespace only)", device, vmm_why);
    if (rc < 0 && vmm_why[0]) {
        char legacy_why[256];
        snprintf(legacy_why, sizeof legacy_why, "%s", why);
        errmsg_set(why, whylen, "%s; then %s", vmm_why, legacy_why);
    }
done:
    if (rc == 0) {
        out->device = device;
        out->host_access = false;
        /* Matched against the client's: its CUDA_VISIBLE_DEVICES may number the GPU otherwise. */
        snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%s", cd->bus_id);
    }
    return rc;
}

/* Make d's context current if it has one, whatever state the device is in
 * (frees and destroys still go to a down device: the driver keeps the
 * process's resources until they are given back or the process ends). */
static bool current_if_any(struct cuda_devmem *m, int d)
{
    pthread_mutex_lock(&m->lock);
    CUcontext ctx = m->devs[d].ctx;
    pthread_mutex_unlock(&m->lock);
    return ctx && m->api.cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}

static void cuda_region_free(struct devmem *dm, struct devmem_region *r)
{
    struct cuda_devmem *m = cdm(dm);
    const struct cudadrv *a = &m->api;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)r->base;
    bool current = current_if_any(m, r->device);

    if (r->vmm) {
        if (current) {
            a->cuMemUnmap(p, (size_t)r->size);
            a->cuMemAddressFree(p, (size_t)r->size);
            a->cuMemRelease((CUmemGenericAllocationHandle)r->handle);
        }
        if (r->fd >= 0)
            close(r->fd);
    } else if (current) {
        a->cuMemFree(p);
    }
}

/* --- pinning -------------------------------------------------------------------- */

static int cuda_set_pin_device(struct devmem *dm, int device, char *why, size_t whylen)
{
    struct cuda_devmem *m = cdm(dm);

    if (m->devs[device].refused[0]) {
        errmsg_set(why, whylen, "%s", m->devs[device].refused);
        return -KVNODE_EDENIED;
    }
    m->pin_device = device;
    return 0;
}

static int cuda_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen)
{
    struct cuda_devmem *m = cdm(dm);
    CUresult e;
    char what[80];
    int rc;

    if (m->pin_device < 0) {
        errmsg_set(why, whylen, "devmem cuda: no GPU chosen to pin host memory with (pinning without a GPU "
                   "that uses it would only take a context on one)");
        return -KVNODE_EINVAL;
    }
    if ((rc = use_device(m, m->pin_device, why, whylen)) < 0)
        return rc;
    /* Portable: pinned for every device's context, not only the current one. */
    if ((e = m->api.cuMemHostRegister(ptr, len, CU_MEMHOSTREGISTER_PORTABLE)) == CUDA_SUCCESS)
        return 0;
    snprintf(what, sizeof what, "cuMemHostRegister of %zu bytes (GPU %d's context)", len, m->pin_device);
    return cu_fail(m, m->pin_device, e, what, why, whylen);
}

static void cuda_host_unregister(struct devmem *dm, void *ptr)
{
    struct cuda_devmem *m = cdm(dm);

    if (m->pin_device >= 0 && current_if_any(m, m->pin_device))
        m->api.cuMemHostUnregister(ptr);
}

/* --- streams and copies --------------------------------------------------------- */

static int cuda_stream_create(struct devmem *dm, int device, struct devmem_stream **out,
                              char *why, size_t whylen)
{
    struct cuda_devmem *m = cdm(dm);
    struct cuda_stream *s;
    CUresult e;
    int rc;

    if ((rc = use_device(m, device, why, whylen)) < 0)
        return rc;
    if (!(s = calloc(1, sizeof(*s)))) {
        errmsg_set(why, whylen, "devmem cuda: out of memory for a stream on GPU %d", device);
        return -KVNODE_ENOMEM;
    }
    /* Non-blocking: never serialised with the legacy default stream. */
    if ((e = m->api.cuStreamCreate(&s->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
        rc = cu_fail(m, device, e, "cuStreamCreate", why, whylen);
        free(s);
        return rc;
    }
    if ((e = m->api.cuEventCreate(&s->event, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        rc = cu_fail(m, device, e, "cuEventCreate", why, whylen);
        m->api.cuStreamDestroy(s->stream);
        free(s);
        return rc;
    }
    *out = &s->base;
    return 0;
}

static void cuda_stream_destroy(struct devmem_stream *bs)
{
    struct cuda_stream *s = (struct cuda_stream *)bs;
    struct cuda_devmem *m = cdm(bs->dm);

    if (current_if_any(m, bs->device)) {
        m->api.cuEventDestroy(s->event);
        m->api.cuStreamDestroy(s->stream);
    }
    free(s);
}

static int cuda_copy_async(struct devmem_stream *bs, void *dst, const void *src, size_t len,
                           char *why, size_t whylen)
{
    struct cuda_stream *s = (struct cuda_stream *)bs;
    struct cuda_devmem *m = cdm(bs->dm);
    CUresult e;
    char what[64];
    int rc;

    if ((rc = use_device(m, bs->device, why, whylen)) < 0)
        return rc;
    /* Unified addressing: the driver infers the direction from the pointers. */
    if ((e = m->api.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len, s->stream)) ==
        CUDA_SUCCESS)
        return 0;
    snprintf(what, sizeof what, "cuMemcpyAsync of %zu bytes", len);
    return cu_fail(m, bs->device, e, what, why, whylen);
}

static int cuda_stream_wait(struct devmem_stream *bs, char *why, size_t whylen)
{
    struct cuda_stream *s = (struct cuda_stream *)bs;
    struct cuda_devmem *m = cdm(bs->dm);
    CUresult e;
    int rc;

    if ((rc = use_device(m, bs->device, why, whylen)) < 0)
        return rc;
    if ((e = m->api.cuEventRecord(s->event, s->stream)) != CUDA_SUCCESS)
        return cu_fail(m, bs->device, e, "cuEventRecord", why, whylen);
    if ((e = m->api.cuEventSynchronize(s->event)) != CUDA_SUCCESS)
        return cu_fail(m, bs->device, e, "cuEventSynchronize", why, whylen);
    return 0;
}

static int cuda_copy_to_host(struct devmem *dm, int device, void *dst, const void *src, size_t len,
                             char *why, size_t whylen)
{
    struct cuda_devmem *m = cdm(dm);
    CUresult e;
    char what[64];
    int rc;

    if ((rc = use_device(m, device, why, whylen)) < 0)
        return rc;
    if ((e = m->api.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, len)) == CUDA_SUCCESS)
        return 0;
    snprintf(what, sizeof what, "cuMemcpyDtoH of %zu bytes", len);
    return cu_fail(m, device, e, what, why, whylen);
}

static bool cuda_device_down(struct devmem *dm, int device, char *why, size_t whylen)
{
    struct cuda_dev *cd = &cdm(dm)->devs[device];

    if (!atomic_load_explicit(&cd->down, memory_order_acquire))
        return false;
    errmsg_set(why, whylen, "%s", cd->down_why);
    return true;
}

/* --- open / close ----------------------------------------------------------------- */

static void cuda_close(struct devmem *dm)
{
    struct cuda_devmem *m = cdm(dm);

    for (int d = 0; d < dm->ndev; d++)
        if (m->devs[d].ctx)
            m->api.cuDevicePrimaryCtxRelease(m->devs[d].dev);
    cudadrv_unload(&m->api);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static const struct devmem_ops cuda_ops = {
    .kind = DEVMEM_CUDA,
    .close = cuda_close,
    .region_alloc = cuda_region_alloc,
    .region_free = cuda_region_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .copy_async = cuda_copy_async,
    .stream_wait = cuda_stream_wait,
    .copy_to_host = cuda_copy_to_host,
    .set_pin_device = cuda_set_pin_device,
    .device_down = cuda_device_down,
};

static int attribute(const struct cudadrv *a, CUdevice dev, int attr)
{
    int v = 0;
    return a->cuDeviceGetAttribute(&v, attr, dev) == CUDA_SUCCESS ? v : -1;
}

/* What a device is and whether kvnoded may use it, with no context. */
static int probe_device(struct cuda_devmem *m, int d, char *why, size_t whylen)
{
    const struct cudadrv *a = &m->api;
    struct cuda_dev *cd = &m->devs[d];
    CUresult e;
    char what[48];

    if ((e = a->cuDeviceGet(&cd->dev, d)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuDeviceGet(%d)", d);
        return cu_fail(m, -1, e, what, why, whylen);
    }
    if (a->cuDeviceGetName(cd->name, (int)sizeof cd->name, cd->dev) != CUDA_SUCCESS)
        snprintf(cd->name, sizeof cd->name, "?");
    if (a->cuDeviceGetPCIBusId(cd->bus_id, (int)sizeof cd->bus_id, cd->dev) != CUDA_SUCCESS)
        cd->bus_id[0] = '\0';
    cd->vmm = a->has_vmm && attribute(a, cd->dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) > 0 &&
              attribute(a, cd->dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) > 0;
    /* Who the device is, for the messages (copied: the message goes into the same struct). */
    char who[sizeof cd->name + sizeof cd->bus_id + 32];
    snprintf(who, sizeof who, "GPU %d (%s, %s)", d, cd->name, cd->bus_id);
    switch (attribute(a, cd->dev, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)) {
    case CU_COMPUTEMODE_EXCLUSIVE_PROCESS:
        snprintf(cd->refused, sizeof cd->refused, "%s is in EXCLUSIVE_PROCESS compute mode: engines could not "
                 "share it with kvnoded; HBM off on it", who);
        return 0;
    case CU_COMPUTEMODE_PROHIBITED:
        snprintf(cd->refused, sizeof cd->refused, "%s is in PROHIBITED compute mode: no process may use it; HBM "
                 "off on it", who);
        return 0;
    default:
        break;
    }
    if (strstr(cd->name, "MIG")) {
        snprintf(cd->refused, sizeof cd->refused, "%s is a MIG instance: every instance of a GPU has the GPU's PCI "
                 "bus id, so kvnoded could not lend one instance's memory to the engines on that instance only; "
                 "HBM off on it", who);
    }
    return 0;
}

int devmem_cuda_open(struct devmem **out, char *why, size_t whylen)
{
    struct cuda_devmem *m = calloc(1, sizeof *m);
    int n = 0, rc;
    CUresult e;
    char ebuf[128];

    if (!m) {
        errmsg_set(why, whylen, "devmem cuda: out of memory");
        return -KVNODE_ENOMEM;
    }
    pthread_mutex_init(&m->lock, NULL);
    m->pin_device = -1;
    m->base.ops = &cuda_ops;
    if (cudadrv_load(&m->api, NULL, why, whylen) < 0) {
        rc = -KVNODE_EIO;
        goto fail;
    }
    if ((e = m->api.cuDeviceGetCount(&n)) != CUDA_SUCCESS || n <= 0) {
        if (e != CUDA_SUCCESS)
            errmsg_set(why, whylen, "no usable GPU (cuDeviceGetCount: %s)", cudadrv_error(&m->api, e, ebuf, sizeof ebuf));
        else
            errmsg_set(why, whylen, "no usable GPU (cuDeviceGetCount: 0 devices)");
        rc = -KVNODE_EIO;
        goto fail;
    }
    /* Devices past the limit are left unused rather than refused. */
    m->base.ndev = n > DEVMEM_MAX_DEVICES ? DEVMEM_MAX_DEVICES : n;
    for (int d = 0; d < m->base.ndev; d++)
        if ((rc = probe_device(m, d, why, whylen)) < 0)
            goto fail;
    *out = &m->base;
    return 0;

fail:
    cudadrv_unload(&m->api);
    pthread_mutex_destroy(&m->lock);
    free(m);
    return rc;
}
