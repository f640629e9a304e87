/* kvs/v6d: the rtp-llm KVS backend. Protocol and behaviour: see v6d.h. */
#include "persist/kvs/v6d.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "core/clock.h"
#include "core/curlinit.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "mem/namespace.h"

#define LEASE_MAX   256          /* longest lease_id we keep */
#define KEY_MAX     (V6D_OBJECT_NS_MAX + V6D_DEPLOYMENT_ID_MAX + 96)
#define SNIPPET     160          /* body bytes quoted in error messages */

struct kvs_store {
    CURL *curl;
    struct curl_slist *hdrs;
    char *base_url;              /* without trailing '/' */
    char *sock_path;
    char object_ns[V6D_OBJECT_NS_MAX];   /* first part of every object key */
    uint32_t connect_timeout_ms, timeout_ms;
    char *body;                  /* last reply body (NUL-terminated), V6D_MAX_HTTP_BODY cap */
    size_t body_len, body_cap;
    bool body_overflow;
    int dp_fd;                   /* data-plane socket; -1 when down */
    uint8_t *map;                /* arena mapping [0, map_size); NULL when down */
    size_t map_size;
    unsigned id;                 /* handle number (request ids) */
    uint64_t counter;
};

static atomic_uint next_handle_id;
/* ---- object keys --------------------------------------------------------------- */

/* rtp-llm's hashString (KVSConnector.cc:26-35 @85c02327f, PR #1154): FNV-1a
 * over the bytes, prime 1099511628211, but the offset basis its code has is
 * 1469598103934665603 — one digit short of the standard FNV-1a basis
 * 14695981039346656037 (namespace.c's ns_fnv1a64 uses that one). It is what
 * rtp-llm engines put in their object keys, so keys that must be theirs use
 * it as it is: "fixing" it would make every key differ from rtp-llm's. */
#define V6D_RTP_HASH_BASIS UINT64_C(1469598103934665603)
#define V6D_RTP_HASH_PRIME UINT64_C(1099511628211)

uint64_t v6d_rtp_hash_string(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = V6D_RTP_HASH_BASIS;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= V6D_RTP_HASH_PRIME;
    }
    return h;
}

/* The value of the extra item "kvs_deployment_id=<id>" (items separated by
 * ';'): a pointer into extra and its length, or NULL. */
static const char *engine_deployment_id(const char *extra, size_t extra_max, size_t *len)
{
    static const char tag[] = V6D_EXTRA_DEPLOYMENT_ID "=";
    size_t n = strnlen(extra, extra_max);
    for (size_t at = 0; at < n;) {
        const char *item = extra + at;
        const char *semi = memchr(item, ';', n - at);
        size_t ilen = semi ? (size_t)(semi - item) : n - at;
        if (ilen >= sizeof tag - 1 && memcmp(item, tag, sizeof tag - 1) == 0) {
            *len = ilen - (sizeof tag - 1);
            return item + sizeof tag - 1;
        }
        at += ilen + 1;
    }
    return NULL;
}

size_t v6d_deployment_id(const struct ns_layout *l, char *buf, size_t len)
{
    size_t idlen = 0;
    const char *id = engine_deployment_id(l->extra, sizeof l->extra, &idlen);
    int n;
    if (id && idlen > 0) {
        n = snprintf(buf, len, "%.*s", (int)idlen, id);
    } else {
        char canon[NS_MODEL_MAX + NS_DTYPE_MAX + NS_EXTRA_MAX + 256];
        size_t cl = ns_canonical_string(l, canon, sizeof canon);
        if (cl >= sizeof canon)
            cl = sizeof canon - 1;
        n = snprintf(buf, len, "%.*s-%" PRIx64, (int)strnlen(l->model, sizeof l->model),
                     l->model, v6d_rtp_hash_string(canon, cl));
    }
    return n < 0 ? 0 : (size_t)n;
}

static size_t put_part(char *buf, size_t len, size_t at, const char *s)
{
    for (; *s; s++, at++)
        if (at + 1 < len)
            buf[at] = (*s == '/' || *s == ' ' || *s == '\t' || *s == '\n') ? '_' : *s;
    return at;
}

size_t v6d_object_key(const char *object_ns, const struct kvs_ns *ns, int64_t key, char *buf,
                      size_t len)
{
    char ver[16], dep[V6D_DEPLOYMENT_ID_MAX], rank[32], grp[32], blk[32];
    snprintf(ver, sizeof ver, "v%d", V6D_KEY_VERSION);
    v6d_deployment_id(ns->layout, dep, sizeof dep);
    snprintf(rank, sizeof rank, "tp-%" PRIu32, ns->layout->tp_rank);
    snprintf(grp, sizeof grp, "group-%d", V6D_KEY_GROUP);
    snprintf(blk, sizeof blk, "block-%" PRId64, key);
    const char *parts[] = { object_ns && *object_ns ? object_ns : V6D_DEFAULT_OBJECT_NS, ver,
                            dep, rank, grp, blk };
    size_t at = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (i) {
            if (at + 1 < len)
                buf[at] = '/';
            at++;
        }
        at = put_part(buf, len, at, parts[i]);
    }
    if (len)
        buf[at < len ? at : len - 1] = '\0';
    return at;
}

/* ---- reply parsing ------------------------------------------------------------ */

