/* Integration: MATCH_REMOTE (kvnode_match_remote) of a real kvnoded against the KVCM
 * simulator (tests/sim/kvcm_sim.c, started through kvcmctl.h). Each daemon runs with
 * [kvcm] enabled = on, endpoints = the simulator and host_ip_port = 10.9.8.7:7000; it
 * publishes its own puts there (so the simulator knows this node too), and the peers are
 * seeded straight into the simulator over HTTP: registerInstance of the very instance the
 * daemon registered (default template {model}_{block_tokens}), then reportEvent
 * NODE_REGISTER + BLOCK_ADDs from other host_ip_ports.
 *
 * - answers: the local count (the daemon's own puts) plus the peers with their prefix
 *   counts, best first, this node never among them, max_hosts honoured (as asked, and
 *   capped by query_max_hosts); a deployment nobody registered answers remote_ok=1 with no
 *   peers (the simulator said INSTANCE_NOT_EXIST);
 * - deadline: getHostCacheState held 500 ms, query_deadline 50 ms: the call returns within
 *   the deadline plus a margin, remote_ok=0, why names the deadline, the local count is right;
 * - negative cache: after a failed query (an injected INTERNAL_ERROR, then a simulator that
 *   closes every connection), calls within query_negative_ttl answer at once with remote_ok=0
 *   and no query reaches the simulator; after the TTL (doubled by a second failure in a row)
 *   a call goes out again;
 * - breaker: three failures in a row open it: calls answer locally naming the breaker, no
 *   query reaches the simulator, /stats kvcm.query.breaker_open is true and /metrics
 *   kvnode_kvcm_query_breaker_open 1; once query_breaker_open has passed, one trial call to
 *   the (healthy again) simulator closes it and answers resume;
 * - [kvcm] off: the local answer, remote_ok=0, why naming [kvcm] off, and the simulator
 *   receives nothing;
 * - a client that disconnects while its query waits: PING and MATCH on another connection
 *   stay prompt, the daemon answers the query at its deadline into the void and drops the
 *   connection, goes on answering queries, and stops cleanly with a query still out.
 *
 * The querier's own calls are told apart from the publisher's by their trace ids
 * ("<host_ip_port>-<epoch>-query-<n>"). Time bounds are widened under VALGRIND=1.
 * Runs in about 10 s (about 30 s under valgrind). */
#include <check.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "../common/kvh_http.h"
#include "../sim/kvcmctl.h"

#define HOSTPORT  "10.9.8.7:7000"
#define MODEL     "qmodel"
#define INST      MODEL "_16"          /* {model}_{block_tokens}: kvh_layout has 16 tokens */
#define BB        4096u
#define NKEYS     8
#define LOCAL_N   6                    /* blocks the daemon itself holds of the chain */
#define PEER_ST   "ST_EVENT_REPORT_L1P5"
#define MEDIUM    "dram"

/* Peers and how many leading keys of the chain each holds. */
#define PEER_A "10.0.0.1:7000"         /* all 8 */
#define PEER_B "10.0.0.2:7000"         /* 4 */
#define PEER_C "10.0.0.3:7000"         /* 0, 1, 3, 4: a prefix of 2 */
#define PEER_D "10.0.0.4:7000"         /* 1..7 but not 0: no prefix, never listed */
#define PEER_E "10.0.0.5:7000"         /* 0 only: a prefix of 1, 4th best */

static bool slow(void)
{
    return simctl_under_valgrind();
}

/* Sleep until ms after t0 (kvh_now_ms), not at all when that has passed. */
static void sleep_until(uint64_t t0, unsigned ms)
{
    uint64_t now = kvh_now_ms();
    if (now < t0 + ms)
        kvh_sleep_ms((unsigned)(t0 + ms - now));
}

/* ---- simulator ----------------------------------------------------------------------- */

static void sim_start(struct kvcmctl *k)
{
    struct kvcmctl_opts o = { .valgrind = simctl_under_valgrind() };
    kvcmctl_start(k, &o);
}

static const char *code_of(json_t *reply)
{
    const char *c = json_string_value(json_object_get(
        json_object_get(json_object_get(reply, "header"), "status"), "code"));
    return c ? c : "(none)";
}

