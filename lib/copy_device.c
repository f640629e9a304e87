/* copy_device: the device form of the gathered calls (KVNODE_0.8, issue 34):
 * a block in pieces over GPU memory (a vLLM worker's per-layer paged KV
 * caches on CUDA) moved to and from the blocks a lease lent, with
 * cudaMemcpyAsync on the caller's stream, synchronised before the lease
 * ends (copy.c takes and ends the leases).
 *
 * Two ways, chosen once per call from the pieces' places:
 *   direct  each run of pieces that lie end to end both in the block and in
 *           the caller's memory is one copy between the two (a K/V split or
 *           stacked NHD cache: one copy per layer's K and V of a block; a
 *           block lent in GPU memory: device-to-device);
 *   staged  where the caller's order differs from the block's (an HND cache:
 *           a block's K of one layer is one run on the device but heads x
 *           tokens pieces in the block's token-major order), each run of the
 *           caller's memory is one copy to or from pinned host memory (the
 *           client's stage) and the pieces are put in order there by the
 *           CPU, so a block costs as many copies as in the direct case plus
 *           one pass over its bytes. Chosen when it saves more than half the
 *           copies. A block lent in GPU memory goes whole through a bounce
 *           buffer beside the stage (one more copy each way). Owns no state
 *           (the stage is the client's). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* A staged group is at most this many bytes (at least one block). */
#define COPY_STAGE_MAX (32u << 20)

static int dev_by_offset(const void *a, const void *b)
{
    const struct copy_place *x = a, *y = b;

    return x->off < y->off ? -1 : x->off > y->off;
}

int copy_dev_plan_make(struct copy_dev_plan *p, const ptrdiff_t *piece_at, size_t m,
                       const struct copy_place *order)
{
    size_t nblk = 0, pos = 0, j, k;

    memset(p, 0, sizeof *p);
    if (!piece_at)
        return 0;           /* pieces per block: runs found block by block, direct */
    p->src = malloc(m * sizeof *p->src);
    p->stage_off = calloc(m, sizeof *p->stage_off);
    if (!p->src || !p->stage_off) {
        copy_dev_plan_free(p);
        return -KVNODE_ENOMEM;
    }
    for (j = 0; j < m; j++)     /* distances as unsigned: sorted, a run is off + len */
        p->src[j] = (struct copy_place){ (size_t)piece_at[order[j].piece], order[j].len,
                                         order[j].piece };
    qsort(p->src, m, sizeof *p->src, dev_by_offset);
    for (j = 0, k = 0; j < m; j++) {
        struct copy_place cur = p->src[j];

        if (!cur.len)
            continue;
        p->stage_off[cur.piece] = pos;
        if (k && p->src[k - 1].off + p->src[k - 1].len == cur.off) {
            p->src[k - 1].len += cur.len;
        } else {
            p->src[k++] = (struct copy_place){ cur.off, cur.len, pos };
        }
        pos += cur.len;
    }
    p->nsrc = k;
    /* the direct way's copies: runs end to end on both sides in block order */
    for (j = 0, k = SIZE_MAX; j < m; j++) {
        if (!order[j].len)
            continue;
        if (k == SIZE_MAX || (size_t)piece_at[order[k].piece] + order[k].len !=
                             (size_t)piece_at[order[j].piece])
            nblk++;
        k = j;
    }
    p->staged = nblk > 2 * p->nsrc;
    return 0;
}

void copy_dev_plan_free(struct copy_dev_plan *p)
{
    free(p->src);
    free(p->stage_off);
    memset(p, 0, sizeof *p);
}

static uintptr_t dev_piece(const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                           size_t i, size_t j)
{
    if (piece_at)
        return (uintptr_t)pieces[i] + (uintptr_t)piece_at[j];
    return (uintptr_t)pieces[i * m + j];
}

static int dev_direct(kvnode_client *c, const kvnode_loc *locs, size_t n, int gpu,
                      const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                      const struct copy_place *order, int to_blocks, void *stream,
                      const char *what)
{
    struct client_copier k;
    int rc = client_copier_open(c, &k, stream, gpu, what);

    for (size_t i = 0; rc == 0 && i < n; i++) {
        uintptr_t dst = 0, src = 0, len = 0;

        if (!locs[i].ptr)
            continue;
        for (size_t q = 0; rc == 0 && q <= m; q++) {
            uintptr_t d = 0, s = 0;

            if (q < m) {
                uintptr_t blk = (uintptr_t)locs[i].ptr + order[q].off;
                uintptr_t dev = dev_piece(pieces, piece_at, m, i, order[q].piece);

                if (!order[q].len)
                    continue;
                d = to_blocks ? blk : dev;
                s = to_blocks ? dev : blk;
                if (len && dst + len == d && src + len == s) {
                    len += order[q].len;
                    continue;
                }
            }
            if (len)
                rc = client_copier_queue(&k, (void *)dst, (const void *)src, len);
            if (q < m) {
                dst = d;
                src = s;
                len = order[q].len;
            }
        }
    }
    if (rc == -KVNODE_ECLOSED)
        return rc;
    return client_copier_close(&k) < 0 ? -KVNODE_EIO : rc;
}

/* The pieces of blocks [g0, g1) (host memory: hb[i - g0]) to (put) or from
 * the stage. */
static void dev_stage_host(const struct copy_dev_plan *p, uint8_t *const *hb, size_t g0,
                           size_t g1, size_t bb, uint8_t *stage, size_t m,
                           const struct copy_place *order, int to_blocks)
{
    for (size_t i = g0; i < g1; i++) {
        uint8_t *blk = hb[i - g0], *st = stage + (i - g0) * bb;

        if (!blk)
            continue;
        for (size_t q = 0; q < m; q++) {
            const struct copy_place *pl = &order[q];

            if (!pl->len)
                continue;
            if (to_blocks)
                memcpy(blk + pl->off, st + p->stage_off[pl->piece], pl->len);
            else
                memcpy(st + p->stage_off[pl->piece], blk + pl->off, pl->len);
        }
    }
}