/* A non-negative integral JSON number that fits uint64 exactly. */
static bool get_u64(json_t *v, uint64_t *out)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < 0)
            return false;
        *out = (uint64_t)i;
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        /* reals are exact only up to 2^53 */
        if (!isfinite(d) || d < 0 || d != floor(d) || d > 9007199254740992.0)
            return false;
        *out = (uint64_t)d;
        return true;
    }
    return false;
}

/* object_id: absent, or a number; returns false when malformed; *invalid when
 * it is UINT64_MAX (as an integer jansson cannot hold it: it arrives as a real
 * >= 2^64 when the document had to be reparsed, see parse_doc). */
static bool get_object_id(json_t *v, bool *invalid)
{
    *invalid = false;
    if (!v)
        return true;
    if (json_is_real(v) && json_real_value(v) >= 18446744073709551615.0) {
        *invalid = true;
        return json_real_value(v) <= 18446744073709551616.0;
    }
    uint64_t id;
    if (!get_u64(v, &id))
        return false;
    *invalid = id == UINT64_MAX;
    return true;
}

static json_t *parse_doc(const char *body, size_t len, char *err, size_t errlen)
{
    json_error_t je;
    json_t *doc = json_loadb(body, len, 0, &je);
    if (!doc && json_error_code(&je) == json_error_numeric_overflow)
        doc = json_loadb(body, len, JSON_DECODE_INT_AS_REAL, &je);   /* e.g. object_id 2^64-1 */
    if (!doc) {
        char s[SNIPPET];
        errmsg_snippet(body, len, s, sizeof s);
        errmsg_set(err, errlen, "malformed JSON (%s): %s", je.text, s);
    }
    return doc;
}

/* Parse one non-null object; *slot gets its key index. */
static int parse_object(json_t *o, size_t idx, const char *const *keys, size_t n, size_t *slot,
                        struct v6d_obj *out, char *err, size_t errlen)
{
    json_t *k = json_object_get(o, "key");
    if (!json_is_object(o) || !json_is_string(k)) {
        errmsg_set(err, errlen, "objects[%zu]: not an object with a string key", idx);
        return -KVNODE_EPROTO;
    }
    size_t i;
    for (i = 0; i < n; i++)
        if (strcmp(keys[i], json_string_value(k)) == 0)
            break;
    if (i == n) {
        errmsg_set(err, errlen, "objects[%zu]: key \"%.200s\" was not requested", idx,
                   json_string_value(k));
        return -KVNODE_EPROTO;
    }
    *slot = i;
    json_t *blobs = json_object_get(o, "blobs");
    json_t *b0 = json_array_get(blobs, 0);
    json_t *type = json_object_get(b0, "type");
    json_t *h = json_object_get(b0, "handle");
    if (!json_is_object(b0) || !json_is_string(type) || !json_is_object(h)) {
        errmsg_set(err, errlen, "objects[%zu]: blobs[0] with type and handle required", idx);
        return -KVNODE_EPROTO;
    }
    if (strcmp(json_string_value(type), "vineyard") != 0) {
        errmsg_set(err, errlen, "objects[%zu]: blobs[0].type \"%.64s\" is not \"vineyard\"", idx,
                   json_string_value(type));
        return -KVNODE_EPROTO;
    }
    uint64_t off, size, msize = 0;
    bool invalid;
    if (!get_u64(json_object_get(h, "data_offset"), &off) ||
        !get_u64(json_object_get(h, "data_size"), &size)) {
        errmsg_set(err, errlen, "objects[%zu]: data_offset/data_size must be non-negative "
                   "integers", idx);
        return -KVNODE_EPROTO;
    }
    if (!get_object_id(json_object_get(h, "object_id"), &invalid)) {
        errmsg_set(err, errlen, "objects[%zu]: object_id must be a non-negative integer", idx);
        return -KVNODE_EPROTO;
    }
    json_t *meta = json_object_get(o, "meta");
    if (meta && !json_is_null(meta)) {
        json_t *ms = json_object_get(meta, "size");
        if (!json_is_object(meta) || (ms && !get_u64(ms, &msize))) {
            errmsg_set(err, errlen, "objects[%zu]: meta.size must be a non-negative integer", idx);
            return -KVNODE_EPROTO;
        }
    }
    out->present = !invalid;
    out->offset = off;
    out->size = msize > 0 ? msize : size;
    return 0;
}

/* create: a create reply, where a null entry or an invalid handle fails the
 * whole store (rtp-llm's client discards; existing objects must be omitted). */
