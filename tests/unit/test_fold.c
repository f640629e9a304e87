/* Unit tests for lib/sha256.c (FIPS 180-4 vectors, the SHA-extension and the
 * portable compression against each other) and kvnode_fold_text (lib/hash.c):
 * the keys and check words of foreign keys, against values computed by the
 * Python binding's fold (hashlib), and its argument checks. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvnode.h"
#include "sha256.h"

static void hex32(const unsigned char d[32], char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void check_vectors(void)
{
    static const struct { const char *msg, *hex; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqr"
         "lmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    unsigned char d[32];
    char hex[65];

    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        sha256_digest(v[i].msg, strlen(v[i].msg), d);
        hex32(d, hex);
        ck_assert_str_eq(hex, v[i].hex);
    }
    /* A million 'a's: many blocks in one call. */
    char *a = malloc(1000000);
    ck_assert_ptr_nonnull(a);
    memset(a, 'a', 1000000);
    sha256_digest(a, 1000000, d);
    free(a);
    hex32(d, hex);
    ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

START_TEST(test_sha256_vectors)
{
    check_vectors();                /* with the SHA extensions where the CPU has them */
    sha256_use_shani(0);
    ck_assert_int_eq(sha256_shani(), 0);
    check_vectors();                /* portable */
    sha256_use_shani(1);
}
END_TEST

/* Both compressions agree on every length around the padding edges (55/56/64 bytes
 * and multiples) of a pseudo-random message. */
START_TEST(test_sha256_paths_agree)
{
    unsigned char msg[300], a[32], b[32];
    uint32_t x = 12345;

    for (size_t i = 0; i < sizeof msg; i++) {
        x = x * 1103515245u + 12345u;
        msg[i] = (unsigned char)(x >> 16);
    }
    for (size_t len = 0; len <= sizeof msg; len++) {
        sha256_use_shani(1);
        sha256_digest(msg, len, a);
        sha256_use_shani(0);
        sha256_digest(msg, len, b);
        ck_assert_msg(memcmp(a, b, 32) == 0, "length %zu: the two compressions differ", len);
    }
    sha256_use_shani(1);
}
END_TEST

/* Values of the Python binding's fold (hashlib's SHA-256). */
static const struct {
    const char *text;
    kvnode_key key;
    uint64_t check;
} golden[] = {
    /* SGLang: a 64-hex-digit SHA-256: its own bytes */
    {"6c87e5496f592f3c5af16c684e6edae23fd291553049e83f6f85afb74530495c",
     INT64_C(7820471381515644732), UINT64_C(0x5af16c684e6edae2)},
    /* LMCache's "model@rank@hash": its SHA-256 */
    {"Qwen/Qwen3-8B@00000000@6c87f68371b28954707ebb92afee7ccffb74c6f71ec8fea8a98cf6104289585b",
     INT64_C(5749922848879300330), UINT64_C(0xe27277ac7eeb8a63)},
    /* 24 hex digits (either case): key from the digits, check word from the SHA-256 */
    {"0123456789ABCDEFfedcba98", INT64_C(81985529216486895), UINT64_C(0x63a63b33d29be9cb)},
    {"", INT64_C(-2039914840885289964), UINT64_C(0x9afbf4c8996fb924)},
    {"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", INT64_C(-1),
     UINT64_C(0xffffffffffffffff)},
};
#define NGOLDEN (sizeof golden / sizeof golden[0])

START_TEST(test_fold_text_golden)
{
    char text[1024];
    size_t len = 0;
    kvnode_key keys[NGOLDEN];
    uint64_t checks[NGOLDEN];

    for (size_t i = 0; i < NGOLDEN; i++) {
        size_t l = strlen(golden[i].text);

        memcpy(text + len, golden[i].text, l);
        len += l;
        if (i + 1 < NGOLDEN)
            text[len++] = '\0';
    }
    ck_assert_uint_eq(kvnode_fold_text(text, len, NGOLDEN, keys, checks), NGOLDEN);
    for (size_t i = 0; i < NGOLDEN; i++) {
        ck_assert_msg(keys[i] == golden[i].key && checks[i] == golden[i].check,
                      "%s: key %lld check %llx, expected %lld %llx", golden[i].text,
                      (long long)keys[i], (unsigned long long)checks[i],
                      (long long)golden[i].key, (unsigned long long)golden[i].check);
    }
    /* The SGLang key agrees with kvnode_fold_digests on its 32 bytes. */
    unsigned char raw[32];
    kvnode_key k;
    uint64_t w;

    for (int i = 0; i < 32; i++) {
        unsigned v;

        ck_assert_int_eq(sscanf(golden[0].text + 2 * i, "%2x", &v), 1);
        raw[i] = (unsigned char)v;
    }
    ck_assert_uint_eq(kvnode_fold_digests(raw, 1, 32, &k, &w), 1);
    ck_assert(k == keys[0] && w == checks[0]);
}
END_TEST

