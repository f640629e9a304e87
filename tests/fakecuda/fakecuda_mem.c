/* fakecuda_mem.c: device memory of the strict fake CUDA. Every physical
 * allocation is a file in $FAKECUDA_DIR (ipc-<phys>-<pid>-<seq> for
 * cuMemAlloc/cudaMalloc, vmm-<phys>-<pid>-<seq> for cuMemCreate), mapped
 * shared, so another process opens it by a legacy IPC handle or by the fd a
 * VMM export gives. Each process that holds one has a marker
 * hold-<name>-<pid>; an allocation counts against its device while a live
 * pid holds it (a dead process holds nothing, as on a real GPU). The range
 * table (device addresses of this process) says which side of a copy is the
 * device; host registrations live here too. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda_internal.h"

struct mem_tables fc_mt;

#define IPC_MAGIC 0x46434950u   /* "FCIP" */
struct ipc_wire {
    uint32_t magic;
    int32_t phys;
    int32_t pid;
    uint32_t seq;
    uint64_t size;
    uint64_t pidns;
    char key[32];       /* the creator's fc_state.self_key */
};
_Static_assert(sizeof(struct ipc_wire) == 64, "IPC handles are 64 bytes");

void fc_mem_fork_reset(void)
{
    struct mem_tables *old = malloc(sizeof *old);

    if (old)
        *old = fc_mt;
    memset(&fc_mt, 0, sizeof fc_mt);
    fc_mt.older = old;
}

/* ---- shared files: holders, accounting ------------------------------------ */

struct names {
    char **v;
    size_t n, cap;
};

static void names_read(struct names *ns)
{
    DIR *d = opendir(fc.cfg.dir);
    struct dirent *de;

    memset(ns, 0, sizeof *ns);
    if (!d)
        return;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "ipc-", 4) && strncmp(de->d_name, "vmm-", 4) &&
            strncmp(de->d_name, "hold-", 5))
            continue;
        if (ns->n == ns->cap) {
            size_t cap = ns->cap ? ns->cap * 2 : 64;
            char **v = realloc(ns->v, cap * sizeof *v);

            if (!v)
                break;
            ns->v = v;
            ns->cap = cap;
        }
        ns->v[ns->n] = strdup(de->d_name);
        if (ns->v[ns->n])
            ns->n++;
    }
    closedir(d);
}

static void names_free(struct names *ns)
{
    size_t i;

    for (i = 0; i < ns->n; i++)
        free(ns->v[i]);
    free(ns->v);
}

/* Live holders of allocation name other than this process (their pids in
 * pids), and whether any live holder exists at all. A marker is
 * hold-<name>-<key>. */
static int live_holders(const struct names *ns, const char *name, bool *any, char *pids, size_t plen)
{
    char prefix[80];
    size_t i, len = (size_t)snprintf(prefix, sizeof prefix, "hold-%s-", name);
    int others = 0;

    *any = false;
    if (pids && plen)
        pids[0] = '\0';
    for (i = 0; i < ns->n; i++) {
        const char *key = ns->v[i] + len;

        if (strncmp(ns->v[i], prefix, len) || !strchr(key, '.') || !fc_key_alive(fc.cfg.dir, key))
            continue;
        *any = true;
        if (strcmp(key, fc.self_key)) {
            others++;
            if (pids && strlen(pids) + 12 < plen)
                snprintf(pids + strlen(pids), plen - strlen(pids), "%s%d", others > 1 ? "," : "", atoi(key));
        }
    }
    return others;
}

/* Under the directory lock: drop allocations no live process holds (with
 * their stale markers) and return the bytes counted against phys. */
static unsigned long long gc_used(int phys)
{
    struct names ns;
    unsigned long long used = 0;
    size_t i, j;

    names_read(&ns);
    for (i = 0; i < ns.n; i++) {
        char p[PATH_MAX];
        struct stat st;
        bool any;
        int ph;

        if (strncmp(ns.v[i], "hold-", 5) == 0)
            continue;
        live_holders(&ns, ns.v[i], &any, NULL, 0);
        fc_path(p, sizeof p, "%s", ns.v[i]);
        if (!any) {
            char prefix[80];
            size_t len = (size_t)snprintf(prefix, sizeof prefix, "hold-%s-", ns.v[i]);

            unlink(p);
            for (j = 0; j < ns.n; j++)
                if (!strncmp(ns.v[j], prefix, len)) {
                    fc_path(p, sizeof p, "%s", ns.v[j]);
                    unlink(p);
                }
            continue;
        }
        if (sscanf(ns.v[i] + 4, "%d-", &ph) == 1 && ph == phys && stat(p, &st) == 0)
            used += (unsigned long long)st.st_size;
    }
    names_free(&ns);
    return used;
}

