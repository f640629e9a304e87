/* cache put: a PUT_BEGIN's reservations (skip the keys already held, check
 * the connection's limits, lend the write lease, reserve a slot per key:
 * tier choice, the namespace quota, room made by eviction), a commit's
 * sealing and giving reservations back (see cache.h). Loop thread only. */
#include "cache/cache_internal.h"

#include <inttypes.h>
#include <stdio.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "persist/persist.h"

/* One PUT_BEGIN under way: the request, its answer and what it holds. */
struct put_txn {
    struct cache *c;
    const struct cache_put_req *req;
    struct cache_loc *locs;     /* the answer, one per key */
    char *err;
    size_t errlen;
    struct arena *ha;           /* the HBM arena to try first, or NULL */
    uint32_t hcls;              /* the namespace's size class in ha */
    struct lease *l;            /* the write lease, once lent */
    size_t need;                /* keys to reserve (a repeated key counted each time) */
    size_t writing;             /* keys being written under a write lease */
    size_t reserved;            /* slots reserved so far */
};

/* One key's slot: where it was reserved. */
struct put_slot {
    bool hbm;
    uint64_t off;
};

static int cache_put_check_tier(const struct put_txn *t);
static void cache_put_choose_hbm(struct put_txn *t);
static void cache_put_skip_held(struct put_txn *t);
static int cache_put_check_limit(struct put_txn *t);
static int cache_put_lend_lease(struct put_txn *t);
static void cache_put_shield(struct put_txn *t, bool on);
static int cache_put_reserve(struct put_txn *t);
static int cache_put_give_back(struct put_txn *t, int rc);

int cache_put_begin(struct cache *c, const struct cache_put_req *req, uint64_t *lease_id,
                    struct cache_loc *locs, char *err, size_t errlen)
{
    struct put_txn t = { .c = c, .req = req, .locs = locs, .err = err, .errlen = errlen };
    int rc;

    *lease_id = 0;
    if ((rc = cache_put_check_tier(&t)) < 0)
        return rc;
    cache_put_choose_hbm(&t);
    cache_put_skip_held(&t);
    if (req->wait_writing && t.writing) {
        errmsg_set(err, errlen, "%zu of the objects of one namespace are being written under another create "
                   "lease (not sealed yet)", t.writing);
        return CACHE_STORE_BOUND;
    }
    /* Every key is held already: nothing to reserve, no lease. */
    if (t.need == 0)
        return 0;
    if ((rc = cache_check_lease_room(c, req->owner, err, errlen)) < 0 ||
        (rc = cache_put_check_limit(&t)) < 0 || (rc = cache_put_lend_lease(&t)) < 0)
        return rc;
    cache_put_shield(&t, true);
    if ((rc = cache_put_reserve(&t)) != 0)
        return cache_put_give_back(&t, rc);
    cache_put_shield(&t, false);
    *lease_id = t.l->id;
    cache_evict_maybe_schedule(c);
    cache_demote_maybe_schedule(c);
    return 0;
}

static int cache_put_check_tier(const struct put_txn *t)
{
    int tier = t->req->tier;
    if (tier != 0 && tier != KVNODE_TIER_HOST && tier != KVNODE_TIER_HBM) {
        errmsg_set(t->err, t->errlen, "unknown tier %d (expected %d host or %d hbm)", tier,
             KVNODE_TIER_HOST, KVNODE_TIER_HBM);
        return -KVNODE_EINVAL;
    }
    return 0;
}

/* HBM when asked for and the owner's device has an arena with a free slot
 * now (demotion keeps room there) and is not down; host memory otherwise. */
static void cache_put_choose_hbm(struct put_txn *t)
{
    struct cache *c = t->c;
    const struct lease_list *owner = t->req->owner;
    uint32_t hcls = 0;

    if (t->req->tier == KVNODE_TIER_HBM && owner->put_arena != HOST_ARENA_ID &&
        owner->put_arena < c->narenas && !(c->hbm_down_mask & (1u << owner->put_arena)) &&
        (hcls = t->req->ns->hbm_cls[owner->put_arena - 1]) != UINT32_MAX) {
        t->ha = c->arenas[owner->put_arena];
        t->hcls = hcls;
    }
}

/* Keys in memory or on their way in are "not present" (nothing to write);
 * the others (store-only ghosts included) are to be reserved. */
