/* arena: host memfd arena and its slab allocator (see arena.h).
 *
 * Layout: the region is slabs_total slabs of slab_bytes each. A free slab is
 * on the free-slab stack; a slab owned by a class holds slab_bytes / stride
 * blocks of that class's stride. A class keeps its slabs that still have a
 * free block on a doubly-linked "partial" list; alloc takes a block from the
 * head slab and pops a free slab only when that list is empty.
 *
 * Regions (arena_set_regions): the slabs may be split into up to
 * ARENA_MAX_REGIONS contiguous regions (the host memory of each NUMA node
 * that has GPUs, mem/numa.h). Each region has its own free-slab stack (its
 * part of free_slabs) and each class one partial list per region, so
 * arena_alloc_near() takes a block from the wanted region in O(1) and falls
 * back to the others in O(regions). One region (the default) is the plain
 * allocator.
 *
 * Free blocks inside a slab are tracked by a per-slab hierarchical bitmap
 * (bit set = allocated; an upper-level bit is set when the 64-bit word below
 * it is full). Finding the lowest free block is one ctz per level and there
 * are at most ARENA_MAX_LEVELS levels, so alloc and free are O(1) with no
 * loop over slabs or blocks. All-zero means all free, so a slab handed back
 * to the pool needs no reset whatever stride it is given next. The bitmap
 * also tells free() whether an offset is currently allocated, so a bad or
 * double free is counted and ignored instead of corrupting anything.
 *
 * Allocator state lives in daemon memory only, never in the shared mapping:
 * clients can write to the arena and must not be able to break the daemon. */
#include "mem/arena.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"
#include "mem/arena_internal.h"

/* Lay out the bitmap levels for slabs of up to max_blocks blocks. */
static void arena_plan_levels(struct arena *a, uint64_t max_blocks)
{
    uint64_t n = max_blocks;
    size_t off = 0;
    a->nlevels = 0;
    do {
        uint64_t words = (n + 63) / 64;
        a->level_off[a->nlevels++] = off;
        off += words;
        n = words;
    } while (n > 1);
    a->slab_words = off;
}

/* The allocator over `bytes` (rounded down to whole slabs) of not yet
 * attached memory: checks the geometry and builds the metadata. */
