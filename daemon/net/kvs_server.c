/* kvs_server: the KVS front end's HTTP control plane and its leases (see
 * kvs_server.h). Owns the evhttp listener, the HTTP lease table (id -> the
 * kvnode leases it holds, one per namespace and slice of the request that
 * granted it, each owned by the HTTP lease's own lease_list), the sweep
 * that frees records past their term, and /seal /release /discard
 * (/acquire is kvs_server_acquire.c's).
 *
 * Replies are exactly what rtp-llm's KVSClient accepts: /health and /acquire
 * 200 with JSON, /seal /release /discard 204 without a body; objects that a
 * create finds sealed are left out (not nulled; one that another create
 * lease is still writing makes the create wait for that lease to seal or
 * end, up to server.request_timeout, then 503), a create where every
 * object exists answers lease_id "", reads are best-effort (misses left
 * out); integers are JSON integers. Errors are JSON {"error": "..."} with
 * 400 (malformed, wrong key format), 403 (no tenant for the peer), 404
 * (unknown route or lease), 405, 409 (a create of a key held at another
 * size), 410 (seal of an unsealed create lease of the caller's tenant past
 * its term, remembered as kvs_server_leases.h says), 413 (too many keys, a
 * create over max_reserved_per_client, a reply over max_output_bytes), 503
 * (no room now). Loop thread only. */
#include "net/kvs_server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

#include "cache/cache.h"
#include "core/clock.h"
#include "core/errmsg.h"
#include "core/workq.h"
#include "core/log.h"
#include "kvnode.h"
#include "net/httpd.h"
#include "net/kvs_server_internal.h"
#include "net/kvs_server_leases.h"
#include "tenants/tenants.h"

#define KVS_SWEEP_MS        250     /* how often expired records are looked for */
#define KVS_SWEEP_BATCH     512     /* records looked at per sweep (no O(n) pause) */
#define KVS_HTTP_TIMEOUT_S  30      /* idle / slow HTTP connections */
#define KVS_UNKNOWN_LEASE   "unknown lease_id: never granted, already ended, or past its term"

/* --- lease table ---------------------------------------------------------------- */

static struct kvs_lease **kvs_bucket(struct kvs_server *k, const struct kvs_lease_id *id)
{
    return &k->buckets[(id->lo * 0x9e3779b97f4a7c15ull) >> 40 & (k->nbuckets - 1)];
}

static struct kvs_lease *kvs_lease_find(struct kvs_server *k, const struct kvs_lease_id *id)
{
    for (struct kvs_lease *l = *kvs_bucket(k, id); l; l = l->hnext)
        if (kvs_lease_id_eq(&l->id, id))
            return l;
    return NULL;
}

struct kvs_lease *kvs_lease_new(struct kvs_server *k, struct tenant *t, int kind, uint64_t term_ms)
{
    struct kvs_lease *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->id = kvs_leases_open(&k->leases, t);
    l->kind = kind;
    l->tenant = t;
    l->owner.ttl_ms = term_ms;
    l->expires_ms = UINT64_MAX;   /* the request granting it sets its term when it answers */
    l->hnext = *kvs_bucket(k, &l->id);
    *kvs_bucket(k, &l->id) = l;
    l->prev = k->tail;
    if (k->tail)
        k->tail->next = l;
    else
        k->head = l;
    k->tail = l;
    k->st.leases_open++;
    return l;
}

/* End what the record still holds (a reaped kvnode lease is gone already)
 * and free it. */
void kvs_lease_free(struct kvs_server *k, struct kvs_lease *l)
{
    struct kvs_lease **p = kvs_bucket(k, &l->id);
    while (*p != l)
        p = &(*p)->hnext;
    *p = l->hnext;
    if (k->cursor == l)
        k->cursor = l->next;
    if (l->prev)
        l->prev->next = l->next;
    else
        k->head = l->next;
    if (l->next)
        l->next->prev = l->prev;
    else
        k->tail = l->prev;
    if (l->tenant->cache)
        cache_release_owner(l->tenant->cache, &l->owner);
    kvs_leases_close(&k->leases, l->tenant);
    k->st.leases_open--;
    free(l->sub);
    free(l);
}

