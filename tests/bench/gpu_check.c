/* kvnode-gpu-check: one behaviour of the GPU path per run, seen from an
 * engine process (scripts/gpu-check.sh starts the daemons and runs each).
 *
 *   kvnode-gpu-check BEHAVIOUR --socket PATH [options]
 *
 * It links libkvnode.so as an engine does and loads the CUDA runtime with
 * dlopen (gpu_check_cuda.c), so libkvnode's own run-time lookup finds that
 * same runtime: the path a real engine takes. No CUDA toolkit is needed to
 * build it; under `gpu-check.sh --sim` the runtime it finds is the strict
 * fake (tests/fakecuda) through LD_LIBRARY_PATH.
 *
 * Every block written carries its key and a generation in its first two
 * words and a pattern derived from both in the rest, so a read can tell a
 * block that is whole from one torn or taken from another key. Device
 * memory is read back on a fresh non-blocking stream (which waits for
 * nothing), so a copy libkvnode left running is seen as wrong bytes.
 *
 * Output: detail lines, then one line `RESULT PASS|FAIL|SKIP: <summary>`.
 * Exit status 0 PASS, 1 FAIL, 77 SKIP, 2 usage. Figures are printed, never
 * asserted. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "gpu_check_cuda.h"
#include "kvnode.h"

extern char **environ;

#define CHUNK 32u   /* keys per put_begin */

static struct {
    const char *behaviour, *socket, *sync, *expect, *self;
    int device;
    size_t blocks;
    uint64_t bb;
    unsigned seconds, connects, procs, timeout_s;
    uint64_t salt;
} opt = { .device = 0, .blocks = 16, .bb = 256 * 1024, .seconds = 20, .connects = 50,
          .procs = 4, .timeout_s = 60 };

/* --- results ------------------------------------------------------------- */

enum { R_PASS = 0, R_FAIL = 1, R_SKIP = 77 };

