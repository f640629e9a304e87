/* Integration: persistence to the embedded file store ([persist] backend = file).
 *
 * Every test runs its own daemon on a small host tier (4 MiB of 1 MiB slabs
 * = 64 blocks of 64 KiB), so that eviction starts after a few puts, with the
 * store in a directory of its own (kvh_mkdtemp) that can outlive a daemon:
 * - write_through: every committed block is written; blocks evicted from
 *   memory stay matchable as store-only entries and GET (zero-copy, inline,
 *   copying) promotes them back byte-exact;
 * - write_back: nothing is written while the tier stays under the high
 *   watermark; past it, the victims are written, leave memory and come back
 *   byte-exact; a graceful stop writes the rest;
 * - a restarted daemon finds the blocks by its recovery scan;
 * - a block file corrupted on disk ends a GET's answer before it (never
 *   wrong bytes), is counted and removed (a bad header already by the
 *   scan); a file removed behind the daemon's back is a miss;
 * - a full disk (RLIMIT_FSIZE set on the running daemon) fails the writes,
 *   not the puts: the store is reported degraded (and stays so while writes
 *   fail, whatever the health probe finds), the daemon keeps serving, blocks
 *   that leave memory unwritten are counted as dropped, and once there is
 *   room the failed writes of blocks still in memory are retried and land;
 * - while writes fail the store's probe is a waiting block's write: the first
 *   probe after the disk has room lands and ends `degraded` at once (not the
 *   retry backoff's next turn), and the other blocks follow it;
 * - SIGKILL in the middle of writes leaves no torn block: everything the
 *   next daemon finds reads back byte-exact, stale temporary files go;
 * - DELETE removes the store's copies too (a restart does not bring them
 *   back);
 * - a store root that cannot be created stops the start with a message
 *   naming the path; so does a root of the file-per-block store of 0.1.0-pre,
 *   which is left as it is. */
#include <check.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define BB    65536
#define CHAIN 8
#define BLK_FILE_SIZE (64 + BB)   /* header + payload (daemon/persist/kvs/file.h) */
/* 64 blocks of 64 KiB; deferred GETs may wait long (a timeout is a failure here). */
#define TIER  "memory.host_bytes=4MiB\nmemory.slab_bytes=1MiB\nserver.request_timeout=30s\n"

/* Deadlines are for a loaded 2-core machine; valgrind runs (the daemon wrapped
 * by tests/valgrind-kvnoded.sh) get ten times as long. */
static int tmo(int ms)
{
    const char *v = getenv("KVNODED_REAL");
    return v && *v ? ms * 10 : ms;
}

/* ---- daemons on a store -------------------------------------------------------- */

static void new_store(char *dir, size_t len)
{
    ck_assert_msg(kvh_mkdtemp(dir, len) == 0, "%s", kvh_error());
}

/* The config of a daemon on `store` (fsync never: the page cache survives a
 * killed process, and the tests stay fast) plus `extra` lines. */
static char *store_config(const char *store, const char *extra)
{
    char *cfg = NULL;
    ck_assert_int_ge(asprintf(&cfg, TIER "persist.backend=file\npersist.path=%s\npersist.fsync=never\n%s",
                              store, extra ? extra : ""), 0);
    return cfg;
}

static void start_on(kvh_daemon *d, const char *store, const char *extra)
{
    char *cfg = store_config(store, extra);
    int rc = kvh_start(d, cfg);
    free(cfg);
    ck_assert_msg(rc == 0, "kvnoded did not start: %s", kvh_error());
}

static json_t *stats(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    return st;
}

static long long jint(json_t *st, const char *path)
{
    long long v = kvh_json_int(st, path);
    ck_assert_msg(v >= 0, "%s", kvh_error());
    return v;
}

static const char *jstr(json_t *st, const char *path)
{
    json_t *v = kvh_json_get(st, path);
    ck_assert_msg(json_is_string(v), "stats: no string at %s", path);
    return json_string_value(v);
}

/* Sum of persist.failures_total.<op>.<kind> over every op and kind. */
static long long failures(json_t *st)
{
    json_t *f = kvh_json_get(st, "persist.failures_total"), *kinds, *v;
    const char *op, *kind;
    long long sum = 0;
    ck_assert_msg(json_is_object(f), "stats: no persist.failures_total");
    json_object_foreach(f, op, kinds) {
        json_object_foreach(kinds, kind, v)
            sum += json_integer_value(v);
    }
    return sum;
}

/* Wait until every store request has completed and background eviction has
 * stopped (the queue is empty and the eviction counters did not move between
 * two snapshots 20 ms apart). */
static void settle(const kvh_daemon *d)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    long long prev = -1;
    for (;;) {
        json_t *st = stats(d);
        long long q = jint(st, "persist.queue_depth");
        long long ev = jint(st, "evictions.host.to_store_total") + jint(st, "evictions.host.dropped_total") +
                       jint(st, "evictions.host.writeback_total") + jint(st, "persist.written_blocks_total");
        json_decref(st);
        if (q == 0 && ev == prev)
            return;
        prev = q == 0 ? ev : -1;
        ck_assert_msg(kvh_now_ms() < deadline, "the store queue (%lld) or eviction did not settle", q);
        kvh_sleep_ms(20);
    }
}

/* Wait for the recovery scan to complete; returns the stats then. */
static json_t *wait_recovery(const kvh_daemon *d)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    for (;;) {
        json_t *st = stats(d);
        if (json_is_true(kvh_json_get(st, "persist.recovery.complete")))
            return st;
        /* The scan starts before the daemon answers anything. */
        ck_assert_msg(json_is_true(kvh_json_get(st, "persist.recovery.running")),
                      "the recovery scan stopped without completing: %s", jstr(st, "persist.last_error"));
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "recovery scan not complete within the deadline");
        kvh_sleep_ms(10);
    }
}

static void chain_keys(kvnode_key *keys, uint64_t chain)
{
    kvh_chain(keys, CHAIN, chain);
}

/* How a test reads: kvnode_get_begin in place, kvnode_get_inline, kvnode_get (copies). */
enum { ZC = 0, INLINE = 1, COPY = 2 };
static const char *const how_name[] = { "zero-copy", "inline", "copying" };

/* GET the whole chain and check every byte. */
static void get_chain(kvnode_client *c, uint64_t chain, uint64_t seed, int how)
{
    kvnode_key keys[CHAIN];
    size_t got = 0;
    chain_keys(keys, chain);
    int rc = how == ZC ? kvh_get_zc_verify(c, keys, CHAIN, seed, &got)
                       : kvh_get_verify(c, keys, CHAIN, seed, how == INLINE, &got);
    ck_assert_msg(rc == 0 && got == CHAIN, "%s GET of chain %" PRIu64 ": rc %d, got %zu of %d: %s",
                  how_name[how], chain, rc, got, CHAIN, kvh_error());
}

