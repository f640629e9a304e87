/* metrics: counters, histograms and the /metrics page (see metrics.h). */
#include "metrics.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "cache.h"
#include "daemon.h"
#include "kvnode.h"
#include "ops.h"
#include "wire.h"
#include "workers.h"

const double metrics_latency_bounds[METRICS_LATENCY_NBOUNDS] = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
};

void metrics_histogram_observe(struct metrics_histogram *h, double seconds)
{
    size_t i = 0;
    if (!(seconds >= 0.0))
        seconds = 0.0;
    while (i < METRICS_LATENCY_NBOUNDS && seconds > metrics_latency_bounds[i])
        i++;
    h->buckets[i]++;
    h->count++;
    h->sum += seconds;
}

void metrics_request_observe(struct metrics_requests *r, int op, int code, double seconds)
{
    int status = code < 0 ? -code : 0;
    if (op < 0 || op >= METRICS_OP_SLOTS)
        op = 0;
    if (status >= METRICS_STATUS_SLOTS)
        status = METRICS_STATUS_SLOTS - 1;
    r->count[op][status]++;
    metrics_histogram_observe(&r->latency[op], seconds);
}

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

/* Unsigned integer at a path of object keys in the stats document; 0 when absent. */
static uint64_t doc_u(json_t *root, const char *a, const char *b, const char *c)
{
    json_t *v = json_object_get(root, a);
    if (v && b)
        v = json_object_get(v, b);
    if (v && c)
        v = json_object_get(v, c);
    if (json_is_integer(v))
        return json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
    if (json_is_real(v))
        return json_real_value(v) > 0 ? (uint64_t)json_real_value(v) : 0;
    return 0;
}

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

