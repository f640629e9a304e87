/* wire: frame codec shared by libkvnode and kvnoded (see wire.h).
 * Pure functions: no I/O, no global state. */
#include <stdbool.h>
#include <stddef.h>
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

/* --- replies of one Location per key ------------------------------------------
 * GET_BEGIN and PUT_BEGIN replies carry a Location per key (256 for a chain):
 * protobuf-c's reflective codec took ~9 us to pack and ~14 us to unpack one
 * of 256 (~35 ns per location each way). These write and read the same bytes
 * directly: fields in number order, proto3 defaults left out, as protobuf-c
 * packs them. A reply with anything else (an error, an unknown field), or
 * bytes in any other form, goes through protobuf-c. */

#define WIRE_TAG(field, type) ((uint8_t)((field) << 3 | (type)))   /* fields < 16 */

static size_t wire_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *wire_put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* The lease reply inside a Response of one of the two kinds, or NULL. */
static const Kvnode__GetBeginReply *wire_locs_reply(const Kvnode__Response *r, uint8_t *tag)
{
    const ProtobufCMessage *sub;
    if (r->error || r->base.n_unknown_fields)
        return NULL;
    if (r->result_case == KVNODE__RESPONSE__RESULT_GET_BEGIN) {
        sub = &r->get_begin->base;
        *tag = WIRE_TAG(KVNODE__RESPONSE__RESULT_GET_BEGIN, 2);
    } else if (r->result_case == KVNODE__RESPONSE__RESULT_PUT_BEGIN) {
        sub = &r->put_begin->base;
        *tag = WIRE_TAG(KVNODE__RESPONSE__RESULT_PUT_BEGIN, 2);
    } else {
        return NULL;
    }
    /* The two replies have the same fields in the same places. */
    _Static_assert(offsetof(Kvnode__GetBeginReply, lease) == offsetof(Kvnode__PutBeginReply, lease) &&
                   offsetof(Kvnode__GetBeginReply, n_locations) == offsetof(Kvnode__PutBeginReply, n_locations) &&
                   offsetof(Kvnode__GetBeginReply, locations) == offsetof(Kvnode__PutBeginReply, locations),
                   "GetBeginReply and PutBeginReply differ");
    if (!sub || sub->n_unknown_fields)
        return NULL;
    return (const Kvnode__GetBeginReply *)(const void *)sub;
}

static size_t wire_loc_len(const Kvnode__Location *l)
{
    return (l->arena ? 1 + wire_varint_len(l->arena) : 0) + (l->offset ? 1 + wire_varint_len(l->offset) : 0) +
           (l->present ? 2 : 0);
}

/* Packed size of r by the fast path, or 0 when it does not apply. */
static size_t wire_locs_size(const Kvnode__Response *r, const Kvnode__GetBeginReply **sub, uint8_t *tag,
                             size_t *sub_len)
{
    const Kvnode__GetBeginReply *g = wire_locs_reply(r, tag);
    if (!g)
        return 0;
    size_t n = g->lease ? 1 + wire_varint_len(g->lease) : 0;
    for (size_t i = 0; i < g->n_locations; i++) {
        const Kvnode__Location *l = g->locations[i];
        if (!l || l->base.n_unknown_fields)
            return 0;
        size_t ll = wire_loc_len(l);
        n += 1 + wire_varint_len(ll) + ll;
    }
    *sub = g;
    *sub_len = n;
    return (r->id ? 1 + wire_varint_len(r->id) : 0) + 1 + wire_varint_len(n) + n;
}

static void wire_locs_pack(const Kvnode__Response *r, const Kvnode__GetBeginReply *g, uint8_t tag, size_t sub_len,
                           uint8_t *p)
{
    if (r->id) {
        *p++ = WIRE_TAG(1, 0);
        p = wire_put_varint(p, r->id);
    }
    *p++ = tag;
    p = wire_put_varint(p, sub_len);
    if (g->lease) {
        *p++ = WIRE_TAG(1, 0);
        p = wire_put_varint(p, g->lease);
    }
    for (size_t i = 0; i < g->n_locations; i++) {
        const Kvnode__Location *l = g->locations[i];
        *p++ = WIRE_TAG(2, 2);
        p = wire_put_varint(p, wire_loc_len(l));
        if (l->arena) {
            *p++ = WIRE_TAG(1, 0);
            p = wire_put_varint(p, l->arena);
        }
        if (l->offset) {
            *p++ = WIRE_TAG(2, 0);
            p = wire_put_varint(p, l->offset);
        }
        if (l->present) {
            *p++ = WIRE_TAG(3, 0);
            *p++ = 1;
        }
    }
}

