/* gpu_check_cuda: the CUDA calls kvnode-gpu-check makes, found at run time.
 *
 * The checker is built without a CUDA toolkit: like libkvnode (lib/cudart.c)
 * it dlopens the runtime by its sonames (libcudart.so, .so.13, .so.12,
 * .so.11.0) and, for a few figures only the driver gives (device name,
 * memory in use), libcuda.so.1. Loading the runtime first means libkvnode's
 * RTLD_NOLOAD lookup finds this same instance, as inside an engine. The
 * prototypes are our own, ABI-compatible with cuda_runtime_api.h / cuda.h. */
#ifndef KVNODE_GPU_CHECK_CUDA_H
#define KVNODE_GPU_CHECK_CUDA_H

#include <stddef.h>

enum {
    GC_SUCCESS = 0,                 /* cudaSuccess */
    GC_NOT_READY = 600,             /* cudaErrorNotReady */
    GC_H2D = 1, GC_D2H = 2, GC_D2D = 3, GC_DEFAULT = 4,     /* cudaMemcpyKind */
    GC_STREAM_NON_BLOCKING = 1,     /* cudaStreamNonBlocking */
    GC_ATTR_COMPUTE_MODE = 20,      /* cudaDevAttrComputeMode */
    GC_HOST_REGISTER_PORTABLE = 1,
};

struct gc_cuda {
    int (*get_device_count)(int *);
    int (*set_device)(int);
    int (*pci_bus_id)(char *, int, int);
    int (*device_attr)(int *, int, int);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*memcpy_async)(void *, const void *, size_t, int, void *);
    int (*memset_)(void *, int, size_t);
    int (*stream_create)(void **, unsigned);        /* cudaStreamCreateWithFlags */
    int (*stream_destroy)(void *);
    int (*stream_sync)(void *);
    int (*stream_query)(void *);
    int (*device_sync)(void);
    int (*driver_version)(int *);
    int (*runtime_version)(int *);
    const char *(*error_string)(int);
    int (*get_last_error)(void);
    char lib[32];
    /* driver (libcuda.so.1), each may be NULL */
    int (*cu_init)(unsigned);
    int (*cu_device_get)(int *, int);
    int (*cu_device_name)(char *, int, int);
    int (*cu_mem_info)(size_t *, size_t *);         /* cuMemGetInfo_v2: current context */
};

extern struct gc_cuda gc;

/* Load the runtime (required) and the driver calls (optional). 0, or -1
 * with why set. */
int gc_cuda_load(char *why, size_t whylen);
/* "<message> (cudaError N)" (static buffer, per thread). */
const char *gc_err(int err);

#endif
