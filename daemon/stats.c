/* stats: the typed snapshot and the STATS document (see stats.h). */
#include "stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "tenants/tenants.h"
#include "warm.h"
#include "wire.h"
#include "persist/kvs/redis_cluster.h"

struct stats_view stats_admin_view(const struct daemon *d)
{
    return (struct stats_view){ .layouts = !tenants_configured(d->tenants), .only = NULL };
}

struct stats_view stats_client_view(const struct daemon *d, const struct tenant *t, uid_t uid)
{
    bool all = !tenants_configured(d->tenants) || uid == 0 || uid == geteuid();
    return (struct stats_view){ .layouts = true, .only = all ? NULL : t };
}

/* An error text where models may not be shown. The store's and KVCM's
 * messages can name a deployment (a store directory, an object key, an
 * instance id, or whatever KVCM echoes back), so they are not filtered but
 * replaced; "" (no error) stays "". */
static const char stats_hidden_text[] =
    "hidden: on a node with tenants an error text may name a model; kvnodectl stats as root shows it";

static void stats_hide_error_texts(struct stats_snapshot *s)
{
    struct cache_persist_stats *p = &s->cache_stats.persist;
    if (p->last_error && *p->last_error)
        p->last_error = stats_hidden_text;
    if (s->kvcm.last_error[0])
        snprintf(s->kvcm.last_error, sizeof s->kvcm.last_error, "%s", stats_hidden_text);
    if (s->has_query && s->query.last_error && *s->query.last_error)
        s->query.last_error = stats_hidden_text;
    /* Names a client, which may be another tenant's. */
    if (s->ops.hbm_unusable_last && *s->ops.hbm_unusable_last)
        s->ops.hbm_unusable_last = stats_hidden_text;
}

/* Each tenant's line, the node totals, and the namespaces view lets through;
 * a view of one tenant (a client of it) sees that tenant's line only, and
 * its totals (tiers, keys, leases, store) are that tenant's. */
static void stats_collect_tenants(struct daemon *d, const struct stats_view *view,
                                  struct stats_snapshot *s)
{
    struct cache_stats *cs = malloc(sizeof *cs);
    bool first = true;

    s->has_tenants = tenants_configured(d->tenants);
    s->show_deployments = view->layouts && (!s->has_tenants || !view->only);
    for (size_t i = 0; i < tenants_count(d->tenants); i++) {
        const struct tenant *t = tenants_at(d->tenants, i);
        if (view->only && view->only != t)
            continue;
        struct stats_tenant *st = &s->tenants[s->ntenants++];
        *st = (struct stats_tenant){ .name = t->name, .clients = t->clients, .refused = t->refused,
                                     .max_clients = t->max_clients, .output_buffered = t->output_bytes };
        if (!t->cache || !cs)
            continue;
        cache_get_stats(t->cache, cs);
        cache_stats_add(&s->cache_stats, cs, first);
        first = false;
        st->host_capacity = cs->host.capacity;
        st->host_used = cs->host.used_bytes;
        st->blocks = cs->host.blocks;
        for (unsigned h = 0; h < cs->nhbm; h++) {
            st->hbm_capacity += cs->hbm[h].mem.capacity;
            st->hbm_used += cs->hbm[h].mem.used_bytes;
            st->blocks += cs->hbm[h].mem.blocks;
        }
        st->namespaces = cs->namespaces;
        st->namespaces_active = cs->namespaces_active;
        st->store_blocks = cs->store_blocks;
        st->evictions = cs->evictions.to_store + cs->evictions.dropped + cs->evictions.quota;
        st->keys_matched = cs->keys.matched;
        st->keys_missed = cs->keys.absent + cs->keys.writing + cs->keys.beyond_gap;   /* as "keys" counts them */
        st->check_mismatches = cs->keys.check_mismatches;
        if (view->layouts)
            s->ns[s->nns++] = (struct stats_ns_source){
                .cache = t->cache, .tenant = s->has_tenants ? t->name : NULL, .n = cs->namespaces };
    }
    free(cs);
}

