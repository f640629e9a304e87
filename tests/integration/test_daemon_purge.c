/* Integration: model revisions and PURGE (issue 31) on a real kvnoded.
 *
 * - a purge of a TP=2 deployment drops its blocks from host memory, the
 *   (simulated) HBM tier and the file store: MATCH (prefix and per key) is 0
 *   in both ranks, KVCM receives a DELETE for every complete key and holds
 *   none of the deployment; another deployment's blocks stay byte-exact and
 *   KVCM keeps them; a block a reader leased before the purge stays readable
 *   until its lease ends; a put begun before the purge and committed after
 *   it is not visible;
 * - after a graceful restart on the same store, and after a SIGKILL right
 *   after a purge's answer, MATCH is still 0 and the other deployment's
 *   blocks come back from the store byte-exact;
 * - an engine connection may not name another tenant (EDENIED) and an
 *   observer must name what to purge (EINVAL); with two tenants (as root:
 *   their clients run as their uids), tenant alpha's engine and observer
 *   connections cannot purge beta's deployment, by tenant name, deployment
 *   id or model, while root's observer can; kvnodectl purge (root)
 *   purges a deployment by its id and a model's every deployment, and names
 *   another tenant;
 * - revisions: two revisions of one layout are two deployments that do not
 *   see each other's blocks; no revision is the deployment id of a client
 *   that never heard of revisions, so its blocks stay found; a purge of a
 *   model takes every revision. */
#include <check.h>

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tenants_util.h"
#include "../sim/kvcmctl.h"

#define BB       (16u << 10)
#define N        8
#define HOSTPORT "10.9.8.7:7000"
#define STYPE    "ST_EVENT_REPORT_L1P5"
#define TIERS    "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\nserver.request_timeout=30s\n" \
                 "hbm.backend=sim\nhbm.bytes=1MiB\nhbm.high_watermark=0.9\nhbm.low_watermark=0.8\n"

static double scale(void)
{
    return simctl_under_valgrind() || getenv("KVNODED_REAL") ? 10.0 : 1.0;
}

static int tmo(int ms)
{
    return (int)(ms * scale());
}

/* ---- the daemon on a store, optionally publishing to KVCM ---------------------------- */

static void start_on(kvh_daemon *d, const char *store, const char *kvcm_base)
{
    char conf[4096];
    int w = snprintf(conf, sizeof conf,
                     TIERS "persist.backend=file\npersist.path=%s\npersist.fsync=never\n"
                     "persist.policy=write_through\n", store);
    ck_assert(w > 0 && (size_t)w < sizeof conf);
    if (kvcm_base) {
        int m = snprintf(conf + w, sizeof conf - (size_t)w,
                         "kvcm.enabled=on\nkvcm.endpoints=%s\nkvcm.host_ip_port=" HOSTPORT "\n"
                         "kvcm.flush_interval=20ms\nkvcm.heartbeat_interval=200ms\n"
                         "kvcm.snapshot_interval=1h\nkvcm.retry_base=50ms\nkvcm.retry_max=400ms\n"
                         "kvcm.host_down_timeout=500ms\n", kvcm_base);
        ck_assert(m > 0 && (size_t)m < sizeof conf - (size_t)w);
    }
    KVH_START(d, conf);
}

static json_t *wait_recovery(const kvh_daemon *d)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    for (;;) {
        json_t *st = kvh_stats(d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        if (json_is_true(kvh_json_get(st, "persist.recovery.complete")))
            return st;
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "recovery scan not complete within the deadline");
        kvh_sleep_ms(10);
    }
}

static void wait_stat_at_least(const kvh_daemon *d, const char *path, long long want)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    long long v;
    while ((v = kvh_stat(d, path)) < want) {
        ck_assert_msg(kvh_now_ms() < deadline, "%s is %lld, not >= %lld within the deadline", path, v, want);
        kvh_sleep_ms(10);
    }
}

/* ---- KVCM simulator ---------------------------------------------------------------------- */

static json_t *sim_json(const struct kvcmctl *s, const char *path)
{
    for (int i = 0;; i++) {
        char *out = NULL;
        int st = kvcmctl_http(s, "GET", path, NULL, &out);
        if (st == 200) {
            json_error_t err;
            json_t *doc = json_loads(out, 0, &err);
            ck_assert_msg(doc != NULL, "GET %s%s: not JSON: %s", s->base, path, err.text);
            free(out);
            return doc;
        }
        free(out);
        ck_assert_msg(st == -1 && i < 4, "GET %s%s: status %d", s->base, path, st);
        kvh_sleep_ms(100);
    }
}

