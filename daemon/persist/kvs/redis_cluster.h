/* kvs/redis_cluster: the Redis Cluster client part hiredis 0.14 lacks —
 * key slots (CRC16/XMODEM of the key or its {hash tag}, mod 16384), the slot
 * map from CLUSTER SLOTS, MOVED / ASK redirects, TRYAGAIN / CLUSTERDOWN and
 * lost connections retried with a doubling backoff, and the map fetched
 * again after any of them (a failover moves slots to the promoted replica).
 * A server without cluster support (CLUSTER SLOTS answers "cluster support
 * disabled") is a map of one node that owns every slot: the same code.
 *
 * One rcl handle belongs to one thread (a persist worker); every call blocks
 * at most the request timeout in total (connects bounded by the connect
 * timeout), retries included. Passwords are used for AUTH only, never put in
 * a message. */
#ifndef KVNODE_KVS_REDIS_CLUSTER_H
#define KVNODE_KVS_REDIS_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/uio.h>

#include <hiredis.h>

#include "core/hostport.h"

#define RCL_SLOTS          16384
#define RCL_NODES_MAX      64          /* masters (and seeds) one map may name */
#define RCL_HOST_MAX       HOSTPORT_HOST_MAX
#define RCL_SEEDS_MAX      HOSTPORT_SEEDS_MAX
#define RCL_BACKOFF_MIN_MS 20u         /* first wait after TRYAGAIN / CLUSTERDOWN / a lost node */
#define RCL_BACKOFF_MAX_MS 500u
#define RCL_READ_CHUNK     (256u << 10) /* bytes one recv may take */

struct rcl_config {
    const char *seeds;             /* "host:port[,host:port...]" */
    const char *user;              /* ACL user (NULL/"": AUTH with the password alone) */
    const char *password;          /* NULL/"": no AUTH */
    uint32_t connect_timeout_ms, timeout_ms;
};

/* Counters of one handle (monotonic): MOVED and ASK redirects followed,
 * TRYAGAIN and CLUSTERDOWN (with LOADING, MASTERDOWN, READONLY) answers
 * retried, connections dropped (lost nodes), slot maps fetched, replies
 * read straight into a command's sink (struct rcl_cmd). */
struct rcl_counters {
    uint64_t moved, ask, tryagain, clusterdown, reconnects, map_refreshes, sunk;
};

#define RCL_SINK_MAX       2           /* segments of a reply sink */

/* One command of a batch: argv[0..argc) (argv[1] is the key, which routes
 * it), or, when iovcnt > 0, the bytes of iov as they are (the command in
 * RESP, written with writev: a large value is sent from where it is, never
 * copied; argv[1] still routes). reply is set on success (the caller frees it with freeReplyObject);
 * rc is 0, or < 0 when it could not be run within the deadline.
 *
 * sink (optional, sinkcnt > 0): where a bulk-string reply of exactly
 * sink_len bytes (the sum of the segments) goes, read from the socket
 * straight into the segments in order (a GET's value: the kernel's copy is
 * the only one). Such a reply sets sunk, and reply is then a
 * REDIS_REPLY_STRING of that len with no str. Every other reply (nil, an
 * error, a redirect, another length) arrives in reply as usual, and the
 * segments may then hold any bytes. */
struct rcl_cmd {
    int argc;
    const char *argv[3];
    size_t argvlen[3];
    const struct iovec *iov;
    int iovcnt;
    struct iovec sink[RCL_SINK_MAX];
    int sinkcnt;
    size_t sink_len;
    bool sunk;
    redisReply *reply;
    int rc;
    /* private */
    int node;                      /* where it goes this round */
    int ask_node;                  /* >= 0: ASKING to this node first */
};

struct rcl;

/* The slot of a key (Redis Cluster rules, hash tags included). */
unsigned rcl_key_slot(const void *key, size_t len);
/* CRC16/XMODEM (poly 0x1021, init 0): rcl_crc16("123456789") == 0x31C3. */
uint16_t rcl_crc16(const void *data, size_t len);

/* A "MOVED <slot> <host>:<port>" or "ASK ..." error: 1 (MOVED) or 2 (ASK)
 * with the parts, 0 for any other text (including malformed redirects). */
int rcl_parse_redirect(const char *msg, size_t len, unsigned *slot, char *host, size_t hostlen,
                       int *port);

/* Parse seeds: hostport_parse_seeds (core/hostport.h), which config also
 * checks [persist] nodes with. */
int rcl_parse_seeds(const char *seeds, char (*hosts)[RCL_HOST_MAX], int *ports, size_t *n,
                    char *err, size_t errlen);

/* A handle; it connects lazily: 0 or -KVNODE_EINVAL / -KVNODE_ENOMEM. */
int  rcl_create(const struct rcl_config *cfg, struct rcl **out, char *err, size_t errlen);
void rcl_destroy(struct rcl *c);
/* Fetch the slot map now (from any node that answers, seeds last): 0 or < 0. */
int  rcl_refresh(struct rcl *c, char *err, size_t errlen);
/* Run n commands, pipelined: one write and one read per node per round,
 * redirected and retried until each has a reply or the request timeout has
 * passed. Returns 0 when every command has a reply (which may be a Redis
 * error reply, e.g. OOM), else the first failure (< 0, err set); each
 * command's rc says how it ended. */
int  rcl_run(struct rcl *c, struct rcl_cmd *cmds, size_t n, char *err, size_t errlen);
/* Remove every key matching the glob pattern (SCAN ... MATCH, page by
 * page, each page's keys UNLINKed on the node that listed them) from every
 * master of the map (fetched first when there is none). *removed counts the
 * keys the nodes said they removed. Each call blocks at most the request
 * timeout; the whole walk as long as the keyspace takes. 0 or < 0 (err
 * set; what was removed before stays removed). */
int  rcl_scan_unlink(struct rcl *c, const char *pattern, size_t plen, uint64_t *removed, char *err,
                     size_t errlen);
/* True when the map says cluster (false: a single non-cluster server). */
bool rcl_is_cluster(const struct rcl *c);
/* Masters in the current map. */
size_t rcl_masters(const struct rcl *c);
void rcl_get_counters(const struct rcl *c, struct rcl_counters *out);
/* Every handle's counters summed over the process (thread-safe). */
void rcl_get_totals(struct rcl_counters *out);

#endif
