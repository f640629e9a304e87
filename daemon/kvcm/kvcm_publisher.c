/* kvcm_publisher: the publisher thread. Takes what the loop queued, keeps
 * each deployment's mirror of complete keys and its pending deltas, and
 * brings KVCM up to date: registerInstance, NODE_REGISTER, snapshots,
 * coalesced ADD/DELETE batches; every status handled, failures backed off
 * up to retry_max. Owns its thread, its kvcm_client, its batch, the events
 * that wait for a walk's result, the resync it asked for and its backoff
 * (struct kvcm_publisher); the rest is kvcm_shared's, reached through its
 * functions. */
#include "kvcm/kvcm_publisher.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "kvcm/kvcm_client.h"
#include "config/kvcm_config.h"
#include "kvcm/keyset.h"
#include "core/log.h"

/* A pending delta (keyset value): the key's medium now in the low bits, plus
 * the media KVCM may still hold it in and must be told to drop. */
#define PEND_MEDIUM   0x3u
#define PEND_DROP(m)  (uint8_t)(0x4u << (m))   /* m = MED_HBM or MED_DRAM */

struct kvcm_publisher {
    struct kvcm_shared *s;
    const struct kvcm_conf *c;                /* s's settings */
    const struct kvcm_settings *st;           /* &c->st */
    bool resyncing;                           /* a walk was asked for and not yet taken: at most
                                                 one marker is ever in the ring */
    bool awaiting_walk;                       /* its marker was dequeued: later events wait in
                                                 post for the walk's result */
    struct kvcm_ev *post, *batch;
    size_t post_n, post_cap;
    uint32_t backoff_ms;
    /* Not in the liveness registry: a call may rightly block for up to
     * snapshot_timeout, and KVCM being slow must never stop the watchdog. */
    pthread_t thread;
    bool started;
};

/* --- publisher thread --------------------------------------------------------------- */

