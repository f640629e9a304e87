/* cache deferred: answers that wait for the store — a MATCH or GET's wait
 * (moved to the heap, its timer, progress, the answer, cancel) and the puts
 * waiting for room that blocks being written hold (back-pressure; see
 * cache.h). Loop thread only. */
#include "cache/cache_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "kvnode.h"
#include "core/log.h"

/* --- deferred answers: moved to the heap, timed, answered, freed --------------- */

static void cache_wait_timeout_cb(evutil_socket_t fd, short what, void *arg);
static void cache_wait_answer(struct cache_wait *w);
static void cache_put_waiter_unlink(struct cache *c, struct cache_wait *w);

/* Move a wait built on the stack to the heap before anything refers to it. */
struct cache_wait *cache_wait_heap(struct cache_wait *w)
{
    struct cache_wait *h;
    int64_t *keys;
    uint64_t *checks = NULL;

    if (w->on_heap)
        return w;
    h = malloc(sizeof *h);
    keys = malloc((w->n ? w->n : 1) * sizeof *keys);
    if (w->checks)
        checks = malloc((w->n ? w->n : 1) * sizeof *checks);
    if (!h || !keys || (w->checks && !checks)) {
        free(h);
        free(keys);
        free(checks);
        return NULL;
    }
    memcpy(keys, w->keys, w->n * sizeof *keys);
    if (checks)
        memcpy(checks, w->checks, w->n * sizeof *checks);
    *h = *w;
    h->keys = keys;
    h->checks = checks;
    h->on_heap = true;
    h->ns->refs++;   /* a cancelled wait may outlive its requester's binding */
    if (h->l)
        h->l->waiter = h;
    return h;
}

/* Start the timer of a wait that goes on after its start call. Without one
 * (out of memory) it answers when the store's own timeouts end its requests. */
void cache_wait_arm(struct cache *c, struct cache_wait *w)
{
    struct timeval tv;
    w->timer = evtimer_new(c->base, cache_wait_timeout_cb, w);
    c->waits++;
    if (!w->timer) {
        log_warn("cannot arm a deferred answer's timer: it waits for the store's timeouts");
        return;
    }
    tv = clock_tv_ms(c->request_timeout_ms);
    evtimer_add(w->timer, &tv);
}

static void cache_wait_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache_wait *w = arg;
    (void)fd;
    (void)what;
    w->c->wait_timeouts++;
    log_debug("a %s waited %u ms for the store; answering with what is ready",
              w->kind == WAIT_GET ? "get" : "match", w->c->request_timeout_ms);
    cache_wait_answer(w);
}

/* A store request of w's came back. */
void cache_wait_progress(struct cache_wait *w)
{
    if (w->outstanding > 0)
        w->outstanding--;
    if (w->outstanding > 0)
        return;
    if (w->finished)
        cache_wait_free(w);
    else
        cache_wait_answer(w);
}

/* Answer once (the store is back, or the time is up): ready() unless the
 * requester went away. */
static void cache_wait_answer(struct cache_wait *w)
{
    if (w->answered)
        return;
    w->answered = true;
    if (w->timer)
        evtimer_del(w->timer);
    if (!w->finished)
        w->ready(w->arg);
}

void cache_wait_cancel(struct cache *c, struct cache_wait *w)
{
    if (!w)
        return;
    if (w->kind == WAIT_PUT)
        cache_put_waiter_unlink(c, w);
    w->finished = true;
    if (w->timer)
        evtimer_del(w->timer);
    if (w->l) {
        w->l->waiter = NULL;
        w->l = NULL;
    }
    if (w->outstanding == 0)
        cache_wait_free(w);
}

void cache_wait_free(struct cache_wait *w)
{
    if (w->on_heap && w->ns)
        w->ns->refs--;
    if (w->timer)
        event_free(w->timer);
    free((void *)w->keys);
    free((void *)w->checks);
    free(w);
}

/* --- puts waiting for the store (back-pressure) ------------------------------ */

static void cache_put_waiter_unlink(struct cache *c, struct cache_wait *w)
{
    if (!w->put_prev && c->put_waiters != w)
        return;   /* not linked (woken already) */
    if (w->put_prev)
        w->put_prev->put_next = w->put_next;
    else
        c->put_waiters = w->put_next;
    if (w->put_next)
        w->put_next->put_prev = w->put_prev;
    else
        c->put_waiters_tail = w->put_prev;
    w->put_prev = w->put_next = NULL;
}

static void cache_put_wait_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache_wait *w = arg;
    (void)fd;
    (void)what;
    w->c->put_wait_timeouts++;
    cache_put_waiter_unlink(w->c, w);
    cache_wait_answer(w);
}

int cache_put_wait(struct cache *c, unsigned timeout_ms, cache_ready_fn ready, void *arg,
                   struct cache_wait **wait)
{
    struct cache_wait *w = calloc(1, sizeof *w);
    struct timeval tv = clock_tv_ms(timeout_ms);

    *wait = NULL;
    if (!w)
        return -KVNODE_ENOMEM;
    w->timer = evtimer_new(c->base, cache_put_wait_timeout_cb, w);
    if (!w->timer) {
        free(w);
        return -KVNODE_ENOMEM;
    }
    w->c = c;
    w->kind = WAIT_PUT;
    w->on_heap = true;
    w->ready = ready;
    w->arg = arg;
    w->put_prev = c->put_waiters_tail;
    if (c->put_waiters_tail)
        c->put_waiters_tail->put_next = w;
    else
        c->put_waiters = w;
    c->put_waiters_tail = w;
    evtimer_add(w->timer, &tv);
    c->put_waits++;
    *wait = w;
    return 0;
}

/* Store ops finished: blocks they pinned may be evictable now, so every put
 * waiting for room tries again (those that arrive meanwhile wait for the
 * next one). */
void cache_put_wake_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    struct cache_wait *last = c->put_waiters_tail;
    (void)fd;
    (void)what;
    while (c->put_waiters) {
        struct cache_wait *w = c->put_waiters;
        bool was_last = w == last;   /* w may be freed by its answer */
        cache_put_waiter_unlink(c, w);
        cache_wait_answer(w);
        if (was_last)
            break;
    }
}
