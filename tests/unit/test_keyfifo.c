/* keyfifo: identities told apart by every field, values kept, the oldest
 * forgotten first (test_negcache and test_persist cover its two users). */
#include <check.h>

#include <stdlib.h>

#include "core/keyfifo.h"

START_TEST(test_fields_values_and_order)
{
    struct keyfifo *f;
    ck_assert_int_eq(keyfifo_create(3, &f), 0);
    const struct keyfifo_id a = { .scope = 9, .sub = 0, .key = 5, .check = 1 };
    struct keyfifo_id b = a, c = a, d = a;
    b.sub = 1;      /* the same block key under another TP rank */
    c.scope = 10;   /* ... another deployment or namespace */
    d.check = 2;    /* ... another check word */
    ck_assert(!keyfifo_put(f, &a, 100));
    ck_assert(!keyfifo_put(f, &b, 200));
    ck_assert(!keyfifo_put(f, &c, 300));
    ck_assert_uint_eq(keyfifo_count(f), 3);
    ck_assert_ptr_null(keyfifo_find(f, &d));
    ck_assert_uint_eq(*keyfifo_find(f, &a), 100);
    ck_assert_uint_eq(*keyfifo_find(f, &b), 200);
    ck_assert_uint_eq(*keyfifo_find(f, &c), 300);
    /* Full: d pushes out the oldest, a. */
    ck_assert(keyfifo_put(f, &d, 400));
    ck_assert_ptr_null(keyfifo_find(f, &a));
    ck_assert_uint_eq(*keyfifo_find(f, &d), 400);
    ck_assert_uint_eq(keyfifo_count(f), 3);
    /* Removed, then absent; removing again says so. */
    ck_assert(keyfifo_remove(f, &b));
    ck_assert(!keyfifo_remove(f, &b));
    ck_assert_ptr_null(keyfifo_find(f, &b));
    ck_assert_uint_eq(keyfifo_count(f), 2);
    keyfifo_destroy(f);
    ck_assert_int_lt(keyfifo_create(0, &f), 0);
    ck_assert_ptr_null(f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("keyfifo");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_fields_values_and_order);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
