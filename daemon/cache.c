/* cache: match/get/put/delete semantics, eviction and the reaper (see cache.h). */
#include "cache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "arena.h"
#include "clock.h"
#include "copier.h"
#include "devmem.h"
#include "hostpin.h"
#include "errmsg.h"
#include "index.h"
#include "keylock.h"
#include "kvnode.h"
#include "log.h"
#include "counters.h"
#include "kvs/kvs.h"
#include "persist.h"

#define HOST_ARENA_ID 0u
/* Work done per loop iteration by the background evictor and the reaper, so
 * neither holds the loop for long. */
#define EVICT_BATCH 256u
#define REAP_BATCH 1024u
/* A block stays pinned while it is written to the store (its slot is read
 * by a worker), so writes in flight may pin at most this fraction of the
 * host tier: the rest stays evictable and a burst of puts never fails for
 * want of room. A write-through block over the budget is written when the
 * evictor picks it instead (like write_back), and counted. */
#define WRITE_PIN_FRACTION 0.5
/* Demotion batches in flight per device: one copying while the next is
 * built keeps the copy engine busy without tying up much host memory. */
#define DEMOTE_INFLIGHT 2u
_Static_assert(NS_MAX_HBM_ARENAS >= DEVMEM_MAX_DEVICES, "a namespace has a class per HBM arena");

/* A device's HBM arena and its demotion state. */
struct cache_hbm {
    arena   *a;
    int      device;
    bool     host_access;            /* the loop may read its bytes (sim) */
    uint8_t  ipc[DEVMEM_IPC_HANDLE_BYTES];
    size_t   ipc_len;
    char     pci_bus_id[32];
    uint64_t moving_bytes;           /* strides of blocks being demoted */
    unsigned inflight;               /* demotion batches submitted, not done */
    bool     demoting;               /* passed the high watermark, not yet below the low */
};

/* One block of a demotion batch: where it goes in the host arena. */
struct demote_rec {
    index_entry *e;
    uint64_t host_off;
    uint32_t host_cls;
    uint64_t stride;                 /* its stride in the HBM arena */
};
struct cache_demote {
    struct copier_batch b;
    struct cache *c;
    unsigned hbm;                    /* index into c->hbm */
    struct demote_rec *recs;
};

struct cache {
    struct event_base *base;
    arena *host;
    /* Arenas by id: [0] the host arena, [1 + i] HBM of hbm[i]. */
    arena *arenas[INDEX_MAX_ARENAS];
    uint32_t narenas;
    struct cache_hbm hbm[DEVMEM_MAX_DEVICES];
    unsigned nhbm;
    struct devmem *devmem;           /* the backend HBM arenas come from (NULL: none) */
    struct copier *copier;           /* NULL: no demotion (HBM blocks stay or are dropped) */
    struct hostpin *hostpin;         /* NULL: the host arena is not being pinned */
    double hbm_high, hbm_low;
    uint64_t hbm_batch_bytes;
    struct event *demote_ev;
    bool demote_scheduled;
    bool demote_building;            /* in cache_demote_cb: blocks it puts back do not reschedule it */
    kv_index *index;
    ns_registry *namespaces;
    lease_table *leases;

    /* reloadable limits */
    double high_watermark, low_watermark;
    uint64_t read_ttl_ms, write_ttl_ms, reaper_interval_ms;
    uint32_t max_leases_per_client;
    double max_reserved_per_client;  /* share of the host tier */
    uint64_t namespace_quota;   /* host-tier bytes per namespace, 0: none */
    int policy;                 /* CONFIG_POLICY_* */
    uint32_t request_timeout_ms;

    struct persist *persist;    /* NULL: no store */
    cache_block_fn observer;    /* completeness changes (KVCM), NULL: none */
    cache_deployment_fn dep_observer;   /* a deployment's TP group connected (KVCM) */
    void *observer_arg;
    uint64_t ghosts;            /* entries only in the store (incl. promoting) */
    uint64_t evicting_bytes;    /* write-back victims whose write is in flight */
    uint64_t writing_bytes;     /* blocks pinned by a write (in flight or waiting) */
    struct keylock *keylocks;   /* store ops in order per key */
    /* store ops the store's queue refused, sent again in order as it drains */
    struct cache_storeop *queued_head, *queued_tail;
    size_t queued_ops;
    bool draining;
    /* blocks whose write failed, written again after a backoff */
    struct cache_retry *retry_head, *retry_tail;
    size_t retry_pending;
    uint64_t retry_backoff_ms;  /* 0: the next retry comes after RETRY_FIRST_MS */
    struct event *retry_ev;
    /* puts waiting for room that blocks being written hold (back-pressure) */
    struct cache_wait *put_waiters, *put_waiters_tail;
    struct event *put_wake_ev;

    struct event *evict_ev;
    bool evict_scheduled;
    struct event *reap_ev;

    /* counters */
    uint64_t evicted_dropped;
    uint64_t evicted_quota;     /* a namespace's own blocks, for its quota */
    uint64_t reaped_read, reaped_write;
    uint64_t sealed_total;
    uint64_t evicted_to_store;  /* memory freed, the store's copy kept as a ghost */
    uint64_t writeback_started; /* write-back victims handed to the store */
    uint64_t writes_deferred;   /* writes that waited for room in the store's queue */
    uint64_t write_retries;     /* failed writes tried again */
    uint64_t persist_dropped;   /* blocks that left memory unwritten (persistence on) */
    uint64_t put_waits, put_wait_timeouts;  /* puts that waited for the store / in vain */
    uint64_t reservations_refused;  /* puts over leases.max_reserved_per_client */
    uint64_t namespaces_reclaimed;  /* idle namespaces released at the limit */
    uint64_t promotions, promotions_ok, promotions_failed;
    uint64_t lookups, lookup_found;
    uint64_t waits, wait_timeouts;
    uint64_t recovered, recovery_skipped;
    uint64_t hbm_reserved, hbm_fallbacks;   /* HBM puts: slots in HBM, sent to host instead */
    uint64_t demoted, demoted_bytes;        /* blocks moved HBM -> host */
    uint64_t demote_aborted;                /* a reader pinned it meanwhile, or it was deleted */
    uint64_t demote_failed;                 /* the copy failed (the block stays in HBM) */
    uint64_t demote_dropped;                /* no host room: left memory (ghost or gone) */
    struct metrics_keys keys;   /* match/get lookups: matched, missed by reason */
};

enum { STORE_OP_WRITE = 1, STORE_OP_DELETE = 2 };

/* One write, or a delete of n keys; it holds the keylock of each of its keys
 * from the time it is sent to the store until its result is back. */
struct cache_storeop {
    struct keylock_waiter turn;     /* first: waiting for its (single) key */
    struct cache *c;
    int kind;
    kv_namespace *ns;
    index_entry *e;                 /* write: the block, pinned until the result */
    bool evicting;                  /* write: a write-back victim */
    struct cache_storeop *next;     /* on c->queued_head: the store's queue was full */
    size_t n;
    int64_t keys[];                 /* write: the block's key */
};

/* A block whose write failed: written again after a backoff while it is in
 * memory. By key: it may be evicted, deleted or replaced meanwhile. */
struct cache_retry {
    uint32_t ns;
    int64_t key;
    struct cache_retry *next;
};

/* A MATCH or GET whose answer waits for the store (see cache.h). Built on
 * the stack; moved to the heap the first time the walk has to wait. Freed
 * once the requester is done with it (finished) and no store request it
 * started is outstanding. */
enum { WAIT_MATCH = 1, WAIT_GET = 2, WAIT_PUT = 3 };
struct cache_wait {
    struct cache *c;
    int kind;
    kv_namespace *ns;
    const int64_t *keys;        /* the caller's during start, owned copy once on the heap */
    size_t n;
    size_t next;                /* GET: next key to walk */
    lease *l;                   /* GET: the read lease (NULL: none yet, or reaped) */
    struct lease_list *owner;   /* GET: who the lease is for */
    uint32_t readable;          /* GET: arenas the answer may point into (bit per id) */
    unsigned outstanding;       /* promotions and lookups not back yet */
    bool on_heap, looked_up, may_wait, nomem;
    bool answered;              /* ready() called (or the answer was immediate) */
    bool finished;              /* the requester called finish or cancel */
    cache_ready_fn ready;
    void *arg;
    struct event *timer;
    struct cache_wait *put_prev, *put_next;   /* PUT: on c->put_waiters */
};

/* One store read of a ghost into its reserved slot, and the waits on it. */
struct promo_waiter {
    struct cache_wait *w;
    struct promo_waiter *next;
};
struct cache_promo {
    struct cache *c;
    index_entry *e;
    kv_namespace *ns;
    struct promo_waiter *waiters;
};

/* A write of one block to the store. */
struct cache_write {
    struct cache *c;
    index_entry *e;
    kv_namespace *ns;
    int64_t key;
};

/* A lookup of keys the index does not know. */
struct cache_lookup {
    struct cache_wait *w;
    int64_t *keys;
    size_t n;
    uint8_t present[];
};

