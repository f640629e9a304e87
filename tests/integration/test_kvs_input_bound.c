/* Integration test of the KVS front end's cap on request bodies being
 * received (issue 30, hostile-neighbour treatment of [kvs_server]
 * max_input_total_bytes): evhttp holds each request's body in memory until
 * it is whole, so one tenant that opens many connections and sends large
 * bodies slowly (all but their last byte, then nothing until the request
 * deadline) would make the daemon hold connections x max_body_bytes. The
 * bytes being received are bounded in all and per tenant (its share, like
 * its connections and unread replies), and another tenant's /acquire is
 * served meanwhile.
 *
 * Tenant b is uid 65534 (a real child process, tenants_util.h); root is
 * the default tenant a. Every wait is bounded; assertions are on counters,
 * the daemon's memory and statuses. */
#include <check.h>

#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"
#include "tenants_util.h"

#define B_UID    65534
#define NCONNS   40                   /* tenant a's stalled uploads */
#define BODY     ((1u << 20) - 64)    /* Content-Length of each: just under max_body_bytes (1 MiB) */
#define INPUT_MAX (8ll << 20)         /* kvs_server.max_input_total_bytes */

/* Send len bytes of p on non-blocking fd; stops at an error (the daemon
 * closed it) or when nothing could be sent for 3 s. Bytes sent. */
static size_t send_some(int fd, const char *p, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, p + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            break;
        struct pollfd pf = { .fd = fd, .events = POLLOUT };
        if (poll(&pf, 1, 3000) <= 0 || (pf.revents & (POLLERR | POLLHUP)))
            break;
    }
    return off;
}

/* POST /acquire with Content-Length BODY, all of the body but its last
 * byte sent, then nothing. Bytes of the body sent. */
static size_t stall_upload(int fd, const char *body)
{
    char head[256];
    int hl = snprintf(head, sizeof head, "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: %u\r\n\r\n", BODY);
    if (send_some(fd, head, (size_t)hl) != (size_t)hl)
        return 0;
    return send_some(fd, body, BODY - 1);
}

struct b_env { const char *url, *sock; };

/* As tenant b: store 8 small objects (handshake, /acquire create, seal). */
static int b_stores(void *arg)
{
    const struct b_env *b = arg;
    kvsc c;
    char why[256], kbuf[8][96];
    const char *keys[8];
    uint8_t blk[4096] = { 1 };
    const uint8_t *blocks[8];
    for (int i = 0; i < 8; i++) {
        snprintf(kbuf[i], sizeof kbuf[i], "rtp_llm/v1/input-test-b/tp-0/group-0/block-%d", i);
        keys[i] = kbuf[i];
        blocks[i] = blk;
    }
    if (kvsc_open(&c, b->url, b->sock, why, sizeof why) != 0) {
        fprintf(stderr, "tenant b: handshake: %s\n", why);
        return 2;
    }
    long st = kvsc_store(&c, keys, 8, blocks, sizeof blk, 60);
    if (st != 0)
        fprintf(stderr, "tenant b: storing its objects failed: %ld\n", st);
    kvsc_close(&c);
    return st == 0 ? 0 : 3;
}

/* [kvs_server] listen = unix:PATH, max_body_bytes = 1 MiB,
 * max_input_total_bytes = 8 MiB on 96 MiB of host memory, tenant b 32 MiB.
 * Tenant a (root) stalls NCONNS uploads of just under 1 MiB each: the
 * daemon holds at most the cap (a's share of it) of their bytes, refuses
 * the uploads past it, its memory does not grow with NCONNS, and tenant
 * b's /acquire is served. */
