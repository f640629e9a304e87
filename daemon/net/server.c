/* server: the listener and the server object — the socket path and its lock
 * file (or a socket-activated fd), admission of a peer (server.max_clients,
 * its credentials against server.allow_uids / allow_gids, then the
 * handler's: its tenant's max_clients), the HELLO deadline armed, accept and its
 * pause when out of descriptors, create/destroy, reload, the orderly stop and
 * the counters (see server.h). Connections are in server_conn.c. */
#include "net/server_internal.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "core/clock.h"
#include "kvnode.h"
#include "core/log.h"
#include "wire.h"

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
        /* socket_gid: socket_group as resolved when the config was parsed. */
        if (chown(s->path, (uid_t)-1, (gid_t)s->cfg->socket_gid) < 0) {
            snprintf(err, errlen, "cannot give %s to group %s: %s", s->path, s->cfg->socket_group,
                     strerror(errno));
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

/* Take the configured allow lists, resolved when the config was parsed. */
static void server_load_access(struct server *s, const struct kvn_config *cfg)
{
    s->allow_uids = cfg->allow_uid_list;
    s->allow_gids = cfg->allow_gid_list;
}

static int server_gid_cmp(const void *a, const void *b)
{
    gid_t x = *(const gid_t *)a, y = *(const gid_t *)b;
    return x < y ? -1 : x > y;
}

/* The peer's supplementary groups (SO_PEERGROUPS, Linux 4.13+), sorted:
 * into buf (cap entries), or, when it has more, into *heap (malloc'd; the
 * caller frees it). Admission and the tenant of the connection both look
 * at these, so they agree. *n = 0 when the kernel cannot say. */
const gid_t *server_peer_groups(int fd, gid_t *buf, size_t cap, gid_t **heap, size_t *n)
{
    socklen_t len = (socklen_t)(cap * sizeof *buf);
    gid_t *g = buf;

    *heap = NULL;
    *n = 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, buf, &len) != 0) {
        /* ERANGE: len says how much it takes. */
        if (errno != ERANGE || len == 0 || !(*heap = malloc(len)) ||
            getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, *heap, &len) != 0)
            return buf;
        g = *heap;
    }
    *n = len / sizeof *g;
    qsort(g, *n, sizeof *g, server_gid_cmp);
    return g;
}

/* A connection that was never served: its parts, not its fd. */
static void server_conn_discard(struct conn *c)
{
    if (c->in) evbuffer_free(c->in);
    if (c->out) evbuffer_free(c->out);
    if (c->rev) event_free(c->rev);
    if (c->wev) event_free(c->wev);
    if (c->frame_ev) event_free(c->frame_ev);
    if (c->hello_ev) event_free(c->hello_ev);
    free(c);
}

static void server_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                             int salen, void *arg)
{
    struct server *s = arg;
    struct conn *c;
    struct ucred cred;
    socklen_t credlen = sizeof cred;
    gid_t group_buf[64], *group_heap;
    size_t ngroups;
    (void)l;
    (void)sa;
    (void)salen;

    if (s->stopping) {
        server_refuse(fd, -KVNODE_ESHUTDOWN, "kvnoded is shutting down");
        return;
    }
    if (s->accept_pauses_episode) {
        log_info("accepting engine connections on %s again after %" PRIu64 " pause%s", s->path,
                 s->accept_pauses_episode, s->accept_pauses_episode == 1 ? "" : "s");
        s->accept_pauses_episode = 0;
    }
    if (s->nconns >= s->cfg->max_clients) {
        char msg[128], note[64];
        uint64_t held = 0;
        s->refused++;
        snprintf(msg, sizeof msg, "too many clients (server.max_clients = %u)", s->cfg->max_clients);
        if (log_limit_pass(&s->refuse_log, clock_now_ms(), LOG_REPEAT_MS, &held))
            log_warn("refused a connection: %s%s", msg, log_limit_note(held, "refused", note, sizeof note));
        server_refuse(fd, -KVNODE_ELIMIT, msg);
        return;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) != 0) {
        cred.pid = -1;
        cred.uid = (uid_t)-1;
        cred.gid = (gid_t)-1;
    }
    const gid_t *groups = server_peer_groups(fd, group_buf, sizeof group_buf / sizeof group_buf[0],
                                             &group_heap, &ngroups);
    if (!config_peer_admitted(&s->allow_uids, &s->allow_gids, cred.uid, cred.gid, groups, ngroups)) {
        char msg[160];
        s->denied++;
        free(group_heap);
        snprintf(msg, sizeof msg, "access denied: uid %d (gid %d) is not in server.allow_uids or "
                 "server.allow_gids", (int)cred.uid, (int)cred.gid);
        log_warn("refused pid %d: %s", (int)cred.pid, msg);
        server_refuse(fd, -KVNODE_EDENIED, msg);
        return;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        free(group_heap);
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
    c->frame_ev = evtimer_new(s->base, conn_frame_timeout_cb, c);
    c->hello_ev = evtimer_new(s->base, conn_hello_timeout_cb, c);
    if (!c->in || !c->out || !c->rev || !c->wev || !c->frame_ev || !c->hello_ev) {
        free(group_heap);
        log_error("out of memory accepting a connection");
        server_conn_discard(c);
        close(fd);
        return;
    }
    c->session.pid = cred.pid;
    c->session.uid = cred.uid;
    c->session.gid = cred.gid;
    char msg[256] = "";
    int rc = s->handler.admit ? s->handler.admit(s->handler.arg, &c->session, groups, ngroups, msg, sizeof msg)
                              : 0;
    free(group_heap);
    if (rc < 0) {
        char note[64];
        uint64_t held = 0;
        s->refused++;
        if (log_limit_pass(&s->refuse_log, clock_now_ms(), LOG_REPEAT_MS, &held))
            log_warn("refused pid %d uid %d: %s%s", (int)cred.pid, (int)cred.uid, msg,
                     log_limit_note(held, "refused", note, sizeof note));
        server_conn_discard(c);
        server_refuse(fd, rc, msg);
        return;
    }
    c->tenant = c->session.tenant;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    s->accepted++;
    c->reading = true;
    event_add(c->rev, NULL);
    {
        /* A connection that holds a slot must say who it is soon. */
        uint32_t ms = s->cfg->hello_timeout_ms;
        struct timeval tv = { .tv_sec = (time_t)(ms / 1000u), .tv_usec = (suseconds_t)((ms % 1000u) * 1000u) };
        evtimer_add(c->hello_ev, &tv);
    }
    log_debug("accepted connection from pid %d uid %d gid %d", (int)c->session.pid,
              (int)c->session.uid, (int)c->session.gid);
}

