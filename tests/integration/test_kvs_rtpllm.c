/* The "Done when" driver of issue 30: the KVS front end driven exactly as
 * rtp-llm's own KVS client drives it, both variants of that client
 * (../shared/docs/reference/rtp-llm-kvs-client.md: 85c02327f, PR #1154, and
 * de10de826, the earlier branch), with the DEFAULT [kvs_server] options
 * (only enabled, listen and socket_path are set).
 *
 * The client below is written from the reference's description of
 * KVSClient.cc / KVSConnector.cc (no code of rtp-llm is copied): a fresh TCP
 * connection (curl easy handle) per HTTP call, its headers and exact status
 * checks (200 for /health and /acquire, 204 for /seal, /release, /discard),
 * its create-reply rules (a null or invalid entry, or a key it did not ask
 * for, fails the store and discards the lease; an empty lease id means "all
 * exist"), sorted de-duplicated keys on a match, its match rule (a block is a
 * hit when every group's object has a handle; the prefix counts), the
 * iovecs of an object copied back to back, each variant's load checks
 * (85c02327f: fetch first, range checked with the client's own size;
 * de10de826: the server's size must be at least the client's), and the
 * vineyard handshake on the unix socket for the one mapping.
 *
 * Every object a client was told is stored (store() returned true: 200, the
 * lease handled, seal 204 and release 204; or an empty lease id) must read
 * back byte-exact through acquire(read) + load + release: wrong bytes are
 * counted and must be 0. Waits are bounded (curl's 12 s per call, a receive
 * timeout on the data plane the real client does not set, the tcase
 * timeout); no assertion is on time. KVS_RTPLLM_TRACE=1 in the environment
 * prints every HTTP request and reply (the first 2000 bytes of each).
 *
 * Cases: every rank of TP 16 (under both variants' deployment ids) beside
 * a TP-8 and a TP-2 deployment, 42 engine processes at once; opaque keys and
 * objects of 64 B, 8 KiB, 32 KiB, 4 MiB and odd sizes made of several
 * iovecs in one group, in one store; the match prefix rule; a create body
 * over 1 MiB (libcurl's Expect: 100-continue); a read lease held from the
 * match to the read through eviction; a create racing an unsealed create of
 * the same keys (the first writer seals, discards, dies with a 1 s term, or
 * dies within its 60 s term), and unsealed objects invisible to a match;
 * a key held at one size not created again at another. */
#include <check.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"

/* ====================================================================== */
/* rtp-llm's KVSClient, both variants                                      */
/* ====================================================================== */

typedef enum { V85C = 0, VDE10 = 1 } rtp_variant;
static const char *const VNAME[2] = { "85c02327f (PR #1154)", "de10de826 (earlier)" };

#define RTP_MAX_IOVS 16

/* BlockInfo: one piece of host memory. */
typedef struct rtp_iov {
    uint8_t *addr;
    size_t size;
} rtp_iov;

/* KVSObjectBuffer. */
typedef struct rtp_buffer {
    char *key;
    rtp_iov iov[RTP_MAX_IOVS];
    size_t niov;
    int block, group;          /* the connector's bookkeeping */
} rtp_buffer;

/* KVSObjectHandle. */
typedef struct rtp_handle {
    char *key;
    uint64_t offset;
    size_t bytes;
    bool fetched;              /* 85c02327f's fetched_keys */
} rtp_handle;

/* Keys to their index, as rtp-llm's maps find them: by hash (a linear
 * search made a long prompt's thousands of keys O(n^2) in the driver, tens
 * of seconds under ASan). slot[] holds index + 1, 0 when free. */
typedef struct str_index {
    size_t *slot;
    size_t mask;
} str_index;

typedef const char *(*str_key_at)(const void *items, size_t i);

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Room for n keys. false when out of memory (the index stays empty). */
static bool str_index_init(str_index *x, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    x->slot = calloc(cap, sizeof *x->slot);
    x->mask = x->slot ? cap - 1 : 0;
    return x->slot != NULL;
}

/* The index of key among items (key_at names them), or SIZE_MAX. */
static size_t str_index_get(const str_index *x, const void *items, str_key_at key_at, const char *key)
{
    for (size_t h = str_hash(key) & x->mask;; h = (h + 1) & x->mask) {
        size_t at = x->slot[h];
        if (at == 0)
            return SIZE_MAX;
        if (strcmp(key_at(items, at - 1), key) == 0)
            return at - 1;
    }
}

/* Item i under its key (the first item of a key wins, as emplace). */
static void str_index_put(str_index *x, const void *items, str_key_at key_at, size_t i)
{
    const char *key = key_at(items, i);
    for (size_t h = str_hash(key) & x->mask;; h = (h + 1) & x->mask) {
        if (x->slot[h] == 0) {
            x->slot[h] = i + 1;
            return;
        }
        if (strcmp(key_at(items, x->slot[h] - 1), key) == 0)
            return;
    }
}

/* KVSReadSession. */
typedef struct rtp_session {
    char lease_id[256];
    rtp_handle *h;
    size_t n;
    str_index idx;             /* over h, when built; else a linear search */
} rtp_session;

static const char *rtp_handle_key(const void *items, size_t i)
{
    return ((const rtp_handle *)items)[i].key;
}

typedef struct rtp_kvs {
    rtp_variant v;
    char url[256];
    char socket_path[PATH_MAX];
    long timeout_ms;           /* kvs_timeout_ms */
    int term;                  /* kvs_lease_term_sec */
    int socket_fd, mmap_fd;
    uint8_t *base;
    size_t mmap_size;
    bool inited;
    char why[768];             /* the last failure, for the test's messages */
} rtp_kvs;

typedef struct http_resp {
    long status;
    char *body;
    size_t len;
} http_resp;

static size_t resp_write(char *p, size_t sz, size_t nm, void *arg)
{
    http_resp *r = arg;
    char *q = realloc(r->body, r->len + sz * nm + 1);
    if (!q)
        return 0;
    memcpy(q + r->len, p, sz * nm);
    r->body = q;
    r->len += sz * nm;
    r->body[r->len] = '\0';
    return sz * nm;
}

/* joinUrl: the base without trailing '/', then '/' + route. */
static void join_url(const char *base, const char *route, char *out, size_t len)
{
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    snprintf(out, len, "%.*s/%s", (int)n, base, route);
}

/* httpGet (payload NULL) / httpPost: a fresh easy handle, so a new TCP
 * connection, per call. false on a transport error (why set). */
static bool rtp_http(rtp_kvs *c, const char *route, const char *payload, http_resp *r)
{
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = NULL;
    char url[512];

    memset(r, 0, sizeof *r);
    if (!h)
        return false;
    join_url(c->url, route, url, sizeof url);
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (payload) {
        hdr = curl_slist_append(hdr, "Content-Type: application/json");
        hdr = curl_slist_append(hdr, "Accept: application/json");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(payload));
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, resp_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);   /* threads; changes nothing on the wire */
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    if (getenv("KVS_RTPLLM_TRACE"))
        fprintf(stderr, "TRACE %s %s %.2000s\n  -> %ld %.2000s\n", payload ? "POST" : "GET", url,
                payload ? payload : "", r->status, r->body ? r->body : "");
    if (rc != CURLE_OK) {
        snprintf(c->why, sizeof c->why, "%s %s: %s", payload ? "POST" : "GET", url, curl_easy_strerror(rc));
        free(r->body);
        r->body = NULL;
        return false;
    }
    return true;
}

static void note_status(rtp_kvs *c, const char *what, const http_resp *r)
{
    snprintf(c->why, sizeof c->why, "%s answered %ld: %.600s", what, r->status, r->body ? r->body : "");
}

/* getJsonUint64: any JSON integer >= 0. */
static bool json_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* ---- the data plane: initMmap ---------------------------------------- */

static bool send_all(int fd, const void *p, size_t n)
{
    const char *q = p;
    while (n > 0) {
        ssize_t s = send(fd, q, n, MSG_NOSIGNAL);
        if (s <= 0)
            return false;
        q += s;
        n -= (size_t)s;
    }
    return true;
}

static bool recv_all(int fd, void *p, size_t n)
{
    char *q = p;
    while (n > 0) {
        ssize_t g = recv(fd, q, n, 0);
        if (g <= 0)
            return false;
        q += g;
        n -= (size_t)g;
    }
    return true;
}

/* sendJsonMessage: a host-order uint64 length, then the text. */
static bool send_msg(int fd, const char *json)
{
    uint64_t len = strlen(json);
    return send_all(fd, &len, sizeof len) && send_all(fd, json, len);
}

/* recvJsonMessage: NULL on error or above 16 MiB (caller frees). */
static char *recv_msg(int fd)
{
    uint64_t len = 0;
    if (!recv_all(fd, &len, sizeof len) || len > (16ull << 20))
        return NULL;
    char *m = calloc(1, len + 1);
    if (m && len > 0 && !recv_all(fd, m, len)) {
        free(m);
        return NULL;
    }
    return m;
}