static void put_chain(kvnode_client *c, uint64_t chain, uint64_t seed)
{
    kvnode_key keys[CHAIN];
    chain_keys(keys, chain);
    int rc = kvh_put(c, keys, CHAIN, seed);
    ck_assert_msg(rc == 0, "put of chain %" PRIu64 ": %s", chain, kvh_error());
}

static long long capacity_blocks(const kvh_daemon *d)
{
    long long cap = KVH_STAT(d, "tiers.host.capacity_bytes") / BB;
    ck_assert_msg(cap >= 32 && cap <= 64, "host tier of %lld blocks for host_bytes=4MiB", cap);
    return cap;
}

/* ---- the store on disk ------------------------------------------------------------ */

/* What the segment log (daemon/persist/kvs/file.h) holds, read the way
 * recovery reads a segment without its hint: headers only (a bad one is
 * skipped to the next good one; what follows the last good record is a
 * torn tail), the newest record of a key deciding whether it is live. */
struct disk {
    size_t blk, tmp, other;       /* live blocks, *.tmp files, other files (.lock, hints) */
    size_t segs;                  /* seg-*.log files */
    size_t bad_size;              /* live block records whose payload is not a block */
    uint64_t tail;                /* bytes after the last good record, all segments */
    int64_t find_key;             /* in: key to look for */
    char found[PATH_MAX];         /* out: the segment of its newest record ("" when absent) */
    uint64_t found_off;           /* out: that record's offset (its payload is 64 bytes on) */
    char any[PATH_MAX];           /* out: some segment with a live block ("" when none) */
    uint64_t any_off;             /* out: that block record's offset */
};

struct drec {
    int64_t key;
    uint64_t seq, off, size;
    int type, seg;
};

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)le64(p) & 0xFFFFFFFFu; }

static int drec_cmp(const void *a, const void *b)
{
    const struct drec *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static struct disk scan_disk(const char *store, int64_t key)
{
    struct disk dk;
    static char names[256][PATH_MAX];
    size_t nrec = 0, caprec = 1024;
    struct drec *recs = malloc(caprec * sizeof *recs);
    memset(&dk, 0, sizeof dk);
    dk.find_key = key;
    DIR *d = opendir(store);
    ck_assert_msg(d != NULL, "opendir %s: %s", store, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        size_t l = strlen(n);
        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || strcmp(n, "tenants") == 0)
            continue;
        if (l > 4 && strcmp(n + l - 4, ".tmp") == 0) {
            dk.tmp++;
            continue;
        }
        if (!(strncmp(n, "seg-", 4) == 0 && l > 4 && strcmp(n + l - 4, ".log") == 0) || dk.segs == 256) {
            dk.other++;
            continue;
        }
        int si = (int)dk.segs++;
        snprintf(names[si], PATH_MAX, "%s/%s", store, n);
        size_t len = 0;
        uint8_t *b = (uint8_t *)kvh_read_file(names[si], &len);
        ck_assert_msg(b != NULL || len == 0, "%s", kvh_error());
        uint64_t pos = 0, end = 0;
        while (b && pos + 64 <= len) {
            const uint8_t *h = b + pos;
            uint64_t size = le64(h + 24), rl = 64 + ((size + 63) & ~(uint64_t)63);
            if (memcmp(h, "KVSR", 4) != 0 || le32(h + 60) != crc32c_bitwise(h, 60) || pos + rl > len) {
                pos += 64;         /* resynchronise on the next good header */
                continue;
            }
            int type = h[6];
            if (type == 1 || type == 2) {
                if (nrec == caprec) {
                    caprec *= 2;
                    recs = realloc(recs, caprec * sizeof *recs);
                    ck_assert_ptr_nonnull(recs);
                }
                recs[nrec++] = (struct drec){ .key = (int64_t)le64(h + 16), .seq = le64(h + 32), .off = pos,
                                              .size = size, .type = type, .seg = si };
            }
            pos += rl;
            end = pos;
        }
        pos = end;
        dk.tail += len - pos;
        free(b);
    }
    closedir(d);
    qsort(recs, nrec, sizeof *recs, drec_cmp);
    for (size_t i = 0; i < nrec; i++) {
        if (i + 1 < nrec && recs[i + 1].key == recs[i].key)
            continue;              /* an older record of the key */
        if (recs[i].key == key) {
            snprintf(dk.found, sizeof dk.found, "%s", names[recs[i].seg]);
            dk.found_off = recs[i].off;
        }
        if (recs[i].type != 1)
            continue;
        dk.blk++;
        if (recs[i].size != BB)
            dk.bad_size++;
        if (!dk.any[0]) {
            snprintf(dk.any, sizeof dk.any, "%s", names[recs[i].seg]);
            dk.any_off = recs[i].off;
        }
    }
    free(recs);
    return dk;
}

static void flip_byte(const char *path, off_t at)
{
    unsigned char byte;
    int fd = open(path, O_RDWR);
    ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
    ck_assert_int_eq(pread(fd, &byte, 1, at), 1);
    byte ^= 0x40;
    ck_assert_int_eq(pwrite(fd, &byte, 1, at), 1);
    close(fd);
}

/* ---- 1. write_through ---------------------------------------------------------------- */