static void server_accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    struct server *s = arg;
    (void)fd;
    (void)what;
    if (s->listener && !s->stopping)
        evconnlistener_enable(s->listener);
}

/* accept failed for a reason retrying at once cannot fix (EMFILE, ENFILE,
 * ENOBUFS, ...): the connection stays in the backlog and the socket stays
 * readable, so retrying now would spin. Rest the listener instead; the
 * clients waiting in the backlog are taken once accept works again. */
static void server_accept_error_cb(struct evconnlistener *l, void *arg)
{
    struct server *s = arg;
    int err = EVUTIL_SOCKET_ERROR();
    struct timeval tv = { .tv_sec = 0, .tv_usec = ACCEPT_PAUSE_MS * 1000 };
    struct rlimit rl = { 0 };
    uint64_t held = 0;
    char note[64];

    evconnlistener_disable(l);
    evtimer_add(s->accept_resume_ev, &tv);
    s->accept_pauses++;
    s->accept_pauses_episode++;
    if (!log_limit_pass(&s->accept_log, clock_now_ms(), LOG_REPEAT_MS, &held))
        return;
    getrlimit(RLIMIT_NOFILE, &rl);
    log_warn("cannot accept engine connections on %s: %s; pausing the listener %u ms at a time until "
             "it works again (%zu clients connected, RLIMIT_NOFILE %llu)%s", s->path, strerror(err),
             ACCEPT_PAUSE_MS, s->nconns, (unsigned long long)rl.rlim_cur,
             log_limit_note(held, "pauses", note, sizeof note));
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

int server_create(struct event_base *base, const struct kvn_config *cfg,
                  const struct server_handler *handler, int listen_fd, struct server **out,
                  char *err, size_t errlen)
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
    s->handler = *handler;
    s->lock_fd = -1;
    s->accept_resume_ev = evtimer_new(base, server_accept_resume_cb, s);
    if (!s->accept_resume_ev) {
        snprintf(err, errlen, "out of memory");
        free(s);
        return -KVNODE_ENOMEM;
    }
    server_load_access(s, cfg);
    if (listen_fd >= 0) {
        rc = server_adopt_fd(s, listen_fd, err, errlen);
        if (rc < 0) {
            event_free(s->accept_resume_ev);
            free(s);
            return rc;
        }
        fd = listen_fd;
        goto listen;
    }
    if (strlen(cfg->socket_path) >= sizeof s->path) {
        snprintf(err, errlen, "server.socket_path is %zu bytes; a unix socket path must be "
                 "shorter than %zu", strlen(cfg->socket_path), sizeof s->path);
        event_free(s->accept_resume_ev);
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
    event_free(s->accept_resume_ev);
    free(s);
    return rc;
}

static void server_stop_listening(struct server *s)
{
    if (!s->listener)
        return;
    evtimer_del(s->accept_resume_ev);
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
    if (s->release_timer)
        event_free(s->release_timer);
    event_free(s->accept_resume_ev);
    free(s);
}

void server_apply_config(struct server *s, const struct kvn_config *cfg)
{
    s->cfg = cfg;
    server_load_access(s, cfg);
}

/* --- shutdown --------------------------------------------------------------
 *
 * Connections lent HBM are told to let go of it (GoingAway) and are waited
 * for until they close or hbm.release_timeout passes: HBM is freed after the
 * loop, and freeing memory a client still maps is what the notice avoids.
 * The others finish their replies within server.shutdown_timeout. The loop
 * ends when every connection is gone, so within the longer of the two. */

static void timer_add_ms(struct event *ev, uint32_t ms)
{
    struct timeval tv = clock_tv_ms(ms);
    evtimer_add(ev, &tv);
}

/* Close the connections told GoingAway (going == true) or the others. */
static void server_close_conns(struct server *s, bool going)
{
    struct conn *c, *next;

    for (c = s->conns; c; c = next) {
        next = c->next;
        if (c->going_away == going)
            conn_destroy(c);
    }
}

static void server_stop_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct server *s = arg;
    size_t others = s->nconns - s->going_away_open;
    (void)fd;
    (void)what;
    if (others)
        log_warn("shutdown: %zu connection%s still open after %u ms; closing them",
                 others, others == 1 ? "" : "s", s->cfg->shutdown_timeout_ms);
    if (s->going_away_open == 0) {
        event_base_loopbreak(s->base);
        return;
    }
    /* The clients lent HBM have their own time. */
    server_close_conns(s, false);
}

