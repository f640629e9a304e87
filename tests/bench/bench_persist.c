/* kvnode-bench-persist: figures for kvnoded's persistence (the file backend,
 * an append-only segment log, and v6d); not part of `make test`.
 *
 * Every daemon is a real kvnoded started through the harness ($KVNODED,
 * default build/kvnoded) with [persist] backend=file on a store directory
 * under a private temporary directory ($TMPDIR, default /tmp), removed at
 * the end.
 *
 * 0. The disk. Its own sequential write bandwidth in the same run: the
 *    write-run size in 8 MiB aligned writes (O_DIRECT where the file system
 *    takes it) to one new file, then fdatasync; GB/s (10^9 bytes per
 *    second). The write-behind rows below are given as a ratio to it.
 * 1. Recovery. For N blocks (default 100 000 and 1 000 000) of 1 KiB: a
 *    daemon with policy=write_through (fsync=never) takes N zero-copy puts
 *    in chains of 1000 keys and is stopped once persist.written_blocks_total
 *    == N (its segments close with hint files). A new daemon is then
 *    started on the same store and timed:
 *      - time-to-ready: spawn until an observer connection answers PING;
 *      - time-to-full-recovery: spawn until persist.recovery.complete;
 *      - the scan's own duration (persist.recovery.seconds) and its rate;
 *      - MATCH (kvnode_match_tiers) of the first 1000 keys right after
 *        ready (what the scan had indexed by then) and after the scan: all
 *        1000 must be matched, in the store tier only;
 *      - GET of the first 64 keys (promotions from the store), whose
 *        contents are verified.
 *    First with the page cache warm (nothing dropped), then cold, after
 *    `sync; echo 3 > /proc/sys/vm/drop_caches` when that is permitted
 *    (skipped, with the reason, when it is not).
 * 2. Write-behind throughput. For 64 KiB and 1 MiB blocks, persist.workers
 *    1, 2, 4 and persist.fsync never, batch, always: a fresh daemon and
 *    store with policy=write_through, a host tier holding every block and a
 *    queue holding every write; N blocks (about 1 GiB, less when the disk
 *    or memory is small) are put zero-copy (put_begin + memcpy + commit)
 *    and the wall time from the first put until
 *    persist.written_blocks_total reaches N is taken. Blocks/s, GB/s and
 *    the ratio to the disk's bandwidth (part 0) are printed, with the
 *    single-thread memcpy bandwidth of the same bytes and dropped_total.
 *    Afterwards the segments are read (live block records counted, a sample
 *    of payloads compared byte for byte).
 *    Then page-cache growth: 64 KiB blocks, fsync=batch, 2 workers, with
 *    persist.direct_io = on and off: /proc/meminfo Cached before the first
 *    put and at its highest while the run is written.
 *
 * 3. v6d write-behind and read throughput. The KVS protocol simulator
 *    ($KVS_SIM, default build/kvs-sim: tests/sim/kvs_sim.c, rtp-llm's KVS
 *    wire protocol, docs/PROTOCOLS.md §3) with an arena holding every block; for
 *    persist.workers 1 and 4, a fresh simulator and a daemon with
 *    [persist] backend=v6d, policy=write_through take N 64 KiB blocks
 *    (--v6d-bytes, default 256 MiB) zero-copy as in part 2, timed until
 *    persist.written_blocks_total == N (write-behind throughput). That
 *    daemon stops; a new one on the same simulator (empty index) GETs the N
 *    keys in chains of 256 (lookups in the store, then promotions: store
 *    reads) and verifies every byte (read throughput). The simulator's
 *    control calls are counted (GET /_sim/state) and printed per block:
 *    acquire(create), seal, release for the writes, acquire(read) and
 *    release for the reads. Skipped, with the reason, when the simulator is
 *    not built (V6D=0).
 *
 * 4. redis write-behind and read throughput against a real cluster: three
 *    redis-server masters on loopback (tests/common/redisctl.h; skipped with
 *    the reason when redis-server is missing). For 64 KiB and 1 MiB blocks
 *    (--redis-bytes per run, default 256 MiB), first the raw figures of the
 *    cluster with redis-benchmark --cluster (raw_bench: 12 connections, 4
 *    per master like kvnoded's 4 workers, -P 16, the run's number of keys
 *    spread over the masters with -r; SETs replacing values of keys that
 *    exist, GETs of keys that exist, and SETs of new keys after a FLUSHALL
 *    ASYNC), then, on the same servers flushed the same way, a daemon with
 *    [persist] backend=redis, policy=write_through, 4 workers, timed as in
 *    part 3 (write-behind until written == N, new keys; then a new daemon
 *    GETs every key: it knows none of them, so each GET reads its chain
 *    from the cluster at once, a nil reply ending the prefix, and promotes
 *    what it found; bytes verified after the timed part). The reads come
 *    from REDIS_READERS (4) threads with a connection each, every thread
 *    one chain GET in flight: an engine serving several requests has
 *    several GETs outstanding, and the raw baseline is not one request at
 *    a time either (12 connections x 16 pipelined). Four is the daemon's
 *    worker count and the baseline's connections per master; fewer chains
 *    in flight than the baseline's requests, since every chain is already
 *    pipelined by the daemon (up to 64 blocks per worker batch, 4 workers).
 *    Part 3 (v6d) keeps one reader. The ratios kvnode / raw are printed:
 *    write to the SETs over existing keys (the strict one) and to the SETs
 *    of new keys (the same job), read to the GETs. Then the CPU a GET
 *    costs (user + system seconds from /proc and getrusage): raw = the
 *    servers + redis-benchmark over its GETs, kvnode = the servers +
 *    kvnoded + the bench's readers over the timed reads; on a shared host
 *    the rates move with the load from elsewhere, the CPU per GET much
 *    less, and on a CPU-bound host its ratio bounds the rate ratio.
 *    Both directions are measured twice, each on a new daemon: "fresh", a
 *    just-started one, and "warm", one in the steady state of a daemon that
 *    has run a while. kvnoded reserves its host arena (fallocate) but, for
 *    start-up time (issue 16), does not fault it into its own page tables,
 *    so a fresh daemon's persist workers take a first-touch page fault on
 *    every page they copy a block into (reads) or out of (writes): measured,
 *    a third of their CPU while reading. A long-running daemon has touched
 *    its pages and its slab allocator hands freed slabs out again, so
 *    before a warm run the daemon's host tier is filled once with filler
 *    blocks through the engine API, written behind and deleted (warm_up,
 *    untimed). Operators run warm daemons; a fresh one is what a restart
 *    gives, so both are shown, each with its ratios to raw (the raw figures
 *    are taken once) and, for reads, its CPU per GET. Order per size: fresh
 *    write, fresh read, warm read, FLUSHALL ASYNC, warm write of the same
 *    keys (new to the cluster again; the fillers' DELs leave the servers'
 *    allocator as warm as the FLUSHALL before the fresh write). kvnoded's
 *    minor faults and the growth of its RssShmem over each timed part are
 *    printed beside them, and a warm run must use no more host slabs than
 *    its warm-up had (else it fails).
 *    Every timed daemon run, fresh or warm, starts once the host arena is
 *    populated (reserved) and the client's mapping prefaulted
 *    (kvnode_prefault), as in a long-running engine: the engine's
 *    first-touch page faults are a start-up cost, not throughput. Only the
 *    daemon's own mapping tells fresh from warm.
 *
 * Exits 1 when something fails or data is wrong (a MATCH short of its keys,
 * a block that does not read back, a write failure, a drop although the
 * queue holds every write); there are no performance thresholds.
 *
 * Usage: kvnode-bench-persist [--quick] [--blocks N] [--bytes MiB] [--v6d-bytes MiB]
 *                             [--redis-bytes MiB] [--only recovery|writes|v6d|redis]
 *   --quick      20 000 recovery blocks, 256 MiB per write run, 128 MiB per v6d run
 *   --blocks     recovery blocks (one run of N instead of 100 000 and 1 000 000)
 *   --bytes      data per write run in MiB (default 1024)
 *   --v6d-bytes  data per v6d run in MiB (default 256)
 *   --redis-bytes data per redis run in MiB (default 256; --quick: 128)
 *   --only       run one of the four parts (writes includes the disk's bandwidth) */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/un.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "../common/rmtree.h"
#include "harness.h"
#include "../common/kvh_http.h"
#include "../common/redisctl.h"

#define BENCH_NAME "kvnode-bench-persist"
#include "bench_util.h"

#define REC_BB        1024u      /* recovery blocks */
#define REC_CHAIN     1000u      /* keys per put while populating */
#define MATCH_KEYS    1000u
#define GET_KEYS      64u
#define SEED          0x5eedull
#define HEADER        64u        /* record header (daemon/persist/kvs/file.h) */
#define POLL_NS       5000000ull /* stats polling period */
#define WAIT_S        900        /* bound on any wait for the daemon */
#define RAW_CLIENTS   "12"       /* redis-benchmark connections (see raw_bench) */
#define RAW_PIPELINE  "16"       /* redis-benchmark requests in flight per connection */
#define RAW_NEW_KEYS  1000000000u /* redis-benchmark -r for SETs of new keys */
#define REDIS_READERS 4u         /* engine threads GETting at once in part 4 (see bench_redis) */

static char tmp_root[PATH_MAX];
static pid_t tmp_owner;

/* --- helpers ---------------------------------------------------------------- */


static void sleep_ns(uint64_t ns)
{
    struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static double secs(uint64_t ns) { return (double)ns / 1e9; }

/* CPU seconds (user + system, every thread) a running process has used;
 * 0 when it cannot be read. */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[len] = '\0';
    const char *p = strrchr(buf, ')');   /* the name may hold blanks */
    unsigned long long ut = 0, st = 0;
    long tck = sysconf(_SC_CLK_TCK);
    if (!p || tck <= 0 ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)tck;
}

