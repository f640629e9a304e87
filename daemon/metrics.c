/* metrics: the /metrics page (see metrics.h). */
#include "metrics.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "kvnode.h"
#include "stats.h"
#include "warm.h"
#include "wire.h"
#include "core/liveness.h"
#include "persist/kvs/redis_cluster.h"

const char *metrics_status_name(int code)
{
    static const char *const names[] = {
        [0] = "ok",
        [KVNODE_EINVAL] = "einval",       [KVNODE_ENOMEM] = "enomem",
        [KVNODE_ENOSPC] = "enospc",       [KVNODE_ENOLEASE] = "enolease",
        [KVNODE_ELAYOUT] = "elayout",     [KVNODE_EVERSION] = "eversion",
        [KVNODE_EPROTO] = "eproto",       [KVNODE_ETOOBIG] = "etoobig",
        [KVNODE_ETIMEDOUT] = "etimedout", [KVNODE_ECONNECT] = "econnect",
        [KVNODE_ECLOSED] = "eclosed",     [KVNODE_EIO] = "eio",
        [KVNODE_ESTATE] = "estate",       [KVNODE_ELIMIT] = "elimit",
        [KVNODE_EDENIED] = "edenied",     [KVNODE_EINTERNAL] = "einternal",
        [KVNODE_ESHUTDOWN] = "eshutdown",
    };
    int i = code < 0 ? -code : code;
    if (i < (int)(sizeof names / sizeof names[0]) && names[i])
        return names[i];
    return "eunknown";
}

void metrics_escape_label(struct evbuffer *out, const char *text)
{
    for (const char *p = text; *p; p++) {
        switch (*p) {
        case '\\': evbuffer_add(out, "\\\\", 2); break;
        case '"':  evbuffer_add(out, "\\\"", 2); break;
        case '\n': evbuffer_add(out, "\\n", 2); break;
        default:   evbuffer_add(out, p, 1); break;
        }
    }
}

/* ---- page building ------------------------------------------------------- */

