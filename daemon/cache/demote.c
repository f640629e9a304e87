/* cache demote: HBM -> host demotion. Past hbm.high_watermark an HBM arena's
 * least recently used unpinned blocks are moved to host slots in batches by
 * the copier, down to the low watermark (see cache.h). A device whose
 * batches fail backs off (DEMOTE_BACKOFF_*), with one warning when the
 * failures begin and one when they end; a device that had a sticky error
 * (devmem_device_down) is down for good: no more batches, its blocks are
 * dropped a pass at a time (ghosts where the store holds them). Loop thread
 * only; the copies run on the copier's workers. */
#include "cache/cache_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/clock.h"
#include "gpu/copier.h"
#include "gpu/hostpin.h"
#include "kvnode.h"
#include "core/log.h"

/* A device's failed batches back off, doubling from first to max. */
#define DEMOTE_BACKOFF_FIRST_MS 10u
#define DEMOTE_BACKOFF_MAX_MS   5000u
/* Blocks of a down device dropped per pass: other events run between. */
#define DEMOTE_DROP_PER_PASS    256u

/* Demotion batches in flight per device: one copying while the next is
 * built keeps the copy engine busy without tying up much host memory. */
#define DEMOTE_INFLIGHT 2u

/* One block of a demotion batch: where it goes in the host arena. */
struct demote_rec {
    struct index_entry *e;
    uint64_t host_off;
    uint32_t host_cls;
    uint64_t stride;                 /* its stride in the HBM arena */
};
struct cache_demote {
    struct copier_batch b;
    struct cache *c;
    unsigned hbm;                    /* index into c->hbm */
    struct demote_rec *recs;
};

/* --- a device down, failures backing off ----------------------------------------- */

bool cache_hbm_entry_down(struct cache *c, const struct index_entry *e)
{
    return e->arena < 32 && (c->hbm_down_mask & (1u << e->arena));
}

/* A sticky error took h's device: said once, with what it costs. */
static void cache_hbm_set_down(struct cache *c, struct cache_hbm *h, const char *why)
{
    struct arena_stats st;
    uint32_t id = arena_id(h->a);

    if (h->down)
        return;
    h->down = true;
    snprintf(h->down_why, sizeof h->down_why, "%s", why);
    if (id < 32)
        c->hbm_down_mask |= 1u << id;
    h->demoting = false;
    arena_get_stats(h->a, &st);
    log_error("GPU %d is down: %s. Its HBM tier is off: the %llu blocks there that were not "
              "demoted are dropped (those in the store stay readable from it), nothing is copied "
              "to or from it and new clients are not lent it; host memory is still served",
              h->device, why, (unsigned long long)st.blocks);
}

/* Devices the backend found down since the last look (an atomic read each). */
static void cache_hbm_check_down(struct cache *c)
{
    char why[256];

    if (!c->devmem)
        return;
    for (unsigned i = 0; i < c->nhbm; i++)
        if (!c->hbm[i].down && devmem_device_down(c->devmem, c->hbm[i].device, why, sizeof why))
            cache_hbm_set_down(c, &c->hbm[i], why);
}

/* Drop a pass of a down device's unpinned blocks (pinned ones come back to
 * the LRU when their pin goes, and cache_unpin schedules the next pass).
 * true when there may be more. */
static bool cache_hbm_drop(struct cache *c, struct cache_hbm *h)
{
    struct index_entry *e;
    unsigned n = 0;

    while (n < DEMOTE_DROP_PER_PASS && (e = index_lru_oldest_in_arena(c->index, arena_id(h->a)))) {
        cache_evict_entry(c, e);
        h->down_dropped++;
        c->hbm_down_dropped++;
        n++;
    }
    return n == DEMOTE_DROP_PER_PASS;
}

/* The timer for the earliest device whose backoff has not ended. */
static void cache_demote_arm_retry(struct cache *c)
{
    uint64_t now = clock_now_ms(), next = 0;

    for (unsigned i = 0; i < c->nhbm; i++) {
        const struct cache_hbm *h = &c->hbm[i];
        if (!h->down && h->retry_at_ms > now && (!next || h->retry_at_ms < next))
            next = h->retry_at_ms;
    }
    evtimer_del(c->demote_retry_ev);
    if (next) {
        struct timeval tv = { (time_t)((next - now) / 1000), (suseconds_t)((next - now) % 1000) * 1000 };
        evtimer_add(c->demote_retry_ev, &tv);
    }
}

void cache_demote_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    (void)fd;
    (void)what;
    cache_demote_maybe_schedule(c);
    cache_demote_arm_retry(c);
}

