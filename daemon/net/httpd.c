/* httpd: an evhttp server with the bounds evhttp lacks (see httpd.h). */
#include "net/httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <malloc.h>
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
#include "net/unix_listen.h"

/* accept failing (out of descriptors): the listener rests this long. */
#define HTTPD_ACCEPT_PAUSE_MS 100u
/* Descriptors connections leave to the engine socket: a connection whose
 * descriptor is within this many of RLIMIT_NOFILE is refused (a quarter of
 * the limit when that is smaller). */
#define HTTPD_FD_RESERVE     64u
#define HTTPD_LOG_REPEAT_MS  10000u
#define HTTPD_BUCKETS        1024u    /* connection lookup by evhttp_connection */
#define HTTPD_MAX_SERVERS    8
/* Once this many reply bytes were held and all are gone, free memory is
 * handed back to the kernel (malloc_trim), at most once per interval. */
#define HTTPD_TRIM_BYTES     (4u << 20)
#define HTTPD_TRIM_MS        1000u
/* Bytes of a reply written per loop turn (libevent's default is 16 KiB). */
#define HTTPD_MAX_SINGLE_WRITE (256u << 10)
/* RLIMIT_NOFILE is read again at most this often (one system call less per
 * accepted connection). */
#define HTTPD_RLIMIT_MS      1000u

/* One connection, from the moment evhttp accepted it. evhttp 2.1 has no
 * connection limit and no hook on accept, so: evhttp asks us for each new
 * connection's bufferevent (evhttp_set_bevcb), we queue it as fresh and,
 * from the loop right after evhttp's accept callback returns, count the
 * connection or refuse it (httpd_adopt). The bufferevent's callback
 * argument is its evhttp_connection. */
struct httpd_conn {
    struct httpd *h;
    struct bufferevent *bev;          /* fresh: our reference, until adopted */
    struct evhttp_connection *evcon;  /* adopted */
    struct event *deadline;           /* for the request being received */
    struct httpd_conn *next;          /* fresh queue, then its bucket's chain */
    struct httpd_peer peer;           /* from the identify hook, at accept */
    bool admitted;                    /* by the admit hook: release token at close */
    void *token;
    struct evbuffer_cb_entry *output_cb; /* counts the output buffer's bytes */
    struct evbuffer_cb_entry *input_cb;  /* counts the bytes read of the request being received */
    uint64_t input;                   /* bytes read since its request began */
    bool input_over;                  /* over the input bound: the deadline event answers 503, closes */
    char input_why[384];
    uint64_t output;                  /* bytes in it */
    uint32_t group;                   /* the admit hook's, or HTTPD_NO_GROUP */
    /* httpd_request_watch: the owner of a request that waits is told once if
     * the connection closes first; leave_ev sees the client leave. */
    struct evhttp_request *watched;
    httpd_gone_fn gone;
    void *gone_arg;
    struct event *leave_ev;
};

struct httpd {
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;   /* NULL once shutdown began */
    bool stopping;
    bool unix_owned;                     /* we created path: unlink it */
    char name[32];
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char address[CONFIG_LISTEN_MAX + 16];
    httpd_limits_fn limits;
    void *limits_arg;
    httpd_identify_fn identify;          /* NULL: connections are not identified */
    void *identify_arg;
    httpd_admit_fn admit;                /* NULL: only the total is counted */
    httpd_release_fn release;
    void *admit_arg;
    httpd_group_output_fn group_output;  /* NULL: groups are not bounded */
    void *group_output_arg;
    struct httpd_conn *fresh, *fresh_tail; /* accepted by evhttp, not yet adopted, oldest first */
    struct event *adopt_ev;
    struct httpd_conn *buckets[HTTPD_BUCKETS]; /* adopted and open, by evcon */
    size_t nconns;
    struct event *accept_resume_ev;      /* the paused listener tries again */
    struct event *trim_ev;               /* malloc_trim after replies were freed */
    uint64_t accept_pauses_episode;      /* pauses since accepting last worked */
    struct log_limit accept_log, refuse_log;
    uint64_t accepted, refused, refused_reserve, refused_owner, timed_out, accept_pauses;
    uint64_t output_bytes, output_peak, output_refused;   /* peak: since the last trim */
    uint64_t group_bytes[HTTPD_MAX_GROUPS];               /* output_bytes of each group's connections */
    uint64_t output_refused_group;
    httpd_group_output_fn group_input;   /* NULL: groups' input is not bounded */
    void *group_input_arg;
    uint64_t input_bytes, input_refused, input_refused_group;
    uint64_t input_group[HTTPD_MAX_GROUPS];               /* input_bytes of each group's connections */
    uint64_t trimmed_ms;
    struct rlimit nofile;                /* RLIMIT_NOFILE as of nofile_ms */
    uint64_t nofile_ms;
};

