/* negcache: see negcache.h. */
#include "cache/negcache.h"

#include <stdlib.h>

#include "kvnode.h"

#define SLOT_EMPTY UINT32_MAX

struct negcache_entry {
    int64_t key;
    uint64_t check;
    uint64_t cached_ms;     /* when the store said absent */
    uint32_t ns;
    uint32_t held;          /* 1: in the table; 0: a free or removed ring position */
};

struct negcache {
    struct negcache_entry *ring;
    uint32_t capacity;
    uint32_t next;          /* the ring position written next: the oldest */
    uint32_t *slots;        /* ring positions, SLOT_EMPTY: free */
    uint32_t mask;          /* table size - 1 (a power of two >= 2 * capacity) */
    size_t count;
    uint64_t replaced;
};

_Static_assert(sizeof(struct negcache_entry) + 2 * sizeof(uint32_t) == NEGCACHE_ENTRY_BYTES,
               "NEGCACHE_ENTRY_BYTES says what an entry costs");

static uint32_t negcache_hash(uint32_t ns, int64_t key, uint64_t check)
{
    /* splitmix64's finaliser over the three: keys are hashes already, but
     * the same key under several words or namespaces must spread too. */
    uint64_t x = (uint64_t)key ^ (check * UINT64_C(0x9e3779b97f4a7c15)) ^ ((uint64_t)ns << 32);
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return (uint32_t)x;
}

int negcache_create(uint32_t capacity, struct negcache **out)
{
    *out = NULL;
    if (capacity == 0 || capacity > (UINT32_C(1) << 30))
        return -KVNODE_EINVAL;
    uint32_t size = 2;
    while (size < 2 * capacity)
        size <<= 1;
    struct negcache *nc = calloc(1, sizeof *nc);
    if (!nc)
        return -KVNODE_ENOMEM;
    nc->ring = calloc(capacity, sizeof *nc->ring);
    nc->slots = malloc((size_t)size * sizeof *nc->slots);
    if (!nc->ring || !nc->slots) {
        negcache_destroy(nc);
        return -KVNODE_ENOMEM;
    }
    for (uint32_t i = 0; i < size; i++)
        nc->slots[i] = SLOT_EMPTY;
    nc->capacity = capacity;
    nc->mask = size - 1;
    *out = nc;
    return 0;
}

void negcache_destroy(struct negcache *nc)
{
    if (!nc)
        return;
    free(nc->ring);
    free(nc->slots);
    free(nc);
}

/* The table slot holding (ns, key, check), or SLOT_EMPTY. */
static uint32_t negcache_find(const struct negcache *nc, uint32_t ns, int64_t key, uint64_t check)
{
    for (uint32_t i = negcache_hash(ns, key, check) & nc->mask;; i = (i + 1) & nc->mask) {
        uint32_t r = nc->slots[i];
        if (r == SLOT_EMPTY)
            return SLOT_EMPTY;
        const struct negcache_entry *e = &nc->ring[r];
        if (e->key == key && e->check == check && e->ns == ns)
            return i;
    }
}

/* Empty table slot i and shift back the entries after it that probing
 * would no longer reach (no tombstones: lookups stay short). */
static void negcache_unslot(struct negcache *nc, uint32_t i)
{
    nc->ring[nc->slots[i]].held = 0;
    nc->count--;
    for (uint32_t j = (i + 1) & nc->mask; nc->slots[j] != SLOT_EMPTY; j = (j + 1) & nc->mask) {
        const struct negcache_entry *e = &nc->ring[nc->slots[j]];
        uint32_t home = negcache_hash(e->ns, e->key, e->check) & nc->mask;
        /* Entry j stays when its home lies cyclically in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        nc->slots[i] = nc->slots[j];
        i = j;
    }
    nc->slots[i] = SLOT_EMPTY;
}

void negcache_insert(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check, uint64_t now_ms)
{
    uint32_t s = negcache_find(nc, ns, key, check);
    if (s != SLOT_EMPTY)
        negcache_unslot(nc, s);   /* renewed below as the newest */
    uint32_t r = nc->next;
    struct negcache_entry *old = &nc->ring[r];
    if (old->held) {
        negcache_unslot(nc, negcache_find(nc, old->ns, old->key, old->check));
        nc->replaced++;
    }
    nc->next = r + 1 == nc->capacity ? 0 : r + 1;
    *old = (struct negcache_entry){ .key = key, .check = check, .cached_ms = now_ms, .ns = ns,
                                    .held = 1 };
    uint32_t i = negcache_hash(ns, key, check) & nc->mask;
    while (nc->slots[i] != SLOT_EMPTY)
        i = (i + 1) & nc->mask;
    nc->slots[i] = r;
    nc->count++;
}

bool negcache_hit(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check, uint64_t now_ms,
                  uint64_t ttl_ms)
{
    uint32_t s = negcache_find(nc, ns, key, check);
    if (s == SLOT_EMPTY)
        return false;
    const struct negcache_entry *e = &nc->ring[nc->slots[s]];
    if (ttl_ms > 0 && now_ms >= e->cached_ms && now_ms - e->cached_ms < ttl_ms)
        return true;
    negcache_unslot(nc, s);
    return false;
}

void negcache_remove(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check)
{
    uint32_t s = negcache_find(nc, ns, key, check);
    if (s != SLOT_EMPTY)
        negcache_unslot(nc, s);
}

size_t negcache_count(const struct negcache *nc)
{
    return nc->count;
}

uint64_t negcache_replaced(const struct negcache *nc)
{
    return nc->replaced;
}
