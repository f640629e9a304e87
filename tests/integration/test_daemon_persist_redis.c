/* Integration: real kvnoded instances persisting to the redis backend, on a
 * real 3-master / 3-replica cluster of redis-server processes on loopback
 * (tests/common/redisctl.h), small host tiers (4 MiB of 1 MiB slabs = 64
 * blocks of 64 KiB):
 *
 * - two daemons ("nodes": their own sockets, memory and admin ports): what
 *   A writes, B matches through lookups and reads byte-exact;
 * - a GET of keys B does not know reads them without a lookup first and
 *   keeps the prefix before the first block the cluster lacks; with a full
 *   host tier it reads into free slots only and looks the rest up;
 * - blocks evicted from memory come back byte-exact from the cluster;
 * - a value overwritten with redis-cli is a counted corrupt read, the GET
 *   returns the prefix before it, and the value is deleted;
 * - check words go with the values: another node finds a block under its
 *   word only; another word's lookups miss (counted as check mismatches,
 *   not as corruption) and neither they nor its delete remove the value;
 * - a store down at start: the daemon starts degraded, serves from memory,
 *   and turns ok and writes once the (plain, single) server comes up;
 * - a store that hangs (SIGSTOP): the loop stays responsive (PING), a MATCH
 *   that needs a lookup answers at server.request_timeout with what is
 *   ready (0) and is counted; after SIGCONT the blocks are found and read;
 * - a password-protected server: the password from password_file or from
 *   KVNODE_REDIS_PASSWORD works; a wrong one fails the start with a message
 *   that names the refusal and not the password; no log line shows it;
 * - a master killed with kill -9 while a daemon writes a burst: its replica
 *   is promoted, the daemon fetches the map again (counted) and writes on,
 *   its loop answers PINGs throughout, and a second daemon reads every
 *   block byte-exact, except writes the dead master had acknowledged but
 *   not replicated (misses, never wrong bytes). */
#include <check.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include "harness.h"
#include "pings.h"
#include "../common/kvh_http.h"
#include "../common/redisctl.h"

#define BB          (64u << 10)
#define SMALL_TIER  "memory.host_bytes=4MiB\nmemory.slab_bytes=1MiB\n"

static struct rctl cl;

static void cluster_setup(void)
{
    if (rctl_start(&cl, 3, 1, NULL, NULL) < 0) {
        fprintf(stderr, "cluster: %s\n", rctl_err);
        rctl_stop(&cl);
        abort();
    }
}

static void cluster_teardown(void)
{
    rctl_stop(&cl);
}

static void redis_conf(char *buf, size_t len, const char *nodes, const char *extra)
{
    int w = snprintf(buf, len,
                     SMALL_TIER
                     "persist.backend=redis\n"
                     "persist.nodes=%s\n"
                     "persist.connect_timeout=300ms\n"
                     "persist.timeout=5s\n"
                     "admin.listen=127.0.0.1:0\n"
                     "%s",
                     nodes, extra ? extra : "");
    ck_assert(w > 0 && (size_t)w < len);
}

static long long stat_int(const kvh_daemon *d, const char *path)
{
    return KVH_STAT(d, path);
}

static const char *pstate(const kvh_daemon *d)
{
    static char buf[32];
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    const char *v = json_string_value(kvh_json_get(st, "persist.state"));
    ck_assert_msg(v != NULL, "stats have no persist.state");
    snprintf(buf, sizeof buf, "%s", v);
    json_decref(st);
    return buf;
}

static void wait_state(const kvh_daemon *d, const char *want, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    while (strcmp(pstate(d), want) != 0) {
        ck_assert_msg(kvh_now_ms() < deadline, "persist.state is \"%s\", not \"%s\" after %d ms",
                      pstate(d), want, timeout_ms);
        kvh_sleep_ms(50);
    }
}

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

static void wait_idle(const kvh_daemon *d, int timeout_ms)
{
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(d, "persist.queue_depth", 0, timeout_ms, &last) == 0,
                  "persist.queue_depth = %lld after %d ms", last, timeout_ms);
}

/* The Redis key of block `key` of model's rank 0 on daemon d. */
static void block_key(const kvh_daemon *d, const char *model, kvnode_key key, char *buf, size_t len)
{
    json_t *st = kvh_stats(d);
    ck_assert(st != NULL);
    json_t *ns = kvh_stats_namespace(st, model, 0);
    ck_assert_msg(ns != NULL, "no namespace %s", model);
    const char *dep = json_string_value(json_object_get(ns, "deployment_id"));
    ck_assert(dep != NULL);
    snprintf(buf, len, "kvnode/default/%s/0/%" PRId64, dep, (int64_t)key);
    json_decref(st);
}

