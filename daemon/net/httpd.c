/* httpd: an evhttp server with the bounds evhttp lacks (see httpd.h). */
#include "net/httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "core/log.h"
#include "net/httpd_internal.h"
#include "net/unix_listen.h"

struct httpd *httpd_servers[HTTPD_MAX_SERVERS];

struct httpd_limits httpd_limits_now(const struct httpd *h)
{
    struct httpd_limits l = { 0 };
    h->limits(h->limits_arg, &l);
    return l;
}

static struct httpd_conn **httpd_bucket(struct httpd *h, const struct evhttp_connection *evcon)
{
    uintptr_t x = (uintptr_t)evcon;
    return &h->buckets[((x >> 4) * 0x9e3779b97f4a7c15ull) >> 54 & (HTTPD_BUCKETS - 1)];
}

/* ---- connections: cap, descriptor reserve, request deadline ------------------ */

static void httpd_arm_deadline(struct httpd_conn *hc)
{
    uint32_t ms = httpd_limits_now(hc->h).request_timeout_ms;
    struct timeval tv = { .tv_sec = (time_t)(ms / 1000u), .tv_usec = (suseconds_t)((ms % 1000u) * 1000u) };
    evtimer_add(hc->deadline, &tv);
}

static void httpd_reply_sent_cb(struct evhttp_request *req, void *arg)
{
    (void)req;
    httpd_arm_deadline(arg);   /* the next request on this connection */
}

void httpd_request_arrived(struct httpd *h, struct evhttp_request *req)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);

    for (struct httpd_conn *hc = *httpd_bucket(h, evcon); hc; hc = hc->next) {
        if (hc->evcon == evcon) {
            evtimer_del(hc->deadline);
            hc->input_over = false;   /* it arrived whole in the same read: it is served */
            httpd_input_forget(hc);
            evhttp_request_set_on_complete_cb(req, httpd_reply_sent_cb, hc);
            return;
        }
    }
}

struct httpd_conn *httpd_conn_find(struct httpd *h, const struct evhttp_connection *evcon)
{
    struct httpd_conn *hc = evcon ? *httpd_bucket(h, evcon) : NULL;
    while (hc && hc->evcon != evcon)
        hc = hc->next;
    return hc;
}

const struct httpd_peer *httpd_request_peer(struct httpd *h, struct evhttp_request *req)
{
    struct httpd_conn *hc = h->identify ? httpd_conn_find(h, evhttp_request_get_connection(req)) : NULL;
    return hc ? &hc->peer : NULL;
}

/* End hc's watch; tell its owner when the connection is closing. */
static void httpd_watch_end(struct httpd_conn *hc, bool closing)
{
    struct evhttp_request *req = hc->watched;
    httpd_gone_fn gone = hc->gone;

    if (hc->leave_ev)
        event_free(hc->leave_ev);
    hc->leave_ev = NULL;
    hc->watched = NULL;
    hc->gone = NULL;
    if (!closing || !req)
        return;
    gone(hc->gone_arg);
    /* evhttp frees the requests of a connection it frees, but not one it
     * detached from it first (a read error before the answer): ours then. */
    if (!evhttp_request_get_connection(req))
        evhttp_request_free(req);
}

/* A watched request's connection became readable: the client closed its end
 * (EOF or an error), or sent more (pipelined: it is still there, and its
 * end cannot be seen past those bytes, so the watch for it stops). */
static void httpd_leave_cb(evutil_socket_t fd, short what, void *arg)
{
    struct httpd_conn *hc = arg;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    (void)what;

    if (n > 0)
        return;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        event_add(hc->leave_ev, NULL);
        return;
    }
    log_debug("%s: the client of a waiting request closed its connection; closing it", hc->h->name);
    evhttp_connection_free(hc->evcon);   /* httpd_conn_closed_cb tells the owner, frees hc */
}

