/* fakecuda_vmm.c: the VMM calls of the strict fake CUDA (cuMemCreate with a
 * POSIX-fd handle, export/import of that fd, address reservations, maps and
 * access). A physical allocation is a vmm-<phys>-<pid>-<seq> file like the
 * legacy ones (fakecuda_mem.c); an import holds it for the importing process,
 * and it is freed when the last handle or mapping of the last live holder
 * goes. Cross-namespace by construction: an fd needs no pid. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda_internal.h"

/* ---- VMM ------------------------------------------------------------------------- */

static CUresult vmm_enter(const char *name)
{
    CUresult rc = fc_enter(name, true);

    if (rc == FC_SUCCESS && !fc_vmm_supported())
        rc = FC_ERR_NOT_SUPPORTED;
    return rc;
}

static CUresult check_prop(const CUmemAllocationProp *prop, int *phys)
{
    if (!prop || prop->type != FC_ALLOCATION_TYPE_PINNED || prop->location.type != FC_LOCATION_TYPE_DEVICE ||
        (prop->requestedHandleTypes & ~FC_HANDLE_TYPE_POSIX_FD))
        return FC_ERR_INVALID_VALUE;
    *phys = fc_ordinal_phys(prop->location.id);
    if (*phys < 0)
        return FC_ERR_INVALID_DEVICE;
    /* A context of this process on the device that hit a sticky error. */
    if (fc_ctx_alive(&fc.ctx[*phys]))
        return fc_ctx_check(&fc.ctx[*phys]);
    return FC_SUCCESS;
}

static struct fc_alloc *vmm_handle(CUmemGenericAllocationHandle h)
{
    struct fc_alloc *a;

    for (a = fc_mt.allocs; a; a = a->next)
        if ((uintptr_t)a == (uintptr_t)h && a->vmm && a->handle_live)
            return a;
    return NULL;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option)
{
    CUresult rc = vmm_enter("cuMemGetAllocationGranularity");
    int phys;

    if (rc)
        return rc;
    if (!granularity || (option != 0 && option != 1))
        return FC_ERR_INVALID_VALUE;
    if ((rc = check_prop(prop, &phys)))
        return rc;
    *granularity = FC_GRANULARITY;
    return FC_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    CUresult rc = vmm_enter("cuMemCreate");
    struct fc_alloc *a;
    int phys;

    if (rc)
        return rc;
    if (!handle || flags != 0 || size == 0 || size % FC_GRANULARITY)
        return FC_ERR_INVALID_VALUE;
    if ((rc = check_prop(prop, &phys)))
        return rc;
    pthread_mutex_lock(&fc.lock);
    rc = fc_alloc_new(phys, size, true, &a);
    if (rc == FC_SUCCESS) {
        a->handle_live = true;
        a->exportable = (prop->requestedHandleTypes & FC_HANDLE_TYPE_POSIX_FD) != 0;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
    }
    pthread_mutex_unlock(&fc.lock);
    return rc;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult rc = vmm_enter("cuMemRelease");
    struct fc_alloc *a;

    if (rc)
        return rc;
    pthread_mutex_lock(&fc.lock);
    a = vmm_handle(handle);
    if (a) {
        a->handle_live = false;
        if (a->maps == 0)
            fc_alloc_drop(a);
    }
    pthread_mutex_unlock(&fc.lock);
    return a ? FC_SUCCESS : FC_ERR_INVALID_VALUE;
}

CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                      unsigned long long flags)
{
    CUresult rc = vmm_enter("cuMemExportToShareableHandle");
    struct fc_alloc *a;
    char p[PATH_MAX];
    int fd = -1;

    if (rc)
        return rc;
    if (!shareable || type != FC_HANDLE_TYPE_POSIX_FD || flags != 0)
        return FC_ERR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    a = vmm_handle(handle);
    if (a && a->exportable) {
        snprintf(p, sizeof p, "/proc/self/fd/%d", a->fd);
        fd = open(p, O_RDWR | O_CLOEXEC);
    }
    pthread_mutex_unlock(&fc.lock);
    if (!a || !a->exportable)
        return FC_ERR_INVALID_VALUE;
    if (fd < 0)
        return FC_ERR_OUT_OF_MEMORY;
    *(int *)shareable = fd;
    return FC_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle, int type)
{
    CUresult rc = vmm_enter("cuMemImportFromShareableHandle");
    int fd = (int)(intptr_t)os_handle, ph, pid, lk;
    char link[64], path[PATH_MAX];
    const char *base;
    struct fc_alloc *a;
    unsigned seq;
    struct stat st;
    ssize_t n;

    if (rc)
        return rc;
    if (!handle || type != FC_HANDLE_TYPE_POSIX_FD || fd < 0)
        return FC_ERR_INVALID_VALUE;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof path - 1);
    if (n <= 0 || fstat(fd, &st) != 0)
        return FC_ERR_INVALID_VALUE;
    path[n] = '\0';
    base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (sscanf(base, "vmm-%d-%d-%u", &ph, &pid, &seq) != 3 || ph < 0 || ph >= fc.cfg.nphys)
        return FC_ERR_INVALID_VALUE;
    a = calloc(1, sizeof *a);
    if (!a)
        return FC_ERR_OUT_OF_MEMORY;
    a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (a->fd < 0) {
        free(a);
        return FC_ERR_OUT_OF_MEMORY;
    }
    snprintf(a->name, sizeof a->name, "vmm-%d-%d-%u", ph, pid, seq);
    a->phys = ph;
    a->size = (size_t)st.st_size;
    a->vmm = true;
    a->handle_live = true;
    a->exportable = true;
    pthread_mutex_lock(&fc.lock);
    lk = fc_dir_lock();
    fc_hold_acquire(a->name);
    fc_dir_unlock(lk);
    a->next = fc_mt.allocs;
    fc_mt.allocs = a;
    pthread_mutex_unlock(&fc.lock);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
    return FC_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    CUresult rc = vmm_enter("cuMemAddressReserve");
    uintptr_t m, a;
    void *v;

    (void)addr;     /* a hint only */
    if (rc)
        return rc;
    if (!ptr || size == 0 || size % FC_GRANULARITY || flags != 0 || (alignment & (alignment - 1)))
        return FC_ERR_INVALID_VALUE;
    if (alignment < FC_GRANULARITY)
        alignment = FC_GRANULARITY;
    v = mmap(NULL, size + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (v == MAP_FAILED)
        return FC_ERR_OUT_OF_MEMORY;
    m = (uintptr_t)v;
    a = (m + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (a > m)
        munmap(v, a - m);
    if (m + size + alignment > a + size)
        munmap((void *)(a + size), m + size + alignment - (a + size));
    pthread_mutex_lock(&fc.lock);
    fc_range_add(a, size, R_RESERVE, -1, NULL);
    pthread_mutex_unlock(&fc.lock);
    *ptr = (CUdeviceptr)a;
    return FC_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult rc = vmm_enter("cuMemAddressFree");
    struct fc_range *r, *q;

    if (rc)
        return rc;
    pthread_mutex_lock(&fc.lock);
    r = fc_range_at((uintptr_t)ptr, R_RESERVE);
    if (!r || r->size != size) {
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_INVALID_VALUE;
    }
    for (q = fc_mt.ranges; q; q = q->next)
        if (q->kind == R_MAP && fc_overlap(q->base, q->size, r->base, r->size)) {
            pthread_mutex_unlock(&fc.lock);
            return FC_ERR_INVALID_VALUE;    /* still mapped: cuMemUnmap first */
        }
    munmap((void *)r->base, r->size);
    fc_range_del(r);
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    CUresult rc = vmm_enter("cuMemMap");
    struct fc_range *r, *q, *res = NULL;
    struct fc_alloc *a;
    uintptr_t p = (uintptr_t)ptr;

    if (rc)
        return rc;
    if (flags != 0 || size == 0 || size % FC_GRANULARITY || offset % FC_GRANULARITY)
        return FC_ERR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    a = vmm_handle(handle);
    for (r = fc_mt.ranges; r; r = r->next) {
        if (r->kind == R_RESERVE && p >= r->base && p + size <= r->base + r->size)
            res = r;
        if (r->kind == R_MAP && fc_overlap(p, size, r->base, r->size))
            break;
    }
    if (!a || !res || r || offset + size > a->size ||
        mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset) == MAP_FAILED) {
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_INVALID_VALUE;
    }
    q = fc_range_add(p, size, R_MAP, a->phys, a);
    if (q)
        a->maps++;
    pthread_mutex_unlock(&fc.lock);
    return q ? FC_SUCCESS : FC_ERR_OUT_OF_MEMORY;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult rc = vmm_enter("cuMemUnmap");
    uintptr_t p = (uintptr_t)ptr;
    struct fc_range *r, *next;
    int phys = -1;
    bool bad = false, any = false;

    if (rc)
        return rc;
    pthread_mutex_lock(&fc.lock);
    for (r = fc_mt.ranges; r; r = r->next)
        if (r->kind == R_MAP && fc_overlap(p, size, r->base, r->size)) {
            any = true;
            phys = r->phys;
            if (r->base < p || r->base + r->size > p + size)
                bad = true;
        }
    pthread_mutex_unlock(&fc.lock);
    if (!any || bad)
        return FC_ERR_INVALID_VALUE;
    fc_device_sync(phys);
    pthread_mutex_lock(&fc.lock);
    for (r = fc_mt.ranges; r; r = next) {
        next = r->next;
        if (r->kind == R_MAP && fc_overlap(p, size, r->base, r->size)) {
            struct fc_alloc *a = r->alloc;

            mmap((void *)r->base, r->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                 -1, 0);
            fc_range_del(r);
            if (--a->maps == 0 && !a->handle_live)
                fc_alloc_drop(a);
        }
    }
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CUresult rc = vmm_enter("cuMemSetAccess");
    uintptr_t p = (uintptr_t)ptr, cur;
    struct fc_range *r;
    int prot = PROT_NONE;
    size_t i;

    if (rc)
        return rc;
    if (!desc || count == 0 || size == 0)
        return FC_ERR_INVALID_VALUE;
    for (i = 0; i < count; i++) {
        if (desc[i].location.type != FC_LOCATION_TYPE_DEVICE)
            return FC_ERR_INVALID_VALUE;
        if (fc_ordinal_phys(desc[i].location.id) < 0)
            return FC_ERR_INVALID_DEVICE;
        if (desc[i].flags == FC_ACCESS_READWRITE)
            prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == FC_ACCESS_READ && prot == PROT_NONE)
            prot = PROT_READ;
        else if (desc[i].flags != 0 && desc[i].flags != FC_ACCESS_READ)
            return FC_ERR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fc.lock);
    /* The range must be wholly covered by whole mappings. */
    for (cur = p; cur < p + size;) {
        for (r = fc_mt.ranges; r; r = r->next)
            if (r->kind == R_MAP && r->base == cur)
                break;
        if (!r || r->base + r->size > p + size) {
            pthread_mutex_unlock(&fc.lock);
            return FC_ERR_INVALID_VALUE;
        }
        cur = r->base + r->size;
    }
    for (r = fc_mt.ranges; r; r = r->next)
        if (r->kind == R_MAP && r->base >= p && r->base + r->size <= p + size) {
            mprotect((void *)r->base, r->size, prot);
            r->access = prot != PROT_NONE;
        }
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}
