/* Unit tests for lib/wire.c: frame header, pack limits, unpack of truncated
 * and random input (must never crash; run under ASan/valgrind), and a
 * round trip of every request op and response result. */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvnode.h"
#include "wire.h"

/* --- header ------------------------------------------------------------------ */

START_TEST(test_header_round_trip)
{
    static const uint32_t lens[] = {1, 2, 255, 256, 65535, 65536, 0x01020304u, 1u << 20,
                                    WIRE_FRAME_LIMIT};
    size_t i;

    for (i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        uint8_t hdr[WIRE_HEADER_BYTES];
        uint32_t got = 0;

        wire_put_len(hdr, lens[i]);
        ck_assert_int_eq(wire_frame_len(hdr, WIRE_FRAME_LIMIT, &got), 0);
        ck_assert_uint_eq(got, lens[i]);
    }
}
END_TEST

START_TEST(test_header_little_endian)
{
    uint8_t hdr[WIRE_HEADER_BYTES];
    const uint8_t want[4] = {0x04, 0x03, 0x02, 0x01};
    uint32_t got;

    wire_put_len(hdr, 0x01020304u);
    ck_assert(memcmp(hdr, want, 4) == 0);
    hdr[0] = 0x10; hdr[1] = 0; hdr[2] = 0; hdr[3] = 0;
    ck_assert_int_eq(wire_frame_len(hdr, 100, &got), 0);
    ck_assert_uint_eq(got, 16);
}
END_TEST

START_TEST(test_header_empty_is_eproto)
{
    uint8_t hdr[WIRE_HEADER_BYTES] = {0, 0, 0, 0};
    uint32_t got = 77;

    ck_assert_int_eq(wire_frame_len(hdr, 1024, &got), -KVNODE_EPROTO);
    ck_assert_uint_eq(got, 77);
}
END_TEST

START_TEST(test_header_over_max_is_etoobig)
{
    uint8_t hdr[WIRE_HEADER_BYTES];
    uint32_t got = 77;

    wire_put_len(hdr, 1025);
    ck_assert_int_eq(wire_frame_len(hdr, 1024, &got), -KVNODE_ETOOBIG);
    ck_assert_uint_eq(got, 77);
    wire_put_len(hdr, 1024);
    ck_assert_int_eq(wire_frame_len(hdr, 1024, &got), 0);
    ck_assert_uint_eq(got, 1024);
    /* The absolute ceiling holds even when the caller allows more. */
    wire_put_len(hdr, UINT32_MAX);
    ck_assert_int_eq(wire_frame_len(hdr, UINT32_MAX, &got), -KVNODE_ETOOBIG);
    wire_put_len(hdr, WIRE_FRAME_LIMIT + 1);
    ck_assert_int_eq(wire_frame_len(hdr, UINT32_MAX, &got), -KVNODE_ETOOBIG);
}
END_TEST

/* --- pack ------------------------------------------------------------------- */

START_TEST(test_pack_frame_layout)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__PingRequest p = KVNODE__PING_REQUEST__INIT;
    uint8_t *frame = NULL;
    size_t flen = 0;
    uint32_t len;
    Kvnode__Request *back;

    req.id = 5;
    req.op_case = KVNODE__REQUEST__OP_PING;
    req.ping = &p;
    p.nonce = 0xdeadbeefcafef00dULL;
    ck_assert_int_eq(wire_pack(&req.base, 1024, &frame, &flen), 0);
    ck_assert_ptr_nonnull(frame);
    ck_assert_uint_eq(flen, WIRE_HEADER_BYTES + kvnode__request__get_packed_size(&req));
    ck_assert_int_eq(wire_frame_len(frame, 1024, &len), 0);
    ck_assert_uint_eq(len, flen - WIRE_HEADER_BYTES);
    back = wire_unpack_request(frame + WIRE_HEADER_BYTES, len);
    ck_assert_ptr_nonnull(back);
    ck_assert_uint_eq(back->id, 5);
    ck_assert_int_eq(back->op_case, KVNODE__REQUEST__OP_PING);
    ck_assert(back->ping->nonce == 0xdeadbeefcafef00dULL);
    kvnode__request__free_unpacked(back, NULL);
    free(frame);
}
END_TEST

START_TEST(test_pack_over_max_is_etoobig)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__MatchRequest m = KVNODE__MATCH_REQUEST__INIT;
    int64_t keys[100];
    uint8_t *frame = (uint8_t *)&req;
    size_t flen = 99, size;
    size_t i;

    for (i = 0; i < 100; i++)
        keys[i] = -(int64_t)i * 1000003;
    m.n_keys = 100;
    m.keys = keys;
    req.id = 1;
    req.op_case = KVNODE__REQUEST__OP_MATCH;
    req.match = &m;
    size = kvnode__request__get_packed_size(&req);
    ck_assert_int_eq(wire_pack(&req.base, (uint32_t)size - 1, &frame, &flen), -KVNODE_ETOOBIG);
    ck_assert_ptr_null(frame);
    ck_assert_uint_eq(flen, 0);
    ck_assert_int_eq(wire_pack(&req.base, (uint32_t)size, &frame, &flen), 0);
    ck_assert_uint_eq(flen, size + WIRE_HEADER_BYTES);
    free(frame);
}
END_TEST

START_TEST(test_pack_empty_and_null)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;   /* everything default: 0 bytes */
    uint8_t *frame = (uint8_t *)&resp;
    size_t flen = 99;

    ck_assert_int_eq(wire_pack(&resp.base, 1024, &frame, &flen), -KVNODE_EPROTO);
    ck_assert_ptr_null(frame);
    ck_assert_int_eq(wire_pack(NULL, 1024, &frame, &flen), -KVNODE_EINVAL);
}
END_TEST

/* --- unpack robustness ---------------------------------------------------------- */

