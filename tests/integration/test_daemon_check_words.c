/* Integration: check words for foreign keys (issue 19 item 2), through
 * libkvnode's _checked calls against a real daemon.
 *
 * A block is stored with its key's check word; a request with another word
 * does not see it:
 * - MATCH and GET (zero-copy, copying, inline) with another word, or with
 *   none (the plain calls), miss it, and each such lookup is counted in
 *   keys.check_mismatches_total; with its word it reads back byte-exact;
 * - a PUT (copying, inline) of the key with another word stores nothing and
 *   leaves the block's bytes as they were;
 * - a DELETE with another word leaves it;
 * - in a chain, a key held under another word ends the prefix there;
 * - the asynchronous submit_*_checked calls behave the same;
 * - words survive a restart on the file store (the recovery scan indexes
 *   them, a GET promoting a store-only block keeps its word), eviction to
 *   the store, and HBM demotion to host memory (simulated HBM);
 * - a request whose checks count is neither 0 nor its key count is refused
 *   with EINVAL naming both counts (raw frame);
 * - plain calls and native keys work as before (word 0). */
#include <check.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvnode.pb-c.h"
#include "raw_request.h"
#include "../common/kvh_http.h"

#define BB    (16u << 10)
#define N     8
#define TIER  "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\nserver.request_timeout=30s\n"
#define WA    UINT64_C(0xa11ce00000000001)
#define WB    UINT64_C(0xb0b0000000000002)
#define SEED_A 101
#define SEED_B 202

static long long mismatches(const kvh_daemon *d)
{
    return KVH_STAT(d, "keys.check_mismatches_total");
}

static void words(uint64_t *w, size_t n, uint64_t word)
{
    for (size_t i = 0; i < n; i++)
        w[i] = word + i;
}

/* put_batch_checked of kvh_fill(keys[i], seed) under checks. */
static void put_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                        uint64_t seed)
{
    void *bufs[N * 8];
    ck_assert(n <= N * 8);
    for (size_t i = 0; i < n; i++) {
        bufs[i] = malloc(BB);
        kvh_fill(bufs[i], BB, keys[i], seed);
    }
    KVH_OK(c, kvnode_put_batch_checked(c, keys, checks, n, (const void *const *)bufs, 0));
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
}

/* get_batch_checked: how many came, each verified against seed. */
static size_t get_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                          uint64_t seed)
{
    void *bufs[N * 8];
    size_t got = (size_t)-1;
    ck_assert(n <= N * 8);
    for (size_t i = 0; i < n; i++)
        bufs[i] = calloc(1, BB);
    KVH_OK(c, kvnode_get_batch_checked(c, keys, checks, n, bufs, 0, &got));
    ck_assert_msg(got <= n, "get of %zu keys got %zu", n, got);
    for (size_t i = 0; i < got; i++)
        ck_assert_msg(kvh_verify(bufs[i], BB, keys[i], seed) == 0, "block #%zu: %s", i, kvh_error());
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    return got;
}

static size_t get_inline_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                                 size_t n, uint64_t seed)
{
    void *bufs[N];
    size_t got = (size_t)-1;
    ck_assert(n <= N);
    for (size_t i = 0; i < n; i++)
        bufs[i] = calloc(1, BB);
    KVH_OK(c, kvnode_get_inline_checked(c, keys, checks, n, bufs, &got));
    for (size_t i = 0; i < got; i++)
        ck_assert_msg(kvh_verify(bufs[i], BB, keys[i], seed) == 0, "inline block #%zu: %s", i,
                      kvh_error());
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    return got;
}

static size_t match_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                            size_t n, kvnode_tiers *t)
{
    kvnode_tiers tiers;
    KVH_OK(c, kvnode_match_checked(c, keys, checks, n, &tiers));
    if (t)
        *t = tiers;
    return tiers.matched;
}

/* ---- one daemon, memory only ----------------------------------------------------- */

