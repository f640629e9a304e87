/* keylock: per-key FIFO of store operations. */
#include <check.h>

#include <stdlib.h>

#include "mem/keylock.h"
#include "kvnode.h"

struct op {
    struct keylock_waiter w;
    int id;
    int *order;
    int *n;
};

static void started(struct keylock_waiter *w)
{
    struct op *o = (struct op *)w;
    o->order[(*o->n)++] = o->id;
}

START_TEST(test_fifo_per_key)
{
    struct keylock *t;
    int order[8], n = 0;
    struct op ops[4];
    ck_assert_int_eq(keylock_create(&t), 0);
    for (int i = 0; i < 4; i++)
        ops[i] = (struct op){ .w.start = started, .id = i, .order = order, .n = &n };

    ck_assert_int_eq(keylock_acquire(t, 1, 42, &ops[0].w), 1);   /* held */
    ck_assert_int_eq(keylock_acquire(t, 1, 42, &ops[1].w), 0);   /* waits */
    ck_assert_int_eq(keylock_acquire(t, 1, 42, &ops[2].w), 0);   /* waits */
    ck_assert_int_eq(keylock_acquire(t, 2, 42, &ops[3].w), 1);   /* another namespace: free */
    ck_assert_int_eq(keylock_acquire(t, 1, 42, NULL), 0);        /* busy, nothing queued */
    ck_assert_uint_eq(keylock_held(t), 2);
    ck_assert_int_eq(n, 0);

    keylock_release(t, 1, 42);   /* ops[1] now holds it */
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(order[0], 1);
    keylock_release(t, 1, 42);   /* ops[2] */
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(order[1], 2);
    keylock_release(t, 1, 42);   /* free: no waiter was queued by the NULL try */
    ck_assert_int_eq(n, 2);
    ck_assert_uint_eq(keylock_held(t), 1);
    keylock_release(t, 2, 42);
    ck_assert_uint_eq(keylock_held(t), 0);
    keylock_release(t, 2, 42);   /* not held: nothing */
    ck_assert_uint_eq(keylock_held(t), 0);
    ck_assert_int_eq(keylock_acquire(t, 1, 42, NULL), 1);        /* a try on a free key takes it */
    keylock_release(t, 1, 42);
    ck_assert_uint_eq(keylock_held(t), 0);
    keylock_destroy(t);
}
END_TEST

/* Many keys held at once: the table grows and every key stays findable. */
START_TEST(test_growth)
{
    struct keylock *t;
    enum { K = 5000 };
    static struct op waiters[K];
    int order[K], n = 0;
    ck_assert_int_eq(keylock_create(&t), 0);
    for (int i = 0; i < K; i++)
        ck_assert_int_eq(keylock_acquire(t, 7, (int64_t)i * 7919, &waiters[i].w), 1);
    ck_assert_uint_eq(keylock_held(t), K);
    for (int i = 0; i < K; i++) {
        waiters[i] = (struct op){ .w.start = started, .id = i, .order = order, .n = &n };
        ck_assert_int_eq(keylock_acquire(t, 7, (int64_t)i * 7919, &waiters[i].w), 0);
    }
    for (int i = K; i-- > 0;)
        keylock_release(t, 7, (int64_t)i * 7919);
    ck_assert_int_eq(n, K);
    for (int i = 0; i < K; i++)
        ck_assert_int_eq(order[i], K - 1 - i);
    for (int i = 0; i < K; i++)
        keylock_release(t, 7, (int64_t)i * 7919);
    ck_assert_uint_eq(keylock_held(t), 0);
    keylock_destroy(t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("keylock");
    TCase *tc = tcase_create("keylock");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_fifo_per_key);
    tcase_add_test(tc, test_growth);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
