/* kvs_server: the KVS front end's HTTP control plane and its leases (see
 * kvs_server.h). Owns the evhttp listener, the HTTP lease table (id -> the
 * kvnode leases it holds, one per namespace, each owned by the HTTP lease's
 * own lease_list) and the sweep that frees records past their term.
 *
 * Replies are exactly what rtp-llm's KVSClient accepts: /health and /acquire
 * 200 with JSON, /seal /release /discard 204 without a body; objects that a
 * create finds sealed are left out (not nulled; one that another create
 * lease is still writing makes the create wait for that lease to seal or
 * end, up to server.request_timeout, then 503), a create where every
 * object exists answers lease_id "", reads are best-effort (misses left
 * out); integers are JSON integers. Errors are JSON {"error": "..."} with
 * 400 (malformed, wrong key format, size conflict), 403 (no tenant for the
 * peer), 404 (unknown route or lease), 405, 410 (seal of an unsealed create
 * lease of the caller's tenant past its term, remembered as
 * kvs_server_leases.h says),
 * 413 (too many keys), 503 (no room now). Loop thread only. */
#include "net/kvs_server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

#include "cache/cache.h"
#include "core/clock.h"
#include "core/errmsg.h"
#include "core/log.h"
#include "kvnode.h"
#include "net/httpd.h"
#include "net/kvs_server_leases.h"
#include "tenants/tenants.h"

#define KVS_MAX_NS          64      /* namespaces one request may touch */
#define KVS_SWEEP_MS        250     /* how often expired records are looked for */
#define KVS_SWEEP_BATCH     512     /* records looked at per sweep (no O(n) pause) */
#define KVS_HTTP_TIMEOUT_S  30      /* idle / slow HTTP connections */
#define KVS_UNKNOWN_LEASE   "unknown lease_id: never granted, already ended, or past its term"

struct kvs_lease {
    struct kvs_lease_id id;         /* 128 random bits (kvs_server_leases.h) */
    int kind;                       /* LEASE_READ or LEASE_WRITE */
    bool sealed;
    struct tenant *tenant;
    struct lease_list owner;        /* the kvnode leases, one per namespace */
    uint64_t expires_ms;
    uint64_t sub[KVS_MAX_NS];       /* kvnode lease ids (0: none) */
    size_t nsub;
    struct kvs_lease *hnext, *prev, *next;
};

struct kvs_server {
    struct kvs_server_deps deps;        /* base, config, tenants (kvs_server_create) */
    struct httpd *httpd;                /* the listener, connection cap, request deadline */
    struct event *sweep_ev;
    struct kvs_dataplane *dp;
    struct kvs_lease **buckets;
    size_t nbuckets;
    struct kvs_lease *head, *tail, *cursor;
    struct kvs_leases leases;           /* ids, each tenant's open leases */
    struct kvs_http_conns *conns;       /* each tenant's open HTTP connections */
    struct kvs_server_stats st;
};

/* A create that waits for room (the host tier still being reserved at start-up,
 * or full of blocks not yet written to the store): retried when the cache
 * says room may have come, answered 503 past [server] request_timeout.
 * httpd watches its connection (httpd_request_watch): a client that leaves
 * ends the wait at once (kvs_pending_gone). Exactly one of the answer and
 * kvs_pending_gone ends it. */
struct kvs_pending {
    struct kvs_server *k;
    struct evhttp_request *req;
    struct tenant *t;
    json_t *body;
    struct cache_wait *wait;
    uint64_t deadline_ms;
};

static void kvs_acquire_run(struct kvs_server *k, struct evhttp_request *req, struct tenant *t, json_t *body,
                            struct kvs_pending *p);

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

static struct kvs_lease *kvs_lease_new(struct kvs_server *k, struct tenant *t, int kind, uint64_t term_ms)
{
    struct kvs_lease *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->id = kvs_leases_open(&k->leases, t);
    l->kind = kind;
    l->tenant = t;
    l->owner.ttl_ms = term_ms;
    l->expires_ms = clock_now_ms() + term_ms;
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
static void kvs_lease_free(struct kvs_server *k, struct kvs_lease *l)
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
    free(l);
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

/* false when the reply was over the output caps and an error went instead. */
static bool kvs_reply(struct evhttp_request *req, int code, json_t *body)
{
    struct evbuffer *out = evbuffer_new();
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    int asked = code;
    json_decref(body);
    if (text)
        text = kvs_http_bound_reply(req, &code, text);
    if (text && out) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
        evbuffer_add(out, text, strlen(text));
    }
    evhttp_send_reply(req, code, code == 200 ? "OK" : code == 204 ? "No Content" : "Error", text ? out : NULL);
    if (out)
        evbuffer_free(out);
    free(text);
    return code == asked;
}

