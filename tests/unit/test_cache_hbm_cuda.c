/* Unit tests of demotion through the daemon's cuda backend (the driver API,
 * dlopen'ed) against the strict fake CUDA (tests/fakecuda): the GPU side is
 * started as kvnoded starts it (gpu_start: VMM regions on the fake's two
 * devices, the copier, the host arena pinned in chunks with the HBM
 * device's context), and the fake records every rule the daemon breaks in
 * $FAKECUDA_DIR/violations (issue 28 items 7 and 8).
 *
 * - demotion while pinning runs, with a chunk that is no multiple of the
 *   slab (nor of the block): no copy straddles a registration
 *   (copy-straddles-pin) nor breaks any other rule;
 * - every cuMemcpyAsync failing for a while ($FAKECUDA_DIR/fail, not a
 *   sticky error): the device's demotion batches back off instead of being
 *   sent again at once, it stays up, and demotion resumes once copies work;
 * - a sticky error on device 0 ($FAKECUDA_DIR/sticky-0): the device is
 *   down, its blocks dropped, copies on it stop (counted by devmem_spy.h),
 *   HBM puts land in host memory, device 1 and host memory still served.
 *
 * HBM blocks are real device memory here (the daemon's CPU cannot read
 * them), so these tests do not fill the blocks: byte-exact moves are
 * test_cache_hbm's, on the sim backend. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "cache_hbm_setup.h"
#include "devmem_spy.h"
#include "../fakecuda/fakecuda_env.h"
#include "../fakecuda/fakecuda_check.h"
#include "cache/cache.h"
#include "config/config.h"
#include "gpu/gpu.h"
#include "kvnode.h"
#include "core/log.h"
#include "stats.h"

#define BLOCK (16u * 1024u)
#define SLAB  (256u * 1024u)
#define HBM_BYTES (2u << 20)          /* one VMM granule: 128 blocks per device */
#define HBM_BLOCKS (HBM_BYTES / BLOCK)

static struct event_base *base;
static struct cache *cache;
static struct gpu *gpu;
static struct kvn_config cfg;
static struct kv_namespace *ns;
static struct lease_list gpu0, gpu1;
static char fdir[64];

static void setup_with(uint64_t pin_chunk)
{
    const struct ns_layout l = { .model = "m", .dtype = "bf16", .block_tokens = 16, .block_bytes = BLOCK,
                                 .num_layers = 2, .kv_heads = 2, .head_dim = 64, .tp_size = 1, .tp_rank = 0 };

    log_set_level(LOG_LEVEL_ERROR);
    snprintf(fdir, sizeof fdir, "/tmp/kvnode-fakecuda-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(fdir));
    ck_assert_int_eq(fakecuda_setup(fdir), 0);
    setenv("FAKECUDA_COPY_DELAY_MS", "5", 1);
    cache_hbm_config(&cfg, BLOCK, SLAB, HBM_BYTES);
    cfg.host_bytes = 8u << 20;
    cfg.pin_host = CONFIG_PIN_ON;
    cfg.pin_chunk_bytes = pin_chunk;
    cfg.hbm_backend = CONFIG_HBM_CUDA;
    cfg.hbm_required = true;
    cache_hbm_start(&cfg, HBM_BYTES, &l, &base, &cache, &gpu, &ns);
    memset(&gpu0, 0, sizeof gpu0);
    memset(&gpu1, 0, sizeof gpu1);
    gpu0.mapped = gpu1.mapped = 0x7;
    gpu0.put_arena = 1;
    gpu1.put_arena = 2;
}

static void teardown(void)
{
    char cmd[128];

    cache_release_owner(cache, &gpu0);
    cache_release_owner(cache, &gpu1);
    gpu_stop(gpu);
    cache_destroy(cache);
    gpu_destroy(gpu);
    event_base_free(base);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fdir);
    ck_assert_int_eq(system(cmd), 0);
}

static json_t *stats(void)
{
    json_t *root = json_object();
    stats_cache_json(cache, root);
    return root;
}

