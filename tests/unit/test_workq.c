/* Unit tests for daemon/core/workq.c: the bounded worker pool, with real threads
 * and a real event_base driven by the test's thread (the "loop thread").
 * Every test destroys its queue, so the liveness registry (core/liveness.h) is
 * empty between tests even with CK_FORK=no (helgrind). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "core/clock.h"
#include "kvnode.h"
#include "loop_wait.h"
#include "core/liveness.h"
#include "core/workq.h"

static struct workq *make_q(struct event_base *base, const char *name, unsigned n, size_t cap)
{
    struct workq *q = NULL;
    char err[256] = "";
    int rc = workq_create(base, name, n, cap, &q, err, sizeof err);
    ck_assert_msg(rc == 0, "workq_create: %d %s", rc, err);
    ck_assert_ptr_nonnull(q);
    return q;
}

/* A job that records where it ran and where it completed. */
struct tjob {
    struct workq_job  job;           /* first: container_of by cast */
    int               id;
    unsigned          sleep_ms;
    pthread_t         run_thread;    /* written in run, read in done */
    char              run_name[16];
    void             *ctx;
    _Atomic int       runs;
    _Atomic int       running;       /* set when run() starts */
    int               dones;         /* loop thread only */
    bool              cancelled;
    pthread_t         done_thread;
};

static size_t  g_done;              /* loop thread only */
static int     g_done_order[2048];
static int     g_run_order[2048];
static _Atomic size_t g_run_idx;
static struct event_base *g_break_base;
static size_t  g_break_at;

static void tjob_run(struct workq_job *j, void *ctx)
{
    struct tjob *t = (struct tjob *)j;
    atomic_store(&t->running, 1);
    t->run_thread = pthread_self();
    pthread_getname_np(pthread_self(), t->run_name, sizeof t->run_name);
    t->ctx = ctx;
    if (t->sleep_ms)
        test_sleep_ms(t->sleep_ms);
    size_t i = atomic_fetch_add(&g_run_idx, 1);
    if (i < 2048)
        g_run_order[i] = t->id;
    atomic_fetch_add(&t->runs, 1);
}

static void tjob_done(struct workq_job *j)
{
    struct tjob *t = (struct tjob *)j;
    t->done_thread = pthread_self();
    t->cancelled = j->cancelled;
    t->dones++;
    if (g_done < 2048)
        g_done_order[g_done] = t->id;
    g_done++;
    if (g_break_base && g_done == g_break_at)
        event_base_loopbreak(g_break_base);
}

static void tjob_init(struct tjob *t, int id, unsigned sleep)
{
    memset(t, 0, sizeof *t);
    t->job.run = tjob_run;
    t->job.done = tjob_done;
    t->id = id;
    t->sleep_ms = sleep;
}

static void reset_globals(void)
{
    g_done = 0;
    atomic_store(&g_run_idx, 0);
    g_break_base = NULL;
    g_break_at = 0;
}