/* ---- two nodes share ------------------------------------------------------------ */

START_TEST(test_two_nodes_share)
{
    kvh_daemon a, b;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, NULL);
    KVH_START(&a, conf);
    KVH_START(&b, conf);
    ck_assert_str_eq(pstate(&a), "ok");
    ck_assert_str_eq(pstate(&b), "ok");
    kvnode_layout lay = kvh_layout("rd-share", BB, 1, 0);
    kvnode_client *ca, *cb;
    KVH_CONNECT(&a, &lay, &ca);
    KVH_CONNECT(&b, &lay, &cb);
    kvnode_key k[8];
    kvh_chain(k, 8, 100);
    KVH_PUT_OK(ca, k, 8, 7);
    wait_ge(&a, "persist.written_blocks_total", 8, 10000);

    /* B has never seen these keys: MATCH finds them in the cluster. */
    long long lookups0 = stat_int(&b, "persist.lookups_total");
    kvnode_tiers t = KVH_TIERS(cb, k, 8);
    ck_assert_msg(t.matched == 8 && t.store == 8, "B matched %zu (store %zu)", t.matched, t.store);
    ck_assert_int_gt(stat_int(&b, "persist.lookups_total"), lookups0);
    ck_assert_int_ge(stat_int(&b, "persist.lookup_found_total"), 8);
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 8, 7), 8);
    ck_assert_int_eq(stat_int(&b, "persist.read_blocks_total"), 8);
    /* A chain nobody wrote: no match on B. */
    kvnode_key none[4];
    kvh_chain(none, 4, 101);
    ck_assert_int_eq(kvh_match(cb, none, 4), 0);
    ck_assert_int_eq(stat_int(&b, "persist.written_blocks_total"), 0);
    /* The routing counters: maps fetched (each worker's handle, at least), no redirect. */
    ck_assert_int_ge(stat_int(&b, "persist.redis.map_refreshes_total"), 1);
    ck_assert_int_eq(stat_int(&b, "persist.redis.moved_total"), 0);
    ck_assert_int_eq(stat_int(&b, "persist.redis.ask_total"), 0);
    json_t *st = kvh_stats(&b);
    const char *admin = json_string_value(json_object_get(st, "admin"));
    ck_assert_ptr_nonnull(admin);
    char *body = NULL;
    ck_assert_int_eq(kvh_http_req(admin, NULL, "/metrics", &body, NULL, 0), 200);
    ck_assert_msg(strstr(body, "kvnode_persist_redis_redirects_total{kind=\"moved\"} 0\n") &&
                  strstr(body, "kvnode_persist_redis_map_refreshes_total "), "metrics lack the redis counters");
    free(body);
    json_decref(st);

    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
}
END_TEST

/* ---- a GET of unknown keys reads them at once ------------------------------------------ */

/* B has never seen the keys, and the cluster lacks the fourth: B's GET
 * reads the chain without an EXISTS round trip first (lookups_total stays
 * 0, one lookup read), returns the three blocks before the gap byte-exact,
 * and keeps only those: the blocks read after the gap are let go, and the
 * keys after it stay unknown (a MATCH asks the store again: misses are not
 * cached here, lookup_negative_ttl = 0; test_negative_cache_* cache them). */
START_TEST(test_get_reads_unknown_keys_without_lookup)
{
    kvh_daemon a, b;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, "persist.lookup_negative_ttl=0\n");
    KVH_START(&a, conf);
    kvnode_layout lay = kvh_layout("rd-probe", BB, 1, 0);
    kvnode_client *ca, *cb;
    KVH_CONNECT(&a, &lay, &ca);
    kvnode_key k[8];
    kvh_chain(k, 8, 150);
    KVH_PUT_OK(ca, k, 3, 9);
    KVH_PUT_OK(ca, k + 4, 4, 9);   /* k[3] is never written */
    wait_ge(&a, "persist.written_blocks_total", 7, 10000);

    KVH_START(&b, conf);
    KVH_CONNECT(&b, &lay, &cb);
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 8, 9), 3);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookup_reads_total"), 1);
    ck_assert_int_eq(stat_int(&b, "persist.lookup_found_total"), 3);
    ck_assert_int_eq(stat_int(&b, "persist.promotions_ok_total"), 3);
    /* All eight were read in one go: seven found, the gap a miss. */
    ck_assert_int_eq(wait_ge(&b, "persist.read_blocks_total", 7, 5000), 7);
    ck_assert_int_eq(stat_int(&b, "persist.read_misses_total"), 1);
    ck_assert_int_eq(stat_int(&b, "tiers.host.blocks"), 3);
    ck_assert_int_eq(stat_int(&b, "tiers.host.used_bytes"), 3 * (long long)BB);
    /* MATCH still asks the store (EXISTS): the prefix ends at the gap. */
    kvnode_tiers t = KVH_TIERS(cb, k, 8);
    ck_assert_msg(t.matched == 3 && t.host == 3, "matched %zu (host %zu)", t.matched, t.host);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 1);
    /* Again: the blocks in memory are served from it, the rest read again. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 8, 9), 3);
    ck_assert_int_eq(stat_int(&b, "persist.lookup_reads_total"), 2);
    ck_assert_int_eq(stat_int(&b, "tiers.host.blocks"), 3);

    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
}
END_TEST

/* A full host tier: the GET reads unknown keys into free slots only (it
 * evicts nothing for a block not known to exist), looks the rest up, and
 * promotes those the usual way; the whole chain comes back, no read missed. */
