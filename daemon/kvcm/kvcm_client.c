/* kvcm_client: the KVCM HTTP/JSON client. Protocol and behaviour: see kvcm_client.h.
 * This file: the client object, statuses, results, the HTTP POST and leader discovery;
 * the RPCs and the EventItem builders are kvcm_client_rpc.c's (kvcm_client_internal.h).
 *
 * Outcome of one POST, exactly: HTTP 2xx with a body that is a JSON object carrying
 * header.status.code (a known name or number) -> that status; anything else (no connection,
 * timeout, another HTTP status, a body over max_response_bytes, not JSON, no header.status,
 * an unknown code, or a reply field we use that is malformed) -> KVCM_TRANSPORT with the
 * reason in r->message. Arguments the client itself refuses (missing instance id, bad
 * events, ...) -> KVCM_INVALID_ARGUMENT with a message starting "client:", no network.
 *
 * Every call has one deadline (timeout_ms, else request_timeout_ms) over everything it does:
 * leader discovery, the RPC, the rediscovery and the retry after SERVER_NOT_LEADER. Leader
 * discovery splits what is left of its deadline evenly over the endpoints still to try, so
 * one hanging endpoint cannot starve the others. A call that ends without a valid answer
 * (KVCM_TRANSPORT) or with SERVER_NOT_LEADER forgets the leader: the next call rediscovers. */
#include "kvcm/kvcm_client.h"
#include "kvcm/kvcm_client_internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "core/clock.h"
#include "core/curlinit.h"
#include "core/errmsg.h"
#include "kvnode.h"

#define KVCM_DEFAULT_CONNECT_TIMEOUT_MS 1000u
#define KVCM_DEFAULT_REQUEST_TIMEOUT_MS 1500u
#define KVCM_DEFAULT_MAX_RESPONSE       (1u << 20)
#define KVCM_URL_MAX     512                      /* base URLs (endpoints, the leader) */
#define KVCM_PREFIX_MAX  64                       /* trace_prefix: room for "-<n>" in 96 */
#define KVCM_HOST_MAX    253                      /* leader_endpoint.host */
#define SNIPPET          160                      /* body bytes quoted in messages */

struct kvcm_client {
    CURL *curl;
    struct curl_slist *hdrs;
    char **endpoints;                 /* base URLs without trailing '/' */
    size_t n_endpoints;
    char leader[KVCM_URL_MAX];        /* "" when unknown */
    uint32_t connect_timeout_ms, request_timeout_ms;
    size_t max_response;
    char trace_prefix[KVCM_PREFIX_MAX + 1];
    uint64_t trace_n;
    char *body;                       /* last reply body (NUL-terminated) */
    size_t body_len, body_cap;
    bool body_overflow, body_oom;
    const atomic_bool *cancel;        /* set: abandon the call in flight */
};

/* Progress callback: a set cancel flag aborts the transfer at once. */
static int client_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                           curl_off_t ulnow)
{
    const struct kvcm_client *c = arg;
    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    return c->cancel && atomic_load(c->cancel) ? 1 : 0;
}

void kvcm_client_set_cancel(struct kvcm_client *c, const atomic_bool *flag)
{
    c->cancel = flag;
}

/* ---- statuses ------------------------------------------------------------------------ */

static const struct { int code; const char *name; } STATUS[] = {
    { KVCM_UNSPECIFIED, "UNSPECIFIED" },
    { KVCM_OK, "OK" },
    { KVCM_UNSUPPORTED, "UNSUPPORTED" },
    { KVCM_INTERNAL_ERROR, "INTERNAL_ERROR" },
    { KVCM_SERVICE_NOT_READY, "SERVICE_NOT_READY" },
    { KVCM_INVALID_ARGUMENT, "INVALID_ARGUMENT" },
    { KVCM_DUPLICATE_ENTITY, "DUPLICATE_ENTITY" },
    { KVCM_REACH_MAX_ENTITY_CAPACITY, "REACH_MAX_ENTITY_CAPACITY" },
    { KVCM_INSTANCE_NOT_EXIST, "INSTANCE_NOT_EXIST" },
    { KVCM_SERVER_NOT_LEADER, "SERVER_NOT_LEADER" },
    { KVCM_NODE_NOT_REGISTERED, "NODE_NOT_REGISTERED" },
    { KVCM_SNAPSHOT_IN_PROGRESS, "SNAPSHOT_IN_PROGRESS" },
    { KVCM_SNAPSHOT_RATE_LIMITED, "SNAPSHOT_RATE_LIMITED" },
    { KVCM_SNAPSHOT_REQUIRED, "SNAPSHOT_REQUIRED" },
    { KVCM_IO_ERROR, "IO_ERROR" },
    { KVCM_UNKNOWN_ERROR, "UNKNOWN_ERROR" },
};
#define N_STATUS (sizeof STATUS / sizeof STATUS[0])

