/* client_io: blocking frame I/O on the client's socket (see client_internal.h).
 * Used for the HELLO exchange only, before the I/O thread (client_async.c)
 * owns the socket; that thread reuses the fd-passing helpers. A frame is read
 * with recvmsg so that fds passed with it (SCM_RIGHTS, HELLO's arenas) are
 * collected into c->rx_fds. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"

void client_kill_direct(kvnode_client *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->dead_msg, sizeof c->dead_msg, fmt, ap);
    va_end(ap);
    c->dead = 1;
    client_seterr(c, "%s", c->dead_msg);
}

/* --- time ------------------------------------------------------------------ */

int64_t client_now_ms(void)
{
    struct timespec ts;

    /* CLOCK_MONOTONIC cannot fail on Linux with a valid pointer. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int client_remaining_ms(int64_t deadline)
{
    int64_t left = deadline - client_now_ms();

    if (left <= 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* Wait for `events` on c->fd until the deadline. 0 ready, or a negative code
 * (connection marked dead). */
int client_wait(kvnode_client *c, short events, int64_t deadline, const char *what)
{
    for (;;) {
        struct pollfd p = { .fd = c->fd, .events = events };
        int left = client_remaining_ms(deadline);
        int n;

        if (left == 0) {
            client_kill_direct(c, "timed out after %d ms waiting to %s", c->timeout_ms, what);
            return -KVNODE_ETIMEDOUT;
        }
        n = poll(&p, 1, left);
        if (n > 0)
            return 0;   /* readable/writable or error: the I/O call will tell */
        if (n < 0 && errno != EINTR) {
            client_kill_direct(c, "poll: %s", strerror(errno));
            return -KVNODE_EIO;
        }
    }
}

/* --- frame I/O --------------------------------------------------------------- */

static int client_send_all(kvnode_client *c, const uint8_t *buf, size_t len, int64_t deadline)
{
    while (len > 0) {
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = client_wait(c, POLLOUT, deadline, "send a request");
            if (rc < 0)
                return rc;
            continue;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            client_kill_direct(c, "daemon closed the connection");
            return -KVNODE_ECLOSED;
        }
        client_kill_direct(c, "send: %s", n < 0 ? strerror(errno) : "wrote nothing");
        return -KVNODE_EIO;
    }
    return 0;
}

/* Keep fds passed with a frame; close what does not fit. */
void client_take_fds(kvnode_client *c, struct msghdr *mh)
{
    struct cmsghdr *cm;

    if (mh->msg_flags & MSG_CTRUNC)
        c->rx_ctrunc = 1;
    for (cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        size_t nfd, i;

        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
            cm->cmsg_len < CMSG_LEN(0))
            continue;
        nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (i = 0; i < nfd; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (c->n_rx_fds < CLIENT_MAX_FDS) {
                c->rx_fds[c->n_rx_fds++] = fd;
            } else {
                c->rx_ctrunc = 1;
                close(fd);
            }
        }
    }
}

void client_drop_fds(kvnode_client *c)
{
    size_t i;

    for (i = 0; i < c->n_rx_fds; i++)
        close(c->rx_fds[i]);
    c->n_rx_fds = 0;
    c->rx_ctrunc = 0;
}

/* Read exactly len bytes with recvmsg(), collecting passed fds. */
static int client_recv_all(kvnode_client *c, uint8_t *buf, size_t len, int64_t deadline)
{
    while (len > 0) {
        union {
            char buf[CMSG_SPACE(sizeof(int) * CLIENT_MAX_FDS)];
            struct cmsghdr align;
        } cbuf;
        struct iovec iov = { .iov_base = buf, .iov_len = len };
        struct msghdr mh = { 0 };
        ssize_t n;

        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = sizeof cbuf.buf;
        n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n > 0) {
            client_take_fds(c, &mh);
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) {
            client_kill_direct(c, "daemon closed the connection");
            return -KVNODE_ECLOSED;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = client_wait(c, POLLIN, deadline, "receive a reply");
            if (rc < 0)
                return rc;
            continue;
        }
        if (errno == ECONNRESET) {
            client_kill_direct(c, "daemon closed the connection");
            return -KVNODE_ECLOSED;
        }
        client_kill_direct(c, "recvmsg: %s", strerror(errno));
        return -KVNODE_EIO;
    }
    return 0;
}

