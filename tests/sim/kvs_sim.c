/* kvs-sim: a protocol-true simulator of rtp-llm's KVS store (docs/PROTOCOLS.md §3).
 *
 * One process, one libevent loop, all state in memory:
 *
 *   control plane (evhttp):  GET /health, POST /acquire (scope read|create),
 *                            POST /seal, POST /release, POST /discard;
 *                            GET /_sim/state, GET /_sim/objects (simulator-only, for tests).
 *   data plane (unix stream socket): 8-byte little-endian length + JSON;
 *                            register_request -> register_reply;
 *                            get_vineyard_mmap_fd_request -> reply {size, offset}
 *                            then one fd (memfd arena) by SCM_RIGHTS with a 1-byte payload.
 *
 * Semantics enforced (every violation is a 4xx with a JSON body {"error":..., "status":...}):
 *   - exact routes and methods (404 unknown route, 405 wrong method);
 *   - every required field with its type (400): object_keys a non-empty array of distinct
 *     non-empty strings, term a number > 0 (seconds, clamped to --max-lease-s), request_id a
 *     string or non-negative integer, create: object_metas (one per key, size an integer > 0,
 *     layout "rtp_llm_group_block_v1") and ignore_existing (bool); read: best_effort (bool),
 *     peer (string), wait_timeout (number >= 0);
 *   - create allocates arena space for keys that do not exist; existing objects are
 *     omitted from the reply (never null: rtp-llm's client fails a store on a null entry),
 *     with ignore_existing=false any existing key -> 409; when nothing is new the lease_id
 *     is "" and objects is empty;
 *     created objects are invisible to reads until sealed;
 *   - seal: only an unsealed create lease, by the request_id that acquired it
 *     (403 otherwise; 409 for a read lease or an already sealed lease);
 *   - release: any lease (an unsealed create lease is discarded); discard: an unsealed
 *     create lease only (409 otherwise); unknown or expired lease -> 404;
 *   - reads are best effort (missing -> null; best_effort=false with a miss -> 404) and pin
 *     what they return until release or term expiry; pinned objects are never evicted;
 *   - a full arena evicts least recently used unpinned sealed objects, else 507;
 *   - a timer expires leases past their term (unsealed creates are freed, reads unpinned);
 *   - objects in replies come in reverse request order (clients must match by key) unless
 *     --in-order;
 *   - GET /_sim/state counts the control calls by route: acquire_create_calls,
 *     acquire_read_calls, seal_calls, release_calls, discard_calls (tests count round trips);
 *   - GET /_sim/objects lists every object, least recently used first:
 *     {"objects": [{"key", "sealed", "size", "pins"}]} (tests see which keys a client made).
 *
 * Usage: kvs-sim --socket PATH [--http 127.0.0.1:0] [--arena-bytes N] [--fail-health]
 *                [--delay-ms N [--delay-only ROUTE]] [--garbage] [--max-lease-s S]
 *                [--in-order] [--lax-seal]
 * --delay-ms holds every control call that long before handling it; with
 * --delay-only only calls to ROUTE (e.g. /acquire) are held.
 * Prints "http=HOST:PORT" and "socket=PATH" on stdout once both listeners are bound.
 * SIGTERM/SIGINT: clean exit 0. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <jansson.h>

#define SIM_MAX_FRAME     (16u << 20)   /* data-plane frame cap */
#define SIM_MAX_BODY      (4u << 20)    /* control-plane request body cap */
#define SIM_ALIGN         64u
#define SIM_HASH_BUCKETS  4096u
#define SIM_LAYOUT        "rtp_llm_group_block_v1"
#define SIM_TICK_MS       20

/* ------------------------------------------------------------------------- */
/* state */

struct lease;

struct obj {
    char         *key;
    uint64_t      off, size, id;
    bool          sealed;
    unsigned      pins;          /* read leases holding it */
    struct lease *owner;         /* create lease while unsealed */
    struct obj   *hnext;         /* hash chain */
    struct obj   *prev, *next;   /* LRU list, least recent first */
};

struct lease {
    char          id[40];
    bool          create, sealed;
    char         *request_id;
    uint64_t      expires_ms;
    struct obj  **objs;          /* create: its unsealed objects; read: pinned objects */
    size_t        n;
    struct lease *prev, *next;
};

struct ext { uint64_t off, len; struct ext *next; };

struct pending {                 /* a control call waiting out --delay-ms */
    struct evhttp_request *req;
    struct event          *ev;
    struct pending        *prev, *next;
};

struct dconn {                   /* data-plane connection */
    int            fd;
    struct event  *rev, *wev;
    struct evbuffer *in, *out;
    long long      fd_after;     /* bytes of `out` before the arena fd goes out; -1 none */
    bool           registered;
    struct dconn  *prev, *next;
};

