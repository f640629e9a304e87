/* admin: evhttp endpoints on the loop (see admin.h). */
#include "net/admin.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <jansson.h>

#include "cache/cache.h"
#include "core/clock.h"
#include "config.h"
#include "daemon.h"
#include "core/errmsg.h"
#include "kvcm/kvcm.h"
#include "mem/arena.h"
#include "mem/populate.h"
#include "core/log.h"
#include "persist/persist.h"
#include "core/liveness.h"
#include "tenants.h"

/* evhttp's own timeout: a connection where nothing moves for this long
 * (e.g. a client that stops reading its reply) is closed. Receiving a
 * request is bounded by admin.request_timeout, which trickled bytes do not
 * extend. */
#define ADMIN_IDLE_TIMEOUT_S 10
#define ADMIN_MAX_HEADERS    (16u << 10)
#define ADMIN_MAX_BODY       (16u << 10)
/* accept failing (out of descriptors): the listener rests this long. */
#define ADMIN_ACCEPT_PAUSE_MS 100u
/* Descriptors admin connections leave to the engine socket: a connection
 * whose descriptor is within this many of RLIMIT_NOFILE is refused (a
 * quarter of the limit when that is smaller). */
#define ADMIN_FD_RESERVE     64u
#define ADMIN_LOG_REPEAT_MS  10000u

/* One admin connection, from the moment evhttp accepted it. evhttp 2.1 has
 * no connection limit and no hook on accept, so: evhttp asks us for each new
 * connection's bufferevent (evhttp_set_bevcb), we queue it as fresh and,
 * from the loop right after evhttp's accept callback returns, count the
 * connection or refuse it (admin_adopt). The bufferevent's callback
 * argument is its evhttp_connection. */
struct admin_conn {
    struct admin *a;
    struct bufferevent *bev;          /* fresh: our reference, until adopted */
    struct evhttp_connection *evcon;  /* adopted */
    struct event *deadline;           /* admin.request_timeout for the request being received */
    struct admin_conn *prev, *next;   /* fresh: next only */
};

struct admin {
    struct daemon *d;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;   /* NULL once shutdown began */
    bool stopping;
    bool unix_owned;                     /* we created path: unlink it */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char address[CONFIG_LISTEN_MAX + 16];
    struct admin_conn *fresh, *fresh_tail; /* accepted by evhttp, not yet adopted, oldest first */
    struct event *adopt_ev;
    struct admin_conn *conns;            /* adopted and open */
    size_t nconns;
    struct event *accept_resume_ev;      /* the paused listener tries again */
    uint64_t accept_pauses_episode;      /* pauses since accepting last worked */
    struct log_limit accept_log, refuse_log;
    uint64_t accepted, refused, refused_reserve, timed_out, accept_pauses;
    struct admin_pages pages;            /* /stats and /metrics (admin_set_pages) */
};

/* libevent calls the listener's error callback with the evhttp as argument,
 * not with ours; there is one admin server per process. */
static struct admin *admin_listening;

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
    if (!a->pages.metrics_page || a->pages.metrics_page(a->d, b) < 0) {
        admin_reply_text(req, HTTP_INTERNAL, "Internal Server Error", "cannot build the metrics page");
        return;
    }
    admin_reply(req, HTTP_OK, "OK", "text/plain; version=0.0.4; charset=utf-8", b);
}