static void family(struct evbuffer *out, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{k1="v1",k2="v2"} value; labels: NULL-terminated key/value pairs. */
static void sample_begin(struct evbuffer *out, const char *name, const char *const *labels)
{
    evbuffer_add_printf(out, "%s", name);
    if (labels && labels[0]) {
        evbuffer_add(out, "{", 1);
        for (size_t i = 0; labels[i]; i += 2) {
            evbuffer_add_printf(out, "%s%s=\"", i ? "," : "", labels[i]);
            metrics_escape_label(out, labels[i + 1]);
            evbuffer_add(out, "\"", 1);
        }
        evbuffer_add(out, "}", 1);
    }
}

static void sample_u(struct evbuffer *out, const char *name, const char *const *labels, uint64_t v)
{
    sample_begin(out, name, labels);
    evbuffer_add_printf(out, " %" PRIu64 "\n", v);
}

static void sample_d(struct evbuffer *out, const char *name, const char *const *labels, double v)
{
    sample_begin(out, name, labels);
    evbuffer_add_printf(out, " %.15g\n", v);
}

#define L(...) ((const char *const[]){ __VA_ARGS__, NULL })

static void render_requests(struct evbuffer *out, const struct metrics_requests *r)
{
    char le[32];

    family(out, "kvnode_requests_total", "counter",
           "Protocol requests handled, by operation and status (ok or the error name).");
    for (int op = 0; op < METRICS_OP_SLOTS; op++) {
        const char *name = wire_op_name(op);
        bool known = strcmp(name, "unknown") != 0;
        for (int st = 0; st < METRICS_STATUS_SLOTS; st++) {
            uint64_t n = r->count[op][st];
            /* Known ops always show their ok series, so rates start at 0. */
            if (n == 0 && !(known && st == 0))
                continue;
            sample_u(out, "kvnode_requests_total", L("op", name, "status", metrics_status_name(-st)), n);
        }
    }
    family(out, "kvnode_request_duration_seconds", "histogram",
           "Time from a decoded request to its queued reply, by operation.");
    for (int op = 0; op < METRICS_OP_SLOTS; op++) {
        const struct metrics_histogram *h = &r->latency[op];
        const char *name = wire_op_name(op);
        if (strcmp(name, "unknown") == 0 && h->count == 0)
            continue;
        uint64_t cum = 0;
        for (int i = 0; i <= METRICS_LATENCY_NBOUNDS; i++) {
            cum += h->buckets[i];
            if (i < METRICS_LATENCY_NBOUNDS)
                snprintf(le, sizeof le, "%g", metrics_latency_bounds[i]);
            else
                snprintf(le, sizeof le, "+Inf");
            sample_u(out, "kvnode_request_duration_seconds_bucket", L("op", name, "le", le), cum);
        }
        sample_d(out, "kvnode_request_duration_seconds_sum", L("op", name), h->sum);
        sample_u(out, "kvnode_request_duration_seconds_count", L("op", name), h->count);
    }
}

/* One sample per namespace of every tenant the snapshot lists: its sealed
 * bytes, or blocks (in memory, and in the store with_store). */
static void render_namespaces(struct evbuffer *out, const struct stats_snapshot *snap, const char *name,
                              bool bytes, bool with_store)
{
    char rank[16];

    for (size_t src = 0; src < snap->nns; src++) {
        for (size_t i = 0; i < snap->ns[src].n; i++) {
            struct cache_namespace_stats ns;
            cache_namespace_stats(snap->ns[src].cache, i, &ns);
            snprintf(rank, sizeof rank, "%" PRIu32, ns.tp_rank);
            sample_u(out, name, L("tier", "host", "namespace", ns.deployment_id, "tp_rank", rank),
                     bytes ? ns.bytes : ns.blocks);
            if (with_store)
                sample_u(out, name, L("tier", "store", "namespace", ns.deployment_id, "tp_rank", rank),
                         ns.stored_blocks);
        }
    }
}

static void render_cache(struct evbuffer *out, const struct stats_snapshot *snap)
{
    const struct cache_stats *s = &snap->cache_stats;
    const struct metrics_keys *k = &s->keys;
    char dev[16];

    static const char *const tier_fields[][2] = {
        { "kvnode_tier_capacity_bytes", "Bytes of memory a tier holds (HBM: per device)." },
        { "kvnode_tier_used_bytes", "Bytes of a tier in use (sealed blocks and reservations)." },
        { "kvnode_tier_blocks", "Blocks allocated in a tier (sealed and being written)." },
    };
    for (size_t f = 0; f < 3; f++) {
        uint64_t host = f == 0 ? s->host.capacity : f == 1 ? s->host.used_bytes : s->host.blocks;
        family(out, tier_fields[f][0], "gauge", tier_fields[f][1]);
        sample_u(out, tier_fields[f][0], L("tier", "host"), host);
        for (unsigned i = 0; i < s->nhbm; i++) {
            const struct arena_stats *m = &s->hbm[i].mem;
            snprintf(dev, sizeof dev, "%d", s->hbm[i].device);
            sample_u(out, tier_fields[f][0], L("tier", "hbm", "device", dev),
                     f == 0 ? m->capacity : f == 1 ? m->used_bytes : m->blocks);
        }
    }
    if (s->has_store)
        sample_u(out, "kvnode_tier_blocks", L("tier", "store"), s->store_blocks);
    family(out, "kvnode_host_page_bytes", "gauge",
           "Size of the pages backing the host tier: 4096 for ordinary pages, 2097152 or 1073741824 for "
           "huge pages (memory.huge_pages).");
    sample_u(out, "kvnode_host_page_bytes", NULL, s->host_page_size);
    family(out, "kvnode_host_reserved_bytes", "gauge",
           "Bytes of the host tier reserved and populated so far (blocks are placed only there; "
           "equals the capacity once start-up population is done).");
    sample_u(out, "kvnode_host_reserved_bytes", NULL, s->host.reserved_bytes);
    /* For alerting: a failed population leaves the host tier short for good. */
    family(out, "kvnode_host_populate_state", "gauge",
           "1 for the state of the host tier's start-up population (running, done, failed: the tier "
           "stays at kvnode_host_reserved_bytes, the error in /stats; stopped).");
    static const char *const populate_states[] = { "running", "done", "failed", "stopped" };
    for (size_t i = 0; i < 4; i++)
        sample_u(out, "kvnode_host_populate_state", L("state", populate_states[i]),
                 s->populate_state && strcmp(s->populate_state, populate_states[i]) == 0);
    family(out, "kvnode_host_pinned_bytes", "gauge",
           "Bytes of the host tier registered with the GPU runtime (cudaHostRegister) so far.");
    sample_u(out, "kvnode_host_pinned_bytes", NULL, s->pinned_bytes);
    family(out, "kvnode_demotions_total", "counter",
           "HBM blocks by what their demotion to host memory came to: moved; aborted (a reader "
           "pinned it or it was deleted meanwhile); failed (the copy failed); dropped (no host room).");
    sample_u(out, "kvnode_demotions_total", L("result", "moved"), s->demotions.blocks);
    sample_u(out, "kvnode_demotions_total", L("result", "aborted"), s->demotions.aborted);
    sample_u(out, "kvnode_demotions_total", L("result", "failed"), s->demotions.failed);
    sample_u(out, "kvnode_demotions_total", L("result", "dropped"), s->demotions.dropped);
    family(out, "kvnode_demotion_failed_batches_total", "counter",
           "Demotion batches whose copy failed (the device then backs off, 10 ms doubling to 5 s).");
    sample_u(out, "kvnode_demotion_failed_batches_total", NULL, s->demotions.failed_batches);
    if (s->nhbm > 0) {
        family(out, "kvnode_hbm_up", "gauge",
               "1 while a device's HBM tier is served, 0 once a sticky error took the device "
               "(reason in kvnode_hbm_down_info and /stats).");
        for (unsigned i = 0; i < s->nhbm; i++) {
            snprintf(dev, sizeof dev, "%d", s->hbm[i].device);
            sample_u(out, "kvnode_hbm_up", L("device", dev), s->hbm[i].down ? 0 : 1);
        }
        family(out, "kvnode_hbm_down_info", "gauge",
               "1 for each device whose HBM tier is down, with the error that took it.");
        for (unsigned i = 0; i < s->nhbm; i++) {
            if (!s->hbm[i].down)
                continue;
            snprintf(dev, sizeof dev, "%d", s->hbm[i].device);
            sample_u(out, "kvnode_hbm_down_info", L("device", dev, "reason", s->hbm[i].down_reason), 1);
        }
        family(out, "kvnode_hbm_down_dropped_blocks_total", "counter",
               "HBM blocks dropped because their device went down (not yet demoted).");
        for (unsigned i = 0; i < s->nhbm; i++) {
            snprintf(dev, sizeof dev, "%d", s->hbm[i].device);
            sample_u(out, "kvnode_hbm_down_dropped_blocks_total", L("device", dev), s->hbm[i].down_dropped);
        }
    }
    family(out, "kvnode_demoted_bytes_total", "counter", "Bytes moved from HBM to host memory.");
    sample_u(out, "kvnode_demoted_bytes_total", NULL, s->demotions.bytes);
    family(out, "kvnode_hbm_puts_total", "counter",
           "Blocks put with tier HBM: reserved in HBM, or placed in host memory because HBM had no room.");
    sample_u(out, "kvnode_hbm_puts_total", L("placed", "hbm"), s->demotions.hbm_puts);
    sample_u(out, "kvnode_hbm_puts_total", L("placed", "host"), s->demotions.hbm_fallbacks);

    /* Per namespace only where the reader may see layouts (a node without
     * [tenant.NAME] sections); with sections, per tenant instead. */
    if (snap->nns > 0 || !snap->has_tenants) {
        family(out, "kvnode_namespace_blocks", "gauge",
               "Sealed blocks per tier and namespace (deployment id and TP rank).");
        render_namespaces(out, snap, "kvnode_namespace_blocks", false, s->has_store);
        family(out, "kvnode_namespace_bytes", "gauge",
               "Bytes of sealed blocks per tier and namespace (deployment id and TP rank).");
        render_namespaces(out, snap, "kvnode_namespace_bytes", true, false);
    }

    family(out, "kvnode_keys_total", "counter",
           "Keys looked up by match and get: matched, or missed with the reason (absent: no entry; "
           "writing: reserved, not committed; unavailable: only in the store and not brought back; beyond_gap: after the chain's first miss, not looked at).");
    sample_u(out, "kvnode_keys_total", L("result", "matched"), k->matched);
    sample_u(out, "kvnode_keys_total", L("result", "missed", "reason", "absent"), k->absent);
    sample_u(out, "kvnode_keys_total", L("result", "missed", "reason", "writing"), k->writing);
    sample_u(out, "kvnode_keys_total", L("result", "missed", "reason", "unavailable"), k->unavailable);
    sample_u(out, "kvnode_keys_total", L("result", "missed", "reason", "beyond_gap"), k->beyond_gap);
    family(out, "kvnode_keys_check_mismatches_total", "counter",
           "Lookups (match, get, put, delete, and the store's) that found the key held under another "
           "check word: a miss for that request, the block kept.");
    sample_u(out, "kvnode_keys_check_mismatches_total", NULL, k->check_mismatches);

    family(out, "kvnode_evictions_total", "counter",
           "Blocks evicted, by tier and action (drop: watermarks or a full tier, no copy kept; to_store: "
           "memory freed, the persistent store's copy kept; quota: a namespace's own blocks, over "
           "memory.namespace_quota).");
    sample_u(out, "kvnode_evictions_total", L("tier", "host", "action", "drop"), s->evictions.dropped);
    sample_u(out, "kvnode_evictions_total", L("tier", "host", "action", "to_store"), s->evictions.to_store);
    sample_u(out, "kvnode_evictions_total", L("tier", "host", "action", "quota"), s->evictions.quota);

    family(out, "kvnode_leases", "gauge", "Open leases by kind.");
    sample_u(out, "kvnode_leases", L("kind", "read"), s->leases.read);
    sample_u(out, "kvnode_leases", L("kind", "write"), s->leases.write);
    family(out, "kvnode_leases_reaped_total", "counter", "Leases ended by the reaper after their TTL, by kind.");
    sample_u(out, "kvnode_leases_reaped_total", L("kind", "read"), s->leases.reaped_read);
    sample_u(out, "kvnode_leases_reaped_total", L("kind", "write"), s->leases.reaped_write);
}

/* Per tenant, on a node with [tenant.NAME] sections: memory, blocks,
 * namespaces, clients and evictions by tenant name (never by model). */
static void render_tenants(struct evbuffer *out, const struct stats_snapshot *s)
{
    static const struct { const char *name, *type, *help; } fams[] = {
        { "kvnode_tenant_capacity_bytes", "gauge", "Bytes of memory a tenant owns, by tier (HBM: all devices)." },
        { "kvnode_tenant_used_bytes", "gauge", "Bytes of a tenant's memory in use, by tier." },
        { "kvnode_tenant_blocks", "gauge", "Blocks a tenant holds in memory (host and HBM) or only in its store." },
        { "kvnode_tenant_namespaces", "gauge", "A tenant's namespaces, and those of them active." },
        { "kvnode_tenant_clients", "gauge", "Connections of a tenant now." },
        { "kvnode_tenant_refused_total", "counter", "Connections of a tenant refused at its max_clients." },
        { "kvnode_tenant_evictions_total", "counter", "Host blocks a tenant's own load evicted." },
        { "kvnode_tenant_keys_total", "counter", "Keys a tenant's match and get looked up, matched or missed." },
        { "kvnode_tenant_check_mismatches_total", "counter",
          "A tenant's lookups that found the key held under another check word." },
        { "kvnode_tenant_max_clients", "gauge", "Connections a tenant may hold at once (its share of "
          "server.max_clients unless its section sets max_clients)." },
        { "kvnode_tenant_output_buffered_bytes", "gauge", "Bytes of replies not yet read by a tenant's clients." },
    };

    if (!s->has_tenants)
        return;
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        family(out, fams[f].name, fams[f].type, fams[f].help);
        for (size_t i = 0; i < s->ntenants; i++) {
            const struct stats_tenant *t = &s->tenants[i];
            switch (f) {
            case 0:
                sample_u(out, fams[f].name, L("tenant", t->name, "tier", "host"), t->host_capacity);
                sample_u(out, fams[f].name, L("tenant", t->name, "tier", "hbm"), t->hbm_capacity);
                break;
            case 1:
                sample_u(out, fams[f].name, L("tenant", t->name, "tier", "host"), t->host_used);
                sample_u(out, fams[f].name, L("tenant", t->name, "tier", "hbm"), t->hbm_used);
                break;
            case 2:
                sample_u(out, fams[f].name, L("tenant", t->name, "tier", "memory"), t->blocks);
                sample_u(out, fams[f].name, L("tenant", t->name, "tier", "store"), t->store_blocks);
                break;
            case 3:
                sample_u(out, fams[f].name, L("tenant", t->name, "state", "all"), t->namespaces);
                sample_u(out, fams[f].name, L("tenant", t->name, "state", "active"), t->namespaces_active);
                break;
            case 4: sample_u(out, fams[f].name, L("tenant", t->name), t->clients); break;
            case 5: sample_u(out, fams[f].name, L("tenant", t->name), t->refused); break;
            case 6: sample_u(out, fams[f].name, L("tenant", t->name), t->evictions); break;
            case 8: sample_u(out, fams[f].name, L("tenant", t->name), t->check_mismatches); break;
            case 9: sample_u(out, fams[f].name, L("tenant", t->name), t->max_clients); break;
            case 10: sample_u(out, fams[f].name, L("tenant", t->name), t->output_buffered); break;
            default:
                sample_u(out, fams[f].name, L("tenant", t->name, "result", "matched"), t->keys_matched);
                sample_u(out, fams[f].name, L("tenant", t->name, "result", "missed"), t->keys_missed);
                break;
            }
        }
    }
}