static void render_cache(struct evbuffer *out, json_t *doc, const struct metrics_keys *k)
{
    json_t *nss = json_object_get(doc, "namespaces");
    size_t i;
    json_t *ns;
    char rank[16];

    static const char *const tier_fields[][3] = {
        { "kvnode_tier_capacity_bytes", "Bytes of memory a tier holds (HBM: per device).", "capacity_bytes" },
        { "kvnode_tier_used_bytes", "Bytes of a tier in use (sealed blocks and reservations).", "used_bytes" },
        { "kvnode_tier_blocks", "Blocks allocated in a tier (sealed and being written).", "blocks" },
    };
    json_t *hbm = json_object_get(json_object_get(doc, "tiers"), "hbm"), *h;
    char dev[16];
    for (size_t f = 0; f < 3; f++) {
        family(out, tier_fields[f][0], "gauge", tier_fields[f][1]);
        sample_u(out, tier_fields[f][0], L("tier", "host"), doc_u(doc, "tiers", "host", tier_fields[f][2]));
        json_array_foreach(hbm, i, h) {
            snprintf(dev, sizeof dev, "%" PRIu64, doc_u(h, "device", NULL, NULL));
            sample_u(out, tier_fields[f][0], L("tier", "hbm", "device", dev),
                     doc_u(h, tier_fields[f][2], NULL, NULL));
        }
    }
    if (json_object_get(json_object_get(doc, "tiers"), "store"))
        sample_u(out, "kvnode_tier_blocks", L("tier", "store"), doc_u(doc, "tiers", "store", "blocks"));
    family(out, "kvnode_host_pinned_bytes", "gauge",
           "Bytes of the host tier registered with the GPU runtime (cudaHostRegister) so far.");
    sample_u(out, "kvnode_host_pinned_bytes", NULL, doc_u(doc, "tiers", "host", "pinned_bytes"));
    family(out, "kvnode_demotions_total", "counter",
           "HBM blocks by what their demotion to host memory came to: moved; aborted (a reader "
           "pinned it or it was deleted meanwhile); failed (the copy failed); dropped (no host room).");
    sample_u(out, "kvnode_demotions_total", L("result", "moved"), doc_u(doc, "demotions", "blocks_total", NULL));
    sample_u(out, "kvnode_demotions_total", L("result", "aborted"), doc_u(doc, "demotions", "aborted_total", NULL));
    sample_u(out, "kvnode_demotions_total", L("result", "failed"), doc_u(doc, "demotions", "failed_total", NULL));
    sample_u(out, "kvnode_demotions_total", L("result", "dropped"), doc_u(doc, "demotions", "dropped_total", NULL));
    family(out, "kvnode_demoted_bytes_total", "counter", "Bytes moved from HBM to host memory.");
    sample_u(out, "kvnode_demoted_bytes_total", NULL, doc_u(doc, "demotions", "bytes_total", NULL));
    family(out, "kvnode_hbm_puts_total", "counter",
           "Blocks put with tier HBM: reserved in HBM, or placed in host memory because HBM had no room.");
    sample_u(out, "kvnode_hbm_puts_total", L("placed", "hbm"), doc_u(doc, "demotions", "hbm_puts_total", NULL));
    sample_u(out, "kvnode_hbm_puts_total", L("placed", "host"), doc_u(doc, "demotions", "hbm_fallbacks_total", NULL));

    family(out, "kvnode_namespace_blocks", "gauge",
           "Sealed blocks per tier and namespace (deployment id and TP rank).");
    json_array_foreach(nss, i, ns) {
        snprintf(rank, sizeof rank, "%" PRIu64, doc_u(ns, "tp_rank", NULL, NULL));
        const char *dep = json_string_value(json_object_get(ns, "deployment_id"));
        sample_u(out, "kvnode_namespace_blocks", L("tier", "host", "namespace", dep ? dep : "", "tp_rank", rank),
                 doc_u(ns, "blocks", NULL, NULL));
        if (json_object_get(json_object_get(doc, "tiers"), "store"))
            sample_u(out, "kvnode_namespace_blocks",
                     L("tier", "store", "namespace", dep ? dep : "", "tp_rank", rank),
                     doc_u(ns, "stored_blocks", NULL, NULL));
    }
    family(out, "kvnode_namespace_bytes", "gauge",
           "Bytes of sealed blocks per tier and namespace (deployment id and TP rank).");
    json_array_foreach(nss, i, ns) {
        snprintf(rank, sizeof rank, "%" PRIu64, doc_u(ns, "tp_rank", NULL, NULL));
        const char *dep = json_string_value(json_object_get(ns, "deployment_id"));
        sample_u(out, "kvnode_namespace_bytes", L("tier", "host", "namespace", dep ? dep : "", "tp_rank", rank),
                 doc_u(ns, "bytes", NULL, NULL));
    }

    family(out, "kvnode_keys_total", "counter",
           "Keys looked up by match and get: matched, or missed with the reason (absent: no entry; "
           "writing: reserved, not committed; unavailable: only in the store and not brought back; beyond_gap: after the chain's first miss, not looked at).");
    sample_u(out, "kvnode_keys_total", L("result", "matched"), k->matched);
    sample_u(out, "kvnode_keys_total", L("result", "missed", "reason", "absent"), k->absent);
    sample_u(out, "kvnode_keys_total", L("result", "missed", "reason", "writing"), k->writing);
    sample_u(out, "kvnode_keys_total", L("result", "missed", "reason", "unavailable"), k->unavailable);
    sample_u(out, "kvnode_keys_total", L("result", "missed", "reason", "beyond_gap"), k->beyond_gap);

    family(out, "kvnode_evictions_total", "counter",
           "Blocks evicted, by tier and action (drop: watermarks or a full tier, no copy kept; to_store: "
           "memory freed, the persistent store's copy kept; quota: a namespace's own blocks, over "
           "memory.namespace_quota).");
    sample_u(out, "kvnode_evictions_total", L("tier", "host", "action", "drop"),
             doc_u(doc, "evictions", "host", "dropped_total"));
    sample_u(out, "kvnode_evictions_total", L("tier", "host", "action", "to_store"),
             doc_u(doc, "evictions", "host", "to_store_total"));
    sample_u(out, "kvnode_evictions_total", L("tier", "host", "action", "quota"),
             doc_u(doc, "evictions", "host", "quota_total"));

    family(out, "kvnode_leases", "gauge", "Open leases by kind.");
    sample_u(out, "kvnode_leases", L("kind", "read"), doc_u(doc, "leases", "read", NULL));
    sample_u(out, "kvnode_leases", L("kind", "write"), doc_u(doc, "leases", "write", NULL));
    family(out, "kvnode_leases_reaped_total", "counter", "Leases ended by the reaper after their TTL, by kind.");
    sample_u(out, "kvnode_leases_reaped_total", L("kind", "read"), doc_u(doc, "leases", "reaped_read_total", NULL));
    sample_u(out, "kvnode_leases_reaped_total", L("kind", "write"),
             doc_u(doc, "leases", "reaped_write_total", NULL));
}

