/* kvcm: publisher and heartbeat threads keeping KVCM's view of this node
 * current (see kvcm.h). This file: the state and its errors, the stall
 * clock, start and stop (HOST_DOWN at stop), the stats; the other pieces
 * are listed in kvcm_internal.h. */
#include "kvcm/kvcm.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "cache/cache.h"
#include "core/clock.h"
#include "core/errmsg.h"
#include "kvcm/kvcm_client.h"
#include "kvcm/kvcm_internal.h"
#include "kvnode.h"
#include "core/log.h"

const char *kvcm_state_name(int state)
{
    static const char *const names[] = { "DISABLED", "STARTING", "REGISTERING", "RESYNCING",
                                         "READY", "DEGRADED", "STOPPED", "STALLED" };
    return state >= 0 && state <= KVCM_STATE_STALLED ? names[state] : "UNKNOWN";
}

uint64_t kvcm_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void kvcm_set_error(struct kvcm *k, int state, const char *fmt, ...)
{
    char msg[KVCM_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&k->mu);
    bool changed = strcmp(k->last_error, msg) != 0 || k->state != state;
    memcpy(k->last_error, msg, sizeof msg);
    k->state = state;
    pthread_mutex_unlock(&k->mu);
    if (changed)
        log_warn("kvcm: %s", msg);
}

void kvcm_set_state(struct kvcm *k, int state)
{
    pthread_mutex_lock(&k->mu);
    if (k->state != KVCM_STATE_STOPPED)
        k->state = state;
    pthread_mutex_unlock(&k->mu);
}

/* Work is waiting (under mu): the stall clock starts unless it runs. */
void kvcm_work_arrived(struct kvcm *k)
{
    if (!k->work_since_ms)
        k->work_since_ms = clock_now_ms();
}

/* How long work has waited without progress (under mu); 0: none waits. */
static uint64_t kvcm_waiting_ms(const struct kvcm *k, uint64_t now)
{
    if (!k->work_since_ms)
        return 0;
    uint64_t since = k->progress_ms > k->work_since_ms ? k->progress_ms : k->work_since_ms;
    return now > since ? now - since : 0;
}

/* --- lifecycle ------------------------------------------------------------------------ */

static const char *kvcm_own(struct kvcm *k, int slot, const char *s)
{
    snprintf(k->text[slot], sizeof k->text[slot], "%s", s ? s : "");
    return k->text[slot];
}

int kvcm_create(struct event_base *base, struct cache *const *caches, size_t n,
                const struct kvcm_settings *st, kvcm_status_fn status, void *status_arg,
                struct kvcm **out, char *err, size_t errlen)
{
    struct kvcm *k = calloc(1, sizeof *k);
    struct timeval tv;