static int parse_acquire(const char *body, size_t len, const char *const *keys, size_t n,
                         char *lease_id, size_t lease_cap, struct v6d_obj *objs, bool create,
                         char *err, size_t errlen)
{
    if (lease_cap)
        lease_id[0] = '\0';
    for (size_t i = 0; i < n; i++)
        objs[i] = (struct v6d_obj){ 0 };
    json_t *doc = parse_doc(body, len, err, errlen);
    if (!doc)
        return -KVNODE_EPROTO;
    int rc = 0;
    bool *seen = NULL;
    json_t *lid = json_object_get(json_object_get(doc, "lease"), "lease_id");
    if (!json_is_object(doc) || !json_is_string(lid)) {
        errmsg_set(err, errlen, "acquire reply without lease.lease_id");
        rc = -KVNODE_EPROTO;
        goto out;
    }
    if (strlen(json_string_value(lid)) >= lease_cap) {
        errmsg_set(err, errlen, "lease_id of %zu bytes is too long",
                   strlen(json_string_value(lid)));
        rc = -KVNODE_EPROTO;
        goto out;
    }
    snprintf(lease_id, lease_cap, "%s", json_string_value(lid));
    json_t *objects = json_object_get(doc, "objects");
    if (!objects || json_is_null(objects))
        goto out;                                    /* best effort: all absent */
    if (!json_is_array(objects)) {
        errmsg_set(err, errlen, "acquire reply: objects is not an array");
        rc = -KVNODE_EPROTO;
        goto out;
    }
    seen = calloc(n ? n : 1, sizeof *seen);
    if (!seen) {
        errmsg_set(err, errlen, "out of memory");
        rc = -KVNODE_ENOMEM;
        goto out;
    }
    size_t idx;
    json_t *o;
    json_array_foreach(objects, idx, o) {
        if (json_is_null(o) && !create)
            continue;
        if (json_is_null(o)) {
            errmsg_set(err, errlen, "create reply: objects[%zu] is null (an existing object "
                       "must be omitted)", idx);
            rc = -KVNODE_EPROTO;
            goto out;
        }
        size_t slot = 0;
        struct v6d_obj tmp;
        rc = parse_object(o, idx, keys, n, &slot, &tmp, err, errlen);
        if (rc < 0)
            goto out;
        if (create && !tmp.present) {
            errmsg_set(err, errlen, "create reply: objects[%zu] has an invalid object_id", idx);
            rc = -KVNODE_EPROTO;
            goto out;
        }
        if (seen[slot]) {
            errmsg_set(err, errlen, "objects[%zu]: key \"%.200s\" appears twice", idx, keys[slot]);
            rc = -KVNODE_EPROTO;
            goto out;
        }
        seen[slot] = true;
        objs[slot] = tmp;
    }
out:
    if (rc < 0)
        for (size_t i = 0; i < n; i++)
            objs[i] = (struct v6d_obj){ 0 };
    free(seen);
    json_decref(doc);
    return rc;
}

int v6d_parse_acquire_reply(const char *body, size_t len, const char *const *keys, size_t n,
                            char *lease_id, size_t lease_cap, struct v6d_obj *objs,
                            char *err, size_t errlen)
{
    return parse_acquire(body, len, keys, n, lease_id, lease_cap, objs, false, err, errlen);
}

/* ---- control plane ------------------------------------------------------------- */

static size_t body_sink(char *p, size_t size, size_t nmemb, void *arg)
{
    struct kvs_store *s = arg;
    size_t add = size * nmemb;
    if (add > V6D_MAX_HTTP_BODY - s->body_len) {
        s->body_overflow = true;
        return 0;                                    /* aborts the transfer */
    }
    if (s->body_len + add + 1 > s->body_cap) {
        size_t cap = s->body_cap ? s->body_cap : 4096;
        while (cap < s->body_len + add + 1)
            cap *= 2;
        char *q = realloc(s->body, cap);
        if (!q)
            return 0;
        s->body = q;
        s->body_cap = cap;
    }
    memcpy(s->body + s->body_len, p, add);
    s->body_len += add;
    s->body[s->body_len] = '\0';
    return add;
}

/* One call: GET when json is NULL, else POST json. 0 with *status, or < 0. */
static int http_call(struct kvs_store *s, const char *name, const char *json, long *status,
                     char *err, size_t errlen)
{
    char url[1024];
    if ((size_t)snprintf(url, sizeof url, "%s/%s", s->base_url, name) >= sizeof url) {
        errmsg_set(err, errlen, "%s: URL too long", name);
        return -KVNODE_EINVAL;
    }
    s->body_len = 0;
    s->body_overflow = false;
    if (s->body)
        s->body[0] = '\0';
    curl_easy_setopt(s->curl, CURLOPT_URL, url);
    if (json) {
        curl_easy_setopt(s->curl, CURLOPT_POST, 1L);
        curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS, json);
        curl_easy_setopt(s->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(json));
    } else {
        curl_easy_setopt(s->curl, CURLOPT_HTTPGET, 1L);
    }
    CURLcode c = curl_easy_perform(s->curl);
    if (c != CURLE_OK) {
        if (s->body_overflow) {
            errmsg_set(err, errlen, "%s: reply body over %u bytes refused", name,
                       V6D_MAX_HTTP_BODY);
            return -KVNODE_ETOOBIG;
        }
        errmsg_set(err, errlen, "%s: %s (%s)", name, curl_easy_strerror(c), url);
        if (c == CURLE_OPERATION_TIMEDOUT)
            return -KVNODE_ETIMEDOUT;
        if (c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST)
            return -KVNODE_ECONNECT;
        return -KVNODE_EIO;
    }
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, status);
    return 0;
}

/* A call that must answer `want`. */
static int http_expect(struct kvs_store *s, const char *name, const char *json, long want,
                       char *err, size_t errlen)
{
    long st = 0;
    int rc = http_call(s, name, json, &st, err, errlen);
    if (rc < 0)
        return rc;
    if (st != want) {
        char sn[SNIPPET];
        errmsg_snippet(s->body ? s->body : "", s->body_len, sn, sizeof sn);
        errmsg_set(err, errlen, "%s: HTTP %ld (expected %ld): %s", name, st, want, sn);
        return -KVNODE_EIO;
    }
    return 0;
}

static int lease_call(struct kvs_store *s, const char *name, const char *lease_id,
                      const char *request_id, char *err, size_t errlen)
{
    json_t *doc = request_id ? json_pack("{s:s, s:s}", "lease_id", lease_id, "request_id",
                                         request_id)
                             : json_pack("{s:s}", "lease_id", lease_id);
    char *js = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!js) {
        errmsg_set(err, errlen, "%s: out of memory", name);
        return -KVNODE_ENOMEM;
    }
    int rc = http_expect(s, name, js, 204, err, errlen);
    free(js);
    return rc;
}