START_TEST(test_args)
{
    struct event_base *base = event_base_new();
    struct workq *q = (struct workq *)1;
    char err[256];

    ck_assert_int_eq(workq_create(base, "x", 0, 4, &q, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_ptr_null(q);
    ck_assert_int_eq(workq_create(base, "x", 1, 0, &q, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_int_eq(workq_create(base, "", 1, 4, &q, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_int_eq(workq_create(NULL, "x", 1, 4, &q, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_int_eq(workq_create(base, "x", WORKQ_MAX_THREADS + 1, 4, &q, err, sizeof err),
                     -KVNODE_EINVAL);
    ck_assert(strstr(err, "too many threads"));

    /* Registry full: create fails and gives back the slots it took. */
    struct liveness_entry *fill[LIVENESS_MAX - 1];
    for (size_t i = 0; i < LIVENESS_MAX - 1; i++)
        ck_assert_ptr_nonnull(fill[i] = liveness_register("filler"));
    ck_assert_int_eq(workq_create(base, "full", 2, 4, &q, err, sizeof err), -KVNODE_ELIMIT);
    ck_assert_ptr_null(q);
    ck_assert(strstr(err, "registry is full"));
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), LIVENESS_MAX - 1);
    for (size_t i = 0; i < LIVENESS_MAX - 1; i++)
        liveness_unregister(fill[i]);

    q = make_q(base, "args", 1, 4);
    struct workq_job bad = { 0 };
    ck_assert_int_eq(workq_submit(q, &bad), -KVNODE_EINVAL);
    ck_assert_int_eq(workq_submit(q, NULL), -KVNODE_EINVAL);
    ck_assert_uint_eq(workq_pending(q), 0);
    ck_assert_int_eq(workq_drain(q, 0), 0);       /* nothing pending */
    workq_destroy(q);
    workq_destroy(NULL);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
    event_base_free(base);
}
END_TEST

/* run() on a worker thread named "<name>-<i>", done() on the loop thread,
 * and the eventfd wakes a loop that is blocked with nothing else to do. */
START_TEST(test_threads_and_loop_wakeup)
{
    enum { N = 8 };
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "tq", 2, 16);
    struct tjob jobs[N];
    pthread_t loop_thread = pthread_self();

    reset_globals();
    struct liveness_info wi[8];
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), wi, 8), 2);
    ck_assert_str_eq(wi[0].name, "tq-0");
    ck_assert_str_eq(wi[1].name, "tq-1");

    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], i, 5);
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    ck_assert_uint_eq(workq_pending(q), N);

    /* No timer but a 10 s safety exit: only the eventfd can wake the loop. */
    struct timeval safety = { 10, 0 };
    g_break_base = base;
    g_break_at = N;
    uint64_t t0 = clock_now_ms();
    event_base_loopexit(base, &safety);
    event_base_dispatch(base);
    ck_assert_uint_lt(clock_now_ms() - t0, 5000);
    ck_assert_uint_eq(g_done, N);

    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(atomic_load(&jobs[i].runs), 1);
        ck_assert_int_eq(jobs[i].dones, 1);
        ck_assert(!jobs[i].cancelled);
        ck_assert(!pthread_equal(jobs[i].run_thread, loop_thread));
        ck_assert(pthread_equal(jobs[i].done_thread, loop_thread));
        ck_assert_msg(!strcmp(jobs[i].run_name, "tq-0") || !strcmp(jobs[i].run_name, "tq-1"),
                      "thread name %s", jobs[i].run_name);
        ck_assert_ptr_null(jobs[i].ctx);
    }
    struct workq_stats st;
    workq_stats(q, &st);
    ck_assert_uint_eq(st.queued, 0);
    ck_assert_uint_eq(st.running, 0);
    ck_assert_uint_eq(st.finished, 0);
    ck_assert_uint_eq(st.pending, 0);
    ck_assert_uint_eq(st.submitted_total, N);
    ck_assert_uint_eq(st.completed_total, N);
    ck_assert_uint_eq(st.dropped_total, 0);
    ck_assert_uint_eq(st.cancelled_total, 0);
    ck_assert_uint_eq(st.threads, 2);
    workq_destroy(q);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
    event_base_free(base);
}
END_TEST

START_TEST(test_fifo_single_thread)
{
    enum { N = 200 };
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "fifo", 1, N);
    static struct tjob jobs[N];

    reset_globals();
    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], i, 0);
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    loop_until(base, &g_done, N, 20000);
    ck_assert_uint_eq(g_done, N);
    ck_assert_uint_eq(atomic_load(&g_run_idx), N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(g_run_order[i], i);
        ck_assert_int_eq(g_done_order[i], i);
    }
    workq_destroy(q);
    event_base_free(base);
}
END_TEST

/* ---- workq_take_more: a run() takes the queued jobs behind it ---------------------- */

static _Atomic int g_gate_open;
static size_t g_taken_first, g_taken_second;
static int g_taken_ids[16];

static bool take_below_6(const struct workq_job *first, const struct workq_job *cand, void *arg)
{
    (void)first;
    (*(int *)arg)++;
    return ((const struct tjob *)cand)->id < 6;
}

static void gate_run(struct workq_job *j, void *ctx)
{
    struct workq_job *more[16];
    int asked = 0;
    (void)ctx;
    while (!atomic_load(&g_gate_open))
        test_sleep_ms(1);
    g_taken_first = workq_take_more(j, take_below_6, &asked, more, 3);
    g_taken_second = workq_take_more(j, take_below_6, &asked, more + g_taken_first, 10);
    for (size_t i = 0; i < g_taken_first + g_taken_second; i++)
        g_taken_ids[i] = ((struct tjob *)more[i])->id;
    tjob_run(j, ctx);
}