static void kvs_fail(struct kvs_server *k, struct evhttp_request *req, int code, const char *msg)
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

/* The HTTP status of a cache error. */
static int kvs_status_of(int rc)
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

/* The keys of one namespace in a request. */
struct kvs_group {
    struct kvs_key id;              /* block unused */
    struct kv_namespace *ns;
    uint64_t size;                  /* create: the block size asked for */
    size_t n;
    int64_t *keys;
    size_t *index;                  /* into the request's key array */
    struct cache_loc *locs;
    uint64_t *bytes;                /* read: each hit's object size */
    uint64_t *checks;               /* opaque keys' check words (NULL for v1 keys) */
};

static bool kvs_same_ns(const struct kvs_key *a, const struct kvs_key *b)
{
    return a->opaque == b->opaque && a->tp_rank == b->tp_rank && a->group == b->group &&
           a->version == b->version && strcmp(a->deployment_id, b->deployment_id) == 0 &&
           strcmp(a->object_ns, b->object_ns) == 0;
}

static void kvs_groups_free(struct kvs_group *g, size_t ng)
{
    for (size_t i = 0; i < ng; i++) {
        free(g[i].keys);
        free(g[i].index);
        free(g[i].locs);
        free(g[i].bytes);
        free(g[i].checks);
    }
    free(g);
}

/* Sort the request's keys into namespaces. 0, or an HTTP status with msg. */
static int kvs_group_keys(json_t *keys, json_t *metas, struct kvs_group **out, size_t *nout, char *msg,
                          size_t msglen)
{
    size_t n = json_array_size(keys), ng = 0;
    struct kvs_group *g = calloc(KVS_MAX_NS, sizeof *g);
    size_t *which = calloc(n ? n : 1, sizeof *which);
    struct kvs_key key;
    int status = 500;

    snprintf(msg, msglen, "out of memory");
    if (!g || !which)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        json_t *jk = json_array_get(keys, i);
        uint64_t size = 0;
        size_t j;
        status = 400;
        if (!json_is_string(jk)) {
            snprintf(msg, msglen, "object_keys[%zu] is not a string", i);
            goto fail;
        }
        if (kvs_key_classify(json_string_value(jk), json_string_length(jk), &key, msg, msglen) < 0)
            goto fail;
        if (metas) {
            json_t *m = json_array_get(metas, i), *sz = json_object_get(m, "size");
            const char *layout = json_string_value(json_object_get(m, "layout"));
            if (!json_is_integer(sz) || json_integer_value(sz) <= 0 || json_integer_value(sz) > (json_int_t)UINT32_MAX) {
                snprintf(msg, msglen, "object_metas[%zu].size must be an integer from 1 to %u", i, UINT32_MAX);
                goto fail;
            }
            if (layout && strcmp(layout, KVS_LAYOUT_NAME) != 0) {
                snprintf(msg, msglen, "object_metas[%zu].layout is '%.64s'; this server stores %s objects", i,
                         layout, KVS_LAYOUT_NAME);
                goto fail;
            }
            size = (uint64_t)json_integer_value(sz);
        }
        for (j = ng; j-- > 0;)
            if (kvs_same_ns(&g[j].id, &key) && g[j].size == size)
                break;   /* a create's objects of another size: another namespace */
        if (j == SIZE_MAX) {
            if (ng == KVS_MAX_NS) {
                snprintf(msg, msglen, "the keys name more than %d (deployment, rank, group, size) namespaces; send "
                         "fewer at once", KVS_MAX_NS);
                goto fail;
            }
            j = ng++;
            g[j].id = key;
            g[j].size = size;
        }
        g[j].n++;
        which[i] = j;
    }
    status = 500;
    for (size_t j = 0; j < ng; j++) {
        g[j].keys = malloc(g[j].n * sizeof *g[j].keys);
        g[j].index = malloc(g[j].n * sizeof *g[j].index);
        g[j].locs = calloc(g[j].n, sizeof *g[j].locs);
        g[j].checks = g[j].id.opaque ? malloc(g[j].n * sizeof *g[j].checks) : NULL;
        if (!g[j].keys || !g[j].index || !g[j].locs || (g[j].id.opaque && !g[j].checks))
            goto fail_groups;
        g[j].n = 0;
    }
    for (size_t i = 0; i < n; i++) {
        struct kvs_group *x = &g[which[i]];
        /* Parsed again rather than kept: n may be large, a key is cheap. */
        kvs_key_classify(json_string_value(json_array_get(keys, i)), json_string_length(json_array_get(keys, i)),
                         &key, msg, msglen);
        if (x->checks)
            x->checks[x->n] = key.check;
        x->keys[x->n] = key.block;
        x->index[x->n++] = i;
    }
    free(which);
    *out = g;
    *nout = ng;
    return 0;
