/* persist: the persistence worker pool. Runs the KV-store backend's calls
 * (kvs/kvs.h) for the loop thread — write-behind writes, promotion reads,
 * deletes, existence lookups, health probes — on a workq, and the recovery
 * scan on a thread of its own, and hands every result back on the loop
 * through the request's callback. It decides nothing about the index: the
 * cache says what to write, read and forget. It counts everything (queue
 * depth, blocks and bytes written and read, failures by op and kind, drops,
 * recovery progress) and tracks whether the store answers.
 *
 * Threads: [persist] workers threads named "persist-<i>", each with its own
 * kvs_store, opened when the thread starts; a handle that failed to open (a
 * store down at start) or whose call failed with a connection-level error is
 * (re)opened by the thread's next job, so a store that comes back is used
 * again without a restart. The scan runs on "persist-scan" with its own
 * handle, in chunks, so each chunk's results reach the loop while the rest is
 * still being read: the daemon serves from what was found so far.
 *
 * Buffers passed to persist_write/persist_read/persist_exists must stay valid
 * (and, for writes, unchanged) until their done callback runs: the cache pins
 * the blocks it hands over.
 *
 * Loop thread only. */
#ifndef KVNODE_PERSIST_H
#define KVNODE_PERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "config/config.h"
#include "persist/kvs/file.h"
#include "persist/kvs/kvs.h"
#include "mem/namespace.h"

struct event_base;
struct persist;

/* Result of a request, on the loop thread: 0, KVS_MISS, KVS_CORRUPT (read:
 * the bad copy was removed), or a negative KVNODE_E* code (-KVNODE_ESHUTDOWN
 * when persist_destroy discarded it before it ran). Called exactly once per
 * accepted request. */
typedef void (*persist_done_fn)(void *arg, int rc);

enum persist_state {
    PERSIST_STATE_OFF = 0,       /* no backend configured */
    PERSIST_STATE_OK = 1,        /* the last call that reached the store succeeded */
    PERSIST_STATE_DEGRADED = 2,  /* the last one failed (down, slow, full, ...) */
};

/* Failure kinds (metrics label values in persist_failure_kind_name). */
enum persist_failure_kind {
    PERSIST_FAIL_TIMEOUT = 0,    /* -KVNODE_ETIMEDOUT */
    PERSIST_FAIL_NOSPACE,        /* -KVNODE_ENOSPC */
    PERSIST_FAIL_CORRUPT,        /* KVS_CORRUPT (read) */
    PERSIST_FAIL_UNAVAILABLE,    /* the store could not be reached / handle would not open */
    PERSIST_FAIL_PROTOCOL,       /* -KVNODE_EPROTO: the store answered garbage */
    PERSIST_FAIL_IO,             /* anything else */
    PERSIST_FAIL_KINDS
};

enum persist_op { PERSIST_OP_WRITE = 0, PERSIST_OP_READ, PERSIST_OP_DELETE, PERSIST_OP_EXISTS,
                  PERSIST_OP_SCAN, PERSIST_OP_HEALTH, PERSIST_OPS };

/* What a probe while degraded was: the store's health call, or the write of
 * a block that waits for a retry (see persist_set_write_probe). */
enum persist_probe_kind { PERSIST_PROBE_HEALTH = 0, PERSIST_PROBE_WRITE, PERSIST_PROBE_KINDS };

struct persist_counters {
    uint64_t written_blocks, written_bytes;     /* successful writes */
    uint64_t read_blocks, read_bytes;           /* successful reads (promotions) */
    uint64_t read_misses;                       /* reads that found no block (KVS_MISS) */
    uint64_t deleted_keys;                      /* keys sent to the store's delete */
    /* tombstones: keys deleted while the store keeps them (v6d) */
    uint64_t tombstones;                        /* hidden now ([persist] tombstones bounds it) */
    uint64_t tombstones_dropped;                /* forgotten to make room (oldest first): such
                                                   a key can be found in the store again */
    uint64_t tombstone_hits;                    /* lookups and reads a tombstone hid */
    uint64_t check_mismatches;                  /* lookups and reads that found the key
                                                   under another check word (a miss) */
    uint64_t failures[PERSIST_OPS][PERSIST_FAIL_KINDS];
    uint64_t probes_ok[PERSIST_PROBE_KINDS];     /* probes while degraded, by kind and result */
    uint64_t probes_failed[PERSIST_PROBE_KINDS];
    uint64_t refused_queue_full;                /* requests refused: queue full (the cache
                                                   queues writes again; see cache.h) */
    uint64_t submitted, completed;              /* accepted requests / done callbacks run */
    size_t   queue_depth, queue_capacity;       /* outstanding now / bound */
    unsigned workers;
    /* recovery scan */
    bool     scan_running, scan_complete;
    uint64_t scan_found;                        /* blocks reported to the loop so far */
    uint64_t scan_started_ms, scan_finished_ms; /* clock_now_ms(); 0 when not yet */
    int      state;                             /* enum persist_state */
    /* the embedded file store (segment log), when it is the backend */
    bool     file_on;
    struct kvs_file_stats file;
};