START_TEST(test_take_more)
{
    enum { N = 10 };
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "take", 1, N);
    static struct tjob jobs[N];
    struct workq_job *out[4];

    reset_globals();
    atomic_store(&g_gate_open, 0);
    /* not on a worker thread: nothing taken */
    tjob_init(&jobs[0], 0, 0);
    ck_assert_uint_eq(workq_take_more(&jobs[0].job, take_below_6, &(int){ 0 }, out, 4), 0);
    jobs[0].job.run = gate_run;
    for (int i = 0; i < N; i++) {
        if (i)
            tjob_init(&jobs[i], i, 0);
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    atomic_store(&g_gate_open, 1);
    loop_until(base, &g_done, N, 20000);
    ck_assert_uint_eq(g_done, N);
    /* 3 by the first call (its max), 2 by the second: it stops at job 6 */
    ck_assert_uint_eq(g_taken_first, 3);
    ck_assert_uint_eq(g_taken_second, 2);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(g_taken_ids[i], i + 1);
    /* taken jobs are not run by the workq; every job completes once, in order */
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(g_done_order[i], i);
        ck_assert_int_eq(jobs[i].dones, 1);
        ck_assert_int_eq(atomic_load(&jobs[i].runs), i >= 1 && i <= 5 ? 0 : 1);
    }
    ck_assert_uint_eq(workq_pending(q), 0);
    workq_destroy(q);
    event_base_free(base);
}
END_TEST

/* A burst of finished jobs is delivered WORKQ_DONE_BATCH per loop callback. */
START_TEST(test_done_batches)
{
    enum { N = 3 * WORKQ_DONE_BATCH + 5 };
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "batch", 1, N);
    static struct tjob jobs[N];
    struct workq_stats st;

    reset_globals();
    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], i, 0);
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    uint64_t deadline = clock_now_ms() + 20000;
    do {
        test_sleep_ms(2);
        workq_stats(q, &st);
    } while (st.finished < N && clock_now_ms() < deadline);
    ck_assert_uint_eq(st.finished, N);
    ck_assert_uint_eq(st.queued + st.running, 0);
    ck_assert_uint_eq(st.pending, N);

    event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    ck_assert_uint_eq(g_done, WORKQ_DONE_BATCH);
    event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    ck_assert_uint_eq(g_done, 2 * WORKQ_DONE_BATCH);
    loop_until(base, &g_done, N, 5000);
    ck_assert_uint_eq(g_done, N);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(g_done_order[i], i);
    workq_stats(q, &st);
    ck_assert_uint_eq(st.finished, 0);
    ck_assert_uint_eq(st.pending, 0);
    workq_destroy(q);
    event_base_free(base);
}
END_TEST

/* capacity bounds outstanding jobs; refusals are counted. */
START_TEST(test_capacity_drops)
{
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "cap", 1, 3);
    struct tjob jobs[6];
    struct workq_stats st;

    reset_globals();
    tjob_init(&jobs[0], 0, 300);
    ck_assert_int_eq(workq_submit(q, &jobs[0].job), 0);
    while (!atomic_load(&jobs[0].running))
        test_sleep_ms(1);
    for (int i = 1; i < 6; i++)
        tjob_init(&jobs[i], i, 0);
    ck_assert_int_eq(workq_submit(q, &jobs[1].job), 0);
    ck_assert_int_eq(workq_submit(q, &jobs[2].job), 0);
    ck_assert_int_eq(workq_submit(q, &jobs[3].job), -KVNODE_ELIMIT);
    ck_assert_int_eq(workq_submit(q, &jobs[4].job), -KVNODE_ELIMIT);
    workq_stats(q, &st);
    ck_assert_uint_eq(st.running, 1);
    ck_assert_uint_eq(st.queued, 2);
    ck_assert_uint_eq(st.pending, 3);
    ck_assert_uint_eq(st.submitted_total, 3);
    ck_assert_uint_eq(st.dropped_total, 2);

    ck_assert_int_eq(workq_drain(q, 10000), 0);
    ck_assert_uint_eq(g_done, 3);
    ck_assert_int_eq(jobs[3].dones + jobs[4].dones, 0);     /* refused: never touched */
    ck_assert_int_eq(atomic_load(&jobs[3].runs), 0);
    /* Room again. */
    ck_assert_int_eq(workq_submit(q, &jobs[5].job), 0);
    ck_assert_int_eq(workq_drain(q, 10000), 0);
    workq_stats(q, &st);
    ck_assert_uint_eq(st.submitted_total, 4);
    ck_assert_uint_eq(st.completed_total, 4);
    ck_assert_uint_eq(st.dropped_total, 2);
    workq_destroy(q);
    event_base_free(base);
}
END_TEST

