/* Integration: byte-exact put/get round trips through a real kvnoded.
 *
 * - Four namespaces with block sizes 4 KiB, 64 KiB, 1 MiB and an odd 100000
 *   bytes live in one daemon at once. Each stores one chain through each
 *   write path (zero-copy put_begin/commit, kvnode_put, kvnode_put_inline),
 *   and every chain is read back byte-exact through every read path
 *   (zero-copy get_begin/end, kvnode_get, kvnode_get_inline) by a second
 *   client with its own mapping of the daemon's memory.
 * - With max_frame_bytes = 1 MiB, an inline put and get of 64 blocks of
 *   64 KiB (4 MiB) must be split into several frames by the client and still
 *   round-trip exactly, with no frame rejected. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NKEYS 6

struct size_case {
    const char *model;
    uint64_t block_bytes;
};

static const struct size_case sizes[] = {
    { "rt-4k", 4096 },
    { "rt-64k", 65536 },
    { "rt-1m", 1048576 },
    { "rt-odd", 100000 },
};
#define NSIZES (sizeof sizes / sizeof sizes[0])

enum { PUT_ZC, PUT_COPY, PUT_INLINE, NPUT };
static const char *const put_names[NPUT] = { "zero-copy", "kvnode_put", "kvnode_put_inline" };

/* Keys of chain (size s, write path p): disjoint across every pair. */
static void chain_keys(kvnode_key *keys, size_t s, int p)
{
    kvh_chain(keys, NKEYS, 1000 + s * 10 + (size_t)p);
}

static uint64_t seed_of(size_t s, int p) { return 77 + s * 10 + (size_t)p; }

static void put_zero_copy(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed)
{
    size_t bb = (size_t)kvnode_block_bytes(c);
    kvnode_loc locs[NKEYS];
    kvnode_lease lease = 0;
    memset(locs, 0, sizeof locs);
    KVH_OK(c, kvnode_put_begin(c, keys, n, KVNODE_TIER_HOST, &lease, locs));
    ck_assert_msg(lease != 0, "put_begin of new keys returned lease 0");
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(locs[i].ptr != NULL, "put_begin: no slot for new key #%zu", i);
        ck_assert_int_eq(locs[i].tier, KVNODE_TIER_HOST);
        kvh_fill(locs[i].ptr, bb, keys[i], seed);
    }
    KVH_OK(c, kvnode_put_commit(c, lease));
}

START_TEST(roundtrip_all_sizes_all_paths)
{
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=160MiB\n");

    kvnode_client *w[NSIZES], *r[NSIZES];
    kvnode_layout lay[NSIZES];
    for (size_t s = 0; s < NSIZES; s++) {
        lay[s] = kvh_layout(sizes[s].model, sizes[s].block_bytes, 1, 0);
        KVH_CONNECT(&d, &lay[s], &w[s]);
        KVH_CONNECT(&d, &lay[s], &r[s]);
        ck_assert_uint_eq(kvnode_block_bytes(w[s]), sizes[s].block_bytes);
        ck_assert_uint_eq(kvnode_block_bytes(r[s]), sizes[s].block_bytes);
    }

    /* Write: each path across all namespaces before the next path, so the
     * daemon interleaves namespaces and size classes. */
    kvnode_key keys[NKEYS];
    for (int p = 0; p < NPUT; p++) {
        for (size_t s = 0; s < NSIZES; s++) {
            chain_keys(keys, s, p);
            if (p == PUT_ZC) {
                put_zero_copy(w[s], keys, NKEYS, seed_of(s, p));
            } else {
                int rc = p == PUT_COPY ? kvh_put(w[s], keys, NKEYS, seed_of(s, p))
                                       : kvh_put_inline(w[s], keys, NKEYS, seed_of(s, p));
                ck_assert_msg(rc == 0, "%s %s: %s", sizes[s].model, put_names[p], kvh_error());
            }
        }
    }

    /* Read every chain through every path with the other client. */
    for (size_t s = 0; s < NSIZES; s++) {
        for (int p = 0; p < NPUT; p++) {
            chain_keys(keys, s, p);
            size_t got;
            long m = kvh_match(r[s], keys, NKEYS);
            ck_assert_msg(m == NKEYS, "%s/%s: match %ld of %d: %s", sizes[s].model, put_names[p],
                          m, NKEYS, kvh_error());
            int rc = kvh_get_zc_verify(r[s], keys, NKEYS, seed_of(s, p), &got);
            ck_assert_msg(rc == 0 && got == NKEYS, "%s/%s get_begin: rc %d got %zu: %s",
                          sizes[s].model, put_names[p], rc, got, kvh_error());
            rc = kvh_get_verify(r[s], keys, NKEYS, seed_of(s, p), 0, &got);
            ck_assert_msg(rc == 0 && got == NKEYS, "%s/%s kvnode_get: rc %d got %zu: %s",
                          sizes[s].model, put_names[p], rc, got, kvh_error());
            rc = kvh_get_verify(r[s], keys, NKEYS, seed_of(s, p), 1, &got);
            ck_assert_msg(rc == 0 && got == NKEYS, "%s/%s kvnode_get_inline: rc %d got %zu: %s",
                          sizes[s].model, put_names[p], rc, got, kvh_error());
            /* The writer's own mapping sees the same bytes. */
            rc = kvh_get_zc_verify(w[s], keys, NKEYS, seed_of(s, p), &got);
            ck_assert_msg(rc == 0 && got == NKEYS, "%s/%s get_begin (writer): rc %d got %zu: %s",
                          sizes[s].model, put_names[p], rc, got, kvh_error());
        }
    }

    /* The daemon accounts for exactly what was stored. */
    json_t *st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    ck_assert_int_eq(json_array_size(json_object_get(st, "namespaces")), NSIZES);
    long long total = 0;
    for (size_t s = 0; s < NSIZES; s++) {
        json_t *ns = kvh_stats_namespace(st, sizes[s].model, 0);
        ck_assert_msg(ns != NULL, "%s", kvh_error());
        ck_assert_int_eq(kvh_json_int(ns, "block_bytes"), (long long)sizes[s].block_bytes);
        ck_assert_int_eq(kvh_json_int(ns, "blocks"), NPUT * NKEYS);
        ck_assert_int_eq(kvh_json_int(ns, "bytes"), (long long)(NPUT * NKEYS * sizes[s].block_bytes));
        total += NPUT * NKEYS;
    }
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.blocks"), total);
    ck_assert_int_eq(kvh_json_int(st, "leases.read"), 0);
    ck_assert_int_eq(kvh_json_int(st, "leases.write"), 0);
    ck_assert_int_eq(kvh_json_int(st, "evictions.host.dropped_total"), 0);
    json_decref(st);

    for (size_t s = 0; s < NSIZES; s++) {
        kvnode_close(w[s]);
        kvnode_close(r[s]);
    }
    KVH_STOP_DESTROY(&d);
}
END_TEST

