/* Unit tests of the cache semantics: prefix match, two-phase put, pins,
 * eviction order (leaf first, never pinned), watermarks, the reaper and lease
 * ownership. Runs the cache on a private libevent loop, no sockets. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "block_pattern.h"
#include "cache/cache.h"
#include "cache_calls.h"
#include "config/config.h"
#include "kvnode.h"
#include "core/log.h"
#include "stats.h"

#define BLOCK (64u * 1024u)

static struct event_base *base;
static struct cache *cache;
static struct kvn_config cfg;
static struct kv_namespace *ns;
static struct lease_list owner, other;

static void setup_with(uint64_t host_bytes, double high, double low)
{
    char err[512];
    struct ns_layout l = { .model = "m", .dtype = "bf16", .block_tokens = 16,
                           .block_bytes = BLOCK, .num_layers = 2, .kv_heads = 2,
                           .head_dim = 64, .tp_size = 1, .tp_rank = 0 };

    log_set_level(LOG_LEVEL_ERROR);
    config_defaults(&cfg);
    cfg.host_bytes = host_bytes;
    cfg.max_reserved_per_client = 1.0;   /* these tests reserve whole tiers at once */
    cfg.slab_bytes = 1u << 20;   /* 16 blocks per slab */
    cfg.high_watermark = high;
    cfg.low_watermark = low;
    cfg.pin_host = CONFIG_PIN_OFF;
    cfg.read_lease_ttl_ms = 20;
    cfg.write_lease_ttl_ms = 20;
    cfg.reaper_interval_ms = 10;
    base = event_base_new();
    ck_assert_ptr_nonnull(base);
    ck_assert_int_eq(cache_create(base, &cfg, &cache, err, sizeof err), 0);
    ck_assert_int_eq(cache_bind(cache, &l, &ns, err, sizeof err), 0);
    memset(&owner, 0, sizeof owner);
    memset(&other, 0, sizeof other);
}

static void setup(void) { setup_with(8u << 20, 1.0, 0.9); }

static void teardown(void)
{
    cache_release_owner(cache, &owner);
    cache_release_owner(cache, &other);
    cache_destroy(cache);
    event_base_free(base);
}