void stats_collect(struct daemon *d, const struct stats_view *view, struct stats_snapshot *s)
{
    memset(s, 0, sizeof *s);
    ops_get_stats(d->ops, &s->ops);
    stats_collect_tenants(d, view, s);
    s->has_server = d->server != NULL;
    if (d->server)
        server_get_stats(d->server, &s->server);
    if (d->admin)
        admin_get_stats(d->admin, &s->admin);
    s->admin_address = d->admin ? s->admin.address : NULL;
    s->has_kvs = d->kvs != NULL;
    if (d->kvs)
        kvs_server_get_stats(d->kvs, &s->kvs);
    s->reloads_ok = d->reloads_ok;
    s->reloads_failed = d->reloads_failed;
    s->worker_stall_timeout_ms = d->cfg->worker_stall_timeout_ms;
    s->last_reload_error = d->last_reload_error;
    kvcm_get_stats(d->kvcm, &s->kvcm);
    s->has_query = d->querier != NULL;
    if (d->querier)
        kvcm_querier_get_stats(d->querier, &s->query);
    s->has_gpu = d->gpu != NULL;
    if (d->gpu)
        gpu_get_stats(d->gpu, &s->gpu);
    /* Whoever may not see every deployment does not see the error texts
     * either: they may name one (of any tenant). */
    if (s->has_tenants && !s->show_deployments)
        stats_hide_error_texts(s);
}

/* ---- the document ------------------------------------------------------------ */

static json_t *ju(uint64_t v)
{
    return json_integer((json_int_t)v);
}

static void set(json_t *o, const char *key, json_t *v)
{
    json_object_set_new(o, key, v);
}

/* Host-arena pinning, into the host tier. */
static void pin_json(const struct cache_stats *s, json_t *host)
{
    set(host, "pinned", json_boolean(s->pinned));
    set(host, "pinned_bytes", ju(s->pinned_bytes));
    set(host, "pin_state", json_string(s->pin_state));
    if (s->has_pin_error)
        set(host, "pin_error", json_string(s->pin_error));
}

/* "tiers"."hbm" (one per device) and "demotions". */
static void hbm_json(const struct cache_stats *s, json_t *tiers, json_t *root)
{
    json_t *arr = json_array(), *dem = json_object();

    for (unsigned i = 0; i < s->nhbm; i++) {
        const struct cache_hbm_stats *h = &s->hbm[i];
        json_t *o = json_object();
        set(o, "device", json_integer(h->device));
        set(o, "pci_bus_id", json_string(h->pci_bus_id));
        set(o, "arena", json_integer(h->arena));
        set(o, "capacity_bytes", ju(h->mem.capacity));
        set(o, "used_bytes", ju(h->mem.used_bytes));
        set(o, "blocks", ju(h->mem.blocks));
        set(o, "moving_bytes", ju(h->moving_bytes));
        set(o, "lent_by", json_string(h->lent_by_ipc ? "cuda_ipc" : "fd"));
        /* A sticky error stops the device for good (its blocks dropped). */
        set(o, "state", json_string(h->down ? "down" : "up"));
        set(o, "down_reason", h->down ? json_string(h->down_reason) : json_null());
        set(o, "down_dropped_blocks_total", ju(h->down_dropped));
        set(o, "demotion_backoff_ms", ju(h->backoff_ms));
        set(o, "demotion_failing_batches", ju(h->failing_batches));
        json_array_append_new(arr, o);
    }
    set(tiers, "hbm", arr);
    set(dem, "high_watermark", json_real(s->demotions.high_watermark));
    set(dem, "low_watermark", json_real(s->demotions.low_watermark));
    set(dem, "blocks_total", ju(s->demotions.blocks));
    set(dem, "bytes_total", ju(s->demotions.bytes));
    set(dem, "aborted_total", ju(s->demotions.aborted));
    set(dem, "failed_total", ju(s->demotions.failed));
    set(dem, "dropped_total", ju(s->demotions.dropped));
    set(dem, "failed_batches_total", ju(s->demotions.failed_batches));
    set(dem, "down_dropped_total", ju(s->demotions.down_dropped));
    set(dem, "hbm_puts_total", ju(s->demotions.hbm_puts));
    set(dem, "hbm_fallbacks_total", ju(s->demotions.hbm_fallbacks));
    if (s->demotions.has_copier) {
        const struct copier_stats *cs = &s->demotions.copier;
        set(dem, "batches_total", ju(cs->batches));
        set(dem, "transfers_total", ju(cs->transfers));
        set(dem, "chunk_splits_total", ju(cs->chunk_splits));
        set(dem, "copy_seconds_total", json_real((double)cs->busy_ns * 1e-9));
        set(dem, "batches_pending", ju(cs->pending));
    }
    set(root, "demotions", dem);
}

