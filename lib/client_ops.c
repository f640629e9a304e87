/* client_ops: the synchronous calls of libkvnode (see kvnode.h): match,
 * get/put (zero-copy pairs, copying batches, inline), delete, stats, ping,
 * reload. Each request goes through client_call (client_async.c), so they
 * may be made from many threads at once; the copying batches here are also
 * what the asynchronous GET/PUT worker runs. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* --- helpers for the calls ---------------------------------------------------- */

/* Common entry checks for the namespace calls (checks: the call's check
 * words, or NULL). */
int client_check_ns(kvnode_client *c, size_t n, const uint64_t *checks, const char *what)
{
    if (client_check_alive(c) < 0)
        return -KVNODE_ECLOSED;
    if (c->observer) {
        client_seterr(c, "%s: an observer client (no layout) may only call stats, ping, reload and purge", what);
        return -KVNODE_ESTATE;
    }
    if (n > c->max_keys) {
        client_seterr(c, "%s: %zu keys exceed the daemon's max_keys of %" PRIu32, what, n,
                      c->max_keys);
        return -KVNODE_ETOOBIG;
    }
    if (checks && !c->check_words) {
        client_seterr(c, "%s: the daemon is too old to honour check words (its HELLO does not "
                      "offer them); upgrade kvnoded, or call without check words", what);
        return -KVNODE_EVERSION;
    }
    return 0;
}

static const struct client_arena *client_find_arena(const kvnode_client *c, uint32_t id)
{
    size_t i;

    for (i = 0; i < c->n_arenas; i++)
        if (c->arenas[i].id == id)
            return &c->arenas[i];
    return NULL;
}

/* Turn a daemon location into a pointer, checking it lies inside the mapping. */
static int client_resolve(kvnode_client *c, const Kvnode__Location *l, kvnode_loc *out)
{
    const struct client_arena *a = client_find_arena(c, l->arena);

    if (!a) {
        client_seterr(c, "protocol: location in unknown arena %" PRIu32, l->arena);
        return -KVNODE_EPROTO;
    }
    if (!a->base) {
        client_seterr(c, "protocol: location in arena %" PRIu32 ", which was not passed to "
                      "this client", l->arena);
        return -KVNODE_EPROTO;
    }
    if (l->offset > a->size || a->size - l->offset < c->block_bytes) {
        client_seterr(c, "protocol: block at offset %" PRIu64 " overruns arena %" PRIu32
                      " of %" PRIu64 " bytes", l->offset, l->arena, a->size);
        return -KVNODE_EPROTO;
    }
    out->ptr = a->base + l->offset;
    out->tier = a->tier;
    out->device = a->device;
    return 0;
}

/* --- leases this client holds ---------------------------------------------- */

void client_lease_note(kvnode_client *c, uint64_t lease, int64_t asked_ms, int write)
{
    pthread_mutex_lock(&c->lock);
    if (c->n_leases == c->cap_leases) {
        /* Leases past their TTL that were never ended go first. */
        int64_t now = client_now_ms();
        size_t k = 0;

        for (size_t i = 0; i < c->n_leases; i++) {
            const struct client_lease *l = &c->leases[i];
            uint32_t ttl = l->write ? c->write_ttl_ms : c->read_ttl_ms;

            if (now - l->asked_ms <= (int64_t)ttl)
                c->leases[k++] = *l;
        }
        c->n_leases = k;
    }
    if (c->n_leases == c->cap_leases && c->cap_leases < CLIENT_LEASES_MAX) {
        size_t cap = c->cap_leases ? c->cap_leases * 2 : 8;
        struct client_lease *nl = realloc(c->leases, cap * sizeof *nl);

        if (nl) {
            c->leases = nl;
            c->cap_leases = cap;
        }
    }
    /* Not remembered (out of room): its end waits for the reply. */
    if (c->n_leases < c->cap_leases)
        c->leases[c->n_leases++] = (struct client_lease){ lease, asked_ms, write };
    pthread_mutex_unlock(&c->lock);
}

/* Index of lease in c->leases, or n_leases. Newest first: an engine ends
 * what it just began. */
static size_t client_lease_find_locked(const kvnode_client *c, uint64_t lease)
{
    for (size_t i = c->n_leases; i-- > 0;)
        if (c->leases[i].lease == lease)
            return i;
    return c->n_leases;
}

void client_lease_forget_locked(kvnode_client *c, uint64_t lease)
{
    size_t i = client_lease_find_locked(c, lease);

    if (i < c->n_leases)
        c->leases[i] = c->leases[--c->n_leases];
}

