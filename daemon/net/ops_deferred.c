/* ops deferred: requests whose answer waits — for the store (MATCH and GET
 * while keys are looked up or promoted), for KVCM (MATCH_REMOTE), or for room
 * (a PUT while blocks waiting for the store fill the host tier, retried up to
 * server.request_timeout). The connection handles nothing more until the
 * answer is sent (see ops.h). Loop thread only. */
#include "net/ops_internal.h"

#include <stdlib.h>
#include <string.h>

#include "kvcm/query.h"
#include "kvnode.h"

/* The request answers later: remember who asks and stop reading from the
 * connection until then. 0, or -KVNODE_ENOMEM. */
int ops_defer(struct ops *o, struct conn *conn, struct session *s,
              const Kvnode__Request *req, size_t n, struct cache_wait *wait)
{
    struct ops_pending *p = malloc(sizeof *p);
    if (!p)
        return -KVNODE_ENOMEM;   /* the caller answers with what is ready now */
    p->o = o;
    p->conn = conn;
    p->s = s;
    p->req_id = req->id;
    p->op = (int)req->op_case;
    p->n = n;
    p->t0 = o->request_t0;
    p->wait = wait;
    p->per_key = false;
    p->query = NULL;
    p->local_matched = 0;
    p->packed = NULL;
    p->packed_len = 0;
    p->put_deadline = 0;
    p->purge = NULL;
    p->purge_cache = NULL;
    s->pending = p;
    o->deferred = true;
    server_defer(conn);
    return 0;
}

void ops_query_answer(void *arg, const struct kvcm_query_answer *a)
{
    struct conn *conn = arg;
    struct session *s = server_conn_session(conn);
    struct ops_pending *p = s->pending;
    struct ops *o = p->o;
    Kvnode__Request req = KVNODE__REQUEST__INIT;

    s->pending = NULL;
    req.id = p->req_id;
    req.op_case = (Kvnode__Request__OpCase)p->op;
    o->last_code = 0;
    ops_match_remote_reply(o, conn, &req, p->local_matched, a);
    metrics_request_observe(&o->requests, p->op, o->last_code, ops_now_s() - p->t0);
    free(p);
    server_resume(conn);
}

static void ops_put_retry(void *arg);

/* A put found the host tier full of blocks waiting for the store
 * (CACHE_STORE_BOUND): wait for store writes to land, up to
 * server.request_timeout from the request's arrival, and try again. true
 * when it waits; false when its time is up (err then says how long it
 * waited) or it cannot wait. */
bool ops_put_backpressure(struct ops *o, struct conn *conn, struct session *s,
                          const Kvnode__Request *req, char *err, size_t errlen)
{
    size_t n = req->op_case == KVNODE__REQUEST__OP_PUT_INLINE ? req->put_inline->n_keys
                                                              : req->put_begin->n_keys;
    double deadline = o->put_deadline > 0 ? o->put_deadline
                                          : o->request_t0 + o->cfg->request_timeout_ms / 1000.0;
    double left = deadline - ops_now_s();
    struct cache_wait *wait;
    size_t len;
    uint8_t *packed;

    if (left <= 0.001) {
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, "; waited %u ms for it (server.request_timeout)",
                 o->cfg->request_timeout_ms);
        return false;
    }
    len = kvnode__request__get_packed_size(req);
    packed = malloc(len ? len : 1);
    if (!packed)
        return false;
    kvnode__request__pack(req, packed);
    if (cache_put_wait(ops_cache(s), (unsigned)(left * 1000.0) + 1, ops_put_retry, conn, &wait) < 0) {
        free(packed);
        return false;
    }
    if (ops_defer(o, conn, s, req, n, wait) < 0) {
        cache_wait_cancel(ops_cache(s), wait);
        free(packed);
        return false;
    }
    s->pending->packed = packed;
    s->pending->packed_len = len;
    s->pending->put_deadline = deadline;
    return true;
}

/* A put waiting for the store may go on: handle it again as it arrived. */
static void ops_put_retry(void *arg)
{
    struct conn *conn = arg;
    struct session *s = server_conn_session(conn);
    struct ops_pending *p = s->pending;
    struct ops *o = p->o;
    Kvnode__Request *req = kvnode__request__unpack(NULL, p->packed_len, p->packed);

    s->pending = NULL;
    cache_wait_cancel(ops_cache(s), p->wait);
    o->last_code = 0;
    o->deferred = false;
    o->request_t0 = p->t0;
    o->put_deadline = p->put_deadline;
    if (req) {
        ops_dispatch(o, conn, s, req);
        kvnode__request__free_unpacked(req, NULL);
    } else {
        Kvnode__Request r = KVNODE__REQUEST__INIT;
        r.id = p->req_id;
        r.op_case = (Kvnode__Request__OpCase)p->op;
        ops_fail(o, conn, &r, -KVNODE_ENOMEM, "out of memory retrying a put");
    }
    o->put_deadline = 0;
    if (!o->deferred) {
        metrics_request_observe(&o->requests, p->op, o->last_code, ops_now_s() - p->t0);
        server_resume(conn);
    }
    free(p->packed);
    free(p);
}

/* The store answered (or request_timeout passed) for a deferred request:
 * answer it and let the connection's next requests in. */
void ops_pending_ready(void *arg)
{
    struct conn *conn = arg;
    struct session *s = server_conn_session(conn);
    struct ops_pending *p = s->pending;
    struct ops *o = p->o;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    struct cache_lent lent = { 0 };

    s->pending = NULL;
    req.id = p->req_id;
    req.op_case = (Kvnode__Request__OpCase)p->op;
    o->last_code = 0;
    if (p->op == KVNODE__REQUEST__OP_MATCH && p->per_key) {
        struct cache_tiers t;
        uint8_t *present = malloc((p->n + 7) / 8 + 1);
        if (!present) {
            /* Nothing to put the answer in: the wait is let go. */
            cache_match_finish(ops_cache(s), p->wait, &t);
            ops_fail(o, conn, &req, -KVNODE_ENOMEM, "out of memory");
        } else {
            cache_match_each_finish(ops_cache(s), p->wait, &t, present);
            ops_match_reply(o, conn, &req, &t, present, p->n);
        }
        free(present);
    } else if (p->op == KVNODE__REQUEST__OP_MATCH) {
        struct cache_tiers t;
        cache_match_finish(ops_cache(s), p->wait, &t);
        ops_match_reply(o, conn, &req, &t, NULL, 0);
    } else {
        lent.locs = calloc(p->n ? p->n : 1, sizeof *lent.locs);
        /* No locs: nothing to put the answer in, everything is given back. */
        cache_get_finish(ops_cache(s), p->wait, &lent);
        if (!lent.locs)
            ops_fail(o, conn, &req, -KVNODE_ENOMEM, "out of memory");
        else if (p->op == KVNODE__REQUEST__OP_GET_INLINE)
            ops_get_inline_reply(o, conn, s, &req, &lent);
        else
            ops_get_reply(o, conn, s, &req, &lent);
    }
    metrics_request_observe(&o->requests, p->op, o->last_code, ops_now_s() - p->t0);
    free(lent.locs);
    free(p);
    server_resume(conn);
}
