/* Pipelining: a client may send many requests before reading any reply;
 * every request is answered once, under its own id, and the data is right. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvnode.pb-c.h"
#include "wire.h"

#define BLOCK 4096u
#define NKEYS 8

/* Append one packed request frame to buf. */
static void append(uint8_t **buf, size_t *len, Kvnode__Request *req)
{
    uint8_t *frame;
    size_t flen;
    ck_assert_int_eq(wire_pack(&req->base, 1u << 24, &frame, &flen), 0);
    *buf = realloc(*buf, *len + flen);
    ck_assert_ptr_nonnull(*buf);
    memcpy(*buf + *len, frame, flen);
    *len += flen;
    free(frame);
}

START_TEST(pipelined_requests_are_each_answered_under_their_id)
{
    kvh_daemon d;
    ck_assert_msg(kvh_start(&d, "") == 0, "%s", kvh_error());
    int fd = kvh_raw_connect(d.sock);
    ck_assert_int_ge(fd, 0);

    int64_t keys[NKEYS];
    uint8_t blocks[NKEYS][BLOCK];
    ProtobufCBinaryData blobs[NKEYS];
    for (int i = 0; i < NKEYS; i++) {
        keys[i] = 1000 + i;
        memset(blocks[i], 'a' + i, BLOCK);
        blobs[i].data = blocks[i];
        blobs[i].len = BLOCK;
    }

    Kvnode__Layout layout = KVNODE__LAYOUT__INIT;
    layout.model = "pipe";
    layout.dtype = "bf16";
    layout.block_tokens = 16;
    layout.block_bytes = BLOCK;
    layout.tp_size = 1;
    Kvnode__HelloRequest hello = KVNODE__HELLO_REQUEST__INIT;
    hello.min_version = hello.max_version = 1;
    hello.layout = &layout;
    hello.cuda_device = -1;
    Kvnode__PutInlineRequest put = KVNODE__PUT_INLINE_REQUEST__INIT;
    put.n_keys = NKEYS;
    put.keys = keys;
    put.n_blocks = NKEYS;
    put.blocks = blobs;
    Kvnode__MatchRequest match = KVNODE__MATCH_REQUEST__INIT;
    match.n_keys = NKEYS;
    match.keys = keys;
    Kvnode__GetInlineRequest get = KVNODE__GET_INLINE_REQUEST__INIT;
    get.n_keys = NKEYS;
    get.keys = keys;
    Kvnode__PingRequest ping = KVNODE__PING_REQUEST__INIT;
    ping.nonce = 77;
    Kvnode__LeaseRequest bad_end = KVNODE__LEASE_REQUEST__INIT;
    bad_end.lease = 12345;

    Kvnode__Request reqs[6];
    for (int i = 0; i < 6; i++) {
        kvnode__request__init(&reqs[i]);
        reqs[i].id = 100 + (uint64_t)i;
    }
    reqs[0].op_case = KVNODE__REQUEST__OP_HELLO;      reqs[0].hello = &hello;
    reqs[1].op_case = KVNODE__REQUEST__OP_PUT_INLINE; reqs[1].put_inline = &put;
    reqs[2].op_case = KVNODE__REQUEST__OP_MATCH;      reqs[2].match = &match;
    reqs[3].op_case = KVNODE__REQUEST__OP_GET_END;    reqs[3].get_end = &bad_end;
    reqs[4].op_case = KVNODE__REQUEST__OP_GET_INLINE; reqs[4].get_inline = &get;
    reqs[5].op_case = KVNODE__REQUEST__OP_PING;       reqs[5].ping = &ping;

    /* Everything in one write, before reading anything. */
    uint8_t *buf = NULL;
    size_t len = 0;
    for (int i = 0; i < 6; i++)
        append(&buf, &len, &reqs[i]);
    ck_assert_int_eq(kvh_raw_send(fd, buf, len), 0);
    free(buf);

    int seen[6] = { 0 };
    for (int n = 0; n < 6; n++) {
        uint8_t *payload;
        uint32_t plen;
        ck_assert_int_eq(kvh_raw_recv_frame(fd, &payload, &plen, 1u << 24, 5000), 1);
        Kvnode__Response *r = kvnode__response__unpack(NULL, plen, payload);
        free(payload);
        ck_assert_ptr_nonnull(r);
        ck_assert_uint_ge(r->id, 100);
        ck_assert_uint_le(r->id, 105);
        int i = (int)(r->id - 100);
        ck_assert_int_eq(seen[i], 0);
        seen[i] = 1;
        switch (i) {
        case 0:
            ck_assert_ptr_null(r->error);
            ck_assert_int_eq(r->result_case, KVNODE__RESPONSE__RESULT_HELLO);
            ck_assert_uint_eq(r->hello->block_bytes, BLOCK);
            break;
        case 1:
            ck_assert_ptr_null(r->error);
            ck_assert_uint_eq(r->put_inline->stored, NKEYS);
            break;
        case 2:
            ck_assert_ptr_null(r->error);
            ck_assert_uint_eq(r->match->matched, NKEYS);
            break;
        case 3:   /* an error in the middle does not disturb the rest */
            ck_assert_ptr_nonnull(r->error);
            ck_assert_int_eq(r->error->code, -KVNODE_ENOLEASE);
            ck_assert_ptr_nonnull(strstr(r->error->message, "12345"));
            break;
        case 4:
            ck_assert_ptr_null(r->error);
            ck_assert_uint_eq(r->get_inline->n_blocks, NKEYS);
            for (int k = 0; k < NKEYS; k++) {
                ck_assert_uint_eq(r->get_inline->blocks[k].len, BLOCK);
                ck_assert_int_eq(memcmp(r->get_inline->blocks[k].data, blocks[k], BLOCK), 0);
            }
            break;
        default:
            ck_assert_ptr_null(r->error);
            ck_assert_uint_eq(r->ping->nonce, 77);
            break;
        }
        kvnode__response__free_unpacked(r, NULL);
    }
    close(fd);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = { pipelined_requests_are_each_answered_under_their_id };
    return kvh_run_suite("daemon_pipeline", "pipeline", 20, tests, sizeof tests / sizeof tests[0]);
}