/* CPU seconds of this process (who == RUSAGE_SELF) or its reaped children. */
static double rusage_cpu_s(int who)
{
    struct rusage ru;
    if (getrusage(who, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* Runs after the harness killed any daemon still running (registered first). */
static void tmp_cleanup(void)
{
    if (getpid() == tmp_owner && tmp_root[0]) {
        test_rmtree(tmp_root);
        tmp_root[0] = '\0';
    }
}

static void make_dir(char *out, size_t len, const char *name)
{
    int l = snprintf(out, len, "%s/%s", tmp_root, name);
    if (l < 0 || (size_t)l >= len)
        die("path", "too long");
    if (mkdir(out, 0700) != 0)
        die(out, strerror(errno));
}

static json_t *stats(kvnode_client *obs)
{
    json_t *s = kvh_stats_client(obs);
    if (!s)
        die("stats", kvh_error());
    return s;
}

static long long jint(json_t *root, const char *path)
{
    long long v = kvh_json_int(root, path);
    if (v < 0)
        die("stats", kvh_error());
    return v;
}

static double jreal(json_t *root, const char *path)
{
    json_t *v = kvh_json_get(root, path);
    if (!v || !json_is_number(v))
        die("stats: not a number", path);
    return json_number_value(v);
}

/* Sum of persist.failures_total.<op>.* */
static long long failures(json_t *root, const char *op)
{
    char path[128];
    snprintf(path, sizeof path, "persist.failures_total.%s", op);
    json_t *o = kvh_json_get(root, path), *v;
    const char *k;
    long long sum = 0;
    if (!o || !json_is_object(o))
        die("stats: missing", path);
    json_object_foreach(o, k, v)
        sum += json_integer_value(v);
    return sum;
}

static const char *direct_io = "auto";   /* persist.direct_io of the next daemons */

static const char *persist_cfg(char *buf, size_t len, const char *store, uint64_t host_bytes,
                               unsigned workers, size_t queue, const char *fsync_policy)
{
    int l = snprintf(buf, len,
                     "persist.direct_io=%s\n"
                     "memory.host_bytes=%lluMiB\n"
                     "log.level=warn\n"
                     "persist.backend=file\n"
                     "persist.path=%s\n"
                     "persist.policy=write_through\n"
                     "persist.workers=%u\n"
                     "persist.queue=%zu\n"
                     "persist.fsync=%s\n", direct_io,
                     (unsigned long long)((host_bytes + (1u << 20) - 1) >> 20), store, workers, queue,
                     fsync_policy);
    if (l < 0 || (size_t)l >= len)
        die("config", "too long");
    return buf;
}

static size_t queue_for(size_t n)
{
    size_t q = n + 64;
    return q < 4096 ? 4096 : q > 1048576 ? 1048576 : q;
}

/* Zero-copy put of keys[0..n): each slot gets fill(slot, i). A full host
 * tier (every block pinned by its write) is waited out; returns the number
 * of such stalls. */
typedef void (*fill_fn)(void *slot, size_t i, uint64_t bb, const void *arg);

static unsigned put_chain(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t bb,
                          kvnode_loc *locs, fill_fn fill, const void *arg, size_t first)
{
    kvnode_lease lease;
    unsigned stalls = 0;
    uint64_t deadline = kvh_now_ns() + (uint64_t)WAIT_S * 1000000000ull;
    int rc;
    while ((rc = kvnode_put_begin(c, keys, n, KVNODE_TIER_HOST, &lease, locs)) == -KVNODE_ENOSPC) {
        if (kvh_now_ns() > deadline)
            break;
        stalls++;
        sleep_ns(1000000);
    }
    check(c, rc, "put_begin");
    for (size_t i = 0; i < n; i++) {
        if (!locs[i].ptr)
            die("put_begin", "a key is already stored (keys must be new)");
        fill(locs[i].ptr, first + i, bb, arg);
    }
    check(c, kvnode_put_commit(c, lease), "put_commit");
    return stalls;
}

struct wstate {
    long long written, written_bytes, dropped, failed, queue_depth;
};

static void write_state(kvnode_client *obs, struct wstate *w)
{
    json_t *s = stats(obs);
    w->written = jint(s, "persist.written_blocks_total");
    w->written_bytes = jint(s, "persist.written_bytes_total");
    w->dropped = jint(s, "persist.dropped_total");
    w->queue_depth = jint(s, "persist.queue_depth");
    w->failed = failures(s, "write");
    json_decref(s);
}

/* Poll until every one of n writes is accounted for (written, dropped or
 * failed); returns the time it was observed. */
static uint64_t wait_written(kvnode_client *obs, long long n, struct wstate *w)
{
    uint64_t deadline = kvh_now_ns() + (uint64_t)WAIT_S * 1000000000ull;
    for (;;) {
        write_state(obs, w);
        uint64_t now = kvh_now_ns();
        if (w->written + w->dropped + w->failed >= n)
            return now;
        if (now > deadline) {
            char m[256];
            snprintf(m, sizeof m, "%lld of %lld written after %d s (queue depth %lld)", w->written, n,
                     WAIT_S, w->queue_depth);
            die("write-behind", m);
        }
        sleep_ns(POLL_NS);
    }
}

/* Wait until the host arena is populated (kvnoded populates it in the
 * background after start): a one-time start-up cost that would otherwise
 * take CPU from the first timed seconds. */
static void wait_populated(kvnode_client *obs)
{
    uint64_t deadline = kvh_now_ns() + (uint64_t)WAIT_S * 1000000000ull;
    for (;;) {
        json_t *s = stats(obs);
        const char *st = json_string_value(kvh_json_get(s, "tiers.host.populate_state"));
        bool running = st && strcmp(st, "running") == 0;
        json_decref(s);
        if (!running)
            return;
        if (kvh_now_ns() > deadline)
            die("populate", "the host arena is still being populated");
        sleep_ns(POLL_NS);
    }
}

/* A long-running engine's view of the arena: populated by the daemon and
 * mapped by the client (page tables filled, kvnode_prefault), so that the
 * timed runs take no first-touch page faults. */
static void wait_ready(kvnode_client *c)
{
    wait_populated(c);
    check(c, kvnode_prefault(c, KVNODE_PREFAULT_WAIT), "prefault");
}

static void stop_daemon(kvh_daemon *d)
{
    int st = kvh_stop(d, 60000);
    if (st != 0) {
        char m[64];
        snprintf(m, sizeof m, "status %d (log above)", st);
        die("kvnoded did not stop gracefully", m);
    }
    kvh_destroy(d);
}

/* --- the segment log on disk ------------------------------------------------------- */

struct scan_ctx {
    uint64_t files, bytes, disk_bytes, bad;
    uint64_t blocks;              /* live block records (the newest record of each key) */
    uint64_t expect_size;         /* payload bytes of every block */
    /* payload sample */
    const kvnode_key *keys;
    size_t nkeys;
    const unsigned char *src;   /* key i's payload: src + (i % chain) * bb */
    size_t chain;
    uint64_t bb;
    unsigned sampled, sample_max, sample_bad;
};

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

struct srec { kvnode_key key; uint64_t seq; int type; };

static int srec_cmp(const void *a, const void *b)
{
    const struct srec *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Read every segment's record headers (file.h); count live blocks, check
 * payload sizes, compare a sample of payloads with what was put. */
static void scan_store(const char *store, struct scan_ctx *s)
{
    DIR *d = opendir(store);
    struct dirent *de;
    size_t nrec = 0, cap = 1u << 16;
    struct srec *recs = malloc(cap * sizeof *recs);
    unsigned char *buf = malloc(1u << 20), *pay = malloc(s->bb ? s->bb : 1);
    if (!d || !recs || !buf || !pay)
        die("scan the store", strerror(errno));
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        char path[PATH_MAX + 300];
        struct stat sb;
        if (strncmp(de->d_name, "seg-", 4) != 0 || l < 8 || strcmp(de->d_name + l - 4, ".log") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", store, de->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &sb) < 0)
            die("open a segment", strerror(errno));
        s->files++;
        s->bytes += (uint64_t)sb.st_size;
        s->disk_bytes += (uint64_t)sb.st_blocks * 512u;
        uint64_t pos = 0;
        unsigned char h[HEADER];
        while (pos + HEADER <= (uint64_t)sb.st_size && pread(fd, h, HEADER, (off_t)pos) == HEADER) {
            if (memcmp(h, "KVSR", 4) != 0)
                break;
            uint64_t size = le64(h + 24), rl = HEADER + ((size + 63) & ~(uint64_t)63);
            int type = h[6];
            if (type == 1 || type == 2) {
                if (nrec == cap) {
                    cap *= 2;
                    if (!(recs = realloc(recs, cap * sizeof *recs)))
                        die("scan the store", "out of memory");
                }
                recs[nrec++] = (struct srec){ (kvnode_key)le64(h + 16), le64(h + 32), type };
                if (type == 1 && size != s->expect_size)
                    s->bad++;
                if (type == 1 && s->keys && s->sampled < s->sample_max && size == s->bb &&
                    (nrec % 97) == 1) {
                    kvnode_key key = (kvnode_key)le64(h + 16);
                    size_t i;
                    for (i = 0; i < s->nkeys && s->keys[i] != key; i++) {}
                    if (i == s->nkeys || pread(fd, pay, s->bb, (off_t)(pos + HEADER)) != (ssize_t)s->bb ||
                        memcmp(pay, s->src + (i % s->chain) * s->bb, s->bb) != 0)
                        s->sample_bad++;
                    s->sampled++;
                }
            }
            pos += rl;
        }
        close(fd);
    }
    closedir(d);
    qsort(recs, nrec, sizeof *recs, srec_cmp);
    for (size_t i = 0; i < nrec; i++)
        if ((i + 1 == nrec || recs[i + 1].key != recs[i].key) && recs[i].type == 1)
            s->blocks++;
    free(recs);
    free(buf);
    free(pay);
}

/* --- 1. recovery ---------------------------------------------------------------- */

static void fill_keyed(void *slot, size_t i, uint64_t bb, const void *arg)
{
    const kvnode_key *keys = arg;
    kvh_fill(slot, bb, keys[i], SEED);
}

static void populate(const char *store, const kvnode_key *keys, size_t n)
{
    char cfg[PATH_MAX + 512];
    /* Every block in memory (the watermarks leave 5 % free) plus slack. */
    uint64_t host = (uint64_t)n * REC_BB / 90 * 100 + (64ull << 20);
    kvh_daemon d;
    kvnode_client *c, *obs;
    kvnode_loc *locs = malloc(REC_CHAIN * sizeof *locs);
    kvnode_layout l = kvh_layout("bench-recovery", REC_BB, 1, 0);
    unsigned stalls = 0;
    struct wstate w;

    if (!locs)
        die("malloc", "out of memory");
    if (kvh_start(&d, persist_cfg(cfg, sizeof cfg, store, host, 2, queue_for(n), "never")) != 0)
        die("start kvnoded", kvh_error());
    if (kvh_connect(&d, &l, &c) != 0 || kvh_connect(&d, NULL, &obs) != 0)
        die("connect", kvh_error());
    uint64_t t0 = kvh_now_ns();
    for (size_t i = 0; i < n; i += REC_CHAIN) {
        size_t m = n - i < REC_CHAIN ? n - i : REC_CHAIN;
        stalls += put_chain(c, keys + i, m, REC_BB, locs, fill_keyed, keys + i, 0);
    }
    uint64_t t_put = kvh_now_ns();
    uint64_t t_end = wait_written(obs, (long long)n, &w);
    if (w.written != (long long)n || w.dropped || w.failed) {
        char m[256];
        snprintf(m, sizeof m, "%lld written, %lld dropped, %lld failed of %zu", w.written, w.dropped,
                 w.failed, n);
        die("populate", m);
    }
    printf("populate: %zu blocks of 1 KiB put (zero-copy, chains of %u) in %.2f s, all written in "
           "%.2f s = %.0f blocks/s (write_through, fsync=never, 2 workers%s)\n",
           n, REC_CHAIN, secs(t_put - t0), secs(t_end - t0), (double)n / secs(t_end - t0),
           stalls ? ", host tier stalls" : "");
    kvnode_close(c);
    kvnode_close(obs);
    stop_daemon(&d);
    free(locs);

    struct scan_ctx s = { .expect_size = REC_BB };
    scan_store(store, &s);
    if (s.blocks != n || s.bad) {
        char m[128];
        snprintf(m, sizeof m, "%llu blocks (%llu bad) instead of %zu", (unsigned long long)s.blocks,
                 (unsigned long long)s.bad, n);
        die("store after populate", m);
    }
    printf("store: %llu blocks in %llu segments, %.1f MiB (%.1f MiB allocated on disk)\n",
           (unsigned long long)s.blocks, (unsigned long long)s.files, (double)s.bytes / 1048576.0,
           (double)s.disk_bytes / 1048576.0);
}

struct rec_result {
    double ready_ms, complete_ms, scan_s;
    long long found, indexed, skipped;
    kvnode_tiers at_ready, after;
    double get_ms;
};

#define REC_HOST (64ull << 20)   /* host tier of the recovery daemons: the arena's
                                  * setup (fallocate + populate) is part of ready */

/* Spawn a daemon and poll (every 200 us) until an observer connection
 * answers PING; returns the spawn time, *obs is the connection. */
static uint64_t spawn_ready(kvh_daemon *d, const char *cfg, kvnode_client **obs, uint64_t *t_ready)
{
    uint64_t t0 = kvh_now_ns(), deadline = t0 + 60ull * 1000000000ull;
    *obs = NULL;
    if (kvh_spawn(d, cfg) != 0)
        die("spawn kvnoded", kvh_error());
    for (;;) {
        if (kvnode_connect(d->sock, NULL, obs) == 0) {
            if (kvnode_ping(*obs) == 0)
                break;
            kvnode_close(*obs);
            *obs = NULL;
        }
        if (kvh_wait_exit(d, 0) != KVH_EXIT_TIMEOUT) {
            kvh_print_log(d, "kvnoded exited before it was ready");
            die("recovery", "kvnoded exited before it was ready");
        }
        if (kvh_now_ns() > deadline)
            die("recovery", "kvnoded not ready after 60 s");
        sleep_ns(200000);
    }
    *t_ready = kvh_now_ns();
    return t0;
}

/* Time-to-ready of a daemon without a store (the baseline). */
static double ready_no_store(void)
{
    char cfg[256];
    kvh_daemon d;
    kvnode_client *obs;
    uint64_t t_ready;
    snprintf(cfg, sizeof cfg, "memory.host_bytes=%lluMiB\nlog.level=warn\n", REC_HOST >> 20);
    uint64_t t0 = spawn_ready(&d, cfg, &obs, &t_ready);
    kvnode_close(obs);
    stop_daemon(&d);
    return (double)(t_ready - t0) / 1e6;
}

static void recover(const char *store, const kvnode_key *keys, size_t n, struct rec_result *r)
{
    char cfg[PATH_MAX + 512];
    kvh_daemon d;
    kvnode_client *obs, *c;
    kvnode_layout l = kvh_layout("bench-recovery", REC_BB, 1, 0);
    size_t nm = n < MATCH_KEYS ? n : MATCH_KEYS, ng = n < GET_KEYS ? n : GET_KEYS;
    uint64_t t_ready;

    persist_cfg(cfg, sizeof cfg, store, REC_HOST, 2, 4096, "never");
    uint64_t t0 = spawn_ready(&d, cfg, &obs, &t_ready);
    if (kvh_connect(&d, &l, &c) != 0)
        die("connect", kvh_error());
    check(c, kvnode_match_tiers(c, keys, nm, &r->at_ready), "match at ready");

    json_t *s;
    uint64_t t_done;
    for (;;) {
        s = stats(obs);
        json_t *done = kvh_json_get(s, "persist.recovery.complete");
        t_done = kvh_now_ns();
        if (done && json_is_true(done))
            break;
        json_t *running = kvh_json_get(s, "persist.recovery.running");
        if (t_done > t0 + (uint64_t)WAIT_S * 1000000000ull)
            die("recovery", "the scan did not complete");
        if (running && !json_is_true(running) && t_done > t_ready + 5000000000ull) {
            kvh_print_log(&d, "scan not running and not complete");
            die("recovery", "the scan stopped before it completed");
        }
        json_decref(s);
        sleep_ns(POLL_NS);
    }
    r->ready_ms = (double)(t_ready - t0) / 1e6;
    r->complete_ms = (double)(t_done - t0) / 1e6;
    r->found = jint(s, "persist.recovery.found");
    r->indexed = jint(s, "persist.recovery.indexed");
    r->skipped = jint(s, "persist.recovery.skipped");
    r->scan_s = jreal(s, "persist.recovery.seconds");
    json_decref(s);
    if (r->found != (long long)n || r->indexed != (long long)n) {
        char m[160];
        snprintf(m, sizeof m, "found %lld, indexed %lld, skipped %lld of %zu blocks", r->found, r->indexed,
                 r->skipped, n);
        die("recovery", m);
    }

    check(c, kvnode_match_tiers(c, keys, nm, &r->after), "match after recovery");
    if (r->after.matched != nm || r->after.store != nm) {
        char m[160];
        snprintf(m, sizeof m, "MATCH of %zu recovered keys: matched %zu (store %zu, host %zu, hbm %zu)", nm,
                 r->after.matched, r->after.store, r->after.host, r->after.hbm);
        die("recovery", m);
    }
    size_t got = 0;
    uint64_t tg = kvh_now_ns();
    int rc = kvh_get_verify(c, keys, ng, SEED, 0, &got);
    r->get_ms = (double)(kvh_now_ns() - tg) / 1e6;
    if (rc != 0 || got != ng) {
        char m[512];
        snprintf(m, sizeof m, "GET of %zu recovered blocks: rc %d, got %zu: %s", ng, rc, got, kvh_error());
        die("recovery", m);
    }
    kvnode_close(c);
    kvnode_close(obs);
    stop_daemon(&d);
}

/* sync + drop the page cache; 0, or -1 with why filled. */
static int drop_caches(char *why, size_t len)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, len, "cannot open /proc/sys/vm/drop_caches: %s", strerror(errno));
        return -1;
    }
    if (write(fd, "3\n", 2) != 2) {
        snprintf(why, len, "cannot write /proc/sys/vm/drop_caches: %s", strerror(errno));
        close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

static void print_rec(const char *cache, const struct rec_result *r, size_t n)
{
    printf("%-5s %10.1f %13.1f %10.3f %12.0f %7zu/%-6zu %7zu/%-6zu %9.1f\n", cache, r->ready_ms,
           r->complete_ms, r->scan_s, r->scan_s > 0 ? (double)n / r->scan_s : 0.0, r->at_ready.matched,
           r->at_ready.store, r->after.matched, r->after.store, r->get_ms);
}

static void bench_recovery(size_t n)
{
    char store[PATH_MAX];
    kvnode_key *keys = malloc(n * sizeof *keys);
    if (!keys)
        die("malloc", "out of memory");
    kvh_chain(keys, n, 0x7ec0);
    make_dir(store, sizeof store, "store-recovery");

    printf("== 1. recovery: %zu blocks of 1 KiB on disk (file backend, segment log)\n", n);
    populate(store, keys, n);

    struct rec_result warm, cold;
    char why[256];
    double base_ms = ready_no_store();
    sync();   /* write back (not drop) what populating left dirty */
    recover(store, keys, n, &warm);
    int have_cold = drop_caches(why, sizeof why) == 0;
    if (have_cold)
        recover(store, keys, n, &cold);

    printf("\n%-5s %10s %13s %10s %12s %14s %14s %9s\n", "cache", "ready ms", "recovered ms", "scan s",
           "scan blk/s", "MATCH@ready", "MATCH@done", "GET64 ms");
    printf("%-5s %10.1f %13s   (a daemon without a store, same host tier: the baseline)\n", "-", base_ms, "-");
    print_rec("warm", &warm, n);
    if (have_cold)
        print_rec("cold", &cold, n);
    else
        printf("cold  skipped: %s\n", why);
    printf("  ready = spawn until PING answers (host tier %llu MiB); recovered = spawn until\n"
           "  persist.recovery.complete; scan s = persist.recovery.seconds (the daemon's scan alone);\n"
           "  MATCH = matched/store-tier of the first %u keys (kvnode_match_tiers) right after ready and\n"
           "  after the scan; GET64 = get + verify of %u store-only blocks (promotions).\n"
           "  warm: page cache kept from populating (synced, nothing dropped)%s.\n\n",
           REC_HOST >> 20, MATCH_KEYS, GET_KEYS,
           have_cold ? "; cold: after sync; echo 3 > /proc/sys/vm/drop_caches" : "");
    test_rmtree(store);
    free(keys);
}

/* --- 2. write-behind ------------------------------------------------------------- */

struct wsrc { const unsigned char *src; size_t chain; };

static void fill_copy(void *slot, size_t i, uint64_t bb, const void *arg)
{
    const struct wsrc *w = arg;
    memcpy(slot, w->src + (i % w->chain) * bb, bb);
}

struct wrow {
    const char *label, *fsync_policy;
    unsigned workers;
    size_t n;
    uint64_t bb;
    uint64_t put_ns, ns;
    long long dropped;
    unsigned stalls;
    uint64_t cached_peak, cached_growth;   /* /proc/meminfo Cached: highest, growth over the run */
};

/* /proc/meminfo Cached in bytes (0 when unreadable). */
static uint64_t meminfo_cached(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Cached: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024u;
}

static double disk_gbs;   /* part 0 */

/* The disk's sequential write bandwidth: total bytes in 8 MiB aligned
 * writes (O_DIRECT where taken) to a new file under dir, then fdatasync. */
static double disk_seq_gbs(const char *dir, uint64_t total, bool *direct)
{
    char path[PATH_MAX + 32];
    const size_t chunk = 8u << 20;
    void *b = NULL;
    snprintf(path, sizeof path, "%s/disk-seq", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    *direct = fd >= 0;
    if (fd < 0)
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || posix_memalign(&b, 4096, chunk) != 0)
        die("disk bandwidth", strerror(errno));
    for (size_t i = 0; i < chunk; i++)
        ((unsigned char *)b)[i] = (unsigned char)(i * 131u);
    uint64_t t0 = kvh_now_ns();
    for (uint64_t at = 0; at < total; at += chunk)
        if (pwrite(fd, b, chunk, (off_t)at) != (ssize_t)chunk)
            die("disk bandwidth: write", strerror(errno));
    if (fdatasync(fd) != 0)
        die("disk bandwidth: fdatasync", strerror(errno));
    uint64_t ns = kvh_now_ns() - t0;
    close(fd);
    unlink(path);
    free(b);
    return (double)total / 1e9 / secs(ns);
}

static void print_wrow(const struct wrow *r, double memcpy_gbs)
{
    double s = secs(r->ns), gbs = (double)r->n * (double)r->bb / 1e9 / s;
    printf("%-6s %-6s %7u %7zu %8.2f %8.3f %9.3f %10.0f %8.2f %8.2fx %8.2f %8lld%s\n", r->label,
           r->fsync_policy, r->workers, r->n, (double)r->n * (double)r->bb / (double)(1ull << 30),
           secs(r->put_ns), s, (double)r->n / s, gbs, disk_gbs > 0 ? gbs / disk_gbs : 0.0, memcpy_gbs,
           r->dropped, r->stalls ? "  (host tier stalls)" : "");
}

static int write_run(struct wrow *r, const unsigned char *src, size_t chain, unsigned run)
{
    char store[PATH_MAX], name[64], cfg[PATH_MAX + 512];
    uint64_t bb = r->bb;
    size_t n = r->n;
    kvnode_key *keys = malloc(n * sizeof *keys);
    kvnode_loc *locs = malloc(chain * sizeof *locs);
    struct wsrc ws = { src, chain };
    kvh_daemon d;
    kvnode_client *c, *obs;
    char model[64];
    struct wstate w;
    int bad = 0;

    if (!keys || !locs)
        die("malloc", "out of memory");
    kvh_chain(keys, n, 0xb000 + run);
    snprintf(name, sizeof name, "store-%s-%s-w%u", r->label, r->fsync_policy, r->workers);
    make_dir(store, sizeof store, name);
    snprintf(model, sizeof model, "bench-wb-%s", r->label);
    kvnode_layout l = kvh_layout(model, bb, 1, 0);
    uint64_t host = (uint64_t)n * bb / 90 * 100 + (64ull << 20);
    if (kvh_start(&d, persist_cfg(cfg, sizeof cfg, store, host, r->workers, queue_for(n), r->fsync_policy)) != 0)
        die("start kvnoded", kvh_error());
    if (kvh_connect(&d, &l, &c) != 0 || kvh_connect(&d, NULL, &obs) != 0)
        die("connect", kvh_error());

    uint64_t cached0 = meminfo_cached();
    r->cached_peak = cached0;
    uint64_t t0 = kvh_now_ns();
    r->stalls = 0;
    for (size_t i = 0; i < n; i += chain) {
        size_t m = n - i < chain ? n - i : chain;
        r->stalls += put_chain(c, keys + i, m, bb, locs, fill_copy, &ws, i);
        uint64_t ca = meminfo_cached();
        if (ca > r->cached_peak)
            r->cached_peak = ca;
    }
    uint64_t t_put = kvh_now_ns();
    uint64_t t_end = wait_written(obs, (long long)n, &w);
    uint64_t ca = meminfo_cached();
    if (ca > r->cached_peak)
        r->cached_peak = ca;
    r->cached_growth = r->cached_peak > cached0 ? r->cached_peak - cached0 : 0;
    r->put_ns = t_put - t0;
    r->ns = t_end - t0;
    r->dropped = w.dropped;
    if (w.failed) {
        fprintf(stderr, "kvnode-bench-persist: %s fsync=%s workers=%u: %lld writes failed\n", r->label,
                r->fsync_policy, r->workers, w.failed);
        bad = 1;
    }
    if (w.dropped) {
        fprintf(stderr, "kvnode-bench-persist: %s fsync=%s workers=%u: %lld writes dropped although the "
                "queue (%zu) holds every write\n", r->label, r->fsync_policy, r->workers, w.dropped,
                queue_for(n));
        bad = 1;
    }
    if (w.written_bytes != w.written * (long long)bb) {
        fprintf(stderr, "kvnode-bench-persist: written_bytes_total %lld != %lld blocks x %llu\n",
                w.written_bytes, w.written, (unsigned long long)bb);
        bad = 1;
    }
    kvnode_close(c);
    kvnode_close(obs);
    stop_daemon(&d);

    struct scan_ctx s = { .expect_size = bb, .keys = keys, .nkeys = n, .src = src,
                          .chain = chain, .bb = bb, .sample_max = 8 };
    scan_store(store, &s);
    if (s.blocks != (uint64_t)w.written || s.bad || s.sample_bad || s.sampled == 0) {
        fprintf(stderr, "kvnode-bench-persist: %s fsync=%s workers=%u: %llu blocks for %lld written, "
                "%llu bad, %u of %u sampled payloads differ\n", r->label, r->fsync_policy, r->workers,
                (unsigned long long)s.blocks, w.written, (unsigned long long)s.bad, s.sample_bad, s.sampled);
        bad = 1;
    }
    test_rmtree(store);
    sync();   /* the next run starts without this one's dirty pages */
    free(keys);
    free(locs);
    return bad;
}

/* Single-thread memcpy of total bytes in chain-sized copies (bench.c's
 * reference): GB/s. */
static double memcpy_gbs(const unsigned char *src, unsigned char *dst, size_t chain_bytes, uint64_t total)
{
    unsigned iters = (unsigned)(total / chain_bytes);
    if (iters < 1)
        iters = 1;
    memcpy(dst, src, chain_bytes);   /* warm-up */
    uint64_t ns = 0;
    for (unsigned it = 0; it < iters; it++) {
        uint64_t t0 = kvh_now_ns();
        memcpy(dst, src, chain_bytes);
        ns += kvh_now_ns() - t0;
    }
    if (dst[chain_bytes - 1] != src[chain_bytes - 1])
        die("memcpy", "copy differs");
    return (double)iters * (double)chain_bytes / 1e9 / secs(ns);
}

static int bench_writes(uint64_t target)
{
    static const struct { uint64_t bb; const char *label; size_t chain; } sizes[] = {
        { 64 * 1024, "64KiB", 256 }, { 1024 * 1024, "1MiB", 64 },
    };
    static const char *const fsyncs[] = { "never", "batch", "always" };
    static const unsigned workers[] = { 1, 2, 4 };
    int bad = 0;
    unsigned run = 0;
    struct wrow rows[2][3 * 3];
    double ref[2];
    bool dio;

    sync();
    disk_gbs = disk_seq_gbs(tmp_root, target, &dio);
    printf("== 0. the disk: %.2f GiB written sequentially in 8 MiB %s writes + fdatasync: %.2f GB/s\n\n",
           (double)target / (double)(1ull << 30), dio ? "O_DIRECT" : "buffered (no O_DIRECT here)", disk_gbs);

    printf("== 2. write-behind: policy=write_through, zero-copy puts, %.2f GiB per run, host tier and "
           "queue hold every block\n", (double)target / (double)(1ull << 30));
    for (size_t si = 0; si < 2; si++) {
        uint64_t bb = sizes[si].bb;
        size_t chain = sizes[si].chain, n = (size_t)(target / bb);
        unsigned char *src = malloc(chain * bb), *dst = malloc(chain * bb);
        if (!src || !dst)
            die("malloc", "out of memory");
        for (size_t i = 0; i < chain; i++)
            kvh_fill(src + i * bb, bb, (kvnode_key)i, SEED);
        memset(dst, 0, chain * bb);
        ref[si] = memcpy_gbs(src, dst, chain * bb, (uint64_t)n * bb);
        int k = 0;
        for (size_t fi = 0; fi < 3; fi++) {
            for (size_t wi = 0; wi < 3; wi++, k++) {
                struct wrow *r = &rows[si][k];
                *r = (struct wrow){ .label = sizes[si].label, .fsync_policy = fsyncs[fi],
                                    .workers = workers[wi], .n = n, .bb = bb };
                bad |= write_run(r, src, chain, run++);
                fprintf(stderr, ".");
            }
        }
        free(src);
        free(dst);
    }
    fprintf(stderr, "\n");
    printf("\n%-6s %-6s %7s %7s %8s %8s %9s %10s %8s %9s %8s %8s\n", "block", "fsync", "workers", "blocks",
           "GiB", "put s", "written s", "blocks/s", "GB/s", "vs disk", "memcpy", "dropped");
    for (size_t si = 0; si < 2; si++)
        for (int k = 0; k < 9; k++)
            print_wrow(&rows[si][k], ref[si]);
    printf("  put s = first put_begin until the last commit; written s = first put until\n"
           "  persist.written_blocks_total == blocks (GB/s and blocks/s from it); vs disk = GB/s over\n"
           "  the disk's own sequential bandwidth (part 0); memcpy = single-thread memcpy GB/s of the same\n"
           "  bytes in this run. persist.direct_io=auto (O_DIRECT where the file system takes it).\n");

    /* Page-cache growth with and without O_DIRECT. */
    {
        uint64_t bb = sizes[0].bb;
        size_t chain = sizes[0].chain, n = (size_t)(target / bb);
        unsigned char *src = malloc(chain * bb);
        struct wrow pc[2];
        static const char *const modes[] = { "on", "off" };
        if (!src)
            die("malloc", "out of memory");
        for (size_t i = 0; i < chain; i++)
            kvh_fill(src + i * bb, bb, (kvnode_key)i, SEED);
        for (int m = 0; m < 2; m++) {
            char why[256];
            direct_io = modes[m];
            if (drop_caches(why, sizeof why) != 0)
                sync();
            pc[m] = (struct wrow){ .label = "64KiB", .fsync_policy = "batch",
                                   .workers = 2, .n = n, .bb = bb };
            bad |= write_run(&pc[m], src, chain, run++);
        }
        direct_io = "auto";
        free(src);
        printf("\npage cache during a %.2f GiB write-behind run (64 KiB blocks, fsync=batch, 2 workers):\n",
               (double)target / (double)(1ull << 30));
        for (int m = 0; m < 2; m++)
            printf("  direct_io=%-3s  Cached grew by %8.1f MiB (peak %.1f MiB), %.2f GB/s\n", modes[m],
                   (double)pc[m].cached_growth / 1048576.0, (double)pc[m].cached_peak / 1048576.0,
                   (double)pc[m].n * (double)pc[m].bb / 1e9 / secs(pc[m].ns));
        printf("  (the host tier's own memfd pages count as Cached too: both rows include them)\n");
    }
    return bad;
}

/* --- 3. v6d ------------------------------------------------------------------------ */

struct sim {
    pid_t pid;
    char dir[PATH_MAX], sock[PATH_MAX], http[64], base[128];   /* http: HOST:PORT; base: http://HOST:PORT */
};

/* Start $KVS_SIM with an arena of arena_bytes; false (why in `why`) when
 * the simulator cannot be run (not built). */
static bool sim_start(struct sim *s, uint64_t arena_bytes, char *why, size_t whylen)
{
    const char *bin = getenv("KVS_SIM");
    if (!bin || !*bin)
        bin = "build/kvs-sim";
    if (access(bin, X_OK) != 0) {
        snprintf(why, whylen, "%s: %s (build with V6D=1)", bin, strerror(errno));
        return false;
    }
    make_dir(s->dir, sizeof s->dir, "kvs-sim");
    int sl = snprintf(s->sock, sizeof s->sock, "%s/kvs.sock", s->dir);
    if (sl < 0 || (size_t)sl >= sizeof ((struct sockaddr_un *)0)->sun_path)
        die("kvs-sim socket path too long", s->dir);
    char arena[32];
    snprintf(arena, sizeof arena, "%llu", (unsigned long long)arena_bytes);
    const char *const argv[] = { bin, "--http", "127.0.0.1:0", "--socket", s->sock, "--arena-bytes", arena,
                                 "--max-lease-s", "600", NULL };
    static const char *const announce[] = { "http=", "socket=", NULL };
    struct proc_pipes pipes;
    s->pid = proc_spawn(&(struct proc_opts){ .argv = argv, .out = PROC_PIPE }, &pipes);
    if (s->pid < 0)
        die("kvs-sim", proc_error());
    char buf[1024];
    int rc = proc_read_announce(pipes.out, announce, buf, sizeof buf, 20000);
    close(pipes.out);
    if (rc != 0)
        die("kvs-sim", proc_error());
    const char *h = strstr(buf, "http=") + 5;
    snprintf(s->http, sizeof s->http, "%.*s", (int)strcspn(h, "\n"), h);
    snprintf(s->base, sizeof s->base, "http://%s", s->http);
    return true;
}

static void sim_stop(struct sim *s)
{
    if (s->pid > 0)
        proc_stop(&s->pid, SIGTERM, 20000);
    test_rmtree(s->dir);
}

/* The simulator's counters (GET /_sim/state). */
struct sim_calls { long long create, read, seal, release, discard; };

static void sim_calls(const struct sim *s, struct sim_calls *out)
{
    char *body = NULL;
    CURLcode rc = CURLE_OK;
    kvh_http_try(s->http, NULL, "/_sim/state", NULL, &body, NULL, 0, 10000L, &rc);
    json_t *doc = rc == CURLE_OK && body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    if (rc != CURLE_OK || !doc)
        die("GET /_sim/state", rc != CURLE_OK ? curl_easy_strerror(rc) : "no JSON");
    out->create = kvh_json_int(doc, "acquire_create_calls");
    out->read = kvh_json_int(doc, "acquire_read_calls");
    out->seal = kvh_json_int(doc, "seal_calls");
    out->release = kvh_json_int(doc, "release_calls");
    out->discard = kvh_json_int(doc, "discard_calls");
    json_decref(doc);
}

static const char *v6d_cfg(char *buf, size_t len, const struct sim *s, uint64_t host_bytes,
                           unsigned workers, size_t queue)
{
    int l = snprintf(buf, len,
                     "memory.host_bytes=%lluMiB\n"
                     "log.level=warn\n"
                     "server.request_timeout=120s\n"
                     "persist.backend=v6d\n"
                     "persist.url=%s\n"
                     "persist.socket_path=%s\n"
                     "persist.policy=write_through\n"
                     "persist.workers=%u\n"
                     "persist.queue=%zu\n",
                     (unsigned long long)((host_bytes + (1u << 20) - 1) >> 20), s->base, s->sock,
                     workers, queue);
    if (l < 0 || (size_t)l >= len)
        die("config", "too long");
    return buf;
}

struct vrow {
    unsigned workers;
    size_t n;
    uint64_t write_ns, read_ns;
    struct sim_calls w, r;    /* calls of the write phase, of the read phase */
};

/* --- a daemon in steady state ---------------------------------------------------- */

/* kvnoded reserves its host arena (fallocate) but does not fault it into its
 * own page tables (issue 16: start-up time), so a just-started daemon's
 * persist workers take a first-touch page fault on every page they copy
 * to or from; a daemon that has run a while has touched its pages, and the
 * slab allocator hands freed slabs out again (a LIFO stack). The "warm"
 * figures of part 4 are taken on such a daemon: warm_up() first fills its
 * host tier once with filler blocks through the engine API and deletes
 * them, untimed. The daemon's own counters tell whether that held: its
 * shared-memory RSS (the arena pages in its page tables) and minor faults
 * over each timed phase (struct dphase), and /stats slabs in use. */

/* The daemon's arena pages in its own page tables (RssShmem, KiB); -1 when
 * the kernel does not say. */
static long long proc_shmem_kib(pid_t pid)
{
    char path[64], line[256];
    long long kib = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "RssShmem:", 9) == 0)
            kib = strtoll(line + 9, NULL, 10);
    if (f)
        fclose(f);
    return kib;
}

/* Minor page faults of a process so far. */
static unsigned long long proc_minflt(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[len] = '\0';
    const char *p = strrchr(buf, ')');
    unsigned long long minflt = 0;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %llu", &minflt) != 1)
        return 0;
    return minflt;
}

/* What the daemon did to its own mapping over one timed phase. */
struct dphase {
    unsigned long long faults;   /* minor faults of kvnoded */
    long long new_kib;           /* growth of its RssShmem (-1: unknown) */
    long long slabs;             /* host slabs in use at the end (/stats) */
};

static void dphase_begin(const kvh_daemon *d, struct dphase *ph)
{
    ph->faults = proc_minflt(d->pid);
    ph->new_kib = proc_shmem_kib(d->pid);
}

static void dphase_end(const kvh_daemon *d, kvnode_client *c, struct dphase *ph)
{
    long long kib = proc_shmem_kib(d->pid);
    ph->faults = proc_minflt(d->pid) - ph->faults;
    ph->new_kib = kib >= 0 && ph->new_kib >= 0 ? kib - ph->new_kib : -1;
    json_t *s = stats(c);
    ph->slabs = jint(s, "tiers.host.slabs_total") - jint(s, "tiers.host.slabs_free");
    json_decref(s);
}

/* What warm_up did. */
struct warmup {
    size_t blocks;          /* filler blocks put, written and deleted */
    long long slabs;        /* host slabs in use while they were there */
    long long touched_kib;  /* growth of the daemon's RssShmem (-1: unknown) */
};

static void fill_filler(void *slot, size_t i, uint64_t bb, const void *arg)
{
    (void)arg;
    memset(slot, (int)(0x5a ^ (i & 0xff)), bb);
}

/* Bring the daemon d (policy=write_through, host tier empty) to a steady
 * state, untimed: put filler blocks of bb bytes (keys from chain seed
 * `seed`, none of the bench's) through the engine client c until the host
 * tier is at its high watermark, wait until the write-behind has copied
 * every one out of the arena (which faults the pages into the daemon's
 * mapping, as serving blocks for a while does), then delete them all and
 * wait until the store has deleted them too and the tier is empty again. */
static void warm_up(const kvh_daemon *d, kvnode_client *c, uint64_t bb, size_t chain, uint64_t seed,
                    struct warmup *out)
{
    json_t *s = stats(c);
    double fill = (double)jint(s, "tiers.host.capacity_bytes") * jreal(s, "tiers.host.high_watermark");
    long long deleted0 = jint(s, "persist.deleted_keys_total");
    json_decref(s);
    size_t n = (size_t)(fill / (double)bb);
    n -= n % chain;
    if (n == 0)
        die("warm-up", "the host tier holds less than one chain");
    kvnode_key *keys = malloc(n * sizeof *keys);
    kvnode_loc *locs = malloc(chain * sizeof *locs);
    if (!keys || !locs)
        die("malloc", "out of memory");
    kvh_chain(keys, n, seed);
    long long kib0 = proc_shmem_kib(d->pid);
    struct wstate w0, w;
    write_state(c, &w0);
    for (size_t i = 0; i < n; i += chain)
        put_chain(c, keys + i, chain, bb, locs, fill_filler, NULL, i);
    wait_written(c, w0.written + w0.dropped + w0.failed + (long long)n, &w);
    if (w.written - w0.written != (long long)n) {
        char m[160];
        snprintf(m, sizeof m, "%lld of %zu filler blocks written (%lld failed, %lld dropped)",
                 w.written - w0.written, n, w.failed - w0.failed, w.dropped - w0.dropped);
        die("warm-up", m);
    }
    s = stats(c);
    out->blocks = n;
    out->slabs = jint(s, "tiers.host.slabs_total") - jint(s, "tiers.host.slabs_free");
    json_decref(s);
    long long kib1 = proc_shmem_kib(d->pid);
    out->touched_kib = kib0 >= 0 && kib1 >= 0 ? kib1 - kib0 : -1;
    size_t deleted = 0;
    for (size_t i = 0; i < n; i += chain) {
        size_t m = 0;
        check(c, kvnode_delete(c, keys + i, chain, &m), "delete");
        deleted += m;
    }
    if (deleted != n) {
        char m[96];
        snprintf(m, sizeof m, "%zu of %zu filler blocks deleted", deleted, n);
        die("warm-up", m);
    }
    /* The store's deletes run behind, on the persist workers: done before
     * the timed phase, whose CPU they would take. */
    uint64_t deadline = kvh_now_ns() + (uint64_t)WAIT_S * 1000000000ull;
    for (;;) {
        s = stats(c);
        bool done = jint(s, "persist.deleted_keys_total") - deleted0 >= (long long)n &&
                    jint(s, "persist.queue_depth") == 0 && jint(s, "tiers.host.blocks") == 0;
        json_decref(s);
        if (done)
            break;
        if (kvh_now_ns() > deadline)
            die("warm-up", "the store did not delete the filler blocks");
        sleep_ns(POLL_NS);
    }
    free(keys);
    free(locs);
}

/* A timed phase on a warm daemon must have reused the slabs warm_up
 * touched: no more slabs in use than the fillers had. 0, or 1 with the
 * reason printed. */
static int warm_check(const struct warmup *wu, const struct dphase *ph, const char *label)
{
    if (ph->slabs <= wu->slabs)
        return 0;
    fprintf(stderr, "kvnode-bench-persist: %s: the warm phase used %lld host slabs, the warm-up only %lld "
            "(not a warm daemon)\n", label, ph->slabs, wu->slabs);
    return 1;
}

static double redis_cpu_s(const struct rctl *r);

/* One reader of read_back: its own connection, the chains idx, idx + count,
 * ... of keys, each GET's answer kept (under its lease) for the check. */
struct read_get {
    size_t at, m, got;
    kvnode_lease lease;
    kvnode_loc *locs;
    int rc;
    char err[160];
};
struct reader {
    kvnode_client *c;
    const kvnode_key *keys;
    size_t n, chain;
    unsigned idx, count;
    size_t ngets;
    struct read_get *gets;
};

static void *reader_run(void *arg)
{
    struct reader *r = arg;
    for (size_t at = (size_t)r->idx * r->chain; at < r->n; at += (size_t)r->count * r->chain) {
        struct read_get *g = &r->gets[r->ngets++];
        g->at = at;
        g->m = r->n - at < r->chain ? r->n - at : r->chain;
        g->locs = calloc(g->m, sizeof *g->locs);
        g->rc = g->locs ? kvnode_get_begin(r->c, r->keys + at, g->m, &g->lease, g->locs, &g->got)
                        : -KVNODE_ENOMEM;
        if (g->rc != 0)
            snprintf(g->err, sizeof g->err, "%s", kvnode_last_error(r->c));
    }
    return NULL;
}

/* Read keys[0..n) back through a new daemon on cfg (it knows nothing: GET
 * finds the keys in the store and promotes them), chain keys per GET, from
 * `readers` threads with a connection each (several GETs in flight, as an
 * engine serving several requests has). Timed from the first GET until
 * every answer is in; then, untimed, every block is checked against src
 * (block i holds src block i % chain) and the leases end. Leaves the daemon
 * running in *d; its time in *read_ns. With warm, the daemon is first
 * brought to a steady state (warm_up, fillers from chain seed warm_seed);
 * with ph, what the daemon did to its mapping in the timed part. *cpu_s:
 * CPU seconds of the daemon, this process and the servers (when not NULL)
 * over the timed part. 0, or 1 when a GET failed, came short or read back
 * wrong. */
static int read_back(kvh_daemon *d, const char *cfg, const kvnode_layout *l, const kvnode_key *keys, size_t n,
                     size_t chain, unsigned readers, const unsigned char *src, uint64_t bb, const char *label,
                     uint64_t *read_ns, double *cpu_s, const struct rctl *servers, struct warmup *warm,
                     uint64_t warm_seed, struct dphase *ph)
{
    struct reader rd[16];
    pthread_t th[16];
    int bad = 0;

    if (readers == 0 || readers > 16)
        die("read_back", "1 to 16 readers");
    if (kvh_start(d, cfg) != 0)
        die("start kvnoded", kvh_error());
    for (unsigned t = 0; t < readers; t++) {
        rd[t] = (struct reader){ .keys = keys, .n = n, .chain = chain, .idx = t, .count = readers };
        rd[t].gets = calloc((n + chain - 1) / chain, sizeof *rd[t].gets);
        if (!rd[t].gets)
            die("malloc", "out of memory");
        if (kvh_connect(d, l, &rd[t].c) != 0)
            die("connect", kvh_error());
        wait_ready(rd[t].c);
    }
    if (warm)
        warm_up(d, rd[0].c, bb, chain, warm_seed, warm);
    if (ph)
        dphase_begin(d, ph);
    double cpu0 = proc_cpu_s(d->pid) + rusage_cpu_s(RUSAGE_SELF) + (servers ? redis_cpu_s(servers) : 0);
    uint64_t t0 = kvh_now_ns();
    for (unsigned t = 0; t < readers; t++)
        if (pthread_create(&th[t], NULL, reader_run, &rd[t]) != 0)
            die("pthread_create", strerror(errno));
    for (unsigned t = 0; t < readers; t++)
        pthread_join(th[t], NULL);
    /* The bench's own byte checks are not the daemon's time (the raw
     * figures have none). */
    *read_ns = kvh_now_ns() - t0;
    if (cpu_s)
        *cpu_s = proc_cpu_s(d->pid) + rusage_cpu_s(RUSAGE_SELF) + (servers ? redis_cpu_s(servers) : 0) - cpu0;
    if (ph)
        dphase_end(d, rd[0].c, ph);
    for (unsigned t = 0; t < readers; t++) {
        for (size_t q = 0; q < rd[t].ngets; q++) {
            struct read_get *g = &rd[t].gets[q];
            for (size_t k = 0; g->rc == 0 && k < g->got && !bad; k++)
                if (memcmp(g->locs[k].ptr, src + ((g->at + k) % chain) * bb, bb) != 0) {
                    fprintf(stderr, "kvnode-bench-persist: %s: block %zu reads back wrong\n", label, g->at + k);
                    bad = 1;
                }
            if (g->rc == 0 && g->got)
                kvnode_get_end(rd[t].c, g->lease);
            if (g->rc != 0 || g->got != g->m) {
                fprintf(stderr, "kvnode-bench-persist: %s: GET of %zu keys at %zu: rc %d, got %zu (%s)\n",
                        label, g->m, g->at, g->rc, g->got, g->rc ? g->err : "short");
                bad = 1;
            }
            free(g->locs);
        }
        free(rd[t].gets);
        kvnode_close(rd[t].c);
    }
    return bad;
}

static int v6d_run(struct vrow *r, const unsigned char *src, size_t chain, unsigned run,
                   char *why, size_t whylen)
{
    const uint64_t bb = 64 * 1024;
    size_t n = r->n;
    kvnode_key *keys = malloc(n * sizeof *keys);
    kvnode_loc *locs = malloc(chain * sizeof *locs);
    struct wsrc ws = { src, chain };
    struct sim sim = { 0 };
    kvh_daemon d;
    kvnode_client *c, *obs;
    char cfg[PATH_MAX + 1024];
    struct wstate w;
    int bad = 0;

    if (!keys || !locs)
        die("malloc", "out of memory");
    if (!sim_start(&sim, (uint64_t)n * bb + (64ull << 20), why, whylen)) {
        free(keys);
        free(locs);
        return -1;
    }
    kvh_chain(keys, n, 0xc000 + run);
    kvnode_layout l = kvh_layout("bench-v6d", bb, 1, 0);
    uint64_t host = (uint64_t)n * bb / 90 * 100 + (64ull << 20);
    v6d_cfg(cfg, sizeof cfg, &sim, host, r->workers, queue_for(n));

    /* write-behind */
    if (kvh_start(&d, cfg) != 0)
        die("start kvnoded", kvh_error());
    if (kvh_connect(&d, &l, &c) != 0 || kvh_connect(&d, NULL, &obs) != 0)
        die("connect", kvh_error());
    uint64_t t0 = kvh_now_ns();
    for (size_t i = 0; i < n; i += chain) {
        size_t m = n - i < chain ? n - i : chain;
        put_chain(c, keys + i, m, bb, locs, fill_copy, &ws, i);
    }
    uint64_t t_end = wait_written(obs, (long long)n, &w);
    r->write_ns = t_end - t0;
    sim_calls(&sim, &r->w);
    if (w.failed || w.dropped || w.written != (long long)n) {
        fprintf(stderr, "kvnode-bench-persist: v6d workers=%u: %lld written, %lld failed, %lld dropped "
                "of %zu\n", r->workers, w.written, w.failed, w.dropped, n);
        bad = 1;
    }
    kvnode_close(c);
    kvnode_close(obs);
    stop_daemon(&d);

    /* read: a new daemon knows nothing; GET looks the keys up and promotes them */
    char label[32];
    snprintf(label, sizeof label, "v6d workers=%u", r->workers);
    if (read_back(&d, cfg, &l, keys, n, chain, 1, src, bb, label, &r->read_ns, NULL, NULL, NULL, 0, NULL) != 0)
        bad = 1;
    struct sim_calls after;
    sim_calls(&sim, &after);
    r->r = (struct sim_calls){ after.create - r->w.create, after.read - r->w.read,
                               after.seal - r->w.seal, after.release - r->w.release,
                               after.discard - r->w.discard };
    stop_daemon(&d);
    sim_stop(&sim);
    free(keys);
    free(locs);
    return bad;
}

static void print_vrow(const struct vrow *r, uint64_t bb)
{
    double mb = (double)r->n * (double)bb / 1e6, ws = secs(r->write_ns), rs = secs(r->read_ns);
    double n = (double)r->n;
    printf("%7u %7zu %8.3f %9.0f %8.1f %8.3f %9.0f %8.1f   %5.3f %5.3f %5.3f   %5.3f %5.3f\n",
           r->workers, r->n, ws, n / ws, mb / ws, rs, n / rs, mb / rs, (double)r->w.create / n,
           (double)r->w.seal / n, (double)r->w.release / n, (double)r->r.read / n,
           (double)r->r.release / n);
}

static int bench_v6d(uint64_t target)
{
    static const unsigned workers[] = { 1, 4 };
    const uint64_t bb = 64 * 1024;
    const size_t chain = 256;
    size_t n = (size_t)(target / bb);
    struct vrow rows[2];
    char why[PATH_MAX + 64] = "";
    int bad = 0;

    n -= n % chain;
    printf("== 3. v6d: kvs-sim (tests/sim/kvs_sim.c), 64 KiB blocks, %zu blocks (%.2f GiB) per run, "
           "policy=write_through\n", n, (double)n * (double)bb / (double)(1ull << 30));
    unsigned char *src = malloc(chain * bb);
    if (!src)
        die("malloc", "out of memory");
    for (size_t i = 0; i < chain; i++)
        kvh_fill(src + i * bb, bb, (kvnode_key)i, SEED);
    for (size_t k = 0; k < 2; k++) {
        rows[k] = (struct vrow){ .workers = workers[k], .n = n };
        int rc = v6d_run(&rows[k], src, chain, (unsigned)k, why, sizeof why);
        if (rc < 0) {
            printf("skipped: %s\n\n", why);
            free(src);
            return 0;
        }
        bad |= rc;
        fprintf(stderr, ".");
    }
    fprintf(stderr, "\n");
    free(src);
    printf("\n%7s %7s %8s %9s %8s %8s %9s %8s   %-17s   %-11s\n", "workers", "blocks", "write s",
           "blocks/s", "MB/s", "read s", "blocks/s", "MB/s", "create seal rel", "read rel");
    for (size_t k = 0; k < 2; k++)
        print_vrow(&rows[k], bb);
    printf("  write s = first put until persist.written_blocks_total == blocks (write-behind);\n"
           "  read s = GETs of every block from a new daemon (store lookups + promotions, bytes\n"
           "  verified); MB/s = 10^6 bytes per second; the last five columns are the simulator's\n"
           "  control calls per block: acquire(create), seal, release while writing,\n"
           "  acquire(read) (lookups included) and release while reading.\n\n");
    return bad;
}


/* --- 4. redis ------------------------------------------------------------------------ */

struct rrow {
    uint64_t bb;
    size_t n;
    double raw_set, raw_get;     /* redis-benchmark requests per second */
    double raw_hits;             /* raw GETs that found their key */
    double raw_new;              /* raw SETs per second of new keys */
    double raw_get_cpu;          /* CPU seconds of the raw GETs (servers + redis-benchmark) */
    size_t raw_gets;             /* GETs in the raw run */
    /* kvnode, [0] a just-started daemon, [1] a warm one (warm_up) */
    uint64_t write_ns[2], read_ns[2];
    double read_cpu[2];          /* CPU seconds of the reads (servers + kvnoded + the bench) */
    struct dphase wph[2], rph[2];
    struct warmup wwarm, rwarm;  /* the warm-ups of the warm write and read daemons */
};

/* CPU seconds the cluster's servers have used. */
static double redis_cpu_s(const struct rctl *r)
{
    double s = 0;
    for (int i = 0; i < r->n; i++)
        if (r->pids[i] > 0)
            s += proc_cpu_s(r->pids[i]);
    return s;
}

/* Keyspace hits and misses summed over the masters (INFO stats). */
static void redis_hits(const struct rctl *r, unsigned long long *hits, unsigned long long *misses)
{
    *hits = *misses = 0;
    for (int i = 0; i < r->n; i++) {
        char *out = NULL;
        if (rctl_cli(r, i, &out, "info", "stats", (const char *)NULL) == 0 && out) {
            const char *h = strstr(out, "keyspace_hits:"), *m = strstr(out, "keyspace_misses:");
            if (h)
                *hits += strtoull(h + 14, NULL, 10);
            if (m)
                *misses += strtoull(m + 16, NULL, 10);
        }
        free(out);
    }
}

/* One redis-benchmark --cluster test (set or get): requests per second. */
static int raw_one(const struct rctl *r, const char *test, uint64_t bb, size_t keys_per_master,
                   size_t reqs, double *rps, char *why, size_t whylen)
{
    char port[16], size[32], nreq[32], keyspace[32];
    snprintf(port, sizeof port, "%d", r->ports[0]);
    snprintf(size, sizeof size, "%llu", (unsigned long long)bb);
    snprintf(nreq, sizeof nreq, "%zu", reqs);
    snprintf(keyspace, sizeof keyspace, "%zu", keys_per_master);
    const char *argv[] = { "redis-benchmark", "--cluster", "-h", "127.0.0.1", "-p", port, "-t", test,
                           "-d", size, "-r", keyspace, "-n", nreq, "-c", RAW_CLIENTS, "-P", RAW_PIPELINE,
                           "--csv", NULL };
    struct proc_opts o = { .argv = argv, .in = PROC_NULL };
    char *out = NULL, *err = NULL;
    int st = proc_run(&o, WAIT_S * 1000, &out, &err);
    *rps = 0;
    if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !out) {
        snprintf(why, whylen, "redis-benchmark -t %s: status %d: %.200s", test, st,
                 err ? err : proc_error());
        free(out);
        free(err);
        return -1;
    }
    char want[16];
    int wl = snprintf(want, sizeof want, "\"%s\",\"", strcmp(test, "set") == 0 ? "SET" : "GET");
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
        if (strncmp(line, want, (size_t)wl) == 0)
            *rps = strtod(line + wl, NULL);
    free(out);
    free(err);
    if (*rps <= 0) {
        snprintf(why, whylen, "redis-benchmark -t %s printed no figure", test);
        return -1;
    }
    return 0;
}