static bool rtp_init_mmap(rtp_kvs *c)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    struct timeval tv = { .tv_sec = 10 };   /* bounded here; the real client waits forever */
    char *m;

    c->socket_fd = socket(AF_UNIX, SOCK_STREAM, 0);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%.107s", c->socket_path);
    if (c->socket_fd < 0 || connect(c->socket_fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        snprintf(c->why, sizeof c->why, "connect %.700s failed", c->socket_path);
        return false;
    }
    setsockopt(c->socket_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (!send_msg(c->socket_fd, "{\"type\":\"register_request\",\"version\":\"0.0.0\",\"store_type\":0,"
                                "\"session_id\":0,\"username\":\"\",\"password\":\"\"}")) {
        snprintf(c->why, sizeof c->why, "send register_request failed");
        return false;
    }
    m = recv_msg(c->socket_fd);
    bool ok = m && strstr(m, "register_reply");
    snprintf(c->why, sizeof c->why, "bad register_reply [%.600s]", m ? m : "");
    free(m);
    if (!ok || !send_msg(c->socket_fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}"))
        return false;
    m = recv_msg(c->socket_fd);
    json_t *doc = m ? json_loads(m, 0, NULL) : NULL;
    uint64_t size = 0;
    ok = json_is_object(doc) && json_u64(json_object_get(doc, "size"), &size);
    snprintf(c->why, sizeof c->why, "invalid mmap reply [%.600s]", m ? m : "");
    json_decref(doc);
    free(m);
    if (!ok)
        return false;
    c->mmap_size = (size_t)size;

    char ctl[CMSG_SPACE(sizeof(int))] = { 0 }, data[1] = { 0 };
    struct iovec iov = { data, sizeof data };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl };
    if (recvmsg(c->socket_fd, &msg, 0) < 0) {
        snprintf(c->why, sizeof c->why, "receive mmap fd failed");
        return false;
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            memcpy(&c->mmap_fd, CMSG_DATA(cm), sizeof(int));
            break;
        }
    if (c->mmap_fd < 0) {
        snprintf(c->why, sizeof c->why, "no mmap fd in SCM_RIGHTS");
        return false;
    }
    c->base = mmap(NULL, c->mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, c->mmap_fd, 0);
    if (c->base == MAP_FAILED) {
        c->base = NULL;
        snprintf(c->why, sizeof c->why, "mmap of %zu bytes failed", c->mmap_size);
        return false;
    }
    return true;
}

/* KVSClient::init: /health must answer 200, then the handshake. */
static bool rtp_init(rtp_kvs *c, rtp_variant v, const kvs_env *e, int term)
{
    http_resp r;
    memset(c, 0, sizeof *c);
    c->v = v;
    c->socket_fd = c->mmap_fd = -1;
    c->timeout_ms = 12000;     /* KVS_TIMEOUT_MS default */
    c->term = term;            /* KVS_LEASE_TERM_SEC (default 60) */
    snprintf(c->url, sizeof c->url, "%.255s", e->url);
    snprintf(c->socket_path, sizeof c->socket_path, "%.4000s", e->kvs_sock);
    if (!rtp_http(c, "health", NULL, &r))
        return false;
    bool ok = r.status == 200;
    if (!ok)
        note_status(c, "/health", &r);
    free(r.body);
    if (!ok || !rtp_init_mmap(c))
        return false;
    c->why[0] = '\0';
    c->inited = true;
    return true;
}

/* ~KVSClient; also how a test's writer "dies": its connections close. */
static void rtp_close(rtp_kvs *c)
{
    if (c->base)
        munmap(c->base, c->mmap_size);
    if (c->mmap_fd >= 0)
        close(c->mmap_fd);
    if (c->socket_fd >= 0)
        close(c->socket_fd);
    c->base = NULL;
    c->mmap_fd = c->socket_fd = -1;
    c->inited = false;
}

/* ---- acquire replies: parseObjectHandle -------------------------------- */

static bool rtp_parse_handle(const rtp_kvs *c, json_t *o, rtp_handle *out)
{
    json_t *key = json_object_get(o, "key"), *blobs = json_object_get(o, "blobs");
    if (!json_is_object(o) || !json_is_string(key) || !json_is_array(blobs) || json_array_size(blobs) == 0)
        return false;
    json_t *blob = json_array_get(blobs, 0), *type = json_object_get(blob, "type");
    json_t *h = json_object_get(blob, "handle");
    if (!json_is_object(blob) || !json_is_string(type) || strcmp(json_string_value(type), "vineyard") != 0 ||
        !json_is_object(h))
        return false;
    uint64_t off, size, id, msize;
    if (!json_object_get(h, "data_offset") || !json_object_get(h, "data_size") ||
        !json_u64(json_object_get(h, "data_offset"), &off) || !json_u64(json_object_get(h, "data_size"), &size))
        return false;
    if (json_object_get(h, "object_id") && (!json_u64(json_object_get(h, "object_id"), &id) || id == UINT64_MAX))
        return false;
    json_t *meta = json_object_get(o, "meta");
    if (json_is_object(meta) && json_object_get(meta, "size") && json_u64(json_object_get(meta, "size"), &msize) &&
        msize > 0)
        size = msize;
    if (off > c->mmap_size || size > c->mmap_size - off)
        return false;
    out->key = strdup(json_string_value(key));
    out->offset = off;
    out->bytes = (size_t)size;
    out->fetched = false;
    return out->key != NULL;
}

static void rtp_session_free(rtp_session *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->h[i].key);
    free(s->h);
    free(s->idx.slot);
    memset(s, 0, sizeof *s);
}

/* handles.emplace: the first entry of a key wins. */
static rtp_handle *rtp_session_find(const rtp_session *s, const char *key)
{
    if (s->idx.slot) {
        size_t i = str_index_get(&s->idx, s->h, rtp_handle_key, key);
        return i == SIZE_MAX ? NULL : &s->h[i];
    }
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->h[i].key, key) == 0)
            return &s->h[i];
    return NULL;
}

/* A parsed acquire reply: must be an object with "lease" and "objects";
 * the lease id when "lease" is an object with a string lease_id. */
static json_t *rtp_acquire_reply(rtp_kvs *c, const http_resp *r, char *lease, size_t leaselen)
{
    json_t *doc = r->body ? json_loads(r->body, 0, NULL) : NULL;
    if (!json_is_object(doc) || !json_object_get(doc, "lease") || !json_object_get(doc, "objects")) {
        note_status(c, "/acquire (unparsable)", r);
        json_decref(doc);
        return NULL;
    }
    const char *id = json_string_value(json_object_get(json_object_get(doc, "lease"), "lease_id"));
    snprintf(lease, leaselen, "%s", id && json_is_object(json_object_get(doc, "lease")) ? id : "");
    return doc;
}

/* acquireForRead: false is the client's nullopt (a miss for the caller). */
static bool rtp_acquire_read(rtp_kvs *c, char *const *keys, size_t n, const char *trace, rtp_session *s)
{
    memset(s, 0, sizeof *s);
    if (!c->inited || n == 0)
        return true;
    json_t *o = json_object(), *k = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(k, json_string(keys[i]));
    json_object_set_new(o, "scope", json_string("read"));
    json_object_set_new(o, "object_keys", k);
    json_object_set_new(o, "term", json_integer(c->term));
    json_object_set_new(o, "peer", json_string("local"));
    json_object_set_new(o, "wait_timeout", json_integer(0));
    json_object_set_new(o, "request_id", json_string(trace));
    json_object_set_new(o, "best_effort", json_true());
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    http_resp r;
    bool sent = body && rtp_http(c, "acquire", body, &r);
    free(body);
    if (!sent)
        return false;
    if (r.status != 200) {
        note_status(c, "acquire READ", &r);
        free(r.body);
        return false;
    }
    json_t *doc = rtp_acquire_reply(c, &r, s->lease_id, sizeof s->lease_id), *objs, *it;
    free(r.body);
    if (!doc)
        return false;
    objs = json_object_get(doc, "objects");
    if (!json_is_array(objs)) {
        json_decref(doc);
        return false;
    }
    s->h = calloc(json_array_size(objs) + 1, sizeof *s->h);
    str_index_init(&s->idx, json_array_size(objs));
    size_t i;
    json_array_foreach(objs, i, it) {
        rtp_handle h;
        if (json_is_null(it) || !rtp_parse_handle(c, it, &h))
            continue;   /* null skipped, invalid dropped: misses */
        if (rtp_session_find(s, h.key)) {
            free(h.key);
        } else {
            s->h[s->n++] = h;
            if (s->idx.slot)
                str_index_put(&s->idx, s->h, rtp_handle_key, s->n - 1);
        }
    }
    json_decref(doc);
    return true;
}

static size_t total_bytes(const rtp_buffer *b)
{
    size_t n = 0;
    for (size_t i = 0; i < b->niov; i++)
        n += b->iov[i].size;
    return n;
}

/* 85c02327f's fetch: every key must have a handle. */
static bool rtp_fetch(rtp_kvs *c, rtp_session *s, const rtp_buffer *dst, size_t n)
{
    if (c->v != V85C)
        return true;   /* de10de826 has no fetch */
    for (size_t i = 0; i < n; i++) {
        rtp_handle *h = rtp_session_find(s, dst[i].key);
        if (!h) {
            snprintf(c->why, sizeof c->why, "fetch miss handle [%.600s]", dst[i].key);
            return false;
        }
        h->fetched = true;
    }
    return true;
}

/* load, as each variant checks: copy the object's bytes from the mapping
 * into dst's iovecs back to back. */
static bool rtp_load(rtp_kvs *c, const rtp_session *s, const rtp_buffer *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const rtp_handle *h = rtp_session_find(s, dst[i].key);
        size_t expected = total_bytes(&dst[i]);
        if (!h || (c->v == V85C && !h->fetched)) {
            snprintf(c->why, sizeof c->why, "load miss handle [%.600s]", dst[i].key);
            return false;
        }
        if (c->v == VDE10 && expected > h->bytes) {
            snprintf(c->why, sizeof c->why, "load object too small [%.500s] expected %zu server %zu", dst[i].key,
                     expected, h->bytes);
            return false;
        }
        size_t range = c->v == VDE10 ? h->bytes : expected;
        if (h->offset > c->mmap_size || range > c->mmap_size - h->offset) {
            snprintf(c->why, sizeof c->why, "load out of mmap range [%.500s] offset %" PRIu64, dst[i].key, h->offset);
            return false;
        }
        size_t off = 0;
        for (size_t j = 0; j < dst[i].niov; j++) {
            memcpy(dst[i].iov[j].addr, c->base + h->offset + off, dst[i].iov[j].size);
            off += dst[i].iov[j].size;
        }
    }
    return true;
}

/* release / discard: the client only logs a failure; the status is kept
 * for the test (0: nothing sent, empty lease). */
static long rtp_lease_call(rtp_kvs *c, const char *route, const char *lease)
{
    if (!*lease)
        return 0;
    json_t *o = json_pack("{s:s}", "lease_id", lease);
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    http_resp r;
    bool sent = body && rtp_http(c, route, body, &r);
    free(body);
    if (!sent)
        return -1;
    if (r.status != 204)
        note_status(c, route, &r);
    free(r.body);
    return r.status;
}

