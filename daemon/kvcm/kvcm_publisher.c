/* kvcm_publisher: the publisher thread. Takes what the loop queued, keeps
 * each deployment's mirror of complete keys and its pending deltas, and
 * brings KVCM up to date: registerInstance, NODE_REGISTER, snapshots,
 * coalesced ADD/DELETE batches; every status handled, failures backed off
 * up to retry_max. Its own kvcm_client. */
#include "kvcm/kvcm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "kvcm/kvcm_client.h"
#include "config/kvcm_config.h"
#include "kvcm/keyset.h"
#include "core/log.h"

/* --- publisher thread --------------------------------------------------------------- */

static uint32_t kvcm_timeout(const struct kvcm *k, bool snapshot)
{
    return snapshot ? k->st.snapshot_timeout_ms : k->st.request_timeout_ms;
}

/* A key's new medium (MED_NONE: gone) into the mirror, and, when pending,
 * into the deltas: coalesced to the final medium plus every medium KVCM may
 * still hold the key in (a demotion is a DELETE from one medium and an ADD
 * to the other). */
static void kvcm_apply(struct kvcm_dep *d, int64_t key, uint8_t medium, bool pending)
{
    uint8_t old = MED_NONE;
    keyset_get(&d->mirror, key, &old);
    if (medium != MED_NONE) {
        if (keyset_put(&d->mirror, key, medium) < 0)
            d->need_snapshot = true;
    } else {
        keyset_del(&d->mirror, key);
    }
    if (!pending)
        return;
    uint8_t p = 0;
    keyset_get(&d->pending, key, &p);
    p = (uint8_t)((p & ~PEND_MEDIUM) | medium);
    if (old != MED_NONE && old != medium)
        p |= PEND_DROP(old);
    if (keyset_put(&d->pending, key, p) < 0)
        d->need_snapshot = true;   /* no memory to remember the delta: the snapshot will say it */
}

/* A block's location URI under medium: the deployment's, or expanded per
 * key when the template names {key}. */
static const char *kvcm_uri(const struct kvcm *k, const struct kvcm_dep *d, int64_t key,
                            uint8_t medium, char *buf, size_t len)
{
    if (!d->uri_per_key)
        return d->uri[medium];
    struct config_kvcm_vars v = { .host_ip_port = k->st.host_ip_port, .medium = k->medium_name[medium],
                                  .block_bytes = d->spec_bytes, .key = key };
    config_kvcm_expand(k->st.location_uri_template, &v, buf, len);
    return buf;
}

/* Something reached KVCM: the stall clock restarts. */
static void kvcm_progress(struct kvcm *k)
{
    pthread_mutex_lock(&k->mu);
    k->progress_ms = clock_now_ms();
    pthread_mutex_unlock(&k->mu);
}

/* Send one request; handle what every call can answer. Returns the status. */
static int kvcm_report(struct kvcm *k, struct kvcm_client *cl, struct kvcm_dep *d, json_t *events,
                       bool snapshot, struct kvcm_result *r)
{
    int st = kvcm_report_events(cl, d->instance_id, k->st.host_ip_port, k->st.storage_type, events,
                                kvcm_timeout(k, snapshot), r);
    switch (st) {
    case KVCM_OK:
        kvcm_progress(k);
        if (r->snapshot_required)
            d->need_snapshot = true;
        break;
    case KVCM_INSTANCE_NOT_EXIST:
        d->instance_ok = false;
        d->node_ok = false;
        d->need_snapshot = true;
        break;
    case KVCM_NODE_NOT_REGISTERED:
        d->node_ok = false;
        d->need_snapshot = true;
        break;
    case KVCM_SNAPSHOT_REQUIRED:
        d->need_snapshot = true;
        break;
    default:
        break;
    }
    return st;
}

