/* takeover: see takeover.h. */
#include "takeover.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/log.h"
#include "net/unix_listen.h"
#include "warm.h"

#define TAKEOVER_REQUEST "TAKEOVER 1\n"
#define TAKEOVER_READ_MS 5000      /* a peer's request arrives within this */
#define TAKEOVER_BUF 4096

struct takeover {
    struct event_base *base;
    char   path[sizeof(((struct sockaddr_un *)0)->sun_path) + 16];
    int    listen_fd;
    struct event *accept_ev;
    int    pending_fd;              /* accepted, its request not read yet */
    struct event *pending_ev;
    int    peer_fd;                 /* admitted: gets the hand-over */
    void (*begin_stop)(void *arg);
    void  *arg;
};

static void takeover_say(int fd, const char *line)
{
    ssize_t w = send(fd, line, strlen(line), MSG_NOSIGNAL);
    (void)w;
}

static void takeover_drop_pending(struct takeover *tk)
{
    if (tk->pending_ev)
        event_free(tk->pending_ev);
    tk->pending_ev = NULL;
    if (tk->pending_fd >= 0)
        close(tk->pending_fd);
    tk->pending_fd = -1;
}

static void takeover_request_cb(evutil_socket_t fd, short what, void *arg)
{
    struct takeover *tk = arg;
    char buf[64];
    ssize_t r = (what & EV_READ) ? recv(fd, buf, sizeof buf - 1, 0) : -1;

    if (r != (ssize_t)strlen(TAKEOVER_REQUEST) || memcmp(buf, TAKEOVER_REQUEST, (size_t)r) != 0) {
        takeover_say(fd, "ERR not a takeover request\n");
        log_warn("takeover: a request that is not one (or none within %d ms): ignored", TAKEOVER_READ_MS);
        takeover_drop_pending(tk);
        return;
    }
    if (tk->peer_fd >= 0) {
        takeover_say(fd, "ERR another takeover is under way\n");
        takeover_drop_pending(tk);
        return;
    }
    takeover_say(fd, "OK\n");
    event_free(tk->pending_ev);
    tk->pending_ev = NULL;
    tk->peer_fd = tk->pending_fd;
    tk->pending_fd = -1;
    log_info("takeover: a new kvnoded asked to take over: stopping, then handing the host tier over");
    tk->begin_stop(tk->arg);
}

/* Only the daemon's own uid or root: the hand-over is the whole cache. */
static void takeover_accept_cb(evutil_socket_t lfd, short what, void *arg)
{
    struct takeover *tk = arg;
    struct ucred cred;
    socklen_t len = sizeof cred;
    char why[96];
    (void)what;

    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || (cred.uid != 0 && cred.uid != geteuid())) {
        snprintf(why, sizeof why, "ERR uid %d may not take over (only uid %d or root)\n",
                 len == sizeof cred ? (int)cred.uid : -1, (int)geteuid());
        takeover_say(fd, why);
        log_warn("takeover: refused pid %d uid %d: only the daemon's uid (%d) or root may take over",
                 (int)cred.pid, (int)cred.uid, (int)geteuid());
        close(fd);
        return;
    }
    if (tk->pending_fd >= 0 || tk->peer_fd >= 0) {
        takeover_say(fd, "ERR another takeover is under way\n");
        close(fd);
        return;
    }
    struct timeval tv = { TAKEOVER_READ_MS / 1000, 0 };
    tk->pending_fd = fd;
    tk->pending_ev = event_new(tk->base, fd, EV_READ, takeover_request_cb, tk);
    if (!tk->pending_ev || event_add(tk->pending_ev, &tv) != 0)
        takeover_drop_pending(tk);
}

int takeover_listen(struct event_base *base, const char *engine_path, void (*begin_stop)(void *arg), void *arg,
                    struct takeover **out, char *err, size_t errlen)
{
    struct takeover *tk = calloc(1, sizeof *tk);