static void admin_readyz(struct admin *a, struct evhttp_request *req)
{
    char stalled[512], msg[1400], who[LOG_TENANT_PREFIX_MAX];

    if (a->stopping) {
        admin_reply_text(req, 503, "Service Unavailable", "not ready: shutting down");
        return;
    }
    /* Workers report through the registry; the loop is alive if it answers. */
    if (!liveness_check(liveness_now_ms(), a->d->cfg->worker_stall_timeout_ms, stalled, sizeof stalled)) {
        snprintf(msg, sizeof msg, "not ready: worker%s not alive: %s", strchr(stalled, ',') ? "s" : "",
                 stalled);
        admin_reply_text(req, 503, "Service Unavailable", msg);
        return;
    }
    /* A degraded store costs persistence only, a stalled KVCM publisher
     * only what routers know of this node: engines are still served from
     * memory, so the node stays ready and says what is wrong. */
    char kvcm_why[640];
    size_t used = (size_t)snprintf(msg, sizeof msg, "ready");
    for (size_t i = 0; i < tenants_count(a->d->tenants) && used < sizeof msg; i++) {
        const struct tenant *t = tenants_at(a->d->tenants, i);
        struct persist_counters pc;
        char pwhy[256];
        /* Short host memory is served from what was reserved: ready, and why. */
        if (t->cache && cache_populate_state(t->cache, pwhy, sizeof pwhy) == POPULATE_FAILED) {
            struct arena_stats hs;
            cache_host_stats(t->cache, &hs);
            used += (size_t)snprintf(msg + used, sizeof msg - used,
                                     "; %shost memory stays at %llu of %llu bytes: %.200s",
                                     log_tenant_prefix(t->named ? t->name : NULL, who, sizeof who),
                                     (unsigned long long)hs.reserved_bytes,
                                     (unsigned long long)hs.capacity, pwhy);
            if (used >= sizeof msg)
                break;
        }
        if (!t->persist)
            continue;
        persist_get_counters(t->persist, &pc);
        if (pc.state == PERSIST_STATE_DEGRADED)
            used += (size_t)snprintf(msg + used, sizeof msg - used, "; %spersistent store degraded: %.300s",
                                     log_tenant_prefix(t->named ? t->name : NULL, who, sizeof who),
                                     persist_last_error(t->persist));
    }
    if (used < sizeof msg && kvcm_stalled(a->d->kvcm, kvcm_why, sizeof kvcm_why))
        snprintf(msg + used, sizeof msg - used, "; KVCM publisher stalled: %s", kvcm_why);
    admin_reply_text(req, HTTP_OK, "OK", msg);
}

static void admin_stats(struct admin *a, struct evhttp_request *req, struct evbuffer *b)
{
    json_t *doc = a->pages.stats_document ? a->pages.stats_document(a->d) : NULL;
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

static void admin_arm_deadline(struct admin_conn *ac);

static void admin_reply_sent_cb(struct evhttp_request *req, void *arg)
{
    (void)req;
    admin_arm_deadline(arg);   /* the next request on this connection */
}

/* The request arrived whole: its deadline stops; the next one's starts when
 * the reply has been sent. A linear search, over at most
 * admin.max_connections. */
static void admin_request_arrived(struct admin *a, struct evhttp_request *req)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);

    for (struct admin_conn *ac = a->conns; ac; ac = ac->next) {
        if (ac->evcon == evcon) {
            evtimer_del(ac->deadline);
            evhttp_request_set_on_complete_cb(req, admin_reply_sent_cb, ac);
            return;
        }
    }
}

static void admin_request_cb(struct evhttp_request *req, void *arg)
{
    struct admin *a = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    struct evbuffer *b;

    admin_request_arrived(a, req);
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

/* ---- connections: cap, descriptor reserve, request deadline ------------------ */

static void admin_arm_deadline(struct admin_conn *ac)
{
    uint32_t ms = ac->a->d->cfg->admin_request_timeout_ms;
    struct timeval tv = { .tv_sec = (time_t)(ms / 1000u), .tv_usec = (suseconds_t)((ms % 1000u) * 1000u) };
    evtimer_add(ac->deadline, &tv);
}

/* evhttp frees the connection (any reason, our deadline included). */
static void admin_conn_closed_cb(struct evhttp_connection *evcon, void *arg)
{
    struct admin_conn *ac = arg;
    struct admin *a = ac->a;

    evhttp_connection_set_closecb(evcon, NULL, NULL);
    if (ac->prev)
        ac->prev->next = ac->next;
    else
        a->conns = ac->next;
    if (ac->next)
        ac->next->prev = ac->prev;
    a->nconns--;
    event_free(ac->deadline);
    free(ac);
}

/* admin.request_timeout passed before the request was complete: however
 * steadily its bytes trickle in, the connection is closed. */
static void admin_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    struct admin_conn *ac = arg;
    (void)fd;
    (void)what;
    ac->a->timed_out++;
    log_debug("admin: closing a connection whose request did not arrive within %u ms (admin.request_timeout)",
              ac->a->d->cfg->admin_request_timeout_ms);
    evhttp_connection_free(ac->evcon);   /* admin_conn_closed_cb frees ac */
}