static void next_request_id(struct kvs_store *s, char *buf, size_t len)
{
    snprintf(buf, len, "%ld-%u-%" PRIu64, (long)getpid(), s->id, ++s->counter);
}

/* acquire: POST body, expect 200, parse for keys. rc < 0 with lease_id set
 * means a lease was granted and must still be ended. */
static int acquire(struct kvs_store *s, json_t *req, const char *const *keys, size_t n,
                   bool create, char *lease_id, struct v6d_obj *objs, char *err, size_t errlen)
{
    lease_id[0] = '\0';
    char *js = json_dumps(req, JSON_COMPACT);
    if (!js) {
        errmsg_set(err, errlen, "acquire: out of memory");
        return -KVNODE_ENOMEM;
    }
    int rc = http_expect(s, "acquire", js, 200, err, errlen);
    free(js);
    if (rc < 0)
        return rc;
    return parse_acquire(s->body ? s->body : "", s->body_len, keys, n, lease_id, LEASE_MAX, objs,
                         create, err, errlen);
}

/* ---- data plane ------------------------------------------------------------------ */

static void dp_down(struct kvs_store *s)
{
    if (s->map)
        munmap(s->map, s->map_size);
    s->map = NULL;
    s->map_size = 0;
    if (s->dp_fd >= 0)
        close(s->dp_fd);
    s->dp_fd = -1;
}

/* Wait for ev on fd until deadline: 0, or -KVNODE_ETIMEDOUT / -KVNODE_EIO. */
static int wait_fd(int fd, short ev, uint64_t deadline)
{
    for (;;) {
        uint64_t now = clock_now_ms();
        if (now >= deadline)
            return -KVNODE_ETIMEDOUT;
        struct pollfd p = { .fd = fd, .events = ev };
        int r = poll(&p, 1, (int)(deadline - now));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -KVNODE_EIO;
    }
}

static int send_all(int fd, const void *buf, size_t n, uint64_t deadline)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc < 0)
                return rc;
        } else {
            return -KVNODE_ECLOSED;
        }
    }
    return 0;
}

/* Read exactly n bytes (never more: an fd follows some replies). */
static int recv_all(int fd, void *buf, size_t n, uint64_t deadline)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc < 0)
                return rc;
        } else {
            return -KVNODE_ECLOSED;
        }
    }
    return 0;
}

static int send_frame(int fd, const char *json, uint64_t deadline)
{
    uint8_t hdr[8];
    uint64_t len = strlen(json);
    for (int i = 0; i < 8; i++)
        hdr[i] = (uint8_t)(len >> (8 * i));
    int rc = send_all(fd, hdr, sizeof hdr, deadline);
    return rc < 0 ? rc : send_all(fd, json, len, deadline);
}

/* One reply frame (malloc'd, NUL-terminated) capped at V6D_MAX_FRAME. */
static int recv_frame(int fd, char **out, size_t *outlen, uint64_t deadline, char *err,
                      size_t errlen)
{
    uint8_t hdr[8];
    int rc = recv_all(fd, hdr, sizeof hdr, deadline);
    if (rc < 0) {
        errmsg_set(err, errlen, "reading a reply header: %s",
                   rc == -KVNODE_ETIMEDOUT ? "timed out" : "connection closed");
        return rc;
    }
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--)
        len = (len << 8) | hdr[i];
    if (len > V6D_MAX_FRAME) {
        errmsg_set(err, errlen, "reply of %" PRIu64 " bytes refused (limit %u)", len,
                   V6D_MAX_FRAME);
        return -KVNODE_ETOOBIG;
    }
    char *p = malloc((size_t)len + 1);
    if (!p) {
        errmsg_set(err, errlen, "out of memory");
        return -KVNODE_ENOMEM;
    }
    rc = recv_all(fd, p, (size_t)len, deadline);
    if (rc < 0) {
        free(p);
        errmsg_set(err, errlen, "reading a reply body: %s",
                   rc == -KVNODE_ETIMEDOUT ? "timed out" : "connection closed");
        return rc;
    }
    p[len] = '\0';
    *out = p;
    *outlen = (size_t)len;
    return 0;
}

/* Receive one fd with a 1-byte payload; extra fds are closed. */
static int recv_fd(int sock, int *fd_out, uint64_t deadline, char *err, size_t errlen)
{
    for (;;) {
        char byte;
        struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
        union { char buf[CMSG_SPACE(4 * sizeof(int))]; struct cmsghdr align; } u;
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                              .msg_controllen = sizeof u.buf };
        ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = wait_fd(sock, POLLIN, deadline);
            if (rc < 0) {
                errmsg_set(err, errlen, "waiting for the arena fd: timed out");
                return rc;
            }
            continue;
        }
        if (r != 1) {
            errmsg_set(err, errlen, "waiting for the arena fd: connection closed");
            return -KVNODE_ECLOSED;
        }
        int got = -1, count = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
                if (count++ == 0)
                    got = fd;
                else
                    close(fd);
            }
        }
        if (count != 1 || (msg.msg_flags & MSG_CTRUNC)) {
            if (got >= 0)
                close(got);
            errmsg_set(err, errlen, "expected exactly one fd with the arena reply, got %d%s",
                       count, (msg.msg_flags & MSG_CTRUNC) ? " (truncated)" : "");
            return -KVNODE_EPROTO;
        }
        *fd_out = got;
        return 0;
    }
}

