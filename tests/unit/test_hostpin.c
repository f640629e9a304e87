/* Unit tests for daemon/gpu/hostpin.c: chunked background pinning on the sim
 * backend (KVNODE_DEVMEM_SIM_PIN_DELAY_MS slows each chunk down so a test
 * can stop it midway).
 *
 * Contract tested here: a backend that cannot pin (none) makes
 * hostpin_start fail with -KVNODE_EINVAL and a reason, whatever first_sync;
 * HOSTPIN_FAILED needs a runtime that refuses a chunk (cuda only). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "gpu/devmem.h"
#include "gpu/hostpin.h"
#include "kvnode.h"
#include "core/liveness.h"

static size_t g_page;

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0) {}
}

static struct devmem *open_sim(const char *pin_delay_ms)
{
    struct devmem *dm = NULL;
    char why[256] = "";
    int rc;

    if (pin_delay_ms)
        setenv("KVNODE_DEVMEM_SIM_PIN_DELAY_MS", pin_delay_ms, 1);
    rc = devmem_open(DEVMEM_SIM, &dm, why, sizeof why);
    unsetenv("KVNODE_DEVMEM_SIM_PIN_DELAY_MS");
    ck_assert_msg(rc == 0, "devmem_open: %s", why);
    return dm;
}

static void *map_pages(size_t pages)
{
    void *p = mmap(NULL, pages * g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(p != MAP_FAILED);
    return p;
}

/* Poll until the state leaves RUNNING (or timeout); returns the progress. */
static struct hostpin_progress wait_end(struct hostpin *hp, unsigned timeout_ms)
{
    struct hostpin_progress pr;
    uint64_t deadline = clock_now_ms() + timeout_ms;

    for (;;) {
        hostpin_progress(hp, &pr);
        ck_assert_uint_le(pr.pinned_bytes, pr.total_bytes);
        if (pr.state != HOSTPIN_RUNNING || clock_now_ms() >= deadline)
            return pr;
        sleep_ms(2);
    }
}

static bool pin_worker_registered(void)
{
    struct liveness_info w[LIVENESS_MAX];
    size_t n = liveness_snapshot(liveness_now_ms(), w, LIVENESS_MAX);
    for (size_t i = 0; i < n && i < LIVENESS_MAX; i++)
        if (strcmp(w[i].name, "kvnode-pin") == 0)
            return true;
    return false;
}

START_TEST(test_done)
{
    struct devmem *dm = open_sim(NULL);
    struct hostpin *hp = NULL;
    char why[256] = "";
    size_t pages = 64;
    void *buf = map_pages(pages);

    /* 64 pages in chunks of 3: the last chunk is one page. */
    int rc = hostpin_start(dm, buf, pages * g_page, 3 * g_page, 0, false, &hp, why, sizeof why);
    ck_assert_msg(rc == 0, "hostpin_start: %d %s", rc, why);
    ck_assert_ptr_nonnull(hp);
    struct hostpin_progress pr = wait_end(hp, 5000);
    ck_assert_int_eq(pr.state, HOSTPIN_DONE);
    ck_assert_uint_eq(pr.pinned_bytes, pages * g_page);
    ck_assert_uint_eq(pr.total_bytes, pages * g_page);
    ck_assert_str_eq(pr.why, "");
    hostpin_stop(hp);
    ck_assert(!pin_worker_registered());
    hostpin_stop(NULL);
    munmap(buf, pages * g_page);
    devmem_close(dm);
}
END_TEST