static void cache_demote_failing(struct cache *c, struct cache_hbm *h, const struct copier_batch *b)
{
    uint64_t now = clock_now_ms();

    c->demote_failed_batches++;
    if (h->failing_batches++ == 0) {
        h->failing_since_ms = now;
        log_warn("demotion from GPU %d is failing: %s; its blocks stay in HBM and batches are "
                 "retried after a backoff (%u ms doubling up to %u s); one more line when it works "
                 "again", h->device, b->why, DEMOTE_BACKOFF_FIRST_MS, DEMOTE_BACKOFF_MAX_MS / 1000u);
    }
    h->failing_blocks += b->n;
    /* A batch sent before the last failure came back: same round. */
    if (now < h->retry_at_ms)
        return;
    h->backoff_ms = !h->backoff_ms ? DEMOTE_BACKOFF_FIRST_MS
                  : h->backoff_ms * 2 > DEMOTE_BACKOFF_MAX_MS ? DEMOTE_BACKOFF_MAX_MS
                  : h->backoff_ms * 2;
    h->retry_at_ms = now + h->backoff_ms;
    cache_demote_arm_retry(c);
}

static void cache_demote_works(struct cache_hbm *h)
{
    if (h->failing_batches > 0)
        log_warn("demotion from GPU %d works again, after %llu failed batches (%llu blocks) over "
                 "%.1f s", h->device, (unsigned long long)h->failing_batches,
                 (unsigned long long)h->failing_blocks,
                 (double)(clock_now_ms() - h->failing_since_ms) / 1000.0);
    h->failing_batches = h->failing_blocks = 0;
    h->backoff_ms = h->retry_at_ms = 0;
}

/* --- demotion (HBM -> host) ------------------------------------------------------ */

/* Over the watermark once the blocks being moved out have left. */
static bool cache_hbm_over(const struct cache_hbm *h, double watermark)
{
    struct arena_stats st;
    arena_get_stats(h->a, &st);
    uint64_t used = st.used_bytes > h->moving_bytes ? st.used_bytes - h->moving_bytes : 0;
    return (double)used > watermark * (double)st.capacity;
}

/* Demotion starts past the high watermark and goes on down to the low one.
 * It ends only with no batch in flight: under the low watermark counts the
 * blocks being moved as gone, and a move a reader or a delete abandons
 * brings them back (which could leave HBM between the watermarks). */
static bool cache_hbm_wants_batch(const struct cache *c, struct cache_hbm *h)
{
    bool over_low = cache_hbm_over(h, c->hbm_low);

    if (h->down)
        return false;
    if (cache_hbm_over(h, c->hbm_high))
        h->demoting = true;
    else if (!over_low && h->inflight == 0)
        h->demoting = false;
    /* Backing off after a failed batch: the retry timer calls again. */
    if (h->retry_at_ms && clock_now_ms() < h->retry_at_ms)
        return false;
    return h->demoting && over_low && h->inflight < DEMOTE_INFLIGHT;
}

/* A down device with blocks still to drop, or one that wants a batch. */
static bool cache_hbm_wants_pass(struct cache *c, struct cache_hbm *h)
{
    if (h->down)
        return index_lru_oldest_in_arena(c->index, arena_id(h->a)) != NULL;
    return c->copier && cache_hbm_wants_batch(c, h);
}

void cache_demote_maybe_schedule(struct cache *c)
{
    if (c->demote_scheduled)
        return;
    cache_hbm_check_down(c);
    for (unsigned i = 0; i < c->nhbm; i++) {
        if (cache_hbm_wants_pass(c, &c->hbm[i])) {
            c->demote_scheduled = true;
            event_active(c->demote_ev, 0, 0);
            return;
        }
    }
}

/* A batch came back: each block whose copy landed and that nobody pinned
 * or deleted meanwhile now lives in its host slot; any other keeps its
 * HBM slot and the host slot goes back. */
static void cache_demote_done(struct copier_batch *b)
{
    struct cache_demote *d = b->arg;
    struct cache *c = d->c;
    struct cache_hbm *h = &c->hbm[d->hbm];

    if (b->rc < 0 && b->rc != -KVNODE_ESHUTDOWN) {
        /* A sticky error takes the device down; anything else backs off. */
        cache_hbm_check_down(c);
        if (!h->down)
            cache_demote_failing(c, h, b);
    } else if (b->rc == 0) {
        cache_demote_works(h);
    }
    for (size_t i = 0; i < b->n; i++) {
        struct demote_rec *r = &d->recs[i];
        struct index_entry *e = r->e;
        h->moving_bytes -= h->moving_bytes >= r->stride ? r->stride : h->moving_bytes;
        if (b->rc == 0 && !e->detached && e->pins == 1 && e->state == ENTRY_SEALED) {
            arena_free(h->a, e->offset);
            e->tier = KVNODE_TIER_HOST;
            e->arena = arena_id(c->host);
            e->cls = r->host_cls;
            e->offset = r->host_off;
            cache_note_demoted(c, e);
            c->demoted++;
            c->demoted_bytes += b->items[i].len;
        } else {
            arena_free(c->host, r->host_off);
            if (b->rc < 0)
                c->demote_failed++;
            else
                c->demote_aborted++;
        }
        cache_unpin(c, e);
    }
    h->inflight--;
    free(d->recs);
    free(b->items);
    free(d);
    cache_evict_maybe_schedule(c);
    cache_demote_maybe_schedule(c);
}

