/* ops data: the block requests — MATCH, MATCH_REMOTE, GET_BEGIN and
 * PUT_BEGIN (one lease, one location per key), GET_END / PUT_COMMIT /
 * PUT_ABORT, GET_INLINE and PUT_INLINE (bytes in the frames), DELETE — and
 * their replies (see ops.h). A request that must wait is handed to
 * ops_deferred.c. Loop thread only. */
#include "net/ops_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcm/query.h"
#include "kvnode.h"

/* Location messages for a reply: one array of structs, one of pointers. */
struct loc_buf {
    Kvnode__Location *items;
    Kvnode__Location **ptrs;
};

static int loc_buf_fill(struct loc_buf *b, const struct cache_loc *locs, size_t n)
{
    b->items = calloc(n ? n : 1, sizeof *b->items);
    b->ptrs = calloc(n ? n : 1, sizeof *b->ptrs);
    if (!b->items || !b->ptrs)
        return -KVNODE_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        kvnode__location__init(&b->items[i]);
        b->items[i].arena = locs[i].arena;
        b->items[i].offset = locs[i].offset;
        b->items[i].present = locs[i].present;
        b->ptrs[i] = &b->items[i];
    }
    return 0;
}

static void loc_buf_free(struct loc_buf *b)
{
    free(b->items);
    free(b->ptrs);
}

void ops_match_reply(struct ops *o, struct conn *conn, const Kvnode__Request *req,
                     const struct cache_tiers *t, const uint8_t *present, size_t n)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__MatchReply reply = KVNODE__MATCH_REPLY__INIT;

    if (present) {
        reply.present.data = (uint8_t *)present;
        reply.present.len = (n + 7) / 8;
    }
    reply.matched = (uint32_t)t->matched;
    reply.hbm = (uint32_t)t->hbm;
    reply.host = (uint32_t)t->host;
    reply.store = (uint32_t)t->store;
    resp.result_case = KVNODE__RESPONSE__RESULT_MATCH;
    resp.match = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
}

static void ops_match_each(struct ops *o, struct conn *conn, struct session *s,
                           const Kvnode__Request *req, const struct cache_read_req *rr);

void ops_match(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__MatchRequest *m = req->match;
    struct cache_read_req rr = { .ns = s->ns, .keys = m->keys, .n = m->n_keys,
                                 .ready = ops_pending_ready, .arg = conn };
    struct cache_tiers t;
    struct cache_wait *wait;
    char err[256];
    int rc = ops_check_keys(o, s, rr.n, err, sizeof err);

    if (rc == 0)
        rc = ops_check_words(rr.n, m->n_checks, m->checks, &rr.checks, err, sizeof err);
    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    if (m->per_key) {
        ops_match_each(o, conn, s, req, &rr);
        return;
    }
    rc = cache_match_start(ops_cache(s), &rr, &t, &wait);
    if (rc == CACHE_WAITING) {
        if (ops_defer(o, conn, s, req, rr.n, wait) == 0)
            return;
        cache_match_finish(ops_cache(s), wait, &t);
    }
    ops_match_reply(o, conn, req, &t, NULL, 0);
}

/* MATCH per key: one presence bit per key (see cache_match_each_start). */
static void ops_match_each(struct ops *o, struct conn *conn, struct session *s,
                           const Kvnode__Request *req, const struct cache_read_req *rr)
{
    uint8_t *present = malloc((rr->n + 7) / 8 + 1);
    struct cache_tiers t;
    struct cache_wait *wait;

    if (!present) {
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "out of memory");
        return;
    }
    if (cache_match_each_start(ops_cache(s), rr, &t, present, &wait) == CACHE_WAITING) {
        if (ops_defer(o, conn, s, req, rr->n, wait) == 0) {
            s->pending->per_key = true;
            free(present);
            return;
        }
        cache_match_each_finish(ops_cache(s), wait, &t, present);
    }
    ops_match_reply(o, conn, req, &t, present, rr->n);
    free(present);
}

/* --- MATCH_REMOTE ------------------------------------------------------------- */

