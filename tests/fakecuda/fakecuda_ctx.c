/* fakecuda_ctx.c: devices and contexts of the strict fake CUDA: ordinals to
 * physical devices, bus ids, attributes, primary contexts (ctx-<phys>-<pid>
 * files, compute modes, sticky-<phys>), the driver's per-thread context stack
 * and the runtime's per-thread device and last error. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda_internal.h"

/* Per thread: the driver's context stack and the runtime's device and last
 * error. gen says which process generation (fork) the values belong to. */
static _Thread_local struct {
    unsigned gen;
    int depth;
    struct fc_ctx *stack[16];
    int rt_dev;
    cudaError_t last_err;
} tls;

static void tls_fresh(void)
{
    if (tls.gen != fc.gen) {
        memset(&tls, 0, sizeof tls);
        tls.gen = fc.gen;
    }
}

/* ---- devices ------------------------------------------------------------------ */

int fc_ordinal_phys(int ordinal)
{
    if (!fc.cfg_ok || ordinal < 0 || ordinal >= fc.cfg.nvis)
        return -1;
    return fc.cfg.vis[ordinal];
}

int fc_phys_ordinal(int phys)
{
    int i;

    for (i = 0; i < fc.cfg.nvis; i++)
        if (fc.cfg.vis[i] == phys)
            return i;
    return -1;
}

bool fc_vmm_supported(void)
{
    return !fc.cfg.no_vmm && fc.cfg.driver_version >= 10020;
}

static void format_busid(char *buf, size_t len, int phys)
{
    const struct fc_phys *p = &fc.cfg.phys[phys];

    switch (fc.cfg.busid_format) {
    case 1:
        snprintf(buf, len, "%04x:%02x:%02x.%x", p->domain, p->bus, p->dev, p->fn);
        break;
    case 2:
        snprintf(buf, len, "%08X:%02X:%02X.%X", p->domain, p->bus, p->dev, p->fn);
        break;
    default:
        snprintf(buf, len, "%04X:%02X:%02X.%X", p->domain, p->bus, p->dev, p->fn);
    }
}

static CUresult attribute(int *value, int attrib, int phys)
{
    const struct fc_phys *p = &fc.cfg.phys[phys];

    if (!value)
        return FC_ERR_INVALID_VALUE;
    switch (attrib) {
    case 16: *value = p->mig ? 14 : 132; break;             /* MULTIPROCESSOR_COUNT */
    case 20: *value = p->compute_mode; break;               /* COMPUTE_MODE */
    case 33: *value = (int)p->bus; break;                   /* PCI_BUS_ID */
    case 34: *value = (int)p->dev; break;                   /* PCI_DEVICE_ID */
    case 41: *value = 1; break;                             /* UNIFIED_ADDRESSING */
    case 50: *value = (int)p->domain; break;                /* PCI_DOMAIN_ID */
    case 75: *value = 9; break;                             /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = 0; break;                             /* COMPUTE_CAPABILITY_MINOR */
    case 91: *value = 1; break;                             /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
    case 99: *value = 1; break;                             /* HOST_REGISTER_SUPPORTED */
    case 102:                                               /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    case 103:                                               /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
        *value = fc_vmm_supported() ? 1 : 0;
        break;
    case 113: *value = 1; break;                            /* READ_ONLY_HOST_REGISTER_SUPPORTED */
    default:
        if (attrib <= 0 || attrib > 140)
            return FC_ERR_INVALID_VALUE;
        *value = 0;
    }
    return FC_SUCCESS;
}

/* ---- contexts --------------------------------------------------------------- */

/* A ctx file holds its process's key (fc_state.self_key). */
static bool other_live_context(int phys)
{
    char prefix[32];
    struct dirent *de;
    DIR *d = opendir(fc.cfg.dir);
    bool found = false;
    size_t plen;

    if (!d)
        return false;
    plen = (size_t)snprintf(prefix, sizeof prefix, "ctx-%d-", phys);
    while (!found && (de = readdir(d))) {
        char p[PATH_MAX], key[48] = "";
        FILE *f;

        if (strncmp(de->d_name, prefix, plen) || atoi(de->d_name + plen) == fc.self_pid)
            continue;
        fc_path(p, sizeof p, "%s", de->d_name);
        f = fopen(p, "re");
        if (!f)
            continue;
        if (fgets(key, sizeof key, f))
            key[strcspn(key, "\n")] = '\0';
        fclose(f);
        found = key[0] && fc_key_alive(fc.cfg.dir, key);
    }
    closedir(d);
    return found;
}