/* Empty every master: FLUSHALL returns the memory to the system (Redis 7
 * purges jemalloc), FLUSHALL ASYNC frees it in the background and keeps it
 * in the allocator for the next writes; waits until every master is empty. */
static void redis_flush_how(const struct rctl *r, bool async)
{
    for (int i = 0; i < r->n; i++) {
        char *out = NULL;
        rctl_cli(r, i, &out, "flushall", async ? "async" : (const char *)NULL, (const char *)NULL);
        free(out);
    }
    /* Empty, and (async) done freeing: the background frees would take CPU
     * from the next timed run. */
    for (int i = 0; i < r->n; i++)
        for (int tries = 0; tries < 1000; tries++) {
            char *out = NULL, *mem = NULL;
            bool empty = rctl_cli(r, i, &out, "dbsize", (const char *)NULL) == 0 && out &&
                         strtoll(out, NULL, 10) == 0;
            const char *lf = empty && rctl_cli(r, i, &mem, "info", "memory", (const char *)NULL) == 0 && mem
                                 ? strstr(mem, "lazyfree_pending_objects:") : NULL;
            bool freed = lf && strtoll(lf + 25, NULL, 10) == 0;
            free(out);
            free(mem);
            if (freed)
                break;
            sleep_ns(10000000);
        }
}

