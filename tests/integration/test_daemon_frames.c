/* Integration: malformed, oversized and out-of-order frames on a raw socket.
 *
 * Each case talks to the daemon without libkvnode. Frames that cannot be
 * handled (length over max_frame_bytes, zero length, undecodable protobuf)
 * get an error response with id 0 and the connection is closed; a frame cut
 * short by a close is simply dropped. A decodable request before HELLO gets
 * ESTATE under its own id, and the connection may then HELLO; an unknown op
 * gets an error under its id and the connection keeps working. After every
 * case a libkvnode client connected before it, and one connected after it,
 * are served normally, frames.rejected_total counts the rejected frames, and
 * the raw connection is gone from clients.connected. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvnode.pb-c.h"
#include "raw_request.h"

#define BB 4096
#define MAX_FRAME (1u << 20)

struct fixture {
    kvh_daemon d;
    kvnode_client *before;
    kvnode_key keys[4];
    long long connected0;   /* clients.connected with `before` and the stats observer */
};

static void setup(struct fixture *f)
{
    KVH_START(&f->d, "server.max_frame_bytes=1MiB\n");
    kvnode_layout l = kvh_layout("frames", BB, 1, 0);
    KVH_CONNECT(&f->d, &l, &f->before);
    kvh_chain(f->keys, 4, 1);
    int rc = kvh_put(f->before, f->keys, 4, 1);
    ck_assert_msg(rc == 0, "%s", kvh_error());
    f->connected0 = KVH_STAT(&f->d, "clients.connected");
}

static void assert_served(struct fixture *f, const char *after)
{
    size_t got;
    int rc = kvnode_ping(f->before);
    ck_assert_msg(rc == 0, "after %s: ping on the earlier client -> %d: %s", after, rc,
                  kvnode_last_error(f->before));
    rc = kvh_get_zc_verify(f->before, f->keys, 4, 1, &got);
    ck_assert_msg(rc == 0 && got == 4, "after %s: earlier client get: rc %d got %zu: %s", after, rc, got,
                  kvh_error());
    kvnode_layout l = kvh_layout("frames", BB, 1, 0);
    kvnode_client *c;
    rc = kvh_connect(&f->d, &l, &c);
    ck_assert_msg(rc == 0, "after %s: new client: %s", after, kvh_error());
    rc = kvh_get_verify(c, f->keys, 4, 1, 1, &got);
    ck_assert_msg(rc == 0 && got == 4, "after %s: new client get_inline: rc %d got %zu: %s", after, rc, got,
                  kvh_error());
    kvnode_close(c);
    long long last;
    ck_assert_msg(kvh_wait_stat(&f->d, "clients.connected", f->connected0, 3000, &last) == 0,
                  "after %s: clients.connected = %lld, expected %lld (connection not cleaned up)", after,
                  last, f->connected0);
}

static void teardown(struct fixture *f)
{
    kvnode_close(f->before);
    KVH_STOP_DESTROY(&f->d);
}

/* Receive one response and unpack it (the caller frees). */
static Kvnode__Response *recv_response(int fd, const char *what)
{
    uint8_t *payload;
    uint32_t len;
    int r = kvh_raw_recv_frame(fd, &payload, &len, 16u << 20, 5000);
    ck_assert_msg(r == 1, "%s: no response frame (%s)", what, r == 0 ? "connection closed" : kvh_error());
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_msg(resp != NULL, "%s: the daemon's response does not decode", what);
    return resp;
}

static void expect_error(int fd, uint64_t id, int code, const char *what)
{
    Kvnode__Response *resp = recv_response(fd, what);
    ck_assert_msg(resp->id == id, "%s: response id %llu, expected %llu", what, (unsigned long long)resp->id,
                  (unsigned long long)id);
    ck_assert_msg(resp->error != NULL, "%s: response without an error", what);
    if (code)
        ck_assert_msg(resp->error->code == code, "%s: error code %d (%s), expected %d (%s): %s", what,
                      resp->error->code, kvnode_strerror(resp->error->code), code, kvnode_strerror(code),
                      resp->error->message);
    else
        ck_assert_msg(resp->error->code < 0, "%s: error code %d is not negative", what, resp->error->code);
    ck_assert_msg(resp->error->message && resp->error->message[0], "%s: error without a message", what);
    kvnode__response__free_unpacked(resp, NULL);
}

