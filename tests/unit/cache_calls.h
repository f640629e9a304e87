/* cache_calls: the unit tests' short forms of the cache's request structs
 * (struct cache_put_req, struct cache_read_req), shared by the cache suites. */
#ifndef KVNODE_TEST_CACHE_CALLS_H
#define KVNODE_TEST_CACHE_CALLS_H

#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"

/* A put of n keys of ns for owner, check words 0 (NULL). */
#define PUT_REQ(ns_, owner_, keys_, n_, tier_) \
    (&(struct cache_put_req){ .ns = (ns_), .owner = (owner_), .keys = (keys_), .n = (n_), .tier = (tier_) })

/* cache_get_begin of n keys for who (word 0, every arena who mapped): the
 * lease in *lid, its locations in locs, how many in *got. */
static inline int get_now(struct cache *c, struct kv_namespace *in, struct lease_list *who,
                          const int64_t *keys, size_t n, uint64_t *lid, struct cache_loc *locs,
                          size_t *got, char *err, size_t errlen)
{
    struct cache_read_req req = { .ns = in, .keys = keys, .n = n, .owner = who,
                                  .readable = who->mapped };
    struct cache_lent out = { .locs = locs };
    int rc = cache_get_begin(c, &req, &out, err, errlen);
    *lid = out.lease_id;
    *got = out.n;
    return rc;
}

#endif
