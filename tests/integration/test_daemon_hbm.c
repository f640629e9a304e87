/* Integration: the HBM (GPU memory) tier, on the daemon's `sim` GPU backend
 * (host memory stands in for two devices, lent as memfds the clients map, so
 * the test reads and writes "HBM" blocks directly).
 *
 * Arenas are small: 1 MiB per device of 256 KiB slabs = 64 blocks of 16 KiB
 * (demotion from above 90% = 58 blocks down to 80% = 51), host 8 MiB.
 *
 * - put to HBM lands in the arena of the client's device (tier, device) and
 *   reads back byte-exact from the same client and another client on the
 *   same device; a client on the other device is not lent that arena: its
 *   GET prefix ends there while MATCH counts the blocks; a client on device 1 puts into device
 *   1's arena ($KVNODE_CUDA_DEVICE declares the device too); a
 *   CPU-only client (device -1) gets a GET prefix that ends at the first
 *   block in HBM, MATCH counts every tier (tiers.hbm / tiers.host), and its
 *   HBM puts land in host memory;
 * - fallback: with device 0's arena full of read-leased blocks (nothing can
 *   be demoted), HBM puts land in host memory, counted in
 *   hbm_fallbacks_total; device 1 is unaffected;
 * - demotion under pressure keeps every byte (four arenas' worth of puts):
 *   every block reads back byte-exact from host or HBM, demotions counted
 *   (stats and /metrics agree), HBM used <= high watermark, and a read lease
 *   taken before the pressure stays valid with its bytes intact at its
 *   original HBM location throughout;
 * - an arena left above its high watermark by pinned blocks is demoted once
 *   the pins go, without waiting for another put;
 * - read-leased HBM blocks are never demoted, and are once released;
 * - a block being moved stays readable: with a 500 ms copy, the victims of a
 *   pending batch read back byte-exact at their HBM place and the move is
 *   aborted (aborted_total);
 * - a client SIGKILLed holding HBM read and write leases leaves nothing
 *   behind: no leases, HBM used back to the committed blocks, the reserved
 *   keys absent and free, the committed blocks demotable again;
 * - hbm.required = on without a device (backend none, or auto on a machine
 *   without a GPU) fails the start with a message naming hbm.required;
 *   required = off logs "HBM tier off", has no arenas, and HBM puts land in
 *   host memory;
 * - a sticky error on device 0 (the sim's KVNODE_DEVMEM_SIM_STICKY_DIR):
 *   the device is down in /stats and /metrics with the reason, its blocks
 *   dropped, a client connecting on it afterwards is lent host memory only,
 *   device 1 and host memory still served;
 * - memory.pin_host = on pins the host arena in the background
 *   (1 MiB chunks of 300 ms each): the daemon answers and is ready while
 *   pin_state is "running", then pinned with pinned_bytes == capacity (and
 *   /metrics kvnode_host_pinned_bytes too); without an HBM tier (backend
 *   none, or hbm.bytes = 0) neither pin_host = on nor auto pins, and the log
 *   says why (pinning is per process: no copy of the daemon's would use it).
 *
 * The placement and demotion tests run twice: without a store (tcase hbm)
 * and with a write_through file store (tcase hbm_store), where every
 * committed block is pinned until its write lands; there, too, one put that
 * fills the arena is demoted down to the low watermark once the writes have
 * landed, with no further put (issue 13 defect 6). */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "../common/kvh_http.h"

#define BB        (16u << 10)             /* block bytes */
#define CHUNK     8                       /* keys per put */
#define ARENA_CAP 64                      /* blocks per device arena (1 MiB / 16 KiB) */
#define HIGH_WM   0.90
#define MAXN      256

#define SIM_CONF "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\n" \
                 "hbm.backend=sim\nhbm.bytes=1MiB\n"
#define LOW_WM    0.80
#define LOW_BLOCKS 51                     /* blocks left once demotion reaches the low watermark */

/* The variant of this test case: true in hbm_store. */
static bool store_variant;
static void plain_variant(void) { store_variant = false; }
static void with_store_variant(void) { store_variant = true; }

/* SIM_CONF; in the hbm_store variant plus a write_through file store in a
 * fresh directory. */
static const char *sim_conf(void)
{
    static char conf[PATH_MAX + 256];
    char dir[PATH_MAX];
    if (!store_variant)
        return SIM_CONF;
    ck_assert_msg(kvh_mkdtemp(dir, sizeof dir) == 0, "%s", kvh_error());
    snprintf(conf, sizeof conf, SIM_CONF "persist.backend=file\npersist.path=%s\n"
             "persist.policy=write_through\npersist.fsync=never\n", dir);
    return conf;
}

/* ---- helpers ------------------------------------------------------------------ */

static kvnode_client *connect_dev(const kvh_daemon *d, const kvnode_layout *l, int dev)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect_device(d->sock, l, dev, &c);
    ck_assert_msg(rc == 0 && c, "kvnode_connect_device(%s, device %d) -> %d (%s): %s", l->model, dev, rc,
                  kvnode_strerror(rc), kvnode_connect_error());
    ck_assert_int_eq(kvnode_cuda_device(c), dev);
    return c;
}

static const char *tier_name(int t)
{
    return t == KVNODE_TIER_HBM ? "hbm" : t == KVNODE_TIER_HOST ? "host" : "?";
}

/* put_begin keys (all new) in `tier`, write kvh_fill(key, seed) to every
 * slot, commit. locs (n entries, may be NULL) tells where they went. */
static void put_tier(kvnode_client *c, const kvnode_key *keys, size_t n, int tier, uint64_t seed,
                     kvnode_loc *out)
{
    kvnode_loc locs[MAXN];
    kvnode_lease lease = 0;
    ck_assert(n <= MAXN);
    KVH_OK(c, kvnode_put_begin(c, keys, n, tier, &lease, locs));
    ck_assert_msg(lease != 0, "put_begin of %zu new keys gave no lease", n);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(locs[i].ptr != NULL, "put_begin: no slot for new key #%zu", i);
        ck_assert_msg(locs[i].tier == KVNODE_TIER_HOST || locs[i].tier == KVNODE_TIER_HBM,
                      "put_begin: key #%zu has tier %d", i, locs[i].tier);
        if (locs[i].tier == KVNODE_TIER_HOST)
            ck_assert_msg(locs[i].device == -1, "host slot #%zu names device %d", i, locs[i].device);
        else
            ck_assert_msg(locs[i].device >= 0, "HBM slot #%zu names device %d", i, locs[i].device);
        kvh_fill(locs[i].ptr, BB, keys[i], seed);
    }
    KVH_OK(c, kvnode_put_commit(c, lease));
    if (out)
        memcpy(out, locs, n * sizeof *locs);
}

/* put_tier expecting every slot in `tier` on `dev` (-1 for host). */
static void put_expect(kvnode_client *c, const kvnode_key *keys, size_t n, int tier, uint64_t seed,
                       int want_tier, int want_dev, kvnode_loc *out)
{
    kvnode_loc locs[MAXN];
    put_tier(c, keys, n, tier, seed, locs);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(locs[i].tier == want_tier && locs[i].device == want_dev,
                      "put (tier asked %s) key #%zu landed in %s device %d, expected %s device %d",
                      tier_name(tier), i, tier_name(locs[i].tier), locs[i].device, tier_name(want_tier),
                      want_dev);
    if (out)
        memcpy(out, locs, n * sizeof *locs);
}

/* get_begin; every block of the prefix byte-exact. Returns got; the lease
 * stays held (*lease, 0 when got == 0). */
static size_t get_hold(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed,
                       kvnode_lease *lease, kvnode_loc *locs)
{
    size_t got = (size_t)-1;
    *lease = 0;
    KVH_OK(c, kvnode_get_begin(c, keys, n, lease, locs, &got));
    ck_assert_msg(got <= n, "get_begin: got %zu of %zu", got, n);
    ck_assert_msg((got == 0) == (*lease == 0), "get_begin: got %zu with lease %llu", got,
                  (unsigned long long)*lease);
    for (size_t i = 0; i < got; i++) {
        ck_assert_msg(locs[i].ptr != NULL, "get_begin: block #%zu has no pointer", i);
        ck_assert_msg(locs[i].tier == KVNODE_TIER_HOST || locs[i].tier == KVNODE_TIER_HBM,
                      "get_begin: block #%zu has tier %d", i, locs[i].tier);
        ck_assert_msg(kvh_verify(locs[i].ptr, BB, keys[i], seed) == 0, "get_begin: block #%zu (%s device %d): %s",
                      i, tier_name(locs[i].tier), locs[i].device, kvh_error());
    }
    return got;
}

/* get_begin expecting all n blocks, each in want_tier on want_dev (want_tier
 * 0: anywhere), byte-exact; get_end. */
static void get_expect(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed, int want_tier,
                       int want_dev)
{
    kvnode_loc locs[MAXN];
    kvnode_lease lease;
    ck_assert(n <= MAXN);
    size_t got = get_hold(c, keys, n, seed, &lease, locs);
    ck_assert_msg(got == n, "get_begin: got %zu of %zu blocks", got, n);
    for (size_t i = 0; want_tier && i < n; i++)
        ck_assert_msg(locs[i].tier == want_tier && locs[i].device == want_dev,
                      "get_begin: block #%zu is in %s device %d, expected %s device %d", i,
                      tier_name(locs[i].tier), locs[i].device, tier_name(want_tier), want_dev);
    KVH_OK(c, kvnode_get_end(c, lease));
}

