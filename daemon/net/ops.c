/* ops: the ops object (create, settings, the counters of ops.h), the reply
 * helpers every handler uses, the dispatch of a request to its handler, and
 * the end of a session (see ops.h). The handlers are in ops_control.c and
 * ops_data.c, answers that wait in ops_deferred.c. Loop thread only. */
#include "net/ops_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "kvcm/query.h"
#include "kvnode.h"
#include "core/log.h"
#include "core/counters.h"
#include "wire.h"

void ops_set_querier(struct ops *o, struct kvcm_querier *q)
{
    o->querier = q;
}

int ops_create(struct tenants *tenants, const struct kvn_config *cfg, struct ops **out)
{
    struct ops *o = calloc(1, sizeof *o);
    if (!o)
        return -KVNODE_ENOMEM;
    o->tenants = tenants;
    o->cfg = cfg;
    o->started_ms = clock_now_ms();
    *out = o;
    return 0;
}

void ops_destroy(struct ops *o)
{
    free(o);
}

void ops_set_reload(struct ops *o, ops_reload_fn fn, void *arg)
{
    o->reload = fn;
    o->reload_arg = arg;
}

void ops_set_stats_hook(struct ops *o, ops_stats_fn fn, void *arg)
{
    o->stats_hook = fn;
    o->stats_hook_arg = arg;
}

void ops_get_stats(const struct ops *o, struct ops_stats *out)
{
    out->uptime_s = (double)(clock_now_ms() - o->started_ms) / 1000.0;
    out->socket_path = o->cfg->socket_path;
    for (int op = 0; op < OP_SLOTS; op++) {
        out->requests[op].ok = o->counts[op].ok;
        out->requests[op].error = o->counts[op].error;
    }
    out->by_status = &o->requests;
    out->hbm_unusable_clients = o->hbm_unusable_clients;
    out->hbm_unusable_last = o->hbm_unusable_last;
}

void ops_set_server(struct ops *o, struct server *s)
{
    o->server = s;
}

void ops_apply_config(struct ops *o, const struct kvn_config *cfg)
{
    o->cfg = cfg;
}

int ops_admit(struct ops *o, struct session *s, const gid_t *groups, size_t ngroups, char *msg, size_t msglen)
{
    struct tenant *t = tenants_for_peer(o->tenants, s->uid, s->gid, groups, ngroups);

    /* Each tenant within its own part of server.max_clients (which the
     * server checks for the node), so none takes another's. */
    if (t->clients >= t->max_clients) {
        t->refused++;
        if (t->named)
            snprintf(msg, msglen, "too many clients of tenant %s ([tenant.%s] max_clients = %u)",
                     t->name, t->name, t->max_clients);
        else
            snprintf(msg, msglen, "too many clients of tenant %s (%u: what the [tenant.NAME] sections leave "
                     "of server.max_clients = %u)", t->name, t->max_clients, o->cfg->max_clients);
        return -KVNODE_ELIMIT;
    }
    s->tenant = t;
    t->clients++;
    return 0;
}

void ops_session_end(struct ops *o, struct session *s)
{
    struct cache *c = ops_cache(s);

    if (s->pending) {
        if (s->pending->purge)
            cache_purge_detach(s->pending->purge_cache, s->pending->purge);
        else if (s->pending->query)
            kvcm_query_cancel(o->querier, s->pending->query);
        else if (c)
            cache_wait_cancel(c, s->pending->wait);
        free(s->pending->packed);
        free(s->pending);
        s->pending = NULL;
    }
    if (c)
        cache_release_owner(c, &s->leases);
    if (s->ns) {
        log_debug("client pid %d (%s) left namespace %u", (int)s->pid, s->name, s->ns->id);
        cache_unbind(c, s->ns);
        s->ns = NULL;
    }
    if (s->tenant) {
        s->tenant->clients--;
        s->tenant = NULL;
    }
}

/* --- helpers ------------------------------------------------------------ */

static void ops_count(struct ops *o, int op, bool ok)
{
    if (op < 0 || op >= OP_SLOTS)
        op = 0;
    if (ok)
        o->counts[op].ok++;
    else
        o->counts[op].error++;
}

void ops_fail(struct ops *o, struct conn *conn, const Kvnode__Request *req, int code,
              const char *msg)
{
    ops_count(o, (int)req->op_case, false);
    o->last_code = code;
    log_debug("%s request %" PRIu64 " failed: %s: %s", wire_op_name((int)req->op_case), req->id,
              kvnode_strerror(code), msg);
    server_reply_error(conn, req->id, code, "%s", msg);
}

