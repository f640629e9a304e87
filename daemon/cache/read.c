/* cache read: MATCH and GET, answered at once or deferred while the store is
 * asked (see cache.h), and the key counters they keep. A GET's steps, in
 * order: look each key up, pin it or fetch it from the store (promote.c),
 * wait for the store (deferred.c), lend the read lease. Loop thread only. */
#include "cache/cache_internal.h"

#include <string.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "kvnode.h"

static void cache_count_keys(struct cache *c, size_t n, size_t m, const struct index_entry *e,
                             bool mismatch);

/* The lookups of a key list known up front (MATCH's scan, GET's walk) run
 * as the stages of index.h over batches of CACHE_LOOKUP_BATCH keys: every
 * key's hash and group line, then every key's entry, then the lookups.
 * Tight loops of prefetches put more of a batch's cache misses in flight at
 * once than one loop interleaving the stages some keys apart did (random
 * keys over 1 M entries: about 10 % less time per key); a walk that ends
 * early loaded at most one batch for nothing. Ask for keys in order (from
 * any key on); the index may change between the calls (what was loaded is
 * only a hint, the hashes stay valid). */
#define CACHE_LOOKUP_BATCH 64
struct cache_lookahead {
    struct kv_index *ix;
    uint32_t ns;
    const int64_t *keys;
    size_t n;
    size_t at, m;                           /* the batch loaded: keys at .. at + m - 1 */
    uint64_t hash[CACHE_LOOKUP_BATCH];      /* their hashes */
};
static void cache_lookahead_start(struct cache_lookahead *la, struct kv_index *ix, uint32_t ns,
                                  const int64_t *keys, size_t n);
/* Key i's entry as a request with `check` sees it, as cache_entry_for
 * (NULL: absent, or held under another word: then *mismatch is set). */
static struct index_entry *cache_lookahead_entry(struct cache_lookahead *la, size_t i, uint64_t check,
                                                 bool *mismatch);

/* --- get: look up, pin or fetch, wait, lend ------------------------------------ */

/* What the walk does with a key: pin it (in memory, readable), fetch it
 * from the store (unknown, a ghost, being promoted), or end the prefix. */
enum get_step { GET_PIN, GET_FETCH, GET_STOP };

static bool cache_get_first(struct cache *c, const struct cache_wait *w);
static enum get_step cache_get_look_up(struct cache_lookahead *la, const struct cache_wait *w, size_t i,
                                       struct index_entry **ep);
static int cache_get_pin(struct cache *c, struct cache_wait *w, size_t i, struct index_entry *e);
static int cache_get_lend_now(struct cache *c, struct cache_wait *w, struct cache_lent *out,
                              char *err, size_t errlen);
static void cache_get_lend(struct cache *c, struct cache_wait *w, struct cache_lent *out);

int cache_get_start(struct cache *c, const struct cache_read_req *req, struct cache_lent *out,
                    char *err, size_t errlen, struct cache_wait **wait)
{
    struct cache_wait tmp = { .c = c, .kind = WAIT_GET, .ns = req->ns, .keys = req->keys,
                              .checks = req->checks, .n = req->n, .owner = req->owner,
                              .may_wait = req->ready != NULL && c->persist != NULL,
                              /* HBM of a device that is down is served to no one. */
                              .readable = (req->readable | (1u << HOST_ARENA_ID)) & ~c->hbm_down_mask,
                              .ready = req->ready, .arg = req->arg };
    struct cache_wait *w = &tmp;
    int rc;

    out->lease_id = 0;
    out->n = 0;
    *wait = NULL;
    if (!cache_get_first(c, &tmp))
        return 0;
    rc = cache_check_lease_room(c, req->owner, err, errlen);
    if (rc < 0)
        return rc;
    cache_get_walk(c, &w);
    if (w->outstanding > 0) {
        /* Wait: ready() runs when the store is back (cache_get_finish then). */
        cache_wait_arm(c, w);
        *wait = w;
        return CACHE_WAITING;
    }
    return cache_get_lend_now(c, w, out, err, errlen);
}

/* Whether the first key lets the GET start: one held under another word,
 * being written, or not in memory with no way to fetch it answers with
 * nothing at once (counted). */
