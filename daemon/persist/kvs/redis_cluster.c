/* kvs/redis_cluster: slot routing, redirects and retries over hiredis (see
 * redis_cluster.h). */
#include "persist/kvs/redis_cluster.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <limits.h>
#include <sys/socket.h>
#include <time.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "core/hostport.h"
#include "kvnode.h"

struct rcl_node {
    char host[RCL_HOST_MAX];
    int port;
    redisContext *ctx;
};

struct rcl {
    struct rcl_node nodes[RCL_NODES_MAX];
    size_t nnodes;
    char seed_host[RCL_SEEDS_MAX][RCL_HOST_MAX];
    int seed_port[RCL_SEEDS_MAX];
    size_t nseeds;
    int16_t slot_node[RCL_SLOTS];     /* -1: no owner known */
    bool map_ok, cluster;
    size_t masters;
    char *user, *password;
    uint32_t connect_timeout_ms, timeout_ms;
    struct rcl_counters c;
    char *rbuf;                       /* RCL_READ_CHUNK bytes for get_reply */
};

/* Every handle's counters summed, for /stats and /metrics (process-wide). */
static _Atomic uint64_t total_moved, total_ask, total_tryagain, total_clusterdown, total_reconnects,
    total_map_refreshes, total_sunk;
#define COUNT(c, f) ((c)->c.f++, atomic_fetch_add_explicit(&total_##f, 1, memory_order_relaxed))

void rcl_get_totals(struct rcl_counters *out)
{
    out->moved = atomic_load_explicit(&total_moved, memory_order_relaxed);
    out->ask = atomic_load_explicit(&total_ask, memory_order_relaxed);
    out->tryagain = atomic_load_explicit(&total_tryagain, memory_order_relaxed);
    out->clusterdown = atomic_load_explicit(&total_clusterdown, memory_order_relaxed);
    out->reconnects = atomic_load_explicit(&total_reconnects, memory_order_relaxed);
    out->map_refreshes = atomic_load_explicit(&total_map_refreshes, memory_order_relaxed);
    out->sunk = atomic_load_explicit(&total_sunk, memory_order_relaxed);
}

/* ---- slots and parsing -------------------------------------------------------------- */

uint16_t rcl_crc16(const void *data, size_t len)
{
    const uint8_t *p = data;
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned rcl_key_slot(const void *key, size_t len)
{
    const char *k = key;
    const char *open = memchr(k, '{', len);
    if (open) {
        size_t from = (size_t)(open - k) + 1;
        const char *close = memchr(k + from, '}', len - from);
        if (close && close > k + from)    /* "{}" is no tag: the whole key counts */
            return rcl_crc16(k + from, (size_t)(close - (k + from))) & (RCL_SLOTS - 1);
    }
    return rcl_crc16(k, len) & (RCL_SLOTS - 1);
}

int rcl_parse_redirect(const char *msg, size_t len, unsigned *slot, char *host, size_t hostlen,
                       int *port)
{
    int kind;
    size_t at;
    if (len > 6 && memcmp(msg, "MOVED ", 6) == 0) {
        kind = 1;
        at = 6;
    } else if (len > 4 && memcmp(msg, "ASK ", 4) == 0) {
        kind = 2;
        at = 4;
    } else {
        return 0;
    }
    unsigned s = 0;
    size_t digits = 0;
    for (; at < len && msg[at] >= '0' && msg[at] <= '9'; at++, digits++)
        if ((s = s * 10 + (unsigned)(msg[at] - '0')) >= RCL_SLOTS)
            return 0;
    if (digits == 0 || at >= len || msg[at] != ' ')
        return 0;
    at++;
    size_t end = at;
    while (end < len && msg[end] != ' ' && msg[end] != '\r' && msg[end] != '\n')
        end++;
    if (hostport_parse(msg + at, end - at, host, hostlen, port) < 0)
        return 0;
    *slot = s;
    return kind;
}

int rcl_parse_seeds(const char *seeds, char (*hosts)[RCL_HOST_MAX], int *ports, size_t *n,
                    char *err, size_t errlen)
{
    return hostport_parse_seeds(seeds, hosts, ports, n, err, errlen);
}

/* ---- nodes ------------------------------------------------------------------------- */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}


