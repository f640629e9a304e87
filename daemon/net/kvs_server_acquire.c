/* kvs_server_acquire: POST /acquire of the KVS front end (issue 30). Owns a
 * request in progress (struct kvs_job): its parsed body (kvs_acquire_wire.h),
 * the HTTP lease being filled and the reply being written.
 *
 * A body over KVS_PARSE_INLINE is parsed on the front end's parse thread
 * (its bytes moved out of the request, not copied; a workq of one thread),
 * so a 16 MiB body does not hold the loop. A request is then handled
 * KVS_SLICE_KEYS keys per loop turn: a small one is answered in the turn it
 * arrived in; a large one yields between slices (a zero timer, so the loop
 * polls its sockets between two slices), and another client's request
 * waits for one slice at most. A slice that took over 2 ms halves the
 * next (down to KVS_SLICE_KEYS_MIN), one under 0.5 ms doubles it. Replies are as
 * kvs_server.c says: objects a create finds sealed are left out; keys
 * another create lease is still writing, or no room (the store slower than
 * the engines, the host tier still being reserved), make the create give
 * back everything it holds and start again from its first key when the
 * cache says it may, answered 503 past [server] request_timeout. A key
 * repeated in one create is one object. While a request spans loop turns
 * httpd watches its connection (httpd_request_watch): a client that leaves
 * ends it at once (kvs_job_gone; while its body is being parsed, when the
 * parse is done), and exactly one of that and the answer ends the job.
 * Loop thread only, but for kvs_job_parse_run. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "cache/cache.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/workq.h"
#include "kvnode.h"
#include "mem/namespace.h"
#include "net/httpd.h"
#include "net/kvs_acquire_wire.h"
#include "net/kvs_server_internal.h"
#include "tenants/tenants.h"

#define KVS_SLICE_KEYS     1024        /* keys handled in one loop turn, at most */
#define KVS_SLICE_KEYS_MIN 64          /* ... and at least */
#define KVS_SLICE_NS       1000000u    /* a slice's aim: about 1 ms of the loop */

/* The keys of one namespace in a slice: [first, first + n) of the slice's
 * arrays. */
struct kvs_slice_group {
    struct kvs_key id;              /* block unused */
    struct kv_namespace *ns;
    uint64_t size;                  /* create: the object size asked for */
    size_t first, n;
};

/* Per-slice scratch, room for min(n, KVS_SLICE_KEYS) keys. */
struct kvs_slice {
    size_t *group;                  /* each key's group (SIZE_MAX: a repeat, skipped) */
    int64_t *block;                 /* each key's block key and check word, in request order */
    uint64_t *check;
    int64_t *keys;                  /* by group: block keys, check words, request indexes */
    uint64_t *checks;
    size_t *index;
    struct cache_loc *locs;
    uint64_t *bytes;                /* read: each hit's object size */
    struct kvs_slice_group g[KVS_MAX_NS];
    size_t ng;
};

struct kvs_job {
    struct kvs_server *k;
    struct evhttp_request *req;
    struct tenant *t;
    struct kvs_acquire_req rq;
    uint64_t term_ms;
    uint64_t deadline_ms;           /* waits end here: 503 */
    struct kvs_lease *l;            /* NULL between tries */
    struct kvs_reply reply;         /* the reply's objects so far (from k->replies) */
    size_t next, nobjects;          /* the first key not handled yet; objects written */
    size_t slice_keys;              /* keys in the next slice: halved or doubled to take about KVS_SLICE_NS */
    uint32_t *taken;                /* create of several slices: keys taken so far (index + 1), a hash set */
    size_t taken_mask;
    struct cache_wait *wait;
    struct event *resume;
    bool watched;
    struct kvs_slice s;
    /* A large body parsed on the parse thread (kvs_job_parse_run): its
     * bytes, moved out of the request, and the outcome. */
    struct workq_job parse;
    struct evbuffer *body;
    struct kvs_acquire_limits lim;
    int parse_status;
    char parse_msg[512];
    bool parsing, gone;             /* gone: the connection closed meanwhile */
};

static void kvs_job_run(struct kvs_job *j);

/* --- reply buffers ---------------------------------------------------------------- */

