/* Integration: the KVCM publisher (daemon/kvcm/) of a real kvnoded against the KVCM
 * simulator (tests/sim/kvcm_sim.c, started through tests/sim/kvcmctl.h), asserting on
 * what the simulator holds (GET /state) and received (GET /recorded):
 *
 * - lifecycle: getClusterInfo -> registerInstance (layout, block size, spec size) ->
 *   NODE_REGISTER -> SNAPSHOT -> ADD / DELETE, each key exactly once; duplicate puts and
 *   hits send nothing; heartbeats on their cadence carrying epoch, generation, blocks,
 *   clients; the "kvcm" object of the stats;
 * - TP=2 completeness: ADD only once both ranks hold a key, DELETE when one rank drops it,
 *   nothing when the other one follows;
 * - coalescing: a storm of puts and deletes of the same keys ends in each key's final
 *   state, no request names a key twice, far fewer events than changes;
 * - queue overflow (queue_events 16, KVCM slow): drops are counted, a resync snapshot
 *   follows and KVCM ends up with exactly what the daemon holds;
 * - heartbeats keep their cadence while a snapshot upload is held for 3 s;
 * - KVCM down, then slow, while 16 clients put/get/match/delete: every operation
 *   succeeds and PING latency stays low;
 * - SERVER_NOT_LEADER: leadership moves to the second endpoint at run time, publishing
 *   continues there after a resync;
 * - restart after a crash: a new epoch, and the first snapshot replaces the old state;
 * - SIGTERM: HOST_DOWN alone and last, in time; with KVCM down, SIGTERM still exits 0 in
 *   time;
 * - an invalid [kvcm] section is refused at start (exit 2) naming every problem;
 * - kvcm off (the default) with endpoints set: no request reaches KVCM;
 * - overflow, 20 rounds (queue_events 64, batch_events 16, KVCM 30 ms late during each
 *   burst): every round KVCM's view ends equal to the daemon's complete keys, READY;
 * - liveness: with KVCM holding reports 4 s and stall_timeout 400 ms the state is STALLED,
 *   /readyz says "KVCM publisher stalled", kvnode_kvcm_stalled is 1; READY again after;
 * - instance ids: two deployments differing only in layers get two instances, each with
 *   its own chain; with a template without {fingerprint} the second is refused, named;
 * - media: with the sim HBM tier, blocks in HBM are reported as hbm and the others as dram
 *   (NODE_REGISTER names both, the default URI follows the medium); a demotion is a
 *   DELETE from hbm and an ADD to dram;
 * - an empty deployment registers and heartbeats once its whole TP group said HELLO;
 * - after INSTANCE_NOT_EXIST the publisher goes straight to registerInstance;
 * - tenants (as root): a client of "default" declaring tenant alpha's layout with extra
 *   "|tenant=alpha" gets its own deployment and instance; its put and delete of alpha's
 *   keys leave alpha's instance holding alpha's chain (issue 27).
 *
 * KVCM_TEST_DUMP=FILE writes what the simulator recorded in the HOST_DOWN test (every
 * request kind with its answer) to FILE. Runs in about 25 s. */
#include <check.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "../common/kvh_http.h"
#include "pings.h"
#include "tenants_util.h"
#include "../sim/kvcmctl.h"

#define HOSTPORT      "10.9.8.7:7000"
#define STYPE         "ST_EVENT_REPORT_L1P5"
#define BB            (16u << 10)
#define HB_MS         200
#define HOST_DOWN_MS  500

/* valgrind (VALGRIND=1) runs everything several times slower. */
static double scale(void)
{
    return simctl_under_valgrind() ? 5.0 : 1.0;
}

static int tmo(int ms)
{
    return (int)(ms * scale());
}

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- the simulator and the daemon -------------------------------------------------------- */

/* A simulator without a snapshot cooldown, plus extra arguments. */
static void sim_start(struct kvcmctl *s, const char *const *extra)
{
    const char *argv[24];
    size_t n = 0;
    argv[n++] = "--snapshot-interval-s";
    argv[n++] = "0";
    for (; extra && *extra && n < 22; extra++)
        argv[n++] = *extra;
    argv[n] = NULL;
    struct kvcmctl_opts o = { .extra = argv, .valgrind = simctl_under_valgrind() };
    kvcmctl_start(s, &o);
}

static void control(const struct kvcmctl *s, const char *json)
{
    json_decref(kvcmctl_control(s, json));
}

/* The daemon's configuration: kvcm on, publishing to endpoints, short intervals. */
static void kvcm_conf(char *buf, size_t len, const char *endpoints, const char *extra)
{
    int w = snprintf(buf, len,
                     "kvcm.enabled=on\n"
                     "kvcm.endpoints=%s\n"
                     "kvcm.host_ip_port=" HOSTPORT "\n"
                     "kvcm.flush_interval=20ms\n"
                     "kvcm.heartbeat_interval=200ms\n"
                     "kvcm.snapshot_interval=1h\n"
                     "kvcm.retry_base=50ms\n"
                     "kvcm.retry_max=400ms\n"
                     "kvcm.host_down_timeout=500ms\n"
                     "%s",
                     endpoints, extra ? extra : "");
    ck_assert(w > 0 && (size_t)w < len);
}

static void daemon_start(kvh_daemon *d, const char *endpoints, const char *extra)
{
    char conf[4096];
    kvcm_conf(conf, sizeof conf, endpoints, extra);
    KVH_START(d, conf);
}

/* GET a simulator endpoint as JSON. A connection-level failure (no answer: the simulator
 * is one more process on a loaded machine) is retried a few times before it fails the
 * test; any other status fails it at once. */
static json_t *sim_json(const struct kvcmctl *s, const char *path)
{
    for (int i = 0;; i++) {
        char *out = NULL;
        int st = kvcmctl_http(s, "GET", path, NULL, &out);
        if (st == 200) {
            json_error_t err;
            json_t *doc = json_loads(out, 0, &err);
            ck_assert_msg(doc != NULL, "GET %s%s: not JSON: %s", s->base, path, err.text);
            free(out);
            return doc;
        }
        free(out);
        ck_assert_msg(st == -1 && i < 4, "GET %s%s: status %d", s->base, path, st);
        fprintf(stderr, "GET %s%s: no answer; trying again\n", s->base, path);
        kvh_sleep_ms(100);
    }
}

static json_t *sim_state(const struct kvcmctl *s)
{
    return sim_json(s, "/state");
}

/* GET /recorded?since=SEQ */
static json_t *sim_recorded(const struct kvcmctl *s, long long since)
{
    char path[64];
    snprintf(path, sizeof path, "/recorded?since=%lld", since);
    return sim_json(s, path);
}

/* ---- /state ------------------------------------------------------------------------------ */

/* This daemon's reporter for the instance id inst, a new reference or NULL. */
static json_t *reporter_of(const struct kvcmctl *s, const char *inst)
{
    json_t *st = sim_state(s);
    json_t *r = json_incref(kvcmctl_reporter(st, inst, STYPE, HOSTPORT));
    json_decref(st);
    return r;
}

/* Whether instance id inst belongs to model's deployment with 16-token blocks: the
 * default instance id is "<model>_16_<fingerprint>" ("<model>_16" before it carried the
 * fingerprint). */
static bool instance_of(const char *inst, const char *model)
{
    char pfx[128];
    int n = snprintf(pfx, sizeof pfx, "%s_16", model);
    return inst && strncmp(inst, pfx, (size_t)n) == 0 && (inst[n] == '\0' || inst[n] == '_');
}

/* This daemon's reporter for model (its only deployment of that model), a new reference
 * or NULL. */
static json_t *reporter(const struct kvcmctl *s, const char *model)
{
    json_t *st = sim_state(s), *found = NULL, *r;
    const char *id;
    json_object_foreach(json_object_get(st, "reporters"), id, r) {
        const char *host = json_string_value(json_object_get(r, "host_ip_port"));
        const char *type = json_string_value(json_object_get(r, "storage_type"));
        if (instance_of(json_string_value(json_object_get(r, "instance_id")), model) && host &&
            strcmp(host, HOSTPORT) == 0 && type && strcmp(type, STYPE) == 0)
            found = r;
    }
    json_incref(found);
    json_decref(st);
    return found;
}

/* Requests the simulator has recorded so far (the next seq). */
static long long recorded_so_far(const struct kvcmctl *s)
{
    json_t *st = sim_state(s);
    long long n = json_integer_value(json_object_get(st, "recorded"));
    json_decref(st);
    return n;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Whether rep holds exactly keys[0..n) under medium (other media are not looked at); why
 * otherwise. */
static bool medium_equal(json_t *rep, const char *medium, const kvnode_key *keys, size_t n,
                         char *why, size_t wl)
{
    if (!rep) {
        snprintf(why, wl, "no reporter " HOSTPORT " in /state");
        return false;
    }
    json_t *list = json_object_get(json_object_get(rep, "blocks"), medium);
    size_t m = json_array_size(list);
    int64_t *got = calloc(m + 1, sizeof *got), *want = calloc(n + 1, sizeof *want);
    ck_assert(got && want);
    for (size_t i = 0; i < m; i++)
        got[i] = strtoll(json_string_value(json_array_get(list, i)), NULL, 10);
    memcpy(want, keys, n * sizeof *want);
    qsort(got, m, sizeof *got, cmp_i64);
    qsort(want, n, sizeof *want, cmp_i64);
    bool eq = m == n;
    for (size_t i = 0; eq && i < n; i++) {
        if (got[i] != want[i]) {
            eq = false;
            snprintf(why, wl, "KVCM holds %zu keys under %s as wanted, but key #%zu is %" PRId64
                     " instead of %" PRId64, n, medium, i, got[i], want[i]);
        }
    }
    if (m != n)
        snprintf(why, wl, "KVCM holds %zu keys under %s, not %zu", m, medium, n);
    free(got);
    free(want);
    return eq;
}

/* Whether rep holds exactly keys[0..n) (medium dram, no other medium); why otherwise. */
static bool blocks_equal(json_t *rep, const kvnode_key *keys, size_t n, char *why, size_t wl)
{
    if (!rep) {
        snprintf(why, wl, "no reporter " HOSTPORT " in /state");
        return false;
    }
    json_t *blocks = json_object_get(rep, "blocks");
    const char *medium;
    json_t *list;
    json_object_foreach(blocks, medium, list) {
        if (strcmp(medium, "dram") != 0 && json_array_size(list) > 0) {
            snprintf(why, wl, "%zu blocks under medium %s", json_array_size(list), medium);
            return false;
        }
    }
    return medium_equal(rep, "dram", keys, n, why, wl);
}

/* Wait until the simulator holds exactly keys for model. */
static void wait_blocks(const struct kvcmctl *s, const char *model, const kvnode_key *keys,
                        size_t n, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    char why[256] = "";
    for (;;) {
        json_t *rep = reporter(s, model);
        bool eq = blocks_equal(rep, keys, n, why, sizeof why);
        json_decref(rep);
        if (eq)
            return;
        ck_assert_msg(kvh_now_ms() < deadline, "%s (%s) after %d ms", why, s->base, timeout_ms);
        kvh_sleep_ms(20);
    }
}

/* Keys the simulator holds for model right now (its block_count). */
static long long state_count(const struct kvcmctl *s, const char *model)
{
    json_t *rep = reporter(s, model);
    long long n = rep ? json_integer_value(json_object_get(rep, "block_count")) : -1;
    json_decref(rep);
    return n;
}

/* ---- /recorded --------------------------------------------------------------------------- */

/* An int64 of the JSON mapping: a decimal string or a number; -1 otherwise. */
static long long jnum(json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v);
    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    return -1;
}

