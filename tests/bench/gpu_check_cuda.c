/* gpu_check_cuda: the runtime and driver calls of kvnode-gpu-check (see the header). */
#include "gpu_check_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

struct gc_cuda gc;

static const char *const runtime_names[] = {
    "libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
};

/* dlsym into a function pointer (POSIX guarantees the conversion). */
#define BIND(h, field, name)                                   \
    do {                                                       \
        void *f_ = dlsym((h), (name));                         \
        if (!f_) {                                             \
            missing = (name);                                  \
            goto next;                                         \
        }                                                      \
        memcpy(&gc.field, &f_, sizeof f_);                     \
    } while (0)

#define BIND_OPT(h, field, name)                               \
    do {                                                       \
        void *f_ = (h) ? dlsym((h), (name)) : NULL;            \
        memcpy(&gc.field, &f_, sizeof f_);                     \
    } while (0)

int gc_cuda_load(char *why, size_t whylen)
{
    const char *missing = NULL, *from = NULL;

    memset(&gc, 0, sizeof gc);
    for (size_t i = 0; i < sizeof runtime_names / sizeof runtime_names[0]; i++) {
        void *h = dlopen(runtime_names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h)
            continue;
        from = runtime_names[i];
        BIND(h, get_device_count, "cudaGetDeviceCount");
        BIND(h, set_device, "cudaSetDevice");
        BIND(h, pci_bus_id, "cudaDeviceGetPCIBusId");
        BIND(h, device_attr, "cudaDeviceGetAttribute");
        BIND(h, malloc_, "cudaMalloc");
        BIND(h, free_, "cudaFree");
        BIND(h, memcpy_, "cudaMemcpy");
        BIND(h, memcpy_async, "cudaMemcpyAsync");
        BIND(h, memset_, "cudaMemset");
        BIND(h, stream_create, "cudaStreamCreateWithFlags");
        BIND(h, stream_destroy, "cudaStreamDestroy");
        BIND(h, stream_sync, "cudaStreamSynchronize");
        BIND(h, stream_query, "cudaStreamQuery");
        BIND(h, device_sync, "cudaDeviceSynchronize");
        BIND(h, driver_version, "cudaDriverGetVersion");
        BIND(h, runtime_version, "cudaRuntimeGetVersion");
        BIND(h, error_string, "cudaGetErrorString");
        BIND(h, get_last_error, "cudaGetLastError");
        snprintf(gc.lib, sizeof gc.lib, "%s", runtime_names[i]);
        void *d = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        BIND_OPT(d, cu_init, "cuInit");
        BIND_OPT(d, cu_device_get, "cuDeviceGet");
        BIND_OPT(d, cu_device_name, "cuDeviceGetName");
        BIND_OPT(d, cu_mem_info, "cuMemGetInfo_v2");
        return 0;
next:
        continue;   /* never dlclose a CUDA runtime */
    }
    if (missing)
        snprintf(why, whylen, "CUDA runtime %s lacks %s", from, missing);
    else
        snprintf(why, whylen, "no CUDA runtime (libcudart.so, .so.13, .so.12, .so.11.0 not found "
                 "on the library path)");
    memset(&gc, 0, sizeof gc);
    return -1;
}

const char *gc_err(int err)
{
    static _Thread_local char buf[160];
    const char *s = gc.error_string ? gc.error_string(err) : NULL;

    snprintf(buf, sizeof buf, "%s (cudaError %d)", s && *s ? s : "unknown error", err);
    return buf;
}
