/* cache read: match and get, answered at once or deferred while the store is
 * asked (see cache.h), and the key counters they keep. Loop thread only. */
#include "cache/cache_internal.h"

#include <string.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "kvnode.h"

/* --- match -------------------------------------------------------------------- */

/* Count a lookup of n keys that matched the first m; the first miss (if
 * any) was entry e (NULL: absent, or held under another check word:
 * mismatch), the keys after it were not looked at. */
static void cache_count_keys(struct cache *c, size_t n, size_t m, const struct index_entry *e,
                             bool mismatch)
{
    c->keys.matched += m;
    if (m == n)
        return;
    c->keys.check_mismatches += mismatch;
    if (!e)
        c->keys.absent++;
    else if (e->state == ENTRY_WRITING)
        c->keys.writing++;
    else
        c->keys.unavailable++;
    c->keys.beyond_gap += n - m - 1;
}

void cache_key_metrics(const struct cache *c, struct metrics_keys *out)
{
    *out = c->keys;
}

/* The prefix held in some tier, tallied per tier; *miss = the entry that
 * ended it (NULL: absent, held under another check word (*mismatch), or
 * the end). */
static size_t cache_match_scan(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                               const uint64_t *checks, size_t n, struct cache_tiers *t,
                               struct index_entry **miss, bool *mismatch)
{
    size_t i;
    memset(t, 0, sizeof *t);
    *miss = NULL;
    *mismatch = false;
    for (i = 0; i < n; i++) {
        struct index_entry *e = cache_entry_for(c, ns->id, keys[i], cache_check_at(checks, i),
                                                mismatch);
        if (!e || e->state == ENTRY_WRITING) {
            *miss = e;
            break;
        }
        if (e->state == ENTRY_SEALED) {
            if (e->tier == KVNODE_TIER_HBM)
                t->hbm++;
            else
                t->host++;
        } else {
            t->store++;
        }
    }
    t->matched = i;
    return i;
}

/* A matched prefix is about to be read: refresh what of it is in memory,
 * tail-first (the lookups hit the lines the scan just loaded); a pinned
 * block takes its new place when its pins drop. */
static void cache_match_touch(struct cache *c, struct kv_namespace *ns, const int64_t *keys, size_t m)
{
    for (size_t j = m; j-- > 0;) {
        struct index_entry *e = index_lookup(c->index, ns->id, keys[j]);
        if (e && e->state == ENTRY_SEALED)
            index_lru_use(c->index, e);
    }
}

void cache_match_tiers(struct cache *c, struct kv_namespace *ns, const int64_t *keys, size_t n,
                       struct cache_tiers *out)
{
    struct index_entry *miss;
    bool mismatch;
    size_t m = cache_match_scan(c, ns, keys, NULL, n, out, &miss, &mismatch);
    cache_count_keys(c, n, m, miss, mismatch);
    cache_match_touch(c, ns, keys, m);
}

size_t cache_match(struct cache *c, struct kv_namespace *ns, const int64_t *keys, size_t n)
{
    struct cache_tiers t;
    cache_match_tiers(c, ns, keys, n, &t);
    return t.matched;
}

int cache_match_start(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                      const uint64_t *checks, size_t n, struct cache_tiers *out,
                      cache_ready_fn ready, void *arg, struct cache_wait **wait)
{
    struct index_entry *miss;
    bool mismatch;
    size_t m = cache_match_scan(c, ns, keys, checks, n, out, &miss, &mismatch);

    *wait = NULL;
    /* A key the index holds under another word is not the store's to find;
     * one the store lacked a moment ago is not asked about again. */
    if (m < n && !miss && !mismatch && ready && cache_may_lookup(c) &&
        !cache_negative_hit(c, ns, keys[m], cache_check_at(checks, m))) {
        struct cache_wait tmp = { .c = c, .kind = WAIT_MATCH, .ns = ns, .keys = keys,
                                  .checks = checks, .n = n, .ready = ready, .arg = arg };
        struct cache_wait *w = cache_wait_heap(&tmp);
        if (w && cache_lookup_submit(c, w, m) == 0) {
            cache_wait_arm(c, w);
            *wait = w;
            return CACHE_WAITING;
        }
        if (w)
            cache_wait_free(w);
    }
    cache_count_keys(c, n, m, miss, mismatch);
    cache_match_touch(c, ns, keys, m);
    return 0;
}

void cache_match_finish(struct cache *c, struct cache_wait *w, struct cache_tiers *out)
{
    struct index_entry *miss;
    bool mismatch;
    size_t m = cache_match_scan(c, w->ns, w->keys, w->checks, w->n, out, &miss, &mismatch);
    cache_count_keys(c, w->n, m, miss, mismatch);
    cache_match_touch(c, w->ns, w->keys, m);
    cache_wait_cancel(c, w);
}

/* --- get ---------------------------------------------------------------------- */

