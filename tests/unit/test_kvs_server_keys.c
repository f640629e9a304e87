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
#include <stdbool.h>
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

/* One number, one spelling (issue 30: any key string is served byte-exact):
 * a v1 key's numbers are canonical; another spelling is not a v1 key but an
 * opaque one, so that it names an object of its own. */
START_TEST(test_canonical_numbers_only)
{
    static const char *const canon[] = {
        "rtp_llm/v1/dep/tp-0/group-0/block-0",
        "rtp_llm/v0/dep/tp-10/group-10/block-10",
        "rtp_llm/v1/dep/tp-7/group-1/block--5",
        "rtp_llm/v4294967295/dep/tp-4294967295/group-4294967295/block-9223372036854775807",
        "rtp_llm/v1/dep/tp-0/group-0/block--9223372036854775808",
    };
    static const char *const variant[] = {
        "rtp_llm/v1/dep/tp-0/group-0/block-007",   "rtp_llm/v01/dep/tp-0/group-0/block-7",
        "rtp_llm/v1/dep/tp-01/group-0/block-7",    "rtp_llm/v1/dep/tp-0/group-00/block-7",
        "rtp_llm/v1/dep/tp-0/group-0/block--0",    "rtp_llm/v1/dep/tp-0/group-0/block-00",
        "rtp_llm/v1/dep/tp-0/group-0/block--05",   "rtp_llm/v1/dep/tp-0/group-0/block-+7",
        "rtp_llm/v00/dep/tp-0/group-0/block-7",    "rtp_llm/v1/dep/tp-00/group-0/block-7",
        "rtp_llm/v1/dep/tp-0/group-0/block-09223372036854775807",
    };
    char err[512];
    struct kvs_key k, o;

    for (size_t i = 0; i < sizeof canon / sizeof canon[0]; i++) {
        ck_assert_msg(kvs_key_parse(canon[i], strlen(canon[i]), &k, err, sizeof err) == 0, "%s: %s", canon[i], err);
        ck_assert_int_eq(kvs_key_classify(canon[i], strlen(canon[i]), &k, err, sizeof err), 0);
        ck_assert_msg(!k.opaque, "%s", canon[i]);
    }
    ck_assert_int_eq(kvs_key_parse(canon[2], strlen(canon[2]), &k, err, sizeof err), 0);
    ck_assert(k.block == -5 && k.tp_rank == 7 && k.group == 1);
    for (size_t i = 0; i < sizeof variant / sizeof variant[0]; i++) {
        ck_assert_msg(kvs_key_parse(variant[i], strlen(variant[i]), &k, err, sizeof err) == -1, "%s", variant[i]);
        ck_assert_msg(strstr(err, "canonical"), "%s: %s", variant[i], err);
        ck_assert_int_eq(kvs_key_classify(variant[i], strlen(variant[i]), &k, err, sizeof err), 0);
        ck_assert_msg(k.opaque, "%s is not an opaque key", variant[i]);
        /* Its own object: not the block of another spelling. */
        for (size_t j = 0; j < i; j++) {
            ck_assert_int_eq(kvs_key_classify(variant[j], strlen(variant[j]), &o, err, sizeof err), 0);
            ck_assert(o.block != k.block || o.check != k.check);
        }
    }
}
END_TEST

/* A v1-format key is v1 only when every layout the front end may make of it
 * fits (its extra with the rank tag and the largest size tag): decided from
 * the key alone; any other is an opaque key, never a 400. */
START_TEST(test_keys_too_long_for_a_layout_are_opaque)
{
    static const char *const ranks[] = { "0", "7", "4294967295" };
    static const char *const nums[] = { "1", "4294967295" };
    char ns[128], dep[128], key[600], err[512];
    struct kvs_key k;
    size_t fits = 0, opaque = 0;

    for (size_t r = 0; r < 3; r++)
        for (size_t v = 0; v < 2; v++)
            for (size_t nl = 1; nl < 128; nl += 3)
                for (size_t dl = 1; dl < 128; dl++) {
                    memset(ns, 'n', nl);
                    ns[nl] = '\0';
                    memset(dep, 'd', dl);
                    dep[dl] = '\0';
                    snprintf(key, sizeof key, "%s/v%s/%s/tp-%s/group-%s/block--1", ns, nums[v], dep, ranks[r],
                             nums[v]);
                    if (kvs_key_parse(key, strlen(key), &k, err, sizeof err) < 0) {
                        ck_assert_msg(strstr(err, "too long for a namespace layout"), "%s", err);
                        ck_assert_int_eq(kvs_key_classify(key, strlen(key), &k, err, sizeof err), 0);
                        ck_assert(k.opaque);
                        opaque++;
                        continue;
                    }
                    /* tp_size 1: a rank past 0 alone, its rank tag in extra. */
                    struct ns_layout l;
                    ck_assert_msg(kvs_key_layout(&k, 1, UINT64_MAX, &l, err, sizeof err) == 0, "%s", err);
                    size_t n = strlen(l.extra) + strlen(KVS_SIZE_TAG "18446744073709551615");
                    ck_assert_msg(n < NS_EXTRA_MAX, "%s: a size tag does not fit extra '%s'", key, l.extra);
                    fits++;
                }
    ck_assert(fits > 0 && opaque > 0);
    /* The boundary, exactly: rank 0, v1, group 0 leave ns + deployment id
     * 255 - 57 - 2 - 38 = 158 bytes. */
    memset(ns, 'n', 31);
    ns[31] = '\0';
    memset(dep, 'd', 127);
    dep[127] = '\0';
    snprintf(key, sizeof key, "%s/v1/%s/tp-0/group-0/block-1", ns, dep);
    ck_assert_msg(kvs_key_parse(key, strlen(key), &k, err, sizeof err) == 0, "%s", err);
    snprintf(key, sizeof key, "%sn/v1/%s/tp-0/group-0/block-1", ns, dep);
    ck_assert_int_eq(kvs_key_parse(key, strlen(key), &k, err, sizeof err), -1);
    /* rtp-llm's own keys: any deployment id up to 127 bytes is v1. */
    snprintf(key, sizeof key, "rtp_llm/v1/%s/tp-15/group-3/block--4242424242424242424", dep);
    ck_assert_msg(kvs_key_parse(key, strlen(key), &k, err, sizeof err) == 0, "%s", err);
}
END_TEST