static int dp_connect(struct kvs_store *s, char *err, size_t errlen)
{
    char e[384] = "";
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    char *reply = NULL;
    size_t rlen = 0;
    int arena = -1, rc;
    uint64_t deadline = clock_now_ms() + s->timeout_ms;

    dp_down(s);
    if (strlen(s->sock_path) >= sizeof sun.sun_path) {
        errmsg_set(err, errlen, "v6d socket path %s is too long", s->sock_path);
        return -KVNODE_EINVAL;
    }
    memcpy(sun.sun_path, s->sock_path, strlen(s->sock_path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        errmsg_set(err, errlen, "socket: %s", strerror(errno));
        return -KVNODE_EIO;
    }
    s->dp_fd = fd;
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun) < 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            errmsg_set(err, errlen, "v6d: connect %s: %s", s->sock_path, strerror(errno));
            rc = -KVNODE_ECONNECT;
            goto fail;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if ((rc = wait_fd(fd, POLLOUT, deadline)) < 0 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
            errmsg_set(err, errlen, "v6d: connect %s: %s", s->sock_path,
                       rc < 0 ? "timed out" : strerror(soerr ? soerr : errno));
            rc = rc < 0 ? rc : -KVNODE_ECONNECT;
            goto fail;
        }
    }
    rc = send_frame(fd, "{\"type\":\"register_request\",\"version\":\"0.0.0\",\"store_type\":0,"
                        "\"session_id\":0,\"username\":\"\",\"password\":\"\"}", deadline);
    if (rc < 0) {
        snprintf(e, sizeof e, "sending register_request failed");
        goto fail_e;
    }
    if ((rc = recv_frame(fd, &reply, &rlen, deadline, e, sizeof e)) < 0)
        goto fail_e;
    if (!memmem(reply, rlen, "register_reply", 14)) {
        char sn[SNIPPET];
        errmsg_snippet(reply, rlen, sn, sizeof sn);
        snprintf(e, sizeof e, "register refused: %s", sn);
        rc = -KVNODE_EPROTO;
        goto fail_e;
    }
    free(reply);
    reply = NULL;
    rc = send_frame(fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}", deadline);
    if (rc < 0) {
        snprintf(e, sizeof e, "sending get_vineyard_mmap_fd_request failed");
        goto fail_e;
    }
    if ((rc = recv_frame(fd, &reply, &rlen, deadline, e, sizeof e)) < 0)
        goto fail_e;
    json_t *doc = parse_doc(reply, rlen, e, sizeof e);
    uint64_t size = 0, offset = 0;
    bool ok = doc && get_u64(json_object_get(doc, "size"), &size) && size > 0 &&
              size <= SIZE_MAX && get_u64(json_object_get(doc, "offset"), &offset);
    json_decref(doc);
    if (!ok) {
        char sn[SNIPPET];
        errmsg_snippet(reply, rlen, sn, sizeof sn);
        if (doc || !e[0])
            snprintf(e, sizeof e, "mmap fd reply without a valid size/offset: %s", sn);
        rc = -KVNODE_EPROTO;
        goto fail_e;
    }
    if ((rc = recv_fd(fd, &arena, deadline, e, sizeof e)) < 0)
        goto fail_e;
    struct stat st;
    if (fstat(arena, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < size) {
        snprintf(e, sizeof e, "arena fd holds %lld bytes, reply said %" PRIu64,
                 (long long)st.st_size, size);
        rc = -KVNODE_EPROTO;
        goto fail_e;
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, arena, 0);
    if (m == MAP_FAILED) {
        snprintf(e, sizeof e, "mmap of %" PRIu64 " bytes: %s", size, strerror(errno));
        rc = -KVNODE_EIO;
        goto fail_e;
    }
    close(arena);
    free(reply);
    s->map = m;
    s->map_size = (size_t)size;
    (void)offset;   /* the mapping is [0,size); data_offsets are relative to it */
    return 0;

fail_e:
    errmsg_set(err, errlen, "v6d: handshake on %s: %s", s->sock_path, e);
fail:
    if (arena >= 0)
        close(arena);
    free(reply);
    dp_down(s);
    return rc;
}

/* The data-plane connection still stands (the store has not closed it, so the
 * mapping is the store's current arena). */
static bool dp_alive(struct kvs_store *s)
{
    if (s->dp_fd < 0 || !s->map)
        return false;
    struct pollfd p = { .fd = s->dp_fd, .events = POLLIN | POLLRDHUP };
    int r = poll(&p, 1, 0);
    if (r == 0)
        return true;
    return false;   /* EOF, error, or unsolicited data: treat as gone */
}

static int dp_ensure(struct kvs_store *s, char *err, size_t errlen)
{
    if (dp_alive(s))
        return 0;
    return dp_connect(s, err, errlen);
}

/* ---- backend ---------------------------------------------------------------------- */

static void v6d_close(struct kvs_store *s)
{
    if (!s)
        return;
    dp_down(s);
    if (s->curl)
        curl_easy_cleanup(s->curl);
    curl_slist_free_all(s->hdrs);
    free(s->body);
    free(s->base_url);
    free(s->sock_path);
    free(s);
}

