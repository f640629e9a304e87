/* Integration tests of the KVS front end's data plane (issue 30, item 5 of
 * "What was seen"): the vineyard-style fd handshake on [kvs_server]
 * socket_path must not be lockable by one user. A uid that admission
 * ([server] allow_uids) refuses is closed at accept and holds no slot; a
 * tenant holds at most its share of the connections (its max_clients, sized
 * like its memory); a connection that has not completed the handshake within
 * server.hello_timeout is closed. Scaled down: server.max_clients = 8.
 *
 * Acting as other uids needs root (tenants_util.h); every wait is bounded
 * and no assertion is on a duration. */
#include <check.h>

#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "tenants_util.h"

#define MAX_CLIENTS  8
#define ALPHA_UID    65534     /* tenant alpha: 16 of 64 MiB, so 2 of the 8 connections */
#define BETA_UID     65532     /* tenant beta: the same share */
#define MALLORY_UID  65533     /* not in [server] allow_uids */
#define WAIT_MS      10000

typedef struct dp_env {
    kvh_daemon d;
    char dir[PATH_MAX];
    char sock[PATH_MAX + 16];
    char url[PATH_MAX + 16];
} dp_env;

static dp_env *cur;   /* the running test's daemon, for the children */

/* A daemon with the KVS front end, two tenants and an allow list that
 * leaves MALLORY_UID out; extra: more assignments (may be ""). */
static void env_start(dp_env *e, const char *extra)
{
    char conf[PATH_MAX * 2 + 1024];
    memset(e, 0, sizeof *e);
    ck_assert_msg(kvh_mkdtemp(e->dir, sizeof e->dir) == 0, "%s", kvh_error());
    snprintf(e->sock, sizeof e->sock, "%s/kvs.sock", e->dir);
    snprintf(conf, sizeof conf,
             "kvs_server.enabled=on\nkvs_server.listen=127.0.0.1:0\nkvs_server.socket_path=%s\n"
             "server.max_clients=%d\nmemory.host_bytes=64MiB\nmemory.slab_bytes=1MiB\n"
             "server.allow_uids=%d,%d\ntenant.alpha.uids=%d\ntenant.alpha.host_bytes=16MiB\n"
             "tenant.beta.uids=%d\ntenant.beta.host_bytes=16MiB\n%s",
             e->sock, MAX_CLIENTS, ALPHA_UID, BETA_UID, ALPHA_UID, BETA_UID, extra);
    KVH_START(&e->d, conf);
    tenants_open_dirs(&e->d);
    ck_assert_int_eq(chmod(e->dir, 0755), 0);
    ck_assert_int_eq(chmod(e->sock, 0666), 0);
    json_t *st = kvh_stats(&e->d);
    ck_assert_ptr_nonnull(st);
    const char *addr = json_string_value(kvh_json_get(st, "kvs_server.http_address"));
    ck_assert_ptr_nonnull(addr);
    snprintf(e->url, sizeof e->url, "http://%s", addr);
    json_decref(st);
    cur = e;
}

static long long dp_stat(dp_env *e, const char *path)
{
    char full[128];
    snprintf(full, sizeof full, "kvs_server.%s", path);
    return kvh_stat(&e->d, full);
}

/* Until the daemon has taken n more connections off its listener than
 * before (accepted or refused), at most WAIT_MS. */
static void wait_taken(dp_env *e, long long before, long long n)
{
    long long got = 0;
    for (uint64_t end = kvh_now_ms() + WAIT_MS; kvh_now_ms() < end; kvh_sleep_ms(10)) {
        got = dp_stat(e, "dataplane_accepted_total") + dp_stat(e, "dataplane_refused_total") - before;
        if (got >= n)
            return;
    }
    ck_abort_msg("the daemon took %lld of %lld data-plane connections within %d ms", got, n, WAIT_MS);
}

static long long taken_now(dp_env *e)
{
    return dp_stat(e, "dataplane_accepted_total") + dp_stat(e, "dataplane_refused_total");
}

/* The full handshake (register, fd, mapping) as rtp-llm's client does it;
 * the arena's size, or 0 when it failed (why set). */
static uint64_t handshake(kvsc *c, char *why, size_t whylen)
{
    if (kvsc_open(c, cur->url, cur->sock, why, whylen) != 0) {
        kvsc_close(c);
        return 0;
    }
    return c->size;
}

/* ---- a child holding connections as another uid ------------------------------------- */

/* What a holder does: `handshakes` full handshakes (kept open), then `idle`
 * connections that send nothing; it reports how many handshakes succeeded
 * on `ready` and keeps everything open until it reads from `release`. */
struct holder {
    int handshakes, idle;
    int ready[2], release[2];
    pid_t pid;
};

