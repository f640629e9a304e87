/* Unit tests for lib/copy.c: kvnode_gather / kvnode_scatter (issue 31), the
 * one-call copy of a batch of blocks whose bytes lie in pieces over the
 * caller's memory. What is proven:
 *   - a pool laid out as SGLang's MHA layer_first (K and V of each layer,
 *     the block holding every K then every V) round-trips byte for byte:
 *     each block equals the one assembled piece by piece here, and a scatter
 *     into a second pool gives back the first pool's bytes;
 *   - the same with the pieces given as one base per page and each piece's
 *     distance from it;
 *   - a NULL block is skipped (its pieces and the other blocks' are not);
 *   - zero-byte pieces are allowed, more pieces than fit the stack work,
 *     n 0 copies nothing;
 *   - invalid input fails with -KVNODE_EINVAL and copies nothing: zero pieces,
 *     a zero-byte block, pieces that do not add up to the block (short or
 *     long), two pieces overlapping in the block, a piece past the block's
 *     end (also by an offset that would wrap), a NULL piece, a piece
 *     overlapping its own block (also by a base and distance), a NULL base,
 *     NULL arrays. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvnode.h"

#define PAGES  6
#define LAYERS 4
#define PIECE  96                       /* bytes of one layer's K (or V) of a page */
#define PIECES (2 * LAYERS)
#define BLOCK  (PIECES * PIECE)
#define POOL   (2 * LAYERS * PAGES * PIECE)

static unsigned char pool[POOL], back[POOL], blocks[PAGES][BLOCK], expect[PAGES][BLOCK];
static void *block_ptr[PAGES];
static const void *src[PAGES * PIECES];
static void *dst[PAGES * PIECES];
static size_t sizes[PIECES], offsets[PIECES];

/* Piece j = (layer j / 2, K or V by j % 2) of page i in a pool laid out
 * [K|V][layer][page][PIECE]; in the block, every K then every V. */
static void setup_layer_first(void)
{
    srand(31);
    for (size_t b = 0; b < POOL; b++)
        pool[b] = (unsigned char)rand();
    memset(back, 0, sizeof back);
    memset(blocks, 0, sizeof blocks);
    for (size_t j = 0; j < PIECES; j++) {
        size_t kv = j % 2, layer = j / 2;

        sizes[j] = PIECE;
        offsets[j] = (kv * LAYERS + layer) * PIECE;
        for (size_t i = 0; i < PAGES; i++) {
            size_t at = ((kv * LAYERS + layer) * PAGES + i) * PIECE;

            src[i * PIECES + j] = pool + at;
            dst[i * PIECES + j] = back + at;
            memcpy(expect[i] + offsets[j], pool + at, PIECE);
        }
    }
    for (size_t i = 0; i < PAGES; i++)
        block_ptr[i] = blocks[i];
}

/* The whole layer_first batch, pieces as n * m addresses (at NULL) or page bases. */
static int gather(const void *const *pieces, const ptrdiff_t *at)
{
    return kvnode_gather(block_ptr, PAGES, BLOCK, pieces, at, PIECES, sizes, offsets);
}

static int scatter(void *const *pieces, const ptrdiff_t *at)
{
    return kvnode_scatter((const void *const *)block_ptr, PAGES, BLOCK, pieces, at, PIECES,
                          sizes, offsets);
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *c = p;

    for (size_t i = 0; i < n; i++)
        if (c[i])
            return 0;
    return 1;
}

START_TEST(test_layer_first_round_trip)
{
    setup_layer_first();
    ck_assert_int_eq(gather(src, NULL), 0);
    ck_assert_int_eq(memcmp(blocks, expect, sizeof blocks), 0);
    ck_assert_int_eq(scatter(dst, NULL), 0);
    ck_assert_int_eq(memcmp(back, pool, sizeof pool), 0);
}
END_TEST

