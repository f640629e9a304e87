/* pings: the check that the daemon's loop never waits for a slow backend
 * (store, KVCM): a loop that waited would answer a PING only after the
 * backend's delay or timeout (backend_ms, a second or more in every test),
 * while one that does not answers in well under a millisecond on an idle
 * machine. The bounds are fractions of backend_ms, not absolute figures, so
 * that a machine loaded by other suites and a CPU hog (scheduling delays of
 * tens of milliseconds) does not fail the test while a waiting loop still
 * does. Sanitizer builds run about four times slower, valgrind ten. */
#ifndef KVNODE_TEST_PINGS_H
#define KVNODE_TEST_PINGS_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "../sim/simctl.h"

/* Of backend_ms: the 90th percentile and the slowest ping allowed. */
#define PINGS_P90_FRACTION 0.1
#define PINGS_MAX_FRACTION 0.5

#if defined(__SANITIZE_ADDRESS__)
#define PINGS_SAN_SCALE 4
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PINGS_SAN_SCALE 4
#endif
#endif
#ifndef PINGS_SAN_SCALE
#define PINGS_SAN_SCALE 1
#endif

static int pings_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Ping n (<= 200) times, gap_ms apart, while the backend takes backend_ms
 * (>= 1000) per call; assert the 90th percentile and the slowest are the
 * fractions above of it (never beyond 0.9 of it, even scaled). PING_DEBUG=1
 * prints them. */
static void pings_fast(kvnode_client *obs, int n, unsigned gap_ms, unsigned backend_ms, const char *when)
{
    double ms[200], scale = simctl_under_valgrind() ? 10 : PINGS_SAN_SCALE;
    ck_assert(n > 0 && n <= 200 && backend_ms >= 1000);
    for (int i = 0; i < n; i++) {
        uint64_t t0 = kvh_now_ns();
        KVH_OK(obs, kvnode_ping(obs));
        ms[i] = (double)(kvh_now_ns() - t0) / 1e6;
        kvh_sleep_ms(gap_ms);
    }
    qsort(ms, (size_t)n, sizeof ms[0], pings_cmp_double);
    double p90 = ms[(n * 9) / 10], worst = ms[n - 1], cap = 0.9 * backend_ms;
    double p90_max = PINGS_P90_FRACTION * backend_ms * scale, worst_max = PINGS_MAX_FRACTION * backend_ms * scale;
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "pings %s: p50 %.2f ms, p90 %.2f ms, max %.2f ms\n", when, ms[n / 2], p90,
                worst);
    ck_assert_msg(p90 < (p90_max < cap ? p90_max : cap), "pings %s: 90th percentile %.1f ms (the "
                  "backend takes %u ms)", when, p90, backend_ms);
    ck_assert_msg(worst < (worst_max < cap ? worst_max : cap), "pings %s: one took %.1f ms (the backend "
                  "takes %u ms)", when, worst, backend_ms);
}

#endif