/* The tiers.hbm entry of device dev (a reference into st). */
static json_t *hbm_of(json_t *st, int dev)
{
    json_t *arr = kvh_json_get(st, "tiers.hbm"), *h;
    size_t i;
    ck_assert_msg(json_is_array(arr), "stats have no tiers.hbm array");
    json_array_foreach(arr, i, h) {
        if (kvh_json_int(h, "device") == dev)
            return h;
    }
    ck_abort_msg("stats tiers.hbm has no device %d", dev);
    return NULL;
}

static long long jint(json_t *o, const char *path)
{
    long long v = kvh_json_int(o, path);
    ck_assert_msg(v >= 0, "stats %s: %s", path, kvh_error());
    return v;
}

static long long hbm_stat(const kvh_daemon *d, int dev, const char *field)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    long long v = jint(hbm_of(st, dev), field);
    json_decref(st);
    return v;
}

static long long sum_moving(json_t *st)
{
    json_t *arr = kvh_json_get(st, "tiers.hbm"), *h;
    size_t i;
    long long m = 0;
    json_array_foreach(arr, i, h)
        m += jint(h, "moving_bytes");
    return m;
}

/* Bytes of blocks pinned by store writes in flight or waiting (0 without a
 * store): demotion cannot be over while there are any. */
static long long writes_pinned(json_t *st)
{
    long long p = kvh_json_int_or(st, "persist.pinned_for_writes_bytes", 0),
              w = kvh_json_int_or(st, "persist.writes_waiting", 0);
    ck_assert_msg(p >= 0 && w >= 0, "stats persist.pinned_for_writes_bytes / writes_waiting: %s", kvh_error());
    return p + w;
}

/* Wait until no demotion batch is pending or moving anything and no block
 * is pinned by a store write. */
static void drain(const kvh_daemon *d)
{
    uint64_t deadline = kvh_now_ms() + 10000;
    for (;;) {
        json_t *st = kvh_stats(d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        long long pending = jint(st, "demotions.batches_pending"), moving = sum_moving(st);
        long long writing = writes_pinned(st);
        json_decref(st);
        if (pending == 0 && moving == 0 && writing == 0)
            return;
        ck_assert_msg(kvh_now_ms() < deadline, "demotion still busy after 10 s: %lld batches pending, "
                      "%lld bytes moving, %lld bytes pinned by store writes", pending, moving, writing);
        kvh_sleep_ms(2);
    }
}

/* Wait until demotion has stopped: nothing pending, moving or pinned by a
 * store write, and the counters unchanged over two reads 30 ms apart.
 * Returns those stats. */
static json_t *settle(const kvh_daemon *d)
{
    uint64_t deadline = kvh_now_ms() + 10000;
    long long prev = -1;
    for (;;) {
        json_t *st = kvh_stats(d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        long long pending = jint(st, "demotions.batches_pending"), moving = sum_moving(st);
        long long writing = writes_pinned(st);
        long long sig = jint(st, "demotions.blocks_total") + jint(st, "demotions.aborted_total") +
                        jint(st, "demotions.failed_total") + jint(st, "demotions.dropped_total") +
                        jint(st, "demotions.batches_total");
        bool idle = pending == 0 && moving == 0 && writing == 0;
        if (idle && sig == prev)
            return st;
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "demotion did not settle within 10 s (%lld pending, "
                      "%lld bytes moving, %lld bytes pinned by store writes)", pending, moving, writing);
        prev = idle ? sig : -1;
        kvh_sleep_ms(30);
    }
}

/* Put `blocks` new blocks into HBM in chains of CHUNK (chain ids from *next).
 * paced: after each put, wait for the demotion it started to finish (the
 * arena then cycles: it never fills, so puts never fall back). */
static void pressure(const kvh_daemon *d, kvnode_client *c, size_t blocks, uint64_t *next, uint64_t seed,
                     bool paced)
{
    kvnode_key keys[CHUNK];
    for (size_t done = 0; done < blocks; done += CHUNK) {
        kvh_chain(keys, CHUNK, (*next)++);
        put_tier(c, keys, CHUNK, KVNODE_TIER_HBM, seed, NULL);
        if (paced)
            drain(d);
    }
}

static void expect_hbm_under_high(json_t *st, int dev)
{
    json_t *h = hbm_of(st, dev);
    long long used = jint(h, "used_bytes"), cap = jint(h, "capacity_bytes");
    ck_assert_msg((double)used <= HIGH_WM * (double)cap, "device %d: HBM used %lld of %lld bytes after "
                  "demotion settled: above the high watermark", dev, used, cap);
}

/* Value of the /metrics sample whose line starts with `series ` (name and
 * labels exactly as rendered); -1 when absent. */
static double metric(const char *page, const char *series)
{
    size_t l = strlen(series);
    for (const char *p = page; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, series, l) == 0 && p[l] == ' ')
            return strtod(p + l + 1, NULL);
    }
    return -1;
}

static char *get_metrics(const char *addr)
{
    char *page = NULL;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/metrics", &page, NULL, 0), 200);
    ck_assert_ptr_nonnull(page);
    return page;
}

/* A fresh directory for an admin unix socket: "admin.listen=unix:DIR/a.sock". */
static void admin_conf(char *addr, size_t alen, char *conf, size_t clen, const char *more)
{
    char dir[PATH_MAX];
    ck_assert_msg(kvh_mkdtemp(dir, sizeof dir) == 0, "%s", kvh_error());
    snprintf(addr, alen, "unix:%s/a.sock", dir);
    snprintf(conf, clen, "admin.listen=%s\n%s", addr, more);
}

static void check_sim_gpu(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    json_t *b = kvh_json_get(st, "gpu.backend");
    ck_assert_msg(json_is_string(b) && strcmp(json_string_value(b), "sim") == 0, "gpu.backend is not \"sim\"");
    ck_assert_int_eq(jint(st, "gpu.devices_visible"), 2);
    ck_assert_int_eq(jint(st, "gpu.hbm_arenas"), 2);
    ck_assert_msg(json_is_null(kvh_json_get(st, "gpu.hbm_off_reason")), "hbm_off_reason set with arenas");
    for (int dev = 0; dev < 2; dev++) {
        json_t *h = hbm_of(st, dev);
        ck_assert_int_eq(jint(h, "capacity_bytes"), (long long)ARENA_CAP * BB);
        ck_assert_int_eq(jint(h, "used_bytes"), 0);
        ck_assert_int_eq(jint(h, "blocks"), 0);
        ck_assert_int_eq(jint(h, "moving_bytes"), 0);
        json_t *lb = json_object_get(h, "lent_by");
        ck_assert_msg(json_is_string(lb) && strcmp(json_string_value(lb), "fd") == 0,
                      "device %d: lent_by is not \"fd\" on the sim backend", dev);
    }
    json_decref(st);
}

/* ---- 1. placement and reads ----------------------------------------------------- */

