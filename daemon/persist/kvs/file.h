/* kvs/file: the embedded `file` backend (kvs_backend_file, see kvs.h), an
 * append-only segment log after Bitcask, and what it offers beyond the
 * interface: counters and where a block's record is (tests, diagnostics).
 *
 * On disk, under the configured root:
 *
 *   <root>/.lock                      flock()ed by the process using the root
 *   <root>/seg-<id>.log               a segment: records, appended only
 *   <root>/seg-<id>.hint              a closed segment's index (optional)
 *   <root>/tenants/<NAME>/...         named tenants' roots (their own logs)
 *
 * <id> is 16 lowercase hex digits; a segment is never rewritten in place.
 * Each store handle (one per persist worker) appends to its own open
 * segment without a lock; the handles of one root share one keydir (a hash
 * from (namespace, key) to segment, offset, size, CRC, sequence), guarded by
 * a mutex held for O(1) bookkeeping only. A segment closes when the next
 * batch would take it past persist.segment_bytes; its hint file is then
 * written (temporary name, renamed).
 *
 * Record: a 64-byte header, the payload, zero padding to a multiple of 64.
 * Integers little-endian:
 *
 *   0  "KVSR"  4  u16 version (2)  6  u8 type (1 block, 2 tombstone,
 *   3 layout, 4 padding)  7  zero  8  u64 deployment fingerprint  16  i64 key
 *   24 u64 payload size  32  u64 sequence  40  u32 tp_rank
 *   44 u32 CRC-32C of the payload  48 u64 the key's check word (0: none)
 *   56..59 zero  60  u32 CRC-32C of 0..59
 *
 * Version 1 (before check words, issue 19) had zeros at 48..59: its records
 * still load, as word 0; new records are version 2.
 *
 * A layout record (payload: the 468-byte layout, with its own CRC; a layout
 * with a model revision: version 2, 596 bytes; see file_internal.h) precedes a namespace's first block in every segment, so each segment
 * names the namespaces of its blocks by itself: no single small file can
 * hide a namespace. Padding records fill a batch to a multiple of 4096
 * bytes when the segment is written with O_DIRECT.
 *
 * Sequence numbers order writes across handles and restarts: epoch << 40 |
 * counter, where the epoch is one more than the highest segment id found at
 * open (every run's epoch exceeds that of any run whose records survive).
 * The keydir keeps, per key, the record with the highest sequence; a
 * tombstone (delete) is a record too, so an older write never shadows a
 * newer write or delete after a restart.
 *
 * Hint file: a 40-byte header ("KVSH", u16 version (2), u16 header size, u64
 * segment id, u64 segment length, u32 layouts, u32 entries, zero, u32 CRC of
 * 0..35), the layouts (468 bytes each), the entries (64 bytes: type, rank,
 * fingerprint, key, payload size, sequence, record offset, payload CRC,
 * check word; version 1: 56 bytes, no word, read as 0), then a CRC-32C of
 * everything before it.
 *
 * Check words: the keydir keeps each block's word; get of another word is
 * KVS_MISMATCH (the block stays), exists says KVS_PRESENT_OTHER_WORD, del
 * of another word leaves it.
 *
 * Open refuses a root of the file-per-block store of kvnode 0.1.0-pre (it
 * holds <deployment dir>/tp-<rank>/ directories; no segment log does) with
 * -KVNODE_EINVAL and a message saying so, touching nothing in it: that
 * format is neither read nor migrated.
 *
 * Recovery (the scan callback, on the persist-scan thread): each
 * segment found at open is loaded from its hint file, or, when that is
 * missing or fails a check, by reading its record headers (payloads are
 * checked by the get that reads them). A record with a bad header is
 * skipped (counted in corrupt and resync_records / resync_bytes): recovery
 * goes on at the next whole record (good header, length within the
 * segment, payload CRC; a layout record's payload checks itself and is
 * learned even under a bad header), trying the bad header's own length
 * first, so the payload of a record is not read as records where that can
 * be helped. A good header whose record runs past the end, and anything
 * after the last good record with nothing whole after it, is a torn tail
 * (kill -9): cut (counted in torn_tails / torn_bytes). The segment then
 * gets a hint file when nothing in it was bad.
 * Then the keydir is reported in budgets. Writes and reads go on meanwhile.
 *
 * fsync policy, per batch (put_batch / put / del):
 *   KVS_FSYNC_ALWAYS  fdatasync before returning, and the directory when a
 *                     segment is created: an acknowledged write survives a
 *                     power loss.
 *   KVS_FSYNC_BATCH   fdatasync before returning (one per batch).
 *   KVS_FSYNC_NEVER   none: the page cache decides; a torn tail is cut at
 *                     the next start.
 * persist.direct_io = auto (default) writes with O_DIRECT from an aligned
 * buffer where the file system takes it (probed at open; else buffered, one
 * log line), on requires it (the open fails otherwise), off never uses it.
 * Reads are buffered positioned reads (payloads sit 64 bytes after their
 * header, so they are not aligned for O_DIRECT).
 *
 * get: one pread of the payload into the caller's buffer, then its CRC is
 * checked against the keydir before 0 is returned; a mismatch or short read
 * drops the key from the keydir (counted in corrupt) and returns
 * KVS_CORRUPT. A get whose len differs from layout->block_bytes is
 * -KVNODE_EINVAL; a stored payload of another size is KVS_CORRUPT.
 *
 * Capacity (capacity_bytes > 0) counts segment bytes on disk. A batch that
 * would pass it first drops whole closed segments, least recently written
 * first (Bitcask-style: no copying; their blocks become misses, counted in
 * evicted). Segments holding tombstones are passed over while an older
 * segment is left, unless nothing else makes room: only then can a delete
 * be undone by capacity (the key's older block comes back after a
 * restart; its bytes are still that key's). A segment whose blocks are all overwritten or deleted is removed
 * at once (one with tombstones only when it is the oldest left, so a
 * tombstone never goes before the record it hides: a tombstone is always in
 * a newer segment than the block it hides, a writer whose own segment is
 * older opening a new one for it). No
 * work is done on the loop thread. */