START_TEST(test_first_sync)
{
    struct devmem *dm = open_sim("20");
    struct hostpin *hp = NULL;
    struct hostpin_progress pr;
    char why[256] = "";
    size_t pages = 8;
    void *buf = map_pages(pages);

    /* The first chunk is pinned on return, the rest follows. */
    int rc = hostpin_start(dm, buf, pages * g_page, 2 * g_page, 0, true, &hp, why, sizeof why);
    ck_assert_msg(rc == 0, "hostpin_start: %d %s", rc, why);
    hostpin_progress(hp, &pr);
    ck_assert_uint_ge(pr.pinned_bytes, 2 * g_page);
    pr = wait_end(hp, 5000);
    ck_assert_int_eq(pr.state, HOSTPIN_DONE);
    ck_assert_uint_eq(pr.pinned_bytes, pages * g_page);
    hostpin_stop(hp);

    /* One chunk covers it all: done on return, no thread. */
    hp = NULL;
    rc = hostpin_start(dm, buf, pages * g_page, 16 * g_page, 0, true, &hp, why, sizeof why);
    ck_assert_msg(rc == 0, "hostpin_start: %d %s", rc, why);
    hostpin_progress(hp, &pr);
    ck_assert_int_eq(pr.state, HOSTPIN_DONE);
    ck_assert_uint_eq(pr.pinned_bytes, pages * g_page);
    ck_assert(!pin_worker_registered());
    hostpin_stop(hp);

    munmap(buf, pages * g_page);
    devmem_close(dm);
}
END_TEST

START_TEST(test_stop_midway)
{
    struct devmem *dm = open_sim("40");
    struct hostpin *hp = NULL;
    struct hostpin_progress pr;
    char why[256] = "";
    size_t pages = 40;
    void *buf = map_pages(pages);

    /* 40 chunks of 40 ms: 1.6 s to pin it all. */
    int rc = hostpin_start(dm, buf, pages * g_page, g_page, 0, false, &hp, why, sizeof why);
    ck_assert_msg(rc == 0, "hostpin_start: %d %s", rc, why);
    sleep_ms(150);
    hostpin_progress(hp, &pr);
    ck_assert_int_eq(pr.state, HOSTPIN_RUNNING);
    ck_assert(pin_worker_registered());

    uint64_t t0 = clock_now_ms();
    hostpin_cancel(hp);
    ck_assert_uint_lt(clock_now_ms() - t0, 1000);   /* at most one chunk, not the rest */
    hostpin_progress(hp, &pr);
    ck_assert_int_eq(pr.state, HOSTPIN_STOPPED);
    ck_assert_uint_gt(pr.pinned_bytes, 0);
    ck_assert_uint_lt(pr.pinned_bytes, pr.total_bytes);
    ck_assert_uint_eq(pr.pinned_bytes % g_page, 0);
    ck_assert(!pin_worker_registered());
    hostpin_cancel(hp);   /* twice: no-op */
    hostpin_stop(hp);

    /* Stop without cancel, right after start. */
    hp = NULL;
    rc = hostpin_start(dm, buf, pages * g_page, g_page, 0, false, &hp, why, sizeof why);
    ck_assert_int_eq(rc, 0);
    hostpin_stop(hp);
    ck_assert(!pin_worker_registered());

    munmap(buf, pages * g_page);
    devmem_close(dm);
}
END_TEST

/* With the host arena's slab size, chunks are rounded up to a multiple of
 * the slab and of the page, counted from base: a block never spans two
 * registrations (issue 28 item 7). */
START_TEST(test_chunks_on_slab_boundaries)
{
    struct devmem *dm = open_sim(NULL);
    struct hostpin *hp = NULL;
    size_t pages = 128;
    char *buf = map_pages(pages);
    char why[256] = "";
    struct {
        uint64_t chunk, slab, want;
    } cases[] = {
        { 4 * g_page, 3 * g_page, 6 * g_page },      /* up to the next slab multiple */
        { 6 * g_page, 3 * g_page, 6 * g_page },      /* already one */
        { 4 * g_page, g_page + 256, 0 },             /* a slab that is no page multiple */
        { 4 * g_page, 0, 4 * g_page },               /* no slab given: as asked */
        { 200 * g_page, 3 * g_page, 201 * g_page },  /* larger than the range */
    };

    cases[2].want = (g_page + 256) * g_page / 256;   /* lcm: 256 divides a page */
    if (cases[2].want < 4 * g_page)
        cases[2].want *= (4 * g_page + cases[2].want - 1) / cases[2].want;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = hostpin_start(dm, buf, pages * g_page, cases[i].chunk, cases[i].slab, true, &hp, why,
                               sizeof why);
        ck_assert_msg(rc == 0, "case %zu: %d %s", i, rc, why);
        uint64_t got = hostpin_chunk_bytes(hp);
        ck_assert_msg(got == cases[i].want, "case %zu: chunk %llu, want %llu", i,
                      (unsigned long long)got, (unsigned long long)cases[i].want);
        ck_assert_uint_eq(got % g_page, 0);
        if (cases[i].slab)
            ck_assert_uint_eq(got % cases[i].slab, 0);
        struct hostpin_progress pr = wait_end(hp, 10000);
        ck_assert_int_eq(pr.state, HOSTPIN_DONE);
        ck_assert_uint_eq(pr.pinned_bytes, pages * g_page);
        hostpin_stop(hp);
        hp = NULL;
    }
    ck_assert_uint_eq(hostpin_chunk_bytes(NULL), 0);
    munmap(buf, pages * g_page);
    devmem_close(dm);
}
END_TEST

