/* server conn: one engine connection on the loop — the server's totals of
 * buffered bytes, room for frames longer than 64 KiB
 * (server.max_buffered_input_bytes), reading on and off, the frame deadline
 * (server.frame_timeout), the HELLO deadline (server.hello_timeout), output
 * back-pressure and the bound on unread replies per tenant and node
 * (server.max_buffered_output_bytes), writing with SCM_RIGHTS fd passing,
 * replies, deferred answers, decoding frames into requests for the handler,
 * and the connection's end (see server.h). Loop thread only. */
#include "net/server_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "core/clock.h"
#include "kvnode.h"
#include "core/log.h"
#include "tenants/tenants.h"
#include "wire.h"

/* --- connections ------------------------------------------------------------- */

/* Bring the server's totals of buffered bytes up to date with c's buffers. */
static void conn_account(struct conn *c)
{
    struct server *s = c->srv;
    size_t in = evbuffer_get_length(c->in), out = evbuffer_get_length(c->out);

    s->in_bytes = s->in_bytes - c->in_counted + in;
    s->out_bytes = s->out_bytes - c->out_counted + out;
    if (c->tenant)
        c->tenant->output_bytes = c->tenant->output_bytes - c->out_counted + out;
    c->in_counted = in;
    c->out_counted = out;
}

/* --- room for frames (server.max_buffered_input_bytes) ---
 *
 * A frame longer than INPUT_UNRESERVED is read only once its whole length is
 * held for it, so what every connection buffers stays under the cap (plus
 * INPUT_UNRESERVED each) and a frame that started is never starved by
 * others: frames waiting for room queue first come, first served. A frame
 * larger than the cap gets room when no other frame holds any. */

static bool server_room_fits(const struct server *s, uint64_t n)
{
    return s->in_room == 0 || s->in_room + n <= s->cfg->max_buffered_input_bytes;
}

static void conn_set_reading(struct conn *c, bool on);
static void conn_update_reading(struct conn *c);

static void conn_leave_wait_queue(struct conn *c)
{
    struct server *s = c->srv;

    if (!c->input_waiting)
        return;
    if (c->wait_prev)
        c->wait_prev->wait_next = c->wait_next;
    else
        s->wait_head = c->wait_next;
    if (c->wait_next)
        c->wait_next->wait_prev = c->wait_prev;
    else
        s->wait_tail = c->wait_prev;
    s->nwaiting--;
    c->wait_prev = c->wait_next = NULL;
    c->input_waiting = false;
    c->room_wanted = 0;
}

/* Room was released: let queued frames in, oldest first, while they fit. */
static void server_admit_waiting(struct server *s)
{
    while (s->wait_head && server_room_fits(s, s->wait_head->room_wanted)) {
        struct conn *c = s->wait_head;
        uint64_t wanted = c->room_wanted;
        conn_leave_wait_queue(c);
        c->room = wanted;
        s->in_room += wanted;
        conn_update_reading(c);
    }
}

static void conn_release_room(struct conn *c)
{
    struct server *s = c->srv;

    if (c->room) {
        s->in_room -= c->room;
        c->room = 0;
        server_admit_waiting(s);
    }
}


/* The first frame in `in` is incomplete: when it is longer than
 * INPUT_UNRESERVED, hold room for all of it or queue for that room. */
static void conn_claim_room(struct conn *c)
{
    struct server *s = c->srv;
    uint8_t hdr[WIRE_HEADER_BYTES];
    uint64_t total;

    if (c->room || c->input_waiting || evbuffer_get_length(c->in) < WIRE_HEADER_BYTES)
        return;
    evbuffer_copyout(c->in, hdr, WIRE_HEADER_BYTES);
    total = WIRE_HEADER_BYTES + ((uint64_t)hdr[0] | (uint64_t)hdr[1] << 8 | (uint64_t)hdr[2] << 16 |
                                 (uint64_t)hdr[3] << 24);
    if (total <= INPUT_UNRESERVED)
        return;
    if (!s->wait_head && server_room_fits(s, total)) {
        c->room = total;
        s->in_room += total;
        return;
    }
    c->input_waiting = true;
    c->room_wanted = total;
    c->wait_prev = s->wait_tail;
    if (s->wait_tail)
        s->wait_tail->wait_next = c;
    else
        s->wait_head = c;
    s->wait_tail = c;
    s->nwaiting++;
    s->input_waits++;
}

