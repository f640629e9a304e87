/* Unit tests of daemon/persist/ (persist.h), the persistence worker pool, with real
 * worker threads and a real event_base driven by the test's thread (the
 * loop thread). The `file` backend works in a mkdtemp() directory under
 * $TMPDIR (removed afterwards): byte-exact round trips, misses, a corrupted
 * block, delete and exists, a full queue, the chunked recovery scan,
 * cancellation at destroy, drain, and start errors. With v6d support the
 * `v6d` backend is tested against a socket that does not exist (starts
 * degraded, requests fail as unavailable) and against the KVS simulator
 * $KVS_SIM started after persist (the health timer brings the state back to
 * OK, then a round trip). Every test destroys what it created, so the worker
 * registry is empty between tests even with CK_FORK=no (valgrind). */
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#ifdef KVNODE_HAVE_V6D
#include <curl/curl.h>
#endif

#include "../common/rmtree.h"
#include "core/clock.h"
#include "config/config.h"
#include "kvnode.h"
#include "persist/kvs/file.h"
#include "persist/kvs/kvs.h"
#include "core/log.h"
#include "loop_wait.h"
#include "mem/namespace.h"
#include "persist/persist.h"
#include "core/liveness.h"

#ifdef KVNODE_HAVE_V6D
#include "../sim/simctl.h"
#endif
#include "kvs_testutil.h"

static char tmpdir[1024];       /* the test's own directory */
static char root[2048];         /* the file store's root, inside it */

/* ---- helpers ------------------------------------------------------------------------ */

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/persist-XXXXXX", t && *t && strlen(t) < 40 ? t : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(root, sizeof(root), "%s/store", tmpdir);
}

static void teardown(void)
{
    test_rmtree(tmpdir);
}

/* config_defaults, then the [persist] fields set here (their parsing may not
 * set defaults yet). */
static void file_cfg(struct kvn_config *c, unsigned workers, unsigned queue)
{
    config_defaults(c);
    c->persist_backend = CONFIG_BACKEND_FILE;
    snprintf(c->persist_path, sizeof c->persist_path, "%s", root);
    c->persist_capacity = 0;
    c->persist_fsync = KVS_FSYNC_NEVER;
    c->persist_workers = workers;
    c->persist_queue = queue;
    c->persist_url[0] = '\0';
    c->persist_socket[0] = '\0';
    c->persist_connect_timeout_ms = 1000;
    c->persist_timeout_ms = 2000;
    c->persist_lookup = CONFIG_LOOKUP_AUTO;
}