/* libevent calls a listener's error callback with the evhttp as argument,
 * not with ours: the servers by their evhttp. */
static struct httpd *httpd_servers[HTTPD_MAX_SERVERS];

static struct httpd_limits httpd_limits_now(const struct httpd *h)
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

static void httpd_send_503(int fd, const char *why);

/* c less n, never below 0 (a count that forgot nothing stays right). */
static void httpd_sub(uint64_t *c, uint64_t n)
{
    *c -= n < *c ? n : *c;
}

/* ---- requests being received: counted from each connection's input buffer ------ */

/* hc's request arrived whole, or hc closes: its bytes are no longer being
 * received (the body is its request's, bounded by the owner from here). */
static void httpd_input_forget(struct httpd_conn *hc)
{
    struct httpd *h = hc->h;
    httpd_sub(&h->input_bytes, hc->input);
    if (hc->group < HTTPD_MAX_GROUPS)
        httpd_sub(&h->input_group[hc->group], hc->input);
    hc->input = 0;
}

/* Why hc, having read more, is over the bound of all requests being
 * received or its group's share of it; false when it is not. */
static bool httpd_input_over(struct httpd_conn *hc, char *why, size_t whylen)
{
    struct httpd *h = hc->h;
    struct httpd_limits lim = httpd_limits_now(h);
    const char *opt = lim.max_input_total_option ? lim.max_input_total_option : "max_input_total_bytes";
    char who[96] = "";

    if (!lim.max_input_total_bytes)
        return false;
    if (h->input_bytes > lim.max_input_total_bytes) {
        snprintf(why, whylen, "%llu bytes of requests are being received, more than %s (%llu); try again later",
                 (unsigned long long)h->input_bytes, opt, (unsigned long long)lim.max_input_total_bytes);
        return true;
    }
    if (hc->group >= HTTPD_MAX_GROUPS || !h->group_input)
        return false;
    uint64_t held = h->input_group[hc->group];
    uint64_t bound = h->group_input(h->group_input_arg, hc->group, who, sizeof who);
    if (bound == UINT64_MAX || held <= bound)
        return false;
    h->input_refused_group++;
    snprintf(why, whylen, "%llu bytes of requests from %s are being received, more than its share of %s (%llu of "
             "%llu bytes); send fewer or smaller requests at once, or try again later", (unsigned long long)held, who,
             opt, (unsigned long long)bound, (unsigned long long)lim.max_input_total_bytes);
    return true;
}

/* Bytes read off hc's socket (evhttp then moves them into its request). A
 * connection that takes the bytes being received over their bound is
 * answered 503 and closed from the loop (not from inside evhttp's read). */
static void httpd_input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    struct httpd_conn *hc = arg;
    struct httpd *h = hc->h;
    (void)buf;
    if (!info->n_added || hc->input_over)
        return;
    hc->input += info->n_added;
    h->input_bytes += info->n_added;
    if (hc->group < HTTPD_MAX_GROUPS)
        h->input_group[hc->group] += info->n_added;
    if (!httpd_input_over(hc, hc->input_why, sizeof hc->input_why))
        return;
    h->input_refused++;
    hc->input_over = true;
    bufferevent_disable(evhttp_connection_get_bufferevent(hc->evcon), EV_READ);
    event_active(hc->deadline, EV_TIMEOUT, 1);   /* httpd_deadline_cb */
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

static struct httpd_conn *httpd_conn_find(struct httpd *h, const struct evhttp_connection *evcon)
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

/* ---- unsent replies: counted from each connection's output buffer ------------- */

static void httpd_output_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    struct httpd_conn *hc = arg;
    struct httpd *h = hc->h;
    (void)buf;
    hc->output += info->n_added;
    h->output_bytes += info->n_added;
    httpd_sub(&hc->output, info->n_deleted);
    httpd_sub(&h->output_bytes, info->n_deleted);
    if (hc->group < HTTPD_MAX_GROUPS) {
        h->group_bytes[hc->group] += info->n_added;
        httpd_sub(&h->group_bytes[hc->group], info->n_deleted);
    }
    if (h->output_bytes > h->output_peak)
        h->output_peak = h->output_bytes;
}

