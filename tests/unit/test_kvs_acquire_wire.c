/* Unit tests of the KVS front end's /acquire body and reply
 * (daemon/net/kvs_acquire_wire.c): rtp-llm's bodies take the fixed-shape
 * scanner; every body, rtp-llm's or mutated (escapes, whitespace, member
 * order, duplicates, floats, negatives, leading zeros, nesting, cut short,
 * random bytes), gets the same status and the same request from the scanner
 * path as from jansson alone; replies are JSON that jansson reads back to
 * the same keys (escaped as needed), offsets and sizes. */
#include <check.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "net/kvs_acquire_wire.h"
#include "net/kvs_server.h"

static const struct kvs_acquire_limits LIM = { .max_keys = 64, .max_term_s = 600 };
static const struct kvs_acquire_limits LIM_JSON = { .max_keys = 64, .max_term_s = 600, .general_only = true };

#define RTP_CREATE "{\"scope\":\"create\",\"object_keys\":[\"rtp_llm/v1/d-1/tp-0/group-0/block-1\"," \
    "\"rtp_llm/v1/d-1/tp-0/group-0/block--2\"],\"object_metas\":[{\"size\":65536,\"layout\":" \
    "\"rtp_llm_group_block_v1\"},{\"size\":32768,\"layout\":\"rtp_llm_group_block_v1\"}],\"term\":60," \
    "\"request_id\":\"kvs_store_abc\",\"ignore_existing\":true}"
#define RTP_READ "{\"scope\":\"read\",\"object_keys\":[\"a/b\",\"rtp_llm/v1/d-1/tp-3/group-1/block-7\"]," \
    "\"term\":60,\"peer\":\"local\",\"wait_timeout\":0,\"request_id\":\"kvs_read_x\",\"best_effort\":true}"

/* Both paths on body: the same status and, on 0, the same request. The
 * status; *fast whether the scanner took it. */
static int both(const char *body, size_t len, bool *fast)
{
    struct kvs_acquire_req a, b;
    char ma[512] = "", mb[512] = "";
    int sa = kvs_acquire_req_parse(body, len, &LIM, &a, ma, sizeof ma);
    int sb = kvs_acquire_req_parse(body, len, &LIM_JSON, &b, mb, sizeof mb);
    ck_assert_msg(sa == sb, "status %d (scanner path) != %d (jansson) for body %.*s", sa, sb, (int)len, body);
    ck_assert_str_eq(ma, mb);
    if (fast)
        *fast = sa == 0 && a.fast;
    if (sa != 0)
        return sa;
    ck_assert(!b.fast);
    ck_assert_int_eq(a.create, b.create);
    ck_assert_int_eq(a.has_term, b.has_term);
    ck_assert_uint_eq(a.term_s, b.term_s);
    ck_assert_uint_eq(a.n, b.n);
    for (size_t i = 0; i < a.n; i++) {
        ck_assert_uint_eq(a.keys[i].len, b.keys[i].len);
        ck_assert_msg(memcmp(a.keys[i].s, b.keys[i].s, a.keys[i].len) == 0, "key %zu differs", i);
        if (a.create)
            ck_assert_uint_eq(a.sizes[i], b.sizes[i]);
    }
    ck_assert_int_eq(a.sizes == NULL, b.sizes == NULL);
    kvs_acquire_req_free(&a);
    kvs_acquire_req_free(&b);
    return 0;
}

static int both_s(const char *body, bool *fast)
{
    return both(body, strlen(body), fast);
}

START_TEST(test_rtp_bodies_take_the_scanner)
{
    struct kvs_acquire_req r;
    char msg[512];
    bool fast;
    ck_assert_int_eq(kvs_acquire_req_parse(RTP_CREATE, strlen(RTP_CREATE), &LIM, &r, msg, sizeof msg), 0);
    ck_assert(r.fast && r.create && r.has_term && r.term_s == 60 && r.n == 2);
    ck_assert_uint_eq(r.keys[1].len, strlen("rtp_llm/v1/d-1/tp-0/group-0/block--2"));
    ck_assert(memcmp(r.keys[1].s, "rtp_llm/v1/d-1/tp-0/group-0/block--2", r.keys[1].len) == 0);
    ck_assert(r.sizes[0] == 65536 && r.sizes[1] == 32768);
    kvs_acquire_req_free(&r);
    ck_assert_int_eq(both_s(RTP_CREATE, &fast), 0);
    ck_assert(fast);
    ck_assert_int_eq(both_s(RTP_READ, &fast), 0);
    ck_assert(fast);
    /* whitespace, any member order, members of any value */
    ck_assert_int_eq(both_s(" {\n\t\"object_keys\" : [ \"k\" ] , \"x\":{\"a\":[1,-2,{}],\"b\":null},\"scope\":"
                            "\"read\",\"term\":null } \r\n", &fast), 0);
    ck_assert(fast);
    ck_assert_int_eq(both_s("{\"scope\":\"read\",\"object_keys\":[]}", &fast), 0);
    ck_assert(fast);
}
END_TEST

