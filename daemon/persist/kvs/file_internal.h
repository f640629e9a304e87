/* kvs/file internals: what the pieces of the segment-log backend share —
 * the record and hint formats, a root's process-wide state (keydir,
 * segments), a store handle, and the functions one piece calls in another.
 * Private to daemon/persist/kvs/file*.c; everybody else goes through
 * file.h and kvs.h. Format and policies: file.h.
 *
 *   file.c          the backend: open, close, health, put/get (batches), del,
 *                   exists; the extras of file.h
 *   file_format.c   records and hint files, encoded and decoded
 *   file_root.c     a root: .lock, segment list, keydir, direct-I/O probe,
 *                   capacity (dropping whole segments); a root of the
 *                   file-per-block store of 0.1.0-pre refused
 *   file_log.c      appending: a handle's open segment, batches, rotation,
 *                   hint files
 *   file_recover.c  the recovery scan: loading segments (hint or record
 *                   scan, a bad header skipped to the next whole record,
 *                   torn tails cut), reporting
 *
 * Worker threads; a root's mutex guards O(1) bookkeeping, never I/O. */
#ifndef KVNODE_KVS_FILE_INTERNAL_H
#define KVNODE_KVS_FILE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mem/namespace.h"
#include "persist/kvs/file.h"
#include "persist/kvs/kvs.h"

/* ---- formats (file_format.c) --------------------------------------------------- */

#define SEG_REC_HDR      64u          /* record header bytes */
#define SEG_REC_ALIGN    64u          /* records start at multiples of this */
#define SEG_DIO_ALIGN    4096u        /* direct-I/O writes: offset and length multiples */
#define SEG_VERSION      2u           /* records and hint files written now */
#define SEG_VERSION_V1   1u           /* before check words: read, as word 0 */
#define SEG_LAYOUT_SIZE  (4 + 2 + 2 + 8 + 8 + 6 * 4 + NS_MODEL_MAX + NS_DTYPE_MAX + NS_EXTRA_MAX + 4)
#define SEG_LAYOUT_VERSION 1u         /* of a layout record's payload */
/* Version 2 (issue 31): a layout with a model revision, which follows extra. */
#define SEG_LAYOUT_VERSION_V2 2u
#define SEG_LAYOUT_SIZE_V2 (SEG_LAYOUT_SIZE + NS_REVISION_MAX)
#define SEG_HINT_HDR     40u
#define SEG_HINT_ENT     64u          /* a version-2 hint entry */
#define SEG_HINT_ENT_V1  56u          /* a version-1 one (no check word) */
#define SEG_LOCK_NAME    ".lock"
#define SEG_TENANTS_DIR  "tenants"
#define SEG_NAME_FMT     "seg-%016" PRIx64 ".log"
#define SEG_HINT_FMT     "seg-%016" PRIx64 ".hint"
#define SEG_EPOCH_SHIFT  40           /* seq = epoch << 40 | counter (see file.h) */

enum { SEG_REC_BLOCK = 1, SEG_REC_TOMB = 2, SEG_REC_LAYOUT = 3, SEG_REC_PAD = 4 };

struct seg_rec {                   /* a record header, decoded */
    uint8_t  type;
    uint32_t rank;
    uint64_t fingerprint;
    int64_t  key;
    uint64_t check;                /* the key's check word (version 1: 0) */
    uint64_t size;                 /* payload bytes */
    uint64_t seq;
    uint32_t crc;                  /* CRC-32C of the payload */
};

static inline uint64_t seg_rec_len(uint64_t payload)
{
    return SEG_REC_HDR + ((payload + SEG_REC_ALIGN - 1) & ~(uint64_t)(SEG_REC_ALIGN - 1));
}

void seg_rec_encode(uint8_t b[SEG_REC_HDR], const struct seg_rec *r);
/* NULL when b holds a well-formed header, else why not. */
const char *seg_rec_decode(const uint8_t b[SEG_REC_HDR], struct seg_rec *r);
/* The layout record's payload ("KVNL", u16 version 1, u16 size, u64
 * fingerprint, u64 block_bytes, u32 block_tokens, num_layers, kv_heads,
 * head_dim, tp_size, tp_rank, model, dtype, extra (NUL-padded), u32 CRC-32C
 * of all before it). fp: the fingerprint its records carry: the tenant's
 * ns_fingerprint_tenant, or, for a layout whose identity is not the v1
 * string (a '|' in a string, issue 27), ns_fingerprint_v1, which versions
 * before issue 27 wrote and recovery indexes under the current identity.
 * decode: NULL when b[0..n) is a valid record of tenant's store, else why not. */