static bool is_rpc(json_t *e, const char *rpc)
{
    const char *r = json_string_value(json_object_get(e, "rpc"));
    return r && strcmp(r, rpc) == 0;
}

static bool answered_ok(json_t *e)
{
    const char *st = json_string_value(json_object_get(e, "status"));
    return st && strcmp(st, "OK") == 0;
}

static json_t *events_of(json_t *e)
{
    return json_object_get(json_object_get(e, "body"), "events");
}

/* "EVENT_BLOCK_ADD" etc. of an EventItem */
static const char *ev_type(json_t *ev)
{
    const char *t = json_string_value(json_object_get(ev, "event_type"));
    return t ? t : "";
}

/* Whether the entry is a reportEvent holding an event of type. */
static bool has_event(json_t *e, const char *type)
{
    if (!is_rpc(e, "reportEvent"))
        return false;
    size_t i;
    json_t *ev;
    json_array_foreach(events_of(e), i, ev)
        if (strcmp(ev_type(ev), type) == 0)
            return true;
    return false;
}

/* Whether the entry is a reportEvent holding exactly one event, of type. */
static bool only_event(json_t *e, const char *type)
{
    return is_rpc(e, "reportEvent") && json_array_size(events_of(e)) == 1 &&
           strcmp(ev_type(json_array_get(events_of(e), 0)), type) == 0;
}

/* The block key an ADD/DELETE names, or one snapshot block's, as a string. */
static const char *ev_key(json_t *ev)
{
    json_t *p = json_object_get(ev, "block_add");
    if (!p)
        p = json_object_get(ev, "block_delete");
    return json_string_value(json_object_get(p, "block_key"));
}

static bool key_is(const char *s, kvnode_key key)
{
    return s && strtoll(s, NULL, 10) == key;
}

static bool snapshot_lists(json_t *ev, kvnode_key key)
{
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(json_object_get(ev, "block_snapshot"), "blocks"), i, b)
        if (key_is(json_string_value(json_object_get(b, "block_key")), key))
            return true;
    return false;
}

/* Events of type in reportEvents answered OK naming key (a snapshot: listing it);
 * key < 0 with any_key: every event of type. */
static long count_events(json_t *rec, const char *type, kvnode_key key, bool any_key)
{
    long n = 0;
    size_t i, j;
    json_t *e, *ev;
    json_array_foreach(rec, i, e) {
        if (!is_rpc(e, "reportEvent") || !answered_ok(e))
            continue;
        json_array_foreach(events_of(e), j, ev) {
            if (strcmp(ev_type(ev), type) != 0)
                continue;
            if (any_key)
                n++;
            else if (strcmp(type, "EVENT_BLOCK_SNAPSHOT") == 0)
                n += snapshot_lists(ev, key);
            else
                n += key_is(ev_key(ev), key);
        }
    }
    return n;
}

static long key_events(json_t *rec, const char *type, kvnode_key key)
{
    return count_events(rec, type, key, false);
}

static long type_events(json_t *rec, const char *type)
{
    return count_events(rec, type, 0, true);
}

/* The first entry (in arrival order) of rpc / holding an event of type; NULL when none. */
static json_t *first_entry(json_t *rec, const char *rpc, const char *type)
{
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e)
        if (type ? has_event(e, type) : is_rpc(e, rpc))
            return e;
    return NULL;
}

/* The same among the entries answered OK. */
static json_t *first_ok(json_t *rec, const char *rpc, const char *type)
{
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e)
        if ((type ? has_event(e, type) : is_rpc(e, rpc)) && answered_ok(e))
            return e;
    return NULL;
}

static long long seq_of(json_t *e)
{
    return e ? json_integer_value(json_object_get(e, "seq")) : -1;
}

/* Replay the OK reportEvents of rec for one key: whether KVCM holds it at the end, and
 * the last event that decided it ("ADD", "DELETE", "SNAPSHOT" or "none"). */
static bool wire_holds(json_t *rec, kvnode_key key, const char **last)
{
    bool held = false;
    size_t i, j;
    json_t *e, *ev;
    *last = "none";
    json_array_foreach(rec, i, e) {
        if (!is_rpc(e, "reportEvent") || !answered_ok(e))
            continue;
        json_array_foreach(events_of(e), j, ev) {
            const char *t = ev_type(ev);
            if (strcmp(t, "EVENT_BLOCK_SNAPSHOT") == 0) {
                held = snapshot_lists(ev, key);
                *last = "SNAPSHOT";
            } else if (strcmp(t, "EVENT_BLOCK_ADD") == 0 && key_is(ev_key(ev), key)) {
                held = true;
                *last = "ADD";
            } else if (strcmp(t, "EVENT_BLOCK_DELETE") == 0 && key_is(ev_key(ev), key)) {
                held = false;
                *last = "DELETE";
            } else if (strcmp(t, "EVENT_HOST_DOWN") == 0) {
                held = false;
                *last = "HOST_DOWN";
            }
        }
    }
    return held;
}

/* t_ms of the heartbeats in rec answered OK, in order; returns how many (<= max). */
static size_t heartbeat_times(json_t *rec, long long *t, size_t max)
{
    size_t n = 0, i;
    json_t *e;
    json_array_foreach(rec, i, e)
        if (n < max && only_event(e, "EVENT_HEARTBEAT") && answered_ok(e))
            t[n++] = json_integer_value(json_object_get(e, "t_ms"));
    return n;
}

/* Wait until rec (re-fetched from since) satisfies pred; returns the last fetch. */
static json_t *wait_recorded(const struct kvcmctl *s, long long since,
                             bool (*pred)(json_t *rec, void *arg), void *arg, int timeout_ms,
                             const char *what)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        json_t *rec = sim_recorded(s, since);
        if (pred(rec, arg))
            return rec;
        json_decref(rec);
        ck_assert_msg(kvh_now_ms() < deadline, "%s: not seen after %d ms", what, timeout_ms);
        kvh_sleep_ms(20);
    }
}

/* ---- the daemon's stats ------------------------------------------------------------------ */

/* The "kvcm" object of the daemon's stats (new reference). */
static json_t *kvcm_stats(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    json_t *k = json_incref(json_object_get(st, "kvcm"));
    json_decref(st);
    ck_assert_msg(json_is_object(k), "the stats have no \"kvcm\" object");
    return k;
}

static long long kvcm_int(const kvh_daemon *d, const char *name)
{
    json_t *k = kvcm_stats(d);
    json_t *v = json_object_get(k, name);
    ck_assert_msg(json_is_integer(v), "stats kvcm.%s is not an integer", name);
    long long n = json_integer_value(v);
    json_decref(k);
    return n;
}

/* kvcm.state, a static copy */
static const char *kvcm_state(const kvh_daemon *d)
{
    static char buf[32];
    json_t *k = kvcm_stats(d);
    const char *v = json_string_value(json_object_get(k, "state"));
    ck_assert_msg(v != NULL, "stats have no kvcm.state");
    snprintf(buf, sizeof buf, "%s", v);
    json_decref(k);
    return buf;
}

static void wait_kvcm_state(const kvh_daemon *d, const char *want, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        const char *s = kvcm_state(d);
        if (strcmp(s, want) == 0)
            return;
        ck_assert_msg(kvh_now_ms() < deadline, "kvcm.state is %s, not %s after %d ms", s, want,
                      timeout_ms);
        kvh_sleep_ms(20);
    }
}

/* Wait until the last heartbeat's system_status has key == want (a decimal string). */
static void wait_status(const struct kvcmctl *s, const char *model, const char *key,
                        long long want, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        json_t *rep = reporter(s, model);
        json_t *ss = json_object_get(rep, "system_status");
        long long v = json_object_get(ss, key) ? jnum(json_object_get(ss, key)) : -1;
        json_decref(rep);
        if (v == want)
            return;
        ck_assert_msg(kvh_now_ms() < deadline, "heartbeat system_status.%s = %lld, not %lld after %d ms",
                      key, v, want, timeout_ms);
        kvh_sleep_ms(20);
    }
}

/* ---- 1. lifecycle ------------------------------------------------------------------------ */

