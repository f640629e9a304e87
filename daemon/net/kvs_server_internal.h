/* kvs_server_internal: what the files of the KVS front end's control plane
 * share (kvs_server.c: the listener, the lease table, /seal /release
 * /discard; kvs_server_acquire.c: /acquire). Private to them. Loop thread
 * only. */
#ifndef KVNODE_KVS_SERVER_INTERNAL_H
#define KVNODE_KVS_SERVER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mem/lease.h"
#include "net/kvs_server.h"
#include "net/kvs_server_leases.h"

struct evhttp_request;
struct evbuffer;
struct httpd;
struct workq;

#define KVS_MAX_NS      64            /* namespaces one slice of a request may touch */
#define KVS_PARSE_QUEUE 64            /* large bodies waiting for the parse thread (more: 503) */

/* Reply buffers of /acquire, kept for the next request instead of freed:
 * a buffer allocated afresh for each reply page-faults its memory in again
 * whenever the heap has grown meanwhile (the index grows with every new
 * key). Its own object, counted: a reply still being sent holds it past
 * kvs_server_destroy. */
struct kvs_reply_pool *kvs_reply_pool_new(void);
void kvs_reply_pool_release(struct kvs_reply_pool *p);

/* One HTTP lease: the kvnode leases it holds (one per namespace and slice
 * of the request that granted it), owned by its own lease_list. */
struct kvs_lease {
    struct kvs_lease_id id;         /* 128 random bits (kvs_server_leases.h) */
    int kind;                       /* LEASE_READ or LEASE_WRITE */
    bool sealed;
    struct tenant *tenant;
    struct lease_list owner;        /* the kvnode leases */
    uint64_t expires_ms;            /* UINT64_MAX while the request that opens it runs */
    uint64_t *sub;                  /* kvnode lease ids (0: none) */
    size_t nsub, capsub;
    struct kvs_lease *hnext, *prev, *next;
};

struct kvs_server {
    struct kvs_server_deps deps;        /* base, config, tenants (kvs_server_create) */
    struct httpd *httpd;                /* the listener, connection cap, request deadline */
    struct event *sweep_ev;
    struct kvs_dataplane *dp;
    struct kvs_lease **buckets;
    size_t nbuckets;
    struct kvs_lease *head, *tail, *cursor;
    struct kvs_leases leases;           /* ids, each tenant's open leases */
    struct kvs_http_conns *conns;       /* each tenant's open HTTP connections */
    struct workq *parse_q;              /* large /acquire bodies parsed off the loop */
    struct kvs_reply_pool *replies;     /* reply buffers kept for the next /acquire */
    int diag_fd;                        /* NETLINK_SOCK_DIAG socket of kvs_identify_tcp, or -1 */
    struct kvs_server_stats st;
};

/* A lease record of t (kvs_leases_room said yes), listed; NULL: out of memory. */
struct kvs_lease *kvs_lease_new(struct kvs_server *k, struct tenant *t, int kind, uint64_t term_ms);
/* End what it still holds and free it. */
void kvs_lease_free(struct kvs_server *k, struct kvs_lease *l);
/* Room for more kvnode lease ids in l->sub: false when out of memory. */
bool kvs_lease_sub_room(struct kvs_lease *l, size_t more);

/* Answer with body (NULL: none; owned). false when the reply was over the
 * output caps and an error went instead. */
bool kvs_reply_text(struct evhttp_request *req, int code, char *text);
/* Answer code with {"error": msg}, counted in the stats. */
void kvs_fail(struct kvs_server *k, struct evhttp_request *req, int code, const char *msg);
/* The HTTP status of a cache error. */
int  kvs_status_of(int rc);

/* POST /acquire of tenant t (kvs_server_acquire.c). */
void kvs_acquire(struct kvs_server *k, struct evhttp_request *req, struct tenant *t);

#endif
