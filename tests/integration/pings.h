/* pings: the check that the daemon's loop never waits for a slow backend
 * (store, KVCM): PING latencies stay a fraction of a millisecond, while a
 * loop that waited would take the backend's delay or timeout (seconds). The
 * bounds leave room for a busy 2-core test machine; valgrind runs ten times
 * slower, sanitizer builds about four. */
#ifndef KVNODE_TEST_PINGS_H
#define KVNODE_TEST_PINGS_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "../sim/simctl.h"

#define PINGS_P90_MS 20.0
#define PINGS_MAX_MS 250.0

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

/* Ping n (<= 200) times, gap_ms apart; assert the 90th percentile and the
 * largest latency are within the bounds. PING_DEBUG=1 prints them. */
static void pings_fast(kvnode_client *obs, int n, unsigned gap_ms, const char *when)
{
    double ms[200], scale = simctl_under_valgrind() ? 10 : PINGS_SAN_SCALE;
    ck_assert(n > 0 && n <= 200);
    for (int i = 0; i < n; i++) {
        uint64_t t0 = kvh_now_ns();
        KVH_OK(obs, kvnode_ping(obs));
        ms[i] = (double)(kvh_now_ns() - t0) / 1e6;
        kvh_sleep_ms(gap_ms);
    }
    qsort(ms, (size_t)n, sizeof ms[0], pings_cmp_double);
    double p90 = ms[(n * 9) / 10], worst = ms[n - 1];
    if (getenv("PING_DEBUG"))
        fprintf(stderr, "pings %s: p50 %.2f ms, p90 %.2f ms, max %.2f ms\n", when, ms[n / 2], p90,
                worst);
    ck_assert_msg(p90 < PINGS_P90_MS * scale, "pings %s: 90th percentile %.1f ms", when, p90);
    ck_assert_msg(worst < PINGS_MAX_MS * scale, "pings %s: one took %.1f ms", when, worst);
}

#endif