void ops_match_remote_reply(struct ops *o, struct conn *conn, const Kvnode__Request *req,
                            uint32_t matched, const struct kvcm_query_answer *a)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__MatchRemoteReply reply = KVNODE__MATCH_REMOTE_REPLY__INIT;
    Kvnode__PeerMatch peers[KVCM_QUERY_MAX_HOSTS], *ptrs[KVCM_QUERY_MAX_HOSTS];
    size_t n = a->ok ? a->n : 0;

    for (size_t i = 0; i < n; i++) {
        kvnode__peer_match__init(&peers[i]);
        peers[i].host_ip_port = (char *)a->hosts[i].host_ip_port;
        peers[i].matched = a->hosts[i].matched > UINT32_MAX ? UINT32_MAX : (uint32_t)a->hosts[i].matched;
        ptrs[i] = &peers[i];
    }
    reply.matched = matched;
    reply.remote_ok = a->ok;
    reply.why = a->ok ? (char *)"" : (char *)a->why;
    reply.n_peers = n;
    reply.peers = n ? ptrs : NULL;
    resp.result_case = KVNODE__RESPONSE__RESULT_MATCH_REMOTE;
    resp.match_remote = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
}

void ops_match_remote(struct ops *o, struct conn *conn, struct session *s,
                      const Kvnode__Request *req)
{
    const Kvnode__MatchRemoteRequest *m = req->match_remote;
    struct kvcm_query_answer now;
    struct kvcm_query *q = NULL;
    struct cache_tiers t;
    char err[256];
    int rc = ops_check_keys(o, s, m->n_keys, err, sizeof err);

    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    cache_match_tiers(ops_cache(s), s->ns, m->keys, m->n_keys, &t);
    if (!o->querier) {
        memset(&now, 0, sizeof now);
        snprintf(now.why, sizeof now.why, "[kvcm] is off on this node: no peers to ask");
        ops_match_remote_reply(o, conn, req, (uint32_t)t.matched, &now);
        return;
    }
    if (kvcm_query_start(o->querier, s->ns, m->keys, m->n_keys, m->max_hosts, ops_query_answer,
                         conn, &now, &q) == 0) {
        if (ops_defer(o, conn, s, req, m->n_keys, NULL) == 0) {
            s->pending->query = q;
            s->pending->local_matched = (uint32_t)t.matched;
            return;
        }
        kvcm_query_cancel(o->querier, q);
        memset(&now, 0, sizeof now);
        snprintf(now.why, sizeof now.why, "out of memory");
    }
    ops_match_remote_reply(o, conn, req, (uint32_t)t.matched, &now);
}

/* GET_BEGIN and GET_INLINE once their request is checked: start the read,
 * park the connection while the cache fetches keys from the store
 * (ops_defer; ops_pending_ready answers), else answer now with the op's
 * reply. */
static void ops_get_run(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req,
                        const struct cache_read_req *rr)
{
    struct cache_lent lent = { .locs = calloc(rr->n ? rr->n : 1, sizeof *lent.locs) };
    struct cache_wait *wait;
    char err[512];
    int rc;

    if (!lent.locs) {
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "out of memory");
        return;
    }
    rc = cache_get_start(ops_cache(s), rr, &lent, err, sizeof err, &wait);
    if (rc == CACHE_WAITING) {
        if (ops_defer(o, conn, s, req, rr->n, wait) == 0) {
            free(lent.locs);
            return;
        }
        cache_get_finish(ops_cache(s), wait, &lent);
        rc = 0;
    }
    if (rc < 0)
        ops_fail(o, conn, req, rc, err);
    else if (req->op_case == KVNODE__REQUEST__OP_GET_INLINE)
        ops_get_inline_reply(o, conn, s, req, &lent);
    else
        ops_get_reply(o, conn, s, req, &lent);
    free(lent.locs);
}

/* GET_BEGIN: a read lease on the ready prefix, one location per key of it;
 * the answer waits (ops_defer) while the cache fetches keys from the store. */
void ops_get_begin(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__GetBeginRequest *g = req->get_begin;
    struct cache_read_req rr = { .ns = s->ns, .keys = g->keys, .n = g->n_keys, .owner = &s->leases,
                                 .readable = s->leases.mapped, .ready = ops_pending_ready, .arg = conn };
    char err[512];
    int rc = ops_check_keys(o, s, rr.n, err, sizeof err);

    if (rc == 0)
        rc = ops_check_words(rr.n, g->n_checks, g->checks, &rr.checks, err, sizeof err);
    if (rc < 0)
        ops_fail(o, conn, req, rc, err);
    else
        ops_get_run(o, conn, s, req, &rr);
}