static bool kvcm_step_failed(struct kvcm *k, struct kvcm_dep *d, const char *what,
                             const struct kvcm_result *r)
{
    uint64_t now = clock_now_ms();
    /* A snapshot that must wait its turn is not a failure: wait as told,
     * no backoff, no error. */
    if (r->status == KVCM_SNAPSHOT_RATE_LIMITED || r->status == KVCM_SNAPSHOT_IN_PROGRESS) {
        uint64_t wait_ms = r->retry_after_ms ? r->retry_after_ms : k->st.retry_base_ms;
        d->next_try_ms = now + (wait_ms > 3600000u ? 3600000u : wait_ms);
        kvcm_set_state(k, KVCM_STATE_RESYNCING);
        return true;
    }
    uint32_t wait = k->backoff_ms ? k->backoff_ms : k->st.retry_base_ms;
    if (r->retry_after_ms > wait)
        wait = r->retry_after_ms > 3600000u ? 3600000u : (uint32_t)r->retry_after_ms;
    d->next_try_ms = now + wait;
    k->backoff_ms = wait * 2 > k->st.retry_max_ms ? k->st.retry_max_ms : wait * 2;
    kvcm_set_error(k, KVCM_STATE_DEGRADED, "%s of instance %s: %s: %s (retrying in %u ms)", what,
                   d->instance_id, kvcm_status_name(r->status), r->message, wait);
    return false;
}

/* KVCM forgot the instance or our node: register again at once (kvcm_report
 * has already reset what must be redone), without a backoff. */
static bool kvcm_forgotten(int status)
{
    return status == KVCM_INSTANCE_NOT_EXIST || status == KVCM_NODE_NOT_REGISTERED;
}

/* Up to batch_events ADD/DELETE events of pending deltas into events (the
 * keys taken into k->batch); how many keys. Every (key, medium) appears once. */
static size_t kvcm_delta_batch(struct kvcm *k, struct kvcm_dep *d, json_t *events)
{
    size_t pos = 0, n = 0, nev = 0;
    int64_t key;
    uint8_t p;
    while (nev < k->st.batch_events && keyset_next(&d->pending, &pos, &key, &p)) {
        uint8_t now_in = p & PEND_MEDIUM;
        size_t need = (now_in != MED_NONE);
        for (uint8_t m = MED_HBM; m < MED_COUNT; m++)
            need += (p & PEND_DROP(m)) && m != now_in;
        if (nev > 0 && nev + need > k->st.batch_events)
            break;
        for (uint8_t m = MED_HBM; m < MED_COUNT; m++)
            if ((p & PEND_DROP(m)) && m != now_in)
                json_array_append_new(events, kvcm_event_block_delete(key, k->medium_name[m],
                                                                      d->spec_name));
        if (now_in != MED_NONE) {
            char uri[CONFIG_KVCM_TEMPLATE_MAX];
            json_array_append_new(events, kvcm_event_block_add(key, k->medium_name[now_in], d->spec_name,
                                                               kvcm_uri(k, d, key, now_in, uri,
                                                                        sizeof uri)));
        }
        nev += need;
        k->batch[n++] = (struct kvcm_ev){ .key = key };
    }
    return n;
}

