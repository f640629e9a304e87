/* workq: see workq.h.
 *
 * Locks: `lock` guards the job queue, running count, the stopping flag and
 * the startup handshake; `done_lock` guards the completed list. Neither is
 * held while run() or done() executes, and no path takes both at once.
 * Counters that only the loop thread touches (pending, *_total, closing)
 * have no lock. */
#include "core/workq.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/clock.h"
#include "kvnode.h"
#include "core/liveness.h"

struct workq_thread {
    struct workq *q;
    unsigned      index;
    pthread_t     tid;
    struct liveness_entry *w;            /* registered by workq_create, unregistered by the thread */
    char          name[LIVENESS_NAME_MAX];
    struct workq_job *taken_head, *taken_tail;   /* workq_take_more during this run() */
    size_t        ntaken;
};

/* The worker thread's own record (NULL on other threads): workq_take_more. */
static __thread struct workq_thread *self_thread;

struct workq {
    struct event_base *loop;
    struct event      *ev;
    int                efd;
    unsigned           nthreads;
    size_t             capacity;
    struct workq_thread_hooks hooks;
    struct workq_thread *threads;
    unsigned           nstarted;       /* threads created (loop thread only) */

    pthread_mutex_t    lock;
    pthread_cond_t     cond;           /* workers: a job or stop; creator: startup */
    struct workq_job  *head, *tail;    /* queued, FIFO (lock) */
    size_t             queued;         /* (lock) */
    size_t             running;        /* (lock) */
    bool               stopping;       /* (lock) */
    unsigned           ready;          /* threads past init (lock) */
    unsigned           failed;         /* threads whose startup failed (lock) */
    int                fail_rc;        /* (lock) */
    char               fail_msg[128];  /* (lock) */

    pthread_mutex_t    done_lock;
    struct workq_job  *done_head, *done_tail;   /* finished, FIFO (done_lock) */
    size_t             finished;       /* on that list (done_lock) */

    /* loop thread only */
    bool               closing;
    size_t             pending;
    uint64_t           submitted_total, completed_total, cancelled_total, dropped_total;
};

static void set_err(char *err, size_t errlen, const char *fmt, const char *a, const char *b)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, a, b);
}

/* --- worker side ------------------------------------------------------------ */

static void startup_report(struct workq *q, int rc, const char *msg, const char *name)
{
    pthread_mutex_lock(&q->lock);
    if (rc == 0) {
        q->ready++;
    } else {
        if (q->failed++ == 0) {
            q->fail_rc = rc;
            snprintf(q->fail_msg, sizeof q->fail_msg, "%s: %s", name, msg);
        }
    }
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

static void deadline_in(struct timespec *ts, unsigned ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000u;
    ts->tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void complete(struct workq *q, struct workq_job *job)
{
    bool was_empty;

    job->wq_next = NULL;
    pthread_mutex_lock(&q->done_lock);
    was_empty = q->done_head == NULL;
    if (q->done_tail)
        q->done_tail->wq_next = job;
    else
        q->done_head = job;
    q->done_tail = job;
    q->finished++;
    pthread_mutex_unlock(&q->done_lock);
    /* The loop resets the eventfd only when it leaves the list empty (see
     * process_completions), so a wakeup is needed only when the list was
     * empty. A full counter (EAGAIN) already means a wakeup is due. */
    if (was_empty) {
        uint64_t one = 1;
        ssize_t n;
        do
            n = write(q->efd, &one, sizeof one);
        while (n < 0 && errno == EINTR);
    }
}

static void *worker_main(void *arg)
{
    struct workq_thread *t = arg;
    struct workq *q = t->q;
    struct liveness_entry *w = t->w;
    void *ctx = NULL;
    char tname[16];

    size_t tlen = strnlen(t->name, sizeof tname - 1);   /* the kernel keeps 15 bytes */
    memcpy(tname, t->name, tlen);
    tname[tlen] = '\0';
    pthread_setname_np(pthread_self(), tname);
    self_thread = t;

    if (q->hooks.init) {
        int rc = q->hooks.init(q->hooks.arg, t->index, &ctx);
        if (rc != 0) {
            liveness_unregister(w);
            startup_report(q, rc < 0 ? rc : -KVNODE_EINTERNAL, "init hook failed", t->name);
            return NULL;
        }
    }
    liveness_heartbeat(w);
    startup_report(q, 0, NULL, NULL);

    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->stopping && !q->head) {
            struct timespec ts;
            deadline_in(&ts, WORKQ_IDLE_BEAT_MS);
            pthread_cond_timedwait(&q->cond, &q->lock, &ts);
            liveness_heartbeat(w);
        }
        if (q->stopping)
            break;   /* workq_destroy took the queued jobs */
        struct workq_job *job = q->head;
        q->head = job->wq_next;
        if (!q->head)
            q->tail = NULL;
        q->queued--;
        q->running++;
        pthread_mutex_unlock(&q->lock);

        liveness_heartbeat(w);
        job->run(job, ctx);
        liveness_heartbeat(w);

        struct workq_job *taken = t->taken_head;
        size_t ntaken = t->ntaken;
        t->taken_head = t->taken_tail = NULL;
        t->ntaken = 0;
        pthread_mutex_lock(&q->lock);
        q->running -= 1 + ntaken;
        pthread_mutex_unlock(&q->lock);
        complete(q, job);
        while (taken) {
            struct workq_job *next = taken->wq_next;
            complete(q, taken);
            taken = next;
        }
        pthread_mutex_lock(&q->lock);
    }
    pthread_mutex_unlock(&q->lock);

    if (q->hooks.fini)
        q->hooks.fini(q->hooks.arg, ctx);
    liveness_unregister(w);
    return NULL;
}

