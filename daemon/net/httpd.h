/* httpd: an HTTP server of the daemon on the loop (libevent evhttp) — the
 * admin endpoints and the KVS front end each run one. Owns the evhttp
 * instance, its listener (a TCP address, or a unix socket file it creates
 * and removes) and the bounds every such server needs, which evhttp 2.1
 * does not have:
 *   - a connection cap (more get a 503 and are closed);
 *   - the last descriptors below RLIMIT_NOFILE left to the engine socket;
 *   - each request must arrive whole within a deadline of the connection
 *     or of the previous reply (bytes trickling in do not extend it);
 *   - a listener that cannot accept (EMFILE) rests instead of spinning;
 *   - who opened each connection, established once at accept by the
 *     owner's hook (httpd_set_identify) and kept with it;
 *   - the owner's own count of connections (per tenant), asked at accept
 *     (httpd_set_admit): a connection it refuses gets a 503 and is closed
 *     before it holds a slot;
 *   - the reply bytes not yet taken by the kernel, per connection, per
 *     group of connections (the owner's, e.g. a tenant's, named at admit;
 *     its bound asked of the owner, httpd_set_group_output) and in all
 *     (counted from each connection's output buffer): an owner asks
 *     httpd_reply_room before it writes a large reply. evhttp reads no
 *     new request of a connection until its reply is sent, so a
 *     connection holds at most one reply;
 *   - the bytes of requests being received (read off the socket until the
 *     request is whole: evhttp holds a body in memory until then), per
 *     group (httpd_set_group_input) and in all: a connection whose bytes
 *     take either over its bound is answered 503 and closed.
 * The limits are asked for through a callback at each use, so a reload
 * applies to the next connection or request.
 *
 * The owner sets its request callback, body and header limits on
 * httpd_evhttp() and calls httpd_request_arrived() first in its request
 * callback. A connection's close callback is httpd's (its slot and deadline
 * hang on it): an owner that answers later hears of a close through
 * httpd_request_watch(), never by setting its own. Loop thread only. */
#ifndef KVNODE_HTTPD_H
#define KVNODE_HTTPD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"

struct event_base;
struct evhttp;
struct evbuffer;
struct evhttp_request;
struct httpd;

/* Who opened a connection, established once when it is accepted (the
 * owner's hook, httpd_set_identify) and kept with it for its life, so that
 * nothing the client does later (closing its socket, handing it on) changes
 * who its requests run as. */
struct httpd_peer {
    bool known;                /* uid owns the client's socket */
    uid_t uid;
    char why[192];             /* !known: why the owner could not be established */
};
typedef void (*httpd_identify_fn)(void *arg, int fd, struct httpd_peer *out);

struct httpd_limits {
    uint32_t max_connections;
    uint32_t request_timeout_ms;
    const char *max_connections_option;   /* named in refusals: "admin.max_connections" */
    uint64_t max_output_bytes;            /* one reply (0: no cap) */
    uint64_t max_output_total_bytes;      /* unsent replies of all connections (0: no cap) */
    const char *max_output_option, *max_output_total_option;
    uint64_t max_input_total_bytes;       /* requests being received, all connections (0: no cap) */
    const char *max_input_total_option;
};
typedef void (*httpd_limits_fn)(void *arg, struct httpd_limits *out);

/* Listen on l (CONFIG_LISTEN_TCP or _UNIX; a unix socket file gets mode
 * socket_mode, replaces a stale file but never a live listener). name is how
 * the log and refusals call the server ("admin"); what how listen errors name
 * the option ("admin listen"). 0, or -1 with err set. */
int  httpd_create(struct event_base *base, const char *name, const char *what, const struct config_listen *l,
                  unsigned socket_mode, httpd_limits_fn limits, void *limits_arg, struct httpd **out,
                  char *err, size_t errlen);
struct evhttp *httpd_evhttp(struct httpd *h);
/* "127.0.0.1:PORT" (the real port when 0 was asked), "[::1]:PORT" or "unix:PATH". */
const char *httpd_address(const struct httpd *h);
/* Call fn(arg, fd, &peer) for each connection when it is accepted, before
 * any request on it is read (on the loop: fn must not wait long). */
void httpd_set_identify(struct httpd *h, httpd_identify_fn fn, void *arg);
/* Groups of connections whose unsent reply bytes are counted together
 * (an owner's: a tenant's); HTTPD_NO_GROUP: a connection of none. */
#define HTTPD_MAX_GROUPS 32u
#define HTTPD_NO_GROUP   UINT32_MAX
/* Asked at each accept, after the identify hook: 0 keeps the connection
 * (*token, the owner's, is handed to release when it closes; *group, preset
 * to HTTPD_NO_GROUP, may name its group below HTTPD_MAX_GROUPS), -1 refuses
 * it (503 with why, counted in refused and refused_owner). */