/* POST /api/<rpc> with doc (stolen); require HTTP 200 and header.status.code OK. */
static void api_ok(const struct kvcmctl *k, const char *rpc, json_t *doc)
{
    char path[96], *txt = json_dumps(doc, JSON_COMPACT), *out = NULL;
    json_decref(doc);
    ck_assert(txt);
    snprintf(path, sizeof path, "/api/%s", rpc);
    int st = kvcmctl_http(k, "POST", path, txt, &out);
    ck_assert_msg(st == 200, "%s %s: HTTP %d", rpc, txt, st);
    json_t *reply = json_loads(out, 0, NULL);
    ck_assert_msg(reply && strcmp(code_of(reply), "OK") == 0, "%s %s: %s", rpc, txt, out);
    json_decref(reply);
    free(out);
    free(txt);
}

static void control(const struct kvcmctl *k, const char *json)
{
    json_decref(kvcmctl_control(k, json));
}

static bool is_query_entry(json_t *e)
{
    const char *t = json_string_value(json_object_get(json_object_get(e, "body"), "trace_id"));
    return t && strstr(t, "-query-") != NULL;
}

/* The querier's requests the simulator received so far (any RPC: leader lookups too). */
static long query_calls(const struct kvcmctl *k)
{
    json_t *rec = kvcmctl_recorded(k, 0);
    size_t i;
    json_t *e;
    long n = 0;
    json_array_foreach(rec, i, e)
        n += is_query_entry(e);
    json_decref(rec);
    return n;
}

/* The last getHostCacheState the querier sent (a new reference), or NULL. */
static json_t *last_query(const struct kvcmctl *k)
{
    json_t *rec = kvcmctl_get_json(k, "/recorded?rpc=getHostCacheState");
    json_t *last = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e)
        if (is_query_entry(e))
            last = e;
    json_incref(last);
    json_decref(rec);
    return last;
}

/* The last getHostCacheState the simulator recorded, waiting up to
 * timeout_ms for one (a loaded machine may deliver it after the caller's
 * deadline has passed); NULL if none came. */
static json_t *wait_query(const struct kvcmctl *k, unsigned timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + timeout_ms;
    json_t *q;
    while (!(q = last_query(k)) && kvh_now_ms() < deadline)
        kvh_sleep_ms(20);
    return q;
}

/* Every /api/ request the simulator received. */
static size_t api_calls(const struct kvcmctl *k)
{
    json_t *rec = kvcmctl_recorded(k, 0);
    size_t n = json_array_size(rec);
    json_decref(rec);
    return n;
}

/* ---- daemon -------------------------------------------------------------------------- */

static void daemon_start(kvh_daemon *d, const struct kvcmctl *k, const char *enabled,
                         const char *extra)
{
    char conf[2048];
    int w = snprintf(conf, sizeof conf,
                     "admin.listen=127.0.0.1:0\n"
                     "kvcm.enabled=%s\n"
                     "kvcm.endpoints=%s\n"
                     "kvcm.host_ip_port=" HOSTPORT "\n"
                     "kvcm.flush_interval=20ms\n"
                     /* rtp-llm's form (one deployment here), which the peers use too */
                     "kvcm.instance_id={model}_{block_tokens}\n"
                     "%s",
                     enabled, k->base, extra ? extra : "");
    ck_assert(w > 0 && (size_t)w < sizeof conf);
    KVH_START(d, conf);
}

static char *admin_addr(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    const char *a = json_string_value(json_object_get(st, "admin"));
    ck_assert_msg(a != NULL, "stats has no \"admin\" address");
    char *copy = strdup(a);
    json_decref(st);
    return copy;
}

/* kvcm.query.<name> of the stats. */
static long long qstat(const kvh_daemon *d, const char *name)
{
    char path[96];
    snprintf(path, sizeof path, "kvcm.query.%s", name);
    return KVH_STAT(d, path);
}

/* kvcm.query of the stats as text, for messages (malloc'd). */
static char *query_stats_text(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    char *t = st ? json_dumps(kvh_json_get(st, "kvcm.query"), JSON_COMPACT) : NULL;
    json_decref(st);
    return t ? t : strdup("(no stats)");
}

/* kvnode_match_remote that must succeed; returns its wall time in ms. */
static uint64_t remote(kvnode_client *c, const kvnode_key *keys, size_t n, size_t max,
                       kvnode_remote_match *out)
{
    uint64_t t0 = kvh_now_ms();
    KVH_OK(c, kvnode_match_remote(c, keys, n, max, out));
    return kvh_now_ms() - t0;
}