static void cache_evict_cb(evutil_socket_t fd, short what, void *arg);
static void cache_reap_cb(evutil_socket_t fd, short what, void *arg);
static void cache_demote_cb(evutil_socket_t fd, short what, void *arg);
static void cache_demote_maybe_schedule(struct cache *c);
static void cache_note_bound(struct cache *c, const kv_namespace *ns);
static void cache_retry_cb(evutil_socket_t fd, short what, void *arg);
static void cache_put_wake_cb(evutil_socket_t fd, short what, void *arg);
static void cache_unpin(struct cache *c, index_entry *e);
static void cache_storeop_free(struct cache_storeop *op);

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
    c->arenas[HOST_ARENA_ID] = c->host;
    c->narenas = 1;
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
    c->evict_ev = event_new(base, -1, 0, cache_evict_cb, c);
    c->reap_ev = event_new(base, -1, EV_PERSIST, cache_reap_cb, c);
    c->demote_ev = event_new(base, -1, 0, cache_demote_cb, c);
    c->retry_ev = evtimer_new(base, cache_retry_cb, c);
    c->put_wake_ev = event_new(base, -1, 0, cache_put_wake_cb, c);
    if (!c->evict_ev || !c->reap_ev || !c->demote_ev || !c->retry_ev || !c->put_wake_ev ||
        keylock_create(&c->keylocks) < 0) {
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
    /* Ops the store never got (it is gone by now): give back their pins,
     * while the events an unpin may activate (demotion) still exist. */
    while (c->queued_head) {
        struct cache_storeop *op = c->queued_head;
        c->queued_head = op->next;
        if (op->kind == STORE_OP_WRITE)
            cache_unpin(c, op->e);
        cache_storeop_free(op);
    }
    if (c->evict_ev)
        event_free(c->evict_ev);
    if (c->reap_ev)
        event_free(c->reap_ev);
    if (c->demote_ev)
        event_free(c->demote_ev);
    if (c->retry_ev)
        event_free(c->retry_ev);
    if (c->put_wake_ev)
        event_free(c->put_wake_ev);
    while (c->retry_head) {
        struct cache_retry *r = c->retry_head;
        c->retry_head = r->next;
        free(r);
    }
    keylock_destroy(c->keylocks);
    if (c->leases)
        lease_table_destroy(c->leases);
    if (c->index)
        index_destroy(c->index);
    if (c->namespaces)
        ns_registry_destroy(c->namespaces);
    for (unsigned i = 0; i < c->nhbm; i++)
        arena_destroy(c->hbm[i].a);
    arena_destroy(c->host);
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
    c->max_reserved_per_client = cfg->max_reserved_per_client;
    /* A lowered quota is enforced at each namespace's next put, no sweep. */
    c->namespace_quota = cfg->namespace_quota;
    c->policy = cfg->persist_policy;
    c->request_timeout_ms = cfg->request_timeout_ms;
    c->hbm_high = cfg->hbm_high_watermark;
    c->hbm_low = cfg->hbm_low_watermark;
    c->hbm_batch_bytes = cfg->hbm_copy_batch_bytes;
    if (c->demote_ev)
        event_active(c->demote_ev, 0, 0);   /* lowered watermarks apply now */
    if (c->reaper_interval_ms != cfg->reaper_interval_ms) {
        c->reaper_interval_ms = cfg->reaper_interval_ms;
        tv = clock_tv_ms(c->reaper_interval_ms);
        evtimer_add(c->reap_ev, &tv);
    }
}

/* --- namespaces and arenas --------------------------------------------------- */

/* What one connection may hold in uncommitted reservations: its share of
 * the memory tiers (host and HBM) together. */
static uint64_t cache_reserve_limit(const struct cache *c)
{
    uint64_t total = 0;
    for (uint32_t id = 0; id < c->narenas; id++)
        total += arena_size(c->arenas[id]);
    return (uint64_t)(c->max_reserved_per_client * (double)total);
}

static void cache_evict_entry(struct cache *c, index_entry *e);

/* At the namespace limit: free the memory of the idle namespace (no client,
 * no reservation) with the fewest blocks in memory, if it has at most
 * RECLAIM_MAX_BLOCKS and all of them are evictable and already in the store
 * (or persistence is off), so that it stops counting. Bounded work; a
 * throwaway deployment does not hold its slot for good. */
#define RECLAIM_MAX_BLOCKS 256u
static bool cache_reclaim_idle_ns(struct cache *c)
{
    kv_namespace *best = NULL;
    for (size_t i = 0; i < ns_count(c->namespaces); i++) {
        kv_namespace *ns = ns_at(c->namespaces, i);
        if (ns->clients || ns->reserved || !ns->blocks || ns->blocks > RECLAIM_MAX_BLOCKS ||
            index_lru_count_in_ns(c->index, ns->id) < ns->blocks)
            continue;   /* in use, empty, too big, or some block pinned */
        if (!best || ns->blocks < best->blocks)
            best = ns;
    }
    if (!best)
        return false;
    index_entry *e;
    while ((e = index_lru_oldest_in_ns(c->index, best->id)) != NULL) {
        if (c->persist && c->policy != CONFIG_POLICY_OFF && e->persist != PERSIST_STORED)
            break;   /* not written yet: it stays (and so does the namespace) */
        cache_evict_entry(c, e);
    }
    if (ns_active(best))
        return false;
    c->namespaces_reclaimed++;
    log_info("namespace %u (%s rank %u) released to make room: no client, its blocks left memory",
             best->id, best->deployment_id, best->layout.tp_rank);
    return true;
}

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
    if (rc == -KVNODE_ELIMIT && cache_reclaim_idle_ns(c))
        rc = ns_bind(c->namespaces, layout, &n, &created, err, errlen);
    if (rc < 0)
        return rc;
    n->cls = cls;
    /* HBM puts need no class lookup: a block size an HBM arena has no class
     * for (too many sizes) goes to host memory. */
    for (unsigned i = 0; i < NS_MAX_HBM_ARENAS; i++)
        if (i >= c->nhbm || arena_class_for(c->hbm[i].a, layout->block_bytes, &n->hbm_cls[i]) < 0)
            n->hbm_cls[i] = UINT32_MAX;
    n->clients++;
    if (created)
        log_info("namespace %u: deployment %s tp_rank %u/%u block_bytes %" PRIu64,
                 n->id, n->deployment_id, n->layout.tp_rank, n->layout.tp_size,
                 n->layout.block_bytes);
    cache_note_bound(c, n);
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
    size_t n = 0;
    for (uint32_t id = 0; id < c->narenas && n < max; id++, n++) {
        const arena *a = c->arenas[id];
        const struct cache_hbm *h = id == HOST_ARENA_ID ? NULL : &c->hbm[id - 1];
        out[n].id = arena_id(a);
        out[n].tier = arena_tier(a);
        out[n].device = arena_device(a);
        out[n].size = arena_size(a);
        out[n].fd = arena_fd(a);
        out[n].ipc_handle = h && h->ipc_len ? h->ipc : NULL;
        out[n].ipc_len = h ? h->ipc_len : 0;
        out[n].host_access = !h || h->host_access;
        out[n].pci_bus_id = h ? h->pci_bus_id : NULL;
    }
    return n;
}

void *cache_arena_base(const struct cache *c, uint32_t arena_no)
{
    if (arena_no >= c->narenas)
        return NULL;
    if (arena_no != HOST_ARENA_ID && !c->hbm[arena_no - 1].host_access)
        return NULL;
    return arena_base(c->arenas[arena_no]);
}

int cache_add_hbm(struct cache *c, struct devmem *dm, const struct devmem_region *r,
                  uint64_t slab_bytes, char *err, size_t errlen)
{
    struct cache_hbm *h;
    uint32_t id = c->narenas;
    int rc;

    if (c->nhbm >= DEVMEM_MAX_DEVICES || id >= INDEX_MAX_ARENAS) {
        errmsg_set(err, errlen, "too many HBM arenas (at most %u)", DEVMEM_MAX_DEVICES);
        return -KVNODE_ELIMIT;
    }
    h = &c->hbm[c->nhbm];
    memset(h, 0, sizeof *h);
    rc = arena_create_over(id, KVNODE_TIER_HBM, r->device, r->base, r->fd, r->size, slab_bytes,
                           &h->a, err, errlen);
    if (rc < 0)
        return rc;
    h->device = r->device;
    h->host_access = r->host_access;
    h->ipc_len = r->ipc_len <= sizeof h->ipc ? r->ipc_len : 0;
    memcpy(h->ipc, r->ipc_handle, h->ipc_len);
    snprintf(h->pci_bus_id, sizeof h->pci_bus_id, "%s", r->pci_bus_id);
    c->arenas[id] = h->a;
    c->narenas++;
    c->nhbm++;
    c->devmem = dm;
    return 0;
}

void *cache_host_base(const struct cache *c)
{
    return arena_base(c->host);
}

uint64_t cache_host_size(const struct cache *c)
{
    return arena_size(c->host);
}

void cache_set_copier(struct cache *c, struct copier *cp)
{
    c->copier = cp;
}

void cache_set_hostpin(struct cache *c, struct hostpin *hp)
{
    c->hostpin = hp;
}

uint32_t cache_cpu_arenas(const struct cache *c)
{
    uint32_t mask = 1u << HOST_ARENA_ID;
    for (unsigned i = 0; i < c->nhbm; i++)
        if (c->hbm[i].host_access)
            mask |= 1u << (i + 1);
    return mask;
}

/* --- entry lifecycle ------------------------------------------------------ */

static uint64_t ns_block_bytes(struct cache *c, uint32_t ns_id)
{
    kv_namespace *ns = ns_get(c->namespaces, ns_id);
    return ns ? ns->layout.block_bytes : 0;
}

static bool entry_has_slot(const index_entry *e)
{
    return e->state != ENTRY_GHOST;
}

