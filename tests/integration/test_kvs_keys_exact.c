/* Integration tests of the KVS front end (issue 30, item 1: any key string
 * is served byte-exact), with the default [kvs_server] options:
 *
 *  - Two key strings are two objects. Spellings of one number in a v1 key
 *    (block-7 and block-007, v1 and v01, tp-1 and tp-01, group-0 and
 *    group-00, block-0 and block--0) once named one object: the second
 *    writer was told its object was stored and its readers got the first
 *    writer's bytes. Only canonical numbers make a v1 key; any other
 *    spelling is an opaque key, an object of its own.
 *  - A key in the v1 format whose parts do not fit a namespace layout (its
 *    deployment id and ns too long for the layout's extra, with the rank and
 *    size tags the front end may append), or whose deployment id holds a
 *    byte a layout's model refuses (DEL), once got 400: it is an opaque key.
 *
 * rtp-llm's store() and match + read sequences (kvs_client.h); assertions
 * are on statuses and bytes. */
#include <check.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"

#define BLOCK 8192u

/* The error text of a create of key (size bytes), for a failure message. */
static void create_error(const kvsc *c, const char *key, uint64_t size, char *err, size_t errlen)
{
    const char *keys[1] = { key };
    char *body = kvsc_acquire_body("create", keys, 1, size, 60);
    kvsc_reply r;
    snprintf(err, errlen, "-");
    if (body && kvsc_call(c->url, "acquire", body, &r) == 0) {
        snprintf(err, errlen, "%ld %s", r.status, json_string_value(json_object_get(r.body, "error")) ?: "");
        const char *lease = kvsc_lease_id(&r);
        if (*lease)
            kvsc_lease_call(c, "discard", lease);
        kvsc_reply_free(&r);
    }
    free(body);
}

/* rtp-llm's store() of one object (key, size bytes of bytes), then its read:
 * whether both succeed and the bytes read back (else why, appended to why). */
static bool read_is(const kvsc *c, const char *key, const uint8_t *want, uint64_t size, char *why, size_t whylen);
static bool store_reads_back(const kvsc *c, const char *key, const uint8_t *bytes, uint64_t size, char *why,
                             size_t whylen)
{
    const char *keys[1] = { key };
    const uint8_t *blocks[1] = { bytes };
    long st = kvsc_store(c, keys, 1, blocks, size, 60);
    if (st != 0) {
        char err[512];
        size_t used = strlen(why);
        create_error(c, key, size, err, sizeof err);
        snprintf(why + used, whylen - used, "; store of '%.60s...' (%" PRIu64 " bytes) answered %ld (a create "
                 "now: %.200s)", key, size, st, err);
        return false;
    }
    return read_is(c, key, bytes, size, why, whylen);
}

/* rtp-llm's store() of one object: key, size bytes of bytes. */
static void store_one(const kvsc *c, const char *key, const uint8_t *bytes, uint64_t size)
{
    const char *keys[1] = { key };
    const uint8_t *blocks[1] = { bytes };
    long st = kvsc_store(c, keys, 1, blocks, size, 60);
    if (st != 0) {
        char err[512];
        create_error(c, key, size, err, sizeof err);
        ck_abort_msg("store of '%.80s' (%" PRIu64 " bytes) answered %ld (a create now: %s)", key, size, st, err);
    }
}

/* rtp-llm's match + read of one object: whether it is there and holds want
 * (else why, appended to why). */
static bool read_is(const kvsc *c, const char *key, const uint8_t *want, uint64_t size, char *why, size_t whylen)
{
    const char *keys[1] = { key };
    uint8_t *got = calloc(1, size);
    uint8_t *outs[1] = { got };
    size_t hits = 0, used = strlen(why);
    ck_assert_ptr_nonnull(got);
    long st = kvsc_read(c, keys, 1, outs, size, 60, &hits, NULL);
    const char *bad = st != 0 ? "read failed" : hits != 1 ? "not found" : memcmp(got, want, size) ? "other bytes" : NULL;
    free(got);
    if (bad)
        snprintf(why + used, whylen - used, "; '%.80s': %s (%ld)", key, bad, st);
    return !bad;
}

/* rtp-llm's match + read of one object: it is there and holds want. */
static void read_exact(const kvsc *c, const char *key, const uint8_t *want, uint64_t size)
{
    char why[256] = "";
    ck_assert_msg(read_is(c, key, want, size, why, sizeof why), "its writer's bytes do not read back%s", why);
}

static void open_client(kvs_env *e, kvsc *c)
{
    char why[256];
    ck_assert_msg(kvsc_open(c, e->url, e->kvs_sock, why, sizeof why) == 0, "%s", why);
}

