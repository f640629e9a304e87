/* kvs/file: the embedded `file` backend (kvs_backend_file, see kvs.h) and
 * what it offers beyond the interface: counters and the path of a block
 * (tests, diagnostics).
 *
 * On disk, under the configured root:
 *
 *   <root>/.lock                                   flock()ed by the process using the root
 *   <root>/<deployment dir>/tp-<rank>/layout       the namespace's layout (written once)
 *   <root>/<deployment dir>/tp-<rank>/<bb>/<key>.blk   one block
 *
 * <deployment dir> is the namespace's deployment_id with every byte outside
 * [A-Za-z0-9._+=,@-] replaced by '_' and a leading '.' replaced by '_', so a
 * model name can never leave the root ("../x" -> "_._x"). <bb> is one of 256
 * buckets, two lowercase hex digits of a hash of the key; <key> is the key as
 * 16 lowercase hex digits of its two's-complement value. Temporary files are
 * named ".tmp-<instance>-<handle>-<seq>" next to their final name.
 *
 * Block file: a 64-byte header, then the payload (block_bytes bytes). All
 * integers little-endian:
 *
 *   0  "KVNB"  4  u16 format version (1)  6  u16 header size (64)
 *   8  u64 deployment fingerprint  16  i64 key  24  u64 payload size
 *   32 u32 tp_rank  36  u32 CRC-32C of the payload  40..59  zero
 *   60 u32 CRC-32C of bytes 0..59
 *
 * Layout file (468 bytes): "KVNL", u16 version (1), u16 size (468), u64
 * fingerprint, u64 block_bytes, u32 block_tokens, num_layers, kv_heads,
 * head_dim, tp_size, tp_rank, model[128], dtype[32], extra[256] (NUL-padded,
 * each must hold its terminator), u32 CRC-32C of everything before it. It
 * must pass ns_layout_validate(), hash to its fingerprint and name the rank
 * of its directory.
 *
 * CRC-32C (Castagnoli) was chosen over FNV-1a 64 for the checksums: it
 * detects every burst error up to 32 bits and runs at memory speed with the
 * SSE4.2 instruction (software slice-by-8 elsewhere), see crc32c.h.
 *
 * Writes go to a temporary file (O_CREAT|O_EXCL) in the block's directory,
 * are written in full, then rename()d over the final name, so a reader sees
 * the old or the new block, never a mix, and a crash leaves at most a
 * temporary file, which a scan removes (temporary files of this process's
 * own instance are left alone: they are in flight). fsync policy:
 *   KVS_FSYNC_ALWAYS  fsync the file before the rename and its directory
 *                     after it (and new directories' parents): a put that
 *                     returned 0 survives a power loss.
 *   KVS_FSYNC_BATCH   fsync the file before the rename only: after a power
 *                     loss a recent put may be missing (the rename was not
 *                     durable) but never torn.
 *   KVS_FSYNC_NEVER   no fsync: the page cache decides; a block torn by a
 *                     power loss fails its checksums and reads as KVS_CORRUPT.
 *
 * get validates everything (magic, version, header size, header checksum,
 * fingerprint, rank, key, payload size, file size, payload checksum); any
 * failure or short read removes the file and returns KVS_CORRUPT. A get
 * whose len differs from layout->block_bytes is a caller bug and returns
 * -KVNODE_EINVAL without touching the file; a stored payload size that
 * differs from block_bytes (the deployment changed its block size) is
 * KVS_CORRUPT.
 *
 * Capacity (capacity_bytes > 0) counts whole files (header + payload) that
 * this process knows of: those it stored or read, and those a scan found.
 * Blocks on disk that no scan has reached yet are not counted. A put that
 * would exceed it first removes least-recently-used blocks (get and put
 * refresh, a scan adds what it finds as least recent). Every handle opened
 * on the same root (by realpath) in this process shares one LRU and one set
 * of counters, guarded by a mutex held for O(1) bookkeeping only, never
 * across I/O; the capacity of the latest open applies. Another process
 * cannot open a root in use (the .lock file). */
#ifndef KVNODE_KVS_FILE_H
#define KVNODE_KVS_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "persist/kvs/kvs.h"

#define KVS_FILE_HEADER_SIZE 64u

struct kvs_file_stats {
    uint64_t blocks, bytes;       /* known to the LRU (header + payload) */
    uint64_t capacity_bytes;      /* 0: no limit */
    uint64_t evicted, evicted_bytes;
    uint64_t corrupt;             /* bad copies found by get (removed) */
    uint64_t scan_bad;            /* block files with a bad header found by scans (removed) */
    uint64_t scan_bad_layout;     /* namespace directories skipped: no valid layout file */
    uint64_t temps_removed;       /* stale temporary files removed by scans */
};

/* The counters of s's root (shared by every handle on that root). */
void kvs_file_stats(struct kvs_store *s, struct kvs_file_stats *out);
/* The path of (ns, key)'s block file; 0 or -KVNODE_EINVAL (too long). */
int kvs_file_block_path(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, char *buf,
                        size_t len);

#endif
