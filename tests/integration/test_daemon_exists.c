/* Integration: per-key answers for MATCH and DELETE (issue 31: LMCache's
 * exists and delete ask per key), against a real daemon.
 *
 * - HELLO offers per_key;
 * - kvnode_exists answers every key in one MATCH request (requests.match.ok
 *   grows by one): [held, missing, held, ...] is not cut at the first miss,
 *   with the tiers of the keys held; check words apply per key (a key held
 *   under another word is absent, counted in keys.check_mismatches_total);
 * - kvnode_delete_each deletes as kvnode_delete and says per key whether
 *   this call removed it, in one DELETE request; another word's key is left;
 * - the asynchronous forms fill the caller's arrays before the ticket
 *   completes, with op EXISTS / DELETE_EACH and the counts;
 * - an old-style MATCH and DELETE (no per_key, raw frames) are answered as
 *   before: a prefix and a count, with no bitmap;
 * - after a restart on the file store, keys held only in the store are
 *   present per key (and counted in the store tier);
 * - on a shared store (one redis server, two daemons): keys node A wrote,
 *   with gaps, that node B's index does not know are found per key by B in
 *   one lookup (persist.lookups_total + 1), each found key indexed (a second
 *   exists asks the store nothing), the gaps remembered as misses. */
#include <check.h>

#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvnode.pb-c.h"
#include "raw_request.h"
#include "../common/redisctl.h"

#define BB    (16u << 10)
#define N     12
#define TIER  "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\nserver.request_timeout=30s\n"
#define WA    UINT64_C(0xa11ce00000000001)
#define WB    UINT64_C(0xb0b0000000000002)

static long long stat_or0(const kvh_daemon *d, const char *path)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    long long v = kvh_json_int_or(st, path, 0);
    json_decref(st);
    return v;
}

/* Store keys[i] for every i with held[i] (one put each, word checks[i] or none). */
static void put_some(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                     const bool *held, size_t n)
{
    void *buf = malloc(BB);
    for (size_t i = 0; i < n; i++) {
        if (!held[i])
            continue;
        kvh_fill(buf, BB, keys[i], 3);
        const void *src[1] = { buf };
        KVH_OK(c, kvnode_put_batch_checked(c, &keys[i], checks ? &checks[i] : NULL, 1, src, 0));
    }
    free(buf);
}

static void words(uint64_t *w, size_t n, uint64_t word)
{
    for (size_t i = 0; i < n; i++)
        w[i] = word + i;
}