START_TEST(test_many_jobs_four_threads)
{
    enum { N = 2000 };
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "many", 4, N);
    struct tjob *jobs = calloc(N, sizeof *jobs);

    reset_globals();
    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], i, 0);
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    loop_until(base, &g_done, N, 60000);
    ck_assert_uint_eq(g_done, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(atomic_load(&jobs[i].runs), 1);
        ck_assert_int_eq(jobs[i].dones, 1);
        ck_assert(!jobs[i].cancelled);
    }
    struct workq_stats st;
    workq_stats(q, &st);
    ck_assert_uint_eq(st.submitted_total, N);
    ck_assert_uint_eq(st.completed_total, N);
    ck_assert_uint_eq(st.pending, 0);
    ck_assert_uint_eq(st.threads, 4);
    workq_destroy(q);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
    free(jobs);
    event_base_free(base);
}
END_TEST

/* Per-thread context. */
struct tctx {
    unsigned  index;
    pthread_t thread;
    int       magic;
};
struct hook_state {
    pthread_mutex_t lock;
    int       inits, finis;
    unsigned  seen_mask;        /* bit per index */
    int       fail_index;       /* -1: none */
    bool      fini_thread_ok;
};

static int hook_init(void *arg, unsigned index, void **ctx)
{
    struct hook_state *hs = arg;
    pthread_mutex_lock(&hs->lock);
    hs->inits++;
    hs->seen_mask |= 1u << index;
    bool fail = hs->fail_index == (int)index;
    pthread_mutex_unlock(&hs->lock);
    if (fail)
        return -KVNODE_EIO;
    struct tctx *c = calloc(1, sizeof *c);
    c->index = index;
    c->thread = pthread_self();
    c->magic = 0x5eed;
    *ctx = c;
    return 0;
}

static void hook_fini(void *arg, void *ctx)
{
    struct hook_state *hs = arg;
    struct tctx *c = ctx;
    pthread_mutex_lock(&hs->lock);
    hs->finis++;
    if (!c || c->magic != 0x5eed || !pthread_equal(c->thread, pthread_self()))
        hs->fini_thread_ok = false;
    pthread_mutex_unlock(&hs->lock);
    if (c)
        c->magic = 0;
    free(c);
}

START_TEST(test_thread_hooks)
{
    enum { T = 3, N = 300 };
    struct event_base *base = event_base_new();
    struct hook_state hs = { .fail_index = -1, .fini_thread_ok = true };
    struct workq_thread_hooks hooks = { hook_init, hook_fini, &hs };
    struct workq *q = NULL;
    char err[256] = "";
    static struct tjob jobs[N];

    pthread_mutex_init(&hs.lock, NULL);
    reset_globals();
    ck_assert_int_eq(workq_create_hooks(base, "hk", T, N, &hooks, &q, err, sizeof err), 0);
    pthread_mutex_lock(&hs.lock);
    ck_assert_int_eq(hs.inits, T);              /* all ran before create returned */
    ck_assert_uint_eq(hs.seen_mask, (1u << T) - 1);
    pthread_mutex_unlock(&hs.lock);

    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], i, (i % 10 == 0) ? 2 : 0);
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    loop_until(base, &g_done, N, 30000);
    ck_assert_uint_eq(g_done, N);
    struct tctx *ctxs[T] = { 0 };
    for (int i = 0; i < N; i++) {
        struct tctx *c = jobs[i].ctx;
        ck_assert_ptr_nonnull(c);
        ck_assert_uint_lt(c->index, T);
        /* The context belongs to the thread that ran the job. */
        ck_assert(pthread_equal(c->thread, jobs[i].run_thread));
        if (ctxs[c->index])
            ck_assert_ptr_eq(ctxs[c->index], c);    /* one context per thread */
        ctxs[c->index] = c;
    }
    for (int a = 0; a < T; a++)
        for (int b = a + 1; b < T; b++)
            if (ctxs[a] && ctxs[b])
                ck_assert_ptr_ne(ctxs[a], ctxs[b]);
    pthread_mutex_lock(&hs.lock);
    ck_assert_int_eq(hs.finis, 0);
    pthread_mutex_unlock(&hs.lock);
    workq_destroy(q);
    ck_assert_int_eq(hs.inits, T);
    ck_assert_int_eq(hs.finis, T);
    ck_assert(hs.fini_thread_ok);

    /* A failing init fails create; the threads that did start are finished. */
    pthread_mutex_destroy(&hs.lock);
    hs = (struct hook_state){ .fail_index = 1, .fini_thread_ok = true };
    pthread_mutex_init(&hs.lock, NULL);
    q = (struct workq *)1;
    ck_assert_int_eq(workq_create_hooks(base, "hkfail", T, 8, &hooks, &q, err, sizeof err),
                     -KVNODE_EIO);
    ck_assert_ptr_null(q);
    ck_assert_msg(strstr(err, "hkfail-1") && strstr(err, "init"), "err: %s", err);
    ck_assert_int_eq(hs.inits, T);
    ck_assert_int_eq(hs.finis, T - 1);
    ck_assert(hs.fini_thread_ok);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
    pthread_mutex_destroy(&hs.lock);
    event_base_free(base);
}
END_TEST