/* A varint at *p (before end) into *v; false when there is none. */
static bool wire_get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* One Location of exactly len bytes at *p into l (may be NULL: only checked). */
static bool wire_get_loc(const uint8_t **p, size_t len, Kvnode__Location *l)
{
    const uint8_t *q = *p, *end = q + len;
    uint64_t arena = 0, offset = 0, present = 0;
    if (q < end && *q == WIRE_TAG(1, 0) && (q++, !wire_get_varint(&q, end, &arena) || arena > UINT32_MAX))
        return false;
    if (q < end && *q == WIRE_TAG(2, 0) && (q++, !wire_get_varint(&q, end, &offset)))
        return false;
    if (q < end && *q == WIRE_TAG(3, 0) && (q++, !wire_get_varint(&q, end, &present) || present > 1))
        return false;
    if (q != end)
        return false;
    if (l) {
        l->arena = (uint32_t)arena;
        l->offset = offset;
        l->present = present != 0;
    }
    *p = end;
    return true;
}

/* A reply read by wire_locs_unpack: one allocation; unknown_fields points
 * at wire_locs_mark (n_unknown_fields 0), which is how wire_free_response
 * tells it from protobuf-c's. */
struct wire_locs_block {
    Kvnode__Response r;
    union {
        Kvnode__GetBeginReply get;
        Kvnode__PutBeginReply put;
    } sub;
    Kvnode__Location *ptrs[];   /* then the Locations themselves */
};
static ProtobufCMessageUnknownField wire_locs_mark;

/* The fast reader: a Response of one of the two kinds in exactly the form
 * wire_locs_pack writes, in one allocation (a malloc per location was most
 * of protobuf-c's unpack). NULL when the bytes are in any other form, or
 * out of memory: protobuf-c then reads them (and fails the same way). */
static Kvnode__Response *wire_locs_unpack(const uint8_t *payload, size_t len)
{
    const uint8_t *p = payload, *end = payload + len;
    uint64_t id = 0, sub_len, lease = 0, n = 0;
    if (p < end && *p == WIRE_TAG(1, 0) && (p++, !wire_get_varint(&p, end, &id)))
        return NULL;
    if (p == end || (*p != WIRE_TAG(KVNODE__RESPONSE__RESULT_GET_BEGIN, 2) &&
                     *p != WIRE_TAG(KVNODE__RESPONSE__RESULT_PUT_BEGIN, 2)))
        return NULL;
    bool get = *p++ == WIRE_TAG(KVNODE__RESPONSE__RESULT_GET_BEGIN, 2);
    if (!wire_get_varint(&p, end, &sub_len) || sub_len != (uint64_t)(end - p))
        return NULL;
    if (p < end && *p == WIRE_TAG(1, 0) && (p++, !wire_get_varint(&p, end, &lease)))
        return NULL;
    const uint8_t *locs = p;
    while (p < end) {   /* count and check */
        uint64_t ll;
        if (*p++ != WIRE_TAG(2, 2) || !wire_get_varint(&p, end, &ll) || ll > (uint64_t)(end - p) ||
            !wire_get_loc(&p, (size_t)ll, NULL))
            return NULL;
        n++;
    }
    /* n < len: each location takes at least two bytes */
    struct wire_locs_block *blk = malloc(sizeof *blk + (size_t)n * (sizeof(Kvnode__Location *) +
                                                                      sizeof(Kvnode__Location)));
    if (!blk)
        return NULL;
    Kvnode__Response *r = &blk->r;
    Kvnode__GetBeginReply *g = &blk->sub.get;
    Kvnode__Location *items = (Kvnode__Location *)(void *)(blk->ptrs + n);
    kvnode__response__init(r);
    r->base.unknown_fields = &wire_locs_mark;
    r->id = id;
    if (get) {
        kvnode__get_begin_reply__init(g);
        r->result_case = KVNODE__RESPONSE__RESULT_GET_BEGIN;
        r->get_begin = g;
    } else {
        kvnode__put_begin_reply__init(&blk->sub.put);
        r->result_case = KVNODE__RESPONSE__RESULT_PUT_BEGIN;
        r->put_begin = &blk->sub.put;
    }
    g->lease = lease;
    g->n_locations = (size_t)n;
    g->locations = n ? blk->ptrs : NULL;
    p = locs;
    for (size_t i = 0; i < n; i++) {
        uint64_t ll = 0;
        kvnode__location__init(&items[i]);
        blk->ptrs[i] = &items[i];
        p++;
        (void)wire_get_varint(&p, end, &ll);
        (void)wire_get_loc(&p, (size_t)ll, &items[i]);
    }
    return r;
}