static int v6d_open(const struct kvs_config *cfg, struct kvs_store **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    if (!cfg->url || !*cfg->url || !cfg->socket_path || !*cfg->socket_path) {
        errmsg_set(err, errlen, "v6d: %s%s%s required", !cfg->url || !*cfg->url ? "url" : "",
                   (!cfg->url || !*cfg->url) && (!cfg->socket_path || !*cfg->socket_path)
                       ? " and " : "",
                   !cfg->socket_path || !*cfg->socket_path ? "socket_path" : "");
        return -KVNODE_EINVAL;
    }
    CURLcode curl_init_rc = curlinit_once();
    if (curl_init_rc != CURLE_OK) {
        errmsg_set(err, errlen, "v6d: curl_global_init: %s", curl_easy_strerror(curl_init_rc));
        return -KVNODE_EIO;
    }
    struct kvs_store *s = calloc(1, sizeof *s);
    if (!s) {
        errmsg_set(err, errlen, "v6d: out of memory");
        return -KVNODE_ENOMEM;
    }
    s->dp_fd = -1;
    s->id = atomic_fetch_add(&next_handle_id, 1) + 1;
    s->connect_timeout_ms = cfg->connect_timeout_ms ? cfg->connect_timeout_ms
                                                    : V6D_DEFAULT_CONNECT_TIMEOUT_MS;
    s->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : V6D_DEFAULT_TIMEOUT_MS;
    if (cfg->object_namespace && strlen(cfg->object_namespace) >= sizeof s->object_ns) {
        errmsg_set(err, errlen, "v6d: object namespace of %zu bytes (at most %zu)",
                   strlen(cfg->object_namespace), sizeof s->object_ns - 1);
        free(s);
        return -KVNODE_EINVAL;
    }
    snprintf(s->object_ns, sizeof s->object_ns, "%s",
             cfg->object_namespace && *cfg->object_namespace ? cfg->object_namespace
                                                             : V6D_DEFAULT_OBJECT_NS);
    s->base_url = strdup(cfg->url);
    s->sock_path = strdup(cfg->socket_path);
    s->curl = curl_easy_init();
    s->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h2 = s->hdrs ? curl_slist_append(s->hdrs, "Expect:") : NULL;
    if (!s->base_url || !s->sock_path || !s->curl || !h2) {
        errmsg_set(err, errlen, "v6d: out of memory");
        v6d_close(s);
        return -KVNODE_ENOMEM;
    }
    s->hdrs = h2;
    size_t ul = strlen(s->base_url);
    while (ul > 0 && s->base_url[ul - 1] == '/')
        s->base_url[--ul] = '\0';
    CURL *c = s->curl;
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)s->connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)s->timeout_ms);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, s->hdrs);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, body_sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
    int rc = dp_connect(s, err, errlen);
    if (rc < 0) {
        v6d_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

static int v6d_health(struct kvs_store *s, char *err, size_t errlen)
{
    int rc = http_expect(s, "health", NULL, 200, err, errlen);
    if (rc < 0)
        return rc;
    if (!dp_alive(s) && (rc = dp_connect(s, err, errlen)) < 0)
        return rc;
    return 0;
}

/* Best-effort end of a lease after a failure (err keeps the first failure):
 * a create lease is discarded — only discarded, as rtp-llm's client does: a
 * discarded lease is gone — and a read lease released. */
static void abandon(struct kvs_store *s, const char *lease_id, bool discard)
{
    char ignore[64];
    if (!lease_id[0])
        return;
    lease_call(s, discard ? "discard" : "release", lease_id, NULL, ignore, sizeof ignore);
}

/* The distinct object keys of a batch: keys[0..m) with their strings,
 * first[j] the first item of key j, slot[i] the key of item i. */
struct batch {
    char (*k)[KEY_MAX];
    const char **keys;
    size_t *first, *slot;
    struct v6d_obj *objs;
    size_t m;
};

static void batch_free(struct batch *b)
{
    free(b->k);
    free(b->keys);
    free(b->first);
    free(b->slot);
    free(b->objs);
}

static void batch_fail(struct kvs_item *it, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        it[i].rc = rc;
}

/* put: every item must be one whole block (a get's len is only what the
 * caller expects: an object of another size is a miss). */
static int batch_make(struct kvs_store *s, struct kvs_item *it, size_t n, struct batch *b,
                      bool put, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    b->k = malloc(n * sizeof *b->k);
    b->keys = malloc(n * sizeof *b->keys);
    b->first = malloc(n * sizeof *b->first);
    b->slot = malloc(n * sizeof *b->slot);
    b->objs = malloc(n * sizeof *b->objs);
    const char *what = put ? "put" : "get";
    if (!b->k || !b->keys || !b->first || !b->slot || !b->objs) {
        errmsg_set(err, errlen, "v6d %s: out of memory", what);
        return -KVNODE_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        if (it[i].len == 0 || (put && it[i].len != it[i].ns->layout->block_bytes)) {
            errmsg_set(err, errlen, "v6d %s: %zu bytes for a block of %" PRIu64, what, it[i].len,
                       it[i].ns->layout->block_bytes);
            return -KVNODE_EINVAL;
        }
        if (v6d_object_key(s->object_ns, it[i].ns, it[i].key, b->k[b->m], KEY_MAX) >= KEY_MAX) {
            errmsg_set(err, errlen, "v6d %s: object key too long", what);
            return -KVNODE_EINVAL;
        }
        size_t j;
        for (j = 0; j < b->m; j++)   /* batches are small (PERSIST_BATCH_MAX) */
            if (strcmp(b->k[j], b->k[b->m]) == 0)
                break;
        if (j == b->m) {
            b->keys[j] = b->k[j];
            b->first[j] = i;
            b->m++;
        }
        b->slot[i] = j;
    }
    return 0;
}

/* rtp-llm's store (KVSClient::store): one acquire(create, ignore_existing)
 * for every object, copy, seal, release; on any failure after the acquire
 * only discard. An empty lease_id means everything exists already; objects
 * left out of a non-empty lease exist too (their old bytes stay). */
static int v6d_put_batch(struct kvs_store *s, struct kvs_item *it, size_t n, char *err,
                         size_t errlen)
{
    struct batch b;
    char rid[64], lease[LEASE_MAX] = "";
    json_t *req = NULL;
    int rc = n ? batch_make(s, it, n, &b, true, err, errlen) : 0;
    if (n == 0)
        return 0;
    if (rc < 0)
        goto fail;
    if ((rc = dp_ensure(s, err, errlen)) < 0)
        goto fail;
    next_request_id(s, rid, sizeof rid);
    json_t *keys = json_array(), *metas = json_array();
    for (size_t j = 0; keys && metas && j < b.m; j++)
        if (json_array_append_new(keys, json_string(b.keys[j])) < 0 ||
            json_array_append_new(metas, json_pack("{s:I, s:s}", "size",
                                                   (json_int_t)it[b.first[j]].len,
                                                   "layout", V6D_LAYOUT)) < 0)
            break;
    if (keys && metas && json_array_size(keys) == b.m && json_array_size(metas) == b.m)
        req = json_pack("{s:s, s:o, s:o, s:i, s:s, s:b}", "scope", "create", "object_keys", keys,
                        "object_metas", metas, "term", V6D_TERM_S, "request_id", rid,
                        "ignore_existing", 1);
    else {
        json_decref(keys);
        json_decref(metas);
    }
    if (!req) {
        errmsg_set(err, errlen, "v6d put: out of memory");
        rc = -KVNODE_ENOMEM;
        goto fail;
    }
    rc = acquire(s, req, b.keys, b.m, true, lease, b.objs, err, errlen);
    json_decref(req);
    if (rc < 0)
        goto fail;
    if (!lease[0])
        goto ok;                                      /* everything is stored already */
    for (size_t j = 0; j < b.m; j++) {
        const struct v6d_obj *o = &b.objs[j];
        size_t len = it[b.first[j]].len;
        if (o->present && (o->size != len || o->offset > s->map_size ||
                           o->size > s->map_size - o->offset)) {
            errmsg_set(err, errlen, "v6d put: store gave %" PRIu64 " bytes at offset %" PRIu64
                       " for %s (block %zu bytes, mapping %zu bytes): refused", o->size,
                       o->offset, b.keys[j], len, s->map_size);
            rc = -KVNODE_EPROTO;
            goto fail;
        }
    }
    if (!dp_alive(s)) {
        errmsg_set(err, errlen, "v6d put: data-plane connection lost (store restarted?)");
        rc = -KVNODE_ECLOSED;
        goto fail;
    }
    for (size_t j = 0; j < b.m; j++)
        if (b.objs[j].present)
            memcpy(s->map + b.objs[j].offset, it[b.first[j]].src, it[b.first[j]].len);
    if ((rc = lease_call(s, "seal", lease, rid, err, errlen)) < 0)
        goto fail;
    /* Sealed objects stay after release; a failed release only leaves the
     * lease to its term (rtp-llm logs it and goes on). */
    char ignore[64];
    lease_call(s, "release", lease, NULL, ignore, sizeof ignore);
ok:
    batch_fail(it, n, 0);
    batch_free(&b);
    return 0;
fail:
    abandon(s, lease, true);
    batch_fail(it, n, rc);
    batch_free(&b);
    return rc;
}

static int v6d_read_acquire(struct kvs_store *s, const char *const *keys, size_t n,
                            char *lease, struct v6d_obj *objs, char *err, size_t errlen)
{
    char rid[64];
    next_request_id(s, rid, sizeof rid);
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, json_string(keys[i])) < 0) {
            json_decref(arr);
            arr = NULL;
        }
    json_t *req = arr ? json_pack("{s:s, s:o, s:i, s:s, s:i, s:s, s:b}", "scope", "read",
                                  "object_keys", arr, "term", V6D_TERM_S, "peer", "local",
                                  "wait_timeout", 0, "request_id", rid, "best_effort", 1)
                      : NULL;
    if (!req) {
        lease[0] = '\0';
        errmsg_set(err, errlen, "v6d: out of memory");
        return -KVNODE_ENOMEM;
    }
    int rc = acquire(s, req, keys, n, false, lease, objs, err, errlen);
    json_decref(req);
    return rc;
}

