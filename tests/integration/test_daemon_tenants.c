/* Tenants (issue 15): one engine cannot read, overwrite, delete or evict
 * another tenant's KV cache. Two tenants, alpha (uid ALPHA) and beta (uid
 * BETA), each run as its own user in a child process (tests/common/proc.h),
 * against a real daemon:
 *
 * - the hostile neighbour: beta scans every arena it was lent for alpha's
 *   bytes, binds alpha's exact layout, matches and deletes alpha's keys and
 *   fills its own memory; alpha's blocks are untouched and read back
 *   byte-exact after each step;
 * - quota isolation: beta's load evicts beta's blocks only (per-tenant
 *   counters in /stats);
 * - restart with the file store: the same layout and the same keys in both
 *   tenants come back each to its own tenant, byte-exact;
 * - what outsiders see: /stats and /metrics on the admin listener name
 *   tenants and counts, not models; STATS over the socket shows a client
 *   its own tenant's namespaces, root all of them;
 * - a client of no section when "default" has no memory is refused at
 *   HELLO naming its uid and the fix; a tenant's max_clients holds;
 * - HBM on the sim backend: beta finds, matches and deletes nothing of
 *   alpha's HBM blocks; beta's pressure demotes and evicts only beta's
 *   blocks, alpha's own pressure demotes alpha's into alpha's host arena;
 *   blocks written from HBM to the file store come back to their tenant
 *   after a restart.
 *
 * Acting as other users needs root (as test_daemon_access): run as root in
 * CI; elsewhere each test says so and passes without checking. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tenants_util.h"
#include "../common/kvh_http.h"

#define ALPHA 65534
#define BETA  65533
#define BLOCK (64u << 10)            /* bytes per block */
#define NA    64u                    /* alpha's blocks: 4 MiB of its 16 */
#define SEED_A UINT64_C(0xA11CE)
#define SEED_B UINT64_C(0xB0B)
#define CHAIN_A 1001u

/* Two tenants of 16 MiB each; "default" keeps 16 MiB. */
#define TENANTS_CONF \
    "server.socket_mode=0666\n" \
    "memory.host_bytes=48MiB\n" \
    "memory.slab_bytes=1MiB\n" \
    "tenant.alpha.uids=65534\n" \
    "tenant.alpha.host_bytes=16MiB\n" \
    "tenant.beta.uids=65533\n" \
    "tenant.beta.host_bytes=16MiB\n"
/* ... and HBM on the sim backend: 4 MiB per device each, "default" none. */
#define HBM_CONF TENANTS_CONF "hbm.backend=sim\nhbm.bytes=8MiB\ntenant.alpha.hbm_bytes=4MiB\n" \
                 "tenant.beta.hbm_bytes=4MiB\n"

/* Every tenant uses this layout: the same model, dtype and shape. */
static kvnode_layout shared_layout(void)
{
    return kvh_layout("shared-model-7b", BLOCK, 1, 0);
}

/* --- what the children do -------------------------------------------------- */

/* A child's job: the daemon, what to do, and numbers to check against. */
struct job {
    const kvh_daemon *d;
    int (*fn)(const struct job *j, kvnode_client *c);
    size_t n;                 /* keys of the job */
    uint64_t chain, seed;
    int device;               /* > 0: connect declaring CUDA device device - 1 (sim HBM) */
};

/* Exit codes a child reports (anything else is unexpected). */
enum {
    JOB_OK = 0, JOB_CONNECT = 10, JOB_PUT, JOB_VERIFY, JOB_MATCH, JOB_SCAN_FOUND, JOB_SCAN_EMPTY,
    JOB_DELETE, JOB_STATS, JOB_NOMEM,
};

static int job_main(void *arg)
{
    const struct job *j = arg;
    kvnode_layout l = shared_layout();
    kvnode_client *c;
    if (kvnode_connect_device(j->d->sock, &l, j->device - 1, &c) != 0) {
        fprintf(stderr, "child uid %d: connect: %s\n", (int)getuid(), kvnode_connect_error());
        return JOB_CONNECT;
    }
    int rc = j->fn(j, c);
    kvnode_close(c);
    return rc;
}

/* Run j in a child as uid (its own gid); its exit code. */
static int run_as(uid_t uid, const struct job *j)
{
    return tenants_run_as(job_main, (void *)j, uid, uid, NULL, 0);
}

static int put_chain(const struct job *j, kvnode_client *c)
{
    kvnode_key keys[NA];
    kvh_chain(keys, j->n, j->chain);
    if (kvh_put(c, keys, j->n, j->seed) != 0) {
        fprintf(stderr, "put: %s\n", kvh_error());
        return JOB_PUT;
    }
    return JOB_OK;
}

/* All n keys matched and read back byte-exact, copied and in place. */
static int read_back(const struct job *j, kvnode_client *c)
{
    kvnode_key keys[NA];
    size_t got = 0;
    kvh_chain(keys, j->n, j->chain);
    if (kvh_match(c, keys, j->n) != (long)j->n)
        return JOB_MATCH;
    if (kvh_get_verify(c, keys, j->n, j->seed, 0, &got) != 0 || got != j->n ||
        kvh_get_zc_verify(c, keys, j->n, j->seed, &got) != 0 || got != j->n) {
        fprintf(stderr, "read back: got %zu of %zu: %s\n", got, j->n, kvh_error());
        return JOB_VERIFY;
    }
    return JOB_OK;
}