int client_lease_young_locked(kvnode_client *c, uint64_t lease, int write)
{
    size_t i = client_lease_find_locked(c, lease);
    uint32_t ttl = write ? c->write_ttl_ms : c->read_ttl_ms;
    int young;

    if (i == c->n_leases)
        return 0;
    /* The daemon starts the TTL after the request was sent; a quarter of it
     * is left as margin for the end to reach the daemon. */
    young = c->leases[i].write == write && ttl > 0 &&
            client_now_ms() - c->leases[i].asked_ms < (int64_t)(ttl - ttl / 4);
    c->leases[i] = c->leases[--c->n_leases];
    return young;
}

/* End, commit or abort a lease. deferred: when the lease is one this client
 * got and the daemon cannot have reaped it (the caller's accesses, complete
 * by contract, were covered), send it and return: the reply is read later,
 * an error kept for the next call. Otherwise (an unknown, ended or old
 * lease, whose error the caller must see now) wait for the reply. */
static int client_lease_request(kvnode_client *c, kvnode_lease lease, int op, const char *what,
                                int deferred)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__LeaseRequest lr = KVNODE__LEASE_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (lease == 0)
        return 0;   /* nothing was pinned or reserved */
    rc = client_check_ns(c, 0, NULL, what);
    if (rc < 0)
        return rc;
    lr.lease = lease;
    req.op_case = (Kvnode__Request__OpCase)op;
    switch (op) {
    case KVNODE__REQUEST__OP_GET_END:    req.get_end = &lr; break;
    case KVNODE__REQUEST__OP_PUT_COMMIT: req.put_commit = &lr; break;
    default:                             req.put_abort = &lr; break;
    }
    pthread_mutex_lock(&c->lock);
    if (deferred)
        deferred = client_lease_young_locked(c, lease, op == KVNODE__REQUEST__OP_PUT_COMMIT);
    else
        client_lease_forget_locked(c, lease);
    pthread_mutex_unlock(&c->lock);
    if (deferred)
        return client_call_deferred(c, &req, lease);
    rc = client_call(c, &req, op, &resp);   /* result cases equal op cases */
    if (rc < 0)
        return rc;
    client_response_free(c, resp);
    return 0;
}

static int client_lease_op(kvnode_client *c, kvnode_lease lease, int op, const char *what)
{
    return client_lease_request(c, lease, op, what, 0);
}

/* Best-effort release of a lease we cannot hand to the caller; the message
 * of the original failure is kept. */
static void client_lease_drop(kvnode_client *c, kvnode_lease lease, int op)
{
    char saved[CLIENT_MSG_MAX];

    if (lease == 0)
        return;
    snprintf(saved, sizeof saved, "%s", client_errmsg(c));
    (void)client_lease_op(c, lease, op, "release");
    client_seterr(c, "%s", saved);
}


/* --- zero-copy calls --------------------------------------------------------- */

/* match and delete: n keys in, a count of at most n out (*count). `del`
 * picks the op; `out_name` names the output argument in errors. */
static int client_count_call(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                             size_t n, size_t *count, int del, const char *out_name,
                             kvnode_tiers *tiers, bool *each)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__MatchRequest m = KVNODE__MATCH_REQUEST__INIT;
    Kvnode__DeleteRequest d = KVNODE__DELETE_REQUEST__INIT;
    const char *what = del ? "delete" : "match";
    Kvnode__Response *resp;
    uint32_t answered;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!count || (!keys && n > 0)) {
        client_seterr(c, "%s: NULL %s", what, count ? "keys" : out_name);
        return -KVNODE_EINVAL;
    }
    *count = 0;
    rc = client_check_ns(c, n, checks, what);
    if (rc == 0 && each && !c->per_key) {
        client_seterr(c, "%s: the daemon is too old to answer per key (its HELLO does not offer "
                      "it); upgrade kvnoded", what);
        rc = -KVNODE_EVERSION;
    }
    if (rc < 0 || n == 0)
        return rc;
    client_keys_request(&req, &m, &d, del, keys, checks, n);
    m.per_key = d.per_key = each != NULL;
    rc = client_call(c, &req, del ? KVNODE__RESPONSE__RESULT_DELETE : KVNODE__RESPONSE__RESULT_MATCH,
                     &resp);
    if (rc < 0)
        return rc;
    answered = del ? resp->delete_->deleted : resp->match->matched;
    if (answered > n) {
        client_seterr(c, "protocol: %s of %zu keys answered %" PRIu32, what, n, answered);
        rc = -KVNODE_EPROTO;
    } else if (tiers && (uint64_t)resp->match->hbm + resp->match->host + resp->match->store !=
                            answered) {
        client_seterr(c, "protocol: match of %zu keys answered %" PRIu32 " = %" PRIu32 " hbm + %"
                      PRIu32 " host + %" PRIu32 " store", n, answered, resp->match->hbm,
                      resp->match->host, resp->match->store);
        rc = -KVNODE_EPROTO;
    } else if (each && client_each_unpack(del ? &resp->delete_->each : &resp->match->present, n,
                                          answered, each) < 0) {
        memset(each, 0, n * sizeof *each);
        client_seterr(c, "protocol: the per-key %s of %zu keys answered %" PRIu32 " with a "
                      "bitmap of %zu bytes that does not say so", what, n, answered,
                      del ? resp->delete_->each.len : resp->match->present.len);
        rc = -KVNODE_EPROTO;
    } else {
        *count = answered;
        if (tiers) {
            tiers->hbm = resp->match->hbm;
            tiers->host = resp->match->host;
            tiers->store = resp->match->store;
        }
    }
    client_response_free(c, resp);
    return rc;
}