START_TEST(test_get_unknown_keys_full_tier)
{
    kvh_daemon a, b;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, NULL);
    KVH_START(&a, conf);
    kvnode_layout lay = kvh_layout("rd-probe-full", BB, 1, 0);
    kvnode_client *ca, *cb;
    KVH_CONNECT(&a, &lay, &ca);
    kvnode_key k[16], fill[64];
    kvh_chain(k, 16, 160);
    KVH_PUT_OK(ca, k, 16, 3);
    wait_ge(&a, "persist.written_blocks_total", 16, 10000);

    KVH_START(&b, conf);
    KVH_CONNECT(&b, &lay, &cb);
    /* B's tier full of its own blocks (written through, so evictable). */
    kvh_chain(fill, 64, 161);
    for (size_t i = 0; i < 64; i += 8)
        KVH_PUT_OK(cb, fill + i, 8, 4);
    wait_ge(&b, "persist.written_blocks_total", 64, 10000);
    wait_idle(&b, 10000);
    long long free_slots = 64 - stat_int(&b, "tiers.host.blocks");
    ck_assert_msg(free_slots < 16, "%lld free slots: the tier is not full", free_slots);

    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 16, 3), 16);
    ck_assert_int_le(stat_int(&b, "persist.lookup_reads_total"), 1);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 1);
    ck_assert_int_eq(stat_int(&b, "persist.read_misses_total"), 0);
    ck_assert_int_eq(stat_int(&b, "persist.promotions_ok_total"), 16);

    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
}
END_TEST

/* ---- store misses cached ([persist] lookup_negative_ttl) -------------------------------- */

#define NEG_HITS "persist.lookup_negative_hits_total"

/* A TTL far longer than the test: within it, a MATCH or GET of a chain
 * whose first unknown key the store lacked makes no round trip (EXISTS or
 * read), answers the same, and is counted; it hides a copy another node
 * wrote meanwhile. A local put of the key (even one aborted) forgets the
 * miss: the next MATCH asks the store and finds the other node's copy. */
START_TEST(test_negative_cache_within_ttl)
{
    kvh_daemon a, b;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, "persist.lookup_negative_ttl=1h\n");
    KVH_START(&a, conf);
    KVH_START(&b, conf);
    kvnode_layout lay = kvh_layout("rd-neg", BB, 1, 0);
    kvnode_client *ca, *cb;
    KVH_CONNECT(&a, &lay, &ca);
    KVH_CONNECT(&b, &lay, &cb);
    kvnode_key k[8], d[8];
    kvh_chain(k, 8, 170);
    kvh_chain(d, 8, 171);

    ck_assert_int_eq(kvh_match(cb, k, 8), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 1);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 0);
    /* Again: the same answer, no lookup, one negative hit. */
    ck_assert_int_eq(kvh_match(cb, k, 8), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 1);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 1);
    /* A GET neither reads (redis reads unknown keys at once) nor looks up. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 8, 5), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookup_reads_total"), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 1);
    ck_assert_int_eq(stat_int(&b, "persist.read_blocks_total"), 0);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 2);

    /* A GET's miss is cached as well: the first read came back nil. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, d, 8, 6), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookup_reads_total"), 1);
    ck_assert_int_eq(kvh_match(cb, d, 8), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 1);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 3);

    /* A writes both chains: within the TTL, B's cached misses hide them. */
    KVH_PUT_OK(ca, k, 8, 5);
    KVH_PUT_OK(ca, d, 8, 6);
    wait_ge(&a, "persist.written_blocks_total", 16, 10000);
    ck_assert_int_eq(kvh_match(cb, k, 8), 0);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 4);

    /* B reserves k[0] and aborts: the miss is forgotten, the lookup finds A's chain. */
    kvnode_lease lease = 0;
    kvnode_loc loc[1];
    KVH_OK(cb, kvnode_put_begin(cb, k, 1, KVNODE_TIER_HOST, &lease, loc));
    ck_assert(lease != 0);
    KVH_OK(cb, kvnode_put_abort(cb, lease));
    kvnode_tiers t = KVH_TIERS(cb, k, 8);
    ck_assert_msg(t.matched == 8 && t.store == 8, "B matched %zu (store %zu)", t.matched, t.store);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 2);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 4);
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 8, 5), 8);

    /* B puts d[0] itself: visible at once, and the rest of d is looked up. */
    KVH_PUT_OK(cb, d, 1, 6);
    t = KVH_TIERS(cb, d, 8);
    ck_assert_msg(t.matched == 8 && t.host == 1 && t.store == 7, "B matched %zu (host %zu, store %zu)",
                  t.matched, t.host, t.store);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 3);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 4);

    json_t *st = kvh_stats(&b);
    const char *admin = json_string_value(json_object_get(st, "admin"));
    ck_assert_ptr_nonnull(admin);
    char *body = NULL;
    ck_assert_int_eq(kvh_http_req(admin, NULL, "/metrics", &body, NULL, 0), 200);
    ck_assert_msg(strstr(body, "\nkvnode_persist_lookup_negative_hits_total 4\n"),
                  "metrics lack kvnode_persist_lookup_negative_hits_total 4");
    free(body);
    json_decref(st);

    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
}
END_TEST

