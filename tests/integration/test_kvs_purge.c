/* Integration: a purge reaches the KVS front end's objects (issue 31: "a
 * purge makes MATCH 0 on every door"). Objects rtp-llm stored through the
 * front end live in the namespaces of its deployment id (the layout's
 * model); a purge of that model — by an administrator's observer
 * connection, as kvnodectl purge model makes it — drops them, and the
 * front end's read (rtp-llm's match + read) answers them missing, while
 * another deployment's objects still read back byte-exact. */
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

static void store_one(const kvsc *c, const char *key, const uint8_t *bytes)
{
    const char *keys[1] = { key };
    const uint8_t *blocks[1] = { bytes };
    long st = kvsc_store(c, keys, 1, blocks, BLOCK, 60);
    ck_assert_msg(st == 0, "store of %s answered %ld", key, st);
}

/* rtp-llm's match + read of one object: how many hits (0 or 1); the bytes
 * must be want when it is there. */
static size_t read_hits(const kvsc *c, const char *key, const uint8_t *want)
{
    const char *keys[1] = { key };
    uint8_t *got = calloc(1, BLOCK);
    uint8_t *outs[1] = { got };
    size_t hits = 0;
    ck_assert_ptr_nonnull(got);
    long st = kvsc_read(c, keys, 1, outs, BLOCK, 60, &hits, NULL);
    ck_assert_msg(st == 0, "read of %s answered %ld", key, st);
    if (hits)
        ck_assert_msg(memcmp(got, want, BLOCK) == 0, "%s: other bytes", key);
    free(got);
    return hits;
}

START_TEST(purged_objects_read_as_missing)
{
    static const char *gone[] = { "rtp_llm/v1/dep-purge/tp-0/group-0/block-1",
                                  "rtp_llm/v1/dep-purge/tp-1/group-0/block-2",
                                  "rtp_llm/v1/dep-purge/tp-0/group-0/block-3" };
    static const char *kept = "rtp_llm/v1/dep-keep/tp-0/group-0/block-1";
    static uint8_t a[3][BLOCK], b[BLOCK];
    kvs_env e;
    kvsc c;
    char why[256];

    kvs_env_start(&e, "");
    ck_assert_msg(kvsc_open(&c, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    for (int i = 0; i < 3; i++) {
        bfill(a[i], BLOCK, i + 1, 0xA);
        store_one(&c, gone[i], a[i]);
        ck_assert_uint_eq(read_hits(&c, gone[i], a[i]), 1);
    }
    bfill(b, BLOCK, 1, 0xB);
    store_one(&c, kept, b);

    kvnode_client *obs;
    KVH_CONNECT(&e.d, NULL, &obs);
    uint32_t nns = 0;
    uint64_t nb = 0;
    KVH_OK(obs, kvnode_purge(obs, NULL, NULL, "dep-purge", &nns, &nb));
    ck_assert_uint_ge(nns, 2);    /* its two TP ranks at least */
    ck_assert_uint_eq(nb, 3);
    kvnode_close(obs);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(read_hits(&c, gone[i], a[i]) == 0, "%s still read after the purge", gone[i]);
    ck_assert_uint_eq(read_hits(&c, kept, b), 1);
    /* The front end serves the deployment again afterwards. */
    store_one(&c, gone[0], a[0]);
    ck_assert_uint_eq(read_hits(&c, gone[0], a[0]), 1);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("kvs_purge");
    TCase *tc = tcase_create("kvs_purge");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, purged_objects_read_as_missing);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
