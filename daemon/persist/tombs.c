/* persist tombs: tombstones, on the loop thread (see persist_hide in
 * persist.h; the table's layout is at struct tombs in persist_internal.h).
 *
 * Tombstones. A backend that keeps deleted blocks (keeps_deleted: v6d)
 * cannot be told to forget a key, so persist_hide remembers deleted keys
 * (bounded FIFO, struct tombs) and persist_job_done (worker.c) hides them
 * from the results of lookups and reads, also of those already under way;
 * a write submitted later (a re-put) forgets the tombstone. */
#include "persist/persist_internal.h"

/* --- tombstones (loop thread) ------------------------------------------------------- */

static struct keyfifo_id tomb_id(uint64_t fp, uint32_t rank, int64_t key, uint64_t check)
{
    return (struct keyfifo_id){ .scope = fp, .sub = rank, .key = key, .check = check };
}

bool persist_tomb_hidden(const struct persist *p, const struct kvs_ns *ns, int64_t key,
                         uint64_t check)
{
    struct keyfifo_id id = tomb_id(ns->fingerprint, ns->layout->tp_rank, key, check);
    return p->tombs.set && keyfifo_find(p->tombs.set, &id) != NULL;
}

static void tomb_add(struct persist *p, uint64_t fp, uint32_t rank, int64_t key, uint64_t check)
{
    struct tombs *t = &p->tombs;
    if (!t->set && keyfifo_create((uint32_t)t->cap, &t->set) < 0) {
        p->c.tombstones_dropped++;
        return;
    }
    struct keyfifo_id id = tomb_id(fp, rank, key, check);
    if (keyfifo_find(t->set, &id))
        return;
    if (keyfifo_put(t->set, &id, 0))    /* the oldest forgotten */
        p->c.tombstones_dropped++;
    p->c.tombstones = keyfifo_count(t->set);
}

void persist_tomb_remove(struct persist *p, const struct kv_namespace *ns, int64_t key,
                         uint64_t check)
{
    struct keyfifo_id id = tomb_id(ns->fingerprint, ns->layout.tp_rank, key, check);
    if (p->tombs.set && keyfifo_remove(p->tombs.set, &id))
        p->c.tombstones = keyfifo_count(p->tombs.set);
}

void persist_hide(struct persist *p, const struct kv_namespace *ns, const int64_t *keys,
                  const uint64_t *checks, size_t n)
{
    if (!p || !ns || !p->be->keeps_deleted || p->tombs.cap == 0)
        return;
    for (size_t i = 0; i < n; i++)
        tomb_add(p, ns->fingerprint, ns->layout.tp_rank, keys[i], checks ? checks[i] : 0);
}
