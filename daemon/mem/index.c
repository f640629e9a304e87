/* index: (namespace, key) -> entry hash table, per-(arena, class) and
 * per-namespace LRU lists. See index.h for the contract. */
#include "mem/index.h"

#include <stdlib.h>
#include <string.h>

#include "mem/arena.h"
#include "mem/index_table.h"
#include "kvnode.h"

#define INDEX_MIN_BUCKETS   64u
#define INDEX_MAX_BUCKETS   ((size_t)1 << 40)  /* keeps the rounding below from overflowing */
/* Buckets' worth of migration credit per operation while growing: a group
 * (ITAB_BUCKETS_PER_GROUP buckets) moves once the credit covers it. Inserts
 * move a group per two, so a rehash ends long before the new table needs
 * to grow again. */
#define INDEX_REHASH_INSERT 4u
#define INDEX_REHASH_OTHER  1u

/* Entries come from chunks of INDEX_CHUNK_ENTRIES of the index's own, carved
 * in order and recycled through a free list: no allocator header per entry,
 * and an entry's 32-bit id (chunk << INDEX_CHUNK_SHIFT | place) is what
 * chains and lists hold instead of 8-byte pointers. Id 0 (the first chunk's
 * first entry) is never handed out: it is "none". Chunks are kept until
 * index_destroy (the index holds memory for its peak entry count). ASan
 * builds poison a freed entry and never hand it out again, so a use after
 * index_entry_free stays visible. */
#if defined(__SANITIZE_ADDRESS__)
#define INDEX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define INDEX_ASAN 1
#endif
#endif
#ifdef INDEX_ASAN
#include <sanitizer/asan_interface.h>
#define INDEX_POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define INDEX_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define INDEX_POISON(p, n)   ((void)(p), (void)(n))
#define INDEX_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
#define INDEX_CHUNK_SHIFT   10u
#define INDEX_CHUNK_ENTRIES (1u << INDEX_CHUNK_SHIFT)
#define INDEX_CHUNK_MASK    (INDEX_CHUNK_ENTRIES - 1u)
#define INDEX_MAX_CHUNKS    ((uint32_t)(((uint64_t)UINT32_MAX + 1) >> INDEX_CHUNK_SHIFT))

_Static_assert(sizeof(struct index_entry) == 80, "index entry grew: see index.h");
_Static_assert(INDEX_MAX_ARENAS <= 256 && ARENA_MAX_CLASSES <= 256,
               "LRU list array would be unreasonably large");

/* One recency order of listed entries: an (arena, class)'s or a namespace's.
 * An entry a client used is appended to the list, so the list stays in stamp
 * order. One that comes back with a stamp older than the list's newest (its
 * last pin dropped: a store write landed, a copy finished) goes to the heap
 * instead, so only a client's use ever moves an entry. The order's oldest is
 * the older of the list's head and the heap's top. */
struct lru_order {
    struct index_entry *head, *tail;   /* oldest at head */
    struct index_entry **heap;         /* min-heap on lru_stamp */
    uint32_t heap_n, heap_cap;
    uint32_t count;                    /* in the list and the heap (entry ids are 32-bit) */
    uint32_t swept_left;               /* answers from the heap before the next forced sweep */
};

static void order_free(struct lru_order *o);

struct kv_index {
    /* t[0] is the main table; while growing, t[1] is the new one, groups
     * of t[0] below rehash_pos have moved to it and inserts go to it. */
    struct itab t[2];
    size_t rehash_pos;
    size_t rehash_credit;      /* buckets' worth of migration owed (INDEX_REHASH_*) */
    size_t count;
    size_t lru_count;
    uint64_t seed;
    uint64_t lru_clock;
    uint64_t lru_moved_stamp;  /* stamp of the last use that did not only mark (index_lru_touch) */
    size_t settle_moves, oldest_moves_max, oldest_forced;   /* index_stats */
    struct lru_order lru[INDEX_MAX_ARENAS][ARENA_MAX_CLASSES];
    /* Per-namespace orders (linked through ns_prev/ns_next), ns_lru_n of them. */
    struct lru_order *ns_lru;
    uint32_t ns_lru_n;
    unsigned walks;     /* open walks: no rehash step and no growth meanwhile */
    struct index_entry **chunks;   /* chunks[i]: the entries of ids i << INDEX_CHUNK_SHIFT.. */
    uint32_t nchunks, chunks_cap;
    uint32_t chunk_used;           /* entries carved from the newest chunk */
    size_t heap_bytes;             /* the orders' heaps */
    uint32_t free_entries;         /* id of a freed entry, linked through hash_next */
};

