/* kvs/file format: the segment log's record header and hint file pieces,
 * encoded and decoded, little-endian (format: see file.h). The layout
 * record's payload is the file_v1 layout file, byte for byte (one codec).
 * Pure functions, any thread. */
#include "persist/kvs/file_internal.h"

#include <string.h>

#include "core/le.h"
#include "persist/kvs/crc32c.h"
#include "persist/kvs/file_v1.h"

_Static_assert(SEG_LAYOUT_SIZE == LAYOUT_SIZE, "one layout record for both formats");


void seg_rec_encode(uint8_t b[SEG_REC_HDR], const struct seg_rec *r)
{
    memset(b, 0, SEG_REC_HDR);
    memcpy(b, "KVSR", 4);
    le_put16(b + 4, SEG_VERSION);
    b[6] = r->type;
    le_put64(b + 8, r->fingerprint);
    le_put64(b + 16, (uint64_t)r->key);
    le_put64(b + 24, r->size);
    le_put64(b + 32, r->seq);
    le_put32(b + 40, r->rank);
    le_put32(b + 44, r->crc);
    le_put64(b + 48, r->check);
    le_put32(b + 60, crc32c(0, b, 60));
}

const char *seg_rec_decode(const uint8_t b[SEG_REC_HDR], struct seg_rec *r)
{
    if (memcmp(b, "KVSR", 4) != 0)
        return "bad record magic";
    if (le_get32(b + 60) != crc32c(0, b, 60))
        return "record header checksum mismatch";
    unsigned version = le_get16(b + 4);
    if (version != SEG_VERSION && version != SEG_VERSION_V1)
        return "unknown record version";
    r->type = b[6];
    if (r->type < SEG_REC_BLOCK || r->type > SEG_REC_PAD || b[7] != 0)
        return "unknown record type";
    r->fingerprint = le_get64(b + 8);
    r->key = (int64_t)le_get64(b + 16);
    r->size = le_get64(b + 24);
    r->seq = le_get64(b + 32);
    r->rank = le_get32(b + 40);
    r->crc = le_get32(b + 44);
    /* Version 1 records predate check words: their blocks have none. */
    r->check = version == SEG_VERSION_V1 ? 0 : le_get64(b + 48);
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
    le_put32(b + 4, e->rank);
    le_put64(b + 8, e->fingerprint);
    le_put64(b + 16, (uint64_t)e->key);
    le_put64(b + 24, e->size);
    le_put64(b + 32, e->seq);
    le_put64(b + 40, e->off);
    le_put32(b + 48, e->crc);
    le_put64(b + 56, e->check);
}

void seg_hint_ent_decode(const uint8_t *b, unsigned version, struct seg_hint_ent *e)
{
    e->type = b[0];
    e->rank = le_get32(b + 4);
    e->fingerprint = le_get64(b + 8);
    e->key = (int64_t)le_get64(b + 16);
    e->size = le_get64(b + 24);
    e->seq = le_get64(b + 32);
    e->off = le_get64(b + 40);
    e->crc = le_get32(b + 48);
    e->check = version == SEG_VERSION_V1 ? 0 : le_get64(b + 56);
}

void seg_hint_hdr_encode(uint8_t b[SEG_HINT_HDR], uint64_t id, uint64_t seg_len,
                         uint32_t nlayouts, uint32_t nents)
{
    memset(b, 0, SEG_HINT_HDR);
    memcpy(b, "KVSH", 4);
    le_put16(b + 4, SEG_VERSION);
    le_put16(b + 6, SEG_HINT_HDR);
    le_put64(b + 8, id);
    le_put64(b + 16, seg_len);
    le_put32(b + 24, nlayouts);
    le_put32(b + 28, nents);
    le_put32(b + 36, crc32c(0, b, 36));
}

const char *seg_hint_hdr_decode(const uint8_t b[SEG_HINT_HDR], uint64_t *id, uint64_t *seg_len,
                                uint32_t *nlayouts, uint32_t *nents, unsigned *version)
{
    if (memcmp(b, "KVSH", 4) != 0)
        return "bad hint magic";
    if (le_get32(b + 36) != crc32c(0, b, 36))
        return "hint header checksum mismatch";
    *version = le_get16(b + 4);
    if ((*version != SEG_VERSION && *version != SEG_VERSION_V1) || le_get16(b + 6) != SEG_HINT_HDR)
        return "unknown hint version";
    *id = le_get64(b + 8);
    *seg_len = le_get64(b + 16);
    *nlayouts = le_get32(b + 24);
    *nents = le_get32(b + 28);
    return NULL;
}
