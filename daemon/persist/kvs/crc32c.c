/* crc32c: see crc32c.h. */
#include "persist/kvs/crc32c.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC32C_HAVE_X86 1
#include <nmmintrin.h>
#endif

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc32c_table[8][256];
static int crc32c_hw;
#ifdef CRC32C_HAVE_X86
#define STRIPE_LONG  4096u            /* see crc32c_x86 */
#define STRIPE_SHORT 256u
static void shift_tables(uint32_t tables[4][256], size_t len);
static uint32_t shift_long[4][256], shift_short[4][256];
#endif

__attribute__((constructor)) static void crc32c_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc32c_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^
                                 crc32c_table[0][crc32c_table[t - 1][i] & 0xff];
#ifdef CRC32C_HAVE_X86
    __builtin_cpu_init();
    crc32c_hw = __builtin_cpu_supports("sse4.2");
    if (crc32c_hw) {
        shift_tables(shift_long, STRIPE_LONG);
        shift_tables(shift_short, STRIPE_SHORT);
    }
#endif
}

uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len)
{
    const uint8_t *p = data;
    crc = ~crc;
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = crc32c_table[7][lo & 0xff] ^ crc32c_table[6][(lo >> 8) & 0xff] ^
              crc32c_table[5][(lo >> 16) & 0xff] ^ crc32c_table[4][lo >> 24] ^
              crc32c_table[3][hi & 0xff] ^ crc32c_table[2][(hi >> 8) & 0xff] ^
              crc32c_table[1][(hi >> 16) & 0xff] ^ crc32c_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#ifdef CRC32C_HAVE_X86
/* The crc32 instruction has a latency of 3 cycles and a throughput of 1:
 * long buffers go as three interleaved streams of STRIPE_LONG (then
 * STRIPE_SHORT) bytes, whose CRCs are combined by shifting the first ones
 * over the bytes after them (the operator of appending that many zero bytes,
 * a 32x32 matrix over GF(2) applied a byte at a time from tables), as
 * Mark Adler's crc32c.c does. */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1)
            sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* tables[k][b]: the CRC of byte b at position k of a CRC register followed
 * by len zero bytes (len a power of two, >= 2). */
static void shift_tables(uint32_t tables[4][256], size_t len)
{
    uint32_t odd[32], even[32], row = 1;
    odd[0] = CRC32C_POLY;              /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd);             /* two zero bits */
    gf2_square(odd, even);             /* four */
    const uint32_t *op = odd;
    for (;;) {                         /* one zero byte, two, four, ... */
        gf2_square(even, odd);
        op = even;
        if ((len >>= 1) == 0)
            break;
        gf2_square(odd, even);
        op = odd;
        if ((len >>= 1) == 0)
            break;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int k = 0; k < 4; k++)
            tables[k][b] = gf2_times(op, b << (8 * k));
}

static uint32_t shift(uint32_t tables[4][256], uint32_t crc)
{
    return tables[0][crc & 0xff] ^ tables[1][(crc >> 8) & 0xff] ^ tables[2][(crc >> 16) & 0xff] ^
           tables[3][crc >> 24];
}

/* Three streams of stripe bytes each from p: *c0 extended over all 3 x stripe. */
__attribute__((target("sse4.2"))) static void crc32c_x86_three(uint64_t *c0, const uint8_t *p,
                                                                size_t stripe,
                                                                uint32_t tables[4][256])
{
    uint64_t a = *c0, b = 0, c = 0;
    for (const uint8_t *end = p + stripe; p < end; p += 8) {
        uint64_t va, vb, vc;
        memcpy(&va, p, 8);
        memcpy(&vb, p + stripe, 8);
        memcpy(&vc, p + 2 * stripe, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        c = _mm_crc32_u64(c, vc);
    }
    a = shift(tables, (uint32_t)a) ^ b;
    *c0 = shift(tables, (uint32_t)a) ^ c;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_x86(uint32_t crc, const void *data,
                                                              size_t len)
{
    const uint8_t *p = data;
    uint64_t c = ~crc;
    for (; len >= 3 * STRIPE_LONG; p += 3 * STRIPE_LONG, len -= 3 * STRIPE_LONG)
        crc32c_x86_three(&c, p, STRIPE_LONG, shift_long);
    for (; len >= 3 * STRIPE_SHORT; p += 3 * STRIPE_SHORT, len -= 3 * STRIPE_SHORT)
        crc32c_x86_three(&c, p, STRIPE_SHORT, shift_short);
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--)
        c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

uint32_t crc32c(uint32_t crc, const void *data, size_t len)
{
#ifdef CRC32C_HAVE_X86
    if (crc32c_hw)
        return crc32c_x86(crc, data, len);
#endif
    return crc32c_sw(crc, data, len);
}
