/* admin: evhttp endpoints on the loop (see admin.h). */
#include "net/admin.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "config/config.h"
#include "core/errmsg.h"
#include "core/log.h"
#include "core/liveness.h"
#include "net/httpd.h"

/* evhttp's own timeout: a connection where nothing moves for this long
 * (e.g. a client that stops reading its reply) is closed. Receiving a
 * request is bounded by admin.request_timeout (net/httpd.h). */
#define ADMIN_IDLE_TIMEOUT_S 10
#define ADMIN_MAX_HEADERS    (16u << 10)
#define ADMIN_MAX_BODY       (16u << 10)

struct admin {
    struct admin_deps deps;              /* the config and the pages (admin_create) */
    struct httpd *httpd;
};

/* ---- replies ---------------------------------------------------------------- */

static void admin_reply(struct evhttp_request *req, int code, const char *reason, const char *ctype,
                        struct evbuffer *body)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", ctype);
    evhttp_add_header(h, "Cache-Control", "no-store");
    evhttp_send_reply(req, code, reason, body);
}

static void admin_reply_text(struct evhttp_request *req, int code, const char *reason, const char *text)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evbuffer_add_printf(b, "%s\n", text);
    admin_reply(req, code, reason, "text/plain; charset=utf-8", b);
    evbuffer_free(b);
}

/* ---- endpoints ---------------------------------------------------------------- */

static void admin_metrics(struct admin *a, struct evhttp_request *req, struct evbuffer *b)
{
    if (!a->deps.metrics_page || a->deps.metrics_page(a->deps.ctx, b) < 0) {
        admin_reply_text(req, HTTP_INTERNAL, "Internal Server Error", "cannot build the metrics page");
        return;
    }
    admin_reply(req, HTTP_OK, "OK", "text/plain; version=0.0.4; charset=utf-8", b);
}

static void admin_readyz(struct admin *a, struct evhttp_request *req)
{
    char stalled[512], msg[1400];

    if (httpd_stopping(a->httpd)) {
        admin_reply_text(req, 503, "Service Unavailable", "not ready: shutting down");
        return;
    }
    /* Workers report through the registry; the loop is alive if it answers. */
    if (!liveness_check(liveness_now_ms(), (*a->deps.cfg)->worker_stall_timeout_ms, stalled, sizeof stalled)) {
        snprintf(msg, sizeof msg, "not ready: worker%s not alive: %s", strchr(stalled, ',') ? "s" : "",
                 stalled);
        admin_reply_text(req, 503, "Service Unavailable", msg);
        return;
    }
    /* What is degraded but still served from memory: the wiring says. */
    size_t used = (size_t)snprintf(msg, sizeof msg, "ready");
    if (a->deps.ready_notes)
        a->deps.ready_notes(a->deps.ctx, msg, used, sizeof msg);
    admin_reply_text(req, HTTP_OK, "OK", msg);
}

static void admin_stats(struct admin *a, struct evhttp_request *req, struct evbuffer *b)
{
    json_t *doc = a->deps.stats_document ? a->deps.stats_document(a->deps.ctx) : NULL;
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text) {
        admin_reply_text(req, HTTP_INTERNAL, "Internal Server Error", "cannot build the stats document");
        return;
    }
    evbuffer_add(b, text, strlen(text));
    evbuffer_add(b, "\n", 1);
    free(text);
    admin_reply(req, HTTP_OK, "OK", "application/json", b);
}

static void admin_config(struct admin *a, struct evhttp_request *req, struct evbuffer *b)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) {
        admin_reply_text(req, HTTP_INTERNAL, "Internal Server Error", "out of memory");
        return;
    }
    config_write(*a->deps.cfg, mem);
    if (fclose(mem) != 0 || !text) {
        free(text);
        admin_reply_text(req, HTTP_INTERNAL, "Internal Server Error", "out of memory");
        return;
    }
    evbuffer_add(b, text, len);
    free(text);
    admin_reply(req, HTTP_OK, "OK", "text/plain; charset=utf-8", b);
}

static void admin_request_cb(struct evhttp_request *req, void *arg)
{
    struct admin *a = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    struct evbuffer *b;

    httpd_request_arrived(a->httpd, req);
    if (!path || !*path)
        path = "/";
    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        admin_reply_text(req, 405, "Method Not Allowed", "method not allowed: use GET");
        return;
    }
    if (strcmp(path, "/healthz") == 0) {
        admin_reply_text(req, HTTP_OK, "OK", "ok");
        return;
    }
    if (strcmp(path, "/readyz") == 0) {
        admin_readyz(a, req);
        return;
    }
    b = evbuffer_new();
    if (!b) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    if (strcmp(path, "/metrics") == 0)
        admin_metrics(a, req, b);
    else if (strcmp(path, "/stats") == 0)
        admin_stats(a, req, b);
    else if (strcmp(path, "/config") == 0)
        admin_config(a, req, b);
    else
        admin_reply_text(req, HTTP_NOTFOUND, "Not Found",
                         "not found; endpoints: /metrics /healthz /readyz /stats /config");
    evbuffer_free(b);
}

/* ---- server ------------------------------------------------------------------- */

static void admin_limits(void *arg, struct httpd_limits *out)
{
    const struct admin *a = arg;
    out->max_connections = (*a->deps.cfg)->admin_max_connections;
    out->request_timeout_ms = (*a->deps.cfg)->admin_request_timeout_ms;
    out->max_connections_option = "admin.max_connections";
}

int admin_create(const struct admin_deps *deps, struct admin **out, char *err, size_t errlen)
{
    const struct kvn_config *cfg = *deps->cfg;
    const struct config_listen *l = &cfg->admin_listen_addr;   /* parsed with the config */
    struct admin *a;
    struct evhttp *http;

    *out = NULL;
    if (l->kind == CONFIG_LISTEN_OFF)
        return 0;
    if (!(a = calloc(1, sizeof *a))) {
        errmsg_set(err, errlen, "admin: out of memory");
        return -1;
    }
    a->deps = *deps;
    if (httpd_create(deps->base, "admin", "admin listen", l, cfg->socket_mode, admin_limits, a, &a->httpd, err,
                     errlen) < 0) {
        free(a);
        return -1;
    }
    http = httpd_evhttp(a->httpd);
    evhttp_set_timeout(http, ADMIN_IDLE_TIMEOUT_S);
    evhttp_set_max_headers_size(http, ADMIN_MAX_HEADERS);
    evhttp_set_max_body_size(http, ADMIN_MAX_BODY);
    /* Let every method reach the callback, which answers 405 itself. */
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                         EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH |
                                         EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT);
    evhttp_set_gencb(http, admin_request_cb, a);
    log_info("admin HTTP on %s (/metrics /healthz /readyz /stats /config)", httpd_address(a->httpd));
    *out = a;
    return 0;
}

void admin_begin_shutdown(struct admin *a)
{
    if (a)
        httpd_begin_shutdown(a->httpd);
}

void admin_destroy(struct admin *a)
{
    if (!a)
        return;
    httpd_destroy(a->httpd);
    free(a);
}

void admin_get_stats(const struct admin *a, struct admin_stats *out)
{
    struct httpd_stats st;
    httpd_get_stats(a->httpd, &st);
    *out = (struct admin_stats){
        .address = httpd_address(a->httpd),
        .open = st.open, .max = st.max, .accepted = st.accepted, .refused = st.refused,
        .refused_reserve = st.refused_reserve, .timed_out = st.timed_out, .accept_pauses = st.accept_pauses,
    };
}
