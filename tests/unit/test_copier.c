/* Unit tests for daemon/gpu/copier.c: batches of copies on the sim backend,
 * with a real event_base driven by the test's thread (the loop thread).
 *
 * Error contract tested here: a batch the copier can reject up front (no
 * done(), device out of range, NULL pointers) fails copier_submit with
 * -KVNODE_EINVAL and done() is never called; runtime failures come back in
 * done() with rc < 0 (not reachable with sim); batches still queued at
 * copier_destroy get done() with -KVNODE_ESHUTDOWN. Transfers never cross a
 * pin chunk of the batch's host range (devmem_spy.h checks each copy
 * against the registrations). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "core/clock.h"
#include "devmem_spy.h"
#include "gpu/copier.h"
#include "gpu/devmem.h"
#include "kvnode.h"
#include "loop_wait.h"
#include "core/liveness.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131u + seed);
}

/* Test batch: done() records its order and outcome. */
struct tbatch {
    struct copier_batch b;
    struct copier_item items[32];
    int  id;
    int  dones;
    int  rc;
    char why[256];
};

static size_t g_done;
static int    g_order[64];
static struct copier *g_resubmit_cp;   /* done() tries a submit on it when set */
static int    g_resubmit_rc;

static void tb_done(struct copier_batch *b)
{
    struct tbatch *t = b->arg;
    t->dones++;
    t->rc = b->rc;
    snprintf(t->why, sizeof t->why, "%s", b->why);
    if (g_done < 64)
        g_order[g_done] = t->id;
    g_done++;
    if (g_resubmit_cp) {
        static struct tbatch extra;
        memset(&extra, 0, sizeof extra);
        extra.b.done = tb_done;
        extra.b.arg = &extra;
        g_resubmit_rc = copier_submit(g_resubmit_cp, &extra.b);
    }
}

static void tb_init(struct tbatch *t, int id, int device)
{
    memset(t, 0, sizeof *t);
    t->id = id;
    t->rc = 1;
    t->b.device = device;
    t->b.items = t->items;
    t->b.done = tb_done;
    t->b.arg = t;
}

static void tb_add(struct tbatch *t, void *dst, const void *src, size_t len)
{
    ck_assert_uint_lt(t->b.n, 32);
    t->items[t->b.n++] = (struct copier_item){ dst, src, len };
}

struct fixture {
    struct event_base *base;
    struct devmem *dm;
    struct copier *cp;
    struct devmem_region r[2];
};

static void fx_open(struct fixture *f, size_t queue, const char *copy_delay_ms)
{
    char why[256] = "";
    int rc;

    g_done = 0;
    g_resubmit_cp = NULL;
    g_resubmit_rc = 0;
    memset(f, 0, sizeof *f);
    f->base = event_base_new();
    ck_assert_ptr_nonnull(f->base);
    if (copy_delay_ms)
        setenv("KVNODE_DEVMEM_SIM_COPY_DELAY_MS", copy_delay_ms, 1);
    rc = devmem_open(DEVMEM_SIM, &f->dm, why, sizeof why);
    unsetenv("KVNODE_DEVMEM_SIM_COPY_DELAY_MS");
    ck_assert_msg(rc == 0, "devmem_open: %s", why);
    for (int d = 0; d < 2; d++) {
        rc = devmem_region_alloc(f->dm, d, MiB, &f->r[d], why, sizeof why);
        ck_assert_msg(rc == 0, "region_alloc: %s", why);
    }
    rc = copier_create(f->base, f->dm, 1, queue, &f->cp, why, sizeof why);
    ck_assert_msg(rc == 0, "copier_create: %d %s", rc, why);
}

static void fx_close(struct fixture *f)
{
    copier_destroy(f->cp);
    for (int d = 0; d < 2; d++)
        devmem_region_free(f->dm, &f->r[d]);
    devmem_close(f->dm);
    event_base_free(f->base);
    ck_assert(liveness_check(liveness_now_ms(), 10000, NULL, 0));
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
}

/* --- tests ------------------------------------------------------------------ */