/* How much more c may read now. */
static size_t conn_read_room(const struct conn *c)
{
    uint64_t limit = c->room > INPUT_UNRESERVED ? c->room : INPUT_UNRESERVED;
    size_t have = evbuffer_get_length(c->in);

    if (have >= limit)
        return 0;
    return limit - have < READ_CHUNK ? (size_t)(limit - have) : READ_CHUNK;
}

/* Nothing more of c's input will be handled: free it now rather than when
 * the connection ends. */
static void conn_drop_input(struct conn *c)
{
    evbuffer_drain(c->in, evbuffer_get_length(c->in));
    conn_leave_wait_queue(c);
    conn_release_room(c);
    conn_account(c);
}

void conn_destroy(struct conn *c)
{
    struct server *s = c->srv;

    server_conn_ends(s, c);
    s->handler.session_end(s->handler.arg, &c->session);
    conn_leave_wait_queue(c);
    event_free(c->rev);
    event_free(c->wev);
    event_free(c->frame_ev);
    if (c->hello_ev)
        event_free(c->hello_ev);
    if (c->resume_ev)
        event_free(c->resume_ev);
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    close(c->fd);
    s->in_bytes -= c->in_counted;
    s->out_bytes -= c->out_counted;
    if (c->tenant)
        c->tenant->output_bytes -= c->out_counted;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    if (c->room) {
        s->in_room -= c->room;
        c->room = 0;
    }
    free(c);
    server_admit_waiting(s);
    server_maybe_finish_stop(s);
}

/* server.frame_timeout runs while the connection is read and holds part of
 * a frame; each read that brings bytes (progress) starts it again. */
static void conn_update_frame_timer(struct conn *c, bool progress)
{
    if (c->reading && evbuffer_get_length(c->in) > 0) {
        if (progress || !evtimer_pending(c->frame_ev, NULL)) {
            uint32_t ms = c->srv->cfg->frame_timeout_ms;
            struct timeval tv = { .tv_sec = (time_t)(ms / 1000u), .tv_usec = (suseconds_t)((ms % 1000u) * 1000u) };
            evtimer_add(c->frame_ev, &tv);
        }
    } else if (evtimer_pending(c->frame_ev, NULL)) {
        evtimer_del(c->frame_ev);
    }
}

static void conn_set_reading(struct conn *c, bool on)
{
    if (on != c->reading) {
        c->reading = on;
        if (on)
            event_add(c->rev, NULL);
        else
            event_del(c->rev);
    }
    conn_update_frame_timer(c, false);
}

/* Read when nothing holds the connection back: not closing, no deferred
 * answer, replies not piled up, no wait for room. */
static void conn_update_reading(struct conn *c)
{
    conn_set_reading(c, !c->closing && !c->deferred && !c->output_full && !c->input_waiting &&
                        conn_read_room(c) > 0);
}

static void conn_schedule_input(struct conn *c);

/* Replies piled up past OUTPUT_HIGH_WATER stop the handling of requests
 * until they drop to OUTPUT_LOW_WATER. */
static void conn_check_output(struct conn *c)
{
    size_t out = evbuffer_get_length(c->out);

    if (!c->output_full && out >= OUTPUT_HIGH_WATER) {
        c->output_full = true;
        c->srv->input_paused++;
    } else if (c->output_full && out <= OUTPUT_LOW_WATER) {
        c->output_full = false;
        if (evbuffer_get_length(c->in) > 0 && !c->closing && !c->deferred)
            conn_schedule_input(c);
    }
}

