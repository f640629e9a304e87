/* copier: the copy workers (see copier.h). Each workq thread's context
 * holds its own stream per device, created on the first batch for that device
 * (a daemon with one GPU never opens streams on the others). Stats are
 * kept on the loop, in done(), so reading them takes no lock. */
#include "gpu/copier.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "gpu/devmem.h"
#include "core/errmsg.h"
#include "kvnode.h"

struct copier {
    struct devmem *dm;
    struct workq  *wq;
    struct copier_stats st;      /* loop thread; pending comes from the workq */
};

struct copier_ctx {
    struct devmem *dm;
    struct devmem_stream *streams[DEVMEM_MAX_DEVICES];
};

/* Bytes from p to the next pin chunk boundary of the batch's host range,
 * or SIZE_MAX when p is not in it (or the host is not pinned). */
static size_t to_chunk_end(const struct copier_batch *b, const char *p)
{
    const char *hb = b->host_base;
    uint64_t off;

    if (!hb || b->host_chunk == 0 || p < hb || (uint64_t)(p - hb) >= b->host_len)
        return SIZE_MAX;
    off = (uint64_t)(p - hb);
    return (size_t)(b->host_chunk - off % b->host_chunk);
}

/* Worker thread: one run, as one transfer per pin chunk it touches. */
static int issue_run(struct devmem_stream *s, struct copier_batch *b, char *dst, const char *src,
                     size_t len)
{
    while (len > 0) {
        size_t n = len, d = to_chunk_end(b, dst), r = to_chunk_end(b, src);
        int rc;

        if (d < n)
            n = d;
        if (r < n)
            n = r;
        if ((rc = devmem_copy_async(s, dst, src, n, b->why, sizeof b->why)) < 0)
            return rc;
        b->transfers++;
        if (n < len)
            b->splits++;
        dst += n;
        src += n;
        len -= n;
    }
    return 0;
}

#define batch_of(j) ((struct copier_batch *)((char *)(j) - offsetof(struct copier_batch, job)))

static int ctx_init(void *arg, unsigned index, void **out)
{
    struct copier_ctx *c = calloc(1, sizeof(*c));

    (void)index;
    if (!c)
        return -KVNODE_ENOMEM;
    c->dm = arg;
    *out = c;
    return 0;
}

static void ctx_fini(void *arg, void *ctx)
{
    struct copier_ctx *c = ctx;

    (void)arg;
    for (int i = 0; i < DEVMEM_MAX_DEVICES; i++)
        devmem_stream_destroy(c->streams[i]);
    free(c);
}

/* Worker thread. */
static void batch_run(struct workq_job *job, void *ctx)
{
    struct copier_batch *b = batch_of(job);
    struct copier_ctx *c = ctx;
    struct devmem_stream *s;
    char *dst = NULL;
    const char *src = NULL;
    size_t len = 0;
    uint64_t t0;
    int rc = 0;

    b->rc = 0;
    b->why[0] = '\0';
    b->transfers = 0;
    b->splits = 0;
    b->elapsed_ns = 0;
    s = c->streams[b->device];
    if (!s) {
        rc = devmem_stream_create(c->dm, b->device, &s, b->why, sizeof b->why);
        if (rc < 0) {
            b->rc = rc;
            return;
        }
        c->streams[b->device] = s;
    }

    t0 = clock_now_ns();
    /* Runs where the next item continues both source and destination of
     * the previous one go out as one transfer (per pin chunk). */
    for (size_t i = 0; i <= b->n && rc == 0; i++) {
        const struct copier_item *it = i < b->n ? &b->items[i] : NULL;
        if (it && it->len == 0)
            continue;
        if (it && len > 0 && (char *)it->dst == dst + len && (const char *)it->src == src + len) {
            len += it->len;
            continue;
        }
        if (len > 0)
            rc = issue_run(s, b, dst, src, len);
        if (it) {
            dst = it->dst;
            src = it->src;
            len = it->len;
        }
    }
    if (b->transfers == 0 && rc == 0)
        return;
    /* Wait even after a failed copy: the ones queued before it may still be
     * running, and done() hands the memory back to the loop. */
    if (rc < 0) {
        char ignored[8];
        devmem_stream_wait(s, ignored, sizeof ignored);
    } else {
        rc = devmem_stream_wait(s, b->why, sizeof b->why);
    }
    b->elapsed_ns = clock_now_ns() - t0;
    b->rc = rc;
}

