/* cache handover: a warm restart's side of the cache (see cache.h): the
 * host tier's sealed blocks collected at a clean stop, checked, and adopted
 * by the next daemon's cache over the same memfd. Loop thread only. */
#include "cache/cache_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errmsg.h"
#include "core/log.h"
#include "kvnode.h"

/* What a walk of the index gathers: the blocks, and their namespaces as
 * indexes into the hand-over's list (ns id -> index + 1, 0: not yet). */
struct ho_collect {
    struct cache *c;
    struct cache_ho *h;
    uint32_t *slot_of;
    size_t nslots, cap, nscap;
    struct index_entry **es;
    int rc;
};

static bool ho_grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap * 2 : 1024;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * size);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

static uint32_t ho_ns_index(struct ho_collect *k, const struct kv_namespace *ns)
{
    struct cache_ho *h = k->h;
    if (k->slot_of[ns->id])
        return k->slot_of[ns->id] - 1;
    size_t cap = k->nscap;
    if (!ho_grow((void **)&h->layouts, &cap, h->nns + 1, sizeof *h->layouts) ||
        !ho_grow((void **)&h->fingerprints, &k->nscap, h->nns + 1, sizeof *h->fingerprints)) {
        k->rc = -KVNODE_ENOMEM;
        return UINT32_MAX;
    }
    h->layouts[h->nns] = ns->layout;
    h->fingerprints[h->nns] = ns->fingerprint;
    k->slot_of[ns->id] = (uint32_t)++h->nns;
    return (uint32_t)(h->nns - 1);
}

/* Only what a client may be served from the host arena: sealed, and there. */
static void ho_visit(void *arg, struct index_entry *e)
{
    struct ho_collect *k = arg;
    if (k->rc < 0 || e->state != ENTRY_SEALED || e->tier != KVNODE_TIER_HOST || e->arena != HOST_ARENA_ID ||
        e->ns >= k->nslots || !ns_get(k->c->namespaces, e->ns))
        return;
    if (!ho_grow((void **)&k->es, &k->cap, k->h->n + 1, sizeof *k->es)) {
        k->rc = -KVNODE_ENOMEM;
        return;
    }
    k->es[k->h->n++] = e;
}

static int ho_by_stamp(const void *a, const void *b)
{
    const struct index_entry *x = *(struct index_entry *const *)a, *y = *(struct index_entry *const *)b;
    return x->lru_stamp < y->lru_stamp ? -1 : x->lru_stamp > y->lru_stamp;
}

int cache_handover_collect(struct cache *c, struct cache_ho *out)
{
    struct ho_collect k = { .c = c, .h = out, .nslots = NS_RECORDS_MAX + 1 };
    struct index_walk w;

    memset(out, 0, sizeof *out);
    out->reserved = arena_reserved(c->host);
    k.slot_of = calloc(k.nslots, sizeof *k.slot_of);
    if (!k.slot_of)
        return -KVNODE_ENOMEM;
    index_walk_begin(c->index, &w);
    while (index_walk_step(c->index, &w, 4096, ho_visit, &k))
        ;
    if (k.rc == 0 && k.cap)
        qsort(k.es, out->n, sizeof *k.es, ho_by_stamp);
    if (k.rc == 0 && out->n && !(out->blocks = calloc(out->n, sizeof *out->blocks)))
        k.rc = -KVNODE_ENOMEM;
    for (size_t i = 0; k.rc == 0 && i < out->n; i++) {
        const struct index_entry *e = k.es[i];
        const struct kv_namespace *ns = ns_get(c->namespaces, e->ns);
        uint32_t at = ho_ns_index(&k, ns);
        out->blocks[i] = (struct cache_ho_block){ .ns = at, .stored = e->persist == PERSIST_STORED,
                                                  .key = e->key, .check = e->check, .offset = e->offset };
        out->bytes += ns->layout.block_bytes;
    }
    free(k.es);
    free(k.slot_of);
    if (k.rc < 0)
        cache_ho_free(out);
    return k.rc;
}

void cache_ho_free(struct cache_ho *h)
{
    free(h->layouts);
    free(h->fingerprints);
    free(h->blocks);
    memset(h, 0, sizeof *h);
}

static uint64_t ho_stride(uint64_t block_bytes)
{
    return (block_bytes + ARENA_STRIDE_ALIGN - 1) / ARENA_STRIDE_ALIGN * ARENA_STRIDE_ALIGN;
}