static void redis_flush(const struct rctl *r)
{
    redis_flush_how(r, false);
}

/* The raw client throughput of the cluster r for values of bb bytes, what
 * a good pipelined client gets from it, measured with redis-benchmark
 * --cluster:
 *  - over every master: redis-benchmark binds each connection to one master
 *    (round robin) and gives its keys that master's hash tag, so -c 12 is
 *    4 connections per master, as kvnoded's 4 workers have one connection
 *    to each master; -P 16 keeps 64 requests in flight per master (a
 *    worker's batch of 64 blocks spread over 3 masters is ~21 per master
 *    and round trip, 4 workers: ~85);
 *  - GET: of keys that exist: n distinct keys (-r n/3 per master) loaded by
 *    an untimed run of 8n SETs (all but e^-8 of them written; it also warms
 *    the servers' allocator), then 4n GETs timed (hits counted from INFO
 *    stats). Without -r every GET read one key per master, and a GET of a
 *    key never set is a cheap nil reply;
 *  - SET, the ratio's baseline: 4n SETs over the n loaded keys, timed after
 *    the load: each replaces a value of the same size, in memory the server
 *    has just freed (warm, as a full cluster evicting under maxmemory is).
 *    kvnode's writes are new keys into a flushed cluster, so the servers
 *    also allocate and fault in memory for them: a harder job than the
 *    baseline's. For the same job, "new" is 2n SETs of new keys (-r 10^9
 *    per master: hardly a key twice), timed right after a FLUSHALL ASYNC of
 *    the loaded keys has been freed, as kvnode's write run gets it (see
 *    bench_redis); its ratio is printed beside the strict one.
 * Neither direction touches the bytes in the client beyond the socket;
 * kvnode's figures include the engine's copies (put) and the bench's checks
 * (get). */
