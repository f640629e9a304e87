/* Tenants (issue 15) and what changes them, against a real daemon:
 *
 * - reload: a uid moved from alpha to beta; the connection it made before
 *   stays in alpha (its namespace, its blocks, alpha's arena), a new one
 *   lands in beta (beta's arena, beta's deployment id, nothing of alpha's
 *   in it); beta's max_clients lowered from 2 to 1 refuses the next
 *   connection naming [tenant.beta] max_clients; alpha's max_namespaces
 *   raised from 1 to 2 lets a second layout bind; a changed host_bytes is
 *   reported as not applied and changes nothing;
 * - a client's tenant follows the groups admission checks: its primary and
 *   its supplementary groups (SO_PEERGROUPS), a listed uid first;
 * - what outsiders see: with tenants, the admin /stats and /metrics carry no
 *   model name or deployment id anywhere, not even in the error texts of
 *   KVCM (kvcm.last_error names the instance) and of the store
 *   (persist.last_error names the deployment's directory); root's STATS over
 *   the socket still has them.
 *
 * The first two act as other users and need root (tenants_util.h); the third
 * runs as anyone. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tenants_util.h"
#include "../common/kvh_http.h"
#include "../sim/kvcmctl.h"

#define MOVER   65534                /* in alpha, then moved to beta */
#define BETA    65533
#define ALPHA2  65532                /* stays in alpha */
#define BLOCK   (64u << 10)
#define MODEL   "shared-model-7b"

/* alpha 16 MiB, beta 8 MiB, default what is left (24 MiB): a client's arena
 * size says whose it is. */
#define BASE_CONF \
    "server.socket_mode=0666\n" \
    "memory.host_bytes=48MiB\n" \
    "memory.slab_bytes=1MiB\n" \
    "tenant.alpha.host_bytes=16MiB\n" \
    "tenant.beta.host_bytes=8MiB\n"
#define BEFORE_CONF BASE_CONF \
    "tenant.alpha.uids=65534 65532\n" \
    "tenant.alpha.max_namespaces=1\n" \
    "tenant.beta.uids=65533\n" \
    "tenant.beta.max_clients=2\n"
#define AFTER_CONF BASE_CONF \
    "tenant.alpha.uids=65532\n" \
    "tenant.alpha.max_namespaces=2\n" \
    "tenant.beta.uids=65533 65534\n" \
    "tenant.beta.max_clients=1\n"

static kvnode_layout layout_of(const char *model)
{
    return kvh_layout(model, BLOCK, 1, 0);
}

/* --- in the children ------------------------------------------------------------ */

/* The size of the mapping holding p (/proc/self/maps), 0 when none does. */
static uint64_t mapping_size(const void *p, uintptr_t *lo_out)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uint64_t size = 0;
    while (f && fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi) {
            size = hi - lo;
            if (lo_out)
                *lo_out = lo;
            break;
        }
    }
    if (f)
        fclose(f);
    return size;
}

/* Put n blocks of chain in place (host tier); *arena = the size of the
 * mapping they were written into, *base its start. 0 or -1. */