void wire_free_response(Kvnode__Response *m)
{
    if (m && m->base.unknown_fields == &wire_locs_mark)
        free(m);   /* the block begins with it */
    else if (m)
        kvnode__response__free_unpacked(m, NULL);
}

/* --- requests of one key list ---------------------------------------------------
 * GET_BEGIN and PUT_BEGIN requests carry 256 keys for a chain: protobuf-c
 * took ~1.3 us to pack and ~2.9 us to unpack their packed varints (~2.5 and
 * ~4 us with cold caches), on the client's and the daemon's side of every
 * batch. These write and read the same bytes directly, as the replies'
 * codec above: fields in number order, proto3 defaults and empty lists
 * left out, as protobuf-c packs them. Anything else (another op, unknown
 * fields, bytes in any other form) goes through protobuf-c. */

/* A GET_BEGIN's or PUT_BEGIN's fields, as the codec sees them. */
struct wire_keys_req {
    bool put;
    const int64_t *keys;
    size_t n_keys;
    const uint64_t *checks;
    size_t n_checks;
    int32_t tier;      /* PUT_BEGIN's */
};

/* Field tags inside the two requests (keys 1 in both; PUT_BEGIN: tier 2, checks 3). */
#define WIRE_KEYS_TAG    WIRE_TAG(1, 2)
#define WIRE_TIER_TAG    WIRE_TAG(2, 0)
#define WIRE_CHECKS_TAG(put) ((put) ? WIRE_TAG(3, 2) : WIRE_TAG(2, 2))
#define WIRE_KEYS_OP_TAG(put) \
    ((put) ? WIRE_TAG(KVNODE__REQUEST__OP_PUT_BEGIN, 2) : WIRE_TAG(KVNODE__REQUEST__OP_GET_BEGIN, 2))

static bool wire_keys_fields(const Kvnode__Request *r, struct wire_keys_req *k)
{
    if (r->base.n_unknown_fields)
        return false;
    if (r->op_case == KVNODE__REQUEST__OP_GET_BEGIN && r->get_begin && !r->get_begin->base.n_unknown_fields) {
        const Kvnode__GetBeginRequest *g = r->get_begin;
        *k = (struct wire_keys_req){ .keys = g->keys, .n_keys = g->n_keys, .checks = g->checks,
                                     .n_checks = g->n_checks };
    } else if (r->op_case == KVNODE__REQUEST__OP_PUT_BEGIN && r->put_begin &&
               !r->put_begin->base.n_unknown_fields) {
        const Kvnode__PutBeginRequest *p = r->put_begin;
        *k = (struct wire_keys_req){ .put = true, .keys = p->keys, .n_keys = p->n_keys, .checks = p->checks,
                                     .n_checks = p->n_checks, .tier = (int32_t)p->tier };
    } else {
        return false;
    }
    return (k->keys || !k->n_keys) && (k->checks || !k->n_checks);
}

static size_t wire_varint_len64(uint64_t v)
{
    return 1 + (size_t)(63 - __builtin_clzll(v | 1)) / 7;
}

/* The request's packed size by the fast path (0: it does not apply), and
 * its op's size and its keys' bytes. */
static size_t wire_keys_size(const ProtobufCMessage *msg, struct wire_keys_req *k, size_t *sub_len,
                             size_t *keys_len)
{
    if (msg->descriptor != &kvnode__request__descriptor)
        return 0;
    const Kvnode__Request *r = (const Kvnode__Request *)(const void *)msg;
    if (!wire_keys_fields(r, k))
        return 0;
    size_t kl = 0, n = 0;
    for (size_t i = 0; i < k->n_keys; i++)
        kl += wire_varint_len64((uint64_t)k->keys[i]);
    if (k->n_keys)
        n += 1 + wire_varint_len64(kl) + kl;
    if (k->put && k->tier)
        n += 1 + wire_varint_len64((uint64_t)(int64_t)k->tier);   /* a negative int32: 10 bytes */
    if (k->n_checks)
        n += 1 + wire_varint_len64(8 * k->n_checks) + 8 * k->n_checks;
    *sub_len = n;
    *keys_len = kl;
    return (r->id ? 1 + wire_varint_len64(r->id) : 0) + 1 + wire_varint_len64(n) + n;
}