static struct timeval tv_ms(uint32_t ms)
{
    return (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (long)(ms % 1000) * 1000L };
}

static void node_drop(struct rcl *c, struct rcl_node *nd)
{
    if (nd->ctx) {
        redisFree(nd->ctx);
        nd->ctx = NULL;
        COUNT(c, reconnects);
    }
}

/* The index of host:port, added when new; -1 when the table is full (a
 * refresh starts it over, never a call in flight). */
static int node_find(struct rcl *c, const char *host, int port)
{
    for (size_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].port == port && strcmp(c->nodes[i].host, host) == 0)
            return (int)i;
    if (c->nnodes == RCL_NODES_MAX)
        return -1;
    struct rcl_node *nd = &c->nodes[c->nnodes];
    snprintf(nd->host, sizeof nd->host, "%s", host);
    nd->port = port;
    nd->ctx = NULL;
    return (int)c->nnodes++;
}

/* Forget every node (a table filled by nodes that came and went). */
static void nodes_reset(struct rcl *c)
{
    for (size_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].ctx)
            redisFree(c->nodes[i].ctx);
    c->nnodes = 0;
    for (size_t s = 0; s < RCL_SLOTS; s++)
        c->slot_node[s] = -1;
    c->map_ok = false;
}

static int node_connect(struct rcl *c, struct rcl_node *nd, char *err, size_t errlen)
{
    if (nd->ctx)
        return 0;
    redisContext *ctx = redisConnectWithTimeout(nd->host, nd->port, tv_ms(c->connect_timeout_ms));
    if (!ctx || ctx->err) {
        errmsg_set(err, errlen, "redis %s:%d: connect: %s", nd->host, nd->port,
                   ctx ? ctx->errstr : "out of memory");
        if (ctx)
            redisFree(ctx);
        return ctx ? -KVNODE_EIO : -KVNODE_ENOMEM;
    }
    if (redisSetTimeout(ctx, tv_ms(c->timeout_ms)) != REDIS_OK ||
        redisEnableKeepAlive(ctx) != REDIS_OK) {
        errmsg_set(err, errlen, "redis %s:%d: socket options: %s", nd->host, nd->port,
                   ctx->errstr);
        redisFree(ctx);
        return -KVNODE_EIO;
    }
    if (c->password && *c->password) {
        redisReply *r = c->user && *c->user
            ? redisCommand(ctx, "AUTH %s %s", c->user, c->password)
            : redisCommand(ctx, "AUTH %s", c->password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            /* The server's text names the problem (WRONGPASS ...); never the password. */
            errmsg_set(err, errlen, "redis %s:%d: AUTH%s%s refused: %.120s", nd->host, nd->port,
                       c->user && *c->user ? " as " : "", c->user && *c->user ? c->user : "",
                       r ? r->str : ctx->errstr);
            if (r)
                freeReplyObject(r);
            redisFree(ctx);
            return r ? -KVNODE_EDENIED : -KVNODE_EIO;
        }
        freeReplyObject(r);
    }
    nd->ctx = ctx;
    return 0;
}

/* ---- map --------------------------------------------------------------------------- */

static bool reply_int(const redisReply *r, long long *v)
{
    if (!r || r->type != REDIS_REPLY_INTEGER)
        return false;
    *v = r->integer;
    return true;
}

