/* persist: the persistence worker pool — see persist.h.
 *
 * Built on workq (workq.h): one queue "persist" of [persist] workers threads
 * for the requests and health probes, and, once persist_scan_start is
 * called, a queue "persist-scan" of one thread for the recovery scan.
 *
 * Ownership and threads. A request is a malloc'ed struct pjob embedding its
 * workq_job. run() executes on a worker and touches only the job and the
 * thread's own context (struct pworker: its kvs_store handle); the struct
 * persist fields it reads (be, kcfg) are written once before the threads
 * start and never again. done() executes on the loop: it moves the job's
 * results into the counters, the state and last_error, runs the caller's
 * callback and frees the job. So counters need no lock or atomic: only the
 * loop touches them. The health job and the scan job are embedded in struct
 * persist (at most one of each is outstanding) and follow the same rule.
 *
 * Reopen rule (worker threads). A thread's handle is (re)opened before a
 * job runs when it is NULL (the open at thread start failed: store down) or
 * when the thread's previous call failed with -KVNODE_ECLOSED,
 * -KVNODE_ECONNECT or -KVNODE_EIO (the connection, or the handle, may be
 * dead). A failed (re)open fails the job as PERSIST_FAIL_UNAVAILABLE with
 * the open's message; the next job tries again. Nothing else reopens.
 *
 * State. OK after a call that reached the store succeeded (0 or KVS_MISS);
 * but after a failed write only a successful write (or the cache saying no
 * failed write waits for a retry: persist_write_failures_settled) ends
 * DEGRADED, because a store that answers probes and reads can still refuse
 * writes (a full disk). DEGRADED after a failure of any kind but CORRUPT (the store answered) —
 * except -KVNODE_EINVAL and -KVNODE_ENOMEM, which are the caller's or this
 * process's problem, not the store's: they are counted (as IO) but leave the
 * state alone. While DEGRADED, a 2 s timer on the loop submits a health job
 * (one at a time), so the state returns to OK when the store comes back even
 * with no traffic. Health probes are not requests: they are not counted in
 * submitted/completed (but occupy a queue slot while outstanding).
 *
 * Batching. A backend with put_batch / get_batch (v6d) gets a worker's
 * queued writes (reads) in one call: the worker that takes a write takes
 * the writes queued right behind it as well (workq_take_more, stopping at
 * the first job of another kind, so the queue's order holds), up to
 * PERSIST_BATCH_MAX blocks and PERSIST_BATCH_BYTES; each job keeps its own
 * result, counters and callback.
 *
 * Tombstones. A backend that keeps deleted blocks (keeps_deleted: v6d)
 * cannot be told to forget a key, so persist_hide remembers deleted keys
 * (bounded FIFO, struct tombs) and job_done hides them from the results of
 * lookups and reads, also of those already under way; a write submitted
 * later (a re-put) forgets the tombstone.
 *
 * Callbacks (done, found, finished) run from workq's completion handler on
 * the loop: they may submit requests but must not call persist_destroy
 * (workq_destroy cannot run inside a done() of its own queue). */
#include "persist/persist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <event2/event.h>

#include "core/clock.h"
#include "gpu/devmem.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "core/log.h"
#include "core/workq.h"

#define PERSIST_ERR_MAX      512
#define PERSIST_HEALTH_MS    2000u   /* health probe period while degraded */
#define PERSIST_SCAN_BUDGET  4096u   /* blocks per scan chunk */
#define PERSIST_SCAN_QUEUE   2u
#define PERSIST_BATCH_MAX    64u           /* blocks per batched store call */
#define PERSIST_BATCH_BYTES  (16u << 20)   /* bytes per batch (a device batch's bounce copy) */

/* One request (or the health probe). */
struct pjob {
    struct workq_job job;          /* first: the workq hands this pointer back */
    struct persist  *p;
    int              op;           /* enum persist_op */
    struct kvs_ns    ns;
    int64_t          key;
    const void      *wdata;        /* write: the caller's */
    struct devmem   *dm;           /* write: wdata is device memory of dm's `device` */
    int              device;
    void            *rdata;        /* read: the caller's, filled by the worker */
    size_t           len;
    size_t           n;            /* delete/exists */
    int64_t         *keys;         /* copies, allocated with the job */
    uint8_t         *present;      /* exists: the caller's, filled on the loop in done() */
    uint8_t         *wpresent;     /* exists: the worker's, allocated with the job */
    persist_done_fn  done;
    void            *arg;
    /* results, written by run() and read by done() */
    int              rc;
    int              kind;         /* enum persist_failure_kind when rc < 0 */
    uint64_t         ndeleted;     /* delete: keys the store's del returned 0 for */
    char             err[PERSIST_ERR_MAX];
};

/* The recovery scan's chunk job (one, reused for every chunk). */
struct pscan_job {
    struct workq_job  job;         /* first */
    struct persist   *p;
    struct kvs_found *v;           /* this chunk's blocks (the array is kept across chunks) */
    size_t            n, cap;
    bool              oom;
    int               rc;          /* the backend's scan result, or < 0 */
    int               kind;
    char              err[PERSIST_ERR_MAX];
};

