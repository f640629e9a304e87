/* index: (namespace, key) -> entry hash table, per-(arena, class) and
 * per-namespace LRU lists. See index.h for the contract. */
#include "mem/index.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>

#include "mem/arena.h"
#include "kvnode.h"

#define INDEX_MIN_BUCKETS   64u
#define INDEX_MAX_BUCKETS   ((size_t)1 << 40)  /* keeps the rounding below from overflowing */
/* Buckets migrated per operation while growing. An insert must move at least
 * one bucket so a rehash always ends before the table fills up again. */
#define INDEX_REHASH_INSERT 4u
#define INDEX_REHASH_OTHER  1u

_Static_assert(INDEX_MAX_ARENAS <= 256 && ARENA_MAX_CLASSES <= 256,
               "LRU list array would be unreasonably large");

struct index_table {
    struct index_entry **b;
    size_t mask;        /* buckets - 1; b == NULL when the table is unused */
};

struct lru_list {
    struct index_entry *head, *tail;   /* oldest at head */
};

struct ns_list {
    struct index_entry *head, *tail;   /* oldest at head */
    size_t count;
};

struct kv_index {
    /* t[0] is the main table; while growing, t[1] is the new one and buckets
     * of t[0] below rehash_pos have already moved to it. */
    struct index_table t[2];
    size_t rehash_pos;
    size_t count;
    size_t lru_count;
    uint64_t seed;
    uint64_t lru_clock;
    struct lru_list lru[INDEX_MAX_ARENAS][ARENA_MAX_CLASSES];
    /* Per-namespace lists (linked through ns_prev/ns_next), ns_lru_n of them. */
    struct ns_list *ns_lru;
    uint32_t ns_lru_n;
    unsigned walks;     /* open walks: no rehash step and no growth meanwhile */
};

static uint64_t index_mix64(uint64_t x)
{
    /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t index_hash(const struct kv_index *ix, uint32_t ns, int64_t key)
{
    /* Keys come from clients: a per-table seed keeps collisions unpredictable
     * (the mixer alone is invertible). */
    return index_mix64(index_mix64((uint64_t)key ^ ix->seed) ^ ((uint64_t)ns << 32 | ns));
}

static uint64_t index_random_seed(void)
{
    uint64_t s;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) == (ssize_t)sizeof s)
        return s;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return index_mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                       ((uint64_t)getpid() << 40));
}

static int index_rehashing(const struct kv_index *ix)
{
    return ix->t[1].b != NULL;
}

/* The chain (ns, key) with hash h lives in, given how far a rehash got. */
static struct index_entry **index_slot(struct kv_index *ix, uint64_t h)
{
    size_t i = (size_t)h & ix->t[0].mask;
    if (index_rehashing(ix) && i < ix->rehash_pos)
        return &ix->t[1].b[(size_t)h & ix->t[1].mask];
    return &ix->t[0].b[i];
}

/* Move up to n buckets of t[0] into t[1]; swap tables when done. */
static void index_rehash_step(struct kv_index *ix, size_t n)
{
    if (!index_rehashing(ix) || ix->walks > 0)
        return;
    size_t size0 = ix->t[0].mask + 1;
    while (n-- > 0 && ix->rehash_pos < size0) {
        struct index_entry *e = ix->t[0].b[ix->rehash_pos];
        ix->t[0].b[ix->rehash_pos] = NULL;
        while (e) {
            struct index_entry *next = e->hash_next;
            struct index_entry **dst = &ix->t[1].b[(size_t)index_hash(ix, e->ns, e->key) & ix->t[1].mask];
            e->hash_next = *dst;
            *dst = e;
            e = next;
        }
        ix->rehash_pos++;
    }
    if (ix->rehash_pos == size0) {
        free(ix->t[0].b);
        ix->t[0] = ix->t[1];
        ix->t[1].b = NULL;
        ix->t[1].mask = 0;
        ix->rehash_pos = 0;
    }
}

/* Start growing to twice the size once the load factor reaches 1. If the
 * allocation fails the table just stays denser; the next insert retries. */
