/* cudadrv: the part of the CUDA driver API kvnoded uses, loaded at run time
 * with dlopen("libcuda.so.1"), so kvnoded links no CUDA library, needs no
 * toolkit to build, and runs on whatever driver the machine has (a build
 * never ties it to a newer runtime than the driver). Owns the types and
 * prototypes (as cuda.h declares them; no CUDA header is included), the
 * table of entry points and the version check. The backend that uses it is
 * devmem_cuda.c.
 *
 * Any thread (the table is filled once and only read afterwards). */
#ifndef KVNODE_CUDADRV_H
#define KVNODE_CUDADRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --- types, as cuda.h has them ------------------------------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CU_IPC_HANDLE_SIZE 64
typedef struct { char reserved[CU_IPC_HANDLE_SIZE]; } CUipcMemHandle;

typedef struct {
    int type;                       /* CUmemLocationType */
    int id;
} CUmemLocation;

typedef struct {
    int type;                       /* CUmemAllocationType */
    int requestedHandleTypes;       /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct {
    CUmemLocation location;
    int flags;                      /* CUmemAccess_flags */
} CUmemAccessDesc;

_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp as in cuda.h");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc as in cuda.h");

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_NOT_READY = 600,
    /* The context is unusable for the life of the process (sticky). */
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_LAUNCH_FAILED = 719,
};

enum {
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
};

enum {
    CU_COMPUTEMODE_DEFAULT = 0,
    CU_COMPUTEMODE_PROHIBITED = 2,
    CU_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
};

#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2

/* The oldest driver kvnoded runs on (cuDriverGetVersion: 1000 * major + 10 *
 * minor), and the first with the virtual-memory API (VMM, POSIX-fd export):
 * older drivers lend HBM through legacy IPC handles only. */
#define CUDADRV_MIN_VERSION 11000
#define CUDADRV_VMM_VERSION 10020

/* --- the table ---------------------------------------------------------------- */

struct cudadrv {
    void *lib;                      /* dlopen handle */
    int   version;                  /* cuDriverGetVersion */
    CUresult (*cuInit)(unsigned flags);
    CUresult (*cuDriverGetVersion)(int *version);
    CUresult (*cuGetErrorString)(CUresult e, const char **s);
    CUresult (*cuGetErrorName)(CUresult e, const char **s);
    CUresult (*cuDeviceGetCount)(int *n);
    CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*cuDeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*cuDeviceGetAttribute)(int *value, int attrib, CUdevice dev);
    CUresult (*cuDeviceGetPCIBusId)(char *bus_id, int len, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);               /* _v2 */
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuMemAlloc)(CUdeviceptr *p, size_t bytes);              /* _v2 */
    CUresult (*cuMemFree)(CUdeviceptr p);                              /* _v2 */
    CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *h, CUdeviceptr p);
    CUresult (*cuMemHostRegister)(void *p, size_t bytes, unsigned flags);   /* _v2 */
    CUresult (*cuMemHostUnregister)(void *p);
    CUresult (*cuStreamCreate)(CUstream *s, unsigned flags);
    CUresult (*cuStreamDestroy)(CUstream s);                           /* _v2 */
    CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);     /* _v2 */
    CUresult (*cuEventCreate)(CUevent *e, unsigned flags);
    CUresult (*cuEventRecord)(CUevent e, CUstream s);
    CUresult (*cuEventSynchronize)(CUevent e);
    CUresult (*cuEventDestroy)(CUevent e);                             /* _v2 */
    /* The virtual-memory API (NULL when the driver lacks it: legacy only). */
    CUresult (*cuMemGetAllocationGranularity)(size_t *g, const CUmemAllocationProp *prop, int option);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *h, size_t bytes, const CUmemAllocationProp *prop,
                            unsigned long long flags);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle h);
    CUresult (*cuMemExportToShareableHandle)(void *shareable, CUmemGenericAllocationHandle h, int type,
                                             unsigned long long flags);
    CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *h, void *os_handle, int type);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *p, size_t bytes, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags);
    CUresult (*cuMemAddressFree)(CUdeviceptr p, size_t bytes);
    CUresult (*cuMemMap)(CUdeviceptr p, size_t bytes, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags);
    CUresult (*cuMemUnmap)(CUdeviceptr p, size_t bytes);
    CUresult (*cuMemSetAccess)(CUdeviceptr p, size_t bytes, const CUmemAccessDesc *desc, size_t count);
    bool  has_vmm;                  /* every VMM entry point found and the driver >= CUDADRV_VMM_VERSION */
};

/* Load the driver from `soname` (NULL: "libcuda.so.1"), resolve every entry
 * point and cuInit it. 0; or -1 with why naming what is missing: the
 * library (dlerror), the first entry point not found, or a driver older than
 * CUDADRV_MIN_VERSION (both versions named); cuInit's error otherwise. The
 * VMM entry points are optional (has_vmm says whether all were found). */
int  cudadrv_load(struct cudadrv *api, const char *soname, char *why, size_t whylen);
void cudadrv_unload(struct cudadrv *api);
/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or "CUDA error N" when the
 * driver cannot name it. */
const char *cudadrv_error(const struct cudadrv *api, CUresult e, char *buf, size_t len);
/* Errors after which the context is unusable for the life of the process
 * (an illegal address, a hardware stack error, ... ): the device is down. */
bool cudadrv_is_sticky(CUresult e);

#endif
