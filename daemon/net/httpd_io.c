/* httpd_io: the bytes of an httpd server's requests and replies (see
 * httpd.h): requests being received counted against their bounds and read
 * in as few loop turns as libevent allows, unsent replies counted against
 * theirs, and replies written in the turn they are made. */
#include "net/httpd_internal.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "core/clock.h"

/* c less n, never below 0 (a count that forgot nothing stays right). */
void httpd_sub(uint64_t *c, uint64_t n)
{
    *c -= n < *c ? n : *c;
}

/* ---- requests being received: counted from each connection's input buffer ------ */

/* hc's request arrived whole, or hc closes: its bytes are no longer being
 * received (the body is its request's, bounded by the owner from here). */
void httpd_input_forget(struct httpd_conn *hc)
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

/* libevent 2.1 reads a socket at most this many bytes at a time
 * (EVBUFFER_MAX_READ), one loop turn (epoll_wait, FIONREAD, readv) each: a
 * 20 KB request body took five turns. */
#define HTTPD_LIBEVENT_READ  4096u
/* What httpd_read_more reads in one go, at most. */
#define HTTPD_READ_MORE      (256u << 10)
/* What httpd_read_early reads, at most (a larger request goes on as usual). */
#define HTTPD_READ_EARLY     (64u << 10)

/* One readv of up to max bytes off fd into space reserved at buf's end,
 * committed (httpd_input_cb counts it): the bytes read, 0 at EOF, -1 when
 * nothing was (EAGAIN, an error, or buf's end frozen). *room: what was
 * reserved, so a read short of it says the socket is empty. */
static ssize_t httpd_readv_into(evutil_socket_t fd, struct evbuffer *buf, size_t max, size_t *room)
{
    struct evbuffer_iovec v[2];
    struct iovec iov[2];
    int nv = evbuffer_reserve_space(buf, (ev_ssize_t)max, v, 2);

    *room = 0;
    if (nv <= 0)
        return -1;
    for (int i = 0; i < nv; i++) {
        iov[i] = (struct iovec){ .iov_base = v[i].iov_base, .iov_len = v[i].iov_len };
        *room += v[i].iov_len;
    }
    ssize_t n = readv(fd, iov, nv);
    size_t got = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < nv; i++) {
        size_t take = got < v[i].iov_len ? got : v[i].iov_len;
        v[i].iov_len = take;
        got -= take;
    }
    evbuffer_commit_space(buf, v, n > 0 ? nv : 0);
    return n;
}

/* libevent just read a full HTTPD_LIBEVENT_READ off hc's socket into buf
 * (from its read event, buf's end thawed): read what else the socket holds
 * now, up to HTTPD_READ_MORE, so evhttp sees the request in this turn. Each
 * piece is counted against the input bounds as it lands (httpd_input_cb
 * again, which stops here once a bound is crossed). EOF or an error is left
 * for libevent's next read to see. */
static void httpd_read_more(struct httpd_conn *hc, struct evbuffer *buf)
{
    struct bufferevent *bev = hc->evcon ? evhttp_connection_get_bufferevent(hc->evcon) : NULL;
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    size_t left = HTTPD_READ_MORE, room;

    hc->reading_ourselves = true;
    while (fd >= 0 && left && !hc->input_over) {
        ssize_t n = httpd_readv_into(fd, buf, left < (64u << 10) ? left : (64u << 10), &room);
        if (n <= 0)
            break;
        if (left == HTTPD_READ_MORE)
            hc->h->reads_extended++;
        left -= (size_t)n;
        if ((size_t)n < room)
            break;   /* the socket is empty */
    }
    hc->reading_ourselves = false;
}