/* "persist": the store's state, its queue, what went through it, failures by
 * op and kind, promotions, lookups, deferred answers and recovery. */
static void persist_json(const struct cache_persist_stats *p, json_t *root)
{
    const struct persist_counters *pc = &p->store;
    json_t *o = json_object(), *fail, *rec;

    if (!p->on) {
        set(o, "backend", json_string("off"));
        set(o, "state", json_string(persist_state_name(PERSIST_STATE_OFF)));
        set(root, "persist", o);
        return;
    }
    fail = json_object();
    rec = json_object();
    set(o, "backend", json_string(p->backend));
    set(o, "policy", json_string(p->policy));
    set(o, "state", json_string(persist_state_name(pc->state)));
    set(o, "last_error", json_string(p->last_error));
    set(o, "lookup_on_miss", json_boolean(p->lookup_on_miss));
    set(o, "workers", json_integer(pc->workers));
    set(o, "queue_depth", ju(pc->queue_depth));
    set(o, "queue_capacity", ju(pc->queue_capacity));
    set(o, "written_blocks_total", ju(pc->written_blocks));
    set(o, "written_bytes_total", ju(pc->written_bytes));
    set(o, "read_blocks_total", ju(pc->read_blocks));
    set(o, "read_bytes_total", ju(pc->read_bytes));
    set(o, "read_misses_total", ju(pc->read_misses));
    set(o, "deleted_keys_total", ju(pc->deleted_keys));
    set(o, "tombstones", ju(pc->tombstones));
    set(o, "tombstones_dropped_total", ju(pc->tombstones_dropped));
    set(o, "tombstone_hits_total", ju(pc->tombstone_hits));
    set(o, "check_mismatches_total", ju(pc->check_mismatches));
    set(o, "dropped_total", ju(p->dropped));
    set(o, "stop_unwritten_total", ju(p->stop_unwritten));
    if (pc->file_on) {
        const struct kvs_file_stats *fs = &pc->file;
        json_t *f = json_object();
        set(f, "segments", ju(fs->segments));
        set(f, "disk_bytes", ju(fs->disk_bytes));
        set(f, "live_blocks", ju(fs->blocks));
        set(f, "live_bytes", ju(fs->bytes));
        set(f, "capacity_bytes", ju(fs->capacity_bytes));
        set(f, "direct_io", json_boolean(fs->direct_io != 0));
        set(f, "evicted_blocks_total", ju(fs->evicted));
        set(f, "evicted_bytes_total", ju(fs->evicted_bytes));
        set(f, "segments_dropped_total", ju(fs->segments_dropped));
        set(f, "segments_reclaimed_total", ju(fs->segments_reclaimed));
        set(f, "corrupt_total", ju(fs->corrupt));
        set(f, "torn_tails_total", ju(fs->torn_tails));
        set(f, "torn_bytes_total", ju(fs->torn_bytes));
        set(f, "resync_records_total", ju(fs->resync_records));
        set(f, "resync_bytes_total", ju(fs->resync_bytes));
        set(f, "hints_loaded_total", ju(fs->hints_loaded));
        set(f, "hints_bad_total", ju(fs->hints_bad));
        set(o, "file", f);
    }
    for (int op = 0; op < PERSIST_OPS; op++) {
        json_t *kinds = json_object();
        for (int k = 0; k < PERSIST_FAIL_KINDS; k++)
            set(kinds, persist_failure_kind_name(k), ju(pc->failures[op][k]));
        set(fail, persist_op_name(op), kinds);
    }
    set(o, "failures_total", fail);
    json_t *probes = json_object();
    static const char *const probe_kinds[PERSIST_PROBE_KINDS] = { "health", "write" };
    for (int k = 0; k < PERSIST_PROBE_KINDS; k++) {
        json_t *r = json_object();
        set(r, "ok", ju(pc->probes_ok[k]));
        set(r, "failed", ju(pc->probes_failed[k]));
        set(probes, probe_kinds[k], r);
    }
    set(o, "probes_total", probes);
    set(o, "writes_deferred_total", ju(p->writes_deferred));
    set(o, "queue_refused_total", ju(pc->refused_queue_full));
    set(o, "writes_waiting", ju(p->writes_waiting));
    set(o, "pinned_for_writes_bytes", ju(p->pinned_for_writes_bytes));
    set(o, "write_retries_total", ju(p->write_retries));
    set(o, "retry_pending", ju(p->retry_pending));
    set(o, "put_waits_total", ju(p->put_waits));
    set(o, "put_wait_timeouts_total", ju(p->put_wait_timeouts));
    set(o, "promotions_total", ju(p->promotions));
    set(o, "promotions_ok_total", ju(p->promotions_ok));
    set(o, "promotions_failed_total", ju(p->promotions_failed));
    set(o, "lookups_total", ju(p->lookups));
    set(o, "lookup_found_total", ju(p->lookup_found));
    set(o, "lookup_reads_total", ju(p->lookup_reads));
    set(o, "lookup_negative_hits_total", ju(p->lookup_negative_hits));
    set(o, "waits_total", ju(p->waits));
    set(o, "wait_timeouts_total", ju(p->wait_timeouts));
    set(rec, "running", json_boolean(pc->scan_running));
    set(rec, "complete", json_boolean(pc->scan_complete));
    set(rec, "found", ju(pc->scan_found));
    set(rec, "indexed", ju(p->recovered));
    set(rec, "skipped", ju(p->recovery_skipped));
    if (p->has_recovery_seconds)
        set(rec, "seconds", json_real(p->recovery_seconds));
    set(o, "recovery", rec);
    if (strcmp(p->backend, "redis") == 0) {
        /* The cluster client's routing, over every tenant's store. */
        struct rcl_counters rc;
        json_t *r = json_object();
        rcl_get_totals(&rc);
        set(r, "moved_total", ju(rc.moved));
        set(r, "ask_total", ju(rc.ask));
        set(r, "tryagain_total", ju(rc.tryagain));
        set(r, "clusterdown_total", ju(rc.clusterdown));
        set(r, "reconnects_total", ju(rc.reconnects));
        set(r, "map_refreshes_total", ju(rc.map_refreshes));
        set(o, "redis", r);
    }
    set(root, "persist", o);
}