int kvnode_match(kvnode_client *c, const kvnode_key *keys, size_t n, size_t *matched)
{
    return client_count_call(c, keys, NULL, n, matched, 0, "matched", NULL, NULL);
}

int kvnode_match_remote(kvnode_client *c, const kvnode_key *keys, size_t n, size_t max_hosts,
                        kvnode_remote_match *out)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__MatchRemoteRequest m = KVNODE__MATCH_REMOTE_REQUEST__INIT;
    Kvnode__Response *resp;
    const Kvnode__MatchRemoteReply *r;
    int rc;

    if (out)
        memset(out, 0, sizeof *out);
    if (!c)
        return -KVNODE_EINVAL;
    if (!out || (!keys && n > 0)) {
        client_seterr(c, "match_remote: NULL %s", out ? "keys" : "out");
        return -KVNODE_EINVAL;
    }
    rc = client_check_ns(c, n, NULL, "match_remote");
    if (rc < 0)
        return rc;
    m.n_keys = n;
    m.keys = (int64_t *)(uintptr_t)keys;
    m.max_hosts = max_hosts > UINT32_MAX ? UINT32_MAX : (uint32_t)max_hosts;
    req.op_case = KVNODE__REQUEST__OP_MATCH_REMOTE;
    req.match_remote = &m;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_MATCH_REMOTE, &resp);
    if (rc < 0)
        return rc;
    r = resp->match_remote;
    if (r->matched > n || r->n_peers > KVNODE_MAX_PEERS) {
        client_seterr(c, "protocol: match_remote of %zu keys answered %" PRIu32 " with %zu peers",
                      n, r->matched, r->n_peers);
        client_response_free(c, resp);
        return -KVNODE_EPROTO;
    }
    out->matched = r->matched;
    out->remote_ok = r->remote_ok ? 1 : 0;
    snprintf(out->why, sizeof out->why, "%s", r->why ? r->why : "");
    for (size_t i = 0; i < r->n_peers; i++) {
        const Kvnode__PeerMatch *p = r->peers[i];
        if (!p || !p->host_ip_port || p->matched > n)
            continue;
        snprintf(out->peers[out->npeers].host_ip_port, sizeof out->peers[0].host_ip_port, "%s",
                 p->host_ip_port);
        out->peers[out->npeers++].matched = p->matched;
    }
    client_response_free(c, resp);
    return 0;
}

int kvnode_match_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                         size_t n, kvnode_tiers *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (c && !out) {
        client_seterr(c, "match: NULL out");
        return -KVNODE_EINVAL;
    }
    return client_count_call(c, keys, checks, n, out ? &out->matched : NULL, 0, "matched", out,
                             NULL);
}

int kvnode_match_tiers(kvnode_client *c, const kvnode_key *keys, size_t n, kvnode_tiers *out)
{
    return kvnode_match_checked(c, keys, NULL, n, out);
}

int kvnode_get_begin(kvnode_client *c, const kvnode_key *keys, size_t n,
                     kvnode_lease *lease, kvnode_loc *locs, size_t *got)
{
    return kvnode_get_begin_checked(c, keys, NULL, n, lease, locs, got);
}

int kvnode_get_begin_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                             size_t n, kvnode_lease *lease, kvnode_loc *locs, size_t *got)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__GetBeginRequest g = KVNODE__GET_BEGIN_REQUEST__INIT;
    Kvnode__Response *resp;
    const Kvnode__GetBeginReply *r;
    int64_t asked;
    size_t i;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!lease || !got || ((!keys || !locs) && n > 0)) {
        client_seterr(c, "get_begin: NULL argument");
        return -KVNODE_EINVAL;
    }
    *lease = 0;
    *got = 0;
    rc = client_check_ns(c, n, checks, "get_begin");
    if (rc < 0 || n == 0)
        return rc;
    g.n_keys = n;
    g.keys = (int64_t *)(uintptr_t)keys;
    g.n_checks = checks ? n : 0;
    g.checks = (uint64_t *)(uintptr_t)checks;
    req.op_case = KVNODE__REQUEST__OP_GET_BEGIN;
    req.get_begin = &g;
    asked = client_now_ms();
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_GET_BEGIN, &resp);
    if (rc < 0)
        return rc;
    r = resp->get_begin;
    if (r->n_locations > n || (r->lease == 0 && r->n_locations > 0)) {
        client_seterr(c, "protocol: get_begin of %zu keys answered %zu locations under lease %"
                      PRIu64, n, r->n_locations, r->lease);
        rc = -KVNODE_EPROTO;
    }
    for (i = 0; rc == 0 && i < r->n_locations; i++)
        rc = client_resolve(c, r->locations[i], &locs[i]);
    if (rc == 0 && r->n_locations > 0) {
        *lease = r->lease;
        *got = r->n_locations;
        client_lease_note(c, r->lease, asked, 0);
    } else {
        /* Nothing usable reached the caller: do not leave blocks pinned. */
        client_lease_drop(c, r->lease, KVNODE__REQUEST__OP_GET_END);
    }
    client_response_free(c, resp);
    return rc;
}