int httpd_request_watch(struct httpd *h, struct evhttp_request *req, httpd_gone_fn gone, void *arg)
{
    struct httpd_conn *hc = httpd_conn_find(h, evhttp_request_get_connection(req));
    struct bufferevent *bev = hc ? evhttp_connection_get_bufferevent(hc->evcon) : NULL;
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;

    if (!hc || hc->watched)
        return -1;
    /* evhttp does not read the connection while the request waits for its
     * answer: this event sees the client leave. Without it (no memory), the
     * owner still hears of a close, only later. */
    if (fd >= 0 && (hc->leave_ev = event_new(h->base, fd, EV_READ, httpd_leave_cb, hc)) != NULL)
        event_add(hc->leave_ev, NULL);
    hc->watched = req;
    hc->gone = gone;
    hc->gone_arg = arg;
    return 0;
}

void httpd_request_unwatch(struct httpd *h, struct evhttp_request *req)
{
    struct httpd_conn *hc = httpd_conn_find(h, evhttp_request_get_connection(req));
    if (hc && hc->watched == req)
        httpd_watch_end(hc, false);
}

/* evhttp frees the connection (any reason, our deadline included). */
static void httpd_conn_closed_cb(struct evhttp_connection *evcon, void *arg)
{
    struct httpd_conn *hc = arg;
    struct httpd *h = hc->h;

    evhttp_connection_set_closecb(evcon, NULL, NULL);
    if (hc->watched)
        httpd_watch_end(hc, true);
    for (struct httpd_conn **p = httpd_bucket(h, evcon); *p; p = &(*p)->next) {
        if (*p == hc) {
            *p = hc->next;
            break;
        }
    }
    h->nconns--;
    httpd_output_forget(hc);
    if (hc->input_cb && evhttp_connection_get_bufferevent(evcon))
        evbuffer_remove_cb_entry(bufferevent_get_input(evhttp_connection_get_bufferevent(evcon)), hc->input_cb);
    httpd_input_forget(hc);
    if (hc->admitted)
        h->release(h->admit_arg, hc->token);
    event_free(hc->deadline);
    free(hc);
}

/* The request deadline passed before the request was complete: however
 * steadily its bytes trickle in, the connection is closed. */
static void httpd_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    struct httpd_conn *hc = arg;
    (void)fd;
    (void)what;
    if (hc->input_over) {
        struct bufferevent *bev = evhttp_connection_get_bufferevent(hc->evcon);
        log_debug("%s: closing a connection with 503: %s", hc->h->name, hc->input_why);
        if (bev && bufferevent_getfd(bev) >= 0)
            httpd_send_503((int)bufferevent_getfd(bev), hc->input_why);
        evhttp_connection_free(hc->evcon);   /* httpd_conn_closed_cb frees hc */
        return;
    }
    hc->h->timed_out++;
    log_debug("%s: closing a connection whose request did not arrive within %u ms", hc->h->name,
              httpd_limits_now(hc->h).request_timeout_ms);
    evhttp_connection_free(hc->evcon);   /* httpd_conn_closed_cb frees hc */
}