static json_int_t stat_int(const char *section, const char *sub, const char *key)
{
    json_t *root = json_object(), *v;
    json_int_t out;
    stats_cache_json(cache, root);
    v = json_object_get(root, section);
    if (sub)
        v = json_object_get(v, sub);
    v = json_object_get(v, key);
    ck_assert_msg(json_is_integer(v), "stat %s.%s.%s missing", section, sub ? sub : "", key);
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

/* Put a whole chain into namespace `into` (written and committed). Returns
 * the put_begin rc. */
static int put_chain_ns(struct kv_namespace *into, const int64_t *keys, size_t n)
{
    struct cache_loc locs[256];
    uint64_t lid;
    uint32_t blocks;
    char err[512];
    int rc = cache_put_begin(cache, PUT_REQ(into, &owner, keys, n, KVNODE_TIER_HOST), &lid, locs, err, sizeof err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (locs[i].present)
            fill(slot(&locs[i]), keys[i]);
    if (lid)
        ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    return 0;
}

static int put_chain(const int64_t *keys, size_t n)
{
    return put_chain_ns(ns, keys, n);
}

static void chain(int64_t *keys, size_t n, int64_t base_key)
{
    for (size_t i = 0; i < n; i++)
        keys[i] = base_key + (int64_t)i;
}

START_TEST(test_prefix_match_and_delete)
{
    int64_t k[10];
    uint32_t deleted;
    chain(k, 10, -100);
    ck_assert_int_eq(put_chain(k, 5), 0);
    ck_assert_uint_eq(cache_match(cache, ns, k, 10), 5);
    ck_assert_uint_eq(ns->blocks, 5);
    ck_assert_uint_eq(ns->bytes, 5u * BLOCK);
    ck_assert_int_eq(cache_delete(cache, ns, &k[2], NULL, 1, &deleted), 0);
    ck_assert_uint_eq(deleted, 1);
    ck_assert_uint_eq(cache_match(cache, ns, k, 10), 2);
    ck_assert_int_eq(cache_delete(cache, ns, &k[2], NULL, 1, &deleted), 0);
    ck_assert_uint_eq(deleted, 0);
    ck_assert_uint_eq(ns->blocks, 4);
}
END_TEST

/* MATCH looks its keys up through a pipeline whose stages run up to 16 keys
 * apart (cache_match_scan): the prefix must end exactly at the first key
 * absent, or held under another check word, wherever it lies — before,
 * inside and past the pipeline's distances — and count every key before it. */
START_TEST(test_match_prefix_ends_at_every_position)
{
    enum { N = 120 };
    int64_t stored[N], k[N];
    uint64_t words[N];
    chain(stored, N, 5000);
    ck_assert_int_eq(put_chain(stored, N), 0);
    ck_assert_uint_eq(cache_match(cache, ns, stored, N), N);
    for (size_t p = 0; p < N; p++) {
        memcpy(k, stored, sizeof k);
        k[p] = -1 - (int64_t)p;                     /* absent */
        ck_assert_uint_eq(cache_match(cache, ns, k, N), p);
        ck_assert_uint_eq(cache_match(cache, ns, k, p + 1), p);
        memset(words, 0, sizeof words);
        words[p] = 7;                               /* stored under word 0 */
        struct cache_read_req req = { .ns = ns, .keys = stored, .checks = words, .n = N };
        struct cache_tiers t;
        struct cache_wait *w;
        ck_assert_int_eq(cache_match_start(cache, &req, &t, &w), 0);
        ck_assert_ptr_null(w);
        ck_assert_uint_eq(t.matched, p);
        ck_assert_uint_eq(t.host, p);
    }
}
END_TEST

START_TEST(test_put_begin_present_abort)
{
    int64_t k[4] = { 1, 2, 2, 3 };
    struct cache_loc locs[4];
    uint64_t lid;
    uint32_t blocks;
    char err[512];

    ck_assert_int_eq(put_chain(k, 1), 0);
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, k, 4, 0), &lid, locs, err, sizeof err), 0);
    ck_assert(!locs[0].present);          /* already stored */
    ck_assert(locs[1].present);
    ck_assert(!locs[2].present);          /* repeated within the request */
    ck_assert(locs[3].present);
    ck_assert_uint_ne(lid, 0);
    /* Being written: invisible, and a second writer gets nothing to write. */
    ck_assert_uint_eq(cache_match(cache, ns, k, 2), 1);
    {
        struct cache_loc l2[1];
        uint64_t lease2;
        ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &other, &k[1], 1, 0), &lease2, l2, err, sizeof err), 0);
        ck_assert(!l2[0].present);
        ck_assert_uint_eq(lease2, 0);
    }
    ck_assert_int_eq(stat_int("tiers", "host", "used_bytes"), 3 * BLOCK);
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_WRITE, false, &blocks, err, sizeof err), 0);
    ck_assert_uint_eq(blocks, 2);
    ck_assert_int_eq(stat_int("tiers", "host", "used_bytes"), BLOCK);
    ck_assert_uint_eq(cache_match(cache, ns, k, 2), 1);
    /* The lid is gone. */
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_WRITE, true, &blocks, err, sizeof err),
                     -KVNODE_ENOLEASE);
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, k, 1, 7), &lid, locs, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "tier 7"));
}
END_TEST

START_TEST(test_lease_ownership_and_kind)
{
    int64_t k[3] = { 10, 11, 12 };
    struct cache_loc locs[3];
    uint64_t lid;
    size_t got;
    uint32_t blocks;
    char err[512];

    ck_assert_int_eq(put_chain(k, 3), 0);
    ck_assert_int_eq(get_now(cache, ns, &owner, k, 3, &lid, locs, &got, err, sizeof err), 0);
    ck_assert_uint_eq(got, 3);
    for (size_t i = 0; i < 3; i++)
        ck_assert(check(slot(&locs[i]), k[i]));
    ck_assert_int_eq(cache_lease_end(cache, &other, lid, LEASE_READ, false, &blocks, err, sizeof err),
                     -KVNODE_ENOLEASE);
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_WRITE, true, &blocks, err, sizeof err),
                     -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "read lease"));
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_READ, false, &blocks, err, sizeof err), 0);
    ck_assert_uint_eq(blocks, 3);
    /* Nothing cached -> no lid at all. */
    {
        int64_t miss = 999;
        ck_assert_int_eq(get_now(cache, ns, &owner, &miss, 1, &lid, locs, &got, err, sizeof err), 0);
        ck_assert_uint_eq(got, 0);
        ck_assert_uint_eq(lid, 0);
    }
}
END_TEST