static int holder_main(void *arg)
{
    struct holder *h = arg;
    kvsc conns[MAX_CLIENTS * 2];
    int fds[MAX_CLIENTS * 2];
    char why[256];
    unsigned char ok = 0;

    close(h->ready[0]);
    close(h->release[1]);
    for (int i = 0; i < h->handshakes; i++)
        if (handshake(&conns[ok], why, sizeof why) > 0)
            ok++;
    for (int i = 0; i < h->idle; i++)
        fds[i] = kvh_raw_connect(cur->sock);
    if (write(h->ready[1], &ok, 1) != 1)
        return 2;
    char byte;
    if (read(h->release[0], &byte, 1) < 0)   /* a byte, or EOF when the test is gone */
        return 3;
    for (int i = 0; i < ok; i++)
        kvsc_close(&conns[i]);
    for (int i = 0; i < h->idle; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return 0;
}

/* Start a holder as uid and wait for its report: how many of its
 * handshakes succeeded. */
static int holder_start(struct holder *h, uid_t uid, int handshakes, int idle)
{
    ck_assert_int_le(handshakes, MAX_CLIENTS * 2);
    ck_assert_int_le(idle, MAX_CLIENTS * 2);
    h->handshakes = handshakes;
    h->idle = idle;
    ck_assert_int_eq(pipe(h->ready), 0);
    ck_assert_int_eq(pipe(h->release), 0);
    h->pid = tenants_spawn_as(holder_main, h, uid, uid, NULL, 0);
    close(h->ready[1]);
    close(h->release[0]);
    struct pollfd p = { .fd = h->ready[0], .events = POLLIN };
    unsigned char ok = 0;
    ssize_t n = poll(&p, 1, 3 * WAIT_MS) == 1 ? read(h->ready[0], &ok, 1) : -1;
    close(h->ready[0]);
    ck_assert_msg(n == 1, "holder uid %d did not report", (int)uid);
    return ok;
}

/* Let the holder close everything and exit (a byte: later holders hold
 * copies of this pipe's write end); its exit status must be 0. */
static void holder_stop(struct holder *h)
{
    ck_assert_int_eq(write(h->release[1], "x", 1), 1);
    close(h->release[1]);
    int st = proc_wait(&h->pid, WAIT_MS);
    ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "holder: status %d", st);
}

/* As BETA_UID: one handshake; exit 0 when it mapped beta's 16 MiB arena. */
static int beta_handshake(void *arg)
{
    kvsc c;
    char why[256];
    (void)arg;
    uint64_t size = handshake(&c, why, sizeof why);
    if (size == 0)
        fprintf(stderr, "beta_handshake: %s\n", why);
    kvsc_close(&c);
    return size == (16u << 20) ? 0 : 1;
}

/* As MALLORY_UID: the daemon answers one "refused" frame naming the allow
 * list, then closes; exit 0 when it did. */
static int mallory_is_told_why(void *arg)
{
    (void)arg;
    int fd = kvh_raw_connect(cur->sock);
    if (fd < 0)
        return 1;
    json_t *j = kvsc_recv_frame(fd);
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *msg = json_string_value(json_object_get(j, "message"));
    int rc = type && strcmp(type, "refused") == 0 && msg && strstr(msg, "allow_uids") ? 0 : 2;
    if (rc)
        fprintf(stderr, "mallory_is_told_why: type %s message %s\n", type ? type : "-", msg ? msg : "-");
    json_decref(j);
    if (!rc && kvh_raw_wait_eof(fd, WAIT_MS) != 0)
        rc = 3;
    close(fd);
    return rc;
}

/* ---- tests --------------------------------------------------------------------------- */

/* 12 idle connections from a refused uid and 8 from tenant alpha: root's
 * (tenant default) and beta's handshakes still succeed. */
