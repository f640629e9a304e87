/* cache core: the cache object (create, destroy, the reloadable settings),
 * namespaces and arenas, an entry's lifecycle (pins, ghosts, eviction of one
 * entry, removal), the end of leases and delete (see cache.h). Loop thread
 * only. */
#include "cache/cache_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "core/log.h"
#include "mem/numa.h"
#include "mem/populate.h"
#include "persist/persist.h"

static int cache_create_as(struct event_base *base, const struct kvn_config *cfg,
                           const char *tenant, bool deferred, int adopt_fd, uint64_t adopt_reserved,
                           struct cache **out, char *err, size_t errlen);

/* Host memory reserved at once: for embedders and tests. */
int cache_create(struct event_base *base, const struct kvn_config *cfg, struct cache **out,
                 char *err, size_t errlen)
{
    return cache_create_as(base, cfg, NULL, false, -1, 0, out, err, errlen);
}

/* The daemon's: host memory reserved and populated in the background. */
int cache_create_tenant(struct event_base *base, const struct kvn_config *cfg, const char *tenant,
                        struct cache **out, char *err, size_t errlen)
{
    return cache_create_as(base, cfg, tenant, true, -1, 0, out, err, errlen);
}

int cache_create_adopting(struct event_base *base, const struct kvn_config *cfg, const char *tenant, int host_fd,
                          uint64_t reserved, struct cache **out, char *err, size_t errlen)
{
    return cache_create_as(base, cfg, tenant, false, host_fd, reserved, out, err, errlen);
}

#define CACHE_POPULATE_POLL_MS 20

/* While the host arena is being reserved: puts waiting for room
 * (cache_put_begin's CACHE_STORE_BOUND) try again whenever the reserved
 * part grew, and once more when population ended (they then evict or fail
 * like in a full tier). The threads cannot wake the loop themselves. */
static void cache_populate_poll_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    uint64_t reserved = arena_reserved(c->host);
    bool running = cache_populating(c);
    (void)fd;
    (void)what;
    if (reserved != c->populate_seen || !running) {
        c->populate_seen = reserved;
        event_active(c->put_wake_ev, 0, 0);
    }
    if (running) {
        struct timeval tv = clock_tv_ms(CACHE_POPULATE_POLL_MS);
        evtimer_add(c->populate_ev, &tv);
    }
}

bool cache_populating(struct cache *c)
{
    return c->populate && cache_populate_state(c, NULL, 0) == POPULATE_RUNNING;
}

/* Reserve and populate the host arena in the background (mem/populate.h). */
static int cache_start_populate(struct cache *c, const char *tenant, char *err, size_t errlen)
{
    char label[80];
    struct timeval tv = clock_tv_ms(CACHE_POPULATE_POLL_MS);
    int rc;

    snprintf(label, sizeof label, "%s%s", tenant ? "tenant " : "", tenant ? tenant : "the");
    if (!(c->populate_ev = evtimer_new(c->base, cache_populate_poll_cb, c))) {
        errmsg_set(err, errlen, "cannot create cache events");
        return -KVNODE_ENOMEM;
    }
    rc = populate_start(c->host, &c->numa, populate_default_threads(), label, &c->populate, err,
                        errlen);
    if (rc == 0)
        evtimer_add(c->populate_ev, &tv);
    return rc;
}

/* memory.numa (mem/numa.h): plan where the host arena lives, split it into
 * the plan's regions and bind them, before any of it is reserved. */
static int cache_place_host(struct cache *c, const struct kvn_config *cfg, const char *tenant,
                            char *err, size_t errlen)
{
    char label[80];
    uint64_t ends[NUMA_MAX_REGIONS];
    struct arena_stats st;

    _Static_assert(NUMA_MAX_REGIONS == ARENA_MAX_REGIONS, "a NUMA region is an arena region");
    snprintf(label, sizeof label, "%s%s", tenant ? "tenant " : "", tenant ? tenant : "the");
    arena_get_stats(c->host, &st);
    numa_read_topology(NULL, &c->numa_topo);
    numa_plan_make(&c->numa_topo, cfg->numa == CONFIG_NUMA_AUTO, arena_size(c->host), st.slab_bytes,
                   &c->numa);
    if (c->numa.mode == NUMA_MODE_PER_GPU) {
        for (size_t r = 0; r < c->numa.nregions; r++)
            ends[r] = c->numa.regions[r].end;
        int rc = arena_set_regions(c->host, (uint32_t)c->numa.nregions, ends, err, errlen);
        if (rc < 0)
            return rc;
    }
    numa_plan_apply(&c->numa, arena_base(c->host), arena_size(c->host), label);
    return 0;
}

