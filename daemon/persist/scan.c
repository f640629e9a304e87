/* persist scan: the recovery scan — one "persist-scan" thread with its own
 * handle reads the store in chunks of PERSIST_SCAN_BUDGET blocks; each
 * chunk's blocks reach the loop (found) while the next is read, and the
 * thread is let go once the scan ended (see persist_scan_start in
 * persist.h). */
#include "persist/persist_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "core/log.h"

#define PERSIST_SCAN_BUDGET  4096u   /* blocks per scan chunk */
#define PERSIST_SCAN_QUEUE   2u

/* The scan thread's context: one handle for the whole scan, because a
 * cursor belongs to the handle that started it. */
struct pscan_thread {
    struct kvs_store *s;
    struct kvs_scan  *cursor;
};

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
        sj->kind = persist_failure_kind(rc);
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
        persist_state_failed(p, PERSIST_OP_SCAN, rc, sj->kind, sj->err);
        scan_finish(p, rc);
        return;
    }
    persist_state_ok(p, PERSIST_OP_SCAN);
    if (rc == 1) {
        p->c.scan_complete = true;
        scan_finish(p, 0);
        return;
    }
    if ((rc = workq_submit(p->scan_q, &sj->job)) < 0)
        scan_finish(p, rc);
}

void persist_scan_reap_cb(evutil_socket_t fd, short what, void *arg)
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
    rc = workq_create_hooks(p->base, p->scan_qname, 1, PERSIST_SCAN_QUEUE, &hooks, &p->scan_q,
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
