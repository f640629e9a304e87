/* cache evict: the host tier's watermarks and background evictor, room made
 * for one slot on demand, namespace quotas, and the reaper of expired leases
 * (see cache.h). Loop thread only. */
#include "cache/cache_internal.h"

#include <inttypes.h>

#include "core/clock.h"
#include "core/log.h"

/* Work done per loop iteration by the background evictor and the reaper, so
 * neither holds the loop for long. */
#define EVICT_BATCH 256u
#define REAP_BATCH 1024u
/* Marked LRU entries moved to their places per loop iteration, by the
 * background settle and before the background evictor takes victims
 * (mem/index.h): after a long run of MATCHes with nothing evicted, the moves
 * are spread over iterations, so that an eviction on demand, which moves at
 * most INDEX_OLDEST_SETTLE_BUDGET, rarely meets more and takes the exact LRU
 * victim. About 1 ms of moves at 1 M entries. */
#define EVICT_SETTLE_BATCH 8192u
/* Buckets of an index growth moved per loop iteration by the same
 * background step (mem/index.h index_grow_step): about 4096 entries, so
 * that a growth ends in about 256 iterations per million entries instead of
 * slowing a million lookups (each moves an eighth of a group). */
#define EVICT_GROW_BATCH 4096u

/* --- eviction ------------------------------------------------------------- */

bool cache_over(const struct cache *c, double watermark)
{
    struct arena_stats st;
    arena_get_stats(c->host, &st);
    return (double)st.used_bytes > watermark * (double)st.capacity;
}

/* Over the watermark once the write-back victims in flight have left. */
static bool cache_over_after_writeback(const struct cache *c, double watermark)
{
    struct arena_stats st;
    arena_get_stats(c->host, &st);
    uint64_t used = st.used_bytes > c->evicting_bytes ? st.used_bytes - c->evicting_bytes : 0;
    return (double)used > watermark * (double)st.capacity;
}

void cache_evict_maybe_schedule(struct cache *c)
{
    if (!c->evict_scheduled && cache_over_after_writeback(c, c->high_watermark)) {
        c->evict_scheduled = true;
        event_active(c->evict_ev, 0, 0);
    }
}

/* Background eviction: a batch per loop iteration until below the low
 * watermark or nothing is evictable. Under write_back a victim the store
 * does not hold yet is written first and leaves memory when the write lands;
 * one the queue cannot take is dropped (and counted). */
void cache_evict_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    (void)fd;
    (void)what;
    c->evict_scheduled = false;
    if (cache_over_after_writeback(c, c->low_watermark) &&
        !index_lru_settle_arena(c->index, arena_id(c->host), EVICT_SETTLE_BATCH)) {
        /* More moves next iteration: a timer of 0, as libevent runs an event
         * activated from its own callback again in the same pass, before I/O. */
        c->evict_scheduled = true;
        if (event_add(c->evict_ev, &(struct timeval){ 0, 0 }) < 0)
            event_active(c->evict_ev, 0, 0);
        return;
    }
    for (unsigned i = 0; i < EVICT_BATCH; i++) {
        if (!cache_over_after_writeback(c, c->low_watermark))
            return;
        struct index_entry *victim = index_lru_oldest_in_arena(c->index, arena_id(c->host));
        if (!victim)
            return;
        if (cache_persisting(c) && victim->persist != PERSIST_STORED) {
            /* Written first, leaves memory when the write lands. Over the
             * write budget: wait for writes to land (each one schedules the
             * evictor again) rather than drop the block. */
            if (!cache_write_budget(c, cache_ns_block_bytes(c, victim->ns)))
                return;
            cache_write_start(c, victim, true);
            continue;
        }
        cache_evict_entry(c, victim);
    }
    if (cache_over_after_writeback(c, c->low_watermark)) {
        c->evict_scheduled = true;
        event_active(c->evict_ev, 0, 0);
    }
}

/* Background settle: started from every reaper tick, a batch per loop
 * iteration (a timer of 0 between batches lets I/O in) until no class order
 * of the host arena starts with a marked entry and no index growth is in
 * progress. Cheap when neither: one look at each class's oldest. */
