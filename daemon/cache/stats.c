/* cache stats: fills the cache's typed snapshot (struct cache_stats in
 * cache.h) — tiers, namespaces, leases, evictions, demotions and
 * persistence — from which daemon/stats.c builds the STATS document and
 * metrics.c the Prometheus page. Loop thread only. */
#include "cache/cache_internal.h"

#include <string.h>

#include "core/clock.h"
#include "gpu/copier.h"
#include "gpu/hostpin.h"
#include "mem/populate.h"
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
    o->stop_unwritten = c->stop_unwritten;
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
    o->lookup_reads = c->lookup_reads;
    o->lookup_negative_hits = c->lookup_negative_hits;
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

/* Background reservation of the host arena: populate_state, _seconds, _error. */
static void cache_populate_stats(struct cache *c, struct cache_stats *out)
{
    static const char *const states[] = { "running", "done", "failed", "stopped" };
    struct populate_progress pp;

    populate_progress(c->populate, &pp);
    out->populate_state = pp.state >= 0 && pp.state < 4 ? states[pp.state] : "done";
    out->populate_seconds = c->populate ? pp.seconds : 0.0;
    out->has_populate_error = pp.state == POPULATE_FAILED;
    if (out->has_populate_error)
        snprintf(out->populate_error, sizeof out->populate_error, "%s", pp.why);
}

int cache_populate_state(struct cache *c, char *why, size_t whylen)
{
    struct populate_progress pp;

    populate_progress(c->populate, &pp);
    if (pp.state == POPULATE_FAILED && why && whylen)
        snprintf(why, whylen, "%s", pp.why);
    return pp.state;
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
        o->down = h->down;
        o->down_reason = h->down_why;
        o->down_dropped = h->down_dropped;
        o->backoff_ms = h->backoff_ms;
        o->failing_batches = h->failing_batches;
    }
    out->demotions.high_watermark = c->hbm_high;
    out->demotions.low_watermark = c->hbm_low;
    out->demotions.blocks = c->demoted;
    out->demotions.bytes = c->demoted_bytes;
    out->demotions.aborted = c->demote_aborted;
    out->demotions.failed = c->demote_failed;
    out->demotions.dropped = c->demote_dropped;
    out->demotions.failed_batches = c->demote_failed_batches;
    out->demotions.down_dropped = c->hbm_down_dropped;
    out->demotions.hbm_puts = c->hbm_reserved;
    out->demotions.hbm_fallbacks = c->hbm_fallbacks;
    out->demotions.has_copier = c->copier != NULL;
    if (c->copier)
        copier_stats(c->copier, &out->demotions.copier);
}

static void cache_numa_stats(const struct cache *c, struct cache_stats *out)
{
    out->numa = numa_mode_name(c->numa.mode);
    out->numa_regions = c->numa.mode == NUMA_MODE_PER_GPU ? (unsigned)c->numa.nregions : 0;
    for (unsigned r = 0; r < out->numa_regions; r++) {
        struct arena_region_stats st;
        arena_get_region_stats(c->host, r, &st);
        out->numa_region[r].node = c->numa.regions[r].node;
        out->numa_region[r].gpus = c->numa.regions[r].gpus;
        out->numa_region[r].placed = c->numa.regions[r].placed;
        out->numa_region[r].capacity_bytes = st.end - st.start;
        out->numa_region[r].used_bytes = st.used_bytes;
    }
}

void cache_get_stats(struct cache *c, struct cache_stats *out)
{
    memset(out, 0, sizeof *out);
    arena_get_stats(c->host, &out->host);
    out->host_page_size = arena_page_size(c->host);
    out->huge_pages = arena_huge_pages(c->host);
    out->high_watermark = c->high_watermark;
    out->low_watermark = c->low_watermark;
    cache_pin_stats(c, out);
    cache_populate_stats(c, out);
    cache_numa_stats(c, out);
    cache_hbm_stats(c, out);
    out->has_store = c->persist != NULL;
    out->store_blocks = c->ghosts;
    out->adopted_blocks = c->adopted;
    out->adopted_bytes = c->adopted_bytes;
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
    /* The store's lookups and reads are lookups too. */
    if (out->persist.on)
        out->keys.check_mismatches += out->persist.store.check_mismatches;
}

void cache_namespace_stats(struct cache *c, size_t i, struct cache_namespace_stats *out)
{
    struct kv_namespace *ns = ns_at(c->namespaces, i);

    *out = (struct cache_namespace_stats){
        .id = ns->id, .deployment_id = ns->deployment_id,
        .model = ns->layout.model, .dtype = ns->layout.dtype, .revision = ns->layout.revision,
        .block_tokens = ns->layout.block_tokens, .block_bytes = ns->layout.block_bytes,
        .tp_size = ns->layout.tp_size, .tp_rank = ns->layout.tp_rank,
        .blocks = ns->blocks, .bytes = ns->bytes, .reserved_bytes = ns->reserved,
        .stored_blocks = ns->stored, .quota_bytes = c->namespace_quota,
        .clients = ns->clients, .active = ns_active(ns),
    };
}