bool kvs_lease_sub_room(struct kvs_lease *l, size_t more)
{
    if (l->nsub + more <= l->capsub)
        return true;
    size_t cap = l->capsub ? l->capsub : 8;
    while (cap < l->nsub + more)
        cap *= 2;
    uint64_t *sub = realloc(l->sub, cap * sizeof *sub);
    if (!sub)
        return false;
    l->sub = sub;
    l->capsub = cap;
    return true;
}

static void kvs_sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kvs_server *k = arg;
    uint64_t now = clock_now_ms();
    (void)fd;
    (void)what;

    if (!k->cursor)
        k->cursor = k->head;
    for (size_t i = 0; i < KVS_SWEEP_BATCH && k->cursor; i++) {
        struct kvs_lease *l = k->cursor;
        k->cursor = l->next;
        if (now >= l->expires_ms) {
            k->st.leases_expired++;
            if (l->kind == LEASE_WRITE && !l->sealed)
                kvs_leases_note_ended(&k->leases, &l->id, l->tenant, now);
            kvs_lease_free(k, l);
        }
    }
}

/* --- replies ----------------------------------------------------------------------- */

bool kvs_reply_text(struct evhttp_request *req, int code, char *text)
{
    struct evbuffer *out = evbuffer_new();
    int asked = code;
    if (text)
        text = kvs_http_bound_reply(req, &code, text);
    if (text && out) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
        evbuffer_add(out, text, strlen(text));
    }
    httpd_send_reply(req, code, code == 200 ? "OK" : code == 204 ? "No Content" : "Error", text ? out : NULL);
    if (out)
        evbuffer_free(out);
    free(text);
    return code == asked;
}

static bool kvs_reply(struct evhttp_request *req, int code, json_t *body)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    return kvs_reply_text(req, code, text);
}

void kvs_fail(struct kvs_server *k, struct evhttp_request *req, int code, const char *msg)
{
    if (code == 403)
        k->st.denied++;
    else if (code >= 500)
        k->st.failed++;
    else
        k->st.bad_requests++;
    log_debug("kvs front end: %d %s", code, msg);
    kvs_reply(req, code, json_pack("{s:s}", "error", msg));
}

int kvs_status_of(int rc)
{
    switch (rc) {
    case -KVNODE_EINVAL:
    case -KVNODE_ELAYOUT:
        return 400;
    case -KVNODE_ENOSPC:
    case -KVNODE_ELIMIT:
    case CACHE_STORE_BOUND:
        return 503;
    default:
        return 500;
    }
}

/* --- requests --------------------------------------------------------------------- */

/* The tenant of the request's peer; NULL after answering 403. */
static struct tenant *kvs_request_tenant(struct kvs_server *k, struct evhttp_request *req)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
    int fd = bev ? (int)bufferevent_getfd(bev) : -1;
    char why[512] = "the connection has no socket";
    struct tenant *t = NULL;

    if (fd >= 0 && (*k->deps.cfg)->kvs_listen_addr.kind == CONFIG_LISTEN_UNIX) {
        struct ucred cred;
        t = kvs_server_unix_tenant(*k->deps.cfg, k->deps.tenants, fd, &cred, why, sizeof why);
    } else if (fd >= 0) {
        /* TCP: the uid established when the connection was accepted. */
        const struct httpd_peer *peer = httpd_request_peer(k->httpd, req);
        if (!peer)
            snprintf(why, sizeof why, "the connection's owner was not established when it was accepted");
        else if (!peer->known)
            snprintf(why, sizeof why, "%s", peer->why);
        else if (peer)
            t = kvs_server_tenant(*k->deps.cfg, k->deps.tenants, peer->uid, (gid_t)-1, NULL, 0, false, why,
                                  sizeof why);
    }
    if (!t) {
        char msg[640];
        snprintf(msg, sizeof msg, "cannot establish the tenant of this client: %s", why);
        kvs_fail(k, req, 403, msg);
    }
    return t;
}

