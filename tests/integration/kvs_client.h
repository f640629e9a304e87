/* kvs_client: a small client of rtp-llm's KVS protocol for the tests and the
 * benchmark of the KVS front end (issue 18), written the way rtp-llm's own
 * KVSClient (PR #1154) talks: a fresh libcurl easy handle (a new TCP
 * connection) per HTTP call, exact statuses (200 for /health and /acquire,
 * 204 for the rest), and the vineyard handshake on the data plane, mapping
 * the fd it hands over once for the client's life. One client may be shared
 * by threads (as the engine's thread pool shares one), each call on its own
 * curl handle.
 *
 * Header-only (static inline: the test and benchmark rules link harness.c and
 * proc.c only). */
#ifndef KVNODE_TESTS_KVS_CLIENT_H
#define KVNODE_TESTS_KVS_CLIENT_H

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct kvsc {
    char url[256];
    int fd;                    /* data-plane socket, kept open */
    uint8_t *base;             /* the mapping */
    uint64_t size;
} kvsc;

/* One HTTP exchange. */
typedef struct kvsc_reply {
    long status;
    json_t *body;              /* parsed JSON (NULL: none or not JSON) */
    bool continued;            /* the server answered "100 Continue" */
    double seconds;            /* the whole transfer */
} kvsc_reply;

static inline void kvsc_reply_free(kvsc_reply *r)
{
    json_decref(r->body);
    r->body = NULL;
}

struct kvsc_buf { char *p; size_t n; };

static inline size_t kvsc_write_cb(char *ptr, size_t sz, size_t nm, void *arg)
{
    struct kvsc_buf *b = arg;
    char *q = realloc(b->p, b->n + sz * nm + 1);
    if (!q)
        return 0;
    memcpy(q + b->n, ptr, sz * nm);
    b->p = q;
    b->n += sz * nm;
    b->p[b->n] = '\0';
    return sz * nm;
}

static inline size_t kvsc_header_cb(char *ptr, size_t sz, size_t nm, void *arg)
{
    kvsc_reply *r = arg;
    if (sz * nm >= 12 && strncmp(ptr, "HTTP/1.1 100", 12) == 0)
        r->continued = true;
    return sz * nm;
}

/* route: "health" (GET) or a POST route with body (JSON text). */
static inline int kvsc_call(const char *url, const char *route, const char *body, kvsc_reply *r)
{
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = NULL;
    struct kvsc_buf b = { NULL, 0 };
    char full[320];
    memset(r, 0, sizeof *r);
    if (!h)
        return -1;
    /* "unix:PATH": HTTP over that unix socket ([kvs_server] listen = unix:PATH). */
    if (strncmp(url, "unix:", 5) == 0) {
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, url + 5);
        snprintf(full, sizeof full, "http://localhost/%s", route);
    } else {
        snprintf(full, sizeof full, "%s/%s", url, route);
    }
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 12000L);   /* rtp-llm's kvs_timeout_ms */
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kvsc_write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, kvsc_header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    if (body) {
        hdr = curl_slist_append(hdr, "Content-Type: application/json");
        hdr = curl_slist_append(hdr, "Accept: application/json");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    }
    CURLcode cc = curl_easy_perform(h);
    if (cc == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
        curl_easy_getinfo(h, CURLINFO_TOTAL_TIME, &r->seconds);
        if (b.p)
            r->body = json_loads(b.p, 0, NULL);
    }
    free(b.p);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return cc == CURLE_OK ? 0 : -1;
}

static inline int kvsc_send_frame(int fd, const char *json)
{
    uint64_t len = strlen(json);
    uint8_t hdr[8];
    for (int i = 0; i < 8; i++)
        hdr[i] = (uint8_t)(len >> (8 * i));
    if (send(fd, hdr, 8, MSG_NOSIGNAL) != 8 || send(fd, json, len, MSG_NOSIGNAL) != (ssize_t)len)
        return -1;
    return 0;
}