static json_int_t stat_int(const char *a, const char *b)
{
    json_t *root = stats();
    json_t *v = json_object_get(json_object_get(root, a), b);
    ck_assert_msg(json_is_integer(v), "%s.%s missing", a, b);
    json_int_t out = json_integer_value(v);
    json_decref(root);
    return out;
}

static json_t *hbm_field(json_t *root, int dev, const char *key)
{
    return json_object_get(json_array_get(json_object_get(json_object_get(root, "tiers"), "hbm"), (size_t)dev),
                           key);
}

static json_int_t hbm_int(int dev, const char *key)
{
    json_t *root = stats();
    json_t *v = hbm_field(root, dev, key);
    ck_assert_msg(json_is_integer(v), "tiers.hbm.%d.%s missing", dev, key);
    json_int_t out = json_integer_value(v);
    json_decref(root);
    return out;
}

static void hbm_str(int dev, const char *key, char *out, size_t len)
{
    json_t *root = stats();
    json_t *v = hbm_field(root, dev, key);
    snprintf(out, len, "%s", json_is_string(v) ? json_string_value(v) : "(missing)");
    json_decref(root);
}

/* Put keys [first, first+n) asking for HBM (the bytes are not written);
 * how many landed in HBM. */
static size_t put_hbm(struct lease_list *who, int64_t first, size_t n)
{
    return cache_hbm_put(cache, ns, who, first, n, NULL);
}

static void settle(void)
{
    for (int i = 0; i < 10000; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        if (stat_int("demotions", "batches_pending") == 0) {
            event_base_loop(base, EVLOOP_NONBLOCK);
            if (stat_int("demotions", "batches_pending") == 0)
                return;
        }
        usleep(1000);
    }
    ck_abort_msg("demotions did not settle: %lld batches, %lld blocks failed, %d violations of the CUDA "
                 "rules (%d copy-straddles-pin)", (long long)stat_int("demotions", "batches_total"),
                 (long long)stat_int("demotions", "failed_total"), fakecuda_env_violations(NULL),
                 fakecuda_env_violations("copy-straddles-pin"));
}

static void expect_no_violations(void)
{
    int v = fakecuda_env_violations(NULL);
    if (v != 0)
        fakecuda_env_print_violations(stderr);
    ck_assert_msg(v == 0, "%d violations of the CUDA rules (above)", v);
}

/* 25 pages (100 KiB with 4 KiB pages): 6.25 blocks, 0.39 slabs. Demotion
 * starts at once, while the pinning thread still registers chunks. */
START_TEST(demotion_while_pinning_breaks_no_rule)
{
    setup_with((uint64_t)sysconf(_SC_PAGESIZE) * 25);
    size_t over = HBM_BLOCKS * 3 / 4 + 1;
    for (size_t put = 0; put < over; put += 32)
        ck_assert_uint_eq(put_hbm(&gpu0, 1 + (int64_t)put, over - put < 32 ? over - put : 32),
                          over - put < 32 ? over - put : 32);
    settle();
    ck_assert_int_eq(stat_int("demotions", "failed_total"), 0);
    ck_assert_int_eq(stat_int("demotions", "blocks_total"), (json_int_t)(over - HBM_BLOCKS / 2));
    ck_assert_int_eq(hbm_int(0, "used_bytes"), (json_int_t)(HBM_BLOCKS / 2 * BLOCK));
    expect_no_violations();
    ck_assert_int_eq(fakecuda_env_violations("copy-straddles-pin"), 0);
    teardown();
}
END_TEST

/* $FAKECUDA_DIR/fail: entry points that fail (999, not sticky) until the
 * file goes. */
static void set_fail(const char *names)
{
    char p[128];
    snprintf(p, sizeof p, "%s/fail", fdir);
    if (!names) {
        ck_assert_int_eq(unlink(p), 0);
        return;
    }
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s\n", names);
    fclose(f);
}

