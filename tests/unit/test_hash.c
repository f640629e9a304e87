/* Unit tests for lib/hash.c (rtp-llm / KVCM chained block-key hash,
 * docs/PROTOCOLS.md §4.1) and lib/errors.c (kvnode_strerror).
 *
 * The hash is checked two ways: against literal golden keys (computed once
 * and cross-checked by hand and by an independent Python implementation),
 * and against a reference written here in 128-bit integer arithmetic
 * (floor division instead of shifts), on fixed and random inputs. */
#include <check.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvnode.h"

#define GOLDEN_RATIO_64 0x9e3779b97f4a7c15ULL

/* v mod 2^64 as a two's-complement int64. */
static int64_t ref_wrap(__int128 v)
{
    const __int128 m = (__int128)1 << 64;

    v %= m;
    if (v < 0)
        v += m;
    if (v >= (__int128)1 << 63)
        v -= m;
    return (int64_t)v;
}

/* floor(h / 2^32): what an arithmetic right shift by 32 means. */
static __int128 ref_floor_div32(int64_t h)
{
    const __int128 d = (__int128)1 << 32;
    __int128 x = h, q = x / d;

    if (x % d != 0 && x < 0)
        q -= 1;
    return q;
}

static size_t ref_hash(const int64_t *t, size_t n, uint32_t b, int64_t *keys, size_t max_keys)
{
    int64_t h = 0;
    size_t w = 0, i, j;

    for (i = 0; b > 0 && i + b <= n && w < max_keys; i += b) {
        for (j = 0; j < b; j++) {
            __int128 s = (__int128)t[i + j] + (__int128)GOLDEN_RATIO_64 + (__int128)h * 4096 +
                         ref_floor_div32(h);
            h = ref_wrap((__int128)(h ^ ref_wrap(s)));
        }
        keys[w++] = h;
    }
    return w;
}

static void check_against_ref(const int64_t *t, size_t n, uint32_t b, size_t max_keys)
{
    int64_t want[256], got[256];
    size_t nw, ng, i;

    ck_assert_uint_le(max_keys, 256);
    memset(got, 0x5a, sizeof got);
    nw = ref_hash(t, n, b, want, max_keys);
    ng = kvnode_hash_tokens(t, n, b, got, max_keys);
    ck_assert_uint_eq(ng, nw);
    for (i = 0; i < nw; i++)
        ck_assert_msg(got[i] == want[i], "key %zu: %jd != reference %jd", i, (intmax_t)got[i],
                      (intmax_t)want[i]);
    /* Nothing written past the count. */
    for (i = nw; i < max_keys; i++) {
        int64_t poison;
        memset(&poison, 0x5a, sizeof poison);
        ck_assert(got[i] == poison);
    }
}

/* First step worked by hand: h = 0 ^ (1 + 0x9e3779b97f4a7c15 + 0 + 0). */
START_TEST(test_hash_single_token)
{
    int64_t t[1] = {1}, k[1];

    ck_assert_uint_eq(kvnode_hash_tokens(t, 1, 1, k, 1), 1);
    ck_assert(k[0] == INT64_C(-7046029254386353130));   /* 0x9e3779b97f4a7c16 */
    check_against_ref(t, 1, 1, 1);
}
END_TEST

/* Second step worked by hand (exercises << 12 and the sign-filling >> 32):
 * h1 = 0x9e3779b97f4a7c16; s = G + (h1<<12) + (h1>>32)
 *    = 0x9e3779b97f4a7c15 + 0x779b97f4a7c16000 + 0xffffffff9e3779b9
 *    = 0x15d311adc54355ce;  h2 = h1 ^ s = 0x8be46814ba0929d8. */
START_TEST(test_hash_two_tokens_by_hand)
{
    int64_t t[2] = {1, 0}, k[1];

    ck_assert_uint_eq(kvnode_hash_tokens(t, 2, 2, k, 1), 1);
    ck_assert(k[0] == INT64_C(-8366447769517741608));   /* 0x8be46814ba0929d8 */
    check_against_ref(t, 2, 2, 1);
}
END_TEST

static const int64_t golden_0_15[4] = {
    INT64_C(455111276453135508),
    INT64_C(6713779586671547074),
    INT64_C(-1712794477054135035),
    INT64_C(6556265598806870907),
};

START_TEST(test_hash_golden_0_15)
{
    int64_t t[16], k[8];
    size_t i;

    for (i = 0; i < 16; i++)
        t[i] = (int64_t)i;
    ck_assert_uint_eq(kvnode_hash_tokens(t, 16, 4, k, 8), 4);
    for (i = 0; i < 4; i++)
        ck_assert(k[i] == golden_0_15[i]);
    check_against_ref(t, 16, 4, 8);
}
END_TEST