static void wire_keys_pack(uint64_t id, const struct wire_keys_req *k, size_t sub_len, size_t keys_len,
                           uint8_t *p)
{
    if (id) {
        *p++ = WIRE_TAG(1, 0);
        p = wire_put_varint(p, id);
    }
    *p++ = WIRE_KEYS_OP_TAG(k->put);
    p = wire_put_varint(p, sub_len);
    if (k->n_keys) {
        *p++ = WIRE_KEYS_TAG;
        p = wire_put_varint(p, keys_len);
        for (size_t i = 0; i < k->n_keys; i++)
            p = wire_put_varint(p, (uint64_t)k->keys[i]);
    }
    if (k->put && k->tier) {
        *p++ = WIRE_TIER_TAG;
        p = wire_put_varint(p, (uint64_t)(int64_t)k->tier);
    }
    if (k->n_checks) {
        *p++ = WIRE_CHECKS_TAG(k->put);
        p = wire_put_varint(p, 8 * k->n_checks);
        for (size_t i = 0; i < k->n_checks; i++)
            for (int b = 0; b < 8; b++)
                *p++ = (uint8_t)(k->checks[i] >> (8 * b));
    }
}

/* A length-delimited field with tag `tag` at *p, if there is one: its bytes
 * (*at, *len; none: *len 0). false when it is malformed or empty (an empty
 * list protobuf-c would not have packed: it reads those bytes). */
static bool wire_get_list(const uint8_t **p, const uint8_t *end, uint8_t tag, const uint8_t **at, uint64_t *len)
{
    *len = 0;
    if (*p == end || **p != tag)
        return true;
    (*p)++;
    if (!wire_get_varint(p, end, len) || *len == 0 || *len > (uint64_t)(end - *p))
        return false;
    *at = *p;
    *p += *len;
    return true;
}

/* Seven bits of each of the 8 bytes of w, packed: the first 8 groups of a varint. */
static uint64_t wire_gather7(uint64_t w)
{
    w &= 0x7f7f7f7f7f7f7f7full;
    w = (w & 0x007f007f007f007full) | (w & 0x7f007f007f007f00ull) >> 1;
    w = (w & 0x00003fff00003fffull) | (w & 0x3fff00003fff0000ull) >> 2;
    return (w & 0x000000000fffffffull) | (w & 0x0fffffff00000000ull) >> 4;
}

/* wire_get_varint for a list of varints: the same values and failures,
 * 8 bytes at a time where 10 are left (a key of 64 random bits takes 9 or
 * 10 bytes: no branch on its length). */
static bool wire_get_varint_fast(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint8_t *q = *p;
    uint64_t w, stop;
    if (end - q < 10)
        return wire_get_varint(p, end, v);
    memcpy(&w, q, sizeof w);
    stop = ~w & 0x8080808080808080ull;
    if (stop) {   /* ends in the first 8 bytes */
        unsigned len = (unsigned)__builtin_ctzll(stop) / 8 + 1;
        *v = wire_gather7(len == 8 ? w : w & ((1ull << (8 * len)) - 1));
        *p = q + len;
        return true;
    }
    uint64_t more = q[8] >> 7, last = q[9] & (0u - more);   /* byte 9 only when byte 8 goes on */
    if (last & 0x80)
        return false;   /* over 10 bytes */
    *v = wire_gather7(w) | (uint64_t)(q[8] & 0x7f) << 56 | (last & 0x7f) << 63;
    *p = q + 9 + more;
    return true;
#else
    return wire_get_varint(p, end, v);
#endif
}

/* The request's op (GET_BEGIN or PUT_BEGIN), built as protobuf-c builds it
 * (one malloc per message and per list), so kvnode__request__free_unpacked
 * frees it. keys / checks: the lists' bytes. */