START_TEST(write_through_round_trip_after_eviction)
{
    char store[PATH_MAX];
    kvh_daemon d;
    new_store(store, sizeof store);
    /* The default fsync (batch) here: each block is synced before its rename. */
    char *cfg = NULL;
    ck_assert_int_ge(asprintf(&cfg, TIER "persist.backend=file\npersist.path=%s\npersist.policy=write_through\n",
                              store), 0);
    KVH_START(&d, cfg);
    free(cfg);
    kvnode_layout l = kvh_layout("pf-wt", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    long long cap = capacity_blocks(&d);
    /* One and a half tiers of blocks, a chain per put (each put fits). */
    const uint64_t nchains = (uint64_t)(cap * 3 / 2) / CHAIN;
    const long long nblocks = (long long)nchains * CHAIN;

    for (uint64_t ch = 0; ch < nchains; ch++) {
        put_chain(c, ch, 11);
        settle(&d);
    }
    json_t *st = stats(&d);
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), nblocks);
    ck_assert_int_eq(jint(st, "persist.written_bytes_total"), nblocks * BB);
    ck_assert_int_le(jint(st, "tiers.host.blocks"), cap);
    long long ghosts = jint(st, "tiers.store.blocks");
    ck_assert_msg(ghosts >= nblocks - cap, "%lld blocks put into %lld slots but only %lld are store-only",
                  nblocks, cap, ghosts);
    ck_assert_int_eq(jint(st, "evictions.host.to_store_total"), ghosts);
    ck_assert_int_eq(jint(st, "evictions.host.dropped_total"), 0);
    json_t *ns = kvh_stats_namespace(st, "pf-wt", 0);
    ck_assert_msg(ns != NULL, "%s", kvh_error());
    ck_assert_int_eq(jint(ns, "stored_blocks"), ghosts);
    ck_assert_int_eq(jint(ns, "blocks") + ghosts, nblocks);
    ck_assert_str_eq(jstr(st, "persist.state"), "ok");
    ck_assert_str_eq(jstr(st, "persist.policy"), "write_through");
    ck_assert_int_eq(failures(st), 0);
    json_decref(st);
    struct disk dk = scan_disk(store, 0);
    ck_assert_int_eq((long long)dk.blk, nblocks);
    ck_assert_int_eq((long long)dk.bad_size, 0);
    ck_assert_int_eq((long long)dk.tmp, 0);

    /* The oldest chain is store-only; a fresh one is in memory. */
    kvnode_key keys[CHAIN];
    chain_keys(keys, 0);
    kvnode_tiers t = KVH_TIERS(c, keys, CHAIN);
    ck_assert_msg(t.matched == CHAIN && t.store == CHAIN && t.host == 0,
                  "oldest chain: matched %zu, host %zu, store %zu", t.matched, t.host, t.store);
    chain_keys(keys, nchains - 1);
    t = KVH_TIERS(c, keys, CHAIN);
    ck_assert_msg(t.matched == CHAIN && t.host == CHAIN, "newest chain: matched %zu, host %zu, store %zu",
                  t.matched, t.host, t.store);

    /* Every block reads back byte-exact, zero-copy, inline, then copied. At
     * most cap of the blocks are in memory when a pass starts: the rest must
     * be promoted during it. */
    for (int pass = ZC; pass <= COPY; pass++) {
        long long p0 = KVH_STAT(&d, "persist.promotions_ok_total");
        for (uint64_t ch = 0; ch < nchains; ch++)
            get_chain(c, ch, 11, pass);
        settle(&d);
        st = stats(&d);
        long long promoted = jint(st, "persist.promotions_ok_total") - p0;
        ck_assert_msg(promoted >= nblocks - cap, "%s pass: %lld promotions for %lld blocks in a %lld-block tier",
                      how_name[pass], promoted, nblocks, cap);
        ck_assert_int_eq(jint(st, "persist.promotions_failed_total"), 0);
        ck_assert_int_eq(jint(st, "persist.read_blocks_total"), jint(st, "persist.promotions_ok_total"));
        /* Promoted blocks are not written again. */
        ck_assert_int_eq(jint(st, "persist.written_blocks_total"), nblocks);
        ck_assert_int_eq(jint(st, "persist.wait_timeouts_total"), 0);
        ck_assert_int_eq(jint(st, "evictions.host.dropped_total"), 0);
        ck_assert_int_eq(failures(st), 0);
        json_decref(st);
    }

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 2. write_back --------------------------------------------------------------------- */

START_TEST(write_back_writes_victims_only)
{
    char store[PATH_MAX];
    kvh_daemon d;
    new_store(store, sizeof store);
    /* Watermarks low enough that a put never has to drop an unwritten block
     * to make room: the evictor alone (which writes) frees memory. */
    start_on(&d, store, "persist.policy=write_back\nmemory.high_watermark=0.5\nmemory.low_watermark=0.25\n");
    kvnode_layout l = kvh_layout("pf-wb", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    long long cap = capacity_blocks(&d);
    const uint64_t under = (uint64_t)(cap * 4 / 10) / CHAIN;   /* 40 %: under the high watermark */
    const uint64_t nchains = (uint64_t)cap / CHAIN;            /* a full tier's worth in all */
    ck_assert_uint_ge(under, 1);

    for (uint64_t ch = 0; ch < under; ch++)
        put_chain(c, ch, 22);
    settle(&d);
    kvh_sleep_ms(100);
    json_t *st = stats(&d);
    ck_assert_str_eq(jstr(st, "persist.policy"), "write_back");
    ck_assert_msg(jint(st, "persist.written_blocks_total") == 0 && jint(st, "evictions.host.writeback_total") == 0,
                  "write_back wrote %lld blocks (%lld write-backs) under the high watermark",
                  jint(st, "persist.written_blocks_total"), jint(st, "evictions.host.writeback_total"));
    ck_assert_int_eq(jint(st, "tiers.store.blocks"), 0);
    ck_assert_int_eq(jint(st, "tiers.host.blocks"), (long long)under * CHAIN);
    json_decref(st);
    ck_assert_int_eq((long long)scan_disk(store, 0).blk, 0);

    /* Past the high watermark, a chain at a time. */
    for (uint64_t ch = under; ch < nchains; ch++) {
        put_chain(c, ch, 22);
        settle(&d);
    }
    st = stats(&d);
    long long wb = jint(st, "evictions.host.writeback_total");
    long long written = jint(st, "persist.written_blocks_total");
    long long ghosts = jint(st, "tiers.store.blocks");
    ck_assert_msg(wb > 0 && written == wb, "past the watermark: %lld write-backs, %lld blocks written", wb, written);
    /* Each victim left memory once its write landed; none was dropped. */
    ck_assert_int_eq(jint(st, "evictions.host.to_store_total"), written);
    ck_assert_int_eq(ghosts, written);
    ck_assert_int_eq(jint(st, "evictions.host.dropped_total"), 0);
    ck_assert_int_eq(jint(st, "tiers.host.blocks") + ghosts, (long long)nchains * CHAIN);
    ck_assert_int_le(jint(st, "tiers.host.used_bytes"), (long long)(0.5 * (double)cap) * BB);
    ck_assert_int_eq(failures(st), 0);
    json_decref(st);
    struct disk dk = scan_disk(store, 0);
    ck_assert_int_eq((long long)dk.blk, written);
    ck_assert_int_eq((long long)dk.bad_size, 0);

    kvnode_key keys[CHAIN];
    chain_keys(keys, 0);
    kvnode_tiers t = KVH_TIERS(c, keys, CHAIN);
    ck_assert_msg(t.matched == CHAIN && t.store == CHAIN, "oldest chain: matched %zu, host %zu, store %zu",
                  t.matched, t.host, t.store);

    /* Everything comes back byte-exact, zero-copy then inline. */
    for (int pass = ZC; pass <= INLINE; pass++) {
        for (uint64_t ch = 0; ch < nchains; ch++) {
            get_chain(c, ch, 22, pass);
            settle(&d);
        }
    }
    st = stats(&d);
    ck_assert_int_gt(jint(st, "persist.promotions_ok_total"), 0);
    ck_assert_int_eq(jint(st, "persist.promotions_failed_total"), 0);
    ck_assert_int_eq(jint(st, "evictions.host.dropped_total"), 0);
    /* Only write-backs write, and a block read back from the store (it
     * still holds it) is not written again when evicted again. */
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), jint(st, "evictions.host.writeback_total"));
    ck_assert_int_le(jint(st, "persist.written_blocks_total"), (long long)nchains * CHAIN);
    ck_assert_int_eq(jint(st, "persist.wait_timeouts_total"), 0);
    ck_assert_int_eq(failures(st), 0);
    long long in_memory = jint(st, "tiers.host.blocks");
    ck_assert_int_gt(in_memory, 0);
    json_decref(st);
    kvnode_close(c);

    /* A graceful stop writes what is only in memory: the next daemon has
     * every block. */
    KVH_STOP_OK(&d);
    char *log = kvh_read_log(&d);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "shutdown: writing ") != NULL &&
                  strstr(log, "shutdown: every committed block is in the store") != NULL,
                  "no write_back flush at the stop:\n%s", log);
    free(log);
    kvh_daemon b;
    start_on(&b, store, "persist.policy=write_back\nmemory.high_watermark=0.5\nmemory.low_watermark=0.25\n");
    st = wait_recovery(&b);
    ck_assert_int_eq(jint(st, "persist.recovery.indexed"), (long long)nchains * CHAIN);
    json_decref(st);
    KVH_CONNECT(&b, &l, &c);
    for (uint64_t ch = 0; ch < nchains; ch++) {
        get_chain(c, ch, 22, COPY);
        settle(&b);
    }
    ck_assert_int_eq(KVH_STAT(&b, "persist.written_blocks_total"), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&b);
    kvh_destroy(&d);
}
END_TEST

