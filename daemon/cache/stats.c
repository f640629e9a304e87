/* cache stats: the cache's part of the STATS document — tiers, namespaces,
 * leases, evictions, demotions and persistence (see cache.h). Loop thread
 * only. */
#include "cache/cache_impl.h"

#include "clock.h"
#include "copier.h"
#include "hostpin.h"
#include "persist.h"

/* --- stats ----------------------------------------------------------------- */

static json_t *json_u(uint64_t v)
{
    return json_integer((json_int_t)v);
}

/* "persist": the store's state, its queue, what went through it, failures by
 * op and kind, promotions, lookups, deferred answers and recovery. */
static void cache_persist_stats_json(struct cache *c, json_t *root)
{
    static const char *const policies[] = { "write_through", "write_back", "off" };
    struct persist_counters pc;
    json_t *o = json_object(), *fail = json_object(), *rec = json_object();

    if (!c->persist) {
        json_object_set_new(o, "backend", json_string("off"));
        json_object_set_new(o, "state", json_string(persist_state_name(PERSIST_STATE_OFF)));
        json_object_set_new(root, "persist", o);
        json_decref(fail);
        json_decref(rec);
        return;
    }
    persist_get_counters(c->persist, &pc);
    json_object_set_new(o, "backend", json_string(persist_backend_name(c->persist)));
    json_object_set_new(o, "policy", json_string(c->policy >= 0 && c->policy <= 2 ? policies[c->policy] : "?"));
    json_object_set_new(o, "state", json_string(persist_state_name(pc.state)));
    json_object_set_new(o, "last_error", json_string(persist_last_error(c->persist)));
    json_object_set_new(o, "lookup_on_miss", json_boolean(persist_lookup_on_miss(c->persist)));
    json_object_set_new(o, "workers", json_integer(pc.workers));
    json_object_set_new(o, "queue_depth", json_u(pc.queue_depth));
    json_object_set_new(o, "queue_capacity", json_u(pc.queue_capacity));
    json_object_set_new(o, "written_blocks_total", json_u(pc.written_blocks));
    json_object_set_new(o, "written_bytes_total", json_u(pc.written_bytes));
    json_object_set_new(o, "read_blocks_total", json_u(pc.read_blocks));
    json_object_set_new(o, "read_bytes_total", json_u(pc.read_bytes));
    json_object_set_new(o, "read_misses_total", json_u(pc.read_misses));
    json_object_set_new(o, "deleted_keys_total", json_u(pc.deleted_keys));
    json_object_set_new(o, "tombstones", json_u(pc.tombstones));
    json_object_set_new(o, "tombstones_dropped_total", json_u(pc.tombstones_dropped));
    json_object_set_new(o, "tombstone_hits_total", json_u(pc.tombstone_hits));
    json_object_set_new(o, "dropped_total", json_u(c->persist_dropped));
    for (int op = 0; op < PERSIST_OPS; op++) {
        json_t *kinds = json_object();
        for (int k = 0; k < PERSIST_FAIL_KINDS; k++)
            json_object_set_new(kinds, persist_failure_kind_name(k), json_u(pc.failures[op][k]));
        json_object_set_new(fail, persist_op_name(op), kinds);
    }
    json_object_set_new(o, "failures_total", fail);
    json_object_set_new(o, "writes_deferred_total", json_u(c->writes_deferred));
    json_object_set_new(o, "queue_refused_total", json_u(pc.refused_queue_full));
    json_object_set_new(o, "writes_waiting", json_u(c->queued_ops));
    json_object_set_new(o, "pinned_for_writes_bytes", json_u(c->writing_bytes));
    json_object_set_new(o, "write_retries_total", json_u(c->write_retries));
    json_object_set_new(o, "retry_pending", json_u(c->retry_pending));
    json_object_set_new(o, "put_waits_total", json_u(c->put_waits));
    json_object_set_new(o, "put_wait_timeouts_total", json_u(c->put_wait_timeouts));
    json_object_set_new(o, "promotions_total", json_u(c->promotions));
    json_object_set_new(o, "promotions_ok_total", json_u(c->promotions_ok));
    json_object_set_new(o, "promotions_failed_total", json_u(c->promotions_failed));
    json_object_set_new(o, "lookups_total", json_u(c->lookups));
    json_object_set_new(o, "lookup_found_total", json_u(c->lookup_found));
    json_object_set_new(o, "waits_total", json_u(c->waits));
    json_object_set_new(o, "wait_timeouts_total", json_u(c->wait_timeouts));
    json_object_set_new(rec, "running", json_boolean(pc.scan_running));
    json_object_set_new(rec, "complete", json_boolean(pc.scan_complete));
    json_object_set_new(rec, "found", json_u(pc.scan_found));
    json_object_set_new(rec, "indexed", json_u(c->recovered));
    json_object_set_new(rec, "skipped", json_u(c->recovery_skipped));
    if (pc.scan_started_ms) {
        uint64_t end = pc.scan_finished_ms ? pc.scan_finished_ms : clock_now_ms();
        json_object_set_new(rec, "seconds", json_real((double)(end - pc.scan_started_ms) / 1000.0));
    }
    json_object_set_new(o, "recovery", rec);
    json_object_set_new(root, "persist", o);
}

/* Host-arena pinning: "pinned" (the whole arena is), "pinned_bytes" so
 * far, "pin_state" (off, running, done, failed, stopped), "pin_error". */