static void index_maybe_grow(struct kv_index *ix)
{
    size_t size0 = ix->t[0].mask + 1;
    if (index_rehashing(ix) || ix->walks > 0 || ix->count < size0 || size0 >= INDEX_MAX_BUCKETS)
        return;
    struct index_entry **b = calloc(size0 * 2, sizeof *b);
    if (!b)
        return;
    ix->t[1].b = b;
    ix->t[1].mask = size0 * 2 - 1;
    ix->rehash_pos = 0;
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
    ix->t[0].b = calloc(n, sizeof *ix->t[0].b);
    if (!ix->t[0].b) {
        free(ix);
        return -KVNODE_ENOMEM;
    }
    ix->t[0].mask = n - 1;
    ix->seed = index_random_seed();
    *out = ix;
    return 0;
}

static void index_free_table(struct index_table *t)
{
    if (!t->b)
        return;
    for (size_t i = 0; i <= t->mask; i++) {
        struct index_entry *e = t->b[i];
        while (e) {
            struct index_entry *next = e->hash_next;
            free(e);
            e = next;
        }
    }
    free(t->b);
    t->b = NULL;
}

void index_destroy(struct kv_index *ix)
{
    if (!ix)
        return;
    /* Buckets of t[0] below rehash_pos are already empty. */
    index_free_table(&ix->t[0]);
    index_free_table(&ix->t[1]);
    free(ix->ns_lru);
    free(ix);
}

struct index_entry *index_lookup(struct kv_index *ix, uint32_t ns, int64_t key)
{
    index_rehash_step(ix, INDEX_REHASH_OTHER);
    for (struct index_entry *e = *index_slot(ix, index_hash(ix, ns, key)); e; e = e->hash_next)
        if (e->key == key && e->ns == ns)
            return e;
    return NULL;
}

struct index_entry *index_insert(struct kv_index *ix, uint32_t ns, int64_t key)
{
    struct index_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->ns = ns;
    e->key = key;
    index_maybe_grow(ix);
    index_rehash_step(ix, INDEX_REHASH_INSERT);
    struct index_entry **slot = index_slot(ix, index_hash(ix, ns, key));
    e->hash_next = *slot;
    *slot = e;
    ix->count++;
    return e;
}

void index_unlink(struct kv_index *ix, struct index_entry *e)
{
    index_lru_remove(ix, e);
    index_rehash_step(ix, INDEX_REHASH_OTHER);
    for (struct index_entry **p = index_slot(ix, index_hash(ix, e->ns, e->key)); *p; p = &(*p)->hash_next) {
        if (*p == e) {
            *p = e->hash_next;
            e->hash_next = NULL;
            ix->count--;
            return;
        }
    }
}

void index_entry_free(struct index_entry *e)
{
    free(e);
}

size_t index_count(const struct kv_index *ix)
{
    return ix->count;
}

