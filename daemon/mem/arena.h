/* arena: the memory regions blocks live in and the allocator that carves them.
 *
 * A host arena is one memfd (close-on-exec, sealed against shrinking and
 * growing) mapped MAP_SHARED by the daemon and, after HELLO, by every client
 * (read-write, or through a read-only reopen for clients that only read).
 * The allocator divides the region into fixed-size slabs; a slab is given to
 * one size class (block stride) when that class needs room and handed back to
 * the free-slab pool as soon as its last block is freed, so several block
 * sizes share one arena. alloc and free are O(1).
 *
 * The allocator keeps all its state in daemon memory and never touches the
 * region, so the same code carves device memory (arena_create_over).
 *
 * Loop thread only, except arena_mark_reserved / arena_reserved. */
#ifndef KVNODE_ARENA_H
#define KVNODE_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define ARENA_MAX_CLASSES 64u
#define ARENA_MAX_REGIONS 8u
#define ARENA_ANY_REGION UINT32_MAX   /* arena_alloc_near: no preference */
#define ARENA_STRIDE_ALIGN 256u   /* block strides are multiples of this */

struct arena;

struct arena_stats {
    uint64_t capacity;      /* bytes usable for blocks (slabs_total * slab_bytes) */
    uint64_t used_bytes;    /* sum of strides of allocated blocks */
    uint64_t slab_bytes;
    uint32_t slabs_total;
    uint32_t slabs_free;    /* slabs owned by no class */
    uint64_t blocks;        /* allocated blocks */
    uint64_t reserved_bytes; /* reserved so far: blocks are placed only below it */
};

/* memory.huge_pages, in the order of CONFIG_HUGE_*. */
enum { ARENA_HUGE_OFF = 0, ARENA_HUGE_AUTO = 1, ARENA_HUGE_ON = 2 };

/* Create a host arena of `bytes` (rounded down to whole slabs). tier is
 * KVNODE_TIER_HOST. huge (ARENA_HUGE_*): back it with the hugetlb pool
 * (the mapping is then rounded up to whole huge pages; 1GiB pages only for
 * whole-GiB sizes), else shmem transparent huge pages where shmem_enabled
 * allows them, else (AUTO, OFF) ordinary pages; ON fails with the reason.
 * Returns 0 or a negative KVNODE_E* code with err set. */
int arena_create_host(uint32_t id, uint64_t bytes, uint64_t slab_bytes, int huge, struct arena **out,
                      char *err, size_t errlen);
/* The same (huge alike) with its full size but nothing reserved or
 * populated: no block is placed until arena_mark_reserved() raises the
 * reserved part (see mem/populate.h, which reserves in whole pages). */
int arena_create_host_deferred(uint32_t id, uint64_t bytes, uint64_t slab_bytes, int huge,
                               struct arena **out, char *err, size_t errlen);
/* [0, bytes) is reserved and populated. Any thread (an atomic store); the
 * loop sees it at its next alloc that needs a slab beyond the old bound. */
void arena_mark_reserved(struct arena *a, uint64_t bytes);
uint64_t arena_reserved(const struct arena *a);
/* A host arena over the memfd a previous daemon handed over (warm restart):
 * fd is taken (closed on failure), must be sealed against resizing and be
 * the size memory.* gives now. The previous daemon had reserved its first
 * `reserved` bytes; the rest is reserved now (nothing when it had all: a
 * fallocate over a whole populated tier would cost about as long as
 * populating it), the bytes already there are kept. Its blocks are placed
 * with arena_adopt_block, then arena_adopt_done, before any arena_alloc.
 * 0 or negative KVNODE_E*. */
int arena_adopt_host(uint32_t id, int fd, uint64_t bytes, uint64_t slab_bytes, uint64_t reserved,
                     struct arena **out, char *err, size_t errlen);
/* An arena over memory someone else owns and releases after arena_destroy
 * (an HBM region from devmem): base is the daemon's address of it (a device
 * pointer for real GPUs: never dereferenced here), fd what clients map (-1:
 * none; the arena reopens it read-only for readers, as a host arena's, and
 * closes only that copy). bytes is rounded down to whole slabs. */
int arena_create_over(uint32_t id, int tier, int device, void *base, int fd, uint64_t bytes,
                      uint64_t slab_bytes, struct arena **out, char *err, size_t errlen);
void arena_destroy(struct arena *a);

