/* lease: lease records, ids, per-owner lists and the expiry heap. See
 * lease.h for the contract. */
#include "mem/lease.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>

#include "kvnode.h"

#define LEASE_MIN_BUCKETS  256u
#define LEASE_MIN_HEAP     64u
/* Buckets migrated per create/find/destroy while the id table grows; create
 * moves more than one so a rehash ends before the table fills up again. */
#define LEASE_REHASH_CREATE 4u
#define LEASE_REHASH_OTHER  1u

struct lease_bucket_table {
    struct lease **b;
    size_t mask;        /* buckets - 1; b == NULL when unused */
};

struct lease_table {
    /* id -> lease, grown incrementally like the index: t[0] buckets below
     * rehash_pos already moved to t[1]. */
    struct lease_bucket_table t[2];
    size_t rehash_pos;
    /* min-heap on expires_ms; lease->heap_pos is its slot */
    struct lease **heap;
    size_t heap_len, heap_cap;
    size_t by_kind[3];      /* [0] all, [LEASE_READ], [LEASE_WRITE] */
    uint64_t id_high;       /* random high 32 bits of every id */
    uint32_t id_counter;
};

static uint64_t lease_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint32_t lease_random32(void)
{
    uint32_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
        return r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint32_t)lease_mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                                 ((uint64_t)getpid() << 48));
}

/* --- id table --------------------------------------------------------------- */

static int lease_rehashing(const struct lease_table *t)
{
    return t->t[1].b != NULL;
}

static struct lease **lease_slot(struct lease_table *t, uint64_t id)
{
    uint64_t h = lease_mix64(id);
    size_t i = (size_t)h & t->t[0].mask;
    if (lease_rehashing(t) && i < t->rehash_pos)
        return &t->t[1].b[(size_t)h & t->t[1].mask];
    return &t->t[0].b[i];
}

static void lease_rehash_step(struct lease_table *t, size_t n)
{
    if (!lease_rehashing(t))
        return;
    size_t size0 = t->t[0].mask + 1;
    while (n-- > 0 && t->rehash_pos < size0) {
        struct lease *l = t->t[0].b[t->rehash_pos];
        t->t[0].b[t->rehash_pos] = NULL;
        while (l) {
            struct lease *next = l->hash_next;
            struct lease **dst = &t->t[1].b[(size_t)lease_mix64(l->id) & t->t[1].mask];
            l->hash_next = *dst;
            *dst = l;
            l = next;
        }
        t->rehash_pos++;
    }
    if (t->rehash_pos == size0) {
        free(t->t[0].b);
        t->t[0] = t->t[1];
        t->t[1].b = NULL;
        t->t[1].mask = 0;
        t->rehash_pos = 0;
    }
}

/* Grow at load factor 1; on allocation failure the table just gets denser. */
static void lease_maybe_grow(struct lease_table *t)
{
    size_t size0 = t->t[0].mask + 1;
    if (lease_rehashing(t) || t->by_kind[0] < size0)
        return;
    struct lease **b = calloc(size0 * 2, sizeof *b);
    if (!b)
        return;
    t->t[1].b = b;
    t->t[1].mask = size0 * 2 - 1;
    t->rehash_pos = 0;
}

static struct lease *lease_lookup(struct lease_table *t, uint64_t id)
{
    for (struct lease *l = *lease_slot(t, id); l; l = l->hash_next)
        if (l->id == id)
            return l;
    return NULL;
}

static uint64_t lease_next_id(struct lease_table *t)
{
    for (;;) {
        if (++t->id_counter == 0)       /* wrapped: new high part, fresh space */
            t->id_high = (uint64_t)lease_random32() << 32;
        uint64_t id = t->id_high | t->id_counter;
        if (id != 0 && !lease_lookup(t, id))
            return id;
    }
}

/* --- expiry heap ---------------------------------------------------------- */

static void lease_heap_set(struct lease_table *t, size_t i, struct lease *l)
{
    t->heap[i] = l;
    l->heap_pos = i;
}

static void lease_heap_up(struct lease_table *t, size_t i)
{
    struct lease *l = t->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (t->heap[p]->expires_ms <= l->expires_ms)
            break;
        lease_heap_set(t, i, t->heap[p]);
        i = p;
    }
    lease_heap_set(t, i, l);
}

static void lease_heap_down(struct lease_table *t, size_t i)
{
    struct lease *l = t->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= t->heap_len)
            break;
        if (c + 1 < t->heap_len && t->heap[c + 1]->expires_ms < t->heap[c]->expires_ms)
            c++;
        if (l->expires_ms <= t->heap[c]->expires_ms)
            break;
        lease_heap_set(t, i, t->heap[c]);
        i = c;
    }
    lease_heap_set(t, i, l);
}

