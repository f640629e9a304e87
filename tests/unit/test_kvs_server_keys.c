/* Unit tests of the KVS front end's object keys (daemon/net/kvs_server_keys.c):
 * golden keys built with rtp-llm's formula (KVSConnector.cc @85c02327f: S()
 * sanitising, deployment id "<S(model)>-<hex FNV-1a 64 with rtp-llm's offset
 * basis 1469598103934665603>", signed decimal block keys) for fixed inputs,
 * parsed back into their parts; keys the kvnode v6d backend builds parse to
 * the same namespace; malformed keys are refused naming the format; the
 * namespace layout of a key. Golden strings were computed outside kvnode
 * (Python, the same formula). */
#include <check.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "mem/namespace.h"
#include "net/kvs_server.h"
#include "persist/kvs/kvs.h"
#include "persist/kvs/v6d.h"

/* rtp-llm's S(): '/', ' ', '\t', '\n' -> '_'. */
static void rtp_sanitize(const char *in, char *out, size_t len)
{
    snprintf(out, len, "%s", in);
    for (char *p = out; *p; p++)
        if (*p == '/' || *p == ' ' || *p == '\t' || *p == '\n')
            *p = '_';
}

/* rtp-llm's key formula for one (engine, rank, group, block). */
static void rtp_key(const char *model, const char *raw, uint32_t rank, uint32_t group, int64_t block, char *out,
                    size_t len)
{
    char m[128];
    rtp_sanitize(*model ? model : "model", m, sizeof m);
    snprintf(out, len, "rtp_llm/v1/%s-%" PRIx64 "/tp-%u/group-%u/block-%" PRId64, m,
             v6d_rtp_hash_string(raw, strlen(raw)), rank, group, block);
}

START_TEST(test_golden_keys)
{
    static const struct {
        const char *model, *raw;
        uint32_t rank, group;
        int64_t block;
        const char *golden, *dep;
    } g[] = {
        { "Qwen2-7B-Instruct",
          "model=Qwen2-7B-Instruct;ckpt=/models/Qwen2-7B-Instruct;dtype=bf16;seq=4096;kernel_seq=64;tp=2;fp8=0;"
          "int8=0;mla=0;groups=1;typed=0",
          1, 0, INT64_C(-4242424242424242424),
          "rtp_llm/v1/Qwen2-7B-Instruct-851194812cc59c2d/tp-1/group-0/block--4242424242424242424",
          "Qwen2-7B-Instruct-851194812cc59c2d" },
        { "deepseek v3/base",
          "model=deepseek v3/base;ckpt=/mnt/ckpt/ds v3;dtype=fp8;seq=16;kernel_seq=16;tp=8;fp8=1;int8=0;mla=1;"
          "groups=2;typed=1",
          7, 1, INT64_MAX, "rtp_llm/v1/deepseek_v3_base-260686b7fe2bbe6/tp-7/group-1/block-9223372036854775807",
          "deepseek_v3_base-260686b7fe2bbe6" },
        { "", "model=;ckpt=;dtype=fp16;seq=32;kernel_seq=32;tp=1;fp8=0;int8=1;mla=0;groups=1;typed=0",
          0, 0, INT64_MIN, "rtp_llm/v1/model-c249dca81d95f110/tp-0/group-0/block--9223372036854775808",
          "model-c249dca81d95f110" },
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        char key[256], err[512];
        struct kvs_key k;
        rtp_key(g[i].model, g[i].raw, g[i].rank, g[i].group, g[i].block, key, sizeof key);
        ck_assert_str_eq(key, g[i].golden);
        ck_assert_msg(kvs_key_parse(key, strlen(key), &k, err, sizeof err) == 0, "%s", err);
        ck_assert_str_eq(k.object_ns, "rtp_llm");
        ck_assert_uint_eq(k.version, 1);
        ck_assert_str_eq(k.deployment_id, g[i].dep);
        ck_assert_uint_eq(k.tp_rank, g[i].rank);
        ck_assert_uint_eq(k.group, g[i].group);
        ck_assert(k.block == g[i].block);
    }
}
END_TEST

/* The v6d backend's keys (kvnode as a KVS client) reach the same namespace
 * the front end makes of them. */