/* Bring one deployment up to date; false when something failed (retry later). */
static bool kvcm_sync_dep(struct kvcm *k, struct kvcm_client *cl, struct kvcm_dep *d, bool flush)
{
    struct kvcm_result r;
    uint64_t now = clock_now_ms();
    bool again_done = false;

    if (d->failed_terminal)
        return true;
    if (now < d->next_try_ms)
        return false;   /* backing off after a failure: an idle pass must neither reset the
                           backoff nor turn the state READY */
    if (d->next_try_ms)
        flush = true;   /* the retry is due: send what waits now, so that only a call that
                           went through ends the failure (and the backoff) */
again:
    if (!d->instance_ok) {
        const char *names[1] = { d->spec_name };
        uint64_t sizes[1] = { d->spec_bytes };
        struct kvcm_instance inst = {
            .instance_group = k->st.instance_group, .instance_id = d->instance_id,
            .block_size = d->layout.block_tokens, .model_name = d->layout.model,
            .dtype = d->layout.dtype, .extra = d->layout.extra, .tp_size = d->layout.tp_size,
            .spec_names = names, .spec_sizes = sizes, .n_specs = 1,
        };
        kvcm_set_state(k, KVCM_STATE_REGISTERING);
        int st = kvcm_register_instance(cl, &inst, 0, &r);
        if (st == KVCM_DUPLICATE_ENTITY) {
            d->failed_terminal = true;
            kvcm_set_error(k, KVCM_STATE_DEGRADED, "instance %s is registered with a different "
                           "layout; not publishing it (change [kvcm] instance_id): %s",
                           d->instance_id, r.message);
            return false;
        }
        if (st != KVCM_OK)
            return kvcm_step_failed(k, d, "registerInstance", &r);
        kvcm_progress(k);
        d->instance_ok = true;
    }
    if (!d->node_ok) {
        /* every medium this node reports blocks in */
        const char *mediums[2];
        size_t nmed = 0;
        if (k->st.has_hbm)
            mediums[nmed++] = k->medium_name[MED_HBM];
        mediums[nmed++] = k->medium_name[MED_DRAM];
        json_t *events = json_array();
        json_array_append_new(events, kvcm_event_node_register(mediums, nmed));
        pthread_mutex_lock(&k->mu);
        d->announced = true;
        pthread_mutex_unlock(&k->mu);
        int st = kvcm_report(k, cl, d, events, false, &r);
        json_decref(events);
        if (st != KVCM_OK) {
            if (kvcm_forgotten(st) && !again_done) {
                again_done = true;
                goto again;
            }
            return kvcm_step_failed(k, d, "NODE_REGISTER", &r);
        }
        d->node_ok = true;
        d->need_snapshot = true;
        pthread_mutex_lock(&k->mu);
        d->heartbeat_ok = true;
        pthread_mutex_unlock(&k->mu);
    }
    if (now - d->last_snapshot_ms >= k->st.snapshot_interval_ms && d->last_snapshot_ms)
        d->need_snapshot = true;
    if (d->need_snapshot) {
        if (k->resyncing)
            return true;   /* the mirror is being rebuilt: snapshot it afterwards */
        kvcm_set_state(k, KVCM_STATE_RESYNCING);
        json_t *blocks = json_array(), *events = json_array();
        size_t pos = 0;
        int64_t key;
        uint8_t medium;
        while (keyset_next(&d->mirror, &pos, &key, &medium)) {
            char uri[CONFIG_KVCM_TEMPLATE_MAX];
            json_array_append_new(blocks, kvcm_snapshot_block(key, k->medium_name[medium], d->spec_name,
                                                              kvcm_uri(k, d, key, medium, uri,
                                                                       sizeof uri)));
        }
        json_array_append_new(events, kvcm_event_snapshot(blocks));
        int st = kvcm_report(k, cl, d, events, true, &r);
        json_decref(events);
        if (st != KVCM_OK) {
            if (kvcm_forgotten(st) && !again_done) {
                again_done = true;
                goto again;
            }
            return kvcm_step_failed(k, d, "snapshot", &r);
        }
        d->need_snapshot = false;
        d->last_snapshot_ms = clock_now_ms();
        keyset_clear(&d->pending);   /* the snapshot said it all */
        pthread_mutex_lock(&k->mu);
        k->snapshots++;
        k->generation++;
        k->last_snapshot_unix_ms = kvcm_unix_ms();
        pthread_mutex_unlock(&k->mu);
        log_info("kvcm: snapshot of instance %s: %zu blocks (%s)", d->instance_id,
                 keyset_count(&d->mirror), r.snapshot_version);
    }
    /* Deltas, coalesced to each key's final state, in batches. */
    while (keyset_count(&d->pending) > 0 &&
           (flush || keyset_count(&d->pending) >= k->st.batch_events)) {
        json_t *events = json_array();
        size_t n = kvcm_delta_batch(k, d, events);
        int st = json_array_size(events) > 0 ? kvcm_report(k, cl, d, events, false, &r) : KVCM_OK;
        json_decref(events);
        if (st != KVCM_OK) {
            /* Without an answer the batch may still be applied, late and out of
             * order with its retries and later batches: only a snapshot says
             * for sure what KVCM holds once it answers again. */
            if (st == KVCM_TRANSPORT)
                d->need_snapshot = true;
            if (kvcm_forgotten(st) && !again_done) {
                again_done = true;
                goto again;
            }
            return kvcm_step_failed(k, d, "ADD/DELETE", &r);
        }
        for (size_t i = 0; i < n; i++)
            keyset_del(&d->pending, k->batch[i].key);
        flush = keyset_count(&d->pending) > 0 && flush;
    }
    /* Too much to remember as deltas: let a snapshot say it. */
    if (keyset_count(&d->pending) > k->st.queue_events) {
        keyset_clear(&d->pending);
        d->need_snapshot = true;
    }
    d->next_try_ms = 0;   /* up to date: no failure outstanding */
    return true;
}