/* A short TTL: a miss is asked about again once it has aged out, and a
 * chain another node writes after B cached the miss becomes visible on B
 * within the TTL (plus a margin for the write and the poll). */
START_TEST(test_negative_cache_expires)
{
    enum { TTL_MS = 200 };
    kvh_daemon a, b;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, "persist.lookup_negative_ttl=200ms\n");
    KVH_START(&a, conf);
    KVH_START(&b, conf);
    kvnode_layout lay = kvh_layout("rd-neg-ttl", BB, 1, 0);
    kvnode_client *ca, *cb;
    KVH_CONNECT(&a, &lay, &ca);
    KVH_CONNECT(&b, &lay, &cb);
    kvnode_key k[8];
    kvh_chain(k, 8, 180);

    ck_assert_int_eq(kvh_match(cb, k, 8), 0);
    long long lookups = stat_int(&b, "persist.lookups_total");
    ck_assert_int_eq(lookups, 1);
    kvh_sleep_ms(2 * TTL_MS);
    ck_assert_int_eq(kvh_match(cb, k, 8), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), lookups + 1);

    /* A writes the chain right after B cached the miss again. */
    KVH_PUT_OK(ca, k, 8, 3);
    wait_ge(&a, "persist.written_blocks_total", 8, 10000);
    uint64_t written = kvh_now_ms(), deadline = written + TTL_MS + 5000;
    long long m;
    while ((m = kvh_match(cb, k, 8)) != 8) {
        ck_assert_int_eq(m, 0);
        ck_assert_msg(kvh_now_ms() < deadline, "B still matches 0 %llu ms after A's write",
                      (unsigned long long)(kvh_now_ms() - written));
        kvh_sleep_ms(20);
    }
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 8, 3), 8);

    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
}
END_TEST

/* lookup_negative_ttl = 0: nothing is cached, every MATCH looks up. The
 * option is reloadable: raised by a reload, the next miss is cached. */
START_TEST(test_negative_cache_off)
{
    kvh_daemon b;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, "persist.lookup_negative_ttl=0\n");
    KVH_START(&b, conf);
    kvnode_layout lay = kvh_layout("rd-neg-off", BB, 1, 0);
    kvnode_client *cb;
    KVH_CONNECT(&b, &lay, &cb);
    kvnode_key k[4];
    kvh_chain(k, 4, 190);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(kvh_match(cb, k, 4), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 3);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 0);

    char *not_applied = (char *)1;
    redis_conf(conf, sizeof conf, cl.seeds, "persist.lookup_negative_ttl=1h\n");
    ck_assert_int_eq(kvh_rewrite_config(&b, conf), 0);
    KVH_OK(cb, kvnode_reload(cb, &not_applied));
    ck_assert_msg(not_applied == NULL, "not applied: %s", not_applied);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(kvh_match(cb, k, 4), 0);
    ck_assert_int_eq(stat_int(&b, "persist.lookups_total"), 4);
    ck_assert_int_eq(stat_int(&b, NEG_HITS), 2);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&b);
}
END_TEST

/* ---- eviction round trip --------------------------------------------------------------- */

