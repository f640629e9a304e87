/* Integration tests of how the KVS front end reads requests and writes
 * replies (httpd: a reply written in the turn it is made, a request body
 * read past libevent's 4096 bytes per read in one turn), on raw loopback
 * connections so every byte and every boundary is the test's:
 *  - one kept-alive connection carries several requests in a row, each
 *    answered whole and in order (the reply written inline must leave
 *    evhttp ready for the next request);
 *  - a body over 4096 bytes, sent whole, in pieces with pauses between
 *    them, and pipelined behind another request in one write;
 *  - a reply larger than the socket takes at once (a client with a small
 *    receive buffer that reads late) arrives whole, and the connection
 *    then serves the next request.
 * kvs_server.http_output.inline_total, http_input.reads_extended_total and
 * http_input.reads_early_total (a request read in the turn its connection
 * is accepted) show each path was taken.
 * Every wait is bounded (SO_RCVTIMEO); assertions are on statuses and
 * bytes. */
#include <check.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <signal.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"

#define DEP "turns-test-0123456789"
#define OBJ 4096u

static kvs_env env;

static void setup(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    kvs_env_start(&env, "memory.host_bytes=64MiB\n");
}

static void teardown(void)
{
    ck_assert_int_eq(kvh_stop(&env.d, 0), 0);
    kvh_destroy(&env.d);
}

static int connect_tcp(int rcvbuf)
{
    unsigned port = 0;
    ck_assert_msg(sscanf(env.url, "http://127.0.0.1:%u", &port) == 1, "url %s", env.url);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    if (rcvbuf > 0)
        ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
    struct timeval tv = { .tv_sec = 10 };
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        ck_assert_int_gt(w, 0);
        p += w;
        n -= (size_t)w;
    }
}

/* A POST request's bytes (malloc()ed; *len set). */
static char *post(const char *route, const char *body, size_t *len)
{
    size_t blen = strlen(body), cap = blen + 256;
    char *r = malloc(cap);
    ck_assert_ptr_nonnull(r);
    int hl = snprintf(r, cap, "POST /%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n", route, blen);
    memcpy(r + hl, body, blen);
    *len = (size_t)hl + blen;
    return r;
}

/* One whole reply off fd (a Content-Length one, or none for 204): its
 * status, and its body (malloc()ed, NUL-terminated) in *body. Bytes past
 * it would belong to the next reply: there must be none yet, as the
 * caller sends its next request only after reading this one (pipelined
 * callers read in order, and leftovers are carried in *carry). */
struct conn_in {
    char buf[1 << 20];
    size_t have;
};

static int read_reply(int fd, struct conn_in *in, char **body)
{
    char *end;
    for (;;) {
        in->buf[in->have] = '\0';
        if ((end = strstr(in->buf, "\r\n\r\n")) != NULL)
            break;
        ck_assert_uint_lt(in->have, sizeof in->buf - 1);
        ssize_t n = recv(fd, in->buf + in->have, sizeof in->buf - 1 - in->have, 0);
        ck_assert_msg(n > 0, "the connection ended (or 10 s passed) before a reply's head: %zd", n);
        in->have += (size_t)n;
    }
    int status = 0;
    ck_assert_int_eq(sscanf(in->buf, "HTTP/1.1 %d", &status), 1);
    size_t head = (size_t)(end + 4 - in->buf), clen = 0;
    *end = '\0';
    const char *cl = strcasestr(in->buf, "Content-Length:");
    if (cl)
        clen = (size_t)strtoul(cl + 15, NULL, 10);
    while (in->have < head + clen) {
        ck_assert_uint_lt(in->have, sizeof in->buf - 1);
        ssize_t n = recv(fd, in->buf + in->have, sizeof in->buf - 1 - in->have, 0);
        ck_assert_msg(n > 0, "the connection ended (or 10 s passed) inside a reply's body: %zd", n);
        in->have += (size_t)n;
    }
    *body = malloc(clen + 1);
    memcpy(*body, in->buf + head, clen);
    (*body)[clen] = '\0';
    memmove(in->buf, in->buf + head + clen, in->have - head - clen);
    in->have -= head + clen;
    return status;
}