static struct {
    /* options */
    const char *sock_path;
    char        http_host[64];
    unsigned    http_port;
    uint64_t    arena_bytes;
    bool        fail_health, garbage, in_order, lax_seal;
    unsigned    delay_ms;
    const char *delay_only;      /* NULL: every route is delayed */
    double      max_lease_s;
    /* runtime */
    struct event_base     *base;
    struct evhttp         *http;
    struct evconnlistener *dlistener;
    struct event          *sigterm, *sigint, *tick;
    int                    memfd;
    struct obj            *buckets[SIM_HASH_BUCKETS];
    struct obj            *lru_head, *lru_tail;
    struct lease          *leases;
    struct ext            *free_list;
    struct pending        *pending;
    struct dconn          *dconns;
    uint64_t               next_obj_id, next_lease, used_bytes;
    size_t                 n_objs, n_leases;
    /* control calls handled, by route (acquire by scope), whatever their outcome */
    uint64_t               calls_create, calls_read, calls_seal, calls_release, calls_discard;
} S;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "kvs-sim: out of memory\n");
        abort();
    }
    return p;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xcalloc(1, n);
    memcpy(p, s, n);
    return p;
}

/* ------------------------------------------------------------------------- */
/* arena allocator: sorted free list, first fit, coalescing */

static void ext_free(uint64_t off, uint64_t len)
{
    struct ext **pp = &S.free_list, *prev = NULL;
    while (*pp && (*pp)->off < off) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    struct ext *nx = *pp;
    if (prev && prev->off + prev->len == off) {
        prev->len += len;
        if (nx && prev->off + prev->len == nx->off) {
            prev->len += nx->len;
            prev->next = nx->next;
            free(nx);
        }
        return;
    }
    if (nx && off + len == nx->off) {
        nx->off = off;
        nx->len += len;
        return;
    }
    struct ext *e = xcalloc(1, sizeof *e);
    e->off = off;
    e->len = len;
    e->next = nx;
    *pp = e;
}

static bool ext_alloc(uint64_t len, uint64_t *off)
{
    for (struct ext **pp = &S.free_list; *pp; pp = &(*pp)->next) {
        struct ext *e = *pp;
        if (e->len < len)
            continue;
        *off = e->off;
        e->off += len;
        e->len -= len;
        if (e->len == 0) {
            *pp = e->next;
            free(e);
        }
        return true;
    }
    return false;
}

static uint64_t aligned(uint64_t n) { return (n + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN; }

/* ------------------------------------------------------------------------- */
/* objects */

static unsigned key_hash(const char *k)
{
    uint64_t h = 1469598103934665603ull;
    for (; *k; k++)
        h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return (unsigned)(h % SIM_HASH_BUCKETS);
}

static struct obj *obj_find(const char *key)
{
    for (struct obj *o = S.buckets[key_hash(key)]; o; o = o->hnext)
        if (strcmp(o->key, key) == 0)
            return o;
    return NULL;
}

static void lru_unlink(struct obj *o)
{
    if (o->prev) o->prev->next = o->next; else S.lru_head = o->next;
    if (o->next) o->next->prev = o->prev; else S.lru_tail = o->prev;
    o->prev = o->next = NULL;
}

static void lru_append(struct obj *o)
{
    o->prev = S.lru_tail;
    o->next = NULL;
    if (S.lru_tail) S.lru_tail->next = o; else S.lru_head = o;
    S.lru_tail = o;
}

static void obj_destroy(struct obj *o)
{
    struct obj **pp = &S.buckets[key_hash(o->key)];
    while (*pp != o)
        pp = &(*pp)->hnext;
    *pp = o->hnext;
    lru_unlink(o);
    ext_free(o->off, aligned(o->size));
    S.used_bytes -= aligned(o->size);
    S.n_objs--;
    free(o->key);
    free(o);
}

/* Allocate arena space, evicting least recently used unpinned sealed objects. */
static bool arena_alloc(uint64_t size, uint64_t *off)
{
    uint64_t len = aligned(size);
    if (len > S.arena_bytes)
        return false;
    for (;;) {
        if (ext_alloc(len, off)) {
            S.used_bytes += len;
            return true;
        }
        struct obj *victim = S.lru_head;
        while (victim && (!victim->sealed || victim->pins))
            victim = victim->next;
        if (!victim)
            return false;
        obj_destroy(victim);
    }
}

static struct obj *obj_create(const char *key, uint64_t size, uint64_t off, struct lease *owner)
{
    struct obj *o = xcalloc(1, sizeof *o);
    o->key = xstrdup(key);
    o->size = size;
    o->off = off;
    o->id = ++S.next_obj_id;
    o->owner = owner;
    unsigned h = key_hash(key);
    o->hnext = S.buckets[h];
    S.buckets[h] = o;
    lru_append(o);
    S.n_objs++;
    return o;
}

/* ------------------------------------------------------------------------- */
/* leases */

static struct lease *lease_new(bool create, const char *request_id, double term_s)
{
    struct lease *l = xcalloc(1, sizeof *l);
    snprintf(l->id, sizeof l->id, "sim-%s-%" PRIu64, create ? "c" : "r", ++S.next_lease);
    l->create = create;
    l->request_id = xstrdup(request_id);
    if (S.max_lease_s > 0 && term_s > S.max_lease_s)
        term_s = S.max_lease_s;
    double ms = term_s * 1000.0;
    l->expires_ms = now_ms() + (ms > 1e12 ? (uint64_t)1e12 : (uint64_t)ms);
    l->next = S.leases;
    if (S.leases) S.leases->prev = l;
    S.leases = l;
    S.n_leases++;
    return l;
}

static struct lease *lease_find(const char *id)
{
    for (struct lease *l = S.leases; l; l = l->next)
        if (strcmp(l->id, id) == 0)
            return l;
    return NULL;
}

/* End a lease: unsealed created objects are freed, read pins dropped. */
static void lease_end(struct lease *l)
{
    for (size_t i = 0; i < l->n; i++) {
        struct obj *o = l->objs[i];
        if (l->create) {
            if (!o->sealed && o->owner == l)
                obj_destroy(o);
        } else if (o->pins) {
            o->pins--;
        }
    }
    if (l->prev) l->prev->next = l->next; else S.leases = l->next;
    if (l->next) l->next->prev = l->prev;
    S.n_leases--;
    free(l->objs);
    free(l->request_id);
    free(l);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what; (void)arg;
    uint64_t t = now_ms();
    struct lease *l = S.leases;
    while (l) {
        struct lease *nx = l->next;
        if (t >= l->expires_ms)
            lease_end(l);
        l = nx;
    }
}

/* ------------------------------------------------------------------------- */
/* control plane */

static void reply_json(struct evhttp_request *req, int status, json_t *doc)
{
    struct evbuffer *b = evbuffer_new();
    if (S.garbage) {
        evbuffer_add_printf(b, "{\"lease\": <<garbage %d", status);
    } else if (doc) {
        char *s = json_dumps(doc, JSON_COMPACT);
        if (s) {
            evbuffer_add(b, s, strlen(s));
            free(s);
        }
    }
    if (doc || S.garbage)
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                          "application/json");
    evhttp_send_reply(req, status, NULL, b);
    evbuffer_free(b);
    json_decref(doc);
}