/* ---- 3. restart -------------------------------------------------------------------------- */

START_TEST(restart_recovers_the_store)
{
    char store[PATH_MAX];
    kvh_daemon a, b;
    new_store(store, sizeof store);
    const uint64_t nchains = 5;
    const long long n = (long long)nchains * CHAIN;

    start_on(&a, store, NULL);
    kvnode_layout l = kvh_layout("pf-restart", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&a, &l, &c);
    for (uint64_t ch = 0; ch < nchains; ch++)
        put_chain(c, ch, 33);
    ck_assert_msg(kvh_wait_stat(&a, "persist.written_blocks_total", n, tmo(10000), NULL) == 0, "%s", kvh_error());
    kvnode_close(c);
    KVH_STOP_OK(&a);
    ck_assert_int_eq((long long)scan_disk(store, 0).blk, n);

    start_on(&b, store, NULL);
    json_t *st = wait_recovery(&b);
    ck_assert_int_eq(jint(st, "persist.recovery.found"), n);
    ck_assert_int_eq(jint(st, "persist.recovery.indexed"), n);
    ck_assert_int_eq(jint(st, "persist.recovery.skipped"), 0);
    ck_assert_int_eq(jint(st, "tiers.store.blocks"), n);
    ck_assert_int_eq(jint(st, "tiers.host.blocks"), 0);
    json_t *ns = kvh_stats_namespace(st, "pf-restart", 0);
    ck_assert_msg(ns != NULL, "the recovered namespace is missing: %s", kvh_error());
    ck_assert_int_eq(jint(ns, "stored_blocks"), n);
    json_decref(st);

    KVH_CONNECT(&b, &l, &c);
    kvnode_key keys[CHAIN];
    for (uint64_t ch = 0; ch < nchains; ch++) {
        chain_keys(keys, ch);
        kvnode_tiers t = KVH_TIERS(c, keys, CHAIN);
        ck_assert_msg(t.matched == CHAIN && t.store == CHAIN,
                      "chain %" PRIu64 " after restart: matched %zu, store %zu", ch, t.matched, t.store);
    }
    /* Another deployment does not see them. */
    kvnode_layout other = kvh_layout("pf-restart-other", BB, 1, 0);
    kvnode_client *o;
    KVH_CONNECT(&b, &other, &o);
    chain_keys(keys, 0);
    ck_assert_int_eq(kvh_match(o, keys, CHAIN), 0);
    kvnode_close(o);

    for (uint64_t ch = 0; ch < nchains; ch++)
        get_chain(c, ch, 33, (int)(ch % 3));
    st = stats(&b);
    ck_assert_int_eq(jint(st, "persist.promotions_ok_total"), n);
    ck_assert_int_eq(jint(st, "persist.read_blocks_total"), n);
    ck_assert_int_eq(jint(st, "tiers.store.blocks"), 0);
    ck_assert_int_eq(jint(st, "tiers.host.blocks"), n);
    /* Read back, not written again. */
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), 0);
    ck_assert_int_eq(failures(st), 0);
    json_decref(st);

    kvnode_close(c);
    KVH_STOP_DESTROY(&b);
    kvh_destroy(&a);
}
END_TEST

/* ---- 4. corruption ------------------------------------------------------------------------- */

/* Remove every segment's hint file and flip one byte of its first record
 * header (its layout record: a segment names its namespaces first); the
 * number of segments. */
static int damage_layout_headers(const char *store)
{
    DIR *d = opendir(store);
    struct dirent *de;
    int segs = 0;
    ck_assert_msg(d != NULL, "opendir %s: %s", store, strerror(errno));
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        char p[PATH_MAX + 256];
        if (strncmp(de->d_name, "seg-", 4) != 0 || l < 5)
            continue;
        snprintf(p, sizeof p, "%s/%s", store, de->d_name);
        if (strcmp(de->d_name + l - 5, ".hint") == 0) {
            ck_assert_msg(unlink(p) == 0, "unlink %s: %s", p, strerror(errno));
        } else if (strcmp(de->d_name + l - 4, ".log") == 0) {
            flip_byte(p, 20);
            segs++;
        }
    }
    closedir(d);
    return segs;
}

/* Issue 27 item 5: one flipped byte in a record header of a segment
 * without its hint file loses that record only. Every segment's layout
 * record header is flipped (its blocks kept their namespace before only
 * through it: the whole segment was lost), and one block's header too. */
START_TEST(bad_record_header_loses_only_that_record)
{
    char store[PATH_MAX];
    kvh_daemon a, b;
    new_store(store, sizeof store);
    const uint64_t nchains = 4;
    const long long n = (long long)nchains * CHAIN;

    start_on(&a, store, NULL);
    kvnode_layout l = kvh_layout("pf-resync", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&a, &l, &c);
    for (uint64_t ch = 0; ch < nchains; ch++)
        put_chain(c, ch, 55);
    ck_assert_msg(kvh_wait_stat(&a, "persist.written_blocks_total", n, tmo(10000), NULL) == 0, "%s", kvh_error());
    kvnode_close(c);
    KVH_STOP_OK(&a);

    kvnode_key keys[CHAIN];
    chain_keys(keys, 2);
    struct disk dk = scan_disk(store, keys[3]);
    ck_assert_msg(dk.found[0], "no record for chain 2's fourth block under %s", store);
    flip_byte(dk.found, (off_t)dk.found_off + 20);
    int segs = damage_layout_headers(store);
    ck_assert_int_ge(segs, 1);

    start_on(&b, store, NULL);
    json_t *st = wait_recovery(&b);
    ck_assert_int_eq(jint(st, "persist.recovery.indexed"), n - 1);
    ck_assert_int_eq(jint(st, "persist.file.resync_records_total"), segs + 1);
    ck_assert_int_eq(jint(st, "persist.file.torn_tails_total"), 0);
    json_decref(st);
    KVH_CONNECT(&b, &l, &c);
    size_t got = 0;
    for (uint64_t ch = 0; ch < nchains; ch++) {
        if (ch == 2)
            continue;
        get_chain(c, ch, 55, (int)(ch % 3));
    }
    /* chain 2: the prefix before the lost block, and the blocks after it, byte-exact */
    ck_assert_int_eq(kvh_match(c, keys, CHAIN), 3);
    int rc = kvh_get_zc_verify(c, keys, CHAIN, 55, &got);
    ck_assert_msg(rc == 0 && got == 3, "chain 2: rc %d, got %zu: %s", rc, got, kvh_error());
    rc = kvh_get_zc_verify(c, keys + 4, CHAIN - 4, 55, &got);
    ck_assert_msg(rc == 0 && got == CHAIN - 4, "after the lost block: rc %d, got %zu: %s", rc, got, kvh_error());
    st = stats(&b);
    ck_assert_int_eq(failures(st), 0);
    ck_assert_int_eq(jint(st, "persist.failures_total.read.corrupt"), 0);
    json_decref(st);
    kvnode_close(c);
    KVH_STOP_DESTROY(&b);
    kvh_destroy(&a);
}
END_TEST