static void assert_local_only(const kvnode_remote_match *m, size_t matched, const char *why_has)
{
    ck_assert_msg(m->remote_ok == 0, "remote_ok is 1 (%zu peers), want 0 (%s)", m->npeers,
                  why_has);
    ck_assert_uint_eq(m->npeers, 0);
    ck_assert_uint_eq(m->matched, matched);
    ck_assert_msg(strstr(m->why, why_has) != NULL, "why '%s' does not mention '%s'", m->why,
                  why_has);
}

/* A client of MODEL holding LOCAL_N blocks of the chain keys[0..NKEYS), published: the
 * simulator has them under this node. */
static kvnode_client *client_with_blocks(const kvh_daemon *d, const struct kvcmctl *k,
                                         kvnode_key *keys)
{
    kvnode_layout lay = kvh_layout(MODEL, BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(d, &lay, &c);
    kvh_chain(keys, NKEYS, 4242);
    KVH_OK(c, kvh_put(c, keys, LOCAL_N, 1));
    uint64_t deadline = kvh_now_ms() + (slow() ? 60000 : 15000);
    for (;;) {
        json_t *st = kvcmctl_state(k, false);
        const char *key;
        json_t *r;
        long long blocks = -1;
        json_object_foreach(json_object_get(st, "reporters"), key, r) {
            const char *h = json_string_value(json_object_get(r, "host_ip_port"));
            const char *i = json_string_value(json_object_get(r, "instance_id"));
            if (h && i && strcmp(h, HOSTPORT) == 0 && strcmp(i, INST) == 0)
                blocks = json_integer_value(json_object_get(r, "block_count"));
        }
        json_decref(st);
        if (blocks == LOCAL_N)
            break;
        ck_assert_msg(kvh_now_ms() < deadline, "the daemon did not publish its %d blocks as "
                      "instance " INST " (reporter has %lld)", LOCAL_N, blocks);
        kvh_sleep_ms(20);
    }
    return c;
}

static json_t *ev_register(void)
{
    return json_pack("{s:s, s:{s:[s]}}", "event_type", "EVENT_NODE_REGISTER", "node_register",
                     "mediums", MEDIUM);
}

static json_t *ev_add(const char *host, const char *spec, kvnode_key key)
{
    char ks[32], uri[160];
    snprintf(ks, sizeof ks, "%lld", (long long)key);
    snprintf(uri, sizeof uri, "rtp-llm://%s/" MEDIUM "?size=%u", host, BB);
    return json_pack("{s:s, s:{s:s, s:s, s:[{s:s, s:s}]}}", "event_type", "EVENT_BLOCK_ADD",
                     "block_add", "block_key", ks, "medium", MEDIUM, "specs", "name", spec,
                     "uri", uri);
}

/* One peer: NODE_REGISTER, then BLOCK_ADD of keys[idx[i]] for each idx (-1 ends). */
static void seed_peer(const struct kvcmctl *k, const char *spec, const char *host,
                      const kvnode_key *keys, const int *idx)
{
    json_t *events = json_array();
    json_array_append_new(events, ev_register());
    for (; *idx >= 0; idx++)
        json_array_append_new(events, ev_add(host, spec, keys[*idx]));
    api_ok(k, "reportEvent", json_pack("{s:s, s:s, s:s, s:s, s:o}", "trace_id", "t-seed",
                                       "instance_id", INST, "host_ip_port", host,
                                       "storage_type", PEER_ST, "events", events));
}

/* Register INST exactly as the daemon did (identical info: OK) and seed the peers. */
static void seed_peers(const struct kvcmctl *k, const kvnode_key *keys)
{
    json_t *rec = kvcmctl_get_json(k, "/recorded?rpc=registerInstance");
    json_t *body = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e) {
        const char *id = json_string_value(json_object_get(json_object_get(e, "body"),
                                                           "instance_id"));
        if (id && strcmp(id, INST) == 0)
            body = json_object_get(e, "body");
    }
    ck_assert_msg(body != NULL, "the daemon never registered instance " INST);
    const char *spec = json_string_value(json_object_get(
        json_array_get(json_object_get(body, "location_spec_infos"), 0), "name"));
    ck_assert(spec);
    char spec_copy[128];
    snprintf(spec_copy, sizeof spec_copy, "%s", spec);
    json_t *reg = json_deep_copy(body);
    json_object_set_new(reg, "trace_id", json_string("t-seed-reg"));
    api_ok(k, "registerInstance", reg);
    json_decref(rec);

    seed_peer(k, spec_copy, PEER_A, keys, (const int[]){ 0, 1, 2, 3, 4, 5, 6, 7, -1 });
    seed_peer(k, spec_copy, PEER_B, keys, (const int[]){ 0, 1, 2, 3, -1 });
    seed_peer(k, spec_copy, PEER_C, keys, (const int[]){ 0, 1, 3, 4, -1 });
    seed_peer(k, spec_copy, PEER_D, keys, (const int[]){ 1, 2, 3, 4, 5, 6, 7, -1 });
    seed_peer(k, spec_copy, PEER_E, keys, (const int[]){ 0, -1 });
}