/* The runs of the caller's memory of blocks [g0, g1) to (put: from the
 * device) or from the stage, queued. */
static int dev_stage_queue(struct client_copier *k, const struct copy_dev_plan *p,
                           const kvnode_loc *locs, size_t g0, size_t g1, size_t bb,
                           uint8_t *stage, const void *const *pieces, int to_blocks)
{
    int rc = 0;

    for (size_t i = g0; rc == 0 && i < g1; i++) {
        uint8_t *st = stage + (i - g0) * bb;

        if (!locs[i].ptr)
            continue;
        for (size_t r = 0; rc == 0 && r < p->nsrc; r++) {
            uint8_t *dev = (uint8_t *)(uintptr_t)pieces[i] + p->src[r].off;

            rc = to_blocks ? client_copier_queue(k, st + p->src[r].piece, dev, p->src[r].len)
                           : client_copier_queue(k, dev, st + p->src[r].piece, p->src[r].len);
        }
    }
    return rc;
}

/* Blocks [g0, g1) as host memory in hb: a host-tier block itself, one lent
 * in GPU memory its place in the bounce buffer, copied there whole first
 * for a get (one copy; a put copies the bounce to the block afterwards). */
static int dev_bounce_in(struct client_copier *k, const kvnode_loc *locs, size_t g0, size_t g1,
                         size_t bb, uint8_t *bounce, uint8_t **hb, int to_blocks)
{
    int rc = 0;

    for (size_t i = g0; i < g1; i++) {
        hb[i - g0] = locs[i].ptr;
        if (!locs[i].ptr || locs[i].tier == KVNODE_TIER_HOST)
            continue;
        hb[i - g0] = bounce + (i - g0) * bb;
        if (!to_blocks && rc == 0)
            rc = client_copier_queue(k, hb[i - g0], locs[i].ptr, bb);
    }
    return rc;
}

static int dev_bounce_out(struct client_copier *k, const kvnode_loc *locs, size_t g0, size_t g1,
                          uint8_t *const *hb, size_t bb)
{
    int rc = 0;

    for (size_t i = g0; rc == 0 && i < g1; i++)
        if (locs[i].ptr && locs[i].tier != KVNODE_TIER_HOST)
            rc = client_copier_queue(k, locs[i].ptr, hb[i - g0], bb);
    return rc;
}

static int dev_staged(kvnode_client *c, const struct copy_dev_plan *p, const kvnode_loc *locs,
                      size_t n, int gpu, const void *const *pieces, size_t m,
                      const struct copy_place *order, int to_blocks, void *stream,
                      const char *what)
{
    size_t bb = (size_t)c->block_bytes, group = COPY_STAGE_MAX / bb;
    struct client_copier k;
    uint8_t *stage, *bounce, **hb;
    int owned, rc;

    group = group == 0 ? 1 : group < n ? group : n;
    hb = malloc(group * sizeof *hb);
    /* blocks lent in GPU memory pass through a bounce half of the stage */
    stage = hb ? client_stage_get(c, (gpu ? 2 : 1) * group * bb, &owned) : NULL;
    if (!stage) {
        free(hb);
        client_seterr(c, "%s: out of memory (a %zu-byte stage)", what, (gpu ? 2 : 1) * group * bb);
        return -KVNODE_ENOMEM;
    }
    bounce = stage + group * bb;
    rc = client_copier_open(c, &k, stream, gpu, what);
    for (size_t g0 = 0; rc == 0 && g0 < n; g0 += group) {
        size_t g1 = n - g0 < group ? n : g0 + group;

        rc = dev_bounce_in(&k, locs, g0, g1, bb, bounce, hb, to_blocks);
        if (client_copier_sync(&k) < 0)
            rc = -KVNODE_EIO;
        if (rc == 0 && !to_blocks)
            dev_stage_host(p, hb, g0, g1, bb, stage, m, order, 0);
        if (rc == 0)
            rc = dev_stage_queue(&k, p, locs, g0, g1, bb, stage, pieces, to_blocks);
        /* the stage is reused (and the lease ended) only after its copies */
        if (client_copier_sync(&k) < 0)
            rc = -KVNODE_EIO;
        if (rc == 0 && to_blocks) {
            dev_stage_host(p, hb, g0, g1, bb, stage, m, order, 1);
            rc = dev_bounce_out(&k, locs, g0, g1, hb, bb);
            if (client_copier_sync(&k) < 0)
                rc = -KVNODE_EIO;
        }
    }
    if (rc != -KVNODE_ECLOSED && client_copier_close(&k) < 0)
        rc = -KVNODE_EIO;
    client_stage_put(c, stage, owned);
    free(hb);
    return rc;
}

int copy_dev_run(kvnode_client *c, const struct copy_dev_plan *p, const kvnode_loc *locs,
                 size_t n, const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                 const struct copy_place *order, int to_blocks, void *stream, const char *what)
{
    int gpu = 0;

    for (size_t i = 0; i < n; i++)
        gpu |= locs[i].ptr && locs[i].tier != KVNODE_TIER_HOST;
    if (p->staged)
        return dev_staged(c, p, locs, n, gpu, pieces, m, order, to_blocks, stream, what);
    return dev_direct(c, locs, n, gpu, pieces, piece_at, m, order, to_blocks, stream, what);
}