static bool cache_get_first(struct cache *c, const struct cache_wait *w)
{
    bool mismatch = false;
    struct index_entry *first =
        w->n ? cache_entry_for(c, w->ns->id, w->keys[0], cache_check_at(w->checks, 0), &mismatch)
             : NULL;

    if (w->n == 0 || mismatch || (first && first->state == ENTRY_WRITING) ||
        (!first && !(w->may_wait && cache_may_lookup(c))) ||
        (first && first->state != ENTRY_SEALED && !w->may_wait)) {
        cache_count_keys(c, w->n, 0, first, mismatch);
        return false;
    }
    return true;
}

int cache_check_lease_room(struct cache *c, struct lease_list *owner, char *err, size_t errlen)
{
    if (owner->count >= c->max_leases_per_client) {
        errmsg_set(err, errlen, "this connection already holds %zu leases (leases.max_per_client = %u);"
             " end some first", owner->count, c->max_leases_per_client);
        return -KVNODE_ELIMIT;
    }
    return 0;
}

/* Walk a GET's keys from w->next: look each up, pin what is in memory,
 * fetch what is not (a promotion is pinned while it runs; a lookup or read
 * of unknown keys stops the walk, whose completion walks on). Stops at the
 * first key it cannot serve. *wp may move to the heap. */
void cache_get_walk(struct cache *c, struct cache_wait **wp)
{
    struct cache_lookahead la;

    cache_lookahead_start(&la, c->index, (*wp)->ns->id, (*wp)->keys, (*wp)->n);
    while ((*wp)->next < (*wp)->n) {
        size_t i = (*wp)->next;
        struct index_entry *e;
        enum get_step step = cache_get_look_up(&la, *wp, i, &e);

        if (step == GET_STOP)
            break;
        if (step == GET_FETCH) {
            enum cache_fetch f = cache_fetch(c, wp, i, e);
            if (f == FETCH_ASKED)
                return;   /* the store's answer walks on */
            if (f != FETCH_COMING)
                break;
        }
        if (cache_get_pin(c, *wp, i, e) < 0)
            break;
    }
    (*wp)->next = (*wp)->n;   /* the walk is over */
}

/* Look up key i (the walk's next key): its entry (*ep; NULL: the index
 * does not know it) and what the walk does with it. */
static enum get_step cache_get_look_up(struct cache_lookahead *la, const struct cache_wait *w, size_t i,
                                       struct index_entry **ep)
{
    bool mismatch = false;
    struct index_entry *e = cache_lookahead_entry(la, i, cache_check_at(w->checks, i), &mismatch);

    *ep = e;
    /* Held under another word: the prefix ends (counted at the lend). */
    if (!e)
        return mismatch ? GET_STOP : GET_FETCH;
    if (e->state == ENTRY_WRITING)
        return GET_STOP;
    /* In memory the requester has not mapped (another GPU's HBM, or a real
     * GPU's for a CPU-only reader): the prefix ends here. */
    if (e->state == ENTRY_SEALED)
        return e->arena >= 32 || !(w->readable & (1u << e->arena)) ? GET_STOP : GET_PIN;
    return GET_FETCH;   /* a ghost, or being promoted */
}

/* Pin key i's entry under the GET's read lease (made at the first pin).
 * -KVNODE_ENOMEM (w->nomem) when the lease cannot be made. */
static int cache_get_pin(struct cache *c, struct cache_wait *w, size_t i, struct index_entry *e)
{
    if (!w->l) {
        w->l = lease_create(c->leases, LEASE_READ, w->ns->id, w->owner, clock_now_ms(),
                            w->owner && w->owner->ttl_ms ? w->owner->ttl_ms : c->read_ttl_ms, w->n);
        if (!w->l) {
            w->nomem = true;
            return -KVNODE_ENOMEM;
        }
        w->l->waiter = w->on_heap ? w : NULL;
    }
    cache_pin(c, e);
    w->l->entries[i] = e;
    w->next++;
    return 0;
}

/* The walk needed no store: lend now, or say a lease could not be made. */
static int cache_get_lend_now(struct cache *c, struct cache_wait *w, struct cache_lent *out,
                              char *err, size_t errlen)
{
    bool nomem = w->nomem && !w->l;

    cache_get_lend(c, w, out);
    if (w->on_heap)
        cache_wait_free(w);
    if (nomem) {
        errmsg_set(err, errlen, "out of memory creating a read lease");
        return -KVNODE_ENOMEM;
    }
    return 0;
}