int arena_new(uint32_t id, uint64_t bytes, uint64_t slab_bytes, struct arena **out,
                     char *err, size_t errlen)
{
    if (out)
        *out = NULL;
    if (!out) {
        errmsg_set(err, errlen, "arena: no output pointer");
        return -KVNODE_EINVAL;
    }
    if (slab_bytes == 0 || slab_bytes % ARENA_STRIDE_ALIGN != 0) {
        errmsg_set(err, errlen, "arena: slab_bytes %" PRIu64 " is not a positive multiple of %u",
                      slab_bytes, ARENA_STRIDE_ALIGN);
        return -KVNODE_EINVAL;
    }
    if (slab_bytes > ARENA_MAX_SLAB_BYTES) {
        errmsg_set(err, errlen, "arena: slab_bytes %" PRIu64 " is over the maximum %" PRIu64,
                      slab_bytes, (uint64_t)ARENA_MAX_SLAB_BYTES);
        return -KVNODE_EINVAL;
    }
    if (bytes < slab_bytes) {
        errmsg_set(err, errlen, "arena: size %" PRIu64 " bytes is smaller than one slab (%" PRIu64
                      " bytes)", bytes, slab_bytes);
        return -KVNODE_EINVAL;
    }
    uint64_t nslabs = bytes / slab_bytes;
    if (nslabs >= ARENA_NONE) {
        errmsg_set(err, errlen, "arena: size %" PRIu64 " bytes makes %" PRIu64
                      " slabs of %" PRIu64 " bytes, over the limit of %u slabs",
                      bytes, nslabs, slab_bytes, ARENA_NONE - 1);
        return -KVNODE_EINVAL;
    }
    uint64_t size = nslabs * slab_bytes;
    if (size > (uint64_t)SIZE_MAX || size > (uint64_t)INT64_MAX) {
        errmsg_set(err, errlen, "arena: size %" PRIu64 " bytes cannot be mapped", size);
        return -KVNODE_EINVAL;
    }

    struct arena *a = calloc(1, sizeof(*a));
    if (!a) {
        errmsg_set(err, errlen, "arena: out of memory");
        return -KVNODE_ENOMEM;
    }
    a->id = id;
    a->fd = -1;
    a->ro_fd = -1;
    snprintf(a->ro_why, sizeof a->ro_why, "the arena has no descriptor to map");
    a->page_size = ARENA_SMALL_PAGE;
    snprintf(a->huge_pages, sizeof a->huge_pages, "off");
    a->base = MAP_FAILED;
    a->size = size;
    a->slab_bytes = slab_bytes;
    a->slabs_total = (uint32_t)nslabs;
    a->slabs_usable = (uint32_t)nslabs;
    atomic_init(&a->reserved, size);
    arena_plan_levels(a, slab_bytes / ARENA_STRIDE_ALIGN);

    int rc = -KVNODE_ENOMEM;
    a->slabs = calloc(nslabs, sizeof(*a->slabs));
    a->free_slabs = calloc(nslabs, sizeof(*a->free_slabs));
    /* calloc'd zero pages are only materialised where blocks are tracked. */
    a->bits = calloc(nslabs, a->slab_words * sizeof(uint64_t));
    if (!a->slabs || !a->free_slabs || !a->bits) {
        errmsg_set(err, errlen, "arena: out of memory for %" PRIu64 " slabs of metadata", nslabs);
        goto fail;
    }
    for (uint32_t i = 0; i < a->slabs_total; i++) {
        a->slabs[i].cls = ARENA_NONE;
        a->slabs[i].prev = a->slabs[i].next = ARENA_NONE;
    }
    uint64_t all = a->size;
    arena_set_regions(a, 1, &all, NULL, 0);
    a->tier = KVNODE_TIER_HOST;
    a->device = -1;
    *out = a;
    return 0;

fail:
    arena_destroy(a);
    return rc;
}

/* The memfd reopened read-only through /proc/self/fd: a new open file of the
 * same memory whose mappings can never be made writable (mmap PROT_WRITE and
 * mprotect fail with EACCES), one per arena whatever the number of readers.
 * The memfd's mode then becomes 0400: a memfd is created 0777, so a process
 * of another user holding the read-only descriptor could otherwise open
 * /proc/self/fd/N again for writing. Open descriptors keep their access. A
 * failure leaves ro_fd -1 and says why (readers are then refused). */
void arena_open_readonly(struct arena *a, int fd)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int ro = open(path, O_RDONLY | O_CLOEXEC);
    if (ro < 0) {
        snprintf(a->ro_why, sizeof a->ro_why, "cannot reopen the memfd read-only through %s: %s",
                 path, strerror(errno));
        return;
    }
    if (fchmod(fd, S_IRUSR) != 0) {
        snprintf(a->ro_why, sizeof a->ro_why, "cannot restrict the memfd's mode to 0400: %s",
                 strerror(errno));
        close(ro);
        return;
    }
    a->ro_fd = ro;
    a->ro_why[0] = '\0';
}

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#ifndef MFD_HUGE_SHIFT
#define MFD_HUGE_SHIFT 26
#endif
#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif

/* One unsigned figure from a small sysfs file; UINT64_MAX when unreadable. */
static uint64_t arena_read_u64(const char *path)
{
    FILE *f = fopen(path, "re");
    unsigned long long v;
    int n = f ? fscanf(f, "%llu", &v) : 0;
    if (f)
        fclose(f);
    return n == 1 ? (uint64_t)v : UINT64_MAX;
}

/* Free (unreserved) pages of one hugetlb pool, 0 when there is none. */
static uint64_t arena_hugetlb_free(uint64_t page_kib)
{
    char path[96];
    snprintf(path, sizeof path, "/sys/kernel/mm/hugepages/hugepages-%" PRIu64 "kB/free_hugepages", page_kib);
    uint64_t free_pages = arena_read_u64(path);
    snprintf(path, sizeof path, "/sys/kernel/mm/hugepages/hugepages-%" PRIu64 "kB/resv_hugepages", page_kib);
    uint64_t resv = arena_read_u64(path);
    if (free_pages == UINT64_MAX)
        return 0;
    if (resv == UINT64_MAX)
        resv = 0;
    return free_pages > resv ? free_pages - resv : 0;
}