static void reply_error(struct evhttp_request *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reply_error(struct evhttp_request *req, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply_json(req, status, json_pack("{s:s, s:i}", "error", msg, "status", status));
}

static void reply_empty(struct evhttp_request *req, int status)
{
    evhttp_send_reply(req, status, NULL, NULL);
}

/* Parse the request body as a JSON object; replies 400 and returns NULL on failure. */
static json_t *body_object(struct evhttp_request *req)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    const char *p = n ? (const char *)evbuffer_pullup(in, (ev_ssize_t)n) : "";
    json_error_t err;
    json_t *doc = json_loadb(p, n, JSON_REJECT_DUPLICATES, &err);
    if (!doc) {
        reply_error(req, 400, "malformed JSON: %s", err.text);
        return NULL;
    }
    if (!json_is_object(doc)) {
        json_decref(doc);
        reply_error(req, 400, "body must be a JSON object");
        return NULL;
    }
    return doc;
}

/* request_id: a string or a non-negative integer, canonicalised to a string. */
static bool get_request_id(json_t *doc, char *buf, size_t cap)
{
    json_t *v = json_object_get(doc, "request_id");
    if (json_is_string(v)) {
        snprintf(buf, cap, "%s", json_string_value(v));
        return true;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return true;
    }
    return false;
}

static json_t *obj_json(const struct obj *o)
{
    return json_pack("{s:s, s:[{s:s, s:{s:I, s:I, s:I}}], s:{s:I}}",
                     "key", o->key,
                     "blobs", "type", "vineyard", "handle",
                     "data_offset", (json_int_t)o->off,
                     "data_size", (json_int_t)o->size,
                     "object_id", (json_int_t)o->id,
                     "meta", "size", (json_int_t)o->size);
}

/* omit_absent: a create reply, which leaves out what it did not create. */
static void reply_acquire(struct evhttp_request *req, const char *lease_id, json_t **items,
                          size_t n, bool omit_absent)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        size_t j = S.in_order ? i : n - 1 - i;
        if (items[j] || !omit_absent)
            json_array_append_new(arr, items[j] ? items[j] : json_null());
    }
    reply_json(req, 200, json_pack("{s:{s:s}, s:o}", "lease", "lease_id", lease_id,
                                   "objects", arr));
}