static inline int kvsc_recv_all(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* A framed JSON reply (caller frees), NULL on error. */
static inline json_t *kvsc_recv_frame(int fd)
{
    uint8_t hdr[8];
    uint64_t len = 0;
    if (kvsc_recv_all(fd, hdr, 8) < 0)
        return NULL;
    for (int i = 7; i >= 0; i--)
        len = (len << 8) | hdr[i];
    if (len == 0 || len > (16u << 20))
        return NULL;
    char *b = malloc(len + 1);
    if (!b || kvsc_recv_all(fd, b, len) < 0) {
        free(b);
        return NULL;
    }
    json_t *j = json_loadb(b, len, 0, NULL);
    free(b);
    return j;
}

/* Connect both planes as rtp-llm's initMmap does. 0, or -1 with why set. */
static inline int kvsc_open(kvsc *c, const char *url, const char *sock, char *why, size_t whylen)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    memset(c, 0, sizeof *c);
    c->fd = -1;
    if (strlen(url) >= sizeof c->url) {
        snprintf(why, whylen, "url too long");
        return -1;
    }
    memcpy(c->url, url, strlen(url) + 1);
    if (strlen(sock) >= sizeof sa.sun_path) {
        snprintf(why, whylen, "socket path too long");
        return -1;
    }
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        snprintf(why, whylen, "connect %.100s: %s", sock, strerror(errno));
        return -1;
    }
    json_t *j;
    if (kvsc_send_frame(c->fd, "{\"type\":\"register_request\",\"version\":\"0.0.0\",\"store_type\":0,"
                               "\"session_id\":0,\"username\":\"\",\"password\":\"\"}") < 0 ||
        !(j = kvsc_recv_frame(c->fd))) {
        snprintf(why, whylen, "register failed");
        return -1;
    }
    char *text = json_dumps(j, JSON_COMPACT);
    bool ok = text && strstr(text, "register_reply");
    free(text);
    json_decref(j);
    if (!ok || kvsc_send_frame(c->fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}") < 0 ||
        !(j = kvsc_recv_frame(c->fd))) {
        snprintf(why, whylen, "fd request failed");
        return -1;
    }
    json_t *size = json_object_get(j, "size");
    if (!json_is_integer(size) || json_integer_value(size) <= 0) {
        text = json_dumps(j, JSON_COMPACT);
        snprintf(why, whylen, "fd reply without a size: %s", text ? text : "?");
        free(text);
        json_decref(j);
        return -1;
    }
    c->size = (uint64_t)json_integer_value(size);
    json_decref(j);
    char byte;
    struct iovec iov = { &byte, 1 };
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } ctl;
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf };
    if (recvmsg(c->fd, &mh, 0) != 1) {
        snprintf(why, whylen, "no fd message: %s", strerror(errno));
        return -1;
    }
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    if (!cm || cm->cmsg_type != SCM_RIGHTS) {
        snprintf(why, whylen, "the fd message carries no fd");
        return -1;
    }
    int mfd;
    memcpy(&mfd, CMSG_DATA(cm), sizeof mfd);
    c->base = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    close(mfd);
    if (c->base == MAP_FAILED) {
        c->base = NULL;
        snprintf(why, whylen, "mmap: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static inline void kvsc_close(kvsc *c)
{
    if (c->base)
        munmap(c->base, c->size);
    if (c->fd >= 0)
        close(c->fd);
    c->base = NULL;
    c->fd = -1;
}

/* An acquire body: scope "read" or "create", n keys, create sizes of size. */
static inline char *kvsc_acquire_body(const char *scope, const char *const *keys, size_t n, uint64_t size, int term)
{
    json_t *o = json_object(), *k = json_array(), *m = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(k, json_string(keys[i]));
        json_array_append_new(m, json_pack("{s:I, s:s}", "size", (json_int_t)size, "layout", "rtp_llm_group_block_v1"));
    }
    json_object_set_new(o, "scope", json_string(scope));
    json_object_set_new(o, "object_keys", k);
    json_object_set_new(o, "term", json_integer(term));
    if (scope[0] == 'c') {
        json_object_set_new(o, "object_metas", m);
        json_object_set_new(o, "request_id", json_string("kvs_store_test"));
        json_object_set_new(o, "ignore_existing", json_true());
    } else {
        json_decref(m);
        json_object_set_new(o, "peer", json_string("local"));
        json_object_set_new(o, "wait_timeout", json_integer(0));
        json_object_set_new(o, "request_id", json_string("kvs_read_test"));
        json_object_set_new(o, "best_effort", json_true());
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static inline const char *kvsc_lease_id(const kvsc_reply *r)
{
    const char *s = json_string_value(json_object_get(json_object_get(r->body, "lease"), "lease_id"));
    return s ? s : "";
}

/* The object of key in an acquire reply: its offset and size; false when absent. */
static inline bool kvsc_object(const kvsc_reply *r, const char *key, uint64_t *offset, uint64_t *size)
{
    json_t *objs = json_object_get(r->body, "objects"), *o;
    size_t i;
    json_array_foreach(objs, i, o) {
        if (!json_is_object(o) || strcmp(json_string_value(json_object_get(o, "key")) ?: "", key) != 0)
            continue;
        json_t *h = json_object_get(json_array_get(json_object_get(o, "blobs"), 0), "handle");
        *offset = (uint64_t)json_integer_value(json_object_get(h, "data_offset"));
        *size = (uint64_t)json_integer_value(json_object_get(h, "data_size"));
        return true;
    }
    return false;
}

/* A lease call (seal, release, discard): the status, -1 on transport error. */
static inline long kvsc_lease_call(const kvsc *c, const char *route, const char *lease)
{
    char body[160];
    kvsc_reply r;
    snprintf(body, sizeof body, "{\"lease_id\":\"%s\",\"request_id\":\"kvs_store_test\"}", lease);
    if (kvsc_call(c->url, route, body, &r) < 0)
        return -1;
    kvsc_reply_free(&r);
    return r.status;
}

/* rtp-llm's store(): create, copy block i from blocks[i] (size bytes each)
 * into every object returned, seal, release; discard on any error. 0, or
 * the failing step's status (or -1). */
static inline long kvsc_store(const kvsc *c, const char *const *keys, size_t n, const uint8_t *const *blocks,
                              uint64_t size, int term)
{
    char *body = kvsc_acquire_body("create", keys, n, size, term);
    kvsc_reply r;
    long st;
    if (!body || kvsc_call(c->url, "acquire", body, &r) < 0) {
        free(body);
        return -1;
    }
    free(body);
    if (r.status != 200) {
        st = r.status;
        kvsc_reply_free(&r);
        return st;
    }
    char lease[64];
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    if (!*lease) {
        kvsc_reply_free(&r);
        return 0;   /* every object exists */
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t off, sz;
        if (!kvsc_object(&r, keys[i], &off, &sz))
            continue;
        if (off + size > c->size || sz < size) {
            kvsc_reply_free(&r);
            kvsc_lease_call(c, "discard", lease);
            return -2;
        }
        memcpy(c->base + off, blocks[i], size);
    }
    kvsc_reply_free(&r);
    st = kvsc_lease_call(c, "seal", lease);
    if (st != 204) {
        kvsc_lease_call(c, "discard", lease);
        return st;
    }
    st = kvsc_lease_call(c, "release", lease);
    return st == 204 ? 0 : st;
}

/* rtp-llm's match + read: acquire(read), copy each present object into
 * out[i] (size bytes), release. *hits = objects found; 0 or the status. */
static inline long kvsc_read(const kvsc *c, const char *const *keys, size_t n, uint8_t *const *out, uint64_t size,
                             int term, size_t *hits, bool *found)
{
    char *body = kvsc_acquire_body("read", keys, n, size, term);
    kvsc_reply r;
    *hits = 0;
    if (!body || kvsc_call(c->url, "acquire", body, &r) < 0) {
        free(body);
        return -1;
    }
    free(body);
    if (r.status != 200) {
        long st = r.status;
        kvsc_reply_free(&r);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t off, sz;
        bool f = kvsc_object(&r, keys[i], &off, &sz) && off + size <= c->size;
        if (found)
            found[i] = f;
        if (!f)
            continue;
        if (out)
            memcpy(out[i], c->base + off, size);
        (*hits)++;
    }
    char lease[64];
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&r));
    kvsc_reply_free(&r);
    long st = *lease ? kvsc_lease_call(c, "release", lease) : 204;
    if (st != 204) {
        fprintf(stderr, "kvsc_read: release of lease %s answered %ld\n", lease, st);
        return -3;
    }
    return 0;
}

#endif