/* The selected word of shmem_enabled ("[never]" -> "never"), "" unreadable. */
static void arena_shmem_thp(char *out, size_t len)
{
    char buf[160] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
    if (f) {
        if (!fgets(buf, sizeof buf, f))
            buf[0] = '\0';
        fclose(f);
    }
    char *l = strchr(buf, '['), *r = l ? strchr(l, ']') : NULL;
    if (!l || !r) {
        snprintf(out, len, "%s", "");
        return;
    }
    snprintf(out, len, "%.*s", (int)(r - l - 1), l + 1);
}

/* How the host arena of *size bytes is backed under memory.huge_pages
 * (ARENA_HUGE_*): the memfd flags, the page size (*size is rounded up to a
 * whole page: hugetlb files have whole huge pages only) and whether the
 * mapping wants MADV_HUGEPAGE (shmem_enabled = advise). Records the choice
 * and the reason in a. -KVNODE_ENOMEM with err when huge = ON finds
 * neither a hugetlb pool with room nor shmem THP. */
static int arena_choose_pages(struct arena *a, int huge, uint64_t *size, unsigned *mfd_flags,
                              bool *madvise_huge, char *err, size_t errlen)
{
    static const struct { uint64_t kib; unsigned log2; const char *name; } pools[] = {
        { UINT64_C(1048576), 30, "1GiB" }, { 2048, 21, "2MiB" },
    };
    *mfd_flags = 0;
    *madvise_huge = false;
    a->page_size = ARENA_SMALL_PAGE;
    snprintf(a->huge_pages, sizeof a->huge_pages, "off");
    if (huge == ARENA_HUGE_OFF) {
        snprintf(a->huge_why, sizeof a->huge_why, "memory.huge_pages = off");
        return 0;
    }
    char pool_why[160] = "";
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
        uint64_t page = pools[i].kib * 1024;
        /* A 1GiB page only where the size is whole GiB: rounding up would waste up to 1GiB. */
        if (page > UINT64_C(2) << 20 && *size % page != 0)
            continue;
        uint64_t need = (*size + page - 1) / page, free_pages = arena_hugetlb_free(pools[i].kib);
        if (free_pages >= need) {
            *mfd_flags = MFD_HUGETLB | (pools[i].log2 << MFD_HUGE_SHIFT);
            *size = need * page;
            a->page_size = page;
            snprintf(a->huge_pages, sizeof a->huge_pages, "hugetlb %s", pools[i].name);
            snprintf(a->huge_why, sizeof a->huge_why, "%" PRIu64 " of the %" PRIu64 " free %s pages of the "
                     "hugetlb pool", need, free_pages, pools[i].name);
            return 0;
        }
        if (pool_why[0] == '\0')
            snprintf(pool_why, sizeof pool_why, "the hugetlb pool has %" PRIu64 " free %s pages, %" PRIu64
                     " needed (vm.nr_hugepages)", free_pages, pools[i].name, need);
    }
    char thp[32];
    arena_shmem_thp(thp, sizeof thp);
    bool advise = strcmp(thp, "advise") == 0;
    if (advise || strcmp(thp, "always") == 0 || strcmp(thp, "within_size") == 0 || strcmp(thp, "force") == 0) {
        *madvise_huge = advise;
        a->page_size = UINT64_C(2) << 20;
        snprintf(a->huge_pages, sizeof a->huge_pages, "thp");
        snprintf(a->huge_why, sizeof a->huge_why, "transparent huge pages for shmem (shmem_enabled = %s%s); %s",
                 thp, advise ? ", MADV_HUGEPAGE" : "", pool_why);
        return 0;
    }
    snprintf(a->huge_why, sizeof a->huge_why, "no huge pages: %s, and transparent huge pages for shmem are "
             "off (/sys/kernel/mm/transparent_hugepage/shmem_enabled is '%s', needs always, within_size or "
             "advise)", pool_why, thp[0] ? thp : "unreadable");
    if (huge == ARENA_HUGE_ON) {
        errmsg_set(err, errlen, "arena: memory.huge_pages = on but %s; reserve the pool (vm.nr_hugepages) or "
                   "set memory.huge_pages = auto", a->huge_why);
        return -KVNODE_ENOMEM;
    }
    return 0;
}