/* A request worker's context. */
struct pworker {
    struct kvs_store *s;           /* NULL: not open (store down) */
    bool              reopen;      /* the last call failed at the connection level */
    void             *bounce;      /* host copy of a device block being written */
    size_t            bounce_len;
};

/* The scan thread's context: one handle for the whole scan, because a
 * cursor belongs to the handle that started it. */
struct pscan_thread {
    struct kvs_store *s;
    struct kvs_scan  *cursor;
};

/* Tombstones (loop thread): keys deleted while the store keeps them
 * (keeps_deleted). An open-addressing table (linear probing, power-of-two
 * size >= 2 x cap) says whether a key is hidden; a FIFO ring of cap entries
 * remembers the order they came in, so the oldest is forgotten when a new
 * one needs room. A re-put removes the key from the table only; its ring
 * entry stays until its turn and is then skipped (seq differs or absent). */
struct tomb {
    uint64_t fp;                   /* deployment fingerprint */
    int64_t  key;
    uint64_t seq;                  /* 0: empty slot (table) */
    uint32_t rank;                 /* tp_rank */
};

struct tombs {
    struct tomb *table, *ring;
    size_t       tsize, cap;       /* table slots (power of two); ring entries (the bound) */
    size_t       head, count;      /* ring: oldest entry, entries */
    uint64_t     seq;
};

struct persist {
    struct event_base        *base;
    const struct kvs_backend *be;
    struct kvs_config         kcfg;        /* strings point at the copies below */
    char                      path[PATH_MAX];
    char                      url[CONFIG_URL_MAX];
    char                      sock[PATH_MAX];
    char                      object_ns[CONFIG_OBJECT_NS_MAX];
    int                       lookup;      /* CONFIG_LOOKUP_* */
    unsigned                  workers;
    size_t                    capacity;

    struct workq             *q;
    struct event             *health_ev;   /* EV_PERSIST timer, pending while degraded */
    struct pjob               health;
    bool                      health_busy;

    struct workq             *scan_q;
    struct event             *scan_reap_ev; /* destroys scan_q after the scan ended */
    struct pscan_job          scan;
    bool                      scan_started;
    persist_found_fn          scan_found_fn;
    persist_done_fn           scan_finished_fn;
    void                     *scan_arg;

    struct tombs              tombs;

    bool                      destroying;
    bool                      writes_failing;  /* the last write failed (see State) */
    struct persist_counters   c;
    char                      last_error[PERSIST_ERR_MAX];
};

/* --- names --------------------------------------------------------------------- */

const char *persist_state_name(int state)
{
    switch (state) {
    case PERSIST_STATE_OFF: return "off";
    case PERSIST_STATE_OK: return "ok";
    case PERSIST_STATE_DEGRADED: return "degraded";
    default: return "unknown";
    }
}

const char *persist_failure_kind_name(int kind)
{
    static const char *const names[PERSIST_FAIL_KINDS] = {
        [PERSIST_FAIL_TIMEOUT] = "timeout",         [PERSIST_FAIL_NOSPACE] = "nospace",
        [PERSIST_FAIL_CORRUPT] = "corrupt",         [PERSIST_FAIL_UNAVAILABLE] = "unavailable",
        [PERSIST_FAIL_PROTOCOL] = "protocol",       [PERSIST_FAIL_IO] = "io",
    };
    return kind >= 0 && kind < PERSIST_FAIL_KINDS ? names[kind] : "unknown";
}

const char *persist_op_name(int op)
{
    static const char *const names[PERSIST_OPS] = {
        [PERSIST_OP_WRITE] = "write",   [PERSIST_OP_READ] = "read",
        [PERSIST_OP_DELETE] = "delete", [PERSIST_OP_EXISTS] = "exists",
        [PERSIST_OP_SCAN] = "scan",     [PERSIST_OP_HEALTH] = "health",
    };
    return op >= 0 && op < PERSIST_OPS ? names[op] : "unknown";
}

/* The failure kind of a backend call's negative result. */
static int failure_kind(int rc)
{
    switch (rc) {
    case -KVNODE_ETIMEDOUT: return PERSIST_FAIL_TIMEOUT;
    case -KVNODE_ENOSPC: return PERSIST_FAIL_NOSPACE;
    case -KVNODE_ECONNECT:
    case -KVNODE_ECLOSED: return PERSIST_FAIL_UNAVAILABLE;
    case -KVNODE_EPROTO: return PERSIST_FAIL_PROTOCOL;
    default: return PERSIST_FAIL_IO;
    }
}

/* Connection-level failures after which the thread reopens its handle. */
static bool needs_reopen(int rc)
{
    return rc == -KVNODE_ECLOSED || rc == -KVNODE_ECONNECT || rc == -KVNODE_EIO;
}

/* --- tombstones (loop thread) ------------------------------------------------------- */

static size_t tomb_slot(const struct tombs *t, uint64_t fp, uint32_t rank, int64_t key)
{
    uint64_t h = fp ^ ((uint64_t)rank << 32) ^ ((uint64_t)key * UINT64_C(0x9e3779b97f4a7c15));
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return (size_t)h & (t->tsize - 1);
}