static void do_acquire(struct evhttp_request *req)
{
    json_t *doc = body_object(req);
    if (!doc)
        return;
    json_t *scope = json_object_get(doc, "scope");
    json_t *keys = json_object_get(doc, "object_keys");
    json_t *term = json_object_get(doc, "term");
    char rid[256];
    bool create;
    json_t **items = NULL;
    size_t n = 0;

    if (!json_is_string(scope)) {
        reply_error(req, 400, "scope: required string");
        goto out;
    }
    if (strcmp(json_string_value(scope), "create") == 0) {
        create = true;
        S.calls_create++;
    } else if (strcmp(json_string_value(scope), "read") == 0) {
        create = false;
        S.calls_read++;
    } else {
        reply_error(req, 400, "scope: must be \"read\" or \"create\"");
        goto out;
    }
    if (!json_is_array(keys) || json_array_size(keys) == 0) {
        reply_error(req, 400, "object_keys: required non-empty array of strings");
        goto out;
    }
    n = json_array_size(keys);
    for (size_t i = 0; i < n; i++) {
        json_t *k = json_array_get(keys, i);
        if (!json_is_string(k) || json_string_length(k) == 0 ||
            strlen(json_string_value(k)) != json_string_length(k)) {
            reply_error(req, 400, "object_keys[%zu]: must be a non-empty string", i);
            goto out;
        }
        for (size_t j = 0; j < i; j++)
            if (json_equal(k, json_array_get(keys, j))) {
                reply_error(req, 400, "object_keys[%zu]: duplicate key", i);
                goto out;
            }
    }
    if (!json_is_number(term) || !(json_number_value(term) > 0) ||
        !isfinite(json_number_value(term))) {
        reply_error(req, 400, "term: required number > 0");
        goto out;
    }
    if (!get_request_id(doc, rid, sizeof rid)) {
        reply_error(req, 400, "request_id: required string or non-negative integer");
        goto out;
    }
    items = xcalloc(n, sizeof *items);

    if (create) {
        json_t *metas = json_object_get(doc, "object_metas");
        json_t *ign = json_object_get(doc, "ignore_existing");
        if (!json_is_array(metas) || json_array_size(metas) != n) {
            reply_error(req, 400, "object_metas: required array with one entry per key");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *m = json_array_get(metas, i);
            json_t *sz = json_object_get(m, "size");
            json_t *lay = json_object_get(m, "layout");
            if (!json_is_object(m) || !json_is_integer(sz) || json_integer_value(sz) <= 0) {
                reply_error(req, 400, "object_metas[%zu].size: required integer > 0", i);
                goto out;
            }
            if (!json_is_string(lay) || strcmp(json_string_value(lay), SIM_LAYOUT) != 0) {
                reply_error(req, 400, "object_metas[%zu].layout: must be \"%s\"", i, SIM_LAYOUT);
                goto out;
            }
        }
        if (!json_is_boolean(ign)) {
            reply_error(req, 400, "ignore_existing: required boolean");
            goto out;
        }
        size_t fresh = 0;
        for (size_t i = 0; i < n; i++)
            if (!obj_find(json_string_value(json_array_get(keys, i))))
                fresh++;
        if (fresh < n && !json_is_true(ign)) {
            reply_error(req, 409, "%zu of %zu objects already exist", n - fresh, n);
            goto out;
        }
        if (fresh == 0) {
            reply_acquire(req, "", items, n, true);
            goto out;
        }
        struct lease *l = lease_new(true, rid, json_number_value(term));
        l->objs = xcalloc(fresh, sizeof *l->objs);
        for (size_t i = 0; i < n; i++) {
            const char *k = json_string_value(json_array_get(keys, i));
            if (obj_find(k))
                continue;
            uint64_t size = (uint64_t)json_integer_value(
                json_object_get(json_array_get(metas, i), "size"));
            uint64_t off;
            if (!arena_alloc(size, &off)) {
                lease_end(l);   /* frees what this call allocated */
                for (size_t j = 0; j < n; j++)
                    json_decref(items[j]);
                reply_error(req, 507, "arena full: cannot place %" PRIu64 " bytes for %s",
                            size, k);
                goto out;
            }
            struct obj *o = obj_create(k, size, off, l);
            l->objs[l->n++] = o;
            items[i] = obj_json(o);
        }
        reply_acquire(req, l->id, items, n, true);
    } else {
        json_t *be = json_object_get(doc, "best_effort");
        json_t *peer = json_object_get(doc, "peer");
        json_t *wt = json_object_get(doc, "wait_timeout");
        if (!json_is_boolean(be)) {
            reply_error(req, 400, "best_effort: required boolean");
            goto out;
        }
        if (!json_is_string(peer)) {
            reply_error(req, 400, "peer: required string");
            goto out;
        }
        if (!json_is_number(wt) || json_number_value(wt) < 0) {
            reply_error(req, 400, "wait_timeout: required number >= 0");
            goto out;
        }
        size_t found = 0;
        for (size_t i = 0; i < n; i++) {
            struct obj *o = obj_find(json_string_value(json_array_get(keys, i)));
            if (o && o->sealed)
                found++;
        }
        if (found < n && !json_is_true(be)) {
            reply_error(req, 404, "%zu of %zu objects not found", n - found, n);
            goto out;
        }
        struct lease *l = lease_new(false, rid, json_number_value(term));
        l->objs = xcalloc(found, sizeof *l->objs);
        for (size_t i = 0; i < n; i++) {
            struct obj *o = obj_find(json_string_value(json_array_get(keys, i)));
            if (!o || !o->sealed)
                continue;
            o->pins++;
            lru_unlink(o);
            lru_append(o);
            l->objs[l->n++] = o;
            items[i] = obj_json(o);
        }
        reply_acquire(req, l->id, items, n, false);
    }
out:
    free(items);
    json_decref(doc);
}

