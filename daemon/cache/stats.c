/* cache stats: fills the cache's typed snapshot (struct cache_stats in
 * cache.h) — tiers, namespaces, leases, evictions, demotions and
 * persistence — from which daemon/stats.c builds the STATS document and
 * metrics.c the Prometheus page. Loop thread only. */
#include "cache/cache_internal.h"

#include <string.h>

#include "core/clock.h"
#include "gpu/copier.h"
#include "gpu/hostpin.h"
#include "persist/persist.h"

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
    struct kv_namespace *ns = ns_at(c->namespaces, i);

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