/* 8 MiB / 64 KiB = 128 blocks. Three 40-key chains, then 20 more blocks:
 * the oldest chain loses its leaves first (commit touched it tail-first). */
START_TEST(test_eviction_leaf_first)
{
    int64_t a[40], b[40], c[40], d[20];
    chain(a, 40, 1000);
    chain(b, 40, 2000);
    chain(c, 40, 3000);
    chain(d, 20, 4000);
    ck_assert_int_eq(put_chain(a, 40), 0);
    ck_assert_int_eq(put_chain(b, 40), 0);
    ck_assert_int_eq(put_chain(c, 40), 0);
    ck_assert_int_eq(stat_int("evictions", "host", "dropped_total"), 0);
    ck_assert_int_eq(put_chain(d, 20), 0);
    ck_assert_int_eq(stat_int("evictions", "host", "dropped_total"), 12);
    ck_assert_uint_eq(cache_match(cache, ns, a, 40), 28);   /* leaves a[28..39] went */
    ck_assert_uint_eq(cache_match(cache, ns, b, 40), 40);
    ck_assert_uint_eq(cache_match(cache, ns, d, 20), 20);
    /* The matches above read (and so refreshed) a, b and d: c is now the
     * oldest and goes first, whole, leaves before roots. */
    {
        int64_t e[30];
        chain(e, 30, 5000);
        ck_assert_int_eq(put_chain(e, 30), 0);
    }
    ck_assert_uint_eq(cache_match(cache, ns, c, 40), 10);
    ck_assert_uint_eq(cache_match(cache, ns, a, 40), 28);
    ck_assert_uint_eq(cache_match(cache, ns, b, 40), 40);
    ck_assert_uint_eq(cache_match(cache, ns, d, 20), 20);
}
END_TEST

START_TEST(test_pinned_never_evicted)
{
    int64_t a[64], b[128];
    struct cache_loc locs[64], wl[128];
    uint64_t lid, wlease;
    size_t got;
    uint32_t blocks;
    char err[512];

    chain(a, 64, 1);
    chain(b, 128, 10000);
    ck_assert_int_eq(put_chain(a, 64), 0);
    ck_assert_int_eq(get_now(cache, ns, &owner, a, 64, &lid, locs, &got, err, sizeof err), 0);
    ck_assert_uint_eq(got, 64);
    /* 64 free slots: b[0..64) fits by evicting nothing pinned... */
    ck_assert_int_eq(put_chain(b, 64), 0);
    /* ...and asking for more, with everything else pinned, evicts b only. */
    ck_assert_int_eq(put_chain(&b[64], 64), 0);
    ck_assert_uint_eq(cache_match(cache, ns, a, 64), 64);
    for (size_t i = 0; i < 64; i++)
        ck_assert(check(slot(&locs[i]), a[i]));
    /* Pinned and reserved together fill the tier: ENOSPC, named. */
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &other, b, 64, 0), &wlease, wl, err, sizeof err), 0);
    {
        int64_t more = 77777;
        struct cache_loc l1[1];
        uint64_t l1lease;
        ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, &more, 1, 0), &l1lease, l1, err, sizeof err),
                         -KVNODE_ENOSPC);
        ck_assert_ptr_nonnull(strstr(err, "host tier full"));
    }
    cache_release_owner(cache, &other);
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_READ, false, &blocks, err, sizeof err), 0);
    /* Unpinned now: a new chain can push it out. */
    ck_assert_int_eq(put_chain(b, 128), 0);
    ck_assert_uint_eq(cache_match(cache, ns, a, 64), 0);
}
END_TEST

START_TEST(test_delete_while_pinned)
{
    int64_t k[2] = { 5, 6 };
    struct cache_loc locs[2];
    uint64_t lid;
    size_t got;
    uint32_t deleted, blocks;
    char err[512];

    ck_assert_int_eq(put_chain(k, 2), 0);
    ck_assert_int_eq(get_now(cache, ns, &owner, k, 2, &lid, locs, &got, err, sizeof err), 0);
    ck_assert_int_eq(cache_delete(cache, ns, k, NULL, 2, &deleted), 0);
    ck_assert_uint_eq(deleted, 2);
    ck_assert_uint_eq(cache_match(cache, ns, k, 2), 0);
    /* The reader's bytes stay valid until its lid ends. */
    ck_assert(check(slot(&locs[0]), k[0]));
    ck_assert_int_eq(stat_int("tiers", "host", "used_bytes"), 2 * BLOCK);
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_READ, false, &blocks, err, sizeof err), 0);
    ck_assert_int_eq(stat_int("tiers", "host", "used_bytes"), 0);
    /* A re-put of the key works. */
    ck_assert_int_eq(put_chain(k, 2), 0);
    ck_assert_uint_eq(cache_match(cache, ns, k, 2), 2);
}
END_TEST

