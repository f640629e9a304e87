/* KVNODE_CONNECT_BUSY_POLL and $KVNODE_BUSY_POLL_US: the bound a client
 * takes, and calls that spin for their reply answer as any other. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvnode.h"

#define BLOCK 4096u

static const kvnode_layout layout = { .model = "busy", .dtype = "bf16", .block_tokens = 16,
                                      .block_bytes = BLOCK, .num_layers = 1, .kv_heads = 1,
                                      .head_dim = 1, .tp_size = 1 };

static unsigned bound_of(const kvh_daemon *d, unsigned flags, const char *env)
{
    kvnode_client *c;
    if (env)
        setenv("KVNODE_BUSY_POLL_US", env, 1);
    else
        unsetenv("KVNODE_BUSY_POLL_US");
    ck_assert_int_eq(kvnode_connect_flags(d->sock, &layout, -1, flags, &c), 0);
    unsigned us = kvnode_busy_poll_us(c);
    kvnode_close(c);
    unsetenv("KVNODE_BUSY_POLL_US");
    return us;
}

START_TEST(the_bound_comes_from_the_flag_or_the_environment)
{
    kvh_daemon d;
    ck_assert_msg(kvh_start(&d, "") == 0, "%s", kvh_error());
    ck_assert_uint_eq(bound_of(&d, 0, NULL), 0);
    ck_assert_uint_eq(bound_of(&d, KVNODE_CONNECT_BUSY_POLL, NULL), 50);
    ck_assert_uint_eq(bound_of(&d, 0, "7"), 7);
    ck_assert_uint_eq(bound_of(&d, KVNODE_CONNECT_BUSY_POLL, "0"), 0);
    ck_assert_uint_eq(bound_of(&d, KVNODE_CONNECT_BUSY_POLL, "10000"), 10000);
    /* Not a number in 0..10000: ignored, the flag decides. */
    ck_assert_uint_eq(bound_of(&d, KVNODE_CONNECT_BUSY_POLL, "10001"), 50);
    ck_assert_uint_eq(bound_of(&d, 0, "12us"), 0);
    ck_assert_uint_eq(bound_of(&d, 0, "-1"), 0);
    ck_assert_int_eq(kvh_stop(&d, 0), 0);
    kvh_destroy(&d);
}
END_TEST

START_TEST(spinning_calls_answer_byte_exact)
{
    kvh_daemon d;
    kvnode_client *c;
    ck_assert_msg(kvh_start(&d, "") == 0, "%s", kvh_error());
    setenv("KVNODE_BUSY_POLL_US", "2000", 1);
    ck_assert_int_eq(kvnode_connect_flags(d.sock, &layout, -1, KVNODE_CONNECT_BUSY_POLL, &c), 0);
    unsetenv("KVNODE_BUSY_POLL_US");
    ck_assert_uint_eq(kvnode_busy_poll_us(c), 2000);
    static uint8_t src[8][BLOCK], dst[8][BLOCK];
    kvnode_key keys[8];
    const void *in[8];
    void *out[8];
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 8; i++) {
            keys[i] = round * 8 + i;
            memset(src[i], (int)(round * 8 + i), BLOCK);
            memset(dst[i], 0, BLOCK);
            in[i] = src[i];
            out[i] = dst[i];
        }
        ck_assert_int_eq(kvnode_put(c, keys, 8, in), 0);
        size_t matched = 0, got = 0;
        ck_assert_int_eq(kvnode_match(c, keys, 8, &matched), 0);
        ck_assert_uint_eq(matched, 8);
        ck_assert_int_eq(kvnode_get(c, keys, 8, out, &got), 0);
        ck_assert_uint_eq(got, 8);
        ck_assert_int_eq(memcmp(src, dst, sizeof src), 0);
        ck_assert_int_eq(kvnode_ping(c), 0);
    }
    kvnode_close(c);
    ck_assert_int_eq(kvh_stop(&d, 0), 0);
    kvh_destroy(&d);
}
END_TEST

static Suite *busy_suite(void)
{
    Suite *s = suite_create("client_busy_poll");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, the_bound_comes_from_the_flag_or_the_environment);
    tcase_add_test(tc, spinning_calls_answer_byte_exact);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(busy_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