/* The hostile neighbour's scan: every kvnode arena mapped into this process
 * (the memfds it was lent: /proc/self/maps names them /memfd:kvnode-*), read
 * whole, searched for the first 256 bytes of each of alpha's blocks. Returns
 * how many of alpha's blocks were found; *scanned = bytes read. */
static size_t scan_for(const struct job *j, uint64_t *scanned)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uint8_t *want = malloc(BLOCK);
    kvnode_key keys[NA];
    size_t found = 0;

    *scanned = 0;
    kvh_chain(keys, j->n, CHAIN_A);
    while (f && want && fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        char perms[8];
        if (!strstr(line, "/memfd:kvnode-") ||
            sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s", &lo, &hi, perms) != 3 || perms[0] != 'r')
            continue;
        *scanned += hi - lo;
        for (size_t k = 0; k < j->n; k++) {
            kvh_fill(want, BLOCK, keys[k], SEED_A);
            if (memmem((const void *)lo, hi - lo, want, 256))
                found++;
        }
    }
    if (f)
        fclose(f);
    free(want);
    return found;
}

/* beta, bound to alpha's exact layout: alpha's bytes are nowhere in what it
 * mapped, alpha's keys match nothing, deleting them deletes nothing, and
 * STATS shows beta only its own namespace. */
static int neighbour_probe(const struct job *j, kvnode_client *c)
{
    kvnode_key keys[NA];
    uint64_t scanned;
    size_t deleted = 99, found = scan_for(j, &scanned);

    if (found > 0) {
        fprintf(stderr, "beta found %zu of alpha's %zu blocks in its %" PRIu64 " mapped bytes\n", found,
                j->n, scanned);
        return JOB_SCAN_FOUND;
    }
    if (scanned < (16u << 20)) {
        fprintf(stderr, "beta scanned only %" PRIu64 " bytes: its own 16 MiB arena is not mapped?\n", scanned);
        return JOB_SCAN_EMPTY;
    }
    kvh_chain(keys, j->n, CHAIN_A);
    if (kvh_match(c, keys, j->n) != 0)
        return JOB_MATCH;
    if (kvnode_delete(c, keys, j->n, &deleted) != 0 || deleted != 0) {
        fprintf(stderr, "beta deleted %zu of alpha's keys\n", deleted);
        return JOB_DELETE;
    }
    json_t *st = kvh_stats_client(c);
    json_t *nss = st ? kvh_json_get(st, "namespaces") : NULL;
    const char *tenant = nss && json_array_size(nss) == 1
                         ? json_string_value(json_object_get(json_array_get(nss, 0), "tenant")) : NULL;
    int rc = tenant && strcmp(tenant, "beta") == 0 && !kvh_json_get(st, "kvcm.deployments.0") ? JOB_OK : JOB_STATS;
    if (rc != JOB_OK)
        fprintf(stderr, "beta's STATS: %zu namespaces, the first of tenant %s\n",
                nss ? json_array_size(nss) : 0, tenant ? tenant : "(none)");
    json_decref(st);
    return rc;
}

/* n blocks put into the tenant's HBM on its device (sim: mapped memfds),
 * written in place. */
static int put_hbm(const struct job *j, kvnode_client *c)
{
    kvnode_key keys[NA];
    kvnode_loc locs[NA];
    kvnode_lease lease;
    kvh_chain(keys, j->n, j->chain);
    if (kvnode_put_begin(c, keys, j->n, KVNODE_TIER_HBM, &lease, locs) != 0)
        return JOB_PUT;
    for (size_t i = 0; i < j->n; i++) {
        if (locs[i].tier != KVNODE_TIER_HBM || !locs[i].ptr) {
            fprintf(stderr, "block %zu: tier %d, not HBM\n", i, locs[i].tier);
            return JOB_PUT;
        }
        kvh_fill(locs[i].ptr, BLOCK, keys[i], j->seed);
    }
    return kvnode_put_commit(c, lease) == 0 ? JOB_OK : JOB_PUT;
}

/* All n keys read back byte-exact in place, every one still in HBM. */
static int read_hbm(const struct job *j, kvnode_client *c)
{
    kvnode_key keys[NA];
    kvnode_tiers t;
    size_t got = 0;
    kvh_chain(keys, j->n, j->chain);
    if (kvnode_match_tiers(c, keys, j->n, &t) != 0 || t.hbm != j->n)
        return JOB_MATCH;
    if (kvh_get_zc_verify(c, keys, j->n, j->seed, &got) != 0 || got != j->n)
        return JOB_VERIFY;
    return JOB_OK;
}

/* beta on the same device: nothing of alpha's in its host or HBM mapping
 * (it was lent both: at least 16 + 4 MiB scanned), alpha's keys match
 * nothing; then it fills its own HBM. */