/* The GET_BEGIN reply: the read lease and one location per key of the
 * prefix (a reply that cannot be built gives the lease back). */
void ops_get_reply(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req,
                   const struct cache_lent *lent)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__GetBeginReply reply = KVNODE__GET_BEGIN_REPLY__INIT;
    struct loc_buf lb = { 0 };

    if (loc_buf_fill(&lb, lent->locs, lent->n) < 0) {
        uint32_t ignored;
        loc_buf_free(&lb);
        if (lent->lease_id)
            cache_get_end(ops_cache(s), &s->leases, lent->lease_id, &ignored, NULL, 0);
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "out of memory");
        return;
    }
    reply.lease = lent->lease_id;
    reply.n_locations = lent->n;
    reply.locations = lb.ptrs;
    resp.result_case = KVNODE__RESPONSE__RESULT_GET_BEGIN;
    resp.get_begin = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
    loc_buf_free(&lb);
}

/* GET_END: the read lease given back, its blocks unpinned. */
void ops_get_end(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__LeaseReply reply = KVNODE__LEASE_REPLY__INIT;
    uint32_t blocks = 0;
    char err[512];
    int rc = ops_check_keys(o, s, 0, err, sizeof err);

    resp.result_case = KVNODE__RESPONSE__RESULT_GET_END;
    resp.get_end = &reply;
    if (rc == 0)
        rc = cache_get_end(ops_cache(s), &s->leases, req->get_end->lease, &blocks, err, sizeof err);
    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    reply.blocks = blocks;
    ops_send(o, conn, req, &resp, NULL, 0);
}

/* Copy the ready prefix into the reply, then end the read lease. */
void ops_get_inline_reply(struct ops *o, struct conn *conn, struct session *s,
                          const Kvnode__Request *req, const struct cache_lent *lent)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__GetInlineReply reply = KVNODE__GET_INLINE_REPLY__INIT;
    ProtobufCBinaryData *blocks = calloc(lent->n ? lent->n : 1, sizeof *blocks);
    uint32_t ignored;

    if (!blocks) {
        if (lent->lease_id)
            cache_get_end(ops_cache(s), &s->leases, lent->lease_id, &ignored, NULL, 0);
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "out of memory");
        return;
    }
    for (size_t i = 0; i < lent->n; i++) {
        blocks[i].data = (uint8_t *)cache_arena_base(ops_cache(s), lent->locs[i].arena) +
                         lent->locs[i].offset;
        blocks[i].len = s->ns->layout.block_bytes;
    }
    reply.n_blocks = lent->n;
    reply.blocks = blocks;
    resp.result_case = KVNODE__RESPONSE__RESULT_GET_INLINE;
    resp.get_inline = &reply;
    /* The reply is packed (copied) before this returns; then unpin. */
    ops_send(o, conn, req, &resp, NULL, 0);
    if (lent->lease_id)
        cache_get_end(ops_cache(s), &s->leases, lent->lease_id, &ignored, NULL, 0);
    free(blocks);
}

/* GET_INLINE: GET_BEGIN's read, the blocks copied into the reply. */
void ops_get_inline(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__GetInlineRequest *g = req->get_inline;
    struct cache_read_req rr = { .ns = s->ns, .keys = g->keys, .n = g->n_keys, .owner = &s->leases,
                                 .ready = ops_pending_ready, .arg = conn };
    char err[512];
    int rc = ops_check_keys(o, s, rr.n, err, sizeof err);

    if (rc == 0)
        rc = ops_check_words(rr.n, g->n_checks, g->checks, &rr.checks, err, sizeof err);
    if (rc == 0 && (uint64_t)rr.n * s->ns->layout.block_bytes + 4096u > o->cfg->max_frame_bytes) {
        rc = -KVNODE_ETOOBIG;
        snprintf(err, sizeof err, "%zu blocks of %" PRIu64 " bytes do not fit in one reply "
                 "(server.max_frame_bytes %u); ask for fewer keys", rr.n, s->ns->layout.block_bytes,
                 o->cfg->max_frame_bytes);
    }
    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    /* The loop copies the blocks into the reply: only memory its CPU can
     * read may answer (a real GPU's HBM ends the prefix). */
    rr.readable = s->leases.mapped & cache_cpu_arenas(ops_cache(s));
    ops_get_run(o, conn, s, req, &rr);
}

