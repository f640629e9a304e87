/* kvcm_events: the loop side of the KVCM publisher (see kvcm_events.h):
 * completeness events and deployments seen from the caches, the resync
 * walk the publisher asks for, the node status the heartbeat reports. */
#include "kvcm/kvcm_events.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "cache/cache.h"
#include "core/log.h"

struct kvcm_events {
    struct kvcm_shared *s;
    struct cache *caches[KVCM_MAX_CACHES];    /* one per tenant; walked one after another */
    size_t ncaches;
    struct event *efd_ev, *status_ev;
    kvcm_status_fn status_fn;
    void *status_arg;
    /* the walk in progress */
    struct cache_walk *walk;
    size_t walk_cache;                        /* caches[walk_cache] is being walked */
    struct kvcm_ev *walk_buf;
    size_t walk_len, walk_cap;
    bool walk_oom;
};

/* The caches' observers (cache_set_block_observer): a key's completeness
 * and medium (enum cache_medium), and a deployment whose TP group connected. */
static void kvcm_events_block(void *arg, const struct kv_namespace *ns, int64_t key, int medium)
{
    struct kvcm_events *e = arg;
    kvcm_shared_block(e->s, ns, key, medium);
}

static void kvcm_events_deployment(void *arg, const struct kv_namespace *ns)
{
    struct kvcm_events *e = arg;
    kvcm_shared_deployment(e->s, ns);
}

static void kvcm_walk_found(void *arg, const struct kv_namespace *ns, int64_t key, int medium)
{
    struct kvcm_events *e = arg;
    if (e->walk_len == e->walk_cap) {
        size_t cap = e->walk_cap ? e->walk_cap * 2 : 4096;
        struct kvcm_ev *b = realloc(e->walk_buf, cap * sizeof *b);
        if (!b) {
            e->walk_oom = true;   /* this walk is incomplete: walk again */
            return;
        }
        e->walk_buf = b;
        e->walk_cap = cap;
    }
    int dep = kvcm_shared_dep_of(e->s, ns);
    if (dep < 0)
        return;
    e->walk_buf[e->walk_len++] = (struct kvcm_ev){
        .dep = (uint32_t)dep, .kind = EV_BLOCK, .key = key,
        .medium = medium == MED_HBM ? MED_HBM : MED_DRAM,
    };
}

static void kvcm_walk_done(void *arg)
{
    struct kvcm_events *e = arg;
    e->walk = NULL;
    /* The next tenant's cache, until every one was walked. */
    while (!e->walk_oom && ++e->walk_cache < e->ncaches) {
        if (cache_walk_complete(e->caches[e->walk_cache], kvcm_walk_found, kvcm_walk_done, e,
                                &e->walk) == 0)
            return;
        log_error("kvcm: cannot start a walk of the index: out of memory");
        e->walk_oom = true;
    }
    e->walk_cache = 0;
    bool again = kvcm_shared_walk_end(e->s, e->walk_buf, e->walk_len, e->walk_oom);
    e->walk_oom = false;
    e->walk_buf = NULL;
    e->walk_len = e->walk_cap = 0;
    if (again)
        event_active(e->efd_ev, EV_READ, 0);
}

/* The publisher asked for the truth: mark the queue, walk the index. */
static void kvcm_efd_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kvcm_events *e = arg;
    uint64_t v;
    (void)what;
    if (read(fd, &v, sizeof v) < 0 && errno != EAGAIN)
        log_warn("kvcm: reading the walk request: %s", strerror(errno));
    bool wanted = kvcm_shared_walk_begin(e->s, e->walk != NULL);
    e->walk_cache = 0;
    if (wanted && e->ncaches == 0) {
        kvcm_walk_done(e);
        return;
    }
    if (wanted && cache_walk_complete(e->caches[0], kvcm_walk_found, kvcm_walk_done, e, &e->walk) < 0) {
        log_error("kvcm: cannot start a walk of the index: out of memory");
        e->walk_oom = true;
        kvcm_walk_done(e);
    }
}

/* Refresh the node status the heartbeat reports (a timer; also at start). */
static void kvcm_status_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kvcm_events *e = arg;
    struct kvcm_node_status st = { 0 };
    (void)fd;
    (void)what;
    if (e->status_fn)
        e->status_fn(e->status_arg, &st);
    kvcm_shared_node(e->s, &st);
}

int kvcm_events_create(struct event_base *base, struct kvcm_shared *s, struct cache *const *caches,
                       size_t n, uint32_t interval_ms, kvcm_status_fn status, void *status_arg,
                       struct kvcm_events **out)
{
    struct kvcm_events *e = calloc(1, sizeof *e);
    struct timeval tv;

    *out = NULL;
    if (!e || n > KVCM_MAX_CACHES) {
        free(e);
        return -1;
    }
    e->s = s;
    memcpy(e->caches, caches, n * sizeof *caches);
    e->ncaches = n;
    e->status_fn = status;
    e->status_arg = status_arg;
    e->efd_ev = event_new(base, kvcm_shared_walk_fd(s), EV_READ | EV_PERSIST, kvcm_efd_cb, e);
    e->status_ev = event_new(base, -1, EV_PERSIST, kvcm_status_cb, e);
    if (!e->efd_ev || !e->status_ev || event_add(e->efd_ev, NULL) < 0) {
        kvcm_events_destroy(e);
        return -1;
    }
    tv.tv_sec = (time_t)(interval_ms / 1000u);
    tv.tv_usec = (suseconds_t)((interval_ms % 1000u) * 1000u);
    evtimer_add(e->status_ev, &tv);
    kvcm_status_cb(-1, 0, e);
    *out = e;
    return 0;
}

void kvcm_events_attach(struct kvcm_events *e)
{
    for (size_t i = 0; i < e->ncaches; i++)
        cache_set_block_observer(e->caches[i], kvcm_events_block, kvcm_events_deployment, e);
}

void kvcm_events_detach(struct kvcm_events *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->ncaches; i++)
        cache_set_block_observer(e->caches[i], NULL, NULL, NULL);
    if (e->walk) {
        cache_walk_cancel(e->caches[e->walk_cache], e->walk);
        e->walk = NULL;
    }
}

void kvcm_events_destroy(struct kvcm_events *e)
{
    if (!e)
        return;
    kvcm_events_detach(e);
    if (e->efd_ev)
        event_free(e->efd_ev);
    if (e->status_ev)
        event_free(e->status_ev);
    free(e->walk_buf);
    free(e);
}
