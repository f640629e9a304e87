/* kvs/file format: the on-disk records of the file backend — the 64-byte
 * block header and the layout file — encoded and decoded, little-endian
 * (format: see file.h). Pure functions, any thread. */
#include "persist/kvs/file_v1.h"

#include <string.h>

#include "core/le.h"
#include "persist/kvs/crc32c.h"


/* ---- block header ---------------------------------------------------------- */

void file_hdr_encode(uint8_t b[HDR_SIZE], const struct blk_hdr *h)
{
    memset(b, 0, HDR_SIZE);
    memcpy(b, "KVNB", 4);
    le_put16(b + 4, HDR_VERSION);
    le_put16(b + 6, HDR_SIZE);
    le_put64(b + 8, h->fingerprint);
    le_put64(b + 16, (uint64_t)h->key);
    le_put64(b + 24, h->size);
    le_put32(b + 32, h->rank);
    le_put32(b + 36, h->crc);
    le_put32(b + 60, crc32c(0, b, 60));
}

/* NULL when the header is well formed, else why not. */
const char *file_hdr_decode(const uint8_t b[HDR_SIZE], struct blk_hdr *h)
{
    if (memcmp(b, "KVNB", 4) != 0)
        return "bad magic";
    if (le_get16(b + 4) != HDR_VERSION)
        return "unknown format version";
    if (le_get16(b + 6) != HDR_SIZE)
        return "bad header size";
    if (le_get32(b + 60) != crc32c(0, b, 60))
        return "header checksum mismatch";
    for (int i = 40; i < 60; i++)
        if (b[i])
            return "reserved header bytes set";
    h->fingerprint = le_get64(b + 8);
    h->key = (int64_t)le_get64(b + 16);
    h->size = le_get64(b + 24);
    h->rank = le_get32(b + 32);
    h->crc = le_get32(b + 36);
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
    le_put16(p + 4, LAYOUT_VERSION);
    le_put16(p + 6, LAYOUT_SIZE);
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

const char *file_layout_decode(const uint8_t *b, size_t n, const char *tenant, struct ns_layout *l,
                               uint64_t *fp)
{
    char verr[128];
    const uint8_t *p = b + 48;
    if (n != LAYOUT_SIZE)
        return "bad size";
    if (memcmp(b, "KVNL", 4) != 0)
        return "bad magic";
    if (le_get16(b + 4) != LAYOUT_VERSION)
        return "unknown format version";
    if (le_get16(b + 6) != LAYOUT_SIZE)
        return "bad record size";
    if (le_get32(b + LAYOUT_SIZE - 4) != crc32c(0, b, LAYOUT_SIZE - 4))
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
        get_str(&p, l->extra, NS_EXTRA_MAX))
        return "unterminated string";
    if (ns_layout_validate(l, verr, sizeof(verr)) != 0)
        return "invalid layout";
    if (ns_fingerprint_tenant(l, tenant) != *fp &&
        (ns_identity_is_v1(l) || ns_fingerprint_v1(l, tenant) != *fp))
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
