/* client_submit: the public asynchronous calls of libkvnode (see kvnode.h,
 * "Asynchronous calls"): tickets for MATCH/DELETE requests (finished by
 * whoever reads the socket, client_async.c), the worker thread that runs
 * GET/PUT batches with the synchronous copying code (client_ops.c), drain,
 * pending and cancel. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"

/* --- asynchronous requests ----------------------------------------------- */

int kvnode_event_fd(const kvnode_client *c)
{
    return c ? c->event_fd : -KVNODE_EINVAL;
}

/* A completion record for a new ticket (counted open until drained). */
static struct client_done *client_new_ticket_locked(kvnode_client *c, struct client_done *d, int op,
                                                    void *user)
{
    memset(d, 0, sizeof *d);
    d->comp.ticket = ++c->next_ticket;
    d->comp.op = op;
    d->comp.user = user;
    c->tickets_open++;
    return d;
}

/* MATCH and DELETE: one request, finished by the I/O thread. */
static int client_submit_count(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, int del, bool *each, void *user, kvnode_ticket *ticket)
{
    const char *what = each ? (del ? "submit_delete_each" : "submit_exists")
                            : (del ? "submit_delete" : "submit_match");
    int op = each ? (del ? KVNODE_OP_DELETE_EACH : KVNODE_OP_EXISTS)
                  : (del ? KVNODE_OP_DELETE : KVNODE_OP_MATCH);
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__MatchRequest m = KVNODE__MATCH_REQUEST__INIT;
    Kvnode__DeleteRequest d = KVNODE__DELETE_REQUEST__INIT;
    struct client_done *done;
    struct client_slot *s;
    int rc;

    if (ticket)
        *ticket = 0;
    if (!c)
        return -KVNODE_EINVAL;
    if (!ticket || (!keys && n > 0)) {
        client_seterr(c, "%s: NULL %s", what, ticket ? "keys" : "ticket");
        return -KVNODE_EINVAL;
    }
    rc = client_check_ns(c, n, checks, what);
    if (rc == 0 && op >= KVNODE_OP_EXISTS && !c->per_key) {
        client_seterr(c, "%s: the daemon is too old to answer per key (its HELLO does not offer "
                      "it); upgrade kvnoded", what);
        rc = -KVNODE_EVERSION;
    }
    if (rc < 0)
        return rc;
    done = malloc(sizeof *done);
    s = calloc(1, sizeof *s);
    if (!done || !s) {
        free(done);
        free(s);
        client_seterr(c, "%s: out of memory", what);
        return -KVNODE_ENOMEM;
    }
    client_keys_request(&req, &m, &d, del, keys, checks, n);
    m.per_key = d.per_key = op >= KVNODE_OP_EXISTS;
    pthread_mutex_lock(&c->lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->lock);
        free(done);
        free(s);
        return client_check_alive(c);
    }
    rc = n > 0 ? client_ensure_io_locked(c) : 0;
    if (rc != 0) {
        pthread_mutex_unlock(&c->lock);
        free(done);
        free(s);
        client_seterr(c, "%s: cannot start the client's I/O thread: %s", what, strerror(rc));
        return -KVNODE_EIO;
    }
    client_new_ticket_locked(c, done, op, user);
    if (n == 0) {       /* nothing to ask: done at once, as the synchronous calls */
        free(s);
        *ticket = done->comp.ticket;
        client_push_done_locked(c, done);
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    s->async = done;
    s->n = n;
    s->each = op >= KVNODE_OP_EXISTS ? each : NULL;
    rc = client_submit_locked(c, &req, s);
    if (rc < 0) {
        c->next_ticket--;
        c->tickets_open--;
        pthread_mutex_unlock(&c->lock);
        client_seterr(c, "%s", s->err);
        free(done);
        free(s);
        return rc;
    }
    /* s may already be finished (a send error killed the client): the
     * completion carries that. */
    *ticket = done->comp.ticket;
    pthread_mutex_unlock(&c->lock);
    return 0;
}

int kvnode_submit_match(kvnode_client *c, const kvnode_key *keys, size_t n, void *user,
                        kvnode_ticket *ticket)
{
    return client_submit_count(c, keys, NULL, n, 0, NULL, user, ticket);
}

