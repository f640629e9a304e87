/* server: listener, connections and frame I/O on the loop (see server.h). */
#include "net/server.h"

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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "core/clock.h"
#include "kvnode.h"
#include "core/log.h"
#include "net/session.h"
#include "wire.h"

#define READ_CHUNK (1u << 20)
#define MAX_PASSED_FDS 8u
/* Stop handling a client's requests while its unsent replies pass this, and
 * go on once they drop to the low mark (a gap, so a slow reader does not
 * flip it at every reply). */
#define OUTPUT_HIGH_WATER (64u << 20)
#define OUTPUT_LOW_WATER  (32u << 20)
/* A connection may buffer this much input without room from
 * server.max_buffered_input_bytes: requests up to this size (all but inline
 * puts of big blocks) never wait for room. */
#define INPUT_UNRESERVED  (64u << 10)
/* accept failing (out of descriptors): the listener rests this long. */
#define ACCEPT_PAUSE_MS 100u
/* A recurring warning is written at most once per this. */
#define LOG_REPEAT_MS 10000u

struct conn {
    struct server *srv;
    int fd;
    struct event *rev, *wev;
    struct evbuffer *in, *out;
    bool closing;            /* close once `out` drains */
    bool reading;
    bool deferred;           /* a request answers later: handle nothing more until then */
    bool output_full;        /* unsent replies passed OUTPUT_HIGH_WATER: handle nothing more
                                until they drop to OUTPUT_LOW_WATER */
    bool input_waiting;      /* on the server's queue for room for its frame */
    struct event *resume_ev; /* handles the input that waited behind a deferred request */
    struct event *frame_ev;  /* server.frame_timeout: a frame in progress stopped arriving */
    size_t in_counted, out_counted; /* lengths of `in` / `out` in the server's totals */
    uint64_t room;           /* bytes of server.max_buffered_input_bytes held for the frame
                                being received (0: none, it fits in INPUT_UNRESERVED) */
    uint64_t room_wanted;    /* input_waiting: what it asks for */
    struct conn *wait_prev, *wait_next; /* input_waiting: the queue */
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
    struct server_handler handler;
    struct evconnlistener *listener;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lock_fd;
    char lock_path[PATH_MAX];
    bool inherited;          /* socket-activated: not ours to unlink */
    struct conn *conns;
    size_t nconns;
    bool stopping;
    struct event *stop_timer;
    /* what every connection buffers, and room held for frames being received */
    uint64_t in_bytes, out_bytes, in_room;
    struct conn *wait_head, *wait_tail;   /* frames waiting for room, first come first served */
    size_t nwaiting;
    /* accept failed (out of descriptors): the listener rests, then retries */
    struct event *accept_resume_ev;
    uint64_t accept_pauses_episode;       /* pauses since accepting last worked */
    struct log_limit accept_log, refuse_log, timeout_log;
    /* counters */
    uint64_t accepted, refused, frames_rejected, denied;
    uint64_t accept_pauses, input_waits, input_paused, frames_timed_out;
    /* access lists resolved from cfg (empty: anyone who can open the socket) */
    uint32_t allow_uids[CONFIG_IDS_MAX], allow_gids[CONFIG_IDS_MAX];
    size_t n_allow_uids, n_allow_gids;
};

static void conn_destroy(struct conn *c);
static int conn_flush(struct conn *c);
static void conn_frame_timeout_cb(evutil_socket_t fd, short what, void *arg);

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

static void conn_read_cb(evutil_socket_t fd, short what, void *arg);
static void conn_write_cb(evutil_socket_t fd, short what, void *arg);

/* Take the configured allow lists, resolved when the config was parsed. */
static void server_load_access(struct server *s, const struct kvn_config *cfg)
{
    memcpy(s->allow_uids, cfg->allow_uid_list.id, cfg->allow_uid_list.n * sizeof s->allow_uids[0]);
    memcpy(s->allow_gids, cfg->allow_gid_list.id, cfg->allow_gid_list.n * sizeof s->allow_gids[0]);
    s->n_allow_uids = cfg->allow_uid_list.n;
    s->n_allow_gids = cfg->allow_gid_list.n;
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
    c->frame_ev = evtimer_new(s->base, conn_frame_timeout_cb, c);
    if (!c->in || !c->out || !c->rev || !c->wev || !c->frame_ev) {
        log_error("out of memory accepting a connection");
        if (c->in) evbuffer_free(c->in);
        if (c->out) evbuffer_free(c->out);
        if (c->rev) event_free(c->rev);
        if (c->wev) event_free(c->wev);
        if (c->frame_ev) event_free(c->frame_ev);
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
    event_free(s->accept_resume_ev);
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

/* Bring the server's totals of buffered bytes up to date with c's buffers. */
static void conn_account(struct conn *c)
{
    struct server *s = c->srv;
    size_t in = evbuffer_get_length(c->in), out = evbuffer_get_length(c->out);

    s->in_bytes = s->in_bytes - c->in_counted + in;
    s->out_bytes = s->out_bytes - c->out_counted + out;
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

static void conn_destroy(struct conn *c)
{
    struct server *s = c->srv;

    s->handler.session_end(s->handler.arg, &c->session);
    conn_leave_wait_queue(c);
    event_free(c->rev);
    event_free(c->wev);
    event_free(c->frame_ev);
    if (c->resume_ev)
        event_free(c->resume_ev);
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    close(c->fd);
    s->in_bytes -= c->in_counted;
    s->out_bytes -= c->out_counted;
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
    conn_account(c);
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
static void conn_frame_timeout_cb(evutil_socket_t fd, short what, void *arg)
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
        c->srv->handler.request(c->srv->handler.arg, c, &c->session, req);
        kvnode__request__free_unpacked(req, NULL);
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

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
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
    };
}

const char *server_socket_path(const struct server *s)
{
    return s->path;
}