fail_groups:
    snprintf(msg, msglen, "out of memory");
fail:
    free(which);
    if (g)
        kvs_groups_free(g, ng);
    return status;
}

static json_t *kvs_object(const char *key, uint64_t offset, uint64_t size)
{
    return json_pack("{s:s, s:[{s:s, s:{s:I, s:I, s:I}}], s:{s:I}}", "key", key, "blobs", "type", "vineyard",
                     "handle", "data_offset", (json_int_t)offset, "data_size", (json_int_t)size, "object_id",
                     (json_int_t)offset, "meta", "size", (json_int_t)size);
}

/* The connection closed while the create waited (the client left, or
 * shutdown): drop the wait. evhttp frees the request; nothing answers it. */
static void kvs_pending_gone(void *arg)
{
    struct kvs_pending *p = arg;
    if (p->wait)
        cache_wait_cancel(p->t->cache, p->wait);
    json_decref(p->body);
    free(p);
}

static void kvs_pending_ready(void *arg)
{
    struct kvs_pending *p = arg;
    cache_wait_cancel(p->t->cache, p->wait);
    p->wait = NULL;
    kvs_acquire_run(p->k, p->req, p->t, p->body, p);
}

/* The waiting create is being answered: httpd stops watching its
 * connection, and p goes (body not). NULL ignored. */
static void kvs_pending_end(struct kvs_server *k, struct kvs_pending *p)
{
    if (!p)
        return;
    if (p->wait)
        cache_wait_cancel(p->t->cache, p->wait);
    httpd_request_unwatch(k->httpd, p->req);
    free(p);
}

/* Wait for room; false when the deadline passed or the wait cannot be set
 * up (*pp, when set, is then the caller's to end with kvs_pending_end). */
static bool kvs_pending_wait(struct kvs_server *k, struct evhttp_request *req, struct tenant *t, json_t *body,
                             struct kvs_pending **pp)
{
    struct kvs_pending *p = *pp;
    uint64_t now = clock_now_ms();
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p)
            return false;
        *p = (struct kvs_pending){ .k = k, .req = req, .t = t, .body = body,
                                   .deadline_ms = now + (*k->deps.cfg)->request_timeout_ms };
        if (httpd_request_watch(k->httpd, req, kvs_pending_gone, p) < 0) {
            free(p);
            return false;
        }
        *pp = p;
    }
    return now < p->deadline_ms &&
           cache_put_wait(t->cache, (unsigned)(p->deadline_ms - now) + 1, kvs_pending_ready, p, &p->wait) == 0;
}

static void kvs_acquire(struct kvs_server *k, struct evhttp_request *req, struct tenant *t)
{
    json_t *body = kvs_request_json(k, req);
    if (body)
        kvs_acquire_run(k, req, t, body, NULL);
}

/* Owns body (kept while waiting) and p (NULL: not a retry). */
static void kvs_acquire_run(struct kvs_server *k, struct evhttp_request *req, struct tenant *t, json_t *body,
                            struct kvs_pending *p)
{
    const struct kvn_config *cfg = *k->deps.cfg;
    json_t *keys, *metas, *term, *objects = NULL;
    struct kvs_group *g = NULL;
    struct kvs_lease *l = NULL;
    size_t ng = 0;
    uint64_t term_ms = cfg->kvs_default_term_ms;
    char msg[512];
    int status = 400;
    bool create;