/* The worse of two pin states, for a node total: failed, running, stopped,
 * done, off. */
static const char *cache_pin_worse(const char *a, const char *b)
{
    static const char *const order[] = { "failed", "running", "stopped", "done", "off" };
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (strcmp(a, order[i]) == 0 || strcmp(b, order[i]) == 0)
            return order[i];
    return a;
}

static void cache_arena_stats_add(struct arena_stats *sum, const struct arena_stats *x)
{
    sum->capacity += x->capacity;
    sum->used_bytes += x->used_bytes;
    sum->slabs_total += x->slabs_total;
    sum->slabs_free += x->slabs_free;
    sum->reserved_bytes += x->reserved_bytes;
    sum->blocks += x->blocks;
    if (!sum->slab_bytes)
        sum->slab_bytes = x->slab_bytes;
}

static void cache_persist_stats_add(struct cache_persist_stats *sum, const struct cache_persist_stats *x)
{
    struct persist_counters *s = &sum->store;
    const struct persist_counters *c = &x->store;

    if (!x->on)
        return;
    if (!sum->on) {
        *sum = *x;
        return;
    }
    if ((!sum->last_error || !*sum->last_error) && x->last_error)
        sum->last_error = x->last_error;
    s->written_blocks += c->written_blocks;
    s->written_bytes += c->written_bytes;
    s->read_blocks += c->read_blocks;
    s->read_bytes += c->read_bytes;
    s->read_misses += c->read_misses;
    s->deleted_keys += c->deleted_keys;
    s->tombstones += c->tombstones;
    s->tombstones_dropped += c->tombstones_dropped;
    s->tombstone_hits += c->tombstone_hits;
    s->check_mismatches += c->check_mismatches;
    for (int op = 0; op < PERSIST_OPS; op++)
        for (int k = 0; k < PERSIST_FAIL_KINDS; k++)
            s->failures[op][k] += c->failures[op][k];
    for (int k = 0; k < PERSIST_PROBE_KINDS; k++) {
        s->probes_ok[k] += c->probes_ok[k];
        s->probes_failed[k] += c->probes_failed[k];
    }
    s->refused_queue_full += c->refused_queue_full;
    s->submitted += c->submitted;
    s->completed += c->completed;
    s->queue_depth += c->queue_depth;
    s->queue_capacity += c->queue_capacity;
    s->workers += c->workers;
    s->scan_running = s->scan_running || c->scan_running;
    s->scan_complete = s->scan_complete && c->scan_complete;
    s->scan_found += c->scan_found;
    if (c->scan_started_ms && (!s->scan_started_ms || c->scan_started_ms < s->scan_started_ms))
        s->scan_started_ms = c->scan_started_ms;
    s->scan_finished_ms = !s->scan_finished_ms || !c->scan_finished_ms ? 0
                          : c->scan_finished_ms > s->scan_finished_ms ? c->scan_finished_ms
                          : s->scan_finished_ms;
    if (c->state == PERSIST_STATE_DEGRADED)
        s->state = PERSIST_STATE_DEGRADED;
    sum->dropped += x->dropped;
    sum->stop_unwritten += x->stop_unwritten;
    sum->writes_deferred += x->writes_deferred;
    sum->writes_waiting += x->writes_waiting;
    sum->pinned_for_writes_bytes += x->pinned_for_writes_bytes;
    sum->write_retries += x->write_retries;
    sum->retry_pending += x->retry_pending;
    sum->put_waits += x->put_waits;
    sum->put_wait_timeouts += x->put_wait_timeouts;
    sum->promotions += x->promotions;
    sum->promotions_ok += x->promotions_ok;
    sum->promotions_failed += x->promotions_failed;
    sum->lookups += x->lookups;
    sum->lookup_found += x->lookup_found;
    sum->lookup_reads += x->lookup_reads;
    sum->lookup_negative_hits += x->lookup_negative_hits;
    sum->waits += x->waits;
    sum->wait_timeouts += x->wait_timeouts;
    sum->recovered += x->recovered;
    sum->recovery_skipped += x->recovery_skipped;
    if (x->has_recovery_seconds) {
        if (!sum->has_recovery_seconds || x->recovery_seconds > sum->recovery_seconds)
            sum->recovery_seconds = x->recovery_seconds;
        sum->has_recovery_seconds = true;
    }
}

