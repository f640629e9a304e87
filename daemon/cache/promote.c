/* cache promote: what a GET fetches from the store — a key the index does not
 * know looked up (or read at once into a host slot, when the store's reads
 * say "absent"), a ghost read back into a reserved host slot (promotion) —
 * behind one call, cache_fetch; the store's misses remembered for a while;
 * the lookups of a MATCH; the blocks a recovery scan found, indexed as
 * ghosts (see cache.h). Loop thread only; the store's calls run on its
 * workers (persist.h), their completions on the loop. */
#include "cache/cache_internal.h"

#include <inttypes.h>
#include <stdlib.h>

#include "core/clock.h"
#include "kvnode.h"
#include "core/log.h"
#include "persist/kvs/kvs.h"
#include "persist/persist.h"

static int cache_probe_submit(struct cache *c, struct cache_wait *w, size_t from);
static int cache_promo_wait(struct cache_wait *w, struct index_entry *e);

/* --- fetch: a GET's key that is not in memory ------------------------------- */

static enum cache_fetch cache_fetch_unknown(struct cache *c, struct cache_wait **wp, size_t i);
static enum cache_fetch cache_fetch_ghost(struct cache *c, struct cache_wait **wp,
                                          struct index_entry *e);

enum cache_fetch cache_fetch(struct cache *c, struct cache_wait **wp, size_t i, struct index_entry *e)
{
    if (!(*wp)->may_wait)
        return FETCH_NONE;
    return e ? cache_fetch_ghost(c, wp, e) : cache_fetch_unknown(c, wp, i);
}

/* A key the index does not know: ask the store, once per GET, unless it
 * lacked the key a moment ago. A store whose reads say "absent" reads the
 * run at once (no lookup round trip first), into free memory; what that
 * leaves (no free slot) is looked up. */
static enum cache_fetch cache_fetch_unknown(struct cache *c, struct cache_wait **wp, size_t i)
{
    struct cache_wait *w = *wp;

    if (w->looked_up || !cache_may_lookup(c) ||
        cache_negative_hit(c, w->ns, w->keys[i], cache_check_at(w->checks, i)))
        return FETCH_NONE;
    if (!(w = cache_wait_heap(w)))
        return FETCH_NONE;
    *wp = w;
    if (!w->probed && cache_reads_find(c) && cache_probe_submit(c, w, i) == 0)
        return FETCH_ASKED;   /* cache_probe_done walks on */
    if (cache_lookup_submit(c, w, i) == 0)
        return FETCH_ASKED;   /* cache_lookup_done walks on */
    return FETCH_NONE;
}

/* A ghost promoted, or one being promoted: w waits for it. */
static enum cache_fetch cache_fetch_ghost(struct cache *c, struct cache_wait **wp,
                                          struct index_entry *e)
{
    struct cache_wait *w = cache_wait_heap(*wp);

    if (!w)
        return FETCH_NONE;
    *wp = w;
    if (e->state == ENTRY_GHOST && cache_promote(c, w->ns, e) < 0)
        return FETCH_NONE;
    if (cache_promo_wait(w, e) < 0)
        return FETCH_NONE;
    return FETCH_COMING;
}

/* --- whether the store is asked, and the misses it reported ------------------ */

bool cache_may_lookup(const struct cache *c)
{
    return c->persist && persist_lookup_on_miss(c->persist);
}

bool cache_reads_find(const struct cache *c)
{
    return persist_reads_find(c->persist);
}

bool cache_negative_hit(struct cache *c, const struct kv_namespace *ns, int64_t key, uint64_t check)
{
    if (!c->negcache || c->negative_ttl_ms == 0 ||
        !negcache_hit(c->negcache, ns->id, key, check, clock_now_ms(), c->negative_ttl_ms))
        return false;
    c->lookup_negative_hits++;
    return true;
}

void cache_negative_forget(struct cache *c, const struct kv_namespace *ns, int64_t key, uint64_t check)
{
    if (c->negcache)
        negcache_remove(c->negcache, ns->id, key, check);
}

/* The store said it lacks (key, check): remember it for a while, unless
 * the index has come to know the key meanwhile (a local put). */
static void cache_negative_note(struct cache *c, const struct kv_namespace *ns, int64_t key,
                                uint64_t check)
{
    if (c->negative_ttl_ms == 0 || index_lookup(c->index, ns->id, key))
        return;
    if (!c->negcache && negcache_create(NEGCACHE_CAPACITY, &c->negcache) < 0)
        return;   /* out of memory: misses are asked about again */
    negcache_insert(c->negcache, ns->id, key, check, clock_now_ms());
}

/* --- lookups of keys the index does not know ---------------------------------- */