START_TEST(test_merge)
{
    struct fixture f;
    struct tbatch t;
    struct copier_stats st;
    uint8_t *src = malloc(MiB);
    uint8_t *dev = NULL;
    size_t bytes = 0;

    ck_assert_ptr_nonnull(src);
    fill(src, MiB, 7);
    fx_open(&f, 4, NULL);
    dev = f.r[0].base;
    memset(dev, 0, MiB);
    tb_init(&t, 1, 0);
    /* 8 runs of 4 KiB, contiguous on both sides: one transfer. */
    for (int i = 0; i < 8; i++)
        tb_add(&t, dev + i * 4 * KiB, src + i * 4 * KiB, 4 * KiB);
    /* Destination jumps: a new transfer, continued by the next item. */
    tb_add(&t, dev + 100 * KiB, src + 32 * KiB, 1 * KiB);
    tb_add(&t, dev + 101 * KiB, src + 33 * KiB, 3 * KiB);
    /* Source continues, destination does not: new transfer. */
    tb_add(&t, dev + 200 * KiB, src + 36 * KiB, 512);
    /* Empty items are skipped and break nothing. */
    tb_add(&t, dev + 200 * KiB + 512, src + 36 * KiB + 512, 0);
    /* Destination continues, source does not: new transfer. */
    tb_add(&t, dev + 200 * KiB + 512, src + 300 * KiB, 1000);
    for (size_t i = 0; i < t.b.n; i++)
        bytes += t.items[i].len;

    ck_assert_int_eq(copier_submit(f.cp, &t.b), 0);
    copier_stats(f.cp, &st);
    ck_assert_uint_eq(st.pending, 1);
    loop_until(f.base, &g_done, 1, 5000);
    ck_assert_uint_eq(g_done, 1);
    ck_assert_int_eq(t.dones, 1);
    ck_assert_msg(t.rc == 0, "rc %d: %s", t.rc, t.why);
    for (size_t i = 0; i < t.b.n; i++)
        ck_assert_msg(memcmp(t.items[i].dst, t.items[i].src, t.items[i].len) == 0, "item %zu", i);
    /* Nothing outside the items was written. */
    ck_assert_uint_eq(dev[32 * KiB], 0);
    ck_assert_uint_eq(dev[200 * KiB + 1512], 0);

    copier_stats(f.cp, &st);
    ck_assert_uint_eq(st.batches, 1);
    ck_assert_uint_eq(st.failed, 0);
    ck_assert_uint_eq(st.transfers, 4);
    ck_assert_uint_eq(st.bytes, bytes);
    ck_assert_uint_eq(st.busy_ns, t.b.elapsed_ns);
    ck_assert_uint_eq(st.pending, 0);
    fx_close(&f);
    free(src);
}
END_TEST

/* Demotion-like traffic: host -> dev, dev -> dev, dev -> host, on both
 * devices' streams, completing in submission order. */
START_TEST(test_many_batches)
{
    struct fixture f;
    static struct tbatch t[24];
    struct copier_stats st;
    uint8_t *src = malloc(MiB), *out = calloc(1, MiB);
    uint64_t bytes = 0;

    ck_assert(src && out);
    fill(src, MiB, 11);
    fx_open(&f, 32, NULL);
    uint8_t *d0 = f.r[0].base, *d1 = f.r[1].base;
    for (int i = 0; i < 8; i++) {
        size_t off = (size_t)i * 64 * KiB;
        tb_init(&t[i], i, i % 2);
        tb_add(&t[i], (i % 2 ? d1 : d0) + off, src + off, 64 * KiB);
        bytes += 64 * KiB;
        ck_assert_int_eq(copier_submit(f.cp, &t[i].b), 0);
    }
    for (int i = 8; i < 16; i++) {
        size_t off = (size_t)(i - 8) * 64 * KiB;
        /* Copy the other device's block over: dev -> dev. */
        tb_init(&t[i], i, i % 2);
        tb_add(&t[i], (i % 2 ? d0 : d1) + off, (i % 2 ? d1 : d0) + off, 64 * KiB);
        bytes += 64 * KiB;
        ck_assert_int_eq(copier_submit(f.cp, &t[i].b), 0);
    }
    loop_until(f.base, &g_done, 16, 5000);
    ck_assert_uint_eq(g_done, 16);
    for (int i = 16; i < 24; i++) {
        size_t off = (size_t)(i - 16) * 64 * KiB;
        tb_init(&t[i], i, i % 2);
        tb_add(&t[i], out + off, (i % 2 ? d1 : d0) + off, 64 * KiB);
        bytes += 64 * KiB;
        ck_assert_int_eq(copier_submit(f.cp, &t[i].b), 0);
    }
    loop_until(f.base, &g_done, 24, 5000);
    ck_assert_uint_eq(g_done, 24);
    for (int i = 0; i < 24; i++) {
        ck_assert_int_eq(g_order[i], i);
        ck_assert_int_eq(t[i].dones, 1);
        ck_assert_msg(t[i].rc == 0, "batch %d: %d %s", i, t[i].rc, t[i].why);
    }
    ck_assert(memcmp(out, src, 8 * 64 * KiB) == 0);
    ck_assert(memcmp(d0, src, 8 * 64 * KiB) == 0);
    ck_assert(memcmp(d1, src, 8 * 64 * KiB) == 0);
    copier_stats(f.cp, &st);
    ck_assert_uint_eq(st.batches, 24);
    ck_assert_uint_eq(st.failed, 0);
    ck_assert_uint_eq(st.transfers, 24);
    ck_assert_uint_eq(st.bytes, bytes);
    ck_assert_uint_eq(st.pending, 0);
    fx_close(&f);
    free(src);
    free(out);
}
END_TEST