START_TEST(corrupt_block_ends_the_answer)
{
    char store[PATH_MAX];
    kvh_daemon a, b;
    new_store(store, sizeof store);
    const size_t bad = 3;

    start_on(&a, store, NULL);
    kvnode_layout l = kvh_layout("pf-corrupt", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&a, &l, &c);
    for (uint64_t ch = 0; ch < 4; ch++)
        put_chain(c, ch, 44);
    ck_assert_msg(kvh_wait_stat(&a, "persist.written_blocks_total", 4 * CHAIN, tmo(10000), NULL) == 0, "%s",
                  kvh_error());
    kvnode_close(c);
    KVH_STOP_OK(&a);

    /* Flip one payload byte of chain 0's fourth block and of chain 2's
     * last, and one header byte (the key) of chain 1's sixth with the hint
     * file of its segment removed (so the scan reads that segment). */
    kvnode_key keys[CHAIN], keys1[CHAIN], keys2[CHAIN], keys3[CHAIN];
    chain_keys(keys, 0);
    chain_keys(keys1, 1);
    chain_keys(keys2, 2);
    chain_keys(keys3, 3);
    struct disk dk = scan_disk(store, keys[bad]);
    ck_assert_int_eq((long long)dk.blk, 4 * CHAIN);
    ck_assert_msg(dk.found[0], "no block file for key %016" PRIx64 " under %s", (uint64_t)keys[bad], store);
    flip_byte(dk.found, (off_t)(dk.found_off + 64 + 12345));
    struct disk dk1 = scan_disk(store, keys1[5]);
    ck_assert_msg(dk1.found[0], "no block file for key %016" PRIx64 " under %s", (uint64_t)keys1[5], store);
    flip_byte(dk1.found, (off_t)dk1.found_off + 20);
    {
        char hint[PATH_MAX];
        snprintf(hint, sizeof hint, "%.*s.hint", (int)(strlen(dk1.found) - 4), dk1.found);
        ck_assert_msg(unlink(hint) == 0, "unlink %s: %s", hint, strerror(errno));
    }
    struct disk dk2 = scan_disk(store, keys2[0]);
    ck_assert_msg(dk2.found[0], "no block file for key %016" PRIx64 " under %s", (uint64_t)keys2[0], store);
    flip_byte(dk2.found, (off_t)(dk2.found_off + 64 + BB - 1));

    start_on(&b, store, NULL);
    json_t *st = wait_recovery(&b);
    /* The scan of the segment without a hint skips the record with a bad
     * header; payload damage is found by the read. */
    ck_assert_int_eq(jint(st, "persist.recovery.indexed"), 4 * CHAIN - 1);
    json_decref(st);
    KVH_CONNECT(&b, &l, &c);
    ck_assert_int_eq(kvh_match(c, keys, CHAIN), CHAIN);
    ck_assert_int_eq(kvh_match(c, keys1, CHAIN), 5);

    /* The answer is the prefix before the bad block, byte-exact. */
    size_t got = 99;
    int rc = kvh_get_zc_verify(c, keys, CHAIN, 44, &got);
    ck_assert_msg(rc == 0 && got == bad, "GET over a corrupt block: rc %d, got %zu (want %zu): %s", rc, got, bad,
                  kvh_error());
    st = stats(&b);
    ck_assert_int_eq(jint(st, "persist.failures_total.read.corrupt"), 1);
    ck_assert_int_eq(failures(st), 1);
    ck_assert_int_eq(jint(st, "persist.promotions_failed_total"), 1);
    /* The blocks of the answer, and those after the bad one the GET also promoted. */
    ck_assert_int_eq(jint(st, "persist.promotions_ok_total"), CHAIN - 1);
    ck_assert_int_eq(jint(st, "persist.wait_timeouts_total"), 0);
    /* Corruption is the copy's problem, not the store's health. */
    ck_assert_str_eq(jstr(st, "persist.state"), "ok");
    json_decref(st);
    /* On disk the records stay (segments are never rewritten in place);
     * a payload flip does not make a record unreadable to a scan, the
     * header flip does. */
    ck_assert_int_eq((long long)scan_disk(store, 0).blk, 4 * CHAIN - 1);

    /* The bad block is gone from the index: the chain ends before it now. */
    ck_assert_int_eq(kvh_match(c, keys, CHAIN), (long)bad);
    rc = kvh_get_verify(c, keys, CHAIN, 44, 1, &got);
    ck_assert_msg(rc == 0 && got == bad, "inline GET: rc %d, got %zu: %s", rc, got, kvh_error());
    /* The blocks after the gap are intact. */
    rc = kvh_get_zc_verify(c, keys + bad + 1, CHAIN - bad - 1, 44, &got);
    ck_assert_msg(rc == 0 && got == CHAIN - bad - 1, "blocks after the bad one: rc %d, got %zu: %s", rc, got,
                  kvh_error());
    ck_assert_int_eq(KVH_STAT(&b, "persist.failures_total.read.corrupt"), 1);
    rc = kvh_get_zc_verify(c, keys1, CHAIN, 44, &got);
    ck_assert_msg(rc == 0 && got == 5, "chain with a bad header: rc %d, got %zu: %s", rc, got, kvh_error());

    /* A bad first block: an empty answer (and no lease). */
    rc = kvh_get_zc_verify(c, keys2, CHAIN, 44, &got);
    ck_assert_msg(rc == 0 && got == 0, "chain with a bad first block: rc %d, got %zu: %s", rc, got, kvh_error());
    ck_assert_int_eq(kvh_match(c, keys2, CHAIN), 0);
    ck_assert_int_eq(KVH_STAT(&b, "leases.read"), 0);
    /* An untouched chain: whole. */
    rc = kvh_get_verify(c, keys3, CHAIN, 44, 1, &got);
    ck_assert_msg(rc == 0 && got == CHAIN, "untouched chain: rc %d, got %zu: %s", rc, got, kvh_error());
    st = stats(&b);
    ck_assert_int_eq(jint(st, "persist.failures_total.read.corrupt"), 2);
    ck_assert_int_eq(failures(st), 2);
    ck_assert_int_eq(jint(st, "persist.read_misses_total"), 0);
    ck_assert_int_eq(jint(st, "persist.promotions_failed_total"), 2);
    ck_assert_str_eq(jstr(st, "persist.state"), "ok");
    json_decref(st);

    kvnode_close(c);
    KVH_STOP_DESTROY(&b);
    kvh_destroy(&a);
}
END_TEST

