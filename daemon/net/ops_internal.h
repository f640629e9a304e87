/* ops_internal: what the pieces of ops share — struct ops, a deferred
 * request (struct ops_pending), and the functions one piece calls in
 * another. Private to daemon/net/ops*.c; everything else goes through ops.h.
 *
 *   ops.c           the ops object and its settings, request counters and
 *                   timing, reply helpers, the dispatch of a request, the end
 *                   of a session
 *   ops_control.c   HELLO (layout, namespace binding, the arenas lent), STATS,
 *                   PING, RELOAD
 *   ops_data.c      the block requests: MATCH, MATCH_REMOTE, GET_BEGIN /
 *                   PUT_BEGIN, GET_END / PUT_COMMIT / PUT_ABORT, GET_INLINE,
 *                   PUT_INLINE, DELETE
 *   ops_deferred.c  answers that wait (for the store or KVCM): deferring a
 *                   request, answering it later, puts waiting for room
 *   ops_purge.c     PURGE: who may purge what, the answer once it is over
 *
 * Loop thread only. */
#ifndef KVNODE_OPS_INTERNAL_H
#define KVNODE_OPS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/log.h"
#include "net/ops.h"
#include "tenants/tenants.h"

struct kvcm_query;
struct kvcm_query_answer;

#define OP_SLOTS METRICS_OP_SLOTS   /* request oneof field numbers are < 32 */

struct op_counts { uint64_t ok, error; };

struct ops {
    struct tenants *tenants;            /* each session is served from its tenant's cache */
    const struct kvn_config *cfg;
    struct server *server;
    ops_reload_fn reload;
    void *reload_arg;
    uint64_t started_ms;
    struct op_counts counts[OP_SLOTS];
    struct metrics_requests requests;   /* by op and status, with latency */
    int last_code;                      /* status of the request being handled */
    double request_t0;                  /* when it arrived (ops_now_s) */
    double put_deadline;                /* a put retried after waiting for the store:
                                           when its wait ends for good; 0: first try */
    bool deferred;                      /* the request being handled answers later */
    ops_stats_fn stats_hook;
    void *stats_hook_arg;
    struct kvcm_querier *querier;       /* NULL: [kvcm] off */
    /* HELLOs that said the HBM lent before could not be mapped (hbm_unusable). */
    uint64_t hbm_unusable_clients;
    char hbm_unusable_last[320];        /* "pid N (name): reason" of the latest */
    struct log_limit hbm_unusable_log;  /* its log line: once a minute */
};

/* A request whose answer waits for the store (cache_*_start returned
 * CACHE_WAITING). The connection reads nothing more until it is answered. */
struct ops_pending {
    struct ops *o;
    struct conn *conn;
    struct session *s;
    uint64_t req_id;
    int op;                 /* KVNODE__REQUEST__OP_* */
    size_t n;               /* keys asked for */
    double t0;
    struct cache_wait *wait;            /* MATCH / GET waiting for the store */
    bool per_key;                       /* MATCH: answered per key (MatchRequest.per_key) */
    struct kvcm_query *query;           /* MATCH_REMOTE waiting for KVCM */
    uint32_t local_matched;             /* MATCH_REMOTE: the local answer */
    uint8_t *packed;                    /* PUT waiting for the store: the request, to retry */
    size_t packed_len;
    double put_deadline;                /* ... and when it stops waiting */
    struct cache_purge *purge;          /* PURGE waiting for its end ... */
    struct cache *purge_cache;          /* ... in this cache (maybe another tenant's) */
};

/* The cache a session's requests go to: its tenant's (NULL: the tenant has
 * no memory; only observers are served then). */
static inline struct cache *ops_cache(const struct session *s)
{
    return s->tenant ? s->tenant->cache : NULL;
}

static inline double ops_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ops.c */
void ops_fail(struct ops *o, struct conn *conn, const Kvnode__Request *req, int code,
              const char *msg);
void ops_send(struct ops *o, struct conn *conn, const Kvnode__Request *req,
              Kvnode__Response *resp, const int *fds, size_t nfds);
int  ops_check_keys(struct ops *o, const struct session *s, size_t n, char *err, size_t errlen);
/* A request's check words: 0 with *out NULL (none) or checks (one per key);
 * -KVNODE_EINVAL with err naming both counts otherwise. */
int  ops_check_words(size_t nkeys, size_t nchecks, const uint64_t *checks, const uint64_t **out,
                     char *err, size_t errlen);
void ops_dispatch(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);

/* ops_control.c */
void ops_hello(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_stats(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_ping(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_reload(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);

/* ops_data.c */
void ops_match(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
/* present (NULL: a prefix answer): a per-key MATCH's bitmap of n keys. */
void ops_match_reply(struct ops *o, struct conn *conn, const Kvnode__Request *req,
                     const struct cache_tiers *t, const uint8_t *present, size_t n);
void ops_match_remote(struct ops *o, struct conn *conn, struct session *s,
                      const Kvnode__Request *req);
void ops_match_remote_reply(struct ops *o, struct conn *conn, const Kvnode__Request *req,
                            uint32_t matched, const struct kvcm_query_answer *a);
void ops_get_begin(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_get_reply(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req,
                   const struct cache_lent *lent);
void ops_get_end(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_get_inline(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_get_inline_reply(struct ops *o, struct conn *conn, struct session *s,
                          const Kvnode__Request *req, const struct cache_lent *lent);
void ops_put_begin(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_put_end(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_put_inline(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);
void ops_delete(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);

/* ops_purge.c */
void ops_purge(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req);

/* ops_deferred.c */
int  ops_defer(struct ops *o, struct conn *conn, struct session *s,
               const Kvnode__Request *req, size_t n, struct cache_wait *wait);
void ops_pending_ready(void *arg);
void ops_query_answer(void *arg, const struct kvcm_query_answer *a);
bool ops_put_backpressure(struct ops *o, struct conn *conn, struct session *s,
                          const Kvnode__Request *req, char *err, size_t errlen);

#endif