static void run_loop_for_ms(int ms)
{
    struct timespec ts = { 0, 1000000L };
    for (int i = 0; i < ms; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        nanosleep(&ts, NULL);
    }
}

START_TEST(test_reaper_ends_expired_leases)
{
    int64_t k[3] = { 1, 2, 3 }, w[2] = { 50, 51 };
    struct cache_loc locs[3];
    uint64_t rlease, wlease;
    size_t got;
    uint32_t blocks;
    char err[512];

    ck_assert_int_eq(put_chain(k, 3), 0);
    ck_assert_int_eq(get_now(cache, ns, &owner, k, 3, &rlease, locs, &got, err, sizeof err), 0);
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, w, 2, 0), &wlease, locs, err, sizeof err), 0);
    ck_assert_int_eq(stat_int("leases", NULL, "read"), 1);
    ck_assert_int_eq(stat_int("leases", NULL, "write"), 1);
    run_loop_for_ms(80);
    ck_assert_int_eq(stat_int("leases", NULL, "read"), 0);
    ck_assert_int_eq(stat_int("leases", NULL, "write"), 0);
    ck_assert_int_eq(stat_int("leases", NULL, "reaped_total"), 2);
    ck_assert_int_eq(cache_lease_end(cache, &owner, wlease, LEASE_WRITE, true, &blocks, err, sizeof err),
                     -KVNODE_ENOLEASE);
    ck_assert_uint_eq(cache_match(cache, ns, w, 2), 0);
    ck_assert_int_eq(stat_int("tiers", "host", "used_bytes"), 3 * BLOCK);
    ck_assert_uint_eq(owner.count, 0);
}
END_TEST

START_TEST(test_watermarks_background_eviction)
{
    int64_t k[100];
    teardown();
    setup_with(8u << 20, 0.5, 0.25);   /* 64 blocks high, 32 low */
    chain(k, 100, 1);
    ck_assert_int_eq(put_chain(k, 60), 0);
    ck_assert_int_eq(stat_int("evictions", "host", "dropped_total"), 0);
    ck_assert_int_eq(put_chain(&k[60], 10), 0);   /* 70 > 64: eviction scheduled */
    run_loop_for_ms(5);
    ck_assert_int_le(stat_int("tiers", "host", "used_bytes"), 32 * BLOCK);
    ck_assert_int_eq(stat_int("tiers", "host", "blocks"), 32);
    ck_assert_int_eq(stat_int("evictions", "host", "dropped_total"), 38);
    /* The survivors are the newest chain's roots: k[60..70) was committed
     * last, so its ten are all there and k[0..22) (roots of the older one). */
    ck_assert_uint_eq(cache_match(cache, ns, &k[60], 10), 10);
    ck_assert_uint_eq(cache_match(cache, ns, k, 60), 22);
}
END_TEST

