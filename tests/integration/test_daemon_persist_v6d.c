/* Integration: a real kvnoded persisting to the v6d backend, against the KVS
 * protocol simulator (tests/sim/kvs_sim.c, $KVS_SIM, started through
 * simctl.h), with a small host tier (4 MiB of 1 MiB slabs = 64 blocks of
 * 64 KiB) so that evictions are easy to cause:
 *
 * - write_through and write_back: blocks evicted from memory stay matchable
 *   (in the store tier) and come back byte-exact through GET (promotions);
 * - a burst of write-through puts, pinned until written: every block is
 *   written without any eviction, and found after a restart;
 * - restart: new daemons against the same store find the blocks through
 *   lookups (MATCH, and GET of keys no MATCH asked about; a 200-key chain
 *   the store is asked about in chunks); a write_back daemon writes what the
 *   store lacks when it stops;
 * - a store that is down at start: puts work in memory, the state is
 *   degraded, and once the store comes up the state turns ok and new puts
 *   are written;
 * - a store that goes down mid-run and comes back empty: writes fail and are
 *   counted, memory keeps serving, ghosts cannot be read but stay; then
 *   writes succeed again and the ghosts the store lost are forgotten;
 * - a slow store: the loop stays responsive (PING), a GET of ghosts and a
 *   MATCH that needs a lookup answer after server.request_timeout with what
 *   is ready, a client that gives up while waiting does no harm;
 * - a store that answers garbage: protocol failures, no wrong bytes, the
 *   daemon keeps serving;
 * - a worker stuck in a store call (the simulator holds /acquire 5 s, over a
 *   2 s server.worker_stall_timeout) turns /readyz not-ready (naming it) and
 *   kvnode_worker_up 0 while /healthz stays ok, and ready again once the call
 *   returns.
 *
 * - check words (issue 19): a block with a word is stored under rtp-llm's
 *   object key with a -check-<word> part (word 0: rtp-llm's key exactly) and
 *   found by a new daemon under its word only;
 * - DELETE holds although the store cannot delete a sealed object (tombstones,
 *   bounded by persist.tombstones), for keys in memory and keys only in the
 *   store; a re-put makes a key visible again;
 * - a worker's queued writes go under one create lease, its queued reads
 *   under one read lease (the simulator counts the calls), blocks in
 *   (simulated) HBM included, byte-exact.
 *
 * - tenants (issue 15): alpha and beta, the same layout and the same keys
 *   with other bytes, write through to one store: each tenant's objects are
 *   under an object namespace of its own (<object_namespace>.tenant-<NAME>),
 *   also when the engines name the same kvs_deployment_id; each tenant reads
 *   its own bytes back
 *   through lookups after a cold restart, and beta's DELETE hides nothing
 *   of alpha's (as root only: the tenants are other users).
 *
 * Runs in about 30 s (the slow store takes 13 s, the stuck worker 5 s).
 * Only built with V6D=1 (the Makefile leaves it out otherwise). */
#include <check.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "pings.h"
#include "tenants_util.h"
#include "../common/kvh_http.h"
#include "../sim/simctl.h"

#define BB          (64u << 10)
#define SMALL_TIER  "memory.host_bytes=4MiB\nmemory.slab_bytes=1MiB\n"
#define LONG_CHAIN  200

/* ---- helpers ------------------------------------------------------------------ */

/* A daemon configuration for the simulator s (its URL and socket) plus extra. */
static void v6d_conf(char *buf, size_t len, const struct simctl *s, const char *extra)
{
    int w = snprintf(buf, len,
                     SMALL_TIER
                     "persist.backend=v6d\n"
                     "persist.url=%s\n"
                     "persist.socket_path=%s\n"
                     "persist.connect_timeout=500ms\n"
                     "%s",
                     s->base, s->sock, extra ? extra : "");
    ck_assert(w > 0 && (size_t)w < len);
}

static void sim_start(struct simctl *s, const char *const *extra)
{
    struct simctl_opts o = { .dir_prefix = "kvnode-v6d", .extra = extra,
                             .valgrind = simctl_under_valgrind() };
    simctl_start(s, &o);
}

/* Start the simulator again on the same socket path and HTTP address. */
static void sim_restart(struct simctl *s)
{
    char addr[64];
    snprintf(addr, sizeof addr, "%s", s->http);
    struct simctl_opts o = { .keep_dir = true, .http_addr = addr,
                             .valgrind = simctl_under_valgrind() };
    simctl_start(s, &o);
    ck_assert_str_eq(s->http, addr);
}

/* A loopback TCP port nobody listens on (bound, read, closed). */
static unsigned free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    ck_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    ck_assert(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* One integer of the stats (a function, so assertion messages stay readable). */
static long long stat_int(const kvh_daemon *d, const char *path)
{
    return KVH_STAT(d, path);
}

static json_t *stats(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    return st;
}

/* persist.state ("ok", "degraded", ...), a static copy. */
static const char *pstate(const kvh_daemon *d)
{
    static char buf[32];
    json_t *st = stats(d);
    const char *v = json_string_value(kvh_json_get(st, "persist.state"));
    ck_assert_msg(v != NULL, "stats have no persist.state");
    snprintf(buf, sizeof buf, "%s", v);
    json_decref(st);
    return buf;
}

static char *plast_error(const kvh_daemon *d)
{
    json_t *st = stats(d);
    const char *v = json_string_value(kvh_json_get(st, "persist.last_error"));
    ck_assert_msg(v != NULL, "stats have no persist.last_error");
    char *copy = strdup(v);
    json_decref(st);
    return copy;
}

/* Failures of one op, summed over every kind. */
static long long pfail_op(const kvh_daemon *d, const char *op)
{
    char path[128];
    snprintf(path, sizeof path, "persist.failures_total.%s", op);
    json_t *st = stats(d);
    json_t *kinds = kvh_json_get(st, path);
    ck_assert_msg(json_is_object(kinds), "stats have no %s", path);
    long long sum = 0;
    const char *k;
    json_t *v;
    json_object_foreach(kinds, k, v) {
        ck_assert_msg(json_is_integer(v), "%s.%s is not an integer", path, k);
        sum += json_integer_value(v);
    }
    json_decref(st);
    return sum;
}

/* Poll until the stat at path is >= want; returns the value. */
static long long wait_ge(const kvh_daemon *d, const char *path, long long want, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        long long v = stat_int(d, path);
        if (v >= want)
            return v;
        ck_assert_msg(kvh_now_ms() < deadline, "%s = %lld, still below %lld after %d ms", path, v,
                      want, timeout_ms);
        kvh_sleep_ms(20);
    }
}

static void wait_eq(const kvh_daemon *d, const char *path, long long want, int timeout_ms)
{
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(d, path, want, timeout_ms, &last) == 0,
                  "%s = %lld, not %lld after %d ms", path, last, want, timeout_ms);
}

/* Poll until the op's failures (all kinds) are >= want. */
static long long wait_fail_ge(const kvh_daemon *d, const char *op, long long want, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        long long v = pfail_op(d, op);
        if (v >= want)
            return v;
        ck_assert_msg(kvh_now_ms() < deadline, "%s failures = %lld, still below %lld after %d ms",
                      op, v, want, timeout_ms);
        kvh_sleep_ms(20);
    }
}

/* Poll until persist.state is `want`; returns the milliseconds it took. */
static uint64_t wait_state(const kvh_daemon *d, const char *want, int timeout_ms)
{
    uint64_t t0 = kvh_now_ms(), deadline = t0 + (uint64_t)timeout_ms;
    for (;;) {
        const char *s = pstate(d);
        if (strcmp(s, want) == 0)
            return kvh_now_ms() - t0;
        ck_assert_msg(kvh_now_ms() < deadline, "persist.state is \"%s\", not \"%s\" after %d ms",
                      s, want, timeout_ms);
        kvh_sleep_ms(50);
    }
}

/* Every accepted store request came back. */
static void wait_idle(const kvh_daemon *d, int timeout_ms)
{
    wait_eq(d, "persist.queue_depth", 0, timeout_ms);
}

static long long capacity_blocks(const kvh_daemon *d)
{
    long long cap = stat_int(d, "tiers.host.capacity_bytes") / BB;
    ck_assert_msg(cap >= 48 && cap <= 64, "host tier of %lld blocks for host_bytes=4MiB", cap);
    return cap;
}

/* Put filler chains of 4 (seed 99, chain ids from *next) until `want`
 * blocks left memory for the store (evictions.host.to_store_total), letting
 * the store catch up after each chain; at most max_blocks fillers. */