static arena *cache_arena_of(struct cache *c, const index_entry *e)
{
    return e->arena < c->narenas ? c->arenas[e->arena] : NULL;
}

/* The daemon's address of a block (a device pointer for a real GPU's HBM). */
static void *cache_slot_ptr(struct cache *c, const index_entry *e)
{
    return (uint8_t *)arena_base(cache_arena_of(c, e)) + e->offset;
}

/* Give back an entry's slot, in whichever arena it is. */
static void cache_slot_free(struct cache *c, const index_entry *e)
{
    arena *a = cache_arena_of(c, e);
    if (a)
        arena_free(a, e->offset);
}

/* The HBM arena record of an entry, or NULL for host memory. */
static struct cache_hbm *cache_hbm_of(struct cache *c, const index_entry *e)
{
    return e->arena != HOST_ARENA_ID && e->arena < c->narenas ? &c->hbm[e->arena - 1] : NULL;
}

/* --- completeness (a key sealed in memory in every TP rank) ------------------ */

static bool cache_sealed_in(struct cache *c, const kv_namespace *ns, int64_t key)
{
    index_entry *e = index_lookup(c->index, ns->id, key);
    return e && e->state == ENTRY_SEALED;
}

/* Whether every other rank of ns's deployment holds key sealed in memory
 * (and every rank has a namespace). O(TP size). */
static bool cache_others_sealed(struct cache *c, const kv_namespace *ns, int64_t key)
{
    if (ns->ranks < ns->layout.tp_size)
        return false;
    for (const kv_namespace *o = ns->sibling; o != ns; o = o->sibling)
        if (!cache_sealed_in(c, o, key))
            return false;
    return true;
}

/* Whether every other rank of ns's deployment holds key in HBM (the key
 * complete). O(TP size). */
static bool cache_others_in_hbm(struct cache *c, const kv_namespace *ns, int64_t key)
{
    for (const kv_namespace *o = ns->sibling; o != ns; o = o->sibling) {
        index_entry *e = index_lookup(c->index, o->id, key);
        if (!e || e->tier != KVNODE_TIER_HBM)
            return false;
    }
    return true;
}

/* The medium of a complete key whose copy in ns is e. */
static int cache_key_medium(struct cache *c, const kv_namespace *ns, const index_entry *e)
{
    return e->tier == KVNODE_TIER_HBM && cache_others_in_hbm(c, ns, e->key) ? CACHE_MEDIUM_HBM
                                                                            : CACHE_MEDIUM_HOST;
}

/* e has just become SEALED in memory: the key may now be complete. */
static void cache_note_sealed(struct cache *c, const index_entry *e)
{
    kv_namespace *ns;
    if (!c->observer || !(ns = ns_get(c->namespaces, e->ns)))
        return;
    if (cache_others_sealed(c, ns, e->key))
        c->observer(c->observer_arg, ns, e->key, cache_key_medium(c, ns, e));
}

/* e (SEALED) is about to leave memory: a complete key stops being one. */
static void cache_note_leaving(struct cache *c, const index_entry *e)
{
    kv_namespace *ns;
    if (!c->observer || e->state != ENTRY_SEALED || !(ns = ns_get(c->namespaces, e->ns)))
        return;
    if (cache_others_sealed(c, ns, e->key))
        c->observer(c->observer_arg, ns, e->key, CACHE_MEDIUM_NONE);
}

/* e (SEALED) has just moved from HBM to host memory: a complete key whose
 * every copy was in HBM changes medium. */
static void cache_note_demoted(struct cache *c, const index_entry *e)
{
    kv_namespace *ns;
    if (!c->observer || e->state != ENTRY_SEALED || !(ns = ns_get(c->namespaces, e->ns)))
        return;
    if (cache_others_sealed(c, ns, e->key) && cache_others_in_hbm(c, ns, e->key))
        c->observer(c->observer_arg, ns, e->key, CACHE_MEDIUM_HOST);
}

/* A HELLO bound ns: tell when every rank of its deployment has a client. */
static void cache_note_bound(struct cache *c, const kv_namespace *ns)
{
    if (!c->dep_observer || ns->ranks < ns->layout.tp_size)
        return;
    for (const kv_namespace *o = ns->sibling; o != ns; o = o->sibling)
        if (o->clients == 0)
            return;
    c->dep_observer(c->observer_arg, ns);
}

void cache_set_block_observer(struct cache *c, cache_block_fn fn, cache_deployment_fn dep_fn,
                              void *arg)
{
    c->observer = fn;
    c->dep_observer = dep_fn;
    c->observer_arg = arg;
}

bool cache_key_complete(struct cache *c, const kv_namespace *ns, int64_t key)
{
    return cache_sealed_in(c, ns, key) && cache_others_sealed(c, ns, key);
}

/* The ring member that reports a deployment's keys: the lowest id. */
static const kv_namespace *cache_ring_leader(const kv_namespace *ns)
{
    const kv_namespace *best = ns;
    for (const kv_namespace *o = ns->sibling; o != ns; o = o->sibling)
        if (o->id < best->id)
            best = o;
    return best;
}

/* A chunked walk over the index reporting every complete key once. */
#define WALK_BUCKETS_PER_STEP 4096u
struct cache_walk {
    struct cache *c;
    struct index_walk iw;
    struct event *ev;
    cache_key_fn fn;
    void (*done)(void *arg);
    void *arg;
};

static void cache_walk_visit(void *arg, index_entry *e)
{
    struct cache_walk *w = arg;
    kv_namespace *ns;
    if (e->state != ENTRY_SEALED || !(ns = ns_get(w->c->namespaces, e->ns)))
        return;
    if (cache_ring_leader(ns) == ns && cache_others_sealed(w->c, ns, e->key))
        w->fn(w->arg, ns, e->key, cache_key_medium(w->c, ns, e));
}

static void cache_walk_step_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache_walk *w = arg;
    (void)fd;
    (void)what;
    /* One step per loop iteration: requests interleave with the walk. */
    if (index_walk_step(w->c->index, &w->iw, WALK_BUCKETS_PER_STEP, cache_walk_visit, w)) {
        event_active(w->ev, 0, 0);
        return;
    }
    void (*done)(void *) = w->done;
    void *darg = w->arg;
    event_free(w->ev);
    free(w);
    done(darg);
}

int cache_walk_complete(struct cache *c, cache_key_fn fn, void (*done)(void *arg), void *arg,
                        struct cache_walk **out)
{
    struct cache_walk *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w)
        return -KVNODE_ENOMEM;
    w->ev = event_new(c->base, -1, 0, cache_walk_step_cb, w);
    if (!w->ev) {
        free(w);
        return -KVNODE_ENOMEM;
    }
    w->c = c;
    w->fn = fn;
    w->done = done;
    w->arg = arg;
    index_walk_begin(c->index, &w->iw);
    event_active(w->ev, 0, 0);
    *out = w;
    return 0;
}

void cache_walk_cancel(struct cache *c, struct cache_walk *w)
{
    if (!w)
        return;
    index_walk_end(c->index, &w->iw);
    event_free(w->ev);
    free(w);
}

/* Forget an entry's accounting (it is leaving the index). */
static void cache_account_remove(struct cache *c, index_entry *e)
{
    kv_namespace *ns = ns_get(c->namespaces, e->ns);
    if (!ns)
        return;
    if (e->state == ENTRY_SEALED && ns->blocks > 0) {
        ns->blocks--;
        ns->bytes -= ns->layout.block_bytes;
    } else if (e->state == ENTRY_GHOST || e->state == ENTRY_PROMOTING) {
        if (ns->stored > 0)
            ns->stored--;
        if (c->ghosts > 0)
            c->ghosts--;
    }
}

static void cache_entry_destroy(struct cache *c, index_entry *e)
{
    if (entry_has_slot(e))
        cache_slot_free(c, e);
    index_entry_free(e);
}

/* Take an entry out of the index: freed now, or, while pinned (readers, a
 * store request), when the last pin goes. */
static void cache_remove_entry(struct cache *c, index_entry *e)
{
    cache_note_leaving(c, e);
    index_unlink(c->index, e);
    cache_account_remove(c, e);
    if (e->pins > 0)
        e->detached = 1;
    else
        cache_entry_destroy(c, e);
}

/* Drop an unpinned SEALED entry from memory and the index. */
static void cache_drop_entry(struct cache *c, index_entry *e)
{
    cache_note_leaving(c, e);
    index_unlink(c->index, e);
    cache_account_remove(c, e);
    cache_entry_destroy(c, e);
}

/* An unpinned SEALED entry the store holds leaves memory and stays indexed
 * as a ghost. */
static void cache_to_ghost(struct cache *c, index_entry *e)
{
    kv_namespace *ns = ns_get(c->namespaces, e->ns);
    cache_note_leaving(c, e);
    index_lru_remove(c->index, e);
    cache_slot_free(c, e);
    if (ns) {
        if (ns->blocks > 0) {
            ns->blocks--;
            ns->bytes -= ns->layout.block_bytes;
        }
        ns->stored++;
    }
    c->ghosts++;
    e->state = ENTRY_GHOST;
    e->evicting = 0;
    c->evicted_to_store++;
}

static void cache_count_unwritten(struct cache *c, const index_entry *e);

/* Free a victim's memory: keep it as a ghost when the store holds it. */
static void cache_evict_entry(struct cache *c, index_entry *e)
{
    if (c->persist && e->persist == PERSIST_STORED) {
        cache_to_ghost(c, e);
    } else {
        cache_count_unwritten(c, e);
        cache_drop_entry(c, e);
        c->evicted_dropped++;
    }
}