int kvnode_get_end(kvnode_client *c, kvnode_lease lease)
{
    return client_lease_request(c, lease, KVNODE__REQUEST__OP_GET_END, "get_end", 1);
}

int kvnode_get_end_wait(kvnode_client *c, kvnode_lease lease)
{
    return client_lease_op(c, lease, KVNODE__REQUEST__OP_GET_END, "get_end");
}

int kvnode_put_commit_nowait(kvnode_client *c, kvnode_lease lease)
{
    return client_lease_request(c, lease, KVNODE__REQUEST__OP_PUT_COMMIT, "put_commit", 1);
}

int kvnode_flush(kvnode_client *c)
{
    if (!c)
        return -KVNODE_EINVAL;
    return client_flush(c);
}

int kvnode_put_begin(kvnode_client *c, const kvnode_key *keys, size_t n, int tier,
                     kvnode_lease *lease, kvnode_loc *locs)
{
    return kvnode_put_begin_checked(c, keys, NULL, n, tier, lease, locs);
}

int kvnode_put_begin_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                             size_t n, int tier, kvnode_lease *lease, kvnode_loc *locs)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__PutBeginRequest p = KVNODE__PUT_BEGIN_REQUEST__INIT;
    Kvnode__Response *resp;
    const Kvnode__PutBeginReply *r;
    size_t i, present = 0;
    int64_t asked;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!lease || ((!keys || !locs) && n > 0)) {
        client_seterr(c, "put_begin: NULL argument");
        return -KVNODE_EINVAL;
    }
    *lease = 0;
    if (tier != KVNODE_TIER_HOST && tier != KVNODE_TIER_HBM) {
        client_seterr(c, "put_begin: tier %d is neither KVNODE_TIER_HOST nor KVNODE_TIER_HBM",
                      tier);
        return -KVNODE_EINVAL;
    }
    rc = client_check_ns(c, n, checks, "put_begin");
    if (rc < 0 || n == 0)
        return rc;
    p.n_keys = n;
    p.keys = (int64_t *)(uintptr_t)keys;
    p.n_checks = checks ? n : 0;
    p.checks = (uint64_t *)(uintptr_t)checks;
    p.tier = (Kvnode__Tier)tier;
    req.op_case = KVNODE__REQUEST__OP_PUT_BEGIN;
    req.put_begin = &p;
    asked = client_now_ms();
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_PUT_BEGIN, &resp);
    if (rc < 0)
        return rc;
    r = resp->put_begin;
    if (r->n_locations != n) {
        client_seterr(c, "protocol: put_begin of %zu keys answered %zu locations", n,
                      r->n_locations);
        rc = -KVNODE_EPROTO;
    }
    for (i = 0; rc == 0 && i < n; i++) {
        if (r->locations[i]->present) {
            rc = client_resolve(c, r->locations[i], &locs[i]);
            present++;
        } else {
            locs[i] = (kvnode_loc){ .ptr = NULL, .tier = 0, .device = -1 };
        }
    }
    if (rc == 0 && present > 0 && r->lease == 0) {
        client_seterr(c, "protocol: put_begin reserved %zu slots without a lease", present);
        rc = -KVNODE_EPROTO;
    }
    if (rc == 0) {
        *lease = r->lease;
        if (r->lease)
            client_lease_note(c, r->lease, asked, 1);
    } else {
        client_lease_drop(c, r->lease, KVNODE__REQUEST__OP_PUT_ABORT);
    }
    client_response_free(c, resp);
    return rc;
}

int kvnode_put_commit(kvnode_client *c, kvnode_lease lease)
{
    return client_lease_op(c, lease, KVNODE__REQUEST__OP_PUT_COMMIT, "put_commit");
}

/* The caller's GPU work on `stream` touches the lease's blocks: it must be
 * complete before the daemon takes them back (commit: copies them to the
 * store, demotes them, lends them to readers; end: may reuse them). */
