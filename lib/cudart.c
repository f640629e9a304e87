/* cudart: the CUDA runtime found at run time (see cudart.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudart.h"

/* Sonames to look for, newest first; "libcudart.so" is the development
 * link that points at whichever is installed. */
static const char *const cudart_names[] = {
    "libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
};
#define CUDART_NNAMES (sizeof cudart_names / sizeof cudart_names[0])

static const struct cudart *cudart_override;

void cudart_set_override(const struct cudart *rt)
{
    cudart_override = rt;
}

/* Take every entry point from handle h; 0, or -1 with why naming the first
 * missing one. */
static int cudart_bind(void *h, const char *name, struct cudart *rt, char *why, size_t whylen)
{
    static const char *const syms[] = {
        "cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle", "cudaHostRegister",
        "cudaHostUnregister", "cudaMemcpy", "cudaSetDevice", "cudaGetDevice",
        "cudaGetErrorString", "cudaGetLastError", "cudaMemcpyAsync",
        "cudaStreamCreateWithFlags", "cudaStreamDestroy", "cudaStreamSynchronize",
    };
    void *f[sizeof syms / sizeof syms[0]];
    size_t i;

    for (i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        f[i] = dlsym(h, syms[i]);
        if (!f[i]) {
            snprintf(why, whylen, "CUDA runtime %s lacks %s", name, syms[i]);
            return -1;
        }
    }
    /* POSIX guarantees dlsym's object pointers convert to function pointers. */
    rt->ipc_open = (int (*)(void **, cudart_ipc_handle, unsigned int))f[0];
    rt->ipc_close = (int (*)(void *))f[1];
    rt->host_register = (int (*)(void *, size_t, unsigned int))f[2];
    rt->host_unregister = (int (*)(void *))f[3];
    rt->copy = (int (*)(void *, const void *, size_t, int))f[4];
    rt->set_device = (int (*)(int))f[5];
    rt->get_device = (int (*)(int *))f[6];
    rt->error_string = (const char *(*)(int))f[7];
    rt->get_last_error = (int (*)(void))f[8];
    rt->copy_async = (int (*)(void *, const void *, size_t, int, void *))f[9];
    rt->stream_create = (int (*)(void **, unsigned int))f[10];
    rt->stream_destroy = (int (*)(void *))f[11];
    rt->stream_sync = (int (*)(void *))f[12];
    /* Optional: without it the daemon matches the GPU by ordinal. */
    void *bus = dlsym(h, "cudaDeviceGetPCIBusId");
    rt->pci_bus_id = bus ? (int (*)(char *, int, int))bus : NULL;
    snprintf(rt->lib, sizeof rt->lib, "%s", name);
    return 0;
}

int cudart_load(struct cudart *rt, char *why, size_t whylen)
{
    static const int modes[2] = { RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL };
    char missing[160] = "";
    size_t m, i;

    memset(rt, 0, sizeof *rt);
    if (cudart_override) {
        if (!cudart_override->ipc_open) {
            snprintf(why, whylen, "no CUDA runtime (libcudart not found)");
            return -1;
        }
        *rt = *cudart_override;
        return 0;
    }
    /* The engine's own runtime first: same instance, same contexts. */
    for (m = 0; m < 2; m++) {
        for (i = 0; i < CUDART_NNAMES; i++) {
            void *h = dlopen(cudart_names[i], modes[m]);

            if (!h)
                continue;
            if (cudart_bind(h, cudart_names[i], rt, missing, sizeof missing) == 0) {
                (void)dlerror();    /* no stale loader error for the engine's dlerror() */
                return 0;
            }
            /* Never dlclose: the handle may be the engine's runtime, and
             * unloading CUDA is not safe. The reference is harmless. */
        }
    }
    (void)dlerror();
    if (missing[0])
        snprintf(why, whylen, "no usable CUDA runtime (%s)", missing);
    else
        snprintf(why, whylen, "no CUDA runtime (libcudart not found: tried libcudart.so, "
                 "libcudart.so.13, libcudart.so.12, libcudart.so.11.0)");
    memset(rt, 0, sizeof *rt);
    return -1;
}

const char *cudart_error_text(const struct cudart *rt, int err, char *buf, size_t len)
{
    const char *s = rt->error_string ? rt->error_string(err) : NULL;

    snprintf(buf, len, "%s (cudaError %d)", s && *s ? s : "unknown error", err);
    return buf;
}

/* --- driver ---------------------------------------------------------------- */

