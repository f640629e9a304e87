/* persist worker: the request workers — a request's run() on a
 * "persist-<i>" thread (the thread's handle, reopened when needed, batching,
 * the backend call) and its done() on the loop (counters, state, tombstones,
 * the caller's callback). See persist.h, persist_internal.h.
 *
 * Reopen rule (worker threads). A thread's handle is (re)opened before a
 * job runs when it is NULL (the open at thread start failed: store down) or
 * when the thread's previous call failed with -KVNODE_ECLOSED,
 * -KVNODE_ECONNECT or -KVNODE_EIO (the connection, or the handle, may be
 * dead). A failed (re)open fails the job as PERSIST_FAIL_UNAVAILABLE with
 * the open's message; the next job tries again. Nothing else reopens.
 *
 * Batching. A backend with put_batch / get_batch (v6d) gets a worker's
 * queued writes (reads) in one call: the worker that takes a write takes
 * the writes queued right behind it as well (workq_take_more, stopping at
 * the first job of another kind, so the queue's order holds), up to
 * PERSIST_BATCH_MAX blocks and PERSIST_BATCH_BYTES; each job keeps its own
 * result, counters and callback. */
#include "persist/persist_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/devmem.h"
#include "kvnode.h"
#include "mem/populate.h"

#define PERSIST_BATCH_MAX    64u           /* blocks per batched store call */
/* Bytes per batch: a device batch's bounce copy; and a chain of large blocks
 * is shared among the workers (16 x 1 MiB: four batches, not one worker's). */
#define PERSIST_BATCH_BYTES  (4u << 20)

/* A request worker's context. */
struct pworker {
    struct kvs_store *s;           /* NULL: not open (store down) */
    bool              reopen;      /* the last call failed at the connection level */
    void             *bounce;      /* host copy of a device block being written */
    size_t            bounce_len;
};

/* Connection-level failures after which the thread reopens its handle. */
static bool needs_reopen(int rc)
{
    return rc == -KVNODE_ECLOSED || rc == -KVNODE_ECONNECT || rc == -KVNODE_EIO;
}

/* --- request workers --------------------------------------------------------------- */

int persist_worker_init(void *arg, unsigned idx, void **ctx)
{
    const struct persist *p = arg;
    struct pworker *w = calloc(1, sizeof *w);
    char e[PERSIST_ERR_MAX];

    (void)idx;
    if (!w)
        return -KVNODE_ENOMEM;
    /* A store that is down now is not a reason to fail the start: the
     * thread's first job opens it (s stays NULL). */
    if (p->be->open(&p->kcfg, &w->s, e, sizeof e) < 0)
        w->s = NULL;
    *ctx = w;
    return 0;
}

void persist_worker_fini(void *arg, void *ctx)
{
    const struct persist *p = arg;
    struct pworker *w = ctx;

    if (!w)
        return;
    if (w->s)
        p->be->close(w->s);
    free(w->bounce);
    free(w);
}

/* A write from device memory: copy the block to the worker's host buffer. */
static const void *job_write_source(struct pjob *pj, struct pworker *w)
{
    if (!pj->dm)
        return pj->wdata;
    if (w->bounce_len < pj->len) {
        void *b = realloc(w->bounce, pj->len);
        if (!b) {
            snprintf(pj->err, sizeof pj->err, "out of memory for a %zu-byte copy of an HBM block",
                     pj->len);
            return NULL;
        }
        w->bounce = b;
        w->bounce_len = pj->len;
    }
    if (devmem_copy_to_host(pj->dm, pj->device, w->bounce, pj->wdata, pj->len, pj->err,
                            sizeof pj->err) < 0)
        return NULL;
    return w->bounce;
}

/* Batching (worker thread): queued jobs of the same kind right behind this
 * one join it, up to PERSIST_BATCH_MAX blocks and PERSIST_BATCH_BYTES. */
struct batch_room { size_t bytes; };

static bool batch_accept(const struct workq_job *first, const struct workq_job *cand, void *arg)
{
    const struct pjob *a = (const struct pjob *)first, *b = (const struct pjob *)cand;
    struct batch_room *room = arg;
    if (b->op != a->op || b->p != a->p || room->bytes + b->len > PERSIST_BATCH_BYTES)
        return false;
    room->bytes += b->len;
    return true;
}

/* The job and the queued ones that join it, their results cleared; the count. */
static size_t job_batch_take(struct pjob *pj, struct pjob **jobs)
{
    struct workq_job *more[PERSIST_BATCH_MAX - 1];
    struct batch_room room = { pj->len };
    size_t n = 1 + workq_take_more(&pj->job, batch_accept, &room, more, PERSIST_BATCH_MAX - 1);

    jobs[0] = pj;
    for (size_t i = 1; i < n; i++)
        jobs[i] = (struct pjob *)more[i - 1];
    for (size_t i = 0; i < n; i++) {
        jobs[i]->err[0] = '\0';
        jobs[i]->ndeleted = 0;
        jobs[i]->kind = -1;
    }
    return n;
}

