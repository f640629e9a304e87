/* cache_internal: what the pieces of the cache share — struct cache, the records
 * that hang off it, and the functions one piece calls in another. Private to
 * the files in daemon/cache/; everything else goes through cache.h.
 *
 *   core.c      the cache object, namespaces and arenas, an entry's lifecycle
 *               (pins, ghosts, eviction of one entry, removal), lease end, delete
 *   read.c      match and get, at once or deferred: a GET's steps (look up,
 *               pin or fetch, wait, lend); the key counters
 *   put.c       put reservations and giving them back
 *   deferred.c  answers that wait for the store, and puts waiting for room
 *   evict.c     host-tier watermarks and eviction, namespace quotas, the reaper
 *   demote.c    HBM -> host demotion through the copier
 *   promote.c   what a read fetches from the store (lookups, reads of unknown
 *               keys, promotions of ghosts: cache_fetch), misses remembered,
 *               recovery
 *   store.c     the store glue: ordered writes and deletes, retries and the
 *               write probe
 *   stop.c      the stop's flush: every committed block written, what could
 *               not be counted
 *   complete.c  completeness (KVCM): observer calls and the chunked walk
 *   purge.c     purges: a deployment's blocks out of memory, index and store
 *   stats.c     the cache's part of the STATS document
 *
 * Loop thread only. */
#ifndef KVNODE_CACHE_INTERNAL_H
#define KVNODE_CACHE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "cache/cache.h"
#include "mem/arena.h"
#include "gpu/devmem.h"
#include "mem/index.h"
#include "mem/keylock.h"
#include "mem/numa.h"
#include "cache/negcache.h"
#include "core/counters.h"

/* The host arena's id; HBM arenas follow it (1, 2, ...). */
#define HOST_ARENA_ID 0u

_Static_assert(NS_MAX_HBM_ARENAS >= DEVMEM_MAX_DEVICES, "a namespace has a class per HBM arena");

/* A device's HBM arena and its demotion state. */
struct cache_hbm {
    struct arena   *a;
    int      device;
    bool     host_access;            /* the loop may read its bytes (sim) */
    int      vmm_fd;                 /* the region's VMM handle (the region owns it); -1: none */
    uint8_t  ipc[DEVMEM_IPC_HANDLE_BYTES];
    size_t   ipc_len;
    char     pci_bus_id[32];
    uint32_t host_region;            /* where its demoted blocks go (cache_host_region) */
    uint64_t moving_bytes;           /* strides of blocks being demoted */
    unsigned inflight;               /* demotion batches submitted, not done */
    bool     demoting;               /* passed the high watermark, not yet below the low */
    /* Failed batches back off (demote.c): no batch before retry_at_ms. */
    uint64_t backoff_ms;             /* the current delay, 0: none */
    uint64_t retry_at_ms;
    uint64_t failing_batches, failing_blocks;   /* since the failures began (0: none) */
    uint64_t failing_since_ms;
    /* A sticky error took the device: no copies, blocks dropped, not lent. */
    bool     down;
    char     down_why[256];
    uint64_t down_dropped;           /* blocks dropped because of it */
};

struct cache {
    struct event_base *base;
    /* The entries a MATCH's scan found, kept for its LRU refresh (read.c):
     * room for match_found_cap; grown on demand. */
    struct index_entry **match_found;
    size_t match_found_cap;
    struct arena *host;
    /* Arenas by id: [0] the host arena, [1 + i] HBM of hbm[i]. */
    struct arena *arenas[INDEX_MAX_ARENAS];
    uint32_t narenas;
    struct cache_hbm hbm[DEVMEM_MAX_DEVICES];
    unsigned nhbm;
    struct devmem *devmem;           /* the backend HBM arenas come from (NULL: none) */
    struct copier *copier;           /* NULL: no demotion (HBM blocks stay or are dropped) */
    struct hostpin *hostpin;         /* NULL: the host arena is not being pinned */
    struct populate *populate;       /* NULL: the host arena was reserved at creation */
    struct numa_topology numa_topo;  /* the machine's NUMA nodes and GPUs */
    struct numa_plan numa;           /* where the host arena lives (memory.numa) */
    struct event *populate_ev;       /* polls the reserved part while populate runs */
    uint64_t populate_seen;          /* reserved bytes at the last poll */
    double hbm_high, hbm_low;
    uint64_t hbm_batch_bytes;
    struct event *demote_ev;
    struct event *demote_retry_ev;   /* a device's backoff ended */
    uint32_t hbm_down_mask;          /* bit = arena id of an HBM arena whose device is down */
    bool demote_scheduled;
    bool demote_building;            /* in cache_demote_cb: blocks it puts back do not reschedule it */
    struct kv_index *index;
    struct ns_registry *namespaces;
    struct lease_table *leases;