START_TEST(test_several_block_sizes)
{
    struct ns_layout l2 = { .model = "other", .dtype = "fp8", .block_tokens = 32,
                            .block_bytes = 100000, .num_layers = 2, .kv_heads = 2,
                            .head_dim = 64, .tp_size = 2, .tp_rank = 1 };
    struct ns_layout big = l2;
    struct kv_namespace *ns2;
    int64_t k[4] = { 1, 2, 3, 4 };
    struct cache_loc locs[4];
    uint64_t lid;
    uint32_t blocks;
    char err[512];

    ck_assert_int_eq(cache_bind(cache, &l2, &ns2, err, sizeof err), 0);
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns2, &owner, k, 4, 0), &lid, locs, err, sizeof err), 0);
    for (int i = 0; i < 4; i++) {
        ck_assert_uint_eq(locs[i].offset % 256, 0);
        memset(slot(&locs[i]), i + 1, 100000);
    }
    ck_assert_int_eq(cache_lease_end(cache, &owner, lid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    ck_assert_int_eq(put_chain(k, 4), 0);   /* same keys, other namespace */
    ck_assert_uint_eq(cache_match(cache, ns2, k, 4), 4);
    ck_assert_uint_eq(cache_match(cache, ns, k, 4), 4);
    ck_assert_uint_eq(ns2->bytes, 400000);
    /* A block larger than a slab is refused at bind, naming the limit. */
    big.model[0] = 'B';
    big.block_bytes = 2u << 20;
    ck_assert_int_eq(cache_bind(cache, &big, &ns2, err, sizeof err), -KVNODE_ELAYOUT);
    ck_assert_ptr_nonnull(strstr(err, "slab"));
}
END_TEST

/* ---- namespace quota --------------------------------------------------------- */

/* A second namespace with the same block size (so the same size class). */
static struct kv_namespace *bind_other(const char *model)
{
    char err[512];
    struct kv_namespace *out;
    struct ns_layout l = { .dtype = "bf16", .block_tokens = 16, .block_bytes = BLOCK, .num_layers = 2,
                           .kv_heads = 2, .head_dim = 64, .tp_size = 1, .tp_rank = 0 };
    snprintf(l.model, sizeof l.model, "%s", model);
    ck_assert_int_eq(cache_bind(cache, &l, &out, err, sizeof err), 0);
    return out;
}

static void set_quota(uint64_t bytes)
{
    cfg.namespace_quota = bytes;
    cache_apply_config(cache, &cfg);
}

/* The stats entry of namespace id `id`: a field of it. */
static json_int_t ns_stat(uint32_t id, const char *key)
{
    json_t *root = json_object(), *arr, *o;
    size_t i;
    json_int_t out = -1;
    stats_cache_json(cache, root);
    arr = json_object_get(root, "namespaces");
    json_array_foreach(arr, i, o) {
        if (json_integer_value(json_object_get(o, "id")) == id) {
            json_t *v = json_object_get(o, key);
            ck_assert_msg(json_is_integer(v), "namespace stat %s missing", key);
            out = json_integer_value(v);
        }
    }
    json_decref(root);
    ck_assert_int_ne(out, -1);
    return out;
}

/* A at its quota evicts its own oldest blocks, leaves first; B is untouched
 * even though B's blocks are older. */
START_TEST(test_quota_evicts_own_leaf_first)
{
    struct kv_namespace *b = bind_other("b");
    int64_t kb[12], ka[10], ka2[10];
    chain(kb, 12, 500);
    chain(ka, 10, 1000);
    chain(ka2, 10, 2000);
    set_quota(16u * BLOCK);
    ck_assert_int_eq(ns_stat(ns->id, "quota_bytes"), 16 * BLOCK);
    ck_assert_int_eq(put_chain_ns(b, kb, 12), 0);       /* B first: the tier's oldest */
    ck_assert_int_eq(put_chain(ka, 10), 0);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 0);
    ck_assert_int_eq(put_chain(ka2, 10), 0);             /* A: 20 > 16 */
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 4);
    ck_assert_int_eq(stat_int("evictions", "host", "dropped_total"), 0);
    ck_assert_uint_eq(ns->blocks, 16);
    ck_assert_uint_eq(ns->bytes, 16u * BLOCK);
    ck_assert_uint_eq(ns->reserved, 0);
    ck_assert_uint_eq(cache_match(cache, ns, ka, 10), 6);    /* ka[6..9], the leaves, went */
    ck_assert_uint_eq(cache_match(cache, ns, ka2, 10), 10);
    ck_assert_uint_eq(cache_match(cache, b, kb, 12), 12);    /* B untouched */
    ck_assert_uint_eq(b->blocks, 12);
    ck_assert_int_eq(stat_int("tiers", "host", "blocks"), 28);
}
END_TEST

/* All of A's blocks pinned: A's put fails whole with ENOSPC naming the
 * quota, B still puts; once A's reader lets go A puts again. */
