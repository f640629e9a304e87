/* negcache: store misses remembered for a TTL, bounded, oldest replaced. */
#include <check.h>

#include <stdlib.h>

#include "cache/negcache.h"
#include "kvnode.h"

START_TEST(test_insert_hit_expiry)
{
    struct negcache *nc;
    ck_assert_int_eq(negcache_create(16, &nc), 0);
    negcache_insert(nc, 1, 42, 7, 1000);
    ck_assert_uint_eq(negcache_count(nc), 1);
    ck_assert(negcache_hit(nc, 1, 42, 7, 1000, 200));
    ck_assert(negcache_hit(nc, 1, 42, 7, 1199, 200));
    /* Another namespace, key or word is another entry. */
    ck_assert(!negcache_hit(nc, 2, 42, 7, 1000, 200));
    ck_assert(!negcache_hit(nc, 1, 43, 7, 1000, 200));
    ck_assert(!negcache_hit(nc, 1, 42, 8, 1000, 200));
    /* A TTL of 0 never hits (and drops the entry). */
    ck_assert(!negcache_hit(nc, 1, 42, 7, 1000, 0));
    ck_assert_uint_eq(negcache_count(nc), 0);
    /* At the TTL the entry is gone, and removed on the way. */
    negcache_insert(nc, 1, 42, 7, 1000);
    ck_assert(!negcache_hit(nc, 1, 42, 7, 1200, 200));
    ck_assert_uint_eq(negcache_count(nc), 0);
    ck_assert(!negcache_hit(nc, 1, 42, 7, 1000, 200));
    /* A renewed entry ages from its renewal; a longer TTL (reload) applies to it. */
    negcache_insert(nc, 1, 42, 7, 1000);
    negcache_insert(nc, 1, 42, 7, 1150);
    ck_assert_uint_eq(negcache_count(nc), 1);
    ck_assert(negcache_hit(nc, 1, 42, 7, 1300, 200));
    ck_assert(negcache_hit(nc, 1, 42, 7, 2000, 5000));
    negcache_destroy(nc);
}
END_TEST

START_TEST(test_remove)
{
    struct negcache *nc;
    ck_assert_int_eq(negcache_create(8, &nc), 0);
    negcache_insert(nc, 1, 10, 0, 0);
    negcache_insert(nc, 1, 11, 0, 0);
    negcache_remove(nc, 1, 10, 0);
    negcache_remove(nc, 1, 99, 0);   /* absent: nothing */
    ck_assert_uint_eq(negcache_count(nc), 1);
    ck_assert(!negcache_hit(nc, 1, 10, 0, 1, 100));
    ck_assert(negcache_hit(nc, 1, 11, 0, 1, 100));
    negcache_destroy(nc);
}
END_TEST

/* Full: each insert replaces the oldest entry, never a newer one, and the
 * count stays at the capacity. */
START_TEST(test_capacity_replaces_oldest)
{
    struct negcache *nc;
    ck_assert_int_eq(negcache_create(4, &nc), 0);
    for (int64_t k = 0; k < 4; k++)
        negcache_insert(nc, 1, k, 0, 0);
    ck_assert_uint_eq(negcache_count(nc), 4);
    ck_assert_uint_eq(negcache_replaced(nc), 0);
    negcache_insert(nc, 1, 4, 0, 0);
    negcache_insert(nc, 1, 5, 0, 0);
    ck_assert_uint_eq(negcache_count(nc), 4);
    ck_assert_uint_eq(negcache_replaced(nc), 2);
    ck_assert(!negcache_hit(nc, 1, 0, 0, 1, 100));
    ck_assert(!negcache_hit(nc, 1, 1, 0, 1, 100));
    for (int64_t k = 2; k < 6; k++)
        ck_assert_msg(negcache_hit(nc, 1, k, 0, 1, 100), "key %lld lost", (long long)k);
    /* A removed entry's place is reused without replacing a live one. */
    negcache_remove(nc, 1, 2, 0);
    negcache_insert(nc, 1, 6, 0, 0);   /* lands on key 2's old position */
    ck_assert_uint_eq(negcache_replaced(nc), 2);
    negcache_destroy(nc);
}
END_TEST

/* Many entries churned through a small table (collisions, removals from
 * the middle of probe runs): each one inserted last is found, each one
 * removed or replaced is not. */
START_TEST(test_churn_consistent)
{
    enum { CAP = 64, N = 20000 };
    struct negcache *nc;
    ck_assert_int_eq(negcache_create(CAP, &nc), 0);
    for (int64_t k = 0; k < N; k++) {
        negcache_insert(nc, (uint32_t)(k % 3), k * 7919, (uint64_t)k & 1, (uint64_t)k);
        if (k % 5 == 0)
            negcache_remove(nc, (uint32_t)((k - 2) % 3), (k - 2) * 7919, (uint64_t)(k - 2) & 1);
    }
    ck_assert_uint_le(negcache_count(nc), CAP);
    size_t found = 0;
    for (int64_t k = N - 2 * CAP; k < N; k++) {
        bool hit = negcache_hit(nc, (uint32_t)(k % 3), k * 7919, (uint64_t)k & 1, N, 1000000);
        bool removed = k % 5 == 3 && k + 2 < N;   /* removed when k + 2 went in */
        if (k >= N - CAP && !removed)
            ck_assert_msg(hit, "key %lld among the newest %d lost", (long long)k, CAP);
        if (k < N - CAP || removed)
            ck_assert_msg(!hit, "key %lld should be gone", (long long)k);
        found += hit;
    }
    ck_assert_uint_eq(found, negcache_count(nc));
    negcache_destroy(nc);
}
END_TEST

START_TEST(test_create_bounds)
{
    struct negcache *nc = (struct negcache *)1;
    ck_assert_int_eq(negcache_create(0, &nc), -KVNODE_EINVAL);
    ck_assert_ptr_null(nc);
    ck_assert_int_eq(negcache_create((UINT32_C(1) << 30) + 1, &nc), -KVNODE_EINVAL);
    negcache_destroy(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("negcache");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_insert_hit_expiry);
    tcase_add_test(tc, test_remove);
    tcase_add_test(tc, test_capacity_replaces_oldest);
    tcase_add_test(tc, test_churn_consistent);
    tcase_add_test(tc, test_create_bounds);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
