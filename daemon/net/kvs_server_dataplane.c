/* kvs_server dataplane: the vineyard-style handshake of rtp-llm's KVS client
 * on [kvs_server] socket_path (see kvs_server.h). Messages both ways are an
 * 8-byte little-endian length and that many bytes of JSON. register_request
 * -> register_reply; get_vineyard_mmap_fd_request -> {"size":N,...}, then
 * the host arena's fd of the peer's tenant by SCM_RIGHTS with a 1-byte
 * payload in a sendmsg of its own (attached to the JSON, the client's plain
 * recv would drop it). The socket then stays open, idle, until the client
 * closes it. Owns the listener and the connections.
 *
 * Bounded, so that no user can lock engines out (issue 30): a peer is
 * placed at accept (SO_PEERCRED and its groups, as the engine socket admits
 * it); one that admission refuses, or whose tenant has no host memory, is
 * told why in one best-effort frame and closed there, before it holds a
 * slot. At most [server] max_clients connections in all, and at most its
 * tenant's max_clients (its section's, else its memory's share of
 * [server] max_clients) per tenant, counted apart from the engine socket's:
 * a tenant at its share never refuses another's handshake. A connection
 * not lent its fd within server.hello_timeout of accept is closed.
 * Requests over KVS_DP_MAX_FRAME close the connection; replies are a few
 * dozen bytes, written with non-blocking sends (a peer that does not read
 * them is closed). Loop thread only. */
#include "net/kvs_server.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <jansson.h>

#include "core/le.h"
#include "cache/cache.h"
#include "core/clock.h"
#include "core/errmsg.h"
#include "core/log.h"
#include "kvnode.h"
#include "net/unix_listen.h"
#include "tenants/tenants.h"

#define KVS_DP_MAX_FRAME 4096u   /* the client's requests are under 200 bytes */
#define KVS_DP_LOG_REPEAT_MS 10000u

struct kvs_dp_conn {
    struct kvs_dataplane *dp;
    int fd;
    struct event *ev;
    struct event *deadline;   /* server.hello_timeout from accept; freed once the fd is lent */
    struct tenant *tenant;    /* never NULL: a peer without one is closed at accept */
    size_t tenant_ix;         /* its tenants_at index (tenant_open) */
    uid_t uid;
    pid_t pid;
    uint8_t *buf;             /* the frame being read: header, then body */
    size_t have, want;        /* bytes in buf, bytes wanted (8: header) */
    struct kvs_dp_conn *prev, *next;
};

struct kvs_dataplane {
    struct kvs_server_deps deps;   /* the front end's (kvs_server_create) */
    struct evconnlistener *listener;
    char path[108];
    bool owned;
    struct kvs_dp_conn *conns;
    uint32_t tenant_open[TENANTS_MAX];   /* connections per tenant, by tenants_at index */
    uint64_t open, accepted, refused, fds_lent;
    uint64_t denied, tenant_limit, timed_out;   /* refused at accept: no tenant; at its share; deadline */
    struct log_limit refuse_log, timeout_log;
};

static void kvs_dp_close(struct kvs_dp_conn *c)
{
    struct kvs_dataplane *dp = c->dp;
    if (c->prev)
        c->prev->next = c->next;
    else
        dp->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    dp->open--;
    dp->tenant_open[c->tenant_ix]--;
    if (c->deadline)
        event_free(c->deadline);
    event_free(c->ev);
    close(c->fd);
    free(c->buf);
    free(c);
}

/* One framed JSON message on fd, whole or not at all (non-blocking). */
static int kvs_dp_send_json_fd(int fd, json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT);
    json_decref(msg);
    if (!text)
        return -1;
    uint64_t len = strlen(text);
    uint8_t hdr[8];
    le_put64(hdr, len);
    struct iovec iov[2] = { { hdr, 8 }, { text, (size_t)len } };
    struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
    ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    free(text);
    return n == (ssize_t)(8 + len) ? 0 : -1;
}

static int kvs_dp_send_json(struct kvs_dp_conn *c, json_t *msg)
{
    return kvs_dp_send_json_fd(c->fd, msg);
}

static int kvs_dp_send_fd(struct kvs_dp_conn *c, int fd)
{
    char byte = 0;
    struct iovec iov = { &byte, 1 };
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf };
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

    memset(ctl.buf, 0, sizeof ctl.buf);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    return sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == 1 ? 0 : -1;
}

/* The host arena of the connection's tenant (the only memory it is lent). */
static int kvs_dp_host_arena(struct kvs_dp_conn *c, uint64_t *size)
{
    struct cache_arena_info arenas[8];
    size_t n = cache_arenas(c->tenant->cache, arenas, 8);
    for (size_t i = 0; i < n; i++) {
        if (arenas[i].tier == KVNODE_TIER_HOST && arenas[i].fd >= 0) {
            *size = arenas[i].size;
            return arenas[i].fd;
        }
    }
    return -1;
}

