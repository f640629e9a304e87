/* ops: protocol requests -> cache calls -> replies (see ops.h). */
#include "net/ops.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/clock.h"
#include "mem/index.h"
#include "kvcm/query.h"
#include "kvnode.h"
#include "core/log.h"
#include "counters.h"
#include "wire.h"

#define OP_SLOTS METRICS_OP_SLOTS   /* request oneof field numbers are < 32 */

struct op_counts { uint64_t ok, error; };

struct ops {
    struct cache *cache;
    const struct kvn_config *cfg;
    struct server *server;
    ops_reload_fn reload;
    void *reload_arg;
    uint64_t started_ms;
    struct op_counts counts[OP_SLOTS];
    struct metrics_requests requests;   /* by op and status, with latency */
    int last_code;                      /* status of the request being handled */
    double request_t0;                  /* when it arrived (ops_now_s) */
    double put_deadline;                /* a put retried after waiting for the store:
                                           when its wait ends for good; 0: first try */
    bool deferred;                      /* the request being handled answers later */
    ops_stats_fn stats_hook;
    void *stats_hook_arg;
    struct kvcm_querier *querier;       /* NULL: [kvcm] off */
};

void ops_set_querier(struct ops *o, struct kvcm_querier *q)
{
    o->querier = q;
}

int ops_create(struct cache *cache, const struct kvn_config *cfg, struct ops **out)
{
    struct ops *o = calloc(1, sizeof *o);
    if (!o)
        return -KVNODE_ENOMEM;
    o->cache = cache;
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
}

void ops_set_server(struct ops *o, struct server *s)
{
    o->server = s;
}

void ops_apply_config(struct ops *o, const struct kvn_config *cfg)
{
    o->cfg = cfg;
}

/* A request whose answer waits for the store (cache_*_start returned
 * CACHE_WAITING). The connection reads nothing more until it is answered. */
struct ops_pending {
    struct ops *o;
    struct conn *conn;
    struct session *s;
    uint64_t req_id;
    int op;                 /* KVNODE__REQUEST__OP_* */
    size_t n;               /* keys asked for */
    double t0;
    struct cache_wait *wait;            /* MATCH / GET waiting for the store */
    struct kvcm_query *query;           /* MATCH_REMOTE waiting for KVCM */
    uint32_t local_matched;             /* MATCH_REMOTE: the local answer */
    uint8_t *packed;                    /* PUT waiting for the store: the request, to retry */
    size_t packed_len;
    double put_deadline;                /* ... and when it stops waiting */
};

