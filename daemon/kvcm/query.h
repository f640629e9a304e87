/* kvcm/query: "who else holds this prefix" — KVCM's getHostCacheState
 * asked on behalf of engines (MATCH_REMOTE), without ever failing or
 * stalling them (docs/PROTOCOLS.md §2, getHostCacheState).
 *
 * Queries run on one worker thread ("kvcm-query", its own kvcm_client, so
 * leader lookups are single-flight). One deadline per request covers the
 * queue wait, leader lookup and the query; the loop answers at the deadline
 * whatever the worker is doing. A failure is remembered for negative_ttl,
 * doubling with each failure in a row up to breaker_open (requests meanwhile
 * get the local answer at once), and after
 * breaker_failures failures in a row the breaker opens for breaker_open: no
 * call is made until then, and one trial call closes it again. Every
 * failure yields the local answer flagged with why, never an error.
 *
 * Loop thread only. */
#ifndef KVNODE_KVCM_QUERY_H
#define KVNODE_KVCM_QUERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kvcm/kvcm_client.h"
#include "mem/namespace.h"

struct event_base;
struct kvcm_querier;
struct kvcm_query;

#define KVCM_QUERY_MAX_HOSTS 64

struct kvcm_query_settings {
    const char *const *endpoints;
    size_t   n_endpoints;
    const char *host_ip_port;           /* this node: left out of the answers */
    const char *instance_id_template;
    uint32_t connect_timeout_ms;
    uint32_t deadline_ms;               /* per request */
    uint32_t max_hosts;                 /* default and cap of peers per answer */
    uint32_t breaker_failures, breaker_open_ms, negative_ttl_ms;
    uint64_t epoch;                     /* for trace ids */
};

struct kvcm_query_answer {
    bool   ok;                          /* the peers were asked and answered */
    char   why[192];                    /* when !ok */
    size_t n;
    struct kvcm_host_match hosts[KVCM_QUERY_MAX_HOSTS];   /* best first, this node excluded */
};

typedef void (*kvcm_answer_fn)(void *arg, const struct kvcm_query_answer *a);

int  kvcm_querier_create(struct event_base *base, const struct kvcm_query_settings *st,
                         struct kvcm_querier **out, char *err, size_t errlen);
void kvcm_querier_destroy(struct kvcm_querier *q);

/* Ask who holds keys[0..n) of ns's deployment. Returns 0 with *out set:
 * fn(arg, answer) runs later on the loop (never from inside this call), at
 * the latest at the deadline; or 1: answered at once into *now (breaker
 * open, a recent failure, queue full), *out NULL and fn not called. */
int  kvcm_query_start(struct kvcm_querier *q, const struct kv_namespace *ns, const int64_t *keys,
                      size_t n, uint32_t max_hosts, kvcm_answer_fn fn, void *arg,
                      struct kvcm_query_answer *now, struct kvcm_query **out);
/* The requester went away: fn will not be called. */
void kvcm_query_cancel(struct kvcm_querier *q, struct kvcm_query *qq);

/* "kvcm"."query" of the stats document. last_error belongs to q. */
struct kvcm_query_stats {
    uint64_t asked, ok, failed, deadline, local_only, breaker_opened;
    bool breaker_open;
    const char *last_error;
};
void kvcm_querier_get_stats(const struct kvcm_querier *q, struct kvcm_query_stats *out);

#endif
