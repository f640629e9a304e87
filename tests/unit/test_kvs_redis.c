/* Unit: the redis backend (daemon/persist/kvs/redis*.c) against real
 * redis-server processes on loopback (tests/common/redisctl.h):
 *
 * - slots: CRC16/XMODEM and key slots with the Redis rules (hash tags),
 *   redirect and seed parsing, value headers (a changed byte is caught);
 * - a 3-master / 3-replica cluster: pipelined batches round trip byte-exact
 *   and spread over every master; EXISTS and DEL; a real MOVED and ASK
 *   (a slot migrated by hand) parsed and followed; reads stay byte-exact
 *   while redis-cli --cluster reshard moves 2000 slots; a value overwritten
 *   with redis-cli or changed by one byte is KVS_CORRUPT and deleted;
 * - a master killed with kill -9 in a write burst: its replica is promoted,
 *   the map is fetched again, writes go on, nothing reads back wrong and
 *   what was replicated before the kill is all there;
 * - a password-protected cluster (no or a wrong password refused, the right
 *   one from a file or the environment works); a single plain server. */
#include <check.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis.h>

#include "core/le.h"
#include "kvnode.h"
#include "mem/namespace.h"
#include "persist/kvs/crc32c.h"
#include "persist/kvs/kvs.h"
#include "persist/kvs/redis.h"
#include "persist/kvs/redis_cluster.h"
#include "../common/redisctl.h"

#define BB (64u << 10)

/* ---- helpers ---------------------------------------------------------------------- */

struct tns {
    struct ns_layout l;
    struct kvs_ns ns;
    char id[NS_DEPLOYMENT_ID_MAX];
};

static void tns_init(struct tns *t, const char *model, uint32_t rank)
{
    memset(t, 0, sizeof *t);
    snprintf(t->l.model, sizeof t->l.model, "%s", model);
    snprintf(t->l.dtype, sizeof t->l.dtype, "fp16");
    t->l.block_tokens = 16;
    t->l.block_bytes = BB;
    t->l.num_layers = 2;
    t->l.kv_heads = 2;
    t->l.head_dim = 64;
    t->l.tp_size = 4;
    t->l.tp_rank = rank;
    t->ns.layout = &t->l;
    t->ns.fingerprint = ns_fingerprint(&t->l);
    ns_deployment_id(&t->l, t->ns.fingerprint, t->id, sizeof t->id);
    t->ns.deployment_id = t->id;
}