/* The entry of id, which is not 0. */
static inline struct index_entry *index_entry_at(const struct kv_index *ix, uint32_t id)
{
    return &ix->chunks[id >> INDEX_CHUNK_SHIFT][id & INDEX_CHUNK_MASK];
}

/* The entry of id (0: NULL). */
static inline struct index_entry *index_at(const struct kv_index *ix, uint32_t id)
{
    return id ? index_entry_at(ix, id) : NULL;
}

static inline uint32_t index_id_of(const struct index_entry *e)
{
    return e ? e->id : 0;
}

static bool index_new_chunk(struct kv_index *ix)
{
    if (ix->nchunks == INDEX_MAX_CHUNKS)
        return false;
    if (ix->nchunks == ix->chunks_cap) {
        uint32_t cap = ix->chunks_cap ? ix->chunks_cap * 2 : 16u;
        if (cap > INDEX_MAX_CHUNKS)
            cap = INDEX_MAX_CHUNKS;
        struct index_entry **t = realloc(ix->chunks, (size_t)cap * sizeof *t);
        if (!t)
            return false;
        ix->chunks = t;
        ix->chunks_cap = cap;
    }
    struct index_entry *ch = malloc(INDEX_CHUNK_ENTRIES * sizeof *ch);
    if (!ch)
        return false;
    INDEX_POISON(ch, INDEX_CHUNK_ENTRIES * sizeof *ch);
    ix->chunks[ix->nchunks++] = ch;
    ix->chunk_used = ix->nchunks == 1 ? 1 : 0;   /* id 0 is none */
    return true;
}

static struct index_entry *index_entry_alloc(struct kv_index *ix)
{
    struct index_entry *e;
    uint32_t id = ix->free_entries;
    if (id) {
        e = index_entry_at(ix, id);
        ix->free_entries = e->hash_next;
    } else {
        if (!ix->nchunks || ix->chunk_used == INDEX_CHUNK_ENTRIES) {
            if (!index_new_chunk(ix))
                return NULL;
        }
        id = (ix->nchunks - 1) << INDEX_CHUNK_SHIFT | ix->chunk_used++;
        e = index_entry_at(ix, id);
        INDEX_UNPOISON(e, sizeof *e);
    }
    memset(e, 0, sizeof *e);
    e->id = id;
    return e;
}

uint64_t index_key_hash(const struct kv_index *ix, uint32_t ns, int64_t key)
{
    return itab_hash(ix->seed, ns, key);
}

static int index_rehashing(const struct kv_index *ix)
{
    return ix->t[1].g != NULL;
}

/* Into a slot of its home group in t, else onto the group's chain. */
static void index_place(struct itab *t, uint64_t h, struct index_entry *e)
{
    struct itab_group *g = itab_home(t, h);
    if (!itab_put(g, h, e->id)) {
        e->hash_next = g->chain;
        g->chain = e->id;
    }
}

/* Out of t: true when it was there. */
static bool index_displace(struct kv_index *ix, struct itab *t, uint64_t h, struct index_entry *e)
{
    struct itab_group *g = itab_home(t, h);
    if (itab_take(g, h, e->id))
        return true;
    for (uint32_t *p = &g->chain; *p; p = &index_entry_at(ix, *p)->hash_next) {
        if (*p == e->id) {
            *p = e->hash_next;
            e->hash_next = 0;
            return true;
        }
    }
    return false;
}

/* Move groups of t[0] into t[1] for n buckets' worth of credit; swap the
 * tables when done. A group's entries, then their new groups, are loaded
 * together first, so their misses overlap. */
