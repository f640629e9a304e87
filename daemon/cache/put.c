/* cache put: put reservations (tier choice, the per-connection and
 * namespace-quota limits, room made by eviction) and giving reservations
 * back (see cache.h). Loop thread only. */
#include "cache/cache_internal.h"

#include <inttypes.h>
#include <stdio.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "persist/persist.h"

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

/* Keys a put reports as already stored are the prefix it extends: shield
 * them (a pin, as a reader's) from the evictions that make room for the
 * rest, and release them tail-first after, which refreshes them like a hit. */
static void cache_put_shield(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                             const uint64_t *checks, size_t n, const struct cache_loc *locs, bool on)
{
    for (size_t j = 0; j < n; j++) {
        size_t i = on ? j : n - 1 - j;
        if (locs[i].present)
            continue;
        /* Another word's block is not this put's prefix. */
        struct index_entry *e = cache_entry_for(c, ns->id, keys[i], cache_check_at(checks, i), NULL);
        if (!e || e->state != ENTRY_SEALED)
            continue;
        if (!on) {
            index_lru_use(c->index, e);
            cache_unpin(c, e);
        } else if (e->pins++ == 0)
            index_lru_remove(c->index, e);
    }
}

int cache_put_begin(struct cache *c, struct kv_namespace *ns, struct lease_list *owner,
                    const int64_t *keys, const uint64_t *checks, size_t n, int tier,
                    uint64_t *lease_id, struct cache_loc *locs, char *err, size_t errlen)
{
    size_t need = 0, reserved = 0;
    struct lease *l;
    int rc;

    *lease_id = 0;
    if (tier != 0 && tier != KVNODE_TIER_HOST && tier != KVNODE_TIER_HBM) {
        errmsg_set(err, errlen, "unknown tier %d (expected %d host or %d hbm)", tier,
             KVNODE_TIER_HOST, KVNODE_TIER_HBM);
        return -KVNODE_EINVAL;
    }
    /* HBM when asked for and the owner's device has an arena with a free
     * slot now (demotion keeps room there) and is not down; host memory
     * otherwise. */
    struct arena *ha = NULL;
    uint32_t hcls = 0;
    if (tier == KVNODE_TIER_HBM && owner->put_arena != HOST_ARENA_ID &&
        owner->put_arena < c->narenas && !(c->hbm_down_mask & (1u << owner->put_arena)) &&
        (hcls = ns->hbm_cls[owner->put_arena - 1]) != UINT32_MAX)
        ha = c->arenas[owner->put_arena];
    for (size_t i = 0; i < n; i++) {
        struct index_entry *e = index_lookup(c->index, ns->id, keys[i]);
        /* Held under another check word (in memory or only in the store):
         * that prefix's block stays; this put reports it as stored, and
         * its writer's next get misses (counted). */
        if (e && e->check != cache_check_at(checks, i)) {
            c->keys.check_mismatches++;
            locs[i] = (struct cache_loc){ .present = false };
            continue;
        }
        locs[i].present = !e || e->state == ENTRY_GHOST;
        locs[i].arena = 0;
        locs[i].offset = 0;
        if (locs[i].present)
            need++;
    }
    /* A key repeated within the request is reserved once. */
    if (need == 0)
        return 0;
    rc = cache_check_lease_room(c, owner, err, errlen);
    if (rc < 0)
        return rc;
    /* One connection may not reserve the tier away from everyone else. */
    uint64_t limit = cache_reserve_limit(c);
    uint64_t want = (uint64_t)need * ns->layout.block_bytes;
    if (owner->reserved_bytes + want > limit) {
        char lim[32], held[32], option[NS_TENANT_MAX + 40];
        const char *tenant = ns_registry_tenant(c->namespaces);
        cache_format_size(limit, lim, sizeof lim);
        cache_format_size(owner->reserved_bytes, held, sizeof held);
        if (*tenant)
            snprintf(option, sizeof option, "[tenant.%s] max_reserved_per_client", tenant);
        else
            snprintf(option, sizeof option, "leases.max_reserved_per_client");
        errmsg_set(err, errlen, "this connection would hold more than %s of uncommitted put "
                   "reservations (%s = %.3g of the memory tiers): it holds "
                   "%s and asks for %zu blocks of %" PRIu64 " bytes; commit or abort puts first, "
                   "or put fewer blocks at once", lim, option, c->max_reserved_per_client, held, need,
                   ns->layout.block_bytes);
        c->reservations_refused++;
        return -KVNODE_ELIMIT;
    }
    l = lease_create(c->leases, LEASE_WRITE, ns->id, owner, clock_now_ms(),
                     owner->ttl_ms ? owner->ttl_ms : c->write_ttl_ms, n);
    if (!l) {
        errmsg_set(err, errlen, "out of memory creating a write lease");
        return -KVNODE_ENOMEM;
    }
    cache_put_shield(c, ns, keys, checks, n, locs, true);
    /* Under a quota, decide before evicting anything: a put that cannot fit
     * even after evicting every evictable block of its namespace must not
     * evict them. (need counts a key repeated within the request each time,
     * so this errs on the side of refusing.) */
    if (c->namespace_quota > 0 &&
        cache_quota_stuck(c, ns) + (uint64_t)need * ns->layout.block_bytes > c->namespace_quota)
        goto overquota;
    for (size_t i = 0; i < n; i++) {
        struct index_entry *e;
        uint64_t off;

        if (!locs[i].present)
            continue;
        e = index_lookup(c->index, ns->id, keys[i]);
        if (e && (e->state != ENTRY_GHOST || e->check != cache_check_at(checks, i))) {
            locs[i].present = false;  /* duplicate key earlier in this request */
            continue;
        }
        if (!cache_quota_room(c, ns))
            goto overquota;
        bool in_hbm = ha && arena_alloc(ha, hcls, &off) == 0;
        /* Room is on its way: wait for it rather than evict. */
        if (!in_hbm && !arena_can_alloc(c->host, ns->cls) && cache_populating(c))
            goto populating;
        if (!in_hbm && (!cache_make_room(c, ns->cls) ||
                        arena_alloc_near(c->host, ns->cls, owner->host_region ? owner->host_region - 1
                                                                              : ARENA_ANY_REGION, &off) < 0))
            goto nospace;
        if (tier == KVNODE_TIER_HBM) {
            if (in_hbm)
                c->hbm_reserved++;
            else
                c->hbm_fallbacks++;
        }
        if (e) {
            /* A ghost: the store holds the block; the put brings it back
             * into memory without writing it to the store again. */
            ns->stored -= ns->stored > 0 ? 1 : 0;
            c->ghosts -= c->ghosts > 0 ? 1 : 0;
        } else {
            e = index_insert(c->index, ns->id, keys[i]);
            if (!e) {
                arena_free(in_hbm ? ha : c->host, off);
                errmsg_set(err, errlen, "out of memory indexing block %zu", i);
                rc = -KVNODE_ENOMEM;
                goto undo;
            }
            e->persist = PERSIST_NONE;
            e->check = cache_check_at(checks, i);
            /* Another node's miss cached here must not hide our own block
             * once this put ends (aborted: the next MATCH asks again). */
            cache_negative_forget(c, ns, keys[i], e->check);
        }
        e->state = ENTRY_WRITING;
        e->tier = in_hbm ? KVNODE_TIER_HBM : KVNODE_TIER_HOST;
        e->arena = in_hbm ? arena_id(ha) : arena_id(c->host);
        e->cls = in_hbm ? hcls : ns->cls;
        e->offset = off;
        l->entries[i] = e;
        locs[i].arena = e->arena;
        locs[i].offset = off;
        ns->reserved += ns->layout.block_bytes;
        owner->reserved_bytes += ns->layout.block_bytes;
        reserved++;
    }
    cache_put_shield(c, ns, keys, checks, n, locs, false);
    *lease_id = l->id;
    cache_evict_maybe_schedule(c);
    cache_demote_maybe_schedule(c);
    return 0;

overquota: {
        /* Normally refused before anything was reserved; if it happens
         * midway, leave this put's own reservations out of the numbers. */
        char quota[32], held[32], stuck[32], block[32];
        uint64_t bb = ns->layout.block_bytes, mine = (uint64_t)reserved * bb;
        cache_format_size(c->namespace_quota, quota, sizeof quota);
        cache_format_size(ns->bytes + ns->reserved - mine, held, sizeof held);
        cache_format_size(cache_quota_stuck(c, ns) - mine, stuck, sizeof stuck);
        cache_format_size(bb, block, sizeof block);
        if ((uint64_t)need * bb > c->namespace_quota)
            errmsg_set(err, errlen, "namespace %s (rank %u) is at its quota: %zu blocks of %s do not fit "
                 "in memory.namespace_quota = %s; put fewer blocks at once or raise the quota",
                 ns->deployment_id, ns->layout.tp_rank, need, block, quota);
        else
            errmsg_set(err, errlen, "namespace %s (rank %u) is at its quota: memory.namespace_quota = %s, "
                 "%s held (%s pinned or reserved); cannot reserve %zu blocks of %s until its leases end",
                 ns->deployment_id, ns->layout.tp_rank, quota, held, stuck, need, block);
        rc = -KVNODE_ENOSPC;
        goto undo;
    }

populating: {
        struct arena_stats st;
        arena_get_stats(c->host, &st);
        errmsg_set(err, errlen, "host tier still being reserved at start-up: %" PRIu64 " of %"
                   PRIu64 " bytes so far, %" PRIu64 " in use; cannot reserve %zu blocks of %"
                   PRIu64 " bytes yet", st.reserved_bytes, st.capacity, st.used_bytes, need,
                   ns->layout.block_bytes);
        rc = CACHE_STORE_BOUND;
        goto undo;
    }

nospace: {
        struct arena_stats st;
        arena_get_stats(c->host, &st);
        if (cache_persisting(c) && c->writing_bytes > 0) {
            /* Blocks waiting for their writes hold the memory: the store is
             * the bottleneck, and the put may wait for it. */
            errmsg_set(err, errlen, "host tier full: %" PRIu64 " of %" PRIu64 " bytes are blocks "
                       "not yet written to the %s store (%zu writes waiting for its queue); "
                       "the store is the bottleneck", c->writing_bytes, st.capacity,
                       persist_backend_name(c->persist), c->queued_ops);
            rc = CACHE_STORE_BOUND;
            goto undo;
        }
        errmsg_set(err, errlen, "host tier full: cannot reserve %zu blocks of %" PRIu64 " bytes "
             "(%" PRIu64 " of %" PRIu64 " bytes in use, the rest pinned by readers, "
             "reserved by writers or being written to the persistent store)", need,
             ns->layout.block_bytes, st.used_bytes, st.capacity);
        rc = -KVNODE_ENOSPC;
    }
undo:
    for (size_t i = 0; i < n; i++) {
        struct index_entry *e = l->entries[i];
        if (!e)
            continue;
        cache_unreserve(c, ns, owner, e);
    }
    cache_put_shield(c, ns, keys, checks, n, locs, false);
    lease_destroy(c->leases, l);
    (void)reserved;
    return rc;
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