START_TEST(test_round_trip_after_eviction)
{
    kvh_daemon d;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, NULL);
    KVH_START(&d, conf);
    kvnode_layout lay = kvh_layout("rd-evict", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvnode_key a[8];
    kvh_chain(a, 8, 200);
    KVH_PUT_OK(c, a, 8, 3);
    wait_ge(&d, "persist.written_blocks_total", 8, 10000);
    /* Fill the 64-block tier twice over: the chain leaves memory. */
    kvnode_key f[4];
    for (uint64_t i = 0; i < 40 && stat_int(&d, "evictions.host.to_store_total") < 8; i++) {
        kvh_chain(f, 4, 300 + i);
        KVH_PUT_OK(c, f, 4, 99);
        wait_idle(&d, 10000);
    }
    kvnode_tiers t = KVH_TIERS(c, a, 8);
    ck_assert_msg(t.matched == 8 && t.store == 8 && t.host == 0,
                  "after eviction: matched %zu, host %zu, store %zu", t.matched, t.host, t.store);
    long long reads0 = stat_int(&d, "persist.read_blocks_total");
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 3), 8);
    ck_assert_int_eq(stat_int(&d, "persist.read_blocks_total") - reads0, 8);
    ck_assert_int_eq(stat_int(&d, "persist.failures_total.write.unavailable"), 0);
    ck_assert_int_eq(stat_int(&d, "persist.failures_total.read.corrupt"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- a corrupted value -------------------------------------------------------------------- */

START_TEST(test_corrupt_value_counted)
{
    kvh_daemon a, b;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, NULL);
    KVH_START(&a, conf);
    kvnode_layout lay = kvh_layout("rd-corrupt", BB, 1, 0);
    kvnode_client *ca, *cb;
    KVH_CONNECT(&a, &lay, &ca);
    kvnode_key k[4];
    kvh_chain(k, 4, 400);
    KVH_PUT_OK(ca, k, 4, 5);
    wait_ge(&a, "persist.written_blocks_total", 4, 10000);
    char key[512];
    block_key(&a, "rd-corrupt", k[2], key, sizeof key);
    int m = rctl_master_of(&cl, key);
    ck_assert_int_ge(m, 0);
    ck_assert_msg(rctl_cli_has(&cl, m, "1", "exists", key, (const char *)NULL), "%s not stored", key);
    ck_assert_msg(rctl_cli_has(&cl, m, "OK", "set", key, "not a kvnode block", (const char *)NULL),
                  "set: %s", rctl_err);

    KVH_START(&b, conf);
    KVH_CONNECT(&b, &lay, &cb);
    ck_assert_int_eq(kvh_match(cb, k, 4), 4);
    /* The third block is bad: the GET stops before it; counted, deleted. */
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 4, 5), 2);
    ck_assert_int_eq(wait_ge(&b, "persist.failures_total.read.corrupt", 1, 5000), 1);
    ck_assert_msg(rctl_cli_has(&cl, m, "0", "exists", key, (const char *)NULL), "%s not deleted", key);
    ck_assert_str_eq(pstate(&b), "ok");   /* the store answered: not degraded */

    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
}
END_TEST

/* ---- check words (issue 19) ---------------------------------------------------------------- */

/* get_batch_checked of keys under checks: how many came, each byte-exact. */
static size_t get_words(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                        uint64_t seed)
{
    void *bufs[8];
    size_t got = 99;
    ck_assert(n <= 8);
    for (size_t i = 0; i < n; i++)
        bufs[i] = calloc(1, BB);
    KVH_OK(c, kvnode_get_batch_checked(c, keys, checks, n, bufs, 0, &got));
    for (size_t i = 0; i < got; i++)
        ck_assert_msg(kvh_verify(bufs[i], BB, keys[i], seed) == 0, "block #%zu: %s", i, kvh_error());
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    return got;
}

/* A's blocks carry their words through the cluster to B; C, asking with
 * another word, finds nothing (counted as check mismatches, not as corrupt
 * values) and the values stay for the word they belong to. */