static void fill_until_ghosts(const kvh_daemon *d, kvnode_client *c, long long want,
                              long long max_blocks, uint64_t *next)
{
    kvnode_key k[4];
    long long put = 0;
    long long ghosts;
    while ((ghosts = stat_int(d, "evictions.host.to_store_total")) < want) {
        ck_assert_msg(put < max_blocks, "%lld filler blocks put, only %lld of %lld evicted to "
                      "the store", put, ghosts, want);
        kvh_chain(k, 4, (*next)++);
        KVH_PUT_OK(c, k, 4, 99);
        put += 4;
        wait_idle(d, 10000);
    }
}

/* Put `blocks` filler blocks in chains of 4, letting the store catch up. */
static void fill(const kvh_daemon *d, kvnode_client *c, long long blocks, uint64_t *next)
{
    kvnode_key k[4];
    for (long long done = 0; done < blocks; done += 4) {
        kvh_chain(k, 4, (*next)++);
        KVH_PUT_OK(c, k, 4, 99);
        wait_idle(d, 10000);
    }
}

static char *admin_addr(const kvh_daemon *d)
{
    json_t *st = stats(d);
    const char *a = json_string_value(json_object_get(st, "admin"));
    ck_assert_msg(a != NULL && strncmp(a, "127.0.0.1:", 10) == 0, "no bound admin address");
    char *copy = strdup(a);
    json_decref(st);
    return copy;
}

/* A counter of the simulator's GET /_sim/state (e.g. "acquire_create_calls"). */
static long long sim_count(const struct simctl *s, const char *field)
{
    char *body = NULL;
    long code = kvh_http_req(s->http, NULL, "/_sim/state", &body, NULL, 0);
    ck_assert_msg(code == 200, "GET /_sim/state: HTTP %ld", code);
    json_t *doc = json_loads(body, 0, NULL);
    json_t *v = json_object_get(doc, field);
    ck_assert_msg(json_is_integer(v), "/_sim/state has no %s: %s", field, body);
    long long n = (long long)json_integer_value(v);
    json_decref(doc);
    free(body);
    return n;
}

/* ---- write_through / write_back round trips ---------------------------------- */

/* A chain of 8 is written, evicted to the store (ghosts: matched in the store
 * tier, not in memory), then read back byte-exact through promotions. */
static void round_trip(const char *policy)
{
    struct simctl s;
    kvh_daemon d;
    char conf[1024], extra[128];
    bool wb = strcmp(policy, "write_back") == 0;

    sim_start(&s, NULL);
    snprintf(extra, sizeof extra, "persist.policy=%s\n", policy);
    v6d_conf(conf, sizeof conf, &s, extra);
    KVH_START(&d, conf);
    ck_assert_str_eq(pstate(&d), "ok");
    long long cap = capacity_blocks(&d);

    kvnode_layout lay = kvh_layout(wb ? "v6d-wb" : "v6d-wt", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvnode_key a[8];
    kvh_chain(a, 8, 1000);
    KVH_PUT_OK(c, a, 8, 7);
    kvnode_tiers t = KVH_TIERS(c, a, 8);
    ck_assert_uint_eq(t.host, 8);
    ck_assert_uint_eq(t.store, 0);
    if (wb) {
        /* Nothing is written on commit under write_back. */
        kvh_sleep_ms(200);
        wait_idle(&d, 5000);
        ck_assert_int_eq(stat_int(&d, "persist.written_blocks_total"), 0);
    } else {
        wait_eq(&d, "persist.written_blocks_total", 8, 5000);
    }

    /* The oldest blocks leave memory first: the chain becomes ghosts. */
    uint64_t next = 2000;
    fill_until_ghosts(&d, c, 8, 2 * cap, &next);
    ck_assert_int_eq(stat_int(&d, "evictions.host.dropped_total"), 0);
    ck_assert_int_ge(stat_int(&d, "tiers.store.blocks"), 8);
    if (wb)
        ck_assert_int_ge(stat_int(&d, "evictions.host.writeback_total"), 8);
    ck_assert_int_ge(stat_int(&d, "persist.written_blocks_total"), 8);
    t = KVH_TIERS(c, a, 8);
    ck_assert_msg(t.matched == 8 && t.store == 8 && t.host == 0,
                  "after eviction: matched %zu, host %zu, store %zu", t.matched, t.host, t.store);

    /* GET promotes them back, byte-exact. */
    long long reads0 = stat_int(&d, "persist.read_blocks_total");
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 7), 8);
    ck_assert_int_eq(stat_int(&d, "persist.read_blocks_total") - reads0, 8);
    ck_assert_int_ge(stat_int(&d, "persist.promotions_ok_total"), 8);
    t = KVH_TIERS(c, a, 8);
    ck_assert_msg(t.matched == 8 && t.host == 8 && t.store == 0,
                  "after the get: matched %zu, host %zu, store %zu", t.matched, t.host, t.store);
    /* Read again from memory: still the same bytes. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 7), 8);
    ck_assert_int_eq(pfail_op(&d, "write"), 0);
    ck_assert_int_eq(pfail_op(&d, "read"), 0);
    ck_assert_str_eq(pstate(&d), "ok");

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    simctl_stop_ok(&s);
}

START_TEST(test_write_through_round_trip)
{
    round_trip("write_through");
}
END_TEST

START_TEST(test_write_back_round_trip)
{
    round_trip("write_back");
}
END_TEST

/* ---- a burst of write-through puts -------------------------------------------------- */

/* Writes in flight pin their blocks until they land (a committed block is
 * not evicted before its write): a burst is written without any eviction,
 * and a restart finds every block. */
START_TEST(test_write_through_burst_all_written)
{
    static const char *const slowish[] = { "--delay-ms", "300", "--delay-only", "/acquire", NULL };
    struct simctl s;
    kvh_daemon d1, d2;
    char conf[1024];
    enum { CHAINS = 5, PER = 8 };

    sim_start(&s, slowish);
    v6d_conf(conf, sizeof conf, &s, "persist.policy=write_through\npersist.workers=8\n");
    KVH_START(&d1, conf);
    kvnode_layout lay = kvh_layout("v6d-burst", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d1, &lay, &c);
    kvnode_key k[CHAINS][PER];
    for (int i = 0; i < CHAINS; i++) {
        kvh_chain(k[i], PER, 3500 + (uint64_t)i);
        KVH_PUT_OK(c, k[i], PER, 15);
    }
    /* 40 blocks committed within a few ms, each write takes 300 ms+: they
     * are pinned while they wait. */
    ck_assert_int_gt(stat_int(&d1, "persist.pinned_for_writes_bytes"), 0);
    ck_assert_int_lt(stat_int(&d1, "persist.written_blocks_total"), CHAINS * PER);
    wait_eq(&d1, "persist.written_blocks_total", CHAINS * PER, 10000);
    ck_assert_int_eq(stat_int(&d1, "evictions.host.to_store_total"), 0);
    ck_assert_int_eq(stat_int(&d1, "evictions.host.writeback_total"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d1);

    KVH_START(&d2, conf);
    KVH_CONNECT(&d2, &lay, &c);
    for (int i = 0; i < CHAINS; i++) {
        kvnode_tiers t = KVH_TIERS(c, k[i], PER);
        ck_assert_msg(t.matched == PER && t.store == PER, "chain %d after restart: matched %zu, "
                      "store %zu", i, t.matched, t.store);
    }
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, k[CHAINS - 1], PER, 15), PER);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d2);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- restart ------------------------------------------------------------------- */

