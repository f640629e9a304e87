/* keyfifo: a bounded set of block identities — (scope, sub, key, check word)
 * with a 64-bit value each — that forgets its oldest entry first when full.
 * It owns a ring of entries in the order they came and an open-addressing
 * table of ring positions (linear probing, backward-shift removal): every
 * call is O(1) expected, none walks the set. Memory: capacity *
 * KEYFIFO_ENTRY_BYTES, taken at creation. One thread (the owner's); no
 * locking. Used for the persist tombstones and the cache's remembered store
 * misses. */
#ifndef KVNODE_KEYFIFO_H
#define KVNODE_KEYFIFO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whose block: scope and sub are the user's (a namespace id; a deployment
 * fingerprint and TP rank), key and check the block's. */
struct keyfifo_id {
    uint64_t scope;
    uint32_t sub;
    int64_t  key;
    uint64_t check;
};

/* Bytes per entry: a 40-byte ring entry and two 4-byte table slots. */
#define KEYFIFO_ENTRY_BYTES 48u

struct keyfifo;

/* capacity: entries held (>= 1, <= 2^30). 0 or -KVNODE_ENOMEM / -KVNODE_EINVAL. */
int  keyfifo_create(uint32_t capacity, struct keyfifo **out);
void keyfifo_destroy(struct keyfifo *f);   /* NULL ok */

/* Add id with value, as the newest entry (an entry for id is replaced).
 * true when the oldest entry was forgotten to make room. */
bool keyfifo_put(struct keyfifo *f, const struct keyfifo_id *id, uint64_t value);
/* The value of id, or NULL when absent (valid until the next put or remove). */
uint64_t *keyfifo_find(const struct keyfifo *f, const struct keyfifo_id *id);
/* Forget id; false when absent. */
bool keyfifo_remove(struct keyfifo *f, const struct keyfifo_id *id);
/* Entries held. */
size_t keyfifo_count(const struct keyfifo *f);

#endif
