/* server: listener, connections and frame I/O on the loop (see server.h). */
#include "server.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "kvnode.h"
#include "log.h"
#include "ops.h"
#include "wire.h"

#define READ_CHUNK (1u << 20)
#define MAX_PASSED_FDS 8u
/* Stop reading from a client whose replies pile up beyond this. */
#define OUTPUT_HIGH_WATER (64u << 20)

struct conn {
    struct server *srv;
    int fd;
    struct event *rev, *wev;
    struct evbuffer *in, *out;
    bool closing;            /* close once `out` drains */
    bool reading;
    bool deferred;           /* a request answers later: handle nothing more until then */
    struct event *resume_ev; /* handles the input that waited behind a deferred request */
    uint64_t bytes_sent;     /* stream offset of the next byte to send */
    /* fds to attach to the byte at stream offset fds_at (one batch at a time;
     * HELLO is the only reply that carries fds) */
    int fds[MAX_PASSED_FDS];
    size_t nfds;
    uint64_t fds_at;
    struct session session;
    struct conn *prev, *next;
};

struct server {
    struct event_base *base;
    const struct kvn_config *cfg;
    struct ops *ops;
    struct evconnlistener *listener;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lock_fd;
    char lock_path[PATH_MAX];
    bool inherited;          /* socket-activated: not ours to unlink */
    struct conn *conns;
    size_t nconns;
    bool stopping;
    struct event *stop_timer;
    /* counters */
    uint64_t accepted, refused, frames_rejected, denied;
    /* access lists resolved from cfg (empty: anyone who can open the socket) */
    uint32_t allow_uids[CONFIG_IDS_MAX], allow_gids[CONFIG_IDS_MAX];
    size_t n_allow_uids, n_allow_gids;
};

static void conn_destroy(struct conn *c);
static int conn_flush(struct conn *c);

/* --- listener ------------------------------------------------------------- */

/* Take the socket path: hold PATH.lock so two daemons never race for it,
 * refuse when a live daemon answers on it, replace a stale socket file. */
static int server_claim_path(struct server *s, char *err, size_t errlen)
{
    struct stat st;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int probe;

    snprintf(s->lock_path, sizeof s->lock_path, "%s.lock", s->path);
    s->lock_fd = open(s->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lock_fd < 0) {
        snprintf(err, errlen, "cannot open lock file %s: %s", s->lock_path, strerror(errno));
        return -KVNODE_EIO;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        snprintf(err, errlen, "another kvnoded is already serving on %s (it holds %s)",
                 s->path, s->lock_path);
        close(s->lock_fd);
        s->lock_fd = -1;
        return -KVNODE_EIO;
    }
    if (lstat(s->path, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot stat socket path %s: %s", s->path, strerror(errno));
        return -KVNODE_EIO;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a socket; refusing to replace it", s->path);
        return -KVNODE_EIO;
    }
    /* A daemon without our lock file (older build, other lock dir) may still
     * be serving: ask the socket itself. */
    probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -KVNODE_EIO;
    }
    memcpy(sa.sun_path, s->path, strlen(s->path) + 1);
    if (connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0) {
        close(probe);
        snprintf(err, errlen, "another kvnoded is already serving on %s", s->path);
        return -KVNODE_EIO;
    }
    close(probe);
    log_info("replacing stale socket file %s", s->path);
    if (unlink(s->path) < 0 && errno != ENOENT) {
        snprintf(err, errlen, "cannot remove stale socket %s: %s", s->path, strerror(errno));
        return -KVNODE_EIO;
    }
    return 0;
}

static int server_bind(struct server *s, char *err, size_t errlen)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    memcpy(sa.sun_path, s->path, strlen(s->path) + 1);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        snprintf(err, errlen, "cannot bind %s: %s", s->path, strerror(errno));
        close(fd);
        return -1;
    }
    if (chmod(s->path, s->cfg->socket_mode) < 0) {
        snprintf(err, errlen, "cannot chmod %s to %04o: %s", s->path, s->cfg->socket_mode,
                 strerror(errno));
        close(fd);
        unlink(s->path);
        return -1;
    }
    if (s->cfg->socket_group[0]) {
        uint32_t gid;
        char problem[256] = "";
        if (config_parse_group(s->cfg->socket_group, &gid, problem, sizeof problem) < 0 ||
            chown(s->path, (uid_t)-1, (gid_t)gid) < 0) {
            snprintf(err, errlen, "cannot give %s to group %s: %s", s->path, s->cfg->socket_group,
                     problem[0] ? problem : strerror(errno));
            close(fd);
            unlink(s->path);
            return -1;
        }
    }
    if (listen(fd, 512) < 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", s->path, strerror(errno));
        close(fd);
        unlink(s->path);
        return -1;
    }
    return fd;
}