    *out = NULL;
    if (!tk) {
        snprintf(err, errlen, "takeover: out of memory");
        return -1;
    }
    tk->base = base;
    tk->listen_fd = tk->pending_fd = tk->peer_fd = -1;
    tk->begin_stop = begin_stop;
    tk->arg = arg;
    if ((size_t)snprintf(tk->path, sizeof tk->path, "%s%s", engine_path, TAKEOVER_SUFFIX) >=
        sizeof(((struct sockaddr_un *)0)->sun_path)) {
        log_warn("takeover: %s%s is too long for a unix socket: kvnoded --takeover cannot reach this daemon",
                 engine_path, TAKEOVER_SUFFIX);
        *out = tk;
        return 0;
    }
    tk->listen_fd = unix_listen(tk->path, 0600, 4, "takeover socket", err, errlen);
    if (tk->listen_fd < 0 ||
        !(tk->accept_ev = event_new(base, tk->listen_fd, EV_READ | EV_PERSIST, takeover_accept_cb, tk)) ||
        event_add(tk->accept_ev, NULL) != 0) {
        takeover_destroy(tk);
        return -1;
    }
    *out = tk;
    return 0;
}

static void takeover_close_listener(struct takeover *tk)
{
    takeover_drop_pending(tk);
    if (tk->accept_ev)
        event_free(tk->accept_ev);
    tk->accept_ev = NULL;
    if (tk->listen_fd >= 0) {
        close(tk->listen_fd);
        unlink(tk->path);
    }
    tk->listen_fd = -1;
}

bool takeover_handover(struct takeover *tk, struct tenants *ts, const struct kvn_config *cfg)
{
    struct sdn_fd fds[WARM_FDS_MAX];
    char msg[TAKEOVER_BUF];
    int raw[WARM_FDS_MAX];
    size_t n, len;

    if (!tk)
        return false;
    takeover_close_listener(tk);
    if (tk->peer_fd < 0)
        return false;
    n = warm_build(ts, cfg, fds);
    len = (size_t)snprintf(msg, sizeof msg, "FDS %zu\n", n);
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(msg + len, sizeof msg - len, "%s\n", fds[i].name);
        raw[i] = fds[i].fd;
    }
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof raw)]; } ctl;
    struct iovec iov = { msg, len };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (n) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(c), raw, n * sizeof(int));
    }
    /* The peer waits on a blocking read: the whole message goes at once. */
    int fl = fcntl(tk->peer_fd, F_GETFL);
    if (fl >= 0)
        fcntl(tk->peer_fd, F_SETFL, fl & ~O_NONBLOCK);
    if (sendmsg(tk->peer_fd, &mh, MSG_NOSIGNAL) != (ssize_t)len)
        log_warn("takeover: cannot hand over to the new daemon: %s", strerror(errno));
    else if (n) {
        warm_handed_over();
        log_info("takeover: %zu descriptors handed to the new daemon", n);
    }
    warm_close_fds(fds, n);
    return true;
}

void takeover_destroy(struct takeover *tk)
{
    if (!tk)
        return;
    takeover_close_listener(tk);
    /* tk->peer_fd is left open on purpose: the new daemon reads its end as
     * "the old process has exited" (the kernel closes it then). */
    free(tk);
}

/* ---- the new daemon ---------------------------------------------------- */

static long takeover_ms_left(const struct timespec *end)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (end->tv_sec - now.tv_sec) * 1000 + (end->tv_nsec - now.tv_nsec) / 1000000;
}

/* Read what the old daemon sends until `done` says it is whole, or EOF
 * (-1 then, *eof set), keeping any descriptors that come with it. */
static ssize_t takeover_recv(int fd, char *buf, size_t cap, size_t *have, int *fds, size_t *nfds, size_t max,
                             long wait_ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    if (wait_ms <= 0 || poll(&p, 1, (int)(wait_ms > INT_MAX ? INT_MAX : wait_ms)) <= 0)
        return 0;
    union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int) * WARM_FDS_MAX * 2)]; } ctl;
    struct iovec iov = { buf + *have, cap - 1 - *have };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b };
    ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    if (r <= 0)
        return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int f;
            memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
            if (*nfds < max)
                fds[(*nfds)++] = f;
            else
                close(f);
        }
    }
    *have += (size_t)r;
    buf[*have] = '\0';
    return r;
}