/* A request with many field kinds, for truncation tests. */
static uint8_t *make_rich_request(size_t *len)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__HelloRequest h = KVNODE__HELLO_REQUEST__INIT;
    Kvnode__Layout l = KVNODE__LAYOUT__INIT;
    uint8_t *buf;

    l.model = (char *)"qwen2-7b";
    l.dtype = (char *)"bf16";
    l.block_tokens = 16;
    l.block_bytes = 1u << 20;
    l.num_layers = 28;
    l.kv_heads = 4;
    l.head_dim = 128;
    l.tp_size = 2;
    l.tp_rank = 1;
    l.extra = (char *)"mla=0";
    h.min_version = 1;
    h.max_version = 1;
    h.layout = &l;
    h.client_name = (char *)"test_wire";
    h.cuda_device = -1;
    req.id = UINT64_MAX;
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &h;
    *len = kvnode__request__get_packed_size(&req);
    buf = malloc(*len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(kvnode__request__pack(&req, buf), *len);
    return buf;
}

static uint8_t *make_rich_put_inline(size_t *len)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__PutInlineRequest p = KVNODE__PUT_INLINE_REQUEST__INIT;
    int64_t keys[3] = {INT64_MIN, -1, INT64_MAX};
    uint8_t b0[40], b1[40], b2[40], *buf;
    ProtobufCBinaryData blobs[3] = {{40, b0}, {40, b1}, {40, b2}};

    memset(b0, 1, sizeof b0);
    memset(b1, 2, sizeof b1);
    memset(b2, 3, sizeof b2);
    p.n_keys = 3;
    p.keys = keys;
    p.n_blocks = 3;
    p.blocks = blobs;
    req.id = 300;
    req.op_case = KVNODE__REQUEST__OP_PUT_INLINE;
    req.put_inline = &p;
    *len = kvnode__request__get_packed_size(&req);
    buf = malloc(*len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(kvnode__request__pack(&req, buf), *len);
    return buf;
}

/* A decoded message must be usable: pack it again without crashing. */
static void exercise_request(Kvnode__Request *r)
{
    size_t n = kvnode__request__get_packed_size(r);
    uint8_t *b = malloc(n ? n : 1);

    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(kvnode__request__pack(r, b), n);
    free(b);
    (void)wire_op_name((int)r->op_case);
    kvnode__request__free_unpacked(r, NULL);
}

static void exercise_response(Kvnode__Response *r)
{
    size_t n = kvnode__response__get_packed_size(r);
    uint8_t *b = malloc(n ? n : 1);

    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(kvnode__response__pack(r, b), n);
    free(b);
    wire_free_response(r);
}

START_TEST(test_unpack_every_prefix)
{
    size_t len, cut, whole_ok = 0;
    uint8_t *(*makers[2])(size_t *) = {make_rich_request, make_rich_put_inline};
    int m;

    for (m = 0; m < 2; m++) {
        uint8_t *full = makers[m](&len);

        for (cut = 0; cut <= len; cut++) {
            /* Copy into an exact-size buffer so ASan/valgrind see any overread. */
            uint8_t *p = malloc(cut ? cut : 1);
            Kvnode__Request *r;
            Kvnode__Response *s;

            ck_assert_ptr_nonnull(p);
            memcpy(p, full, cut);
            r = wire_unpack_request(p, cut);
            if (r) {
                if (cut == len)
                    whole_ok++;
                exercise_request(r);
            }
            s = wire_unpack_response(p, cut);
            if (s)
                exercise_response(s);
            free(p);
        }
        free(full);
    }
    ck_assert_uint_eq(whole_ok, 2);
}
END_TEST

START_TEST(test_unpack_random_garbage)
{
    uint64_t x = 0x9e3779b97f4a7c15ULL;   /* fixed seed */
    size_t ok_req = 0, ok_resp = 0;
    int i;

    for (i = 0; i < 10000; i++) {
        size_t len, j;
        uint8_t *p;
        Kvnode__Request *r;
        Kvnode__Response *s;

        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        len = (size_t)(x % 200) + 1;
        p = malloc(len);
        ck_assert_ptr_nonnull(p);
        for (j = 0; j < len; j++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            p[j] = (uint8_t)x;
        }
        /* Every 4th case starts with a plausible field tag to get deeper. */
        if (i % 4 == 0)
            p[0] = (uint8_t)((10 + i % 12) << 3 | 2);
        r = wire_unpack_request(p, len);
        if (r) {
            ok_req++;
            exercise_request(r);
        }
        s = wire_unpack_response(p, len);
        if (s) {
            ok_resp++;
            exercise_response(s);
        }
        free(p);
    }
    /* Random bytes are mostly invalid; a decoder accepting all would be wrong. */
    ck_assert_uint_lt(ok_req, 10000);
    ck_assert_uint_lt(ok_resp, 10000);
}
END_TEST

START_TEST(test_unpack_null_payload)
{
    ck_assert_ptr_null(wire_unpack_request(NULL, 5));
    ck_assert_ptr_null(wire_unpack_response(NULL, 5));
}
END_TEST

/* Field number 0 (an overlong tag, 0x80 0x00, which protobuf-c 1.4 would keep
 * as an unknown field it cannot pack back) is refused, at the top and nested;
 * found by tests/fuzz/fuzz_wire.c. */
START_TEST(test_unpack_field_zero)
{
    static const uint8_t top[] = { 0x80, 0x00, 0x00 };
    static const uint8_t nested[] = { 0x52, 0x03, 0x80, 0x00, 0x00 };   /* hello { 0: 0 } */
    static const uint8_t fine[] = { 0x52, 0x02, 0x08, 0x01 };          /* hello { min_version: 1 } */
    ck_assert_ptr_null(wire_unpack_request(top, sizeof top));
    ck_assert_ptr_null(wire_unpack_response(top, sizeof top));
    ck_assert_ptr_null(wire_unpack_request(nested, sizeof nested));
    ck_assert_ptr_null(wire_unpack_response(nested, sizeof nested));
    Kvnode__Request *r = wire_unpack_request(fine, sizeof fine);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->op_case, KVNODE__REQUEST__OP_HELLO);
    ck_assert_uint_eq(r->hello->min_version, 1);
    kvnode__request__free_unpacked(r, NULL);
}
END_TEST

/* --- round trips -------------------------------------------------------------- */

static Kvnode__Request *round_trip_request(Kvnode__Request *req)
{
    uint8_t *frame;
    size_t flen;
    uint32_t len;
    Kvnode__Request *back;

    ck_assert_int_eq(wire_pack(&req->base, 1u << 20, &frame, &flen), 0);
    ck_assert_int_eq(wire_frame_len(frame, 1u << 20, &len), 0);
    ck_assert_uint_eq(len + WIRE_HEADER_BYTES, flen);
    back = wire_unpack_request(frame + WIRE_HEADER_BYTES, len);
    free(frame);
    ck_assert_ptr_nonnull(back);
    ck_assert_uint_eq(back->id, req->id);
    ck_assert_int_eq(back->op_case, req->op_case);
    return back;
}