static void namespaces_json(const struct stats_ns_source *src, size_t nsrc, json_t *root)
{
    json_t *nss = json_array();

    for (size_t k = 0; k < nsrc; k++) {
        for (size_t i = 0; i < src[k].n; i++) {
            struct cache_namespace_stats ns;
            json_t *o = json_object();
            cache_namespace_stats(src[k].cache, i, &ns);
            if (src[k].tenant)
                set(o, "tenant", json_string(src[k].tenant));
            set(o, "id", json_integer(ns.id));
            set(o, "deployment_id", json_string(ns.deployment_id));
            set(o, "model", json_string(ns.model));
            set(o, "dtype", json_string(ns.dtype));
            set(o, "revision", json_string(ns.revision));
            set(o, "block_tokens", json_integer(ns.block_tokens));
            set(o, "block_bytes", ju(ns.block_bytes));
            set(o, "tp_size", json_integer(ns.tp_size));
            set(o, "tp_rank", json_integer(ns.tp_rank));
            set(o, "blocks", ju(ns.blocks));
            set(o, "bytes", ju(ns.bytes));
            set(o, "reserved_bytes", ju(ns.reserved_bytes));
            set(o, "stored_blocks", ju(ns.stored_blocks));
            set(o, "quota_bytes", ju(ns.quota_bytes));
            set(o, "clients", json_integer(ns.clients));
            set(o, "active", json_boolean(ns.active));
            json_array_append_new(nss, o);
        }
    }
    set(root, "namespaces", nss);
}