/* Why a new connection on descriptor fd cannot be served, or NULL. */
static const char *admin_refusal(struct admin *a, int fd, bool *reserve, char *why, size_t len)
{
    struct rlimit rl;

    *reserve = false;
    if (a->stopping)
        return "kvnoded is shutting down";
    if (a->nconns >= a->d->cfg->admin_max_connections) {
        snprintf(why, len, "too many admin connections (admin.max_connections = %u); try again later",
                 a->d->cfg->admin_max_connections);
        return why;
    }
    /* Descriptors are handed out lowest first, so a descriptor this high
     * means nearly all below it are taken. */
    if (fd >= 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t keep = rl.rlim_cur / 4 < ADMIN_FD_RESERVE ? rl.rlim_cur / 4 : ADMIN_FD_RESERVE;
        if ((rlim_t)fd + keep >= rl.rlim_cur) {
            *reserve = true;
            snprintf(why, len, "kvnoded is short of descriptors (RLIMIT_NOFILE %llu; the last %llu are kept "
                     "for engines); try again later", (unsigned long long)rl.rlim_cur, (unsigned long long)keep);
            return why;
        }
    }
    return NULL;
}

/* Answer 503 on the raw socket (best effort). What the client sent is read
 * first, so that closing sends FIN, not a reset that may discard the
 * answer. */
static void admin_send_503(int fd, const char *why)
{
    char drop[4096], head[256];
    int n;

    for (int i = 0; i < 4 && recv(fd, drop, sizeof drop, MSG_DONTWAIT) > 0; i++) {}
    n = snprintf(head, sizeof head, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                 "Cache-Control: no-store\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n", strlen(why) + 1);
    if (n > 0 && send(fd, head, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n) {
        ssize_t w = send(fd, why, strlen(why), MSG_NOSIGNAL | MSG_DONTWAIT);
        w = send(fd, "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
    }
}

static void admin_adopt(struct admin *a, struct admin_conn *ac)
{
    struct bufferevent *bev = ac->bev;
    void *evcon = NULL;
    char buf[256], note[64];
    const char *why;
    bool reserve;
    int fd = (int)bufferevent_getfd(bev);
    uint64_t held = 0;

    ac->bev = NULL;
    bufferevent_getcb(bev, NULL, NULL, NULL, &evcon);
    if (!evcon) {   /* evhttp gave up on it already (and cleared its callbacks) */
        bufferevent_decref(bev);
        free(ac);
        return;
    }
    ac->evcon = evcon;
    if (a->accept_pauses_episode) {
        log_info("accepting admin connections on %s again after %llu pause%s", a->address,
                 (unsigned long long)a->accept_pauses_episode, a->accept_pauses_episode == 1 ? "" : "s");
        a->accept_pauses_episode = 0;
    }
    why = admin_refusal(a, fd, &reserve, buf, sizeof buf);
    if (!why && !(ac->deadline = evtimer_new(a->d->base, admin_deadline_cb, ac)))
        why = "out of memory";
    if (why) {
        a->refused++;
        a->refused_reserve += reserve;
        if (log_limit_pass(&a->refuse_log, clock_now_ms(), ADMIN_LOG_REPEAT_MS, &held))
            log_warn("admin: refused a connection: %s%s", why, log_limit_note(held, "refused", note, sizeof note));
        if (fd >= 0)
            admin_send_503(fd, why);
        evhttp_connection_free(ac->evcon);
        bufferevent_decref(bev);   /* the last reference: closes fd */
        free(ac);
        return;
    }
    ac->next = a->conns;
    if (a->conns)
        a->conns->prev = ac;
    a->conns = ac;
    a->nconns++;
    a->accepted++;
    evhttp_connection_set_closecb(ac->evcon, admin_conn_closed_cb, ac);
    admin_arm_deadline(ac);
    bufferevent_decref(bev);
}

static void admin_adopt_cb(evutil_socket_t fd, short what, void *arg)
{
    struct admin *a = arg;
    struct admin_conn *ac;
    (void)fd;
    (void)what;
    while ((ac = a->fresh) != NULL) {
        a->fresh = ac->next;
        if (!a->fresh)
            a->fresh_tail = NULL;
        ac->next = NULL;
        admin_adopt(a, ac);
    }
}

/* evhttp accepted a connection and wants its bufferevent. */
static struct bufferevent *admin_new_bev_cb(struct event_base *base, void *arg)
{
    struct admin *a = arg;
    struct admin_conn *ac = calloc(1, sizeof *ac);
    struct bufferevent *bev = ac ? bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE) : NULL;

    if (!bev) {
        free(ac);
        return NULL;
    }
    bufferevent_incref(bev);   /* evhttp may free it before we adopt it */
    ac->a = a;
    ac->bev = bev;
    if (a->fresh_tail)
        a->fresh_tail->next = ac;
    else
        a->fresh = ac;
    a->fresh_tail = ac;
    event_active(a->adopt_ev, 0, 0);
    return bev;
}

static void admin_accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    struct admin *a = arg;
    (void)fd;
    (void)what;
    if (a->bound && !a->stopping)
        evconnlistener_enable(evhttp_bound_socket_get_listener(a->bound));
}

