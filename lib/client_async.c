/* client_async: the submit/complete machinery of libkvnode (see kvnode.h,
 * "Asynchronous calls", and client_internal.h for the other files).
 *
 * Owns, after HELLO: the socket, the requests in flight (by wire request id),
 * the bytes queued for sending, and the completion queue and its eventfd
 * (the public submit/drain calls on top of them are in client_submit.c).
 *
 * Design, "whoever waits drives the socket" until an asynchronous request
 * needs a thread: requests are sent by the threads that make them (under the
 * client's lock, without blocking: what the socket does not take is queued).
 * A synchronous caller waiting for its reply reads the socket itself when
 * nobody else does (c->driving: one at a time; it hands every reply to the
 * request with its id, then lets another waiter take over), so a client used
 * synchronously has no thread of its own and no thread hop per call. The
 * first asynchronous MATCH/DELETE (or a connect lent device memory, whose
 * end must be seen while the engine is idle) starts the I/O thread, which
 * from then on
 * does all the reading: an asynchronous user only polls the eventfd and does
 * not call in until it is readable, so someone else must read the replies
 * that make it readable. Whoever reads sleeps in poll() on the socket and a
 * wake eventfd, its timeout the earliest request deadline (a new request
 * with an earlier one wakes it): no busy loop. Replies are matched by id,
 * so completions may come in any order. Requests not waited for
 * (kvnode_get_end, kvnode_put_commit_nowait) rely on the daemon handling a
 * connection's requests in order: they are applied before the next one, and
 * their reply has been read once a later request's has; its error is kept in
 * c->deferred_rc for the next call (client_call_deferred, client_flush).
 *
 * Requests finish exactly once, under the lock: with their reply, or when
 * the connection ends (client_kill_locked fails all of them at once with the
 * reason). A synchronous caller's request lives on its stack and is woken
 * through c->cond; an asynchronous one becomes a kvnode_completion whose
 * memory was allocated at submit, so finishing cannot fail.
 *
 * GET/PUT batches need several round trips and copies between the arenas
 * and the caller's pages; the worker thread runs them with the synchronous
 * code (client_get_batch / client_put_batch), one batch after another. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"

/* A waiter that sees its deadline pass by this much without the I/O thread
 * having ended its request ends the connection itself (belt and braces). */
#define CLIENT_WAIT_GRACE_MS 1000
/* Reads per wakeup before the I/O thread looks at its other duties. */
#define CLIENT_READ_BURST 64
/* The longest a lone synchronous caller blocks in recvmsg before it looks
 * again at the deadlines of the other requests in flight, a queued send or
 * a stop (what poll's wake eventfd would have told it at once). */
#define CLIENT_BLOCK_SLICE_MS 50
/* The receive buffer's least size: the common reply (header and payload,
 * and often the next frame) comes in with one recvmsg (issue 32). */
#define CLIENT_RX_MIN (64u << 10)

/* --- completions --------------------------------------------------------- */

static void client_event_signal(kvnode_client *c)
{
    uint64_t one = 1;

    /* Fails only when the counter would overflow: it stays readable. */
    if (write(c->event_fd, &one, sizeof one) < 0) {
        /* nothing to do */
    }
}

static void client_wake_io(kvnode_client *c)
{
    uint64_t one = 1;

    if (c->wake_fd >= 0 && write(c->wake_fd, &one, sizeof one) < 0) {
        /* already awake */
    }
}

void client_push_done_locked(kvnode_client *c, struct client_done *d)
{
    d->next = NULL;
    if (c->done_tail)
        c->done_tail->next = d;
    else
        c->done_head = d;
    c->done_tail = d;
    c->n_done++;
    client_event_signal(c);
}

static void client_unlink_slot_locked(kvnode_client *c, struct client_slot *s)
{
    struct client_slot **pp;

    for (pp = &c->slots; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            c->n_slots--;
            return;
        }
    }
}