/* "tenants": each tenant by name and counts (never its models). */
static void tenants_json(const struct stats_snapshot *s, json_t *root)
{
    json_t *arr = json_array();

    for (size_t i = 0; i < s->ntenants; i++) {
        const struct stats_tenant *t = &s->tenants[i];
        json_t *o = json_object();
        set(o, "name", json_string(t->name));
        set(o, "clients", json_integer(t->clients));
        set(o, "refused_total", ju(t->refused));
        set(o, "max_clients", json_integer(t->max_clients));
        set(o, "output_buffered_bytes", ju(t->output_buffered));
        set(o, "host_capacity_bytes", ju(t->host_capacity));
        set(o, "host_used_bytes", ju(t->host_used));
        set(o, "hbm_capacity_bytes", ju(t->hbm_capacity));
        set(o, "hbm_used_bytes", ju(t->hbm_used));
        set(o, "namespaces", ju(t->namespaces));
        set(o, "namespaces_active", ju(t->namespaces_active));
        set(o, "blocks", ju(t->blocks));
        set(o, "store_blocks", ju(t->store_blocks));
        set(o, "evictions_total", ju(t->evictions));
        set(o, "keys_matched_total", ju(t->keys_matched));
        set(o, "keys_missed_total", ju(t->keys_missed));
        set(o, "check_mismatches_total", ju(t->check_mismatches));
        json_array_append_new(arr, o);
    }
    set(root, "tenants", arr);
}

static void cache_json(const struct cache_stats *s, const struct stats_ns_source *src, size_t nsrc,
                       json_t *root)
{
    json_t *tiers = json_object(), *host = json_object();
    json_t *leases = json_object(), *ev = json_object(), *evh = json_object();

    set(host, "capacity_bytes", ju(s->host.capacity));
    set(host, "used_bytes", ju(s->host.used_bytes));
    set(host, "blocks", ju(s->host.blocks));
    set(host, "slab_bytes", ju(s->host.slab_bytes));
    set(host, "page_size", ju(s->host_page_size));
    set(host, "huge_pages", json_string(s->huge_pages ? s->huge_pages : "off"));
    set(host, "slabs_total", json_integer(s->host.slabs_total));
    set(host, "slabs_free", json_integer(s->host.slabs_free));
    set(host, "high_watermark", json_real(s->high_watermark));
    set(host, "low_watermark", json_real(s->low_watermark));
    set(host, "reserved_bytes", ju(s->host.reserved_bytes));
    set(host, "populate_state", json_string(s->populate_state));
    set(host, "populate_seconds", json_real(s->populate_seconds));
    if (s->has_populate_error)
        set(host, "populate_error", json_string(s->populate_error));
    set(host, "numa", json_string(s->numa ? s->numa : "off"));
    if (s->numa_regions) {
        json_t *regions = json_array();
        for (unsigned r = 0; r < s->numa_regions; r++) {
            json_t *o = json_object();
            set(o, "node", json_integer(s->numa_region[r].node));
            set(o, "gpus", json_integer(s->numa_region[r].gpus));
            set(o, "placed", json_boolean(s->numa_region[r].placed));
            set(o, "capacity_bytes", ju(s->numa_region[r].capacity_bytes));
            set(o, "used_bytes", ju(s->numa_region[r].used_bytes));
            json_array_append_new(regions, o);
        }
        set(host, "numa_regions", regions);
    }
    pin_json(s, host);
    set(tiers, "host", host);
    hbm_json(s, tiers, root);
    if (s->has_store) {
        json_t *store = json_object();
        set(store, "blocks", ju(s->store_blocks));
        set(tiers, "store", store);
    }
    set(root, "tiers", tiers);

    namespaces_json(src, nsrc, root);
    set(root, "namespaces_active", ju(s->namespaces_active));
    set(root, "namespaces_reclaimed_total", ju(s->namespaces_reclaimed));

    set(leases, "read", ju(s->leases.read));
    set(leases, "write", ju(s->leases.write));
    set(leases, "reaped_total", ju(s->leases.reaped_read + s->leases.reaped_write));
    set(leases, "reaped_read_total", ju(s->leases.reaped_read));
    set(leases, "reaped_write_total", ju(s->leases.reaped_write));
    set(leases, "max_reserved_per_client_bytes", ju(s->leases.max_reserved_per_client_bytes));
    set(leases, "reservations_refused_total", ju(s->leases.reservations_refused));
    set(root, "leases", leases);

    set(evh, "to_store_total", ju(s->evictions.to_store));
    set(evh, "writeback_total", ju(s->evictions.writeback));
    set(evh, "dropped_total", ju(s->evictions.dropped));
    set(evh, "quota_total", ju(s->evictions.quota));
    set(ev, "host", evh);
    set(root, "evictions", ev);
    persist_json(&s->persist, root);
}