START_TEST(test_queue_full)
{
    struct fixture f;
    struct tbatch t[3];
    struct copier_stats st;
    uint8_t a[3][256], b[3][256];

    fx_open(&f, 2, "150");
    for (int i = 0; i < 3; i++) {
        fill(a[i], sizeof a[i], (unsigned)i);
        memset(b[i], 0, sizeof b[i]);
        tb_init(&t[i], i, 0);
        tb_add(&t[i], b[i], a[i], sizeof a[i]);
    }
    ck_assert_int_eq(copier_submit(f.cp, &t[0].b), 0);
    ck_assert_int_eq(copier_submit(f.cp, &t[1].b), 0);
    ck_assert_int_eq(copier_submit(f.cp, &t[2].b), -KVNODE_ELIMIT);
    copier_stats(f.cp, &st);
    ck_assert_uint_eq(st.pending, 2);
    loop_until(f.base, &g_done, 2, 5000);
    ck_assert_uint_eq(g_done, 2);
    ck_assert_int_eq(t[2].dones, 0);
    /* Room again. */
    ck_assert_int_eq(copier_submit(f.cp, &t[2].b), 0);
    loop_until(f.base, &g_done, 3, 5000);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(t[i].dones, 1);
        ck_assert_int_eq(t[i].rc, 0);
        ck_assert(memcmp(a[i], b[i], sizeof a[i]) == 0);
        /* The wait's delay is part of the measured time. */
        ck_assert_uint_ge(t[i].b.elapsed_ns, 140u * 1000000u);
    }
    copier_stats(f.cp, &st);
    ck_assert_uint_eq(st.batches, 3);
    ck_assert_uint_ge(st.busy_ns, 3u * 140u * 1000000u);
    fx_close(&f);
}
END_TEST

START_TEST(test_destroy_cancels)
{
    struct fixture f;
    struct tbatch t[4];
    uint8_t a[4][128], b[4][128];

    fx_open(&f, 4, "300");
    for (int i = 0; i < 4; i++) {
        fill(a[i], sizeof a[i], (unsigned)i + 20);
        memset(b[i], 0, sizeof b[i]);
        tb_init(&t[i], i, 0);
        tb_add(&t[i], b[i], a[i], sizeof a[i]);
        ck_assert_int_eq(copier_submit(f.cp, &t[i].b), 0);
    }
    test_sleep_ms(100);   /* the worker is in batch 0's wait */
    g_resubmit_cp = f.cp;
    g_resubmit_rc = 0;
    copier_destroy(f.cp);
    f.cp = NULL;
    ck_assert_uint_eq(g_done, 4);
    ck_assert_int_eq(t[0].rc, 0);
    ck_assert(memcmp(a[0], b[0], sizeof a[0]) == 0);
    for (int i = 1; i < 4; i++) {
        ck_assert_int_eq(t[i].dones, 1);
        ck_assert_int_eq(t[i].rc, -KVNODE_ESHUTDOWN);
        ck_assert_str_ne(t[i].why, "");
        ck_assert_int_eq(g_order[i], i);
    }
    /* Submitting from done() during destroy is refused. */
    ck_assert_int_eq(g_resubmit_rc, -KVNODE_ESHUTDOWN);
    g_resubmit_cp = NULL;
    fx_close(&f);
}
END_TEST