/* ---- store(), in the steps the race tests pause between ---------------- */

typedef struct rtp_store {
    const rtp_buffer *src;
    size_t n;
    char trace[128];
    char lease[256];
    json_t *doc;
    long acquire_status, seal_status, release_status, discard_status;
    bool ok;                   /* store()'s result so far */
    bool noop;                 /* empty lease id: everything exists */
    int *told;                 /* per src: 0 not stored, 1 exists (left out), 2 copied by this store */
} rtp_store;

/* The create: acquire(create) of every src object; false ends the store
 * (st->ok false; a lease already granted is discarded by rtp_store_end). */
static bool rtp_store_begin(rtp_kvs *c, rtp_store *st)
{
    st->ok = false;
    for (size_t i = 0; i < st->n; i++)
        st->told[i] = 0;
    json_t *o = json_object(), *k = json_array(), *m = json_array();
    for (size_t i = 0; i < st->n; i++) {
        json_array_append_new(k, json_string(st->src[i].key));
        json_array_append_new(m, json_pack("{s:I, s:s}", "size", (json_int_t)total_bytes(&st->src[i]), "layout",
                                           "rtp_llm_group_block_v1"));
    }
    json_object_set_new(o, "scope", json_string("create"));
    json_object_set_new(o, "object_keys", k);
    json_object_set_new(o, "object_metas", m);
    json_object_set_new(o, "term", json_integer(c->term));
    json_object_set_new(o, "request_id", json_string(st->trace));
    json_object_set_new(o, "ignore_existing", json_true());
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    http_resp r;
    bool sent = body && rtp_http(c, "acquire", body, &r);
    free(body);
    if (!sent)
        return false;
    st->acquire_status = r.status;
    if (r.status != 200) {
        note_status(c, "acquire CREATE", &r);
        free(r.body);
        return false;
    }
    st->doc = rtp_acquire_reply(c, &r, st->lease, sizeof st->lease);
    free(r.body);
    if (!st->doc)
        return false;
    if (!*st->lease) {
        json_decref(st->doc);
        st->doc = NULL;
        st->noop = st->ok = true;
        for (size_t i = 0; i < st->n; i++)
            st->told[i] = 1;
        return false;   /* nothing more to do: store() returns true */
    }
    if (!json_is_array(json_object_get(st->doc, "objects"))) {
        snprintf(c->why, sizeof c->why, "acquire CREATE: objects is not an array");
        return false;
    }
    st->ok = true;
    return true;
}

/* Copy every returned object (iovecs back to back); a null or invalid
 * entry, a key not asked for, or one past the mapping fails the store. */
static const char *rtp_buffer_key(const void *items, size_t i)
{
    return ((const rtp_buffer *)items)[i].key;
}

static void rtp_store_copy(rtp_kvs *c, rtp_store *st)
{
    json_t *objs = json_object_get(st->doc, "objects"), *it;
    str_index idx;
    size_t i;
    if (!str_index_init(&idx, st->n)) {
        snprintf(c->why, sizeof c->why, "out of memory");
        st->ok = false;
        return;
    }
    for (i = 0; i < st->n; i++)
        str_index_put(&idx, st->src, rtp_buffer_key, i);
    json_array_foreach(objs, i, it) {
        rtp_handle h;
        size_t j;
        if (!rtp_parse_handle(c, it, &h)) {
            char *t = json_dumps(it, JSON_COMPACT | JSON_ENCODE_ANY);
            snprintf(c->why, sizeof c->why, "create reply entry %zu invalid: %.600s", i, t ? t : "?");
            free(t);
            st->ok = false;
            break;
        }
        j = str_index_get(&idx, st->src, rtp_buffer_key, h.key);
        if (j == SIZE_MAX)
            j = st->n;
        size_t expected = j < st->n ? total_bytes(&st->src[j]) : 0;
        bool bad = j == st->n || h.offset > c->mmap_size || expected > c->mmap_size - h.offset;
        if (bad)
            snprintf(c->why, sizeof c->why, "create reply entry %zu (%.500s): %s", i, h.key,
                     j == st->n ? "a key not asked for" : "out of mmap range");
        free(h.key);
        if (bad) {
            st->ok = false;
            break;
        }
        size_t off = 0;
        for (size_t v = 0; v < st->src[j].niov; v++) {
            memcpy(c->base + h.offset + off, st->src[j].iov[v].addr, st->src[j].iov[v].size);
            off += st->src[j].iov[v].size;
        }
        st->told[j] = 2;
    }
    free(idx.slot);
}

/* seal (204) then release, or discard on any failure. */
static void rtp_store_end(rtp_kvs *c, rtp_store *st)
{
    if (st->ok && *st->lease) {
        json_t *o = json_pack("{s:s, s:s}", "lease_id", st->lease, "request_id", st->trace);
        char *body = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        http_resp r;
        bool sent = body && rtp_http(c, "seal", body, &r);
        free(body);
        st->seal_status = sent ? r.status : -1;
        st->ok = sent && r.status == 204;
        if (sent && r.status != 204)
            note_status(c, "seal", &r);
        if (sent)
            free(r.body);
    }
    if (st->ok)
        st->release_status = rtp_lease_call(c, "release", st->lease);
    else
        st->discard_status = rtp_lease_call(c, "discard", st->lease);
    if (!st->ok)
        for (size_t i = 0; i < st->n; i++)
            st->told[i] = 0;
    else
        for (size_t i = 0; i < st->n; i++)
            if (st->told[i] == 0)
                st->told[i] = 1;   /* left out of the reply: the server holds it */
    json_decref(st->doc);
    st->doc = NULL;
}

static void rtp_store_init(rtp_store *st, const rtp_buffer *src, size_t n, int *told, const char *trace)
{
    memset(st, 0, sizeof *st);
    st->src = src;
    st->n = n;
    st->told = told;
    snprintf(st->trace, sizeof st->trace, "kvs_store_%s", trace);
}

/* KVSClient::store, start to end. */
static bool rtp_store_all(rtp_kvs *c, rtp_store *st)
{
    if (!c->inited || st->n == 0)
        return true;
    if (rtp_store_begin(c, st))
        rtp_store_copy(c, st);
    if (st->noop)
        return true;
    rtp_store_end(c, st);
    return st->ok;
}

/* ====================================================================== */
/* Object bytes                                                            */
/* ====================================================================== */

/* The bytes of object `key` as writer `salt` writes them: one stream over
 * the object, cut into its iovecs. */
static uint64_t stream_seed(const char *key, uint32_t salt)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h * 0x9e3779b97f4a7c15ull + salt + 1;
}

static inline uint8_t stream_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return (uint8_t)*x;
}

static void fill_object(rtp_buffer *b, uint32_t salt)
{
    uint64_t x = stream_seed(b->key, salt);
    for (size_t i = 0; i < b->niov; i++)
        for (size_t j = 0; j < b->iov[i].size; j++)
            b->iov[i].addr[j] = stream_next(&x);
}

/* Bytes of b that differ from writer salt's object. */
static size_t wrong_bytes(const rtp_buffer *b, uint32_t salt)
{
    uint64_t x = stream_seed(b->key, salt);
    size_t wrong = 0;
    for (size_t i = 0; i < b->niov; i++)
        for (size_t j = 0; j < b->iov[i].size; j++)
            wrong += b->iov[i].addr[j] != stream_next(&x);
    return wrong;
}

/* A buffer of key with iovecs of the given sizes, each its own allocation
 * (an engine's layers are not contiguous). */
static void buffer_make(rtp_buffer *b, const char *key, const size_t *sizes, size_t niov)
{
    memset(b, 0, sizeof *b);
    b->key = strdup(key);
    ck_assert_ptr_nonnull(b->key);
    ck_assert_uint_le(niov, RTP_MAX_IOVS);
    b->niov = niov;
    for (size_t i = 0; i < niov; i++) {
        b->iov[i].size = sizes[i];
        b->iov[i].addr = malloc(sizes[i] ? sizes[i] : 1);
        ck_assert_ptr_nonnull(b->iov[i].addr);
        memset(b->iov[i].addr, 0, sizes[i]);
    }
}

static void buffers_free(rtp_buffer *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < b[i].niov; j++)
            free(b[i].iov[j].addr);
        free(b[i].key);
    }
    free(b);
}

/* ====================================================================== */
/* rtp-llm's KVSConnector: deployment ids, object keys, write/match/read   */
/* ====================================================================== */

#define RTP_MAX_GROUPS 4

/* An engine's model and cache layout: per group, the BlockInfos of one
 * block over the group's layers (their sizes). */
typedef struct rtp_model {
    const char *name;          /* model_name (sanitized into the id) */
    const char *ckpt;          /* CHECKPOINT_PATH */
    int tp_size;
    int groups;
    size_t iov[RTP_MAX_GROUPS][RTP_MAX_IOVS];
    size_t niov[RTP_MAX_GROUPS];
} rtp_model;

static void sanitize(const char *in, char *out, size_t len)
{
    snprintf(out, len, "%s", in);
    for (char *p = out; *p; p++)
        if (*p == '/' || *p == ' ' || *p == '\t' || *p == '\n')
            *p = '_';
}

/* buildDeploymentId, as each variant hashes it (FNV-1a 64, hex, no padding). */
static void deployment_id(const rtp_model *m, rtp_variant v, char *out, size_t len)
{
    char raw[1024], name[128];
    size_t block = 0;
    for (int g = 0; g < m->groups; g++)
        for (size_t i = 0; i < m->niov[g]; i++)
            block += m->iov[g][i];
    if (v == V85C)
        snprintf(raw, sizeof raw, "model=%s;ckpt=%s;dtype=bf16;seq=64;kernel_seq=64;tp=%d;fp8=0;int8=0;mla=0;"
                 "groups=%d;typed=0", m->name, m->ckpt, m->tp_size, m->groups);
    else
        snprintf(raw, sizeof raw, "model=%s;ckpt=%s;layers=%zu/%zu;dtype=bf16;seq=64;kernel_seq=64;kv_block=%zu;"
                 "kv_scale=0;block=%zu;kv_stride=%zu;scale_stride=0;group_seq=64;tp=%d;fp8=0;int8=0;mla=0;"
                 "groups=%d;typed=0", m->name, m->ckpt, m->niov[0] / 2, m->niov[0] / 2, block, block,
                 m->iov[0][0], m->tp_size, m->groups);
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    sanitize(*m->name ? m->name : "model", name, sizeof name);
    snprintf(out, len, "%s-%" PRIx64, name, h);
}