static struct persist *make_persist(struct event_base *base, const struct kvn_config *c)
{
    struct persist *p = NULL;
    char err[1024] = "";
    int rc = persist_create(base, c, &p, err, sizeof err);
    ck_assert_msg(rc == 0, "persist_create: %d %s", rc, err);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* A namespace as the registry would hold it. */
static void mk_kvns(struct kv_namespace *ns, const char *model, uint64_t block_bytes)
{
    struct tns t;
    mkns(&t, model, block_bytes, 0);
    memset(ns, 0, sizeof *ns);
    ns->id = 1;
    ns->layout = t.l;
    ns->fingerprint = t.ns.fingerprint;
    memcpy(ns->deployment_id, t.id, sizeof ns->deployment_id);
    ns->cls = UINT32_MAX;
}

static struct kvs_ns kns_of(const struct kv_namespace *ns)
{
    return (struct kvs_ns){ .layout = &ns->layout, .fingerprint = ns->fingerprint,
                            .deployment_id = ns->deployment_id };
}

/* One request's outcome. */
struct res {
    int rc;
    int calls;
};

static size_t g_done;            /* done callbacks run (loop thread) */

static void on_done(void *arg, int rc)
{
    struct res *r = arg;
    r->rc = rc;
    r->calls++;
    g_done++;
}

/* A write of one BB-byte block (the test's BB) under word 0, answered to on_done(arg). */
#define WRITE_REQ(ns_, key_, data_, arg_) \
    (&(struct persist_write_req){ .ns = (ns_), .key = (key_), .data = (data_), .len = BB, \
                                  .done = on_done, .arg = (arg_) })
/* persist_read's and persist_exists' requests, as their old argument lists. */
#define READ_REQ(ns_, key_, check_, data_, len_, done_, arg_) \
    (&(struct persist_read_req){ .ns = (ns_), .key = (key_), .check = (check_), .data = (data_), \
                                 .len = (len_), .done = (done_), .arg = (arg_) })
#define LOOKUP_REQ(ns_, keys_, checks_, n_, present_, done_, arg_) \
    (&(struct persist_lookup_req){ .ns = (ns_), .keys = (keys_), .checks = (checks_), .n = (n_), \
                                   .present = (present_), .done = (done_), .arg = (arg_) })

static size_t g_want;
static bool done_short(void *arg)
{
    (void)arg;
    return g_done < g_want;
}

/* Run the loop until g_done reaches want (asserts it does). */
static void wait_done(struct event_base *base, size_t want, unsigned timeout_ms)
{
    g_want = want;
    loop_while(base, done_short, NULL, timeout_ms);
    ck_assert_msg(g_done == want, "%zu of %zu callbacks after %u ms", g_done, want, timeout_ms);
}

static void counters(const struct persist *p, struct persist_counters *c)
{
    persist_get_counters(p, c);
}

/* ---- file backend ------------------------------------------------------------------- */

START_TEST(test_roundtrip)
{
    enum { N = 8, BB = 4096 };
    struct event_base *base = event_base_new();
    struct kvn_config cfg;
    file_cfg(&cfg, 2, 64);
    struct persist *p = make_persist(base, &cfg);
    struct kv_namespace ns;
    mk_kvns(&ns, "rt", BB);
    static uint8_t wbuf[N][BB], rbuf[N][BB];
    struct res wr[N], rd[N], miss = { 99, 0 };
    struct persist_counters c;

    ck_assert_str_eq(persist_backend_name(p), "file");
    ck_assert(!persist_lookup_on_miss(p));
    counters(p, &c);
    ck_assert_int_eq(c.state, PERSIST_STATE_OK);
    ck_assert_uint_eq(c.workers, 2);
    ck_assert_uint_eq(c.queue_capacity, 64);
    ck_assert_str_eq(persist_last_error(p), "");
    struct liveness_info wi[8];
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), wi, 8), 2);
    ck_assert_str_eq(wi[0].name, "persist-0");
    ck_assert_str_eq(wi[1].name, "persist-1");

    g_done = 0;
    memset(wr, 0, sizeof wr);
    for (int i = 0; i < N; i++) {
        fill(wbuf[i], BB, i - 3, 7);
        wr[i].rc = 99;
        ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, i - 3, wbuf[i], &wr[i])), 0);
    }
    counters(p, &c);
    ck_assert_uint_eq(c.submitted, N);
    wait_done(base, N, 10000);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(wr[i].calls, 1);
        ck_assert_int_eq(wr[i].rc, 0);
    }

    g_done = 0;
    memset(rd, 0, sizeof rd);
    memset(rbuf, 0xee, sizeof rbuf);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(persist_read(p, READ_REQ(&ns, i - 3, 0, rbuf[i], BB, on_done, &rd[i])), 0);
    ck_assert_int_eq(persist_read(p, READ_REQ(&ns, 424242, 0, rbuf[0] , BB, on_done, &miss)), 0);
    wait_done(base, N + 1, 10000);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(rd[i].calls, 1);
        ck_assert_int_eq(rd[i].rc, 0);
        ck_assert(memcmp(rbuf[i], wbuf[i], BB) == 0);
    }
    ck_assert_int_eq(miss.calls, 1);
    ck_assert_int_eq(miss.rc, KVS_MISS);

    counters(p, &c);
    ck_assert_uint_eq(c.written_blocks, N);
    ck_assert_uint_eq(c.written_bytes, (uint64_t)N * BB);
    ck_assert_uint_eq(c.read_blocks, N);
    ck_assert_uint_eq(c.read_bytes, (uint64_t)N * BB);
    ck_assert_uint_eq(c.read_misses, 1);
    ck_assert_uint_eq(c.submitted, 2 * N + 1);
    ck_assert_uint_eq(c.completed, 2 * N + 1);
    ck_assert_uint_eq(c.queue_depth, 0);
    ck_assert_uint_eq(c.refused_queue_full, 0);
    for (int op = 0; op < PERSIST_OPS; op++)
        for (int k = 0; k < PERSIST_FAIL_KINDS; k++)
            ck_assert_uint_eq(c.failures[op][k], 0);
    ck_assert_int_eq(c.state, PERSIST_STATE_OK);
    ck_assert(!c.scan_running && !c.scan_complete);

    /* argument checks: refused at once, no callback */
    ck_assert_int_eq(persist_write(p, WRITE_REQ(NULL, 1, wbuf[0], &miss)), -KVNODE_EINVAL);
    ck_assert_int_eq(persist_delete(p, &ns, NULL, NULL, 0, NULL, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(persist_write(NULL, WRITE_REQ(&ns, 1, wbuf[0], &miss)), -KVNODE_EINVAL);

    persist_destroy(p);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
    event_base_free(base);
}
END_TEST

START_TEST(test_corrupt)
{
    enum { BB = 8192 };
    struct event_base *base = event_base_new();
    struct kvn_config cfg;
    file_cfg(&cfg, 1, 16);
    struct persist *p = make_persist(base, &cfg);
    struct kv_namespace ns;
    mk_kvns(&ns, "corrupt", BB);
    static uint8_t wbuf[BB], rbuf[BB];
    struct res r = { 0, 0 };
    struct persist_counters c;

    fill(wbuf, BB, 5, 1);
    g_done = 0;
    ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, 5, wbuf, &r)), 0);
    wait_done(base, 1, 10000);
    ck_assert_int_eq(r.rc, 0);

    /* flip one payload byte of the block file */
    struct kvs_config kc = { .backend = "file", .path = root, .fsync_policy = KVS_FSYNC_NEVER };
    struct kvs_store *s = NULL;
    char err[512], path[PATH_MAX];
    ck_assert_int_eq(kvs_backend_file.open(&kc, &s, err, sizeof err), 0);
    struct kvs_ns kn = kns_of(&ns);
    uint64_t rec = 0;
    ck_assert_int_eq(kvs_file_locate(s, &kn, 5, path, sizeof path, &rec), 0);
    kvs_backend_file.close(s);
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t b;
    off_t off = (off_t)(rec + 64 + 100);   /* the payload follows the 64-byte record header */
    ck_assert_int_eq(pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);

    g_done = 0;
    r.calls = 0;
    ck_assert_int_eq(persist_read(p, READ_REQ(&ns, 5, 0, rbuf, BB, on_done, &r)), 0);
    wait_done(base, 1, 10000);
    ck_assert_int_eq(r.rc, KVS_CORRUPT);
    /* the bad copy left the index (its segment stays: other blocks live there) */
    ck_assert_int_eq(kvs_backend_file.open(&kc, &s, err, sizeof err), 0);
    ck_assert_int_eq(kvs_file_locate(s, &kn, 5, path + 0, sizeof path, &rec), KVS_MISS);
    kvs_backend_file.close(s);
    counters(p, &c);
    ck_assert_uint_eq(c.failures[PERSIST_OP_READ][PERSIST_FAIL_CORRUPT], 1);
    ck_assert_uint_eq(c.read_blocks, 0);
    ck_assert_int_eq(c.state, PERSIST_STATE_OK);       /* the store answered */
    ck_assert_msg(strstr(persist_last_error(p), path), "last error: %s", persist_last_error(p));

    /* gone now: a miss, and a success clears the last error */
    g_done = 0;
    ck_assert_int_eq(persist_read(p, READ_REQ(&ns, 5, 0, rbuf, BB, on_done, &r)), 0);
    wait_done(base, 1, 10000);
    ck_assert_int_eq(r.rc, KVS_MISS);
    counters(p, &c);
    ck_assert_uint_eq(c.read_misses, 1);
    ck_assert_str_eq(persist_last_error(p), "");

    persist_destroy(p);
    event_base_free(base);
}
END_TEST