START_TEST(test_hash_partial_block)
{
    int64_t t[18] = {1, 2, 3}, k[8];
    size_t i;

    k[0] = 42;
    ck_assert_uint_eq(kvnode_hash_tokens(t, 3, 4, k, 8), 0);
    ck_assert(k[0] == 42);
    /* A trailing partial block adds no key and does not change earlier ones. */
    for (i = 0; i < 18; i++)
        t[i] = (int64_t)i;
    ck_assert_uint_eq(kvnode_hash_tokens(t, 18, 4, k, 8), 4);
    for (i = 0; i < 4; i++)
        ck_assert(k[i] == golden_0_15[i]);
}
END_TEST

START_TEST(test_hash_max_keys_truncation)
{
    int64_t t[16], k[4] = {7, 7, 7, 7};
    size_t i;

    for (i = 0; i < 16; i++)
        t[i] = (int64_t)i;
    ck_assert_uint_eq(kvnode_hash_tokens(t, 16, 4, k, 2), 2);
    ck_assert(k[0] == golden_0_15[0]);
    ck_assert(k[1] == golden_0_15[1]);
    ck_assert(k[2] == 7 && k[3] == 7);
    ck_assert_uint_eq(kvnode_hash_tokens(t, 16, 4, k, 0), 0);
    check_against_ref(t, 16, 4, 3);
}
END_TEST

START_TEST(test_hash_negative_tokens)
{
    int64_t t[4] = {-1, -2, -100, INT64_MIN}, k[2];

    ck_assert_uint_eq(kvnode_hash_tokens(t, 4, 2, k, 2), 2);
    ck_assert(k[0] == INT64_C(-8366447769517733416));
    ck_assert(k[1] == INT64_C(-8768260691845065857));
    check_against_ref(t, 4, 2, 2);
}
END_TEST

START_TEST(test_hash_big_tokens)
{
    int64_t t[6] = {151643, 151644, 151645, 151643, 0, 1}, one[1] = {151643}, k[2];

    ck_assert_uint_eq(kvnode_hash_tokens(t, 6, 3, k, 2), 2);
    ck_assert(k[0] == INT64_C(8024476777492602588));
    ck_assert(k[1] == INT64_C(8532917566836331491));
    ck_assert_uint_eq(kvnode_hash_tokens(one, 1, 1, k, 1), 1);
    ck_assert(k[0] == INT64_C(-7046029254386201488));   /* -7046029254386353131 + 151643 */
    check_against_ref(t, 6, 3, 2);
}
END_TEST

START_TEST(test_hash_degenerate_args)
{
    int64_t t[4] = {1, 2, 3, 4}, k[4];

    ck_assert_uint_eq(kvnode_hash_tokens(t, 4, 0, k, 4), 0);
    ck_assert_uint_eq(kvnode_hash_tokens(NULL, 4, 1, k, 4), 0);
    ck_assert_uint_eq(kvnode_hash_tokens(t, 4, 1, NULL, 4), 0);
    ck_assert_uint_eq(kvnode_hash_tokens(t, 0, 1, k, 4), 0);
}
END_TEST

/* Chaining: key i depends on every token before it, so a prefix's keys are
 * a prefix of the longer sequence's keys. */
START_TEST(test_hash_prefix_property)
{
    int64_t t[64], a[16], b[16];
    size_t i;

    for (i = 0; i < 64; i++)
        t[i] = (int64_t)(i * 7919);
    ck_assert_uint_eq(kvnode_hash_tokens(t, 64, 4, a, 16), 16);
    ck_assert_uint_eq(kvnode_hash_tokens(t, 40, 4, b, 16), 10);
    ck_assert(memcmp(a, b, 10 * sizeof a[0]) == 0);
    t[0] ^= 1;
    ck_assert_uint_eq(kvnode_hash_tokens(t, 64, 4, b, 16), 16);
    for (i = 0; i < 16; i++)
        ck_assert(a[i] != b[i]);
}
END_TEST

static uint64_t rng_state = 0x243f6a8885a308d3ULL;
static uint64_t rng_next(void)
{
    /* xorshift64*: fixed seed, reproducible */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dULL;
}

START_TEST(test_hash_random_vs_reference)
{
    int64_t t[512];
    int round;

    for (round = 0; round < 2000; round++) {
        size_t n = (size_t)(rng_next() % 512), i;
        uint32_t b = (uint32_t)(rng_next() % 16) + 1;
        size_t mk = (size_t)(rng_next() % 64) + 1;

        for (i = 0; i < n; i++) {
            uint64_t r = rng_next();
            /* mix small ids, vocabulary-sized ids, and full-range values */
            t[i] = (r & 3) == 0 ? (int64_t)(r >> 2) - INT64_C(0x1fffffffffffffff)
                 : (r & 3) == 1 ? (int64_t)(r % 200000) : (int64_t)(r % 64) - 32;
        }
        check_against_ref(t, n, b, mk);
    }
}
END_TEST

/* --- errors ------------------------------------------------------------------ */