static int hbm_probe_and_fill(const struct job *j, kvnode_client *c)
{
    uint64_t scanned;
    kvnode_key keys[NA];
    size_t found = scan_for(j, &scanned);
    if (found > 0 || scanned < (20u << 20)) {
        fprintf(stderr, "beta found %zu of alpha's blocks in %" PRIu64 " bytes\n", found, scanned);
        return found > 0 ? JOB_SCAN_FOUND : JOB_SCAN_EMPTY;
    }
    kvh_chain(keys, j->n, CHAIN_A);
    if (kvh_match(c, keys, j->n) != 0)
        return JOB_MATCH;
    struct job mine = *j;
    mine.chain = 9000;
    mine.seed = SEED_B;
    return put_hbm(&mine, c);
}

/* beta puts n blocks into its 16 MiB, 4 MiB at a time: its own blocks are
 * evicted to make room. */
static int neighbour_fill(const struct job *j, kvnode_client *c)
{
    enum { BATCH = 64 };
    kvnode_key keys[BATCH];
    for (uint64_t round = 0; round < j->n / BATCH; round++) {
        kvh_chain(keys, BATCH, j->chain + round);
        if (kvh_put(c, keys, BATCH, j->seed) != 0) {
            fprintf(stderr, "fill round %" PRIu64 ": %s\n", round, kvh_error());
            return JOB_PUT;
        }
    }
    return JOB_OK;
}

/* alpha puts n keys of CHAIN_A (its bytes: SEED_A) with put on device, and
 * reads them back with read; returns the reading job, for later rounds. */
static struct job alpha_puts(const kvh_daemon *d, int (*put)(const struct job *j, kvnode_client *c),
                             int (*read)(const struct job *j, kvnode_client *c), size_t n, int device)
{
    struct job put_a = { d, put, n, CHAIN_A, SEED_A, device }, read_a = put_a;
    read_a.fn = read;
    ck_assert_int_eq(run_as(ALPHA, &put_a), JOB_OK);
    ck_assert_int_eq(run_as(ALPHA, &read_a), JOB_OK);
    return read_a;
}

/* Both tenants run fn on the same n keys (CHAIN_A) of the same layout, each
 * with its own bytes (alpha SEED_A, beta SEED_B), on the job's device. */
static void run_in_both(const kvh_daemon *d, int (*fn)(const struct job *j, kvnode_client *c), size_t n,
                        int device)
{
    struct job a = { d, fn, n, CHAIN_A, SEED_A, device }, b = { d, fn, n, CHAIN_A, SEED_B, device };
    ck_assert_int_eq(run_as(ALPHA, &a), JOB_OK);
    ck_assert_int_eq(run_as(BETA, &b), JOB_OK);
}

/* After a restart: recovery indexed n blocks of each named tenant, each in
 * its own tenant's store, none in "default"'s. */
static void expect_recovered(const kvh_daemon *d, long long n)
{
    ck_assert_int_eq(kvh_wait_stat(d, "persist.recovery.indexed", 2 * n, 10000, NULL), 0);
    ck_assert_int_eq(tenants_stat(d, "alpha", "store_blocks"), n);
    ck_assert_int_eq(tenants_stat(d, "beta", "store_blocks"), n);
    ck_assert_int_eq(tenants_stat(d, "default", "store_blocks"), 0);
}

/* --- tests ------------------------------------------------------------------ */

/* HBM on the sim backend: each tenant its own region per device (its own
 * memfd), so the hostile neighbour finds nothing there either. */