int cache_check_lease_room(struct cache *c, struct lease_list *owner, char *err, size_t errlen)
{
    if (owner->count >= c->max_leases_per_client) {
        errmsg_set(err, errlen, "this connection already holds %zu leases (leases.max_per_client = %u);"
             " end some first", owner->count, c->max_leases_per_client);
        return -KVNODE_ELIMIT;
    }
    return 0;
}

/* Walk a GET's keys from w->next, pinning what is in memory and starting
 * promotions of ghosts (and a lookup of unknown keys) when the wait may
 * wait. Stops at the first key it cannot serve. *wp may move to the heap. */
void cache_get_walk(struct cache *c, struct cache_wait **wp)
{
    struct cache_wait *w = *wp;

    while (w->next < w->n) {
        size_t i = w->next;
        bool mismatch = false;
        struct index_entry *e = cache_entry_for(c, w->ns->id, w->keys[i],
                                                cache_check_at(w->checks, i), &mismatch);

        if (!e) {
            /* Held under another word: the prefix ends (counted at the fill). */
            if (mismatch)
                break;
            if (w->may_wait && !w->looked_up && cache_may_lookup(c) &&
                !cache_negative_hit(c, w->ns, w->keys[i], cache_check_at(w->checks, i))) {
                struct cache_wait *h = cache_wait_heap(w);
                if (h) {
                    *wp = w = h;
                    /* A store whose reads say "absent" reads them at once
                     * (no lookup round trip first), into free memory; what
                     * that leaves (no free slot) is looked up. */
                    if (!w->probed && cache_reads_find(c) && cache_probe_submit(c, w, i) == 0)
                        return;   /* cache_probe_done walks on */
                    if (cache_lookup_submit(c, w, i) == 0)
                        return;   /* cache_lookup_done walks on */
                }
            }
            break;
        }
        if (e->state == ENTRY_WRITING)
            break;
        /* In memory the requester has not mapped (another GPU's HBM, or a
         * real GPU's for a CPU-only reader): the prefix ends here. */
        if (e->state == ENTRY_SEALED && (e->arena >= 32 || !(w->readable & (1u << e->arena))))
            break;
        if (e->state == ENTRY_GHOST || e->state == ENTRY_PROMOTING) {
            struct cache_wait *h;
            if (!w->may_wait || !(h = cache_wait_heap(w)))
                break;
            *wp = w = h;
            if (e->state == ENTRY_GHOST && cache_promote(c, w->ns, e) < 0)
                break;
            if (cache_promo_wait(w, e) < 0)
                break;
        }
        if (!w->l) {
            w->l = lease_create(c->leases, LEASE_READ, w->ns->id, w->owner, clock_now_ms(),
                                w->owner && w->owner->ttl_ms ? w->owner->ttl_ms : c->read_ttl_ms, w->n);
            if (!w->l) {
                w->nomem = true;
                break;
            }
            w->l->waiter = w->on_heap ? w : NULL;
        }
        cache_pin(c, e);
        w->l->entries[i] = e;
        w->next++;
    }
    w->next = w->n;   /* the walk is over */
}

/* The answer: the ready prefix under the lease; the rest is let go. */
static void cache_get_fill(struct cache *c, struct cache_wait *w, uint64_t *lease_id,
                           struct cache_loc *locs, size_t *got)
{
    struct lease *l = w->l;
    size_t m = 0;

    *lease_id = 0;
    *got = 0;
    if (l) {
        while (locs && m < w->n && l->entries[m] && l->entries[m]->state == ENTRY_SEALED)
            m++;
        for (size_t i = w->n; i-- > m;) {
            if (l->entries[i]) {
                cache_unpin(c, l->entries[i]);
                l->entries[i] = NULL;
            }
        }
    }
    bool mismatch = false;
    const struct index_entry *miss =
        m < w->n ? cache_entry_for(c, w->ns->id, w->keys[m], cache_check_at(w->checks, m), &mismatch)
                 : NULL;
    cache_count_keys(c, w->n, m, miss, mismatch);
    if (!l)
        return;
    l->waiter = NULL;
    w->l = NULL;
    if (m == 0) {
        lease_destroy(c->leases, l);
        return;
    }
    for (size_t i = 0; i < m; i++) {
        locs[i].arena = l->entries[i]->arena;
        locs[i].offset = l->entries[i]->offset;
        locs[i].present = true;
    }
    *lease_id = l->id;
    *got = m;
}

