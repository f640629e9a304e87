/* Integration tests of the KVS front end as a generic object store (issue 30,
 * item 1 of "What to build"): with the default [kvs_server] options every TP
 * rank is served (ranks 0-15 of one deployment and a second deployment of
 * another TP size on the same node), and objects of different sizes share a
 * (deployment, rank, group), each read back byte-exact whatever its size.
 *
 * With KVCM on (the simulator, tests/sim/kvcm_sim.c) and the default
 * tp_size, each rank is published as a model deployment of its own, holding
 * exactly the blocks that rank sealed.
 *
 * Driven as rtp-llm's client does (kvs_client.h): acquire(create), copy into
 * the mapping, seal, release; acquire(read), copy out, release. Every wait is
 * bounded; assertions are on statuses and bytes. */
#include <check.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"
#include "../common/kvh_http.h"
#include "../sim/kvcmctl.h"

#define DEP_A   "ranks-a-0123456789abcdef"    /* TP 16 */
#define DEP_B   "ranks-b-fedcba9876543210"    /* TP 2 */
#define BLOCK   8192u
#define NBLOCKS 4

/* A daemon with the default [kvs_server] options (only enabled and its two
 * addresses); extra: more assignments outside [kvs_server]. */
static void env_start(kvs_env *e, const char *extra)
{
    kvs_env_init(e);
    kvs_env_boot(e, extra);
}

static void open_ok(kvsc *c, const kvs_env *e)
{
    char why[256];
    ck_assert_msg(kvsc_open(c, e->url, e->kvs_sock, why, sizeof why) == 0, "kvsc_open: %s", why);
}

/* The last error text of the daemon's reply to a create of one key. */
static void create_error(const kvsc *c, const char *key, uint64_t size, char *err, size_t errlen)
{
    char *body = kvsc_acquire_body("create", &key, 1, size, 60);
    kvsc_reply r;
    snprintf(err, errlen, "-");
    if (body && kvsc_call(c->url, "acquire", body, &r) == 0) {
        snprintf(err, errlen, "%ld %s", r.status, json_string_value(json_object_get(r.body, "error")) ?: "");
        const char *lease = kvsc_lease_id(&r);
        if (r.status == 200 && *lease)
            kvsc_lease_call(c, "discard", lease);
        kvsc_reply_free(&r);
    }
    free(body);
}

/* Store NBLOCKS objects of (dep, rank) and read them back byte-exact. */
static void rank_round_trip(const kvsc *c, const char *dep, uint32_t rank, uint32_t salt)
{
    char keys[NBLOCKS][256];
    const char *kp[NBLOCKS];
    static uint8_t in[NBLOCKS][BLOCK], out[NBLOCKS][BLOCK];
    const uint8_t *ip[NBLOCKS];
    uint8_t *op[NBLOCKS];
    bool found[NBLOCKS];
    size_t hits = 0;

    for (int i = 0; i < NBLOCKS; i++) {
        snprintf(keys[i], sizeof keys[i], "rtp_llm/v1/%s/tp-%u/group-0/block-%d", dep, rank, 1000 + i);
        kp[i] = keys[i];
        bfill(in[i], BLOCK, 1000 + i, salt + rank);
        ip[i] = in[i];
        memset(out[i], 0, BLOCK);
        op[i] = out[i];
    }
    long st = kvsc_store(c, kp, NBLOCKS, ip, BLOCK, 60);
    if (st != 0) {
        char err[512];
        create_error(c, kp[0], BLOCK, err, sizeof err);
        ck_abort_msg("store of %s tp-%u answered %ld (a create now answers: %s)", dep, rank, st, err);
    }
    ck_assert_int_eq(kvsc_read(c, kp, NBLOCKS, op, BLOCK, 60, &hits, found), 0);
    ck_assert_msg(hits == NBLOCKS, "%s tp-%u: %zu of %d objects read", dep, rank, hits, NBLOCKS);
    for (int i = 0; i < NBLOCKS; i++)
        ck_assert_msg(memcmp(in[i], out[i], BLOCK) == 0, "%s tp-%u block %d differs", dep, rank, i);
}

/* ---- every rank, default options ------------------------------------------------- */