const char *kvcm_status_name(int status)
{
    if (status == KVCM_TRANSPORT)
        return "TRANSPORT";
    for (size_t i = 0; i < N_STATUS; i++)
        if (STATUS[i].code == status)
            return STATUS[i].name;
    return "UNKNOWN";
}

static int status_known(long long v)
{
    for (size_t i = 0; i < N_STATUS; i++)
        if (STATUS[i].code == v)
            return (int)v;
    return -2;
}

int kvcm_status_parse(json_t *code)
{
    if (json_is_integer(code))
        return status_known(json_integer_value(code));
    if (!json_is_string(code))
        return -2;
    const char *s = json_string_value(code);
    for (size_t i = 0; i < N_STATUS; i++)
        if (strcmp(STATUS[i].name, s) == 0)
            return STATUS[i].code;
    /* its number as a string: plain decimal digits only, at most 3 */
    size_t n = strlen(s);
    if (n == 0 || n > 3 || strspn(s, "0123456789") != n)
        return -2;
    return status_known(strtol(s, NULL, 10));
}

/* ---- reply field parsing ----------------------------------------------------------- */

bool kvcm_json_u64(json_t *v, uint64_t *out)
{
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0)
            return false;
        *out = (uint64_t)json_integer_value(v);
        return true;
    }
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n > 20 || strspn(s, "0123456789") != n)
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *out = x;
    return true;
}

/* ---- results ------------------------------------------------------------------------- */

void kvcm_result_reset(struct kvcm_result *r)
{
    memset(r, 0, sizeof *r);
    r->status = KVCM_TRANSPORT;
}

void kvcm_result_fail(struct kvcm_result *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof r->message, fmt, ap);
    va_end(ap);
    r->status = status;
}

/* Put pfx in front of r->message (truncating the end). */
static void message_prefix(struct kvcm_result *r, const char *pfx)
{
    char tmp[sizeof r->message];
    size_t pl = strlen(pfx), ml = strlen(r->message);
    if (pl > sizeof tmp - 1)
        pl = sizeof tmp - 1;
    if (ml > sizeof tmp - 1 - pl)
        ml = sizeof tmp - 1 - pl;
    memcpy(tmp, pfx, pl);
    memcpy(tmp + pl, r->message, ml);
    tmp[pl + ml] = '\0';
    memcpy(r->message, tmp, pl + ml + 1);
}

/* ---- HTTP ---------------------------------------------------------------------------- */

static size_t body_sink(char *p, size_t size, size_t nmemb, void *arg)
{
    struct kvcm_client *c = arg;
    size_t add = size * nmemb;
    if (add > c->max_response - c->body_len) {
        c->body_overflow = true;
        return 0;                                    /* aborts the transfer */
    }
    if (c->body_len + add + 1 > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < c->body_len + add + 1)
            cap *= 2;
        char *q = realloc(c->body, cap);
        if (!q) {
            c->body_oom = true;
            return 0;
        }
        c->body = q;
        c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, p, add);
    c->body_len += add;
    c->body[c->body_len] = '\0';
    return add;
}

/* POST doc (a fresh trace_id is set in it) to <base>/api/<rpc>, bounded by deadline.
 * Returns the parsed reply (a new reference) with r->status set from header.status.code,
 * or NULL with r->status = KVCM_TRANSPORT. r->trace_id, http_status and message are set. */