START_TEST(test_restart_finds_blocks_through_lookup)
{
    struct simctl s;
    kvh_daemon d1, d2, d3;
    char wt[1024], wb[1024];

    sim_start(&s, NULL);
    v6d_conf(wt, sizeof wt, &s, "persist.policy=write_through\n");
    v6d_conf(wb, sizeof wb, &s, "persist.policy=write_back\n");

    /* d1 (write_through) writes a[0..8) and b on commit. */
    KVH_START(&d1, wt);
    kvnode_layout lay = kvh_layout("v6d-restart", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d1, &lay, &c);
    kvnode_key a[10], b[4], e[4], never[3];
    kvh_chain(a, 10, 3000);   /* a[8], a[9]: never put */
    kvh_chain(b, 4, 3001);
    kvh_chain(e, 4, 3002);
    kvh_chain(never, 3, 3003);
    KVH_PUT_OK(c, a, 8, 11);
    KVH_PUT_OK(c, b, 4, 12);
    wait_eq(&d1, "persist.written_blocks_total", 12, 5000);
    /* A chain longer than the host tier and than one store lookup (128 keys),
     * written in pieces while the oldest leave memory. */
    static kvnode_key longc[LONG_CHAIN];
    kvh_chain(longc, LONG_CHAIN, 3004);
    for (size_t i = 0; i < LONG_CHAIN; i += 10) {
        KVH_PUT_OK(c, longc + i, 10, 14);
        wait_idle(&d1, 10000);
    }
    wait_eq(&d1, "persist.written_blocks_total", 12 + LONG_CHAIN, 5000);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d1);

    /* d2 (write_back), same store: its index starts empty. */
    KVH_START(&d2, wb);
    ck_assert_int_eq(stat_int(&d2, "tiers.store.blocks"), 0);
    ck_assert_int_eq(stat_int(&d2, "tiers.host.blocks"), 0);
    KVH_CONNECT(&d2, &lay, &c);
    /* MATCH asks the store about the keys it does not know. */
    kvnode_tiers t = KVH_TIERS(c, a, 10);
    ck_assert_msg(t.matched == 8 && t.store == 8 && t.host == 0,
                  "after restart: matched %zu, host %zu, store %zu", t.matched, t.host, t.store);
    ck_assert_int_ge(stat_int(&d2, "persist.lookups_total"), 1);
    ck_assert_int_eq(stat_int(&d2, "persist.lookup_found_total"), 8);
    ck_assert_int_eq(stat_int(&d2, "tiers.store.blocks"), 8);
    /* Keys nobody put: looked up, not found. */
    ck_assert_int_eq(kvh_match(c, never, 3), 0);
    ck_assert_int_eq(stat_int(&d2, "persist.lookup_found_total"), 8);
    /* The long chain: one lookup of 200 keys (the store is asked in chunks). */
    t = KVH_TIERS(c, longc, LONG_CHAIN);
    ck_assert_msg(t.matched == LONG_CHAIN && t.store == LONG_CHAIN,
                  "long chain after restart: matched %zu, store %zu", t.matched, t.store);
    ck_assert_int_eq(stat_int(&d2, "persist.lookup_found_total"), 8 + LONG_CHAIN);
    /* Its tail, read back (promotions), byte-exact. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, longc + LONG_CHAIN - 16, 16, 14), 16);
    /* GET of the ghosts the lookup indexed: promoted, byte-exact. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 10, 11), 8);
    ck_assert_int_eq(stat_int(&d2, "persist.read_blocks_total"), 16 + 8);
    t = KVH_TIERS(c, a, 8);
    ck_assert_uint_eq(t.host, 8);
    /* e is only in d2's memory (write_back): written by the flush at exit. */
    KVH_PUT_OK(c, e, 4, 13);
    kvh_sleep_ms(100);
    ck_assert_int_eq(stat_int(&d2, "persist.written_blocks_total"), 0);
    ck_assert_int_eq(pfail_op(&d2, "read"), 0);
    ck_assert_int_eq(pfail_op(&d2, "exists"), 0);
    kvnode_close(c);
    KVH_STOP_OK(&d2);
    char *log = kvh_read_log(&d2);
    ck_assert_msg(log && strstr(log, "shutdown: writing 4 committed blocks the store lacks") &&
                  strstr(log, "shutdown: every committed block is in the store (4 writes in 1 rounds)"),
                  "d2 did not write its 4 unwritten blocks at exit:\n%s", log ? log : "");
    free(log);
    kvh_destroy(&d2);

    /* d3: b and e, which no MATCH asked about: GET looks them up itself. */
    KVH_START(&d3, wt);
    KVH_CONNECT(&d3, &lay, &c);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, b, 4, 12), 4);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, e, 4, 13), 4);
    ck_assert_int_eq(stat_int(&d3, "persist.lookup_found_total"), 8);
    ck_assert_int_eq(stat_int(&d3, "persist.read_blocks_total"), 8);
    t = KVH_TIERS(c, e, 4);
    ck_assert_uint_eq(t.host, 4);
    t = KVH_TIERS(c, a, 10);
    ck_assert_msg(t.matched == 8 && t.store == 8, "d3: a matched %zu, store %zu", t.matched,
                  t.store);
    ck_assert_int_eq(pfail_op(&d3, "read"), 0);
    ck_assert_int_eq(pfail_op(&d3, "exists"), 0);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d3);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- the store is down at start ---------------------------------------------------- */

START_TEST(test_store_down_at_start)
{
    struct simctl s;
    kvh_daemon d;
    char conf[1024];

    /* Where the simulator will be: a socket path in a fresh directory, a free port. */
    memset(&s, 0, sizeof s);
    simctl_mkdtemp(s.dir, sizeof s.dir, "kvnode-v6d");
    snprintf(s.sock, sizeof s.sock, "%s/kvs.sock", s.dir);
    snprintf(s.http, sizeof s.http, "127.0.0.1:%u", free_port());
    snprintf(s.base, sizeof s.base, "http://%s", s.http);
    v6d_conf(conf, sizeof conf, &s, "persist.policy=write_through\n");

    KVH_START(&d, conf);
    ck_assert_str_eq(pstate(&d), "degraded");
    char *err = plast_error(&d);
    ck_assert_msg(strlen(err) > 0, "degraded without a last_error");
    free(err);
    ck_assert_int_ge(pfail_op(&d, "health"), 1);

    /* Memory serves; the writes fail (the store cannot be reached). */
    kvnode_layout lay = kvh_layout("v6d-down", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvnode_key a[8], b[8];
    kvh_chain(a, 8, 4000);
    kvh_chain(b, 8, 4001);
    KVH_PUT_OK(c, a, 8, 21);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 21), 8);
    wait_fail_ge(&d, "write", 8, 10000);
    ck_assert_int_eq(stat_int(&d, "persist.failures_total.write.unavailable"), 8);
    ck_assert_int_eq(stat_int(&d, "persist.written_blocks_total"), 0);
    ck_assert_str_eq(pstate(&d), "degraded");
    /* Keys the index does not know: the lookup fails, the answer is 0. */
    ck_assert_int_eq(kvh_match(c, b, 8), 0);
    ck_assert_int_ge(stat_int(&d, "persist.failures_total.exists.unavailable"), 1);

    /* The store comes up where the daemon expects it: ok within a few seconds. */
    sim_restart(&s);
    uint64_t took = wait_state(&d, "ok", 8000);
    ck_assert_msg(took <= 5000, "ok only %llu ms after the store came up", (unsigned long long)took);
    err = plast_error(&d);
    ck_assert_str_eq(err, "");
    free(err);

    /* New puts are written, and the 8 failed writes of a are retried now that
     * a write succeeds: 16 in all (a batched write lands its 8 blocks at
     * once, so no poll can rely on seeing 8 before the retries land). */
    KVH_PUT_OK(c, b, 8, 22);
    wait_eq(&d, "persist.written_blocks_total", 16, 5000);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, b, 8, 22), 8);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 21), 8);
    ck_assert_str_eq(pstate(&d), "ok");

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- the store goes down mid-run and comes back ------------------------------------- */