static Kvnode__Response *round_trip_response(Kvnode__Response *resp)
{
    uint8_t *frame;
    size_t flen;
    uint32_t len;
    Kvnode__Response *back;

    ck_assert_int_eq(wire_pack(&resp->base, 1u << 20, &frame, &flen), 0);
    ck_assert_int_eq(wire_frame_len(frame, 1u << 20, &len), 0);
    back = wire_unpack_response(frame + WIRE_HEADER_BYTES, len);
    free(frame);
    ck_assert_ptr_nonnull(back);
    ck_assert_uint_eq(back->id, resp->id);
    ck_assert_int_eq(back->result_case, resp->result_case);
    return back;
}

static int64_t rt_keys[5] = {INT64_MIN, -7046029254386353130, 0, 1, INT64_MAX};

static void assert_keys(size_t n, const int64_t *k)
{
    ck_assert_uint_eq(n, 5);
    ck_assert(memcmp(k, rt_keys, sizeof rt_keys) == 0);
}

START_TEST(test_round_trip_requests)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT, *b;
    Kvnode__HelloRequest hello = KVNODE__HELLO_REQUEST__INIT;
    Kvnode__Layout lo = KVNODE__LAYOUT__INIT;
    Kvnode__MatchRequest match = KVNODE__MATCH_REQUEST__INIT;
    Kvnode__GetBeginRequest gb = KVNODE__GET_BEGIN_REQUEST__INIT;
    Kvnode__LeaseRequest lease = KVNODE__LEASE_REQUEST__INIT;
    Kvnode__PutBeginRequest pb = KVNODE__PUT_BEGIN_REQUEST__INIT;
    Kvnode__GetInlineRequest gi = KVNODE__GET_INLINE_REQUEST__INIT;
    Kvnode__PutInlineRequest pi = KVNODE__PUT_INLINE_REQUEST__INIT;
    Kvnode__DeleteRequest del = KVNODE__DELETE_REQUEST__INIT;
    Kvnode__StatsRequest st = KVNODE__STATS_REQUEST__INIT;
    Kvnode__PingRequest ping = KVNODE__PING_REQUEST__INIT;
    uint8_t blob_a[7] = "abcdef", blob_b[1] = {0};
    ProtobufCBinaryData blobs[5] = {{7, blob_a}, {1, blob_b}, {7, blob_a}, {1, blob_b}, {0, NULL}};
    static const int lease_ops[3] = {KVNODE__REQUEST__OP_GET_END, KVNODE__REQUEST__OP_PUT_COMMIT,
                                     KVNODE__REQUEST__OP_PUT_ABORT};
    int i;

    /* HELLO with and without layout */
    lo.model = (char *)"m";
    lo.dtype = (char *)"fp8";
    lo.block_tokens = 64;
    lo.block_bytes = UINT64_MAX;
    lo.num_layers = 1; lo.kv_heads = 2; lo.head_dim = 3; lo.tp_size = 4; lo.tp_rank = 3;
    lo.extra = (char *)"x=y";
    hello.min_version = 1;
    hello.max_version = 1;
    hello.layout = &lo;
    hello.client_name = (char *)"engine";
    hello.cuda_device = -1;
    req.id = 1;
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &hello;
    b = round_trip_request(&req);
    ck_assert_uint_eq(b->hello->min_version, 1);
    ck_assert_uint_eq(b->hello->max_version, 1);
    ck_assert_str_eq(b->hello->client_name, "engine");
    ck_assert_int_eq(b->hello->cuda_device, -1);
    ck_assert_ptr_nonnull(b->hello->layout);
    ck_assert_str_eq(b->hello->layout->model, "m");
    ck_assert_str_eq(b->hello->layout->dtype, "fp8");
    ck_assert_str_eq(b->hello->layout->extra, "x=y");
    ck_assert_uint_eq(b->hello->layout->block_tokens, 64);
    ck_assert(b->hello->layout->block_bytes == UINT64_MAX);
    ck_assert_uint_eq(b->hello->layout->num_layers, 1);
    ck_assert_uint_eq(b->hello->layout->kv_heads, 2);
    ck_assert_uint_eq(b->hello->layout->head_dim, 3);
    ck_assert_uint_eq(b->hello->layout->tp_size, 4);
    ck_assert_uint_eq(b->hello->layout->tp_rank, 3);
    kvnode__request__free_unpacked(b, NULL);
    hello.layout = NULL;
    req.id = 2;
    b = round_trip_request(&req);
    ck_assert_ptr_null(b->hello->layout);
    kvnode__request__free_unpacked(b, NULL);

    req.id = 3;
    match.n_keys = 5; match.keys = rt_keys;
    req.op_case = KVNODE__REQUEST__OP_MATCH; req.match = &match;
    b = round_trip_request(&req);
    assert_keys(b->match->n_keys, b->match->keys);
    kvnode__request__free_unpacked(b, NULL);

    req.id = 4;
    gb.n_keys = 5; gb.keys = rt_keys;
    req.op_case = KVNODE__REQUEST__OP_GET_BEGIN; req.get_begin = &gb;
    b = round_trip_request(&req);
    assert_keys(b->get_begin->n_keys, b->get_begin->keys);
    kvnode__request__free_unpacked(b, NULL);

    for (i = 0; i < 3; i++) {
        req.id = 10 + (uint64_t)i;
        lease.lease = UINT64_MAX - (uint64_t)i;
        req.op_case = (Kvnode__Request__OpCase)lease_ops[i];
        req.get_end = &lease;   /* same union slot type for the three lease ops */
        b = round_trip_request(&req);
        ck_assert(b->get_end->lease == UINT64_MAX - (uint64_t)i);
        kvnode__request__free_unpacked(b, NULL);
    }

    req.id = 20;
    pb.n_keys = 5; pb.keys = rt_keys; pb.tier = KVNODE__TIER__TIER_HBM;
    req.op_case = KVNODE__REQUEST__OP_PUT_BEGIN; req.put_begin = &pb;
    b = round_trip_request(&req);
    assert_keys(b->put_begin->n_keys, b->put_begin->keys);
    ck_assert_int_eq(b->put_begin->tier, KVNODE__TIER__TIER_HBM);
    kvnode__request__free_unpacked(b, NULL);

    req.id = 21;
    gi.n_keys = 5; gi.keys = rt_keys;
    req.op_case = KVNODE__REQUEST__OP_GET_INLINE; req.get_inline = &gi;
    b = round_trip_request(&req);
    assert_keys(b->get_inline->n_keys, b->get_inline->keys);
    kvnode__request__free_unpacked(b, NULL);

    req.id = 22;
    pi.n_keys = 5; pi.keys = rt_keys; pi.n_blocks = 5; pi.blocks = blobs;
    req.op_case = KVNODE__REQUEST__OP_PUT_INLINE; req.put_inline = &pi;
    b = round_trip_request(&req);
    assert_keys(b->put_inline->n_keys, b->put_inline->keys);
    ck_assert_uint_eq(b->put_inline->n_blocks, 5);
    for (i = 0; i < 5; i++) {
        ck_assert_uint_eq(b->put_inline->blocks[i].len, blobs[i].len);
        if (blobs[i].len)
            ck_assert(memcmp(b->put_inline->blocks[i].data, blobs[i].data, blobs[i].len) == 0);
    }
    kvnode__request__free_unpacked(b, NULL);

    req.id = 23;
    del.n_keys = 5; del.keys = rt_keys;
    req.op_case = KVNODE__REQUEST__OP_DELETE; req.delete_ = &del;
    b = round_trip_request(&req);
    assert_keys(b->delete_->n_keys, b->delete_->keys);
    kvnode__request__free_unpacked(b, NULL);

    req.id = 24;
    req.op_case = KVNODE__REQUEST__OP_STATS; req.stats = &st;
    b = round_trip_request(&req);
    ck_assert_ptr_nonnull(b->stats);
    kvnode__request__free_unpacked(b, NULL);

    req.id = 25;
    ping.nonce = 0x0123456789abcdefULL;
    req.op_case = KVNODE__REQUEST__OP_PING; req.ping = &ping;
    b = round_trip_request(&req);
    ck_assert(b->ping->nonce == 0x0123456789abcdefULL);
    kvnode__request__free_unpacked(b, NULL);
}
END_TEST