/* Send the byte at fds_at together with the pending fds. */
static ssize_t conn_send_fds(struct conn *c)
{
    struct msghdr mh = { 0 };
    struct iovec iov;
    union {
        char buf[CMSG_SPACE(sizeof(int) * MAX_PASSED_FDS)];
        struct cmsghdr align;
    } u;
    struct cmsghdr *cm;
    size_t len = evbuffer_get_length(c->out);
    ssize_t n;

    if (len > 65536)
        len = 65536;
    iov.iov_base = evbuffer_pullup(c->out, (ev_ssize_t)len);
    iov.iov_len = len;
    memset(&u, 0, sizeof u);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * c->nfds);
    cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * c->nfds);
    memcpy(CMSG_DATA(cm), c->fds, sizeof(int) * c->nfds);
    n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    if (n > 0) {
        evbuffer_drain(c->out, (size_t)n);
        c->nfds = 0;
    }
    return n;
}

/* Write what the socket takes now. 0, or -1 when the socket failed. */
static int conn_write(struct conn *c)
{
    while (evbuffer_get_length(c->out) > 0) {
        ssize_t n;
        if (c->nfds > 0 && c->fds_at == c->bytes_sent) {
            n = conn_send_fds(c);
        } else {
            ev_ssize_t limit = -1;
            if (c->nfds > 0)
                limit = (ev_ssize_t)(c->fds_at - c->bytes_sent);
            n = evbuffer_write_atmost(c->out, c->fd, limit);
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            log_debug("write to client pid %d failed: %s", (int)c->session.pid, strerror(errno));
            c->peer_closed = true;
            return -1;
        }
        if (n == 0)
            break;
        c->bytes_sent += (uint64_t)n;
    }
    conn_account(c);
    return 0;
}

/* Write what the socket takes. 0 ok (maybe more pending), -1 fatal. */
static int conn_flush(struct conn *c)
{
    if (conn_write(c) < 0)
        return -1;
    if (evbuffer_get_length(c->out) > 0) {
        event_add(c->wev, NULL);
    } else {
        event_del(c->wev);
        if (c->closing && !c->deferred)
            return -1;
    }
    conn_check_output(c);
    conn_update_reading(c);
    return 0;
}

void conn_write_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    (void)fd;
    (void)what;
    if (conn_flush(c) < 0)
        conn_destroy(c);
}

static void free_frame_cb(const void *data, size_t len, void *arg)
{
    (void)len;
    (void)arg;
    free((void *)data);
}

int server_reply(struct conn *c, const Kvnode__Response *resp, const int *fds, size_t nfds)
{
    uint8_t *frame;
    size_t len;
    int rc;

    if (nfds > MAX_PASSED_FDS || (nfds > 0 && c->nfds > 0)) {
        log_error("internal: cannot queue %zu fds on a connection", nfds);
        return -KVNODE_EINTERNAL;
    }
    rc = wire_pack(&resp->base, WIRE_FRAME_LIMIT, &frame, &len);
    if (rc < 0) {
        log_error("cannot pack a %s response: %s", wire_op_name((int)resp->result_case),
                  kvnode_strerror(rc));
        return rc;
    }
    if (nfds > 0) {
        memcpy(c->fds, fds, nfds * sizeof(int));
        c->nfds = nfds;
        c->fds_at = c->bytes_sent + evbuffer_get_length(c->out);
    }
    if (evbuffer_add_reference(c->out, frame, len, free_frame_cb, NULL) < 0) {
        free(frame);
        return -KVNODE_ENOMEM;
    }
    conn_account(c);
    event_add(c->wev, NULL);
    return 0;
}

void server_reply_error(struct conn *c, uint64_t id, int code, const char *fmt, ...)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__Error e = KVNODE__ERROR__INIT;
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e.code = code;
    e.message = msg;
    resp.id = id;
    resp.error = &e;
    server_reply(c, &resp, NULL, 0);
}

static void conn_handle_input(struct conn *c, bool progress);

static void conn_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    (void)fd;
    (void)what;
    conn_handle_input(c, false);
    if (conn_flush(c) < 0)
        conn_destroy(c);
}

/* Handle the input already buffered, from the loop (never from inside the
 * handling of c's own requests). */