START_TEST(test_store_down_and_back)
{
    struct simctl s;
    kvh_daemon d;
    char conf[1024];

    sim_start(&s, NULL);
    v6d_conf(conf, sizeof conf, &s, "persist.policy=write_through\nserver.request_timeout=3s\n");
    KVH_START(&d, conf);
    long long cap = capacity_blocks(&d);
    kvnode_layout lay = kvh_layout("v6d-flap", BB, 1, 0);
    kvnode_client *c, *obs;
    KVH_CONNECT(&d, &lay, &c);
    KVH_CONNECT(&d, NULL, &obs);
    kvnode_key a[8], b[8], e[8];
    kvh_chain(a, 8, 5000);
    kvh_chain(b, 8, 5001);
    kvh_chain(e, 8, 5002);
    /* a written, then evicted: ghosts. */
    KVH_PUT_OK(c, a, 8, 31);
    wait_eq(&d, "persist.written_blocks_total", 8, 5000);
    uint64_t next = 5100;
    fill_until_ghosts(&d, c, 8, 2 * cap, &next);
    ck_assert_str_eq(pstate(&d), "ok");
    long long written = stat_int(&d, "persist.written_blocks_total");
    long long dropped = stat_int(&d, "persist.dropped_total");
    kvnode_tiers t = KVH_TIERS(c, a, 8);
    ck_assert_uint_eq(t.store, 8);

    /* Down: the socket goes away, nothing listens on the port. */
    simctl_stop(&s, false, true);
    KVH_PUT_OK(c, b, 8, 32);
    wait_fail_ge(&d, "write", 8, 10000);
    ck_assert_int_eq(pfail_op(&d, "write"), 8);
    ck_assert_int_eq(stat_int(&d, "persist.written_blocks_total"), written);
    ck_assert_str_eq(pstate(&d), "degraded");
    char *err = plast_error(&d);
    /* (a health probe may have failed since: it names itself) */
    ck_assert_msg(strncmp(err, "write: ", 7) == 0 || strncmp(err, "health: ", 8) == 0,
                  "last_error \"%s\"", err);
    free(err);
    /* Memory keeps serving, byte-exact. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, b, 8, 32), 8);
    KVH_OK(obs, kvnode_ping(obs));
    /* The ghosts cannot be read: a get answers (at once: the store refuses
     * connections) with nothing, and they stay ghosts for when it is back. */
    uint64_t g0 = kvh_now_ms();
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 31), 0);
    ck_assert_msg(kvh_now_ms() - g0 < 2000, "a get of ghosts took %llu ms with the store down",
                  (unsigned long long)(kvh_now_ms() - g0));
    ck_assert_int_ge(stat_int(&d, "persist.promotions_failed_total"), 1);
    ck_assert_int_ge(stat_int(&d, "persist.failures_total.read.unavailable"), 1);
    t = KVH_TIERS(c, a, 8);
    ck_assert_msg(t.matched == 8 && t.store == 8, "a: matched %zu, store %zu", t.matched, t.store);

    /* Back (a fresh simulator: what it held is gone): ok again, writes succeed. */
    sim_restart(&s);
    wait_state(&d, "ok", 8000);
    /* Retries of b while the store was down may have failed again (more
     * than 8 on a slow machine, e.g. under valgrind); none fails from now. */
    long long failed_while_down = pfail_op(&d, "write");
    ck_assert_int_ge(failed_while_down, 8);
    KVH_PUT_OK(c, e, 8, 33);
    /* e's 8 and b's failed writes, retried once the store takes writes again
     * (those of b that left memory meanwhile are counted dropped instead). */
    wait_eq(&d, "persist.retry_pending", 0, 15000);
    wait_eq(&d, "persist.written_blocks_total",
            written + 8 + 8 - (stat_int(&d, "persist.dropped_total") - dropped), 5000);
    ck_assert_int_eq(pfail_op(&d, "write"), failed_while_down);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, e, 8, 33), 8);
    ck_assert_str_eq(pstate(&d), "ok");
    /* The store lost a: its promotion misses, the ghost is forgotten, and
     * neither MATCH (which asks the store again) nor GET finds it. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 31), 0);
    ck_assert_int_ge(stat_int(&d, "persist.read_misses_total"), 1);
    ck_assert_int_eq(kvh_match(c, a, 8), 0);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 31), 0);

    kvnode_close(obs);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- a slow store ---------------------------------------------------------------------- */


START_TEST(test_slow_store)
{
    static const char *const slow[] = { "--delay-ms", "1500", NULL };
    struct simctl s;
    kvh_daemon d;
    char conf[1024];

    sim_start(&s, slow);
    v6d_conf(conf, sizeof conf, &s,
             "persist.policy=write_back\npersist.workers=8\npersist.timeout=5s\n"
             "server.request_timeout=300ms\n"
             /* the write_back flush at exit would take 30 s at this pace */
             "server.shutdown_timeout=1s\n");
    KVH_START(&d, conf);
    long long cap = capacity_blocks(&d);
    kvnode_layout lay = kvh_layout("v6d-slow", BB, 1, 0);
    kvnode_client *c, *obs;
    KVH_CONNECT(&d, &lay, &c);
    KVH_CONNECT(&d, NULL, &obs);

    /* a, then fillers up to just over the high watermark (and under the
     * capacity, so no put has to drop anything): the evictor writes the
     * oldest blocks (a first) back, 4.5 s per write (3 delayed calls). */
    kvnode_key a[4], f[2], x[3], probe[5];
    kvh_chain(a, 4, 6000);
    kvh_chain(x, 3, 6999);
    KVH_PUT_OK(c, a, 4, 41);
    uint64_t next = 7000;
    for (long long n = 4; n < cap - 2; n += 2) {
        kvh_chain(f, 2, next++);
        KVH_PUT_OK(c, f, 2, 99);
    }
    ck_assert_int_ge(stat_int(&d, "evictions.host.writeback_total"), 4);

    /* While the writes crawl, the loop answers at once. */
    uint64_t t0 = kvh_now_ms();
    pings_fast(obs, 100, 10, 1500, "while the store is slow");
    ck_assert_int_eq(stat_int(&d, "persist.written_blocks_total"), 0);
    ck_assert_int_gt(stat_int(&d, "persist.queue_depth"), 0);
    wait_idle(&d, 15000);
    ck_assert_int_ge(stat_int(&d, "evictions.host.to_store_total"), 4);
    ck_assert_msg(kvh_now_ms() - t0 >= 1000, "written back faster than the store answers");
    kvnode_tiers t = KVH_TIERS(c, a, 4);
    ck_assert_msg(t.store == 4 && t.host == 0, "a: host %zu, store %zu", t.host, t.store);

    /* GET [last filler (in memory), a...]: the promotions take 3 s, the answer
     * comes after request_timeout with the ready prefix. */
    long long to0 = stat_int(&d, "persist.wait_timeouts_total");
    probe[0] = f[1];
    memcpy(probe + 1, a, sizeof a);
    static unsigned char buf[5][BB];
    void *dst[5] = { buf[0], buf[1], buf[2], buf[3], buf[4] };
    size_t got = 99;
    uint64_t g0 = kvh_now_ms();
    KVH_OK(c, kvnode_get(c, probe, 5, dst, &got));
    uint64_t took = kvh_now_ms() - g0;
    ck_assert_msg(got == 1, "the get returned %zu blocks after %llu ms, want the 1 in memory",
                  got, (unsigned long long)took);
    ck_assert_msg(kvh_verify(buf[0], BB, probe[0], 99) == 0, "%s", kvh_error());
    ck_assert_msg(took >= 250 && took < 1400, "the get answered after %llu ms (request_timeout "
                  "300 ms, promotions take 3 s)", (unsigned long long)took);
    ck_assert_int_gt(stat_int(&d, "persist.wait_timeouts_total"), to0);
    ck_assert_int_ge(stat_int(&d, "persist.promotions_total"), 4);

    /* A MATCH that needs a lookup answers after request_timeout too. */
    g0 = kvh_now_ms();
    ck_assert_int_eq(kvh_match(c, x, 3), 0);
    took = kvh_now_ms() - g0;
    ck_assert_msg(took >= 250 && took < 1400, "the match answered after %llu ms",
                  (unsigned long long)took);
    ck_assert_int_gt(stat_int(&d, "persist.wait_timeouts_total"), to0 + 1);

    /* A client that gives up while its MATCH waits (and goes away): the
     * daemon drops the answer when the lookup completes, and serves on. */
    kvnode_client *quitter;
    kvnode_key y[2];
    kvh_chain(y, 2, 6998);
    KVH_CONNECT(&d, &lay, &quitter);
    kvnode_set_timeout(quitter, 100);
    size_t m = 0;
    ck_assert_int_eq(kvnode_match(quitter, y, 2, &m), -KVNODE_ETIMEDOUT);
    kvnode_close(quitter);

    /* Still responsive while promotions and the lookup run. */
    pings_fast(obs, 50, 10, 1500, "during promotions");

    /* The promotions finish in the background: then a is in memory, intact. */
    wait_ge(&d, "persist.promotions_ok_total", 4, 15000);
    g0 = kvh_now_ms();
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 4, 41), 4);
    ck_assert_msg(kvh_now_ms() - g0 < 250, "a promoted chain was not served from memory");
    ck_assert_int_eq(pfail_op(&d, "write"), 0);
    ck_assert_int_eq(pfail_op(&d, "read"), 0);
    /* Every store request came back, the quitter's lookup too (to nobody). */
    wait_idle(&d, 10000);
    ck_assert_int_eq(stat_int(&d, "persist.lookups_total"), 2);
    KVH_OK(obs, kvnode_ping(obs));

    kvnode_close(obs);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- garbage replies -------------------------------------------------------------------- */