/* The persistent store, when one is configured. */
static void render_persist(struct evbuffer *out, const struct cache_persist_stats *p)
{
    const struct persist_counters *pc = &p->store;

    if (!p->on || pc->state == PERSIST_STATE_OFF)
        return;
    family(out, "kvnode_persist_healthy", "gauge",
           "1 while the persistent store's last call succeeded, 0 while it is degraded.");
    sample_u(out, "kvnode_persist_healthy", NULL, pc->state == PERSIST_STATE_OK);
    family(out, "kvnode_persist_queue_depth", "gauge", "Store requests accepted and not finished.");
    sample_u(out, "kvnode_persist_queue_depth", NULL, pc->queue_depth);
    family(out, "kvnode_persist_queue_capacity", "gauge", "Store requests that fit in the queue ([persist] queue).");
    sample_u(out, "kvnode_persist_queue_capacity", NULL, pc->queue_capacity);
    family(out, "kvnode_persist_blocks_total", "counter", "Blocks written to / read from the store.");
    sample_u(out, "kvnode_persist_blocks_total", L("op", "write"), pc->written_blocks);
    sample_u(out, "kvnode_persist_blocks_total", L("op", "read"), pc->read_blocks);
    family(out, "kvnode_persist_bytes_total", "counter", "Bytes written to / read from the store.");
    sample_u(out, "kvnode_persist_bytes_total", L("op", "write"), pc->written_bytes);
    sample_u(out, "kvnode_persist_bytes_total", L("op", "read"), pc->read_bytes);
    family(out, "kvnode_persist_writes_deferred_total", "counter",
           "Writes that waited in the daemon because the store's queue was full (sent as it drains).");
    sample_u(out, "kvnode_persist_writes_deferred_total", NULL, p->writes_deferred);
    family(out, "kvnode_persist_write_retries_total", "counter",
           "Failed writes of blocks still in memory tried again (one per probe while the store is "
           "degraded, all at once when a write lands).");
    sample_u(out, "kvnode_persist_write_retries_total", NULL, p->write_retries);
    family(out, "kvnode_persist_probes_total", "counter",
           "Probes of a degraded store (every 0.5 s): kind=write, a waiting block's write, while writes "
           "fail; kind=health, the store's health call otherwise.");
    sample_u(out, "kvnode_persist_probes_total", L("kind", "health", "result", "ok"), pc->probes_ok[PERSIST_PROBE_HEALTH]);
    sample_u(out, "kvnode_persist_probes_total", L("kind", "health", "result", "failed"), pc->probes_failed[PERSIST_PROBE_HEALTH]);
    sample_u(out, "kvnode_persist_probes_total", L("kind", "write", "result", "ok"), pc->probes_ok[PERSIST_PROBE_WRITE]);
    sample_u(out, "kvnode_persist_probes_total", L("kind", "write", "result", "failed"), pc->probes_failed[PERSIST_PROBE_WRITE]);
    family(out, "kvnode_persist_put_waits_total", "counter",
           "Puts that waited for the store: the host tier was full of blocks not yet written.");
    sample_u(out, "kvnode_persist_put_waits_total", NULL, p->put_waits);
    family(out, "kvnode_persist_read_misses_total", "counter", "Store reads that found no block.");
    sample_u(out, "kvnode_persist_read_misses_total", NULL, pc->read_misses);
    family(out, "kvnode_persist_tombstones", "gauge",
           "Deleted keys hidden from lookups because the store cannot delete them (v6d).");
    sample_u(out, "kvnode_persist_tombstones", NULL, pc->tombstones);
    family(out, "kvnode_persist_tombstones_dropped_total", "counter",
           "Tombstones forgotten to make room ([persist] tombstones): such keys can be found in the store again.");
    sample_u(out, "kvnode_persist_tombstones_dropped_total", NULL, pc->tombstones_dropped);
    family(out, "kvnode_persist_tombstone_hits_total", "counter",
           "Store lookups and reads of deleted keys that a tombstone hid.");
    sample_u(out, "kvnode_persist_tombstone_hits_total", NULL, pc->tombstone_hits);
    family(out, "kvnode_persist_check_mismatches_total", "counter",
           "Store lookups and reads that found the key under another check word (a miss; the block kept).");
    sample_u(out, "kvnode_persist_check_mismatches_total", NULL, pc->check_mismatches);
    family(out, "kvnode_persist_dropped_total", "counter",
           "Blocks that left memory without a copy in the store while persistence was on (and, in "
           "the stop's last moments, committed blocks it could not write).");
    sample_u(out, "kvnode_persist_dropped_total", NULL, p->dropped);
    if (pc->file_on) {
        const struct kvs_file_stats *fs = &pc->file;
        family(out, "kvnode_persist_file_segments", "gauge", "Segment files of the file store on disk.");
        sample_u(out, "kvnode_persist_file_segments", NULL, fs->segments);
        family(out, "kvnode_persist_file_bytes", "gauge",
               "File store bytes: on disk (kind=disk) and in live blocks' records (kind=live).");
        sample_u(out, "kvnode_persist_file_bytes", L("kind", "disk"), fs->disk_bytes);
        sample_u(out, "kvnode_persist_file_bytes", L("kind", "live"), fs->bytes);
        family(out, "kvnode_persist_file_live_blocks", "gauge", "Blocks the file store's keydir holds.");
        sample_u(out, "kvnode_persist_file_live_blocks", NULL, fs->blocks);
        family(out, "kvnode_persist_file_segments_removed_total", "counter",
               "Segments removed: dropped by capacity (reason=capacity) or with nothing live (reason=reclaimed).");
        sample_u(out, "kvnode_persist_file_segments_removed_total", L("reason", "capacity"), fs->segments_dropped);
        sample_u(out, "kvnode_persist_file_segments_removed_total", L("reason", "reclaimed"), fs->segments_reclaimed);
        family(out, "kvnode_persist_file_evicted_blocks_total", "counter",
               "Live blocks lost with segments dropped by [persist] capacity.");
        sample_u(out, "kvnode_persist_file_evicted_blocks_total", NULL, fs->evicted);
        family(out, "kvnode_persist_file_corrupt_total", "counter",
               "Records of the file store found bad (checksum) by reads and recovery, never served.");
        sample_u(out, "kvnode_persist_file_corrupt_total", NULL, fs->corrupt);
        family(out, "kvnode_persist_file_torn_tails_total", "counter",
               "Segment tails cut by recovery (a write cut short by a crash).");
        sample_u(out, "kvnode_persist_file_torn_tails_total", NULL, fs->torn_tails);
        family(out, "kvnode_persist_file_torn_bytes_total", "counter", "Bytes of the torn tails cut.");
        sample_u(out, "kvnode_persist_file_torn_bytes_total", NULL, fs->torn_bytes);
        family(out, "kvnode_persist_file_resync_records_total", "counter",
               "Records with a bad header that recovery skipped, resynchronising on the next whole record.");
        sample_u(out, "kvnode_persist_file_resync_records_total", NULL, fs->resync_records);
        family(out, "kvnode_persist_file_resync_bytes_total", "counter",
               "Bytes recovery skipped from a bad header to the next whole record.");
        sample_u(out, "kvnode_persist_file_resync_bytes_total", NULL, fs->resync_bytes);
        family(out, "kvnode_persist_file_recovered_segments_total", "counter",
               "Segments recovered from their hint file (from=hint) or by reading their records (from=records).");
        sample_u(out, "kvnode_persist_file_recovered_segments_total", L("from", "hint"), fs->hints_loaded);
        sample_u(out, "kvnode_persist_file_recovered_segments_total", L("from", "records"), fs->hints_bad);
        family(out, "kvnode_persist_file_direct_io", "gauge", "1 when segments are written with O_DIRECT.");
        sample_u(out, "kvnode_persist_file_direct_io", NULL, fs->direct_io);
    }
    family(out, "kvnode_persist_failures_total", "counter",
           "Store calls that failed, by operation and kind (corrupt: a copy failed its checksum and was removed).");
    for (int op = 0; op < PERSIST_OPS; op++)
        for (int kind = 0; kind < PERSIST_FAIL_KINDS; kind++)
            sample_u(out, "kvnode_persist_failures_total",
                     L("op", persist_op_name(op), "kind", persist_failure_kind_name(kind)), pc->failures[op][kind]);
    family(out, "kvnode_persist_promotions_total", "counter",
           "Blocks read back from the store into host memory for a get, by result.");
    sample_u(out, "kvnode_persist_promotions_total", L("result", "ok"), p->promotions_ok);
    sample_u(out, "kvnode_persist_promotions_total", L("result", "failed"), p->promotions_failed);
    family(out, "kvnode_persist_lookups_total", "counter",
           "Store lookups of keys the index did not know ([persist] lookup), and keys they found.");
    sample_u(out, "kvnode_persist_lookups_total", L("result", "asked"), p->lookups);
    sample_u(out, "kvnode_persist_lookups_total", L("result", "found"), p->lookup_found);
    family(out, "kvnode_persist_lookup_reads_total", "counter",
           "GETs' runs of unknown keys read from the store at once, without a lookup first (redis).");
    sample_u(out, "kvnode_persist_lookup_reads_total", NULL, p->lookup_reads);
    family(out, "kvnode_persist_lookup_negative_hits_total", "counter",
           "Runs of unknown keys that ended without a store round trip: the store lacked the first "
           "less than [persist] lookup_negative_ttl ago.");
    sample_u(out, "kvnode_persist_lookup_negative_hits_total", NULL, p->lookup_negative_hits);
    family(out, "kvnode_persist_waits_total", "counter",
           "Requests whose answer waited for the store, and those answered at server.request_timeout.");
    sample_u(out, "kvnode_persist_waits_total", L("result", "waited"), p->waits);
    sample_u(out, "kvnode_persist_waits_total", L("result", "timeout"), p->wait_timeouts);
    family(out, "kvnode_persist_recovery_blocks", "gauge", "Blocks the start-up scan of the store has found.");
    sample_u(out, "kvnode_persist_recovery_blocks", NULL, pc->scan_found);
    family(out, "kvnode_persist_recovery_complete", "gauge", "1 once the start-up scan of the store has finished.");
    sample_u(out, "kvnode_persist_recovery_complete", NULL, pc->scan_complete);
    if (p->backend && strcmp(p->backend, "redis") == 0) {
        struct rcl_counters rc;
        rcl_get_totals(&rc);
        family(out, "kvnode_persist_redis_redirects_total", "counter",
               "Cluster redirects the redis store followed, by kind (moved: the slot's owner changed).");
        sample_u(out, "kvnode_persist_redis_redirects_total", L("kind", "moved"), rc.moved);
        sample_u(out, "kvnode_persist_redis_redirects_total", L("kind", "ask"), rc.ask);
        family(out, "kvnode_persist_redis_retries_total", "counter",
               "Cluster answers the redis store retried after a backoff, by reason (clusterdown includes "
               "LOADING, MASTERDOWN and READONLY).");
        sample_u(out, "kvnode_persist_redis_retries_total", L("reason", "tryagain"), rc.tryagain);
        sample_u(out, "kvnode_persist_redis_retries_total", L("reason", "clusterdown"), rc.clusterdown);
        family(out, "kvnode_persist_redis_reconnects_total", "counter",
               "Connections to cluster nodes the redis store dropped (node lost, timed out).");
        sample_u(out, "kvnode_persist_redis_reconnects_total", NULL, rc.reconnects);
        family(out, "kvnode_persist_redis_map_refreshes_total", "counter",
               "Slot maps the redis store fetched (CLUSTER SLOTS): at start, after redirects and failures.");
        sample_u(out, "kvnode_persist_redis_map_refreshes_total", NULL, rc.map_refreshes);
    }
}

