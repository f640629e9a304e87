/* libkvnode in five lines: the program README.md's snippet of that name is cut
 * from (lines marked "README" below, verbatim; tests/python/test_readme.py checks
 * that they are). It connects to the kvnoded of `make run`, puts a prompt's
 * four KV blocks, matches the prefix, reads the blocks back and compares them.
 *
 * Build and run it from the top of the tree, with a daemon from `make run`:
 *
 *   cc -Ilib examples/five_lines.c build/libkvnode.a -lprotobuf-c -ldl -lpthread -o run/five_lines
 *   run/five_lines
 *
 * (-ldl -lpthread: libkvnode loads the CUDA runtime with dlopen and runs
 * threads; glibc before 2.34 keeps both in libraries of their own.) After
 * `make install`: cc examples/five_lines.c $(pkg-config --cflags --libs kvnode).
 * `make test` compiles it with that line (build/examples/five_lines). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvnode.h"

#define NTOKENS 64   /* four blocks of 16 tokens */
#define BLOCK   65536

static int fail(const char *what, int rc, const kvnode_client *c)
{
    fprintf(stderr, "five_lines: %s: %s (%s)\n", what, kvnode_strerror(rc), c ? kvnode_last_error(c) : "");
    return 1;
}

int main(void)
{
    int64_t tokens[NTOKENS];
    size_t ntokens = NTOKENS;
    for (size_t i = 0; i < ntokens; i++)
        tokens[i] = (int64_t)i;   /* the prompt's token ids */

    /* README: libkvnode in five lines (from here to "README: end", verbatim, at column 0) */
kvnode_layout l = { .model = "qwen2-7b", .dtype = "bf16", .block_tokens = 16, .block_bytes = 65536,
                    .num_layers = 28, .kv_heads = 4, .head_dim = 128, .tp_size = 1, .tp_rank = 0 };
kvnode_client *c;  kvnode_key keys[64];  size_t n, matched;
if (kvnode_connect("run/kvnode.sock", &l, &c) != 0) return 1;   /* 0, or a negative KVNODE_E* code */
n = kvnode_hash_tokens(tokens, ntokens, l.block_tokens, keys, 64);
kvnode_match(c, keys, n, &matched);           /* then kvnode_get_begin/_end, kvnode_put_begin/_commit */
    /* README: end */
    printf("%zu of %zu blocks cached before the put\n", matched, n);

    /* The prompt's KV pages (here: each block filled with its index), put and read back. */
    static unsigned char kv[4][BLOCK], back[4][BLOCK];
    const void *src[4];
    void *dst[4];
    for (size_t i = 0; i < n; i++) {
        memset(kv[i], (int)(i + 1), BLOCK);
        src[i] = kv[i];
        dst[i] = back[i];
    }
    int rc;
    if ((rc = kvnode_put(c, keys, n, src)) < 0)
        return fail("put", rc, c);
    if ((rc = kvnode_match(c, keys, n, &matched)) < 0)
        return fail("match", rc, c);
    size_t got = 0;
    if ((rc = kvnode_get(c, keys, n, dst, &got)) < 0)
        return fail("get", rc, c);
    int same = got == n && memcmp(kv, back, sizeof kv) == 0;
    printf("%zu of %zu blocks cached after it, %zu read back %s\n", matched, n, got, same ? "intact" : "DIFFERENT");
    kvnode_close(c);
    return matched == n && same ? 0 : 1;
}