START_TEST(hbm_regions_are_the_tenants_own)
{
    TENANTS_NEEDS_ROOT("tenants: the HBM isolation test");
    kvh_daemon d;
    tenants_start(&d, HBM_CONF);
    struct job probe_b = { &d, hbm_probe_and_fill, 16, 0, 0, 1 };

    struct job read_a = alpha_puts(&d, put_hbm, read_hbm, 16, 1);
    ck_assert_int_eq(run_as(BETA, &probe_b), JOB_OK);
    ck_assert_int_eq(run_as(ALPHA, &read_a), JOB_OK);
    /* Two devices of 4 MiB each per tenant, "default" none (what is left is 0). */
    ck_assert_int_eq(tenants_stat(&d, "alpha", "hbm_capacity_bytes"), 8 << 20);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "hbm_used_bytes"), 16 * BLOCK);
    ck_assert_int_eq(tenants_stat(&d, "beta", "hbm_used_bytes"), 16 * BLOCK);
    ck_assert_int_eq(tenants_stat(&d, "default", "hbm_capacity_bytes"), 0);
    ck_assert_int_eq(KVH_STAT(&d, "gpu.hbm_arenas"), 4);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(hostile_neighbour_finds_and_touches_nothing)
{
    TENANTS_NEEDS_ROOT("tenants: the hostile-neighbour test");
    kvh_daemon d;
    tenants_start(&d, TENANTS_CONF);
    struct job probe_b = { &d, neighbour_probe, NA, 0, 0, 0 };
    struct job fill_b = { &d, neighbour_fill, 768, 5000, SEED_B, 0 };

    struct job read_a = alpha_puts(&d, put_chain, read_back, NA, 0);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "blocks"), NA);

    /* beta: scan, bind alpha's layout, match, delete, see its own stats. */
    ck_assert_int_eq(run_as(BETA, &probe_b), JOB_OK);
    ck_assert_int_eq(run_as(ALPHA, &read_a), JOB_OK);

    /* beta fills its memory three times over: only its blocks go. */
    ck_assert_int_eq(run_as(BETA, &fill_b), JOB_OK);
    ck_assert_int_eq(run_as(ALPHA, &read_a), JOB_OK);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "blocks"), NA);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "evictions_total"), 0);
    long long evicted = tenants_stat(&d, "beta", "evictions_total");
    ck_assert_msg(evicted >= 768 - 256, "beta evicted %lld of its 768 blocks (16 MiB hold 256)", evicted);
    ck_assert_int_le(tenants_stat(&d, "beta", "host_used_bytes"), 16 << 20);

    /* The same layout is two deployments: two namespaces, two ids. */
    json_t *st = kvh_stats(&d);
    json_t *nss = kvh_json_get(st, "namespaces");
    ck_assert_int_eq(json_array_size(nss), 2);
    const char *id0 = json_string_value(json_object_get(json_array_get(nss, 0), "deployment_id"));
    const char *id1 = json_string_value(json_object_get(json_array_get(nss, 1), "deployment_id"));
    ck_assert_str_ne(id0, id1);
    json_decref(st);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* alpha reads its blocks over and over while beta fills its memory: alpha
 * keeps every hit, beta's load evicts beta's blocks only. */
START_TEST(quota_isolation_keeps_alphas_hit_rate)
{
    TENANTS_NEEDS_ROOT("tenants: the quota isolation test");
    kvh_daemon d;
    tenants_start(&d, TENANTS_CONF);
    struct job fill_b = { &d, neighbour_fill, 512, 7000, SEED_B, 0 };

    struct job read_a = alpha_puts(&d, put_chain, read_back, NA, 0);
    long long hits0 = tenants_stat(&d, "alpha", "keys_matched_total");
    ck_assert_int_eq(tenants_stat(&d, "alpha", "keys_missed_total"), 0);
    for (int round = 0; round < 3; round++) {
        fill_b.chain = 7000 + 100 * (uint64_t)round;
        ck_assert_int_eq(run_as(BETA, &fill_b), JOB_OK);
        ck_assert_int_eq(run_as(ALPHA, &read_a), JOB_OK);
    }
    /* Every one of alpha's lookups hit: the same count per round, no miss. */
    long long hits = tenants_stat(&d, "alpha", "keys_matched_total");
    ck_assert_int_eq(hits - hits0, 3 * hits0);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "keys_missed_total"), 0);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "evictions_total"), 0);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "blocks"), NA);
    ck_assert_int_ge(tenants_stat(&d, "beta", "evictions_total"), 3 * 512 - 256);
    /* The node totals are the tenants' sums. */
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.dropped_total"), tenants_stat(&d, "beta", "evictions_total"));
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(restart_brings_each_tenants_blocks_back_to_it)
{
    TENANTS_NEEDS_ROOT("tenants: the restart test");
    char store[PATH_MAX], conf[PATH_MAX + 512], path[PATH_MAX + 64];
    ck_assert_int_eq(kvh_mkdtemp(store, sizeof store), 0);
    snprintf(conf, sizeof conf, TENANTS_CONF "persist.backend=file\npersist.path=%s\n", store);
    kvh_daemon d;
    tenants_start(&d, conf);
    run_in_both(&d, put_chain, NA, 0);
    ck_assert_int_eq(kvh_wait_stat(&d, "persist.written_blocks_total", 2 * NA, 10000, NULL), 0);
    KVH_STOP_DESTROY(&d);

    /* Each named tenant's store is a root of its own. */
    struct stat sb;
    snprintf(path, sizeof path, "%s/tenants/alpha", store);
    ck_assert_int_eq(stat(path, &sb), 0);
    snprintf(path, sizeof path, "%s/tenants/beta", store);
    ck_assert_int_eq(stat(path, &sb), 0);

    tenants_start(&d, conf);
    expect_recovered(&d, NA);
    run_in_both(&d, read_back, NA, 0);
    ck_assert_int_eq(KVH_STAT(&d, "persist.promotions_ok_total"), 2 * NA);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* The admin pages name tenants and counts, never a model; STATS over the
 * socket shows root every namespace, each with its tenant. */
START_TEST(outsiders_see_tenants_not_models)
{
    TENANTS_NEEDS_ROOT("tenants: the stats view test");
    kvh_daemon d;
    char conf[PATH_MAX + 512], addr[PATH_MAX + 16], *text = NULL, ctype[64];
    ck_assert_int_eq(kvh_mkdtemp(addr, sizeof addr), 0);
    snprintf(conf, sizeof conf, TENANTS_CONF "admin.listen=unix:%s/admin.sock\n", addr);
    snprintf(addr + strlen(addr), sizeof addr - strlen(addr), "/admin.sock");
    memmove(addr + 5, addr, strlen(addr) + 1);
    memcpy(addr, "unix:", 5);
    tenants_start(&d, conf);
    run_in_both(&d, put_chain, 4, 0);

    ck_assert_int_eq(kvh_http_req(addr, NULL, "/stats", &text, ctype, sizeof ctype), 200);
    ck_assert_msg(!strstr(text, "shared-model-7b"), "/stats names a model: %s", text);
    json_t *st = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(json_array_size(kvh_json_get(st, "namespaces")), 0);
    ck_assert_int_eq(json_array_size(kvh_json_get(st, "tenants")), 3);
    json_t *a = tenants_line(st, "alpha");
    ck_assert_int_eq(kvh_json_int(a, "blocks"), 4);
    ck_assert_int_eq(kvh_json_int(a, "namespaces"), 1);
    ck_assert_int_eq(kvh_json_int(a, "host_capacity_bytes"), 16 << 20);
    ck_assert_int_eq(kvh_json_int(tenants_line(st, "default"), "host_capacity_bytes"), 16 << 20);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.capacity_bytes"), 48 << 20);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.blocks"), 8);
    json_decref(st);
    free(text);
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/metrics", &text, ctype, sizeof ctype), 200);
    ck_assert_msg(!strstr(text, "shared-model-7b"), "/metrics names a model");
    ck_assert_ptr_nonnull(strstr(text, "kvnode_tenant_blocks{tenant=\"alpha\",tier=\"memory\"} 4\n"));
    free(text);

    /* root over the socket: everything, each namespace with its tenant. */
    st = kvh_stats(&d);
    json_t *nss = kvh_json_get(st, "namespaces");
    ck_assert_int_eq(json_array_size(nss), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(nss, 0), "tenant")), "alpha");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(nss, 1), "tenant")), "beta");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(nss, 1), "model")), "shared-model-7b");
    json_decref(st);

    /* kvnodectl status: a line per tenant. */
    const char *ctl = getenv("KVNODECTL") && *getenv("KVNODECTL") ? getenv("KVNODECTL") : "build/kvnodectl";
    const char *const argv[] = { ctl, "-S", d.sock, "status", NULL };
    char *out = NULL;
    int rc = proc_exit_code(proc_run(&(struct proc_opts){ .argv = argv }, 10000, &out, NULL));
    ck_assert_msg(rc == 0 && out, "kvnodectl status: exit %d", rc);
    ck_assert_msg(strstr(out, "tenant alpha") && strstr(out, "tenant beta") &&
                  strstr(out, "4 blocks, 1 namespaces"), "%s", out);
    free(out);
    KVH_STOP_DESTROY(&d);
}
END_TEST

