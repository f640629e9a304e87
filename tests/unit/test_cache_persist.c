/* Unit tests of the cache's persistent-store paths on a private libevent
 * loop with a real `file` store in a temp dir: write-through, ghosts left by
 * eviction, promotion through a deferred get, a delete or a vanished
 * requester during a promotion, a put over a ghost (commit and abort),
 * write-back, recovery entries and the shutdown flush. The accounting
 * (namespace blocks/stored, store-tier blocks) is checked after each.
 * A full disk is this process's RLIMIT_FSIZE (each test runs in a child of
 * its own): the store's writes of 64 KiB blocks fail with EFBIG while it is
 * low; the write probe of a degraded store, the stop's rounds of writes and
 * its count of what it could not write are checked with it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "block_pattern.h"
#include "../common/proc.h"
#include "cache/cache.h"
#include "cache_calls.h"
#include "config/config.h"
#include "kvnode.h"
#include "persist/kvs/kvs.h"
#include "core/log.h"
#include "persist/persist.h"
#include "stats.h"

#define BLOCK (64u * 1024u)
#define HOST_BLOCKS 32u   /* 2 MiB host tier */

static struct event_base *base;
static struct cache *cache;
static struct persist *store;
static struct kvn_config cfg;
static struct kv_namespace *ns;
static struct lease_list owner;
static char dir[64];
static unsigned setup_workers = 2;

static void setup_policy(int policy)
{
    char err[512];
    struct ns_layout l = { .model = "m", .dtype = "bf16", .block_tokens = 16,
                           .block_bytes = BLOCK, .num_layers = 2, .kv_heads = 2,
                           .head_dim = 64, .tp_size = 1, .tp_rank = 0 };

    log_set_level(LOG_LEVEL_ERROR);
    snprintf(dir, sizeof dir, "/tmp/kvn-cache-persist.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    config_defaults(&cfg);
    cfg.host_bytes = HOST_BLOCKS * BLOCK;
    cfg.max_reserved_per_client = 1.0;   /* these tests reserve whole tiers at once */
    cfg.slab_bytes = 1u << 20;
    cfg.high_watermark = 1.0;
    cfg.low_watermark = 0.9;
    cfg.pin_host = CONFIG_PIN_OFF;
    cfg.request_timeout_ms = 5000;
    cfg.persist_backend = CONFIG_BACKEND_FILE;
    cfg.persist_policy = policy;
    snprintf(cfg.persist_path, sizeof cfg.persist_path, "%s", dir);
    cfg.persist_workers = setup_workers;
    cfg.persist_queue = 1024;
    cfg.persist_fsync = KVS_FSYNC_NEVER;
    base = event_base_new();
    ck_assert_ptr_nonnull(base);
    ck_assert_int_eq(cache_create(base, &cfg, &cache, err, sizeof err), 0);
    ck_assert_msg(persist_create(base, &cfg, &store, err, sizeof err) == 0, "%s", err);
    cache_set_persist(cache, store);
    ck_assert_int_eq(cache_bind(cache, &l, &ns, err, sizeof err), 0);
    memset(&owner, 0, sizeof owner);
}

static void setup(void) { setup_policy(CONFIG_POLICY_WRITE_THROUGH); }
/* One store worker: requests complete in the order they were submitted. */
static void setup_one_worker(void)
{
    setup_workers = 1;
    setup_policy(CONFIG_POLICY_WRITE_THROUGH);
    setup_workers = 2;
}
static void setup_wb(void)
{
    setup_policy(CONFIG_POLICY_WRITE_BACK);
    cfg.high_watermark = 0.75;   /* 24 of 32 blocks */
    cfg.low_watermark = 0.5;
    cache_apply_config(cache, &cfg);
}

static void teardown(void)
{
    cache_release_owner(cache, &owner);
    persist_drain(store, 5000);
    persist_destroy(store);
    cache_destroy(cache);
    event_base_free(base);
    const char *rm[] = { "rm", "-rf", dir, NULL };
    ck_assert_int_eq(proc_run(&(struct proc_opts){ .argv = rm }, 20000, NULL, NULL), 0);
}

/* Run the loop until *flag is set or 5 s pass. */
static void run_until(const bool *flag)
{
    struct timespec ts = { 0, 1000000 };
    for (int i = 0; i < 5000 && !*flag; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        if (!*flag)
            nanosleep(&ts, NULL);
    }
    ck_assert_msg(*flag, "timed out waiting on the loop");
}

static bool always_false;
static void run_ms(unsigned ms)
{
    struct timespec ts = { 0, 1000000 };
    for (unsigned i = 0; i < ms; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        nanosleep(&ts, NULL);
    }
    (void)always_false;
}

/* Until every store request finished. */
static void settle(void)
{
    ck_assert_int_eq(persist_drain(store, 5000), 0);
    run_ms(5);
}

static json_int_t stat_at(const char *a, const char *b, const char *c)
{
    json_t *root = json_object(), *v;
    json_int_t out;
    stats_cache_json(cache, root);
    v = json_object_get(root, a);
    if (b)
        v = json_object_get(v, b);
    if (c)
        v = json_object_get(v, c);
    ck_assert_msg(json_is_integer(v), "stat %s.%s.%s missing", a, b ? b : "", c ? c : "");
    out = json_integer_value(v);
    json_decref(root);
    return out;
}

static uint8_t *slot(const struct cache_loc *l)
{
    return (uint8_t *)cache_arena_base(cache, l->arena) + l->offset;
}

static void fill(uint8_t *p, int64_t key) { block_fill(p, BLOCK, key); }
static int check(const uint8_t *p, int64_t key) { return block_check(p, BLOCK, key); }

static void put_chain(const int64_t *keys, size_t n, bool commit)
{
    struct cache_loc locs[64];
    uint64_t lid;
    uint32_t blocks;
    char err[512];
    ck_assert_msg(cache_put_begin(cache, PUT_REQ(ns, &owner, keys, n, KVNODE_TIER_HOST), &lid, locs, err,
                                  sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < n; i++)
        if (locs[i].present)
            fill(slot(&locs[i]), keys[i]);
    if (lid)
        ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_WRITE, commit, &blocks, err,
                                         sizeof err), 0);
}

