/* cache: what the cache means, on the loop thread. Owns the host arena, the
 * index, the namespace registry and the lease table, and implements match,
 * get/put leases, delete, eviction (watermarks, LRU) and the reaper. It
 * knows nothing of the wire: ops.c translates messages into these calls.
 *
 * Lease owners are `struct lease_list`s embedded in connections: a lease can
 * only be ended through the list that owns it, and cache_release_owner()
 * ends them all when the connection goes.
 *
 * Implemented by the files in daemon/cache/ (cache/cache_internal.h says which
 * piece owns what). Loop thread only. */
#ifndef KVNODE_CACHE_H
#define KVNODE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mem/arena.h"
#include "config/config.h"
#include "gpu/copier.h"
#include "core/counters.h"
#include "gpu/devmem.h"
#include "mem/lease.h"
#include "mem/namespace.h"
#include "persist/persist.h"

struct event_base;
struct cache;
struct cache_wait;
struct persist;
struct kvs_found;

/* A block's place as the wire describes it. */
struct cache_loc {
    uint32_t arena;
    uint64_t offset;
    bool     present;   /* put_begin: false = already stored, nothing reserved */
};

/* An arena as clients see it (HELLO). */
struct cache_arena_info {
    uint32_t id;
    int      tier;      /* KVNODE_TIER_* */
    int      device;
    uint64_t size;
    int      fd;                  /* to map, -1: none (real GPU memory) */
    int      ro_fd;               /* the same, read-only (readers); -1: none */
    const char *ro_why;           /* why ro_fd is -1 while fd is not ("" otherwise) */
    int      vmm_fd;              /* CUDA VMM POSIX-fd handle to import (real GPU memory), -1: none */
    const uint8_t *ipc_handle;    /* CUDA IPC handle (real GPU memory), NULL: none */
    size_t   ipc_len;
    bool     host_access;         /* the daemon's CPU can read it (host, simulated HBM) */
    const char *pci_bus_id;       /* HBM: its GPU's PCI bus id ("" when unknown); host: NULL */
};

int  cache_create(struct event_base *base, const struct kvn_config *cfg, struct cache **out,
                  char *err, size_t errlen);
/* The cache of a named tenant (NULL: "default", as cache_create): its
 * namespaces' identity includes the name (ns_fingerprint_tenant) and its
 * limit messages name [tenant.NAME] options. */
int  cache_create_tenant(struct event_base *base, const struct kvn_config *cfg, const char *tenant,
                         struct cache **out, char *err, size_t errlen);
void cache_destroy(struct cache *c);
/* Apply the reloadable subset (watermarks, TTLs, reaper interval, limits,
 * namespace quota: a lowered quota applies at each namespace's next put). */
void cache_apply_config(struct cache *c, const struct kvn_config *cfg);

/* Namespaces. bind checks the block size fits the allocator. */
int  cache_bind(struct cache *c, const struct ns_layout *layout, struct kv_namespace **ns,
                char *err, size_t errlen);
void cache_unbind(struct cache *c, struct kv_namespace *ns);
size_t cache_arenas(const struct cache *c, struct cache_arena_info *out, size_t max);
/* The daemon's CPU address of an arena, NULL when the CPU cannot read it
 * (real GPU memory) or there is no such arena. */
void *cache_arena_base(const struct cache *c, uint32_t arena);
/* Bit i set: arena i is readable by the daemon's CPU (for GET_INLINE). */
uint32_t cache_cpu_arenas(const struct cache *c);

/* HBM tier (before serving). An arena over r, which the caller owns and
 * frees after cache_destroy; its id is the next free one (1, 2, ...).
 * Puts that ask for HBM land in the arena of their owner's device
 * (lease_list.put_arena); past hbm.high_watermark the least recently used
 * unpinned blocks are demoted to the host tier by the copier (set with
 * cache_set_copier; without one an over-full HBM arena just stops taking
 * puts). A block being demoted stays readable in HBM; if a reader pins it
 * or it is deleted before the copy lands, the move is abandoned. */
struct devmem_region;
struct copier;
struct hostpin;
struct devmem;
int  cache_add_hbm(struct cache *c, struct devmem *dm, const struct devmem_region *r,
                   uint64_t slab_bytes, char *err, size_t errlen);