/* The KVCM publisher and queries, when [kvcm] is on. */
static void render_kvcm(struct evbuffer *out, const struct stats_snapshot *s)
{
    const struct kvcm_stats *k = &s->kvcm;
    const struct kvcm_query_stats *q = &s->query;

    if (k->state == KVCM_STATE_DISABLED)
        return;
    family(out, "kvnode_kvcm_state", "gauge", "1 for the KVCM publisher's current state.");
    for (int st = KVCM_STATE_STARTING; st <= KVCM_STATE_STALLED; st++)
        sample_u(out, "kvnode_kvcm_state", L("state", kvcm_state_name(st)), k->state == st);
    family(out, "kvnode_kvcm_stalled", "gauge",
           "1 while work for KVCM has waited longer than [kvcm] stall_timeout without reaching it.");
    sample_u(out, "kvnode_kvcm_stalled", NULL, k->stalled);
    family(out, "kvnode_kvcm_waiting_seconds", "gauge",
           "How long work for KVCM has waited without anything reaching it (0: none waits).");
    sample_d(out, "kvnode_kvcm_waiting_seconds", NULL, (double)k->stalled_ms / 1000.0);
    family(out, "kvnode_kvcm_queue_events", "gauge", "Events queued for the KVCM publisher.");
    sample_u(out, "kvnode_kvcm_queue_events", NULL, k->queue);
    family(out, "kvnode_kvcm_events_total", "counter",
           "Block events for KVCM: accepted into the queue, or dropped because it was full "
           "(a resync snapshot follows).");
    sample_u(out, "kvnode_kvcm_events_total", L("result", "accepted"), k->accepted);
    sample_u(out, "kvnode_kvcm_events_total", L("result", "dropped"), k->dropped);
    family(out, "kvnode_kvcm_snapshots_total", "counter", "Full snapshots KVCM accepted.");
    sample_u(out, "kvnode_kvcm_snapshots_total", NULL, k->snapshots);
    family(out, "kvnode_kvcm_heartbeats_total", "counter", "Heartbeats sent to KVCM, by result.");
    sample_u(out, "kvnode_kvcm_heartbeats_total", L("result", "ok"), k->heartbeats_ok);
    sample_u(out, "kvnode_kvcm_heartbeats_total", L("result", "failed"), k->heartbeats_failed);
    if (!s->has_query)
        return;
    family(out, "kvnode_kvcm_queries_total", "counter",
           "Remote prefix queries (MATCH_REMOTE), by outcome: ok, failed, deadline (answered locally "
           "at the deadline), local (answered locally at once: breaker open or a recent failure).");
    sample_u(out, "kvnode_kvcm_queries_total", L("result", "ok"), q->ok);
    sample_u(out, "kvnode_kvcm_queries_total", L("result", "failed"), q->failed);
    sample_u(out, "kvnode_kvcm_queries_total", L("result", "deadline"), q->deadline);
    sample_u(out, "kvnode_kvcm_queries_total", L("result", "local"), q->local_only);
    family(out, "kvnode_kvcm_query_breaker_open", "gauge", "1 while the query circuit breaker is open.");
    sample_u(out, "kvnode_kvcm_query_breaker_open", NULL, q->breaker_open);
}