    const char *scope = json_string_value(json_object_get(body, "scope"));
    keys = json_object_get(body, "object_keys");
    metas = json_object_get(body, "object_metas");
    term = json_object_get(body, "term");
    if (!scope || (strcmp(scope, "read") != 0 && strcmp(scope, "create") != 0)) {
        snprintf(msg, sizeof msg, "\"scope\" must be \"read\" or \"create\"");
        goto fail;
    }
    create = scope[0] == 'c';
    if (!json_is_array(keys)) {
        snprintf(msg, sizeof msg, "\"object_keys\" must be an array of strings");
        goto fail;
    }
    if (json_array_size(keys) > cfg->kvs_max_keys) {
        status = 413;
        snprintf(msg, sizeof msg, "%zu object keys in one request; [kvs_server] max_keys is %u",
                 json_array_size(keys), cfg->kvs_max_keys);
        goto fail;
    }
    if (create && (!json_is_array(metas) || json_array_size(metas) != json_array_size(keys))) {
        snprintf(msg, sizeof msg, "a create needs \"object_metas\": one {size, layout} per object key");
        goto fail;
    }
    if (term && !json_is_null(term)) {
        if (!json_is_integer(term) || json_integer_value(term) < 0 ||
            (uint64_t)json_integer_value(term) * 1000 > cfg->kvs_max_term_ms) {
            snprintf(msg, sizeof msg, "\"term\" must be an integer number of seconds from 0 to %u "
                     "([kvs_server] max_term)", cfg->kvs_max_term_ms / 1000);
            goto fail;
        }
        if (json_integer_value(term) > 0)
            term_ms = (uint64_t)json_integer_value(term) * 1000;
    }
    if ((status = kvs_group_keys(keys, create ? metas : NULL, &g, &ng, msg, sizeof msg)) != 0)
        goto fail;
    if ((status = kvs_leases_room(&k->leases, cfg, k->deps.tenants, t, k->st.leases_open, msg, sizeof msg)) != 0)
        goto fail;
    status = 500;
    snprintf(msg, sizeof msg, "out of memory");
    objects = json_array();
    l = kvs_lease_new(k, t, create ? LEASE_WRITE : LEASE_READ, term_ms);
    if (!objects || !l)
        goto fail;
    if (p)
        ;   /* counted when it arrived */
    else if (create)
        k->st.acquire_create++;
    else
        k->st.acquire_read++;
    if (!p && create)
        k->st.create_keys += json_array_size(keys);   /* once, not at each retry after a wait */
    for (size_t j = 0; j < ng; j++) {
        struct kvs_group *x = &g[j];
        struct ns_layout layout;
        uint64_t lease_id = 0;
        int rc;

        status = 400;
        if (kvs_key_layout(&x->id, cfg->kvs_tp_size, x->size, &layout, msg, sizeof msg) < 0)
            goto fail;
        if (create) {
            rc = kvs_bind_object_ns(t->cache, &layout, &x->ns, msg, sizeof msg);
            if (rc < 0) {
                status = kvs_status_of(rc);
                goto fail;
            }
            cache_unbind(t->cache, x->ns);   /* kept by its reservations and blocks, not by a client */
            /* Left out means stored to the client: keys another create
             * lease is still writing make this one wait for it to end. */
            size_t writing = cache_count_writing(t->cache, x->ns, x->keys, x->n);
            if (writing)
                snprintf(msg, sizeof msg, "%zu of the objects are being written under another create lease "
                         "(not sealed yet)", writing);
            /* v1 keys carry no check words (NULL: word 0); opaque keys' are from their hash */
            rc = writing ? CACHE_STORE_BOUND
                         : cache_put_begin(t->cache, &(struct cache_put_req){ .ns = x->ns, .owner = &l->owner,
                                           .keys = x->keys, .checks = x->checks, .n = x->n,
                                           .tier = KVNODE_TIER_HOST }, &lease_id, x->locs, msg, sizeof msg);
        } else {
            k->st.read_keys += x->n;
            size_t nsub = l->nsub;
            rc = (x->bytes = malloc(x->n * sizeof *x->bytes)) ? 0 : -KVNODE_ENOMEM;
            if (rc == 0)
                rc = kvs_read_objects(t->cache, &layout, &(struct kvs_read){ .keys = x->keys, .checks = x->checks,
                                      .n = x->n, .owner = &l->owner, .locs = x->locs, .bytes = x->bytes,
                                      .lease_ids = l->sub, .nleases = &nsub, .max_leases = KVS_MAX_NS },
                                      msg, sizeof msg);
            l->nsub = nsub;
        }
        if (rc == CACHE_STORE_BOUND) {
            /* Give back what this request holds and wait for room (or for
             * the other lease to seal or end). */
            kvs_lease_free(k, l);
            l = NULL;
            json_decref(objects);
            objects = NULL;
            kvs_groups_free(g, ng);
            g = NULL;
            if (kvs_pending_wait(k, req, t, body, &p))
                return;
            size_t used = strlen(msg);
            snprintf(msg + used, sizeof msg - used, "; waited up to [server] request_timeout (%u ms)",
                     cfg->request_timeout_ms);
            status = 503;
            goto fail;
        }
        if (rc != 0) {
            status = kvs_status_of(rc);
            goto fail;
        }
        if (lease_id)
            l->sub[l->nsub++] = lease_id;
        for (size_t i = 0; i < x->n; i++) {
            const char *key = json_string_value(json_array_get(keys, x->index[i]));
            if (!x->locs[i].present) {
                if (create)
                    k->st.create_existing++;
                continue;
            }
            if (!create)
                k->st.read_hits++;
            if (json_array_append_new(objects, kvs_object(key, x->locs[i].offset,
                                                          create ? x->ns->layout.block_bytes : x->bytes[i])) < 0) {
                status = 500;
                snprintf(msg, sizeof msg, "out of memory");
                goto fail;
            }
        }
    }
    bool granted = l->nsub != 0;
    char id[KVS_LEASE_ID_HEX + 1] = "";
    if (granted)
        kvs_lease_id_format(&l->id, id);
    else
        kvs_lease_free(k, l);   /* nothing held: "" (create: every object exists) */
    kvs_pending_end(k, p);   /* before the answer: the connection is evhttp's again */
    if (!kvs_reply(req, 200, json_pack("{s:{s:s}, s:o}", "lease", "lease_id", id, "objects", objects)) && granted)
        kvs_lease_free(k, l);   /* over the output caps: the client got an error, nothing is granted */
    kvs_groups_free(g, ng);
    json_decref(body);
    return;
fail:
    if (l)
        kvs_lease_free(k, l);
    json_decref(objects);
    if (g)
        kvs_groups_free(g, ng);
    json_decref(body);
    kvs_pending_end(k, p);
    kvs_fail(k, req, status, msg);
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
    kvs_lease_free(k, l);   /* unsealed writes are aborted, reads unpinned */
    kvs_reply(req, 204, NULL);
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
    for (k->nbuckets = 64; k->nbuckets < cfg->kvs_max_leases; k->nbuckets <<= 1)
        ;
    kvs_leases_init(&k->leases);
    k->buckets = calloc(k->nbuckets, sizeof *k->buckets);
    k->sweep_ev = event_new(deps->base, -1, EV_PERSIST, kvs_sweep_cb, k);
    if (!k->buckets || !k->sweep_ev || event_add(k->sweep_ev, &tv) < 0) {
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
        httpd_set_identify(k->httpd, kvs_identify_tcp, k);
    if (!(k->conns = kvs_http_conns_new(deps->cfg, deps->tenants))) {
        kvs_server_destroy(k);
        errmsg_set(err, errlen, "kvs front end: out of memory");
        return -1;
    }
    httpd_set_admit(k->httpd, kvs_http_admit, kvs_http_release, k->conns);
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
    httpd_destroy(k->httpd);
    kvs_http_conns_free(k->conns);   /* after httpd: its connections' tokens point here */
    if (k->sweep_ev)
        event_free(k->sweep_ev);
    while (k->head)
        kvs_lease_free(k, k->head);
    kvs_dataplane_destroy(k->dp);
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
    if (k->dp)
        kvs_dataplane_stats(k->dp, out);
}