static void chain(int64_t *keys, size_t n, int64_t first)
{
    for (size_t i = 0; i < n; i++)
        keys[i] = first + (int64_t)i;
}

/* Fill the host tier with other blocks (settling between batches) so that
 * everything older leaves memory. */
static void push_out(int64_t first)
{
    int64_t k[16];
    for (int b = 0; b < 3; b++) {
        chain(k, 16, first + b * 16);
        put_chain(k, 16, true);
        settle();
    }
}

static bool ready_flag;
static void on_ready(void *arg)
{
    (void)arg;
    ready_flag = true;
}

/* cache_get_finish: the lease in *lid, its locations in locs, how many in *got. */
static void get_finish(struct cache_wait *w, uint64_t *lid, struct cache_loc *locs, size_t *got)
{
    struct cache_lent out = { .locs = locs };
    cache_get_finish(cache, w, &out);
    *lid = out.lease_id;
    *got = out.n;
}

/* A get that must wait for promotions; returns the wait. */
static struct cache_wait *get_waiting(const int64_t *keys, size_t n, struct cache_loc *locs)
{
    struct cache_wait *w = NULL;
    char err[256];
    ready_flag = false;
    struct cache_read_req req = { .ns = ns, .keys = keys, .n = n, .owner = &owner,
                                  .readable = owner.mapped, .ready = on_ready };
    struct cache_lent out = { .locs = locs };
    int rc = cache_get_start(cache, &req, &out, err, sizeof err, &w);
    ck_assert_int_eq(rc, CACHE_WAITING);
    ck_assert_ptr_nonnull(w);
    ck_assert(!ready_flag);   /* never from inside the start call */
    return w;
}

