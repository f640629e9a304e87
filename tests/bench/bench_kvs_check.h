/* bench_kvs_check: kvnode-bench-kvs checks its fast client (kvs_fast_client.h)
 * against jansson before it measures anything, so that the fast writer and
 * reader cannot silently diverge from what kvs_client.h (and the tests)
 * read: the bodies it writes, read back by jansson, hold rtp-llm's members
 * in rtp-llm's order and every key byte-exact; the replies it reads agree
 * with jansson's reading on the lease and on every (key, offset, size),
 * for hand-written replies and for the daemon's own; malformed replies are
 * refused. Any disagreement ends the benchmark. Include after bench_util.h. */
#ifndef KVNODE_BENCH_KVS_CHECK_H
#define KVNODE_BENCH_KVS_CHECK_H

#include <jansson.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kvs_client.h"
#include "kvs_fast_client.h"

/* The fast writer's body against jansson's (kvs_client.h) for keys that
 * need escaping. */
static void kvsf_check_writer(void)
{
    static const char *const keys[] = { "plain", "quo\"te", "back\\slash", "ctl\x01\x1f\n\t\r\b\f\x7f",
                                        "slash/\xc3\xa9\xf0\x9f\x98\x80", "" };
    static const char *const order[2][8] = {
        { "scope", "object_keys", "term", "peer", "wait_timeout", "request_id", "best_effort", NULL },
        { "scope", "object_keys", "object_metas", "term", "request_id", "ignore_existing", NULL },
    };
    for (int create = 0; create < 2; create++) {
        kvsf_buf b = { 0 };
        json_error_t err;
        if (!kvsf_acquire_body(&b, create, keys, 6, 12345, 60, create ? "kvs_store_test" : "kvs_read_test"))
            die("self-check (writer)", "out of memory");
        json_t *j = json_loads(b.p, 0, &err);
        if (!j || strlen(b.p) != b.n)
            die("self-check (writer): jansson refuses the fast body", err.text);
        size_t k = 0;
        for (void *it = json_object_iter(j); it; it = json_object_iter_next(j, it), k++)
            if (!order[create][k] || strcmp(json_object_iter_key(it), order[create][k]) != 0)
                die("self-check (writer)", "members not in rtp-llm's order");
        if (order[create][k])
            die("self-check (writer)", "a member is missing");
        char *ref = kvsc_acquire_body(create ? "create" : "read", keys, 6, 12345, 60);
        json_t *jr = ref ? json_loads(ref, 0, &err) : NULL;
        if (!jr || !json_equal(j, jr))
            die("self-check (writer)", "the fast body and kvs_client.h's differ");
        json_decref(j);
        json_decref(jr);
        free(ref);
        free(b.p);
    }
}

static uint64_t kvsf_jansson_u64(json_t *j)
{
    return json_is_integer(j) ? (uint64_t)json_integer_value(j) : UINT64_MAX;
}

/* The fast reader and jansson (as kvsc_call parses) on one reply: the same
 * lease, the same entries in the same order, the same (key, offset, size)
 * for every key asked. text is left untouched. */
static void kvsf_compare_readers(const char *what, const char *text, const char *const *keys, size_t nkeys)
{
    size_t len = strlen(text);
    kvsf_reply fr;
    char why[200];
    memset(&fr, 0, sizeof fr);
    if (!kvsf_reserve(&fr.text, len))
        die(what, "out of memory");
    memcpy(fr.text.p, text, len + 1);
    fr.text.n = len;
    if (kvsf_parse_acquire(&fr, why, sizeof why) != 0)
        die(what, why);
    kvsc_reply jr = { .status = 200, .body = json_loads(text, 0, NULL) };
    if (!jr.body)
        die(what, "jansson refuses a reply the fast reader took");
    if (strcmp(kvsc_lease_id(&jr), fr.lease_id) != 0 || strlen(fr.lease_id) != fr.lease_len)
        die(what, "the readers disagree on lease_id");
    json_t *objs = json_object_get(jr.body, "objects");
    if (json_array_size(objs) != fr.n + fr.nulls)
        die(what, "the readers disagree on the number of entries");
    size_t k = 0;
    for (size_t i = 0; i < json_array_size(objs); i++) {
        json_t *o = json_array_get(objs, i), *key = json_object_get(o, "key");
        if (json_is_null(o))
            continue;
        const kvsf_object *f = &fr.objs[k++];
        json_t *h = json_object_get(json_array_get(json_object_get(o, "blobs"), 0), "handle");
        uint64_t off = kvsf_jansson_u64(json_object_get(h, "data_offset"));
        uint64_t size = kvsf_jansson_u64(json_object_get(h, "data_size"));
        json_t *ms = json_object_get(json_object_get(o, "meta"), "size");
        uint64_t bytes = json_is_integer(ms) && json_integer_value(ms) > 0 ? (uint64_t)json_integer_value(ms) : size;
        if (!json_is_string(key) || json_string_length(key) != f->key_len ||
            memcmp(json_string_value(key), f->key, f->key_len) != 0)
            die(what, "the readers disagree on a key");
        if (off != f->offset || size != f->data_size || bytes != f->bytes)
            die(what, "the readers disagree on an object's offset or size");
        if (kvsf_find(&fr, f->key, f->key_len) != f)
            die(what, "the fast reader's table does not find an entry by its key");
    }
    for (size_t i = 0; i < nkeys; i++) {
        uint64_t off = 0, size = 0;
        bool jf = kvsc_object(&jr, keys[i], &off, &size);
        const kvsf_object *f = kvsf_find(&fr, keys[i], strlen(keys[i]));
        if (jf != (f != NULL) || (f && (off != f->offset || size != f->data_size)))
            die(what, "the readers disagree on a key asked for");
    }
    kvsc_reply_free(&jr);
    kvsf_reply_free(&fr);
}

