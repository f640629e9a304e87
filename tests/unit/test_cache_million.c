/* Issue 32: MATCH order of eviction at 1 M blocks under the index's recency
 * stamps (a MATCH only restamps and marks what it touches; entries move when
 * they reach the oldest end). 4096 chains of 256 blocks fill the host tier,
 * every chain is MATCHed once in a random order (every block marked: the
 * longest second-chance pass there is), some of the oldest are pinned by a
 * read lease, then new chains push 64 chains' worth out. Checked by counts,
 * nothing timed: no pinned block leaves, every chain keeps a prefix (leaves
 * before roots), and, once the background settle caught up, chains leave in
 * the order they were MATCHed; when it did not, each eviction call moves at
 * most INDEX_OLDEST_SETTLE_BUDGET marked entries (a counter) and the first
 * three still hold. The same through the background evictor, which spreads
 * the moves over loop iterations. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "cache/cache.h"
#include "cache/cache_internal.h"   /* the index's counters, the settle event */
#include "cache_calls.h"
#include "config/config.h"
#include "kvnode.h"
#include "core/log.h"
#include "stats.h"

#define BLOCK    256u             /* the smallest stride */
#define CHAIN    256
#define NCHAINS  4096             /* 1 M blocks */
#define NEW      64               /* chains put after the MATCHes */
#define NPINNED  8

static struct event_base *base;
static struct cache *cache;
static struct kvn_config cfg;
static struct kv_namespace *ns;
static struct lease_list owner;

static void setup_with(double high, double low)
{
    char err[512];
    struct ns_layout l = { .model = "m", .dtype = "bf16", .block_tokens = 16,
                           .block_bytes = BLOCK, .num_layers = 2, .kv_heads = 2,
                           .head_dim = 64, .tp_size = 1, .tp_rank = 0 };

    log_set_level(LOG_LEVEL_ERROR);
    config_defaults(&cfg);
    cfg.host_bytes = (uint64_t)NCHAINS * CHAIN * BLOCK;   /* exactly the 1 M blocks */
    cfg.max_reserved_per_client = 1.0;
    cfg.slab_bytes = 1u << 20;
    cfg.high_watermark = high;
    cfg.low_watermark = low;
    cfg.pin_host = CONFIG_PIN_OFF;
    base = event_base_new();
    ck_assert_ptr_nonnull(base);
    ck_assert_int_eq(cache_create(base, &cfg, &cache, err, sizeof err), 0);
    ck_assert_int_eq(cache_bind(cache, &l, &ns, err, sizeof err), 0);
    memset(&owner, 0, sizeof owner);
}

static void setup(void) { setup_with(1.0, 0.99); }

static void teardown(void)
{
    cache_release_owner(cache, &owner);
    cache_destroy(cache);
    event_base_free(base);
}

static json_int_t dropped(void)
{
    json_t *root = json_object();
    stats_cache_json(cache, root);
    json_t *v = json_object_get(json_object_get(json_object_get(root, "evictions"), "host"), "dropped_total");
    ck_assert(json_is_integer(v));
    json_int_t out = json_integer_value(v);
    json_decref(root);
    return out;
}

static void chain_keys(int64_t *k, int c)
{
    for (int i = 0; i < CHAIN; i++)
        k[i] = (int64_t)c * 100000 + i;   /* k[0] is the root */
}

static void put(int c)
{
    int64_t k[CHAIN];
    struct cache_loc locs[CHAIN];
    uint64_t lid;
    uint32_t blocks;
    char err[512];
    chain_keys(k, c);
    ck_assert_msg(cache_put_begin(cache, PUT_REQ(ns, &owner, k, CHAIN, KVNODE_TIER_HOST), &lid, locs, err,
                                  sizeof err) == 0, "chain %d: %s", c, err);
    ck_assert_uint_ne(lid, 0);
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
}

/* Whether key i of chain c is in memory (a one-key MATCH). */
static bool present(int c, int i)
{
    int64_t k = (int64_t)c * 100000 + i;
    return cache_match(cache, ns, &k, 1) == 1;
}

static void index_stats_now(struct index_stats *st)
{
    index_get_stats(cache->index, st);
}

/* 1 M blocks, every chain MATCHed once in a random order, 8 of the oldest
 * pinned, 64 chains more put: the puts evict on demand. settle: the
 * background settle ran to its end first (as the reaper ticks make it do),
 * so each eviction is exact LRU; otherwise each eviction call meets ~1 M
 * marked entries and moves at most INDEX_OLDEST_SETTLE_BUDGET of them. */