/* Refuse a connection with one error frame (best effort) and close it. */
static void server_refuse(int fd, int code, const char *msg)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__Error e = KVNODE__ERROR__INIT;
    uint8_t *frame;
    size_t len;

    e.code = code;
    e.message = (char *)msg;
    resp.error = &e;
    if (wire_pack(&resp.base, WIRE_FRAME_LIMIT, &frame, &len) == 0) {
        ssize_t w = send(fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        free(frame);
    }
    close(fd);
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg);
static void conn_write_cb(evutil_socket_t fd, short what, void *arg);

/* Resolve the configured allow lists. Names were checked when the config
 * was parsed; one that vanished since is logged and the list kept as it was. */
static void server_load_access(struct server *s, const struct kvn_config *cfg)
{
    uint32_t uids[CONFIG_IDS_MAX], gids[CONFIG_IDS_MAX];
    size_t nu, ng;
    char problem[256];

    if (config_parse_idlist(cfg->allow_uids, 0, uids, CONFIG_IDS_MAX, &nu, problem, sizeof problem) < 0 ||
        config_parse_idlist(cfg->allow_gids, 1, gids, CONFIG_IDS_MAX, &ng, problem, sizeof problem) < 0) {
        log_error("access lists not changed: %s", problem);
        return;
    }
    memcpy(s->allow_uids, uids, nu * sizeof uids[0]);
    memcpy(s->allow_gids, gids, ng * sizeof gids[0]);
    s->n_allow_uids = nu;
    s->n_allow_gids = ng;
}

static bool server_id_listed(const uint32_t *ids, size_t n, uint32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

/* May this peer connect? root and the daemon's own user always may. */
static bool server_peer_allowed(const struct server *s, int fd, const struct ucred *cred)
{
    gid_t groups[256];
    socklen_t glen = sizeof groups;

    if (s->n_allow_uids == 0 && s->n_allow_gids == 0)
        return true;
    if (cred->uid == 0 || cred->uid == geteuid() ||
        server_id_listed(s->allow_uids, s->n_allow_uids, cred->uid) ||
        server_id_listed(s->allow_gids, s->n_allow_gids, cred->gid))
        return true;
    /* Supplementary groups of the peer (Linux 4.13+). */
    if (s->n_allow_gids > 0 && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
        for (size_t i = 0; i < glen / sizeof groups[0]; i++)
            if (server_id_listed(s->allow_gids, s->n_allow_gids, groups[i]))
                return true;
    return false;
}

static void server_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                             int salen, void *arg)
{
    struct server *s = arg;
    struct conn *c;
    struct ucred cred;
    socklen_t credlen = sizeof cred;
    (void)l;
    (void)sa;
    (void)salen;

    if (s->stopping) {
        server_refuse(fd, -KVNODE_ESHUTDOWN, "kvnoded is shutting down");
        return;
    }
    if (s->nconns >= s->cfg->max_clients) {
        char msg[128];
        s->refused++;
        snprintf(msg, sizeof msg, "too many clients (server.max_clients = %u)", s->cfg->max_clients);
        log_warn("refused a connection: %s", msg);
        server_refuse(fd, -KVNODE_ELIMIT, msg);
        return;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) != 0) {
        cred.pid = -1;
        cred.uid = (uid_t)-1;
        cred.gid = (gid_t)-1;
    }
    if (!server_peer_allowed(s, fd, &cred)) {
        char msg[160];
        s->denied++;
        snprintf(msg, sizeof msg, "access denied: uid %d (gid %d) is not in server.allow_uids or "
                 "server.allow_gids", (int)cred.uid, (int)cred.gid);
        log_warn("refused pid %d: %s", (int)cred.pid, msg);
        server_refuse(fd, -KVNODE_EDENIED, msg);
        return;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        log_error("out of memory accepting a connection");
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    c->rev = event_new(s->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
    c->wev = event_new(s->base, fd, EV_WRITE | EV_PERSIST, conn_write_cb, c);
    if (!c->in || !c->out || !c->rev || !c->wev) {
        log_error("out of memory accepting a connection");
        if (c->in) evbuffer_free(c->in);
        if (c->out) evbuffer_free(c->out);
        if (c->rev) event_free(c->rev);
        if (c->wev) event_free(c->wev);
        free(c);
        close(fd);
        return;
    }
    c->session.pid = cred.pid;
    c->session.uid = cred.uid;
    c->session.gid = cred.gid;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    s->accepted++;
    c->reading = true;
    event_add(c->rev, NULL);
    log_debug("accepted connection from pid %d uid %d gid %d", (int)c->session.pid,
              (int)c->session.uid, (int)c->session.gid);
}

static void server_accept_error_cb(struct evconnlistener *l, void *arg)
{
    (void)l;
    (void)arg;
    /* EMFILE and friends: log and keep going; libevent retries on the next
     * readiness. */
    log_warn("accept failed: %s", strerror(errno));
}

/* An inherited fd must be a listening unix stream socket; learn its path. */
static int server_adopt_fd(struct server *s, int fd, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    socklen_t salen = sizeof sa;
    int type = 0, listening = 0;
    socklen_t optlen = sizeof type;

    memset(&sa, 0, sizeof sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &salen) < 0 || sa.sun_family != AF_UNIX ||
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &optlen) < 0 || type != SOCK_STREAM ||
        (optlen = sizeof listening, getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen)) < 0 ||
        !listening) {
        snprintf(err, errlen, "the inherited socket (fd %d) is not a listening unix stream socket", fd);
        return -KVNODE_EINVAL;
    }
    if (salen > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0])
        memcpy(s->path, sa.sun_path, strnlen(sa.sun_path, sizeof sa.sun_path - 1));
    else
        snprintf(s->path, sizeof s->path, "(inherited fd %d)", fd);
    if (evutil_make_socket_nonblocking(fd) < 0 || evutil_make_socket_closeonexec(fd) < 0) {
        snprintf(err, errlen, "cannot configure the inherited socket: %s", strerror(errno));
        return -KVNODE_EIO;
    }
    s->inherited = true;
    return 0;
}

