/* Integration: the device form of the gathered calls (issue 34:
 * kvnode_put_gather_stream / kvnode_get_scatter_stream with
 * KVNODE_BATCH_DEVICE) against kvnoded with hbm.backend = cuda, both on the
 * strict fake CUDA (tests/fakecuda) with one state folder. The test process
 * is a vLLM worker with per-layer paged KV caches in GPU memory (cudaMalloc):
 * one K/V split NHD cache, (2, blocks, tokens, heads, dim) per layer, and one
 * stacked HND cache, (blocks, 2, heads, tokens, dim) in memory (FlashInfer's
 * stride order). A block in kvnode is every layer's K then V, token-major
 * (NHD order) for both. What is proven:
 *   - a put from the NHD cache stores the canonical bytes (read back by
 *     kvnode_get), a get scatters them into the HND cache (staged: each
 *     layer's K or V one copy), a put from there stores the same bytes
 *     again, and a get into the NHD cache gives them back: byte-exact, the
 *     blocks outside the batch untouched;
 *   - blocks a get finds in the GPU tier are copied device to device, into
 *     both caches, byte-exact;
 *   - a failing cudaMemcpyAsync fails the put with -KVNODE_EIO and CUDA's
 *     message, its lease aborted (nothing stored, no lease left); the same
 *     for a get (its lease ended); both for the direct and the staged way;
 *   - bad calls fail before any lease: unknown flags (-KVNODE_EINVAL), the
 *     device flag on a client without a CUDA device (-KVNODE_ESTATE),
 *     pieces that do not tile the block (-KVNODE_EINVAL);
 *   - flags 0 is the host call (host pieces round-trip).
 * Every test ends with the fake's violation log empty. */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda_daemon.h"
#include "harness.h"
#include "../common/rmtree.h"
#include "../fakecuda/fakecuda_env.h"
#include "../fakecuda/fakecuda_check.h"

#define CUDA_CONF "memory.host_bytes=4MiB\nmemory.slab_bytes=256KiB\nhbm.backend=cuda\n" \
                  "hbm.bytes=4MiB\nhbm.devices=0\n"
#define LAYERS 4
#define TOKENS 8
#define HEADS  4
#define DIM    64                           /* bytes of one head's vector */
#define RUN    (TOKENS * HEADS * DIM)       /* one layer's K (or V) of a block */
#define BB     (LAYERS * 2 * RUN)           /* 16 KiB */
#define NB     8                            /* blocks per cache */
#define CACHE  (LAYERS * 2 * NB * RUN)      /* bytes of either cache */
#define M_NHD  (LAYERS * 2)
#define M_HND  (LAYERS * 2 * TOKENS * HEADS)

static char fake_dir[PATH_MAX];
static char ld_path[2 * PATH_MAX + 32], dir_env[PATH_MAX + 32];

static struct {
    int (*cudaMalloc)(void **, size_t);
    int (*cudaFree)(void *);
    int (*cudaMemcpy)(void *, const void *, size_t, int);
    int (*cudaDeviceSynchronize)(void);
} cu;

/* The piece maps (base: the block's layer-0 K; distances from it). */
static ptrdiff_t nhd_at[M_NHD], hnd_at[M_HND];
static size_t nhd_len[M_NHD], nhd_off[M_NHD], hnd_len[M_HND], hnd_off[M_HND];
static uint8_t canon[NB][BB];

static void maps(void)
{
    size_t j = 0;

    for (size_t l = 0; l < LAYERS; l++)
        for (size_t kv = 0; kv < 2; kv++) {
            /* NHD split: layer l at l * 2 * NB * RUN, [kv][block] runs of RUN */
            nhd_at[l * 2 + kv] = (ptrdiff_t)((l * 2 + kv) * NB * RUN);
            nhd_len[l * 2 + kv] = RUN;
            nhd_off[l * 2 + kv] = (l * 2 + kv) * RUN;
            /* HND stacked: layer l at l * NB * 2 * RUN, [block][kv][head][token] */
            for (size_t t = 0; t < TOKENS; t++)
                for (size_t h = 0; h < HEADS; h++, j++) {
                    hnd_at[j] = (ptrdiff_t)(l * NB * 2 * RUN + kv * RUN + (h * TOKENS + t) * DIM);
                    hnd_len[j] = DIM;
                    hnd_off[j] = (l * 2 + kv) * RUN + (t * HEADS + h) * DIM;
                }
        }
    for (size_t b = 0; b < NB; b++)
        for (size_t i = 0; i < BB; i++)
            canon[b][i] = (uint8_t)(b * 131 + i * 7 + i / 251);
}

