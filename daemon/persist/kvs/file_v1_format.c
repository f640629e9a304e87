/* kvs/file format: the on-disk records of the file backend — the 64-byte
 * block header and the layout file — encoded and decoded, little-endian
 * (format: see file.h). Pure functions, any thread. */
#include "persist/kvs/file_v1.h"

#include <string.h>

#include "persist/kvs/crc32c.h"

/* ---- little-endian encoding ---------------------------------------------- */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v)
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
static uint32_t get32(const uint8_t *p)
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

/* ---- block header ---------------------------------------------------------- */

void file_hdr_encode(uint8_t b[HDR_SIZE], const struct blk_hdr *h)
{
    memset(b, 0, HDR_SIZE);
    memcpy(b, "KVNB", 4);
    put16(b + 4, HDR_VERSION);
    put16(b + 6, HDR_SIZE);
    put64(b + 8, h->fingerprint);
    put64(b + 16, (uint64_t)h->key);
    put64(b + 24, h->size);
    put32(b + 32, h->rank);
    put32(b + 36, h->crc);
    put32(b + 60, crc32c(0, b, 60));
}

/* NULL when the header is well formed, else why not. */
const char *file_hdr_decode(const uint8_t b[HDR_SIZE], struct blk_hdr *h)
{
    if (memcmp(b, "KVNB", 4) != 0)
        return "bad magic";
    if (get16(b + 4) != HDR_VERSION)
        return "unknown format version";
    if (get16(b + 6) != HDR_SIZE)
        return "bad header size";
    if (get32(b + 60) != crc32c(0, b, 60))
        return "header checksum mismatch";
    for (int i = 40; i < 60; i++)
        if (b[i])
            return "reserved header bytes set";
    h->fingerprint = get64(b + 8);
    h->key = (int64_t)get64(b + 16);
    h->size = get64(b + 24);
    h->rank = get32(b + 32);
    h->crc = get32(b + 36);
    return NULL;
}

/* ---- layout record ----------------------------------------------------------- */

static void put_str(uint8_t **p, const char *s, size_t max)
{
    size_t n = strnlen(s, max);
    if (n == max)
        n = max - 1;
    memset(*p, 0, max);
    memcpy(*p, s, n);
    *p += max;
}

void file_layout_encode(uint8_t b[LAYOUT_SIZE], const struct ns_layout *l, uint64_t fp)
{
    uint8_t *p = b;
    memcpy(p, "KVNL", 4);
    put16(p + 4, LAYOUT_VERSION);
    put16(p + 6, LAYOUT_SIZE);
    put64(p + 8, fp);
    put64(p + 16, l->block_bytes);
    put32(p + 24, l->block_tokens);
    put32(p + 28, l->num_layers);
    put32(p + 32, l->kv_heads);
    put32(p + 36, l->head_dim);
    put32(p + 40, l->tp_size);
    put32(p + 44, l->tp_rank);
    p += 48;
    put_str(&p, l->model, NS_MODEL_MAX);
    put_str(&p, l->dtype, NS_DTYPE_MAX);
    put_str(&p, l->extra, NS_EXTRA_MAX);
    put32(p, crc32c(0, b, (size_t)(p - b)));
}

static int get_str(const uint8_t **p, char *out, size_t max)
{
    if (memchr(*p, 0, max) == NULL)
        return -1;
    memcpy(out, *p, max);
    *p += max;
    return 0;
}

const char *file_layout_decode(const uint8_t *b, size_t n, const char *tenant, struct ns_layout *l,
                               uint64_t *fp)
{
    char verr[128];
    const uint8_t *p = b + 48;
    if (n != LAYOUT_SIZE)
        return "bad size";
    if (memcmp(b, "KVNL", 4) != 0)
        return "bad magic";
    if (get16(b + 4) != LAYOUT_VERSION)
        return "unknown format version";
    if (get16(b + 6) != LAYOUT_SIZE)
        return "bad record size";
    if (get32(b + LAYOUT_SIZE - 4) != crc32c(0, b, LAYOUT_SIZE - 4))
        return "checksum mismatch";
    memset(l, 0, sizeof(*l));
    *fp = get64(b + 8);
    l->block_bytes = get64(b + 16);
    l->block_tokens = get32(b + 24);
    l->num_layers = get32(b + 28);
    l->kv_heads = get32(b + 32);
    l->head_dim = get32(b + 36);
    l->tp_size = get32(b + 40);
    l->tp_rank = get32(b + 44);
    if (get_str(&p, l->model, NS_MODEL_MAX) || get_str(&p, l->dtype, NS_DTYPE_MAX) ||
        get_str(&p, l->extra, NS_EXTRA_MAX))
        return "unterminated string";
    if (ns_layout_validate(l, verr, sizeof(verr)) != 0)
        return "invalid layout";
    if (ns_fingerprint_tenant(l, tenant) != *fp)
        return "fingerprint does not match the layout (or the record is another tenant's)";
    return NULL;
}

int file_layout_equal(const struct ns_layout *a, const struct ns_layout *b)
{
    return a->block_tokens == b->block_tokens && a->block_bytes == b->block_bytes &&
           a->num_layers == b->num_layers && a->kv_heads == b->kv_heads &&
           a->head_dim == b->head_dim && a->tp_size == b->tp_size && a->tp_rank == b->tp_rank &&
           strncmp(a->model, b->model, NS_MODEL_MAX) == 0 &&
           strncmp(a->dtype, b->dtype, NS_DTYPE_MAX) == 0 &&
           strncmp(a->extra, b->extra, NS_EXTRA_MAX) == 0;
}
