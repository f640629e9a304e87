/* fakecuda_internal.h: the strict fake CUDA's private types, shared state and
 * the prototypes of every entry point it exports (no CUDA headers exist here:
 * the types below copy the layouts of cuda.h / cuda_runtime_api.h, 64-bit).
 *
 * Modules: fakecuda.c (configuration, fork, state-dir files, violations,
 * error strings, test helpers), fakecuda_ctx.c (devices, contexts, the
 * runtime's device and last error), fakecuda_mem.c (allocation files and
 * their holders, legacy IPC, host registration, the range table),
 * fakecuda_vmm.c (the VMM calls), fakecuda_stream.c (streams, events, the
 * copy rules), fakecuda_copy.c (the copy and memset entry points). */
#ifndef FAKECUDA_INTERNAL_H
#define FAKECUDA_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- ABI types (cuda.h / cuda_runtime_api.h) ---------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fc_ctx *CUcontext;
typedef struct fc_stream *CUstream;
typedef struct fc_event *CUevent;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
typedef struct CUipcMemHandle_st { char reserved[64]; } CUipcMemHandle;
typedef struct CUmemLocation_st { int type; int id; } CUmemLocation;
typedef struct CUmemAllocationProp_st {
    int type;                   /* CUmemAllocationType */
    int requestedHandleTypes;   /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st { CUmemLocation location; int flags; } CUmemAccessDesc;

typedef int cudaError_t;
typedef struct fc_stream *cudaStream_t;
typedef struct fc_event *cudaEvent_t;
typedef struct cudaIpcMemHandle_st { char reserved[64]; } cudaIpcMemHandle_t;

/* Driver and runtime share these numbers. */
enum {
    FC_SUCCESS = 0,
    FC_ERR_INVALID_VALUE = 1,
    FC_ERR_OUT_OF_MEMORY = 2,
    FC_ERR_NOT_INITIALIZED = 3,
    FC_ERR_INVALID_MEMCPY_DIRECTION = 21,   /* runtime only */
    FC_ERR_DEVICE_UNAVAILABLE = 46,
    FC_ERR_NO_DEVICE = 100,
    FC_ERR_INVALID_DEVICE = 101,
    FC_ERR_INVALID_CONTEXT = 201,
    FC_ERR_MAP_FAILED = 205,
    FC_ERR_ALREADY_MAPPED = 208,
    FC_ERR_INVALID_HANDLE = 400,
    FC_ERR_NOT_READY = 600,
    FC_ERR_ILLEGAL_ADDRESS = 700,
    FC_ERR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    FC_ERR_HOST_MEMORY_NOT_REGISTERED = 713,
    FC_ERR_NOT_SUPPORTED = 801,
    FC_ERR_UNKNOWN = 999,
};

#define FC_HANDLE_TYPE_POSIX_FD 1       /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
#define FC_ALLOCATION_TYPE_PINNED 1     /* CU_MEM_ALLOCATION_TYPE_PINNED */
#define FC_LOCATION_TYPE_DEVICE 1       /* CU_MEM_LOCATION_TYPE_DEVICE */
#define FC_ACCESS_READ 1                /* CU_MEM_ACCESS_FLAGS_PROT_READ */
#define FC_ACCESS_READWRITE 3           /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
#define FC_HOSTREG_PORTABLE 0x01        /* CU_MEMHOSTREGISTER_PORTABLE / cudaHostRegisterPortable */
#define FC_HOSTREG_DEVICEMAP 0x02
#define FC_HOSTREG_IOMEMORY 0x04
#define FC_HOSTREG_READ_ONLY 0x08
#define FC_STREAM_NON_BLOCKING 1        /* CU_STREAM_NON_BLOCKING / cudaStreamNonBlocking */
#define FC_MEMCPY_H2H 0
#define FC_MEMCPY_H2D 1
#define FC_MEMCPY_D2H 2
#define FC_MEMCPY_D2D 3
#define FC_MEMCPY_DEFAULT 4
#define FC_GRANULARITY (2u << 20)       /* what an H100 reports for VMM */
#define FC_MAX_DEVICES 16

/* ---- configuration (environment, read once per process) ---------------- */
struct fc_phys {
    unsigned domain, bus, dev, fn;
    int compute_mode;       /* 0 default, 2 prohibited, 3 exclusive process */
    bool mig;
};

struct fc_config {
    char dir[PATH_MAX - 64];
    int nphys;
    struct fc_phys phys[FC_MAX_DEVICES];
    int nvis;
    int vis[FC_MAX_DEVICES];        /* CUDA ordinal -> physical index */
    int busid_format;               /* 0 upper, 1 lower, 2 nvsmi */
    int driver_version;
    bool no_vmm;
    unsigned long long mem_bytes;
    unsigned long long pidns;
    unsigned delay_ms;
    char fail[1024];                /* ",name,name," */
};

/* A primary context: one per physical device and process. */
struct fc_ctx {
    int phys;
    unsigned retain;        /* cuDevicePrimaryCtxRetain count */
    bool rt_held;           /* the runtime made it (held for the process's life) */
    bool alive;             /* created and its ctx-<phys>-<pid> file written */
    bool sticky;            /* a sticky error hit it: every call fails with 700 */
};

struct fc_state {
    pthread_mutex_t lock;   /* every table below, streams included */
    pthread_cond_t cv;      /* stream progress */
    bool loaded;            /* config read */
    bool cfg_ok;
    bool drv_inited;        /* cuInit (or a runtime call) happened; __atomic access */
    unsigned gen;           /* bumped in a fork child: thread-local state is stale */
    struct fc_config cfg;
    struct fc_ctx ctx[FC_MAX_DEVICES];
    struct fc_stream *legacy[FC_MAX_DEVICES];
    /* Who this process is to the others: its pid as the state folder's
     * readers see it (the first NSpid of /proc/self/status, so a process in
     * a child PID namespace is named by its outer pid), and a key that stays
     * unique when pids are reused (pid.start-time), whose live-<key> file
     * this process holds a shared flock on while it lives. */
    int self_pid;
    char self_key[32];      /* "<pid>.<starttime>": at most 31 characters */
    int live_fd;
};

/* The fake's own functions stay inside the library: only the CUDA entry
 * points and the fakecuda_* test helpers are exported. */
#pragma GCC visibility push(hidden)

extern struct fc_state fc;

/* ---- fakecuda.c ---------------------------------------------------------- */
unsigned long long fc_hash(const char *s);
CUresult fc_enter(const char *name, bool need_init);
bool fc_load(void);
void fc_violation(const char *rule, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int fc_path(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int fc_dir_lock(void);
void fc_dir_unlock(int fd);
/* Whether the process with this key (see fc_state.self_key) still lives;
 * works across PID namespaces (it asks the live-<key> file's lock, not
 * kill). dir: the state folder. */
bool fc_key_alive(const char *dir, const char *key);
int fc_ordinal_phys(int ordinal);
int fc_phys_ordinal(int phys);
CUresult fc_ctx_activate(int phys, bool runtime);
bool fc_ctx_alive(struct fc_ctx *c);
CUresult fc_ctx_check(struct fc_ctx *c);
CUresult fc_drv_ctx(struct fc_ctx **out, const char *what);
CUresult fc_rt_ctx(struct fc_ctx **out);
struct fc_ctx *fc_current_ctx(void);
int fc_rt_device(void);
void fc_rt_set_device(int ordinal);
cudaError_t fc_rt_ret(cudaError_t e);
cudaError_t fc_rt_last_error(bool clear);
bool fc_vmm_supported(void);
unsigned long long fc_used_bytes(int phys);

/* ---- fakecuda_mem.c: memory tables (shared with fakecuda_vmm.c; fc.lock) -- */
enum { R_LEGACY = 1, R_IPC, R_RESERVE, R_MAP };

struct fc_alloc {
    char name[64];
    int phys;
    size_t size;
    int fd;
    bool vmm;
    bool handle_live;       /* VMM: not cuMemRelease'd yet */
    bool exportable;        /* VMM: created with the POSIX-fd handle type */
    unsigned maps;          /* VMM: cuMemMap'ed views */
    struct fc_alloc *next;
};

struct fc_range {
    uintptr_t base;
    size_t size;
    int kind;
    int phys;
    bool access;            /* R_MAP: cuMemSetAccess gave access */
    struct fc_alloc *alloc;
    struct fc_range *next;
};

struct fc_reg {
    uintptr_t base;
    size_t size;
    unsigned flags;
    unsigned devices;       /* bit per physical device it is pinned for */
    bool host_alloc;        /* cudaMallocHost / cudaHostAlloc memory (munmap'ed by cudaFreeHost) */
    struct fc_reg *next;
};

struct fc_hold {
    char name[64];
    unsigned refs;
    struct fc_hold *next;
};

struct mem_tables {
    struct fc_alloc *allocs;
    struct fc_range *ranges;
    struct fc_reg *regs;
    struct fc_hold *holds;
    unsigned seq;
    struct mem_tables *older;   /* a fork parent's tables, kept reachable */
};

extern struct mem_tables fc_mt;

CUresult fc_alloc_new(int phys, size_t size, bool vmm, struct fc_alloc **out);
void fc_alloc_drop(struct fc_alloc *a);
void fc_hold_acquire(const char *name);
struct fc_range *fc_range_add(uintptr_t base, size_t size, int kind, int phys, struct fc_alloc *a);
void fc_range_del(struct fc_range *r);
struct fc_range *fc_range_at(uintptr_t base, int kind);
size_t fc_overlap(uintptr_t a, size_t an, uintptr_t b, size_t bn);

/* ---- fakecuda_mem.c ------------------------------------------------------ */
/* Where [p, p+n) lies: 1 device memory (*phys set), 0 host, -1 partly device
 * or in memory not accessible yet. */
int fc_range_class(const void *p, size_t n, int *phys);
/* Host registration of [p, p+n) for physical device phys: 1 wholly inside
 * one, 0 none, -1 partly registered or across two registrations. */
int fc_host_pinned(const void *p, size_t n, int phys);
void fc_mem_fork_reset(void);

/* ---- fakecuda_stream.c --------------------------------------------------- */
CUresult fc_copy(void *dst, const void *src, size_t n, int kind, struct fc_stream *s, bool async,
                 struct fc_ctx *ctx, const char *what);
/* A memset of device memory queued on stream (NULL: the legacy stream). */
CUresult fc_memset(void *dst, int value, size_t n, struct fc_ctx *ctx, struct fc_stream *stream);
CUresult fc_stream_resolve(struct fc_stream *h, struct fc_ctx *ctx, struct fc_stream **out);
void fc_device_sync(int phys);
void fc_stream_fork_reset(void);

/* Entry-point prologues: the context a driver call needs (201 without
 * one), or the runtime's (created on first need). */
#define DRV_CTX(name)                                         \
    struct fc_ctx *c;                                         \
    CUresult rc = fc_enter(name, true);                       \
    if (rc == FC_SUCCESS)                                     \
        rc = fc_drv_ctx(&c, name);                            \
    if (rc)                                                   \
        return rc

#define RT_CTX(name)                                          \
    struct fc_ctx *c;                                         \
    CUresult rc = fc_enter(name, false);                      \
    if (rc == FC_SUCCESS)                                     \
        rc = fc_rt_ctx(&c);                                   \
    if (rc)                                                   \
        return fc_rt_ret(rc)

#pragma GCC visibility pop

/* ---- driver entry points (cuda.h) --------------------------------------- */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev);
CUresult cuDeviceGetPCIBusId(char *busid, int len, CUdevice dev);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle, int type);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuStreamQuery(CUstream stream);
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n);
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream);
CUresult cuEventCreate(CUevent *event, unsigned int flags);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventSynchronize(CUevent event);
CUresult cuEventQuery(CUevent event);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuGetErrorString(CUresult error, const char **str);
CUresult cuGetErrorName(CUresult error, const char **str);

/* ---- runtime entry points (cuda_runtime_api.h) -------------------------- */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceGetPCIBusId(char *busid, int len, int device);
cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device);
cudaError_t cudaGetDeviceProperties(void *prop, int device);     /* struct cudaDeviceProp * */
cudaError_t cudaGetDeviceProperties_v2(void *prop, int device);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
struct cudaPointerAttributes {
    int type;               /* cudaMemoryType: 0 unregistered, 1 host, 2 device */
    int device;
    void *devicePointer;
    void *hostPointer;
};
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t n);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t n, cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr);
cudaError_t cudaIpcOpenMemHandle(void **ptr, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void *ptr);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);

/* ---- test-only helpers (fakecuda.h declares them for tests) ------------- */
int fakecuda_violations(void);
int fakecuda_violations_of(const char *rule);
int fakecuda_context_count(pid_t pid, int physical);
int fakecuda_make_sticky(int physical);
int fakecuda_set_fail(const char *names);

#endif