static int raw_bench(const struct rctl *r, uint64_t bb, size_t n, double *set_rps, double *get_rps,
                     double *new_rps, double *hit_rate, double *get_cpu, char *why, size_t whylen)
{
    size_t per_master = (n + (size_t)r->n - 1) / (size_t)r->n;
    unsigned long long h0, m0, h1, m1;
    double load_rps;
    *set_rps = *get_rps = *new_rps = *hit_rate = 0;
    if (raw_one(r, "set", bb, per_master, n * 8, &load_rps, why, whylen) < 0 ||
        raw_one(r, "set", bb, per_master, n * 4, set_rps, why, whylen) < 0)
        return -1;
    redis_hits(r, &h0, &m0);
    double cpu0 = redis_cpu_s(r) + rusage_cpu_s(RUSAGE_CHILDREN);
    if (raw_one(r, "get", bb, per_master, n * 4, get_rps, why, whylen) < 0)
        return -1;
    *get_cpu = redis_cpu_s(r) + rusage_cpu_s(RUSAGE_CHILDREN) - cpu0;
    redis_hits(r, &h1, &m1);
    if (h1 + m1 > h0 + m0)
        *hit_rate = (double)(h1 - h0) / (double)(h1 + m1 - h0 - m0);
    redis_flush_how(r, true);
    return raw_one(r, "set", bb, RAW_NEW_KEYS, n * 2, new_rps, why, whylen);
}

