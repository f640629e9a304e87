/* wire: frame codec shared by libkvnode and kvnoded (see wire.h).
 * Pure functions: no I/O, no global state. */
#include <stdlib.h>
#include <string.h>

#include "kvnode.h"
#include "wire.h"

/* The ceiling applies whatever the caller's configuration says. */
static uint32_t wire_effective_max(uint32_t max_frame)
{
    return max_frame < WIRE_FRAME_LIMIT ? max_frame : WIRE_FRAME_LIMIT;
}

int wire_frame_len(const uint8_t hdr[WIRE_HEADER_BYTES], uint32_t max_frame, uint32_t *len)
{
    uint32_t n = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                 (uint32_t)hdr[3] << 24;

    if (n == 0)
        return -KVNODE_EPROTO;
    if (n > wire_effective_max(max_frame))
        return -KVNODE_ETOOBIG;
    *len = n;
    return 0;
}

void wire_put_len(uint8_t hdr[WIRE_HEADER_BYTES], uint32_t len)
{
    hdr[0] = (uint8_t)len;
    hdr[1] = (uint8_t)(len >> 8);
    hdr[2] = (uint8_t)(len >> 16);
    hdr[3] = (uint8_t)(len >> 24);
}

int wire_pack(const ProtobufCMessage *msg, uint32_t max_frame, uint8_t **frame, size_t *frame_len)
{
    size_t cap = 0;

    *frame = NULL;
    return wire_pack_reuse(msg, max_frame, frame, &cap, frame_len);
}

int wire_pack_reuse(const ProtobufCMessage *msg, uint32_t max_frame, uint8_t **buf, size_t *cap,
                    size_t *frame_len)
{
    size_t size, packed;

    *frame_len = 0;
    if (!msg)
        return -KVNODE_EINVAL;
    size = protobuf_c_message_get_packed_size(msg);
    /* Receivers reject empty frames, so never produce one. */
    if (size == 0)
        return -KVNODE_EPROTO;
    if (size > wire_effective_max(max_frame))
        return -KVNODE_ETOOBIG;
    if (!*buf || *cap < WIRE_HEADER_BYTES + size) {
        uint8_t *nb = realloc(*buf, WIRE_HEADER_BYTES + size);
        if (!nb)
            return -KVNODE_ENOMEM;
        *buf = nb;
        *cap = WIRE_HEADER_BYTES + size;
    }
    packed = protobuf_c_message_pack(msg, *buf + WIRE_HEADER_BYTES);
    if (packed != size)    /* only a corrupt message object can get here */
        return -KVNODE_EPROTO;
    wire_put_len(*buf, (uint32_t)size);
    *frame_len = WIRE_HEADER_BYTES + size;
    return 0;
}

/* true when m or a message inside it kept an unknown field numbered 0.
 * Field 0 is invalid protobuf, but protobuf-c 1.4 accepts it when the tag is
 * encoded overlong (0x80 0x00) and then packs it as 0x00, which it rejects:
 * such a message would not survive a re-pack, so it is refused up front. */
static int wire_has_field_zero(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m;
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(const void *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v =
                *(ProtobufCMessage *const *const *)(const void *)(base + f->offset);
            for (size_t j = 0; j < n; j++)
                if (v[j] && wire_has_field_zero(v[j]))
                    return 1;
            continue;
        }
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(const void *)(base + f->quantifier_offset) != f->id)
            continue;
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(const void *)(base + f->offset);
        if (sub && wire_has_field_zero(sub))
            return 1;
    }
    return 0;
}

Kvnode__Request *wire_unpack_request(const uint8_t *payload, size_t len)
{
    if (!payload && len > 0)
        return NULL;
    Kvnode__Request *m = kvnode__request__unpack(NULL, len, payload);
    if (m && wire_has_field_zero(&m->base)) {
        kvnode__request__free_unpacked(m, NULL);
        return NULL;
    }
    return m;
}

Kvnode__Response *wire_unpack_response(const uint8_t *payload, size_t len)
{
    return wire_unpack_response_with(payload, len, NULL);
}

Kvnode__Response *wire_unpack_response_with(const uint8_t *payload, size_t len,
                                            ProtobufCAllocator *alloc)
{
    if (!payload && len > 0)
        return NULL;
    Kvnode__Response *m = kvnode__response__unpack(alloc, len, payload);
    if (m && wire_has_field_zero(&m->base)) {
        kvnode__response__free_unpacked(m, alloc);
        return NULL;
    }
    return m;
}

const char *wire_op_name(int op_case)
{
    switch (op_case) {
    case KVNODE__REQUEST__OP_HELLO:      return "hello";
    case KVNODE__REQUEST__OP_MATCH:      return "match";
    case KVNODE__REQUEST__OP_GET_BEGIN:  return "get_begin";
    case KVNODE__REQUEST__OP_GET_END:    return "get_end";
    case KVNODE__REQUEST__OP_PUT_BEGIN:  return "put_begin";
    case KVNODE__REQUEST__OP_PUT_COMMIT: return "put_commit";
    case KVNODE__REQUEST__OP_PUT_ABORT:  return "put_abort";
    case KVNODE__REQUEST__OP_GET_INLINE: return "get_inline";
    case KVNODE__REQUEST__OP_PUT_INLINE: return "put_inline";
    case KVNODE__REQUEST__OP_DELETE:     return "delete";
    case KVNODE__REQUEST__OP_STATS:      return "stats";
    case KVNODE__REQUEST__OP_PING:       return "ping";
    case KVNODE__REQUEST__OP_RELOAD:     return "reload";
    case KVNODE__REQUEST__OP_MATCH_REMOTE: return "match_remote";
    case KVNODE__REQUEST__OP_PURGE:      return "purge";
    default:                             return "unknown";
    }
}