/* The body of an /acquire of n keys from first (over 4096 bytes from n = 48). */
static char *acquire_body(const char *scope, int64_t first, size_t n)
{
    char **names = calloc(n, sizeof *names);
    for (size_t i = 0; i < n; i++) {
        names[i] = malloc(128);
        snprintf(names[i], 128, "rtp_llm/v1/" DEP "/tp-0/group-0/block-%" PRId64, first + (int64_t)i);
    }
    char *b = kvsc_acquire_body(scope, (const char *const *)names, n, OBJ, 60);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    ck_assert_ptr_nonnull(b);
    return b;
}

/* The lease id and the number of objects of an /acquire reply. */
static size_t acquire_reply(const char *text, char *lease, size_t leaselen)
{
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    ck_assert_msg(j, "reply is not JSON: %s", err.text);
    const char *id = json_string_value(json_object_get(json_object_get(j, "lease"), "lease_id"));
    ck_assert_ptr_nonnull(id);
    snprintf(lease, leaselen, "%s", id);
    size_t n = json_array_size(json_object_get(j, "objects"));
    json_decref(j);
    return n;
}

/* The next reply on fd is a 200 to an /acquire of `objects` objects; its
 * lease id into lease. */
static void read_acquired(int fd, struct conn_in *in, char *lease, size_t leaselen, size_t objects)
{
    char *reply;
    ck_assert_int_eq(read_reply(fd, in, &reply), 200);
    ck_assert_uint_eq(acquire_reply(reply, lease, leaselen), objects);
    free(reply);
}

static void lease_call(int fd, struct conn_in *in, const char *route, const char *lease, int want)
{
    char b[256], *reply;
    size_t len;
    snprintf(b, sizeof b, "{\"lease_id\":\"%s\",\"request_id\":\"kvs_store_t\"}", lease);
    char *r = post(route, b, &len);
    send_all(fd, r, len);
    free(r);
    ck_assert_int_eq(read_reply(fd, in, &reply), want);
    free(reply);
}

START_TEST(kept_alive_connection_serves_request_after_request)
{
    static struct conn_in in;
    long long accepted = kvs_stat(&env, "http_connections.accepted_total");
    long long inl = kvs_stat(&env, "http_output.inline_total");
    long long extended = kvs_stat(&env, "http_input.reads_extended_total");
    long long early = kvs_stat(&env, "http_input.reads_early_total");
    char *reply, lease[160];
    size_t len;

    /* The daemon stopped while the client connects and sends: its request
     * is in the socket when the connection is accepted, and read then. */
    static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(kill(env.d.pid, SIGSTOP), 0);
    int fd = connect_tcp(0);
    send_all(fd, health, sizeof health - 1);
    ck_assert_int_eq(kill(env.d.pid, SIGCONT), 0);
    ck_assert_int_eq(read_reply(fd, &in, &reply), 200);
    ck_assert_ptr_nonnull(strstr(reply, "ok"));
    free(reply);

    /* A create of 64 keys (a body of about 6 KB, over one 4096-byte read),
     * sealed and released, then read back: all on the one connection. */
    char *b = acquire_body("create", 1000, 64), *r = post("acquire", b, &len);
    ck_assert_uint_gt(len, 4096);
    send_all(fd, r, len);
    free(r);
    free(b);
    read_acquired(fd, &in, lease, sizeof lease, 64);
    lease_call(fd, &in, "seal", lease, 204);
    lease_call(fd, &in, "release", lease, 204);

    b = acquire_body("read", 1000, 64);
    r = post("acquire", b, &len);
    send_all(fd, r, len);
    free(r);
    free(b);
    read_acquired(fd, &in, lease, sizeof lease, 64);
    lease_call(fd, &in, "release", lease, 204);
    lease_call(fd, &in, "release", lease, 404);   /* released: unknown now */
    ck_assert_uint_eq(in.have, 0);
    ck_assert_int_eq(kvs_stat(&env, "http_connections.accepted_total"), accepted + 1);
    /* Seven replies, each written in its own turn; the two 6 KB bodies each
     * arrived in one send, so at least one was read past 4096 bytes at once. */
    ck_assert_int_eq(kvs_stat(&env, "http_output.inline_total"), inl + 7);
    ck_assert_int_ge(kvs_stat(&env, "http_input.reads_extended_total"), extended + 1);
    ck_assert_int_eq(kvs_stat(&env, "http_input.reads_early_total"), early + 1);
    close(fd);
}
END_TEST