/* Block b's base in a cache at dev (NHD steps RUN per block, HND 2 RUN). */
static void *base_of(void *dev, int hnd, size_t b)
{
    return (uint8_t *)dev + b * (hnd ? 2 * RUN : RUN);
}

/* The canonical bytes of blocks [0, n) read out of a device cache (host
 * mirror, then kvnode_gather with the cache's map) compared with want[i];
 * blocks past `first + n` and before `first` must be zero. */
static void expect_cache(void *dev, int hnd, size_t first, size_t n, uint8_t (*want)[BB])
{
    static uint8_t mirror[CACHE], got[BB], zero[BB];
    void *blocks[1] = {got};
    const void *bases[1];

    ck_assert_int_eq(cu.cudaMemcpy(mirror, dev, CACHE, 2), 0);
    for (size_t b = 0; b < NB; b++) {
        bases[0] = base_of(mirror, hnd, b);
        ck_assert_int_eq(kvnode_gather(blocks, 1, BB, bases, hnd ? hnd_at : nhd_at,
                                       hnd ? M_HND : M_NHD, hnd ? hnd_len : nhd_len,
                                       hnd ? hnd_off : nhd_off), 0);
        if (b >= first && b < first + n)
            ck_assert_msg(memcmp(got, want[b - first], BB) == 0, "%s cache block %zu differs",
                          hnd ? "HND" : "NHD", b);
        else
            ck_assert_msg(memcmp(got, zero, BB) == 0, "%s cache block %zu was written",
                          hnd ? "HND" : "NHD", b);
    }
}

/* A zeroed device cache; with fill, blocks [0, fill) hold canon[0..fill). */
static void *cache_new(int hnd, size_t fill)
{
    static uint8_t mirror[CACHE];
    void *dev = NULL, *bases[NB];
    const void *blocks[NB];

    memset(mirror, 0, sizeof mirror);
    for (size_t b = 0; b < fill; b++) {
        bases[b] = base_of(mirror, hnd, b);
        blocks[b] = canon[b];
    }
    if (fill)
        ck_assert_int_eq(kvnode_scatter(blocks, fill, BB, bases, hnd ? hnd_at : nhd_at,
                                        hnd ? M_HND : M_NHD, hnd ? hnd_len : nhd_len,
                                        hnd ? hnd_off : nhd_off), 0);
    ck_assert_int_eq(cu.cudaMalloc(&dev, CACHE), 0);
    ck_assert_int_eq(cu.cudaMemcpy(dev, mirror, CACHE, 1), 0);
    ck_assert_int_eq(cu.cudaDeviceSynchronize(), 0);
    return dev;
}

static int put_dev(kvnode_client *c, const kvnode_key *k, size_t n, void *dev, int hnd,
                   size_t first)
{
    const void *bases[NB];

    for (size_t i = 0; i < n; i++)
        bases[i] = base_of(dev, hnd, first + i);
    return kvnode_put_gather_stream(c, k, NULL, n, bases, hnd ? hnd_at : nhd_at,
                                    hnd ? M_HND : M_NHD, hnd ? hnd_len : nhd_len,
                                    hnd ? hnd_off : nhd_off, KVNODE_BATCH_DEVICE, NULL);
}

static int get_dev(kvnode_client *c, const kvnode_key *k, size_t n, void *dev, int hnd,
                   size_t first, size_t *got)
{
    void *bases[NB];

    for (size_t i = 0; i < n; i++)
        bases[i] = base_of(dev, hnd, first + i);
    return kvnode_get_scatter_stream(c, k, NULL, n, bases, hnd ? hnd_at : nhd_at,
                                     hnd ? M_HND : M_NHD, hnd ? hnd_len : nhd_len,
                                     hnd ? hnd_off : nhd_off, KVNODE_BATCH_DEVICE, NULL, got);
}