static void conn_schedule_input(struct conn *c)
{
    if (!c->resume_ev)
        c->resume_ev = event_new(c->srv->base, -1, 0, conn_resume_cb, c);
    if (c->resume_ev)
        event_active(c->resume_ev, 0, 0);
    else
        log_error("out of memory resuming the connection of pid %d", (int)c->session.pid);
}

void server_defer(struct conn *c)
{
    c->deferred = true;
    conn_set_reading(c, false);
}

void server_resume(struct conn *c)
{
    c->deferred = false;
    if (!c->resume_ev)
        c->resume_ev = event_new(c->srv->base, -1, 0, conn_resume_cb, c);
    if (c->resume_ev) {
        event_active(c->resume_ev, 0, 0);
    } else if (conn_flush(c) < 0) {
        log_error("out of memory resuming the connection of pid %d", (int)c->session.pid);
        server_close_after_flush(c);
    }
}

void server_close_after_flush(struct conn *c)
{
    c->closing = true;
    conn_drop_input(c);
    conn_set_reading(c, false);
    event_add(c->wev, NULL);   /* the write callback closes once drained */
}

struct session *server_conn_session(struct conn *c)
{
    return &c->session;
}

/* A frame we cannot accept: say why, count it, close this connection only. */
static void conn_reject_frame(struct conn *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_reject_frame(struct conn *c, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->srv->frames_rejected++;
    log_warn("closing connection of pid %d: %s", (int)c->session.pid, msg);
    server_reply_error(c, 0, code, "%s", msg);
    server_close_after_flush(c);
}

/* server.frame_timeout passed without a byte of the frame in progress:
 * drop it, say why (best effort) and close at once; a client that stalls
 * its frames is not waited for to read its replies either. */
void conn_frame_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct server *s = c->srv;
    size_t have = evbuffer_get_length(c->in);
    uint8_t hdr[WIRE_HEADER_BYTES] = { 0 };
    char size[48] = "a header";
    uint64_t held = 0;
    char note[64];
    (void)fd;
    (void)what;

    if (have >= WIRE_HEADER_BYTES) {
        evbuffer_copyout(c->in, hdr, WIRE_HEADER_BYTES);
        snprintf(size, sizeof size, "%" PRIu32 " bytes",
                 (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24);
    }
    s->frames_timed_out++;
    if (log_limit_pass(&s->timeout_log, clock_now_ms(), LOG_REPEAT_MS, &held))
        log_warn("closing connection of pid %d: %zu bytes of a frame of %s arrived, then nothing for %u ms "
                 "(server.frame_timeout)%s", (int)c->session.pid,
                 have > WIRE_HEADER_BYTES ? have - WIRE_HEADER_BYTES : 0, size, s->cfg->frame_timeout_ms,
                 log_limit_note(held, "closed so", note, sizeof note));
    server_reply_error(c, 0, -KVNODE_ETIMEDOUT, "frame incomplete: %zu bytes of %s arrived, then nothing "
                       "for %u ms (server.frame_timeout); closing the connection",
                       have > WIRE_HEADER_BYTES ? have - WIRE_HEADER_BYTES : 0, size, s->cfg->frame_timeout_ms);
    server_close_after_flush(c);
    conn_flush(c);
    conn_destroy(c);
}

/* server.hello_timeout passed since accept: if the connection has not said
 * HELLO by now it only holds a slot of its tenant's; say why (best effort),
 * count it and close at once. */
void conn_hello_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct server *s = c->srv;
    uint64_t held = 0;
    char note[64];
    (void)fd;
    (void)what;

    if (c->session.hello_done)
        return;
    s->hello_timeouts++;
    if (log_limit_pass(&s->hello_log, clock_now_ms(), LOG_REPEAT_MS, &held))
        log_warn("closing connection of pid %d uid %d: no HELLO within %u ms of connecting (server.hello_timeout)%s",
                 (int)c->session.pid, (int)c->session.uid, s->cfg->hello_timeout_ms,
                 log_limit_note(held, "closed so", note, sizeof note));
    server_reply_error(c, 0, -KVNODE_ETIMEDOUT, "no HELLO within %u ms of connecting (server.hello_timeout); "
                       "closing the connection", s->cfg->hello_timeout_ms);
    server_close_after_flush(c);
    conn_flush(c);
    conn_destroy(c);
}

