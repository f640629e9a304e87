/* cudadrv: see cudadrv.h.
 *
 * The versioned names (cuMemAlloc_v2, ...) are the ones cuda.h maps the
 * plain names to for a 64-bit build; libcuda exports both, and the plain
 * ones are the old ABI (32-bit sizes), so only the versioned ones are
 * looked up where there are two. */
#include "gpu/cudadrv.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "core/errmsg.h"

#define CUDADRV_SONAME "libcuda.so.1"

/* One entry of the table: its field, the exported name, required or not. */
struct cudadrv_sym {
    size_t offset;
    const char *name;
    bool vmm;
};

#define SYM(field, name) { offsetof(struct cudadrv, field), name, false }
#define VMM(field) { offsetof(struct cudadrv, field), #field, true }

static const struct cudadrv_sym cudadrv_syms[] = {
    SYM(cuInit, "cuInit"),
    SYM(cuDriverGetVersion, "cuDriverGetVersion"),
    SYM(cuGetErrorString, "cuGetErrorString"),
    SYM(cuGetErrorName, "cuGetErrorName"),
    SYM(cuDeviceGetCount, "cuDeviceGetCount"),
    SYM(cuDeviceGet, "cuDeviceGet"),
    SYM(cuDeviceGetName, "cuDeviceGetName"),
    SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    SYM(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"),
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent"),
    SYM(cuMemAlloc, "cuMemAlloc_v2"),
    SYM(cuMemFree, "cuMemFree_v2"),
    SYM(cuIpcGetMemHandle, "cuIpcGetMemHandle"),
    SYM(cuMemHostRegister, "cuMemHostRegister_v2"),
    SYM(cuMemHostUnregister, "cuMemHostUnregister"),
    SYM(cuStreamCreate, "cuStreamCreate"),
    SYM(cuStreamDestroy, "cuStreamDestroy_v2"),
    SYM(cuMemcpyAsync, "cuMemcpyAsync"),
    SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    SYM(cuEventCreate, "cuEventCreate"),
    SYM(cuEventRecord, "cuEventRecord"),
    SYM(cuEventSynchronize, "cuEventSynchronize"),
    SYM(cuEventDestroy, "cuEventDestroy_v2"),
    VMM(cuMemGetAllocationGranularity),
    VMM(cuMemCreate),
    VMM(cuMemRelease),
    VMM(cuMemExportToShareableHandle),
    VMM(cuMemImportFromShareableHandle),
    VMM(cuMemAddressReserve),
    VMM(cuMemAddressFree),
    VMM(cuMemMap),
    VMM(cuMemUnmap),
    VMM(cuMemSetAccess),
};

static void format_version(int v, char *buf, size_t len)
{
    snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10);
}

int cudadrv_load(struct cudadrv *api, const char *soname, char *why, size_t whylen)
{
    const char *so = soname ? soname : CUDADRV_SONAME;
    const char *missing = NULL;
    char have[16], need[16], ebuf[96];
    CUresult e = CUDA_SUCCESS;

    memset(api, 0, sizeof *api);
    dlerror();
    if (!(api->lib = dlopen(so, RTLD_NOW | RTLD_LOCAL))) {
        const char *d = dlerror();
        errmsg_set(why, whylen, "cannot load the CUDA driver (%s: %s); is the NVIDIA driver installed?", so,
                   d ? d : "not found");
        return -1;
    }
    api->has_vmm = true;
    for (size_t i = 0; i < sizeof cudadrv_syms / sizeof cudadrv_syms[0]; i++) {
        const struct cudadrv_sym *s = &cudadrv_syms[i];
        void *f = dlsym(api->lib, s->name);
        if (!f && s->vmm)
            api->has_vmm = false;
        else if (!f && !missing)
            missing = s->name;
        else if (f)
            memcpy((char *)api + s->offset, &f, sizeof f);
    }
    /* The version first (it needs no cuInit): a driver too old says so,
     * rather than naming the first entry point it happens to lack. */
    if (!api->cuDriverGetVersion || (e = api->cuDriverGetVersion(&api->version)) != CUDA_SUCCESS) {
        errmsg_set(why, whylen, "the CUDA driver %s cannot tell its version (%s)", so,
                   api->cuDriverGetVersion ? cudadrv_error(api, e, ebuf, sizeof ebuf)
                                           : "no cuDriverGetVersion");
        cudadrv_unload(api);
        return -1;
    }
    format_version(api->version, have, sizeof have);
    format_version(CUDADRV_MIN_VERSION, need, sizeof need);
    if (api->version < CUDADRV_MIN_VERSION) {
        errmsg_set(why, whylen, "the CUDA driver is version %s (cuDriverGetVersion %d); kvnoded needs %s or newer: "
                   "update the NVIDIA driver", have, api->version, need);
        cudadrv_unload(api);
        return -1;
    }
    if (missing) {
        errmsg_set(why, whylen, "the CUDA driver %s (version %s) lacks %s, which kvnoded needs", so, have, missing);
        cudadrv_unload(api);
        return -1;
    }
    if (api->version < CUDADRV_VMM_VERSION)
        api->has_vmm = false;
    if ((e = api->cuInit(0)) != CUDA_SUCCESS) {
        errmsg_set(why, whylen, "cuInit: %s", cudadrv_error(api, e, ebuf, sizeof ebuf));
        cudadrv_unload(api);
        return -1;
    }
    return 0;
}

void cudadrv_unload(struct cudadrv *api)
{
    /* The driver is never dlclose'd: its threads and atexit handlers stay. */
    memset(api, 0, sizeof *api);
}

const char *cudadrv_error(const struct cudadrv *api, CUresult e, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;

    if (api->cuGetErrorName && api->cuGetErrorName(e, &name) != CUDA_SUCCESS)
        name = NULL;
    if (api->cuGetErrorString && api->cuGetErrorString(e, &text) != CUDA_SUCCESS)
        text = NULL;
    if (name && text)
        snprintf(buf, len, "%s (%s)", name, text);
    else
        snprintf(buf, len, "CUDA error %d", e);
    return buf;
}

bool cudadrv_is_sticky(CUresult e)
{
    return e == CUDA_ERROR_ILLEGAL_ADDRESS ||
           (e >= CUDA_ERROR_HARDWARE_STACK_ERROR && e <= CUDA_ERROR_LAUNCH_FAILED);
}