/* A frame the daemon must reject: error response id 0 + close. */
static void rejected_frame(const void *bytes, size_t len, int code, const char *what)
{
    struct fixture f;
    setup(&f);
    long long rejected0 = KVH_STAT(&f.d, "frames.rejected_total");

    int fd = kvh_raw_connect(f.d.sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());
    ck_assert_msg(kvh_raw_send(fd, bytes, len) == 0, "%s: %s", what, kvh_error());
    expect_error(fd, 0, code, what);
    ck_assert_msg(kvh_raw_wait_eof(fd, 5000) == 0, "%s: %s", what, kvh_error());
    close(fd);

    ck_assert_int_gt(KVH_STAT(&f.d, "frames.rejected_total"), rejected0);
    assert_served(&f, what);
    teardown(&f);
}

START_TEST(length_over_max_frame_bytes)
{
    uint32_t n = MAX_FRAME + 1;
    uint8_t hdr[4] = { (uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24) };
    rejected_frame(hdr, 4, -KVNODE_ETOOBIG, "length max_frame_bytes+1");
}
END_TEST

START_TEST(length_huge)
{
    uint8_t hdr[4] = { 0xff, 0xff, 0xff, 0xff };
    rejected_frame(hdr, 4, -KVNODE_ETOOBIG, "length 4 GiB-1");
}
END_TEST

START_TEST(zero_length)
{
    uint8_t hdr[4] = { 0, 0, 0, 0 };
    rejected_frame(hdr, 4, -KVNODE_EPROTO, "zero length");
}
END_TEST

START_TEST(garbage_protobuf)
{
    uint8_t frame[4 + 16];
    frame[0] = 16;
    frame[1] = frame[2] = frame[3] = 0;
    memset(frame + 4, 0xff, 16);   /* invalid wire types, runaway varints */
    rejected_frame(frame, sizeof frame, -KVNODE_EPROTO, "garbage protobuf");
}
END_TEST

START_TEST(truncated_frame_then_close)
{
    struct fixture f;
    setup(&f);
    int fd = kvh_raw_connect(f.d.sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());
    uint8_t frame[4 + 10] = { 100, 0, 0, 0 };   /* announces 100 bytes, sends 10 */
    memset(frame + 4, 0x08, 10);
    ck_assert_int_eq(kvh_raw_send(fd, frame, sizeof frame), 0);
    kvh_sleep_ms(20);
    close(fd);
    assert_served(&f, "truncated frame then close");

    /* Same with a header cut in the middle. */
    fd = kvh_raw_connect(f.d.sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());
    ck_assert_int_eq(kvh_raw_send(fd, frame, 2), 0);
    kvh_sleep_ms(20);
    close(fd);
    assert_served(&f, "truncated header then close");
    teardown(&f);
}
END_TEST

