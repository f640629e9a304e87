/* kvs/v6d internals: what the pieces of the v6d backend share — a store
 * handle and the functions one piece calls in another. Private to
 * daemon/persist/kvs/v6d*.c (built with V6D=1 only); everybody else goes
 * through v6d.h and kvs.h.
 *
 *   v6d.c         the backend: open, close, health, put / get / exists in
 *                 batches, del, scan
 *   v6d_keys.c    rtp-llm's object keys and string hash
 *   v6d_reply.c   parsing the store's JSON replies
 *   v6d_http.c    the control plane: HTTP calls, leases, acquire
 *   v6d_socket.c  the data plane: unix-socket handshake, arena mapping
 *
 * A handle belongs to one worker thread at a time. */
#ifndef KVNODE_KVS_V6D_INTERNAL_H
#define KVNODE_KVS_V6D_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "persist/kvs/kvs.h"
#include "persist/kvs/v6d.h"

#define LEASE_MAX   256          /* longest lease_id we keep */
#define SNIPPET     160          /* body bytes quoted in error messages */

struct kvs_store {
    CURL *curl;
    struct curl_slist *hdrs;
    char *base_url;              /* without trailing '/' */
    char *sock_path;
    char object_ns[V6D_STORE_NS_MAX];    /* first part of every object key (the tenant's) */
    uint32_t connect_timeout_ms, timeout_ms;
    char *body;                  /* last reply body (NUL-terminated), V6D_MAX_HTTP_BODY cap */
    size_t body_len, body_cap;
    bool body_overflow;
    int dp_fd;                   /* data-plane socket; -1 when down */
    uint8_t *map;                /* arena mapping [0, map_size); NULL when down */
    size_t map_size;
    unsigned id;                 /* handle number (request ids) */
    uint64_t counter;
};

/* ---- reply parsing (v6d_reply.c) ---------------------------------------------- */

/* A non-negative integral JSON number that fits uint64 exactly. */
bool v6d_get_u64(json_t *v, uint64_t *out);
/* body as JSON (integers too large for jansson as reals), or NULL with err set. */
json_t *v6d_parse_doc(const char *body, size_t len, char *err, size_t errlen);
/* An acquire reply (v6d_parse_acquire_reply); create: a create reply, where a
 * null entry or an invalid handle fails the whole store. */
int v6d_parse_acquire(const char *body, size_t len, const char *const *keys, size_t n,
                      char *lease_id, size_t lease_cap, struct v6d_obj *objs, bool create,
                      char *err, size_t errlen);

/* ---- control plane (v6d_http.c) ----------------------------------------------- */

/* libcurl's write callback: appends to s->body up to V6D_MAX_HTTP_BODY. */
size_t v6d_body_sink(char *p, size_t size, size_t nmemb, void *arg);
/* A call that must answer `want` (GET when json is NULL, else POST json). */
int v6d_http_expect(struct kvs_store *s, const char *name, const char *json, long want,
                    char *err, size_t errlen);
/* seal / release / discard of a lease: 204 expected. */
int v6d_lease_call(struct kvs_store *s, const char *name, const char *lease_id,
                   const char *request_id, char *err, size_t errlen);
void v6d_next_request_id(struct kvs_store *s, char *buf, size_t len);
/* acquire: POST req, expect 200, parse for keys. rc < 0 with lease_id set
 * means a lease was granted and must still be ended. */
int v6d_acquire(struct kvs_store *s, json_t *req, const char *const *keys, size_t n,
                bool create, char *lease_id, struct v6d_obj *objs, char *err, size_t errlen);

/* ---- data plane (v6d_socket.c) ------------------------------------------------ */

/* Unmap the arena and close the socket. */
void v6d_dp_down(struct kvs_store *s);
/* (Re)do the handshake: connect, register, receive and map the arena. */
int v6d_dp_connect(struct kvs_store *s, char *err, size_t errlen);
/* The data-plane connection still stands (the mapping is the store's arena). */
bool v6d_dp_alive(struct kvs_store *s);
/* v6d_dp_connect unless alive. */
int v6d_dp_ensure(struct kvs_store *s, char *err, size_t errlen);

#endif