START_TEST(test_quota_pinned_enospc)
{
    struct kv_namespace *b = bind_other("b");
    int64_t ka[8], kb[8], more[2] = { 7001, 7002 }, big[9];
    struct cache_loc locs[9], rlocs[8];
    uint64_t rlease, wlease = 99;
    size_t got;
    uint32_t blocks;
    char err[512];

    chain(ka, 8, 100);
    chain(kb, 8, 100);      /* same keys, other namespace */
    chain(big, 9, 9000);
    set_quota(8u * BLOCK);
    ck_assert_int_eq(put_chain(ka, 8), 0);
    ck_assert_int_eq(get_now(cache, ns, &owner, ka, 8, &rlease, rlocs, &got, err, sizeof err), 0);
    ck_assert_uint_eq(got, 8);
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, more, 2, 0), &wlease, locs, err, sizeof err),
                     -KVNODE_ENOSPC);
    ck_assert_uint_eq(wlease, 0);
    ck_assert_msg(strstr(err, "is at its quota: memory.namespace_quota = 512KiB, 512KiB held "
                              "(512KiB pinned or reserved); cannot reserve 2 blocks of 64KiB"), "%s", err);
    ck_assert_msg(strstr(err, ns->deployment_id) && strstr(err, "(rank 0)"), "%s", err);
    /* More than the whole quota at once: said so. */
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, big, 9, 0), &wlease, locs, err, sizeof err),
                     -KVNODE_ENOSPC);
    ck_assert_msg(strstr(err, "9 blocks of 64KiB do not fit in memory.namespace_quota = 512KiB"), "%s", err);
    /* Nothing reserved, nothing evicted, A's blocks intact. */
    ck_assert_uint_eq(ns->reserved, 0);
    ck_assert_int_eq(stat_int("tiers", "host", "blocks"), 8);
    ck_assert_int_eq(stat_int("leases", NULL, "write"), 0);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 0);
    ck_assert_uint_eq(cache_match(cache, ns, more, 2), 0);
    /* B is not held back by A's quota. */
    ck_assert_int_eq(put_chain_ns(b, kb, 8), 0);
    ck_assert_uint_eq(cache_match(cache, b, kb, 8), 8);
    for (size_t i = 0; i < 8; i++)
        ck_assert(check(slot(&rlocs[i]), ka[i]));
    ck_assert_uint_eq(cache_match(cache, ns, ka, 8), 8);
    /* The reader lets go: A evicts its own leaves for the new chain. */
    ck_assert_int_eq(cache_lease_end(cache, &owner, rlease, LEASE_READ, false, &blocks, err, sizeof err), 0);
    ck_assert_int_eq(put_chain(more, 2), 0);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 2);
    ck_assert_uint_eq(cache_match(cache, ns, ka, 8), 6);
    ck_assert_uint_eq(cache_match(cache, b, kb, 8), 8);
}
END_TEST

/* Quota 0 is unlimited; a quota set later (reload) applies at the next put
 * of the namespace, not before. */
START_TEST(test_quota_zero_unlimited_then_lowered)
{
    struct kv_namespace *b = bind_other("b");
    int64_t ka[100], kb[10], one = 424242, two = 434343;
    chain(ka, 100, 1);
    chain(kb, 10, 1);
    ck_assert_int_eq(ns_stat(ns->id, "quota_bytes"), 0);
    ck_assert_int_eq(put_chain(ka, 100), 0);
    ck_assert_int_eq(put_chain_ns(b, kb, 10), 0);
    ck_assert_uint_eq(ns->blocks, 100);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 0);
    set_quota(32u * BLOCK);
    ck_assert_uint_eq(ns->blocks, 100);                 /* no sweep on apply */
    ck_assert_int_eq(ns_stat(b->id, "quota_bytes"), 32 * BLOCK);
    ck_assert_int_eq(put_chain(&one, 1), 0);
    ck_assert_uint_eq(ns->blocks, 32);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 69);
    ck_assert_uint_eq(cache_match(cache, ns, ka, 100), 31);
    ck_assert_uint_eq(cache_match(cache, b, kb, 10), 10);
    /* Back to 0: unlimited again. */
    set_quota(0);
    ck_assert_int_eq(put_chain(&two, 1), 0);
    ck_assert_uint_eq(ns->blocks, 33);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 69);
}
END_TEST

/* Slots reserved by writers count toward the quota; an aborted or failed
 * reservation gives its bytes back, a committed one turns them into sealed. */