/* Blocks KVCM holds for model's deployment on this node (-1: no reporter yet). */
static long long kvcm_blocks(const struct kvcmctl *s, const char *model)
{
    json_t *st = sim_json(s, "/state"), *r;
    const char *id;
    long long n = -1;
    char pfx[128];
    int pl = snprintf(pfx, sizeof pfx, "%s_16", model);
    json_object_foreach(json_object_get(st, "reporters"), id, r) {
        const char *inst = json_string_value(json_object_get(r, "instance_id"));
        const char *host = json_string_value(json_object_get(r, "host_ip_port"));
        if (inst && strncmp(inst, pfx, (size_t)pl) == 0 && (inst[pl] == '\0' || inst[pl] == '_') &&
            host && strcmp(host, HOSTPORT) == 0)
            n = json_integer_value(json_object_get(r, "block_count"));
    }
    json_decref(st);
    return n;
}

static void wait_kvcm_blocks(const struct kvcmctl *s, const char *model, long long want)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)tmo(10000);
    long long n;
    while ((n = kvcm_blocks(s, model)) != want) {
        ck_assert_msg(kvh_now_ms() < deadline, "KVCM holds %lld blocks of %s, not %lld", n, model, want);
        kvh_sleep_ms(20);
    }
}

/* How many times text occurs in what the simulator recorded. */
static long recorded_count(const struct kvcmctl *s, const char *text)
{
    json_t *rec = sim_json(s, "/recorded?since=0");
    char *dump = json_dumps(rec, JSON_COMPACT);
    long n = 0;
    ck_assert_ptr_nonnull(dump);
    for (const char *p = dump; (p = strstr(p, text)); p += strlen(text))
        n++;
    free(dump);
    json_decref(rec);
    return n;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static void put_in_tier(kvnode_client *c, const kvnode_key *keys, size_t n, int tier, uint64_t seed)
{
    kvnode_loc locs[N];
    kvnode_lease lease = 0;
    ck_assert(n <= N);
    KVH_OK(c, kvnode_put_begin(c, keys, n, tier, &lease, locs));
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(locs[i].ptr != NULL, "put_begin: no slot for key #%zu", i);
        ck_assert_int_eq(locs[i].tier, tier);
        kvh_fill(locs[i].ptr, BB, keys[i], seed);
    }
    KVH_OK(c, kvnode_put_commit(c, lease));
}

/* Neither a prefix nor any single key of keys is held. */
static void assert_none(kvnode_client *c, const kvnode_key *keys, size_t n, const char *what)
{
    bool present[N];
    size_t held = 99;
    ck_assert(n <= N);
    ck_assert_msg(kvh_match(c, keys, n) == 0, "%s: MATCH %ld after the purge", what, kvh_match(c, keys, n));
    KVH_OK(c, kvnode_exists(c, keys, NULL, n, present, &held));
    ck_assert_msg(held == 0, "%s: %zu keys still exist after the purge", what, held);
}

static void connect_ranks(const kvh_daemon *d, kvnode_client **r0, kvnode_client **r1)
{
    kvnode_layout l0 = kvh_layout("purged", BB, 2, 0), l1 = kvh_layout("purged", BB, 2, 1);
    int rc = kvnode_connect_device(d->sock, &l0, 0, r0);
    ck_assert_msg(rc == 0, "connect rank 0 (device 0): %s", kvnode_connect_error());
    KVH_CONNECT(d, &l1, r1);
}

/* ---- 1. every tier, KVCM, restart, SIGKILL ------------------------------------------------- */