void ops_session_end(struct ops *o, struct session *s)
{
    if (s->pending) {
        if (s->pending->query)
            kvcm_query_cancel(o->querier, s->pending->query);
        else
            cache_wait_cancel(o->cache, s->pending->wait);
        free(s->pending->packed);
        free(s->pending);
        s->pending = NULL;
    }
    cache_release_owner(o->cache, &s->leases);
    if (s->ns) {
        log_debug("client pid %d (%s) left namespace %u", (int)s->pid, s->name, s->ns->id);
        cache_unbind(o->cache, s->ns);
        s->ns = NULL;
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

static void ops_fail(struct ops *o, struct conn *conn, const Kvnode__Request *req, int code,
                     const char *msg)
{
    ops_count(o, (int)req->op_case, false);
    o->last_code = code;
    log_debug("%s request %" PRIu64 " failed: %s: %s", wire_op_name((int)req->op_case), req->id,
              kvnode_strerror(code), msg);
    server_reply_error(conn, req->id, code, "%s", msg);
}

static void ops_send(struct ops *o, struct conn *conn, const Kvnode__Request *req,
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

/* Copy a wire string into a fixed field, refusing what does not fit. */
static int ops_copy_field(char *dst, size_t cap, const char *src, const char *name,
                          char *err, size_t errlen)
{
    size_t len = src ? strlen(src) : 0;
    if (len >= cap) {
        snprintf(err, errlen, "layout.%s is %zu bytes long; the limit is %zu", name, len, cap - 1);
        return -KVNODE_ELAYOUT;
    }
    memcpy(dst, src ? src : "", len + 1);
    return 0;
}

static int ops_layout_from_wire(const Kvnode__Layout *w, struct ns_layout *l, char *err, size_t errlen)
{
    int rc;
    memset(l, 0, sizeof *l);
    if ((rc = ops_copy_field(l->model, sizeof l->model, w->model, "model", err, errlen)) < 0 ||
        (rc = ops_copy_field(l->dtype, sizeof l->dtype, w->dtype, "dtype", err, errlen)) < 0 ||
        (rc = ops_copy_field(l->extra, sizeof l->extra, w->extra, "extra", err, errlen)) < 0)
        return rc;
    l->block_tokens = w->block_tokens;
    l->block_bytes = w->block_bytes;
    l->num_layers = w->num_layers;
    l->kv_heads = w->kv_heads;
    l->head_dim = w->head_dim;
    l->tp_size = w->tp_size;
    l->tp_rank = w->tp_rank;
    return 0;
}

/* Every data operation needs a namespace and a bounded key chain. */
static int ops_check_keys(struct ops *o, const struct session *s, size_t n, char *err, size_t errlen)
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

/* Location messages for a reply: one array of structs, one of pointers. */
struct loc_buf {
    Kvnode__Location *items;
    Kvnode__Location **ptrs;
};

static int loc_buf_fill(struct loc_buf *b, const struct cache_loc *locs, size_t n)
{
    b->items = calloc(n ? n : 1, sizeof *b->items);
    b->ptrs = calloc(n ? n : 1, sizeof *b->ptrs);
    if (!b->items || !b->ptrs)
        return -KVNODE_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        kvnode__location__init(&b->items[i]);
        b->items[i].arena = locs[i].arena;
        b->items[i].offset = locs[i].offset;
        b->items[i].present = locs[i].present;
        b->ptrs[i] = &b->items[i];
    }
    return 0;
}

static void loc_buf_free(struct loc_buf *b)
{
    free(b->items);
    free(b->ptrs);
}

/* --- handlers ------------------------------------------------------------- */

bool ops_arena_is_clients_gpu(const struct cache_arena_info *a, int device, const char *bus_id)
{
    if (device < 0 || a->tier != KVNODE_TIER_HBM)
        return false;
    if (bus_id && *bus_id && a->pci_bus_id && *a->pci_bus_id)
        return strcasecmp(bus_id, a->pci_bus_id) == 0;
    return a->device == device;
}

static void ops_hello(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__HelloRequest *h = req->hello;
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__HelloReply reply = KVNODE__HELLO_REPLY__INIT;
    struct cache_arena_info arenas[INDEX_MAX_ARENAS];
    Kvnode__Arena arena_msgs[INDEX_MAX_ARENAS], *arena_ptrs[INDEX_MAX_ARENAS];
    int fds[INDEX_MAX_ARENAS];
    size_t narenas = 0, nfds = 0;
    char err[512];
    int rc;

    if (s->hello_done) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "HELLO was already done on this connection");
        return;
    }
    if (h->min_version > WIRE_PROTOCOL_VERSION || h->max_version < WIRE_PROTOCOL_VERSION ||
        h->min_version > h->max_version) {
        snprintf(err, sizeof err, "no common protocol version: client speaks %u..%u, "
                 "kvnoded speaks %u", h->min_version, h->max_version, WIRE_PROTOCOL_VERSION);
        ops_fail(o, conn, req, -KVNODE_EVERSION, err);
        return;
    }
    snprintf(s->name, sizeof s->name, "%s", h->client_name && *h->client_name ? h->client_name : "?");
    if (h->layout) {
        struct ns_layout layout;
        rc = ops_layout_from_wire(h->layout, &layout, err, sizeof err);
        if (rc == 0)
            rc = cache_bind(o->cache, &layout, &s->ns, err, sizeof err);
        if (rc < 0) {
            log_warn("refused HELLO from pid %d (%s): %s", (int)s->pid, s->name, err);
            ops_fail(o, conn, req, rc, err);
            return;
        }
        size_t all = cache_arenas(o->cache, arenas, INDEX_MAX_ARENAS);
        for (size_t i = 0; i < all; i++) {
            const struct cache_arena_info *a = &arenas[i];
            Kvnode__Arena *m = &arena_msgs[narenas];
            /* A device's HBM goes to the clients on that device only (no
             * peer mappings to set up or to fail): mapped for simulated
             * devices, through CUDA IPC when the client has a CUDA runtime. */
            bool by_fd = a->fd >= 0, by_ipc = !by_fd && a->ipc_handle && h->cuda_ipc;
            bool own_gpu = ops_arena_is_clients_gpu(a, h->cuda_device, h->cuda_pci_bus_id);
            if (a->tier == KVNODE_TIER_HBM && (!own_gpu || !(by_fd || by_ipc)))
                continue;
            if (!by_fd && !by_ipc)
                continue;
            kvnode__arena__init(m);
            m->id = a->id;
            m->tier = (Kvnode__Tier)a->tier;
            /* A lent GPU is named as the client numbers it. */
            m->device = a->tier == KVNODE_TIER_HBM ? h->cuda_device : a->device;
            m->size = a->size;
            m->fd_index = by_fd ? (int32_t)nfds : -1;
            if (by_fd)
                fds[nfds++] = a->fd;
            if (by_ipc) {
                m->cuda_ipc_handle.data = (uint8_t *)(uintptr_t)a->ipc_handle;
                m->cuda_ipc_handle.len = a->ipc_len;
            }
            arena_ptrs[narenas++] = m;
            if (a->id < 32)
                s->leases.mapped |= 1u << a->id;
            if (a->tier == KVNODE_TIER_HBM && !s->leases.put_arena)
                s->leases.put_arena = a->id;
        }
        reply.namespace_id = s->ns->id;
        reply.deployment_id = s->ns->deployment_id;
        reply.block_bytes = s->ns->layout.block_bytes;
        log_info("client pid %d uid %d (%s) bound to namespace %u (%s rank %u); GPU %d%s%.32s%s, %s",
                 (int)s->pid, (int)s->uid, s->name, s->ns->id, s->ns->deployment_id,
                 s->ns->layout.tp_rank, (int)h->cuda_device,
                 h->cuda_pci_bus_id && *h->cuda_pci_bus_id ? " (" : "",
                 h->cuda_pci_bus_id ? h->cuda_pci_bus_id : "",
                 h->cuda_pci_bus_id && *h->cuda_pci_bus_id ? ")" : "",
                 s->leases.put_arena ? "HBM lent" : "host memory only");
    } else {
        s->observer = true;
    }
    s->hello_done = true;
    reply.version = WIRE_PROTOCOL_VERSION;
    reply.server_version = (char *)KVNODE_VERSION_STRING;
    reply.n_arenas = narenas;
    reply.arenas = narenas ? arena_ptrs : NULL;
    reply.max_frame_bytes = o->cfg->max_frame_bytes;
    reply.max_keys = o->cfg->max_keys_per_request;
    reply.read_lease_ttl_ms = o->cfg->read_lease_ttl_ms;
    reply.write_lease_ttl_ms = o->cfg->write_lease_ttl_ms;
    resp.result_case = KVNODE__RESPONSE__RESULT_HELLO;
    resp.hello = &reply;
    ops_send(o, conn, req, &resp, fds, nfds);
}

