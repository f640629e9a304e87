/* copy: blocks gathered from / scattered to pieces of the caller's memory
 * (KVNODE_0.8, issue 31). A host pool laid out layer by layer (SGLang's
 * layer_first) holds one page's bytes as one piece per layer; kvnode_gather /
 * kvnode_scatter copy a whole batch of such pages into / out of the blocks a
 * lease lent, in one call instead of one copy per piece from the caller's
 * language, and kvnode_put_gather_checked / kvnode_get_scatter_checked take
 * and end the leases around that copy as the _batch calls do; their _stream
 * forms move pieces in GPU memory (the copies are copy_device.c's). Owns no
 * state. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "kvnode.h"

/* At most this many pieces per block are sorted on the stack. */
#define COPY_STACK_PIECES 256

static int copy_by_offset(const void *a, const void *b)
{
    const struct copy_place *x = a, *y = b;

    return x->off < y->off ? -1 : x->off > y->off;
}

/* Sorts the pieces' places in the block by offset into `order` and checks
 * they tile it: each inside, none overlapping another, block_bytes in all. */
static int copy_plan(size_t block_bytes, size_t m, const size_t *piece_bytes,
                     const size_t *piece_offsets, struct copy_place *order)
{
    size_t total = 0, end = 0;

    if (block_bytes == 0 || m == 0 || !piece_bytes || !piece_offsets)
        return -KVNODE_EINVAL;
    for (size_t j = 0; j < m; j++) {
        if (piece_bytes[j] > block_bytes || piece_offsets[j] > block_bytes - piece_bytes[j])
            return -KVNODE_EINVAL;          /* outside the block */
        total += piece_bytes[j];            /* each <= block_bytes: checked below */
        if (total > block_bytes)
            return -KVNODE_EINVAL;
        order[j] = (struct copy_place){ piece_offsets[j], piece_bytes[j], j };
    }
    if (total != block_bytes)
        return -KVNODE_EINVAL;              /* the pieces leave a gap */
    qsort(order, m, sizeof *order, copy_by_offset);
    for (size_t j = 0; j < m; j++) {
        if (order[j].len == 0)
            continue;
        if (order[j].off < end)
            return -KVNODE_EINVAL;          /* overlaps the piece before it */
        end = order[j].off + order[j].len;
    }
    return 0;
}

/* Where piece j of block i lies in the caller's memory. */
static uintptr_t copy_piece(const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                            size_t i, size_t j)
{
    if (piece_at)
        return pieces[i] ? (uintptr_t)pieces[i] + (uintptr_t)piece_at[j] : 0;
    return (uintptr_t)pieces[i * m + j];
}

static int copy_overlap(uintptr_t a, size_t alen, uintptr_t b, size_t blen)
{
    return alen && blen && a < b + blen && b < a + alen;
}

/* Every piece of every block that is copied: not NULL, not overlapping its
 * block (checked before the first byte moves, so a bad batch copies none). */
static int copy_check_pieces(const void *const *blocks, size_t n, size_t block_bytes,
                             const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                             const struct copy_place *order)
{
    for (size_t i = 0; i < n; i++) {
        if (!blocks[i])
            continue;
        for (size_t k = 0; k < m; k++) {
            uintptr_t p = copy_piece(pieces, piece_at, m, i, order[k].piece);

            if (order[k].len && (!p || copy_overlap(p, order[k].len, (uintptr_t)blocks[i],
                                                    block_bytes)))
                return -KVNODE_EINVAL;
        }
    }
    return 0;
}

/* The pieces' places sorted and checked (copy_plan); *order is `stack` or
 * malloc()ed (copy_done frees it). */
static int copy_prepare(size_t block_bytes, size_t m, const size_t *piece_bytes,
                        const size_t *piece_offsets, struct copy_place *stack,
                        struct copy_place **order)
{
    *order = stack;
    if (m > COPY_STACK_PIECES) {
        *order = m > SIZE_MAX / sizeof **order ? NULL : malloc(m * sizeof **order);
        if (!*order)
            return -KVNODE_ENOMEM;
    }
    return copy_plan(block_bytes, m, piece_bytes, piece_offsets, *order);
}

static void copy_done(struct copy_place *stack, struct copy_place *order)
{
    if (order != stack)
        free(order);
}

