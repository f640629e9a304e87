/* cache stop: the stop's promise to the store (see cache.h). After SIGTERM,
 * once no client is left, every committed block in memory that the store
 * lacks is written — retried at once, in rounds, until it lands or
 * server.shutdown_timeout passes — and what could not be written is counted
 * and logged by namespace. Loop thread only, with the loop no longer
 * running: completions are taken by persist_drain. */
#include "cache/cache_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <time.h>

#include "core/clock.h"
#include "core/log.h"
#include "kvnode.h"
#include "persist/persist.h"

/* After a round in which no write landed (the store still refuses them),
 * the next waits this long, so a full disk is retried ten times a second
 * rather than spun on. */
#define STOP_RETRY_PAUSE_MS 100u

/* A committed block in memory without a copy in the store. */
static bool cache_lacks_copy(const struct index_entry *e)
{
    return !e->detached && e->state == ENTRY_SEALED && e->persist != PERSIST_STORED;
}

/* The blocks one round writes: (namespace, key) of each committed block
 * that lacks a copy and no write holds (a write in flight or waiting for
 * its turn pins its block). */
struct stop_round {
    struct stop_key { uint32_t ns; int64_t key; } *v;
    size_t n, cap;
    bool oom;
};

static void stop_round_collect(void *arg, struct index_entry *e)
{
    struct stop_round *r = arg;
    if (!cache_lacks_copy(e) || e->pins > 0 || r->oom)
        return;
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        struct stop_key *v = realloc(r->v, cap * sizeof *v);
        if (!v) {
            r->oom = true;   /* this round writes what it has; the next finds the rest */
            return;
        }
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (struct stop_key){ e->ns, e->key };
}

static void stop_round_build(struct cache *c, struct stop_round *r)
{
    struct index_walk w;
    r->n = 0;
    r->oom = false;
    index_walk_begin(c->index, &w);
    while (index_walk_step(c->index, &w, SIZE_MAX, stop_round_collect, r))
        ;
}

int cache_persist_flush(struct cache *c, unsigned timeout_ms, const char *who)
{
    uint64_t deadline = clock_now_ms() + timeout_ms;
    struct stop_round r = { 0 };
    uint64_t landed = 0, sent_total = 0;
    int rc;

    if (!cache_persisting(c))
        return 0;
    who = who ? who : "";
    /* No more retries on the backoff's schedule: the rounds write them. */
    c->stopping = true;
    cache_retry_forget(c);
    for (;;) {
        uint64_t now = clock_now_ms();
        /* The writes in flight first: each lands, or fails and is sent again. */
        if (persist_drain(c->persist, now < deadline ? (unsigned)(deadline - now) : 0) < 0) {
            rc = -KVNODE_ETIMEDOUT;
            break;
        }
        stop_round_build(c, &r);
        if (r.n == 0) {
            rc = 0;
            break;
        }
        if (c->stop_rounds > 0 && c->stop_landed == landed) {
            now = clock_now_ms();
            if (now >= deadline) {
                rc = -KVNODE_ETIMEDOUT;
                break;
            }
            clock_sleep_ms(deadline - now < STOP_RETRY_PAUSE_MS ? deadline - now : STOP_RETRY_PAUSE_MS);
        }
        if (c->stop_rounds == 0)
            log_info("%sshutdown: writing %zu committed blocks the store lacks (at most %u ms)", who,
                     r.n, timeout_ms);
        landed = c->stop_landed;
        c->stop_rounds++;
        for (size_t i = 0; i < r.n; i++) {
            struct index_entry *e = index_lookup(c->index, r.v[i].ns, r.v[i].key);
            if (e && cache_lacks_copy(e) && e->pins == 0) {
                cache_write_start(c, e, false);
                sent_total++;
            }
        }
    }
    free(r.v);
    if (rc == 0 && c->stop_rounds > 0)
        log_info("%sshutdown: every committed block is in the store (%" PRIu64 " writes in %u rounds)",
                 who, sent_total, c->stop_rounds);
    return rc;
}

/* --- what the stop could not write -------------------------------------------- */

struct stop_count {
    uint64_t total;
    uint64_t *by_ns;     /* by namespace id (NULL: out of memory, total only) */
    uint32_t max_ns;
};

static void stop_count_entry(void *arg, struct index_entry *e)
{
    struct stop_count *sc = arg;
    if (!cache_lacks_copy(e))
        return;
    sc->total++;
    if (sc->by_ns && e->ns <= sc->max_ns)
        sc->by_ns[e->ns]++;
}

uint64_t cache_persist_unwritten(struct cache *c, const char *who)
{
    struct stop_count sc = { 0 };
    struct index_walk w;

    if (!cache_persisting(c))
        return 0;
    who = who ? who : "";
    for (size_t i = 0; i < ns_count(c->namespaces); i++) {
        struct kv_namespace *ns = ns_at(c->namespaces, i);
        if (ns->id > sc.max_ns)
            sc.max_ns = ns->id;
    }
    sc.by_ns = calloc((size_t)sc.max_ns + 1, sizeof *sc.by_ns);
    index_walk_begin(c->index, &w);
    while (index_walk_step(c->index, &w, SIZE_MAX, stop_count_entry, &sc))
        ;
    if (sc.total > 0) {
        c->stop_unwritten += sc.total;
        c->persist_dropped += sc.total;
        log_warn("%sshutdown: %" PRIu64 " committed blocks could not be written to the store "
                 "(%u rounds of writes within server.shutdown_timeout): lost to persistence, counted "
                 "in persist.dropped_total; the store's last error: %s", who, sc.total, c->stop_rounds,
                 persist_last_error(c->persist));
        for (size_t i = 0; sc.by_ns && i < ns_count(c->namespaces); i++) {
            struct kv_namespace *ns = ns_at(c->namespaces, i);
            if (sc.by_ns[ns->id])
                log_warn("%sshutdown: %" PRIu64 " of them in namespace %u (deployment %s, tp_rank %u)",
                         who, sc.by_ns[ns->id], ns->id, ns->deployment_id, ns->layout.tp_rank);
        }
    }
    free(sc.by_ns);
    return sc.total;
}
