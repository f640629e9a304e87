/* Unit tests of the `v6d` KV-store backend (daemon/persist/kvs/v6d.c), the rtp-llm KVS
 * protocol. Pure functions (object keys, acquire-reply parsing and validation)
 * are tested on in-memory strings; the client is tested against the protocol-
 * true simulator $KVS_SIM (default build/kvs-sim), started per test on a fresh
 * temporary directory and an ephemeral loopback port: round trips, misses,
 * exists, existing objects, fault switches (--fail-health, --delay-ms,
 * --garbage), a simulator killed mid-run and restarted, open errors. An
 * in-process fake store covers what the simulator cannot produce (a server size
 * other than the block size, offsets past the mapping, an over-long HTTP reply,
 * an over-long data-plane frame) and records the calls made. After the
 * operations the simulator's GET /_sim/state must show zero live leases. */
#include <check.h>

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "kvnode.h"
#include "persist/kvs/kvs.h"
#include "persist/kvs/v6d.h"
#include "mem/namespace.h"

#include "../sim/simctl.h"
#include "kvs_testutil.h"

static const struct kvs_backend *be;
static char err[1024];

/* ---- helpers --------------------------------------------------------------------- */

/* Start the simulator; http_addr NULL: 127.0.0.1:0; keep_dir: reuse s->dir. */
static void sim_start(struct simctl *s, const char *http_addr, bool keep_dir,
                      const char *const *extra)
{
    simctl_start(s, &(struct simctl_opts){ .dir_prefix = "kvs-v6d-test", .http_addr = http_addr,
                                           .keep_dir = keep_dir, .extra = extra });
}

#define ck_no_leases(s) ck_assert_int_eq(simctl_state((s), "leases"), 0)

