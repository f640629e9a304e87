/* kvnode-bench-prefault: a client's first touch of the lent host arena
 * (issue 16, item 4; not part of `make test`).
 *
 * Starts its own kvnoded with a host tier of 9/8 of the data, puts the data
 * (1 GiB by default) as blocks of 1 MiB in chains of 64 keys, then for each
 * way of starting a fresh client (a new connection, so a new mapping of the
 * arena) reads every block twice with zero-copy GETs: get_begin, a sum of
 * every 8-byte word of each block (the "read"), get_end. Pass 1 runs over the
 * fresh mapping, pass 2 over the same mapping again. The ways:
 *   - plain: no prefault;
 *   - prefault (wait): kvnode_prefault(KVNODE_PREFAULT_WAIT) first, timed
 *     apart (its time is given next to the passes);
 *   - connect flag: KVNODE_CONNECT_PREFAULT, pass 1 starts at once, so it
 *     races the background walk.
 * Each way runs ROUNDS times with a fresh client; the median is printed, in
 * GB/s (10^9 bytes per second).
 *
 * Usage: kvnode-bench-prefault [--quick] [--gib N]
 *   --quick: 256 MiB of data; --gib N: N GiB (1..8). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define BENCH_NAME "kvnode-bench-prefault"
#include "bench_util.h"

#define BLOCK  (1ull << 20)
#define CHAIN  64
#define ROUNDS 3

static uint64_t data_bytes = 1ull << 30;
static volatile uint64_t sink;      /* keeps the sums alive */


static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One pass over every chain: ns taken. */
static uint64_t read_pass(kvnode_client *c, const kvnode_key *keys, size_t nchains)
{
    kvnode_loc locs[CHAIN];
    uint64_t t0 = now_ns(), sum = 0;

    for (size_t ch = 0; ch < nchains; ch++) {
        kvnode_lease lease;
        size_t got;
        check(c, kvnode_get_begin(c, keys + ch * CHAIN, CHAIN, &lease, locs, &got), "get_begin");
        if (got != CHAIN)
            die("get_begin", "a chain was not all cached (evicted?)");
        for (size_t i = 0; i < got; i++) {
            const uint64_t *w = locs[i].ptr;
            for (size_t j = 0; j < BLOCK / sizeof *w; j++)
                sum += w[j];
        }
        check(c, kvnode_get_end(c, lease), "get_end");
    }
    sink += sum;
    return now_ns() - t0;
}

enum way { WAY_PLAIN, WAY_WAIT, WAY_FLAG, WAY_COUNT };
static const char *const way_name[WAY_COUNT] = { "plain (no prefault)", "kvnode_prefault(WAIT) first",
                                                 "KVNODE_CONNECT_PREFAULT" };

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double gbs(uint64_t ns)
{
    return ns ? (double)data_bytes / (double)ns : 0.0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            data_bytes = 256ull << 20;
        } else if (strcmp(argv[i], "--gib") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
                   atoi(argv[i + 1]) <= 8) {
            data_bytes = (uint64_t)atoi(argv[++i]) << 30;
        } else {
            fprintf(stderr, "usage: %s [--quick] [--gib N (1..8)]\n", argv[0]);
            return 2;
        }
    }
    uint64_t host = data_bytes / 8 * 9;
    size_t nblocks = (size_t)(data_bytes / BLOCK), nchains = nblocks / CHAIN;
    char cfg[256];
    snprintf(cfg, sizeof cfg, "memory.host_bytes=%llu\nmemory.slab_bytes=1MiB\nlog.level=warn\n",
             (unsigned long long)host);
    kvh_daemon d;
    if (kvh_start(&d, cfg) != 0)
        die("start kvnoded", kvh_error());

    kvnode_layout l = kvh_layout("bench-prefault", BLOCK, 1, 0);
    kvnode_client *w;
    if (kvh_connect(&d, &l, &w) != 0)
        die("connect", kvh_error());
    kvnode_key *keys = calloc(nblocks, sizeof *keys);
    if (!keys)
        die("calloc", "out of memory");
    for (size_t ch = 0; ch < nchains; ch++) {
        kvh_chain(keys + ch * CHAIN, CHAIN, 1000 + ch);
        if (kvh_put(w, keys + ch * CHAIN, CHAIN, 7) != 0)
            die("put", kvh_error());
    }
    for (size_t ch = 0; ch < nchains; ch++)
        if (kvh_match(w, keys + ch * CHAIN, CHAIN) != CHAIN)
            die("match", "a chain was evicted after the puts");
    kvnode_close(w);

    printf("kvnode-bench-prefault: %s, host tier %llu MiB (mapping of each client), %zu blocks of "
           "1 MiB (%llu MiB) read per pass, median of %d fresh clients, %s\n\n", kvh_daemon_path(),
           (unsigned long long)(host >> 20), nblocks, (unsigned long long)(data_bytes >> 20),
           ROUNDS, kvnode_version());
    printf("%-30s %12s %12s %14s %12s\n", "client start", "pass 1 GB/s", "pass 2 GB/s",
           "prefault s", "pass1/pass2");
    for (int way = 0; way < WAY_COUNT; way++) {
        uint64_t p1[ROUNDS], p2[ROUNDS], pf[ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            kvnode_client *c = NULL;
            unsigned flags = way == WAY_FLAG ? KVNODE_CONNECT_PREFAULT : 0;
            int rc = kvnode_connect_flags(d.sock, &l, -1, flags, &c);
            if (rc != 0)
                die("connect", kvnode_connect_error());
            pf[r] = 0;
            if (way == WAY_WAIT) {
                uint64_t t0 = now_ns();
                check(c, kvnode_prefault(c, KVNODE_PREFAULT_WAIT), "prefault");
                pf[r] = now_ns() - t0;
            }
            p1[r] = read_pass(c, keys, nchains);
            p2[r] = read_pass(c, keys, nchains);
            kvnode_close(c);
        }
        qsort(p1, ROUNDS, sizeof p1[0], cmp_u64);
        qsort(p2, ROUNDS, sizeof p2[0], cmp_u64);
        qsort(pf, ROUNDS, sizeof pf[0], cmp_u64);
        char pfs[32] = "-";
        if (way == WAY_WAIT)
            snprintf(pfs, sizeof pfs, "%.3f", (double)pf[ROUNDS / 2] / 1e9);
        printf("%-30s %12.2f %12.2f %14s %12.2f\n", way_name[way], gbs(p1[ROUNDS / 2]),
               gbs(p2[ROUNDS / 2]), pfs, gbs(p1[ROUNDS / 2]) / gbs(p2[ROUNDS / 2]));
    }
    free(keys);
    int st = kvh_stop(&d, 0);
    kvh_destroy(&d);
    if (st != 0) {
        fprintf(stderr, "kvnode-bench-prefault: kvnoded ended with status %d\n", st);
        return 1;
    }
    return 0;
}