START_TEST(test_check_words_across_nodes)
{
    kvh_daemon a, b, c3;
    char conf[1024];
    redis_conf(conf, sizeof conf, cl.seeds, NULL);
    KVH_START(&a, conf);
    KVH_START(&b, conf);
    KVH_START(&c3, conf);
    kvnode_layout lay = kvh_layout("rd-words", BB, 1, 0);
    kvnode_client *ca, *cb, *cc;
    KVH_CONNECT(&a, &lay, &ca);
    KVH_CONNECT(&b, &lay, &cb);
    KVH_CONNECT(&c3, &lay, &cc);
    kvnode_key k[8];
    uint64_t wa[8], wb[8];
    void *src[8];
    kvh_chain(k, 8, 700);
    for (size_t i = 0; i < 8; i++) {
        wa[i] = 0xa000000000000000ull + i;
        wb[i] = 0xb000000000000000ull + i;
        src[i] = malloc(BB);
        kvh_fill(src[i], BB, k[i], 11);
    }
    KVH_OK(ca, kvnode_put_batch_checked(ca, k, wa, 8, (const void *const *)src, 0));
    for (size_t i = 0; i < 8; i++)
        free(src[i]);
    wait_ge(&a, "persist.written_blocks_total", 8, 10000);

    /* B finds them under their words only, and reads them byte-exact */
    kvnode_tiers t;
    KVH_OK(cb, kvnode_match_checked(cb, k, wb, 8, &t));
    ck_assert_uint_eq(t.matched, 0);
    ck_assert_int_ge(stat_int(&b, "persist.check_mismatches_total"), 1);
    ck_assert_int_ge(stat_int(&b, "keys.check_mismatches_total"), 1);
    KVH_OK(cb, kvnode_match_checked(cb, k, wa, 8, &t));
    ck_assert_msg(t.matched == 8 && t.store == 8, "B matched %zu (store %zu)", t.matched, t.store);
    ck_assert_uint_eq(get_words(cb, k, wa, 8, 11), 8);
    ck_assert_int_eq(stat_int(&b, "persist.read_blocks_total"), 8);

    /* C asks with another word, then with none: misses, counted; not corrupt */
    ck_assert_uint_eq(get_words(cc, k, wb, 8, 11), 0);
    ck_assert_uint_eq(get_words(cc, k, NULL, 8, 11), 0);
    ck_assert_int_ge(stat_int(&c3, "persist.check_mismatches_total"), 2);
    ck_assert_int_eq(stat_int(&c3, "persist.failures_total.read.corrupt"), 0);
    ck_assert_int_eq(stat_int(&c3, "persist.read_blocks_total"), 0);
    char key[512];
    block_key(&a, "rd-words", k[0], key, sizeof key);
    int m = rctl_master_of(&cl, key);
    ck_assert_int_ge(m, 0);
    ck_assert_msg(rctl_cli_has(&cl, m, "1", "exists", key, (const char *)NULL), "%s was deleted", key);
    /* a delete with another word leaves the cluster's copy too */
    size_t deleted = 99;
    KVH_OK(cc, kvnode_delete_checked(cc, k, wb, 8, &deleted));
    wait_idle(&c3, 10000);
    ck_assert_msg(rctl_cli_has(&cl, m, "1", "exists", key, (const char *)NULL), "%s was deleted", key);
    /* and the word's owner still reads them */
    ck_assert_uint_eq(get_words(cc, k, wa, 8, 11), 8);

    kvnode_close(ca);
    kvnode_close(cb);
    kvnode_close(cc);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
    KVH_STOP_DESTROY(&c3);
}
END_TEST

/* ---- down at start ------------------------------------------------------------------------ */

START_TEST(test_store_down_at_start)
{
    struct rctl one;
    memset(&one, 0, sizeof one);
    snprintf(one.dir, sizeof one.dir, "/tmp/kvnode-redis-XXXXXX");
    ck_assert(mkdtemp(one.dir) != NULL);
    one.n = 1;
    one.ports[0] = rctl_pick_port();
    ck_assert_int_gt(one.ports[0], 0);
    char nodes[64], conf[1024];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d", one.ports[0]);
    redis_conf(conf, sizeof conf, nodes, NULL);
    kvh_daemon d;
    KVH_START(&d, conf);
    ck_assert_str_eq(pstate(&d), "degraded");
    kvnode_layout lay = kvh_layout("rd-down", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvnode_key a[8], b[8];
    kvh_chain(a, 8, 500);
    kvh_chain(b, 8, 501);
    KVH_PUT_OK(c, a, 8, 1);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, a, 8, 1), 8);       /* memory serves */
    wait_ge(&d, "persist.failures_total.write.unavailable", 1, 10000);
    ck_assert_int_eq(stat_int(&d, "persist.written_blocks_total"), 0);

    ck_assert_msg(rctl_start_server(&one, 0, NULL) == 0, "server: %s", rctl_err);
    wait_state(&d, "ok", 10000);
    KVH_PUT_OK(c, b, 8, 2);
    wait_ge(&d, "persist.written_blocks_total", 8, 10000);
    char *out = NULL;
    ck_assert_int_eq(rctl_cli(&one, 0, &out, "dbsize", (const char *)NULL), 0);
    ck_assert_msg(strtoll(out, NULL, 10) >= 8, "dbsize %s", out);
    free(out);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    rctl_stop(&one);
}
END_TEST