START_TEST(test_pieces_from_page_bases)
{
    /* pieces given as a base per page (its piece 0) and each piece's distance */
    const void *base[PAGES];
    void *back_base[PAGES];
    ptrdiff_t at[PIECES];

    setup_layer_first();
    for (size_t i = 0; i < PAGES; i++) {
        base[i] = src[i * PIECES];
        back_base[i] = dst[i * PIECES];
    }
    for (size_t j = 0; j < PIECES; j++)
        at[j] = (const unsigned char *)src[j] - (const unsigned char *)src[0];
    ck_assert_int_eq(gather(base, at), 0);
    ck_assert_int_eq(memcmp(blocks, expect, sizeof blocks), 0);
    ck_assert_int_eq(scatter(back_base, at), 0);
    ck_assert_int_eq(memcmp(back, pool, sizeof pool), 0);

    /* a NULL base, or a distance into the page's own block: nothing copied */
    memset(blocks, 0, sizeof blocks);
    memset(back, 0, sizeof back);
    base[PAGES - 1] = NULL;
    back_base[PAGES - 1] = NULL;
    ck_assert_int_eq(gather(base, at), -KVNODE_EINVAL);
    ck_assert_int_eq(scatter(back_base, at), -KVNODE_EINVAL);
    base[PAGES - 1] = blocks[PAGES - 1];
    back_base[PAGES - 1] = blocks[PAGES - 1];
    at[0] = 0;
    ck_assert_int_eq(gather(base, at), -KVNODE_EINVAL);
    ck_assert_int_eq(scatter(back_base, at), -KVNODE_EINVAL);
    ck_assert(all_zero(blocks, sizeof blocks));
    ck_assert(all_zero(back, sizeof back));
}
END_TEST

START_TEST(test_null_block_skipped)
{
    setup_layer_first();
    block_ptr[2] = NULL;
    ck_assert_int_eq(gather(src, NULL), 0);
    for (size_t i = 0; i < PAGES; i++) {
        if (i == 2)
            ck_assert(all_zero(blocks[i], BLOCK));
        else
            ck_assert_int_eq(memcmp(blocks[i], expect[i], BLOCK), 0);
    }
    memcpy(blocks[2], expect[2], BLOCK);        /* a scatter leaves page 2's pieces alone */
    ck_assert_int_eq(scatter(dst, NULL), 0);
    for (size_t j = 0; j < PIECES; j++)
        for (size_t i = 0; i < PAGES; i++) {
            const unsigned char *got = dst[i * PIECES + j];

            if (i == 2)
                ck_assert(all_zero(got, PIECE));
            else
                ck_assert_int_eq(memcmp(got, src[i * PIECES + j], PIECE), 0);
        }
}
END_TEST

START_TEST(test_zero_byte_pieces_and_empty_batch)
{
    /* pieces of 0, 5, 0, 3 bytes: the block is 8 bytes, the 0-byte pieces
     * may sit anywhere inside it (even where another piece is) */
    unsigned char a[5] = "abcde", b[3] = "xyz", out[8] = { 0 }, a2[5] = { 0 }, b2[3] = { 0 };
    const void *in[4] = { a, a, b, b };          /* 0-byte pieces: any valid pointer */
    void *back2[4] = { a2, a2, b2, b2 };
    size_t sz[4] = { 0, 5, 0, 3 }, off[4] = { 2, 0, 8, 5 };
    void *blk[1] = { out };

    ck_assert_int_eq(kvnode_gather(blk, 1, 8, in, NULL, 4, sz, off), 0);
    ck_assert_int_eq(memcmp(out, "abcdexyz", 8), 0);
    ck_assert_int_eq(kvnode_scatter((const void *const *)blk, 1, 8, back2, NULL, 4, sz, off), 0);
    ck_assert_int_eq(memcmp(a2, "abcde", 5), 0);
    ck_assert_int_eq(memcmp(b2, "xyz", 3), 0);
    ck_assert_int_eq(kvnode_gather(blk, 0, 8, in, NULL, 4, sz, off), 0);
    ck_assert_int_eq(kvnode_gather(NULL, 0, 0, NULL, NULL, 0, NULL, NULL), 0);
}
END_TEST

START_TEST(test_many_pieces)
{
    /* 1000 one-byte pieces in reverse: more than the stack's 256 places */
    enum { M = 1000 };
    static unsigned char in[M], out[M], again[M];
    static const void *ip[M];
    static void *op[M];
    static size_t sz[M], off[M];
    void *blk[1] = { out };

    for (size_t j = 0; j < M; j++) {
        in[j] = (unsigned char)(j * 7 + 1);
        ip[j] = &in[j];
        op[j] = &again[j];
        sz[j] = 1;
        off[j] = M - 1 - j;
    }
    ck_assert_int_eq(kvnode_gather(blk, 1, M, ip, NULL, M, sz, off), 0);
    for (size_t j = 0; j < M; j++)
        ck_assert_uint_eq(out[M - 1 - j], in[j]);
    ck_assert_int_eq(kvnode_scatter((const void *const *)blk, 1, M, op, NULL, M, sz, off), 0);
    ck_assert_int_eq(memcmp(again, in, M), 0);
}
END_TEST