static int lease_heap_reserve(struct lease_table *t)
{
    if (t->heap_len < t->heap_cap)
        return 0;
    size_t cap = t->heap_cap ? t->heap_cap * 2 : LEASE_MIN_HEAP;
    if (cap > SIZE_MAX / sizeof *t->heap)
        return -KVNODE_ENOMEM;
    struct lease **h = realloc(t->heap, cap * sizeof *h);
    if (!h)
        return -KVNODE_ENOMEM;
    t->heap = h;
    t->heap_cap = cap;
    return 0;
}

static void lease_heap_remove(struct lease_table *t, struct lease *l)
{
    size_t i = l->heap_pos;
    struct lease *last = t->heap[--t->heap_len];
    if (last == l)
        return;
    lease_heap_set(t, i, last);
    /* The moved leaf may belong above or below slot i. */
    if (i > 0 && t->heap[(i - 1) / 2]->expires_ms > last->expires_ms)
        lease_heap_up(t, i);
    else
        lease_heap_down(t, i);
}

/* --- public ---------------------------------------------------------------- */

int lease_table_create(struct lease_table **out)
{
    struct lease_table *t = calloc(1, sizeof *t);
    if (!t)
        return -KVNODE_ENOMEM;
    t->t[0].b = calloc(LEASE_MIN_BUCKETS, sizeof *t->t[0].b);
    if (!t->t[0].b) {
        free(t);
        return -KVNODE_ENOMEM;
    }
    t->t[0].mask = LEASE_MIN_BUCKETS - 1;
    t->id_high = (uint64_t)lease_random32() << 32;
    *out = t;
    return 0;
}

static void lease_free(struct lease *l)
{
    free(l->entries);
    free(l);
}

void lease_table_destroy(struct lease_table *t)
{
    if (!t)
        return;
    /* Every live lease is in the heap exactly once. */
    for (size_t i = 0; i < t->heap_len; i++)
        lease_free(t->heap[i]);
    free(t->heap);
    free(t->t[0].b);
    free(t->t[1].b);
    free(t);
}

struct lease *lease_create(struct lease_table *t, int kind, uint32_t ns, struct lease_list *owner,
                    uint64_t now_ms, uint64_t ttl_ms, size_t n)
{
    if (kind != LEASE_READ && kind != LEASE_WRITE)
        return NULL;
    if (lease_heap_reserve(t) != 0)
        return NULL;
    struct lease *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    if (n > 0) {
        l->entries = calloc(n, sizeof *l->entries);
        if (!l->entries) {
            free(l);
            return NULL;
        }
    }
    l->kind = kind;
    l->ns = ns;
    l->n = n;
    l->created_ms = now_ms;
    l->expires_ms = ttl_ms > UINT64_MAX - now_ms ? UINT64_MAX : now_ms + ttl_ms;

    lease_maybe_grow(t);
    lease_rehash_step(t, LEASE_REHASH_CREATE);
    l->id = lease_next_id(t);
    struct lease **slot = lease_slot(t, l->id);
    l->hash_next = *slot;
    *slot = l;

    t->heap_len++;
    lease_heap_set(t, t->heap_len - 1, l);
    lease_heap_up(t, t->heap_len - 1);

    l->owner = owner;
    if (owner) {
        l->owner_next = owner->head;
        if (owner->head)
            owner->head->owner_prev = l;
        owner->head = l;
        owner->count++;
    }
    t->by_kind[0]++;
    t->by_kind[kind]++;
    return l;
}

struct lease *lease_find(struct lease_table *t, uint64_t id)
{
    if (id == 0)
        return NULL;
    lease_rehash_step(t, LEASE_REHASH_OTHER);
    return lease_lookup(t, id);
}

void lease_destroy(struct lease_table *t, struct lease *l)
{
    lease_rehash_step(t, LEASE_REHASH_OTHER);
    for (struct lease **p = lease_slot(t, l->id); *p; p = &(*p)->hash_next) {
        if (*p == l) {
            *p = l->hash_next;
            break;
        }
    }
    lease_heap_remove(t, l);
    if (l->owner) {
        if (l->owner_prev)
            l->owner_prev->owner_next = l->owner_next;
        else
            l->owner->head = l->owner_next;
        if (l->owner_next)
            l->owner_next->owner_prev = l->owner_prev;
        l->owner->count--;
    }
    t->by_kind[0]--;
    t->by_kind[l->kind]--;
    lease_free(l);
}

struct lease *lease_first_expired(struct lease_table *t, uint64_t now_ms)
{
    if (t->heap_len == 0 || t->heap[0]->expires_ms > now_ms)
        return NULL;
    return t->heap[0];
}

size_t lease_count(const struct lease_table *t, int kind)
{
    if (kind == 0 || kind == LEASE_READ || kind == LEASE_WRITE)
        return t->by_kind[kind];
    return 0;
}
