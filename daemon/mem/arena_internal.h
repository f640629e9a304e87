/* arena_internal: the allocator's state, shared by arena.c (creation, the
 * allocator) and arena_adopt.c (an arena over a previous daemon's memory).
 * Nothing else includes it. */
#ifndef KVNODE_ARENA_INTERNAL_H
#define KVNODE_ARENA_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include "mem/arena.h"

/* What a host arena has without huge pages. */
#define ARENA_SMALL_PAGE ((uint64_t)sysconf(_SC_PAGESIZE))

#define ARENA_NONE UINT32_MAX
/* A slab holds at most 64^ARENA_MAX_LEVELS = 2^30 blocks of the minimum
 * stride, which bounds slab_bytes to 256 GiB and keeps indices in uint32_t. */
#define ARENA_MAX_LEVELS 5u
#define ARENA_MAX_SLAB_BYTES ((UINT64_C(1) << 30) * ARENA_STRIDE_ALIGN)

struct arena_slab {
    uint32_t cls;           /* owning class or ARENA_NONE */
    uint32_t used;          /* allocated blocks */
    uint32_t prev, next;    /* links in the class's partial list */
};

struct arena_class {
    uint64_t stride;
    uint32_t per_slab;      /* blocks per slab */
    uint32_t partial[ARENA_MAX_REGIONS];  /* per region: head of slabs with a free block, or ARENA_NONE */
    uint32_t slabs;         /* slabs owned */
    uint64_t blocks;        /* blocks allocated */
};

struct arena {
    uint32_t id;
    int      tier;          /* KVNODE_TIER_* */
    int      device;        /* -1: host memory */
    bool     owns_memory;   /* host arena: the memfd and mapping are ours to release */
    int      fd;
    int      ro_fd;         /* fd reopened O_RDONLY, lent to readers (owned); -1: none */
    char     ro_why[192];   /* why there is no ro_fd */
    uint64_t page_size;     /* host arena: the pages backing it */
    char     huge_pages[24]; /* host arena: "hugetlb 2MiB", "thp" or "off" */
    char     huge_why[512]; /* host arena: why that choice (for the log) */
    void    *base;
    uint64_t size;          /* slabs_total * slab_bytes */
    uint64_t slab_bytes;
    uint32_t slabs_total;
    /* Only slabs below slabs_usable are handed out: the memory reserved so
     * far (a deferred host arena is reserved in the background, populate.c).
     * reserved is written by the populate threads; the loop reloads it only
     * when the next free slab is beyond slabs_usable. */
    uint32_t slabs_usable;
    _Atomic uint64_t reserved;

    struct arena_slab *slabs;
    /* Free slab indices: region r's stack is free_slabs[first .. first + nfree). */
    uint32_t *free_slabs;
    uint32_t  nfree_slabs;  /* all regions */
    struct arena_region {
        uint32_t first, end;    /* slabs [first, end) */
        uint32_t nfree;
        uint64_t used_bytes;
    } regions[ARENA_MAX_REGIONS];
    uint32_t nregions;

    struct arena_class classes[ARENA_MAX_CLASSES];
    uint32_t nclasses;

    /* Per-slab bitmap: levels[0] is the leaf (one bit per block slot of the
     * minimum stride), levels[nlevels-1] is a single word. */
    uint64_t *bits;
    uint32_t  nlevels;
    size_t    level_off[ARENA_MAX_LEVELS];
    size_t    slab_words;   /* words of all levels of one slab */

    uint64_t used_bytes;
    uint64_t blocks;
    uint64_t bad_frees;
};

/* arena.c's helpers arena_adopt.c uses (see arena.c). */
int arena_new(uint32_t id, uint64_t bytes, uint64_t slab_bytes, struct arena **out, char *err, size_t errlen);
void arena_open_readonly(struct arena *a, int fd);
uint32_t arena_slab_region(const struct arena *a, uint32_t s);
int arena_bits_test(const struct arena *a, uint32_t s, uint32_t idx);
void arena_partial_push(struct arena *a, struct arena_class *c, uint32_t s);

#endif