static void match_then_evict(bool settle)
{
    static int order[NCHAINS];
    static size_t left[NCHAINS];
    uint64_t pin_lease[NPINNED];
    static struct cache_loc locs[CHAIN];
    struct index_stats st0, st;

    for (int c = 0; c < NCHAINS; c++)
        put(c);
    ck_assert_int_eq(dropped(), 0);
    /* MATCH every chain once, in a random (fixed) order. */
    for (int c = 0; c < NCHAINS; c++)
        order[c] = c;
    uint64_t x = 0x32;
    for (int c = NCHAINS - 1; c > 0; c--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((x >> 33) % (uint64_t)(c + 1)), t = order[c];
        order[c] = order[j];
        order[j] = t;
    }
    for (int p = 0; p < NCHAINS; p++) {
        int64_t k[CHAIN];
        chain_keys(k, order[p]);
        ck_assert_uint_eq(cache_match(cache, ns, k, CHAIN), CHAIN);
    }
    /* Pin every other one of the first 2 * NPINNED chains MATCHed (the
     * oldest: they would go first). */
    for (int p = 0; p < NPINNED; p++) {
        int64_t k[CHAIN];
        size_t got;
        char err[256];
        chain_keys(k, order[2 * p]);
        ck_assert_int_eq(get_now(cache, ns, &owner, k, CHAIN, &pin_lease[p], locs, &got, err, sizeof err), 0);
        ck_assert_uint_eq(got, CHAIN);
    }
    if (settle) {
        /* What a reaper tick starts: batches, one per loop iteration. */
        int iterations = 0;
        cache_settle_schedule(cache);
        while (evtimer_pending(cache->settle_ev, NULL) && iterations < 100000) {
            event_base_loop(base, EVLOOP_NONBLOCK | EVLOOP_ONCE);
            iterations++;
        }
        ck_assert_int_ge(iterations, 64);   /* ~1 M moves, 8192 per iteration */
        ck_assert(!evtimer_pending(cache->settle_ev, NULL));
    }
    index_stats_now(&st0);
    /* New chains: NEW chains' worth of blocks must leave, on demand. */
    for (int c = 0; c < NEW; c++)
        put(NCHAINS + c);
    ck_assert_int_eq(dropped(), (json_int_t)NEW * CHAIN);
    index_stats_now(&st);
    /* No eviction call moved more than its budget (~1 M were marked). */
    ck_assert_uint_le(st.oldest_moves_max, INDEX_OLDEST_SETTLE_BUDGET);
    if (settle)
        ck_assert_uint_eq(st.oldest_forced, st0.oldest_forced);
    else
        ck_assert_uint_gt(st.oldest_forced, st0.oldest_forced);
    /* Count what each chain kept, checking it is a prefix (no root went
     * while a leaf of its chain stayed). */
    size_t lost = 0;
    for (int p = 0; p < NCHAINS; p++) {
        int64_t k[CHAIN];
        chain_keys(k, order[p]);
        left[p] = cache_match(cache, ns, k, CHAIN);
        if (left[p] < CHAIN) {
            for (int i = (int)left[p]; i < CHAIN; i++)
                ck_assert_msg(!present(order[p], i), "chain %d: key %d kept after key %zu went",
                              order[p], i, left[p]);
            lost += CHAIN - left[p];
        }
    }
    ck_assert_uint_eq(lost, (size_t)NEW * CHAIN);
    /* Pinned chains whole. */
    for (int p = 0; p < NPINNED; p++)
        ck_assert_msg(left[2 * p] == CHAIN, "pinned chain %d lost %zu blocks", order[2 * p], CHAIN - left[2 * p]);
    if (settle) {
        /* The rest left oldest MATCHed first: once a chain kept anything,
         * every chain MATCHed after it kept everything. */
        bool kept_some = false;
        for (int p = 0; p < NCHAINS; p++) {
            bool pinned = p < 2 * NPINNED && p % 2 == 0;
            if (pinned)
                continue;
            if (kept_some)
                ck_assert_msg(left[p] == CHAIN, "chain MATCHed #%d lost blocks after an older one kept some", p);
            if (left[p] > 0)
                kept_some = true;
        }
        /* The first NEW unpinned chains MATCHed are the ones that went. */
        ck_assert_uint_eq(left[1], 0);
        ck_assert_uint_eq(left[2 * NPINNED + NEW - NPINNED - 1], 0);
        ck_assert_uint_eq(left[2 * NPINNED + NEW - NPINNED], CHAIN);
    }
    for (int p = 0; p < NPINNED; p++) {
        uint32_t blocks;
        ck_assert_int_eq(cache_lease_end(cache, &owner, pin_lease[p], LEASE_READ, false, &blocks, NULL, 0), 0);
    }
}