static int arena_create_host_as(uint32_t id, uint64_t bytes, uint64_t slab_bytes, int huge, bool deferred,
                                struct arena **out, char *err, size_t errlen)
{
    struct arena *a;
    int rc = arena_new(id, bytes, slab_bytes, &a, err, errlen);
    if (rc < 0) {
        if (out)
            *out = NULL;
        return rc;
    }
    uint64_t size = a->size;
    a->owns_memory = true;
    unsigned mfd_huge;
    bool madvise_huge;
    rc = arena_choose_pages(a, huge, &size, &mfd_huge, &madvise_huge, err, errlen);
    if (rc < 0)
        goto fail;
    a->size = size;
    rc = -KVNODE_EIO;
    a->fd = memfd_create("kvnode-host", MFD_CLOEXEC | MFD_ALLOW_SEALING | mfd_huge);
    if (a->fd < 0) {
        errmsg_set(err, errlen, "arena: memfd_create: %s", strerror(errno));
        goto fail;
    }
    if (ftruncate(a->fd, (off_t)size) != 0) {
        errmsg_set(err, errlen, "arena: ftruncate memfd to %" PRIu64 " bytes: %s", size,
                      strerror(errno));
        goto fail;
    }
    /* Reserve every page now (deferred: populate.c does it in chunks after
     * the daemon serves, and nothing is usable until it has): the tier is
     * ours for the daemon's life and blocks must not pay a zero-fill page
     * fault on first use. */
    if (deferred) {
        a->slabs_usable = 0;
        atomic_store(&a->reserved, 0);
    } else if (fallocate(a->fd, 0, 0, (off_t)size) != 0) {
        rc = errno == ENOSPC || errno == ENOMEM ? -KVNODE_ENOMEM : -KVNODE_EIO;
        errmsg_set(err, errlen, "arena: cannot reserve %" PRIu64 " bytes of host memory: %s",
                      size, strerror(errno));
        goto fail;
    }
    /* Clients map the fd: its size must never change under them. */
    if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        errmsg_set(err, errlen, "arena: sealing memfd: %s", strerror(errno));
        goto fail;
    }
    arena_open_readonly(a, a->fd);
    a->base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (deferred ? 0 : MAP_POPULATE), a->fd, 0);
    if (a->base == MAP_FAILED) {
        if (errno == ENOMEM)
            rc = -KVNODE_ENOMEM;
        errmsg_set(err, errlen, "arena: mmap of %" PRIu64 " bytes: %s", size, strerror(errno));
        goto fail;
    }
    /* shmem_enabled = advise: huge pages for faults from here on; the pages
     * fallocate gave are collapsed by khugepaged. */
    if (madvise_huge && madvise(a->base, (size_t)size, MADV_HUGEPAGE) != 0)
        snprintf(a->huge_why + strlen(a->huge_why), sizeof a->huge_why - strlen(a->huge_why),
                 " (madvise MADV_HUGEPAGE failed: %s)", strerror(errno));
    *out = a;
    return 0;

fail:
    arena_destroy(a);
    *out = NULL;
    return rc;
}

int arena_create_host(uint32_t id, uint64_t bytes, uint64_t slab_bytes, int huge, struct arena **out,
                      char *err, size_t errlen)
{
    return arena_create_host_as(id, bytes, slab_bytes, huge, false, out, err, errlen);
}

int arena_create_host_deferred(uint32_t id, uint64_t bytes, uint64_t slab_bytes, int huge,
                               struct arena **out, char *err, size_t errlen)
{
    return arena_create_host_as(id, bytes, slab_bytes, huge, true, out, err, errlen);
}