static uint32_t kvcm_timeout(const struct kvcm_publisher *p, bool snapshot)
{
    return snapshot ? p->st->snapshot_timeout_ms : p->st->request_timeout_ms;
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
static const char *kvcm_uri(const struct kvcm_publisher *p, const struct kvcm_dep *d, int64_t key,
                            uint8_t medium, char *buf, size_t len)
{
    if (!d->uri_per_key)
        return d->uri[medium];
    struct config_kvcm_vars v = { .host_ip_port = p->st->host_ip_port, .medium = p->c->medium_name[medium],
                                  .block_bytes = d->spec_bytes, .key = key };
    config_kvcm_expand(p->st->location_uri_template, &v, buf, len);
    return buf;
}

/* Send one request; handle what every call can answer. Returns the status. */
static int kvcm_report(struct kvcm_publisher *p, struct kvcm_client *cl, struct kvcm_dep *d, json_t *events,
                       bool snapshot, struct kvcm_result *r)
{
    int st = kvcm_report_events(cl, d->instance_id, p->st->host_ip_port, p->st->storage_type, events,
                                kvcm_timeout(p, snapshot), r);
    switch (st) {
    case KVCM_OK:
        kvcm_shared_progress(p->s);
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

static bool kvcm_step_failed(struct kvcm_publisher *p, struct kvcm_dep *d, const char *what,
                             const struct kvcm_result *r)
{
    uint64_t now = clock_now_ms();
    /* A snapshot that must wait its turn is not a failure: wait as told,
     * no backoff, no error. */
    if (r->status == KVCM_SNAPSHOT_RATE_LIMITED || r->status == KVCM_SNAPSHOT_IN_PROGRESS) {
        uint64_t wait_ms = r->retry_after_ms ? r->retry_after_ms : p->st->retry_base_ms;
        d->next_try_ms = now + (wait_ms > 3600000u ? 3600000u : wait_ms);
        kvcm_shared_set_state(p->s, KVCM_STATE_RESYNCING);
        return true;
    }
    uint32_t wait = p->backoff_ms ? p->backoff_ms : p->st->retry_base_ms;
    if (r->retry_after_ms > wait)
        wait = r->retry_after_ms > 3600000u ? 3600000u : (uint32_t)r->retry_after_ms;
    d->next_try_ms = now + wait;
    p->backoff_ms = wait * 2 > p->st->retry_max_ms ? p->st->retry_max_ms : wait * 2;
    kvcm_shared_error(p->s, KVCM_STATE_DEGRADED, "%s of instance %s: %s: %s (retrying in %u ms)", what,
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
 * keys taken into p->batch); how many keys. Every (key, medium) appears once. */
static size_t kvcm_delta_batch(struct kvcm_publisher *p, struct kvcm_dep *d, json_t *events)
{
    size_t pos = 0, n = 0, nev = 0;
    int64_t key;
    uint8_t pend;
    while (nev < p->st->batch_events && keyset_next(&d->pending, &pos, &key, &pend)) {
        uint8_t now_in = pend & PEND_MEDIUM;
        size_t need = (now_in != MED_NONE);
        for (uint8_t m = MED_HBM; m < MED_COUNT; m++)
            need += (pend & PEND_DROP(m)) && m != now_in;
        if (nev > 0 && nev + need > p->st->batch_events)
            break;
        for (uint8_t m = MED_HBM; m < MED_COUNT; m++)
            if ((pend & PEND_DROP(m)) && m != now_in)
                json_array_append_new(events, kvcm_event_block_delete(key, p->c->medium_name[m],
                                                                      d->spec_name));
        if (now_in != MED_NONE) {
            char uri[CONFIG_KVCM_TEMPLATE_MAX];
            json_array_append_new(events, kvcm_event_block_add(key, p->c->medium_name[now_in], d->spec_name,
                                                               kvcm_uri(p, d, key, now_in, uri,
                                                                        sizeof uri)));
        }
        nev += need;
        p->batch[n++] = (struct kvcm_ev){ .key = key };
    }
    return n;
}

/* Bring one deployment up to date; false when something failed (retry later). */
static bool kvcm_sync_dep(struct kvcm_publisher *p, struct kvcm_client *cl, struct kvcm_dep *d, bool flush)
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
            .instance_group = p->st->instance_group, .instance_id = d->instance_id,
            .block_size = d->layout.block_tokens, .model_name = d->layout.model,
            .dtype = d->layout.dtype, .extra = d->layout.extra, .tp_size = d->layout.tp_size,
            .spec_names = names, .spec_sizes = sizes, .n_specs = 1,
        };
        kvcm_shared_set_state(p->s, KVCM_STATE_REGISTERING);
        int st = kvcm_register_instance(cl, &inst, 0, &r);
        if (st == KVCM_DUPLICATE_ENTITY) {
            d->failed_terminal = true;
            kvcm_shared_error(p->s, KVCM_STATE_DEGRADED, "instance %s is registered with a different "
                           "layout; not publishing it (change [kvcm] instance_id): %s",
                           d->instance_id, r.message);
            return false;
        }
        if (st != KVCM_OK)
            return kvcm_step_failed(p, d, "registerInstance", &r);
        kvcm_shared_progress(p->s);
        d->instance_ok = true;
    }
    if (!d->node_ok) {
        /* every medium this node reports blocks in */
        const char *mediums[2];
        size_t nmed = 0;
        if (p->st->has_hbm)
            mediums[nmed++] = p->c->medium_name[MED_HBM];
        mediums[nmed++] = p->c->medium_name[MED_DRAM];
        json_t *events = json_array();
        json_array_append_new(events, kvcm_event_node_register(mediums, nmed));
        kvcm_shared_announced_dep(p->s, d);
        int st = kvcm_report(p, cl, d, events, false, &r);
        json_decref(events);
        if (st != KVCM_OK) {
            if (kvcm_forgotten(st) && !again_done) {
                again_done = true;
                goto again;
            }
            return kvcm_step_failed(p, d, "NODE_REGISTER", &r);
        }
        d->node_ok = true;
        d->need_snapshot = true;
        kvcm_shared_registered_dep(p->s, d);
    }
    if (now - d->last_snapshot_ms >= p->st->snapshot_interval_ms && d->last_snapshot_ms)
        d->need_snapshot = true;
    if (d->need_snapshot) {
        if (p->resyncing)
            return true;   /* the mirror is being rebuilt: snapshot it afterwards */
        kvcm_shared_set_state(p->s, KVCM_STATE_RESYNCING);
        json_t *blocks = json_array(), *events = json_array();
        size_t pos = 0;
        int64_t key;
        uint8_t medium;
        while (keyset_next(&d->mirror, &pos, &key, &medium)) {
            char uri[CONFIG_KVCM_TEMPLATE_MAX];
            json_array_append_new(blocks, kvcm_snapshot_block(key, p->c->medium_name[medium], d->spec_name,
                                                              kvcm_uri(p, d, key, medium, uri,
                                                                       sizeof uri)));
        }
        json_array_append_new(events, kvcm_event_snapshot(blocks));
        int st = kvcm_report(p, cl, d, events, true, &r);
        json_decref(events);
        if (st != KVCM_OK) {
            if (kvcm_forgotten(st) && !again_done) {
                again_done = true;
                goto again;
            }
            return kvcm_step_failed(p, d, "snapshot", &r);
        }
        d->need_snapshot = false;
        d->last_snapshot_ms = clock_now_ms();
        keyset_clear(&d->pending);   /* the snapshot said it all */
        kvcm_shared_snapshot_sent(p->s);
        log_info("kvcm: snapshot of instance %s: %zu blocks (%s)", d->instance_id,
                 keyset_count(&d->mirror), r.snapshot_version);
    }
    /* Deltas, coalesced to each key's final state, in batches. */
    while (keyset_count(&d->pending) > 0 &&
           (flush || keyset_count(&d->pending) >= p->st->batch_events)) {
        json_t *events = json_array();
        size_t n = kvcm_delta_batch(p, d, events);
        int st = json_array_size(events) > 0 ? kvcm_report(p, cl, d, events, false, &r) : KVCM_OK;
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
            return kvcm_step_failed(p, d, "ADD/DELETE", &r);
        }
        for (size_t i = 0; i < n; i++)
            keyset_del(&d->pending, p->batch[i].key);
        flush = keyset_count(&d->pending) > 0 && flush;
    }
    /* Too much to remember as deltas: let a snapshot say it. */
    if (keyset_count(&d->pending) > p->st->queue_events) {
        keyset_clear(&d->pending);
        d->need_snapshot = true;
    }
    d->next_try_ms = 0;   /* up to date: no failure outstanding */
    return true;
}

