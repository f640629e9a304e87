/* kvnode-gpu-check: the HBM tier seen from a second process, as an engine
 * sees it (run by scripts/gpu-check.sh against a kvnoded it started; not part
 * of `make bench`).
 *
 * Connects with kvnode_connect_device (the engine's CUDA device) and checks:
 *   (a) a put of --blocks blocks to KVNODE_TIER_HBM lands in the GPU memory
 *       of that device; each block gets a per-key pattern, written through
 *       cudaMemcpy from a host staging buffer;
 *   (b) get_begin returns them byte-exact (cudaMemcpy device -> host, then
 *       compare), and so does a second connection, which opens the lent
 *       arena afresh (and again after the first connection closed);
 *   (c) bandwidth, each next to a peak measured in the same run:
 *       - device-to-device reads of the leased blocks out of the lent arena
 *         (cudaMemcpyAsync into a cudaMalloc scratch buffer, timed with
 *         events) vs cudaMemcpy between two cudaMalloc buffers of that size;
 *       - host-to-device copies out of the pinned host arena (host-tier
 *         blocks, kvnode_pin_host) vs cudaMemcpy from cudaMallocHost memory;
 *       - demotion: enough HBM puts to pass the high watermark, /stats
 *         polled until the demotions settle (and, with a store, every
 *         block pinned by its store write has been let go), HBM at or
 *         under the high watermark, demotions.bytes_total /
 *         copy_seconds_total vs a device-to-host cudaMemcpy into pinned
 *         memory; every block is verified again afterwards (demoted ones
 *         from host memory);
 *   (d) with a persistent store (persist.backend not off, as
 *       `gpu-check.sh --store` runs it): under write_through every block
 *       put (HBM blocks through a device copy) is written, and no write
 *       failed;
 *   (e) with a write_through store, when the HBM arena held none but ours
 *       at the start: ours deleted, one put takes the arena past its high
 *       watermark; every block is pinned by its write, so the demotion pass
 *       the put starts finds nothing to move, and once the writes land
 *       demotion must bring the arena down to its low watermark with no
 *       further request (issue 13 defect 6).
 *
 * --sim: the daemon simulates its GPUs (hbm.backend=sim, host memory lent
 * as a mapped memfd): no CUDA call is made here, HBM locations are host
 * mappings, every copy is memcpy and the "peaks" are memcpy of the same
 * sizes. Those figures say nothing about a GPU and are labelled so.
 *
 * Prints `gpu-check: PASS`, or `gpu-check: FAIL: <why>` and exits 1 (2 for
 * usage errors). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "kvnode.h"

#ifdef KVNODE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define PROG         "gpu-check"
#define CHUNK        64u            /* keys per put_begin / get_begin */
#define BLOCK_TOKENS 16u
#define MAX_ALLOCS   64

static struct {
    const char *socket;
    int device;
    bool sim;
    size_t blocks;
    uint64_t bb;
    unsigned iters;
    unsigned settle_s;
} opt = { .device = 0, .blocks = 64, .bb = 256 * 1024, .iters = 8, .settle_s = 60 };

/* Everything allocated, so that the end (or a failure) frees it and leak
 * checkers see no loss. */
enum { MEM_HOST, MEM_PINNED, MEM_DEV };
static struct {
    kvnode_client *c1, *c2, *obs;
    struct { void *p; int kind; } alloc[MAX_ALLOCS];
    unsigned nalloc;
    uint8_t *stage, *expect;      /* one block each (pinned with CUDA) */
    uint64_t salt;
} g;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fprintf(stdout, PROG ": FAIL: ");
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fprintf(stdout, "\n");
    fflush(stdout);
    exit(1);
}

static void lib_ok(kvnode_client *c, int rc, const char *what)
{
    if (rc != 0)
        fail("%s: %s (%d): %s", what, kvnode_strerror(rc), rc, kvnode_last_error(c));
}

static const char *mode_label(void)
{
    return opt.sim ? "[sim/memcpy]" : "[GPU]";
}

/* --- CUDA or its stand-in ----------------------------------------------- */

#ifdef KVNODE_HAVE_CUDA
static void cuda_ok(cudaError_t err, const char *what)
{
    if (err != cudaSuccess)
        fail("%s: %s (cudaError %d)", what, cudaGetErrorString(err), (int)err);
}
#endif

static bool use_cuda(void)
{
#ifdef KVNODE_HAVE_CUDA
    return !opt.sim;
#else
    return false;
#endif
}

static void *mem_alloc(int kind, size_t n, const char *what)
{
    void *p = NULL;

    if (g.nalloc == MAX_ALLOCS)
        fail("internal: too many buffers");
#ifdef KVNODE_HAVE_CUDA
    if (use_cuda() && kind == MEM_DEV) {
        cuda_ok(cudaMalloc(&p, n), what);
        cuda_ok(cudaMemset(p, 0, n), what);
    } else if (use_cuda() && kind == MEM_PINNED) {
        cuda_ok(cudaMallocHost(&p, n), what);
        memset(p, 0, n);
    }
#endif
    if (!p) {
        p = malloc(n);
        if (!p)
            fail("%s: out of memory (%zu bytes)", what, n);
        memset(p, 0, n);      /* fault the pages in before anything is timed */
        kind = MEM_HOST;
    }
    g.alloc[g.nalloc].p = p;
    g.alloc[g.nalloc].kind = kind;
    g.nalloc++;
    return p;
}

