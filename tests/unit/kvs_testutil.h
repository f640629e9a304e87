/* Header-only helpers shared by the KV-store backend unit tests
 * (tests/unit/test_kvs_file.c, tests/unit/test_kvs_v6d.c): a test namespace
 * (layout + deployment id + struct kvs_ns in one object), deterministic block
 * contents, and put / byte-exact read-back of one block through a backend. */
#ifndef KVNODE_TESTS_KVS_TESTUTIL_H
#define KVNODE_TESTS_KVS_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "persist/kvs/kvs.h"
#include "mem/namespace.h"

struct tns {
    struct ns_layout l;
    char id[NS_DEPLOYMENT_ID_MAX];
    struct kvs_ns ns;
};

/* A small layout for model with block_bytes and TP rank (of 2). */
static inline void mkns(struct tns *t, const char *model, uint64_t block_bytes, uint32_t rank)
{
    memset(t, 0, sizeof(*t));
    snprintf(t->l.model, sizeof(t->l.model), "%s", model);
    snprintf(t->l.dtype, sizeof(t->l.dtype), "bf16");
    t->l.block_tokens = 16;
    t->l.block_bytes = block_bytes;
    t->l.num_layers = 2;
    t->l.kv_heads = 2;
    t->l.head_dim = 64;
    t->l.tp_size = 2;
    t->l.tp_rank = rank;
    t->ns.layout = &t->l;
    t->ns.fingerprint = ns_fingerprint(&t->l);
    ns_deployment_id(&t->l, t->ns.fingerprint, t->id, sizeof(t->id));
    t->ns.deployment_id = t->id;
}

/* Deterministic pseudo-random bytes for (key, salt). */
static inline void fill(uint8_t *p, size_t len, int64_t key, uint32_t salt)
{
    uint64_t x = (uint64_t)key * 0x9e3779b97f4a7c15ull + salt + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* Put one full block of fill(key, salt); returns be->put's result. */
static inline int kvs_test_put_block(const struct kvs_backend *be, struct kvs_store *s,
                                     struct tns *t, int64_t key, uint32_t salt,
                                     char *err, size_t errlen)
{
    size_t len = t->l.block_bytes;
    uint8_t *b = malloc(len);
    fill(b, len, key, salt);
    int rc = be->put(s, &t->ns, key, 0, b, len, err, errlen);
    free(b);
    return rc;
}

/* 0 when the block reads back byte-exact with salt; else get's result or -999. */
static inline int kvs_test_check_block(const struct kvs_backend *be, struct kvs_store *s,
                                       struct tns *t, int64_t key, uint32_t salt,
                                       char *err, size_t errlen)
{
    size_t len = t->l.block_bytes;
    uint8_t *b = malloc(len), *want = malloc(len);
    fill(want, len, key, salt);
    memset(b, 0xee, len);
    int rc = be->get(s, &t->ns, key, 0, b, len, err, errlen);
    if (rc == 0 && memcmp(b, want, len) != 0)
        rc = -999;
    free(b);
    free(want);
    return rc;
}

#endif /* KVNODE_TESTS_KVS_TESTUTIL_H */
