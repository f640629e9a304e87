/* counters: see counters.h. */
#include "core/counters.h"

const double metrics_latency_bounds[METRICS_LATENCY_NBOUNDS] = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
};

void metrics_histogram_observe(struct metrics_histogram *h, double seconds)
{
    unsigned i = 0;
    if (!(seconds >= 0.0))
        seconds = 0.0;
    while (i < METRICS_LATENCY_NBOUNDS && seconds > metrics_latency_bounds[i])
        i++;
    h->buckets[i]++;
    h->count++;
    h->sum += seconds;
}

void metrics_request_observe(struct metrics_requests *r, int op, int code, double seconds)
{
    int status = code < 0 ? -code : 0;
    if (op < 0 || op >= METRICS_OP_SLOTS)
        op = 0;
    if (status >= METRICS_STATUS_SLOTS)
        status = METRICS_STATUS_SLOTS - 1;
    r->count[op][status]++;
    metrics_histogram_observe(&r->latency[op], seconds);
}
