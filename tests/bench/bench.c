/* kvnode-bench: figures for kvnoded's data paths (not part of `make test`).
 *
 * Starts its own kvnoded (the harness: $KVNODED, default build/kvnoded) with
 * a host tier large enough for two chains of the largest block size, then
 * for 64 KiB and 1 MiB blocks and chains of 256 keys measures:
 *   - MATCH round-trip latency, p50 / p99 over 2000 calls;
 *   - zero-copy GET: get_begin + memcpy of every block into a private buffer
 *     + get_end;
 *   - zero-copy PUT: put_begin + memcpy into every slot + put_commit (the
 *     chain is deleted, untimed, between iterations so every put writes);
 *   - copying kvnode_get / kvnode_put and inline kvnode_get_inline /
 *     kvnode_put_inline of the same chain;
 *   - single-thread memcpy of the same total size, as the reference.
 * Each measurement moves about 2 GiB (the inline ones 0.5 GiB) after one
 * untimed warm-up iteration.
 * Prints a table with GB/s (10^9 bytes per second) and the ratio to memcpy.
 *
 * Usage: kvnode-bench [--quick]   (--quick moves a quarter of the bytes) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define BENCH_NAME "kvnode-bench"
#include "bench_util.h"

#define CHAIN        256
#define MATCH_CALLS  2000
#define MATCH_WARMUP 200

static uint64_t total_target = 2ull << 30;   /* bytes moved per measurement */


static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct row {
    const char *name;
    uint64_t bytes, ns;
};

static void print_row(const char *block, const struct row *r, double memcpy_gbs)
{
    double s = (double)r->ns / 1e9;
    double gbs = (double)r->bytes / 1e9 / s;
    printf("%-7s %-28s %8.2f GiB %8.3f s %9.2f %9.2fx\n", block, r->name,
           (double)r->bytes / (double)(1ull << 30), s, gbs, memcpy_gbs > 0 ? gbs / memcpy_gbs : 0.0);
}