void cache_get_finish(struct cache *c, struct cache_wait *w, struct cache_lent *out)
{
    cache_get_lend(c, w, out);
    cache_wait_cancel(c, w);
}

/* Lend: the ready prefix under the lease; the rest is let go. */
static void cache_get_lend(struct cache *c, struct cache_wait *w, struct cache_lent *out)
{
    struct lease *l = w->l;
    size_t m = 0;

    out->lease_id = 0;
    out->n = 0;
    if (l) {
        while (out->locs && m < w->n && l->entries[m] && l->entries[m]->state == ENTRY_SEALED)
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
        out->locs[i].arena = l->entries[i]->arena;
        out->locs[i].offset = l->entries[i]->offset;
        out->locs[i].present = true;
    }
    out->lease_id = l->id;
    out->n = m;
}

int cache_get_begin(struct cache *c, const struct cache_read_req *req, struct cache_lent *out,
                    char *err, size_t errlen)
{
    struct cache_read_req now = *req;
    struct cache_wait *w;

    now.ready = NULL;
    now.arg = NULL;
    return cache_get_start(c, &now, out, err, errlen, &w);
}

/* --- match -------------------------------------------------------------------- */

/* Where a scan of the prefix stopped: the entry that ended it (NULL: absent,
 * held under another check word (mismatch), or the end). */
struct match_end {
    struct index_entry *miss;
    bool mismatch;
    struct index_entry **found;   /* the prefix's entries (c->match_found), or NULL: look them up again */
};

static void cache_lookahead_start(struct cache_lookahead *la, struct kv_index *ix, uint32_t ns,
                                  const int64_t *keys, size_t n)
{
    la->ix = ix;
    la->ns = ns;
    la->keys = keys;
    la->n = n;
    la->at = la->m = 0;
}

static struct index_entry *cache_lookahead_entry(struct cache_lookahead *la, size_t i, uint64_t check,
                                                 bool *mismatch)
{
    if (i < la->at || i >= la->at + la->m) {   /* load the batch from key i */
        la->at = i;
        la->m = la->n - i < CACHE_LOOKUP_BATCH ? la->n - i : CACHE_LOOKUP_BATCH;
        for (size_t k = 0; k < la->m; k++) {
            la->hash[k] = index_key_hash(la->ix, la->ns, la->keys[i + k]);
            index_prefetch_bucket(la->ix, la->hash[k]);
        }
        for (size_t k = 0; k < la->m; k++)
            (void)index_prefetch_first(la->ix, la->hash[k]);
    }
    return cache_entry_checked(index_lookup_hashed(la->ix, la->ns, la->keys[i], la->hash[i - la->at]), check,
                               mismatch);
}

/* Key i's entry e (as the request sees it: cache_lookahead_entry) tallied;
 * false: the prefix ends before key i. */
static bool cache_match_take(size_t i, struct index_entry *e, struct cache_tiers *t, struct match_end *end)
{
    if (!e || e->state == ENTRY_WRITING) {
        end->miss = e;
        return false;
    }
    if (end->found)
        end->found[i] = e;
    if (e->state == ENTRY_SEALED) {
        if (e->tier == KVNODE_TIER_HBM)
            t->hbm++;
        else
            t->host++;
    } else {
        t->store++;
    }
    return true;
}

/* The prefix of r's keys held in some tier, tallied per tier. */
static size_t cache_match_scan(struct cache *c, const struct cache_read_req *r, struct cache_tiers *t,
                               struct match_end *end)
{
    struct cache_lookahead la;
    size_t i;
    memset(t, 0, sizeof *t);
    end->miss = NULL;
    end->mismatch = false;
    end->found = NULL;
    if (r->n <= c->match_found_cap) {
        end->found = c->match_found;
    } else {
        struct index_entry **f = realloc(c->match_found, r->n * sizeof *f);
        if (f) {
            c->match_found = end->found = f;
            c->match_found_cap = r->n;
        }
    }
    cache_lookahead_start(&la, c->index, r->ns->id, r->keys, r->n);
    for (i = 0; i < r->n; i++)
        if (!cache_match_take(i, cache_lookahead_entry(&la, i, cache_check_at(r->checks, i), &end->mismatch), t,
                              end))
            break;
    t->matched = i;
    return i;
}

