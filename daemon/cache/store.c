/* cache store: the glue to the persistent store — writes and deletes in
 * order per key (write-behind, the store queue's back-pressure), a commit's
 * writes released together, retries of failed writes and the store's write
 * probe (see cache.h; what a read fetches from the store — lookups, reads
 * and promotions — and recovery from a scan are promote.c, the stop's flush
 * is stop.c). Loop thread only; the store's calls run on its workers
 * (persist.h). */
#include "cache/cache_internal.h"

#include <stdlib.h>

#include "core/clock.h"
#include "kvnode.h"
#include "core/log.h"
#include "persist/persist.h"

/* A block stays pinned while it is written to the store (its slot is read
 * by a worker), so writes in flight may pin at most this fraction of the
 * host tier: the rest stays evictable and a burst of puts never fails for
 * want of room. A write-through block over the budget is written when the
 * evictor picks it instead (like write_back), and counted. */
#define WRITE_PIN_FRACTION 0.5


/* --- store operations: writes and deletes, in order per key ------------------- */

static void cache_retry_add(struct cache *c, const struct index_entry *e);
static void cache_retry_now(struct cache *c);

/* Write-back victims may pin at most this much of the host tier while they
 * are written (the rest stays evictable). */
bool cache_write_budget(const struct cache *c, uint64_t bytes)
{
    return (double)(c->writing_bytes + bytes) <= WRITE_PIN_FRACTION * (double)arena_size(c->host);
}

/* Whether committed blocks are written to the store at all. */
bool cache_persisting(const struct cache *c)
{
    return c->persist && c->policy != CONFIG_POLICY_OFF;
}

/* A block leaves memory: one the store never got a copy of is lost to
 * persistence, and counted as such (the README's contract). */
void cache_count_unwritten(struct cache *c, const struct index_entry *e)
{
    if (cache_persisting(c) && e->persist != PERSIST_STORED)
        c->persist_dropped++;
}

static struct cache_storeop *cache_storeop_new(struct cache *c, int kind, struct kv_namespace *ns,
                                               size_t n)
{
    struct cache_storeop *op = calloc(1, sizeof *op + n * (sizeof op->keys[0] + sizeof *op->checks));
    if (!op)
        return NULL;
    op->checks = (uint64_t *)(op->keys + n);
    op->c = c;
    op->kind = kind;
    op->ns = ns;
    op->n = n;
    ns->refs++;
    return op;
}

void cache_storeop_free(struct cache_storeop *op)
{
    op->ns->refs--;
    free(op);
}

static void cache_storeops_drain(struct cache *c);

/* A write's result, or -KVNODE_ESHUTDOWN when it ends without one (the block
 * was deleted before its turn, or the daemon stops). */
static void cache_write_finish(struct cache *c, struct cache_storeop *op, int rc)
{
    struct index_entry *e = op->e;
    uint64_t bb = op->ns->layout.block_bytes;
    bool detached = e->detached, evict = op->evicting;

    c->writing_bytes -= c->writing_bytes >= bb ? bb : c->writing_bytes;
    if (op->probe)
        c->probe_writing = false;
    if (rc == 0 && c->stopping)
        c->stop_landed++;
    if (evict) {
        c->evicting_bytes -= c->evicting_bytes >= bb ? bb : c->evicting_bytes;
        e->evicting = 0;
    }
    /* The block is marked stored only by its own write: a delete or a
     * re-put since then has its own entry and its own, later, store op. */
    if (!detached) {
        e->persist = rc == 0 ? PERSIST_STORED : PERSIST_FAILED;
        if (rc < 0 && rc != -KVNODE_ESHUTDOWN)
            cache_retry_add(c, e);
    }
    cache_unpin(c, e);
    /* A write-back victim leaves memory now that its copy landed (or, if the
     * write failed, is dropped while memory is still tight). */
    if (!detached && evict && e->pins == 0 && e->state == ENTRY_SEALED) {
        if (rc == 0) {
            cache_to_ghost(c, e);
        } else if (cache_over(c, c->low_watermark)) {
            cache_count_unwritten(c, e);
            cache_drop_entry(c, e);
            c->evicted_dropped++;
        }
    }
    if (op->group)
        cache_write_group_done(c, op->group);
}

/* An op is done with the store (or will never reach it): release its keys
 * (which starts each key's next op), then let queued ops and waiting puts
 * go on. */