/* The table slot of the key, or SIZE_MAX. */
static size_t tomb_find(const struct tombs *t, uint64_t fp, uint32_t rank, int64_t key)
{
    if (!t->table)
        return SIZE_MAX;
    for (size_t i = tomb_slot(t, fp, rank, key);; i = (i + 1) & (t->tsize - 1)) {
        const struct tomb *e = &t->table[i];
        if (!e->seq)
            return SIZE_MAX;
        if (e->fp == fp && e->rank == rank && e->key == key)
            return i;
    }
}

/* Empty slot i, shifting back the entries of its probe run (no markers). */
static void tomb_erase(struct tombs *t, size_t i)
{
    size_t mask = t->tsize - 1;
    for (;;) {
        t->table[i].seq = 0;
        size_t j = i;
        for (;;) {
            j = (j + 1) & mask;
            if (!t->table[j].seq)
                return;
            size_t h = tomb_slot(t, t->table[j].fp, t->table[j].rank, t->table[j].key);
            /* j stays when its home h lies cyclically in (i, j] */
            if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
                continue;
            t->table[i] = t->table[j];
            i = j;
            break;
        }
    }
}

static bool tomb_hidden(const struct persist *p, const struct kvs_ns *ns, int64_t key)
{
    return p->c.tombstones &&
           tomb_find(&p->tombs, ns->fingerprint, ns->layout->tp_rank, key) != SIZE_MAX;
}

static void tomb_add(struct persist *p, uint64_t fp, uint32_t rank, int64_t key)
{
    struct tombs *t = &p->tombs;
    if (!t->table) {
        size_t tsize = 16;
        while (tsize < 2 * t->cap)
            tsize *= 2;
        t->table = calloc(tsize, sizeof *t->table);
        t->ring = calloc(t->cap, sizeof *t->ring);
        if (!t->table || !t->ring) {
            free(t->table);
            free(t->ring);
            t->table = t->ring = NULL;
            p->c.tombstones_dropped++;
            return;
        }
        t->tsize = tsize;
    }
    if (tomb_find(t, fp, rank, key) != SIZE_MAX)
        return;
    if (t->count == t->cap) {   /* forget the oldest */
        const struct tomb *old = &t->ring[t->head];
        size_t i = tomb_find(t, old->fp, old->rank, old->key);
        if (i != SIZE_MAX && t->table[i].seq == old->seq) {
            tomb_erase(t, i);
            p->c.tombstones--;
            p->c.tombstones_dropped++;
        }
        t->head = (t->head + 1) % t->cap;
        t->count--;
    }
    struct tomb e = { .fp = fp, .key = key, .seq = ++t->seq, .rank = rank };
    t->ring[(t->head + t->count) % t->cap] = e;
    t->count++;
    size_t i = tomb_slot(t, fp, rank, key);
    while (t->table[i].seq)
        i = (i + 1) & (t->tsize - 1);
    t->table[i] = e;
    p->c.tombstones++;
}

static void tomb_remove(struct persist *p, const struct kv_namespace *ns, int64_t key)
{
    if (!p->c.tombstones)
        return;
    size_t i = tomb_find(&p->tombs, ns->fingerprint, ns->layout.tp_rank, key);
    if (i != SIZE_MAX) {
        tomb_erase(&p->tombs, i);
        p->c.tombstones--;
    }
}

void persist_hide(struct persist *p, const struct kv_namespace *ns, const int64_t *keys, size_t n)
{
    if (!p || !ns || !p->be->keeps_deleted || p->tombs.cap == 0)
        return;
    for (size_t i = 0; i < n; i++)
        tomb_add(p, ns->fingerprint, ns->layout.tp_rank, keys[i]);
}

/* --- state (loop thread) --------------------------------------------------------- */

static void health_arm(struct persist *p)
{
    struct timeval tv = { PERSIST_HEALTH_MS / 1000u, (PERSIST_HEALTH_MS % 1000u) * 1000 };
    if (!p->destroying && !event_pending(p->health_ev, EV_TIMEOUT, NULL))
        event_add(p->health_ev, &tv);
}

static void state_ok(struct persist *p, int op)
{
    if (op == PERSIST_OP_WRITE)
        p->writes_failing = false;
    else if (p->writes_failing)
        return;   /* the store answers, but the last write it got failed */
    p->last_error[0] = '\0';
    if (p->c.state == PERSIST_STATE_DEGRADED)
        log_info("persist: the %s store answers again", p->be->name);
    p->c.state = PERSIST_STATE_OK;
    event_del(p->health_ev);
}

static void state_failed(struct persist *p, int op, int rc, int kind, const char *err)
{
    p->c.failures[op][kind]++;
    snprintf(p->last_error, sizeof p->last_error, "%s: %s", persist_op_name(op),
             err && *err ? err : kvnode_strerror(rc));
    if (kind == PERSIST_FAIL_CORRUPT || rc == -KVNODE_EINVAL || rc == -KVNODE_ENOMEM)
        return;   /* not the store's health: see the header comment */
    if (op == PERSIST_OP_WRITE)
        p->writes_failing = true;
    if (p->c.state != PERSIST_STATE_DEGRADED)
        log_warn("persist: the %s store is degraded: %s", p->be->name, p->last_error);
    p->c.state = PERSIST_STATE_DEGRADED;
    health_arm(p);
}