/* The walk's result replaces every mirror; the events dequeued since its
 * marker (newer than the walk's start) go on top, in order. */
static void kvcm_take_walk(struct kvcm *k, struct kvcm_ev *res, size_t n, size_t ndeps,
                           struct kvcm_dep **deps)
{
    for (size_t i = 0; i < ndeps; i++) {
        keyset_clear(&deps[i]->mirror);
        keyset_clear(&deps[i]->pending);
        deps[i]->need_snapshot = true;
    }
    for (size_t i = 0; i < n; i++)
        if (res[i].dep < ndeps && !deps[res[i].dep]->refused)
            kvcm_apply(deps[res[i].dep], res[i].key, res[i].medium, false);
    for (size_t i = 0; i < k->post_n; i++)
        if (k->post[i].dep < ndeps)
            kvcm_apply(deps[k->post[i].dep], k->post[i].key, k->post[i].medium, false);
    k->post_n = 0;
}

/* Nothing left to tell KVCM (publisher thread; deps' fields are its own). */
static bool kvcm_caught_up(const struct kvcm *k, struct kvcm_dep **deps, size_t ndeps)
{
    if (k->resyncing)
        return false;
    for (size_t i = 0; i < ndeps; i++) {
        const struct kvcm_dep *d = deps[i];
        if (!d->failed_terminal && (!d->instance_ok || !d->node_ok || d->need_snapshot ||
                                    keyset_count(&d->pending) > 0))
            return false;
    }
    return true;
}