static void fill(uint8_t *p, size_t len, int64_t key, unsigned seed)
{
    uint64_t x = (uint64_t)key * 0x9E3779B97F4A7C15ull + seed;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static bool same(const uint8_t *p, size_t len, int64_t key, unsigned seed)
{
    uint8_t *want = malloc(len);
    fill(want, len, key, seed);
    bool ok = memcmp(want, p, len) == 0;
    free(want);
    return ok;
}

static struct kvs_store *open_store(const char *nodes, const char *password, const char *tenant)
{
    struct kvs_config cfg = { .backend = "redis", .redis_nodes = nodes, .redis_password = password,
                              .tenant = tenant, .connect_timeout_ms = 500, .timeout_ms = 8000 };
    struct kvs_store *s = NULL;
    char err[256] = "";
    int rc = kvs_backend_redis.open(&cfg, &s, err, sizeof err);
    ck_assert_msg(rc == 0, "open %s: %d %s", nodes, rc, err);
    return s;
}

/* put n blocks key0.. in one batch; every item's rc must be 0. */
static void put_n(struct kvs_store *s, const struct kvs_ns *ns, int64_t key0, size_t n, unsigned seed)
{
    struct kvs_item *it = calloc(n, sizeof *it);
    uint8_t *buf = malloc(n * BB);
    for (size_t i = 0; i < n; i++) {
        fill(buf + i * BB, BB, key0 + (int64_t)i, seed);
        it[i] = (struct kvs_item){ .ns = ns, .key = key0 + (int64_t)i, .src = buf + i * BB, .len = BB };
    }
    char err[256] = "";
    int rc = kvs_backend_redis.put_batch(s, it, n, err, sizeof err);
    ck_assert_msg(rc == 0, "put_batch: %d %s", rc, err);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(it[i].rc == 0, "put item %zu: %d %s", i, it[i].rc, err);
    free(buf);
    free(it);
}

/* get n blocks in one batch: how many came back byte-exact; rcs[i] gets each rc. */
static size_t get_n(struct kvs_store *s, const struct kvs_ns *ns, int64_t key0, size_t n, unsigned seed,
                    int *rcs)
{
    struct kvs_item *it = calloc(n, sizeof *it);
    uint8_t *buf = calloc(n, BB);
    for (size_t i = 0; i < n; i++)
        it[i] = (struct kvs_item){ .ns = ns, .key = key0 + (int64_t)i, .dst = buf + i * BB, .len = BB };
    char err[256] = "";
    int rc = kvs_backend_redis.get_batch(s, it, n, err, sizeof err);
    size_t good = 0;
    for (size_t i = 0; i < n; i++) {
        if (rcs)
            rcs[i] = rc < 0 ? rc : it[i].rc;
        if (rc == 0 && it[i].rc == 0) {
            ck_assert_msg(same(buf + i * BB, BB, key0 + (int64_t)i, seed), "block %zu: wrong bytes", i);
            good++;
        }
    }
    free(buf);
    free(it);
    return good;
}

static void redis_key(const char *tenant, const struct kvs_ns *ns, int64_t key, char *buf, size_t len)
{
    ck_assert(redis_block_key(tenant, ns, key, buf, len) < len);
}

/* ---- slots, parsing, headers (no server) ----------------------------------------------- */

START_TEST(test_crc16_and_slots)
{
    ck_assert_uint_eq(rcl_crc16("123456789", 9), 0x31C3);
    ck_assert_uint_eq(rcl_key_slot("foo", 3), 12182);            /* CLUSTER KEYSLOT foo */
    ck_assert_uint_eq(rcl_key_slot("bar", 3), 5061);
    ck_assert_uint_eq(rcl_key_slot("{user1000}.following", 20), rcl_key_slot("user1000", 8));
    ck_assert_uint_eq(rcl_key_slot("{user1000}.followers", 20), rcl_key_slot("user1000", 8));
    /* "{}" is no tag: the whole key is hashed; only the first {...} counts. */
    ck_assert_uint_eq(rcl_key_slot("foo{}{bar}", 10), rcl_crc16("foo{}{bar}", 10) & 16383);
    ck_assert_uint_eq(rcl_key_slot("foo{{bar}}zap", 13), rcl_key_slot("{bar", 4));
    ck_assert_uint_eq(rcl_key_slot("foo{bar}{zap}", 13), rcl_key_slot("bar", 3));
    /* Our keys carry no tag: blocks of one deployment spread over many slots. */
    struct tns t;
    tns_init(&t, "m", 0);
    bool seen[4] = { false };
    for (int64_t k = 0; k < 64; k++) {
        char key[512];
        redis_key(NULL, &t.ns, k, key, sizeof key);
        ck_assert_ptr_null(strchr(key, '{'));
        seen[rcl_key_slot(key, strlen(key)) * 4 / 16384] = true;
    }
    ck_assert(seen[0] && seen[1] && seen[2] && seen[3]);
}
END_TEST

START_TEST(test_parse_redirect_and_seeds)
{
    unsigned slot = 0;
    char host[RCL_HOST_MAX];
    int port = 0;
    ck_assert_int_eq(rcl_parse_redirect("MOVED 3999 127.0.0.1:6381", 25, &slot, host, sizeof host, &port), 1);
    ck_assert_uint_eq(slot, 3999);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(port, 6381);
    ck_assert_int_eq(rcl_parse_redirect("ASK 1 ::1:7000", 14, &slot, host, sizeof host, &port), 2);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 7000);
    const char *bad[] = { "MOVED", "MOVED 16384 h:1", "MOVED x h:1", "MOVED 1 h", "MOVED 1 h:0",
                          "MOVED 1 h:70000", "MOVED 1 :5", "ERR wrong", "ASK 1  h:1" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(rcl_parse_redirect(bad[i], strlen(bad[i]), &slot, host, sizeof host, &port) == 0,
                      "accepted '%s'", bad[i]);

    char hosts[RCL_SEEDS_MAX][RCL_HOST_MAX];
    int ports[RCL_SEEDS_MAX];
    size_t n;
    char err[200];
    ck_assert_int_eq(rcl_parse_seeds("a:1,b.example:6379", hosts, ports, &n, err, sizeof err), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(hosts[1], "b.example");
    ck_assert_int_eq(ports[1], 6379);
    ck_assert_int_eq(rcl_parse_seeds("", hosts, ports, &n, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_int_eq(rcl_parse_seeds("a:1,b", hosts, ports, &n, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_msg(strstr(err, "'b'") && strstr(err, "HOST:PORT"), "message: %s", err);
    ck_assert_int_eq(rcl_parse_seeds("a:99999", hosts, ports, &n, err, sizeof err), -KVNODE_EINVAL);
}
END_TEST

START_TEST(test_value_header)
{
    struct tns t, other;
    tns_init(&t, "m", 1);
    tns_init(&other, "m", 2);
    size_t hl = redis_header_len("alpha");
    ck_assert_uint_eq(hl, REDIS_HDR_FIXED + 5);
    uint8_t *v = malloc(hl + BB);
    fill(v + hl, BB, 42, 1);
    redis_header_make("alpha", &t.ns, 42, 0, v + hl, BB, v);
    char err[200];
    size_t at = 0;
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, 0, BB, v, hl + BB, &at, err, sizeof err), 0);
    ck_assert_int_eq(redis_value_check("beta", &t.ns, 42, 0, BB, v, hl + BB, &at, err, sizeof err), KVS_CORRUPT);
    ck_assert_int_eq(redis_value_check("alpha", &other.ns, 42, 0, BB, v, hl + BB, &at, err, sizeof err), KVS_CORRUPT);
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 43, 0, BB, v, hl + BB, &at, err, sizeof err), KVS_CORRUPT);
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, 0, BB, v, hl + BB - 1, &at, err, sizeof err), KVS_CORRUPT);
    v[hl + 1000] ^= 0x10;
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, 0, BB, v, hl + BB, &at, err, sizeof err), KVS_CORRUPT);
    ck_assert_msg(strstr(err, "CRC-32C"), "message: %s", err);
    free(v);
}
END_TEST