void cache_stats_add(struct cache_stats *sum, const struct cache_stats *x, bool first)
{
    if (first) {
        *sum = *x;
        return;
    }
    cache_arena_stats_add(&sum->host, &x->host);
    sum->pinned = sum->pinned && x->pinned;
    sum->pinned_bytes += x->pinned_bytes;
    sum->pin_state = cache_pin_worse(sum->pin_state, x->pin_state);
    if (x->host_page_size < sum->host_page_size)
        sum->host_page_size = x->host_page_size;
    if (strcmp(sum->huge_pages, x->huge_pages) != 0)
        sum->huge_pages = "mixed";
    sum->populate_state = cache_pin_worse(sum->populate_state, x->populate_state);
    if (x->populate_seconds > sum->populate_seconds)
        sum->populate_seconds = x->populate_seconds;
    for (unsigned r = 0; r < sum->numa_regions && r < x->numa_regions; r++) {
        sum->numa_region[r].placed = sum->numa_region[r].placed && x->numa_region[r].placed;
        sum->numa_region[r].capacity_bytes += x->numa_region[r].capacity_bytes;
        sum->numa_region[r].used_bytes += x->numa_region[r].used_bytes;
    }
    if (!sum->has_populate_error && x->has_populate_error) {
        sum->has_populate_error = true;
        memcpy(sum->populate_error, x->populate_error, sizeof sum->populate_error);
    }
    if (!sum->has_pin_error && x->has_pin_error) {
        sum->has_pin_error = true;
        memcpy(sum->pin_error, x->pin_error, sizeof sum->pin_error);
    }
    /* HBM: one entry per device, whoever's region it is. */
    for (unsigned i = 0; i < x->nhbm; i++) {
        unsigned j = 0;
        while (j < sum->nhbm && sum->hbm[j].device != x->hbm[i].device)
            j++;
        if (j == sum->nhbm) {
            if (sum->nhbm == DEVMEM_MAX_DEVICES)
                continue;
            sum->hbm[sum->nhbm++] = x->hbm[i];
            continue;
        }
        cache_arena_stats_add(&sum->hbm[j].mem, &x->hbm[i].mem);
        sum->hbm[j].moving_bytes += x->hbm[i].moving_bytes;
        sum->hbm[j].down_dropped += x->hbm[i].down_dropped;
        if (x->hbm[i].backoff_ms > sum->hbm[j].backoff_ms)
            sum->hbm[j].backoff_ms = x->hbm[i].backoff_ms;
        sum->hbm[j].failing_batches += x->hbm[i].failing_batches;
        if (!sum->hbm[j].down && x->hbm[i].down) {
            sum->hbm[j].down = true;
            sum->hbm[j].down_reason = x->hbm[i].down_reason;
        }
    }
    sum->demotions.blocks += x->demotions.blocks;
    sum->demotions.bytes += x->demotions.bytes;
    sum->demotions.aborted += x->demotions.aborted;
    sum->demotions.failed += x->demotions.failed;
    sum->demotions.dropped += x->demotions.dropped;
    sum->demotions.failed_batches += x->demotions.failed_batches;
    sum->demotions.down_dropped += x->demotions.down_dropped;
    sum->demotions.hbm_puts += x->demotions.hbm_puts;
    sum->demotions.hbm_fallbacks += x->demotions.hbm_fallbacks;
    /* The copier is shared: its counters are the node's already. */
    if (!sum->demotions.has_copier && x->demotions.has_copier) {
        sum->demotions.has_copier = true;
        sum->demotions.copier = x->demotions.copier;
    }
    sum->has_store = sum->has_store || x->has_store;
    sum->store_blocks += x->store_blocks;
    sum->adopted_blocks += x->adopted_blocks;
    sum->adopted_bytes += x->adopted_bytes;
    sum->namespaces += x->namespaces;
    sum->namespaces_active += x->namespaces_active;
    sum->namespaces_reclaimed += x->namespaces_reclaimed;
    sum->leases.read += x->leases.read;
    sum->leases.write += x->leases.write;
    sum->leases.reaped_read += x->leases.reaped_read;
    sum->leases.reaped_write += x->leases.reaped_write;
    /* Per connection: the largest any tenant allows. */
    if (x->leases.max_reserved_per_client_bytes > sum->leases.max_reserved_per_client_bytes)
        sum->leases.max_reserved_per_client_bytes = x->leases.max_reserved_per_client_bytes;
    sum->leases.reservations_refused += x->leases.reservations_refused;
    sum->evictions.to_store += x->evictions.to_store;
    sum->evictions.writeback += x->evictions.writeback;
    sum->evictions.dropped += x->evictions.dropped;
    sum->evictions.quota += x->evictions.quota;
    cache_persist_stats_add(&sum->persist, &x->persist);
    sum->keys.matched += x->keys.matched;
    sum->keys.absent += x->keys.absent;
    sum->keys.writing += x->keys.writing;
    sum->keys.unavailable += x->keys.unavailable;
    sum->keys.beyond_gap += x->keys.beyond_gap;
    sum->keys.check_mismatches += x->keys.check_mismatches;
}