/* ---- 5. disk full --------------------------------------------------------------------------- */

START_TEST(full_disk_fails_writes_not_puts)
{
    char store[PATH_MAX];
    kvh_daemon d, d2;
    new_store(store, sizeof store);
    start_on(&d, store, NULL);
    /* Files of at most 32 KiB from now on: the layout record (468 bytes)
     * fits, a block file (64 KiB + 64) does not. (Set on the running daemon:
     * before exec the limit would also refuse the 4 MiB memfd of its host
     * arena.) kvnoded ignores SIGXFSZ: the write fails with EFBIG. */
    struct rlimit fsize, saved;
    ck_assert_msg(prlimit(d.pid, RLIMIT_FSIZE, NULL, &saved) == 0, "prlimit: %s", strerror(errno));
    fsize = saved;
    fsize.rlim_cur = 32 << 10;   /* the soft limit: raising it again needs no privilege */
    ck_assert_msg(prlimit(d.pid, RLIMIT_FSIZE, &fsize, NULL) == 0, "prlimit: %s", strerror(errno));
    kvnode_layout l = kvh_layout("pf-full", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    long long cap = capacity_blocks(&d);

    put_chain(c, 0, 55);
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    json_t *st;
    for (;;) {
        st = stats(&d);
        if (jint(st, "persist.failures_total.write.nospace") >= CHAIN)
            break;
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "no write failure within the deadline");
        kvh_sleep_ms(5);
    }
    ck_assert_str_eq(jstr(st, "persist.state"), "degraded");
    const char *why = jstr(st, "persist.last_error");
    ck_assert_msg(strstr(why, "File too large") != NULL, "last_error: %s", why);
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), 0);
    json_decref(st);
    /* The probe (every 0.5 s while degraded) is a waiting block's write, and
     * it fails: the state stays degraded, and the failed writes are tried
     * again (one per probe). */
    kvh_sleep_ms((unsigned)tmo(3000));
    st = stats(&d);
    ck_assert_str_eq(jstr(st, "persist.state"), "degraded");
    ck_assert_int_gt(jint(st, "persist.write_retries_total"), 0);
    ck_assert_int_gt(jint(st, "persist.failures_total.write.nospace"), CHAIN);
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), 0);
    json_decref(st);

    /* The puts succeeded in memory: served byte-exact. */
    get_chain(c, 0, 55, ZC);
    get_chain(c, 0, 55, INLINE);
    KVH_OK(c, kvnode_ping(c));

    /* More than the tier holds: a block whose write failed may leave memory
     * (the store cannot take it), and each one that does is counted as lost
     * to persistence. */
    const uint64_t nchains = (uint64_t)(cap * 3 / 2) / CHAIN;
    for (uint64_t ch = 1; ch < nchains; ch++) {
        put_chain(c, ch, 55);
        settle(&d);
    }
    st = stats(&d);
    long long dropped = jint(st, "evictions.host.dropped_total");
    ck_assert_int_gt(dropped, 0);
    ck_assert_int_eq(jint(st, "persist.dropped_total"), dropped);
    ck_assert_int_eq(jint(st, "evictions.host.to_store_total"), 0);
    ck_assert_int_eq(jint(st, "tiers.store.blocks"), 0);
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), 0);
    long long in_memory = jint(st, "tiers.host.blocks");
    ck_assert_int_eq(in_memory + dropped, (long long)nchains * CHAIN);
    json_decref(st);
    get_chain(c, nchains - 1, 55, ZC);
    KVH_OK(c, kvnode_ping(c));
    /* No block made it to disk (a cut record is no block) and no temporary
     * file was left behind. */
    struct disk dk = scan_disk(store, 0);
    ck_assert_int_eq((long long)dk.blk, 0);
    ck_assert_int_eq((long long)dk.tmp, 0);
    char *log = kvh_read_log(&d);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "degraded") != NULL, "the log does not say the store is degraded:\n%s", log);
    free(log);

    /* Room again: every block still in memory is written by the retries,
     * with no new put, and the store is ok again. */
    ck_assert_msg(prlimit(d.pid, RLIMIT_FSIZE, &saved, NULL) == 0, "prlimit: %s", strerror(errno));
    ck_assert_msg(kvh_wait_stat(&d, "persist.written_blocks_total", in_memory, tmo(30000), NULL) == 0, "%s",
                  kvh_error());
    settle(&d);
    st = stats(&d);
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), in_memory);
    ck_assert_str_eq(jstr(st, "persist.state"), "ok");
    ck_assert_str_eq(jstr(st, "persist.last_error"), "");
    ck_assert_int_eq(jint(st, "persist.retry_pending"), 0);
    json_decref(st);
    ck_assert_int_eq((long long)scan_disk(store, 0).blk, in_memory);
    kvnode_close(c);
    KVH_STOP_OK(&d);

    /* A restart finds them all, byte-exact. */
    start_on(&d2, store, NULL);
    st = wait_recovery(&d2);
    ck_assert_int_eq(jint(st, "persist.recovery.indexed"), in_memory);
    json_decref(st);
    KVH_CONNECT(&d2, &l, &c);
    get_chain(c, nchains - 1, 55, COPY);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d2);
    kvh_destroy(&d);
}
END_TEST

/* Wait until the stat at path is at least want. */
static void wait_stat_ge(const kvh_daemon *d, const char *path, long long want)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    long long v;
    while ((v = kvh_stat(d, path)) < want) {
        ck_assert_msg(kvh_now_ms() < deadline, "stat %s is %lld, expected at least %lld", path, v, want);
        kvh_sleep_ms(5);
    }
}

/* The disk has room again: the next probe's write lands and the store is ok
 * at once; the blocks waiting for a retry are written right after it. */