START_TEST(test_other_bodies_agree)
{
    static const char *const bodies[] = {
        "", "{", "[]", "\"x\"", "{}", "null", "{\"scope\":\"read\"}", "{\"object_keys\":[\"k\"]}",
        "{\"scope\":\"write\",\"object_keys\":[\"k\"]}", "{\"scope\":1,\"object_keys\":[\"k\"]}",
        "{\"scope\":\"read\",\"object_keys\":\"k\"}", "{\"scope\":\"read\",\"object_keys\":[1]}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\\\"q\"]}", "{\"scope\":\"read\",\"object_keys\":[\"k\\u0041\"]}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\\u0000\"]}", "{\"scope\":\"read\",\"object_keys\":[\"caf\xc3\xa9\"]}",
        "{\"scope\":\"read\",\"object_keys\":[\"bad\xc3\"]}", "{\"scope\":\"read\",\"object_keys\":[\"t\tab\"]}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":1.5}", "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":-1}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":1e2}", "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":601}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":600}", "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":007}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":\"60\"}", "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":0}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":99999999999999999999}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"term\":9223372036854775807}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"]} x", "{\"scope\":\"read\",\"object_keys\":[\"k\"],}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\",]}", "{\"scope\":\"read\",\"scope\":\"create\",\"object_keys\":[\"k\"]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":1}],\"object_keys\":[\"j\",\"i\"]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"]}", "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{}]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":0}]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":4294967295}]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":4294967296}]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":8,\"layout\":\"other\"}]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":8,\"layout\":7}]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":8,\"size\":9}]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":8.0}]}",
        "{\"scope\":\"create\",\"object_keys\":[\"k\"],\"object_metas\":[{\"size\":8,\"x\":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}]}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"object_metas\":7}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"x\":tru}", "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"x\":-}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"x\":01}", "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"x\":1E400}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"x\":-0}", "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"x\":\"\x7f\"}",
        "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"x\":[1 2]}", "{\"scope\":\"read\",\"object_keys\":[\"k\"],\"x\":{\"a\"}}",
        "\xef\xbb\xbf{\"scope\":\"read\",\"object_keys\":[\"k\"]}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++)
        both_s(bodies[i], NULL);
    /* More keys than max_keys: 413 both ways. */
    char big[2048] = "{\"scope\":\"read\",\"object_keys\":[";
    for (int i = 0; i < 65; i++)
        strcat(big, i ? ",\"k\"" : "\"k\"");
    strcat(big, "]}");
    ck_assert_int_eq(both_s(big, NULL), 413);
    /* A NUL byte inside the body. */
    static const char nul[] = "{\"scope\":\"read\",\"object_keys\":[\"k\0\"]}";
    both(nul, sizeof nul - 1, NULL);
}
END_TEST

/* Random mutations of rtp-llm's bodies: both paths agree on every one. */
START_TEST(test_mutations_agree)
{
    static const char *const seeds[] = { RTP_CREATE, RTP_READ };
    static const char *const inserts[] = { "\\", "\"", " ", ",", "\\u0041", "1.5", "-", "0", "e9", "{", "}", "[",
                                           "]", ":", "null", "\xc3\xa9", "\x01", "\"scope\":\"read\"," };
    uint64_t x = 0x9e3779b97f4a7c15ull;
    size_t fast = 0, ok = 0;
    for (int round = 0; round < 20000; round++) {
        const char *seed = seeds[round & 1];
        size_t len = strlen(seed);
        char buf[1024];
        memcpy(buf, seed, len);
        for (int m = 0; m < 1 + round % 3; m++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t at = (size_t)(x % len);
            if ((x >> 32) % 3 == 0) {   /* delete a byte */
                memmove(buf + at, buf + at + 1, len - at - 1);
                len--;
            } else if ((x >> 32) % 3 == 1) {   /* replace a byte */
                buf[at] = (char)(x >> 40);
            } else {   /* insert a piece */
                const char *ins = inserts[(x >> 40) % (sizeof inserts / sizeof *inserts)];
                size_t il = strlen(ins);
                if (len + il >= sizeof buf)
                    continue;
                memmove(buf + at + il, buf + at, len - at);
                memcpy(buf + at, ins, il);
                len += il;
            }
        }
        bool f = false;
        if (both(buf, len, &f) == 0)
            ok++;
        fast += f;
    }
    fprintf(stderr, "kvs_acquire_wire: 20000 mutated bodies, %zu accepted (%zu by the scanner), every one the "
            "same both ways\n", ok, fast);
    ck_assert_uint_gt(ok, 100);
    ck_assert_uint_gt(fast, 50);
}
END_TEST