/* The walk's result replaces every mirror; the events dequeued since its
 * marker (newer than the walk's start) go on top, in order. */
static void kvcm_take_walk(struct kvcm_publisher *p, struct kvcm_ev *res, size_t n, size_t ndeps,
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
    for (size_t i = 0; i < p->post_n; i++)
        if (p->post[i].dep < ndeps)
            kvcm_apply(deps[p->post[i].dep], p->post[i].key, p->post[i].medium, false);
    p->post_n = 0;
}

/* Nothing left to tell KVCM (publisher thread; deps' fields are its own). */
static bool kvcm_caught_up(const struct kvcm_publisher *p, struct kvcm_dep **deps, size_t ndeps)
{
    if (p->resyncing)
        return false;
    for (size_t i = 0; i < ndeps; i++) {
        const struct kvcm_dep *d = deps[i];
        if (!d->failed_terminal && (!d->instance_ok || !d->node_ok || d->need_snapshot ||
                                    keyset_count(&d->pending) > 0))
            return false;
    }
    return true;
}

/* How long the publisher may sleep: until its earliest deployment with work
 * is due (the flush deadline, or its retry when backing off), at most 1 s
 * (beats). */
static uint64_t kvcm_sleep_ms(const struct kvcm_publisher *p, struct kvcm_dep **deps, size_t ndeps)
{
    uint64_t wait_ms = 1000, t_now = clock_now_ms();
    for (size_t i = 0; i < ndeps; i++) {
        struct kvcm_dep *d = deps[i];
        if (d->failed_terminal ||
            !(keyset_count(&d->pending) > 0 || d->need_snapshot || !d->node_ok || !d->instance_ok))
            continue;
        uint64_t due = d->next_try_ms > t_now ? d->next_try_ms - t_now : p->st->flush_interval_ms;
        if (due < wait_ms)
            wait_ms = due;
    }
    return wait_ms;
}

/* The batch's events into the mirrors and deltas; after a walk's marker
 * they wait in post for its result instead. */
static void kvcm_apply_batch(struct kvcm_publisher *p, size_t n, struct kvcm_dep **deps, size_t ndeps)
{
    for (size_t i = 0; i < n; i++) {
        struct kvcm_ev *ev = &p->batch[i];
        if (ev->kind == EV_MARKER) {
            p->awaiting_walk = true;   /* what follows is newer than the walk's start */
            p->post_n = 0;
        } else if (ev->dep < ndeps) {
            if (p->awaiting_walk) {
                if (p->post_n == p->post_cap) {
                    /* as many as the queue holds: beyond that, walk again */
                    kvcm_shared_dirty(p->s);
                    continue;
                }
                p->post[p->post_n++] = *ev;
            } else {
                kvcm_apply(deps[ev->dep], ev->key, ev->medium, true);
            }
        }
    }
}