void index_walk_begin(struct kv_index *ix, struct index_walk *w)
{
    /* Frozen, the entries still in t[0] are at rehash_pos and beyond (all of
     * it when not rehashing), the moved ones in t[1]. */
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
    while (buckets > 0 && w->table < 2) {
        const struct index_table *t = &ix->t[w->table];
        if (!t->b || w->pos > t->mask) {
            w->table++;
            w->pos = 0;
            continue;
        }
        for (struct index_entry *e = t->b[w->pos], *next; e; e = next) {
            next = e->hash_next;   /* fn may not unlink, but read it first anyway */
            fn(arg, e);
        }
        w->pos++;
        buckets--;
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
    st->buckets = ix->t[0].mask + 1;
    st->rehash_buckets = index_rehashing(ix) ? ix->t[1].mask + 1 : 0;
    st->lru_entries = ix->lru_count;
}

/* --- LRU ---------------------------------------------------------------- */

static struct lru_list *index_lru_list(struct kv_index *ix, uint32_t arena_id, uint32_t cls)
{
    if (arena_id >= INDEX_MAX_ARENAS || cls >= ARENA_MAX_CLASSES)
        return NULL;
    return &ix->lru[arena_id][cls];
}

/* Grow the namespace list heads to cover ids below n (doubling, capped). */
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
    /* Entries never point at list heads, so moving them is safe. */
    struct ns_list *l = realloc(ix->ns_lru, (size_t)want * sizeof *l);
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

/* The list of namespace ns; grows the array when `grow`. NULL: out of
 * range, or growing failed. */
static struct ns_list *index_ns_list(struct kv_index *ix, uint32_t ns, int grow)
{
    if (ns < ix->ns_lru_n)
        return &ix->ns_lru[ns];
    if (!grow || ns >= INDEX_MAX_NAMESPACES || index_ns_grow(ix, ns + 1) < 0)
        return NULL;
    return &ix->ns_lru[ns];
}

/* The list whose head (want_head) or tail e is. Normally e's own list; if the
 * caller changed e->arena/cls while e was listed, find it by scanning every
 * list head, which is bounded by the (small, fixed) number of lists. */
static struct lru_list *index_lru_end_owner(struct kv_index *ix, struct index_entry *e, int want_head)
{
    struct lru_list *l = index_lru_list(ix, e->arena, e->cls);
    if (l && (want_head ? l->head : l->tail) == e)
        return l;
    for (uint32_t a = 0; a < INDEX_MAX_ARENAS; a++)
        for (uint32_t c = 0; c < ARENA_MAX_CLASSES; c++)
            if ((want_head ? ix->lru[a][c].head : ix->lru[a][c].tail) == e)
                return &ix->lru[a][c];
    return NULL;
}

void index_lru_remove(struct kv_index *ix, struct index_entry *e)
{
    if (!e->on_lru)
        return;
    if (e->lru_prev) {
        e->lru_prev->lru_next = e->lru_next;
    } else {
        struct lru_list *l = index_lru_end_owner(ix, e, 1);
        if (l)
            l->head = e->lru_next;
    }
    if (e->lru_next) {
        e->lru_next->lru_prev = e->lru_prev;
    } else {
        struct lru_list *l = index_lru_end_owner(ix, e, 0);
        if (l)
            l->tail = e->lru_prev;
    }
    /* A listed entry is on its namespace's list too (e->ns never changes). */
    struct ns_list *nl = index_ns_list(ix, e->ns, 0);
    if (nl)
        nl->count--;
    if (e->ns_prev)
        e->ns_prev->ns_next = e->ns_next;
    else if (nl)
        nl->head = e->ns_next;
    if (e->ns_next)
        e->ns_next->ns_prev = e->ns_prev;
    else if (nl)
        nl->tail = e->ns_prev;
    e->lru_prev = e->lru_next = NULL;
    e->ns_prev = e->ns_next = NULL;
    e->on_lru = 0;
    ix->lru_count--;
}

void index_lru_touch(struct kv_index *ix, struct index_entry *e)
{
    struct lru_list *l = index_lru_list(ix, e->arena, e->cls);
    struct ns_list *nl = l ? index_ns_list(ix, e->ns, 1) : NULL;
    if (e->on_lru && l && nl && l->tail == e && nl->tail == e) {
        e->lru_stamp = ++ix->lru_clock;     /* already newest: restamp only */
        return;
    }
    index_lru_remove(ix, e);
    e->lru_stamp = ++ix->lru_clock;
    if (!l || !nl)
        return;     /* on neither list */
    e->lru_prev = l->tail;
    e->lru_next = NULL;
    if (l->tail)
        l->tail->lru_next = e;
    else
        l->head = e;
    l->tail = e;
    e->ns_prev = nl->tail;
    e->ns_next = NULL;
    if (nl->tail)
        nl->tail->ns_next = e;
    else
        nl->head = e;
    nl->tail = e;
    nl->count++;
    e->on_lru = 1;
    ix->lru_count++;
}

struct index_entry *index_lru_oldest(struct kv_index *ix, uint32_t arena_id, uint32_t cls)
{
    struct lru_list *l = index_lru_list(ix, arena_id, cls);
    return l ? l->head : NULL;
}

struct index_entry *index_lru_oldest_in_arena(struct kv_index *ix, uint32_t arena_id)
{
    if (arena_id >= INDEX_MAX_ARENAS)
        return NULL;
    struct index_entry *best = NULL;
    for (uint32_t c = 0; c < ARENA_MAX_CLASSES; c++) {
        struct index_entry *h = ix->lru[arena_id][c].head;
        if (h && (!best || h->lru_stamp < best->lru_stamp))
            best = h;
    }
    return best;
}

struct index_entry *index_lru_oldest_in_ns(struct kv_index *ix, uint32_t ns)
{
    struct ns_list *l = index_ns_list(ix, ns, 0);
    return l ? l->head : NULL;
}

size_t index_lru_count_in_ns(struct kv_index *ix, uint32_t ns)
{
    struct ns_list *l = index_ns_list(ix, ns, 0);
    return l ? l->count : 0;
}