void cache_set_copier(struct cache *c, struct copier *cp);
/* Host-arena pinning progress for stats (NULL: not pinned). */
void cache_set_hostpin(struct cache *c, struct hostpin *hp);
/* The host arena's figures alone (cheap: no walk). */
void cache_host_stats(const struct cache *c, struct arena_stats *out);
/* Background reservation of the host arena: an enum populate_state
 * (POPULATE_DONE when it was reserved at creation); why is set when FAILED. */
int cache_populate_state(struct cache *c, char *why, size_t whylen);
/* The region of the host arena where blocks of a client on this GPU (CUDA
 * ordinal, PCI bus id or NULL) should live: its NUMA node's share under
 * memory.numa (mem/numa.h); ARENA_ANY_REGION when there is no per-GPU
 * placement or the GPU is not known. For lease_list.host_region. */
uint32_t cache_host_region(const struct cache *c, int cuda_device, const char *pci_bus_id);
/* What one connection may hold in uncommitted put reservations now, in
 * bytes (leases.max_reserved_per_client of the tiers; told to clients at HELLO). */
uint64_t cache_reserve_limit(const struct cache *c);
/* The host arena's memory, for pinning. */
void *cache_host_base(const struct cache *c);
uint64_t cache_host_size(const struct cache *c);
/* The calls above as the GPU side makes them (gpu_start's struct gpu_cache
 * .ops, the cache as void *): gpu/ sits below cache/ and never includes it. */
struct gpu_cache_ops;
extern const struct gpu_cache_ops cache_gpu_ops;

/* Persistence (NULL: none; set once, before serving). With a store:
 * committed blocks are written per [persist] policy, host victims that the
 * store holds stay indexed as ghosts (ENTRY_GHOST), GET promotes ghosts back
 * into host memory, DELETE also deletes from the store, and when the store
 * may hold blocks the index does not know (persist_lookup_on_miss) MATCH and
 * GET ask it about the keys after the known prefix. */
void cache_set_persist(struct cache *c, struct persist *p);
/* Completeness (KVCM): a key is complete when it is sealed in memory in
 * every TP rank's namespace of its deployment; its medium is HBM when every
 * rank's copy is in GPU memory, HOST otherwise. fn(arg, ns, key, medium)
 * runs on the loop whenever a key becomes complete (a commit or promotion
 * completes the last rank), changes medium while complete (a demotion), or
 * stops being complete (medium NONE: a rank's copy leaves memory: evicted,
 * deleted, dropped); ns is the rank whose copy changed. Duplicate puts and
 * LRU touches change nothing and call nothing. dep_fn(arg, ns) runs when a
 * HELLO binds a namespace and every TP rank of its deployment then has a
 * client bound (the deployment is live, even with nothing cached). */
enum cache_medium { CACHE_MEDIUM_NONE = 0, CACHE_MEDIUM_HBM = 1, CACHE_MEDIUM_HOST = 2 };
typedef void (*cache_block_fn)(void *arg, const struct kv_namespace *ns, int64_t key, int medium);
typedef void (*cache_deployment_fn)(void *arg, const struct kv_namespace *ns);
void cache_set_block_observer(struct cache *c, cache_block_fn fn, cache_deployment_fn dep_fn,
                              void *arg);
bool cache_key_complete(struct cache *c, const struct kv_namespace *ns, int64_t key);
/* Every complete key, by a chunked walk of the index that runs a step per
 * loop iteration (no O(n) pause): fn(arg, ns, key, medium) once per key
 * (ns: the deployment's lowest-id rank), then done(arg); *out identifies the
 * walk for cache_walk_cancel (after done() it is gone). A key that changes
 * while the walk runs may or may not be reported: pair the walk with the
 * completeness events from its start on. */
struct cache_walk;
typedef void (*cache_key_fn)(void *arg, const struct kv_namespace *ns, int64_t key, int medium);
int  cache_walk_complete(struct cache *c, cache_key_fn fn, void (*done)(void *arg), void *arg,
                         struct cache_walk **out);
void cache_walk_cancel(struct cache *c, struct cache_walk *w);

/* Recovery: index blocks a store scan found as ghosts (their namespaces are
 * registered as needed; keys already indexed are left alone). */
void cache_add_stored(struct cache *c, const struct kvs_found *blocks, size_t n);