START_TEST(test_round_trip_responses)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT, *b;
    Kvnode__HelloReply hello = KVNODE__HELLO_REPLY__INIT;
    Kvnode__Arena a0 = KVNODE__ARENA__INIT, a1 = KVNODE__ARENA__INIT;
    Kvnode__Arena *arenas[2] = {&a0, &a1};
    Kvnode__Location l0 = KVNODE__LOCATION__INIT, l1 = KVNODE__LOCATION__INIT;
    Kvnode__Location *locs[2] = {&l0, &l1};
    Kvnode__MatchReply match = KVNODE__MATCH_REPLY__INIT;
    Kvnode__GetBeginReply gb = KVNODE__GET_BEGIN_REPLY__INIT;
    Kvnode__LeaseReply lr = KVNODE__LEASE_REPLY__INIT;
    Kvnode__PutBeginReply pb = KVNODE__PUT_BEGIN_REPLY__INIT;
    Kvnode__GetInlineReply gi = KVNODE__GET_INLINE_REPLY__INIT;
    Kvnode__PutInlineReply pi = KVNODE__PUT_INLINE_REPLY__INIT;
    Kvnode__DeleteReply del = KVNODE__DELETE_REPLY__INIT;
    Kvnode__StatsReply st = KVNODE__STATS_REPLY__INIT;
    Kvnode__PingReply ping = KVNODE__PING_REPLY__INIT;
    Kvnode__Error err = KVNODE__ERROR__INIT;
    uint8_t blk[3] = {9, 8, 7};
    ProtobufCBinaryData blobs[2] = {{3, blk}, {3, blk}};
    static const int lease_results[3] = {KVNODE__RESPONSE__RESULT_GET_END,
                                         KVNODE__RESPONSE__RESULT_PUT_COMMIT,
                                         KVNODE__RESPONSE__RESULT_PUT_ABORT};
    int i;

    a0.id = 1; a0.tier = KVNODE__TIER__TIER_HOST; a0.device = -1; a0.size = 1ull << 33;
    a0.fd_index = 0;
    a1.id = 2; a1.tier = KVNODE__TIER__TIER_HBM; a1.device = 3; a1.size = 4096; a1.fd_index = -1;
    hello.version = 1;
    hello.server_version = (char *)"0.1.0";
    hello.namespace_id = 7;
    hello.deployment_id = (char *)"m-abc";
    hello.block_bytes = 1u << 20;
    hello.n_arenas = 2;
    hello.arenas = arenas;
    hello.max_frame_bytes = 1u << 24;
    hello.max_keys = 4096;
    hello.read_lease_ttl_ms = 30000;
    hello.write_lease_ttl_ms = 60000;
    resp.id = 1;
    resp.result_case = KVNODE__RESPONSE__RESULT_HELLO;
    resp.hello = &hello;
    b = round_trip_response(&resp);
    ck_assert_ptr_null(b->error);
    ck_assert_uint_eq(b->hello->version, 1);
    ck_assert_str_eq(b->hello->server_version, "0.1.0");
    ck_assert_uint_eq(b->hello->namespace_id, 7);
    ck_assert_str_eq(b->hello->deployment_id, "m-abc");
    ck_assert_uint_eq(b->hello->block_bytes, 1u << 20);
    ck_assert_uint_eq(b->hello->max_frame_bytes, 1u << 24);
    ck_assert_uint_eq(b->hello->max_keys, 4096);
    ck_assert_uint_eq(b->hello->read_lease_ttl_ms, 30000);
    ck_assert_uint_eq(b->hello->write_lease_ttl_ms, 60000);
    ck_assert_uint_eq(b->hello->n_arenas, 2);
    ck_assert_uint_eq(b->hello->arenas[0]->id, 1);
    ck_assert_int_eq(b->hello->arenas[0]->tier, KVNODE__TIER__TIER_HOST);
    ck_assert_int_eq(b->hello->arenas[0]->device, -1);
    ck_assert(b->hello->arenas[0]->size == 1ull << 33);
    ck_assert_int_eq(b->hello->arenas[0]->fd_index, 0);
    ck_assert_uint_eq(b->hello->arenas[1]->id, 2);
    ck_assert_int_eq(b->hello->arenas[1]->tier, KVNODE__TIER__TIER_HBM);
    ck_assert_int_eq(b->hello->arenas[1]->device, 3);
    ck_assert_int_eq(b->hello->arenas[1]->fd_index, -1);
    wire_free_response(b);

    resp.id = 2;
    match.matched = 12345;
    resp.result_case = KVNODE__RESPONSE__RESULT_MATCH; resp.match = &match;
    b = round_trip_response(&resp);
    ck_assert_uint_eq(b->match->matched, 12345);
    wire_free_response(b);

    l0.arena = 1; l0.offset = 0; l0.present = 1;
    l1.arena = 2; l1.offset = (1ull << 40) + 4096; l1.present = 0;
    resp.id = 3;
    gb.lease = 99; gb.n_locations = 2; gb.locations = locs;
    resp.result_case = KVNODE__RESPONSE__RESULT_GET_BEGIN; resp.get_begin = &gb;
    b = round_trip_response(&resp);
    ck_assert(b->get_begin->lease == 99);
    ck_assert_uint_eq(b->get_begin->n_locations, 2);
    ck_assert_uint_eq(b->get_begin->locations[0]->arena, 1);
    ck_assert(b->get_begin->locations[0]->offset == 0);
    ck_assert(b->get_begin->locations[0]->present);
    ck_assert_uint_eq(b->get_begin->locations[1]->arena, 2);
    ck_assert(b->get_begin->locations[1]->offset == (1ull << 40) + 4096);
    ck_assert(!b->get_begin->locations[1]->present);
    wire_free_response(b);

    for (i = 0; i < 3; i++) {
        resp.id = 10 + (uint64_t)i;
        lr.blocks = 100 + (uint32_t)i;
        resp.result_case = (Kvnode__Response__ResultCase)lease_results[i];
        resp.get_end = &lr;
        b = round_trip_response(&resp);
        ck_assert_uint_eq(b->get_end->blocks, 100 + (uint32_t)i);
        wire_free_response(b);
    }

    resp.id = 20;
    pb.lease = UINT64_MAX; pb.n_locations = 2; pb.locations = locs;
    resp.result_case = KVNODE__RESPONSE__RESULT_PUT_BEGIN; resp.put_begin = &pb;
    b = round_trip_response(&resp);
    ck_assert(b->put_begin->lease == UINT64_MAX);
    ck_assert_uint_eq(b->put_begin->n_locations, 2);
    ck_assert(b->put_begin->locations[0]->present && !b->put_begin->locations[1]->present);
    wire_free_response(b);

    resp.id = 21;
    gi.n_blocks = 2; gi.blocks = blobs;
    resp.result_case = KVNODE__RESPONSE__RESULT_GET_INLINE; resp.get_inline = &gi;
    b = round_trip_response(&resp);
    ck_assert_uint_eq(b->get_inline->n_blocks, 2);
    ck_assert_uint_eq(b->get_inline->blocks[1].len, 3);
    ck_assert(memcmp(b->get_inline->blocks[1].data, blk, 3) == 0);
    wire_free_response(b);

    resp.id = 22;
    pi.stored = 5; pi.existing = 6;
    resp.result_case = KVNODE__RESPONSE__RESULT_PUT_INLINE; resp.put_inline = &pi;
    b = round_trip_response(&resp);
    ck_assert_uint_eq(b->put_inline->stored, 5);
    ck_assert_uint_eq(b->put_inline->existing, 6);
    wire_free_response(b);

    resp.id = 23;
    del.deleted = 4;
    resp.result_case = KVNODE__RESPONSE__RESULT_DELETE; resp.delete_ = &del;
    b = round_trip_response(&resp);
    ck_assert_uint_eq(b->delete_->deleted, 4);
    wire_free_response(b);

    resp.id = 24;
    st.json = (char *)"{\"a\":1}";
    resp.result_case = KVNODE__RESPONSE__RESULT_STATS; resp.stats = &st;
    b = round_trip_response(&resp);
    ck_assert_str_eq(b->stats->json, "{\"a\":1}");
    wire_free_response(b);

    resp.id = 25;
    ping.nonce = 42;
    resp.result_case = KVNODE__RESPONSE__RESULT_PING; resp.ping = &ping;
    b = round_trip_response(&resp);
    ck_assert(b->ping->nonce == 42);
    wire_free_response(b);

    /* error reply: no result */
    resp.id = 26;
    resp.result_case = KVNODE__RESPONSE__RESULT__NOT_SET;
    err.code = -KVNODE_ENOSPC;
    err.message = (char *)"host tier full";
    resp.error = &err;
    b = round_trip_response(&resp);
    ck_assert_ptr_nonnull(b->error);
    ck_assert_int_eq(b->error->code, -KVNODE_ENOSPC);
    ck_assert_str_eq(b->error->message, "host tier full");
    wire_free_response(b);
}
END_TEST

