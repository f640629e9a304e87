/* counters: the counter types that modules keep for the stats and /metrics
 * (request counts by op and status with latency histograms, keys matched
 * and missed by reason). The module that counts owns the values; the
 * renderers (stats.c, metrics.c) only read them. Kept apart from metrics.h
 * so that counting modules (ops, cache) need not include the renderer.
 *
 * Loop thread only. */
#ifndef KVNODE_COUNTERS_H
#define KVNODE_COUNTERS_H

#include <stdint.h>

/* Request latency buckets, in seconds: 10us .. 1s (+Inf is implicit). */
#define METRICS_LATENCY_NBOUNDS 16
extern const double metrics_latency_bounds[METRICS_LATENCY_NBOUNDS];

struct metrics_histogram {
    uint64_t buckets[METRICS_LATENCY_NBOUNDS + 1];  /* per bucket (not cumulative); last: +Inf */
    uint64_t count;
    double   sum;
};

void metrics_histogram_observe(struct metrics_histogram *h, double seconds);

/* Requests by op (the request oneof field number) and status (0: ok, else
 * the KVNODE_E* code, positive), with one latency histogram per op. */
#define METRICS_OP_SLOTS     32
#define METRICS_STATUS_SLOTS 32
struct metrics_requests {
    uint64_t count[METRICS_OP_SLOTS][METRICS_STATUS_SLOTS];
    struct metrics_histogram latency[METRICS_OP_SLOTS];
};

/* code: 0 or a negative KVNODE_E* code. Out-of-range ops/codes land in slot 0. */
void metrics_request_observe(struct metrics_requests *r, int op, int code, double seconds);

/* Keys looked up by match and get: matched, or missed with the reason. */
struct metrics_keys {
    uint64_t matched;
    uint64_t absent;       /* no entry for the key */
    uint64_t writing;      /* reserved by a writer, not committed yet */
    uint64_t unavailable;  /* only in the store and not brought back (no room, store
                              failed or too slow, or no longer there) */
    uint64_t beyond_gap;   /* after the first miss of the chain: not looked at */
    /* Lookups (match, get, put, delete, and the store's) that found the key
     * held under another check word: a miss for that request (also counted
     * as absent above when it ended a match or get). */
    uint64_t check_mismatches;
};

#endif