/* destroy: the running job finishes (done, not cancelled), the queued ones
 * get done() with cancelled set, in order, without running; submit from a
 * done() called by destroy is refused. */
static struct workq *g_resubmit_q;
static int g_resubmit_rc;
static struct tjob g_resubmit_job;

static void resubmit_done(struct workq_job *j)
{
    tjob_done(j);
    if (g_resubmit_q) {
        tjob_init(&g_resubmit_job, 99, 0);
        g_resubmit_rc = workq_submit(g_resubmit_q, &g_resubmit_job.job);
    }
}

START_TEST(test_destroy_cancels_queued_waits_running)
{
    enum { N = 6 };
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "dq", 1, 16);
    struct tjob jobs[N];

    reset_globals();
    tjob_init(&jobs[0], 0, 400);
    ck_assert_int_eq(workq_submit(q, &jobs[0].job), 0);
    for (int i = 1; i < N; i++) {
        tjob_init(&jobs[i], i, 0);
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    jobs[N - 1].job.done = resubmit_done;
    g_resubmit_q = q;
    g_resubmit_rc = 0;
    while (!atomic_load(&jobs[0].running))
        test_sleep_ms(1);
    workq_destroy(q);
    g_resubmit_q = NULL;

    ck_assert_int_eq(atomic_load(&jobs[0].runs), 1);          /* ran to its end */
    ck_assert_int_eq(jobs[0].dones, 1);
    ck_assert(!jobs[0].cancelled);
    for (int i = 1; i < N; i++) {
        ck_assert_int_eq(atomic_load(&jobs[i].runs), 0);
        ck_assert_int_eq(jobs[i].dones, 1);
        ck_assert(jobs[i].cancelled);
        ck_assert(pthread_equal(jobs[i].done_thread, pthread_self()));
    }
    ck_assert_uint_eq(g_done, N);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(g_done_order[i], i);
    ck_assert_int_eq(g_resubmit_rc, -KVNODE_ESHUTDOWN);
    ck_assert_int_eq(g_resubmit_job.dones, 0);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
    event_base_free(base);
}
END_TEST

/* destroy with finished but undelivered jobs delivers them (not cancelled). */
START_TEST(test_destroy_delivers_finished)
{
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "df", 2, 16);
    struct tjob jobs[4];
    struct workq_stats st;

    reset_globals();
    for (int i = 0; i < 4; i++) {
        tjob_init(&jobs[i], i, 0);
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    do {
        test_sleep_ms(1);
        workq_stats(q, &st);
    } while (st.finished < 4);
    workq_destroy(q);
    ck_assert_uint_eq(g_done, 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(jobs[i].dones, 1);
        ck_assert(!jobs[i].cancelled);
    }
    event_base_free(base);
}
END_TEST

/* A job longer than the liveness bound shows its worker as stalled; the
 * worker recovers when the job ends. Idle workers beat every
 * WORKQ_IDLE_BEAT_MS, so the bound used here is above that. */
