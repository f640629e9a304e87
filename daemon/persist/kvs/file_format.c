/* kvs/file format: the segment log's record header, layout record payload
 * and hint file pieces, encoded and decoded, little-endian (format: see
 * file.h). Pure functions, any thread. */
#include "persist/kvs/file_internal.h"

#include <string.h>

#include "core/le.h"
#include "persist/kvs/crc32c.h"

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
    if (r->type == SEG_REC_LAYOUT && r->size != SEG_LAYOUT_SIZE && r->size != SEG_LAYOUT_SIZE_V2)
        return "layout record of the wrong size";
    return NULL;
}

static void put_str(uint8_t **p, const char *s, size_t max)
{
    size_t n = strnlen(s, max);
    if (n == max)
        n = max - 1;
    memset(*p, 0, max);
    memcpy(*p, s, n);
    *p += max;
}

void seg_layout_encode(uint8_t *b, const struct ns_layout *l, uint64_t fp)
{
    uint8_t *p = b;
    bool v2 = l->revision[0] != '\0';
    memcpy(p, "KVNL", 4);
    le_put16(p + 4, v2 ? SEG_LAYOUT_VERSION_V2 : SEG_LAYOUT_VERSION);
    le_put16(p + 6, (uint16_t)(v2 ? SEG_LAYOUT_SIZE_V2 : SEG_LAYOUT_SIZE));
    le_put64(p + 8, fp);
    le_put64(p + 16, l->block_bytes);
    le_put32(p + 24, l->block_tokens);
    le_put32(p + 28, l->num_layers);
    le_put32(p + 32, l->kv_heads);
    le_put32(p + 36, l->head_dim);
    le_put32(p + 40, l->tp_size);
    le_put32(p + 44, l->tp_rank);
    p += 48;
    put_str(&p, l->model, NS_MODEL_MAX);
    put_str(&p, l->dtype, NS_DTYPE_MAX);
    put_str(&p, l->extra, NS_EXTRA_MAX);
    if (v2)
        put_str(&p, l->revision, NS_REVISION_MAX);
    le_put32(p, crc32c(0, b, (size_t)(p - b)));
}

static int get_str(const uint8_t **p, char *out, size_t max)
{
    if (memchr(*p, 0, max) == NULL)
        return -1;
    memcpy(out, *p, max);
    *p += max;
    return 0;
}

const char *seg_layout_decode(const uint8_t *b, size_t n, const char *tenant, struct ns_layout *l,
                              uint64_t *fp)
{
    char verr[128];
    const uint8_t *p = b + 48;
    if (n != SEG_LAYOUT_SIZE && n != SEG_LAYOUT_SIZE_V2)
        return "bad size";
    if (memcmp(b, "KVNL", 4) != 0)
        return "bad magic";
    unsigned version = le_get16(b + 4);
    if (version != (n == SEG_LAYOUT_SIZE ? SEG_LAYOUT_VERSION : SEG_LAYOUT_VERSION_V2))
        return "unknown format version";
    if (le_get16(b + 6) != n)
        return "bad record size";
    if (le_get32(b + n - 4) != crc32c(0, b, n - 4))
        return "checksum mismatch";
    memset(l, 0, sizeof(*l));
    *fp = le_get64(b + 8);
    l->block_bytes = le_get64(b + 16);
    l->block_tokens = le_get32(b + 24);
    l->num_layers = le_get32(b + 28);
    l->kv_heads = le_get32(b + 32);
    l->head_dim = le_get32(b + 36);
    l->tp_size = le_get32(b + 40);
    l->tp_rank = le_get32(b + 44);
    if (get_str(&p, l->model, NS_MODEL_MAX) || get_str(&p, l->dtype, NS_DTYPE_MAX) ||
        get_str(&p, l->extra, NS_EXTRA_MAX) ||
        (version == SEG_LAYOUT_VERSION_V2 && get_str(&p, l->revision, NS_REVISION_MAX)))
        return "unterminated string";
    if (version == SEG_LAYOUT_VERSION_V2 && !l->revision[0])
        return "version 2 without a revision";
    if (ns_layout_validate(l, verr, sizeof(verr)) != 0)
        return "invalid layout";
    if (ns_fingerprint_tenant(l, tenant) != *fp &&
        (ns_identity_is_v1(l) || l->revision[0] || ns_fingerprint_v1(l, tenant) != *fp))
        return "fingerprint does not match the layout (or the record is another tenant's)";
    return NULL;
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