static void cache_storeop_finish(struct cache_storeop *op, int rc)
{
    struct cache *c = op->c;

    if (op->kind == STORE_OP_WRITE) {
        cache_write_finish(c, op, rc);
        if (rc == 0) {
            /* The store takes writes: retry failed ones now, not at the backoff's time. */
            c->retry_backoff_ms = 0;
            cache_retry_now(c);
        }
    }
    for (size_t i = 0; i < op->n; i++)
        keylock_release(c->keylocks, op->ns->id, op->keys[i]);
    void (*done)(void *, int) = op->done;
    void *done_arg = op->done_arg;
    cache_storeop_free(op);
    if (done)
        done(done_arg, rc);
    cache_storeops_drain(c);
    cache_evict_maybe_schedule(c);
    /* Puts waiting for room try again once per loop iteration, however
     * many ops finish in it. */
    if (c->put_waiters)
        event_active(c->put_wake_ev, 0, 0);
}

static void cache_storeop_done(void *arg, int rc)
{
    cache_storeop_finish(arg, rc);
}

/* Hand an op whose keys it holds to the store. 0 when sent (or finished:
 * a write of a block deleted meanwhile is not sent), -KVNODE_ELIMIT when the
 * store's queue is full (the op keeps its keys; the caller queues it). */
static int cache_storeop_send(struct cache_storeop *op)
{
    struct cache *c = op->c;
    int rc;

    if (op->kind == STORE_OP_DELETE) {
        rc = persist_delete(c->persist, op->ns, op->keys, op->checks, op->n, cache_storeop_done, op);
    } else if (op->e->detached) {
        rc = -KVNODE_ESHUTDOWN;   /* deleted before its turn: nothing to write */
    } else {
        struct index_entry *e = op->e;
        struct cache_hbm *h = cache_hbm_of(c, e);
        struct persist_write_req w = { .ns = op->ns, .key = e->key, .check = e->check,
                                       .data = cache_slot_ptr(c, e), .len = op->ns->layout.block_bytes,
                                       .done = cache_storeop_done, .arg = op };
        /* An HBM block is copied out by the worker, never read by the loop. */
        if (op->probe)
            rc = persist_write_probe(c->persist, &w, h && c->devmem ? c->devmem : NULL,
                                     h ? h->device : -1);
        else if (h && c->devmem)
            rc = persist_write_device(c->persist, &w, c->devmem, h->device);
        else
            rc = persist_write(c->persist, &w);
    }
    if (rc == -KVNODE_ELIMIT)
        return rc;
    if (rc < 0)
        cache_storeop_finish(op, rc);
    return 0;
}

static void cache_storeop_queue(struct cache *c, struct cache_storeop *op)
{
    op->next = NULL;
    if (c->queued_tail)
        c->queued_tail->next = op;
    else
        c->queued_head = op;
    c->queued_tail = op;
    c->queued_ops++;
    if (op->kind == STORE_OP_WRITE)
        c->writes_deferred++;
}

/* Send or queue an op that holds its keys. */
static void cache_storeop_go(struct cache *c, struct cache_storeop *op)
{
    /* Behind ops already waiting for the queue: the store sees them first. */
    if (c->queued_head || cache_storeop_send(op) == -KVNODE_ELIMIT)
        cache_storeop_queue(c, op);
}

/* Ops the store's queue refused, sent again, in order, as it drains. */
static void cache_storeops_drain(struct cache *c)
{
    if (c->draining)
        return;
    c->draining = true;
    while (c->queued_head) {
        struct cache_storeop *op = c->queued_head;
        c->queued_head = op->next;
        if (!c->queued_head)
            c->queued_tail = NULL;
        c->queued_ops--;
        if (cache_storeop_send(op) == -KVNODE_ELIMIT) {
            op->next = c->queued_head;
            c->queued_head = op;
            if (!c->queued_tail)
                c->queued_tail = op;
            c->queued_ops++;
            break;
        }
    }
    c->draining = false;
}

/* A waiting op's turn came: it holds its key now. */
static void cache_storeop_turn(struct keylock_waiter *w)
{
    struct cache_storeop *op = (struct cache_storeop *)w;
    cache_storeop_go(op->c, op);
}

/* Take op's (single) key and send it, or wait behind the key's earlier ops. */
static void cache_storeop_start(struct cache *c, struct cache_storeop *op)
{
    op->turn.start = cache_storeop_turn;
    int rc = keylock_acquire(c->keylocks, op->ns->id, op->keys[0], &op->turn);
    if (rc == 1)
        cache_storeop_go(c, op);
    else if (rc < 0)
        cache_storeop_finish(op, rc);   /* releases a key it does not hold: harmless */
}