/* The persistent store, when one is configured. */
static void render_persist(struct evbuffer *out, json_t *doc)
{
    json_t *p = json_object_get(doc, "persist"), *fail = json_object_get(p, "failures_total");
    const char *state = json_string_value(json_object_get(p, "state"));
    const char *op, *kind;
    json_t *kinds, *v;

    if (!state || strcmp(state, "off") == 0)
        return;
    family(out, "kvnode_persist_healthy", "gauge",
           "1 while the persistent store's last call succeeded, 0 while it is degraded.");
    sample_u(out, "kvnode_persist_healthy", NULL, strcmp(state, "ok") == 0);
    family(out, "kvnode_persist_queue_depth", "gauge", "Store requests accepted and not finished.");
    sample_u(out, "kvnode_persist_queue_depth", NULL, doc_u(p, "queue_depth", NULL, NULL));
    family(out, "kvnode_persist_queue_capacity", "gauge", "Store requests that fit in the queue ([persist] queue).");
    sample_u(out, "kvnode_persist_queue_capacity", NULL, doc_u(p, "queue_capacity", NULL, NULL));
    family(out, "kvnode_persist_blocks_total", "counter", "Blocks written to / read from the store.");
    sample_u(out, "kvnode_persist_blocks_total", L("op", "write"), doc_u(p, "written_blocks_total", NULL, NULL));
    sample_u(out, "kvnode_persist_blocks_total", L("op", "read"), doc_u(p, "read_blocks_total", NULL, NULL));
    family(out, "kvnode_persist_bytes_total", "counter", "Bytes written to / read from the store.");
    sample_u(out, "kvnode_persist_bytes_total", L("op", "write"), doc_u(p, "written_bytes_total", NULL, NULL));
    sample_u(out, "kvnode_persist_bytes_total", L("op", "read"), doc_u(p, "read_bytes_total", NULL, NULL));
    family(out, "kvnode_persist_writes_deferred_total", "counter",
           "Writes that waited in the daemon because the store's queue was full (sent as it drains).");
    sample_u(out, "kvnode_persist_writes_deferred_total", NULL, doc_u(p, "writes_deferred_total", NULL, NULL));
    family(out, "kvnode_persist_write_retries_total", "counter",
           "Failed writes of blocks still in memory tried again (backoff 0.5 s doubling to 10 s).");
    sample_u(out, "kvnode_persist_write_retries_total", NULL, doc_u(p, "write_retries_total", NULL, NULL));
    family(out, "kvnode_persist_put_waits_total", "counter",
           "Puts that waited for the store: the host tier was full of blocks not yet written.");
    sample_u(out, "kvnode_persist_put_waits_total", NULL, doc_u(p, "put_waits_total", NULL, NULL));
    family(out, "kvnode_persist_read_misses_total", "counter", "Store reads that found no block.");
    sample_u(out, "kvnode_persist_read_misses_total", NULL, doc_u(p, "read_misses_total", NULL, NULL));
    family(out, "kvnode_persist_tombstones", "gauge",
           "Deleted keys hidden from lookups because the store cannot delete them (v6d).");
    sample_u(out, "kvnode_persist_tombstones", NULL, doc_u(p, "tombstones", NULL, NULL));
    family(out, "kvnode_persist_tombstones_dropped_total", "counter",
           "Tombstones forgotten to make room ([persist] tombstones): such keys can be found in the store again.");
    sample_u(out, "kvnode_persist_tombstones_dropped_total", NULL, doc_u(p, "tombstones_dropped_total", NULL, NULL));
    family(out, "kvnode_persist_tombstone_hits_total", "counter",
           "Store lookups and reads of deleted keys that a tombstone hid.");
    sample_u(out, "kvnode_persist_tombstone_hits_total", NULL, doc_u(p, "tombstone_hits_total", NULL, NULL));
    family(out, "kvnode_persist_dropped_total", "counter",
           "Blocks that left memory without a copy in the store while persistence was on.");
    sample_u(out, "kvnode_persist_dropped_total", NULL, doc_u(p, "dropped_total", NULL, NULL));
    family(out, "kvnode_persist_failures_total", "counter",
           "Store calls that failed, by operation and kind (corrupt: a copy failed its checksum and was removed).");
    json_object_foreach(fail, op, kinds) {
        json_object_foreach(kinds, kind, v) {
            sample_u(out, "kvnode_persist_failures_total", L("op", op, "kind", kind),
                     json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0);
        }
    }
    family(out, "kvnode_persist_promotions_total", "counter",
           "Blocks read back from the store into host memory for a get, by result.");
    sample_u(out, "kvnode_persist_promotions_total", L("result", "ok"), doc_u(p, "promotions_ok_total", NULL, NULL));
    sample_u(out, "kvnode_persist_promotions_total", L("result", "failed"),
             doc_u(p, "promotions_failed_total", NULL, NULL));
    family(out, "kvnode_persist_lookups_total", "counter",
           "Store lookups of keys the index did not know ([persist] lookup), and keys they found.");
    sample_u(out, "kvnode_persist_lookups_total", L("result", "asked"), doc_u(p, "lookups_total", NULL, NULL));
    sample_u(out, "kvnode_persist_lookups_total", L("result", "found"), doc_u(p, "lookup_found_total", NULL, NULL));
    family(out, "kvnode_persist_waits_total", "counter",
           "Requests whose answer waited for the store, and those answered at server.request_timeout.");
    sample_u(out, "kvnode_persist_waits_total", L("result", "waited"), doc_u(p, "waits_total", NULL, NULL));
    sample_u(out, "kvnode_persist_waits_total", L("result", "timeout"), doc_u(p, "wait_timeouts_total", NULL, NULL));
    family(out, "kvnode_persist_recovery_blocks", "gauge", "Blocks the start-up scan of the store has found.");
    sample_u(out, "kvnode_persist_recovery_blocks", NULL, doc_u(p, "recovery", "found", NULL));
    family(out, "kvnode_persist_recovery_complete", "gauge", "1 once the start-up scan of the store has finished.");
    sample_u(out, "kvnode_persist_recovery_complete", NULL,
             json_is_true(json_object_get(json_object_get(p, "recovery"), "complete")));
}