void arena_mark_reserved(struct arena *a, uint64_t bytes)
{
    atomic_store_explicit(&a->reserved, bytes < a->size ? bytes : a->size, memory_order_release);
}

uint64_t arena_reserved(const struct arena *a)
{
    return atomic_load_explicit(&((struct arena *)a)->reserved, memory_order_acquire);
}

/* Slabs wholly inside the reserved part. */
static uint32_t arena_reserved_slabs(const struct arena *a)
{
    return (uint32_t)(arena_reserved(a) / a->slab_bytes);
}

int arena_create_over(uint32_t id, int tier, int device, void *base, int fd, uint64_t bytes,
                      uint64_t slab_bytes, struct arena **out, char *err, size_t errlen)
{
    struct arena *a;
    int rc = arena_new(id, bytes, slab_bytes, &a, err, errlen);
    if (rc < 0)
        return rc;
    a->tier = tier;
    a->device = device;
    a->base = base;
    a->fd = fd;
    if (fd >= 0)
        arena_open_readonly(a, fd);
    *out = a;
    return 0;
}

void arena_destroy(struct arena *a)
{
    if (!a)
        return;
    if (a->owns_memory) {
        if (a->base != MAP_FAILED)
            munmap(a->base, (size_t)a->size);
        if (a->fd >= 0)
            close(a->fd);
    }
    if (a->ro_fd >= 0)
        close(a->ro_fd);
    free(a->bits);
    free(a->free_slabs);
    free(a->slabs);
    free(a);
}

uint32_t arena_id(const struct arena *a) { return a->id; }
int      arena_tier(const struct arena *a) { return a->tier; }
int      arena_device(const struct arena *a) { return a->device; }
int      arena_fd(const struct arena *a) { return a->fd; }
int      arena_fd_readonly(const struct arena *a) { return a->ro_fd; }
const char *arena_fd_readonly_why(const struct arena *a) { return a->ro_fd >= 0 ? "" : a->ro_why; }
void    *arena_base(const struct arena *a) { return a->base; }
uint64_t arena_size(const struct arena *a) { return a->size; }
uint64_t arena_page_size(const struct arena *a) { return a->page_size; }
const char *arena_huge_pages(const struct arena *a) { return a->huge_pages; }
const char *arena_huge_pages_why(const struct arena *a) { return a->huge_why; }

int arena_set_regions(struct arena *a, uint32_t n, const uint64_t *ends, char *err, size_t errlen)
{
    if (n == 0 || n > ARENA_MAX_REGIONS) {
        errmsg_set(err, errlen, "arena: %u regions (1 to %u)", n, ARENA_MAX_REGIONS);
        return -KVNODE_EINVAL;
    }
    if (a->nregions && (a->blocks != 0 || a->nfree_slabs != a->slabs_total)) {
        errmsg_set(err, errlen, "arena: regions are set before any block is placed");
        return -KVNODE_EINVAL;
    }
    uint32_t first = 0;
    for (uint32_t r = 0; r < n; r++) {
        uint64_t end = ends[r] / a->slab_bytes;
        if (ends[r] % a->slab_bytes != 0 || end <= first || end > a->slabs_total ||
            (r == n - 1 && end != a->slabs_total)) {
            errmsg_set(err, errlen, "arena: region %u ends at byte %" PRIu64 ": regions must be "
                       "whole slabs of %" PRIu64 " bytes, ascending, and end at %" PRIu64, r, ends[r],
                       a->slab_bytes, a->size);
            return -KVNODE_EINVAL;
        }
        first = (uint32_t)end;
    }
    first = 0;
    for (uint32_t r = 0; r < n; r++) {
        struct arena_region *g = &a->regions[r];
        g->first = first;
        g->end = (uint32_t)(ends[r] / a->slab_bytes);
        g->used_bytes = 0;
        /* The stack pops the region's lowest slab first, so a fresh region
         * fills from its start (and the reserved prefix covers it in order). */
        g->nfree = g->end - g->first;
        for (uint32_t i = 0; i < g->nfree; i++)
            a->free_slabs[g->first + i] = g->end - 1 - i;
        first = g->end;
    }
    a->nregions = n;
    a->nfree_slabs = a->slabs_total;
    for (uint32_t c = 0; c < ARENA_MAX_CLASSES; c++)
        for (uint32_t r = 0; r < ARENA_MAX_REGIONS; r++)
            a->classes[c].partial[r] = ARENA_NONE;
    return 0;
}