struct connect_arg {
    const kvh_daemon *d;
    uid_t uid;
};

/* Connect with a layout: 0 served, 1 refused with EDENIED naming the uid
 * and the fix, anything else unexpected. */
static int connect_refused(void *arg)
{
    const struct connect_arg *a = arg;
    kvnode_layout l = shared_layout();
    kvnode_client *c;
    int rc = kvnode_connect(a->d->sock, &l, &c);
    if (rc == 0) {
        kvnode_close(c);
        return 0;
    }
    char uid[96];
    snprintf(uid, sizeof uid, "uid %d belongs to no [tenant.NAME] section", (int)a->uid);
    if (rc == -KVNODE_EDENIED && strstr(kvnode_connect_error(), uid) && strstr(kvnode_connect_error(), "add uid"))
        return 1;
    fprintf(stderr, "uid %d: %d: %s\n", (int)a->uid, rc, kvnode_connect_error());
    return 2;
}

START_TEST(default_without_memory_refuses_at_hello)
{
    TENANTS_NEEDS_ROOT("tenants: the default-tenant refusal test");
    kvh_daemon d;
    tenants_start(&d, "server.socket_mode=0666\nmemory.host_bytes=32MiB\nmemory.slab_bytes=1MiB\n"
                      "tenant.alpha.uids=65534\ntenant.alpha.host_bytes=16MiB\n"
                      "tenant.beta.uids=65533\ntenant.beta.host_bytes=16MiB\n"
                      "tenant.beta.max_clients=1\n");
    struct connect_arg other = { &d, 4242 }, alpha = { &d, ALPHA };
    int st = tenants_status_as(connect_refused, &other, 4242, 10000);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "uid 4242: status %d", st);
    st = tenants_status_as(connect_refused, &alpha, ALPHA, 10000);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "alpha: status %d", st);
    /* root is "default" too: it may still observe. */
    json_t *s = kvh_stats(&d);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(kvh_json_int(tenants_line(s, "default"), "host_capacity_bytes"), 0);
    json_decref(s);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* A tenant's max_clients: the next connection is refused, naming it. */