START_TEST(mismatch_is_a_miss_and_counted)
{
    kvh_daemon d;
    KVH_START(&d, TIER "admin.listen=127.0.0.1:0\n");
    kvnode_layout l = kvh_layout("words", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    ck_assert_int_eq(kvnode_has_check_words(c), 1);
    kvnode_key keys[N];
    uint64_t wa[N], wb[N];
    kvh_chain(keys, N, 1);
    words(wa, N, WA);
    words(wb, N, WB);
    put_checked(c, keys, wa, N, SEED_A);

    long long m0 = mismatches(&d);
    ck_assert_uint_eq(match_checked(c, keys, wb, N, NULL), 0);
    ck_assert_int_eq(mismatches(&d), m0 + 1);          /* the chain's first key */
    ck_assert_uint_eq(match_checked(c, keys, wa, N, NULL), N);
    ck_assert_int_eq(mismatches(&d), m0 + 1);
    ck_assert_uint_eq(get_checked(c, keys, wa, N, SEED_A), N);
    ck_assert_uint_eq(get_checked(c, keys, wb, N, SEED_A), 0);
    ck_assert_int_eq(mismatches(&d), m0 + 2);
    ck_assert_uint_eq(get_inline_checked(c, keys, wa, N, SEED_A), N);
    ck_assert_uint_eq(get_inline_checked(c, keys, wb, N, SEED_A), 0);
    ck_assert_int_eq(mismatches(&d), m0 + 3);
    /* the zero-copy pair */
    kvnode_loc locs[N];
    kvnode_lease lease = 0;
    size_t got = 99;
    KVH_OK(c, kvnode_get_begin_checked(c, keys, wb, N, &lease, locs, &got));
    ck_assert_uint_eq(got, 0);
    ck_assert_uint_eq(lease, 0);
    KVH_OK(c, kvnode_get_begin_checked(c, keys, wa, N, &lease, locs, &got));
    ck_assert_uint_eq(got, N);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(kvh_verify(locs[i].ptr, BB, keys[i], SEED_A) == 0, "%s", kvh_error());
    KVH_OK(c, kvnode_get_end(c, lease));
    /* the plain calls send no words: word 0 is another word */
    size_t matched = 99;
    KVH_OK(c, kvnode_match(c, keys, N, &matched));
    ck_assert_uint_eq(matched, 0);
    ck_assert_uint_eq(get_checked(c, keys, NULL, N, SEED_A), 0);
    ck_assert_int_eq(mismatches(&d), m0 + 6);
    /* a wrong word in the middle of a chain ends the prefix there */
    uint64_t mixed[N];
    memcpy(mixed, wa, sizeof mixed);
    mixed[5] = WB;
    ck_assert_uint_eq(match_checked(c, keys, mixed, N, NULL), 5);
    ck_assert_uint_eq(get_checked(c, keys, mixed, N, SEED_A), 5);
    ck_assert_int_eq(mismatches(&d), m0 + 8);
    /* and in /metrics */
    json_t *st = kvh_stats(&d);
    ck_assert_ptr_nonnull(st);
    char *addr = strdup(json_string_value(json_object_get(st, "admin")));
    json_decref(st);
    char *page = NULL, want[96];
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/metrics", &page, NULL, 0), 200);
    snprintf(want, sizeof want, "\nkvnode_keys_check_mismatches_total %lld\n", m0 + 8);
    ck_assert_msg(strstr(page, want), "/metrics lacks '%s'", want + 1);
    free(page);
    free(addr);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(put_and_delete_with_another_word_leave_the_block)
{
    kvh_daemon d;
    KVH_START(&d, TIER);
    kvnode_layout l = kvh_layout("words", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    uint64_t wa[N], wb[N];
    kvh_chain(keys, N, 2);
    words(wa, N, WA);
    words(wb, N, WB);
    put_checked(c, keys, wa, N, SEED_A);
    long long m0 = mismatches(&d);

    /* another word's put: accepted, nothing stored, nothing overwritten */
    put_checked(c, keys, wb, N, SEED_B);
    ck_assert_int_eq(mismatches(&d), m0 + N);
    ck_assert_uint_eq(get_checked(c, keys, wa, N, SEED_A), N);
    ck_assert_uint_eq(get_checked(c, keys, wb, N, SEED_B), 0);
    /* inline too: every key "existing", the bytes A's */
    void *bufs[N];
    for (size_t i = 0; i < N; i++) {
        bufs[i] = malloc(BB);
        kvh_fill(bufs[i], BB, keys[i], SEED_B);
    }
    KVH_OK(c, kvnode_put_inline_checked(c, keys, wb, N, (const void *const *)bufs));
    for (size_t i = 0; i < N; i++)
        free(bufs[i]);
    ck_assert_uint_eq(get_checked(c, keys, wa, N, SEED_A), N);
    /* the zero-copy put reserves nothing for them */
    kvnode_loc locs[N];
    kvnode_lease lease = 99;
    KVH_OK(c, kvnode_put_begin_checked(c, keys, wb, N, KVNODE_TIER_HOST, &lease, locs));
    ck_assert_uint_eq(lease, 0);
    for (size_t i = 0; i < N; i++)
        ck_assert_ptr_null(locs[i].ptr);

    /* delete with another word (and with none) leaves the blocks */
    size_t deleted = 99;
    long long m1 = mismatches(&d);
    KVH_OK(c, kvnode_delete_checked(c, keys, wb, N, &deleted));
    ck_assert_uint_eq(deleted, 0);
    KVH_OK(c, kvnode_delete(c, keys, N, &deleted));
    ck_assert_uint_eq(deleted, 0);
    ck_assert_int_eq(mismatches(&d), m1 + 2 * N);
    ck_assert_uint_eq(get_checked(c, keys, wa, N, SEED_A), N);
    KVH_OK(c, kvnode_delete_checked(c, keys, wa, N, &deleted));
    ck_assert_uint_eq(deleted, N);
    ck_assert_uint_eq(match_checked(c, keys, wa, N, NULL), 0);
    /* now the other word may have the keys */
    put_checked(c, keys, wb, N, SEED_B);
    ck_assert_uint_eq(get_checked(c, keys, wb, N, SEED_B), N);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* The asynchronous calls carry the words (copied at submit). */
START_TEST(async_checked_calls)
{
    kvh_daemon d;
    KVH_START(&d, TIER);
    kvnode_layout l = kvh_layout("words", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    uint64_t *wa = malloc(N * sizeof *wa), wb[N];
    void *src[N], *dst[N];
    kvh_chain(keys, N, 3);
    words(wa, N, WA);
    words(wb, N, WB);
    for (size_t i = 0; i < N; i++) {
        src[i] = malloc(BB);
        dst[i] = calloc(1, BB);
        kvh_fill(src[i], BB, keys[i], SEED_A);
    }
    kvnode_ticket t;
    KVH_OK(c, kvnode_submit_put_checked(c, keys, wa, N, (const void *const *)src, 0, NULL, &t));
    memset(wa, 0x5a, N * sizeof *wa);   /* the call copied them */
    kvnode_completion comp[4];
    size_t nc = 0;
    for (uint64_t end = kvh_now_ms() + 10000; nc == 0 && kvh_now_ms() < end;)
        nc = kvnode_drain(c, comp, 4);
    ck_assert_uint_eq(nc, 1);
    ck_assert_int_eq(comp[0].rc, 0);
    words(wa, N, WA);

    KVH_OK(c, kvnode_submit_match_checked(c, keys, wb, N, (void *)1, &t));
    KVH_OK(c, kvnode_submit_match_checked(c, keys, wa, N, (void *)2, &t));
    KVH_OK(c, kvnode_submit_get_checked(c, keys, wa, N, dst, 0, (void *)3, &t));
    KVH_OK(c, kvnode_submit_delete_checked(c, keys, wb, N, (void *)4, &t));
    size_t seen = 0;
    for (uint64_t end = kvh_now_ms() + 10000; seen < 4 && kvh_now_ms() < end;) {
        nc = kvnode_drain(c, comp, 4);
        for (size_t i = 0; i < nc; i++, seen++) {
            ck_assert_msg(comp[i].rc == 0, "completion %p: %d %s", comp[i].user, comp[i].rc,
                          comp[i].error);
            size_t want = comp[i].user == (void *)1 || comp[i].user == (void *)4 ? 0 : N;
            ck_assert_msg(comp[i].count == want, "completion %p counted %zu, expected %zu",
                          comp[i].user, comp[i].count, want);
        }
    }
    ck_assert_uint_eq(seen, 4);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(kvh_verify(dst[i], BB, keys[i], SEED_A) == 0, "%s", kvh_error());
    ck_assert_uint_eq(match_checked(c, keys, wa, N, NULL), N);   /* the wrong-word delete left them */
    for (size_t i = 0; i < N; i++) {
        free(src[i]);
        free(dst[i]);
    }
    free(wa);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* Native keys and the plain calls work as before: word 0 is "no word", so
 * checks of zeros and NULL are the same request. */
START_TEST(plain_calls_interoperate)
{
    kvh_daemon d;
    KVH_START(&d, TIER);
    kvnode_layout l = kvh_layout("words", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    uint64_t zero[N] = { 0 };
    size_t got = 0;
    kvh_chain(keys, N, 4);
    KVH_PUT_OK(c, keys, N, SEED_A);
    ck_assert_int_eq(kvh_get_verify(c, keys, N, SEED_A, 0, &got), 0);
    ck_assert_uint_eq(got, N);
    ck_assert_uint_eq(match_checked(c, keys, zero, N, NULL), N);
    ck_assert_uint_eq(get_checked(c, keys, zero, N, SEED_A), N);
    ck_assert_uint_eq(match_checked(c, keys, NULL, N, NULL), N);
    ck_assert_int_eq(mismatches(&d), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- raw frames -------------------------------------------------------------------- */

static Kvnode__Response *recv_response(int fd, const char *what)
{
    uint8_t *payload;
    uint32_t len;
    int r = kvh_raw_recv_frame(fd, &payload, &len, 16u << 20, 5000);
    ck_assert_msg(r == 1, "%s: no response frame (%s)", what, r == 0 ? "closed" : kvh_error());
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_msg(resp != NULL, "%s: the response does not decode", what);
    return resp;
}

/* One request with nkeys keys and nchecks words: EINVAL naming both counts. */
static void expect_count_refused(int fd, uint64_t id, Kvnode__Request *req, const char *what)
{
    req->id = id;
    raw_send_request(fd, req);
    Kvnode__Response *resp = recv_response(fd, what);
    ck_assert_uint_eq(resp->id, id);
    ck_assert_msg(resp->error && resp->error->code == -KVNODE_EINVAL, "%s: code %d", what,
                  resp->error ? resp->error->code : 0);
    ck_assert_msg(strstr(resp->error->message, "1 check words for 2 keys"), "%s: %s", what,
                  resp->error->message);
    kvnode__response__free_unpacked(resp, NULL);
}

START_TEST(checks_count_must_match_keys)
{
    kvh_daemon d;
    KVH_START(&d, TIER);
    int fd = kvh_raw_connect(d.sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());
    Kvnode__Layout lay = KVNODE__LAYOUT__INIT;
    lay.model = (char *)"words";
    lay.dtype = (char *)"bf16";
    lay.block_tokens = 16;
    lay.block_bytes = BB;
    lay.num_layers = 4;
    lay.kv_heads = 8;
    lay.head_dim = 128;
    lay.tp_size = 1;
    Kvnode__HelloRequest hreq = KVNODE__HELLO_REQUEST__INIT;
    hreq.min_version = 1;
    hreq.max_version = 1;
    hreq.layout = &lay;
    hreq.client_name = (char *)"check-words-test";
    hreq.cuda_device = -1;
    Kvnode__Request hello = KVNODE__REQUEST__INIT;
    hello.id = 1;
    hello.op_case = KVNODE__REQUEST__OP_HELLO;
    hello.hello = &hreq;
    raw_send_request(fd, &hello);
    Kvnode__Response *resp = recv_response(fd, "HELLO");
    ck_assert_msg(resp->error == NULL, "HELLO: %s", resp->error ? resp->error->message : "");
    ck_assert_msg(resp->hello->check_words, "HELLO does not offer check words");
    kvnode__response__free_unpacked(resp, NULL);

    int64_t keys[2] = { 7, 8 };
    uint64_t checks[1] = { 9 };
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__MatchRequest m = KVNODE__MATCH_REQUEST__INIT;
    m.n_keys = 2, m.keys = keys, m.n_checks = 1, m.checks = checks;
    req.op_case = KVNODE__REQUEST__OP_MATCH, req.match = &m;
    expect_count_refused(fd, 2, &req, "MATCH");
    Kvnode__GetBeginRequest g = KVNODE__GET_BEGIN_REQUEST__INIT;
    g.n_keys = 2, g.keys = keys, g.n_checks = 1, g.checks = checks;
    req.op_case = KVNODE__REQUEST__OP_GET_BEGIN, req.get_begin = &g;
    expect_count_refused(fd, 3, &req, "GET_BEGIN");
    Kvnode__PutBeginRequest p = KVNODE__PUT_BEGIN_REQUEST__INIT;
    p.n_keys = 2, p.keys = keys, p.n_checks = 1, p.checks = checks;
    req.op_case = KVNODE__REQUEST__OP_PUT_BEGIN, req.put_begin = &p;
    expect_count_refused(fd, 4, &req, "PUT_BEGIN");
    Kvnode__GetInlineRequest gi = KVNODE__GET_INLINE_REQUEST__INIT;
    gi.n_keys = 2, gi.keys = keys, gi.n_checks = 1, gi.checks = checks;
    req.op_case = KVNODE__REQUEST__OP_GET_INLINE, req.get_inline = &gi;
    expect_count_refused(fd, 5, &req, "GET_INLINE");
    uint8_t *blk = calloc(2, BB);
    ProtobufCBinaryData blobs[2] = { { BB, blk }, { BB, blk + BB } };
    Kvnode__PutInlineRequest pi = KVNODE__PUT_INLINE_REQUEST__INIT;
    pi.n_keys = 2, pi.keys = keys, pi.n_checks = 1, pi.checks = checks, pi.n_blocks = 2, pi.blocks = blobs;
    req.op_case = KVNODE__REQUEST__OP_PUT_INLINE, req.put_inline = &pi;
    expect_count_refused(fd, 6, &req, "PUT_INLINE");
    free(blk);
    Kvnode__DeleteRequest del = KVNODE__DELETE_REQUEST__INIT;
    del.n_keys = 2, del.keys = keys, del.n_checks = 1, del.checks = checks;
    req.op_case = KVNODE__REQUEST__OP_DELETE, req.delete_ = &del;
    expect_count_refused(fd, 7, &req, "DELETE");
    close(fd);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.blocks"), 0);   /* nothing was stored */
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- the file store ------------------------------------------------------------------ */

static json_t *wait_recovery(const kvh_daemon *d)
{
    uint64_t deadline = kvh_now_ms() + 20000;
    for (;;) {
        json_t *st = kvh_stats(d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        if (json_is_true(kvh_json_get(st, "persist.recovery.complete")))
            return st;
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "recovery scan not complete within the deadline");
        kvh_sleep_ms(20);
    }
}

static void wait_written(const kvh_daemon *d, long long n)
{
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(d, "persist.written_blocks_total", n, 10000, &last) == 0,
                  "written_blocks_total stayed %lld, expected %lld", last, n);
}

START_TEST(words_survive_a_restart_and_eviction)
{
    char store[PATH_MAX], *cfg = NULL;
    ck_assert_msg(kvh_mkdtemp(store, sizeof store) == 0, "%s", kvh_error());
    ck_assert_int_ge(asprintf(&cfg, TIER "persist.backend=file\npersist.path=%s\npersist.fsync=never\n"
                              "persist.policy=write_through\n", store), 0);
    kvh_daemon d;
    KVH_START(&d, cfg);
    kvnode_layout l = kvh_layout("words", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    uint64_t wa[N], wb[N];
    kvh_chain(keys, N, 5);
    words(wa, N, WA);
    words(wb, N, WB);
    put_checked(c, keys, wa, N, SEED_A);
    wait_written(&d, N);
    kvnode_close(c);
    KVH_STOP_OK(&d);
    kvh_destroy(&d);

    KVH_START(&d, cfg);
    json_t *st = wait_recovery(&d);
    ck_assert_int_eq(kvh_json_int(st, "persist.recovery.indexed"), N);
    json_decref(st);
    KVH_CONNECT(&d, &l, &c);
    kvnode_tiers t;
    long long m0 = mismatches(&d);
    ck_assert_uint_eq(match_checked(c, keys, wb, N, NULL), 0);
    ck_assert_uint_eq(match_checked(c, keys, wa, N, &t), N);
    ck_assert_uint_eq(t.store, N);                     /* only in the store */
    ck_assert_uint_eq(get_checked(c, keys, wb, N, SEED_A), 0);
    ck_assert_int_eq(mismatches(&d), m0 + 2);
    /* a GET promotes them, under their word */
    ck_assert_uint_eq(get_checked(c, keys, wa, N, SEED_A), N);
    ck_assert_uint_eq(match_checked(c, keys, wa, N, &t), N);
    ck_assert_uint_eq(t.host, N);
    ck_assert_uint_eq(match_checked(c, keys, wb, N, NULL), 0);
    ck_assert_uint_eq(get_checked(c, keys, NULL, N, SEED_A), 0);

    /* evicted to the store (ghosts) by newer puts: the word stays */
    size_t more = 8u << 20 >> 14;                      /* the host tier's worth of blocks */
    kvnode_key *fill = malloc(more * sizeof *fill);
    kvh_chain(fill, more, 6);
    for (size_t at = 0; at < more; at += N)
        KVH_PUT_OK(c, fill + at, N, 7);
    free(fill);
    ck_assert_uint_eq(match_checked(c, keys, wa, N, &t), N);
    ck_assert_msg(t.store > 0, "no block of the chain left memory (host %zu store %zu)", t.host, t.store);
    ck_assert_uint_eq(match_checked(c, keys, wb, N, NULL), 0);
    ck_assert_uint_eq(get_checked(c, keys, wa, N, SEED_A), N);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    free(cfg);
}
END_TEST

/* ---- simulated HBM --------------------------------------------------------------------- */

#define SIM_CONF "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\nhbm.backend=sim\nhbm.bytes=1MiB\n"
#define ARENA_CAP 64      /* blocks per device arena (1 MiB / 16 KiB) */

START_TEST(words_survive_hbm_demotion)
{
    kvh_daemon d;
    KVH_START(&d, SIM_CONF);
    kvnode_layout l = kvh_layout("words", BB, 1, 0);
    kvnode_client *c = NULL;
    int rc = kvnode_connect_device(d.sock, &l, 0, &c);
    ck_assert_msg(rc == 0, "connect_device: %s", kvnode_connect_error());
    kvnode_key keys[N], fill[ARENA_CAP];
    uint64_t wa[N], wb[N];
    kvnode_loc locs[ARENA_CAP];
    kvnode_lease lease;
    kvh_chain(keys, N, 8);
    kvh_chain(fill, ARENA_CAP, 9);
    words(wa, N, WA);
    words(wb, N, WB);
    KVH_OK(c, kvnode_put_begin_checked(c, keys, wa, N, KVNODE_TIER_HBM, &lease, locs));
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(locs[i].tier, KVNODE_TIER_HBM);
        kvh_fill(locs[i].ptr, BB, keys[i], SEED_A);
    }
    KVH_OK(c, kvnode_put_commit(c, lease));
    /* newer HBM blocks push the arena past its watermark: the oldest (ours) go to host */
    for (size_t at = 0; at + N <= ARENA_CAP - N; at += N) {
        KVH_OK(c, kvnode_put_begin(c, fill + at, N, KVNODE_TIER_HBM, &lease, locs));
        for (size_t i = 0; i < N; i++)
            if (locs[i].ptr)
                kvh_fill(locs[i].ptr, BB, fill[at + i], 7);
        KVH_OK(c, kvnode_put_commit(c, lease));
    }
    kvnode_tiers t = { 0 };
    for (uint64_t end = kvh_now_ms() + 10000; kvh_now_ms() < end; kvh_sleep_ms(20)) {
        match_checked(c, keys, wa, N, &t);
        if (t.host == N)
            break;
    }
    ck_assert_msg(t.matched == N && t.host == N, "after demotion: matched %zu, host %zu", t.matched,
                  t.host);
    ck_assert_uint_eq(match_checked(c, keys, wb, N, NULL), 0);
    ck_assert_uint_eq(match_checked(c, keys, NULL, N, NULL), 0);
    ck_assert_uint_eq(get_checked(c, keys, wa, N, SEED_A), N);
    ck_assert_uint_eq(get_checked(c, keys, wb, N, SEED_A), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        mismatch_is_a_miss_and_counted,
        put_and_delete_with_another_word_leave_the_block,
        async_checked_calls,
        plain_calls_interoperate,
        checks_count_must_match_keys,
        words_survive_a_restart_and_eviction,
        words_survive_hbm_demotion,
    };
    return kvh_run_suite("daemon_check_words", "words", 60, tests, sizeof tests / sizeof tests[0]);
}