START_TEST(estate_before_hello_then_unknown_op)
{
    struct fixture f;
    setup(&f);
    long long rejected0 = KVH_STAT(&f.d, "frames.rejected_total");
    int fd = kvh_raw_connect(f.d.sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());

    /* MATCH before HELLO: ESTATE under the request's id. */
    int64_t keys[2] = { 1, 2 };
    Kvnode__MatchRequest mreq = KVNODE__MATCH_REQUEST__INIT;
    mreq.n_keys = 2;
    mreq.keys = keys;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    req.id = 42;
    req.op_case = KVNODE__REQUEST__OP_MATCH;
    req.match = &mreq;
    raw_send_request(fd, &req);
    expect_error(fd, 42, -KVNODE_ESTATE, "match before HELLO");

    /* The connection is still usable: HELLO as an observer. */
    Kvnode__HelloRequest hreq = KVNODE__HELLO_REQUEST__INIT;
    hreq.min_version = 1;
    hreq.max_version = 1;
    hreq.client_name = (char *)"raw-frames-test";
    hreq.cuda_device = -1;
    Kvnode__Request hello = KVNODE__REQUEST__INIT;
    hello.id = 43;
    hello.op_case = KVNODE__REQUEST__OP_HELLO;
    hello.hello = &hreq;
    raw_send_request(fd, &hello);
    Kvnode__Response *resp = recv_response(fd, "HELLO after ESTATE");
    ck_assert_msg(resp->error == NULL, "HELLO failed: %d %s", resp->error ? resp->error->code : 0,
                  resp->error ? resp->error->message : "");
    ck_assert_uint_eq(resp->id, 43);
    ck_assert_int_eq(resp->result_case, KVNODE__RESPONSE__RESULT_HELLO);
    ck_assert_uint_eq(resp->hello->version, 1);
    kvnode__response__free_unpacked(resp, NULL);

    /* A request with an op this daemon does not know (field 99): an error
     * under its id. Encoded by hand: id = 44, then field 99 varint 1. */
    const uint8_t unknown[] = { 0x08, 44, 0x98, 0x06, 0x01 };
    ck_assert_int_eq(kvh_raw_send_frame(fd, unknown, sizeof unknown), 0);
    expect_error(fd, 44, 0, "unknown op");

    /* Decodable frames are not connection errors: PING still answered. */
    Kvnode__PingRequest preq = KVNODE__PING_REQUEST__INIT;
    preq.nonce = 0x1234abcdull;
    Kvnode__Request ping = KVNODE__REQUEST__INIT;
    ping.id = 45;
    ping.op_case = KVNODE__REQUEST__OP_PING;
    ping.ping = &preq;
    raw_send_request(fd, &ping);
    resp = recv_response(fd, "PING after unknown op");
    ck_assert_msg(resp->error == NULL, "PING failed: %s", resp->error ? resp->error->message : "");
    ck_assert_uint_eq(resp->id, 45);
    ck_assert_int_eq(resp->result_case, KVNODE__RESPONSE__RESULT_PING);
    ck_assert_uint_eq(resp->ping->nonce, 0x1234abcdull);
    kvnode__response__free_unpacked(resp, NULL);
    close(fd);

    ck_assert_int_eq(KVH_STAT(&f.d, "frames.rejected_total"), rejected0);
    assert_served(&f, "ESTATE / unknown op");
    teardown(&f);
}
END_TEST

/* All the bad cases against one daemon in a row: the counter adds up and
 * the earlier client survives all of them. */
START_TEST(many_bad_connections_in_a_row)
{
    struct fixture f;
    setup(&f);
    long long rejected0 = KVH_STAT(&f.d, "frames.rejected_total");
    uint8_t big[4] = { 0x01, 0x00, 0x10, 0x00 };     /* 1 MiB + 1 */
    uint8_t zero[4] = { 0, 0, 0, 0 };
    uint8_t garbage[4 + 8] = { 8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
    const struct { const void *b; size_t n; } cases[] = {
        { big, 4 }, { zero, 4 }, { garbage, sizeof garbage },
    };
    const int rounds = 5;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            int fd = kvh_raw_connect(f.d.sock);
            ck_assert_msg(fd >= 0, "%s", kvh_error());
            ck_assert_int_eq(kvh_raw_send(fd, cases[i].b, cases[i].n), 0);
            ck_assert_msg(kvh_raw_wait_eof(fd, 5000) == 0, "case %zu: %s", i, kvh_error());
            close(fd);
        }
    }
    ck_assert_int_ge(KVH_STAT(&f.d, "frames.rejected_total"), rejected0 + 3 * rounds);
    assert_served(&f, "15 rejected connections");
    teardown(&f);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        length_over_max_frame_bytes,
        length_huge,
        zero_length,
        garbage_protobuf,
        truncated_frame_then_close,
        estate_before_hello_then_unknown_op,
        many_bad_connections_in_a_row,
    };
    return kvh_run_suite("daemon_frames", "frames", 20, tests, sizeof tests / sizeof tests[0]);
}