/* Read one response frame and decode it. */
static int client_recv_response(kvnode_client *c, int64_t deadline, Kvnode__Response **out)
{
    uint8_t hdr[WIRE_HEADER_BYTES];
    uint32_t len;
    uint8_t *payload;
    int rc;

    *out = NULL;
    rc = client_recv_all(c, hdr, sizeof hdr, deadline);
    if (rc < 0)
        return rc;
    rc = wire_frame_len(hdr, c->recv_max, &len);
    if (rc == -KVNODE_ETOOBIG) {
        uint32_t claimed = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                           (uint32_t)hdr[3] << 24;
        client_kill_direct(c, "protocol: reply frame of %" PRIu32 " bytes exceeds the limit of %" PRIu32,
                    claimed, c->recv_max);
        return -KVNODE_EPROTO;
    }
    if (rc < 0) {
        client_kill_direct(c, "protocol: empty reply frame");
        return -KVNODE_EPROTO;
    }
    if (len > c->rx_cap) {
        payload = realloc(c->rx_buf, len);
        if (payload) {
            c->rx_buf = payload;
            c->rx_cap = len;
        }
    } else {
        payload = c->rx_buf;
    }
    if (!payload || len > c->rx_cap) {
        /* The unread payload would desync the stream. */
        client_kill_direct(c, "out of memory for a reply of %" PRIu32 " bytes", len);
        return -KVNODE_ENOMEM;
    }
    rc = client_recv_all(c, payload, len, deadline);
    if (rc < 0)
        return rc;
    *out = wire_unpack_response(payload, len);
    if (!*out) {
        client_kill_direct(c, "protocol: undecodable reply frame of %" PRIu32 " bytes", len);
        return -KVNODE_EPROTO;
    }
    if (c->rx_ctrunc) {
        client_response_free(c, *out);
        *out = NULL;
        client_kill_direct(c, "protocol: more passed fds than the library accepts (%d)", CLIENT_MAX_FDS);
        return -KVNODE_EPROTO;
    }
    return 0;
}

/* Error code from the daemon: negative KVNODE_E*; anything else is malformed. */
int client_error_code(const Kvnode__Error *e)
{
    return e->code < 0 ? e->code : -KVNODE_EPROTO;
}

/* Send req and wait for its response with the expected result case.
 * On success *out is the response (caller frees). Fds passed with a HELLO
 * reply stay in c->rx_fds for client_setup; any other passed fd is closed. */
int client_call_direct(kvnode_client *c, Kvnode__Request *req, int expect,
                       Kvnode__Response **out)
{
    int64_t deadline = client_now_ms() + c->timeout_ms;
    Kvnode__Response *resp;
    uint8_t *frame;
    size_t frame_len;
    const char *op = wire_op_name((int)req->op_case);
    int rc;

    *out = NULL;
    if (c->dead) {
        client_seterr(c, "connection unusable: %s", c->dead_msg);
        return -KVNODE_ECLOSED;
    }
    client_drop_fds(c);
    req->id = c->next_id++;
    rc = wire_pack_reuse(&req->base, c->send_max, &c->tx_buf, &c->tx_cap, &frame_len);
    frame = c->tx_buf;
    if (rc < 0)
        c->next_id--;   /* nothing was sent: keep the ids the daemon sees dense */
    if (rc == -KVNODE_ETOOBIG) {
        client_seterr(c, "%s request of %zu bytes exceeds the frame limit of %" PRIu32 " bytes",
                      op, protobuf_c_message_get_packed_size(&req->base), c->send_max);
        return rc;
    }
    if (rc < 0) {
        client_seterr(c, "cannot pack a %s request: %s", op, kvnode_strerror(rc));
        return rc;
    }
    rc = client_send_all(c, frame, frame_len, deadline);
    if (rc == -KVNODE_ECLOSED) {
        /* A daemon that refuses a connection says why and closes at once,
         * maybe before our request went out: its reason is still waiting in
         * the receive queue, and it is the better error to report. */
        int64_t brief = client_now_ms() + 100;
        if (client_recv_response(c, brief < deadline ? brief : deadline, &resp) == 0) {
            if (resp->id == 0 && resp->error) {
                rc = client_error_code(resp->error);
                client_kill_direct(c, "daemon: %s", resp->error->message);
            }
            client_response_free(c, resp);
        }
        client_drop_fds(c);
        if (rc == -KVNODE_ECLOSED)
            client_kill_direct(c, "daemon closed the connection");
        return rc;
    }
    if (rc < 0)
        return rc;
    rc = client_recv_response(c, deadline, &resp);
    if (rc < 0) {
        client_drop_fds(c);
        return rc;
    }
    if (resp->id != req->id) {
        /* id 0 is the daemon refusing the connection (then it closes). */
        if (resp->id == 0 && resp->error) {
            rc = client_error_code(resp->error);
            client_kill_direct(c, "daemon: %s", resp->error->message);
        } else {
            rc = -KVNODE_EPROTO;
            client_kill_direct(c, "protocol: reply id %" PRIu64 " to %s request %" PRIu64, resp->id,
                        op, req->id);
        }
        client_response_free(c, resp);
        client_drop_fds(c);
        return rc;
    }
    if (resp->error) {
        rc = client_error_code(resp->error);
        client_seterr(c, "%s", resp->error->message[0] ? resp->error->message
                                                        : kvnode_strerror(rc));
        client_response_free(c, resp);
        client_drop_fds(c);
        return rc;
    }
    if ((int)resp->result_case != expect) {
        client_seterr(c, "protocol: %s reply carries result %d", op, (int)resp->result_case);
        client_response_free(c, resp);
        client_drop_fds(c);
        return -KVNODE_EPROTO;
    }
    if (expect != KVNODE__RESPONSE__RESULT_HELLO)
        client_drop_fds(c);     /* only HELLO may pass fds */
    *out = resp;
    return 0;
}

