/* Integration tests of the KVS front end's HTTP bounds (issue 30, items 5
 * and 6 of what was seen):
 *  - HTTP connections are limited per tenant as well as in total: one
 *    tenant holding every connection it may leaves another tenant's
 *    /health and /acquire served;
 *  - a connection's unsent reply bytes, and the front end's in all, are
 *    capped ([kvs_server] max_output_bytes, max_output_total_bytes): clients
 *    that send large reads and never read their answers hold at most the
 *    cap, another client is served meanwhile, and everything held is given
 *    back when they close.
 *
 * Tenant b is uid 65534 (a real child process, tenants_util.h); root is
 * the default tenant a. Every wait is bounded; assertions are on statuses,
 * counters and bytes. */
#include <check.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"
#include "tenants_util.h"

#define DEP     "limits-test-0123456789"
#define B_UID   65534      
static void okey(char *buf, size_t len, int64_t block)
{
    snprintf(buf, len, "rtp_llm/v1/" DEP "/tp-0/group-0/block-%" PRId64, block);
}

/* A TCP connection to url whose receive buffer is small (rcvbuf > 0): its
 * unread replies stay with the daemon. */
static int connect_raw(const char *url, int rcvbuf)
{
    unsigned port = 0;
    ck_assert_msg(sscanf(url, "http://127.0.0.1:%u", &port) == 1, "url %s", url);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    if (rcvbuf > 0)
        ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static long long connections_seen(kvs_env *e)
{
    return kvs_stat(e, "http_connections.accepted_total") + kvs_stat(e, "http_connections.refused_total");
}

/* ---- HTTP connections per tenant --------------------------------------------------- */

/* As tenant b: /health answers 200 and a create lease is granted (then
 * discarded). Exit 0 when both were. */
static int b_is_served(void *arg)
{
    const char *url = arg;
    char key[128], body[192];
    const char *k[1] = { key };
    kvsc_reply r;
    if (kvsc_call(url, "health", NULL, &r) != 0 || r.status != 200) {
        fprintf(stderr, "tenant b: /health answered %ld: %s\n", r.status,
                json_string_value(json_object_get(r.body, "error")) ?: "");
        return 2;
    }
    kvsc_reply_free(&r);
    okey(key, sizeof key, 900);
    char *req = kvsc_acquire_body("create", k, 1, 8192, 60);
    if (!req || kvsc_call(url, "acquire", req, &r) != 0)
        return 3;
    free(req);
    if (r.status != 200) {
        fprintf(stderr, "tenant b: /acquire answered %ld: %s\n", r.status,
                json_string_value(json_object_get(r.body, "error")) ?: "");
        return 4;
    }
    snprintf(body, sizeof body, "{\"lease_id\":\"%s\",\"request_id\":\"kvs_store_x\"}", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    if (kvsc_call(url, "discard", body, &r) != 0 || r.status != 204)
        return 5;
    kvsc_reply_free(&r);
    return 0;
}

/* [kvs_server] max_connections = 64 on 64 MiB, tenant b 16 MiB. Tenant a
 * (root, the default tenant) opens idle connections until one is refused;
 * b's /health and /acquire are still served, and a was refused at its
 * share, not at the total. */
START_TEST(one_tenants_connections_leave_room_for_another)
{
    TENANTS_NEEDS_ROOT("kvs_http_limits: one_tenants_connections_leave_room_for_another");
    enum { MAX = 64 };
    kvs_env e;
    int fds[MAX];
    int opened = 0;
    bool refused = false;

    kvs_env_start(&e, "memory.host_bytes=64MiB\nmemory.slab_bytes=1MiB\nkvs_server.max_connections=64\n"
                  "kvs_server.request_timeout=120s\ntenant.b.uids=65534\ntenant.b.host_bytes=16MiB\n");
    tenants_open_dirs(&e.d);
    while (opened < MAX && !refused) {
        long long seen = connections_seen(&e), refused0 = kvs_stat(&e, "http_connections.refused_total");
        long long last = -1;
        fds[opened] = connect_raw(e.url, 0);
        uint64_t t0 = kvh_now_ms();
        while ((last = connections_seen(&e)) <= seen && kvh_now_ms() - t0 < 10000)
            kvh_sleep_ms(2);
        ck_assert_msg(last > seen, "connection %d was neither accepted nor refused", opened);
        refused = kvs_stat(&e, "http_connections.refused_total") > refused0;
        opened++;
    }
    int rc = tenants_run_as(b_is_served, e.url, B_UID, B_UID, NULL, 0);
    ck_assert_msg(rc == 0, "tenant b was not served (%d) while tenant a holds %d HTTP connections", rc,
                  opened - refused);
    ck_assert_msg(refused, "tenant a opened all %d connections of [kvs_server] max_connections", opened);
    /* a's share: what tenant b's 16 of 64 MiB leave of the connections
     * tenants share; b's was not touched. */
    ck_assert_int_lt(opened - 1, MAX);
    ck_assert_int_eq(kvs_stat(&e, "http_connections.tenant_limit_total"), 1);
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.http_connections.open", 0, 10000, &last) == 0,
                  "%lld HTTP connections still counted open after every client closed", last);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* ---- bounded output ------------------------------------------------------------------- */

#define OBLOCK   4096u
#define NKEYS    4096       /* keys of one large read: a reply of about 0.6 MB */
#define NCONNS   8

static char *keys_storage;
static const char **keys_of(size_t n, int64_t first)
{
    const char **k = calloc(n, sizeof *k);
    keys_storage = calloc(n, 128);
    ck_assert(k && keys_storage);
    for (size_t i = 0; i < n; i++) {
        okey(keys_storage + i * 128, 128, first + (int64_t)i);
        k[i] = keys_storage + i * 128;
    }
    return k;
}

/* [kvs_server] listen = unix:PATH, max_output_bytes = 1 MiB,
 * max_output_total_bytes = 2 MiB.
 * NCONNS clients each send a read of NKEYS stored objects (a reply of
 * about 0.6 MB each, 4.8 MB together) and never read: the front end holds
 * at most its total cap for them, another client is served meanwhile, a
 * read whose reply alone is over 1 MiB gets 413 naming the option, and
 * when the clients close everything held is given back. */
START_TEST(unread_replies_are_bounded)
{
    kvs_env e;
    kvsc c;
    char why[256], conf[3 * PATH_MAX];
    int fds[NCONNS];
    long long last = -1;

    /* Over a unix socket the kernel takes a fixed amount of each reply
     * (net.core.wmem_default), so what the daemon holds does not depend on
     * loopback TCP's buffers growing (they can take a whole 0.6 MB reply,
     * and the daemon writes a reply the moment it is made). */
    kvs_env_init(&e);
    snprintf(e.url, sizeof e.url, "unix:%s/http.sock", e.dir);
    snprintf(conf, sizeof conf, "kvs_server.enabled=on\nkvs_server.listen=%s\nkvs_server.socket_path=%s\n"
             "leases.reaper_interval=100ms\nmemory.host_bytes=96MiB\nmemory.slab_bytes=1MiB\n"
             "kvs_server.max_output_bytes=1MiB\nkvs_server.max_output_total_bytes=2MiB\n"
             "kvs_server.request_timeout=120s\n", e.url, e.kvs_sock);
    KVH_START(&e.d, conf);
    ck_assert_msg(kvsc_open(&c, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    const char **keys = keys_of(2 * NKEYS, 0);
    uint8_t *blk = calloc(1, OBLOCK);
    const uint8_t **blocks = calloc(2 * NKEYS, sizeof *blocks);
    for (size_t i = 0; i < 2 * NKEYS; i++)
        blocks[i] = blk;
    for (size_t i = 0; i < 2 * NKEYS; i += 512)
        ck_assert_int_eq(kvsc_store(&c, keys + i, 512, blocks + i, OBLOCK, 60), 0);

    char *body = kvsc_acquire_body("read", keys, NKEYS, OBLOCK, 60);
    long long reads0 = kvs_stat(&e, "requests.acquire_read_total");
    for (int i = 0; i < NCONNS; i++) {
        fds[i] = kvs_connect_unix(e.url, 0);
        kvs_send_acquire(fds[i], body);
    }
    free(body);
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.requests.acquire_read_total", reads0 + NCONNS, 20000, &last) == 0,
                  "only %lld of the %d large reads were handled", last - reads0, NCONNS);
    long long held = kvs_stat(&e, "http_output.bytes");
    fprintf(stderr, "unread_replies_are_bounded: %lld reply bytes held for %d clients that do not read, %lld "
            "replies refused, daemon VmRSS %lld kB\n", held, NCONNS, kvs_stat(&e, "http_output.refused_total"),
            kvh_proc_status_kib(e.d.pid, "VmRSS"));
    ck_assert_msg(held >= 0 && held <= (2 << 20) + NCONNS * 1024,
                  "the front end holds %lld bytes of unread replies (kvs_server.max_output_total_bytes = 2 MiB)",
                  held);
    ck_assert_int_eq(kvs_stat(&e, "http_output.max_bytes"), 2 << 20);
    /* A refused reply grants nothing: only the answered reads hold leases. */
    long long refused = kvs_stat(&e, "http_output.refused_total");
    ck_assert_int_gt(refused, 0);
    ck_assert_int_eq(kvs_stat(&e, "leases_open"), NCONNS - refused);

    /* Another client is served meanwhile. */
    uint8_t out[OBLOCK], *outs[1] = { out };
    size_t hits = 0;
    ck_assert_int_eq(kvsc_read(&c, keys, 1, outs, OBLOCK, 60, &hits, NULL), 0);
    ck_assert_uint_eq(hits, 1);

    for (int i = 0; i < NCONNS; i++)
        close(fds[i]);
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.http_output.bytes", 0, 10000, &last) == 0,
                  "%lld bytes of replies still held after their clients closed", last);
    fprintf(stderr, "unread_replies_are_bounded: after the clients closed: %lld reply bytes held, daemon VmRSS "
            "%lld kB\n", kvs_stat(&e, "http_output.bytes"), kvh_proc_status_kib(e.d.pid, "VmRSS"));
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.http_connections.open", 0, 10000, &last) == 0,
                  "%lld HTTP connections still open", last);

    /* A reply alone over max_output_bytes is refused, not buffered (asked
     * with nothing else held, so no other bound answers first). */
    kvsc_reply r;
    body = kvsc_acquire_body("read", keys, 2 * NKEYS, OBLOCK, 60);
    ck_assert_int_eq(kvsc_call(e.url, "acquire", body, &r), 0);
    free(body);
    const char *err = json_string_value(json_object_get(r.body, "error"));
    ck_assert_msg(r.status == 413 && err && strstr(err, "kvs_server.max_output_bytes"),
                  "a read whose reply is over max_output_bytes answered %ld '%s'", r.status, err ? err : "");
    kvsc_reply_free(&r);
    ck_assert_int_eq(kvs_stat(&e, "http_output.refused_total"), refused + 1);
    ck_assert_int_eq(kvs_stat(&e, "leases_open"), NCONNS - refused);
    free(blocks);
    free(blk);
    free(keys);
    free(keys_storage);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static Suite *kvs_http_limits_suite(void)
{
    Suite *s = suite_create("kvs_http_limits");
    TCase *tc = tcase_create("kvs_http_limits");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, one_tenants_connections_leave_room_for_another);
    tcase_add_test(tc, unread_replies_are_bounded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_http_limits_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