#define KVS_REPLY_KEEP     8            /* buffers kept */
#define KVS_REPLY_KEEP_MAX (1u << 20)   /* a larger one is freed, not kept */

struct kvs_reply_pool {
    size_t refs;                        /* the server's, and one per reply being sent */
    size_t n;
    struct kvs_reply kept[KVS_REPLY_KEEP];
};

/* A reply handed to evhttp: its buffer goes back when evhttp is done. */
struct kvs_reply_sent {
    struct kvs_reply_pool *pool;
    struct kvs_reply r;
};

struct kvs_reply_pool *kvs_reply_pool_new(void)
{
    struct kvs_reply_pool *p = calloc(1, sizeof *p);
    if (p)
        p->refs = 1;
    return p;
}

static struct kvs_reply kvs_reply_take(struct kvs_reply_pool *p)
{
    return p->n ? p->kept[--p->n] : (struct kvs_reply){ 0 };
}

static void kvs_reply_give(struct kvs_reply_pool *p, struct kvs_reply *r)
{
    if (p->n < KVS_REPLY_KEEP && r->cap <= KVS_REPLY_KEEP_MAX && r->p)
        p->kept[p->n++] = (struct kvs_reply){ .p = r->p, .cap = r->cap };
    else
        free(r->p);
    *r = (struct kvs_reply){ 0 };
}

void kvs_reply_pool_release(struct kvs_reply_pool *p)
{
    if (--p->refs > 0)
        return;
    while (p->n)
        free(p->kept[--p->n].p);
    free(p);
}

static void kvs_reply_sent_cb(const void *data, size_t len, void *arg)
{
    struct kvs_reply_sent *sent = arg;
    struct kvs_reply_pool *p = sent->pool;
    (void)data;
    (void)len;
    if (p->refs > 1)
        kvs_reply_give(p, &sent->r);
    else
        free(sent->r.p);   /* the server is gone: nothing keeps buffers */
    kvs_reply_pool_release(p);
    free(sent);
}

/* The whole reply in an evbuffer that refers to j's buffer (no copy); the
 * buffer now belongs to the evbuffer. NULL when out of memory. */
static struct evbuffer *kvs_reply_evbuffer(struct kvs_job *j, size_t off, size_t len)
{
    struct kvs_reply_sent *sent = malloc(sizeof *sent);
    struct evbuffer *out = sent ? evbuffer_new() : NULL;
    if (!out || evbuffer_add_reference(out, j->reply.p + off, len, kvs_reply_sent_cb, sent) < 0) {
        if (out)
            evbuffer_free(out);
        free(sent);
        return NULL;
    }
    sent->pool = j->k->replies;
    sent->r = j->reply;
    sent->pool->refs++;
    j->reply = (struct kvs_reply){ 0 };
    return out;
}

/* --- the job ---------------------------------------------------------------------- */

static void kvs_job_free(struct kvs_job *j)
{
    if (j->wait)
        cache_wait_cancel(j->t->cache, j->wait);
    if (j->resume)
        event_free(j->resume);
    kvs_reply_give(j->k->replies, &j->reply);
    if (j->body)
        evbuffer_free(j->body);
    kvs_acquire_req_free(&j->rq);
    free(j->taken);
    free(j->s.group);
    free(j->s.block);
    free(j->s.check);
    free(j->s.keys);
    free(j->s.checks);
    free(j->s.index);
    free(j->s.locs);
    free(j->s.bytes);
    free(j);
}

/* The connection closed while the request was in progress (the client
 * left, its deadline, or shutdown): evhttp frees the request, nothing
 * answers it. */
static void kvs_job_gone(void *arg)
{
    struct kvs_job *j = arg;
    j->watched = false;
    if (j->parsing) {
        j->gone = true;   /* the parse thread has it: freed when it is done */
        return;
    }
    if (j->l)
        kvs_lease_free(j->k, j->l);
    kvs_job_free(j);
}

/* Before the answer: the connection is evhttp's again. */
static void kvs_job_unwatch(struct kvs_job *j)
{
    if (j->watched)
        httpd_request_unwatch(j->k->httpd, j->req);
    j->watched = false;
}

