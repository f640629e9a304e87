/* kvs: the persistent-store interface the persist workers call.
 *
 * A backend stores whole blocks under (namespace, key), where a namespace is
 * a deployment's TP rank (its layout is passed along so a backend can record
 * it and give it back on recovery). Backends know nothing of the index, the
 * loop or the leases. Calls block (disk, network) and so run only on worker
 * threads; one kvs_store handle belongs to one thread at a time (open one per
 * worker). Every call is bounded in time by the backend's own timeouts.
 *
 * Results: 0 on success, KVS_MISS (> 0) when a block is absent, KVS_CORRUPT
 * (> 0) when a stored copy failed its integrity check (the backend has
 * already removed it), KVS_MISMATCH (> 0, get) when the key is stored under
 * another check word (the block is kept: it belongs to another prefix);
 * negative KVNODE_E* codes for failures (-KVNODE_EIO, -KVNODE_ETIMEDOUT,
 * -KVNODE_ENOSPC, -KVNODE_EINVAL, ...), with err naming the problem.
 *
 * Check words (issue 19): every block is stored with its key's 64-bit check
 * word (0: none, as rtp-llm's blocks), and the calls that find a block by
 * its key compare it: a block under another word is not the caller's. */
#ifndef KVNODE_KVS_H
#define KVNODE_KVS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mem/namespace.h"

enum { KVS_MISS = 1, KVS_CORRUPT = 2, KVS_MISMATCH = 3 };
/* exists: present[i] values. */
enum { KVS_ABSENT = 0, KVS_PRESENT = 1, KVS_PRESENT_OTHER_WORD = 2 };

/* Which namespace a call is about. */
struct kvs_ns {
    const struct ns_layout *layout;   /* full layout incl. tp_rank and block_bytes */
    uint64_t fingerprint;             /* ns_fingerprint_tenant(layout, the store's tenant) */
    const char *deployment_id;        /* <model>-<fingerprint hex> */
};

/* Backend settings (from [persist] in kvnode.conf). */
struct kvs_config {
    const char *backend;          /* "file" | "v6d" | "redis" */
    const char *path;             /* file: root directory */
    uint64_t capacity_bytes;      /* file: drop the oldest segments beyond this (0: no limit) */
    uint64_t segment_bytes;       /* file: a segment closes at this size (0: the default) */
    int direct_io;                /* file: KVS_DIRECT_* */
    int fsync_policy;             /* KVS_FSYNC_* */
    const char *url;              /* v6d: control-plane base URL */
    const char *socket_path;      /* v6d: data-plane unix socket */
    const char *object_namespace; /* v6d: first part of every object key (NULL/"": rtp_llm) */
    const char *tenant;           /* whose store this is (NULL/"": "default"): file checks the
                                     layout records' fingerprints as ns_fingerprint_tenant */
    uint32_t connect_timeout_ms, timeout_ms;
    const char *redis_nodes;      /* redis: seed nodes HOST:PORT,... */
    const char *redis_user;       /* redis: ACL user (NULL/"": none) */
    const char *redis_password;   /* redis: NULL/"": no AUTH; never logged */
};

enum { KVS_FSYNC_NEVER = 0, KVS_FSYNC_BATCH = 1, KVS_FSYNC_ALWAYS = 2 };
enum { KVS_DIRECT_AUTO = 0, KVS_DIRECT_ON = 1, KVS_DIRECT_OFF = 2 };

/* One block found by a recovery scan. */
struct kvs_found {
    struct ns_layout layout;      /* as recorded when the block was stored */
    uint64_t fingerprint;
    int64_t key;
    uint64_t check;               /* the block's check word (0: none) */
    uint64_t size;
};

struct kvs_store;
struct kvs_scan;

/* One block of a batch (put_batch / get_batch). */
struct kvs_item {
    const struct kvs_ns *ns;
    int64_t key;
    uint64_t check;               /* the block's check word (0: none) */
    const void *src;              /* put: the block's bytes */
    void *dst;                    /* get: where they go */
    size_t len;                   /* == ns->layout->block_bytes */
    int rc;                       /* out: what put / get would have returned for it */
};