static void cache_put_skip_held(struct put_txn *t)
{
    const struct cache_put_req *req = t->req;

    for (size_t i = 0; i < req->n; i++) {
        struct index_entry *e = index_lookup(t->c->index, req->ns->id, req->keys[i]);
        t->writing += e && e->state == ENTRY_WRITING;
        /* Held under another check word (in memory or only in the store):
         * that prefix's block stays; this put reports it as stored, and
         * its writer's next get misses (counted). */
        if (e && e->check != cache_check_at(req->checks, i)) {
            t->c->keys.check_mismatches++;
            t->locs[i] = (struct cache_loc){ .present = false };
            continue;
        }
        t->locs[i].present = !e || e->state == ENTRY_GHOST;
        t->locs[i].arena = 0;
        t->locs[i].offset = 0;
        if (t->locs[i].present)
            t->need++;
    }
}

size_t cache_first_held(struct cache *c, const struct kv_namespace *ns, const int64_t *keys, const uint64_t *checks,
                        size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct index_entry *e = index_lookup(c->index, ns->id, keys[i]);
        if (e && e->check == (checks ? checks[i] : 0))
            return i;
    }
    return n;
}

/* Largest exact binary unit, as kvnode.conf writes sizes ("8MiB", "65537"). */
static void cache_format_size(uint64_t v, char *buf, size_t len)
{
    static const char *const names[] = { "EiB", "PiB", "TiB", "GiB", "MiB", "KiB" };
    for (int i = 0; i < 6; i++) {
        unsigned shift = 10u * (unsigned)(6 - i);
        if (v != 0 && v % ((uint64_t)1 << shift) == 0) {
            snprintf(buf, len, "%" PRIu64 "%s", v >> shift, names[i]);
            return;
        }
    }
    snprintf(buf, len, "%" PRIu64, v);
}

/* One connection may not reserve the tier away from everyone else
 * (leases.max_reserved_per_client). */
static int cache_put_check_limit(struct put_txn *t)
{
    struct cache *c = t->c;
    const struct lease_list *owner = t->req->owner;
    uint64_t bb = t->req->ns->layout.block_bytes, limit = cache_reserve_limit(c);
    char lim[32], held[32], option[NS_TENANT_MAX + 40];
    const char *tenant;

    if (owner->reserved_bytes + (uint64_t)t->need * bb <= limit)
        return 0;
    tenant = ns_registry_tenant(c->namespaces);
    cache_format_size(limit, lim, sizeof lim);
    cache_format_size(owner->reserved_bytes, held, sizeof held);
    if (*tenant)
        snprintf(option, sizeof option, "[tenant.%s] max_reserved_per_client", tenant);
    else
        snprintf(option, sizeof option, "leases.max_reserved_per_client");
    errmsg_set(t->err, t->errlen, "this connection would hold more than %s of uncommitted put "
               "reservations (%s = %.3g of the memory tiers): it holds "
               "%s and asks for %zu blocks of %" PRIu64 " bytes; commit or abort puts first, "
               "or put fewer blocks at once", lim, option, c->max_reserved_per_client, held, t->need,
               bb);
    c->reservations_refused++;
    return -KVNODE_ELIMIT;
}

/* The write lease that will hold the reserved entries (owner's TTL, else
 * [leases] write_ttl). */
static int cache_put_lend_lease(struct put_txn *t)
{
    struct cache *c = t->c;
    struct lease_list *owner = t->req->owner;

    t->l = lease_create(c->leases, LEASE_WRITE, t->req->ns->id, owner, clock_now_ms(),
                        owner->ttl_ms ? owner->ttl_ms : c->write_ttl_ms, t->req->n);
    if (!t->l) {
        errmsg_set(t->err, t->errlen, "out of memory creating a write lease");
        return -KVNODE_ENOMEM;
    }
    t->l->purges = t->req->ns->purges;
    return 0;
}

/* Keys a put reports as already stored are the prefix it extends: shield
 * them (a pin, as a reader's) from the evictions that make room for the
 * rest, and release them tail-first after, which refreshes them like a hit. */