void persist_write_failures_settled(struct persist *p)
{
    if (!p || !p->writes_failing)
        return;
    p->writes_failing = false;
    health_arm(p);   /* the next probe decides */
}

/* --- request workers --------------------------------------------------------------- */

static int worker_init(void *arg, unsigned idx, void **ctx)
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

static void worker_fini(void *arg, void *ctx)
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

/* Run a write or read with the queued ones that can join it as one backend
 * batch (put_batch / get_batch): every job keeps its own result. */
static void job_run_batch(struct pjob *pj, struct pworker *w)
{
    const struct kvs_backend *be = pj->p->be;
    struct workq_job *more[PERSIST_BATCH_MAX - 1];
    struct pjob *jobs[PERSIST_BATCH_MAX];
    struct kvs_item items[PERSIST_BATCH_MAX];
    struct batch_room room = { pj->len };
    size_t n = 1 + workq_take_more(&pj->job, batch_accept, &room, more, PERSIST_BATCH_MAX - 1);
    bool write = pj->op == PERSIST_OP_WRITE;
    size_t m = 0, bounce_need = 0;

    jobs[0] = pj;
    for (size_t i = 1; i < n; i++)
        jobs[i] = (struct pjob *)more[i - 1];
    for (size_t i = 0; i < n; i++) {
        jobs[i]->err[0] = '\0';
        jobs[i]->ndeleted = 0;
        jobs[i]->kind = -1;
        if (write && jobs[i]->dm)
            bounce_need += jobs[i]->len;
    }
    /* Device blocks are copied to host memory first, back to back. */
    if (bounce_need > w->bounce_len) {
        void *b = realloc(w->bounce, bounce_need);
        if (b) {
            w->bounce = b;
            w->bounce_len = bounce_need;
        }
    }
    size_t at = 0;
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
            j->kind = failure_kind(j->rc);
            continue;
        }
        items[m++] = (struct kvs_item){ .ns = &j->ns, .key = j->key, .src = src, .dst = j->rdata,
                                        .len = j->len };
        j->rc = INT_MIN;   /* in the batch: set below */
    }
    char err[PERSIST_ERR_MAX] = "";
    int rc = m == 0 ? 0 : write ? be->put_batch(w->s, items, m, err, sizeof err)
                                : be->get_batch(w->s, items, m, err, sizeof err);
    bool reopen = needs_reopen(rc);
    for (size_t i = 0, k = 0; i < n; i++) {
        struct pjob *j = jobs[i];
        if (j->rc != INT_MIN)
            continue;
        j->rc = items[k++].rc;
        if (j->rc < 0) {
            j->kind = failure_kind(j->rc);
            snprintf(j->err, sizeof j->err, "%s", err);
            reopen = reopen || needs_reopen(j->rc);
        } else if (j->rc == KVS_CORRUPT) {
            snprintf(j->err, sizeof j->err, "%s", err);
        }
    }
    w->reopen = reopen;
}

static void job_run(struct workq_job *j, void *ctx)
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
        rc = src ? be->put(w->s, &pj->ns, pj->key, src, pj->len, pj->err, sizeof pj->err)
                 : -KVNODE_EIO;
        break;
    }
    case PERSIST_OP_READ:
        rc = be->get(w->s, &pj->ns, pj->key, pj->rdata, pj->len, pj->err, sizeof pj->err);
        break;
    case PERSIST_OP_DELETE:
        rc = 0;
        /* A store that keeps deleted blocks has nothing to be told: the
         * loop hid the keys when they were deleted (persist_hide). */
        if (be->keeps_deleted)
            break;
        /* Stop at the first failure: a store that is down would only make
         * every remaining key wait for its own timeout. */
        for (size_t i = 0; i < pj->n && rc == 0; i++)
            if ((rc = be->del(w->s, &pj->ns, pj->keys[i], pj->err, sizeof pj->err)) == 0)
                pj->ndeleted++;
        break;
    case PERSIST_OP_EXISTS:
        rc = be->exists(w->s, &pj->ns, pj->keys, pj->n, pj->wpresent, pj->err, sizeof pj->err);
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
        pj->kind = failure_kind(rc);
    w->reopen = needs_reopen(rc);
}

/* Apply a finished job's result to the counters and the state. */
static void account(struct persist *p, const struct pjob *pj)
{
    p->c.deleted_keys += pj->ndeleted;
    if (pj->rc < 0) {
        state_failed(p, pj->op, pj->rc, pj->kind, pj->err);
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
        state_ok(p, pj->op);
        break;
    case KVS_MISS:
        if (pj->op == PERSIST_OP_READ)
            p->c.read_misses++;
        state_ok(p, pj->op);
        break;
    case KVS_CORRUPT:
        /* The store answered (and removed the bad copy): counted, the state stays. */
        state_failed(p, pj->op, pj->rc, PERSIST_FAIL_CORRUPT, pj->err);
        break;
    default:
        state_failed(p, pj->op, -KVNODE_EINTERNAL, PERSIST_FAIL_IO, "unexpected backend result");
        break;
    }
}

