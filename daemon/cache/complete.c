/* cache complete: completeness for KVCM — a key sealed in memory in every TP
 * rank of its deployment —, the observer calls when it changes, and the
 * chunked walk over every complete key (see cache.h). Loop thread only. */
#include "cache/cache_internal.h"

#include <stdlib.h>

#include "kvnode.h"

/* --- completeness (a key sealed in memory in every TP rank) ------------------ */

static bool cache_sealed_in(struct cache *c, const struct kv_namespace *ns, int64_t key)
{
    struct index_entry *e = index_lookup(c->index, ns->id, key);
    return e && e->state == ENTRY_SEALED;
}

/* Whether every other rank of ns's deployment holds key sealed in memory
 * (and every rank has a namespace). O(TP size). */
static bool cache_others_sealed(struct cache *c, const struct kv_namespace *ns, int64_t key)
{
    if (ns->ranks < ns->layout.tp_size)
        return false;
    for (const struct kv_namespace *o = ns->sibling; o != ns; o = o->sibling)
        if (!cache_sealed_in(c, o, key))
            return false;
    return true;
}

/* Whether every other rank of ns's deployment holds key in HBM (the key
 * complete). O(TP size). */
static bool cache_others_in_hbm(struct cache *c, const struct kv_namespace *ns, int64_t key)
{
    for (const struct kv_namespace *o = ns->sibling; o != ns; o = o->sibling) {
        struct index_entry *e = index_lookup(c->index, o->id, key);
        if (!e || e->tier != KVNODE_TIER_HBM)
            return false;
    }
    return true;
}

/* The medium of a complete key whose copy in ns is e. */
static int cache_key_medium(struct cache *c, const struct kv_namespace *ns, const struct index_entry *e)
{
    return e->tier == KVNODE_TIER_HBM && cache_others_in_hbm(c, ns, e->key) ? CACHE_MEDIUM_HBM
                                                                            : CACHE_MEDIUM_HOST;
}

/* e has just become SEALED in memory: the key may now be complete. */
void cache_note_sealed(struct cache *c, const struct index_entry *e)
{
    struct kv_namespace *ns;
    if (!c->observer || !(ns = ns_get(c->namespaces, e->ns)))
        return;
    if (cache_others_sealed(c, ns, e->key))
        c->observer(c->observer_arg, ns, e->key, cache_key_medium(c, ns, e));
}

/* e (SEALED) is about to leave memory: a complete key stops being one. */
void cache_note_leaving(struct cache *c, const struct index_entry *e)
{
    struct kv_namespace *ns;
    if (!c->observer || e->state != ENTRY_SEALED || !(ns = ns_get(c->namespaces, e->ns)))
        return;
    if (cache_others_sealed(c, ns, e->key))
        c->observer(c->observer_arg, ns, e->key, CACHE_MEDIUM_NONE);
}

/* e (SEALED) has just moved from HBM to host memory: a complete key whose
 * every copy was in HBM changes medium. */
void cache_note_demoted(struct cache *c, const struct index_entry *e)
{
    struct kv_namespace *ns;
    if (!c->observer || e->state != ENTRY_SEALED || !(ns = ns_get(c->namespaces, e->ns)))
        return;
    if (cache_others_sealed(c, ns, e->key) && cache_others_in_hbm(c, ns, e->key))
        c->observer(c->observer_arg, ns, e->key, CACHE_MEDIUM_HOST);
}

/* A HELLO bound ns: tell when every rank of its deployment has a client. */
void cache_note_bound(struct cache *c, const struct kv_namespace *ns)
{
    if (!c->dep_observer || ns->ranks < ns->layout.tp_size)
        return;
    for (const struct kv_namespace *o = ns->sibling; o != ns; o = o->sibling)
        if (o->clients == 0)
            return;
    c->dep_observer(c->observer_arg, ns);
}

void cache_set_block_observer(struct cache *c, cache_block_fn fn, cache_deployment_fn dep_fn,
                              void *arg)
{
    c->observer = fn;
    c->dep_observer = dep_fn;
    c->observer_arg = arg;
}

bool cache_key_complete(struct cache *c, const struct kv_namespace *ns, int64_t key)
{
    return cache_sealed_in(c, ns, key) && cache_others_sealed(c, ns, key);
}

/* The ring member that reports a deployment's keys: the lowest id. */
static const struct kv_namespace *cache_ring_leader(const struct kv_namespace *ns)
{
    const struct kv_namespace *best = ns;
    for (const struct kv_namespace *o = ns->sibling; o != ns; o = o->sibling)
        if (o->id < best->id)
            best = o;
    return best;
}

/* A chunked walk over the index reporting every complete key once. */
#define WALK_BUCKETS_PER_STEP 4096u
struct cache_walk {
    struct cache *c;
    struct index_walk iw;
    struct event *ev;
    cache_key_fn fn;
    void (*done)(void *arg);
    void *arg;
};

static void cache_walk_visit(void *arg, struct index_entry *e)
{
    struct cache_walk *w = arg;
    struct kv_namespace *ns;
    if (e->state != ENTRY_SEALED || !(ns = ns_get(w->c->namespaces, e->ns)))
        return;
    if (cache_ring_leader(ns) == ns && cache_others_sealed(w->c, ns, e->key))
        w->fn(w->arg, ns, e->key, cache_key_medium(w->c, ns, e));
}

static void cache_walk_step_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache_walk *w = arg;
    (void)fd;
    (void)what;
    /* One step per loop iteration: requests interleave with the walk. */
    if (index_walk_step(w->c->index, &w->iw, WALK_BUCKETS_PER_STEP, cache_walk_visit, w)) {
        event_active(w->ev, 0, 0);
        return;
    }
    void (*done)(void *) = w->done;
    void *darg = w->arg;
    event_free(w->ev);
    free(w);
    done(darg);
}

int cache_walk_complete(struct cache *c, cache_key_fn fn, void (*done)(void *arg), void *arg,
                        struct cache_walk **out)
{
    struct cache_walk *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w)
        return -KVNODE_ENOMEM;
    w->ev = event_new(c->base, -1, 0, cache_walk_step_cb, w);
    if (!w->ev) {
        free(w);
        return -KVNODE_ENOMEM;
    }
    w->c = c;
    w->fn = fn;
    w->done = done;
    w->arg = arg;
    index_walk_begin(c->index, &w->iw);
    event_active(w->ev, 0, 0);
    *out = w;
    return 0;
}

void cache_walk_cancel(struct cache *c, struct cache_walk *w)
{
    if (!w)
        return;
    index_walk_end(c->index, &w->iw);
    event_free(w->ev);
    free(w);
}