static void mem_free_all(void)
{
    while (g.nalloc > 0) {
        g.nalloc--;
        void *p = g.alloc[g.nalloc].p;
#ifdef KVNODE_HAVE_CUDA
        if (g.alloc[g.nalloc].kind == MEM_DEV) {
            (void)cudaFree(p);
            continue;
        }
        if (g.alloc[g.nalloc].kind == MEM_PINNED) {
            (void)cudaFreeHost(p);
            continue;
        }
#endif
        free(p);
    }
}

/* A synchronous copy between any two of: device memory, host memory. */
static void copy_sync(void *dst, const void *src, size_t n, const char *what)
{
#ifdef KVNODE_HAVE_CUDA
    if (use_cuda()) {
        cuda_ok(cudaMemcpy(dst, src, n, cudaMemcpyDefault), what);
        return;
    }
#endif
    (void)what;
    memcpy(dst, src, n);
}

/* A block location the CPU may touch: host tier, or any tier in sim mode. */
static bool loc_on_host(const kvnode_loc *l)
{
    return l->tier != KVNODE_TIER_HBM || opt.sim;
}

static void loc_write(const kvnode_loc *l, const void *src)
{
    if (loc_on_host(l))
        memcpy(l->ptr, src, (size_t)opt.bb);
    else
        copy_sync(l->ptr, src, (size_t)opt.bb, "cudaMemcpy host -> HBM block");
}

static void loc_read(const kvnode_loc *l, void *dst)
{
    if (loc_on_host(l))
        memcpy(dst, l->ptr, (size_t)opt.bb);
    else
        copy_sync(dst, l->ptr, (size_t)opt.bb, "cudaMemcpy HBM block -> host");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds taken by `iters` rounds of n copies of `each` bytes (src[i] ->
 * dst[i]) after one untimed round: on a non-blocking stream between two
 * events with CUDA, memcpy timed by the clock in sim mode. */
static double time_copies(void *const *dst, const void *const *src, size_t n, size_t each,
                          unsigned iters, const char *what)
{
#ifdef KVNODE_HAVE_CUDA
    if (use_cuda()) {
        cudaStream_t s;
        cudaEvent_t e0, e1;
        float ms = 0;

        cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), what);
        cuda_ok(cudaEventCreate(&e0), what);
        cuda_ok(cudaEventCreate(&e1), what);
        for (size_t i = 0; i < n; i++)
            cuda_ok(cudaMemcpyAsync(dst[i], src[i], each, cudaMemcpyDefault, s), what);
        cuda_ok(cudaStreamSynchronize(s), what);
        cuda_ok(cudaEventRecord(e0, s), what);
        for (unsigned it = 0; it < iters; it++)
            for (size_t i = 0; i < n; i++)
                cuda_ok(cudaMemcpyAsync(dst[i], src[i], each, cudaMemcpyDefault, s), what);
        cuda_ok(cudaEventRecord(e1, s), what);
        cuda_ok(cudaEventSynchronize(e1), what);
        cuda_ok(cudaEventElapsedTime(&ms, e0, e1), what);
        cuda_ok(cudaEventDestroy(e0), what);
        cuda_ok(cudaEventDestroy(e1), what);
        cuda_ok(cudaStreamDestroy(s), what);
        return (double)ms / 1e3;
    }
#endif
    (void)what;
    for (size_t i = 0; i < n; i++)
        memcpy(dst[i], src[i], each);
    double t0 = now_s();
    for (unsigned it = 0; it < iters; it++)
        for (size_t i = 0; i < n; i++)
            memcpy(dst[i], src[i], each);
    return now_s() - t0;
}

/* The peak for n blocks of `each` bytes between two plain buffers: with
 * CUDA one cudaMemcpy of all of it; in sim mode memcpy of the same blocks
 * (one huge memcpy takes glibc's non-temporal path, slower than the block
 * copies it would stand for). */
static double time_peak(void *dst, const void *src, size_t n, size_t each, unsigned iters,
                        const char *what)
{
    if (use_cuda()) {
        void *d[1] = { dst };
        const void *s[1] = { src };
        return time_copies(d, s, 1, n * each, iters, what);
    }
    void **d = malloc(n * sizeof *d);
    const void **s = malloc(n * sizeof *s);
    if (!d || !s)
        fail("out of memory");
    for (size_t i = 0; i < n; i++) {
        d[i] = (uint8_t *)dst + i * each;
        s[i] = (const uint8_t *)src + i * each;
    }
    double t = time_copies(d, s, n, each, iters, what);
    free(d);
    free(s);
    return t;
}

static double gbs(double bytes, double s)
{
    return s > 0 ? bytes / s / 1e9 : 0.0;
}

static void report(const char *name, double bytes, double s, const char *peak_name, double pbytes,
                   double ps)
{
    double a = gbs(bytes, s), p = gbs(pbytes, ps);

    printf("  %s %-40s %9.2f GB/s   peak %-34s %9.2f GB/s   %6.1f%% of peak\n", mode_label(),
           name, a, peak_name, p, p > 0 ? 100.0 * a / p : 0.0);
}