/* The full healthy answer for keys[0..n) with at most max peers. */
static void assert_peers(const kvnode_remote_match *m, size_t n, size_t max)
{
    struct { const char *host; size_t matched; } want[4] = {
        { PEER_A, n }, { PEER_B, n < 4 ? n : 4 }, { PEER_C, n < 2 ? n : 2 }, { PEER_E, 1 },
    };
    size_t nw = max < 4 ? max : 4;
    ck_assert_msg(m->remote_ok == 1, "remote_ok 0: %s", m->why);
    ck_assert_str_eq(m->why, "");
    ck_assert_uint_eq(m->matched, n < LOCAL_N ? n : LOCAL_N);
    ck_assert_msg(m->npeers == nw, "%zu peers, want %zu", m->npeers, nw);
    for (size_t i = 0; i < m->npeers; i++) {
        ck_assert_msg(strcmp(m->peers[i].host_ip_port, HOSTPORT) != 0,
                      "this node (" HOSTPORT ") is among the peers, at %zu", i);
        ck_assert_msg(i == 0 || m->peers[i - 1].matched >= m->peers[i].matched,
                      "peers not best first at %zu", i);
        ck_assert_str_eq(m->peers[i].host_ip_port, want[i].host);
        ck_assert_uint_eq(m->peers[i].matched, want[i].matched);
    }
}

/* ---- tests ------------------------------------------------------------------------------ */