/* The reply of an asynchronous MATCH or DELETE, turned into its completion. */
static void client_finish_async_reply(struct client_slot *s, const Kvnode__Response *resp)
{
    kvnode_completion *comp = &s->async->comp;
    int del = comp->op == KVNODE_OP_DELETE || comp->op == KVNODE_OP_DELETE_EACH;
    int expect = del ? KVNODE__RESPONSE__RESULT_DELETE : KVNODE__RESPONSE__RESULT_MATCH;
    uint32_t answered;

    if (resp->error) {
        comp->rc = client_error_code(resp->error);
        snprintf(comp->error, sizeof comp->error, "%s",
                 resp->error->message && resp->error->message[0] ? resp->error->message
                                                                 : kvnode_strerror(comp->rc));
        return;
    }
    if ((int)resp->result_case != expect) {
        comp->rc = -KVNODE_EPROTO;
        snprintf(comp->error, sizeof comp->error, "protocol: %s reply carries result %d",
                 del ? "delete" : "match", (int)resp->result_case);
        return;
    }
    answered = del ? resp->delete_->deleted : resp->match->matched;
    if (answered > s->n) {
        comp->rc = -KVNODE_EPROTO;
        snprintf(comp->error, sizeof comp->error, "protocol: %s of %zu keys answered %" PRIu32,
                 del ? "delete" : "match", s->n, answered);
        return;
    }
    /* Per key: the caller's array is filled only from a consistent bitmap. */
    if (s->each) {
        const ProtobufCBinaryData *bits = del ? &resp->delete_->each : &resp->match->present;
        bool *tmp = malloc(s->n * sizeof *tmp);
        if (!tmp || client_each_unpack(bits, s->n, answered, tmp) < 0) {
            comp->rc = tmp ? -KVNODE_EPROTO : -KVNODE_ENOMEM;
            snprintf(comp->error, sizeof comp->error, tmp ? "protocol: the per-key %s of %zu "
                     "keys answered %" PRIu32 " with a bitmap of %zu bytes that does not say so"
                     : "out of memory", del ? "delete" : "match", s->n, answered, bits->len);
            free(tmp);
            return;
        }
        memcpy(s->each, tmp, s->n * sizeof *tmp);
        free(tmp);
    }
    comp->count = answered;
}

/* End a request (already unlinked): resp is its reply, or NULL with rc/msg
 * saying why there is none. Takes resp. */
static void client_finish_slot_locked(kvnode_client *c, struct client_slot *s,
                                      Kvnode__Response *resp, int rc, const char *msg)
{
    if (s->deferred) {
        /* Nobody waits: keep the first error for the next call. The end of
         * the connection (resp NULL) is not kept: every later call says so. */
        int erc = 0;
        const char *why = "";
        char buf[64];

        if (resp && resp->error) {
            erc = client_error_code(resp->error);
            why = resp->error->message && resp->error->message[0] ? resp->error->message
                                                                   : kvnode_strerror(erc);
        } else if (resp && (int)resp->result_case != s->op) {
            erc = -KVNODE_EPROTO;
            snprintf(buf, sizeof buf, "protocol: reply carries result %d", (int)resp->result_case);
            why = buf;
        }
        if (erc && !c->deferred_rc) {
            c->deferred_rc = erc;
            snprintf(c->deferred_msg, sizeof c->deferred_msg, "earlier %s of lease %" PRIu64
                     " (not waited for) failed: %s", wire_op_name(s->op), s->lease, why);
        }
        if (resp)
            wire_free_response(resp);
        c->n_deferred--;
        free(s);
        pthread_cond_broadcast(&c->cond);   /* client_flush waits for n_deferred 0 */
        return;
    }
    if (s->async) {
        struct client_done *d = s->async;

        if (resp) {
            client_finish_async_reply(s, resp);
            wire_free_response(resp);
        } else {
            d->comp.rc = rc;
            snprintf(d->comp.error, sizeof d->comp.error, "%s", msg);
        }
        client_push_done_locked(c, d);
        free(s);
        return;
    }
    s->resp = resp;
    s->rc = rc;
    if (!resp)
        snprintf(s->err, sizeof s->err, "%s", msg);
    s->done = 1;
    pthread_cond_broadcast(&c->cond);
}

/* The stream is unusable: remember why, fail every request in flight with
 * rc and the reason, drop unsent bytes, and make the I/O thread leave. */
void client_kill_locked(kvnode_client *c, int rc, const char *fmt, ...)
{
    va_list ap;

    if (c->dead)
        return;
    va_start(ap, fmt);
    vsnprintf(c->dead_msg, sizeof c->dead_msg, fmt, ap);
    va_end(ap);
    c->dead = 1;
    c->dead_rc = rc;
    while (c->slots) {
        struct client_slot *s = c->slots;

        c->slots = s->next;
        c->n_slots--;
        client_finish_slot_locked(c, s, NULL, rc, c->dead_msg);
    }
    while (c->tx_head) {
        struct client_tx *t = c->tx_head;

        c->tx_head = t->next;
        free(t);
    }
    c->tx_tail = NULL;
    /* The daemon ends this connection's leases at once. A connection lent
     * GPU memory closes only once that is released (client_gpu_end): the
     * daemon frees it when the connection closes. */
    if (c->fd >= 0 && !c->gpu_mapped)
        shutdown(c->fd, SHUT_RDWR);
    pthread_cond_broadcast(&c->job_cond);
    client_wake_io(c);
}