static int hold_two(void *arg)
{
    const kvh_daemon *d = arg;
    kvnode_layout l = shared_layout();
    kvnode_client *c1, *c2;
    if (kvnode_connect(d->sock, &l, &c1) != 0)
        return 10;
    int rc = kvnode_connect(d->sock, &l, &c2);
    int ok = rc == -KVNODE_ELIMIT && strstr(kvnode_connect_error(), "[tenant.beta] max_clients = 1");
    if (rc == 0)
        kvnode_close(c2);
    kvnode_close(c1);
    return ok ? 0 : 11;
}

START_TEST(tenant_max_clients_holds)
{
    TENANTS_NEEDS_ROOT("tenants: the max_clients test");
    kvh_daemon d;
    tenants_start(&d, TENANTS_CONF "tenant.beta.max_clients=1\n");
    int st = tenants_status_as(hold_two, &d, BETA, 10000);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "beta: status %d", st);
    ck_assert_int_eq(tenants_stat(&d, "beta", "refused_total"), 1);
    ck_assert_int_eq(tenants_stat(&d, "beta", "clients"), 0);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* --- HBM on the sim backend: the neighbour, pressure and demotion ---------- */

#define ARENA_BLOCKS 64u            /* a tenant's 4 MiB device arena of 64 KiB blocks */
#define HOST_BLOCKS  256u           /* a tenant's 16 MiB host arena */
#define MAXK   512u                 /* keys of one job */
#define PUT_AT 16u                  /* keys per put: well inside a client's reservation share */
#define CHAIN_A2 1002u
#define CHAIN_B  9100u

/* n keys of j's chain put with tier HBM on j's device, PUT_AT at a time,
 * written in place wherever each slot landed (a full arena falls back to
 * host memory). */
static int put_hbm_many(const struct job *j, kvnode_client *c)
{
    static kvnode_key keys[MAXK];
    if (j->n > MAXK)
        return JOB_PUT;
    kvh_chain(keys, j->n, j->chain);
    for (size_t at = 0; at < j->n; at += PUT_AT) {
        size_t m = j->n - at < PUT_AT ? j->n - at : PUT_AT;
        kvnode_loc locs[PUT_AT];
        kvnode_lease lease;
        if (kvnode_put_begin(c, keys + at, m, KVNODE_TIER_HBM, &lease, locs) != 0) {
            fprintf(stderr, "put_begin at %zu: %s\n", at, kvnode_last_error(c));
            return JOB_PUT;
        }
        for (size_t i = 0; i < m; i++) {
            if (!locs[i].ptr)
                return JOB_PUT;
            kvh_fill(locs[i].ptr, BLOCK, keys[at + i], j->seed);
        }
        if (kvnode_put_commit(c, lease) != 0)
            return JOB_PUT;
    }
    return JOB_OK;
}

/* All n keys matched and read back byte-exact, copied and in place, in
 * whichever tier each is. */
static int read_many(const struct job *j, kvnode_client *c)
{
    static kvnode_key keys[MAXK];
    size_t got = 0;
    if (j->n > MAXK)
        return JOB_MATCH;
    kvh_chain(keys, j->n, j->chain);
    long m = kvh_match(c, keys, j->n);
    if (m != (long)j->n) {
        fprintf(stderr, "match: %ld of %zu\n", m, j->n);
        return JOB_MATCH;
    }
    for (size_t at = 0; at < j->n; at += PUT_AT) {
        size_t k = j->n - at < PUT_AT ? j->n - at : PUT_AT;
        if (kvh_get_verify(c, keys + at, k, j->seed, 0, &got) != 0 || got != k ||
            kvh_get_zc_verify(c, keys + at, k, j->seed, &got) != 0 || got != k) {
            fprintf(stderr, "read back at %zu: got %zu of %zu: %s\n", at, got, k, kvh_error());
            return JOB_VERIFY;
        }
    }
    return JOB_OK;
}

/* beta on alpha's device with alpha's layout: alpha's HBM blocks are in no
 * arena it was lent (its host arena and its device region: 16 + 4 MiB),
 * alpha's keys match nothing in any tier, deleting them deletes nothing. */
static int hbm_neighbour_probe(const struct job *j, kvnode_client *c)
{
    kvnode_key keys[NA];
    kvnode_tiers t;
    uint64_t scanned;
    size_t deleted = 99, found = scan_for(j, &scanned);

    if (found > 0 || scanned < (20u << 20)) {
        fprintf(stderr, "beta found %zu of alpha's %zu blocks in %" PRIu64 " mapped bytes\n", found, j->n,
                scanned);
        return found > 0 ? JOB_SCAN_FOUND : JOB_SCAN_EMPTY;
    }
    kvh_chain(keys, j->n, CHAIN_A);
    memset(&t, 0xff, sizeof t);
    if (kvnode_match_tiers(c, keys, j->n, &t) != 0 || t.matched != 0 || t.hbm != 0 || t.host != 0 ||
        t.store != 0) {
        fprintf(stderr, "beta matched %zu of alpha's keys (hbm %zu, host %zu, store %zu)\n", t.matched, t.hbm,
                t.host, t.store);
        return JOB_MATCH;
    }
    if (kvnode_delete(c, keys, j->n, &deleted) != 0 || deleted != 0) {
        fprintf(stderr, "beta deleted %zu of alpha's keys\n", deleted);
        return JOB_DELETE;
    }
    return JOB_OK;
}