/* One timed write-behind run: a new daemon on cfg (warmed up first when
 * warm) takes keys[0..n) zero-copy, timed until written. 0, or 1 when a
 * write failed or was dropped. */
static int redis_write(const char *cfg, const kvnode_layout *l, const kvnode_key *keys, size_t n, size_t chain,
                       const struct wsrc *ws, struct warmup *warm, uint64_t warm_seed, uint64_t *write_ns,
                       struct dphase *ph)
{
    const uint64_t bb = l->block_bytes;
    kvnode_loc *locs = malloc(chain * sizeof *locs);
    kvh_daemon d;
    kvnode_client *c, *obs;
    struct wstate w0, w;
    int bad = 0;

    if (!locs)
        die("malloc", "out of memory");
    if (kvh_start(&d, cfg) != 0)
        die("start kvnoded", kvh_error());
    if (kvh_connect(&d, l, &c) != 0 || kvh_connect(&d, NULL, &obs) != 0)
        die("connect", kvh_error());
    wait_populated(obs);
    check(c, kvnode_prefault(c, KVNODE_PREFAULT_WAIT), "prefault");
    if (warm)
        warm_up(&d, c, bb, chain, warm_seed, warm);
    write_state(obs, &w0);
    dphase_begin(&d, ph);
    uint64_t t0 = kvh_now_ns();
    for (size_t i = 0; i < n; i += chain) {
        size_t m = n - i < chain ? n - i : chain;
        put_chain(c, keys + i, m, bb, locs, fill_copy, ws, i);
    }
    uint64_t t_end = wait_written(obs, w0.written + w0.dropped + w0.failed + (long long)n, &w);
    *write_ns = t_end - t0;
    dphase_end(&d, obs, ph);
    if (w.failed != w0.failed || w.dropped != w0.dropped || w.written - w0.written != (long long)n) {
        fprintf(stderr, "kvnode-bench-persist: redis %llu%s: %lld written, %lld failed, %lld dropped of %zu\n",
                (unsigned long long)bb, warm ? " (warm)" : "", w.written - w0.written, w.failed - w0.failed,
                w.dropped - w0.dropped, n);
        bad = 1;
    }
    kvnode_close(c);
    kvnode_close(obs);
    stop_daemon(&d);
    free(locs);
    return bad;
}

