/* Tenants on the engine socket (issue 27, items 2 and 5): what one tenant's
 * connections may take from another's, against a real daemon, scaled to
 * small configured limits.
 *
 * - per-tenant connection limits: tenant b holds every connection it may
 *   (its share of server.max_clients, like its memory) and the next is
 *   refused naming [tenant.b] max_clients; tenant a's engines still connect;
 * - the HELLO deadline: a connection that says nothing is closed after
 *   server.hello_timeout with an error naming it, and counted; one that said
 *   HELLO before it is not;
 * - STATS over the socket: a client of tenant b sees b's figures only, not
 *   a's usage (root and the admin /stats see every tenant);
 * - unread replies: a connection whose tenant's unread replies reach its
 *   share of server.max_buffered_output_bytes is closed, counted and logged
 *   naming the limit; the bytes it held are given back; past the node's
 *   bound a connection with nothing unread gets KVNODE_ELIMIT naming it
 *   for a GET_INLINE, and is served again once the replies are read.
 *
 * Acting as other users needs root (as test_daemon_tenants): run as root in
 * CI; elsewhere each test says so and passes without checking. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tenants_util.h"
#include "kvnode.pb-c.h"
#include "raw_request.h"

#define ALPHA 65534
#define BETA  65533
#define BLOCK (64u << 10)

/* Two tenants of 1 MiB each (25% of memory.host_bytes), "default" 2 MiB;
 * eight connections in all: a and b 2 each, "default" 4. */
#define CONNS_CONF \
    "server.socket_mode=0666\n" \
    "server.max_clients=8\n" \
    "memory.host_bytes=4MiB\n" \
    "memory.slab_bytes=1MiB\n" \
    "tenant.a.uids=65534\n" \
    "tenant.a.host_bytes=1MiB\n" \
    "tenant.b.uids=65533\n" \
    "tenant.b.host_bytes=1MiB\n"

static kvnode_layout layout(void)
{
    return kvh_layout("conns-model", BLOCK, 1, 0);
}

/* --- per-tenant connection limits --------------------------------------------- */

struct hog {
    const kvh_daemon *d;
    int ready[2];      /* the child writes how many it holds */
    int release[2];    /* the parent closes this to let it go */
};

/* As tenant b: connect until refused (at most 9), report how many were
 * served and whether the refusal named [tenant.b] max_clients = 2, then
 * hold them until released. */
static int hog_main(void *arg)
{
    struct hog *h = arg;
    kvnode_layout l = layout();
    kvnode_client *c[9];
    int n = 0, named = 0;
    close(h->ready[0]);
    close(h->release[1]);
    while (n < 9) {
        int rc = kvnode_connect(h->d->sock, &l, &c[n]);
        if (rc != 0) {
            named = rc == -KVNODE_ELIMIT && strstr(kvnode_connect_error(), "[tenant.b] max_clients = 2") != NULL;
            if (!named)
                fprintf(stderr, "tenant b: connection %d refused: %d %s\n", n + 1, rc, kvnode_connect_error());
            break;
        }
        n++;
    }
    unsigned char msg[2] = { (unsigned char)n, (unsigned char)named };
    if (write(h->ready[1], msg, 2) != 2)
        return 3;
    char b;
    ssize_t r = read(h->release[0], &b, 1);   /* EOF: released */
    (void)r;
    for (int i = 0; i < n; i++)
        kvnode_close(c[i]);
    return 0;
}

/* As tenant a: an engine connects, puts and pings. */
static int engine_main(void *arg)
{
    const kvh_daemon *d = arg;
    kvnode_layout l = layout();
    kvnode_client *c;
    if (kvnode_connect(d->sock, &l, &c) != 0) {
        fprintf(stderr, "tenant a: connect: %s\n", kvnode_connect_error());
        return 10;
    }
    kvnode_key k;
    kvh_chain(&k, 1, 5);
    int rc = kvh_put(c, &k, 1, 5) == 0 && kvnode_ping(c) == 0 ? 0 : 11;
    kvnode_close(c);
    return rc;
}