/* A commit's writes, released together (cache_internal.h). */
struct cache_write_group {
    uint32_t pending;               /* writes not back, +1 until the commit has added them all */
    size_t n;
    struct index_entry *e[];        /* pinned by the group */
};

/* Write a SEALED block to the store: it is pinned (in memory, off the LRU)
 * until the write's result is back, however long it waits for earlier ops
 * on its key or for room in the store's queue. probe: the store's write
 * probe (its result is counted as the probe's). */
static void cache_write_op(struct cache *c, struct index_entry *e, bool evicting, bool probe,
                           struct cache_write_group *group)
{
    struct kv_namespace *ns = ns_get(c->namespaces, e->ns);
    struct cache_storeop *op;

    /* HBM of a device that is down cannot be read: the block is lost (and
     * dropped by demote.c), not a store failure. */
    if (cache_hbm_entry_down(c, e)) {
        e->persist = PERSIST_FAILED;
        return;
    }
    op = ns ? cache_storeop_new(c, STORE_OP_WRITE, ns, 1) : NULL;
    if (!op) {
        e->persist = PERSIST_FAILED;
        cache_retry_add(c, e);
        return;
    }
    if (group) {
        cache_pin(c, e);            /* the group's pin, dropped when the whole commit is back */
        group->e[group->n++] = e;
        group->pending++;
        op->group = group;
    }
    op->e = e;
    op->keys[0] = e->key;
    op->evicting = evicting;
    op->probe = probe;
    if (probe)
        c->probe_writing = true;
    e->persist = PERSIST_WRITING;
    cache_pin(c, e);
    c->writing_bytes += ns->layout.block_bytes;
    if (evicting) {
        e->evicting = 1;
        c->evicting_bytes += ns->layout.block_bytes;
        c->writeback_started++;
    }
    cache_storeop_start(c, op);
}

void cache_write_start(struct cache *c, struct index_entry *e, bool evicting)
{
    cache_write_op(c, e, evicting, false, NULL);
}

/* --- a commit's writes, released together ------------------------------------------ */

struct cache_write_group *cache_write_group_new(size_t n)
{
    struct cache_write_group *g = malloc(sizeof *g + n * sizeof g->e[0]);
    if (g) {
        g->pending = 1;
        g->n = 0;
    }
    return g;
}

void cache_write_group_add(struct cache *c, struct cache_write_group *g, struct index_entry *e)
{
    cache_write_op(c, e, false, false, g);
}

void cache_write_group_done(struct cache *c, struct cache_write_group *g)
{
    if (--g->pending > 0)
        return;
    /* Each goes back to the place its last use gave it (index_lru_add). */
    for (size_t i = 0; i < g->n; i++)
        cache_unpin(c, g->e[i]);
    free(g);
}

/* Delete keys from the store, each after the ops on it that came before:
 * the keys free now go in one request, the others one by one in turn. */
size_t cache_store_delete_tracked(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                                  const uint64_t *checks, size_t n, void (*done)(void *arg, int rc),
                                  void *arg)
{
    struct cache_storeop *batch = cache_storeop_new(c, STORE_OP_DELETE, ns, n);
    size_t ops = 0;

    if (!batch) {
        log_warn("out of memory deleting %zu keys from the store: their copies stay", n);
        return 0;
    }
    batch->n = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = keylock_acquire(c->keylocks, ns->id, keys[i], NULL);
        if (rc == 1) {
            batch->checks[batch->n] = cache_check_at(checks, i);
            batch->keys[batch->n++] = keys[i];
            continue;
        }
        struct cache_storeop *one = rc == 0 ? cache_storeop_new(c, STORE_OP_DELETE, ns, 1) : NULL;
        if (!one) {
            log_warn("out of memory deleting a key from the store: its copy stays");
            continue;
        }
        one->keys[0] = keys[i];
        one->checks[0] = cache_check_at(checks, i);
        one->done = done;
        one->done_arg = arg;
        ops++;
        cache_storeop_start(c, one);   /* busy: waits for its turn */
    }
    if (batch->n == 0) {
        cache_storeop_free(batch);
    } else {
        batch->done = done;
        batch->done_arg = arg;
        ops++;
        cache_storeop_go(c, batch);
    }
    return ops;
}