/* The KVCM publisher and queries, when [kvcm] is on. */
static void render_kvcm(struct evbuffer *out, json_t *doc)
{
    static const char *const states[] = { "STARTING", "REGISTERING", "RESYNCING", "READY",
                                          "DEGRADED", "STOPPED", "STALLED" };
    json_t *k = json_object_get(doc, "kvcm"), *q = json_object_get(k, "query");
    const char *state = json_string_value(json_object_get(k, "state"));

    if (!state || strcmp(state, "DISABLED") == 0)
        return;
    family(out, "kvnode_kvcm_state", "gauge", "1 for the KVCM publisher's current state.");
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        sample_u(out, "kvnode_kvcm_state", L("state", states[i]), strcmp(state, states[i]) == 0);
    family(out, "kvnode_kvcm_stalled", "gauge",
           "1 while work for KVCM has waited longer than [kvcm] stall_timeout without reaching it.");
    sample_u(out, "kvnode_kvcm_stalled", NULL, json_is_true(json_object_get(k, "stalled")));
    family(out, "kvnode_kvcm_waiting_seconds", "gauge",
           "How long work for KVCM has waited without anything reaching it (0: none waits).");
    sample_d(out, "kvnode_kvcm_waiting_seconds", NULL, (double)doc_u(k, "stalled_ms", NULL, NULL) / 1000.0);
    family(out, "kvnode_kvcm_queue_events", "gauge", "Events queued for the KVCM publisher.");
    sample_u(out, "kvnode_kvcm_queue_events", NULL, doc_u(k, "queue", NULL, NULL));
    family(out, "kvnode_kvcm_events_total", "counter",
           "Block events for KVCM: accepted into the queue, or dropped because it was full "
           "(a resync snapshot follows).");
    sample_u(out, "kvnode_kvcm_events_total", L("result", "accepted"), doc_u(k, "accepted_total", NULL, NULL));
    sample_u(out, "kvnode_kvcm_events_total", L("result", "dropped"), doc_u(k, "dropped_total", NULL, NULL));
    family(out, "kvnode_kvcm_snapshots_total", "counter", "Full snapshots KVCM accepted.");
    sample_u(out, "kvnode_kvcm_snapshots_total", NULL, doc_u(k, "snapshots_total", NULL, NULL));
    family(out, "kvnode_kvcm_heartbeats_total", "counter", "Heartbeats sent to KVCM, by result.");
    sample_u(out, "kvnode_kvcm_heartbeats_total", L("result", "ok"), doc_u(k, "heartbeats_ok_total", NULL, NULL));
    sample_u(out, "kvnode_kvcm_heartbeats_total", L("result", "failed"),
             doc_u(k, "heartbeats_failed_total", NULL, NULL));
    if (!q)
        return;
    family(out, "kvnode_kvcm_queries_total", "counter",
           "Remote prefix queries (MATCH_REMOTE), by outcome: ok, failed, deadline (answered locally "
           "at the deadline), local (answered locally at once: breaker open or a recent failure).");
    sample_u(out, "kvnode_kvcm_queries_total", L("result", "ok"), doc_u(q, "ok_total", NULL, NULL));
    sample_u(out, "kvnode_kvcm_queries_total", L("result", "failed"), doc_u(q, "failed_total", NULL, NULL));
    sample_u(out, "kvnode_kvcm_queries_total", L("result", "deadline"), doc_u(q, "deadline_total", NULL, NULL));
    sample_u(out, "kvnode_kvcm_queries_total", L("result", "local"), doc_u(q, "local_only_total", NULL, NULL));
    family(out, "kvnode_kvcm_query_breaker_open", "gauge", "1 while the query circuit breaker is open.");
    sample_u(out, "kvnode_kvcm_query_breaker_open", NULL, json_is_true(json_object_get(q, "breaker_open")));
}