static void index_rehash_step(struct kv_index *ix, size_t n)
{
    if (!index_rehashing(ix) || ix->walks > 0)
        return;
    size_t groups0 = ix->t[0].mask + 1;
    for (ix->rehash_credit += n; ix->rehash_credit >= ITAB_BUCKETS_PER_GROUP && ix->rehash_pos < groups0;
         ix->rehash_credit -= ITAB_BUCKETS_PER_GROUP) {
        struct itab_group *g = &ix->t[0].g[ix->rehash_pos++];
        unsigned full = itab_match(g, 0) ^ ITAB_SLOT_MASK;
        uint64_t hs[ITAB_SLOTS];
        for (unsigned m = full; m; m &= m - 1)
            __builtin_prefetch(index_entry_at(ix, g->id[__builtin_ctz(m)]));
        for (unsigned m = full; m; m &= m - 1) {
            unsigned i = (unsigned)__builtin_ctz(m);
            const struct index_entry *e = index_entry_at(ix, g->id[i]);
            hs[i] = index_key_hash(ix, e->ns, e->key);
            __builtin_prefetch(itab_home(&ix->t[1], hs[i]), 1);
        }
        for (unsigned m = full; m; m &= m - 1) {
            unsigned i = (unsigned)__builtin_ctz(m);
            index_place(&ix->t[1], hs[i], index_entry_at(ix, g->id[i]));
        }
        for (uint32_t id = g->chain, next; id; id = next) {
            struct index_entry *e = index_entry_at(ix, id);
            next = e->hash_next;
            e->hash_next = 0;
            index_place(&ix->t[1], index_key_hash(ix, e->ns, e->key), e);
        }
        *g = (struct itab_group){ 0 };
    }
    if (ix->rehash_pos == groups0) {
        itab_free(&ix->t[0]);
        ix->t[0] = ix->t[1];
        ix->t[1] = (struct itab){ 0 };
    }
}

bool index_grow_step(struct kv_index *ix, size_t buckets)
{
    index_rehash_step(ix, buckets);
    return !index_rehashing(ix);
}

/* Start growing to twice the size once the index holds as many entries as
 * the main table has buckets. If the allocation fails the table just stays
 * denser (more entries chained); the next insert retries. */
static void index_maybe_grow(struct kv_index *ix)
{
    size_t buckets0 = itab_buckets(&ix->t[0]);
    if (index_rehashing(ix) || ix->walks > 0 || ix->count < buckets0 || buckets0 >= INDEX_MAX_BUCKETS)
        return;
    if (itab_init(&ix->t[1], (ix->t[0].mask + 1) * 2) < 0)
        return;
    ix->rehash_pos = 0;
    ix->rehash_credit = 0;
}

int index_create(size_t initial_buckets, struct kv_index **out)
{
    size_t n = INDEX_MIN_BUCKETS;
    if (initial_buckets > INDEX_MAX_BUCKETS)
        initial_buckets = INDEX_MAX_BUCKETS;
    while (n < initial_buckets)
        n <<= 1;
    struct kv_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return -KVNODE_ENOMEM;
    if (itab_init(&ix->t[0], n / ITAB_BUCKETS_PER_GROUP) < 0) {
        free(ix);
        return -KVNODE_ENOMEM;
    }
    ix->seed = itab_random_seed();
    *out = ix;
    return 0;
}

void index_destroy(struct kv_index *ix)
{
    if (!ix)
        return;
    itab_free(&ix->t[0]);
    itab_free(&ix->t[1]);
    for (uint32_t a = 0; a < INDEX_MAX_ARENAS; a++)
        for (uint32_t c = 0; c < ARENA_MAX_CLASSES; c++)
            order_free(&ix->lru[a][c]);
    for (uint32_t n = 0; n < ix->ns_lru_n; n++)
        order_free(&ix->ns_lru[n]);
    free(ix->ns_lru);
    for (uint32_t i = 0; i < ix->nchunks; i++) {
        INDEX_UNPOISON(ix->chunks[i], INDEX_CHUNK_ENTRIES * sizeof *ix->chunks[i]);
        free(ix->chunks[i]);
    }
    free(ix->chunks);
    free(ix);
}

struct index_entry *index_lookup(struct kv_index *ix, uint32_t ns, int64_t key)
{
    return index_lookup_hashed(ix, ns, key, index_key_hash(ix, ns, key));
}

/* (ns, key) in one table: its home group's entries whose tags match, its chain. */
static struct index_entry *index_find(const struct kv_index *ix, const struct itab *t, uint32_t ns,
                                      int64_t key, uint64_t h)
{
    const struct itab_group *g = itab_home(t, h);
    for (unsigned m = itab_match(g, itab_tag(h)); m; m &= m - 1) {
        struct index_entry *e = index_entry_at(ix, g->id[__builtin_ctz(m)]);
        if (e->key == key && e->ns == ns)
            return e;
    }
    for (uint32_t id = g->chain; id;) {
        struct index_entry *e = index_entry_at(ix, id);
        if (e->key == key && e->ns == ns)
            return e;
        id = e->hash_next;
    }
    return NULL;
}