/* Warm restarts (cache/handover.c; the snapshot's format and the fd passing
 * are warm.c's). A hand-over is the host tier's sealed blocks: the
 * namespaces they belong to and, per block, its place in the host arena,
 * oldest use first (so adoption rebuilds the LRU order). HBM blocks,
 * blocks being written, ghosts and blocks being read back are not in it. */
struct cache_ho_block {
    uint32_t ns;         /* index into cache_ho.layouts */
    uint8_t  stored;     /* the store holds it (PERSIST_STORED) */
    int64_t  key;
    uint64_t check;
    uint64_t offset;     /* in the host arena */
};
struct cache_ho {
    struct ns_layout *layouts;
    uint64_t *fingerprints;  /* the deployment fingerprint of each layout */
    size_t nns;
    struct cache_ho_block *blocks;
    size_t n;
    uint64_t bytes;          /* block_bytes summed */
    uint64_t reserved;       /* the host arena's reserved part (arena_reserved): all of it
                                once the background population is over */
};
/* Collect c's hand-over (the daemon is stopping: no lease is open). O(n).
 * 0, or -KVNODE_ENOMEM. */
int  cache_handover_collect(struct cache *c, struct cache_ho *out);
void cache_ho_free(struct cache_ho *h);
/* Whether h can be adopted into a host arena of arena_bytes (slabs of
 * slab_bytes) by the cache of tenant (NULL: "default"), without touching
 * anything: valid layouts whose fingerprint is the tenant's, every block
 * inside the arena, on a slot of its block size's stride, one stride per
 * slab, no two blocks overlapping, at most ARENA_MAX_CLASSES sizes. 0, or
 * -KVNODE_EINVAL with err naming the first problem. */
int  cache_handover_check(const struct cache_ho *h, const char *tenant, uint64_t arena_bytes,
                          uint64_t slab_bytes, char *err, size_t errlen);
/* The cache of tenant over the memfd a previous daemon handed over (taken,
 * closed on failure) whose first `reserved` bytes it had reserved (the
 * rest is reserved now): as cache_create_tenant, with the memory kept. */
int  cache_create_adopting(struct event_base *base, const struct kvn_config *cfg, const char *tenant, int host_fd,
                           uint64_t reserved, struct cache **out, char *err, size_t errlen);
/* Index h's blocks as sealed host blocks (cache_handover_check passed; c
 * from cache_create_adopting, before serving). 0, or negative with err. */
int  cache_adopt(struct cache *c, const struct cache_ho *h, char *err, size_t errlen);

/* How much of a matched prefix lies in each tier. */
struct cache_tiers {
    size_t matched;        /* hbm + host + store */
    size_t hbm, host;      /* in memory */
    size_t store;          /* only in the persistent store */
};

/* Operations. All return 0 or a negative KVNODE_E* code with err set.
 *
 * Check words (issue 19): a block is stored with its key's check word
 * (index_entry.check, 0: none). The calls that take `checks` (n words, or
 * NULL: every word 0) see a key held under another word as absent: MATCH
 * and GET end their prefix there, DELETE leaves it, PUT neither reserves
 * nor overwrites it (its location says "already stored", so the writer's
 * next GET misses); each such lookup is counted (keys.check_mismatches).
 * The calls without `checks` look up with word 0. */
/* The longest prefix held in any tier (memory or store, as the index knows it). */
size_t cache_match(struct cache *c, struct kv_namespace *ns, const int64_t *keys, size_t n);
void cache_match_tiers(struct cache *c, struct kv_namespace *ns, const int64_t *keys, size_t n,
                       struct cache_tiers *out);

/* A MATCH or GET as the cache takes it: the keys, whom a GET's lease is lent
 * to, and who waits for an answer that needs the store (see "Deferred
 * answers" below). */
typedef void (*cache_ready_fn)(void *arg);
struct cache_read_req {
    struct kv_namespace *ns;
    const int64_t *keys;
    const uint64_t *checks;     /* one word per key; NULL: every word 0 */
    size_t n;
    struct lease_list *owner;   /* GET: whom the read lease is lent to */
    uint32_t readable;          /* GET: the arenas the answer may point into (cache_get_start) */
    cache_ready_fn ready;       /* NULL: no waiting, the answer is what is ready now */
    void *arg;
};
/* A lease lent: its id (0: none) and one location per key of the answer
 * (locs is the caller's, with room for every key asked for; n: how many). */