static void cache_put_shield(struct put_txn *t, bool on)
{
    struct cache *c = t->c;
    const struct cache_put_req *req = t->req;

    if (!on)
        index_lru_chain_begin(c->index);
    for (size_t j = 0; j < req->n; j++) {
        size_t i = on ? j : req->n - 1 - j;
        if (t->locs[i].present)
            continue;
        /* Another word's block is not this put's prefix. */
        struct index_entry *e = cache_entry_for(c, req->ns->id, req->keys[i],
                                                cache_check_at(req->checks, i), NULL);
        if (!e || e->state != ENTRY_SEALED)
            continue;
        if (!on) {
            index_lru_use(c->index, e);
            cache_unpin(c, e);
        } else if (e->pins++ == 0)
            index_lru_remove(c->index, e);
    }
}

static int cache_put_overquota(struct put_txn *t);
static int cache_put_alloc_slot(struct put_txn *t, struct put_slot *s);
static int cache_put_claim_entry(struct put_txn *t, size_t i, struct index_entry *e,
                                 const struct put_slot *s);

/* A slot and a WRITING entry for every key still to write, in order. */
static int cache_put_reserve(struct put_txn *t)
{
    struct cache *c = t->c;
    struct kv_namespace *ns = t->req->ns;
    int rc;

    /* Under a quota, decide before evicting anything: a put that cannot fit
     * even after evicting every evictable block of its namespace must not
     * evict them. (need counts a key repeated within the request each time,
     * so this errs on the side of refusing.) */
    if (c->namespace_quota > 0 &&
        cache_quota_stuck(c, ns) + (uint64_t)t->need * ns->layout.block_bytes > c->namespace_quota)
        return cache_put_overquota(t);
    /* Host slots for the whole put at once, so they ascend (see
     * cache_make_room_for); HBM first, or room on its way: slot by slot. */
    if (!t->ha && !cache_populating(c))
        cache_make_room_for(c, ns->cls, t->need);
    for (size_t i = 0; i < t->req->n; i++) {
        struct index_entry *e;
        struct put_slot s;

        if (!t->locs[i].present)
            continue;
        e = index_lookup(c->index, ns->id, t->req->keys[i]);
        if (e && (e->state != ENTRY_GHOST || e->check != cache_check_at(t->req->checks, i))) {
            t->locs[i].present = false;  /* duplicate key earlier in this request */
            continue;
        }
        if (!cache_quota_room(c, ns))
            return cache_put_overquota(t);
        if ((rc = cache_put_alloc_slot(t, &s)) != 0 || (rc = cache_put_claim_entry(t, i, e, &s)) != 0)
            return rc;
    }
    return 0;
}

static int cache_put_populating(struct put_txn *t);
static int cache_put_nospace(struct put_txn *t);

/* A slot in HBM when chosen and free, else in host memory near the owner's
 * GPU, evicting for it; or the reason there is none. */
static int cache_put_alloc_slot(struct put_txn *t, struct put_slot *s)
{
    struct cache *c = t->c;
    const struct kv_namespace *ns = t->req->ns;
    uint32_t region = t->req->owner->host_region;

    s->hbm = t->ha && arena_alloc(t->ha, t->hcls, &s->off) == 0;
    /* Room is on its way: wait for it rather than evict. */
    if (!s->hbm && !arena_can_alloc(c->host, ns->cls) && cache_populating(c))
        return cache_put_populating(t);
    if (!s->hbm && (!cache_make_room(c, ns->cls) ||
                    arena_alloc_near(c->host, ns->cls, region ? region - 1 : ARENA_ANY_REGION,
                                     &s->off) < 0))
        return cache_put_nospace(t);
    if (t->req->tier == KVNODE_TIER_HBM) {
        if (s->hbm)
            c->hbm_reserved++;
        else
            c->hbm_fallbacks++;
    }
    return 0;
}

/* Key i's entry (a former ghost e, or a new one) becomes WRITING in slot s,
 * held by the lease; the answer points at the slot. */
