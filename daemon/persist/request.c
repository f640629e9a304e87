/* persist request: the requests the loop submits — write (from host or
 * device memory), read, delete, exists — each a job on the "persist" queue
 * (see persist.h for the contract, worker.c for how they run). Loop thread
 * only. */
#include "persist/persist_internal.h"

#include <stdlib.h>
#include <string.h>

#include "kvnode.h"

/* --- requests (loop thread) ---------------------------------------------------------- */

/* A zeroed job with room for n keys (and n presence bytes when exists). */
static struct pjob *job_new(struct persist *p, int op, const struct kv_namespace *ns, size_t n,
                            persist_done_fn done, void *arg)
{
    size_t extra = n * (sizeof(int64_t) + sizeof(uint64_t)) + (op == PERSIST_OP_EXISTS ? n : 0);
    struct pjob *pj = calloc(1, sizeof *pj + extra);

    if (!pj)
        return NULL;
    pj->job.run = persist_job_run;
    pj->job.done = persist_job_done;
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
        pj->checks = (uint64_t *)(pj->keys + n);
        if (op == PERSIST_OP_EXISTS)
            pj->wpresent = (uint8_t *)(pj->checks + n);
    }
    pj->done = done;
    pj->arg = arg;
    return pj;
}

/* The keys' check words into the job (NULL: every word 0; the job is zeroed). */
static void job_copy_checks(struct pjob *pj, const uint64_t *checks)
{
    if (checks)
        memcpy(pj->checks, checks, pj->n * sizeof *checks);
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
static int persist_write_from(struct persist *p, const struct persist_write_req *w, struct devmem *dm,
                              int device, bool probe)
{
    int rc = check_request(p, w->ns);
    if (rc < 0)
        return rc;
    if (!w->data || !w->done)
        return -KVNODE_EINVAL;
    /* Put again after a delete: visible again (what the store then holds
     * under the key is this block, or one written before it, see v6d.h). */
    persist_tomb_remove(p, w->ns, w->key, w->check);
    struct pjob *pj = job_new(p, PERSIST_OP_WRITE, w->ns, 0, w->done, w->arg);
    if (!pj)
        return -KVNODE_ENOMEM;
    pj->key = w->key;
    pj->check = w->check;
    pj->wdata = w->data;
    pj->len = w->len;
    pj->dm = dm;
    pj->device = device;
    pj->probe = probe;
    return job_submit(p, pj);
}

int persist_write(struct persist *p, const struct persist_write_req *w)
{
    return persist_write_from(p, w, NULL, -1, false);
}

int persist_write_probe(struct persist *p, const struct persist_write_req *w, struct devmem *dm,
                        int device)
{
    return persist_write_from(p, w, dm, dm ? device : -1, true);
}

int persist_write_device(struct persist *p, const struct persist_write_req *w, struct devmem *dm,
                         int device)
{
    if (!dm)
        return -KVNODE_EINVAL;
    return persist_write_from(p, w, dm, device, false);
}

int persist_read(struct persist *p, const struct persist_read_req *r)
{
    int rc = check_request(p, r->ns);
    if (rc < 0)
        return rc;
    if (!r->data || !r->done)
        return -KVNODE_EINVAL;
    struct pjob *pj = job_new(p, PERSIST_OP_READ, r->ns, 0, r->done, r->arg);
    if (!pj)
        return -KVNODE_ENOMEM;
    pj->key = r->key;
    pj->check = r->check;
    pj->rdata = r->data;
    pj->len = r->len;
    return job_submit(p, pj);
}

int persist_delete(struct persist *p, const struct kv_namespace *ns, const int64_t *keys,
                   const uint64_t *checks, size_t n, persist_done_fn done, void *arg)
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
    job_copy_checks(pj, checks);
    return job_submit(p, pj);
}

bool persist_can_purge(const struct persist *p)
{
    return p && p->be->purge;
}

int persist_purge(struct persist *p, const struct kv_namespace *ns, persist_done_fn done, void *arg)
{
    int rc = check_request(p, ns);
    if (rc < 0)
        return rc;
    if (!p->be->purge)
        return -KVNODE_EINVAL;
    struct pjob *pj = job_new(p, PERSIST_OP_DELETE, ns, 0, done, arg);
    if (!pj)
        return -KVNODE_ENOMEM;
    pj->purge_all = true;
    return job_submit(p, pj);
}

int persist_exists(struct persist *p, const struct persist_lookup_req *r)
{
    int rc = check_request(p, r->ns);
    if (rc < 0)
        return rc;
    if (!r->keys || !r->present || !r->done || r->n == 0 || r->n > SIZE_MAX / 16)
        return -KVNODE_EINVAL;
    struct pjob *pj = job_new(p, PERSIST_OP_EXISTS, r->ns, r->n, r->done, r->arg);
    if (!pj)
        return -KVNODE_ENOMEM;
    memcpy(pj->keys, r->keys, r->n * sizeof *r->keys);
    job_copy_checks(pj, r->checks);
    pj->present = r->present;
    return job_submit(p, pj);
}