static void kvs_job_fail(struct kvs_job *j, int status, const char *msg)
{
    if (j->l)
        kvs_lease_free(j->k, j->l);
    j->l = NULL;
    kvs_job_unwatch(j);
    kvs_fail(j->k, j->req, status, msg);
    kvs_job_free(j);
}

static bool kvs_job_watch(struct kvs_job *j)
{
    if (!j->watched && httpd_request_watch(j->k->httpd, j->req, kvs_job_gone, j) < 0)
        return false;
    j->watched = true;
    return true;
}

static void kvs_job_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvs_job_run(arg);
}

static void kvs_job_ready(void *arg)
{
    struct kvs_job *j = arg;
    cache_wait_cancel(j->t->cache, j->wait);
    j->wait = NULL;
    kvs_job_run(j);
}

/* --- one slice -------------------------------------------------------------------- */

/* Whether key i of a create is the first of its string (then noted). */
static bool kvs_job_first_take(struct kvs_job *j, size_t i)
{
    struct kvs_str s = j->rq.keys[i];
    for (size_t h = ns_fnv1a64(s.s, s.len) & j->taken_mask;; h = (h + 1) & j->taken_mask) {
        uint32_t at = j->taken[h];
        if (at == 0) {
            j->taken[h] = (uint32_t)i + 1;
            return true;
        }
        if (j->rq.keys[at - 1].len == s.len && memcmp(j->rq.keys[at - 1].s, s.s, s.len) == 0)
            return false;
    }
}

static bool kvs_same_ns(const struct kvs_key *a, const struct kvs_key *b)
{
    return a->opaque == b->opaque && a->tp_rank == b->tp_rank && a->group == b->group &&
           a->version == b->version && strcmp(a->deployment_id, b->deployment_id) == 0 &&
           strcmp(a->object_ns, b->object_ns) == 0;
}

/* Sort keys [a, b) into namespaces. 0, or 400 with msg. */
static int kvs_slice_group_keys(struct kvs_job *j, size_t a, size_t b, char *msg, size_t msglen)
{
    struct kvs_slice *s = &j->s;
    struct kvs_key key;
    /* The last v1 key parsed whole: a key with its prefix is only its block. */
    const char *prev = NULL;
    size_t prev_len = 0, prev_g = 0;
    uint64_t prev_size = 0;
    s->ng = 0;
    for (size_t i = a; i < b; i++) {
        size_t x = i - a, g;
        uint64_t size = j->rq.create ? j->rq.sizes[i] : 0;
        int64_t block;
        s->group[x] = SIZE_MAX;
        if (j->taken && !kvs_job_first_take(j, i))
            continue;
        if (prev && size == prev_size && kvs_key_same_prefix(prev, prev_len, j->rq.keys[i].s, j->rq.keys[i].len,
                                                             &block)) {
            s->g[prev_g].n++;
            s->group[x] = prev_g;
            s->block[x] = block;
            s->check[x] = 0;
            continue;
        }
        if (kvs_key_classify(j->rq.keys[i].s, j->rq.keys[i].len, &key, msg, msglen) < 0)
            return 400;
        for (g = s->ng; g-- > 0;)
            if (s->g[g].size == size && kvs_same_ns(&s->g[g].id, &key))
                break;   /* a create's objects of another size: another namespace */
        if (g == SIZE_MAX) {
            if (s->ng == KVS_MAX_NS) {
                snprintf(msg, msglen, "the keys name more than %d (deployment, rank, group, size) namespaces "
                         "within %d keys of each other; send fewer at once", KVS_MAX_NS, KVS_SLICE_KEYS);
                return 400;
            }
            g = s->ng++;
            s->g[g] = (struct kvs_slice_group){ .id = key, .size = size };
        }
        s->g[g].n++;
        s->group[x] = g;
        s->block[x] = key.block;
        s->check[x] = key.check;
        if ((prev_len = kvs_key_prefix_len(j->rq.keys[i].s, j->rq.keys[i].len, &key)) != 0) {
            prev = j->rq.keys[i].s;
            prev_g = g;
            prev_size = size;
        } else {
            prev = NULL;
        }
    }
    size_t first = 0;
    for (size_t g = 0; g < s->ng; g++) {
        s->g[g].first = first;
        first += s->g[g].n;
        s->g[g].n = 0;
    }
    for (size_t i = a; i < b; i++) {
        size_t x = i - a;
        if (s->group[x] == SIZE_MAX)
            continue;
        struct kvs_slice_group *g = &s->g[s->group[x]];
        size_t y = g->first + g->n++;
        s->keys[y] = s->block[x];
        s->checks[y] = s->check[x];
        s->index[y] = i;
    }
    return 0;
}

