/* liveness: see liveness.h. */
#include "core/liveness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct worker {
    bool used;                          /* under workers_lock */
    char name[WORKER_NAME_MAX];         /* under workers_lock */
    _Atomic uint64_t last_ms;           /* written by the worker, read by anyone */
};

static pthread_mutex_t workers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct worker workers[WORKERS_MAX];

uint64_t workers_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

struct worker *worker_register(const char *name)
{
    struct worker *w = NULL;

    if (!name || !*name)
        return NULL;
    pthread_mutex_lock(&workers_lock);
    for (size_t i = 0; i < WORKERS_MAX; i++) {
        if (!workers[i].used) {
            w = &workers[i];
            w->used = true;
            snprintf(w->name, sizeof w->name, "%s", name);
            atomic_store(&w->last_ms, workers_now_ms());
            break;
        }
    }
    pthread_mutex_unlock(&workers_lock);
    return w;
}

void worker_heartbeat(struct worker *w)
{
    if (w)
        atomic_store(&w->last_ms, workers_now_ms());
}

void worker_unregister(struct worker *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&workers_lock);
    w->used = false;
    w->name[0] = '\0';
    pthread_mutex_unlock(&workers_lock);
}

static uint64_t worker_age(struct worker *w, uint64_t now_ms)
{
    uint64_t last = atomic_load(&w->last_ms);
    return now_ms > last ? now_ms - last : 0;
}

bool workers_check(uint64_t now_ms, uint64_t max_age_ms, char *stalled, size_t len)
{
    bool all = true;
    size_t off = 0;

    if (stalled && len)
        stalled[0] = '\0';
    pthread_mutex_lock(&workers_lock);
    for (size_t i = 0; i < WORKERS_MAX; i++) {
        struct worker *w = &workers[i];
        if (!w->used || worker_age(w, now_ms) <= max_age_ms)
            continue;
        all = false;
        if (stalled && off + 1 < len) {
            int n = snprintf(stalled + off, len - off, "%s%s", off ? ", " : "", w->name);
            off = n < 0 ? len : off + (size_t)n;
            if (off >= len)
                off = len - 1;   /* cut: snprintf kept it terminated */
        }
    }
    pthread_mutex_unlock(&workers_lock);
    return all;
}

size_t workers_snapshot(uint64_t now_ms, struct worker_info *out, size_t max)
{
    size_t n = 0;

    pthread_mutex_lock(&workers_lock);
    for (size_t i = 0; i < WORKERS_MAX; i++) {
        struct worker *w = &workers[i];
        if (!w->used)
            continue;
        if (out && n < max) {
            memcpy(out[n].name, w->name, sizeof out[n].name);
            out[n].age_ms = worker_age(w, now_ms);
        }
        n++;
    }
    pthread_mutex_unlock(&workers_lock);
    return n;
}