/* --- sending ------------------------------------------------------------- */

/* Send what the socket takes now, without blocking. 0 when all of it went,
 * 1 when some is left (*off advanced), -1 when the connection is broken
 * (c->tx_broken set or the client killed). */
static int client_send_some_locked(kvnode_client *c, const uint8_t *buf, size_t len, size_t *off)
{
    while (*off < len) {
        ssize_t n = send(c->fd, buf + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n > 0) {
            *off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            /* The daemon may have said why before closing: the I/O thread
             * reads what is left, then ends the connection. */
            c->tx_broken = 1;
            client_wake_io(c);
            return -1;
        }
        client_kill_locked(c, -KVNODE_EIO, "send: %s", n < 0 ? strerror(errno) : "wrote nothing");
        return -1;
    }
    return 0;
}

/* Send a frame, or queue what the socket does not take now. */
static void client_send_locked(kvnode_client *c, const uint8_t *frame, size_t len)
{
    size_t off = 0;
    struct client_tx *t;

    if (c->tx_broken)
        return;     /* the I/O thread is about to end the connection */
    if (!c->tx_head && client_send_some_locked(c, frame, len, &off) != 1)
        return;
    t = malloc(sizeof *t + (len - off));
    if (!t) {
        client_kill_locked(c, -KVNODE_ENOMEM, "out of memory queueing a request of %zu bytes",
                           len - off);
        return;
    }
    memcpy(t->data, frame + off, len - off);
    t->len = len - off;
    t->off = 0;
    t->next = NULL;
    if (c->tx_tail)
        c->tx_tail->next = t;
    else
        c->tx_head = t;
    c->tx_tail = t;
    client_wake_io(c);
}

/* Pack req under a fresh id and send it as the request of s (linked into
 * the requests in flight). 0, or a negative code with nothing sent. */
int client_submit_locked(kvnode_client *c, Kvnode__Request *req, struct client_slot *s)
{
    const char *op = wire_op_name((int)req->op_case);
    size_t frame_len;
    int rc;

    req->id = c->next_id++;
    rc = wire_pack_reuse(&req->base, c->send_max, &c->tx_buf, &c->tx_cap, &frame_len);
    if (rc < 0) {
        c->next_id--;   /* nothing was sent: keep the ids the daemon sees dense */
        if (rc == -KVNODE_ETOOBIG)
            snprintf(s->err, sizeof s->err, "%s request of %zu bytes exceeds the frame limit of %"
                     PRIu32 " bytes", op, protobuf_c_message_get_packed_size(&req->base),
                     c->send_max);
        else
            snprintf(s->err, sizeof s->err, "cannot pack a %s request: %s", op,
                     kvnode_strerror(rc));
        return rc;
    }
    s->id = req->id;
    s->timeout_ms = c->timeout_ms;
    /* A deferred request has no waiter and so no deadline until one waits
     * for it (client_flush); a later call's own deadline covers it (the
     * daemon answers in order). */
    s->deadline = s->deferred ? INT64_MAX : client_now_ms() + c->timeout_ms;
    s->next = c->slots;
    c->slots = s;
    c->n_slots++;
    client_send_locked(c, c->tx_buf, frame_len);
    /* Whoever sleeps in poll() computed its timeout without this request. */
    if (s->deadline < c->poll_deadline)
        client_wake_io(c);
    return 0;
}

/* --- the I/O thread ------------------------------------------------------ */