/* The request body as a JSON object; NULL after answering 400. */
static json_t *kvs_request_json(struct kvs_server *k, struct evhttp_request *req)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    json_error_t jerr;
    json_t *j = json_loadb(body, len, 0, &jerr);
    char msg[320];

    if (!j || !json_is_object(j)) {
        snprintf(msg, sizeof msg, "the body must be a JSON object (%s)", j ? "it is another JSON value" : jerr.text);
        json_decref(j);
        kvs_fail(k, req, 400, msg);
        return NULL;
    }
    return j;
}

/* A lease_id member: KVS_LEASE_ID_HEX hex digits; *none for "". -1 after
 * answering (an id of another shape answers as an unknown lease does). */
static int kvs_request_lease(struct kvs_server *k, struct evhttp_request *req, json_t *body,
                             struct kvs_lease_id *id, bool *none)
{
    json_t *j = json_object_get(body, "lease_id");

    *none = false;
    if (!json_is_string(j)) {
        kvs_fail(k, req, 400, "the body needs \"lease_id\": a string from /acquire");
        return -1;
    }
    if (json_string_length(j) == 0) {
        *none = true;
        return 0;
    }
    if (!kvs_lease_id_parse(json_string_value(j), json_string_length(j), id)) {
        kvs_fail(k, req, 404, KVS_UNKNOWN_LEASE);
        return -1;
    }
    return 0;
}

/* /seal, /release, /discard */
static void kvs_lease_call(struct kvs_server *k, struct evhttp_request *req, struct tenant *t, const char *route)
{
    json_t *body = kvs_request_json(k, req);
    struct kvs_lease *l;
    struct kvs_lease_id id;
    bool none;
    char msg[512];

    if (!body)
        return;
    if (kvs_request_lease(k, req, body, &id, &none) < 0) {
        json_decref(body);
        return;
    }
    json_decref(body);
    if (none && strcmp(route, "seal") != 0) {
        kvs_reply(req, 204, NULL);   /* "": nothing was held */
        return;
    }
    l = none ? NULL : kvs_lease_find(k, &id);
    if (l && l->expires_ms == UINT64_MAX)
        l = NULL;   /* its /acquire has not answered yet */
    bool seal = strcmp(route, "seal") == 0;
    if (seal && l && l->tenant == t && l->kind == LEASE_WRITE && !l->sealed && clock_now_ms() >= l->expires_ms) {
        /* Past its term, not swept yet: it ends now, as the sweep would end it. */
        k->st.leases_expired++;
        kvs_leases_note_ended(&k->leases, &l->id, t, clock_now_ms());
        kvs_lease_free(k, l);
        l = NULL;
    }
    if (seal && !l && !none && kvs_leases_ended(&k->leases, &id, t, clock_now_ms())) {
        kvs_fail(k, req, 410, "the create lease passed its term before seal; its objects were dropped (create "
                 "them again)");
        return;
    }
    if (!l || l->tenant != t) {
        /* Another tenant's lease is as unknown as one that never was. */
        kvs_fail(k, req, 404, KVS_UNKNOWN_LEASE);
        return;
    }
    if (seal) {
        k->st.seal++;
        if (l->kind != LEASE_WRITE) {
            kvs_fail(k, req, 400, "seal needs a create lease; this is a read lease (release it)");
            return;
        }
        for (size_t i = 0; i < l->nsub && !l->sealed; i++) {
            uint32_t blocks = 0;
            if (l->sub[i] && cache_lease_end(t->cache, &l->owner, l->sub[i], LEASE_WRITE, true, &blocks, msg,
                                             sizeof msg) < 0) {
                snprintf(msg, sizeof msg, "the create lease passed its term before seal; its objects were "
                         "dropped (create them again)");
                kvs_leases_note_ended(&k->leases, &l->id, t, clock_now_ms());
                kvs_lease_free(k, l);
                kvs_fail(k, req, 410, msg);
                return;
            }
            l->sub[i] = 0;
        }
        l->sealed = true;
        kvs_reply(req, 204, NULL);
        return;
    }
    if (route[0] == 'r')
        k->st.release++;
    else
        k->st.discard++;
    /* Answered first: the lease's end cannot fail, and nothing else runs on
     * the loop between the two, so no request can see the lease's blocks
     * still held; the client stops waiting one lease's worth of work sooner. */
    kvs_reply(req, 204, NULL);
    kvs_lease_free(k, l);   /* unsealed writes are aborted, reads unpinned */
}