START_TEST(degraded_ends_at_the_first_write_probe)
{
    char store[PATH_MAX];
    kvh_daemon d;
    new_store(store, sizeof store);
    start_on(&d, store, NULL);
    struct rlimit small, saved;
    ck_assert_msg(prlimit(d.pid, RLIMIT_FSIZE, NULL, &saved) == 0, "prlimit: %s", strerror(errno));
    small = saved;
    small.rlim_cur = 32 << 10;
    ck_assert_msg(prlimit(d.pid, RLIMIT_FSIZE, &small, NULL) == 0, "prlimit: %s", strerror(errno));
    kvnode_layout l = kvh_layout("pf-probe", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    put_chain(c, 0, 57);
    /* Degraded, and the probes are writes that fail. */
    wait_stat_ge(&d, "persist.failures_total.write.nospace", CHAIN);
    wait_stat_ge(&d, "persist.probes_total.write.failed", 1);
    json_t *st = stats(&d);
    ck_assert_str_eq(jstr(st, "persist.state"), "degraded");
    ck_assert_int_eq(jint(st, "persist.probes_total.write.ok"), 0);
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), 0);
    json_decref(st);

    ck_assert_msg(prlimit(d.pid, RLIMIT_FSIZE, &saved, NULL) == 0, "prlimit: %s", strerror(errno));
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    for (;;) {
        st = stats(&d);
        if (jint(st, "persist.probes_total.write.ok") >= 1)
            break;
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "no write probe landed once the disk had room");
        kvh_sleep_ms(5);
    }
    /* The probe that landed ended degraded. */
    ck_assert_str_eq(jstr(st, "persist.state"), "ok");
    ck_assert_str_eq(jstr(st, "persist.last_error"), "");
    ck_assert_int_ge(jint(st, "persist.written_blocks_total"), 1);
    json_decref(st);
    /* The others followed it, with no further probe (the store was ok). */
    wait_stat_ge(&d, "persist.written_blocks_total", CHAIN);
    settle(&d);
    st = stats(&d);
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), CHAIN);
    ck_assert_int_eq(jint(st, "persist.probes_total.write.ok"), 1);
    ck_assert_int_eq(jint(st, "persist.probes_total.health.ok") + jint(st, "persist.probes_total.health.failed"), 0);
    ck_assert_int_eq(jint(st, "persist.retry_pending"), 0);
    ck_assert_str_eq(jstr(st, "persist.state"), "ok");
    json_decref(st);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 6. SIGKILL during writes ------------------------------------------------------------------- */

struct writer {
    const kvh_daemon *d;
    atomic_ullong chains;         /* chains attempted (the last may be partial) */
    atomic_bool stop;
    int last_rc;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    kvnode_layout l = kvh_layout("pf-kill", BB, 1, 0);
    kvnode_client *c;
    if (kvh_connect(w->d, &l, &c) != 0) {
        w->last_rc = -1;
        return NULL;
    }
    for (uint64_t ch = 0; ch < 100000 && !atomic_load(&w->stop);) {
        kvnode_key keys[CHAIN];
        chain_keys(keys, ch);
        atomic_store(&w->chains, ch + 1);
        int rc = kvh_put(c, keys, CHAIN, 66);
        if (rc == -KVNODE_ENOSPC) {   /* every slot waits for its write: retry */
            kvh_sleep_ms(1);
            continue;
        }
        if (rc != 0) {
            w->last_rc = rc;
            break;
        }
        ch++;
    }
    kvnode_close(c);
    return NULL;
}

START_TEST(sigkill_during_writes_leaves_no_torn_block)
{
    char store[PATH_MAX];
    kvh_daemon a, b;
    new_store(store, sizeof store);

    start_on(&a, store, NULL);
    struct writer w = { .d = &a };
    pthread_t tid;
    ck_assert_int_eq(pthread_create(&tid, NULL, writer_main, &w), 0);
    long long written = 0;
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(20000);
    while ((written = kvh_stat(&a, "persist.written_blocks_total")) < 200) {
        ck_assert_msg(written >= 0, "%s", kvh_error());
        ck_assert_msg(kvh_now_ms() < deadline, "only %lld blocks written", written);
        kvh_sleep_ms(2);
    }
    int st_kill = kvh_kill(&a, SIGKILL);
    atomic_store(&w.stop, true);
    pthread_join(tid, NULL);
    ck_assert_int_eq(st_kill, KVH_EXIT_SIGNAL_BASE + SIGKILL);
    uint64_t attempted = atomic_load(&w.chains);

    /* Every acknowledged block is on disk whole. */
    struct disk dk = scan_disk(store, 0);
    ck_assert_int_ge((long long)dk.blk, written);
    ck_assert_int_eq((long long)dk.bad_size, 0);
    fprintf(stderr, "sigkill: %" PRIu64 " chains attempted, %lld blocks written before the kill, %zu blocks "
            "in %zu segments on disk, %" PRIu64 " bytes of torn tails\n", attempted, written, dk.blk, dk.segs,
            dk.tail);
    /* Plus a torn tail for sure: the first half of a block record, as a
     * writer killed in the middle of its write would leave. */
    ck_assert_msg(dk.any[0], "no block record under %s", store);
    size_t blen = 0;
    char *seg = kvh_read_file(dk.any, &blen);
    ck_assert_msg(seg != NULL && blen >= dk.any_off + BLK_FILE_SIZE, "%s", kvh_error());
    FILE *f = fopen(dk.any, "ab");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(seg + dk.any_off, 1, BLK_FILE_SIZE / 2, f), BLK_FILE_SIZE / 2);
    ck_assert_int_eq(fclose(f), 0);
    free(seg);
    ck_assert_uint_ge(scan_disk(store, 0).tail, BLK_FILE_SIZE / 2);

    start_on(&b, store, NULL);
    json_t *st = wait_recovery(&b);
    long long found = jint(st, "persist.recovery.found");
    ck_assert_int_eq(found, (long long)dk.blk);
    ck_assert_int_eq(jint(st, "persist.recovery.indexed"), found);
    json_decref(st);
    /* The scan cut every torn tail. */
    struct disk after = scan_disk(store, 0);
    ck_assert_uint_eq(after.tail, 0);
    ck_assert_int_eq((long long)after.blk, (long long)dk.blk);

    /* Every block the new daemon knows is one that was put, and reads back
     * byte-exact; every chain's matched prefix does too. */
    kvnode_layout l = kvh_layout("pf-kill", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&b, &l, &c);
    long long known = 0;
    for (uint64_t ch = 0; ch < attempted; ch++) {
        kvnode_key keys[CHAIN];
        size_t got;
        chain_keys(keys, ch);
        long m = kvh_match(c, keys, CHAIN);
        ck_assert_msg(m >= 0, "%s", kvh_error());
        if (m > 0) {
            int rc = kvh_get_zc_verify(c, keys, (size_t)m, 66, &got);
            ck_assert_msg(rc == 0 && got == (size_t)m, "chain %" PRIu64 " (match %ld): rc %d got %zu: %s", ch, m,
                          rc, got, kvh_error());
        }
        for (size_t i = 0; i < CHAIN; i++) {
            if (kvh_match(c, &keys[i], 1) != 1)
                continue;
            known++;
            int rc = kvh_get_verify(c, &keys[i], 1, 66, 1, &got);
            ck_assert_msg(rc == 0 && got == 1, "chain %" PRIu64 " block %zu: rc %d got %zu: %s", ch, i, rc, got,
                          kvh_error());
        }
    }
    ck_assert_int_eq(known, found);
    st = stats(&b);
    ck_assert_int_eq(failures(st), 0);
    ck_assert_int_eq(jint(st, "persist.promotions_failed_total"), 0);
    ck_assert_int_eq(jint(st, "persist.wait_timeouts_total"), 0);
    json_decref(st);

    kvnode_close(c);
    KVH_STOP_DESTROY(&b);
    kvh_destroy(&a);
}
END_TEST