/* A run contiguous on both sides goes out as one transfer per pin chunk of
 * the host range it touches: never part pinned, part not, nor across two
 * registrations (the driver refuses those: issue 28 item 7). */
START_TEST(test_runs_split_at_pin_chunks)
{
    struct fixture f;
    struct tbatch t;
    struct copier_stats st;
    const size_t chunk = 64 * KiB;
    uint8_t *host = aligned_alloc(4096, MiB);
    char first[256] = "";

    ck_assert_ptr_nonnull(host);
    memset(host, 0, MiB);
    fx_open(&f, 4, NULL);
    spy_reset();
    uint8_t *dev = f.r[0].base;
    fill(dev, MiB, 5);
    /* Chunks 0..3 registered (as if pinning stopped there), the rest not. */
    for (size_t c = 0; c < 4; c++) {
        char why[128];
        ck_assert_int_eq(devmem_host_register(f.dm, host + c * chunk, chunk, why, sizeof why), 0);
    }
    tb_init(&t, 1, 0);
    t.b.host_base = host;
    t.b.host_len = MiB;
    t.b.host_chunk = chunk;
    /* 10 blocks of 16 KiB from 32 KiB: 32..64, 64..128, 128..192 KiB. */
    for (int i = 0; i < 10; i++)
        tb_add(&t, host + 32 * KiB + (size_t)i * 16 * KiB, dev + (size_t)i * 16 * KiB, 16 * KiB);
    /* One item across the pinned/unpinned edge at 256 KiB: split in two. */
    tb_add(&t, host + 250 * KiB, dev + 500 * KiB, 12 * KiB);
    /* Device to device: no host side, one transfer. */
    tb_add(&t, dev + 800 * KiB, dev + 600 * KiB, 100 * KiB);
    ck_assert_int_eq(copier_submit(f.cp, &t.b), 0);
    loop_until(f.base, &g_done, 1, 5000);
    ck_assert_int_eq(t.dones, 1);
    ck_assert_msg(t.rc == 0, "rc %d: %s", t.rc, t.why);
    for (size_t i = 0; i < t.b.n - 1; i++)
        ck_assert_msg(memcmp(t.items[i].dst, t.items[i].src, t.items[i].len) == 0, "item %zu", i);
    ck_assert(memcmp(dev + 800 * KiB, dev + 600 * KiB, 100 * KiB) == 0);
    ck_assert_uint_eq(host[32 * KiB - 1], 0);
    uint64_t v = spy_violation_count(first, sizeof first);
    ck_assert_msg(v == 0, "%llu copies straddle registrations; first: %s", (unsigned long long)v, first);
    copier_stats(f.cp, &st);
    ck_assert_uint_eq(st.transfers, 3 + 2 + 1);
    ck_assert_uint_eq(st.chunk_splits, 3);
    for (size_t c = 0; c < 4; c++)
        devmem_host_unregister(f.dm, host + c * chunk);

    /* A chunk size needs the host range it divides. */
    tb_init(&t, 2, 0);
    t.b.host_chunk = chunk;
    ck_assert_int_eq(copier_submit(f.cp, &t.b), -KVNODE_EINVAL);
    fx_close(&f);
    free(host);
}
END_TEST