/* Common part of seal/release/discard: the lease named by a valid lease_id, or NULL
 * after replying. */
static struct lease *lease_arg(struct evhttp_request *req, json_t *doc)
{
    json_t *id = json_object_get(doc, "lease_id");
    if (!json_is_string(id) || json_string_length(id) == 0) {
        reply_error(req, 400, "lease_id: required non-empty string");
        return NULL;
    }
    struct lease *l = lease_find(json_string_value(id));
    if (!l || now_ms() >= l->expires_ms) {
        if (l)
            lease_end(l);
        reply_error(req, 404, "unknown or expired lease %s", json_string_value(id));
        return NULL;
    }
    return l;
}

static void do_seal(struct evhttp_request *req)
{
    S.calls_seal++;
    json_t *doc = body_object(req);
    if (!doc)
        return;
    char rid[256];
    if (!json_is_string(json_object_get(doc, "lease_id")) ||
        json_string_length(json_object_get(doc, "lease_id")) == 0) {
        reply_error(req, 400, "lease_id: required non-empty string");
    } else if (!get_request_id(doc, rid, sizeof rid)) {
        reply_error(req, 400, "request_id: required string or non-negative integer");
    } else {
        struct lease *l = lease_arg(req, doc);
        if (!l) {
            /* replied */
        } else if (!l->create) {
            reply_error(req, 409, "lease %s is a read lease", l->id);
        } else if (l->sealed) {
            reply_error(req, 409, "lease %s is already sealed", l->id);
        } else if (!S.lax_seal && strcmp(rid, l->request_id) != 0) {
            reply_error(req, 403, "lease %s belongs to request %s, not %s", l->id,
                        l->request_id, rid);
        } else {
            for (size_t i = 0; i < l->n; i++) {
                l->objs[i]->sealed = true;
                l->objs[i]->owner = NULL;
            }
            /* sealed objects belong to the store now: the lease no longer tracks them */
            free(l->objs);
            l->objs = NULL;
            l->n = 0;
            l->sealed = true;
            reply_empty(req, 204);
        }
    }
    json_decref(doc);
}

static void do_release(struct evhttp_request *req)
{
    S.calls_release++;
    json_t *doc = body_object(req);
    if (!doc)
        return;
    struct lease *l = lease_arg(req, doc);
    if (l) {
        lease_end(l);
        reply_empty(req, 204);
    }
    json_decref(doc);
}

static void do_discard(struct evhttp_request *req)
{
    S.calls_discard++;
    json_t *doc = body_object(req);
    if (!doc)
        return;
    struct lease *l = lease_arg(req, doc);
    if (!l) {
        /* replied */
    } else if (!l->create) {
        reply_error(req, 409, "lease %s is a read lease: release it", l->id);
    } else if (l->sealed) {
        reply_error(req, 409, "lease %s is sealed: nothing to discard", l->id);
    } else {
        lease_end(l);
        reply_empty(req, 204);
    }
    json_decref(doc);
}

static void do_state(struct evhttp_request *req)
{
    size_t sealed = 0, pinned = 0;
    for (struct obj *o = S.lru_head; o; o = o->next) {
        sealed += o->sealed;
        pinned += o->pins > 0;
    }
    reply_json(req, 200, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                                   "leases", (json_int_t)S.n_leases,
                                   "objects", (json_int_t)S.n_objs,
                                   "sealed", (json_int_t)sealed,
                                   "pinned", (json_int_t)pinned,
                                   "used_bytes", (json_int_t)S.used_bytes,
                                   "arena_bytes", (json_int_t)S.arena_bytes,
                                   "acquire_create_calls", (json_int_t)S.calls_create,
                                   "acquire_read_calls", (json_int_t)S.calls_read,
                                   "seal_calls", (json_int_t)S.calls_seal,
                                   "release_calls", (json_int_t)S.calls_release,
                                   "discard_calls", (json_int_t)S.calls_discard));
}

static void do_objects(struct evhttp_request *req)
{
    json_t *arr = json_array();
    for (struct obj *o = S.lru_head; o; o = o->next)
        json_array_append_new(arr, json_pack("{s:s, s:b, s:I, s:I}", "key", o->key, "sealed", o->sealed,
                                             "size", (json_int_t)o->size, "pins", (json_int_t)o->pins));
    reply_json(req, 200, json_pack("{s:o}", "objects", arr));
}