/* Apply a CLUSTER SLOTS reply got from node `from`: 0 or -KVNODE_EPROTO. */
static int map_apply(struct rcl *c, int from, const redisReply *r, char *err, size_t errlen)
{
    int16_t *map = malloc(sizeof c->slot_node);
    if (!map) {
        errmsg_set(err, errlen, "redis: out of memory");
        return -KVNODE_ENOMEM;
    }
    for (size_t s = 0; s < RCL_SLOTS; s++)
        map[s] = -1;
    char from_host[RCL_HOST_MAX];
    snprintf(from_host, sizeof from_host, "%s", c->nodes[from].host);
    bool seen[RCL_NODES_MAX] = { false };
    size_t masters = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        long long lo, hi, port;
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || !reply_int(e->element[0], &lo) ||
            !reply_int(e->element[1], &hi) || lo < 0 || hi < lo || hi >= RCL_SLOTS ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
            e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            !reply_int(e->element[2]->element[1], &port) || port < 1 || port > 65535 ||
            e->element[2]->element[0]->len >= RCL_HOST_MAX) {
            free(map);
            errmsg_set(err, errlen, "redis: CLUSTER SLOTS: malformed entry %zu", i);
            return -KVNODE_EPROTO;
        }
        /* An empty or "?" host: the node we asked (Redis 7 when it does not know its address). */
        const char *h = e->element[2]->element[0]->str;
        if (!*h || strcmp(h, "?") == 0)
            h = from_host;
        int nd = node_find(c, h, (int)port);
        if (nd < 0) {
            free(map);
            errmsg_set(err, errlen, "redis: CLUSTER SLOTS: more than %d nodes", RCL_NODES_MAX);
            return -KVNODE_EPROTO;
        }
        if (!seen[nd]) {
            seen[nd] = true;
            masters++;
        }
        for (long long s = lo; s <= hi; s++)
            map[s] = (int16_t)nd;
    }
    memcpy(c->slot_node, map, sizeof c->slot_node);
    free(map);
    c->cluster = true;
    c->masters = masters;
    c->map_ok = true;
    return 0;
}

static int refresh_from(struct rcl *c, int nd, char *err, size_t errlen)
{
    int rc = node_connect(c, &c->nodes[nd], err, errlen);
    if (rc < 0)
        return rc;
    redisReply *r = redisCommand(c->nodes[nd].ctx, "CLUSTER SLOTS");
    if (!r) {
        errmsg_set(err, errlen, "redis %s:%d: CLUSTER SLOTS: %s", c->nodes[nd].host,
                   c->nodes[nd].port, c->nodes[nd].ctx->errstr);
        node_drop(c, &c->nodes[nd]);
        return -KVNODE_EIO;
    }
    if (r->type == REDIS_REPLY_ERROR && strstr(r->str, "cluster support disabled")) {
        /* A plain server: it owns every slot. */
        for (size_t s = 0; s < RCL_SLOTS; s++)
            c->slot_node[s] = (int16_t)nd;
        c->cluster = false;
        c->masters = 1;
        c->map_ok = true;
        rc = 0;
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
        rc = map_apply(c, nd, r, err, errlen);
    } else {
        errmsg_set(err, errlen, "redis %s:%d: CLUSTER SLOTS: %s", c->nodes[nd].host,
                   c->nodes[nd].port, r->type == REDIS_REPLY_ERROR ? r->str : "no slots assigned");
        rc = -KVNODE_EIO;
    }
    freeReplyObject(r);
    return rc;
}

int rcl_refresh(struct rcl *c, char *err, size_t errlen)
{
    int rc = -KVNODE_EIO;
    COUNT(c, map_refreshes);
    if (c->nnodes == RCL_NODES_MAX)
        nodes_reset(c);
    /* Known nodes first (they know the newest map), then the seeds. */
    for (size_t i = 0; i < c->nnodes; i++)
        if ((rc = refresh_from(c, (int)i, err, errlen)) == 0)
            return 0;
    for (size_t i = 0; i < c->nseeds; i++) {
        int nd = node_find(c, c->seed_host[i], c->seed_port[i]);
        if (nd >= 0 && (rc = refresh_from(c, nd, err, errlen)) == 0)
            return 0;
    }
    c->map_ok = false;
    return rc;
}

/* ---- handle -------------------------------------------------------------------------- */

