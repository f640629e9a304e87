/* kvs_acquire_wire: the KVS front end's /acquire body and reply as bytes
 * (issue 30). Owns the parsed request (struct kvs_acquire_req) and the reply
 * writer.
 *
 * A request of the shape rtp-llm's clients send (one JSON object: scope,
 * object_keys, object_metas [{size, layout}], term, other members of any
 * value, strings of printable ASCII without escapes) is parsed in place by
 * a fixed-shape scanner: no JSON tree, keys point into the request's own
 * copy of the body. Anything else (escapes, other characters, floats where
 * integers go, duplicate members, errors of any kind) goes to jansson,
 * which builds the same struct or names the problem: both give the same
 * result for every body (tests/unit/test_kvs_acquire_wire.c checks them
 * against each other). Replies are written straight into one contiguous
 * buffer (struct kvs_reply), sent without a copy. */
#ifndef KVNODE_KVS_ACQUIRE_WIRE_H
#define KVNODE_KVS_ACQUIRE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>


/* A string of the request (not NUL-terminated). */
struct kvs_str {
    const char *s;
    size_t len;
};

struct kvs_acquire_req {
    bool create;               /* scope "create" (else "read") */
    bool has_term;             /* term given (not absent or null) */
    uint64_t term_s;           /* its seconds */
    size_t n;                  /* object keys */
    struct kvs_str *keys;      /* n */
    uint64_t *sizes;           /* a create of n > 0: object_metas[i].size, each 1..UINT32_MAX; else NULL */
    char *text;                /* the body's copy the keys point into (fast path) */
    void *tree;                /* or the jansson tree they point into */
    bool fast;                 /* parsed by the fixed-shape scanner */
};

struct kvs_acquire_limits {
    size_t max_keys;           /* more: 413 */
    uint64_t max_term_s;       /* a longer term: 400 */
    bool general_only;         /* jansson for every body (tests compare the two paths) */
};

/* Parse body (len bytes; copied). 0 with *out filled (kvs_acquire_req_free
 * it), or the HTTP status (400, 413, 500) with msg naming the problem. */
int  kvs_acquire_req_parse(const char *body, size_t len, const struct kvs_acquire_limits *lim,
                           struct kvs_acquire_req *out, char *msg, size_t msglen);
/* The same with text (len bytes, malloc'd) handed over: no copy. Any
 * thread (it touches nothing shared). */
int  kvs_acquire_req_parse_owned(char *text, size_t len, const struct kvs_acquire_limits *lim,
                                 struct kvs_acquire_req *out, char *msg, size_t msglen);
void kvs_acquire_req_free(struct kvs_acquire_req *r);

/* A reply being written: room for its head (KVS_REPLY_HEAD bytes), then
 * the objects. Zeroed: empty, nothing allocated. */
#define KVS_REPLY_HEAD 96
struct kvs_reply {
    char *p;
    size_t cap;                /* bytes at p */
    size_t len;                /* bytes of objects written after the head room */
};
/* Append one object of the reply, a comma first unless first: 0, or -1
 * (out of memory; r unchanged). */
int  kvs_reply_object(struct kvs_reply *r, bool first, struct kvs_str key, uint64_t offset, uint64_t size);
/* Wrap the objects written into the whole reply,
 * {"lease":{"lease_id":"<id>"},"objects":[...]}: its *len bytes start at
 * r->p + *off. 0 or -1 (out of memory, or a lease id of 60 bytes or more). */
int  kvs_reply_wrap(struct kvs_reply *r, const char *lease_id, size_t *off, size_t *len);

#endif