struct index_entry *index_lookup_hashed(struct kv_index *ix, uint32_t ns, int64_t key, uint64_t h)
{
    index_rehash_step(ix, INDEX_REHASH_OTHER);
    struct index_entry *e = index_find(ix, &ix->t[0], ns, key, h);
    if (!e && index_rehashing(ix))
        e = index_find(ix, &ix->t[1], ns, key, h);
    return e;
}

void index_prefetch_bucket(const struct kv_index *ix, uint64_t h)
{
    __builtin_prefetch(itab_home(&ix->t[0], h));
    if (index_rehashing(ix))
        __builtin_prefetch(itab_home(&ix->t[1], h));
}

uint32_t index_prefetch_first(const struct kv_index *ix, uint64_t h)
{
    if (!ix->nchunks)
        return 0;   /* no entry at all (not even id 0's place) */
    uint32_t id = itab_first(&ix->t[0], h);
    if (index_rehashing(ix))
        id |= itab_first(&ix->t[1], h) & (0u - (uint32_t)(id == 0));
    /* Both lines of the entry (80 bytes span two), to be written. Id 0,
     * never handed out, is harmless to load. */
    const char *e = (const char *)index_entry_at(ix, id);
    __builtin_prefetch(e, 1);
    __builtin_prefetch(e + sizeof(struct index_entry) - 1, 1);
    return id;
}

struct index_entry *index_insert(struct kv_index *ix, uint32_t ns, int64_t key)
{
    struct index_entry *e = index_entry_alloc(ix);
    if (!e)
        return NULL;
    e->ns = ns;
    e->key = key;
    index_maybe_grow(ix);
    index_rehash_step(ix, INDEX_REHASH_INSERT);
    /* While growing, into the new table. */
    index_place(&ix->t[index_rehashing(ix)], index_key_hash(ix, ns, key), e);
    ix->count++;
    return e;
}

void index_unlink(struct kv_index *ix, struct index_entry *e)
{
    index_lru_remove(ix, e);
    index_rehash_step(ix, INDEX_REHASH_OTHER);
    uint64_t h = index_key_hash(ix, e->ns, e->key);
    if (index_displace(ix, &ix->t[0], h, e) || (index_rehashing(ix) && index_displace(ix, &ix->t[1], h, e)))
        ix->count--;
}

void index_entry_free(struct kv_index *ix, struct index_entry *e)
{
#ifdef INDEX_ASAN
    (void)ix;
    INDEX_POISON(e, sizeof *e);
#else
    e->hash_next = ix->free_entries;
    ix->free_entries = e->id;
#endif
}

size_t index_count(const struct kv_index *ix)
{
    return ix->count;
}

void index_walk_begin(struct kv_index *ix, struct index_walk *w)
{
    /* Frozen: t[0] from rehash_pos (all of it when not rehashing), then t[1]. */
    w->table = 0;
    w->pos = index_rehashing(ix) ? ix->rehash_pos : 0;
    w->open = true;
    ix->walks++;
}

bool index_walk_step(struct kv_index *ix, struct index_walk *w, size_t buckets,
                     void (*fn)(void *arg, struct index_entry *e), void *arg)
{
    if (!w->open)
        return false;
    size_t groups = buckets / ITAB_BUCKETS_PER_GROUP + (buckets % ITAB_BUCKETS_PER_GROUP != 0);
    while (groups > 0 && w->table < 2) {
        const struct itab *t = &ix->t[w->table];
        if (!t->g || w->pos > t->mask) {
            w->table++;
            w->pos = 0;
            continue;
        }
        const struct itab_group *g = &t->g[w->pos];
        for (unsigned m = itab_match(g, 0) ^ ITAB_SLOT_MASK; m; m &= m - 1)   /* fn may not unlink */
            fn(arg, index_entry_at(ix, g->id[__builtin_ctz(m)]));
        for (uint32_t id = g->chain, next; id; id = next) {
            struct index_entry *e = index_entry_at(ix, id);
            next = e->hash_next;
            fn(arg, e);
        }
        w->pos++;
        groups--;
    }
    if (w->table < 2)
        return true;
    index_walk_end(ix, w);
    return false;
}

void index_walk_end(struct kv_index *ix, struct index_walk *w)
{
    if (!w->open)
        return;
    w->open = false;
    if (ix->walks > 0)
        ix->walks--;
}