static void job_done(struct workq_job *j)
{
    struct pjob *pj = (struct pjob *)j;
    struct persist *p = pj->p;

    /* A key deleted since (or before) the store was asked stays deleted,
     * whatever the store still holds. */
    if (!j->cancelled && pj->op == PERSIST_OP_READ && pj->rc == 0 &&
        tomb_hidden(p, &pj->ns, pj->key)) {
        pj->rc = KVS_MISS;
        p->c.tombstone_hits++;
    }
    if (!j->cancelled && pj->op == PERSIST_OP_EXISTS && pj->rc == 0 && p->c.tombstones)
        for (size_t i = 0; i < pj->n; i++)
            if (pj->wpresent[i] && tomb_hidden(p, &pj->ns, pj->keys[i])) {
                pj->wpresent[i] = 0;
                p->c.tombstone_hits++;
            }

    int rc = j->cancelled ? -KVNODE_ESHUTDOWN : pj->rc;

    if (!j->cancelled)
        account(p, pj);
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

static void health_cb(evutil_socket_t fd, short what, void *arg)
{
    struct persist *p = arg;

    (void)fd;
    (void)what;
    if (p->destroying || p->c.state != PERSIST_STATE_DEGRADED) {
        event_del(p->health_ev);
        return;
    }
    if (p->health_busy)
        return;
    memset(&p->health, 0, sizeof p->health);
    p->health.job.run = job_run;
    p->health.job.done = job_done;
    p->health.p = p;
    p->health.op = PERSIST_OP_HEALTH;
    /* A full queue is traffic: its results update the state anyway. */
    if (workq_submit(p->q, &p->health.job) == 0)
        p->health_busy = true;
}

/* --- requests (loop thread) ---------------------------------------------------------- */

/* A zeroed job with room for n keys (and n presence bytes when exists). */
static struct pjob *job_new(struct persist *p, int op, const struct kv_namespace *ns, size_t n,
                            persist_done_fn done, void *arg)
{
    size_t extra = n * sizeof(int64_t) + (op == PERSIST_OP_EXISTS ? n : 0);
    struct pjob *pj = calloc(1, sizeof *pj + extra);

    if (!pj)
        return NULL;
    pj->job.run = job_run;
    pj->job.done = job_done;
    pj->p = p;
    pj->op = op;
    /* The worker reads only layout and deployment_id, which never change
     * once the namespace exists; its counters are the loop's. */
    pj->ns.layout = &ns->layout;
    pj->ns.fingerprint = ns->fingerprint;
    pj->ns.deployment_id = ns->deployment_id;
    pj->n = n;
    if (n) {
        pj->keys = (int64_t *)(pj + 1);
        if (op == PERSIST_OP_EXISTS)
            pj->wpresent = (uint8_t *)(pj->keys + n);
    }
    pj->done = done;
    pj->arg = arg;
    return pj;
}

static int job_submit(struct persist *p, struct pjob *pj)
{
    int rc = workq_submit(p->q, &pj->job);

    if (rc < 0) {
        if (rc == -KVNODE_ELIMIT)
            p->c.refused_queue_full++;
        free(pj);
        return rc;
    }
    p->c.submitted++;
    return 0;
}

static int check_request(const struct persist *p, const struct kv_namespace *ns)
{
    if (!p || !ns)
        return -KVNODE_EINVAL;
    if (p->destroying)
        return -KVNODE_ESHUTDOWN;
    return 0;
}

/* A write from host memory (dm NULL) or from device memory of dm. */
static int persist_write_from(struct persist *p, const struct kv_namespace *ns, int64_t key,
                              const void *data, size_t len, struct devmem *dm, int device,
                              persist_done_fn done, void *arg)
{
    int rc = check_request(p, ns);
    if (rc < 0)
        return rc;
    if (!data || !done)
        return -KVNODE_EINVAL;
    /* Put again after a delete: visible again (what the store then holds
     * under the key is this block, or one written before it, see v6d.h). */
    tomb_remove(p, ns, key);
    struct pjob *pj = job_new(p, PERSIST_OP_WRITE, ns, 0, done, arg);
    if (!pj)
        return -KVNODE_ENOMEM;
    pj->key = key;
    pj->wdata = data;
    pj->len = len;
    pj->dm = dm;
    pj->device = device;
    return job_submit(p, pj);
}

int persist_write(struct persist *p, const struct kv_namespace *ns, int64_t key, const void *data,
                  size_t len, persist_done_fn done, void *arg)
{
    return persist_write_from(p, ns, key, data, len, NULL, -1, done, arg);
}

int persist_write_device(struct persist *p, const struct kv_namespace *ns, int64_t key, const void *data,
                         size_t len, struct devmem *dm, int device, persist_done_fn done, void *arg)
{
    if (!dm)
        return -KVNODE_EINVAL;
    return persist_write_from(p, ns, key, data, len, dm, device, done, arg);
}

int persist_read(struct persist *p, const struct kv_namespace *ns, int64_t key, void *data, size_t len,
                 persist_done_fn done, void *arg)
{
    int rc = check_request(p, ns);
    if (rc < 0)
        return rc;
    if (!data || !done)
        return -KVNODE_EINVAL;
    struct pjob *pj = job_new(p, PERSIST_OP_READ, ns, 0, done, arg);
    if (!pj)
        return -KVNODE_ENOMEM;
    pj->key = key;
    pj->rdata = data;
    pj->len = len;
    return job_submit(p, pj);
}

int persist_delete(struct persist *p, const struct kv_namespace *ns, const int64_t *keys, size_t n,
                   persist_done_fn done, void *arg)
{
    int rc = check_request(p, ns);
    if (rc < 0)
        return rc;
    if (!keys || n == 0 || n > SIZE_MAX / 16)
        return -KVNODE_EINVAL;
    struct pjob *pj = job_new(p, PERSIST_OP_DELETE, ns, n, done, arg);
    if (!pj)
        return -KVNODE_ENOMEM;
    memcpy(pj->keys, keys, n * sizeof *keys);
    return job_submit(p, pj);
}

int persist_exists(struct persist *p, const struct kv_namespace *ns, const int64_t *keys, size_t n,
                   uint8_t *present, persist_done_fn done, void *arg)
{
    int rc = check_request(p, ns);
    if (rc < 0)
        return rc;
    if (!keys || !present || !done || n == 0 || n > SIZE_MAX / 16)
        return -KVNODE_EINVAL;
    struct pjob *pj = job_new(p, PERSIST_OP_EXISTS, ns, n, done, arg);
    if (!pj)
        return -KVNODE_ENOMEM;
    memcpy(pj->keys, keys, n * sizeof *keys);
    pj->present = present;
    return job_submit(p, pj);
}

/* --- recovery scan ------------------------------------------------------------------ */

static int scan_thread_init(void *arg, unsigned idx, void **ctx)
{
    const struct persist *p = arg;
    struct pscan_thread *t = calloc(1, sizeof *t);
    char e[PERSIST_ERR_MAX];

    (void)idx;
    if (!t)
        return -KVNODE_ENOMEM;
    if (p->be->open(&p->kcfg, &t->s, e, sizeof e) < 0)
        t->s = NULL;   /* the first chunk tries again */
    *ctx = t;
    return 0;
}

/* On the scan thread as it exits: a scan still running is abandoned here,
 * on the thread whose handle owns the cursor (budget 0 frees it). */
static void scan_thread_fini(void *arg, void *ctx)
{
    const struct persist *p = arg;
    struct pscan_thread *t = ctx;
    char e[PERSIST_ERR_MAX];

    if (!t)
        return;
    if (t->cursor && t->s)
        p->be->scan(t->s, &t->cursor, 0, NULL, NULL, e, sizeof e);
    if (t->s)
        p->be->close(t->s);
    free(t);
}

static void scan_collect(void *arg, const struct kvs_found *f)
{
    struct pscan_job *sj = arg;

    if (sj->n == sj->cap) {
        size_t cap = sj->cap ? sj->cap * 2 : 256;
        struct kvs_found *v = realloc(sj->v, cap * sizeof *v);
        if (!v) {
            sj->oom = true;
            return;
        }
        sj->v = v;
        sj->cap = cap;
    }
    sj->v[sj->n++] = *f;
}

static void scan_run(struct workq_job *j, void *ctx)
{
    struct pscan_job *sj = (struct pscan_job *)j;
    struct pscan_thread *t = ctx;
    const struct persist *p = sj->p;
    int rc;

    sj->n = 0;
    sj->oom = false;
    sj->err[0] = '\0';
    sj->kind = -1;
    if (!t->s) {
        rc = p->be->open(&p->kcfg, &t->s, sj->err, sizeof sj->err);
        if (rc < 0) {
            t->s = NULL;
            sj->rc = rc;
            sj->kind = PERSIST_FAIL_UNAVAILABLE;
            return;
        }
    }
    rc = p->be->scan(t->s, &t->cursor, PERSIST_SCAN_BUDGET, scan_collect, sj, sj->err,
                     sizeof sj->err);
    if (rc >= 0 && sj->oom) {
        rc = -KVNODE_ENOMEM;
        errmsg_set(sj->err, sizeof sj->err, "out of memory collecting found blocks");
    }
    if (rc < 0) {
        sj->kind = failure_kind(rc);
        if (t->cursor) {   /* the scan stops here: give the cursor back */
            char e[PERSIST_ERR_MAX];
            p->be->scan(t->s, &t->cursor, 0, NULL, NULL, e, sizeof e);
        }
    }
    sj->rc = rc;
}

static void scan_finish(struct persist *p, int rc)
{
    p->c.scan_running = false;
    p->c.scan_finished_ms = clock_now_ms();
    free(p->scan.v);
    p->scan.v = NULL;
    p->scan.n = p->scan.cap = 0;
    /* The thread and its handle are not needed any more; its queue cannot be
     * destroyed from inside its own done(), so on the next loop iteration. */
    if (!p->destroying)
        event_active(p->scan_reap_ev, EV_TIMEOUT, 0);
    if (p->scan_finished_fn)
        p->scan_finished_fn(p->scan_arg, rc);
}

static void scan_done(struct workq_job *j)
{
    struct pscan_job *sj = (struct pscan_job *)j;
    struct persist *p = sj->p;
    int rc = sj->rc;

    /* Stopping: no more found() calls, whatever this chunk read. */
    if (j->cancelled || p->destroying) {
        scan_finish(p, -KVNODE_ESHUTDOWN);
        return;
    }
    p->c.scan_found += sj->n;
    if (sj->n && p->scan_found_fn)
        p->scan_found_fn(p->scan_arg, sj->v, sj->n);
    sj->n = 0;
    if (rc < 0) {
        state_failed(p, PERSIST_OP_SCAN, rc, sj->kind, sj->err);
        scan_finish(p, rc);
        return;
    }
    state_ok(p, PERSIST_OP_SCAN);
    if (rc == 1) {
        p->c.scan_complete = true;
        scan_finish(p, 0);
        return;
    }
    if ((rc = workq_submit(p->scan_q, &sj->job)) < 0)
        scan_finish(p, rc);
}

static void scan_reap_cb(evutil_socket_t fd, short what, void *arg)
{
    struct persist *p = arg;

    (void)fd;
    (void)what;
    workq_destroy(p->scan_q);
    p->scan_q = NULL;
}

int persist_scan_start(struct persist *p, persist_found_fn found, persist_done_fn finished,
                       void *arg)
{
    const struct workq_thread_hooks hooks = { scan_thread_init, scan_thread_fini, p };
    char e[PERSIST_ERR_MAX];
    int rc;

    if (!p)
        return -KVNODE_EINVAL;
    if (p->destroying)
        return -KVNODE_ESHUTDOWN;
    if (p->scan_started)
        return -KVNODE_ESTATE;
    rc = workq_create_hooks(p->base, "persist-scan", 1, PERSIST_SCAN_QUEUE, &hooks, &p->scan_q,
                            e, sizeof e);
    if (rc < 0) {
        log_error("persist: cannot start the recovery scan: %s", e);
        return rc;
    }
    memset(&p->scan, 0, sizeof p->scan);
    p->scan.job.run = scan_run;
    p->scan.job.done = scan_done;
    p->scan.p = p;
    if ((rc = workq_submit(p->scan_q, &p->scan.job)) < 0) {
        workq_destroy(p->scan_q);
        p->scan_q = NULL;
        return rc;
    }
    p->scan_started = true;
    p->scan_found_fn = found;
    p->scan_finished_fn = finished;
    p->scan_arg = arg;
    p->c.scan_running = true;
    p->c.scan_complete = false;
    p->c.scan_found = 0;
    p->c.scan_started_ms = clock_now_ms();
    p->c.scan_finished_ms = 0;
    return 0;
}

/* --- lifetime ---------------------------------------------------------------------- */

static void persist_free(struct persist *p)
{
    free(p->tombs.table);
    free(p->tombs.ring);
    if (p->health_ev)
        event_free(p->health_ev);
    if (p->scan_reap_ev)
        event_free(p->scan_reap_ev);
    free(p->scan.v);
    free(p);
}

int persist_create(struct event_base *base, const struct kvn_config *cfg, struct persist **out,
                   char *err, size_t errlen)
{
    const char *name;
    char e[PERSIST_ERR_MAX] = "";
    struct kvs_store *probe = NULL;
    struct persist *p;
    int rc;

    if (out)
        *out = NULL;
    if (!base || !cfg || !out) {
        errmsg_set(err, errlen, "persist: invalid arguments");
        return -KVNODE_EINVAL;
    }
    switch (cfg->persist_backend) {
    case CONFIG_BACKEND_OFF: return 0;
    case CONFIG_BACKEND_FILE: name = "file"; break;
    case CONFIG_BACKEND_V6D: name = "v6d"; break;
    default:
        errmsg_set(err, errlen, "persist.backend: unknown backend %d", cfg->persist_backend);
        return -KVNODE_EINVAL;
    }
    const struct kvs_backend *be = kvs_backend_find(name);
    if (!be) {
        errmsg_set(err, errlen, "persist.backend %s: kvnoded was built without %s support", name,
                   name);
        return -KVNODE_EINVAL;
    }
    if (cfg->persist_workers == 0 || cfg->persist_workers > WORKQ_MAX_THREADS) {
        errmsg_set(err, errlen, "persist.workers: %u (must be 1..%u)", cfg->persist_workers,
                   WORKQ_MAX_THREADS);
        return -KVNODE_EINVAL;
    }
    if (cfg->persist_queue == 0) {
        errmsg_set(err, errlen, "persist.queue: 0 (must be at least 1)");
        return -KVNODE_EINVAL;
    }

    if (!(p = calloc(1, sizeof *p))) {
        errmsg_set(err, errlen, "persist: out of memory");
        return -KVNODE_ENOMEM;
    }
    p->base = base;
    p->be = be;
    p->lookup = cfg->persist_lookup;
    p->workers = cfg->persist_workers;
    p->capacity = cfg->persist_queue;
    /* Own copies: the config may be replaced by a reload while we run. */
    snprintf(p->path, sizeof p->path, "%s", cfg->persist_path);
    snprintf(p->url, sizeof p->url, "%s", cfg->persist_url);
    snprintf(p->sock, sizeof p->sock, "%s", cfg->persist_socket);
    snprintf(p->object_ns, sizeof p->object_ns, "%s", cfg->persist_object_namespace);
    p->tombs.cap = cfg->persist_tombstones;
    p->kcfg.backend = be->name;
    p->kcfg.path = p->path;
    p->kcfg.capacity_bytes = cfg->persist_capacity;
    p->kcfg.fsync_policy = cfg->persist_fsync;
    p->kcfg.url = p->url;
    p->kcfg.socket_path = p->sock;
    p->kcfg.object_namespace = p->object_ns;
    p->kcfg.connect_timeout_ms = cfg->persist_connect_timeout_ms;
    p->kcfg.timeout_ms = cfg->persist_timeout_ms;
    p->health_ev = event_new(base, -1, EV_PERSIST, health_cb, p);
    p->scan_reap_ev = event_new(base, -1, 0, scan_reap_cb, p);
    if (!p->health_ev || !p->scan_reap_ev) {
        persist_free(p);
        errmsg_set(err, errlen, "persist: cannot create the loop events");
        return -KVNODE_ENOMEM;
    }

    /* Probe once here so a bad file root fails the start with a clear message. */
    rc = be->open(&p->kcfg, &probe, e, sizeof e);
    if (rc < 0) {
        probe = NULL;
        if (be == &kvs_backend_file) {
            errmsg_set(err, errlen, "persist.path %s: %s", p->path, e);
            persist_free(p);
            return rc;
        }
        if (rc == -KVNODE_EINVAL) {   /* a configuration error, not a store that is down */
            errmsg_set(err, errlen, "persist: %s", e);
            persist_free(p);
            return rc;
        }
        log_warn("persist: the %s store (%s, socket %s) does not answer: %s; starting degraded, "
                 "the workers will retry", be->name, p->url, p->sock, e);
        p->c.failures[PERSIST_OP_HEALTH][PERSIST_FAIL_UNAVAILABLE]++;
        errmsg_set(p->last_error, sizeof p->last_error, "%s: %s",
                   persist_op_name(PERSIST_OP_HEALTH), e);
        p->c.state = PERSIST_STATE_DEGRADED;
    } else {
        p->c.state = PERSIST_STATE_OK;
    }

    const struct workq_thread_hooks hooks = { worker_init, worker_fini, p };
    rc = workq_create_hooks(base, "persist", p->workers, p->capacity, &hooks, &p->q, e, sizeof e);
    /* Closed only now that the workers hold their own handles, so a file
     * root stays held (locked, one LRU) from the probe on. */
    if (probe)
        be->close(probe);
    if (rc < 0) {
        errmsg_set(err, errlen, "persist: %s", e);
        persist_free(p);
        return rc;
    }
    if (p->c.state == PERSIST_STATE_DEGRADED)
        health_arm(p);
    log_info("persist: %s store, %u workers, queue %zu%s", be->name, p->workers, p->capacity,
             p->c.state == PERSIST_STATE_DEGRADED ? " (degraded)" : "");
    *out = p;
    return 0;
}

void persist_destroy(struct persist *p)
{
    if (!p)
        return;
    p->destroying = true;
    event_del(p->health_ev);
    /* The requests first (each destroy waits for its running job, so the
     * queued requests are taken before a scan chunk is waited for): those
     * that ran get their result, the queued ones -KVNODE_ESHUTDOWN. Then the
     * scan: its chunk job, if any, ends with finished(-KVNODE_ESHUTDOWN) and
     * the thread's fini hook frees the cursor. */
    workq_destroy(p->q);
    p->q = NULL;
    if (p->scan_q) {
        workq_destroy(p->scan_q);
        p->scan_q = NULL;
    }
    persist_free(p);
}

int persist_drain(struct persist *p, unsigned timeout_ms)
{
    /* The requests only: a scan is abandoned by persist_destroy, not waited for. */
    return p ? workq_drain(p->q, timeout_ms) : 0;
}

bool persist_enumerable(const struct persist *p)
{
    /* v6d keeps no layouts: its scan finds nothing */
    return p && strcmp(p->be->name, "v6d") != 0;
}

bool persist_lookup_on_miss(const struct persist *p)
{
    if (!p)
        return false;
    switch (p->lookup) {
    case CONFIG_LOOKUP_ON: return true;
    case CONFIG_LOOKUP_OFF: return false;
    default: return !persist_enumerable(p);
    }
}

const char *persist_backend_name(const struct persist *p)
{
    return p ? p->be->name : "off";
}

void persist_get_counters(const struct persist *p, struct persist_counters *out)
{
    if (!p) {
        memset(out, 0, sizeof *out);
        out->state = PERSIST_STATE_OFF;
        return;
    }
    *out = p->c;
    out->queue_depth = workq_pending(p->q);
    out->queue_capacity = p->capacity;
    out->workers = p->workers;
}

const char *persist_last_error(const struct persist *p)
{
    return p ? p->last_error : "";
}