/* --- GET_BEGIN / PUT_BEGIN replies: the direct codec ------------------------- */

static uint64_t locs_rng = 0x5eed;

static uint64_t locs_next(void)
{
    locs_rng ^= locs_rng << 13;
    locs_rng ^= locs_rng >> 7;
    locs_rng ^= locs_rng << 17;
    return locs_rng;
}

/* A value of every varint length, 0 (left out) often. */
static uint64_t locs_value(uint64_t max)
{
    uint64_t v = locs_next();
    switch (v % 4) {
    case 0: return 0;
    case 1: v &= 0x7f; break;
    case 2: v >>= v % 64; break;
    default: break;
    }
    return max ? v % max : v;
}

/* A reply of n locations (GET_BEGIN or PUT_BEGIN) packed by wire_pack and by
 * protobuf-c: the same bytes; wire_unpack_response of them: the same fields
 * (freed by wire_free_response). */
/* m as protobuf-c packs it (the caller frees it; *len: its length), after
 * checking that wire_pack writes the same bytes behind its header. */
static uint8_t *pack_as_protobuf_c(const ProtobufCMessage *m, int round, size_t *len)
{
    size_t want_len = protobuf_c_message_get_packed_size(m), frame_len;
    uint8_t *want = malloc(want_len + 1), *frame = NULL;
    ck_assert_ptr_nonnull(want);
    ck_assert_uint_eq(protobuf_c_message_pack(m, want), want_len);
    ck_assert_int_eq(wire_pack(m, WIRE_FRAME_LIMIT, &frame, &frame_len), 0);
    ck_assert_uint_eq(frame_len, WIRE_HEADER_BYTES + want_len);
    ck_assert_msg(memcmp(frame + WIRE_HEADER_BYTES, want, want_len) == 0, "round %d: bytes differ", round);
    free(frame);
    *len = want_len;
    return want;
}

