/* Integration test of the KVS front end's cap on unread replies per tenant
 * (issue 30, hostile-neighbour treatment of [kvs_server]
 * max_output_total_bytes): one tenant whose clients send large reads and
 * never read the answers holds at most its share of the total (in
 * proportion to its host memory, like its leases and connections), so
 * another tenant's reply of the same size is still written.
 *
 * Tenant b is uid 65534 (a real child process, tenants_util.h); root is
 * the default tenant a. Every wait is bounded; assertions are on statuses,
 * counters and the objects of the replies. */
#include <check.h>

#include <curl/curl.h>
#include <inttypes.h>
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

#define A_DEP   "share-test-a-0123456789"
#define B_DEP   "share-test-b-0123456789"   /* as long as A_DEP: replies of the same size */
#define B_UID   65534
#define OBLOCK  4096u
#define NKEYS   3072       /* keys of one large read: a reply of about 0.45 MB */
#define MAXA    16         /* a's clients that never read, at most */

static char *keys_storage[2];
static const char **keys_of(int which, const char *dep)
{
    const char **k = calloc(NKEYS, sizeof *k);
    keys_storage[which] = calloc(NKEYS, 128);
    if (!k || !keys_storage[which])
        return NULL;
    for (size_t i = 0; i < NKEYS; i++) {
        snprintf(keys_storage[which] + i * 128, 128, "rtp_llm/v1/%s/tp-0/group-0/block-%zu", dep, i);
        k[i] = keys_storage[which] + i * 128;
    }
    return k;
}

/* Store every key of keys (4 KiB objects) through c; 0 or the failing status. */
static long store_all(const kvsc *c, const char *const *keys)
{
    uint8_t *blk = calloc(1, OBLOCK);
    const uint8_t **blocks = calloc(NKEYS, sizeof *blocks);
    long st = blk && blocks ? 0 : -1;
    for (size_t i = 0; i < NKEYS && blocks; i++)
        blocks[i] = blk;
    for (size_t i = 0; i < NKEYS && st == 0; i += 512)
        st = kvsc_store(c, keys + i, 512, blocks + i, OBLOCK, 60);
    free(blocks);
    free(blk);
    return st;
}

/* The status of the reply that starts arriving on fd (peeked: an answer
 * of 200 stays unread), within 20 s. */
static int peek_status(int fd)
{
    char line[16] = "";
    int status = 0;
    uint64_t t0 = kvh_now_ms();
    while (kvh_now_ms() - t0 < 20000) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, line, sizeof line - 1, MSG_PEEK);
        ck_assert_int_gt(n, 0);
        if (n < 12)
            continue;
        line[n] = '\0';
        ck_assert_msg(sscanf(line, "HTTP/1.1 %d", &status) == 1, "not a status line: %s", line);
        return status;
    }
    ck_abort_msg("no reply within 20 s");
    return 0;
}

/* The whole of a small reply on fd (the server closes, or 64 KiB), in buf. */
static void read_small(int fd, char *buf, size_t len)
{
    size_t got = 0;
    uint64_t t0 = kvh_now_ms();
    while (got + 1 < len && kvh_now_ms() - t0 < 5000) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, buf + got, len - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
        if (strstr(buf, "\r\n\r\n") && strchr(strstr(buf, "\r\n\r\n") + 4, '}'))
            break;
    }
    buf[got] = '\0';
}

struct b_env { const char *url, *sock; };

/* As tenant b: store its NKEYS objects. Exit 0 when stored. */
static int b_stores(void *arg)
{
    const struct b_env *b = arg;
    kvsc c;
    char why[256];
    const char **keys = keys_of(1, B_DEP);
    if (!keys || kvsc_open(&c, b->url, b->sock, why, sizeof why) != 0) {
        fprintf(stderr, "tenant b: handshake: %s\n", keys ? why : "out of memory");
        return 2;
    }
    long st = store_all(&c, keys);
    if (st != 0)
        fprintf(stderr, "tenant b: storing its objects failed: %ld\n", st);
    kvsc_close(&c);
    return st == 0 ? 0 : 3;
}

/* As tenant b: one read of its NKEYS objects (a reply as large as each of
 * a's) answers 200 with every object. Exit 0 when it did. */
static int b_reads(void *arg)
{
    const struct b_env *b = arg;
    kvsc_reply r;
    const char **keys = keys_of(1, B_DEP);
    char *body = keys ? kvsc_acquire_body("read", keys, NKEYS, OBLOCK, 60) : NULL;
    if (!body || kvsc_call(b->url, "acquire", body, &r) != 0)
        return 2;
    free(body);
    if (r.status != 200) {
        fprintf(stderr, "tenant b: its read of %d objects answered %ld: %s\n", NKEYS, r.status,
                json_string_value(json_object_get(r.body, "error")) ?: "");
        return 3;
    }
    size_t n = json_array_size(json_object_get(r.body, "objects"));
    if (n != NKEYS) {
        fprintf(stderr, "tenant b: its read answered %zu of its %d objects\n", n, NKEYS);
        return 4;
    }
    char lease[64];
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    kvsc c = { .fd = -1 };
    snprintf(c.url, sizeof c.url, "%s", b->url);
    return kvsc_lease_call(&c, "release", lease) == 204 ? 0 : 5;
}