int server_create(struct event_base *base, const struct kvn_config *cfg, struct ops *ops,
                  int listen_fd, struct server **out, char *err, size_t errlen)
{
    struct server *s = calloc(1, sizeof *s);
    int fd, rc;

    *out = NULL;
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -KVNODE_ENOMEM;
    }
    s->base = base;
    s->cfg = cfg;
    s->ops = ops;
    s->lock_fd = -1;
    server_load_access(s, cfg);
    if (listen_fd >= 0) {
        rc = server_adopt_fd(s, listen_fd, err, errlen);
        if (rc < 0) {
            free(s);
            return rc;
        }
        fd = listen_fd;
        goto listen;
    }
    if (strlen(cfg->socket_path) >= sizeof s->path) {
        snprintf(err, errlen, "server.socket_path is %zu bytes; a unix socket path must be "
                 "shorter than %zu", strlen(cfg->socket_path), sizeof s->path);
        free(s);
        return -KVNODE_EINVAL;
    }
    memcpy(s->path, cfg->socket_path, strlen(cfg->socket_path) + 1);
    rc = server_claim_path(s, err, errlen);
    if (rc < 0)
        goto fail;
    fd = server_bind(s, err, errlen);
    if (fd < 0) {
        rc = -KVNODE_EIO;
        goto fail;
    }
listen:
    s->listener = evconnlistener_new(base, server_accept_cb, s,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
    if (!s->listener) {
        snprintf(err, errlen, "cannot listen on %s with libevent", s->path);
        close(fd);
        if (!s->inherited)
            unlink(s->path);
        rc = -KVNODE_EIO;
        goto fail;
    }
    evconnlistener_set_error_cb(s->listener, server_accept_error_cb);
    *out = s;
    return 0;
fail:
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    free(s);
    return rc;
}

static void server_stop_listening(struct server *s)
{
    if (!s->listener)
        return;
    evconnlistener_free(s->listener);
    s->listener = NULL;
    if (!s->inherited)
        unlink(s->path);
    if (s->lock_fd >= 0) {
        unlink(s->lock_path);
        close(s->lock_fd);
        s->lock_fd = -1;
    }
}

void server_destroy(struct server *s)
{
    if (!s)
        return;
    while (s->conns)
        conn_destroy(s->conns);
    server_stop_listening(s);
    if (s->stop_timer)
        event_free(s->stop_timer);
    free(s);
}

void server_apply_config(struct server *s, const struct kvn_config *cfg)
{
    s->cfg = cfg;
    server_load_access(s, cfg);
}

/* --- shutdown -------------------------------------------------------------- */

static void server_stop_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct server *s = arg;
    (void)fd;
    (void)what;
    log_warn("shutdown: %zu connection%s still open after %u ms; closing them",
             s->nconns, s->nconns == 1 ? "" : "s", s->cfg->shutdown_timeout_ms);
    event_base_loopbreak(s->base);
}