unsigned long long fc_used_bytes(int phys)
{
    unsigned long long used;
    int lk;

    pthread_mutex_lock(&fc.lock);
    lk = fc_dir_lock();
    used = gc_used(phys);
    fc_dir_unlock(lk);
    pthread_mutex_unlock(&fc.lock);
    return used;
}

/* This process holds name (marker written on the first hold). Caller holds
 * fc.lock and, for the first hold, the directory lock. */
void fc_hold_acquire(const char *name)
{
    struct fc_hold *h;

    for (h = fc_mt.holds; h && strcmp(h->name, name); h = h->next) {}
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h)
            return;
        snprintf(h->name, sizeof h->name, "%s", name);
        h->next = fc_mt.holds;
        fc_mt.holds = h;
    }
    if (h->refs++ == 0) {
        char p[PATH_MAX];
        int fd;

        fc_path(p, sizeof p, "hold-%s-%s", name, fc.self_key);
        fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0)
            close(fd);
    }
}

/* Caller holds fc.lock. */
static void hold_release(const char *name)
{
    struct fc_hold **pp, *h;

    for (pp = &fc_mt.holds; (h = *pp) && strcmp(h->name, name); pp = &h->next) {}
    if (!h || --h->refs > 0)
        return;
    *pp = h->next;
    free(h);
    {
        char p[PATH_MAX];
        int lk = fc_dir_lock();

        fc_path(p, sizeof p, "hold-%s-%s", name, fc.self_key);
        unlink(p);
        gc_used(-1);
        fc_dir_unlock(lk);
    }
}

/* A new allocation of size bytes on phys: its file, its marker, its fd. */
CUresult fc_alloc_new(int phys, size_t size, bool vmm, struct fc_alloc **out)
{
    struct fc_alloc *a;
    unsigned long long used;
    int lk, fd = -1;
    char p[PATH_MAX];

    a = calloc(1, sizeof *a);
    if (!a)
        return FC_ERR_OUT_OF_MEMORY;
    lk = fc_dir_lock();
    used = gc_used(phys);
    if (used + size > fc.cfg.mem_bytes || size > fc.cfg.mem_bytes) {
        fc_dir_unlock(lk);
        free(a);
        return FC_ERR_OUT_OF_MEMORY;
    }
    for (;;) {
        snprintf(a->name, sizeof a->name, "%s-%d-%d-%u", vmm ? "vmm" : "ipc", phys, fc.self_pid, ++fc_mt.seq);
        fc_path(p, sizeof p, "%s", a->name);
        fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST)
            break;
    }
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) {
            close(fd);
            unlink(p);
        }
        fc_dir_unlock(lk);
        free(a);
        return FC_ERR_OUT_OF_MEMORY;
    }
    fc_hold_acquire(a->name);
    fc_dir_unlock(lk);
    a->phys = phys;
    a->size = size;
    a->fd = fd;
    a->vmm = vmm;
    a->next = fc_mt.allocs;
    fc_mt.allocs = a;
    *out = a;
    return FC_SUCCESS;
}

/* Caller holds fc.lock. */
void fc_alloc_drop(struct fc_alloc *a)
{
    struct fc_alloc **pp;

    for (pp = &fc_mt.allocs; *pp && *pp != a; pp = &(*pp)->next) {}
    if (*pp)
        *pp = a->next;
    close(a->fd);
    hold_release(a->name);
    free(a);
}

struct fc_range *fc_range_add(uintptr_t base, size_t size, int kind, int phys, struct fc_alloc *a)
{
    struct fc_range *r = calloc(1, sizeof *r);

    if (!r)
        return NULL;
    r->base = base;
    r->size = size;
    r->kind = kind;
    r->phys = phys;
    r->alloc = a;
    r->access = kind != R_MAP && kind != R_RESERVE;
    r->next = fc_mt.ranges;
    fc_mt.ranges = r;
    return r;
}