START_TEST(test_locs_codec_as_protobuf)
{
    static Kvnode__Location items[300], *ptrs[300];
    for (int round = 0; round < 400; round++) {
        size_t n = round < 300 ? (size_t)round : (size_t)(locs_next() % 300);
        for (size_t i = 0; i < n; i++) {
            kvnode__location__init(&items[i]);
            items[i].arena = (uint32_t)locs_value((uint64_t)UINT32_MAX + 1);
            items[i].offset = locs_value(0);
            items[i].present = (locs_next() & 1) != 0;
            ptrs[i] = &items[i];
        }
        Kvnode__Response r = KVNODE__RESPONSE__INIT;
        Kvnode__GetBeginReply g = KVNODE__GET_BEGIN_REPLY__INIT;
        Kvnode__PutBeginReply pb = KVNODE__PUT_BEGIN_REPLY__INIT;
        bool get = round % 2 == 0;
        r.id = locs_value(0);
        if (get) {
            g.lease = locs_value(0);
            g.n_locations = n;
            g.locations = n ? ptrs : NULL;
            r.result_case = KVNODE__RESPONSE__RESULT_GET_BEGIN;
            r.get_begin = &g;
        } else {
            pb.lease = locs_value(0);
            pb.n_locations = n;
            pb.locations = n ? ptrs : NULL;
            r.result_case = KVNODE__RESPONSE__RESULT_PUT_BEGIN;
            r.put_begin = &pb;
        }
        size_t want_len;
        uint8_t *want = pack_as_protobuf_c(&r.base, round, &want_len);

        Kvnode__Response *u = wire_unpack_response(want, want_len);
        ck_assert_ptr_nonnull(u);
        ck_assert_uint_eq(u->id, r.id);
        ck_assert_int_eq(u->result_case, r.result_case);
        const Kvnode__GetBeginReply *ug =
            get ? u->get_begin : (const Kvnode__GetBeginReply *)(const void *)u->put_begin;
        ck_assert_ptr_nonnull(ug);
        ck_assert_uint_eq(ug->lease, get ? g.lease : pb.lease);
        ck_assert_uint_eq(ug->n_locations, n);
        for (size_t i = 0; i < n; i++) {
            ck_assert_uint_eq(ug->locations[i]->arena, items[i].arena);
            ck_assert_uint_eq(ug->locations[i]->offset, items[i].offset);
            ck_assert_int_eq(ug->locations[i]->present, items[i].present);
        }
        wire_free_response(u);
        /* Every prefix: what protobuf-c makes of it, or NULL as it does. */
        for (size_t cut = 0; cut < want_len && round < 40; cut++) {
            uint8_t *p = malloc(cut ? cut : 1);
            ck_assert_ptr_nonnull(p);
            memcpy(p, want, cut);
            Kvnode__Response *a = wire_unpack_response(p, cut), *b = kvnode__response__unpack(NULL, cut, p);
            ck_assert_int_eq(a != NULL, b != NULL);
            if (a) {
                ck_assert_int_eq(a->result_case, b->result_case);
                wire_free_response(a);
                kvnode__response__free_unpacked(b, NULL);
            }
            free(p);
        }
        free(want);
    }
}
END_TEST

/* Bytes in other forms than protobuf-c packs (fields out of order, a field
 * twice, an unknown field, an overlong varint, a bool of 2, an arena past 32
 * bits) still read as protobuf-c reads them. */