uint32_t arena_region_count(const struct arena *a) { return a->nregions; }

uint32_t arena_slab_region(const struct arena *a, uint32_t s)
{
    uint32_t r = 0;
    while (r + 1 < a->nregions && s >= a->regions[r].end)
        r++;
    return r;
}

uint32_t arena_region_of(const struct arena *a, uint64_t offset)
{
    return arena_slab_region(a, (uint32_t)(offset / a->slab_bytes));
}

void arena_get_region_stats(const struct arena *a, uint32_t r, struct arena_region_stats *out)
{
    memset(out, 0, sizeof *out);
    if (r >= a->nregions)
        return;
    const struct arena_region *g = &a->regions[r];
    out->start = (uint64_t)g->first * a->slab_bytes;
    out->end = (uint64_t)g->end * a->slab_bytes;
    out->used_bytes = g->used_bytes;
    /* Free slabs inside the reserved part, as arena_get_stats counts them. */
    uint32_t usable = arena_reserved_slabs(a);
    uint32_t unreserved = g->end > usable ? g->end - (usable > g->first ? usable : g->first) : 0;
    out->slabs_free = g->nfree - unreserved;
}

int arena_class_for(struct arena *a, uint64_t block_bytes, uint32_t *cls)
{
    if (block_bytes == 0 || block_bytes > a->slab_bytes)
        return -KVNODE_ETOOBIG;
    uint64_t stride = (block_bytes + ARENA_STRIDE_ALIGN - 1) / ARENA_STRIDE_ALIGN * ARENA_STRIDE_ALIGN;
    /* At most ARENA_MAX_CLASSES entries, called on HELLO only. */
    for (uint32_t i = 0; i < a->nclasses; i++) {
        if (a->classes[i].stride == stride) {
            if (cls)
                *cls = i;
            return 0;
        }
    }
    if (a->nclasses >= ARENA_MAX_CLASSES)
        return -KVNODE_ELIMIT;
    struct arena_class *c = &a->classes[a->nclasses];
    for (uint32_t r = 0; r < ARENA_MAX_REGIONS; r++)
        c->partial[r] = ARENA_NONE;
    c->stride = stride;
    c->per_slab = (uint32_t)(a->slab_bytes / stride);
    c->slabs = 0;
    c->blocks = 0;
    if (cls)
        *cls = a->nclasses;
    a->nclasses++;
    return 0;
}

uint64_t arena_class_stride(const struct arena *a, uint32_t cls)
{
    return cls < a->nclasses ? a->classes[cls].stride : 0;
}

uint32_t arena_class_count(const struct arena *a) { return a->nclasses; }

uint64_t arena_class_blocks(const struct arena *a, uint32_t cls)
{
    return cls < a->nclasses ? a->classes[cls].blocks : 0;
}

uint32_t arena_class_slabs(const struct arena *a, uint32_t cls)
{
    return cls < a->nclasses ? a->classes[cls].slabs : 0;
}

uint32_t arena_class_blocks_per_slab(const struct arena *a, uint32_t cls)
{
    return cls < a->nclasses ? a->classes[cls].per_slab : 0;
}

void arena_partial_push(struct arena *a, struct arena_class *c, uint32_t s)
{
    struct arena_slab *sl = &a->slabs[s];
    uint32_t *head = &c->partial[arena_slab_region(a, s)];
    sl->prev = ARENA_NONE;
    sl->next = *head;
    if (*head != ARENA_NONE)
        a->slabs[*head].prev = s;
    *head = s;
}

static void arena_partial_unlink(struct arena *a, struct arena_class *c, uint32_t s)
{
    struct arena_slab *sl = &a->slabs[s];
    if (sl->prev != ARENA_NONE)
        a->slabs[sl->prev].next = sl->next;
    else
        c->partial[arena_slab_region(a, s)] = sl->next;
    if (sl->next != ARENA_NONE)
        a->slabs[sl->next].prev = sl->prev;
    sl->prev = sl->next = ARENA_NONE;
}

