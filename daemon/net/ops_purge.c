/* ops purge: PURGE (issue 31) — who may purge what, and the answer once the
 * cache's purge is over (see proto/kvnode.proto, PurgeRequest). Loop thread
 * only. */
#include "net/ops_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvnode.h"

/* The purge ended: answer it and let the connection's next requests in. */
static void ops_purge_done(void *arg, const struct cache_purge_result *r)
{
    struct conn *conn = arg;
    struct session *s = server_conn_session(conn);
    struct ops_pending *p = s->pending;
    struct ops *o = p->o;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__PurgeReply reply = KVNODE__PURGE_REPLY__INIT;

    s->pending = NULL;
    req.id = p->req_id;
    req.op_case = (Kvnode__Request__OpCase)p->op;
    o->last_code = 0;
    log_info("purge by pid %d uid %d (%s): %u namespaces, %llu blocks%s", (int)s->pid, (int)s->uid,
             s->name, r->namespaces, (unsigned long long)r->blocks,
             r->store_failed ? "; some store deletes failed" : "");
    if (r->store_failed) {
        char err[256];
        snprintf(err, sizeof err, "purge: %u namespaces and %llu blocks left memory, but %llu of the "
                 "store's deletes failed (their copies may stay: purge again once the store answers)",
                 r->namespaces, (unsigned long long)r->blocks, (unsigned long long)r->store_failed);
        ops_fail(o, conn, &req, -KVNODE_EIO, err);
    } else {
        reply.namespaces = r->namespaces;
        reply.blocks = r->blocks;
        resp.result_case = KVNODE__RESPONSE__RESULT_PURGE;
        resp.purge = &reply;
        ops_send(o, conn, &req, &resp, NULL, 0);
    }
    metrics_request_observe(&o->requests, p->op, o->last_code, ops_now_s() - p->t0);
    free(p);
    server_resume(conn);
}

/* The tenant whose deployments the request names, or NULL with err set. */
static struct tenant *ops_purge_tenant(struct ops *o, const struct session *s, const char *name,
                                       int *code, char *err, size_t errlen)
{
    if (!name || !*name || (s->tenant && strcmp(name, s->tenant->name) == 0))
        return s->tenant;
    /* Only the node's administrator reaches another tenant's blocks. */
    if (!s->observer || (s->uid != 0 && s->uid != geteuid())) {
        snprintf(err, errlen, "purge: this connection (uid %d, tenant %s) may purge only its own "
                 "tenant's deployments; naming tenant %s needs an observer connection of root or "
                 "the daemon's user (uid %d), as kvnodectl purge makes", (int)s->uid,
                 s->tenant ? s->tenant->name : "?", name, (int)geteuid());
        *code = -KVNODE_EDENIED;
        return NULL;
    }
    for (size_t i = 0; i < tenants_count(o->tenants); i++) {
        struct tenant *t = tenants_at(o->tenants, i);
        if (strcmp(t->name, name) == 0)
            return t;
    }
    snprintf(err, errlen, "purge: no tenant %s on this node", name);
    *code = -KVNODE_EINVAL;
    return NULL;
}

void ops_purge(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__PurgeRequest *r = req->purge;
    const char *dep = r->deployment_id && *r->deployment_id ? r->deployment_id : NULL;
    const char *model = r->model && *r->model ? r->model : NULL;
    struct cache_purge_sel sel = { 0 };
    struct cache_purge *purge;
    struct tenant *t;
    char err[512];
    int code = 0;

    if (dep && model) {
        ops_fail(o, conn, req, -KVNODE_EINVAL, "purge: name a deployment_id or a model, not both");
        return;
    }
    if ((dep && strlen(dep) >= NS_DEPLOYMENT_ID_MAX) || (model && strlen(model) >= NS_MODEL_MAX)) {
        snprintf(err, sizeof err, "purge: %s is longer than any %s (%d bytes)", dep ? "deployment_id" : "model",
                 dep ? "deployment id" : "model name", dep ? NS_DEPLOYMENT_ID_MAX - 1 : NS_MODEL_MAX - 1);
        ops_fail(o, conn, req, -KVNODE_EINVAL, err);
        return;
    }
    if (!(t = ops_purge_tenant(o, s, r->tenant, &code, err, sizeof err))) {
        ops_fail(o, conn, req, code, err);
        return;
    }
    if (!dep && !model) {
        if (!s->ns || t != s->tenant) {
            ops_fail(o, conn, req, -KVNODE_EINVAL, "purge: name a deployment_id or a model (only an "
                     "engine connection may purge its own deployment without naming it)");
            return;
        }
        dep = s->ns->deployment_id;
    }
    if (!t->cache) {
        snprintf(err, sizeof err, "purge: tenant %s has no memory, so no blocks", t->name);
        ops_fail(o, conn, req, -KVNODE_EINVAL, err);
        return;
    }
    sel.deployment_id = dep;
    sel.model = model;
    if ((code = cache_purge_start(t->cache, &sel, ops_purge_done, conn, &purge, err, sizeof err)) < 0) {
        ops_fail(o, conn, req, code, err);
        return;
    }
    log_info("purge of %s %s (tenant %s) requested by pid %d uid %d (%s)", dep ? "deployment" : "model",
             dep ? dep : model, t->name, (int)s->pid, (int)s->uid, s->name);
    if (ops_defer(o, conn, s, req, 0, NULL) < 0) {
        cache_purge_detach(t->cache, purge);
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "purge: out of memory waiting for it (it goes on)");
        return;
    }
    s->pending->purge = purge;
    s->pending->purge_cache = t->cache;
}