/* A create of group g's keys under j's lease. 0, CACHE_STORE_BOUND (msg
 * says why), or an HTTP status with msg. */
static int kvs_slice_create(struct kvs_job *j, struct kvs_slice_group *g, struct ns_layout *layout, char *msg,
                            size_t msglen)
{
    struct kvs_slice *s = &j->s;
    const struct ns_layout plain = *layout;   /* binding may append the size tag */
    const uint64_t *checks = g->id.opaque ? s->checks + g->first : NULL;
    uint64_t lease_id = 0, other;
    int rc = kvs_bind_object_ns(j->t->cache, layout, &g->ns, msg, msglen);
    if (rc < 0)
        return kvs_status_of(rc);
    cache_unbind(j->t->cache, g->ns);   /* kept by its reservations and blocks, not by a client */
    /* One key, one object: not created again at another size (a client
     * told "stored" would read the other size's bytes). */
    size_t at = kvs_held_at_other_size(j->t->cache, &plain, g->ns, s->keys + g->first, checks, g->n, &other);
    if (at < g->n) {
        struct kvs_str key = j->rq.keys[s->index[g->first + at]];
        snprintf(msg, msglen, "object key '%.*s' exists (or is being written) at size %" PRIu64 "; a create of it "
                 "at size %" PRIu64 " is refused: an object keeps its size (use another key)",
                 (int)(key.len < 256 ? key.len : 256), key.s, other, g->size);
        return 409;
    }
    if (!kvs_lease_sub_room(j->l, 1)) {
        snprintf(msg, msglen, "out of memory");
        return 500;
    }
    /* v1 keys carry no check words (NULL: word 0); opaque keys' are from their
     * hash. Left out means stored to the client: keys another create lease
     * is still writing make this one wait for it to end (wait_writing). */
    rc = cache_put_begin(j->t->cache, &(struct cache_put_req){ .ns = g->ns, .owner = &j->l->owner,
                         .keys = s->keys + g->first, .checks = checks, .n = g->n, .tier = KVNODE_TIER_HOST,
                         .wait_writing = true },
                         &lease_id, s->locs + g->first, msg, msglen);
    if (rc == CACHE_STORE_BOUND)
        return rc;
    if (rc == -KVNODE_ELIMIT) {
        /* The HTTP lease is the reserving client: this create alone is
         * over the bound, and would be at every retry. */
        char why[512];
        snprintf(why, sizeof why, "%.400s", msg);
        snprintf(msg, msglen, "one create lease reserves too much (%.400s)", why);
        return 413;
    }
    if (rc != 0)
        return kvs_status_of(rc);
    if (lease_id)
        j->l->sub[j->l->nsub++] = lease_id;
    return 0;
}

static int kvs_slice_read(struct kvs_job *j, struct kvs_slice_group *g, struct ns_layout *layout, char *msg,
                          size_t msglen)
{
    struct kvs_slice *s = &j->s;
    if (!kvs_lease_sub_room(j->l, KVS_MAX_NS)) {
        snprintf(msg, msglen, "out of memory");
        return 500;
    }
    j->k->st.read_keys += g->n;
    int rc = kvs_read_objects(j->t->cache, layout, &(struct kvs_read){ .keys = s->keys + g->first,
                              .checks = g->id.opaque ? s->checks + g->first : NULL, .n = g->n,
                              .owner = &j->l->owner, .locs = s->locs + g->first, .bytes = s->bytes + g->first,
                              .lease_ids = j->l->sub, .nleases = &j->l->nsub, .max_leases = j->l->capsub },
                              msg, msglen);
    return rc == 0 ? 0 : kvs_status_of(rc);
}