/* --- blocks ------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The bytes block `key` must hold (block_bytes is a multiple of 8). */
static void pattern(void *dst, kvnode_key key)
{
    uint64_t s = mix64((uint64_t)key ^ 0x6b766e6f64656770ull), *w = dst;
    for (size_t i = 0; i < (size_t)opt.bb / 8; i++)
        w[i] = mix64(s + i);
}

static void verify(const void *got, kvnode_key key, const char *what, size_t idx, const kvnode_loc *l)
{
    pattern(g.expect, key);
    if (memcmp(got, g.expect, (size_t)opt.bb) == 0)
        return;
    const uint8_t *a = got;
    size_t off = 0;
    while (off < opt.bb && a[off] == g.expect[off])
        off++;
    fail("%s: block %zu (key %" PRId64 ", %s, device %d) differs from what was written at byte "
         "%zu of %" PRIu64 " (read 0x%02x, wrote 0x%02x)", what, idx, (int64_t)key,
         l->tier == KVNODE_TIER_HBM ? "HBM" : "host", l->device, off, opt.bb, a[off],
         g.expect[off]);
}

/* A chain of n keys, as an engine would hash its tokens; `phase` and the
 * run's salt keep chains of different phases and runs apart. */
static kvnode_key *make_keys(size_t n, uint64_t phase)
{
    size_t nt = n * BLOCK_TOKENS;
    int64_t *tokens = malloc(nt * sizeof *tokens);
    kvnode_key *keys = mem_alloc(MEM_HOST, n * sizeof *keys, "keys");

    if (!tokens)
        fail("out of memory for %zu tokens", nt);
    for (size_t i = 0; i < nt; i++)
        tokens[i] = (int64_t)(mix64(g.salt ^ (phase << 48) ^ i) % 150000u);
    size_t got = kvnode_hash_tokens(tokens, nt, BLOCK_TOKENS, keys, n);
    free(tokens);
    if (got != n)
        fail("kvnode_hash_tokens gave %zu keys for %zu blocks", got, n);
    return keys;
}

struct landed { size_t hbm, host; };

/* Put keys[0..n) to `tier`, per_put keys per put_begin, each block filled
 * with its pattern, and commit. */
static struct landed put_blocks_by(kvnode_client *c, const kvnode_key *keys, size_t n, int tier,
                                   size_t per_put, const char *what)
{
    struct landed out = { 0, 0 };
    kvnode_loc *locs = calloc(per_put, sizeof *locs);

    if (!locs)
        fail("out of memory");
    for (size_t i = 0; i < n; i += per_put) {
        size_t m = n - i < per_put ? n - i : per_put;
        kvnode_lease lease = 0;

        lib_ok(c, kvnode_put_begin(c, keys + i, m, tier, &lease, locs), "kvnode_put_begin");
        for (size_t j = 0; j < m; j++) {
            const kvnode_loc *l = &locs[j];

            if (!l->ptr)
                fail("%s: block %zu (key %" PRId64 ") is already stored: a fresh chain was expected",
                     what, i + j, (int64_t)keys[i + j]);
            if (l->tier == KVNODE_TIER_HBM) {
                if (l->device != opt.device)
                    fail("%s: block %zu landed in HBM of device %d, not of the declared device %d",
                         what, i + j, l->device, opt.device);
                out.hbm++;
            } else if (l->tier == KVNODE_TIER_HOST) {
                out.host++;
            } else {
                fail("%s: block %zu has tier %d", what, i + j, l->tier);
            }
            pattern(g.stage, keys[i + j]);
            loc_write(l, g.stage);
        }
        lib_ok(c, kvnode_put_commit(c, lease), "kvnode_put_commit");
    }
    free(locs);
    return out;
}

static struct landed put_blocks(kvnode_client *c, const kvnode_key *keys, size_t n, int tier,
                                const char *what)
{
    return put_blocks_by(c, keys, n, tier, CHUNK, what);
}

/* Read leases over keys[0..n): locs[i] for each key, leases[k] per chunk. */
static size_t get_all(kvnode_client *c, const kvnode_key *keys, size_t n, kvnode_loc *locs,
                      kvnode_lease *leases, const char *what)
{
    size_t nl = 0;

    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK, got = 0;

        lib_ok(c, kvnode_get_begin(c, keys + i, m, &leases[nl], locs + i, &got),
               "kvnode_get_begin");
        nl++;
        if (got != m)
            fail("%s: only %zu of the %zu blocks %zu.. are stored (key %" PRId64 " is missing)",
                 what, got, m, i, (int64_t)keys[i + got]);
    }
    return nl;
}

static void end_all(kvnode_client *c, const kvnode_lease *leases, size_t nl)
{
    for (size_t k = 0; k < nl; k++)
        lib_ok(c, kvnode_get_end(c, leases[k]), "kvnode_get_end");
}

/* Verify every located block; returns how many are in HBM. */
static size_t verify_locs(const kvnode_key *keys, const kvnode_loc *locs, size_t n, const char *what)
{
    size_t hbm = 0;

    for (size_t i = 0; i < n; i++) {
        if (locs[i].tier == KVNODE_TIER_HBM) {
            if (locs[i].device != opt.device)
                fail("%s: block %zu is in HBM of device %d, not %d", what, i, locs[i].device,
                     opt.device);
            hbm++;
        }
        loc_read(&locs[i], g.stage);
        verify(g.stage, keys[i], what, i, &locs[i]);
    }
    return hbm;
}