/* Per size: write-behind and read on a just-started daemon, then read and
 * write-behind on warm ones (see warm_up), each a new daemon. */
static int redis_run(struct rrow *rw, const struct rctl *r, unsigned run)
{
    const uint64_t bb = rw->bb;
    const size_t chain = bb >= (1u << 20) ? 16 : 256;
    size_t n = rw->n;
    kvnode_key *keys = malloc(n * sizeof *keys);
    unsigned char *src = malloc(chain * bb);
    if (!keys || !src)
        die("malloc", "out of memory");
    for (size_t i = 0; i < chain; i++)
        kvh_fill(src + i * bb, bb, (kvnode_key)i, SEED);
    struct wsrc ws = { src, chain };
    kvh_chain(keys, n, 0xd000 + run);
    kvnode_layout l = kvh_layout("bench-redis", bb, 1, 0);
    uint64_t host = (uint64_t)n * bb / 90 * 100 + (64ull << 20);
    char cfg[2048];
    int w = snprintf(cfg, sizeof cfg,
                     "memory.host_bytes=%lluMiB\n"
                     "log.level=warn\n"
                     "server.request_timeout=120s\n"
                     "persist.backend=redis\n"
                     "persist.nodes=%s\n"
                     "persist.policy=write_through\n"
                     "persist.workers=4\n"
                     "persist.queue=%zu\n",
                     (unsigned long long)((host + (1u << 20) - 1) >> 20), r->seeds, queue_for(n));
    if (w < 0 || (size_t)w >= sizeof cfg)
        die("config", "too long");
    kvh_daemon d;
    int bad = redis_write(cfg, &l, keys, n, chain, &ws, NULL, 0, &rw->write_ns[0], &rw->wph[0]);

    for (int warm = 0; warm < 2 && !bad; warm++) {
        if (read_back(&d, cfg, &l, keys, n, chain, REDIS_READERS, src, bb, warm ? "redis (warm)" : "redis",
                      &rw->read_ns[warm], &rw->read_cpu[warm], r, warm ? &rw->rwarm : NULL, 0xe000 + 2 * run,
                      &rw->rph[warm]) != 0)
            bad = 1;
        if (warm)
            bad |= warm_check(&rw->rwarm, &rw->rph[1], "redis read (warm)");
        stop_daemon(&d);
    }
    if (!bad) {
        /* The same keys written again, new to the flushed cluster, as in the
         * first run. */
        redis_flush_how(r, true);
        bad |= redis_write(cfg, &l, keys, n, chain, &ws, &rw->wwarm, 0xe001 + 2 * run, &rw->write_ns[1],
                           &rw->wph[1]);
        bad |= warm_check(&rw->wwarm, &rw->wph[1], "redis write (warm)");
    }
    free(keys);
    free(src);
    return bad;
}