/* Lowest free block of slab s; the caller knows one exists. Descends from
 * the top word, taking the lowest non-full child at each level. */
static uint32_t arena_bits_take(struct arena *a, uint32_t s)
{
    uint64_t *bm = a->bits + (size_t)s * a->slab_words;
    uint64_t idx = 0;
    for (uint32_t lv = a->nlevels; lv-- > 0;) {
        uint64_t w = bm[a->level_off[lv] + idx];
        idx = idx * 64 + (uint64_t)__builtin_ctzll(~w);
    }
    /* Set the leaf bit; mark a word full upwards while words fill up. */
    uint64_t i = idx;
    for (uint32_t lv = 0; lv < a->nlevels; lv++) {
        uint64_t *w = &bm[a->level_off[lv] + i / 64];
        *w |= UINT64_C(1) << (i % 64);
        if (*w != UINT64_MAX)
            break;
        i /= 64;
    }
    return (uint32_t)idx;
}

int arena_bits_test(const struct arena *a, uint32_t s, uint32_t idx)
{
    const uint64_t *bm = a->bits + (size_t)s * a->slab_words;
    return (bm[idx / 64] >> (idx % 64)) & 1u;
}

static void arena_bits_clear(struct arena *a, uint32_t s, uint32_t idx)
{
    uint64_t *bm = a->bits + (size_t)s * a->slab_words;
    uint64_t i = idx;
    for (uint32_t lv = 0; lv < a->nlevels; lv++) {
        uint64_t *w = &bm[a->level_off[lv] + i / 64];
        int was_full = *w == UINT64_MAX;
        *w &= ~(UINT64_C(1) << (i % 64));
        if (!was_full)
            break;
        i /= 64;
    }
}

/* True when region r's next free slab is inside the reserved part. Never-
 * used slabs pop in ascending order and freed ones sit above them (and are
 * reserved), so a top beyond the reserved part means no usable slab. */
static bool arena_region_has_slab(struct arena *a, uint32_t r)
{
    const struct arena_region *g = &a->regions[r];
    if (g->nfree == 0)
        return false;
    uint32_t top = a->free_slabs[g->first + g->nfree - 1];
    return top < a->slabs_usable || top < (a->slabs_usable = arena_reserved_slabs(a));
}

/* Give the next free slab of region r to class cls (the caller checked
 * arena_region_has_slab). */
static uint32_t arena_take_slab(struct arena *a, uint32_t cls, uint32_t r)
{
    struct arena_region *g = &a->regions[r];
    uint32_t s = a->free_slabs[g->first + --g->nfree];
    a->nfree_slabs--;
    a->slabs[s].cls = cls;
    a->slabs[s].used = 0;
    a->classes[cls].slabs++;
    arena_partial_push(a, &a->classes[cls], s);
    return s;
}

/* The slab to place a block of cls in, preferring region want: a partly
 * used slab of that region, a free one of it, then any other region's
 * partly used slab, then the free slab of the region with the most.
 * ARENA_NONE when there is none. O(regions). */
static uint32_t arena_pick_slab(struct arena *a, uint32_t cls, uint32_t want)
{
    struct arena_class *c = &a->classes[cls];
    if (want < a->nregions) {
        if (c->partial[want] != ARENA_NONE)
            return c->partial[want];
        if (arena_region_has_slab(a, want))
            return arena_take_slab(a, cls, want);
    }
    for (uint32_t r = 0; r < a->nregions; r++)
        if (c->partial[r] != ARENA_NONE)
            return c->partial[r];
    uint32_t best = ARENA_NONE;
    for (uint32_t r = 0; r < a->nregions; r++)
        if (arena_region_has_slab(a, r) && (best == ARENA_NONE || a->regions[r].nfree > a->regions[best].nfree))
            best = r;
    return best == ARENA_NONE ? ARENA_NONE : arena_take_slab(a, cls, best);
}