/* Start the pool for cfg->persist_backend. With CONFIG_BACKEND_OFF: returns
 * 0 and *out = NULL (every caller treats a NULL persist as "no store"). The
 * backend is opened once on the calling thread first: for `file` a failure
 * (bad path, permissions, root in use) fails the start with err naming the
 * path; for `v6d` a store that does not answer is logged, the state starts
 * DEGRADED and the workers retry. 0, or a negative KVNODE_E* code. */
int  persist_create(struct event_base *base, const struct kvn_config *cfg, struct persist **out,
                    char *err, size_t errlen);
/* The same for a named tenant's store (NULL: "default", as persist_create):
 * the backend checks its records against the tenant's fingerprints
 * (kvs_config.tenant), and its threads are named "persist.<tenant>-<i>"
 * and "persist-scan.<tenant>-0". */
int  persist_create_tenant(struct event_base *base, const struct kvn_config *cfg, const char *tenant,
                           struct persist **out, char *err, size_t errlen);
/* Stop the scan and the workers; requests not run yet get their callback
 * with -KVNODE_ESHUTDOWN. Call persist_drain first to bound the wait. NULL ok. */
void persist_destroy(struct persist *p);
/* The same but the counters stay readable until persist_destroy: after it
 * every request has had its callback, and new ones are refused
 * (-KVNODE_ESHUTDOWN). The stop uses it to count exactly what did not land. */
void persist_stop(struct persist *p);
/* Process completions on the loop thread until nothing is outstanding or
 * timeout_ms passes (see workq_drain). 0 or -KVNODE_ETIMEDOUT. */
int  persist_drain(struct persist *p, unsigned timeout_ms);

/* Whether the index may lack blocks the store holds, so a key the index
 * does not know should be looked up in the store ([persist] lookup; auto:
 * true for a store no scan can enumerate, i.e. v6d). */
bool persist_lookup_on_miss(const struct persist *p);
/* Whether a read answers "absent" as cheaply as persist_exists does (redis:
 * GET replies nil in the same pipelined batch), so a GET of keys the index
 * does not know reads them at once instead of looking them up first. */
bool persist_reads_find(const struct persist *p);
/* Whether a scan can list what the store holds (file: yes; v6d: no). */
bool persist_enumerable(const struct persist *p);
/* The backend's name ("file", "v6d"). */
const char *persist_backend_name(const struct persist *p);

/* Requests. Each returns 0 when accepted (done runs later, exactly once, on
 * the loop thread), -KVNODE_ELIMIT when the queue is full (counted in
 * refused_queue_full; done is not called), -KVNODE_ESHUTDOWN while stopping.
 * ns must outlive the request (namespaces live as long as the daemon). */
/* check: the block's check word (0: none), stored with it; a read or
 * lookup with another word finds nothing there (KVS_MISS / absent) and is
 * counted in check_mismatches. */
/* A block to write: ns, key and word, its bytes (data, len), and whom to
 * tell (done(arg, rc)). The request is copied; data must stay as it is. */
struct persist_write_req {
    const struct kv_namespace *ns;
    int64_t         key;
    uint64_t        check;
    const void     *data;
    size_t          len;
    persist_done_fn done;
    void           *arg;
};
int  persist_write(struct persist *p, const struct persist_write_req *w);
/* A write that is the store's probe while degraded (the write probe hook
 * sent it): a write like the others, its result also counted as a probe's.
 * dm NULL: host memory; else device memory of dm's `device`. */
struct devmem;
int  persist_write_probe(struct persist *p, const struct persist_write_req *w, struct devmem *dm,
                         int device);
/* The same for a block in device memory (dm's `device`): the worker copies
 * it to host memory (devmem_copy_to_host) before writing it. */
int  persist_write_device(struct persist *p, const struct persist_write_req *w, struct devmem *dm,
                          int device);