static int put_in_place(kvnode_client *c, uint64_t chain, size_t n, uint64_t seed, uint64_t *arena,
                        uintptr_t *base)
{
    kvnode_key keys[16];
    kvnode_loc locs[16];
    kvnode_lease lease;
    kvh_chain(keys, n, chain);
    if (kvnode_put_begin(c, keys, n, KVNODE_TIER_HOST, &lease, locs) != 0) {
        fprintf(stderr, "put_begin: %s\n", kvnode_last_error(c));
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        kvh_fill(locs[i].ptr, BLOCK, keys[i], seed);
    *arena = mapping_size(locs[0].ptr, base);
    return kvnode_put_commit(c, lease) == 0 ? 0 : -1;
}

/* The one namespace a non-root client's STATS shows: its tenant and
 * deployment id copied out. 0, or -1 when it shows another count. */
static int own_namespace(kvnode_client *c, char *tenant, char *deployment, size_t len)
{
    json_t *st = kvh_stats_client(c);
    json_t *nss = st ? kvh_json_get(st, "namespaces") : NULL;
    int rc = -1;
    if (nss && json_array_size(nss) == 1) {
        json_t *ns = json_array_get(nss, 0);
        snprintf(tenant, len, "%s", json_string_value(json_object_get(ns, "tenant")));
        snprintf(deployment, len, "%s", json_string_value(json_object_get(ns, "deployment_id")));
        rc = 0;
    } else {
        fprintf(stderr, "STATS shows %zu namespaces\n", nss ? json_array_size(nss) : 0);
    }
    json_decref(st);
    return rc;
}

/* A connection refused with code, its message holding want. */
static int refused_with(const char *sock, const kvnode_layout *l, int code, const char *want)
{
    kvnode_client *c;
    int rc = kvnode_connect(sock, l, &c);
    if (rc == 0) {
        kvnode_close(c);
        fprintf(stderr, "uid %d: connected, expected %s\n", (int)getuid(), want);
        return -1;
    }
    if (rc != code || !strstr(kvnode_connect_error(), want)) {
        fprintf(stderr, "uid %d: %d (%s), expected %d naming \"%s\"\n", (int)getuid(), rc, kvnode_connect_error(),
                code, want);
        return -1;
    }
    return 0;
}

/* The mover: connects before the reload (alpha) and after it (beta), and
 * keeps both; the parent reloads and checks figures between the steps. */
struct mover {
    const kvh_daemon *d;
    int report;                       /* write end: 'A' after step 1, 'B' after step 2 */
    int go;                           /* read end: the parent's go for the next step */
};

enum { M_OK = 0, M_CONNECT = 10, M_PUT, M_ARENA, M_STATS, M_PIPE, M_SEES_ALPHA, M_FOUND_ALPHA, M_READ_BACK,
       M_NOT_REFUSED };

static bool mover_wait(const struct mover *m)
{
    char b;
    return read(m->go, &b, 1) == 1;
}

/* Blocks of alpha (chain 1, seed 0xA) found in [lo, lo + size). */
static size_t scan_alpha(uintptr_t lo, uint64_t size)
{
    uint8_t want[BLOCK];
    kvnode_key keys[16];
    size_t found = 0;
    kvh_chain(keys, 16, 1);
    for (size_t k = 0; k < 16; k++) {
        kvh_fill(want, BLOCK, keys[k], 0xA);
        if (memmem((const void *)lo, size, want, 256))
            found++;
    }
    return found;
}

static int mover_main(void *arg)
{
    const struct mover *m = arg;
    kvnode_layout l = layout_of(MODEL);
    kvnode_client *c1, *c2;
    char t1[64], d1[128], t2[64], d2[128];
    uint64_t arena1, arena2;
    uintptr_t base1, base2;
    kvnode_key keys[16];
    size_t got = 0;

    /* Step 1, before the reload: alpha. */
    if (kvnode_connect(m->d->sock, &l, &c1) != 0)
        return M_CONNECT;
    if (put_in_place(c1, 1, 16, 0xA, &arena1, &base1) != 0)
        return M_PUT;
    if (arena1 != (16u << 20)) {
        fprintf(stderr, "before the reload: a %" PRIu64 "-byte arena, not alpha's 16 MiB\n", arena1);
        return M_ARENA;
    }
    if (own_namespace(c1, t1, d1, sizeof t1) != 0 || strcmp(t1, "alpha") != 0)
        return M_STATS;
    if (write(m->report, "A", 1) != 1 || !mover_wait(m))
        return M_PIPE;

    /* Step 2, after it: a new connection is beta's; the old one stays alpha's. */
    if (kvnode_connect(m->d->sock, &l, &c2) != 0) {
        fprintf(stderr, "after the reload: %s\n", kvnode_connect_error());
        return M_CONNECT;
    }
    if (put_in_place(c2, 2, 8, 0xB, &arena2, &base2) != 0)
        return M_PUT;
    if (arena2 != (8u << 20) || base2 == base1) {
        fprintf(stderr, "after the reload: a %" PRIu64 "-byte arena, not beta's 8 MiB\n", arena2);
        return M_ARENA;
    }
    if (own_namespace(c2, t2, d2, sizeof t2) != 0 || strcmp(t2, "beta") != 0 || strcmp(d1, d2) == 0) {
        fprintf(stderr, "after the reload: tenant %s, deployment %s (before: %s, %s)\n", t2, d2, t1, d1);
        return M_STATS;
    }
    kvh_chain(keys, 16, 1);
    if (kvh_match(c2, keys, 16) != 0)
        return M_SEES_ALPHA;
    size_t found = scan_alpha(base2, arena2);
    if (found > 0) {
        fprintf(stderr, "beta's arena holds %zu of alpha's blocks\n", found);
        return M_FOUND_ALPHA;
    }
    /* The first connection: still alpha's namespace and blocks. */
    if (own_namespace(c1, t1, d1, sizeof t1) != 0 || strcmp(t1, "alpha") != 0)
        return M_STATS;
    if (kvh_match(c1, keys, 16) != 16 || kvh_get_zc_verify(c1, keys, 16, 0xA, &got) != 0 || got != 16)
        return M_READ_BACK;
    if (put_in_place(c1, 3, 4, 0xA, &arena1, &base1) != 0 || arena1 != (16u << 20))
        return M_PUT;
    /* beta holds one connection now (c2): max_clients = 1 refuses the next. */
    if (refused_with(m->d->sock, &l, -KVNODE_ELIMIT, "[tenant.beta] max_clients = 1") != 0)
        return M_NOT_REFUSED;
    if (write(m->report, "B", 1) != 1 || !mover_wait(m))
        return M_PIPE;
    kvnode_close(c2);
    kvnode_close(c1);
    return M_OK;
}

/* Hold `ok` connections, then expect the next one refused naming `want`. */
struct hold {
    const kvh_daemon *d;
    int ok;
    const char *model;
    int code;                         /* 0: the last connection must be served */
    const char *want;
};

static int hold_main(void *arg)
{
    const struct hold *h = arg;
    kvnode_layout l = layout_of(h->model);
    kvnode_client *c[4] = { 0 };
    int rc = 0;
    for (int i = 0; i < h->ok && rc == 0; i++)
        if (kvnode_connect(h->d->sock, &l, &c[i]) != 0) {
            fprintf(stderr, "uid %d: connection %d: %s\n", (int)getuid(), i + 1, kvnode_connect_error());
            rc = 10;
        }
    if (rc == 0 && h->code && refused_with(h->d->sock, &l, h->code, h->want) != 0)
        rc = 11;
    for (int i = 0; i < 4; i++)
        if (c[i])
            kvnode_close(c[i]);
    return rc;
}

/* --- in the test ----------------------------------------------------------------- */

/* Wait (30 s) for the mover's report byte. */
static void expect_report(int fd, char want)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    char b = 0;
    ck_assert_msg(poll(&p, 1, 30000) == 1, "the mover did not report '%c' within 30 s", want);
    ck_assert_msg(read(fd, &b, 1) == 1 && b == want, "the mover reported '%c', not '%c' (it exited?)", b, want);
}

