/* cache: match/get/put/delete semantics, eviction and the reaper (see cache.h). */
#include "cache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "arena.h"
#include "clock.h"
#include "devmem.h"
#include "errmsg.h"
#include "index.h"
#include "kvnode.h"
#include "log.h"
#include "metrics.h"

#define HOST_ARENA_ID 0u
/* Work done per loop iteration by the background evictor and the reaper, so
 * neither holds the loop for long. */
#define EVICT_BATCH 256u
#define REAP_BATCH 1024u

struct cache {
    struct event_base *base;
    arena *host;
    kv_index *index;
    ns_registry *namespaces;
    lease_table *leases;
    bool host_pinned;

    /* reloadable limits */
    double high_watermark, low_watermark;
    uint64_t read_ttl_ms, write_ttl_ms, reaper_interval_ms;
    uint32_t max_leases_per_client;
    uint64_t namespace_quota;   /* host-tier bytes per namespace, 0: none */

    struct event *evict_ev;
    bool evict_scheduled;
    struct event *reap_ev;

    /* counters */
    uint64_t evicted_dropped;
    uint64_t evicted_quota;     /* a namespace's own blocks, for its quota */
    uint64_t reaped_read, reaped_write;
    uint64_t sealed_total;
    struct metrics_keys keys;   /* match/get lookups: matched, missed by reason */
};

static void cache_evict_cb(evutil_socket_t fd, short what, void *arg);
static void cache_reap_cb(evutil_socket_t fd, short what, void *arg);

int cache_create(struct event_base *base, const struct kvn_config *cfg, struct cache **out,
                 char *err, size_t errlen)
{
    struct cache *c = calloc(1, sizeof *c);
    int rc;

    *out = NULL;
    if (!c) {
        errmsg_set(err, errlen, "out of memory");
        return -KVNODE_ENOMEM;
    }
    c->base = base;
    rc = arena_create_host(HOST_ARENA_ID, cfg->host_bytes, cfg->slab_bytes, &c->host, err, errlen);
    if (rc < 0)
        goto fail;
    /* Size the index for the arena's capacity at the default block size
     * order of magnitude; it grows incrementally beyond that. */
    rc = index_create(cfg->host_bytes / (256u * 1024u), &c->index);
    if (rc < 0) {
        errmsg_set(err, errlen, "cannot create the block index: out of memory");
        goto fail;
    }
    rc = ns_registry_create(cfg->max_namespaces, &c->namespaces);
    if (rc < 0) {
        errmsg_set(err, errlen, "cannot create the namespace registry: out of memory");
        goto fail;
    }
    /* Per-namespace LRU heads for every id up front: touches never allocate. */
    rc = index_ns_reserve(c->index, cfg->max_namespaces + 1u);
    if (rc < 0) {
        errmsg_set(err, errlen, "cannot create the block index: out of memory");
        goto fail;
    }
    rc = lease_table_create(&c->leases);
    if (rc < 0) {
        errmsg_set(err, errlen, "cannot create the lease table: out of memory");
        goto fail;
    }
    if (cfg->pin_host != CONFIG_PIN_OFF) {
        char why[256] = "";
        if (devmem_pin_host(arena_base(c->host), arena_size(c->host), why, sizeof why) == 0) {
            c->host_pinned = true;
            log_info("host arena pinned for GPU copies (%" PRIu64 " bytes)", arena_size(c->host));
        } else if (cfg->pin_host == CONFIG_PIN_ON) {
            errmsg_set(err, errlen, "memory.pin_host = on but the host arena cannot be pinned: %s", why);
            rc = -KVNODE_EIO;
            goto fail;
        } else {
            log_info("host arena not pinned: %s", why);
        }
    }
    c->evict_ev = event_new(base, -1, 0, cache_evict_cb, c);
    c->reap_ev = event_new(base, -1, EV_PERSIST, cache_reap_cb, c);
    if (!c->evict_ev || !c->reap_ev) {
        errmsg_set(err, errlen, "cannot create cache events");
        rc = -KVNODE_ENOMEM;
        goto fail;
    }
    cache_apply_config(c, cfg);
    *out = c;
    return 0;
fail:
    cache_destroy(c);
    return rc < 0 ? rc : -KVNODE_ENOMEM;
}

