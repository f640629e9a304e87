/* Integration: the KVS front end when the store stalls under waiting creates
 * (issue 30, item 7). A real kvnoded with [kvs_server] on, a small host tier
 * (4 MiB, 64 blocks of 64 KiB) and persist.backend=redis on one real
 * redis-server that is then stopped (SIGSTOP): every sealed block waits for
 * its write, the tier fills with them, and a create must wait for room
 * ([server] request_timeout) and then answers 503.
 *
 * Asserted: the daemon lives through the waits, the 503s and the HTTP
 * request deadline after them (kvs_server.request_timeout; a waiting create
 * once replaced httpd's close callback, the connection was freed twice and
 * kvnoded died); a client that closes while its create waits gives its slot
 * back during the wait (the wait is dropped, not run to its deadline); every
 * HTTP connection slot is given back (kvs_server.http_connections.open
 * returns to 0); /health, PING and a create after the store resumes work;
 * and a daemon stopped while a create waits exits cleanly. */
#include <check.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "../common/redisctl.h"

#define BB          (64u << 10)
#define WAIT_MS     5000   /* [server] request_timeout: how long a create waits for room */
#define HTTP_MS     1000   /* kvs_server.request_timeout: the HTTP request deadline */
#define NGIVEUP     4      /* clients that close while their create waits */
#define NWAIT       4      /* clients that wait for the 503 */

typedef struct stall_env {
    kvh_daemon d;
    struct rctl redis;
    char url[200];
} stall_env;

static void env_start(stall_env *e)
{
    char conf[2048];
    memset(e, 0, sizeof *e);
    ck_assert_msg(rctl_start(&e->redis, 0, 0, NULL, NULL) == 0, "redis-server: %s", rctl_err);
    snprintf(conf, sizeof conf,
             "memory.host_bytes=4MiB\nmemory.slab_bytes=1MiB\n"
             "persist.backend=redis\npersist.nodes=%s\npersist.policy=write_through\n"
             "persist.connect_timeout=300ms\npersist.timeout=120s\n"
             "server.request_timeout=%ums\nserver.shutdown_timeout=1s\n"
             "kvs_server.enabled=on\nkvs_server.listen=127.0.0.1:0\nkvs_server.socket_path=%s/kvs.sock\n"
             "kvs_server.request_timeout=%ums\n",
             e->redis.seeds, WAIT_MS, e->redis.dir, HTTP_MS);
    KVH_START(&e->d, conf);
    json_t *st = kvh_stats(&e->d);
    ck_assert_ptr_nonnull(st);
    const char *addr = json_string_value(kvh_json_get(st, "kvs_server.http_address"));
    ck_assert_msg(addr && strncmp(addr, "127.0.0.1:", 10) == 0, "kvs_server.http_address: %s", addr ? addr : "-");
    snprintf(e->url, sizeof e->url, "http://%s", addr);
    json_decref(st);
}

static long long stat_of(stall_env *e, const char *path)
{
    long long v = kvh_stat(&e->d, path);
    ck_assert_msg(v >= 0, "stat %s: %s (is kvnoded alive? see its log)", path, kvh_error());
    return v;
}

static void wait_stat_eq(stall_env *e, const char *path, long long want, const char *why)
{
    long long last = -1;
    ck_assert_msg(kvh_wait_stat(&e->d, path, want, 15000, &last) == 0, "%s = %lld, not %lld after 15 s: %s", path,
                  last, want, why);
}

static void wait_stat_ge(stall_env *e, const char *path, long long want)
{
    uint64_t deadline = kvh_now_ms() + 15000;
    long long v;
    while ((v = stat_of(e, path)) < want) {
        ck_assert_msg(kvh_now_ms() < deadline, "%s = %lld, still below %lld after 15 s", path, v, want);
        kvh_sleep_ms(20);
    }
}

/* An acquire(create) body of n keys from first, objects of BB bytes. */
static char *create_body(int64_t first, size_t n)
{
    char keys[16][96];
    const char *k[16];
    ck_assert(n <= 16);
    for (size_t i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], "rtp_llm/v1/stall-0123456789/tp-0/group-0/block-%" PRId64,
                 first + (int64_t)i);
        k[i] = keys[i];
    }
    return kvsc_acquire_body("create", k, n, BB, 60);
}

/* ---- raw HTTP/1.1 on TCP: clients that wait, give up, or keep their connection ---------- */