START_TEST(test_delete_exists)
{
    enum { BB = 1024 };
    struct event_base *base = event_base_new();
    struct kvn_config cfg;
    file_cfg(&cfg, 2, 16);
    struct persist *p = make_persist(base, &cfg);
    struct kv_namespace ns;
    mk_kvns(&ns, "delex", BB);
    static uint8_t wbuf[4][BB], rbuf[BB];
    struct res r[8];
    struct persist_counters c;

    memset(r, 0, sizeof r);
    g_done = 0;
    for (int i = 0; i < 4; i++) {
        fill(wbuf[i], BB, i + 1, 0);
        ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, i + 1, wbuf[i], &r[i])), 0);
    }
    wait_done(base, 4, 10000);

    int64_t keys[6] = { 1, 2, 3, 4, 5, 6 };
    uint8_t present[6];
    memset(present, 7, sizeof present);
    g_done = 0;
    ck_assert_int_eq(persist_exists(p, LOOKUP_REQ(&ns, keys, NULL, 6, present, on_done, &r[4])), 0);
    keys[0] = -1;                                       /* copied: changing it is harmless */
    wait_done(base, 1, 10000);
    ck_assert_int_eq(r[4].rc, 0);
    static const uint8_t want1[6] = { 1, 1, 1, 1, 0, 0 };
    ck_assert(memcmp(present, want1, 6) == 0);

    int64_t del[3] = { 2, 3, 99 };
    g_done = 0;
    ck_assert_int_eq(persist_delete(p, &ns, del, NULL, 3, on_done, &r[5]), 0);
    ck_assert_int_eq(persist_delete(p, &ns, del, NULL, 1, NULL, NULL), 0);   /* no callback wanted */
    ck_assert_int_eq(persist_read(p, READ_REQ(&ns, 2, 0, rbuf, BB, on_done, &r[6])), 0);
    /* the callback-less delete counts as completed but calls nothing */
    g_want = 2;
    loop_while(base, done_short, NULL, 10000);
    ck_assert_int_eq(r[5].rc, 0);
    ck_assert(r[6].rc == KVS_MISS || r[6].rc == 0);     /* two workers: may race the delete */
    persist_drain(p, 10000);

    int64_t keys2[4] = { 1, 2, 3, 4 };
    g_done = 0;
    ck_assert_int_eq(persist_exists(p, LOOKUP_REQ(&ns, keys2, NULL, 4, present, on_done, &r[7])), 0);
    ck_assert_int_eq(persist_read(p, READ_REQ(&ns, 3, 0, rbuf, BB, on_done, &r[6])), 0);
    wait_done(base, 2, 10000);
    static const uint8_t want2[4] = { 1, 0, 0, 1 };
    ck_assert(memcmp(present, want2, 4) == 0);
    ck_assert_int_eq(r[6].rc, KVS_MISS);

    counters(p, &c);
    ck_assert_uint_eq(c.deleted_keys, 4);
    ck_assert_uint_eq(c.submitted, c.completed);
    ck_assert_uint_eq(c.submitted, 4 + 1 + 3 + 2);
    persist_destroy(p);
    event_base_free(base);
}
END_TEST