void fc_range_del(struct fc_range *r)
{
    struct fc_range **pp;

    for (pp = &fc_mt.ranges; *pp && *pp != r; pp = &(*pp)->next) {}
    if (*pp)
        *pp = r->next;
    free(r);
}

struct fc_range *fc_range_at(uintptr_t base, int kind)
{
    struct fc_range *r;

    for (r = fc_mt.ranges; r; r = r->next)
        if (r->kind == kind && r->base == base)
            return r;
    return NULL;
}

size_t fc_overlap(uintptr_t a, size_t an, uintptr_t b, size_t bn)
{
    uintptr_t lo = a > b ? a : b, hi = a + an < b + bn ? a + an : b + bn;

    return hi > lo ? hi - lo : 0;
}

int fc_range_class(const void *p, size_t n, int *phys)
{
    uintptr_t a = (uintptr_t)p;
    size_t dev = 0, maps = 0, reserved = 0;
    bool bad = false;
    struct fc_range *r;

    if (n == 0)
        n = 1;
    pthread_mutex_lock(&fc.lock);
    for (r = fc_mt.ranges; r; r = r->next) {
        size_t o = fc_overlap(a, n, r->base, r->size);

        if (!o)
            continue;
        if (r->kind == R_RESERVE) {
            reserved += o;
            continue;
        }
        if (r->kind == R_MAP) {
            maps += o;
            if (!r->access)
                bad = true;
        }
        dev += o;
        *phys = r->phys;
    }
    pthread_mutex_unlock(&fc.lock);
    if (bad || reserved > maps)
        return -1;
    return dev == 0 ? 0 : dev == n ? 1 : -1;
}

int fc_host_pinned(const void *p, size_t n, int phys)
{
    uintptr_t a = (uintptr_t)p;
    struct fc_reg *g;
    int state = 0;

    if (n == 0)
        n = 1;
    pthread_mutex_lock(&fc.lock);
    for (g = fc_mt.regs; g; g = g->next) {
        size_t o = fc_overlap(a, n, g->base, g->size);

        if (!o || !(g->devices & (1u << phys)))
            continue;   /* not pinned for this device: pageable to it */
        state = o == n ? 1 : -1;
        break;
    }
    pthread_mutex_unlock(&fc.lock);
    return state;
}

/* ---- legacy allocations and IPC ------------------------------------------- */

static CUresult mem_alloc(struct fc_ctx *c, size_t size, void **out)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len;
    struct fc_alloc *a;
    void *m;
    CUresult rc;

    if (!out || size == 0)
        return FC_ERR_INVALID_VALUE;
    len = (size + pg - 1) / pg * pg;
    pthread_mutex_lock(&fc.lock);
    rc = fc_alloc_new(c->phys, len, false, &a);
    if (rc == FC_SUCCESS) {
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
        if (m == MAP_FAILED) {
            fc_alloc_drop(a);
            rc = FC_ERR_OUT_OF_MEMORY;
        } else {
            fc_range_add((uintptr_t)m, len, R_LEGACY, c->phys, a);
            *out = m;
        }
    }
    pthread_mutex_unlock(&fc.lock);
    return rc;
}