/* "FDS n\n" and n names, whole in buf. */
static bool takeover_parse(const char *buf, size_t *n)
{
    const char *p = strstr(buf, "FDS ");
    unsigned long k;
    if (!p || sscanf(p, "FDS %lu", &k) != 1 || k > WARM_FDS_MAX)
        return false;
    size_t lines = 0;
    for (const char *q = p; *q; q++)
        lines += *q == '\n';
    *n = k;
    return lines >= k + 1;
}

int takeover_request(const char *engine_path, unsigned stop_ms, struct sdn_fd *out, size_t max, size_t *n,
                     char *err, size_t errlen)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    char buf[TAKEOVER_BUF];
    int fds[WARM_FDS_MAX], fd;
    size_t have = 0, nfds = 0, want = 0;
    struct timespec end;

    *n = 0;
    buf[0] = '\0';
    if ((size_t)snprintf(sa.sun_path, sizeof sa.sun_path, "%s%s", engine_path, TAKEOVER_SUFFIX) >=
        sizeof sa.sun_path) {
        snprintf(err, errlen, "%s%s is too long for a unix socket", engine_path, TAKEOVER_SUFFIX);
        return -1;
    }
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        snprintf(err, errlen, "no daemon to take over from at %s: %s", sa.sun_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += 10;
    /* A refusal may come (and the connection end) before the request is
     * sent: its answer is read either way. */
    ssize_t sent = send(fd, TAKEOVER_REQUEST, strlen(TAKEOVER_REQUEST), MSG_NOSIGNAL);
    (void)sent;
    while (!strchr(buf, '\n') && takeover_recv(fd, buf, sizeof buf, &have, fds, &nfds, WARM_FDS_MAX,
                                              takeover_ms_left(&end)) > 0)
        buf[have] = '\0';
    buf[have] = '\0';
    if (strncmp(buf, "OK\n", 3) != 0) {
        char *nl = strchr(buf, '\n');
        if (nl)
            *nl = '\0';
        snprintf(err, errlen, "the daemon at %s refused: %s", engine_path,
                 have ? (strncmp(buf, "ERR ", 4) == 0 ? buf + 4 : buf) : "no answer");
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        close(fd);
        return -1;
    }
    /* It is stopping: from here on this daemon starts whatever comes. */
    log_info("takeover: the daemon at %s is stopping (at most %u ms) to hand over its host tier", engine_path,
             stop_ms);
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += stop_ms / 1000 + 1;
    while (!takeover_parse(buf, &want) &&
           takeover_recv(fd, buf, sizeof buf, &have, fds, &nfds, WARM_FDS_MAX, takeover_ms_left(&end)) > 0)
        ;
    bool whole = takeover_parse(buf, &want) && want == nfds;
    const char *p = strstr(buf, "FDS ");
    p = p ? strchr(p, '\n') : NULL;
    for (size_t i = 0; whole && i < nfds && i < max && p; i++) {
        const char *e = strchr(p + 1, '\n');
        out[i].fd = fds[i];
        snprintf(out[i].name, sizeof out[i].name, "%.*s", e ? (int)(e - p - 1) : 0, p + 1);
        p = e;
        (*n)++;
    }
    for (size_t i = *n; i < nfds; i++)
        close(fds[i]);
    if (!whole)
        log_warn("takeover: the old daemon handed over nothing whole: starting cold");
    /* Its end: the engine socket path and the store are free. */
    do
        have = 0;
    while (takeover_recv(fd, buf, sizeof buf, &have, fds, &nfds, 0, takeover_ms_left(&end)) > 0);
    close(fd);
    return 0;
}