static int cache_put_claim_entry(struct put_txn *t, size_t i, struct index_entry *e,
                                 const struct put_slot *s)
{
    struct cache *c = t->c;
    struct kv_namespace *ns = t->req->ns;

    if (e) {
        /* A ghost: the store holds the block; the put brings it back
         * into memory without writing it to the store again. */
        ns->stored -= ns->stored > 0 ? 1 : 0;
        c->ghosts -= c->ghosts > 0 ? 1 : 0;
    } else {
        e = index_insert(c->index, ns->id, t->req->keys[i]);
        if (!e) {
            arena_free(s->hbm ? t->ha : c->host, s->off);
            errmsg_set(t->err, t->errlen, "out of memory indexing block %zu", i);
            return -KVNODE_ENOMEM;
        }
        e->persist = PERSIST_NONE;
        e->check = cache_check_at(t->req->checks, i);
        /* Another node's miss cached here must not hide our own block
         * once this put ends (aborted: the next MATCH asks again). */
        cache_negative_forget(c, ns, t->req->keys[i], e->check);
    }
    e->state = ENTRY_WRITING;
    e->tier = s->hbm ? KVNODE_TIER_HBM : KVNODE_TIER_HOST;
    e->arena = s->hbm ? arena_id(t->ha) : arena_id(c->host);
    e->cls = s->hbm ? t->hcls : ns->cls;
    e->offset = s->off;
    t->l->entries[i] = e;
    t->locs[i].arena = e->arena;
    t->locs[i].offset = s->off;
    ns->reserved += ns->layout.block_bytes;
    t->req->owner->reserved_bytes += ns->layout.block_bytes;
    t->reserved++;
    return 0;
}

/* The namespace is at memory.namespace_quota. Normally refused before
 * anything was reserved; if it happens midway, leave this put's own
 * reservations out of the numbers. */
static int cache_put_overquota(struct put_txn *t)
{
    struct cache *c = t->c;
    const struct kv_namespace *ns = t->req->ns;
    char quota[32], held[32], stuck[32], block[32];
    uint64_t bb = ns->layout.block_bytes, mine = (uint64_t)t->reserved * bb;

    cache_format_size(c->namespace_quota, quota, sizeof quota);
    cache_format_size(ns->bytes + ns->reserved - mine, held, sizeof held);
    cache_format_size(cache_quota_stuck(c, t->req->ns) - mine, stuck, sizeof stuck);
    cache_format_size(bb, block, sizeof block);
    if ((uint64_t)t->need * bb > c->namespace_quota)
        errmsg_set(t->err, t->errlen, "namespace %s (rank %u) is at its quota: %zu blocks of %s do "
             "not fit in memory.namespace_quota = %s; put fewer blocks at once or raise the quota",
             ns->deployment_id, ns->layout.tp_rank, t->need, block, quota);
    else
        errmsg_set(t->err, t->errlen, "namespace %s (rank %u) is at its quota: "
             "memory.namespace_quota = %s, %s held (%s pinned or reserved); cannot reserve %zu "
             "blocks of %s until its leases end",
             ns->deployment_id, ns->layout.tp_rank, quota, held, stuck, t->need, block);
    return -KVNODE_ENOSPC;
}

/* The host arena is still being reserved at start-up and its reserved part
 * is full: the put may wait for it to grow. */
static int cache_put_populating(struct put_txn *t)
{
    struct arena_stats st;

    arena_get_stats(t->c->host, &st);
    errmsg_set(t->err, t->errlen, "host tier still being reserved at start-up: %" PRIu64 " of %"
               PRIu64 " bytes so far, %" PRIu64 " in use; cannot reserve %zu blocks of %"
               PRIu64 " bytes yet", st.reserved_bytes, st.capacity, st.used_bytes, t->need,
               t->req->ns->layout.block_bytes);
    return CACHE_STORE_BOUND;
}

/* No host slot could be made: the store is the bottleneck when blocks
 * waiting for their writes hold the memory (the put may wait), else the
 * tier is full. */
static int cache_put_nospace(struct put_txn *t)
{
    struct cache *c = t->c;
    struct arena_stats st;

    arena_get_stats(c->host, &st);
    if (cache_persisting(c) && c->writing_bytes > 0) {
        errmsg_set(t->err, t->errlen, "host tier full: %" PRIu64 " of %" PRIu64 " bytes are blocks "
                   "not yet written to the %s store (%zu writes waiting for its queue); "
                   "the store is the bottleneck", c->writing_bytes, st.capacity,
                   persist_backend_name(c->persist), c->queued_ops);
        return CACHE_STORE_BOUND;
    }
    errmsg_set(t->err, t->errlen, "host tier full: cannot reserve %zu blocks of %" PRIu64 " bytes "
         "(%" PRIu64 " of %" PRIu64 " bytes in use, the rest pinned by readers, "
         "reserved by writers or being written to the persistent store)", t->need,
         t->req->ns->layout.block_bytes, st.used_bytes, st.capacity);
    return -KVNODE_ENOSPC;
}