/* Stats once the demotions are over: no batch pending, no byte moving, and
 * the demotion counters the same in two reads 30 ms apart (10 s bound). */
static json_t *demotion_settled(const kvh_daemon *d)
{
    uint64_t deadline = kvh_now_ms() + 10000;
    long long prev = -1;
    for (;;) {
        json_t *st = kvh_stats(d), *h;
        ck_assert_msg(st != NULL, "%s", kvh_error());
        long long pending = kvh_json_int(st, "demotions.batches_pending"), moving = 0;
        size_t i;
        json_array_foreach(kvh_json_get(st, "tiers.hbm"), i, h)
            moving += kvh_json_int(h, "moving_bytes");
        long long sig = kvh_json_int(st, "demotions.blocks_total") + kvh_json_int(st, "demotions.batches_total") +
                        kvh_json_int(st, "demotions.dropped_total") + kvh_json_int(st, "demotions.aborted_total");
        bool idle = pending == 0 && moving == 0;
        if (idle && sig == prev)
            return st;
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "demotion did not settle within 10 s (%lld batches pending, "
                      "%lld bytes moving)", pending, moving);
        prev = idle ? sig : -1;
        kvh_sleep_ms(30);
    }
}

/* One tenant's figures, as /stats has them. */
struct tenant_fig {
    long long hbm_used, host_used, blocks, evictions;
};

static struct tenant_fig tenant_figs(json_t *st, const char *name)
{
    json_t *t = tenants_line(st, name);
    return (struct tenant_fig){ kvh_json_int(t, "hbm_used_bytes"), kvh_json_int(t, "host_used_bytes"),
                                kvh_json_int(t, "blocks"), kvh_json_int(t, "evictions_total") };
}

/* What a job as uid leaves once demotion settled: both tenants' figures and
 * the node's demotion counters. */
struct settled {
    struct tenant_fig alpha, beta;
    long long demoted, fallbacks;
};

static struct settled settled_after(uid_t uid, const struct job *j)
{
    ck_assert_int_eq(run_as(uid, j), JOB_OK);
    json_t *st = demotion_settled(j->d);
    struct settled s = { tenant_figs(st, "alpha"), tenant_figs(st, "beta"),
                         kvh_json_int(st, "demotions.blocks_total"),
                         kvh_json_int(st, "demotions.hbm_fallbacks_total") };
    json_decref(st);
    return s;
}

/* The hostile neighbour on device arenas, then each tenant's pressure: beta
 * finds, matches and deletes nothing of alpha's HBM blocks; beta overfills
 * its HBM (demotion into its host arena) and its host arena (eviction):
 * alpha's blocks stay in HBM, none demoted or evicted, byte-exact; then
 * alpha overfills its own HBM: its blocks go to its own host arena, beta's
 * figures do not move. */