START_TEST(test_write_through_ghost_promote)
{
    int64_t k[8];
    struct cache_loc locs[8];
    struct cache_tiers t;
    uint64_t lid;
    size_t got;
    uint32_t blocks;

    chain(k, 8, 1000);
    put_chain(k, 8, true);
    settle();
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 8);
    push_out(5000);
    cache_match_tiers(cache, ns, k, 8, &t);
    ck_assert_uint_eq(t.matched, 8);
    ck_assert_uint_eq(t.store, 8);
    ck_assert_uint_eq(t.host, 0);
    /* 8 + 48 blocks through a 32-block tier: 24 left as ghosts */
    ck_assert_int_eq(stat_at("tiers", "store", "blocks"), 24);
    ck_assert_uint_eq(ns->stored, 24);
    /* the plain get does not promote: a ghost ends its prefix */
    {
        char err[256];
        ck_assert_int_eq(get_now(cache, ns, &owner, k, 8, &lid, locs, &got, err, sizeof err), 0);
        ck_assert_uint_eq(got, 0);
        ck_assert_uint_eq(lid, 0);
    }
    struct cache_wait *w = get_waiting(k, 8, locs);
    run_until(&ready_flag);
    get_finish(w, &lid, locs, &got);
    ck_assert_uint_eq(got, 8);
    ck_assert_uint_ne(lid, 0);
    for (size_t i = 0; i < 8; i++)
        ck_assert_msg(check(slot(&locs[i]), k[i]), "block %zu differs", i);
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_READ, false, &blocks, NULL, 0), 0);
    ck_assert_int_eq(stat_at("persist", "promotions_ok_total", NULL), 8);
    cache_match_tiers(cache, ns, k, 8, &t);
    ck_assert_uint_eq(t.host, 8);
    ck_assert_uint_eq(t.store, 0);
    ck_assert_uint_eq(ns->stored, (uint64_t)stat_at("tiers", "store", "blocks"));
    /* promoted blocks are known to be stored: not written again */
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 8 + 48);
}
END_TEST

START_TEST(test_delete_during_promotion)
{
    int64_t k[4];
    struct cache_loc locs[4];
    uint64_t lid;
    size_t got;
    uint32_t deleted;

    chain(k, 4, 2000);
    put_chain(k, 4, true);
    settle();
    push_out(6000);
    struct cache_wait *w = get_waiting(k, 4, locs);
    /* (the promotions' slots pushed as many other blocks out, as ghosts) */
    uint64_t stored = ns->stored;
    ck_assert_int_eq(cache_delete(cache, ns, k, NULL, 4, &deleted), 0);
    ck_assert_uint_eq(deleted, 4);
    ck_assert_uint_eq(ns->stored, stored - 4);
    ck_assert_int_eq(stat_at("tiers", "store", "blocks"), (json_int_t)ns->stored);
    run_until(&ready_flag);
    get_finish(w, &lid, locs, &got);
    /* the reads landed in detached entries: freed, never answered */
    ck_assert_uint_eq(got, 0);
    ck_assert_uint_eq(lid, 0);
    settle();
    ck_assert_uint_eq(cache_match(cache, ns, k, 4), 0);
    ck_assert_uint_eq(ns->reserved, 0);
}
END_TEST

START_TEST(test_requester_gone_during_promotion)
{
    int64_t k[4];
    struct cache_loc locs[4];
    struct cache_tiers t;

    chain(k, 4, 3000);
    put_chain(k, 4, true);
    settle();
    push_out(7000);
    struct cache_wait *w = get_waiting(k, 4, locs);
    uint64_t stored = ns->stored;
    /* the connection closes: its wait and its leases go */
    cache_wait_cancel(cache, w);
    cache_release_owner(cache, &owner);
    settle();
    ck_assert(!ready_flag);
    /* the promotions still completed: the blocks are in memory now */
    cache_match_tiers(cache, ns, k, 4, &t);
    ck_assert_uint_eq(t.host, 4);
    ck_assert_uint_eq(ns->stored, stored - 4);
    ck_assert_uint_eq(ns->reserved, 0);
}
END_TEST

static void on_ready_flag(void *arg)
{
    *(bool *)arg = true;
}

/* Two GETs of the same ghosts: the second waits on the first's promotions
 * (found in the cache's table of promotions in flight, by entry) instead of
 * reading them again; both get every block byte-exact. */
