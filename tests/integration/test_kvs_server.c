/* Integration tests of the KVS front end (issue 18): a real kvnoded with
 * [kvs_server] on, driven by the project's own `v6d` backend
 * (daemon/persist/kvs/v6d.c, pointed at the front end instead of the
 * simulator), by an rtp-llm-style client (kvs_client.h: a fresh curl handle
 * per call, one mapping) and by libkvnode (the other door). Every test
 * asserts on bytes, statuses and the daemon's counters. Blocks libkvnode
 * put with check words are never served through the front end (its clients
 * send none: word 0). */
#include <check.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"
#include "tenants_util.h"

#include "persist/kvs/kvs.h"
#include "persist/kvs/v6d.h"
#include "mem/namespace.h"

#define DEP      "qwen-7b-1a2b3c4d5e6f"            /* an engine-supplied deployment id */
#define BLOCK    4096u

/* The object key rtp-llm builds for block key of DEP rank 0 group 0. */
static void okey(char *buf, size_t len, const char *dep, int64_t key)
{
    snprintf(buf, len, "rtp_llm/v1/%s/tp-0/group-0/block-%" PRId64, dep, key);
}

/* Deterministic block bytes. */
static void kvsc_open_ok(kvsc *c, const kvs_env *e)
{
    char why[256];
    ck_assert_msg(kvsc_open(c, e->url, e->kvs_sock, why, sizeof why) == 0, "kvsc_open: %s", why);
    ck_assert_uint_eq(c->size, 64u << 20);   /* the default tenant's host arena */
}

/* ---- the v6d backend against the front end ------------------------------------------ */

static const struct kvs_backend *be;

struct v6d_ns {
    struct ns_layout l;
    char id[NS_DEPLOYMENT_ID_MAX];
    struct kvs_ns ns;
};

/* A v6d-backend namespace whose object keys are DEP's (kvs_deployment_id). */
static void v6d_ns_init(struct v6d_ns *t, uint64_t block_bytes)
{
    memset(t, 0, sizeof *t);
    snprintf(t->l.model, sizeof t->l.model, "m");
    snprintf(t->l.dtype, sizeof t->l.dtype, "bf16");
    t->l.block_tokens = 16;
    t->l.block_bytes = block_bytes;
    t->l.num_layers = t->l.kv_heads = t->l.head_dim = 1;
    t->l.tp_size = 1;
    snprintf(t->l.extra, sizeof t->l.extra, "kvs_deployment_id=" DEP);
    t->ns.layout = &t->l;
    t->ns.fingerprint = ns_fingerprint(&t->l);
    ns_deployment_id(&t->l, t->ns.fingerprint, t->id, sizeof t->id);
    t->ns.deployment_id = t->id;
}

static struct kvs_store *v6d_open(const kvs_env *e)
{
    struct kvs_config cfg = { .backend = "v6d", .url = e->url, .socket_path = e->kvs_sock,
                              .connect_timeout_ms = 1000, .timeout_ms = 5000 };
    struct kvs_store *st = NULL;
    char err[512];
    be = kvs_backend_find("v6d");
    ck_assert_ptr_nonnull(be);
    int rc = be->open(&cfg, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "v6d open against the front end: %d %s", rc, err);
    return st;
}

/* 0: every key reads back as bfill(key, salt); else the first failure. */
static int v6d_check(struct kvs_store *st, struct v6d_ns *t, const int64_t *keys, size_t n, uint32_t salt)
{
    uint8_t *b = malloc(BLOCK), *want = malloc(BLOCK);
    char err[512];
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        bfill(want, BLOCK, keys[i], salt);
        rc = be->get(st, &t->ns, keys[i], 0, b, BLOCK, err, sizeof err);
        if (rc == 0 && memcmp(b, want, BLOCK) != 0)
            rc = -999;
    }
    free(b);
    free(want);
    return rc;
}

static void v6d_put_all(struct kvs_store *st, struct v6d_ns *t, const int64_t *keys, size_t n, uint32_t salt)
{
    struct kvs_item items[64];
    uint8_t *bufs = malloc((size_t)n * BLOCK);
    char err[512];
    ck_assert(n <= 64);
    for (size_t i = 0; i < n; i++) {
        bfill(bufs + i * BLOCK, BLOCK, keys[i], salt);
        items[i] = (struct kvs_item){ .ns = &t->ns, .key = keys[i], .src = bufs + i * BLOCK, .len = BLOCK };
    }
    int rc = be->put_batch(st, items, n, err, sizeof err);
    ck_assert_msg(rc == 0, "put_batch: %d %s", rc, err);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(items[i].rc == 0, "item %zu: %d", i, items[i].rc);
    free(bufs);
}