void cache_settle_schedule(struct cache *c)
{
    struct timeval now = { 0, 0 };
    if (c->settle_ev && c->host && !evtimer_pending(c->settle_ev, NULL))
        evtimer_add(c->settle_ev, &now);
}

void cache_settle_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    (void)fd;
    (void)what;
    bool settled = index_lru_settle_arena(c->index, arena_id(c->host), EVICT_SETTLE_BATCH);
    if (!index_grow_step(c->index, EVICT_GROW_BATCH) || !settled)
        cache_settle_schedule(c);
}

/* --- room on demand and namespace quotas ------------------------------------- */

/* Make one slot of class cls allocatable: evict the class's own oldest
 * blocks first (frees a slot directly), else the arena's oldest until a
 * whole slab comes free. A request cannot wait for a write, so victims the
 * store does not hold are dropped here (the background evictor keeps this
 * rare by working from the high watermark). */
/* Evict the next victim for a slot of class cls: the class's own oldest
 * block, else the arena's oldest. false: nothing left to evict. */
static bool cache_evict_for_class(struct cache *c, uint32_t cls)
{
    struct index_entry *victim = index_lru_oldest(c->index, arena_id(c->host), cls);
    if (!victim)
        victim = index_lru_oldest_in_arena(c->index, arena_id(c->host));
    if (!victim)
        return false;
    cache_evict_entry(c, victim);
    return true;
}

bool cache_make_room(struct cache *c, uint32_t cls)
{
    while (!arena_can_alloc(c->host, cls))
        if (!cache_evict_for_class(c, cls))
            return false;
    return true;
}

void cache_make_room_for(struct cache *c, uint32_t cls, uint64_t n)
{
    while (arena_free_slots(c->host, cls) < n)
        if (!cache_evict_for_class(c, cls))
            return;
}

/* Make room under the namespace quota for one more block of ns: evict ns's
 * own oldest unpinned sealed blocks (leaves first), never another
 * namespace's. false: still over and nothing of ns left to evict. */
bool cache_quota_room(struct cache *c, struct kv_namespace *ns)
{
    uint64_t quota = c->namespace_quota, bb = ns->layout.block_bytes;
    if (quota == 0)
        return true;
    while (ns->bytes + ns->reserved + bb > quota) {
        struct index_entry *victim = index_lru_oldest_in_ns(c->index, ns->id);
        if (!victim)
            return false;
        if (c->persist && victim->persist == PERSIST_STORED) {
            cache_to_ghost(c, victim);
        } else {
            cache_count_unwritten(c, victim);
            cache_drop_entry(c, victim);
        }
        c->evicted_quota++;
    }
    return true;
}

/* Bytes ns holds that a quota eviction cannot free: pinned (or shielded)
 * sealed blocks and reserved slots. */
uint64_t cache_quota_stuck(struct cache *c, struct kv_namespace *ns)
{
    uint64_t evictable = (uint64_t)index_lru_count_in_ns(c->index, ns->id) * ns->layout.block_bytes;
    uint64_t held = ns->bytes + ns->reserved;
    return held > evictable ? held - evictable : 0;
}

/* --- reaper --------------------------------------------------------------- */

void cache_reap_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    uint64_t now = clock_now_ms();
    struct lease *l;
    unsigned n = 0;
    (void)fd;
    (void)what;

    while (n < REAP_BATCH && (l = lease_first_expired(c->leases, now)) != NULL) {
        log_debug("reaper: %s lease %" PRIu64 " expired after %" PRIu64 " ms",
                  l->kind == LEASE_READ ? "read" : "write", l->id, now - l->created_ms);
        if (l->kind == LEASE_READ)
            c->reaped_read++;
        else
            c->reaped_write++;
        cache_lease_finish(c, l, false);
        n++;
    }
    if (n > 0)
        log_info("reaper: ended %u expired lease%s", n, n == 1 ? "" : "s");
    /* A device that went down while nothing was copied (a store write met
     * its sticky error, say) is noticed here at the latest. */
    cache_demote_maybe_schedule(c);
    cache_settle_schedule(c);
}