void cache_destroy(struct cache *c)
{
    if (!c)
        return;
    if (c->evict_ev)
        event_free(c->evict_ev);
    if (c->reap_ev)
        event_free(c->reap_ev);
    if (c->leases)
        lease_table_destroy(c->leases);
    if (c->index)
        index_destroy(c->index);
    if (c->namespaces)
        ns_registry_destroy(c->namespaces);
    if (c->host) {
        if (c->host_pinned)
            devmem_unpin_host(arena_base(c->host));
        arena_destroy(c->host);
    }
    free(c);
}

void cache_apply_config(struct cache *c, const struct kvn_config *cfg)
{
    struct timeval tv;

    c->high_watermark = cfg->high_watermark;
    c->low_watermark = cfg->low_watermark;
    c->read_ttl_ms = cfg->read_lease_ttl_ms;
    c->write_ttl_ms = cfg->write_lease_ttl_ms;
    c->max_leases_per_client = cfg->max_leases_per_client;
    /* A lowered quota is enforced at each namespace's next put, no sweep. */
    c->namespace_quota = cfg->namespace_quota;
    if (c->reaper_interval_ms != cfg->reaper_interval_ms) {
        c->reaper_interval_ms = cfg->reaper_interval_ms;
        tv.tv_sec = (time_t)(c->reaper_interval_ms / 1000u);
        tv.tv_usec = (suseconds_t)((c->reaper_interval_ms % 1000u) * 1000u);
        evtimer_add(c->reap_ev, &tv);
    }
}

/* --- namespaces and arenas --------------------------------------------------- */

int cache_bind(struct cache *c, const struct ns_layout *layout, kv_namespace **ns,
               char *err, size_t errlen)
{
    kv_namespace *n = NULL;
    int created = 0, rc;
    uint32_t cls;

    rc = ns_layout_validate(layout, err, errlen);
    if (rc < 0)
        return rc;
    /* Check the block fits the allocator before registering anything. */
    rc = arena_class_for(c->host, layout->block_bytes, &cls);
    if (rc == -KVNODE_ETOOBIG) {
        struct arena_stats st;
        arena_get_stats(c->host, &st);
        errmsg_set(err, errlen, "block_bytes %" PRIu64 " exceeds the allocator's slab size %" PRIu64
             " (raise memory.slab_bytes)", layout->block_bytes, st.slab_bytes);
        return -KVNODE_ELAYOUT;
    }
    if (rc < 0) {
        errmsg_set(err, errlen, "too many distinct block sizes in the host arena (at most %u)",
             ARENA_MAX_CLASSES);
        return rc;
    }
    rc = ns_bind(c->namespaces, layout, &n, &created, err, errlen);
    if (rc < 0)
        return rc;
    n->cls = cls;
    n->clients++;
    if (created)
        log_info("namespace %u: deployment %s tp_rank %u/%u block_bytes %" PRIu64,
                 n->id, n->deployment_id, n->layout.tp_rank, n->layout.tp_size,
                 n->layout.block_bytes);
    *ns = n;
    return 0;
}

void cache_unbind(struct cache *c, kv_namespace *ns)
{
    (void)c;
    if (ns && ns->clients > 0)
        ns->clients--;
}

size_t cache_arenas(const struct cache *c, struct cache_arena_info *out, size_t max)
{
    if (max < 1)
        return 0;
    out[0].id = arena_id(c->host);
    out[0].tier = arena_tier(c->host);
    out[0].device = arena_device(c->host);
    out[0].size = arena_size(c->host);
    out[0].fd = arena_fd(c->host);
    return 1;
}

void *cache_arena_base(const struct cache *c, uint32_t arena_no)
{
    return arena_no == arena_id(c->host) ? arena_base(c->host) : NULL;
}

/* --- entry lifecycle ------------------------------------------------------ */

static uint64_t ns_block_bytes(struct cache *c, uint32_t ns_id)
{
    kv_namespace *ns = ns_get(c->namespaces, ns_id);
    return ns ? ns->layout.block_bytes : 0;
}

/* Forget a SEALED entry's accounting (it is leaving the index). */
static void cache_account_remove(struct cache *c, index_entry *e)
{
    kv_namespace *ns = ns_get(c->namespaces, e->ns);
    if (ns && ns->blocks > 0) {
        ns->blocks--;
        ns->bytes -= ns->layout.block_bytes;
    }
}

static void cache_entry_destroy(struct cache *c, index_entry *e)
{
    arena_free(c->host, e->offset);
    index_entry_free(e);
}

/* Drop an unpinned SEALED entry from memory (no persistence yet). */
static void cache_drop_entry(struct cache *c, index_entry *e)
{
    index_unlink(c->index, e);
    cache_account_remove(c, e);
    cache_entry_destroy(c, e);
}