/* A put that failed midway gives back every slot it reserved, its shield
 * and its lease; rc is its answer. */
static int cache_put_give_back(struct put_txn *t, int rc)
{
    for (size_t i = 0; i < t->req->n; i++) {
        struct index_entry *e = t->l->entries[i];
        if (e)
            cache_unreserve(t->c, t->req->ns, t->req->owner, e);
    }
    cache_put_shield(t, false);
    lease_destroy(t->c->leases, t->l);
    return rc;
}

/* --- commit and abort --------------------------------------------------------- */

/* PUT_COMMIT (cache_lease_finish): each entry of l is SEALED — visible from
 * now on —, refreshed last key first, counted in its namespace, reported to
 * the completeness observer and, under write_through, queued for the store
 * (pinned until the commit's writes have all landed). The count. */
uint32_t cache_put_seal(struct cache *c, struct lease *l)
{
    uint64_t bytes = cache_ns_block_bytes(c, l->ns);
    struct kv_namespace *ns = ns_get(c->namespaces, l->ns);
    bool write_through = c->persist && c->policy == CONFIG_POLICY_WRITE_THROUGH;
    struct cache_write_group *g = write_through ? cache_write_group_new(l->n) : NULL;
    uint32_t count = 0;

    /* Its deployment was purged since the put began: the blocks are part of
     * what was purged, and never become visible. */
    if (ns && l->purges != ns->purges) {
        cache_put_unreserve_all(c, l);
        free(g);
        return 0;
    }
    index_lru_chain_begin(c->index);
    for (size_t i = l->n; i-- > 0;) {
        struct index_entry *e = l->entries[i];
        if (!e)
            continue;
        e->state = ENTRY_SEALED;
        index_lru_touch(c->index, e);
        if (ns) {
            ns->blocks++;
            ns->bytes += bytes;
        }
        cache_reservation_end(ns, l->owner);
        c->sealed_total++;
        count++;
        cache_note_sealed(c, e);
        /* write_through: pinned until its write lands (see cache.h), and
         * until the commit's other writes have landed too. */
        if (write_through && e->persist == PERSIST_NONE) {
            if (g)
                cache_write_group_add(c, g, e);
            else
                cache_write_start(c, e, false);
        }
    }
    if (g)
        cache_write_group_done(c, g);   /* the commit's own reference */
    return count;
}

/* PUT_ABORT, a closing connection or the reaper (cache_lease_finish): every
 * slot of l given back. The count. */
uint32_t cache_put_unreserve_all(struct cache *c, struct lease *l)
{
    struct kv_namespace *ns = ns_get(c->namespaces, l->ns);
    uint32_t count = 0;

    for (size_t i = 0; i < l->n; i++) {
        struct index_entry *e = l->entries[i];
        if (!e)
            continue;
        cache_unreserve(c, ns, l->owner, e);
        count++;
    }
    return count;
}

/* A reserved slot stops being a reservation (committed or given back): both
 * its namespace's and its connection's counts go down. */
void cache_reservation_end(struct kv_namespace *ns, struct lease_list *owner)
{
    uint64_t bytes = ns ? ns->layout.block_bytes : 0;
    if (ns)
        ns->reserved -= ns->reserved >= bytes ? bytes : ns->reserved;
    if (owner)
        owner->reserved_bytes -= owner->reserved_bytes >= bytes ? bytes : owner->reserved_bytes;
}

/* Give back a WRITING entry's slot: a former ghost becomes a ghost again,
 * anything else leaves the index. */
void cache_unreserve(struct cache *c, struct kv_namespace *ns, struct lease_list *owner,
                     struct index_entry *e)
{
    cache_reservation_end(ns, owner);
    if (e->persist == PERSIST_STORED && !e->detached) {
        cache_slot_free(c, e);
        e->state = ENTRY_GHOST;
        if (ns)
            ns->stored++;
        c->ghosts++;
        return;
    }
    index_unlink(c->index, e);
    cache_entry_destroy(c, e);
}