size_t workq_take_more(struct workq_job *first,
                       bool (*accept)(const struct workq_job *first,
                                      const struct workq_job *candidate, void *arg),
                       void *arg, struct workq_job **out, size_t max)
{
    struct workq_thread *t = self_thread;
    size_t n = 0;

    if (!t || !first || !accept)
        return 0;
    struct workq *q = t->q;
    pthread_mutex_lock(&q->lock);
    while (n < max && q->head && !q->stopping && accept(first, q->head, arg)) {
        struct workq_job *job = q->head;
        q->head = job->wq_next;
        if (!q->head)
            q->tail = NULL;
        q->queued--;
        q->running++;
        job->wq_next = NULL;
        if (t->taken_tail)
            t->taken_tail->wq_next = job;
        else
            t->taken_head = job;
        t->taken_tail = job;
        t->ntaken++;
        out[n++] = job;
    }
    pthread_mutex_unlock(&q->lock);
    return n;
}

/* --- loop side -------------------------------------------------------------- */

/* Call done() for up to max finished jobs (max 0: all there are now).
 *
 * The eventfd is level-triggered: it is reset (read) only when the list is
 * left empty, under done_lock; a worker signals it whenever it makes the
 * list non-empty. So whenever finished jobs wait, the fd is (or is about to
 * be) readable, and a callback that leaves some behind runs again on the
 * next loop iteration, after the loop has polled its other events. */
static void process_completions(struct workq *q, size_t max)
{
    struct workq_job *batch, *last = NULL, *job;
    size_t n = 0;

    pthread_mutex_lock(&q->done_lock);
    batch = q->done_head;
    for (job = batch; job && (max == 0 || n < max); job = job->wq_next) {
        last = job;
        n++;
    }
    if (last) {
        q->done_head = last->wq_next;
        if (!q->done_head)
            q->done_tail = NULL;
        last->wq_next = NULL;
        q->finished -= n;
    }
    if (!q->done_head) {
        uint64_t cnt;
        while (read(q->efd, &cnt, sizeof cnt) < 0 && errno == EINTR) {}
    }
    pthread_mutex_unlock(&q->done_lock);

    while (n--) {
        job = batch;
        batch = job->wq_next;
        job->wq_next = NULL;
        job->cancelled = false;
        q->pending--;
        q->completed_total++;
        job->done(job);      /* may free job */
    }
}

static void completion_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    process_completions(arg, WORKQ_DONE_BATCH);
}

/* Stop and join every started thread (loop thread; blocks for running jobs). */
static void stop_threads(struct workq *q)
{
    pthread_mutex_lock(&q->lock);
    q->stopping = true;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    for (unsigned i = 0; i < q->nstarted; i++)
        pthread_join(q->threads[i].tid, NULL);
    q->nstarted = 0;
}

static void free_queue(struct workq *q)
{
    if (q->ev)
        event_free(q->ev);
    if (q->efd >= 0)
        close(q->efd);
    pthread_mutex_destroy(&q->done_lock);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cond);
    free(q->threads);
    free(q);
}

int workq_create(struct event_base *loop, const char *name, unsigned nthreads, size_t capacity,
                 struct workq **out, char *err, size_t errlen)
{
    return workq_create_hooks(loop, name, nthreads, capacity, NULL, out, err, errlen);
}

int workq_create_hooks(struct event_base *loop, const char *name, unsigned nthreads,
                       size_t capacity, const struct workq_thread_hooks *hooks,
                       struct workq **out, char *err, size_t errlen)
{
    struct workq *q;
    pthread_condattr_t ca;
    sigset_t all, old;
    int rc;