static struct kvs_store *open_store(const struct simctl *s, uint32_t timeout_ms)
{
    struct kvs_config cfg = { .backend = "v6d", .url = s->base, .socket_path = s->sock,
                              .connect_timeout_ms = 1000, .timeout_ms = timeout_ms };
    struct kvs_store *st = NULL;
    int rc = be->open(&cfg, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    ck_assert_ptr_nonnull(st);
    return st;
}

static int put_block(struct kvs_store *st, struct tns *t, int64_t key, uint32_t salt)
{
    return kvs_test_put_block(be, st, t, key, salt, err, sizeof err);
}

/* 0 when the block reads back byte-exact with salt; else get's result or -999. */
static int check_block(struct kvs_store *st, struct tns *t, int64_t key, uint32_t salt)
{
    return kvs_test_check_block(be, st, t, key, salt, err, sizeof err);
}

static void setup(void)
{
    be = kvs_backend_find("v6d");
    ck_assert_ptr_nonnull(be);
    err[0] = '\0';
}

/* ---- pure functions ------------------------------------------------------------------ */

START_TEST(test_object_key)
{
    /* an engine-supplied id, with every character rtp-llm replaces */
    struct ns_layout l = { .tp_rank = 3, .extra = "kvs_deployment_id=m/o del\tx\ny-abc" };
    struct kvs_ns ns = { .layout = &l };
    char k[256];
    size_t n = v6d_object_key("kvnode", &ns, -42, 0, k, sizeof k);
    ck_assert_str_eq(k, "kvnode/v1/m_o_del_x_y-abc/tp-3/group-0/block--42");
    ck_assert_uint_eq(n, strlen(k));
    char small[10];
    ck_assert_uint_eq(v6d_object_key("kvnode", &ns, -42, 0, small, sizeof small), n);
    ck_assert_str_eq(small, "kvnode/v1");
    l.tp_rank = 0;
    v6d_object_key(NULL, &ns, INT64_MIN, 0, k, sizeof k);
    ck_assert_str_eq(k, "rtp_llm/v1/m_o_del_x_y-abc/tp-0/group-0/block--9223372036854775808");
    v6d_object_key("", &ns, INT64_MAX, 0, k, sizeof k);
    ck_assert_str_eq(k, "rtp_llm/v1/m_o_del_x_y-abc/tp-0/group-0/block-9223372036854775807");
    /* the namespace is a part like the others */
    v6d_object_key("a b/c", &ns, 1, 0, k, sizeof k);
    ck_assert_str_eq(k, "a_b_c/v1/m_o_del_x_y-abc/tp-0/group-0/block-1");
    /* a check word (issue 19) names another object, which rtp-llm never
     * reads; word 0 is rtp-llm's key exactly (above) */
    v6d_object_key(NULL, &ns, -42, UINT64_C(0x00ab00cd00ef0012), k, sizeof k);
    ck_assert_str_eq(k, "rtp_llm/v1/m_o_del_x_y-abc/tp-0/group-0/block--42-check-00ab00cd00ef0012");
    char k2[256];
    v6d_object_key(NULL, &ns, -42, UINT64_C(0x00ab00cd00ef0013), k2, sizeof k2);
    ck_assert_str_ne(k, k2);
    ck_assert_ptr_eq(kvs_backend_find("v6d"), &kvs_backend_v6d);
    ck_assert_str_eq(kvs_backend_v6d.name, "v6d");
    ck_assert(kvs_backend_v6d.keeps_deleted);
}
END_TEST

/* Keys rtp-llm's KVS connector would build (issue 13, defect 8): namespace
 * rtp_llm, version 1, deployment id "<model>-<hex>" where the hash is
 * rtp-llm's hashString, FNV-1a style with the offset basis
 * 1469598103934665603 (not the standard 14695981039346656037). The golden
 * hex values were computed outside kvnode (Python, the same loop). */
START_TEST(test_object_key_rtp_llm)
{
    struct tns t;
    char k[512];
    mkns(&t, "Qwen/Qwen2-7B", 4096, 1);
    /* kvnode's layout string, hashed with rtp-llm's constant:
     * "kvnode-layout-v1|model=Qwen/Qwen2-7B|dtype=bf16|block_tokens=16|num_layers=2|
     *  kv_heads=2|head_dim=64|tp_size=2|extra=" -> f61683ddc19707e6 (with the
     * standard basis it would be f77577ca5e2bee6c) */
    v6d_object_key(V6D_DEFAULT_OBJECT_NS, &t.ns, -42, 0, k, sizeof k);
    ck_assert_str_eq(k, "rtp_llm/v1/Qwen_Qwen2-7B-f61683ddc19707e6/tp-1/group-0/block--42");
    char canon[512];
    size_t cl = ns_canonical_string(&t.l, canon, sizeof canon);
    ck_assert_uint_eq(v6d_rtp_hash_string(canon, cl), UINT64_C(0xf61683ddc19707e6));
    ck_assert_uint_ne(ns_fnv1a64(canon, cl), UINT64_C(0xf61683ddc19707e6));   /* the standard one */
    /* the constant itself: the hash of nothing is the offset basis */
    ck_assert_uint_eq(v6d_rtp_hash_string("", 0), UINT64_C(1469598103934665603));
    ck_assert_uint_eq(ns_fnv1a64("", 0), UINT64_C(14695981039346656037));
    /* rtp-llm's own layout string (KVSConnector.cc @85c02327f) */
    static const char raw[] = "model=qwen2;ckpt=/models/qwen2;dtype=bf16;seq=16;kernel_seq=16;tp=2;"
                              "fp8=0;int8=0;mla=0;groups=1;typed=0";
    ck_assert_uint_eq(v6d_rtp_hash_string(raw, sizeof raw - 1), UINT64_C(0x137b14c70360d078));
    char dep[V6D_DEPLOYMENT_ID_MAX];
    v6d_deployment_id(&t.l, dep, sizeof dep);
    ck_assert_str_eq(dep, "Qwen/Qwen2-7B-f61683ddc19707e6");   /* '/' goes in the key */
    /* an engine-supplied deployment id (rtp-llm computes its own from the
     * checkpoint path etc.) is used as given */
    snprintf(t.l.extra, sizeof t.l.extra, "kvs_deployment_id=qwen2-137b14c70360d078");
    t.ns.fingerprint = ns_fingerprint(&t.l);
    ns_deployment_id(&t.l, t.ns.fingerprint, t.id, sizeof t.id);
    v6d_object_key(NULL, &t.ns, 7, 0, k, sizeof k);
    ck_assert_str_eq(k, "rtp_llm/v1/qwen2-137b14c70360d078/tp-1/group-0/block-7");
    /* among other items of extra */
    snprintf(t.l.extra, sizeof t.l.extra, "lora=a;kvs_deployment_id=m_x-1f;q=2");
    v6d_object_key(NULL, &t.ns, 7, 0, k, sizeof k);
    ck_assert_str_eq(k, "rtp_llm/v1/m_x-1f/tp-1/group-0/block-7");
    /* an empty one: derived as above */
    snprintf(t.l.extra, sizeof t.l.extra, "kvs_deployment_id=");
    v6d_deployment_id(&t.l, dep, sizeof dep);
    ck_assert_str_ne(dep, "");
    ck_assert(strncmp(dep, "Qwen/Qwen2-7B-", 14) == 0);
}
END_TEST

/* A named tenant's objects are under a namespace of its own (issue 15);
 * "default" keeps the configured one, so stores written before tenants stay
 * found. */
START_TEST(test_tenant_object_namespace)
{
    char ns[V6D_STORE_NS_MAX], k[512];
    ck_assert_uint_eq(v6d_tenant_object_ns("rtp_llm", "alpha", ns, sizeof ns), strlen("rtp_llm.tenant-alpha"));
    ck_assert_str_eq(ns, "rtp_llm.tenant-alpha");
    v6d_tenant_object_ns(NULL, "team-b_2", ns, sizeof ns);
    ck_assert_str_eq(ns, "rtp_llm.tenant-team-b_2");
    v6d_tenant_object_ns("kv", NULL, ns, sizeof ns);
    ck_assert_str_eq(ns, "kv");
    v6d_tenant_object_ns("", "", ns, sizeof ns);
    ck_assert_str_eq(ns, V6D_DEFAULT_OBJECT_NS);
    /* the longest namespace and tenant name fit */
    char longest[V6D_OBJECT_NS_MAX], name[NS_TENANT_MAX];
    memset(longest, 'n', sizeof longest - 1);
    longest[sizeof longest - 1] = '\0';
    memset(name, 't', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    ck_assert_uint_lt(v6d_tenant_object_ns(longest, name, ns, sizeof ns), sizeof ns);
    /* the same engine-chosen deployment id in two tenants: two keys */
    struct ns_layout l = { .extra = "kvs_deployment_id=shared" };
    struct kvs_ns kns = { .layout = &l };
    v6d_tenant_object_ns(NULL, "alpha", ns, sizeof ns);
    v6d_object_key(ns, &kns, 5, 0, k, sizeof k);
    ck_assert_str_eq(k, "rtp_llm.tenant-alpha/v1/shared/tp-0/group-0/block-5");
    v6d_tenant_object_ns(NULL, "beta", ns, sizeof ns);
    v6d_object_key(ns, &kns, 5, 0, k, sizeof k);
    ck_assert_str_eq(k, "rtp_llm.tenant-beta/v1/shared/tp-0/group-0/block-5");
}
END_TEST

static int parse(const char *body, const char *const *keys, size_t n, char *lease,
                 struct v6d_obj *objs)
{
    return v6d_parse_acquire_reply(body, strlen(body), keys, n, lease, 64, objs, err, sizeof err);
}

#define BLOB(k, off, size) "{\"key\":\"" k "\",\"blobs\":[{\"type\":\"vineyard\",\"handle\":" \
    "{\"data_offset\":" off ",\"data_size\":" size ",\"object_id\":7}}]}"

START_TEST(test_parse_reply)
{
    const char *keys[] = { "a", "b", "c" };
    struct v6d_obj o[3];
    char lease[64];

    /* reverse order, null, real-typed integers: matched by key */
    ck_assert_int_eq(parse("{\"lease\":{\"lease_id\":\"L1\"},\"objects\":[" BLOB("c", "128.0", "64")
                           ",null," BLOB("a", "0", "64.0") "]}", keys, 3, lease, o), 0);
    ck_assert_str_eq(lease, "L1");
    ck_assert(o[0].present && o[0].offset == 0 && o[0].size == 64);
    ck_assert(!o[1].present);
    ck_assert(o[2].present && o[2].offset == 128 && o[2].size == 64);

    /* objects absent entirely: all misses; empty lease id */
    ck_assert_int_eq(parse("{\"lease\":{\"lease_id\":\"\"}}", keys, 3, lease, o), 0);
    ck_assert_str_eq(lease, "");
    ck_assert(!o[0].present && !o[1].present && !o[2].present);

    /* meta.size > 0 overrides data_size; meta.size 0 does not */
    ck_assert_int_eq(parse("{\"lease\":{\"lease_id\":\"L\"},\"objects\":[{\"key\":\"a\",\"blobs\":"
                           "[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":8,\"data_size\":"
                           "100}}],\"meta\":{\"size\":96}},{\"key\":\"b\",\"blobs\":[{\"type\":"
                           "\"vineyard\",\"handle\":{\"data_offset\":8,\"data_size\":100}}],"
                           "\"meta\":{\"size\":0}}]}", keys, 3, lease, o), 0);
    ck_assert_uint_eq(o[0].size, 96);
    ck_assert_uint_eq(o[1].size, 100);
    ck_assert(!o[2].present);

    /* object_id UINT64_MAX: invalid -> absent (the document needs the real-number reparse) */
    ck_assert_int_eq(parse("{\"lease\":{\"lease_id\":\"L\"},\"objects\":[{\"key\":\"a\",\"blobs\":"
                           "[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":0,\"data_size\":8,"
                           "\"object_id\":18446744073709551615}}]}]}", keys, 3, lease, o), 0);
    ck_assert(!o[0].present);
    ck_assert_str_eq(lease, "L");

    /* malformed: each is -KVNODE_EPROTO with a message, nothing present */
    static const char *const bad[] = {
        "",
        "not json",
        "[]",
        "{\"objects\":[]}",
        "{\"lease\":{\"lease_id\":5},\"objects\":[]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":{}}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[" BLOB("a", "-1", "64") "]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[" BLOB("a", "0", "-64") "]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[" BLOB("a", "0.5", "64") "]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[" BLOB("a", "0", "1e300") "]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[" BLOB("a", "\"0\"", "64") "]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[" BLOB("z", "0", "64") "]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[" BLOB("a", "0", "64") "," BLOB("a", "0", "64") "]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[{\"key\":\"a\",\"blobs\":[]}]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[{\"key\":\"a\"}]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[{\"blobs\":[{\"type\":\"vineyard\","
            "\"handle\":{\"data_offset\":0,\"data_size\":8}}]}]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[{\"key\":\"a\",\"blobs\":[{\"type\":\"shm\","
            "\"handle\":{\"data_offset\":0,\"data_size\":8}}]}]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[{\"key\":\"a\",\"blobs\":[{\"type\":"
            "\"vineyard\",\"handle\":{\"data_offset\":0,\"data_size\":8,\"object_id\":-1}}]}]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[{\"key\":\"a\",\"blobs\":[{\"type\":"
            "\"vineyard\",\"handle\":{\"data_offset\":0,\"data_size\":8}}],\"meta\":{\"size\":-3}}]}",
        "{\"lease\":{\"lease_id\":\"L\"},\"objects\":[7]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        int rc = parse(bad[i], keys, 3, lease, o);
        ck_assert_msg(rc == -KVNODE_EPROTO, "bad[%zu] -> %d", i, rc);
        ck_assert_msg(err[0] != '\0', "bad[%zu]: no message", i);
        ck_assert(!o[0].present && !o[1].present && !o[2].present);
        /* the lease id survives a malformed objects list so the caller can release it */
        if (i >= 5)
            ck_assert_msg(strcmp(lease, "L") == 0, "bad[%zu]: lease \"%s\"", i, lease);
    }
}
END_TEST

/* ---- against the simulator ------------------------------------------------------------ */

START_TEST(test_roundtrip)
{
    struct simctl sim;
    sim_start(&sim, NULL, false, NULL);
    struct kvs_store *st = open_store(&sim, 5000);
    ck_assert_int_eq(be->health(st, err, sizeof err), 0);
    struct tns t[2];
    mkns(&t[0], "model-a", 4096, 0);
    mkns(&t[1], "model/b c", 65536 + 64, 1);
    for (int i = 0; i < 2; i++)
        for (int64_t key = -3; key <= 3; key++) {
            ck_assert_msg(put_block(st, &t[i], key * 1000003, (uint32_t)i) == 0, "put: %s", err);
            ck_no_leases(&sim);
        }
    for (int i = 0; i < 2; i++)
        for (int64_t key = -3; key <= 3; key++) {
            ck_assert_msg(check_block(st, &t[i], key * 1000003, (uint32_t)i) == 0, "get: %s", err);
            ck_no_leases(&sim);
        }
    ck_assert_int_eq(simctl_state(&sim, "sealed"), 14);
    ck_assert_int_eq(simctl_state(&sim, "pinned"), 0);

    /* absent keys: a miss, no lease left */
    ck_assert_int_eq(check_block(st, &t[0], 42, 0), KVS_MISS);
    ck_no_leases(&sim);
    /* same key, other namespace: its own object, a miss there */
    ck_assert_int_eq(check_block(st, &t[1], 42, 0), KVS_MISS);

    /* exists: mixed, with a duplicate, across chunks */
    int64_t keys[V6D_EXISTS_CHUNK + 10];
    uint8_t present[V6D_EXISTS_CHUNK + 10];
    size_t nk = sizeof keys / sizeof keys[0];
    for (size_t i = 0; i < nk; i++)
        keys[i] = (int64_t)(i % 9) * 1000003 - 3 * 1000003;   /* -3..5 (x1000003) */
    keys[nk - 1] = 999;
    ck_assert_int_eq(be->exists(st, &t[0].ns, keys, NULL, nk, present, err, sizeof err), 0);
    for (size_t i = 0; i < nk; i++) {
        int64_t k = keys[i] / 1000003;
        int want = keys[i] != 999 && k >= -3 && k <= 3;
        ck_assert_msg(present[i] == want, "present[%zu] (key %" PRId64 ") = %d", i, keys[i],
                      present[i]);
    }
    ck_assert_int_eq(be->exists(st, &t[0].ns, keys, NULL, 0, present, err, sizeof err), 0);
    ck_no_leases(&sim);

    /* second put of an existing key: success via the empty lease id, nothing changes */
    long long objs = simctl_state(&sim, "objects");
    ck_assert_int_eq(put_block(st, &t[0], 0, 77), 0);
    ck_assert_int_eq(simctl_state(&sim, "objects"), objs);
    ck_assert_int_eq(check_block(st, &t[0], 0, 0), 0);
    ck_no_leases(&sim);

    /* a get whose expected size differs from the server's: a miss, never a short/long copy */
    uint8_t small[1024];
    memset(small, 0xab, sizeof small);
    ck_assert_int_eq(be->get(st, &t[0].ns, 0, 0, small, sizeof small, err, sizeof err), KVS_MISS);
    ck_assert_ptr_nonnull(strstr(err, "expected 1024"));
    for (size_t i = 0; i < sizeof small; i++)
        ck_assert_uint_eq(small[i], 0xab);
    ck_no_leases(&sim);
    /* a put with a length that is not the block size is refused before any call */
    ck_assert_int_eq(be->put(st, &t[0].ns, 5, 0, small, sizeof small, err, sizeof err),
                     -KVNODE_EINVAL);

    /* del: no delete in the protocol (0, object stays); scan: complete, nothing */
    ck_assert_int_eq(be->del(st, &t[0].ns, 1, 0, err, sizeof err), 0);
    struct kvs_scan *cur = NULL;
    ck_assert_int_eq(be->scan(st, &cur, 100, NULL, NULL, err, sizeof err), 1);
    ck_assert_ptr_null(cur);

    /* a second handle shares the store */
    struct kvs_store *st2 = open_store(&sim, 5000);
    ck_assert_int_eq(check_block(st2, &t[1], 3 * 1000003, 1), 0);
    be->close(st2);
    be->close(st);
    ck_no_leases(&sim);
    simctl_stop_ok(&sim);
}
END_TEST

/* Batches (issue 13, defect 9): one acquire(create) + seal + release for
 * every block of a put_batch, one acquire(read) + release for a get_batch;
 * existing objects (omitted from the create reply) and a key twice in one
 * batch are fine; per-item results. */
START_TEST(test_batch)
{
    struct simctl sim;
    sim_start(&sim, NULL, false, NULL);
    struct kvs_store *st = open_store(&sim, 5000);
    struct tns t;
    mkns(&t, "model-batch", 4096, 0);
    ck_assert_msg(put_block(st, &t, 2, 5) == 0, "put: %s", err);   /* key 2 exists already */
    long long c0 = simctl_state(&sim, "acquire_create_calls"), s0 = simctl_state(&sim, "seal_calls");
    long long r0 = simctl_state(&sim, "release_calls"), d0 = simctl_state(&sim, "discard_calls");
    enum { N = 5 };
    static uint8_t src[N][4096];
    const int64_t keys[N] = { 1, 2, 3, 4, 1 };
    struct kvs_item it[N];
    for (int i = 0; i < N; i++) {
        fill(src[i], sizeof src[i], keys[i], 5);
        it[i] = (struct kvs_item){ .ns = &t.ns, .key = keys[i], .src = src[i], .len = 4096,
                                   .rc = -12345 };
    }
    ck_assert_msg(be->put_batch(st, it, N, err, sizeof err) == 0, "put_batch: %s", err);
    for (int i = 0; i < N; i++)
        ck_assert_msg(it[i].rc == 0, "item %d: rc %d", i, it[i].rc);
    ck_assert_int_eq(simctl_state(&sim, "acquire_create_calls") - c0, 1);
    ck_assert_int_eq(simctl_state(&sim, "seal_calls") - s0, 1);
    ck_assert_int_eq(simctl_state(&sim, "release_calls") - r0, 1);
    ck_assert_int_eq(simctl_state(&sim, "discard_calls") - d0, 0);
    ck_assert_int_eq(simctl_state(&sim, "sealed"), 4);
    ck_no_leases(&sim);

    /* read them back in one lease; 99 is absent, a 1000-byte item a miss */
    long long q0 = simctl_state(&sim, "acquire_read_calls");
    r0 = simctl_state(&sim, "release_calls");
    const int64_t rkeys[] = { 4, 99, 1, 2, 3, 3 };
    enum { M = sizeof rkeys / sizeof rkeys[0] };
    static uint8_t dst[M][4096];
    struct kvs_item rt[M];
    for (int i = 0; i < M; i++) {
        memset(dst[i], 0xee, sizeof dst[i]);
        rt[i] = (struct kvs_item){ .ns = &t.ns, .key = rkeys[i], .dst = dst[i],
                                   .len = i == 5 ? 1000 : 4096, .rc = -12345 };
    }
    ck_assert_msg(be->get_batch(st, rt, M, err, sizeof err) == 0, "get_batch: %s", err);
    ck_assert_int_eq(simctl_state(&sim, "acquire_read_calls") - q0, 1);
    ck_assert_int_eq(simctl_state(&sim, "release_calls") - r0, 1);
    uint8_t want[4096];
    for (int i = 0; i < M; i++) {
        if (rkeys[i] == 99 || i == 5) {
            ck_assert_msg(rt[i].rc == KVS_MISS, "item %d: rc %d", i, rt[i].rc);
            ck_assert_uint_eq(dst[i][0], 0xee);
            continue;
        }
        ck_assert_msg(rt[i].rc == 0, "item %d: rc %d", i, rt[i].rc);
        fill(want, sizeof want, rkeys[i], 5);
        ck_assert_msg(memcmp(dst[i], want, sizeof want) == 0, "item %d: wrong bytes", i);
    }
    ck_no_leases(&sim);
    /* a put batch with a wrong-sized block: refused before any call, every item fails */
    c0 = simctl_state(&sim, "acquire_create_calls");
    it[1].len = 100;
    ck_assert_int_eq(be->put_batch(st, it, N, err, sizeof err), -KVNODE_EINVAL);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(it[i].rc, -KVNODE_EINVAL);
    ck_assert_int_eq(simctl_state(&sim, "acquire_create_calls"), c0);
    be->close(st);
    simctl_stop_ok(&sim);
}
END_TEST

START_TEST(test_fail_health)
{
    struct simctl sim;
    const char *extra[] = { "--fail-health", NULL };
    sim_start(&sim, NULL, false, extra);
    struct kvs_store *st = open_store(&sim, 2000);
    int rc = be->health(st, err, sizeof err);
    ck_assert_int_lt(rc, 0);
    ck_assert_msg(strstr(err, "503") && strstr(err, "health"), "message: %s", err);
    be->close(st);
    simctl_stop_ok(&sim);
}
END_TEST

START_TEST(test_slow_store)
{
    struct simctl sim;
    const char *extra[] = { "--delay-ms", "1500", "--max-lease-s", "1", NULL };
    sim_start(&sim, NULL, false, extra);
    struct kvs_store *st = open_store(&sim, 300);
    struct tns t;
    mkns(&t, "slow", 4096, 0);
    uint64_t t0 = simctl_now_ms();
    ck_assert_int_eq(put_block(st, &t, 1, 0), -KVNODE_ETIMEDOUT);
    uint64_t dt = simctl_now_ms() - t0;
    ck_assert_msg(dt < 1200, "put took %" PRIu64 " ms", dt);
    ck_assert_ptr_nonnull(strstr(err, "acquire"));
    t0 = simctl_now_ms();
    ck_assert_int_eq(check_block(st, &t, 1, 0), -KVNODE_ETIMEDOUT);
    dt = simctl_now_ms() - t0;
    ck_assert_msg(dt < 1200, "get took %" PRIu64 " ms", dt);
    t0 = simctl_now_ms();
    ck_assert_int_eq(be->health(st, err, sizeof err), -KVNODE_ETIMEDOUT);
    ck_assert_msg(simctl_now_ms() - t0 < 1200, "health too slow");
    /* The simulator still grants the leases once the delay ends; the client gave up
     * and cannot know them: they end at their term (clamped to 1 s here). */
    uint64_t deadline = simctl_now_ms() + 15000;
    long long n;
    while ((n = simctl_state(&sim, "leases")) != 0 && simctl_now_ms() < deadline)
        simctl_sleep_ms(200);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(simctl_state(&sim, "objects"), 0);   /* the unsealed create was freed */
    be->close(st);
    simctl_stop_ok(&sim);
}
END_TEST

START_TEST(test_garbage)
{
    struct simctl sim;
    const char *extra[] = { "--garbage", NULL };
    sim_start(&sim, NULL, false, extra);
    struct kvs_store *st = open_store(&sim, 2000);
    struct tns t;
    mkns(&t, "garbage", 4096, 0);
    ck_assert_int_eq(put_block(st, &t, 1, 0), -KVNODE_EPROTO);
    ck_assert_msg(strstr(err, "malformed JSON"), "message: %s", err);
    ck_assert_int_eq(check_block(st, &t, 1, 0), -KVNODE_EPROTO);
    int64_t keys[2] = { 1, 2 };
    uint8_t present[2] = { 9, 9 };
    ck_assert_int_eq(be->exists(st, &t.ns, keys, NULL, 2, present, err, sizeof err), -KVNODE_EPROTO);
    ck_assert(present[0] == 0 && present[1] == 0);
    be->close(st);
    simctl_stop_ok(&sim);
}
END_TEST

START_TEST(test_store_restart)
{
    struct simctl sim;
    sim_start(&sim, NULL, false, NULL);
    struct kvs_store *st = open_store(&sim, 2000);
    struct tns t;
    mkns(&t, "restart", 8192, 0);
    ck_assert_int_eq(put_block(st, &t, 1, 0), 0);
    ck_assert_int_eq(check_block(st, &t, 1, 0), 0);
    char http[64];
    snprintf(http, sizeof http, "%s", sim.http);
    simctl_stop(&sim, true, true);                     /* kill -9, keep the directory */

    uint64_t t0 = simctl_now_ms();
    ck_assert_int_lt(put_block(st, &t, 2, 0), 0);
    ck_assert(err[0]);
    ck_assert_int_lt(check_block(st, &t, 1, 0), 0);
    ck_assert_int_lt(be->health(st, err, sizeof err), 0);
    int64_t k = 1;
    uint8_t p = 9;
    ck_assert_int_lt(be->exists(st, &t.ns, &k, NULL, 1, &p, err, sizeof err), 0);
    ck_assert_uint_eq(p, 0);
    ck_assert_msg(simctl_now_ms() - t0 < 3000, "errors took %" PRIu64 " ms", simctl_now_ms() - t0);

    /* restarted on the same address and socket: the old handle redoes the data-plane
     * handshake (its old mapping is stale) and works; a re-opened handle works too */
    sim_start(&sim, http, true, NULL);
    ck_assert_int_eq(check_block(st, &t, 1, 0), KVS_MISS);    /* a fresh store */
    ck_assert_msg(put_block(st, &t, 3, 5) == 0, "put after restart: %s", err);
    ck_assert_int_eq(check_block(st, &t, 3, 5), 0);
    ck_assert_int_eq(be->health(st, err, sizeof err), 0);
    be->close(st);
    st = open_store(&sim, 2000);
    ck_assert_int_eq(check_block(st, &t, 3, 5), 0);
    ck_assert_int_eq(put_block(st, &t, 4, 6), 0);
    ck_assert_int_eq(check_block(st, &t, 4, 6), 0);
    ck_no_leases(&sim);
    be->close(st);
    simctl_stop_ok(&sim);
}
END_TEST

START_TEST(test_open_errors)
{
    struct kvs_store *st = (struct kvs_store *)1;
    struct kvs_config cfg = { .backend = "v6d", .url = "http://127.0.0.1:9",
                              .socket_path = "/nonexistent/kvs-v6d-test.sock",
                              .connect_timeout_ms = 1000, .timeout_ms = 2000 };
    uint64_t t0 = simctl_now_ms();
    int rc = be->open(&cfg, &st, err, sizeof err);
    ck_assert_int_eq(rc, -KVNODE_ECONNECT);
    ck_assert_ptr_null(st);
    ck_assert_msg(simctl_now_ms() - t0 < 500, "open took %" PRIu64 " ms", simctl_now_ms() - t0);
    ck_assert_msg(strstr(err, "/nonexistent/kvs-v6d-test.sock"), "message: %s", err);

    char longp[200];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    cfg.socket_path = longp;
    ck_assert_int_eq(be->open(&cfg, &st, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "too long"));

    cfg.url = "";
    cfg.socket_path = NULL;
    ck_assert_int_eq(be->open(&cfg, &st, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_msg(strstr(err, "url") && strstr(err, "socket_path"), "message: %s", err);

    /* a socket that accepts but never answers: the handshake times out */
    struct simctl sim;
    const char *extra[] = { "--delay-ms", "10", NULL };   /* a live simulator, stopped below */
    sim_start(&sim, NULL, false, extra);
    kill(sim.pid, SIGSTOP);
    cfg.url = sim.base;
    cfg.socket_path = sim.sock;
    cfg.timeout_ms = 300;
    t0 = simctl_now_ms();
    rc = be->open(&cfg, &st, err, sizeof err);
    uint64_t dt = simctl_now_ms() - t0;
    kill(sim.pid, SIGCONT);
    ck_assert_int_eq(rc, -KVNODE_ETIMEDOUT);
    ck_assert_msg(dt < 1500, "open took %" PRIu64 " ms", dt);
    ck_assert_msg(strstr(err, "timed out"), "message: %s", err);
    simctl_stop_ok(&sim);
}
END_TEST

/* ---- an in-process fake store (what the simulator cannot produce) ------------------------ */

struct fake {
    int ufd, hfd;                 /* listeners */
    char sock[96], dir[64], base[64];
    int frame_mode;               /* 0: proper handshake; 1: 16 MiB + 1 reply header */
    const char *acquire_reply;    /* body of 200 replies to POST /acquire */
    size_t big_reply;             /* > 0: /acquire answers this many bytes instead */
    char log[4096];               /* "METHOD /route\n" per request */
    volatile int stop;
    pthread_t ut, ht;
};

static void fake_send_frame(int fd, const char *json)
{
    uint8_t hdr[8];
    uint64_t len = strlen(json);
    for (int i = 0; i < 8; i++)
        hdr[i] = (uint8_t)(len >> (8 * i));
    ck_assert(write(fd, hdr, 8) == 8);
    ck_assert(write(fd, json, len) == (ssize_t)len);
}

static int fake_read_frame(int fd)
{
    uint8_t hdr[8];
    if (recv(fd, hdr, 8, MSG_WAITALL) != 8)
        return -1;
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--)
        len = (len << 8) | hdr[i];
    char buf[512];
    return len < sizeof buf && recv(fd, buf, len, MSG_WAITALL) == (ssize_t)len ? 0 : -1;
}

static void *fake_unix(void *arg)
{
    struct fake *f = arg;
    int c = -1;
    while (!f->stop) {
        struct pollfd p = { .fd = c >= 0 ? c : f->ufd, .events = POLLIN };
        if (poll(&p, 1, 50) <= 0)
            continue;
        if (c >= 0) {                       /* keep the connection until it closes */
            char b;
            if (recv(c, &b, 1, 0) <= 0) {
                close(c);
                c = -1;
            }
            continue;
        }
        c = accept(f->ufd, NULL, NULL);
        if (c < 0 || fake_read_frame(c) < 0)
            continue;
        if (f->frame_mode == 1) {
            uint8_t hdr[8];
            uint64_t len = (16u << 20) + 1;
            for (int i = 0; i < 8; i++)
                hdr[i] = (uint8_t)(len >> (8 * i));
            ck_assert(write(c, hdr, 8) == 8);
            continue;
        }
        fake_send_frame(c, "{\"type\":\"register_reply\"}");
        if (fake_read_frame(c) < 0)
            continue;
        fake_send_frame(c, "{\"type\":\"get_vineyard_mmap_fd_reply\",\"size\":1048576,\"offset\":0}");
        int mfd = memfd_create("fake-arena", 0);
        ck_assert(mfd >= 0 && ftruncate(mfd, 1 << 20) == 0);
        char byte = 0;
        struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
        union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
        memset(&u, 0, sizeof u);
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                              .msg_controllen = sizeof u.buf };
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
        ck_assert(sendmsg(c, &msg, MSG_NOSIGNAL) == 1);
        close(mfd);
    }
    if (c >= 0)
        close(c);
    return NULL;
}

static void *fake_http(void *arg)
{
    struct fake *f = arg;
    int c = -1;
    char req[65536];
    size_t have = 0;
    while (!f->stop) {
        struct pollfd p = { .fd = c >= 0 ? c : f->hfd, .events = POLLIN };
        if (poll(&p, 1, 50) <= 0)
            continue;
        if (c < 0) {
            c = accept(f->hfd, NULL, NULL);
            have = 0;
            continue;
        }
        ssize_t r = recv(c, req + have, sizeof req - 1 - have, 0);
        if (r <= 0) {
            close(c);
            c = -1;
            continue;
        }
        have += (size_t)r;
        req[have] = '\0';
        char *end = strstr(req, "\r\n\r\n");
        if (!end)
            continue;
        const char *cl = strcasestr(req, "Content-Length:");
        size_t blen = cl && cl < end ? strtoul(cl + 15, NULL, 10) : 0;
        size_t total = (size_t)(end + 4 - req) + blen;
        if (have < total)
            continue;
        char method[8] = "", route[64] = "";
        sscanf(req, "%7s %63s", method, route);
        size_t ll = strlen(f->log);
        snprintf(f->log + ll, sizeof f->log - ll, "%s %s\n", method, route);
        char head[256];
        if (strcmp(route, "/acquire") == 0 && f->big_reply) {
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n",
                     f->big_reply);
            ck_assert(write(c, head, strlen(head)) > 0);
            char *junk = malloc(f->big_reply);
            memset(junk, ' ', f->big_reply);
            ssize_t w = send(c, junk, f->big_reply, MSG_NOSIGNAL);
            (void)w;
            free(junk);
        } else if (strcmp(route, "/acquire") == 0 || strcmp(route, "/health") == 0) {
            const char *b = strcmp(route, "/acquire") == 0 ? f->acquire_reply : "{}";
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n"
                     "Content-Type: application/json\r\n\r\n", strlen(b));
            ck_assert(write(c, head, strlen(head)) > 0);
            ck_assert(write(c, b, strlen(b)) == (ssize_t)strlen(b));
        } else {
            snprintf(head, sizeof head, "HTTP/1.1 204 No Content\r\n\r\n");
            ck_assert(write(c, head, strlen(head)) > 0);
        }
        memmove(req, req + total, have - total);
        have -= total;
    }
    if (c >= 0)
        close(c);
    return NULL;
}