START_TEST(refused_uid_and_idle_tenant_cannot_fill_the_data_plane)
{
    TENANTS_NEEDS_ROOT("kvs_dataplane: refused_uid_and_idle_tenant_cannot_fill_the_data_plane");
    dp_env e;
    struct holder mallory, alpha;
    kvsc c;
    char why[256];

    env_start(&e, "");
    long long before = taken_now(&e);
    holder_start(&mallory, MALLORY_UID, 0, MAX_CLIENTS + 4);
    wait_taken(&e, before, MAX_CLIENTS + 4);
    before = taken_now(&e);
    holder_start(&alpha, ALPHA_UID, 0, MAX_CLIENTS);
    wait_taken(&e, before, MAX_CLIENTS);

    ck_assert_msg(handshake(&c, why, sizeof why) == (32u << 20), "root's handshake: %s", why);
    ck_assert_int_eq(tenants_run_as(beta_handshake, NULL, BETA_UID, BETA_UID, NULL, 0), 0);
    /* The refused uid held no slot; alpha holds its share (2) of idle ones. */
    ck_assert_int_eq(dp_stat(&e, "dataplane_denied_total"), MAX_CLIENTS + 4);
    ck_assert_int_eq(dp_stat(&e, "dataplane_tenant_limit_total"), MAX_CLIENTS - 2);
    ck_assert_int_eq(tenants_stat(&e.d, "alpha", "max_clients"), 2);
    ck_assert_int_eq(tenants_run_as(mallory_is_told_why, NULL, MALLORY_UID, MALLORY_UID, NULL, 0), 0);
    ck_assert_int_eq(dp_stat(&e, "dataplane_denied_total"), MAX_CLIENTS + 5);
    kvsc_close(&c);
    holder_stop(&mallory);
    holder_stop(&alpha);
    /* Every slot comes back when its holder goes. */
    ck_assert_int_eq(kvh_wait_stat(&e.d, "kvs_server.dataplane_open", 0, WAIT_MS, NULL), 0);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* Tenant alpha completes as many handshakes as there are slots and keeps
 * them: it gets its share, and root's and beta's handshakes still succeed. */
START_TEST(tenant_at_its_share_never_refuses_another)
{
    TENANTS_NEEDS_ROOT("kvs_dataplane: tenant_at_its_share_never_refuses_another");
    dp_env e;
    struct holder alpha;
    kvsc c;
    char why[256];

    env_start(&e, "");
    long long before = taken_now(&e);
    int got = holder_start(&alpha, ALPHA_UID, MAX_CLIENTS, MAX_CLIENTS);
    wait_taken(&e, before, 2 * MAX_CLIENTS);
    ck_assert_msg(handshake(&c, why, sizeof why) == (32u << 20), "root's handshake: %s", why);
    ck_assert_int_eq(tenants_run_as(beta_handshake, NULL, BETA_UID, BETA_UID, NULL, 0), 0);
    ck_assert_int_eq(got, 2);
    ck_assert_int_eq(tenants_stat(&e.d, "alpha", "max_clients"), 2);
    ck_assert_int_eq(dp_stat(&e, "dataplane_tenant_limit_total"), 2 * MAX_CLIENTS - 2);
    ck_assert_int_eq(dp_stat(&e, "dataplane_denied_total"), 0);
    kvsc_close(&c);
    holder_stop(&alpha);
    ck_assert_int_eq(kvh_wait_stat(&e.d, "kvs_server.dataplane_open", 0, WAIT_MS, NULL), 0);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* Connections that do not complete the handshake within server.hello_timeout
 * are closed (nothing sent, half a header, register only); one that was
 * lent its fd first stays open and keeps its slot. */
START_TEST(unfinished_handshakes_are_closed_at_the_deadline)
{
    dp_env e;
    kvsc done;
    char why[256];

    env_start(&e, "server.hello_timeout=200ms\n");
    ck_assert_msg(handshake(&done, why, sizeof why) == (32u << 20), "handshake: %s", why);
    int silent = kvh_raw_connect(e.sock);
    int half = kvh_raw_connect(e.sock);
    int reg = kvh_raw_connect(e.sock);
    ck_assert(silent >= 0 && half >= 0 && reg >= 0);
    ck_assert_int_eq(kvh_raw_send(half, "\x40\0\0\0", 4), 0);
    ck_assert_int_eq(kvsc_send_frame(reg, "{\"type\":\"register_request\"}"), 0);
    json_t *j = kvsc_recv_frame(reg);
    ck_assert_ptr_nonnull(j);
    json_decref(j);
    ck_assert_int_eq(kvh_raw_wait_eof(silent, WAIT_MS), 0);
    ck_assert_int_eq(kvh_raw_wait_eof(half, WAIT_MS), 0);
    ck_assert_int_eq(kvh_raw_wait_eof(reg, WAIT_MS), 0);
    ck_assert_int_eq(kvh_wait_stat(&e.d, "kvs_server.dataplane_timed_out_total", 3, WAIT_MS, NULL), 0);
    /* The first connection, older than all three, is still served. */
    ck_assert_int_eq(dp_stat(&e, "dataplane_open"), 1);
    ck_assert_int_eq(kvsc_send_frame(done.fd, "{\"type\":\"register_request\"}"), 0);
    j = kvsc_recv_frame(done.fd);
    ck_assert_ptr_nonnull(j);
    json_decref(j);
    close(silent);
    close(half);
    close(reg);
    kvsc_close(&done);
    ck_assert_int_eq(kvh_wait_stat(&e.d, "kvs_server.dataplane_open", 0, WAIT_MS, NULL), 0);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static Suite *kvs_dataplane_suite(void)
{
    Suite *s = suite_create("kvs_dataplane");
    TCase *tc = tcase_create("kvs_dataplane");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, refused_uid_and_idle_tenant_cannot_fill_the_data_plane);
    tcase_add_test(tc, tenant_at_its_share_never_refuses_another);
    tcase_add_test(tc, unfinished_handshakes_are_closed_at_the_deadline);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_dataplane_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