static CUresult mem_free(struct fc_ctx *c, void *p, const char *what)
{
    struct fc_range *r;
    struct fc_alloc *a;
    struct names ns;
    char pids[128];
    bool any;
    int lk;

    pthread_mutex_lock(&fc.lock);
    r = fc_range_at((uintptr_t)p, R_LEGACY);
    pthread_mutex_unlock(&fc.lock);
    if (!r)
        return FC_ERR_INVALID_VALUE;
    fc_device_sync(c->phys);    /* cudaFree synchronises the device */
    pthread_mutex_lock(&fc.lock);
    r = fc_range_at((uintptr_t)p, R_LEGACY);
    if (!r) {
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_INVALID_VALUE;
    }
    a = r->alloc;
    lk = fc_dir_lock();
    names_read(&ns);
    if (live_holders(&ns, a->name, &any, pids, sizeof pids) > 0)
        fc_violation("free-while-mapped", "%s of %s (%zu bytes) while pid(s) %s still have it open",
                     what, a->name, a->size, pids);
    names_free(&ns);
    fc_dir_unlock(lk);
    munmap((void *)r->base, r->size);
    fc_range_del(r);
    fc_alloc_drop(a);
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

static CUresult ipc_get(struct fc_ctx *c, void *handle, void *p)
{
    struct ipc_wire w;
    struct fc_range *r;
    CUresult rc = FC_ERR_INVALID_VALUE;

    (void)c;
    if (!handle)
        return FC_ERR_INVALID_VALUE;
    memset(&w, 0, sizeof w);
    pthread_mutex_lock(&fc.lock);
    for (r = fc_mt.ranges; r; r = r->next)
        if (r->kind == R_LEGACY && fc_overlap((uintptr_t)p, 1, r->base, r->size)) {
            int ph, pid;
            unsigned seq;

            if (sscanf(r->alloc->name, "ipc-%d-%d-%u", &ph, &pid, &seq) != 3)
                break;
            w.magic = IPC_MAGIC;
            w.phys = ph;
            w.pid = pid;
            w.seq = seq;
            w.size = r->alloc->size;
            w.pidns = fc.cfg.pidns;
            snprintf(w.key, sizeof w.key, "%s", fc.self_key);
            rc = FC_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&fc.lock);
    if (rc == FC_SUCCESS)
        memcpy(handle, &w, sizeof w);
    return rc;
}

static CUresult ipc_open(struct fc_ctx *c, void **out, const void *handle, unsigned flags)
{
    struct ipc_wire w;
    struct fc_range *r;
    struct fc_alloc *a;
    char name[64], p[PATH_MAX];
    struct stat st;
    void *m;
    int lk, fd;

    (void)c;
    memcpy(&w, handle, sizeof w);
    w.key[sizeof w.key - 1] = '\0';
    if (!out || w.magic != IPC_MAGIC || flags > 1)
        return FC_ERR_INVALID_VALUE;
    snprintf(name, sizeof name, "ipc-%d-%d-%u", (int)w.phys, (int)w.pid, (unsigned)w.seq);
    if (w.pidns == fc.cfg.pidns && !strcmp(w.key, fc.self_key)) {
        fc_violation("ipc-open-twice", "IPC handle of %s opened by the process that created it", name);
        return FC_ERR_INVALID_CONTEXT;
    }
    if (w.pidns != fc.cfg.pidns) {
        fc_violation("ipc-pidns", "IPC handle of %s (pid namespace %llx) opened in pid namespace %llx",
                     name, (unsigned long long)w.pidns, fc.cfg.pidns);
        return FC_ERR_MAP_FAILED;
    }
    pthread_mutex_lock(&fc.lock);
    for (r = fc_mt.ranges; r; r = r->next)
        if (r->kind == R_IPC && !strcmp(r->alloc->name, name)) {
            pthread_mutex_unlock(&fc.lock);
            fc_violation("ipc-open-twice", "IPC handle of %s opened twice in one process", name);
            return FC_ERR_ALREADY_MAPPED;
        }
    lk = fc_dir_lock();
    fc_path(p, sizeof p, "hold-%s-%s", name, w.key);
    if (access(p, F_OK) != 0 || !fc_key_alive(fc.cfg.dir, w.key)) {
        fc_dir_unlock(lk);
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_INVALID_VALUE;    /* freed, or its process is gone */
    }
    fc_path(p, sizeof p, "%s", name);
    fd = open(p, O_RDWR | O_CLOEXEC);
    a = calloc(1, sizeof *a);
    if (fd < 0 || !a || fstat(fd, &st) != 0 ||
        (m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        free(a);
        fc_dir_unlock(lk);
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_MAP_FAILED;
    }
    snprintf(a->name, sizeof a->name, "%s", name);
    a->phys = w.phys;
    a->size = (size_t)st.st_size;
    a->fd = fd;
    a->next = fc_mt.allocs;
    fc_mt.allocs = a;
    fc_hold_acquire(name);
    fc_dir_unlock(lk);
    fc_range_add((uintptr_t)m, a->size, R_IPC, w.phys, a);
    pthread_mutex_unlock(&fc.lock);
    *out = m;
    return FC_SUCCESS;
}

static CUresult ipc_close(struct fc_ctx *c, void *p)
{
    struct fc_range *r;

    fc_device_sync(c->phys);
    pthread_mutex_lock(&fc.lock);
    r = fc_range_at((uintptr_t)p, R_IPC);
    if (!r) {
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_INVALID_VALUE;
    }
    munmap((void *)r->base, r->size);
    fc_alloc_drop(r->alloc);
    fc_range_del(r);
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

/* ---- host registration --------------------------------------------------- */

/* -1 some page unmapped, 0 all writable, 1 some page not writable. */
static int host_range_writable(uintptr_t a, size_t n)
{
    FILE *f = fopen("/proc/self/maps", "re");
    char line[512];
    uintptr_t cur = a, end = a + n;
    int ro = 0;

    if (!f)
        return -1;
    while (cur < end && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];

        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || hi <= cur)
            continue;
        if (lo > cur)
            break;
        if (perms[1] != 'w')
            ro = 1;
        cur = hi;
    }
    fclose(f);
    return cur < end ? -1 : ro;
}

static CUresult host_register(struct fc_ctx *c, void *p, size_t n, unsigned flags, const char *what)
{
    struct fc_reg *g;
    int w, ph;

    if (!p || n == 0 || (flags & ~0x10Fu))    /* 0x100: ours, from cudaHostAlloc */
        return FC_ERR_INVALID_VALUE;
    if (fc_range_class(p, n, &ph) != 0)
        return FC_ERR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    for (g = fc_mt.regs; g; g = g->next)
        if (fc_overlap((uintptr_t)p, n, g->base, g->size)) {
            pthread_mutex_unlock(&fc.lock);
            fc_violation("register-overlap", "%s(%p, %zu) overlaps the registration at %p (%zu bytes)",
                         what, p, n, (void *)g->base, g->size);
            return FC_ERR_HOST_MEMORY_ALREADY_REGISTERED;
        }
    pthread_mutex_unlock(&fc.lock);
    w = host_range_writable((uintptr_t)p, n);
    if (w < 0)
        return FC_ERR_INVALID_VALUE;
    if (w > 0 && !(flags & FC_HOSTREG_READ_ONLY)) {
        flags &= 0xFu;
        fc_violation("register-readonly", "%s(%p, %zu, flags %#x) of memory mapped without PROT_WRITE "
                     "lacks the read-only flag", what, p, n, flags);
        return FC_ERR_INVALID_VALUE;
    }
    g = calloc(1, sizeof *g);
    if (!g)
        return FC_ERR_OUT_OF_MEMORY;
    g->base = (uintptr_t)p;
    g->size = n;
    g->host_alloc = (flags & 0x100) != 0;
    g->flags = flags;
    /* For the current context's device; portable: for every device. */
    g->devices = (flags & FC_HOSTREG_PORTABLE) ? ~0u : 1u << c->phys;
    pthread_mutex_lock(&fc.lock);
    g->next = fc_mt.regs;
    fc_mt.regs = g;
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

static CUresult host_unregister(struct fc_ctx *c, void *p, bool host_alloc)
{
    struct fc_reg **pp, *g;

    pthread_mutex_lock(&fc.lock);
    for (pp = &fc_mt.regs; (g = *pp) && g->base != (uintptr_t)p; pp = &g->next) {}
    if (g && g->host_alloc != host_alloc)
        g = NULL;
    if (g)
        *pp = g->next;
    pthread_mutex_unlock(&fc.lock);
    if (!g)
        return FC_ERR_HOST_MEMORY_NOT_REGISTERED;
    fc_device_sync(c->phys);
    if (host_alloc)
        munmap((void *)g->base, g->size);
    free(g);
    return FC_SUCCESS;
}

/* ---- driver entry points: legacy memory, IPC, registration, info --------------- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    void *p = NULL;

    DRV_CTX("cuMemAlloc_v2");
    if (!dptr)
        return FC_ERR_INVALID_VALUE;
    rc = mem_alloc(c, size, &p);
    if (rc == FC_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    return rc;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    DRV_CTX("cuMemFree_v2");
    return mem_free(c, (void *)(uintptr_t)dptr, "cuMemFree");
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    unsigned long long used;

    DRV_CTX("cuMemGetInfo_v2");
    if (!free_bytes || !total)
        return FC_ERR_INVALID_VALUE;
    used = fc_used_bytes(c->phys);
    *total = (size_t)fc.cfg.mem_bytes;
    *free_bytes = used >= fc.cfg.mem_bytes ? 0 : (size_t)(fc.cfg.mem_bytes - used);
    return FC_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    DRV_CTX("cuIpcGetMemHandle");
    return ipc_get(c, handle, (void *)(uintptr_t)dptr);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)
{
    void *p = NULL;

    DRV_CTX("cuIpcOpenMemHandle_v2");
    if (!dptr)
        return FC_ERR_INVALID_VALUE;
    rc = ipc_open(c, &p, &handle, flags);
    if (rc == FC_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    return rc;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    DRV_CTX("cuIpcCloseMemHandle");
    return ipc_close(c, (void *)(uintptr_t)dptr);
}

CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    DRV_CTX("cuMemHostRegister_v2");
    return host_register(c, p, size, flags, "cuMemHostRegister");
}

CUresult cuMemHostUnregister(void *p)
{
    DRV_CTX("cuMemHostUnregister");
    return host_unregister(c, p, false);
}

/* ---- runtime entry points: memory ------------------------------------------- */

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    RT_CTX("cudaMalloc");
    return fc_rt_ret(mem_alloc(c, size, ptr));
}

/* cudaFree(NULL) does nothing but what every runtime call does: make the
 * device's context exist (the idiom that forces its creation). */
cudaError_t cudaFree(void *ptr)
{
    RT_CTX("cudaFree");
    if (!ptr)
        return FC_SUCCESS;
    return fc_rt_ret(mem_free(c, ptr, "cudaFree"));
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    RT_CTX("cudaHostRegister");
    return fc_rt_ret(host_register(c, ptr, size, flags, "cudaHostRegister"));
}

cudaError_t cudaHostUnregister(void *ptr)
{
    RT_CTX("cudaHostUnregister");
    return fc_rt_ret(host_unregister(c, ptr, false));
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr)
{
    RT_CTX("cudaIpcGetMemHandle");
    return fc_rt_ret(ipc_get(c, handle, ptr));
}

cudaError_t cudaIpcOpenMemHandle(void **ptr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    RT_CTX("cudaIpcOpenMemHandle");
    return fc_rt_ret(ipc_open(c, ptr, &handle, flags));
}

cudaError_t cudaIpcCloseMemHandle(void *ptr)
{
    RT_CTX("cudaIpcCloseMemHandle");
    return fc_rt_ret(ipc_close(c, ptr));
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    unsigned long long used;

    RT_CTX("cudaMemGetInfo");
    if (!free_bytes || !total)
        return fc_rt_ret(FC_ERR_INVALID_VALUE);
    used = fc_used_bytes(c->phys);
    *total = (size_t)fc.cfg.mem_bytes;
    *free_bytes = used >= fc.cfg.mem_bytes ? 0 : (size_t)(fc.cfg.mem_bytes - used);
    return FC_SUCCESS;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    int phys = -1;

    RT_CTX("cudaPointerGetAttributes");
    if (!attr || !ptr)
        return fc_rt_ret(FC_ERR_INVALID_VALUE);
    memset(attr, 0, sizeof *attr);
    if (fc_range_class(ptr, 1, &phys) == 1) {
        attr->type = 2;
        attr->device = fc_phys_ordinal(phys);
        attr->devicePointer = (void *)ptr;
    } else if (fc_host_pinned(ptr, 1, c->phys) == 1) {
        attr->type = 1;
        attr->device = fc_phys_ordinal(c->phys);
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = (void *)ptr;
    } else {
        attr->type = 0;
        attr->device = -2;
        attr->hostPointer = (void *)ptr;
    }
    return FC_SUCCESS;
}

/* Page-locked host memory of the fake: an anonymous mapping registered as
 * portable (with unified addressing every context sees it as pinned). */
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    void *m;

    RT_CTX("cudaHostAlloc");
    if (!ptr || size == 0 || (flags & ~0xFu))
        return fc_rt_ret(FC_ERR_INVALID_VALUE);
    m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return fc_rt_ret(FC_ERR_OUT_OF_MEMORY);
    rc = host_register(c, m, size, FC_HOSTREG_PORTABLE | 0x100, "cudaHostAlloc");
    if (rc) {
        munmap(m, size);
        return fc_rt_ret(rc);
    }
    *ptr = m;
    return FC_SUCCESS;
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, 0);
}

cudaError_t cudaFreeHost(void *ptr)
{
    RT_CTX("cudaFreeHost");
    if (!ptr)
        return FC_SUCCESS;
    rc = host_unregister(c, ptr, true);
    return fc_rt_ret(rc == FC_ERR_HOST_MEMORY_NOT_REGISTERED ? FC_ERR_INVALID_VALUE : rc);
}