int kvnode_submit_match_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                                size_t n, void *user, kvnode_ticket *ticket)
{
    return client_submit_count(c, keys, checks, n, 0, NULL, user, ticket);
}

int kvnode_submit_delete(kvnode_client *c, const kvnode_key *keys, size_t n, void *user,
                         kvnode_ticket *ticket)
{
    return client_submit_count(c, keys, NULL, n, 1, NULL, user, ticket);
}

int kvnode_submit_delete_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                                 size_t n, void *user, kvnode_ticket *ticket)
{
    return client_submit_count(c, keys, checks, n, 1, NULL, user, ticket);
}

/* Per key: the caller's array (n == 0: none needed, a placeholder marks the op). */
static int client_submit_each(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, int del, bool *each, void *user, kvnode_ticket *ticket)
{
    static bool none;

    if (ticket)
        *ticket = 0;
    if (!c)
        return -KVNODE_EINVAL;
    if (!each && n > 0) {
        client_seterr(c, "%s: NULL %s", del ? "submit_delete_each" : "submit_exists",
                      del ? "deleted" : "present");
        return -KVNODE_EINVAL;
    }
    return client_submit_count(c, keys, checks, n, del, n > 0 ? each : &none, user, ticket);
}

int kvnode_submit_exists(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                         size_t n, bool *present, void *user, kvnode_ticket *ticket)
{
    return client_submit_each(c, keys, checks, n, 0, present, user, ticket);
}

int kvnode_submit_delete_each(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, bool *deleted, void *user, kvnode_ticket *ticket)
{
    return client_submit_each(c, keys, checks, n, 1, deleted, user, ticket);
}

/* A job and its copies (with_done: its completion record too, never handed out). */
static void client_job_free(struct client_job *j, int with_done)
{
    if (!j)
        return;
    if (with_done)
        free(j->done);
    free(j->keys);
    free(j->checks);
    free(j->pages);
    free(j);
}