START_TEST(test_queue_full)
{
    enum { BB = 4096, CAP = 16 };
    struct event_base *base = event_base_new();
    struct kvn_config cfg;
    file_cfg(&cfg, 1, CAP);
    struct persist *p = make_persist(base, &cfg);
    struct kv_namespace ns;
    mk_kvns(&ns, "full", BB);
    static uint8_t wbuf[BB];
    struct res r[CAP + 2];
    struct persist_counters c;

    fill(wbuf, BB, 1, 1);
    memset(r, 0, sizeof r);
    g_done = 0;
    /* The loop does not run, so no done() runs: CAP requests stay outstanding. */
    for (int i = 0; i < CAP; i++)
        ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, i, wbuf, &r[i])), 0);
    ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, 100, wbuf, &r[CAP])), -KVNODE_ELIMIT);
    ck_assert_int_eq(persist_read(p, READ_REQ(&ns, 100, 0, wbuf, BB, on_done, &r[CAP + 1])), -KVNODE_ELIMIT);
    counters(p, &c);
    ck_assert_uint_eq(c.refused_queue_full, 2);
    ck_assert_uint_eq(c.queue_depth, CAP);
    ck_assert_uint_eq(c.submitted, CAP);

    wait_done(base, CAP, 10000);
    for (int i = 0; i < CAP; i++)
        ck_assert_int_eq(r[i].rc, 0);
    ck_assert_int_eq(r[CAP].calls, 0);
    ck_assert_int_eq(r[CAP + 1].calls, 0);
    counters(p, &c);
    ck_assert_uint_eq(c.queue_depth, 0);
    ck_assert_uint_eq(c.completed, CAP);
    persist_destroy(p);
    event_base_free(base);
}
END_TEST

/* ---- scan ----------------------------------------------------------------------------- */

enum { SCAN_N = 5000, SCAN_BB = 64 };

struct scan_rec {
    uint8_t seen[SCAN_N];
    size_t  found, chunks, max_chunk, bad;
    int     finished_rc, finished_calls;
    uint64_t fingerprint;
};

static void on_found(void *arg, const struct kvs_found *f, size_t n)
{
    struct scan_rec *s = arg;
    s->chunks++;
    if (n > s->max_chunk)
        s->max_chunk = n;
    for (size_t i = 0; i < n; i++) {
        s->found++;
        if (f[i].key < 0 || f[i].key >= SCAN_N || f[i].fingerprint != s->fingerprint ||
            f[i].size != SCAN_BB || f[i].layout.block_bytes != SCAN_BB)
            s->bad++;
        else
            s->seen[f[i].key]++;
    }
}

static void on_finished(void *arg, int rc)
{
    struct scan_rec *s = arg;
    s->finished_rc = rc;
    s->finished_calls++;
}

static bool scan_not_finished(void *arg)
{
    return ((struct scan_rec *)arg)->finished_calls == 0;
}

/* SCAN_N blocks straight through the backend (faster than through the pool). */
static void store_blocks(const struct kv_namespace *ns)
{
    struct kvs_config kc = { .backend = "file", .path = root, .fsync_policy = KVS_FSYNC_NEVER };
    struct kvs_store *s = NULL;
    char err[512];
    uint8_t b[SCAN_BB];
    struct kvs_ns kn = kns_of(ns);
    ck_assert_int_eq(kvs_backend_file.open(&kc, &s, err, sizeof err), 0);
    for (int64_t k = 0; k < SCAN_N; k++) {
        fill(b, SCAN_BB, k, 3);
        ck_assert_int_eq(kvs_backend_file.put(s, &kn, k, 0, b, SCAN_BB, err, sizeof err), 0);
    }
    kvs_backend_file.close(s);
}

static bool scan_thread_present(void)
{
    struct liveness_info wi[LIVENESS_MAX];
    size_t n = liveness_snapshot(liveness_now_ms(), wi, LIVENESS_MAX);
    for (size_t i = 0; i < n && i < LIVENESS_MAX; i++)
        if (strcmp(wi[i].name, "persist-scan-0") == 0)
            return true;
    return false;
}

static bool scan_thread_alive(void *arg)
{
    (void)arg;
    return scan_thread_present();
}