/* 0: keep the connection, -1: close it. */
static int kvs_dp_handle(struct kvs_dp_conn *c, const char *body, size_t len)
{
    json_error_t jerr;
    json_t *req = json_loadb(body, len, 0, &jerr);
    const char *type = req ? json_string_value(json_object_get(req, "type")) : NULL;
    int rc = -1;

    if (!type) {
        log_warn("kvs data plane: pid %d uid %d sent a message that is not a JSON object with a \"type\"; "
                 "closing", (int)c->pid, (int)c->uid);
    } else if (strcmp(type, "register_request") == 0) {
        rc = kvs_dp_send_json(c, json_pack("{s:s, s:s, s:i, s:i, s:s}", "type", "register_reply", "version",
                                           "0.0.0", "code", 0, "session_id", 0, "message", ""));
    } else if (strcmp(type, "get_vineyard_mmap_fd_request") == 0) {
        uint64_t size = 0;
        int fd = kvs_dp_host_arena(c, &size);
        if (fd < 0) {
            const char *why = "this daemon's host memory cannot be lent as an fd";
            log_warn("kvs data plane: refused pid %d uid %d: %s", (int)c->pid, (int)c->uid, why);
            kvs_dp_send_json(c, json_pack("{s:s, s:i, s:s}", "type", "get_vineyard_mmap_fd_reply", "code", 403,
                                          "message", why));
            c->dp->refused++;
        } else if (kvs_dp_send_json(c, json_pack("{s:s, s:i, s:I, s:i}", "type", "get_vineyard_mmap_fd_reply",
                                                 "code", 0, "size", (json_int_t)size, "offset", 0)) == 0 &&
                   kvs_dp_send_fd(c, fd) == 0) {
            c->dp->fds_lent++;
            if (c->deadline) {   /* the handshake is done: the connection is the engine's */
                event_free(c->deadline);
                c->deadline = NULL;
            }
            log_info("kvs data plane: lent the host memory of tenant %s (%" PRIu64 " bytes) to pid %d uid %d",
                     c->tenant->name, size, (int)c->pid, (int)c->uid);
            rc = 0;
        }
    } else {
        log_warn("kvs data plane: pid %d uid %d sent an unknown message type '%.64s' (expected "
                 "register_request or get_vineyard_mmap_fd_request); closing", (int)c->pid, (int)c->uid, type);
    }
    json_decref(req);
    return rc;
}

static void kvs_dp_read_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kvs_dp_conn *c = arg;
    (void)what;

    for (;;) {
        ssize_t n = recv(fd, c->buf + c->have, c->want - c->have, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            kvs_dp_close(c);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        c->have += (size_t)n;
        if (c->have < c->want)
            continue;
        if (c->want == 8) {
            uint64_t len = le_get64(c->buf);
            if (len == 0 || len > KVS_DP_MAX_FRAME) {
                log_warn("kvs data plane: pid %d sent a frame of %" PRIu64 " bytes (1..%u allowed); closing",
                         (int)c->pid, len, KVS_DP_MAX_FRAME);
                kvs_dp_close(c);
                return;
            }
            c->want = 8 + (size_t)len;
            continue;
        }
        if (kvs_dp_handle(c, (const char *)c->buf + 8, c->want - 8) < 0) {
            kvs_dp_close(c);
            return;
        }
        c->have = 0;
        c->want = 8;
    }
}

/* server.hello_timeout passed and the connection was not lent its fd. */
static void kvs_dp_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kvs_dp_conn *c = arg;
    struct kvs_dataplane *dp = c->dp;
    char note[96];
    uint64_t held;
    (void)fd;
    (void)what;

    dp->timed_out++;
    if (log_limit_pass(&dp->timeout_log, clock_now_ms(), KVS_DP_LOG_REPEAT_MS, &held))
        log_warn("kvs data plane: closing the connection of pid %d uid %d (tenant %s): no handshake within %u ms "
                 "of connecting (server.hello_timeout)%s", (int)c->pid, (int)c->uid, c->tenant->name,
                 (*dp->deps.cfg)->hello_timeout_ms, log_limit_note(held, "closed", note, sizeof note));
    kvs_dp_close(c);
}

/* t's index among the tenants (its tenant_open slot). */
static size_t kvs_dp_tenant_index(const struct kvs_dataplane *dp, const struct tenant *t)
{
    size_t n = tenants_count(dp->deps.tenants);
    for (size_t i = 0; i < n && i < TENANTS_MAX; i++)
        if (tenants_at(dp->deps.tenants, i) == t)
            return i;
    return 0;   /* not reached: every tenant is listed; "default" is 0 */
}

/* The tenant a new connection may hold a slot for, or NULL: refused (no
 * tenant for the peer, the node's total, the tenant's share), counted,
 * logged and told why in one best-effort frame; the caller closes fd. */
static struct tenant *kvs_dp_admit(struct kvs_dataplane *dp, int fd, struct ucred *cred, size_t *ix)
{
    const struct kvn_config *cfg = *dp->deps.cfg;
    char why[384], note[96];
    uint64_t held;
    struct tenant *t = kvs_server_unix_tenant(cfg, dp->deps.tenants, fd, cred, why, sizeof why);