void stats_cache_json(struct cache *c, json_t *root)
{
    struct cache_stats *s = malloc(sizeof *s);
    if (!s)
        return;
    cache_get_stats(c, s);
    struct stats_ns_source src = { .cache = c, .n = s->namespaces };
    cache_json(s, &src, 1, root);
    free(s);
}

static void server_json(const struct server_stats *s, json_t *root)
{
    json_t *clients = json_object(), *frames = json_object();

    set(clients, "connected", ju(s->connected));
    set(clients, "accepted_total", ju(s->accepted));
    set(clients, "refused_total", ju(s->refused));
    set(clients, "denied_total", ju(s->denied));
    set(clients, "accept_pauses_total", ju(s->accept_pauses));
    set(clients, "input_buffered_bytes", ju(s->input_buffered_bytes));
    set(clients, "input_reserved_bytes", ju(s->input_reserved_bytes));
    set(clients, "input_waiting", ju(s->input_waiting));
    set(clients, "input_waits_total", ju(s->input_waits));
    set(clients, "output_buffered_bytes", ju(s->output_buffered_bytes));
    set(clients, "input_paused_total", ju(s->input_paused));
    set(clients, "hello_timeouts_total", ju(s->hello_timeouts));
    set(clients, "output_limit_closed_total", ju(s->output_limit_closed));
    set(clients, "output_limit_refused_total", ju(s->output_limit_refused));
    set(clients, "hbm_lent", ju(s->hbm_lent));
    set(clients, "going_away_total", ju(s->going_away));
    set(root, "clients", clients);
    set(frames, "rejected_total", ju(s->frames_rejected));
    set(frames, "timed_out_total", ju(s->frames_timed_out));
    set(root, "frames", frames);
}

/* "requests" (ops with any) and "keys". */
static void requests_json(const struct ops_stats *o, const struct metrics_keys *k, json_t *root)
{
    json_t *reqs = json_object(), *keys = json_object();

    for (int op = 0; op < METRICS_OP_SLOTS; op++) {
        json_t *c;
        if (!o->requests[op].ok && !o->requests[op].error)
            continue;
        c = json_object();
        set(c, "ok", ju(o->requests[op].ok));
        set(c, "error", ju(o->requests[op].error));
        set(reqs, wire_op_name(op), c);
    }
    set(root, "requests", reqs);
    set(keys, "matched_total", ju(k->matched));
    set(keys, "missed_total", ju(k->absent + k->writing + k->beyond_gap));
    set(keys, "missed_absent_total", ju(k->absent));
    set(keys, "missed_writing_total", ju(k->writing));
    set(keys, "missed_beyond_gap_total", ju(k->beyond_gap));
    set(keys, "check_mismatches_total", ju(k->check_mismatches));
    set(root, "keys", keys);
}