/* A whole reply frame's payload: give it to its request. */
static void client_dispatch(kvnode_client *c, const uint8_t *payload, size_t len)
{
    Kvnode__Response *resp = wire_unpack_response(payload, len);
    int ctrunc = c->rx_ctrunc;
    struct client_slot *s;

    client_drop_fds(c);     /* only HELLO may pass fds */
    pthread_mutex_lock(&c->lock);
    if (!resp) {
        client_kill_locked(c, -KVNODE_EPROTO, "protocol: undecodable reply frame of %zu bytes",
                           len);
    } else if (ctrunc) {
        client_kill_locked(c, -KVNODE_EPROTO, "protocol: more passed fds than the library "
                           "accepts (%d)", CLIENT_MAX_FDS);
    } else if (resp->id != 0 && resp->result_case == KVNODE__RESPONSE__RESULT_GOING_AWAY) {
        /* Not a reply to that request: the connection must end (and release
         * its GPU memory) as for a GoingAway with id 0. */
        client_kill_locked(c, -KVNODE_EPROTO, "protocol: GoingAway with request id %" PRIu64
                           ", not 0", resp->id);
    } else {
        for (s = c->slots; s && s->id != resp->id; s = s->next)
            ;
        if (s) {
            client_unlink_slot_locked(c, s);
            client_finish_slot_locked(c, s, resp, 0, "");
            resp = NULL;
        } else if (resp->id == 0 &&
                   resp->result_case == KVNODE__RESPONSE__RESULT_GOING_AWAY) {
            /* The daemon stops: it frees the GPU memory lent to this
             * connection once we have let it go, so the connection ends
             * here (the I/O thread then releases the GPU arenas). */
            const Kvnode__GoingAway *g = resp->going_away;

            client_kill_locked(c, -KVNODE_ESHUTDOWN, "daemon stopping%s%s%s: its memory lent to "
                               "this client is released (it asked within %" PRIu32 " ms)",
                               g->reason && g->reason[0] ? " (" : "",
                               g->reason && g->reason[0] ? g->reason : "",
                               g->reason && g->reason[0] ? ")" : "", g->unmap_within_ms);
        } else if (resp->id == 0 && resp->error) {
            /* id 0: the daemon ends the connection and says why. */
            client_kill_locked(c, client_error_code(resp->error), "daemon: %s",
                               resp->error->message ? resp->error->message : "");
        } else {
            client_kill_locked(c, -KVNODE_EPROTO, "protocol: reply id %" PRIu64 " matches no "
                               "request in flight", resp->id);
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (resp)
        wire_free_response(resp);
}

static void client_kill(kvnode_client *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void client_kill(kvnode_client *c, int rc, const char *fmt, ...)
{
    char msg[CLIENT_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->lock);
    client_kill_locked(c, rc, "%s", msg);
    pthread_mutex_unlock(&c->lock);
}

/* Room for at least want more bytes at c->rx_buf + c->rx_len: what was
 * dispatched is dropped from the front, the buffer grows when the frame
 * being read needs it. 0, or -1 (the client is killed). */
static int client_rx_room(kvnode_client *c, size_t want)
{
    if (c->rx_cap - c->rx_len >= want && c->rx_cap >= CLIENT_RX_MIN)
        return 0;
    if (c->rx_off > 0) {
        memmove(c->rx_buf, c->rx_buf + c->rx_off, c->rx_len - c->rx_off);
        c->rx_len -= c->rx_off;
        c->rx_off = 0;
        if (c->rx_cap - c->rx_len >= want && c->rx_cap >= CLIENT_RX_MIN)
            return 0;
    }
    size_t cap = c->rx_len + want < CLIENT_RX_MIN ? CLIENT_RX_MIN : c->rx_len + want;
    uint8_t *nb = realloc(c->rx_buf, cap);
    if (!nb) {
        client_kill(c, -KVNODE_ENOMEM, "out of memory for a reply of %zu bytes", want);
        return -1;
    }
    c->rx_buf = nb;
    c->rx_cap = cap;
    return 0;
}

/* Dispatch every whole frame in the receive buffer. *need: the bytes still
 * missing from the frame begun (0 when none is). 0, or -1 (killed). */
static int client_rx_frames(kvnode_client *c, size_t *need)
{
    *need = 0;
    while (c->rx_len - c->rx_off >= WIRE_HEADER_BYTES) {
        const uint8_t *h = c->rx_buf + c->rx_off;
        size_t have = c->rx_len - c->rx_off - WIRE_HEADER_BYTES;
        uint32_t len;
        int rc = wire_frame_len(h, c->recv_max, &len);
        if (rc == -KVNODE_ETOOBIG) {
            uint32_t claimed = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                               (uint32_t)h[3] << 24;
            client_kill(c, -KVNODE_EPROTO, "protocol: reply frame of %" PRIu32 " bytes "
                        "exceeds the limit of %" PRIu32, claimed, c->recv_max);
            return -1;
        }
        if (rc < 0) {
            client_kill(c, -KVNODE_EPROTO, "protocol: empty reply frame");
            return -1;
        }
        if (have < len) {
            *need = len - have;
            return 0;
        }
        c->rx_off += WIRE_HEADER_BYTES + len;
        client_dispatch(c, h + WIRE_HEADER_BYTES, len);
    }
    if (c->rx_len > c->rx_off)
        *need = WIRE_HEADER_BYTES - (c->rx_len - c->rx_off);
    else
        c->rx_len = c->rx_off = 0;
    return 0;
}

/* Read what the socket has into the receive buffer, as much as fits per
 * recvmsg, and dispatch the whole frames. 0 when the socket is drained (or
 * nothing more can come); -1 when the connection ended (the client is
 * killed). Fds passed after HELLO are dropped at dispatch. */
static int client_read_some(kvnode_client *c, bool block_first)
{
    size_t need = 0;
    for (int burst = 0; burst < CLIENT_READ_BURST; burst++) {
        union {
            char buf[CMSG_SPACE(sizeof(int) * CLIENT_MAX_FDS)];
            struct cmsghdr align;
        } cbuf;
        struct iovec iov;
        struct msghdr mh = { 0 };
        ssize_t n;

        if (client_rx_room(c, need ? need : 1) < 0)
            return -1;
        iov.iov_base = c->rx_buf + c->rx_len;
        iov.iov_len = c->rx_cap - c->rx_len;
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = sizeof cbuf.buf;
        bool block = block_first && burst == 0;
        n = recvmsg(c->fd, &mh, (block ? 0 : MSG_DONTWAIT) | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            return 0;   /* the caller's next step looks again */
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;   /* drained, or SO_RCVTIMEO passed */
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            client_kill(c, -KVNODE_ECLOSED, "daemon closed the connection");
            return -1;
        }
        if (n < 0) {
            client_kill(c, -KVNODE_EIO, "recvmsg: %s", strerror(errno));
            return -1;
        }
        client_take_fds(c, &mh);
        c->rx_len += (size_t)n;
        if (client_rx_frames(c, &need) < 0)
            return -1;
        /* A read that did not fill the buffer took all the socket had: the
         * next bytes are for poll to announce, not for a read that would
         * only say EAGAIN. With no request in flight none can come (a frame
         * the daemon sends on its own, or its close, is seen at the next
         * poll). */
        if ((size_t)n < iov.iov_len)
            return 0;
        pthread_mutex_lock(&c->lock);
        bool waiting = c->slots != NULL;
        pthread_mutex_unlock(&c->lock);
        if (!waiting && !need)
            return 0;
    }
    return 0;
}

static int client_io_finish_step(kvnode_client *c);

/* Make c->fd ready for a blocking recvmsg of at most timeout_ms (-1: no
 * deadline): O_NONBLOCK cleared once, SO_RCVTIMEO set only when it must
 * change (the common wait takes no extra system call). false when the socket
 * refuses (then poll is used). */
static bool client_block_prepare(kvnode_client *c, int timeout_ms)
{
    int want = timeout_ms < 0 || timeout_ms > CLIENT_BLOCK_SLICE_MS ? CLIENT_BLOCK_SLICE_MS : timeout_ms;
    if (!c->sock_blocking) {
        int fl = fcntl(c->fd, F_GETFL);
        if (fl < 0 || fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
            return false;
        c->sock_blocking = 1;
    }
    if (want != c->rcvtimeo_ms) {
        struct timeval tv = { .tv_sec = want / 1000, .tv_usec = (want % 1000) * 1000 };
        if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0)
            return false;
        c->rcvtimeo_ms = want;
    }
    return true;
}

/* One round of socket I/O: wait (poll) until the socket can be read or
 * written, the wake eventfd fires or the earliest deadline of the requests
 * in flight comes; then read the replies, send what is queued and end the
 * connection if a deadline passed. Run by the I/O thread, or by one waiting
 * synchronous caller at a time (c->driving) while there is none. 0, or -1
 * when the client is dead or stopping. */
static int client_io_step(kvnode_client *c)
{
    struct pollfd p[2];
    int64_t first = INT64_MAX;
    int timeout, broken;

    pthread_mutex_lock(&c->lock);
    if (c->dead || c->stopping) {
        pthread_mutex_unlock(&c->lock);
        return -1;
    }
    for (struct client_slot *s = c->slots; s; s = s->next)
        if (s->deadline < first)
            first = s->deadline;
    /* A request with an earlier deadline submitted from now on wakes us. */
    c->poll_deadline = first;
    p[0] = (struct pollfd){ .fd = c->fd, .events = (short)(POLLIN | (c->tx_head ? POLLOUT : 0)) };
    broken = c->tx_broken;
    /* Only a synchronous caller waiting for a reply spins (never the I/O
     * thread, which waits for the daemon's notices too). */
    bool lone = c->driving && !c->io_running && !c->tx_head && c->slots;
    unsigned spin_us = lone ? c->busy_poll_us : 0;
    pthread_mutex_unlock(&c->lock);
    p[1] = (struct pollfd){ .fd = c->wake_fd, .events = POLLIN };
    timeout = first == INT64_MAX ? -1 : client_remaining_ms(first);
    if (broken)
        timeout = 0;
    /* A synchronous caller that drives the socket with nothing to send and
     * no I/O thread waits in recvmsg itself: send + recvmsg per round trip,
     * as a blocking client makes (issue 32). Replies to other threads wake
     * it as its own do; what only the wake eventfd would say (a send queued
     * by another thread, an earlier deadline, a stop) waits at most
     * CLIENT_BLOCK_SLICE_MS. */
    if (lone && !spin_us && timeout != 0 && client_block_prepare(c, timeout)) {
        if (client_read_some(c, true) < 0)
            return -1;
        return client_io_finish_step(c);
    }
    int ready = 0;
    if (spin_us && timeout != 0) {
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
            ready = poll(p, 2, 0);
            clock_gettime(CLOCK_MONOTONIC, &t);
        } while (ready == 0 &&
                 (t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 < (long)spin_us);
    }
    if (ready <= 0 && poll(p, 2, timeout) < 0 && errno != EINTR) {
        client_kill(c, -KVNODE_EIO, "poll: %s", strerror(errno));
        return -1;
    }
    pthread_mutex_lock(&c->lock);
    c->poll_deadline = INT64_MIN;   /* not asleep: nobody needs waking */
    pthread_mutex_unlock(&c->lock);
    if (p[1].revents & POLLIN) {
        uint64_t v;
        if (read(c->wake_fd, &v, sizeof v) < 0) {
            /* EAGAIN: another read took it */
        }
    }
    /* Replies first: a daemon that closes may have said why. */
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && client_read_some(c, false) < 0)
        return -1;
    return client_io_finish_step(c);
}

/* The rest of a step, after the replies were read: send what is queued and
 * end the connection if a deadline passed. 0, or -1 when the client is dead
 * or stopping. */
static int client_io_finish_step(kvnode_client *c)
{
    int64_t now;
    int dead;

    pthread_mutex_lock(&c->lock);
    if (c->tx_broken && !c->dead)
        client_kill_locked(c, -KVNODE_ECLOSED, "daemon closed the connection");
    while (!c->dead && c->tx_head) {
        struct client_tx *tx = c->tx_head;

        if (client_send_some_locked(c, tx->data, tx->len, &tx->off) != 0)
            break;
        c->tx_head = tx->next;
        if (!c->tx_head)
            c->tx_tail = NULL;
        free(tx);
    }
    now = client_now_ms();
    for (struct client_slot *s = c->slots; s && !c->dead; s = s->next) {
        if (s->deadline <= now) {
            /* The kill frees s (and every other request): stop walking. */
            client_kill_locked(c, -KVNODE_ETIMEDOUT, "timed out after %d ms waiting to "
                               "receive a reply", s->timeout_ms);
            break;
        }
    }
    dead = c->dead || c->stopping;
    pthread_mutex_unlock(&c->lock);
    return dead ? -1 : 0;
}

static void *client_io_main(void *arg)
{
    kvnode_client *c = arg;

    while (client_io_step(c) == 0)
        ;
    /* The connection ended: let its GPU memory go now, not at kvnode_close. */
    client_gpu_end(c);
    return NULL;
}

/* --- setup and teardown -------------------------------------------------- */

int client_async_init(kvnode_client *c)
{
    pthread_condattr_t ca;

    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        client_seterr(c, "pthread_mutex_init failed");
        return -KVNODE_EIO;
    }
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&c->cond, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        pthread_mutex_destroy(&c->lock);
        client_seterr(c, "pthread_cond_init failed");
        return -KVNODE_EIO;
    }
    if (pthread_cond_init(&c->job_cond, NULL) != 0) {
        pthread_condattr_destroy(&ca);
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
        client_seterr(c, "pthread_cond_init failed");
        return -KVNODE_EIO;
    }
    pthread_condattr_destroy(&ca);
    c->lock_ready = 1;
    c->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->event_fd < 0 || c->wake_fd < 0) {
        client_seterr(c, "eventfd: %s (raise the open-files limit?)", strerror(errno));
        return -KVNODE_EIO;
    }
    return 0;
}