void index_get_stats(const struct kv_index *ix, struct index_stats *st)
{
    st->entries = ix->count;
    st->buckets = itab_buckets(&ix->t[0]);
    st->rehash_buckets = itab_buckets(&ix->t[1]);
    st->lru_entries = ix->lru_count;
    st->settle_moves = ix->settle_moves;
    st->oldest_moves_max = ix->oldest_moves_max;
    st->oldest_forced = ix->oldest_forced;
    st->bytes = sizeof *ix + (size_t)ix->chunks_cap * sizeof *ix->chunks +
                (size_t)ix->nchunks * INDEX_CHUNK_ENTRIES * sizeof(struct index_entry) +
                (st->buckets + st->rehash_buckets) / ITAB_BUCKETS_PER_GROUP * sizeof(struct itab_group) +
                (size_t)ix->ns_lru_n * sizeof *ix->ns_lru + ix->heap_bytes;
}

/* --- LRU ---------------------------------------------------------------- */

/* The two orders every listed entry is in: its (arena, class)'s and its
 * namespace's. Each is written once, over the entry's links for that order. */
enum { ORDER_CLASS = 0, ORDER_NS = 1 };

static uint32_t *order_prev(struct index_entry *e, int k)
{
    return k == ORDER_NS ? &e->ns_prev : &e->lru_prev;
}

static uint32_t *order_next(struct index_entry *e, int k)
{
    return k == ORDER_NS ? &e->ns_next : &e->lru_next;
}

/* Used since it was placed in order k's list (its place is older than its stamp). */
static bool order_ref(const struct index_entry *e, int k)
{
    return k == ORDER_NS ? e->ref_ns : e->ref_cls;
}

static void order_ref_clear(struct index_entry *e, int k)
{
    if (k == ORDER_NS)
        e->ref_ns = 0;
    else
        e->ref_cls = 0;
}

static uint32_t *order_heap_pos(struct index_entry *e, int k)
{
    return k == ORDER_NS ? &e->ns_heap : &e->lru_heap;
}

static void order_heap_set(struct lru_order *o, int k, uint32_t i, struct index_entry *e)
{
    o->heap[i] = e;
    *order_heap_pos(e, k) = i + 1;
}

static void order_heap_up(struct lru_order *o, int k, uint32_t i)
{
    struct index_entry *e = o->heap[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (o->heap[p]->lru_stamp <= e->lru_stamp)
            break;
        order_heap_set(o, k, i, o->heap[p]);
        i = p;
    }
    order_heap_set(o, k, i, e);
}

static void order_heap_down(struct lru_order *o, int k, uint32_t i)
{
    struct index_entry *e = o->heap[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= o->heap_n)
            break;
        if (c + 1 < o->heap_n && o->heap[c + 1]->lru_stamp < o->heap[c]->lru_stamp)
            c++;
        if (o->heap[c]->lru_stamp >= e->lru_stamp)
            break;
        order_heap_set(o, k, i, o->heap[c]);
        i = c;
    }
    order_heap_set(o, k, i, e);
}

/* false: no memory for a larger heap (the caller lists e at the newest end). */
static bool order_heap_push(struct kv_index *ix, struct lru_order *o, int k, struct index_entry *e)
{
    if (o->heap_n == o->heap_cap) {
        uint32_t cap = o->heap_cap ? o->heap_cap * 2 : 16u;
        if (cap <= o->heap_cap)
            return false;
        struct index_entry **h = realloc(o->heap, (size_t)cap * sizeof *h);
        if (!h)
            return false;
        ix->heap_bytes += (size_t)(cap - o->heap_cap) * sizeof *h;
        o->heap = h;
        o->heap_cap = cap;
    }
    o->heap[o->heap_n] = e;
    o->heap_n++;
    order_heap_up(o, k, o->heap_n - 1);
    return true;
}

static void order_heap_remove(struct kv_index *ix, struct lru_order *o, int k, struct index_entry *e)
{
    uint32_t i = *order_heap_pos(e, k) - 1;
    struct index_entry *last = o->heap[--o->heap_n];
    *order_heap_pos(e, k) = 0;
    if (i < o->heap_n) {
        order_heap_set(o, k, i, last);
        order_heap_up(o, k, i);
        order_heap_down(o, k, *order_heap_pos(last, k) - 1);
    }
    /* Give back what a burst of returns grew (it is never needed for long). */
    if (o->heap_cap > 64 && o->heap_n < o->heap_cap / 4) {
        struct index_entry **h = realloc(o->heap, (size_t)(o->heap_cap / 2) * sizeof *h);
        if (h) {
            ix->heap_bytes -= (size_t)(o->heap_cap - o->heap_cap / 2) * sizeof *h;
            o->heap = h;
            o->heap_cap /= 2;
        }
    }
}