/* get_begin + verify + get_end over keys[0..n); returns how many were in HBM. */
static size_t verify_keys(kvnode_client *c, const kvnode_key *keys, size_t n, const char *what)
{
    kvnode_loc *locs = calloc(n, sizeof *locs);
    kvnode_lease *leases = calloc(n / CHUNK + 1, sizeof *leases);

    if (!locs || !leases)
        fail("out of memory");
    size_t nl = get_all(c, keys, n, locs, leases, what);
    size_t hbm = verify_locs(keys, locs, n, what);
    end_all(c, leases, nl);
    free(locs);
    free(leases);
    return hbm;
}

/* Verify a device (or, in sim mode, host) buffer holding keys[0..n) in order. */
static void verify_scratch(const uint8_t *buf, const kvnode_key *keys, size_t n, const char *what)
{
    kvnode_loc l = { .tier = use_cuda() ? KVNODE_TIER_HBM : KVNODE_TIER_HOST, .device = opt.device };

    for (size_t i = 0; i < n; i++) {
        l.ptr = (void *)(uintptr_t)(buf + i * opt.bb);
        loc_read(&l, g.stage);
        verify(g.stage, keys[i], what, i, &l);
    }
}

/* --- stats -------------------------------------------------------------- */

static json_t *stats(void)
{
    char *text = NULL;
    json_error_t err;

    lib_ok(g.obs, kvnode_stats_json(g.obs, &text), "kvnode_stats_json");
    json_t *doc = json_loads(text, 0, &err);
    free(text);
    if (!doc)
        fail("stats: not JSON: %s (line %d)", err.text, err.line);
    return doc;
}

static json_t *jpath(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    if (v && b)
        v = json_object_get(v, b);
    return v;
}

static double jnum(json_t *o, const char *a, const char *b)
{
    json_t *v = jpath(o, a, b);
    if (!json_is_number(v))
        fail("stats: %s%s%s is missing or not a number", a, b ? "." : "", b ? b : "");
    return json_number_value(v);
}

/* tiers.hbm[] entry of device dev. */
static json_t *hbm_of(json_t *doc, int dev)
{
    json_t *arr = jpath(doc, "tiers", "hbm"), *e;
    size_t i;

    if (!json_is_array(arr))
        fail("stats: tiers.hbm is missing: the daemon has no HBM tier");
    json_array_foreach(arr, i, e) {
        json_t *d = json_object_get(e, "device");
        if (json_is_integer(d) && json_integer_value(d) == dev)
            return e;
    }
    fail("stats: tiers.hbm has no entry for device %d (%zu entries): the daemon does not lend "
         "that device's memory", dev, json_array_size(arr));
}

struct demo_state {
    double cap, used, blocks, moving, high, low;
    double bytes, secs, nblocks, batches, transfers, pending, failed, dropped, aborted;
    /* the store's ("persist"); all 0 without one */
    bool store;
    bool write_through;
    double writing;                  /* bytes pinned by store writes, in flight or waiting */
    double written, write_failures;
};

/* The "persist" figures of doc into s (left 0 when the backend is off). */
static void store_figures(json_t *doc, struct demo_state *s)
{
    json_t *p = json_object_get(doc, "persist");
    json_t *backend = json_object_get(p, "backend"), *policy = json_object_get(p, "policy");
    json_t *fails = jpath(p, "failures_total", "write"), *v;
    const char *k;

    if (!json_is_string(backend) || strcmp(json_string_value(backend), "off") == 0)
        return;
    s->store = true;
    s->write_through = json_is_string(policy) && strcmp(json_string_value(policy), "write_through") == 0;
    s->writing = jnum(p, "pinned_for_writes_bytes", NULL) + jnum(p, "writes_waiting", NULL);
    s->written = jnum(p, "written_blocks_total", NULL);
    if (!json_is_object(fails))
        fail("stats: persist.failures_total.write is missing");
    json_object_foreach(fails, k, v) {
        if (json_is_number(v))
            s->write_failures += json_number_value(v);
    }
}

static struct demo_state demo_state(void)
{
    json_t *doc = stats(), *h = hbm_of(doc, opt.device);
    json_t *pend = jpath(doc, "demotions", "batches_pending");
    struct demo_state s = {
        .cap = jnum(h, "capacity_bytes", NULL),
        .used = jnum(h, "used_bytes", NULL),
        .blocks = jnum(h, "blocks", NULL),
        .moving = jnum(h, "moving_bytes", NULL),
        .high = jnum(doc, "demotions", "high_watermark"),
        .low = jnum(doc, "demotions", "low_watermark"),
        .bytes = jnum(doc, "demotions", "bytes_total"),
        .secs = jnum(doc, "demotions", "copy_seconds_total"),
        .nblocks = jnum(doc, "demotions", "blocks_total"),
        .batches = jnum(doc, "demotions", "batches_total"),
        .transfers = jnum(doc, "demotions", "transfers_total"),
        .pending = json_is_number(pend) ? json_number_value(pend) : 0,
        .failed = jnum(doc, "demotions", "failed_total"),
        .dropped = jnum(doc, "demotions", "dropped_total"),
        .aborted = jnum(doc, "demotions", "aborted_total"),
    };
    store_figures(doc, &s);
    json_decref(doc);
    return s;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* --- the checks ---------------------------------------------------------- */

static void setup_device(void)
{
#ifdef KVNODE_HAVE_CUDA
    if (use_cuda()) {
        int count = 0;
        struct cudaDeviceProp prop;
        cudaError_t err = cudaGetDeviceCount(&count);

        if (err != cudaSuccess)
            fail("no usable CUDA device: cudaGetDeviceCount: %s (cudaError %d); on a machine "
                 "without a GPU use --sim", cudaGetErrorString(err), (int)err);
        if (opt.device >= count)
            fail("--device %d: only %d CUDA device(s) visible", opt.device, count);
        cuda_ok(cudaSetDevice(opt.device), "cudaSetDevice");
        cuda_ok(cudaFree(NULL), "CUDA context creation");
        cuda_ok(cudaGetDeviceProperties(&prop, opt.device), "cudaGetDeviceProperties");
        printf(PROG ": CUDA device %d: %s, %.1f GiB\n", opt.device, prop.name,
               (double)prop.totalGlobalMem / (double)(1ull << 30));
        return;
    }
#endif
    printf(PROG ": sim mode: the daemon's HBM is host memory; every figure below is a memcpy "
           "figure, not a GPU figure\n");
}

static kvnode_client *connect_engine(const kvnode_layout *l, const char *which)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect_device(opt.socket, l, opt.device, &c);