static Kvnode__Request *wire_keys_build(uint64_t id, bool put, const uint8_t *keys, uint64_t keys_len,
                                        const uint8_t *checks, uint64_t checks_len, int32_t tier)
{
    size_t n = 0;
    uint64_t at = 0;
    for (; at + 8 <= keys_len; at += 8) {   /* one byte without the continuation bit ends each */
        uint64_t w = 0;
        for (int b = 0; b < 8; b++)
            w |= (uint64_t)keys[at + (uint64_t)b] << (8 * b);
        n += (size_t)(((~w & 0x8080808080808080ull) >> 7) * 0x0101010101010101ull >> 56);
    }
    for (; at < keys_len; at++)
        n += !(keys[at] & 0x80);
    Kvnode__Request *r = malloc(sizeof *r);
    void *sub = malloc(put ? sizeof(Kvnode__PutBeginRequest) : sizeof(Kvnode__GetBeginRequest));
    int64_t *k = n ? malloc(n * sizeof *k) : NULL;
    uint64_t *c = checks_len ? malloc(checks_len) : NULL;
    bool ok = r && sub && (k || !n) && (c || !checks_len);
    const uint8_t *p = keys, *end = keys + keys_len;
    for (size_t i = 0; ok && i < n; i++) {
        uint64_t v;
        ok = wire_get_varint_fast(&p, end, &v);   /* over 10 bytes: protobuf-c decides */
        if (ok)
            k[i] = (int64_t)v;
    }
    if (!ok || p != end) {
        free(r);
        free(sub);
        free(k);
        free(c);
        return NULL;
    }
    for (size_t i = 0; i < checks_len / 8; i++) {
        uint64_t v = 0;
        for (int b = 7; b >= 0; b--)
            v = v << 8 | checks[8 * i + (size_t)b];
        c[i] = v;
    }
    kvnode__request__init(r);
    r->id = id;
    if (put) {
        Kvnode__PutBeginRequest *pb = sub;
        kvnode__put_begin_request__init(pb);
        pb->n_keys = n;
        pb->keys = k;
        pb->tier = (Kvnode__Tier)tier;
        pb->n_checks = (size_t)(checks_len / 8);
        pb->checks = c;
        r->op_case = KVNODE__REQUEST__OP_PUT_BEGIN;
        r->put_begin = pb;
    } else {
        Kvnode__GetBeginRequest *gb = sub;
        kvnode__get_begin_request__init(gb);
        gb->n_keys = n;
        gb->keys = k;
        gb->n_checks = (size_t)(checks_len / 8);
        gb->checks = c;
        r->op_case = KVNODE__REQUEST__OP_GET_BEGIN;
        r->get_begin = gb;
    }
    return r;
}

/* The fast reader: a GET_BEGIN or PUT_BEGIN request in exactly the form
 * wire_keys_pack writes, or NULL (any other form, or out of memory:
 * protobuf-c then reads the bytes, and fails the same way). */
static Kvnode__Request *wire_keys_unpack(const uint8_t *payload, size_t len)
{
    const uint8_t *p = payload, *end = payload + len, *keys = NULL, *checks = NULL;
    uint64_t id = 0, sub_len, keys_len, checks_len, tier = 0;
    if (p < end && *p == WIRE_TAG(1, 0) && (p++, !wire_get_varint(&p, end, &id)))
        return NULL;
    if (p == end || (*p != WIRE_KEYS_OP_TAG(false) && *p != WIRE_KEYS_OP_TAG(true)))
        return NULL;
    bool put = *p++ == WIRE_KEYS_OP_TAG(true);
    if (!wire_get_varint(&p, end, &sub_len) || sub_len != (uint64_t)(end - p) ||
        !wire_get_list(&p, end, WIRE_KEYS_TAG, &keys, &keys_len))
        return NULL;
    if (put && p < end && *p == WIRE_TIER_TAG && (p++, !wire_get_varint(&p, end, &tier)))
        return NULL;
    if (!wire_get_list(&p, end, WIRE_CHECKS_TAG(put), &checks, &checks_len) || checks_len % 8 || p != end)
        return NULL;
    /* An enum keeps the varint's low 32 bits, as protobuf-c's. */
    return wire_keys_build(id, put, keys, keys_len, checks, checks_len, (int32_t)(uint32_t)tier);
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
    const Kvnode__GetBeginReply *locs = NULL;
    size_t locs_len = 0, keys_sub = 0, keys_len = 0;
    uint8_t locs_tag = 0;
    struct wire_keys_req keys = { 0 };
    size = msg->descriptor == &kvnode__response__descriptor
               ? wire_locs_size((const Kvnode__Response *)(const void *)msg, &locs, &locs_tag, &locs_len)
               : 0;
    size_t keys_size = size ? 0 : wire_keys_size(msg, &keys, &keys_sub, &keys_len);
    size = size ? size : keys_size;
    if (size == 0)
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
    if (locs)
        wire_locs_pack((const Kvnode__Response *)(const void *)msg, locs, locs_tag, locs_len, *buf + WIRE_HEADER_BYTES);
    else if (keys_size)
        wire_keys_pack(((const Kvnode__Request *)(const void *)msg)->id, &keys, keys_sub, keys_len,
                       *buf + WIRE_HEADER_BYTES);
    packed = locs || keys_size ? size : protobuf_c_message_pack(msg, *buf + WIRE_HEADER_BYTES);
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
    Kvnode__Request *m = wire_keys_unpack(payload, len);
    if (m)
        return m;
    m = kvnode__request__unpack(NULL, len, payload);
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
    Kvnode__Response *m = alloc ? NULL : wire_locs_unpack(payload, len);
    if (m)
        return m;
    m = kvnode__response__unpack(alloc, len, payload);
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