int rcl_create(const struct rcl_config *cfg, struct rcl **out, char *err, size_t errlen)
{
    *out = NULL;
    struct rcl *c = calloc(1, sizeof *c);
    if (!c) {
        errmsg_set(err, errlen, "redis: out of memory");
        return -KVNODE_ENOMEM;
    }
    int rc = rcl_parse_seeds(cfg->seeds, c->seed_host, c->seed_port, &c->nseeds, err, errlen);
    if (rc < 0) {
        free(c);
        return rc;
    }
    for (size_t s = 0; s < RCL_SLOTS; s++)
        c->slot_node[s] = -1;
    if (!(c->rbuf = malloc(RCL_READ_CHUNK))) {
        free(c);
        errmsg_set(err, errlen, "redis: out of memory");
        return -KVNODE_ENOMEM;
    }
    c->connect_timeout_ms = cfg->connect_timeout_ms ? cfg->connect_timeout_ms : 1000;
    c->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 5000;
    if ((cfg->user && !(c->user = strdup(cfg->user))) ||
        (cfg->password && !(c->password = strdup(cfg->password)))) {
        rcl_destroy(c);
        errmsg_set(err, errlen, "redis: out of memory");
        return -KVNODE_ENOMEM;
    }
    *out = c;
    return 0;
}

void rcl_destroy(struct rcl *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].ctx)
            redisFree(c->nodes[i].ctx);
    if (c->password) {   /* do not leave it in freed memory */
        volatile char *p = c->password;
        while (*p)
            *p++ = 0;
    }
    free(c->password);
    free(c->user);
    free(c->rbuf);
    free(c);
}

bool rcl_is_cluster(const struct rcl *c) { return c->cluster; }
size_t rcl_masters(const struct rcl *c) { return c->masters; }
void rcl_get_counters(const struct rcl *c, struct rcl_counters *out) { *out = c->c; }

/* ---- commands ----------------------------------------------------------------------- */

static bool err_is(const redisReply *r, const char *word)
{
    size_t n = strlen(word);
    return r->len >= n && strncmp(r->str, word, n) == 0 &&
           (r->len == n || r->str[n] == ' ');
}

/* Consume done bytes from the front of (*v)[0..*n): whole entries are
 * skipped, a partly done one is trimmed (what a short sendmsg/readv left). */
static void iov_advance(struct iovec **v, size_t *n, size_t done)
{
    while (*n > 0 && done >= (*v)->iov_len) {
        done -= (*v)->iov_len;
        (*v)++;
        (*n)--;
    }
    if (*n > 0) {
        (*v)->iov_base = (char *)(*v)->iov_base + done;
        (*v)->iov_len -= done;
    }
}

/* Write every byte of iov[0..n) to the (blocking, send-timeout) socket, up
 * to IOV_MAX at a time; iov is consumed. 0, or -1 with ctx's error set. */
static int send_all(redisContext *ctx, struct iovec *v, size_t n)
{
    while (n > 0) {
        struct msghdr mh = { .msg_iov = v, .msg_iovlen = n < IOV_MAX ? n : IOV_MAX };
        ssize_t w = sendmsg(ctx->fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            snprintf(ctx->errstr, sizeof ctx->errstr, "send: %s",
                     errno == EAGAIN ? "timed out" : strerror(errno));
            ctx->err = REDIS_ERR_IO;
            return -1;
        }
        iov_advance(&v, &n, (size_t)w);
    }
    return 0;
}

/* The next reply on ctx, read in chunks of RCL_READ_CHUNK (hiredis's own
 * loop reads 16 KiB at a time: four calls for one 64 KiB block). */
static int get_reply(struct rcl *c, redisContext *ctx, void **reply)
{
    *reply = NULL;
    if (redisReaderGetReply(ctx->reader, reply) != REDIS_OK)
        goto proto;
    while (!*reply) {
        ssize_t r = recv(ctx->fd, c->rbuf, RCL_READ_CHUNK, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(ctx->errstr, sizeof ctx->errstr, "%s",
                     r == 0 ? "connection closed by the server"
                            : errno == EAGAIN ? "timed out" : strerror(errno));
            ctx->err = r == 0 ? REDIS_ERR_EOF : REDIS_ERR_IO;
            return -1;
        }
        if (redisReaderFeed(ctx->reader, c->rbuf, (size_t)r) != REDIS_OK ||
            redisReaderGetReply(ctx->reader, reply) != REDIS_OK)
            goto proto;
    }
    return 0;
proto:
    snprintf(ctx->errstr, sizeof ctx->errstr, "protocol error: %.100s", ctx->reader->errstr);
    ctx->err = REDIS_ERR_PROTOCOL;
    return -1;
}