/* Why a new connection on descriptor fd cannot be served, or NULL. */
static const char *httpd_refusal(struct httpd *h, int fd, bool *reserve, char *why, size_t len)
{
    struct httpd_limits lim = httpd_limits_now(h);
    uint64_t now = clock_now_ms();

    *reserve = false;
    if (h->stopping)
        return "kvnoded is shutting down";
    if (h->nconns >= lim.max_connections) {
        snprintf(why, len, "too many %s connections (%s = %u); try again later", h->name,
                 lim.max_connections_option ? lim.max_connections_option : "max_connections",
                 lim.max_connections);
        return why;
    }
    /* Descriptors are handed out lowest first, so a descriptor this high
     * means nearly all below it are taken. */
    if (fd >= 0 && (h->nofile_ms == 0 || now - h->nofile_ms >= HTTPD_RLIMIT_MS)) {
        if (getrlimit(RLIMIT_NOFILE, &h->nofile) != 0)
            h->nofile.rlim_cur = RLIM_INFINITY;
        h->nofile_ms = now ? now : 1;
    }
    const struct rlimit rl = h->nofile;
    if (fd >= 0 && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t keep = rl.rlim_cur / 4 < HTTPD_FD_RESERVE ? rl.rlim_cur / 4 : HTTPD_FD_RESERVE;
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
void httpd_send_503(int fd, const char *why)
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

/* Refuse hc at accept: counted, logged (rate-limited), 503 on the socket,
 * closed. */
static void httpd_refuse(struct httpd *h, struct httpd_conn *hc, struct bufferevent *bev, int fd, const char *why)
{
    char note[64];
    uint64_t held = 0;

    h->refused++;
    if (log_limit_pass(&h->refuse_log, clock_now_ms(), HTTPD_LOG_REPEAT_MS, &held))
        log_warn("%s: refused a connection: %s%s", h->name, why, log_limit_note(held, "refused", note, sizeof note));
    if (fd >= 0)
        httpd_send_503(fd, why);
    if (hc->deadline)
        event_free(hc->deadline);
    evhttp_connection_free(hc->evcon);
    bufferevent_decref(bev);   /* the last reference: closes fd */
    free(hc);
}

static void httpd_adopt(struct httpd *h, struct httpd_conn *hc)
{
    struct bufferevent *bev = hc->bev;
    void *evcon = NULL;
    char buf[256];
    const char *why;
    bool reserve;
    int fd = (int)bufferevent_getfd(bev);

    hc->bev = NULL;
    bufferevent_getcb(bev, NULL, NULL, NULL, &evcon);
    if (!evcon) {   /* evhttp gave up on it already (and cleared its callbacks) */
        bufferevent_decref(bev);
        free(hc);
        return;
    }
    hc->evcon = evcon;
    if (h->accept_pauses_episode) {
        log_info("accepting %s connections on %s again after %llu pause%s", h->name, h->address,
                 (unsigned long long)h->accept_pauses_episode, h->accept_pauses_episode == 1 ? "" : "s");
        h->accept_pauses_episode = 0;
    }
    why = httpd_refusal(h, fd, &reserve, buf, sizeof buf);
    if (!why && !(hc->deadline = evtimer_new(h->base, httpd_deadline_cb, hc)))
        why = "out of memory";
    if (why) {
        h->refused_reserve += reserve;
        httpd_refuse(h, hc, bev, fd, why);
        return;
    }
    if (h->identify)
        h->identify(h->identify_arg, fd, &hc->peer);
    hc->group = HTTPD_NO_GROUP;
    if (h->admit) {
        if (h->admit(h->admit_arg, fd, &hc->peer, &hc->token, &hc->group, buf, sizeof buf) < 0) {
            h->refused_owner++;
            httpd_refuse(h, hc, bev, fd, buf);
            return;
        }
        hc->admitted = true;
        if (hc->group >= HTTPD_MAX_GROUPS)
            hc->group = HTTPD_NO_GROUP;
    }
    struct httpd_conn **b = httpd_bucket(h, hc->evcon);
    hc->next = *b;
    *b = hc;
    h->nconns++;
    h->accepted++;
    evhttp_connection_set_closecb(hc->evcon, httpd_conn_closed_cb, hc);
    /* A reply in one write: each piece wakes the client again. */
    bufferevent_set_max_single_write(bev, HTTPD_MAX_SINGLE_WRITE);
    hc->output_cb = evbuffer_add_cb(bufferevent_get_output(bev), httpd_output_cb, hc);
    hc->input_cb = evbuffer_add_cb(bufferevent_get_input(bev), httpd_input_cb, hc);
    httpd_arm_deadline(hc);
    httpd_read_early(hc);
    bufferevent_decref(bev);
}

static void httpd_adopt_cb(evutil_socket_t fd, short what, void *arg)
{
    struct httpd *h = arg;
    struct httpd_conn *hc;
    (void)fd;
    (void)what;
    while ((hc = h->fresh) != NULL) {
        h->fresh = hc->next;
        if (!h->fresh)
            h->fresh_tail = NULL;
        hc->next = NULL;
        httpd_adopt(h, hc);
    }
}

/* evhttp accepted a connection and wants its bufferevent. */
static struct bufferevent *httpd_new_bev_cb(struct event_base *base, void *arg)
{
    struct httpd *h = arg;
    struct httpd_conn *hc = calloc(1, sizeof *hc);
    struct bufferevent *bev = hc ? bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE) : NULL;

    if (!bev) {
        free(hc);
        return NULL;
    }
    bufferevent_incref(bev);   /* evhttp may free it before we adopt it */
    hc->h = h;
    hc->bev = bev;
    if (h->fresh_tail)
        h->fresh_tail->next = hc;
    else
        h->fresh = hc;
    h->fresh_tail = hc;
    event_active(h->adopt_ev, 0, 0);
    return bev;
}

static void httpd_accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    struct httpd *h = arg;
    (void)fd;
    (void)what;
    if (h->bound && !h->stopping)
        evconnlistener_enable(evhttp_bound_socket_get_listener(h->bound));
}