START_TEST(test_garbage_replies)
{
    static const char *const garbage[] = { "--garbage", NULL };
    struct simctl s;
    kvh_daemon d;
    char conf[1024];

    sim_start(&s, garbage);
    /* The stop tries the failed writes again until server.shutdown_timeout:
     * a short one, the store never takes them. */
    v6d_conf(conf, sizeof conf, &s, "persist.policy=write_through\nserver.shutdown_timeout=1s\n");
    KVH_START(&d, conf);
    long long cap = capacity_blocks(&d);
    kvnode_layout lay = kvh_layout("v6d-garbage", BB, 1, 0);
    kvnode_client *c, *obs;
    KVH_CONNECT(&d, &lay, &c);
    KVH_CONNECT(&d, NULL, &obs);
    kvnode_key a[8], n[4];
    kvh_chain(a, 8, 8000);
    kvh_chain(n, 4, 8001);

    uint64_t t0 = kvh_now_ms();
    KVH_PUT_OK(c, a, 8, 51);
    wait_ge(&d, "persist.failures_total.write.protocol", 8, 10000);
    ck_assert_int_eq(pfail_op(&d, "write"), 8);
    ck_assert_int_eq(stat_int(&d, "persist.written_blocks_total"), 0);
    /* Degraded: the probes are writes (the store answers them with garbage). */
    if (kvh_now_ms() - t0 < 1500) {
        ck_assert_str_eq(pstate(&d), "degraded");
        char *err = plast_error(&d);
        ck_assert_msg(strstr(err, "malformed") != NULL, "last_error \"%s\"", err);
        free(err);
    }
    /* Memory serves the right bytes. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 51), 8);
    KVH_OK(obs, kvnode_ping(obs));

    /* Evicted, a is gone (its writes failed): MATCH and GET ask the store,
     * get garbage, and find nothing — never wrong bytes. */
    uint64_t next = 9000;
    fill(&d, c, cap, &next);
    ck_assert_int_ge(stat_int(&d, "evictions.host.dropped_total"), 8);
    ck_assert_int_eq(stat_int(&d, "evictions.host.to_store_total"), 0);
    long long ex0 = pfail_op(&d, "exists");
    ck_assert_int_eq(kvh_match(c, a, 8), 0);
    ck_assert_int_gt(stat_int(&d, "persist.failures_total.exists.protocol"), 0);
    ck_assert_int_gt(pfail_op(&d, "exists"), ex0);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 51), 0);
    ck_assert_int_eq(stat_int(&d, "persist.lookup_found_total"), 0);
    ck_assert_int_eq(stat_int(&d, "persist.read_blocks_total"), 0);

    /* Still serving. */
    KVH_PUT_OK(c, n, 4, 52);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, n, 4, 52), 4);
    KVH_OK(obs, kvnode_ping(obs));

    kvnode_close(obs);
    kvnode_close(c);
    KVH_STOP_OK(&d);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, "committed blocks could not be written to the store"),
                  "the stop does not say what it could not write:\n%s", log ? log : "");
    free(log);
    kvh_destroy(&d);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- a stuck worker and /readyz ----------------------------------------------------------- */

/* /metrics has `kvnode_worker_up{worker="NAME"} V`. */
static bool metrics_worker_up(const char *addr, const char *name, int v)
{
    char *page, want[128];
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/metrics", &page, NULL, 0), 200);
    snprintf(want, sizeof want, "\nkvnode_worker_up{worker=\"%s\"} %d\n", name, v);
    bool found = strstr(page, want) != NULL;
    free(page);
    return found;
}

START_TEST(test_stuck_worker_not_ready)
{
    /* Only acquire is held: the put's one slow call, 5 s > the 2 s stall bound. */
    static const char *const stuck[] = { "--delay-ms", "5000", "--delay-only", "/acquire", NULL };
    struct simctl s;
    kvh_daemon d;
    char conf[1024], *body;

    sim_start(&s, stuck);
    v6d_conf(conf, sizeof conf, &s,
             "persist.policy=write_through\npersist.workers=1\npersist.timeout=30s\n"
             "admin.listen=127.0.0.1:0\nserver.worker_stall_timeout=2s\n");
    KVH_START(&d, conf);
    char *addr = admin_addr(&d);
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/readyz", NULL, NULL, 0), 200);
    ck_assert(metrics_worker_up(addr, "persist-0", 1));

    kvnode_layout lay = kvh_layout("v6d-stuck", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvnode_key a[1];
    kvh_chain(a, 1, 10000);
    uint64_t t0 = kvh_now_ms();
    KVH_PUT_OK(c, a, 1, 61);

    /* Not ready once the worker is silent for more than 2 s. */
    long code;
    for (;;) {
        code = kvh_http_req(addr, NULL, "/readyz", &body, NULL, 0);
        if (code != 200)
            break;
        free(body);
        ck_assert_msg(kvh_now_ms() - t0 < 4500, "/readyz still 200 %llu ms into a 5 s call",
                      (unsigned long long)(kvh_now_ms() - t0));
        kvh_sleep_ms(200);
    }
    uint64_t t503 = kvh_now_ms() - t0;
    ck_assert_int_eq(code, 503);
    ck_assert_msg(t503 >= 1500, "/readyz not ready after %llu ms, before the 2 s bound",
                  (unsigned long long)t503);
    ck_assert_msg(strstr(body, "persist-0") != NULL, "/readyz does not name the worker: %s", body);
    free(body);
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/healthz", &body, NULL, 0), 200);
    ck_assert_str_eq(body, "ok\n");
    free(body);
    ck_assert_msg(metrics_worker_up(addr, "persist-0", 0), "kvnode_worker_up{worker=\"persist-0\"} "
                  "is not 0 while the worker is stuck");
    /* The daemon itself serves meanwhile. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 1, 61), 1);
    ck_assert_int_eq(stat_int(&d, "persist.written_blocks_total"), 0);

    /* The call returns (5 s): ready again, the block written. */
    for (;;) {
        code = kvh_http_req(addr, NULL, "/readyz", NULL, NULL, 0);
        if (code == 200)
            break;
        ck_assert_msg(kvh_now_ms() - t0 < 12000, "/readyz still %ld %llu ms after the put", code,
                      (unsigned long long)(kvh_now_ms() - t0));
        kvh_sleep_ms(200);
    }
    uint64_t t200 = kvh_now_ms() - t0;
    ck_assert_msg(t200 >= 4500, "ready again after %llu ms, before the call returned",
                  (unsigned long long)t200);
    wait_eq(&d, "persist.written_blocks_total", 1, 5000);
    ck_assert(metrics_worker_up(addr, "persist-0", 1));
    ck_assert_str_eq(pstate(&d), "ok");

    free(addr);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- DELETE (issue 13, defect 7) ------------------------------------------------------- */

/* The store cannot delete a sealed object (the protocol's discard is for
 * unsealed ones only), so the daemon keeps a tombstone: DELETE must hold
 * against the lookup-on-miss, for keys it had in memory and for keys that
 * were only in the store; a re-put makes a key visible again. */
START_TEST(test_delete_not_resurrected)
{
    struct simctl s;
    kvh_daemon d1, d2;
    char conf[1024];
    size_t deleted = 99;

    sim_start(&s, NULL);
    v6d_conf(conf, sizeof conf, &s, "persist.policy=write_through\n");
    KVH_START(&d1, conf);
    kvnode_layout lay = kvh_layout("v6d-delete", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d1, &lay, &c);
    kvnode_key a[4], b[4];
    kvh_chain(a, 4, 5000);
    kvh_chain(b, 4, 5001);
    KVH_PUT_OK(c, a, 4, 21);
    KVH_PUT_OK(c, b, 4, 23);
    wait_eq(&d1, "persist.written_blocks_total", 8, 5000);

    /* In memory and in the store: DELETE reports 4, and nothing comes back. */
    KVH_OK(c, kvnode_delete(c, a, 4, &deleted));
    ck_assert_uint_eq(deleted, 4);
    wait_idle(&d1, 5000);
    kvnode_tiers t = KVH_TIERS(c, a, 4);
    ck_assert_msg(t.matched == 0, "MATCH after DELETE of 4 found %zu (store tier %zu)",
                  t.matched, t.store);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 4, 21), 0);
    ck_assert_int_eq(stat_int(&d1, "persist.tombstones"), 4);
    /* A re-put makes them visible again (served from memory, new bytes). */
    KVH_PUT_OK(c, a, 4, 22);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 4, 22), 4);
    wait_idle(&d1, 5000);
    ck_assert_int_eq(stat_int(&d1, "persist.tombstones"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d1);

    /* A new daemon on the same store: b is only in the store. DELETE finds
     * nothing in memory (0) but must still hide b from the lookups. */
    KVH_START(&d2, conf);
    KVH_CONNECT(&d2, &lay, &c);
    KVH_OK(c, kvnode_delete(c, b, 4, &deleted));
    ck_assert_uint_eq(deleted, 0);
    wait_idle(&d2, 5000);
    t = KVH_TIERS(c, b, 4);
    ck_assert_msg(t.matched == 0, "MATCH of store-only keys after DELETE found %zu", t.matched);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, b, 4, 23), 0);
    ck_assert_int_eq(stat_int(&d2, "persist.lookup_found_total"), 0);
    /* a, deleted and re-put by d1, is in the store and found. */
    ck_assert_uint_eq(KVH_TIERS(c, a, 4).matched, 4);
    ck_assert_int_eq(pfail_op(&d2, "delete"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d2);
    simctl_stop_ok(&s);
}
END_TEST