START_TEST(test_two_gets_share_promotions)
{
    enum { N = 6 };
    int64_t k[N];
    struct cache_loc locs[2][N];
    struct cache_wait *w[2] = { NULL, NULL };
    bool ready[2] = { false, false };
    char err[256];

    chain(k, N, 4000);
    put_chain(k, N, true);
    settle();
    push_out(8000);
    json_int_t promoted = stat_at("persist", "promotions_total", NULL);
    for (int g = 0; g < 2; g++) {
        struct cache_read_req req = { .ns = ns, .keys = k, .n = N, .owner = &owner,
                                      .readable = owner.mapped, .ready = on_ready_flag, .arg = &ready[g] };
        struct cache_lent out = { .locs = locs[g] };
        ck_assert_int_eq(cache_get_start(cache, &req, &out, err, sizeof err, &w[g]), CACHE_WAITING);
    }
    ck_assert_int_eq(stat_at("persist", "promotions_total", NULL), promoted + N);
    for (int g = 0; g < 2; g++) {
        uint64_t lid;
        size_t got;
        uint32_t blocks;
        run_until(&ready[g]);
        get_finish(w[g], &lid, locs[g], &got);
        ck_assert_uint_eq(got, N);
        for (size_t i = 0; i < N; i++)
            ck_assert_msg(check(slot(&locs[g][i]), k[i]), "get %d: block %zu differs", g, i);
        ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_READ, false, &blocks, NULL, 0), 0);
    }
    ck_assert_int_eq(stat_at("persist", "promotions_total", NULL), promoted + N);
    ck_assert_int_eq(stat_at("persist", "promotions_ok_total", NULL), promoted + N);
}
END_TEST

START_TEST(test_put_over_ghost)
{
    int64_t k[2];
    struct cache_tiers t;

    chain(k, 2, 4000);
    put_chain(k, 2, true);
    settle();
    push_out(8000);
    json_int_t written = stat_at("persist", "written_blocks_total", NULL);
    /* aborted: the ghost stays a ghost */
    put_chain(k, 2, false);
    cache_match_tiers(cache, ns, k, 2, &t);
    ck_assert_uint_eq(t.store, 2);
    ck_assert_int_eq(stat_at("tiers", "store", "blocks"), (json_int_t)ns->stored);
    ck_assert_uint_eq(ns->reserved, 0);
    /* committed: back in memory, not written to the store again */
    put_chain(k, 2, true);
    settle();
    cache_match_tiers(cache, ns, k, 2, &t);
    ck_assert_uint_eq(t.host, 2);
    /* (the puts' own evictions may have turned other ghosts' neighbours
     * into ghosts, but nothing was written: every victim was stored) */
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), written);
    ck_assert_int_eq(stat_at("tiers", "store", "blocks"), (json_int_t)ns->stored);
}
END_TEST

/* Purge (issue 31): blocks in memory and ghosts leave the index, the
 * store's copies are deleted, the answer comes from the loop (never from
 * inside cache_purge_start); puts begun before it — one over a ghost, one of
 * a new key — leave nothing when they end (aborted: no ghost comes back;
 * committed: nothing sealed), and the counts stay right. */
static bool purged_flag;
static struct cache_purge_result purged;
static void on_purged(void *arg, const struct cache_purge_result *r)
{
    (void)arg;
    purged = *r;
    purged_flag = true;
}

static void on_lookup(void *arg, int rc)
{
    ck_assert_int_eq(rc, 0);
    *(bool *)arg = true;
}