/* Version 2, for a layout with a revision only (one without keeps version
 * 1, byte for byte): the same, the version 2, the size SEG_LAYOUT_SIZE_V2,
 * and the revision (NUL-padded) between extra and the CRC. Hint files hold
 * version-1 layouts only: a segment naming a layout with a revision gets no
 * hint file (recovery reads the segment itself). */
static inline size_t seg_layout_size(const struct ns_layout *l)
{
    return l->revision[0] ? SEG_LAYOUT_SIZE_V2 : SEG_LAYOUT_SIZE;
}
/* b has room for seg_layout_size(l) bytes. */
void seg_layout_encode(uint8_t *b, const struct ns_layout *l, uint64_t fp);
const char *seg_layout_decode(const uint8_t *b, size_t n, const char *tenant, struct ns_layout *l,
                              uint64_t *fp);

struct seg_hint_ent {              /* one record of a closed segment */
    uint8_t  type;                 /* SEG_REC_BLOCK or SEG_REC_TOMB */
    uint32_t rank, crc;
    uint64_t fingerprint, size, seq, off;   /* off: the record's header */
    int64_t  key;
    uint64_t check;                /* the key's check word (version 1: 0) */
};
void seg_hint_ent_encode(uint8_t b[SEG_HINT_ENT], const struct seg_hint_ent *e);
/* An entry of a hint file of `version` (SEG_HINT_ENT_V1 bytes for version 1). */
void seg_hint_ent_decode(const uint8_t *b, unsigned version, struct seg_hint_ent *e);
/* Bytes of one entry in a hint file of `version`. */
static inline size_t seg_hint_ent_size(unsigned version)
{
    return version == SEG_VERSION_V1 ? SEG_HINT_ENT_V1 : SEG_HINT_ENT;
}
/* Hint file: header (magic "KVSH", u16 version, u16 header size, u64 segment
 * id, u64 segment length, u32 layouts, u32 entries, u32 zero, u32 CRC of
 * 0..35), layouts, entries, u32 CRC-32C of everything before it. */
void seg_hint_hdr_encode(uint8_t b[SEG_HINT_HDR], uint64_t id, uint64_t seg_len,
                         uint32_t nlayouts, uint32_t nents);
const char *seg_hint_hdr_decode(const uint8_t b[SEG_HINT_HDR], uint64_t *id, uint64_t *seg_len,
                                uint32_t *nlayouts, uint32_t *nents, unsigned *version);

/* ---- a root (file_root.c) -------------------------------------------------------- */

struct seg_ns {                    /* a namespace seen in this root */
    struct seg_ns *next;
    uint64_t fingerprint;
    uint32_t rank;
    bool layout_known;             /* under mu */
    struct ns_layout layout;       /* under mu once known; immutable after */
};

struct seg {
    uint64_t id;                   /* immutable */
    uint64_t len;                  /* bytes written (the open one's: its writer's) */
    uint64_t live_bytes, live_count, tombs;   /* under mu */
    int rfd;                       /* read fd (lazily opened), under mu */
    int refs;                      /* readers in pread, under mu */
    bool open;                     /* a handle appends to it */
    bool dropped;                  /* files removed; keydir entries on it are stale */
    bool loading;                  /* pre-existing, not yet loaded by recovery */
};

enum { KD_BLOCK = 0, KD_TOMB = 1 };

struct kd_ent {                    /* a keydir entry */
    struct kd_ent *next;
    struct seg_ns *ns;
    struct seg *seg;
    int64_t key;
    uint64_t check;                /* the block's check word (0: none) */
    uint64_t seq, off, size;       /* off: the record's header */
    uint32_t crc;
    uint8_t kind;
};

struct seg_root {
    struct seg_root *next;         /* under roots_mu */
    int refs;                      /* under roots_mu */
    char *path;                    /* realpath (immutable) */
    char tenant[NS_TENANT_MAX];
    int lockfd;
    bool direct_ok;                /* O_DIRECT accepted by the file system (probed) */
    pthread_mutex_t mu;            /* everything below */
    struct seg_ns *nss;
    struct kd_ent **tab;
    size_t mask, count;            /* buckets - 1; entries (incl. tombstones) */
    struct seg **segs;             /* by id order */
    size_t nsegs, capsegs;
    uint64_t next_id, epoch, counter;
    size_t load_next;              /* recovery: index of the next segment to load */
    size_t nloading;               /* segments found at open (the first nloading of segs) */
    int load_busy;                 /* scans loading a segment now */
    bool recovered;
    uint64_t *unlink_ids;          /* dropped segments whose files are still to remove */
    size_t nunlink, capunlink;
    int direct_io;                 /* KVS_DIRECT_* of the latest open */
    uint64_t capacity, segment_bytes;
    struct kvs_file_stats st;
};