/* One acquire(read) for every object, copy what is there, one release. Per
 * item: 0, KVS_MISS (absent, or of another size: never read past an
 * object), -KVNODE_EPROTO (outside the mapping). */
static int v6d_get_batch(struct kvs_store *s, struct kvs_item *it, size_t n, char *err,
                         size_t errlen)
{
    struct batch b;
    char lease[LEASE_MAX] = "";
    int rc = n ? batch_make(s, it, n, &b, false, err, errlen) : 0;
    if (n == 0)
        return 0;
    if (rc < 0)
        goto fail;
    if ((rc = dp_ensure(s, err, errlen)) < 0)
        goto fail;
    if ((rc = v6d_read_acquire(s, b.keys, b.m, lease, b.objs, err, errlen)) < 0)
        goto fail;
    if (!dp_alive(s)) {
        errmsg_set(err, errlen, "v6d get: data-plane connection lost (store restarted?)");
        rc = -KVNODE_ECLOSED;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {   /* a key asked twice is copied twice */
        const struct v6d_obj *o = &b.objs[b.slot[i]];
        const char *key = b.keys[b.slot[i]];
        if (!o->present) {
            it[i].rc = KVS_MISS;
        } else if (o->offset > s->map_size || o->size > s->map_size - o->offset) {
            errmsg_set(err, errlen, "v6d get: object %s at %" PRIu64 "+%" PRIu64
                       " lies outside the %zu-byte mapping", key, o->offset, o->size,
                       s->map_size);
            it[i].rc = -KVNODE_EPROTO;
        } else if (o->size != it[i].len) {
            errmsg_set(err, errlen, "v6d get: object %s holds %" PRIu64 " bytes, expected %zu: "
                       "treated as a miss", key, o->size, it[i].len);
            it[i].rc = KVS_MISS;
        } else {
            memcpy(it[i].dst, s->map + o->offset, it[i].len);
            it[i].rc = 0;
        }
    }
    if (lease[0]) {
        char ignore[64];
        lease_call(s, "release", lease, NULL, ignore, sizeof ignore);
    }
    batch_free(&b);
    return 0;
fail:
    abandon(s, lease, false);
    batch_fail(it, n, rc);
    batch_free(&b);
    return rc;
}

static int v6d_put(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, const void *data,
                   size_t len, char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .src = data, .len = len };
    v6d_put_batch(s, &it, 1, err, errlen);
    return it.rc;
}