/* An engine of TP 16 (ranks 0-15) and one of TP 2 on one node, with the
 * default [kvs_server] options: every rank's objects are stored and read
 * back byte-exact, and the ranks do not see each other's objects. */
START_TEST(every_rank_is_served_with_the_default_options)
{
    kvs_env e;
    kvsc c;

    env_start(&e, "");
    open_ok(&c, &e);
    for (uint32_t r = 0; r < 16; r++)
        rank_round_trip(&c, DEP_A, r, 1);
    for (uint32_t r = 0; r < 2; r++)
        rank_round_trip(&c, DEP_B, r, 100);
    /* Read again after every write: one rank's objects are not another's. */
    for (uint32_t r = 0; r < 16; r++) {
        char key[256];
        const char *kp = key;
        uint8_t want[BLOCK], got[BLOCK], *op = got;
        size_t hits = 0;
        snprintf(key, sizeof key, "rtp_llm/v1/%s/tp-%u/group-0/block-1000", DEP_A, r);
        bfill(want, BLOCK, 1000, 1 + r);
        ck_assert_int_eq(kvsc_read(&c, &kp, 1, &op, BLOCK, 60, &hits, NULL), 0);
        ck_assert_uint_eq(hits, 1);
        ck_assert_msg(memcmp(want, got, BLOCK) == 0, "tp-%u's block changed after the other ranks' writes", r);
    }
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- objects of different sizes in one group ----------------------------------- */

#define NSIZES 6

/* Objects of 64 B, 8 KiB, 32 KiB, 4 MiB and two odd sizes (rtp-llm's object
 * is its block's iovecs back to back: 3 iovs of 4097 + 123 + 8125 bytes, and
 * 2 of 1 + 99,999) in one (deployment, rank, group): each is stored in its
 * own create, then all are read back in one acquire(read), byte-exact, each
 * reported at least as large as it is (the earlier client checks that). A
 * create of several sizes at once is served too. */
START_TEST(objects_of_different_sizes_share_a_group)
{
    static const uint64_t sizes[NSIZES] = { 64, 8192, 32768, 4u << 20, 4097 + 123 + 8125, 1 + 99999 };
    kvs_env e;
    kvsc c;
    char keys[NSIZES][256];
    const char *kp[NSIZES];
    uint8_t *want[NSIZES];

    env_start(&e, "memory.slab_bytes=4MiB\n");
    open_ok(&c, &e);
    for (int i = 0; i < NSIZES; i++) {
        snprintf(keys[i], sizeof keys[i], "rtp_llm/v1/%s/tp-0/group-0/block-%d", DEP_A, -7 - i);
        kp[i] = keys[i];
        want[i] = malloc(sizes[i]);
        ck_assert_ptr_nonnull(want[i]);
        bfill(want[i], sizes[i], i, 7);
        const uint8_t *ip = want[i];
        long st = kvsc_store(&c, &kp[i], 1, &ip, sizes[i], 60);
        if (st != 0) {
            char err[512];
            create_error(&c, kp[i], sizes[i], err, sizeof err);
            ck_abort_msg("store of a %" PRIu64 "-byte object answered %ld (a create now answers: %s)", sizes[i],
                         st, err);
        }
    }
    /* One read of every object, as a match sends them. */
    char *body = kvsc_acquire_body("read", kp, NSIZES, 0, 60);
    kvsc_reply r;
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);
    free(body);
    ck_assert_int_eq(r.status, 200);
    for (int i = 0; i < NSIZES; i++) {
        uint64_t off, sz;
        ck_assert_msg(kvsc_object(&r, kp[i], &off, &sz), "the %" PRIu64 "-byte object is not found", sizes[i]);
        ck_assert_msg(sz >= sizes[i] && off + sizes[i] <= c.size, "the %" PRIu64 "-byte object is reported as %"
                      PRIu64 " bytes at %" PRIu64, sizes[i], sz, off);
        ck_assert_msg(memcmp(c.base + off, want[i], sizes[i]) == 0, "the %" PRIu64 "-byte object differs",
                      sizes[i]);
    }
    ck_assert_int_eq(kvsc_lease_call(&c, "release", kvsc_lease_id(&r)), 204);
    kvsc_reply_free(&r);

    /* One create of objects of three sizes at once. */
    json_t *o = json_pack("{s:s, s:[], s:[], s:i, s:s, s:b}", "scope", "create", "object_keys", "object_metas",
                          "term", 60, "request_id", "kvs_store_mixed", "ignore_existing", 1);
    static const uint64_t mixed[3] = { 128, 4096, 100 };
    char mk[3][256];
    const char *mkp[3];
    uint8_t mb[3][4096];
    for (int i = 0; i < 3; i++) {
        snprintf(mk[i], sizeof mk[i], "rtp_llm/v1/%s/tp-0/group-0/block-%d", DEP_A, 500 + i);
        mkp[i] = mk[i];
        bfill(mb[i], mixed[i], 500 + i, 9);
        json_array_append_new(json_object_get(o, "object_keys"), json_string(mk[i]));
        json_array_append_new(json_object_get(o, "object_metas"),
                              json_pack("{s:I, s:s}", "size", (json_int_t)mixed[i], "layout", "rtp_llm_group_block_v1"));
    }
    body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);
    free(body);
    ck_assert_msg(r.status == 200, "a create of three sizes answered %ld: %s", r.status,
                  json_string_value(json_object_get(r.body, "error")) ?: "");
    for (int i = 0; i < 3; i++) {
        uint64_t off, sz;
        ck_assert(kvsc_object(&r, mkp[i], &off, &sz));
        ck_assert(sz >= mixed[i] && off + mixed[i] <= c.size);
        memcpy(c.base + off, mb[i], mixed[i]);
    }
    char lease[64];
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    ck_assert_int_eq(kvsc_lease_call(&c, "seal", lease), 204);
    ck_assert_int_eq(kvsc_lease_call(&c, "release", lease), 204);
    for (int i = 0; i < 3; i++) {
        uint8_t got[4096], *op = got;
        size_t hits = 0;
        ck_assert_int_eq(kvsc_read(&c, &mkp[i], 1, &op, mixed[i], 60, &hits, NULL), 0);
        ck_assert_uint_eq(hits, 1);
        ck_assert_msg(memcmp(got, mb[i], mixed[i]) == 0, "the %" PRIu64 "-byte object of a mixed create differs",
                      mixed[i]);
    }
    for (int i = 0; i < NSIZES; i++)
        free(want[i]);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- opaque keys ------------------------------------------------------------------- */