/* Group g's objects into the reply. */
static int kvs_slice_answer(struct kvs_job *j, const struct kvs_slice_group *g)
{
    const struct kvs_slice *s = &j->s;
    for (size_t y = g->first; y < g->first + g->n; y++) {
        if (!s->locs[y].present) {
            j->k->st.create_existing += j->rq.create;
            continue;
        }
        j->k->st.read_hits += !j->rq.create;
        if (kvs_reply_object(&j->reply, j->nobjects == 0, j->rq.keys[s->index[y]], s->locs[y].offset,
                             j->rq.create ? g->ns->layout.block_bytes : s->bytes[y]) < 0)
            return -1;
        j->nobjects++;
    }
    return 0;
}

/* Keys [a, b): 0, CACHE_STORE_BOUND, or an HTTP status; msg set. */
static int kvs_job_slice(struct kvs_job *j, size_t a, size_t b, char *msg, size_t msglen)
{
    const struct kvn_config *cfg = *j->k->deps.cfg;
    int rc = kvs_slice_group_keys(j, a, b, msg, msglen);
    for (size_t x = 0; rc == 0 && x < j->s.ng; x++) {
        struct kvs_slice_group *g = &j->s.g[x];
        struct ns_layout layout;
        if (kvs_key_layout(&g->id, cfg->kvs_tp_size, g->size, &layout, msg, msglen) < 0)
            return 400;
        rc = j->rq.create ? kvs_slice_create(j, g, &layout, msg, msglen) : kvs_slice_read(j, g, &layout, msg, msglen);
        if (rc == 0 && kvs_slice_answer(j, g) < 0) {
            snprintf(msg, msglen, "out of memory");
            rc = 500;
        }
    }
    return rc;
}

/* --- tries, waits and the answer --------------------------------------------------- */

/* Give back what the try holds and wait for room (or for the other create
 * lease to seal or end), or answer 503 past the deadline. */
static void kvs_job_wait(struct kvs_job *j, char *msg, size_t msglen)
{
    uint64_t now = clock_now_ms();
    kvs_lease_free(j->k, j->l);
    j->l = NULL;
    if (kvs_job_watch(j) && now < j->deadline_ms &&
        cache_put_wait(j->t->cache, (unsigned)(j->deadline_ms - now) + 1, kvs_job_ready, j, &j->wait) == 0)
        return;
    size_t used = strlen(msg);
    snprintf(msg + used, msglen - used, "; waited up to [server] request_timeout (%u ms)",
             (*j->k->deps.cfg)->request_timeout_ms);
    kvs_job_fail(j, 503, msg);
}

/* A new try: a fresh lease, an empty reply. 0 or an HTTP status. */
static int kvs_job_try(struct kvs_job *j, char *msg, size_t msglen)
{
    struct kvs_server *k = j->k;
    int status = kvs_leases_room(&k->leases, *k->deps.cfg, k->deps.tenants, j->t, k->st.leases_open, msg, msglen);
    if (status != 0)
        return status;
    if (!(j->l = kvs_lease_new(k, j->t, j->rq.create ? LEASE_WRITE : LEASE_READ, j->term_ms))) {
        snprintf(msg, msglen, "out of memory");
        return 500;
    }
    j->reply.len = 0;
    j->next = j->nobjects = 0;
    /* A request of up to KVS_SLICE_KEYS keys is one slice at every try:
     * only creates of more have the set of keys taken (kvs_job_first_take). */
    j->slice_keys = KVS_SLICE_KEYS;
    if (j->taken)
        memset(j->taken, 0, (j->taken_mask + 1) * sizeof *j->taken);
    return 0;
}

