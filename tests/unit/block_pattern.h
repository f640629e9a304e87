/* block_pattern: a per-key byte pattern for unit tests that write blocks
 * and check them back byte-exact (a wrong key or offset shows). */
#ifndef KVNODE_TEST_BLOCK_PATTERN_H
#define KVNODE_TEST_BLOCK_PATTERN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* len is a multiple of 8. */
static inline void block_fill(uint8_t *p, size_t len, int64_t key)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = (uint64_t)key * 0x9e3779b97f4a7c15u + i;
        memcpy(p + i, &v, 8);
    }
}

/* 1 when p holds key's pattern, 0 otherwise. */
static inline int block_check(const uint8_t *p, size_t len, int64_t key)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = (uint64_t)key * 0x9e3779b97f4a7c15u + i, got;
        memcpy(&got, p + i, 8);
        if (got != v)
            return 0;
    }
    return 1;
}

#endif