/* Start a thread with every signal blocked: the engine's handlers run on its
 * own threads, never on the library's. */
int client_thread_start(pthread_t *t, void *(*fn)(void *), kvnode_client *c)
{
    sigset_t all, old;
    int err;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(t, NULL, fn, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return err;
}

int client_async_start(kvnode_client *c)
{
    int err = 0;

    /* The I/O thread starts with the first asynchronous MATCH or DELETE;
     * until then synchronous callers drive the socket themselves. A client
     * lent GPU memory runs it at once: the daemon's GoingAway or its end
     * must be seen, and the memory released, while the engine is idle. */
    c->poll_deadline = INT64_MIN;
    if (!c->gpu_mapped)
        return 0;
    pthread_mutex_lock(&c->lock);
    err = client_ensure_io_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (err != 0) {
        client_seterr(c, "cannot start the client's I/O thread: %s", strerror(err));
        return -KVNODE_EIO;
    }
    return 0;
}

/* Start the I/O thread (asynchronous completions must be signalled without
 * a caller inside the library) once no caller is driving the socket. 0, or
 * the error of pthread_create. */
int client_ensure_io_locked(kvnode_client *c)
{
    int err;

    if (c->io_running)
        return 0;
    c->io_wanted++;     /* no caller takes up driving meanwhile */
    while (c->driving)
        pthread_cond_wait(&c->cond, &c->lock);
    c->io_wanted--;
    if (c->io_running)
        return 0;
    err = client_thread_start(&c->io_thread, client_io_main, c);
    if (err == 0)
        c->io_running = 1;
    pthread_cond_broadcast(&c->cond);   /* callers waiting to drive: the thread reads now */
    return err;
}

void client_async_stop(kvnode_client *c)
{
    if (!c->lock_ready) {
        if (c->event_fd >= 0)
            close(c->event_fd);
        if (c->wake_fd >= 0)
            close(c->wake_fd);
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->stopping = 1;
    client_kill_locked(c, -KVNODE_ECLOSED, "cancelled: the client was closed (kvnode_close)");
    pthread_cond_broadcast(&c->job_cond);
    pthread_mutex_unlock(&c->lock);
    if (c->io_running)
        pthread_join(c->io_thread, NULL);
    if (c->worker_running)
        pthread_join(c->worker, NULL);
    c->io_running = c->worker_running = 0;
    while (c->done_head) {
        struct client_done *d = c->done_head;

        c->done_head = d->next;
        free(d);
    }
    c->done_tail = NULL;
    c->lock_ready = 0;
    pthread_cond_destroy(&c->job_cond);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    if (c->event_fd >= 0)
        close(c->event_fd);
    if (c->wake_fd >= 0)
        close(c->wake_fd);
    c->event_fd = c->wake_fd = -1;
}

/* --- synchronous requests ------------------------------------------------ */

int client_check_alive(kvnode_client *c)
{
    char msg[CLIENT_MSG_MAX];

    pthread_mutex_lock(&c->lock);
    if (!c->dead) {
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    memcpy(msg, c->dead_msg, sizeof msg);
    pthread_mutex_unlock(&c->lock);
    client_seterr(c, "connection unusable: %s", msg);
    return -KVNODE_ECLOSED;
}

uint64_t client_peek_id(kvnode_client *c)
{
    uint64_t id;

    pthread_mutex_lock(&c->lock);
    id = c->next_id;
    pthread_mutex_unlock(&c->lock);
    return id;
}

/* One step of a caller waiting with the lock held: when nobody reads the
 * socket it does, one round, for every request in flight (its own among
 * them); else it sleeps on the condition until `until` (ms). true when
 * that sleep timed out. */
static bool client_wait_step_locked(kvnode_client *c, int64_t until)
{
    if (!c->io_running && !c->driving && !c->io_wanted) {
        c->driving = 1;
        pthread_mutex_unlock(&c->lock);
        (void)client_io_step(c);
        pthread_mutex_lock(&c->lock);
        c->driving = 0;
        pthread_cond_broadcast(&c->cond);
        return false;
    }
    struct timespec ts = { .tv_sec = (time_t)(until / 1000), .tv_nsec = (long)(until % 1000) * 1000000L };
    return pthread_cond_timedwait(&c->cond, &c->lock, &ts) == ETIMEDOUT;
}

void client_response_free(kvnode_client *c, Kvnode__Response *resp)
{
    (void)c;
    if (resp)
        wire_free_response(resp);
}

int client_call(kvnode_client *c, Kvnode__Request *req, int expect, Kvnode__Response **out)
{
    const char *op = wire_op_name((int)req->op_case);
    struct client_slot s = { 0 };
    Kvnode__Response *resp;
    int rc;

    *out = NULL;
    if (client_check_alive(c) < 0)
        return -KVNODE_ECLOSED;
    pthread_mutex_lock(&c->lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->lock);
        return client_check_alive(c);
    }
    if (c->deferred_rc) {
        char msg[CLIENT_MSG_MAX];

        rc = client_take_deferred_locked(c, msg, sizeof msg);
        pthread_mutex_unlock(&c->lock);
        client_seterr(c, "%s (this %s was not sent)", msg, op);
        return rc;
    }
    rc = client_submit_locked(c, req, &s);
    if (rc < 0) {
        pthread_mutex_unlock(&c->lock);
        client_seterr(c, "%s", s.err);
        return rc;
    }
    while (!s.done) {
        int64_t until = s.deadline + CLIENT_WAIT_GRACE_MS;

        /* a dead client has finished s */
        if (client_wait_step_locked(c, until) && !s.done)
            client_kill_locked(c, -KVNODE_ETIMEDOUT, "timed out after %d ms waiting to receive "
                               "a reply", s.timeout_ms);
    }
    pthread_mutex_unlock(&c->lock);
    resp = s.resp;
    if (!resp) {
        client_seterr(c, "%s", s.err);
        return s.rc;
    }
    if (resp->error) {
        rc = client_error_code(resp->error);
        client_seterr(c, "%s", resp->error->message && resp->error->message[0]
                                   ? resp->error->message : kvnode_strerror(rc));
        wire_free_response(resp);
        return rc;
    }
    if ((int)resp->result_case != expect) {
        client_seterr(c, "protocol: %s reply carries result %d", op, (int)resp->result_case);
        wire_free_response(resp);
        return -KVNODE_EPROTO;
    }
    *out = resp;
    return 0;
}

/* --- deferred requests ---------------------------------------------------- */

int client_take_deferred_locked(kvnode_client *c, char *msg, size_t cap)
{
    int rc = c->deferred_rc;

    if (rc) {
        snprintf(msg, cap, "%s", c->deferred_msg);
        c->deferred_rc = 0;
        c->deferred_msg[0] = '\0';
    }
    return rc;
}

int client_call_deferred(kvnode_client *c, Kvnode__Request *req, uint64_t lease)
{
    const char *op = wire_op_name((int)req->op_case);
    char msg[CLIENT_MSG_MAX];
    struct client_slot *s;
    int rc;

    if (client_check_alive(c) < 0)
        return -KVNODE_ECLOSED;
    s = calloc(1, sizeof *s);
    if (!s) {
        client_seterr(c, "%s: out of memory", op);
        return -KVNODE_ENOMEM;
    }
    s->deferred = 1;
    s->lease = lease;
    s->op = (int)req->op_case;
    pthread_mutex_lock(&c->lock);
    if (c->dead) {
        pthread_mutex_unlock(&c->lock);
        free(s);
        return client_check_alive(c);
    }
    if (c->deferred_rc) {
        rc = client_take_deferred_locked(c, msg, sizeof msg);
        pthread_mutex_unlock(&c->lock);
        free(s);
        client_seterr(c, "%s (this %s was not sent)", msg, op);
        return rc;
    }
    /* Counted before the send: a send that ends the connection finishes
     * (and frees) s at once. */
    c->n_deferred++;
    rc = client_submit_locked(c, req, s);
    if (rc < 0) {
        c->n_deferred--;
        pthread_mutex_unlock(&c->lock);
        client_seterr(c, "%s", s->err);
        free(s);
        return rc;
    }
    pthread_mutex_unlock(&c->lock);
    return 0;
}

int client_flush(kvnode_client *c)
{
    char msg[CLIENT_MSG_MAX];
    int64_t deadline = client_now_ms() + c->timeout_ms;
    int rc;

    pthread_mutex_lock(&c->lock);
    if (c->n_deferred && !c->dead) {
        /* From now on the deferred requests are waited for: the client's
         * timeout bounds them like any request's. */
        for (struct client_slot *s = c->slots; s; s = s->next)
            if (s->deferred && s->deadline > deadline)
                s->deadline = deadline;
        if (deadline < c->poll_deadline)
            client_wake_io(c);
    }
    while (c->n_deferred && !c->dead) {
        int64_t until = deadline + CLIENT_WAIT_GRACE_MS;

        if (client_wait_step_locked(c, until) && c->n_deferred)
            client_kill_locked(c, -KVNODE_ETIMEDOUT, "timed out after %d ms waiting to receive "
                               "a reply", c->timeout_ms);
    }
    rc = client_take_deferred_locked(c, msg, sizeof msg);
    pthread_mutex_unlock(&c->lock);
    if (rc) {
        client_seterr(c, "%s", msg);
        return rc;
    }
    return client_check_alive(c);
}