static void render_server(struct evbuffer *out, const struct server_stats *s)
{
    family(out, "kvnode_clients", "gauge", "Connected clients.");
    sample_u(out, "kvnode_clients", NULL, s->connected);
    family(out, "kvnode_clients_accepted_total", "counter", "Client connections accepted.");
    sample_u(out, "kvnode_clients_accepted_total", NULL, s->accepted);
    family(out, "kvnode_clients_refused_total", "counter",
           "Client connections refused (limits, access control, shutdown).");
    sample_u(out, "kvnode_clients_refused_total", NULL, s->refused);
    family(out, "kvnode_clients_denied_total", "counter",
           "Client connections refused by access control (server.allow_uids / allow_gids).");
    sample_u(out, "kvnode_clients_denied_total", NULL, s->denied);
    family(out, "kvnode_frames_rejected_total", "counter",
           "Frames rejected (oversized or undecodable); each closes its connection.");
    sample_u(out, "kvnode_frames_rejected_total", NULL, s->frames_rejected);
    family(out, "kvnode_frames_timed_out_total", "counter",
           "Frames dropped because nothing more of them arrived for server.frame_timeout; each closes its "
           "connection.");
    sample_u(out, "kvnode_frames_timed_out_total", NULL, s->frames_timed_out);
    family(out, "kvnode_clients_accept_pauses_total", "counter",
           "Times the engine listener rested because accept failed (out of descriptors).");
    sample_u(out, "kvnode_clients_accept_pauses_total", NULL, s->accept_pauses);
    family(out, "kvnode_clients_input_buffered_bytes", "gauge", "Bytes of requests read and not yet handled, "
           "all clients together.");
    sample_u(out, "kvnode_clients_input_buffered_bytes", NULL, s->input_buffered_bytes);
    family(out, "kvnode_clients_input_reserved_bytes", "gauge",
           "Bytes of server.max_buffered_input_bytes held for frames being received.");
    sample_u(out, "kvnode_clients_input_reserved_bytes", NULL, s->input_reserved_bytes);
    family(out, "kvnode_clients_input_waiting", "gauge",
           "Connections whose next frame waits for room under server.max_buffered_input_bytes.");
    sample_u(out, "kvnode_clients_input_waiting", NULL, s->input_waiting);
    family(out, "kvnode_clients_input_waits_total", "counter",
           "Frames that waited for room under server.max_buffered_input_bytes.");
    sample_u(out, "kvnode_clients_input_waits_total", NULL, s->input_waits);
    family(out, "kvnode_clients_output_buffered_bytes", "gauge", "Bytes of replies not yet sent, all clients "
           "together.");
    sample_u(out, "kvnode_clients_output_buffered_bytes", NULL, s->output_buffered_bytes);
    family(out, "kvnode_clients_input_paused_total", "counter",
           "Times a client's requests stopped being handled because its unsent replies passed 64 MiB.");
    sample_u(out, "kvnode_clients_input_paused_total", NULL, s->input_paused);
    family(out, "kvnode_clients_hello_timeouts_total", "counter",
           "Connections closed because they had not completed HELLO within server.hello_timeout.");
    sample_u(out, "kvnode_clients_hello_timeouts_total", NULL, s->hello_timeouts);
    family(out, "kvnode_clients_output_limit_total", "counter",
           "Requests met while unread replies were past server.max_buffered_output_bytes (or a tenant's share "
           "of it): connections with unread replies of their own closed, GET_INLINE of others refused.");
    sample_u(out, "kvnode_clients_output_limit_total", L("action", "closed"), s->output_limit_closed);
    sample_u(out, "kvnode_clients_output_limit_total", L("action", "refused"), s->output_limit_refused);
    family(out, "kvnode_clients_hbm_lent", "gauge",
           "Connected clients lent an HBM arena (what a stop tells to unmap it and waits for).");
    sample_u(out, "kvnode_clients_hbm_lent", NULL, s->hbm_lent);
    family(out, "kvnode_clients_going_away_total", "counter",
           "GoingAway notices sent at the stop to clients lent HBM.");
    sample_u(out, "kvnode_clients_going_away_total", NULL, s->going_away);
}