static void cache_pin_stats_json(struct cache *c, json_t *host)
{
    static const char *const states[] = { "running", "done", "failed", "stopped" };
    struct hostpin_progress pp = { .state = -1 };

    if (c->hostpin)
        hostpin_progress(c->hostpin, &pp);
    json_object_set_new(host, "pinned", json_boolean(c->hostpin && pp.state == HOSTPIN_DONE));
    json_object_set_new(host, "pinned_bytes", json_integer((json_int_t)(c->hostpin ? pp.pinned_bytes : 0)));
    json_object_set_new(host, "pin_state", json_string(pp.state >= 0 && pp.state < 4 ? states[pp.state]
                                                                                       : "off"));
    if (c->hostpin && pp.state == HOSTPIN_FAILED)
        json_object_set_new(host, "pin_error", json_string(pp.why));
}

/* "tiers": {"hbm": [per device]} and "demotions". */
static void cache_hbm_stats_json(struct cache *c, json_t *tiers, json_t *root)
{
    json_t *arr = json_array(), *dem = json_object();
    for (unsigned i = 0; i < c->nhbm; i++) {
        struct cache_hbm *h = &c->hbm[i];
        struct arena_stats st;
        json_t *o = json_object();
        arena_get_stats(h->a, &st);
        json_object_set_new(o, "device", json_integer(h->device));
        json_object_set_new(o, "pci_bus_id", json_string(h->pci_bus_id));
        json_object_set_new(o, "arena", json_integer(arena_id(h->a)));
        json_object_set_new(o, "capacity_bytes", json_integer((json_int_t)st.capacity));
        json_object_set_new(o, "used_bytes", json_integer((json_int_t)st.used_bytes));
        json_object_set_new(o, "blocks", json_integer((json_int_t)st.blocks));
        json_object_set_new(o, "moving_bytes", json_integer((json_int_t)h->moving_bytes));
        json_object_set_new(o, "lent_by", json_string(h->ipc_len ? "cuda_ipc" : "fd"));
        json_array_append_new(arr, o);
    }
    json_object_set_new(tiers, "hbm", arr);
    json_object_set_new(dem, "high_watermark", json_real(c->hbm_high));
    json_object_set_new(dem, "low_watermark", json_real(c->hbm_low));
    json_object_set_new(dem, "blocks_total", json_integer((json_int_t)c->demoted));
    json_object_set_new(dem, "bytes_total", json_integer((json_int_t)c->demoted_bytes));
    json_object_set_new(dem, "aborted_total", json_integer((json_int_t)c->demote_aborted));
    json_object_set_new(dem, "failed_total", json_integer((json_int_t)c->demote_failed));
    json_object_set_new(dem, "dropped_total", json_integer((json_int_t)c->demote_dropped));
    json_object_set_new(dem, "hbm_puts_total", json_integer((json_int_t)c->hbm_reserved));
    json_object_set_new(dem, "hbm_fallbacks_total", json_integer((json_int_t)c->hbm_fallbacks));
    if (c->copier) {
        struct copier_stats cs;
        copier_stats(c->copier, &cs);
        json_object_set_new(dem, "batches_total", json_integer((json_int_t)cs.batches));
        json_object_set_new(dem, "transfers_total", json_integer((json_int_t)cs.transfers));
        json_object_set_new(dem, "copy_seconds_total", json_real((double)cs.busy_ns * 1e-9));
        json_object_set_new(dem, "batches_pending", json_integer((json_int_t)cs.pending));
    }
    json_object_set_new(root, "demotions", dem);
}

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
    cache_pin_stats_json(c, host);
    json_object_set_new(tiers, "host", host);
    cache_hbm_stats_json(c, tiers, root);
    if (c->persist) {
        json_t *store = json_object();
        json_object_set_new(store, "blocks", json_integer((json_int_t)c->ghosts));
        json_object_set_new(tiers, "store", store);
    }
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
        json_object_set_new(o, "stored_blocks", json_integer((json_int_t)ns->stored));
        json_object_set_new(o, "quota_bytes", json_integer((json_int_t)c->namespace_quota));
        json_object_set_new(o, "clients", json_integer(ns->clients));
        json_object_set_new(o, "active", json_boolean(ns_active(ns)));
        json_array_append_new(nss, o);
    }
    json_object_set_new(root, "namespaces", nss);
    json_object_set_new(root, "namespaces_active", json_integer((json_int_t)ns_active_count(c->namespaces)));
    json_object_set_new(root, "namespaces_reclaimed_total", json_integer((json_int_t)c->namespaces_reclaimed));

    json_object_set_new(leases, "read", json_integer((json_int_t)lease_count(c->leases, LEASE_READ)));
    json_object_set_new(leases, "write", json_integer((json_int_t)lease_count(c->leases, LEASE_WRITE)));
    json_object_set_new(leases, "reaped_total", json_integer((json_int_t)(c->reaped_read + c->reaped_write)));
    json_object_set_new(leases, "reaped_read_total", json_integer((json_int_t)c->reaped_read));
    json_object_set_new(leases, "reaped_write_total", json_integer((json_int_t)c->reaped_write));
    json_object_set_new(leases, "max_reserved_per_client_bytes",
                        json_integer((json_int_t)cache_reserve_limit(c)));
    json_object_set_new(leases, "reservations_refused_total", json_integer((json_int_t)c->reservations_refused));
    json_object_set_new(root, "leases", leases);

    json_object_set_new(evh, "to_store_total", json_integer((json_int_t)c->evicted_to_store));
    json_object_set_new(evh, "writeback_total", json_integer((json_int_t)c->writeback_started));
    json_object_set_new(evh, "dropped_total", json_integer((json_int_t)c->evicted_dropped));
    json_object_set_new(evh, "quota_total", json_integer((json_int_t)c->evicted_quota));
    json_object_set_new(ev, "host", evh);
    json_object_set_new(root, "evictions", ev);
    cache_persist_stats_json(c, root);
}