START_TEST(test_scan)
{
    struct event_base *base = event_base_new();
    struct kv_namespace ns;
    mk_kvns(&ns, "scan", SCAN_BB);
    store_blocks(&ns);

    struct kvn_config cfg;
    file_cfg(&cfg, 1, 16);
    struct persist *p = make_persist(base, &cfg);
    struct scan_rec *rec = calloc(1, sizeof *rec);
    struct persist_counters c;
    rec->fingerprint = ns.fingerprint;

    ck_assert_int_eq(persist_scan_start(p, on_found, on_finished, rec), 0);
    ck_assert_int_eq(persist_scan_start(p, on_found, on_finished, rec), -KVNODE_ESTATE);
    ck_assert(scan_thread_present());
    counters(p, &c);
    ck_assert(c.scan_running && !c.scan_complete);
    ck_assert_uint_gt(c.scan_started_ms, 0);

    loop_while(base, scan_not_finished, rec, 60000);
    ck_assert_int_eq(rec->finished_calls, 1);
    ck_assert_int_eq(rec->finished_rc, 0);
    ck_assert_uint_eq(rec->bad, 0);
    ck_assert_uint_eq(rec->found, SCAN_N);
    for (int k = 0; k < SCAN_N; k++)
        ck_assert_msg(rec->seen[k] == 1, "key %d seen %u times", k, rec->seen[k]);
    ck_assert_uint_ge(rec->chunks, 2);                 /* 5000 blocks, 4096 per chunk */
    ck_assert_uint_le(rec->max_chunk, 4096);
    counters(p, &c);
    ck_assert(!c.scan_running && c.scan_complete);
    ck_assert_uint_eq(c.scan_found, SCAN_N);
    ck_assert_uint_ge(c.scan_finished_ms, c.scan_started_ms);
    ck_assert_int_eq(c.state, PERSIST_STATE_OK);
    ck_assert_int_eq(persist_scan_start(p, on_found, on_finished, rec), -KVNODE_ESTATE);

    /* the scan thread goes away once the scan ended */
    loop_while(base, scan_thread_alive, NULL, 5000);
    ck_assert(!scan_thread_present());
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 1);

    /* what the scan found reads back through the pool */
    static uint8_t rb[SCAN_BB], want[SCAN_BB];
    struct res r = { 0, 0 };
    g_done = 0;
    ck_assert_int_eq(persist_read(p, READ_REQ(&ns, SCAN_N - 1, 0, rb, SCAN_BB, on_done, &r)), 0);
    wait_done(base, 1, 10000);
    fill(want, SCAN_BB, SCAN_N - 1, 3);
    ck_assert_int_eq(r.rc, 0);
    ck_assert(memcmp(rb, want, SCAN_BB) == 0);

    persist_destroy(p);
    free(rec);
    event_base_free(base);
}
END_TEST

/* ---- destroy, drain ---------------------------------------------------------------------- */

/* Requests still queued at destroy get -KVNODE_ESHUTDOWN, those that ran
 * their result; each callback runs exactly once. (Which ones ran depends on
 * the scheduler; test_v6d_destroy_cancels holds the worker in a slow call.) */
START_TEST(test_destroy_cancels)
{
    enum { N = 24, BB = 1u << 20 };
    struct event_base *base = event_base_new();
    struct kv_namespace ns;
    mk_kvns(&ns, "cancel", BB);
    struct kvn_config cfg;
    file_cfg(&cfg, 1, 64);
    cfg.persist_fsync = KVS_FSYNC_ALWAYS;              /* slow writes: most stay queued */
    struct persist *p = make_persist(base, &cfg);
    uint8_t *wbuf = malloc(BB);
    fill(wbuf, BB, 1, 1);
    struct res r[N];
    memset(r, 0, sizeof r);

    g_done = 0;
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, i, wbuf, &r[i])), 0);
    persist_destroy(p);                                /* the loop never ran */
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(r[i].calls, 1);
        ck_assert_msg(r[i].rc == 0 || r[i].rc == -KVNODE_ESHUTDOWN, "rc %d", r[i].rc);
    }
    ck_assert_uint_eq(g_done, N);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
    persist_destroy(NULL);
    free(wbuf);
    event_base_free(base);
}
END_TEST

static bool no_chunk_yet(void *arg)
{
    return ((struct scan_rec *)arg)->chunks == 0;
}

/* A scan stopped by destroy after its first chunk: no more found() calls,
 * finished(-KVNODE_ESHUTDOWN) once, and the cursor the scan thread still
 * holds is freed there (valgrind). */
