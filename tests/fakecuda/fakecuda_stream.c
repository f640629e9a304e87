/* fakecuda_stream.c: streams, events and copies of the strict fake CUDA.
 * Every stream (and each device's legacy default stream) has a worker thread
 * that runs its operations in order; a copy or memset lands
 * FAKECUDA_COPY_DELAY_MS after it could start. The legacy stream waits for
 * the work already queued on the device's blocking streams and they wait for
 * its work; non-blocking streams never wait for it. Threads start only when a
 * stream is created or the legacy stream is first used (never in a
 * constructor) and are joined by stream destroy. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda_internal.h"

enum { OP_COPY, OP_SET, OP_NOP };

struct fc_dep {
    struct fc_stream *s;
    uint64_t seq;
};

struct fc_op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    void *staging;          /* freed once the op ran */
    struct fc_dep *deps;
    size_t ndeps;
    uint64_t seq;
    struct fc_event *event;     /* an event record: stamps its completion */
    struct fc_op *next;
};

struct fc_stream {
    int phys;
    bool legacy;
    bool nonblocking;
    bool stop;
    pthread_t thr;
    struct fc_op *head, *tail;
    uint64_t submitted, completed;
    struct fc_stream *next;
};

struct fc_event {
    struct fc_stream *s;    /* NULL: never recorded, or its stream is gone */
    uint64_t seq;
    unsigned flags;         /* 0x2: CU_EVENT_DISABLE_TIMING / cudaEventDisableTiming */
    bool recorded;
    uint64_t done_ns;       /* CLOCK_MONOTONIC when its record completed; 0 before */
    struct fc_event *next;
};

struct stream_tables {
    struct fc_stream *streams;
    struct fc_event *events;
    struct fc_stream *legacy[FC_MAX_DEVICES];
    struct stream_tables *older;    /* a fork parent's, kept reachable */
};

static struct stream_tables stt;