/* A lookup of keys the index does not know. */
struct cache_lookup {
    struct cache_wait *w;
    int64_t *keys;
    const uint64_t *checks;     /* NULL: every word 0 */
    size_t n;
    uint8_t present[];
};

static void cache_lookup_done(void *arg, int rc);
static size_t cache_index_found(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                                const uint64_t *checks, const uint8_t *present, size_t n,
                                bool each);

/* Ask the store about keys[from..n). 0 when submitted (w counts it). */
int cache_lookup_submit(struct cache *c, struct cache_wait *w, size_t from)
{
    size_t n = w->n - from;
    struct cache_lookup *lk = malloc(sizeof *lk + n);
    if (!lk)
        return -KVNODE_ENOMEM;
    lk->w = w;
    lk->keys = (int64_t *)w->keys + from;
    lk->checks = w->checks ? w->checks + from : NULL;
    lk->n = n;
    if (persist_exists(c->persist, &(struct persist_lookup_req){
                           .ns = w->ns, .keys = lk->keys, .checks = lk->checks, .n = n,
                           .present = lk->present, .done = cache_lookup_done, .arg = lk }) < 0) {
        free(lk);
        return -KVNODE_ELIMIT;
    }
    w->looked_up = true;
    w->outstanding++;
    c->lookups++;
    return 0;
}

static void cache_lookup_done(void *arg, int rc)
{
    struct cache_lookup *lk = arg;
    struct cache_wait *w = lk->w;
    struct cache *c = w->c;

    if (rc == 0) {
        size_t found = cache_index_found(c, w->ns, lk->keys, lk->checks, lk->present, lk->n,
                                         w->each);
        c->lookup_found += found;
        /* Where the store's run ends: the next MATCH of it need not ask. */
        if (!w->each && found < lk->n && !lk->present[found])
            cache_negative_note(c, w->ns, lk->keys[found], cache_check_at(lk->checks, found));
    }
    free(lk);
    /* A GET goes on walking with what the lookup found (promotions). */
    if (rc == 0 && w->kind == WAIT_GET && !w->answered && !w->finished)
        cache_get_walk(c, &w);
    cache_wait_progress(w);
}

/* Index as ghosts the keys the store reported (under the words asked
 * about), up to the first it lacks; each (a per-key MATCH): every one, and
 * every key it lacks is remembered as a miss. Returns the prefix found, or
 * (each) how many were found. */
static size_t cache_index_found(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                                const uint64_t *checks, const uint8_t *present, size_t n,
                                bool each)
{
    size_t i, found = 0;
    for (i = 0; i < n; i++) {
        if (!present[i]) {
            if (!each)
                break;
            cache_negative_note(c, ns, keys[i], cache_check_at(checks, i));
            continue;
        }
        if (index_lookup(c->index, ns->id, keys[i])) {
            found++;
            continue;
        }
        struct index_entry *e = index_insert(c->index, ns->id, keys[i]);
        if (!e)
            break;
        e->check = cache_check_at(checks, i);
        e->state = ENTRY_GHOST;
        e->tier = KVNODE_TIER_HOST;
        e->arena = INDEX_NO_ARENA;
        e->persist = PERSIST_STORED;
        ns->stored++;
        c->ghosts++;
        found++;
    }
    return each ? found : i;
}

/* --- reads of keys the index does not know (a store whose reads find) --------- */

/* A GET's run of keys the index does not know, read at once into host slots
 * reserved for them (persist_reads_find): the reply of each read says
 * whether the store holds the block, so no lookup round trip comes first.
 * The blocks up to the first the store lacks become SEALED entries; every
 * other slot is freed. */
struct probe_item {
    struct cache_probe *p;
    struct index_entry *e;      /* the entry made of it, pinned by the probe */
    int64_t key;
    uint64_t check;
    uint64_t offset;            /* its reserved host slot */
    int rc;
};
struct cache_probe {
    struct cache *c;
    struct cache_wait *w;
    struct kv_namespace *ns;
    size_t n, left;             /* reads sent, reads not back yet */
    struct probe_item items[];
};

static void cache_probe_read_done(void *arg, int rc);
static void cache_probe_done(struct cache_probe *p);
static void cache_probe_slot_free(struct cache *c, struct kv_namespace *ns, uint64_t offset);

/* Read the run of keys the index does not know from w->keys[from], as many
 * as free host slots can be reserved for. 0 when sent (w counts it); < 0
 * when not one could be (no free slot, the store's queue full): nothing is
 * held. Keys it leaves unread (no free slot; unknown keys after known ones)
 * are looked up when the walk reaches them, unless a read found the gap. */