static void fake_start(struct fake *f, int frame_mode)
{
    memset(f, 0, sizeof *f);
    f->frame_mode = frame_mode;
    simctl_mkdtemp(f->dir, sizeof f->dir, "kvs-v6d-fake");
    snprintf(f->sock, sizeof f->sock, "%s/fake.sock", f->dir);
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    memcpy(sun.sun_path, f->sock, strlen(f->sock) + 1);
    f->ufd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert(bind(f->ufd, (struct sockaddr *)&sun, sizeof sun) == 0 && listen(f->ufd, 8) == 0);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
    f->hfd = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t sl = sizeof sin;
    ck_assert(bind(f->hfd, (struct sockaddr *)&sin, sizeof sin) == 0 && listen(f->hfd, 8) == 0);
    ck_assert(getsockname(f->hfd, (struct sockaddr *)&sin, &sl) == 0);
    snprintf(f->base, sizeof f->base, "http://127.0.0.1:%u", ntohs(sin.sin_port));
    ck_assert(pthread_create(&f->ut, NULL, fake_unix, f) == 0);
    ck_assert(pthread_create(&f->ht, NULL, fake_http, f) == 0);
}

static void fake_stop(struct fake *f)
{
    f->stop = 1;
    pthread_join(f->ut, NULL);
    pthread_join(f->ht, NULL);
    close(f->ufd);
    close(f->hfd);
    unlink(f->sock);
    rmdir(f->dir);
}