START_TEST(hbm_put_get_by_device)
{
    kvh_daemon d;
    KVH_START(&d, sim_conf());
    check_sim_gpu(&d);
    kvnode_layout l = kvh_layout("hbm-basic", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0), *c0b = connect_dev(&d, &l, 0);
    kvnode_client *c1 = connect_dev(&d, &l, 1), *cpu = connect_dev(&d, &l, -1);

    /* Device 0 puts into device 0's arena. */
    kvnode_key a[CHUNK], b[CHUNK], x[CHUNK];
    kvh_chain(a, CHUNK, 1);
    kvh_chain(b, CHUNK, 2);
    kvh_chain(x, CHUNK, 3);
    kvnode_loc pl[CHUNK], gl[CHUNK];
    put_expect(c0, a, CHUNK, KVNODE_TIER_HBM, 11, KVNODE_TIER_HBM, 0, pl);
    json_t *st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    ck_assert_int_eq(jint(hbm_of(st, 0), "blocks"), CHUNK);
    ck_assert_int_eq(jint(hbm_of(st, 0), "used_bytes"), (long long)CHUNK * BB);
    ck_assert_int_eq(jint(hbm_of(st, 1), "blocks"), 0);
    ck_assert_int_eq(jint(st, "tiers.host.blocks"), 0);
    ck_assert_int_eq(jint(st, "demotions.hbm_puts_total"), CHUNK);
    ck_assert_int_eq(jint(st, "demotions.hbm_fallbacks_total"), 0);
    json_decref(st);

    /* Read back by the writer: same place, same bytes. */
    kvnode_lease lease;
    ck_assert_uint_eq(get_hold(c0, a, CHUNK, 11, &lease, gl), CHUNK);
    for (size_t i = 0; i < CHUNK; i++) {
        ck_assert_msg(gl[i].tier == KVNODE_TIER_HBM && gl[i].device == 0, "block %zu read from %s device %d", i,
                      tier_name(gl[i].tier), gl[i].device);
        ck_assert_msg(gl[i].ptr == pl[i].ptr, "block %zu: get_begin points elsewhere than put_begin did", i);
    }
    KVH_OK(c0, kvnode_get_end(c0, lease));
    /* By a second client on device 0. */
    get_expect(c0b, a, CHUNK, 11, KVNODE_TIER_HBM, 0);
    size_t got;
    int rc = kvh_get_verify(c0b, a, CHUNK, 11, 0, &got);
    ck_assert_msg(rc == 0 && got == CHUNK, "copying get of HBM blocks: rc %d got %zu: %s", rc, got, kvh_error());

    /* Device 1 puts into device 1's arena and reads them there. */
    put_expect(c1, b, CHUNK, KVNODE_TIER_HBM, 12, KVNODE_TIER_HBM, 1, NULL);
    ck_assert_int_eq(hbm_stat(&d, 1, "blocks"), CHUNK);
    ck_assert_int_eq(hbm_stat(&d, 0, "blocks"), CHUNK);
    get_expect(c1, b, CHUNK, 12, KVNODE_TIER_HBM, 1);

    /* $KVNODE_CUDA_DEVICE declares the device for kvnode_connect. */
    kvnode_key e[CHUNK];
    kvh_chain(e, CHUNK, 4);
    kvnode_client *ce;
    ck_assert_int_eq(setenv("KVNODE_CUDA_DEVICE", "1", 1), 0);
    rc = kvh_connect(&d, &l, &ce);
    unsetenv("KVNODE_CUDA_DEVICE");
    ck_assert_msg(rc == 0, "%s", kvh_error());
    ck_assert_int_eq(kvnode_cuda_device(ce), 1);
    put_expect(ce, e, CHUNK, KVNODE_TIER_HBM, 13, KVNODE_TIER_HBM, 1, NULL);
    get_expect(c1, e, CHUNK, 13, KVNODE_TIER_HBM, 1);
    kvnode_close(ce);

    /* A CPU-only client: its HBM put lands in host memory (a fallback)... */
    put_expect(cpu, x, CHUNK / 2, KVNODE_TIER_HBM, 14, KVNODE_TIER_HOST, -1, NULL);
    ck_assert_int_eq(KVH_STAT(&d, "demotions.hbm_fallbacks_total"), CHUNK / 2);
    /* ...the chain goes on in device 0's HBM. */
    put_expect(c0, x + CHUNK / 2, CHUNK / 2, KVNODE_TIER_HBM, 14, KVNODE_TIER_HBM, 0, NULL);
    ck_assert_int_eq(KVH_STAT(&d, "demotions.hbm_puts_total"), 3 * CHUNK + CHUNK / 2);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.blocks"), CHUNK / 2);

    /* The CPU client's GET prefix ends at the first block in HBM... */
    ck_assert_uint_eq(get_hold(cpu, x, CHUNK, 14, &lease, gl), CHUNK / 2);
    for (size_t i = 0; i < CHUNK / 2; i++)
        ck_assert_msg(gl[i].tier == KVNODE_TIER_HOST && gl[i].device == -1, "CPU client: block %zu in %s device %d",
                      i, tier_name(gl[i].tier), gl[i].device);
    KVH_OK(cpu, kvnode_get_end(cpu, lease));
    ck_assert_uint_eq(get_hold(cpu, a, CHUNK, 11, &lease, gl), 0);
    rc = kvh_get_verify(cpu, x, CHUNK, 14, 0, &got);
    ck_assert_msg(rc == 0 && got == CHUNK / 2, "CPU client copying get: rc %d got %zu (expected %d): %s", rc,
                  got, CHUNK / 2, kvh_error());
    /* ...while a client on device 0 reads the whole chain across both tiers. */
    ck_assert_uint_eq(get_hold(c0b, x, CHUNK, 14, &lease, gl), CHUNK);
    for (size_t i = 0; i < CHUNK; i++) {
        int want = i < CHUNK / 2 ? KVNODE_TIER_HOST : KVNODE_TIER_HBM;
        ck_assert_msg(gl[i].tier == want && gl[i].device == (i < CHUNK / 2 ? -1 : 0),
                      "block %zu of the mixed chain in %s device %d", i, tier_name(gl[i].tier), gl[i].device);
    }
    KVH_OK(c0b, kvnode_get_end(c0b, lease));

    /* MATCH counts every tier, for the CPU client too. */
    kvnode_tiers t;
    KVH_OK(cpu, kvnode_match_tiers(cpu, x, CHUNK, &t));
    ck_assert_msg(t.matched == CHUNK && t.hbm == CHUNK / 2 && t.host == CHUNK / 2 && t.store == 0,
                  "CPU client match of the mixed chain: matched %zu hbm %zu host %zu store %zu", t.matched, t.hbm,
                  t.host, t.store);
    KVH_OK(cpu, kvnode_match_tiers(cpu, a, CHUNK, &t));
    ck_assert_msg(t.matched == CHUNK && t.hbm == CHUNK && t.host == 0,
                  "CPU client match of an HBM chain: matched %zu hbm %zu host %zu", t.matched, t.hbm, t.host);
    size_t m;
    KVH_OK(cpu, kvnode_match(cpu, b, CHUNK, &m));
    ck_assert_uint_eq(m, CHUNK);
    KVH_OK(c0, kvnode_match_tiers(c0, b, CHUNK, &t));
    ck_assert_msg(t.matched == CHUNK && t.hbm == CHUNK, "device 0 client, device 1 chain: matched %zu hbm %zu",
                  t.matched, t.hbm);

    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 0);
    ck_assert_int_eq(KVH_STAT(&d, "leases.write"), 0);
    kvnode_close(c0);
    kvnode_close(c0b);
    kvnode_close(c1);
    kvnode_close(cpu);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* Every HBM arena is lent to every client on a GPU (the brief's HELLO
 * rule): a client on device 1 reads device 0's blocks in place, and the
 * other way round. */
/* A device's HBM is lent to the clients on that device only: for a client
 * on the other device a GET's prefix ends at the first block there (MATCH
 * still counts it), while clients on the device read it in place. */