int arena_alloc_near(struct arena *a, uint32_t cls, uint32_t region, uint64_t *offset)
{
    if (cls >= a->nclasses)
        return -KVNODE_EINVAL;
    struct arena_class *c = &a->classes[cls];
    uint32_t s = arena_pick_slab(a, cls, region);
    if (s == ARENA_NONE)
        return -KVNODE_ENOSPC;
    struct arena_slab *sl = &a->slabs[s];
    uint32_t idx = arena_bits_take(a, s);
    if (++sl->used == c->per_slab)
        arena_partial_unlink(a, c, s);
    c->blocks++;
    a->blocks++;
    a->used_bytes += c->stride;
    a->regions[arena_slab_region(a, s)].used_bytes += c->stride;
    *offset = (uint64_t)s * a->slab_bytes + (uint64_t)idx * c->stride;
    return 0;
}

int arena_alloc(struct arena *a, uint32_t cls, uint64_t *offset)
{
    return arena_alloc_near(a, cls, ARENA_ANY_REGION, offset);
}

void arena_free(struct arena *a, uint64_t offset)
{
    if (offset >= a->size) {
        a->bad_frees++;
        return;
    }
    uint32_t s = (uint32_t)(offset / a->slab_bytes);
    uint64_t in_slab = offset % a->slab_bytes;
    struct arena_slab *sl = &a->slabs[s];
    if (sl->cls == ARENA_NONE) {
        a->bad_frees++;
        return;
    }
    struct arena_class *c = &a->classes[sl->cls];
    uint64_t idx = in_slab / c->stride;
    if (in_slab % c->stride != 0 || idx >= c->per_slab || !arena_bits_test(a, s, (uint32_t)idx)) {
        a->bad_frees++;
        return;
    }
    arena_bits_clear(a, s, (uint32_t)idx);
    int was_full = sl->used == c->per_slab;
    struct arena_region *g = &a->regions[arena_slab_region(a, s)];
    sl->used--;
    c->blocks--;
    a->blocks--;
    a->used_bytes -= c->stride;
    g->used_bytes -= c->stride;
    if (sl->used == 0) {
        /* Empty: back to its region's pool at once so any class can take it. */
        if (!was_full)
            arena_partial_unlink(a, c, s);
        sl->cls = ARENA_NONE;
        c->slabs--;
        a->free_slabs[g->first + g->nfree++] = s;
        a->nfree_slabs++;
    } else if (was_full) {
        arena_partial_push(a, c, s);
    }
}

int arena_can_alloc(const struct arena *a, uint32_t cls)
{
    if (cls >= a->nclasses)
        return 0;
    uint32_t usable = a->slabs_usable;
    for (uint32_t r = 0; r < a->nregions; r++) {
        const struct arena_region *g = &a->regions[r];
        if (a->classes[cls].partial[r] != ARENA_NONE)
            return 1;
        if (g->nfree == 0)
            continue;
        uint32_t top = a->free_slabs[g->first + g->nfree - 1];
        if (top < usable || top < arena_reserved_slabs(a))
            return 1;
    }
    return 0;
}

uint64_t arena_free_slots(const struct arena *a, uint32_t cls)
{
    if (cls >= a->nclasses)
        return 0;
    const struct arena_class *c = &a->classes[cls];
    uint32_t usable = arena_reserved_slabs(a);
    uint64_t free_slabs = a->nfree_slabs - (a->slabs_total - usable);
    return (uint64_t)c->slabs * c->per_slab - c->blocks + free_slabs * c->per_slab;
}

uint64_t arena_bad_frees(const struct arena *a) { return a->bad_frees; }

void arena_get_stats(const struct arena *a, struct arena_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->capacity = a->size;
    st->used_bytes = a->used_bytes;
    st->slab_bytes = a->slab_bytes;
    st->slabs_total = a->slabs_total;
    uint32_t usable = arena_reserved_slabs(a);
    st->reserved_bytes = arena_reserved(a);
    /* Free slabs inside the reserved part: every slab beyond it is free. */
    st->slabs_free = a->nfree_slabs - (a->slabs_total - usable);
    st->blocks = a->blocks;
}