static int http_open(const char *url)
{
    unsigned port = 0;
    ck_assert_msg(sscanf(url, "http://127.0.0.1:%u", &port) == 1, "url %s", url);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void http_post(int fd, const char *route, const char *body)
{
    char head[256];
    int n = snprintf(head, sizeof head, "POST /%s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n", route, strlen(body));
    ck_assert(n > 0 && (size_t)n < sizeof head);
    ck_assert_int_eq(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
    ck_assert_int_eq(send(fd, body, strlen(body), MSG_NOSIGNAL), (ssize_t)strlen(body));
}

/* Read one reply within timeout_ms: its status (its body into buf), 0 when
 * the connection closed before one, -1 on timeout. */
static int http_reply(int fd, int timeout_ms, char *buf, size_t len)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    size_t got = 0;
    char *end = NULL;
    long clen = -1;

    buf[0] = '\0';
    for (;;) {
        if (!end && (end = strstr(buf, "\r\n\r\n")) != NULL) {
            const char *cl = strcasestr(buf, "Content-Length:");
            clen = cl && cl < end ? strtol(cl + 15, NULL, 10) : 0;
        }
        if (end && got >= (size_t)(end + 4 - buf) + (size_t)clen)
            break;
        int left = (int)(deadline - kvh_now_ms());
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (kvh_now_ms() >= deadline || poll(&p, 1, left) <= 0)
            return -1;
        ssize_t n = recv(fd, buf + got, len - 1 - got, 0);
        if (n <= 0)
            return got ? -1 : 0;
        got += (size_t)n;
        buf[got] = '\0';
        ck_assert_msg(got < len - 1, "reply longer than %zu bytes", len);
    }
    int status = 0;
    ck_assert_msg(sscanf(buf, "HTTP/1.1 %d", &status) == 1, "not an HTTP reply: %.200s", buf);
    memmove(buf, end + 4, strlen(end + 4) + 1);
    return status;
}

/* Nothing has arrived on fd yet (no reply, not closed). */
static bool http_quiet(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, 0) == 0;
}

/* kvnoded is running, answers PING on its socket and /health on the front
 * end. */
