/* negcache: a bounded cache of store lookups that found nothing — (namespace
 * id, block key, check word) -> when the store said the key was absent — so
 * that MATCH and GET of a chain nobody stored do not ask the store again
 * within [persist] lookup_negative_ttl. A core/keyfifo (oldest replaced first
 * when full; every call O(1) expected, none walks the cache) valued by when
 * each miss was seen. Memory: capacity * NEGCACHE_ENTRY_BYTES, taken once at
 * creation. Loop thread only (the cache's); no locking. */
#ifndef KVNODE_NEGCACHE_H
#define KVNODE_NEGCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Entries a cache's negative cache holds (the oldest is replaced beyond). */
#define NEGCACHE_CAPACITY 65536u
/* Bytes per entry (a keyfifo entry, core/keyfifo.h KEYFIFO_ENTRY_BYTES). */
#define NEGCACHE_ENTRY_BYTES 48u

struct negcache;

/* capacity: entries held (>= 1, <= 2^30). 0 or -KVNODE_ENOMEM / -KVNODE_EINVAL. */
int  negcache_create(uint32_t capacity, struct negcache **out);
void negcache_destroy(struct negcache *nc);   /* NULL ok */

/* Remember that the store lacked (ns, key, check) at now_ms; an entry for
 * the same triple is renewed (and becomes the newest). */
void negcache_insert(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check, uint64_t now_ms);
/* Whether (ns, key, check) was found absent less than ttl_ms before now_ms.
 * An entry older than that is removed. ttl_ms 0: never. */
bool negcache_hit(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check, uint64_t now_ms,
                  uint64_t ttl_ms);
/* Forget (ns, key, check) (a local put made it exist); absent: no-op. */
void negcache_remove(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check);
/* Entries held (live or not yet found expired). */
size_t negcache_count(const struct negcache *nc);
/* Entries pushed out by newer ones while the cache was full. */
uint64_t negcache_replaced(const struct negcache *nc);

#endif