int kvnode_put_commit_stream(kvnode_client *c, kvnode_lease lease, void *stream)
{
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (lease == 0)
        return 0;
    rc = client_check_ns(c, 0, NULL, "put_commit");
    /* On failure the lease stays as it is: aborting it while the caller's
     * writes may still run would let them land in a slot given to another. */
    if (rc == 0)
        rc = client_stream_wait(c, stream, "put_commit");
    return rc < 0 ? rc : kvnode_put_commit(c, lease);
}

int kvnode_get_end_stream(kvnode_client *c, kvnode_lease lease, void *stream)
{
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (lease == 0)
        return 0;
    rc = client_check_ns(c, 0, NULL, "get_end");
    if (rc == 0)
        rc = client_stream_wait(c, stream, "get_end");
    return rc < 0 ? rc : kvnode_get_end(c, lease);
}

int kvnode_put_abort(kvnode_client *c, kvnode_lease lease)
{
    return client_lease_op(c, lease, KVNODE__REQUEST__OP_PUT_ABORT, "put_abort");
}

/* --- copying conveniences ---------------------------------------------------- */

/* Every block pointer of a copying call must be usable. */
static int client_check_blocks(kvnode_client *c, const void *const *blocks, size_t n,
                               const char *what)
{
    size_t i;

    if (!blocks && n > 0) {
        client_seterr(c, "%s: NULL block array", what);
        return -KVNODE_EINVAL;
    }
    for (i = 0; i < n; i++) {
        if (!blocks[i]) {
            client_seterr(c, "%s: block pointer %zu is NULL", what, i);
            return -KVNODE_EINVAL;
        }
    }
    return 0;
}

/* Keys per inline chunk so that a frame carrying that many blocks stays under
 * the daemon's max_frame_bytes (and max_keys). 0: one block does not fit. */
static size_t client_inline_chunk(const kvnode_client *c)
{
    uint64_t per = c->block_bytes + CLIENT_INLINE_PER_BLOCK;
    uint64_t k;

    if (c->send_max <= CLIENT_INLINE_OVERHEAD)
        return 0;
    k = (c->send_max - CLIENT_INLINE_OVERHEAD) / per;
    if (k > 1 && k * per > CLIENT_INLINE_TARGET)
        k = CLIENT_INLINE_TARGET / per > 1 ? CLIENT_INLINE_TARGET / per : 1;
    return k < c->max_keys ? (size_t)k : c->max_keys;
}

/* At most as many keys as the daemon lets one connection hold in
 * uncommitted put reservations (each chunk of a copying put is reserved
 * whole before it is committed; the daemon refuses it otherwise). */
static size_t client_reserve_cap(const kvnode_client *c, size_t cap)
{
    uint64_t k = c->max_reserved && c->block_bytes ? c->max_reserved / c->block_bytes : cap;
    if (k < 1)
        k = 1;
    return k < cap ? (size_t)k : cap;
}

/* Common entry of the copying calls: argument and state checks without the
 * max_keys limit (they split into chunks). When n > 0 and all is well, *cap
 * is the most keys one chunk may have (at most n): max_keys, or with
 * inline_ as many blocks as fit in a frame. */
static int client_copy_entry(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                             size_t n, const void *const *blocks, int inline_, size_t *cap,
                             const char *what)
{
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!keys && n > 0) {
        client_seterr(c, "%s: NULL keys", what);
        return -KVNODE_EINVAL;
    }
    rc = client_check_blocks(c, blocks, n, what);
    if (rc == 0)
        rc = client_check_ns(c, 0, checks, what);
    if (rc < 0 || n == 0)
        return rc;
    *cap = inline_ ? client_inline_chunk(c) : c->max_keys;
    if (*cap == 0) {
        client_seterr(c, "%s: a block of %" PRIu64 " bytes does not fit in a frame of %"
                      PRIu32 " bytes", what, c->block_bytes, c->send_max);
        return -KVNODE_ETOOBIG;
    }
    if (*cap > n)
        *cap = n;
    return 0;
}

/* client_copy_entry for the gets, which also zero *got. */
static int client_get_entry(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                            size_t n, void *const *dst, size_t *got, int inline_, size_t *cap,
                            const char *what)
{
    if (!c)
        return -KVNODE_EINVAL;
    if (!got) {
        client_seterr(c, "%s: NULL got", what);
        return -KVNODE_EINVAL;
    }
    *got = 0;
    return client_copy_entry(c, keys, checks, n, (const void *const *)dst, inline_, cap, what);
}

/* malloc that names the failure in c's error message. */
static void *client_malloc(kvnode_client *c, size_t size)
{
    void *p = malloc(size);

    if (!p)
        client_seterr(c, "out of memory");
    return p;
}