/* One rank's engine process: its client (own socket and mapping). */
typedef struct rtp_engine {
    rtp_kvs c;
    const rtp_model *m;
    int rank;
    char dep[192];
    uint32_t salt;             /* the bytes this engine computes */
} rtp_engine;

/* buildObjectKey (namespace rtp_llm, version 1). */
static void object_key(const rtp_engine *e, int64_t cache_key, int group, char *out, size_t len)
{
    snprintf(out, len, "rtp_llm/v1/%s/tp-%d/group-%d/block-%" PRId64, e->dep, e->rank, group, cache_key);
}

/* buildBlockObjects of keys[0..nb): one buffer per (block, group) that is
 * not a null block (null_groups[b] bit g). *n set. */
static rtp_buffer *block_objects(const rtp_engine *e, const int64_t *keys, size_t nb, const uint32_t *null_groups,
                                 size_t *n)
{
    rtp_buffer *b = calloc(nb * RTP_MAX_GROUPS + 1, sizeof *b);
    char key[512];
    ck_assert_ptr_nonnull(b);
    *n = 0;
    for (size_t i = 0; i < nb; i++)
        for (int g = 0; g < e->m->groups; g++) {
            if (null_groups && (null_groups[i] >> g & 1))
                continue;
            object_key(e, keys[i], g, key, sizeof key);
            buffer_make(&b[*n], key, e->m->iov[g], e->m->niov[g]);
            b[*n].block = (int)i;
            b[*n].group = g;
            (*n)++;
        }
    return b;
}

/* asyncWriteTask: store every full block's objects (the last key left out
 * unless the last block is aligned). told: per object, as rtp_store. */
static bool engine_write(rtp_engine *e, const int64_t *keys, size_t nkeys, bool last_aligned,
                         const uint32_t *null_groups, const char *trace, rtp_store *st)
{
    size_t nb = last_aligned ? nkeys : nkeys - 1, n;
    rtp_buffer *b = block_objects(e, keys, nb, null_groups, &n);
    int *told = calloc(n + 1, sizeof *told);
    ck_assert_ptr_nonnull(told);
    for (size_t i = 0; i < n; i++)
        fill_object(&b[i], e->salt);
    rtp_store_init(st, b, n, told, trace);
    bool ok = rtp_store_all(&e->c, st);
    buffers_free(b, n);
    st->src = NULL;
    return ok;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A match's result. */
typedef struct rtp_match {
    rtp_session s;
    bool acquired;
    size_t matched;            /* blocks from 0 */
    long early_release;        /* release status when nothing matched */
} rtp_match;

/* asyncMatchTask (prev_reuse 0): the last key dropped, the object keys of
 * the other blocks sorted and de-duplicated, acquire(read), the prefix of
 * blocks whose every object has a handle. */
static void engine_match(rtp_engine *e, const int64_t *keys, size_t nkeys, const char *trace, rtp_match *mt)
{
    size_t nb = nkeys > 0 ? nkeys - 1 : 0, n, u = 0;
    rtp_buffer *b = block_objects(e, keys, nb, NULL, &n);
    char **ok = calloc(n + 1, sizeof *ok), tr[160];
    ck_assert_ptr_nonnull(ok);
    memset(mt, 0, sizeof *mt);
    for (size_t i = 0; i < n; i++)
        ok[i] = b[i].key;
    qsort(ok, n, sizeof *ok, cmp_str);
    for (size_t i = 0; i < n; i++)
        if (u == 0 || strcmp(ok[u - 1], ok[i]) != 0)
            ok[u++] = ok[i];
    snprintf(tr, sizeof tr, "kvs_match_%s", trace);
    mt->acquired = rtp_acquire_read(&e->c, ok, u, tr, &mt->s);
    free(ok);
    if (mt->acquired) {
        size_t i = 0;
        for (size_t blk = 0; blk < nb; blk++) {
            bool hit = true;
            for (; i < n && b[i].block == (int)blk; i++)
                hit = hit && rtp_session_find(&mt->s, b[i].key) != NULL;
            if (!hit)
                break;
            mt->matched++;
        }
        if (mt->matched == 0 && *mt->s.lease_id) {
            mt->early_release = rtp_lease_call(&e->c, "release", mt->s.lease_id);
            mt->s.lease_id[0] = '\0';
        }
    }
    buffers_free(b, n);
}

/* asyncReadTask of blocks [start, start + num) of a match: fetch, load,
 * complete, release (always). Wrong bytes against the salt each object's
 * writer used (salt_of(key) ; NULL: the engine's own) go to *wrong. */
typedef uint32_t (*salt_fn)(const char *key, void *arg);

static bool engine_read(rtp_engine *e, const int64_t *keys, size_t start, size_t num, rtp_match *mt,
                        salt_fn salt_of, void *arg, size_t *wrong, long *release_status)
{
    size_t n;
    rtp_buffer *b = block_objects(e, keys + start, num, NULL, &n);
    *wrong = 0;
    bool ok = mt->matched >= start + num;
    if (!ok)
        snprintf(e->c.why, sizeof e->c.why, "read of blocks [%zu, %zu) beyond the %zu matched", start, start + num,
                 mt->matched);
    ok = ok && rtp_fetch(&e->c, &mt->s, b, n) && rtp_load(&e->c, &mt->s, b, n);
    *release_status = rtp_lease_call(&e->c, "release", mt->s.lease_id);
    rtp_session_free(&mt->s);
    for (size_t i = 0; ok && i < n; i++)
        *wrong += wrong_bytes(&b[i], salt_of ? salt_of(b[i].key, arg) : e->salt);
    buffers_free(b, n);
    return ok;
}

/* ====================================================================== */
/* The daemon                                                              */
/* ====================================================================== */

/* Default [kvs_server] options: kvs_env_boot sets only enabled, listen and
 * socket_path. 4 MiB slabs so that the harness's 64 MiB arena has a slab
 * for each of the dozen size classes below (the default 16 MiB slabs would
 * need four times the memory; a 4 MiB object fills one slab). */
static void env_start(kvs_env *e)
{
    kvs_env_init(e);
    kvs_env_boot(e, "memory.slab_bytes=4MiB\n");
}

#define NBLOCKS 6

/* Cache keys of a request: signed int64, as rtp-llm's are. */
static void request_keys(int64_t *keys, size_t n, int64_t seed)
{
    for (size_t i = 0; i < n; i++)
        keys[i] = (int64_t)((uint64_t)seed * 0x9e3779b97f4a7c15ull + i * 0x100000001b3ull);
}

/* ====================================================================== */
/* Ranks: TP 16 in one deployment, TP 8 and TP 2 beside it                 */
/* ====================================================================== */

typedef struct rank_job {
    rtp_engine e;
    const kvs_env *env;
    rtp_variant v;
    int64_t keys[NBLOCKS + 1];
    bool init_ok, store_ok, read_ok;
    size_t objects, written, matched, wrong;
    long release_status, read_release_status;
    char fail[900];
} rank_job;

static void *rank_write(void *arg)
{
    rank_job *j = arg;
    rtp_store st;
    j->init_ok = rtp_init(&j->e.c, j->v, j->env, 60);
    if (!j->init_ok) {
        snprintf(j->fail, sizeof j->fail, "%s tp-%d init: %.600s", j->e.dep, j->e.rank, j->e.c.why);
        return NULL;
    }
    j->store_ok = engine_write(&j->e, j->keys, NBLOCKS + 1, false, NULL, "ranks", &st);
    j->objects = st.n;
    for (size_t i = 0; i < st.n; i++)
        j->written += st.told[i] == 2;
    j->release_status = st.release_status;
    free(st.told);
    if (!j->store_ok)
        snprintf(j->fail, sizeof j->fail, "%s tp-%d store: %.600s", j->e.dep, j->e.rank, j->e.c.why);
    return NULL;
}

static void *rank_read(void *arg)
{
    rank_job *j = arg;
    rtp_match mt;
    if (!j->init_ok)
        return NULL;
    engine_match(&j->e, j->keys, NBLOCKS + 1, "ranks", &mt);
    j->matched = mt.matched;
    j->read_ok = mt.matched == NBLOCKS &&
                 engine_read(&j->e, j->keys, 0, NBLOCKS, &mt, NULL, NULL, &j->wrong, &j->read_release_status);
    if (!j->read_ok)
        snprintf(j->fail, sizeof j->fail, "%s tp-%d: matched %zu of %d blocks; %.600s", j->e.dep, j->e.rank,
                 j->matched, NBLOCKS, j->e.c.why);
    rtp_session_free(&mt.s);
    return NULL;
}

/* Group 0: 4 layers of K and V (8 KiB); group 1: 2 layers of K, V and a
 * 64-byte scale (2176 bytes). */
static const rtp_model M_TP16 = { "Qwen/Qwen2-72B-Instruct", "/models/qwen2-72b", 16, 2,
                                  { { 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024 },
                                    { 512, 512, 64, 512, 512, 64 } },
                                  { 8, 6 } };
static const rtp_model M_TP8 = { "deepseek-v2-lite", "/models/dsv2", 8, 1,
                                 { { 2048, 2048, 2048, 2048, 300 } }, { 5 } };
static const rtp_model M_TP2 = { "Llama 3 8B", "/models/llama3", 2, 2,
                                 { { 4096, 4096 }, { 333, 333, 333 } }, { 2, 3 } };

/* Every rank of a TP-16 deployment (under each client variant: two
 * deployment ids), of a TP-8 and of a TP-2 deployment, 42 engine processes
 * at once on one daemon with the default options: each stores its blocks,
 * then matches and reads them all back byte-exact. */
START_TEST(every_rank_of_three_tp_sizes_at_once)
{
    enum { NJOBS = 16 + 16 + 8 + 2 };
    static rank_job jobs[NJOBS];
    pthread_t th[NJOBS];
    kvs_env env;
    size_t nj = 0;
    struct { const rtp_model *m; rtp_variant v; } deps[4] = {
        { &M_TP16, V85C }, { &M_TP16, VDE10 }, { &M_TP8, VDE10 }, { &M_TP2, V85C } };

    env_start(&env);
    memset(jobs, 0, sizeof jobs);
    for (int d = 0; d < 4; d++)
        for (int r = 0; r < deps[d].m->tp_size; r++) {
            rank_job *j = &jobs[nj++];
            j->env = &env;
            j->v = deps[d].v;
            j->e.m = deps[d].m;
            j->e.rank = r;
            j->e.salt = (uint32_t)(d * 100 + r + 1);
            deployment_id(deps[d].m, deps[d].v, j->e.dep, sizeof j->e.dep);
            request_keys(j->keys, NBLOCKS + 1, 77);   /* the same prompt on every engine */
        }
    ck_assert_uint_eq(nj, NJOBS);
    ck_assert_str_ne(jobs[0].e.dep, jobs[16].e.dep);   /* the variants hash other fields */
    for (size_t i = 0; i < nj; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, rank_write, &jobs[i]), 0);
    for (size_t i = 0; i < nj; i++)
        pthread_join(th[i], NULL);
    for (size_t i = 0; i < nj; i++) {
        rank_job *j = &jobs[i];
        ck_assert_msg(j->init_ok && j->store_ok, "[%s] %s", VNAME[j->v], j->fail);
        ck_assert_msg(j->written == j->objects && j->objects == (size_t)NBLOCKS * j->e.m->groups,
                      "%s tp-%d: %zu of %zu objects given to write", j->e.dep, j->e.rank, j->written, j->objects);
        ck_assert_msg(j->release_status == 204, "%s tp-%d: release answered %ld", j->e.dep, j->e.rank,
                      j->release_status);
    }
    /* Read after every rank wrote: no rank's objects are another's. */
    for (size_t i = 0; i < nj; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, rank_read, &jobs[i]), 0);
    for (size_t i = 0; i < nj; i++)
        pthread_join(th[i], NULL);
    size_t wrong = 0;
    for (size_t i = 0; i < nj; i++) {
        rank_job *j = &jobs[i];
        ck_assert_msg(j->read_ok, "[%s] %s", VNAME[j->v], j->fail);
        ck_assert_msg(j->read_release_status == 204, "%s tp-%d: release of the read lease answered %ld", j->e.dep,
                      j->e.rank, j->read_release_status);
        wrong += j->wrong;
    }
    ck_assert_msg(wrong == 0, "%zu wrong bytes read back over %d engines", wrong, NJOBS);
    for (size_t i = 0; i < nj; i++)
        rtp_close(&jobs[i].e.c);
    KVH_STOP_DESTROY(&env.d);
}
END_TEST

