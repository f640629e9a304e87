/* server: the socket side of the loop thread. Owns the unix listener (stale
 * socket replacement, live-daemon detection via a lock file), connections,
 * frame I/O with length checks before allocation, SCM_RIGHTS fd passing,
 * and the orderly stop. Decoded requests go to the handler (ops).
 *
 * What one client can hold is bounded: frames longer than 64 KiB are read
 * only with room for all of them under server.max_buffered_input_bytes
 * (daemon-wide, first come first served), a frame that stops arriving is
 * dropped after server.frame_timeout, and a client's requests are not
 * handled while its unsent replies pass 64 MiB. The unsent replies of all
 * connections are bounded by server.max_buffered_output_bytes and those of
 * a tenant's connections by its share of it (struct tenant's
 * max_output_bytes): while they are past the bound, a connection with
 * unread replies of its own is closed at its next request, and one without
 * is refused GET_INLINE (KVNODE_ELIMIT). A connection that has not completed HELLO
 * within server.hello_timeout of accept is closed. A listener whose accept
 * fails (out of descriptors) rests 100 ms at a time instead of spinning.
 *
 * Loop thread only. */
#ifndef KVNODE_SERVER_H
#define KVNODE_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"
#include "kvnode.pb-c.h"

struct event_base;
struct server;
struct conn;
struct session;

/* Who handles what the server decodes (ops; main wires it, so that the
 * server does not call up into ops): a connection that passed the allow
 * lists (admit: its session's pid, uid and gid are set, and groups holds the
 * peer's ngroups supplementary groups (SO_PEERGROUPS), sorted ascending, the
 * ones the allow lists were checked against, valid during the call; 0
 * serves it and session_end follows it one day, a negative KVNODE_E* code
 * refuses it with msg as its one error frame; NULL: every one is served),
 * each request of a connection, in order, and the end of a connection (its
 * session is then dropped). */
struct server_handler {
    int  (*admit)(void *arg, struct session *s, const gid_t *groups, size_t ngroups, char *msg, size_t msglen);
    void (*request)(void *arg, struct conn *c, struct session *s, const Kvnode__Request *req);
    void (*session_end)(void *arg, struct session *s);
    void *arg;
};

/* Bind the configured socket (refusing when another daemon serves it) and
 * start accepting; or, when listen_fd >= 0 (socket activation), accept on
 * that already bound and listening unix socket, which the server then owns
 * (but never unlinks: systemd does). 0, or a negative KVNODE_E* code with
 * err set. */
int  server_create(struct event_base *base, const struct kvn_config *cfg,
                   const struct server_handler *handler, int listen_fd, struct server **out,
                   char *err, size_t errlen);
/* Closes every connection (ending their leases) and removes the socket. */
void server_destroy(struct server *s);
/* Point at a new effective config (reload). */
void server_apply_config(struct server *s, const struct kvn_config *cfg);

/* Stop accepting, stop reading, flush replies. A connection lent HBM
 * (session.hbm_lent) is sent an unsolicited Response{id 0, going_away}
 * after its replies and is then read until it closes, its requests refused
 * with KVNODE_ESHUTDOWN, for at most cfg->hbm_release_timeout_ms (0: closed
 * like the others); the others are closed once their replies are written, or
 * after cfg->shutdown_timeout_ms. The loop breaks when every connection is
 * gone: within the longer of the two. */
void server_begin_shutdown(struct server *s);

/* Queue a response; fds (may be NULL) ride on its first byte. 0 or a
 * negative KVNODE_E* code (the connection is then closed). */
int  server_reply(struct conn *c, const Kvnode__Response *resp, const int *fds, size_t nfds);
/* Send an error response with `code` (negative KVNODE_E*) and a message. */
void server_reply_error(struct conn *c, uint64_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The request being handled answers later (ops deferred it): read and
 * handle nothing more from this connection until server_resume(), so replies
 * keep the order of the requests. */
void server_defer(struct conn *c);
/* The deferred answer is queued: go on with the connection's next requests
 * (from the loop, after the caller returns). */
void server_resume(struct conn *c);
/* Close the connection once its queued replies are written. */
void server_close_after_flush(struct conn *c);
struct session *server_conn_session(struct conn *c);
/* The supplementary groups of the unix-socket peer fd (SO_PEERGROUPS), sorted
 * ascending: into buf (cap entries), or when it has more into *heap (the
 * caller frees it); *n = 0 when the kernel cannot say. The engine socket and
 * the KVS data plane place peers by these. */
const gid_t *server_peer_groups(int fd, gid_t *buf, size_t cap, gid_t **heap, size_t *n);

/* The server's counters: "clients" and "frames" of the stats document. */
struct server_stats {
    uint64_t connected, accepted, refused, denied;  /* denied: by access control (of refused) */
    uint64_t accept_pauses;                         /* the listener rested (out of descriptors) */
    uint64_t input_buffered_bytes, input_reserved_bytes, input_waiting, input_waits;
    uint64_t output_buffered_bytes, input_paused;
    uint64_t frames_rejected, frames_timed_out;
    uint64_t hello_timeouts;                        /* closed without HELLO at server.hello_timeout */
    uint64_t output_limit_closed, output_limit_refused; /* at server.max_buffered_output_bytes (or a
                                                       tenant's share): connections closed, requests refused */
    uint64_t hbm_lent;                              /* connections lent HBM now */
    uint64_t going_away;                            /* GoingAway notices sent (the stop) */
    uint64_t hbm_released, hbm_held;                /* the stop: connections lent HBM that closed
                                                       themselves / that the daemon closed (they may
                                                       still map HBM when it is freed) */
};
void server_get_stats(const struct server *s, struct server_stats *out);
const char *server_socket_path(const struct server *s);

#endif