void *kvcm_publisher_main(void *arg)
{
    struct kvcm *k = arg;
    struct kvcm_client *cl = NULL;
    struct kvcm_client_config cc = {
        .endpoints = (const char *const *)k->st.endpoints, .n_endpoints = k->st.n_endpoints,
        .connect_timeout_ms = k->st.connect_timeout_ms, .request_timeout_ms = k->st.request_timeout_ms,
        .max_response_bytes = 1u << 20, .trace_prefix = k->trace_pub,
    };
    char err[256];
    uint64_t next_flush = 0;
    sigset_t all;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    if (kvcm_client_create(&cc, &cl, err, sizeof err) < 0) {
        kvcm_set_error(k, KVCM_STATE_DEGRADED, "cannot create the KVCM client: %s", err);
        return NULL;
    }
    kvcm_client_set_cancel(cl, &k->cancel);
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        /* Take what the loop queued. */
        size_t n = 0;
        struct kvcm_dep *deps[KVCM_MAX_DEPLOYMENTS];
        size_t ndeps = k->ndeps;
        memcpy(deps, k->deps, ndeps * sizeof deps[0]);
        while (k->count > 0 && n < k->st.batch_events) {
            k->batch[n++] = k->ring[k->head];
            k->head = (k->head + 1) % k->cap;
            k->count--;
        }
        k->deps_added = false;
        for (size_t i = 0; i < ndeps; i++) {
            if (deps[i]->reinstance)
                deps[i]->instance_ok = false;   /* straight to registerInstance */
            if (deps[i]->reregister || deps[i]->reinstance)
                deps[i]->node_ok = false;
            deps[i]->reregister = deps[i]->reinstance = false;
        }
        pthread_mutex_unlock(&k->mu);

        for (size_t i = 0; i < n; i++) {
            struct kvcm_ev *ev = &k->batch[i];
            if (ev->kind == EV_MARKER) {
                k->awaiting_walk = true;   /* what follows is newer than the walk's start */
                k->post_n = 0;
            } else if (ev->dep < ndeps) {
                if (k->awaiting_walk) {
                    if (k->post_n == k->post_cap) {
                        /* as many as the queue holds: beyond that, walk again */
                        pthread_mutex_lock(&k->mu);
                        k->dirty = true;
                        pthread_mutex_unlock(&k->mu);
                        continue;
                    }
                    k->post[k->post_n++] = *ev;
                } else {
                    kvcm_apply(deps[ev->dep], ev->key, ev->medium, true);
                }
            }
        }
        /* A walk's result counts only once its marker has been dequeued: the
         * events before the marker are older than the walk, which replaces
         * them; taken earlier, the marker would come after the result and
         * wait for a walk that never comes. Then, with nothing outstanding,
         * ask for a walk if events were dropped. */
        struct kvcm_ev *res = NULL;
        size_t res_n = 0;
        bool took_walk = false, want_walk = false;
        pthread_mutex_lock(&k->mu);
        if (k->awaiting_walk && k->walk_ready) {
            res = k->walk_result;
            res_n = k->walk_n;
            k->walk_result = NULL;
            k->walk_ready = false;
            took_walk = true;
            ndeps = k->ndeps;   /* the walk may have found new deployments */
            memcpy(deps, k->deps, ndeps * sizeof deps[0]);
        }
        pthread_mutex_unlock(&k->mu);
        if (took_walk) {
            kvcm_take_walk(k, res, res_n, ndeps, deps);
            free(res);
            k->awaiting_walk = false;
            k->resyncing = false;
        }
        pthread_mutex_lock(&k->mu);
        if (k->dirty && !k->resyncing) {
            k->resyncing = true;
            k->walk_wanted = true;
            want_walk = true;
        }
        pthread_mutex_unlock(&k->mu);
        if (want_walk) {
            uint64_t one = 1;
            if (write(k->efd, &one, sizeof one) < 0)
                log_warn("kvcm: cannot ask the loop for a walk: %s", strerror(errno));
        }

        uint64_t now = clock_now_ms();
        bool flush = now >= next_flush;
        bool ok = true;
        for (size_t i = 0; i < ndeps; i++)
            ok = kvcm_sync_dep(k, cl, deps[i], flush) && ok;
        if (flush)
            next_flush = clock_now_ms() + k->st.flush_interval_ms;
        if (ok) {
            k->backoff_ms = 0;
            /* A deployment that is never published (refused, or registered
             * elsewhere with another layout) keeps the state DEGRADED. */
            bool all_ok = ndeps > 0, any_terminal = false;
            for (size_t i = 0; i < ndeps; i++) {
                if (deps[i]->failed_terminal)
                    any_terminal = true;
                else
                    all_ok = all_ok && deps[i]->node_ok && !deps[i]->need_snapshot;
            }
            if (all_ok && !k->resyncing)
                kvcm_set_state(k, any_terminal ? KVCM_STATE_DEGRADED : KVCM_STATE_READY);
        }
        bool caught_up = kvcm_caught_up(k, deps, ndeps);

        /* Sleep until more events, the flush deadline, or 1 s (beats). */
        pthread_mutex_lock(&k->mu);
        if (caught_up && k->count == 0 && !k->dirty && !k->deps_added)
            k->work_since_ms = 0;   /* nothing waits */
        else
            kvcm_work_arrived(k);
        bool told = k->deps_added;
        for (size_t i = 0; i < k->ndeps && !told; i++)
            told = k->deps[i]->reregister || k->deps[i]->reinstance;
        if (!k->stop && k->count == 0 && !told && !(k->awaiting_walk && k->walk_ready) &&
            !(k->dirty && !k->resyncing)) {
            uint64_t wait_ms = 1000, t_now = clock_now_ms();
            for (size_t i = 0; i < ndeps; i++) {
                struct kvcm_dep *d = deps[i];
                if (d->failed_terminal ||
                    !(keyset_count(&d->pending) > 0 || d->need_snapshot || !d->node_ok ||
                      !d->instance_ok))
                    continue;
                /* due at the flush deadline, or when its retry is (backing off) */
                uint64_t due = d->next_try_ms > t_now ? d->next_try_ms - t_now
                                                      : k->st.flush_interval_ms;
                if (due < wait_ms)
                    wait_ms = due;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)(wait_ms / 1000u);
            ts.tv_nsec += (long)(wait_ms % 1000u) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&k->cv, &k->mu, &ts);
        }
    }
    pthread_mutex_unlock(&k->mu);
    kvcm_client_destroy(cl);
    return NULL;
}