START_TEST(test_quota_counts_reserved)
{
    int64_t w1[6], s[2], w2 = 800, w3[3] = { 900, 901, 902 };
    struct cache_loc locs[6];
    uint64_t l1, l2, l3 = 99;
    uint32_t blocks;
    char err[512];

    chain(w1, 6, 600);
    chain(s, 2, 700);
    set_quota(8u * BLOCK);
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, w1, 6, 0), &l1, locs, err, sizeof err), 0);
    ck_assert_uint_eq(ns->reserved, 6u * BLOCK);
    ck_assert_int_eq(ns_stat(ns->id, "reserved_bytes"), 6 * BLOCK);
    ck_assert_int_eq(put_chain(s, 2), 0);                         /* 6 + 2 = 8: fits */
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 0);
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, &w2, 1, 0), &l2, locs, err, sizeof err), 0);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 1);   /* s[1], the leaf */
    ck_assert_uint_eq(cache_match(cache, ns, s, 2), 1);
    ck_assert_uint_eq(ns->reserved, 7u * BLOCK);
    /* Three more cannot fit even by evicting s[0] (7 reserved + 3 > 8):
     * refused before evicting anything. */
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, w3, 3, 0), &l3, locs, err, sizeof err),
                     -KVNODE_ENOSPC);
    ck_assert_uint_eq(l3, 0);
    ck_assert_msg(strstr(err, "512KiB held (448KiB pinned or reserved); cannot reserve 3 blocks"), "%s", err);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 1);
    ck_assert_uint_eq(ns->reserved, 7u * BLOCK);
    ck_assert_uint_eq(ns->bytes, 1u * BLOCK);
    ck_assert_int_eq(stat_int("tiers", "host", "blocks"), 8);
    ck_assert_uint_eq(cache_match(cache, ns, s, 2), 1);
    ck_assert_uint_eq(cache_match(cache, ns, w3, 3), 0);
    /* One more fits by evicting s[0]; its reservation is given back on abort. */
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, w3, 1, 0), &l3, locs, err, sizeof err), 0);
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 2);
    ck_assert_uint_eq(ns->bytes, 0);
    ck_assert_uint_eq(ns->reserved, 8u * BLOCK);
    ck_assert_int_eq(cache_lease_end(cache, &owner, l3, LEASE_WRITE, false, &blocks, err, sizeof err), 0);
    /* Abort gives back, commit turns reserved into sealed. */
    ck_assert_int_eq(cache_lease_end(cache, &owner, l1, LEASE_WRITE, false, &blocks, err, sizeof err), 0);
    ck_assert_uint_eq(ns->reserved, 1u * BLOCK);
    ck_assert_int_eq(cache_lease_end(cache, &owner, l2, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    ck_assert_uint_eq(ns->reserved, 0);
    ck_assert_uint_eq(ns->bytes, 1u * BLOCK);
    /* A disconnect (release) gives back a reservation too. */
    ck_assert_int_eq(cache_put_begin(cache, PUT_REQ(ns, &owner, w3, 3, 0), &l3, locs, err, sizeof err), 0);
    ck_assert_uint_eq(ns->reserved, 3u * BLOCK);
    cache_release_owner(cache, &owner);
    ck_assert_uint_eq(ns->reserved, 0);
}
END_TEST

/* A put that extends a stored prefix keeps that prefix: the namespace's
 * other blocks go first, even when the prefix is older. */
START_TEST(test_quota_keeps_extended_prefix)
{
    int64_t c[5], x[2];
    chain(c, 5, 50);
    chain(x, 2, 80);
    set_quota(5u * BLOCK);
    ck_assert_int_eq(put_chain(c, 3), 0);
    ck_assert_int_eq(put_chain(x, 2), 0);
    ck_assert_uint_eq(cache_match(cache, ns, x, 2), 2);   /* x newer than c */
    ck_assert_int_eq(put_chain(c, 5), 0);                 /* c[0..3) stored, 2 new */
    ck_assert_int_eq(stat_int("evictions", "host", "quota_total"), 2);
    ck_assert_uint_eq(cache_match(cache, ns, c, 5), 5);
    ck_assert_uint_eq(cache_match(cache, ns, x, 2), 0);
    /* With nothing else to evict, the prefix is kept and the put refused. */
    {
        int64_t longer[7];
        chain(longer, 7, 50);
        ck_assert_int_eq(put_chain(longer, 7), -KVNODE_ENOSPC);
        ck_assert_uint_eq(cache_match(cache, ns, c, 5), 5);
        ck_assert_uint_eq(ns->reserved, 0);
    }
}
END_TEST

/* Completeness events: a key is complete when every TP rank holds it. */
struct block_event { int64_t key; uint32_t rank; bool complete; int medium; };
static struct block_event events[64];
static size_t nevents;
static uint32_t dep_ranks[8];   /* the rank each "TP group connected" call came from */
static size_t ndeps;

static void on_block(void *arg, const struct kv_namespace *n, int64_t key, int medium)
{
    (void)arg;
    if (nevents < 64)
        events[nevents++] = (struct block_event){ key, n->layout.tp_rank, medium != CACHE_MEDIUM_NONE,
                                                  medium };
}

static void on_deployment(void *arg, const struct kv_namespace *n)
{
    (void)arg;
    if (ndeps < 8)
        dep_ranks[ndeps++] = n->layout.tp_rank;
}

START_TEST(test_completeness_events_tp2)
{
    char err[512];
    struct ns_layout l = { .model = "tp2", .dtype = "bf16", .block_tokens = 16,
                           .block_bytes = BLOCK, .num_layers = 2, .kv_heads = 2,
                           .head_dim = 64, .tp_size = 2, .tp_rank = 0 };
    struct kv_namespace *r0, *r1;
    int64_t k[2] = { 500, 501 };
    uint32_t deleted;

    nevents = 0;
    ndeps = 0;
    cache_set_block_observer(cache, on_block, on_deployment, NULL);
    ck_assert_int_eq(cache_bind(cache, &l, &r0, err, sizeof err), 0);
    /* rank 0 alone: nothing is complete (rank 1 has no namespace yet), the TP group is
     * not connected */
    ck_assert_int_eq(put_chain_ns(r0, k, 2), 0);
    ck_assert_uint_eq(nevents, 0);
    ck_assert_uint_eq(ndeps, 0);
    l.tp_rank = 1;
    ck_assert_int_eq(cache_bind(cache, &l, &r1, err, sizeof err), 0);
    /* the HELLO of rank 1 completes the group: one call, from rank 1 */
    ck_assert_uint_eq(ndeps, 1);
    ck_assert_uint_eq(dep_ranks[0], 1);
    ck_assert(!cache_key_complete(cache, r0, 500));
    /* rank 1 puts: both keys become complete (in host memory), one event each */
    ck_assert_int_eq(put_chain_ns(r1, k, 2), 0);
    ck_assert_uint_eq(nevents, 2);
    for (size_t i = 0; i < 2; i++) {
        ck_assert(events[i].complete);
        ck_assert_int_eq(events[i].medium, CACHE_MEDIUM_HOST);
        ck_assert_uint_eq(events[i].rank, 1);
    }
    ck_assert(cache_key_complete(cache, r0, 500) && cache_key_complete(cache, r1, 501));
    /* a duplicate put and a match (LRU touch) send nothing */
    ck_assert_int_eq(put_chain_ns(r0, k, 2), 0);
    ck_assert_uint_eq(cache_match(cache, r1, k, 2), 2);
    ck_assert_uint_eq(nevents, 2);
    /* one rank deletes a key: it stops being complete, once */
    ck_assert_int_eq(cache_delete(cache, r0, &k[1], NULL, 1, &deleted), 0);
    ck_assert_uint_eq(nevents, 3);
    ck_assert(!events[2].complete);
    ck_assert_int_eq(events[2].key, 501);
    ck_assert_uint_eq(events[2].rank, 0);
    /* the other rank deleting it too changes nothing more */
    ck_assert_int_eq(cache_delete(cache, r1, &k[1], NULL, 1, &deleted), 0);
    ck_assert_uint_eq(nevents, 3);
    cache_set_block_observer(cache, NULL, NULL, NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cache");
    TCase *tc = tcase_create("core");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_prefix_match_and_delete);
    tcase_add_test(tc, test_match_prefix_ends_at_every_position);
    tcase_add_test(tc, test_put_begin_present_abort);
    tcase_add_test(tc, test_lease_ownership_and_kind);
    tcase_add_test(tc, test_eviction_leaf_first);
    tcase_add_test(tc, test_pinned_never_evicted);
    tcase_add_test(tc, test_delete_while_pinned);
    tcase_add_test(tc, test_reaper_ends_expired_leases);
    tcase_add_test(tc, test_watermarks_background_eviction);
    tcase_add_test(tc, test_several_block_sizes);
    tcase_add_test(tc, test_quota_evicts_own_leaf_first);
    tcase_add_test(tc, test_quota_pinned_enospc);
    tcase_add_test(tc, test_quota_zero_unlimited_then_lowered);
    tcase_add_test(tc, test_quota_counts_reserved);
    tcase_add_test(tc, test_quota_keeps_extended_prefix);
    tcase_add_test(tc, test_completeness_events_tp2);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