START_TEST(idle_tenant_cannot_lock_out_another)
{
    TENANTS_NEEDS_ROOT("tenant conns: the connection-share test");
    kvh_daemon d;
    tenants_start(&d, CONNS_CONF);
    struct hog h = { .d = &d };
    ck_assert_int_eq(pipe(h.ready), 0);
    ck_assert_int_eq(pipe(h.release), 0);
    pid_t pid = tenants_spawn_as(hog_main, &h, BETA, BETA, NULL, 0);
    close(h.ready[1]);
    close(h.release[0]);
    unsigned char msg[2] = { 0, 0 };
    ck_assert_int_eq(read(h.ready[0], msg, 2), 2);
    /* b holds its share of the eight, and no more. */
    ck_assert_msg(msg[0] == 2, "tenant b holds %u connections (its share of server.max_clients = 8 is 2)", msg[0]);
    ck_assert_msg(msg[1] == 1, "tenant b's refusal did not name [tenant.b] max_clients = 2");
    ck_assert_int_eq(tenants_stat(&d, "b", "clients"), 2);
    ck_assert_int_eq(tenants_stat(&d, "b", "refused_total"), 1);
    ck_assert_int_eq(tenants_stat(&d, "b", "max_clients"), 2);
    ck_assert_int_eq(tenants_stat(&d, "a", "max_clients"), 2);
    ck_assert_int_eq(tenants_stat(&d, "default", "max_clients"), 4);
    /* ... and a's engines connect meanwhile. */
    int st = tenants_status_as(engine_main, &d, ALPHA, 20000);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tenant a while b holds its connections: status %d", st);
    close(h.release[1]);
    st = proc_wait(&pid, 20000);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tenant b: status %d", st);
    close(h.ready[0]);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* --- the HELLO deadline ----------------------------------------------------------- */

START_TEST(silent_connection_closed_at_hello_deadline)
{
    kvh_daemon d;
    KVH_START(&d, "server.hello_timeout=2s\n");   /* long enough for eng's HELLO under valgrind */
    kvnode_layout l = layout();
    kvnode_client *eng;
    KVH_CONNECT(&d, &l, &eng);          /* said HELLO: its deadline passes first, harmlessly */
    int fd = kvh_raw_connect(d.sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());
    uint8_t *payload = NULL;
    uint32_t len = 0;
    ck_assert_msg(kvh_raw_recv_frame(fd, &payload, &len, 1u << 16, 10000) == 1, "no error frame: %s",
                  kvh_error());
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_msg(resp && resp->error && resp->error->code == -KVNODE_ETIMEDOUT &&
                  strstr(resp->error->message, "server.hello_timeout"),
                  "expected ETIMEDOUT naming server.hello_timeout, got %s",
                  resp && resp->error ? resp->error->message : "no error");
    kvnode__response__free_unpacked(resp, NULL);
    ck_assert_int_eq(kvh_raw_wait_eof(fd, 5000), 0);
    close(fd);
    KVH_OK(eng, kvnode_ping(eng));
    ck_assert_int_eq(KVH_STAT(&d, "clients.hello_timeouts_total"), 1);
    ck_assert_int_eq(KVH_STAT(&d, "clients.connected"), 2);   /* eng and the stats' own */
    kvnode_close(eng);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* --- STATS shows a tenant its own ---------------------------------------------- */

static int stats_as_b(void *arg)
{
    const kvh_daemon *d = arg;
    kvnode_client *c;
    if (kvnode_connect(d->sock, NULL, &c) != 0)
        return 10;
    json_t *st = kvh_stats_client(c);
    kvnode_close(c);
    if (!st)
        return 11;
    int rc = 0;
    json_t *arr = kvh_json_get(st, "tenants");
    if (!arr || json_array_size(arr) != 1 ||
        strcmp(json_string_value(json_object_get(json_array_get(arr, 0), "name")), "b") != 0) {
        fprintf(stderr, "tenant b sees tenants %s\n", arr ? json_dumps(arr, JSON_COMPACT) : "(none)");
        rc = 12;
    } else if (kvh_json_int(st, "tiers.host.used_bytes") != 0 || kvh_json_int(st, "tiers.host.blocks") != 0 ||
               kvh_json_int(st, "tiers.host.capacity_bytes") != 1 << 20 ||
               kvh_json_int_or(st, "keys.matched_total", 0) != 0) {
        fprintf(stderr, "tenant b sees host %lld used bytes, %lld blocks, capacity %lld, %lld keys matched\n",
                kvh_json_int(st, "tiers.host.used_bytes"), kvh_json_int(st, "tiers.host.blocks"),
                kvh_json_int(st, "tiers.host.capacity_bytes"), kvh_json_int_or(st, "keys.matched_total", 0));
        rc = 13;
    }
    json_decref(st);
    return rc;
}

START_TEST(stats_shows_a_tenant_only_its_own)
{
    TENANTS_NEEDS_ROOT("tenant conns: the STATS view test");
    kvh_daemon d;
    tenants_start(&d, CONNS_CONF);
    int st = tenants_status_as(engine_main, &d, ALPHA, 20000);   /* a puts one block */
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tenant a: status %d", st);
    ck_assert_int_eq(tenants_stat(&d, "a", "blocks"), 1);
    st = tenants_status_as(stats_as_b, &d, BETA, 20000);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tenant b's STATS: status %d", st);
    /* root sees everybody */
    json_t *s = kvh_stats(&d);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(json_array_size(kvh_json_get(s, "tenants")), 3);
    ck_assert_int_eq(kvh_json_int(s, "tiers.host.blocks"), 1);
    json_decref(s);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* --- unread replies: a total per tenant and per node ---------------------------- */

#define OUT_BLOCK (1u << 20)
#define OUT_REQUESTS 64
#define OUT_NODE  (16ll << 20)   /* server.max_buffered_output_bytes */
#define OUT_SHARE (8ll << 20)    /* "default"'s share: what a and b (25% each) leave */
#define SOCKBUF   (4ll << 20)    /* more than a unix socket's send buffer holds */

START_TEST(unread_replies_bounded_by_the_tenants_share)
{
    kvh_daemon d;
    KVH_START(&d, "server.max_buffered_output_bytes=16MiB\nmemory.host_bytes=8MiB\nmemory.slab_bytes=1MiB\n"
                  "tenant.a.uids=65534\ntenant.a.host_bytes=25%\ntenant.b.uids=65533\ntenant.b.host_bytes=25%\n");
    kvnode_client *obs;
    KVH_CONNECT(&d, NULL, &obs);
    kvnode_layout lay = kvh_layout("conns-out", OUT_BLOCK, 1, 0);
    kvnode_client *w;
    KVH_CONNECT(&d, &lay, &w);
    kvnode_key key;
    kvh_chain(&key, 1, 7);
    ck_assert_msg(kvh_put(w, &key, 1, 7) == 0, "%s", kvh_error());

    int fd = kvh_raw_connect(d.sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());
    raw_hello(fd, &lay, "conns-test");
    /* OUT_REQUESTS GET_INLINE of a 1 MiB block in one write, and no read. */
    raw_send_get_inline_burst(fd, key, OUT_REQUESTS);

    /* Closed once default's unread replies reached its share: counted, and
     * what it held given back. */
    long long last;
    ck_assert_msg(kvh_wait_stat(&d, "clients.output_limit_closed_total", 1, 20000, &last) == 0,
                  "clients.output_limit_closed_total = %lld", last);
    json_t *st = kvh_stats_client(obs);
    ck_assert_ptr_nonnull(st);
    long long handled = kvh_json_int_or(st, "requests.get_inline.ok", 0);
    json_decref(st);
    ck_assert_msg(handled <= (OUT_SHARE + SOCKBUF) / OUT_BLOCK + 1, "%lld GET_INLINE of 1 MiB handled for a client "
                  "that reads nothing (its tenant's share %lld)", handled, OUT_SHARE);
    ck_assert_int_eq(kvh_raw_wait_eof(fd, 10000), 0);
    close(fd);
    ck_assert_int_eq(kvh_wait_stat(&d, "clients.output_buffered_bytes", 0, 10000, &last), 0);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, "server.max_buffered_output_bytes"), "the close is not logged naming the limit");
    free(log);
    /* The others go on. */
    KVH_OK(obs, kvnode_ping(obs));
    size_t got;
    ck_assert_msg(kvh_get_verify(w, &key, 1, 7, 1, &got) == 0 && got == 1, "%s", kvh_error());
    kvnode_close(w);
    kvnode_close(obs);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* Past the node's bound, a connection with nothing unread of its own gets
 * its request for block bytes refused naming the limit (its small requests,
 * the stats' HELLO and STATS here, are served), and is served again once
 * the replies are read. */
#define BIG_BLOCK (8u << 20)

static Kvnode__Response *recv_response(int fd, uint32_t max)
{
    uint8_t *payload;
    uint32_t len;
    ck_assert_msg(kvh_raw_recv_frame(fd, &payload, &len, max, 10000) == 1, "%s", kvh_error());
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_ptr_nonnull(resp);
    return resp;
}

static void send_get_inline(int fd, uint64_t id, kvnode_key key)
{
    int64_t keys[1] = { key };
    Kvnode__GetInlineRequest g = KVNODE__GET_INLINE_REQUEST__INIT;
    g.n_keys = 1;
    g.keys = keys;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    req.id = id;
    req.op_case = KVNODE__REQUEST__OP_GET_INLINE;
    req.get_inline = &g;
    raw_send_request(fd, &req);
}

/* A GET_INLINE reply of the one BIG_BLOCK, byte-exact. */
static void expect_block(int fd, uint64_t id, kvnode_key key)
{
    Kvnode__Response *resp = recv_response(fd, BIG_BLOCK + (1u << 16));
    ck_assert_msg(!resp->error && resp->id == id && resp->result_case == KVNODE__RESPONSE__RESULT_GET_INLINE &&
                  resp->get_inline->n_blocks == 1 && resp->get_inline->blocks[0].len == BIG_BLOCK,
                  "reply %llu: %s", (unsigned long long)id, resp->error ? resp->error->message : "not the block");
    ck_assert_int_eq(kvh_verify(resp->get_inline->blocks[0].data, BIG_BLOCK, key, 9), 0);
    kvnode__response__free_unpacked(resp, NULL);
}

START_TEST(others_refused_past_the_node_bound_until_replies_are_read)
{
    kvh_daemon d;
    KVH_START(&d, "server.max_buffered_output_bytes=1MiB\nmemory.host_bytes=32MiB\n");
    kvnode_layout lay = kvh_layout("conns-big", BIG_BLOCK, 1, 0);
    kvnode_client *w;
    KVH_CONNECT(&d, &lay, &w);
    kvnode_key key;
    kvh_chain(&key, 1, 9);
    ck_assert_msg(kvh_put(w, &key, 1, 9) == 0, "%s", kvh_error());
    kvnode_close(w);

    int hog = kvh_raw_connect(d.sock), other = kvh_raw_connect(d.sock);
    ck_assert_msg(hog >= 0 && other >= 0, "%s", kvh_error());
    raw_hello(hog, &lay, "conns-test");
    raw_hello(other, &lay, "conns-test");
    /* One 8 MiB reply, unread: far more than the socket takes, past 1 MiB. */
    send_get_inline(hog, 1, key);
    long long last;
    ck_assert_msg(kvh_wait_stat(&d, "requests.get_inline.ok", 1, 10000, &last) == 0, "get_inline.ok %lld", last);

    send_get_inline(other, 2, key);
    Kvnode__Response *resp = recv_response(other, 1u << 16);
    ck_assert_msg(resp->error && resp->error->code == -KVNODE_ELIMIT &&
                  strstr(resp->error->message, "server.max_buffered_output_bytes"),
                  "expected ELIMIT naming server.max_buffered_output_bytes, got %s",
                  resp->error ? resp->error->message : "a reply");
    kvnode__response__free_unpacked(resp, NULL);
    ck_assert_int_eq(KVH_STAT(&d, "clients.output_limit_refused_total"), 1);
    ck_assert_int_eq(KVH_STAT(&d, "clients.output_limit_closed_total"), 0);

    /* The hog reads its reply, whole: then the other is served. */
    expect_block(hog, 1, key);
    ck_assert_int_eq(kvh_wait_stat(&d, "clients.output_buffered_bytes", 0, 10000, &last), 0);
    send_get_inline(other, 3, key);
    expect_block(other, 3, key);
    close(hog);
    close(other);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    setenv("KVNODE_TIMEOUT_MS", "5000", 0);
    const TTest *const tests[] = {
        idle_tenant_cannot_lock_out_another,
        silent_connection_closed_at_hello_deadline,
        stats_shows_a_tenant_only_its_own,
        unread_replies_bounded_by_the_tenants_share,
        others_refused_past_the_node_bound_until_replies_are_read,
    };
    return kvh_run_suite("daemon_tenant_conns", "tenant_conns", 120, tests, sizeof tests / sizeof tests[0]);
}