static void order_append(struct lru_order *o, int k, struct index_entry *e)
{
    *order_prev(e, k) = index_id_of(o->tail);
    *order_next(e, k) = 0;
    if (o->tail)
        *order_next(o->tail, k) = e->id;
    else
        o->head = e;
    o->tail = e;
    o->count++;
}

/* e at its stamp's place: the heap, or the list when the list is empty (or
 * the heap cannot grow). Not the list's newest end even when e is newer than
 * its tail: a root marked in the list since e's stamp would then be ahead of
 * its leaf (see order_settle). */
static void order_insert(struct kv_index *ix, struct lru_order *o, int k, struct index_entry *e)
{
    if (o->tail && order_heap_push(ix, o, k, e)) {
        *order_prev(e, k) = *order_next(e, k) = 0;
        o->count++;
        return;
    }
    order_append(o, k, e);
}

static void order_unlink(struct kv_index *ix, struct lru_order *o, int k, struct index_entry *e)
{
    if (*order_heap_pos(e, k)) {
        order_heap_remove(ix, o, k, e);
    } else {
        struct index_entry *p = index_at(ix, *order_prev(e, k)), *n = index_at(ix, *order_next(e, k));
        if (p)
            *order_next(p, k) = index_id_of(n);
        else
            o->head = n;
        if (n)
            *order_prev(n, k) = index_id_of(p);
        else
            o->tail = p;
        *order_prev(e, k) = *order_next(e, k) = 0;
    }
    o->count--;
}

/* The list is in the order of the stamps entries had when placed (appended
 * newer than the tail's stamp, or else into the heap), and an entry used
 * since (order_ref) has a newer stamp than its place. Move used heads to
 * their stamps' places until the head's place is its stamp: then nothing in
 * the list is older than the head, and the order's oldest is the older of
 * the head and the heap's top (heap entries are never marked: a use of one
 * moves it at once).
 *
 * A moved head always goes to the heap (the list only when the heap cannot
 * grow), never to the list's newest end: the list keeps a chain's leaves
 * ahead of its roots (index_lru_touch), so when a sweep stops on a marked
 * head every entry it moved had its leaves moved before it, and the heap's
 * top is a safe victim (order_oldest). Returns the budget left. */
static size_t order_settle(struct kv_index *ix, struct lru_order *o, int k, size_t budget)
{
    struct index_entry *h;
    while (budget > 0 && (h = o->head) && order_ref(h, k)) {
        order_ref_clear(h, k);
        order_unlink(ix, o, k, h);
        if (order_heap_push(ix, o, k, h))
            o->count++;
        else
            order_append(o, k, h);
        budget--;
        ix->settle_moves++;
    }
    return budget;
}

/* The order's oldest, moving at most *budget marked heads first (at least
 * one when the head is marked, so that a sweep always makes progress), and
 * *budget less what it moved. With the head still marked when the budget is
 * spent (a backlog of uses no settle caught up with), the heap's top is
 * taken instead of the exact oldest: the head's run of marked entries keeps
 * its second chance, the entries swept into the heap have spent theirs, and
 * the oldest of them has no leaf left behind it (see order_settle). The
 * next calls take the heap's top without sweeping, as many as the sweep
 * moved, so that a run of evictions over a backlog (a put that makes room
 * for 256 blocks) costs one sweep per budget of victims, not one per victim.
 * Exact LRU whenever the run at the head fits the budget. *forced: set when
 * the answer is not the exact oldest. */
static struct index_entry *order_oldest(struct kv_index *ix, struct lru_order *o, int k, size_t *budget,
                                        bool *forced)
{
    struct index_entry *h = o->head, *t = o->heap_n ? o->heap[0] : NULL;
    if (h && order_ref(h, k) && t && o->swept_left > 0) {
        o->swept_left--;
        *forced = true;
        return t;
    }
    size_t b = *budget ? *budget : 1;
    size_t left = order_settle(ix, o, k, b);
    *budget = *budget > b - left ? *budget - (b - left) : 0;
    h = o->head;
    t = o->heap_n ? o->heap[0] : NULL;
    o->swept_left = 0;
    if (h && order_ref(h, k)) {
        *forced = true;
        o->swept_left = (uint32_t)(b - left - 1);   /* this answer is the first */
        if (t)
            return t;
        /* The heap could not grow: the marked head at its place. */
        order_ref_clear(h, k);
        return h;
    }
    if (!h || !t)
        return h ? h : t;
    return t->lru_stamp < h->lru_stamp ? t : h;
}