uint32_t cache_host_region(const struct cache *c, int cuda_device, const char *pci_bus_id)
{
    int r = numa_region_of_gpu(&c->numa, &c->numa_topo, pci_bus_id, cuda_device);
    return r < 0 ? ARENA_ANY_REGION : (uint32_t)r;
}

/* The host arena: over a handed-over memfd (warm restart), else a new one
 * reserved now or in the background (deferred). */
static int cache_create_host(struct cache *c, const struct kvn_config *cfg, bool deferred, int adopt_fd,
                             uint64_t adopt_reserved, char *err, size_t errlen)
{
    if (adopt_fd >= 0)
        return arena_adopt_host(HOST_ARENA_ID, adopt_fd, cfg->host_bytes, cfg->slab_bytes, adopt_reserved, &c->host,
                                err, errlen);
    if (deferred)
        return arena_create_host_deferred(HOST_ARENA_ID, cfg->host_bytes, cfg->slab_bytes, cfg->huge_pages,
                                          &c->host, err, errlen);
    return arena_create_host(HOST_ARENA_ID, cfg->host_bytes, cfg->slab_bytes, cfg->huge_pages, &c->host, err,
                             errlen);
}

static int cache_create_as(struct event_base *base, const struct kvn_config *cfg,
                           const char *tenant, bool deferred, int adopt_fd, uint64_t adopt_reserved,
                           struct cache **out, char *err, size_t errlen)
{
    struct cache *c = calloc(1, sizeof *c);
    char who[LOG_TENANT_PREFIX_MAX];
    int rc;