/* ====================================================================== */
/* Opaque keys and objects of every size in one group                      */
/* ====================================================================== */

/* Each object's iovecs: 64 B, 8 KiB, 32 KiB, 4 MiB, and odd sizes. */
static const size_t SZ_64[] = { 64 }, SZ_8K[] = { 4096, 4096 }, SZ_32K[] = { 8192, 8192, 8192, 8192 },
                    SZ_4M[] = { 1u << 20, 1u << 20, 1u << 20, 1u << 20 }, SZ_ODD1[] = { 100, 7, 893 },
                    SZ_ODD2[] = { 4096, 1, 8248 }, SZ_ODD3[] = { 65536, 34467 }, SZ_ODD4[] = { 3, 5, 7, 11, 13 },
                    SZ_ODD5[] = { 300000, 1, 17 };
static const struct { const size_t *iov; size_t n; } SIZES[] = {
    { SZ_64, 1 }, { SZ_8K, 2 }, { SZ_32K, 4 }, { SZ_4M, 4 }, { SZ_ODD1, 3 },
    { SZ_ODD2, 3 }, { SZ_ODD3, 2 }, { SZ_ODD4, 5 }, { SZ_ODD5, 3 },
};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])
#define NOPAQUE 6

/* Key i of variant v: the first NSIZES are v1 keys of ONE (deployment,
 * rank, group), one object of each size; then keys that are not v1 ones
 * (another version, another client's, malformed v1, odd characters, the
 * longest allowed), each with one of the sizes (one of them 4 MiB). */
static void sized_key(rtp_variant v, size_t i, char *out, size_t len, size_t *size_index)
{
    static char longkey[4097];
    *size_index = i < NSIZES ? i : (i - NSIZES) * 2 % NSIZES;
    if (i < NSIZES) {
        snprintf(out, len, "rtp_llm/v1/sizes-%d-0123456789abcdef/tp-3/group-1/block-%zu", (int)v, 500 + i);
        return;
    }
    switch (i - NSIZES) {
    case 0: snprintf(out, len, "rtp_llm/v2/sizes-%d/tp-0/group-0/block-1", (int)v); break;
    case 1: snprintf(out, len, "my-cache/objects/%d/\xc3\xa4\xc3\xb6\xc3\xbc with spaces\t", (int)v); break;
    case 2: snprintf(out, len, "rtp_llm/v1/dep-%d/tp-x/group-0/block-12abc", (int)v); break;
    case 3: snprintf(out, len, "quote\"back\\slash/%d/{\"json\":1}", (int)v); break;
    case 4: snprintf(out, len, "%d", (int)v); break;
    default:
        memset(longkey, 'k', 4096);
        longkey[0] = (char)('0' + v);
        longkey[4096] = '\0';
        snprintf(out, len, "%s", longkey);
        break;
    }
}

static rtp_buffer *sized_objects(rtp_variant v, size_t *n)
{
    size_t total = NSIZES + NOPAQUE, si;
    rtp_buffer *b = calloc(total, sizeof *b);
    char key[4200];
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < total; i++) {
        sized_key(v, i, key, sizeof key, &si);
        buffer_make(&b[i], key, SIZES[si].iov, SIZES[si].n);
    }
    *n = total;
    return b;
}

/* Read every object of b back (keys sorted and de-duplicated, as the
 * connector sends them): the count of wrong bytes against salt; false
 * with why when the client's read fails. */
static bool read_objects(rtp_kvs *c, rtp_buffer *b, size_t n, uint32_t salt, size_t *wrong, long *rel)
{
    char **keys = calloc(n + 1, sizeof *keys);
    rtp_session s;
    ck_assert_ptr_nonnull(keys);
    for (size_t i = 0; i < n; i++) {
        keys[i] = b[i].key;
        for (size_t j = 0; j < b[i].niov; j++)
            memset(b[i].iov[j].addr, 0, b[i].iov[j].size);
    }
    qsort(keys, n, sizeof *keys, cmp_str);
    bool ok = rtp_acquire_read(c, keys, n, "kvs_read_sizes", &s);
    free(keys);
    *wrong = 0;
    *rel = 0;
    if (!ok)
        return false;
    ok = rtp_fetch(c, &s, b, n) && rtp_load(c, &s, b, n);
    *rel = rtp_lease_call(c, "release", s.lease_id);
    rtp_session_free(&s);
    for (size_t i = 0; ok && i < n; i++)
        *wrong += wrong_bytes(&b[i], salt);
    return ok;
}

/* One store() of objects of every size in one group, and of opaque keys,
 * per client variant: all are given to write, sealed, and read back
 * byte-exact; a second store() of the same keys with other bytes is told
 * they exist, and they still read back as the first writer's. */
START_TEST(opaque_keys_and_every_size_in_one_group)
{
    kvs_env env;
    rtp_kvs c[2];

    env_start(&env);
    for (int v = 0; v < 2; v++)
        ck_assert_msg(rtp_init(&c[v], (rtp_variant)v, &env, 60), "[%s] init: %s", VNAME[v], c[v].why);
    for (int v = 0; v < 2; v++) {
        size_t n, wrong;
        long rel;
        rtp_buffer *b = sized_objects((rtp_variant)v, &n);
        int *told = calloc(n, sizeof *told);
        rtp_store st;
        for (size_t i = 0; i < n; i++)
            fill_object(&b[i], 1);
        rtp_store_init(&st, b, n, told, "sizes");
        ck_assert_msg(rtp_store_all(&c[v], &st), "[%s] store of %zu objects of every size failed: %s", VNAME[v], n,
                      c[v].why);
        ck_assert_int_eq(st.release_status, 204);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(told[i] == 2, "[%s] %.200s (%zu bytes) was not given to write", VNAME[v], b[i].key,
                          total_bytes(&b[i]));
        ck_assert_msg(read_objects(&c[v], b, n, 1, &wrong, &rel), "[%s] read: %s", VNAME[v], c[v].why);
        ck_assert_msg(wrong == 0, "[%s] %zu wrong bytes read back", VNAME[v], wrong);
        ck_assert_int_eq(rel, 204);

        /* The same store again, with other bytes (a duplicate store returns true). */
        for (size_t i = 0; i < n; i++)
            fill_object(&b[i], 2);
        rtp_store_init(&st, b, n, told, "sizes-again");
        ck_assert_msg(rtp_store_all(&c[v], &st), "[%s] second store failed: %s", VNAME[v], c[v].why);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(told[i] == 1, "[%s] %.200s was given to write again", VNAME[v], b[i].key);
        ck_assert_msg(read_objects(&c[v], b, n, 1, &wrong, &rel), "[%s] read: %s", VNAME[v], c[v].why);
        ck_assert_msg(wrong == 0, "[%s] %zu wrong bytes after a second store", VNAME[v], wrong);
        free(told);
        buffers_free(b, n);
    }
    /* Each variant's objects read through the other variant's client too. */
    for (int v = 0; v < 2; v++) {
        size_t n, wrong;
        long rel;
        rtp_buffer *b = sized_objects((rtp_variant)v, &n);
        ck_assert_msg(read_objects(&c[1 - v], b, n, 1, &wrong, &rel), "[%s] read: %s", VNAME[1 - v], c[1 - v].why);
        ck_assert_msg(wrong == 0, "[%s] %zu wrong bytes", VNAME[1 - v], wrong);
        buffers_free(b, n);
    }
    for (int v = 0; v < 2; v++)
        rtp_close(&c[v]);
    KVH_STOP_DESTROY(&env.d);
}
END_TEST