START_TEST(test_reply_reads_back)
{
    static const char *const keys[] = { "rtp_llm/v1/d/tp-0/group-0/block-1", "q\"uo\\te", "ctl\x01\n\t\r\b\f",
                                         "caf\xc3\xa9/\x7f" };
    struct kvs_reply b = { 0 };
    size_t off, len;
    for (size_t i = 0; i < 4; i++)
        ck_assert_int_eq(kvs_reply_object(&b, i == 0, (struct kvs_str){ keys[i], strlen(keys[i]) },
                                          ((uint64_t)1 << 40) + i, (uint64_t)i * 1000 + 1), 0);
    ck_assert_int_eq(kvs_reply_wrap(&b, "0123456789abcdef0123456789abcdef", &off, &len), 0);
    char *text = malloc(len + 1);
    memcpy(text, b.p + off, len);
    json_error_t err;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    ck_assert_msg(j, "reply not JSON: %s: %.*s", err.text, (int)len, text);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "lease"), "lease_id")),
                     "0123456789abcdef0123456789abcdef");
    json_t *objs = json_object_get(j, "objects");
    ck_assert_uint_eq(json_array_size(objs), 4);
    for (size_t i = 0; i < 4; i++) {
        json_t *o = json_array_get(objs, i);
        json_t *h = json_object_get(json_array_get(json_object_get(o, "blobs"), 0), "handle");
        ck_assert_str_eq(json_string_value(json_object_get(o, "key")), keys[i]);
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(o, "blobs"), 0), "type")),
                         "vineyard");
        ck_assert_uint_eq((uint64_t)json_integer_value(json_object_get(h, "data_offset")), ((uint64_t)1 << 40) + i);
        ck_assert_uint_eq((uint64_t)json_integer_value(json_object_get(h, "object_id")), ((uint64_t)1 << 40) + i);
        ck_assert_uint_eq((uint64_t)json_integer_value(json_object_get(h, "data_size")), (uint64_t)i * 1000 + 1);
        ck_assert_uint_eq((uint64_t)json_integer_value(json_object_get(json_object_get(o, "meta"), "size")),
                          (uint64_t)i * 1000 + 1);
    }
    /* The same bytes as jansson's own dump of the same objects. */
    json_t *again = json_object();
    json_object_set_new(again, "lease", json_pack("{s:s}", "lease_id", "x"));
    json_t *arr = json_array();
    json_array_append_new(arr, json_pack("{s:s, s:[{s:s, s:{s:I, s:I, s:I}}], s:{s:I}}", "key", keys[3], "blobs",
                                         "type", "vineyard", "handle", "data_offset", (json_int_t)7, "data_size",
                                         (json_int_t)9, "object_id", (json_int_t)7, "meta", "size", (json_int_t)9));
    json_object_set_new(again, "objects", arr);
    char *want = json_dumps(again, JSON_COMPACT);
    struct kvs_reply c = { 0 };
    size_t coff, cl;
    kvs_reply_object(&c, true, (struct kvs_str){ keys[3], strlen(keys[3]) }, 7, 9);
    kvs_reply_wrap(&c, "x", &coff, &cl);
    char *got = calloc(1, cl + 1);
    memcpy(got, c.p + coff, cl);
    ck_assert_str_eq(got, want);
    free(got);
    free(want);
    json_decref(again);
    free(c.p);
    json_decref(j);
    free(text);
    free(b.p);
}
END_TEST

static Suite *wire_suite(void)
{
    Suite *s = suite_create("kvs_acquire_wire");
    TCase *tc = tcase_create("wire");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_rtp_bodies_take_the_scanner);
    tcase_add_test(tc, test_other_bodies_agree);
    tcase_add_test(tc, test_mutations_agree);
    tcase_add_test(tc, test_reply_reads_back);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(wire_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
