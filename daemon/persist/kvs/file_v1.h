/* kvs/file_v1: the file-per-block layout of kvnode before the segment log
 * (issue 17), kept only so that a root written by it can be migrated: the
 * segment log's recovery scan opens this backend on the same root, reads
 * each block (every check of the old get applies: a bad copy is removed
 * and counted, never migrated), appends it to the log and removes the old
 * file. Nothing else stores blocks in this layout. Private to
 * daemon/persist/kvs/file*.c and the tests that build an old root.
 *
 * On disk, under the root:
 *
 *   <root>/<deployment dir>/tp-<rank>/layout       the namespace's layout
 *   <root>/<deployment dir>/tp-<rank>/<bb>/<key>.blk   one block
 *
 * Block file: a 64-byte header ("KVNB", u16 version 1, u16 header size 64,
 * u64 fingerprint, i64 key, u64 payload size, u32 tp_rank, u32 CRC-32C of
 * the payload, zero, u32 CRC-32C of bytes 0..59), then the payload. Layout
 * file: see file_v1_format.c (the segment log stores the same record).
 *
 *   file_v1.c         the backend: open and close (the roots in use), health, put,
 *                  get, del, exists; the extras of file.h
 *   file_format.c  the block header and the layout record, encoded and decoded
 *   file_root.c    a root: creation (the .lock) and end, the LRU, namespace dirs
 *   file_io.c      paths, small I/O helpers, the atomic write, a call's
 *                  namespace directory and its layout file
 *   file_scan.c    the recovery scan
 *
 * Worker threads; a root's mutex guards O(1) bookkeeping, never I/O. */
#ifndef KVNODE_KVS_FILE_V1_H
#define KVNODE_KVS_FILE_V1_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mem/namespace.h"
#include "persist/kvs/kvs.h"

#define HDR_SIZE     64u
#define HDR_VERSION  1u
#define LAYOUT_VERSION 1u
#define LAYOUT_SIZE  (4 + 2 + 2 + 8 + 8 + 6 * 4 + NS_MODEL_MAX + NS_DTYPE_MAX + NS_EXTRA_MAX + 4)
#define LAYOUT_NAME  "layout"
#define LOCK_NAME    ".lock-v1"   /* the segment log holds .lock */
#define TMP_PREFIX   ".tmp-"
#define DIR_MAX      NS_DEPLOYMENT_ID_MAX   /* sanitized deployment dir name, with NUL */

struct kvs_file_v1_stats {
    uint64_t blocks, bytes;       /* known to the LRU (header + payload) */
    uint64_t capacity_bytes;      /* 0: no limit */
    uint64_t evicted, evicted_bytes;
    uint64_t corrupt;             /* bad copies found by get (removed) */
    uint64_t scan_bad;            /* block files with a bad header found by scans (removed) */
    uint64_t scan_bad_layout;     /* namespace directories skipped: no valid layout file */
    uint64_t temps_removed;       /* stale temporary files removed by scans */
};

/* The old backend (not in kvs_backend_find: migration and tests only). */
extern const struct kvs_backend kvs_file_v1_backend;
void kvs_file_v1_stats(struct kvs_store *s, struct kvs_file_v1_stats *out);
int kvs_file_v1_block_path(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, char *buf,
                           size_t len);

/* ---- on-disk records (file_format.c) ------------------------------------------ */

struct blk_hdr {
    uint64_t fingerprint;
    int64_t  key;
    uint64_t size;
    uint32_t rank;
    uint32_t crc;
};

void file_hdr_encode(uint8_t b[HDR_SIZE], const struct blk_hdr *h);
/* NULL when the header is well formed, else why not. */
const char *file_hdr_decode(const uint8_t b[HDR_SIZE], struct blk_hdr *h);
void file_layout_encode(uint8_t b[LAYOUT_SIZE], const struct ns_layout *l, uint64_t fp);
/* NULL when b[0..n) is a valid layout record (into l, fp) of tenant's
 * store (NULL/"": "default"), else why not. fp is the fingerprint the
 * record carries, and so the records of its namespace: either
 * ns_fingerprint_tenant(l, tenant), or, for a layout whose identity is not
 * the v1 string (a '|' in a string, issue 27), ns_fingerprint_v1(l, tenant),
 * which versions before issue 27 wrote; the root is the tenant's and the
 * record names the whole layout, so such records are still its own. */
const char *file_layout_decode(const uint8_t *b, size_t n, const char *tenant, struct ns_layout *l,
                               uint64_t *fp);
int file_layout_equal(const struct ns_layout *a, const struct ns_layout *b);