START_TEST(test_locs_unpack_other_forms)
{
    static const struct {
        const char *what;
        uint8_t bytes[32];
        size_t len;
    } cases[] = {
        { "location fields reversed", { 0x62, 0x08, 0x12, 0x06, 0x18, 0x01, 0x10, 0x05, 0x08, 0x02 }, 10 },
        { "lease after the locations", { 0x62, 0x06, 0x12, 0x02, 0x08, 0x01, 0x08, 0x09 }, 8 },
        { "lease twice", { 0x72, 0x04, 0x08, 0x01, 0x08, 0x02 }, 6 },
        { "an unknown field", { 0x62, 0x06, 0x12, 0x04, 0x08, 0x01, 0x20, 0x07 }, 8 },
        { "overlong varint", { 0x62, 0x05, 0x12, 0x03, 0x10, 0x85, 0x00 }, 7 },
        { "bool of 2", { 0x62, 0x04, 0x12, 0x02, 0x18, 0x02 }, 6 },
        { "arena past 32 bits", { 0x62, 0x08, 0x12, 0x06, 0x08, 0x80, 0x80, 0x80, 0x80, 0x10 }, 10 },
        { "id after the result", { 0x62, 0x02, 0x08, 0x01, 0x08, 0x05 }, 6 },
        { "a field numbered 0", { 0x62, 0x04, 0x12, 0x02, 0x80, 0x00 }, 6 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Kvnode__Response *a = wire_unpack_response(cases[k].bytes, cases[k].len);
        Kvnode__Response *b = kvnode__response__unpack(NULL, cases[k].len, cases[k].bytes);
        if (b && k == sizeof cases / sizeof cases[0] - 1) {   /* field 0: wire refuses it */
            ck_assert_ptr_null(a);
            kvnode__response__free_unpacked(b, NULL);
            continue;
        }
        ck_assert_msg((a != NULL) == (b != NULL), "%s", cases[k].what);
        if (!a)
            continue;
        ck_assert_uint_eq(a->id, b->id);
        ck_assert_int_eq(a->result_case, b->result_case);
        const Kvnode__GetBeginReply *x = a->result_case == KVNODE__RESPONSE__RESULT_GET_BEGIN
                                             ? a->get_begin : (const void *)a->put_begin;
        const Kvnode__GetBeginReply *y = b->result_case == KVNODE__RESPONSE__RESULT_GET_BEGIN
                                             ? b->get_begin : (const void *)b->put_begin;
        ck_assert_msg(x->lease == y->lease && x->n_locations == y->n_locations, "%s", cases[k].what);
        for (size_t i = 0; i < x->n_locations; i++)
            ck_assert_msg(x->locations[i]->arena == y->locations[i]->arena &&
                          x->locations[i]->offset == y->locations[i]->offset &&
                          x->locations[i]->present == y->locations[i]->present, "%s", cases[k].what);
        wire_free_response(a);
        kvnode__response__free_unpacked(b, NULL);
    }
}
END_TEST

/* --- GET_BEGIN / PUT_BEGIN requests: the direct codec ------------------------ */

/* The fields of two requests of the key-list kinds are the same. */
static void assert_keys_req_eq(const Kvnode__Request *a, const Kvnode__Request *b, const char *what)
{
    ck_assert_msg(a->id == b->id && a->op_case == b->op_case, "%s: id / op", what);
    bool put = a->op_case == KVNODE__REQUEST__OP_PUT_BEGIN;
    ck_assert_msg(put || a->op_case == KVNODE__REQUEST__OP_GET_BEGIN, "%s: op %d", what, (int)a->op_case);
    size_t na = put ? a->put_begin->n_keys : a->get_begin->n_keys, nb = put ? b->put_begin->n_keys : b->get_begin->n_keys;
    const int64_t *ka = put ? a->put_begin->keys : a->get_begin->keys, *kb = put ? b->put_begin->keys : b->get_begin->keys;
    size_t ca = put ? a->put_begin->n_checks : a->get_begin->n_checks;
    size_t cb = put ? b->put_begin->n_checks : b->get_begin->n_checks;
    const uint64_t *wa = put ? a->put_begin->checks : a->get_begin->checks;
    const uint64_t *wb = put ? b->put_begin->checks : b->get_begin->checks;
    ck_assert_msg(na == nb && ca == cb, "%s: %zu/%zu keys, %zu/%zu checks", what, na, nb, ca, cb);
    ck_assert_msg(na == 0 || memcmp(ka, kb, na * sizeof *ka) == 0, "%s: keys differ", what);
    ck_assert_msg(ca == 0 || memcmp(wa, wb, ca * sizeof *wa) == 0, "%s: checks differ", what);
    if (put)
        ck_assert_msg(a->put_begin->tier == b->put_begin->tier, "%s: tier %d / %d", what,
                      (int)a->put_begin->tier, (int)b->put_begin->tier);
}

/* A request of n keys (GET_BEGIN or PUT_BEGIN, with check words or not)
 * packed by wire_pack and by protobuf-c: the same bytes; wire_unpack_request
 * of them: what protobuf-c reads (freed by kvnode__request__free_unpacked);
 * of every prefix: NULL where protobuf-c reads nothing. */
START_TEST(test_keys_codec_as_protobuf)
{
    static int64_t keys[300];
    static uint64_t checks[300];
    static const int tiers[] = { 0, KVNODE__TIER__TIER_HOST, KVNODE__TIER__TIER_HBM, -1, 300, INT32_MIN };
    for (int round = 0; round < 400; round++) {
        size_t n = round < 300 ? (size_t)round : (size_t)(locs_next() % 300);
        for (size_t i = 0; i < n; i++) {
            keys[i] = (int64_t)(locs_next() % 3 == 0 ? locs_value(0) : locs_next());
            checks[i] = locs_value(0);
        }
        Kvnode__Request r = KVNODE__REQUEST__INIT;
        Kvnode__GetBeginRequest g = KVNODE__GET_BEGIN_REQUEST__INIT;
        Kvnode__PutBeginRequest pb = KVNODE__PUT_BEGIN_REQUEST__INIT;
        bool put = round % 2 == 1, with_checks = round % 3 == 0;
        r.id = locs_value(0);
        if (put) {
            pb.n_keys = n;
            pb.keys = n ? keys : NULL;
            pb.n_checks = with_checks ? n : 0;
            pb.checks = with_checks && n ? checks : NULL;
            pb.tier = (Kvnode__Tier)tiers[(size_t)round / 2 % (sizeof tiers / sizeof tiers[0])];
            r.op_case = KVNODE__REQUEST__OP_PUT_BEGIN;
            r.put_begin = &pb;
        } else {
            g.n_keys = n;
            g.keys = n ? keys : NULL;
            g.n_checks = with_checks ? n : 0;
            g.checks = with_checks && n ? checks : NULL;
            r.op_case = KVNODE__REQUEST__OP_GET_BEGIN;
            r.get_begin = &g;
        }
        size_t want_len;
        uint8_t *want = pack_as_protobuf_c(&r.base, round, &want_len);

        Kvnode__Request *u = wire_unpack_request(want, want_len);
        ck_assert_ptr_nonnull(u);
        assert_keys_req_eq(u, &r, "round trip");
        kvnode__request__free_unpacked(u, NULL);
        for (size_t cut = 0; cut < want_len && round < 40; cut++) {
            uint8_t *p = malloc(cut ? cut : 1);
            ck_assert_ptr_nonnull(p);
            memcpy(p, want, cut);
            Kvnode__Request *a = wire_unpack_request(p, cut), *b = kvnode__request__unpack(NULL, cut, p);
            ck_assert_int_eq(a != NULL, b != NULL);
            if (a) {
                ck_assert_int_eq(a->op_case, b->op_case);
                if (a->op_case == KVNODE__REQUEST__OP_GET_BEGIN || a->op_case == KVNODE__REQUEST__OP_PUT_BEGIN)
                    assert_keys_req_eq(a, b, "prefix");
                kvnode__request__free_unpacked(a, NULL);
                kvnode__request__free_unpacked(b, NULL);
            }
            free(p);
        }
        free(want);
    }
}
END_TEST

/* Bytes in other forms than protobuf-c packs (keys not packed, fields out
 * of order or twice, an unknown field, overlong and 11-byte varints, empty
 * lists, check words not a multiple of 8 bytes, a tier past 32 bits) still
 * read as protobuf-c reads them. */
START_TEST(test_keys_unpack_other_forms)
{
    static const struct {
        const char *what;
        uint8_t bytes[40];
        size_t len;
    } cases[] = {
        { "keys not packed", { 0x62, 0x04, 0x08, 0x05, 0x08, 0x07 }, 6 },
        { "checks before keys", { 0x62, 0x0d, 0x12, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x01, 0x05 }, 15 },
        { "keys twice", { 0x62, 0x06, 0x0a, 0x01, 0x05, 0x0a, 0x01, 0x07 }, 8 },
        { "an unknown field", { 0x62, 0x05, 0x0a, 0x01, 0x05, 0x20, 0x07 }, 7 },
        { "overlong varint key", { 0x62, 0x04, 0x0a, 0x02, 0x85, 0x00 }, 6 },
        { "11-byte varint key", { 0x62, 0x0d, 0x0a, 0x0b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                  0xff, 0xff, 0x01 }, 15 },
        { "10-byte varint key", { 0x62, 0x0c, 0x0a, 0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                  0xff, 0x7f }, 14 },
        { "unterminated key", { 0x62, 0x03, 0x0a, 0x01, 0x85 }, 5 },
        { "empty keys", { 0x62, 0x02, 0x0a, 0x00 }, 4 },
        { "empty checks", { 0x62, 0x05, 0x0a, 0x01, 0x05, 0x12, 0x00 }, 7 },
        { "checks of 7 bytes", { 0x62, 0x0c, 0x0a, 0x01, 0x05, 0x12, 0x07, 1, 2, 3, 4, 5, 6, 7 }, 14 },
        { "tier after checks", { 0x72, 0x0e, 0x0a, 0x01, 0x05, 0x1a, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 0x10, 0x01 }, 17 },
        { "tier past 32 bits", { 0x72, 0x09, 0x0a, 0x01, 0x05, 0x10, 0x81, 0x80, 0x80, 0x80, 0x10 }, 11 },
        { "tier twice", { 0x72, 0x07, 0x0a, 0x01, 0x05, 0x10, 0x01, 0x10, 0x02 }, 9 },
        { "get_begin with a tier", { 0x62, 0x05, 0x0a, 0x01, 0x05, 0x10, 0x01 }, 7 },
        { "id after the op", { 0x62, 0x03, 0x0a, 0x01, 0x05, 0x08, 0x09 }, 7 },
        { "op twice", { 0x62, 0x03, 0x0a, 0x01, 0x05, 0x62, 0x03, 0x0a, 0x01, 0x07 }, 10 },
        { "sub-message short", { 0x62, 0x04, 0x0a, 0x01, 0x05 }, 5 },
        { "a field numbered 0", { 0x62, 0x05, 0x0a, 0x01, 0x05, 0x80, 0x00 }, 7 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Kvnode__Request *a = wire_unpack_request(cases[k].bytes, cases[k].len);
        Kvnode__Request *b = kvnode__request__unpack(NULL, cases[k].len, cases[k].bytes);
        if (b && k == sizeof cases / sizeof cases[0] - 1) {   /* field 0: wire refuses it */
            ck_assert_ptr_null(a);
            kvnode__request__free_unpacked(b, NULL);
            continue;
        }
        ck_assert_msg((a != NULL) == (b != NULL), "%s", cases[k].what);
        if (!a)
            continue;
        assert_keys_req_eq(a, b, cases[k].what);
        kvnode__request__free_unpacked(a, NULL);
        kvnode__request__free_unpacked(b, NULL);
    }
}
END_TEST

START_TEST(test_op_names)
{
    static const struct { int op; const char *name; } ops[] = {
        {KVNODE__REQUEST__OP_HELLO, "hello"},           {KVNODE__REQUEST__OP_MATCH, "match"},
        {KVNODE__REQUEST__OP_GET_BEGIN, "get_begin"},   {KVNODE__REQUEST__OP_GET_END, "get_end"},
        {KVNODE__REQUEST__OP_PUT_BEGIN, "put_begin"},   {KVNODE__REQUEST__OP_PUT_COMMIT, "put_commit"},
        {KVNODE__REQUEST__OP_PUT_ABORT, "put_abort"},   {KVNODE__REQUEST__OP_GET_INLINE, "get_inline"},
        {KVNODE__REQUEST__OP_PUT_INLINE, "put_inline"}, {KVNODE__REQUEST__OP_DELETE, "delete"},
        {KVNODE__REQUEST__OP_STATS, "stats"},           {KVNODE__REQUEST__OP_PING, "ping"},
        {KVNODE__REQUEST__OP_RELOAD, "reload"},
        { KVNODE__REQUEST__OP_MATCH_REMOTE, "match_remote" },
    };
    size_t i;

    for (i = 0; i < sizeof ops / sizeof ops[0]; i++)
        ck_assert_str_eq(wire_op_name(ops[i].op), ops[i].name);
    ck_assert_str_eq(wire_op_name(KVNODE__REQUEST__OP__NOT_SET), "unknown");
    ck_assert_str_eq(wire_op_name(9), "unknown");
    ck_assert_str_eq(wire_op_name(24), "unknown");
    ck_assert_str_eq(wire_op_name(-1), "unknown");
}
END_TEST

static Suite *wire_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("header");

    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_header_round_trip);
    tcase_add_test(tc, test_header_little_endian);
    tcase_add_test(tc, test_header_empty_is_eproto);
    tcase_add_test(tc, test_header_over_max_is_etoobig);
    suite_add_tcase(s, tc);

    tc = tcase_create("pack");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_pack_frame_layout);
    tcase_add_test(tc, test_pack_over_max_is_etoobig);
    tcase_add_test(tc, test_pack_empty_and_null);
    tcase_add_test(tc, test_op_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("unpack");
    tcase_set_timeout(tc, 120);   /* slow under valgrind */
    tcase_add_test(tc, test_unpack_every_prefix);
    tcase_add_test(tc, test_unpack_random_garbage);
    tcase_add_test(tc, test_unpack_null_payload);
    tcase_add_test(tc, test_unpack_field_zero);
    tcase_add_test(tc, test_round_trip_requests);
    tcase_add_test(tc, test_round_trip_responses);
    tcase_add_test(tc, test_locs_codec_as_protobuf);
    tcase_add_test(tc, test_locs_unpack_other_forms);
    tcase_add_test(tc, test_keys_codec_as_protobuf);
    tcase_add_test(tc, test_keys_unpack_other_forms);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(wire_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
