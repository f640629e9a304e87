/* kvs_server: rtp-llm's KVS protocol served by kvnoded (issue 18), so that an
 * rtp-llm engine with the KVS connector (ENABLE_KVS_CACHE) is a kvnode client
 * with no change. docs/PROTOCOLS.md §3 and
 * shared/docs/reference/rtp-llm-kvs-client.md describe the wire.
 *
 *  - Control plane (kvs_server.c): HTTP on the loop (evhttp) at
 *    [kvs_server] listen: GET /health, POST /acquire (scope read | create),
 *    /seal, /release, /discard. One HTTP lease is one kvnode lease per
 *    namespace it touches, owned by the HTTP lease itself (not by a TCP
 *    connection: the client opens one per request), with TTL = the request's
 *    term; the cache's reaper ends them at term, a sweep frees the records.
 *  - Data plane (kvs_server_dataplane.c): the vineyard handshake on the unix
 *    socket [kvs_server] socket_path; the fd handed out is the host arena of
 *    the connecting uid's tenant (SO_PEERCRED), so offsets are offsets there.
 *    A peer without a tenant is closed at accept; connections are limited
 *    per tenant and in total; an unfinished handshake ends at
 *    server.hello_timeout.
 *  - Keys and peers (kvs_server_keys.c): the object-key parser (rtp-llm's
 *    v1 keys; any other key an opaque object), the layout a key's namespace
 *    has (kvs_key_layout: the same namespace a libkvnode client reaches by
 *    declaring that layout; every rank served, a namespace per object size,
 *    reads looked up across them), and the uid of a loopback TCP
 *    peer (the kernel's socket table, NETLINK_SOCK_DIAG), established once
 *    when its connection is accepted and kept with the connection.
 *  - Lease ids and per-tenant lease counts (kvs_server_leases.c).
 *  - Per-tenant HTTP connection counts, applied at accept
 *    (kvs_server_http.c).
 *
 * Loop thread only. */
#ifndef KVNODE_KVS_SERVER_H
#define KVNODE_KVS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "mem/namespace.h"

struct event_base;
struct kvs_server;
struct tenants;
struct tenant;
struct kvn_config;

#define KVS_LAYOUT_NAME     "rtp_llm_group_block_v1"  /* object_metas layout; the namespace's dtype */
#define KVS_KEY_FORMAT      "<ns>/v<version>/<deployment_id>/tp-<rank>/group-<g>/block-<int64>"
#define KVS_KEY_MAX         512       /* bytes of one v1 object key */
#define KVS_OPAQUE_KEY_MAX  4096      /* bytes of any other object key */
#define KVS_OPAQUE_MODEL    "kvs-opaque-objects"   /* the model of opaque objects' namespaces */
#define KVS_PART_MAX        128       /* bytes of its ns and deployment_id parts, NUL included */

/* An object key, parsed. */
struct kvs_key {
    char     object_ns[KVS_PART_MAX];
    uint32_t version;
    char     deployment_id[KVS_PART_MAX];
    uint32_t tp_rank;
    uint32_t group;
    int64_t  block;
    /* Any other key: an opaque object of the tenant, named by the SHA-256
     * of the key's bytes (block = its first 8 bytes, check = the next 8:
     * 128 bits must match for one key to find another's object). */
    bool     opaque;
    uint64_t check;             /* the block's check word (0 for v1 keys) */
};

/* Parse key (len bytes, not NUL-terminated) as KVS_KEY_FORMAT: numbers
 * canonical (one key string per object), parts that fit every layout
 * kvs_key_layout and kvs_bind_object_ns may make of it. 0, or -1 with err
 * naming the problem and the expected format. */
int kvs_key_parse(const char *key, size_t len, struct kvs_key *out, char *err, size_t errlen);

/* A key of either kind: rtp-llm's v1 (kvs_key_parse), else an opaque
 * object (empty object_ns and deployment_id). 0, or -1 with err (empty, or
 * longer than KVS_OPAQUE_KEY_MAX). */
int kvs_key_classify(const char *key, size_t len, struct kvs_key *out, char *err, size_t errlen);

/* The keys of one request nearly all share their first five parts
 * ("ns/vN/deployment/tp-R/group-G/block-"): a v1 key kvs_key_parse took,
 * its length up to the block number (0 for an opaque key). */
size_t kvs_key_prefix_len(const char *key, size_t len, const struct kvs_key *parsed);
/* Whether key has the prefix of an earlier v1 key (prefix_len bytes of
 * prev) and a canonical block number after it, which *block then is: the
 * key parses as the earlier one with that block (kvs_key_parse would say
 * the same), without parsing its other parts again. */
bool kvs_key_same_prefix(const char *prev, size_t prefix_len, const char *key, size_t len, int64_t *block);