/* ---- process-wide state per root (file_root.c) -------------------------------- */

struct fns {                       /* a namespace directory */
    struct fns *next;
    char dir[DIR_MAX];             /* sanitized deployment dir name (immutable) */
    uint32_t rank;                 /* immutable */
    char *path;                    /* <root>/<dir>/tp-<rank> (immutable) */
    int layout_known;              /* under mu: layout is what the layout file holds */
    struct ns_layout layout;       /* under mu */
};

struct lru_ent {
    struct lru_ent *hnext;         /* hash chain (victim list once detached) */
    struct lru_ent *prev, *next;   /* LRU list: root.head.next is the most recent */
    struct fns *ns;
    int64_t key;
    uint64_t size;
};

struct froot {
    struct froot *next;            /* under roots_mu */
    int refs;                      /* under roots_mu */
    uint32_t next_handle;          /* under roots_mu */
    char *path;                    /* realpath (immutable) */
    int lockfd;
    uint64_t instance;             /* names this process's temporary files */
    pthread_mutex_t mu;            /* everything below */
    struct fns *nss;
    struct lru_ent **tab;
    size_t nbuckets, count;
    struct lru_ent head;
    uint64_t used, pending, capacity;
    struct kvs_file_v1_stats st;
};

/* The default root's subdirectory holding the named tenants' roots, which
 * its recovery scan leaves alone. */
#define TENANTS_DIR  "tenants"

struct file_v1_store {
    struct froot *r;
    char tenant[NS_TENANT_MAX];    /* "": "default" */
    int fsync_policy;
    uint32_t id;
    uint64_t seq;
    struct fns *last_ns;           /* the namespace of the previous call */
};

static inline struct file_v1_store *FS1(struct kvs_store *s) { return (struct file_v1_store *)s; }

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return x;
}

/* ---- a root (file_root.c) ------------------------------------------------------ */

/* roots_mu (file.c) held: a root at realpath `path`, its .lock taken; NULL
 * with err and *rc set. */
struct froot *file_root_create(const char *path, char *err, size_t errlen, int *rc);
void file_root_free(struct froot *r);
/* All lru_* and fns_* functions: r->mu held. */
struct lru_ent *file_lru_find(struct froot *r, const struct fns *f, int64_t key);
void file_list_unlink(struct lru_ent *e);
void file_list_push_front(struct froot *r, struct lru_ent *e);
/* Detach e from the hash and the list and drop its bytes; the caller frees it. */
void file_lru_detach(struct froot *r, struct lru_ent *e);
void file_lru_drop(struct froot *r, const struct fns *f, int64_t key);
/* Record (f, key) of `size` bytes: as most recent (front != 0) or, for what
 * a scan finds, as least recent. */
void file_lru_note(struct froot *r, struct fns *f, int64_t key, uint64_t size, int front);
/* The namespace directory (dir, rank) of r, made on first use; NULL: no memory. */
struct fns *file_fns_get(struct froot *r, const char *dir, uint32_t rank);

/* ---- paths, I/O, namespaces (file_io.c) ------------------------------------------ */

/* The path of f's block `key`: 0 or -KVNODE_EINVAL (too long). */
int file_block_path(const struct fns *f, int64_t key, char *buf, size_t len);
/* An errno as a -KVNODE_E* code. */
/* Bytes read (< len only at end of file) or -1. */
ssize_t file_read_full(int fd, void *buf, size_t len);
/* The parent directory of path (into buf). */
void file_parent_of(const char *path, char *buf, size_t len);
/* Write a + b to `final` atomically (see file_io.c). */
int file_write_atomic(struct file_v1_store *s, const char *dir, const char *final, const void *a,
                      size_t alen, const void *b, size_t blen, char *err, size_t errlen);
/* 0, or -KVNODE_EINVAL when a call names no namespace. */
int file_check_ns(const struct kvs_ns *ns, char *err, size_t errlen);
/* The namespace directory of a call (cached per handle). */
int file_resolve_ns(struct file_v1_store *s, const struct kvs_ns *ns, struct fns **out, char *err,
                    size_t errlen);
/* Make f's directory and its layout file (once per process unless the
 * layout changes). */
int file_ensure_layout(struct file_v1_store *s, struct fns *f, const struct kvs_ns *ns, char *err,
                       size_t errlen);

/* ---- the recovery scan (file_scan.c) --------------------------------------------- */

int file_scan(struct kvs_store *ks, struct kvs_scan **cursor, size_t budget,
              void (*found)(void *arg, const struct kvs_found *f), void *arg, char *err,
              size_t errlen);

#endif