START_TEST(v6d_backend_round_trips_and_second_process)
{
    kvs_env e;
    struct v6d_ns t;
    int64_t keys[64];
    char err[512];

    kvs_env_start(&e, "");
    v6d_ns_init(&t, BLOCK);
    for (int i = 0; i < 64; i++)
        keys[i] = (int64_t)0x7000000000000000ll - i * 977 - (i % 2 ? INT64_C(0x7fff000000000000) : 0);
    struct kvs_store *st = v6d_open(&e);
    ck_assert_int_eq(be->health(st, err, sizeof err), 0);
    v6d_put_all(st, &t, keys, 64, 1);
    ck_assert_int_eq(v6d_check(st, &t, keys, 64, 1), 0);
    /* exists() is a read acquire: all 64 present, and one absent key not. */
    uint8_t present[65];
    int64_t ex[65];
    memcpy(ex, keys, sizeof keys);
    ex[64] = 12345;
    ck_assert_int_eq(be->exists(st, &t.ns, ex, NULL, 65, present, err, sizeof err), 0);
    for (int i = 0; i < 64; i++)
        ck_assert(present[i]);
    ck_assert(!present[64]);

    /* A second process (its own handshake and mapping) reads the same bytes. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct kvs_config cfg = { .backend = "v6d", .url = e.url, .socket_path = e.kvs_sock,
                                  .connect_timeout_ms = 1000, .timeout_ms = 5000 };
        struct kvs_store *s2 = NULL;
        if (be->open(&cfg, &s2, err, sizeof err) != 0)
            _exit(2);
        int rc = v6d_check(s2, &t, keys, 64, 1);
        /* What the child holds, it gives back: valgrind checks the child too. */
        be->close(s2);
        be->close(st);
        _exit(rc == 0 ? 0 : 3);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "second process: status %d", status);

    /* A duplicate store succeeds and keeps the first bytes (objects that exist are left out). */
    long long existing = kvs_stat(&e, "create_existing_total");
    v6d_put_all(st, &t, keys, 64, 2);
    ck_assert_int_eq(v6d_check(st, &t, keys, 64, 1), 0);
    ck_assert_int_eq(kvs_stat(&e, "create_existing_total"), existing + 64);
    ck_assert_int_eq(kvs_stat(&e, "leases_open"), 0);
    ck_assert_int_eq(kvs_stat(&e, "fds_lent_total"), 2);
    be->close(st);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- protocol details, call by call --------------------------------------------------- */