static const struct route {
    const char *path;
    enum evhttp_cmd_type method;
    void (*fn)(struct evhttp_request *);
} ROUTES[] = {
    { "/acquire",    EVHTTP_REQ_POST, do_acquire },
    { "/seal",       EVHTTP_REQ_POST, do_seal },
    { "/release",    EVHTTP_REQ_POST, do_release },
    { "/discard",    EVHTTP_REQ_POST, do_discard },
    { "/_sim/state", EVHTTP_REQ_GET,  do_state },
    { "/_sim/objects", EVHTTP_REQ_GET, do_objects },
};

static void handle(struct evhttp_request *req)
{
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    if (!path)
        path = "";
    if (strcmp(path, "/health") == 0) {
        if (m != EVHTTP_REQ_GET) {
            evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET");
            reply_error(req, 405, "method not allowed on %s", path);
        } else if (S.fail_health) {
            reply_error(req, 503, "unhealthy (--fail-health)");
        } else {
            reply_json(req, 200, json_pack("{s:s}", "status", "ok"));
        }
        return;
    }
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++) {
        if (strcmp(path, ROUTES[i].path) != 0)
            continue;
        if (m != ROUTES[i].method) {
            evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
                              ROUTES[i].method == EVHTTP_REQ_GET ? "GET" : "POST");
            reply_error(req, 405, "method not allowed on %s", path);
            return;
        }
        ROUTES[i].fn(req);
        return;
    }
    reply_error(req, 404, "no such route %s", path);
}

static void pending_unlink(struct pending *p)
{
    if (p->prev) p->prev->next = p->next; else S.pending = p->next;
    if (p->next) p->next->prev = p->prev;
    event_free(p->ev);
    free(p);
}

static void delayed_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    struct pending *p = arg;
    struct evhttp_request *req = p->req;
    pending_unlink(p);
    handle(req);
}

static void http_cb(struct evhttp_request *req, void *arg)
{
    (void)arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (S.delay_ms == 0 || (S.delay_only && (!path || strcmp(path, S.delay_only) != 0))) {
        handle(req);
        return;
    }
    struct pending *p = xcalloc(1, sizeof *p);
    p->req = req;
    p->ev = evtimer_new(S.base, delayed_cb, p);
    struct timeval tv = { .tv_sec = S.delay_ms / 1000, .tv_usec = (S.delay_ms % 1000) * 1000 };
    p->next = S.pending;
    if (S.pending) S.pending->prev = p;
    S.pending = p;
    evtimer_add(p->ev, &tv);
}

/* ------------------------------------------------------------------------- */
/* data plane */

static void dconn_close(struct dconn *c)
{
    if (c->prev) c->prev->next = c->next; else S.dconns = c->next;
    if (c->next) c->next->prev = c->prev;
    event_free(c->rev);
    event_free(c->wev);
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    close(c->fd);
    free(c);
}

static void dconn_send_json(struct dconn *c, json_t *doc)
{
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (!s)
        return;
    uint64_t len = strlen(s);
    unsigned char hdr[8];
    for (int i = 0; i < 8; i++)
        hdr[i] = (unsigned char)(len >> (8 * i));
    evbuffer_add(c->out, hdr, sizeof hdr);
    evbuffer_add(c->out, s, len);
    free(s);
}

static void dconn_error(struct dconn *c, const char *msg)
{
    dconn_send_json(c, json_pack("{s:s, s:i, s:s}", "type", "error_reply", "code", 1,
                                 "message", msg));
}

static int send_arena_fd(int sock)
{
    char byte = 0;
    struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                          .msg_control = u.buf, .msg_controllen = sizeof u.buf };
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &S.memfd, sizeof(int));
    ssize_t n;
    do {
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n == 1 ? 0 : (errno == EAGAIN || errno == EWOULDBLOCK) ? 1 : -1;
}

/* Write what is queued; the fd goes out right after the reply that announces it.
 * Returns -1 when the connection was closed. */
static int dconn_flush(struct dconn *c)
{
    for (;;) {
        if (c->fd_after == 0) {
            int r = send_arena_fd(c->fd);
            if (r < 0) {
                dconn_close(c);
                return -1;
            }
            if (r > 0)
                break;
            c->fd_after = -1;
            continue;
        }
        size_t len = evbuffer_get_length(c->out);
        if (len == 0)
            break;
        size_t lim = c->fd_after > 0 && (size_t)c->fd_after < len ? (size_t)c->fd_after : len;
        int w = evbuffer_write_atmost(c->out, c->fd, (ev_ssize_t)lim);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        if (w <= 0) {
            dconn_close(c);
            return -1;
        }
        if (c->fd_after > 0)
            c->fd_after -= w;
    }
    if (evbuffer_get_length(c->out) || c->fd_after == 0)
        event_add(c->wev, NULL);
    else
        event_del(c->wev);
    return 0;
}