/* accept failed (EMFILE and the like): the connection stays in the backlog
 * and the socket readable, so retrying at once would spin. Rest instead. */
static void httpd_accept_error_cb(struct evconnlistener *l, void *arg)
{
    struct httpd *h = NULL;
    int err = EVUTIL_SOCKET_ERROR();
    struct timeval tv = { .tv_sec = 0, .tv_usec = HTTPD_ACCEPT_PAUSE_MS * 1000 };
    struct rlimit rl = { 0 };
    uint64_t held = 0;
    char note[64];

    evconnlistener_disable(l);
    for (size_t i = 0; i < HTTPD_MAX_SERVERS && !h; i++)
        if (httpd_servers[i] && (void *)httpd_servers[i]->http == arg)
            h = httpd_servers[i];
    if (!h)
        return;
    evtimer_add(h->accept_resume_ev, &tv);
    h->accept_pauses++;
    h->accept_pauses_episode++;
    if (!log_limit_pass(&h->accept_log, clock_now_ms(), HTTPD_LOG_REPEAT_MS, &held))
        return;
    getrlimit(RLIMIT_NOFILE, &rl);
    log_warn("%s: cannot accept connections on %s: %s; pausing the listener %u ms at a time until it works "
             "again (RLIMIT_NOFILE %llu)%s", h->name, h->address, strerror(err), HTTPD_ACCEPT_PAUSE_MS,
             (unsigned long long)rl.rlim_cur, log_limit_note(held, "pauses", note, sizeof note));
}

/* ---- listeners --------------------------------------------------------------- */

/* A unix socket at path, replacing a stale file but never a live listener. */
static int httpd_listen_unix(struct httpd *h, const char *what, const char *path, unsigned mode, char *err,
                             size_t errlen)
{
    char label[CONFIG_LISTEN_MAX + 64];
    int fd;

    snprintf(label, sizeof label, "%s unix:%s", what, path);
    if ((fd = unix_listen(path, mode, 128, label, err, errlen)) < 0)
        return -1;
    snprintf(h->path, sizeof h->path, "%s", path);
    h->unix_owned = true;
    h->bound = evhttp_accept_socket_with_handle(h->http, fd);
    if (!h->bound) {
        errmsg_set(err, errlen, "%s: cannot accept on it", label);
        close(fd);
        return -1;
    }
    snprintf(h->address, sizeof h->address, "unix:%s", path);
    return 0;
}

static int httpd_listen_tcp(struct httpd *h, const char *what, const char *host, uint16_t port, char *err,
                            size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN];
    int fd;

    errno = 0;
    h->bound = evhttp_bind_socket_with_handle(h->http, host, port);
    if (!h->bound) {
        errmsg_set(err, errlen, "%s %s:%u: cannot bind (%s)", what, host, (unsigned)port,
                   errno ? strerror(errno) : "address in use or unavailable");
        return -1;
    }
    fd = evhttp_bound_socket_get_fd(h->bound);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        errmsg_set(err, errlen, "%s: getsockname: %s", what, strerror(errno));
        return -1;
    }
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof ip);
        snprintf(h->address, sizeof h->address, "[%s]:%u", ip, (unsigned)ntohs(s6->sin6_port));
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof ip);
        snprintf(h->address, sizeof h->address, "%s:%u", ip, (unsigned)ntohs(s4->sin_port));
    }
    return 0;
}