/* A block to read: ns, key and word, where its bytes go (data, len: the
 * block size), and whom to tell (done(arg, rc); -KVNODE_ENOENT: not held). */
struct persist_read_req {
    const struct kv_namespace *ns;
    int64_t         key;
    uint64_t        check;
    void           *data;
    size_t          len;
    persist_done_fn done;
    void           *arg;
};
int  persist_read(struct persist *p, const struct persist_read_req *r);
/* keys were deleted: for a store that cannot delete what it holds (v6d:
 * keeps_deleted) remember each in a bounded FIFO of tombstones, so that
 * lookups (persist_exists) and reads (persist_read) stop finding it — also
 * those already under way — until it is put again (persist_write and
 * persist_write_device forget its tombstone) or until [persist] tombstones
 * newer deletes push it out (counted in tombstones_dropped). Tombstones
 * live in memory: a restarted daemon finds the store's copies again. Call
 * it when the delete happens, before later lookups; a no-op for stores
 * that delete (file). */
/* checks: the keys' check words (NULL: every word 0), here and below; a
 * tombstone hides (key, word). */
void persist_hide(struct persist *p, const struct kv_namespace *ns, const int64_t *keys,
                  const uint64_t *checks, size_t n);
/* keys and checks are copied; done may be NULL. A key the store holds under
 * another word is left alone. */
int  persist_delete(struct persist *p, const struct kv_namespace *ns, const int64_t *keys,
                    const uint64_t *checks, size_t n, persist_done_fn done, void *arg);
/* Whether the store can remove every block of a namespace at once,
 * including blocks the index never knew (redis: another node's, or stored
 * before a restart), for a purge; false for stores whose blocks the index
 * knows after recovery (file) or that cannot delete (v6d). */
bool persist_can_purge(const struct persist *p);
/* Remove every block of ns from the store (counted in deleted_keys as the
 * store reports them); done may be NULL. Only where persist_can_purge. */
int  persist_purge(struct persist *p, const struct kv_namespace *ns, persist_done_fn done, void *arg);
/* Which of n keys the store holds: keys and checks are copied; present[i]
 * (caller's, n bytes) is filled before done: 1 when the store holds
 * keys[i] under checks[i]. */
struct persist_lookup_req {
    const struct kv_namespace *ns;
    const int64_t  *keys;
    const uint64_t *checks;
    size_t          n;
    uint8_t        *present;
    persist_done_fn done;
    void           *arg;
};
int  persist_exists(struct persist *p, const struct persist_lookup_req *r);

/* Recovery: scan the store in chunks on the scan thread. found() runs on the
 * loop for each chunk (blocks valid during the call only); finished() once at
 * the end with 0 or a negative code (the scan stopped; what was found stays
 * found). Returns 0, or -KVNODE_ESTATE when a scan already ran or runs. */
typedef void (*persist_found_fn)(void *arg, const struct kvs_found *blocks, size_t n);
int  persist_scan_start(struct persist *p, persist_found_fn found, persist_done_fn finished,
                        void *arg);

void persist_get_counters(const struct persist *p, struct persist_counters *out);
const char *persist_state_name(int state);               /* "off", "ok", "degraded" */
const char *persist_failure_kind_name(int kind);         /* "timeout", "nospace", ... */
const char *persist_op_name(int op);                     /* "write", "read", ... */
/* No write that failed waits for a retry any more (the blocks were written,
 * deleted or left memory): a successful health probe may end DEGRADED again. */
void persist_write_failures_settled(struct persist *p);
/* Whether the last write failed (the store is DEGRADED until one lands): the
 * blocks waiting for a retry are then written one per probe, not in batches. */
bool persist_writes_failing(const struct persist *p);
/* The write probe: while writes fail, each health probe (every
 * 0.5 s while DEGRADED) calls fn instead of the store's health
 * call; fn sends the write of one block that waits for a retry with
 * persist_write_probe (or has one under way) and returns true, or returns
 * false when no block waits (then the health call probes, and its success
 * ends DEGRADED). So the first write that can land ends DEGRADED at the
 * next probe, whatever the retry backoff. NULL fn: health calls only. */
typedef bool (*persist_write_probe_fn)(void *arg);
void persist_set_write_probe(struct persist *p, persist_write_probe_fn fn, void *arg);
/* The last failure's message ("" when none since the last success). */
const char *persist_last_error(const struct persist *p);

#endif