START_TEST(stalled_uploads_are_bounded_per_tenant)
{
    TENANTS_NEEDS_ROOT("kvs_input_bound: stalled_uploads_are_bounded_per_tenant");
    kvs_env e;
    char conf[3 * PATH_MAX];
    int fds[NCONNS];
    size_t sent_total = 0;

    kvs_env_init(&e);
    snprintf(e.url, sizeof e.url, "unix:%s/http.sock", e.dir);
    snprintf(conf, sizeof conf, "kvs_server.enabled=on\nkvs_server.listen=%s\nkvs_server.socket_path=%s\n"
             "server.socket_mode=0666\nmemory.host_bytes=96MiB\nmemory.slab_bytes=1MiB\n"
             "kvs_server.max_body_bytes=1MiB\nkvs_server.max_input_total_bytes=8MiB\n"
             "kvs_server.request_timeout=120s\ntenant.b.uids=65534\ntenant.b.host_bytes=32MiB\n", e.url, e.kvs_sock);
    KVH_START(&e.d, conf);
    tenants_open_dirs(&e.d);
    ck_assert_int_eq(chmod(e.dir, 0755), 0);   /* b reaches both sockets */
    ck_assert_int_eq(chmod(e.kvs_sock, 0666), 0);

    char *body = malloc(BODY);
    ck_assert_ptr_nonnull(body);
    memset(body, ' ', BODY);
    long long rss0 = kvh_proc_status_kib(e.d.pid, "VmRSS");
    for (int i = 0; i < NCONNS; i++) {
        fds[i] = kvs_connect_unix(e.url, SOCK_NONBLOCK);
        sent_total += stall_upload(fds[i], body);
    }
    long long held = kvs_stat_settled(&e, "http_input.bytes");
    long long rss1 = kvh_proc_status_kib(e.d.pid, "VmRSS");
    long long refused = kvs_stat(&e, "http_input.refused_total");
    long long tenant_limit = kvs_stat(&e, "http_input.tenant_limit_total");
    fprintf(stderr, "stalled_uploads_are_bounded_per_tenant: tenant a stalled %d uploads of %u bytes (%zu body "
            "bytes sent): the daemon holds %lld input bytes, refused %lld (%lld at the tenant's share); VmRSS "
            "%lld -> %lld kB (+%lld MiB)\n", NCONNS, BODY, sent_total, held, refused, tenant_limit, rss0, rss1,
            (rss1 - rss0) >> 10);

    /* What the refused clients saw: a 503 naming the option (over TCP one
     * still sending when the daemon closed may see a reset instead; a unix
     * socket keeps what was sent to it). */
    int saw503 = 0;
    char first[512] = "";
    for (int i = 0; i < NCONNS; i++) {
        char buf[512];
        ssize_t n = recv(fds[i], buf, sizeof buf - 1, MSG_DONTWAIT);
        if (n > 0) {
            buf[n] = '\0';
            saw503 += strncmp(buf, "HTTP/1.1 503", 12) == 0;
            if (!first[0])
                snprintf(first, sizeof first, "%s", buf);
        }
    }
    fprintf(stderr, "stalled_uploads_are_bounded_per_tenant: %d refused clients read a 503; the first:\n%s\n", saw503,
            first);

    struct b_env be = { e.url, e.kvs_sock };
    int rc = tenants_run_as(b_stores, &be, B_UID, B_UID, NULL, 0);
    ck_assert_msg(rc == 0, "tenant b's /acquire failed (%d) while tenant a's stalled uploads are held", rc);

    ck_assert_msg(rss1 - rss0 < 3 * (INPUT_MAX >> 10), "the daemon grew by %lld MiB for %d stalled uploads of "
                  "%u bytes (cap %lld MiB)", (rss1 - rss0) >> 10, NCONNS, BODY, INPUT_MAX >> 20);
    ck_assert_msg(held >= 0 && held <= INPUT_MAX, "input bytes held: %lld (cap %lld)", held, INPUT_MAX);
    ck_assert_msg(tenant_limit >= 1 && refused >= tenant_limit, "refused %lld, at the tenant's share %lld",
                  refused, tenant_limit);
    /* a's share: two thirds of the total less the 1/32 reserve; each
     * upload it keeps holds ~1 MiB. */
    ck_assert_msg(held > INPUT_MAX / 4, "tenant a kept too little: %lld bytes", held);
    ck_assert_msg(saw503 >= 1 && strstr(first, "share of kvs_server.max_input_total_bytes"),
                  "no refused client read a 503 naming its share (%d did): %s", saw503, first);

    for (int i = 0; i < NCONNS; i++)
        close(fds[i]);
    free(body);
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.http_input.bytes", 0, 10000, &last) == 0,
                  "%lld input bytes still held after their clients closed", last);
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.http_connections.open", 0, 10000, &last) == 0,
                  "%lld HTTP connections still open", last);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static Suite *kvs_input_bound_suite(void)
{
    Suite *s = suite_create("kvs_input_bound");
    TCase *tc = tcase_create("kvs_input_bound");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stalled_uploads_are_bounded_per_tenant);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_input_bound_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