/* Make phys's primary context exist (runtime: held for the process's life;
 * driver: one more retain). Compute modes 2 and 3 refuse creation. */
CUresult fc_ctx_activate(int phys, bool runtime)
{
    struct fc_ctx *c = &fc.ctx[phys];
    CUresult rc = FC_SUCCESS;

    pthread_mutex_lock(&fc.lock);
    if (!c->alive) {
        int mode = fc.cfg.phys[phys].compute_mode;
        int lk = fc_dir_lock();

        if (mode == 2) {
            rc = FC_ERR_DEVICE_UNAVAILABLE;
        } else if (mode == 3 && other_live_context(phys)) {
            rc = FC_ERR_DEVICE_UNAVAILABLE;
        } else {
            char p[PATH_MAX];
            int fd;

            fc_path(p, sizeof p, "ctx-%d-%d", phys, fc.self_pid);
            fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd >= 0) {
                if (write(fd, fc.self_key, strlen(fc.self_key)) < 0)
                    fprintf(stderr, "fakecuda: cannot write %s\n", p);
                close(fd);
            }
            c->alive = true;
        }
        fc_dir_unlock(lk);
    }
    if (rc == FC_SUCCESS) {
        if (runtime)
            c->rt_held = true;
        else
            c->retain++;
    }
    pthread_mutex_unlock(&fc.lock);
    return rc;
}

/* Rule 8: once sticky-<phys> exists, this process's context on phys fails
 * every call with 700, for good. */
CUresult fc_ctx_check(struct fc_ctx *c)
{
    char p[PATH_MAX];

    if (__atomic_load_n(&c->sticky, __ATOMIC_RELAXED))
        return FC_ERR_ILLEGAL_ADDRESS;
    fc_path(p, sizeof p, "sticky-%d", c->phys);
    if (access(p, F_OK) == 0) {
        __atomic_store_n(&c->sticky, true, __ATOMIC_RELAXED);
        return FC_ERR_ILLEGAL_ADDRESS;
    }
    return FC_SUCCESS;
}

struct fc_ctx *fc_current_ctx(void)
{
    tls_fresh();
    return tls.depth > 0 ? tls.stack[tls.depth - 1] : NULL;
}

static void set_current(struct fc_ctx *c)
{
    tls_fresh();
    if (!c) {
        if (tls.depth > 0)
            tls.depth--;
        return;
    }
    if (tls.depth == 0)
        tls.depth = 1;
    tls.stack[tls.depth - 1] = c;
}

bool fc_ctx_alive(struct fc_ctx *c)
{
    bool alive;

    pthread_mutex_lock(&fc.lock);
    alive = c->alive;
    pthread_mutex_unlock(&fc.lock);
    return alive;
}

CUresult fc_drv_ctx(struct fc_ctx **out, const char *what)
{
    struct fc_ctx *c = fc_current_ctx();

    if (!c || !fc_ctx_alive(c)) {
        fc_violation("no-context", "%s called with no current context", what);
        return FC_ERR_INVALID_CONTEXT;
    }
    *out = c;
    return fc_ctx_check(c);
}

/* The runtime's context: the thread's current one, else its device's primary
 * context, created here when it does not exist yet (default device 0). */
CUresult fc_rt_ctx(struct fc_ctx **out)
{
    struct fc_ctx *c = fc_current_ctx();
    CUresult rc;

    if (!c) {
        int phys = fc_ordinal_phys(tls.rt_dev);

        if (phys < 0)
            return fc.cfg.nvis == 0 ? FC_ERR_NO_DEVICE : FC_ERR_INVALID_DEVICE;
        c = &fc.ctx[phys];
    }
    rc = fc_ctx_activate(c->phys, true);    /* exists already: only takes the lock */
    if (rc)
        return rc;
    if (!fc_current_ctx())
        set_current(c);
    *out = c;
    return fc_ctx_check(c);
}

int fc_rt_device(void)
{
    struct fc_ctx *c = fc_current_ctx();

    return c ? fc_phys_ordinal(c->phys) : tls.rt_dev;
}

void fc_rt_set_device(int ordinal)
{
    tls_fresh();
    tls.rt_dev = ordinal;
    set_current(&fc.ctx[fc_ordinal_phys(ordinal)]);
}