#define KVSF_LEASE "\"lease\":{\"lease_id\":\"x\"}"
#define KVSF_ONE(handle) "{" KVSF_LEASE ",\"objects\":[{\"key\":\"k\",\"blobs\":[{\"type\":\"vineyard\",\"handle\":" \
                         handle "}]}]}"

/* Replies both readers must read alike (kvsf_asked: the keys looked up). */
static const char *const kvsf_good[] = {
    " {\n\"objects\" : [ null , {\"meta\":{\"size\":7,\"x\":[1,-2.5e+3,{\"a\":null,\"b\":[true,false]}]},"
    "\"blobs\":[{\"handle\":{\"object_id\":3,\"data_size\":65536,\"data_offset\":0,\"z\":\"\"},"
    "\"type\":\"vineyard\",\"extra\":true},{\"type\":\"other\"}],"
    "\"key\":\"a\\\"b\\\\c\\/d\\u00e9\\ud83d\\ude00\\n\\u001f\xc3\xa9\"},"
    "{\"key\":\"k2\",\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":9223372036854775807,"
    "\"data_size\":0}}],\"meta\":{\"size\":0}} ],\t\"lease\" : {\"lease_id\":\"L\\u0031\",\"ttl\":-1.5E-2} ,"
    " \"extra\":\"x\"}\r\n",
    "{\"lease\":{\"lease_id\":\"\"},\"objects\":[]}",
    "{\"lease\":{\"lease_id\":\"00ff\"},\"objects\":[{\"key\":\"k\",\"blobs\":[{\"type\":\"vineyard\","
    "\"handle\":{\"data_offset\":4096,\"data_size\":65536,\"object_id\":4096}}],\"meta\":{\"size\":65536}},null]}",
    KVSF_ONE("{\"data_offset\":-0,\"data_size\":2}"),
};
static const char *const kvsf_asked[] = { "a\"b\\c/d\xc3\xa9\xf0\x9f\x98\x80\n\x1f\xc3\xa9", "k2", "k", "absent" };