START_TEST(exists_answers_every_key_in_one_request)
{
    kvh_daemon d;
    KVH_START(&d, TIER);
    kvnode_layout l = kvh_layout("exists", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    ck_assert_int_eq(kvnode_has_per_key(c), 1);
    kvnode_key keys[N];
    uint64_t wa[N], wb[N];
    bool held[N], present[N];
    kvh_chain(keys, N, 1);
    words(wa, N, WA);
    words(wb, N, WB);
    for (size_t i = 0; i < N; i++)
        held[i] = i % 3 != 1;           /* held, missing, held, held, missing, ... */
    put_some(c, keys, wa, held, N);

    long long m0 = stat_or0(&d, "requests.match.ok");
    long long mm0 = stat_or0(&d, "keys.check_mismatches_total");
    size_t got = 99;
    KVH_OK(c, kvnode_exists(c, keys, wa, N, present, &got));
    ck_assert_int_eq(stat_or0(&d, "requests.match.ok"), m0 + 1);
    size_t want = 0;
    for (size_t i = 0; i < N; i++) {
        ck_assert_msg(present[i] == held[i], "key %zu: present %d, held %d", i, present[i], held[i]);
        want += held[i];
    }
    ck_assert_uint_eq(got, want);
    /* The prefix MATCH still stops at the first miss. */
    kvnode_tiers t;
    KVH_OK(c, kvnode_match_checked(c, keys, wa, N, &t));
    ck_assert_uint_eq(t.matched, 1);
    /* Another word: every key absent, each counted as a mismatch. */
    KVH_OK(c, kvnode_exists(c, keys, wb, N, present, &got));
    ck_assert_uint_eq(got, 0);
    for (size_t i = 0; i < N; i++)
        ck_assert(!present[i]);
    ck_assert_int_eq(stat_or0(&d, "keys.check_mismatches_total"), mm0 + (long long)want);
    /* One word wrong among the right ones: only that key is absent. */
    uint64_t mixed[N];
    memcpy(mixed, wa, sizeof mixed);
    mixed[3] = WB;
    KVH_OK(c, kvnode_exists(c, keys, mixed, N, present, &got));
    ck_assert_uint_eq(got, want - 1);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(present[i] == (held[i] && i != 3), "key %zu", i);
    /* No words: word 0 is another word here. */
    KVH_OK(c, kvnode_exists(c, keys, NULL, N, present, &got));
    ck_assert_uint_eq(got, 0);
    /* n = 0 asks nothing; NULL arrays are refused. */
    KVH_OK(c, kvnode_exists(c, keys, NULL, 0, NULL, &got));
    ck_assert_uint_eq(got, 0);
    ck_assert_int_eq(kvnode_exists(c, keys, NULL, N, NULL, &got), -KVNODE_EINVAL);
    ck_assert_int_eq(stat_or0(&d, "requests.match.ok"), m0 + 5);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(delete_each_says_which_keys)
{
    kvh_daemon d;
    KVH_START(&d, TIER);
    kvnode_layout l = kvh_layout("exists", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    uint64_t wa[N], mixed[N];
    bool held[N], deleted[N], present[N];
    kvh_chain(keys, N, 2);
    words(wa, N, WA);
    for (size_t i = 0; i < N; i++)
        held[i] = i % 2 == 0;
    put_some(c, keys, wa, held, N);
    memcpy(mixed, wa, sizeof mixed);
    mixed[4] = WB;                      /* held under WA: not this call's to delete */

    long long d0 = stat_or0(&d, "requests.delete.ok");
    size_t count = 99;
    KVH_OK(c, kvnode_delete_each(c, keys, mixed, N, deleted, &count));
    ck_assert_int_eq(stat_or0(&d, "requests.delete.ok"), d0 + 1);
    size_t want = 0;
    for (size_t i = 0; i < N; i++) {
        bool w = held[i] && i != 4;
        ck_assert_msg(deleted[i] == w, "key %zu: deleted %d, expected %d", i, deleted[i], w);
        want += w;
    }
    ck_assert_uint_eq(count, want);
    KVH_OK(c, kvnode_exists(c, keys, wa, N, present, &count));
    ck_assert_uint_eq(count, 1);
    ck_assert(present[4]);
    /* Again: nothing left to delete but key 4 under its own word. */
    KVH_OK(c, kvnode_delete_each(c, keys, wa, N, deleted, &count));
    ck_assert_uint_eq(count, 1);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(deleted[i] == (i == 4), "key %zu", i);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* Wait for `want` completions of c (bounded by the suite's timeout). */
static size_t drain_all(kvnode_client *c, kvnode_completion *out, size_t want)
{
    size_t got = 0;
    while (got < want) {
        struct pollfd p = { .fd = kvnode_event_fd(c), .events = POLLIN };
        ck_assert_int_ge(poll(&p, 1, 10000), 0);
        got += kvnode_drain(c, out + got, want - got);
    }
    return got;
}

START_TEST(async_forms_fill_the_arrays)
{
    kvh_daemon d;
    KVH_START(&d, TIER);
    kvnode_layout l = kvh_layout("exists", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    uint64_t wa[N];
    bool held[N], present[N], deleted[N];
    kvh_chain(keys, N, 3);
    words(wa, N, WA);
    for (size_t i = 0; i < N; i++)
        held[i] = i % 4 != 0;           /* the first key missing: a prefix MATCH says 0 */
    put_some(c, keys, wa, held, N);
    memset(present, 0, sizeof present);
    memset(deleted, 1, sizeof deleted);

    kvnode_ticket t1 = 0, t2 = 0;
    kvnode_completion comp[2];
    KVH_OK(c, kvnode_submit_exists(c, keys, wa, N, present, (void *)0x1, &t1));
    ck_assert_uint_gt(t1, 0);
    drain_all(c, comp, 1);
    ck_assert_uint_eq(comp[0].ticket, t1);
    ck_assert_int_eq(comp[0].op, KVNODE_OP_EXISTS);
    ck_assert_int_eq(comp[0].rc, 0);
    ck_assert_ptr_eq(comp[0].user, (void *)0x1);
    size_t want = 0;
    for (size_t i = 0; i < N; i++) {
        ck_assert_msg(present[i] == held[i], "key %zu", i);
        want += held[i];
    }
    ck_assert_uint_eq(comp[0].count, want);
    KVH_OK(c, kvnode_submit_delete_each(c, keys, wa, N, deleted, (void *)0x2, &t2));
    drain_all(c, comp, 1);
    ck_assert_int_eq(comp[0].op, KVNODE_OP_DELETE_EACH);
    ck_assert_int_eq(comp[0].rc, 0);
    ck_assert_uint_eq(comp[0].count, want);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(deleted[i] == held[i], "key %zu", i);
    ck_assert_int_eq(kvnode_submit_exists(c, keys, wa, N, NULL, NULL, &t1), -KVNODE_EINVAL);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

static Kvnode__Response *raw_call(int fd, Kvnode__Request *req, uint64_t id)
{
    uint8_t *payload;
    uint32_t len;
    req->id = id;
    raw_send_request(fd, req);
    ck_assert_msg(kvh_raw_recv_frame(fd, &payload, &len, 1u << 20, 5000) == 1, "%s", kvh_error());
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_msg(resp && resp->id == id && !resp->error, "request %" PRIu64 ": %s", id,
                  resp && resp->error ? resp->error->message : "no reply");
    return resp;
}

START_TEST(old_style_requests_answer_as_before)
{
    kvh_daemon d;
    KVH_START(&d, TIER);
    kvnode_layout l = kvh_layout("exists", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    bool held[N];
    kvh_chain(keys, N, 4);
    for (size_t i = 0; i < N; i++)
        held[i] = i != 2;
    put_some(c, keys, NULL, held, N);
    int fd = kvh_raw_connect(d.sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());
    raw_hello(fd, &l, "old-client");

    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__MatchRequest m = KVNODE__MATCH_REQUEST__INIT;
    m.n_keys = N, m.keys = keys;
    req.op_case = KVNODE__REQUEST__OP_MATCH, req.match = &m;
    Kvnode__Response *resp = raw_call(fd, &req, 2);
    ck_assert_int_eq(resp->result_case, KVNODE__RESPONSE__RESULT_MATCH);
    ck_assert_uint_eq(resp->match->matched, 2);     /* the prefix */
    ck_assert_uint_eq(resp->match->host, 2);
    ck_assert_uint_eq(resp->match->present.len, 0);
    kvnode__response__free_unpacked(resp, NULL);
    /* The same with per_key: the bitmap, bit 2 clear. */
    m.per_key = true;
    resp = raw_call(fd, &req, 3);
    ck_assert_uint_eq(resp->match->matched, N - 1);
    ck_assert_uint_eq(resp->match->host, N - 1);
    ck_assert_uint_eq(resp->match->present.len, (N + 7) / 8);
    ck_assert_uint_eq(resp->match->present.data[0], 0xfb);
    ck_assert_uint_eq(resp->match->present.data[1], 0x0f);   /* nothing past key 11 */
    kvnode__response__free_unpacked(resp, NULL);

    Kvnode__DeleteRequest del = KVNODE__DELETE_REQUEST__INIT;
    del.n_keys = 2, del.keys = keys;
    req.op_case = KVNODE__REQUEST__OP_DELETE, req.delete_ = &del;
    resp = raw_call(fd, &req, 4);
    ck_assert_int_eq(resp->result_case, KVNODE__RESPONSE__RESULT_DELETE);
    ck_assert_uint_eq(resp->delete_->deleted, 2);
    ck_assert_uint_eq(resp->delete_->each.len, 0);
    kvnode__response__free_unpacked(resp, NULL);
    del.n_keys = 4, del.per_key = true;
    resp = raw_call(fd, &req, 5);
    ck_assert_uint_eq(resp->delete_->deleted, 1);           /* keys 0, 1 gone, 2 never held */
    ck_assert_uint_eq(resp->delete_->each.len, 1);
    ck_assert_uint_eq(resp->delete_->each.data[0], 0x08);
    kvnode__response__free_unpacked(resp, NULL);
    close(fd);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- keys only in the store ---------------------------------------------------------- */

START_TEST(exists_finds_keys_only_in_the_store)
{
    char store[PATH_MAX], *cfg = NULL;
    ck_assert_msg(kvh_mkdtemp(store, sizeof store) == 0, "%s", kvh_error());
    ck_assert_int_ge(asprintf(&cfg, TIER "persist.backend=file\npersist.path=%s\npersist.fsync=never\n"
                              "persist.policy=write_through\n", store), 0);
    kvh_daemon d;
    KVH_START(&d, cfg);
    kvnode_layout l = kvh_layout("exists", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    uint64_t wa[N];
    bool held[N], present[N];
    kvh_chain(keys, N, 5);
    words(wa, N, WA);
    size_t want = 0;
    for (size_t i = 0; i < N; i++) {
        held[i] = i % 3 == 2;           /* missing, missing, held, ... */
        want += held[i];
    }
    put_some(c, keys, wa, held, N);
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(&d, "persist.written_blocks_total", (long long)want, 10000, &last) == 0,
                  "written_blocks_total stayed %lld", last);
    kvnode_close(c);
    KVH_STOP_OK(&d);
    kvh_destroy(&d);

    KVH_START(&d, cfg);
    ck_assert_msg(kvh_wait_stat(&d, "persist.recovery.indexed", (long long)want, 20000, &last) == 0,
                  "recovery indexed %lld", last);
    KVH_CONNECT(&d, &l, &c);
    kvnode_tiers t;
    size_t got = 0;
    KVH_OK(c, kvnode_exists(c, keys, wa, N, present, &got));
    ck_assert_uint_eq(got, want);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(present[i] == held[i], "key %zu", i);
    KVH_OK(c, kvnode_match_checked(c, keys + 2, wa + 2, 1, &t));
    ck_assert_uint_eq(t.store, 1);     /* only in the store, as exists counted it */
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    free(cfg);
}
END_TEST

START_TEST(exists_looks_unknown_keys_up_in_one_request)
{
    struct rctl one;
    ck_assert_msg(rctl_start(&one, 0, 0, NULL, NULL) == 0, "redis-server: %s", rctl_err);
    char *cfg = NULL;
    ck_assert_int_ge(asprintf(&cfg, TIER "persist.backend=redis\npersist.nodes=%s\n"
                              "persist.connect_timeout=300ms\npersist.timeout=5s\n"
                              "persist.lookup_negative_ttl=1h\n", one.seeds), 0);
    kvh_daemon a, b;
    KVH_START(&a, cfg);
    KVH_START(&b, cfg);
    kvnode_layout l = kvh_layout("exists-shared", BB, 1, 0);
    kvnode_client *ca, *cb;
    KVH_CONNECT(&a, &l, &ca);
    KVH_CONNECT(&b, &l, &cb);
    kvnode_key keys[N];
    uint64_t wa[N];
    bool held[N], present[N];
    kvh_chain(keys, N, 6);
    words(wa, N, WA);
    size_t want = 0;
    for (size_t i = 0; i < N; i++) {
        held[i] = i % 3 != 0;           /* missing first: a prefix MATCH would say 0 */
        want += held[i];
    }
    put_some(ca, keys, wa, held, N);
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(&a, "persist.written_blocks_total", (long long)want, 10000, &last) == 0,
                  "written_blocks_total stayed %lld", last);

    long long lookups0 = stat_or0(&b, "persist.lookups_total");
    size_t got = 0;
    KVH_OK(cb, kvnode_exists(cb, keys, wa, N, present, &got));
    ck_assert_uint_eq(got, want);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(present[i] == held[i], "key %zu: present %d, held %d", i, present[i], held[i]);
    ck_assert_int_eq(stat_or0(&b, "persist.lookups_total"), lookups0 + 1);
    /* Found keys are indexed, the gaps remembered: nothing asked again. */
    KVH_OK(cb, kvnode_exists(cb, keys, wa, N, present, &got));
    ck_assert_uint_eq(got, want);
    ck_assert_int_eq(stat_or0(&b, "persist.lookups_total"), lookups0 + 1);
    kvnode_tiers t;
    KVH_OK(cb, kvnode_match_checked(cb, keys + 1, wa + 1, 2, &t));
    ck_assert_uint_eq(t.store, 2);
    kvnode_close(ca);
    kvnode_close(cb);
    KVH_STOP_DESTROY(&a);
    KVH_STOP_DESTROY(&b);
    rctl_stop(&one);
    free(cfg);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        exists_answers_every_key_in_one_request,
        delete_each_says_which_keys,
        async_forms_fill_the_arrays,
        old_style_requests_answer_as_before,
        exists_finds_keys_only_in_the_store,
        exists_looks_unknown_keys_up_in_one_request,
    };
    return kvh_run_suite("daemon_exists", "exists", 60, tests, sizeof tests / sizeof tests[0]);
}