static void cache_drop(struct cache *c, index_entry *e)
{
    cache_drop_entry(c, e);
    c->evicted_dropped++;
}

static void cache_unpin(struct cache *c, index_entry *e)
{
    if (e->pins == 0)
        return;
    if (--e->pins > 0)
        return;
    if (e->detached)
        cache_entry_destroy(c, e);
    else
        index_lru_touch(c->index, e);
}

/* --- eviction ------------------------------------------------------------- */

static bool cache_over(const struct cache *c, double watermark)
{
    struct arena_stats st;
    arena_get_stats(c->host, &st);
    return (double)st.used_bytes > watermark * (double)st.capacity;
}

static void cache_evict_maybe_schedule(struct cache *c)
{
    if (!c->evict_scheduled && cache_over(c, c->high_watermark)) {
        c->evict_scheduled = true;
        event_active(c->evict_ev, 0, 0);
    }
}

/* Background eviction: a batch per loop iteration until below the low
 * watermark or nothing is evictable. */
static void cache_evict_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    (void)fd;
    (void)what;
    c->evict_scheduled = false;
    for (unsigned i = 0; i < EVICT_BATCH; i++) {
        if (!cache_over(c, c->low_watermark))
            return;
        index_entry *victim = index_lru_oldest_in_arena(c->index, arena_id(c->host));
        if (!victim)
            return;
        cache_drop(c, victim);
    }
    if (cache_over(c, c->low_watermark)) {
        c->evict_scheduled = true;
        event_active(c->evict_ev, 0, 0);
    }
}

/* Make one slot of class cls allocatable: evict the class's own oldest
 * blocks first (frees a slot directly), else the arena's oldest until a
 * whole slab comes free. */
static bool cache_make_room(struct cache *c, uint32_t cls)
{
    while (!arena_can_alloc(c->host, cls)) {
        index_entry *victim = index_lru_oldest(c->index, arena_id(c->host), cls);
        if (!victim)
            victim = index_lru_oldest_in_arena(c->index, arena_id(c->host));
        if (!victim)
            return false;
        cache_drop(c, victim);
    }
    return true;
}

/* Make room under the namespace quota for one more block of ns: evict ns's
 * own oldest unpinned sealed blocks (leaves first), never another
 * namespace's. false: still over and nothing of ns left to evict. */
static bool cache_quota_room(struct cache *c, kv_namespace *ns)
{
    uint64_t quota = c->namespace_quota, bb = ns->layout.block_bytes;
    if (quota == 0)
        return true;
    while (ns->bytes + ns->reserved + bb > quota) {
        index_entry *victim = index_lru_oldest_in_ns(c->index, ns->id);
        if (!victim)
            return false;
        cache_drop_entry(c, victim);
        c->evicted_quota++;
    }
    return true;
}

/* Bytes ns holds that a quota eviction cannot free: pinned (or shielded)
 * sealed blocks and reserved slots. */