/* KVNODE_BATCH_DEVICE needs the runtime that copies device memory. */
static int client_batch_flags(kvnode_client *c, unsigned flags, const char *what)
{
    if (flags & ~(unsigned)KVNODE_BATCH_DEVICE) {
        client_seterr(c, "%s: unknown flags 0x%x (this libkvnode knows 0x%x: KVNODE_BATCH_DEVICE)",
                      what, flags & ~(unsigned)KVNODE_BATCH_DEVICE, (unsigned)KVNODE_BATCH_DEVICE);
        return -KVNODE_EINVAL;
    }
    if ((flags & KVNODE_BATCH_DEVICE) && !c->have_rt) {
        client_seterr(c, "%s: KVNODE_BATCH_DEVICE needs a client with a CUDA device and a CUDA "
                      "runtime: %s", what, c->cuda_device < 0 ? "it declared no CUDA device "
                      "(kvnode_connect_device)" : c->rt_why);
        return -KVNODE_ESTATE;
    }
    return 0;
}

int client_get_batch(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                     void *const *dst, unsigned flags, const struct client_stream *st,
                     size_t *got)
{
    kvnode_loc *locs;
    size_t done = 0, cap;
    int rc;

    rc = client_get_entry(c, keys, checks, n, dst, got, 0, &cap, "get");
    if (rc == 0)
        rc = client_batch_flags(c, flags, "get");
    if (rc < 0 || n == 0)
        return rc;
    locs = client_malloc(c, cap * sizeof *locs);
    if (!locs)
        return -KVNODE_ENOMEM;
    while (done < n) {
        size_t chunk = n - done < cap ? n - done : cap, g = 0;
        kvnode_lease lease;

        rc = kvnode_get_begin_checked(c, keys + done, checks ? checks + done : NULL, chunk, &lease,
                                      locs, &g);
        if (rc < 0)
            break;
        rc = client_copy_blocks(c, locs, g, dst + done, 0, (flags & KVNODE_BATCH_DEVICE) != 0,
                                done, "get", st);
        if (rc < 0) {
            client_lease_drop(c, lease, KVNODE__REQUEST__OP_GET_END);
            break;
        }
        /* The copies are only trustworthy if the pin held until the end:
         * wait for the daemon to say so. */
        rc = kvnode_get_end_wait(c, lease);
        if (rc < 0)
            break;
        done += g;
        if (g < chunk)
            break;
    }
    free(locs);
    *got = done;
    return rc;
}

int client_put_batch(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                     const void *const *src, unsigned flags, const struct client_stream *st,
                     size_t *stored)
{
    kvnode_loc *locs;
    size_t done = 0, cap;
    int rc;

    *stored = 0;
    rc = client_copy_entry(c, keys, checks, n, src, 0, &cap, "put");
    if (rc == 0)
        rc = client_batch_flags(c, flags, "put");
    if (rc < 0 || n == 0)
        return rc;
    cap = client_reserve_cap(c, cap);
    locs = client_malloc(c, cap * sizeof *locs);
    if (!locs)
        return -KVNODE_ENOMEM;
    while (done < n) {
        size_t chunk = n - done < cap ? n - done : cap;
        kvnode_lease lease;

        /* Host slots (CPU copies); client_copy_blocks would cope with others. */
        rc = kvnode_put_begin_checked(c, keys + done, checks ? checks + done : NULL, chunk,
                                      KVNODE_TIER_HOST, &lease, locs);
        if (rc < 0)
            break;
        rc = client_copy_blocks(c, locs, chunk, (void *const *)(uintptr_t)(src + done), 1,
                                (flags & KVNODE_BATCH_DEVICE) != 0, done, "put", st);
        if (rc < 0) {
            client_lease_drop(c, lease, KVNODE__REQUEST__OP_PUT_ABORT);
            break;
        }
        rc = kvnode_put_commit(c, lease);
        if (rc < 0)
            break;
        done += chunk;
    }
    free(locs);
    *stored = done;
    return rc;
}

int kvnode_get(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst, size_t *got)
{
    return client_get_batch(c, keys, NULL, n, dst, 0, NULL, got);
}

int kvnode_put(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src)
{
    size_t stored;

    return client_put_batch(c, keys, NULL, n, src, 0, NULL, &stored);
}

int kvnode_get_batch(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                     unsigned flags, size_t *got)
{
    return client_get_batch(c, keys, NULL, n, dst, flags, NULL, got);
}

int kvnode_put_batch(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src,
                     unsigned flags)
{
    size_t stored;

    return client_put_batch(c, keys, NULL, n, src, flags, NULL, &stored);
}

int kvnode_get_batch_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                             size_t n, void *const *dst, unsigned flags, size_t *got)
{
    return client_get_batch(c, keys, checks, n, dst, flags, NULL, got);
}

int kvnode_put_batch_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                             size_t n, const void *const *src, unsigned flags)
{
    size_t stored;

    return client_put_batch(c, keys, checks, n, src, flags, NULL, &stored);
}