/* Replies the fast reader must refuse. */
static const char *const kvsf_bad[] = {
    "", "[]", "{}", "{" KVSF_LEASE ",\"objects\":[]", "{" KVSF_LEASE ",\"objects\":[]} x",
    "{" KVSF_LEASE "}", "{\"objects\":[]}", "{\"lease\":{},\"objects\":[]}",
    "{\"lease\":{\"lease_id\":1},\"objects\":[]}", "{\"lease\":[],\"objects\":[]}",
    "{" KVSF_LEASE ",\"objects\":{}}", "{" KVSF_LEASE ",\"objects\":[],}", "{" KVSF_LEASE ",\"objects\":[nul]}",
    "{" KVSF_LEASE "," KVSF_LEASE ",\"objects\":[]}",
    KVSF_ONE("{\"data_offset\":\"1\",\"data_size\":2}"), KVSF_ONE("{\"data_offset\":1.0,\"data_size\":2}"),
    KVSF_ONE("{\"data_offset\":1e3,\"data_size\":2}"), KVSF_ONE("{\"data_offset\":-1,\"data_size\":2}"),
    KVSF_ONE("{\"data_offset\":1}"),
    KVSF_ONE("{\"data_size\":1}"), KVSF_ONE("{\"data_offset\":1,\"data_size\":2,\"object_id\":\"o1\"}"),
    KVSF_ONE("{\"data_offset\":1,\"data_size\":2,\"object_id\":18446744073709551615}"),
    KVSF_ONE("{\"data_offset\":18446744073709551616,\"data_size\":2}"),
    KVSF_ONE("{\"data_offset\":01,\"data_size\":2}"), KVSF_ONE("{\"data_offset\":1,\"data_size\":2,}"),
    KVSF_ONE("{\"data_offset\":1,\"data_offset\":1,\"data_size\":2}"), KVSF_ONE("{\"data_offset\":1 \"data_size\":2}"),
    KVSF_ONE("[]"), KVSF_ONE("{\"data_offset\":1,\"data_size\":2,\"x\":[1,]}"),
    KVSF_ONE("{\"data_offset\":1,\"data_size\":2,\"x\":.5}"), KVSF_ONE("{\"data_offset\":1,\"data_size\":2,\"x\":tru}"),
    "{" KVSF_LEASE ",\"objects\":[{\"key\":\"k\",\"blobs\":[{\"type\":\"other\",\"handle\":{\"data_offset\":1,"
    "\"data_size\":2}}]}]}",
    "{" KVSF_LEASE ",\"objects\":[{\"key\":\"k\",\"blobs\":[]}]}",
    "{" KVSF_LEASE ",\"objects\":[{\"key\":\"k\"}]}",
    "{" KVSF_LEASE ",\"objects\":[{\"key\":1,\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":1,"
    "\"data_size\":2}}]}]}",
    "{" KVSF_LEASE ",\"objects\":[{\"key\":\"k\",\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":1,"
    "\"data_size\":2}}]},{\"key\":\"k\",\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":3,"
    "\"data_size\":2}}]}]}",
    "{" KVSF_LEASE ",\"objects\":[{\"key\":\"k\",\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":1,"
    "\"data_size\":2}}],\"meta\":{\"size\":1.5}}]}",
    "{\"lease\":{\"lease_id\":\"a\\q\"},\"objects\":[]}", "{\"lease\":{\"lease_id\":\"\\ud800\"},\"objects\":[]}",
    "{\"lease\":{\"lease_id\":\"\\udc00\"},\"objects\":[]}", "{\"lease\":{\"lease_id\":\"\\u12g4\"},\"objects\":[]}",
    "{\"lease\":{\"lease_id\":\"a\nb\"},\"objects\":[]}", "{\"lease\":{\"lease_id\":\"\xff\"},\"objects\":[]}",
    "{\"lease\":{\"lease_id\":\"\xc0\xaf\"},\"objects\":[]}", "{\"lease\":{\"lease_id\":\"\xed\xa0\x80\"},\"objects\":[]}",
    "{\"lease\":{\"lease_id\":\"x},\"objects\":[]}",
};

/* Hand-written replies: the good ones read alike by both, the bad ones refused. */
static void kvsf_check_reader(void)
{
    for (size_t i = 0; i < sizeof kvsf_good / sizeof *kvsf_good; i++)
        kvsf_compare_readers("self-check (reader, hand-written reply)", kvsf_good[i], kvsf_asked, 4);
    for (size_t i = 0; i < sizeof kvsf_bad / sizeof *kvsf_bad; i++) {
        kvsf_reply r;
        char why[200];
        memset(&r, 0, sizeof r);
        size_t len = strlen(kvsf_bad[i]);
        if (!kvsf_reserve(&r.text, len))
            die("self-check (reader)", "out of memory");
        memcpy(r.text.p, kvsf_bad[i], len + 1);
        r.text.n = len;
        if (kvsf_parse_acquire(&r, why, sizeof why) == 0) {
            char m[600];
            snprintf(m, sizeof m, "the fast reader took a malformed reply: %.500s", kvsf_bad[i]);
            die("self-check (reader)", m);
        }
        kvsf_reply_free(&r);
    }
    /* "\u0000" inside a key: found by its full length. */
    kvsf_reply r;
    char why[200];
    static const char nul_key[] = "{\"lease\":{\"lease_id\":\"x\"},\"objects\":[{\"key\":\"a\\u0000b\",\"blobs\":"
                                  "[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":1,\"data_size\":2}}]}]}";
    memset(&r, 0, sizeof r);
    if (!kvsf_reserve(&r.text, sizeof nul_key))
        die("self-check (reader)", "out of memory");
    memcpy(r.text.p, nul_key, sizeof nul_key);
    r.text.n = sizeof nul_key - 1;
    if (kvsf_parse_acquire(&r, why, sizeof why) != 0 || !kvsf_find(&r, "a\0b", 3) || kvsf_find(&r, "a", 1))
        die("self-check (reader)", "a key holding \\u0000 is not found by its length");
    kvsf_reply_free(&r);
}

