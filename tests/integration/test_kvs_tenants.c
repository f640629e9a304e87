/* Integration tests of the KVS front end under the tenant model (issue 30):
 * leases belong to their tenant and cannot be guessed, a TCP client's
 * identity is the one seen when its connection was accepted, and one
 * tenant holding all the leases it may never refuses another tenant's.
 *
 * Acting as another user: real child processes as uid 65534 (tenants_util.h)
 * where the client must stay alive; where the test must control exactly
 * when the client's socket closes relative to the daemon, the test process
 * (root) opens the socket with its fsuid set to 65534 (setfsuid: the kernel
 * records that uid as the socket's owner, which is what the daemon looks
 * up) and freezes the daemon (SIGSTOP) while the client sends and closes.
 *
 * Every wait is bounded; assertions are on statuses, counters and bytes. */
#include <check.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/fsuid.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"
#include "tenants_util.h"

#define DEP     "tenant-test-0123456789"
#define BLOCK   8192u
#define B_UID   65534      /* tenant b; root is tenant a ("default") */

static void okey(char *buf, size_t len, int64_t block)
{
    snprintf(buf, len, "rtp_llm/v1/" DEP "/tp-0/group-0/block-%" PRId64, block);
}

/* POST /acquire; the reply (status asserted 200) in *r. */
static void acquire_ok(const char *url, const char *scope, const char *const *keys, size_t n, kvsc_reply *r)
{
    char *body = kvsc_acquire_body(scope, keys, n, BLOCK, 60);
    ck_assert_ptr_nonnull(body);
    ck_assert_int_eq(kvsc_call(url, "acquire", body, r), 0);
    free(body);
    ck_assert_msg(r->status == 200, "acquire(%s) answered %ld", scope, r->status);
}

/* A lease call's status and error text (into err, "" when none). */
static long lease_call(const char *url, const char *route, const char *lease, char *err, size_t errlen)
{
    char body[192];
    kvsc_reply r;
    snprintf(body, sizeof body, "{\"lease_id\":\"%s\",\"request_id\":\"kvs_store_test\"}", lease);
    if (kvsc_call(url, route, body, &r) < 0)
        return -1;
    snprintf(err, errlen, "%s", json_string_value(json_object_get(r.body, "error")) ?: "");
    kvsc_reply_free(&r);
    return r.status;
}

static bool all_hex(const char *s)
{
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

/* ---- lease ids ------------------------------------------------------------------- */

/* Lease ids carry 128 random bits, rendered as 32 lower-case hex digits
 * (a string on the wire, as rtp-llm's client reads lease_id): no part of
 * one is shared with the next, as a counter's would be. */
START_TEST(lease_ids_are_128_random_bits)
{
    enum { N = 16 };
    kvs_env e;
    char names[N][128], ids[N][64], err[256];
    kvs_env_start(&e, "");
    for (int i = 0; i < N; i++) {
        const char *k[1] = { names[i] };
        kvsc_reply r;
        okey(names[i], sizeof names[i], 100 + i);
        acquire_ok(e.url, "create", k, 1, &r);
        snprintf(ids[i], sizeof ids[i], "%s", kvsc_lease_id(&r));
        kvsc_reply_free(&r);
        ck_assert_msg(strlen(ids[i]) == 32 && all_hex(ids[i]), "lease id '%s' is not 32 hex digits (128 bits)",
                      ids[i]);
    }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < i; j++) {
            ck_assert_msg(strncmp(ids[i], ids[j], 8) != 0 && strcmp(ids[i] + 24, ids[j] + 24) != 0,
                          "lease ids %s and %s share a part", ids[i], ids[j]);
        }
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(lease_call(e.url, "discard", ids[i], err, sizeof err), 204);
    ck_assert_int_eq(kvs_stat(&e, "leases_open"), 0);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- another tenant's lease ------------------------------------------------------------ */

struct foreign {
    const char *url;
    char lease[64];
};

/* As tenant b: seal, release and discard of a's lease answer exactly as for
 * a lease that never was (the same lease id with its last digit changed).
 * Exit 0 when they all did. */
static int foreign_lease_calls(void *arg)
{
    const struct foreign *f = arg;
    static const char *const routes[] = { "seal", "release", "discard" };
    char unknown[64], err_a[256], err_u[256];
    size_t n = strlen(f->lease);
    snprintf(unknown, sizeof unknown, "%s", f->lease);
    if (n)
        unknown[n - 1] = unknown[n - 1] == '0' ? '1' : '0';
    for (int i = 0; i < 3; i++) {
        long sa = lease_call(f->url, routes[i], f->lease, err_a, sizeof err_a);
        long su = lease_call(f->url, routes[i], unknown, err_u, sizeof err_u);
        if (sa != 404 || su != 404 || strcmp(err_a, err_u) != 0) {
            fprintf(stderr, "tenant b: /%s of a's lease answered %ld '%s'; of an unknown lease %ld '%s'\n",
                    routes[i], sa, err_a, su, err_u);
            return 10 + i;
        }
    }
    return 0;
}

/* A TCP connection to url from a socket the kernel records as uid's. */
static int connect_as(const char *url, uid_t uid, uint16_t *local_port)
{
    unsigned port = 0;
    ck_assert_msg(sscanf(url, "http://127.0.0.1:%u", &port) == 1, "url %s", url);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    setfsuid(uid);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setfsuid(0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct sockaddr_in me;
    socklen_t ml = sizeof me;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&me, &ml), 0);
    *local_port = ntohs(me.sin_port);
    return fd;
}