static int demote_rec_by_offset(const void *a, const void *b)
{
    uint64_t x = ((const struct demote_rec *)a)->e->offset, y = ((const struct demote_rec *)b)->e->offset;
    return x < y ? -1 : x > y;
}

/* Build and submit one batch of h's least recently used unpinned blocks,
 * up to hbm.copy_batch_bytes or until h is below its low watermark. The
 * victims get host slots in the order of their HBM offsets, so that runs
 * adjacent in both arenas become one transfer. A victim the host tier has
 * no room for leaves memory (a ghost when the store holds it). true when
 * it submitted a batch or dropped victims (call again while over the
 * watermark), false when nothing more can be done for h now. */
static bool cache_demote_batch(struct cache *c, unsigned hi)
{
    struct cache_hbm *h = &c->hbm[hi];
    size_t cap = 64, n = 0, kept = 0;
    uint64_t bytes = 0;
    bool dropped = false;
    struct cache_demote *d = calloc(1, sizeof *d);
    struct demote_rec *recs = malloc(cap * sizeof *recs);
    struct copier_item *items = NULL;

    if (!d || !recs)
        goto out;
    /* The victims, pinned: off the LRU, alive until the batch is back. */
    while (bytes < c->hbm_batch_bytes && cache_hbm_over(h, c->hbm_low)) {
        struct index_entry *e = index_lru_oldest_in_arena(c->index, arena_id(h->a));
        if (!e)
            break;
        if (n == cap) {
            struct demote_rec *nr = realloc(recs, 2 * cap * sizeof *recs);
            if (!nr)
                break;
            recs = nr;
            cap *= 2;
        }
        recs[n].e = e;
        recs[n].stride = arena_class_stride(h->a, e->cls);
        cache_pin(c, e);
        h->moving_bytes += recs[n].stride;
        bytes += cache_ns_block_bytes(c, e->ns);
        n++;
    }
    qsort(recs, n, sizeof *recs, demote_rec_by_offset);
    items = malloc((n ? n : 1) * sizeof *items);
    for (size_t i = 0; i < n; i++) {
        struct index_entry *e = recs[i].e;
        struct kv_namespace *ns = ns_get(c->namespaces, e->ns);
        uint64_t off;
        if (!items || !ns || !cache_make_room(c, ns->cls) ||
            arena_alloc_near(c->host, ns->cls, h->host_region, &off) < 0) {
            h->moving_bytes -= recs[i].stride;
            cache_unpin(c, e);
            if (items) {
                cache_evict_entry(c, e);
                c->demote_dropped++;
                dropped = true;
            }
            continue;
        }
        recs[kept] = recs[i];
        recs[kept].host_off = off;
        recs[kept].host_cls = ns->cls;
        items[kept].dst = (uint8_t *)arena_base(c->host) + off;
        items[kept].src = cache_slot_ptr(c, e);
        items[kept].len = ns->layout.block_bytes;
        kept++;
    }
    if (kept == 0)
        goto out;   /* dropping victims was progress too: the caller goes on */
    d->c = c;
    d->hbm = hi;
    d->recs = recs;
    d->b.device = h->device;
    d->b.n = kept;
    d->b.items = items;
    /* Transfers split at the host arena's pin chunks: each is wholly
     * pinned or wholly not, however far pinning got. */
    d->b.host_base = arena_base(c->host);
    d->b.host_len = arena_size(c->host);
    d->b.host_chunk = c->hostpin ? hostpin_chunk_bytes(c->hostpin) : 0;
    d->b.done = cache_demote_done;
    d->b.arg = d;
    if (copier_submit(c->copier, &d->b) == 0) {
        h->inflight++;
        return true;
    }
    /* The queue is full: put everything back; a finishing batch retries. */
    for (size_t i = 0; i < kept; i++) {
        h->moving_bytes -= recs[i].stride;
        arena_free(c->host, recs[i].host_off);
        cache_unpin(c, recs[i].e);
    }
out:
    free(d);
    free(items);
    free(recs);
    return dropped;
}

void cache_demote_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache *c = arg;
    (void)fd;
    (void)what;
    c->demote_scheduled = false;
    cache_hbm_check_down(c);
    /* One batch (or drop pass) per device per call: other events run
     * between. Victims a batch puts back (the copier's queue is full, no
     * memory) wait for a finishing batch rather than rescheduling this at
     * once. */
    bool more = false;
    c->demote_building = true;
    for (unsigned i = 0; i < c->nhbm; i++) {
        struct cache_hbm *h = &c->hbm[i];
        if (h->down ? cache_hbm_drop(c, h)
                    : c->copier && cache_hbm_wants_batch(c, h) && cache_demote_batch(c, i))
            more = true;
    }
    c->demote_building = false;
    cache_evict_maybe_schedule(c);
    if (more)
        cache_demote_maybe_schedule(c);
}