START_TEST(failing_copies_back_off)
{
    setup_with(1u << 20);
    set_fail("cuMemcpyAsync");
    ck_assert_uint_eq(put_hbm(&gpu0, 1, 97), 97);
    /* 400 ms of the loop: 10+20+40+80+160 ms of backoff fit, so at most 6
     * rounds of (at most 2) batches; without a backoff, hundreds. */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(1000);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 400);
    json_int_t batches = stat_int("demotions", "batches_total");
    ck_assert_msg(batches >= 1 && batches <= 14, "%lld failed batches in 400 ms: no backoff",
                  (long long)batches);
    ck_assert_int_eq(stat_int("demotions", "failed_batches_total"), batches);
    ck_assert_int_ge(hbm_int(0, "demotion_backoff_ms"), 10);
    char state[32];
    hbm_str(0, "state", state, sizeof state);
    ck_assert_str_eq(state, "up");
    ck_assert_int_eq(hbm_int(0, "used_bytes"), 97 * BLOCK);
    ck_assert_int_eq(stat_int("demotions", "blocks_total"), 0);

    /* The copies work again: the next try after the backoff moves them. */
    set_fail(NULL);
    for (int i = 0; i < 10000 && stat_int("demotions", "blocks_total") < 33; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(1000);
    }
    settle();
    ck_assert_int_eq(stat_int("demotions", "blocks_total"), 33);
    ck_assert_int_eq(hbm_int(0, "demotion_backoff_ms"), 0);
    ck_assert_int_eq(hbm_int(0, "demotion_failing_batches"), 0);
    expect_no_violations();
    teardown();
}
END_TEST

START_TEST(sticky_error_takes_the_device_down)
{
    char path[128], state[32], reason[512];

    setup_with(1u << 20);
    ck_assert_uint_eq(put_hbm(&gpu0, 1, 32), 32);
    snprintf(path, sizeof path, "%s/sticky-0", fdir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    /* Past the high watermark: the first demotion meets the sticky error. */
    ck_assert_uint_eq(put_hbm(&gpu0, 33, 80), 80);
    for (int i = 0; i < 10000; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        hbm_str(0, "state", state, sizeof state);
        if (strcmp(state, "down") == 0 && hbm_int(0, "used_bytes") == 0)
            break;
        usleep(1000);
    }
    settle();
    ck_assert_str_eq(state, "down");
    hbm_str(0, "down_reason", reason, sizeof reason);
    ck_assert_msg(strstr(reason, "700") != NULL || strstr(reason, "ILLEGAL") != NULL ||
                  strstr(reason, "illegal") != NULL, "down_reason: %s", reason);
    ck_assert_int_eq(hbm_int(0, "used_bytes"), 0);
    ck_assert_int_eq(hbm_int(0, "down_dropped_blocks_total"), 112);
    uint64_t copies = spy_copy_count(0);
    json_int_t batches = stat_int("demotions", "batches_total");
    ck_assert_msg(copies <= 4, "%llu copies on the dead device", (unsigned long long)copies);

    /* Puts asking for HBM on device 0 land in host memory; device 1 works. */
    ck_assert_uint_eq(put_hbm(&gpu0, 1000, 16), 0);
    ck_assert_uint_eq(put_hbm(&gpu1, 2000, 16), 16);
    hbm_str(1, "state", state, sizeof state);
    ck_assert_str_eq(state, "up");
    cache_hbm_expect_device_gone(cache, base, 0, copies);
    ck_assert_int_eq(stat_int("demotions", "batches_total"), batches);
    expect_no_violations();
    teardown();
}
END_TEST

int main(int argc, char **argv)
{
    fakecuda_reexec(argc, argv);
    Suite *s = suite_create("cache_hbm_cuda");
    TCase *tc = tcase_create("fakecuda");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, demotion_while_pinning_breaks_no_rule);
    tcase_add_test(tc, failing_copies_back_off);
    tcase_add_test(tc, sticky_error_takes_the_device_down);
    suite_add_tcase(s, tc);
    return fakecuda_run_suite(s);
}