/* Each bad layout of the pieces fails both ways and copies nothing. */
static void expect_einval(size_t block, size_t m, const size_t *sz, const size_t *off)
{
    ck_assert_int_eq(kvnode_gather(block_ptr, PAGES, block, src, NULL, m, sz, off),
                     -KVNODE_EINVAL);
    ck_assert(all_zero(blocks, sizeof blocks));
    ck_assert_int_eq(kvnode_scatter((const void *const *)block_ptr, PAGES, block, dst, NULL, m,
                                    sz, off), -KVNODE_EINVAL);
    ck_assert(all_zero(back, sizeof back));
}

START_TEST(test_bad_layouts)
{
    size_t sz[PIECES], off[PIECES];

    setup_layer_first();
    memset(blocks, 0, sizeof blocks);
    expect_einval(BLOCK, 0, sizes, offsets);            /* zero pieces */
    expect_einval(0, PIECES, sizes, offsets);           /* a zero-byte block */
    expect_einval(BLOCK + 1, PIECES, sizes, offsets);   /* pieces short of the block */
    expect_einval(BLOCK - PIECE, PIECES, sizes, offsets);   /* pieces past its end */
    memcpy(sz, sizes, sizeof sz);
    memcpy(off, offsets, sizeof off);
    sz[3] = PIECE + 1;                                  /* one longer, one shorter: */
    sz[4] = PIECE - 1;                                  /* the sum is right, they overlap */
    expect_einval(BLOCK, PIECES, sz, off);
    memcpy(sz, sizes, sizeof sz);
    off[5] = off[6];                                    /* two pieces at one place */
    expect_einval(BLOCK, PIECES, sz, off);
    memcpy(off, offsets, sizeof off);
    off[0] = SIZE_MAX - 10;                             /* off + len would wrap */
    expect_einval(BLOCK, PIECES, sz, off);
    expect_einval(BLOCK, PIECES, NULL, offsets);
    expect_einval(BLOCK, PIECES, sizes, NULL);
}
END_TEST

START_TEST(test_bad_pointers)
{
    setup_layer_first();
    /* a NULL piece of the last page: not even the first page is copied */
    src[(PAGES - 1) * PIECES + 3] = NULL;
    dst[(PAGES - 1) * PIECES + 3] = NULL;
    expect_einval(BLOCK, PIECES, sizes, offsets);

    /* a piece overlapping its own block */
    setup_layer_first();
    src[PIECES + 1] = blocks[1] + 10;
    dst[PIECES + 1] = blocks[1] + 10;
    expect_einval(BLOCK, PIECES, sizes, offsets);

    setup_layer_first();
    ck_assert_int_eq(kvnode_gather(NULL, PAGES, BLOCK, src, NULL, PIECES, sizes, offsets),
                     -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_gather(block_ptr, PAGES, BLOCK, NULL, NULL, PIECES, sizes, offsets),
                     -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_scatter(NULL, PAGES, BLOCK, dst, NULL, PIECES, sizes, offsets),
                     -KVNODE_EINVAL);
    ck_assert_int_eq(scatter(NULL, NULL), -KVNODE_EINVAL);
    ck_assert(all_zero(blocks, sizeof blocks));
}
END_TEST

static Suite *copy_suite(void)
{
    Suite *s = suite_create("copy");
    TCase *tc = tcase_create("gather_scatter");

    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_layer_first_round_trip);
    tcase_add_test(tc, test_pieces_from_page_bases);
    tcase_add_test(tc, test_null_block_skipped);
    tcase_add_test(tc, test_zero_byte_pieces_and_empty_batch);
    tcase_add_test(tc, test_many_pieces);
    tcase_add_test(tc, test_bad_layouts);
    tcase_add_test(tc, test_bad_pointers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(copy_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