START_TEST(test_lifecycle)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, NULL);

    kvnode_layout l = kvh_layout("life", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key a[6], b[6], all[12], rest[9];
    kvh_chain(a, 6, 101);
    kvh_chain(b, 6, 202);
    memcpy(all, a, sizeof a);
    memcpy(all + 6, b, sizeof b);

    /* a: registered at HELLO (an empty snapshot), a goes out as additions */
    KVH_OK(c, kvh_put(c, a, 6, 1));
    wait_blocks(&s, "life", a, 6, tmo(5000));
    /* b: additions */
    KVH_OK(c, kvh_put(c, b, 6, 2));
    wait_blocks(&s, "life", all, 12, tmo(5000));
    /* deletions */
    kvnode_key del[3] = { a[0], a[1], b[0] };
    size_t deleted = 0;
    KVH_OK(c, kvnode_delete(c, del, 3, &deleted));
    ck_assert_uint_eq(deleted, 3);
    memcpy(rest, a + 2, 4 * sizeof a[0]);
    memcpy(rest + 4, b + 1, 5 * sizeof b[0]);
    wait_blocks(&s, "life", rest, 9, tmo(5000));

    /* Duplicate puts, hits, matches send nothing. */
    long long seq_quiet = recorded_so_far(&s);
    KVH_OK(c, kvh_put(c, rest, 9, 3));
    size_t got = 0;
    KVH_OK(c, kvh_get_verify(c, b + 1, 5, 2, 0, &got));
    ck_assert_uint_eq(got, 5);
    ck_assert_int_eq(kvh_match(c, rest, 9), 9);
    kvh_sleep_ms(400);
    json_t *quiet = sim_recorded(&s, seq_quiet);
    size_t i;
    json_t *e;
    json_array_foreach(quiet, i, e)
        ck_assert_msg(!is_rpc(e, "reportEvent") || only_event(e, "EVENT_HEARTBEAT"),
                      "a duplicate put or a hit sent %s",
                      json_dumps(json_object_get(e, "body"), JSON_COMPACT));
    json_decref(quiet);

    /* The stats: READY, every completeness change accepted (12 + 3), none dropped. */
    json_t *k = kvcm_stats(&d);
    ck_assert_str_eq(json_string_value(json_object_get(k, "state")), "READY");
    ck_assert_int_eq(json_integer_value(json_object_get(k, "accepted_total")), 15);
    ck_assert_int_eq(json_integer_value(json_object_get(k, "dropped_total")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(k, "queue")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(k, "snapshots_total")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(k, "host_ip_port")), HOSTPORT);
    ck_assert_str_eq(json_string_value(json_object_get(k, "last_error")), "");
    json_t *deps = json_object_get(k, "deployments");
    ck_assert_uint_eq(json_array_size(deps), 1);
    /* the default instance id: <model>_<block_tokens>_<fingerprint> (the deployment id is
     * <model>-<fingerprint>) */
    const char *did = json_string_value(json_object_get(json_array_get(deps, 0), "deployment_id"));
    ck_assert_msg(did && strncmp(did, "life-", 5) == 0, "deployment id %s", did ? did : "(none)");
    char inst[128];
    snprintf(inst, sizeof inst, "life_16_%s", did + 5);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(deps, 0), "instance_id")), inst);
    ck_assert(json_is_true(json_object_get(json_array_get(deps, 0), "registered")));
    long long epoch = json_integer_value(json_object_get(k, "epoch"));
    long long generation = json_integer_value(json_object_get(k, "generation"));
    ck_assert_int_gt(epoch, 0);
    ck_assert_int_eq(generation, 1);
    json_decref(k);

    /* Heartbeats: what the node holds (9 blocks, this one client), epoch, generation. */
    wait_status(&s, "life", "host_blocks", 9, tmo(3000));
    wait_status(&s, "life", "clients", 1, tmo(3000));
    wait_status(&s, "life", "epoch", epoch, tmo(3000));
    wait_status(&s, "life", "generation", generation, tmo(3000));

    /* The order of things on the wire. */
    json_t *rec = sim_recorded(&s, 0);
    ck_assert_msg(json_array_size(rec) > 0 && is_rpc(json_array_get(rec, 0), "getClusterInfo"),
                  "the first request is not getClusterInfo");
    json_t *reg = first_entry(rec, "registerInstance", NULL);
    json_t *nreg = first_entry(rec, NULL, "EVENT_NODE_REGISTER");
    json_t *snap = first_entry(rec, NULL, "EVENT_BLOCK_SNAPSHOT");
    json_t *add = first_entry(rec, NULL, "EVENT_BLOCK_ADD");
    json_t *dele = first_entry(rec, NULL, "EVENT_BLOCK_DELETE");
    json_t *hb = first_entry(rec, NULL, "EVENT_HEARTBEAT");
    ck_assert_msg(reg && nreg && snap && add && dele && hb, "a request kind is missing");
    ck_assert_int_lt(seq_of(reg), seq_of(nreg));
    ck_assert_int_lt(seq_of(nreg), seq_of(snap));
    ck_assert_int_lt(seq_of(snap), seq_of(add));
    ck_assert_int_lt(seq_of(add), seq_of(dele));
    ck_assert_int_lt(seq_of(nreg), seq_of(hb));
    json_array_foreach(rec, i, e) {
        if (seq_of(e) >= seq_of(reg))
            break;
        ck_assert_msg(is_rpc(e, "getClusterInfo"), "request #%zu before registerInstance", i);
    }
    ck_assert(answered_ok(reg) && answered_ok(nreg) && answered_ok(snap));
    ck_assert_msg(only_event(nreg, "EVENT_NODE_REGISTER"), "NODE_REGISTER shares its request");
    ck_assert_msg(only_event(snap, "EVENT_BLOCK_SNAPSHOT"), "the snapshot shares its request");
    /* registerInstance describes the layout */
    json_t *rb = json_object_get(reg, "body");
    ck_assert_str_eq(json_string_value(json_object_get(rb, "instance_id")), inst);
    ck_assert_int_eq(jnum(json_object_get(rb, "block_size")), 16);
    json_t *md = json_object_get(rb, "model_deployment");
    ck_assert_str_eq(json_string_value(json_object_get(md, "model_name")), "life");
    ck_assert_str_eq(json_string_value(json_object_get(md, "dtype")), "bf16");
    ck_assert_int_eq(jnum(json_object_get(md, "tp_size")), 1);
    json_t *specs = json_object_get(rb, "location_spec_infos");
    ck_assert_uint_eq(json_array_size(specs), 1);
    ck_assert_int_eq(jnum(json_object_get(json_array_get(specs, 0), "size")), BB);
    /* every report names this node */
    json_array_foreach(rec, i, e) {
        json_t *body = json_object_get(e, "body");
        char prefix[96];
        snprintf(prefix, sizeof prefix, HOSTPORT "-%lld-", epoch);
        const char *trace = json_string_value(json_object_get(body, "trace_id"));
        ck_assert_msg(trace && strncmp(trace, prefix, strlen(prefix)) == 0,
                      "trace id %s does not carry %s", trace ? trace : "(none)", prefix);
        if (is_rpc(e, "reportEvent")) {
            ck_assert_str_eq(json_string_value(json_object_get(body, "host_ip_port")), HOSTPORT);
            ck_assert_str_eq(json_string_value(json_object_get(body, "storage_type")), STYPE);
            ck_assert_str_eq(json_string_value(json_object_get(body, "instance_id")), inst);
        }
    }
    /* each key went out exactly once as it became complete, and once as it stopped */
    for (int j = 0; j < 6; j++) {
        ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_SNAPSHOT", a[j]) +
                         key_events(rec, "EVENT_BLOCK_ADD", a[j]), 1);
        ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_SNAPSHOT", b[j]), 0);
        ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_ADD", b[j]), 1);
        ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_DELETE", a[j]), j < 2);
        ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_DELETE", b[j]), j < 1);
    }
    ck_assert_int_eq(type_events(rec, "EVENT_BLOCK_DELETE"), 3);
    ck_assert_int_eq(type_events(rec, "EVENT_BLOCK_SNAPSHOT"), 1);
    ck_assert_int_eq(type_events(rec, "EVENT_NODE_REGISTER"), 1);
    json_decref(rec);

    /* Heartbeats on their cadence: 1.6 s more of them, ~200 ms apart. */
    long long seq_hb = recorded_so_far(&s);
    kvh_sleep_ms(1600);
    rec = sim_recorded(&s, seq_hb);
    long long t[64];
    size_t n = heartbeat_times(rec, t, 64);
    json_decref(rec);
    ck_assert_msg(n >= 4 && n <= 9, "%zu heartbeats in 1.6 s at a 200 ms interval", n);
    for (size_t j = 1; j < n; j++) {
        long long gap = t[j] - t[j - 1];
        ck_assert_msg(gap >= HB_MS * 3 / 4 && gap <= tmo(HB_MS * 4),
                      "heartbeats %lld ms apart (interval %d ms)", gap, HB_MS);
    }

    /* Staleness: one change at a time reaches KVCM within flush_interval (20 ms) plus
     * scheduling, whatever the phase of the heartbeat thread. */
    kvnode_key fresh[8];
    kvh_chain(fresh, 8, 303);
    uint64_t worst = 0;
    for (int j = 0; j < 8; j++) {
        uint64_t t0 = kvh_now_ms();
        KVH_OK(c, kvh_put(c, fresh + j, 1, 4));
        while (state_count(&s, "life") != 9 + j + 1) {
            ck_assert_msg(kvh_now_ms() - t0 < 5000, "a put did not reach KVCM in 5 s");
            kvh_sleep_ms(5);
        }
        if (kvh_now_ms() - t0 > worst)
            worst = kvh_now_ms() - t0;
        kvh_sleep_ms(120 + (unsigned)(j * 37) % 100);
    }
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "slowest put to reach KVCM: %" PRIu64 " ms\n", worst);
    ck_assert_msg(worst < (uint64_t)tmo(500), "a put took %" PRIu64 " ms to reach KVCM (flush "
                  "interval 20 ms)", worst);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 2. TP=2 completeness ---------------------------------------------------------------- */

/* No reportEvent but heartbeats since. */
static void assert_quiet(const struct kvcmctl *s, long long since, const char *why)
{
    json_t *rec = sim_recorded(s, since);
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e) {
        if (!is_rpc(e, "reportEvent") || only_event(e, "EVENT_HEARTBEAT"))
            continue;
        char *body = json_dumps(json_object_get(e, "body"), JSON_COMPACT);
        ck_abort_msg("%s, yet KVCM got %.300s", why, body);
    }
    json_decref(rec);
}

START_TEST(test_tp2_completeness)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, NULL);
    kvnode_layout l0 = kvh_layout("tp", BB, 2, 0), l1 = kvh_layout("tp", BB, 2, 1);
    kvnode_client *c0, *c1;
    KVH_CONNECT(&d, &l0, &c0);
    KVH_CONNECT(&d, &l1, &c1);

    /* Register the deployment: one key in both ranks. */
    kvnode_key w[1], k[8], want[9];
    kvh_chain(w, 1, 7);
    kvh_chain(k, 8, 8);
    KVH_OK(c0, kvh_put(c0, w, 1, 1));
    KVH_OK(c1, kvh_put(c1, w, 1, 1));
    wait_blocks(&s, "tp", w, 1, tmo(5000));
    wait_kvcm_state(&d, "READY", tmo(3000));
    json_t *rec = sim_recorded(&s, 0);
    json_t *reg = first_entry(rec, "registerInstance", NULL);
    ck_assert(reg != NULL);
    json_t *rb = json_object_get(reg, "body");
    ck_assert_int_eq(jnum(json_object_get(json_object_get(rb, "model_deployment"), "tp_size")), 2);
    ck_assert_int_eq(jnum(json_object_get(json_array_get(json_object_get(rb, "location_spec_infos"),
                                                         0), "size")), 2 * BB);
    json_decref(rec);

    /* Rank 0 alone: not complete, nothing sent. */
    long long seq0 = recorded_so_far(&s);
    KVH_OK(c0, kvh_put(c0, k, 8, 2));
    kvh_sleep_ms(400);
    assert_quiet(&s, seq0, "only rank 0 holds the keys");
    ck_assert_int_eq(state_count(&s, "tp"), 1);
    ck_assert_int_eq(kvcm_int(&d, "accepted_total"), 1);

    /* Rank 1 too: one ADD per key. */
    KVH_OK(c1, kvh_put(c1, k, 8, 2));
    want[0] = w[0];
    memcpy(want + 1, k, sizeof k);
    wait_blocks(&s, "tp", want, 9, tmo(5000));
    rec = sim_recorded(&s, seq0);
    for (int j = 0; j < 8; j++)
        ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_ADD", k[j]), 1);
    ck_assert_int_eq(type_events(rec, "EVENT_BLOCK_ADD"), 8);
    ck_assert_int_eq(type_events(rec, "EVENT_BLOCK_SNAPSHOT"), 0);
    json_decref(rec);

    /* Rank 0 drops k[0]: one DELETE. */
    long long seq1 = recorded_so_far(&s);
    size_t deleted = 0;
    KVH_OK(c0, kvnode_delete(c0, k, 1, &deleted));
    ck_assert_uint_eq(deleted, 1);
    want[1] = w[0];
    wait_blocks(&s, "tp", want + 1, 8, tmo(5000));
    rec = sim_recorded(&s, seq1);
    ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_DELETE", k[0]), 1);
    ck_assert_int_eq(type_events(rec, "EVENT_BLOCK_DELETE"), 1);
    ck_assert_int_eq(type_events(rec, "EVENT_BLOCK_ADD"), 0);
    json_decref(rec);

    /* Rank 1 follows: nothing more. */
    long long seq2 = recorded_so_far(&s);
    KVH_OK(c1, kvnode_delete(c1, k, 1, &deleted));
    ck_assert_uint_eq(deleted, 1);
    kvh_sleep_ms(400);
    assert_quiet(&s, seq2, "k[0] was already incomplete");
    ck_assert_int_eq(state_count(&s, "tp"), 8);
    ck_assert_int_eq(kvcm_int(&d, "accepted_total"), 1 + 8 + 1);

    kvnode_close(c0);
    kvnode_close(c1);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 3. coalescing ----------------------------------------------------------------------- */

#define NCOAL  32
#define ROUNDS 20