void cache_store_delete(struct cache *c, struct kv_namespace *ns, const int64_t *keys,
                        const uint64_t *checks, size_t n)
{
    cache_store_delete_tracked(c, ns, keys, checks, n, NULL, NULL);
}

/* --- retries of failed writes ------------------------------------------------------ */

#define RETRY_FIRST_MS 500u
#define RETRY_MAX_MS   10000u
#define RETRY_BATCH    256u

static void cache_retry_arm(struct cache *c)
{
    if (!c->retry_ev || evtimer_pending(c->retry_ev, NULL))
        return;
    struct timeval tv = clock_tv_ms(c->retry_backoff_ms ? c->retry_backoff_ms : RETRY_FIRST_MS);
    evtimer_add(c->retry_ev, &tv);
}

/* A write landed: the blocks waiting for a retry go at once (in batches). */
static void cache_retry_now(struct cache *c)
{
    if (!c->retry_ev || !c->retry_head)
        return;
    evtimer_del(c->retry_ev);
    struct timeval now = { 0, 0 };
    evtimer_add(c->retry_ev, &now);
}

static void cache_retry_add(struct cache *c, const struct index_entry *e)
{
    if (c->stopping)
        return;   /* the stop's rounds write every block that lacks a copy */
    struct cache_retry *r = malloc(sizeof *r);
    if (!r)
        return;   /* it stays FAILED: written only if the evictor or a flush picks it */
    r->ns = e->ns;
    r->key = e->key;
    r->next = NULL;
    if (c->retry_tail)
        c->retry_tail->next = r;
    else
        c->retry_head = r;
    c->retry_tail = r;
    c->retry_pending++;
    cache_retry_arm(c);
}

/* The next block on the retry list that still waits for its write (in
 * memory, its write failed), taken off the list; NULL when none is left. */
static struct index_entry *cache_retry_take(struct cache *c)
{
    while (c->retry_head) {
        struct cache_retry *r = c->retry_head;
        c->retry_head = r->next;
        if (!c->retry_head)
            c->retry_tail = NULL;
        c->retry_pending--;
        struct index_entry *e = index_lookup(c->index, r->ns, r->key);
        free(r);
        if (e && e->state == ENTRY_SEALED && e->persist == PERSIST_FAILED && cache_persisting(c))
            return e;
    }
    return NULL;
}

void cache_retry_forget(struct cache *c)
{
    while (c->retry_head) {
        struct cache_retry *r = c->retry_head;
        c->retry_head = r->next;
        free(r);
    }
    c->retry_tail = NULL;
    c->retry_pending = 0;
    if (c->retry_ev)
        evtimer_del(c->retry_ev);
}

/* The store's write probe (persist_set_write_probe): while its writes fail,
 * the oldest block waiting for a retry is written, one at a time. */
static bool cache_write_probe(void *arg)
{
    struct cache *c = arg;
    if (c->probe_writing)
        return true;
    struct index_entry *e = cache_retry_take(c);
    if (!e)
        return false;
    c->write_retries++;
    cache_write_op(c, e, false, true, NULL);
    return true;
}

/* Write again up to a batch of the blocks whose write failed and that are
 * still in memory; back off (doubling) while writes keep failing. While the
 * store is degraded by failed writes, its probe writes them one at a time
 * instead, and the first that lands sends the rest at once. */
void cache_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    unsigned sent = 0;
    (void)fd;
    (void)what;

    if (persist_writes_failing(c->persist))
        return;   /* the probe's turn; a landed write calls us again */
    struct index_entry *e;
    while (sent < RETRY_BATCH && (e = cache_retry_take(c)) != NULL) {
        c->write_retries++;
        cache_write_start(c, e, false);
        sent++;
    }
    if (sent == 0 && !c->retry_head) {
        /* Nothing failed is left in memory: the store's health is its probe's call. */
        persist_write_failures_settled(c->persist);
        c->retry_backoff_ms = 0;
        return;
    }
    uint64_t b = c->retry_backoff_ms ? c->retry_backoff_ms * 2 : RETRY_FIRST_MS;
    c->retry_backoff_ms = b > RETRY_MAX_MS ? RETRY_MAX_MS : b;
    if (c->retry_head)
        cache_retry_arm(c);
}

void cache_set_persist(struct cache *c, struct persist *p)
{
    c->persist = p;
    if (p)
        persist_set_write_probe(p, cache_write_probe, c);
}