START_TEST(test_purge_memory_ghosts_and_puts_across_it)
{
    int64_t g[2], m[4], fresh[1] = { 12000 };
    struct cache_tiers t;
    struct cache_loc gl[1], fl[1];
    uint64_t glid, flid;
    uint32_t blocks;
    char err[512];

    chain(g, 2, 4000);
    put_chain(g, 2, true);
    settle();
    push_out(8000);
    cache_match_tiers(cache, ns, g, 2, &t);
    ck_assert_uint_eq(t.store, 2);
    chain(m, 4, 9000);
    put_chain(m, 4, true);
    settle();
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, g, 1, KVNODE_TIER_HOST), &glid, gl, err,
                                     sizeof err), 0);
    ck_assert(gl[0].present);
    fill(slot(&gl[0]), g[0]);
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, fresh, 1, KVNODE_TIER_HOST), &flid, fl,
                                     err, sizeof err), 0);
    fill(slot(&fl[0]), fresh[0]);

    struct cache_purge *p = NULL;
    struct cache_purge_sel sel = { .deployment_id = ns->deployment_id };
    purged_flag = false;
    ck_assert_msg(cache_purge_start(cache, &sel, on_purged, NULL, &p, err, sizeof err) == 0, "%s", err);
    ck_assert(!purged_flag);
    run_until(&purged_flag);
    ck_assert_uint_eq(purged.namespaces, 1);
    ck_assert_uint_eq(purged.store_failed, 0);
    ck_assert_uint_ge(purged.blocks, 2 + 4);
    ck_assert_int_eq(cache_lease_end(cache, &owner, glid, LEASE_WRITE, false, &blocks, err, sizeof err), 0);
    ck_assert_int_eq(cache_lease_end(cache, &owner, flid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    ck_assert_uint_eq(blocks, 0);
    settle();
    cache_match_tiers(cache, ns, g, 2, &t);
    ck_assert_uint_eq(t.matched, 0);
    cache_match_tiers(cache, ns, m, 4, &t);
    ck_assert_uint_eq(t.matched, 0);
    cache_match_tiers(cache, ns, fresh, 1, &t);
    ck_assert_uint_eq(t.matched, 0);
    ck_assert_uint_eq(ns->blocks, 0);
    ck_assert_uint_eq(ns->stored, 0);
    ck_assert_uint_eq(ns->reserved, 0);
    ck_assert_int_eq(stat_at("tiers", "store", "blocks"), 0);
    /* The store holds none of them. */
    int64_t all[7] = { g[0], g[1], m[0], m[1], m[2], m[3], fresh[0] };
    uint8_t present[7];
    bool looked = false;
    struct persist_lookup_req lr = { .ns = ns, .keys = all, .n = 7, .present = present, .done = on_lookup,
                                     .arg = &looked };
    ck_assert_int_eq(persist_exists(store, &lr), 0);
    run_until(&looked);
    for (int i = 0; i < 7; i++)
        ck_assert_msg(!present[i], "key %d still in the store", i);
    /* The namespace takes puts again. */
    put_chain(g, 2, true);
    cache_match_tiers(cache, ns, g, 2, &t);
    ck_assert_uint_eq(t.host, 2);
}
END_TEST

START_TEST(test_write_back_writes_on_eviction)
{
    int64_t k[8], more[32];
    struct cache_tiers t;

    chain(k, 8, 9000);
    put_chain(k, 8, true);
    settle();
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 0);
    /* past the high watermark (32 blocks): the background evictor writes
     * the oldest first and lets them go once written */
    chain(more, 32, 9100);
    for (int b = 0; b < 8; b++) {
        put_chain(&more[b * 4], 4, true);
        run_ms(5);
        settle();
    }
    ck_assert_int_gt(stat_at("persist", "written_blocks_total", NULL), 0);
    cache_match_tiers(cache, ns, k, 8, &t);
    ck_assert_uint_eq(t.matched, 8);
    ck_assert_uint_gt(t.store, 0);
    ck_assert_int_gt(stat_at("evictions", "host", "to_store_total"), 0);
    /* shutdown flush: everything left is written (each of the 40 blocks once) */
    ck_assert_int_eq(cache_persist_flush(cache, 5000, NULL), 0);
    cache_match_tiers(cache, ns, more, 32, &t);
    ck_assert_uint_eq(t.matched, 32);
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 40);
    ck_assert_int_eq(stat_at("persist", "file", "live_blocks"), 40);
    persist_stop(store);
    ck_assert_uint_eq(cache_persist_unwritten(cache, NULL), 0);
    ck_assert_int_eq(stat_at("persist", "stop_unwritten_total", NULL), 0);
}
END_TEST

static void put_ready(void *arg)
{
    *(int *)arg += 1;
}

/* write_through: a committed block stays in memory until its write lands.
 * A burst of puts larger than memory is told the store is the bottleneck
 * (CACHE_STORE_BOUND); waiting for the store (cache_put_wait) then lets it
 * in. Nothing leaves memory unwritten. */
