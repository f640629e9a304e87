/* keylock: per-key FIFO of store operations (see keylock.h).
 *
 * A chained hash table of held keys that doubles when it holds more keys
 * than buckets. Growing is O(held), and held keys are bounded by the store
 * requests in flight and waiting, so it is rare and small. */
#include "mem/keylock.h"

#include <stdlib.h>

#include "kvnode.h"

struct keylock_rec {
    uint32_t ns;
    int64_t key;
    struct keylock_waiter *head, *tail;   /* waiting, in order */
    struct keylock_rec *next;
};

struct keylock {
    struct keylock_rec **buckets;
    size_t nbuckets;                      /* a power of two */
    size_t held;
};

#define KEYLOCK_MIN_BUCKETS 256u

static size_t keylock_hash(uint32_t ns, int64_t key)
{
    uint64_t h = (uint64_t)key ^ ((uint64_t)ns * UINT64_C(0x9e3779b97f4a7c15));
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return (size_t)h;
}

int keylock_create(struct keylock **out)
{
    struct keylock *t = calloc(1, sizeof *t);
    *out = NULL;
    if (!t)
        return -KVNODE_ENOMEM;
    t->buckets = calloc(KEYLOCK_MIN_BUCKETS, sizeof *t->buckets);
    if (!t->buckets) {
        free(t);
        return -KVNODE_ENOMEM;
    }
    t->nbuckets = KEYLOCK_MIN_BUCKETS;
    *out = t;
    return 0;
}

void keylock_destroy(struct keylock *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (struct keylock_rec *r = t->buckets[i], *next; r; r = next) {
            next = r->next;
            free(r);
        }
    }
    free(t->buckets);
    free(t);
}

static struct keylock_rec **keylock_slot(struct keylock *t, uint32_t ns, int64_t key)
{
    struct keylock_rec **p = &t->buckets[keylock_hash(ns, key) & (t->nbuckets - 1)];
    while (*p && ((*p)->ns != ns || (*p)->key != key))
        p = &(*p)->next;
    return p;
}

/* Double the table; on failure it stays as it is (only slower). */
static void keylock_grow(struct keylock *t)
{
    size_t n = t->nbuckets * 2;
    struct keylock_rec **b = calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (struct keylock_rec *r = t->buckets[i], *next; r; r = next) {
            next = r->next;
            size_t j = keylock_hash(r->ns, r->key) & (n - 1);
            r->next = b[j];
            b[j] = r;
        }
    }
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = n;
}

int keylock_acquire(struct keylock *t, uint32_t ns, int64_t key, struct keylock_waiter *w)
{
    struct keylock_rec **p = keylock_slot(t, ns, key);
    if (*p) {
        if (!w)
            return 0;
        w->next = NULL;
        if ((*p)->tail)
            (*p)->tail->next = w;
        else
            (*p)->head = w;
        (*p)->tail = w;
        return 0;
    }
    struct keylock_rec *r = calloc(1, sizeof *r);
    if (!r)
        return -KVNODE_ENOMEM;
    r->ns = ns;
    r->key = key;
    *p = r;
    if (++t->held > t->nbuckets)
        keylock_grow(t);
    return 1;
}

void keylock_release(struct keylock *t, uint32_t ns, int64_t key)
{
    struct keylock_rec **p = keylock_slot(t, ns, key), *r = *p;
    if (!r)
        return;
    struct keylock_waiter *w = r->head;
    if (!w) {
        *p = r->next;
        free(r);
        t->held--;
        return;
    }
    /* The key passes to the first waiter: the record stays. */
    r->head = w->next;
    if (!r->head)
        r->tail = NULL;
    w->next = NULL;
    w->start(w);
}

size_t keylock_held(const struct keylock *t)
{
    return t->held;
}