    *out = NULL;
    if (!k || n > KVCM_MAX_CACHES) {
        free(k);
        errmsg_set(err, errlen, k ? "kvcm: more caches than it serves" : "kvcm: out of memory");
        return -KVNODE_ENOMEM;
    }
    k->base = base;
    memcpy(k->caches, caches, n * sizeof *caches);
    k->ncaches = n;
    k->st = *st;
    k->efd = -1;
    for (size_t i = 0; i < st->n_endpoints && i < KVCM_MAX_ENDPOINTS; i++) {
        snprintf(k->endpoints[i], sizeof k->endpoints[i], "%s", st->endpoints[i]);
        k->st.endpoints[i] = k->endpoints[i];
    }
    k->st.instance_group = kvcm_own(k, 0, st->instance_group);
    k->st.instance_id_template = kvcm_own(k, 1, st->instance_id_template);
    k->st.host_ip_port = kvcm_own(k, 2, st->host_ip_port);
    k->st.storage_type = kvcm_own(k, 3, st->storage_type);
    k->st.medium_host = kvcm_own(k, 4, st->medium_host);
    k->st.spec_name_template = kvcm_own(k, 5, st->spec_name_template);
    k->st.location_uri_template = kvcm_own(k, 6, st->location_uri_template);
    k->st.medium_hbm = kvcm_own(k, 7, st->medium_hbm);
    k->medium_name[MED_NONE] = "";
    k->medium_name[MED_HBM] = k->st.medium_hbm;
    k->medium_name[MED_DRAM] = k->st.medium_host;
    if (k->st.batch_events == 0)
        k->st.batch_events = 1;
    /* A per-boot epoch: trace ids of an older incarnation are recognisable. */
    k->epoch = kvcm_unix_ms();
    snprintf(k->trace_pub, sizeof k->trace_pub, "%s-%" PRIu64 "-pub", k->st.host_ip_port, k->epoch);
    snprintf(k->trace_hb, sizeof k->trace_hb, "%s-%" PRIu64 "-hb", k->st.host_ip_port, k->epoch);
    snprintf(k->trace_down, sizeof k->trace_down, "%s-%" PRIu64 "-down", k->st.host_ip_port, k->epoch);
    k->cap = (size_t)k->st.queue_events + 1;
    k->post_cap = k->st.queue_events;
    k->ring = calloc(k->cap, sizeof *k->ring);
    k->post = calloc(k->post_cap ? k->post_cap : 1, sizeof *k->post);
    k->batch = calloc(k->st.batch_events, sizeof *k->batch);
    k->state = KVCM_STATE_STARTING;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    pthread_cond_init(&k->hb_cv, NULL);
    k->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    k->status_fn = status;
    k->status_arg = status_arg;
    if (!k->ring || !k->post || !k->batch || k->efd < 0) {
        errmsg_set(err, errlen, "kvcm: cannot set up the publisher queue: %s",
                   k->efd < 0 ? strerror(errno) : "out of memory");
        kvcm_destroy(k);
        return -KVNODE_ENOMEM;
    }
    k->efd_ev = event_new(base, k->efd, EV_READ | EV_PERSIST, kvcm_efd_cb, k);
    k->status_ev = event_new(base, -1, EV_PERSIST, kvcm_status_cb, k);
    if (!k->efd_ev || !k->status_ev || event_add(k->efd_ev, NULL) < 0) {
        errmsg_set(err, errlen, "kvcm: cannot create loop events");
        kvcm_destroy(k);
        return -KVNODE_ENOMEM;
    }
    tv.tv_sec = (time_t)(k->st.heartbeat_interval_ms / 1000u);
    tv.tv_usec = (suseconds_t)((k->st.heartbeat_interval_ms % 1000u) * 1000u);
    evtimer_add(k->status_ev, &tv);
    kvcm_status_cb(-1, 0, k);
    if (pthread_create(&k->pub_thread, NULL, kvcm_publisher_main, k) != 0) {
        errmsg_set(err, errlen, "kvcm: cannot start the publisher thread");
        kvcm_destroy(k);
        return -KVNODE_EIO;
    }
    k->pub_started = true;
    if (pthread_create(&k->hb_thread, NULL, kvcm_heartbeat_main, k) != 0) {
        errmsg_set(err, errlen, "kvcm: cannot start the heartbeat thread");
        kvcm_destroy(k);
        return -KVNODE_EIO;
    }
    k->hb_started = true;
    for (size_t i = 0; i < k->ncaches; i++)
        cache_set_block_observer(k->caches[i], kvcm_block_event, kvcm_deployment_event, k);
    log_info("kvcm: publishing to %s as %s (%s), epoch %" PRIu64, k->st.endpoints[0],
             k->st.host_ip_port, k->st.storage_type, k->epoch);
    *out = k;
    return 0;
}

static void kvcm_join(struct kvcm *k)
{
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    atomic_store(&k->cancel, true);   /* calls in flight end now, not at their timeout */
    pthread_cond_broadcast(&k->cv);
    pthread_cond_broadcast(&k->hb_cv);
    pthread_mutex_unlock(&k->mu);
    if (k->pub_started)
        pthread_join(k->pub_thread, NULL);
    if (k->hb_started)
        pthread_join(k->hb_thread, NULL);
    k->pub_started = k->hb_started = false;
}

void kvcm_stop(struct kvcm *k)
{
    struct kvcm_client *cl = NULL;
    char err[256];

    if (!k)
        return;
    for (size_t i = 0; i < k->ncaches; i++)
        cache_set_block_observer(k->caches[i], NULL, NULL, NULL);
    if (k->walk) {
        cache_walk_cancel(k->caches[k->walk_cache], k->walk);
        k->walk = NULL;
    }
    kvcm_join(k);
    /* HOST_DOWN, alone in its request, to every instance KVCM may know
     * (also when the last call failed), all within host_down_timeout. */
    uint64_t deadline = clock_now_ms() + k->st.host_down_timeout_ms;
    struct kvcm_client_config cc = {
        .endpoints = (const char *const *)k->st.endpoints, .n_endpoints = k->st.n_endpoints,
        .connect_timeout_ms = k->st.host_down_timeout_ms, .request_timeout_ms = k->st.host_down_timeout_ms,
        .max_response_bytes = 1u << 20, .trace_prefix = k->trace_down,
    };
    if (kvcm_client_create(&cc, &cl, err, sizeof err) == 0) {
        for (size_t i = 0; i < k->ndeps; i++) {
            uint64_t now = clock_now_ms();
            if (!k->deps[i]->announced)
                continue;
            if (now >= deadline) {
                log_warn("kvcm: no time left for HOST_DOWN of instance %s", k->deps[i]->instance_id);
                continue;
            }
            json_t *events = json_array();
            struct kvcm_result r;
            json_array_append_new(events, kvcm_event_host_down());
            int st = kvcm_report_events(cl, k->deps[i]->instance_id, k->st.host_ip_port,
                                        k->st.storage_type, events, (uint32_t)(deadline - now), &r);
            json_decref(events);
            if (st == KVCM_OK)
                log_info("kvcm: HOST_DOWN sent for instance %s", k->deps[i]->instance_id);
            else
                log_warn("kvcm: HOST_DOWN for instance %s failed: %s: %s", k->deps[i]->instance_id,
                         kvcm_status_name(st), r.message);
        }
        kvcm_client_destroy(cl);
    }
    pthread_mutex_lock(&k->mu);
    k->state = KVCM_STATE_STOPPED;
    pthread_mutex_unlock(&k->mu);
}