START_TEST(test_coalescing)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, NULL);
    kvnode_layout l = kvh_layout("coal", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key w[1], k[NCOAL], odd[NCOAL / 2];
    kvh_chain(w, 1, 30);
    kvh_chain(k, NCOAL, 31);
    KVH_OK(c, kvh_put(c, w, 1, 1));
    wait_blocks(&s, "coal", w, 1, tmo(5000));
    wait_kvcm_state(&d, "READY", tmo(3000));
    long long seq0 = recorded_so_far(&s);

    /* The storm: every put and delete changes completeness. */
    long changes = 0;
    size_t deleted = 0;
    for (int r = 0; r < ROUNDS; r++) {
        KVH_OK(c, kvh_put(c, k, NCOAL, (uint64_t)r));
        KVH_OK(c, kvnode_delete(c, k, NCOAL, &deleted));
        ck_assert_uint_eq(deleted, NCOAL);
        changes += 2 * NCOAL;
    }
    for (int j = 0; j < NCOAL / 2; j++)
        odd[j] = k[2 * j + 1];
    KVH_OK(c, kvh_put(c, k, NCOAL, 99));
    KVH_OK(c, kvnode_delete(c, odd, NCOAL / 2, &deleted));
    KVH_OK(c, kvh_put(c, k + 1, 1, 99));
    KVH_OK(c, kvnode_delete(c, k, 1, &deleted));
    changes += NCOAL + NCOAL / 2 + 2;

    /* Final: w, the even keys but k[0], and k[1]. */
    bool final[NCOAL];
    kvnode_key want[NCOAL + 1];
    size_t nw = 0;
    want[nw++] = w[0];
    for (int j = 0; j < NCOAL; j++) {
        final[j] = (j % 2 == 0 && j != 0) || j == 1;
        if (final[j])
            want[nw++] = k[j];
    }
    wait_blocks(&s, "coal", want, nw, tmo(5000));
    kvh_sleep_ms(200);   /* anything still in flight would change it again */
    wait_blocks(&s, "coal", want, nw, tmo(1000));

    json_t *rec = sim_recorded(&s, 0);
    for (int j = 0; j < NCOAL; j++) {
        const char *last;
        bool held = wire_holds(rec, k[j], &last);
        ck_assert_msg(held == final[j], "key #%d: the wire says %s (last event %s)", j,
                      held ? "held" : "gone", last);
        ck_assert_msg(strcmp(last, final[j] ? "ADD" : "DELETE") == 0,
                      "key #%d: its last event is %s", j, last);
    }
    json_decref(rec);
    rec = sim_recorded(&s, seq0);
    long sent = type_events(rec, "EVENT_BLOCK_ADD") + type_events(rec, "EVENT_BLOCK_DELETE");
    ck_assert_int_eq(type_events(rec, "EVENT_BLOCK_SNAPSHOT"), 0);
    json_decref(rec);
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "coalescing: %ld ADD/DELETE events for %ld changes\n", sent, changes);
    ck_assert_msg(sent * (simctl_under_valgrind() ? 1 : 2) < changes,
                  "%ld ADD/DELETE events for %ld changes: not coalesced", sent, changes);

    json_t *rep = reporter(&s, "coal");
    ck_assert_int_eq(json_integer_value(json_object_get(rep, "uncoalesced_requests")), 0);
    ck_assert_int_eq(json_object_size(json_object_get(rep, "rejected")), 0);
    json_decref(rep);
    ck_assert_int_eq(kvcm_int(&d, "dropped_total"), 0);
    ck_assert_int_eq(kvcm_int(&d, "accepted_total"), 1 + changes);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 4. queue overflow, then a resync ---------------------------------------------------- */

#define NOVF 200

START_TEST(test_overflow_resync)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    /* batch_events may not exceed queue_events */
    daemon_start(&d, s.base, "kvcm.queue_events=16\nkvcm.batch_events=8\nkvcm.request_timeout=5s\n");
    kvnode_layout l = kvh_layout("ovf", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key k[NOVF + 1];
    kvh_chain(k, NOVF + 1, 40);
    KVH_OK(c, kvh_put(c, k, 1, 1));
    wait_blocks(&s, "ovf", k, 1, tmo(5000));
    wait_kvcm_state(&d, "READY", tmo(3000));
    ck_assert_int_eq(kvcm_int(&d, "queue_capacity"), 16);
    long long snaps0 = kvcm_int(&d, "snapshots_total");

    /* KVCM slow: the publisher sits in one call while the puts come. */
    control(&s, "{\"delay_ms\":1500,\"delay_only\":\"reportEvent\"}");
    long long seq_slow = recorded_so_far(&s);
    uint64_t t_slow = unix_ms();
    for (int j = 1; j <= NOVF; j += 5)
        KVH_OK(c, kvh_put(c, k + j, 5, 2));
    long long dropped = kvcm_int(&d, "dropped_total");
    ck_assert_msg(dropped > 0, "the queue of 16 took %d changes while KVCM was slow", NOVF);
    ck_assert_int_le(kvcm_int(&d, "queue"), 16);
    control(&s, "{\"delay_ms\":0}");
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "overflow: %lld of %d changes dropped\n", dropped, NOVF);

    /* Resync: KVCM ends up with exactly what the daemon holds. */
    wait_blocks(&s, "ovf", k, NOVF + 1, tmo(10000));
    wait_kvcm_state(&d, "READY", tmo(5000));
    json_t *ks = kvcm_stats(&d);
    ck_assert_int_ge(json_integer_value(json_object_get(ks, "dropped_total")), dropped);
    ck_assert_int_gt(json_integer_value(json_object_get(ks, "snapshots_total")), snaps0);
    ck_assert_int_ge(json_integer_value(json_object_get(ks, "last_snapshot_unix_ms")), (long long)t_slow);
    ck_assert_int_eq(json_integer_value(json_object_get(ks, "accepted_total")) +
                     json_integer_value(json_object_get(ks, "dropped_total")), NOVF + 1);
    json_decref(ks);
    json_t *rec = sim_recorded(&s, seq_slow);
    ck_assert_msg(type_events(rec, "EVENT_BLOCK_SNAPSHOT") >= 1, "no snapshot after the overflow");
    json_decref(rec);
    /* the daemon's truth: every block is there (a host tier nothing is evicted from) */
    ck_assert_int_eq(kvh_match(c, k, NOVF + 1), NOVF + 1);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.blocks"), NOVF + 1);
    rec = sim_recorded(&s, 0);
    for (int j = 0; j <= NOVF; j++) {
        const char *last;
        ck_assert_msg(wire_holds(rec, k[j], &last), "key #%d: the wire says gone (%s)", j, last);
    }
    json_decref(rec);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 5. heartbeats during a slow snapshot ------------------------------------------------ */

#define SNAP_HOLD_MS 3000

static bool snapshot_answered(json_t *rec, void *arg)
{
    (void)arg;
    json_t *e = first_entry(rec, NULL, "EVENT_BLOCK_SNAPSHOT");
    return e && answered_ok(e);
}

static bool snapshot_arrived(json_t *rec, void *arg)
{
    (void)arg;
    return first_entry(rec, NULL, "EVENT_BLOCK_SNAPSHOT") != NULL;
}

START_TEST(test_heartbeat_during_slow_snapshot)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    char hold[96];
    snprintf(hold, sizeof hold, "{\"delay_ms\":%d,\"delay_only\":\"snapshot\"}", SNAP_HOLD_MS);
    control(&s, hold);
    daemon_start(&d, s.base, NULL);
    kvnode_layout l = kvh_layout("slowsnap", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key k[4];
    kvh_chain(k, 4, 50);
    KVH_OK(c, kvh_put(c, k, 4, 1));

    json_t *rec = wait_recorded(&s, 0, snapshot_arrived, NULL, tmo(5000), "a snapshot");
    json_t *snap = first_entry(rec, NULL, "EVENT_BLOCK_SNAPSHOT");
    long long t_snap = json_integer_value(json_object_get(snap, "t_ms"));
    ck_assert_msg(json_is_null(json_object_get(snap, "status")), "the snapshot was not held");
    json_decref(rec);
    /* while it is held, the daemon says so, and engines are served */
    ck_assert_str_eq(kvcm_state(&d), "RESYNCING");
    size_t got = 0;
    KVH_OK(c, kvh_get_verify(c, k, 4, 1, 0, &got));
    ck_assert_uint_eq(got, 4);

    rec = wait_recorded(&s, 0, snapshot_answered, NULL, tmo(SNAP_HOLD_MS + 5000), "the snapshot's answer");
    json_decref(rec);
    wait_blocks(&s, "slowsnap", k, 4, tmo(3000));
    kvh_sleep_ms(HB_MS * 2);
    rec = sim_recorded(&s, 0);
    long long t[128];
    size_t n = heartbeat_times(rec, t, 128), in_hold = 0;
    json_decref(rec);
    long long prev = -1, worst = 0;
    for (size_t j = 0; j < n; j++) {
        if (t[j] < t_snap || t[j] > t_snap + SNAP_HOLD_MS)
            continue;
        in_hold++;
        if (prev >= 0 && t[j] - prev > worst)
            worst = t[j] - prev;
        prev = t[j];
    }
    /* 3 s at 200 ms: 15 beats; leave room for a busy machine */
    ck_assert_msg(in_hold >= (size_t)(SNAP_HOLD_MS / HB_MS) * 2 / 3,
                  "%zu heartbeats while the snapshot was held %d ms", in_hold, SNAP_HOLD_MS);
    ck_assert_msg(worst <= tmo(HB_MS * 3), "heartbeats %lld ms apart while the snapshot was held",
                  worst);
    wait_kvcm_state(&d, "READY", tmo(3000));

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 6. KVCM down or slow while 16 clients run ------------------------------------------- */

#define NLOAD 16

struct load {
    const kvh_daemon *d;
    int idx;
    atomic_bool *stop;
    long ops, failures;
    char err[256];
};

static void load_fail(struct load *ld, const char *what, int rc, kvnode_client *c)
{
    if (ld->failures++ == 0)
        snprintf(ld->err, sizeof ld->err, "client %d: %s -> %d (%s)", ld->idx, what, rc,
                 c ? kvnode_last_error(c) : kvh_error());
}

static void *load_main(void *arg)
{
    struct load *ld = arg;
    kvnode_layout l = kvh_layout("load", BB, 1, 0);
    kvnode_client *c = NULL;
    int rc = kvh_connect(ld->d, &l, &c);
    if (rc != 0) {
        load_fail(ld, "connect", rc, NULL);
        return NULL;
    }
    kvnode_key k[4];
    for (unsigned it = 0; !atomic_load(ld->stop); it++) {
        kvh_chain(k, 4, 1000u + (uint64_t)ld->idx * 64u + it % 16u);
        size_t got = 0, deleted = 0;
        if ((rc = kvh_put(c, k, 4, it)) != 0)
            load_fail(ld, "put", rc, c);
        else if ((rc = kvh_get_verify(c, k, 4, it, 0, &got)) != 0 || got != 4)
            load_fail(ld, "get", rc, c);
        else if ((rc = (int)kvh_match(c, k, 4)) != 4)
            load_fail(ld, "match", rc, c);
        else if ((rc = kvnode_delete(c, k, 4, &deleted)) != 0 || deleted != 4)
            load_fail(ld, "delete", rc, c);
        ld->ops += 4;
        kvh_sleep_ms(5);
    }
    kvnode_close(c);
    return NULL;
}


START_TEST(test_down_or_slow_under_load)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, NULL);
    kvnode_layout l = kvh_layout("load", BB, 1, 0);
    kvnode_client *c, *obs;
    KVH_CONNECT(&d, &l, &c);
    KVH_CONNECT(&d, NULL, &obs);
    kvnode_key w[1];
    kvh_chain(w, 1, 60);
    KVH_OK(c, kvh_put(c, w, 1, 1));
    wait_blocks(&s, "load", w, 1, tmo(5000));

    control(&s, "{\"down\":true}");
    long long seq_down = recorded_so_far(&s);
    atomic_bool stop = false;
    struct load ld[NLOAD];
    pthread_t th[NLOAD];
    for (int i = 0; i < NLOAD; i++) {
        ld[i] = (struct load){ .d = &d, .idx = i, .stop = &stop };
        ck_assert_int_eq(pthread_create(&th[i], NULL, load_main, &ld[i]), 0);
    }
    uint64_t t_down = kvh_now_ms();
    pings_fast(obs, 100, 10, 1000, "while KVCM is down");
    long long tries = recorded_so_far(&s) - seq_down;
    uint64_t down_ms = kvh_now_ms() - t_down;
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "%lld requests in %" PRIu64 " ms while KVCM was down\n", tries, down_ms);
    /* Failing calls back off (retry_base 50 ms doubling to retry_max 400 ms): about
     * down_ms/400 + 4 publisher tries, down_ms/200 + 1 heartbeat tries; one try per 50 ms
     * would be twice that. */
    ck_assert_msg(tries <= (long long)(down_ms * 3 / 400) + 8,
                  "%lld requests in %" PRIu64 " ms while KVCM was down: no backoff", tries, down_ms);
    ck_assert_str_eq(kvcm_state(&d), "DEGRADED");
    control(&s, "{\"down\":false,\"delay_ms\":1000}");
    pings_fast(obs, 100, 10, 1000, "while KVCM is slow");
    atomic_store(&stop, true);
    long ops = 0;
    for (int i = 0; i < NLOAD; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(ld[i].failures == 0, "%ld failed operations: %s", ld[i].failures, ld[i].err);
        ck_assert_msg(ld[i].ops >= 16, "client %d did only %ld operations", i, ld[i].ops);
        ops += ld[i].ops;
    }
    /* the daemon did try KVCM while it was down (and was refused) */
    json_t *rec = sim_recorded(&s, seq_down);
    ck_assert_msg(json_array_size(rec) > 0, "no request reached KVCM while it was down");
    json_decref(rec);

    /* Back to normal: KVCM converges to what the node holds (w; the rest was deleted). */
    control(&s, "{\"delay_ms\":0}");
    wait_blocks(&s, "load", w, 1, tmo(10000));
    wait_kvcm_state(&d, "READY", tmo(5000));
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "%ld engine operations during the outage\n", ops);

    kvnode_close(obs);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 7. SERVER_NOT_LEADER failover ------------------------------------------------------- */