static double ops_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void ops_pending_ready(void *arg);
static void ops_get_inline_reply(struct ops *o, struct conn *conn, struct session *s,
                                 const Kvnode__Request *req, uint64_t lease_id,
                                 const struct cache_loc *locs, size_t got);

/* The request answers later: remember who asks and stop reading from the
 * connection until then. 0, or -KVNODE_ENOMEM. */
static int ops_defer(struct ops *o, struct conn *conn, struct session *s,
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
    p->query = NULL;
    p->local_matched = 0;
    p->packed = NULL;
    p->packed_len = 0;
    p->put_deadline = 0;
    s->pending = p;
    o->deferred = true;
    server_defer(conn);
    return 0;
}

static void ops_match_reply(struct ops *o, struct conn *conn, const Kvnode__Request *req,
                            const struct cache_tiers *t)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__MatchReply reply = KVNODE__MATCH_REPLY__INIT;

    reply.matched = (uint32_t)t->matched;
    reply.hbm = (uint32_t)t->hbm;
    reply.host = (uint32_t)t->host;
    reply.store = (uint32_t)t->store;
    resp.result_case = KVNODE__RESPONSE__RESULT_MATCH;
    resp.match = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
}

static void ops_match(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    size_t n = req->match->n_keys;
    struct cache_tiers t;
    struct cache_wait *wait;
    char err[256];
    int rc = ops_check_keys(o, s, n, err, sizeof err);

    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    rc = cache_match_start(o->cache, s->ns, req->match->keys, n, &t, ops_pending_ready, conn, &wait);
    if (rc == CACHE_WAITING) {
        if (ops_defer(o, conn, s, req, n, wait) == 0)
            return;
        cache_match_finish(o->cache, wait, &t);
    }
    ops_match_reply(o, conn, req, &t);
}

