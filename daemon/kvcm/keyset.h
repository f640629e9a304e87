/* kvcm/keyset: an open-addressing hash map from int64 block keys to a small
 * value, owned by one thread (the publisher's mirror of complete keys and
 * its coalescing buffer). Grows by doubling; deletions leave tombstones that
 * a growth or rebuild clears. */
#ifndef KVNODE_KVCM_KEYSET_H
#define KVNODE_KVCM_KEYSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct keyset_slot {
    int64_t key;
    uint8_t state;   /* 0 empty, 1 used, 2 deleted */
    uint8_t value;
};

struct keyset {
    struct keyset_slot *slots;
    size_t mask;     /* capacity - 1 (0 when unallocated) */
    size_t used;     /* live keys */
    size_t filled;   /* live + tombstones */
};

void keyset_init(struct keyset *s);
void keyset_free(struct keyset *s);
void keyset_clear(struct keyset *s);
/* Insert or overwrite. 0, or -1 when out of memory (s unchanged). */
int  keyset_put(struct keyset *s, int64_t key, uint8_t value);
/* true when present (value into *value when not NULL). */
bool keyset_get(const struct keyset *s, int64_t key, uint8_t *value);
/* true when it was present. */
bool keyset_del(struct keyset *s, int64_t key);
static inline size_t keyset_count(const struct keyset *s) { return s->used; }
/* Iterate: *pos starts at 0; returns false at the end. */
bool keyset_next(const struct keyset *s, size_t *pos, int64_t *key, uint8_t *value);

#endif