START_TEST(hbm_pressure_demotes_and_evicts_in_its_own_tenant)
{
    TENANTS_NEEDS_ROOT("tenants: the HBM pressure test");
    const size_t na = 32, na2 = 48, nb = 512;
    kvh_daemon d;
    tenants_start(&d, HBM_CONF);
    struct job probe_b = { &d, hbm_neighbour_probe, na, 0, 0, 1 };
    struct job fill_b = { &d, put_hbm_many, nb, CHAIN_B, SEED_B, 1 };
    struct job put_a2 = { &d, put_hbm_many, na2, CHAIN_A2, SEED_A, 1 };
    struct job read_a1 = { &d, read_many, na, CHAIN_A, SEED_A, 1 };
    struct job read_a2 = { &d, read_many, na2, CHAIN_A2, SEED_A, 1 };

    struct job read_a = alpha_puts(&d, put_hbm, read_hbm, na, 1);
    json_t *st = demotion_settled(&d);
    struct tenant_fig a0 = tenant_figs(st, "alpha");
    ck_assert_int_eq(a0.hbm_used, (long long)na * BLOCK);
    ck_assert_int_eq(a0.host_used, 0);
    ck_assert_int_eq(a0.blocks, na);
    ck_assert_int_eq(kvh_json_int(st, "demotions.blocks_total"), 0);
    json_decref(st);

    /* beta: scan, match, delete: nothing of alpha's. */
    ck_assert_int_eq(run_as(BETA, &probe_b), JOB_OK);
    ck_assert_int_eq(run_as(ALPHA, &read_a), JOB_OK);

    /* beta puts 512 blocks into its 64-block arena and 256-block host arena. */
    struct settled s1 = settled_after(BETA, &fill_b);
    struct tenant_fig a1 = s1.alpha, b1 = s1.beta;
    long long demoted1 = s1.demoted, fallbacks1 = s1.fallbacks;
    ck_assert_msg(demoted1 > 0, "beta's 512 HBM puts demoted nothing");
    ck_assert_msg(b1.evictions >= (long long)(nb - HOST_BLOCKS - ARENA_BLOCKS),
                  "beta evicted %lld blocks; %zu do not fit its %u + %u", b1.evictions, nb, HOST_BLOCKS,
                  ARENA_BLOCKS);
    ck_assert_int_le(b1.hbm_used, (long long)(0.9 * (4 << 20)));
    ck_assert_int_gt(b1.hbm_used, 0);
    ck_assert_int_le(b1.host_used, 16 << 20);
    ck_assert_int_eq(b1.blocks, (long long)nb - b1.evictions);
    /* alpha: not a block moved, evicted or lost. */
    ck_assert_int_eq(a1.hbm_used, a0.hbm_used);
    ck_assert_int_eq(a1.host_used, 0);
    ck_assert_int_eq(a1.blocks, na);
    ck_assert_int_eq(a1.evictions, 0);
    ck_assert_int_eq(run_as(ALPHA, &read_a), JOB_OK);

    /* alpha puts 48 more: 80 blocks in a 64-block arena, demoted into
     * alpha's own host arena. */
    struct settled s2 = settled_after(ALPHA, &put_a2);
    struct tenant_fig a2 = s2.alpha, b2 = s2.beta;
    long long demoted2 = s2.demoted, fallbacks2 = s2.fallbacks;
    ck_assert_msg(demoted2 > demoted1, "alpha's arena of %zu blocks demoted nothing", na + na2);
    ck_assert_int_gt(a2.host_used, 0);
    ck_assert_int_le(a2.hbm_used, (long long)(0.9 * (4 << 20)));
    ck_assert_int_eq(a2.hbm_used + a2.host_used, (long long)(na + na2) * BLOCK);
    /* every block in alpha's host arena came there by alpha's demotion or fallback */
    ck_assert_int_eq((demoted2 - demoted1) + (fallbacks2 - fallbacks1), a2.host_used / BLOCK);
    ck_assert_int_eq(a2.blocks, (long long)(na + na2));
    ck_assert_int_eq(a2.evictions, 0);
    /* beta: not a byte more or less. */
    ck_assert_int_eq(b2.hbm_used, b1.hbm_used);
    ck_assert_int_eq(b2.host_used, b1.host_used);
    ck_assert_int_eq(b2.blocks, b1.blocks);
    ck_assert_int_eq(b2.evictions, b1.evictions);
    ck_assert_int_eq(run_as(ALPHA, &read_a1), JOB_OK);
    ck_assert_int_eq(run_as(ALPHA, &read_a2), JOB_OK);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* Both tenants put the same keys of the same layout into their HBM (other
 * bytes); write_through takes them from HBM to each tenant's file store.
 * After a restart (memory empty) each tenant's recovery finds its own
 * blocks only, and each tenant reads back its own bytes, never the other's. */
START_TEST(restart_brings_hbm_blocks_back_to_their_tenant)
{
    TENANTS_NEEDS_ROOT("tenants: the HBM restart test");
    char store[PATH_MAX], conf[PATH_MAX + 512];
    ck_assert_int_eq(kvh_mkdtemp(store, sizeof store), 0);
    snprintf(conf, sizeof conf, HBM_CONF "persist.backend=file\npersist.path=%s\npersist.policy=write_through\n",
             store);
    const size_t n = 48;
    kvh_daemon d;
    tenants_start(&d, conf);
    run_in_both(&d, put_hbm_many, n, 1);
    ck_assert_int_eq(kvh_wait_stat(&d, "persist.written_blocks_total", 2 * (long long)n, 10000, NULL), 0);
    /* They were written from HBM: every one of them is still there. */
    ck_assert_int_eq(tenants_stat(&d, "alpha", "hbm_used_bytes"), (long long)n * BLOCK);
    ck_assert_int_eq(tenants_stat(&d, "beta", "hbm_used_bytes"), (long long)n * BLOCK);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "host_used_bytes"), 0);
    ck_assert_int_eq(KVH_STAT(&d, "demotions.hbm_puts_total"), 2 * (long long)n);
    KVH_STOP_DESTROY(&d);

    tenants_start(&d, conf);
    expect_recovered(&d, (long long)n);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "blocks"), 0);
    run_in_both(&d, read_many, n, 1);
    ck_assert_int_eq(KVH_STAT(&d, "persist.promotions_ok_total"), 2 * (long long)n);
    ck_assert_int_eq(KVH_STAT(&d, "persist.promotions_failed_total"), 0);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "blocks"), n);
    ck_assert_int_eq(tenants_stat(&d, "beta", "blocks"), n);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "store_blocks"), 0);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        hostile_neighbour_finds_and_touches_nothing,
        quota_isolation_keeps_alphas_hit_rate,
        restart_brings_each_tenants_blocks_back_to_it,
        outsiders_see_tenants_not_models,
        default_without_memory_refuses_at_hello,
        tenant_max_clients_holds,
        hbm_regions_are_the_tenants_own,
        hbm_pressure_demotes_and_evicts_in_its_own_tenant,
        restart_brings_hbm_blocks_back_to_their_tenant,
    };
    return kvh_run_suite("daemon_tenants", "tenants", 120, tests, sizeof tests / sizeof tests[0]);
}