static void kvs_job_answer(struct kvs_job *j)
{
    char id[KVS_LEASE_ID_HEX + 1] = "", why[384];
    bool granted = j->l->nsub != 0;
    size_t off, len;
    if (granted) {
        kvs_lease_id_format(&j->l->id, id);
    } else {
        kvs_lease_free(j->k, j->l);   /* nothing held: "" (create: every object exists) */
        j->l = NULL;
    }
    if (kvs_reply_wrap(&j->reply, id, &off, &len) < 0) {
        kvs_job_fail(j, 500, "out of memory");
        return;
    }
    int status = httpd_reply_room(j->req, len, why, sizeof why);
    if (status != 0) {
        kvs_job_fail(j, status, why);   /* over the output caps: nothing is granted */
        return;
    }
    struct evbuffer *out = kvs_reply_evbuffer(j, off, len);
    if (!out) {
        kvs_job_fail(j, 500, "out of memory");
        return;
    }
    if (j->l)
        j->l->expires_ms = clock_now_ms() + j->term_ms;
    kvs_job_unwatch(j);
    evhttp_add_header(evhttp_request_get_output_headers(j->req), "Content-Type", "application/json");
    httpd_send_reply(j->req, 200, "OK", out);
    evbuffer_free(out);
    kvs_job_free(j);
}

static bool kvs_job_yield(struct kvs_job *j)
{
    static const struct timeval now = { 0, 0 };
    if (!kvs_job_watch(j))
        return false;
    if (!j->resume && !(j->resume = event_new(j->k->deps.base, -1, 0, kvs_job_resume_cb, j)))
        return false;
    return event_add(j->resume, &now) == 0;
}

/* The next slice's size from how long this one took: a slower machine
 * (or build: ASan) gets smaller slices, so the loop is held about as long. */
static void kvs_job_pace(struct kvs_job *j, uint64_t took_ns)
{
    if (took_ns > 2 * KVS_SLICE_NS && j->slice_keys / 2 >= KVS_SLICE_KEYS_MIN)
        j->slice_keys /= 2;
    else if (took_ns < KVS_SLICE_NS / 2 && j->slice_keys * 2 <= KVS_SLICE_KEYS)
        j->slice_keys *= 2;
}

static void kvs_job_run(struct kvs_job *j)
{
    char msg[512], why[384];
    int status;
    if (!j->l && (status = kvs_job_try(j, msg, sizeof msg)) != 0) {
        kvs_job_fail(j, status, msg);
        return;
    }
    size_t end = j->rq.n - j->next > j->slice_keys ? j->next + j->slice_keys : j->rq.n;
    uint64_t t0 = clock_now_ns();
    status = kvs_job_slice(j, j->next, end, msg, sizeof msg);
    kvs_job_pace(j, clock_now_ns() - t0);
    if (status == CACHE_STORE_BOUND) {
        kvs_job_wait(j, msg, sizeof msg);
        return;
    }
    if (status != 0) {
        kvs_job_fail(j, status, msg);
        return;
    }
    if (end < j->rq.n && (status = httpd_reply_room(j->req, j->reply.len, why, sizeof why))) {
        kvs_job_fail(j, status, why);   /* the reply would be over the output caps already */
        return;
    }
    j->next = end;
    if (end == j->rq.n)
        kvs_job_answer(j);
    else if (!kvs_job_yield(j))
        kvs_job_fail(j, 500, "out of memory");
}

/* --- the request ------------------------------------------------------------------ */

#define KVS_PARSE_INLINE (64u << 10)   /* bodies up to this are parsed on the loop (about 600 keys) */

static bool kvs_job_scratch(struct kvs_job *j)
{
    size_t m = j->rq.n < KVS_SLICE_KEYS ? (j->rq.n ? j->rq.n : 1) : KVS_SLICE_KEYS;
    struct kvs_slice *s = &j->s;
    s->group = malloc(m * sizeof *s->group);
    s->block = malloc(m * sizeof *s->block);
    s->check = malloc(m * sizeof *s->check);
    s->keys = malloc(m * sizeof *s->keys);
    s->checks = malloc(m * sizeof *s->checks);
    s->index = malloc(m * sizeof *s->index);
    s->locs = calloc(m, sizeof *s->locs);
    s->bytes = malloc(m * sizeof *s->bytes);
    if (j->rq.create && j->rq.n > KVS_SLICE_KEYS) {
        for (j->taken_mask = 1; j->taken_mask < 2 * j->rq.n; j->taken_mask <<= 1)
            ;
        j->taken = calloc(j->taken_mask, sizeof *j->taken);
        j->taken_mask--;
    }
    return s->group && s->block && s->check && s->keys && s->checks && s->index && s->locs && s->bytes &&
           (j->taken || !(j->rq.create && j->rq.n > KVS_SLICE_KEYS));
}