/* The unread replies bound (server.max_buffered_output_bytes, a tenant its
 * share): which one c's next request finds passed, or NULL. Passed, not
 * reached: a tenant whose share is 0 (no memory) is served one reply at a
 * time. */
static const char *conn_output_bound(const struct conn *c, uint64_t *held, uint64_t *bound)
{
    const struct server *s = c->srv;

    if (c->tenant && c->tenant->output_bytes > c->tenant->max_output_bytes) {
        *held = c->tenant->output_bytes;
        *bound = c->tenant->max_output_bytes;
        return "its tenant's share of server.max_buffered_output_bytes";
    }
    if (s->out_bytes > s->cfg->max_buffered_output_bytes) {
        *held = s->out_bytes;
        *bound = s->cfg->max_buffered_output_bytes;
        return "server.max_buffered_output_bytes";
    }
    return NULL;
}

/* Before c's next request: when unread replies are past their bound, a
 * connection that holds some of them itself (the socket takes no more) is
 * closed, its replies given back; one that holds none is refused a request
 * for block bytes (GET_INLINE) and served the others, whose replies are
 * small (and its next request closes it if it leaves them unread). true:
 * req is not to be handled. */
static bool conn_output_limited(struct conn *c, const Kvnode__Request *req)
{
    struct server *s = c->srv;
    uint64_t held = 0, bound = 0, logged = 0;
    const char *what = conn_output_bound(c, &held, &bound);
    char note[64], who[CONFIG_TENANT_NAME_MAX + 16] = "";

    if (!what)
        return false;
    /* Replies queued by this read may simply not be written yet. */
    if (evbuffer_get_length(c->out) > 0 && conn_write(c) == 0 && !(what = conn_output_bound(c, &held, &bound)))
        return false;
    if (c->tenant && c->tenant->named)
        snprintf(who, sizeof who, " of tenant %s", c->tenant->name);
    if (evbuffer_get_length(c->out) == 0) {
        if (req->op_case != KVNODE__REQUEST__OP_GET_INLINE)
            return false;
        s->output_limit_refused++;
        server_reply_error(c, req->id, -KVNODE_ELIMIT, "unread replies of other connections%s hold %" PRIu64
                           " bytes, %s (%" PRIu64 "): try again once they are read", who, held, what, bound);
        return true;
    }
    s->output_limit_closed++;
    if (log_limit_pass(&s->output_log, clock_now_ms(), LOG_REPEAT_MS, &logged))
        log_warn("closing connection of pid %d uid %d%s: it reads no replies and unread replies hold %" PRIu64
                 " bytes, %s (%" PRIu64 "); its %zu unread bytes are dropped%s", (int)c->session.pid,
                 (int)c->session.uid, who, held, what, bound, evbuffer_get_length(c->out),
                 log_limit_note(logged, "closed so", note, sizeof note));
    /* Its stream is cut mid-reply: no error frame can follow. */
    evbuffer_drain(c->out, evbuffer_get_length(c->out));
    c->nfds = 0;
    server_close_after_flush(c);
    return true;
}

/* Decode and dispatch every complete frame in the input buffer, until the
 * connection is held back (closing, a deferred answer, replies piled up). */