/* The batch's items, one per job that can go (a device block is copied to
 * the worker's host buffer first, back to back; one that cannot be fails
 * now). The item count. */
static size_t job_batch_items(struct pjob **jobs, size_t n, struct pworker *w, struct kvs_item *items)
{
    bool write = jobs[0]->op == PERSIST_OP_WRITE;
    size_t m = 0, bounce_need = 0, at = 0;

    for (size_t i = 0; i < n; i++)
        if (write && jobs[i]->dm)
            bounce_need += jobs[i]->len;
    if (bounce_need > w->bounce_len) {
        void *b = realloc(w->bounce, bounce_need);
        if (b) {
            w->bounce = b;
            w->bounce_len = bounce_need;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct pjob *j = jobs[i];
        const void *src = j->wdata;
        if (write && j->dm) {
            if (w->bounce_len < at + j->len) {
                snprintf(j->err, sizeof j->err, "out of memory for a %zu-byte copy of an HBM block",
                         j->len);
                src = NULL;
            } else if (devmem_copy_to_host(j->dm, j->device, (uint8_t *)w->bounce + at, j->wdata,
                                           j->len, j->err, sizeof j->err) < 0) {
                src = NULL;
            } else {
                src = (uint8_t *)w->bounce + at;
                at += j->len;
            }
        }
        if (write && !src) {
            j->rc = -KVNODE_EIO;
            j->kind = persist_failure_kind(j->rc);
            continue;
        }
        if (!write)
            populate_touch(j->rdata, j->len);
        items[m++] = (struct kvs_item){ .ns = &j->ns, .key = j->key, .check = j->check, .src = src,
                                        .dst = j->rdata, .len = j->len };
        j->rc = INT_MIN;   /* in the batch: set by job_batch_results */
    }
    return m;
}

/* Each job in the batch takes its item's result (err: the call's message);
 * the worker reopens its handle after a connection-level failure. */
static void job_batch_results(struct pjob **jobs, size_t n, const struct kvs_item *items, int rc,
                              const char *err, struct pworker *w)
{
    bool reopen = needs_reopen(rc);

    for (size_t i = 0, k = 0; i < n; i++) {
        struct pjob *j = jobs[i];
        if (j->rc != INT_MIN)
            continue;
        j->rc = items[k++].rc;
        if (j->rc < 0) {
            j->kind = persist_failure_kind(j->rc);
            snprintf(j->err, sizeof j->err, "%s", err);
            reopen = reopen || needs_reopen(j->rc);
        } else if (j->rc == KVS_CORRUPT) {
            snprintf(j->err, sizeof j->err, "%s", err);
        }
    }
    w->reopen = reopen;
}

/* Run a write or read with the queued ones that can join it as one backend
 * batch (put_batch / get_batch): every job keeps its own result. */
static void job_run_batch(struct pjob *pj, struct pworker *w)
{
    const struct kvs_backend *be = pj->p->be;
    struct pjob *jobs[PERSIST_BATCH_MAX];
    struct kvs_item items[PERSIST_BATCH_MAX];
    bool write = pj->op == PERSIST_OP_WRITE;
    size_t n = job_batch_take(pj, jobs);
    size_t m = job_batch_items(jobs, n, w, items);
    char err[PERSIST_ERR_MAX] = "";

    if (write && m > 0 && pj->p->sim_write_delay_ms) {
        struct timespec ts = { .tv_sec = pj->p->sim_write_delay_ms / 1000,
                               .tv_nsec = (long)(pj->p->sim_write_delay_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    int rc = m == 0 ? 0 : write ? be->put_batch(w->s, items, m, err, sizeof err)
                                : be->get_batch(w->s, items, m, err, sizeof err);
    job_batch_results(jobs, n, items, rc, err, w);
}

void persist_job_run(struct workq_job *j, void *ctx)
{
    struct pjob *pj = (struct pjob *)j;
    struct pworker *w = ctx;
    const struct persist *p = pj->p;
    const struct kvs_backend *be = p->be;
    int rc;

    pj->err[0] = '\0';
    pj->ndeleted = 0;
    pj->kind = -1;
    if (!w->s || w->reopen) {
        if (w->s)
            be->close(w->s);
        w->s = NULL;
        w->reopen = false;
        rc = be->open(&p->kcfg, &w->s, pj->err, sizeof pj->err);
        if (rc < 0) {
            w->s = NULL;
            pj->rc = rc;
            pj->kind = PERSIST_FAIL_UNAVAILABLE;
            return;
        }
    }
    if ((pj->op == PERSIST_OP_WRITE && be->put_batch) ||
        (pj->op == PERSIST_OP_READ && be->get_batch)) {
        job_run_batch(pj, w);
        return;
    }
    switch (pj->op) {
    case PERSIST_OP_WRITE: {
        const void *src = job_write_source(pj, w);
        rc = src ? be->put(w->s, &pj->ns, pj->key, pj->check, src, pj->len, pj->err, sizeof pj->err)
                 : -KVNODE_EIO;
        break;
    }
    case PERSIST_OP_READ:
        populate_touch(pj->rdata, pj->len);
        rc = be->get(w->s, &pj->ns, pj->key, pj->check, pj->rdata, pj->len, pj->err, sizeof pj->err);
        break;
    case PERSIST_OP_DELETE:
        rc = 0;
        /* A store that keeps deleted blocks has nothing to be told: the
         * loop hid the keys when they were deleted (persist_hide). */
        if (be->keeps_deleted)
            break;
        if (pj->purge_all) {
            rc = be->purge(w->s, &pj->ns, &pj->ndeleted, pj->err, sizeof pj->err);
            break;
        }
        /* Stop at the first failure: a store that is down would only make
         * every remaining key wait for its own timeout. */
        for (size_t i = 0; i < pj->n && rc == 0; i++)
            if ((rc = be->del(w->s, &pj->ns, pj->keys[i], pj->checks[i], pj->err, sizeof pj->err)) == 0)
                pj->ndeleted++;
        break;
    case PERSIST_OP_EXISTS:
        rc = be->exists(w->s, &pj->ns, pj->keys, pj->checks, pj->n, pj->wpresent, pj->err,
                        sizeof pj->err);
        break;
    case PERSIST_OP_HEALTH:
        rc = be->health(w->s, pj->err, sizeof pj->err);
        break;
    default:
        rc = -KVNODE_EINTERNAL;
        break;
    }
    pj->rc = rc;
    if (rc < 0)
        pj->kind = persist_failure_kind(rc);
    w->reopen = needs_reopen(rc);
}

/* Apply a finished job's result to the counters and the state. */
static void account(struct persist *p, const struct pjob *pj)
{
    p->c.deleted_keys += pj->ndeleted;
    if (pj->rc < 0) {
        persist_state_failed(p, pj->op, pj->rc, pj->kind, pj->err);
        return;
    }
    switch (pj->rc) {
    case 0:
        if (pj->op == PERSIST_OP_WRITE) {
            p->c.written_blocks++;
            p->c.written_bytes += pj->len;
        } else if (pj->op == PERSIST_OP_READ) {
            p->c.read_blocks++;
            p->c.read_bytes += pj->len;
        }
        persist_state_ok(p, pj->op);
        break;
    case KVS_MISS:
        if (pj->op == PERSIST_OP_READ)
            p->c.read_misses++;
        persist_state_ok(p, pj->op);
        break;
    case KVS_CORRUPT:
        /* The store answered (and removed the bad copy): counted, the state stays. */
        persist_state_failed(p, pj->op, pj->rc, PERSIST_FAIL_CORRUPT, pj->err);
        break;
    default:
        persist_state_failed(p, pj->op, -KVNODE_EINTERNAL, PERSIST_FAIL_IO, "unexpected backend result");
        break;
    }
}

void persist_job_done(struct workq_job *j)
{
    struct pjob *pj = (struct pjob *)j;
    struct persist *p = pj->p;

    /* Another check word's block is another prefix's: a miss for this one. */
    if (!j->cancelled && pj->op == PERSIST_OP_READ && pj->rc == KVS_MISMATCH) {
        pj->rc = KVS_MISS;
        p->c.check_mismatches++;
    }
    if (!j->cancelled && pj->op == PERSIST_OP_EXISTS && pj->rc == 0)
        for (size_t i = 0; i < pj->n; i++)
            if (pj->wpresent[i] == KVS_PRESENT_OTHER_WORD) {
                pj->wpresent[i] = KVS_ABSENT;
                p->c.check_mismatches++;
            }
    /* A key deleted since (or before) the store was asked stays deleted,
     * whatever the store still holds. */
    if (!j->cancelled && pj->op == PERSIST_OP_READ && pj->rc == 0 &&
        persist_tomb_hidden(p, &pj->ns, pj->key, pj->check)) {
        pj->rc = KVS_MISS;
        p->c.tombstone_hits++;
    }
    if (!j->cancelled && pj->op == PERSIST_OP_EXISTS && pj->rc == 0 && p->c.tombstones)
        for (size_t i = 0; i < pj->n; i++)
            if (pj->wpresent[i] && persist_tomb_hidden(p, &pj->ns, pj->keys[i], pj->checks[i])) {
                pj->wpresent[i] = 0;
                p->c.tombstone_hits++;
            }

    int rc = j->cancelled ? -KVNODE_ESHUTDOWN : pj->rc;

    if (!j->cancelled) {
        account(p, pj);
        if (pj->op == PERSIST_OP_HEALTH || pj->probe)
            persist_probe_result(p, pj->probe ? PERSIST_PROBE_WRITE : PERSIST_PROBE_HEALTH, pj->rc);
    }
    if (pj->op == PERSIST_OP_HEALTH) {   /* p->health: not malloc'ed, no callback */
        p->health_busy = false;
        return;
    }
    if (pj->op == PERSIST_OP_EXISTS) {
        if (rc == 0)
            memcpy(pj->present, pj->wpresent, pj->n);
        else
            memset(pj->present, 0, pj->n);
    }
    p->c.completed++;
    persist_done_fn done = pj->done;
    void *arg = pj->arg;
    free(pj);
    if (done)
        done(arg, rc);
}