/* The tombstones are bounded (persist.tombstones): the oldest are forgotten
 * first, counted, and their keys are found in the store again. */
START_TEST(test_tombstone_bound)
{
    struct simctl s;
    kvh_daemon d;
    char conf[1024];
    size_t deleted = 0;

    sim_start(&s, NULL);
    v6d_conf(conf, sizeof conf, &s, "persist.policy=write_through\npersist.tombstones=2\n");
    KVH_START(&d, conf);
    kvnode_layout lay = kvh_layout("v6d-tombs", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvnode_key a[4];
    kvh_chain(a, 4, 5100);
    KVH_PUT_OK(c, a, 4, 24);
    wait_eq(&d, "persist.written_blocks_total", 4, 5000);
    KVH_OK(c, kvnode_delete(c, a, 4, &deleted));
    ck_assert_uint_eq(deleted, 4);
    wait_idle(&d, 5000);
    ck_assert_int_eq(stat_int(&d, "persist.tombstones"), 2);
    ck_assert_int_eq(stat_int(&d, "persist.tombstones_dropped_total"), 2);
    /* a[0], a[1] were forgotten: found in the store again; a[2] is hidden */
    kvnode_tiers t = KVH_TIERS(c, a, 4);
    ck_assert_msg(t.matched == 2 && t.store == 2, "matched %zu (store %zu), want 2", t.matched,
                  t.store);
    ck_assert_int_ge(stat_int(&d, "persist.tombstone_hits_total"), 1);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 4, 24), 2);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- batching (issue 13, defect 9) ------------------------------------------------------ */

/* One worker, a store that holds every acquire 200 ms: while the first
 * write waits, the other 31 queue up and must go under one create lease
 * (acquire, seal, release), not three calls each; the reads of a GET of 32
 * store-only blocks likewise under one read lease. */
START_TEST(test_writes_and_reads_batched)
{
    static const char *const slow_acquire[] = { "--delay-ms", "200", "--delay-only", "/acquire",
                                                NULL };
    struct simctl s;
    kvh_daemon d1, d2;
    char conf[1024];

    sim_start(&s, slow_acquire);
    v6d_conf(conf, sizeof conf, &s,
             "persist.policy=write_through\npersist.workers=1\nserver.request_timeout=30s\n");
    KVH_START(&d1, conf);
    kvnode_layout lay = kvh_layout("v6d-batch", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d1, &lay, &c);
    kvnode_key a[32];
    kvh_chain(a, 32, 6000);
    KVH_PUT_OK(c, a, 16, 31);          /* a client may reserve 1 MiB = 16 blocks at once */
    KVH_PUT_OK(c, a + 16, 16, 31);
    wait_eq(&d1, "persist.written_blocks_total", 32, 20000);
    long long creates = sim_count(&s, "acquire_create_calls");
    long long seals = sim_count(&s, "seal_calls"), releases = sim_count(&s, "release_calls");
    ck_assert_msg(creates >= 1 && creates <= 4, "32 queued writes took %lld create acquires "
                  "(%lld seals, %lld releases)", creates, seals, releases);
    ck_assert_int_eq(seals, creates);
    ck_assert_int_eq(releases, creates);
    ck_assert_int_eq(sim_count(&s, "discard_calls"), 0);
    ck_assert_int_eq(pfail_op(&d1, "write"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d1);

    /* A new daemon: GET of the 32 looks them up (one exists call) and
     * promotes them; the reads queue behind the first and share a lease. */
    KVH_START(&d2, conf);
    KVH_CONNECT(&d2, &lay, &c);
    long long reads0 = sim_count(&s, "acquire_read_calls");
    long long rel0 = sim_count(&s, "release_calls");
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 32, 31), 32);
    ck_assert_int_eq(stat_int(&d2, "persist.read_blocks_total"), 32);
    long long reads = sim_count(&s, "acquire_read_calls") - reads0;
    ck_assert_msg(reads >= 2 && reads <= 5, "GET of 32 store-only blocks took %lld read acquires "
                  "(1 lookup + reads)", reads);
    wait_idle(&d2, 5000);
    ck_assert_int_eq(sim_count(&s, "release_calls") - rel0, reads);
    ck_assert_int_eq(sim_count(&s, "leases"), 0);
    ck_assert_int_eq(pfail_op(&d2, "read"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d2);
    simctl_stop_ok(&s);
}
END_TEST

/* Blocks in (simulated) HBM are copied to host memory by the worker, all of
 * a batch back to back, and written under one lease: the bytes that come
 * back from the store are the engine's. */
START_TEST(test_hbm_writes_batched)
{
    static const char *const slow_acquire[] = { "--delay-ms", "200", "--delay-only", "/acquire",
                                                NULL };
    struct simctl s;
    kvh_daemon d1, d2;
    char conf[1024];

    sim_start(&s, slow_acquire);
    v6d_conf(conf, sizeof conf, &s,
             "persist.policy=write_through\npersist.workers=1\nserver.request_timeout=30s\n"
             "hbm.backend=sim\nhbm.bytes=2MiB\n");
    KVH_START(&d1, conf);
    kvnode_layout lay = kvh_layout("v6d-hbm", BB, 1, 0);
    kvnode_client *c = NULL;
    int rc = kvnode_connect_device(d1.sock, &lay, 0, &c);
    ck_assert_msg(rc == 0 && c, "kvnode_connect_device: %d %s", rc, kvnode_connect_error());
    kvnode_key a[12];
    kvh_chain(a, 12, 6100);
    for (size_t part = 0; part < 12; part += 4) {   /* 4 blocks = 256 KiB per put */
        kvnode_loc locs[4];
        kvnode_lease lease = 0;
        KVH_OK(c, kvnode_put_begin(c, a + part, 4, KVNODE_TIER_HBM, &lease, locs));
        for (size_t i = 0; i < 4; i++) {
            ck_assert_msg(locs[i].ptr && locs[i].tier == KVNODE_TIER_HBM,
                          "key #%zu: tier %d, not HBM", part + i, locs[i].tier);
            kvh_fill(locs[i].ptr, BB, a[part + i], 41);
        }
        KVH_OK(c, kvnode_put_commit(c, lease));
    }
    wait_eq(&d1, "persist.written_blocks_total", 12, 20000);
    long long creates = sim_count(&s, "acquire_create_calls");
    ck_assert_msg(creates >= 1 && creates <= 4, "12 HBM writes took %lld create acquires", creates);
    ck_assert_int_eq(pfail_op(&d1, "write"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d1);

    /* From the store, in a new daemon: the same bytes. */
    KVH_START(&d2, conf);
    KVH_CONNECT(&d2, &lay, &c);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 12, 41), 12);
    ck_assert_int_eq(stat_int(&d2, "persist.read_blocks_total"), 12);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d2);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- tenants (issue 15) ------------------------------------------------------------------ */

#define T_ALPHA 65534
#define T_BETA  65533
#define T_KEYS  16
#define T_CHAIN 7100u

/* What a tenant's client does, in a child running as that tenant's user. */
enum t_op { T_PUT, T_READ, T_DELETE, T_MISS };

struct t_job {
    const kvh_daemon *d;
    const char *extra;        /* the layout's extra (NULL: none) */
    enum t_op op;
    uint64_t seed;
};

/* Exit codes of a tenant's child. */
enum { T_OK = 0, T_CONNECT = 10, T_FAILED, T_COUNT, T_BYTES };