void fc_stream_fork_reset(void)
{
    struct stream_tables *old = malloc(sizeof *old);

    memcpy(stt.legacy, fc.legacy, sizeof stt.legacy);
    if (old)
        *old = stt;
    memset(&stt, 0, sizeof stt);
    stt.older = old;
    memset(fc.legacy, 0, sizeof fc.legacy);
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static bool deps_done(const struct fc_op *op)
{
    size_t i;

    for (i = 0; i < op->ndeps; i++)
        if (op->deps[i].s && op->deps[i].s->completed < op->deps[i].seq)
            return false;
    return true;
}

static void *worker(void *arg)
{
    struct fc_stream *s = arg;
    unsigned delay;

    pthread_mutex_lock(&fc.lock);
    for (;;) {
        struct fc_op *op;

        while (!(s->head && deps_done(s->head)) && !(s->stop && !s->head))
            pthread_cond_wait(&fc.cv, &fc.lock);
        if (!s->head)
            break;
        op = s->head;
        delay = fc.cfg.delay_ms;
        pthread_mutex_unlock(&fc.lock);
        /* With a delay the source is read when the copy starts and the
         * destination written when it completes, as a DMA in flight: a
         * reader not ordered after a write sees the old bytes. */
        if (op->kind == OP_COPY && delay && !op->staging && (op->staging = malloc(op->n)))
            memcpy(op->staging, op->src, op->n);
        if (op->kind != OP_NOP && delay)
            sleep_ms(delay);
        if (op->kind == OP_COPY)
            memmove(op->dst, op->staging ? op->staging : op->src, op->n);
        else if (op->kind == OP_SET)
            memset(op->dst, op->value, op->n);
        pthread_mutex_lock(&fc.lock);
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->completed = op->seq;
        if (op->event) {
            struct timespec ts;

            clock_gettime(CLOCK_MONOTONIC, &ts);
            op->event->done_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + 1;
        }
        free(op->staging);
        free(op->deps);
        free(op);
        pthread_cond_broadcast(&fc.cv);
    }
    pthread_mutex_unlock(&fc.lock);
    return NULL;
}

/* Caller holds fc.lock. */
static struct fc_stream *stream_new(int phys, bool legacy, bool nonblocking)
{
    struct fc_stream *s = calloc(1, sizeof *s);

    if (!s)
        return NULL;
    s->phys = phys;
    s->legacy = legacy;
    s->nonblocking = nonblocking;
    if (pthread_create(&s->thr, NULL, worker, s) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

/* Caller holds fc.lock. */
static struct fc_stream *legacy_stream(int phys)
{
    if (!fc.legacy[phys])
        fc.legacy[phys] = stream_new(phys, true, false);
    return fc.legacy[phys];
}

static bool dep_add(struct fc_op *op, struct fc_stream *s, uint64_t seq)
{
    struct fc_dep *d = realloc(op->deps, (op->ndeps + 1) * sizeof *d);

    if (!d)
        return false;
    op->deps = d;
    d[op->ndeps].s = s;
    d[op->ndeps].seq = seq;
    op->ndeps++;
    return true;
}

/* Queue op on s (caller holds fc.lock); extra: one more stream/seq to wait
 * for (cuStreamWaitEvent). Returns op's sequence number. */
static uint64_t enqueue(struct fc_stream *s, struct fc_op *op, struct fc_stream *extra, uint64_t extra_seq)
{
    struct fc_stream *t;

    if (extra)
        dep_add(op, extra, extra_seq);
    if (s->legacy) {
        for (t = stt.streams; t; t = t->next)
            if (t->phys == s->phys && !t->nonblocking && t->submitted > t->completed)
                dep_add(op, t, t->submitted);
    } else if (!s->nonblocking) {
        t = fc.legacy[s->phys];
        if (t && t->submitted > t->completed)
            dep_add(op, t, t->submitted);
    }
    op->seq = ++s->submitted;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&fc.cv);
    return op->seq;
}

/* seq 0: everything queued on s so far. */
static void wait_seq(struct fc_stream *s, uint64_t seq)
{
    pthread_mutex_lock(&fc.lock);
    if (seq == 0)
        seq = s->submitted;
    while (s->completed < seq)
        pthread_cond_wait(&fc.cv, &fc.lock);
    pthread_mutex_unlock(&fc.lock);
}

/* Queue a no-op on s and return its number: waiting for it waits for all
 * that s (with the legacy stream's rules) was ordered after. */
static uint64_t enqueue_nop(struct fc_stream *s, struct fc_stream *extra, uint64_t extra_seq)
{
    struct fc_op *op = calloc(1, sizeof *op);
    uint64_t seq;

    if (!op)
        return 0;
    op->kind = OP_NOP;
    pthread_mutex_lock(&fc.lock);
    seq = enqueue(s, op, extra, extra_seq);
    pthread_mutex_unlock(&fc.lock);
    return seq;
}

void fc_device_sync(int phys)
{
    struct fc_stream *t;
    bool pending;

    if (phys < 0)
        return;
    pthread_mutex_lock(&fc.lock);
    do {
        pending = fc.legacy[phys] && fc.legacy[phys]->completed < fc.legacy[phys]->submitted;
        for (t = stt.streams; t && !pending; t = t->next)
            pending = t->phys == phys && t->completed < t->submitted;
        if (pending)
            pthread_cond_wait(&fc.cv, &fc.lock);
    } while (pending);
    pthread_mutex_unlock(&fc.lock);
}

/* NULL and the CU_STREAM_LEGACY / CU_STREAM_PER_THREAD handles (0x1, 0x2)
 * are the legacy default stream of ctx's device. */
CUresult fc_stream_resolve(struct fc_stream *h, struct fc_ctx *ctx, struct fc_stream **out)
{
    struct fc_stream *s;

    pthread_mutex_lock(&fc.lock);
    if ((uintptr_t)h <= 2) {
        s = legacy_stream(ctx->phys);
    } else {
        for (s = stt.streams; s && s != h; s = s->next) {}
        if (!s) {
            pthread_mutex_unlock(&fc.lock);
            return FC_ERR_INVALID_HANDLE;
        }
    }
    pthread_mutex_unlock(&fc.lock);
    *out = s;
    return s ? FC_SUCCESS : FC_ERR_OUT_OF_MEMORY;
}

/* ---- copies -------------------------------------------------------------------- */

static CUresult queue_copy(struct fc_stream *s, void *dst, const void *src, size_t n, bool stage,
                           uint64_t *seq)
{
    struct fc_op *op = calloc(1, sizeof *op);

    if (!op)
        return FC_ERR_OUT_OF_MEMORY;
    op->kind = OP_COPY;
    op->dst = dst;
    op->src = src;
    op->n = n;
    if (stage) {
        op->staging = malloc(n);
        if (!op->staging) {
            free(op);
            return FC_ERR_OUT_OF_MEMORY;
        }
        memcpy(op->staging, src, n);
    }
    pthread_mutex_lock(&fc.lock);
    *seq = enqueue(s, op, NULL, 0);
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

CUresult fc_copy(void *dst, const void *src, size_t n, int kind, struct fc_stream *s, bool async,
                 struct fc_ctx *ctx, const char *what)
{
    int dphys = -1, sphys = -1, dd, sd, dpin = 0, spin = 0, phys;
    uint64_t seq;
    CUresult rc;

    if (n == 0)
        return FC_SUCCESS;
    if (!dst || !src)
        return FC_ERR_INVALID_VALUE;
    if (kind < FC_MEMCPY_H2H || kind > FC_MEMCPY_DEFAULT)
        return FC_ERR_INVALID_MEMCPY_DIRECTION;
    dd = fc_range_class(dst, n, &dphys);
    sd = fc_range_class(src, n, &sphys);
    if (dd < 0 || sd < 0)
        return FC_ERR_INVALID_VALUE;
    if (kind != FC_MEMCPY_DEFAULT) {
        bool want_sd = kind == FC_MEMCPY_D2H || kind == FC_MEMCPY_D2D;
        bool want_dd = kind == FC_MEMCPY_H2D || kind == FC_MEMCPY_D2D;

        if (want_sd != (sd == 1) || want_dd != (dd == 1)) {
            fc_violation("copy-direction", "%s of %zu bytes with kind %d: source is %s memory, "
                         "destination %s memory", what, n, kind, sd ? "device" : "host",
                         dd ? "device" : "host");
            return FC_ERR_INVALID_VALUE;
        }
    }
    phys = async ? s->phys : ctx->phys;
    if (!dd)
        dpin = fc_host_pinned(dst, n, phys);
    if (!sd)
        spin = fc_host_pinned(src, n, phys);
    if (dpin < 0 || spin < 0) {
        fc_violation("copy-straddles-pin", "%s of %zu bytes: the host range %p is partly registered "
                     "or spans two registrations", what, n, dpin < 0 ? dst : src);
        return FC_ERR_INVALID_VALUE;
    }
    if (!dd && !sd && !async) {
        memmove(dst, src, n);
        return FC_SUCCESS;
    }
    if (!async && (rc = fc_stream_resolve(NULL, ctx, &s)))
        return rc;
    if (!dd && sd) {                            /* D2H */
        if ((rc = queue_copy(s, dst, src, n, false, &seq)))
            return rc;
        if (!async || !dpin)                    /* into pageable memory: returns complete */
            wait_seq(s, seq);
        return FC_SUCCESS;
    }
    if (dd && !sd) {                            /* H2D */
        if (spin) {
            if ((rc = queue_copy(s, dst, src, n, false, &seq)))
                return rc;
            if (!async)
                wait_seq(s, seq);
            return FC_SUCCESS;
        }
        /* Pageable source: the stream's earlier work first (the documented
         * "stream sync"), then staged; the device write lands later. */
        wait_seq(s, 0);
        return queue_copy(s, dst, src, n, true, &seq);
    }
    return queue_copy(s, dst, src, n, false, &seq);   /* D2D (or async H2H) */
}

CUresult fc_memset(void *dst, int value, size_t n, struct fc_ctx *ctx, struct fc_stream *stream)
{
    struct fc_stream *s;
    struct fc_op *op;
    CUresult rc;
    int phys;

    if ((rc = fc_stream_resolve(stream, ctx, &s)))
        return rc;
    if (n == 0)
        return FC_SUCCESS;
    if (fc_range_class(dst, n, &phys) != 1)
        return FC_ERR_INVALID_VALUE;
    op = calloc(1, sizeof *op);
    if (!op)
        return FC_ERR_OUT_OF_MEMORY;
    op->kind = OP_SET;
    op->dst = dst;
    op->value = value;
    op->n = n;
    pthread_mutex_lock(&fc.lock);
    enqueue(s, op, NULL, 0);
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

/* ---- streams and events (shared by both halves) ---------------------------------- */

static CUresult stream_create(struct fc_ctx *c, struct fc_stream **out, unsigned flags)
{
    struct fc_stream *s;

    if (!out || (flags & ~(unsigned)FC_STREAM_NON_BLOCKING))
        return FC_ERR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    s = stream_new(c->phys, false, flags & FC_STREAM_NON_BLOCKING);
    if (s) {
        s->next = stt.streams;
        stt.streams = s;
    }
    pthread_mutex_unlock(&fc.lock);
    if (!s)
        return FC_ERR_OUT_OF_MEMORY;
    *out = s;
    return FC_SUCCESS;
}

/* Ops queued on t stop waiting for s (gone, its work all done). Caller
 * holds fc.lock. */
static void forget_deps(struct fc_stream *t, const struct fc_stream *s)
{
    struct fc_op *op;
    size_t k;

    for (op = t ? t->head : NULL; op; op = op->next)
        for (k = 0; k < op->ndeps; k++)
            if (op->deps[k].s == s)
                op->deps[k].s = NULL;
}

/* Waits for the stream's work (the real one returns at once and frees it
 * later; either way the work completes). */
static CUresult stream_destroy(struct fc_stream *h)
{
    struct fc_stream **pp, *s, *t;
    struct fc_event *e;
    size_t i;

    if ((uintptr_t)h <= 2)
        return FC_ERR_INVALID_HANDLE;
    pthread_mutex_lock(&fc.lock);
    for (pp = &stt.streams; (s = *pp) && s != h; pp = &s->next) {}
    if (!s) {
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_INVALID_HANDLE;
    }
    *pp = s->next;
    s->stop = true;
    pthread_cond_broadcast(&fc.cv);
    pthread_mutex_unlock(&fc.lock);
    pthread_join(s->thr, NULL);
    pthread_mutex_lock(&fc.lock);
    for (e = stt.events; e; e = e->next)
        if (e->s == s)
            e->s = NULL;
    for (i = 0; i < FC_MAX_DEVICES; i++)
        forget_deps(fc.legacy[i], s);
    for (t = stt.streams; t; t = t->next)
        forget_deps(t, s);
    pthread_mutex_unlock(&fc.lock);
    free(s);
    return FC_SUCCESS;
}

static CUresult stream_sync(struct fc_ctx *c, struct fc_stream *h)
{
    struct fc_stream *s;
    CUresult rc = fc_stream_resolve(h, c, &s);

    if (rc)
        return rc;
    if (s->legacy)
        wait_seq(s, enqueue_nop(s, NULL, 0));
    else
        wait_seq(s, 0);
    return FC_SUCCESS;
}

static CUresult stream_query(struct fc_ctx *c, struct fc_stream *h)
{
    struct fc_stream *s;
    CUresult rc = fc_stream_resolve(h, c, &s);
    bool busy;

    if (rc)
        return rc;
    pthread_mutex_lock(&fc.lock);
    busy = s->completed < s->submitted;
    pthread_mutex_unlock(&fc.lock);
    return busy ? FC_ERR_NOT_READY : FC_SUCCESS;
}

static struct fc_event *event_find(struct fc_event *h)
{
    struct fc_event *e;

    for (e = stt.events; e && e != h; e = e->next) {}
    return e;
}

static CUresult event_create(struct fc_event **out, unsigned flags)
{
    struct fc_event *e;

    if (!out || (flags & ~0xFu))
        return FC_ERR_INVALID_VALUE;
    e = calloc(1, sizeof *e);
    if (!e)
        return FC_ERR_OUT_OF_MEMORY;
    e->flags = flags;
    pthread_mutex_lock(&fc.lock);
    e->next = stt.events;
    stt.events = e;
    pthread_mutex_unlock(&fc.lock);
    *out = e;
    return FC_SUCCESS;
}

/* Pending records of e stop stamping it (re-recorded or destroyed). Caller
 * holds fc.lock. */
static void forget_event(const struct fc_event *e)
{
    struct fc_stream *t;
    struct fc_op *op;
    int i;

    for (i = 0; i < FC_MAX_DEVICES; i++)
        for (op = fc.legacy[i] ? fc.legacy[i]->head : NULL; op; op = op->next)
            if (op->event == e)
                op->event = NULL;
    for (t = stt.streams; t; t = t->next)
        for (op = t->head; op; op = op->next)
            if (op->event == e)
                op->event = NULL;
}

static CUresult event_record(struct fc_ctx *c, struct fc_event *h, struct fc_stream *sh)
{
    struct fc_stream *s;
    CUresult rc = fc_stream_resolve(sh, c, &s);
    struct fc_op *op;

    if (rc)
        return rc;
    op = calloc(1, sizeof *op);
    if (!op)
        return FC_ERR_OUT_OF_MEMORY;
    op->kind = OP_NOP;
    pthread_mutex_lock(&fc.lock);
    if (!event_find(h)) {
        pthread_mutex_unlock(&fc.lock);
        free(op);
        return FC_ERR_INVALID_HANDLE;
    }
    forget_event(h);
    op->event = h;
    h->s = s;
    h->recorded = true;
    h->done_ns = 0;
    h->seq = enqueue(s, op, NULL, 0);
    pthread_mutex_unlock(&fc.lock);
    return FC_SUCCESS;
}

/* Milliseconds between two completed records. */
static CUresult event_elapsed(float *ms, struct fc_event *a, struct fc_event *b)
{
    CUresult rc = FC_SUCCESS;

    if (!ms)
        return FC_ERR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    if (!event_find(a) || !event_find(b) || !a->recorded || !b->recorded || ((a->flags | b->flags) & 2))
        rc = FC_ERR_INVALID_HANDLE;
    else if (!a->done_ns || !b->done_ns)
        rc = FC_ERR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)(b->done_ns - a->done_ns)) / 1e6);
    pthread_mutex_unlock(&fc.lock);
    return rc;
}

static CUresult event_query(struct fc_event *h, bool wait)
{
    CUresult rc = FC_SUCCESS;

    pthread_mutex_lock(&fc.lock);
    if (!event_find(h)) {
        rc = FC_ERR_INVALID_HANDLE;
    } else if (wait) {
        while (h->s && h->s->completed < h->seq)
            pthread_cond_wait(&fc.cv, &fc.lock);
    } else if (h->s && h->s->completed < h->seq) {
        rc = FC_ERR_NOT_READY;
    }
    pthread_mutex_unlock(&fc.lock);
    return rc;
}

static CUresult event_destroy(struct fc_event *h)
{
    struct fc_event **pp, *e;

    pthread_mutex_lock(&fc.lock);
    for (pp = &stt.events; (e = *pp) && e != h; pp = &e->next) {}
    if (e) {
        *pp = e->next;
        forget_event(e);
    }
    pthread_mutex_unlock(&fc.lock);
    free(e);
    return e ? FC_SUCCESS : FC_ERR_INVALID_HANDLE;
}

static CUresult stream_wait_event(struct fc_ctx *c, struct fc_stream *sh, struct fc_event *h, unsigned flags)
{
    struct fc_stream *s, *es;
    CUresult rc = fc_stream_resolve(sh, c, &s);
    uint64_t seq;

    if (rc)
        return rc;
    if (flags != 0)
        return FC_ERR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    if (!event_find(h)) {
        pthread_mutex_unlock(&fc.lock);
        return FC_ERR_INVALID_HANDLE;
    }
    es = h->s;
    seq = h->seq;
    pthread_mutex_unlock(&fc.lock);
    if (es)
        enqueue_nop(s, es, seq);
    return FC_SUCCESS;
}

/* ---- driver entry points ------------------------------------------------------ */

CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    DRV_CTX("cuStreamCreate");
    return stream_create(c, stream, flags);
}