struct kvs_backend {
    const char *name;
    int  (*open)(const struct kvs_config *cfg, struct kvs_store **out, char *err, size_t errlen);
    /* 0 when the store answers and accepts writes. */
    int  (*health)(struct kvs_store *s, char *err, size_t errlen);
    /* Store len bytes (len == layout->block_bytes); replaces an existing copy
     * atomically: a reader sees the old or the new block, never a mix. */
    int  (*put)(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                const void *data, size_t len, char *err, size_t errlen);
    /* Read exactly len bytes into data: 0, KVS_MISS, KVS_CORRUPT, KVS_MISMATCH or < 0. */
    int  (*get)(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                void *data, size_t len, char *err, size_t errlen);
    /* 0 (also when it was absent, or stored under another word: kept) or < 0. */
    int  (*del)(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                char *err, size_t errlen);
    /* present[i] = KVS_PRESENT when keys[i] is stored under checks[i] (NULL:
     * every word 0), KVS_PRESENT_OTHER_WORD under another word, else KVS_ABSENT. */
    int  (*exists)(struct kvs_store *s, const struct kvs_ns *ns, const int64_t *keys,
                   const uint64_t *checks, size_t n, uint8_t *present, char *err, size_t errlen);
    /* Recovery: report up to `budget` stored blocks per call through found();
     * *cursor starts NULL and is freed by the backend when the scan ends.
     * Returns 1 when the scan is complete, 0 when more remain, < 0 on error.
     * budget == 0 abandons a scan: frees *cursor (sets it NULL), returns 1. */
    int  (*scan)(struct kvs_store *s, struct kvs_scan **cursor, size_t budget,
                 void (*found)(void *arg, const struct kvs_found *f), void *arg,
                 char *err, size_t errlen);
    void (*close)(struct kvs_store *s);
    /* Optional (NULL: the caller calls put / get per block): the same for n
     * blocks in as few store calls as the backend can make. Every item's rc
     * is set. Returns 0 when the batch reached the store (items may still
     * have failed one by one), or < 0 when it failed as a whole (every
     * item's rc is that code too; err says why). */
    int  (*put_batch)(struct kvs_store *s, struct kvs_item *items, size_t n, char *err,
                      size_t errlen);
    int  (*get_batch)(struct kvs_store *s, struct kvs_item *items, size_t n, char *err,
                      size_t errlen);
    /* Optional (NULL: the store holds nothing the caller's index does not
     * know, or cannot delete): remove every block of ns (one TP rank's
     * namespace), whatever its key and check word, also those the caller
     * never heard of (another node's, or stored before a restart).
     * *removed: how many. 0 or < 0. */
    int  (*purge)(struct kvs_store *s, const struct kvs_ns *ns, uint64_t *removed, char *err,
                  size_t errlen);
    /* del cannot remove a stored block (v6d: a sealed object is permanent,
     * the protocol discards unsealed ones only): the caller must hide deleted
     * keys itself (persist's tombstones). */
    bool keeps_deleted;
    /* A read of an absent block is answered (KVS_MISS) as cheaply as exists
     * answers it, in the same pipelined batch (redis: GET replies nil): the
     * caller may read keys it does not know instead of asking exists first. */
    bool reads_find;
};

/* The backends (kvs_backend_find() knows them by name). */
extern const struct kvs_backend kvs_backend_file;   /* kvs/file.c; extras in kvs/file.h */
extern const struct kvs_backend kvs_backend_v6d;    /* kvs/v6d.c; extras in kvs/v6d.h */
extern const struct kvs_backend kvs_backend_redis;  /* kvs/redis.c; extras in kvs/redis.h */

/* The backend called `name`, or NULL. */
const struct kvs_backend *kvs_backend_find(const char *name);

#endif