/* ctx failed: its error set from a recv/readv result r (0 or < 0, errno). */
static int recv_failed(redisContext *ctx, ssize_t r)
{
    snprintf(ctx->errstr, sizeof ctx->errstr, "%s",
             r == 0 ? "connection closed by the server"
                    : errno == EAGAIN ? "timed out" : strerror(errno));
    ctx->err = r == 0 ? REDIS_ERR_EOF : REDIS_ERR_IO;
    return -1;
}

/* Fill iov[0..n) from the (blocking, receive-timeout) socket; iov is
 * consumed. 0, or -1 with ctx's error set. */
static int recv_all(redisContext *ctx, struct iovec *v, size_t n)
{
    while (n > 0) {
        ssize_t r = readv(ctx->fd, v, (int)n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return recv_failed(ctx, r);
        iov_advance(&v, &n, (size_t)r);
    }
    return 0;
}

/* cmd's reply read into its sink (see struct rcl_cmd) when it is a bulk
 * string of sink_len bytes, or made here when it is nil: 1 with *reply
 * set. 0 when it is anything else, or when the reader already holds bytes
 * (from an earlier read of get_reply) or the length line has not fully
 * arrived: nothing consumed, get_reply reads it. -1 when the connection
 * failed (ctx's error set). The length line is peeked at, then read with
 * the value and its CRLF in one readv. */
static int sink_reply(struct rcl *c, redisContext *ctx, struct rcl_cmd *cmd, void **reply)
{
    char line[40];
    ssize_t n;
    *reply = NULL;
    if (ctx->reader->len != ctx->reader->pos)
        return 0;
    do
        n = recv(ctx->fd, line, sizeof line, MSG_PEEK);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return recv_failed(ctx, n);
    const char *nl = memchr(line, '\n', (size_t)n);
    if (line[0] != '$' || !nl || nl - line < 3 || nl[-1] != '\r')
        return 0;
    size_t ll = (size_t)(nl - line) + 1;
    char *end;
    long long v = strtoll(line + 1, &end, 10);
    if (end != nl - 1 || (v != -1 && (v < 0 || (unsigned long long)v != cmd->sink_len)))
        return 0;
    redisReply *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(ctx->errstr, sizeof ctx->errstr, "out of memory");
        ctx->err = REDIS_ERR_OOM;
        return -1;
    }
    char crlf[2];
    struct iovec iov[RCL_SINK_MAX + 2];
    size_t k = 0;
    iov[k++] = (struct iovec){ .iov_base = line, .iov_len = ll };
    if (v >= 0) {
        for (int i = 0; i < cmd->sinkcnt; i++)
            iov[k++] = cmd->sink[i];
        iov[k++] = (struct iovec){ .iov_base = crlf, .iov_len = 2 };
    }
    if (recv_all(ctx, iov, k) < 0) {
        free(r);
        return -1;
    }
    if (v >= 0 && (crlf[0] != '\r' || crlf[1] != '\n')) {
        free(r);
        snprintf(ctx->errstr, sizeof ctx->errstr, "protocol error: a bulk string without CRLF");
        ctx->err = REDIS_ERR_PROTOCOL;
        return -1;
    }
    if (v < 0) {
        r->type = REDIS_REPLY_NIL;
    } else {
        r->type = REDIS_REPLY_STRING;
        r->len = (size_t)v;
        cmd->sunk = true;
        COUNT(c, sunk);
    }
    *reply = r;
    return 1;
}

/* Node nd is gone: its pending commands go again (after a fetch of the map). */
static void node_lost(struct rcl *c, int nd, struct rcl_cmd *cmds, size_t n, int *last_rc,
                      char *err, size_t errlen)
{
    struct rcl_node *node = &c->nodes[nd];
    errmsg_set(err, errlen, "redis %s:%d: %s", node->host, node->port,
               node->ctx && node->ctx->errstr[0] ? node->ctx->errstr : "connection lost");
    *last_rc = -KVNODE_EIO;   /* hiredis 0.14 reports a timeout as an I/O error (EAGAIN) */
    node_drop(c, node);
    for (size_t i = 0; i < n; i++)
        if (!cmds[i].reply && cmds[i].node == nd)
            cmds[i].node = -1;
    c->map_ok = false;
}