struct seg_writer {                /* a handle's open segment */
    struct seg *seg;
    int fd;
    bool direct;
    struct seg_ns **nss;           /* namespaces whose layout record it holds */
    size_t nnss, capnss;
    struct seg_hint_ent *ents;     /* for its hint file */
    size_t nents, capents;
};

struct file_store {
    struct seg_root *r;
    int fsync_policy;
    struct seg_writer w;
    uint8_t *buf;                  /* aligned batch buffer */
    size_t buflen, bufcap;
    uint64_t buf_off;              /* segment offset of buf[0] */
};

static inline struct file_store *FS(struct kvs_store *s) { return (struct file_store *)s; }

/* roots_mu (file.c) held: the root at realpath `path`; NULL with err, *rc.
 * A root of the file-per-block store of 0.1.0-pre: -KVNODE_EINVAL, nothing
 * in it touched. */
struct seg_root *seg_root_create(const char *path, const char *tenant, int direct_io, char *err,
                                 size_t errlen, int *rc);
void seg_root_free(struct seg_root *r);
/* All below: r->mu held unless said otherwise. */
struct seg_ns *seg_ns_get(struct seg_root *r, uint64_t fp, uint32_t rank);
struct kd_ent *seg_kd_find(struct seg_root *r, const struct seg_ns *ns, int64_t key);
/* Apply a record at (seg, off) to the keydir when seq is newer than what it
 * holds; returns true when applied. */
bool seg_kd_apply(struct seg_root *r, struct seg_ns *ns, int64_t key, uint64_t check, uint8_t kind,
                  struct seg *sg, uint64_t off, uint64_t size, uint32_t crc, uint64_t seq);
/* Remove e (a stale or corrupt entry). */
void seg_kd_remove(struct seg_root *r, struct kd_ent *e);
struct seg *seg_add(struct seg_root *r, uint64_t id);
/* Drop sg (closed) now: keydir entries on it become stale; its files are
 * queued for seg_drain_unlinks. */
void seg_mark_dropped(struct seg_root *r, struct seg *sg);
/* Without r->mu: remove the files of the dropped segments queued so far. */
void seg_drain_unlinks(struct seg_root *r);
/* Release one reader ref; closes the fd of a dropped segment. */
void seg_unref(struct seg_root *r, struct seg *sg);
/* Segments whose records are all dead: dropped (files removed outside). */
void seg_reclaim_if_dead(struct seg_root *r, struct seg *sg);
/* Unlink a dropped segment's files (no lock needed). */
void seg_unlink_files(const struct seg_root *r, uint64_t id);
/* Make room for `need` more bytes under the capacity: drops the least
 * recently written closed segments; false when that cannot be done. */
bool seg_make_room(struct seg_root *r, uint64_t need);
void seg_path(const struct seg_root *r, uint64_t id, bool hint, char *buf, size_t len);

/* ---- appending (file_log.c) ------------------------------------------------------------ */

/* Append n records (block puts or tombstones) as few large writes; items'
 * rc set. kinds[i] is SEG_REC_BLOCK or SEG_REC_TOMB. */
int seg_append(struct file_store *s, struct kvs_item *items, const uint8_t *kinds, size_t n,
               char *err, size_t errlen);
/* Write the hint file of segment id (temporary name, renamed). */
void seg_hint_write(struct seg_root *r, uint64_t id, uint64_t seg_len, struct seg_ns *const *nss,
                    size_t nnss, const struct seg_hint_ent *ents, size_t nents, bool sync);
/* Close the handle's open segment (hint file written). */
void seg_writer_close(struct file_store *s);

/* ---- recovery (file_recover.c) ---------------------------------------------------------- */

int seg_scan(struct kvs_store *ks, struct kvs_scan **cursor, size_t budget,
             void (*found)(void *arg, const struct kvs_found *f), void *arg, char *err,
             size_t errlen);

#endif