    /* reloadable limits */
    double high_watermark, low_watermark;
    uint64_t read_ttl_ms, write_ttl_ms, reaper_interval_ms;
    uint32_t max_leases_per_client;
    double max_reserved_per_client;  /* share of the host tier */
    uint64_t namespace_quota;   /* host-tier bytes per namespace, 0: none */
    int policy;                 /* CONFIG_POLICY_* */
    uint32_t request_timeout_ms;
    uint64_t negative_ttl_ms;   /* [persist] lookup_negative_ttl, 0: misses are not cached */

    struct persist *persist;    /* NULL: no store */
    cache_block_fn observer;    /* completeness changes (KVCM), NULL: none */
    cache_deployment_fn dep_observer;   /* a deployment's TP group connected (KVCM) */
    void *observer_arg;
    uint64_t ghosts;            /* entries only in the store (incl. promoting) */
    uint64_t evicting_bytes;    /* write-back victims whose write is in flight */
    uint64_t writing_bytes;     /* blocks pinned by a write (in flight or waiting) */
    struct keylock *keylocks;   /* store ops in order per key */
    /* store ops the store's queue refused, sent again in order as it drains */
    struct cache_storeop *queued_head, *queued_tail;
    size_t queued_ops;
    bool draining;
    /* blocks whose write failed, written again after a backoff */
    struct cache_retry *retry_head, *retry_tail;
    size_t retry_pending;
    uint64_t retry_backoff_ms;  /* 0: the next retry comes after RETRY_FIRST_MS */
    struct event *retry_ev;
    bool probe_writing;         /* the store's write probe (a waiting block's write) is under way */
    /* the stop (stop.c): no retry list, rounds of writes instead */
    bool stopping;
    uint64_t stop_landed;       /* writes that landed since the stop began */
    unsigned stop_rounds;       /* rounds of writes the stop sent */
    /* puts waiting for room that blocks being written hold (back-pressure) */
    struct cache_wait *put_waiters, *put_waiters_tail;
    struct cache_purge *purges;      /* running (purge.c) */
    struct event *put_wake_ev;

    struct event *evict_ev;
    bool evict_scheduled;
    struct event *reap_ev;
    struct event *settle_ev;     /* background settle of the host LRU (evict.c) */

    /* counters */
    uint64_t evicted_dropped;
    uint64_t evicted_quota;     /* a namespace's own blocks, for its quota */
    uint64_t reaped_read, reaped_write;
    uint64_t sealed_total;
    uint64_t evicted_to_store;  /* memory freed, the store's copy kept as a ghost */
    uint64_t writeback_started; /* write-back victims handed to the store */
    uint64_t writes_deferred;   /* writes that waited for room in the store's queue */
    uint64_t write_retries;     /* failed writes tried again */
    uint64_t persist_dropped;   /* blocks that left memory unwritten (persistence on) */
    uint64_t stop_unwritten;    /* committed blocks the stop could not write (in persist_dropped) */
    uint64_t put_waits, put_wait_timeouts;  /* puts that waited for the store / in vain */
    uint64_t reservations_refused;  /* puts over leases.max_reserved_per_client */
    uint64_t namespaces_reclaimed;  /* idle namespaces released at the limit */
    uint64_t promotions, promotions_ok, promotions_failed;
    /* promote.c: the promotions in flight by entry (an index entry has no
     * room for a pointer to its record); open addressing, load <= 1/2. */
    struct cache_promo **promo_tab;
    size_t promo_cap, promo_n;
    uint64_t lookups, lookup_found;
    uint64_t lookup_reads;      /* GETs' runs of unknown keys read at once, no lookup first */
    uint64_t lookup_negative_hits;  /* runs of unknown keys the negative cache ended */
    struct negcache *negcache;  /* store misses (first used lazily), NULL: none yet */
    uint64_t waits, wait_timeouts;
    uint64_t recovered, recovery_skipped;
    uint64_t adopted, adopted_bytes;    /* host blocks handed over at start (cache/handover.c) */
    uint64_t hbm_reserved, hbm_fallbacks;   /* HBM puts: slots in HBM, sent to host instead */
    uint64_t demoted, demoted_bytes;        /* blocks moved HBM -> host */
    uint64_t demote_aborted;                /* a reader pinned it meanwhile, or it was deleted */
    uint64_t demote_failed;                 /* the copy failed (the block stays in HBM) */
    uint64_t demote_failed_batches;         /* batches whose copy failed */
    uint64_t hbm_down_dropped;              /* HBM blocks dropped: their device went down */
    uint64_t demote_dropped;                /* no host room: left memory (ghost or gone) */
    struct metrics_keys keys;   /* match/get lookups: matched, missed by reason */
};

