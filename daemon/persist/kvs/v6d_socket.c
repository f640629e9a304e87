/* kvs/v6d socket: the data plane — the unix-socket handshake (register, ask
 * for the arena fd, receive it by SCM_RIGHTS, map it) under one deadline,
 * length-prefixed frames with a size cap, and the liveness check that tells
 * a stale mapping. Worker threads, one handle each. */
#include "persist/kvs/v6d_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/le.h"
#include "core/clock.h"
#include "core/errmsg.h"
#include "kvnode.h"

/* ---- data plane ------------------------------------------------------------------ */

void v6d_dp_down(struct kvs_store *s)
{
    if (s->map)
        munmap(s->map, s->map_size);
    s->map = NULL;
    s->map_size = 0;
    if (s->dp_fd >= 0)
        close(s->dp_fd);
    s->dp_fd = -1;
}

/* Wait for ev on fd until deadline: 0, or -KVNODE_ETIMEDOUT / -KVNODE_EIO. */
static int wait_fd(int fd, short ev, uint64_t deadline)
{
    for (;;) {
        uint64_t now = clock_now_ms();
        if (now >= deadline)
            return -KVNODE_ETIMEDOUT;
        struct pollfd p = { .fd = fd, .events = ev };
        int r = poll(&p, 1, (int)(deadline - now));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -KVNODE_EIO;
    }
}

static int send_all(int fd, const void *buf, size_t n, uint64_t deadline)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc < 0)
                return rc;
        } else {
            return -KVNODE_ECLOSED;
        }
    }
    return 0;
}

/* Read exactly n bytes (never more: an fd follows some replies). */
static int recv_all(int fd, void *buf, size_t n, uint64_t deadline)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc < 0)
                return rc;
        } else {
            return -KVNODE_ECLOSED;
        }
    }
    return 0;
}

static int send_frame(int fd, const char *json, uint64_t deadline)
{
    uint8_t hdr[8];
    uint64_t len = strlen(json);
    le_put64(hdr, len);
    int rc = send_all(fd, hdr, sizeof hdr, deadline);
    return rc < 0 ? rc : send_all(fd, json, len, deadline);
}

/* One reply frame (malloc'd, NUL-terminated) capped at V6D_MAX_FRAME. */
static int recv_frame(int fd, char **out, size_t *outlen, uint64_t deadline, char *err,
                      size_t errlen)
{
    uint8_t hdr[8];
    int rc = recv_all(fd, hdr, sizeof hdr, deadline);
    if (rc < 0) {
        errmsg_set(err, errlen, "reading a reply header: %s",
                   rc == -KVNODE_ETIMEDOUT ? "timed out" : "connection closed");
        return rc;
    }
    uint64_t len = le_get64(hdr);
    if (len > V6D_MAX_FRAME) {
        errmsg_set(err, errlen, "reply of %" PRIu64 " bytes refused (limit %u)", len,
                   V6D_MAX_FRAME);
        return -KVNODE_ETOOBIG;
    }
    char *p = malloc((size_t)len + 1);
    if (!p) {
        errmsg_set(err, errlen, "out of memory");
        return -KVNODE_ENOMEM;
    }
    rc = recv_all(fd, p, (size_t)len, deadline);
    if (rc < 0) {
        free(p);
        errmsg_set(err, errlen, "reading a reply body: %s",
                   rc == -KVNODE_ETIMEDOUT ? "timed out" : "connection closed");
        return rc;
    }
    p[len] = '\0';
    *out = p;
    *outlen = (size_t)len;
    return 0;
}

/* Receive one fd with a 1-byte payload; extra fds are closed. */
static int recv_fd(int sock, int *fd_out, uint64_t deadline, char *err, size_t errlen)
{
    for (;;) {
        char byte;
        struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
        union { char buf[CMSG_SPACE(4 * sizeof(int))]; struct cmsghdr align; } u;
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                              .msg_controllen = sizeof u.buf };
        ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = wait_fd(sock, POLLIN, deadline);
            if (rc < 0) {
                errmsg_set(err, errlen, "waiting for the arena fd: timed out");
                return rc;
            }
            continue;
        }
        if (r != 1) {
            errmsg_set(err, errlen, "waiting for the arena fd: connection closed");
            return -KVNODE_ECLOSED;
        }
        int got = -1, count = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
                if (count++ == 0)
                    got = fd;
                else
                    close(fd);
            }
        }
        if (count != 1 || (msg.msg_flags & MSG_CTRUNC)) {
            if (got >= 0)
                close(got);
            errmsg_set(err, errlen, "expected exactly one fd with the arena reply, got %d%s",
                       count, (msg.msg_flags & MSG_CTRUNC) ? " (truncated)" : "");
            return -KVNODE_EPROTO;
        }
        *fd_out = got;
        return 0;
    }
}