/* --- MATCH_REMOTE ------------------------------------------------------------- */

static void ops_match_remote_reply(struct ops *o, struct conn *conn, const Kvnode__Request *req,
                                   uint32_t matched, const struct kvcm_query_answer *a)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__MatchRemoteReply reply = KVNODE__MATCH_REMOTE_REPLY__INIT;
    Kvnode__PeerMatch peers[KVCM_QUERY_MAX_HOSTS], *ptrs[KVCM_QUERY_MAX_HOSTS];
    size_t n = a->ok ? a->n : 0;

    for (size_t i = 0; i < n; i++) {
        kvnode__peer_match__init(&peers[i]);
        peers[i].host_ip_port = (char *)a->hosts[i].host_ip_port;
        peers[i].matched = a->hosts[i].matched > UINT32_MAX ? UINT32_MAX : (uint32_t)a->hosts[i].matched;
        ptrs[i] = &peers[i];
    }
    reply.matched = matched;
    reply.remote_ok = a->ok;
    reply.why = a->ok ? (char *)"" : (char *)a->why;
    reply.n_peers = n;
    reply.peers = n ? ptrs : NULL;
    resp.result_case = KVNODE__RESPONSE__RESULT_MATCH_REMOTE;
    resp.match_remote = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
}

static void ops_query_answer(void *arg, const struct kvcm_query_answer *a)
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

static void ops_match_remote(struct ops *o, struct conn *conn, struct session *s,
                             const Kvnode__Request *req)
{
    const Kvnode__MatchRemoteRequest *m = req->match_remote;
    struct kvcm_query_answer now;
    struct kvcm_query *q = NULL;
    struct cache_tiers t;
    char err[256];
    int rc = ops_check_keys(o, s, m->n_keys, err, sizeof err);

    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    cache_match_tiers(o->cache, s->ns, m->keys, m->n_keys, &t);
    if (!o->querier) {
        memset(&now, 0, sizeof now);
        snprintf(now.why, sizeof now.why, "[kvcm] is off on this node: no peers to ask");
        ops_match_remote_reply(o, conn, req, (uint32_t)t.matched, &now);
        return;
    }
    if (kvcm_query_start(o->querier, s->ns, m->keys, m->n_keys, m->max_hosts, ops_query_answer,
                         conn, &now, &q) == 0) {
        if (ops_defer(o, conn, s, req, m->n_keys, NULL) == 0) {
            s->pending->query = q;
            s->pending->local_matched = (uint32_t)t.matched;
            return;
        }
        kvcm_query_cancel(o->querier, q);
        memset(&now, 0, sizeof now);
        snprintf(now.why, sizeof now.why, "out of memory");
    }
    ops_match_remote_reply(o, conn, req, (uint32_t)t.matched, &now);
}

/* The GET_BEGIN / PUT_BEGIN reply: the lease and one location per key. */
static void ops_lease_reply(struct ops *o, struct conn *conn, struct session *s,
                            const Kvnode__Request *req, bool get, uint64_t lease_id,
                            const struct cache_loc *locs, size_t count)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__GetBeginReply get_reply = KVNODE__GET_BEGIN_REPLY__INIT;
    Kvnode__PutBeginReply put_reply = KVNODE__PUT_BEGIN_REPLY__INIT;
    struct loc_buf lb = { 0 };

    if (loc_buf_fill(&lb, locs, count) < 0) {
        uint32_t ignored;
        loc_buf_free(&lb);
        if (lease_id)
            cache_lease_end(o->cache, &s->leases, lease_id, get ? LEASE_READ : LEASE_WRITE, false,
                            &ignored, NULL, 0);
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "out of memory");
        return;
    }
    if (get) {
        get_reply.lease = lease_id;
        get_reply.n_locations = count;
        get_reply.locations = lb.ptrs;
        resp.result_case = KVNODE__RESPONSE__RESULT_GET_BEGIN;
        resp.get_begin = &get_reply;
    } else {
        put_reply.lease = lease_id;
        put_reply.n_locations = count;
        put_reply.locations = lb.ptrs;
        resp.result_case = KVNODE__RESPONSE__RESULT_PUT_BEGIN;
        resp.put_begin = &put_reply;
    }
    ops_send(o, conn, req, &resp, NULL, 0);
    loc_buf_free(&lb);
}