/* Much of what replies held is free again: hand it back to the kernel
 * (after evhttp has freed the closed connection's buffers). */
static void httpd_trim_cb(evutil_socket_t fd, short what, void *arg)
{
    struct httpd *h = arg;
    (void)fd;
    (void)what;
    malloc_trim(0);
    h->output_peak = h->output_bytes;
    h->trimmed_ms = clock_now_ms();
}

/* hc closes: its unsent bytes are no longer held. */
static void httpd_output_forget(struct httpd_conn *hc)
{
    struct httpd *h = hc->h;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(hc->evcon);
    uint64_t now = clock_now_ms();

    if (hc->output_cb && bev)
        evbuffer_remove_cb_entry(bufferevent_get_output(bev), hc->output_cb);
    hc->output_cb = NULL;
    httpd_sub(&h->output_bytes, hc->output);
    if (hc->group < HTTPD_MAX_GROUPS)
        httpd_sub(&h->group_bytes[hc->group], hc->output);
    hc->output = 0;
    if (h->trim_ev && h->output_peak >= HTTPD_TRIM_BYTES && h->output_bytes <= h->output_peak / 4 &&
        !evtimer_pending(h->trim_ev, NULL)) {
        uint64_t wait = now - h->trimmed_ms >= HTTPD_TRIM_MS ? 0 : HTTPD_TRIM_MS - (now - h->trimmed_ms);
        struct timeval tv = { .tv_sec = (time_t)(wait / 1000u), .tv_usec = (suseconds_t)(wait % 1000u * 1000u) };
        evtimer_add(h->trim_ev, &tv);
    }
}

/* The check of httpd_reply_room against hc's group's bound. */
static int httpd_group_room(struct httpd_conn *hc, size_t bytes, const struct httpd_limits *lim, char *why,
                            size_t whylen)
{
    struct httpd *h = hc->h;
    char who[96] = "";

    if (hc->group >= HTTPD_MAX_GROUPS || !h->group_output)
        return 0;
    uint64_t held = h->group_bytes[hc->group];
    uint64_t bound = h->group_output(h->group_output_arg, hc->group, who, sizeof who);
    if (bound == UINT64_MAX || (held <= bound && bytes <= bound - held))
        return 0;
    h->output_refused++;
    h->output_refused_group++;
    snprintf(why, whylen, "%llu bytes of replies to %s are waiting for their clients to read them; %zu more would "
             "be over its share of %s (%llu of %llu bytes); try again later", (unsigned long long)held, who, bytes,
             lim->max_output_total_option ? lim->max_output_total_option : "max_output_total_bytes",
             (unsigned long long)bound, (unsigned long long)lim->max_output_total_bytes);
    return 503;
}

int httpd_reply_room(struct evhttp_request *req, size_t bytes, char *why, size_t whylen)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct httpd_conn *hc = NULL;

    for (size_t i = 0; i < HTTPD_MAX_SERVERS && !hc; i++)
        if (httpd_servers[i])
            hc = httpd_conn_find(httpd_servers[i], evcon);
    if (!hc)
        return 0;
    struct httpd *h = hc->h;
    struct httpd_limits lim = httpd_limits_now(h);
    if (lim.max_output_bytes && hc->output + bytes > lim.max_output_bytes) {
        h->output_refused++;
        snprintf(why, whylen, "the reply would be %zu bytes, more than %s (%llu) lets one connection hold; ask for "
                 "fewer objects per request", bytes, lim.max_output_option ? lim.max_output_option : "max_output_bytes",
                 (unsigned long long)lim.max_output_bytes);
        return bytes > lim.max_output_bytes ? 413 : 503;
    }
    if (lim.max_output_total_bytes && h->output_bytes + bytes > lim.max_output_total_bytes) {
        h->output_refused++;
        snprintf(why, whylen, "%llu bytes of replies are waiting for their clients to read them; %zu more would be "
                 "over %s (%llu); try again later", (unsigned long long)h->output_bytes, bytes,
                 lim.max_output_total_option ? lim.max_output_total_option : "max_output_total_bytes",
                 (unsigned long long)lim.max_output_total_bytes);
        return 503;
    }
    return httpd_group_room(hc, bytes, &lim, why, whylen);
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
static void httpd_send_503(int fd, const char *why)
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
    };
}