/* Wait until the client socket on local port `port` is closed and
 * orphaned (FIN_WAIT2 or TIME_WAIT in /proc/net/tcp): the kernel no longer
 * says who owned it. */
static void wait_orphaned(uint16_t port)
{
    uint64_t t0 = kvh_now_ms();
    for (;;) {
        char *tab = kvh_read_file("/proc/net/tcp", NULL), want[32];
        bool found = false;
        snprintf(want, sizeof want, ":%04X", port);
        for (char *line = tab ? strchr(tab, '\n') : NULL; line && !found; line = strchr(line + 1, '\n')) {
            char local[64], remote[64];
            unsigned st;
            size_t ll;
            if (sscanf(line + 1, "%*d: %63s %63s %x", local, remote, &st) == 3 && (ll = strlen(local)) > 5 &&
                strcmp(local + ll - 5, want) == 0 && (st == 5 || st == 6))
                found = true;
        }
        free(tab);
        if (found)
            return;
        ck_assert_msg(kvh_now_ms() - t0 < 10000, "client port %u never reached FIN_WAIT2", port);
        kvh_sleep_ms(5);
    }
}

static long long lease_calls_answered(kvs_env *e)
{
    return kvs_stat(e, "requests.seal_total") + kvs_stat(e, "requests.bad_total") +
           kvs_stat(e, "requests.denied_total");
}

/* Tenant b's /seal of lease, sent and its socket closed while the daemon is
 * frozen: after it was accepted (accepted = true) or before. Returns when
 * the daemon has answered it, asserting that it counted the answer under
 * requests.<counter> (bad_total: 404 as tenant b; denied_total: 403, no
 * owner). */
static void orphaned_seal(kvs_env *e, const char *lease, bool accepted, const char *counter)
{
    char req[512], body[128];
    uint16_t port;
    char path[64];
    snprintf(path, sizeof path, "requests.%s", counter);
    long long counted0 = kvs_stat(e, path);
    long long accepted0 = kvs_stat(e, "http_connections.accepted_total"), answered0 = lease_calls_answered(e);
    int n = snprintf(body, sizeof body, "{\"lease_id\":\"%s\",\"request_id\":\"kvs_store_x\"}", lease);
    int len = snprintf(req, sizeof req, "POST /seal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: %d\r\n\r\n%s", n, body);
    if (!accepted)
        ck_assert_int_eq(kill(e->d.pid, SIGSTOP), 0);
    int fd = connect_as(e->url, B_UID, &port);
    if (accepted) {
        long long last = -1;
        ck_assert_msg(kvh_wait_stat(&e->d, "kvs_server.http_connections.accepted_total", accepted0 + 1, 10000,
                                    &last) == 0, "the connection was not accepted (accepted %lld)", last);
        ck_assert_int_eq(kill(e->d.pid, SIGSTOP), 0);
    }
    ck_assert_int_eq(send(fd, req, (size_t)len, MSG_NOSIGNAL), len);
    close(fd);
    wait_orphaned(port);
    ck_assert_int_eq(kill(e->d.pid, SIGCONT), 0);
    uint64_t t0 = kvh_now_ms();
    while (lease_calls_answered(e) == answered0 && kvh_now_ms() - t0 < 10000)
        kvh_sleep_ms(10);
    ck_assert_msg(lease_calls_answered(e) > answered0, "the daemon never answered the orphaned /seal");
    ck_assert_msg(kvs_stat(e, path) == counted0 + 1, "the orphaned /seal (%s accept) was not counted in %s",
                  accepted ? "after" : "before", path);
}

