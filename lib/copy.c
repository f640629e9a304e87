/* copy: blocks gathered from / scattered to pieces of the caller's memory
 * (kvnode_gather, kvnode_scatter; KVNODE_0.7, issue 31). A host pool laid
 * out layer by layer (SGLang's layer_first) holds one page's bytes as one
 * piece per layer; these copy a whole batch of such pages into / out of the
 * blocks a lease lent, in one call instead of one copy per piece from the
 * caller's language. Owns nothing and talks to no daemon. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvnode.h"

/* At most this many pieces per block are sorted on the stack. */
#define COPY_STACK_PIECES 256

struct copy_place {
    size_t off, len, piece;     /* where piece `piece` goes in the block */
};

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

static int copy_overlap(uintptr_t a, size_t alen, uintptr_t b, size_t blen)
{
    return alen && blen && a < b + blen && b < a + alen;
}

/* Every piece of every block that is copied: not NULL, not overlapping its
 * block (checked before the first byte moves, so a bad batch copies none). */
static int copy_check_pieces(const void *const *blocks, size_t n, size_t block_bytes,
                             const void *const *pieces, size_t m,
                             const struct copy_place *order)
{
    for (size_t i = 0; i < n; i++) {
        if (!blocks[i])
            continue;
        for (size_t k = 0; k < m; k++) {
            uintptr_t p = (uintptr_t)pieces[i * m + order[k].piece];

            if (order[k].len && (!p || copy_overlap(p, order[k].len, (uintptr_t)blocks[i],
                                                    block_bytes)))
                return -KVNODE_EINVAL;
        }
    }
    return 0;
}

static int copy_blocks(const void *const *blocks, size_t n, size_t block_bytes,
                       const void *const *pieces, size_t m, const size_t *piece_bytes,
                       const size_t *piece_offsets, int to_blocks)
{
    struct copy_place stack[COPY_STACK_PIECES], *order = stack;
    int rc;

    if (n == 0)
        return 0;
    if (!blocks || !pieces || m > SIZE_MAX / n)
        return -KVNODE_EINVAL;
    if (m > COPY_STACK_PIECES) {
        order = m > SIZE_MAX / sizeof *order ? NULL : malloc(m * sizeof *order);
        if (!order)
            return -KVNODE_ENOMEM;
    }
    rc = copy_plan(block_bytes, m, piece_bytes, piece_offsets, order);
    if (rc == 0)
        rc = copy_check_pieces(blocks, n, block_bytes, pieces, m, order);
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
            const void *mine = pieces[i * m + pl->piece];

            if (!block)
                continue;                   /* e.g. a key put_begin found stored */
            if (to_blocks)
                memcpy(block + pl->off, mine, pl->len);
            else
                memcpy((void *)(uintptr_t)mine, block + pl->off, pl->len);
        }
    }
    if (order != stack)
        free(order);
    return rc;
}

int kvnode_gather(void *const *blocks, size_t n, size_t block_bytes, const void *const *pieces,
                  size_t m, const size_t *piece_bytes, const size_t *piece_offsets)
{
    return copy_blocks((const void *const *)blocks, n, block_bytes, pieces, m, piece_bytes,
                       piece_offsets, 1);
}

int kvnode_scatter(const void *const *blocks, size_t n, size_t block_bytes, void *const *pieces,
                   size_t m, const size_t *piece_bytes, const size_t *piece_offsets)
{
    return copy_blocks(blocks, n, block_bytes, (const void *const *)pieces, m, piece_bytes,
                       piece_offsets, 0);
}
