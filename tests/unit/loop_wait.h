/* loop_wait: running a test's libevent loop until workers' results are in,
 * with a deadline (a 10 ms tick keeps EVLOOP_ONCE from blocking past it). */
#ifndef KVNODE_TEST_LOOP_WAIT_H
#define KVNODE_TEST_LOOP_WAIT_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <event2/event.h>

#include "core/clock.h"

static inline void test_sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0) {}
}

static void loop_wait_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what; (void)arg;
}

/* Run the loop while cond(arg) holds, for at most timeout_ms. */
static inline void loop_while(struct event_base *base, bool (*cond)(void *), void *arg,
                              unsigned timeout_ms)
{
    struct timeval tv = { 0, 10000 };
    struct event *tick = event_new(base, -1, EV_PERSIST, loop_wait_tick, NULL);
    uint64_t deadline = clock_now_ms() + timeout_ms;

    ck_assert_ptr_nonnull(tick);
    event_add(tick, &tv);
    while (cond(arg) && clock_now_ms() < deadline)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(tick);
}

struct loop_wait_count {
    const size_t *count;
    size_t want;
};

static inline bool loop_wait_short(void *arg)
{
    const struct loop_wait_count *w = arg;
    return *w->count < w->want;
}

/* Run the loop until *count reaches want or timeout_ms passes. */
static inline void loop_until(struct event_base *base, const size_t *count, size_t want,
                              unsigned timeout_ms)
{
    struct loop_wait_count w = { count, want };
    loop_while(base, loop_wait_short, &w, timeout_ms);
}

#endif