/* ---- a hung store ---------------------------------------------------------------------------- */

START_TEST(test_hung_store_does_not_stall_the_loop)
{
    struct rctl one;
    ck_assert_msg(rctl_start(&one, 0, 0, NULL, NULL) == 0, "server: %s", rctl_err);
    char conf[1024];
    redis_conf(conf, sizeof conf, one.seeds, "server.request_timeout=1s\n");
    kvh_daemon a, b;
    KVH_START(&a, conf);
    KVH_START(&b, conf);
    kvnode_layout lay = kvh_layout("rd-hung", BB, 1, 0);
    kvnode_client *ca, *cb, *obs;
    KVH_CONNECT(&a, &lay, &ca);
    KVH_CONNECT(&b, &lay, &cb);
    KVH_CONNECT(&b, NULL, &obs);
    kvnode_key k[8];
    kvh_chain(k, 8, 600);
    KVH_PUT_OK(ca, k, 8, 6);
    wait_ge(&a, "persist.written_blocks_total", 8, 10000);

    ck_assert_int_eq(kill(one.pids[0], SIGSTOP), 0);
    /* B's MATCH needs the store: it answers at request_timeout with 0 ready. */
    long long timeouts0 = stat_int(&b, "persist.wait_timeouts_total");
    ck_assert_int_eq(kvh_match(cb, k, 8), 0);
    ck_assert_int_eq(stat_int(&b, "persist.wait_timeouts_total") - timeouts0, 1);
    pings_fast(obs, 40, 20, 5000, "while the store hangs");   /* persist.timeout */
    ck_assert_int_eq(kill(one.pids[0], SIGCONT), 0);

    /* Back: found and read byte-exact (the stuck lookup ends within persist.timeout). */
    uint64_t deadline = kvh_now_ms() + 10000;
    long m;
    while ((m = kvh_match(cb, k, 8)) != 8 && kvh_now_ms() < deadline)
        kvh_sleep_ms(100);
    ck_assert_int_eq(m, 8);
    ck_assert_uint_eq(KVH_GET_VERIFIED(cb, k, 8, 6), 8);
    kvnode_close(ca);
    kvnode_close(cb);
    kvnode_close(obs);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
    rctl_stop(&one);
}
END_TEST

/* ---- a password ------------------------------------------------------------------------------ */

START_TEST(test_password_file_and_environment)
{
    static const char pw[] = "kvnode-s3cret-pw";
    struct rctl one;
    ck_assert_msg(rctl_start(&one, 0, 0, pw, NULL) == 0, "server: %s", rctl_err);
    char path[] = "/tmp/kvnode-redis-pwfile-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, pw, strlen(pw)), (ssize_t)strlen(pw));
    ck_assert_int_eq(write(fd, "\n", 1), 1);
    close(fd);
    char extra[256], conf[1024];
    kvnode_layout lay = kvh_layout("rd-pw", BB, 1, 0);
    kvnode_key k[4];
    kvh_chain(k, 4, 800);

    /* From the file. */
    snprintf(extra, sizeof extra, "persist.password_file=%s\n", path);
    redis_conf(conf, sizeof conf, one.seeds, extra);
    kvh_daemon d;
    KVH_START(&d, conf);
    ck_assert_str_eq(pstate(&d), "ok");
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    KVH_PUT_OK(c, k, 4, 9);
    wait_ge(&d, "persist.written_blocks_total", 4, 10000);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    ck_assert(rctl_cli_has(&one, 0, "4", "dbsize", (const char *)NULL));

    /* From the environment: another daemon finds the blocks. */
    char env[64];
    snprintf(env, sizeof env, "KVNODE_REDIS_PASSWORD=%s", pw);
    const char *const envs[] = { env, NULL };
    const kvh_spawn_opts opts = { .env = envs };
    redis_conf(conf, sizeof conf, one.seeds, NULL);
    ck_assert_msg(kvh_start_ex(&d, conf, &opts) == 0, "start: %s", kvh_error());
    KVH_CONNECT(&d, &lay, &c);
    ck_assert_uint_eq(KVH_GET_VERIFIED(c, k, 4, 9), 4);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);

    /* A wrong password: the start fails naming the refusal, never the password. */
    const char *const wrong[] = { "KVNODE_REDIS_PASSWORD=not-the-password", NULL };
    const kvh_spawn_opts wopts = { .env = wrong };
    ck_assert_int_eq(kvh_spawn_ex(&d, conf, &wopts), 0);
    int st = kvh_wait_exit(&d, 10000);
    ck_assert_msg(st != KVH_EXIT_TIMEOUT && st != 0, "a refused password must fail the start (status %d)", st);
    char *log = kvh_read_log(&d);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "AUTH") && strstr(log, "WRONGPASS"), "log: %s", log);
    ck_assert_msg(!strstr(log, "not-the-password") && !strstr(log, pw), "the log shows a password");
    free(log);
    kvh_destroy(&d);
    unlink(path);
    rctl_stop(&one);
}
END_TEST