int kvnode_get_batch_stream(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                            unsigned flags, void *stream, size_t *got)
{
    const struct client_stream st = { .callers = 1, .stream = stream };

    return client_get_batch(c, keys, NULL, n, dst, flags, &st, got);
}

int kvnode_put_batch_stream(kvnode_client *c, const kvnode_key *keys, size_t n,
                            const void *const *src, unsigned flags, void *stream)
{
    const struct client_stream st = { .callers = 1, .stream = stream };
    size_t stored;

    return client_put_batch(c, keys, NULL, n, src, flags, &st, &stored);
}

int kvnode_get_inline(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                      size_t *got)
{
    return kvnode_get_inline_checked(c, keys, NULL, n, dst, got);
}

int kvnode_get_inline_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, void *const *dst, size_t *got)
{
    size_t done = 0, cap;
    int rc;

    rc = client_get_entry(c, keys, checks, n, dst, got, 1, &cap, "get_inline");
    if (rc < 0 || n == 0)
        return rc;
    while (done < n) {
        Kvnode__Request req = KVNODE__REQUEST__INIT;
        Kvnode__GetInlineRequest g = KVNODE__GET_INLINE_REQUEST__INIT;
        Kvnode__Response *resp;
        const Kvnode__GetInlineReply *r;
        size_t chunk = n - done < cap ? n - done : cap, i, nblocks;

        g.n_keys = chunk;
        g.keys = (int64_t *)(uintptr_t)(keys + done);
        g.n_checks = checks ? chunk : 0;
        g.checks = checks ? (uint64_t *)(uintptr_t)(checks + done) : NULL;
        req.op_case = KVNODE__REQUEST__OP_GET_INLINE;
        req.get_inline = &g;
        rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_GET_INLINE, &resp);
        if (rc < 0)
            break;
        r = resp->get_inline;
        if (r->n_blocks > chunk) {
            client_seterr(c, "protocol: get_inline of %zu keys answered %zu blocks", chunk,
                          r->n_blocks);
            rc = -KVNODE_EPROTO;
        }
        for (i = 0; rc == 0 && i < r->n_blocks; i++) {
            if (r->blocks[i].len != c->block_bytes) {
                client_seterr(c, "protocol: get_inline block %zu has %zu bytes, expected %"
                              PRIu64, done + i, r->blocks[i].len, c->block_bytes);
                rc = -KVNODE_EPROTO;
            }
        }
        nblocks = r->n_blocks;
        if (rc == 0) {
            for (i = 0; i < nblocks; i++)
                memcpy(dst[done + i], r->blocks[i].data, r->blocks[i].len);
            done += nblocks;
        }
        client_response_free(c, resp);
        if (rc < 0 || nblocks < chunk)   /* a short chunk ends the prefix */
            break;
    }
    *got = done;
    return rc;
}

int kvnode_put_inline(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src)
{
    return kvnode_put_inline_checked(c, keys, NULL, n, src);
}

int kvnode_put_inline_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, const void *const *src)
{
    ProtobufCBinaryData *blobs;
    size_t done = 0, cap;
    int rc;

    rc = client_copy_entry(c, keys, checks, n, src, 1, &cap, "put_inline");
    if (rc < 0 || n == 0)
        return rc;
    cap = client_reserve_cap(c, cap);
    blobs = client_malloc(c, cap * sizeof *blobs);
    if (!blobs)
        return -KVNODE_ENOMEM;
    while (done < n) {
        Kvnode__Request req = KVNODE__REQUEST__INIT;
        Kvnode__PutInlineRequest p = KVNODE__PUT_INLINE_REQUEST__INIT;
        Kvnode__Response *resp;
        size_t chunk = n - done < cap ? n - done : cap, i;

        for (i = 0; i < chunk; i++) {
            /* protobuf-c only reads .data when packing. */
            blobs[i].data = (uint8_t *)(uintptr_t)src[done + i];
            blobs[i].len = (size_t)c->block_bytes;
        }
        p.n_keys = chunk;
        p.keys = (int64_t *)(uintptr_t)(keys + done);
        p.n_checks = checks ? chunk : 0;
        p.checks = checks ? (uint64_t *)(uintptr_t)(checks + done) : NULL;
        p.n_blocks = chunk;
        p.blocks = blobs;
        req.op_case = KVNODE__REQUEST__OP_PUT_INLINE;
        req.put_inline = &p;
        rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_PUT_INLINE, &resp);
        if (rc < 0)
            break;
        client_response_free(c, resp);
        done += chunk;
    }
    free(blobs);
    return rc;
}

/* --- delete / stats / ping --------------------------------------------------- */

int kvnode_delete(kvnode_client *c, const kvnode_key *keys, size_t n, size_t *deleted)
{
    return client_count_call(c, keys, NULL, n, deleted, 1, "deleted", NULL, NULL);
}

