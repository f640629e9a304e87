/* lease: the lease table. A lease is a handle owned by one connection that
 * pins blocks for reading (LEASE_READ) or reserves slots for writing
 * (LEASE_WRITE). This module owns lease records, their ids, the per-owner
 * lists and the expiry heap; what a lease *means* for the blocks it holds
 * (unpin, free, seal) is the cache's business.
 *
 * Ids are unguessable-ish (per-boot random high bits + counter) and never 0.
 * Every operation is O(1) or O(log n). Loop thread only. */
#ifndef KVNODE_LEASE_H
#define KVNODE_LEASE_H

#include <stddef.h>
#include <stdint.h>

struct index_entry;

enum lease_kind { LEASE_READ = 1, LEASE_WRITE = 2 };

/* A connection's leases; embedded in the owner (e.g. the connection),
 * with what the owner can address: a lease only ever hands out locations
 * in arenas the owner has mapped. Zeroed: the host arena only. */
struct lease_list {
    struct lease *head;
    size_t count;
    uint32_t mapped;       /* bit i: arena id i is mapped by the owner (the host arena always is) */
    uint32_t put_arena;    /* arena id a put asking for HBM reserves in, 0: none (host) */
    uint32_t host_region;  /* 1 + the host-arena region its puts prefer (its GPU's NUMA node), 0: none */
    uint64_t reserved_bytes; /* slots its write leases hold, not yet committed (the cache's) */
    uint64_t ttl_ms;       /* TTL of its next leases, 0: the cache's [leases] read_ttl / write_ttl
                              (the KVS front end sets each request's term here) */
};

struct lease {
    uint64_t id;
    int      kind;                 /* enum lease_kind */
    uint32_t ns;                   /* namespace the blocks belong to */
    uint32_t purges;               /* write: the namespace's purge count at put_begin (the cache's) */
    uint64_t created_ms, expires_ms;
    size_t   n;                    /* entries held */
    struct index_entry **entries;  /* n entries (NULL slots allowed) */
    void    *waiter;               /* the cache's deferred reply built on this lease, if any */
    /* private to lease.c */
    struct lease_list *owner;
    struct lease *owner_prev, *owner_next;
    struct lease *hash_next;
    size_t heap_pos;
};

struct lease_table;

int  lease_table_create(struct lease_table **out);
/* Frees every remaining lease record (not the entries they point to). Owner
 * lists are not touched (their owners may be gone already). */
void lease_table_destroy(struct lease_table *t);

/* New lease with room for n entries (entries[] zeroed), linked into owner's
 * list (owner may be NULL), the id table and the expiry heap; expires_ms
 * saturates at UINT64_MAX. NULL when out of memory or kind is not
 * LEASE_READ/LEASE_WRITE. */
struct lease *lease_create(struct lease_table *t, int kind, uint32_t ns, struct lease_list *owner,
                    uint64_t now_ms, uint64_t ttl_ms, size_t n);
/* The lease with this id, or NULL. */
struct lease *lease_find(struct lease_table *t, uint64_t id);
/* Unlink from table, heap and owner list, and free the record. */
void lease_destroy(struct lease_table *t, struct lease *l);
/* Earliest-expiring lease if it expired at now_ms, else NULL (O(1)). */
struct lease *lease_first_expired(struct lease_table *t, uint64_t now_ms);
size_t lease_count(const struct lease_table *t, int kind);  /* kind 0: all */

#endif
