/* cache demote: HBM -> host demotion. Past hbm.high_watermark an HBM arena's
 * least recently used unpinned blocks are moved to host slots in batches by
 * the copier, down to the low watermark (see cache.h). Loop thread only; the
 * copies run on the copier's workers. */
#include "cache/cache_internal.h"

#include <stdlib.h>

#include "gpu/copier.h"
#include "gpu/hostpin.h"
#include "kvnode.h"
#include "core/log.h"

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

    if (cache_hbm_over(h, c->hbm_high))
        h->demoting = true;
    else if (!over_low && h->inflight == 0)
        h->demoting = false;
    return h->demoting && over_low && h->inflight < DEMOTE_INFLIGHT;
}

void cache_demote_maybe_schedule(struct cache *c)
{
    if (c->demote_scheduled || !c->copier)
        return;
    for (unsigned i = 0; i < c->nhbm; i++) {
        if (cache_hbm_wants_batch(c, &c->hbm[i])) {
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

    if (b->rc < 0 && b->rc != -KVNODE_ESHUTDOWN)
        log_warn("demotion of %zu blocks from GPU %d failed: %s (they stay in HBM)", b->n,
                 h->device, b->why);
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
    if (!c->copier)
        return;
    /* One batch per device per call: other events run between batches.
     * Victims a batch puts back (the copier's queue is full, no memory)
     * wait for a finishing batch rather than rescheduling this at once. */
    bool more = false;
    c->demote_building = true;
    for (unsigned i = 0; i < c->nhbm; i++)
        if (cache_hbm_wants_batch(c, &c->hbm[i]) && cache_demote_batch(c, i))
            more = true;
    c->demote_building = false;
    cache_evict_maybe_schedule(c);
    if (more)
        cache_demote_maybe_schedule(c);
}