static void expect_clients(const kvh_daemon *d, long long alpha, long long beta)
{
    ck_assert_int_eq(tenants_stat(d, "alpha", "clients"), alpha);
    ck_assert_int_eq(tenants_stat(d, "beta", "clients"), beta);
}

static char *reload(const kvh_daemon *d, const char *conf)
{
    kvnode_client *c;
    char *not_applied = (char *)1;
    ck_assert_int_eq(kvh_rewrite_config((kvh_daemon *)d, conf), 0);
    KVH_CONNECT(d, NULL, &c);
    KVH_OK(c, kvnode_reload(c, &not_applied));
    kvnode_close(c);
    return not_applied;
}

START_TEST(reload_moves_a_uid_and_changes_limits)
{
    TENANTS_NEEDS_ROOT("tenants: the tenant reload test");
    kvh_daemon d;
    tenants_start(&d, BEFORE_CONF);
    int report[2], go[2];
    ck_assert_int_eq(pipe2(report, O_CLOEXEC), 0);
    ck_assert_int_eq(pipe2(go, O_CLOEXEC), 0);
    struct mover m = { &d, report[1], go[0] };
    pid_t mover = tenants_spawn_as(mover_main, &m, MOVER, MOVER, NULL, 0);
    close(report[1]);
    close(go[0]);

    /* Before: the mover in alpha; beta takes 2 connections, not 3; alpha's
     * one namespace is the mover's, a second layout is refused. */
    expect_report(report[0], 'A');
    expect_clients(&d, 1, 0);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "blocks"), 16);
    struct hold beta2 = { &d, 2, MODEL, -KVNODE_ELIMIT, "[tenant.beta] max_clients = 2" };
    ck_assert_int_eq(tenants_run_as(hold_main, &beta2, BETA, BETA, NULL, 0), 0);
    ck_assert_int_eq(tenants_stat(&d, "beta", "refused_total"), 1);
    struct hold other = { &d, 0, "other-model", -KVNODE_ELIMIT, "([tenant.alpha] max_namespaces)" };
    ck_assert_int_eq(tenants_run_as(hold_main, &other, ALPHA2, ALPHA2, NULL, 0), 0);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "namespaces_active"), 1);

    /* The reload: everything in it applies. */
    char *not_applied = reload(&d, AFTER_CONF);
    ck_assert_msg(not_applied == NULL, "not applied: %s", not_applied);
    expect_clients(&d, 1, 0);   /* the mover's connection stays in alpha */

    ck_assert_int_eq(write(go[1], "g", 1), 1);
    expect_report(report[0], 'B');
    expect_clients(&d, 1, 1);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "blocks"), 16 + 4);
    ck_assert_int_eq(tenants_stat(&d, "beta", "blocks"), 8);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "host_used_bytes"), 20 * BLOCK);
    ck_assert_int_eq(tenants_stat(&d, "beta", "host_used_bytes"), 8 * BLOCK);
    ck_assert_int_eq(tenants_stat(&d, "beta", "refused_total"), 2);   /* the mover's third */
    /* beta's own user is refused too: its one connection is the mover's. */
    struct hold beta0 = { &d, 0, MODEL, -KVNODE_ELIMIT, "[tenant.beta] max_clients = 1" };
    ck_assert_int_eq(tenants_run_as(hold_main, &beta0, BETA, BETA, NULL, 0), 0);
    ck_assert_int_eq(tenants_stat(&d, "beta", "refused_total"), 3);
    /* alpha's second namespace binds now. */
    struct hold other_ok = { &d, 1, "other-model", 0, NULL };
    ck_assert_int_eq(tenants_run_as(hold_main, &other_ok, ALPHA2, ALPHA2, NULL, 0), 0);
    ck_assert_int_eq(tenants_stat(&d, "alpha", "namespaces"), 2);

    ck_assert_int_eq(write(go[1], "g", 1), 1);
    int st = proc_wait(&mover, 30000);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == M_OK, "the mover: status %d", st);
    close(report[0]);
    close(go[1]);
    expect_clients(&d, 0, 0);

    /* A restart-only change: named, not applied, nothing changes. */
    json_t *before = kvh_stats(&d);
    ck_assert_ptr_nonnull(before);
    const char *after_conf = BASE_CONF "tenant.alpha.host_bytes=4MiB\n"
                                       "tenant.alpha.uids=65532\n"
                                       "tenant.alpha.max_namespaces=2\n"
                                       "tenant.beta.uids=65533 65534\n"
                                       "tenant.beta.max_clients=1\n";
    not_applied = reload(&d, after_conf);
    ck_assert_ptr_nonnull(not_applied);
    ck_assert_str_eq(not_applied, "tenant.alpha.host_bytes");
    free(not_applied);
    json_t *after = kvh_stats(&d);
    ck_assert_ptr_nonnull(after);
    static const char *const figures[] = { "host_capacity_bytes", "host_used_bytes", "blocks", "namespaces" };
    static const char *const names[] = { "default", "alpha", "beta" };
    for (size_t n = 0; n < 3; n++)
        for (size_t f = 0; f < 4; f++)
            ck_assert_msg(kvh_json_int(tenants_line(before, names[n]), figures[f]) ==
                          kvh_json_int(tenants_line(after, names[n]), figures[f]), "tenant %s: %s changed",
                          names[n], figures[f]);
    ck_assert_int_eq(kvh_json_int(tenants_line(after, "alpha"), "host_capacity_bytes"), 16 << 20);
    ck_assert_int_eq(kvh_json_int(after, "tiers.host.capacity_bytes"), 48 << 20);
    ck_assert_int_eq(kvh_json_int(after, "reloads.ok_total"), 2);
    json_decref(before);
    json_decref(after);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* --- groups ------------------------------------------------------------------------ */