/* The body is parsed: the request starts (owns j). */
static void kvs_job_start(struct kvs_job *j)
{
    struct kvs_server *k = j->k;
    const struct kvn_config *cfg = *k->deps.cfg;
    j->term_ms = j->rq.has_term && j->rq.term_s > 0 ? j->rq.term_s * 1000 : cfg->kvs_default_term_ms;
    j->reply = kvs_reply_take(k->replies);
    if (!kvs_job_scratch(j)) {
        kvs_job_fail(j, 500, "out of memory");
        return;
    }
    if (j->rq.create) {
        k->st.acquire_create++;
        k->st.create_keys += j->rq.n;
    } else {
        k->st.acquire_read++;
    }
    kvs_job_run(j);
}

/* The parse thread: nothing but j's own body and request. */
static void kvs_job_parse_run(struct workq_job *w, void *ctx)
{
    struct kvs_job *j = (struct kvs_job *)((char *)w - offsetof(struct kvs_job, parse));
    size_t len = evbuffer_get_length(j->body);
    char *text = malloc(len ? len : 1);
    (void)ctx;
    if (!text) {
        j->parse_status = 500;
        snprintf(j->parse_msg, sizeof j->parse_msg, "out of memory");
        return;
    }
    evbuffer_copyout(j->body, text, len);
    j->parse_status = kvs_acquire_req_parse_owned(text, len, &j->lim, &j->rq, j->parse_msg, sizeof j->parse_msg);
}

static void kvs_job_parse_done(struct workq_job *w)
{
    struct kvs_job *j = (struct kvs_job *)((char *)w - offsetof(struct kvs_job, parse));
    j->parsing = false;
    evbuffer_free(j->body);
    j->body = NULL;
    if (j->gone || w->cancelled) {
        kvs_job_free(j);   /* the client left, or shutdown: nothing to answer */
        return;
    }
    if (j->parse_status != 0) {
        kvs_job_fail(j, j->parse_status, j->parse_msg);
        return;
    }
    kvs_job_start(j);
}

/* A large body goes to the parse thread, so the loop is not held for it:
 * its bytes are moved (not copied) out of the request. false: j is still
 * the caller's (queue full: msg says so). */
static bool kvs_job_parse_off_loop(struct kvs_job *j, struct evbuffer *in, char *msg, size_t msglen)
{
    j->parse = (struct workq_job){ .run = kvs_job_parse_run, .done = kvs_job_parse_done };
    if (!(j->body = evbuffer_new()) || evbuffer_add_buffer(j->body, in) < 0 || !kvs_job_watch(j)) {
        snprintf(msg, msglen, "out of memory");
        return false;
    }
    j->parsing = true;
    if (workq_submit(j->k->parse_q, &j->parse) == 0)
        return true;
    j->parsing = false;
    snprintf(msg, msglen, "%d large requests are waiting to be parsed; try again", KVS_PARSE_QUEUE);
    return false;
}

void kvs_acquire(struct kvs_server *k, struct evhttp_request *req, struct tenant *t)
{
    const struct kvn_config *cfg = *k->deps.cfg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    struct kvs_job *j = calloc(1, sizeof *j);
    char msg[512];
    int status = 500;

    if (!j) {
        kvs_fail(k, req, 500, "out of memory");
        return;
    }
    *j = (struct kvs_job){ .k = k, .req = req, .t = t, .deadline_ms = clock_now_ms() + cfg->request_timeout_ms,
                           .slice_keys = KVS_SLICE_KEYS,
                           .lim = { .max_keys = cfg->kvs_max_keys, .max_term_s = cfg->kvs_max_term_ms / 1000 } };
    if (len > KVS_PARSE_INLINE) {
        if (kvs_job_parse_off_loop(j, in, msg, sizeof msg))
            return;
        kvs_job_fail(j, msg[0] == 'o' ? 500 : 503, msg);
        return;
    }
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    snprintf(msg, sizeof msg, "out of memory");
    if (!body || (status = kvs_acquire_req_parse(body, len, &j->lim, &j->rq, msg, sizeof msg)) != 0) {
        kvs_job_fail(j, status, msg);
        return;
    }
    kvs_job_start(j);
}