#ifndef KVNODE_KVS_FILE_H
#define KVNODE_KVS_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "persist/kvs/kvs.h"

#define KVS_FILE_SEGMENT_BYTES_DEFAULT (UINT64_C(256) << 20)
#define KVS_FILE_SEGMENT_BYTES_MIN     (UINT64_C(1) << 20)

struct kvs_file_stats {
    uint64_t blocks, bytes;       /* live blocks and their record bytes */
    uint64_t capacity_bytes;      /* 0: no limit */
    uint64_t disk_bytes;          /* segment bytes on disk */
    uint64_t segments;            /* segments on disk */
    uint64_t evicted, evicted_bytes;   /* blocks dropped with their segment by capacity */
    uint64_t segments_dropped;    /* by capacity */
    uint64_t segments_reclaimed;  /* removed because nothing in them was live */
    uint64_t corrupt;             /* bad copies found by get (dropped from the keydir) */
    uint64_t torn_tails, torn_bytes;   /* segment tails cut by recovery */
    uint64_t resync_records, resync_bytes;   /* bad record headers recovery skipped, and the
                                                bytes up to the next whole record */
    uint64_t hints_loaded;        /* segments recovered from their hint file */
    uint64_t hints_bad;           /* hint files missing or failing a check (segment read) */
    uint64_t direct_io;           /* 1 when segments are written with O_DIRECT */
};

/* The counters of s's root (shared by every handle on that root). */
void kvs_file_stats(struct kvs_store *s, struct kvs_file_stats *out);

/* Where (ns, key)'s record is: the segment file's path and the offset of the
 * record's header (the payload follows 64 bytes later). 0, KVS_MISS, or
 * -KVNODE_EINVAL (path too long). */
int kvs_file_locate(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, char *path,
                    size_t len, uint64_t *offset);
/* The hint file path of the segment holding (ns, key); same results. */
int kvs_file_locate_hint(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, char *path,
                         size_t len);

#endif