static void render_server(struct evbuffer *out, json_t *doc)
{
    family(out, "kvnode_clients", "gauge", "Connected clients.");
    sample_u(out, "kvnode_clients", NULL, doc_u(doc, "clients", "connected", NULL));
    family(out, "kvnode_clients_accepted_total", "counter", "Client connections accepted.");
    sample_u(out, "kvnode_clients_accepted_total", NULL, doc_u(doc, "clients", "accepted_total", NULL));
    family(out, "kvnode_clients_refused_total", "counter",
           "Client connections refused (limits, access control, shutdown).");
    sample_u(out, "kvnode_clients_refused_total", NULL, doc_u(doc, "clients", "refused_total", NULL));
    family(out, "kvnode_clients_denied_total", "counter",
           "Client connections refused by access control (server.allow_uids / allow_gids).");
    sample_u(out, "kvnode_clients_denied_total", NULL, doc_u(doc, "clients", "denied_total", NULL));
    family(out, "kvnode_frames_rejected_total", "counter",
           "Frames rejected (oversized or undecodable); each closes its connection.");
    sample_u(out, "kvnode_frames_rejected_total", NULL, doc_u(doc, "frames", "rejected_total", NULL));
    family(out, "kvnode_frames_timed_out_total", "counter",
           "Frames dropped because nothing more of them arrived for server.frame_timeout; each closes its "
           "connection.");
    sample_u(out, "kvnode_frames_timed_out_total", NULL, doc_u(doc, "frames", "timed_out_total", NULL));
    family(out, "kvnode_clients_accept_pauses_total", "counter",
           "Times the engine listener rested because accept failed (out of descriptors).");
    sample_u(out, "kvnode_clients_accept_pauses_total", NULL, doc_u(doc, "clients", "accept_pauses_total", NULL));
    family(out, "kvnode_clients_input_buffered_bytes", "gauge", "Bytes of requests read and not yet handled, "
           "all clients together.");
    sample_u(out, "kvnode_clients_input_buffered_bytes", NULL, doc_u(doc, "clients", "input_buffered_bytes", NULL));
    family(out, "kvnode_clients_input_reserved_bytes", "gauge",
           "Bytes of server.max_buffered_input_bytes held for frames being received.");
    sample_u(out, "kvnode_clients_input_reserved_bytes", NULL, doc_u(doc, "clients", "input_reserved_bytes", NULL));
    family(out, "kvnode_clients_input_waiting", "gauge",
           "Connections whose next frame waits for room under server.max_buffered_input_bytes.");
    sample_u(out, "kvnode_clients_input_waiting", NULL, doc_u(doc, "clients", "input_waiting", NULL));
    family(out, "kvnode_clients_input_waits_total", "counter",
           "Frames that waited for room under server.max_buffered_input_bytes.");
    sample_u(out, "kvnode_clients_input_waits_total", NULL, doc_u(doc, "clients", "input_waits_total", NULL));
    family(out, "kvnode_clients_output_buffered_bytes", "gauge", "Bytes of replies not yet sent, all clients "
           "together.");
    sample_u(out, "kvnode_clients_output_buffered_bytes", NULL,
             doc_u(doc, "clients", "output_buffered_bytes", NULL));
    family(out, "kvnode_clients_input_paused_total", "counter",
           "Times a client's requests stopped being handled because its unsent replies passed 64 MiB.");
    sample_u(out, "kvnode_clients_input_paused_total", NULL, doc_u(doc, "clients", "input_paused_total", NULL));
}