/* The answer: the lookup counted, and the matched prefix, about to be read,
 * refreshed in the LRU tail-first (the entries the scan found, nothing
 * looked up again); a pinned block takes its new place when its pins drop.
 * Nothing between the scan and here frees an entry. */
static void cache_match_answer(struct cache *c, const struct cache_read_req *r, size_t m,
                               const struct match_end *end)
{
    cache_count_keys(c, r->n, m, end->miss, end->mismatch);
    index_lru_chain_begin(c->index);
    for (size_t j = m; j-- > 0;) {
        struct index_entry *e = end->found ? end->found[j] : index_lookup(c->index, r->ns->id, r->keys[j]);
        if (e && e->state == ENTRY_SEALED)
            index_lru_use(c->index, e);
    }
}

void cache_match_tiers(struct cache *c, struct kv_namespace *ns, const int64_t *keys, size_t n,
                       struct cache_tiers *out)
{
    struct cache_read_req r = { .ns = ns, .keys = keys, .n = n };
    struct match_end end;
    size_t m = cache_match_scan(c, &r, out, &end);
    cache_match_answer(c, &r, m, &end);
}

size_t cache_match(struct cache *c, struct kv_namespace *ns, const int64_t *keys, size_t n)
{
    struct cache_tiers t;
    cache_match_tiers(c, ns, keys, n, &t);
    return t.matched;
}

int cache_match_start(struct cache *c, const struct cache_read_req *req, struct cache_tiers *out,
                      struct cache_wait **wait)
{
    struct match_end end;
    size_t m = cache_match_scan(c, req, out, &end);

    *wait = NULL;
    /* A key the index holds under another word is not the store's to find;
     * one the store lacked a moment ago is not asked about again. */
    if (m < req->n && !end.miss && !end.mismatch && req->ready && cache_may_lookup(c) &&
        !cache_negative_hit(c, req->ns, req->keys[m], cache_check_at(req->checks, m))) {
        struct cache_wait tmp = { .c = c, .kind = WAIT_MATCH, .ns = req->ns, .keys = req->keys,
                                  .checks = req->checks, .n = req->n, .ready = req->ready,
                                  .arg = req->arg };
        struct cache_wait *w = cache_wait_heap(&tmp);
        if (w && cache_lookup_submit(c, w, m) == 0) {
            cache_wait_arm(c, w);
            *wait = w;
            return CACHE_WAITING;
        }
        if (w)
            cache_wait_free(w);
    }
    cache_match_answer(c, req, m, &end);
    return 0;
}

void cache_match_finish(struct cache *c, struct cache_wait *w, struct cache_tiers *out)
{
    struct cache_read_req r = { .ns = w->ns, .keys = w->keys, .checks = w->checks, .n = w->n };
    struct match_end end;
    size_t m = cache_match_scan(c, &r, out, &end);
    cache_match_answer(c, &r, m, &end);
    cache_wait_cancel(c, w);
}

/* --- match per key ------------------------------------------------------------- */

/* What a per-key scan saw of the keys it did not find, counted when it is
 * the answer; ask: the first key to ask the store about (n: none). */
struct each_misses {
    size_t absent, writing, mismatches, ask;
};

/* Every key of r looked up: present bits, tiers of the keys held, the
 * misses; may_ask: find the first key the store may hold (one the index
 * does not know, under no other word, not a recent store miss). */
static void cache_match_each_scan(struct cache *c, const struct cache_read_req *r,
                                  struct cache_tiers *t, uint8_t *present, bool may_ask,
                                  struct each_misses *miss)
{
    memset(t, 0, sizeof *t);
    memset(miss, 0, sizeof *miss);
    memset(present, 0, (r->n + 7) / 8);
    miss->ask = r->n;
    for (size_t i = 0; i < r->n; i++) {
        bool mismatch = false;
        uint64_t check = cache_check_at(r->checks, i);
        struct index_entry *e = cache_entry_for(c, r->ns->id, r->keys[i], check, &mismatch);
        if (!e || e->state == ENTRY_WRITING) {
            miss->mismatches += mismatch;
            miss->absent += !e;
            miss->writing += e != NULL;
            if (!e && !mismatch && may_ask && miss->ask == r->n &&
                !cache_negative_hit(c, r->ns, r->keys[i], check))
                miss->ask = i;
            continue;
        }
        present[i / 8] |= (uint8_t)(1u << (i % 8));
        t->matched++;
        if (e->state != ENTRY_SEALED)
            t->store++;
        else if (e->tier == KVNODE_TIER_HBM)
            t->hbm++;
        else
            t->host++;
    }
}

