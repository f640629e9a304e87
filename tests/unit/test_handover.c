/* Unit tests of a warm restart's cache side (cache/handover.c,
 * mem/arena_adopt.c): the sealed host blocks collected, checked, and adopted
 * by a second cache over the same memfd (bytes, LRU order, allocator state);
 * every malformed hand-over refused by cache_handover_check; blocks being
 * written never handed over. Runs the caches on a private libevent loop. */
#include <check.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "block_pattern.h"
#include "cache/cache.h"
#include "cache_calls.h"
#include "config/config.h"
#include "core/log.h"
#include "kvnode.h"
#include "mem/arena.h"

#define BLOCK (64u * 1024u)
#define NKEYS 40

static struct event_base *base;
static struct kvn_config cfg;
static struct cache *old_cache, *new_cache;
static struct kv_namespace *ns;
static struct lease_list owner;
static const struct ns_layout layout = { .model = "m", .dtype = "bf16", .block_tokens = 16, .block_bytes = BLOCK,
                                         .num_layers = 2, .kv_heads = 2, .head_dim = 64, .tp_size = 1 };

static void setup(void)
{
    char err[512];
    log_set_level(LOG_LEVEL_ERROR);
    config_defaults(&cfg);
    cfg.host_bytes = 8u << 20;
    cfg.slab_bytes = 1u << 20;   /* 16 blocks per slab */
    cfg.max_reserved_per_client = 1.0;
    cfg.pin_host = CONFIG_PIN_OFF;
    cfg.persist_backend = CONFIG_BACKEND_OFF;
    base = event_base_new();
    ck_assert_ptr_nonnull(base);
    ck_assert_int_eq(cache_create(base, &cfg, &old_cache, err, sizeof err), 0);
    ck_assert_int_eq(cache_bind(old_cache, &layout, &ns, err, sizeof err), 0);
    memset(&owner, 0, sizeof owner);
    new_cache = NULL;
}

static void teardown(void)
{
    cache_release_owner(old_cache, &owner);
    cache_destroy(old_cache);
    cache_destroy(new_cache);
    event_base_free(base);
}

static uint8_t *slot(struct cache *c, const struct cache_loc *l)
{
    return (uint8_t *)cache_arena_base(c, l->arena) + l->offset;
}

/* Keys [first, first + n) put; committed unless commit is false (the lease
 * id is then returned, open). */