void httpd_read_early(struct httpd_conn *hc)
{
    struct bufferevent *bev = evhttp_connection_get_bufferevent(hc->evcon);
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    struct evbuffer *in = bev ? bufferevent_get_input(bev) : NULL;
    size_t room;

    if (fd < 0 || evbuffer_get_length(in))
        return;
    evbuffer_unfreeze(in, 0);   /* as libevent's own read does */
    hc->reading_ourselves = true;
    ssize_t n = httpd_readv_into(fd, in, HTTPD_READ_EARLY, &room);
    hc->reading_ourselves = false;
    evbuffer_freeze(in, 0);
    if (n > 0 && !hc->input_over) {
        hc->h->reads_early++;
        bufferevent_trigger(bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);   /* evhttp's read callback */
    }
}

/* Bytes read off hc's socket (evhttp then moves them into its request). A
 * connection that takes the bytes being received over their bound is
 * answered 503 and closed from the loop (not from inside evhttp's read). */
void httpd_input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    struct httpd_conn *hc = arg;
    struct httpd *h = hc->h;
    if (!info->n_added || hc->input_over)
        return;
    hc->input += info->n_added;
    h->input_bytes += info->n_added;
    if (hc->group < HTTPD_MAX_GROUPS)
        h->input_group[hc->group] += info->n_added;
    if (!httpd_input_over(hc, hc->input_why, sizeof hc->input_why)) {
        if (info->n_added == HTTPD_LIBEVENT_READ && !hc->reading_ourselves)
            httpd_read_more(hc, buf);
        return;
    }
    h->input_refused++;
    hc->input_over = true;
    bufferevent_disable(evhttp_connection_get_bufferevent(hc->evcon), EV_READ);
    event_active(hc->deadline, EV_TIMEOUT, 1);   /* httpd_deadline_cb */
}

/* ---- unsent replies: counted from each connection's output buffer ------------- */

void httpd_output_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
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
void httpd_trim_cb(evutil_socket_t fd, short what, void *arg)
{
    struct httpd *h = arg;
    (void)fd;
    (void)what;
    malloc_trim(0);
    h->output_peak = h->output_bytes;
    h->trimmed_ms = clock_now_ms();
}

/* hc closes: its unsent bytes are no longer held. */
void httpd_output_forget(struct httpd_conn *hc)
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

/* The connection of ours evcon is, in whichever server (a request's owner
 * may not know which), or NULL. */
static struct httpd_conn *httpd_conn_of(const struct evhttp_connection *evcon)
{
    struct httpd_conn *hc = NULL;
    for (size_t i = 0; i < HTTPD_MAX_SERVERS && !hc; i++)
        if (httpd_servers[i])
            hc = httpd_conn_find(httpd_servers[i], evcon);
    return hc;
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
    struct httpd_conn *hc = httpd_conn_of(evhttp_request_get_connection(req));
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

void httpd_send_reply(struct evhttp_request *req, int code, const char *reason, struct evbuffer *body)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;

    evhttp_send_reply(req, code, reason, body);
    if (!bev || bufferevent_getfd(bev) < 0)
        return;
    /* bufferevent_sock writes only from its write event, which evhttp has
     * just enabled: one epoll_ctl, a loop turn, a second epoll_ctl once
     * the reply is out. Write it here instead (the output buffer's start
     * is frozen for anyone but the bufferevent: thawed around the write),
     * then run evhttp's write callback as the write event would have, but
     * deferred to after the current callback (the request callback must
     * not see its connection freed under it). It then stops the write
     * event in this turn too, so epoll never hears of it. A partial write
     * or an error leaves the rest to the write event, as before. */
    struct evbuffer *out = bufferevent_get_output(bev);
    if (!evbuffer_get_length(out))
        return;
    evbuffer_unfreeze(out, 1);
    int n = evbuffer_write_atmost(out, bufferevent_getfd(bev), HTTPD_MAX_SINGLE_WRITE);
    evbuffer_freeze(out, 1);
    if (n > 0 && !evbuffer_get_length(out)) {
        struct httpd_conn *hc = httpd_conn_of(evcon);
        if (hc)
            hc->h->replies_inline++;
        bufferevent_trigger(bev, EV_WRITE, BEV_TRIG_DEFER_CALLBACKS);
    }
}
