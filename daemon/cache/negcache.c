/* negcache: see negcache.h (a keyfifo of misses, valued by when they were seen). */
#include "cache/negcache.h"

#include <stdlib.h>

#include "core/keyfifo.h"
#include "kvnode.h"

_Static_assert(NEGCACHE_ENTRY_BYTES == KEYFIFO_ENTRY_BYTES, "a miss is one keyfifo entry");

struct negcache {
    struct keyfifo *set;
    uint64_t replaced;
};

int negcache_create(uint32_t capacity, struct negcache **out)
{
    *out = NULL;
    struct negcache *nc = calloc(1, sizeof *nc);
    if (!nc)
        return -KVNODE_ENOMEM;
    int rc = keyfifo_create(capacity, &nc->set);
    if (rc < 0) {
        free(nc);
        return rc;
    }
    *out = nc;
    return 0;
}

void negcache_destroy(struct negcache *nc)
{
    if (!nc)
        return;
    keyfifo_destroy(nc->set);
    free(nc);
}

static struct keyfifo_id negcache_id(uint32_t ns, int64_t key, uint64_t check)
{
    return (struct keyfifo_id){ .scope = ns, .key = key, .check = check };
}

void negcache_insert(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check, uint64_t now_ms)
{
    struct keyfifo_id id = negcache_id(ns, key, check);
    nc->replaced += keyfifo_put(nc->set, &id, now_ms);
}

bool negcache_hit(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check, uint64_t now_ms,
                  uint64_t ttl_ms)
{
    struct keyfifo_id id = negcache_id(ns, key, check);
    const uint64_t *cached_ms = keyfifo_find(nc->set, &id);
    if (!cached_ms)
        return false;
    if (ttl_ms > 0 && now_ms >= *cached_ms && now_ms - *cached_ms < ttl_ms)
        return true;
    keyfifo_remove(nc->set, &id);
    return false;
}

void negcache_remove(struct negcache *nc, uint32_t ns, int64_t key, uint64_t check)
{
    struct keyfifo_id id = negcache_id(ns, key, check);
    keyfifo_remove(nc->set, &id);
}

size_t negcache_count(const struct negcache *nc)
{
    return keyfifo_count(nc->set);
}

uint64_t negcache_replaced(const struct negcache *nc)
{
    return nc->replaced;
}