static void ops_put_retry(void *arg);

/* A put found the host tier full of blocks waiting for the store
 * (CACHE_STORE_BOUND): wait for store writes to land, up to
 * server.request_timeout from the request's arrival, and try again. true
 * when it waits; false when its time is up (err then says how long it
 * waited) or it cannot wait. */
static bool ops_put_backpressure(struct ops *o, struct conn *conn, struct session *s,
                                 const Kvnode__Request *req, size_t n, char *err, size_t errlen)
{
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
    if (cache_put_wait(o->cache, (unsigned)(left * 1000.0) + 1, ops_put_retry, conn, &wait) < 0) {
        free(packed);
        return false;
    }
    if (ops_defer(o, conn, s, req, n, wait) < 0) {
        cache_wait_cancel(o->cache, wait);
        free(packed);
        return false;
    }
    s->pending->packed = packed;
    s->pending->packed_len = len;
    s->pending->put_deadline = deadline;
    return true;
}

static void ops_dispatch(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);

/* A put waiting for the store may go on: handle it again as it arrived. */
static void ops_put_retry(void *arg)
{
    struct conn *conn = arg;
    struct session *s = server_conn_session(conn);
    struct ops_pending *p = s->pending;
    struct ops *o = p->o;
    Kvnode__Request *req = kvnode__request__unpack(NULL, p->packed_len, p->packed);

    s->pending = NULL;
    cache_wait_cancel(o->cache, p->wait);
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

/* GET_BEGIN and PUT_BEGIN: one lease, one location per key of the answer
 * (the ready prefix for a get, every key for a put). */
static void ops_lease_begin(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    bool get = req->op_case == KVNODE__REQUEST__OP_GET_BEGIN;
    const int64_t *keys = get ? req->get_begin->keys : req->put_begin->keys;
    size_t n = get ? req->get_begin->n_keys : req->put_begin->n_keys, count = n;
    struct cache_loc *locs = NULL;
    uint64_t lease_id = 0;
    char err[512];
    int rc = ops_check_keys(o, s, n, err, sizeof err);

    if (rc < 0)
        goto fail;
    locs = calloc(n ? n : 1, sizeof *locs);
    if (!locs) {
        rc = -KVNODE_ENOMEM;
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    if (get) {
        struct cache_wait *wait;
        rc = cache_get_start(o->cache, s->ns, &s->leases, s->leases.mapped, keys, n, &lease_id,
                             locs, &count, err, sizeof err, ops_pending_ready, conn, &wait);
        if (rc == CACHE_WAITING) {
            if (ops_defer(o, conn, s, req, n, wait) == 0) {
                free(locs);
                return;
            }
            cache_get_finish(o->cache, wait, &lease_id, locs, &count);
            rc = 0;
        }
    } else {
        rc = cache_put_begin(o->cache, s->ns, &s->leases, keys, n, (int)req->put_begin->tier,
                             &lease_id, locs, err, sizeof err);
        if (rc == CACHE_STORE_BOUND) {
            if (ops_put_backpressure(o, conn, s, req, n, err, sizeof err)) {
                free(locs);
                return;
            }
            rc = -KVNODE_ENOSPC;
        }
    }
    if (rc < 0)
        goto fail;
    ops_lease_reply(o, conn, s, req, get, lease_id, locs, count);
    free(locs);
    return;
fail:
    free(locs);
    ops_fail(o, conn, req, rc, err);
}

/* The store answered (or request_timeout passed) for a deferred request:
 * answer it and let the connection's next requests in. */
static void ops_pending_ready(void *arg)
{
    struct conn *conn = arg;
    struct session *s = server_conn_session(conn);
    struct ops_pending *p = s->pending;
    struct ops *o = p->o;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    struct cache_loc *locs = NULL;
    uint64_t lease_id = 0;
    size_t got = 0;

    s->pending = NULL;
    req.id = p->req_id;
    req.op_case = (Kvnode__Request__OpCase)p->op;
    o->last_code = 0;
    if (p->op == KVNODE__REQUEST__OP_MATCH) {
        struct cache_tiers t;
        cache_match_finish(o->cache, p->wait, &t);
        ops_match_reply(o, conn, &req, &t);
    } else {
        locs = calloc(p->n ? p->n : 1, sizeof *locs);
        if (!locs) {
            /* Nothing to put the answer in: give everything back. */
            cache_get_finish(o->cache, p->wait, &lease_id, NULL, &got);
            ops_fail(o, conn, &req, -KVNODE_ENOMEM, "out of memory");
        } else {
            cache_get_finish(o->cache, p->wait, &lease_id, locs, &got);
            if (p->op == KVNODE__REQUEST__OP_GET_INLINE)
                ops_get_inline_reply(o, conn, s, &req, lease_id, locs, got);
            else
                ops_lease_reply(o, conn, s, &req, true, lease_id, locs, got);
        }
    }
    metrics_request_observe(&o->requests, p->op, o->last_code, ops_now_s() - p->t0);
    free(locs);
    free(p);
    server_resume(conn);
}

/* GET_END, PUT_COMMIT, PUT_ABORT */
static void ops_lease_end(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__LeaseReply reply = KVNODE__LEASE_REPLY__INIT;
    const Kvnode__LeaseRequest *lr;
    int kind = LEASE_WRITE;
    bool commit = false;
    uint32_t blocks = 0;
    char err[512];
    int rc = ops_check_keys(o, s, 0, err, sizeof err);

    switch (req->op_case) {
    case KVNODE__REQUEST__OP_GET_END:
        lr = req->get_end;
        kind = LEASE_READ;
        resp.result_case = KVNODE__RESPONSE__RESULT_GET_END;
        resp.get_end = &reply;
        break;
    case KVNODE__REQUEST__OP_PUT_COMMIT:
        lr = req->put_commit;
        commit = true;
        resp.result_case = KVNODE__RESPONSE__RESULT_PUT_COMMIT;
        resp.put_commit = &reply;
        break;
    default:
        lr = req->put_abort;
        resp.result_case = KVNODE__RESPONSE__RESULT_PUT_ABORT;
        resp.put_abort = &reply;
        break;
    }
    if (rc == 0)
        rc = cache_lease_end(o->cache, &s->leases, lr->lease, kind, commit, &blocks, err, sizeof err);
    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    reply.blocks = blocks;
    ops_send(o, conn, req, &resp, NULL, 0);
}

/* Copy the ready prefix into the reply, then end the read lease. */
static void ops_get_inline_reply(struct ops *o, struct conn *conn, struct session *s,
                                 const Kvnode__Request *req, uint64_t lease_id,
                                 const struct cache_loc *locs, size_t got)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__GetInlineReply reply = KVNODE__GET_INLINE_REPLY__INIT;
    ProtobufCBinaryData *blocks = calloc(got ? got : 1, sizeof *blocks);
    uint32_t ignored;

    if (!blocks) {
        if (lease_id)
            cache_lease_end(o->cache, &s->leases, lease_id, LEASE_READ, false, &ignored, NULL, 0);
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "out of memory");
        return;
    }
    for (size_t i = 0; i < got; i++) {
        blocks[i].data = (uint8_t *)cache_arena_base(o->cache, locs[i].arena) + locs[i].offset;
        blocks[i].len = s->ns->layout.block_bytes;
    }
    reply.n_blocks = got;
    reply.blocks = blocks;
    resp.result_case = KVNODE__RESPONSE__RESULT_GET_INLINE;
    resp.get_inline = &reply;
    /* The reply is packed (copied) before this returns; then unpin. */
    ops_send(o, conn, req, &resp, NULL, 0);
    if (lease_id)
        cache_lease_end(o->cache, &s->leases, lease_id, LEASE_READ, false, &ignored, NULL, 0);
    free(blocks);
}

