/* admin: evhttp endpoints on the loop (see admin.h). */
#include "admin.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "config.h"
#include "daemon.h"
#include "errmsg.h"
#include "log.h"
#include "metrics.h"
#include "ops.h"
#include "persist.h"
#include "workers.h"

#define ADMIN_TIMEOUT_S      10          /* an idle or slow admin connection is closed */
#define ADMIN_MAX_HEADERS    (16u << 10)
#define ADMIN_MAX_BODY       (16u << 10)

struct admin {
    struct daemon *d;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;   /* NULL once shutdown began */
    bool stopping;
    bool unix_owned;                     /* we created path: unlink it */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char address[CONFIG_LISTEN_MAX + 16];
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
    if (metrics_render(a->d, b) < 0) {
        admin_reply_text(req, HTTP_INTERNAL, "Internal Server Error", "cannot build the metrics page");
        return;
    }
    admin_reply(req, HTTP_OK, "OK", "text/plain; version=0.0.4; charset=utf-8", b);
}

static void admin_readyz(struct admin *a, struct evhttp_request *req)
{
    char stalled[512], msg[640];

    if (a->stopping) {
        admin_reply_text(req, 503, "Service Unavailable", "not ready: shutting down");
        return;
    }
    /* Workers report through the registry; the loop is alive if it answers. */
    if (!workers_check(workers_now_ms(), METRICS_WORKER_STALL_MS, stalled, sizeof stalled)) {
        snprintf(msg, sizeof msg, "not ready: worker%s not alive: %s", strchr(stalled, ',') ? "s" : "",
                 stalled);
        admin_reply_text(req, 503, "Service Unavailable", msg);
        return;
    }
    /* A degraded store costs persistence only: engines are still served
     * from memory, so the node stays ready and says why it is degraded. */
    if (a->d->persist) {
        struct persist_counters pc;
        persist_get_counters(a->d->persist, &pc);
        if (pc.state == PERSIST_STATE_DEGRADED) {
            snprintf(msg, sizeof msg, "ready; persistent store degraded: %.500s",
                     persist_last_error(a->d->persist));
            admin_reply_text(req, HTTP_OK, "OK", msg);
            return;
        }
    }
    admin_reply_text(req, HTTP_OK, "OK", "ready");
}

static void admin_stats(struct admin *a, struct evhttp_request *req, struct evbuffer *b)
{
    json_t *doc = ops_stats_document(a->d->ops);
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
    config_write(a->d->cfg, mem);
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

/* ---- listeners --------------------------------------------------------------- */

/* A unix socket at path, replacing a stale file but never a live listener. */
static int admin_listen_unix(struct admin *a, const char *path, unsigned mode, char *err, size_t errlen)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    struct stat st;
    int fd;

    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            errmsg_set(err, errlen, "admin listen unix:%s: exists and is not a socket", path);
            return -1;
        }
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            close(fd);
            errmsg_set(err, errlen, "admin listen unix:%s: another process is listening there", path);
            return -1;
        }
        if (fd >= 0)
            close(fd);
        unlink(path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        errmsg_set(err, errlen, "admin listen unix:%s: socket: %s", path, strerror(errno));
        return -1;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        errmsg_set(err, errlen, "admin listen unix:%s: bind: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    snprintf(a->path, sizeof a->path, "%s", path);
    a->unix_owned = true;
    if (chmod(path, mode) < 0 || listen(fd, 64) < 0) {
        errmsg_set(err, errlen, "admin listen unix:%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    a->bound = evhttp_accept_socket_with_handle(a->http, fd);
    if (!a->bound) {
        errmsg_set(err, errlen, "admin listen unix:%s: cannot accept on it", path);
        close(fd);
        return -1;
    }
    snprintf(a->address, sizeof a->address, "unix:%s", path);
    return 0;
}

static int admin_listen_tcp(struct admin *a, const char *host, uint16_t port, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN];
    int fd;

    a->bound = evhttp_bind_socket_with_handle(a->http, host, port);
    if (!a->bound) {
        errmsg_set(err, errlen, "admin listen %s:%u: cannot bind (%s)", host, (unsigned)port,
                   errno ? strerror(errno) : "address in use or unavailable");
        return -1;
    }
    fd = evhttp_bound_socket_get_fd(a->bound);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        errmsg_set(err, errlen, "admin listen: getsockname: %s", strerror(errno));
        return -1;
    }
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof ip);
        snprintf(a->address, sizeof a->address, "[%s]:%u", ip, (unsigned)ntohs(s6->sin6_port));
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof ip);
        snprintf(a->address, sizeof a->address, "%s:%u", ip, (unsigned)ntohs(s4->sin_port));
    }
    return 0;
}

int admin_create(struct daemon *d, struct admin **out, char *err, size_t errlen)
{
    struct config_listen l;
    char problem[320];
    struct admin *a;

    *out = NULL;
    if (config_parse_listen(d->cfg->admin_listen, &l, problem, sizeof problem) < 0) {
        errmsg_set(err, errlen, "[admin] listen: %s", problem);
        return -1;
    }
    if (l.kind == CONFIG_LISTEN_OFF)
        return 0;
    a = calloc(1, sizeof *a);
    if (!a || !(a->http = evhttp_new(d->base))) {
        free(a);
        errmsg_set(err, errlen, "admin: out of memory");
        return -1;
    }
    a->d = d;
    evhttp_set_timeout(a->http, ADMIN_TIMEOUT_S);
    evhttp_set_max_headers_size(a->http, ADMIN_MAX_HEADERS);
    evhttp_set_max_body_size(a->http, ADMIN_MAX_BODY);
    /* Let every method reach the callback, which answers 405 itself. */
    evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH |
                                            EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT);
    evhttp_set_gencb(a->http, admin_request_cb, a);
    errno = 0;
    int rc = l.kind == CONFIG_LISTEN_UNIX ? admin_listen_unix(a, l.path, d->cfg->socket_mode, err, errlen)
                                          : admin_listen_tcp(a, l.host, l.port, err, errlen);
    if (rc < 0) {
        admin_destroy(a);
        return -1;
    }
    log_info("admin HTTP on %s (/metrics /healthz /readyz /stats /config)", a->address);
    *out = a;
    return 0;
}

void admin_begin_shutdown(struct admin *a)
{
    if (!a || a->stopping)
        return;
    a->stopping = true;
    if (a->bound) {
        evhttp_del_accept_socket(a->http, a->bound);
        a->bound = NULL;
    }
}

void admin_destroy(struct admin *a)
{
    if (!a)
        return;
    if (a->http)
        evhttp_free(a->http);   /* closes listeners and connections */
    if (a->unix_owned)
        unlink(a->path);
    free(a);
}

const char *admin_address(const struct admin *a)
{
    return a->address;
}