static int ho_by_offset(const void *a, const void *b)
{
    const struct cache_ho_block *x = *(struct cache_ho_block *const *)a, *y = *(struct cache_ho_block *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The layouts: valid, this tenant's, at most
 * ARENA_MAX_CLASSES strides that fit a slab. */
static int ho_check_layouts(const struct cache_ho *h, const char *tenant, uint64_t slab_bytes, char *err,
                            size_t errlen)
{
    uint64_t strides[ARENA_MAX_CLASSES];
    size_t nstrides = 0;
    char why[256];

    for (size_t i = 0; i < h->nns; i++) {
        const struct ns_layout *l = &h->layouts[i];
        uint64_t stride = ho_stride(l->block_bytes);
        size_t s = 0;
        if (memchr(l->model, 0, sizeof l->model) == NULL || memchr(l->dtype, 0, sizeof l->dtype) == NULL ||
            memchr(l->extra, 0, sizeof l->extra) == NULL || memchr(l->revision, 0, sizeof l->revision) == NULL ||
            ns_layout_validate(l, why, sizeof why) < 0) {
            errmsg_set(err, errlen, "namespace %zu: not a valid layout", i);
            return -KVNODE_EINVAL;
        }
        if (ns_fingerprint_tenant(l, tenant) != h->fingerprints[i]) {
            errmsg_set(err, errlen, "namespace %zu (%s): its fingerprint is not this tenant's", i, l->model);
            return -KVNODE_EINVAL;
        }
        if (l->block_bytes > slab_bytes) {
            errmsg_set(err, errlen, "namespace %zu: blocks of %" PRIu64 " bytes do not fit a slab", i,
                       l->block_bytes);
            return -KVNODE_EINVAL;
        }
        while (s < nstrides && strides[s] != stride)
            s++;
        if (s == nstrides && nstrides == ARENA_MAX_CLASSES) {
            errmsg_set(err, errlen, "more than %u block sizes", ARENA_MAX_CLASSES);
            return -KVNODE_EINVAL;
        }
        if (s == nstrides)
            strides[nstrides++] = stride;
    }
    return 0;
}

int cache_handover_check(const struct cache_ho *h, const char *tenant, uint64_t arena_bytes,
                         uint64_t slab_bytes, char *err, size_t errlen)
{
    const struct cache_ho_block **by_off = NULL;
    int rc = ho_check_layouts(h, tenant, slab_bytes, err, errlen);
    uint64_t slab_stride = 0, slab = UINT64_MAX, usable = slab_bytes ? arena_bytes / slab_bytes * slab_bytes : 0;

    if (rc < 0 || h->n == 0)
        return rc;
    if (!(by_off = malloc(h->n * sizeof *by_off))) {
        errmsg_set(err, errlen, "out of memory");
        return -KVNODE_ENOMEM;
    }
    for (size_t i = 0; i < h->n; i++)
        by_off[i] = &h->blocks[i];
    qsort(by_off, h->n, sizeof *by_off, ho_by_offset);
    for (size_t i = 0; i < h->n && rc == 0; i++) {
        const struct cache_ho_block *b = by_off[i];
        uint64_t stride = b->ns < h->nns ? ho_stride(h->layouts[b->ns].block_bytes) : 0;
        rc = -KVNODE_EINVAL;
        if (stride == 0)
            errmsg_set(err, errlen, "block %" PRId64 ": no such namespace (%u)", b->key, b->ns);
        else if (b->offset >= usable || b->offset % slab_bytes % stride != 0 ||
                 b->offset % slab_bytes + stride > slab_bytes)
            errmsg_set(err, errlen, "block %" PRId64 " at offset %" PRIu64 ": not a slot of %" PRIu64
                       " bytes inside the %" PRIu64 "-byte arena", b->key, b->offset, stride, usable);
        else if (b->offset / slab_bytes == slab && stride != slab_stride)
            errmsg_set(err, errlen, "blocks of %" PRIu64 " and %" PRIu64 " bytes share slab %" PRIu64,
                       slab_stride, stride, slab);
        else if (i > 0 && b->offset == by_off[i - 1]->offset)
            errmsg_set(err, errlen, "two blocks at offset %" PRIu64, b->offset);
        else
            rc = 0;
        slab = b->offset / slab_bytes;
        slab_stride = stride;
    }
    free(by_off);
    return rc;
}

/* The namespaces of h in c, and their classes: ns[i] for h->layouts[i]. */
static int ho_bind(struct cache *c, const struct cache_ho *h, struct kv_namespace **ns, char *err, size_t errlen)
{
    for (size_t i = 0; i < h->nns; i++) {
        int created = 0, rc;
        uint32_t cls;
        if ((rc = arena_class_for(c->host, h->layouts[i].block_bytes, &cls)) < 0 ||
            (rc = ns_bind_ex(c->namespaces, &h->layouts[i], false, &ns[i], &created, err, errlen)) < 0)
            return rc;
        if (ns[i]->fingerprint != h->fingerprints[i]) {
            errmsg_set(err, errlen, "namespace of %s: another fingerprint", h->layouts[i].model);
            return -KVNODE_EINVAL;
        }
        ns[i]->cls = cls;
    }
    return 0;
}

int cache_adopt(struct cache *c, const struct cache_ho *h, char *err, size_t errlen)
{
    struct kv_namespace **ns = calloc(h->nns ? h->nns : 1, sizeof *ns);
    int rc = ns ? ho_bind(c, h, ns, err, errlen) : -KVNODE_ENOMEM;

    /* Oldest use first: each touch lists the block newest, so the LRU order
     * is the previous daemon's. */
    for (size_t i = 0; rc == 0 && i < h->n; i++) {
        const struct cache_ho_block *b = &h->blocks[i];
        struct kv_namespace *n = ns[b->ns];
        struct index_entry *e;
        if (index_lookup(c->index, n->id, b->key)) {
            errmsg_set(err, errlen, "key %" PRId64 " twice in namespace %u", b->key, n->id);
            rc = -KVNODE_EINVAL;
        } else if ((rc = arena_adopt_block(c->host, n->cls, b->offset)) < 0) {
            errmsg_set(err, errlen, "block %" PRId64 " at offset %" PRIu64 ": not a free slot", b->key, b->offset);
        } else if (!(e = index_insert(c->index, n->id, b->key))) {
            errmsg_set(err, errlen, "out of memory indexing the handed-over blocks");
            rc = -KVNODE_ENOMEM;
        } else {
            e->check = b->check;
            e->state = ENTRY_SEALED;
            e->tier = KVNODE_TIER_HOST;
            e->arena = HOST_ARENA_ID;
            e->cls = n->cls;
            e->offset = b->offset;
            e->persist = b->stored ? PERSIST_STORED : PERSIST_NONE;
            index_lru_touch(c->index, e);
            n->blocks++;
            n->bytes += n->layout.block_bytes;
            c->adopted++;
            c->adopted_bytes += n->layout.block_bytes;
        }
    }
    arena_adopt_done(c->host);
    free(ns);
    return rc;
}