enum { STORE_OP_WRITE = 1, STORE_OP_DELETE = 2 };

/* One write, or a delete of n keys; it holds the keylock of each of its keys
 * from the time it is sent to the store until its result is back. */
struct cache_write_group;

struct cache_storeop {
    struct keylock_waiter turn;     /* first: waiting for its (single) key */
    struct cache *c;
    int kind;
    struct kv_namespace *ns;
    struct index_entry *e;          /* write: the block, pinned until the result */
    bool evicting;                  /* write: a write-back victim */
    bool probe;                     /* write: the store's write probe (persist_write_probe) */
    struct cache_write_group *group; /* write: the commit it belongs to, or NULL */
    void (*done)(void *arg, int rc); /* delete: told its result (a purge's), or NULL */
    void *done_arg;
    struct cache_storeop *next;     /* on c->queued_head: the store's queue was full */
    size_t n;
    uint64_t *checks;               /* delete: the keys' check words (allocated with the op) */
    int64_t keys[];                 /* write: the block's key */
};

/* A block whose write failed: written again after a backoff while it is in
 * memory. By key: it may be evicted, deleted or replaced meanwhile. */
struct cache_retry {
    uint32_t ns;
    int64_t key;
    struct cache_retry *next;
};

/* A MATCH or GET whose answer waits for the store (see cache.h). Built on
 * the stack; moved to the heap the first time the walk has to wait. Freed
 * once the requester is done with it (finished) and no store request it
 * started is outstanding. */
enum { WAIT_MATCH = 1, WAIT_GET = 2, WAIT_PUT = 3 };
struct cache_wait {
    struct cache *c;
    int kind;
    struct kv_namespace *ns;
    const int64_t *keys;        /* the caller's during start, owned copy once on the heap */
    const uint64_t *checks;     /* the keys' check words (NULL: all 0), as keys */
    size_t n;
    size_t next;                /* GET: next key to walk */
    struct lease *l;            /* GET: the read lease (NULL: none yet, or reaped) */
    struct lease_list *owner;   /* GET: who the lease is for */
    uint32_t readable;          /* GET: arenas the answer may point into (bit per id) */
    unsigned outstanding;       /* promotions and lookups not back yet */
    bool on_heap, looked_up, may_wait, nomem;
    bool probed;                /* GET: unknown keys were read at once (cache_probe_submit) */
    bool each;                  /* MATCH per key: every key the store holds is indexed */
    bool answered;              /* ready() called (or the answer was immediate) */
    bool finished;              /* the requester called finish or cancel */
    cache_ready_fn ready;
    void *arg;
    struct event *timer;
    struct cache_wait *put_prev, *put_next;   /* PUT: on c->put_waiters */
};

/* core.c */
uint64_t cache_ns_block_bytes(struct cache *c, uint32_t ns_id);
/* Check words: a request's word for its key i (checks NULL: every word 0);
 * the entry of (ns, key) as a request with `check` sees it: NULL when absent
 * or held under another word (then *mismatch is set, when not NULL). */
static inline uint64_t cache_check_at(const uint64_t *checks, size_t i)
{
    return checks ? checks[i] : 0;
}
/* e (found by a lookup, or NULL) as a request with `check` sees it. */
static inline struct index_entry *cache_entry_checked(struct index_entry *e, uint64_t check, bool *mismatch)
{
    if (e && e->check != check) {
        if (mismatch)
            *mismatch = true;
        return NULL;
    }
    return e;
}
struct index_entry *cache_entry_for(struct cache *c, uint32_t ns, int64_t key, uint64_t check,
                                    bool *mismatch);