/* ---- 7. delete -------------------------------------------------------------------------------- */

START_TEST(delete_removes_the_stored_copy)
{
    char store[PATH_MAX];
    kvh_daemon a, b;
    new_store(store, sizeof store);

    start_on(&a, store, NULL);
    kvnode_layout l = kvh_layout("pf-del", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&a, &l, &c);
    long long cap = capacity_blocks(&a);
    const uint64_t nchains = (uint64_t)(cap * 5 / 4) / CHAIN;
    for (uint64_t ch = 0; ch < nchains; ch++) {
        put_chain(c, ch, 77);
        settle(&a);
    }
    ck_assert_int_eq(KVH_STAT(&a, "persist.written_blocks_total"), (long long)nchains * CHAIN);
    /* The oldest chain is store-only, the newest in memory: delete both. */
    kvnode_key k0[CHAIN], kn[CHAIN];
    chain_keys(k0, 0);
    chain_keys(kn, nchains - 1);
    ck_assert_int_eq(KVH_TIERS(c, k0, CHAIN).store, CHAIN);
    ck_assert_int_eq(KVH_TIERS(c, kn, CHAIN).host, CHAIN);
    size_t deleted = 0;
    KVH_OK(c, kvnode_delete(c, k0, CHAIN, &deleted));
    ck_assert_uint_eq(deleted, CHAIN);
    KVH_OK(c, kvnode_delete(c, kn, CHAIN, &deleted));
    ck_assert_uint_eq(deleted, CHAIN);
    ck_assert_msg(kvh_wait_stat(&a, "persist.deleted_keys_total", 2 * CHAIN, tmo(10000), NULL) == 0, "%s",
                  kvh_error());
    ck_assert_int_eq(kvh_match(c, k0, CHAIN), 0);
    ck_assert_int_eq(kvh_match(c, kn, CHAIN), 0);
    ck_assert_int_eq((long long)scan_disk(store, 0).blk, (long long)(nchains - 2) * CHAIN);
    kvnode_close(c);
    KVH_STOP_OK(&a);

    start_on(&b, store, NULL);
    json_t *st = wait_recovery(&b);
    ck_assert_int_eq(jint(st, "persist.recovery.indexed"), (long long)(nchains - 2) * CHAIN);
    json_decref(st);
    KVH_CONNECT(&b, &l, &c);
    ck_assert_int_eq(kvh_match(c, k0, CHAIN), 0);
    ck_assert_int_eq(kvh_match(c, kn, CHAIN), 0);
    size_t got = 99;
    ck_assert_int_eq(kvh_get_zc_verify(c, k0, CHAIN, 77, &got), 0);
    ck_assert_uint_eq(got, 0);
    /* The chains that were not deleted are still there. */
    get_chain(c, 1, 77, ZC);
    get_chain(c, nchains - 2, 77, INLINE);

    kvnode_close(c);
    KVH_STOP_DESTROY(&b);
    kvh_destroy(&a);
}
END_TEST

/* ---- 8. unusable root ------------------------------------------------------------------------- */

/* want: a text the log must also hold (NULL: none). */
static void expect_start_failure(const char *path, const char *what, const char *want)
{
    kvh_daemon d;
    char *cfg = store_config(path, NULL);
    int rc = kvh_spawn(&d, cfg);
    free(cfg);
    ck_assert_msg(rc == 0, "%s", kvh_error());
    int st = kvh_wait_exit(&d, tmo(10000));
    char *log = kvh_read_log(&d);
    ck_assert_ptr_nonnull(log);
    /* 1: a start that failed (99 would be valgrind's verdict on that path). */
    ck_assert_msg(st == 1, "kvnoded with persist.path %s (%s): status %d, expected exit status 1; log:\n%s", path,
                  what, st, log);
    ck_assert_msg(strstr(log, path) != NULL, "the log does not name %s:\n%s", path, log);
    ck_assert_msg(strstr(log, "persist") != NULL, "the log does not name [persist]:\n%s", log);
    ck_assert_msg(!want || strstr(log, want) != NULL, "the log does not say '%s':\n%s", want, log);
    free(log);
    kvh_destroy(&d);
}

START_TEST(unusable_store_root_fails_the_start)
{
    char dir[PATH_MAX], file[PATH_MAX + 16], below[PATH_MAX + 32];
    new_store(dir, sizeof dir);
    snprintf(file, sizeof file, "%s/plain", dir);
    snprintf(below, sizeof below, "%s/store", file);
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL, 0644);
    ck_assert_int_ge(fd, 0);
    close(fd);
    expect_start_failure(below, "under a regular file", NULL);
    expect_start_failure(file, "a regular file", NULL);
}
END_TEST

/* A root of the file-per-block store of kvnode 0.1.0-pre (<deployment
 * dir>/tp-<rank>/layout and <bb>/<key>.blk files) is not read, not migrated
 * and not touched: the start fails saying what it is (issue 29). */
START_TEST(file_per_block_root_fails_the_start)
{
    char dir[PATH_MAX], p[PATH_MAX + 64];
    new_store(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/demo-0123456789abcdef", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/demo-0123456789abcdef/tp-0", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/demo-0123456789abcdef/tp-0/2a", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/demo-0123456789abcdef/tp-0/2a/000000000000002a.blk", dir);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "KVNB", 4), 4);
    close(fd);
    expect_start_failure(dir, "a file-per-block root",
                         "this is a file-per-block store of kvnode 0.1.0-pre");
    /* nothing in it was touched: no lock, no segment, the block file as it was */
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(st.st_size, 4);
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    int entries = 0;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            ck_assert_msg(strcmp(de->d_name, "demo-0123456789abcdef") == 0, "%s was made in the root",
                          de->d_name);
            entries++;
        }
    closedir(d);
    ck_assert_int_eq(entries, 1);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        write_through_round_trip_after_eviction,
        write_back_writes_victims_only,
        restart_recovers_the_store,
        corrupt_block_ends_the_answer,
        bad_record_header_loses_only_that_record,
        full_disk_fails_writes_not_puts,
        degraded_ends_at_the_first_write_probe,
        sigkill_during_writes_leaves_no_torn_block,
        delete_removes_the_stored_copy,
        unusable_store_root_fails_the_start,
        file_per_block_root_fails_the_start,
    };
    return kvh_run_suite("daemon_persist_file", "persist_file", 30, tests, sizeof tests / sizeof tests[0]);
}