static uint64_t put(int64_t first, size_t n, bool commit)
{
    int64_t keys[64];
    struct cache_loc locs[64];
    uint64_t lid;
    uint32_t blocks;
    char err[512];
    for (size_t i = 0; i < n; i++)
        keys[i] = first + (int64_t)i;
    ck_assert_int_eq(cache_put_begin(old_cache, PUT_REQ(ns, &owner, keys, n, KVNODE_TIER_HOST), &lid, locs, err,
                                     sizeof err), 0);
    for (size_t i = 0; i < n; i++)
        block_fill(slot(old_cache, &locs[i]), BLOCK, keys[i]);
    if (commit)
        ck_assert_int_eq(cache_lease_end(old_cache, &owner, lid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    return lid;
}

static int host_fd(struct cache *c)
{
    struct cache_arena_info a[4];
    size_t n = cache_arenas(c, a, 4);
    for (size_t i = 0; i < n; i++)
        if (a[i].tier == KVNODE_TIER_HOST)
            return a[i].fd;
    return -1;
}

/* The second cache over the first's memory, h adopted. */
static void adopt(const struct cache_ho *h)
{
    char err[512];
    int fd = fcntl(host_fd(old_cache), F_DUPFD_CLOEXEC, 3);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(cache_handover_check(h, NULL, cfg.host_bytes, cfg.slab_bytes, err, sizeof err), 0);
    ck_assert_msg(cache_create_adopting(base, &cfg, NULL, fd, h->reserved, &new_cache, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(cache_adopt(new_cache, h, err, sizeof err) == 0, "%s", err);
}

START_TEST(adopted_blocks_match_and_read_back_byte_exact)
{
    struct cache_ho h;
    struct kv_namespace *nns;
    struct lease_list reader = { 0 };
    int64_t keys[NKEYS];
    struct cache_loc locs[NKEYS];
    size_t got;
    uint64_t lid;
    char err[512];

    put(1, NKEYS, true);
    ck_assert_int_eq(cache_handover_collect(old_cache, &h), 0);
    ck_assert_uint_eq(h.n, NKEYS);
    ck_assert_uint_eq(h.nns, 1);
    ck_assert_uint_eq(h.bytes, (uint64_t)NKEYS * BLOCK);
    adopt(&h);
    cache_ho_free(&h);
    ck_assert_int_eq(cache_bind(new_cache, &layout, &nns, err, sizeof err), 0);
    for (int i = 0; i < NKEYS; i++)
        keys[i] = 1 + i;
    ck_assert_uint_eq(cache_match(new_cache, nns, keys, NKEYS), NKEYS);
    reader.mapped = 1;
    ck_assert_int_eq(get_now(new_cache, nns, &reader, keys, NKEYS, &lid, locs, &got, err, sizeof err), 0);
    ck_assert_uint_eq(got, NKEYS);
    for (int i = 0; i < NKEYS; i++)
        ck_assert_msg(block_check(slot(new_cache, &locs[i]), BLOCK, keys[i]), "block %d differs", i);
    cache_release_owner(new_cache, &reader);
    struct cache_stats *st = malloc(sizeof *st);
    cache_get_stats(new_cache, st);
    ck_assert_uint_eq(st->adopted_blocks, NKEYS);
    ck_assert_uint_eq(st->host.blocks, NKEYS);
    free(st);
}
END_TEST

/* The allocator knows the adopted slots: new blocks land elsewhere. */
START_TEST(new_puts_never_take_an_adopted_slot)
{
    struct cache_ho h;
    struct kv_namespace *nns;
    struct lease_list w = { 0 };
    int64_t keys[64];
    struct cache_loc locs[64];
    uint64_t lid, taken[NKEYS];
    uint32_t blocks;
    char err[512];

    put(1, NKEYS, true);
    ck_assert_int_eq(cache_handover_collect(old_cache, &h), 0);
    for (size_t i = 0; i < h.n; i++)
        taken[i] = h.blocks[i].offset;
    adopt(&h);
    cache_ho_free(&h);
    ck_assert_int_eq(cache_bind(new_cache, &layout, &nns, err, sizeof err), 0);
    /* 128 slots in all: 40 adopted, 64 more fit without evicting. */
    for (int i = 0; i < 64; i++)
        keys[i] = 1000 + i;
    ck_assert_int_eq(cache_put_begin(new_cache, PUT_REQ(nns, &w, keys, 64, KVNODE_TIER_HOST), &lid, locs, err,
                                     sizeof err), 0);
    for (int i = 0; i < 64; i++) {
        ck_assert(locs[i].present);
        for (int k = 0; k < NKEYS; k++)
            ck_assert_msg(locs[i].offset != taken[k], "new block %d at adopted offset %llu", i,
                          (unsigned long long)taken[k]);
    }
    ck_assert_int_eq(cache_lease_end(new_cache, &w, lid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    cache_release_owner(new_cache, &w);
    keys[0] = 1;
    ck_assert_uint_eq(cache_match(new_cache, nns, keys, 1), 1);
}
END_TEST

/* Unsealed blocks (an open put lease) are never handed over. */
START_TEST(blocks_being_written_are_not_handed_over)
{
    struct cache_ho h;
    put(1, 8, true);
    put(100, 8, false);
    ck_assert_int_eq(cache_handover_collect(old_cache, &h), 0);
    ck_assert_uint_eq(h.n, 8);
    for (size_t i = 0; i < h.n; i++)
        ck_assert_int_lt(h.blocks[i].key, 100);
    cache_ho_free(&h);
}
END_TEST

/* Oldest use first, so adoption rebuilds the LRU order. */
START_TEST(blocks_come_oldest_use_first)
{
    struct cache_ho h;
    int64_t k = 3;
    put(1, 8, true);
    ck_assert_uint_eq(cache_match(old_cache, ns, &k, 1), 1);   /* key 3 used last */
    ck_assert_int_eq(cache_handover_collect(old_cache, &h), 0);
    ck_assert_uint_eq(h.n, 8);
    ck_assert_int_eq(h.blocks[h.n - 1].key, 3);
    cache_ho_free(&h);
}
END_TEST

/* Each way a hand-over can be wrong is refused before anything is touched. */
START_TEST(malformed_handovers_are_refused)
{
    struct cache_ho h, bad;
    char err[512];
    put(1, 20, true);
    ck_assert_int_eq(cache_handover_collect(old_cache, &h), 0);
    ck_assert_int_eq(cache_handover_check(&h, NULL, cfg.host_bytes, cfg.slab_bytes, err, sizeof err), 0);
    struct cache_ho_block *blocks = malloc(h.n * sizeof *blocks);
    struct ns_layout lay = h.layouts[0];
    uint64_t fp = h.fingerprints[0];
    bad = h;
    bad.blocks = blocks;
    bad.layouts = &lay;
    bad.fingerprints = &fp;
#define REFUSED(what, edit)                                                                        \
    do {                                                                                           \
        memcpy(blocks, h.blocks, h.n * sizeof *blocks);                                            \
        lay = h.layouts[0];                                                                        \
        fp = h.fingerprints[0];                                                                    \
        edit;                                                                                      \
        ck_assert_msg(cache_handover_check(&bad, NULL, cfg.host_bytes, cfg.slab_bytes, err, sizeof err) == \
                      -KVNODE_EINVAL, "%s accepted", what);                                        \
    } while (0)
    REFUSED("a block past the arena", blocks[3].offset = cfg.host_bytes);
    REFUSED("a block off its slot", blocks[3].offset += 256);
    REFUSED("two blocks at one offset", blocks[4].offset = blocks[5].offset);
    REFUSED("a namespace index out of range", blocks[2].ns = 7);
    REFUSED("another tenant's fingerprint", fp ^= 1);
    REFUSED("an invalid layout", lay.tp_rank = lay.tp_size);
    REFUSED("an unterminated model", memset(lay.model, 'x', sizeof lay.model));
    REFUSED("a block larger than a slab", (lay.block_bytes = cfg.slab_bytes * 2, fp = ns_fingerprint(&lay)));
#undef REFUSED
    /* The same blocks, a named tenant: its fingerprints differ. */
    ck_assert_int_eq(cache_handover_check(&h, "other", cfg.host_bytes, cfg.slab_bytes, err, sizeof err),
                     -KVNODE_EINVAL);
    /* Two block sizes in one slab. */
    struct ns_layout two[2] = { h.layouts[0], h.layouts[0] };
    uint64_t fps[2];
    two[1].block_bytes = BLOCK / 2;
    fps[0] = ns_fingerprint(&two[0]);
    fps[1] = ns_fingerprint(&two[1]);
    memcpy(blocks, h.blocks, h.n * sizeof *blocks);
    bad.layouts = two;
    bad.fingerprints = fps;
    bad.nns = 2;
    blocks[0].ns = 1;
    ck_assert_int_eq(cache_handover_check(&bad, NULL, cfg.host_bytes, cfg.slab_bytes, err, sizeof err),
                     -KVNODE_EINVAL);
    free(blocks);
    cache_ho_free(&h);
}
END_TEST

/* The arena refuses what the check would have: a taken slot, another class. */
START_TEST(arena_adoption_refuses_taken_or_foreign_slots)
{
    struct arena *a;
    uint32_t c64, c32;
    char err[256];
    int fd = fcntl(host_fd(old_cache), F_DUPFD_CLOEXEC, 3);
    ck_assert_int_eq(arena_adopt_host(0, fd, cfg.host_bytes, cfg.slab_bytes, 0, &a, err, sizeof err), 0);
    ck_assert_int_eq(arena_class_for(a, BLOCK, &c64), 0);
    ck_assert_int_eq(arena_class_for(a, BLOCK / 2, &c32), 0);
    ck_assert_int_eq(arena_adopt_block(a, c64, 0), 0);
    ck_assert_int_eq(arena_adopt_block(a, c64, 0), -KVNODE_EINVAL);          /* taken */
    ck_assert_int_eq(arena_adopt_block(a, c32, BLOCK), -KVNODE_EINVAL);      /* slab of another class */
    ck_assert_int_eq(arena_adopt_block(a, c64, 256), -KVNODE_EINVAL);        /* off its slot */
    ck_assert_int_eq(arena_adopt_block(a, c64, cfg.host_bytes), -KVNODE_EINVAL);
    ck_assert_int_eq(arena_adopt_block(a, c32, 1u << 20), 0);                /* a free slab */
    arena_adopt_done(a);
    uint64_t off;
    ck_assert_int_eq(arena_alloc(a, c64, &off), 0);
    ck_assert_uint_eq(off, BLOCK);   /* the next slot of the partly used slab */
    struct arena_stats st;
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.blocks, 3);
    ck_assert_uint_eq(st.slabs_free, st.slabs_total - 2);
    arena_destroy(a);
    /* A memfd of another size is not this geometry's. */
    fd = fcntl(host_fd(old_cache), F_DUPFD_CLOEXEC, 3);
    ck_assert_int_lt(arena_adopt_host(0, fd, cfg.host_bytes / 2, cfg.slab_bytes, 0, &a, err, sizeof err), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("handover");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, adopted_blocks_match_and_read_back_byte_exact);
    tcase_add_test(tc, new_puts_never_take_an_adopted_slot);
    tcase_add_test(tc, blocks_being_written_are_not_handed_over);
    tcase_add_test(tc, blocks_come_oldest_use_first);
    tcase_add_test(tc, malformed_handovers_are_refused);
    tcase_add_test(tc, arena_adoption_refuses_taken_or_foreign_slots);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