/* An entry's slot: the daemon's address of it, giving it back; the HBM
 * arena record of an entry (NULL: host memory). */
void *cache_slot_ptr(struct cache *c, const struct index_entry *e);
void cache_slot_free(struct cache *c, const struct index_entry *e);
struct cache_hbm *cache_hbm_of(struct cache *c, const struct index_entry *e);
/* An entry leaving: freed with its slot; out of the index (freed at the last
 * pin); an unpinned SEALED one dropped; one the store holds kept as a ghost;
 * a victim's memory freed (ghost or dropped). */
void cache_entry_destroy(struct cache *c, struct index_entry *e);
void cache_remove_entry(struct cache *c, struct index_entry *e);
void cache_drop_entry(struct cache *c, struct index_entry *e);
void cache_to_ghost(struct cache *c, struct index_entry *e);
void cache_evict_entry(struct cache *c, struct index_entry *e);
/* Pins keep an entry in memory and off the LRU. */
void cache_unpin(struct cache *c, struct index_entry *e);
void cache_pin(struct cache *c, struct index_entry *e);
/* End a lease's hold on its entries (seal, give back, or unpin); the count. */
uint32_t cache_lease_finish(struct cache *c, struct lease *l, bool commit);

/* read.c */
/* 0, or -KVNODE_ELIMIT with err set when owner holds leases.max_per_client. */
int cache_check_lease_room(struct cache *c, struct lease_list *owner, char *err, size_t errlen);
/* Walk a GET's keys on (after the store answered); *wp may move to the heap. */
void cache_get_walk(struct cache *c, struct cache_wait **wp);

/* promote.c: fetch key i of a GET, which is not in memory (e: its entry, a
 * ghost or being promoted; NULL: the index does not know the key), when the
 * GET may wait; *wp may move to the heap. FETCH_NONE: the prefix ends
 * there; FETCH_ASKED: the store is asked about the key (a lookup or a read
 * of the run), whose answer walks the GET on (cache_get_walk); FETCH_COMING:
 * e is on its way back (promoting), w waits for it: pin it. */
enum cache_fetch { FETCH_NONE, FETCH_ASKED, FETCH_COMING };
enum cache_fetch cache_fetch(struct cache *c, struct cache_wait **wp, size_t i, struct index_entry *e);
/* Whether the store is asked about keys the index does not know; ask it
 * about w's keys from `from` on (0: submitted, w counts it). */
bool cache_may_lookup(const struct cache *c);
/* Whether the store's reads say "absent" as cheaply as a lookup (redis). */
bool cache_reads_find(const struct cache *c);
int cache_lookup_submit(struct cache *c, struct cache_wait *w, size_t from);
/* Whether the store said less than [persist] lookup_negative_ttl ago that it
 * lacks (key, check) in ns: the run of unknown keys from it ends there with
 * no round trip (counted in lookup_negative_hits). */
bool cache_negative_hit(struct cache *c, const struct kv_namespace *ns, int64_t key, uint64_t check);
/* A local put made (key, check) exist in ns: forget its cached miss. */
void cache_negative_forget(struct cache *c, const struct kv_namespace *ns, int64_t key, uint64_t check);
/* A ghost read back into a host slot (0: on its way; the entry is PROMOTING). */
int cache_promote(struct cache *c, struct kv_namespace *ns, struct index_entry *e);

/* put.c: a reserved slot stops being one (committed or given back); a
 * WRITING entry's slot given back. */
void cache_reservation_end(struct kv_namespace *ns, struct lease_list *owner);
void cache_unreserve(struct cache *c, struct kv_namespace *ns, struct lease_list *owner,
                     struct index_entry *e);
/* put.c: a write lease's entries sealed (commit) or given back (abort);
 * the count (cache_lease_finish). */
uint32_t cache_put_seal(struct cache *c, struct lease *l);
uint32_t cache_put_unreserve_all(struct cache *c, struct lease *l);

/* deferred.c: a wait freed, a store request of it back, moved to the heap,
 * its timer started; the event that lets waiting puts try again. */
void cache_wait_free(struct cache_wait *w);
void cache_wait_progress(struct cache_wait *w);
struct cache_wait *cache_wait_heap(struct cache_wait *w);
void cache_wait_arm(struct cache *c, struct cache_wait *w);
void cache_put_wake_cb(evutil_socket_t fd, short what, void *arg);
/* The host arena is still being reserved in the background. */
bool cache_populating(struct cache *c);

