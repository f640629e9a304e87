/* Fuzz target: the engine-protocol frame codec (lib/wire.c).
 *
 * The first 4 bytes are a frame header for wire_frame_len (against several
 * limits); the rest is a payload for wire_unpack_request and
 * wire_unpack_response. Whatever decodes must pack again (wire_pack), the
 * packed frame must carry its own length, unpack to a message of the same
 * type and pack to the very same bytes (the codec's output is canonical). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kvnode.h"
#include "wire.h"

static void check_header(const uint8_t *hdr)
{
    static const uint32_t limits[] = { 0, 1, 16, 64u << 20, WIRE_FRAME_LIMIT, UINT32_MAX };
    uint32_t raw = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                   (uint32_t)hdr[3] << 24;
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        uint32_t len = 0xdeadbeefu;
        uint32_t max = limits[i] < WIRE_FRAME_LIMIT ? limits[i] : WIRE_FRAME_LIMIT;
        int rc = wire_frame_len(hdr, limits[i], &len);
        if (raw == 0) {
            FUZZ_CHECK(rc == -KVNODE_EPROTO);
        } else if (raw > max) {
            FUZZ_CHECK(rc == -KVNODE_ETOOBIG);
        } else {
            FUZZ_CHECK(rc == 0 && len == raw);
        }
        if (rc != 0)
            FUZZ_CHECK(len == 0xdeadbeefu);        /* untouched on error */
    }
    uint8_t back[WIRE_HEADER_BYTES];
    wire_put_len(back, raw);
    FUZZ_CHECK(memcmp(back, hdr, WIRE_HEADER_BYTES) == 0);
}

typedef ProtobufCMessage *(*unpack_fn)(const uint8_t *p, size_t n);

static ProtobufCMessage *unpack_req(const uint8_t *p, size_t n)
{
    return (ProtobufCMessage *)wire_unpack_request(p, n);
}

static ProtobufCMessage *unpack_resp(const uint8_t *p, size_t n)
{
    return (ProtobufCMessage *)wire_unpack_response(p, n);
}

/* m decoded from the input: pack, unpack, pack again; both packs equal. */
static void check_roundtrip(ProtobufCMessage *m, unpack_fn unpack)
{
    uint8_t *f1 = NULL, *f2 = NULL;
    size_t n1 = 0, n2 = 0;
    int rc = wire_pack(m, WIRE_FRAME_LIMIT, &f1, &n1);
    size_t packed = protobuf_c_message_get_packed_size(m);
    if (packed == 0) {                              /* an empty message: never framed */
        FUZZ_CHECK(rc == -KVNODE_EPROTO && n1 == 0);
        free(f1);
        return;
    }
    FUZZ_CHECK(rc == 0 && f1 && n1 == WIRE_HEADER_BYTES + packed);
    uint32_t len = 0;
    FUZZ_CHECK(wire_frame_len(f1, WIRE_FRAME_LIMIT, &len) == 0 && len == packed);

    /* over a smaller limit: refused, nothing produced */
    if (packed > 1) {
        uint8_t *small = NULL;
        size_t cap = 0, sn = 1;
        FUZZ_CHECK(wire_pack_reuse(m, (uint32_t)packed - 1, &small, &cap, &sn) ==
                   -KVNODE_ETOOBIG && sn == 0);
        free(small);
    }

    ProtobufCMessage *m2 = unpack(f1 + WIRE_HEADER_BYTES, packed);
    FUZZ_CHECK(m2 != NULL);
    FUZZ_CHECK(m2->descriptor == m->descriptor);
    FUZZ_CHECK(wire_pack(m2, WIRE_FRAME_LIMIT, &f2, &n2) == 0);
    FUZZ_CHECK(n2 == n1 && memcmp(f1, f2, n1) == 0);

    /* reusing a buffer gives the same frame */
    uint8_t *buf = malloc(3);
    size_t cap = 3, n3 = 0;
    FUZZ_CHECK(buf != NULL);
    FUZZ_CHECK(wire_pack_reuse(m2, WIRE_FRAME_LIMIT, &buf, &cap, &n3) == 0);
    FUZZ_CHECK(n3 == n1 && cap >= n3 && memcmp(buf, f1, n1) == 0);
    free(buf);

    if (m2->descriptor == &kvnode__response__descriptor)
        wire_free_response((Kvnode__Response *)m2);   /* wire_unpack_response's own */
    else
        protobuf_c_message_free_unpacked(m2, NULL);
    free(f1);
    free(f2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *payload = data;
    size_t n = size;
    if (size >= WIRE_HEADER_BYTES) {
        check_header(data);
        payload += WIRE_HEADER_BYTES;
        n -= WIRE_HEADER_BYTES;
    }
    /* an exact-size copy: a read past the payload is a sanitizer report */
    uint8_t *copy = malloc(n ? n : 1);
    FUZZ_CHECK(copy != NULL);
    memcpy(copy, payload, n);

    ProtobufCMessage *rq = unpack_req(copy, n);
    if (rq) {
        FUZZ_CHECK(rq->descriptor == &kvnode__request__descriptor);
        FUZZ_CHECK(wire_op_name((int)((Kvnode__Request *)rq)->op_case) != NULL);
        check_roundtrip(rq, unpack_req);
        kvnode__request__free_unpacked((Kvnode__Request *)rq, NULL);
    }
    ProtobufCMessage *rs = unpack_resp(copy, n);
    if (rs) {
        FUZZ_CHECK(rs->descriptor == &kvnode__response__descriptor);
        check_roundtrip(rs, unpack_resp);
        wire_free_response((Kvnode__Response *)rs);
    }
    free(copy);
    return 0;
}
