/* persist tombs: tombstones, on the loop thread (see persist_hide in
 * persist.h; the table's layout is at struct tombs in persist_internal.h).
 *
 * Tombstones. A backend that keeps deleted blocks (keeps_deleted: v6d)
 * cannot be told to forget a key, so persist_hide remembers deleted keys
 * (bounded FIFO, struct tombs) and persist_job_done (worker.c) hides them
 * from the results of lookups and reads, also of those already under way;
 * a write submitted later (a re-put) forgets the tombstone. */
#include "persist/persist_internal.h"

#include <stdlib.h>

/* --- tombstones (loop thread) ------------------------------------------------------- */

static size_t tomb_slot(const struct tombs *t, uint64_t fp, uint32_t rank, int64_t key)
{
    uint64_t h = fp ^ ((uint64_t)rank << 32) ^ ((uint64_t)key * UINT64_C(0x9e3779b97f4a7c15));
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return (size_t)h & (t->tsize - 1);
}

/* The table slot of the key, or SIZE_MAX. */
static size_t tomb_find(const struct tombs *t, uint64_t fp, uint32_t rank, int64_t key,
                        uint64_t check)
{
    if (!t->table)
        return SIZE_MAX;
    for (size_t i = tomb_slot(t, fp, rank, key);; i = (i + 1) & (t->tsize - 1)) {
        const struct tomb *e = &t->table[i];
        if (!e->seq)
            return SIZE_MAX;
        if (e->fp == fp && e->rank == rank && e->key == key && e->check == check)
            return i;
    }
}

/* Empty slot i, shifting back the entries of its probe run (no markers). */
static void tomb_erase(struct tombs *t, size_t i)
{
    size_t mask = t->tsize - 1;
    for (;;) {
        t->table[i].seq = 0;
        size_t j = i;
        for (;;) {
            j = (j + 1) & mask;
            if (!t->table[j].seq)
                return;
            size_t h = tomb_slot(t, t->table[j].fp, t->table[j].rank, t->table[j].key);
            /* j stays when its home h lies cyclically in (i, j] */
            if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
                continue;
            t->table[i] = t->table[j];
            i = j;
            break;
        }
    }
}

bool persist_tomb_hidden(const struct persist *p, const struct kvs_ns *ns, int64_t key,
                         uint64_t check)
{
    return p->c.tombstones &&
           tomb_find(&p->tombs, ns->fingerprint, ns->layout->tp_rank, key, check) != SIZE_MAX;
}

static void tomb_add(struct persist *p, uint64_t fp, uint32_t rank, int64_t key, uint64_t check)
{
    struct tombs *t = &p->tombs;
    if (!t->table) {
        size_t tsize = 16;
        while (tsize < 2 * t->cap)
            tsize *= 2;
        t->table = calloc(tsize, sizeof *t->table);
        t->ring = calloc(t->cap, sizeof *t->ring);
        if (!t->table || !t->ring) {
            free(t->table);
            free(t->ring);
            t->table = t->ring = NULL;
            p->c.tombstones_dropped++;
            return;
        }
        t->tsize = tsize;
    }
    if (tomb_find(t, fp, rank, key, check) != SIZE_MAX)
        return;
    if (t->count == t->cap) {   /* forget the oldest */
        const struct tomb *old = &t->ring[t->head];
        size_t i = tomb_find(t, old->fp, old->rank, old->key, old->check);
        if (i != SIZE_MAX && t->table[i].seq == old->seq) {
            tomb_erase(t, i);
            p->c.tombstones--;
            p->c.tombstones_dropped++;
        }
        t->head = (t->head + 1) % t->cap;
        t->count--;
    }
    struct tomb e = { .fp = fp, .key = key, .check = check, .seq = ++t->seq, .rank = rank };
    t->ring[(t->head + t->count) % t->cap] = e;
    t->count++;
    size_t i = tomb_slot(t, fp, rank, key);
    while (t->table[i].seq)
        i = (i + 1) & (t->tsize - 1);
    t->table[i] = e;
    p->c.tombstones++;
}

void persist_tomb_remove(struct persist *p, const struct kv_namespace *ns, int64_t key,
                         uint64_t check)
{
    if (!p->c.tombstones)
        return;
    size_t i = tomb_find(&p->tombs, ns->fingerprint, ns->layout.tp_rank, key, check);
    if (i != SIZE_MAX) {
        tomb_erase(&p->tombs, i);
        p->c.tombstones--;
    }
}

void persist_hide(struct persist *p, const struct kv_namespace *ns, const int64_t *keys,
                  const uint64_t *checks, size_t n)
{
    if (!p || !ns || !p->be->keeps_deleted || p->tombs.cap == 0)
        return;
    for (size_t i = 0; i < n; i++)
        tomb_add(p, ns->fingerprint, ns->layout.tp_rank, keys[i], checks ? checks[i] : 0);
}