/* On demand with the backlog settled in the background: exact MATCH order. */
START_TEST(test_match_order_eviction_1m)
{
    match_then_evict(true);
}
END_TEST

/* On demand over ~1 M marked entries: each eviction call moves at most its
 * budget, and still leaves before roots, pinned never, every chain a prefix. */
START_TEST(test_bounded_eviction_1m)
{
    match_then_evict(false);
}
END_TEST

/* The background evictor after the same MATCHes: 4000 chains (97.7 %), all
 * MATCHed, 8 of the oldest pinned, then 64 chains more go past the high
 * watermark (0.99) without filling the tier. The evictor moves the marked
 * entries a batch per loop iteration (so it takes many iterations before the
 * first victim), then evicts down to the low watermark (0.98) in MATCH order. */
START_TEST(test_background_eviction_after_matches)
{
    enum { FILL = 4000 };
    static int order[FILL];
    static size_t left[FILL];
    static struct cache_loc locs[CHAIN];
    uint64_t pin_lease[NPINNED];

    teardown();
    setup_with(0.99, 0.98);
    for (int c = 0; c < FILL; c++)
        put(c);
    for (int c = 0; c < FILL; c++)
        order[c] = c;
    uint64_t x = 0x33;
    for (int c = FILL - 1; c > 0; c--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((x >> 33) % (uint64_t)(c + 1)), t = order[c];
        order[c] = order[j];
        order[j] = t;
    }
    for (int p = 0; p < FILL; p++) {
        int64_t k[CHAIN];
        chain_keys(k, order[p]);
        ck_assert_uint_eq(cache_match(cache, ns, k, CHAIN), CHAIN);
    }
    for (int p = 0; p < NPINNED; p++) {
        int64_t k[CHAIN];
        size_t got;
        char err[256];
        chain_keys(k, order[2 * p]);
        ck_assert_int_eq(get_now(cache, ns, &owner, k, CHAIN, &pin_lease[p], locs, &got, err, sizeof err), 0);
    }
    for (int c = 0; c < NEW; c++)
        put(FILL + c);
    ck_assert_int_eq(dropped(), 0);
    /* ~1 M marked entries, 8192 moved per iteration: no victim for many
     * iterations (each one a chance for the loop to serve I/O). */
    int iterations = 0;
    while (dropped() == 0 && iterations < 100000) {
        event_base_loop(base, EVLOOP_NONBLOCK | EVLOOP_ONCE);
        iterations++;
    }
    ck_assert_int_gt(dropped(), 0);
    ck_assert_int_ge(iterations, 64);
    for (json_int_t last = -1; dropped() != last;) {
        last = dropped();
        for (int j = 0; j < 64; j++)
            event_base_loop(base, EVLOOP_NONBLOCK | EVLOOP_ONCE);
    }
    size_t lost = 0;
    bool kept_some = false;
    for (int p = 0; p < FILL; p++) {
        int64_t k[CHAIN];
        chain_keys(k, order[p]);
        left[p] = cache_match(cache, ns, k, CHAIN);
        for (int i = (int)left[p]; i < CHAIN; i++)
            ck_assert_msg(!present(order[p], i), "chain %d: key %d kept after key %zu went", order[p], i, left[p]);
        lost += CHAIN - left[p];
        bool pinned = p < 2 * NPINNED && p % 2 == 0;
        if (pinned) {
            ck_assert_uint_eq(left[p], CHAIN);
            continue;
        }
        if (kept_some)
            ck_assert_msg(left[p] == CHAIN, "chain MATCHed #%d lost blocks after an older one kept some", p);
        if (left[p] > 0)
            kept_some = true;
    }
    ck_assert_uint_eq(lost, (size_t)dropped());
    ck_assert_uint_eq(left[1], 0);
    for (int p = 0; p < NPINNED; p++) {
        uint32_t blocks;
        ck_assert_int_eq(cache_lease_end(cache, &owner, pin_lease[p], LEASE_READ, false, &blocks, NULL, 0), 0);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cache_million");
    TCase *tc = tcase_create("eviction");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_match_order_eviction_1m);
    tcase_add_test(tc, test_bounded_eviction_1m);
    tcase_add_test(tc, test_background_eviction_after_matches);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
