/* liveness: see liveness.h. */
#include "core/liveness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct liveness_entry {
    bool used;                          /* under liveness_lock */
    char name[LIVENESS_NAME_MAX];       /* under liveness_lock */
    _Atomic uint64_t last_ms;           /* written by the worker, read by anyone */
};

static pthread_mutex_t liveness_lock = PTHREAD_MUTEX_INITIALIZER;
static struct liveness_entry entries[LIVENESS_MAX];

uint64_t liveness_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

struct liveness_entry *liveness_register(const char *name)
{
    struct liveness_entry *w = NULL;

    if (!name || !*name)
        return NULL;
    pthread_mutex_lock(&liveness_lock);
    for (size_t i = 0; i < LIVENESS_MAX; i++) {
        if (!entries[i].used) {
            w = &entries[i];
            w->used = true;
            snprintf(w->name, sizeof w->name, "%s", name);
            atomic_store(&w->last_ms, liveness_now_ms());
            break;
        }
    }
    pthread_mutex_unlock(&liveness_lock);
    return w;
}

void liveness_heartbeat(struct liveness_entry *w)
{
    if (w)
        atomic_store(&w->last_ms, liveness_now_ms());
}

void liveness_unregister(struct liveness_entry *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&liveness_lock);
    w->used = false;
    w->name[0] = '\0';
    pthread_mutex_unlock(&liveness_lock);
}

static uint64_t liveness_age(struct liveness_entry *w, uint64_t now_ms)
{
    uint64_t last = atomic_load(&w->last_ms);
    return now_ms > last ? now_ms - last : 0;
}

bool liveness_check(uint64_t now_ms, uint64_t max_age_ms, char *stalled, size_t len)
{
    bool all = true;
    size_t off = 0;

    if (stalled && len)
        stalled[0] = '\0';
    pthread_mutex_lock(&liveness_lock);
    for (size_t i = 0; i < LIVENESS_MAX; i++) {
        struct liveness_entry *w = &entries[i];
        if (!w->used || liveness_age(w, now_ms) <= max_age_ms)
            continue;
        all = false;
        if (stalled && off + 1 < len) {
            int n = snprintf(stalled + off, len - off, "%s%s", off ? ", " : "", w->name);
            off = n < 0 ? len : off + (size_t)n;
            if (off >= len)
                off = len - 1;   /* cut: snprintf kept it terminated */
        }
    }
    pthread_mutex_unlock(&liveness_lock);
    return all;
}

size_t liveness_snapshot(uint64_t now_ms, struct liveness_info *out, size_t max)
{
    size_t n = 0;

    pthread_mutex_lock(&liveness_lock);
    for (size_t i = 0; i < LIVENESS_MAX; i++) {
        struct liveness_entry *w = &entries[i];
        if (!w->used)
            continue;
        if (out && n < max) {
            memcpy(out[n].name, w->name, sizeof out[n].name);
            out[n].age_ms = liveness_age(w, now_ms);
        }
        n++;
    }
    pthread_mutex_unlock(&liveness_lock);
    return n;
}