struct cache_lent {
    uint64_t lease_id;
    struct cache_loc *locs;
    size_t n;
};
/* A read of the prefix that is in memory now (cache_get_start without the
 * wait: ghosts end it, no promotion; req->ready is not used). */
int  cache_get_begin(struct cache *c, const struct cache_read_req *req, struct cache_lent *out,
                     char *err, size_t errlen);

/* A best-effort read of any of the keys (the KVS front end's acquire(read)):
 * every key sealed in the host arena is pinned under one read lease (TTL
 * owner->ttl_ms, else [leases] read_ttl), whatever the keys around it; the
 * others are misses (locs[i].present false). Blocks only in the store
 * (ghosts) are misses too, but up to 256 of them start their way back into
 * host memory (as GET promotes them), so a later read finds them. out->n
 * = hits; out->lease_id 0 when there are none. 0 or a negative code, err set.
 * Lookups are with req->checks (NULL: word 0, as rtp-llm's v1 keys have
 * none): a block put with another word is a miss, counted in
 * keys.check_mismatches. Of req only ns, owner, keys, checks and n are used. */
int  cache_get_each(struct cache *c, const struct cache_read_req *req, struct cache_lent *out,
                    char *err, size_t errlen);
/* The namespace of l's deployment and tp_rank, whatever its block_bytes
 * (ignored), or NULL when there is none: for readers that do not know the
 * block size (the KVS front end). */
struct kv_namespace *cache_find_ns(struct cache *c, const struct ns_layout *l);
/* The i-th namespace record of the cache's registry (a walk over every
 * namespace, i from 0), or NULL past the last. */
struct kv_namespace *cache_ns_at(struct cache *c, size_t i);

/* Deferred answers. A MATCH or GET that needs the store (a lookup of keys the
 * index does not know, or promotions of ghosts) answers later: *_start
 * returns CACHE_WAITING with *wait set, and ready(arg) runs on the loop —
 * never from inside *_start — when every promotion and lookup it started
 * has finished or the [server] request_timeout passed; the caller then calls
 * *_finish, which fills the answer (the prefix that is ready then) and frees
 * the wait. cache_wait_cancel() drops a wait whose requester went away: no
 * ready() after it; the store work it started completes in the background.
 * *_start returns 0 when the answer is ready at once (filled as by
 * *_finish), or a negative code with err set. */
#define CACHE_WAITING 1
int  cache_match_start(struct cache *c, const struct cache_read_req *req, struct cache_tiers *out,
                       struct cache_wait **wait);
void cache_match_finish(struct cache *c, struct cache_wait *wait, struct cache_tiers *out);
/* MATCH per key (MatchRequest.per_key): every key looked at, not a prefix.
 * present has room for (req->n + 7) / 8 bytes: bit i set when keys[i] is
 * held in some tier (out counts those keys). Keys the index does not know
 * are asked of the store in one lookup (from the first of them on), as the
 * prefix MATCH asks; CACHE_WAITING then, and cache_match_each_finish
 * answers. */
int  cache_match_each_start(struct cache *c, const struct cache_read_req *req,
                            struct cache_tiers *out, uint8_t *present, struct cache_wait **wait);
void cache_match_each_finish(struct cache *c, struct cache_wait *wait, struct cache_tiers *out,
                             uint8_t *present);
/* out->locs has room for req->n. req->readable: the arenas the answer may
 * point into (bit per id; the host arena always) — the owner's mapped ones,
 * or fewer (GET_INLINE: those the daemon's CPU reads); the prefix ends at a
 * block in any other. cache_get_finish's out->locs NULL: nothing to put
 * the answer in, everything is given back. */
int  cache_get_start(struct cache *c, const struct cache_read_req *req, struct cache_lent *out,
                     char *err, size_t errlen, struct cache_wait **wait);
