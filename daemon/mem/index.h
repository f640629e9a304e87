/* index: the (namespace, key) -> block table and the per-class LRU lists.
 *
 * Entries are owned by the index while linked; index_unlink() hands one to
 * the caller (e.g. a pinned block being deleted lives on until its last read
 * lease ends), index_entry_free() releases it. The hash table grows by
 * incremental rehashing (a group per few operations), so no call is O(n).
 *
 * LRU: one recency order per (arena, size class), oldest first, by the stamp
 * of an entry's last use (index_lru_touch, index_lru_use): callers refresh a
 * key chain tail-first (last key first, root last), so a parent is always
 * newer than its children and eviction removes leaves first. A use only
 * restamps the entry and marks it (no list is rewritten); it is moved to its
 * stamp's place (the order's heap) when it reaches the oldest end (second
 * chance, in index_lru_oldest*). One oldest call moves at most
 * INDEX_OLDEST_SETTLE_BUDGET marked entries; the orders' oldest are exact
 * LRU while the runs of marked entries at their oldest ends fit it
 * (index_lru_settle_arena shortens them in the background); over it, a call
 * answers the oldest of the entries it moved. Either way a chain's leaves go
 * before its root (index_lru_chain_begin) and the call is O(budget).
 * Pinned and WRITING entries are kept off the orders, so the oldest listed
 * entry is evictable; an entry whose last pin drops comes back at its
 * own stamp's place (index_lru_add), whatever order the pins drop in (a
 * batch's store writes land in any order). Every listed entry is also in its
 * namespace's order (same stamps, oldest first), for per-namespace quotas:
 * an entry is in both orders or in neither.
 *
 * Table: 64-byte groups of 11 entry ids with a tag byte of each one's hash
 * (mem/index_table.h): a lookup reads its key's group line and the entries
 * whose tags match; the few entries a full group cannot take hang on its
 * chain (through hash_next). index_stats counts the table in buckets, 8 per
 * group: it grows when the index holds as many entries as buckets (8 of a
 * group's 11 slots on average).
 *
 * Memory: entries are 80 bytes in chunks of the index's own; the table's
 * slots and list links are 32-bit entry ids (so at most 2^32 - 1 entries:
 * index_insert fails beyond): about 88 B per entry at 1 M entries.
 * index_stats.bytes is what the index holds.
 *
 * Loop thread only. */
#ifndef KVNODE_INDEX_H
#define KVNODE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum entry_state {
    ENTRY_WRITING   = 1,  /* slot reserved under a write lease, not visible */
    ENTRY_SEALED    = 2,  /* committed: in memory, visible to match/get */
    ENTRY_GHOST     = 3,  /* only in the persistent store: no slot, never on an LRU list */
    ENTRY_PROMOTING = 4,  /* a ghost being read back into its reserved slot */
};

/* What the persistent store holds of an entry's block. */
enum entry_persist {
    PERSIST_NONE    = 0,  /* no copy known */
    PERSIST_WRITING = 1,  /* a write is in flight (the entry is pinned by it) */
    PERSIST_STORED  = 2,  /* the store holds this block */
    PERSIST_FAILED  = 3,  /* the write failed or was dropped: do not retry */
};

/* 80 bytes (asserted in index.c): what a MATCH reads and writes (key, ns,
 * state, tier, arena, class, check, the recency stamp and what a use tests
 * of the orders: index_lru_touch) in the first 48 bytes, the list links
 * last; list links are 32-bit entry ids (0: none) into the index's chunks,
 * not pointers; what only a few entries need lives elsewhere (a
 * promotion's record: the cache's table). */
struct index_entry {
    int64_t  key;
    uint32_t ns;            /* namespace id */
    uint8_t  state;         /* enum entry_state */
    uint8_t  tier;          /* KVNODE_TIER_* of the bytes */
    uint8_t  arena;         /* arena id (< INDEX_MAX_ARENAS), INDEX_NO_ARENA: none */
    uint8_t  cls;           /* size class in that arena (< ARENA_MAX_CLASSES) */
    uint64_t check;         /* the block's check word (0: none): a request with another
                               word does not see the block (cache_entry_for) */
    uint64_t lru_stamp;     /* last use by a client, monotonically increasing */
    uint8_t  lru_arena;     /* the (arena, class) order it is listed in (index's) */
    uint8_t  lru_cls;
    uint8_t  on_lru : 1;    /* linked into an LRU list (maintained by index) */
    uint8_t  detached : 1;  /* unlinked from the index, freed when pins reach 0 */
    uint8_t  evicting : 1;  /* write-back: leaves memory once its write lands (cache's) */
    uint8_t  persist : 2;   /* enum entry_persist (cache's) */
    uint8_t  ref_cls : 1;   /* used since placed in its (arena, class) order's list (index's) */
    uint8_t  ref_ns : 1;    /* used since placed in its namespace order's list (index's) */
    uint32_t pins;          /* read leases (and internal users) holding it */
    uint32_t lru_heap, ns_heap;    /* 1 + place in that order's heap, 0: in its list */
    uint64_t offset;        /* byte offset in the arena */
    uint32_t id;            /* this entry's id (index's) */
    uint32_t hash_next;     /* next on its group's chain, or free entry while freed, 0: none (index's) */
    uint32_t lru_prev, lru_next;   /* ids: (arena, class) order's list (index's) */
    uint32_t ns_prev, ns_next;     /* ids: namespace order's list (index's) */
};