static void dconn_message(struct dconn *c, const char *p, size_t n)
{
    json_error_t err;
    json_t *doc = json_loadb(p, n, 0, &err);
    json_t *type = json_object_get(doc, "type");
    if (!json_is_object(doc) || !json_is_string(type)) {
        dconn_error(c, "message must be a JSON object with a string \"type\"");
    } else if (strcmp(json_string_value(type), "register_request") == 0) {
        c->registered = true;
        dconn_send_json(c, json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:b}",
                                     "type", "register_reply", "version", "0.0.0",
                                     "ipc_socket", S.sock_path, "rpc_endpoint", "",
                                     "instance_id", 0, "session_id", 0, "store_match", 1));
    } else if (strcmp(json_string_value(type), "get_vineyard_mmap_fd_request") == 0) {
        if (!c->registered) {
            dconn_error(c, "get_vineyard_mmap_fd_request before register_request");
        } else if (c->fd_after >= 0) {
            dconn_error(c, "an fd is still being sent");
        } else {
            dconn_send_json(c, json_pack("{s:s, s:I, s:I}", "type",
                                         "get_vineyard_mmap_fd_reply",
                                         "size", (json_int_t)S.arena_bytes, "offset", 0));
            c->fd_after = (long long)evbuffer_get_length(c->out);
        }
    } else {
        char msg[160];
        snprintf(msg, sizeof msg, "unknown message type \"%.100s\"", json_string_value(type));
        dconn_error(c, msg);
    }
    json_decref(doc);
}

static void dconn_read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    struct dconn *c = arg;
    int n = evbuffer_read(c->in, c->fd, 65536);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        dconn_close(c);   /* peer gone (possibly mid-handshake or mid-frame) */
        return;
    }
    for (;;) {
        unsigned char hdr[8];
        if (evbuffer_copyout(c->in, hdr, 8) != 8)
            break;
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--)
            len = (len << 8) | hdr[i];
        if (len > SIM_MAX_FRAME) {
            fprintf(stderr, "kvs-sim: data-plane frame of %" PRIu64 " bytes refused\n", len);
            dconn_close(c);
            return;
        }
        if (evbuffer_get_length(c->in) < 8 + len)
            break;
        evbuffer_drain(c->in, 8);
        const char *p = len ? (const char *)evbuffer_pullup(c->in, (ev_ssize_t)len) : "";
        dconn_message(c, p, len);
        evbuffer_drain(c->in, len);
        /* send each reply (and its fd) before the next request is looked at */
        if (dconn_flush(c) < 0)
            return;
        if (evbuffer_get_length(c->out) > SIM_MAX_FRAME) {
            fprintf(stderr, "kvs-sim: data-plane client does not read its replies\n");
            dconn_close(c);
            return;
        }
    }
}

static void dconn_write_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    dconn_flush(arg);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int len, void *arg)
{
    (void)l; (void)sa; (void)len; (void)arg;
    struct dconn *c = xcalloc(1, sizeof *c);
    c->fd = fd;
    c->fd_after = -1;
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    c->rev = event_new(S.base, fd, EV_READ | EV_PERSIST, dconn_read_cb, c);
    c->wev = event_new(S.base, fd, EV_WRITE | EV_PERSIST, dconn_write_cb, c);
    c->next = S.dconns;
    if (S.dconns) S.dconns->prev = c;
    S.dconns = c;
    event_add(c->rev, NULL);
}

/* ------------------------------------------------------------------------- */
/* main */

static void stop_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)sig; (void)what; (void)arg;
    event_base_loopexit(S.base, NULL);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: kvs-sim --socket PATH [--http HOST:PORT] [--arena-bytes N]\n"
            "               [--fail-health] [--delay-ms N [--delay-only ROUTE]] [--garbage]\n"
            "               [--max-lease-s S] [--in-order] [--lax-seal]\n");
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv)
{
    static const struct option opts[] = {
        { "http",        required_argument, NULL, 'h' },
        { "socket",      required_argument, NULL, 's' },
        { "arena-bytes", required_argument, NULL, 'a' },
        { "fail-health", no_argument,       NULL, 'f' },
        { "delay-ms",    required_argument, NULL, 'd' },
        { "delay-only",  required_argument, NULL, 'D' },
        { "garbage",     no_argument,       NULL, 'g' },
        { "max-lease-s", required_argument, NULL, 'm' },
        { "in-order",    no_argument,       NULL, 'o' },
        { "lax-seal",    no_argument,       NULL, 'l' },
        { NULL, 0, NULL, 0 },
    };
    const char *http = "127.0.0.1:0";
    uint64_t v;
    int ch;
    S.arena_bytes = 64u << 20;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'h': http = optarg; break;
        case 's': S.sock_path = optarg; break;
        case 'a':
            if (!parse_u64(optarg, &S.arena_bytes) || S.arena_bytes == 0 ||
                S.arena_bytes > ((uint64_t)1 << 40)) {
                fprintf(stderr, "kvs-sim: bad --arena-bytes %s\n", optarg);
                return -1;
            }
            break;
        case 'f': S.fail_health = true; break;
        case 'd':
            if (!parse_u64(optarg, &v) || v > 600000) {
                fprintf(stderr, "kvs-sim: bad --delay-ms %s\n", optarg);
                return -1;
            }
            S.delay_ms = (unsigned)v;
            break;
        case 'D': S.delay_only = optarg; break;
        case 'g': S.garbage = true; break;
        case 'm': {
            char *end;
            S.max_lease_s = strtod(optarg, &end);
            if (*end || !(S.max_lease_s > 0)) {
                fprintf(stderr, "kvs-sim: bad --max-lease-s %s\n", optarg);
                return -1;
            }
            break;
        }
        case 'o': S.in_order = true; break;
        case 'l': S.lax_seal = true; break;
        default: usage(); return -1;
        }
    }
    if (optind != argc || !S.sock_path || !*S.sock_path) {
        usage();
        return -1;
    }
    const char *colon = strrchr(http, ':');
    if (!colon || colon == http || (size_t)(colon - http) >= sizeof S.http_host ||
        !parse_u64(colon + 1, &v) || v > 65535) {
        fprintf(stderr, "kvs-sim: bad --http %s (want HOST:PORT)\n", http);
        return -1;
    }
    memcpy(S.http_host, http, (size_t)(colon - http));
    S.http_port = (unsigned)v;
    return 0;
}