void ops_send(struct ops *o, struct conn *conn, const Kvnode__Request *req,
              Kvnode__Response *resp, const int *fds, size_t nfds)
{
    resp->id = req->id;
    if (server_reply(conn, resp, fds, nfds) < 0) {
        ops_count(o, (int)req->op_case, false);
        o->last_code = -KVNODE_EINTERNAL;
        server_reply_error(conn, req->id, -KVNODE_EINTERNAL, "cannot encode the %s reply",
                           wire_op_name((int)req->op_case));
        return;
    }
    ops_count(o, (int)req->op_case, true);
}

/* Every data operation needs a namespace and a bounded key chain. */
int ops_check_keys(struct ops *o, const struct session *s, size_t n, char *err, size_t errlen)
{
    if (!s->hello_done) {
        snprintf(err, errlen, "send HELLO first: the connection is not bound to a namespace");
        return -KVNODE_ESTATE;
    }
    if (!s->ns) {
        snprintf(err, errlen, "this is an observer connection (HELLO without a layout); "
                 "it may only ask for stats and ping");
        return -KVNODE_ESTATE;
    }
    if (n > o->cfg->max_keys_per_request) {
        snprintf(err, errlen, "%zu keys exceed server.max_keys_per_request (%u)", n,
                 o->cfg->max_keys_per_request);
        return -KVNODE_ETOOBIG;
    }
    return 0;
}

int ops_check_words(size_t nkeys, size_t nchecks, const uint64_t *checks, const uint64_t **out,
                    char *err, size_t errlen)
{
    *out = NULL;
    if (nchecks == 0)
        return 0;
    if (nchecks != nkeys) {
        snprintf(err, errlen, "%zu check words for %zu keys: send none (no words) or exactly one "
                 "per key", nchecks, nkeys);
        return -KVNODE_EINVAL;
    }
    *out = checks;
    return 0;
}

/* Every request is counted by op and status and timed, whatever path it takes. */
void ops_handle(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    double t0 = ops_now_s();
    o->last_code = 0;
    o->deferred = false;
    o->request_t0 = t0;
    ops_dispatch(o, conn, s, req);
    /* A deferred request is observed when it is answered. */
    if (!o->deferred)
        metrics_request_observe(&o->requests, (int)req->op_case, o->last_code, ops_now_s() - t0);
}

void ops_dispatch(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    if (!s->hello_done && req->op_case != KVNODE__REQUEST__OP_HELLO &&
        req->op_case != KVNODE__REQUEST__OP__NOT_SET) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "send HELLO first: the connection is not bound "
                 "to a namespace");
        return;
    }
    if (s->reader && (req->op_case == KVNODE__REQUEST__OP_PUT_BEGIN ||
                      req->op_case == KVNODE__REQUEST__OP_PUT_INLINE ||
                      req->op_case == KVNODE__REQUEST__OP_DELETE ||
                      req->op_case == KVNODE__REQUEST__OP_PURGE)) {
        char err[256];
        snprintf(err, sizeof err, "this connection declared itself a reader at HELLO "
                 "(KVNODE_CONNECT_READER): it may not %s; connect without the reader flag to write",
                 req->op_case == KVNODE__REQUEST__OP_DELETE ? "delete"
                 : req->op_case == KVNODE__REQUEST__OP_PURGE ? "purge" : "put");
        ops_fail(o, conn, req, -KVNODE_EDENIED, err);
        return;
    }
    switch (req->op_case) {
    case KVNODE__REQUEST__OP_HELLO:      ops_hello(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_MATCH:      ops_match(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_GET_BEGIN:  ops_get_begin(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_GET_END:    ops_get_end(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_PUT_BEGIN:  ops_put_begin(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_PUT_COMMIT:
    case KVNODE__REQUEST__OP_PUT_ABORT:  ops_put_end(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_GET_INLINE: ops_get_inline(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_PUT_INLINE: ops_put_inline(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_DELETE:     ops_delete(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_STATS:      ops_stats(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_PING:       ops_ping(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_RELOAD:     ops_reload(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_MATCH_REMOTE: ops_match_remote(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_PURGE:      ops_purge(o, conn, s, req); break;
    default:
        ops_fail(o, conn, req, -KVNODE_EINVAL, "the request carries no operation this daemon "
                 "knows (newer client?)");
        break;
    }
}

static void ops_request_cb(void *arg, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    ops_handle(arg, conn, s, req);
}

static void ops_session_end_cb(void *arg, struct session *s)
{
    ops_session_end(arg, s);
}

static int ops_admit_cb(void *arg, struct session *s, const gid_t *groups, size_t ngroups, char *msg,
                        size_t msglen)
{
    return ops_admit(arg, s, groups, ngroups, msg, msglen);
}

struct server_handler ops_server_handler(struct ops *o)
{
    return (struct server_handler){ .admit = ops_admit_cb, .request = ops_request_cb,
                                    .session_end = ops_session_end_cb, .arg = o };
}