/* The KVS front end (issue 18): its addresses, requests by route, keys and leases. */
static void kvs_json(const struct stats_snapshot *s, json_t *root)
{
    const struct kvs_server_stats *k = &s->kvs;
    json_t *o, *r;

    if (!s->has_kvs) {
        set(root, "kvs_server", json_null());
        return;
    }
    o = json_object();
    r = json_object();
    set(o, "http_address", json_string(k->http_address ? k->http_address : ""));
    set(o, "socket_path", json_string(k->socket_path ? k->socket_path : ""));
    set(r, "health_total", ju(k->health));
    set(r, "acquire_read_total", ju(k->acquire_read));
    set(r, "acquire_create_total", ju(k->acquire_create));
    set(r, "seal_total", ju(k->seal));
    set(r, "release_total", ju(k->release));
    set(r, "discard_total", ju(k->discard));
    set(r, "bad_total", ju(k->bad_requests));
    set(r, "denied_total", ju(k->denied));
    set(r, "failed_total", ju(k->failed));
    set(o, "requests", r);
    set(o, "read_keys_total", ju(k->read_keys));
    set(o, "read_hits_total", ju(k->read_hits));
    set(o, "create_keys_total", ju(k->create_keys));
    set(o, "create_existing_total", ju(k->create_existing));
    set(o, "leases_open", ju(k->leases_open));
    set(o, "leases_expired_total", ju(k->leases_expired));
    set(o, "dataplane_open", ju(k->dataplane_open));
    set(o, "dataplane_accepted_total", ju(k->dataplane_accepted));
    set(o, "dataplane_refused_total", ju(k->dataplane_refused));
    set(o, "dataplane_denied_total", ju(k->dataplane_denied));
    set(o, "dataplane_tenant_limit_total", ju(k->dataplane_tenant_limit));
    set(o, "dataplane_timed_out_total", ju(k->dataplane_timed_out));
    set(o, "fds_lent_total", ju(k->fds_lent));
    r = json_object();
    set(r, "open", ju(k->http_open));
    set(r, "max", ju(k->http_max));
    set(r, "accepted_total", ju(k->http_accepted));
    set(r, "refused_total", ju(k->http_refused));
    set(r, "timed_out_total", ju(k->http_timed_out));
    set(r, "tenant_limit_total", ju(k->http_tenant_limit));
    set(o, "http_connections", r);
    r = json_object();
    set(r, "bytes", ju(k->http_output_bytes));
    set(r, "max_bytes", ju(k->http_output_max));
    set(r, "refused_total", ju(k->http_output_refused));
    set(r, "tenant_limit_total", ju(k->http_output_tenant_limit));
    set(r, "inline_total", ju(k->http_replies_inline));
    set(o, "http_output", r);
    r = json_object();
    set(r, "bytes", ju(k->http_input_bytes));
    set(r, "max_bytes", ju(k->http_input_max));
    set(r, "refused_total", ju(k->http_input_refused));
    set(r, "tenant_limit_total", ju(k->http_input_tenant_limit));
    set(r, "reads_extended_total", ju(k->http_reads_extended));
    set(r, "reads_early_total", ju(k->http_reads_early));
    set(o, "http_input", r);
    set(root, "kvs_server", o);
}

static void admin_json(const struct stats_snapshot *s, json_t *root)
{
    const struct admin_stats *a = &s->admin;
    json_t *o;

    set(root, "admin", s->admin_address ? json_string(s->admin_address) : json_null());
    if (!s->admin_address)
        return;
    o = json_object();
    set(o, "open", ju(a->open));
    set(o, "max", ju(a->max));
    set(o, "accepted_total", ju(a->accepted));
    set(o, "refused_total", ju(a->refused));
    set(o, "refused_reserve_total", ju(a->refused_reserve));
    set(o, "timed_out_total", ju(a->timed_out));
    set(o, "accept_pauses_total", ju(a->accept_pauses));
    set(root, "admin_connections", o);
}

/* "kvcm", with "query" when remote queries are on. */
static void kvcm_json(const struct stats_snapshot *s, json_t *root)
{
    const struct kvcm_stats *k = &s->kvcm;
    json_t *o = json_object();

    set(o, "state", json_string(kvcm_state_name(k->state)));
    if (k->on) {
        json_t *media = json_array(), *deps = json_array();
        set(o, "stalled", json_boolean(k->stalled));
        set(o, "stalled_ms", ju(k->stalled_ms));
        set(o, "stall_timeout_ms", ju(k->stall_timeout_ms));
        set(o, "epoch", ju(k->epoch));
        set(o, "generation", ju(k->generation));
        set(o, "queue", ju(k->queue));
        set(o, "queue_capacity", ju(k->queue_capacity));
        set(o, "accepted_total", ju(k->accepted));
        set(o, "dropped_total", ju(k->dropped));
        set(o, "snapshots_total", ju(k->snapshots));
        set(o, "heartbeats_ok_total", ju(k->heartbeats_ok));
        set(o, "heartbeats_failed_total", ju(k->heartbeats_failed));
        set(o, "last_snapshot_unix_ms", ju(k->last_snapshot_unix_ms));
        set(o, "last_error", json_string(k->last_error));
        set(o, "host_ip_port", json_string(k->host_ip_port));
        for (size_t i = 0; i < k->nmedia; i++)
            json_array_append_new(media, json_string(k->media[i]));
        set(o, "media", media);
        for (size_t i = 0; s->show_deployments && i < k->ndeployments; i++) {
            const struct kvcm_deployment_stats *d = &k->deployments[i];
            json_t *dj = json_object();
            set(dj, "deployment_id", json_string(d->deployment_id));
            set(dj, "instance_id", json_string(d->instance_id));
            set(dj, "registered", json_boolean(d->registered));
            if (d->refused)
                set(dj, "refused", json_string(d->refused));
            json_array_append_new(deps, dj);
        }
        set(o, "deployments", deps);
    }
    set(root, "kvcm", o);
    if (s->has_query) {
        const struct kvcm_query_stats *q = &s->query;
        json_t *qj = json_object();
        set(qj, "asked_total", ju(q->asked));
        set(qj, "ok_total", ju(q->ok));
        set(qj, "failed_total", ju(q->failed));
        set(qj, "deadline_total", ju(q->deadline));
        set(qj, "local_only_total", ju(q->local_only));
        set(qj, "breaker_opened_total", ju(q->breaker_opened));
        set(qj, "breaker_open", json_boolean(q->breaker_open));
        set(qj, "last_error", json_string(q->last_error));
        set(o, "query", qj);
    }
}