/* DEL (0x7f), which a layout's model refuses, makes a key opaque. */
START_TEST(test_del_byte_is_opaque)
{
    static const char *const keys[] = { "rtp_llm/v1/de\x7fp/tp-0/group-0/block-1",
                                        "rtp\x7fllm/v1/dep/tp-0/group-0/block-1" };
    char err[512];
    struct kvs_key k;
    for (size_t i = 0; i < 2; i++) {
        ck_assert_int_eq(kvs_key_parse(keys[i], strlen(keys[i]), &k, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "control character"), "%s", err);
        ck_assert_int_eq(kvs_key_classify(keys[i], strlen(keys[i]), &k, err, sizeof err), 0);
        ck_assert(k.opaque);
    }
}
END_TEST

/* A key sharing an earlier v1 key's prefix parses by its block alone, to
 * exactly what kvs_key_parse / kvs_key_classify make of it; any other tail
 * (not canonical, NUL, too long) is left to the full parse. */
START_TEST(test_same_prefix_block_only)
{
    static const char base[] = "rtp_llm/v1/m-0123456789abcdef/tp-3/group-1/block-42";
    struct kvs_key k, full;
    char err[256], key[700];
    int64_t block = 0;
    ck_assert_int_eq(kvs_key_parse(base, strlen(base), &k, err, sizeof err), 0);
    size_t pl = kvs_key_prefix_len(base, strlen(base), &k);
    ck_assert_uint_eq(pl, strlen(base) - 2);
    static const char *const tails[] = { "0", "7", "-1", "9223372036854775807", "-9223372036854775808",
                                         "9223372036854775808", "007", "-0", "+1", "", "1x", "1/2" };
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        int n = snprintf(key, sizeof key, "%.*s%s", (int)pl, base, tails[i]);
        bool fast = kvs_key_same_prefix(base, pl, key, (size_t)n, &block);
        bool parsed = kvs_key_parse(key, (size_t)n, &full, err, sizeof err) == 0;
        ck_assert_msg(fast == parsed, "tail '%s': prefix path %d, full parse %d", tails[i], fast, parsed);
        if (fast)
            ck_assert_int_eq(block, full.block);
    }
    ck_assert(!kvs_key_same_prefix(base, pl, "rtp_llm/v1/m-0123456789abcdef/tp-3/group-2/block-42",
                                   strlen(base), &block));   /* another group */
    memcpy(key, base, pl);
    key[pl] = '5';
    key[pl + 1] = '\0';
    ck_assert(!kvs_key_same_prefix(base, pl, key, pl + 2, &block));   /* a NUL byte */
    memset(key + pl, '1', sizeof key - pl);
    ck_assert(!kvs_key_same_prefix(base, pl, key, sizeof key, &block));   /* over 512 bytes */
    /* An opaque key has no prefix to share. */
    ck_assert_int_eq(kvs_key_classify("some/other/key", 14, &k, err, sizeof err), 0);
    ck_assert(k.opaque);
    ck_assert_uint_eq(kvs_key_prefix_len("some/other/key", 14, &k), 0);
    ck_assert(!kvs_key_same_prefix("some/other/key", 0, "some/other/key", 14, &block));
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
    tcase_add_test(tc, test_canonical_numbers_only);
    tcase_add_test(tc, test_keys_too_long_for_a_layout_are_opaque);
    tcase_add_test(tc, test_del_byte_is_opaque);
    tcase_add_test(tc, test_same_prefix_block_only);
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