/* The answer: counted, and the blocks held in memory refreshed in the LRU
 * last key first, as a prefix MATCH does. */
static void cache_match_each_answer(struct cache *c, const struct cache_read_req *r,
                                    const struct cache_tiers *t, const uint8_t *present,
                                    const struct each_misses *miss)
{
    c->keys.matched += t->matched;
    c->keys.absent += miss->absent;
    c->keys.writing += miss->writing;
    c->keys.check_mismatches += miss->mismatches;
    index_lru_chain_begin(c->index);
    for (size_t j = r->n; j-- > 0;) {
        if (!(present[j / 8] & (1u << (j % 8))))
            continue;
        struct index_entry *e = index_lookup(c->index, r->ns->id, r->keys[j]);
        if (e && e->state == ENTRY_SEALED)
            index_lru_use(c->index, e);
    }
}

int cache_match_each_start(struct cache *c, const struct cache_read_req *req,
                           struct cache_tiers *out, uint8_t *present, struct cache_wait **wait)
{
    struct each_misses miss;
    bool may_ask = req->ready && cache_may_lookup(c);

    *wait = NULL;
    cache_match_each_scan(c, req, out, present, may_ask, &miss);
    if (miss.ask < req->n) {
        struct cache_wait tmp = { .c = c, .kind = WAIT_MATCH, .ns = req->ns, .keys = req->keys,
                                  .checks = req->checks, .n = req->n, .each = true,
                                  .ready = req->ready, .arg = req->arg };
        struct cache_wait *w = cache_wait_heap(&tmp);
        if (w && cache_lookup_submit(c, w, miss.ask) == 0) {
            cache_wait_arm(c, w);
            *wait = w;
            return CACHE_WAITING;
        }
        if (w)
            cache_wait_free(w);
    }
    cache_match_each_answer(c, req, out, present, &miss);
    return 0;
}

void cache_match_each_finish(struct cache *c, struct cache_wait *w, struct cache_tiers *out,
                             uint8_t *present)
{
    struct cache_read_req r = { .ns = w->ns, .keys = w->keys, .checks = w->checks, .n = w->n };
    struct each_misses miss;

    cache_match_each_scan(c, &r, out, present, false, &miss);
    cache_match_each_answer(c, &r, out, present, &miss);
    cache_wait_cancel(c, w);
}

/* --- any-key read (the KVS front end) ------------------------------------------ */

/* Store reads one best-effort read may start (the rest wait for the next). */
#define CACHE_EACH_PROMOTE_MAX 256

int cache_get_each(struct cache *c, const struct cache_read_req *req, struct cache_lent *out,
                   char *err, size_t errlen)
{
    struct kv_namespace *ns = req->ns;
    const int64_t *keys = req->keys;
    struct cache_loc *locs = out->locs;
    size_t n = req->n, hits = 0, promoted = 0;
    struct lease *l;
    int rc;

    out->lease_id = 0;
    out->n = 0;
    for (size_t i = 0; i < n; i++) {
        /* rtp-llm's v1 keys carry no check words (0): a block put with one
         * is another prefix's, a miss (counted). */
        bool mismatch = false;
        struct index_entry *e = cache_entry_for(c, ns->id, keys[i], cache_check_at(req->checks, i), &mismatch);
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
    rc = cache_check_lease_room(c, req->owner, err, errlen);
    if (rc < 0)
        return rc;
    l = lease_create(c->leases, LEASE_READ, ns->id, req->owner, clock_now_ms(),
                     req->owner->ttl_ms ? req->owner->ttl_ms : c->read_ttl_ms, n);
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
    out->lease_id = l->id;
    out->n = hits;
    return 0;
}

/* --- key counters ---------------------------------------------------------------- */

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