/* kvnode_fold_digests: the first 8 bytes big-endian as the signed key, the
 * next 8 as the check word, 0 made 1; bad arguments fold nothing. */
START_TEST(test_fold_digests)
{
    unsigned char d[3][32];
    kvnode_key keys[3];
    uint64_t checks[3];

    for (int i = 0; i < 32; i++) {
        d[0][i] = (unsigned char)i;            /* 00 01 02 ... */
        d[1][i] = (unsigned char)(0xff - i);   /* ff fe fd ... */
        d[2][i] = 0;
    }
    d[2][7] = 5;                               /* key 5, word 0 -> 1 */
    ck_assert_uint_eq(kvnode_fold_digests(d, 3, 32, keys, checks), 3);
    ck_assert_int_eq(keys[0], INT64_C(0x0001020304050607));
    ck_assert_uint_eq(checks[0], UINT64_C(0x08090a0b0c0d0e0f));
    ck_assert_int_eq(keys[1], (kvnode_key)UINT64_C(0xfffefdfcfbfaf9f8));   /* negative */
    ck_assert_int_lt(keys[1], 0);
    ck_assert_uint_eq(checks[1], UINT64_C(0xf7f6f5f4f3f2f1f0));
    ck_assert_int_eq(keys[2], 5);
    ck_assert_uint_eq(checks[2], 1);
    /* 16-byte digests laid end to end: the same words from the same bytes */
    unsigned char s[2][16];
    memcpy(s[0], d[0], 16);
    memcpy(s[1], d[1], 16);
    ck_assert_uint_eq(kvnode_fold_digests(s, 2, 16, keys, checks), 2);
    ck_assert_uint_eq(checks[1], UINT64_C(0xf7f6f5f4f3f2f1f0));
    ck_assert_uint_eq(kvnode_fold_digests(d, 3, 15, keys, checks), 0);
    ck_assert_uint_eq(kvnode_fold_digests(NULL, 3, 32, keys, checks), 0);
    ck_assert_uint_eq(kvnode_fold_digests(d, 3, 32, NULL, checks), 0);
    ck_assert_uint_eq(kvnode_fold_digests(d, 3, 32, keys, NULL), 0);
}
END_TEST

START_TEST(test_strerror_every_code)
{
    static const int codes[] = {
        KVNODE_EINVAL, KVNODE_ENOMEM, KVNODE_ENOSPC, KVNODE_ENOLEASE, KVNODE_ELAYOUT,
        KVNODE_EVERSION, KVNODE_EPROTO, KVNODE_ETOOBIG, KVNODE_ETIMEDOUT, KVNODE_ECONNECT,
        KVNODE_ECLOSED, KVNODE_EIO, KVNODE_ESTATE, KVNODE_ELIMIT, KVNODE_EDENIED,
        KVNODE_EINTERNAL, KVNODE_ESHUTDOWN,
    };
    const char *unknown = kvnode_strerror(-1000);
    size_t i, j;

    ck_assert_str_eq(unknown, "unknown error");
    ck_assert_str_ne(kvnode_strerror(0), unknown);
    for (i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *m = kvnode_strerror(-codes[i]);

        ck_assert_ptr_nonnull(m);
        ck_assert_msg(strcmp(m, unknown) != 0, "code %d has no message", codes[i]);
        ck_assert_str_eq(kvnode_strerror(codes[i]), m);   /* either sign */
        for (j = 0; j < i; j++)
            ck_assert_str_ne(kvnode_strerror(-codes[j]), m);
    }
    ck_assert_str_eq(kvnode_strerror(-(KVNODE_ESHUTDOWN + 1)), unknown);
    ck_assert_str_eq(kvnode_strerror(KVNODE_ESHUTDOWN + 1), unknown);
    ck_assert_str_eq(kvnode_strerror(INT_MIN), unknown);
    ck_assert_str_eq(kvnode_strerror(INT_MAX), unknown);
}
END_TEST

START_TEST(test_version_string)
{
    ck_assert_str_eq(kvnode_version(), KVNODE_VERSION_STRING);
}
END_TEST

static Suite *hash_suite(void)
{
    Suite *s = suite_create("hash");
    TCase *tc = tcase_create("hash");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_hash_single_token);
    tcase_add_test(tc, test_hash_two_tokens_by_hand);
    tcase_add_test(tc, test_hash_golden_0_15);
    tcase_add_test(tc, test_hash_partial_block);
    tcase_add_test(tc, test_hash_max_keys_truncation);
    tcase_add_test(tc, test_hash_negative_tokens);
    tcase_add_test(tc, test_hash_big_tokens);
    tcase_add_test(tc, test_hash_degenerate_args);
    tcase_add_test(tc, test_hash_prefix_property);
    tcase_add_test(tc, test_hash_random_vs_reference);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_strerror_every_code);
    tcase_add_test(tc, test_fold_digests);
    tcase_add_test(tc, test_version_string);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(hash_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