/* Bookkeeping of one oldest call: its moves, and whether it was forced. */
static void index_oldest_done(struct kv_index *ix, size_t moves_before, bool forced)
{
    size_t moves = ix->settle_moves - moves_before;
    if (moves > ix->oldest_moves_max)
        ix->oldest_moves_max = moves;
    if (forced)
        ix->oldest_forced++;
}

static void order_free(struct lru_order *o)
{
    free(o->heap);
    o->heap = NULL;
    o->heap_n = o->heap_cap = 0;
}

static struct lru_order *index_lru_list(struct kv_index *ix, uint32_t arena_id, uint32_t cls)
{
    if (arena_id >= INDEX_MAX_ARENAS || cls >= ARENA_MAX_CLASSES)
        return NULL;
    return &ix->lru[arena_id][cls];
}

/* Grow the namespace orders to cover ids below n (doubling, capped). */
static int index_ns_grow(struct kv_index *ix, uint32_t n)
{
    if (n > INDEX_MAX_NAMESPACES)
        n = INDEX_MAX_NAMESPACES;
    if (n <= ix->ns_lru_n)
        return 0;
    uint32_t want = ix->ns_lru_n ? ix->ns_lru_n : 16u;
    while (want < n)
        want = want > INDEX_MAX_NAMESPACES / 2 ? INDEX_MAX_NAMESPACES : want * 2;
    if (want > INDEX_MAX_NAMESPACES)
        want = INDEX_MAX_NAMESPACES;
    /* Entries never point at an order itself, so moving them is safe. */
    struct lru_order *l = realloc(ix->ns_lru, (size_t)want * sizeof *l);
    if (!l)
        return -KVNODE_ENOMEM;
    memset(l + ix->ns_lru_n, 0, (size_t)(want - ix->ns_lru_n) * sizeof *l);
    ix->ns_lru = l;
    ix->ns_lru_n = want;
    return 0;
}

int index_ns_reserve(struct kv_index *ix, uint32_t n)
{
    return index_ns_grow(ix, n);
}

/* The order of namespace ns; grows the array when `grow`. NULL: out of
 * range, or growing failed. */
static struct lru_order *index_ns_list(struct kv_index *ix, uint32_t ns, int grow)
{
    if (ns < ix->ns_lru_n)
        return &ix->ns_lru[ns];
    if (!grow || ns >= INDEX_MAX_NAMESPACES || index_ns_grow(ix, ns + 1) < 0)
        return NULL;
    return &ix->ns_lru[ns];
}

void index_lru_remove(struct kv_index *ix, struct index_entry *e)
{
    if (!e->on_lru)
        return;
    /* The class order it was listed in (e->arena/cls may have changed since). */
    order_unlink(ix, &ix->lru[e->lru_arena][e->lru_cls], ORDER_CLASS, e);
    order_unlink(ix, index_ns_list(ix, e->ns, 0), ORDER_NS, e);   /* e->ns never changes */
    e->on_lru = 0;
    e->ref_cls = e->ref_ns = 0;
    ix->lru_count--;
}

/* List an unlisted e in both of its orders: at the newest end (fresh: it was
 * just stamped) or at its stamp's place. */
static void index_lru_list_entry(struct kv_index *ix, struct index_entry *e, bool fresh)
{
    struct lru_order *l = index_lru_list(ix, e->arena, e->cls);
    struct lru_order *nl = l ? index_ns_list(ix, e->ns, 1) : NULL;
    if (!l || !nl)
        return;     /* on neither order */
    e->lru_arena = (uint8_t)e->arena;
    e->lru_cls = (uint8_t)e->cls;
    if (fresh) {
        order_append(l, ORDER_CLASS, e);
        order_append(nl, ORDER_NS, e);
    } else {
        order_insert(ix, l, ORDER_CLASS, e);
        order_insert(ix, nl, ORDER_NS, e);
    }
    e->on_lru = 1;
    ix->lru_count++;
}

/* A use marks in place only when the use just before it in the same chain
 * (index_lru_chain_begin; its next leaf: chains are refreshed tail-first)
 * marked too, or there was none. Once a chain's leaf had to be relinked at
 * the newest end (it was in a heap, in another class, or pinned), its roots
 * are relinked after it too, so that no root stays ahead of its leaves in a
 * list (order_settle relies on it). */