START_TEST(body_in_pieces_and_pipelined)
{
    static struct conn_in in;
    int fd = connect_tcp(0);
    char *reply, lease[160];
    size_t len;

    /* The request's head, then its body in three pieces 100 ms apart: the
     * front end reads what has come, waits for the rest. */
    char *b = acquire_body("create", 2000, 200), *r = post("acquire", b, &len);
    ck_assert_uint_gt(len, 3 * 4096);
    size_t cut[4] = { 0, 4000, 4096 + 5000, len };
    for (int i = 0; i < 3; i++) {
        send_all(fd, r + cut[i], cut[i + 1] - cut[i]);
        kvh_sleep_ms(100);
    }
    free(r);
    free(b);
    read_acquired(fd, &in, lease, sizeof lease, 200);
    lease_call(fd, &in, "discard", lease, 204);

    /* Two requests in one write: a /health, then a large /acquire behind it
     * (its first bytes land in the same read as the /health). */
    b = acquire_body("create", 3000, 100);
    r = post("acquire", b, &len);
    static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    char *both = malloc(sizeof health - 1 + len);
    memcpy(both, health, sizeof health - 1);
    memcpy(both + sizeof health - 1, r, len);
    send_all(fd, both, sizeof health - 1 + len);
    free(both);
    free(r);
    free(b);
    ck_assert_int_eq(read_reply(fd, &in, &reply), 200);
    ck_assert_ptr_nonnull(strstr(reply, "ok"));
    free(reply);
    read_acquired(fd, &in, lease, sizeof lease, 100);
    lease_call(fd, &in, "discard", lease, 204);
    ck_assert_uint_eq(in.have, 0);
    close(fd);
}
END_TEST

START_TEST(reply_larger_than_the_socket_takes)
{
    static struct conn_in in;
    int fd = connect_tcp(4096);
    char *reply, lease[160];
    size_t len;
    long long inl = kvs_stat(&env, "http_output.inline_total");

    /* 2000 keys: a reply of about 400 KB, far over what a 4 KiB receive
     * buffer lets the kernel take at once; the client reads it 300 ms
     * later, then sends its next request on the same connection. */
    char *b = acquire_body("create", 10000, 2000), *r = post("acquire", b, &len);
    send_all(fd, r, len);
    free(r);
    free(b);
    kvh_sleep_ms(300);
    ck_assert_int_eq(read_reply(fd, &in, &reply), 200);
    ck_assert_uint_gt(strlen(reply), 300000);
    ck_assert_int_eq(kvs_stat(&env, "http_output.inline_total"), inl);   /* not whole at once */
    ck_assert_uint_eq(acquire_reply(reply, lease, sizeof lease), 2000);
    free(reply);
    lease_call(fd, &in, "discard", lease, 204);
    ck_assert_uint_eq(in.have, 0);
    close(fd);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("kvs_http_turns");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, kept_alive_connection_serves_request_after_request);
    tcase_add_test(tc, body_in_pieces_and_pipelined);
    tcase_add_test(tc, reply_larger_than_the_socket_takes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