/* ====================================================================== */
/* Match: the prefix of blocks whose every group is held                   */
/* ====================================================================== */

static const rtp_model M_3G = { "three-groups", "/models/3g", 1, 3,
                                { { 2048, 2048 }, { 1000, 24 }, { 4096, 4096, 77 } }, { 2, 2, 3 } };

/* Blocks 0-5 stored with block 3's group 2 a null block: a match of the
 * request finds blocks 0-2 (the prefix), reads them byte-exact; once the
 * missing object is stored (a second write: only it is given to write) the
 * match finds all 6 and a read of [3, 6) is byte-exact. Keys repeated in a
 * request are sent once; a request nobody stored matches nothing and its
 * lease is released at once. */
START_TEST(match_is_the_prefix_of_blocks_whose_every_group_is_held)
{
    kvs_env env;
    rtp_engine e = { .m = &M_3G, .rank = 0, .salt = 9 };
    rtp_variant v = (rtp_variant)_i;
    int64_t keys[NBLOCKS + 1], dup[5], none[4];
    uint32_t nulls[NBLOCKS] = { 0, 0, 0, 1u << 2, 0, 0 };
    rtp_store st;
    rtp_match mt;
    size_t wrong;
    long rel;

    env_start(&env);
    deployment_id(e.m, v, e.dep, sizeof e.dep);
    ck_assert_msg(rtp_init(&e.c, v, &env, 60), "[%s] init: %s", VNAME[v], e.c.why);
    request_keys(keys, NBLOCKS + 1, 31 + _i);
    ck_assert_msg(engine_write(&e, keys, NBLOCKS + 1, false, nulls, "prefix", &st), "[%s] store: %s", VNAME[v],
                  e.c.why);
    ck_assert_uint_eq(st.n, NBLOCKS * 3 - 1);
    free(st.told);
    engine_match(&e, keys, NBLOCKS + 1, "prefix", &mt);
    ck_assert_msg(mt.acquired, "[%s] match: %s", VNAME[v], e.c.why);
    ck_assert_msg(mt.matched == 3, "[%s] matched %zu blocks; block 3 lacks group 2, so 3", VNAME[v], mt.matched);
    ck_assert_msg(engine_read(&e, keys, 0, 3, &mt, NULL, NULL, &wrong, &rel), "[%s] read: %s", VNAME[v], e.c.why);
    ck_assert_msg(wrong == 0, "[%s] %zu wrong bytes in blocks 0-2", VNAME[v], wrong);
    ck_assert_int_eq(rel, 204);

    ck_assert_msg(engine_write(&e, keys, NBLOCKS + 1, false, NULL, "prefix-2", &st), "[%s] store: %s", VNAME[v],
                  e.c.why);
    for (size_t i = 0; i < st.n; i++)
        ck_assert_msg(st.told[i] == (i == 3 * 3 + 2 ? 2 : 1), "[%s] object %zu told %d", VNAME[v], i, st.told[i]);
    free(st.told);
    engine_match(&e, keys, NBLOCKS + 1, "prefix-2", &mt);
    ck_assert_msg(mt.acquired && mt.matched == NBLOCKS, "[%s] matched %zu of %d blocks: %s", VNAME[v], mt.matched,
                  NBLOCKS, e.c.why);
    ck_assert_msg(engine_read(&e, keys, 3, 3, &mt, NULL, NULL, &wrong, &rel), "[%s] read: %s", VNAME[v], e.c.why);
    ck_assert_msg(wrong == 0, "[%s] %zu wrong bytes in blocks 3-5", VNAME[v], wrong);
    ck_assert_int_eq(rel, 204);

    /* The connector de-duplicates: keys 0, 1, 0, 1 (and a tail) are 6 objects. */
    dup[0] = dup[2] = keys[0];
    dup[1] = dup[3] = keys[1];
    dup[4] = 12345;
    engine_match(&e, dup, 5, "dup", &mt);
    ck_assert_msg(mt.acquired && mt.matched == 4, "[%s] matched %zu of 4 repeated blocks: %s", VNAME[v], mt.matched,
                  e.c.why);
    ck_assert_msg(engine_read(&e, dup, 0, 4, &mt, NULL, NULL, &wrong, &rel), "[%s] read: %s", VNAME[v], e.c.why);
    ck_assert_uint_eq(wrong, 0);

    request_keys(none, 4, 999 + _i);
    engine_match(&e, none, 4, "none", &mt);
    ck_assert_msg(mt.acquired && mt.matched == 0, "[%s] matched %zu blocks nobody stored", VNAME[v], mt.matched);
    ck_assert_msg(mt.early_release == 0 || mt.early_release == 204, "[%s] release of an empty match answered %ld",
                  VNAME[v], mt.early_release);
    rtp_session_free(&mt.s);
    rtp_close(&e.c);
    KVH_STOP_DESTROY(&env.d);
}
END_TEST

/* ====================================================================== */
/* A long prompt: a create body over 1 MiB (libcurl sends Expect)          */
/* ====================================================================== */

#define LONG_BLOCKS 9000       /* ~125 bytes of create body each: over 1 MiB */

static const rtp_model M_LONG = { "long-prompt-model", "/models/long", 4, 1, { { 40, 24 } }, { 2 } };

/* One request of 9000 blocks (rank 2 of a TP-4 engine): its create body is
 * over 1 MiB, so libcurl sends "Expect: 100-continue"; every block is
 * stored, the match finds all of them and the read is byte-exact. */
START_TEST(a_long_prompt_over_one_mebibyte)
{
    kvs_env env;
    rtp_engine e = { .m = &M_LONG, .rank = 2, .salt = 17 };
    rtp_variant v = (rtp_variant)_i;
    int64_t *keys = calloc(LONG_BLOCKS + 1, sizeof *keys);
    rtp_store st;
    rtp_match mt;
    size_t wrong, written = 0;
    long rel;

    ck_assert_ptr_nonnull(keys);
    env_start(&env);
    deployment_id(e.m, v, e.dep, sizeof e.dep);
    ck_assert_msg(rtp_init(&e.c, v, &env, 60), "[%s] init: %s", VNAME[v], e.c.why);
    request_keys(keys, LONG_BLOCKS + 1, 8080 + _i);
    ck_assert_msg(engine_write(&e, keys, LONG_BLOCKS + 1, false, NULL, "long", &st), "[%s] store: %s", VNAME[v],
                  e.c.why);
    for (size_t i = 0; i < st.n; i++)
        written += st.told[i] == 2;
    free(st.told);
    ck_assert_msg(written == LONG_BLOCKS, "[%s] %zu of %d objects given to write", VNAME[v], written, LONG_BLOCKS);
    ck_assert_int_eq(st.release_status, 204);
    engine_match(&e, keys, LONG_BLOCKS + 1, "long", &mt);
    ck_assert_msg(mt.acquired && mt.matched == LONG_BLOCKS, "[%s] matched %zu of %d blocks: %s", VNAME[v],
                  mt.matched, LONG_BLOCKS, e.c.why);
    ck_assert_msg(engine_read(&e, keys, 0, LONG_BLOCKS, &mt, NULL, NULL, &wrong, &rel), "[%s] read: %s", VNAME[v],
                  e.c.why);
    ck_assert_msg(wrong == 0, "[%s] %zu wrong bytes", VNAME[v], wrong);
    ck_assert_int_eq(rel, 204);
    free(keys);
    rtp_close(&e.c);
    KVH_STOP_DESTROY(&env.d);
}
END_TEST

/* ====================================================================== */
/* A read lease holds its objects from the match to the read               */
/* ====================================================================== */

#define FILL_ROUNDS 24         /* 24 x 500 blocks of 8 KiB + 1 KiB: 105 MiB through a 64 MiB arena */
#define FILL_BLOCKS 500

static const rtp_model M_FILL = { "fill-model", "/models/fill", 2, 2, { { 4096, 4096 }, { 999, 1 } }, { 2, 2 } };

/* The match's read lease lives until the read (85c02327f: fetch, load,
 * complete; de10de826: load). Meanwhile other requests store more than the
 * host tier holds, so older objects are evicted: the matched ones are not,
 * and the read is byte-exact. */
START_TEST(a_read_lease_holds_its_objects_through_eviction)
{
    kvs_env env;
    rtp_variant v = (rtp_variant)_i;
    rtp_engine e = { .m = &M_3G, .rank = 0, .salt = 5 }, f = { .m = &M_FILL, .rank = 1, .salt = 6 };
    int64_t keys[NBLOCKS + 1], *fk = calloc(FILL_ROUNDS * (FILL_BLOCKS + 1), sizeof *fk);
    rtp_store st;
    rtp_match mt, first;
    size_t wrong;
    long rel;

    ck_assert_ptr_nonnull(fk);
    env_start(&env);
    deployment_id(e.m, v, e.dep, sizeof e.dep);
    deployment_id(f.m, v, f.dep, sizeof f.dep);
    ck_assert_msg(rtp_init(&e.c, v, &env, 60), "[%s] init: %s", VNAME[v], e.c.why);
    ck_assert_msg(rtp_init(&f.c, v, &env, 60), "[%s] init: %s", VNAME[v], f.c.why);
    request_keys(keys, NBLOCKS + 1, 1);
    ck_assert_msg(engine_write(&e, keys, NBLOCKS + 1, false, NULL, "pin", &st), "[%s] store: %s", VNAME[v],
                  e.c.why);
    free(st.told);
    engine_match(&e, keys, NBLOCKS + 1, "pin", &mt);
    ck_assert_msg(mt.acquired && mt.matched == NBLOCKS, "[%s] matched %zu: %s", VNAME[v], mt.matched, e.c.why);
    for (int r = 0; r < FILL_ROUNDS; r++) {
        int64_t *k = fk + r * (FILL_BLOCKS + 1);
        request_keys(k, FILL_BLOCKS + 1, 100 + r);
        ck_assert_msg(engine_write(&f, k, FILL_BLOCKS + 1, false, NULL, "fill", &st), "[%s] fill %d: %s", VNAME[v],
                      r, f.c.why);
        free(st.told);
    }
    engine_match(&f, fk, FILL_BLOCKS + 1, "first-fill", &first);
    ck_assert_msg(first.acquired && first.matched < FILL_BLOCKS,
                  "[%s] the first fill's %zu blocks are all still held: nothing was evicted (test setup)", VNAME[v],
                  first.matched);
    if (*first.s.lease_id)
        rtp_lease_call(&f.c, "release", first.s.lease_id);
    rtp_session_free(&first.s);
    ck_assert_msg(engine_read(&e, keys, 0, NBLOCKS, &mt, NULL, NULL, &wrong, &rel), "[%s] read: %s", VNAME[v],
                  e.c.why);
    ck_assert_msg(wrong == 0, "[%s] %zu wrong bytes in objects under a read lease", VNAME[v], wrong);
    ck_assert_int_eq(rel, 204);
    free(fk);
    rtp_close(&e.c);
    rtp_close(&f.c);
    KVH_STOP_DESTROY(&env.d);
}
END_TEST