/* The admin HTTP server's own connections, when it listens. */
static void render_admin(struct evbuffer *out, const struct stats_snapshot *s)
{
    const struct admin_stats *a = &s->admin;

    if (!s->admin_address)
        return;
    family(out, "kvnode_admin_connections", "gauge", "Open admin HTTP connections.");
    sample_u(out, "kvnode_admin_connections", NULL, a->open);
    family(out, "kvnode_admin_connections_accepted_total", "counter", "Admin HTTP connections accepted.");
    sample_u(out, "kvnode_admin_connections_accepted_total", NULL, a->accepted);
    family(out, "kvnode_admin_connections_refused_total", "counter",
           "Admin HTTP connections refused with 503: limit (admin.max_connections, or shutting down), "
           "reserve (the last descriptors are kept for engines).");
    sample_u(out, "kvnode_admin_connections_refused_total", L("reason", "limit"), a->refused - a->refused_reserve);
    sample_u(out, "kvnode_admin_connections_refused_total", L("reason", "reserve"), a->refused_reserve);
    family(out, "kvnode_admin_requests_timed_out_total", "counter",
           "Admin HTTP connections closed because a request did not arrive whole within admin.request_timeout.");
    sample_u(out, "kvnode_admin_requests_timed_out_total", NULL, a->timed_out);
    family(out, "kvnode_admin_accept_pauses_total", "counter",
           "Times the admin listener rested because accept failed (out of descriptors).");
    sample_u(out, "kvnode_admin_accept_pauses_total", NULL, a->accept_pauses);
}

