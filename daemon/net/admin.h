/* admin: the admin HTTP endpoints (libevent evhttp on the loop thread) on
 * the [admin] listen address: a TCP address (port 0: ephemeral) or a unix
 * socket. GET (or HEAD) of
 *   /metrics  Prometheus text format 0.0.4 (metrics_render, see admin_set_pages)
 *   /healthz  200 "ok" while the process runs
 *   /readyz   200 "ready" while serving (not shutting down) and every worker
 *             is alive (liveness_check); 503 with the reason otherwise
 *   /stats    the STATS document as JSON (stats_document, see admin_set_pages)
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
 * Owns the evhttp instance, its listener and (unix) the socket file.
 * Loop thread only. */
#ifndef KVNODE_ADMIN_H
#define KVNODE_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct daemon;
struct admin;
struct evbuffer;

/* Listen on d->cfg->admin_listen. *out = NULL when it is "off". 0, or -1 with
 * err set (address in use, bad host, socket path taken by a live listener). */
int  admin_create(struct daemon *d, struct admin **out, char *err, size_t errlen);
/* Shutdown began: close the listener (no new admin connections); requests
 * on open connections get /readyz 503. NULL is ignored. */
void admin_begin_shutdown(struct admin *a);
/* Close everything, remove the unix socket file. NULL is ignored. */
void admin_destroy(struct admin *a);
/* The bound address: "127.0.0.1:PORT" (the real port when 0 was asked),
 * "[::1]:PORT" or "unix:PATH". */
const char *admin_address(const struct admin *a);
/* What /stats and /metrics serve. The renderers (stats.c, metrics.c) read
 * admin's own counters, so main hands them in here instead of admin
 * including them. NULL a is ignored; until set, both pages answer 500. */
struct admin_pages {
    json_t *(*stats_document)(struct daemon *d);                /* new reference; NULL: no memory */
    int     (*metrics_page)(struct daemon *d, struct evbuffer *out); /* 0, or -1: no memory */
};
void admin_set_pages(struct admin *a, const struct admin_pages *pages);

/* The admin connections: "admin_connections" of the stats document. */
struct admin_stats {
    uint64_t open, max, accepted;
    uint64_t refused;          /* with 503: limit or descriptor reserve */
    uint64_t refused_reserve;  /* of them: the last descriptors are kept for engines */
    uint64_t timed_out;        /* admin.request_timeout */
    uint64_t accept_pauses;    /* the listener rested (out of descriptors) */
};
void admin_get_stats(const struct admin *a, struct admin_stats *out);

#endif