static struct kvs_store *fake_open(struct fake *f)
{
    struct kvs_config cfg = { .backend = "v6d", .url = f->base, .socket_path = f->sock,
                              .connect_timeout_ms = 1000, .timeout_ms = 2000 };
    struct kvs_store *st = NULL;
    int rc = be->open(&cfg, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return st;
}

START_TEST(test_fake_put_size_mismatch)
{
    struct fake f;
    fake_start(&f, 0);
    struct kvs_store *st = fake_open(&f);
    struct tns t;
    mkns(&t, "fake", 4096, 0);
    char k[256];
    v6d_object_key(NULL, &t.ns, 1, 0, k, sizeof k);
    char reply[1024];
    /* the store hands out 4095 bytes for a 4096-byte block: refused and discarded (only:
     * a discarded lease is gone, as rtp-llm's client assumes) */
    snprintf(reply, sizeof reply, "{\"lease\":{\"lease_id\":\"C1\"},\"objects\":[{\"key\":\"%s\","
             "\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":0,\"data_size\":4095}}]}]}",
             k);
    f.acquire_reply = reply;
    ck_assert_int_eq(put_block(st, &t, 1, 0), -KVNODE_EPROTO);
    ck_assert_msg(strstr(err, "4095") && strstr(err, "refused"), "message: %s", err);
    ck_assert_str_eq(f.log, "POST /acquire\nPOST /discard\n");
    /* right size, but past the end of the 1 MiB mapping: refused the same way */
    f.log[0] = '\0';
    snprintf(reply, sizeof reply, "{\"lease\":{\"lease_id\":\"C2\"},\"objects\":[{\"key\":\"%s\","
             "\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":1044481,"
             "\"data_size\":4096}}]}]}", k);
    ck_assert_int_eq(put_block(st, &t, 1, 0), -KVNODE_EPROTO);
    ck_assert_str_eq(f.log, "POST /acquire\nPOST /discard\n");
    /* exactly at the end of the mapping: accepted, sealed, released */
    f.log[0] = '\0';
    snprintf(reply, sizeof reply, "{\"lease\":{\"lease_id\":\"C3\"},\"objects\":[{\"key\":\"%s\","
             "\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":1044480,"
             "\"data_size\":4096}}]}]}", k);
    ck_assert_msg(put_block(st, &t, 1, 0) == 0, "put: %s", err);
    ck_assert_str_eq(f.log, "POST /acquire\nPOST /seal\nPOST /release\n");
    /* a read of an object reaching past the mapping: error, lease released, nothing copied */
    f.log[0] = '\0';
    snprintf(reply, sizeof reply, "{\"lease\":{\"lease_id\":\"R1\"},\"objects\":[{\"key\":\"%s\","
             "\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":1044481,"
             "\"data_size\":4096}}]}]}", k);
    ck_assert_int_eq(check_block(st, &t, 1, 0), -KVNODE_EPROTO);
    ck_assert_str_eq(f.log, "POST /acquire\nPOST /release\n");
    /* a create reply without our object: discarded */
    f.log[0] = '\0';
    f.acquire_reply = "{\"lease\":{\"lease_id\":\"C4\"},\"objects\":[null]}";
    ck_assert_int_eq(put_block(st, &t, 1, 0), -KVNODE_EPROTO);
    ck_assert_str_eq(f.log, "POST /acquire\nPOST /discard\n");
    /* an over-long control-plane reply is aborted */
    f.big_reply = (1u << 20) + 4096;
    ck_assert_int_eq(check_block(st, &t, 1, 0), -KVNODE_ETOOBIG);
    ck_assert_msg(strstr(err, "refused"), "message: %s", err);
    be->close(st);
    fake_stop(&f);
}
END_TEST

START_TEST(test_fake_frame_cap)
{
    struct fake f;
    fake_start(&f, 1);
    struct kvs_config cfg = { .backend = "v6d", .url = f.base, .socket_path = f.sock,
                              .connect_timeout_ms = 1000, .timeout_ms = 2000 };
    struct kvs_store *st = NULL;
    uint64_t t0 = simctl_now_ms();
    ck_assert_int_eq(be->open(&cfg, &st, err, sizeof err), -KVNODE_ETOOBIG);
    ck_assert_msg(simctl_now_ms() - t0 < 1000, "open took too long");
    ck_assert_msg(strstr(err, "16777217"), "message: %s", err);
    ck_assert_ptr_null(st);
    fake_stop(&f);
}
END_TEST

static Suite *kvs_v6d_suite(void)
{
    Suite *s = suite_create("kvs_v6d");
    TCase *tc = tcase_create("v6d");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_object_key);
    tcase_add_test(tc, test_object_key_rtp_llm);
    tcase_add_test(tc, test_tenant_object_namespace);
    tcase_add_test(tc, test_parse_reply);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_batch);
    tcase_add_test(tc, test_fail_health);
    tcase_add_test(tc, test_slow_store);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_store_restart);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_fake_put_size_mismatch);
    tcase_add_test(tc, test_fake_frame_cap);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    SRunner *sr = srunner_create(kvs_v6d_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    curl_global_cleanup();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
