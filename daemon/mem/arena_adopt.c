/* arena_adopt: a host arena over the memfd a previous daemon handed over
 * (warm restart, see arena.h), its blocks placed where they were. */
#include "mem/arena.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"
#include "mem/arena_internal.h"

int arena_adopt_host(uint32_t id, int fd, uint64_t bytes, uint64_t slab_bytes, uint64_t reserved,
                     struct arena **out, char *err, size_t errlen)
{
    struct arena *a;
    struct stat st;
    int rc = arena_new(id, bytes, slab_bytes, &a, err, errlen), seals;
    *out = NULL;
    if (rc < 0) {
        close(fd);
        return rc;
    }
    a->owns_memory = true;
    a->fd = fd;
    rc = -KVNODE_EINVAL;
    if (fstat(fd, &st) != 0 || (seals = fcntl(fd, F_GET_SEALS)) < 0) {
        errmsg_set(err, errlen, "arena: the handed-over memory is not a memfd: %s", strerror(errno));
        goto fail;
    }
    /* Its size can never change (clients map it), and it is this geometry's. */
    uint64_t page = st.st_blksize > 0 ? (uint64_t)st.st_blksize : ARENA_SMALL_PAGE;
    if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW) || st.st_size < 0 ||
        (uint64_t)st.st_size < a->size || (uint64_t)st.st_size - a->size >= page) {
        errmsg_set(err, errlen, "arena: the handed-over memfd is %lld bytes (seals 0x%x), not the %" PRIu64
                   " bytes of memory.* now, sealed", (long long)st.st_size, (unsigned)seals, a->size);
        goto fail;
    }
    a->size = (uint64_t)st.st_size;
    a->page_size = page;
    snprintf(a->huge_pages, sizeof a->huge_pages, "%s", page > ARENA_SMALL_PAGE ? "hugetlb" : "off");
    snprintf(a->huge_why, sizeof a->huge_why, "the previous daemon's memory, handed over (warm restart)");
    /* Pages the previous daemon had not reserved yet; those it had (every
     * block's) are kept as they are. */
    if (reserved < a->size && fallocate(fd, 0, (off_t)reserved, (off_t)(a->size - reserved)) != 0) {
        rc = -KVNODE_ENOMEM;
        errmsg_set(err, errlen, "arena: cannot reserve the handed-over memory: %s", strerror(errno));
        goto fail;
    }
    arena_open_readonly(a, fd);
    a->base = mmap(NULL, (size_t)a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (a->base == MAP_FAILED) {
        rc = -KVNODE_ENOMEM;
        errmsg_set(err, errlen, "arena: mmap of %" PRIu64 " bytes: %s", a->size, strerror(errno));
        goto fail;
    }
    *out = a;
    return 0;
fail:
    arena_destroy(a);
    return rc;
}

int arena_adopt_block(struct arena *a, uint32_t cls, uint64_t offset)
{
    if (cls >= a->nclasses || offset >= (uint64_t)a->slabs_total * a->slab_bytes)
        return -KVNODE_EINVAL;
    struct arena_class *c = &a->classes[cls];
    uint32_t s = (uint32_t)(offset / a->slab_bytes);
    uint64_t in_slab = offset % a->slab_bytes, idx = in_slab / c->stride;
    struct arena_slab *sl = &a->slabs[s];
    if ((sl->cls != ARENA_NONE && sl->cls != cls) || in_slab % c->stride != 0 || idx >= c->per_slab ||
        arena_bits_test(a, s, (uint32_t)idx))
        return -KVNODE_EINVAL;
    /* arena_bits_take's marking, for this slot. */
    uint64_t *bm = a->bits + (size_t)s * a->slab_words, i = idx;
    for (uint32_t lv = 0; lv < a->nlevels; lv++) {
        uint64_t *w = &bm[a->level_off[lv] + i / 64];
        *w |= UINT64_C(1) << (i % 64);
        if (*w != UINT64_MAX)
            break;
        i /= 64;
    }
    sl->cls = cls;
    sl->used++;
    c->blocks++;
    a->blocks++;
    a->used_bytes += c->stride;
    a->regions[arena_slab_region(a, s)].used_bytes += c->stride;
    return 0;
}

void arena_adopt_done(struct arena *a)
{
    a->nfree_slabs = 0;
    for (uint32_t r = 0; r < a->nregions; r++) {
        struct arena_region *g = &a->regions[r];
        g->nfree = 0;
        /* Highest first, so the stack pops the region's lowest free slab. */
        for (uint32_t s = g->end; s-- > g->first;)
            if (a->slabs[s].cls == ARENA_NONE)
                a->free_slabs[g->first + g->nfree++] = s;
        a->nfree_slabs += g->nfree;
    }
    for (uint32_t k = 0; k < a->nclasses; k++)
        for (uint32_t r = 0; r < ARENA_MAX_REGIONS; r++)
            a->classes[k].partial[r] = ARENA_NONE;
    for (uint32_t s = a->slabs_total; s-- > 0;) {
        struct arena_slab *sl = &a->slabs[s];
        sl->prev = sl->next = ARENA_NONE;
        if (sl->cls == ARENA_NONE)
            continue;
        a->classes[sl->cls].slabs++;
        if (sl->used < a->classes[sl->cls].per_slab)
            arena_partial_push(a, &a->classes[sl->cls], s);
    }
}