/* evict.c: host-tier use over a watermark, the background evictor, one slot
 * made allocatable, room under a namespace's quota and the bytes of it a
 * quota eviction cannot free; the reaper's timer. */
bool cache_over(const struct cache *c, double watermark);
void cache_evict_maybe_schedule(struct cache *c);
void cache_evict_cb(evutil_socket_t fd, short what, void *arg);
bool cache_make_room(struct cache *c, uint32_t cls);
/* Evict until n blocks of cls can be placed (or nothing is evictable), so a
 * put's slots are taken after its victims left: lowest slot first within a
 * slab, ascending, rather than each in the slot its victim just freed
 * (victims leave leaves-first, so those would descend). */
void cache_make_room_for(struct cache *c, uint32_t cls, uint64_t n);
bool cache_quota_room(struct cache *c, struct kv_namespace *ns);
uint64_t cache_quota_stuck(struct cache *c, struct kv_namespace *ns);
void cache_reap_cb(evutil_socket_t fd, short what, void *arg);
/* Moves the marked entries at the host arena's LRU oldest ends to their
 * places, a batch per loop iteration until none is left there; started from
 * every reaper tick. */
void cache_settle_cb(evutil_socket_t fd, short what, void *arg);
void cache_settle_schedule(struct cache *c);

/* demote.c: demotion scheduled when an HBM arena wants a batch. */
void cache_demote_maybe_schedule(struct cache *c);
void cache_demote_cb(evutil_socket_t fd, short what, void *arg);
void cache_demote_retry_cb(evutil_socket_t fd, short what, void *arg);
/* True when e lives in HBM of a device that is down (its copies fail). */
bool cache_hbm_entry_down(struct cache *c, const struct index_entry *e);

/* store.c */
/* Whether write-back victims may pin bytes more; whether committed blocks are
 * written at all; a block leaving memory unwritten counted. */
bool cache_write_budget(const struct cache *c, uint64_t bytes);
bool cache_persisting(const struct cache *c);
void cache_count_unwritten(struct cache *c, const struct index_entry *e);
void cache_storeop_free(struct cache_storeop *op);
/* A SEALED block written (pinned until its result); keys deleted from the
 * store, each after the ops on it that came before. */
void cache_write_start(struct cache *c, struct index_entry *e, bool evicting);
/* The blocks of one PUT_COMMIT written through: each stays pinned by the
 * group until every write of the commit is back, then all return to the LRU
 * together, each at its own place. So the order in which a commit's writes
 * land never lets a chain's root be evicted or demoted while its leaves are
 * still held (issue 27). new: NULL when out of memory (write them one by
 * one then), holding one reference of its own; add: write e as part of g;
 * done: one of g's writes is over (or never reached the store), or, once
 * after the last add, the commit drops the group's own reference. */
struct cache_write_group *cache_write_group_new(size_t n);
void cache_write_group_add(struct cache *c, struct cache_write_group *g, struct index_entry *e);
void cache_write_group_done(struct cache *c, struct cache_write_group *g);
/* cache_store_delete whose ops each call done(arg, rc) when back (not for
 * ops freed unsent at cache_destroy); returns how many ops it made (each
 * done may run before it returns). */
size_t cache_store_delete_tracked(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                                  const uint64_t *checks, size_t n, void (*done)(void *arg, int rc),
                                  void *arg);
/* purge.c: a purge whose walk ended and whose deletes are back ends (done()). */
void cache_purge_maybe_done(struct cache *c, struct cache_purge *p);
void cache_purge_destroy_all(struct cache *c);
void cache_store_delete(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                        const uint64_t *checks, size_t n);
void cache_retry_cb(evutil_socket_t fd, short what, void *arg);
/* Forget every block waiting for a retry (the stop's rounds find them). */
void cache_retry_forget(struct cache *c);

/* complete.c: completeness changes, told to the observer — e sealed, e about
 * to leave memory, e demoted to host memory, ns bound by a HELLO. */
void cache_note_sealed(struct cache *c, const struct index_entry *e);
void cache_note_leaving(struct cache *c, const struct index_entry *e);
void cache_note_demoted(struct cache *c, const struct index_entry *e);
void cache_note_bound(struct cache *c, const struct kv_namespace *ns);

#endif
