/* cudart: the few CUDA runtime and driver calls libkvnode makes, found at
 * run time.
 *
 * libkvnode never links CUDA: it must build and work on machines without
 * it. A client that declares a CUDA device looks for the engine's own
 * libcudart (already loaded: RTLD_NOLOAD), else loads one by its usual
 * sonames, and takes the functions it needs with dlsym. The prototypes below
 * are our own, ABI-compatible with cuda_runtime_api.h (cudaError_t and
 * cudaMemcpyKind are int-sized enums; cudaIpcMemHandle_t is a 64-byte struct
 * passed by value; cudaStream_t is a pointer). A loaded runtime is never
 * unloaded (CUDA does not survive dlclose well, and the engine may share it).
 *
 * The driver half (struct cudrv, libcuda.so.1) is only the virtual-memory
 * calls that import and map an HBM arena lent as a POSIX-fd shareable handle
 * (Arena.cuda_vmm, which crosses PID namespaces where legacy IPC does not),
 * with the primary-context calls that make the runtime's context current
 * for them; prototypes as in cuda.h (CUresult, CUdevice and the enums are
 * int-sized, CUdeviceptr and CUmemGenericAllocationHandle 64-bit).
 *
 * Internal to libkvnode: nothing here is exported from libkvnode.so. */
#ifndef KVNODE_CUDART_H
#define KVNODE_CUDART_H

#include <stddef.h>

#define CUDART_IPC_HANDLE_BYTES 64          /* CUDA_IPC_HANDLE_SIZE */

typedef struct cudart_ipc_handle {          /* cudaIpcMemHandle_t */
    char reserved[CUDART_IPC_HANDLE_BYTES];
} cudart_ipc_handle;

enum {
    CUDART_SUCCESS               = 0,       /* cudaSuccess */
    CUDART_IPC_LAZY_PEER_ACCESS  = 1,       /* cudaIpcMemLazyEnablePeerAccess */
    CUDART_HOST_REGISTER_PORTABLE = 1,      /* cudaHostRegisterPortable */
    CUDART_HOST_REGISTER_READ_ONLY = 8,     /* cudaHostRegisterReadOnly (CUDA 11.1) */
    CUDART_MEMCPY_DEFAULT        = 4,       /* cudaMemcpyDefault */
    CUDART_STREAM_NON_BLOCKING   = 1,       /* cudaStreamNonBlocking */
};

/* The runtime's entry points (each returns a cudaError_t). */
struct cudart {
    int (*ipc_open)(void **dev_ptr, cudart_ipc_handle handle, unsigned int flags);
    int (*ipc_close)(void *dev_ptr);
    int (*host_register)(void *ptr, size_t size, unsigned int flags);
    int (*host_unregister)(void *ptr);
    int (*copy)(void *dst, const void *src, size_t count, int kind);     /* cudaMemcpy */
    int (*set_device)(int device);
    int (*get_device)(int *device);
    const char *(*error_string)(int err);
    int (*get_last_error)(void);            /* cudaGetLastError: clears a failed call's error */
    int (*pci_bus_id)(char *buf, int len, int device);  /* cudaDeviceGetPCIBusId; NULL: absent */
    /* Streams: the copies of the batch calls are queued on one and it is
     * synchronised before their lease ends (cudaStream_t is void *). */
    int (*copy_async)(void *dst, const void *src, size_t count, int kind, void *stream);
    int (*stream_create)(void **stream, unsigned int flags);    /* cudaStreamCreateWithFlags */
    int (*stream_destroy)(void *stream);
    int (*stream_sync)(void *stream);       /* cudaStreamSynchronize */
    char lib[32];                           /* the library it came from, for messages */
};

/* --- driver: CUDA virtual memory (VMM) import ------------------------------- */

typedef unsigned long long cudrv_ptr;       /* CUdeviceptr */
typedef unsigned long long cudrv_handle;    /* CUmemGenericAllocationHandle */

enum {
    CUDRV_SUCCESS                 = 0,      /* CUDA_SUCCESS */
    CUDRV_VMM_MIN_VERSION         = 10020,  /* POSIX-fd shareable handles: CUDA 10.2 */
    CUDRV_HANDLE_POSIX_FD         = 1,      /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
    CUDRV_LOCATION_DEVICE         = 1,      /* CU_MEM_LOCATION_TYPE_DEVICE */
    CUDRV_ALLOCATION_PINNED       = 1,      /* CU_MEM_ALLOCATION_TYPE_PINNED */
    CUDRV_ACCESS_READWRITE        = 3,      /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
    CUDRV_GRANULARITY_MINIMUM     = 0,      /* CU_MEM_ALLOC_GRANULARITY_MINIMUM */
};