    if (rc != 0)
        fail("kvnode_connect_device(%s, device %d) for the %s connection: %s (%d): %s",
             opt.socket, opt.device, which, kvnode_strerror(rc), rc, kvnode_connect_error());
    if (kvnode_cuda_device(c) != opt.device)
        fail("the %s connection declares CUDA device %d, not %d", which, kvnode_cuda_device(c),
             opt.device);
    return c;
}

static uint64_t parse_size(const char *s, const char *name)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;

    if (errno || end == s)
        goto bad;
    if (!strcmp(end, "") || !strcmp(end, "B"))
        mul = 1;
    else if (!strcmp(end, "K") || !strcmp(end, "KiB"))
        mul = 1ull << 10;
    else if (!strcmp(end, "M") || !strcmp(end, "MiB"))
        mul = 1ull << 20;
    else if (!strcmp(end, "G") || !strcmp(end, "GiB"))
        mul = 1ull << 30;
    else
        goto bad;
    if (v > UINT64_MAX / mul)
        goto bad;
    return v * mul;
bad:
    fprintf(stderr, PROG ": %s: '%s' is not a size (e.g. 262144, 256KiB, 1MiB)\n", name, s);
    printf(PROG ": FAIL: usage: %s: '%s' is not a size\n", name, s);
    exit(2);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvnode-gpu-check --socket PATH [--device N] [--sim] [--blocks N]\n"
            "                        [--block-bytes B] [--iters N] [--settle-timeout S]\n"
            "  --socket PATH       kvnoded's socket (required)\n"
            "  --device N          the CUDA device to declare (default 0)\n"
            "  --sim               the daemon runs hbm.backend=sim: no CUDA calls here, memcpy figures\n"
            "  --blocks N          blocks per phase (default 64)\n"
            "  --block-bytes B     bytes per block, a multiple of 8 (default 256KiB)\n"
            "  --iters N           timed rounds per bandwidth figure (default 8)\n"
            "  --settle-timeout S  seconds the demotions may take to settle (default 60)\n");
}