static int t_job_main(void *arg)
{
    const struct t_job *j = arg;
    kvnode_layout l = kvh_layout("v6d-tenants", BB, 1, 0);
    kvnode_key keys[T_KEYS];
    kvnode_tiers t;
    kvnode_client *c;
    size_t got = 0, deleted = 99;
    int rc = T_OK;

    l.extra = j->extra;
    kvh_chain(keys, T_KEYS, T_CHAIN);
    if (kvnode_connect(j->d->sock, &l, &c) != 0) {
        fprintf(stderr, "uid %d: connect: %s\n", (int)getuid(), kvnode_connect_error());
        return T_CONNECT;
    }
    switch (j->op) {
    case T_PUT:
        rc = kvh_put(c, keys, T_KEYS, j->seed) == 0 ? T_OK : T_FAILED;
        break;
    case T_READ:   /* every key found (memory or a lookup in the store), its bytes this tenant's */
        if (kvnode_match_tiers(c, keys, T_KEYS, &t) != 0 || t.matched != T_KEYS) {
            fprintf(stderr, "uid %d: matched %zu of %u\n", (int)getuid(), t.matched, T_KEYS);
            rc = T_COUNT;
        } else if (kvh_get_verify(c, keys, T_KEYS, j->seed, 0, &got) != 0 || got != T_KEYS) {
            fprintf(stderr, "uid %d: got %zu of %u: %s\n", (int)getuid(), got, T_KEYS, kvh_error());
            rc = T_BYTES;
        }
        break;
    case T_DELETE:
        if (kvnode_delete(c, keys, T_KEYS, &deleted) != 0 || deleted != T_KEYS) {
            fprintf(stderr, "uid %d: deleted %zu of %u\n", (int)getuid(), deleted, T_KEYS);
            rc = T_COUNT;
        }
        break;
    case T_MISS:   /* nothing found, not even in the store */
        if (kvnode_match_tiers(c, keys, T_KEYS, &t) != 0 || t.matched != 0 ||
            kvh_get_verify(c, keys, T_KEYS, j->seed, 0, &got) != 0 || got != 0) {
            fprintf(stderr, "uid %d: matched %zu, got %zu of deleted keys\n", (int)getuid(), t.matched, got);
            rc = T_COUNT;
        }
        break;
    }
    kvnode_close(c);
    return rc;
}

/* j as user uid (its own gid); the child's exit code. */
static int t_run(uid_t uid, const struct t_job *j)
{
    int st = tenants_status_as(t_job_main, (void *)j, uid, 30000);
    ck_assert_msg(st >= 0 && WIFEXITED(st), "child uid %d: status %d", (int)uid, st);
    return WEXITSTATUS(st);
}

/* The store's sealed objects by their object namespace, the first part of
 * <ns>/v1/<deployment>/tp-0/group-0/block-<key>: at most 4 namespaces,
 * each with how many objects, the sum of their block keys and the
 * deployment part of its first object (*mixed set when they differ). */
struct t_spaces {
    size_t n;
    char ns[4][160], dep[4][256];
    long long objects[4];
    unsigned long long key_sum[4];   /* wrapping: the keys are any int64 */
    bool mixed[4];
};

static struct t_spaces sim_spaces(const struct simctl *s)
{
    struct t_spaces sp = { 0 };
    char *body = NULL;
    ck_assert_int_eq(kvh_http_req(s->http, NULL, "/_sim/objects", &body, NULL, 0), 200);
    json_t *doc = json_loads(body, 0, NULL), *o;
    size_t i;
    ck_assert_msg(json_is_array(json_object_get(doc, "objects")), "/_sim/objects: %s", body);
    json_array_foreach(json_object_get(doc, "objects"), i, o) {
        const char *key = json_string_value(json_object_get(o, "key"));
        char ns[160], dep[256], rank[32], grp[32];
        long long blk;
        ck_assert_msg(key && sscanf(key, "%159[^/]/v1/%255[^/]/%31[^/]/%31[^/]/block-%lld", ns, dep, rank, grp,
                                    &blk) == 5, "object key %s", key ? key : "(none)");
        if (!json_is_true(json_object_get(o, "sealed")))
            continue;
        size_t k = 0;
        while (k < sp.n && strcmp(sp.ns[k], ns) != 0)
            k++;
        if (k == sp.n) {
            ck_assert_msg(sp.n < 4, "more than 4 object namespaces in the store");
            snprintf(sp.ns[k], sizeof sp.ns[k], "%s", ns);
            snprintf(sp.dep[k], sizeof sp.dep[k], "%s", dep);
            sp.n++;
        }
        sp.mixed[k] |= strcmp(sp.dep[k], dep) != 0;
        sp.objects[k]++;
        sp.key_sum[k] += (unsigned long long)blk;
    }
    json_decref(doc);
    free(body);
    return sp;
}

/* The index of namespace ns in sp (asserted present). */
static size_t space_of(const struct t_spaces *sp, const char *ns)
{
    for (size_t k = 0; k < sp->n; k++)
        if (strcmp(sp->ns[k], ns) == 0)
            return k;
    ck_abort_msg("no object in the store under %s/ (%zu namespaces, the first %s)", ns, sp->n,
                 sp->n ? sp->ns[0] : "-");
    return 0;
}

/* Two tenants, the same layout (extra: the layout's extra, e.g. an engine's
 * own kvs_deployment_id), the same keys, other bytes, one v6d store. */
static void tenants_share_a_store(const char *extra)
{
    TENANTS_NEEDS_ROOT("v6d tenants: the shared store test");
    struct simctl s;
    kvh_daemon d;
    char conf[1024];
    struct t_job put_a = { &d, extra, T_PUT, 71 }, put_b = { &d, extra, T_PUT, 72 };
    struct t_job read_a = { &d, extra, T_READ, 71 }, read_b = { &d, extra, T_READ, 72 };
    struct t_job del_b = { &d, extra, T_DELETE, 72 }, miss_b = { &d, extra, T_MISS, 72 };

    sim_start(&s, NULL);
    int w = snprintf(conf, sizeof conf,
                     "server.socket_mode=0666\nmemory.host_bytes=12MiB\nmemory.slab_bytes=1MiB\n"
                     "tenant.alpha.uids=%d\ntenant.alpha.host_bytes=4MiB\n"
                     "tenant.beta.uids=%d\ntenant.beta.host_bytes=4MiB\n"
                     "persist.backend=v6d\npersist.url=%s\npersist.socket_path=%s\n"
                     "persist.connect_timeout=500ms\npersist.policy=write_through\n",
                     T_ALPHA, T_BETA, s.base, s.sock);
    ck_assert(w > 0 && (size_t)w < sizeof conf);

    tenants_start(&d, conf);
    ck_assert_int_eq(t_run(T_ALPHA, &put_a), T_OK);
    ck_assert_int_eq(t_run(T_BETA, &put_b), T_OK);
    wait_eq(&d, "persist.written_blocks_total", 2 * T_KEYS, 10000);
    ck_assert_int_eq(pfail_op(&d, "write"), 0);
    KVH_STOP_DESTROY(&d);

    /* Cold: memory empty; each tenant's lookups find its own objects. beta
     * reads its keys back, then deletes them (tombstones: the store keeps
     * sealed objects); alpha's, only in the store, are still found and
     * byte-exact, beta's are hidden. */
    tenants_start(&d, conf);
    ck_assert_int_eq(stat_int(&d, "tiers.store.blocks"), 0);
    ck_assert_int_eq(t_run(T_BETA, &read_b), T_OK);
    ck_assert_int_eq(t_run(T_BETA, &del_b), T_OK);
    wait_idle(&d, 5000);
    ck_assert_int_eq(stat_int(&d, "persist.tombstones"), T_KEYS);
    ck_assert_int_eq(t_run(T_ALPHA, &read_a), T_OK);
    ck_assert_int_eq(t_run(T_BETA, &miss_b), T_OK);
    ck_assert_int_eq(stat_int(&d, "persist.lookup_found_total"), 2 * T_KEYS);
    ck_assert_int_eq(stat_int(&d, "persist.read_blocks_total"), 2 * T_KEYS);
    ck_assert_int_eq(pfail_op(&d, "delete"), 0);

    /* In the store: each tenant's objects under an object namespace of its
     * own, the same deployment and the same 16 keys in each. */
    struct t_spaces sp = sim_spaces(&s);
    ck_assert_msg(sp.n == 2, "%zu object namespaces in the store (the first %s, deployment %s, %lld objects), "
                  "not one per tenant", sp.n, sp.n ? sp.ns[0] : "-", sp.n ? sp.dep[0] : "-",
                  sp.n ? sp.objects[0] : 0);
    size_t a = space_of(&sp, "rtp_llm.tenant-alpha"), b = space_of(&sp, "rtp_llm.tenant-beta");
    ck_assert_int_eq(sp.objects[a], T_KEYS);
    ck_assert_int_eq(sp.objects[b], T_KEYS);
    ck_assert_uint_eq(sp.key_sum[a], sp.key_sum[b]);
    ck_assert(!sp.mixed[a] && !sp.mixed[b]);
    ck_assert_str_eq(sp.dep[a], sp.dep[b]);
    if (extra)
        ck_assert_str_eq(sp.dep[a], extra + strlen("kvs_deployment_id="));
    else
        ck_assert_msg(strncmp(sp.dep[a], "v6d-tenants-", 12) == 0, "deployment %s", sp.dep[a]);
    KVH_STOP_DESTROY(&d);

    /* A new daemon: alpha's objects are still in the store, byte-exact. */
    tenants_start(&d, conf);
    ck_assert_int_eq(t_run(T_ALPHA, &read_a), T_OK);
    ck_assert_int_eq(stat_int(&d, "persist.lookup_found_total"), T_KEYS);
    struct t_spaces after = sim_spaces(&s);
    ck_assert_int_eq(after.n, 2);
    ck_assert_int_eq(after.objects[space_of(&after, "rtp_llm.tenant-alpha")], T_KEYS);
    ck_assert_int_eq(after.objects[space_of(&after, "rtp_llm.tenant-beta")], T_KEYS);
    KVH_STOP_DESTROY(&d);
    simctl_stop_ok(&s);
}