static int bench_redis(uint64_t target)
{
    static const uint64_t sizes[] = { 64u << 10, 1u << 20 };
    struct rrow rows[2];
    struct rctl r;
    char why[512] = "";
    int bad = 0;

    printf("== 4. redis: a cluster of 3 redis-server masters on loopback, %.0f MiB per run, "
           "policy=write_through, 4 workers\n", (double)target / (double)(1u << 20));
    if (rctl_start(&r, 3, 0, NULL, NULL) < 0) {
        printf("skipped: %s\n\n", rctl_err);
        rctl_stop(&r);
        return 0;
    }
    /* Per size: the raw figures first, then kvnode's on the same servers
     * (see raw_bench: both write into warm memory). */
    for (size_t k = 0; k < 2; k++) {
        rows[k] = (struct rrow){ .bb = sizes[k], .n = (size_t)(target / sizes[k]) };
        redis_flush(&r);
        if (raw_bench(&r, sizes[k], rows[k].n, &rows[k].raw_set, &rows[k].raw_get, &rows[k].raw_new,
                      &rows[k].raw_hits, &rows[k].raw_get_cpu, why, sizeof why) < 0) {
            printf("raw figures skipped: %s\n", why);
            rows[k].raw_set = rows[k].raw_get = 0;
        }
        redis_flush_how(&r, true);
        bad |= redis_run(&rows[k], &r, (unsigned)k);
        redis_flush(&r);
        fprintf(stderr, ".");
    }
    fprintf(stderr, "\n");
    rctl_stop(&r);
    printf("\n%6s %6s  %9s %9s %9s %6s\n", "block", "blocks", "raw SET/s", "raw GET/s", "new SET/s", "hits");
    for (size_t k = 0; k < 2; k++)
        printf("%5lluK %6zu  %9.0f %9.0f %9.0f %5.1f%%\n", (unsigned long long)(rows[k].bb >> 10), rows[k].n,
               rows[k].raw_set, rows[k].raw_get, rows[k].raw_new, rows[k].raw_hits * 100);
    printf("  raw = redis-benchmark --cluster -d <block> -c " RAW_CLIENTS " -P " RAW_PIPELINE
           " on the same cluster in the same run,\n"
           "  over blocks keys spread over the masters (-r):\n"
           "  raw SET/s = SETs replacing values of keys that exist, raw GET/s = GETs of keys that exist\n"
           "  (hits = GETs that found a value), new SET/s = SETs of new keys into the flushed cluster.\n\n");
    printf("%6s %6s %8s %7s %8s %7s  %5s %5s %5s  %8s %8s  %6s %6s\n", "block", "daemon", "write/s", "MB/s",
           "read/s", "MB/s", "write", "read", "w/new", "faults w", "faults r", "MiB w", "MiB r");
    for (size_t k = 0; k < 2; k++)
        for (int warm = 0; warm < 2; warm++) {
            const struct rrow *x = &rows[k];
            double n = (double)x->n, mb = n * (double)x->bb / 1e6;
            double ws = secs(x->write_ns[warm]), rs = secs(x->read_ns[warm]);
            printf("%5lluK %6s %8.0f %7.1f %8.0f %7.1f  %4.2fx %4.2fx %4.2fx  %8llu %8llu  %6.0f %6.0f\n",
                   (unsigned long long)(x->bb >> 10), warm ? "warm" : "fresh", n / ws, mb / ws, n / rs, mb / rs,
                   x->raw_set > 0 ? n / ws / x->raw_set : 0, x->raw_get > 0 ? n / rs / x->raw_get : 0,
                   x->raw_new > 0 ? n / ws / x->raw_new : 0, x->wph[warm].faults, x->rph[warm].faults,
                   x->wph[warm].new_kib / 1024.0, x->rph[warm].new_kib / 1024.0);
        }
    printf("  write/s = blocks per second from the first put until persist.written_blocks_total == blocks\n"
           "  (write-behind of new keys into the flushed cluster); read/s = GETs from a daemon that knows\n"
           "  none of the keys (store reads + promotions, %u reader threads, bytes verified untimed).\n"
           "  write = write/s / raw SET/s, read = read/s / raw GET/s, w/new = write/s / new SET/s.\n"
           "  fresh = a just-started daemon: it reserved its host arena but has not touched it, so its\n"
           "  persist workers fault every page they copy into its page tables; warm = a daemon in the\n"
           "  steady state of one that has run a while: before the timed part its host tier was filled\n"
           "  once with filler blocks (put, written behind, deleted; untimed), whose freed slabs the timed\n"
           "  part reuses. faults = kvnoded's minor page faults, MiB = growth of its RssShmem (arena pages\n"
           "  mapped into its page tables), both over the timed part.\n",
           REDIS_READERS);
    for (size_t k = 0; k < 2; k++)
        printf("  warm-up %lluK: write daemon %zu fillers, %lld slabs, %.0f MiB touched; read daemon %zu fillers,\n"
               "  %lld slabs, %.0f MiB touched; slabs in use after the timed part: write %lld/%lld, read %lld/%lld "
               "(fresh/warm)\n",
               (unsigned long long)(rows[k].bb >> 10), rows[k].wwarm.blocks, rows[k].wwarm.slabs,
               rows[k].wwarm.touched_kib / 1024.0, rows[k].rwarm.blocks, rows[k].rwarm.slabs,
               rows[k].rwarm.touched_kib / 1024.0, rows[k].wph[0].slabs, rows[k].wph[1].slabs,
               rows[k].rph[0].slabs, rows[k].rph[1].slabs);
    printf("\n");
    /* What a GET costs in CPU, whatever else the machine runs: on a busy
     * host the rates above move with the load, this much less. */
    printf("%6s %12s %12s %7s %12s %7s\n", "block", "raw us/GET", "fresh us/GET", "kv/raw", "warm us/GET",
           "kv/raw");
    for (size_t k = 0; k < 2; k++) {
        double raw = rows[k].raw_get_cpu > 0 ? rows[k].raw_get_cpu * 1e6 / (double)(rows[k].n * 4) : 0;
        double fresh = rows[k].read_cpu[0] * 1e6 / (double)rows[k].n;
        double warm = rows[k].read_cpu[1] * 1e6 / (double)rows[k].n;
        printf("%5lluK %12.1f %12.1f %6.2fx %12.1f %6.2fx\n", (unsigned long long)(rows[k].bb >> 10), raw, fresh,
               raw > 0 ? fresh / raw : 0, warm, raw > 0 ? warm / raw : 0);
    }
    printf("  CPU seconds (user + system) per GET: raw = the 3 servers + redis-benchmark over its GETs;\n"
           "  kvnode = the 3 servers + kvnoded + the bench's readers over the timed reads.\n\n");
    return bad;
}

/* --- main ------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    size_t rec_blocks = 100000;
    static const size_t rec_default[2] = { 100000, 1000000 };
    bool rec_list = true;          /* 100 000 and 1 000 000 unless told */
    uint64_t target = 1ull << 30, v6d_target = 256ull << 20, redis_target = 256ull << 20;
    const char *only = NULL;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            rec_blocks = 20000;
            rec_list = false;
            target = 256ull << 20;
            v6d_target = 128ull << 20;
            redis_target = 128ull << 20;
        } else if (strcmp(argv[i], "--redis-bytes") == 0 && i + 1 < argc) {
            redis_target = strtoull(argv[++i], NULL, 10) << 20;
        } else if (strcmp(argv[i], "--blocks") == 0 && i + 1 < argc) {
            rec_blocks = strtoull(argv[++i], NULL, 10);
            rec_list = false;
        } else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc) {
            target = strtoull(argv[++i], NULL, 10) << 20;
        } else if (strcmp(argv[i], "--v6d-bytes") == 0 && i + 1 < argc) {
            v6d_target = strtoull(argv[++i], NULL, 10) << 20;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "recovery") == 0 || strcmp(argv[i + 1], "writes") == 0 ||
                    strcmp(argv[i + 1], "v6d") == 0 || strcmp(argv[i + 1], "redis") == 0)) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--quick] [--blocks N] [--bytes MiB] [--v6d-bytes MiB] "
                    "[--redis-bytes MiB] [--only recovery|writes|v6d|redis]\n", argv[0]);
            return 2;
        }
    }
    if (rec_blocks < GET_KEYS || target < (4ull << 20) || v6d_target < (16ull << 20)) {
        fprintf(stderr, "kvnode-bench-persist: --blocks must be >= %u, --bytes >= 4, --v6d-bytes >= 16\n",
                GET_KEYS);
        return 2;
    }

    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 64)
        tmp = "/tmp";
    snprintf(tmp_root, sizeof tmp_root, "%s/kvnode-bench-persist-XXXXXX", tmp);
    if (!mkdtemp(tmp_root)) {
        fprintf(stderr, "kvnode-bench-persist: mkdtemp %s: %s\n", tmp_root, strerror(errno));
        return 1;
    }
    tmp_owner = getpid();
    atexit(tmp_cleanup);

    /* Scale the write runs to the disk (a run's store is removed before the
     * next; recovery's store is gone by then) and to memory (host tier +
     * buffers). */
    struct statvfs vfs;
    uint64_t disk = statvfs(tmp_root, &vfs) == 0 ? (uint64_t)vfs.f_bavail * vfs.f_frsize : 0;
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t mem = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    uint64_t want = target;
    if (disk && target > disk / 3)
        target = disk / 3;
    if (mem && target > (mem > (1ull << 30) ? (mem - (1ull << 29)) / 2 : mem / 4))
        target = mem > (1ull << 30) ? (mem - (1ull << 29)) / 2 : mem / 4;
    target &= ~((64ull << 20) - 1);   /* whole chains of both block sizes */
    uint64_t rec_disk = (uint64_t)(rec_list ? rec_default[1] : rec_blocks) * 2048u;
    if (target < (64ull << 20) || (disk && rec_disk > disk / 2)) {
        fprintf(stderr, "kvnode-bench-persist: not enough room in %s (%.1f GiB disk free, %.1f GiB memory "
                "available)\n", tmp, (double)disk / (double)(1ull << 30), (double)mem / (double)(1ull << 30));
        return 1;
    }

    printf("kvnode-bench-persist: %s, %s, temp dir %s (%.1f GiB free), %ld CPUs\n", kvh_daemon_path(),
           kvnode_version(), tmp_root, (double)disk / (double)(1ull << 30), sysconf(_SC_NPROCESSORS_ONLN));
    if (target < want)
        printf("write runs scaled down to %.2f GiB (disk or memory is small)\n",
               (double)target / (double)(1ull << 30));
    printf("\n");

    if (!only || strcmp(only, "recovery") == 0) {
        if (rec_list)
            for (size_t i = 0; i < 2; i++)
                bench_recovery(rec_default[i]);
        else
            bench_recovery(rec_blocks);
    }
    int bad = !only || strcmp(only, "writes") == 0 ? bench_writes(target) : 0;
    if (!only || strcmp(only, "v6d") == 0) {
        if (mem && v6d_target > mem / 4)
            v6d_target = (mem / 4) & ~((16ull << 20) - 1);
        bad |= bench_v6d(v6d_target);
    }
    if (!only || strcmp(only, "redis") == 0) {
        if (redis_target < (16ull << 20))
            redis_target = 16ull << 20;
        if (mem && redis_target > mem / 6)
            redis_target = (mem / 6) & ~((16ull << 20) - 1);
        bad |= bench_redis(redis_target);
    }
    if (bad) {
        fprintf(stderr, "kvnode-bench-persist: FAILED (see above)\n");
        return 1;
    }
    return 0;
}