cudaError_t fc_rt_ret(cudaError_t e)
{
    tls_fresh();
    if (e != FC_SUCCESS && e != FC_ERR_NOT_READY)
        tls.last_err = e;
    return e;
}

/* cudaGetLastError / cudaPeekAtLastError: a sticky error is never cleared. */
cudaError_t fc_rt_last_error(bool clear)
{
    struct fc_ctx *c = fc_current_ctx();
    cudaError_t e;

    if (c && fc_ctx_alive(c) && fc_ctx_check(c) != FC_SUCCESS)
        return FC_ERR_ILLEGAL_ADDRESS;
    e = tls.last_err;
    if (clear)
        tls.last_err = FC_SUCCESS;
    return e;
}

/* ---- driver: init, devices, contexts -------------------------------------------- */

CUresult cuInit(unsigned int flags)
{
    CUresult rc = fc_enter("cuInit", false);

    if (rc)
        return rc;
    if (flags != 0)
        return FC_ERR_INVALID_VALUE;
    if (fc.cfg.nvis == 0)
        return FC_ERR_NO_DEVICE;
    __atomic_store_n(&fc.drv_inited, true, __ATOMIC_RELAXED);
    return FC_SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
    CUresult rc = fc_enter("cuDriverGetVersion", false);

    if (rc == FC_ERR_NO_DEVICE)
        rc = FC_SUCCESS;    /* answers without a configuration too */
    if (rc)
        return rc;
    if (!version)
        return FC_ERR_INVALID_VALUE;
    *version = fc.cfg_ok ? fc.cfg.driver_version : 12080;
    return FC_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    CUresult rc = fc_enter("cuDeviceGetCount", true);

    if (rc)
        return rc;
    if (!count)
        return FC_ERR_INVALID_VALUE;
    *count = fc.cfg.nvis;
    return FC_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CUresult rc = fc_enter("cuDeviceGet", true);

    if (rc)
        return rc;
    if (!dev)
        return FC_ERR_INVALID_VALUE;
    if (fc_ordinal_phys(ordinal) < 0)
        return FC_ERR_INVALID_DEVICE;
    *dev = ordinal;
    return FC_SUCCESS;
}

static CUresult device_name(char *name, int len, int phys)
{
    if (!name || len <= 0)
        return FC_ERR_INVALID_VALUE;
    snprintf(name, (size_t)len, "NVIDIA H100 80GB HBM3%s", fc.cfg.phys[phys].mig ? " MIG 1g.10gb" : "");
    return FC_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult rc = fc_enter("cuDeviceGetName", true);
    int phys = fc_ordinal_phys(dev);

    if (rc)
        return rc;
    if (phys < 0)
        return FC_ERR_INVALID_DEVICE;
    return device_name(name, len, phys);
}

CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
    CUresult rc = fc_enter("cuDeviceGetAttribute", true);
    int phys = fc_ordinal_phys(dev);

    if (rc)
        return rc;
    if (phys < 0)
        return FC_ERR_INVALID_DEVICE;
    return attribute(value, attrib, phys);
}