START_TEST(test_answers)
{
    struct kvcmctl k;
    kvh_daemon d;
    kvnode_key keys[NKEYS];
    kvnode_remote_match m;
    sim_start(&k);
    daemon_start(&d, &k, "on", "kvcm.query_deadline=2s\nkvcm.query_max_hosts=3\n");
    kvnode_client *c = client_with_blocks(&d, &k, keys);
    seed_peers(&k, keys);

    /* This node holds 6, so unfiltered it would be second. max_hosts 0: the default (3). */
    remote(c, keys, NKEYS, 0, &m);
    assert_peers(&m, NKEYS, 3);
    /* The simulator did list this node: the daemon is what leaves it out. */
    json_t *q = last_query(&k);
    ck_assert(q);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(q, "body"),
                                                       "instance_id")), INST);
    bool self_listed = false;
    size_t i;
    json_t *h;
    json_array_foreach(json_object_get(json_object_get(q, "response"), "hosts"), i, h)
        self_listed |= strcmp(json_string_value(json_object_get(h, "host_ip_port")), HOSTPORT) == 0;
    ck_assert_msg(self_listed, "the simulator's answer did not list " HOSTPORT);
    json_decref(q);

    remote(c, keys, NKEYS, 2, &m);
    assert_peers(&m, NKEYS, 2);
    remote(c, keys, NKEYS, 1, &m);
    assert_peers(&m, NKEYS, 1);
    remote(c, keys, NKEYS, 50, &m);                /* capped by query_max_hosts */
    assert_peers(&m, NKEYS, 3);
    remote(c, keys, 3, 0, &m);                     /* a shorter prefix: A 3, B 3, C 2 */
    assert_peers(&m, 3, 3);
    ck_assert_int_eq(qstat(&d, "ok_total"), 5);
    ck_assert_int_eq(qstat(&d, "failed_total"), 0);

    /* A deployment with no block anywhere: no peers, but asked. (Its HELLO registers it
     * with KVCM, maybe before the query, maybe after: KVCM answers OK with no hosts, or
     * INSTANCE_NOT_EXIST.) */
    kvnode_layout lay2 = kvh_layout("nobody", BB, 1, 0);
    kvnode_client *c2;
    KVH_CONNECT(&d, &lay2, &c2);
    kvnode_key other[4];
    kvh_chain(other, 4, 777);
    long before = query_calls(&k);
    remote(c2, other, 4, 0, &m);
    ck_assert_msg(m.remote_ok == 1, "remote_ok 0: %s", m.why);
    ck_assert_uint_eq(m.npeers, 0);
    ck_assert_uint_eq(m.matched, 0);
    ck_assert_int_gt(query_calls(&k), before);
    q = last_query(&k);
    ck_assert(q);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(q, "body"),
                                                       "instance_id")), "nobody_16");
    const char *qst = json_string_value(json_object_get(q, "status"));
    ck_assert_msg(qst && (strcmp(qst, "OK") == 0 || strcmp(qst, "INSTANCE_NOT_EXIST") == 0),
                  "the query of an empty deployment was answered %s", qst ? qst : "(nothing)");
    json_decref(q);

    kvnode_close(c2);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(test_deadline)
{
    struct kvcmctl k;
    kvh_daemon d;
    kvnode_key keys[NKEYS];
    kvnode_remote_match m;
    /* The answer must come at the deadline, long before KVCM's: the bound
     * is half the hold, room for a loaded machine; under valgrind everything
     * is ~20x slower. */
    unsigned delay = slow() ? 4000 : 2000, bound = slow() ? 2500 : 1000;
    sim_start(&k);
    daemon_start(&d, &k, "on", slow() ? "kvcm.query_deadline=300ms\n"
                                      : "kvcm.query_deadline=50ms\n");
    kvnode_client *c = client_with_blocks(&d, &k, keys);
    seed_peers(&k, keys);

    char ctl[128];
    snprintf(ctl, sizeof ctl, "{\"delay_ms\": %u, \"delay_only\": \"getHostCacheState\"}", delay);
    control(&k, ctl);
    uint64_t ms = remote(c, keys, NKEYS, 0, &m);
    ck_assert_msg(ms < bound, "kvnode_match_remote took %llu ms (KVCM holds it %u ms)",
                  (unsigned long long)ms, delay);
    assert_local_only(&m, LOCAL_N, "deadline");
    /* It was a real query, held by the simulator (recorded when it ends). */
    json_t *q = wait_query(&k, delay + 5000);
    ck_assert_msg(q != NULL, "no getHostCacheState reached the simulator");
    ck_assert_str_eq(json_string_value(json_object_get(q, "injected")), "delay");
    json_decref(q);
    ck_assert_int_eq(qstat(&d, "deadline_total"), 1);
    ck_assert_int_eq(qstat(&d, "ok_total"), 0);

    /* A plain match meanwhile is unaffected. */
    ck_assert_int_eq(kvh_match(c, keys, NKEYS), LOCAL_N);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    control(&k, "{\"delay_ms\": 0}");
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(test_negative_cache)
{
    struct kvcmctl k;
    kvh_daemon d;
    kvnode_key keys[NKEYS];
    kvnode_remote_match m;
    sim_start(&k);
    daemon_start(&d, &k, "on", "kvcm.query_deadline=2s\nkvcm.query_negative_ttl=1s\n"
                               "kvcm.query_breaker_failures=100\nkvcm.query_breaker_open=10s\n");
    kvnode_client *c = client_with_blocks(&d, &k, keys);
    seed_peers(&k, keys);
    remote(c, keys, NKEYS, 0, &m);
    assert_peers(&m, NKEYS, 8);

    /* 1st failure: remembered for 1 s. */
    control(&k, "{\"fail_status\": \"INTERNAL_ERROR\", \"fail_only\": \"getHostCacheState\"}");
    long n0 = query_calls(&k);
    remote(c, keys, NKEYS, 0, &m);
    uint64_t failed_at = kvh_now_ms();
    assert_local_only(&m, LOCAL_N, "INTERNAL_ERROR");
    long n1 = query_calls(&k);
    ck_assert_int_eq(n1, n0 + 1);
    for (int i = 0; i < 3; i++) {
        uint64_t ms = remote(c, keys, NKEYS, 0, &m);
        ck_assert_msg(kvh_now_ms() - failed_at < 900, "too slow to test the 1 s TTL");
        assert_local_only(&m, LOCAL_N, "a query failed");
        ck_assert_msg(strstr(m.why, "INTERNAL_ERROR"), "why '%s' does not say what failed", m.why);
        ck_assert_msg(ms < (slow() ? 2000u : 200u), "a negative-cached answer took %llu ms",
                      (unsigned long long)ms);
    }
    ck_assert_int_eq(query_calls(&k), n1);
    ck_assert_int_eq(qstat(&d, "local_only_total"), 3);

    /* After the TTL a call goes out again (and fails: the 2nd in a row doubles the TTL). */
    sleep_until(failed_at, 1100);
    remote(c, keys, NKEYS, 0, &m);
    failed_at = kvh_now_ms();
    assert_local_only(&m, LOCAL_N, "INTERNAL_ERROR");
    long n2 = query_calls(&k);
    ck_assert_int_eq(n2, n1 + 1);
    sleep_until(failed_at, 1300);                 /* past 1 s, within 2 s */
    control(&k, "{\"fail_status\": null}");
    remote(c, keys, NKEYS, 0, &m);
    ck_assert_msg(kvh_now_ms() - failed_at < 1900, "too slow to test the doubled TTL");
    assert_local_only(&m, LOCAL_N, "a query failed");
    ck_assert_int_eq(query_calls(&k), n2);

    /* Past the doubled TTL, against a healthy simulator: answers again. */
    sleep_until(failed_at, 2150);
    remote(c, keys, NKEYS, 0, &m);
    assert_peers(&m, NKEYS, 8);
    ck_assert_int_eq(query_calls(&k), n2 + 1);

    /* A simulator that closes every connection: the same, with a transport failure. */
    control(&k, "{\"down\": true}");
    long n3 = query_calls(&k);
    remote(c, keys, NKEYS, 0, &m);
    failed_at = kvh_now_ms();
    ck_assert_msg(m.remote_ok == 0, "remote_ok 1 from a simulator that is down");
    ck_assert_uint_eq(m.matched, LOCAL_N);
    long n4 = query_calls(&k);
    ck_assert_int_gt(n4, n3);
    remote(c, keys, NKEYS, 0, &m);
    ck_assert_msg(kvh_now_ms() - failed_at < 900, "too slow to test the 1 s TTL");
    assert_local_only(&m, LOCAL_N, "a query failed");
    ck_assert_int_eq(query_calls(&k), n4);
    control(&k, "{\"down\": false}");
    sleep_until(failed_at, 1100);
    remote(c, keys, NKEYS, 0, &m);
    assert_peers(&m, NKEYS, 8);
    ck_assert_int_gt(query_calls(&k), n4);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* /metrics' value of an unlabelled sample, -1 when absent. */
static double metric(const char *addr, const char *name)
{
    char *page = NULL;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/metrics", &page, NULL, 0), 200);
    double v = -1;
    size_t len = strlen(name);
    for (char *line = page; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (strncmp(line, name, len) == 0 && line[len] == ' ')
            v = strtod(line + len + 1, NULL);
    free(page);
    return v;
}

/* /stats' kvcm.query.breaker_open: 1 true, 0 false, -1 absent or not a boolean. */
static int breaker_open_stat(const char *addr)
{
    char *text = NULL;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/stats", &text, NULL, 0), 200);
    json_t *doc = json_loads(text, 0, NULL);
    free(text);
    ck_assert(doc);
    json_t *v = kvh_json_get(doc, "kvcm.query.breaker_open");
    int r = json_is_boolean(v) ? json_is_true(v) : -1;
    json_decref(doc);
    return r;
}

START_TEST(test_breaker)
{
    struct kvcmctl k;
    kvh_daemon d;
    kvnode_key keys[NKEYS];
    kvnode_remote_match m;
    unsigned open_ms = slow() ? 4000 : 1000;
    char conf[256];
    snprintf(conf, sizeof conf, "kvcm.query_deadline=2s\nkvcm.query_breaker_failures=3\n"
             "kvcm.query_breaker_open=%ums\nkvcm.query_negative_ttl=1ms\n", open_ms);
    sim_start(&k);
    daemon_start(&d, &k, "on", conf);
    char *addr = admin_addr(&d);
    kvnode_client *c = client_with_blocks(&d, &k, keys);
    seed_peers(&k, keys);
    remote(c, keys, NKEYS, 0, &m);
    assert_peers(&m, NKEYS, 8);
    ck_assert_int_eq(breaker_open_stat(addr), 0);
    ck_assert(metric(addr, "kvnode_kvcm_query_breaker_open") == 0);

    /* Three failures in a row, each a real call (the negative TTL is 1, 2, 4 ms). */
    control(&k, "{\"fail_status\": \"INTERNAL_ERROR\", \"fail_only\": \"getHostCacheState\"}");
    long n0 = query_calls(&k);
    uint64_t opened_at = 0;
    for (int i = 0; i < 3; i++) {
        kvh_sleep_ms(20);
        remote(c, keys, NKEYS, 0, &m);
        opened_at = kvh_now_ms();
        assert_local_only(&m, LOCAL_N, "INTERNAL_ERROR");
        ck_assert_int_eq(query_calls(&k), n0 + i + 1);
    }
    /* Open: local answers naming the breaker, nothing reaches the simulator. */
    kvh_sleep_ms(20);
    for (int i = 0; i < 3; i++) {
        remote(c, keys, NKEYS, 0, &m);
        assert_local_only(&m, LOCAL_N, "circuit breaker");
    }
    ck_assert_int_eq(breaker_open_stat(addr), 1);
    ck_assert(metric(addr, "kvnode_kvcm_query_breaker_open") == 1);
    ck_assert_int_eq(qstat(&d, "breaker_opened_total"), 1);
    ck_assert_msg(kvh_now_ms() - opened_at < open_ms - 100, "too slow to see the breaker open");
    ck_assert_int_eq(query_calls(&k), n0 + 3);

    /* KVCM is healthy again; once the open time has passed one trial closes the breaker. */
    control(&k, "{\"fail_status\": null}");
    sleep_until(opened_at, open_ms + 100);
    ck_assert_int_eq(breaker_open_stat(addr), 0);
    ck_assert(metric(addr, "kvnode_kvcm_query_breaker_open") == 0);
    remote(c, keys, NKEYS, 0, &m);
    assert_peers(&m, NKEYS, 8);
    ck_assert_int_eq(query_calls(&k), n0 + 4);
    for (int i = 0; i < 2; i++) {
        remote(c, keys, NKEYS, 0, &m);
        assert_peers(&m, NKEYS, 8);
    }
    ck_assert_int_eq(query_calls(&k), n0 + 6);
    ck_assert_int_eq(breaker_open_stat(addr), 0);

    free(addr);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(test_kvcm_off)
{
    struct kvcmctl k;
    kvh_daemon d;
    kvnode_key keys[NKEYS];
    kvnode_remote_match m;
    sim_start(&k);
    daemon_start(&d, &k, "off", NULL);
    kvnode_layout lay = kvh_layout(MODEL, BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvh_chain(keys, NKEYS, 4242);
    KVH_OK(c, kvh_put(c, keys, LOCAL_N, 1));
    remote(c, keys, NKEYS, 0, &m);
    assert_local_only(&m, LOCAL_N, "[kvcm] is off");
    remote(c, keys, 2, 5, &m);
    assert_local_only(&m, 2, "[kvcm] is off");
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    ck_assert_uint_eq(api_calls(&k), 0);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(test_client_disconnects)
{
    struct kvcmctl k;
    kvh_daemon d;
    kvnode_key keys[NKEYS];
    kvnode_remote_match m;
    unsigned deadline = slow() ? 4000 : 1500;
    char conf[256];
    /* A short shutdown_timeout: the stop at the end closes the connection whose query is
     * still out instead of waiting for its deadline (the cancel path). */
    snprintf(conf, sizeof conf, "kvcm.query_deadline=%ums\nkvcm.query_negative_ttl=1ms\n"
             "kvcm.query_breaker_failures=100\nserver.shutdown_timeout=100ms\n", deadline);
    sim_start(&k);
    daemon_start(&d, &k, "on", conf);
    kvnode_client *c = client_with_blocks(&d, &k, keys);
    seed_peers(&k, keys);
    control(&k, slow() ? "{\"delay_ms\": 8000, \"delay_only\": \"getHostCacheState\"}"
                       : "{\"delay_ms\": 3000, \"delay_only\": \"getHostCacheState\"}");

    /* A client asks and gives up while the daemon waits for KVCM. */
    kvnode_layout lay = kvh_layout(MODEL, BB, 1, 0);
    kvnode_client *gone;
    KVH_CONNECT(&d, &lay, &gone);
    kvnode_set_timeout(gone, 100);
    uint64_t t0 = kvh_now_ms();
    int rc = kvnode_match_remote(gone, keys, NKEYS, 0, &m);
    ck_assert_msg(rc == -KVNODE_ETIMEDOUT, "match_remote -> %d (%s), want ETIMEDOUT", rc,
                  kvnode_last_error(gone));
    kvnode_close(gone);

    /* The daemon does not care: another connection is served at once. */
    uint64_t t1 = kvh_now_ms();
    KVH_OK(c, kvnode_ping(c));
    ck_assert_int_eq(kvh_match(c, keys, NKEYS), LOCAL_N);
    uint64_t ms = kvh_now_ms() - t1;
    ck_assert_msg(ms < (slow() ? 2000u : 300u), "PING + MATCH took %llu ms while a query waits",
                  (unsigned long long)ms);
    ck_assert_msg(kvh_now_ms() - t0 < deadline - 200, "too slow to test before the deadline");
    ck_assert_int_eq(qstat(&d, "asked_total"), 1);
    ck_assert_int_eq(qstat(&d, "deadline_total"), 0);

    /* By the deadline the call KVCM holds has failed and been answered (normally by the
     * deadline timer) into the void; the dead connection is then dropped. */
    long long last = -1;
    if (kvh_wait_stat(&d, "kvcm.query.failed_total", 1, (int)deadline + 5000, &last) != 0) {
        char *q = query_stats_text(&d);
        ck_abort_msg("failed_total stayed %lld: %s", last, q);
    }
    ck_assert_int_le(qstat(&d, "deadline_total"), 1);
    ck_assert_int_eq(qstat(&d, "ok_total"), 0);
    /* connected: c and kvh_wait_stat's own observer */
    if (kvh_wait_stat(&d, "clients.connected", 2, 5000, &last) != 0) {
        char *q = query_stats_text(&d);
        ck_abort_msg("%lld clients connected, want 2 (c and the observer): %s", last, q);
    }
    KVH_OK(c, kvnode_ping(c));

    /* Queries still work once KVCM answers promptly again. */
    control(&k, "{\"delay_ms\": 0}");
    uint64_t until = kvh_now_ms() + (slow() ? 30000 : 10000);
    do {
        kvh_sleep_ms(50);
        remote(c, keys, NKEYS, 0, &m);
    } while (!m.remote_ok && kvh_now_ms() < until);
    assert_peers(&m, NKEYS, 8);

    /* Another client gives up, and the daemon stops with its query still out. */
    control(&k, slow() ? "{\"delay_ms\": 8000, \"delay_only\": \"getHostCacheState\"}"
                       : "{\"delay_ms\": 3000, \"delay_only\": \"getHostCacheState\"}");
    kvh_sleep_ms(20);
    KVH_CONNECT(&d, &lay, &gone);
    kvnode_set_timeout(gone, 100);
    long long asked = qstat(&d, "asked_total");
    rc = kvnode_match_remote(gone, keys, NKEYS, 0, &m);
    ck_assert_int_eq(rc, -KVNODE_ETIMEDOUT);
    ck_assert_int_eq(qstat(&d, "asked_total"), asked + 1);
    kvnode_close(c);
    t1 = kvh_now_ms();
    KVH_STOP_OK(&d);
    ms = kvh_now_ms() - t1;
    ck_assert_msg(ms < deadline + (slow() ? 20000u : 3000u), "stopping took %llu ms",
                  (unsigned long long)ms);
    char *log = kvh_read_log(&d);
    ck_assert(log);
    ck_assert_msg(strstr(log, "1 connection still open after 100 ms; closing them"),
                  "the stop did not close the waiting connection itself");
    free(log);
    kvnode_close(gone);
    kvh_destroy(&d);
    control(&k, "{\"delay_ms\": 0}");
    kvcmctl_stop_ok(&k);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon_kvcm_query");
    struct { const char *name; const TTest *t; } cases[] = {
        { "answers", test_answers },
        { "deadline", test_deadline },
        { "negative_cache", test_negative_cache },
        { "breaker", test_breaker },
        { "kvcm_off", test_kvcm_off },
        { "client_disconnects", test_client_disconnects },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, slow() ? 600 : 60);
        tcase_add_test(tc, cases[i].t);
        suite_add_tcase(s, tc);
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
