/* kvcm/keyset: int64 -> small value hash map (see keyset.h). */
#include "kvcm/keyset.h"

#include <stdlib.h>
#include <string.h>

#define KEYSET_MIN 64u

static size_t keyset_hash(int64_t key)
{
    uint64_t x = (uint64_t)key;   /* splitmix64 finaliser: keys are hashes already, but spread them */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (size_t)(x ^ (x >> 31));
}

void keyset_init(struct keyset *s)
{
    memset(s, 0, sizeof *s);
}

void keyset_free(struct keyset *s)
{
    free(s->slots);
    keyset_init(s);
}

void keyset_clear(struct keyset *s)
{
    if (s->slots)
        memset(s->slots, 0, (s->mask + 1) * sizeof *s->slots);
    s->used = 0;
    s->filled = 0;
}

static int keyset_resize(struct keyset *s, size_t cap)
{
    struct keyset_slot *n = calloc(cap, sizeof *n);
    if (!n)
        return -1;
    for (size_t i = 0; s->slots && i <= s->mask; i++) {
        if (s->slots[i].state != 1)
            continue;
        size_t j = keyset_hash(s->slots[i].key) & (cap - 1);
        while (n[j].state == 1)
            j = (j + 1) & (cap - 1);
        n[j] = s->slots[i];
    }
    free(s->slots);
    s->slots = n;
    s->mask = cap - 1;
    s->filled = s->used;
    return 0;
}

static struct keyset_slot *keyset_find(const struct keyset *s, int64_t key)
{
    if (!s->slots)
        return NULL;
    for (size_t j = keyset_hash(key) & s->mask;; j = (j + 1) & s->mask) {
        struct keyset_slot *sl = &s->slots[j];
        if (sl->state == 0)
            return NULL;
        if (sl->state == 1 && sl->key == key)
            return sl;
    }
}

int keyset_put(struct keyset *s, int64_t key, uint8_t value)
{
    struct keyset_slot *sl = keyset_find(s, key);
    if (sl) {
        sl->value = value;
        return 0;
    }
    /* Keep the load (tombstones included) under 1/2. */
    if (!s->slots || (s->filled + 1) * 2 > s->mask + 1) {
        size_t cap = s->slots ? s->mask + 1 : KEYSET_MIN;
        while ((s->used + 1) * 2 > cap / 2)
            cap *= 2;
        if (keyset_resize(s, cap) < 0)
            return -1;
    }
    size_t j = keyset_hash(key) & s->mask;
    while (s->slots[j].state == 1)
        j = (j + 1) & s->mask;
    if (s->slots[j].state == 0)
        s->filled++;
    s->slots[j].key = key;
    s->slots[j].value = value;
    s->slots[j].state = 1;
    s->used++;
    return 0;
}

bool keyset_get(const struct keyset *s, int64_t key, uint8_t *value)
{
    struct keyset_slot *sl = keyset_find(s, key);
    if (sl && value)
        *value = sl->value;
    return sl != NULL;
}

bool keyset_del(struct keyset *s, int64_t key)
{
    struct keyset_slot *sl = keyset_find(s, key);
    if (!sl)
        return false;
    sl->state = 2;
    s->used--;
    return true;
}

bool keyset_next(const struct keyset *s, size_t *pos, int64_t *key, uint8_t *value)
{
    for (; s->slots && *pos <= s->mask; (*pos)++) {
        if (s->slots[*pos].state == 1) {
            *key = s->slots[*pos].key;
            if (value)
                *value = s->slots[*pos].value;
            (*pos)++;
            return true;
        }
    }
    return false;
}