void cache_get_finish(struct cache *c, struct cache_wait *wait, struct cache_lent *out);
void cache_wait_cancel(struct cache *c, struct cache_wait *wait);
/* A PUT_BEGIN: the keys one connection asks to write. */
struct cache_put_req {
    struct kv_namespace *ns;
    struct lease_list   *owner;
    const int64_t       *keys;
    const uint64_t      *checks;   /* n words, or NULL: every word 0 */
    size_t               n;
    int                  tier;     /* 0 or KVNODE_TIER_HOST; KVNODE_TIER_HBM: the owner's HBM when free */
    /* Keys being written (reserved under a write lease not sealed yet) are
     * reported as held, nothing to write; with wait_writing set, any such
     * key makes the call reserve nothing and return CACHE_STORE_BOUND, err
     * saying how many: the KVS front end, whose clients read "left out" as
     * "stored", waits for those leases to end (cache_put_wait). */
    bool                 wait_writing;
};
/* Reserve a slot for every key not already held (locs[i].present true, its
 * place in locs[i]) under one write lease (*lease_id; 0 when nothing needed
 * one); the keys already held are locs[i].present false. locs has room for
 * req->n. */
int  cache_put_begin(struct cache *c, const struct cache_put_req *req, uint64_t *lease_id,
                     struct cache_loc *locs, char *err, size_t errlen);
/* The first of keys (in ns, with their check words: NULL, every word 0)
 * the index holds in any state (being written, in memory, or known in the
 * store): its index, n when none. O(n). */
size_t cache_first_held(struct cache *c, const struct kv_namespace *ns, const int64_t *keys, const uint64_t *checks,
                        size_t n);
/* Back-pressure. With a store, a committed block is not evicted before its
 * write lands (write_through: from its commit; write_back: once the evictor
 * picked it) or fails. When no slot can be had because such blocks hold the
 * memory, cache_put_begin returns CACHE_STORE_BOUND with err saying so (the
 * same while the host arena is still being reserved at start-up and the
 * reserved part is full: waiters are woken as it grows); the
 * caller may wait: cache_put_wait calls ready(arg) on the loop — never from
 * inside the call — when a store op finishes, when a write lease ends
 * (sealed, aborted or reaped: room, or keys no longer being written) or
 * after timeout_ms, and the
 * caller then tries the put again and ends the wait with cache_wait_cancel
 * (also the way to drop it early). 0 or -KVNODE_ENOMEM. */
#define CACHE_STORE_BOUND 2
int  cache_put_wait(struct cache *c, unsigned timeout_ms, cache_ready_fn ready, void *arg,
                    struct cache_wait **wait);
/* End a lease of the given kind: LEASE_READ (get_end), LEASE_WRITE with
 * commit=true (seal) or false (abort). *blocks = entries released. */
int  cache_lease_end(struct cache *c, struct lease_list *owner, uint64_t lease_id, int kind,
                     bool commit, uint32_t *blocks, char *err, size_t errlen);
/* GET_END: end owner's read lease lease_id, unpinning its entries last key
 * first (a chain's root becomes the newest). *blocks = entries released. */
int  cache_get_end(struct cache *c, struct lease_list *owner, uint64_t lease_id, uint32_t *blocks,
                   char *err, size_t errlen);
/* PUT_COMMIT and PUT_ABORT: end owner's write lease lease_id, sealing its
 * entries (visible from then on; write_through: queued for the store) or
 * giving their slots back. *blocks = entries released. */
int  cache_put_commit(struct cache *c, struct lease_list *owner, uint64_t lease_id,
                      uint32_t *blocks, char *err, size_t errlen);
int  cache_put_abort(struct cache *c, struct lease_list *owner, uint64_t lease_id,
                     uint32_t *blocks, char *err, size_t errlen);
/* Remove keys from memory and the store; *deleted = the keys removed from
 * the index (absent, being written or under another word: not counted). */
int  cache_delete(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                  const uint64_t *checks, size_t n, uint32_t *deleted);
/* cache_delete that also says which keys: each (NULL: not wanted) has room
 * for (n + 7) / 8 bytes, bit i set when keys[i] was removed (counted). */