typedef int (*httpd_admit_fn)(void *arg, int fd, const struct httpd_peer *peer, void **token, uint32_t *group,
                              char *why, size_t whylen);
typedef void (*httpd_release_fn)(void *arg, void *token);
void httpd_set_admit(struct httpd *h, httpd_admit_fn admit, httpd_release_fn release, void *arg);
/* The most unsent reply bytes the connections of group may hold together
 * (UINT64_MAX: no bound), asked at each httpd_reply_room of one of them;
 * who says whom they serve in a refusal ("tenant b"). */
typedef uint64_t (*httpd_group_output_fn)(void *arg, uint32_t group, char *who, size_t wholen);
void httpd_set_group_output(struct httpd *h, httpd_group_output_fn fn, void *arg);
/* The same for the bytes of requests being received by the connections of
 * group (asked each time one of them reads while max_input_total_bytes is
 * set); over it, the connection that read is answered 503 and closed. */
void httpd_set_group_input(struct httpd *h, httpd_group_output_fn fn, void *arg);
/* What the hook established for req's connection at accept; NULL without a
 * hook or for a connection httpd does not hold (then nobody is known). */
const struct httpd_peer *httpd_request_peer(struct httpd *h, struct evhttp_request *req);
/* req arrived whole: its connection's deadline stops, and the next request's
 * starts once the reply has been sent. O(1). */
void httpd_request_arrived(struct httpd *h, struct evhttp_request *req);
/* A request its owner answers later (it waits for something). Until the
 * owner calls httpd_request_unwatch (before it answers), gone(arg) is called
 * once if the connection closes first: the client left (seen while the
 * request waits, not only when the answer is written: a client that closes,
 * or half-closes, its end), or the server shuts down. req is then evhttp's
 * to free: the owner must not answer or touch it. The connection's slot and
 * deadline stay httpd's either way. 0, or -1 when req has no open
 * connection of h (then nothing is watched). */
typedef void (*httpd_gone_fn)(void *arg);
int  httpd_request_watch(struct httpd *h, struct evhttp_request *req, httpd_gone_fn gone, void *arg);
void httpd_request_unwatch(struct httpd *h, struct evhttp_request *req);
/* Whether a reply of bytes may be written to req's connection: 0; 413 when
 * it alone is over max_output_bytes, 503 when the unsent replies of all
 * connections would be over max_output_total_bytes, or those of its
 * connection's group over the group's bound (why names the option, and the
 * group's share of it; counted in output_refused, the group's also in
 * output_refused_group). 0 for a request of no connection of ours.
 * Small answers (errors) need not ask. */
int  httpd_reply_room(struct evhttp_request *req, size_t bytes, char *why, size_t whylen);
/* evhttp_send_reply, and the reply written to the socket now (as much as
 * the kernel takes) instead of from the write event of the next loop turn:
 * the client has its answer one turn and three system calls sooner. What
 * the kernel does not take is written as before. body as evhttp's (NULL: no
 * body). req must not be used after the call. */
void httpd_send_reply(struct evhttp_request *req, int code, const char *reason, struct evbuffer *body);
/* Close the listener (no new connections); open ones stay. NULL ignored. */
void httpd_begin_shutdown(struct httpd *h);
bool httpd_stopping(const struct httpd *h);
/* Close everything, remove the unix socket file. NULL ignored. */
void httpd_destroy(struct httpd *h);

struct httpd_stats {
    uint64_t open, max, accepted;
    uint64_t refused;          /* with 503: limit or descriptor reserve */
    uint64_t refused_reserve;  /* of them: the last descriptors are kept for engines */
    uint64_t refused_owner;    /* of them: the owner's admit hook (a tenant at its share) */
    uint64_t timed_out;        /* the request deadline passed */
    uint64_t accept_pauses;    /* the listener rested (out of descriptors) */
    uint64_t output_bytes;     /* reply bytes the kernel has not taken yet, all connections */
    uint64_t output_max;       /* max_output_total_bytes now */
    uint64_t output_refused;   /* replies refused by httpd_reply_room */
    uint64_t output_refused_group; /* of them: at their group's bound (a tenant's share) */
    uint64_t input_bytes;      /* bytes of requests being received (read, not yet whole), all connections */
    uint64_t input_max;        /* max_input_total_bytes now */
    uint64_t input_refused;    /* connections answered 503 and closed: over it */
    uint64_t input_refused_group; /* of them: over their group's bound (a tenant's share) */
    uint64_t replies_inline;   /* replies written whole in the turn they were made (httpd_send_reply) */
    uint64_t reads_extended;   /* reads that took more than libevent's 4096 bytes in one turn */
    uint64_t reads_early;      /* requests read in the turn their connection was accepted */
};
void httpd_get_stats(const struct httpd *h, struct httpd_stats *out);

#endif