CUresult cuStreamDestroy_v2(CUstream stream)
{
    DRV_CTX("cuStreamDestroy_v2");
    (void)c;
    return stream_destroy(stream);
}

CUresult cuStreamSynchronize(CUstream stream)
{
    DRV_CTX("cuStreamSynchronize");
    return stream_sync(c, stream);
}

CUresult cuStreamQuery(CUstream stream)
{
    DRV_CTX("cuStreamQuery");
    return stream_query(c, stream);
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    DRV_CTX("cuStreamWaitEvent");
    return stream_wait_event(c, stream, event, flags);
}

CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    DRV_CTX("cuEventCreate");
    (void)c;
    return event_create(event, flags);
}

CUresult cuEventRecord(CUevent event, CUstream stream)
{
    DRV_CTX("cuEventRecord");
    return event_record(c, event, stream);
}

CUresult cuEventSynchronize(CUevent event)
{
    DRV_CTX("cuEventSynchronize");
    (void)c;
    return event_query(event, true);
}

CUresult cuEventQuery(CUevent event)
{
    DRV_CTX("cuEventQuery");
    (void)c;
    return event_query(event, false);
}

CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    DRV_CTX("cuEventElapsedTime");
    (void)c;
    return event_elapsed(ms, start, end);
}

CUresult cuEventDestroy_v2(CUevent event)
{
    DRV_CTX("cuEventDestroy_v2");
    (void)c;
    return event_destroy(event);
}