/* The KVS front end, when it is on. */
static void render_kvs(struct evbuffer *out, const struct stats_snapshot *s)
{
    const struct kvs_server_stats *k = &s->kvs;

    if (!s->has_kvs)
        return;
    family(out, "kvnode_kvs_requests_total", "counter",
           "KVS front-end requests answered, by route (acquire by scope).");
    sample_u(out, "kvnode_kvs_requests_total", L("route", "health"), k->health);
    sample_u(out, "kvnode_kvs_requests_total", L("route", "acquire_read"), k->acquire_read);
    sample_u(out, "kvnode_kvs_requests_total", L("route", "acquire_create"), k->acquire_create);
    sample_u(out, "kvnode_kvs_requests_total", L("route", "seal"), k->seal);
    sample_u(out, "kvnode_kvs_requests_total", L("route", "release"), k->release);
    sample_u(out, "kvnode_kvs_requests_total", L("route", "discard"), k->discard);
    family(out, "kvnode_kvs_request_errors_total", "counter",
           "KVS front-end requests refused: bad (4xx), denied (403: no tenant for the peer), failed (5xx).");
    sample_u(out, "kvnode_kvs_request_errors_total", L("reason", "bad"), k->bad_requests);
    sample_u(out, "kvnode_kvs_request_errors_total", L("reason", "denied"), k->denied);
    sample_u(out, "kvnode_kvs_request_errors_total", L("reason", "failed"), k->failed);
    family(out, "kvnode_kvs_keys_total", "counter",
           "Object keys in KVS acquires: read (asked), read_hit (found), create (asked), create_existing (left out).");
    sample_u(out, "kvnode_kvs_keys_total", L("kind", "read"), k->read_keys);
    sample_u(out, "kvnode_kvs_keys_total", L("kind", "read_hit"), k->read_hits);
    sample_u(out, "kvnode_kvs_keys_total", L("kind", "create"), k->create_keys);
    sample_u(out, "kvnode_kvs_keys_total", L("kind", "create_existing"), k->create_existing);
    family(out, "kvnode_kvs_leases", "gauge", "KVS leases open.");
    sample_u(out, "kvnode_kvs_leases", NULL, k->leases_open);
    family(out, "kvnode_kvs_leases_expired_total", "counter", "KVS leases ended by their term.");
    sample_u(out, "kvnode_kvs_leases_expired_total", NULL, k->leases_expired);
    family(out, "kvnode_kvs_dataplane_connections", "gauge", "KVS data-plane connections open.");
    sample_u(out, "kvnode_kvs_dataplane_connections", NULL, k->dataplane_open);
    family(out, "kvnode_kvs_dataplane_refused_total", "counter",
           "KVS data-plane connections refused: at accept denied (no tenant for the peer) or tenant_limit (its "
           "tenant's max_clients); other ([server] max_clients at accept, or no fd to lend).");
    sample_u(out, "kvnode_kvs_dataplane_refused_total", L("reason", "denied"), k->dataplane_denied);
    sample_u(out, "kvnode_kvs_dataplane_refused_total", L("reason", "tenant_limit"), k->dataplane_tenant_limit);
    sample_u(out, "kvnode_kvs_dataplane_refused_total", L("reason", "other"),
             k->dataplane_refused - k->dataplane_denied - k->dataplane_tenant_limit);
    family(out, "kvnode_kvs_dataplane_timed_out_total", "counter",
           "KVS data-plane connections closed for not completing the handshake within server.hello_timeout.");
    sample_u(out, "kvnode_kvs_dataplane_timed_out_total", NULL, k->dataplane_timed_out);
    family(out, "kvnode_kvs_fds_lent_total", "counter", "Host-memory fds handed out on the KVS data plane.");
    sample_u(out, "kvnode_kvs_fds_lent_total", NULL, k->fds_lent);
    family(out, "kvnode_kvs_http_connections", "gauge", "KVS control-plane HTTP connections open.");
    sample_u(out, "kvnode_kvs_http_connections", NULL, k->http_open);
    family(out, "kvnode_kvs_http_connections_refused_total", "counter",
           "KVS HTTP connections refused with 503 (kvs_server.max_connections, or the descriptors kept for engines).");
    sample_u(out, "kvnode_kvs_http_connections_refused_total", NULL, k->http_refused);
    family(out, "kvnode_kvs_http_requests_timed_out_total", "counter",
           "KVS HTTP connections closed because a request did not arrive whole within kvs_server.request_timeout.");
    sample_u(out, "kvnode_kvs_http_requests_timed_out_total", NULL, k->http_timed_out);
    family(out, "kvnode_kvs_http_connections_tenant_limit_total", "counter",
           "KVS HTTP connections refused with 503 at accept because their tenant held its share of "
           "kvs_server.max_connections.");
    sample_u(out, "kvnode_kvs_http_connections_tenant_limit_total", NULL, k->http_tenant_limit);
    family(out, "kvnode_kvs_http_output_bytes", "gauge",
           "KVS HTTP reply bytes not yet taken by the kernel, all connections (at most kvs_server.max_output_total_bytes).");
    sample_u(out, "kvnode_kvs_http_output_bytes", NULL, k->http_output_bytes);
    family(out, "kvnode_kvs_http_output_refused_total", "counter",
           "KVS HTTP replies answered 413 or 503 instead: over kvs_server.max_output_bytes or max_output_total_bytes.");
    sample_u(out, "kvnode_kvs_http_output_refused_total", NULL, k->http_output_refused);
    family(out, "kvnode_kvs_http_output_tenant_limit_total", "counter",
           "KVS HTTP replies answered 503 instead because their tenant's unread replies would be over its share of "
           "kvs_server.max_output_total_bytes (also in kvnode_kvs_http_output_refused_total).");
    sample_u(out, "kvnode_kvs_http_output_tenant_limit_total", NULL, k->http_output_tenant_limit);
    family(out, "kvnode_kvs_http_input_bytes", "gauge",
           "KVS HTTP request bytes being received (read, the request not yet whole), all connections (at most "
           "kvs_server.max_input_total_bytes).");
    sample_u(out, "kvnode_kvs_http_input_bytes", NULL, k->http_input_bytes);
    family(out, "kvnode_kvs_http_input_refused_total", "counter",
           "KVS HTTP connections answered 503 and closed while sending a request: over "
           "kvs_server.max_input_total_bytes or their tenant's share of it.");
    sample_u(out, "kvnode_kvs_http_input_refused_total", NULL, k->http_input_refused);
    family(out, "kvnode_kvs_http_input_tenant_limit_total", "counter",
           "KVS HTTP connections answered 503 and closed because their tenant's requests being received were over "
           "its share of kvs_server.max_input_total_bytes (also in kvnode_kvs_http_input_refused_total).");
    sample_u(out, "kvnode_kvs_http_input_tenant_limit_total", NULL, k->http_input_tenant_limit);
}