static int setup(void)
{
    S.memfd = memfd_create("kvs-sim-arena", MFD_CLOEXEC);
    if (S.memfd < 0 || ftruncate(S.memfd, (off_t)S.arena_bytes) != 0) {
        fprintf(stderr, "kvs-sim: arena of %" PRIu64 " bytes: %s\n", S.arena_bytes,
                strerror(errno));
        return -1;
    }
    ext_free(0, S.arena_bytes / SIM_ALIGN * SIM_ALIGN);

    S.base = event_base_new();
    S.http = S.base ? evhttp_new(S.base) : NULL;
    if (!S.http)
        return -1;
    evhttp_set_max_body_size(S.http, SIM_MAX_BODY);
    evhttp_set_allowed_methods(S.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                               EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD | EVHTTP_REQ_PATCH |
                               EVHTTP_REQ_OPTIONS);
    evhttp_set_gencb(S.http, http_cb, NULL);
    struct evhttp_bound_socket *bs =
        evhttp_bind_socket_with_handle(S.http, S.http_host, (ev_uint16_t)S.http_port);
    if (!bs) {
        fprintf(stderr, "kvs-sim: cannot bind http %s:%u\n", S.http_host, S.http_port);
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) != 0)
        return -1;
    unsigned port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);

    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    if (strlen(S.sock_path) >= sizeof sun.sun_path) {
        fprintf(stderr, "kvs-sim: socket path too long: %s\n", S.sock_path);
        return -1;
    }
    strcpy(sun.sun_path, S.sock_path);
    unlink(S.sock_path);
    S.dlistener = evconnlistener_new_bind(S.base, accept_cb, NULL,
                                          LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 64,
                                          (struct sockaddr *)&sun, (int)sizeof sun);
    if (!S.dlistener) {
        fprintf(stderr, "kvs-sim: cannot listen on %s: %s\n", S.sock_path, strerror(errno));
        return -1;
    }

    S.sigterm = evsignal_new(S.base, SIGTERM, stop_cb, NULL);
    S.sigint = evsignal_new(S.base, SIGINT, stop_cb, NULL);
    S.tick = event_new(S.base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = { .tv_sec = 0, .tv_usec = SIM_TICK_MS * 1000 };
    if (!S.sigterm || !S.sigint || !S.tick || evsignal_add(S.sigterm, NULL) ||
        evsignal_add(S.sigint, NULL) || event_add(S.tick, &tv))
        return -1;

    printf("http=%s:%u\nsocket=%s\n", S.http_host, port, S.sock_path);
    fflush(stdout);
    return 0;
}

static void teardown(void)
{
    while (S.pending) {
        struct evhttp_request *req = S.pending->req;
        pending_unlink(S.pending);
        evhttp_send_error(req, 503, "shutting down");
    }
    while (S.dconns)
        dconn_close(S.dconns);
    while (S.leases)
        lease_end(S.leases);
    while (S.lru_head)
        obj_destroy(S.lru_head);
    while (S.free_list) {
        struct ext *e = S.free_list;
        S.free_list = e->next;
        free(e);
    }
    if (S.dlistener) {
        evconnlistener_free(S.dlistener);
        unlink(S.sock_path);
    }
    if (S.http)
        evhttp_free(S.http);
    if (S.tick) event_free(S.tick);
    if (S.sigterm) event_free(S.sigterm);
    if (S.sigint) event_free(S.sigint);
    if (S.base)
        event_base_free(S.base);
    if (S.memfd >= 0)
        close(S.memfd);
    libevent_global_shutdown();
}

int main(int argc, char **argv)
{
    S.memfd = -1;
    signal(SIGPIPE, SIG_IGN);
    if (parse_args(argc, argv) != 0)
        return 2;
    int rc = 1;
    if (setup() == 0 && event_base_dispatch(S.base) == 0)
        rc = 0;
    teardown();
    return rc;
}