/* The layout of k's namespace (block_bytes as given); an opaque key's is
 * model KVS_OPAQUE_MODEL, extra "kvs_opaque_objects=1", tp_size 1. Else: model = the
 * deployment id, dtype = KVS_LAYOUT_NAME, block_tokens = num_layers =
 * kv_heads = head_dim = 1, extra =
 * "kvs_deployment_id=<id>;kvs_object_ns=<ns>;kvs_version=<v>;kvs_group=<g>".
 * A rank below tp_size ([kvs_server] tp_size: the TP size of the deployments
 * served, when one is known) is rank tp_rank of tp_size, so that KVCM sees
 * a key once every rank holds it; any other rank is served as a deployment
 * of its own (tp_size 1, tp_rank 0, and for a rank r > 0 ";kvs_tp_rank=<r>"
 * appended to extra): no rank is refused. A libkvnode client that declares
 * exactly this layout binds the same namespace (its blocks are the objects'
 * blocks, key = block). 0, or -1 with err when a part does not fit a layout
 * field. */
int kvs_key_layout(const struct kvs_key *k, uint32_t tp_size, uint64_t block_bytes, struct ns_layout *out,
                   char *err, size_t errlen);

/* Objects of any size (a namespace per size): the first size of a
 * (deployment, rank, group) binds its plain layout (kvs_key_layout); a size
 * the plain one does not have binds l with KVS_SIZE_TAG "<bytes>" appended to
 * extra (l is changed so). cache_bind's 0 or negative code, err set. */
#define KVS_SIZE_TAG ";kvs_object_bytes="
struct cache;
struct cache_loc;
struct kv_namespace;
struct lease_list;
int kvs_bind_object_ns(struct cache *c, struct ns_layout *l, struct kv_namespace **out, char *err, size_t errlen);

/* A create in ns (bound from the plain layout `plain` of its deployment,
 * rank and group, kvs_key_layout): the first of keys (check words as
 * cache_first_held) already held in another namespace of that group, i.e.
 * at another object size: its index, with that size in *size; n when none.
 * One key is one object: it is not created again at another size. */
size_t kvs_held_at_other_size(struct cache *c, const struct ns_layout *plain, const struct kv_namespace *ns,
                              const int64_t *keys, const uint64_t *checks, size_t n, uint64_t *size);

/* An acquire(read) of n keys of one (deployment, rank, group), whatever
 * their sizes: every namespace of the group (plain layout l, and one per
 * other size) is asked for the keys not found in the ones before it, each
 * with hits pinned under one cache read lease owned by owner. */
struct kvs_read {
    const int64_t     *keys;
    const uint64_t    *checks;      /* n check words, or NULL: every word 0 */
    size_t             n;
    struct lease_list *owner;
    struct cache_loc  *locs;        /* out: n, present = a hit */
    uint64_t          *bytes;       /* out: n, a hit's object size */
    uint64_t          *lease_ids;   /* out: the cache leases taken, appended */
    size_t            *nleases;     /* in/out: how many lease_ids holds */
    size_t             max_leases;  /* lease_ids' room; the lookup stops there */
};
/* 0 or a negative cache code, err set (the leases taken so far are in
 * lease_ids either way). */
int kvs_read_objects(struct cache *c, const struct ns_layout *l, struct kvs_read *r, char *err, size_t errlen);

/* The uid owning the other end of the loopback TCP connection fd (its
 * 4-tuple looked up in the kernel's socket table, NETLINK_SOCK_DIAG). *diag
 * is the netlink socket to ask on, kept between calls (-1: opened here; put
 * back to -1, closed, after a failed query). 0, or -1 with err (peer not on
 * loopback, socket gone or already closed by its owner, no answer). */
int kvs_peer_tcp_uid(int fd, int *diag, uid_t *uid, char *err, size_t errlen);

/* The HTTP listener's identify hook (httpd_set_identify) on a TCP listen
 * address: the client's uid by kvs_peer_tcp_uid, once, at accept. Its
 * argument is the int holding the diag socket. */
struct httpd_peer;
void kvs_identify_tcp(void *arg, int fd, struct httpd_peer *out);

/* Counters ("kvs_server" in /stats, kvnode_kvs_server_* in /metrics). */
struct kvs_server_stats {
    const char *http_address, *socket_path;
    uint64_t health, acquire_read, acquire_create, seal, release, discard;
    uint64_t bad_requests;            /* 4xx other than 403 */
    uint64_t denied;                  /* 403: no tenant for the peer */
    uint64_t failed;                  /* 5xx */
    uint64_t read_keys, read_hits, create_keys, create_existing;
    uint64_t leases_open, leases_expired;
    uint64_t dataplane_open, dataplane_accepted, dataplane_refused, fds_lent;
    uint64_t dataplane_denied;        /* closed at accept: no tenant for the peer (admission) */
    uint64_t dataplane_tenant_limit;  /* closed at accept: its tenant at its max_clients */
    uint64_t dataplane_timed_out;     /* closed: no handshake within server.hello_timeout */
    uint64_t http_open, http_max, http_accepted;
    uint64_t http_refused;            /* 503 at connect: kvs_server.max_connections or descriptors */
    uint64_t http_timed_out;          /* kvs_server.request_timeout */
    uint64_t http_tenant_limit;       /* of http_refused: the tenant at its share (or no tenant, reserve full) */
    uint64_t http_output_bytes;       /* reply bytes not yet taken by the kernel (all connections) */
    uint64_t http_output_max;         /* kvs_server.max_output_total_bytes */
    uint64_t http_output_refused;     /* replies refused: over max_output_bytes or the total */
    uint64_t http_output_tenant_limit; /* of them: over the tenant's share of the total */
    uint64_t http_input_bytes;        /* bytes of requests being received (all connections) */
    uint64_t http_input_max;          /* kvs_server.max_input_total_bytes */
    uint64_t http_input_refused;      /* connections answered 503 and closed: over it */
    uint64_t http_input_tenant_limit; /* of them: over the tenant's share of it */
    uint64_t http_replies_inline;     /* replies written whole in the turn they were made */
    uint64_t http_reads_extended;     /* reads past libevent's 4096 bytes in one turn */
    uint64_t http_reads_early;        /* requests read in the turn their connection was accepted */
};