static uint64_t cache_quota_stuck(struct cache *c, kv_namespace *ns)
{
    uint64_t evictable = (uint64_t)index_lru_count_in_ns(c->index, ns->id) * ns->layout.block_bytes;
    uint64_t held = ns->bytes + ns->reserved;
    return held > evictable ? held - evictable : 0;
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

/* --- operations -------------------------------------------------------------- */

/* Count a lookup of n keys that matched the first m; the first miss (if
 * any) was entry e (NULL: absent), the keys after it were not looked at. */
static void cache_count_keys(struct cache *c, size_t n, size_t m, const index_entry *e)
{
    c->keys.matched += m;
    if (m == n)
        return;
    if (e)
        c->keys.writing++;
    else
        c->keys.absent++;
    c->keys.beyond_gap += n - m - 1;
}

void cache_key_metrics(const struct cache *c, struct metrics_keys *out)
{
    *out = c->keys;
}

size_t cache_match(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n)
{
    size_t i;
    index_entry *miss = NULL;
    for (i = 0; i < n; i++) {
        index_entry *e = index_lookup(c->index, ns->id, keys[i]);
        if (!e || e->state != ENTRY_SEALED) {
            miss = e;
            break;
        }
    }
    cache_count_keys(c, n, i, miss);
    /* A matched prefix is about to be read: refresh it, tail-first (so a
     * second walk; its lookups hit the lines the first one just loaded). */
    for (size_t j = i; j-- > 0;) {
        index_entry *e = index_lookup(c->index, ns->id, keys[j]);
        if (e->pins == 0)
            index_lru_touch(c->index, e);
    }
    return i;
}

static int cache_check_lease_room(struct cache *c, struct lease_list *owner, char *err, size_t errlen)
{
    if (owner->count >= c->max_leases_per_client) {
        errmsg_set(err, errlen, "this connection already holds %zu leases (leases.max_per_client = %u);"
             " end some first", owner->count, c->max_leases_per_client);
        return -KVNODE_ELIMIT;
    }
    return 0;
}

int cache_get_begin(struct cache *c, kv_namespace *ns, struct lease_list *owner,
                    const int64_t *keys, size_t n, uint64_t *lease_id,
                    struct cache_loc *locs, size_t *got, char *err, size_t errlen)
{
    size_t m = 0;
    lease *l;
    int rc;

    index_entry *first, *miss = NULL;

    *lease_id = 0;
    *got = 0;
    first = n ? index_lookup(c->index, ns->id, keys[0]) : NULL;
    if (!first || first->state != ENTRY_SEALED) {
        cache_count_keys(c, n, 0, first);
        return 0;
    }
    rc = cache_check_lease_room(c, owner, err, errlen);
    if (rc < 0)
        return rc;
    /* Room for every key; the walk pins the ready prefix in one pass and
     * leaves the rest of entries[] NULL. */
    l = lease_create(c->leases, LEASE_READ, ns->id, owner, clock_now_ms(), c->read_ttl_ms, n);
    if (!l) {
        errmsg_set(err, errlen, "out of memory creating a read lease");
        return -KVNODE_ENOMEM;
    }
    for (index_entry *e = first; m < n; m++) {
        if (m > 0)
            e = index_lookup(c->index, ns->id, keys[m]);
        if (!e || e->state != ENTRY_SEALED) {
            miss = e;
            break;
        }
        if (e->pins++ == 0)
            index_lru_remove(c->index, e);
        l->entries[m] = e;
        locs[m].arena = e->arena;
        locs[m].offset = e->offset;
        locs[m].present = true;
    }
    *lease_id = l->id;
    *got = m;
    cache_count_keys(c, n, m, miss);
    return 0;
}

/* Keys a put reports as already stored are the prefix it extends: shield
 * them (a pin, as a reader's) from the evictions that make room for the
 * rest, and release them tail-first after, which refreshes them like a hit. */
static void cache_put_shield(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n,
                             const struct cache_loc *locs, bool on)
{
    for (size_t j = 0; j < n; j++) {
        size_t i = on ? j : n - 1 - j;
        if (locs[i].present)
            continue;
        index_entry *e = index_lookup(c->index, ns->id, keys[i]);
        if (!e || e->state != ENTRY_SEALED)
            continue;
        if (!on)
            cache_unpin(c, e);
        else if (e->pins++ == 0)
            index_lru_remove(c->index, e);
    }
}

int cache_put_begin(struct cache *c, kv_namespace *ns, struct lease_list *owner,
                    const int64_t *keys, size_t n, int tier, uint64_t *lease_id,
                    struct cache_loc *locs, char *err, size_t errlen)
{
    size_t need = 0, reserved = 0;
    lease *l;
    int rc;

    *lease_id = 0;
    if (tier != 0 && tier != KVNODE_TIER_HOST && tier != KVNODE_TIER_HBM) {
        errmsg_set(err, errlen, "unknown tier %d (expected %d host or %d hbm)", tier,
             KVNODE_TIER_HOST, KVNODE_TIER_HBM);
        return -KVNODE_EINVAL;
    }
    /* No HBM tier yet: every reservation lands in host memory. */
    for (size_t i = 0; i < n; i++) {
        locs[i].present = index_lookup(c->index, ns->id, keys[i]) == NULL;
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
    l = lease_create(c->leases, LEASE_WRITE, ns->id, owner, clock_now_ms(), c->write_ttl_ms, n);
    if (!l) {
        errmsg_set(err, errlen, "out of memory creating a write lease");
        return -KVNODE_ENOMEM;
    }
    cache_put_shield(c, ns, keys, n, locs, true);
    /* Under a quota, decide before evicting anything: a put that cannot fit
     * even after evicting every evictable block of its namespace must not
     * evict them. (need counts a key repeated within the request each time,
     * so this errs on the side of refusing.) */
    if (c->namespace_quota > 0 &&
        cache_quota_stuck(c, ns) + (uint64_t)need * ns->layout.block_bytes > c->namespace_quota)
        goto overquota;
    for (size_t i = 0; i < n; i++) {
        index_entry *e;
        uint64_t off;

        if (!locs[i].present)
            continue;
        if (index_lookup(c->index, ns->id, keys[i])) {
            locs[i].present = false;  /* duplicate key earlier in this request */
            continue;
        }
        if (!cache_quota_room(c, ns))
            goto overquota;
        if (!cache_make_room(c, ns->cls) || arena_alloc(c->host, ns->cls, &off) < 0)
            goto nospace;
        e = index_insert(c->index, ns->id, keys[i]);
        if (!e) {
            arena_free(c->host, off);
            errmsg_set(err, errlen, "out of memory indexing block %zu", i);
            rc = -KVNODE_ENOMEM;
            goto undo;
        }
        e->state = ENTRY_WRITING;
        e->tier = KVNODE_TIER_HOST;
        e->arena = arena_id(c->host);
        e->cls = ns->cls;
        e->offset = off;
        l->entries[i] = e;
        locs[i].arena = e->arena;
        locs[i].offset = off;
        ns->reserved += ns->layout.block_bytes;
        reserved++;
    }
    cache_put_shield(c, ns, keys, n, locs, false);
    *lease_id = l->id;
    cache_evict_maybe_schedule(c);
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

nospace: {
        struct arena_stats st;
        arena_get_stats(c->host, &st);
        errmsg_set(err, errlen, "host tier full: cannot reserve %zu blocks of %" PRIu64 " bytes "
             "(%" PRIu64 " of %" PRIu64 " bytes in use, the rest pinned by readers or "
             "reserved by writers)", need, ns->layout.block_bytes, st.used_bytes, st.capacity);
        rc = -KVNODE_ENOSPC;
    }
undo:
    for (size_t i = 0; i < n; i++) {
        index_entry *e = l->entries[i];
        if (!e)
            continue;
        index_unlink(c->index, e);
        cache_entry_destroy(c, e);
        ns->reserved -= ns->layout.block_bytes;
    }
    cache_put_shield(c, ns, keys, n, locs, false);
    lease_destroy(c->leases, l);
    (void)reserved;
    return rc;
}

/* End a lease's hold on its entries. */
static uint32_t cache_lease_finish(struct cache *c, lease *l, bool commit)
{
    uint32_t count = 0;

    if (l->kind == LEASE_READ) {
        /* Unpin tail-first so the chain's root becomes the newest. */
        for (size_t i = l->n; i-- > 0;) {
            if (!l->entries[i])
                continue;
            cache_unpin(c, l->entries[i]);
            count++;
        }
    } else if (commit) {
        uint64_t bytes = ns_block_bytes(c, l->ns);
        kv_namespace *ns = ns_get(c->namespaces, l->ns);
        for (size_t i = l->n; i-- > 0;) {
            index_entry *e = l->entries[i];
            if (!e)
                continue;
            e->state = ENTRY_SEALED;
            index_lru_touch(c->index, e);
            if (ns) {
                ns->blocks++;
                ns->bytes += bytes;
                ns->reserved -= ns->reserved >= bytes ? bytes : ns->reserved;
            }
            c->sealed_total++;
            count++;
        }
    } else {
        uint64_t bytes = ns_block_bytes(c, l->ns);
        kv_namespace *ns = ns_get(c->namespaces, l->ns);
        for (size_t i = 0; i < l->n; i++) {
            index_entry *e = l->entries[i];
            if (!e)
                continue;
            index_unlink(c->index, e);
            cache_entry_destroy(c, e);
            if (ns)
                ns->reserved -= ns->reserved >= bytes ? bytes : ns->reserved;
            count++;
        }
    }
    lease_destroy(c->leases, l);
    return count;
}

int cache_lease_end(struct cache *c, struct lease_list *owner, uint64_t lease_id, int kind,
                    bool commit, uint32_t *blocks, char *err, size_t errlen)
{
    lease *l = lease_id ? lease_find(c->leases, lease_id) : NULL;

    *blocks = 0;
    if (!l || l->owner != owner) {
        errmsg_set(err, errlen, "lease %" PRIu64 " is not held by this connection "
             "(ended, expired after its TTL, or never granted)", lease_id);
        return -KVNODE_ENOLEASE;
    }
    if (l->kind != kind) {
        errmsg_set(err, errlen, "lease %" PRIu64 " is a %s lease; end it with %s", lease_id,
             l->kind == LEASE_READ ? "read" : "write",
             l->kind == LEASE_READ ? "get_end" : "put_commit or put_abort");
        return -KVNODE_EINVAL;
    }
    *blocks = cache_lease_finish(c, l, commit);
    if (kind == LEASE_WRITE && commit)
        cache_evict_maybe_schedule(c);
    return 0;
}

int cache_delete(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n,
                 uint32_t *deleted)
{
    *deleted = 0;
    for (size_t i = 0; i < n; i++) {
        index_entry *e = index_lookup(c->index, ns->id, keys[i]);
        /* Blocks still being written belong to their writer until commit. */
        if (!e || e->state != ENTRY_SEALED)
            continue;
        index_unlink(c->index, e);
        cache_account_remove(c, e);
        if (e->pins > 0)
            e->detached = 1;   /* freed when the last reader lets go */
        else
            cache_entry_destroy(c, e);
        (*deleted)++;
    }
    return 0;
}

void cache_release_owner(struct cache *c, struct lease_list *owner)
{
    while (owner->head)
        cache_lease_finish(c, owner->head, false);
}

/* --- reaper --------------------------------------------------------------- */

static void cache_reap_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    uint64_t now = clock_now_ms();
    lease *l;
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
}

/* --- stats ----------------------------------------------------------------- */

void cache_stats_json(struct cache *c, json_t *root)
{
    struct arena_stats st;
    json_t *tiers = json_object(), *host = json_object(), *nss = json_array();
    json_t *leases = json_object(), *ev = json_object(), *evh = json_object();

    arena_get_stats(c->host, &st);
    json_object_set_new(host, "capacity_bytes", json_integer((json_int_t)st.capacity));
    json_object_set_new(host, "used_bytes", json_integer((json_int_t)st.used_bytes));
    json_object_set_new(host, "blocks", json_integer((json_int_t)st.blocks));
    json_object_set_new(host, "slab_bytes", json_integer((json_int_t)st.slab_bytes));
    json_object_set_new(host, "slabs_total", json_integer(st.slabs_total));
    json_object_set_new(host, "slabs_free", json_integer(st.slabs_free));
    json_object_set_new(host, "high_watermark", json_real(c->high_watermark));
    json_object_set_new(host, "low_watermark", json_real(c->low_watermark));
    json_object_set_new(host, "pinned", json_boolean(c->host_pinned));
    json_object_set_new(tiers, "host", host);
    json_object_set_new(root, "tiers", tiers);

    for (size_t i = 0; i < ns_count(c->namespaces); i++) {
        kv_namespace *ns = ns_at(c->namespaces, i);
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(ns->id));
        json_object_set_new(o, "deployment_id", json_string(ns->deployment_id));
        json_object_set_new(o, "model", json_string(ns->layout.model));
        json_object_set_new(o, "dtype", json_string(ns->layout.dtype));
        json_object_set_new(o, "block_tokens", json_integer(ns->layout.block_tokens));
        json_object_set_new(o, "block_bytes", json_integer((json_int_t)ns->layout.block_bytes));
        json_object_set_new(o, "tp_size", json_integer(ns->layout.tp_size));
        json_object_set_new(o, "tp_rank", json_integer(ns->layout.tp_rank));
        json_object_set_new(o, "blocks", json_integer((json_int_t)ns->blocks));
        json_object_set_new(o, "bytes", json_integer((json_int_t)ns->bytes));
        json_object_set_new(o, "reserved_bytes", json_integer((json_int_t)ns->reserved));
        json_object_set_new(o, "quota_bytes", json_integer((json_int_t)c->namespace_quota));
        json_object_set_new(o, "clients", json_integer(ns->clients));
        json_array_append_new(nss, o);
    }
    json_object_set_new(root, "namespaces", nss);

    json_object_set_new(leases, "read", json_integer((json_int_t)lease_count(c->leases, LEASE_READ)));
    json_object_set_new(leases, "write", json_integer((json_int_t)lease_count(c->leases, LEASE_WRITE)));
    json_object_set_new(leases, "reaped_total", json_integer((json_int_t)(c->reaped_read + c->reaped_write)));
    json_object_set_new(leases, "reaped_read_total", json_integer((json_int_t)c->reaped_read));
    json_object_set_new(leases, "reaped_write_total", json_integer((json_int_t)c->reaped_write));
    json_object_set_new(root, "leases", leases);

    json_object_set_new(evh, "dropped_total", json_integer((json_int_t)c->evicted_dropped));
    json_object_set_new(evh, "quota_total", json_integer((json_int_t)c->evicted_quota));
    json_object_set_new(ev, "host", evh);
    json_object_set_new(root, "evictions", ev);
}