/* Send every pending command of node nd in one gathered write (commands
 * in argv form are formatted here; iov ones go from where they are): 0, or
 * -1 when the node is lost. */
static int send_node(struct rcl *c, int nd, struct rcl_cmd *cmds, size_t n, int *last_rc,
                     char *err, size_t errlen)
{
    static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
    struct rcl_node *node = &c->nodes[nd];
    int rc = node_connect(c, node, err, errlen);
    if (rc < 0) {
        *last_rc = rc;
        c->map_ok = false;
        for (size_t i = 0; i < n; i++)
            if (!cmds[i].reply && cmds[i].node == nd)
                cmds[i].node = -1;
        return -1;
    }
    size_t cap = 0, m = 0, nowned = 0;
    for (size_t i = 0; i < n; i++)
        if (!cmds[i].reply && cmds[i].node == nd)
            cap += 1 + (cmds[i].iovcnt > 0 ? (size_t)cmds[i].iovcnt : 1);
    struct iovec *v = malloc(cap * sizeof *v);
    char **owned = malloc(cap * sizeof *owned);
    if (!v || !owned) {
        free(v);
        free(owned);
        errmsg_set(err, errlen, "redis: out of memory");
        *last_rc = -KVNODE_ENOMEM;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (cmds[i].reply || cmds[i].node != nd)
            continue;
        if (cmds[i].ask_node >= 0)
            v[m++] = (struct iovec){ .iov_base = (void *)asking, .iov_len = sizeof asking - 1 };
        if (cmds[i].iovcnt > 0) {
            for (int j = 0; j < cmds[i].iovcnt; j++)
                v[m++] = cmds[i].iov[j];
        } else {
            char *f = NULL;
            int len = redisFormatCommandArgv(&f, cmds[i].argc, cmds[i].argv, cmds[i].argvlen);
            if (len < 0 || !f) {
                rc = -1;
                break;
            }
            owned[nowned++] = f;
            v[m++] = (struct iovec){ .iov_base = f, .iov_len = (size_t)len };
        }
    }
    if (rc == 0)
        rc = send_all(node->ctx, v, m);
    else
        errmsg_set(err, errlen, "redis: out of memory");
    for (size_t i = 0; i < nowned; i++)
        free(owned[i]);
    free(owned);
    free(v);
    if (rc == 0)
        return 0;
    node_lost(c, nd, cmds, n, last_rc, err, errlen);
    return -1;
}

/* Read the replies of node nd's commands. Returns true when a retry needs a
 * backoff first (TRYAGAIN, CLUSTERDOWN, a lost node). */
static bool recv_node(struct rcl *c, int nd, struct rcl_cmd *cmds, size_t n, int *last_rc,
                      char *err, size_t errlen)
{
    struct rcl_node *node = &c->nodes[nd];
    bool backoff = false;
    for (size_t i = 0; i < n; i++) {
        struct rcl_cmd *cmd = &cmds[i];
        if (cmd->reply || cmd->node != nd)
            continue;
        void *v = NULL;
        if (cmd->ask_node >= 0) {
            if (get_reply(c, node->ctx, &v) < 0)
                goto lost;
            freeReplyObject(v);
            cmd->ask_node = -1;
            v = NULL;
        }
        int sunk = cmd->sinkcnt > 0 ? sink_reply(c, node->ctx, cmd, &v) : 0;
        if (sunk < 0 || (sunk == 0 && get_reply(c, node->ctx, &v) < 0))
            goto lost;
        redisReply *r = v;
        cmd->node = -1;
        if (r->type == REDIS_REPLY_ERROR) {
            unsigned slot;
            char host[RCL_HOST_MAX];
            int port;
            int kind = rcl_parse_redirect(r->str, r->len, &slot, host, sizeof host, &port);
            if (kind == 1) {
                COUNT(c, moved);
                int to = node_find(c, host, port);
                if (to >= 0)
                    c->slot_node[slot] = (int16_t)to;
                c->map_ok = false;     /* more slots have probably moved: fetch the map */
                freeReplyObject(r);
                continue;
            }
            if (kind == 2) {
                COUNT(c, ask);
                cmd->ask_node = node_find(c, host, port);
                if (cmd->ask_node < 0)
                    c->map_ok = false;
                freeReplyObject(r);
                continue;
            }
            if (err_is(r, "TRYAGAIN") || err_is(r, "CLUSTERDOWN") || err_is(r, "LOADING") ||
                err_is(r, "MASTERDOWN") || err_is(r, "READONLY")) {
                if (err_is(r, "TRYAGAIN")) {
                    COUNT(c, tryagain);
                } else {
                    COUNT(c, clusterdown);
                    c->map_ok = false;
                }
                errmsg_set(err, errlen, "redis %s:%d: %.160s", node->host, node->port, r->str);
                *last_rc = -KVNODE_EIO;
                backoff = true;
                freeReplyObject(r);
                continue;
            }
        }
        cmd->reply = r;
        cmd->rc = 0;
    }
    return backoff;

lost:
    node_lost(c, nd, cmds, n, last_rc, err, errlen);
    return true;
}

