/* metrics: counters and histograms, and their Prometheus text exposition
 * (format 0.0.4). The counters live with the module that counts them (ops:
 * requests by op and status with latency histograms; cache: matched and
 * missed keys by reason; server and cache: the counters of the stats
 * document); metrics_render() reads them all, plus the daemon's reload
 * counters and the worker registry, into one text page. Rendering walks
 * O(namespaces + ops + workers) in-memory values and never blocks.
 *
 * Loop thread only. */
#ifndef KVNODE_METRICS_H
#define KVNODE_METRICS_H

#include <stdint.h>

struct daemon;
struct evbuffer;

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
};

/* "ok" for 0, else the lowercase code name ("enolease", "einval", ...);
 * "eunknown" for a code this build does not know. code: 0 or negative. */
const char *metrics_status_name(int code);

/* Append `text` to out with the label-value escapes of the text format:
 * backslash, double quote and newline. */
void metrics_escape_label(struct evbuffer *out, const char *text);

/* The whole /metrics page. 0, or -1 when out of memory. */
int metrics_render(struct daemon *d, struct evbuffer *out);

#endif