#define NOPAQUE 6

/* Keys in any other format than rtp-llm's v1 (the SDK variant's, other
 * versions', any string, a long one) are objects of the client's tenant:
 * stored and read back byte-exact, each its own object, of any size, and
 * not one of a v1 key's. */
START_TEST(opaque_keys_are_objects)
{
    static char long_key[1500];
    static const char *const keys[NOPAQUE] = { "rtp_llm/kvs/v1/5/g0", "hello world", "caf\u00e9/\u00fcber",
                                               "rtp_llm/v1/" DEP_A "/tp-x/group-0/block-1", long_key,
                                               "rtp_llm/v1/" DEP_A "/tp-0/group-0/block-1/extra" };
    static const uint64_t sizes[NOPAQUE] = { 8192, 100, 8192, 4096, 333, 8192 };
    kvs_env e;
    kvsc c;

    memset(long_key, 'k', sizeof long_key - 1);
    env_start(&e, "");
    open_ok(&c, &e);
    for (int i = 0; i < NOPAQUE; i++) {
        uint8_t in[8192];
        const uint8_t *ip = in;
        bfill(in, sizes[i], i, 33);
        long st = kvsc_store(&c, &keys[i], 1, &ip, sizes[i], 60);
        if (st != 0) {
            char err[512];
            create_error(&c, keys[i], sizes[i], err, sizeof err);
            ck_abort_msg("store of opaque key #%d answered %ld (a create now answers: %s)", i, st, err);
        }
    }
    /* A v1 key of the same deployment: its own object. */
    rank_round_trip(&c, DEP_A, 0, 5);
    for (int i = 0; i < NOPAQUE; i++) {
        uint8_t want[8192], got[8192], *op = got;
        size_t hits = 0;
        bfill(want, sizes[i], i, 33);
        ck_assert_int_eq(kvsc_read(&c, &keys[i], 1, &op, sizes[i], 60, &hits, NULL), 0);
        ck_assert_msg(hits == 1, "opaque key #%d not found", i);
        ck_assert_msg(memcmp(want, got, sizes[i]) == 0, "opaque key #%d differs", i);
    }
    /* A key never stored is a miss, not another key's object. */
    const char *never = "hello worle";
    size_t hits = 1;
    ck_assert_int_eq(kvsc_read(&c, &never, 1, NULL, 100, 60, &hits, NULL), 0);
    ck_assert_uint_eq(hits, 0);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- what KVCM sees ----------------------------------------------------------------- */

#define HOSTPORT "10.9.8.7:7000"

/* The reporters of DEP_A's deployments (instance "<model>_1_<fingerprint>")
 * that hold exactly blocks 1000..1000+NBLOCKS-1 in dram; *all = every
 * reporter of DEP_A. */
static int reporters_holding(const struct kvcmctl *s, int *all)
{
    json_t *st = kvcmctl_state(s, false), *r;
    const char *id;
    int n = 0;
    *all = 0;
    json_object_foreach(json_object_get(st, "reporters"), id, r) {
        const char *inst = json_string_value(json_object_get(r, "instance_id")) ?: "";
        const char *host = json_string_value(json_object_get(r, "host_ip_port")) ?: "";
        if (strncmp(inst, DEP_A "_1_", strlen(DEP_A "_1_")) != 0 || strcmp(host, HOSTPORT) != 0)
            continue;
        (*all)++;
        json_t *dram = json_object_get(json_object_get(r, "blocks"), "dram");
        bool want[NBLOCKS] = { false }, ok = json_array_size(dram) == NBLOCKS;
        for (size_t i = 0; ok && i < json_array_size(dram); i++) {
            long long k = strtoll(json_string_value(json_array_get(dram, i)) ?: "", NULL, 10);
            ok = k >= 1000 && k < 1000 + NBLOCKS && !want[k - 1000];
            if (ok)
                want[k - 1000] = true;
        }
        n += ok;
    }
    json_decref(st);
    return n;
}

/* Ranks 0 and 3 of DEP_A written through the front end with the default
 * tp_size: KVCM is told of two deployments, one per rank, each holding that
 * rank's blocks as soon as that rank sealed them (no rank waits for the
 * others, whose count the keys do not tell). */
START_TEST(kvcm_sees_each_rank_as_its_own_deployment)
{
    struct kvcmctl s;
    kvs_env e;
    kvsc c;
    char conf[512];
    const char *argv[] = { "--snapshot-interval-s", "0", NULL };
    struct kvcmctl_opts o = { .extra = argv, .valgrind = simctl_under_valgrind() };

    kvcmctl_start(&s, &o);
    snprintf(conf, sizeof conf, "kvcm.enabled=on\nkvcm.endpoints=%s\nkvcm.host_ip_port=" HOSTPORT "\n"
             "kvcm.flush_interval=20ms\nkvcm.heartbeat_interval=200ms\nkvcm.snapshot_interval=1h\n"
             "kvcm.retry_base=50ms\nkvcm.retry_max=400ms\nkvcm.host_down_timeout=500ms\n", s.base);
    env_start(&e, conf);
    open_ok(&c, &e);
    rank_round_trip(&c, DEP_A, 0, 1);
    rank_round_trip(&c, DEP_A, 3, 1);
    uint64_t deadline = kvh_now_ms() + 10000;
    int holding = 0, all = 0;
    while ((holding = reporters_holding(&s, &all)) < 2 && kvh_now_ms() < deadline)
        kvh_sleep_ms(50);
    ck_assert_msg(holding == 2 && all == 2, "%d of %d KVCM deployments of %s hold the rank's %d blocks "
                  "(want 2 of 2)", holding, all, DEP_A, NBLOCKS);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
    kvcmctl_stop_ok(&s);
}
END_TEST

static Suite *kvs_ranks_suite(void)
{
    Suite *s = suite_create("kvs_ranks");
    TCase *tc = tcase_create("kvs_ranks");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, every_rank_is_served_with_the_default_options);
    tcase_add_test(tc, objects_of_different_sizes_share_a_group);
    tcase_add_test(tc, kvcm_sees_each_rank_as_its_own_deployment);
    tcase_add_test(tc, opaque_keys_are_objects);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_ranks_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