static json_t *post(struct kvcm_client *c, const char *base, const char *rpc, json_t *doc,
                    uint64_t deadline, struct kvcm_result *r)
{
    r->status = KVCM_TRANSPORT;
    r->http_status = 0;
    r->message[0] = '\0';
    char url[KVCM_URL_MAX + 64];
    snprintf(url, sizeof url, "%s/api/%s", base, rpc);
    uint64_t now = clock_now_ms();
    if (now >= deadline) {
        kvcm_result_fail(r, KVCM_TRANSPORT, "%s: no time left before the request", url);
        return NULL;
    }
    uint64_t left = deadline - now;
    snprintf(r->trace_id, sizeof r->trace_id, "%s-%" PRIu64, c->trace_prefix, ++c->trace_n);
    char *js = NULL;
    if (json_object_set_new(doc, "trace_id", json_string(r->trace_id)) != 0 ||
        !(js = json_dumps(doc, JSON_COMPACT))) {
        kvcm_result_fail(r, KVCM_TRANSPORT, "%s: out of memory building the request", url);
        return NULL;
    }
    c->body_len = 0;
    c->body_overflow = false;
    c->body_oom = false;
    if (c->body)
        c->body[0] = '\0';
    CURL *h = c->curl;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, js);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(js));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(left < c->connect_timeout_ms ? left : c->connect_timeout_ms));
    CURLcode cc = curl_easy_perform(h);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, NULL);
    free(js);
    long hs = 0;
    if (curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &hs) == CURLE_OK && hs > 0 && hs < 1000)
        r->http_status = (int)hs;
    char sn[SNIPPET];
    if (cc != CURLE_OK) {
        if (c->body_overflow)
            kvcm_result_fail(r, KVCM_TRANSPORT, "%s: reply body over %zu bytes refused (HTTP %d)",
                             url, c->max_response, r->http_status);
        else if (c->body_oom)
            kvcm_result_fail(r, KVCM_TRANSPORT, "%s: out of memory reading the reply", url);
        else
            kvcm_result_fail(r, KVCM_TRANSPORT, "%s: %s (after %" PRIu64 " ms)", url,
                             curl_easy_strerror(cc), clock_now_ms() - now);
        return NULL;
    }
    errmsg_snippet(c->body ? c->body : "", c->body_len, sn, sizeof sn);
    if (r->http_status < 200 || r->http_status > 299) {
        kvcm_result_fail(r, KVCM_TRANSPORT, "%s: HTTP %d: %s", url, r->http_status, sn);
        return NULL;
    }
    json_error_t je;
    json_t *reply = c->body_len ? json_loadb(c->body, c->body_len, 0, &je) : NULL;
    if (!reply) {
        kvcm_result_fail(r, KVCM_TRANSPORT, "%s: HTTP %d: reply is not JSON (%s): %s", url,
                         r->http_status, c->body_len ? je.text : "empty body", sn);
        return NULL;
    }
    json_t *st = json_object_get(json_object_get(reply, "header"), "status");
    json_t *code = json_object_get(st, "code");
    if (!json_is_object(reply) || !json_is_object(st) || !code) {
        kvcm_result_fail(r, KVCM_TRANSPORT, "%s: HTTP %d: reply without header.status.code: %s",
                         url, r->http_status, sn);
        json_decref(reply);
        return NULL;
    }
    int status = kvcm_status_parse(code);
    if (status < KVCM_UNSPECIFIED) {
        kvcm_result_fail(r, KVCM_TRANSPORT, "%s: HTTP %d: unknown header.status.code: %s", url,
                         r->http_status, sn);
        json_decref(reply);
        return NULL;
    }
    r->status = status;
    json_t *msg = json_object_get(st, "message");
    snprintf(r->message, sizeof r->message, "%s", json_is_string(msg) ? json_string_value(msg)
                                                                         : "");
    return reply;
}

/* ---- leader discovery ------------------------------------------------------------------ */

/* "http://host:port" from leader_endpoint {host, meta_http_port}; false when unusable. */
static bool leader_url(json_t *ep, char *out, size_t cap)
{
    json_t *host = json_object_get(ep, "host");
    uint64_t port;
    if (!json_is_object(ep) || !json_is_string(host) ||
        !kvcm_json_u64(json_object_get(ep, "meta_http_port"), &port) || port == 0 || port > 65535)
        return false;
    const char *h = json_string_value(host);
    size_t n = json_string_length(host);
    if (n == 0 || n > KVCM_HOST_MAX)
        return false;
    bool v6 = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (ch == ':')
            v6 = true;
        else if (!isalnum(ch) && ch != '.' && ch != '-' && ch != '_' && ch != '%')
            return false;
    }
    int w = snprintf(out, cap, v6 ? "http://[%s]:%u" : "http://%s:%u", h, (unsigned)port);
    return w > 0 && (size_t)w < cap;
}