/* ====================================================================== */
/* A create racing an unsealed create of the same keys                     */
/* ====================================================================== */

#define RACE_SHARED 4          /* blocks both writers store */
#define RACE_BLOCKS 6          /* writer B's: the shared ones and 2 more */

static const rtp_model M_RACE = { "race-model", "/models/race", 1, 2, { { 4096, 4096 }, { 999, 1 } }, { 2, 2 } };

/* Writer B: the connector's write of RACE_BLOCKS blocks, on its own thread. */
typedef struct writer {
    rtp_engine *e;
    const int64_t *keys;
    rtp_store st;
    bool ok;
    volatile int done;
} writer;

static void *writer_run(void *arg)
{
    writer *w = arg;
    w->ok = engine_write(w->e, w->keys, RACE_BLOCKS, true, NULL, "race-b", &w->st);
    w->done = 1;
    return NULL;
}

/* Until w is answered, at most ms. */
static void wait_done(writer *w, unsigned ms)
{
    for (unsigned i = 0; i < ms / 10 && !w->done; i++)
        usleep(10 * 1000);
}

/* Writer A's store, stopped after its create: its objects (RACE_SHARED
 * blocks). The create must have given A every object to write. */
typedef struct first_writer {
    rtp_buffer *b;
    size_t n;
    int told[RACE_SHARED * RTP_MAX_GROUPS];
    rtp_store st;
} first_writer;

static void first_writer_begin(rtp_engine *a, const int64_t *keys, first_writer *fw)
{
    fw->b = block_objects(a, keys, RACE_SHARED, NULL, &fw->n);
    for (size_t i = 0; i < fw->n; i++)
        fill_object(&fw->b[i], a->salt);
    rtp_store_init(&fw->st, fw->b, fw->n, fw->told, "race-a");
    ck_assert_msg(rtp_store_begin(&a->c, &fw->st), "writer A's create: %s", a->c.why);
    ck_assert_uint_eq(json_array_size(json_object_get(fw->st.doc, "objects")), fw->n);
}

typedef struct race_truth {
    const rtp_engine *a, *b;
    const writer *w;
} race_truth;

/* Whose bytes object key should hold: B's if B was given it to write, else
 * A's (B was told it exists: A sealed it). */
static uint32_t race_salt(const char *key, void *arg)
{
    const race_truth *t = arg;
    char k[512];
    for (int64_t blk = 0; blk < RACE_BLOCKS; blk++)
        for (int g = 0; g < M_RACE.groups; g++) {
            object_key(t->b, t->w->keys[blk], g, k, sizeof k);
            if (strcmp(k, key) == 0)
                return t->w->st.told[blk * M_RACE.groups + g] == 2 ? t->b->salt : t->a->salt;
        }
    return 0;
}

/* Every object B was told is stored reads back byte-exact through a third
 * engine (the other variant): the match finds all RACE_BLOCKS blocks. */
static void check_told_truth(const kvs_env *env, rtp_engine *a, rtp_engine *b, writer *w, const char *what)
{
    rtp_engine r = { .m = &M_RACE, .rank = 0 };
    race_truth t = { a, b, w };
    rtp_match mt;
    size_t wrong = 0;
    long rel;
    snprintf(r.dep, sizeof r.dep, "%s", b->dep);
    ck_assert_msg(rtp_init(&r.c, b->c.v == V85C ? VDE10 : V85C, env, 60), "reader init: %s", r.c.why);
    engine_match(&r, w->keys, RACE_BLOCKS + 1, "race-check", &mt);
    ck_assert_msg(mt.acquired && mt.matched == RACE_BLOCKS,
                  "%s: writer B's store returned true, yet a match finds %zu of its %d blocks (%s)", what,
                  mt.matched, RACE_BLOCKS, r.c.why);
    ck_assert_msg(engine_read(&r, w->keys, 0, RACE_BLOCKS, &mt, race_salt, &t, &wrong, &rel), "%s: read: %s", what,
                  r.c.why);
    ck_assert_msg(wrong == 0, "%s: %zu wrong bytes in what writer B was told is stored", what, wrong);
    ck_assert_int_eq(rel, 204);
    rtp_close(&r.c);
}

/* A match of objects under an open, unsealed create finds none of them
 * (another request of the same prompt, while the first one writes). */
static void unsealed_is_invisible(rtp_engine *e, const int64_t *keys)
{
    rtp_match mt;
    engine_match(e, keys, RACE_SHARED + 1, "race-unsealed", &mt);
    ck_assert_msg(mt.acquired, "[%s] match: %s", VNAME[e->c.v], e->c.why);
    ck_assert_msg(mt.matched == 0 && mt.s.n == 0, "[%s] a match finds %zu blocks (%zu handles) of a create not "
                  "sealed yet", VNAME[e->c.v], mt.matched, mt.s.n);
    ck_assert_msg(mt.early_release == 0 || mt.early_release == 204, "[%s] release of an empty match answered %ld",
                  VNAME[e->c.v], mt.early_release);
    rtp_session_free(&mt.s);
}

/* A (one variant) has created the keys and not sealed; B (the other
 * variant) stores them and 2 more blocks. B is not told they exist while
 * A's lease is open: whatever B is told is true once B's store returns.
 * A seals: B is told A's objects exist (A's bytes) and writes the rest.
 * A discards instead (its store failed): B writes them all. */
static void race_with_live_writer(rtp_variant vb, bool a_seals)
{
    kvs_env env;
    rtp_engine a = { .m = &M_RACE, .rank = 0, .salt = 0xA }, b = { .m = &M_RACE, .rank = 0, .salt = 0xB };
    int64_t keys[RACE_BLOCKS + 1];
    first_writer fw;
    writer w = { .e = &b, .keys = keys };
    pthread_t th;
    const char *what = a_seals ? "A seals" : "A discards";

    env_start(&env);
    deployment_id(&M_RACE, vb, b.dep, sizeof b.dep);
    snprintf(a.dep, sizeof a.dep, "%s", b.dep);   /* the same deployment: other builds of one model */
    ck_assert_msg(rtp_init(&a.c, vb == V85C ? VDE10 : V85C, &env, 60), "A init: %s", a.c.why);
    ck_assert_msg(rtp_init(&b.c, vb, &env, 60), "B init: %s", b.c.why);
    request_keys(keys, RACE_BLOCKS + 1, 4242);
    first_writer_begin(&a, keys, &fw);
    unsealed_is_invisible(&b, keys);

    ck_assert_int_eq(pthread_create(&th, NULL, writer_run, &w), 0);
    wait_done(&w, 300);
    if (w.done) {
        /* B was answered while A's create is open and unsealed. */
        pthread_join(th, NULL);
        ck_assert_msg(!w.ok, "%s [B %s]: B's store returned true while A's create of the same objects is unsealed"
                      " (B told %d/%d/%d/%d for A's objects)", what, VNAME[vb], w.st.told[0], w.st.told[1],
                      w.st.told[2], w.st.told[3]);
    }
    if (a_seals)
        rtp_store_copy(&a.c, &fw.st);
    else
        fw.st.ok = false;   /* A's copy failed: store() discards */
    rtp_store_end(&a.c, &fw.st);
    ck_assert_msg(fw.st.ok == a_seals, "A's store: %s", a.c.why);
    if (a_seals)
        ck_assert_int_eq(fw.st.release_status, 204);
    else
        ck_assert_int_eq(fw.st.discard_status, 204);
    if (!w.done)
        pthread_join(th, NULL);
    ck_assert_msg(w.ok, "%s [B %s]: B's store failed: %s", what, VNAME[vb], b.c.why);
    ck_assert_int_eq(w.st.release_status, 204);
    for (size_t i = 0; i < w.st.n; i++) {
        int want = i < RACE_SHARED * 2 && a_seals ? 1 : 2;
        ck_assert_msg(w.st.told[i] == want, "%s [B %s]: object %zu (block %zu) told %d, expected %d", what,
                      VNAME[vb], i, i / 2, w.st.told[i], want);
    }
    check_told_truth(&env, &a, &b, &w, what);
    free(w.st.told);
    buffers_free(fw.b, fw.n);
    rtp_close(&a.c);
    rtp_close(&b.c);
    KVH_STOP_DESTROY(&env.d);
}

START_TEST(create_racing_an_unsealed_create_that_seals)
{
    race_with_live_writer((rtp_variant)_i, true);
}
END_TEST

START_TEST(create_racing_an_unsealed_create_that_discards)
{
    race_with_live_writer((rtp_variant)_i, false);
}
END_TEST