/* Bytes of the first n objects read (got) that differ from a's (want). */
static size_t count_wrong(uint8_t *const *got, uint8_t *const *want, size_t n)
{
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < BLOCK; j++)
            wrong += got[i][j] != want[i][j];
    return wrong;
}

/* Tenant b knows tenant a's open create lease id (today's ids were a
 * counter): its seal, release and discard of it change nothing, over a live
 * connection or one whose socket b closed before the daemon handled the
 * request (then the kernel shows it as uid 0's). a's engine then writes and
 * seals, and its readers get a's bytes. */
START_TEST(another_tenants_lease_calls_change_nothing)
{
    TENANTS_NEEDS_ROOT("kvs_tenants: another_tenants_lease_calls_change_nothing");
    enum { N = 8 };
    kvs_env e;
    kvsc c;
    kvsc_reply r;
    char names[N][128], why[256], err[256];
    const char *keys[N];
    uint8_t *want[N], *got[N];
    size_t hits;

    kvs_env_start(&e, "memory.host_bytes=96MiB\nmemory.slab_bytes=1MiB\ntenant.b.uids=65534\n"
                  "tenant.b.host_bytes=16MiB\n");
    tenants_open_dirs(&e.d);
    ck_assert_msg(kvsc_open(&c, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    for (int i = 0; i < N; i++) {
        okey(names[i], sizeof names[i], 500 + i);
        keys[i] = names[i];
        want[i] = malloc(BLOCK);
        got[i] = malloc(BLOCK);
        bfill(want[i], BLOCK, 500 + i, 7);
    }
    acquire_ok(e.url, "create", keys, N, &r);
    struct foreign f = { .url = e.url };
    snprintf(f.lease, sizeof f.lease, "%s", kvsc_lease_id(&r));
    ck_assert_str_ne(f.lease, "");

    ck_assert_int_eq(tenants_run_as(foreign_lease_calls, &f, B_UID, B_UID, NULL, 0), 0);
    orphaned_seal(&e, f.lease, true, "bad_total");
    orphaned_seal(&e, f.lease, false, "denied_total");
    /* Still a's unsealed lease: its objects are invisible to readers (had
     * b sealed it, they would read bytes a never wrote). */
    ck_assert_int_eq(kvsc_read(&c, keys, N, got, BLOCK, 60, &hits, NULL), 0);
    ck_assert_msg(hits == 0, "%zu of a's unsealed objects are readable after tenant b's calls: %zu wrong bytes",
                  hits, count_wrong(got, want, hits));
    ck_assert_int_eq(kvs_stat(&e, "requests.seal_total"), 0);
    ck_assert_int_eq(kvs_stat(&e, "requests.release_total"), 0);
    ck_assert_int_eq(kvs_stat(&e, "requests.discard_total"), 0);

    /* a's engine writes and seals its lease: its readers get its bytes. */
    for (int i = 0; i < N; i++) {
        uint64_t off, sz;
        ck_assert(kvsc_object(&r, keys[i], &off, &sz));
        ck_assert(off + BLOCK <= c.size && sz == BLOCK);
        memcpy(c.base + off, want[i], BLOCK);
    }
    kvsc_reply_free(&r);
    ck_assert_int_eq(lease_call(e.url, "seal", f.lease, err, sizeof err), 204);
    ck_assert_int_eq(lease_call(e.url, "release", f.lease, err, sizeof err), 204);
    ck_assert_int_eq(kvsc_read(&c, keys, N, got, BLOCK, 60, &hits, NULL), 0);
    ck_assert_uint_eq(hits, N);
    size_t wrong = count_wrong(got, want, N);
    ck_assert_msg(wrong == 0, "a's readers got %zu wrong bytes", wrong);
    for (int i = 0; i < N; i++) {
        free(want[i]);
        free(got[i]);
    }
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- the per-tenant lease limit ------------------------------------------------------- */

/* As tenant b: a create lease (then discarded). Exit 0 when granted. */
static int b_creates(void *arg)
{
    const char *url = arg;
    char key[128], err[256];
    const char *k[1] = { key };
    kvsc_reply r;
    okey(key, sizeof key, 900);
    char *body = kvsc_acquire_body("create", k, 1, BLOCK, 60);
    if (!body || kvsc_call(url, "acquire", body, &r) != 0)
        return 2;
    free(body);
    if (r.status != 200) {
        fprintf(stderr, "tenant b: /acquire answered %ld: %s\n", r.status,
                json_string_value(json_object_get(r.body, "error")) ?: "");
        return 3;
    }
    char lease[64];
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    if (!*lease)
        return 4;
    return lease_call(url, "discard", lease, err, sizeof err) == 204 ? 0 : 5;
}

/* As tenant b: /health answers 200, the data-plane handshake lends the
 * arena, and a create lease is granted (b_creates). Exit 0 when all are. */
struct b_env { const char *url, *sock; };

static int b_served(void *arg)
{
    const struct b_env *b = arg;
    kvsc_reply r;
    kvsc c;
    char why[256];
    if (kvsc_call(b->url, "health", NULL, &r) != 0 || r.status != 200) {
        fprintf(stderr, "tenant b: /health answered %ld\n", r.status);
        return 6;
    }
    kvsc_reply_free(&r);
    if (kvsc_open(&c, b->url, b->sock, why, sizeof why) != 0) {
        fprintf(stderr, "tenant b: handshake: %s\n", why);
        return 7;
    }
    kvsc_close(&c);
    return b_creates((void *)b->url);
}

/* [kvs_server] max_leases = 16 on 64 MiB, tenant b 16 MiB: a (the default
 * tenant, 48 MiB) may hold 12 leases at once, b 4. a opening all it may
 * leaves b's /health, handshake and /acquire served. */
START_TEST(one_tenants_leases_leave_room_for_another)
{
    TENANTS_NEEDS_ROOT("kvs_tenants: one_tenants_leases_leave_room_for_another");
    kvs_env e;
    kvsc c;
    char key[128], why[256];
    const char *k[1] = { key };
    uint8_t blk[BLOCK];
    const uint8_t *blocks[1] = { blk };
    int opened = 0;
    long refused = 0;

    kvs_env_start(&e, "memory.host_bytes=64MiB\nmemory.slab_bytes=1MiB\nkvs_server.max_leases=16\n"
                  "tenant.b.uids=65534\ntenant.b.host_bytes=16MiB\n");
    tenants_open_dirs(&e.d);
    ck_assert_msg(kvsc_open(&c, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    okey(key, sizeof key, 1);
    bfill(blk, BLOCK, 1, 1);
    ck_assert_int_eq(kvsc_store(&c, k, 1, blocks, BLOCK, 60), 0);
    /* a's read leases on its object, held (never released) until refused. */
    char *body = kvsc_acquire_body("read", k, 1, BLOCK, 600);
    for (int i = 0; i < 16 && !refused; i++) {
        kvsc_reply r;
        ck_assert_int_eq(kvsc_call(e.url, "acquire", body, &r), 0);
        if (r.status == 200) {
            ck_assert_str_ne(kvsc_lease_id(&r), "");
            opened++;
        } else {
            refused = r.status;
        }
        kvsc_reply_free(&r);
    }
    free(body);
    struct b_env be = { e.url, e.kvs_sock };
    ck_assert_int_eq(chmod(e.dir, 0755), 0);   /* b reaches the data plane */
    ck_assert_int_eq(chmod(e.kvs_sock, 0666), 0);
    int rc = tenants_run_as(b_served, &be, B_UID, B_UID, NULL, 0);
    ck_assert_msg(rc == 0, "tenant b's /health, handshake or /acquire failed (%d) while a holds %d leases", rc,
                  opened);
    ck_assert_int_eq(opened, 12);
    ck_assert_int_eq(refused, 503);
    ck_assert_int_eq(kvs_stat(&e, "leases_open"), 12);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static Suite *kvs_tenants_suite(void)
{
    Suite *s = suite_create("kvs_tenants");
    TCase *tc = tcase_create("kvs_tenants");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, lease_ids_are_128_random_bits);
    tcase_add_test(tc, another_tenants_lease_calls_change_nothing);
    tcase_add_test(tc, one_tenants_leases_leave_room_for_another);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_tenants_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
