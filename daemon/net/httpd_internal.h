/* httpd_internal: what httpd.c (connections, listeners) and httpd_io.c
 * (request and reply bytes) share of an httpd server: its state and each
 * connection's. Nothing outside those two includes it. */
#ifndef KVNODE_HTTPD_INTERNAL_H
#define KVNODE_HTTPD_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/un.h>

#include <event2/util.h>

#include "core/log.h"
#include "net/httpd.h"

struct bufferevent;
struct event;
struct evbuffer_cb_entry;
struct evbuffer_cb_info;
struct evhttp_connection;

/* accept failing (out of descriptors): the listener rests this long. */
#define HTTPD_ACCEPT_PAUSE_MS 100u
/* Descriptors connections leave to the engine socket: a connection whose
 * descriptor is within this many of RLIMIT_NOFILE is refused (a quarter of
 * the limit when that is smaller). */
#define HTTPD_FD_RESERVE     64u
#define HTTPD_LOG_REPEAT_MS  10000u
#define HTTPD_BUCKETS        1024u    /* connection lookup by evhttp_connection */
#define HTTPD_MAX_SERVERS    8
/* Once this many reply bytes were held and all are gone, free memory is
 * handed back to the kernel (malloc_trim), at most once per interval. */
#define HTTPD_TRIM_BYTES     (4u << 20)
#define HTTPD_TRIM_MS        1000u
/* Bytes of a reply written per loop turn (libevent's default is 16 KiB). */
#define HTTPD_MAX_SINGLE_WRITE (256u << 10)
/* RLIMIT_NOFILE is read again at most this often (one system call less per
 * accepted connection). */
#define HTTPD_RLIMIT_MS      1000u

/* One connection, from the moment evhttp accepted it. evhttp 2.1 has no
 * connection limit and no hook on accept, so: evhttp asks us for each new
 * connection's bufferevent (evhttp_set_bevcb), we queue it as fresh and,
 * from the loop right after evhttp's accept callback returns, count the
 * connection or refuse it (httpd_adopt). The bufferevent's callback
 * argument is its evhttp_connection. */
struct httpd_conn {
    struct httpd *h;
    struct bufferevent *bev;          /* fresh: our reference, until adopted */
    struct evhttp_connection *evcon;  /* adopted */
    struct event *deadline;           /* for the request being received */
    struct httpd_conn *next;          /* fresh queue, then its bucket's chain */
    struct httpd_peer peer;           /* from the identify hook, at accept */
    bool admitted;                    /* by the admit hook: release token at close */
    void *token;
    struct evbuffer_cb_entry *output_cb; /* counts the output buffer's bytes */
    struct evbuffer_cb_entry *input_cb;  /* counts the bytes read of the request being received */
    uint64_t input;                   /* bytes read since its request began */
    bool input_over;                  /* over the input bound: the deadline event answers 503, closes */
    bool reading_ourselves;           /* in httpd_read_more or httpd_read_early: no read-more behind their reads */
    char input_why[384];
    uint64_t output;                  /* bytes in it */
    uint32_t group;                   /* the admit hook's, or HTTPD_NO_GROUP */
    /* httpd_request_watch: the owner of a request that waits is told once if
     * the connection closes first; leave_ev sees the client leave. */
    struct evhttp_request *watched;
    httpd_gone_fn gone;
    void *gone_arg;
    struct event *leave_ev;
};

struct httpd {
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;   /* NULL once shutdown began */
    bool stopping;
    bool unix_owned;                     /* we created path: unlink it */
    char name[32];
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char address[CONFIG_LISTEN_MAX + 16];
    httpd_limits_fn limits;
    void *limits_arg;
    httpd_identify_fn identify;          /* NULL: connections are not identified */
    void *identify_arg;
    httpd_admit_fn admit;                /* NULL: only the total is counted */
    httpd_release_fn release;
    void *admit_arg;
    httpd_group_output_fn group_output;  /* NULL: groups are not bounded */
    void *group_output_arg;
    struct httpd_conn *fresh, *fresh_tail; /* accepted by evhttp, not yet adopted, oldest first */
    struct event *adopt_ev;
    struct httpd_conn *buckets[HTTPD_BUCKETS]; /* adopted and open, by evcon */
    size_t nconns;
    struct event *accept_resume_ev;      /* the paused listener tries again */
    struct event *trim_ev;               /* malloc_trim after replies were freed */
    uint64_t accept_pauses_episode;      /* pauses since accepting last worked */
    struct log_limit accept_log, refuse_log;
    uint64_t accepted, refused, refused_reserve, refused_owner, timed_out, accept_pauses;
    uint64_t output_bytes, output_peak, output_refused;   /* peak: since the last trim */
    uint64_t group_bytes[HTTPD_MAX_GROUPS];               /* output_bytes of each group's connections */
    uint64_t output_refused_group;
    httpd_group_output_fn group_input;   /* NULL: groups' input is not bounded */
    void *group_input_arg;
    uint64_t input_bytes, input_refused, input_refused_group;
    uint64_t replies_inline, reads_extended, reads_early;
    uint64_t input_group[HTTPD_MAX_GROUPS];               /* input_bytes of each group's connections */
    uint64_t trimmed_ms;
    struct rlimit nofile;                /* RLIMIT_NOFILE as of nofile_ms */
    uint64_t nofile_ms;
};

/* The servers, by their evhttp (libevent calls a listener's error callback
 * with the evhttp as argument, not with ours). */
extern struct httpd *httpd_servers[HTTPD_MAX_SERVERS];

struct httpd_limits httpd_limits_now(const struct httpd *h);
/* hc of evcon in h, or NULL. */
struct httpd_conn *httpd_conn_find(struct httpd *h, const struct evhttp_connection *evcon);
/* Answer 503 on the raw socket (best effort). */
void httpd_send_503(int fd, const char *why);
/* c less n, never below 0. */
void httpd_sub(uint64_t *c, uint64_t n);

/* httpd_io.c: the evbuffer callbacks on each adopted connection's input
 * and output buffers (arg: its httpd_conn), and what a closing connection
 * or a whole request gives back. */
void httpd_input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg);
void httpd_output_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg);
void httpd_input_forget(struct httpd_conn *hc);
void httpd_output_forget(struct httpd_conn *hc);
void httpd_trim_cb(evutil_socket_t fd, short what, void *arg);
/* hc was just adopted, in the turn it was accepted: what its client has
 * sent already (a client sends its request right after connecting) is read
 * now and evhttp's read callback run, deferred, in this turn, instead of
 * waiting for epoll to report bytes that are there: one epoll_wait and one
 * FIONREAD less per connection. Nothing there (EAGAIN), EOF or an error:
 * left to libevent's read as before. */
void httpd_read_early(struct httpd_conn *hc);

#endif