START_TEST(partly_existing_discard_seal_failure_and_terms)
{
    kvs_env e;
    kvsc c;
    kvsc_reply r;
    char ka[128], kb[128], kc[128], kd[128], kf[128];
    uint8_t a[BLOCK], b[BLOCK], x[BLOCK];
    const uint8_t *blocks[3] = { a, b, x };

    kvs_env_start(&e, "");
    kvsc_open_ok(&c, &e);
    okey(ka, sizeof ka, DEP, 1);
    okey(kb, sizeof kb, DEP, -2);
    okey(kc, sizeof kc, DEP, 3);
    okey(kd, sizeof kd, DEP, 4);
    okey(kf, sizeof kf, DEP, 6);
    bfill(a, BLOCK, 1, 9);
    bfill(b, BLOCK, -2, 9);
    bfill(x, BLOCK, 3, 9);
    const char *ab[2] = { ka, kb }, *abc[3] = { ka, kb, kc };
    ck_assert_int_eq(kvsc_store(&c, ab, 2, blocks, BLOCK, 60), 0);

    /* Health: 200. */
    ck_assert_int_eq(kvsc_call(c.url, "health", NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    kvsc_reply_free(&r);

    /* A partly-existing create returns only the new object, under a lease. */
    char *body = kvsc_acquire_body("create", abc, 3, BLOCK, 60);
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);
    free(body);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(json_array_size(json_object_get(r.body, "objects")), 1);
    uint64_t off, sz;
    ck_assert(kvsc_object(&r, kc, &off, &sz));
    ck_assert_uint_eq(sz, BLOCK);
    char lease[64];
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    ck_assert_uint_eq(strlen(lease), 32);   /* 128 random bits as hex (issue 30; was 16 digits) */
    kvsc_reply_free(&r);
    /* Unsealed: invisible to readers. */
    size_t hits;
    bool found[3];
    ck_assert_int_eq(kvsc_read(&c, abc, 3, NULL, BLOCK, 60, &hits, found), 0);
    ck_assert_uint_eq(hits, 2);
    ck_assert(found[0] && found[1] && !found[2]);
    /* A seal that fails (a lease that is not the one granted), then discard. */
    ck_assert_int_eq(kvsc_lease_call(&c, "seal", "00000000000000ff"), 404);
    ck_assert_int_eq(kvsc_lease_call(&c, "discard", lease), 204);
    ck_assert_int_eq(kvsc_lease_call(&c, "seal", lease), 404);   /* gone */
    ck_assert_int_eq(kvsc_read(&c, abc, 3, NULL, BLOCK, 60, &hits, found), 0);
    ck_assert_uint_eq(hits, 2);
    /* Everything exists: lease_id "" and no objects. */
    body = kvsc_acquire_body("create", ab, 2, BLOCK, 60);
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);
    free(body);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(kvsc_lease_id(&r), "");
    ck_assert_uint_eq(json_array_size(json_object_get(r.body, "objects")), 0);
    kvsc_reply_free(&r);
    /* Bytes are what the first store wrote. */
    uint8_t ra[BLOCK], rb[BLOCK];
    uint8_t *outs[2] = { ra, rb };
    ck_assert_int_eq(kvsc_read(&c, ab, 2, outs, BLOCK, 60, &hits, NULL), 0);
    ck_assert_uint_eq(hits, 2);
    ck_assert(memcmp(ra, a, BLOCK) == 0 && memcmp(rb, b, BLOCK) == 0);

    /* A create abandoned until its term (1 s) is reclaimed: the object can be
     * created again and its lease is gone. Another create of it meanwhile is
     * not told it exists (issue 30 item 2: it was left out): it waits for
     * the lease to end and gets the object to write; the late seal is 410
     * (the documented status; it was 404). */
    const char *f1[1] = { kf };
    body = kvsc_acquire_body("create", f1, 1, BLOCK, 1);
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);
    ck_assert_int_eq(r.status, 200);
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    long long expired = kvs_stat(&e, "leases_expired_total");
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);   /* being written: waits for its term */
    free(body);
    ck_assert_int_eq(r.status, 200);
    ck_assert(kvsc_object(&r, kf, &off, &sz));
    char lease2[64];
    snprintf(lease2, sizeof lease2, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    for (int i = 0; i < 60 && kvs_stat(&e, "leases_expired_total") == expired; i++)
        kvh_sleep_ms(100);
    ck_assert_int_eq(kvs_stat(&e, "leases_expired_total"), expired + 1);
    ck_assert_int_eq(kvsc_lease_call(&c, "seal", lease), 410);
    ck_assert_int_eq(kvsc_lease_call(&c, "discard", lease2), 204);

    /* A read lease pins until its term, then ends: release finds nothing. */
    const char *a1[1] = { ka };
    body = kvsc_acquire_body("read", a1, 1, BLOCK, 1);
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);
    free(body);
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    ck_assert_int_eq(kvh_stat(&e.d, "leases.read"), 1);
    expired = kvs_stat(&e, "leases_expired_total");
    for (int i = 0; i < 60 && kvs_stat(&e, "leases_expired_total") == expired; i++)
        kvh_sleep_ms(100);
    ck_assert_int_eq(kvs_stat(&e, "leases_expired_total"), expired + 1);
    ck_assert_int_eq(kvh_stat(&e.d, "leases.read"), 0);
    ck_assert_int_eq(kvsc_lease_call(&c, "release", lease), 404);

    /* Refusals: a read lease sealed (400), unknown route (404). Another
     * key format is an opaque object (issue 30: a miss here, no longer a
     * 400), and another object size in the namespace is served (a
     * namespace of its own), no longer a 400. */
    ck_assert_int_eq(kvsc_call(c.url, "acquire", "{\"scope\":\"read\",\"object_keys\":[\"rtp_llm/kvs/v1/5/g0\"]}", &r), 0);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(json_array_size(json_object_get(r.body, "objects")), 0);
    kvsc_reply_free(&r);
    body = kvsc_acquire_body("create", (const char *[]){ kd }, 1, BLOCK * 2, 60);
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);
    free(body);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_ne(kvsc_lease_id(&r), "");
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    ck_assert_int_eq(kvsc_lease_call(&c, "discard", lease), 204);
    ck_assert_int_eq(kvsc_call(c.url, "bogus", "{}", &r), 0);
    ck_assert_int_eq(r.status, 404);
    kvsc_reply_free(&r);
    ck_assert_int_eq(kvs_stat(&e, "leases_open"), 0);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- 12 000 keys: no Expect: 100-continue stall -------------------------------------------------- */