int cache_get_start(struct cache *c, struct kv_namespace *ns, struct lease_list *owner, uint32_t readable,
                    const int64_t *keys, const uint64_t *checks, size_t n, uint64_t *lease_id,
                    struct cache_loc *locs, size_t *got, char *err, size_t errlen,
                    cache_ready_fn ready, void *arg, struct cache_wait **wait)
{
    struct cache_wait tmp = { .c = c, .kind = WAIT_GET, .ns = ns, .keys = keys,
                              .checks = checks, .n = n,
                              .owner = owner, .may_wait = ready != NULL && c->persist != NULL,
                              /* HBM of a device that is down is served to no one. */
                              .readable = (readable | (1u << HOST_ARENA_ID)) & ~c->hbm_down_mask,
                              .ready = ready, .arg = arg };
    struct cache_wait *w = &tmp;
    struct index_entry *first;
    bool mismatch = false;
    int rc;

    *lease_id = 0;
    *got = 0;
    *wait = NULL;
    first = n ? cache_entry_for(c, ns->id, keys[0], cache_check_at(checks, 0), &mismatch) : NULL;
    if (n == 0 || mismatch || (first && first->state == ENTRY_WRITING) ||
        (!first && !(tmp.may_wait && cache_may_lookup(c))) ||
        (first && first->state != ENTRY_SEALED && !tmp.may_wait)) {
        cache_count_keys(c, n, 0, first, mismatch);
        return 0;
    }
    rc = cache_check_lease_room(c, owner, err, errlen);
    if (rc < 0)
        return rc;
    cache_get_walk(c, &w);
    if (w->outstanding > 0) {
        cache_wait_arm(c, w);
        *wait = w;
        return CACHE_WAITING;
    }
    bool nomem = w->nomem && !w->l;
    cache_get_fill(c, w, lease_id, locs, got);
    if (w->on_heap)
        cache_wait_free(w);
    if (nomem) {
        errmsg_set(err, errlen, "out of memory creating a read lease");
        return -KVNODE_ENOMEM;
    }
    return 0;
}

void cache_get_finish(struct cache *c, struct cache_wait *w, uint64_t *lease_id,
                      struct cache_loc *locs, size_t *got)
{
    cache_get_fill(c, w, lease_id, locs, got);
    cache_wait_cancel(c, w);
}

int cache_get_begin(struct cache *c, struct kv_namespace *ns, struct lease_list *owner,
                    const int64_t *keys, size_t n, uint64_t *lease_id,
                    struct cache_loc *locs, size_t *got, char *err, size_t errlen)
{
    struct cache_wait *w;
    return cache_get_start(c, ns, owner, owner->mapped, keys, NULL, n, lease_id, locs, got, err,
                           errlen, NULL, NULL, &w);
}

/* --- any-key read (the KVS front end) ------------------------------------------ */

/* Store reads one best-effort read may start (the rest wait for the next). */
#define CACHE_EACH_PROMOTE_MAX 256

int cache_get_each(struct cache *c, struct kv_namespace *ns, struct lease_list *owner,
                   const int64_t *keys, size_t n, uint64_t *lease_id, struct cache_loc *locs,
                   size_t *got, char *err, size_t errlen)
{
    size_t hits = 0, promoted = 0;
    struct lease *l;
    int rc;

    *lease_id = 0;
    *got = 0;
    for (size_t i = 0; i < n; i++) {
        /* rtp-llm sends no check words: a block put with one is another
         * prefix's, a miss (counted). */
        bool mismatch = false;
        struct index_entry *e = cache_entry_for(c, ns->id, keys[i], 0, &mismatch);
        c->keys.check_mismatches += mismatch;
        /* Only sealed blocks in the host arena: that is the memory lent. */
        locs[i].present = e && e->state == ENTRY_SEALED && e->arena == HOST_ARENA_ID;
        locs[i].arena = 0;
        locs[i].offset = 0;
        if (locs[i].present)
            hits++;
        else if (!e)
            c->keys.absent++;
        else if (e->state == ENTRY_GHOST && c->persist && ns->cls != UINT32_MAX && promoted < CACHE_EACH_PROMOTE_MAX &&
                 cache_promote(c, ns, e) == 0)
            promoted++;   /* only in the store: on its way back for the next read */
        else if (e->state == ENTRY_WRITING)
            c->keys.writing++;
        else
            c->keys.unavailable++;
    }
    if (hits == 0)
        return 0;
    rc = cache_check_lease_room(c, owner, err, errlen);
    if (rc < 0)
        return rc;
    l = lease_create(c->leases, LEASE_READ, ns->id, owner, clock_now_ms(),
                     owner->ttl_ms ? owner->ttl_ms : c->read_ttl_ms, n);
    if (!l) {
        errmsg_set(err, errlen, "out of memory creating a read lease");
        return -KVNODE_ENOMEM;
    }
    /* Pinned last to first: the LRU refresh is tail-first, as for get. */
    for (size_t i = n; i-- > 0;) {
        if (!locs[i].present)
            continue;
        struct index_entry *e = index_lookup(c->index, ns->id, keys[i]);
        cache_pin(c, e);
        l->entries[i] = e;
        locs[i].offset = e->offset;
    }
    c->keys.matched += hits;
    *lease_id = l->id;
    *got = hits;
    return 0;
}
