/* wire: framing of engine-protocol messages, shared by libkvnode and kvnoded.
 * A frame is a 4-byte little-endian payload length followed by one packed
 * Kvnode__Request or Kvnode__Response. Lengths are checked against the
 * receiver's maximum before anything is allocated. Pure functions, no I/O. */
#ifndef KVNODE_WIRE_H
#define KVNODE_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include "kvnode.pb-c.h"

#define WIRE_HEADER_BYTES 4u
#define WIRE_PROTOCOL_VERSION 1u
/* Absolute ceiling on any frame, whatever the configuration says. */
#define WIRE_FRAME_LIMIT (1u << 30)

/* Decode a frame header. Returns 0 and sets *len, -KVNODE_EPROTO for an empty
 * frame, -KVNODE_ETOOBIG when the length exceeds max_frame (or WIRE_FRAME_LIMIT). */
int wire_frame_len(const uint8_t hdr[WIRE_HEADER_BYTES], uint32_t max_frame, uint32_t *len);
void wire_put_len(uint8_t hdr[WIRE_HEADER_BYTES], uint32_t len);

/* Pack a message into a malloc()ed frame (header + payload). Returns 0,
 * -KVNODE_ETOOBIG when the payload exceeds max_frame (or WIRE_FRAME_LIMIT),
 * -KVNODE_ENOMEM, -KVNODE_EPROTO when the message packs to 0 bytes (an empty
 * frame is invalid on the wire), -KVNODE_EINVAL when msg is NULL. */
int wire_pack(const ProtobufCMessage *msg, uint32_t max_frame, uint8_t **frame, size_t *frame_len);

/* Unpack a payload (without header). NULL when it is not a valid message of
 * that type (a field numbered 0 anywhere included, which protobuf-c would
 * otherwise keep as an unknown field it cannot pack back). Free with
 * kvnode__request__free_unpacked / ..response... */
/* Same, into *buf (grown with realloc as needed, *cap its size), so a caller
 * can reuse one buffer for every frame. On error *buf stays valid. */
int wire_pack_reuse(const ProtobufCMessage *msg, uint32_t max_frame, uint8_t **buf, size_t *cap,
                    size_t *frame_len);

/* GET_BEGIN and PUT_BEGIN requests in the form wire_pack writes them are
 * read directly, into the same allocations protobuf-c makes. */
Kvnode__Request *wire_unpack_request(const uint8_t *payload, size_t len);
/* A response; free it with wire_free_response (GET_BEGIN and PUT_BEGIN
 * replies are read by a direct reader into one allocation, which
 * kvnode__response__free_unpacked must not be given). */
Kvnode__Response *wire_unpack_response(const uint8_t *payload, size_t len);
void wire_free_response(Kvnode__Response *m);
/* Same, allocating through `alloc` (NULL: as wire_unpack_response). Free
 * with kvnode__response__free_unpacked and the same allocator (NULL: with
 * wire_free_response). */
Kvnode__Response *wire_unpack_response_with(const uint8_t *payload, size_t len,
                                            ProtobufCAllocator *alloc);

/* Name of a request op for logs and metrics ("hello", "match", ...). */
const char *wire_op_name(int op_case);

#endif