static int cache_probe_submit(struct cache *c, struct cache_wait *w, size_t from)
{
    struct kv_namespace *ns = w->ns;
    uint64_t bb = ns->layout.block_bytes;
    size_t run = 0, k, sent;

    while (from + run < w->n && !index_lookup(c->index, ns->id, w->keys[from + run]))
        run++;
    if (run == 0)
        return -KVNODE_EINVAL;
    struct cache_probe *p = calloc(1, sizeof *p + run * sizeof p->items[0]);
    if (!p)
        return -KVNODE_ENOMEM;
    /* Free memory only: nothing is evicted for a block not known to exist. */
    for (k = 0; k < run; k++) {
        uint64_t off;
        if ((c->namespace_quota && ns->bytes + ns->reserved + bb > c->namespace_quota) ||
            arena_alloc(c->host, ns->cls, &off) < 0)
            break;
        ns->reserved += bb;
        p->items[k] = (struct probe_item){ .p = p, .key = w->keys[from + k],
                                           .check = cache_check_at(w->checks, from + k),
                                           .offset = off };
    }
    for (sent = 0; sent < k; sent++) {
        struct probe_item *it = &p->items[sent];
        if (persist_read(c->persist, &(struct persist_read_req){
                             .ns = ns, .key = it->key, .check = it->check,
                             .data = (uint8_t *)arena_base(c->host) + it->offset, .len = bb,
                             .done = cache_probe_read_done, .arg = it }) < 0)
            break;
    }
    for (size_t i = sent; i < k; i++)
        cache_probe_slot_free(c, ns, p->items[i].offset);
    if (sent == 0) {
        free(p);
        return k == 0 ? -KVNODE_ENOSPC : -KVNODE_ELIMIT;
    }
    /* Completions run later, on the loop: counting them now is safe. */
    p->c = c;
    p->w = w;
    p->ns = ns;
    p->n = p->left = sent;
    ns->refs++;
    w->probed = true;
    w->outstanding++;
    c->lookup_reads++;
    return 0;
}

static void cache_probe_read_done(void *arg, int rc)
{
    struct probe_item *it = arg;
    struct cache_probe *p = it->p;
    it->rc = rc;
    if (--p->left == 0)
        cache_probe_done(p);
}

/* Every read is back: index the found prefix, walk the GET on, then let
 * the blocks go to the LRU (tail-first, as a lease's end does). */
static void cache_probe_done(struct cache_probe *p)
{
    struct cache *c = p->c;
    struct cache_wait *w = p->w;
    struct kv_namespace *ns = p->ns;
    uint64_t bb = ns->layout.block_bytes;
    bool prefix = true;

    for (size_t i = 0; i < p->n; i++) {
        struct probe_item *it = &p->items[i];
        if (it->rc != 0)
            w->looked_up = true;   /* the store has answered where the prefix ends */
        /* The first block the store lacks (absent, another word, corrupt and
         * deleted) ends the run: remember it; a failed read is no answer. */
        if (prefix && (it->rc == KVS_MISS || it->rc == KVS_CORRUPT))
            cache_negative_note(c, ns, it->key, it->check);
        if (!prefix || it->rc != 0) {
            prefix = false;   /* a block after a missing one is not returned */
            cache_probe_slot_free(c, ns, it->offset);
            continue;
        }
        /* Put, deleted and put, or found by another request meanwhile: the
         * index's entry is the one the walk serves. */
        struct index_entry *e = index_lookup(c->index, ns->id, it->key);
        if (e) {
            cache_probe_slot_free(c, ns, it->offset);
            continue;
        }
        e = index_insert(c->index, ns->id, it->key);
        if (!e) {
            prefix = false;
            cache_probe_slot_free(c, ns, it->offset);
            continue;
        }
        ns->reserved -= ns->reserved >= bb ? bb : ns->reserved;
        e->check = it->check;
        e->state = ENTRY_SEALED;
        e->tier = KVNODE_TIER_HOST;
        e->arena = arena_id(c->host);
        e->cls = ns->cls;
        e->offset = it->offset;
        e->persist = PERSIST_STORED;
        cache_pin(c, e);
        it->e = e;
        ns->blocks++;
        ns->bytes += bb;
        c->lookup_found++;
        c->promotions++;
        c->promotions_ok++;
        cache_note_sealed(c, e);
    }
    if (w->kind == WAIT_GET && !w->answered && !w->finished)
        cache_get_walk(c, &w);
    cache_wait_progress(w);
    for (size_t i = p->n; i-- > 0;)
        if (p->items[i].e)
            cache_unpin(c, p->items[i].e);
    ns->refs--;
    free(p);
}

static void cache_probe_slot_free(struct cache *c, struct kv_namespace *ns, uint64_t offset)
{
    uint64_t bb = ns->layout.block_bytes;
    arena_free(c->host, offset);
    ns->reserved -= ns->reserved >= bb ? bb : ns->reserved;
}

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

static void cache_promo_done(void *arg, int rc);