/* Each pair: a canonical v1 key and another spelling of its numbers. */
START_TEST(each_spelling_of_a_number_is_its_own_object)
{
    static const struct { const char *canon, *variant; } pair[] = {
        { "rtp_llm/v1/dep-alias/tp-0/group-0/block-7", "rtp_llm/v1/dep-alias/tp-0/group-0/block-007" },
        { "rtp_llm/v1/dep-alias/tp-0/group-0/block-8", "rtp_llm/v01/dep-alias/tp-0/group-0/block-8" },
        { "rtp_llm/v1/dep-alias/tp-1/group-0/block-9", "rtp_llm/v1/dep-alias/tp-01/group-0/block-9" },
        { "rtp_llm/v1/dep-alias/tp-0/group-0/block-10", "rtp_llm/v1/dep-alias/tp-0/group-00/block-10" },
        { "rtp_llm/v1/dep-alias/tp-0/group-0/block-0", "rtp_llm/v1/dep-alias/tp-0/group-0/block--0" },
        { "rtp_llm/v1/dep-alias/tp-0/group-0/block--5", "rtp_llm/v1/dep-alias/tp-0/group-0/block--05" },
        { "rtp_llm/v1/dep-alias/tp-0/group-0/block-11", "rtp_llm/v1/dep-alias/tp-0/group-0/block-+11" },
    };
    static uint8_t a[BLOCK], b[BLOCK];
    char why[2048] = "";
    bool ok = true;
    kvs_env e;
    kvsc c;

    kvs_env_start(&e, "");
    open_client(&e, &c);
    for (size_t i = 0; i < sizeof pair / sizeof pair[0]; i++) {
        bfill(a, BLOCK, (int64_t)i, 0xA);
        bfill(b, BLOCK, (int64_t)i, 0xB);
        store_one(&c, pair[i].canon, a, BLOCK);
        store_one(&c, pair[i].variant, b, BLOCK);
        if (!read_is(&c, pair[i].canon, a, BLOCK, why, sizeof why))
            ok = false;
        if (!read_is(&c, pair[i].variant, b, BLOCK, why, sizeof why))
            ok = false;
    }
    ck_assert_msg(ok, "each key's writer's bytes do not read back%s", why);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static void fill_part(char *out, size_t n, char ch)
{
    memset(out, ch, n);
    out[n] = '\0';
}

/* Keys in the v1 format that no namespace layout can hold are served. */
START_TEST(a_v1_key_too_long_for_a_layout_is_served)
{
    static uint8_t a[BLOCK], b[BLOCK / 2];
    char ns[128], dep[128], key[512], why[2048] = "";
    bool ok = true;
    kvs_env e;
    kvsc c;

    kvs_env_start(&e, "");
    open_client(&e, &c);
    /* The plain layout's extra (under 256 bytes) cannot hold these parts. */
    fill_part(ns, 100, 'n');
    fill_part(dep, 120, 'd');
    snprintf(key, sizeof key, "%s/v1/%s/tp-0/group-0/block-1", ns, dep);
    bfill(a, BLOCK, 1, 0xA);
    if (!store_reads_back(&c, key, a, BLOCK, why, sizeof why))
        ok = false;
    /* The plain layout fits, the one with a rank tag does not. */
    fill_part(ns, 70, 'n');
    snprintf(key, sizeof key, "%s/v1/%s/tp-3/group-0/block-2", ns, dep);
    bfill(a, BLOCK, 2, 0xA);
    if (!store_reads_back(&c, key, a, BLOCK, why, sizeof why))
        ok = false;
    /* The plain layout fits, a second size's (its size tag appended) does
     * not: both sizes are served. */
    snprintf(key, sizeof key, "%s/v1/%s/tp-0/group-0/block-3", ns, dep);
    if (!store_reads_back(&c, key, a, BLOCK, why, sizeof why))
        ok = false;
    snprintf(key, sizeof key, "%s/v1/%s/tp-0/group-0/block-4", ns, dep);
    bfill(b, BLOCK / 2, 4, 0xB);
    if (!store_reads_back(&c, key, b, BLOCK / 2, why, sizeof why))
        ok = false;
    ck_assert_msg(ok, "v1-format keys too long for a layout are not served%s", why);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* A deployment id with a DEL byte (0x7f: a layout's model refuses it). */
START_TEST(a_v1_key_with_a_del_byte_is_served)
{
    static uint8_t a[BLOCK];
    const char *key = "rtp_llm/v1/dep\x7f-del/tp-0/group-0/block-1";
    kvs_env e;
    kvsc c;

    kvs_env_start(&e, "");
    open_client(&e, &c);
    bfill(a, BLOCK, 1, 0xD);
    store_one(&c, key, a, BLOCK);
    read_exact(&c, key, a, BLOCK);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static Suite *kvs_keys_exact_suite(void)
{
    Suite *s = suite_create("kvs_keys_exact");
    TCase *tc = tcase_create("kvs_keys_exact");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, each_spelling_of_a_number_is_its_own_object);
    tcase_add_test(tc, a_v1_key_too_long_for_a_layout_is_served);
    tcase_add_test(tc, a_v1_key_with_a_del_byte_is_served);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_keys_exact_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
