/* cache purge: drop every block of some deployments — memory (host and
 * HBM), the index (ghosts too) and the store — by a chunked walk of the
 * index, one step per loop iteration (see cache.h). Loop thread only. */
#include "cache/cache_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/errmsg.h"
#include "kvnode.h"
#include "core/log.h"
#include "persist/persist.h"

#define PURGE_BUCKETS_PER_STEP 4096u
/* Purges running at once in one cache (a tenant's): each walks the whole
 * index a step per loop iteration, so a client that starts one, hangs up
 * and starts another cannot pile them up. */
#define PURGES_MAX 8u

/* A key the walk found, acted on after its step (a walk's visit may not
 * unlink entries). */
struct purge_key {
    uint32_t ns;
    int64_t key;
    uint64_t check;
};

struct cache_purge {
    struct cache *c;
    struct cache_purge *next;       /* c->purges */
    struct index_walk iw;
    struct event *ev;
    bool walking;
    uint8_t *sel;                   /* by namespace id: 1 when purged */
    uint32_t sel_len;
    struct purge_key *found;
    size_t nfound, capfound;
    bool oom;                       /* some key could not be noted: its block stays */
    int64_t pending;                /* store deletes not back (signed: see cache_purge_store) */
    struct cache_purge_result res;
    cache_purge_fn done;            /* NULL once detached */
    void *arg;
};

static void purge_visit(void *arg, struct index_entry *e)
{
    struct cache_purge *p = arg;

    if (e->ns >= p->sel_len || !p->sel[e->ns])
        return;
    /* Being written, not a former ghost: its lease drops it at commit. */
    if (e->state == ENTRY_WRITING && e->persist != PERSIST_STORED)
        return;
    if (p->nfound == p->capfound) {
        size_t cap = p->capfound ? p->capfound * 2 : 256;
        struct purge_key *f = realloc(p->found, cap * sizeof *f);
        if (!f) {
            p->oom = true;
            return;
        }
        p->found = f;
        p->capfound = cap;
    }
    p->found[p->nfound++] = (struct purge_key){ .ns = e->ns, .key = e->key, .check = e->check };
}

static void purge_store_done(void *arg, int rc)
{
    struct cache_purge *p = arg;
    if (rc < 0 && rc != KVS_MISS)
        p->res.store_failed++;
    p->pending--;
    cache_purge_maybe_done(p->c, p);
}

/* The keys of one namespace found in a step: out of the index, then out of
 * the store in order behind the ops on them. */
static void purge_namespace_keys(struct cache_purge *p, struct kv_namespace *ns, int64_t *keys,
                                 uint64_t *checks, size_t n)
{
    struct cache *c = p->c;
    size_t m = 0;

    for (size_t i = 0; i < n; i++) {
        struct index_entry *e = index_lookup(c->index, ns->id, keys[i]);
        if (!e || e->check != checks[i])
            continue;
        if (e->state == ENTRY_WRITING) {
            /* A re-put of a ghost (no longer counted in stored since its
             * put began): its abort or dropped commit must not bring the
             * ghost back; the store's copy goes below. */
            e->persist = PERSIST_NONE;
        } else {
            cache_remove_entry(c, e);
            p->res.blocks++;
        }
        keys[m] = keys[i];
        checks[m++] = checks[i];
    }
    if (!c->persist || m == 0)
        return;
    persist_hide(c->persist, ns, keys, checks, m);
    p->pending++;   /* holds the count above 0 while the ops start (some finish at once) */
    p->pending += (int64_t)cache_store_delete_tracked(c, ns, keys, checks, m, purge_store_done, p);
    p->pending--;
}

static int purge_key_cmp(const void *a, const void *b)
{
    uint32_t x = ((const struct purge_key *)a)->ns, y = ((const struct purge_key *)b)->ns;
    return (x > y) - (x < y);
}

/* After a step: the keys found, namespace by namespace (sorted by namespace:
 * a step's own keys, never the whole registry). */
static void purge_apply(struct cache_purge *p)
{
    if (p->nfound == 0)
        return;
    int64_t *keys = malloc(p->nfound * sizeof *keys);
    uint64_t *checks = malloc(p->nfound * sizeof *checks);

    if (!keys || !checks) {
        p->oom = true;
        free(keys);
        free(checks);
        p->nfound = 0;
        return;
    }
    qsort(p->found, p->nfound, sizeof *p->found, purge_key_cmp);
    for (size_t i = 0; i < p->nfound;) {
        uint32_t id = p->found[i].ns;
        struct kv_namespace *ns = ns_get(p->c->namespaces, id);
        size_t n = 0;
        for (; i < p->nfound && p->found[i].ns == id; i++) {
            keys[n] = p->found[i].key;
            checks[n++] = p->found[i].check;
        }
        if (ns)
            purge_namespace_keys(p, ns, keys, checks, n);
    }
    p->nfound = 0;
    free(keys);
    free(checks);
}