/* Check words (issue 19): a version-2 value carries its word; a version-1
 * value (before words) reads as word 0. A value that is the asked block but
 * for its word is KVS_MISMATCH (kept), not KVS_CORRUPT (deleted). */
START_TEST(test_value_versions_and_words)
{
    struct tns t;
    tns_init(&t, "m", 1);
    const uint64_t w = 0x0123456789abcdefull;
    size_t hl = redis_header_len("alpha"), at = 0;
    uint8_t *v = malloc(hl + BB);
    uint64_t word = 99;
    char err[200];
    fill(v + hl, BB, 42, 1);
    redis_header_make("alpha", &t.ns, 42, w, v + hl, BB, v);
    ck_assert_uint_eq(le_get16(v + 4), REDIS_VERSION);
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, w, BB, v, hl + BB, &at, err, sizeof err), 0);
    ck_assert_uint_eq(at, hl);
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, 0, BB, v, hl + BB, &at, err, sizeof err),
                     KVS_MISMATCH);
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, w + 1, BB, v, hl + BB, &at, err, sizeof err),
                     KVS_MISMATCH);
    ck_assert_int_eq(redis_header_word(v, hl, &word), 0);
    ck_assert_uint_eq(word, w);
    ck_assert_int_eq(redis_header_word(v, 0, &word), KVS_MISS);
    ck_assert_int_eq(redis_header_word((const uint8_t *)"junk", 4, &word), KVS_CORRUPT);
    /* the word is under the CRC: a flipped word bit is corruption, not another word */
    v[48] ^= 1;
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, w, BB, v, hl + BB, &at, err, sizeof err),
                     KVS_CORRUPT);
    free(v);

    /* version 1, as written before check words: 48 fixed bytes, no word */
    size_t h1 = REDIS_HDR_FIXED_V1 + 5;
    uint8_t *o = calloc(1, h1 + BB);
    memcpy(o, REDIS_MAGIC, 4);
    le_put16(o + 4, REDIS_VERSION_V1);
    le_put16(o + 6, (uint16_t)h1);
    le_put64(o + 8, t.ns.fingerprint);
    le_put64(o + 16, 42);
    le_put64(o + 24, BB);
    le_put32(o + 32, t.ns.layout->tp_rank);
    le_put16(o + 36, 5);
    memcpy(o + REDIS_HDR_FIXED_V1, "alpha", 5);
    fill(o + h1, BB, 42, 1);
    uint32_t crc = crc32c(0, o, REDIS_HDR_FIXED_V1);
    crc = crc32c(crc, o + REDIS_HDR_FIXED_V1, h1 - REDIS_HDR_FIXED_V1 + BB);
    le_put32(o + 40, crc);
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, 0, BB, o, h1 + BB, &at, err, sizeof err), 0);
    ck_assert_uint_eq(at, h1);
    ck_assert_int_eq(redis_value_check("alpha", &t.ns, 42, w, BB, o, h1 + BB, &at, err, sizeof err),
                     KVS_MISMATCH);
    ck_assert_int_eq(redis_header_word(o, h1, &word), 0);
    ck_assert_uint_eq(word, 0);
    free(o);
}
END_TEST