static bool not_leader_answered(json_t *rec, void *arg)
{
    (void)arg;
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e) {
        const char *st = json_string_value(json_object_get(e, "status"));
        if (st && strcmp(st, "SERVER_NOT_LEADER") == 0)
            return true;
    }
    return false;
}

START_TEST(test_leader_failover)
{
    struct kvcmctl a, b;
    kvh_daemon d;
    sim_start(&a, NULL);
    const char *follower[] = { "--follower-of", a.base, NULL };
    sim_start(&b, follower);
    char endpoints[300];
    snprintf(endpoints, sizeof endpoints, "%s,%s", a.base, b.base);
    daemon_start(&d, endpoints, NULL);
    kvnode_layout l = kvh_layout("lead", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key k[10];
    kvh_chain(k, 10, 70);
    KVH_OK(c, kvh_put(c, k, 5, 1));
    wait_blocks(&a, "lead", k, 5, tmo(5000));
    wait_kvcm_state(&d, "READY", tmo(3000));
    ck_assert_int_eq(recorded_so_far(&b), 0);   /* the follower was never asked anything */

    /* B takes over. */
    long long seq_a = recorded_so_far(&a);
    control(&b, "{\"leader\":true}");
    char ctl[256];
    snprintf(ctl, sizeof ctl, "{\"follower_of\":\"%s\"}", b.base);
    control(&a, ctl);
    KVH_OK(c, kvh_put(c, k + 5, 5, 2));

    /* A refuses, the daemon finds B, registers there and resyncs everything. */
    json_t *rec = wait_recorded(&a, seq_a, not_leader_answered, NULL, tmo(5000),
                                "SERVER_NOT_LEADER from the old leader");
    json_decref(rec);
    wait_blocks(&b, "lead", k, 10, tmo(10000));
    wait_kvcm_state(&d, "READY", tmo(5000));
    /* (B answers INSTANCE_NOT_EXIST to whatever reaches it first: it never heard of us) */
    rec = sim_recorded(&b, 0);
    json_t *reg = first_ok(rec, "registerInstance", NULL);
    json_t *nreg = first_ok(rec, NULL, "EVENT_NODE_REGISTER");
    json_t *snap = first_ok(rec, NULL, "EVENT_BLOCK_SNAPSHOT");
    ck_assert_msg(reg && nreg && snap, "no registration and snapshot on the new leader");
    ck_assert_int_lt(seq_of(reg), seq_of(nreg));
    ck_assert_int_lt(seq_of(nreg), seq_of(snap));
    json_decref(rec);
    /* and keeps publishing there: heartbeats, then a delete */
    wait_status(&b, "lead", "host_blocks", 10, tmo(3000));
    size_t deleted = 0;
    KVH_OK(c, kvnode_delete(c, k, 1, &deleted));
    wait_blocks(&b, "lead", k + 1, 9, tmo(5000));
    /* nothing more lands on A */
    long long seq_a2 = recorded_so_far(&a);
    kvh_sleep_ms(400);
    rec = sim_recorded(&a, seq_a2);
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e)
        ck_assert_msg(!answered_ok(e) || is_rpc(e, "getClusterInfo"),
                      "the old leader still accepted a %s", json_string_value(json_object_get(e, "rpc")));
    json_decref(rec);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&a);
    kvcmctl_stop_ok(&b);
}
END_TEST

/* ---- 8. restart -------------------------------------------------------------------------- */

START_TEST(test_restart_new_epoch_replaces_state)
{
    struct kvcmctl s;
    kvh_daemon d1, d2;
    sim_start(&s, NULL);
    daemon_start(&d1, s.base, NULL);
    kvnode_layout l = kvh_layout("again", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d1, &l, &c);
    kvnode_key a[6], b[6];
    kvh_chain(a, 6, 80);
    KVH_OK(c, kvh_put(c, a, 6, 1));
    wait_blocks(&s, "again", a, 6, tmo(5000));
    long long epoch1 = kvcm_int(&d1, "epoch");
    wait_status(&s, "again", "epoch", epoch1, tmo(3000));
    kvnode_close(c);

    /* A crash: no HOST_DOWN, KVCM still believes in a. */
    ck_assert_int_eq(kvh_kill(&d1, SIGKILL), KVH_EXIT_SIGNAL_BASE + SIGKILL);
    kvh_destroy(&d1);
    kvh_sleep_ms(300);
    wait_blocks(&s, "again", a, 6, tmo(1000));

    long long seq0 = recorded_so_far(&s);
    daemon_start(&d2, s.base, NULL);
    KVH_CONNECT(&d2, &l, &c);
    b[0] = a[0];
    b[1] = a[1];
    kvh_chain(b + 2, 4, 81);
    KVH_OK(c, kvh_put(c, b, 6, 2));
    wait_blocks(&s, "again", b, 6, tmo(5000));
    long long epoch2 = kvcm_int(&d2, "epoch");
    ck_assert_int_ne(epoch2, epoch1);
    wait_status(&s, "again", "epoch", epoch2, tmo(3000));

    json_t *rec = sim_recorded(&s, seq0);
    json_t *snap = first_entry(rec, NULL, "EVENT_BLOCK_SNAPSHOT");
    ck_assert_msg(snap && answered_ok(snap), "the new daemon sent no snapshot");
    for (int j = 2; j < 6; j++) {
        ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_DELETE", a[j]), 0);   /* the snapshot did it */
        ck_assert_int_eq(key_events(rec, "EVENT_BLOCK_SNAPSHOT", a[j]), 0);
    }
    char prefix[96];
    snprintf(prefix, sizeof prefix, HOSTPORT "-%lld-", epoch2);
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e) {
        const char *trace = json_string_value(json_object_get(json_object_get(e, "body"), "trace_id"));
        ck_assert_msg(trace && strncmp(trace, prefix, strlen(prefix)) == 0,
                      "trace id %s of the new daemon lacks its epoch", trace ? trace : "(none)");
    }
    json_decref(rec);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d2);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 9. HOST_DOWN on SIGTERM ------------------------------------------------------------- */

static void dump_recorded(const struct kvcmctl *s)
{
    const char *path = getenv("KVCM_TEST_DUMP");
    if (!path || !*path)
        return;
    json_t *rec = sim_recorded(s, 0);
    if (json_dump_file(rec, path, JSON_INDENT(1)) != 0)
        fprintf(stderr, "cannot write %s\n", path);
    json_decref(rec);
}