static void purge_free(struct cache *c, struct cache_purge *p)
{
    for (struct cache_purge **pp = &c->purges; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    if (p->walking)
        index_walk_end(c->index, &p->iw);
    if (p->ev)
        event_free(p->ev);
    for (uint32_t id = 1; id < p->sel_len; id++) {
        struct kv_namespace *ns = p->sel[id] ? ns_get(c->namespaces, id) : NULL;
        if (ns && ns->refs > 0)
            ns->refs--;
    }
    free(p->sel);
    free(p->found);
    free(p);
}

void cache_purge_maybe_done(struct cache *c, struct cache_purge *p)
{
    if (p->walking || p->pending > 0)
        return;
    if (p->oom) {
        log_warn("purge: out of memory noting keys; some blocks of the purged deployments stay");
        p->res.store_failed++;
    }
    cache_purge_fn done = p->done;
    void *arg = p->arg;
    struct cache_purge_result res = p->res;
    purge_free(c, p);
    if (done)
        done(arg, &res);
}

/* At the walk's end: a store that may hold blocks the index never knew
 * (redis) removes every block of each purged namespace too. */
static void purge_store_namespaces(struct cache_purge *p)
{
    struct cache *c = p->c;
    if (!persist_can_purge(c->persist))
        return;
    for (uint32_t id = 1; id < p->sel_len; id++) {
        struct kv_namespace *ns = p->sel[id] ? ns_get(c->namespaces, id) : NULL;
        if (!ns)
            continue;
        p->pending++;
        if (persist_purge(c->persist, ns, purge_store_done, p) < 0) {
            p->pending--;
            p->res.store_failed++;
        }
    }
}

static void purge_step_cb(evutil_socket_t fd, short what, void *arg)
{
    struct cache_purge *p = arg;
    (void)fd;
    (void)what;
    /* One step per loop iteration: other clients' requests interleave. */
    bool more = index_walk_step(p->c->index, &p->iw, PURGE_BUCKETS_PER_STEP, purge_visit, p);
    if (!more)
        p->walking = false;
    /* Removing entries while the walk is open is allowed between steps
     * (the table does not grow or rehash while a walk is open). */
    purge_apply(p);
    if (more) {
        event_active(p->ev, 0, 0);
        return;
    }
    purge_store_namespaces(p);
    cache_purge_maybe_done(p->c, p);
}

int cache_purge_start(struct cache *c, const struct cache_purge_sel *sel, cache_purge_fn done,
                      void *arg, struct cache_purge **out, char *err, size_t errlen)
{
    size_t count = ns_count(c->namespaces), running = 0;
    struct cache_purge *p;

    *out = NULL;
    for (struct cache_purge *q = c->purges; q; q = q->next)
        running++;
    if (running >= PURGES_MAX) {
        errmsg_set(err, errlen, "purge: %zu purges are running in this tenant already (at most %u at "
                   "once); try again when one has answered", running, PURGES_MAX);
        return -KVNODE_ELIMIT;
    }
    p = calloc(1, sizeof *p);
    if (!p || !(p->sel = calloc(count + 1, 1))) {
        free(p);
        errmsg_set(err, errlen, "out of memory starting a purge");
        return -KVNODE_ENOMEM;
    }
    p->c = c;
    p->sel_len = (uint32_t)(count + 1);
    p->done = done;
    p->arg = arg;
    for (size_t i = 0; i < count; i++) {
        struct kv_namespace *ns = ns_at(c->namespaces, i);
        bool hit = sel->deployment_id ? strcmp(ns->deployment_id, sel->deployment_id) == 0
                                      : strncmp(ns->layout.model, sel->model, NS_MODEL_MAX) == 0;
        /* An idle record reused for nothing yet has no layout. */
        if (!hit || !ns->layout.model[0])
            continue;
        p->sel[ns->id] = 1;
        ns->refs++;     /* its record is not reused for another namespace meanwhile */
        /* Write leases of it begun before now seal nothing (cache_put_seal). */
        ns->purges++;
        p->res.namespaces++;
    }
    p->ev = event_new(c->base, -1, 0, purge_step_cb, p);
    if (!p->ev) {
        free(p->sel);
        free(p);
        errmsg_set(err, errlen, "out of memory starting a purge");
        return -KVNODE_ENOMEM;
    }
    index_walk_begin(c->index, &p->iw);
    p->walking = true;
    p->next = c->purges;
    c->purges = p;
    event_active(p->ev, 0, 0);
    *out = p;
    return 0;
}

void cache_purge_detach(struct cache *c, struct cache_purge *p)
{
    (void)c;
    if (p)
        p->done = NULL;
}

void cache_purge_destroy_all(struct cache *c)
{
    /* The stop: walks end here; deletes the store still owes call back
     * into records that stay until then (or leak with the process). */
    for (struct cache_purge *p = c->purges, *next; p; p = next) {
        next = p->next;
        p->done = NULL;
        if (p->walking)
            index_walk_end(c->index, &p->iw);
        p->walking = false;
        if (p->ev)
            event_free(p->ev);
        p->ev = NULL;
        if (p->pending <= 0)
            purge_free(c, p);
    }
}
