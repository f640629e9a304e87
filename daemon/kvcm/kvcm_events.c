/* kvcm_events: the loop side of the KVCM publisher -- deployments seen
 * for the first time, completeness events into the bounded queue (a mutex
 * held for O(1)), the resync walk the publisher asks for, and the node
 * status the heartbeat reports. Loop thread only. */
#include "kvcm/kvcm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "cache/cache.h"
#include "config/kvcm_config.h"
#include "kvcm/keyset.h"
#include "core/log.h"

/* --- loop side ------------------------------------------------------------------ */

static struct kvcm_dep *kvcm_dep_new(struct kvcm *k, const struct kv_namespace *ns)
{
    struct kvcm_dep *d = calloc(1, sizeof *d);
    struct config_kvcm_vars v = {
        .model = ns->layout.model, .dtype = ns->layout.dtype,
        .block_tokens = ns->layout.block_tokens, .tp_size = ns->layout.tp_size,
        .fingerprint = ns->fingerprint, .host_ip_port = k->st.host_ip_port,
        .block_bytes = ns->layout.block_bytes * ns->layout.tp_size, .key = 0,
    };
    if (!d)
        return NULL;
    d->fingerprint = ns->fingerprint;
    d->layout = ns->layout;
    snprintf(d->deployment_id, sizeof d->deployment_id, "%s", ns->deployment_id);
    d->spec_bytes = v.block_bytes;
    d->uri_per_key = strstr(k->st.location_uri_template, "{key}") != NULL;
    bool ok = config_kvcm_expand(k->st.instance_id_template, &v, d->instance_id,
                                 sizeof d->instance_id) >= 0 &&
              config_kvcm_expand(k->st.spec_name_template, &v, d->spec_name, sizeof d->spec_name) >= 0;
    for (int m = MED_HBM; ok && m < MED_COUNT; m++) {
        v.medium = k->medium_name[m];
        ok = config_kvcm_expand(k->st.location_uri_template, &v, d->uri[m], sizeof d->uri[m]) >= 0;
    }
    if (!ok) {
        log_error("kvcm: deployment %s: a template does not expand (too long?); not published",
                  ns->deployment_id);
        free(d);
        return NULL;
    }
    keyset_init(&d->mirror);
    keyset_init(&d->pending);
    d->need_snapshot = true;
    return d;
}

/* The deployment index of ns, registering it on first sight (under mu). A
 * deployment whose instance id another deployment already publishes under
 * is refused: KVCM would take the two for one reporter, and each snapshot
 * would erase the other's blocks. (Tenants' deployments of one layout
 * differ in the fingerprint, which includes the tenant.) */
static int kvcm_dep_index(struct kvcm *k, const struct kv_namespace *ns)
{
    /* The fingerprint finds it; equal fields confirm it, so that even two
     * deployments whose fingerprints met (a 64-bit hash) stay two, and the
     * second is refused below for its instance id. */
    for (size_t i = 0; i < k->ndeps; i++)
        if (k->deps[i]->fingerprint == ns->fingerprint &&
            ns_same_deployment(&k->deps[i]->layout, &ns->layout))
            return (int)i;
    if (k->ndeps >= KVCM_MAX_DEPLOYMENTS)
        return -1;
    struct kvcm_dep *d = kvcm_dep_new(k, ns);
    if (!d)
        return -1;
    for (size_t i = 0; i < k->ndeps && !d->refused; i++) {
        if (strcmp(k->deps[i]->instance_id, d->instance_id) != 0)
            continue;
        snprintf(d->refused_text, sizeof d->refused_text,
                 "deployment %s maps to instance id %s, already in use by deployment %s: not "
                 "publishing %s (put {fingerprint} in [kvcm] instance_id)", d->deployment_id,
                 d->instance_id, k->deps[i]->deployment_id, d->deployment_id);
        d->refused = d->refused_text;
        d->failed_terminal = true;   /* before the publisher ever sees it */
        snprintf(k->last_error, sizeof k->last_error, "%.*s", (int)sizeof k->last_error - 1,
                 d->refused_text);
        if (k->state != KVCM_STATE_STOPPED)
            k->state = KVCM_STATE_DEGRADED;
        log_error("kvcm: %s", d->refused_text);
    }
    k->deps[k->ndeps] = d;
    if (!d->refused)
        log_info("kvcm: deployment %s publishes as instance %s (spec %s, %" PRIu64 " bytes per block)",
                 ns->deployment_id, d->instance_id, d->spec_name, d->spec_bytes);
    k->deps_added = true;
    kvcm_work_arrived(k);
    pthread_cond_signal(&k->cv);
    return (int)k->ndeps++;
}

/* Append under mu. Normal events leave the last slot for the marker. */
static bool kvcm_ring_push(struct kvcm *k, const struct kvcm_ev *ev)
{
    size_t limit = ev->kind == EV_MARKER ? k->cap : k->cap - 1;
    if (k->count >= limit)
        return false;
    k->ring[(k->head + k->count) % k->cap] = *ev;
    k->count++;
    return true;
}