uint32_t arena_id(const struct arena *a);
int      arena_tier(const struct arena *a);     /* KVNODE_TIER_* */
int      arena_device(const struct arena *a);   /* -1 for host memory */
int      arena_fd(const struct arena *a);       /* memfd passed to clients */
/* The memfd reopened O_RDONLY at creation, lent to clients that only read
 * (its mappings can only be PROT_READ): one per arena, owned by it, and the
 * memfd's mode is 0400 from then on (see arena.c). -1 when there is none:
 * arena_fd_readonly_why() then says why ("" when there is one). */
int      arena_fd_readonly(const struct arena *a);
const char *arena_fd_readonly_why(const struct arena *a);
void    *arena_base(const struct arena *a);     /* daemon's mapping */
uint64_t arena_size(const struct arena *a);     /* bytes clients map */
/* Pages backing a host arena: their size (4096 unless huge), "hugetlb 2MiB"
 * (or 1GiB), "thp" or "off", and why that choice (for the log). */
uint64_t arena_page_size(const struct arena *a);
const char *arena_huge_pages(const struct arena *a);
const char *arena_huge_pages_why(const struct arena *a);

/* Find or create the size class for blocks of block_bytes. Returns 0,
 * -KVNODE_ETOOBIG when block_bytes > slab_bytes (or 0), -KVNODE_ELIMIT when
 * ARENA_MAX_CLASSES distinct strides exist. */
int      arena_class_for(struct arena *a, uint64_t block_bytes, uint32_t *cls);
uint64_t arena_class_stride(const struct arena *a, uint32_t cls);
uint32_t arena_class_count(const struct arena *a);
/* Blocks allocated in / slabs owned by a class. */
uint64_t arena_class_blocks(const struct arena *a, uint32_t cls);
uint32_t arena_class_slabs(const struct arena *a, uint32_t cls);
/* Blocks one slab of the class holds (slab_bytes / stride). */
uint32_t arena_class_blocks_per_slab(const struct arena *a, uint32_t cls);

/* O(1). 0 and *offset, or -KVNODE_ENOSPC when the class has no free slot
 * and no free slab is left (-KVNODE_EINVAL for an unknown class). */
int      arena_alloc(struct arena *a, uint32_t cls, uint64_t *offset);
/* The same, placing the block in region `region` when it has room there
 * (a free slot of the class or a free slab), else wherever there is room
 * (ARENA_ANY_REGION: no preference). O(regions). */
int      arena_alloc_near(struct arena *a, uint32_t cls, uint32_t region, uint64_t *offset);

/* Regions: split the arena into n (1..ARENA_MAX_REGIONS) contiguous regions
 * ending at ends[0] < ends[1] < ... = arena_size, each a whole number of
 * slabs (mem/numa.h places each on a NUMA node). Only before the first
 * block is placed. A new arena is one region. 0 or -KVNODE_EINVAL. */
int      arena_set_regions(struct arena *a, uint32_t n, const uint64_t *ends, char *err, size_t errlen);
uint32_t arena_region_count(const struct arena *a);
uint32_t arena_region_of(const struct arena *a, uint64_t offset);
struct arena_region_stats {
    uint64_t start, end;     /* bytes [start, end) of the arena */
    uint64_t used_bytes;     /* strides of the blocks placed there */
    uint32_t slabs_free;     /* free slabs inside the reserved part */
};
void     arena_get_region_stats(const struct arena *a, uint32_t r, struct arena_region_stats *out);
/* O(1). offset must come from arena_alloc and not be freed twice; an offset
 * that is not currently allocated is ignored and counted (arena_bad_frees). */
void     arena_free(struct arena *a, uint64_t offset);
uint64_t arena_bad_frees(const struct arena *a);
/* Adoption: mark the block of class cls at offset allocated (regions and
 * classes set, no arena_alloc yet). -KVNODE_EINVAL when it is outside the
 * arena, not a slot of cls, in a slab of another class, or taken. */
int      arena_adopt_block(struct arena *a, uint32_t cls, uint64_t offset);
/* After the last arena_adopt_block: the free slabs and partly used slabs
 * listed as the allocator keeps them. O(slabs). */
void     arena_adopt_done(struct arena *a);
/* True when arena_alloc(cls) would succeed right now. */
int      arena_can_alloc(const struct arena *a, uint32_t cls);
/* Blocks of cls that could be placed right now, in any region: the free
 * slots of its slabs plus a slab's worth per free slab in the reserved
 * part. O(1). */
uint64_t arena_free_slots(const struct arena *a, uint32_t cls);

void     arena_get_stats(const struct arena *a, struct arena_stats *st);

#endif
