/* kvs/file format: the segment log's record header and hint file pieces,
 * encoded and decoded, little-endian (format: see file.h). The layout
 * record's payload is the file_v1 layout file, byte for byte (one codec).
 * Pure functions, any thread. */
#include "persist/kvs/file_internal.h"

#include <string.h>

#include "persist/kvs/crc32c.h"
#include "persist/kvs/file_v1.h"

_Static_assert(SEG_LAYOUT_SIZE == LAYOUT_SIZE, "one layout record for both formats");

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
void seg_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
uint32_t seg_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void seg_rec_encode(uint8_t b[SEG_REC_HDR], const struct seg_rec *r)
{
    memset(b, 0, SEG_REC_HDR);
    memcpy(b, "KVSR", 4);
    put16(b + 4, SEG_VERSION);
    b[6] = r->type;
    put64(b + 8, r->fingerprint);
    put64(b + 16, (uint64_t)r->key);
    put64(b + 24, r->size);
    put64(b + 32, r->seq);
    seg_put32(b + 40, r->rank);
    seg_put32(b + 44, r->crc);
    seg_put32(b + 60, crc32c(0, b, 60));
}

const char *seg_rec_decode(const uint8_t b[SEG_REC_HDR], struct seg_rec *r)
{
    if (memcmp(b, "KVSR", 4) != 0)
        return "bad record magic";
    if (seg_get32(b + 60) != crc32c(0, b, 60))
        return "record header checksum mismatch";
    if (get16(b + 4) != SEG_VERSION)
        return "unknown record version";
    r->type = b[6];
    if (r->type < SEG_REC_BLOCK || r->type > SEG_REC_PAD || b[7] != 0)
        return "unknown record type";
    r->fingerprint = get64(b + 8);
    r->key = (int64_t)get64(b + 16);
    r->size = get64(b + 24);
    r->seq = get64(b + 32);
    r->rank = seg_get32(b + 40);
    r->crc = seg_get32(b + 44);
    if (r->size > (UINT64_C(1) << 40))
        return "record payload size out of range";
    if (r->type == SEG_REC_TOMB && r->size != 0)
        return "tombstone with a payload";
    if (r->type == SEG_REC_LAYOUT && r->size != SEG_LAYOUT_SIZE)
        return "layout record of the wrong size";
    return NULL;
}

void seg_layout_encode(uint8_t b[SEG_LAYOUT_SIZE], const struct ns_layout *l, uint64_t fp)
{
    file_layout_encode(b, l, fp);
}

const char *seg_layout_decode(const uint8_t *b, size_t n, const char *tenant, struct ns_layout *l,
                              uint64_t *fp)
{
    return file_layout_decode(b, n, tenant, l, fp);
}

void seg_hint_ent_encode(uint8_t b[SEG_HINT_ENT], const struct seg_hint_ent *e)
{
    memset(b, 0, SEG_HINT_ENT);
    b[0] = e->type;
    seg_put32(b + 4, e->rank);
    put64(b + 8, e->fingerprint);
    put64(b + 16, (uint64_t)e->key);
    put64(b + 24, e->size);
    put64(b + 32, e->seq);
    put64(b + 40, e->off);
    seg_put32(b + 48, e->crc);
}

void seg_hint_ent_decode(const uint8_t b[SEG_HINT_ENT], struct seg_hint_ent *e)
{
    e->type = b[0];
    e->rank = seg_get32(b + 4);
    e->fingerprint = get64(b + 8);
    e->key = (int64_t)get64(b + 16);
    e->size = get64(b + 24);
    e->seq = get64(b + 32);
    e->off = get64(b + 40);
    e->crc = seg_get32(b + 48);
}

void seg_hint_hdr_encode(uint8_t b[SEG_HINT_HDR], uint64_t id, uint64_t seg_len,
                         uint32_t nlayouts, uint32_t nents)
{
    memset(b, 0, SEG_HINT_HDR);
    memcpy(b, "KVSH", 4);
    put16(b + 4, SEG_VERSION);
    put16(b + 6, SEG_HINT_HDR);
    put64(b + 8, id);
    put64(b + 16, seg_len);
    seg_put32(b + 24, nlayouts);
    seg_put32(b + 28, nents);
    seg_put32(b + 36, crc32c(0, b, 36));
}

const char *seg_hint_hdr_decode(const uint8_t b[SEG_HINT_HDR], uint64_t *id, uint64_t *seg_len,
                                uint32_t *nlayouts, uint32_t *nents)
{
    if (memcmp(b, "KVSH", 4) != 0)
        return "bad hint magic";
    if (seg_get32(b + 36) != crc32c(0, b, 36))
        return "hint header checksum mismatch";
    if (get16(b + 4) != SEG_VERSION || get16(b + 6) != SEG_HINT_HDR)
        return "unknown hint version";
    *id = get64(b + 8);
    *seg_len = get64(b + 16);
    *nlayouts = seg_get32(b + 24);
    *nents = seg_get32(b + 28);
    return NULL;
}