static void result(int kind, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void result(int kind, const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    printf("RESULT %s: ", kind == R_PASS ? "PASS" : kind == R_SKIP ? "SKIP" : "FAIL");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    _exit(kind);
}
#define FAIL(...) result(R_FAIL, __VA_ARGS__)

static void info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void info(const char *fmt, ...)
{
    va_list ap;

    printf("  ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static void cu(int err, const char *what)
{
    if (err != GC_SUCCESS)
        FAIL("%s: %s", what, gc_err(err));
}

static void kv(kvnode_client *c, int rc, const char *what)
{
    if (rc != 0)
        FAIL("%s: %s (%d): %s", what, kvnode_strerror(rc), rc, kvnode_last_error(c));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void *xcalloc(size_t n, size_t each)
{
    void *p = calloc(n ? n : 1, each);
    if (!p)
        FAIL("out of memory (%zu x %zu bytes)", n, each);
    return p;
}

/* --- libkvnode's completion-contract calls -------------------------------- *
 * Looked up at run time so the checker builds and says what is missing
 * against a libkvnode without them. */
static struct {
    int (*put_commit_stream)(kvnode_client *, kvnode_lease, void *);
    int (*get_end_stream)(kvnode_client *, kvnode_lease, void *);
    int (*get_batch_stream)(kvnode_client *, const kvnode_key *, size_t, void *const *, unsigned,
                            void *, size_t *);
    int (*put_batch_stream)(kvnode_client *, const kvnode_key *, size_t, const void *const *,
                            unsigned, void *);
} ks;

/* The table's types are the header's own. */
#define SAME_TYPE(field, fn) \
    _Static_assert(__builtin_types_compatible_p(__typeof__(ks.field), __typeof__(&fn)), #fn)
SAME_TYPE(put_commit_stream, kvnode_put_commit_stream);
SAME_TYPE(get_end_stream, kvnode_get_end_stream);
SAME_TYPE(get_batch_stream, kvnode_get_batch_stream);
SAME_TYPE(put_batch_stream, kvnode_put_batch_stream);

/* Look the calls up; `required`: FAIL without them (the behaviours that
 * check the contract itself), else the others fall back to synchronising
 * the stream and committing plainly. */
static void load_stream_calls_if(bool required)
{
    static const char *const names[] = { "kvnode_put_commit_stream", "kvnode_get_end_stream",
                                         "kvnode_get_batch_stream", "kvnode_put_batch_stream" };
    void *f[4];

    for (int i = 0; i < 4; i++) {
        f[i] = dlsym(RTLD_DEFAULT, names[i]);
        if (!f[i] && required)
            FAIL("libkvnode lacks %s: the completion contract (stream-ordered commit, end and "
                 "batch calls) is not in this build", names[i]);
    }
    memcpy(&ks.put_commit_stream, &f[0], sizeof f[0]);
    memcpy(&ks.get_end_stream, &f[1], sizeof f[1]);
    memcpy(&ks.get_batch_stream, &f[2], sizeof f[2]);
    memcpy(&ks.put_batch_stream, &f[3], sizeof f[3]);
}

static void load_stream_calls(void)
{
    load_stream_calls_if(true);
}

/* --- blocks -------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void fill(void *dst, kvnode_key key, uint64_t gen)
{
    uint64_t *w = dst, s = mix64((uint64_t)key ^ (gen * 0x632be59bd9b4e019ull));

    w[0] = (uint64_t)key;
    w[1] = gen;
    for (size_t i = 2; i < opt.bb / 8; i++)
        w[i] = mix64(s + i);
}

/* -1 when buf is block `key` whole (of generation gen, or any generation
 * when gen is UINT64_MAX), else the byte offset of the first wrong word. */
static long check(const void *buf, kvnode_key key, uint64_t gen)
{
    const uint64_t *w = buf;

    if (w[0] != (uint64_t)key)
        return 0;
    if (gen != UINT64_MAX && w[1] != gen)
        return 8;
    uint64_t s = mix64((uint64_t)key ^ (w[1] * 0x632be59bd9b4e019ull));
    for (size_t i = 2; i < opt.bb / 8; i++)
        if (w[i] != mix64(s + i))
            return (long)(i * 8);
    return -1;
}

static kvnode_key *make_keys(size_t n, uint64_t phase)
{
    kvnode_key *k = xcalloc(n, sizeof *k);
    for (size_t i = 0; i < n; i++)
        k[i] = (kvnode_key)(mix64(opt.salt ^ (phase << 40) ^ i) >> 1);
    return k;
}

/* --- CUDA helpers ---------------------------------------------------------- */

static void cuda_setup(void)
{
    char why[256];

    if (gc_cuda_load(why, sizeof why) < 0)
        FAIL("%s", why);
    cu(gc.set_device(opt.device), "cudaSetDevice");
    cu(gc.free_(NULL), "cudaFree(NULL) (context creation)");
}

/* Device memory for n blocks, zeroed (and the zeroes landed). */
static uint8_t *dev_blocks(size_t n)
{
    void *p = NULL;
    cu(gc.malloc_(&p, n * opt.bb), "cudaMalloc");
    cu(gc.memset_(p, 0, n * opt.bb), "cudaMemset");
    cu(gc.device_sync(), "cudaDeviceSynchronize");
    return p;
}

static void *stream_new(void)
{
    void *s = NULL;
    cu(gc.stream_create(&s, GC_STREAM_NON_BLOCKING), "cudaStreamCreateWithFlags(NonBlocking)");
    return s;
}

/* Copy len device bytes to host on a fresh non-blocking stream: it waits
 * for no other stream, so it sees only copies that have completed. */
static void dev_read(void *host, const void *dptr, size_t len)
{
    void *s = stream_new();
    cu(gc.memcpy_async(host, dptr, len, GC_D2H, s), "cudaMemcpyAsync D2H (fresh stream)");
    cu(gc.stream_sync(s), "cudaStreamSynchronize (fresh stream)");
    cu(gc.stream_destroy(s), "cudaStreamDestroy");
}

/* Fill device blocks keys[0..n) (generation gen) at d, completely. */
static void dev_fill(uint8_t *d, const kvnode_key *keys, size_t n, uint64_t gen)
{
    uint8_t *h = xcalloc(n, opt.bb);
    for (size_t i = 0; i < n; i++)
        fill(h + i * opt.bb, keys[i], gen);
    cu(gc.memcpy_(d, h, n * opt.bb, GC_H2D), "cudaMemcpy H2D");
    cu(gc.device_sync(), "cudaDeviceSynchronize");
    free(h);
}

/* Verify device blocks at d against keys[0..n) / gen; what names the read. */
static void dev_verify(const uint8_t *d, const kvnode_key *keys, size_t n, uint64_t gen,
                       const char *what)
{
    uint8_t *h = xcalloc(n, opt.bb);
    dev_read(h, d, n * opt.bb);
    for (size_t i = 0; i < n; i++) {
        long off = check(h + i * opt.bb, keys[i], gen);
        if (off >= 0)
            FAIL("%s: block %zu of %zu (key %" PRId64 ") is not what was written: first wrong "
                 "word at byte %ld (%s)", what, i, n, (int64_t)keys[i], off,
                 off == 0 ? "another key's block, or nothing" : "torn or stale");
    }
    free(h);
}

static void **ptrs(uint8_t *base, size_t n)
{
    void **p = xcalloc(n, sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = base + i * opt.bb;
    return p;
}

/* --- the daemon ------------------------------------------------------------ */

static kvnode_client *connect_engine(int device, unsigned flags)
{
    /* One deployment per block size: the store remembers a deployment's layout. */
    char model[64];
    snprintf(model, sizeof model, "kvnode-gpu-check-%" PRIu64, opt.bb);
    kvnode_layout l = {
        .model = model, .dtype = "bf16", .block_tokens = 16, .block_bytes = opt.bb,
        .num_layers = 1, .kv_heads = 1, .head_dim = 128, .tp_size = 1, .tp_rank = 0,
    };
    kvnode_client *c = NULL;
    int rc = kvnode_connect_flags(opt.socket, &l, device, flags, &c);

    if (rc != 0)
        FAIL("kvnode_connect_flags(%s, device %d): %s (%d): %s", opt.socket, device,
             kvnode_strerror(rc), rc, kvnode_connect_error());
    return c;
}

static json_t *stats(void)
{
    kvnode_client *o = NULL;
    char *text = NULL;
    json_error_t err;

    if (kvnode_connect(opt.socket, NULL, &o) != 0)
        FAIL("observer connect to %s: %s", opt.socket, kvnode_connect_error());
    kv(o, kvnode_stats_json(o, &text), "kvnode_stats_json");
    kvnode_close(o);
    json_t *doc = json_loads(text, 0, &err);
    free(text);
    if (!doc)
        FAIL("stats: not JSON: %s", err.text);
    return doc;
}

/* A number at a dotted path ("a.b.c"; a number component indexes an array);
 * NAN-free: a missing value fails unless dflt_ok, then it reads dflt. */
static double jnum(json_t *doc, const char *path, bool dflt_ok, double dflt)
{
    char buf[128], *save = NULL;
    json_t *v = doc;

    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save)) {
        if (json_is_array(v))
            v = json_array_get(v, strtoul(k, NULL, 10));
        else
            v = json_object_get(v, k);
    }
    if (json_is_number(v))
        return json_number_value(v);
    if (json_is_boolean(v))
        return json_is_true(v) ? 1 : 0;
    if (!dflt_ok)
        FAIL("stats: %s is missing or not a number", path);
    return dflt;
}

static const char *jstr(json_t *doc, const char *a, const char *b, const char *c)
{
    json_t *v = json_object_get(doc, a);
    if (b)
        v = json_object_get(v, b);
    if (c)
        v = json_object_get(v, c);
    return json_is_string(v) ? json_string_value(v) : "";
}

/* tiers.hbm entry of the device the daemon calls `dev`, NULL when none. */
static json_t *hbm_tier(json_t *doc, int dev)
{
    json_t *arr = json_object_get(json_object_get(doc, "tiers"), "hbm"), *e;
    size_t i;

    json_array_foreach(arr, i, e) {
        json_t *d = json_object_get(e, "device");
        if (json_is_integer(d) && (dev < 0 || json_integer_value(d) == dev))
            return e;
    }
    return NULL;
}

/* Put keys[0..n) of generation gen to HBM under write leases as an engine
 * does: each block copied with cudaMemcpyAsync on `stream`, then the commit
 * ordered after the stream (kvnode_put_commit_stream). Returns how many
 * landed in HBM (the rest fell back to host memory, written with memcpy). */
static size_t put_hbm(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t gen,
                      void *stream)
{
    kvnode_loc *locs = xcalloc(CHUNK, sizeof *locs);
    uint8_t *stage = xcalloc(CHUNK, opt.bb);
    size_t hbm = 0;

    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        kvnode_lease lease = 0;

        kv(c, kvnode_put_begin(c, keys + i, m, KVNODE_TIER_HBM, &lease, locs), "kvnode_put_begin(HBM)");
        for (size_t j = 0; j < m; j++) {
            if (!locs[j].ptr)
                continue;       /* already stored */
            fill(stage + j * opt.bb, keys[i + j], gen);
            if (locs[j].tier == KVNODE_TIER_HBM) {
                hbm++;
                cu(gc.memcpy_async(locs[j].ptr, stage + j * opt.bb, opt.bb, GC_DEFAULT, stream),
                   "cudaMemcpyAsync into a lent HBM block");
            } else {
                memcpy(locs[j].ptr, stage + j * opt.bb, opt.bb);
            }
        }
        if (lease && !ks.put_commit_stream) {
            cu(gc.stream_sync(stream), "cudaStreamSynchronize before kvnode_put_commit");
            kv(c, kvnode_put_commit(c, lease), "kvnode_put_commit");
        } else if (lease) {
            kv(c, ks.put_commit_stream(c, lease, stream), "kvnode_put_commit_stream");
            int q = gc.stream_query(stream);
            if (q != GC_SUCCESS)
                FAIL("cudaStreamQuery right after kvnode_put_commit_stream returned: %s (the "
                     "commit did not wait for the writes queued on the stream)", gc_err(q));
        }
    }
    free(locs);
    free(stage);
    return hbm;
}

static void delete_keys(kvnode_client *c, const kvnode_key *keys, size_t n)
{
    size_t gone = 0;
    kv(c, kvnode_delete(c, keys, n, &gone), "kvnode_delete");
}

/* get_batch(DEVICE) of keys[0..n) into fresh device memory (CHUNK blocks
 * at a time, so a large n takes little GPU memory), each chunk read back on
 * a fresh stream and verified. */
static void get_verify(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t gen,
                       const char *what)
{
    size_t m = n < CHUNK ? n : CHUNK;
    uint8_t *d = dev_blocks(m);
    void **dp = ptrs(d, m);
    char w[160];

    for (size_t i = 0; i < n; i += m) {
        size_t k = n - i < m ? n - i : m, got = 0;
        kv(c, kvnode_get_batch(c, keys + i, k, dp, KVNODE_BATCH_DEVICE, &got),
           "kvnode_get_batch(DEVICE)");
        if (got != k)
            FAIL("%s: kvnode_get_batch found %zu of the %zu blocks from %zu of %zu", what, got,
                 k, i, n);
        snprintf(w, sizeof w, "%s (get_batch(DEVICE), read on a fresh stream; blocks %zu..)",
                 what, i);
        dev_verify(d, keys + i, k, gen, w);
    }
    free(dp);
    cu(gc.free_(d), "cudaFree");
}

/* --- sync with the script ---------------------------------------------------- */

static void sync_step(const char *name)
{
    char path[512];
    FILE *f;

    if (!opt.sync)
        FAIL("--sync DIR is required for %s", opt.behaviour);
    snprintf(path, sizeof path, "%s/%s.ready", opt.sync, name);
    if (!(f = fopen(path, "w")))
        FAIL("%s: %s", path, strerror(errno));
    fclose(f);
    snprintf(path, sizeof path, "%s/%s.go", opt.sync, name);
    double end = now_s() + opt.timeout_s;
    while (access(path, F_OK) != 0) {
        if (now_s() > end)
            FAIL("the script did not answer %s.ready within %u s", name, opt.timeout_s);
        sleep_ms(20);
    }
}

/* --- behaviours -------------------------------------------------------------- */

static const char *mode_name(int m)
{
    switch (m) {
    case 0: return "Default";
    case 1: return "Exclusive Thread";
    case 2: return "Prohibited";
    case 3: return "Exclusive Process";
    default: return "unknown";
    }
}

/* Versions, and per visible device: bus id, compute mode, name. Lines
 * starting "device " and "versions " are read by the script. */
static void b_preflight(void)
{
    char why[256];
    int drv = 0, rtv = 0, count = 0;

    if (gc_cuda_load(why, sizeof why) < 0)
        FAIL("%s", why);
    cu(gc.driver_version(&drv), "cudaDriverGetVersion");
    cu(gc.runtime_version(&rtv), "cudaRuntimeGetVersion");
    printf("versions driver=%d runtime=%d lib=%s\n", drv, rtv, gc.lib);
    cu(gc.get_device_count(&count), "cudaGetDeviceCount");
    if (gc.cu_init)
        (void)gc.cu_init(0);
    int mode_here = -1;
    bool mig_here = false;
    for (int d = 0; d < count; d++) {
        char bus[64] = "?", name[256] = "?";
        int mode = -1, cud = 0;

        cu(gc.pci_bus_id(bus, sizeof bus, d), "cudaDeviceGetPCIBusId");
        cu(gc.device_attr(&mode, GC_ATTR_COMPUTE_MODE, d), "cudaDeviceGetAttribute(ComputeMode)");
        if (gc.cu_device_get && gc.cu_device_name && gc.cu_device_get(&cud, d) == 0)
            (void)gc.cu_device_name(name, sizeof name, cud);
        bool mig = strstr(name, "MIG") != NULL;
        printf("device %d bus=%s mode=%d mig=%d name=%s\n", d, bus, mode, mig ? 1 : 0, name);
        if (d == opt.device) {
            mode_here = mode;
            mig_here = mig;
        }
    }
    if (opt.device >= count)
        FAIL("device %d is not visible (%d device(s))", opt.device, count);
    if (drv / 1000 < rtv / 1000)
        FAIL("driver supports CUDA %d.%d, older than the runtime's major version %d.%d: an engine "
             "on this runtime cannot start", drv / 1000, drv % 1000 / 10, rtv / 1000,
             rtv % 1000 / 10);
    if (mode_here == 2 || mode_here == 3)
        FAIL("device %d is in %s compute mode: engines could not share it with kvnoded (kvnoded "
             "refuses HBM on it)", opt.device, mode_name(mode_here));
    if (mig_here)
        FAIL("device %d is a MIG instance (kvnoded refuses HBM on it)", opt.device);
    result(R_PASS, "driver CUDA %d.%d, runtime %d.%d (%s); device %d: compute mode %s, not MIG",
           drv / 1000, drv % 1000 / 10, rtv / 1000, rtv % 1000 / 10, gc.lib, opt.device,
           mode_name(mode_here));
}

/* A client of this process's device opt.device (as CUDA_VISIBLE_DEVICES
 * numbers it): --expect hbm: it is lent HBM and a round trip is byte-exact;
 * --expect none: its GPU serves no HBM, so its HBM puts fall back to host. */
static void b_identity(void)
{
    bool want_hbm = !opt.expect || strcmp(opt.expect, "none") != 0;
    char bus[64] = "?";
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");

    cuda_setup();
    load_stream_calls_if(false);
    cu(gc.pci_bus_id(bus, sizeof bus, opt.device), "cudaDeviceGetPCIBusId");
    info("CUDA_VISIBLE_DEVICES=%s: device %d is %s", cvd ? cvd : "(unset)", opt.device, bus);
    kvnode_client *c = connect_engine(opt.device, 0);
    size_t n = opt.blocks;
    kvnode_key *keys = make_keys(n, 11);
    void *s = stream_new();
    size_t hbm = put_hbm(c, keys, n, 1, s);
    if (want_hbm) {
        if (hbm != n)
            FAIL("device %s: %zu of %zu HBM puts landed in HBM (%s)", bus, hbm, n,
                 kvnode_last_error(c));
        get_verify(c, keys, n, 1, "HBM round trip");
        delete_keys(c, keys, n);
        result(R_PASS, "CUDA_VISIBLE_DEVICES=%s device %d (%s): lent HBM, %zu blocks byte-exact",
               cvd ? cvd : "(unset)", opt.device, bus, n);
    }
    if (hbm != 0)
        FAIL("device %s serves no HBM, yet %zu of %zu HBM puts landed in HBM: the daemon matched "
             "another GPU (an ordinal fallback?)", bus, hbm, n);
    delete_keys(c, keys, n);
    result(R_PASS, "CUDA_VISIBLE_DEVICES=%s device %d (%s): no HBM lent, puts fell back to host",
           cvd ? cvd : "(unset)", opt.device, bus);
}

/* get_batch_stream(DEVICE) of keys[0..n) on stream s into dst (its n
 * block pointers dp), zeroed first; all n must be found (blocks names them
 * in the failure) and byte-exact (what names the read). */
static void get_stream_verify(kvnode_client *c, const kvnode_key *keys, size_t n, uint8_t *dst,
                              void **dp, void *s, uint64_t gen, const char *blocks, const char *what)
{
    size_t got = 0;

    cu(gc.memset_(dst, 0, n * opt.bb), "cudaMemset");
    cu(gc.device_sync(), "cudaDeviceSynchronize");
    kv(c, ks.get_batch_stream(c, keys, n, dp, KVNODE_BATCH_DEVICE, s, &got),
       "kvnode_get_batch_stream(DEVICE)");
    if (got != n)
        FAIL("kvnode_get_batch_stream found %zu of %zu %s", got, n, blocks);
    dev_verify(dst, keys, n, gen, what);
}

/* The batch device API both ways, plain and stream-ordered, host and HBM. */
static void b_batch(void)
{
    cuda_setup();
    kvnode_client *c = connect_engine(opt.device, 0);
    size_t n = opt.blocks, got = 0;
    kvnode_key *k1 = make_keys(n, 21), *k2 = make_keys(n, 22), *k3 = make_keys(n, 23);
    uint8_t *src = dev_blocks(n), *dst = dev_blocks(n);
    void **sp = ptrs(src, n), **dp = ptrs(dst, n);
    double t;

    /* plain: device -> cache (host tier) -> device */
    dev_fill(src, k1, n, 1);
    t = now_s();
    kv(c, kvnode_put_batch(c, k1, n, (const void *const *)sp, KVNODE_BATCH_DEVICE),
       "kvnode_put_batch(DEVICE)");
    double t_put = now_s() - t;
    t = now_s();
    kv(c, kvnode_get_batch(c, k1, n, dp, KVNODE_BATCH_DEVICE, &got), "kvnode_get_batch(DEVICE)");
    double t_get = now_s() - t;
    if (got != n)
        FAIL("kvnode_get_batch(DEVICE) found %zu of %zu blocks just put", got, n);
    dev_verify(dst, k1, n, 1, "put_batch(DEVICE) then get_batch(DEVICE)");
    info("put_batch/get_batch(DEVICE): %zu x %" PRIu64 " KiB byte-exact; %.2f / %.2f GB/s", n,
         opt.bb / 1024, (double)(n * opt.bb) / t_put / 1e9, (double)(n * opt.bb) / t_get / 1e9);

    load_stream_calls();
    /* stream-ordered: the source written on s and not synchronised; the
     * put must be ordered after it, the get's copies before s's later work */
    void *s = stream_new();
    uint8_t *h = xcalloc(n, opt.bb);
    for (size_t i = 0; i < n; i++)
        fill(h + i * opt.bb, k2[i], 2);
    cu(gc.memcpy_async(src, h, n * opt.bb, GC_H2D, s), "cudaMemcpyAsync H2D");
    kv(c, ks.put_batch_stream(c, k2, n, (const void *const *)sp, KVNODE_BATCH_DEVICE, s),
       "kvnode_put_batch_stream(DEVICE)");
    get_stream_verify(c, k2, n, dst, dp, s, 2, "blocks", "put_batch_stream then get_batch_stream");
    info("put_batch_stream/get_batch_stream(DEVICE) on a caller's non-blocking stream: byte-exact");

    /* HBM blocks: written in place, read back device-to-device */
    size_t hbm = put_hbm(c, k3, n, 3, s);
    if (hbm != n)
        FAIL("%zu of %zu HBM puts landed in HBM", hbm, n);
    get_verify(c, k3, n, 3, "HBM blocks");
    get_stream_verify(c, k3, n, dst, dp, s, 3, "HBM blocks", "HBM blocks through get_batch_stream");
    info("HBM blocks (put in place, commit_stream) read with get_batch and get_batch_stream: "
         "byte-exact");
    delete_keys(c, k1, n);
    delete_keys(c, k2, n);
    delete_keys(c, k3, n);
    kvnode_close(c);
    result(R_PASS, "device <-> cache both ways byte-exact: plain, stream-ordered, host and HBM "
           "blocks (%zu x %" PRIu64 " KiB each)", n, opt.bb / 1024);
}

/* The race: a writer puts and deletes two key sets in turn (so freed HBM
 * slots are taken by other keys); readers get_batch(DEVICE) and read what
 * they got on a fresh stream at once. A lease ended before its copy landed
 * shows as another key's bytes, or a torn block. */
struct race {
    kvnode_key *ka, *kb;
    size_t n;
    atomic_int stop;
    atomic_ulong puts, gets, blocks, bad;
    char why[256];
    pthread_mutex_t lock;
};

static void race_bad(struct race *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void race_bad(struct race *r, const char *fmt, ...)
{
    va_list ap;

    pthread_mutex_lock(&r->lock);
    if (atomic_fetch_add(&r->bad, 1) == 0) {
        va_start(ap, fmt);
        vsnprintf(r->why, sizeof r->why, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&r->lock);
    r->stop = 1;
}

static void *race_writer(void *arg)
{
    struct race *r = arg;
    kvnode_client *c = connect_engine(opt.device, 0);
    void *s;
    uint64_t gen = 100;

    cu(gc.set_device(opt.device), "cudaSetDevice (writer thread)");
    s = stream_new();
    while (!r->stop) {
        for (int set = 0; set < 2 && !r->stop; set++) {
            kvnode_key *k = set ? r->kb : r->ka;
            (void)put_hbm(c, k, r->n, gen++, s);
            r->puts++;
            delete_keys(c, k, r->n);
        }
    }
    cu(gc.stream_destroy(s), "cudaStreamDestroy");
    kvnode_close(c);
    return NULL;
}

/* How a race reader reads: get_batch(DEVICE), get_batch_stream(DEVICE), or
 * get_begin + cudaMemcpyAsync of each block + get_end_stream. */
enum { READ_BATCH, READ_BATCH_STREAM, READ_END_STREAM };
static const char *const read_names[] = { "get_batch(DEVICE)", "get_batch_stream(DEVICE)",
                                          "get_begin + cudaMemcpyAsync + get_end_stream" };
struct reader_arg { struct race *r; int how; };

/* One read of keys k[0..n) into d as `how` says; *got blocks, 0 or rc. */
static int race_read(kvnode_client *c, int how, const kvnode_key *k, size_t n, void **dp,
                     void *s, kvnode_loc *locs, size_t *got)
{
    kvnode_lease lease = 0;
    int rc;

    if (how == READ_BATCH)
        return kvnode_get_batch(c, k, n, dp, KVNODE_BATCH_DEVICE, got);
    if (how == READ_BATCH_STREAM)
        return ks.get_batch_stream(c, k, n, dp, KVNODE_BATCH_DEVICE, s, got);
    if ((rc = kvnode_get_begin(c, k, n, &lease, locs, got)) != 0)
        return rc;
    for (size_t i = 0; i < *got; i++)
        cu(gc.memcpy_async(dp[i], locs[i].ptr, opt.bb, GC_DEFAULT, s),
           "cudaMemcpyAsync out of a leased block");
    if (!lease)
        return 0;
    rc = ks.get_end_stream(c, lease, s);
    if (rc == 0 && gc.stream_query(s) != GC_SUCCESS)
        FAIL("cudaStreamQuery right after kvnode_get_end_stream returned: %s (the lease ended "
             "before the copies out of its blocks)", gc_err(gc.stream_query(s)));
    return rc;
}

static void *race_reader(void *arg)
{
    struct reader_arg *a = arg;
    struct race *r = a->r;
    kvnode_client *c = connect_engine(opt.device, 0);
    uint8_t *h = xcalloc(r->n, opt.bb), *d;
    kvnode_loc *locs = xcalloc(r->n, sizeof *locs);
    void **dp, *s;

    cu(gc.set_device(opt.device), "cudaSetDevice (reader thread)");
    d = dev_blocks(r->n);
    dp = ptrs(d, r->n);
    s = stream_new();
    for (unsigned long it = 0; !r->stop; it++) {
        kvnode_key *k = (it & 1) ? r->kb : r->ka;
        size_t got = 0;
        int rc = race_read(c, a->how, k, r->n, dp, s, locs, &got);
        if (rc != 0) {
            race_bad(r, "%s: %s: %s", read_names[a->how], kvnode_strerror(rc),
                     kvnode_last_error(c));
            break;
        }
        r->gets++;
        if (got == 0)
            continue;
        dev_read(h, d, got * opt.bb);
        for (size_t i = 0; i < got; i++) {
            long off = check(h + i * opt.bb, k[i], UINT64_MAX);
            if (off >= 0) {
                race_bad(r, "%s returned, then block %zu (key %" PRId64 ") read on a fresh "
                         "stream was %s at byte %ld", read_names[a->how], i, (int64_t)k[i],
                         off == 0 ? "another key's" : "torn", off);
                break;
            }
        }
        r->blocks += got;
    }
    cu(gc.stream_destroy(s), "cudaStreamDestroy");
    cu(gc.free_(d), "cudaFree");
    free(dp);
    free(h);
    free(locs);
    kvnode_close(c);
    return NULL;
}

static void b_completion(void)
{
    cuda_setup();
    load_stream_calls();
    kvnode_client *c = connect_engine(opt.device, 0), *c2 = connect_engine(opt.device, 0);
    size_t n = opt.blocks, got = 0;
    kvnode_key *k1 = make_keys(n, 31), *k2 = make_keys(n, 32);
    void *s = stream_new();
    uint8_t *dst = dev_blocks(n), *h = xcalloc(n, opt.bb);
    void **dp = ptrs(dst, n);

    if (put_hbm(c, k1, n, 1, s) != n)
        FAIL("HBM puts fell back to host: no HBM lent (%s)", kvnode_last_error(c));

    /* (a) stream variant: s must be idle when the call returns */
    cu(gc.memcpy_async(dst, h, n * opt.bb, GC_H2D, s), "cudaMemcpyAsync (zeroes, before the get)");
    kv(c, ks.get_batch_stream(c, k1, n, dp, KVNODE_BATCH_DEVICE, s, &got),
       "kvnode_get_batch_stream(DEVICE)");
    int q = gc.stream_query(s);
    if (q != GC_SUCCESS)
        FAIL("cudaStreamQuery(caller's stream) right after kvnode_get_batch_stream returned: %s "
             "(the copies were still queued when the lease ended)", gc_err(q));
    if (got != n)
        FAIL("get_batch_stream found %zu of %zu", got, n);
    dev_verify(dst, k1, n, 1, "get_batch_stream(DEVICE)");
    info("get_batch_stream(DEVICE): caller's stream idle on return; dst byte-exact on a fresh "
         "stream");

    /* (b) plain variant: nothing left on the legacy stream, dst complete */
    cu(gc.memset_(dst, 0, n * opt.bb), "cudaMemset");
    cu(gc.device_sync(), "cudaDeviceSynchronize");
    kv(c, kvnode_get_batch(c, k1, n, dp, KVNODE_BATCH_DEVICE, &got), "kvnode_get_batch(DEVICE)");
    q = gc.stream_query(NULL);
    if (q != GC_SUCCESS)
        FAIL("cudaStreamQuery(legacy default stream) right after kvnode_get_batch(DEVICE) "
             "returned: %s (libkvnode left work on the legacy stream)", gc_err(q));
    dev_verify(dst, k1, n, 1, "get_batch(DEVICE)");
    info("get_batch(DEVICE): legacy stream idle on return; dst byte-exact on a fresh stream");

    /* (c) put side: the writes queued on s, the commit ordered after them;
     * another connection must read the new bytes */
    delete_keys(c, k1, n);
    if (put_hbm(c, k1, n, 2, s) != n)
        FAIL("HBM puts fell back to host");
    get_verify(c2, k1, n, 2, "after put_commit_stream, on another connection");
    for (size_t i = 0; i < n; i++)
        fill(h + i * opt.bb, k2[i], 3);
    cu(gc.memcpy_async(dst, h, n * opt.bb, GC_H2D, s), "cudaMemcpyAsync H2D");
    kv(c, ks.put_batch_stream(c, k2, n, (const void *const *)dp, KVNODE_BATCH_DEVICE, s),
       "kvnode_put_batch_stream(DEVICE)");
    q = gc.stream_query(s);
    if (q != GC_SUCCESS)
        FAIL("cudaStreamQuery(caller's stream) right after kvnode_put_batch_stream returned: %s",
             gc_err(q));
    get_verify(c2, k2, n, 3, "after put_batch_stream, on another connection");
    info("put_commit_stream and put_batch_stream: the other connection reads the bytes queued "
         "before them");
    delete_keys(c, k1, n);
    delete_keys(c, k2, n);

    /* (d) the put/delete race */
    struct race r = { .ka = make_keys(n, 33), .kb = make_keys(n, 34), .n = n,
                      .lock = PTHREAD_MUTEX_INITIALIZER };
    struct reader_arg ra[3] = { { &r, READ_BATCH }, { &r, READ_BATCH_STREAM }, { &r, READ_END_STREAM } };
    pthread_t tw, tr[3];
    double t0 = now_s();
    if (pthread_create(&tw, NULL, race_writer, &r))
        FAIL("pthread_create failed");
    for (int i = 0; i < 3; i++)
        if (pthread_create(&tr[i], NULL, race_reader, &ra[i]))
            FAIL("pthread_create failed");
    while (!r.stop && now_s() - t0 < opt.seconds)
        sleep_ms(50);
    r.stop = 1;
    pthread_join(tw, NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(tr[i], NULL);
    info("race: %.1f s, %lu put rounds, %lu gets, %lu blocks read back", now_s() - t0,
         (unsigned long)r.puts, (unsigned long)r.gets, (unsigned long)r.blocks);
    if (r.bad)
        FAIL("put/delete race: %s", r.why);
    if (r.blocks == 0)
        FAIL("put/delete race: no get ever found a block (%lu gets): nothing was checked",
             (unsigned long)r.gets);
    delete_keys(c, r.ka, n);
    delete_keys(c, r.kb, n);
    kvnode_close(c);
    kvnode_close(c2);
    result(R_PASS, "stream idle and dst complete on return (both variants), commits ordered "
           "after the stream, %.0f s put/delete race against get_batch, get_batch_stream and "
           "get_end_stream readers: %lu blocks read, none torn or foreign",
           (double)opt.seconds, (unsigned long)r.blocks);
}

/* Store: write-through of HBM blocks and device batches (phase put), then
 * after the script restarted the daemon on the same store (phase verify). */
static void b_store(bool verify)
{
    cuda_setup();
    load_stream_calls();
    size_t n = opt.blocks;
    kvnode_key *k1 = make_keys(n, 41), *k2 = make_keys(n, 42);

    if (verify) {
        kvnode_client *c = connect_engine(opt.device, 0);
        kvnode_tiers t1, t2;
        kv(c, kvnode_match_tiers(c, k1, n, &t1), "kvnode_match_tiers");
        kv(c, kvnode_match_tiers(c, k2, n, &t2), "kvnode_match_tiers");
        info("after the restart: %zu + %zu of %zu + %zu matched (%zu + %zu only in the store)",
             t1.matched, t2.matched, n, n, t1.store, t2.store);
        get_verify(c, k1, n, 1, "HBM blocks from the store after a restart");
        get_verify(c, k2, n, 2, "device-batch blocks from the store after a restart");
        delete_keys(c, k1, n);
        delete_keys(c, k2, n);
        kvnode_close(c);
        result(R_PASS, "after a restart the store holds all %zu blocks byte-exact", 2 * n);
    }
    json_t *doc = stats();
    if (strcmp(jstr(doc, "persist", "policy", NULL), "write_through") != 0)
        FAIL("the daemon's persist.policy is '%s', not write_through", jstr(doc, "persist", "policy", NULL));
    double w0 = jnum(doc, "persist.written_blocks_total", false, 0);
    json_decref(doc);

    kvnode_client *c = connect_engine(opt.device, 0);
    void *s = stream_new();
    if (put_hbm(c, k1, n, 1, s) != n)
        FAIL("HBM puts fell back to host (%s)", kvnode_last_error(c));
    uint8_t *src = dev_blocks(n), *h = xcalloc(n, opt.bb);
    void **sp = ptrs(src, n);
    for (size_t i = 0; i < n; i++)
        fill(h + i * opt.bb, k2[i], 2);
    cu(gc.memcpy_async(src, h, n * opt.bb, GC_H2D, s), "cudaMemcpyAsync H2D");
    kv(c, ks.put_batch_stream(c, k2, n, (const void *const *)sp, KVNODE_BATCH_DEVICE, s),
       "kvnode_put_batch_stream(DEVICE)");
    double end = now_s() + opt.timeout_s, w = 0, pinned = 0, waiting = 0;
    for (;;) {
        doc = stats();
        w = jnum(doc, "persist.written_blocks_total", false, 0) - w0;
        pinned = jnum(doc, "persist.pinned_for_writes_bytes", true, 0);
        waiting = jnum(doc, "persist.writes_waiting", true, 0);
        json_decref(doc);
        if (w >= 2.0 * (double)n && pinned == 0 && waiting == 0)
            break;
        if (now_s() > end)
            FAIL("%.0f of %zu blocks written within %u s", w, 2 * n, opt.timeout_s);
        sleep_ms(25);
    }
    kvnode_close(c);
    result(R_PASS, "%zu HBM blocks and %zu device-batch blocks written through (%.0f writes)", n,
           n, w);
}

/* A client holding HBM leases while the script stops the daemon and starts
 * another: its calls fail cleanly, and a new client gets the new daemon's HBM. */
static void b_restart(void)
{
    cuda_setup();
    load_stream_calls_if(false);
    size_t n = opt.blocks, got = 0;
    kvnode_key *k1 = make_keys(n, 51), *k2 = make_keys(n, 52);
    kvnode_client *c = connect_engine(opt.device, 0);
    kvnode_set_timeout(c, 10000);
    void *s = stream_new();
    if (put_hbm(c, k1, n, 1, s) != n)
        FAIL("HBM puts fell back to host (%s)", kvnode_last_error(c));
    kvnode_lease rl = 0, wl = 0;
    kvnode_loc *locs = xcalloc(n, sizeof *locs);
    kv(c, kvnode_get_begin(c, k1, n, &rl, locs, &got), "kvnode_get_begin");
    kv(c, kvnode_put_begin(c, k2, n, KVNODE_TIER_HBM, &wl, locs), "kvnode_put_begin");
    info("holding a read lease on %zu HBM blocks and a write lease on %zu", got, n);
    sync_step("restart");       /* the script stops the daemon and starts another */

    double t0 = now_s();
    int r1 = kvnode_get_end(c, rl);
    int r2 = kvnode_put_commit(c, wl);
    int r3 = kvnode_get_begin(c, k1, n, &rl, locs, &got);
    info("old connection after the restart: get_end %s, put_commit %s, get_begin %s (%.2f s)",
         kvnode_strerror(r1), kvnode_strerror(r2), kvnode_strerror(r3), now_s() - t0);
    int rcs[3] = { r1, r2, r3 };
    for (int i = 0; i < 3; i++)
        if (rcs[i] != -KVNODE_ESHUTDOWN && rcs[i] != -KVNODE_ECLOSED)
            FAIL("a call on the old connection returned %s (%d), not ESHUTDOWN or ECLOSED",
                 kvnode_strerror(rcs[i]), rcs[i]);
    bool notice = r1 == -KVNODE_ESHUTDOWN;
    kvnode_close(c);
    c = connect_engine(opt.device, 0);
    if (put_hbm(c, k2, n, 2, s) != n)
        FAIL("the new daemon lends no HBM: puts fell back to host (%s)", kvnode_last_error(c));
    get_verify(c, k2, n, 2, "HBM round trip on the new daemon");
    delete_keys(c, k2, n);
    kvnode_close(c);
    free(locs);
    result(R_PASS, "old calls failed cleanly (%s), the new daemon lends HBM, byte-exact",
           notice ? "ESHUTDOWN: the stop's notice reached the client" : "ECLOSED");
}

/* The child of `death`: takes leases and HBM mappings, then is killed. */
static void b_death_child(void)
{
    cuda_setup();
    load_stream_calls_if(false);
    size_t n = opt.blocks, got = 0;
    kvnode_key *k1 = make_keys(n, 61), *k2 = make_keys(n, 62);
    kvnode_client *c = connect_engine(opt.device, 0);
    void *s = stream_new();
    if (put_hbm(c, k1, n, 1, s) != n)
        FAIL("HBM puts fell back to host (%s)", kvnode_last_error(c));
    kvnode_lease rl = 0, wl = 0;
    kvnode_loc *locs = xcalloc(n, sizeof *locs);
    kv(c, kvnode_get_begin(c, k1, n, &rl, locs, &got), "kvnode_get_begin");
    kv(c, kvnode_put_begin(c, k2, n, KVNODE_TIER_HBM, &wl, locs), "kvnode_put_begin");
    uint8_t *h = xcalloc(1, opt.bb);
    fill(h, k2[0], 9);
    if (locs[0].tier == KVNODE_TIER_HBM)
        cu(gc.memcpy_async(locs[0].ptr, h, opt.bb / 2, GC_DEFAULT, s), "cudaMemcpyAsync");
    printf("child holding leases\n");
    fflush(stdout);
    raise(SIGKILL);
    FAIL("still alive after SIGKILL");
}

static pid_t spawn_self(const char *behaviour, const char *extra)
{
    char dev[16], blocks[24], bb[24], salt[24], conn[16];
    snprintf(dev, sizeof dev, "%d", opt.device);
    snprintf(blocks, sizeof blocks, "%zu", opt.blocks);
    snprintf(bb, sizeof bb, "%" PRIu64, opt.bb);
    snprintf(salt, sizeof salt, "%" PRIu64, opt.salt);
    snprintf(conn, sizeof conn, "%u", opt.connects);
    char *argv[] = { (char *)opt.self, (char *)behaviour, "--socket", (char *)opt.socket,
                     "--device", dev, "--blocks", blocks, "--block-bytes", bb, "--salt", salt,
                     "--connects", conn, (char *)extra, NULL };
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ);
    if (rc != 0)
        FAIL("posix_spawn %s: %s", behaviour, strerror(rc));
    return pid;
}

/* waitpid with a deadline; the status, or FAIL. */
static int wait_child(pid_t pid, const char *what)
{
    double end = now_s() + opt.timeout_s;
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        if (r < 0)
            FAIL("waitpid %s: %s", what, strerror(errno));
        if (now_s() > end) {
            kill(pid, SIGKILL);
            (void)waitpid(pid, &st, 0);
            FAIL("%s did not finish within %u s", what, opt.timeout_s);
        }
        sleep_ms(20);
    }
}

struct snap { double rl, wl, clients, hbm_used; };

static struct snap snap_now(void)
{
    json_t *doc = stats(), *h = hbm_tier(doc, -1);
    struct snap s = {
        .rl = jnum(doc, "leases.read", false, 0),
        .wl = jnum(doc, "leases.write", false, 0),
        .clients = jnum(doc, "clients.connected", false, 0),
        .hbm_used = h ? json_number_value(json_object_get(h, "used_bytes")) : 0,
    };
    json_decref(doc);
    return s;
}

static void b_death(void)
{
    struct snap s0 = snap_now();
    pid_t pid = spawn_self("death-child", NULL);
    int st = wait_child(pid, "the client holding leases");
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
        FAIL("the child did not die by SIGKILL (status 0x%x): see its output above", st);
    double end = now_s() + opt.timeout_s;
    struct snap s;
    for (;;) {
        s = snap_now();
        if (s.rl <= s0.rl && s.wl <= s0.wl && s.clients <= s0.clients)
            break;
        if (now_s() > end)
            FAIL("%u s after the client died: %.0f read and %.0f write leases (%.0f and %.0f "
                 "before), %.0f clients (%.0f before)", opt.timeout_s, s.rl, s.wl, s0.rl, s0.wl,
                 s.clients, s0.clients);
        sleep_ms(25);
    }
    cuda_setup();
    load_stream_calls_if(false);
    size_t n = opt.blocks;
    kvnode_key *k1 = make_keys(n, 61), *k2 = make_keys(n, 62);
    kvnode_client *c = connect_engine(opt.device, 0);
    size_t matched = 0;
    kv(c, kvnode_match(c, k2, n, &matched), "kvnode_match");
    if (matched != 0)
        FAIL("%zu blocks of the dead client's uncommitted put are visible", matched);
    void *str = stream_new();
    if (put_hbm(c, k2, n, 2, str) != n)
        FAIL("HBM puts fell back to host after the client died (%s)", kvnode_last_error(c));
    get_verify(c, k2, n, 2, "the dead client's keys put again");
    get_verify(c, k1, n, 1, "the blocks the dead client had committed");
    delete_keys(c, k1, n);
    delete_keys(c, k2, n);
    kvnode_close(c);
    end = now_s() + opt.timeout_s;
    while ((s = snap_now()).hbm_used > s0.hbm_used && now_s() < end)
        sleep_ms(25);
    if (s.hbm_used > s0.hbm_used)
        FAIL("HBM in use: %.0f bytes, %.0f before the client", s.hbm_used, s0.hbm_used);
    result(R_PASS, "leases and connection of a killed client released; its keys reusable; HBM "
           "use back to %.0f bytes", s0.hbm_used);
}

/* A reader client pins its read-only host arena and reads host blocks
 * into device memory. */
static void b_reader_pin(void)
{
    cuda_setup();
    size_t n = opt.blocks, got = 0;
    kvnode_key *k = make_keys(n, 71);
    kvnode_client *w = connect_engine(opt.device, 0);
    uint8_t *src = dev_blocks(n), *dst = dev_blocks(n);
    void **sp = ptrs(src, n), **dp = ptrs(dst, n);
    dev_fill(src, k, n, 1);
    kv(w, kvnode_put_batch(w, k, n, (const void *const *)sp, KVNODE_BATCH_DEVICE),
       "kvnode_put_batch(DEVICE)");
    kvnode_client *r = connect_engine(opt.device, KVNODE_CONNECT_READER);
    if (!kvnode_is_reader(r))
        FAIL("KVNODE_CONNECT_READER was not granted");
    double t0 = now_s();
    kv(r, kvnode_pin_host(r), "kvnode_pin_host (reader)");
    info("reader pinned its host arena in %.3f s", now_s() - t0);
    kv(r, kvnode_get_batch(r, k, n, dp, KVNODE_BATCH_DEVICE, &got), "kvnode_get_batch(DEVICE)");
    if (got != n)
        FAIL("reader found %zu of %zu blocks", got, n);
    dev_verify(dst, k, n, 1, "reader get_batch(DEVICE) from the pinned arena");
    delete_keys(w, k, n);
    kvnode_close(r);
    kvnode_close(w);
    result(R_PASS, "reader's kvnode_pin_host succeeded; %zu host blocks to device byte-exact", n);
}

/* Demotion while the daemon still pins its host arena (the script starts
 * it with a pin chunk that is not a multiple of the slab). */
static void b_demotion(void)
{
    cuda_setup();
    load_stream_calls_if(false);
    json_t *doc = stats(), *h = hbm_tier(doc, -1);
    if (!h)
        FAIL("the daemon has no HBM tier");
    double cap = json_number_value(json_object_get(h, "capacity_bytes"));
    double used0 = json_number_value(json_object_get(h, "used_bytes"));
    double high = jnum(doc, "demotions.high_watermark", false, 0);
    double dem0 = jnum(doc, "demotions.bytes_total", false, 0);
    double failed0 = jnum(doc, "demotions.failed_total", false, 0);
    char pin0[32];
    snprintf(pin0, sizeof pin0, "%s", jstr(doc, "tiers", "host", "pin_state"));
    double pinned0 = jnum(doc, "tiers.host.pinned_bytes", true, 0);
    double hostcap = jnum(doc, "tiers.host.capacity_bytes", true, 0);
    json_decref(doc);
    info("host arena pinning at the start: %s, %.0f of %.0f MiB", pin0, pinned0 / 1048576,
         hostcap / 1048576);

    /* Three arenas' worth: demotion keeps moving blocks for a while, into
     * host slabs on both sides of the pinning's progress and of chunk
     * boundaries. */
    size_t n = (size_t)((3.0 * cap - used0) / (double)opt.bb) + 2;
    kvnode_key *k = make_keys(n, 81);
    kvnode_client *c = connect_engine(opt.device, 0);
    void *s = stream_new();
    double t0 = now_s();
    size_t hbm = put_hbm(c, k, n, 1, s);
    if (hbm == 0)
        FAIL("all %zu HBM puts fell back to host: no HBM lent (%s)", n, kvnode_last_error(c));
    char pin1[32] = "";
    double end = now_s() + opt.timeout_s, dem = 0, failed = 0, used = 0, pinned1 = 0;
    for (;;) {
        doc = stats();
        h = hbm_tier(doc, -1);
        dem = jnum(doc, "demotions.bytes_total", false, 0) - dem0;
        failed = jnum(doc, "demotions.failed_total", false, 0) - failed0;
        used = h ? json_number_value(json_object_get(h, "used_bytes")) : 0;
        double moving = h ? json_number_value(json_object_get(h, "moving_bytes")) : 0;
        double pend = jnum(doc, "demotions.batches_pending", true, 0);
        if (dem > 0 && !pin1[0]) {
            snprintf(pin1, sizeof pin1, "%s", jstr(doc, "tiers", "host", "pin_state"));
            pinned1 = jnum(doc, "tiers.host.pinned_bytes", true, 0);
        }
        json_decref(doc);
        if (failed > 0)
            FAIL("%.0f demotion(s) failed (the daemon's log says why)", failed);
        if (dem > 0 && moving == 0 && pend == 0 && used <= high * cap)
            break;
        if (now_s() > end)
            FAIL("demotion did not bring HBM under its high watermark within %u s (%.0f of %.0f "
                 "bytes used, %.0f demoted)", opt.timeout_s, used, cap, dem);
        sleep_ms(20);
    }
    info("put %zu blocks (%zu to HBM); %.1f MiB demoted in %.2f s; pinning when demotion was "
         "first seen: %s (%.0f MiB pinned)", n, hbm, dem / 1048576, now_s() - t0,
         pin1, pinned1 / 1048576);
    get_verify(c, k, n, 1, "every block after demotion");
    delete_keys(c, k, n);
    kvnode_close(c);
    if (strcmp(pin0, "running") != 0 && strcmp(pin1, "running") != 0)
        FAIL("pinning was '%s' before the demotion and '%s' during it: demotion while pinning "
             "runs was not exercised (a larger host arena makes pinning last longer)", pin0, pin1);
    result(R_PASS, "%.1f MiB demoted while pinning ran, none failed, %zu blocks byte-exact",
           dem / 1048576, n);
}

/* churn-worker: connect, read one HBM block on a fresh stream, close; --connects times. */
static void b_churn_worker(void)
{
    cuda_setup();
    kvnode_key *k = make_keys(1, 91);
    uint8_t *h = xcalloc(1, opt.bb);
    double t0 = now_s();
    for (unsigned i = 0; i < opt.connects; i++) {
        kvnode_client *c = connect_engine(opt.device, 0);
        kvnode_lease l = 0;
        kvnode_loc loc;
        size_t got = 0;
        kv(c, kvnode_get_begin(c, k, 1, &l, &loc, &got), "kvnode_get_begin");
        if (got != 1 || loc.tier != KVNODE_TIER_HBM)
            FAIL("connect %u: the block is %s", i, got != 1 ? "missing" : "not in lent HBM "
                 "(connected host-only?)");
        dev_read(h, loc.ptr, opt.bb);
        long off = check(h, k[0], 1);
        if (off >= 0)
            FAIL("connect %u: the HBM block read through this connection's mapping differs at "
                 "byte %ld", i, off);
        kv(c, kvnode_get_end(c, l), "kvnode_get_end");
        kvnode_close(c);
    }
    result(R_PASS, "%u connects, %.1f ms each", opt.connects,
           1e3 * (now_s() - t0) / opt.connects);
}

static void b_churn(void)
{
    struct snap s0 = snap_now();
    {
        /* the block every worker reads; CUDA stays out of this process
         * until the workers are spawned */
        pid_t p = spawn_self("churn-setup", NULL);
        int st = wait_child(p, "churn-setup");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            FAIL("churn-setup failed (status 0x%x)", st);
    }
    pid_t pids[16];
    unsigned np = opt.procs > 16 ? 16 : opt.procs, failed = 0;
    double t0 = now_s();
    for (unsigned i = 0; i < np; i++)
        pids[i] = spawn_self("churn-worker", NULL);
    for (unsigned i = 0; i < np; i++) {
        int st = wait_child(pids[i], "a churn worker");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed++;
    }
    double took = now_s() - t0;
    if (failed)
        FAIL("%u of %u churn workers failed (their lines above say why)", failed, np);
    struct snap s;
    double end = now_s() + opt.timeout_s;
    while (((s = snap_now()).clients > s0.clients || s.rl > s0.rl) && now_s() < end)
        sleep_ms(25);
    if (s.clients > s0.clients || s.rl > s0.rl)
        FAIL("after the churn: %.0f clients, %.0f read leases (%.0f and %.0f before)", s.clients,
             s.rl, s0.clients, s0.rl);
    result(R_PASS, "%u processes x %u connects, each mapping HBM and reading a block byte-exact "
           "(%.1f s); connections and leases back to where they were", np, opt.connects, took);
}

static void b_churn_setup(void)
{
    cuda_setup();
    load_stream_calls_if(false);
    kvnode_key *k = make_keys(1, 91);
    kvnode_client *c = connect_engine(opt.device, 0);
    size_t matched = 0;
    kv(c, kvnode_match(c, k, 1, &matched), "kvnode_match");
    if (matched == 0 && put_hbm(c, k, 1, 1, stream_new()) != 1)
        FAIL("the churn block fell back to host (%s)", kvnode_last_error(c));
    kvnode_close(c);
    result(R_PASS, "churn block in HBM");
}

/* An engine in another PID namespace: served HBM (through the fd path). */
static void b_pidns(void)
{
    char ns[64] = "?";
    ssize_t l = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (l > 0)
        ns[l] = 0;
    info("pid %d in %s%s%s", (int)getpid(), ns, getenv("FAKECUDA_PIDNS") ? ", FAKECUDA_PIDNS=" : "",
         getenv("FAKECUDA_PIDNS") ? getenv("FAKECUDA_PIDNS") : "");
    cuda_setup();
    load_stream_calls_if(false);
    size_t n = opt.blocks;
    kvnode_key *k = make_keys(n, 101);
    kvnode_client *c = connect_engine(opt.device, 0);
    void *s = stream_new();
    size_t hbm = put_hbm(c, k, n, 1, s);
    if (hbm != n)
        FAIL("%zu of %zu HBM puts landed in HBM: the engine in another PID namespace was not "
             "served HBM (%s)", hbm, n, kvnode_last_error(c));
    get_verify(c, k, n, 1, "HBM round trip from another PID namespace");
    delete_keys(c, k, n);
    kvnode_close(c);
    result(R_PASS, "served HBM in another PID namespace, %zu blocks byte-exact", n);
}

/* GPU memory in use on the device (total - free), for the script's baseline. */
static void b_meminfo(void)
{
    size_t freeb = 0, total = 0;
    cuda_setup();
    if (!gc.cu_mem_info || !gc.cu_init)
        result(R_SKIP, "libcuda.so.1 with cuInit and cuMemGetInfo_v2 not found");
    cu(gc.cu_init(0), "cuInit");
    cu(gc.cu_mem_info(&freeb, &total), "cuMemGetInfo");
    printf("used_bytes=%zu total_bytes=%zu\n", total - freeb, total);
    result(R_PASS, "%.1f of %.1f MiB in use", (double)(total - freeb) / 1048576,
           (double)total / 1048576);
}

/* --- arguments --------------------------------------------------------------- */

static const struct { const char *name; void (*fn)(void); const char *what; } behaviours[] = {
    { "preflight", b_preflight, "versions, compute mode, MIG of the visible devices" },
    { "identity", b_identity, "--expect hbm|none: is this client's GPU lent HBM" },
    { "batch", b_batch, "batch device API both ways, byte-exact" },
    { "completion", b_completion, "stream idle on return, fresh-stream reads, --seconds race" },
    { "store-put", NULL, "write-through of HBM and device blocks" },
    { "store-verify", NULL, "the store's blocks after a restart" },
    { "restart", b_restart, "a client across a daemon restart (--sync DIR)" },
    { "death", b_death, "a client killed with leases" },
    { "death-child", b_death_child, "(internal)" },
    { "reader-pin", b_reader_pin, "a reader client pins its host arena" },
    { "demotion", b_demotion, "demotion while pinning runs" },
    { "churn", b_churn, "--procs processes x --connects connects" },
    { "churn-setup", b_churn_setup, "(internal)" },
    { "churn-worker", b_churn_worker, "(internal)" },
    { "pidns", b_pidns, "served HBM from another PID namespace" },
    { "meminfo", b_meminfo, "GPU memory in use" },
};
#define NBEHAVIOURS (sizeof behaviours / sizeof behaviours[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: kvnode-gpu-check BEHAVIOUR --socket PATH [--device N] [--blocks N]\n"
               "         [--block-bytes B] [--seconds S] [--salt N] [--sync DIR] [--expect hbm|none]\n"
               "         [--procs N] [--connects N] [--timeout S]\nbehaviours:\n");
    for (size_t i = 0; i < NBEHAVIOURS; i++)
        fprintf(f, "  %-13s %s\n", behaviours[i].name, behaviours[i].what);
}

static unsigned long num(const char *a, const char *v, unsigned long lo, unsigned long hi)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi) {
        usage(stderr);
        printf("RESULT FAIL: usage: %s: '%s' is not a number in %lu..%lu\n", a, v, lo, hi);
        exit(2);
    }
    return (unsigned long)n;
}