int httpd_create(struct event_base *base, const char *name, const char *what, const struct config_listen *l,
                 unsigned socket_mode, httpd_limits_fn limits, void *limits_arg, struct httpd **out,
                 char *err, size_t errlen)
{
    struct httpd *h = calloc(1, sizeof *h);
    size_t slot = 0;

    *out = NULL;
    while (slot < HTTPD_MAX_SERVERS && httpd_servers[slot])
        slot++;
    if (!h || slot == HTTPD_MAX_SERVERS || !(h->http = evhttp_new(base))) {
        free(h);
        errmsg_set(err, errlen, "%s: out of memory", name);
        return -1;
    }
    h->base = base;
    h->limits = limits;
    h->limits_arg = limits_arg;
    snprintf(h->name, sizeof h->name, "%s", name);
    h->adopt_ev = event_new(base, -1, 0, httpd_adopt_cb, h);
    h->accept_resume_ev = evtimer_new(base, httpd_accept_resume_cb, h);
    h->trim_ev = evtimer_new(base, httpd_trim_cb, h);
    if (!h->adopt_ev || !h->accept_resume_ev || !h->trim_ev) {
        httpd_destroy(h);
        errmsg_set(err, errlen, "%s: out of memory", name);
        return -1;
    }
    evhttp_set_bevcb(h->http, httpd_new_bev_cb, h);
    int rc = l->kind == CONFIG_LISTEN_UNIX ? httpd_listen_unix(h, what, l->path, socket_mode, err, errlen)
                                           : httpd_listen_tcp(h, what, l->host, l->port, err, errlen);
    if (rc < 0) {
        httpd_destroy(h);
        return -1;
    }
    httpd_servers[slot] = h;
    evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(h->bound), httpd_accept_error_cb);
    *out = h;
    return 0;
}

struct evhttp *httpd_evhttp(struct httpd *h) { return h->http; }

void httpd_set_identify(struct httpd *h, httpd_identify_fn fn, void *arg)
{
    h->identify = fn;
    h->identify_arg = arg;
}
void httpd_set_admit(struct httpd *h, httpd_admit_fn admit, httpd_release_fn release, void *arg)
{
    h->admit = admit;
    h->release = release;
    h->admit_arg = arg;
}
void httpd_set_group_output(struct httpd *h, httpd_group_output_fn fn, void *arg)
{
    h->group_output = fn;
    h->group_output_arg = arg;
}
void httpd_set_group_input(struct httpd *h, httpd_group_output_fn fn, void *arg)
{
    h->group_input = fn;
    h->group_input_arg = arg;
}
const char *httpd_address(const struct httpd *h) { return h->address; }
bool httpd_stopping(const struct httpd *h) { return h->stopping; }

void httpd_begin_shutdown(struct httpd *h)
{
    if (!h || h->stopping)
        return;
    h->stopping = true;
    if (h->bound) {
        evtimer_del(h->accept_resume_ev);
        evhttp_del_accept_socket(h->http, h->bound);
        h->bound = NULL;
    }
}

void httpd_destroy(struct httpd *h)
{
    struct httpd_conn *hc;

    if (!h)
        return;
    if (h->http)
        evhttp_free(h->http);   /* closes listeners and connections (httpd_conn_closed_cb) */
    while ((hc = h->fresh) != NULL) {
        h->fresh = hc->next;
        bufferevent_decref(hc->bev);
        free(hc);
    }
    if (h->adopt_ev)
        event_free(h->adopt_ev);
    if (h->accept_resume_ev)
        event_free(h->accept_resume_ev);
    if (h->trim_ev)
        event_free(h->trim_ev);
    if (h->unix_owned)
        unlink(h->path);
    for (size_t i = 0; i < HTTPD_MAX_SERVERS; i++)
        if (httpd_servers[i] == h)
            httpd_servers[i] = NULL;
    free(h);
}

void httpd_get_stats(const struct httpd *h, struct httpd_stats *out)
{
    *out = (struct httpd_stats){
        .open = h->nconns, .max = httpd_limits_now(h).max_connections, .accepted = h->accepted,
        .refused = h->refused, .refused_reserve = h->refused_reserve, .refused_owner = h->refused_owner,
        .timed_out = h->timed_out, .output_bytes = h->output_bytes, .output_refused = h->output_refused,
        .output_max = httpd_limits_now(h).max_output_total_bytes, .output_refused_group = h->output_refused_group,
        .accept_pauses = h->accept_pauses, .input_bytes = h->input_bytes, .input_refused = h->input_refused,
        .input_max = httpd_limits_now(h).max_input_total_bytes, .input_refused_group = h->input_refused_group,
        .replies_inline = h->replies_inline, .reads_extended = h->reads_extended, .reads_early = h->reads_early,
    };
}