#define INDEX_NO_ARENA UINT8_MAX   /* e->arena of an entry with no slot */

struct kv_index;

/* LRU lists exist for arena ids below INDEX_MAX_ARENAS and size classes below
 * ARENA_MAX_CLASSES; an entry outside that range is never listed. */
#define INDEX_MAX_ARENAS 17u   /* the host arena and one per GPU (DEVMEM_MAX_DEVICES) */
_Static_assert(INDEX_MAX_ARENAS < INDEX_NO_ARENA, "arena ids must fit an entry's byte");
/* Per-namespace lists exist for namespace ids below INDEX_MAX_NAMESPACES
 * (ids are 1-based and at most server.max_namespaces = 65536); an entry of a
 * larger id is never listed. The array of list heads grows on demand. */
#define INDEX_MAX_NAMESPACES 65537u

struct index_stats {
    size_t entries;         /* linked entries */
    size_t buckets;         /* buckets of the main table */
    size_t rehash_buckets;  /* buckets of the table being grown into, 0 when not rehashing */
    size_t lru_entries;     /* entries on some LRU list */
    size_t bytes;           /* held: entry chunks, chunk table, buckets, heaps, order heads */
    size_t settle_moves;    /* marked entries moved to their stamps' places, in all */
    size_t oldest_moves_max;   /* most of them moved by one index_lru_oldest* call */
    size_t oldest_forced;   /* oldest calls that met a marked head with their budget spent */
};

/* Marked entries one index_lru_oldest* call moves at most (plus one for each
 * further class order of the arena that starts with one), so an eviction on
 * demand is O(budget) however many uses went before it: about 0.1 ms of
 * moves (each a few cache misses) at 1 M entries, small next to a request.
 * A background settle (index_lru_settle_arena) keeps the runs of marked
 * entries under it, where the oldest is exact LRU. */
#define INDEX_OLDEST_SETTLE_BUDGET 1024u

/* initial_buckets is rounded up to a power of two (minimum 64). */
int  index_create(size_t initial_buckets, struct kv_index **out);
/* Frees the table and every entry, linked or not (not the arena slots): an
 * unlinked entry is not used after its index is destroyed. */
void index_destroy(struct kv_index *ix);

struct index_entry *index_lookup(struct kv_index *ix, uint32_t ns, int64_t key);
/* A lookup of many keys known up front, in stages run over a batch of keys
 * each (or some keys apart), so that the cache misses of many keys overlap:
 * the key's hash (index_key_hash), its group line loaded
 * (index_prefetch_bucket), the entry whose tag matches in it loaded
 * (index_prefetch_first, which returns its id, 0: none), then
 * index_lookup_hashed. Each stage reads only what the one before loaded and
 * branches on none of it: a mispredicted branch on a missing line would
 * wait for the miss and discard the later keys' loads. The hints have no effect but loading; the hash is valid until the
 * index is destroyed (the id, until the next insert or unlink: it is only a
 * hint). */
uint64_t index_key_hash(const struct kv_index *ix, uint32_t ns, int64_t key);
void index_prefetch_bucket(const struct kv_index *ix, uint64_t h);
uint32_t index_prefetch_first(const struct kv_index *ix, uint64_t h);
struct index_entry *index_lookup_hashed(struct kv_index *ix, uint32_t ns, int64_t key, uint64_t h);
/* Do up to `buckets` buckets' worth of a growth in progress now (what
 * lookups and inserts otherwise do a little at a time: a background
 * caller's share, so that the growth ends sooner). O(buckets); nothing while
 * a walk is open. true: no growth in progress. */
bool index_grow_step(struct kv_index *ix, size_t buckets);
/* Insert a new zeroed entry for (ns, key) (caller checked it is absent) and
 * return it, or NULL when out of memory. */
struct index_entry *index_insert(struct kv_index *ix, uint32_t ns, int64_t key);
/* Remove from the table and its LRU list; the caller now owns e. */
void index_unlink(struct kv_index *ix, struct index_entry *e);
/* Gives an unlinked entry back to the index it came from. */
void index_entry_free(struct kv_index *ix, struct index_entry *e);
size_t index_count(const struct kv_index *ix);
void index_get_stats(const struct kv_index *ix, struct index_stats *st);
/* Make room for the list heads of namespace ids below n (capped at
 * INDEX_MAX_NAMESPACES) now, so index_lru_touch never has to allocate for
 * them. 0 or -KVNODE_ENOMEM. If a touch has to grow the array and cannot,
 * the entry is left off both lists (not evictable) rather than failing. */