int  cache_delete_each(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                       const uint64_t *checks, size_t n, uint32_t *deleted, uint8_t *each);
/* Purge (issue 31): drop every block of the selected deployments — one
 * (deployment_id, every TP rank's namespace) or every deployment of a model
 * (model: any layout, any revision) of this cache's tenant — from host
 * memory, HBM, the index (ghosts too) and the store, by a chunked walk of
 * the index, a step per loop iteration (no O(n) pause), each step's keys
 * sent to the store's delete in order behind the ops on them (keylock). The
 * completeness observer sees each complete key leave (KVCM: DELETE).
 * A block pinned by a reader's lease stays readable until that lease ends
 * and is freed then (as DELETE). A write lease of a purged namespace begun
 * before the purge seals nothing at its commit: its slots are given back
 * (the block never becomes visible). A put begun while the walk runs may or
 * may not outlive it. At the walk's end a store that may hold blocks the
 * index never knew (redis: persist_can_purge) removes every block of each
 * purged namespace too; v6d cannot delete (its tombstones hide the keys the
 * index knew, in memory only). Blocks of a purged namespace that the
 * recovery scan reports afterwards are from before the purge: not indexed,
 * deleted (cache_add_stored). done(arg, result)
 * runs on the loop — never from inside cache_purge_start — once the walk
 * ended and every store delete it sent came back. At most 8 purges run in
 * one cache at once (-KVNODE_ELIMIT, err saying so). */
struct cache_purge;
struct cache_purge_sel {
    const char *deployment_id;       /* or NULL, then: */
    const char *model;
};
struct cache_purge_result {
    uint32_t namespaces;             /* namespaces (TP ranks) selected */
    uint64_t blocks;                 /* entries removed (memory and ghosts) */
    uint64_t store_failed;           /* store deletes that failed (their copies may stay) */
};
typedef void (*cache_purge_fn)(void *arg, const struct cache_purge_result *r);
int  cache_purge_start(struct cache *c, const struct cache_purge_sel *sel, cache_purge_fn done,
                       void *arg, struct cache_purge **out, char *err, size_t errlen);
/* The requester went away: done() is not called; the purge goes on. */
void cache_purge_detach(struct cache *c, struct cache_purge *p);
/* End every lease of a closing connection at once. */
void cache_release_owner(struct cache *c, struct lease_list *owner);
/* The stop (SIGTERM), once no client is left: write every committed block in
 * memory that the store lacks — queued, waiting for its key, waiting for a
 * retry, or never written (write_back; write_through over the write budget)
 * — at once, not on the retry backoff, in rounds: wait for the writes in
 * flight, send those still lacking a copy, again until none lacks one or
 * timeout_ms passes (a round that landed nothing is followed by a short
 * pause). who: the log lines' prefix (a tenant's). 0 when every committed
 * block is in the store, -KVNODE_ETIMEDOUT when time ran out. Persistence
 * off: 0. Retries are no longer scheduled afterwards. */
int  cache_persist_flush(struct cache *c, unsigned timeout_ms, const char *who);
/* After cache_persist_flush and persist_stop (nothing is in flight any
 * more): the committed blocks in memory that the store lacks — lost to
 * persistence — counted in persist.stop_unwritten_total and
 * persist.dropped_total and logged with their count per namespace. The
 * count. */
uint64_t cache_persist_unwritten(struct cache *c, const char *who);

/* Keys looked up by match and get (those that returned a result): matched,
 * and missed by reason (see counters.h). */
void cache_key_metrics(const struct cache *c, struct metrics_keys *out);

/* A typed snapshot of the cache's counters: "tiers", "demotions",
 * "namespaces_*", "leases", "evictions" and "persist" of the stats document
 * (stats.c renders it). Strings belong to the cache or the store and stay
 * valid until the loop runs again; pin_error is a copy. */