/* kvnode_get of each key gives want[i]. */
static void expect_stored(kvnode_client *c, const kvnode_key *k, size_t n, uint8_t (*want)[BB])
{
    static uint8_t buf[BB];
    void *dst[1] = {buf};
    size_t got;

    for (size_t i = 0; i < n; i++) {
        KVH_OK(c, kvnode_get(c, &k[i], 1, dst, &got));
        ck_assert_uint_eq(got, 1);
        ck_assert_msg(memcmp(buf, want[i], BB) == 0, "stored block %zu (key %lld) differs", i,
                      (long long)k[i]);
    }
}

static void fake_setup(void)
{
    void *h;

    fakecuda_daemon_env(fake_dir, ld_path, dir_env);
    ck_assert_int_eq(fakecuda_setup(fake_dir), 0);
    ck_assert_int_eq(setenv("FAKECUDA_COPY_DELAY_MS", "20", 1), 0);
    h = dlopen("libcudart.so", RTLD_NOW | RTLD_GLOBAL);
    ck_assert_msg(h, "the fake CUDA is not where this test's RPATH says: %s", dlerror());
#define SYM(name) do { *(void **)&cu.name = dlsym(h, #name); ck_assert_ptr_nonnull(cu.name); } while (0)
    SYM(cudaMalloc); SYM(cudaFree); SYM(cudaMemcpy); SYM(cudaDeviceSynchronize);
#undef SYM
    maps();
}

static void start_cuda(kvh_daemon *d)
{
    const char *env[] = { ld_path, dir_env, "FAKECUDA_PIDNS=", "FAKECUDA_COPY_DELAY_MS=20", NULL };
    kvh_spawn_opts o = { .env = env };

    ck_assert_msg(kvh_start_ex(d, CUDA_CONF, &o) == 0, "start: %s", kvh_error());
}

static void assert_no_violations(void)
{
    char p[PATH_MAX + 32], line[512];
    FILE *f;

    snprintf(p, sizeof p, "%s/violations", fake_dir);
    if (!(f = fopen(p, "r")))
        return;
    while (fgets(line, sizeof line, f))
        ck_abort_msg("the fake recorded: %s", line);
    fclose(f);
}

static void set_fail(const char *what)
{
    char p[PATH_MAX + 32];
    FILE *f;

    snprintf(p, sizeof p, "%s/fail", fake_dir);
    if (!what) {
        unlink(p);
        return;
    }
    ck_assert_ptr_nonnull(f = fopen(p, "w"));
    fprintf(f, "%s\n", what);
    fclose(f);
}

static kvnode_client *connect_gpu(const kvh_daemon *d, const kvnode_layout *l)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect_device(d->sock, l, 0, &c);

    ck_assert_msg(rc == 0, "connect: %s", kvnode_connect_error());
    ck_assert_str_eq(kvnode_last_error(c), "");
    return c;
}

START_TEST(nhd_and_hnd_share_blocks_byte_exact)
{
    kvnode_layout l = kvh_layout("gather-cuda", BB, 1, 0);
    kvnode_key a[4] = {1, 2, 3, 4}, b[4] = {11, 12, 13, 14};
    void *nhd, *hnd, *nhd2;
    size_t got = 0;
    kvnode_client *c;
    kvh_daemon dm;

    fake_setup();
    start_cuda(&dm);
    c = connect_gpu(&dm, &l);
    nhd = cache_new(0, 4);
    hnd = cache_new(1, 0);
    nhd2 = cache_new(0, 0);
    KVH_OK(c, put_dev(c, a, 4, nhd, 0, 0));                 /* direct: 8 copies a block */
    expect_stored(c, a, 4, canon);
    KVH_OK(c, get_dev(c, a, 4, hnd, 1, 4, &got));           /* staged */
    ck_assert_uint_eq(got, 4);
    expect_cache(hnd, 1, 4, 4, canon);
    KVH_OK(c, put_dev(c, b, 4, hnd, 1, 4));                 /* staged */
    expect_stored(c, b, 4, canon);
    KVH_OK(c, get_dev(c, b, 4, nhd2, 0, 2, &got));          /* direct */
    ck_assert_uint_eq(got, 4);
    expect_cache(nhd2, 0, 2, 4, canon);
    ck_assert_int_eq(kvh_stat(&dm, "leases.read"), 0);
    ck_assert_int_eq(kvh_stat(&dm, "leases.write"), 0);
    ck_assert_int_eq(cu.cudaFree(nhd), 0);
    ck_assert_int_eq(cu.cudaFree(hnd), 0);
    ck_assert_int_eq(cu.cudaFree(nhd2), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&dm);
    assert_no_violations();
    test_rmtree(fake_dir);
}
END_TEST