int rcl_run(struct rcl *c, struct rcl_cmd *cmds, size_t n, char *err, size_t errlen)
{
    uint64_t deadline = now_ms() + c->timeout_ms;
    unsigned backoff_ms = RCL_BACKOFF_MIN_MS;
    int last_rc = -KVNODE_EIO;
    char e[256] = "";
    for (size_t i = 0; i < n; i++) {
        cmds[i].reply = NULL;
        cmds[i].sunk = false;
        cmds[i].rc = -KVNODE_EIO;
        cmds[i].node = -1;
        cmds[i].ask_node = -1;
    }
    for (;;) {
        if (!c->map_ok && rcl_refresh(c, e, sizeof e) < 0)
            last_rc = -KVNODE_EIO;
        size_t pending = 0;
        for (size_t i = 0; i < n; i++) {
            if (cmds[i].reply)
                continue;
            pending++;
            if (cmds[i].ask_node >= 0) {
                cmds[i].node = cmds[i].ask_node;
            } else {
                int nd = c->slot_node[rcl_key_slot(cmds[i].argv[1], cmds[i].argvlen[1])];
                cmds[i].node = nd >= 0 ? nd : (c->nnodes ? 0 : -1);
            }
        }
        if (pending == 0)
            return 0;
        bool backoff = c->nnodes == 0;
        if (now_ms() >= deadline)
            break;
        /* Every shard's commands go out before any reply is read, so the
         * shards work on them at the same time. */
        bool sent[RCL_NODES_MAX] = { false };
        size_t nodes = c->nnodes;
        for (int nd = 0; (size_t)nd < nodes; nd++) {
            bool any = false;
            for (size_t i = 0; i < n && !any; i++)
                any = !cmds[i].reply && cmds[i].node == nd;
            if (any && send_node(c, nd, cmds, n, &last_rc, e, sizeof e) == 0)
                sent[nd] = true;
            else if (any)
                backoff = true;
        }
        for (int nd = 0; (size_t)nd < nodes; nd++)
            if (sent[nd] && recv_node(c, nd, cmds, n, &last_rc, e, sizeof e))
                backoff = true;
        if (backoff) {
            uint64_t t = now_ms();
            if (t >= deadline)
                continue;   /* one last look at what is pending, then fail */
            clock_sleep_ms((unsigned)(deadline - t < backoff_ms ? deadline - t : backoff_ms));
            backoff_ms = backoff_ms * 2 > RCL_BACKOFF_MAX_MS ? RCL_BACKOFF_MAX_MS : backoff_ms * 2;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!cmds[i].reply)
            cmds[i].rc = last_rc;
    errmsg_set(err, errlen, "%s (gave up after %u ms)", e[0] ? e : "redis: no node answers",
               c->timeout_ms);
    return last_rc;
}

/* ---- removal by pattern ------------------------------------------------------------- */

#define RCL_SCAN_COUNT "1000"

/* UNLINK the keys of one SCAN page on node nd: one command per key (a
 * cluster refuses keys of several slots in one), pipelined. */
static int unlink_page(struct rcl *c, int nd, const redisReply *keys, uint64_t *removed, char *err,
                       size_t errlen)
{
    redisContext *ctx = c->nodes[nd].ctx;
    size_t n = keys->elements;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const char *argv[2] = { "UNLINK", keys->element[i]->str };
        size_t lens[2] = { 6, keys->element[i]->len };
        if (redisAppendCommandArgv(ctx, 2, argv, lens) != REDIS_OK) {
            errmsg_set(err, errlen, "redis %s:%d: UNLINK: %s", c->nodes[nd].host, c->nodes[nd].port,
                       ctx->errstr);
            node_drop(c, &c->nodes[nd]);
            return -KVNODE_EIO;
        }
    }
    for (size_t i = 0; i < n; i++) {
        redisReply *r = NULL;
        long long v;
        if (redisGetReply(ctx, (void **)&r) != REDIS_OK || !r) {
            errmsg_set(err, errlen, "redis %s:%d: UNLINK: %s", c->nodes[nd].host, c->nodes[nd].port,
                       ctx->errstr);
            node_drop(c, &c->nodes[nd]);
            return -KVNODE_EIO;
        }
        if (reply_int(r, &v) && v >= 0)
            *removed += (uint64_t)v;
        else if (rc == 0) {
            /* A key moved meanwhile (MOVED) is left: the next purge finds it. */
            errmsg_set(err, errlen, "redis %s:%d: UNLINK: %.160s", c->nodes[nd].host, c->nodes[nd].port,
                       r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            rc = -KVNODE_EIO;
        }
        freeReplyObject(r);
    }
    return rc;
}

/* SCAN node nd to the end, unlinking each page's keys. */
static int scan_unlink_node(struct rcl *c, int nd, const char *pattern, size_t plen, uint64_t *removed,
                            char *err, size_t errlen)
{
    char cursor[32] = "0";
    int rc = node_connect(c, &c->nodes[nd], err, errlen);
    if (rc < 0)
        return rc;
    do {
        const char *argv[6] = { "SCAN", cursor, "MATCH", pattern, "COUNT", RCL_SCAN_COUNT };
        size_t lens[6] = { 4, strlen(cursor), 5, plen, 5, strlen(RCL_SCAN_COUNT) };
        redisReply *r = redisCommandArgv(c->nodes[nd].ctx, 6, argv, lens);
        if (!r) {
            errmsg_set(err, errlen, "redis %s:%d: SCAN: %s", c->nodes[nd].host, c->nodes[nd].port,
                       c->nodes[nd].ctx->errstr);
            node_drop(c, &c->nodes[nd]);
            return -KVNODE_EIO;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[0]->len >= sizeof cursor || r->element[1]->type != REDIS_REPLY_ARRAY) {
            errmsg_set(err, errlen, "redis %s:%d: SCAN: %.160s", c->nodes[nd].host, c->nodes[nd].port,
                       r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            freeReplyObject(r);
            return -KVNODE_EIO;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len);
        cursor[r->element[0]->len] = '\0';
        rc = unlink_page(c, nd, r->element[1], removed, err, errlen);
        freeReplyObject(r);
        if (rc < 0)
            return rc;
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

int rcl_scan_unlink(struct rcl *c, const char *pattern, size_t plen, uint64_t *removed, char *err,
                    size_t errlen)
{
    bool done[RCL_NODES_MAX] = { false };
    int rc;
    *removed = 0;
    if (!c->map_ok && (rc = rcl_refresh(c, err, errlen)) < 0)
        return rc;
    /* Every node that owns a slot, once. */
    for (size_t s = 0; s < RCL_SLOTS; s++) {
        int nd = c->slot_node[s];
        if (nd < 0 || done[nd])
            continue;
        done[nd] = true;
        if ((rc = scan_unlink_node(c, nd, pattern, plen, removed, err, errlen)) < 0)
            return rc;
    }
    return 0;
}