START_TEST(test_bad_batches)
{
    struct fixture f;
    struct tbatch t;
    struct copier_stats st;
    uint8_t a[64] = { 1 }, b[64];
    int bad_dev[] = { -1, DEVMEM_SIM_DEVICES, 1000 };

    fx_open(&f, 4, NULL);
    for (size_t i = 0; i < sizeof bad_dev / sizeof bad_dev[0]; i++) {
        tb_init(&t, 1, bad_dev[i]);
        tb_add(&t, b, a, sizeof a);
        ck_assert_int_eq(copier_submit(f.cp, &t.b), -KVNODE_EINVAL);
        ck_assert_msg(strstr(t.b.why, "out of range") != NULL, "why: %s", t.b.why);
    }
    tb_init(&t, 1, 0);
    tb_add(&t, NULL, a, sizeof a);
    ck_assert_int_eq(copier_submit(f.cp, &t.b), -KVNODE_EINVAL);
    tb_init(&t, 1, 0);
    tb_add(&t, b, NULL, 1);
    ck_assert_int_eq(copier_submit(f.cp, &t.b), -KVNODE_EINVAL);
    tb_init(&t, 1, 0);
    t.b.n = 2;
    t.b.items = NULL;
    ck_assert_int_eq(copier_submit(f.cp, &t.b), -KVNODE_EINVAL);
    tb_init(&t, 1, 0);
    tb_add(&t, b, a, sizeof a);
    t.b.done = NULL;
    ck_assert_int_eq(copier_submit(f.cp, &t.b), -KVNODE_EINVAL);
    ck_assert_int_eq(copier_submit(f.cp, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(copier_submit(NULL, &t.b), -KVNODE_EINVAL);

    /* Nothing was accepted, nothing completes. */
    loop_until(f.base, &g_done, 1, 100);
    ck_assert_uint_eq(g_done, 0);
    copier_stats(f.cp, &st);
    ck_assert_uint_eq(st.batches, 0);
    ck_assert_uint_eq(st.pending, 0);

    /* An empty batch (or only empty items) completes with rc 0. */
    tb_init(&t, 2, 1);
    ck_assert_int_eq(copier_submit(f.cp, &t.b), 0);
    loop_until(f.base, &g_done, 1, 5000);
    ck_assert_int_eq(t.dones, 1);
    ck_assert_int_eq(t.rc, 0);
    tb_init(&t, 3, 1);
    tb_add(&t, NULL, NULL, 0);
    ck_assert_int_eq(copier_submit(f.cp, &t.b), 0);
    loop_until(f.base, &g_done, 2, 5000);
    ck_assert_int_eq(t.dones, 1);
    ck_assert_int_eq(t.rc, 0);
    copier_stats(f.cp, &st);
    ck_assert_uint_eq(st.batches, 2);
    ck_assert_uint_eq(st.transfers, 0);
    ck_assert_uint_eq(st.bytes, 0);
    fx_close(&f);
}
END_TEST

START_TEST(test_create_args)
{
    struct event_base *base = event_base_new();
    struct devmem *none = NULL, *sim = NULL;
    struct copier *cp = (struct copier *)1;
    char why[256] = "";

    ck_assert_int_eq(devmem_open(DEVMEM_NONE, &none, why, sizeof why), 0);
    ck_assert_int_eq(devmem_open(DEVMEM_SIM, &sim, why, sizeof why), 0);
    why[0] = '\0';
    ck_assert_int_eq(copier_create(base, none, 1, 4, &cp, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_ptr_null(cp);
    ck_assert_msg(strstr(why, "none") != NULL, "why: %s", why);
    ck_assert_int_eq(copier_create(base, sim, 1, 0, &cp, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(copier_create(base, sim, 0, 4, &cp, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(copier_create(base, sim, COPIER_MAX_THREADS + 1, 4, &cp, why, sizeof why),
                     -KVNODE_EINVAL);
    ck_assert_int_eq(copier_create(NULL, sim, 1, 4, &cp, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(copier_create(base, NULL, 1, 4, &cp, why, sizeof why), -KVNODE_EINVAL);
    copier_destroy(NULL);
    struct copier_stats st;
    copier_stats(NULL, &st);
    ck_assert_uint_eq(st.batches, 0);
    devmem_close(none);
    devmem_close(sim);
    event_base_free(base);
}
END_TEST

static Suite *copier_suite(void)
{
    Suite *s = suite_create("copier");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_merge);
    tcase_add_test(tc, test_runs_split_at_pin_chunks);
    tcase_add_test(tc, test_many_batches);
    tcase_add_test(tc, test_queue_full);
    tcase_add_test(tc, test_destroy_cancels);
    tcase_add_test(tc, test_bad_batches);
    tcase_add_test(tc, test_create_args);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(copier_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