/* Blocks in the GPU tier (put_begin HBM, written with cudaMemcpy): a get
 * copies them device to device into both caches. */
START_TEST(gpu_tier_blocks_device_to_device)
{
    kvnode_layout l = kvh_layout("gather-cuda-hbm", BB, 1, 0);
    kvnode_key k[3] = {21, 22, 23};
    kvnode_loc loc[3];
    kvnode_lease lease;
    kvnode_tiers t;
    void *nhd, *hnd;
    size_t got = 0;
    kvnode_client *c;
    kvh_daemon dm;

    fake_setup();
    start_cuda(&dm);
    c = connect_gpu(&dm, &l);
    KVH_OK(c, kvnode_put_begin(c, k, 3, KVNODE_TIER_HBM, &lease, loc));
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(loc[i].tier, KVNODE_TIER_HBM);
        ck_assert_int_eq(cu.cudaMemcpy(loc[i].ptr, canon[i], BB, 1), 0);
    }
    ck_assert_int_eq(cu.cudaDeviceSynchronize(), 0);
    KVH_OK(c, kvnode_put_commit(c, lease));
    KVH_OK(c, kvnode_match_tiers(c, k, 3, &t));
    ck_assert_uint_eq(t.hbm, 3);
    nhd = cache_new(0, 0);
    hnd = cache_new(1, 0);
    KVH_OK(c, get_dev(c, k, 3, nhd, 0, 1, &got));
    ck_assert_uint_eq(got, 3);
    expect_cache(nhd, 0, 1, 3, canon);
    KVH_OK(c, get_dev(c, k, 3, hnd, 1, 5, &got));
    ck_assert_uint_eq(got, 3);
    expect_cache(hnd, 1, 5, 3, canon);
    ck_assert_int_eq(kvh_stat(&dm, "leases.read"), 0);
    ck_assert_int_eq(cu.cudaFree(nhd), 0);
    ck_assert_int_eq(cu.cudaFree(hnd), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&dm);
    assert_no_violations();
    test_rmtree(fake_dir);
}
END_TEST

/* _i 0: the NHD cache (direct copies), 1: the HND one (staged). */
START_TEST(failed_copy_ends_the_lease)
{
    kvnode_layout l = kvh_layout("gather-cuda-fail", BB, 1, 0);
    kvnode_key k[2] = {31, 32};
    int hnd = _i;
    size_t got = 99, matched = 99;
    void *src, *dst;
    kvnode_client *c;
    kvh_daemon dm;
    int rc;

    fake_setup();
    start_cuda(&dm);
    c = connect_gpu(&dm, &l);
    src = cache_new(hnd, 2);
    dst = cache_new(hnd, 0);
    set_fail("cudaMemcpyAsync");
    rc = put_dev(c, k, 2, src, hnd, 0);
    set_fail(NULL);
    ck_assert_int_eq(rc, -KVNODE_EIO);
    ck_assert_msg(strstr(kvnode_last_error(c), "cudaMemcpyAsync"), "message: %s",
                  kvnode_last_error(c));
    KVH_OK(c, kvnode_match(c, k, 2, &matched));
    ck_assert_uint_eq(matched, 0);                          /* aborted: nothing stored */
    ck_assert_int_eq(kvh_stat(&dm, "leases.write"), 0);
    KVH_OK(c, put_dev(c, k, 2, src, hnd, 0));
    set_fail("cudaMemcpyAsync");
    rc = get_dev(c, k, 2, dst, hnd, 0, &got);
    set_fail(NULL);
    ck_assert_int_eq(rc, -KVNODE_EIO);
    ck_assert_uint_eq(got, 0);
    ck_assert_int_eq(kvh_stat(&dm, "leases.read"), 0);     /* ended */
    KVH_OK(c, get_dev(c, k, 2, dst, hnd, 0, &got));        /* and the client goes on */
    ck_assert_uint_eq(got, 2);
    expect_cache(dst, hnd, 0, 2, canon);
    ck_assert_int_eq(cu.cudaFree(src), 0);
    ck_assert_int_eq(cu.cudaFree(dst), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&dm);
    assert_no_violations();
    test_rmtree(fake_dir);
}
END_TEST