static void *kvcm_publisher_main(void *arg)
{
    struct kvcm_publisher *p = arg;
    struct kvcm_client *cl = NULL;
    struct kvcm_client_config cc = {
        .endpoints = (const char *const *)p->st->endpoints, .n_endpoints = p->st->n_endpoints,
        .connect_timeout_ms = p->st->connect_timeout_ms, .request_timeout_ms = p->st->request_timeout_ms,
        .max_response_bytes = 1u << 20, .trace_prefix = p->c->trace_pub,
    };
    char err[256];
    uint64_t next_flush = 0;
    sigset_t all;
    struct kvcm_dep *deps[KVCM_MAX_DEPLOYMENTS];
    size_t ndeps;
    int n;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    if (kvcm_client_create(&cc, &cl, err, sizeof err) < 0) {
        kvcm_shared_error(p->s, KVCM_STATE_DEGRADED, "cannot create the KVCM client: %s", err);
        return NULL;
    }
    kvcm_client_set_cancel(cl, kvcm_shared_cancel(p->s));
    /* Take what the loop queued. */
    while ((n = kvcm_shared_take(p->s, p->batch, p->st->batch_events, deps, &ndeps)) >= 0) {
        kvcm_apply_batch(p, (size_t)n, deps, ndeps);
        /* A walk's result counts only once its marker has been dequeued: the
         * events before the marker are older than the walk, which replaces
         * them; taken earlier, the marker would come after the result and
         * wait for a walk that never comes. Then, with nothing outstanding,
         * ask for a walk if events were dropped. */
        struct kvcm_ev *res = NULL;
        size_t res_n = 0;
        if (p->awaiting_walk && kvcm_shared_take_walk(p->s, &res, &res_n, deps, &ndeps)) {
            kvcm_take_walk(p, res, res_n, ndeps, deps);
            free(res);
            p->awaiting_walk = false;
            p->resyncing = false;
        }
        if (!p->resyncing && kvcm_shared_ask_walk(p->s))
            p->resyncing = true;

        uint64_t now = clock_now_ms();
        bool flush = now >= next_flush;
        bool ok = true;
        for (size_t i = 0; i < ndeps; i++)
            ok = kvcm_sync_dep(p, cl, deps[i], flush) && ok;
        if (flush)
            next_flush = clock_now_ms() + p->st->flush_interval_ms;
        if (ok) {
            p->backoff_ms = 0;
            /* A deployment that is never published (refused, or registered
             * elsewhere with another layout) keeps the state DEGRADED. */
            bool all_ok = ndeps > 0, any_terminal = false;
            for (size_t i = 0; i < ndeps; i++) {
                if (deps[i]->failed_terminal)
                    any_terminal = true;
                else
                    all_ok = all_ok && deps[i]->node_ok && !deps[i]->need_snapshot;
            }
            if (all_ok && !p->resyncing)
                kvcm_shared_set_state(p->s, any_terminal ? KVCM_STATE_DEGRADED : KVCM_STATE_READY);
        }
        /* Sleep until more events, the flush deadline, or 1 s (beats). */
        kvcm_shared_sleep(p->s, kvcm_caught_up(p, deps, ndeps), p->awaiting_walk, p->resyncing,
                         kvcm_sleep_ms(p, deps, ndeps));
    }
    kvcm_client_destroy(cl);
    return NULL;
}

int kvcm_publisher_create(struct kvcm_shared *s, struct kvcm_publisher **out)
{
    struct kvcm_publisher *p = calloc(1, sizeof *p);
    *out = NULL;
    if (!p)
        return -1;
    p->s = s;
    p->c = kvcm_shared_conf(s);
    p->st = &p->c->st;
    p->post_cap = p->st->queue_events;
    p->post = calloc(p->post_cap ? p->post_cap : 1, sizeof *p->post);
    p->batch = calloc(p->st->batch_events, sizeof *p->batch);
    if (!p->post || !p->batch) {
        kvcm_publisher_destroy(p);
        return -1;
    }
    *out = p;
    return 0;
}

int kvcm_publisher_start(struct kvcm_publisher *p)
{
    if (pthread_create(&p->thread, NULL, kvcm_publisher_main, p) != 0)
        return -1;
    p->started = true;
    return 0;
}

void kvcm_publisher_join(struct kvcm_publisher *p)
{
    if (p && p->started)
        pthread_join(p->thread, NULL);
    if (p)
        p->started = false;
}

void kvcm_publisher_destroy(struct kvcm_publisher *p)
{
    if (!p)
        return;
    kvcm_publisher_join(p);
    free(p->post);
    free(p->batch);
    free(p);
}