    if (out)
        *out = NULL;
    if (!loop || !name || !*name || !out || nthreads == 0 || nthreads > WORKQ_MAX_THREADS
        || capacity == 0) {
        set_err(err, errlen, "workq %s: invalid arguments%s", name && *name ? name : "?",
                nthreads > WORKQ_MAX_THREADS ? " (too many threads)" : "");
        return -KVNODE_EINVAL;
    }
    q = calloc(1, sizeof *q);
    if (!q || !(q->threads = calloc(nthreads, sizeof *q->threads))) {
        free(q);
        set_err(err, errlen, "workq %s: %s", name, "out of memory");
        return -KVNODE_ENOMEM;
    }
    q->loop = loop;
    q->nthreads = nthreads;
    q->capacity = capacity;
    q->efd = -1;
    if (hooks)
        q->hooks = *hooks;
    pthread_mutex_init(&q->lock, NULL);
    pthread_mutex_init(&q->done_lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cond, &ca);
    pthread_condattr_destroy(&ca);

    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        set_err(err, errlen, "workq %s: eventfd: %s", name, strerror(errno));
        free_queue(q);
        return -KVNODE_EIO;
    }
    q->ev = event_new(loop, q->efd, EV_READ | EV_PERSIST, completion_cb, q);
    if (!q->ev || event_add(q->ev, NULL) < 0) {
        set_err(err, errlen, "workq %s: %s", name, "cannot watch the completion eventfd");
        free_queue(q);
        return -KVNODE_EIO;
    }

    /* Workers inherit a full signal mask: signals are the loop's. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = 0;
    for (unsigned i = 0; i < nthreads; i++) {
        struct workq_thread *t = &q->threads[i];
        t->q = q;
        t->index = i;
        snprintf(t->name, sizeof t->name, "%s-%u", name, i);
        /* Registered here, in index order, so the registry lists them so. */
        t->w = liveness_register(t->name);
        if (!t->w) {
            set_err(err, errlen, "workq %s: %s", name, "the worker liveness registry is full");
            rc = -KVNODE_ELIMIT;
            break;
        }
        int e = pthread_create(&t->tid, NULL, worker_main, t);
        if (e != 0) {
            liveness_unregister(t->w);
            set_err(err, errlen, "workq %s: cannot start a thread: %s", name, strerror(e));
            rc = -KVNODE_ENOMEM;
            break;
        }
        q->nstarted++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    /* Wait until every started thread has run init. */
    pthread_mutex_lock(&q->lock);
    while (q->ready + q->failed < q->nstarted)
        pthread_cond_wait(&q->cond, &q->lock);
    if (rc == 0 && q->failed) {
        rc = q->fail_rc;
        set_err(err, errlen, "workq %s: %s", name, q->fail_msg);
    }
    pthread_mutex_unlock(&q->lock);

    if (rc != 0) {
        stop_threads(q);
        free_queue(q);
        return rc;
    }
    *out = q;
    return 0;
}

int workq_submit(struct workq *q, struct workq_job *job)
{
    if (!q || !job || !job->run || !job->done)
        return -KVNODE_EINVAL;
    if (q->closing)
        return -KVNODE_ESHUTDOWN;
    if (q->pending >= q->capacity) {
        q->dropped_total++;
        return -KVNODE_ELIMIT;
    }
    job->cancelled = false;
    job->wq_next = NULL;
    q->pending++;
    q->submitted_total++;

    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->wq_next = job;
    else
        q->head = job;
    q->tail = job;
    q->queued++;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

size_t workq_pending(const struct workq *q)
{
    return q ? q->pending : 0;
}

void workq_stats(struct workq *q, struct workq_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!q)
        return;
    pthread_mutex_lock(&q->lock);
    out->queued = q->queued;
    out->running = q->running;
    pthread_mutex_unlock(&q->lock);
    pthread_mutex_lock(&q->done_lock);
    out->finished = q->finished;
    pthread_mutex_unlock(&q->done_lock);
    out->pending = q->pending;
    out->submitted_total = q->submitted_total;
    out->completed_total = q->completed_total;
    out->cancelled_total = q->cancelled_total;
    out->dropped_total = q->dropped_total;
    out->threads = q->nthreads;
}

int workq_drain(struct workq *q, unsigned timeout_ms)
{
    uint64_t deadline = clock_now_ms() + timeout_ms;

    if (!q)
        return 0;
    for (;;) {
        process_completions(q, 0);
        if (q->pending == 0)
            return 0;
        uint64_t now = clock_now_ms();
        if (now >= deadline)
            return -KVNODE_ETIMEDOUT;
        uint64_t left = deadline - now;
        struct pollfd pfd = { .fd = q->efd, .events = POLLIN };
        (void)poll(&pfd, 1, left > 1000 ? 1000 : (int)left);
    }
}

void workq_destroy(struct workq *q)
{
    struct workq_job *cancelled, *job;

    if (!q)
        return;
    q->closing = true;

    /* Take the queued jobs, then stop the workers (running jobs finish). */
    pthread_mutex_lock(&q->lock);
    cancelled = q->head;
    q->head = q->tail = NULL;
    q->queued = 0;
    pthread_mutex_unlock(&q->lock);
    stop_threads(q);

    /* Everything that ran is on the completed list now. */
    process_completions(q, 0);
    while ((job = cancelled)) {
        cancelled = job->wq_next;
        job->wq_next = NULL;
        job->cancelled = true;
        q->pending--;
        q->cancelled_total++;
        job->done(job);
    }
    free_queue(q);
}