int cudrv_load(struct cudrv *d, char *why, size_t whylen)
{
    static const char *const syms[] = {
        "cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2",
        "cuMemGetAllocationGranularity", "cuMemImportFromShareableHandle", "cuMemAddressReserve",
        "cuMemAddressFree", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemRelease",
    };
    void *f[sizeof syms / sizeof syms[0]];
    void *h;
    size_t i;
    int err;

    memset(d, 0, sizeof *d);
    if (cudart_override) {
        snprintf(why, whylen, "no CUDA driver (a test runtime is in use)");
        return -1;
    }
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    (void)dlerror();
    if (!h) {
        snprintf(why, whylen, "no CUDA driver (libcuda.so.1 not found)");
        return -1;
    }
    /* Never dlclose: the engine's runtime uses the same driver. */
    for (i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        f[i] = dlsym(h, syms[i]);
        if (!f[i]) {
            (void)dlerror();
            snprintf(why, whylen, "CUDA driver libcuda.so.1 lacks %s", syms[i]);
            return -1;
        }
    }
    d->init = (int (*)(unsigned int))f[0];
    d->driver_version = (int (*)(int *))f[1];
    d->device_get = (int (*)(int *, int))f[2];
    d->primary_ctx_retain = (int (*)(void **, int))f[3];
    d->primary_ctx_release = (int (*)(int))f[4];
    d->ctx_push = (int (*)(void *))f[5];
    d->ctx_pop = (int (*)(void **))f[6];
    d->granularity = (int (*)(size_t *, const struct cudrv_alloc_prop *, int))f[7];
    d->import = (int (*)(cudrv_handle *, void *, int))f[8];
    d->address_reserve = (int (*)(cudrv_ptr *, size_t, size_t, cudrv_ptr, unsigned long long))f[9];
    d->address_free = (int (*)(cudrv_ptr, size_t))f[10];
    d->map = (int (*)(cudrv_ptr, size_t, size_t, cudrv_handle, unsigned long long))f[11];
    d->unmap = (int (*)(cudrv_ptr, size_t))f[12];
    d->set_access = (int (*)(cudrv_ptr, size_t, const struct cudrv_access_desc *, size_t))f[13];
    d->release = (int (*)(cudrv_handle))f[14];
    void *es = dlsym(h, "cuGetErrorString");
    d->error_string = es ? (int (*)(int, const char **))es : NULL;
    (void)dlerror();
    err = d->driver_version(&d->version);
    if (err != CUDRV_SUCCESS) {
        snprintf(why, whylen, "CUDA driver: cuDriverGetVersion failed (CUresult %d)", err);
    } else if (d->version < CUDRV_VMM_MIN_VERSION) {
        snprintf(why, whylen, "CUDA driver %d.%d is older than 10.2 (no POSIX-fd memory "
                 "handles)", d->version / 1000, d->version % 1000 / 10);
        err = -1;
    } else if ((err = d->init(0)) != CUDRV_SUCCESS) {
        char text[128];
        snprintf(why, whylen, "CUDA driver: cuInit: %s", cudrv_error_text(d, err, text,
                                                                          sizeof text));
    }
    if (err != CUDRV_SUCCESS) {
        memset(d, 0, sizeof *d);
        return -1;
    }
    return 0;
}

const char *cudrv_error_text(const struct cudrv *d, int err, char *buf, size_t len)
{
    const char *s = NULL;

    if (!d->error_string || d->error_string(err, &s) != CUDRV_SUCCESS)
        s = NULL;
    snprintf(buf, len, "%s (CUresult %d)", s && *s ? s : "unknown error", err);
    return buf;
}

/* The handles this process has open, with how many connections use each. */
struct cudart_ipc_open {
    cudart_ipc_handle handle;
    void *ptr;
    unsigned refs;
    struct cudart_ipc_open *next;
};
static struct cudart_ipc_open *cudart_ipc_opens;
static pthread_mutex_t cudart_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

int cudart_ipc_acquire(const struct cudart *rt, const cudart_ipc_handle *h, unsigned int flags,
                       void **ptr)
{
    struct cudart_ipc_open *o;
    int err = CUDART_SUCCESS;

    *ptr = NULL;
    pthread_mutex_lock(&cudart_ipc_lock);
    for (o = cudart_ipc_opens; o; o = o->next)
        if (memcmp(o->handle.reserved, h->reserved, sizeof h->reserved) == 0)
            break;
    if (o) {
        o->refs++;
        *ptr = o->ptr;
    } else if ((o = calloc(1, sizeof *o)) == NULL) {
        err = 2;   /* cudaErrorMemoryAllocation */
    } else if ((err = rt->ipc_open(&o->ptr, *h, flags)) != CUDART_SUCCESS || !o->ptr) {
        free(o);
    } else {
        o->handle = *h;
        o->refs = 1;
        o->next = cudart_ipc_opens;
        cudart_ipc_opens = o;
        *ptr = o->ptr;
    }
    pthread_mutex_unlock(&cudart_ipc_lock);
    return err;
}

int cudart_ipc_release(const struct cudart *rt, void *ptr)
{
    struct cudart_ipc_open **pp, *o = NULL;
    int err = CUDART_SUCCESS;

    pthread_mutex_lock(&cudart_ipc_lock);
    for (pp = &cudart_ipc_opens; *pp; pp = &(*pp)->next) {
        if ((*pp)->ptr == ptr) {
            o = *pp;
            if (--o->refs == 0)
                *pp = o->next;
            break;
        }
    }
    if (o && o->refs == 0) {
        err = rt->ipc_close(ptr);
        free(o);
    }
    pthread_mutex_unlock(&cudart_ipc_lock);
    return err;
}