int kvnode_delete_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                          size_t n, size_t *deleted)
{
    return client_count_call(c, keys, checks, n, deleted, 1, "deleted", NULL, NULL);
}

/* Per key (see kvnode.h): MATCH / DELETE with per_key, the bitmap unpacked. */
static int client_each_call(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                            size_t n, bool *each, size_t *count, int del)
{
    const char *what = del ? "delete_each" : "exists";
    bool none;

    if (!c)
        return -KVNODE_EINVAL;
    if (!each && n > 0) {
        client_seterr(c, "%s: NULL %s", what, del ? "deleted" : "present");
        return -KVNODE_EINVAL;
    }
    if (n > 0)
        memset(each, 0, n * sizeof *each);
    /* n == 0: no request, but the same refusal from a daemon without per_key. */
    return client_count_call(c, keys, checks, n, count, del, del ? "count" : "held", NULL,
                             n > 0 ? each : &none);
}

int kvnode_exists(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                  bool *present, size_t *held)
{
    return client_each_call(c, keys, checks, n, present, held, 0);
}

int kvnode_delete_each(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                       size_t n, bool *deleted, size_t *count)
{
    return client_each_call(c, keys, checks, n, deleted, count, 1);
}

int kvnode_stats_json(kvnode_client *c, char **json)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__StatsRequest s = KVNODE__STATS_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!json) {
        client_seterr(c, "stats: NULL json");
        return -KVNODE_EINVAL;
    }
    *json = NULL;
    req.op_case = KVNODE__REQUEST__OP_STATS;
    req.stats = &s;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_STATS, &resp);
    if (rc < 0)
        return rc;
    *json = strdup(resp->stats->json ? resp->stats->json : "");
    client_response_free(c, resp);
    if (!*json) {
        client_seterr(c, "out of memory");
        return -KVNODE_ENOMEM;
    }
    return 0;
}

int kvnode_ping(kvnode_client *c)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__PingRequest p = KVNODE__PING_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    /* Distinct per call, so a stale echo cannot pass. */
    p.nonce = (client_peek_id(c) * UINT64_C(0x9e3779b97f4a7c15)) ^ (uint64_t)(uintptr_t)c;
    req.op_case = KVNODE__REQUEST__OP_PING;
    req.ping = &p;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_PING, &resp);
    if (rc < 0)
        return rc;
    if (resp->ping->nonce != p.nonce) {
        client_seterr(c, "protocol: ping nonce %" PRIu64 " echoed as %" PRIu64, p.nonce,
                      resp->ping->nonce);
        rc = -KVNODE_EPROTO;
    }
    client_response_free(c, resp);
    return rc;
}

int kvnode_reload(kvnode_client *c, char **not_applied)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__ReloadRequest r = KVNODE__RELOAD_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (not_applied)
        *not_applied = NULL;
    if (!c)
        return -KVNODE_EINVAL;
    req.op_case = KVNODE__REQUEST__OP_RELOAD;
    req.reload = &r;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_RELOAD, &resp);
    if (rc < 0)
        return rc;
    if (not_applied && resp->reload->not_applied && *resp->reload->not_applied) {
        *not_applied = strdup(resp->reload->not_applied);
        if (!*not_applied) {
            client_seterr(c, "out of memory");
            rc = -KVNODE_ENOMEM;
        }
    }
    client_response_free(c, resp);
    return rc;
}


/* --- purge (issue 31) -------------------------------------------------------- */

const char *kvnode_deployment_id(const kvnode_client *c)
{
    return c ? c->deployment_id : "";
}

int kvnode_purge(kvnode_client *c, const char *tenant, const char *deployment_id, const char *model,
                 uint32_t *namespaces, uint64_t *blocks)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__PurgeRequest r = KVNODE__PURGE_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (namespaces)
        *namespaces = 0;
    if (blocks)
        *blocks = 0;
    if (!c)
        return -KVNODE_EINVAL;
    if (deployment_id && *deployment_id && model && *model) {
        client_seterr(c, "kvnode_purge: name a deployment_id or a model, not both");
        return -KVNODE_EINVAL;
    }
    if (c->observer && !(deployment_id && *deployment_id) && !(model && *model)) {
        client_seterr(c, "kvnode_purge: an observer client must name a deployment_id or a model");
        return -KVNODE_EINVAL;
    }
    r.tenant = (char *)(uintptr_t)(tenant ? tenant : "");
    r.deployment_id = (char *)(uintptr_t)(deployment_id ? deployment_id : "");
    r.model = (char *)(uintptr_t)(model ? model : "");
    req.op_case = KVNODE__REQUEST__OP_PURGE;
    req.purge = &r;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_PURGE, &resp);
    if (rc < 0)
        return rc;
    if (namespaces)
        *namespaces = resp->purge->namespaces;
    if (blocks)
        *blocks = resp->purge->blocks;
    client_response_free(c, resp);
    return 0;
}