static void alive(stall_env *e, const char *when)
{
    int st = kvh_wait_exit(&e->d, 0);
    ck_assert_msg(st == KVH_EXIT_TIMEOUT, "kvnoded died %s: status %d (128 + signal; see its log)", when, st);
    kvnode_client *obs;
    KVH_CONNECT(&e->d, NULL, &obs);
    KVH_OK(obs, kvnode_ping(obs));
    kvnode_close(obs);
    kvsc_reply r;
    ck_assert_int_eq(kvsc_call(e->url, "health", NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    kvsc_reply_free(&r);
}

/* Create and seal batches of 8 objects until a create has to wait for room
 * and answers 503 (the tier is full of blocks waiting for the stopped
 * store); how many objects were stored. */
static int fill_the_tier(stall_env *e)
{
    int stored = 0;
    for (int b = 0; b < 16; b++) {
        char *body = create_body(1000 + b * 8, 8);
        kvsc_reply r;
        ck_assert_int_eq(kvsc_call(e->url, "acquire", body, &r), 0);
        free(body);
        if (r.status == 503) {
            const char *msg = json_string_value(json_object_get(r.body, "error"));
            ck_assert_msg(msg && strstr(msg, "request_timeout"), "503 without the wait: %s", msg ? msg : "-");
            kvsc_reply_free(&r);
            return stored;
        }
        ck_assert_int_eq(r.status, 200);
        ck_assert_uint_eq(json_array_size(json_object_get(r.body, "objects")), 8);
        char lease[64];
        snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
        kvsc_reply_free(&r);
        kvsc c = { .fd = -1 };
        snprintf(c.url, sizeof c.url, "%s", e->url);
        ck_assert_int_eq(kvsc_lease_call(&c, "seal", lease), 204);
        ck_assert_int_eq(kvsc_lease_call(&c, "release", lease), 204);
        stored += 8;
    }
    ck_abort_msg("128 objects of 64 KiB fit in a 4 MiB host tier with the store stopped");
    return -1;
}

START_TEST(waiting_creates_survive_a_stalled_store)
{
    stall_env e;
    env_start(&e);
    ck_assert_int_eq(kill(e.redis.pids[0], SIGSTOP), 0);
    int stored = fill_the_tier(&e);
    ck_assert_int_ge(stored, 8);
    /* The create that waited and got 503 (its client closed): alive past
     * the HTTP deadline armed after that reply, and its slot given back. */
    kvh_sleep_ms(2 * HTTP_MS + 500);
    alive(&e, "after the first 503 and the HTTP deadline after it");
    wait_stat_eq(&e, "kvs_server.http_connections.open", 0, "the slot of the create that waited leaked");

    /* Waiting creates: NGIVEUP clients give up (close) while they wait,
     * NWAIT wait for their 503. */
    int giveup[NGIVEUP], waiter[NWAIT];
    long long waits0 = stat_of(&e, "persist.put_waits_total");
    for (int i = 0; i < NGIVEUP + NWAIT; i++) {
        int fd = http_open(e.url);
        char *body = create_body(5000 + i, 1);
        http_post(fd, "acquire", body);
        free(body);
        if (i < NGIVEUP)
            giveup[i] = fd;
        else
            waiter[i - NGIVEUP] = fd;
    }
    wait_stat_ge(&e, "persist.put_waits_total", waits0 + NGIVEUP + NWAIT);
    ck_assert_int_eq(stat_of(&e, "kvs_server.http_connections.open"), NGIVEUP + NWAIT);
    for (int i = 0; i < NGIVEUP; i++)
        close(giveup[i]);
    /* Their slots come back while the others still wait (the waits of the
     * ones that left are dropped, not run to the deadline). */
    wait_stat_eq(&e, "kvs_server.http_connections.open", NWAIT, "the clients that gave up keep their slots");
    for (int i = 0; i < NWAIT; i++)
        ck_assert_msg(http_quiet(waiter[i]), "waiter %d was answered before the clients that left were noticed", i);

    /* The others get 503 at the deadline. Half close at once; half keep the
     * connection idle until the HTTP request deadline closes it. */
    char buf[4096];
    long long timed_out0 = stat_of(&e, "kvs_server.http_connections.timed_out_total");
    for (int i = 0; i < NWAIT; i++) {
        int st = http_reply(waiter[i], WAIT_MS + 15000, buf, sizeof buf);
        ck_assert_msg(st == 503, "waiting create %d: status %d (0: closed, -1: no reply) %s", i, st, buf);
        ck_assert_msg(strstr(buf, "request_timeout"), "waiting create %d: %s", i, buf);
        if (i % 2 == 0)
            close(waiter[i]);
    }
    for (int i = 1; i < NWAIT; i += 2) {
        ck_assert_int_eq(http_reply(waiter[i], HTTP_MS + 15000, buf, sizeof buf), 0);
        close(waiter[i]);
    }
    ck_assert_int_eq(stat_of(&e, "kvs_server.http_connections.timed_out_total") - timed_out0, NWAIT / 2);

    /* Every slot given back, and the daemon alive past every deadline
     * armed after those replies (the double free came one deadline later). */
    wait_stat_eq(&e, "kvs_server.http_connections.open", 0, "connection slots leaked");
    kvh_sleep_ms(2 * HTTP_MS + 500);
    alive(&e, "after the waiting creates and the HTTP deadlines after them");
    wait_stat_eq(&e, "kvs_server.http_connections.open", 0, "the /health connection's slot");
    kvsc_reply r;

    /* The store resumes: its writes land and a create gets room again. */
    ck_assert_int_eq(kill(e.redis.pids[0], SIGCONT), 0);
    char *body = create_body(9000, 8);
    ck_assert_int_eq(kvsc_call(e.url, "acquire", body, &r), 0);
    free(body);
    ck_assert_msg(r.status == 200, "create after the store resumed: %ld", r.status);
    kvsc_reply_free(&r);
    wait_stat_eq(&e, "kvs_server.http_connections.open", 0, "the last create's slot");
    KVH_STOP_DESTROY(&e.d);
    rctl_stop(&e.redis);
}
END_TEST

/* Stopped while a create waits: the daemon closes the connection, drops the
 * wait once, and exits 0 (under ASan: nothing freed twice, nothing leaked). */
START_TEST(stop_while_a_create_waits)
{
    stall_env e;
    env_start(&e);
    ck_assert_int_eq(kill(e.redis.pids[0], SIGSTOP), 0);
    ck_assert_int_ge(fill_the_tier(&e), 8);
    long long waits0 = stat_of(&e, "persist.put_waits_total");
    int fd = http_open(e.url);
    char *body = create_body(7000, 1);
    http_post(fd, "acquire", body);
    free(body);
    wait_stat_ge(&e, "persist.put_waits_total", waits0 + 1);
    /* The store resumes once the daemon has begun stopping, so that what it
     * has queued drains (its workers wait out persist.timeout on a stopped
     * server); the front end is closed first. */
    ck_assert_int_eq(kill(e.d.pid, SIGTERM), 0);
    char buf[4096];
    ck_assert_int_ge(http_reply(fd, 15000, buf, sizeof buf), 0);   /* closed (or answered), not left hanging */
    close(fd);
    ck_assert_int_eq(kill(e.redis.pids[0], SIGCONT), 0);
    int st = kvh_wait_exit(&e.d, 20000);
    if (st != 0)
        kvh_print_log(&e.d, "stop while a create waits");
    ck_assert_msg(st == 0, "kvnoded stopped while a create waited: status %d", st);
    kvh_destroy(&e.d);
    rctl_stop(&e.redis);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = { waiting_creates_survive_a_stalled_store, stop_while_a_create_waits };
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return kvh_run_suite("kvs_stall", "kvs_stall", 90, tests, sizeof tests / sizeof tests[0]);
}
