/* cache promote: store-only blocks brought back — a ghost read back into a
 * reserved host slot for the GETs waiting on it (promotion), and the blocks
 * a recovery scan found indexed as ghosts (see cache.h). Loop thread only;
 * the reads run on the store's workers (persist.h). */
#include "cache/cache_internal.h"

#include <inttypes.h>
#include <stdlib.h>

#include "kvnode.h"
#include "core/log.h"
#include "persist/kvs/kvs.h"
#include "persist/persist.h"

/* --- promotions ------------------------------------------------------------- */

/* One store read of a ghost into its reserved slot, and the waits on it. */
struct promo_waiter {
    struct cache_wait *w;
    struct promo_waiter *next;
};
struct cache_promo {
    struct cache *c;
    struct index_entry *e;
    struct kv_namespace *ns;
    struct promo_waiter *waiters;
};

static void cache_promo_done(void *arg, int rc)
{
    struct cache_promo *p = arg;
    struct cache *c = p->c;
    struct index_entry *e = p->e;
    struct kv_namespace *ns = p->ns;
    uint64_t bb = ns->layout.block_bytes;

    ns->reserved -= ns->reserved >= bb ? bb : ns->reserved;
    e->promo = NULL;
    if (!e->detached && rc == 0) {
        e->state = ENTRY_SEALED;
        e->persist = PERSIST_STORED;
        if (ns->stored > 0)
            ns->stored--;
        if (c->ghosts > 0)
            c->ghosts--;
        ns->blocks++;
        ns->bytes += bb;
        c->promotions_ok++;
        cache_note_sealed(c, e);
    } else {
        cache_slot_free(c, e);
        e->state = ENTRY_GHOST;
        if (!e->detached) {
            c->promotions_failed++;
            /* The store no longer holds it (absent, or a bad copy it removed). */
            if (rc == KVS_MISS || rc == KVS_CORRUPT)
                cache_remove_entry(c, e);
        }
    }
    for (struct promo_waiter *wt = p->waiters, *next; wt; wt = next) {
        next = wt->next;
        struct cache_wait *w = wt->w;
        free(wt);
        cache_wait_progress(w);
    }
    cache_unpin(c, e);
    ns->refs--;
    free(p);
}

/* Read a ghost back into a host slot. 0 when the read is on its way (the
 * entry is PROMOTING, pinned by the read); < 0 when there is no room or the
 * store queue refused it (the entry stays a ghost). */
int cache_promote(struct cache *c, struct kv_namespace *ns, struct index_entry *e)
{
    struct cache_promo *p;
    uint64_t off;

    if (!cache_quota_room(c, ns) || !cache_make_room(c, ns->cls) ||
        arena_alloc(c->host, ns->cls, &off) < 0)
        return -KVNODE_ENOSPC;
    p = calloc(1, sizeof *p);
    if (!p) {
        arena_free(c->host, off);
        return -KVNODE_ENOMEM;
    }
    p->c = c;
    p->e = e;
    p->ns = ns;
    ns->refs++;
    if (persist_read(c->persist, ns, e->key, e->check, (uint8_t *)arena_base(c->host) + off,
                     ns->layout.block_bytes, cache_promo_done, p) < 0) {
        arena_free(c->host, off);
        ns->refs--;
        free(p);
        return -KVNODE_ELIMIT;
    }
    e->state = ENTRY_PROMOTING;
    e->tier = KVNODE_TIER_HOST;
    e->arena = arena_id(c->host);
    e->cls = ns->cls;
    e->offset = off;
    e->promo = p;
    e->pins++;
    ns->reserved += ns->layout.block_bytes;
    c->promotions++;
    return 0;
}

int cache_promo_wait(struct cache_wait *w, struct index_entry *e)
{
    struct cache_promo *p = e->promo;
    struct promo_waiter *wt = malloc(sizeof *wt);
    if (!wt)
        return -KVNODE_ENOMEM;
    wt->w = w;
    wt->next = p->waiters;
    p->waiters = wt;
    w->outstanding++;
    return 0;
}

/* --- recovery ------------------------------------------------------------------ */

/* The namespace of a layout found in the store, registered if new. NULL
 * when it cannot be (invalid, conflicting, too many, block too big). */
static struct kv_namespace *cache_ns_for_found(struct cache *c, const struct kvs_found *f)
{
    struct kv_namespace *ns = NULL;
    int created = 0;
    uint32_t cls;
    char err[256];

    if (arena_class_for(c->host, f->layout.block_bytes, &cls) < 0)
        return NULL;
    if (ns_bind_ex(c->namespaces, &f->layout, false, &ns, &created, err, sizeof err) < 0) {
        log_debug("recovery: skipping a block of %s: %s", f->layout.model, err);
        return NULL;
    }
    if (ns->fingerprint != f->fingerprint)
        return NULL;
    ns->cls = cls;
    if (created)
        log_info("namespace %u: deployment %s tp_rank %u/%u block_bytes %" PRIu64
                 " (found in the store)", ns->id, ns->deployment_id, ns->layout.tp_rank,
                 ns->layout.tp_size, ns->layout.block_bytes);
    return ns;
}

void cache_add_stored(struct cache *c, const struct kvs_found *blocks, size_t n)
{
    struct kv_namespace *ns = NULL;
    const struct kvs_found *ns_of = NULL;

    for (size_t i = 0; i < n; i++) {
        const struct kvs_found *f = &blocks[i];
        /* Blocks of one namespace come in runs: resolve it once per run. */
        if (!ns_of || f->fingerprint != ns_of->fingerprint ||
            f->layout.tp_rank != ns_of->layout.tp_rank) {
            ns = cache_ns_for_found(c, f);
            ns_of = f;
        }
        if (!ns || f->size != ns->layout.block_bytes) {
            c->recovery_skipped++;
            continue;
        }
        struct index_entry *e = index_lookup(c->index, ns->id, f->key);
        if (e) {
            /* Put again since the start: the store's copy is the same block
             * (unless another word's put took the key meanwhile). */
            if (e->state == ENTRY_SEALED && e->persist == PERSIST_NONE && e->check == f->check)
                e->persist = PERSIST_STORED;
            continue;
        }
        e = index_insert(c->index, ns->id, f->key);
        if (!e) {
            c->recovery_skipped++;
            continue;
        }
        e->check = f->check;
        e->state = ENTRY_GHOST;
        e->tier = KVNODE_TIER_HOST;
        e->arena = UINT32_MAX;
        e->persist = PERSIST_STORED;
        ns->stored++;
        c->ghosts++;
        c->recovered++;
    }
}