START_TEST(test_fold_text_args)
{
    const char two[] = "abc\0def";     /* two keys, one separator */
    kvnode_key keys[3];
    uint64_t checks[3];

    ck_assert_uint_eq(kvnode_fold_text(two, sizeof two - 1, 2, keys, checks), 2);
    ck_assert_uint_eq(kvnode_fold_text(two, sizeof two - 1, 1, keys, checks), 0); /* 1 too many */
    ck_assert_uint_eq(kvnode_fold_text(two, sizeof two - 1, 3, keys, checks), 0); /* 1 missing */
    ck_assert_uint_eq(kvnode_fold_text(two, sizeof two, 2, keys, checks), 0);     /* trailing NUL */
    ck_assert_uint_eq(kvnode_fold_text(two, sizeof two, 3, keys, checks), 3);     /* "" last */
    ck_assert_uint_eq(kvnode_fold_text(NULL, 0, 1, keys, checks), 0);
    ck_assert_uint_eq(kvnode_fold_text(two, sizeof two - 1, 2, NULL, checks), 0);
    ck_assert_uint_eq(kvnode_fold_text(two, sizeof two - 1, 2, keys, NULL), 0);
    ck_assert_uint_eq(kvnode_fold_text(two, sizeof two - 1, 0, keys, checks), 0);
    /* "abc" alone and as the first of two fold alike. */
    kvnode_key k;
    uint64_t w;

    ck_assert_uint_eq(kvnode_fold_text("abc", 3, 1, &k, &w), 1);
    ck_assert(k == keys[0] && w == checks[0]);
}
END_TEST

static uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* One byte that is not a hex digit anywhere in a hex key (the 16-byte blocks and the
 * tail) makes it text: folded from its SHA-256; all digits (either case) its own bits. */
START_TEST(test_fold_text_hex_positions)
{
    static const size_t lens[] = {16, 20, 32, 46, 64, 70};
    static const char bad[] = {'g', 'G', ' ', '@', '/', ':', '`', 'x', '\x80'};

    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        char text[80];
        size_t len = lens[li];
        kvnode_key k;
        uint64_t w;

        for (size_t i = 0; i < len; i++)
            text[i] = "0123456789abcdefABCDEF"[(i * 7 + 3) % 22];
        ck_assert_uint_eq(kvnode_fold_text(text, len, 1, &k, &w), 1);
        {   /* all digits: the key is the first 16 of them */
            char first[17];

            memcpy(first, text, 16);
            first[16] = '\0';
            ck_assert_msg((uint64_t)k == strtoull(first, NULL, 16), "length %zu: key %llx", len,
                          (unsigned long long)k);
        }
        for (size_t pos = 0; pos < len; pos++) {
            for (size_t b = 0; b < sizeof bad; b++) {
                char t2[80];
                unsigned char d[32];

                memcpy(t2, text, len);
                t2[pos] = bad[b];
                ck_assert_uint_eq(kvnode_fold_text(t2, len, 1, &k, &w), 1);
                sha256_digest(t2, len, d);
                ck_assert_msg((uint64_t)k == be64(d) && w == (be64(d + 8) ? be64(d + 8) : 1),
                              "length %zu, byte %zu = 0x%02x: not folded as text", len, pos,
                              (unsigned char)bad[b]);
            }
        }
    }
}
END_TEST

/* A batch of 64-digit keys (SGLang's) folds as each key does in a batch of mixed keys; a
 * key that is not hex, or keys of other lengths that happen to fill the same bytes, are
 * folded as text. */
START_TEST(test_fold_text_hex64_batch)
{
    enum { N = 9 };
    char text[N * 65], one[66];
    kvnode_key keys[N], k[2];
    uint64_t checks[N], w[2];
    uint32_t x = 777;

    for (size_t i = 0; i < N; i++) {
        for (size_t j = 0; j < 64; j++) {
            x = x * 1103515245u + 12345u;
            text[i * 65 + j] = "0123456789abcdefABCDEF"[(x >> 16) % 22];
        }
        text[i * 65 + 64] = '\0';
    }
    ck_assert_uint_eq(kvnode_fold_text(text, sizeof text - 1, N, keys, checks), N);
    for (size_t i = 0; i < N; i++) {
        memcpy(one, text + i * 65, 64);
        one[64] = '\0';
        one[65] = 'x';      /* the same key, then a non-hex one */
        ck_assert_uint_eq(kvnode_fold_text(one, 66, 2, k, w), 2);
        ck_assert_msg(k[0] == keys[i] && w[0] == checks[i], "key %zu folds differently", i);
    }
    /* key 4 not hex (a 'g' in its third block): it alone is folded as text */
    text[4 * 65 + 40] = 'g';
    ck_assert_uint_eq(kvnode_fold_text(text, sizeof text - 1, N, keys, checks), N);
    {
        unsigned char d[32];

        sha256_digest(text + 4 * 65, 64, d);
        ck_assert((uint64_t)keys[4] == be64(d) && checks[4] == be64(d + 8));
    }
    /* 63 + 65 digits fill the bytes of two 64-digit keys, the NUL one byte early */
    memset(text, 'a', 129);
    text[63] = '\0';
    ck_assert_uint_eq(kvnode_fold_text(text, 129, 2, keys, checks), 2);
    {
        unsigned char d[32];

        sha256_digest(text, 63, d);     /* odd lengths: both folded as text */
        ck_assert((uint64_t)keys[0] == be64(d) && checks[0] == be64(d + 8));
        sha256_digest(text + 64, 65, d);
        ck_assert((uint64_t)keys[1] == be64(d) && checks[1] == be64(d + 8));
    }
}
END_TEST

static Suite *fold_suite(void)
{
    Suite *s = suite_create("fold");
    TCase *tc = tcase_create("sha256");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_sha256_vectors);
    tcase_add_test(tc, test_sha256_paths_agree);
    suite_add_tcase(s, tc);
    tc = tcase_create("fold_text");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_fold_text_golden);
    tcase_add_test(tc, test_fold_text_args);
    tcase_add_test(tc, test_fold_text_hex_positions);
    tcase_add_test(tc, test_fold_text_hex64_batch);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(fold_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