CUresult cuDeviceGetPCIBusId(char *busid, int len, CUdevice dev)
{
    CUresult rc = fc_enter("cuDeviceGetPCIBusId", true);
    int phys = fc_ordinal_phys(dev);

    if (rc)
        return rc;
    if (phys < 0)
        return FC_ERR_INVALID_DEVICE;
    if (!busid || len <= 0)
        return FC_ERR_INVALID_VALUE;
    format_busid(busid, (size_t)len, phys);
    return FC_SUCCESS;
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev, const char *name)
{
    CUresult rc = fc_enter(name, true);
    int phys = fc_ordinal_phys(dev);
    char bus[32];
    unsigned long long a, b;

    if (rc)
        return rc;
    if (phys < 0)
        return FC_ERR_INVALID_DEVICE;
    if (!uuid)
        return FC_ERR_INVALID_VALUE;
    format_busid(bus, sizeof bus, phys);
    a = fc_hash(bus);
    b = fc_hash(fc.cfg.phys[phys].mig ? "mig" : "gpu") ^ a * 31;
    memcpy(uuid->bytes, &a, 8);
    memcpy(uuid->bytes + 8, &b, 8);
    return FC_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(uuid, dev, "cuDeviceGetUuid");
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(uuid, dev, "cuDeviceGetUuid_v2");
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult rc = fc_enter("cuDeviceTotalMem_v2", true);

    if (rc)
        return rc;
    if (fc_ordinal_phys(dev) < 0)
        return FC_ERR_INVALID_DEVICE;
    if (!bytes)
        return FC_ERR_INVALID_VALUE;
    *bytes = (size_t)fc.cfg.mem_bytes;
    return FC_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult rc = fc_enter("cuDevicePrimaryCtxRetain", true);
    int phys = fc_ordinal_phys(dev);

    if (rc)
        return rc;
    if (phys < 0)
        return FC_ERR_INVALID_DEVICE;
    if (!pctx)
        return FC_ERR_INVALID_VALUE;
    if (fc_ctx_alive(&fc.ctx[phys]) && (rc = fc_ctx_check(&fc.ctx[phys])))
        return rc;
    rc = fc_ctx_activate(phys, false);
    if (rc)
        return rc;
    *pctx = &fc.ctx[phys];
    return FC_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult rc = fc_enter("cuDevicePrimaryCtxRelease_v2", true);
    int phys = fc_ordinal_phys(dev);
    struct fc_ctx *c;

    if (rc)
        return rc;
    if (phys < 0)
        return FC_ERR_INVALID_DEVICE;
    c = &fc.ctx[phys];
    pthread_mutex_lock(&fc.lock);
    if (c->retain == 0) {
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_INVALID_CONTEXT;
    }
    if (--c->retain == 0 && !c->rt_held) {
        char p[PATH_MAX];

        pthread_mutex_unlock(&fc.lock);
        fc_device_sync(phys);
        pthread_mutex_lock(&fc.lock);
        if (c->retain == 0 && !c->rt_held && c->alive) {
            c->alive = false;
            fc_path(p, sizeof p, "ctx-%d-%d", phys, fc.self_pid);
            unlink(p);
        }
    }
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult rc = fc_enter("cuDevicePrimaryCtxGetState", true);
    int phys = fc_ordinal_phys(dev);

    if (rc)
        return rc;
    if (phys < 0)
        return FC_ERR_INVALID_DEVICE;
    if (!flags || !active)
        return FC_ERR_INVALID_VALUE;
    *flags = 0;
    *active = fc_ctx_alive(&fc.ctx[phys]);
    return FC_SUCCESS;
}

static bool valid_ctx(struct fc_ctx *c)
{
    return c >= &fc.ctx[0] && c < &fc.ctx[FC_MAX_DEVICES];
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult rc = fc_enter("cuCtxSetCurrent", true);

    if (rc)
        return rc;
    if (ctx && (!valid_ctx(ctx) || !fc_ctx_alive(ctx)))
        return FC_ERR_INVALID_CONTEXT;
    set_current(ctx);
    return FC_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult rc = fc_enter("cuCtxGetCurrent", true);

    if (rc)
        return rc;
    if (!pctx)
        return FC_ERR_INVALID_VALUE;
    *pctx = fc_current_ctx();
    return FC_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CUresult rc = fc_enter("cuCtxPushCurrent_v2", true);

    if (rc)
        return rc;
    if (!ctx || !valid_ctx(ctx) || !fc_ctx_alive(ctx))
        return FC_ERR_INVALID_CONTEXT;
    tls_fresh();
    if (tls.depth >= (int)(sizeof tls.stack / sizeof tls.stack[0]))
        return FC_ERR_INVALID_VALUE;
    tls.stack[tls.depth++] = ctx;
    return FC_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult rc = fc_enter("cuCtxPopCurrent_v2", true);

    if (rc)
        return rc;
    tls_fresh();
    if (tls.depth == 0)
        return FC_ERR_INVALID_CONTEXT;
    tls.depth--;
    if (pctx)
        *pctx = tls.stack[tls.depth];
    return FC_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *dev)
{
    CUresult rc = fc_enter("cuCtxGetDevice", true);
    struct fc_ctx *c;

    if (rc)
        return rc;
    if ((rc = fc_drv_ctx(&c, "cuCtxGetDevice")))
        return rc;
    if (!dev)
        return FC_ERR_INVALID_VALUE;
    *dev = fc_phys_ordinal(c->phys);
    return FC_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    CUresult rc = fc_enter("cuCtxSynchronize", true);
    struct fc_ctx *c;

    if (rc)
        return rc;
    if ((rc = fc_drv_ctx(&c, "cuCtxSynchronize")))
        return rc;
    fc_device_sync(c->phys);
    return FC_SUCCESS;
}