START_TEST(test_destroy_abandons_scan)
{
    struct event_base *base = event_base_new();
    struct kv_namespace ns;
    mk_kvns(&ns, "scan", SCAN_BB);
    store_blocks(&ns);
    struct kvn_config cfg;
    file_cfg(&cfg, 1, 16);
    struct persist *p = make_persist(base, &cfg);
    struct scan_rec *rec = calloc(1, sizeof *rec);
    rec->fingerprint = ns.fingerprint;

    ck_assert_int_eq(persist_scan_start(p, on_found, on_finished, rec), 0);
    loop_while(base, no_chunk_yet, rec, 60000);
    ck_assert_uint_eq(rec->chunks, 1);
    ck_assert_int_eq(rec->finished_calls, 0);          /* 5000 blocks: more chunks to come */
    persist_destroy(p);
    ck_assert_uint_eq(rec->chunks, 1);
    ck_assert_int_eq(rec->finished_calls, 1);
    ck_assert_int_eq(rec->finished_rc, -KVNODE_ESHUTDOWN);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);

    /* destroy right after the start: the first chunk never reaches found() */
    memset(rec, 0, sizeof *rec);
    rec->fingerprint = ns.fingerprint;
    p = make_persist(base, &cfg);
    ck_assert_int_eq(persist_scan_start(p, on_found, on_finished, rec), 0);
    persist_destroy(p);
    ck_assert_uint_eq(rec->chunks, 0);
    ck_assert_int_eq(rec->finished_calls, 1);
    ck_assert_int_eq(rec->finished_rc, -KVNODE_ESHUTDOWN);
    free(rec);
    event_base_free(base);
}
END_TEST

START_TEST(test_drain)
{
    enum { N = 32, BB = 2048 };
    struct event_base *base = event_base_new();
    struct kvn_config cfg;
    file_cfg(&cfg, 3, 64);
    struct persist *p = make_persist(base, &cfg);
    struct kv_namespace ns;
    mk_kvns(&ns, "drain", BB);
    static uint8_t wbuf[BB];
    struct res r[N];
    memset(r, 0, sizeof r);
    fill(wbuf, BB, 9, 9);

    g_done = 0;
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, i, wbuf, &r[i])), 0);
    ck_assert_int_eq(persist_drain(p, 30000), 0);      /* without running the loop */
    ck_assert_uint_eq(g_done, N);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(r[i].rc, 0);
    struct persist_counters c;
    counters(p, &c);
    ck_assert_uint_eq(c.queue_depth, 0);
    ck_assert_uint_eq(c.written_blocks, N);
    ck_assert_int_eq(persist_drain(NULL, 0), 0);
    persist_destroy(p);
    event_base_free(base);
}
END_TEST

/* ---- start ------------------------------------------------------------------------------ */

