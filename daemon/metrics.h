/* metrics: the Prometheus text exposition (format 0.0.4) of the daemon's
 * counters. The counters live with the module that counts them (their
 * types in counters.h); metrics_render() reads one typed snapshot of them
 * all (stats.h), plus the worker registry, into one text page. Rendering
 * walks O(namespaces + ops + workers) in-memory values and never blocks.
 *
 * Loop thread only. */
#ifndef KVNODE_METRICS_H
#define KVNODE_METRICS_H

struct daemon;
struct evbuffer;

/* "ok" for 0, else the lowercase code name ("enolease", "einval", ...);
 * "eunknown" for a code this build does not know. code: 0 or negative. */
const char *metrics_status_name(int code);

/* Append `text` to out with the label-value escapes of the text format:
 * backslash, double quote and newline. */
void metrics_escape_label(struct evbuffer *out, const char *text);

/* The whole /metrics page. 0, or -1 when out of memory. */
int metrics_render(struct daemon *d, struct evbuffer *out);

#endif
