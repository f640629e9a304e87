/* cudart: the few CUDA runtime calls libkvnode makes, found at run time.
 *
 * libkvnode never links the CUDA runtime: it must build and work on machines
 * without CUDA. A client that declares a CUDA device looks for the engine's
 * own libcudart (already loaded: RTLD_NOLOAD), else loads one by its usual
 * sonames, and takes the functions it needs with dlsym. The prototypes below
 * are our own, ABI-compatible with cuda_runtime_api.h (cudaError_t and
 * cudaMemcpyKind are int-sized enums; cudaIpcMemHandle_t is a 64-byte struct
 * passed by value). A loaded runtime is never unloaded (CUDA does not
 * survive dlclose well, and the engine may share it).
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
    CUDART_MEMCPY_DEFAULT        = 4,       /* cudaMemcpyDefault */
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
    char lib[32];                           /* the library it came from, for messages */
};

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