struct cache_hbm_stats {
    int device;
    const char *pci_bus_id;
    uint32_t arena;                  /* arena id */
    struct arena_stats mem;
    uint64_t moving_bytes;           /* strides of blocks being demoted */
    bool lent_by_ipc;                /* lent as a CUDA IPC handle, else as an fd */
    bool down;                       /* a sticky error took the device (down_reason) */
    const char *down_reason;         /* "" while up */
    uint64_t down_dropped;           /* blocks dropped because it went down */
    uint64_t backoff_ms;             /* failed demotions: the current delay (0: none) */
    uint64_t failing_batches;        /* failed batches since the failures began (0: none) */
};
struct cache_persist_stats {
    bool on;                         /* a store is configured; nothing below is set otherwise */
    const char *backend, *policy, *last_error;
    bool lookup_on_miss;
    struct persist_counters store;   /* the pool's own counters and state */
    uint64_t dropped;                /* left memory without a copy in the store */
    uint64_t stop_unwritten;         /* committed blocks the stop could not write (in dropped) */
    uint64_t writes_deferred, writes_waiting, pinned_for_writes_bytes;
    uint64_t write_retries, retry_pending, put_waits, put_wait_timeouts;
    uint64_t promotions, promotions_ok, promotions_failed, lookups, lookup_found;
    uint64_t lookup_reads;           /* GETs' runs of unknown keys read without a lookup first */
    uint64_t lookup_negative_hits;   /* runs of unknown keys ended by a cached store miss */
    uint64_t waits, wait_timeouts;
    uint64_t recovered, recovery_skipped;  /* blocks the recovery scan indexed / skipped */
    bool has_recovery_seconds;       /* the scan started: recovery_seconds is set */
    double recovery_seconds;         /* until it finished, or until now */
};
struct cache_stats {
    struct arena_stats host;
    double high_watermark, low_watermark;
    bool pinned;                     /* the whole host arena is registered with the GPU runtime */
    uint64_t pinned_bytes;
    const char *pin_state;           /* off, running, done, failed, stopped */
    uint64_t host_page_size;         /* pages backing the host arena (smallest over tenants) */
    const char *huge_pages;          /* "hugetlb 2MiB" / "hugetlb 1GiB" / "thp" / "off" ("mixed" over tenants) */
    bool has_pin_error;
    char pin_error[256];
    /* Background reservation of the host arena (host.reserved_bytes so far). */
    const char *populate_state;      /* running, done, failed, stopped */
    double populate_seconds;         /* until done/failed, or until now */
    bool has_populate_error;
    char populate_error[256];
    /* memory.numa: numa_mode_name(), and the per-GPU regions (summed by
     * index over tenants, whose plans split the same nodes). */
    const char *numa;
    unsigned numa_regions;
    struct cache_numa_region {
        int node;
        unsigned gpus;
        bool placed;                 /* bound to its node */
        uint64_t capacity_bytes, used_bytes;
    } numa_region[ARENA_MAX_REGIONS];
    unsigned nhbm;
    struct cache_hbm_stats hbm[DEVMEM_MAX_DEVICES];
    struct {
        double high_watermark, low_watermark;
        uint64_t blocks, bytes, aborted, failed, dropped, hbm_puts, hbm_fallbacks;
        uint64_t failed_batches;     /* batches whose copy failed */
        uint64_t down_dropped;       /* HBM blocks dropped because their device went down */
        bool has_copier;             /* copier is set */
        struct copier_stats copier;
    } demotions;
    bool has_store;                  /* a store is configured: store_blocks is the "store" tier */
    uint64_t store_blocks;           /* known only in the store (ghosts) */
    uint64_t adopted_blocks, adopted_bytes;  /* host blocks a warm restart handed over */
    size_t namespaces, namespaces_active;  /* cache_namespace_stats(0 .. namespaces - 1) */
    uint64_t namespaces_reclaimed;
    struct {
        uint64_t read, write, reaped_read, reaped_write;
        uint64_t max_reserved_per_client_bytes, reservations_refused;
    } leases;
    struct {
        uint64_t to_store, writeback, dropped, quota;   /* host tier */
    } evictions;
    struct cache_persist_stats persist;
    struct metrics_keys keys;        /* cache_key_metrics */
};
void cache_get_stats(struct cache *c, struct cache_stats *out);
/* Node totals over several caches (one per tenant): first copies x into
 * sum; later calls add x's counters and bytes (HBM merged by device; the
 * shared copier's counters taken once; max_reserved_per_client_bytes the
 * largest; pin state the worst; the first error kept). */
void cache_stats_add(struct cache_stats *sum, const struct cache_stats *x, bool first);

/* One entry of "namespaces"; strings belong to the namespace. */
struct cache_namespace_stats {
    uint32_t id;
    const char *deployment_id, *model, *dtype;
    const char *revision;            /* the model revision, "" when none */
    uint32_t block_tokens;
    uint64_t block_bytes;
    uint32_t tp_size, tp_rank;
    uint64_t blocks, bytes, reserved_bytes, stored_blocks, quota_bytes;
    uint32_t clients;
    bool active;
};
/* i < cache_stats.namespaces (the registry's order). */
void cache_namespace_stats(struct cache *c, size_t i, struct cache_namespace_stats *out);

#endif