START_TEST(test_v6d_backend_keys_parse)
{
    struct ns_layout l = { .tp_rank = 3, .extra = "a=b;kvs_deployment_id=eng-42;c=d" };
    struct kvs_ns ns = { .layout = &l };
    char key[256], err[512];
    struct kvs_key k;
    v6d_object_key("rtp_llm", &ns, -17, 0, key, sizeof key);
    ck_assert_int_eq(kvs_key_parse(key, strlen(key), &k, err, sizeof err), 0);
    ck_assert_str_eq(k.deployment_id, "eng-42");
    ck_assert_uint_eq(k.tp_rank, 3);
    ck_assert(k.block == -17);

    struct ns_layout out;
    ck_assert_int_eq(kvs_key_layout(&k, 4, 65536, &out, err, sizeof err), 0);
    ck_assert_str_eq(out.model, "eng-42");
    ck_assert_str_eq(out.dtype, KVS_LAYOUT_NAME);
    ck_assert_str_eq(out.extra, "kvs_deployment_id=eng-42;kvs_object_ns=rtp_llm;kvs_version=1;kvs_group=0");
    ck_assert_uint_eq(out.block_bytes, 65536);
    ck_assert_uint_eq(out.tp_size, 4);
    ck_assert_uint_eq(out.tp_rank, 3);
    ck_assert_int_eq(ns_layout_validate(&out, err, sizeof err), 0);
    /* Another group is another namespace. */
    struct ns_layout g1;
    k.group = 1;
    ck_assert_int_eq(kvs_key_layout(&k, 4, 65536, &g1, err, sizeof err), 0);
    ck_assert(ns_fingerprint(&g1) != ns_fingerprint(&out));
    /* A rank not below tp_size is served as a deployment of its own (issue
     * 30: no TP setting is needed), its rank named in extra. */
    ck_assert_int_eq(kvs_key_layout(&k, 3, 65536, &g1, err, sizeof err), 0);
    ck_assert_str_eq(g1.extra, "kvs_deployment_id=eng-42;kvs_object_ns=rtp_llm;kvs_version=1;kvs_group=1;"
                     "kvs_tp_rank=3");
    ck_assert_uint_eq(g1.tp_size, 1);
    ck_assert_uint_eq(g1.tp_rank, 0);
    ck_assert_int_eq(ns_layout_validate(&g1, err, sizeof err), 0);
    /* Rank 0 alone keeps the plain layout (what earlier versions stored). */
    k.tp_rank = 0;
    ck_assert_int_eq(kvs_key_layout(&k, 1, 65536, &g1, err, sizeof err), 0);
    ck_assert_str_eq(g1.extra, "kvs_deployment_id=eng-42;kvs_object_ns=rtp_llm;kvs_version=1;kvs_group=1");
    ck_assert_uint_eq(g1.tp_size, 1);
}
END_TEST

START_TEST(test_bad_keys)
{
    static const struct { const char *key, *why; } bad[] = {
        { "", "empty" },
        { "rtp_llm/kvs/v1/5/g0", "fewer than 6 parts" },   /* the SDK variant's keys */
        { "rtp_llm/v1/dep/tp-0/group-0", "fewer than 6 parts" },
        { "rtp_llm/v1/dep/tp-0/group-0/block-1/x", "more than 6 parts" },
        { "rtp_llm/v1//tp-0/group-0/block-1", "deployment id is empty" },
        { "/v1/dep/tp-0/group-0/block-1", "namespace part is empty" },
        { "rtp_llm/vx/dep/tp-0/group-0/block-1", "not v<version>" },
        { "rtp_llm/v1/dep/tp--1/group-0/block-1", "not tp-<rank>" },
        { "rtp_llm/v1/dep/tp-0/grp-0/block-1", "not group-<g>" },
        { "rtp_llm/v1/dep/tp-0/group-0/block-9223372036854775808", "not block-<signed 64-bit decimal>" },
        { "rtp_llm/v1/dep/tp-0/group-0/block-", "not block-" },
        { "rtp_llm/v1/dep/tp-0/group-0/block-1a", "not block-" },
        { "rtp_llm/v1/de;p/tp-0/group-0/block-1", "has a control character or ';'" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[512];
        struct kvs_key k;
        ck_assert_int_eq(kvs_key_parse(bad[i].key, strlen(bad[i].key), &k, err, sizeof err), -1);
        ck_assert_msg(strstr(err, bad[i].why), "%s: %s", bad[i].key, err);
        ck_assert_msg(strstr(err, KVS_KEY_FORMAT), "%s: %s", bad[i].key, err);
    }
    /* Not NUL-terminated input: only len bytes count. */
    char err[512];
    struct kvs_key k;
    const char *s = "rtp_llm/v1/d/tp-0/group-0/block-12345";
    ck_assert_int_eq(kvs_key_parse(s, strlen(s) - 3, &k, err, sizeof err), 0);
    ck_assert(k.block == 12);
}
END_TEST

static Suite *keys_suite(void)
{
    Suite *s = suite_create("kvs_server_keys");
    TCase *tc = tcase_create("keys");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_golden_keys);
    tcase_add_test(tc, test_v6d_backend_keys_parse);
    tcase_add_test(tc, test_bad_keys);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(keys_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