/* The last pin going (a read lease, a store write landing or failing, a
 * put's shield, a demotion given up) makes an HBM block movable again: an
 * arena whose demotion stopped for want of movable blocks goes on now, not
 * at the next put. (A commit, the other way in, schedules it itself.) */
static void cache_unpin(struct cache *c, index_entry *e)
{
    if (e->pins == 0)
        return;
    if (--e->pins > 0)
        return;
    if (e->detached) {
        cache_entry_destroy(c, e);
    } else if (e->state == ENTRY_SEALED) {
        index_lru_touch(c->index, e);
        if (cache_hbm_of(c, e) && !c->demote_building)
            cache_demote_maybe_schedule(c);
    }
}

static void cache_pin(struct cache *c, index_entry *e)
{
    if (e->pins++ == 0)
        index_lru_remove(c->index, e);
}

/* --- store operations: writes and deletes, in order per key ------------------- */

static bool cache_over(const struct cache *c, double watermark);
static void cache_evict_maybe_schedule(struct cache *c);
static void cache_retry_add(struct cache *c, const index_entry *e);

/* Write-back victims may pin at most this much of the host tier while they
 * are written (the rest stays evictable). */
static bool cache_write_budget(const struct cache *c, uint64_t bytes)
{
    return (double)(c->writing_bytes + bytes) <= WRITE_PIN_FRACTION * (double)arena_size(c->host);
}

/* Whether committed blocks are written to the store at all. */
static bool cache_persisting(const struct cache *c)
{
    return c->persist && c->policy != CONFIG_POLICY_OFF;
}

/* A block leaves memory: one the store never got a copy of is lost to
 * persistence, and counted as such (the README's contract). */
static void cache_count_unwritten(struct cache *c, const index_entry *e)
{
    if (cache_persisting(c) && e->persist != PERSIST_STORED)
        c->persist_dropped++;
}

static struct cache_storeop *cache_storeop_new(struct cache *c, int kind, kv_namespace *ns,
                                               size_t n)
{
    struct cache_storeop *op = calloc(1, sizeof *op + n * sizeof op->keys[0]);
    if (!op)
        return NULL;
    op->c = c;
    op->kind = kind;
    op->ns = ns;
    op->n = n;
    ns->refs++;
    return op;
}

static void cache_storeop_free(struct cache_storeop *op)
{
    op->ns->refs--;
    free(op);
}

static void cache_storeops_drain(struct cache *c);

/* A write's result, or -KVNODE_ESHUTDOWN when it ends without one (the block
 * was deleted before its turn, or the daemon stops). */
static void cache_write_finish(struct cache *c, struct cache_storeop *op, int rc)
{
    index_entry *e = op->e;
    uint64_t bb = op->ns->layout.block_bytes;
    bool detached = e->detached, evict = op->evicting;

    c->writing_bytes -= c->writing_bytes >= bb ? bb : c->writing_bytes;
    if (evict) {
        c->evicting_bytes -= c->evicting_bytes >= bb ? bb : c->evicting_bytes;
        e->evicting = 0;
    }
    /* The block is marked stored only by its own write: a delete or a
     * re-put since then has its own entry and its own, later, store op. */
    if (!detached) {
        e->persist = rc == 0 ? PERSIST_STORED : PERSIST_FAILED;
        if (rc < 0 && rc != -KVNODE_ESHUTDOWN)
            cache_retry_add(c, e);
    }
    cache_unpin(c, e);
    /* A write-back victim leaves memory now that its copy landed (or, if the
     * write failed, is dropped while memory is still tight). */
    if (!detached && evict && e->pins == 0 && e->state == ENTRY_SEALED) {
        if (rc == 0) {
            cache_to_ghost(c, e);
        } else if (cache_over(c, c->low_watermark)) {
            cache_count_unwritten(c, e);
            cache_drop_entry(c, e);
            c->evicted_dropped++;
        }
    }
}

/* An op is done with the store (or will never reach it): release its keys
 * (which starts each key's next op), then let queued ops and waiting puts
 * go on. */
static void cache_storeop_finish(struct cache_storeop *op, int rc)
{
    struct cache *c = op->c;

    if (op->kind == STORE_OP_WRITE) {
        cache_write_finish(c, op, rc);
        if (rc == 0)
            c->retry_backoff_ms = 0;   /* the store takes writes: retry failed ones now */
    }
    for (size_t i = 0; i < op->n; i++)
        keylock_release(c->keylocks, op->ns->id, op->keys[i]);
    cache_storeop_free(op);
    cache_storeops_drain(c);
    cache_evict_maybe_schedule(c);
    /* Puts waiting for room try again once per loop iteration, however
     * many ops finish in it. */
    if (c->put_waiters)
        event_active(c->put_wake_ev, 0, 0);
}

static void cache_storeop_done(void *arg, int rc)
{
    cache_storeop_finish(arg, rc);
}

/* Hand an op whose keys it holds to the store. 0 when sent (or finished:
 * a write of a block deleted meanwhile is not sent), -KVNODE_ELIMIT when the
 * store's queue is full (the op keeps its keys; the caller queues it). */
static int cache_storeop_send(struct cache_storeop *op)
{
    struct cache *c = op->c;
    int rc;

    if (op->kind == STORE_OP_DELETE) {
        rc = persist_delete(c->persist, op->ns, op->keys, op->n, cache_storeop_done, op);
    } else if (op->e->detached) {
        rc = -KVNODE_ESHUTDOWN;   /* deleted before its turn: nothing to write */
    } else {
        index_entry *e = op->e;
        struct cache_hbm *h = cache_hbm_of(c, e);
        /* An HBM block is copied out by the worker, never read by the loop. */
        if (h && c->devmem)
            rc = persist_write_device(c->persist, op->ns, e->key, cache_slot_ptr(c, e),
                                      op->ns->layout.block_bytes, c->devmem, h->device,
                                      cache_storeop_done, op);
        else
            rc = persist_write(c->persist, op->ns, e->key, cache_slot_ptr(c, e),
                               op->ns->layout.block_bytes, cache_storeop_done, op);
    }
    if (rc == -KVNODE_ELIMIT)
        return rc;
    if (rc < 0)
        cache_storeop_finish(op, rc);
    return 0;
}

static void cache_storeop_queue(struct cache *c, struct cache_storeop *op)
{
    op->next = NULL;
    if (c->queued_tail)
        c->queued_tail->next = op;
    else
        c->queued_head = op;
    c->queued_tail = op;
    c->queued_ops++;
    if (op->kind == STORE_OP_WRITE)
        c->writes_deferred++;
}

/* Send or queue an op that holds its keys. */
static void cache_storeop_go(struct cache *c, struct cache_storeop *op)
{
    /* Behind ops already waiting for the queue: the store sees them first. */
    if (c->queued_head || cache_storeop_send(op) == -KVNODE_ELIMIT)
        cache_storeop_queue(c, op);
}

/* Ops the store's queue refused, sent again, in order, as it drains. */
static void cache_storeops_drain(struct cache *c)
{
    if (c->draining)
        return;
    c->draining = true;
    while (c->queued_head) {
        struct cache_storeop *op = c->queued_head;
        c->queued_head = op->next;
        if (!c->queued_head)
            c->queued_tail = NULL;
        c->queued_ops--;
        if (cache_storeop_send(op) == -KVNODE_ELIMIT) {
            op->next = c->queued_head;
            c->queued_head = op;
            if (!c->queued_tail)
                c->queued_tail = op;
            c->queued_ops++;
            break;
        }
    }
    c->draining = false;
}

/* A waiting op's turn came: it holds its key now. */
static void cache_storeop_turn(struct keylock_waiter *w)
{
    struct cache_storeop *op = (struct cache_storeop *)w;
    cache_storeop_go(op->c, op);
}

/* Take op's (single) key and send it, or wait behind the key's earlier ops. */
static void cache_storeop_start(struct cache *c, struct cache_storeop *op)
{
    op->turn.start = cache_storeop_turn;
    int rc = keylock_acquire(c->keylocks, op->ns->id, op->keys[0], &op->turn);
    if (rc == 1)
        cache_storeop_go(c, op);
    else if (rc < 0)
        cache_storeop_finish(op, rc);   /* releases a key it does not hold: harmless */
}

/* Write a SEALED block to the store: it is pinned (in memory, off the LRU)
 * until the write's result is back, however long it waits for earlier ops
 * on its key or for room in the store's queue. */
static void cache_write_start(struct cache *c, index_entry *e, bool evicting)
{
    kv_namespace *ns = ns_get(c->namespaces, e->ns);
    struct cache_storeop *op = ns ? cache_storeop_new(c, STORE_OP_WRITE, ns, 1) : NULL;

    if (!op) {
        e->persist = PERSIST_FAILED;
        cache_retry_add(c, e);
        return;
    }
    op->e = e;
    op->keys[0] = e->key;
    op->evicting = evicting;
    e->persist = PERSIST_WRITING;
    cache_pin(c, e);
    c->writing_bytes += ns->layout.block_bytes;
    if (evicting) {
        e->evicting = 1;
        c->evicting_bytes += ns->layout.block_bytes;
        c->writeback_started++;
    }
    cache_storeop_start(c, op);
}

/* Delete keys from the store, each after the ops on it that came before:
 * the keys free now go in one request, the others one by one in turn. */
