/* Integration: the host tier is reserved and populated in the background
 * after the daemon serves (issue 16), slowed down with the test-only knobs
 * KVNODE_POPULATE_SIM_CHUNK_BYTES (16 MiB chunks of a 256 MiB tier) and
 * KVNODE_POPULATE_SIM_DELAY_MS.
 *
 * - puts and gets succeed while population runs and read back byte-exact;
 *   every block lies inside the part reserved at that moment (its offset in
 *   the client's mapping of the memfd, from /proc/self/maps, against
 *   tiers.host.reserved_bytes read after the put); reserved_bytes grows to
 *   capacity_bytes and populate_state reaches "done"; /metrics has
 *   kvnode_host_reserved_bytes;
 * - a burst of 48 MiB of puts at once while at most a chunk is reserved:
 *   puts that find the reserved part full wait for it to grow (no
 *   eviction, no ENOSPC), every block lies inside the reserved part and
 *   reads back byte-exact;
 * - a chunk that cannot be had (KVNODE_POPULATE_SIM_FAIL_AT_BYTES) leaves
 *   the tier at what was reserved: populate_state "failed" with the reason,
 *   /readyz stays 200 and says so, puts beyond it fail or evict, never
 *   land outside. */
#include <check.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../common/kvh_http.h"

#define BB (256u * 1024u)
#define TIER_BYTES (256ull << 20)
#define CHUNK_BYTES (16ull << 20)
#define TIER "memory.host_bytes=256MiB\nmemory.slab_bytes=1MiB\nadmin.listen=127.0.0.1:0\n"

/* Offset of p in this process's mapping of the daemon's host memfd. */
static uint64_t map_offset(const void *p)
{
    uint64_t off = kvh_host_offset(p);
    ck_assert_msg(off != UINT64_MAX, "block %p is in no mapping of the host memfd", p);
    return off;
}

struct pop_view {
    long long reserved, capacity, used;
    char state[16];
};

static struct pop_view pop_view(const kvh_daemon *d)
{
    struct pop_view v = { 0 };
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    v.reserved = kvh_json_int(st, "tiers.host.reserved_bytes");
    v.capacity = kvh_json_int(st, "tiers.host.capacity_bytes");
    v.used = kvh_json_int(st, "tiers.host.used_bytes");
    const char *s = json_string_value(kvh_json_get(st, "tiers.host.populate_state"));
    ck_assert_msg(s != NULL && v.reserved >= 0, "stats lack tiers.host.reserved_bytes / populate_state");
    snprintf(v.state, sizeof v.state, "%s", s);
    json_decref(st);
    return v;
}

/* Every block of keys[0..n) that is present lies below the reserved bytes
 * read afterwards; returns how many were present. */
static size_t assert_inside_reserved(const kvh_daemon *d, kvnode_client *c, const kvnode_key *keys,
                                     size_t n)
{
    kvnode_loc locs[64];
    kvnode_lease lease;
    size_t got = 0;
    ck_assert_uint_le(n, 64);
    KVH_OK(c, kvnode_get_begin(c, keys, n, &lease, locs, &got));
    struct pop_view v = pop_view(d);
    for (size_t i = 0; i < got; i++) {
        uint64_t off = map_offset(locs[i].ptr);
        ck_assert_msg(off + BB <= (uint64_t)v.reserved,
                      "block %zu at offset %" PRIu64 " lies beyond the reserved %lld bytes (%s)",
                      i, off, v.reserved, v.state);
    }
    if (got)
        KVH_OK(c, kvnode_get_end(c, lease));
    return got;
}

static const char *const slow_env[] = { "KVNODE_POPULATE_SIM_CHUNK_BYTES=16777216",
                                        "KVNODE_POPULATE_SIM_DELAY_MS=250", NULL };