    *out = NULL;
    if (!c) {
        if (adopt_fd >= 0)
            close(adopt_fd);
        errmsg_set(err, errlen, "out of memory");
        return -KVNODE_ENOMEM;
    }
    c->base = base;
    _Static_assert((int)CONFIG_HUGE_OFF == (int)ARENA_HUGE_OFF && (int)CONFIG_HUGE_AUTO == (int)ARENA_HUGE_AUTO &&
                   (int)CONFIG_HUGE_ON == (int)ARENA_HUGE_ON, "CONFIG_HUGE_* follows ARENA_HUGE_*");
    rc = cache_create_host(c, cfg, deferred, adopt_fd, adopt_reserved, err, errlen);
    if (rc < 0)
        goto fail;
    log_info("%shost memory: %s pages (%" PRIu64 " bytes each): %s", log_tenant_prefix(tenant, who, sizeof who),
             strcmp(arena_huge_pages(c->host), "off") == 0 ? "ordinary" : arena_huge_pages(c->host),
             arena_page_size(c->host), arena_huge_pages_why(c->host));
    c->arenas[HOST_ARENA_ID] = c->host;
    c->narenas = 1;
    if (arena_fd_readonly(c->host) < 0)
        log_warn("%shost memory cannot be lent read-only: %s; clients that declare themselves "
                 "readers will be refused", log_tenant_prefix(tenant, who, sizeof who),
                 arena_fd_readonly_why(c->host));
    /* Size the index for the arena's capacity at the default block size
     * order of magnitude; it grows incrementally beyond that. */
    rc = index_create(cfg->host_bytes / (256u * 1024u), &c->index);
    if (rc < 0) {
        errmsg_set(err, errlen, "cannot create the block index: out of memory");
        goto fail;
    }
    rc = ns_registry_create_tenant(cfg->max_namespaces, tenant, &c->namespaces);
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
    c->settle_ev = evtimer_new(base, cache_settle_cb, c);
    c->demote_ev = event_new(base, -1, 0, cache_demote_cb, c);
    c->demote_retry_ev = evtimer_new(base, cache_demote_retry_cb, c);
    c->retry_ev = evtimer_new(base, cache_retry_cb, c);
    c->put_wake_ev = event_new(base, -1, 0, cache_put_wake_cb, c);
    if (!c->evict_ev || !c->reap_ev || !c->settle_ev || !c->demote_ev || !c->demote_retry_ev || !c->retry_ev || !c->put_wake_ev ||
        keylock_create(&c->keylocks) < 0) {
        errmsg_set(err, errlen, "cannot create cache events");
        rc = -KVNODE_ENOMEM;
        goto fail;
    }
    cache_apply_config(c, cfg);
    if ((rc = cache_place_host(c, cfg, tenant, err, errlen)) < 0)
        goto fail;
    if (deferred && (rc = cache_start_populate(c, tenant, err, errlen)) < 0)
        goto fail;
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
    populate_stop(c->populate);   /* its threads write the arena */
    if (c->populate_ev)
        event_free(c->populate_ev);
    /* Ops the store never got (it is gone by now): give back their pins,
     * while the events an unpin may activate (demotion) still exist. */
    while (c->queued_head) {
        struct cache_storeop *op = c->queued_head;
        c->queued_head = op->next;
        if (op->kind == STORE_OP_WRITE) {
            cache_unpin(c, op->e);
            if (op->group)
                cache_write_group_done(c, op->group);
        }
        cache_storeop_free(op);
    }
    cache_purge_destroy_all(c);
    if (c->evict_ev)
        event_free(c->evict_ev);
    if (c->reap_ev)
        event_free(c->reap_ev);
    if (c->settle_ev)
        event_free(c->settle_ev);
    if (c->demote_ev)
        event_free(c->demote_ev);
    if (c->demote_retry_ev)
        event_free(c->demote_retry_ev);
    if (c->retry_ev)
        event_free(c->retry_ev);
    if (c->put_wake_ev)
        event_free(c->put_wake_ev);
    while (c->retry_head) {
        struct cache_retry *r = c->retry_head;
        c->retry_head = r->next;
        free(r);
    }
    free(c->match_found);
    free(c->promo_tab);
    keylock_destroy(c->keylocks);
    negcache_destroy(c->negcache);
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
    /* A tenant's namespace limit is reloadable (the LRU heads grow on
     * demand when the early reservation fails). */
    if (c->namespaces && ns_registry_set_max(c->namespaces, cfg->max_namespaces) == 0 && c->index)
        (void)index_ns_reserve(c->index, cfg->max_namespaces + 1u);
    c->policy = cfg->persist_policy;
    c->request_timeout_ms = cfg->request_timeout_ms;
    /* Applies to the misses already cached too (their age is kept): no sweep. */
    c->negative_ttl_ms = cfg->persist_lookup_negative_ttl_ms;
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
uint64_t cache_reserve_limit(const struct cache *c)
{
    uint64_t total = 0;
    for (uint32_t id = 0; id < c->narenas; id++)
        total += arena_size(c->arenas[id]);
    return (uint64_t)(c->max_reserved_per_client * (double)total);
}

/* At the namespace limit: free the memory of the idle namespace (no client,
 * no reservation) with the fewest blocks in memory, if it has at most
 * RECLAIM_MAX_BLOCKS and all of them are evictable and already in the store
 * (or persistence is off), so that it stops counting. Bounded work; a
 * throwaway deployment does not hold its slot for good. */
#define RECLAIM_MAX_BLOCKS 256u
static bool cache_reclaim_idle_ns(struct cache *c)
{
    struct kv_namespace *best = NULL;
    for (size_t i = 0; i < ns_count(c->namespaces); i++) {
        struct kv_namespace *ns = ns_at(c->namespaces, i);
        if (ns->clients || ns->reserved || !ns->blocks || ns->blocks > RECLAIM_MAX_BLOCKS ||
            index_lru_count_in_ns(c->index, ns->id) < ns->blocks)
            continue;   /* in use, empty, too big, or some block pinned */
        if (!best || ns->blocks < best->blocks)
            best = ns;
    }
    if (!best)
        return false;
    struct index_entry *e;
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

int cache_bind(struct cache *c, const struct ns_layout *layout, struct kv_namespace **ns,
               char *err, size_t errlen)
{
    struct kv_namespace *n = NULL;
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

void cache_unbind(struct cache *c, struct kv_namespace *ns)
{
    (void)c;
    if (ns && ns->clients > 0)
        ns->clients--;
}

size_t cache_arenas(const struct cache *c, struct cache_arena_info *out, size_t max)
{
    size_t n = 0;
    for (uint32_t id = 0; id < c->narenas && n < max; id++) {
        const struct arena *a = c->arenas[id];
        const struct cache_hbm *h = id == HOST_ARENA_ID ? NULL : &c->hbm[id - 1];
        /* A device that is down (sticky error) is lent to no one. */
        if (h && h->down)
            continue;
        out[n].id = arena_id(a);
        out[n].tier = arena_tier(a);
        out[n].device = arena_device(a);
        out[n].size = arena_size(a);
        out[n].fd = arena_fd(a);
        out[n].ro_fd = arena_fd_readonly(a);
        out[n].ro_why = arena_fd_readonly_why(a);
        out[n].vmm_fd = h ? h->vmm_fd : -1;
        out[n].ipc_handle = h && h->ipc_len ? h->ipc : NULL;
        out[n].ipc_len = h ? h->ipc_len : 0;
        out[n].host_access = !h || h->host_access;
        out[n].pci_bus_id = h ? h->pci_bus_id : NULL;
        n++;
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
    /* A VMM handle is imported, not mapped: the arena has no fd to lend (nor a read-only one). */
    rc = arena_create_over(id, KVNODE_TIER_HBM, r->device, r->base, r->vmm ? -1 : r->fd, r->size, slab_bytes,
                           &h->a, err, errlen);
    if (rc < 0)
        return rc;
    if (r->fd >= 0 && arena_fd_readonly(h->a) < 0)
        log_warn("HBM of device %d cannot be lent read-only: %s; clients that declare themselves "
                 "readers are not lent it", r->device, arena_fd_readonly_why(h->a));
    h->device = r->device;
    h->vmm_fd = r->vmm ? r->fd : -1;
    h->host_access = r->host_access;
    h->ipc_len = r->ipc_len <= sizeof h->ipc ? r->ipc_len : 0;
    memcpy(h->ipc, r->ipc_handle, h->ipc_len);
    snprintf(h->pci_bus_id, sizeof h->pci_bus_id, "%s", r->pci_bus_id);
    h->host_region = cache_host_region(c, r->device, r->pci_bus_id);
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

void cache_host_stats(const struct cache *c, struct arena_stats *out)
{
    arena_get_stats(c->host, out);
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

uint64_t cache_ns_block_bytes(struct cache *c, uint32_t ns_id)
{
    struct kv_namespace *ns = ns_get(c->namespaces, ns_id);
    return ns ? ns->layout.block_bytes : 0;
}

struct index_entry *cache_entry_for(struct cache *c, uint32_t ns, int64_t key, uint64_t check,
                                    bool *mismatch)
{
    return cache_entry_checked(index_lookup(c->index, ns, key), check, mismatch);
}

static bool entry_has_slot(const struct index_entry *e)
{
    return e->state != ENTRY_GHOST;
}

static struct arena *cache_arena_of(struct cache *c, const struct index_entry *e)
{
    return e->arena < c->narenas ? c->arenas[e->arena] : NULL;
}

/* The daemon's address of a block (a device pointer for a real GPU's HBM). */
void *cache_slot_ptr(struct cache *c, const struct index_entry *e)
{
    return (uint8_t *)arena_base(cache_arena_of(c, e)) + e->offset;
}

/* Give back an entry's slot, in whichever arena it is. */
void cache_slot_free(struct cache *c, const struct index_entry *e)
{
    struct arena *a = cache_arena_of(c, e);
    if (a)
        arena_free(a, e->offset);
}

/* The HBM arena record of an entry, or NULL for host memory. */
struct cache_hbm *cache_hbm_of(struct cache *c, const struct index_entry *e)
{
    return e->arena != HOST_ARENA_ID && e->arena < c->narenas ? &c->hbm[e->arena - 1] : NULL;
}

/* Forget an entry's accounting (it is leaving the index). */
static void cache_account_remove(struct cache *c, struct index_entry *e)
{
    struct kv_namespace *ns = ns_get(c->namespaces, e->ns);
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

void cache_entry_destroy(struct cache *c, struct index_entry *e)
{
    if (entry_has_slot(e))
        cache_slot_free(c, e);
    index_entry_free(c->index, e);
}

/* Take an entry out of the index: freed now, or, while pinned (readers, a
 * store request), when the last pin goes. */
void cache_remove_entry(struct cache *c, struct index_entry *e)
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
void cache_drop_entry(struct cache *c, struct index_entry *e)
{
    cache_note_leaving(c, e);
    index_unlink(c->index, e);
    cache_account_remove(c, e);
    cache_entry_destroy(c, e);
}

/* An unpinned SEALED entry the store holds leaves memory and stays indexed
 * as a ghost. */
void cache_to_ghost(struct cache *c, struct index_entry *e)
{
    struct kv_namespace *ns = ns_get(c->namespaces, e->ns);
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

/* Free a victim's memory: keep it as a ghost when the store holds it. */
void cache_evict_entry(struct cache *c, struct index_entry *e)
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
void cache_unpin(struct cache *c, struct index_entry *e)
{
    if (e->pins == 0)
        return;
    if (--e->pins > 0)
        return;
    if (e->detached) {
        cache_entry_destroy(c, e);
    } else if (e->state == ENTRY_SEALED) {
        /* Back at its own place: a pin dropping is no use by a client. */
        index_lru_add(c->index, e);
        if (cache_hbm_of(c, e) && !c->demote_building)
            cache_demote_maybe_schedule(c);
    }
}

void cache_pin(struct cache *c, struct index_entry *e)
{
    if (e->pins++ == 0)
        index_lru_remove(c->index, e);
}

/* --- lease end and delete ----------------------------------------------------- */

/* End a lease's hold on its entries: a reader's are unpinned, a writer's
 * sealed (commit) or given back (put.c). */
uint32_t cache_lease_finish(struct cache *c, struct lease *l, bool commit)
{
    uint32_t count = 0;

    if (l->waiter) {
        /* Reaped or released under a deferred answer: it answers empty. */
        ((struct cache_wait *)l->waiter)->l = NULL;
        l->waiter = NULL;
    }
    if (l->kind == LEASE_READ) {
        /* The reader used them: refresh tail-first so the chain's root
         * becomes the newest. */
        index_lru_chain_begin(c->index);
        for (size_t i = l->n; i-- > 0;) {
            if (!l->entries[i])
                continue;
            index_lru_use(c->index, l->entries[i]);
            cache_unpin(c, l->entries[i]);
            count++;
        }
    } else if (commit) {
        count = cache_put_seal(c, l);
    } else {
        count = cache_put_unreserve_all(c, l);
    }
    /* Puts waiting for room, or for keys this lease was writing, try again. */
    if (l->kind == LEASE_WRITE && c->put_waiters)
        event_active(c->put_wake_ev, 0, 0);
    lease_destroy(c->leases, l);
    /* Blocks it pinned or sealed may be demotable now: an HBM arena left
     * over its watermark by pinned blocks drains without waiting for a put. */
    cache_demote_maybe_schedule(c);
    return count;
}

/* owner's lease lease_id, or NULL. */
static struct lease *cache_lease_of(struct cache *c, const struct lease_list *owner, uint64_t lease_id)
{
    struct lease *l = lease_id ? lease_find(c->leases, lease_id) : NULL;
    return l && l->owner == owner ? l : NULL;
}

/* l (lease_id's, NULL when the connection holds none) may be ended as kind:
 * 0, or the code with err set. */
static int cache_lease_check(const struct lease *l, uint64_t lease_id, int kind, char *err,
                             size_t errlen)
{
    if (!l) {
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
    return 0;
}

int cache_put_commit(struct cache *c, struct lease_list *owner, uint64_t lease_id,
                     uint32_t *blocks, char *err, size_t errlen)
{
    struct lease *l = cache_lease_of(c, owner, lease_id);
    int rc = cache_lease_check(l, lease_id, LEASE_WRITE, err, errlen);

    *blocks = 0;
    if (rc < 0)
        return rc;
    *blocks = cache_lease_finish(c, l, true);
    cache_evict_maybe_schedule(c);
    return 0;
}

int cache_put_abort(struct cache *c, struct lease_list *owner, uint64_t lease_id,
                    uint32_t *blocks, char *err, size_t errlen)
{
    struct lease *l = cache_lease_of(c, owner, lease_id);
    int rc = cache_lease_check(l, lease_id, LEASE_WRITE, err, errlen);

    *blocks = 0;
    if (rc < 0)
        return rc;
    *blocks = cache_lease_finish(c, l, false);
    return 0;
}

int cache_get_end(struct cache *c, struct lease_list *owner, uint64_t lease_id, uint32_t *blocks,
                  char *err, size_t errlen)
{
    struct lease *l = cache_lease_of(c, owner, lease_id);
    int rc = cache_lease_check(l, lease_id, LEASE_READ, err, errlen);

    *blocks = 0;
    if (rc < 0)
        return rc;
    *blocks = cache_lease_finish(c, l, false);
    return 0;
}

int cache_lease_end(struct cache *c, struct lease_list *owner, uint64_t lease_id, int kind,
                    bool commit, uint32_t *blocks, char *err, size_t errlen)
{
    struct lease *l;
    int rc;

    if (kind == LEASE_WRITE)
        return commit ? cache_put_commit(c, owner, lease_id, blocks, err, errlen)
                      : cache_put_abort(c, owner, lease_id, blocks, err, errlen);
    l = cache_lease_of(c, owner, lease_id);
    rc = cache_lease_check(l, lease_id, kind, err, errlen);
    *blocks = 0;
    if (rc < 0)
        return rc;
    *blocks = cache_lease_finish(c, l, commit);
    return 0;
}

int cache_delete(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                 const uint64_t *checks, size_t n, uint32_t *deleted)
{
    return cache_delete_each(c, ns, keys, checks, n, deleted, NULL);
}

int cache_delete_each(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                      const uint64_t *checks, size_t n, uint32_t *deleted, uint8_t *each)
{
    *deleted = 0;
    if (each)
        memset(each, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++) {
        bool mismatch = false;
        struct index_entry *e = cache_entry_for(c, ns->id, keys[i], cache_check_at(checks, i),
                                                &mismatch);
        /* Another word's block is not this caller's to delete. */
        c->keys.check_mismatches += mismatch;
        /* Blocks still being written belong to their writer until commit. */
        if (!e || e->state == ENTRY_WRITING)
            continue;
        /* Pinned (readers, a store request): freed when the last pin goes. */
        cache_remove_entry(c, e);
        (*deleted)++;
        if (each)
            each[i / 8] |= (uint8_t)(1u << (i % 8));
    }
    /* The store may hold keys the index does not know (shared stores):
     * every key goes to its delete, after any write of the key in flight
     * and before any later re-put's write (keylock). A store that cannot
     * delete (v6d) gets tombstones now, so no lookup brings the keys back. */
    if (c->persist && n > 0) {
        persist_hide(c->persist, ns, keys, checks, n);
        cache_store_delete(c, ns, keys, checks, n);
    }
    return 0;
}

void cache_release_owner(struct cache *c, struct lease_list *owner)
{
    while (owner->head)
        cache_lease_finish(c, owner->head, false);
}

struct kv_namespace *cache_find_ns(struct cache *c, const struct ns_layout *l)
{
    uint64_t fp = ns_fingerprint_tenant(l, ns_registry_tenant(c->namespaces));

    /* Bounded by the registry's records, as ns_bind's own walk is. */
    for (size_t i = 0; i < ns_count(c->namespaces); i++) {
        struct kv_namespace *ns = ns_at(c->namespaces, i);
        if (ns->fingerprint == fp && ns->layout.tp_rank == l->tp_rank &&
            ns_same_deployment(&ns->layout, l))
            return ns;
    }
    return NULL;
}

struct kv_namespace *cache_ns_at(struct cache *c, size_t i)
{
    return i < ns_count(c->namespaces) ? ns_at(c->namespaces, i) : NULL;
}