/* accept failed (EMFILE and the like): the connection stays in the backlog
 * and the socket readable, so retrying at once would spin. Rest instead. */
static void admin_accept_error_cb(struct evconnlistener *l, void *arg)
{
    struct admin *a = admin_listening;
    int err = EVUTIL_SOCKET_ERROR();
    struct timeval tv = { .tv_sec = 0, .tv_usec = ADMIN_ACCEPT_PAUSE_MS * 1000 };
    struct rlimit rl = { 0 };
    uint64_t held = 0;
    char note[64];
    (void)arg;

    evconnlistener_disable(l);
    if (!a)
        return;
    evtimer_add(a->accept_resume_ev, &tv);
    a->accept_pauses++;
    a->accept_pauses_episode++;
    if (!log_limit_pass(&a->accept_log, clock_now_ms(), ADMIN_LOG_REPEAT_MS, &held))
        return;
    getrlimit(RLIMIT_NOFILE, &rl);
    log_warn("admin: cannot accept connections on %s: %s; pausing the listener %u ms at a time until it works "
             "again (RLIMIT_NOFILE %llu)%s", a->address, strerror(err), ADMIN_ACCEPT_PAUSE_MS,
             (unsigned long long)rl.rlim_cur, log_limit_note(held, "pauses", note, sizeof note));
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
    const struct config_listen *l = &d->cfg->admin_listen_addr;   /* parsed with the config */
    struct admin *a;

    *out = NULL;
    if (l->kind == CONFIG_LISTEN_OFF)
        return 0;
    a = calloc(1, sizeof *a);
    if (!a || !(a->http = evhttp_new(d->base))) {
        free(a);
        errmsg_set(err, errlen, "admin: out of memory");
        return -1;
    }
    a->d = d;
    a->adopt_ev = event_new(d->base, -1, 0, admin_adopt_cb, a);
    a->accept_resume_ev = evtimer_new(d->base, admin_accept_resume_cb, a);
    if (!a->adopt_ev || !a->accept_resume_ev) {
        admin_destroy(a);
        errmsg_set(err, errlen, "admin: out of memory");
        return -1;
    }
    evhttp_set_bevcb(a->http, admin_new_bev_cb, a);
    evhttp_set_timeout(a->http, ADMIN_IDLE_TIMEOUT_S);
    evhttp_set_max_headers_size(a->http, ADMIN_MAX_HEADERS);
    evhttp_set_max_body_size(a->http, ADMIN_MAX_BODY);
    /* Let every method reach the callback, which answers 405 itself. */
    evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH |
                                            EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT);
    evhttp_set_gencb(a->http, admin_request_cb, a);
    errno = 0;
    int rc = l->kind == CONFIG_LISTEN_UNIX ? admin_listen_unix(a, l->path, d->cfg->socket_mode, err, errlen)
                                           : admin_listen_tcp(a, l->host, l->port, err, errlen);
    if (rc < 0) {
        admin_destroy(a);
        return -1;
    }
    admin_listening = a;
    evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(a->bound), admin_accept_error_cb);
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
        evtimer_del(a->accept_resume_ev);
        evhttp_del_accept_socket(a->http, a->bound);
        a->bound = NULL;
    }
}

void admin_destroy(struct admin *a)
{
    struct admin_conn *ac;

    if (!a)
        return;
    if (a->http)
        evhttp_free(a->http);   /* closes listeners and connections (admin_conn_closed_cb) */
    while ((ac = a->fresh) != NULL) {
        a->fresh = ac->next;
        bufferevent_decref(ac->bev);
        free(ac);
    }
    if (a->adopt_ev)
        event_free(a->adopt_ev);
    if (a->accept_resume_ev)
        event_free(a->accept_resume_ev);
    if (a->unix_owned)
        unlink(a->path);
    if (admin_listening == a)
        admin_listening = NULL;
    free(a);
}

void admin_set_pages(struct admin *a, const struct admin_pages *pages)
{
    if (a)
        a->pages = *pages;
}

void admin_get_stats(const struct admin *a, struct admin_stats *out)
{
    *out = (struct admin_stats){
        .open = a->nconns, .max = a->d->cfg->admin_max_connections, .accepted = a->accepted,
        .refused = a->refused, .refused_reserve = a->refused_reserve, .timed_out = a->timed_out,
        .accept_pauses = a->accept_pauses,
    };
}

const char *admin_address(const struct admin *a)
{
    return a->address;
}