/* A usage error: the usage on stderr, the verdict line last, status 2. */
static void usage_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void usage_fail(const char *fmt, ...)
{
    va_list ap;

    usage(stderr);
    fflush(stderr);
    printf(PROG ": FAIL: usage: ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;

        if (!strcmp(a, "--sim")) {
            opt.sim = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!v)
            usage_fail("%s: unknown option or missing value", a);
        i++;
        errno = 0;
        if (!strcmp(a, "--socket")) {
            opt.socket = v;
        } else if (!strcmp(a, "--device")) {
            long d = strtol(v, &end, 10);
            if (errno || *end || d < 0 || d > 1024)
                goto bad;
            opt.device = (int)d;
        } else if (!strcmp(a, "--blocks")) {
            unsigned long n = strtoul(v, &end, 10);
            if (errno || *end || n < 1 || n > 1000000)
                goto bad;
            opt.blocks = n;
        } else if (!strcmp(a, "--block-bytes")) {
            opt.bb = parse_size(v, a);
            if (opt.bb < 8 || opt.bb % 8 || opt.bb > (1ull << 30))
                goto bad;
        } else if (!strcmp(a, "--iters")) {
            unsigned long n = strtoul(v, &end, 10);
            if (errno || *end || n < 1 || n > 100000)
                goto bad;
            opt.iters = (unsigned)n;
        } else if (!strcmp(a, "--settle-timeout")) {
            unsigned long n = strtoul(v, &end, 10);
            if (errno || *end || n < 1 || n > 3600)
                goto bad;
            opt.settle_s = (unsigned)n;
        } else {
            usage_fail("unknown option %s", a);
        }
        continue;
bad:
        usage_fail("%s: invalid value '%s'", a, v);
    }
    if (!opt.socket)
        usage_fail("--socket is required");
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifndef KVNODE_HAVE_CUDA
    if (!opt.sim)
        fail("built without CUDA: use --sim (or rebuild with the CUDA toolkit: make CUDA=1)");
#endif
    g.salt = mix64((uint64_t)getpid() ^ ((uint64_t)time(NULL) << 20));
    const size_t n = opt.blocks, bb = (size_t)opt.bb;
    const double total = (double)n * (double)bb;

    setup_device();
    g.stage = mem_alloc(MEM_PINNED, bb, "staging buffer");
    g.expect = mem_alloc(MEM_HOST, bb, "pattern buffer");

    kvnode_layout layout = {
        .model = "kvnode-gpu-check", .dtype = "bf16", .block_tokens = BLOCK_TOKENS,
        .block_bytes = opt.bb, .num_layers = 1, .kv_heads = 1, .head_dim = 128,
        .tp_size = 1, .tp_rank = 0, .extra = NULL,
    };
    int rc = kvnode_connect(opt.socket, NULL, &g.obs);
    if (rc != 0)
        fail("kvnode_connect(%s) (observer): %s (%d): %s", opt.socket, kvnode_strerror(rc), rc,
             kvnode_connect_error());
    g.c1 = connect_engine(&layout, "first");
    struct demo_state s_init = demo_state();   /* also: the HBM tier of our device exists */
    {
        const struct demo_state s = s_init;
        printf(PROG ": %s, device %d: HBM arena %.0f MiB (%.0f MiB used), demotion at %.0f%% "
               "down to %.0f%%; %zu blocks of %zu KiB per phase\n", opt.socket, opt.device,
               s.cap / 1048576.0, s.used / 1048576.0, 100 * s.high, 100 * s.low, n, bb / 1024);
        if (total > s.high * s.cap - s.used)
            fail("%zu blocks of %zu bytes do not fit under the HBM high watermark (%.0f of %.0f "
                 "bytes free below it): use fewer or smaller blocks, or more hbm.bytes", n, bb,
                 s.high * s.cap - s.used, s.cap);
        printf(PROG ": persistent store: %s\n", !s.store ? "none" : s.write_through
               ? "on, write_through (every block is pinned until its write lands)" : "on");
    }

    /* (a) put to HBM */
    kvnode_key *akeys = make_keys(n, 1);
    struct landed la = put_blocks(g.c1, akeys, n, KVNODE_TIER_HBM, "put to HBM");
    if (la.hbm != n)
        fail("put to HBM: %zu of %zu blocks landed in HBM (device %d), %zu fell back to host "
             "memory%s", la.hbm, n, opt.device, la.host,
             opt.sim ? "" : " (libkvnode needs a CUDA runtime, libcudart.so, on the library path "
                            "to be lent CUDA IPC memory)");
    kvnode_tiers t;
    lib_ok(g.c1, kvnode_match_tiers(g.c1, akeys, n, &t), "kvnode_match_tiers");
    if (t.matched != n || t.hbm != n)
        fail("match_tiers after the HBM put: %zu matched, %zu in HBM, %zu in host memory (want "
             "%zu in HBM)", t.matched, t.hbm, t.host, n);
    printf("(a) put %zu blocks to HBM: all %zu in HBM of device %d, committed; match_tiers agrees\n",
           n, la.hbm, opt.device);

    /* (b) get and verify, on both connections */
    kvnode_loc *alocs = mem_alloc(MEM_HOST, n * sizeof *alocs, "locations");
    kvnode_lease *aleases = mem_alloc(MEM_HOST, (n / CHUNK + 1) * sizeof *aleases, "leases");
    size_t anl = get_all(g.c1, akeys, n, alocs, aleases, "get of the HBM blocks");
    size_t hbm1 = verify_locs(akeys, alocs, n, "get of the HBM blocks");
    if (hbm1 != n)
        fail("get of the HBM blocks: %zu of %zu are in HBM", hbm1, n);
    g.c2 = connect_engine(&layout, "second");
    size_t hbm2 = verify_keys(g.c2, akeys, n, "get on the second connection");
    if (hbm2 != n)
        fail("get on the second connection: %zu of %zu are in HBM", hbm2, n);
    printf("(b) get: %zu blocks byte-exact %s; second connection (own %s): %zu byte-exact in HBM\n",
           n, opt.sim ? "(read through the mapping)" : "(cudaMemcpy device -> host)",
           opt.sim ? "mapping" : "IPC open", hbm2);

    /* (c1) device-to-device reads out of the lent arena */
    printf("(c) bandwidth, %zu x %zu KiB = %.1f MiB per round, %u rounds%s\n", n, bb / 1024,
           total / 1048576.0, opt.iters,
           opt.sim ? " (sim: memcpy on this CPU, NOT GPU figures)" : "");
    uint8_t *scratch = mem_alloc(MEM_DEV, n * bb, "scratch buffer");
    uint8_t *peer = mem_alloc(MEM_DEV, n * bb, "peak buffer");
    void **dsts = mem_alloc(MEM_HOST, n * sizeof *dsts, "copy list");
    const void **srcs = mem_alloc(MEM_HOST, n * sizeof *srcs, "copy list");
    for (size_t i = 0; i < n; i++) {
        dsts[i] = scratch + i * bb;
        srcs[i] = alocs[i].ptr;
    }
    double s_d2d = time_copies(dsts, srcs, n, bb, opt.iters, "D2D copy out of the lent arena");
    verify_scratch(scratch, akeys, n, "D2D copy out of the lent arena");
    double p_d2d = time_peak(peer, scratch, n, bb, opt.iters, "peak D2D copy");
    report(opt.sim ? "HBM(sim) -> buffer, per block" : "lent HBM -> cudaMalloc, per block",
           total * opt.iters, s_d2d, opt.sim ? "memcpy, same blocks" : "cudaMemcpy D2D, one copy",
           total * opt.iters, p_d2d);
    end_all(g.c1, aleases, anl);

    /* (c2) host-to-device copies out of the pinned host arena */
    kvnode_key *hkeys = make_keys(n, 2);
    struct landed lh = put_blocks(g.c1, hkeys, n, KVNODE_TIER_HOST, "put to host memory");
    if (lh.host != n)
        fail("put to host memory: %zu of %zu blocks landed in host memory", lh.host, n);
    if (use_cuda()) {
        double t0 = now_s();
        lib_ok(g.c1, kvnode_pin_host(g.c1), "kvnode_pin_host");
        printf("    kvnode_pin_host: the host arena is page-locked in this process (%.2f s)\n",
               now_s() - t0);
    } else {
        printf("    kvnode_pin_host: skipped (sim: no CUDA calls; the daemon's own pinning is "
               "checked by gpu-check.sh)\n");
    }
    anl = get_all(g.c1, hkeys, n, alocs, aleases, "get of the host blocks");
    if (verify_locs(hkeys, alocs, n, "get of the host blocks") != 0)
        fail("get of the host blocks: some are in HBM");
    for (size_t i = 0; i < n; i++)
        srcs[i] = alocs[i].ptr;
    double s_h2d = time_copies(dsts, srcs, n, bb, opt.iters, "H2D copy out of the host arena");
    verify_scratch(scratch, hkeys, n, "H2D copy out of the host arena");
    end_all(g.c1, aleases, anl);
    uint8_t *pinned = mem_alloc(MEM_PINNED, n * bb, "pinned peak buffer");
    double p_h2d = time_peak(peer, pinned, n, bb, opt.iters, "peak H2D copy");
    report(opt.sim ? "host arena -> buffer, per block" : "pinned host arena -> GPU, per block",
           total * opt.iters, s_h2d, opt.sim ? "memcpy, same blocks" : "cudaMemcpy H2D from cudaMallocHost",
           total * opt.iters, p_h2d);

    /* (c3) demotion: fill HBM past the high watermark, wait for it to settle */
    struct demo_state s0 = demo_state();
    double stride = s0.blocks > 0 ? s0.used / s0.blocks : (double)bb;
    double target = s0.cap * (s0.high + (1.0 - s0.high) / 2.0);
    size_t nd = s0.used < target ? (size_t)((target - s0.used) / stride) + 2 : 2;
    kvnode_key *dkeys = make_keys(nd, 3);
    double t_fill = now_s();
    struct landed ld = put_blocks(g.c1, dkeys, nd, KVNODE_TIER_HBM, "put past the watermark");
    t_fill = now_s() - t_fill;
    struct demo_state s = s0, prev = s0;
    double deadline = now_s() + opt.settle_s;
    bool settled = false;
    for (;;) {
        s = demo_state();
        if (s.failed > s0.failed)
            fail("demotion: %.0f demotion(s) failed (see the daemon's log)", s.failed - s0.failed);
        if (s.bytes > s0.bytes && s.pending == 0 && s.moving == 0 && s.writing == 0 &&
            s.used <= s.high * s.cap && s.bytes == prev.bytes && s.nblocks == prev.nblocks) {
            settled = true;
            break;
        }
        if (now_s() > deadline)
            break;
        prev = s;
        sleep_ms(25);
    }
    if (!settled)
        fail("demotion did not settle within %u s: HBM %.0f of %.0f bytes used (high watermark "
             "%.2f), %.0f moving, %.0f batches pending, %.0f bytes demoted so far (%zu of %zu "
             "blocks put landed in HBM)%s%.0f bytes pinned by store writes", opt.settle_s, s.used,
             s.cap, s.high, s.moving, s.pending, s.bytes - s0.bytes, ld.hbm, nd,
             s.store ? ", " : "", s.writing);
    double dbytes = s.bytes - s0.bytes, dsecs = s.secs - s0.secs;
    printf("    demotion: put %zu blocks (%zu to HBM, %zu fell back to host) in %.2f s; %.0f blocks "
           "(%.1f MiB) demoted in %.0f batches / %.0f transfers, %.3f s of copying; HBM now %.0f%% "
           "used; %.0f dropped, %.0f aborted\n", nd, ld.hbm, ld.host, t_fill,
           s.nblocks - s0.nblocks, dbytes / 1048576.0, s.batches - s0.batches,
           s.transfers - s0.transfers, dsecs, 100 * s.used / s.cap, s.dropped - s0.dropped,
           s.aborted - s0.aborted);
    if (opt.sim)
        printf("    (sim: the daemon's demotion copies write host-arena pages for the first time; "
               "where first touches are slow, as in VMs, that dominates this figure)\n");
    double p_d2h = time_peak(pinned, scratch, n, bb, opt.iters, "peak D2H copy");
    if (dsecs > 0)
        report(opt.sim ? "demotion HBM(sim) -> host (daemon)" : "demotion HBM -> host (daemon)",
               dbytes, dsecs, opt.sim ? "memcpy, same blocks" : "cudaMemcpy D2H to cudaMallocHost",
               total * opt.iters, p_d2h);
    else
        printf("  %s %-40s %9s        (copy_seconds_total did not advance)\n", mode_label(),
               "demotion HBM -> host (daemon)", "n/a");

    /* every block again, demoted ones from host memory */
    size_t dh = verify_keys(g.c1, dkeys, nd, "get after demotion");
    size_t ah = verify_keys(g.c1, akeys, n, "get of the first blocks after demotion");
    /* Demotion takes the least recently used blocks first: when the arena
     * held only ours at the start, some of ours must have moved. */
    if (dh + ah == nd + n && s_init.blocks == 0)
        fail("after demotion every block is still in HBM: nothing was moved to host memory");
    printf("    after demotion: %zu + %zu blocks byte-exact (%zu still in HBM, %zu in host memory)\n",
           nd, n, dh + ah, nd + n - dh - ah);

    /* (d) the store: under write_through every block put here was written */
    if (s.store) {
        double want = s.write_through ? (double)(n + n + nd) : 0;
        struct demo_state w = s;
        deadline = now_s() + opt.settle_s;
        while ((w.written - s_init.written < want || w.writing > 0) && now_s() < deadline) {
            sleep_ms(25);
            w = demo_state();
        }
        if (w.write_failures > s_init.write_failures)
            fail("store: %.0f write(s) failed (see persist.last_error in /stats)",
                 w.write_failures - s_init.write_failures);
        if (w.written - s_init.written < want || w.writing > 0)
            fail("store: %.0f of the %.0f blocks put were written within %u s (%.0f bytes still "
                 "pinned by writes)", w.written - s_init.written, want, opt.settle_s, w.writing);
        printf("(d) store: %.0f blocks written (%zu put to HBM, written through a device copy), "
               "none failed\n", w.written - s_init.written, n + ld.hbm);
    }

    /* the second connection, once the first has closed */
    kvnode_close(g.c1);
    g.c1 = NULL;
    size_t h2 = verify_keys(g.c2, dkeys, nd, "second connection after the first closed");
    printf("(b') second connection after the first closed: %zu blocks byte-exact (%zu in HBM)\n",
           nd, h2);

    /* (e) demotion of an arena where every block is pinned by its write */
    if (s.store && s.write_through && s_init.blocks == 0) {
        size_t gone = 0;
        lib_ok(g.c2, kvnode_delete(g.c2, akeys, n, &gone), "kvnode_delete");
        lib_ok(g.c2, kvnode_delete(g.c2, dkeys, nd, &gone), "kvnode_delete");
        struct demo_state e = demo_state();
        deadline = now_s() + opt.settle_s;
        while (e.used > 0 && now_s() < deadline) {
            sleep_ms(25);
            e = demo_state();
        }
        if (e.used > 0)
            fail("(e): %.0f HBM bytes still used %u s after our blocks were deleted", e.used,
                 opt.settle_s);
        size_t ne = (size_t)((e.high + (1.0 - e.high) / 2.0) * e.cap / stride);
        kvnode_key *ekeys = make_keys(ne, 5);
        struct landed le = put_blocks_by(g.c2, ekeys, ne, KVNODE_TIER_HBM, ne, "one put past the watermark");
        if (le.hbm != ne)
            fail("(e): %zu of the %zu blocks of one put into an empty arena landed in HBM", le.hbm, ne);
        struct demo_state e0 = e;
        deadline = now_s() + opt.settle_s;
        bool done = false;
        for (;;) {
            e = demo_state();
            if (e.failed > e0.failed)
                fail("(e): %.0f demotion(s) failed", e.failed - e0.failed);
            if (e.writing == 0 && e.pending == 0 && e.moving == 0 && e.used <= e.low * e.cap) {
                done = true;
                break;
            }
            if (now_s() > deadline)
                break;
            sleep_ms(25);
        }
        if (!done)
            fail("(e): %u s after one put of %zu blocks took the arena to %.0f%% (high watermark "
                 "%.0f%%), it is at %.0f%% with %.0f bytes pinned by store writes, %.0f moving, "
                 "%.0f batches pending, %.0f blocks demoted: demotion did not resume when the "
                 "writes landed", opt.settle_s, ne, 100.0 * (double)ne * stride / e.cap,
                 100 * e.high, 100 * e.used / e.cap, e.writing, e.moving, e.pending,
                 e.nblocks - e0.nblocks);
        if (e.write_failures > s_init.write_failures)
            fail("(e): %.0f store write(s) failed", e.write_failures - s_init.write_failures);
        size_t eh = verify_keys(g.c2, ekeys, ne, "get after the writes landed");
        printf("(e) one put of %zu blocks into an empty arena (%.0f%%, every block pinned by its "
               "store write): once written, %.0f demoted, HBM at %.0f%% (low watermark %.0f%%); "
               "%zu byte-exact, %zu in HBM\n", ne, 100.0 * (double)ne * stride / e.cap,
               e.nblocks - e0.nblocks, 100 * e.used / e.cap, 100 * e.low, ne, eh);
    } else if (s.store && s.write_through) {
        printf("(e) skipped: the HBM arena held %.0f blocks not ours at the start\n", s_init.blocks);
    }
    kvnode_close(g.c2);
    g.c2 = NULL;
    kvnode_close(g.obs);
    g.obs = NULL;
    mem_free_all();
    printf(PROG ": PASS\n");
    return 0;
}