/* Checks every piece (copy_check_pieces), then copies them. */
static int copy_run(const void *const *blocks, size_t n, size_t block_bytes,
                    const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                    const struct copy_place *order, int to_blocks)
{
    int rc = copy_check_pieces(blocks, n, block_bytes, pieces, piece_at, m, order);

    /* Piece by piece, each across every block: a piece of consecutive pages
     * usually lies in one run of the caller's memory (a layer of a pool), so
     * that side moves sequentially; in measurements this beat block by block
     * and held up when the two sides' addresses share their low bits. */
    for (size_t k = 0; rc == 0 && k < m; k++) {
        const struct copy_place *pl = &order[k];

        if (!pl->len)
            continue;
        for (size_t i = 0; i < n; i++) {
            char *block = (char *)(uintptr_t)blocks[i];
            void *mine = (void *)copy_piece(pieces, piece_at, m, i, pl->piece);

            if (!block)
                continue;                   /* e.g. a key put_begin found stored */
            if (to_blocks)
                memcpy(block + pl->off, mine, pl->len);
            else
                memcpy(mine, block + pl->off, pl->len);
        }
    }
    return rc;
}

static int copy_blocks(const void *const *blocks, size_t n, size_t block_bytes,
                       const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                       const size_t *piece_bytes, const size_t *piece_offsets, int to_blocks)
{
    struct copy_place stack[COPY_STACK_PIECES], *order;
    int rc;

    if (n == 0)
        return 0;
    if (!blocks || !pieces || (!piece_at && m > SIZE_MAX / n))
        return -KVNODE_EINVAL;
    rc = copy_prepare(block_bytes, m, piece_bytes, piece_offsets, stack, &order);
    if (rc == 0)
        rc = copy_run(blocks, n, block_bytes, pieces, piece_at, m, order, to_blocks);
    copy_done(stack, order);
    return rc;
}

int kvnode_gather(void *const *blocks, size_t n, size_t block_bytes, const void *const *pieces,
                  const ptrdiff_t *piece_at, size_t m, const size_t *piece_bytes,
                  const size_t *piece_offsets)
{
    return copy_blocks((const void *const *)blocks, n, block_bytes, pieces, piece_at, m,
                       piece_bytes, piece_offsets, 1);
}

int kvnode_scatter(const void *const *blocks, size_t n, size_t block_bytes, void *const *pieces,
                   const ptrdiff_t *piece_at, size_t m, const size_t *piece_bytes,
                   const size_t *piece_offsets)
{
    return copy_blocks(blocks, n, block_bytes, (const void *const *)pieces, piece_at, m,
                       piece_bytes, piece_offsets, 0);
}

/* The pieces of the blocks [done, done + chunk) of a batch. */
static const void *const *copy_chunk(const void *const *pieces, const ptrdiff_t *piece_at,
                                     size_t m, size_t done)
{
    return pieces + (piece_at ? done : done * m);
}

/* The lent locations as kvnode_gather's blocks: host memory only (a block
 * lent in GPU memory is not copied with memcpy). */
static int copy_lent(kvnode_client *c, const kvnode_loc *locs, size_t n, void **blocks,
                     const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (locs[i].ptr && locs[i].tier != KVNODE_TIER_HOST) {
            client_seterr(c, "%s: block %zu was lent in GPU memory; gathered copies are "
                          "host memory only", what, i);
            return -KVNODE_EINVAL;
        }
        blocks[i] = locs[i].ptr;
    }
    return 0;
}

/* Checks what both batched calls take; *cap: keys per lease. */
static int copy_entry(kvnode_client *c, const kvnode_key *keys, size_t n, const void *pieces,
                      size_t *cap, const char *what)
{
    if (!c || (n && (!keys || !pieces))) {
        if (c)
            client_seterr(c, "%s: NULL argument", what);
        return -KVNODE_EINVAL;
    }
    *cap = c->max_keys ? c->max_keys : n;
    return 0;
}

static int copy_bad_pieces(kvnode_client *c, int rc, const char *what)
{
    if (rc == -KVNODE_EINVAL)
        client_seterr(c, "%s: the pieces do not tile the block (each inside it, none "
                      "overlapping, block_bytes in all), or one is NULL or overlaps its block",
                      what);
    else if (rc == -KVNODE_ENOMEM)
        client_seterr(c, "%s: out of memory", what);
    return rc;
}