static void conn_process_input(struct conn *c)
{
    uint32_t max = c->srv->cfg->max_frame_bytes;

    while (!c->closing && !c->deferred) {
        size_t avail = evbuffer_get_length(c->in);
        uint8_t hdr[WIRE_HEADER_BYTES];
        uint32_t len;
        uint8_t *payload;
        Kvnode__Request *req;
        int rc;

        if (avail < WIRE_HEADER_BYTES)
            return;
        /* Before each request, not after a read: one read may bring
         * thousands of small requests with big replies. */
        if (evbuffer_get_length(c->out) >= OUTPUT_HIGH_WATER) {
            conn_check_output(c);
            return;
        }
        if (c->output_full)
            return;
        evbuffer_copyout(c->in, hdr, WIRE_HEADER_BYTES);
        rc = wire_frame_len(hdr, max, &len);
        if (rc == -KVNODE_ETOOBIG) {
            conn_reject_frame(c, rc, "frame of %" PRIu32 " bytes exceeds server.max_frame_bytes "
                              "(%" PRIu32 ")", (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 |
                              (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24, max);
            return;
        }
        if (rc < 0) {
            conn_reject_frame(c, rc, "empty frame (length 0)");
            return;
        }
        if (avail < WIRE_HEADER_BYTES + (size_t)len)
            return;
        evbuffer_drain(c->in, WIRE_HEADER_BYTES);
        payload = evbuffer_pullup(c->in, (ev_ssize_t)len);
        req = payload ? wire_unpack_request(payload, len) : NULL;
        evbuffer_drain(c->in, len);
        /* Room held for a frame is the first frame's: this one. */
        conn_release_room(c);
        if (!req) {
            conn_reject_frame(c, -KVNODE_EPROTO, "undecodable frame of %" PRIu32
                              " bytes: not a kvnode Request message", len);
            return;
        }
        /* Told to go away (the stop): its leases are void, nothing more is
         * served; it is read only to see it close. Its refusals are replies
         * held to the output bounds like any other. */
        if (!conn_output_limited(c, req)) {
            if (c->going_away)
                server_reply_error(c, req->id, -KVNODE_ESHUTDOWN, "kvnoded is stopping: this connection "
                                   "was told to unmap its HBM and close (GoingAway)");
            else
                c->srv->handler.request(c->srv->handler.arg, c, &c->session, req);
        }
        kvnode__request__free_unpacked(req, NULL);
        if (c->hello_ev && c->session.hello_done) {
            event_free(c->hello_ev);
            c->hello_ev = NULL;
        }
        if (c->session.hbm_lent && !c->hbm_counted) {
            c->hbm_counted = true;
            c->srv->hbm_lent++;
        }
    }
}

/* Handle what is buffered, then decide what reading may go on. */
static void conn_handle_input(struct conn *c, bool progress)
{
    conn_process_input(c);
    if (!c->closing && !c->deferred && !c->output_full)
        conn_claim_room(c);
    conn_account(c);
    conn_update_reading(c);
    if (progress)
        conn_update_frame_timer(c, true);
}

void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct evbuffer_iovec vec[2];
    size_t want = conn_read_room(c), left;
    int nvec;
    ssize_t n;
    (void)what;

    if (want == 0) {
        conn_update_reading(c);
        return;
    }
    nvec = evbuffer_reserve_space(c->in, (ev_ssize_t)want, vec, 2);
    if (nvec < 0) {
        log_error("out of memory reading from pid %d", (int)c->session.pid);
        conn_destroy(c);
        return;
    }
    {
        struct iovec iov[2];
        left = want;
        for (int i = 0; i < nvec; i++) {
            iov[i].iov_base = vec[i].iov_base;
            iov[i].iov_len = vec[i].iov_len < left ? vec[i].iov_len : left;
            left -= iov[i].iov_len;
        }
        n = readv(fd, iov, nvec);
    }
    if (n <= 0) {
        evbuffer_commit_space(c->in, vec, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n == 0 && evbuffer_get_length(c->in) > 0)
            log_debug("pid %d closed with %zu bytes of an incomplete frame",
                      (int)c->session.pid, evbuffer_get_length(c->in));
        c->peer_closed = true;
        conn_destroy(c);
        return;
    }
    for (int i = 0; i < nvec; i++) {
        size_t take = (size_t)n < vec[i].iov_len ? (size_t)n : vec[i].iov_len;
        vec[i].iov_len = take;
        n -= (ssize_t)take;
    }
    evbuffer_commit_space(c->in, vec, nvec);
    conn_handle_input(c, true);
    if (conn_flush(c) < 0)
        conn_destroy(c);
}