START_TEST(puts_and_gets_while_populating)
{
    kvh_daemon d;
    kvh_spawn_opts o = { .env = slow_env };
    ck_assert_msg(kvh_start_ex(&d, TIER, &o) == 0, "kvnoded did not start: %s", kvh_error());
    kvnode_layout la = kvh_layout("pop-a", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &la, &c);

    struct pop_view v = pop_view(&d);
    ck_assert_str_eq(v.state, "running");
    ck_assert_int_eq(v.capacity, (long long)TIER_BYTES);
    ck_assert_int_lt(v.reserved, v.capacity);

    enum { PER_ROUND = 4, MAX_ROUNDS = 60 };
    kvnode_key keys[MAX_ROUNDS][PER_ROUND];
    size_t rounds = 0, during = 0;
    uint64_t t0 = kvh_now_ms();
    while (rounds < MAX_ROUNDS && kvh_now_ms() - t0 < 30000) {
        v = pop_view(&d);
        if (strcmp(v.state, "running") != 0)
            break;
        /* One slab (4 blocks) more than is used must already be reserved. */
        if (v.used + (long long)(PER_ROUND * BB) > v.reserved) {
            kvh_sleep_ms(20);
            continue;
        }
        kvh_chain(keys[rounds], PER_ROUND, 100 + rounds);
        ck_assert_msg(kvh_put(c, keys[rounds], PER_ROUND, 7 + rounds) == 0, "round %zu: %s",
                      rounds, kvh_error());
        ck_assert_uint_eq(assert_inside_reserved(&d, c, keys[rounds], PER_ROUND), PER_ROUND);
        size_t got;
        ck_assert_msg(kvh_get_zc_verify(c, keys[rounds], PER_ROUND, 7 + rounds, &got) == 0 &&
                      got == PER_ROUND, "round %zu: got %zu: %s", rounds, got, kvh_error());
        if (strcmp(pop_view(&d).state, "running") == 0)
            during++;
        rounds++;
        kvh_sleep_ms(60);
    }
    ck_assert_msg(during >= 3, "only %zu put rounds completed while population ran", during);

    /* Population ends with the whole tier reserved. */
    t0 = kvh_now_ms();
    while (strcmp((v = pop_view(&d)).state, "running") == 0 && kvh_now_ms() - t0 < 30000)
        kvh_sleep_ms(50);
    ck_assert_str_eq(v.state, "done");
    ck_assert_int_eq(v.reserved, (long long)TIER_BYTES);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.slabs_free"), 256 - (long long)rounds);

    /* Every block put during population still reads back byte-exact. */
    for (size_t r = 0; r < rounds; r++) {
        size_t got;
        ck_assert_msg(kvh_get_verify(c, keys[r], PER_ROUND, 7 + r, 0, &got) == 0 && got == PER_ROUND,
                      "round %zu after population: got %zu: %s", r, got, kvh_error());
    }

    json_t *st = kvh_stats(&d);
    const char *addr = json_string_value(json_object_get(st, "admin"));
    ck_assert_ptr_nonnull(addr);
    char *text = NULL;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/metrics", &text, NULL, 0), 200);
    char want[64];
    snprintf(want, sizeof want, "kvnode_host_reserved_bytes %llu", (unsigned long long)TIER_BYTES);
    ck_assert_msg(strstr(text, want), "/metrics lacks \"%s\"", want);
    free(text);
    json_decref(st);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(burst_never_lands_beyond_reserved)
{
    kvh_daemon d;
    kvh_spawn_opts o = { .env = slow_env };
    ck_assert_msg(kvh_start_ex(&d, TIER, &o) == 0, "kvnoded did not start: %s", kvh_error());
    kvnode_layout la = kvh_layout("pop-burst", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &la, &c);

    /* At once: 48 MiB in batches of 16 blocks, as fast as possible, while
     * at most a chunk or two of 16 MiB (250 ms each) is reserved. A put
     * that finds the reserved part full waits for it to grow. */
    struct pop_view v0 = pop_view(&d);
    ck_assert_str_eq(v0.state, "running");
    ck_assert_int_lt(v0.reserved, 48ll << 20);
    enum { BATCH = 16, BATCHES = 12 };
    kvnode_key keys[BATCHES][BATCH];
    for (int b = 0; b < BATCHES; b++) {
        kvh_chain(keys[b], BATCH, 500 + (uint64_t)b);
        int rc = kvh_put(c, keys[b], BATCH, 3 + (uint64_t)b);
        ck_assert_msg(rc == 0, "batch %d: %d %s", b, rc, kvh_error());
    }
    size_t present = 0;
    for (int b = 0; b < BATCHES; b++) {
        present += assert_inside_reserved(&d, c, keys[b], BATCH);
        size_t got;
        ck_assert_msg(kvh_get_verify(c, keys[b], BATCH, 3 + (uint64_t)b, 0, &got) == 0 &&
                      got == BATCH, "batch %d: got %zu: %s", b, got, kvh_error());
    }
    ck_assert_uint_eq(present, BATCH * BATCHES);
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.dropped_total"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(short_reservation_stays_short)
{
    kvh_daemon d;
    const char *const env[] = { "KVNODE_POPULATE_SIM_CHUNK_BYTES=16777216",
                                "KVNODE_POPULATE_SIM_FAIL_AT_BYTES=33554432", NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(&d, TIER, &o) == 0, "kvnoded did not start: %s", kvh_error());

    struct pop_view v;
    uint64_t t0 = kvh_now_ms();
    while (strcmp((v = pop_view(&d)).state, "running") == 0 && kvh_now_ms() - t0 < 20000)
        kvh_sleep_ms(20);
    ck_assert_str_eq(v.state, "failed");
    ck_assert_int_eq(v.reserved, 32ll << 20);
    json_t *st = kvh_stats(&d);
    const char *why = json_string_value(kvh_json_get(st, "tiers.host.populate_error"));
    ck_assert_msg(why && strstr(why, "No space left on device"), "populate_error: %s",
                  why ? why : "(none)");
    const char *addr = json_string_value(json_object_get(st, "admin"));
    char *text = NULL;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/readyz", &text, NULL, 0), 200);
    ck_assert_msg(strstr(text, "host memory stays at 33554432 of 268435456 bytes"), "/readyz: %s",
                  text);
    free(text);
    json_decref(st);

    /* 40 MiB of puts into 32 MiB: all of it lies inside, the rest evicts. */
    kvnode_layout la = kvh_layout("pop-short", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &la, &c);
    enum { BATCH = 16, BATCHES = 10 };
    kvnode_key keys[BATCHES][BATCH];
    for (int b = 0; b < BATCHES; b++) {
        kvh_chain(keys[b], BATCH, 900 + (uint64_t)b);
        int rc = kvh_put(c, keys[b], BATCH, 5 + (uint64_t)b);
        ck_assert_msg(rc == 0 || rc == -KVNODE_ENOSPC, "batch %d: %d %s", b, rc, kvh_error());
    }
    size_t present = 0;
    for (int b = 0; b < BATCHES; b++)
        present += assert_inside_reserved(&d, c, keys[b], BATCH);
    ck_assert_uint_le(present * BB, 32u << 20);
    ck_assert_uint_gt(present, 0);
    ck_assert_int_le(KVH_STAT(&d, "tiers.host.used_bytes"), 32ll << 20);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        puts_and_gets_while_populating,
        burst_never_lands_beyond_reserved,
        short_reservation_stays_short,
    };
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = kvh_run_suite("daemon_populate", "populate", 60, tests, sizeof tests / sizeof tests[0]);
    curl_global_cleanup();
    return rc;
}
