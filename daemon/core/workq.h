/* workq: a bounded pool of worker threads that run jobs for the loop thread
 * (persistence, demotion copies, KVCM queries), as docs/ARCHITECTURE.md
 * "Threads and who owns what" describes: the loop submits jobs through a bounded queue and
 * never blocks; workers run them; the results come back to the loop, which
 * applies them in each job's done() callback. No lock is ever held by the
 * loop while a job runs.
 *
 * Threads. Each of the nthreads workers is named "<name>-<i>" (i from 0):
 * pthread_setname_np gets the name cut to 15 bytes (the kernel's limit), the
 * liveness registry (core/liveness.h) the name cut to LIVENESS_NAME_MAX - 1 bytes.
 * A worker heartbeats before and after each job and at least every
 * WORKQ_IDLE_BEAT_MS while idle, so a job that runs longer than the
 * registry's stall bound shows up as a stalled worker until it ends — that
 * is deliberate: a hung backend call must be visible to /readyz and the
 * systemd watchdog. Workers block every signal (signals belong to the loop).
 *
 * Jobs. A job is owned by the caller, usually embedded in a bigger struct
 * (container_of). run() executes on some worker thread; done() executes
 * afterwards on the loop thread, exactly once per accepted job, and is where
 * results are applied and the job may be freed (the workq never touches the
 * job after calling done()). A job whose run() never started because the
 * queue was destroyed gets done() with job->cancelled == true (run() is not
 * called). With nthreads == 1, jobs run and complete in submission order.
 *
 * Completion. Workers append finished jobs to a mutex-protected list and
 * signal an eventfd watched on the loop (EV_READ|EV_PERSIST); the loop's
 * callback calls done() for at most WORKQ_DONE_BATCH jobs per call and
 * leaves the eventfd readable when more remain, so the rest are handled on
 * the next loop iterations, interleaved with the loop's other events: a
 * burst cannot stall the loop.
 *
 * Threading contract: workq_create, workq_submit, workq_pending, workq_stats,
 * workq_drain and workq_destroy are called from the loop thread only (the
 * thread that runs `loop`). Errors are negative KVNODE_E* codes. */
#ifndef KVNODE_WORKQ_H
#define KVNODE_WORKQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct workq;

#define WORKQ_MAX_THREADS   64u     /* per queue (the liveness registry holds 64 in all) */
#define WORKQ_IDLE_BEAT_MS  1000u   /* an idle worker wakes up and beats this often */
#define WORKQ_DONE_BATCH    64u     /* done() calls per loop callback */

struct workq_job {
    /* Set by the submitter. run() is required; done() is required. */
    void (*run)(struct workq_job *job, void *worker_ctx);
    void (*done)(struct workq_job *job);
    /* Set by the workq before done(): true when the job was discarded by
     * workq_destroy before run() started (run() was not called). */
    bool cancelled;
    /* Private to the workq while the job is outstanding. */
    struct workq_job *wq_next;
};

/* Optional per-thread context: init() runs on each worker thread before it
 * takes a job (e.g. opens a backend connection or a curl handle) and stores
 * the thread's context in *ctx, which that thread's run() calls receive as
 * worker_ctx; fini() runs on the same thread when it exits, with that ctx.
 * init() returns 0, or a negative KVNODE_E* code to make workq_create fail
 * (fini() is then not called for that thread). `arg` is passed to both. */
struct workq_thread_hooks {
    int  (*init)(void *arg, unsigned index, void **ctx);
    void (*fini)(void *arg, void *ctx);
    void *arg;
};

struct workq_stats {
    size_t   queued;           /* accepted, waiting for a worker */
    size_t   running;          /* in run() now */
    size_t   finished;         /* run() returned, done() not called yet */
    size_t   pending;          /* accepted, done() not called yet (see workq_pending) */
    uint64_t submitted_total;  /* accepted by workq_submit */
    uint64_t completed_total;  /* done() called after run() */
    uint64_t cancelled_total;  /* done() called with cancelled set (workq_destroy) */
    uint64_t dropped_total;    /* refused by workq_submit because the queue was full */
    unsigned threads;
};

/* Start nthreads (1..WORKQ_MAX_THREADS) workers for a queue that holds at
 * most `capacity` (>= 1) outstanding jobs. Waits until every worker has
 * registered and run its init hook. 0, or a negative code with a message in
 * err (*out is then NULL and nothing is left running). */
int  workq_create(struct event_base *loop, const char *name, unsigned nthreads, size_t capacity,
                  struct workq **out, char *err, size_t errlen);
/* The same with per-thread hooks (NULL: none). */
int  workq_create_hooks(struct event_base *loop, const char *name, unsigned nthreads,
                        size_t capacity, const struct workq_thread_hooks *hooks,
                        struct workq **out, char *err, size_t errlen);

/* Batching, from inside a run() on a worker thread (and only there): take
 * up to max further jobs from the head of the queue, in queue order, as
 * long as accept(first, candidate, arg) says yes — it stops at the first job
 * refused, so no job is ever taken past one left queued (the queue's order
 * holds). The taken jobs are the caller's to execute within this run():
 * their own run() is not called. When the run() returns they complete, in
 * order, after `first`, each with its own done(). accept runs under the
 * queue's lock: it must be quick and must not call into the workq. Returns
 * the number taken (0 outside a worker thread). */
size_t workq_take_more(struct workq_job *first,
                       bool (*accept)(const struct workq_job *first,
                                      const struct workq_job *candidate, void *arg),
                       void *arg, struct workq_job **out, size_t max);

/* Queue a job; never blocks. 0; -KVNODE_ELIMIT (and dropped_total counts it)
 * when `capacity` jobs are outstanding — queued, running, or finished with
 * done() not yet called; -KVNODE_EINVAL for a job without run/done;
 * -KVNODE_ESHUTDOWN once workq_destroy has begun (e.g. from a done() it
 * calls). On failure the job stays the caller's and done() is not called. */
int  workq_submit(struct workq *q, struct workq_job *job);

/* Jobs accepted whose done() has not been called yet. */
size_t workq_pending(const struct workq *q);

void workq_stats(struct workq *q, struct workq_stats *out);

/* Bounded flush, e.g. of write-behind at shutdown: process completions on
 * the calling (loop) thread — directly, without running the event loop, so
 * no other event fires meanwhile — until nothing is pending or timeout_ms
 * passes. done() callbacks run here and may submit more jobs, which are
 * waited for too. 0 when nothing is pending, -KVNODE_ETIMEDOUT otherwise. */
int  workq_drain(struct workq *q, unsigned timeout_ms);

/* Stop accepting jobs, discard the queued ones, wait for the running ones
 * to finish (this blocks the calling thread for as long as they take: call
 * workq_drain first to bound it), stop and join the workers (each runs its
 * fini hook and unregisters), then call done() for every outstanding job —
 * the finished ones first (cancelled false), then the discarded ones in
 * submission order (cancelled true) — and free the queue. NULL is ignored.
 * Call it from the loop thread, before the event_base is freed, and not from
 * inside a done() callback of the same queue. */
void workq_destroy(struct workq *q);

#endif
