/* admin: the admin HTTP endpoints (libevent evhttp on the loop thread) on
 * the [admin] listen address: a TCP address (port 0: ephemeral) or a unix
 * socket. GET (or HEAD) of
 *   /metrics  Prometheus text format 0.0.4 (admin_deps.metrics_page)
 *   /healthz  200 "ok" while the process runs
 *   /readyz   200 "ready" while serving (not shutting down) and every worker
 *             is alive (liveness_check), with admin_deps.ready_notes' notes;
 *             503 with the reason otherwise
 *   /stats    the STATS document as JSON (admin_deps.stats_document)
 *   /config   the effective configuration (config_write), text/plain
 * Anything else is 404, another method 405. Every answer is built from
 * memory on the loop thread; nothing blocks.
 *
 * Connections are capped (admin.max_connections; more get a 503 and are
 * closed), each request must arrive whole within admin.request_timeout of
 * the connection or the previous reply (bytes trickling in do not extend
 * it), the last descriptors below RLIMIT_NOFILE are left to the engine
 * socket, and a listener that cannot accept (EMFILE) rests instead of
 * spinning.
 *
 * Owns the evhttp instance, its listener and (unix) the socket file. It
 * knows nothing of the modules whose state it shows: main hands the pages in
 * (struct admin_deps), and the stats document reads admin's own counters
 * through admin_get_stats, so the dependency points one way.
 * Loop thread only. */
#ifndef KVNODE_ADMIN_H
#define KVNODE_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct admin;
struct evbuffer;
struct event_base;
struct kvn_config;

/* What admin serves, given at creation by whoever wires the process. */
struct admin_deps {
    struct event_base *base;
    /* The effective configuration, read at each use (a reload swaps *cfg):
     * [admin] limits, server.worker_stall_timeout, the /config text. */
    struct kvn_config *const *cfg;
    void *ctx;                                          /* passed back to the calls below */
    /* /readyz once serving with every worker alive: append "; ..." notes on
     * what is degraded (the node stays ready) to msg, of which used bytes
     * are taken (cap in all); the new length (>= cap: full). */
    size_t  (*ready_notes)(void *ctx, char *msg, size_t used, size_t cap);
    json_t *(*stats_document)(void *ctx);               /* /stats: new reference; NULL: no memory */
    int     (*metrics_page)(void *ctx, struct evbuffer *out); /* /metrics: 0, or -1: no memory */
};

/* Listen on (*deps->cfg)->admin_listen. *out = NULL when it is "off". 0, or
 * -1 with err set (address in use, bad host, socket path taken by a live
 * listener). */
int  admin_create(const struct admin_deps *deps, struct admin **out, char *err, size_t errlen);
/* Shutdown began: close the listener (no new admin connections); requests
 * on open connections get /readyz 503. NULL is ignored. */
void admin_begin_shutdown(struct admin *a);
/* Close everything, remove the unix socket file. NULL is ignored. */
void admin_destroy(struct admin *a);
/* admin's typed snapshot: its address ("admin" of the stats document) and
 * its connections ("admin_connections"). The address belongs to a. */
struct admin_stats {
    const char *address;       /* "127.0.0.1:PORT" (the real port when 0 was asked), "[::1]:PORT", "unix:PATH" */
    uint64_t open, max, accepted;
    uint64_t refused;          /* with 503: limit or descriptor reserve */
    uint64_t refused_reserve;  /* of them: the last descriptors are kept for engines */
    uint64_t timed_out;        /* admin.request_timeout */
    uint64_t accept_pauses;    /* the listener rested (out of descriptors) */
};
void admin_get_stats(const struct admin *a, struct admin_stats *out);

#endif