START_TEST(test_host_down_on_sigterm)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, NULL);
    kvnode_layout l = kvh_layout("bye", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key k[4];
    kvh_chain(k, 4, 90);
    KVH_OK(c, kvh_put(c, k, 2, 1));
    wait_blocks(&s, "bye", k, 2, tmo(5000));
    KVH_OK(c, kvh_put(c, k + 2, 2, 1));
    wait_blocks(&s, "bye", k, 4, tmo(5000));
    size_t deleted = 0;
    KVH_OK(c, kvnode_delete(c, k, 1, &deleted));
    wait_blocks(&s, "bye", k + 1, 3, tmo(5000));
    wait_status(&s, "bye", "host_blocks", 3, tmo(3000));
    kvnode_close(c);

    uint64_t t_term = unix_ms();
    ck_assert_int_eq(kvh_stop(&d, 10000), 0);
    uint64_t t_exit = unix_ms();
    json_t *rec = sim_recorded(&s, 0);
    size_t n = json_array_size(rec);
    ck_assert_uint_gt(n, 0);
    json_t *last = json_array_get(rec, n - 1);
    ck_assert_msg(only_event(last, "EVENT_HOST_DOWN"), "the last request is not HOST_DOWN alone");
    ck_assert(answered_ok(last));
    ck_assert_int_eq(type_events(rec, "EVENT_HOST_DOWN"), 1);
    uint64_t t_down = (uint64_t)json_integer_value(json_object_get(last, "unix_ms"));
    ck_assert_msg(t_down + 5 >= t_term && t_down <= t_exit + 5,
                  "HOST_DOWN arrived at %" PRIu64 ", outside SIGTERM %" PRIu64 " .. exit %" PRIu64,
                  t_down, t_term, t_exit);
    ck_assert_msg((long long)t_down - (long long)t_term <= tmo(HOST_DOWN_MS),
                  "HOST_DOWN arrived %lld ms after SIGTERM", (long long)t_down - (long long)t_term);
    json_decref(rec);
    dump_recorded(&s);
    json_t *rep = reporter(&s, "bye");
    ck_assert(rep != NULL);
    ck_assert(json_is_false(json_object_get(rep, "registered")));
    ck_assert_int_eq(json_integer_value(json_object_get(rep, "block_count")), 0);
    json_decref(rep);
    kvh_destroy(&d);

    /* Again with KVCM down at the stop: still exit 0, in time. */
    daemon_start(&d, s.base, NULL);
    KVH_CONNECT(&d, &l, &c);
    KVH_OK(c, kvh_put(c, k, 4, 2));
    wait_blocks(&s, "bye", k, 4, tmo(5000));   /* registered again after HOST_DOWN */
    kvnode_close(c);
    control(&s, "{\"down\":true}");
    long long seq_down = recorded_so_far(&s);
    kvh_sleep_ms(300);
    uint64_t t0 = kvh_now_ms();
    t_term = unix_ms();
    ck_assert_int_eq(kvh_stop(&d, 10000), 0);
    uint64_t took = kvh_now_ms() - t0;
    ck_assert_msg(took < (uint64_t)tmo(HOST_DOWN_MS + 1000), "the stop took %" PRIu64 " ms", took);
    /* it did try: a fresh client looks for the leader first (getClusterInfo), then sends
     * HOST_DOWN; with every connection closed unanswered it gets no further */
    rec = sim_recorded(&s, seq_down);
    n = json_array_size(rec);
    ck_assert_uint_gt(n, 0);
    last = json_array_get(rec, n - 1);
    ck_assert_msg((uint64_t)json_integer_value(json_object_get(last, "unix_ms")) + 5 >= t_term,
                  "no request reached KVCM after SIGTERM");
    ck_assert_msg(only_event(last, "EVENT_HOST_DOWN") || is_rpc(last, "getClusterInfo"),
                  "the last request at stop was a %s",
                  json_string_value(json_object_get(last, "rpc")));
    ck_assert_str_eq(json_string_value(json_object_get(last, "injected")), "down");
    json_decref(rec);
    kvh_destroy(&d);

    /* And with KVCM slow (every answer 3 s late, calls in flight at SIGTERM): calls in
     * flight are abandoned, so the stop costs at most host_down_timeout. */
    control(&s, "{\"down\":false}");
    daemon_start(&d, s.base, "kvcm.request_timeout=5s\n");
    KVH_CONNECT(&d, &l, &c);
    KVH_OK(c, kvh_put(c, k, 4, 3));
    wait_blocks(&s, "bye", k, 4, tmo(5000));
    control(&s, "{\"delay_ms\":3000}");
    KVH_OK(c, kvnode_delete(c, k, 1, &deleted));   /* the publisher is in a call, too */
    kvnode_close(c);
    kvh_sleep_ms(300);
    t0 = kvh_now_ms();
    ck_assert_int_eq(kvh_stop(&d, 10000), 0);
    took = kvh_now_ms() - t0;
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "stop with KVCM slow: %" PRIu64 " ms\n", took);
    ck_assert_msg(took < (uint64_t)tmo(HOST_DOWN_MS + 1000),
                  "the stop took %" PRIu64 " ms with KVCM answering 3 s late (request_timeout 5 s)",
                  took);
    kvh_destroy(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 10. an invalid [kvcm] section ------------------------------------------------------- */

START_TEST(test_invalid_config_refused)
{
    /* Values that are wrong in themselves are all named at once; missing fields and
     * cross-field problems are all named at once (once every value parses). */
    static const struct { const char *conf; const char *names[3]; } cases[] = {
        { "kvcm.enabled=on\n", { "endpoints", "host_ip_port", NULL } },
        { "kvcm.enabled=on\nkvcm.queue_events=16\nkvcm.batch_events=32\n",
          { "endpoints", "host_ip_port", "batch_events" } },
        { "kvcm.enabled=on\nkvcm.endpoints=http://127.0.0.1:1\nkvcm.host_ip_port=127.0.0.1:7000\n"
          "kvcm.flush_interval=0ms\n", { "host_ip_port", "flush_interval", NULL } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvh_daemon d;
        ck_assert_msg(kvh_spawn(&d, cases[i].conf) == 0, "spawn: %s", kvh_error());
        int st = kvh_wait_exit(&d, tmo(10000));
        char *log = kvh_read_log(&d);
        ck_assert_msg(st == 2, "case %zu: exit status %d, not 2:\n%s", i, st, log ? log : "");
        for (int j = 0; j < 3 && cases[i].names[j]; j++)
            ck_assert_msg(log && strstr(log, cases[i].names[j]),
                          "case %zu: the refusal does not name %s:\n%s", i, cases[i].names[j],
                          log ? log : "");
        free(log);
        kvh_destroy(&d);
    }
}
END_TEST

/* ---- 11. kvcm off ------------------------------------------------------------------------ */

START_TEST(test_off_sends_nothing)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    char conf[1024];
    snprintf(conf, sizeof conf,
             "kvcm.endpoints=%s\n"
             "kvcm.host_ip_port=" HOSTPORT "\n"
             "kvcm.flush_interval=20ms\n"
             "kvcm.heartbeat_interval=200ms\n", s.base);
    KVH_START(&d, conf);
    kvnode_layout l0 = kvh_layout("off", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l0, &c);
    kvnode_key k[8];
    kvh_chain(k, 8, 110);
    KVH_OK(c, kvh_put(c, k, 8, 1));
    size_t deleted = 0;
    KVH_OK(c, kvnode_delete(c, k, 2, &deleted));
    ck_assert_int_eq(kvh_match(c, k + 2, 6), 6);
    kvh_sleep_ms(600);
    ck_assert_str_eq(kvcm_state(&d), "DISABLED");
    kvnode_close(c);
    KVH_STOP_OK(&d);
    json_t *rec = sim_recorded(&s, 0);
    ck_assert_msg(json_array_size(rec) == 0, "kvcm off, yet KVCM got %zu requests",
                  json_array_size(rec));
    json_decref(rec);
    ck_assert_int_eq(recorded_so_far(&s), 0);
    kvh_destroy(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 12. overflow, again and again: the publisher never wedges ---------------------------- */

#define WEDGE_KEYS   320
#define WEDGE_ROUNDS 20

/* The keys of k[0..n) that held[] marks, into want; how many. */
static size_t held_keys(const kvnode_key *k, const bool *held, size_t n, kvnode_key *want)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (held[i])
            want[m++] = k[i];
    return m;
}

START_TEST(test_overflow_rounds_never_wedge)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    /* Small queue and batches: every burst overflows, and the resync's marker sits behind
     * more than one batch of events. */
    daemon_start(&d, s.base, "kvcm.queue_events=64\nkvcm.batch_events=16\nkvcm.request_timeout=5s\n");
    kvnode_layout l = kvh_layout("wedge", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key k[WEDGE_KEYS], want[WEDGE_KEYS];
    bool held[WEDGE_KEYS] = { false };
    kvh_chain(k, WEDGE_KEYS, 120);
    KVH_OK(c, kvh_put(c, k, 1, 1));
    held[0] = true;
    wait_blocks(&s, "wedge", k, 1, tmo(5000));
    wait_kvcm_state(&d, "READY", tmo(3000));
    long long dropped0 = kvcm_int(&d, "dropped_total"), snaps0 = kvcm_int(&d, "snapshots_total");

    unsigned seed = 1;
    int overflowed = 0;
    for (int round = 0; round < WEDGE_ROUNDS; round++) {
        /* KVCM answers each report 30 ms late while a burst of changes comes. */
        control(&s, "{\"delay_ms\":30,\"delay_only\":\"reportEvent\"}");
        long long dropped_before = kvcm_int(&d, "dropped_total");
        for (int step = 0; step < 24; step++) {
            /* 8 keys change state per step: put the absent ones, delete the held ones */
            kvnode_key put[8], del[8];
            size_t np = 0, nd = 0;
            for (int j = 0; j < 8; j++) {
                seed = seed * 1103515245u + 12345u;
                size_t i = 1 + (seed >> 8) % (WEDGE_KEYS - 1);
                bool dup = false;
                for (size_t x = 0; x < np; x++)
                    dup = dup || put[x] == k[i];
                for (size_t x = 0; x < nd; x++)
                    dup = dup || del[x] == k[i];
                if (dup)
                    continue;
                if (held[i])
                    del[nd++] = k[i];
                else
                    put[np++] = k[i];
                held[i] = !held[i];
            }
            size_t deleted = 0;
            if (np)
                KVH_OK(c, kvh_put(c, put, np, (uint64_t)round));
            if (nd) {
                KVH_OK(c, kvnode_delete(c, del, nd, &deleted));
                ck_assert_uint_eq(deleted, nd);
            }
        }
        long long dropped_now = kvcm_int(&d, "dropped_total");
        control(&s, "{\"delay_ms\":0}");
        overflowed += dropped_now > dropped_before;
        /* KVCM's view ends up equal to the daemon's complete keys, every time. */
        size_t n = held_keys(k, held, WEDGE_KEYS, want);
        ck_assert_int_eq(KVH_STAT(&d, "tiers.host.blocks"), (long long)n);
        char what[64];
        snprintf(what, sizeof what, "round %d", round);
        uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
        char why[256] = "";
        for (;;) {
            json_t *rep = reporter(&s, "wedge");
            bool eq = blocks_equal(rep, want, n, why, sizeof why);
            json_decref(rep);
            if (eq)
                break;
            json_t *ks = kvcm_stats(&d);
            ck_assert_msg(kvh_now_ms() < deadline,
                          "%s (%lld events dropped in it): %s after 10 s; daemon holds %zu, "
                          "kvcm state %s, queue %lld", what, dropped_now - dropped_before, why, n,
                          json_string_value(json_object_get(ks, "state")),
                          (long long)json_integer_value(json_object_get(ks, "queue")));
            json_decref(ks);
            kvh_sleep_ms(20);
        }
        wait_kvcm_state(&d, "READY", tmo(5000));
    }
    /* the scenario did overflow, and resynchronised by snapshots */
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "overflow rounds: %d of %d overflowed, %lld events dropped, %lld snapshots\n",
                overflowed, WEDGE_ROUNDS, kvcm_int(&d, "dropped_total") - dropped0,
                kvcm_int(&d, "snapshots_total") - snaps0);
    ck_assert_int_gt(overflowed, 0);
    ck_assert_int_gt(kvcm_int(&d, "dropped_total"), dropped0);
    ck_assert_int_gt(kvcm_int(&d, "snapshots_total"), snaps0);
    json_t *rep = reporter(&s, "wedge");
    ck_assert_int_eq(json_object_size(json_object_get(rep, "rejected")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(rep, "uncoalesced_requests")), 0);
    json_decref(rep);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 13. a publisher with work pending too long is not READY ------------------------------ */

/* A fresh directory for an admin unix socket: "admin.listen=unix:DIR/a.sock". */
static void admin_addr(char *addr, size_t alen)
{
    char dir[PATH_MAX];
    ck_assert_msg(kvh_mkdtemp(dir, sizeof dir) == 0, "%s", kvh_error());
    snprintf(addr, alen, "unix:%s/a.sock", dir);
}

/* GET path from the admin listener; the status, the body into *body (malloc'd). */
static long admin_get(const char *addr, const char *path, char **body)
{
    return kvh_http_req(addr, NULL, path, body, NULL, 0);
}

START_TEST(test_stall_is_visible)
{
    struct kvcmctl s;
    kvh_daemon d;
    char addr[PATH_MAX + 16], extra[PATH_MAX + 256];
    sim_start(&s, NULL);
    admin_addr(addr, sizeof addr);
    snprintf(extra, sizeof extra, "admin.listen=%s\nkvcm.stall_timeout=400ms\n"
             "kvcm.request_timeout=10s\n", addr);
    daemon_start(&d, s.base, extra);
    kvnode_layout l = kvh_layout("stall", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key k[2];
    kvh_chain(k, 2, 130);
    KVH_OK(c, kvh_put(c, k, 1, 1));
    wait_blocks(&s, "stall", k, 1, tmo(5000));
    wait_kvcm_state(&d, "READY", tmo(3000));
    char *body = NULL;
    ck_assert_int_eq(admin_get(addr, "/readyz", &body), 200);
    ck_assert_msg(strstr(body, "stalled") == NULL, "/readyz: %s", body);
    free(body);

    /* KVCM holds every report 4 s: the ADD waits far longer than the 400 ms bound. */
    control(&s, "{\"delay_ms\":4000,\"delay_only\":\"reportEvent\"}");
    KVH_OK(c, kvh_put(c, k + 1, 1, 1));
    wait_kvcm_state(&d, "STALLED", tmo(3500));
    json_t *ks = kvcm_stats(&d);
    ck_assert(json_is_true(json_object_get(ks, "stalled")));
    ck_assert_int_ge(json_integer_value(json_object_get(ks, "stalled_ms")), 400);
    json_decref(ks);
    ck_assert_int_eq(admin_get(addr, "/readyz", &body), 200);
    ck_assert_msg(strstr(body, "KVCM publisher stalled") != NULL, "/readyz while stalled: %s", body);
    free(body);
    ck_assert_int_eq(admin_get(addr, "/metrics", &body), 200);
    ck_assert_msg(strstr(body, "\nkvnode_kvcm_stalled 1\n") != NULL &&
                  strstr(body, "kvnode_kvcm_state{state=\"STALLED\"} 1") != NULL,
                  "/metrics while stalled lacks kvnode_kvcm_stalled 1 / state STALLED");
    free(body);

    /* KVCM answers again: the change lands, READY again, nothing stalled. */
    control(&s, "{\"delay_ms\":0}");
    wait_blocks(&s, "stall", k, 2, tmo(10000));
    wait_kvcm_state(&d, "READY", tmo(10000));
    ck_assert_int_eq(admin_get(addr, "/readyz", &body), 200);
    ck_assert_msg(strstr(body, "stalled") == NULL, "/readyz after: %s", body);
    free(body);
    ck_assert_int_eq(admin_get(addr, "/metrics", &body), 200);
    ck_assert_msg(strstr(body, "\nkvnode_kvcm_stalled 0\n") != NULL, "/metrics after: no kvnode_kvcm_stalled 0");
    free(body);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 14. instance ids identify the deployment --------------------------------------------- */

/* The instance ids KVCM has reporters of for model (this host), up to max; how many. */
static size_t instances_of(const struct kvcmctl *s, const char *model, char ids[][256], size_t max)
{
    json_t *st = sim_state(s), *r;
    const char *key;
    size_t n = 0;
    json_object_foreach(json_object_get(st, "reporters"), key, r) {
        const char *inst = json_string_value(json_object_get(r, "instance_id"));
        if (n < max && instance_of(inst, model))
            snprintf(ids[n++], sizeof ids[0], "%s", inst);
    }
    json_decref(st);
    return n;
}

START_TEST(test_instance_ids_never_collide)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, NULL);
    /* Same model, dtype, block size and TP size; different layer counts. */
    kvnode_layout la = kvh_layout("twin", BB, 1, 0), lb = kvh_layout("twin", BB, 1, 0);
    la.num_layers = 4;
    lb.num_layers = 8;
    kvnode_client *ca, *cb;
    KVH_CONNECT(&d, &la, &ca);
    KVH_CONNECT(&d, &lb, &cb);
    kvnode_key a[4], b[3];
    kvh_chain(a, 4, 140);
    kvh_chain(b, 3, 141);
    KVH_OK(ca, kvh_put(ca, a, 4, 1));
    KVH_OK(cb, kvh_put(cb, b, 3, 1));
    /* KVCM ends up with two instances, one holding each chain, and they keep them. */
    char ids[4][256], why[512] = "";
    size_t n = 0;
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(5000);
    for (int stable = 0; stable < 5;) {
        n = instances_of(&s, "twin", ids, 4);
        bool eq = false;
        if (n == 2) {
            json_t *r0 = reporter_of(&s, ids[0]), *r1 = reporter_of(&s, ids[1]);
            char w1[512];
            eq = (blocks_equal(r0, a, 4, why, sizeof why) && blocks_equal(r1, b, 3, w1, sizeof w1)) ||
                 (blocks_equal(r0, b, 3, why, sizeof why) && blocks_equal(r1, a, 4, w1, sizeof w1));
            json_decref(r0);
            json_decref(r1);
        } else if (n == 1) {
            json_t *r0 = reporter_of(&s, ids[0]);
            snprintf(why, sizeof why, "both deployments publish as instance %s, which holds %lld "
                     "keys (chain A 4, chain B 3)", ids[0],
                     r0 ? (long long)json_integer_value(json_object_get(r0, "block_count")) : -1);
            json_decref(r0);
        } else {
            snprintf(why, sizeof why, "%zu instances for model twin", n);
        }
        stable = eq ? stable + 1 : 0;
        ck_assert_msg(eq || kvh_now_ms() < deadline, "%s", why);
        kvh_sleep_ms(50);
    }
    const char *ida = ids[0], *idb = ids[1];
    ck_assert_msg(strcmp(ida, idb) != 0, "two deployments publish as one instance id %s", ida);
    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&d);

    /* A template without {fingerprint}: the second deployment that maps to an id in use is
     * not published, and the daemon names both. */
    ck_assert_int_eq(kvcmctl_http(&s, "POST", "/reset", "{}", NULL), 200);
    daemon_start(&d, s.base, "kvcm.instance_id={model}_{block_tokens}\n");
    KVH_CONNECT(&d, &la, &ca);
    KVH_OK(ca, kvh_put(ca, a, 4, 2));
    wait_blocks(&s, "twin", a, 4, tmo(5000));
    KVH_CONNECT(&d, &lb, &cb);
    KVH_OK(cb, kvh_put(cb, b, 3, 2));
    deadline = kvh_now_ms() + (uint64_t)tmo(3000);
    const char *err = "";
    json_t *ks = NULL;
    for (;;) {
        json_decref(ks);
        ks = kvcm_stats(&d);
        err = json_string_value(json_object_get(ks, "last_error"));
        if (err && strstr(err, "twin_16") && strstr(err, "already"))
            break;
        ck_assert_msg(kvh_now_ms() < deadline, "no error names the clash: last_error \"%s\"",
                      err ? err : "");
        kvh_sleep_ms(20);
    }
    /* both deployment ids are named; the second one is marked refused */
    size_t named = 0, refused = 0, i;
    json_t *dep;
    json_array_foreach(json_object_get(ks, "deployments"), i, dep) {
        const char *did = json_string_value(json_object_get(dep, "deployment_id"));
        named += did && strstr(err, did) != NULL;
        refused += json_is_string(json_object_get(dep, "refused"));
    }
    ck_assert_msg(named == 2, "last_error names %zu of the 2 deployments: %s", named, err);
    ck_assert_uint_eq(refused, 1);
    json_decref(ks);
    kvh_sleep_ms(300);
    wait_blocks(&s, "twin", a, 4, tmo(1000));   /* the first one's blocks, and only those */
    ck_assert_str_eq(kvcm_state(&d), "DEGRADED");

    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 15. media: hbm and dram ------------------------------------------------------------- */

#define HBM_CONF "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\n" \
                 "hbm.backend=sim\nhbm.bytes=1MiB\nhbm.high_watermark=0.75\nhbm.low_watermark=0.5\n"
#define NMED 60

/* put_begin keys in tier, fill, commit; where each went into tiers (may be NULL). */
static void put_in_tier(kvnode_client *c, const kvnode_key *keys, size_t n, int tier, int *tiers)
{
    kvnode_loc locs[NMED];
    kvnode_lease lease = 0;
    ck_assert(n <= NMED);
    KVH_OK(c, kvnode_put_begin(c, keys, n, tier, &lease, locs));
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(locs[i].ptr != NULL, "put_begin: no slot for key #%zu", i);
        kvh_fill(locs[i].ptr, BB, keys[i], 1);
        if (tiers)
            tiers[i] = locs[i].tier;
    }
    KVH_OK(c, kvnode_put_commit(c, lease));
}

/* The daemon's truth: which of keys are in HBM / host memory. */
static void tiers_now(kvnode_client *c, const kvnode_key *keys, size_t n, kvnode_key *hbm,
                      size_t *nh, kvnode_key *host, size_t *nd)
{
    *nh = *nd = 0;
    for (size_t i = 0; i < n; i++) {
        kvnode_tiers t;
        KVH_OK(c, kvnode_match_tiers(c, &keys[i], 1, &t));
        ck_assert_uint_eq(t.matched, 1);
        if (t.hbm)
            hbm[(*nh)++] = keys[i];
        else
            host[(*nd)++] = keys[i];
    }
}

/* The spec URI KVCM holds for key under medium ("" when none). */
static const char *uri_of(json_t *state_rep, const char *medium, kvnode_key key)
{
    char ks[32];
    snprintf(ks, sizeof ks, "%" PRId64, key);
    json_t *specs = json_object_get(json_object_get(json_object_get(state_rep, "block_specs"),
                                                    medium), ks);
    const char *name;
    json_t *uri;
    json_object_foreach(specs, name, uri)
        return json_string_value(uri);
    return "";
}

START_TEST(test_media_per_tier)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, HBM_CONF);
    kvnode_layout l = kvh_layout("media", BB, 1, 0);
    kvnode_client *c = NULL;
    int rc = kvnode_connect_device(d.sock, &l, 0, &c);
    ck_assert_msg(rc == 0 && c, "kvnode_connect_device: %d (%s)", rc, kvnode_connect_error());
    kvnode_key k[NMED], hbm[NMED], host[NMED];
    size_t nh, nd;
    kvh_chain(k, NMED, 150);
    int tiers[NMED];
    /* 8 blocks in HBM, 8 in host memory. */
    put_in_tier(c, k, 8, KVNODE_TIER_HBM, tiers);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(tiers[i], KVNODE_TIER_HBM);
    put_in_tier(c, k + 8, 8, KVNODE_TIER_HOST, tiers);
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(5000);
    char why[256] = "";
    for (;;) {
        json_t *rep = reporter(&s, "media");
        bool eq = medium_equal(rep, "hbm", k, 8, why, sizeof why) &&
                  medium_equal(rep, "dram", k + 8, 8, why, sizeof why);
        json_decref(rep);
        if (eq)
            break;
        ck_assert_msg(kvh_now_ms() < deadline, "%s", why);
        kvh_sleep_ms(20);
    }
    /* NODE_REGISTER names every medium the node has; the default URI follows the medium */
    json_t *rep = reporter(&s, "media");
    json_t *med = json_object_get(rep, "mediums");
    bool has_hbm = false, has_dram = false;
    size_t i;
    json_t *m;
    json_array_foreach(med, i, m) {
        has_hbm = has_hbm || strcmp(json_string_value(m), "hbm") == 0;
        has_dram = has_dram || strcmp(json_string_value(m), "dram") == 0;
    }
    ck_assert_msg(has_hbm && has_dram, "NODE_REGISTER registered %s",
                  json_dumps(med, JSON_COMPACT));
    json_decref(rep);
    json_t *st = sim_json(&s, "/state?specs=1");
    const char *id;
    json_t *r, *srep = NULL;
    json_object_foreach(json_object_get(st, "reporters"), id, r)
        if (instance_of(json_string_value(json_object_get(r, "instance_id")), "media"))
            srep = r;
    ck_assert_str_eq(uri_of(srep, "hbm", k[0]), "rtp-llm://" HOSTPORT "/hbm?size=16384");
    ck_assert_str_eq(uri_of(srep, "dram", k[8]), "rtp-llm://" HOSTPORT "/dram?size=16384");
    json_decref(st);

    /* Pressure: 44 more HBM blocks (52 of 64) pass the high watermark (48); demotion moves
     * the oldest to host memory. KVCM follows: DELETE from hbm, ADD to dram. */
    long long seq0 = recorded_so_far(&s);
    put_in_tier(c, k + 16, NMED - 16, KVNODE_TIER_HBM, NULL);
    deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    for (;;) {
        tiers_now(c, k, NMED, hbm, &nh, host, &nd);
        json_t *rp = reporter(&s, "media");
        bool eq = medium_equal(rp, "hbm", hbm, nh, why, sizeof why) &&
                  medium_equal(rp, "dram", host, nd, why, sizeof why);
        json_decref(rp);
        if (eq && nd > 8)
            break;
        if (eq)
            snprintf(why, sizeof why, "nothing demoted yet");
        if (kvh_now_ms() >= deadline) {
            json_t *ks = kvcm_stats(&d);
            ck_abort_msg("after demotion (daemon: %zu in HBM, %zu in host memory): %s; the "
                         "daemon's kvcm stats: %s", nh, nd, why, json_dumps(ks, JSON_COMPACT));
        }
        kvh_sleep_ms(50);
    }
    ck_assert_int_gt(KVH_STAT(&d, "demotions.blocks_total"), 0);
    json_t *rec = sim_recorded(&s, seq0);
    /* k[0] was demoted (oldest): a DELETE from hbm and an ADD to dram */
    bool del_hbm = false, add_dram = false;
    size_t j;
    json_t *e, *ev;
    json_array_foreach(rec, i, e) {
        if (!is_rpc(e, "reportEvent") || !answered_ok(e))
            continue;
        json_array_foreach(events_of(e), j, ev) {
            json_t *p = json_object_get(ev, "block_delete");
            if (p && key_is(json_string_value(json_object_get(p, "block_key")), k[0]) &&
                strcmp(json_string_value(json_object_get(p, "medium")), "hbm") == 0)
                del_hbm = true;
            p = json_object_get(ev, "block_add");
            if (p && key_is(json_string_value(json_object_get(p, "block_key")), k[0]) &&
                strcmp(json_string_value(json_object_get(p, "medium")), "dram") == 0)
                add_dram = true;
        }
    }
    json_decref(rec);
    ck_assert_msg(del_hbm && add_dram, "k[0] demoted: DELETE hbm %s, ADD dram %s",
                  del_hbm ? "sent" : "missing", add_dram ? "sent" : "missing");
    rep = reporter(&s, "media");
    ck_assert_int_eq(json_integer_value(json_object_get(rep, "uncoalesced_requests")), 0);
    ck_assert_int_eq(json_object_size(json_object_get(rep, "rejected")), 0);
    json_decref(rep);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 16. an empty deployment registers at HELLO ------------------------------------------- */