START_TEST(test_none_backend)
{
    struct devmem *dm = NULL;
    struct hostpin *hp = (struct hostpin *)1;
    char why[256] = "";
    void *buf = map_pages(4);

    ck_assert_int_eq(devmem_open(DEVMEM_NONE, &dm, why, sizeof why), 0);
    for (int sync = 0; sync < 2; sync++) {
        why[0] = '\0';
        int rc = hostpin_start(dm, buf, 4 * g_page, g_page, 0, sync, &hp, why, sizeof why);
        ck_assert_int_eq(rc, -KVNODE_EINVAL);
        ck_assert_ptr_null(hp);
        ck_assert_msg(strstr(why, "none") != NULL, "why: %s", why);
    }
    ck_assert(!pin_worker_registered());
    devmem_close(dm);
    munmap(buf, 4 * g_page);
}
END_TEST

START_TEST(test_bad_args)
{
    struct devmem *dm = open_sim(NULL);
    struct hostpin *hp = NULL;
    char why[256] = "";
    char *buf = map_pages(4);

    ck_assert_int_eq(hostpin_start(dm, buf, 4 * g_page, g_page + 1, 0, false, &hp, why, sizeof why),
                     -KVNODE_EINVAL);
    ck_assert_msg(strstr(why, "page") != NULL, "why: %s", why);
    ck_assert_int_eq(hostpin_start(dm, buf + 1, 2 * g_page, g_page, 0, false, &hp, why, sizeof why),
                     -KVNODE_EINVAL);
    ck_assert_int_eq(hostpin_start(dm, buf, 0, g_page, 0, false, &hp, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(hostpin_start(dm, buf, g_page, 0, 0, false, &hp, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(hostpin_start(dm, NULL, g_page, g_page, 0, false, &hp, why, sizeof why),
                     -KVNODE_EINVAL);
    ck_assert_int_eq(hostpin_start(NULL, buf, g_page, g_page, 0, false, &hp, why, sizeof why),
                     -KVNODE_EINVAL);
    ck_assert_int_eq(hostpin_start(dm, buf, g_page, g_page, 0, false, NULL, why, sizeof why),
                     -KVNODE_EINVAL);
    ck_assert_ptr_null(hp);
    /* A length that is not a multiple of the page size is fine. */
    ck_assert_int_eq(hostpin_start(dm, buf, 2 * g_page + 100, g_page, 0, false, &hp, why, sizeof why), 0);
    struct hostpin_progress pr = wait_end(hp, 5000);
    ck_assert_int_eq(pr.state, HOSTPIN_DONE);
    ck_assert_uint_eq(pr.pinned_bytes, 2 * g_page + 100);
    hostpin_stop(hp);
    munmap(buf, 4 * g_page);
    devmem_close(dm);
}
END_TEST

static Suite *hostpin_suite(void)
{
    Suite *s = suite_create("hostpin");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_done);
    tcase_add_test(tc, test_chunks_on_slab_boundaries);
    tcase_add_test(tc, test_first_sync);
    tcase_add_test(tc, test_stop_midway);
    tcase_add_test(tc, test_none_backend);
    tcase_add_test(tc, test_bad_args);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    SRunner *sr = srunner_create(hostpin_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