static void ops_get_inline(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    size_t n = req->get_inline->n_keys, got = 0;
    struct cache_loc *locs = NULL;
    struct cache_wait *wait;
    uint64_t lease_id = 0;
    char err[512];
    int rc = ops_check_keys(o, s, n, err, sizeof err);

    if (rc < 0)
        goto fail;
    if ((uint64_t)n * s->ns->layout.block_bytes + 4096u > o->cfg->max_frame_bytes) {
        rc = -KVNODE_ETOOBIG;
        snprintf(err, sizeof err, "%zu blocks of %" PRIu64 " bytes do not fit in one reply "
                 "(server.max_frame_bytes %u); ask for fewer keys", n, s->ns->layout.block_bytes,
                 o->cfg->max_frame_bytes);
        goto fail;
    }
    locs = calloc(n ? n : 1, sizeof *locs);
    if (!locs) {
        rc = -KVNODE_ENOMEM;
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    /* The loop copies the blocks into the reply: only memory its CPU can
     * read may answer (a real GPU's HBM ends the prefix). */
    rc = cache_get_start(o->cache, s->ns, &s->leases, s->leases.mapped & cache_cpu_arenas(o->cache),
                         req->get_inline->keys, n, &lease_id, locs, &got, err, sizeof err,
                         ops_pending_ready, conn, &wait);
    if (rc == CACHE_WAITING) {
        if (ops_defer(o, conn, s, req, n, wait) == 0) {
            free(locs);
            return;
        }
        cache_get_finish(o->cache, wait, &lease_id, locs, &got);
        rc = 0;
    }
    if (rc < 0)
        goto fail;
    ops_get_inline_reply(o, conn, s, req, lease_id, locs, got);
    free(locs);
    return;
fail:
    free(locs);
    ops_fail(o, conn, req, rc, err);
}

static void ops_put_inline(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__PutInlineRequest *p = req->put_inline;
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__PutInlineReply reply = KVNODE__PUT_INLINE_REPLY__INIT;
    size_t n = p->n_keys, stored = 0;
    struct cache_loc *locs = NULL;
    uint64_t lease_id = 0;
    uint32_t ignored;
    char err[512];
    int rc = ops_check_keys(o, s, n, err, sizeof err);

    if (rc < 0)
        goto fail;
    if (p->n_blocks != n) {
        rc = -KVNODE_EINVAL;
        snprintf(err, sizeof err, "put_inline carries %zu keys but %zu blocks", n, p->n_blocks);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        if (p->blocks[i].len != s->ns->layout.block_bytes) {
            rc = -KVNODE_EINVAL;
            snprintf(err, sizeof err, "block %zu is %zu bytes; this namespace's blocks are %" PRIu64,
                     i, p->blocks[i].len, s->ns->layout.block_bytes);
            goto fail;
        }
    }
    locs = calloc(n ? n : 1, sizeof *locs);
    if (!locs) {
        rc = -KVNODE_ENOMEM;
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    rc = cache_put_begin(o->cache, s->ns, &s->leases, p->keys, n, KVNODE_TIER_HOST, &lease_id,
                         locs, err, sizeof err);
    if (rc == CACHE_STORE_BOUND) {
        if (ops_put_backpressure(o, conn, s, req, n, err, sizeof err)) {
            free(locs);
            return;
        }
        rc = -KVNODE_ENOSPC;
    }
    if (rc < 0)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        if (!locs[i].present)
            continue;
        memcpy((uint8_t *)cache_arena_base(o->cache, locs[i].arena) + locs[i].offset,
               p->blocks[i].data, p->blocks[i].len);
        stored++;
    }
    if (lease_id)
        cache_lease_end(o->cache, &s->leases, lease_id, LEASE_WRITE, true, &ignored, NULL, 0);
    reply.stored = (uint32_t)stored;
    reply.existing = (uint32_t)(n - stored);
    resp.result_case = KVNODE__RESPONSE__RESULT_PUT_INLINE;
    resp.put_inline = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
    free(locs);
    return;
fail:
    free(locs);
    ops_fail(o, conn, req, rc, err);
}

static void ops_delete(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__DeleteReply reply = KVNODE__DELETE_REPLY__INIT;
    uint32_t deleted = 0;
    char err[256];
    int rc = ops_check_keys(o, s, req->delete_->n_keys, err, sizeof err);

    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    cache_delete(o->cache, s->ns, req->delete_->keys, req->delete_->n_keys, &deleted);
    reply.deleted = deleted;
    resp.result_case = KVNODE__RESPONSE__RESULT_DELETE;
    resp.delete_ = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
}

static void ops_stats(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__StatsReply reply = KVNODE__STATS_REPLY__INIT;
    json_t *doc;
    char *text;

    if (!s->hello_done) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "send HELLO first");
        return;
    }
    /* Count this request before the document is built, so it shows itself. */
    o->counts[KVNODE__REQUEST__OP_STATS].ok++;
    doc = o->stats_hook ? o->stats_hook(o->stats_hook_arg) : NULL;
    text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text) {
        o->counts[KVNODE__REQUEST__OP_STATS].ok--;
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "cannot build the stats document");
        return;
    }
    reply.json = text;
    resp.result_case = KVNODE__RESPONSE__RESULT_STATS;
    resp.stats = &reply;
    resp.id = req->id;
    if (server_reply(conn, &resp, NULL, 0) < 0) {
        o->last_code = -KVNODE_EINTERNAL;
        server_reply_error(conn, req->id, -KVNODE_EINTERNAL, "cannot encode the stats reply");
    }
    free(text);
}