START_TEST(test_burst_beyond_memory_waits_for_the_store)
{
    int64_t k[8];
    unsigned bound = 0;
    for (int b = 0; b < 8; b++) {
        struct cache_loc locs[8];
        uint64_t lid = 0;
        uint32_t blocks;
        char err[512];
        int rc;
        chain(k, 8, 20000 + b * 8);
        while ((rc = cache_put_begin(cache, PUT_REQ(ns, &owner, k, 8, KVNODE_TIER_HOST), &lid, locs, err,
                                     sizeof err)) == CACHE_STORE_BOUND) {
            struct cache_wait *w;
            int woken = 0;
            bound++;
            ck_assert_msg(strstr(err, "not yet written to the file store") != NULL, "%s", err);
            ck_assert_int_eq(cache_put_wait(cache, 5000, put_ready, &woken, &w), 0);
            for (int i = 0; i < 5000 && !woken; i++)
                run_ms(1);
            ck_assert_int_eq(woken, 1);
            cache_wait_cancel(cache, w);
        }
        ck_assert_msg(rc == 0, "%s", err);
        for (size_t i = 0; i < 8; i++)
            if (locs[i].present)
                fill(slot(&locs[i]), k[i]);
        ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    }
    settle();
    run_ms(20);
    settle();
    /* every block is in memory or in the store; none was dropped */
    json_int_t host = stat_at("tiers", "host", "blocks"), ghosts = stat_at("tiers", "store", "blocks");
    ck_assert_int_eq(host + ghosts, 64);
    ck_assert_int_eq(stat_at("evictions", "host", "dropped_total"), 0);
    ck_assert_int_eq(stat_at("persist", "dropped_total", NULL), 0);
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 64);
    ck_assert_uint_gt(bound, 0);   /* the tier did fill with unwritten blocks */
}
END_TEST

START_TEST(test_recovered_entries)
{
    struct kvs_found f[3];
    struct cache_tiers t;
    int64_t k[3] = { 77, 78, 79 };

    memset(f, 0, sizeof f);
    for (int i = 0; i < 3; i++) {
        f[i].layout = ns->layout;
        f[i].fingerprint = ns->fingerprint;
        f[i].key = k[i];
        f[i].size = BLOCK;
    }
    f[2].size = BLOCK / 2;   /* a size this namespace cannot hold: skipped */
    put_chain(&k[1], 1, true);   /* already indexed: left alone */
    settle();
    cache_add_stored(cache, f, 3);
    cache_match_tiers(cache, ns, k, 3, &t);
    ck_assert_uint_eq(t.matched, 2);
    ck_assert_uint_eq(t.store, 1);
    ck_assert_uint_eq(t.host, 1);
    ck_assert_int_eq(stat_at("persist", "recovery", "indexed"), 1);
    ck_assert_int_eq(stat_at("persist", "recovery", "skipped"), 1);
}
END_TEST

/* A recovery scan that reports a purged namespace's blocks after the purge
 * (issue 31): they are from before it — never indexed, deleted from the
 * store; a key put again since is left to its own entry (not taken for the
 * store's old copy). */
START_TEST(test_recovered_after_purge)
{
    struct kvs_found f[2];
    struct cache_tiers t;
    int64_t k[2] = { 177, 178 };
    char err[512];

    struct cache_purge *p = NULL;
    struct cache_purge_sel sel = { .deployment_id = ns->deployment_id };
    purged_flag = false;
    ck_assert_int_eq(cache_purge_start(cache, &sel, on_purged, NULL, &p, err, sizeof err), 0);
    run_until(&purged_flag);
    put_chain(&k[1], 1, true);   /* put again since the purge */
    settle();
    json_int_t deleted = stat_at("persist", "deleted_keys_total", NULL);
    memset(f, 0, sizeof f);
    for (int i = 0; i < 2; i++) {
        f[i].layout = ns->layout;
        f[i].fingerprint = ns->fingerprint;
        f[i].key = k[i];
        f[i].size = BLOCK;
    }
    cache_add_stored(cache, f, 2);
    settle();
    cache_match_tiers(cache, ns, k, 1, &t);
    ck_assert_uint_eq(t.matched, 0);
    cache_match_tiers(cache, ns, &k[1], 1, &t);
    ck_assert_uint_eq(t.host, 1);
    ck_assert_int_eq(stat_at("persist", "recovery", "indexed"), 0);
    ck_assert_int_eq(stat_at("persist", "recovery", "skipped"), 2);
    ck_assert_int_eq(stat_at("persist", "deleted_keys_total", NULL), deleted + 1);
    ck_assert_uint_eq(ns->stored, 0);
}
END_TEST

/* Write-through pins each committed block until its write lands; the order
 * the writes land in must not decide which block is oldest. Here the
 * chain's leaves land last: their keys still have deletes under way in the
 * store (each key's operations run in order), while the root half's writes
 * go at once. The chain was committed tail-first, so eviction must still
 * take its leaves first and keep the root. */