START_TEST(test_create_errors)
{
    struct event_base *base = event_base_new();
    struct kvn_config cfg;
    struct persist *p = (struct persist *)1;
    char err[1024] = "";

    /* off: no pool, no error */
    file_cfg(&cfg, 1, 16);
    cfg.persist_backend = CONFIG_BACKEND_OFF;
    ck_assert_int_eq(persist_create(base, &cfg, &p, err, sizeof err), 0);
    ck_assert_ptr_null(p);
    struct persist_counters c;
    persist_get_counters(NULL, &c);
    ck_assert_int_eq(c.state, PERSIST_STATE_OFF);
    ck_assert(!persist_lookup_on_miss(NULL));

    /* a root under a regular file */
    char file[2048];
    snprintf(file, sizeof file, "%s/plain", tmpdir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    file_cfg(&cfg, 1, 16);
    snprintf(cfg.persist_path, sizeof cfg.persist_path, "%s/sub/root", file);
    p = (struct persist *)1;
    int rc = persist_create(base, &cfg, &p, err, sizeof err);
    ck_assert_int_lt(rc, 0);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(err, "persist.path") && strstr(err, cfg.persist_path), "err: %s", err);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);

    /* bad pool sizes */
    file_cfg(&cfg, 0, 16);
    ck_assert_int_eq(persist_create(base, &cfg, &p, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_msg(strstr(err, "persist.workers"), "err: %s", err);
    file_cfg(&cfg, 1, 0);
    ck_assert_int_eq(persist_create(base, &cfg, &p, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_msg(strstr(err, "persist.queue"), "err: %s", err);

#ifndef KVNODE_HAVE_V6D
    file_cfg(&cfg, 1, 16);
    cfg.persist_backend = CONFIG_BACKEND_V6D;
    ck_assert_int_eq(persist_create(base, &cfg, &p, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_msg(strstr(err, "built without v6d support"), "err: %s", err);
#endif

    /* lookup setting */
    file_cfg(&cfg, 1, 16);
    cfg.persist_lookup = CONFIG_LOOKUP_ON;
    p = make_persist(base, &cfg);
    ck_assert(persist_lookup_on_miss(p));
    persist_destroy(p);
    cfg.persist_lookup = CONFIG_LOOKUP_OFF;
    p = make_persist(base, &cfg);
    ck_assert(!persist_lookup_on_miss(p));
    persist_destroy(p);
    event_base_free(base);
}
END_TEST

START_TEST(test_names)
{
    ck_assert_str_eq(persist_state_name(PERSIST_STATE_OFF), "off");
    ck_assert_str_eq(persist_state_name(PERSIST_STATE_OK), "ok");
    ck_assert_str_eq(persist_state_name(PERSIST_STATE_DEGRADED), "degraded");
    ck_assert_str_eq(persist_state_name(7), "unknown");
    static const char *const kinds[] = { "timeout", "nospace", "corrupt", "unavailable",
                                         "protocol", "io" };
    for (int k = 0; k < PERSIST_FAIL_KINDS; k++)
        ck_assert_str_eq(persist_failure_kind_name(k), kinds[k]);
    ck_assert_str_eq(persist_failure_kind_name(-1), "unknown");
    static const char *const ops[] = { "write", "read", "delete", "exists", "scan", "health" };
    for (int o = 0; o < PERSIST_OPS; o++)
        ck_assert_str_eq(persist_op_name(o), ops[o]);
    ck_assert_str_eq(persist_op_name(PERSIST_OPS), "unknown");
    ck_assert_str_eq(persist_backend_name(NULL), "off");
    ck_assert_str_eq(persist_last_error(NULL), "");
}
END_TEST

/* ---- v6d ---------------------------------------------------------------------------------- */

#ifdef KVNODE_HAVE_V6D
static void v6d_cfg(struct kvn_config *c, const char *url, const char *sock)
{
    file_cfg(c, 2, 16);
    c->persist_backend = CONFIG_BACKEND_V6D;
    c->persist_path[0] = '\0';
    snprintf(c->persist_url, sizeof c->persist_url, "%s", url);
    snprintf(c->persist_socket, sizeof c->persist_socket, "%s", sock);
}

START_TEST(test_v6d_down)
{
    enum { BB = 8192 };
    struct event_base *base = event_base_new();
    struct kvn_config cfg;
    char sock[2048];
    snprintf(sock, sizeof sock, "%s/none.sock", tmpdir);
    v6d_cfg(&cfg, "http://127.0.0.1:9", sock);
    struct persist *p = make_persist(base, &cfg);
    struct persist_counters c;
    counters(p, &c);
    ck_assert_int_eq(c.state, PERSIST_STATE_DEGRADED);
    ck_assert_str_eq(persist_backend_name(p), "v6d");
    ck_assert(persist_lookup_on_miss(p));             /* auto: v6d cannot be enumerated */
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 2);   /* started anyway */

    struct kv_namespace ns;
    mk_kvns(&ns, "down", BB);
    static uint8_t wbuf[BB];
    struct res r = { 0, 0 };
    g_done = 0;
    ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, 1, wbuf, &r)), 0);
    wait_done(base, 1, 10000);
    ck_assert_int_lt(r.rc, 0);
    counters(p, &c);
    ck_assert_uint_eq(c.failures[PERSIST_OP_WRITE][PERSIST_FAIL_UNAVAILABLE], 1);
    ck_assert_uint_eq(c.written_blocks, 0);
    ck_assert_int_eq(c.state, PERSIST_STATE_DEGRADED);
    ck_assert_msg(strstr(persist_last_error(p), sock), "last error: %s", persist_last_error(p));
    persist_destroy(p);
    event_base_free(base);
}
END_TEST

struct state_wait {
    struct persist *p;
    int want;
};

static bool state_not(void *arg)
{
    struct state_wait *w = arg;
    struct persist_counters c;
    persist_get_counters(w->p, &c);
    return c.state != w->want;
}

/* Store down at start; the simulator starts later on the same address and
 * socket; the health timer notices without any traffic; then a round trip. */
START_TEST(test_v6d_comes_back)
{
    enum { BB = 8192 };
    struct event_base *base = event_base_new();
    struct simctl sim;
    simctl_start(&sim, &(struct simctl_opts){ .dir_prefix = "persist-v6d" });
    char http[64];
    snprintf(http, sizeof http, "%s", sim.http);
    simctl_stop(&sim, true, true);                     /* learn an address, keep the dir */

    struct kvn_config cfg;
    v6d_cfg(&cfg, sim.base, sim.sock);
    struct persist *p = make_persist(base, &cfg);
    struct persist_counters c;
    counters(p, &c);
    ck_assert_int_eq(c.state, PERSIST_STATE_DEGRADED);

    simctl_start(&sim, &(struct simctl_opts){ .http_addr = http, .keep_dir = true });
    struct state_wait w = { p, PERSIST_STATE_OK };
    uint64_t t0 = clock_now_ms();
    loop_while(base, state_not, &w, 15000);
    counters(p, &c);
    ck_assert_msg(c.state == PERSIST_STATE_OK, "still %s after %llu ms: %s",
                  persist_state_name(c.state), (unsigned long long)(clock_now_ms() - t0),
                  persist_last_error(p));
    ck_assert_str_eq(persist_last_error(p), "");

    struct kv_namespace ns;
    mk_kvns(&ns, "back", BB);
    static uint8_t wbuf[BB], rbuf[BB];
    fill(wbuf, BB, 77, 1);
    struct res r1 = { 0, 0 }, r2 = { 0, 0 };
    g_done = 0;
    ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, 77, wbuf, &r1)), 0);
    wait_done(base, 1, 10000);
    ck_assert_msg(r1.rc == 0, "write: %d %s", r1.rc, persist_last_error(p));
    ck_assert_int_eq(persist_read(p, READ_REQ(&ns, 77, 0, rbuf, BB, on_done, &r2)), 0);
    wait_done(base, 2, 10000);
    ck_assert_msg(r2.rc == 0, "read: %d %s", r2.rc, persist_last_error(p));
    ck_assert(memcmp(wbuf, rbuf, BB) == 0);
    counters(p, &c);
    ck_assert_uint_eq(c.written_blocks, 1);
    ck_assert_uint_eq(c.read_blocks, 1);
    ck_assert_int_eq(c.state, PERSIST_STATE_OK);

    persist_destroy(p);
    simctl_stop_ok(&sim);
    event_base_free(base);
}
END_TEST

