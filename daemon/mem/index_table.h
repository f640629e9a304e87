/* index_table: one table of the index's hash table: 32-bit entry ids in
 * groups of ITAB_SLOTS, each group one 64-byte cache line (index.c owns
 * the entries, the chains and the growth from one table to the next).
 *
 * A key lives in its home group (the hash's low bits): a tag byte per slot
 * (8 other bits of the hash, 0: empty) and the ids, so a lookup reads one
 * group line and, of the entries, only the ones whose tag matches (a
 * stranger's with probability about occupied / 255). When every slot of
 * the home group is taken the entry goes on the group's chain (linked
 * through the entries, index.c): the index grows when it holds as many
 * entries as ITAB_BUCKETS_PER_GROUP per group (8 of 11 slots on average),
 * so few are chained, and no key ever needs a second group line. */
#ifndef KVNODE_INDEX_TABLE_H
#define KVNODE_INDEX_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define ITAB_SLOTS             11u
#define ITAB_SLOT_MASK         ((1u << ITAB_SLOTS) - 1u)
#define ITAB_BUCKETS_PER_GROUP 8u

struct itab_group {
    uint8_t  tag[ITAB_SLOTS];   /* itab_tag of the id's key's hash, 0: empty slot */
    uint8_t  spare;
    uint32_t chain;             /* first id of the group's chain (index.c), 0: none */
    uint32_t id[ITAB_SLOTS];
    uint32_t spare2;
};
_Static_assert(sizeof(struct itab_group) == 64, "a group is one cache line");

struct itab {
    struct itab_group *g;   /* 64-byte aligned; NULL: no table */
    void *mem;              /* what g was carved from */
    size_t mask;            /* groups - 1 */
};

/* groups is a power of two. 0, or -1 when out of memory. Zeroed lazily by
 * the allocator for big tables (no O(n) pass). */
int  itab_init(struct itab *t, size_t groups);
void itab_free(struct itab *t);
uint64_t itab_random_seed(void);

static inline uint64_t itab_mix64(uint64_t x)
{
    /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The hash of (ns, key) under a table's seed. Keys come from clients: the
 * random seed keeps collisions unpredictable (the mixer alone is
 * invertible). */
static inline uint64_t itab_hash(uint64_t seed, uint32_t ns, int64_t key)
{
    return itab_mix64(itab_mix64((uint64_t)key ^ seed) ^ ((uint64_t)ns << 32 | ns));
}

/* The table's size in the index's unit (0: no table). */
static inline size_t itab_buckets(const struct itab *t)
{
    return t->g ? (t->mask + 1) * ITAB_BUCKETS_PER_GROUP : 0;
}

static inline uint8_t itab_tag(uint64_t h)
{
    uint8_t tag = (uint8_t)(h >> 56);   /* the group comes from the low bits */
    return (uint8_t)(tag | (tag == 0));
}

static inline struct itab_group *itab_home(const struct itab *t, uint64_t h)
{
    return &t->g[(size_t)h & t->mask];
}

/* Bit i set: slot i's tag is tag (0: the empty slots). */
static inline unsigned itab_match(const struct itab_group *g, uint8_t tag)
{
#if defined(__SSE2__)
    __m128i v = _mm_load_si128((const __m128i *)(const void *)g);
    return (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8((char)tag))) & ITAB_SLOT_MASK;
#else
    unsigned m = 0;
    for (unsigned i = 0; i < ITAB_SLOTS; i++)
        m |= (unsigned)(g->tag[i] == tag) << i;
    return m;
#endif
}

/* The id in h's home group whose tag matches h's first, else the group's
 * chain's first (0: none); without a branch on the group's contents (a
 * pipeline's stage: see index.h). */
static inline uint32_t itab_first(const struct itab *t, uint64_t h)
{
    const struct itab_group *g = itab_home(t, h);
    unsigned m = itab_match(g, itab_tag(h));
    uint32_t in_slot = g->id[__builtin_ctz(m | (1u << (ITAB_SLOTS - 1)))];
    return m ? in_slot : g->chain;
}

/* Put id (hash h) in a free slot of its home group. false: none free. */
static inline bool itab_put(struct itab_group *g, uint64_t h, uint32_t id)
{
    unsigned empty = itab_match(g, 0);
    if (!empty)
        return false;
    unsigned i = (unsigned)__builtin_ctz(empty);
    g->tag[i] = itab_tag(h);
    g->id[i] = id;
    return true;
}

/* Take id (hash h) out of its home group's slots. false: not in them. */
static inline bool itab_take(struct itab_group *g, uint64_t h, uint32_t id)
{
    for (unsigned m = itab_match(g, itab_tag(h)); m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctz(m);
        if (g->id[i] == id) {
            g->tag[i] = 0;
            g->id[i] = 0;
            return true;
        }
    }
    return false;
}

#endif