static void server_release_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct server *s = arg;
    (void)fd;
    (void)what;
    if (s->going_away_open == 0)
        return;
    log_warn("stop: %zu client%s lent HBM still connected after hbm.release_timeout (%u ms); closing %s",
             s->going_away_open, s->going_away_open == 1 ? "" : "s", s->cfg->hbm_release_timeout_ms,
             s->going_away_open == 1 ? "it" : "them");
    server_close_conns(s, true);
}

void server_conn_ends(struct server *s, struct conn *c)
{
    if (c->hbm_counted) {
        s->hbm_lent--;
        /* Only its own close says it let go of the memory. */
        if (s->stopping) {
            if (c->going_away && c->peer_closed)
                s->hbm_released++;
            else
                s->hbm_held++;
        }
    }
    if (c->going_away)
        s->going_away_open--;
}

void server_maybe_finish_stop(struct server *s)
{
    if (s->stopping && s->nconns == 0)
        event_base_loopbreak(s->base);
}

/* Queue the GoingAway notice (Response id 0). 0 or a negative KVNODE_E*. */
static int server_send_going_away(struct conn *c, uint32_t within_ms)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__GoingAway ga = KVNODE__GOING_AWAY__INIT;

    ga.unmap_within_ms = within_ms;
    ga.reason = (char *)"kvnoded is stopping";
    resp.id = 0;
    resp.result_case = KVNODE__RESPONSE__RESULT_GOING_AWAY;
    resp.going_away = &ga;
    return server_reply(c, &resp, NULL, 0);
}

void server_begin_shutdown(struct server *s)
{
    struct conn *c, *next;
    uint32_t release_ms = s->cfg->hbm_release_timeout_ms;

    if (s->stopping)
        return;
    s->stopping = true;
    server_stop_listening(s);
    /* Requests are answered synchronously, so what is in flight is what is
     * queued for output: stop reading and let the replies drain. A client
     * lent HBM is told to unmap it and close, after its replies, and read
     * until it does (release_ms 0: told, then closed like the others). */
    for (c = s->conns; c; c = next) {
        next = c->next;
        if (c->hbm_counted && !c->closing && server_send_going_away(c, release_ms) == 0) {
            s->going_away_sent++;
            if (release_ms > 0) {
                c->going_away = true;
                s->going_away_open++;
                continue;
            }
        }
        server_close_after_flush(c);
    }
    if (s->going_away_sent)
        log_info("stop: told %" PRIu64 " client%s lent HBM to unmap it and close within %u ms "
                 "(hbm.release_timeout)", s->going_away_sent, s->going_away_sent == 1 ? "" : "s", release_ms);
    s->stop_timer = evtimer_new(s->base, server_stop_timeout_cb, s);
    if (s->stop_timer)
        timer_add_ms(s->stop_timer, s->cfg->shutdown_timeout_ms);
    if (s->going_away_open) {
        s->release_timer = evtimer_new(s->base, server_release_timeout_cb, s);
        if (s->release_timer)
            timer_add_ms(s->release_timer, release_ms);
        else
            server_close_conns(s, true);   /* no timer, no wait */
    }
    server_maybe_finish_stop(s);
}

/* --- stats ----------------------------------------------------------------- */

void server_get_stats(const struct server *s, struct server_stats *out)
{
    *out = (struct server_stats){
        .connected = s->nconns, .accepted = s->accepted, .refused = s->refused, .denied = s->denied,
        .accept_pauses = s->accept_pauses,
        .input_buffered_bytes = s->in_bytes, .input_reserved_bytes = s->in_room,
        .input_waiting = s->nwaiting, .input_waits = s->input_waits,
        .output_buffered_bytes = s->out_bytes, .input_paused = s->input_paused,
        .frames_rejected = s->frames_rejected, .frames_timed_out = s->frames_timed_out,
        .hello_timeouts = s->hello_timeouts, .output_limit_closed = s->output_limit_closed,
        .output_limit_refused = s->output_limit_refused,
        .hbm_lent = s->hbm_lent, .going_away = s->going_away_sent,
        .hbm_released = s->hbm_released, .hbm_held = s->hbm_held,
    };
}

const char *server_socket_path(const struct server *s)
{
    return s->path;
}