/* getClusterInfo on each endpoint in turn until one names a usable leader. */
static int discover(struct kvcm_client *c, uint64_t deadline, struct kvcm_result *r)
{
    c->leader[0] = '\0';
    kvcm_result_fail(r, KVCM_TRANSPORT, "no endpoint tried");
    size_t tried = 0;
    for (size_t i = 0; i < c->n_endpoints; i++) {
        uint64_t now = clock_now_ms();
        if (now >= deadline)
            break;
        const char *ep = c->endpoints[i];
        uint64_t share = (deadline - now) / (c->n_endpoints - i);
        json_t *doc = json_pack("{s:s}", "instance_id", "");
        if (!doc) {
            kvcm_result_fail(r, KVCM_TRANSPORT, "out of memory");
            return r->status;
        }
        tried++;
        json_t *reply = post(c, ep, "getClusterInfo", doc, now + (share ? share : 1), r);
        json_decref(doc);
        if (!reply)
            continue;
        if (r->status != KVCM_OK) {
            char pfx[KVCM_URL_MAX + 96];
            snprintf(pfx, sizeof pfx, "%s/api/getClusterInfo: %s: ", ep,
                     kvcm_status_name(r->status));
            message_prefix(r, pfx);
            json_decref(reply);
            continue;
        }
        char url[KVCM_URL_MAX];
        if (!leader_url(json_object_get(reply, "leader_endpoint"), url, sizeof url)) {
            json_t *self = json_object_get(reply, "self_node_id");
            json_t *lead = json_object_get(reply, "leader_node_id");
            if (json_is_string(self) && json_is_string(lead) && json_string_length(self) > 0 &&
                json_equal(self, lead)) {
                snprintf(url, sizeof url, "%s", ep);          /* it says it is the leader */
            } else {
                kvcm_result_fail(r, KVCM_TRANSPORT, "%s/api/getClusterInfo: no usable "
                                 "leader_endpoint {host, meta_http_port} and not the leader itself",
                                 ep);
                json_decref(reply);
                continue;
            }
        }
        json_decref(reply);
        snprintf(c->leader, sizeof c->leader, "%s", url);
        return KVCM_OK;
    }
    if (tried < c->n_endpoints) {
        char pfx[128];
        snprintf(pfx, sizeof pfx, "leader discovery: deadline passed after %zu of %zu "
                 "endpoints; last: ", tried, c->n_endpoints);
        message_prefix(r, pfx);
    }
    return r->status;
}

static uint64_t deadline_of(const struct kvcm_client *c, uint32_t timeout_ms)
{
    return clock_now_ms() + (timeout_ms ? timeout_ms : c->request_timeout_ms);
}

int kvcm_discover_leader(struct kvcm_client *c, uint32_t timeout_ms, struct kvcm_result *r)
{
    struct kvcm_result scratch;
    if (!r)
        r = &scratch;
    kvcm_result_reset(r);
    return discover(c, deadline_of(c, timeout_ms), r);
}

const char *kvcm_leader(const struct kvcm_client *c)
{
    return c->leader;
}

/* One RPC with leader handling; returns the reply (any status) or NULL (r says why). */
json_t *kvcm_call(struct kvcm_client *c, const char *rpc, json_t *doc, uint32_t timeout_ms,
                  struct kvcm_result *r)
{
    uint64_t deadline = deadline_of(c, timeout_ms);
    if (!c->leader[0] && discover(c, deadline, r) != KVCM_OK)
        return NULL;
    json_t *reply = post(c, c->leader, rpc, doc, deadline, r);
    if (reply && r->status == KVCM_SERVER_NOT_LEADER) {
        json_decref(reply);
        reply = NULL;
        char pfx[KVCM_URL_MAX + 64];
        snprintf(pfx, sizeof pfx, "%s answered SERVER_NOT_LEADER; rediscovery failed: ",
                 c->leader);
        if (discover(c, deadline, r) != KVCM_OK) {
            message_prefix(r, pfx);
            return NULL;
        }
        reply = post(c, c->leader, rpc, doc, deadline, r);
    }
    if (!reply || r->status == KVCM_SERVER_NOT_LEADER)
        c->leader[0] = '\0';                         /* rediscover on the next call */
    return reply;
}

/* ---- client ------------------------------------------------------------------------------ */

/* A base URL: http(s)://host[:port][/path], printable, no trailing /api. */
static bool url_ok(const char *u, char *why, size_t whylen)
{
    size_t n = strlen(u);
    const char *rest = NULL;
    if (strncasecmp(u, "http://", 7) == 0)
        rest = u + 7;
    else if (strncasecmp(u, "https://", 8) == 0)
        rest = u + 8;
    if (!rest) {
        snprintf(why, whylen, "must start with http:// or https://");
        return false;
    }
    if (!*rest || *rest == '/' || *rest == ':') {
        snprintf(why, whylen, "no host");
        return false;
    }
    if (n >= KVCM_URL_MAX) {
        snprintf(why, whylen, "longer than %d bytes", KVCM_URL_MAX - 1);
        return false;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)u[i] <= 0x20 || (unsigned char)u[i] >= 0x7f || u[i] == '?' ||
            u[i] == '#') {
            snprintf(why, whylen, "contains a space, control, '?', '#' or non-ASCII character");
            return false;
        }
    while (n > 0 && u[n - 1] == '/')
        n--;
    if (n >= 4 && strncmp(u + n - 4, "/api", 4) == 0) {
        snprintf(why, whylen, "must not end in /api (the client adds it)");
        return false;
    }
    return true;
}