START_TEST(test_tenants_keep_their_objects_apart)
{
    tenants_share_a_store(NULL);
}
END_TEST

/* Check words (issue 19): a block with a word is stored under rtp-llm's
 * object key plus a -check-<word> part, so rtp-llm (no words) never reads it
 * and another word never finds it; word-0 blocks keep rtp-llm's key. */
START_TEST(test_check_words_object_keys)
{
    struct simctl s;
    kvh_daemon d1, d2;
    char conf[1024];
    sim_start(&s, NULL);
    v6d_conf(conf, sizeof conf, &s, "persist.policy=write_through\n");
    KVH_START(&d1, conf);
    kvnode_layout lay = kvh_layout("v6d-words", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d1, &lay, &c);
    kvnode_key k[4], plain[4];
    uint64_t wa[4], wb[4];
    void *bufs[4];
    kvh_chain(k, 4, 5000);
    kvh_chain(plain, 4, 5001);
    for (size_t i = 0; i < 4; i++) {
        wa[i] = 0xabcdef0000000000ull + i;
        wb[i] = 0xbbbb000000000000ull + i;
        bufs[i] = malloc(BB);
        kvh_fill(bufs[i], BB, k[i], 21);
    }
    KVH_OK(c, kvnode_put_batch_checked(c, k, wa, 4, (const void *const *)bufs, 0));
    KVH_PUT_OK(c, plain, 4, 22);
    wait_eq(&d1, "persist.written_blocks_total", 8, 5000);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d1);

    /* the store's objects: 4 with the word in their key, 4 with rtp-llm's */
    char *body = NULL;
    ck_assert_int_eq(kvh_http_req(s.http, NULL, "/_sim/objects", &body, NULL, 0), 200);
    size_t worded = 0, bare = 0;
    for (size_t i = 0; i < 4; i++) {
        char part[96];
        snprintf(part, sizeof part, "/block-%" PRId64 "-check-%016" PRIx64 "\"", k[i], wa[i]);
        worded += strstr(body, part) != NULL;
        snprintf(part, sizeof part, "/block-%" PRId64 "\"", plain[i]);
        bare += strstr(body, part) != NULL;
        snprintf(part, sizeof part, "/block-%" PRId64 "\"", k[i]);
        ck_assert_msg(strstr(body, part) == NULL, "a worded block under rtp-llm's key %s", part);
    }
    free(body);
    ck_assert_uint_eq(worded, 4);
    ck_assert_uint_eq(bare, 4);

    /* a new daemon finds them through lookups under their words only */
    KVH_START(&d2, conf);
    KVH_CONNECT(&d2, &lay, &c);
    kvnode_tiers t;
    KVH_OK(c, kvnode_match_checked(c, k, NULL, 4, &t));
    ck_assert_uint_eq(t.matched, 0);
    KVH_OK(c, kvnode_match_checked(c, k, wb, 4, &t));
    ck_assert_uint_eq(t.matched, 0);
    KVH_OK(c, kvnode_match_checked(c, k, wa, 4, &t));
    ck_assert_msg(t.matched == 4 && t.store == 4, "matched %zu, store %zu", t.matched, t.store);
    size_t got = 99;
    for (size_t i = 0; i < 4; i++)
        memset(bufs[i], 0, BB);
    KVH_OK(c, kvnode_get_batch_checked(c, k, wa, 4, bufs, 0, &got));
    ck_assert_uint_eq(got, 4);
    for (size_t i = 0; i < 4; i++) {
        ck_assert_msg(kvh_verify(bufs[i], BB, k[i], 21) == 0, "%s", kvh_error());
        free(bufs[i]);
    }
    ck_assert_int_eq(kvh_match(c, plain, 4), 4);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d2);
    simctl_stop_ok(&s);
}
END_TEST

/* Store misses cached (lookup_negative_ttl) on v6d: two nodes on one
 * simulated store. B's second MATCH of a chain nobody wrote makes no lookup
 * (a negative hit); A writes the chain; within the TTL B still answers 0
 * without asking, after it B looks up again and finds all of it. */
START_TEST(test_negative_cache_v6d)
{
    enum { TTL_MS = 300 };
    struct simctl s;
    kvh_daemon a, b;
    char wt[1024], nb[1024];
    sim_start(&s, NULL);
    v6d_conf(wt, sizeof wt, &s, "persist.policy=write_through\n");
    v6d_conf(nb, sizeof nb, &s, "persist.lookup_negative_ttl=300ms\n");
    KVH_START(&a, wt);
    KVH_START(&b, nb);
    kvnode_layout lay = kvh_layout("v6d-neg", BB, 1, 0);
    kvnode_client *ca, *cb;
    KVH_CONNECT(&a, &lay, &ca);
    KVH_CONNECT(&b, &lay, &cb);
    kvnode_key k[6];
    kvh_chain(k, 6, 7100);

    ck_assert_int_eq(kvh_match(cb, k, 6), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 1);
    uint64_t cached = kvh_now_ms();
    ck_assert_int_eq(kvh_match(cb, k, 6), 0);
    if (kvh_now_ms() - cached < TTL_MS) {   /* a stalled host may have let it age out */
        ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 1);
        ck_assert_int_eq(stat_int(&b, "persist.lookup_negative_hits_total"), 1);
    }
    KVH_PUT_OK(ca, k, 6, 31);
    wait_eq(&a, "persist.written_blocks_total", 6, 5000);
    /* Visible on B once the miss has aged out (TTL plus a margin). */
    uint64_t deadline = kvh_now_ms() + TTL_MS + 5000;
    long m;
    while ((m = kvh_match(cb, k, 6)) != 6) {
        ck_assert_int_eq(m, 0);
        ck_assert_msg(kvh_now_ms() < deadline, "B still matches 0 long after the TTL");
        kvh_sleep_ms(20);
    }
    ck_assert_int_ge(stat_int(&b, "persist.lookups_total"), 2);
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 6, 31), 6);

    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
    simctl_stop_ok(&s);
}
END_TEST

/* The engines name the same deployment id of their own (rtp-llm's
 * kvs_deployment_id): still one per tenant in the store. */
START_TEST(test_tenants_apart_with_the_engines_deployment_id)
{
    tenants_share_a_store("kvs_deployment_id=engine-dep-7");
}
END_TEST

int main(void)
{
#ifndef KVNODE_HAVE_V6D
    puts("test_daemon_persist_v6d: built without the v6d backend (V6D=0): skipped");
    return EXIT_SUCCESS;
#else
    /* One test case per test, each with its own bound (seconds). */
    const struct { const char *name; const TTest *test; double timeout_s; } cases[] = {
        { "write_through", test_write_through_round_trip, 30 },
        { "write_back", test_write_back_round_trip, 30 },
        { "burst", test_write_through_burst_all_written, 30 },
        { "restart", test_restart_finds_blocks_through_lookup, 30 },
        { "down_at_start", test_store_down_at_start, 40 },
        { "down_and_back", test_store_down_and_back, 40 },
        { "slow", test_slow_store, 60 },
        { "garbage", test_garbage_replies, 30 },
        { "stuck_worker", test_stuck_worker_not_ready, 60 },
        { "delete", test_delete_not_resurrected, 30 },
        { "tombstone_bound", test_tombstone_bound, 30 },
        { "batched", test_writes_and_reads_batched, 60 },
        { "hbm_batched", test_hbm_writes_batched, 60 },
        { "tenants", test_tenants_keep_their_objects_apart, 60 },
        { "tenants_engine_id", test_tenants_apart_with_the_engines_deployment_id, 60 },
        { "check_words", test_check_words_object_keys, 30 },
        { "negative_cache", test_negative_cache_v6d, 30 },
    };
    Suite *suite = suite_create("daemon_persist_v6d");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        /* valgrind (VALGRIND=1) runs everything several times slower. */
        tcase_set_timeout(tc, cases[i].timeout_s * (simctl_under_valgrind() ? 5 : 1));
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(suite, tc);
    }
    SRunner *sr = srunner_create(suite);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
#endif
}