/* [kvs_server] listen = unix:PATH, max_output_bytes = 1 MiB,
 * max_output_total_bytes = 2 MiB on 96 MiB of host memory, tenant b 32 MiB.
 * Tenant a (root, the default tenant) sends reads of NKEYS objects on
 * clients that never read their answers until one is refused: at its
 * share, not at the total, and the refusal says so. Tenant b's read of as
 * many objects is then answered 200 with all of them. */
START_TEST(one_tenants_unread_replies_leave_room_for_another)
{
    TENANTS_NEEDS_ROOT("kvs_output_share: one_tenants_unread_replies_leave_room_for_another");
    kvs_env e;
    kvsc c;
    char conf[3 * PATH_MAX], why[256], refusal[8192] = "";
    int fds[MAXA], opened = 0, refused = 0;

    kvs_env_init(&e);
    snprintf(e.url, sizeof e.url, "unix:%s/http.sock", e.dir);
    snprintf(conf, sizeof conf, "kvs_server.enabled=on\nkvs_server.listen=%s\nkvs_server.socket_path=%s\n"
             "server.socket_mode=0666\nmemory.host_bytes=96MiB\nmemory.slab_bytes=1MiB\n"
             "kvs_server.max_output_bytes=1MiB\nkvs_server.max_output_total_bytes=2MiB\n"
             "kvs_server.request_timeout=120s\ntenant.b.uids=65534\ntenant.b.host_bytes=32MiB\n", e.url, e.kvs_sock);
    KVH_START(&e.d, conf);
    tenants_open_dirs(&e.d);
    ck_assert_int_eq(chmod(e.dir, 0755), 0);   /* b reaches both sockets */
    ck_assert_int_eq(chmod(e.kvs_sock, 0666), 0);
    struct b_env be = { e.url, e.kvs_sock };
    ck_assert_msg(tenants_run_as(b_stores, &be, B_UID, B_UID, NULL, 0) == 0, "tenant b could not store");
    ck_assert_msg(kvsc_open(&c, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    const char **keys = keys_of(0, A_DEP);
    ck_assert_ptr_nonnull(keys);
    ck_assert_int_eq(store_all(&c, keys), 0);

    char *body = kvsc_acquire_body("read", keys, NKEYS, OBLOCK, 60);
    while (opened < MAXA && !refused) {
        fds[opened] = kvs_connect_unix(e.url, 0);
        kvs_send_acquire(fds[opened], body);
        int status = peek_status(fds[opened]);
        kvs_stat_settled(&e, "http_output.bytes");
        opened++;
        if (status != 200) {
            refused = status;
            read_small(fds[opened - 1], refusal, sizeof refusal);
        }
    }
    free(body);
    long long held = kvs_stat(&e, "http_output.bytes");
    fprintf(stderr, "one_tenants_unread_replies_leave_room_for_another: tenant a: %d replies held unread "
            "(%lld bytes), then %d: %s\n", opened - 1, held, refused,
            strstr(refusal, "\r\n\r\n") ? strstr(refusal, "\r\n\r\n") + 4 : refusal);
    ck_assert_msg(refused == 503, "tenant a's %d reads of %d objects were all answered", opened, NKEYS);
    ck_assert_int_ge(opened, 2);

    int rc = tenants_run_as(b_reads, &be, B_UID, B_UID, NULL, 0);
    ck_assert_msg(rc == 0, "tenant b's read of %d objects failed (%d) while tenant a's %d unread replies hold "
                  "%lld bytes", NKEYS, rc, opened - 1, held);
    ck_assert_msg(strstr(refusal, "tenant default") && strstr(refusal, "share of kvs_server.max_output_total_bytes"),
                  "tenant a's refusal does not name its share: %s", refusal);
    ck_assert_int_eq(kvs_stat(&e, "http_output.tenant_limit_total"), 1);
    ck_assert_int_eq(kvs_stat(&e, "http_output.refused_total"), 1);
    ck_assert_int_eq(kvs_stat(&e, "leases_open"), opened - 1);

    for (int i = 0; i < opened; i++)
        close(fds[i]);
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.http_output.bytes", 0, 10000, &last) == 0,
                  "%lld bytes of replies still held after their clients closed", last);
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.http_connections.open", 0, 10000, &last) == 0,
                  "%lld HTTP connections still open", last);
    free(keys);
    free(keys_storage[0]);
    kvsc_close(&c);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static Suite *kvs_output_share_suite(void)
{
    Suite *s = suite_create("kvs_output_share");
    TCase *tc = tcase_create("kvs_output_share");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, one_tenants_unread_replies_leave_room_for_another);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_output_share_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