START_TEST(purge_drops_every_tier_and_survives_restart)
{
    char store[PATH_MAX];
    struct kvcmctl s;
    kvh_daemon d;
    const char *sim_args[] = { "--snapshot-interval-s", "0", NULL };
    struct kvcmctl_opts so = { .extra = sim_args, .valgrind = simctl_under_valgrind() };

    ck_assert_msg(kvh_mkdtemp(store, sizeof store) == 0, "%s", kvh_error());
    kvcmctl_start(&s, &so);
    start_on(&d, store, s.base);
    kvnode_client *r0, *r1, *kc;
    connect_ranks(&d, &r0, &r1);
    kvnode_layout lk = kvh_layout("kept", BB, 1, 0);
    KVH_CONNECT(&d, &lk, &kc);

    kvnode_key a[N], b[N], k[N], w[1];
    kvh_chain(a, N, 1);
    kvh_chain(b, N, 2);
    kvh_chain(k, N, 3);
    kvh_chain(w, 1, 4);
    /* a: rank 0 in HBM, rank 1 in host memory; b: host memory in both; k: the other deployment. */
    put_in_tier(r0, a, N, KVNODE_TIER_HBM, 1);
    KVH_PUT_OK(r1, a, N, 1);
    KVH_PUT_OK(r0, b, N, 1);
    KVH_PUT_OK(r1, b, N, 1);
    KVH_PUT_OK(kc, k, N, 7);
    wait_stat_at_least(&d, "persist.written_blocks_total", 5 * N);
    wait_kvcm_blocks(&s, "purged", 2 * N);
    wait_kvcm_blocks(&s, "kept", N);
    ck_assert_int_eq(recorded_count(&s, "EVENT_BLOCK_DELETE"), 0);

    /* A reader's lease from before the purge, and a put begun before it. */
    kvnode_lease rl = 0, wl = 0;
    kvnode_loc rloc[1], wloc[1];
    size_t got = 0;
    KVH_OK(r1, kvnode_get_begin(r1, b, 1, &rl, rloc, &got));
    ck_assert_uint_eq(got, 1);
    KVH_OK(r0, kvnode_put_begin(r0, w, 1, KVNODE_TIER_HOST, &wl, wloc));
    ck_assert_ptr_nonnull(wloc[0].ptr);
    kvh_fill(wloc[0].ptr, BB, w[0], 1);

    uint32_t nns = 0;
    uint64_t nblocks = 0;
    KVH_OK(r0, kvnode_purge(r0, NULL, NULL, NULL, &nns, &nblocks));
    ck_assert_uint_eq(nns, 2);
    ck_assert_uint_eq(nblocks, 4 * N);

    /* The leased block reads as it was until its lease ends. */
    ck_assert_msg(kvh_verify(rloc[0].ptr, BB, b[0], 1) == 0, "%s", kvh_error());
    KVH_OK(r1, kvnode_get_end(r1, rl));
    /* The put begun before the purge stores nothing. */
    KVH_OK(r0, kvnode_put_commit(r0, wl));
    assert_none(r0, w, 1, "rank 0, put across the purge");

    assert_none(r0, a, N, "rank 0, HBM");
    assert_none(r0, b, N, "rank 0, host");
    assert_none(r1, a, N, "rank 1, a");
    assert_none(r1, b, N, "rank 1, b");
    ck_assert_uint_eq(KVH_GET_VERIFIED(kc, k, N, 7), N);
    wait_stat_at_least(&d, "persist.deleted_keys_total", 4 * N);
    wait_kvcm_blocks(&s, "purged", 0);
    ck_assert_int_eq(kvcm_blocks(&s, "kept"), N);
    ck_assert_int_ge(recorded_count(&s, "EVENT_BLOCK_DELETE"), 2 * N);

    /* Graceful restart on the same store: still nothing; the other deployment comes back. */
    kvnode_close(r0);
    kvnode_close(r1);
    kvnode_close(kc);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&s);
    start_on(&d, store, NULL);
    json_decref(wait_recovery(&d));
    connect_ranks(&d, &r0, &r1);
    KVH_CONNECT(&d, &lk, &kc);
    assert_none(r0, a, N, "restarted, rank 0, a");
    assert_none(r0, b, N, "restarted, rank 0, b");
    assert_none(r1, a, N, "restarted, rank 1, a");
    assert_none(r1, b, N, "restarted, rank 1, b");
    assert_none(r0, w, 1, "restarted, rank 0, w");
    ck_assert_int_eq(kvh_match(kc, k, N), N);
    ck_assert_uint_eq(KVH_GET_VERIFIED(kc, k, N, 7), N);

    /* Blocks put again, purged, and the daemon killed right after the answer. */
    KVH_PUT_OK(r0, a, N, 2);
    KVH_PUT_OK(r1, a, N, 2);
    wait_stat_at_least(&d, "persist.written_blocks_total", 2 * N);
    KVH_OK(r1, kvnode_purge(r1, NULL, NULL, NULL, &nns, &nblocks));
    ck_assert_uint_eq(nns, 2);
    ck_assert_uint_eq(nblocks, 2 * N);
    kvnode_close(r0);
    kvnode_close(r1);
    kvnode_close(kc);
    ck_assert_int_eq(kvh_kill(&d, SIGKILL), KVH_EXIT_SIGNAL_BASE + SIGKILL);
    kvh_destroy(&d);
    start_on(&d, store, NULL);
    json_decref(wait_recovery(&d));
    connect_ranks(&d, &r0, &r1);
    KVH_CONNECT(&d, &lk, &kc);
    assert_none(r0, a, N, "killed, rank 0");
    assert_none(r1, a, N, "killed, rank 1");
    ck_assert_uint_eq(KVH_GET_VERIFIED(kc, k, N, 7), N);
    kvnode_close(r0);
    kvnode_close(r1);
    kvnode_close(kc);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 2. who may purge what ------------------------------------------------------------------- */