START_TEST(twelve_thousand_keys_no_continue_stall)
{
    enum { N = 12000, SMALL = 1024 };
    kvs_env e;
    kvsc c;
    kvsc_reply r;
    char **keys = calloc(N, sizeof *keys);

    kvs_env_start(&e, "memory.slab_bytes=1MiB\n");
    kvsc_open_ok(&c, &e);
    for (int i = 0; i < N; i++) {
        keys[i] = malloc(128);
        okey(keys[i], 128, "qwen2-72b-instruct-0123456789abcdef", i);
    }
    /* Terms of 600 s: under valgrind this test's calls take over a minute. */
    char *body = kvsc_acquire_body("create", (const char *const *)keys, N, SMALL, 600);
    size_t body_len = strlen(body);
    ck_assert_uint_gt(body_len, 1u << 20);   /* libcurl adds Expect: 100-continue past 1 MiB */
    ck_assert_int_eq(kvsc_call(c.url, "acquire", body, &r), 0);
    free(body);
    ck_assert_int_eq(r.status, 200);
    ck_assert_msg(r.continued, "the server did not answer 100 Continue: libcurl waited for it");
    ck_assert_uint_eq(json_array_size(json_object_get(r.body, "objects")), N);
    fprintf(stderr, "12000-key create: %zu-byte body, 100 Continue answered, %.3f s\n", body_len, r.seconds);
    char lease[64];
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    ck_assert_int_eq(kvsc_lease_call(&c, "seal", lease), 204);
    ck_assert_int_eq(kvsc_lease_call(&c, "release", lease), 204);
    size_t hits;
    ck_assert_int_eq(kvsc_read(&c, (const char *const *)keys, N, NULL, SMALL, 600, &hits, NULL), 0);
    ck_assert_uint_eq(hits, N);
    ck_assert_int_eq(kvs_stat(&e, "read_hits_total"), N);
    for (int i = 0; i < N; i++)
        free(keys[i]);
    free(keys);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- one client, 8 threads ------------------------------------------------------------- */

struct thread_arg {
    const kvsc *c;
    int id;
    int failures;
};

static void *thread_main(void *p)
{
    struct thread_arg *a = p;
    char names[48][128];
    const char *keys[48];
    uint8_t *bufs[48], *outs[48];
    for (int i = 0; i < 48; i++) {
        /* 32 keys of its own, 16 every thread stores too. */
        int64_t k = i < 32 ? a->id * 1000 + i : 900000 + i;
        okey(names[i], sizeof names[i], DEP, k);
        keys[i] = names[i];
        bufs[i] = malloc(BLOCK);
        outs[i] = malloc(BLOCK);
        bfill(bufs[i], BLOCK, k, i < 32 ? 5 : 6);
    }
    for (int round = 0; round < 4; round++) {
        size_t hits;
        if (kvsc_store(a->c, keys, 48, (const uint8_t *const *)bufs, BLOCK, 60) != 0)
            a->failures++;
        if (kvsc_read(a->c, keys, 32, outs, BLOCK, 60, &hits, NULL) != 0 || hits != 32)
            a->failures++;
        for (int i = 0; i < 32; i++)
            if (memcmp(outs[i], bufs[i], BLOCK) != 0)
                a->failures++;
    }
    for (int i = 0; i < 48; i++) {
        free(bufs[i]);
        free(outs[i]);
    }
    return NULL;
}

START_TEST(eight_threads_share_one_client)
{
    kvs_env e;
    kvsc c;
    pthread_t th[8];
    struct thread_arg args[8];

    kvs_env_start(&e, "");
    kvsc_open_ok(&c, &e);
    for (int i = 0; i < 8; i++) {
        args[i] = (struct thread_arg){ .c = &c, .id = i + 1 };
        ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(args[i].failures == 0, "thread %d: %d failures", i, args[i].failures);
    }
    ck_assert_int_eq(kvs_stat(&e, "requests.acquire_create_total"), 32);
    ck_assert_int_eq(kvs_stat(&e, "create_keys_total"), 32 * 48);
    ck_assert_int_eq(kvs_stat(&e, "leases_open"), 0);
    ck_assert_int_eq(kvh_stat(&e.d, "tiers.host.blocks"), 8 * 32 + 16);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- 4 processes create the same keys at once ----------------------------------------------- */

START_TEST(four_processes_create_the_same_keys)
{
    enum { N = 64 };
    kvs_env e;
    char names[N][128];
    const char *keys[N];
    pid_t pids[4];

    kvs_env_start(&e, "");
    for (int i = 0; i < N; i++) {
        okey(names[i], sizeof names[i], DEP, 5000 + i);
        keys[i] = names[i];
    }
    for (int p = 0; p < 4; p++) {
        pids[p] = fork();
        ck_assert_int_ge(pids[p], 0);
        if (pids[p] == 0) {
            kvsc c;
            char why[256];
            uint8_t *bufs[N];
            if (kvsc_open(&c, e.url, e.kvs_sock, why, sizeof why) != 0)
                _exit(2);
            for (int i = 0; i < N; i++) {
                bufs[i] = malloc(BLOCK);
                bfill(bufs[i], BLOCK, 5000 + i, (uint32_t)p);
            }
            long rc = kvsc_store(&c, keys, N, (const uint8_t *const *)bufs, BLOCK, 60);
            for (int i = 0; i < N; i++)
                free(bufs[i]);
            kvsc_close(&c);
            _exit(rc == 0 ? 0 : 3);
        }
    }
    for (int p = 0; p < 4; p++) {
        int st = 0;
        ck_assert_int_eq(waitpid(pids[p], &st, 0), pids[p]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "process %d: status %d", p, st);
    }
    /* Every block is whole and written by exactly one of them; each key was
     * reserved once (the others found it being written or sealed). */
    ck_assert_int_eq(kvs_stat(&e, "create_keys_total"), 4 * N);
    ck_assert_int_eq(kvs_stat(&e, "create_existing_total"), 3 * N);
    kvsc c;
    kvsc_open_ok(&c, &e);
    uint8_t *outs[N], want[BLOCK];
    for (int i = 0; i < N; i++)
        outs[i] = malloc(BLOCK);
    size_t hits;
    ck_assert_int_eq(kvsc_read(&c, keys, N, outs, BLOCK, 60, &hits, NULL), 0);
    ck_assert_uint_eq(hits, N);
    for (int i = 0; i < N; i++) {
        bool whole = false;
        for (uint32_t p = 0; p < 4 && !whole; p++) {
            bfill(want, BLOCK, 5000 + i, p);
            whole = memcmp(want, outs[i], BLOCK) == 0;
        }
        ck_assert_msg(whole, "block %d is no process's whole block", i);
        free(outs[i]);
    }
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- both doors ------------------------------------------------------------------- */

START_TEST(both_doors_reach_the_same_blocks)
{
    kvs_env e;
    kvnode_client *cl;
    /* The documented layout of a KVS namespace (kvs_key_layout). */
    kvnode_layout l = { .model = DEP, .dtype = "rtp_llm_group_block_v1", .block_tokens = 1, .block_bytes = BLOCK,
                        .num_layers = 1, .kv_heads = 1, .head_dim = 1, .tp_size = 1, .tp_rank = 0,
                        .extra = "kvs_deployment_id=" DEP ";kvs_object_ns=rtp_llm;kvs_version=1;kvs_group=0" };
    kvnode_key lib_keys[16], kvs_keys[16];
    struct v6d_ns t;
    char err[512];
    uint8_t b[BLOCK], want[BLOCK];

    kvs_env_start(&e, "");
    kvh_chain(lib_keys, 16, 41);
    kvh_chain(kvs_keys, 16, 42);
    ck_assert_msg(kvh_connect(&e.d, &l, &cl) == 0, "%s", kvh_error());
    /* libkvnode writes, the front end reads. */
    ck_assert_msg(kvh_put(cl, lib_keys, 16, 77) == 0, "%s", kvh_error());
    v6d_ns_init(&t, BLOCK);
    struct kvs_store *st = v6d_open(&e);
    for (int i = 0; i < 16; i++) {
        kvh_fill(want, BLOCK, lib_keys[i], 77);
        ck_assert_int_eq(be->get(st, &t.ns, lib_keys[i], 0, b, BLOCK, err, sizeof err), 0);
        ck_assert_msg(memcmp(b, want, BLOCK) == 0, "block %d differs through the front end", i);
    }
    /* The front end writes, libkvnode reads (match and zero-copy get). */
    for (int i = 0; i < 16; i++) {
        kvh_fill(want, BLOCK, kvs_keys[i], 78);
        ck_assert_int_eq(be->put(st, &t.ns, kvs_keys[i], 0, want, BLOCK, err, sizeof err), 0);
    }
    ck_assert_int_eq(kvh_match(cl, kvs_keys, 16), 16);
    size_t got = 0;
    ck_assert_msg(kvh_get_zc_verify(cl, kvs_keys, 16, 78, &got) == 0, "%s", kvh_error());
    ck_assert_uint_eq(got, 16);
    /* One namespace: the libkvnode client's and the front end's. */
    ck_assert_int_eq(kvh_stat(&e.d, "namespaces_active"), 1);
    /* Blocks put with check words (issue 19) are another prefix's: the front
     * end, whose rtp-llm clients send no words, never serves them. */
    kvnode_key worded[4];
    uint64_t words[4];
    void *src[4];
    kvh_chain(worded, 4, 43);
    for (int i = 0; i < 4; i++) {
        words[i] = 0x5eed000000000000ull + (uint64_t)i;
        src[i] = malloc(BLOCK);
        kvh_fill(src[i], BLOCK, worded[i], 79);
    }
    ck_assert_int_eq(kvnode_put_batch_checked(cl, worded, words, 4, (const void *const *)src, 0), 0);
    long long m0 = kvh_stat(&e.d, "keys.check_mismatches_total");
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(be->get(st, &t.ns, worded[i], 0, b, BLOCK, err, sizeof err), KVS_MISS);
    ck_assert_int_eq(kvh_stat(&e.d, "keys.check_mismatches_total"), m0 + 4);
    for (int i = 0; i < 4; i++)
        memset(src[i], 0, BLOCK);
    ck_assert_int_eq(kvnode_get_batch_checked(cl, worded, words, 4, src, 0, &got), 0);
    ck_assert_uint_eq(got, 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(kvh_verify(src[i], BLOCK, worded[i], 79) == 0, "%s", kvh_error());
        free(src[i]);
    }
    be->close(st);
    kvnode_close(cl);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- tenants --------------------------------------------------------------------------- */

#define ALPHA_UID 65534
#define BETA_UID  65532
#define BETA_GID  65531

static kvs_env *tenant_env;

/* As ALPHA_UID: its own arena (16 MiB), the default tenant's block invisible,
 * its own stores work. Exit 0 when all held. */
static int alpha_client(void *arg)
{
    const char *key = arg;
    kvsc c;
    char why[256];
    size_t hits;
    uint8_t blk[BLOCK];
    const uint8_t *blocks[1] = { blk };
    if (kvsc_open(&c, tenant_env->url, tenant_env->kvs_sock, why, sizeof why) != 0) {
        fprintf(stderr, "alpha_client: kvsc_open: %s\n", why);
        return 10;
    }
    int rc = 0;
    if (c.size != (16u << 20))
        rc = 11;
    else if (kvsc_read(&c, &key, 1, NULL, BLOCK, 60, &hits, NULL) != 0 || hits != 0)
        rc = 12;
    bfill(blk, BLOCK, 1, 3);
    if (!rc && kvsc_store(&c, &key, 1, blocks, BLOCK, 60) != 0)
        rc = 13;
    if (!rc && (kvsc_read(&c, &key, 1, NULL, BLOCK, 60, &hits, NULL) != 0 || hits != 1))
        rc = 14;
    kvsc_close(&c);
    return rc;
}

/* As BETA_UID in group BETA_GID (a tenant chosen by group): HTTP over TCP
 * cannot know the group, so it is refused (403); the data plane knows it. */
static int beta_client(void *arg)
{
    kvsc_reply r;
    kvsc c;
    char why[256];
    (void)arg;
    if (kvsc_call(tenant_env->url, "acquire", "{\"scope\":\"read\",\"object_keys\":[]}", &r) != 0 || r.status != 403)
        return 20;
    const char *msg = json_string_value(json_object_get(r.body, "error"));
    if (!msg || !strstr(msg, "cannot establish the tenant"))
        return 21;
    kvsc_reply_free(&r);
    if (kvsc_open(&c, tenant_env->url, tenant_env->kvs_sock, why, sizeof why) != 0) {
        fprintf(stderr, "beta_client: kvsc_open: %s\n", why);
        return 22;
    }
    int rc = c.size != (8u << 20) ? 23 : 0;
    kvsc_close(&c);
    return rc;
}

START_TEST(tenants_see_only_their_own_arena)
{
    TENANTS_NEEDS_ROOT("kvs_server: tenants_see_only_their_own_arena");
    kvs_env e;
    char key[128];
    uint8_t blk[BLOCK];
    const uint8_t *blocks[1] = { blk };
    kvsc c;

    kvs_env_start(&e, "memory.host_bytes=96MiB\nmemory.slab_bytes=1MiB\ntenant.alpha.uids=65534\n"
                  "tenant.alpha.host_bytes=16MiB\ntenant.beta.uids=65532\ntenant.beta.host_bytes=8MiB\n");
    tenants_open_dirs(&e.d);
    ck_assert_int_eq(chmod(e.dir, 0755), 0);
    ck_assert_int_eq(chmod(e.kvs_sock, 0666), 0);
    tenant_env = &e;
    /* root: the default tenant (96 - 16 - 8 MiB). */
    char why[256];
    ck_assert_msg(kvsc_open(&c, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    ck_assert_uint_eq(c.size, 72u << 20);
    okey(key, sizeof key, DEP, 1);
    bfill(blk, BLOCK, 1, 1);
    const char *k1[1] = { key };
    ck_assert_int_eq(kvsc_store(&c, k1, 1, blocks, BLOCK, 60), 0);
    ck_assert_int_eq(tenants_run_as(alpha_client, key, ALPHA_UID, ALPHA_UID, NULL, 0), 0);
    /* The default tenant's block is still its own bytes. */
    uint8_t out[BLOCK], *outs[1] = { out };
    size_t hits;
    ck_assert_int_eq(kvsc_read(&c, k1, 1, outs, BLOCK, 60, &hits, NULL), 0);
    ck_assert_uint_eq(hits, 1);
    ck_assert(memcmp(out, blk, BLOCK) == 0);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

START_TEST(group_tenant_over_tcp_is_refused)
{
    TENANTS_NEEDS_ROOT("kvs_server: group_tenant_over_tcp_is_refused");
    kvs_env e;
    kvsc_reply r;

    kvs_env_start(&e, "memory.host_bytes=72MiB\nmemory.slab_bytes=1MiB\ntenant.beta.gids=65531\n"
                  "tenant.beta.host_bytes=8MiB\n");
    tenants_open_dirs(&e.d);
    ck_assert_int_eq(chmod(e.dir, 0755), 0);
    ck_assert_int_eq(chmod(e.kvs_sock, 0666), 0);
    tenant_env = &e;
    gid_t beta_groups[1] = { BETA_GID };
    ck_assert_int_eq(tenants_run_as(beta_client, NULL, BETA_UID, BETA_GID, beta_groups, 1), 0);
    /* Root is named by no tenant either: over TCP its tenant is as unknown. */
    ck_assert_int_eq(kvsc_call(e.url, "acquire", "{\"scope\":\"read\",\"object_keys\":[]}", &r), 0);
    ck_assert_int_eq(r.status, 403);
    kvsc_reply_free(&r);
    ck_assert_int_eq(kvs_stat(&e, "requests.denied_total"), 2);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- persistence: the engine's blocks outlive the daemon ----------------------------- */

START_TEST(blocks_written_through_the_front_end_survive_a_restart)
{
    enum { N = 8 };
    kvs_env e;
    kvsc c;
    char store[PATH_MAX], conf[PATH_MAX + 256], names[N][128];
    const char *keys[N];
    uint8_t *bufs[N], *outs[N];

    ck_assert_msg(kvh_mkdtemp(store, sizeof store) == 0, "%s", kvh_error());
    snprintf(conf, sizeof conf, "persist.backend=file\npersist.path=%s\npersist.policy=write_through\n"
             "persist.fsync=never\n", store);
    kvs_env_start(&e, conf);
    kvsc_open_ok(&c, &e);
    for (int i = 0; i < N; i++) {
        okey(names[i], sizeof names[i], DEP, 700 + i);
        keys[i] = names[i];
        bufs[i] = malloc(BLOCK);
        outs[i] = malloc(BLOCK);
        bfill(bufs[i], BLOCK, 700 + i, 4);
    }
    ck_assert_int_eq(kvsc_store(&c, keys, N, (const uint8_t *const *)bufs, BLOCK, 60), 0);
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(&e.d, "persist.written_blocks_total", N, 10000, &last) == 0, "written %lld", last);
    kvsc_close(&c);
    KVH_STOP_OK(&e.d);
    kvh_destroy(&e.d);

    /* A new daemon on the same store: the blocks are found by its recovery
     * scan; the first read starts bringing them back, a later one has them. */
    kvs_env_start(&e, conf);
    kvsc_open_ok(&c, &e);
    size_t hits = 0;
    for (int i = 0; i < 100 && hits < N; i++) {
        ck_assert_int_eq(kvsc_read(&c, keys, N, outs, BLOCK, 60, &hits, NULL), 0);
        if (hits < N)
            kvh_sleep_ms(50);
    }
    ck_assert_uint_eq(hits, N);
    for (int i = 0; i < N; i++) {
        ck_assert_msg(memcmp(outs[i], bufs[i], BLOCK) == 0, "block %d differs after the restart", i);
        free(bufs[i]);
        free(outs[i]);
    }
    ck_assert_int_ge(kvh_stat(&e.d, "persist.promotions_ok_total"), N);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* Over a unix listen address the peer's groups are known: a tenant chosen by
 * group is served (its own arena), where over TCP it is refused. */
static int beta_unix_client(void *arg)
{
    const char *key = arg;
    kvsc c;
    char why[256];
    size_t hits;
    uint8_t blk[BLOCK];
    const uint8_t *blocks[1] = { blk };
    if (kvsc_open(&c, tenant_env->url, tenant_env->kvs_sock, why, sizeof why) != 0) {
        fprintf(stderr, "beta_unix_client: kvsc_open: %s\n", why);
        return 30;
    }
    int rc = 0;
    if (c.size != (8u << 20)) {
        fprintf(stderr, "beta_unix_client: lent %llu bytes, not beta's 8 MiB\n", (unsigned long long)c.size);
        rc = 33;
    }
    bfill(blk, BLOCK, 2, 8);
    if (!rc && kvsc_store(&c, &key, 1, blocks, BLOCK, 60) != 0)
        rc = 31;
    if (!rc && (kvsc_read(&c, &key, 1, NULL, BLOCK, 60, &hits, NULL) != 0 || hits != 1))
        rc = 32;
    kvsc_close(&c);
    return rc;
}

START_TEST(unix_listen_knows_the_groups)
{
    TENANTS_NEEDS_ROOT("kvs_server: unix_listen_knows_the_groups");
    kvs_env e;
    char conf[3 * PATH_MAX], key[128];

    memset(&e, 0, sizeof e);
    ck_assert_msg(kvh_mkdtemp(e.dir, sizeof e.dir) == 0, "%s", kvh_error());
    snprintf(e.kvs_sock, sizeof e.kvs_sock, "%s/kvs.sock", e.dir);
    snprintf(e.url, sizeof e.url, "unix:%s/http.sock", e.dir);
    snprintf(conf, sizeof conf, "kvs_server.enabled=on\nkvs_server.listen=%s\nkvs_server.socket_path=%s\n"
             "server.socket_mode=0666\nmemory.host_bytes=72MiB\nmemory.slab_bytes=1MiB\n"
             "tenant.beta.gids=65531\ntenant.beta.host_bytes=8MiB\n", e.url, e.kvs_sock);
    KVH_START(&e.d, conf);
    tenants_open_dirs(&e.d);
    ck_assert_int_eq(chmod(e.dir, 0755), 0);
    tenant_env = &e;
    okey(key, sizeof key, DEP, 2);
    gid_t beta_groups[1] = { BETA_GID };
    ck_assert_int_eq(tenants_run_as(beta_unix_client, key, BETA_UID, BETA_GID, beta_groups, 1), 0);
    ck_assert_int_eq(kvs_stat(&e, "requests.denied_total"), 0);
    /* The block is beta's: the default tenant (root) does not see it. */
    kvsc c;
    char why[256];
    size_t hits;
    const char *k1[1] = { key };
    ck_assert_msg(kvsc_open(&c, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    ck_assert_uint_eq(c.size, 64u << 20);
    ck_assert_int_eq(kvsc_read(&c, k1, 1, NULL, BLOCK, 60, &hits, NULL), 0);
    ck_assert_uint_eq(hits, 0);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* The HTTP control plane is bounded like the admin endpoints (net/httpd.h):
 * past kvs_server.max_connections a connection gets 503 naming the option,
 * and a connection whose request does not arrive within
 * kvs_server.request_timeout is closed (an idle one too). */
static int tcp_connect_url(const char *url)
{
    unsigned port = 0;
    ck_assert_msg(sscanf(url, "http://127.0.0.1:%u", &port) == 1, "url %s", url);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

START_TEST(http_connections_capped_and_slow_requests_closed)
{
    kvs_env e;
    kvs_env_start(&e, "kvs_server.max_connections=2\nkvs_server.request_timeout=1s\n");
    int a = tcp_connect_url(e.url), b = tcp_connect_url(e.url);
    uint64_t t0 = kvh_now_ms();
    while (kvs_stat(&e, "http_connections.open") < 2 && kvh_now_ms() - t0 < 5000)
        kvh_sleep_ms(10);
    ck_assert_int_eq(kvs_stat(&e, "http_connections.open"), 2);
    ck_assert_int_eq(kvs_stat(&e, "http_connections.max"), 2);

    kvsc_reply r;
    ck_assert_int_eq(kvsc_call(e.url, "health", NULL, &r), 0);
    ck_assert_int_eq(r.status, 503);
    kvsc_reply_free(&r);
    ck_assert_int_eq(kvs_stat(&e, "http_connections.refused_total"), 1);

    /* Idle past the request timeout: both closed by the daemon. */
    char c;
    struct timeval tv = { .tv_sec = 5, .tv_usec = 0 };
    setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ck_assert_int_eq(recv(a, &c, 1, 0), 0);
    ck_assert_int_eq(recv(b, &c, 1, 0), 0);
    close(a);
    close(b);
    ck_assert_int_eq(kvs_stat(&e, "http_connections.timed_out_total"), 2);
    ck_assert_int_eq(kvsc_call(e.url, "health", NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    kvsc_reply_free(&r);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static Suite *kvs_server_suite(void)
{
    Suite *s = suite_create("kvs_server");
    TCase *tc = tcase_create("kvs_server");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, v6d_backend_round_trips_and_second_process);
    tcase_add_test(tc, partly_existing_discard_seal_failure_and_terms);
    tcase_add_test(tc, twelve_thousand_keys_no_continue_stall);
    tcase_add_test(tc, eight_threads_share_one_client);
    tcase_add_test(tc, four_processes_create_the_same_keys);
    tcase_add_test(tc, both_doors_reach_the_same_blocks);
    tcase_add_test(tc, blocks_written_through_the_front_end_survive_a_restart);
    tcase_add_test(tc, tenants_see_only_their_own_arena);
    tcase_add_test(tc, group_tenant_over_tcp_is_refused);
    tcase_add_test(tc, unix_listen_knows_the_groups);
    tcase_add_test(tc, http_connections_capped_and_slow_requests_closed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_server_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