static void bench_block_size(const kvh_daemon *d, uint64_t bb, const char *label)
{
    char model[64];
    snprintf(model, sizeof model, "bench-%s", label);
    kvnode_layout l = kvh_layout(model, bb, 1, 0);
    kvnode_client *c;
    if (kvh_connect(d, &l, &c) != 0)
        die("connect", kvh_error());

    size_t chain_bytes = (size_t)bb * CHAIN;
    unsigned iters = (unsigned)(total_target / chain_bytes);
    if (iters < 2)
        iters = 2;
    uint64_t total = (uint64_t)iters * chain_bytes;
    /* The inline paths are an order of magnitude slower: a quarter of it. */
    unsigned iters_inl = iters / 4 < 2 ? 2 : iters / 4;
    uint64_t total_inl = (uint64_t)iters_inl * chain_bytes;

    kvnode_key gkeys[CHAIN], pkeys[CHAIN];
    kvh_chain(gkeys, CHAIN, 1000 + bb);
    kvh_chain(pkeys, CHAIN, 2000 + bb);
    unsigned char *src = malloc(chain_bytes), *dst = malloc(chain_bytes);
    const void **srcv = malloc(CHAIN * sizeof *srcv);
    void **dstv = malloc(CHAIN * sizeof *dstv);
    kvnode_loc *locs = malloc(CHAIN * sizeof *locs);
    if (!src || !dst || !srcv || !dstv || !locs)
        die("malloc", "out of memory");
    for (size_t i = 0; i < CHAIN; i++) {
        kvh_fill(src + i * bb, bb, gkeys[i], 1);
        srcv[i] = src + i * bb;
        dstv[i] = dst + i * bb;
    }
    memset(dst, 0, chain_bytes);   /* fault the pages in before timing */
    check(c, kvnode_put(c, gkeys, CHAIN, srcv), "put of the GET chain");

    /* MATCH latency */
    uint64_t *lat = malloc(MATCH_CALLS * sizeof *lat);
    if (!lat)
        die("malloc", "out of memory");
    size_t matched;
    for (int i = 0; i < MATCH_WARMUP; i++)
        check(c, kvnode_match(c, gkeys, CHAIN, &matched), "match");
    for (int i = 0; i < MATCH_CALLS; i++) {
        uint64_t t0 = kvh_now_ns();
        check(c, kvnode_match(c, gkeys, CHAIN, &matched), "match");
        lat[i] = kvh_now_ns() - t0;
        if (matched != CHAIN)
            die("match", "the GET chain is not fully stored");
    }
    qsort(lat, MATCH_CALLS, sizeof *lat, cmp_u64);
    printf("%-7s %-28s p50 %7.1f us   p99 %7.1f us   (%d calls, %d keys)\n", label, "MATCH round trip",
           (double)lat[MATCH_CALLS / 2] / 1e3, (double)lat[MATCH_CALLS * 99 / 100] / 1e3, MATCH_CALLS, CHAIN);
    free(lat);

    struct row rows[8];
    int nrows = 0;
    uint64_t t0, ns;
    kvnode_lease lease;
    size_t got, deleted;

    /* memcpy reference (one warm-up pass) */
    memcpy(dst, src, chain_bytes);
    ns = 0;
    for (unsigned it = 0; it < iters; it++) {
        t0 = kvh_now_ns();
        memcpy(dst, src, chain_bytes);
        ns += kvh_now_ns() - t0;
    }
    struct row ref = { "memcpy (1 thread)", total, ns };
    double ref_gbs = (double)total / 1e9 / ((double)ns / 1e9);
    /* The same bytes copied block by block, as the GET/PUT rows do: small
     * copies do not get the non-temporal stores one huge memcpy uses. */
    ns = 0;
    for (unsigned it = 0; it < iters; it++) {
        t0 = kvh_now_ns();
        for (size_t i = 0; i < CHAIN; i++)
            memcpy(dst + i * bb, src + i * bb, bb);
        ns += kvh_now_ns() - t0;
    }
    struct row ref_blocks = { "memcpy per block (1 thread)", total, ns };

    /* zero-copy GET */
    ns = 0;
    for (unsigned it = 0; it <= iters; it++) {
        t0 = kvh_now_ns();
        check(c, kvnode_get_begin(c, gkeys, CHAIN, &lease, locs, &got), "get_begin");
        if (got != CHAIN)
            die("get_begin", "short prefix");
        for (size_t i = 0; i < CHAIN; i++)
            memcpy(dst + i * bb, locs[i].ptr, bb);
        check(c, kvnode_get_end(c, lease), "get_end");
        if (it > 0)   /* iteration 0 warms up */
            ns += kvh_now_ns() - t0;
    }
    if (kvh_verify(dst + (CHAIN - 1) * bb, bb, gkeys[CHAIN - 1], 1) != 0)
        die("zero-copy GET", kvh_error());
    rows[nrows++] = (struct row){ "zero-copy GET", total, ns };

    /* zero-copy PUT */
    ns = 0;
    for (unsigned it = 0; it <= iters; it++) {
        t0 = kvh_now_ns();
        check(c, kvnode_put_begin(c, pkeys, CHAIN, KVNODE_TIER_HOST, &lease, locs), "put_begin");
        for (size_t i = 0; i < CHAIN; i++) {
            if (!locs[i].ptr)
                die("put_begin", "a key of the deleted chain is still stored");
            memcpy(locs[i].ptr, src + i * bb, bb);
        }
        check(c, kvnode_put_commit(c, lease), "put_commit");
        if (it > 0)
            ns += kvh_now_ns() - t0;
        check(c, kvnode_delete(c, pkeys, CHAIN, &deleted), "delete");
    }
    rows[nrows++] = (struct row){ "zero-copy PUT", total, ns };

    /* copying GET / PUT */
    ns = 0;
    for (unsigned it = 0; it <= iters; it++) {
        t0 = kvh_now_ns();
        check(c, kvnode_get(c, gkeys, CHAIN, dstv, &got), "kvnode_get");
        if (it > 0)
            ns += kvh_now_ns() - t0;
    }
    rows[nrows++] = (struct row){ "kvnode_get (copying)", total, ns };
    ns = 0;
    for (unsigned it = 0; it <= iters; it++) {
        t0 = kvh_now_ns();
        check(c, kvnode_put(c, pkeys, CHAIN, srcv), "kvnode_put");
        if (it > 0)
            ns += kvh_now_ns() - t0;
        check(c, kvnode_delete(c, pkeys, CHAIN, &deleted), "delete");
    }
    rows[nrows++] = (struct row){ "kvnode_put (copying)", total, ns };

    /* inline GET / PUT */
    ns = 0;
    for (unsigned it = 0; it <= iters_inl; it++) {
        t0 = kvh_now_ns();
        check(c, kvnode_get_inline(c, gkeys, CHAIN, dstv, &got), "kvnode_get_inline");
        if (got != CHAIN)
            die("kvnode_get_inline", "short prefix");
        if (it > 0)
            ns += kvh_now_ns() - t0;
    }
    if (kvh_verify(dst, bb, gkeys[0], 1) != 0)
        die("inline GET", kvh_error());
    rows[nrows++] = (struct row){ "inline GET", total_inl, ns };
    ns = 0;
    for (unsigned it = 0; it <= iters_inl; it++) {
        t0 = kvh_now_ns();
        check(c, kvnode_put_inline(c, pkeys, CHAIN, srcv), "kvnode_put_inline");
        if (it > 0)
            ns += kvh_now_ns() - t0;
        check(c, kvnode_delete(c, pkeys, CHAIN, &deleted), "delete");
    }
    rows[nrows++] = (struct row){ "inline PUT", total_inl, ns };

    for (int i = 0; i < nrows; i++)
        print_row(label, &rows[i], ref_gbs);
    print_row(label, &ref_blocks, ref_gbs);
    print_row(label, &ref, ref_gbs);
    printf("\n");

    check(c, kvnode_delete(c, gkeys, CHAIN, &deleted), "delete");
    free(src);
    free(dst);
    free(srcv);
    free(dstv);
    free(locs);
    kvnode_close(c);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            total_target /= 4;
        } else {
            fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
            return 2;
        }
    }

    /* Two chains of 256 x 1 MiB must fit under the high watermark; leave the
     * machine some room when it is small. */
    uint64_t host = 1ull << 30;
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t avail = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    if (avail && avail < 3 * host)
        fprintf(stderr, "kvnode-bench: warning: only %.1f GiB of memory available; the 1 MiB runs need "
                "about 2 GiB (host tier + private buffers)\n", (double)avail / (double)(1ull << 30));

    char cfg[256];
    snprintf(cfg, sizeof cfg, "memory.host_bytes=%llu\nlog.level=warn\n", (unsigned long long)host);
    kvh_daemon d;
    if (kvh_start(&d, cfg) != 0)
        die("start kvnoded", kvh_error());

    printf("kvnode-bench: %s (pid %d), host tier %llu MiB, chains of %d keys, %s\n\n", kvh_daemon_path(),
           (int)d.pid, (unsigned long long)(host >> 20), CHAIN, kvnode_version());
    printf("%-7s %-28s %12s %10s %9s %10s\n", "block", "operation", "moved", "time", "GB/s", "vs memcpy");
    bench_block_size(&d, 64 * 1024, "64KiB");
    bench_block_size(&d, 1024 * 1024, "1MiB");

    int st = kvh_stop(&d, 0);
    kvh_destroy(&d);
    if (st != 0) {
        fprintf(stderr, "kvnode-bench: kvnoded stopped with status %d\n", st);
        return 1;
    }
    return 0;
}