static void kvs_http_cb(struct evhttp_request *req, void *arg)
{
    struct kvs_server *k = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type method = evhttp_request_get_command(req);
    struct tenant *t;

    httpd_request_arrived(k->httpd, req);
    if (!path || *path != '/') {
        kvs_fail(k, req, 404, "unknown route (expected /health, /acquire, /seal, /release or /discard)");
        return;
    }
    path++;
    if (strcmp(path, "health") == 0) {
        if (method != EVHTTP_REQ_GET && method != EVHTTP_REQ_HEAD) {
            kvs_fail(k, req, 405, "/health takes GET");
            return;
        }
        k->st.health++;
        kvs_reply(req, 200, json_pack("{s:s}", "status", "ok"));
        return;
    }
    if (strcmp(path, "acquire") != 0 && strcmp(path, "seal") != 0 && strcmp(path, "release") != 0 &&
        strcmp(path, "discard") != 0) {
        kvs_fail(k, req, 404, "unknown route (expected /health, /acquire, /seal, /release or /discard)");
        return;
    }
    if (method != EVHTTP_REQ_POST) {
        kvs_fail(k, req, 405, "this route takes POST with a JSON body");
        return;
    }
    if (!(t = kvs_request_tenant(k, req)))
        return;
    if (strcmp(path, "acquire") == 0)
        kvs_acquire(k, req, t);
    else
        kvs_lease_call(k, req, t, path);
}

/* --- server ------------------------------------------------------------------------ */

static void kvs_limits(void *arg, struct httpd_limits *out)
{
    const struct kvs_server *k = arg;
    out->max_connections = (*k->deps.cfg)->kvs_max_connections;
    out->request_timeout_ms = (*k->deps.cfg)->kvs_request_timeout_ms;
    out->max_connections_option = "kvs_server.max_connections";
    out->max_output_bytes = (*k->deps.cfg)->kvs_max_output_bytes;
    out->max_output_total_bytes = (*k->deps.cfg)->kvs_max_output_total_bytes;
    out->max_output_option = "kvs_server.max_output_bytes";
    out->max_output_total_option = "kvs_server.max_output_total_bytes";
    out->max_input_total_bytes = (*k->deps.cfg)->kvs_max_input_total_bytes;
    out->max_input_total_option = "kvs_server.max_input_total_bytes";
}