/* A creates the keys with KVS_LEASE_TERM_SEC=1, writes half of one object
 * and dies (its socket and mapping closed, nothing sealed). B's store of
 * the keys (default term) is not told they exist: once A's lease ends at
 * its term, within B's wait, B is given every object and reads back its
 * own bytes. */
START_TEST(create_racing_a_writer_that_died)
{
    kvs_env env;
    rtp_variant vb = (rtp_variant)_i;
    rtp_engine a = { .m = &M_RACE, .rank = 0, .salt = 0xA }, b = { .m = &M_RACE, .rank = 0, .salt = 0xB };
    int64_t keys[RACE_BLOCKS + 1];
    first_writer fw;
    writer w = { .e = &b, .keys = keys };

    env_start(&env);
    deployment_id(&M_RACE, vb, b.dep, sizeof b.dep);
    snprintf(a.dep, sizeof a.dep, "%s", b.dep);
    ck_assert_msg(rtp_init(&a.c, vb == V85C ? VDE10 : V85C, &env, 1), "A init: %s", a.c.why);
    ck_assert_msg(rtp_init(&b.c, vb, &env, 60), "B init: %s", b.c.why);
    request_keys(keys, RACE_BLOCKS + 1, 5151);
    first_writer_begin(&a, keys, &fw);
    rtp_handle h;
    ck_assert(rtp_parse_handle(&a.c, json_array_get(json_object_get(fw.st.doc, "objects"), 0), &h));
    memset(a.c.base + h.offset, 0xEE, h.bytes / 2);   /* half written */
    free(h.key);
    json_decref(fw.st.doc);
    rtp_close(&a.c);                        /* A dies */

    writer_run(&w);
    if (!w.ok) {
        /* Told nothing (B's wait ended first): the next request stores again. */
        ck_assert_msg(w.st.acquire_status == 503, "[B %s] store failed: %s", VNAME[vb], b.c.why);
        free(w.st.told);
        writer_run(&w);
    }
    ck_assert_msg(w.ok, "[B %s] store after A died failed: %s", VNAME[vb], b.c.why);
    for (size_t i = 0; i < w.st.n; i++)
        ck_assert_msg(w.st.told[i] == 2, "[B %s] object %zu of a writer that died unsealed: told %d, not given to"
                      " write", VNAME[vb], i, w.st.told[i]);
    check_told_truth(&env, &a, &b, &w, "A died");
    free(w.st.told);
    buffers_free(fw.b, fw.n);
    rtp_close(&b.c);
    KVH_STOP_DESTROY(&env.d);
}
END_TEST

/* As above, but A's lease has the default term (60 s), longer than B's
 * wait: B's store (each variant's, at once) fails, so B is told nothing is
 * stored, and no reader finds the objects A never sealed. */
START_TEST(create_racing_a_dead_writer_within_its_term_stores_nothing)
{
    kvs_env env;
    rtp_engine a[2], b[2];
    int64_t keys[2][RACE_BLOCKS + 1];
    first_writer fw[2];
    writer w[2];
    pthread_t th[2];

    env_start(&env);
    for (int v = 0; v < 2; v++) {
        a[v] = (rtp_engine){ .m = &M_RACE, .rank = 0, .salt = 0xA };
        b[v] = (rtp_engine){ .m = &M_RACE, .rank = 0, .salt = 0xB };
        deployment_id(&M_RACE, (rtp_variant)v, b[v].dep, sizeof b[v].dep);
        snprintf(a[v].dep, sizeof a[v].dep, "%s", b[v].dep);
        ck_assert_msg(rtp_init(&a[v].c, (rtp_variant)(1 - v), &env, 60), "A init: %s", a[v].c.why);
        ck_assert_msg(rtp_init(&b[v].c, (rtp_variant)v, &env, 60), "B init: %s", b[v].c.why);
        request_keys(keys[v], RACE_BLOCKS + 1, 6161 + v);
        first_writer_begin(&a[v], keys[v], &fw[v]);
        json_decref(fw[v].st.doc);
        rtp_close(&a[v].c);   /* A dies, its lease open for 60 s */
        w[v] = (writer){ .e = &b[v], .keys = keys[v] };
    }
    for (int v = 0; v < 2; v++)
        ck_assert_int_eq(pthread_create(&th[v], NULL, writer_run, &w[v]), 0);
    for (int v = 0; v < 2; v++)
        pthread_join(th[v], NULL);
    for (int v = 0; v < 2; v++) {
        ck_assert_msg(!w[v].ok, "[B %s] store returned true while a dead writer's create holds its objects", VNAME[v]);
        for (size_t i = 0; i < w[v].st.n; i++)
            ck_assert_int_eq(w[v].st.told[i], 0);
        rtp_match mt;
        engine_match(&b[v], keys[v], RACE_SHARED + 1, "race-dead", &mt);
        ck_assert_msg(mt.acquired && mt.matched == 0, "[%s] a match finds %zu blocks nobody sealed", VNAME[v],
                      mt.matched);
        rtp_session_free(&mt.s);
        free(w[v].st.told);
        buffers_free(fw[v].b, fw[v].n);
        rtp_close(&b[v].c);
    }
    KVH_STOP_DESTROY(&env.d);
}
END_TEST

/* ====================================================================== */
/* KNOWN DEFECT (reported to the lead, not fixed here: the fix is in the  */
/* create path of /acquire): the same key created at another size        */
/* ====================================================================== */

/* Writer X (85c02327f) stores a v1 key and an opaque key, 1000 bytes each;
 * writer Y (each variant) then stores the same two keys at 2000 bytes
 * (85c02327f's deployment id does not hash the object size, so two engines
 * of one model name and TP size but another cache layout share keys; any
 * other client may reuse a key at another size). X's objects must still
 * read back byte-exact, and Y's store must fail: one key is one object,
 * which keeps its size (409 naming the key), so Y is never told stored.
 *
 * Before the fix both of Y's creates were given a fresh object of 2000
 * bytes in the per-size namespace, sealed (204): store() returned true. A
 * read (no sizes in it) answered the 1000-byte object of X: 85c02327f
 * copied its 2000 bytes from there (1998 wrong bytes per object: X's object
 * and whatever lies after it), de10de826 failed the load ("object too
 * small": an object it was told is stored was never readable). */
START_TEST(a_key_held_at_one_size_is_not_created_at_another)
{
    kvs_env env;
    rtp_kvs x, y;
    rtp_variant vy = (rtp_variant)_i;
    static const size_t small[] = { 600, 400 }, large[] = { 1000, 1000 };
    const char *keys[2] = { "rtp_llm/v1/Qwen2-7B-1f2e3d4c5b6a7988/tp-0/group-0/block-4242", "shared/opaque/key-1" };
    rtp_buffer *bx = calloc(2, sizeof *bx), *by = calloc(2, sizeof *by);
    int tx[2], ty[2];
    rtp_store st;
    size_t wrong;
    long rel;

    ck_assert(bx && by);
    env_start(&env);
    ck_assert_msg(rtp_init(&x, V85C, &env, 60), "X init: %s", x.why);
    ck_assert_msg(rtp_init(&y, vy, &env, 60), "Y init: %s", y.why);
    for (int i = 0; i < 2; i++) {
        buffer_make(&bx[i], keys[i], small, 2);
        buffer_make(&by[i], keys[i], large, 2);
        fill_object(&bx[i], 0x1);
        fill_object(&by[i], 0x2);
    }
    rtp_store_init(&st, bx, 2, tx, "x");
    ck_assert_msg(rtp_store_all(&x, &st) && tx[0] == 2 && tx[1] == 2, "X's store: %s", x.why);
    rtp_store_init(&st, by, 2, ty, "y");
    bool y_ok = rtp_store_all(&y, &st);

    ck_assert_msg(read_objects(&x, bx, 2, 0x1, &wrong, &rel), "X's read: %s", x.why);
    ck_assert_msg(wrong == 0, "X's objects: %zu wrong bytes after Y's store at another size", wrong);
    ck_assert_msg(!y_ok, "[Y %s] store() of X's keys at another size returned true", VNAME[vy]);
    if (y_ok) {
        for (int i = 0; i < 2; i++) {
            bool ok = read_objects(&y, &by[i], 1, ty[i] == 2 ? 0x2 : 0x1, &wrong, &rel);
            ck_assert_msg(ok && wrong == 0,
                          "[Y %s] store() of %s at 2000 bytes returned true (told %s; X stored it at 1000), "
                          "but Y's read gives %s: %zu wrong bytes of 2000 (%s)", VNAME[vy], keys[i],
                          ty[i] == 2 ? "given to write, sealed 204" : "exists", ok ? "other bytes" : "a failed load",
                          wrong, ok ? "" : y.why);
        }
    }
    buffers_free(bx, 2);
    buffers_free(by, 2);
    rtp_close(&x);
    rtp_close(&y);
    KVH_STOP_DESTROY(&env.d);
}
END_TEST

static Suite *kvs_rtpllm_suite(void)
{
    Suite *s = suite_create("kvs_rtpllm");
    TCase *tc = tcase_create("kvs_rtpllm");
    tcase_set_timeout(tc, 45);
    tcase_add_test(tc, every_rank_of_three_tp_sizes_at_once);
    tcase_add_test(tc, opaque_keys_and_every_size_in_one_group);
    tcase_add_loop_test(tc, match_is_the_prefix_of_blocks_whose_every_group_is_held, 0, 2);
    tcase_add_loop_test(tc, a_long_prompt_over_one_mebibyte, 0, 2);
    tcase_add_loop_test(tc, a_read_lease_holds_its_objects_through_eviction, 0, 2);
    tcase_add_loop_test(tc, create_racing_an_unsealed_create_that_seals, 0, 2);
    tcase_add_loop_test(tc, create_racing_an_unsealed_create_that_discards, 0, 2);
    tcase_add_loop_test(tc, create_racing_a_writer_that_died, 0, 2);
    tcase_add_test(tc, create_racing_a_dead_writer_within_its_term_stores_nothing);
    tcase_add_loop_test(tc, a_key_held_at_one_size_is_not_created_at_another, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    SRunner *sr = srunner_create(kvs_rtpllm_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    curl_global_cleanup();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