/* ---- runtime entry points -------------------------------------------------------- */

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    RT_CTX("cudaStreamCreate");
    return fc_rt_ret(stream_create(c, stream, 0));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    RT_CTX("cudaStreamCreateWithFlags");
    return fc_rt_ret(stream_create(c, stream, flags));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    RT_CTX("cudaStreamDestroy");
    (void)c;
    return fc_rt_ret(stream_destroy(stream));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    RT_CTX("cudaStreamSynchronize");
    return fc_rt_ret(stream_sync(c, stream));
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    RT_CTX("cudaStreamQuery");
    return fc_rt_ret(stream_query(c, stream));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    RT_CTX("cudaStreamWaitEvent");
    return fc_rt_ret(stream_wait_event(c, stream, event, flags));
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    RT_CTX("cudaEventCreate");
    (void)c;
    return fc_rt_ret(event_create(event, 0));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    RT_CTX("cudaEventCreateWithFlags");
    (void)c;
    return fc_rt_ret(event_create(event, flags));
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    RT_CTX("cudaEventRecord");
    return fc_rt_ret(event_record(c, event, stream));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    RT_CTX("cudaEventSynchronize");
    (void)c;
    return fc_rt_ret(event_query(event, true));
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    RT_CTX("cudaEventQuery");
    (void)c;
    return fc_rt_ret(event_query(event, false));
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    RT_CTX("cudaEventElapsedTime");
    (void)c;
    return fc_rt_ret(event_elapsed(ms, start, end));
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    RT_CTX("cudaEventDestroy");
    (void)c;
    return fc_rt_ret(event_destroy(event));
}

cudaError_t cudaDeviceSynchronize(void)
{
    RT_CTX("cudaDeviceSynchronize");
    fc_device_sync(c->phys);
    return FC_SUCCESS;
}