static void *client_worker_main(void *arg)
{
    kvnode_client *c = arg;

    pthread_mutex_lock(&c->lock);
    for (;;) {
        struct client_job *j;
        size_t count = 0;
        int rc;

        while (!c->job_head && !c->stopping)
            pthread_cond_wait(&c->job_cond, &c->lock);
        j = c->job_head;
        if (!j)
            break;      /* stopping, and every job has completed */
        c->job_head = j->next;
        if (!c->job_head)
            c->job_tail = NULL;
        pthread_mutex_unlock(&c->lock);
        /* On a dead client these fail at once with ECLOSED: queued jobs
         * drain quickly on close. */
        if (j->done->comp.op == KVNODE_OP_GET)
            rc = client_get_batch(c, j->keys, j->checks, j->n, j->pages, j->flags, NULL, &count);
        else
            rc = client_put_batch(c, j->keys, j->checks, j->n, (const void *const *)j->pages,
                                  j->flags, NULL, &count);
        j->done->comp.rc = rc;
        j->done->comp.count = count;
        if (rc < 0)
            snprintf(j->done->comp.error, sizeof j->done->comp.error, "%s", client_errmsg(c));
        pthread_mutex_lock(&c->lock);
        client_push_done_locked(c, j->done);
        client_job_free(j, 0);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* GET and PUT: a job for the worker, which copies into/out of the pages. */
static int client_submit_copy(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, const void *const *pages, unsigned flags, int op,
                              void *user, kvnode_ticket *ticket)
{
    const char *what = op == KVNODE_OP_GET ? "submit_get" : "submit_put";
    struct client_job *j;
    size_t i;
    int rc;

    if (ticket)
        *ticket = 0;
    if (!c)
        return -KVNODE_EINVAL;
    if (!ticket || (!keys && n > 0) || (!pages && n > 0)) {
        client_seterr(c, "%s: NULL %s", what, !ticket ? "ticket" : !keys ? "keys" : "page array");
        return -KVNODE_EINVAL;
    }
    if (flags & ~(unsigned)KVNODE_BATCH_DEVICE) {
        client_seterr(c, "%s: unknown flags 0x%x (this libkvnode knows 0x%x: KVNODE_BATCH_DEVICE)",
                      what, flags & ~(unsigned)KVNODE_BATCH_DEVICE, (unsigned)KVNODE_BATCH_DEVICE);
        return -KVNODE_EINVAL;
    }
    for (i = 0; i < n; i++) {
        if (!pages[i]) {
            client_seterr(c, "%s: page pointer %zu is NULL", what, i);
            return -KVNODE_EINVAL;
        }
    }
    rc = client_check_ns(c, 0, checks, what);   /* chunks of max_keys: any n */
    if (rc < 0)
        return rc;
    j = calloc(1, sizeof *j);
    if (j) {
        j->done = malloc(sizeof *j->done);
        j->keys = malloc((n ? n : 1) * sizeof *j->keys);
        j->pages = malloc((n ? n : 1) * sizeof *j->pages);
        /* The caller's arrays may go as soon as this returns: copy the words too. */
        j->checks = checks ? malloc((n ? n : 1) * sizeof *j->checks) : NULL;
    }
    if (!j || !j->done || !j->keys || !j->pages || (checks && !j->checks)) {
        client_job_free(j, 1);
        client_seterr(c, "%s: out of memory", what);
        return -KVNODE_ENOMEM;
    }
    if (n > 0) {
        memcpy(j->keys, keys, n * sizeof *keys);
        memcpy(j->pages, pages, n * sizeof *pages);
        if (checks)
            memcpy(j->checks, checks, n * sizeof *checks);
    }
    j->n = n;
    j->flags = flags;
    pthread_mutex_lock(&c->lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->lock);
        client_job_free(j, 1);
        return client_check_alive(c);
    }
    if (!c->worker_running) {
        int err = client_thread_start(&c->worker, client_worker_main, c);
        if (err != 0) {
            pthread_mutex_unlock(&c->lock);
            client_job_free(j, 1);
            client_seterr(c, "%s: cannot start the client's batch thread: %s", what,
                          strerror(err));
            return -KVNODE_EIO;
        }
        c->worker_running = 1;
    }
    client_new_ticket_locked(c, j->done, op, user);
    *ticket = j->done->comp.ticket;
    if (c->job_tail)
        c->job_tail->next = j;
    else
        c->job_head = j;
    c->job_tail = j;
    pthread_cond_signal(&c->job_cond);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

int kvnode_submit_get(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                      unsigned flags, void *user, kvnode_ticket *ticket)
{
    return client_submit_copy(c, keys, NULL, n, (const void *const *)dst, flags, KVNODE_OP_GET,
                              user, ticket);
}

int kvnode_submit_get_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, void *const *dst, unsigned flags, void *user,
                              kvnode_ticket *ticket)
{
    return client_submit_copy(c, keys, checks, n, (const void *const *)dst, flags, KVNODE_OP_GET,
                              user, ticket);
}

int kvnode_submit_put(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src,
                      unsigned flags, void *user, kvnode_ticket *ticket)
{
    return client_submit_copy(c, keys, NULL, n, src, flags, KVNODE_OP_PUT, user, ticket);
}

int kvnode_submit_put_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, const void *const *src, unsigned flags, void *user,
                              kvnode_ticket *ticket)
{
    return client_submit_copy(c, keys, checks, n, src, flags, KVNODE_OP_PUT, user, ticket);
}

size_t kvnode_drain(kvnode_client *c, kvnode_completion *out, size_t max)
{
    size_t got = 0;

    if (!c || (!out && max > 0))
        return 0;
    pthread_mutex_lock(&c->lock);
    while (got < max && c->done_head) {
        struct client_done *d = c->done_head;

        c->done_head = d->next;
        if (!c->done_head)
            c->done_tail = NULL;
        c->n_done--;
        c->tickets_open--;
        out[got++] = d->comp;
        free(d);
    }
    if (c->n_done == 0) {
        uint64_t v;
        /* Empty: the eventfd stops being readable (it is only written under
         * the lock, so no completion is missed). */
        if (read(c->event_fd, &v, sizeof v) < 0) {
            /* EAGAIN: it was not readable */
        }
    }
    pthread_mutex_unlock(&c->lock);
    return got;
}

size_t kvnode_pending(kvnode_client *c)
{
    size_t n;

    if (!c)
        return 0;
    pthread_mutex_lock(&c->lock);
    n = c->tickets_open;
    pthread_mutex_unlock(&c->lock);
    return n;
}

void kvnode_cancel(kvnode_client *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    client_kill_locked(c, -KVNODE_ECLOSED, "cancelled by kvnode_cancel");
    pthread_mutex_unlock(&c->lock);
}