struct cudrv_location { int type; int id; };            /* CUmemLocation */
struct cudrv_alloc_prop {                               /* CUmemAllocationProp */
    int type;
    int requested_handle_types;
    struct cudrv_location location;
    void *win32_handle_meta_data;
    struct {
        unsigned char compression_type;
        unsigned char gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } alloc_flags;
};
struct cudrv_access_desc {                              /* CUmemAccessDesc */
    struct cudrv_location location;
    int flags;
};

/* The driver's entry points (each returns a CUresult). */
struct cudrv {
    int (*init)(unsigned int flags);                                    /* cuInit */
    int (*driver_version)(int *version);                                /* cuDriverGetVersion */
    int (*device_get)(int *device, int ordinal);                        /* cuDeviceGet */
    int (*primary_ctx_retain)(void **ctx, int device);                  /* cuDevicePrimaryCtxRetain */
    int (*primary_ctx_release)(int device);                 /* cuDevicePrimaryCtxRelease_v2 */
    int (*ctx_push)(void *ctx);                             /* cuCtxPushCurrent_v2 */
    int (*ctx_pop)(void **ctx);                             /* cuCtxPopCurrent_v2 */
    int (*granularity)(size_t *granularity, const struct cudrv_alloc_prop *prop, int option);
    int (*import)(cudrv_handle *handle, void *os_handle, int type);     /* ..FromShareableHandle */
    int (*address_reserve)(cudrv_ptr *ptr, size_t size, size_t alignment, cudrv_ptr addr,
                           unsigned long long flags);
    int (*address_free)(cudrv_ptr ptr, size_t size);
    int (*map)(cudrv_ptr ptr, size_t size, size_t offset, cudrv_handle handle,
               unsigned long long flags);
    int (*unmap)(cudrv_ptr ptr, size_t size);
    int (*set_access)(cudrv_ptr ptr, size_t size, const struct cudrv_access_desc *desc,
                      size_t count);
    int (*release)(cudrv_handle handle);                                /* cuMemRelease */
    int (*error_string)(int err, const char **str);     /* cuGetErrorString; NULL: absent */
    int version;                            /* cuDriverGetVersion, e.g. 12080 */
};

/* Fill *d from libcuda.so.1 (the process's, else loaded): every entry point
 * above, cuInit(0) done, and a driver of at least CUDA 10.2. 0, or -1 with
 * why naming what is missing ("no CUDA driver (libcuda.so.1 not found)",
 * "CUDA driver libcuda.so.1 lacks cuMemMap", "CUDA driver 10.1 is older than
 * 10.2 ..."). Fails while a test override of the runtime is set. */
int cudrv_load(struct cudrv *d, char *why, size_t whylen);

/* "<driver's message> (CUresult <n>)" in buf. */
const char *cudrv_error_text(const struct cudrv *d, int err, char *buf, size_t len);

/* Fill *rt from the process's CUDA runtime: one already loaded under the
 * names libcudart.so, .so.13, .so.12, .so.11.0, else the first of those
 * that loads and has every function. 0, or -1 with why set ("no CUDA
 * runtime (libcudart not found ...)" or which function is missing). */
int cudart_load(struct cudart *rt, char *why, size_t whylen);

/* "<runtime's message> (cudaError <n>)" in buf. */
const char *cudart_error_text(const struct cudart *rt, int err, char *buf, size_t len);

/* Open an IPC handle once per process. CUDA lets a context open a given
 * handle once, so several connections of one process (threads, TP ranks
 * on one device) share the opening: a handle already open returns the same
 * pointer with its count raised; release drops the count and closes the
 * handle at zero. Thread-safe. Both return a cudaError_t (CUDART_SUCCESS). */
int cudart_ipc_acquire(const struct cudart *rt, const cudart_ipc_handle *h, unsigned int flags,
                       void **ptr);
int cudart_ipc_release(const struct cudart *rt, void *ptr);

/* Tests only: while set, cudart_load copies *rt instead of looking for a
 * runtime, or (rt->ipc_open == NULL) fails as if none were installed.
 * NULL restores the normal search. Not thread-safe. */
void cudart_set_override(const struct cudart *rt);

#endif