START_TEST(test_long_job_is_a_stalled_worker)
{
    const unsigned bound = WORKQ_IDLE_BEAT_MS + 300;
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "stall", 1, 4);
    struct tjob job;
    char stalled[128];

    reset_globals();
    test_sleep_ms(50);
    ck_assert(liveness_check(liveness_now_ms(), bound, stalled, sizeof stalled));
    tjob_init(&job, 0, bound + 900);
    uint64_t t0 = clock_now_ms();
    ck_assert_int_eq(workq_submit(q, &job.job), 0);
    while (!atomic_load(&job.running))
        test_sleep_ms(1);
    test_sleep_ms(bound + 200);
    ck_assert_msg(atomic_load(&job.runs) == 0, "job ended early (slow host?)");
    ck_assert(!liveness_check(liveness_now_ms(), bound, stalled, sizeof stalled));
    ck_assert_str_eq(stalled, "stall-0");

    ck_assert_int_eq(workq_drain(q, 20000), 0);
    ck_assert_uint_ge(clock_now_ms() - t0, bound + 900);
    /* Recovered: it beat after the job and keeps beating while idle. */
    ck_assert(liveness_check(liveness_now_ms(), bound, stalled, sizeof stalled));
    ck_assert_str_eq(stalled, "");
    test_sleep_ms(WORKQ_IDLE_BEAT_MS + 100);
    ck_assert(liveness_check(liveness_now_ms(), bound, stalled, sizeof stalled));
    workq_destroy(q);
    event_base_free(base);
}
END_TEST

/* drain: waits for completions within its timeout, including jobs that a
 * done() submits; gives up with ETIMEDOUT when they take longer. */
static struct workq *g_chain_q;
static struct tjob g_chain_job;

static void chain_done(struct workq_job *j)
{
    tjob_done(j);
    tjob_init(&g_chain_job, 100, 20);
    ck_assert_int_eq(workq_submit(g_chain_q, &g_chain_job.job), 0);
}

START_TEST(test_drain)
{
    enum { N = 6 };
    struct event_base *base = event_base_new();
    struct workq *q = make_q(base, "drain", 2, 16);
    struct tjob jobs[N];

    reset_globals();
    g_chain_q = q;
    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], i, 30);
        if (i == N - 1)
            jobs[i].job.done = chain_done;
        ck_assert_int_eq(workq_submit(q, &jobs[i].job), 0);
    }
    ck_assert_int_eq(workq_drain(q, 20000), 0);
    ck_assert_uint_eq(workq_pending(q), 0);
    ck_assert_uint_eq(g_done, N + 1);
    ck_assert_int_eq(g_chain_job.dones, 1);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(jobs[i].dones, 1);

    /* Timeout. */
    struct tjob slow;
    tjob_init(&slow, 7, 1500);
    ck_assert_int_eq(workq_submit(q, &slow.job), 0);
    uint64_t t0 = clock_now_ms();
    ck_assert_int_eq(workq_drain(q, 150), -KVNODE_ETIMEDOUT);
    uint64_t took = clock_now_ms() - t0;
    ck_assert_uint_ge(took, 150);
    ck_assert_uint_lt(took, 1400);
    ck_assert_uint_eq(workq_pending(q), 1);
    ck_assert_int_eq(slow.dones, 0);
    ck_assert_int_eq(workq_drain(q, 20000), 0);
    ck_assert_int_eq(slow.dones, 1);
    ck_assert(!slow.cancelled);
    workq_destroy(q);
    event_base_free(base);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("workq");
    TCase *tc = tcase_create("workq");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_args);
    tcase_add_test(tc, test_threads_and_loop_wakeup);
    tcase_add_test(tc, test_fifo_single_thread);
    tcase_add_test(tc, test_take_more);
    tcase_add_test(tc, test_done_batches);
    tcase_add_test(tc, test_capacity_drops);
    tcase_add_test(tc, test_many_jobs_four_threads);
    tcase_add_test(tc, test_thread_hooks);
    tcase_add_test(tc, test_destroy_cancels_queued_waits_running);
    tcase_add_test(tc, test_destroy_delivers_finished);
    tcase_add_test(tc, test_long_job_is_a_stalled_worker);
    tcase_add_test(tc, test_drain);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