static size_t promo_slot(const struct index_entry *e, size_t mask)
{
    uint64_t x = (uint64_t)(uintptr_t)e * 0x9e3779b97f4a7c15ull;
    return (size_t)(x ^ (x >> 32)) & mask;
}

/* Room in the table for one more record: 0 or -KVNODE_ENOMEM. */
static int promo_tab_reserve(struct cache *c)
{
    if ((c->promo_n + 1) * 2 <= c->promo_cap)
        return 0;
    size_t cap = c->promo_cap ? c->promo_cap * 2 : 64;
    struct cache_promo **t = calloc(cap, sizeof *t);
    if (!t)
        return -KVNODE_ENOMEM;
    for (size_t i = 0; i < c->promo_cap; i++) {
        struct cache_promo *p = c->promo_tab[i];
        if (!p)
            continue;
        size_t j = promo_slot(p->e, cap - 1);
        while (t[j])
            j = (j + 1) & (cap - 1);
        t[j] = p;
    }
    free(c->promo_tab);
    c->promo_tab = t;
    c->promo_cap = cap;
    return 0;
}

/* Where e's record is, or the free slot it would go to. */
static size_t promo_tab_find(const struct cache *c, const struct index_entry *e)
{
    size_t mask = c->promo_cap - 1, i = promo_slot(e, mask);
    while (c->promo_tab[i] && c->promo_tab[i]->e != e)
        i = (i + 1) & mask;
    return i;
}

/* After promo_tab_reserve. */
static void promo_tab_put(struct cache *c, struct cache_promo *p)
{
    c->promo_tab[promo_tab_find(c, p->e)] = p;
    c->promo_n++;
}

static struct cache_promo *promo_tab_get(const struct cache *c, const struct index_entry *e)
{
    return c->promo_cap ? c->promo_tab[promo_tab_find(c, e)] : NULL;
}

/* Remove e's record, moving later ones of its run back so that every
 * record stays reachable from its home slot. */
static void promo_tab_del(struct cache *c, const struct index_entry *e)
{
    size_t mask = c->promo_cap - 1, i = promo_tab_find(c, e);
    if (!c->promo_tab[i])
        return;
    c->promo_tab[i] = NULL;
    c->promo_n--;
    for (size_t j = (i + 1) & mask; c->promo_tab[j]; j = (j + 1) & mask) {
        size_t k = promo_slot(c->promo_tab[j]->e, mask);
        /* Stays when its home k lies cyclically in (i, j]. */
        bool stays = i < j ? (k > i && k <= j) : (k > i || k <= j);
        if (!stays) {
            c->promo_tab[i] = c->promo_tab[j];
            c->promo_tab[j] = NULL;
            i = j;
        }
    }
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
    p = promo_tab_reserve(c) == 0 ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        arena_free(c->host, off);
        return -KVNODE_ENOMEM;
    }
    p->c = c;
    p->e = e;
    p->ns = ns;
    ns->refs++;
    if (persist_read(c->persist, &(struct persist_read_req){
                         .ns = ns, .key = e->key, .check = e->check,
                         .data = (uint8_t *)arena_base(c->host) + off, .len = ns->layout.block_bytes,
                         .done = cache_promo_done, .arg = p }) < 0) {
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
    promo_tab_put(c, p);
    e->pins++;
    ns->reserved += ns->layout.block_bytes;
    c->promotions++;
    return 0;
}

/* w waits for e's promotion (counted in w->outstanding). */
static int cache_promo_wait(struct cache_wait *w, struct index_entry *e)
{
    struct cache_promo *p = promo_tab_get(w->c, e);
    struct promo_waiter *wt = p ? malloc(sizeof *wt) : NULL;
    if (!wt)
        return -KVNODE_ENOMEM;
    wt->w = w;
    wt->next = p->waiters;
    p->waiters = wt;
    w->outstanding++;
    return 0;
}

static void cache_promo_done(void *arg, int rc)
{
    struct cache_promo *p = arg;
    struct cache *c = p->c;
    struct index_entry *e = p->e;
    struct kv_namespace *ns = p->ns;
    uint64_t bb = ns->layout.block_bytes;

    ns->reserved -= ns->reserved >= bb ? bb : ns->reserved;
    promo_tab_del(c, e);
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
        if (ns->purges > 0) {
            /* Purged since the start, before the scan got here: the copy is
             * from before the purge (a put since has its own entry, and its
             * own write): never indexed, never taken for the new block,
             * deleted when nothing of this run holds the key. */
            c->recovery_skipped++;
            if (!e && c->persist)
                cache_store_delete(c, ns, &f->key, &f->check, 1);
            continue;
        }
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
        e->arena = INDEX_NO_ARENA;
        e->persist = PERSIST_STORED;
        ns->stored++;
        c->ghosts++;
        c->recovered++;
    }
}