/* Loop thread. */
static void batch_done(struct workq_job *job)
{
    struct copier_batch *b = batch_of(job);
    struct copier *cp = b->cp;

    if (job->cancelled) {
        b->rc = -KVNODE_ESHUTDOWN;
        b->transfers = 0;
        b->splits = 0;
        b->elapsed_ns = 0;
        errmsg_set(b->why, sizeof b->why, "copier: stopped before the batch ran");
    }
    cp->st.batches++;
    cp->st.transfers += b->transfers;
    cp->st.chunk_splits += b->splits;
    if (b->rc < 0) {
        cp->st.failed++;
    } else {
        for (size_t i = 0; i < b->n; i++)
            cp->st.bytes += b->items[i].len;
        cp->st.busy_ns += b->elapsed_ns;
    }
    b->done(b);   /* may free b */
}

int copier_create(struct event_base *loop, struct devmem *dm, unsigned threads, size_t queue,
                  struct copier **out, char *err, size_t errlen)
{
    const struct workq_thread_hooks hooks = { ctx_init, ctx_fini, dm };
    struct copier *cp;
    char e[200];
    int rc;

    if (out)
        *out = NULL;
    if (!loop || !dm || !out || queue == 0 || threads == 0 || threads > COPIER_MAX_THREADS) {
        errmsg_set(err, errlen, "copier: needs a loop, a devmem backend, 1..%u threads, a queue of "
                   "at least 1 and an output pointer", COPIER_MAX_THREADS);
        return -KVNODE_EINVAL;
    }
    if (devmem_device_count(dm) <= 0) {
        errmsg_set(err, errlen, "copier: devmem backend %s has no device",
                   devmem_kind_name(devmem_kind(dm)));
        return -KVNODE_EINVAL;
    }
    if (!(cp = calloc(1, sizeof(*cp)))) {
        errmsg_set(err, errlen, "copier: out of memory");
        return -KVNODE_ENOMEM;
    }
    cp->dm = dm;
    rc = workq_create_hooks(loop, "copier", threads, queue, &hooks, &cp->wq, e, sizeof e);
    if (rc < 0) {
        errmsg_set(err, errlen, "copier: %s", e);
        free(cp);
        return rc;
    }
    *out = cp;
    return 0;
}

int copier_submit(struct copier *cp, struct copier_batch *b)
{
    if (!cp || !b)
        return -KVNODE_EINVAL;
    if (!b->done) {
        errmsg_set(b->why, sizeof b->why, "copier: batch without done()");
        return -KVNODE_EINVAL;
    }
    if (b->device < 0 || b->device >= devmem_device_count(cp->dm)) {
        errmsg_set(b->why, sizeof b->why, "copier: device %d out of range (0..%d)", b->device,
                   devmem_device_count(cp->dm) - 1);
        return -KVNODE_EINVAL;
    }
    if (b->n > 0 && !b->items) {
        errmsg_set(b->why, sizeof b->why, "copier: %zu items but no item array", b->n);
        return -KVNODE_EINVAL;
    }
    if (b->host_chunk > 0 && (!b->host_base || b->host_len == 0)) {
        errmsg_set(b->why, sizeof b->why, "copier: a pin chunk size without a host range");
        return -KVNODE_EINVAL;
    }
    for (size_t i = 0; i < b->n; i++) {
        if (b->items[i].len > 0 && (!b->items[i].dst || !b->items[i].src)) {
            errmsg_set(b->why, sizeof b->why, "copier: item %zu has a NULL pointer", i);
            return -KVNODE_EINVAL;
        }
    }
    b->cp = cp;
    b->rc = 0;
    b->transfers = 0;
    b->splits = 0;
    b->elapsed_ns = 0;
    memset(&b->job, 0, sizeof b->job);
    b->job.run = batch_run;
    b->job.done = batch_done;
    return workq_submit(cp->wq, &b->job);
}

void copier_stats(struct copier *cp, struct copier_stats *out)
{
    if (!out)
        return;
    if (!cp) {
        memset(out, 0, sizeof(*out));
        return;
    }
    *out = cp->st;
    out->pending = workq_pending(cp->wq);
}

void copier_destroy(struct copier *cp)
{
    if (!cp)
        return;
    workq_destroy(cp->wq);   /* done() for everything outstanding; fini destroys the streams */
    free(cp);
}
