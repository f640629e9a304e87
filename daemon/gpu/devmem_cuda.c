/* devmem cuda backend (see devmem.h): the CUDA runtime API, linked from
 * cudart (no nvcc, no kernels). Built only with KVNODE_HAVE_CUDA.
 *
 * cudaSetDevice is per thread: every call that allocates or synchronises on
 * a particular device sets it first, since the calling worker thread may
 * have used another device last. */
#ifdef KVNODE_HAVE_CUDA

#include "gpu/devmem_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "core/errmsg.h"
#include "kvnode.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == DEVMEM_IPC_HANDLE_BYTES,
               "DEVMEM_IPC_HANDLE_BYTES must match cudaIpcMemHandle_t");

struct cuda_stream {
    struct devmem_stream base;
    cudaStream_t stream;
    cudaEvent_t  event;
};

/* Describe a failed call; returns the KVNODE code for it. */
static int cuda_fail(cudaError_t e, char *why, size_t whylen, const char *what)
{
    (void)cudaGetLastError();   /* clear the runtime's last-error record */
    errmsg_set(why, whylen, "devmem cuda: %s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? -KVNODE_ENOMEM : -KVNODE_EIO;
}

static int set_device(int device, char *why, size_t whylen)
{
    cudaError_t e = cudaSetDevice(device);
    char what[48];

    if (e == cudaSuccess)
        return 0;
    snprintf(what, sizeof what, "cudaSetDevice(%d)", device);
    return cuda_fail(e, why, whylen, what);
}

static void cuda_close(struct devmem *dm)
{
    free(dm);
}

static int cuda_region_alloc(struct devmem *dm, int device, uint64_t bytes, struct devmem_region *out,
                             char *why, size_t whylen)
{
    void *p = NULL;
    cudaIpcMemHandle_t h;
    cudaError_t e;
    char what[96];
    int rc;

    (void)dm;
    if ((rc = set_device(device, why, whylen)) < 0)
        return rc;
    if ((e = cudaMalloc(&p, (size_t)bytes)) != cudaSuccess) {
        snprintf(what, sizeof what, "cudaMalloc of %llu bytes on device %d",
                 (unsigned long long)bytes, device);
        return cuda_fail(e, why, whylen, what);
    }
    if ((e = cudaIpcGetMemHandle(&h, p)) != cudaSuccess) {
        snprintf(what, sizeof what, "cudaIpcGetMemHandle on device %d", device);
        rc = cuda_fail(e, why, whylen, what);
        cudaFree(p);
        return rc;
    }
    out->device = device;
    out->base = p;
    out->size = bytes;
    out->fd = -1;
    memcpy(out->ipc_handle, &h, sizeof h);
    out->ipc_len = sizeof h;
    out->host_access = false;
    /* Matched against the client's: its CUDA_VISIBLE_DEVICES may number the GPU otherwise. */
    if (cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, device) != cudaSuccess) {
        out->pci_bus_id[0] = '\0';
        (void)cudaGetLastError();
    }
    return 0;
}

static void cuda_region_free(struct devmem *dm, struct devmem_region *r)
{
    (void)dm;
    if (cudaSetDevice(r->device) == cudaSuccess)
        cudaFree(r->base);
    (void)cudaGetLastError();
}

static int cuda_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen)
{
    cudaError_t e;
    char what[64];

    (void)dm;
    /* Portable: pinned for every device's context, not only the current one. */
    if ((e = cudaHostRegister(ptr, len, cudaHostRegisterPortable)) == cudaSuccess)
        return 0;
    snprintf(what, sizeof what, "cudaHostRegister of %zu bytes", len);
    return cuda_fail(e, why, whylen, what);
}

static void cuda_host_unregister(struct devmem *dm, void *ptr)
{
    (void)dm;
    cudaHostUnregister(ptr);
    (void)cudaGetLastError();
}

