/* Integration: PURGE on the redis backend (issue 31), on a real 3-master
 * cluster of redis-server processes on loopback (tests/common/redisctl.h).
 * A Redis store may hold blocks the purging daemon's index never learnt of
 * — written before its restart, or by another node — and a MATCH finds them
 * (persist.lookup is on for redis). A purge deletes them all: after it,
 * MATCH is 0 on the daemon that purged, on another node, and after a
 * restart; another deployment's blocks stay byte-exact. */
#include <check.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../common/redisctl.h"

#define BB (64u << 10)

static struct rctl cl;

static void cluster_setup(void)
{
    if (rctl_start(&cl, 3, 0, NULL, NULL) < 0) {
        fprintf(stderr, "cluster: %s\n", rctl_err);
        rctl_stop(&cl);
        abort();
    }
}

static void cluster_teardown(void)
{
    rctl_stop(&cl);
}

static void start(kvh_daemon *d)
{
    char conf[1024];
    int w = snprintf(conf, sizeof conf,
                     "memory.host_bytes=4MiB\nmemory.slab_bytes=1MiB\npersist.backend=redis\n"
                     "persist.nodes=%s\npersist.connect_timeout=300ms\npersist.timeout=5s\n"
                     "persist.lookup_negative_ttl=0\n", cl.seeds);
    ck_assert(w > 0 && (size_t)w < sizeof conf);
    KVH_START(d, conf);
}

static void wait_written(const kvh_daemon *d, long long want)
{
    uint64_t deadline = kvh_now_ms() + 10000;
    long long v;
    while ((v = kvh_stat(d, "persist.written_blocks_total")) < want) {
        ck_assert_msg(kvh_now_ms() < deadline, "written_blocks_total %lld < %lld", v, want);
        kvh_sleep_ms(20);
    }
}

START_TEST(purge_reaches_blocks_the_index_never_knew)
{
    kvh_daemon a, b;
    kvnode_layout l0 = kvh_layout("rd-purge", BB, 2, 0), l1 = kvh_layout("rd-purge", BB, 2, 1);
    kvnode_layout lk = kvh_layout("rd-keep", BB, 1, 0);
    kvnode_client *a0, *a1, *ak, *b0, *b1, *bk;
    kvnode_key k[8];
    kvh_chain(k, 8, 77);

    /* A writes both ranks and another deployment, and stops. */
    start(&a);
    KVH_CONNECT(&a, &l0, &a0);
    KVH_CONNECT(&a, &l1, &a1);
    KVH_CONNECT(&a, &lk, &ak);
    KVH_PUT_OK(a0, k, 8, 1);
    KVH_PUT_OK(a1, k, 8, 2);
    KVH_PUT_OK(ak, k, 8, 3);
    wait_written(&a, 24);
    kvnode_close(a0);
    kvnode_close(a1);
    kvnode_close(ak);
    KVH_STOP_DESTROY(&a);

    /* B never saw them (a MATCH would find them in the cluster, and index
     * them): it purges the deployment knowing none of its blocks. */
    start(&b);
    KVH_CONNECT(&b, &l0, &b0);
    KVH_CONNECT(&b, &l1, &b1);
    KVH_CONNECT(&b, &lk, &bk);
    uint32_t nns = 0;
    KVH_OK(b0, kvnode_purge(b0, NULL, NULL, NULL, &nns, NULL));
    ck_assert_uint_eq(nns, 2);
    ck_assert_msg(kvh_match(b0, k, 8) == 0, "rank 0 matched %ld after the purge", kvh_match(b0, k, 8));
    ck_assert_msg(kvh_match(b1, k, 8) == 0, "rank 1 matched %ld after the purge", kvh_match(b1, k, 8));
    ck_assert_uint_eq(KVH_GET_VERIFIED(bk, k, 8, 3), 8);
    kvnode_close(b0);
    kvnode_close(b1);
    kvnode_close(bk);
    KVH_STOP_DESTROY(&b);

    /* Another daemon (or B restarted): still nothing of the purged deployment. */
    start(&a);
    KVH_CONNECT(&a, &l0, &a0);
    KVH_CONNECT(&a, &l1, &a1);
    KVH_CONNECT(&a, &lk, &ak);
    ck_assert_int_eq(kvh_match(a0, k, 8), 0);
    ck_assert_int_eq(kvh_match(a1, k, 8), 0);
    ck_assert_uint_eq(KVH_GET_VERIFIED(ak, k, 8, 3), 8);
    /* What a MATCH finds before a purge it indexes; the purge takes that too. */
    KVH_PUT_OK(a0, k, 8, 4);
    wait_written(&a, 8);
    kvnode_close(a0);
    kvnode_close(a1);
    kvnode_close(ak);
    KVH_STOP_DESTROY(&a);
    start(&a);
    KVH_CONNECT(&a, &l0, &a0);
    ck_assert_int_eq(kvh_match(a0, k, 8), 8);
    KVH_OK(a0, kvnode_purge(a0, NULL, NULL, "rd-purge", NULL, NULL));
    ck_assert_int_eq(kvh_match(a0, k, 8), 0);
    kvnode_close(a0);
    KVH_STOP_DESTROY(&a);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon_purge_redis");
    TCase *tc = tcase_create("cluster");
    tcase_add_unchecked_fixture(tc, cluster_setup, cluster_teardown);
    tcase_add_test(tc, purge_reaches_blocks_the_index_never_knew);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