/* One worker runs and the simulator holds /release 3 s: the first write
 * holds the worker in its release once its seal was answered; the others
 * are queued only then, so it cannot take them into its batch, and get
 * -KVNODE_ESHUTDOWN from persist_destroy. (Delaying every call, the state
 * query too, left the worker idle again before the others were queued on
 * a loaded machine.) */
START_TEST(test_v6d_destroy_cancels)
{
    enum { N = 6, BB = 8192 };
    struct event_base *base = event_base_new();
    struct simctl sim;
    const char *extra[] = { "--delay-ms", "3000", "--delay-only", "/release", NULL };
    simctl_start(&sim, &(struct simctl_opts){ .dir_prefix = "persist-v6d", .extra = extra });
    struct kvn_config cfg;
    v6d_cfg(&cfg, sim.base, sim.sock);
    cfg.persist_workers = 1;
    cfg.persist_timeout_ms = 10000;
    struct persist *p = make_persist(base, &cfg);
    struct kv_namespace ns;
    mk_kvns(&ns, "cancel", BB);
    static uint8_t wbuf[BB];
    struct res r[N];
    memset(r, 0, sizeof r);

    g_done = 0;
    ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, 0, wbuf, &r[0])), 0);
    /* the worker's seal was answered: it is in the held release of write 0 alone */
    uint64_t until = clock_now_ms() + 20000;
    while (simctl_state(&sim, "seal_calls") < 1 && clock_now_ms() < until)
        simctl_sleep_ms(20);
    ck_assert_int_eq(simctl_state(&sim, "seal_calls"), 1);
    ck_assert_int_eq(simctl_state(&sim, "acquire_create_calls"), 1);
    for (int i = 1; i < N; i++)
        ck_assert_int_eq(persist_write(p, WRITE_REQ(&ns, i, wbuf, &r[i])), 0);
    persist_destroy(p);
    size_t shut = 0;
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(r[i].calls, 1);
        ck_assert_msg(r[i].rc == 0 || r[i].rc == -KVNODE_ESHUTDOWN, "rc %d", r[i].rc);
        shut += r[i].rc == -KVNODE_ESHUTDOWN;
    }
    ck_assert_uint_eq(shut, N - 1);
    ck_assert_int_eq(r[0].rc, 0);
    ck_assert_uint_eq(g_done, N);
    simctl_stop_ok(&sim);
    event_base_free(base);
}
END_TEST
#endif

static Suite *persist_suite(void)
{
    Suite *s = suite_create("persist");
    TCase *tc = tcase_create("file");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_corrupt);
    tcase_add_test(tc, test_delete_exists);
    tcase_add_test(tc, test_queue_full);
    tcase_add_test(tc, test_scan);
    tcase_add_test(tc, test_destroy_cancels);
    tcase_add_test(tc, test_destroy_abandons_scan);
    tcase_add_test(tc, test_drain);
    tcase_add_test(tc, test_create_errors);
    tcase_add_test(tc, test_names);
    suite_add_tcase(s, tc);
#ifdef KVNODE_HAVE_V6D
    TCase *tv = tcase_create("v6d");
    tcase_add_checked_fixture(tv, setup, teardown);
    tcase_set_timeout(tv, 120);
    tcase_add_test(tv, test_v6d_down);
    tcase_add_test(tv, test_v6d_comes_back);
    tcase_add_test(tv, test_v6d_destroy_cancels);
    suite_add_tcase(s, tv);
#endif
    return s;
}

int main(void)
{
    log_set_level(LOG_LEVEL_ERROR);   /* the degraded-store warnings are expected here */
#ifdef KVNODE_HAVE_V6D
    curl_global_init(CURL_GLOBAL_ALL);
#endif
    SRunner *sr = srunner_create(persist_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
#ifdef KVNODE_HAVE_V6D
    curl_global_cleanup();
#endif
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
