/* clock: the monotonic millisecond clock every timeout and TTL is measured on. */
#ifndef KVNODE_CLOCK_H
#define KVNODE_CLOCK_H

#include <errno.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>

static inline uint64_t clock_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline uint64_t clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t clock_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A duration in milliseconds as the timeval libevent's timers take. */
static inline struct timeval clock_tv_ms(uint64_t ms)
{
    struct timeval tv = { (time_t)(ms / 1000u), (suseconds_t)((ms % 1000u) * 1000u) };
    return tv;
}

/* Sleep ms milliseconds on the calling thread (never the loop), the whole
 * time even when a signal interrupts it. */
static inline void clock_sleep_ms(uint64_t ms)
{
    struct timespec ts = { (time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

#endif