/* Ends a lease whose copy failed (put: aborted), keeping the failure's message. */
static void copy_release(kvnode_client *c, kvnode_lease lease, int put)
{
    char saved[CLIENT_MSG_MAX];

    snprintf(saved, sizeof saved, "%s", client_errmsg(c));
    if (put)
        (void)kvnode_put_abort(c, lease);
    else
        (void)kvnode_get_end_wait(c, lease);
    client_seterr(c, "%s", saved);
}

/* What a batched gather or scatter holds: the pieces' order and the arrays
 * of one chunk (at most cap keys, one lease); with device pieces, their plan
 * and the stream. */
struct copy_batch {
    struct copy_place stack[COPY_STACK_PIECES], *order;
    kvnode_loc *locs;
    void **blocks;
    size_t cap;
    int device;
    void *stream;
    struct copy_dev_plan plan;
};

/* A device batch needs a CUDA runtime and a device: checked before any lease. */
static int copy_device_ok(kvnode_client *c, unsigned flags, const char *what)
{
    if (flags & ~(unsigned)KVNODE_BATCH_DEVICE) {
        client_seterr(c, "%s: unknown flags 0x%x", what, flags & ~(unsigned)KVNODE_BATCH_DEVICE);
        return -KVNODE_EINVAL;
    }
    if ((flags & KVNODE_BATCH_DEVICE) && (c->cuda_device < 0 || !c->have_rt)) {
        client_seterr(c, "%s: pieces in GPU memory need a client with a CUDA device and a CUDA "
                      "runtime: %s", what, c->cuda_device < 0 ? "it declared no CUDA device "
                      "(kvnode_connect_device)" : c->rt_why);
        return -KVNODE_ESTATE;
    }
    return 0;
}

/* Checks the arguments and the pieces, allocates the chunk's arrays. 0, or
 * a negative code with the client's error set; copy_batch_close either way
 * (1: nothing to do, n is 0). */
static int copy_batch_open(struct copy_batch *b, kvnode_client *c, const kvnode_key *keys, size_t n,
                           const void *pieces, const ptrdiff_t *piece_at, size_t m,
                           const size_t *piece_bytes, const size_t *piece_offsets,
                           unsigned flags, void *stream, const char *what)
{
    int rc = copy_entry(c, keys, n, pieces, &b->cap, what);

    b->order = b->stack;
    b->locs = NULL;
    b->blocks = NULL;
    b->device = (flags & KVNODE_BATCH_DEVICE) != 0;
    b->stream = stream;
    memset(&b->plan, 0, sizeof b->plan);
    if (rc == 0)
        rc = copy_device_ok(c, flags, what);
    if (rc < 0)
        return rc;
    if (n == 0)
        return 1;
    rc = copy_prepare(c->block_bytes, m, piece_bytes, piece_offsets, b->stack, &b->order);
    if (rc == 0 && b->device)
        rc = copy_dev_plan_make(&b->plan, piece_at, m, b->order);
    if (rc < 0)
        return copy_bad_pieces(c, rc, what);
    b->cap = b->cap < n ? b->cap : n;
    b->locs = malloc(b->cap * sizeof *b->locs);
    b->blocks = malloc(b->cap * sizeof *b->blocks);
    if (!b->locs || !b->blocks)
        return copy_bad_pieces(c, -KVNODE_ENOMEM, what);
    return 0;
}

static void copy_batch_close(struct copy_batch *b)
{
    free(b->locs);
    free(b->blocks);
    copy_dev_plan_free(&b->plan);
    copy_done(b->stack, b->order);
}

/* The copies of one lease's g blocks (b->locs) to or from their pieces: with
 * memcpy (host pieces, host blocks only) or on the device (copy_device.c). */
static int copy_lease(kvnode_client *c, struct copy_batch *b, size_t g, const void *const *pieces,
                      const ptrdiff_t *piece_at, size_t m, int to_blocks, const char *what)
{
    int rc;

    if (b->device) {
        for (size_t i = 0; i < g; i++)
            b->blocks[i] = b->locs[i].ptr;
        rc = copy_check_pieces((const void *const *)b->blocks, g, c->block_bytes, pieces,
                               piece_at, m, b->order);
        if (rc < 0)
            return copy_bad_pieces(c, rc, what);
        return copy_dev_run(c, &b->plan, b->locs, g, pieces, piece_at, m, b->order, to_blocks,
                            b->stream, what);
    }
    rc = copy_lent(c, b->locs, g, b->blocks, what);
    if (rc == 0 && (rc = copy_run((const void *const *)b->blocks, g, c->block_bytes, pieces,
                                  piece_at, m, b->order, to_blocks)) < 0)
        copy_bad_pieces(c, rc, what);
    return rc;
}