void index_lru_touch(struct kv_index *ix, struct index_entry *e)
{
    if (e->on_lru && e->lru_arena == e->arena && e->lru_cls == e->cls && !e->lru_heap && !e->ns_heap &&
        ix->lru_moved_stamp != ix->lru_clock) {
        /* In both lists, in the right class: restamp and mark, no list rewritten. */
        e->lru_stamp = ++ix->lru_clock;
        e->ref_cls = e->ref_ns = 1;
        return;
    }
    index_lru_remove(ix, e);
    e->lru_stamp = ++ix->lru_clock;
    ix->lru_moved_stamp = e->lru_stamp;
    index_lru_list_entry(ix, e, true);
}

void index_lru_chain_begin(struct kv_index *ix)
{
    ix->lru_moved_stamp = 0;
}

void index_lru_use(struct kv_index *ix, struct index_entry *e)
{
    if (e->on_lru) {
        index_lru_touch(ix, e);
    } else {
        e->lru_stamp = ++ix->lru_clock;
        ix->lru_moved_stamp = e->lru_stamp;   /* its roots are relinked, not marked */
    }
}

void index_lru_add(struct kv_index *ix, struct index_entry *e)
{
    if (e->on_lru)
        return;
    /* Stamped by the latest use (a lease's end: use, then unpin): nothing was
     * marked since, so the newest end is its place. Otherwise the heap, even
     * when newer than the list's tail: a root marked after it may be in the
     * list, and a leaf must not follow its root there (order_settle). */
    if (e->lru_stamp == ix->lru_clock) {
        index_lru_list_entry(ix, e, true);
        return;
    }
    index_lru_list_entry(ix, e, false);
}

/* The oldest of one order (kind k), settled within the budget of one call. */
static struct index_entry *index_oldest_of(struct kv_index *ix, struct lru_order *l, int k)
{
    if (!l)
        return NULL;
    size_t budget = INDEX_OLDEST_SETTLE_BUDGET, before = ix->settle_moves;
    bool forced = false;
    struct index_entry *e = order_oldest(ix, l, k, &budget, &forced);
    index_oldest_done(ix, before, forced);
    return e;
}

struct index_entry *index_lru_oldest(struct kv_index *ix, uint32_t arena_id, uint32_t cls)
{
    return index_oldest_of(ix, index_lru_list(ix, arena_id, cls), ORDER_CLASS);
}

struct index_entry *index_lru_oldest_in_arena(struct kv_index *ix, uint32_t arena_id)
{
    if (arena_id >= INDEX_MAX_ARENAS)
        return NULL;
    struct index_entry *best = NULL;
    size_t budget = INDEX_OLDEST_SETTLE_BUDGET, before = ix->settle_moves;
    bool forced = false;
    for (uint32_t c = 0; c < ARENA_MAX_CLASSES; c++) {
        struct lru_order *o = &ix->lru[arena_id][c];
        if (!o->count)
            continue;
        struct index_entry *h = order_oldest(ix, o, ORDER_CLASS, &budget, &forced);
        if (h && (!best || h->lru_stamp < best->lru_stamp))
            best = h;
    }
    index_oldest_done(ix, before, forced);
    return best;
}

bool index_lru_settle_arena(struct kv_index *ix, uint32_t arena_id, size_t budget)
{
    if (arena_id >= INDEX_MAX_ARENAS)
        return true;
    for (uint32_t c = 0; c < ARENA_MAX_CLASSES; c++) {
        struct lru_order *o = &ix->lru[arena_id][c];
        budget = order_settle(ix, o, ORDER_CLASS, budget);
        if (o->head && order_ref(o->head, ORDER_CLASS))
            return false;
    }
    return true;
}

struct index_entry *index_lru_oldest_in_ns(struct kv_index *ix, uint32_t ns)
{
    return index_oldest_of(ix, index_ns_list(ix, ns, 0), ORDER_NS);
}

struct index_entry *index_lru_prev(const struct kv_index *ix, const struct index_entry *e)
{
    return index_at(ix, e->lru_prev);
}

struct index_entry *index_lru_next(const struct kv_index *ix, const struct index_entry *e)
{
    return index_at(ix, e->lru_next);
}

struct index_entry *index_ns_prev(const struct kv_index *ix, const struct index_entry *e)
{
    return index_at(ix, e->ns_prev);
}

struct index_entry *index_ns_next(const struct kv_index *ix, const struct index_entry *e)
{
    return index_at(ix, e->ns_next);
}

size_t index_lru_count_in_ns(struct kv_index *ix, uint32_t ns)
{
    struct lru_order *l = index_ns_list(ix, ns, 0);
    return l ? l->count : 0;
}