static void cache_store_delete(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n)
{
    struct cache_storeop *batch = cache_storeop_new(c, STORE_OP_DELETE, ns, n);

    if (!batch) {
        log_warn("out of memory deleting %zu keys from the store: their copies stay", n);
        return;
    }
    batch->n = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = keylock_acquire(c->keylocks, ns->id, keys[i], NULL);
        if (rc == 1) {
            batch->keys[batch->n++] = keys[i];
            continue;
        }
        struct cache_storeop *one = rc == 0 ? cache_storeop_new(c, STORE_OP_DELETE, ns, 1) : NULL;
        if (!one) {
            log_warn("out of memory deleting a key from the store: its copy stays");
            continue;
        }
        one->keys[0] = keys[i];
        cache_storeop_start(c, one);   /* busy: waits for its turn */
    }
    if (batch->n == 0)
        cache_storeop_free(batch);
    else
        cache_storeop_go(c, batch);
}

/* --- retries of failed writes ------------------------------------------------------ */

#define RETRY_FIRST_MS 500u
#define RETRY_MAX_MS   10000u
#define RETRY_BATCH    256u

static void cache_retry_arm(struct cache *c)
{
    if (!c->retry_ev || evtimer_pending(c->retry_ev, NULL))
        return;
    struct timeval tv = clock_tv_ms(c->retry_backoff_ms ? c->retry_backoff_ms : RETRY_FIRST_MS);
    evtimer_add(c->retry_ev, &tv);
}

static void cache_retry_add(struct cache *c, const index_entry *e)
{
    struct cache_retry *r = malloc(sizeof *r);
    if (!r)
        return;   /* it stays FAILED: written only if the evictor or a flush picks it */
    r->ns = e->ns;
    r->key = e->key;
    r->next = NULL;
    if (c->retry_tail)
        c->retry_tail->next = r;
    else
        c->retry_head = r;
    c->retry_tail = r;
    c->retry_pending++;
    cache_retry_arm(c);
}

/* Write again up to a batch of the blocks whose write failed and that are
 * still in memory; back off (doubling) while writes keep failing. */
static void cache_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    unsigned sent = 0;
    (void)fd;
    (void)what;

    while (c->retry_head && sent < RETRY_BATCH) {
        struct cache_retry *r = c->retry_head;
        c->retry_head = r->next;
        if (!c->retry_head)
            c->retry_tail = NULL;
        c->retry_pending--;
        index_entry *e = index_lookup(c->index, r->ns, r->key);
        free(r);
        if (!e || e->state != ENTRY_SEALED || e->persist != PERSIST_FAILED || !cache_persisting(c))
            continue;
        c->write_retries++;
        cache_write_start(c, e, false);
        sent++;
    }
    if (sent == 0 && !c->retry_head) {
        /* Nothing failed is left in memory: the store's health is its probe's call. */
        persist_write_failures_settled(c->persist);
        c->retry_backoff_ms = 0;
        return;
    }
    uint64_t b = c->retry_backoff_ms ? c->retry_backoff_ms * 2 : RETRY_FIRST_MS;
    c->retry_backoff_ms = b > RETRY_MAX_MS ? RETRY_MAX_MS : b;
    if (c->retry_head)
        cache_retry_arm(c);
}

/* --- eviction ------------------------------------------------------------- */

static bool cache_over(const struct cache *c, double watermark)
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

