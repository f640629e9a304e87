/* sha256: see sha256.h. */
#include "sha256.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define SHA256_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror32(uint32_t x, unsigned n)
{
    return x >> n | x << (32 - n);
}

static uint32_t load_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void sha256_blocks_c(uint32_t st[8], const unsigned char *p, size_t nblocks)
{
    for (; nblocks > 0; nblocks--, p += 64) {
        uint32_t w[64], a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5],
                 g = st[6], h = st[7];

        for (int i = 0; i < 16; i++)
            w[i] = load_be32(p + 4 * i);
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ w[i - 15] >> 3;
            uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ w[i - 2] >> 10;

            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = h + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) +
                          sha256_k[i] + w[i];
            uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) +
                          ((a & b) ^ (a & c) ^ (b & c));

            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        st[0] += a;
        st[1] += b;
        st[2] += c;
        st[3] += d;
        st[4] += e;
        st[5] += f;
        st[6] += g;
        st[7] += h;
    }
}

#ifdef SHA256_X86
/* The same with the SHA extensions (SHA256RNDS2 does two rounds, SHA256MSG1/2
 * the message schedule), state kept as ABEF / CDGH as the instructions want. */
__attribute__((target("sha,sse4.1")))
static void sha256_blocks_shani(uint32_t st[8], const unsigned char *p, size_t nblocks)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&st[0]), 0xB1); /* CDAB */
    __m128i s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&st[4]), 0x1B);  /* EFGH */
    __m128i s0 = _mm_alignr_epi8(tmp, s1, 8);                                         /* ABEF */

    s1 = _mm_blend_epi16(s1, tmp, 0xF0);                                              /* CDGH */
    for (; nblocks > 0; nblocks--, p += 64) {
        __m128i abef = s0, cdgh = s1, m;
        __m128i w0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)p), bswap);
        __m128i w1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)),
                                      bswap);
        __m128i w2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 32)),
                                      bswap);
        __m128i w3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 48)),
                                      bswap);

/* Rounds 4i..4i+3 with message words w. */
#define SHA_RNDS(i, w)                                                                      \
        m = _mm_add_epi32((w), _mm_loadu_si128((const __m128i *)&sha256_k[4 * (i)]));       \
        s1 = _mm_sha256rnds2_epu32(s1, s0, m);                                              \
        s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(m, 0x0E))
/* a (words 4i-16..) becomes words 4i..4i+3 from b, c, d (the three groups after it). */
#define SHA_NEXT(a, b, c, d)                                                                \
        a = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(a, b),                    \
                                               _mm_alignr_epi8(d, c, 4)), d)
        SHA_RNDS(0, w0);
        SHA_RNDS(1, w1);
        SHA_RNDS(2, w2);
        SHA_RNDS(3, w3);
        for (int i = 4; i < 16; i += 4) {
            SHA_NEXT(w0, w1, w2, w3);
            SHA_RNDS(i, w0);
            SHA_NEXT(w1, w2, w3, w0);
            SHA_RNDS(i + 1, w1);
            SHA_NEXT(w2, w3, w0, w1);
            SHA_RNDS(i + 2, w2);
            SHA_NEXT(w3, w0, w1, w2);
            SHA_RNDS(i + 3, w3);
        }
#undef SHA_RNDS
#undef SHA_NEXT
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    tmp = _mm_shuffle_epi32(s0, 0x1B);                                                /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);                                                 /* DCHG */
    _mm_storeu_si128((__m128i *)&st[0], _mm_blend_epi16(tmp, s1, 0xF0));              /* DCBA */
    _mm_storeu_si128((__m128i *)&st[4], _mm_alignr_epi8(s1, tmp, 8));                 /* HGFE */
}

static int cpu_has_shani(void)
{
    unsigned a, b, c, d;

    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1))
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1;      /* CPUID.(EAX=7,ECX=0):EBX.SHA[bit 29] */
}
#endif

/* -1 not known yet, 0 portable, 1 SHA extensions (a benign race: every thread
 * that looks finds the same answer). */
static atomic_int sha256_mode = -1;

int sha256_shani(void)
{
    int mode = atomic_load_explicit(&sha256_mode, memory_order_relaxed);

    if (mode < 0) {
#ifdef SHA256_X86
        mode = cpu_has_shani();
#else
        mode = 0;
#endif
        atomic_store_explicit(&sha256_mode, mode, memory_order_relaxed);
    }
    return mode;
}

void sha256_use_shani(int on)
{
    atomic_store_explicit(&sha256_mode, -1, memory_order_relaxed);
    if (!on || !sha256_shani())
        atomic_store_explicit(&sha256_mode, 0, memory_order_relaxed);
}

static void sha256_blocks(uint32_t st[8], const unsigned char *p, size_t nblocks)
{
#ifdef SHA256_X86
    if (sha256_shani()) {
        sha256_blocks_shani(st, p, nblocks);
        return;
    }
#endif
    sha256_blocks_c(st, p, nblocks);
}

void sha256_digest(const void *msg, size_t len, unsigned char digest[32])
{
    uint32_t st[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const unsigned char *p = msg;
    unsigned char tail[128];
    size_t full = len / 64, rest = len % 64, tlen = rest < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;

    if (full)
        sha256_blocks(st, p, full);
    memset(tail, 0, tlen);
    if (rest)
        memcpy(tail, p + full * 64, rest);
    tail[rest] = 0x80;
    for (int i = 0; i < 8; i++)
        tail[tlen - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha256_blocks(st, tail, tlen / 64);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (unsigned char)(st[i] >> 24);
        digest[4 * i + 1] = (unsigned char)(st[i] >> 16);
        digest[4 * i + 2] = (unsigned char)(st[i] >> 8);
        digest[4 * i + 3] = (unsigned char)st[i];
    }
}