static uint64_t kvsf_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* What the client itself spends on one create of n keys (body, reading the
 * daemon's reply text, finding every key), kvs_client.h's jansson way
 * against this client's; best of 5, printed for the record. */
static void kvsf_client_cost(const char *text, const char *const *keys, size_t n, uint64_t size)
{
    uint64_t best[2][3] = { { UINT64_MAX, UINT64_MAX, UINT64_MAX }, { UINT64_MAX, UINT64_MAX, UINT64_MAX } };
    size_t len = strlen(text);
    for (int rep = 0; rep < 5; rep++) {
        uint64_t t[4], off, sz, sum = 0;
        t[0] = kvsf_ns();
        char *body = kvsc_acquire_body("create", keys, n, size, 60);
        t[1] = kvsf_ns();
        kvsc_reply jr = { .status = 200, .body = json_loads(text, 0, NULL) };
        t[2] = kvsf_ns();
        for (size_t i = 0; i < n; i++)
            sum += kvsc_object(&jr, keys[i], &off, &sz) ? off : 0;
        t[3] = kvsf_ns();
        for (int k = 0; k < 3; k++)
            best[0][k] = t[k + 1] - t[k] < best[0][k] ? t[k + 1] - t[k] : best[0][k];
        free(body);
        kvsc_reply_free(&jr);
        kvsf_buf b = { 0 };
        kvsf_reply fr;
        char why[200];
        memset(&fr, 0, sizeof fr);
        t[0] = kvsf_ns();
        kvsf_acquire_body(&b, true, keys, n, size, 60, "kvs_store_test");
        t[1] = kvsf_ns();
        if (!kvsf_reserve(&fr.text, len))
            die("client cost", "out of memory");
        memcpy(fr.text.p, text, len + 1);
        fr.text.n = len;
        if (kvsf_parse_acquire(&fr, why, sizeof why) != 0)
            die("client cost", why);
        t[2] = kvsf_ns();
        for (size_t i = 0; i < n; i++) {
            const kvsf_object *o = kvsf_find(&fr, keys[i], strlen(keys[i]));
            sum -= o ? o->offset : 0;
        }
        t[3] = kvsf_ns();
        for (int k = 0; k < 3; k++)
            best[1][k] = t[k + 1] - t[k] < best[1][k] ? t[k + 1] - t[k] : best[1][k];
        free(b.p);
        kvsf_reply_free(&fr);
        if (sum != 0)
            die("client cost", "the two clients found different offsets");
    }
    printf("client cost of one create of %zu keys (reply %zu bytes), us: jansson client (kvs_client.h) body %.0f, "
           "parse %.0f, lookups %.0f; this client body %.0f, parse %.0f, lookups %.0f\n", n, len,
           (double)best[0][0] / 1e3, (double)best[0][1] / 1e3, (double)best[0][2] / 1e3, (double)best[1][0] / 1e3,
           (double)best[1][1] / 1e3, (double)best[1][2] / 1e3);
}

/* The daemon's own replies: a create of n fresh keys (then sealed and
 * released), a read of them and of keys never written (then released),
 * each read by both readers. */
static void kvsf_check_live(const kvsc *c, size_t n, uint64_t size)
{
    char **names = calloc(n + 8, sizeof *names);
    for (size_t i = 0; i < n + 8; i++) {
        names[i] = malloc(128);
        snprintf(names[i], 128, "rtp_llm/v1/bench-model-0123456789abcdef/tp-0/group-0/block-%zu", 900000000 + i);
    }
    const char *const *keys = (const char *const *)names;
    for (int create = 1; create >= 0; create--) {
        kvsf_buf body = { 0 }, out = { 0 };
        long status;
        if (!kvsf_acquire_body(&body, create, keys, create ? n : n + 8, size, 60, "kvs_selfcheck") ||
            kvsf_call(c->url, "acquire", body.p, body.n, &out, &status, NULL) != 0 || status != 200 || !out.p)
            die("self-check (daemon's reply)", "acquire failed");
        kvsf_compare_readers("self-check (daemon's reply)", out.p, keys, create ? n : n + 8);
        if (create)
            kvsf_client_cost(out.p, keys, n, size);
        json_t *j = json_loads(out.p, 0, NULL);
        kvsc_reply jr = { .status = 200, .body = j };
        char lease[160];
        snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&jr));
        if (create && kvsf_lease_call(c->url, "seal", lease, "kvs_selfcheck") != 204)
            die("self-check (daemon's reply)", "seal failed");
        if (kvsf_lease_call(c->url, "release", lease, NULL) != 204)
            die("self-check (daemon's reply)", "release failed");
        json_decref(j);
        free(body.p);
        free(out.p);
    }
    for (size_t i = 0; i < n + 8; i++)
        free(names[i]);
    free(names);
}

#endif