/* ---- a master killed in a write burst ---------------------------------------------------------- */

START_TEST(test_master_killed_during_write_burst)
{
    struct rctl f;
    ck_assert_msg(rctl_start(&f, 3, 1, NULL, NULL) == 0, "cluster: %s", rctl_err);
    char conf[1024];
    redis_conf(conf, sizeof conf, f.seeds, "persist.timeout=10s\n");
    kvh_daemon a, b;
    KVH_START(&a, conf);
    kvnode_layout lay = kvh_layout("rd-failover", BB, 1, 0);
    kvnode_client *ca, *obs;
    KVH_CONNECT(&a, &lay, &ca);
    KVH_CONNECT(&a, NULL, &obs);
    enum { CHAINS = 12, LEN = 4 };
    kvnode_key k[CHAINS][LEN];
    char key[512];
    int victim = -1;
    long long refreshes0 = 0;
    for (int i = 0; i < CHAINS; i++) {
        kvh_chain(k[i], LEN, 700 + (uint64_t)i);
        KVH_PUT_OK(ca, k[i], LEN, 8);
        if (i == 2) {
            wait_ge(&a, "persist.written_blocks_total", 3 * LEN, 10000);
            refreshes0 = stat_int(&a, "persist.redis.map_refreshes_total");
            block_key(&a, "rd-failover", k[0][0], key, sizeof key);
            victim = rctl_master_of(&f, key);
            ck_assert_int_ge(victim, 0);
            rctl_kill(&f, victim);
            /* Memory serves, and the loop answers, while the shard is down. */
            ck_assert_uint_eq(KVH_GET_VERIFIED(ca, k[0], LEN, 8), LEN);
            pings_fast(obs, 20, 10, 1000, "while a master is down");
        }
    }
    wait_ge(&a, "persist.written_blocks_total", CHAINS * LEN, 30000);
    ck_assert_int_eq(stat_int(&a, "persist.dropped_total"), 0);
    ck_assert_int_gt(stat_int(&a, "persist.redis.map_refreshes_total"), refreshes0);
    ck_assert_int_ge(stat_int(&a, "persist.redis.reconnects_total"), 1);
    ck_assert_int_eq(rctl_wait_ok(&f, 20000), 0);

    /* Another node reads them: byte-exact, or a miss for what the dead master
     * had acknowledged without replicating (chains 0..2 at most). */
    KVH_START(&b, conf);
    kvnode_client *cb;
    KVH_CONNECT(&b, &lay, &cb);
    size_t got_all = 0;
    for (int i = 0; i < CHAINS; i++) {
        size_t got = KVH_GET_VERIFIED(cb, k[i], LEN, 8);
        if (i >= 3)
            ck_assert_msg(got == LEN, "chain %d: %zu of %d read back", i, got, LEN);
        got_all += got;
    }
    ck_assert_uint_ge(got_all, (CHAINS - 3) * LEN);
    ck_assert_int_eq(stat_int(&b, "persist.failures_total.read.corrupt"), 0);
    kvnode_close(ca);
    kvnode_close(obs);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
    rctl_stop(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon_persist_redis");
    TCase *tc = tcase_create("cluster");
    tcase_add_unchecked_fixture(tc, cluster_setup, cluster_teardown);
    tcase_add_test(tc, test_two_nodes_share);
    tcase_add_test(tc, test_get_reads_unknown_keys_without_lookup);
    tcase_add_test(tc, test_get_unknown_keys_full_tier);
    tcase_add_test(tc, test_round_trip_after_eviction);
    tcase_add_test(tc, test_corrupt_value_counted);
    tcase_add_test(tc, test_check_words_across_nodes);
    tcase_add_test(tc, test_negative_cache_within_ttl);
    tcase_add_test(tc, test_negative_cache_expires);
    tcase_add_test(tc, test_negative_cache_off);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    tc = tcase_create("faults");
    tcase_add_test(tc, test_store_down_at_start);
    tcase_add_test(tc, test_hung_store_does_not_stall_the_loop);
    tcase_add_test(tc, test_password_file_and_environment);
    tcase_add_test(tc, test_master_killed_during_write_burst);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