START_TEST(purge_scope_and_authorisation)
{
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\n");
    kvnode_layout l = kvh_layout("auth", BB, 1, 0);
    kvnode_client *c, *obs;
    KVH_CONNECT(&d, &l, &c);
    KVH_CONNECT(&d, NULL, &obs);
    kvnode_key k[N];
    kvh_chain(k, N, 9);
    KVH_PUT_OK(c, k, N, 1);

    /* An engine connection names another tenant: refused, nothing purged. */
    int rc = kvnode_purge(c, "beta", NULL, NULL, NULL, NULL);
    ck_assert_msg(rc == -KVNODE_EDENIED, "purge naming another tenant: %d (%s)", rc, kvnode_last_error(c));
    ck_assert_msg(strstr(kvnode_last_error(c), "only its own tenant") != NULL, "%s", kvnode_last_error(c));
    ck_assert_int_eq(kvh_match(c, k, N), N);
    /* Its own tenant named: allowed. An unknown tenant, by the administrator: named. */
    rc = kvnode_purge(obs, "nosuch", kvnode_deployment_id(c), NULL, NULL, NULL);
    ck_assert_msg(rc == -KVNODE_EINVAL && strstr(kvnode_last_error(obs), "no tenant nosuch"), "%d %s", rc,
                  kvnode_last_error(obs));
    /* An observer names nothing: refused by the library; both: refused. */
    ck_assert_int_eq(kvnode_purge(obs, NULL, NULL, NULL, NULL, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_purge(obs, NULL, "x", "y", NULL, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(kvh_match(c, k, N), N);
    /* A deployment id that is none: nothing purged. */
    uint32_t nns = 9;
    uint64_t nb = 9;
    KVH_OK(obs, kvnode_purge(obs, NULL, "auth-0", NULL, &nns, &nb));
    ck_assert_uint_eq(nns, 0);
    ck_assert_uint_eq(nb, 0);
    ck_assert_int_eq(kvh_match(c, k, N), N);
    /* The observer (root, the administrator) by deployment id, naming the default tenant. */
    KVH_OK(obs, kvnode_purge(obs, "default", kvnode_deployment_id(c), NULL, &nns, &nb));
    ck_assert_uint_eq(nns, 1);
    ck_assert_uint_eq(nb, N);
    ck_assert_int_eq(kvh_match(c, k, N), 0);
    kvnode_close(c);
    kvnode_close(obs);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 2b. tenants: another tenant's deployment is out of reach ------------------------------------- */

#define ALPHA 65534
#define BETA  65533
#define TENANTS_CONF "server.socket_mode=0666\nmemory.host_bytes=24MiB\nmemory.slab_bytes=1MiB\n" \
                     "tenant.alpha.uids=65534\ntenant.alpha.host_bytes=8MiB\n" \
                     "tenant.beta.uids=65533\ntenant.beta.host_bytes=8MiB\n"

struct tenant_job {
    const kvh_daemon *d;
    char beta_dep[160];
};

/* As beta: its blocks. */
static int beta_puts(void *arg)
{
    struct tenant_job *j = arg;
    kvnode_layout l = kvh_layout("tenant-model", BB, 1, 0);
    kvnode_client *c;
    kvnode_key k[N];
    kvh_chain(k, N, 31);
    if (kvnode_connect(j->d->sock, &l, &c) != 0)
        return 10;
    int rc = kvh_put(c, k, N, 5) == 0 ? 0 : 11;
    kvnode_close(c);
    return rc;
}

/* As alpha: every way of naming beta's deployment fails or reaches nothing. */
static int alpha_tries(void *arg)
{
    struct tenant_job *j = arg;
    kvnode_layout l = kvh_layout("tenant-model", BB, 1, 0);
    kvnode_client *c, *obs;
    uint32_t nns = 99;
    if (kvnode_connect(j->d->sock, &l, &c) != 0 || kvnode_connect(j->d->sock, NULL, &obs) != 0)
        return 20;
    /* Its engine connection and its observer name tenant beta: refused. */
    if (kvnode_purge(c, "beta", j->beta_dep, NULL, NULL, NULL) != -KVNODE_EDENIED)
        return 21;
    if (kvnode_purge(obs, "beta", j->beta_dep, NULL, NULL, NULL) != -KVNODE_EDENIED)
        return 22;
    if (!strstr(kvnode_last_error(obs), "only its own tenant"))
        return 23;
    /* Beta's deployment id, or the model both use, in its own tenant: none of beta's. */
    if (kvnode_purge(obs, NULL, j->beta_dep, NULL, &nns, NULL) != 0 || nns != 0)
        return 24;
    if (kvnode_purge(c, NULL, NULL, "tenant-model", &nns, NULL) != 0 || nns != 1)
        return 25;
    kvnode_close(c);
    kvnode_close(obs);
    return 0;
}

START_TEST(purge_never_reaches_another_tenant)
{
    TENANTS_NEEDS_ROOT("test_daemon_purge: purge_never_reaches_another_tenant");
    kvh_daemon d;
    struct tenant_job j = { .d = &d };
    tenants_start(&d, TENANTS_CONF);
    ck_assert_int_eq(tenants_run_as(beta_puts, &j, BETA, BETA, NULL, 0), 0);
    ck_assert_int_eq(tenants_stat(&d, "beta", "blocks"), N);
    json_t *st = kvh_stats(&d);
    json_t *nss = kvh_json_get(st, "namespaces"), *ns;
    size_t i;
    json_array_foreach(nss, i, ns)
        if (strcmp(json_string_value(json_object_get(ns, "tenant")) ?: "", "beta") == 0)
            snprintf(j.beta_dep, sizeof j.beta_dep, "%s",
                     json_string_value(json_object_get(ns, "deployment_id")));
    json_decref(st);
    ck_assert_msg(j.beta_dep[0], "no namespace of tenant beta in the stats");
    ck_assert_int_eq(tenants_run_as(alpha_tries, &j, ALPHA, ALPHA, NULL, 0), 0);
    ck_assert_int_eq(tenants_stat(&d, "beta", "blocks"), N);
    /* The administrator (root, an observer) names beta: purged. */
    kvnode_client *obs;
    uint32_t nns = 0;
    uint64_t nb = 0;
    KVH_CONNECT(&d, NULL, &obs);
    KVH_OK(obs, kvnode_purge(obs, "beta", j.beta_dep, NULL, &nns, &nb));
    ck_assert_uint_eq(nns, 1);
    ck_assert_uint_eq(nb, N);
    ck_assert_int_eq(tenants_stat(&d, "beta", "blocks"), 0);
    kvnode_close(obs);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 3. kvnodectl purge ----------------------------------------------------------------------- */

static const char *ctl_path(void)
{
    const char *p = getenv("KVNODECTL");
    return (p && *p && access(p, X_OK) == 0) ? p : NULL;
}

static int run_ctl(char *const argv[], char **out)
{
    char *errtext = NULL;
    int st = proc_exit_code(proc_run(&(struct proc_opts){ .argv = (const char *const *)argv }, 10000, out,
                                     &errtext));
    if (st != 0)
        fprintf(stderr, "kvnodectl: exit %d: %s\n", st, errtext ? errtext : "");
    free(errtext);
    return st;
}

START_TEST(kvnodectl_purge_deployment_and_model)
{
    const char *ctl = ctl_path();
    ck_assert_msg(ctl != NULL, "$KVNODECTL (%s) is not an executable",
                  getenv("KVNODECTL") ? getenv("KVNODECTL") : "unset");
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\n");
    kvnode_layout l1 = kvh_layout("ctl-a", BB, 1, 0), l2 = kvh_layout("ctl-b", BB, 1, 0);
    kvnode_layout l3 = kvh_layout("ctl-b", BB, 1, 0);
    l3.num_layers = 5;   /* another deployment of model ctl-b */
    kvnode_client *c1, *c2, *c3;
    KVH_CONNECT(&d, &l1, &c1);
    KVH_CONNECT(&d, &l2, &c2);
    KVH_CONNECT(&d, &l3, &c3);
    kvnode_key k[N];
    kvh_chain(k, N, 11);
    KVH_PUT_OK(c1, k, N, 1);
    KVH_PUT_OK(c2, k, N, 2);
    KVH_PUT_OK(c3, k, N, 3);

    char *out = NULL;
    char *const dep_argv[] = { (char *)ctl, (char *)"-S", d.sock, (char *)"purge", (char *)"deployment",
                               (char *)kvnode_deployment_id(c1), NULL };
    ck_assert_int_eq(run_ctl(dep_argv, &out), 0);
    ck_assert_msg(strstr(out, "1 namespaces, 8 blocks") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(kvh_match(c1, k, N), 0);
    ck_assert_int_eq(kvh_match(c2, k, N), N);

    char *const model_argv[] = { (char *)ctl, (char *)"-S", d.sock, (char *)"--json", (char *)"purge",
                                 (char *)"model", (char *)"ctl-b", (char *)"tenant", (char *)"default", NULL };
    ck_assert_int_eq(run_ctl(model_argv, &out), 0);
    json_error_t jerr;
    json_t *doc = json_loads(out, 0, &jerr);
    ck_assert_msg(doc != NULL, "not JSON: %s", out);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "namespaces")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "blocks")), 2 * N);
    json_decref(doc);
    free(out);
    ck_assert_int_eq(kvh_match(c2, k, N), 0);
    ck_assert_int_eq(kvh_match(c3, k, N), 0);

    char *const bad_argv[] = { (char *)ctl, (char *)"-S", d.sock, (char *)"purge", (char *)"model", NULL };
    out = NULL;
    ck_assert_int_eq(run_ctl(bad_argv, &out), 2);
    free(out);

    /* --revision binds the revision's deployment: it sees the revision's blocks, not the others'. */
    kvnode_client *rev;
    ck_assert_int_eq(kvnode_connect_revision(d.sock, &l1, "r-7", -1, 0, &rev), 0);
    KVH_PUT_OK(rev, k, 1, 4);
    char key[32], bb[32];
    snprintf(key, sizeof key, "%" PRId64, k[0]);
    snprintf(bb, sizeof bb, "%u", BB);
    char *const rev_argv[] = { (char *)ctl, (char *)"-S", d.sock, (char *)"--json", (char *)"match",
                               (char *)"--model", (char *)"ctl-a", (char *)"--block-bytes", bb,
                               (char *)"--layers", (char *)"4", (char *)"--kv-heads", (char *)"8",
                               (char *)"--head-dim", (char *)"128", (char *)"--revision", (char *)"r-7",
                               key, NULL };
    ck_assert_int_eq(run_ctl(rev_argv, &out), 0);
    ck_assert_msg(strstr(out, "\"matched\":1") != NULL, "%s", out);
    free(out);
    char *const norev_argv[] = { (char *)ctl, (char *)"-S", d.sock, (char *)"--json", (char *)"match",
                                 (char *)"--model", (char *)"ctl-a", (char *)"--block-bytes", bb,
                                 (char *)"--layers", (char *)"4", (char *)"--kv-heads", (char *)"8",
                                 (char *)"--head-dim", (char *)"128", key, NULL };
    ck_assert_int_eq(run_ctl(norev_argv, &out), 0);
    ck_assert_msg(strstr(out, "\"matched\":0") != NULL, "%s", out);
    free(out);
    kvnode_close(rev);
    kvnode_close(c1);
    kvnode_close(c2);
    kvnode_close(c3);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* ---- 4. revisions -------------------------------------------------------------------------------- */

START_TEST(revisions_are_separate_deployments)
{
    char store[PATH_MAX];
    kvh_daemon d;
    ck_assert_msg(kvh_mkdtemp(store, sizeof store) == 0, "%s", kvh_error());
    start_on(&d, store, NULL);
    kvnode_layout l = kvh_layout("rev", BB, 1, 0);
    kvnode_client *plain, *ra, *rb, *rempty;
    KVH_CONNECT(&d, &l, &plain);
    ck_assert_int_eq(kvnode_connect_revision(d.sock, &l, "A", -1, 0, &ra), 0);
    ck_assert_int_eq(kvnode_connect_revision(d.sock, &l, "B", -1, 0, &rb), 0);
    ck_assert_int_eq(kvnode_connect_revision(d.sock, &l, "", -1, 0, &rempty), 0);
    /* No revision ("" too) is the id a client without revisions gets. */
    ck_assert_str_eq(kvnode_deployment_id(rempty), kvnode_deployment_id(plain));
    ck_assert_str_ne(kvnode_deployment_id(ra), kvnode_deployment_id(plain));
    ck_assert_str_ne(kvnode_deployment_id(ra), kvnode_deployment_id(rb));

    kvnode_key k[N];
    kvh_chain(k, N, 21);
    KVH_PUT_OK(ra, k, N, 0xA);
    ck_assert_int_eq(kvh_match(rb, k, N), 0);
    ck_assert_int_eq(kvh_match(plain, k, N), 0);
    KVH_PUT_OK(rb, k, N, 0xB);
    KVH_PUT_OK(plain, k, N, 0xC);
    ck_assert_uint_eq(KVH_GET_VERIFIED(ra, k, N, 0xA), N);
    ck_assert_uint_eq(KVH_GET_VERIFIED(rb, k, N, 0xB), N);
    ck_assert_uint_eq(KVH_GET_VERIFIED(rempty, k, N, 0xC), N);

    /* A control character in a revision is refused, naming the field. */
    kvnode_client *bad = NULL;
    ck_assert_int_eq(kvnode_connect_revision(d.sock, &l, "a\nb", -1, 0, &bad), -KVNODE_ELAYOUT);
    ck_assert_msg(strstr(kvnode_connect_error(), "revision") != NULL, "%s", kvnode_connect_error());

    /* The blocks of a client without revisions stay found after a restart. */
    wait_stat_at_least(&d, "persist.written_blocks_total", 3 * N);
    kvnode_close(plain);
    kvnode_close(ra);
    kvnode_close(rb);
    kvnode_close(rempty);
    KVH_STOP_DESTROY(&d);
    start_on(&d, store, NULL);
    json_decref(wait_recovery(&d));
    KVH_CONNECT(&d, &l, &plain);
    ck_assert_int_eq(kvnode_connect_revision(d.sock, &l, "A", -1, 0, &ra), 0);
    ck_assert_int_eq(kvnode_connect_revision(d.sock, &l, "B", -1, 0, &rb), 0);
    ck_assert_uint_eq(KVH_GET_VERIFIED(plain, k, N, 0xC), N);
    /* Revisions' blocks come back from the store as their own (layout records, version 2). */
    ck_assert_uint_eq(KVH_GET_VERIFIED(ra, k, N, 0xA), N);
    ck_assert_uint_eq(KVH_GET_VERIFIED(rb, k, N, 0xB), N);

    /* A purge of the model takes every revision. */
    uint32_t nns = 0;
    KVH_OK(plain, kvnode_purge(plain, NULL, NULL, "rev", &nns, NULL));
    ck_assert_int_eq(kvh_match(plain, k, N), 0);
    ck_assert_int_eq(kvh_match(ra, k, N), 0);
    ck_assert_int_eq(kvh_match(rb, k, N), 0);
    kvnode_close(plain);
    kvnode_close(ra);
    kvnode_close(rb);
    KVH_STOP_DESTROY(&d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("daemon_purge");
    TCase *tc = tcase_create("purge");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, purge_drops_every_tier_and_survives_restart);
    tcase_add_test(tc, purge_scope_and_authorisation);
    tcase_add_test(tc, purge_never_reaches_another_tenant);
    tcase_add_test(tc, kvnodectl_purge_deployment_and_model);
    tcase_add_test(tc, revisions_are_separate_deployments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