#define CHUNK_KEYS 64
#define CHUNK_BB   65536

START_TEST(inline_put_larger_than_max_frame_is_chunked)
{
    kvh_daemon d;
    KVH_START(&d, "server.max_frame_bytes=1MiB\nmemory.host_bytes=32MiB\n");

    kvnode_layout l = kvh_layout("rt-chunk", CHUNK_BB, 1, 0);
    kvnode_client *c, *r;
    KVH_CONNECT(&d, &l, &c);
    KVH_CONNECT(&d, &l, &r);
    kvnode_key keys[CHUNK_KEYS];
    kvh_chain(keys, CHUNK_KEYS, 4242);

    json_t *st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    long long puts0 = kvh_json_int_or(st, "requests.put_inline.ok", 0);
    long long gets0 = kvh_json_int_or(st, "requests.get_inline.ok", 0);
    json_decref(st);

    /* 4 MiB of block bytes cannot travel in one 1 MiB frame. */
    int rc = kvh_put_inline(c, keys, CHUNK_KEYS, 9);
    ck_assert_msg(rc == 0, "put_inline of %d x 64 KiB with max_frame_bytes=1MiB: %s", CHUNK_KEYS,
                  kvh_error());
    long m = kvh_match(r, keys, CHUNK_KEYS);
    ck_assert_msg(m == CHUNK_KEYS, "match %ld of %d: %s", m, CHUNK_KEYS, kvh_error());

    size_t got;
    rc = kvh_get_verify(r, keys, CHUNK_KEYS, 9, 1, &got);
    ck_assert_msg(rc == 0 && got == CHUNK_KEYS, "get_inline: rc %d got %zu: %s", rc, got, kvh_error());
    rc = kvh_get_zc_verify(r, keys, CHUNK_KEYS, 9, &got);
    ck_assert_msg(rc == 0 && got == CHUNK_KEYS, "get_begin: rc %d got %zu: %s", rc, got, kvh_error());

    st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    /* Each frame carries < 1 MiB, i.e. at most 15 blocks: >= 5 requests. */
    long long puts = kvh_json_int_or(st, "requests.put_inline.ok", 0) - puts0;
    long long gets = kvh_json_int_or(st, "requests.get_inline.ok", 0) - gets0;
    ck_assert_msg(puts >= 5, "put_inline used %lld requests for 4 MiB with 1 MiB frames", puts);
    ck_assert_msg(gets >= 5, "get_inline used %lld requests for 4 MiB with 1 MiB frames", gets);
    ck_assert_int_eq(kvh_json_int_or(st, "requests.put_inline.error", 0), 0);
    ck_assert_int_eq(kvh_json_int_or(st, "requests.get_inline.error", 0), 0);
    ck_assert_int_eq(kvh_json_int(st, "frames.rejected_total"), 0);
    json_decref(st);

    kvnode_close(c);
    kvnode_close(r);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        roundtrip_all_sizes_all_paths,
        inline_put_larger_than_max_frame_is_chunked,
    };
    return kvh_run_suite("daemon_roundtrip", "roundtrip", 30, tests, sizeof tests / sizeof tests[0]);
}