static void render_workers(struct evbuffer *out, uint32_t stall_timeout_ms)
{
    struct liveness_info w[LIVENESS_MAX];
    size_t n = liveness_snapshot(liveness_now_ms(), w, LIVENESS_MAX);

    family(out, "kvnode_worker_up", "gauge",
           "1 while a thread proves it is alive (the loop answering this page; workers by heartbeat).");
    sample_u(out, "kvnode_worker_up", L("worker", "loop"), 1);
    for (size_t i = 0; i < n && i < LIVENESS_MAX; i++)
        sample_u(out, "kvnode_worker_up", L("worker", w[i].name), w[i].age_ms <= stall_timeout_ms);
}

int metrics_render(struct daemon *d, struct evbuffer *out)
{
    struct stats_snapshot *s = malloc(sizeof *s);

    if (!s)
        return -1;
    struct stats_view view = stats_admin_view(d);
    stats_collect(d, &view, s);

    family(out, "kvnode_build_info", "gauge", "Always 1; the version label names the build.");
    sample_u(out, "kvnode_build_info", L("version", KVNODE_VERSION_STRING), 1);
    family(out, "kvnode_uptime_seconds", "gauge", "Seconds since kvnoded started.");
    sample_d(out, "kvnode_uptime_seconds", NULL, s->ops.uptime_s);

    render_cache(out, s);
    render_tenants(out, s);
    render_requests(out, s->ops.by_status);
    render_persist(out, &s->cache_stats.persist);
    render_kvcm(out, s);
    render_server(out, &s->server);
    render_admin(out, s);
    render_kvs(out, s);
    render_workers(out, s->worker_stall_timeout_ms);

    /* warm.h: this start's hand-over. */
    const struct warm_status *w = warm_status();
    family(out, "kvnode_warm_restart_adopted_blocks", "gauge",
           "Host blocks adopted at start from the previous daemon's hand-over (not read from the store).");
    sample_u(out, "kvnode_warm_restart_adopted_blocks", NULL, s->cache_stats.adopted_blocks);
    family(out, "kvnode_warm_restart_adopted_bytes", "gauge", "Bytes of those blocks.");
    sample_u(out, "kvnode_warm_restart_adopted_bytes", NULL, s->cache_stats.adopted_bytes);
    family(out, "kvnode_warm_restart_refused", "gauge",
           "1 when a hand-over was received and refused (the start was cold; /stats warm_restart.reason says why).");
    sample_u(out, "kvnode_warm_restart_refused", NULL, strcmp(w->state, "refused") == 0);
    family(out, "kvnode_reloads_total", "counter", "Configuration reloads (SIGHUP or RELOAD), by result.");
    sample_u(out, "kvnode_reloads_total", L("result", "ok"), s->reloads_ok);
    sample_u(out, "kvnode_reloads_total", L("result", "failed"), s->reloads_failed);

    free(s);
    return 0;
}