#define GROUP_B 4711                 /* beta's group; admission's too */

/* Connect as this child is and report where it landed: 0 beta, 1 alpha,
 * 2 default, 3 refused by admission (EDENIED), else 10+. */
static int where_main(void *arg)
{
    const kvh_daemon *d = arg;
    kvnode_layout l = layout_of(MODEL);
    kvnode_client *c;
    char tenant[64], dep[128];
    int rc = kvnode_connect(d->sock, &l, &c);
    if (rc == -KVNODE_EDENIED)
        return 3;
    if (rc != 0) {
        fprintf(stderr, "uid %d: %s\n", (int)getuid(), kvnode_connect_error());
        return 10;
    }
    rc = own_namespace(c, tenant, dep, sizeof tenant) != 0 ? 11
         : strcmp(tenant, "beta") == 0 ? 0 : strcmp(tenant, "alpha") == 0 ? 1 : strcmp(tenant, "default") == 0 ? 2
         : 12;
    kvnode_close(c);
    return rc;
}

START_TEST(a_tenants_groups_are_the_groups_admission_checks)
{
    TENANTS_NEEDS_ROOT("tenants: the tenant groups test");
    kvh_daemon d;
    tenants_start(&d, BASE_CONF "server.allow_uids=65534\nserver.allow_gids=4711\n"
                                "tenant.alpha.uids=65534\ntenant.beta.gids=4711\n");
    const gid_t supplementary[] = { 4000, GROUP_B };

    /* In beta's group as a supplementary group: admitted by it, and beta's. */
    ck_assert_int_eq(tenants_run_as(where_main, &d, 4242, 4242, supplementary, 2), 0);
    /* ... as the primary group: the same. */
    ck_assert_int_eq(tenants_run_as(where_main, &d, 4243, GROUP_B, NULL, 0), 0);
    /* ... among many groups (more than the daemon's first buffer holds). */
    gid_t many[100];
    for (size_t i = 0; i < 99; i++)
        many[i] = (gid_t)(5000 + i);
    many[99] = GROUP_B;
    ck_assert_int_eq(tenants_run_as(where_main, &d, 4245, 4245, many, 100), 0);
    /* A listed uid wins over its groups. */
    ck_assert_int_eq(tenants_run_as(where_main, &d, MOVER, MOVER, supplementary, 2), 1);
    /* Neither: refused by admission, before any tenant is looked at. */
    ck_assert_int_eq(tenants_run_as(where_main, &d, 4244, 4244, supplementary, 1), 3);
    ck_assert_int_eq(tenants_stat(&d, "beta", "namespaces"), 1);
    ck_assert_int_eq(tenants_stat(&d, "default", "namespaces"), 0);
    ck_assert_int_eq(tenants_stat(&d, "beta", "clients"), 0);
    ck_assert_int_eq(KVH_STAT(&d, "clients.denied_total"), 1);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* --- what outsiders see ------------------------------------------------------------------ */

/* GET path from the admin listener at addr: the body (malloc'd). */
static char *admin_get(const char *addr, const char *path)
{
    char *text = NULL, ctype[64];
    ck_assert_int_eq(kvh_http_req(addr, NULL, path, &text, ctype, sizeof ctype), 200);
    return text;
}

/* The string at path of root's STATS, polled (10 s) until it holds want. */
static char *wait_text(const kvh_daemon *d, const char *path, const char *want)
{
    for (int i = 0; i < 1000; i++) {
        json_t *st = kvh_stats(d);
        const char *s = st ? json_string_value(kvh_json_get(st, path)) : NULL;
        char *out = s && strstr(s, want) ? strdup(s) : NULL;
        json_decref(st);
        if (out)
            return out;
        kvh_sleep_ms(10);
    }
    ck_abort_msg("root's STATS: %s never named %s", path, want);
    return NULL;
}

START_TEST(admin_pages_name_no_model_even_in_errors)
{
    struct kvcmctl sim;
    const char *const sim_args[] = { "--snapshot-interval-s", "0", "--fail-status", "INTERNAL_ERROR",
                                     "--fail-only", "registerInstance", NULL };
    kvcmctl_start(&sim, &(struct kvcmctl_opts){ .extra = sim_args, .valgrind = simctl_under_valgrind() });
    char store[PATH_MAX], addr[PATH_MAX + 16], conf[4 * PATH_MAX];
    ck_assert_int_eq(kvh_mkdtemp(store, sizeof store), 0);
    ck_assert_int_eq(kvh_mkdtemp(addr, sizeof addr), 0);
    snprintf(conf, sizeof conf, BASE_CONF "tenant.alpha.uids=65534\ntenant.beta.uids=65533\n"
             "admin.listen=unix:%s/admin.sock\npersist.backend=file\npersist.path=%s\n"
             "kvcm.enabled=on\nkvcm.endpoints=%s\nkvcm.host_ip_port=10.9.8.7:7000\n"
             "kvcm.retry_base=50ms\nkvcm.retry_max=200ms\n", addr, store, sim.base);
    memmove(addr + 5, addr, strlen(addr) + 1);
    memcpy(addr, "unix:", 5);
    strcat(addr, "/admin.sock");
    kvh_daemon d;
    KVH_START(&d, conf);

    /* Root's client is "default"'s: files of at most 32 KiB from now on
     * (a block record of 64 KiB does not fit), so the store's writes fail
     * naming its deployment; KVCM refuses its instance. (Set on the running
     * daemon: before exec the limit would also refuse its arenas' memfds.) */
    struct rlimit fsize;
    ck_assert_msg(prlimit(d.pid, RLIMIT_FSIZE, NULL, &fsize) == 0, "prlimit: %s", strerror(errno));
    fsize.rlim_cur = 32 << 10;
    ck_assert_msg(prlimit(d.pid, RLIMIT_FSIZE, &fsize, NULL) == 0, "prlimit: %s", strerror(errno));
    kvnode_layout l = layout_of(MODEL);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    json_t *st = kvh_stats(&d);
    const char *dep = json_string_value(kvh_json_get(st, "namespaces.0.deployment_id"));
    ck_assert_ptr_nonnull(dep);
    char deployment[128];
    snprintf(deployment, sizeof deployment, "%s", dep);
    json_decref(st);
    kvnode_key keys[4];
    kvh_chain(keys, 4, 7);
    KVH_OK(c, kvh_put(c, keys, 4, 1));

    /* Root sees both errors, and they name the deployment. */
    free(wait_text(&d, "kvcm.last_error", MODEL));
    free(wait_text(&d, "persist.last_error", deployment));

    /* The admin pages: neither the model nor the deployment id, anywhere. */
    static const char *const pages[] = { "/stats", "/metrics" };
    for (size_t i = 0; i < 2; i++) {
        char *text = admin_get(addr, pages[i]);
        const char *hit = strstr(text, MODEL);
        ck_assert_msg(!hit, "%s names %s: ...%.200s", pages[i], MODEL, hit - (hit - text > 100 ? 100 : hit - text));
        ck_assert_msg(!strstr(text, deployment), "%s names %s", pages[i], deployment);
        if (i == 0) {
            /* The error texts are there, hidden, and say where to look. */
            json_t *doc = json_loads(text, 0, NULL);
            ck_assert_ptr_nonnull(doc);
            /* Refused, it retries: each attempt is REGISTERING until it fails again. */
            const char *state = json_string_value(kvh_json_get(doc, "kvcm.state"));
            ck_assert_msg(state && (strcmp(state, "DEGRADED") == 0 || strcmp(state, "REGISTERING") == 0),
                          "kvcm.state %s", state ? state : "(none)");
            ck_assert_msg(strstr(json_string_value(kvh_json_get(doc, "kvcm.last_error")), "hidden"), "%s", text);
            ck_assert_msg(strstr(json_string_value(kvh_json_get(doc, "persist.last_error")), "hidden"), "%s",
                          text);
            json_decref(doc);
        }
        free(text);
    }
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
    kvcmctl_stop_ok(&sim);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        reload_moves_a_uid_and_changes_limits,
        a_tenants_groups_are_the_groups_admission_checks,
        admin_pages_name_no_model_even_in_errors,
    };
    return kvh_run_suite("daemon_tenants_reload", "tenants", 120, tests, sizeof tests / sizeof tests[0]);
}