static void parse_args(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        exit(argc < 2 ? 2 : 0);
    }
    opt.self = argv[0];
    opt.behaviour = argv[1];
    opt.salt = (uint64_t)getpid() ^ ((uint64_t)time(NULL) << 20);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage(stderr);
            printf("RESULT FAIL: usage: %s needs a value\n", a);
            exit(2);
        }
        i++;
        if (!strcmp(a, "--socket"))
            opt.socket = v;
        else if (!strcmp(a, "--sync"))
            opt.sync = v;
        else if (!strcmp(a, "--expect"))
            opt.expect = v;
        else if (!strcmp(a, "--device"))
            opt.device = (int)num(a, v, 0, 1023);
        else if (!strcmp(a, "--blocks"))
            opt.blocks = num(a, v, 1, 1u << 20);
        else if (!strcmp(a, "--block-bytes"))
            opt.bb = num(a, v, 64, 1ul << 30) & ~(uint64_t)7;
        else if (!strcmp(a, "--seconds"))
            opt.seconds = (unsigned)num(a, v, 1, 3600);
        else if (!strcmp(a, "--salt"))
            opt.salt = num(a, v, 0, ~0ul);
        else if (!strcmp(a, "--procs"))
            opt.procs = (unsigned)num(a, v, 1, 16);
        else if (!strcmp(a, "--connects"))
            opt.connects = (unsigned)num(a, v, 1, 100000);
        else if (!strcmp(a, "--timeout"))
            opt.timeout_s = (unsigned)num(a, v, 1, 3600);
        else {
            usage(stderr);
            printf("RESULT FAIL: usage: unknown option %s\n", a);
            exit(2);
        }
    }
    if (!opt.socket && strcmp(opt.behaviour, "preflight") && strcmp(opt.behaviour, "meminfo")) {
        usage(stderr);
        printf("RESULT FAIL: usage: --socket is required\n");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    parse_args(argc, argv);
    if (!strcmp(opt.behaviour, "store-put"))
        b_store(false);
    if (!strcmp(opt.behaviour, "store-verify"))
        b_store(true);
    for (size_t i = 0; i < NBEHAVIOURS; i++)
        if (behaviours[i].fn && !strcmp(opt.behaviour, behaviours[i].name))
            behaviours[i].fn();
    usage(stderr);
    printf("RESULT FAIL: usage: unknown behaviour '%s'\n", opt.behaviour);
    return 2;
}