START_TEST(test_eviction_order_ignores_write_completion_order)
{
    int64_t k[16], fill_keys[24];
    uint32_t deleted = 0;
    struct cache_tiers t;

    chain(k, 8, 1);            /* the root half: new keys */
    chain(&k[8], 8, 100);      /* the leaves: keys with deletes under way */
    put_chain(&k[8], 8, true);
    settle();
    ck_assert_int_eq(cache_delete(cache, ns, &k[8], NULL, 8, &deleted), 0);
    ck_assert_uint_eq(deleted, 8);
    put_chain(k, 16, true);    /* before the loop has seen the deletes end */
    settle();
    run_ms(20);
    settle();
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 8 + 16);
    ck_assert_int_eq(stat_at("persist", "pinned_for_writes_bytes", NULL), 0);

    /* 24 more blocks into the 32-block tier: the 8 oldest of the chain go. */
    chain(fill_keys, 24, 5000);
    for (int b = 0; b < 3; b++) {
        put_chain(&fill_keys[b * 8], 8, true);
        settle();
    }
    ck_assert_int_eq(stat_at("tiers", "store", "blocks"), 8);
    cache_match_tiers(cache, ns, k, 16, &t);
    ck_assert_uint_eq(t.matched, 16);
    ck_assert_msg(t.host == 8 && t.store == 8, "%zu of the chain in memory, %zu only in the store",
                  t.host, t.store);
    for (int i = 0; i < 16; i++) {
        cache_match_tiers(cache, ns, &k[i], 1, &t);
        ck_assert_msg(i < 8 ? t.host == 1 : t.store == 1, "key %d of the chain is %s: eviction did "
                      "not take the leaves first", i, t.host ? "in memory" : "only in the store");
    }
}
END_TEST

/* ---- a full disk ------------------------------------------------------------- */

static struct rlimit fsize_saved;

/* Files of at most 32 KiB: a block's write fails (EFBIG) like on a full disk. */
static void disk_full(void)
{
    struct rlimit small;
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &fsize_saved), 0);
    small = fsize_saved;
    small.rlim_cur = 32 << 10;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
}

static void disk_room(void)
{
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &fsize_saved), 0);
}

static struct persist_counters pcounters(void)
{
    struct persist_counters pc;
    persist_get_counters(store, &pc);
    return pc;
}

/* Commit 8 blocks on a full disk; the loop runs until every write failed. */
static void commit_on_full_disk(int64_t *k)
{
    disk_full();
    chain(k, 8, 30000);
    put_chain(k, 8, true);
    for (int i = 0; i < 5000 && pcounters().failures[PERSIST_OP_WRITE][PERSIST_FAIL_NOSPACE] < 8; i++)
        run_ms(1);
    ck_assert_uint_ge(pcounters().failures[PERSIST_OP_WRITE][PERSIST_FAIL_NOSPACE], 8);
    ck_assert_int_eq(pcounters().state, PERSIST_STATE_DEGRADED);
}

/* Degraded because writes fail, the store's probe is a waiting block's
 * write: once the disk has room the first probe lands, the state is ok at
 * once, and the other blocks are written right after, whatever the retry
 * backoff had reached. */
START_TEST(test_write_probe_ends_degraded)
{
    int64_t k[8];
    commit_on_full_disk(k);
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 0);
    /* Probes while the disk is full are writes, and fail. */
    for (int i = 0; i < 5000 && pcounters().probes_failed[PERSIST_PROBE_WRITE] < 2; i++)
        run_ms(1);
    struct persist_counters pc = pcounters();
    ck_assert_uint_ge(pc.probes_failed[PERSIST_PROBE_WRITE], 2);
    ck_assert_uint_eq(pc.probes_ok[PERSIST_PROBE_WRITE], 0);
    ck_assert_uint_eq(pc.probes_ok[PERSIST_PROBE_HEALTH] + pc.probes_failed[PERSIST_PROBE_HEALTH], 0);
    ck_assert_int_eq(pc.state, PERSIST_STATE_DEGRADED);
    disk_room();
    for (int i = 0; i < 5000 && pcounters().probes_ok[PERSIST_PROBE_WRITE] == 0; i++)
        run_ms(1);
    pc = pcounters();
    ck_assert_uint_eq(pc.probes_ok[PERSIST_PROBE_WRITE], 1);
    ck_assert_int_eq(pc.state, PERSIST_STATE_OK);
    ck_assert_str_eq(persist_last_error(store), "");
    for (int i = 0; i < 5000 && stat_at("persist", "written_blocks_total", NULL) < 8; i++)
        run_ms(1);
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 8);
    /* The others went with the landed probe, not with later probes. */
    ck_assert_uint_eq(pcounters().probes_ok[PERSIST_PROBE_WRITE], 1);
    ck_assert_int_eq(stat_at("persist", "retry_pending", NULL), 0);
}
END_TEST