/* --- PUT_BEGIN, PUT_COMMIT / PUT_ABORT, PUT_INLINE ------------------------------ */

static void ops_put_reply(struct ops *o, struct conn *conn, struct session *s,
                          const Kvnode__Request *req, uint64_t lease_id, const struct cache_loc *locs);

/* PUT_BEGIN: a slot for every key not already held, under one write lease.
 * A put the store holds up waits for room (ops_put_backpressure) and comes
 * back here when it may try again. */
void ops_put_begin(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__PutBeginRequest *p = req->put_begin;
    struct cache_put_req put = { .ns = s->ns, .owner = &s->leases, .keys = p->keys, .n = p->n_keys,
                                 .tier = (int)p->tier };
    struct cache_loc *locs = NULL;
    uint64_t lease_id = 0;
    char err[512];
    int rc = ops_check_keys(o, s, put.n, err, sizeof err);

    if (rc == 0)
        rc = ops_check_words(put.n, p->n_checks, p->checks, &put.checks, err, sizeof err);
    if (rc < 0)
        goto fail;
    locs = calloc(put.n ? put.n : 1, sizeof *locs);
    if (!locs) {
        rc = -KVNODE_ENOMEM;
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    rc = cache_put_begin(ops_cache(s), &put, &lease_id, locs, err, sizeof err);
    if (rc == CACHE_STORE_BOUND) {
        if (ops_put_backpressure(o, conn, s, req, err, sizeof err)) {
            free(locs);
            return;
        }
        rc = -KVNODE_ENOSPC;
    }
    if (rc < 0)
        goto fail;
    ops_put_reply(o, conn, s, req, lease_id, locs);
    free(locs);
    return;
fail:
    free(locs);
    ops_fail(o, conn, req, rc, err);
}

/* The PUT_BEGIN reply: the lease and one location per key (a reply that
 * cannot be built gives the reservations back). */
static void ops_put_reply(struct ops *o, struct conn *conn, struct session *s,
                          const Kvnode__Request *req, uint64_t lease_id, const struct cache_loc *locs)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__PutBeginReply reply = KVNODE__PUT_BEGIN_REPLY__INIT;
    size_t n = req->put_begin->n_keys;
    struct loc_buf lb = { 0 };

    if (loc_buf_fill(&lb, locs, n) < 0) {
        uint32_t ignored;
        loc_buf_free(&lb);
        if (lease_id)
            cache_put_abort(ops_cache(s), &s->leases, lease_id, &ignored, NULL, 0);
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "out of memory");
        return;
    }
    reply.lease = lease_id;
    reply.n_locations = n;
    reply.locations = lb.ptrs;
    resp.result_case = KVNODE__RESPONSE__RESULT_PUT_BEGIN;
    resp.put_begin = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
    loc_buf_free(&lb);
}

/* PUT_COMMIT and PUT_ABORT: the write lease's blocks sealed or given back. */
void ops_put_end(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__LeaseReply reply = KVNODE__LEASE_REPLY__INIT;
    bool commit = req->op_case == KVNODE__REQUEST__OP_PUT_COMMIT;
    uint64_t lease_id = commit ? req->put_commit->lease : req->put_abort->lease;
    uint32_t blocks = 0;
    char err[512];
    int rc = ops_check_keys(o, s, 0, err, sizeof err);

    if (rc == 0)
        rc = commit ? cache_put_commit(ops_cache(s), &s->leases, lease_id, &blocks, err, sizeof err)
                    : cache_put_abort(ops_cache(s), &s->leases, lease_id, &blocks, err, sizeof err);
    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    reply.blocks = blocks;
    if (commit) {
        resp.result_case = KVNODE__RESPONSE__RESULT_PUT_COMMIT;
        resp.put_commit = &reply;
    } else {
        resp.result_case = KVNODE__RESPONSE__RESULT_PUT_ABORT;
        resp.put_abort = &reply;
    }
    ops_send(o, conn, req, &resp, NULL, 0);
}