/* ---- runtime: devices ---------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count)
{
    CUresult rc = fc_enter("cudaGetDeviceCount", false);

    if (rc)
        return fc_rt_ret(rc);
    if (!count)
        return fc_rt_ret(FC_ERR_INVALID_VALUE);
    *count = fc.cfg.nvis;
    return fc.cfg.nvis ? FC_SUCCESS : fc_rt_ret(FC_ERR_NO_DEVICE);
}

/* CUDA 12: cudaSetDevice initialises the device's primary context at once. */
cudaError_t cudaSetDevice(int device)
{
    CUresult rc = fc_enter("cudaSetDevice", false);
    int phys = fc_ordinal_phys(device);

    if (rc)
        return fc_rt_ret(rc);
    if (phys < 0)
        return fc_rt_ret(FC_ERR_INVALID_DEVICE);
    if ((rc = fc_ctx_activate(phys, true)))
        return fc_rt_ret(rc);
    fc_rt_set_device(device);
    return fc_rt_ret(fc_ctx_check(&fc.ctx[phys]));
}

cudaError_t cudaGetDevice(int *device)
{
    CUresult rc = fc_enter("cudaGetDevice", false);

    if (rc)
        return fc_rt_ret(rc);
    if (!device)
        return fc_rt_ret(FC_ERR_INVALID_VALUE);
    *device = fc_rt_device();
    return FC_SUCCESS;
}

cudaError_t cudaDeviceGetPCIBusId(char *busid, int len, int device)
{
    CUresult rc = fc_enter("cudaDeviceGetPCIBusId", false);
    int phys = fc_ordinal_phys(device);

    if (rc)
        return fc_rt_ret(rc);
    if (phys < 0)
        return fc_rt_ret(FC_ERR_INVALID_DEVICE);
    if (!busid || len <= 0)
        return fc_rt_ret(FC_ERR_INVALID_VALUE);
    format_busid(busid, (size_t)len, phys);
    return FC_SUCCESS;
}

cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device)
{
    CUresult rc = fc_enter("cudaDeviceGetAttribute", false);
    int phys = fc_ordinal_phys(device);

    if (rc)
        return fc_rt_ret(rc);
    if (phys < 0)
        return fc_rt_ret(FC_ERR_INVALID_DEVICE);
    return fc_rt_ret(attribute(value, attr, phys));
}

/* struct cudaDeviceProp differs between toolkits past its first fields, so
 * only those are written: name[256] at 0, uuid (16 bytes) at 256 and
 * totalGlobalMem at 288 (after luid[8] and luidDeviceNodeMask); the caller
 * zeroes the rest. */
static cudaError_t device_properties(void *prop, int device, const char *name)
{
    CUresult rc = fc_enter(name, false);
    int phys = fc_ordinal_phys(device);
    size_t total;
    CUuuid uuid;

    if (rc)
        return fc_rt_ret(rc);
    if (phys < 0)
        return fc_rt_ret(FC_ERR_INVALID_DEVICE);
    if (!prop)
        return fc_rt_ret(FC_ERR_INVALID_VALUE);
    device_name(prop, 256, phys);
    device_uuid(&uuid, device, name);
    memcpy((char *)prop + 256, uuid.bytes, sizeof uuid.bytes);
    total = (size_t)fc.cfg.mem_bytes;
    memcpy((char *)prop + 288, &total, sizeof total);
    return FC_SUCCESS;
}

cudaError_t cudaGetDeviceProperties(void *prop, int device)
{
    return device_properties(prop, device, "cudaGetDeviceProperties");
}

cudaError_t cudaGetDeviceProperties_v2(void *prop, int device)
{
    return device_properties(prop, device, "cudaGetDeviceProperties_v2");
}

cudaError_t cudaDriverGetVersion(int *version)
{
    return fc_rt_ret(cuDriverGetVersion(version));
}

cudaError_t cudaRuntimeGetVersion(int *version)
{
    if (!version)
        return fc_rt_ret(FC_ERR_INVALID_VALUE);
    *version = 12080;
    return FC_SUCCESS;
}

cudaError_t cudaGetLastError(void)
{
    return fc_rt_last_error(true);
}

cudaError_t cudaPeekAtLastError(void)
{
    return fc_rt_last_error(false);
}