/* The disk has room again when the stop comes: the stop writes every block
 * that waited for a retry, at once. */
START_TEST(test_stop_writes_what_waits_for_a_retry)
{
    int64_t k[8];
    commit_on_full_disk(k);
    ck_assert_int_gt(stat_at("persist", "retry_pending", NULL) +
                     (json_int_t)pcounters().queue_depth, 0);
    disk_room();
    ck_assert_int_eq(cache_persist_flush(cache, 5000, NULL), 0);
    persist_stop(store);
    ck_assert_uint_eq(cache_persist_unwritten(cache, NULL), 0);
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 8);
    ck_assert_int_eq(stat_at("persist", "file", "live_blocks"), 8);
    ck_assert_int_eq(stat_at("persist", "stop_unwritten_total", NULL), 0);
    ck_assert_int_eq(stat_at("persist", "dropped_total", NULL), 0);
}
END_TEST

/* The disk stays full: the stop retries until its time is up, then counts
 * exactly the committed blocks it could not write. */
START_TEST(test_stop_counts_what_it_could_not_write)
{
    int64_t k[8], more[4];
    chain(more, 4, 31000);   /* written: not counted */
    put_chain(more, 4, true);
    settle();
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 4);
    commit_on_full_disk(k);
    uint64_t failed = pcounters().failures[PERSIST_OP_WRITE][PERSIST_FAIL_NOSPACE];
    ck_assert_int_eq(cache_persist_flush(cache, 300, NULL), -KVNODE_ETIMEDOUT);
    /* Tried again within the bound, more than once. */
    ck_assert_uint_ge(pcounters().failures[PERSIST_OP_WRITE][PERSIST_FAIL_NOSPACE], failed + 16);
    persist_stop(store);
    disk_room();
    ck_assert_uint_eq(cache_persist_unwritten(cache, NULL), 8);
    ck_assert_int_eq(stat_at("persist", "stop_unwritten_total", NULL), 8);
    ck_assert_int_eq(stat_at("persist", "dropped_total", NULL), 8);
    ck_assert_int_eq(stat_at("persist", "written_blocks_total", NULL), 4);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cache_persist");
    TCase *tc = tcase_create("write_through"), *wb = tcase_create("write_back");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_write_through_ghost_promote);
    tcase_add_test(tc, test_delete_during_promotion);
    tcase_add_test(tc, test_requester_gone_during_promotion);
    tcase_add_test(tc, test_two_gets_share_promotions);
    tcase_add_test(tc, test_purge_memory_ghosts_and_puts_across_it);
    tcase_add_test(tc, test_put_over_ghost);
    tcase_add_test(tc, test_recovered_entries);
    tcase_add_test(tc, test_recovered_after_purge);
    tcase_add_test(tc, test_burst_beyond_memory_waits_for_the_store);
    tcase_add_test(tc, test_write_probe_ends_degraded);
    tcase_add_test(tc, test_stop_writes_what_waits_for_a_retry);
    tcase_add_test(tc, test_stop_counts_what_it_could_not_write);
    suite_add_tcase(s, tc);
    TCase *one = tcase_create("one_worker");
    tcase_add_checked_fixture(one, setup_one_worker, teardown);
    tcase_set_timeout(one, 60);
    tcase_add_test(one, test_eviction_order_ignores_write_completion_order);
    suite_add_tcase(s, one);
    tcase_add_checked_fixture(wb, setup_wb, teardown);
    tcase_set_timeout(wb, 60);
    tcase_add_test(wb, test_write_back_writes_on_eviction);
    suite_add_tcase(s, wb);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
