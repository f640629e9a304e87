/* keyfifo: see keyfifo.h. */
#include "core/keyfifo.h"

#include <stdlib.h>

#include "kvnode.h"

#define SLOT_EMPTY UINT32_MAX

struct keyfifo_entry {      /* the id's fields unpadded, so an entry is 40 bytes */
    uint64_t scope, check, value;
    int64_t key;
    uint32_t sub;
    uint32_t held;          /* 1: in the table; 0: a free or removed ring position */
};

struct keyfifo {
    struct keyfifo_entry *ring;
    uint32_t capacity;
    uint32_t next;          /* the ring position written next: the oldest */
    uint32_t *slots;        /* ring positions, SLOT_EMPTY: free */
    uint32_t mask;          /* table size - 1 (a power of two >= 2 * capacity) */
    size_t count;
};

_Static_assert(sizeof(struct keyfifo_entry) + 2 * sizeof(uint32_t) == KEYFIFO_ENTRY_BYTES,
               "KEYFIFO_ENTRY_BYTES says what an entry costs");

static uint32_t keyfifo_hash(const struct keyfifo_id *id)
{
    /* splitmix64's finaliser over the four: keys are hashes already, but the
     * same key under several words or scopes must spread too. */
    uint64_t x = (uint64_t)id->key ^ (id->check * UINT64_C(0x9e3779b97f4a7c15)) ^
                 (id->scope * UINT64_C(0xc2b2ae3d27d4eb4f)) ^ ((uint64_t)id->sub << 32);
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return (uint32_t)x;
}

static bool keyfifo_same(const struct keyfifo_entry *e, const struct keyfifo_id *id)
{
    return e->key == id->key && e->check == id->check && e->scope == id->scope && e->sub == id->sub;
}

static struct keyfifo_id keyfifo_id_of(const struct keyfifo_entry *e)
{
    return (struct keyfifo_id){ .scope = e->scope, .sub = e->sub, .key = e->key, .check = e->check };
}

int keyfifo_create(uint32_t capacity, struct keyfifo **out)
{
    *out = NULL;
    if (capacity == 0 || capacity > (UINT32_C(1) << 30))
        return -KVNODE_EINVAL;
    uint32_t size = 2;
    while (size < 2 * capacity)
        size <<= 1;
    struct keyfifo *f = calloc(1, sizeof *f);
    if (!f)
        return -KVNODE_ENOMEM;
    f->ring = calloc(capacity, sizeof *f->ring);
    f->slots = malloc((size_t)size * sizeof *f->slots);
    if (!f->ring || !f->slots) {
        keyfifo_destroy(f);
        return -KVNODE_ENOMEM;
    }
    for (uint32_t i = 0; i < size; i++)
        f->slots[i] = SLOT_EMPTY;
    f->capacity = capacity;
    f->mask = size - 1;
    *out = f;
    return 0;
}

void keyfifo_destroy(struct keyfifo *f)
{
    if (!f)
        return;
    free(f->ring);
    free(f->slots);
    free(f);
}

/* The table slot holding id, or SLOT_EMPTY. */
static uint32_t keyfifo_slot(const struct keyfifo *f, const struct keyfifo_id *id)
{
    for (uint32_t i = keyfifo_hash(id) & f->mask;; i = (i + 1) & f->mask) {
        uint32_t r = f->slots[i];
        if (r == SLOT_EMPTY)
            return SLOT_EMPTY;
        if (keyfifo_same(&f->ring[r], id))
            return i;
    }
}

/* Empty table slot i and shift back the entries after it that probing
 * would no longer reach (no tombstones: lookups stay short). */
static void keyfifo_unslot(struct keyfifo *f, uint32_t i)
{
    f->ring[f->slots[i]].held = 0;
    f->count--;
    for (uint32_t j = (i + 1) & f->mask; f->slots[j] != SLOT_EMPTY; j = (j + 1) & f->mask) {
        struct keyfifo_id id = keyfifo_id_of(&f->ring[f->slots[j]]);
        uint32_t home = keyfifo_hash(&id) & f->mask;
        /* Entry j stays when its home lies cyclically in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        f->slots[i] = f->slots[j];
        i = j;
    }
    f->slots[i] = SLOT_EMPTY;
}

bool keyfifo_put(struct keyfifo *f, const struct keyfifo_id *id, uint64_t value)
{
    bool dropped = false;
    uint32_t s = keyfifo_slot(f, id);
    if (s != SLOT_EMPTY)
        keyfifo_unslot(f, s);   /* put again below as the newest */
    uint32_t r = f->next;
    struct keyfifo_entry *old = &f->ring[r];
    if (old->held) {
        struct keyfifo_id oid = keyfifo_id_of(old);
        keyfifo_unslot(f, keyfifo_slot(f, &oid));
        dropped = true;
    }
    f->next = r + 1 == f->capacity ? 0 : r + 1;
    *old = (struct keyfifo_entry){ .scope = id->scope, .check = id->check, .value = value,
                                   .key = id->key, .sub = id->sub, .held = 1 };
    uint32_t i = keyfifo_hash(id) & f->mask;
    while (f->slots[i] != SLOT_EMPTY)
        i = (i + 1) & f->mask;
    f->slots[i] = r;
    f->count++;
    return dropped;
}

uint64_t *keyfifo_find(const struct keyfifo *f, const struct keyfifo_id *id)
{
    uint32_t s = keyfifo_slot(f, id);
    return s == SLOT_EMPTY ? NULL : &f->ring[f->slots[s]].value;
}

bool keyfifo_remove(struct keyfifo *f, const struct keyfifo_id *id)
{
    uint32_t s = keyfifo_slot(f, id);
    if (s == SLOT_EMPTY)
        return false;
    keyfifo_unslot(f, s);
    return true;
}

size_t keyfifo_count(const struct keyfifo *f)
{
    return f->count;
}