int v6d_dp_connect(struct kvs_store *s, char *err, size_t errlen)
{
    char e[384] = "";
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    char *reply = NULL;
    size_t rlen = 0;
    int arena = -1, rc;
    uint64_t deadline = clock_now_ms() + s->timeout_ms;

    v6d_dp_down(s);
    if (strlen(s->sock_path) >= sizeof sun.sun_path) {
        errmsg_set(err, errlen, "v6d socket path %s is too long", s->sock_path);
        return -KVNODE_EINVAL;
    }
    memcpy(sun.sun_path, s->sock_path, strlen(s->sock_path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        errmsg_set(err, errlen, "socket: %s", strerror(errno));
        return -KVNODE_EIO;
    }
    s->dp_fd = fd;
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun) < 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            errmsg_set(err, errlen, "v6d: connect %s: %s", s->sock_path, strerror(errno));
            rc = -KVNODE_ECONNECT;
            goto fail;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if ((rc = wait_fd(fd, POLLOUT, deadline)) < 0 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
            errmsg_set(err, errlen, "v6d: connect %s: %s", s->sock_path,
                       rc < 0 ? "timed out" : strerror(soerr ? soerr : errno));
            rc = rc < 0 ? rc : -KVNODE_ECONNECT;
            goto fail;
        }
    }
    rc = send_frame(fd, "{\"type\":\"register_request\",\"version\":\"0.0.0\",\"store_type\":0,"
                        "\"session_id\":0,\"username\":\"\",\"password\":\"\"}", deadline);
    if (rc < 0) {
        snprintf(e, sizeof e, "sending register_request failed");
        goto fail_e;
    }
    if ((rc = recv_frame(fd, &reply, &rlen, deadline, e, sizeof e)) < 0)
        goto fail_e;
    if (!memmem(reply, rlen, "register_reply", 14)) {
        char sn[SNIPPET];
        errmsg_snippet(reply, rlen, sn, sizeof sn);
        snprintf(e, sizeof e, "register refused: %s", sn);
        rc = -KVNODE_EPROTO;
        goto fail_e;
    }
    free(reply);
    reply = NULL;
    rc = send_frame(fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}", deadline);
    if (rc < 0) {
        snprintf(e, sizeof e, "sending get_vineyard_mmap_fd_request failed");
        goto fail_e;
    }
    if ((rc = recv_frame(fd, &reply, &rlen, deadline, e, sizeof e)) < 0)
        goto fail_e;
    json_t *doc = v6d_parse_doc(reply, rlen, e, sizeof e);
    uint64_t size = 0, offset = 0;
    bool ok = doc && v6d_get_u64(json_object_get(doc, "size"), &size) && size > 0 &&
              size <= SIZE_MAX && v6d_get_u64(json_object_get(doc, "offset"), &offset);
    json_decref(doc);
    if (!ok) {
        char sn[SNIPPET];
        errmsg_snippet(reply, rlen, sn, sizeof sn);
        if (doc || !e[0])
            snprintf(e, sizeof e, "mmap fd reply without a valid size/offset: %s", sn);
        rc = -KVNODE_EPROTO;
        goto fail_e;
    }
    if ((rc = recv_fd(fd, &arena, deadline, e, sizeof e)) < 0)
        goto fail_e;
    struct stat st;
    if (fstat(arena, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < size) {
        snprintf(e, sizeof e, "arena fd holds %lld bytes, reply said %" PRIu64,
                 (long long)st.st_size, size);
        rc = -KVNODE_EPROTO;
        goto fail_e;
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, arena, 0);
    if (m == MAP_FAILED) {
        snprintf(e, sizeof e, "mmap of %" PRIu64 " bytes: %s", size, strerror(errno));
        rc = -KVNODE_EIO;
        goto fail_e;
    }
    close(arena);
    free(reply);
    s->map = m;
    s->map_size = (size_t)size;
    (void)offset;   /* the mapping is [0,size); data_offsets are relative to it */
    return 0;

fail_e:
    errmsg_set(err, errlen, "v6d: handshake on %s: %s", s->sock_path, e);
fail:
    if (arena >= 0)
        close(arena);
    free(reply);
    v6d_dp_down(s);
    return rc;
}

/* The data-plane connection still stands (the store has not closed it, so the
 * mapping is the store's current arena). */
bool v6d_dp_alive(struct kvs_store *s)
{
    if (s->dp_fd < 0 || !s->map)
        return false;
    struct pollfd p = { .fd = s->dp_fd, .events = POLLIN | POLLRDHUP };
    int r = poll(&p, 1, 0);
    if (r == 0)
        return true;
    return false;   /* EOF, error, or unsolicited data: treat as gone */
}

int v6d_dp_ensure(struct kvs_store *s, char *err, size_t errlen)
{
    if (v6d_dp_alive(s))
        return 0;
    return v6d_dp_connect(s, err, errlen);
}