START_TEST(test_password_sources)
{
    char pw[REDIS_PASSWORD_MAX], err[300];
    char path[] = "/tmp/kvnode-redis-pw-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "s3cret\nignored\n", 15), 15);
    close(fd);
    ck_assert_int_eq(redis_password_load(path, pw, sizeof pw, err, sizeof err), 0);
    ck_assert_str_eq(pw, "s3cret");
    setenv(REDIS_PASSWORD_ENV, "fromenv", 1);
    ck_assert_int_eq(redis_password_load("", pw, sizeof pw, err, sizeof err), 0);
    ck_assert_str_eq(pw, "fromenv");
    unsetenv(REDIS_PASSWORD_ENV);
    ck_assert_int_eq(redis_password_load(NULL, pw, sizeof pw, err, sizeof err), 0);
    ck_assert_str_eq(pw, "");
    unlink(path);
    ck_assert_int_eq(redis_password_load(path, pw, sizeof pw, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_msg(strstr(err, path) && strstr(err, "No such file"), "message: %s", err);
}
END_TEST

/* ---- a 3-master / 3-replica cluster ------------------------------------------------------ */

static struct rctl cl;

static void cluster_setup(void)
{
    if (rctl_start(&cl, 3, 1, NULL, NULL) < 0) {
        fprintf(stderr, "cluster: %s\n", rctl_err);
        rctl_stop(&cl);
        abort();
    }
}

static void cluster_teardown(void)
{
    rctl_stop(&cl);
}

static long long dbsize(const struct rctl *r, int i)
{
    char *out = NULL;
    long long n = -1;
    if (rctl_cli(r, i, &out, "dbsize", (const char *)NULL) == 0)
        n = strtoll(out, NULL, 10);
    free(out);
    return n;
}

START_TEST(test_cluster_round_trip)
{
    struct tns t;
    tns_init(&t, "rt", 0);
    struct kvs_store *s = open_store(cl.seeds, NULL, NULL);
    put_n(s, &t.ns, 1000, 48, 1);
    int rcs[48];
    ck_assert_uint_eq(get_n(s, &t.ns, 1000, 48, 1, rcs), 48);
    /* Spread over all three masters (no hash tag). */
    int masters = 0;
    for (int i = 0; i < cl.n; i++) {
        char *out = NULL;
        bool master = rctl_cli(&cl, i, &out, "role", (const char *)NULL) == 0 && strncmp(out, "master", 6) == 0;
        free(out);
        if (master) {
            masters++;
            ck_assert_msg(dbsize(&cl, i) >= 5, "master %d holds %lld keys", i, dbsize(&cl, i));
        }
    }
    ck_assert_int_eq(masters, 3);
    /* exists: stored and never stored; del removes. */
    int64_t keys[4] = { 1000, 1047, 999, 5000 };
    uint8_t present[4];
    char err[256];
    ck_assert_int_eq(kvs_backend_redis.exists(s, &t.ns, keys, NULL, 4, present, err, sizeof err), 0);
    ck_assert(present[0] && present[1] && !present[2] && !present[3]);
    ck_assert_int_eq(kvs_backend_redis.del(s, &t.ns, 1000, 0, err, sizeof err), 0);
    ck_assert_uint_eq(get_n(s, &t.ns, 1000, 2, 1, rcs), 1);
    ck_assert_int_eq(rcs[0], KVS_MISS);
    /* Another rank or tenant is another key. */
    struct tns r1;
    tns_init(&r1, "rt", 1);
    ck_assert_uint_eq(get_n(s, &r1.ns, 1001, 1, 1, rcs), 0);
    ck_assert_int_eq(rcs[0], KVS_MISS);
    struct kvs_store *s2 = open_store(cl.seeds, NULL, "beta");
    ck_assert_uint_eq(get_n(s2, &t.ns, 1001, 1, 1, rcs), 0);
    ck_assert_int_eq(rcs[0], KVS_MISS);
    kvs_backend_redis.close(s2);
    ck_assert_int_eq(kvs_backend_redis.health(s, err, sizeof err), 0);
    kvs_backend_redis.close(s);
}
END_TEST

static void cli_ok(int i, const char *a, const char *b, const char *c, const char *d, const char *e)
{
    char *out = NULL;
    int rc = rctl_cli(&cl, i, &out, a, b, c, d, e, (const char *)NULL);
    ck_assert_msg(rc == 0 && out && !strstr(out, "ERR"), "redis-cli %s %s %s: %d %s (%s)", a, b, c, rc,
                  out ? out : "", rctl_err);
    free(out);
}

static void node_id(int i, char *id, size_t len)
{
    char *out = NULL;
    ck_assert_int_eq(rctl_cli(&cl, i, &out, "cluster", "myid", (const char *)NULL), 0);
    out[strcspn(out, "\r\n")] = '\0';
    snprintf(id, len, "%s", out);
    free(out);
}

/* A slot migrated by hand: ASK while it moves, MOVED after, both followed. */
START_TEST(test_cluster_moved_and_ask)
{
    struct tns t;
    tns_init(&t, "mv", 0);
    struct kvs_store *s = open_store(cl.seeds, NULL, NULL);
    put_n(s, &t.ns, 77, 1, 3);
    char key[512];
    redis_key(NULL, &t.ns, 77, key, sizeof key);
    unsigned slot = rcl_key_slot(key, strlen(key));
    int src = rctl_master_of(&cl, key), dst = -1;
    ck_assert_int_ge(src, 0);
    for (int i = 0; i < cl.n && dst < 0; i++) {
        char *out = NULL;
        if (i != src && rctl_cli(&cl, i, &out, "role", (const char *)NULL) == 0 && strncmp(out, "master", 6) == 0)
            dst = i;
        free(out);
    }
    ck_assert_int_ge(dst, 0);

    /* A real MOVED from a master that does not own the slot, parsed. */
    redisContext *hc = redisConnect("127.0.0.1", cl.ports[dst]);
    ck_assert(hc && !hc->err);
    redisReply *r = redisCommand(hc, "GET %s", key);
    ck_assert(r && r->type == REDIS_REPLY_ERROR);
    unsigned pslot;
    char host[RCL_HOST_MAX];
    int port;
    ck_assert_int_eq(rcl_parse_redirect(r->str, r->len, &pslot, host, sizeof host, &port), 1);
    ck_assert_uint_eq(pslot, slot);
    ck_assert_int_eq(port, cl.ports[src]);
    freeReplyObject(r);
    redisFree(hc);

    /* Move the slot: IMPORTING / MIGRATING, then MIGRATE the key. */
    char sid[64], did[64], slots[16], dport[16];
    node_id(src, sid, sizeof sid);
    node_id(dst, did, sizeof did);
    snprintf(slots, sizeof slots, "%u", slot);
    snprintf(dport, sizeof dport, "%d", cl.ports[dst]);
    cli_ok(dst, "cluster", "setslot", slots, "importing", sid);
    cli_ok(src, "cluster", "setslot", slots, "migrating", did);
    {
        char *out = NULL;
        ck_assert_int_eq(rctl_cli(&cl, src, &out, "migrate", "127.0.0.1", dport, key, "0", "5000",
                                  (const char *)NULL), 0);
        ck_assert_msg(strstr(out, "OK"), "migrate: %s", out);
        free(out);
    }
    /* The handle's map still says src: src answers ASK, the read follows it. */
    struct rcl_counters c0, c1, c2;
    redis_get_counters(s, &c0);
    int rcs[1];
    ck_assert_uint_eq(get_n(s, &t.ns, 77, 1, 3, rcs), 1);
    redis_get_counters(s, &c1);
    ck_assert_uint_eq(c1.ask - c0.ask, 1);
    ck_assert_uint_eq(c1.moved - c0.moved, 0);
    /* The slot is dst's now (told to every master): src answers MOVED. */
    for (int i = 0; i < cl.n; i++) {
        char *out = NULL;
        if (rctl_cli(&cl, i, &out, "role", (const char *)NULL) == 0 && strncmp(out, "master", 6) == 0)
            cli_ok(i, "cluster", "setslot", slots, "node", did);
        free(out);
    }
    ck_assert_uint_eq(get_n(s, &t.ns, 77, 1, 3, rcs), 1);
    redis_get_counters(s, &c2);
    ck_assert_uint_eq(c2.moved - c1.moved, 1);
    ck_assert_uint_ge(c2.map_refreshes, c1.map_refreshes + 1);
    /* The map is right now: no more redirects. */
    ck_assert_uint_eq(get_n(s, &t.ns, 77, 1, 3, rcs), 1);
    struct rcl_counters c3;
    redis_get_counters(s, &c3);
    ck_assert_uint_eq(c3.moved, c2.moved);
    ck_assert_uint_eq(c3.ask, c2.ask);
    kvs_backend_redis.close(s);
}
END_TEST

/* redis-cli --cluster reshard moves 2000 slots while we read: every read is
 * whole and byte-exact, and the handle was redirected on the way. */
START_TEST(test_cluster_reads_during_reshard)
{
    struct tns t;
    tns_init(&t, "rs", 0);
    struct kvs_store *s = open_store(cl.seeds, NULL, NULL);
    put_n(s, &t.ns, 0, 64, 5);
    int m0 = -1, m1 = -1;
    for (int i = 0; i < cl.n; i++) {
        char *out = NULL;
        if (rctl_cli(&cl, i, &out, "role", (const char *)NULL) == 0 && strncmp(out, "master", 6) == 0) {
            if (m0 < 0)
                m0 = i;
            else if (m1 < 0)
                m1 = i;
        }
        free(out);
    }
    char from[64], to[64], hp[32];
    node_id(m0, from, sizeof from);
    node_id(m1, to, sizeof to);
    snprintf(hp, sizeof hp, "127.0.0.1:%d", cl.ports[m0]);
    char port[16];
    snprintf(port, sizeof port, "%d", cl.ports[m0]);
    const char *argv[] = { "redis-cli", "-h", "127.0.0.1", "-p", port, "--cluster", "reshard", hp,
                           "--cluster-from", from, "--cluster-to", to, "--cluster-slots", "2000",
                           "--cluster-yes", NULL };
    struct proc_opts o = { .argv = argv, .in = PROC_NULL, .out = PROC_NULL, .err = PROC_NULL };
    pid_t pid = proc_spawn(&o, NULL);
    ck_assert_int_gt(pid, 0);
    int rounds = 0, st;
    while ((st = proc_wait(&pid, 0)) == PROC_TIMEOUT) {
        int rcs[64];
        size_t good = get_n(s, &t.ns, 0, 64, 5, rcs);
        for (int i = 0; i < 64; i++)
            ck_assert_msg(rcs[i] == 0, "round %d block %d: %d", rounds, i, rcs[i]);
        ck_assert_uint_eq(good, 64);
        rounds++;
    }
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reshard status %d", st);
    ck_assert_uint_eq(get_n(s, &t.ns, 0, 64, 5, NULL), 64);
    struct rcl_counters c;
    redis_get_counters(s, &c);
    ck_assert_msg(c.moved + c.ask > 0, "%d rounds during the reshard, no redirect", rounds);
    ck_assert_int_ge(rounds, 1);
    kvs_backend_redis.close(s);
}
END_TEST

/* A value not written by kvnode, or changed by one byte: a miss, counted by
 * the caller as corrupt (KVS_CORRUPT), and deleted. */
START_TEST(test_cluster_corrupt_values)
{
    struct tns t;
    tns_init(&t, "cr", 0);
    struct kvs_store *s = open_store(cl.seeds, NULL, NULL);
    put_n(s, &t.ns, 10, 2, 9);
    char k10[512], k11[512];
    redis_key(NULL, &t.ns, 10, k10, sizeof k10);
    redis_key(NULL, &t.ns, 11, k11, sizeof k11);
    int i10 = rctl_master_of(&cl, k10), i11 = rctl_master_of(&cl, k11);
    char *out = NULL;
    ck_assert_int_eq(rctl_cli(&cl, i10, &out, "set", k10, "garbage", (const char *)NULL), 0);
    free(out);
    out = NULL;
    char off[16];
    snprintf(off, sizeof off, "%zu", redis_header_len(NULL) + 5000);
    ck_assert_int_eq(rctl_cli(&cl, i11, &out, "setrange", k11, off, "X", (const char *)NULL), 0);
    free(out);
    int rcs[2];
    ck_assert_uint_eq(get_n(s, &t.ns, 10, 2, 9, rcs), 0);
    ck_assert_int_eq(rcs[0], KVS_CORRUPT);
    ck_assert_int_eq(rcs[1], KVS_CORRUPT);
    /* Deleted: now a plain miss. */
    ck_assert_uint_eq(get_n(s, &t.ns, 10, 2, 9, rcs), 0);
    ck_assert_int_eq(rcs[0], KVS_MISS);
    ck_assert_int_eq(rcs[1], KVS_MISS);
    kvs_backend_redis.close(s);
}
END_TEST

/* ---- failover ------------------------------------------------------------------------------ */

START_TEST(test_cluster_master_killed_in_write_burst)
{
    struct rctl f;
    ck_assert_msg(rctl_start(&f, 3, 1, NULL, NULL) == 0, "cluster: %s", rctl_err);
    struct tns t;
    tns_init(&t, "fo", 0);
    struct kvs_store *s = open_store(f.seeds, NULL, NULL);
    put_n(s, &t.ns, 0, 64, 11);
    char k0[512];
    redis_key(NULL, &t.ns, 0, k0, sizeof k0);
    int victim = rctl_master_of(&f, k0);
    ck_assert_int_ge(victim, 0);
    /* Replicated before the kill: every master's replica has its whole offset. */
    for (int i = 0; i < f.n; i++) {
        bool synced = false;
        for (int tries = 0; tries < 100 && !synced; tries++) {
            char *out = NULL;
            if (rctl_cli(&f, i, &out, "info", "replication", (const char *)NULL) == 0) {
                const char *m = strstr(out, "master_repl_offset:"), *sl = strstr(out, "slave0:");
                const char *so = sl ? strstr(sl, "offset=") : NULL;
                if (!strstr(out, "role:master"))
                    synced = true;
                else if (m && so)
                    synced = strtoll(m + 19, NULL, 10) == strtoll(so + 7, NULL, 10);
            }
            free(out);
            if (!synced)
                rctl_sleep_ms(50);
        }
        ck_assert_msg(synced, "server %d: replica not in sync", i);
    }
    /* The burst: batches of 8 new blocks; the victim dies after the third. */
    enum { BATCHES = 40, PER = 8 };
    int ok[BATCHES * PER];
    size_t acked = 0, failed = 0;
    uint8_t *buf = malloc(PER * BB);
    struct rcl_counters c0;
    redis_get_counters(s, &c0);
    for (int b = 0; b < BATCHES; b++) {
        if (b == 3)
            rctl_kill(&f, victim);
        struct kvs_item it[PER];
        for (int i = 0; i < PER; i++) {
            int64_t key = 1000 + b * PER + i;
            fill(buf + (size_t)i * BB, BB, key, 11);
            it[i] = (struct kvs_item){ .ns = &t.ns, .key = key, .src = buf + (size_t)i * BB, .len = BB };
        }
        char err[256];
        kvs_backend_redis.put_batch(s, it, PER, err, sizeof err);
        for (int i = 0; i < PER; i++) {
            ok[b * PER + i] = it[i].rc == 0;
            if (it[i].rc == 0)
                acked++;
            else
                failed++;
        }
    }
    free(buf);
    ck_assert_int_eq(rctl_wait_ok(&f, 20000), 0);
    struct rcl_counters c1;
    redis_get_counters(s, &c1);
    ck_assert_uint_gt(c1.map_refreshes, c0.map_refreshes);
    /* Within the request timeout (8 s) the promotion (~2 s) came: every write was acknowledged. */
    ck_assert_msg(failed == 0, "%zu of %d writes failed", failed, BATCHES * PER);
    /* Nothing wrong: everything replicated before the kill is there, every
     * acknowledged write after it is there or (asynchronous replication) a miss. */
    ck_assert_uint_eq(get_n(s, &t.ns, 0, 64, 11, NULL), 64);
    int rcs[BATCHES * PER];
    size_t good = get_n(s, &t.ns, 1000, BATCHES * PER, 11, rcs);
    size_t lost = 0;
    for (int i = 0; i < BATCHES * PER; i++) {
        ck_assert_msg(rcs[i] == 0 || rcs[i] == KVS_MISS, "block %d: %d", i, rcs[i]);
        if (ok[i] && rcs[i] == KVS_MISS)
            lost++;
    }
    /* Only writes acknowledged by the victim just before it died can be lost (batches 0..2). */
    ck_assert_msg(lost <= 3 * PER, "%zu acknowledged writes lost", lost);
    ck_assert_uint_ge(good, (size_t)(BATCHES - 3) * PER);
    /* The promoted replica takes new writes of the victim's slots. */
    put_n(s, &t.ns, 0, 1, 12);
    ck_assert_uint_eq(get_n(s, &t.ns, 0, 1, 12, NULL), 1);
    kvs_backend_redis.close(s);
    rctl_stop(&f);
}
END_TEST

/* ---- password, single server ---------------------------------------------------------------- */

START_TEST(test_password_cluster)
{
    struct rctl p;
    ck_assert_msg(rctl_start(&p, 3, 0, "hunter2-kvnode", NULL) == 0, "cluster: %s", rctl_err);
    struct kvs_config cfg = { .backend = "redis", .redis_nodes = p.seeds, .connect_timeout_ms = 500,
                              .timeout_ms = 2000 };
    struct kvs_store *s = NULL;
    char err[300] = "";
    /* No password: the cluster answers NOAUTH, the open fails (retried later as any outage). */
    ck_assert_int_lt(kvs_backend_redis.open(&cfg, &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "NOAUTH") || strstr(err, "Authentication"), "message: %s", err);
    /* A wrong password: a configuration error, and the message does not show it. */
    cfg.redis_password = "wrong-one";
    ck_assert_int_eq(kvs_backend_redis.open(&cfg, &s, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_msg(!strstr(err, "wrong-one") && strstr(err, "AUTH"), "message: %s", err);
    struct tns t;
    tns_init(&t, "pw", 0);
    s = open_store(p.seeds, "hunter2-kvnode", NULL);
    put_n(s, &t.ns, 0, 16, 2);
    ck_assert_uint_eq(get_n(s, &t.ns, 0, 16, 2, NULL), 16);
    kvs_backend_redis.close(s);
    rctl_stop(&p);
}
END_TEST

START_TEST(test_single_server)
{
    struct rctl one;
    ck_assert_msg(rctl_start(&one, 0, 0, NULL, NULL) == 0, "server: %s", rctl_err);
    struct tns t;
    tns_init(&t, "one", 3);
    struct kvs_store *s = open_store(one.seeds, NULL, "alpha");
    put_n(s, &t.ns, -5, 10, 4);
    ck_assert_uint_eq(get_n(s, &t.ns, -5, 10, 4, NULL), 10);
    ck_assert_int_eq(dbsize(&one, 0), 10);
    char key[512];
    redis_key("alpha", &t.ns, -5, key, sizeof key);
    ck_assert_msg(strncmp(key, "kvnode/alpha/", 13) == 0 && strstr(key, "/3/-5"), "key %s", key);
    ck_assert(rctl_cli_has(&one, 0, "1", "exists", key, (const char *)NULL));
    kvs_backend_redis.close(s);
    rctl_stop(&one);
}
END_TEST

static Suite *kvs_redis_suite(void)
{
    Suite *s = suite_create("kvs_redis");
    TCase *tc = tcase_create("offline");
    tcase_add_test(tc, test_crc16_and_slots);
    tcase_add_test(tc, test_parse_redirect_and_seeds);
    tcase_add_test(tc, test_value_header);
    tcase_add_test(tc, test_value_versions_and_words);
    tcase_add_test(tc, test_password_sources);
    tcase_set_timeout(tc, 10);
    suite_add_tcase(s, tc);

    tc = tcase_create("cluster");
    tcase_add_unchecked_fixture(tc, cluster_setup, cluster_teardown);
    tcase_add_test(tc, test_cluster_round_trip);
    tcase_add_test(tc, test_cluster_moved_and_ask);
    tcase_add_test(tc, test_cluster_corrupt_values);
    tcase_add_test(tc, test_cluster_reads_during_reshard);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);

    tc = tcase_create("faults");
    tcase_add_test(tc, test_cluster_master_killed_in_write_burst);
    tcase_add_test(tc, test_password_cluster);
    tcase_add_test(tc, test_single_server);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);   /* as kvnoded: a write to a killed server is an error, not a death */
    SRunner *sr = srunner_create(kvs_redis_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