    if (!t) {
        dp->denied++;
    } else if (dp->tenant_open[*ix = kvs_dp_tenant_index(dp, t)] >= t->max_clients) {
        snprintf(why, sizeof why, "tenant %s has %" PRIu32 " data-plane connections open, all it may ([tenant.%s] "
                 "max_clients, else its memory's share of [server] max_clients)", t->name, dp->tenant_open[*ix],
                 t->name);
        dp->tenant_limit++;
    } else if (dp->open >= cfg->max_clients) {
        snprintf(why, sizeof why, "%" PRIu64 " data-plane connections open ([server] max_clients)", dp->open);
    } else {
        return t;
    }
    dp->refused++;
    if (log_limit_pass(&dp->refuse_log, clock_now_ms(), KVS_DP_LOG_REPEAT_MS, &held))
        log_warn("kvs data plane: refused the connection of pid %d uid %d: %s%s", (int)cred->pid, (int)cred->uid,
                 why, log_limit_note(held, "refused", note, sizeof note));
    /* Best effort (the close says it anyway); not a register_reply, so the client stops there. */
    kvs_dp_send_json_fd(fd, json_pack("{s:s, s:i, s:s}", "type", "refused", "code", 403, "message", why));
    return NULL;
}

static void kvs_dp_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    struct kvs_dataplane *dp = arg;
    struct ucred cred;
    struct kvs_dp_conn *c;
    size_t ix = 0;
    struct tenant *t;
    (void)l;
    (void)sa;
    (void)salen;

    if (!(t = kvs_dp_admit(dp, fd, &cred, &ix))) {
        close(fd);
        return;
    }
    uint32_t ms = (*dp->deps.cfg)->hello_timeout_ms;
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
    if (!(c = calloc(1, sizeof *c))) {
        close(fd);
        return;
    }
    *c = (struct kvs_dp_conn){ .dp = dp, .fd = fd, .want = 8, .tenant = t, .tenant_ix = ix, .uid = cred.uid,
                               .pid = cred.pid };
    if (!(c->buf = malloc(8 + KVS_DP_MAX_FRAME)) ||
        !(c->ev = event_new(dp->deps.base, fd, EV_READ | EV_PERSIST, kvs_dp_read_cb, c)) ||
        !(c->deadline = evtimer_new(dp->deps.base, kvs_dp_deadline_cb, c)) || event_add(c->ev, NULL) < 0 ||
        evtimer_add(c->deadline, &tv) < 0) {
        if (c->ev)
            event_free(c->ev);
        if (c->deadline)
            event_free(c->deadline);
        free(c->buf);
        free(c);
        close(fd);
        return;
    }
    c->next = dp->conns;
    if (dp->conns)
        dp->conns->prev = c;
    dp->conns = c;
    dp->open++;
    dp->tenant_open[ix]++;
    dp->accepted++;
}

int kvs_dataplane_create(const struct kvs_server_deps *deps, struct kvs_dataplane **out, char *err,
                         size_t errlen)
{
    const struct kvn_config *cfg = *deps->cfg;
    const char *path = cfg->kvs_socket_path;
    char label[PATH_MAX + 32];
    struct kvs_dataplane *dp;
    int fd;

    *out = NULL;
    snprintf(label, sizeof label, "[kvs_server] socket_path %s", path);
    dp = calloc(1, sizeof *dp);
    if (!dp) {
        errmsg_set(err, errlen, "kvs data plane: out of memory");
        return -1;
    }
    dp->deps = *deps;
    if (strlen(path) >= sizeof dp->path || (fd = unix_listen(path, cfg->socket_mode, 64, label, err, errlen)) < 0) {
        if (strlen(path) >= sizeof dp->path)
            errmsg_set(err, errlen, "%s: longer than %zu bytes", label, sizeof dp->path - 1);
        free(dp);
        return -1;
    }
    memcpy(dp->path, path, strlen(path) + 1);
    dp->owned = true;
    if (!(dp->listener = evconnlistener_new(deps->base, kvs_dp_accept_cb, dp, LEV_OPT_CLOSE_ON_FREE, 0, fd))) {
        errmsg_set(err, errlen, "%s: cannot listen: %s", label, strerror(errno));
        close(fd);
        kvs_dataplane_destroy(dp);
        return -1;
    }
    *out = dp;
    return 0;
}

void kvs_dataplane_stop(struct kvs_dataplane *dp)
{
    if (dp && dp->listener) {
        evconnlistener_free(dp->listener);
        dp->listener = NULL;
    }
}

void kvs_dataplane_destroy(struct kvs_dataplane *dp)
{
    if (!dp)
        return;
    kvs_dataplane_stop(dp);
    while (dp->conns)
        kvs_dp_close(dp->conns);
    if (dp->owned)
        unlink(dp->path);
    free(dp);
}

void kvs_dataplane_stats(const struct kvs_dataplane *dp, struct kvs_server_stats *out)
{
    out->socket_path = dp->path;
    out->dataplane_open = dp->open;
    out->dataplane_accepted = dp->accepted;
    out->dataplane_refused = dp->refused;
    out->fds_lent = dp->fds_lent;
    out->dataplane_denied = dp->denied;
    out->dataplane_tenant_limit = dp->tenant_limit;
    out->dataplane_timed_out = dp->timed_out;
}