int  index_ns_reserve(struct kv_index *ix, uint32_t n);

/* Chunked walk of every linked entry (snapshots built without an O(n)
 * pause). While a walk is open no entry moves in the table (no rehash step;
 * no growth either unless the table's slots run short: the new table then
 * takes the inserts), so an entry linked for the whole walk is visited
 * exactly once; one linked or unlinked meanwhile may or may not be. fn must not link or unlink entries.
 * Close an unfinished walk with index_walk_end (a finished one closes
 * itself). Several walks may be open at once. */
struct index_walk {
    int    table;
    size_t pos;
    bool   open;
};
void index_walk_begin(struct kv_index *ix, struct index_walk *w);
/* Visit up to `buckets` buckets (whole groups of 8, at least one); true
 * while more remain. */
bool index_walk_step(struct kv_index *ix, struct index_walk *w, size_t buckets,
                     void (*fn)(void *arg, struct index_entry *e), void *arg);
void index_walk_end(struct kv_index *ix, struct index_walk *w);

/* e's neighbours in the list of its (arena, class) order and of its
 * namespace's order (NULL: none, or e is in the order's heap or unlisted). */
struct index_entry *index_lru_prev(const struct kv_index *ix, const struct index_entry *e);
struct index_entry *index_lru_next(const struct kv_index *ix, const struct index_entry *e);
struct index_entry *index_ns_prev(const struct kv_index *ix, const struct index_entry *e);
struct index_entry *index_ns_next(const struct kv_index *ix, const struct index_entry *e);

/* A client used e: stamp it newest. Listed in the order of (e->arena,
 * e->cls) and in its namespace's, e is only marked there (it moves to the
 * newest end when it reaches the oldest end); otherwise it is listed at the
 * newest end of both now, moved from elsewhere if its arena or class changed.
 * An entry with an out-of-range arena, class or namespace is stamped but not
 * listed. */
void index_lru_touch(struct kv_index *ix, struct index_entry *e);
/* The uses that follow refresh one chain, tail-first (last key first, root
 * last), until the next call. Once one of them relinks its entry at the
 * newest end (in a heap, another class, pinned), the rest relink too rather
 * than mark, so a chain's root never stays ahead of its leaves in a list
 * (what lets a bounded sweep give a safe victim: index_lru_oldest). Uses
 * with no call before them count as one chain with the uses before. */
void index_lru_chain_begin(struct kv_index *ix);
/* A client used e while it is pinned: stamp it newest; it is listed at that
 * place when its last pin drops. A listed e is touched. */
void index_lru_use(struct kv_index *ix, struct index_entry *e);
/* List an unlisted e (its last pin dropped) at its own stamp's place,
 * without making it newer. O(log n) when it is older than the newest. */
void index_lru_add(struct kv_index *ix, struct index_entry *e);
/* Take e off its LRU orders (pinned, being written, being evicted). */
void index_lru_remove(struct kv_index *ix, struct index_entry *e);
/* Oldest listed entry of one class, or NULL: the exact oldest when the run
 * of marked entries at the order's oldest end fits the budget, else the
 * oldest of the up to INDEX_OLDEST_SETTLE_BUDGET it moved, as are the
 * answers of the next calls, as many as it moved, which move none
 * (oldest_forced counts those calls). Never an entry with a listed
 * descendant in a chain refreshed tail-first. */
struct index_entry *index_lru_oldest(struct kv_index *ix, uint32_t arena, uint32_t cls);
/* Oldest listed entry over every class of an arena, or NULL, as
 * index_lru_oldest in each class: O(classes + budget), the budget shared by
 * the classes (at least one move in each class whose head is marked). */
struct index_entry *index_lru_oldest_in_arena(struct kv_index *ix, uint32_t arena);
/* Move up to `budget` marked entries at the oldest ends of the arena's
 * class orders to their stamps' places, so that a caller can spread a long
 * run of them over several calls and the oldest calls after it are exact.
 * true: no order of the arena starts with a marked entry now. */
bool index_lru_settle_arena(struct kv_index *ix, uint32_t arena, size_t budget);
/* Oldest listed entry of one namespace (any arena, any class), or NULL, as
 * index_lru_oldest over the namespace's order (not settled in the
 * background: its calls are bounded all the same). */
struct index_entry *index_lru_oldest_in_ns(struct kv_index *ix, uint32_t ns);
/* Entries on a namespace's list (its evictable ones). O(1). */
size_t index_lru_count_in_ns(struct kv_index *ix, uint32_t ns);

#endif
