/* hash: the rtp-llm / KVCM chained block-key hash (docs/PROTOCOLS.md §4.1), the fold of
 * foreign digests into keys and check words, and the
 * library version string. */
#include "kvnode.h"

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