static void server_maybe_finish_stop(struct server *s)
{
    if (s->stopping && s->nconns == 0)
        event_base_loopbreak(s->base);
}

void server_begin_shutdown(struct server *s)
{
    struct conn *c, *next;
    struct timeval tv;

    if (s->stopping)
        return;
    s->stopping = true;
    server_stop_listening(s);
    /* Requests are answered synchronously, so what is in flight is what is
     * queued for output: stop reading and let the replies drain. */
    for (c = s->conns; c; c = next) {
        next = c->next;
        server_close_after_flush(c);
    }
    s->stop_timer = evtimer_new(s->base, server_stop_timeout_cb, s);
    if (s->stop_timer) {
        tv.tv_sec = (time_t)(s->cfg->shutdown_timeout_ms / 1000u);
        tv.tv_usec = (suseconds_t)((s->cfg->shutdown_timeout_ms % 1000u) * 1000u);
        evtimer_add(s->stop_timer, &tv);
    }
    server_maybe_finish_stop(s);
}

/* --- connections ------------------------------------------------------------- */

static void conn_destroy(struct conn *c)
{
    struct server *s = c->srv;

    ops_session_end(s->ops, &c->session);
    event_free(c->rev);
    event_free(c->wev);
    if (c->resume_ev)
        event_free(c->resume_ev);
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    free(c);
    server_maybe_finish_stop(s);
}

static void conn_set_reading(struct conn *c, bool on)
{
    if (on == c->reading)
        return;
    c->reading = on;
    if (on)
        event_add(c->rev, NULL);
    else
        event_del(c->rev);
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

/* Write what the socket takes. 0 ok (maybe more pending), -1 fatal. */
static int conn_flush(struct conn *c)
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
            return -1;
        }
        if (n == 0)
            break;
        c->bytes_sent += (uint64_t)n;
    }
    if (evbuffer_get_length(c->out) > 0) {
        event_add(c->wev, NULL);
    } else {
        event_del(c->wev);
        if (c->closing && !c->deferred)
            return -1;
    }
    if (!c->closing && !c->deferred)
        conn_set_reading(c, evbuffer_get_length(c->out) < OUTPUT_HIGH_WATER);
    return 0;
}

static void conn_write_cb(evutil_socket_t fd, short what, void *arg)
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

static void conn_process_input(struct conn *c);

static void conn_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    (void)fd;
    (void)what;
    conn_process_input(c);
    if (conn_flush(c) < 0)
        conn_destroy(c);
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

/* Decode and dispatch every complete frame in the input buffer. */
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
        if (!req) {
            conn_reject_frame(c, -KVNODE_EPROTO, "undecodable frame of %" PRIu32
                              " bytes: not a kvnode Request message", len);
            return;
        }
        ops_handle(c->srv->ops, c, &c->session, req);
        kvnode__request__free_unpacked(req, NULL);
    }
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct evbuffer_iovec vec[2];
    int nvec;
    ssize_t n;
    (void)what;

    nvec = evbuffer_reserve_space(c->in, READ_CHUNK, vec, 2);
    if (nvec < 0) {
        log_error("out of memory reading from pid %d", (int)c->session.pid);
        conn_destroy(c);
        return;
    }
    {
        struct iovec iov[2];
        for (int i = 0; i < nvec; i++) {
            iov[i].iov_base = vec[i].iov_base;
            iov[i].iov_len = vec[i].iov_len;
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
        conn_destroy(c);
        return;
    }
    for (int i = 0; i < nvec; i++) {
        size_t take = (size_t)n < vec[i].iov_len ? (size_t)n : vec[i].iov_len;
        vec[i].iov_len = take;
        n -= (ssize_t)take;
    }
    evbuffer_commit_space(c->in, vec, nvec);
    conn_process_input(c);
    if (conn_flush(c) < 0)
        conn_destroy(c);
}

/* --- stats ----------------------------------------------------------------- */

void server_stats_json(struct server *s, json_t *root)
{
    json_t *clients = json_object(), *frames = json_object();

    json_object_set_new(clients, "connected", json_integer((json_int_t)s->nconns));
    json_object_set_new(clients, "accepted_total", json_integer((json_int_t)s->accepted));
    json_object_set_new(clients, "refused_total", json_integer((json_int_t)s->refused));
    json_object_set_new(clients, "denied_total", json_integer((json_int_t)s->denied));
    json_object_set_new(root, "clients", clients);
    json_object_set_new(frames, "rejected_total", json_integer((json_int_t)s->frames_rejected));
    json_object_set_new(root, "frames", frames);
}

const char *server_socket_path(const struct server *s)
{
    return s->path;
}
