/* Unit tests of daemon/kvcm/keyset.c against a brute-force reference. */
#include <check.h>
#include <stdlib.h>

#include "kvcm/keyset.h"

#define SPACE 3000

START_TEST(test_random_against_reference)
{
    struct keyset s;
    static int ref[SPACE];   /* -1 absent, else value */
    unsigned seed = 12345;

    keyset_init(&s);
    for (int i = 0; i < SPACE; i++)
        ref[i] = -1;
    for (int op = 0; op < 200000; op++) {
        int k = (int)(rand_r(&seed) % SPACE);
        int64_t key = (int64_t)k * 7919 - 1000000;   /* negative and positive keys */
        switch (rand_r(&seed) % 3) {
        case 0:
        case 1: {
            uint8_t v = (uint8_t)(rand_r(&seed) & 0xff);
            ck_assert_int_eq(keyset_put(&s, key, v), 0);
            ref[k] = v;
            break;
        }
        default:
            ck_assert_int_eq(keyset_del(&s, key), ref[k] >= 0);
            ref[k] = -1;
            break;
        }
        if (op % 9973 == 0) {
            size_t n = 0, pos = 0;
            int64_t kk;
            uint8_t v;
            for (int i = 0; i < SPACE; i++) {
                uint8_t got;
                bool present = keyset_get(&s, (int64_t)i * 7919 - 1000000, &got);
                ck_assert_int_eq(present, ref[i] >= 0);
                if (present)
                    ck_assert_int_eq(got, ref[i]);
                n += ref[i] >= 0;
            }
            ck_assert_uint_eq(keyset_count(&s), n);
            size_t seen = 0;
            while (keyset_next(&s, &pos, &kk, &v))
                seen++;
            ck_assert_uint_eq(seen, n);
        }
    }
    keyset_clear(&s);
    ck_assert_uint_eq(keyset_count(&s), 0);
    ck_assert(!keyset_get(&s, -1000000, NULL));
    keyset_free(&s);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("keyset");
    TCase *tc = tcase_create("core");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_random_against_reference);
    suite_add_tcase(su, tc);
    sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
