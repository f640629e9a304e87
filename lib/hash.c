/* hash: the rtp-llm / KVCM chained block-key hash (docs/PROTOCOLS.md §4.1), the fold of
 * foreign digests and keys into keys and check words, and the
 * library version string. */
#include "kvnode.h"

#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "sha256.h"

#ifndef KVNODE_VERSION_STRING
#error "KVNODE_VERSION_STRING must be defined by the build (see Makefile)"
#endif

#define HASH_GOLDEN UINT64_C(0x9e3779b97f4a7c15)

/* Arithmetic right shift by 32 of the int64 whose bits are h, done on
 * unsigned bits so the result does not depend on implementation-defined
 * signed shifts: fill the top 32 bits with the sign bit. */
static uint64_t hash_sar32(uint64_t h)
{
    uint64_t r = h >> 32;

    if (h >> 63)
        r |= UINT64_C(0xffffffff00000000);
    return r;
}

size_t kvnode_hash_tokens(const int64_t *tokens, size_t ntokens, uint32_t block_tokens,
                          kvnode_key *keys, size_t max_keys)
{
    uint64_t h = 0;     /* the bits of the signed running hash */
    size_t nblocks, i, j, written = 0;

    if (!tokens || !keys || block_tokens == 0 || max_keys == 0)
        return 0;
    nblocks = ntokens / block_tokens;
    if (nblocks > max_keys)
        nblocks = max_keys;
    for (i = 0; i < nblocks; i++) {
        const int64_t *blk = tokens + i * (size_t)block_tokens;

        for (j = 0; j < block_tokens; j++)
            h ^= (uint64_t)blk[j] + HASH_GOLDEN + (h << 12) + hash_sar32(h);
        /* Two's-complement reinterpretation, without an out-of-range conversion. */
        keys[written++] = h >> 63 ? -(kvnode_key)(~h) - 1 : (kvnode_key)h;
    }
    return written;
}

const char *kvnode_version(void)
{
    return KVNODE_VERSION_STRING;
}

static uint64_t hash_be64(const unsigned char *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

size_t kvnode_fold_digests(const void *digests, size_t n, size_t digest_len, kvnode_key *keys,
                           uint64_t *checks)
{
    const unsigned char *d = digests;

    if (!digests || !keys || !checks || digest_len < 16)
        return 0;
    for (size_t i = 0; i < n; i++, d += digest_len) {
        uint64_t k = hash_be64(d), w = hash_be64(d + 8);

        keys[i] = k >> 63 ? -(kvnode_key)(~k) - 1 : (kvnode_key)k;
        checks[i] = w ? w : 1;   /* 0 means "no word" */
    }
    return n;
}

/* hash_hex[c]: the value of hex digit c, 0x10 for any other byte (so that ORing the
 * entries of a string tests every byte at once). */
static const unsigned char hash_hex[256] = {
#define X16 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, \
            0x10, 0x10
    X16, X16, X16,
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,      /* '0'-'9' */
    0x10, 10, 11, 12, 13, 14, 15, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
    X16,
    0x10, 10, 11, 12, 13, 14, 15, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
    X16,
    X16, X16, X16, X16, X16, X16, X16, X16,
#undef X16
};

#ifdef __SSE2__
/* The 16 hex digits at p as a big-endian 64-bit value, 16 bytes at once (SGLang's
 * keys are 64 digits: four of these); *ok cleared when one is not a hex digit. */
static uint64_t hash_hex16(const unsigned char *p, int *ok)
{
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i l = _mm_or_si128(x, _mm_set1_epi8(0x20));          /* 'A'-'F' -> 'a'-'f' */
    __m128i digit = _mm_and_si128(_mm_cmpgt_epi8(x, _mm_set1_epi8('0' - 1)),
                                  _mm_cmplt_epi8(x, _mm_set1_epi8('9' + 1)));
    __m128i letter = _mm_and_si128(_mm_cmpgt_epi8(l, _mm_set1_epi8('a' - 1)),
                                   _mm_cmplt_epi8(l, _mm_set1_epi8('f' + 1)));
    __m128i v, b;
    uint64_t r;

    if (_mm_movemask_epi8(_mm_or_si128(digit, letter)) != 0xffff)
        *ok = 0;
    v = _mm_or_si128(_mm_and_si128(digit, _mm_sub_epi8(x, _mm_set1_epi8('0'))),
                     _mm_andnot_si128(digit, _mm_sub_epi8(l, _mm_set1_epi8('a' - 10))));
    /* pairs of nibbles (first digit high) into bytes, in order */
    b = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0xff)), 4),
                     _mm_srli_epi16(v, 8));
    b = _mm_packus_epi16(b, b);
    _mm_storel_epi64((__m128i *)(void *)&r, b);
    return __builtin_bswap64(r);    /* x86: the first byte was the lowest */
}
#endif

/* The key and check word of one foreign key given as text (kvnode_fold_text). */
static void hash_fold_one(const unsigned char *s, size_t len, kvnode_key *key, uint64_t *check)
{
    unsigned char digest[32];
    uint64_t k = 0, w = 0;
    unsigned bad = 0;
    int hex = len >= 16 && len % 2 == 0;
    size_t i = 0;

#ifdef __SSE2__
    if (hex && len >= 32) {
        int ok = 1;

        k = hash_hex16(s, &ok);
        w = hash_hex16(s + 16, &ok);
        for (i = 32; i + 16 <= len; i += 16)
            (void)hash_hex16(s + i, &ok);
        bad = ok ? 0 : 0x10;
    } else
#endif
    if (hex) {      /* key and word in two independent chains, every byte tested */
        for (; i < 16; i++) {
            unsigned v = hash_hex[s[i]], u = i + 16 < len ? hash_hex[s[i + 16]] : 0;

            bad |= v | u;
            k = k << 4 | (v & 0xf);
            w = w << 4 | (u & 0xf);
        }
        i = 32;
    }
    for (; hex && i < len; i++)
        bad |= hash_hex[s[i]];
    hex = hex && !(bad & 0x10);
    if (!hex) {
        sha256_digest(s, len, digest);
        k = hash_be64(digest);
        w = hash_be64(digest + 8);
    } else if (len < 32) {  /* a short hex digest: its own key, a word from its SHA-256 */
        sha256_digest(s, len, digest);
        w = hash_be64(digest + 8);
    }
    *key = k >> 63 ? -(kvnode_key)(~k) - 1 : (kvnode_key)k;
    *check = w ? w : 1;
}

size_t kvnode_fold_text(const char *text, size_t len, size_t n, kvnode_key *keys,
                        uint64_t *checks)
{
    const unsigned char *p = (const unsigned char *)text, *end = p + len;

    if (!text || !keys || !checks || n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *nul = i + 1 < n ? memchr(p, 0, (size_t)(end - p)) : end;

        if (!nul || (i + 1 == n && memchr(p, 0, (size_t)(end - p))))
            return 0;   /* fewer separators than n - 1, or more */
        hash_fold_one(p, (size_t)(nul - p), &keys[i], &checks[i]);
        p = nul + (nul < end);
    }
    return n;
}