/* What the front end uses, given at creation by whoever wires the process
 * (net/ sits below it and never sees the daemon's struct). */
struct kvs_server_deps {
    struct event_base *base;
    struct kvn_config *const *cfg;   /* the effective configuration, read at each use (a reload swaps *cfg) */
    struct tenants *tenants;         /* a peer's tenant, its cache */
};

/* Start both planes when [kvs_server] enabled = on (*out NULL otherwise).
 * 0, or -1 with err. */
int  kvs_server_create(const struct kvs_server_deps *deps, struct kvs_server **out, char *err, size_t errlen);
/* Stop listening (shutdown). */
void kvs_server_begin_shutdown(struct kvs_server *k);
/* End every HTTP lease (before the caches go) and free everything. NULL ok. */
void kvs_server_destroy(struct kvs_server *k);
void kvs_server_get_stats(const struct kvs_server *k, struct kvs_server_stats *out);

/* --- shared by the files of the front end ------------------------------- */

/* The tenant of a peer for the front end: [server] allow lists applied as
 * the engine socket applies them, then tenants_for_peer. groups NULL (a TCP
 * peer: only its uid is known): a uid that no [tenant.NAME] lists by uid
 * while some section or allow list names groups cannot be placed soundly
 * and is refused. NULL with why set when refused. */
struct tenant *kvs_server_tenant(const struct kvn_config *cfg, struct tenants *ts, uid_t uid, gid_t gid,
                                 const gid_t *groups, size_t ngroups, bool groups_known, char *why,
                                 size_t whylen);

/* kvs_server_tenant for the peer of a unix socket fd (SO_PEERCRED and its
 * groups); *cred gets its credentials (pid -1, uid and gid -1 when the
 * kernel cannot say). NULL with why set when refused. */
struct tenant *kvs_server_unix_tenant(const struct kvn_config *cfg, struct tenants *ts, int fd, struct ucred *cred,
                                      char *why, size_t whylen);

/* Per-tenant HTTP connection counts and the front end's side of the output
 * caps (kvs_server_http.c): each connection's tenant is established at
 * accept and counted against its share of [kvs_server] max_connections
 * until it closes (a named tenant's in proportion to its host memory, at
 * least 1; "default" what the sections leave, after max_connections / 32
 * kept for clients whose tenant cannot be established), so one tenant at
 * its share never leaves another without a connection. The unsent reply
 * bytes of a tenant's connections are bounded by its share of
 * max_output_total_bytes the same way (httpd counts them per group: the
 * tenant's slot here). */
struct kvs_http_conns;
struct httpd_peer;
struct evhttp_request;
struct kvs_http_conns *kvs_http_conns_new(struct kvn_config *const *cfg, struct tenants *ts);
void kvs_http_conns_free(struct kvs_http_conns *hc);
uint64_t kvs_http_tenant_limit(const struct kvs_http_conns *hc);   /* refused at a share */
/* httpd's admit and release hooks (arg: the struct kvs_http_conns). */
int  kvs_http_admit(void *arg, int fd, const struct httpd_peer *peer, void **token, uint32_t *group, char *why,
                    size_t whylen);
void kvs_http_release(void *arg, void *token);
/* httpd's group bound (httpd_set_group_output): the unsent reply bytes a
 * tenant's connections may hold, its share of max_output_total_bytes. */
uint64_t kvs_http_group_output(void *arg, uint32_t group, char *who, size_t wholen);
/* httpd's group input bound (httpd_set_group_input): the bytes of requests
 * being received a tenant's connections may hold, its share of
 * max_input_total_bytes (the same shares and reserve). */
uint64_t kvs_http_group_input(void *arg, uint32_t group, char *who, size_t wholen);
/* text (malloc'd JSON, a reply of *code to req) if the output caps let it
 * be written; else it is freed and an error naming the cap is returned
 * instead, *code set to 413 or 503. */
char *kvs_http_bound_reply(struct evhttp_request *req, int *code, char *text);

struct kvs_dataplane;
int  kvs_dataplane_create(const struct kvs_server_deps *deps, struct kvs_dataplane **out, char *err,
                          size_t errlen);
void kvs_dataplane_stop(struct kvs_dataplane *dp);
void kvs_dataplane_destroy(struct kvs_dataplane *dp);
void kvs_dataplane_stats(const struct kvs_dataplane *dp, struct kvs_server_stats *out);

#endif
