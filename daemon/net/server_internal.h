/* server_internal: what the pieces of the server share — struct server,
 * struct conn, the server's bounds, and the functions one piece calls in the
 * other. Private to daemon/net/server*.c; everything else goes through
 * server.h.
 *
 *   server.c       the listener (socket path, lock file, socket activation),
 *                  admission (max_clients, peer credentials against the allow
 *                  lists, the handler's per-tenant limit), accept and its
 *                  pause when out of descriptors, create/destroy, reload,
 *                  the orderly stop, the counters
 *   server_conn.c  one connection: buffered bytes, room for big frames
 *                  (server.max_buffered_input_bytes), reading on and off,
 *                  server.frame_timeout, server.hello_timeout, output
 *                  back-pressure and the bound on unread replies per tenant
 *                  and node (server.max_buffered_output_bytes), writing with
 *                  SCM_RIGHTS, replies, deferred answers, decoding frames
 *                  into requests for the handler, its end
 *
 * Loop thread only. */
#ifndef KVNODE_SERVER_INTERNAL_H
#define KVNODE_SERVER_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include <event2/event.h>

#include "core/log.h"
#include "net/server.h"
#include "net/session.h"

#define READ_CHUNK (1u << 20)
#define MAX_PASSED_FDS 8u
/* Stop handling a client's requests while its unsent replies pass this, and
 * go on once they drop to the low mark (a gap, so a slow reader does not
 * flip it at every reply). */
#define OUTPUT_HIGH_WATER (64u << 20)
#define OUTPUT_LOW_WATER  (32u << 20)
/* A connection may buffer this much input without room from
 * server.max_buffered_input_bytes: requests up to this size (all but inline
 * puts of big blocks) never wait for room. */
#define INPUT_UNRESERVED  (64u << 10)
/* accept failing (out of descriptors): the listener rests this long. */
#define ACCEPT_PAUSE_MS 100u
/* A recurring warning is written at most once per this. */
#define LOG_REPEAT_MS 10000u

struct tenant;

struct conn {
    struct server *srv;
    struct tenant *tenant;   /* the session's, kept past session_end: its unread replies are counted */
    int fd;
    struct event *rev, *wev;
    struct evbuffer *in, *out;
    bool closing;            /* close once `out` drains */
    bool reading;
    bool deferred;           /* a request answers later: handle nothing more until then */
    bool output_full;        /* unsent replies passed OUTPUT_HIGH_WATER: handle nothing more
                                until they drop to OUTPUT_LOW_WATER */
    bool input_waiting;      /* on the server's queue for room for its frame */
    bool hbm_counted;        /* session.hbm_lent, counted in the server's hbm_lent */
    bool going_away;         /* told GoingAway at the stop: read until it closes, refuse its requests */
    bool peer_closed;        /* the end came from the client (EOF or error), not from the daemon */
    struct event *resume_ev; /* handles the input that waited behind a deferred request */
    struct event *frame_ev;  /* server.frame_timeout: a frame in progress stopped arriving */
    struct event *hello_ev;  /* server.hello_timeout from accept; freed once HELLO succeeded */
    size_t in_counted, out_counted; /* lengths of `in` / `out` in the server's totals */
    uint64_t room;           /* bytes of server.max_buffered_input_bytes held for the frame
                                being received (0: none, it fits in INPUT_UNRESERVED) */
    uint64_t room_wanted;    /* input_waiting: what it asks for */
    struct conn *wait_prev, *wait_next; /* input_waiting: the queue */
    uint64_t bytes_sent;     /* stream offset of the next byte to send */
    /* fds to attach to the byte at stream offset fds_at (one batch at a time;
     * HELLO is the only reply that carries fds) */
    int fds[MAX_PASSED_FDS];
    size_t nfds;
    uint64_t fds_at;
    struct session session;
    struct conn *prev, *next;
};

struct server {
    struct event_base *base;
    const struct kvn_config *cfg;
    struct server_handler handler;
    struct evconnlistener *listener;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lock_fd;
    char lock_path[PATH_MAX];
    bool inherited;          /* socket-activated: not ours to unlink */
    struct conn *conns;
    size_t nconns;
    bool stopping;
    struct event *stop_timer;      /* server.shutdown_timeout: the connections not lent HBM */
    struct event *release_timer;   /* hbm.release_timeout: the connections lent HBM */
    size_t hbm_lent;               /* connections lent HBM (going away ones included) */
    size_t going_away_open;        /* told GoingAway, not closed yet */
    /* what every connection buffers, and room held for frames being received */
    uint64_t in_bytes, out_bytes, in_room;
    struct conn *wait_head, *wait_tail;   /* frames waiting for room, first come first served */
    size_t nwaiting;
    /* accept failed (out of descriptors): the listener rests, then retries */
    struct event *accept_resume_ev;
    uint64_t accept_pauses_episode;       /* pauses since accepting last worked */
    struct log_limit accept_log, refuse_log, timeout_log, hello_log, output_log;
    /* counters */
    uint64_t accepted, refused, frames_rejected, denied;
    uint64_t accept_pauses, input_waits, input_paused, frames_timed_out;
    uint64_t hello_timeouts, output_limit_closed, output_limit_refused;
    uint64_t going_away_sent, hbm_released, hbm_held;
    /* access lists resolved from cfg (empty: anyone who can open the socket) */
    struct config_idlist allow_uids, allow_gids;
};

/* server_conn.c */
void conn_read_cb(evutil_socket_t fd, short what, void *arg);
void conn_write_cb(evutil_socket_t fd, short what, void *arg);
void conn_frame_timeout_cb(evutil_socket_t fd, short what, void *arg);
void conn_hello_timeout_cb(evutil_socket_t fd, short what, void *arg);
void conn_destroy(struct conn *c);

/* server.c */
/* Break the loop once a stopping server has no connection left. */
void server_maybe_finish_stop(struct server *s);
/* c ends (conn_destroy): its part in the counts of clients lent HBM. */
void server_conn_ends(struct server *s, struct conn *c);

#endif