static void ops_ping(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__PingReply reply = KVNODE__PING_REPLY__INIT;

    if (!s->hello_done) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "send HELLO first");
        return;
    }
    reply.nonce = req->ping->nonce;
    resp.result_case = KVNODE__RESPONSE__RESULT_PING;
    resp.ping = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
}

/* RELOAD: only root or the daemon's own user may change what it runs. */
static void ops_reload(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__ReloadReply reply = KVNODE__RELOAD_REPLY__INIT;
    char error[CONFIG_ERR_MAX], not_applied[1024] = "";

    if (s->uid != 0 && s->uid != geteuid()) {
        snprintf(error, sizeof error, "reload needs root or the daemon's user (uid %d); "
                 "this client runs as uid %d", (int)geteuid(), (int)s->uid);
        ops_fail(o, conn, req, -KVNODE_EDENIED, error);
        return;
    }
    if (!o->reload) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "this daemon cannot reload");
        return;
    }
    log_info("reload requested by pid %d uid %d (%s)", (int)s->pid, (int)s->uid, s->name);
    if (o->reload(o->reload_arg, error, sizeof error, not_applied, sizeof not_applied) < 0) {
        ops_fail(o, conn, req, -KVNODE_EINVAL, error);
        return;
    }
    reply.not_applied = not_applied;
    resp.result_case = KVNODE__RESPONSE__RESULT_RELOAD;
    resp.reload = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
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

static void ops_dispatch(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    if (!s->hello_done && req->op_case != KVNODE__REQUEST__OP_HELLO &&
        req->op_case != KVNODE__REQUEST__OP__NOT_SET) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "send HELLO first: the connection is not bound "
                 "to a namespace");
        return;
    }
    switch (req->op_case) {
    case KVNODE__REQUEST__OP_HELLO:      ops_hello(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_MATCH:      ops_match(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_GET_BEGIN:  ops_lease_begin(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_GET_END:
    case KVNODE__REQUEST__OP_PUT_COMMIT:
    case KVNODE__REQUEST__OP_PUT_ABORT:  ops_lease_end(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_PUT_BEGIN:  ops_lease_begin(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_GET_INLINE: ops_get_inline(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_PUT_INLINE: ops_put_inline(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_DELETE:     ops_delete(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_STATS:      ops_stats(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_PING:       ops_ping(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_RELOAD:     ops_reload(o, conn, s, req); break;
    case KVNODE__REQUEST__OP_MATCH_REMOTE: ops_match_remote(o, conn, s, req); break;
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

struct server_handler ops_server_handler(struct ops *o)
{
    return (struct server_handler){ .request = ops_request_cb, .session_end = ops_session_end_cb, .arg = o };
}