static int cuda_stream_create(struct devmem *dm, int device, struct devmem_stream **out,
                              char *why, size_t whylen)
{
    struct cuda_stream *s;
    cudaError_t e;
    int rc;

    (void)dm;
    if ((rc = set_device(device, why, whylen)) < 0)
        return rc;
    if (!(s = calloc(1, sizeof(*s)))) {
        errmsg_set(why, whylen, "devmem cuda: out of memory for a stream on device %d", device);
        return -KVNODE_ENOMEM;
    }
    /* Non-blocking: never serialised with the legacy default stream that
     * other code in the process may use. */
    if ((e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        rc = cuda_fail(e, why, whylen, "cudaStreamCreateWithFlags");
        free(s);
        return rc;
    }
    if ((e = cudaEventCreateWithFlags(&s->event, cudaEventDisableTiming)) != cudaSuccess) {
        rc = cuda_fail(e, why, whylen, "cudaEventCreateWithFlags");
        cudaStreamDestroy(s->stream);
        free(s);
        return rc;
    }
    *out = &s->base;
    return 0;
}

static void cuda_stream_destroy(struct devmem_stream *bs)
{
    struct cuda_stream *s = (struct cuda_stream *)bs;

    cudaSetDevice(bs->device);
    cudaEventDestroy(s->event);
    cudaStreamDestroy(s->stream);
    (void)cudaGetLastError();
    free(s);
}

static int cuda_copy_async(struct devmem_stream *bs, void *dst, const void *src, size_t len,
                           char *why, size_t whylen)
{
    struct cuda_stream *s = (struct cuda_stream *)bs;
    cudaError_t e;
    char what[64];

    /* Default: the runtime infers the direction from the unified addresses. */
    if ((e = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, s->stream)) == cudaSuccess)
        return 0;
    snprintf(what, sizeof what, "cudaMemcpyAsync of %zu bytes", len);
    return cuda_fail(e, why, whylen, what);
}

static int cuda_stream_wait(struct devmem_stream *bs, char *why, size_t whylen)
{
    struct cuda_stream *s = (struct cuda_stream *)bs;
    cudaError_t e;
    int rc;

    /* The event must be recorded with its own device current. */
    if ((rc = set_device(bs->device, why, whylen)) < 0)
        return rc;
    if ((e = cudaEventRecord(s->event, s->stream)) != cudaSuccess)
        return cuda_fail(e, why, whylen, "cudaEventRecord");
    if ((e = cudaEventSynchronize(s->event)) != cudaSuccess)
        return cuda_fail(e, why, whylen, "cudaEventSynchronize");
    return 0;
}

static int cuda_copy_to_host(struct devmem *dm, int device, void *dst, const void *src, size_t len,
                             char *why, size_t whylen)
{
    cudaError_t e;
    char what[64];
    int rc;

    (void)dm;
    if ((rc = set_device(device, why, whylen)) < 0)
        return rc;
    if ((e = cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost)) == cudaSuccess)
        return 0;
    snprintf(what, sizeof what, "cudaMemcpy of %zu bytes to host", len);
    return cuda_fail(e, why, whylen, what);
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
};

int devmem_cuda_open(struct devmem **out, char *why, size_t whylen)
{
    struct devmem *dm;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* No driver at all reads as "insufficient driver": say both. */
        errmsg_set(why, whylen, "no usable GPU (cudaGetDeviceCount: %s%s)", cudaGetErrorString(e),
                   e == cudaErrorInsufficientDriver ? "; is the NVIDIA driver installed?" : "");
        return -KVNODE_EIO;
    }
    if (n <= 0) {
        errmsg_set(why, whylen, "no usable GPU (cudaGetDeviceCount: 0 devices)");
        return -KVNODE_EIO;
    }
    if (!(dm = calloc(1, sizeof(*dm)))) {
        errmsg_set(why, whylen, "devmem cuda: out of memory");
        return -KVNODE_ENOMEM;
    }
    dm->ops = &cuda_ops;
    /* Devices past the limit are left unused rather than refused. */
    dm->ndev = n > DEVMEM_MAX_DEVICES ? DEVMEM_MAX_DEVICES : n;
    *out = dm;
    return 0;
}

#endif /* KVNODE_HAVE_CUDA */