void kvcm_destroy(struct kvcm *k)
{
    if (!k)
        return;
    for (size_t i = 0; i < k->ncaches; i++)
        cache_set_block_observer(k->caches[i], NULL, NULL, NULL);
    if (k->walk)
        cache_walk_cancel(k->caches[k->walk_cache], k->walk);
    kvcm_join(k);
    if (k->efd_ev)
        event_free(k->efd_ev);
    if (k->status_ev)
        event_free(k->status_ev);
    if (k->efd >= 0)
        close(k->efd);
    for (size_t i = 0; i < k->ndeps; i++) {
        keyset_free(&k->deps[i]->mirror);
        keyset_free(&k->deps[i]->pending);
        free(k->deps[i]);
    }
    free(k->walk_buf);
    free(k->walk_result);
    free(k->ring);
    free(k->post);
    free(k->batch);
    pthread_cond_destroy(&k->cv);
    pthread_cond_destroy(&k->hb_cv);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

uint64_t kvcm_epoch(const struct kvcm *k)
{
    return k ? k->epoch : 0;
}

/* The state as reported (under mu): a publisher whose work has waited past
 * stall_timeout without progress is STALLED, whatever it believes, unless
 * it already says DEGRADED or STOPPED. */
static int kvcm_shown_state(const struct kvcm *k, uint64_t waiting_ms)
{
    bool stalled = waiting_ms > k->st.stall_timeout_ms;
    if (stalled && k->state != KVCM_STATE_DEGRADED && k->state != KVCM_STATE_STOPPED)
        return KVCM_STATE_STALLED;
    return k->state;
}

bool kvcm_stalled(struct kvcm *k, char *why, size_t len)
{
    if (!k)
        return false;
    pthread_mutex_lock(&k->mu);
    uint64_t waiting = kvcm_waiting_ms(k, clock_now_ms());
    bool stalled = waiting > k->st.stall_timeout_ms;
    if (stalled && why)
        snprintf(why, len, "work has waited %" PRIu64 " ms without reaching KVCM (stall_timeout %"
                 PRIu32 " ms), state %s, %zu events queued%s%.300s", waiting, k->st.stall_timeout_ms,
                 kvcm_state_name(k->state), k->count, k->last_error[0] ? ", last error: " : "",
                 k->last_error);
    pthread_mutex_unlock(&k->mu);
    return stalled;
}

void kvcm_get_stats(struct kvcm *k, struct kvcm_stats *out)
{
    out->on = k != NULL;
    out->state = KVCM_STATE_DISABLED;
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    uint64_t waiting = kvcm_waiting_ms(k, clock_now_ms());
    out->state = kvcm_shown_state(k, waiting);
    out->stalled = waiting > k->st.stall_timeout_ms;
    out->stalled_ms = waiting;
    out->stall_timeout_ms = k->st.stall_timeout_ms;
    out->epoch = k->epoch;
    out->generation = k->generation;
    out->queue = k->count;
    out->queue_capacity = k->cap - 1;
    out->accepted = k->accepted;
    out->dropped = k->dropped;
    out->snapshots = k->snapshots;
    out->heartbeats_ok = k->heartbeats_ok;
    out->heartbeats_failed = k->heartbeats_failed;
    out->last_snapshot_unix_ms = k->last_snapshot_unix_ms;
    snprintf(out->last_error, sizeof out->last_error, "%s", k->last_error);
    out->host_ip_port = k->st.host_ip_port;
    out->nmedia = 0;
    if (k->st.has_hbm)
        out->media[out->nmedia++] = k->medium_name[MED_HBM];
    out->media[out->nmedia++] = k->medium_name[MED_DRAM];
    out->ndeployments = k->ndeps;
    for (size_t i = 0; i < k->ndeps; i++)
        out->deployments[i] = (struct kvcm_deployment_stats){
            .deployment_id = k->deps[i]->deployment_id, .instance_id = k->deps[i]->instance_id,
            .registered = k->deps[i]->heartbeat_ok, .refused = k->deps[i]->refused,
        };
    pthread_mutex_unlock(&k->mu);
}