int kvs_server_create(const struct kvs_server_deps *deps, struct kvs_server **out, char *err, size_t errlen)
{
    const struct kvn_config *cfg = *deps->cfg;
    struct kvs_server *k;
    struct evhttp *http;
    struct timeval tv = { .tv_sec = 0, .tv_usec = KVS_SWEEP_MS * 1000 };

    *out = NULL;
    if (!cfg->kvs_enabled)
        return 0;
    k = calloc(1, sizeof *k);
    if (!k) {
        errmsg_set(err, errlen, "kvs front end: out of memory");
        return -1;
    }
    k->deps = *deps;
    k->diag_fd = -1;
    for (k->nbuckets = 64; k->nbuckets < cfg->kvs_max_leases; k->nbuckets <<= 1)
        ;
    kvs_leases_init(&k->leases);
    k->buckets = calloc(k->nbuckets, sizeof *k->buckets);
    k->replies = kvs_reply_pool_new();
    k->sweep_ev = event_new(deps->base, -1, EV_PERSIST, kvs_sweep_cb, k);
    if (!k->buckets || !k->replies || !k->sweep_ev || event_add(k->sweep_ev, &tv) < 0) {
        kvs_server_destroy(k);
        errmsg_set(err, errlen, "kvs front end: out of memory");
        return -1;
    }
    if (httpd_create(deps->base, "KVS front end", "[kvs_server] listen", &cfg->kvs_listen_addr, cfg->socket_mode,
                     kvs_limits, k, &k->httpd, err, errlen) < 0) {
        kvs_server_destroy(k);
        return -1;
    }
    if (cfg->kvs_listen_addr.kind != CONFIG_LISTEN_UNIX)
        httpd_set_identify(k->httpd, kvs_identify_tcp, &k->diag_fd);
    if (!(k->conns = kvs_http_conns_new(deps->cfg, deps->tenants))) {
        kvs_server_destroy(k);
        errmsg_set(err, errlen, "kvs front end: out of memory");
        return -1;
    }
    httpd_set_admit(k->httpd, kvs_http_admit, kvs_http_release, k->conns);
    httpd_set_group_output(k->httpd, kvs_http_group_output, k->conns);
    httpd_set_group_input(k->httpd, kvs_http_group_input, k->conns);
    http = httpd_evhttp(k->httpd);
    evhttp_set_timeout(http, KVS_HTTP_TIMEOUT_S);
    evhttp_set_max_headers_size(http, 64 << 10);
    /* Bodies up to the limit are read; with Expect: 100-continue evhttp
     * answers 100 Continue at once (417 above the limit), so libcurl does
     * not wait its 1 s for it. */
    evhttp_set_max_body_size(http, cfg->kvs_max_body_bytes);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                         EVHTTP_REQ_DELETE);
    evhttp_set_gencb(http, kvs_http_cb, k);
    if (workq_create(deps->base, "kvs-parse", 1, KVS_PARSE_QUEUE, &k->parse_q, err, errlen) < 0) {
        kvs_server_destroy(k);
        return -1;
    }
    if (kvs_dataplane_create(deps, &k->dp, err, errlen) < 0) {
        kvs_server_destroy(k);
        return -1;
    }
    k->st.http_address = httpd_address(k->httpd);
    log_info("KVS front end (rtp-llm's KVS protocol): HTTP on %s, data plane on %s, tp_size %u, terms %u..%u s",
             httpd_address(k->httpd), cfg->kvs_socket_path, cfg->kvs_tp_size, 1u, cfg->kvs_max_term_ms / 1000);
    *out = k;
    return 0;
}

void kvs_server_begin_shutdown(struct kvs_server *k)
{
    if (!k)
        return;
    httpd_begin_shutdown(k->httpd);
    kvs_dataplane_stop(k->dp);
}

void kvs_server_destroy(struct kvs_server *k)
{
    if (!k)
        return;
    httpd_destroy(k->httpd);         /* requests being parsed hear that their connection went */
    workq_destroy(k->parse_q);       /* ... and end here */
    kvs_http_conns_free(k->conns);   /* after httpd: its connections' tokens point here */
    if (k->sweep_ev)
        event_free(k->sweep_ev);
    while (k->head)
        kvs_lease_free(k, k->head);
    kvs_dataplane_destroy(k->dp);
    if (k->diag_fd >= 0)
        close(k->diag_fd);
    if (k->replies)
        kvs_reply_pool_release(k->replies);
    free(k->buckets);
    free(k);
}

void kvs_server_get_stats(const struct kvs_server *k, struct kvs_server_stats *out)
{
    struct httpd_stats h;
    *out = k->st;
    httpd_get_stats(k->httpd, &h);
    out->http_open = h.open;
    out->http_max = h.max;
    out->http_accepted = h.accepted;
    out->http_refused = h.refused;
    out->http_timed_out = h.timed_out;
    out->http_tenant_limit = kvs_http_tenant_limit(k->conns);
    out->http_output_bytes = h.output_bytes;
    out->http_output_max = h.output_max;
    out->http_output_refused = h.output_refused;
    out->http_output_tenant_limit = h.output_refused_group;
    out->http_input_bytes = h.input_bytes;
    out->http_input_max = h.input_max;
    out->http_input_refused = h.input_refused;
    out->http_input_tenant_limit = h.input_refused_group;
    out->http_replies_inline = h.replies_inline;
    out->http_reads_extended = h.reads_extended;
    out->http_reads_early = h.reads_early;
    if (k->dp)
        kvs_dataplane_stats(k->dp, out);
}