/* Every key's bytes checked against the namespace's block size. */
static int ops_put_inline_check(const struct session *s, const Kvnode__PutInlineRequest *p, char *err,
                                size_t errlen)
{
    if (p->n_blocks != p->n_keys) {
        snprintf(err, errlen, "put_inline carries %zu keys but %zu blocks", p->n_keys, p->n_blocks);
        return -KVNODE_EINVAL;
    }
    for (size_t i = 0; i < p->n_keys; i++) {
        if (p->blocks[i].len != s->ns->layout.block_bytes) {
            snprintf(err, errlen, "block %zu is %zu bytes; this namespace's blocks are %" PRIu64,
                     i, p->blocks[i].len, s->ns->layout.block_bytes);
            return -KVNODE_EINVAL;
        }
    }
    return 0;
}

/* PUT_INLINE: PUT_BEGIN, the copy of the frame's bytes into the reserved
 * slots, and PUT_COMMIT in one request. */
void ops_put_inline(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__PutInlineRequest *p = req->put_inline;
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__PutInlineReply reply = KVNODE__PUT_INLINE_REPLY__INIT;
    struct cache_put_req put = { .ns = s->ns, .owner = &s->leases, .keys = p->keys, .n = p->n_keys,
                                 .tier = KVNODE_TIER_HOST };
    size_t n = p->n_keys, stored = 0;
    struct cache_loc *locs = NULL;
    uint64_t lease_id = 0;
    uint32_t ignored;
    char err[512];
    int rc = ops_check_keys(o, s, n, err, sizeof err);

    if (rc == 0)
        rc = ops_check_words(n, p->n_checks, p->checks, &put.checks, err, sizeof err);
    if (rc == 0)
        rc = ops_put_inline_check(s, p, err, sizeof err);
    if (rc < 0)
        goto fail;
    locs = calloc(n ? n : 1, sizeof *locs);
    if (!locs) {
        rc = -KVNODE_ENOMEM;
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    rc = cache_put_begin(ops_cache(s), &put, &lease_id, locs, err, sizeof err);
    if (rc == CACHE_STORE_BOUND) {
        if (ops_put_backpressure(o, conn, s, req, err, sizeof err)) {
            free(locs);
            return;
        }
        rc = -KVNODE_ENOSPC;
    }
    if (rc < 0)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        if (!locs[i].present)
            continue;
        memcpy((uint8_t *)cache_arena_base(ops_cache(s), locs[i].arena) + locs[i].offset,
               p->blocks[i].data, p->blocks[i].len);
        stored++;
    }
    if (lease_id)
        cache_put_commit(ops_cache(s), &s->leases, lease_id, &ignored, NULL, 0);
    reply.stored = (uint32_t)stored;
    reply.existing = (uint32_t)(n - stored);
    resp.result_case = KVNODE__RESPONSE__RESULT_PUT_INLINE;
    resp.put_inline = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
    free(locs);
    return;
fail:
    free(locs);
    ops_fail(o, conn, req, rc, err);
}

/* DELETE: the keys removed, counted (and per key when asked). */
void ops_delete(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__DeleteReply reply = KVNODE__DELETE_REPLY__INIT;
    const uint64_t *checks;
    uint32_t deleted = 0;
    uint8_t *each = NULL;
    char err[256];
    int rc = ops_check_keys(o, s, req->delete_->n_keys, err, sizeof err);

    if (rc == 0)
        rc = ops_check_words(req->delete_->n_keys, req->delete_->n_checks, req->delete_->checks,
                             &checks, err, sizeof err);
    if (rc < 0) {
        ops_fail(o, conn, req, rc, err);
        return;
    }
    /* per_key: one bit per key, set when this request removed it. */
    if (req->delete_->per_key && !(each = malloc((req->delete_->n_keys + 7) / 8 + 1))) {
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "out of memory");
        return;
    }
    cache_delete_each(ops_cache(s), s->ns, req->delete_->keys, checks, req->delete_->n_keys,
                      &deleted, each);
    reply.deleted = deleted;
    if (each) {
        reply.each.data = each;
        reply.each.len = (req->delete_->n_keys + 7) / 8;
    }
    resp.result_case = KVNODE__RESPONSE__RESULT_DELETE;
    resp.delete_ = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
    free(each);
}