/* The admin HTTP server's own connections, when it listens. */
static void render_admin(struct evbuffer *out, json_t *doc)
{
    json_t *a = json_object_get(doc, "admin_connections");
    uint64_t refused = doc_u(a, "refused_total", NULL, NULL), reserve = doc_u(a, "refused_reserve_total", NULL, NULL);

    if (!a)
        return;
    family(out, "kvnode_admin_connections", "gauge", "Open admin HTTP connections.");
    sample_u(out, "kvnode_admin_connections", NULL, doc_u(a, "open", NULL, NULL));
    family(out, "kvnode_admin_connections_accepted_total", "counter", "Admin HTTP connections accepted.");
    sample_u(out, "kvnode_admin_connections_accepted_total", NULL, doc_u(a, "accepted_total", NULL, NULL));
    family(out, "kvnode_admin_connections_refused_total", "counter",
           "Admin HTTP connections refused with 503: limit (admin.max_connections, or shutting down), "
           "reserve (the last descriptors are kept for engines).");
    sample_u(out, "kvnode_admin_connections_refused_total", L("reason", "limit"), refused - reserve);
    sample_u(out, "kvnode_admin_connections_refused_total", L("reason", "reserve"), reserve);
    family(out, "kvnode_admin_requests_timed_out_total", "counter",
           "Admin HTTP connections closed because a request did not arrive whole within admin.request_timeout.");
    sample_u(out, "kvnode_admin_requests_timed_out_total", NULL, doc_u(a, "timed_out_total", NULL, NULL));
    family(out, "kvnode_admin_accept_pauses_total", "counter",
           "Times the admin listener rested because accept failed (out of descriptors).");
    sample_u(out, "kvnode_admin_accept_pauses_total", NULL, doc_u(a, "accept_pauses_total", NULL, NULL));
}

static void render_workers(struct evbuffer *out, uint32_t stall_timeout_ms)
{
    struct worker_info w[WORKERS_MAX];
    size_t n = workers_snapshot(workers_now_ms(), w, WORKERS_MAX);

    family(out, "kvnode_worker_up", "gauge",
           "1 while a thread proves it is alive (the loop answering this page; workers by heartbeat).");
    sample_u(out, "kvnode_worker_up", L("worker", "loop"), 1);
    for (size_t i = 0; i < n && i < WORKERS_MAX; i++)
        sample_u(out, "kvnode_worker_up", L("worker", w[i].name), w[i].age_ms <= stall_timeout_ms);
}

int metrics_render(struct daemon *d, struct evbuffer *out)
{
    json_t *doc = ops_stats_document(d->ops);
    struct metrics_keys keys;

    if (!doc)
        return -1;
    cache_key_metrics(d->cache, &keys);

    family(out, "kvnode_build_info", "gauge", "Always 1; the version label names the build.");
    sample_u(out, "kvnode_build_info", L("version", KVNODE_VERSION_STRING), 1);
    family(out, "kvnode_uptime_seconds", "gauge", "Seconds since kvnoded started.");
    sample_d(out, "kvnode_uptime_seconds", NULL, json_number_value(json_object_get(doc, "uptime_s")));

    render_cache(out, doc, &keys);
    render_requests(out, ops_request_metrics(d->ops));
    render_persist(out, doc);
    render_kvcm(out, doc);
    render_server(out, doc);
    render_admin(out, doc);
    render_workers(out, d->cfg->worker_stall_timeout_ms);

    family(out, "kvnode_reloads_total", "counter", "Configuration reloads (SIGHUP or RELOAD), by result.");
    sample_u(out, "kvnode_reloads_total", L("result", "ok"), d->reloads_ok);
    sample_u(out, "kvnode_reloads_total", L("result", "failed"), d->reloads_failed);

    json_decref(doc);
    return 0;
}