START_TEST(test_register_at_hello)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, NULL);
    kvnode_layout l0 = kvh_layout("empty", BB, 2, 0), l1 = kvh_layout("empty", BB, 2, 1);
    kvnode_client *c0, *c1;
    /* One rank of two: not a complete TP group, nothing registers. */
    KVH_CONNECT(&d, &l0, &c0);
    kvh_sleep_ms(HB_MS * 3);
    json_t *rec = sim_recorded(&s, 0);
    ck_assert_msg(first_entry(rec, "registerInstance", NULL) == NULL,
                  "registerInstance with one rank of two connected");
    json_decref(rec);
    /* The second rank completes the group: registered, heartbeating, empty. */
    KVH_CONNECT(&d, &l1, &c1);
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(5000);
    for (;;) {
        json_t *rep = reporter(&s, "empty");
        long long beats = rep ? json_integer_value(json_object_get(rep, "heartbeats")) : -1;
        bool reg = rep && json_is_true(json_object_get(rep, "registered"));
        long long blocks = rep ? json_integer_value(json_object_get(rep, "block_count")) : -1;
        json_decref(rep);
        if (reg && beats >= 2 && blocks == 0)
            break;
        ck_assert_msg(kvh_now_ms() < deadline, "a connected empty deployment: reporter %s, "
                      "%lld heartbeats, %lld blocks after 5 s", rep ? "present" : "absent", beats,
                      blocks);
        kvh_sleep_ms(20);
    }
    wait_kvcm_state(&d, "READY", tmo(3000));
    ck_assert_int_eq(kvcm_int(&d, "accepted_total"), 0);

    kvnode_close(c0);
    kvnode_close(c1);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 17. INSTANCE_NOT_EXIST: straight to registerInstance --------------------------------- */