void kvcm_client_destroy(struct kvcm_client *c)
{
    if (!c)
        return;
    if (c->curl)
        curl_easy_cleanup(c->curl);
    curl_slist_free_all(c->hdrs);
    for (size_t i = 0; i < c->n_endpoints; i++)
        free(c->endpoints[i]);
    free(c->endpoints);
    free(c->body);
    free(c);
}

int kvcm_client_create(const struct kvcm_client_config *cfg, struct kvcm_client **out,
                       char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg || !cfg->endpoints || cfg->n_endpoints == 0) {
        errmsg_set(err, errlen, "kvcm: no endpoints");
        return -KVNODE_EINVAL;
    }
    for (size_t i = 0; i < cfg->n_endpoints; i++) {
        char why[96];
        if (!cfg->endpoints[i]) {
            errmsg_set(err, errlen, "kvcm: endpoint %zu missing", i);
            return -KVNODE_EINVAL;
        }
        if (!url_ok(cfg->endpoints[i], why, sizeof why)) {
            errmsg_set(err, errlen, "kvcm: endpoint \"%.200s\": %s", cfg->endpoints[i], why);
            return -KVNODE_EINVAL;
        }
    }
    const char *tp = cfg->trace_prefix;
    if (tp && *tp) {
        size_t n = strlen(tp);
        bool ok = n <= KVCM_PREFIX_MAX;
        for (size_t i = 0; ok && i < n; i++)
            ok = (unsigned char)tp[i] > 0x20 && (unsigned char)tp[i] < 0x7f;
        if (!ok) {
            errmsg_set(err, errlen, "kvcm: trace_prefix must be 1..%d printable ASCII characters "
                       "without spaces", KVCM_PREFIX_MAX);
            return -KVNODE_EINVAL;
        }
    }
    CURLcode curl_init_rc = curlinit_once();
    if (curl_init_rc != CURLE_OK) {
        errmsg_set(err, errlen, "kvcm: curl_global_init: %s", curl_easy_strerror(curl_init_rc));
        return -KVNODE_EIO;
    }
    struct kvcm_client *c = calloc(1, sizeof *c);
    if (!c) {
        errmsg_set(err, errlen, "kvcm: out of memory");
        return -KVNODE_ENOMEM;
    }
    c->connect_timeout_ms = cfg->connect_timeout_ms ? cfg->connect_timeout_ms
                                                    : KVCM_DEFAULT_CONNECT_TIMEOUT_MS;
    c->request_timeout_ms = cfg->request_timeout_ms ? cfg->request_timeout_ms
                                                    : KVCM_DEFAULT_REQUEST_TIMEOUT_MS;
    c->max_response = cfg->max_response_bytes ? cfg->max_response_bytes
                                               : KVCM_DEFAULT_MAX_RESPONSE;
    if (tp && *tp) {
        snprintf(c->trace_prefix, sizeof c->trace_prefix, "%s", tp);
    } else {
        /* no prefix given: one that still differs across restarts */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(c->trace_prefix, sizeof c->trace_prefix, "kvnode-%ld-%lld", (long)getpid(),
                 (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
    }
    c->endpoints = calloc(cfg->n_endpoints, sizeof *c->endpoints);
    c->curl = curl_easy_init();
    c->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h2 = c->hdrs ? curl_slist_append(c->hdrs, "Expect:") : NULL;
    if (!c->endpoints || !c->curl || !h2) {
        errmsg_set(err, errlen, "kvcm: out of memory");
        kvcm_client_destroy(c);
        return -KVNODE_ENOMEM;
    }
    c->hdrs = h2;
    for (size_t i = 0; i < cfg->n_endpoints; i++) {
        char *u = strdup(cfg->endpoints[i]);
        if (!u) {
            errmsg_set(err, errlen, "kvcm: out of memory");
            kvcm_client_destroy(c);
            return -KVNODE_ENOMEM;
        }
        size_t n = strlen(u);
        while (n > 0 && u[n - 1] == '/')
            u[--n] = '\0';
        c->endpoints[c->n_endpoints++] = u;
    }
    CURL *h = c->curl;
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, client_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, c->hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "kvnode/" KVNODE_VERSION_STRING);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
    *out = c;
    return 0;
}