START_TEST(bad_calls_fail_before_any_lease)
{
    kvnode_layout l = kvh_layout("gather-cuda-bad", BB, 1, 0);
    kvnode_key k[2] = {41, 42};
    size_t got = 0, matched = 99, bad_len[M_NHD];
    static uint8_t host[2][BB], back[2][BB];
    const void *hb[2] = {host[0], host[1]};
    void *bb[2] = {back[0], back[1]}, *dev;
    kvnode_client *c, *plain = NULL;
    kvh_daemon dm;

    fake_setup();
    start_cuda(&dm);
    c = connect_gpu(&dm, &l);
    dev = cache_new(0, 2);
    ck_assert_int_eq(kvnode_put_gather_stream(c, k, NULL, 2, hb, nhd_at, M_NHD, nhd_len, nhd_off,
                                              4, NULL), -KVNODE_EINVAL);
    ck_assert_msg(strstr(kvnode_last_error(c), "unknown flags"), "%s", kvnode_last_error(c));
    memcpy(bad_len, nhd_len, sizeof bad_len);
    bad_len[3] -= 1;
    ck_assert_int_eq(kvnode_put_gather_stream(c, k, NULL, 2, hb, nhd_at, M_NHD, bad_len, nhd_off,
                                              KVNODE_BATCH_DEVICE, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_connect(dm.sock, &l, &plain), 0);
    ck_assert_int_eq(put_dev(plain, k, 2, dev, 0, 0), -KVNODE_ESTATE);
    ck_assert_msg(strstr(kvnode_last_error(plain), "declared no CUDA device"), "%s",
                  kvnode_last_error(plain));
    ck_assert_int_eq(get_dev(plain, k, 2, dev, 0, 0, &got), -KVNODE_ESTATE);
    KVH_OK(c, kvnode_match(c, k, 2, &matched));
    ck_assert_uint_eq(matched, 0);
    ck_assert_int_eq(kvh_stat(&dm, "leases.write"), 0);
    /* flags 0: host pieces, as kvnode_put_gather_checked */
    for (size_t i = 0; i < sizeof host; i++)
        host[i / BB][i % BB] = (uint8_t)(i * 13);
    {
        /* a host pool of 2 blocks in the NHD map's shape */
        static uint8_t pool[CACHE], pool2[CACHE];
        const void *pb[2] = {pool, pool + RUN};
        void *pb2[2] = {pool2, pool2 + RUN};
        const void *blk[2] = {host[0], host[1]};
        void *pbw[2] = {pool, pool + RUN};

        ck_assert_int_eq(kvnode_scatter(blk, 2, BB, pbw, nhd_at, M_NHD, nhd_len, nhd_off), 0);
        KVH_OK(plain, kvnode_put_gather_stream(plain, k, NULL, 2, pb, nhd_at, M_NHD, nhd_len,
                                               nhd_off, 0, NULL));
        KVH_OK(plain, kvnode_get_scatter_stream(plain, k, NULL, 2, pb2, nhd_at, M_NHD, nhd_len,
                                                nhd_off, 0, NULL, &got));
        ck_assert_uint_eq(got, 2);
        ck_assert_int_eq(kvnode_gather(bb, 2, BB, (const void *const *)pb2, nhd_at, M_NHD,
                                       nhd_len, nhd_off), 0);
        ck_assert_int_eq(memcmp(back, host, sizeof host), 0);
    }
    kvnode_close(plain);
    ck_assert_int_eq(cu.cudaFree(dev), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&dm);
    assert_no_violations();
    test_rmtree(fake_dir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("gather_cuda");
    TCase *tc = tcase_create("fakecuda");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, nhd_and_hnd_share_blocks_byte_exact);
    tcase_add_test(tc, gpu_tier_blocks_device_to_device);
    tcase_add_loop_test(tc, failed_copy_ends_the_lease, 0, 2);
    tcase_add_test(tc, bad_calls_fail_before_any_lease);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fakecuda_run_suite(suite());
}