static int copy_put(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                    const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                    const size_t *piece_bytes, const size_t *piece_offsets, unsigned flags,
                    void *stream, const char *what)
{
    struct copy_batch b;
    size_t done = 0;
    int rc = copy_batch_open(&b, c, keys, n, pieces, piece_at, m, piece_bytes, piece_offsets,
                             flags, stream, what);

    while (rc == 0 && done < n) {
        size_t chunk = n - done < b.cap ? n - done : b.cap;
        kvnode_lease lease;

        rc = kvnode_put_begin_checked(c, keys + done, checks ? checks + done : NULL, chunk,
                                      KVNODE_TIER_HOST, &lease, b.locs);
        if (rc < 0)
            break;
        if (lease == 0) {       /* every key already stored: nothing lent */
            done += chunk;
            continue;
        }
        rc = copy_lease(c, &b, chunk, copy_chunk(pieces, piece_at, m, done), piece_at, m, 1,
                        what);
        if (rc < 0) {
            copy_release(c, lease, 1);
            break;
        }
        rc = kvnode_put_commit(c, lease);
        done += chunk;
    }
    copy_batch_close(&b);
    return rc < 0 ? rc : 0;
}

static int copy_get(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                    void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                    const size_t *piece_bytes, const size_t *piece_offsets, unsigned flags,
                    void *stream, size_t *got, const char *what)
{
    struct copy_batch b;
    size_t done = 0;
    int rc;

    if (got)
        *got = 0;
    if (c && !got) {
        client_seterr(c, "%s: NULL argument", what);
        return -KVNODE_EINVAL;
    }
    rc = copy_batch_open(&b, c, keys, n, pieces, piece_at, m, piece_bytes, piece_offsets, flags,
                         stream, what);
    while (rc == 0 && done < n) {
        size_t chunk = n - done < b.cap ? n - done : b.cap, g = 0;
        kvnode_lease lease;

        rc = kvnode_get_begin_checked(c, keys + done, checks ? checks + done : NULL, chunk,
                                      &lease, b.locs, &g);
        if (rc < 0)
            break;
        rc = copy_lease(c, &b, g, copy_chunk((const void *const *)pieces, piece_at, m, done),
                        piece_at, m, 0, what);
        if (rc < 0) {
            copy_release(c, lease, 0);
            break;
        }
        /* the copies count only if the pin held until the end: wait for it */
        rc = kvnode_get_end_wait(c, lease);
        if (rc < 0)
            break;
        done += g;
        if (g < chunk)
            break;
    }
    copy_batch_close(&b);
    if (got)
        *got = done;
    return rc < 0 ? rc : 0;
}

int kvnode_put_gather_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, const void *const *pieces, const ptrdiff_t *piece_at,
                              size_t m, const size_t *piece_bytes, const size_t *piece_offsets)
{
    return copy_put(c, keys, checks, n, pieces, piece_at, m, piece_bytes, piece_offsets, 0, NULL,
                    "kvnode_put_gather_checked");
}

int kvnode_get_scatter_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, void *const *pieces, const ptrdiff_t *piece_at,
                               size_t m, const size_t *piece_bytes, const size_t *piece_offsets,
                               size_t *got)
{
    return copy_get(c, keys, checks, n, pieces, piece_at, m, piece_bytes, piece_offsets, 0, NULL,
                    got, "kvnode_get_scatter_checked");
}

int kvnode_put_gather_stream(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                             size_t n, const void *const *pieces, const ptrdiff_t *piece_at,
                             size_t m, const size_t *piece_bytes, const size_t *piece_offsets,
                             unsigned flags, void *stream)
{
    return copy_put(c, keys, checks, n, pieces, piece_at, m, piece_bytes, piece_offsets, flags,
                    stream, "kvnode_put_gather_stream");
}

int kvnode_get_scatter_stream(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, void *const *pieces, const ptrdiff_t *piece_at,
                              size_t m, const size_t *piece_bytes, const size_t *piece_offsets,
                              unsigned flags, void *stream, size_t *got)
{
    return copy_get(c, keys, checks, n, pieces, piece_at, m, piece_bytes, piece_offsets, flags,
                    stream, got, "kvnode_get_scatter_stream");
}