static void cache_evict_maybe_schedule(struct cache *c)
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
static void cache_evict_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    (void)fd;
    (void)what;
    c->evict_scheduled = false;
    for (unsigned i = 0; i < EVICT_BATCH; i++) {
        if (!cache_over_after_writeback(c, c->low_watermark))
            return;
        index_entry *victim = index_lru_oldest_in_arena(c->index, arena_id(c->host));
        if (!victim)
            return;
        if (cache_persisting(c) && victim->persist != PERSIST_STORED) {
            /* Written first, leaves memory when the write lands. Over the
             * write budget: wait for writes to land (each one schedules the
             * evictor again) rather than drop the block. */
            if (!cache_write_budget(c, ns_block_bytes(c, victim->ns)))
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

/* --- demotion (HBM -> host) ------------------------------------------------------ */

/* Over the watermark once the blocks being moved out have left. */
static bool cache_hbm_over(const struct cache_hbm *h, double watermark)
{
    struct arena_stats st;
    arena_get_stats(h->a, &st);
    uint64_t used = st.used_bytes > h->moving_bytes ? st.used_bytes - h->moving_bytes : 0;
    return (double)used > watermark * (double)st.capacity;
}

/* Demotion starts past the high watermark and goes on down to the low one. */
static bool cache_hbm_wants_batch(const struct cache *c, struct cache_hbm *h)
{
    if (cache_hbm_over(h, c->hbm_high))
        h->demoting = true;
    else if (!cache_hbm_over(h, c->hbm_low))
        h->demoting = false;
    return h->demoting && h->inflight < DEMOTE_INFLIGHT;
}

static void cache_demote_maybe_schedule(struct cache *c)
{
    if (c->demote_scheduled || !c->copier)
        return;
    for (unsigned i = 0; i < c->nhbm; i++) {
        if (cache_hbm_wants_batch(c, &c->hbm[i])) {
            c->demote_scheduled = true;
            event_active(c->demote_ev, 0, 0);
            return;
        }
    }
}

static bool cache_make_room(struct cache *c, uint32_t cls);

/* A batch came back: each block whose copy landed and that nobody pinned
 * or deleted meanwhile now lives in its host slot; any other keeps its
 * HBM slot and the host slot goes back. */
static void cache_demote_done(struct copier_batch *b)
{
    struct cache_demote *d = b->arg;
    struct cache *c = d->c;
    struct cache_hbm *h = &c->hbm[d->hbm];

    if (b->rc < 0 && b->rc != -KVNODE_ESHUTDOWN)
        log_warn("demotion of %zu blocks from GPU %d failed: %s (they stay in HBM)", b->n,
                 h->device, b->why);
    for (size_t i = 0; i < b->n; i++) {
        struct demote_rec *r = &d->recs[i];
        index_entry *e = r->e;
        h->moving_bytes -= h->moving_bytes >= r->stride ? r->stride : h->moving_bytes;
        if (b->rc == 0 && !e->detached && e->pins == 1 && e->state == ENTRY_SEALED) {
            arena_free(h->a, e->offset);
            e->tier = KVNODE_TIER_HOST;
            e->arena = arena_id(c->host);
            e->cls = r->host_cls;
            e->offset = r->host_off;
            cache_note_demoted(c, e);
            c->demoted++;
            c->demoted_bytes += b->items[i].len;
        } else {
            arena_free(c->host, r->host_off);
            if (b->rc < 0)
                c->demote_failed++;
            else
                c->demote_aborted++;
        }
        cache_unpin(c, e);
    }
    h->inflight--;
    free(d->recs);
    free(b->items);
    free(d);
    cache_evict_maybe_schedule(c);
    cache_demote_maybe_schedule(c);
}

static int demote_rec_by_offset(const void *a, const void *b)
{
    uint64_t x = ((const struct demote_rec *)a)->e->offset, y = ((const struct demote_rec *)b)->e->offset;
    return x < y ? -1 : x > y;
}

/* Build and submit one batch of h's least recently used unpinned blocks,
 * up to hbm.copy_batch_bytes or until h is below its low watermark. The
 * victims get host slots in the order of their HBM offsets, so that runs
 * adjacent in both arenas become one transfer. A victim the host tier has
 * no room for leaves memory (a ghost when the store holds it). true when
 * it submitted a batch or dropped victims (call again while over the
 * watermark), false when nothing more can be done for h now. */
static bool cache_demote_batch(struct cache *c, unsigned hi)
{
    struct cache_hbm *h = &c->hbm[hi];
    size_t cap = 64, n = 0, kept = 0;
    uint64_t bytes = 0;
    bool dropped = false;
    struct cache_demote *d = calloc(1, sizeof *d);
    struct demote_rec *recs = malloc(cap * sizeof *recs);
    struct copier_item *items = NULL;

    if (!d || !recs)
        goto out;
    /* The victims, pinned: off the LRU, alive until the batch is back. */
    while (bytes < c->hbm_batch_bytes && cache_hbm_over(h, c->hbm_low)) {
        index_entry *e = index_lru_oldest_in_arena(c->index, arena_id(h->a));
        if (!e)
            break;
        if (n == cap) {
            struct demote_rec *nr = realloc(recs, 2 * cap * sizeof *recs);
            if (!nr)
                break;
            recs = nr;
            cap *= 2;
        }
        recs[n].e = e;
        recs[n].stride = arena_class_stride(h->a, e->cls);
        cache_pin(c, e);
        h->moving_bytes += recs[n].stride;
        bytes += ns_block_bytes(c, e->ns);
        n++;
    }
    qsort(recs, n, sizeof *recs, demote_rec_by_offset);
    items = malloc((n ? n : 1) * sizeof *items);
    for (size_t i = 0; i < n; i++) {
        index_entry *e = recs[i].e;
        kv_namespace *ns = ns_get(c->namespaces, e->ns);
        uint64_t off;
        if (!items || !ns || !cache_make_room(c, ns->cls) || arena_alloc(c->host, ns->cls, &off) < 0) {
            h->moving_bytes -= recs[i].stride;
            cache_unpin(c, e);
            if (items) {
                cache_evict_entry(c, e);
                c->demote_dropped++;
                dropped = true;
            }
            continue;
        }
        recs[kept] = recs[i];
        recs[kept].host_off = off;
        recs[kept].host_cls = ns->cls;
        items[kept].dst = (uint8_t *)arena_base(c->host) + off;
        items[kept].src = cache_slot_ptr(c, e);
        items[kept].len = ns->layout.block_bytes;
        kept++;
    }
    if (kept == 0)
        goto out;   /* dropping victims was progress too: the caller goes on */
    d->c = c;
    d->hbm = hi;
    d->recs = recs;
    d->b.device = h->device;
    d->b.n = kept;
    d->b.items = items;
    d->b.done = cache_demote_done;
    d->b.arg = d;
    if (copier_submit(c->copier, &d->b) == 0) {
        h->inflight++;
        return true;
    }
    /* The queue is full: put everything back; a finishing batch retries. */
    for (size_t i = 0; i < kept; i++) {
        h->moving_bytes -= recs[i].stride;
        arena_free(c->host, recs[i].host_off);
        cache_unpin(c, recs[i].e);
    }
out:
    free(d);
    free(items);
    free(recs);
    return dropped;
}

static void cache_demote_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    (void)fd;
    (void)what;
    c->demote_scheduled = false;
    if (!c->copier)
        return;
    /* One batch per device per call: other events run between batches.
     * Victims a batch puts back (the copier's queue is full, no memory)
     * wait for a finishing batch rather than rescheduling this at once. */
    bool more = false;
    c->demote_building = true;
    for (unsigned i = 0; i < c->nhbm; i++)
        if (cache_hbm_wants_batch(c, &c->hbm[i]) && cache_demote_batch(c, i))
            more = true;
    c->demote_building = false;
    cache_evict_maybe_schedule(c);
    if (more)
        cache_demote_maybe_schedule(c);
}

/* Make one slot of class cls allocatable: evict the class's own oldest
 * blocks first (frees a slot directly), else the arena's oldest until a
 * whole slab comes free. A request cannot wait for a write, so victims the
 * store does not hold are dropped here (the background evictor keeps this
 * rare by working from the high watermark). */
static bool cache_make_room(struct cache *c, uint32_t cls)
{
    while (!arena_can_alloc(c->host, cls)) {
        index_entry *victim = index_lru_oldest(c->index, arena_id(c->host), cls);
        if (!victim)
            victim = index_lru_oldest_in_arena(c->index, arena_id(c->host));
        if (!victim)
            return false;
        cache_evict_entry(c, victim);
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

void cache_set_persist(struct cache *c, struct persist *p)
{
    c->persist = p;
}

static bool cache_may_lookup(const struct cache *c)
{
    return c->persist && persist_lookup_on_miss(c->persist);
}

/* The prefix held in some tier, tallied per tier; *miss = the entry that
 * ended it (NULL: absent or the end). */
static size_t cache_match_scan(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n,
                               struct cache_tiers *t, index_entry **miss)
{
    size_t i;
    memset(t, 0, sizeof *t);
    *miss = NULL;
    for (i = 0; i < n; i++) {
        index_entry *e = index_lookup(c->index, ns->id, keys[i]);
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
 * tail-first (the lookups hit the lines the scan just loaded). */
static void cache_match_touch(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t m)
{
    for (size_t j = m; j-- > 0;) {
        index_entry *e = index_lookup(c->index, ns->id, keys[j]);
        if (e && e->state == ENTRY_SEALED && e->pins == 0)
            index_lru_touch(c->index, e);
    }
}

void cache_match_tiers(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n,
                       struct cache_tiers *out)
{
    index_entry *miss;
    size_t m = cache_match_scan(c, ns, keys, n, out, &miss);
    cache_count_keys(c, n, m, miss);
    cache_match_touch(c, ns, keys, m);
}

size_t cache_match(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n)
{
    struct cache_tiers t;
    cache_match_tiers(c, ns, keys, n, &t);
    return t.matched;
}

/* --- deferred answers -------------------------------------------------------- */

static void cache_wait_free(struct cache_wait *w)
{
    if (w->on_heap && w->ns)
        w->ns->refs--;
    if (w->timer)
        event_free(w->timer);
    free((void *)w->keys);
    free(w);
}

static void cache_wait_answer(struct cache_wait *w)
{
    if (w->answered)
        return;
    w->answered = true;
    if (w->timer)
        evtimer_del(w->timer);
    if (!w->finished)
        w->ready(w->arg);
}

/* A store request of w's came back. */
static void cache_wait_progress(struct cache_wait *w)
{
    if (w->outstanding > 0)
        w->outstanding--;
    if (w->outstanding > 0)
        return;
    if (w->finished)
        cache_wait_free(w);
    else
        cache_wait_answer(w);
}

static void cache_wait_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache_wait *w = arg;
    (void)fd;
    (void)what;
    w->c->wait_timeouts++;
    log_debug("a %s waited %u ms for the store; answering with what is ready",
              w->kind == WAIT_GET ? "get" : "match", w->c->request_timeout_ms);
    cache_wait_answer(w);
}

/* Move a wait built on the stack to the heap before anything refers to it. */
static struct cache_wait *cache_wait_heap(struct cache_wait *w)
{
    struct cache_wait *h;
    int64_t *keys;

    if (w->on_heap)
        return w;
    h = malloc(sizeof *h);
    keys = malloc((w->n ? w->n : 1) * sizeof *keys);
    if (!h || !keys) {
        free(h);
        free(keys);
        return NULL;
    }
    memcpy(keys, w->keys, w->n * sizeof *keys);
    *h = *w;
    h->keys = keys;
    h->on_heap = true;
    h->ns->refs++;   /* a cancelled wait may outlive its requester's binding */
    if (h->l)
        h->l->waiter = h;
    return h;
}

/* Start the timer of a wait that goes on after its start call. Without one
 * (out of memory) it answers when the store's own timeouts end its requests. */
static void cache_wait_arm(struct cache *c, struct cache_wait *w)
{
    struct timeval tv;
    w->timer = evtimer_new(c->base, cache_wait_timeout_cb, w);
    c->waits++;
    if (!w->timer) {
        log_warn("cannot arm a deferred answer's timer: it waits for the store's timeouts");
        return;
    }
    tv = clock_tv_ms(c->request_timeout_ms);
    evtimer_add(w->timer, &tv);
}

static void cache_put_waiter_unlink(struct cache *c, struct cache_wait *w);

void cache_wait_cancel(struct cache *c, struct cache_wait *w)
{
    if (!w)
        return;
    if (w->kind == WAIT_PUT)
        cache_put_waiter_unlink(c, w);
    w->finished = true;
    if (w->timer)
        evtimer_del(w->timer);
    if (w->l) {
        w->l->waiter = NULL;
        w->l = NULL;
    }
    if (w->outstanding == 0)
        cache_wait_free(w);
}

/* --- lookups of keys the index does not know ---------------------------------- */

/* Index as ghosts the keys the store reported, up to the first it lacks. */
static size_t cache_index_found(struct cache *c, kv_namespace *ns, const int64_t *keys,
                                const uint8_t *present, size_t n)
{
    size_t i;
    for (i = 0; i < n && present[i]; i++) {
        if (index_lookup(c->index, ns->id, keys[i]))
            continue;
        index_entry *e = index_insert(c->index, ns->id, keys[i]);
        if (!e)
            break;
        e->state = ENTRY_GHOST;
        e->tier = KVNODE_TIER_HOST;
        e->arena = UINT32_MAX;
        e->persist = PERSIST_STORED;
        ns->stored++;
        c->ghosts++;
    }
    return i;
}

static void cache_get_walk(struct cache *c, struct cache_wait **wp);

static void cache_lookup_done(void *arg, int rc)
{
    struct cache_lookup *lk = arg;
    struct cache_wait *w = lk->w;
    struct cache *c = w->c;

    if (rc == 0)
        c->lookup_found += cache_index_found(c, w->ns, lk->keys, lk->present, lk->n);
    free(lk);
    /* A GET goes on walking with what the lookup found (promotions). */
    if (rc == 0 && w->kind == WAIT_GET && !w->answered && !w->finished)
        cache_get_walk(c, &w);
    cache_wait_progress(w);
}

/* Ask the store about keys[from..n). 0 when submitted (w counts it). */
static int cache_lookup_submit(struct cache *c, struct cache_wait *w, size_t from)
{
    size_t n = w->n - from;
    struct cache_lookup *lk = malloc(sizeof *lk + n);
    if (!lk)
        return -KVNODE_ENOMEM;
    lk->w = w;
    lk->keys = (int64_t *)w->keys + from;
    lk->n = n;
    if (persist_exists(c->persist, w->ns, lk->keys, n, lk->present, cache_lookup_done, lk) < 0) {
        free(lk);
        return -KVNODE_ELIMIT;
    }
    w->looked_up = true;
    w->outstanding++;
    c->lookups++;
    return 0;
}

int cache_match_start(struct cache *c, kv_namespace *ns, const int64_t *keys, size_t n,
                      struct cache_tiers *out, cache_ready_fn ready, void *arg,
                      struct cache_wait **wait)
{
    index_entry *miss;
    size_t m = cache_match_scan(c, ns, keys, n, out, &miss);

    *wait = NULL;
    if (m < n && !miss && ready && cache_may_lookup(c)) {
        struct cache_wait tmp = { .c = c, .kind = WAIT_MATCH, .ns = ns, .keys = keys, .n = n,
                                  .ready = ready, .arg = arg };
        struct cache_wait *w = cache_wait_heap(&tmp);
        if (w && cache_lookup_submit(c, w, m) == 0) {
            cache_wait_arm(c, w);
            *wait = w;
            return CACHE_WAITING;
        }
        if (w)
            cache_wait_free(w);
    }
    cache_count_keys(c, n, m, miss);
    cache_match_touch(c, ns, keys, m);
    return 0;
}

void cache_match_finish(struct cache *c, struct cache_wait *w, struct cache_tiers *out)
{
    index_entry *miss;
    size_t m = cache_match_scan(c, w->ns, w->keys, w->n, out, &miss);
    cache_count_keys(c, w->n, m, miss);
    cache_match_touch(c, w->ns, w->keys, m);
    cache_wait_cancel(c, w);
}

/* --- promotions ------------------------------------------------------------- */

static void cache_promo_done(void *arg, int rc)
{
    struct cache_promo *p = arg;
    struct cache *c = p->c;
    index_entry *e = p->e;
    kv_namespace *ns = p->ns;
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
static int cache_promote(struct cache *c, kv_namespace *ns, index_entry *e)
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
    if (persist_read(c->persist, ns, e->key, (uint8_t *)arena_base(c->host) + off,
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

static int cache_promo_wait(struct cache_wait *w, index_entry *e)
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

/* --- puts waiting for the store (back-pressure) ------------------------------ */

static void cache_put_waiter_unlink(struct cache *c, struct cache_wait *w)
{
    if (!w->put_prev && c->put_waiters != w)
        return;   /* not linked (woken already) */
    if (w->put_prev)
        w->put_prev->put_next = w->put_next;
    else
        c->put_waiters = w->put_next;
    if (w->put_next)
        w->put_next->put_prev = w->put_prev;
    else
        c->put_waiters_tail = w->put_prev;
    w->put_prev = w->put_next = NULL;
}

static void cache_put_wait_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache_wait *w = arg;
    (void)fd;
    (void)what;
    w->c->put_wait_timeouts++;
    cache_put_waiter_unlink(w->c, w);
    cache_wait_answer(w);
}

int cache_put_wait(struct cache *c, unsigned timeout_ms, cache_ready_fn ready, void *arg,
                   struct cache_wait **wait)
{
    struct cache_wait *w = calloc(1, sizeof *w);
    struct timeval tv = clock_tv_ms(timeout_ms);

    *wait = NULL;
    if (!w)
        return -KVNODE_ENOMEM;
    w->timer = evtimer_new(c->base, cache_put_wait_timeout_cb, w);
    if (!w->timer) {
        free(w);
        return -KVNODE_ENOMEM;
    }
    w->c = c;
    w->kind = WAIT_PUT;
    w->on_heap = true;
    w->ready = ready;
    w->arg = arg;
    w->put_prev = c->put_waiters_tail;
    if (c->put_waiters_tail)
        c->put_waiters_tail->put_next = w;
    else
        c->put_waiters = w;
    c->put_waiters_tail = w;
    evtimer_add(w->timer, &tv);
    c->put_waits++;
    *wait = w;
    return 0;
}

/* Store ops finished: blocks they pinned may be evictable now, so every put
 * waiting for room tries again (those that arrive meanwhile wait for the
 * next one). */
static void cache_put_wake_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    struct cache_wait *last = c->put_waiters_tail;
    (void)fd;
    (void)what;
    while (c->put_waiters) {
        struct cache_wait *w = c->put_waiters;
        bool was_last = w == last;   /* w may be freed by its answer */
        cache_put_waiter_unlink(c, w);
        cache_wait_answer(w);
        if (was_last)
            break;
    }
}

/* --- get ---------------------------------------------------------------------- */

static int cache_check_lease_room(struct cache *c, struct lease_list *owner, char *err, size_t errlen)
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
static void cache_get_walk(struct cache *c, struct cache_wait **wp)
{
    struct cache_wait *w = *wp;

    while (w->next < w->n) {
        size_t i = w->next;
        index_entry *e = index_lookup(c->index, w->ns->id, w->keys[i]);

        if (!e) {
            if (w->may_wait && !w->looked_up && cache_may_lookup(c)) {
                struct cache_wait *h = cache_wait_heap(w);
                if (h) {
                    *wp = w = h;
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
                                c->read_ttl_ms, w->n);
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
    lease *l = w->l;
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
    cache_count_keys(c, w->n, m, m < w->n ? index_lookup(c->index, w->ns->id, w->keys[m]) : NULL);
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

int cache_get_start(struct cache *c, kv_namespace *ns, struct lease_list *owner, uint32_t readable,
                    const int64_t *keys, size_t n, uint64_t *lease_id, struct cache_loc *locs,
                    size_t *got, char *err, size_t errlen, cache_ready_fn ready, void *arg,
                    struct cache_wait **wait)
{
    struct cache_wait tmp = { .c = c, .kind = WAIT_GET, .ns = ns, .keys = keys, .n = n,
                              .owner = owner, .may_wait = ready != NULL && c->persist != NULL,
                              .readable = readable | (1u << HOST_ARENA_ID),
                              .ready = ready, .arg = arg };
    struct cache_wait *w = &tmp;
    index_entry *first;
    int rc;

    *lease_id = 0;
    *got = 0;
    *wait = NULL;
    first = n ? index_lookup(c->index, ns->id, keys[0]) : NULL;
    if (n == 0 || (first && first->state == ENTRY_WRITING) ||
        (!first && !(tmp.may_wait && cache_may_lookup(c))) ||
        (first && first->state != ENTRY_SEALED && !tmp.may_wait)) {
        cache_count_keys(c, n, 0, first);
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

int cache_get_begin(struct cache *c, kv_namespace *ns, struct lease_list *owner,
                    const int64_t *keys, size_t n, uint64_t *lease_id,
                    struct cache_loc *locs, size_t *got, char *err, size_t errlen)
{
    struct cache_wait *w;
    return cache_get_start(c, ns, owner, owner->mapped, keys, n, lease_id, locs, got, err, errlen,
                           NULL, NULL, &w);
}

static void cache_unreserve(struct cache *c, kv_namespace *ns, struct lease_list *owner,
                            index_entry *e);

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
    /* HBM when asked for and the owner's device has an arena with a free
     * slot now (demotion keeps room there); host memory otherwise. */
    arena *ha = NULL;
    uint32_t hcls = 0;
    if (tier == KVNODE_TIER_HBM && owner->put_arena != HOST_ARENA_ID &&
        owner->put_arena < c->narenas &&
        (hcls = ns->hbm_cls[owner->put_arena - 1]) != UINT32_MAX)
        ha = c->arenas[owner->put_arena];
    for (size_t i = 0; i < n; i++) {
        index_entry *e = index_lookup(c->index, ns->id, keys[i]);
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
        char lim[32], held[32];
        cache_format_size(limit, lim, sizeof lim);
        cache_format_size(owner->reserved_bytes, held, sizeof held);
        errmsg_set(err, errlen, "this connection would hold more than %s of uncommitted put "
                   "reservations (leases.max_reserved_per_client = %.3g of the memory tiers): it holds "
                   "%s and asks for %zu blocks of %" PRIu64 " bytes; commit or abort puts first, "
                   "or put fewer blocks at once", lim, c->max_reserved_per_client, held, need,
                   ns->layout.block_bytes);
        c->reservations_refused++;
        return -KVNODE_ELIMIT;
    }
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
        e = index_lookup(c->index, ns->id, keys[i]);
        if (e && e->state != ENTRY_GHOST) {
            locs[i].present = false;  /* duplicate key earlier in this request */
            continue;
        }
        if (!cache_quota_room(c, ns))
            goto overquota;
        bool in_hbm = ha && arena_alloc(ha, hcls, &off) == 0;
        if (!in_hbm && (!cache_make_room(c, ns->cls) || arena_alloc(c->host, ns->cls, &off) < 0))
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
    cache_put_shield(c, ns, keys, n, locs, false);
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
        index_entry *e = l->entries[i];
        if (!e)
            continue;
        cache_unreserve(c, ns, owner, e);
    }
    cache_put_shield(c, ns, keys, n, locs, false);
    lease_destroy(c->leases, l);
    (void)reserved;
    return rc;
}

/* Give back a WRITING entry's slot: a former ghost becomes a ghost again,
 * anything else leaves the index. */
/* A reserved slot stops being a reservation (committed or given back): both
 * its namespace's and its connection's counts go down. */
static void cache_reservation_end(kv_namespace *ns, struct lease_list *owner)
{
    uint64_t bytes = ns ? ns->layout.block_bytes : 0;
    if (ns)
        ns->reserved -= ns->reserved >= bytes ? bytes : ns->reserved;
    if (owner)
        owner->reserved_bytes -= owner->reserved_bytes >= bytes ? bytes : owner->reserved_bytes;
}

static void cache_unreserve(struct cache *c, kv_namespace *ns, struct lease_list *owner,
                            index_entry *e)
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

/* End a lease's hold on its entries. */
static uint32_t cache_lease_finish(struct cache *c, lease *l, bool commit)
{
    uint32_t count = 0;

    if (l->waiter) {
        /* Reaped or released under a deferred answer: it answers empty. */
        ((struct cache_wait *)l->waiter)->l = NULL;
        l->waiter = NULL;
    }
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
            }
            cache_reservation_end(ns, l->owner);
            c->sealed_total++;
            count++;
            cache_note_sealed(c, e);
            /* write_through: pinned until its write lands (see cache.h). */
            if (c->persist && c->policy == CONFIG_POLICY_WRITE_THROUGH &&
                e->persist == PERSIST_NONE)
                cache_write_start(c, e, false);
        }
    } else {
        kv_namespace *ns = ns_get(c->namespaces, l->ns);
        for (size_t i = 0; i < l->n; i++) {
            index_entry *e = l->entries[i];
            if (!e)
                continue;
            cache_unreserve(c, ns, l->owner, e);
            count++;
        }
    }
    lease_destroy(c->leases, l);
    /* Blocks it pinned or sealed may be demotable now: an HBM arena left
     * over its watermark by pinned blocks drains without waiting for a put. */
    cache_demote_maybe_schedule(c);
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
        if (!e || e->state == ENTRY_WRITING)
            continue;
        /* Pinned (readers, a store request): freed when the last pin goes. */
        cache_remove_entry(c, e);
        (*deleted)++;
    }
    /* The store may hold keys the index does not know (shared stores):
     * every key goes to its delete, after any write of the key in flight
     * and before any later re-put's write (keylock). A store that cannot
     * delete (v6d) gets tombstones now, so no lookup brings the keys back. */
    if (c->persist && n > 0) {
        persist_hide(c->persist, ns, keys, n);
        cache_store_delete(c, ns, keys, n);
    }
    return 0;
}

void cache_release_owner(struct cache *c, struct lease_list *owner)
{
    while (owner->head)
        cache_lease_finish(c, owner->head, false);
}

int cache_persist_flush(struct cache *c, unsigned timeout_ms)
{
    uint64_t deadline = clock_now_ms() + timeout_ms;
    size_t queued = 0;

    if (!c->persist || c->policy != CONFIG_POLICY_WRITE_BACK)
        return 0;
    /* Everything unpinned leaves memory, oldest first: a block the store
     * holds becomes a ghost at once, the others are written first (and
     * leave when their write lands). */
    for (;;) {
        index_entry *e = index_lru_oldest_in_arena(c->index, arena_id(c->host));
        if (!e)
            break;
        if (e->persist == PERSIST_STORED) {
            cache_to_ghost(c, e);
            continue;
        }
        /* Not written yet, or its write failed: (again) now. Writes the
         * store's queue cannot take yet wait in order (pinned) and are sent
         * as it drains. */
        cache_write_start(c, e, true);
        queued++;
    }
    uint64_t now = clock_now_ms();
    int rc = persist_drain(c->persist, now < deadline ? (unsigned)(deadline - now) : 0);
    log_info("shutdown: write_back flush handed %zu blocks to the store%s", queued,
             rc < 0 ? "; some were not written in time" : "");
    return rc;
}

/* --- recovery ------------------------------------------------------------------ */

/* The namespace of a layout found in the store, registered if new. NULL
 * when it cannot be (invalid, conflicting, too many, block too big). */
static kv_namespace *cache_ns_for_found(struct cache *c, const struct kvs_found *f)
{
    kv_namespace *ns = NULL;
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
    kv_namespace *ns = NULL;
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
        index_entry *e = index_lookup(c->index, ns->id, f->key);
        if (e) {
            /* Put again since the start: the store's copy is the same block. */
            if (e->state == ENTRY_SEALED && e->persist == PERSIST_NONE)
                e->persist = PERSIST_STORED;
            continue;
        }
        e = index_insert(c->index, ns->id, f->key);
        if (!e) {
            c->recovery_skipped++;
            continue;
        }
        e->state = ENTRY_GHOST;
        e->tier = KVNODE_TIER_HOST;
        e->arena = UINT32_MAX;
        e->persist = PERSIST_STORED;
        ns->stored++;
        c->ghosts++;
        c->recovered++;
    }
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

/* "persist": the store's state, its queue, what went through it, failures by
 * op and kind, promotions, lookups, deferred answers and recovery. */
static void cache_persist_stats(struct cache *c, struct cache_persist_stats *o)
{
    static const char *const policies[] = { "write_through", "write_back", "off" };

    memset(o, 0, sizeof *o);
    if (!c->persist)
        return;
    o->on = true;
    persist_get_counters(c->persist, &o->store);
    o->backend = persist_backend_name(c->persist);
    o->policy = c->policy >= 0 && c->policy <= 2 ? policies[c->policy] : "?";
    o->last_error = persist_last_error(c->persist);
    o->lookup_on_miss = persist_lookup_on_miss(c->persist);
    o->dropped = c->persist_dropped;
    o->writes_deferred = c->writes_deferred;
    o->writes_waiting = c->queued_ops;
    o->pinned_for_writes_bytes = c->writing_bytes;
    o->write_retries = c->write_retries;
    o->retry_pending = c->retry_pending;
    o->put_waits = c->put_waits;
    o->put_wait_timeouts = c->put_wait_timeouts;
    o->promotions = c->promotions;
    o->promotions_ok = c->promotions_ok;
    o->promotions_failed = c->promotions_failed;
    o->lookups = c->lookups;
    o->lookup_found = c->lookup_found;
    o->waits = c->waits;
    o->wait_timeouts = c->wait_timeouts;
    o->recovered = c->recovered;
    o->recovery_skipped = c->recovery_skipped;
    if (o->store.scan_started_ms) {
        uint64_t end = o->store.scan_finished_ms ? o->store.scan_finished_ms : clock_now_ms();
        o->has_recovery_seconds = true;
        o->recovery_seconds = (double)(end - o->store.scan_started_ms) / 1000.0;
    }
}

/* Host-arena pinning: pinned (the whole arena is), pinned_bytes so far,
 * pin_state (off, running, done, failed, stopped), pin_error. */
static void cache_pin_stats(struct cache *c, struct cache_stats *out)
{
    static const char *const states[] = { "running", "done", "failed", "stopped" };
    struct hostpin_progress pp = { .state = -1 };

    if (c->hostpin)
        hostpin_progress(c->hostpin, &pp);
    out->pinned = c->hostpin && pp.state == HOSTPIN_DONE;
    out->pinned_bytes = c->hostpin ? pp.pinned_bytes : 0;
    out->pin_state = pp.state >= 0 && pp.state < 4 ? states[pp.state] : "off";
    out->has_pin_error = c->hostpin && pp.state == HOSTPIN_FAILED;
    if (out->has_pin_error)
        snprintf(out->pin_error, sizeof out->pin_error, "%s", pp.why);
}

/* The HBM tier per device and "demotions". */
static void cache_hbm_stats(struct cache *c, struct cache_stats *out)
{
    out->nhbm = c->nhbm;
    for (unsigned i = 0; i < c->nhbm; i++) {
        struct cache_hbm *h = &c->hbm[i];
        struct cache_hbm_stats *o = &out->hbm[i];
        arena_get_stats(h->a, &o->mem);
        o->device = h->device;
        o->pci_bus_id = h->pci_bus_id;
        o->arena = arena_id(h->a);
        o->moving_bytes = h->moving_bytes;
        o->lent_by_ipc = h->ipc_len != 0;
    }
    out->demotions.high_watermark = c->hbm_high;
    out->demotions.low_watermark = c->hbm_low;
    out->demotions.blocks = c->demoted;
    out->demotions.bytes = c->demoted_bytes;
    out->demotions.aborted = c->demote_aborted;
    out->demotions.failed = c->demote_failed;
    out->demotions.dropped = c->demote_dropped;
    out->demotions.hbm_puts = c->hbm_reserved;
    out->demotions.hbm_fallbacks = c->hbm_fallbacks;
    out->demotions.has_copier = c->copier != NULL;
    if (c->copier)
        copier_stats(c->copier, &out->demotions.copier);
}

void cache_get_stats(struct cache *c, struct cache_stats *out)
{
    memset(out, 0, sizeof *out);
    arena_get_stats(c->host, &out->host);
    out->high_watermark = c->high_watermark;
    out->low_watermark = c->low_watermark;
    cache_pin_stats(c, out);
    cache_hbm_stats(c, out);
    out->has_store = c->persist != NULL;
    out->store_blocks = c->ghosts;
    out->namespaces = ns_count(c->namespaces);
    out->namespaces_active = ns_active_count(c->namespaces);
    out->namespaces_reclaimed = c->namespaces_reclaimed;
    out->leases.read = lease_count(c->leases, LEASE_READ);
    out->leases.write = lease_count(c->leases, LEASE_WRITE);
    out->leases.reaped_read = c->reaped_read;
    out->leases.reaped_write = c->reaped_write;
    out->leases.max_reserved_per_client_bytes = cache_reserve_limit(c);
    out->leases.reservations_refused = c->reservations_refused;
    out->evictions.to_store = c->evicted_to_store;
    out->evictions.writeback = c->writeback_started;
    out->evictions.dropped = c->evicted_dropped;
    out->evictions.quota = c->evicted_quota;
    cache_persist_stats(c, &out->persist);
    cache_key_metrics(c, &out->keys);
}

void cache_namespace_stats(struct cache *c, size_t i, struct cache_namespace_stats *out)
{
    kv_namespace *ns = ns_at(c->namespaces, i);

    *out = (struct cache_namespace_stats){
        .id = ns->id, .deployment_id = ns->deployment_id,
        .model = ns->layout.model, .dtype = ns->layout.dtype,
        .block_tokens = ns->layout.block_tokens, .block_bytes = ns->layout.block_bytes,
        .tp_size = ns->layout.tp_size, .tp_rank = ns->layout.tp_rank,
        .blocks = ns->blocks, .bytes = ns->bytes, .reserved_bytes = ns->reserved,
        .stored_blocks = ns->stored, .quota_bytes = c->namespace_quota,
        .clients = ns->clients, .active = ns_active(ns),
    };
}