void kvcm_block_event(void *arg, const struct kv_namespace *ns, int64_t key, int medium)
{
    struct kvcm *k = arg;
    pthread_mutex_lock(&k->mu);
    int dep = kvcm_dep_index(k, ns);
    if (dep >= 0 && !k->deps[dep]->refused) {
        struct kvcm_ev ev = { .dep = (uint32_t)dep, .kind = EV_BLOCK,
                              .medium = medium == MED_HBM || medium == MED_DRAM ? (uint8_t)medium
                                                                                : MED_NONE,
                              .key = key };
        kvcm_work_arrived(k);
        if (kvcm_ring_push(k, &ev)) {
            k->accepted++;
            if (k->count == 1)
                pthread_cond_signal(&k->cv);
        } else {
            k->dropped++;
            if (!k->dirty) {
                k->dirty = true;
                pthread_cond_signal(&k->cv);
            }
        }
    }
    pthread_mutex_unlock(&k->mu);
}

void kvcm_deployment_event(void *arg, const struct kv_namespace *ns)
{
    struct kvcm *k = arg;
    pthread_mutex_lock(&k->mu);
    kvcm_dep_index(k, ns);
    pthread_mutex_unlock(&k->mu);
}

static void kvcm_walk_found(void *arg, const struct kv_namespace *ns, int64_t key, int medium)
{
    struct kvcm *k = arg;
    if (k->walk_len == k->walk_cap) {
        size_t cap = k->walk_cap ? k->walk_cap * 2 : 4096;
        struct kvcm_ev *b = realloc(k->walk_buf, cap * sizeof *b);
        if (!b) {
            k->walk_oom = true;   /* this walk is incomplete: walk again */
            return;
        }
        k->walk_buf = b;
        k->walk_cap = cap;
    }
    pthread_mutex_lock(&k->mu);
    int dep = kvcm_dep_index(k, ns);
    pthread_mutex_unlock(&k->mu);
    if (dep < 0)
        return;
    k->walk_buf[k->walk_len++] = (struct kvcm_ev){
        .dep = (uint32_t)dep, .kind = EV_BLOCK, .key = key,
        .medium = medium == MED_HBM ? MED_HBM : MED_DRAM,
    };
}

static void kvcm_walk_done(void *arg)
{
    struct kvcm *k = arg;
    k->walk = NULL;
    /* The next tenant's cache, until every one was walked. */
    while (!k->walk_oom && ++k->walk_cache < k->ncaches) {
        if (cache_walk_complete(k->caches[k->walk_cache], kvcm_walk_found, kvcm_walk_done, k,
                                &k->walk) == 0)
            return;
        log_error("kvcm: cannot start a walk of the index: out of memory");
        k->walk_oom = true;
    }
    k->walk_cache = 0;
    pthread_mutex_lock(&k->mu);
    free(k->walk_result);
    k->walk_result = k->walk_buf;
    k->walk_n = k->walk_len;
    k->walk_ready = true;
    if (k->walk_oom)
        k->dirty = true;
    k->walk_oom = false;
    bool again = k->walk_wanted;   /* asked while this walk ran (not expected): do not lose it */
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    k->walk_buf = NULL;
    k->walk_len = k->walk_cap = 0;
    if (again)
        event_active(k->efd_ev, EV_READ, 0);
}

/* The publisher asked for the truth: mark the queue, walk the index. It asks
 * again only after it took this walk's result, so no walk runs now and the
 * marker's kept slot is free. */
void kvcm_efd_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kvcm *k = arg;
    uint64_t v;
    (void)what;
    if (read(fd, &v, sizeof v) < 0 && errno != EAGAIN)
        log_warn("kvcm: reading the walk request: %s", strerror(errno));
    pthread_mutex_lock(&k->mu);
    bool wanted = k->walk_wanted && !k->walk;
    if (wanted) {
        struct kvcm_ev marker = { .kind = EV_MARKER };
        k->walk_wanted = false;
        k->dirty = false;   /* the walk sees everything dropped so far */
        if (!kvcm_ring_push(k, &marker))
            log_error("kvcm: no room for the resync marker (a bug): the walk goes on without it");
        pthread_cond_signal(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    k->walk_cache = 0;
    if (wanted && k->ncaches == 0) {
        kvcm_walk_done(k);
        return;
    }
    if (wanted && cache_walk_complete(k->caches[0], kvcm_walk_found, kvcm_walk_done, k, &k->walk) < 0) {
        log_error("kvcm: cannot start a walk of the index: out of memory");
        k->walk_oom = true;
        kvcm_walk_done(k);
    }
}

void kvcm_status_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kvcm *k = arg;
    struct kvcm_node_status s = { 0 };
    (void)fd;
    (void)what;
    if (k->status_fn)
        k->status_fn(k->status_arg, &s);
    pthread_mutex_lock(&k->mu);
    k->node = s;
    pthread_mutex_unlock(&k->mu);
}