static void gpu_json(const struct gpu_stats *g, const struct ops_stats *ops, json_t *root)
{
    json_t *o = json_object();

    set(o, "backend", json_string(g->backend));
    set(o, "devices_visible", json_integer(g->devices_visible));
    set(o, "hbm_arenas", json_integer(g->hbm_arenas));
    set(o, "hbm_off_reason", g->hbm_off_reason ? json_string(g->hbm_off_reason) : json_null());
    /* Clients that could not map the HBM lent to them and reconnected host-only. */
    set(o, "hbm_unusable_clients", ju(ops->hbm_unusable_clients));
    set(o, "hbm_unusable_last", ops->hbm_unusable_last && *ops->hbm_unusable_last
                                    ? json_string(ops->hbm_unusable_last) : json_null());
    set(root, "gpu", o);
}

/* This start's warm restart (warm.h): adopted blocks are not "recovered"
 * (the store's scan) and were never read from the store. */
static void warm_json(const struct cache_stats *cs, json_t *root)
{
    const struct warm_status *w = warm_status();
    json_t *o = json_object();
    set(o, "state", json_string(w->state));
    set(o, "source", json_string(w->source));
    set(o, "reason", json_string(w->why));
    set(o, "from_version", json_string(w->from_version));
    set(o, "adopted_blocks", ju(cs->adopted_blocks));
    set(o, "adopted_bytes", ju(cs->adopted_bytes));
    set(o, "dropped_blocks", ju(w->dropped_blocks));
    set(o, "seconds", json_real(w->seconds));
    set(root, "warm_restart", o);
}

json_t *stats_json(const struct stats_snapshot *s)
{
    json_t *root = json_object(), *reloads = json_object();

    if (!root || !reloads) {
        json_decref(root);
        json_decref(reloads);
        return NULL;
    }
    set(root, "version", json_string(KVNODE_VERSION_STRING));
    set(root, "protocol", json_integer(WIRE_PROTOCOL_VERSION));
    set(root, "pid", json_integer(getpid()));
    set(root, "uptime_s", json_real(s->ops.uptime_s));
    set(root, "socket", json_string(s->ops.socket_path));
    cache_json(&s->cache_stats, s->ns, s->nns, root);
    if (s->has_tenants)
        tenants_json(s, root);
    if (s->has_server)
        server_json(&s->server, root);
    requests_json(&s->ops, &s->cache_stats.keys, root);
    admin_json(s, root);
    kvs_json(s, root);
    set(reloads, "ok_total", ju(s->reloads_ok));
    set(reloads, "failed_total", ju(s->reloads_failed));
    set(reloads, "last_error", json_string(s->last_reload_error));
    set(root, "reloads", reloads);
    kvcm_json(s, root);
    warm_json(&s->cache_stats, root);
    if (s->has_gpu)
        gpu_json(&s->gpu, &s->ops, root);
    return root;
}

json_t *stats_document_for(struct daemon *d, const struct stats_view *view)
{
    struct stats_snapshot *s = malloc(sizeof *s);
    json_t *doc;

    if (!s)
        return NULL;
    stats_collect(d, view, s);
    doc = stats_json(s);
    free(s);
    return doc;
}

json_t *stats_document(struct daemon *d)
{
    struct stats_view view = stats_admin_view(d);
    return stats_document_for(d, &view);
}