START_TEST(test_instance_not_exist_reregisters)
{
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    daemon_start(&d, s.base, "kvcm.retry_base=2s\nkvcm.retry_max=4s\n");
    kvnode_layout l = kvh_layout("forgot", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key k[3];
    kvh_chain(k, 3, 160);
    KVH_OK(c, kvh_put(c, k, 3, 1));
    wait_blocks(&s, "forgot", k, 3, tmo(5000));
    wait_kvcm_state(&d, "READY", tmo(3000));

    /* KVCM restarts and forgets everything (recordings too). */
    ck_assert_int_eq(kvcmctl_http(&s, "POST", "/reset", "{}", NULL), 200);
    wait_blocks(&s, "forgot", k, 3, tmo(10000));
    json_t *rec = sim_recorded(&s, 0);
    json_t *first = NULL, *e;
    size_t i;
    json_array_foreach(rec, i, e) {
        const char *st = json_string_value(json_object_get(e, "status"));
        ck_assert_msg(!(has_event(e, "EVENT_NODE_REGISTER") && st &&
                        strcmp(st, "INSTANCE_NOT_EXIST") == 0),
                      "NODE_REGISTER sent to an instance KVCM does not know (request #%zu)", i);
        if (!first && !is_rpc(e, "getClusterInfo") && !only_event(e, "EVENT_HEARTBEAT"))
            first = e;
    }
    ck_assert_msg(first && is_rpc(first, "registerInstance"),
                  "the publisher's first request after KVCM forgot the instance is %s (%s)",
                  first ? json_string_value(json_object_get(first, "rpc")) : "none",
                  first ? json_dumps(json_object_get(first, "body"), JSON_COMPACT) : "");
    json_decref(rec);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

/* ---- 18. tenants: no client takes another tenant's identity (issue 27) -------------------- */

#define ALPHA_UID 65534

struct alpha_put_job {
    const kvh_daemon *d;
    const kvnode_key *keys;
    size_t n;
};

/* Tenant alpha's engine (run as ALPHA_UID): puts its chain and leaves. */
static int alpha_put(void *arg)
{
    const struct alpha_put_job *j = arg;
    kvnode_layout l = kvh_layout("imp", BB, 1, 0);
    kvnode_client *c;
    if (kvnode_connect(j->d->sock, &l, &c) != 0) {
        fprintf(stderr, "alpha: connect: %s\n", kvnode_connect_error());
        return 10;
    }
    int rc = kvh_put(c, j->keys, j->n, 7) == 0 ? 0 : 11;
    if (rc)
        fprintf(stderr, "alpha: put: %s\n", kvh_error());
    kvnode_close(c);
    return rc;
}

/* kvcm.deployments of the stats, a new reference. */
static json_t *kvcm_deployments(const kvh_daemon *d)
{
    json_t *k = kvcm_stats(d);
    json_t *deps = json_incref(json_object_get(k, "deployments"));
    json_decref(k);
    ck_assert_msg(json_is_array(deps), "the stats have no kvcm.deployments");
    return deps;
}

static const char *dep_str(json_t *dep, const char *name)
{
    const char *v = json_string_value(json_object_get(dep, name));
    return v ? v : "";
}

/* A client of "default" declaring tenant alpha's layout with extra "|tenant=alpha" (the
 * text a named tenant's fingerprint used to end with) gets a deployment and a KVCM instance
 * of its own: its put and delete of alpha's keys leave alpha's instance holding alpha's
 * chain. Before issue 27 it got alpha's fingerprint, so its events went to alpha's
 * instance and the delete made KVCM forget alpha's chain. */
START_TEST(test_tenant_identity_not_forgeable)
{
    TENANTS_NEEDS_ROOT("daemon_kvcm: tenant_identity");
    struct kvcmctl s;
    kvh_daemon d;
    sim_start(&s, NULL);
    char conf[4096];
    kvcm_conf(conf, sizeof conf, s.base,
              "server.socket_mode=0666\nmemory.host_bytes=32MiB\nmemory.slab_bytes=1MiB\n"
              "tenant.alpha.uids=65534\ntenant.alpha.host_bytes=16MiB\n");
    tenants_start(&d, conf);

    kvnode_key a[4];
    kvh_chain(a, 4, 270);
    struct alpha_put_job j = { .d = &d, .keys = a, .n = 4 };
    ck_assert_int_eq(tenants_run_as(alpha_put, &j, ALPHA_UID, ALPHA_UID, NULL, 0), 0);
    wait_blocks(&s, "imp", a, 4, tmo(5000));
    json_t *deps = kvcm_deployments(&d);
    ck_assert_uint_eq(json_array_size(deps), 1);
    char alpha_dep[256], alpha_inst[256];
    snprintf(alpha_dep, sizeof alpha_dep, "%s", dep_str(json_array_get(deps, 0), "deployment_id"));
    snprintf(alpha_inst, sizeof alpha_inst, "%s", dep_str(json_array_get(deps, 0), "instance_id"));
    json_decref(deps);

    /* root is in no [tenant] section: "default" */
    kvnode_layout forged = kvh_layout("imp", BB, 1, 0);
    forged.extra = "|tenant=alpha";
    kvnode_client *c;
    KVH_CONNECT(&d, &forged, &c);
    KVH_OK(c, kvh_put(c, a, 4, 8));

    /* The forged layout is a deployment of its own, with its own instance id. */
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(3000);
    for (;;) {
        deps = kvcm_deployments(&d);
        size_t n = json_array_size(deps);
        if (n == 2)
            break;
        json_decref(deps);
        ck_assert_msg(kvh_now_ms() < deadline, "the forged layout of \"default\" publishes as tenant "
                      "alpha's deployment %s (instance %s): %zu deployment(s) known to the publisher",
                      alpha_dep, alpha_inst, n);
        kvh_sleep_ms(20);
    }
    size_t i;
    json_t *dep;
    json_array_foreach(deps, i, dep) {
        ck_assert_msg(!json_is_string(json_object_get(dep, "refused")), "deployment %s refused: %s",
                      dep_str(dep, "deployment_id"), dep_str(dep, "refused"));
        if (i == 0)
            continue;
        ck_assert_str_ne(dep_str(dep, "deployment_id"), alpha_dep);
        ck_assert_str_ne(dep_str(dep, "instance_id"), alpha_inst);
    }
    json_decref(deps);

    /* Deleting alpha's keys in its own namespace leaves alpha's instance whole. */
    size_t deleted = 0;
    KVH_OK(c, kvnode_delete(c, a, 4, &deleted));
    ck_assert_uint_eq(deleted, 4);
    kvh_sleep_ms(tmo(300));      /* several flush intervals: a wrong DELETE would have gone */
    char why[512] = "";
    for (int k = 0; k < 5; k++) {
        json_t *rep = reporter_of(&s, alpha_inst);
        bool eq = blocks_equal(rep, a, 4, why, sizeof why);
        json_decref(rep);
        ck_assert_msg(eq, "tenant alpha's instance %s after default's delete: %s", alpha_inst, why);
        kvh_sleep_ms(40);
    }
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
}
END_TEST

int main(void)
{
    /* One test case per test, each with its own bound (seconds). */
    const struct { const char *name; const TTest *test; double timeout_s; } cases[] = {
        { "lifecycle", test_lifecycle, 30 },
        { "tp2", test_tp2_completeness, 30 },
        { "coalescing", test_coalescing, 30 },
        { "overflow", test_overflow_resync, 40 },
        { "slow_snapshot", test_heartbeat_during_slow_snapshot, 40 },
        { "down_or_slow", test_down_or_slow_under_load, 60 },
        { "failover", test_leader_failover, 40 },
        { "restart", test_restart_new_epoch_replaces_state, 30 },
        { "host_down", test_host_down_on_sigterm, 30 },
        { "invalid_config", test_invalid_config_refused, 30 },
        { "off", test_off_sends_nothing, 30 },
        { "overflow_rounds", test_overflow_rounds_never_wedge, 60 },
        { "stall", test_stall_is_visible, 40 },
        { "instance_ids", test_instance_ids_never_collide, 40 },
        { "media", test_media_per_tier, 40 },
        { "register_at_hello", test_register_at_hello, 30 },
        { "instance_not_exist", test_instance_not_exist_reregisters, 30 },
        { "tenant_identity", test_tenant_identity_not_forgeable, 40 },
    };
    Suite *suite = suite_create("daemon_kvcm");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, cases[i].timeout_s * scale());
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(suite, tc);
    }
    SRunner *sr = srunner_create(suite);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