START_TEST(hbm_of_another_device_ends_the_prefix)
{
    kvh_daemon d;
    KVH_START(&d, sim_conf());
    kvnode_layout l = kvh_layout("hbm-cross", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0), *c1 = connect_dev(&d, &l, 1);
    kvnode_key a[CHUNK], b[CHUNK];
    kvh_chain(a, CHUNK, 1);
    kvh_chain(b, CHUNK, 2);
    put_expect(c0, a, CHUNK, KVNODE_TIER_HBM, 15, KVNODE_TIER_HBM, 0, NULL);
    put_expect(c1, b, CHUNK, KVNODE_TIER_HBM, 16, KVNODE_TIER_HBM, 1, NULL);
    kvnode_loc locs[CHUNK];
    kvnode_lease lease = 1;
    size_t got = 99;
    KVH_OK(c1, kvnode_get_begin(c1, a, CHUNK, &lease, locs, &got));
    ck_assert_msg(got == 0 && lease == 0, "a client on device 1 got %zu blocks of device 0's HBM", got);
    KVH_OK(c0, kvnode_get_begin(c0, b, CHUNK, &lease, locs, &got));
    ck_assert_msg(got == 0 && lease == 0, "a client on device 0 got %zu blocks of device 1's HBM", got);
    kvnode_tiers t;
    KVH_OK(c1, kvnode_match_tiers(c1, a, CHUNK, &t));
    ck_assert_msg(t.matched == CHUNK && t.hbm == CHUNK, "match from device 1: %zu matched, %zu hbm", t.matched,
                  t.hbm);
    get_expect(c0, a, CHUNK, 15, KVNODE_TIER_HBM, 0);
    get_expect(c1, b, CHUNK, 16, KVNODE_TIER_HBM, 1);
    kvnode_close(c0);
    kvnode_close(c1);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 2. fallback ------------------------------------------------------------------ */

/* One put fills device 0's arena (c0 is on device 0); a read lease (*pin)
 * pins every block. The daemon runs with a slow copy: should a demotion
 * ever start between the commit and the get_begin, the pin aborts it. */
static void fill_pinned(const kvh_daemon *d, kvnode_client *c0, kvnode_key *full, kvnode_loc *locs,
                        kvnode_lease *pin, uint64_t seed)
{
    kvh_chain(full, ARENA_CAP, 1);
    put_expect(c0, full, ARENA_CAP, KVNODE_TIER_HBM, seed, KVNODE_TIER_HBM, 0, NULL);
    ck_assert_uint_eq(get_hold(c0, full, ARENA_CAP, seed, pin, locs), ARENA_CAP);
    for (size_t i = 0; i < ARENA_CAP; i++)
        ck_assert_msg(locs[i].tier == KVNODE_TIER_HBM && locs[i].device == 0, "pinned block %zu in %s device %d", i,
                      tier_name(locs[i].tier), locs[i].device);
    drain(d);
}

START_TEST(full_pinned_arena_falls_back_to_host)
{
    kvh_daemon d;
    /* Should a demotion ever start between the commit and the get_begin that
     * pins the blocks, a 1 s copy lets the pin abort it: the blocks stay. */
    const char *env[] = { "KVNODE_DEVMEM_SIM_COPY_DELAY_MS=1000", NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(&d, sim_conf(), &o) == 0, "start: %s", kvh_error());
    kvnode_layout l = kvh_layout("hbm-fallback", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0), *c1 = connect_dev(&d, &l, 1);

    /* One put fills device 0's arena; a read lease pins every block. */
    static kvnode_key full[ARENA_CAP];
    kvnode_loc locs[ARENA_CAP];
    kvnode_lease pin;
    fill_pinned(&d, c0, full, locs, &pin, 21);
    json_t *st = settle(&d);
    ck_assert_int_eq(jint(hbm_of(st, 0), "used_bytes"), (long long)ARENA_CAP * BB);
    ck_assert_int_eq(jint(hbm_of(st, 0), "blocks"), ARENA_CAP);
    ck_assert_int_eq(jint(st, "demotions.blocks_total"), 0);
    long long puts0 = jint(st, "demotions.hbm_puts_total"), fb0 = jint(st, "demotions.hbm_fallbacks_total");
    ck_assert_int_eq(puts0, ARENA_CAP);
    ck_assert_int_eq(fb0, 0);
    json_decref(st);

    /* Further HBM puts land in host memory and are counted. */
    kvnode_key more[3][CHUNK];
    for (int k = 0; k < 3; k++) {
        kvh_chain(more[k], CHUNK, 10 + (uint64_t)k);
        put_expect(c0, more[k], CHUNK, KVNODE_TIER_HBM, 22, KVNODE_TIER_HOST, -1, NULL);
    }
    st = settle(&d);
    ck_assert_int_eq(jint(st, "demotions.hbm_fallbacks_total"), fb0 + 3 * CHUNK);
    ck_assert_int_eq(jint(st, "demotions.hbm_puts_total"), puts0);
    ck_assert_int_eq(jint(st, "demotions.blocks_total"), 0);
    ck_assert_int_eq(jint(hbm_of(st, 0), "blocks"), ARENA_CAP);
    ck_assert_int_eq(jint(st, "tiers.host.blocks"), 3 * CHUNK);
    json_decref(st);
    for (int k = 0; k < 3; k++)
        get_expect(c1, more[k], CHUNK, 22, KVNODE_TIER_HOST, -1);
    /* Device 1 has room: its HBM puts still land there. */
    kvnode_key d1[CHUNK];
    kvh_chain(d1, CHUNK, 20);
    put_expect(c1, d1, CHUNK, KVNODE_TIER_HBM, 23, KVNODE_TIER_HBM, 1, NULL);
    ck_assert_int_eq(KVH_STAT(&d, "demotions.hbm_puts_total"), puts0 + CHUNK);

    /* The pinned blocks never moved and are intact. */
    for (size_t i = 0; i < ARENA_CAP; i++)
        ck_assert_msg(kvh_verify(locs[i].ptr, BB, full[i], 21) == 0, "pinned block %zu: %s", i, kvh_error());
    get_expect(c0, full, ARENA_CAP, 21, KVNODE_TIER_HBM, 0);
    KVH_OK(c0, kvnode_get_end(c0, pin));

    kvnode_close(c0);
    kvnode_close(c1);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* The arena above its high watermark with every block pinned: once the
 * pins go, demotion brings it down (no further put needed: demotion keeps
 * room in HBM), and the next HBM put lands there. */
START_TEST(released_blocks_over_high_watermark_are_demoted)
{
    kvh_daemon d;
    const char *env[] = { "KVNODE_DEVMEM_SIM_COPY_DELAY_MS=100", NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(&d, sim_conf(), &o) == 0, "start: %s", kvh_error());
    kvnode_layout l = kvh_layout("hbm-release", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0);
    static kvnode_key full[ARENA_CAP];
    kvnode_loc locs[ARENA_CAP];
    kvnode_lease pin;
    fill_pinned(&d, c0, full, locs, &pin, 24);
    json_t *st = settle(&d);
    ck_assert_int_eq(jint(hbm_of(st, 0), "used_bytes"), (long long)ARENA_CAP * BB);
    ck_assert_int_eq(jint(st, "demotions.blocks_total"), 0);
    json_decref(st);

    KVH_OK(c0, kvnode_get_end(c0, pin));
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 0);
    uint64_t deadline = kvh_now_ms() + 3000;
    for (;;) {
        st = kvh_stats(&d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        long long used = jint(hbm_of(st, 0), "used_bytes"), moving = jint(hbm_of(st, 0), "moving_bytes");
        long long moved = jint(st, "demotions.blocks_total");
        json_decref(st);
        if (moving == 0 && (double)used <= HIGH_WM * (double)(ARENA_CAP * BB))
            break;
        ck_assert_msg(kvh_now_ms() < deadline, "3 s after its read lease ended, device 0's arena is still at "
                      "%lld of %d bytes (%lld moving, %lld blocks demoted): nothing demotes the released blocks",
                      used, (int)(ARENA_CAP * BB), moving, moved);
        kvh_sleep_ms(20);
    }
    st = settle(&d);
    ck_assert_int_gt(jint(st, "demotions.blocks_total"), 0);
    ck_assert_int_eq(jint(st, "demotions.dropped_total"), 0);
    json_decref(st);
    kvnode_key k[CHUNK];
    kvh_chain(k, CHUNK, 30);
    put_expect(c0, k, CHUNK, KVNODE_TIER_HBM, 25, KVNODE_TIER_HBM, 0, NULL);
    ck_assert_int_eq(KVH_STAT(&d, "demotions.hbm_fallbacks_total"), 0);
    for (size_t i = 0; i < ARENA_CAP; i += CHUNK)
        get_expect(c0, full + i, CHUNK, 24, 0, 0);

    kvnode_close(c0);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* Issue 13 defect 6: with a store, every committed block is pinned until its
 * write lands, so the demotion pass a put starts finds nothing to move. One
 * put fills the arena (64 blocks, high watermark 58); once the 64 writes
 * have landed the blocks are movable again and demotion must bring the arena
 * down to the low watermark (51 blocks) with no further put or lease end. */
START_TEST(demotion_resumes_when_store_writes_land)
{
    kvh_daemon d;
    char dir[PATH_MAX], conf[PATH_MAX + 256];
    ck_assert_msg(kvh_mkdtemp(dir, sizeof dir) == 0, "%s", kvh_error());
    snprintf(conf, sizeof conf, SIM_CONF "persist.backend=file\npersist.path=%s\n"
             "persist.policy=write_through\npersist.fsync=never\n", dir);
    KVH_START(&d, conf);
    kvnode_layout l = kvh_layout("hbm-store", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0);
    static kvnode_key full[ARENA_CAP];
    kvh_chain(full, ARENA_CAP, 1);
    put_expect(c0, full, ARENA_CAP, KVNODE_TIER_HBM, 26, KVNODE_TIER_HBM, 0, NULL);

    long long last;
    ck_assert_msg(kvh_wait_stat(&d, "persist.written_blocks_total", ARENA_CAP, 10000, &last) == 0,
                  "%lld of %d blocks written to the store within 10 s", last, ARENA_CAP);
    ck_assert_msg(kvh_wait_stat(&d, "persist.pinned_for_writes_bytes", 0, 10000, &last) == 0,
                  "%lld bytes still pinned by store writes", last);
    /* Nothing else happens from here on: only the landed writes can restart
     * demotion. (The bound ends a failing test; nothing is timed.) */
    uint64_t deadline = kvh_now_ms() + 3000;
    json_t *st;
    for (;;) {
        st = kvh_stats(&d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        long long used = jint(hbm_of(st, 0), "used_bytes"), moving = jint(hbm_of(st, 0), "moving_bytes");
        if (used <= (long long)LOW_BLOCKS * BB && moving == 0 && jint(st, "demotions.batches_pending") == 0)
            break;
        ck_assert_msg(kvh_now_ms() < deadline, "3 s after all %d writes landed, device 0's arena holds %lld of "
                      "%d blocks (high watermark %.2f = %.1f blocks, low %.2f = %d), %lld bytes moving, %lld "
                      "blocks demoted: demotion did not resume when the writes landed", ARENA_CAP,
                      used / BB, ARENA_CAP, HIGH_WM, HIGH_WM * ARENA_CAP, LOW_WM, LOW_BLOCKS, moving,
                      jint(st, "demotions.blocks_total"));
        json_decref(st);
        kvh_sleep_ms(20);
    }
    json_decref(st);
    st = settle(&d);
    ck_assert_int_eq(jint(hbm_of(st, 0), "used_bytes"), (long long)LOW_BLOCKS * BB);
    ck_assert_int_eq(jint(hbm_of(st, 0), "blocks"), LOW_BLOCKS);
    ck_assert_int_eq(jint(st, "demotions.blocks_total"), ARENA_CAP - LOW_BLOCKS);
    ck_assert_int_eq(jint(st, "demotions.dropped_total"), 0);
    ck_assert_int_eq(jint(st, "demotions.failed_total"), 0);
    ck_assert_int_eq(jint(st, "tiers.host.blocks"), ARENA_CAP - LOW_BLOCKS);
    ck_assert_int_eq(jint(st, "persist.written_blocks_total"), ARENA_CAP);
    json_decref(st);
    /* Every block byte-exact, the chain's root still in HBM. */
    kvnode_loc locs[ARENA_CAP];
    kvnode_lease lease;
    ck_assert_uint_eq(get_hold(c0, full, ARENA_CAP, 26, &lease, locs), ARENA_CAP);
    size_t in_hbm = 0;
    for (size_t i = 0; i < ARENA_CAP; i++)
        in_hbm += locs[i].tier == KVNODE_TIER_HBM;
    ck_assert_uint_eq(in_hbm, LOW_BLOCKS);
    ck_assert_msg(locs[0].tier == KVNODE_TIER_HBM, "the chain's root was demoted before its leaves");
    KVH_OK(c0, kvnode_get_end(c0, lease));

    kvnode_close(c0);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 3. demotion keeps every byte ----------------------------------------------- */

#define P3 CHUNK
#define PRESSURE3 (4 * ARENA_CAP)

START_TEST(demotion_under_pressure_keeps_every_byte)
{
    kvh_daemon d;
    char addr[PATH_MAX + 16], conf[2 * PATH_MAX];
    admin_conf(addr, sizeof addr, conf, sizeof conf, sim_conf());
    KVH_START(&d, conf);
    kvnode_layout l = kvh_layout("hbm-pressure", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0), *c1 = connect_dev(&d, &l, 1), *r0 = connect_dev(&d, &l, 0);

    /* A read lease on HBM blocks, taken before the pressure. */
    kvnode_key p[P3];
    kvnode_loc plocs[P3], locs[MAXN];
    kvh_chain(p, P3, 1);
    put_expect(c0, p, P3, KVNODE_TIER_HBM, 31, KVNODE_TIER_HBM, 0, NULL);
    kvnode_lease plead;
    ck_assert_uint_eq(get_hold(c0, p, P3, 31, &plead, plocs), P3);

    /* Four arenas' worth of HBM puts, as fast as they go (demotion runs
     * alongside; puts that find the arena full land in host memory). The
     * leased blocks stay intact at their place throughout. */
    uint64_t first = 100, next = first;
    kvnode_key keys[CHUNK];
    for (size_t done = 0; done < PRESSURE3; done += CHUNK) {
        kvh_chain(keys, CHUNK, next++);
        put_tier(c0, keys, CHUNK, KVNODE_TIER_HBM, 32, NULL);
        for (size_t i = 0; i < P3; i++)
            ck_assert_msg(kvh_verify(plocs[i].ptr, BB, p[i], 31) == 0, "leased block %zu after %zu puts: %s", i,
                          done + CHUNK, kvh_error());
    }
    json_t *st = settle(&d);
    long long moved = jint(st, "demotions.blocks_total");
    ck_assert_msg(moved > 0, "no block demoted after %d HBM puts into a %d-block arena", PRESSURE3, ARENA_CAP);
    ck_assert_int_eq(jint(st, "demotions.bytes_total"), moved * BB);
    ck_assert_int_eq(jint(st, "demotions.failed_total"), 0);
    ck_assert_int_eq(jint(st, "demotions.dropped_total"), 0);
    ck_assert_int_gt(jint(st, "demotions.batches_total"), 0);
    ck_assert_int_gt(jint(st, "demotions.transfers_total"), 0);
    ck_assert_int_eq(jint(st, "demotions.hbm_puts_total") + jint(st, "demotions.hbm_fallbacks_total"),
                     P3 + PRESSURE3);
    ck_assert_int_eq(jint(st, "evictions.host.dropped_total"), 0);
    json_t *cs = kvh_json_get(st, "demotions.copy_seconds_total");
    ck_assert_msg(json_is_number(cs) && json_number_value(cs) >= 0, "copy_seconds_total missing or negative");
    expect_hbm_under_high(st, 0);
    ck_assert_int_eq(jint(hbm_of(st, 1), "blocks"), 0);
    long long hbm_blocks = jint(hbm_of(st, 0), "blocks"), host_blocks = jint(st, "tiers.host.blocks");
    long long hbm_used = jint(hbm_of(st, 0), "used_bytes");
    ck_assert_int_eq(hbm_blocks + host_blocks, P3 + PRESSURE3);
    ck_assert_int_eq(host_blocks, moved + jint(st, "demotions.hbm_fallbacks_total"));

    /* /metrics says the same. */
    char *page = get_metrics(addr);
    ck_assert_msg(metric(page, "kvnode_demotions_total{result=\"moved\"}") == (double)moved,
                  "kvnode_demotions_total{moved} %g, stats blocks_total %lld",
                  metric(page, "kvnode_demotions_total{result=\"moved\"}"), moved);
    ck_assert_msg(metric(page, "kvnode_demotions_total{result=\"dropped\"}") == 0, "dropped demotions in /metrics");
    ck_assert_msg(metric(page, "kvnode_tier_used_bytes{tier=\"hbm\",device=\"0\"}") == (double)hbm_used,
                  "kvnode_tier_used_bytes{hbm,0} %g, stats %lld",
                  metric(page, "kvnode_tier_used_bytes{tier=\"hbm\",device=\"0\"}"), hbm_used);
    ck_assert_msg(metric(page, "kvnode_tier_used_bytes{tier=\"hbm\",device=\"1\"}") == 0, "device 1 used in /metrics");
    free(page);
    json_decref(st);

    /* Every block reads back byte-exact, from wherever it is now; MATCH
     * agrees on the tiers. */
    long long seen_hbm = 0, seen_host = 0;
    for (uint64_t ch = first; ch < next; ch++) {
        kvnode_lease lease;
        kvh_chain(keys, CHUNK, ch);
        kvnode_tiers t;
        KVH_OK(r0, kvnode_match_tiers(r0, keys, CHUNK, &t));
        ck_assert_msg(t.matched == CHUNK && t.hbm + t.host == CHUNK && t.store == 0,
                      "chain %llu: matched %zu hbm %zu host %zu store %zu", (unsigned long long)ch, t.matched,
                      t.hbm, t.host, t.store);
        ck_assert_uint_eq(get_hold(r0, keys, CHUNK, 32, &lease, locs), CHUNK);
        size_t nh = 0;
        for (size_t i = 0; i < CHUNK; i++) {
            ck_assert_msg(locs[i].tier == KVNODE_TIER_HOST || locs[i].device == 0,
                          "chain %llu block %zu on device %d", (unsigned long long)ch, i, locs[i].device);
            nh += locs[i].tier == KVNODE_TIER_HBM;
        }
        ck_assert_msg(nh == t.hbm, "chain %llu: %zu blocks read from HBM, match said %zu", (unsigned long long)ch,
                      nh, t.hbm);
        seen_hbm += (long long)nh;
        seen_host += CHUNK - (long long)nh;
        KVH_OK(r0, kvnode_get_end(r0, lease));
    }
    ck_assert_int_eq(seen_hbm, hbm_blocks - P3);
    ck_assert_int_eq(seen_host, host_blocks);

    /* The lease taken before the pressure is still valid: the blocks are at
     * their original HBM place, intact; ending it works. */
    for (size_t i = 0; i < P3; i++)
        ck_assert_msg(kvh_verify(plocs[i].ptr, BB, p[i], 31) == 0, "leased block %zu: %s", i, kvh_error());
    kvnode_lease again;
    ck_assert_uint_eq(get_hold(c0, p, P3, 31, &again, locs), P3);
    for (size_t i = 0; i < P3; i++)
        ck_assert_msg(locs[i].tier == KVNODE_TIER_HBM && locs[i].ptr == plocs[i].ptr,
                      "leased block %zu moved: now %s device %d", i, tier_name(locs[i].tier), locs[i].device);
    KVH_OK(c0, kvnode_get_end(c0, again));
    KVH_OK(c0, kvnode_get_end(c0, plead));
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 0);

    kvnode_close(c0);
    kvnode_close(c1);
    kvnode_close(r0);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 4. pinned blocks stay --------------------------------------------------------- */

#define P4 16

START_TEST(pinned_hbm_blocks_are_never_demoted)
{
    kvh_daemon d;
    KVH_START(&d, sim_conf());
    kvnode_layout l = kvh_layout("hbm-pinned", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0), *other = connect_dev(&d, &l, 0);

    kvnode_key p[P4];
    kvnode_loc plocs[P4], locs[P4];
    kvh_chain(p, P4, 1);
    put_expect(c0, p, P4, KVNODE_TIER_HBM, 41, KVNODE_TIER_HBM, 0, NULL);
    /* Two leases on the blocks (one per half, and one on all). */
    kvnode_lease l1, l2;
    ck_assert_uint_eq(get_hold(c0, p, P4, 41, &l1, plocs), P4);
    ck_assert_uint_eq(get_hold(c0, p, P4 / 2, 41, &l2, locs), P4 / 2);

    uint64_t next = 100;
    pressure(&d, c0, 3 * ARENA_CAP, &next, 42, false);
    json_t *st = settle(&d);
    long long moved = jint(st, "demotions.blocks_total");
    ck_assert_msg(moved > 0, "nothing was demoted: the pressure did not work");
    expect_hbm_under_high(st, 0);
    ck_assert_int_ge(jint(hbm_of(st, 0), "blocks"), P4);
    json_decref(st);

    /* Still in HBM, at the same place, byte-exact: for the holder... */
    kvnode_lease l3;
    ck_assert_uint_eq(get_hold(c0, p, P4, 41, &l3, locs), P4);
    for (size_t i = 0; i < P4; i++) {
        ck_assert_msg(locs[i].tier == KVNODE_TIER_HBM && locs[i].device == 0 && locs[i].ptr == plocs[i].ptr,
                      "pinned block %zu is now in %s device %d", i, tier_name(locs[i].tier), locs[i].device);
        ck_assert_msg(kvh_verify(plocs[i].ptr, BB, p[i], 41) == 0, "pinned block %zu: %s", i, kvh_error());
    }
    KVH_OK(c0, kvnode_get_end(c0, l3));
    /* ...and for anybody. */
    get_expect(other, p, P4, 41, KVNODE_TIER_HBM, 0);

    /* Released, they are ordinary blocks: more pressure demotes them. */
    KVH_OK(c0, kvnode_get_end(c0, l2));
    KVH_OK(c0, kvnode_get_end(c0, l1));
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 0);
    pressure(&d, c0, 3 * ARENA_CAP, &next, 42, true);
    st = settle(&d);
    ck_assert_int_gt(jint(st, "demotions.blocks_total"), moved + P4);
    ck_assert_int_eq(jint(st, "demotions.dropped_total"), 0);
    expect_hbm_under_high(st, 0);
    json_decref(st);
    get_expect(other, p, P4, 41, KVNODE_TIER_HOST, -1);

    kvnode_close(c0);
    kvnode_close(other);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 5. a block being moved stays readable ------------------------------------- */

#define N5 (ARENA_CAP - CHUNK)    /* 56 blocks: under the high watermark (57.6) */

START_TEST(block_being_moved_stays_readable)
{
    kvh_daemon d;
    const char *env[] = { "KVNODE_DEVMEM_SIM_COPY_DELAY_MS=500", NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(&d, sim_conf(), &o) == 0, "start: %s", kvh_error());
    kvnode_layout l = kvh_layout("hbm-moving", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0), *reader = connect_dev(&d, &l, 0);

    /* 56 blocks in HBM (7 chains, the first the least recently used): no
     * demotion yet. */
    static kvnode_key keys[N5 + CHUNK];
    kvh_chain(keys, N5 + CHUNK, 1);
    for (size_t i = 0; i < N5; i += CHUNK)
        put_expect(c0, keys + i, CHUNK, KVNODE_TIER_HBM, 51, KVNODE_TIER_HBM, 0, NULL);
    json_t *st = settle(&d);
    ck_assert_int_eq(jint(st, "demotions.batches_total"), 0);
    ck_assert_int_eq(jint(hbm_of(st, 0), "blocks"), N5);
    json_decref(st);

    /* One more chain passes the high watermark: a batch of the oldest
     * blocks starts moving (and takes 500 ms). */
    put_expect(c0, keys + N5, CHUNK, KVNODE_TIER_HBM, 51, KVNODE_TIER_HBM, 0, NULL);
    uint64_t deadline = kvh_now_ms() + 2000;
    long long pending = 0, moving = 0, batches0 = 0;
    while (pending == 0 || moving == 0) {
        st = kvh_stats(&d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        pending = jint(st, "demotions.batches_pending");
        moving = jint(hbm_of(st, 0), "moving_bytes");
        batches0 = jint(st, "demotions.batches_total");
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "no demotion started after passing the high watermark");
        if (pending == 0 || moving == 0)
            kvh_sleep_ms(2);
    }
    ck_assert_int_eq(batches0, 0);

    /* While it moves, the victims (the first chains) read back at HBM, or
     * already at host, byte-exact. */
    kvnode_loc locs[2 * CHUNK];
    kvnode_lease lease;
    ck_assert_uint_eq(get_hold(reader, keys, 2 * CHUNK, 51, &lease, locs), 2 * CHUNK);
    size_t at_hbm = 0;
    for (size_t i = 0; i < 2 * CHUNK; i++) {
        if (locs[i].tier == KVNODE_TIER_HBM) {
            ck_assert_int_eq(locs[i].device, 0);
            at_hbm++;
        }
    }
    st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    long long batches_after = jint(st, "demotions.batches_total");
    long long pending_after = jint(st, "demotions.batches_pending");
    json_decref(st);
    ck_assert_msg(batches_after == batches0 && pending_after > 0,
                  "the 500 ms batch finished before the get_begin was answered (batches %lld -> %lld)", batches0,
                  batches_after);
    ck_assert_msg(at_hbm > 0, "every victim was at host while its batch was still pending");

    /* The batch comes back: the moves of what the reader pinned are aborted;
     * the bytes are still intact where the lease says. */
    deadline = kvh_now_ms() + 5000;
    while (KVH_STAT(&d, "demotions.batches_total") == batches0) {
        ck_assert_msg(kvh_now_ms() < deadline, "the demotion batch did not finish within 5 s");
        kvh_sleep_ms(10);
    }
    long long aborted = KVH_STAT(&d, "demotions.aborted_total");
    ck_assert_msg(aborted > 0, "blocks read at HBM while being moved, yet aborted_total is 0");
    ck_assert_msg(aborted <= (long long)at_hbm, "aborted_total %lld but only %zu pinned blocks were at HBM",
                  aborted, at_hbm);
    for (size_t i = 0; i < 2 * CHUNK; i++)
        ck_assert_msg(kvh_verify(locs[i].ptr, BB, keys[i], 51) == 0, "block %zu after the aborted move: %s", i,
                      kvh_error());
    /* A pinned block whose move was aborted is still at its HBM place. */
    kvnode_loc again[2 * CHUNK];
    kvnode_lease l2;
    ck_assert_uint_eq(get_hold(reader, keys, 2 * CHUNK, 51, &l2, again), 2 * CHUNK);
    for (size_t i = 0; i < 2 * CHUNK; i++)
        if (locs[i].tier == KVNODE_TIER_HBM)
            ck_assert_msg(again[i].tier == KVNODE_TIER_HBM && again[i].ptr == locs[i].ptr,
                          "pinned block %zu left its HBM place while leased", i);
    KVH_OK(reader, kvnode_get_end(reader, l2));
    KVH_OK(reader, kvnode_get_end(reader, lease));

    /* Once everything settles, every block is intact. */
    st = settle(&d);
    ck_assert_int_eq(jint(st, "demotions.failed_total"), 0);
    ck_assert_int_eq(jint(st, "demotions.dropped_total"), 0);
    expect_hbm_under_high(st, 0);
    ck_assert_int_eq(jint(hbm_of(st, 0), "blocks") + jint(st, "tiers.host.blocks"), N5 + CHUNK);
    json_decref(st);
    for (size_t i = 0; i < N5 + CHUNK; i += CHUNK)
        get_expect(reader, keys + i, CHUNK, 51, 0, 0);

    kvnode_close(c0);
    kvnode_close(reader);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 6. a killed client ------------------------------------------------------------ */

#define N6 CHUNK

/* In the child (kvh_spawn_holder): read-lease the committed R, reserve W in HBM and write it. */
static int hold_hbm_leases(const kvh_daemon *d, char *msg, size_t len)
{
    kvnode_layout l = kvh_layout("hbm-kill", BB, 1, 0);
    kvnode_client *c = NULL;
    kvnode_key r[N6], w[N6];
    kvnode_loc locs[N6];
    kvnode_lease lr, lw;
    size_t got;
    kvh_chain(r, N6, 1);
    kvh_chain(w, N6, 2);
    int rc = kvnode_connect_device(d->sock, &l, 0, &c);
    if (rc != 0) {
        snprintf(msg, len, "connect_device: %s", kvnode_connect_error());
        return -1;
    }
    rc = kvnode_get_begin(c, r, N6, &lr, locs, &got);
    if (rc != 0 || got != N6) {
        snprintf(msg, len, "get_begin rc %d got %zu: %s", rc, got, kvnode_last_error(c));
        return -1;
    }
    for (size_t i = 0; i < N6; i++) {
        if (locs[i].tier != KVNODE_TIER_HBM || locs[i].device != 0 || kvh_verify(locs[i].ptr, BB, r[i], 61) != 0) {
            snprintf(msg, len, "get_begin: block %zu in tier %d device %d or wrong bytes", i,
                     locs[i].tier, locs[i].device);
            return -1;
        }
    }
    rc = kvnode_put_begin(c, w, N6, KVNODE_TIER_HBM, &lw, locs);
    if (rc != 0) {
        snprintf(msg, len, "put_begin rc %d: %s", rc, kvnode_last_error(c));
        return -1;
    }
    for (size_t i = 0; i < N6; i++) {
        if (!locs[i].ptr || locs[i].tier != KVNODE_TIER_HBM || locs[i].device != 0) {
            snprintf(msg, len, "put_begin: slot %zu is %p tier %d device %d", i, locs[i].ptr,
                     locs[i].tier, locs[i].device);
            return -1;
        }
        kvh_fill(locs[i].ptr, BB, w[i], 62);
    }
    return 0;
}

START_TEST(killed_client_leaves_no_hbm_behind)
{
    kvh_daemon d;
    KVH_START(&d, sim_conf());
    kvnode_layout l = kvh_layout("hbm-kill", BB, 1, 0);
    kvnode_client *c = connect_dev(&d, &l, 0);
    kvnode_key r[N6], w[N6];
    kvh_chain(r, N6, 1);
    kvh_chain(w, N6, 2);
    put_expect(c, r, N6, KVNODE_TIER_HBM, 61, KVNODE_TIER_HBM, 0, NULL);
    ck_assert_int_eq(hbm_stat(&d, 0, "used_bytes"), (long long)N6 * BB);

    pid_t pid = kvh_spawn_holder(&d, hold_hbm_leases);
    ck_assert_msg(pid > 0, "%s", kvh_error());
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 1);
    ck_assert_int_eq(KVH_STAT(&d, "leases.write"), 1);
    ck_assert_int_eq(hbm_stat(&d, 0, "used_bytes"), 2LL * N6 * BB);

    int ws = proc_stop(&pid, SIGKILL, KVH_STOP_TIMEOUT_MS);
    ck_assert_msg(ws >= 0, "%s", proc_error());
    ck_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);

    long long last;
    ck_assert_msg(kvh_wait_stat(&d, "leases.read", 0, 3000, &last) == 0,
                  "read lease of the killed client still counted: %lld", last);
    ck_assert_msg(kvh_wait_stat(&d, "leases.write", 0, 3000, &last) == 0,
                  "write lease of the killed client still counted: %lld", last);
    ck_assert_msg(kvh_wait_stat(&d, "tiers.hbm.0.used_bytes", (long long)N6 * BB, 3000, &last) == 0,
                  "HBM used_bytes %lld, expected %lld (the committed blocks only)", last, (long long)N6 * BB);
    ck_assert_int_eq(hbm_stat(&d, 0, "blocks"), N6);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.used_bytes"), 0);

    /* The reserved keys never became visible and are free again. */
    long m = kvh_match(c, w, N6);
    ck_assert_msg(m == 0, "keys reserved by the killed client are visible: match %ld", m);
    kvnode_loc locs[N6];
    kvnode_lease lease;
    KVH_OK(c, kvnode_put_begin(c, w, N6, KVNODE_TIER_HBM, &lease, locs));
    for (size_t i = 0; i < N6; i++)
        ck_assert_msg(locs[i].ptr != NULL && locs[i].tier == KVNODE_TIER_HBM,
                      "key %zu still reserved after its writer died", i);
    KVH_OK(c, kvnode_put_abort(c, lease));
    ck_assert_int_eq(hbm_stat(&d, 0, "used_bytes"), (long long)N6 * BB);
    /* The committed blocks are intact, in HBM... */
    get_expect(c, r, N6, 61, KVNODE_TIER_HBM, 0);

    /* ...and no longer pinned: pressure demotes them. */
    uint64_t next = 100;
    pressure(&d, c, 2 * ARENA_CAP, &next, 63, true);
    json_t *st = settle(&d);
    ck_assert_int_gt(jint(st, "demotions.blocks_total"), 0);
    expect_hbm_under_high(st, 0);
    json_decref(st);
    get_expect(c, r, N6, 61, KVNODE_TIER_HOST, -1);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 7. hbm.required --------------------------------------------------------------- */

#define NODEV_CONF "memory.slab_bytes=256KiB\nhbm.bytes=8MiB\n"

/* Whether the daemon found a real GPU (backend auto on a GPU machine). */
static bool has_cuda_gpu(json_t *st)
{
    json_t *b = kvh_json_get(st, "gpu.backend");
    return json_is_string(b) && strcmp(json_string_value(b), "cuda") == 0 &&
           kvh_json_int(st, "gpu.devices_visible") > 0;
}

/* Start a daemon expected to fail at start; returns its log (free()). When it
 * starts anyway and allow_gpu, returns NULL (it found a GPU). */
static char *expect_start_failure(const char *conf, const char *what, bool allow_gpu)
{
    kvh_daemon d;
    uint64_t t0 = kvh_now_ms();
    ck_assert_msg(kvh_spawn(&d, conf) == 0, "spawn: %s", kvh_error());
    int st = kvh_wait_exit(&d, 5000);
    if (st == KVH_EXIT_TIMEOUT && allow_gpu && kvh_wait_ready(&d, 5000) == 0) {
        json_t *s = kvh_stats(&d);
        bool gpu = s && has_cuda_gpu(s);
        json_decref(s);
        if (gpu) {
            fprintf(stderr, "note: %s: a GPU is visible, the daemon started (as it should)\n", what);
            KVH_STOP_DESTROY(&d);
            return NULL;
        }
    }
    char *log = kvh_read_log(&d);
    ck_assert_msg(st != KVH_EXIT_TIMEOUT, "%s: kvnoded still running after 5 s; log:\n%s", what, log ? log : "");
    ck_assert_msg(st > 0 && st < KVH_EXIT_SIGNAL_BASE, "%s: kvnoded ended with status %d, expected an exit "
                  "code > 0; log:\n%s", what, st, log ? log : "");
    ck_assert_msg(kvh_now_ms() - t0 < 5000, "%s: took %llu ms to fail", what,
                  (unsigned long long)(kvh_now_ms() - t0));
    ck_assert_ptr_nonnull(log);
    kvh_destroy(&d);
    return log;
}

START_TEST(required_hbm_without_device_fails_start)
{
    char *log = expect_start_failure(NODEV_CONF "hbm.backend=none\nhbm.required=on\n", "backend none", false);
    ck_assert_msg(strstr(log, "hbm.required") != NULL, "no mention of hbm.required in:\n%s", log);
    ck_assert_msg(strstr(log, "none") != NULL, "the message does not say why (backend none):\n%s", log);
    free(log);
    log = expect_start_failure(NODEV_CONF "hbm.backend=auto\nhbm.required=on\n", "backend auto", true);
    if (log) {
        ck_assert_msg(strstr(log, "hbm.required") != NULL, "no mention of hbm.required in:\n%s", log);
        free(log);
    }
}
END_TEST

START_TEST(optional_hbm_without_device_serves_from_host)
{
    const char *backends[] = { "none", "auto" };
    for (int bi = 0; bi < 2; bi++) {
        kvh_daemon d;
        char conf[256];
        snprintf(conf, sizeof conf, NODEV_CONF "hbm.backend=%s\nhbm.required=off\n", backends[bi]);
        KVH_START(&d, conf);
        json_t *st = kvh_stats(&d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        if (bi == 1 && has_cuda_gpu(st)) {
            fprintf(stderr, "note: backend auto: a GPU is visible, HBM tier on (as it should)\n");
            json_decref(st);
            KVH_STOP_DESTROY(&d);
            continue;
        }
        ck_assert_int_eq(jint(st, "gpu.hbm_arenas"), 0);
        json_t *why = kvh_json_get(st, "gpu.hbm_off_reason");
        ck_assert_msg(json_is_string(why) && *json_string_value(why), "backend %s: no hbm_off_reason", backends[bi]);
        json_t *arr = kvh_json_get(st, "tiers.hbm");
        ck_assert_msg(json_is_array(arr) && json_array_size(arr) == 0, "backend %s: tiers.hbm is not empty",
                      backends[bi]);
        json_decref(st);
        char *log = kvh_read_log(&d);
        ck_assert_ptr_nonnull(log);
        ck_assert_msg(strstr(log, "HBM tier off") != NULL, "backend %s: no \"HBM tier off\" in the log:\n%s",
                      backends[bi], log);
        free(log);

        /* A client on a GPU still works; its HBM puts land in host memory. */
        kvnode_layout l = kvh_layout("hbm-off", BB, 1, 0);
        kvnode_client *c = connect_dev(&d, &l, 0);
        kvnode_key k[CHUNK];
        kvh_chain(k, CHUNK, 1);
        put_expect(c, k, CHUNK, KVNODE_TIER_HBM, 71, KVNODE_TIER_HOST, -1, NULL);
        get_expect(c, k, CHUNK, 71, KVNODE_TIER_HOST, -1);
        ck_assert_int_eq(KVH_STAT(&d, "demotions.hbm_fallbacks_total"), CHUNK);
        ck_assert_int_eq(KVH_STAT(&d, "demotions.hbm_puts_total"), 0);
        ck_assert_int_eq(KVH_STAT(&d, "demotions.blocks_total"), 0);
        kvnode_tiers t;
        KVH_OK(c, kvnode_match_tiers(c, k, CHUNK, &t));
        ck_assert_msg(t.matched == CHUNK && t.host == CHUNK && t.hbm == 0, "match: %zu host %zu hbm %zu",
                      t.matched, t.host, t.hbm);
        kvnode_close(c);
        KVH_STOP_DESTROY(&d);
    }
}
END_TEST

/* ---- 8. pinning the host arena ------------------------------------------------------ */

START_TEST(host_arena_pinned_in_background)
{
    kvh_daemon d;
    char addr[PATH_MAX + 16], conf[2 * PATH_MAX];
    admin_conf(addr, sizeof addr, conf, sizeof conf,
               "memory.host_bytes=6MiB\nmemory.slab_bytes=256KiB\nmemory.pin_host=on\n"
               "memory.pin_chunk_bytes=1MiB\nhbm.backend=sim\nhbm.bytes=1MiB\n");
    const char *env[] = { "KVNODE_DEVMEM_SIM_PIN_DELAY_MS=300", NULL };
    kvh_spawn_opts o = { .env = env };
    uint64_t t0 = kvh_now_ms();
    ck_assert_msg(kvh_start_ex(&d, conf, &o) == 0, "start: %s", kvh_error());

    /* Serving while pinning goes on (6 chunks of 300 ms). */
    kvnode_client *obs;
    KVH_CONNECT(&d, NULL, &obs);
    KVH_OK(obs, kvnode_ping(obs));
    char *body = NULL;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/readyz", &body, NULL, 0), 200);
    free(body);
    json_t *st = kvh_stats_client(obs);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    long long cap = jint(st, "tiers.host.capacity_bytes");
    ck_assert_int_eq(cap, 6LL << 20);
    json_t *ps = kvh_json_get(st, "tiers.host.pin_state");
    ck_assert_msg(json_is_string(ps) && strcmp(json_string_value(ps), "running") == 0,
                  "pin_state \"%s\" right after start (%llu ms), expected \"running\"",
                  json_is_string(ps) ? json_string_value(ps) : "?", (unsigned long long)(kvh_now_ms() - t0));
    ck_assert_msg(json_is_false(kvh_json_get(st, "tiers.host.pinned")), "pinned is not false while running");
    long long pinned = jint(st, "tiers.host.pinned_bytes");
    ck_assert_msg(pinned > 0 && pinned < cap, "pinned_bytes %lld of %lld while running", pinned, cap);
    ck_assert_int_eq(pinned % (1LL << 20), 0);
    json_decref(st);
    /* Blocks go in and out meanwhile. */
    kvnode_layout l = kvh_layout("hbm-pin", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key k[CHUNK];
    kvh_chain(k, CHUNK, 1);
    int rc = kvh_put(c, k, CHUNK, 81);
    ck_assert_msg(rc == 0, "%s", kvh_error());
    size_t got;
    rc = kvh_get_zc_verify(c, k, CHUNK, 81, &got);
    ck_assert_msg(rc == 0 && got == CHUNK, "rc %d got %zu: %s", rc, got, kvh_error());
    st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    const char *ps2 = json_string_value(kvh_json_get(st, "tiers.host.pin_state"));
    ck_assert_msg(ps2 && strcmp(ps2, "running") == 0, "pin_state \"%s\" after a put and a get (%llu ms after "
                  "start), expected \"running\"", ps2 ? ps2 : "?", (unsigned long long)(kvh_now_ms() - t0));
    json_decref(st);

    /* Then the whole arena is pinned. */
    uint64_t deadline = kvh_now_ms() + 10000;
    for (;;) {
        st = kvh_stats_client(obs);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        const char *s = json_string_value(kvh_json_get(st, "tiers.host.pin_state"));
        ck_assert_ptr_nonnull(s);
        if (strcmp(s, "done") == 0)
            break;
        ck_assert_msg(strcmp(s, "running") == 0, "pin_state \"%s\" while pinning", s);
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "host arena not pinned within 10 s");
        kvh_sleep_ms(20);
    }
    ck_assert_msg(json_is_true(kvh_json_get(st, "tiers.host.pinned")), "pin_state done but pinned is not true");
    ck_assert_int_eq(jint(st, "tiers.host.pinned_bytes"), cap);
    json_decref(st);
    ck_assert_msg(kvh_now_ms() - t0 >= 5 * 300 - 50, "six 300 ms chunks pinned in %llu ms",
                  (unsigned long long)(kvh_now_ms() - t0));
    char *page = get_metrics(addr);
    ck_assert_msg(metric(page, "kvnode_host_pinned_bytes") == (double)cap, "kvnode_host_pinned_bytes %g, expected %lld",
                  metric(page, "kvnode_host_pinned_bytes"), cap);
    free(page);
    rc = kvh_get_zc_verify(c, k, CHUNK, 81, &got);
    ck_assert_msg(rc == 0 && got == CHUNK, "rc %d got %zu: %s", rc, got, kvh_error());

    kvnode_close(c);
    kvnode_close(obs);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* Pinning is per process: without an HBM tier no copy of the daemon's uses
 * it, so neither pin_host = on nor auto pins (nor takes a GPU context to
 * pin with), and the daemon says why instead of failing (issue 28 item 5). */
START_TEST(pin_host_without_hbm_pins_nothing)
{
    static const char *const confs[] = {
        "memory.pin_host=on\nhbm.backend=none\n",
        "memory.pin_host=on\nhbm.backend=sim\nhbm.bytes=0\n",
        "memory.pin_host=auto\nhbm.backend=sim\nhbm.bytes=0\n",
    };
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
        kvh_daemon d;
        ck_assert_msg(kvh_start(&d, confs[i]) == 0, "%s: start: %s", confs[i], kvh_error());
        json_t *st = kvh_stats(&d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        const char *ps = json_string_value(kvh_json_get(st, "tiers.host.pin_state"));
        ck_assert_msg(ps && strcmp(ps, "off") == 0, "%s: pin_state \"%s\", expected \"off\"", confs[i], ps ? ps : "?");
        ck_assert_int_eq(jint(st, "tiers.host.pinned_bytes"), 0);
        json_decref(st);
        char *log = kvh_read_log(&d);
        ck_assert_msg(log && strstr(log, "no HBM tier") && strstr(log, "per process"),
                      "%s: the log does not say why the host arena is not pinned:\n%s", confs[i], log ? log : "");
        free(log);
        KVH_STOP_DESTROY(&d);
    }
}
END_TEST

/* ---- 9. a sticky error on a device ------------------------------------------------- */

/* The sim's sticky-0 file gives device 0 a sticky error at its next copy (a
 * demotion past the watermark): the device is down for good. /stats and
 * /metrics say down and why, its blocks are dropped, a client connecting on
 * device 0 afterwards is lent host memory only and its HBM puts land there;
 * device 1 and host memory are still served (issue 28 item 8). */
START_TEST(sticky_error_takes_the_device_down)
{
    kvh_daemon d;
    char addr[PATH_MAX + 16], conf[2 * PATH_MAX], dir[PATH_MAX], env_dir[PATH_MAX + 40], path[PATH_MAX + 16];
    ck_assert_msg(kvh_mkdtemp(dir, sizeof dir) == 0, "%s", kvh_error());
    snprintf(env_dir, sizeof env_dir, "KVNODE_DEVMEM_SIM_STICKY_DIR=%s", dir);
    const char *env[] = { env_dir, NULL };
    kvh_spawn_opts o = { .env = env };
    admin_conf(addr, sizeof addr, conf, sizeof conf, SIM_CONF);
    ck_assert_msg(kvh_start_ex(&d, conf, &o) == 0, "start: %s", kvh_error());
    kvnode_layout l = kvh_layout("hbm-sticky", BB, 1, 0);
    kvnode_client *c0 = connect_dev(&d, &l, 0), *c1 = connect_dev(&d, &l, 1);

    static kvnode_key keys[ARENA_CAP];
    kvh_chain(keys, ARENA_CAP, 1);
    put_expect(c0, keys, CHUNK, KVNODE_TIER_HBM, 91, KVNODE_TIER_HBM, 0, NULL);
    snprintf(path, sizeof path, "%s/sticky-0", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    /* Past the high watermark: the first demotion copy meets the error. */
    for (size_t i = CHUNK; i < ARENA_CAP; i += CHUNK)
        put_tier(c0, keys + i, CHUNK, KVNODE_TIER_HBM, 91, NULL);
    uint64_t deadline = kvh_now_ms() + 10000;
    for (;;) {
        json_t *st = kvh_stats(&d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        json_t *h = hbm_of(st, 0), *state = json_object_get(h, "state");
        bool down = json_is_string(state) && strcmp(json_string_value(state), "down") == 0;
        long long blocks = kvh_json_int(h, "blocks");
        json_decref(st);
        if (down && blocks == 0)
            break;
        ck_assert_msg(kvh_now_ms() < deadline, "device 0 not down and emptied 10 s after its sticky error "
                      "(state %s, %lld blocks)", down ? "down" : "not down", blocks);
        kvh_sleep_ms(10);
    }
    json_t *st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    json_t *reason = json_object_get(hbm_of(st, 0), "down_reason");
    ck_assert_msg(json_is_string(reason) && strstr(json_string_value(reason), "illegal memory access"),
                  "tiers.hbm[0].down_reason does not name the error");
    long long dropped = jint(hbm_of(st, 0), "down_dropped_blocks_total");
    ck_assert_msg(dropped >= 1 && dropped == jint(st, "demotions.down_dropped_total"),
                  "%lld blocks dropped", dropped);
    json_t *s1 = json_object_get(hbm_of(st, 1), "state");
    ck_assert_msg(json_is_string(s1) && strcmp(json_string_value(s1), "up") == 0, "device 1 is not up");
    json_decref(st);
    char *page = get_metrics(addr);
    ck_assert_msg(metric(page, "kvnode_hbm_up{device=\"0\"}") == 0, "kvnode_hbm_up of device 0 is not 0");
    ck_assert_msg(metric(page, "kvnode_hbm_up{device=\"1\"}") == 1, "kvnode_hbm_up of device 1 is not 1");
    ck_assert_msg(strstr(page, "kvnode_hbm_down_info{device=\"0\",reason=\"") != NULL,
                  "no kvnode_hbm_down_info for device 0");
    free(page);

    /* A new client on device 0 is lent host memory only; HBM puts land there. */
    char *log = kvh_read_log(&d);
    ck_assert_ptr_nonnull(log);
    size_t host_only = 0;
    for (const char *p = log; (p = strstr(p, "host memory only")) != NULL; p++)
        host_only++;
    ck_assert_msg(strstr(log, "GPU 0 is down") != NULL, "no \"GPU 0 is down\" in the log");
    free(log);
    kvnode_client *late = connect_dev(&d, &l, 0);
    log = kvh_read_log(&d);
    size_t host_only_after = 0;
    for (const char *p = log; (p = strstr(p, "host memory only")) != NULL; p++)
        host_only_after++;
    free(log);
    ck_assert_msg(host_only_after == host_only + 1, "the client connecting on device 0 after it went down "
                  "was lent HBM");
    kvnode_key more[CHUNK];
    kvh_chain(more, CHUNK, 1000);
    put_expect(late, more, CHUNK, KVNODE_TIER_HBM, 92, KVNODE_TIER_HOST, -1, NULL);
    get_expect(late, more, CHUNK, 92, KVNODE_TIER_HOST, -1);
    kvh_chain(more, CHUNK, 2000);
    put_expect(c0, more, CHUNK, KVNODE_TIER_HBM, 93, KVNODE_TIER_HOST, -1, NULL);
    get_expect(c0, more, CHUNK, 93, KVNODE_TIER_HOST, -1);
    /* Device 1 still takes HBM puts. */
    kvh_chain(more, CHUNK, 3000);
    put_expect(c1, more, CHUNK, KVNODE_TIER_HBM, 94, KVNODE_TIER_HBM, 1, NULL);
    get_expect(c1, more, CHUNK, 94, KVNODE_TIER_HBM, 1);
    kvnode_close(late);
    kvnode_close(c0);
    kvnode_close(c1);
    KVH_STOP_DESTROY(&d);
    unlink(path);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon_hbm");
    TCase *tc = tcase_create("hbm"), *ts = tcase_create("hbm_store");
    tcase_add_checked_fixture(tc, plain_variant, NULL);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, hbm_put_get_by_device);
    tcase_add_test(tc, hbm_of_another_device_ends_the_prefix);
    tcase_add_test(tc, full_pinned_arena_falls_back_to_host);
    tcase_add_test(tc, released_blocks_over_high_watermark_are_demoted);
    tcase_add_test(tc, demotion_under_pressure_keeps_every_byte);
    tcase_add_test(tc, pinned_hbm_blocks_are_never_demoted);
    tcase_add_test(tc, block_being_moved_stays_readable);
    tcase_add_test(tc, killed_client_leaves_no_hbm_behind);
    tcase_add_test(tc, required_hbm_without_device_fails_start);
    tcase_add_test(tc, optional_hbm_without_device_serves_from_host);
    tcase_add_test(tc, host_arena_pinned_in_background);
    tcase_add_test(tc, sticky_error_takes_the_device_down);
    tcase_add_test(tc, pin_host_without_hbm_pins_nothing);
    suite_add_tcase(s, tc);
    /* The same placement and demotion tests with a write_through file store. */
    tcase_add_checked_fixture(ts, with_store_variant, NULL);
    tcase_set_timeout(ts, 30);
    tcase_add_test(ts, hbm_put_get_by_device);
    tcase_add_test(ts, full_pinned_arena_falls_back_to_host);
    tcase_add_test(ts, released_blocks_over_high_watermark_are_demoted);
    tcase_add_test(ts, demotion_resumes_when_store_writes_land);
    tcase_add_test(ts, demotion_under_pressure_keeps_every_byte);
    tcase_add_test(ts, pinned_hbm_blocks_are_never_demoted);
    tcase_add_test(ts, block_being_moved_stays_readable);
    tcase_add_test(ts, killed_client_leaves_no_hbm_behind);
    suite_add_tcase(s, ts);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