static int v6d_get(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, void *data,
                   size_t len, char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .dst = data, .len = len };
    v6d_get_batch(s, &it, 1, err, errlen);
    return it.rc;
}

/* No delete in the protocol for a sealed object (discard ends unsealed
 * create leases only): nothing to send. The backend says so
 * (keeps_deleted), and persist hides deleted keys with tombstones. */
static int v6d_del(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, char *err,
                   size_t errlen)
{
    (void)s; (void)ns; (void)key; (void)err; (void)errlen;
    return 0;
}

static int v6d_exists(struct kvs_store *s, const struct kvs_ns *ns, const int64_t *keys,
                      size_t n, uint8_t *present, char *err, size_t errlen)
{
    char (*k)[KEY_MAX] = NULL;
    const char **kp = NULL;
    size_t *map = NULL;
    struct v6d_obj *objs = NULL;
    char lease[LEASE_MAX] = "";
    int rc = 0;
    memset(present, 0, n);
    if (n == 0)
        return 0;
    size_t chunk = n < V6D_EXISTS_CHUNK ? n : V6D_EXISTS_CHUNK;
    k = malloc(chunk * sizeof *k);
    kp = malloc(chunk * sizeof *kp);
    map = malloc(chunk * sizeof *map);
    objs = malloc(chunk * sizeof *objs);
    if (!k || !kp || !map || !objs) {
        errmsg_set(err, errlen, "v6d exists: out of memory");
        rc = -KVNODE_ENOMEM;
        goto out;
    }
    if ((rc = dp_ensure(s, err, errlen)) < 0)
        goto out;
    for (size_t at = 0; at < n;) {
        size_t m = 0;
        /* up to `chunk` distinct keys (the store wants distinct object_keys) */
        size_t i;
        for (i = at; i < n && m < chunk; i++) {
            bool dup = false;
            for (size_t j = at; j < i && !dup; j++)
                dup = keys[j] == keys[i];
            if (dup)
                continue;
            if (v6d_object_key(s->object_ns, ns, keys[i], k[m], KEY_MAX) >= KEY_MAX) {
                errmsg_set(err, errlen, "v6d exists: object key too long");
                rc = -KVNODE_EINVAL;
                goto out;
            }
            kp[m] = k[m];
            map[m++] = i;
        }
        rc = v6d_read_acquire(s, kp, m, lease, objs, err, errlen);
        if (rc < 0) {
            abandon(s, lease, false);
            goto out;
        }
        for (size_t j = 0; j < m; j++)
            if (objs[j].present)
                for (size_t q = at; q < i; q++)
                    if (keys[q] == keys[map[j]])
                        present[q] = 1;
        if (lease[0] && (rc = lease_call(s, "release", lease, NULL, err, errlen)) < 0)
            goto out;
        at = i;
    }
out:
    if (rc < 0)
        memset(present, 0, n);
    free(k);
    free(kp);
    free(map);
    free(objs);
    return rc;
}

static int v6d_scan(struct kvs_store *s, struct kvs_scan **cursor, size_t budget,
                    void (*found)(void *arg, const struct kvs_found *f), void *arg, char *err,
                    size_t errlen)
{
    (void)s; (void)budget; (void)found; (void)arg; (void)err; (void)errlen;
    *cursor = NULL;
    return 1;   /* nothing we could enumerate: complete, nothing found */
}

const struct kvs_backend kvs_backend_v6d = {
    .name = "v6d",
    .open = v6d_open,
    .health = v6d_health,
    .put = v6d_put,
    .get = v6d_get,
    .del = v6d_del,
    .exists = v6d_exists,
    .scan = v6d_scan,
    .close = v6d_close,
    .put_batch = v6d_put_batch,
    .get_batch = v6d_get_batch,
    .keeps_deleted = true,
};
