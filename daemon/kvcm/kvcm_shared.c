/* kvcm_shared: the state the KVCM pieces share, its one owner (see
 * kvcm_shared.h). Which thread touches which field is said at the field. */
#include "kvcm/kvcm_shared.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "core/log.h"
#include "kvcm/kvcm_client.h"
#include "kvnode.h"

struct kvcm_shared {
    struct kvcm_conf conf;                    /* fixed at create */
    int efd;                                  /* publisher -> loop: walk wanted */

    pthread_mutex_t mu;
    pthread_cond_t cv;                        /* wakes the publisher (its only waiter) */
    pthread_cond_t hb_cv;                     /* wakes the heartbeat thread (stop only): on a
                                                 shared cv a signal meant for the publisher
                                                 could wake the heartbeat instead and be lost */
    /* --- under mu --- */
    struct kvcm_ev *ring;
    size_t cap, head, count;                  /* ring of cap events (one slot kept for the marker) */
    bool stop;
    atomic_bool cancel;                       /* stop: abandon calls in flight */
    bool dirty;                               /* an event was dropped: resync */
    bool walk_wanted;                         /* the publisher asked the loop for a walk */
    struct kvcm_ev *walk_result;              /* handed over by the loop when a walk ends */
    size_t walk_n;
    bool walk_ready;
    bool deps_added;                          /* a deployment appeared: the publisher registers it */
    struct kvcm_dep *deps[KVCM_MAX_DEPLOYMENTS];
    size_t ndeps;
    struct kvcm_node_status node;
    int state;
    char last_error[KVCM_ERR_MAX];
    uint64_t accepted, dropped, snapshots, generation, last_snapshot_unix_ms;
    uint64_t heartbeats_ok, heartbeats_failed;
    /* Liveness: since when work has been waiting (0: none), and when the
     * publisher last got something to KVCM. Work waiting longer than
     * stall_timeout without progress is a stall. Monotonic ms. */
    uint64_t work_since_ms, progress_ms;
};

uint64_t kvcm_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* --- life ------------------------------------------------------------------------------ */

static const char *kvcm_own(struct kvcm_conf *c, int slot, const char *s)
{
    snprintf(c->text[slot], sizeof c->text[slot], "%s", s ? s : "");
    return c->text[slot];
}

static void kvcm_conf_copy(struct kvcm_conf *c, const struct kvcm_settings *st)
{
    c->st = *st;
    for (size_t i = 0; i < st->n_endpoints && i < KVCM_MAX_ENDPOINTS; i++) {
        snprintf(c->endpoints[i], sizeof c->endpoints[i], "%s", st->endpoints[i]);
        c->st.endpoints[i] = c->endpoints[i];
    }
    c->st.instance_group = kvcm_own(c, 0, st->instance_group);
    c->st.instance_id_template = kvcm_own(c, 1, st->instance_id_template);
    c->st.host_ip_port = kvcm_own(c, 2, st->host_ip_port);
    c->st.storage_type = kvcm_own(c, 3, st->storage_type);
    c->st.medium_host = kvcm_own(c, 4, st->medium_host);
    c->st.spec_name_template = kvcm_own(c, 5, st->spec_name_template);
    c->st.location_uri_template = kvcm_own(c, 6, st->location_uri_template);
    c->st.medium_hbm = kvcm_own(c, 7, st->medium_hbm);
    c->medium_name[MED_NONE] = "";
    c->medium_name[MED_HBM] = c->st.medium_hbm;
    c->medium_name[MED_DRAM] = c->st.medium_host;
    if (c->st.batch_events == 0)
        c->st.batch_events = 1;
    c->epoch = kvcm_unix_ms();
    snprintf(c->trace_pub, sizeof c->trace_pub, "%s-%" PRIu64 "-pub", c->st.host_ip_port, c->epoch);
    snprintf(c->trace_hb, sizeof c->trace_hb, "%s-%" PRIu64 "-hb", c->st.host_ip_port, c->epoch);
    snprintf(c->trace_down, sizeof c->trace_down, "%s-%" PRIu64 "-down", c->st.host_ip_port, c->epoch);
}

int kvcm_shared_create(const struct kvcm_settings *st, struct kvcm_shared **out, char *err, size_t errlen)
{
    struct kvcm_shared *s = calloc(1, sizeof *s);

    *out = NULL;
    if (!s) {
        errmsg_set(err, errlen, "kvcm: out of memory");
        return -KVNODE_ENOMEM;
    }
    kvcm_conf_copy(&s->conf, st);
    s->cap = (size_t)s->conf.st.queue_events + 1;
    s->ring = calloc(s->cap, sizeof *s->ring);
    s->state = KVCM_STATE_STARTING;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->hb_cv, NULL);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!s->ring || s->efd < 0) {
        errmsg_set(err, errlen, "kvcm: cannot set up the publisher queue: %s",
                   s->efd < 0 ? strerror(errno) : "out of memory");
        kvcm_shared_destroy(s);
        return -KVNODE_ENOMEM;
    }
    *out = s;
    return 0;
}

const struct kvcm_conf *kvcm_shared_conf(const struct kvcm_shared *s)
{
    return &s->conf;
}

atomic_bool *kvcm_shared_cancel(struct kvcm_shared *s)
{
    return &s->cancel;
}

void kvcm_shared_stop(struct kvcm_shared *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    atomic_store(&s->cancel, true);   /* calls in flight end now, not at their timeout */
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->hb_cv);
    pthread_mutex_unlock(&s->mu);
}

void kvcm_shared_stopped(struct kvcm_shared *s)
{
    pthread_mutex_lock(&s->mu);
    s->state = KVCM_STATE_STOPPED;
    pthread_mutex_unlock(&s->mu);
}

size_t kvcm_shared_announced(struct kvcm_shared *s, const char **ids, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->ndeps && n < max; i++)
        if (s->deps[i]->announced)
            ids[n++] = s->deps[i]->instance_id;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void kvcm_shared_destroy(struct kvcm_shared *s)
{
    if (!s)
        return;
    if (s->efd >= 0)
        close(s->efd);
    for (size_t i = 0; i < s->ndeps; i++) {
        keyset_free(&s->deps[i]->mirror);
        keyset_free(&s->deps[i]->pending);
        free(s->deps[i]);
    }
    free(s->walk_result);
    free(s->ring);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->hb_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* --- state, errors, the stall clock ------------------------------------------------------ */

void kvcm_shared_error(struct kvcm_shared *s, int state, const char *fmt, ...)
{
    char msg[KVCM_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&s->mu);
    bool changed = strcmp(s->last_error, msg) != 0 || s->state != state;
    memcpy(s->last_error, msg, sizeof msg);
    s->state = state;
    pthread_mutex_unlock(&s->mu);
    if (changed)
        log_warn("kvcm: %s", msg);
}

void kvcm_shared_set_state(struct kvcm_shared *s, int state)
{
    pthread_mutex_lock(&s->mu);
    if (s->state != KVCM_STATE_STOPPED)
        s->state = state;
    pthread_mutex_unlock(&s->mu);
}

/* Work is waiting (under mu): the stall clock starts unless it runs. */
static void kvcm_work_arrived(struct kvcm_shared *s)
{
    if (!s->work_since_ms)
        s->work_since_ms = clock_now_ms();
}

/* How long work has waited without progress (under mu); 0: none waits. */
static uint64_t kvcm_waiting_ms(const struct kvcm_shared *s, uint64_t now)
{
    if (!s->work_since_ms)
        return 0;
    uint64_t since = s->progress_ms > s->work_since_ms ? s->progress_ms : s->work_since_ms;
    return now > since ? now - since : 0;
}

/* The state as reported (under mu): a publisher whose work has waited past
 * stall_timeout without progress is STALLED, whatever it believes, unless
 * it already says DEGRADED or STOPPED. */
static int kvcm_shown_state(const struct kvcm_shared *s, uint64_t waiting_ms)
{
    bool stalled = waiting_ms > s->conf.st.stall_timeout_ms;
    if (stalled && s->state != KVCM_STATE_DEGRADED && s->state != KVCM_STATE_STOPPED)
        return KVCM_STATE_STALLED;
    return s->state;
}

bool kvcm_shared_stalled(struct kvcm_shared *s, char *why, size_t len)
{
    pthread_mutex_lock(&s->mu);
    uint64_t waiting = kvcm_waiting_ms(s, clock_now_ms());
    bool stalled = waiting > s->conf.st.stall_timeout_ms;
    if (stalled && why)
        snprintf(why, len, "work has waited %" PRIu64 " ms without reaching KVCM (stall_timeout %"
                 PRIu32 " ms), state %s, %zu events queued%s%.300s", waiting, s->conf.st.stall_timeout_ms,
                 kvcm_state_name(s->state), s->count, s->last_error[0] ? ", last error: " : "",
                 s->last_error);
    pthread_mutex_unlock(&s->mu);
    return stalled;
}

void kvcm_shared_stats(struct kvcm_shared *s, struct kvcm_stats *out)
{
    pthread_mutex_lock(&s->mu);
    uint64_t waiting = kvcm_waiting_ms(s, clock_now_ms());
    out->state = kvcm_shown_state(s, waiting);
    out->stalled = waiting > s->conf.st.stall_timeout_ms;
    out->stalled_ms = waiting;
    out->stall_timeout_ms = s->conf.st.stall_timeout_ms;
    out->epoch = s->conf.epoch;
    out->generation = s->generation;
    out->queue = s->count;
    out->queue_capacity = s->cap - 1;
    out->accepted = s->accepted;
    out->dropped = s->dropped;
    out->snapshots = s->snapshots;
    out->heartbeats_ok = s->heartbeats_ok;
    out->heartbeats_failed = s->heartbeats_failed;
    out->last_snapshot_unix_ms = s->last_snapshot_unix_ms;
    snprintf(out->last_error, sizeof out->last_error, "%s", s->last_error);
    out->host_ip_port = s->conf.st.host_ip_port;
    out->nmedia = 0;
    if (s->conf.st.has_hbm)
        out->media[out->nmedia++] = s->conf.medium_name[MED_HBM];
    out->media[out->nmedia++] = s->conf.medium_name[MED_DRAM];
    out->ndeployments = s->ndeps;
    for (size_t i = 0; i < s->ndeps; i++)
        out->deployments[i] = (struct kvcm_deployment_stats){
            .deployment_id = s->deps[i]->deployment_id, .instance_id = s->deps[i]->instance_id,
            .registered = s->deps[i]->heartbeat_ok, .refused = s->deps[i]->refused,
        };
    pthread_mutex_unlock(&s->mu);
}

/* --- deployments (under mu) ---------------------------------------------------------------- */

static struct kvcm_dep *kvcm_dep_new(const struct kvcm_conf *c, const struct kv_namespace *ns)
{
    struct kvcm_dep *d = calloc(1, sizeof *d);
    struct config_kvcm_vars v = {
        .model = ns->layout.model, .dtype = ns->layout.dtype,
        .block_tokens = ns->layout.block_tokens, .tp_size = ns->layout.tp_size,
        .fingerprint = ns->fingerprint, .host_ip_port = c->st.host_ip_port,
        .block_bytes = ns->layout.block_bytes * ns->layout.tp_size, .key = 0,
    };
    if (!d)
        return NULL;
    d->fingerprint = ns->fingerprint;
    d->layout = ns->layout;
    snprintf(d->deployment_id, sizeof d->deployment_id, "%s", ns->deployment_id);
    d->spec_bytes = v.block_bytes;
    d->uri_per_key = strstr(c->st.location_uri_template, "{key}") != NULL;
    bool ok = config_kvcm_expand(c->st.instance_id_template, &v, d->instance_id,
                                 sizeof d->instance_id) >= 0 &&
              config_kvcm_expand(c->st.spec_name_template, &v, d->spec_name, sizeof d->spec_name) >= 0;
    for (int m = MED_HBM; ok && m < MED_COUNT; m++) {
        v.medium = c->medium_name[m];
        ok = config_kvcm_expand(c->st.location_uri_template, &v, d->uri[m], sizeof d->uri[m]) >= 0;
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
static int kvcm_dep_index(struct kvcm_shared *s, const struct kv_namespace *ns)
{
    /* The fingerprint finds it; equal fields confirm it, so that even two
     * deployments whose fingerprints met (a 64-bit hash) stay two, and the
     * second is refused below for its instance id. */
    for (size_t i = 0; i < s->ndeps; i++)
        if (s->deps[i]->fingerprint == ns->fingerprint &&
            ns_same_deployment(&s->deps[i]->layout, &ns->layout))
            return (int)i;
    if (s->ndeps >= KVCM_MAX_DEPLOYMENTS)
        return -1;
    struct kvcm_dep *d = kvcm_dep_new(&s->conf, ns);
    if (!d)
        return -1;
    for (size_t i = 0; i < s->ndeps && !d->refused; i++) {
        if (strcmp(s->deps[i]->instance_id, d->instance_id) != 0)
            continue;
        snprintf(d->refused_text, sizeof d->refused_text,
                 "deployment %s maps to instance id %s, already in use by deployment %s: not "
                 "publishing %s (put {fingerprint} in [kvcm] instance_id)", d->deployment_id,
                 d->instance_id, s->deps[i]->deployment_id, d->deployment_id);
        d->refused = d->refused_text;
        d->failed_terminal = true;   /* before the publisher ever sees it */
        snprintf(s->last_error, sizeof s->last_error, "%.*s", (int)sizeof s->last_error - 1,
                 d->refused_text);
        if (s->state != KVCM_STATE_STOPPED)
            s->state = KVCM_STATE_DEGRADED;
        log_error("kvcm: %s", d->refused_text);
    }
    s->deps[s->ndeps] = d;
    if (!d->refused)
        log_info("kvcm: deployment %s publishes as instance %s (spec %s, %" PRIu64 " bytes per block)",
                 ns->deployment_id, d->instance_id, d->spec_name, d->spec_bytes);
    s->deps_added = true;
    kvcm_work_arrived(s);
    pthread_cond_signal(&s->cv);
    return (int)s->ndeps++;
}

/* --- the loop's side ----------------------------------------------------------------------- */

/* Append under mu. Normal events leave the last slot for the marker. */
static bool kvcm_ring_push(struct kvcm_shared *s, const struct kvcm_ev *ev)
{
    size_t limit = ev->kind == EV_MARKER ? s->cap : s->cap - 1;
    if (s->count >= limit)
        return false;
    s->ring[(s->head + s->count) % s->cap] = *ev;
    s->count++;
    return true;
}

void kvcm_shared_block(struct kvcm_shared *s, const struct kv_namespace *ns, int64_t key, int medium)
{
    pthread_mutex_lock(&s->mu);
    int dep = kvcm_dep_index(s, ns);
    if (dep >= 0 && !s->deps[dep]->refused) {
        struct kvcm_ev ev = { .dep = (uint32_t)dep, .kind = EV_BLOCK,
                              .medium = medium == MED_HBM || medium == MED_DRAM ? (uint8_t)medium
                                                                                : MED_NONE,
                              .key = key };
        kvcm_work_arrived(s);
        if (kvcm_ring_push(s, &ev)) {
            s->accepted++;
            if (s->count == 1)
                pthread_cond_signal(&s->cv);
        } else {
            s->dropped++;
            if (!s->dirty) {
                s->dirty = true;
                pthread_cond_signal(&s->cv);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void kvcm_shared_deployment(struct kvcm_shared *s, const struct kv_namespace *ns)
{
    pthread_mutex_lock(&s->mu);
    kvcm_dep_index(s, ns);
    pthread_mutex_unlock(&s->mu);
}

int kvcm_shared_dep_of(struct kvcm_shared *s, const struct kv_namespace *ns)
{
    pthread_mutex_lock(&s->mu);
    int dep = kvcm_dep_index(s, ns);
    pthread_mutex_unlock(&s->mu);
    return dep;
}

int kvcm_shared_walk_fd(const struct kvcm_shared *s)
{
    return s->efd;
}

/* The publisher asks again only after it took the last walk's result, so
 * no walk runs now and the marker's kept slot is free. */
bool kvcm_shared_walk_begin(struct kvcm_shared *s, bool walking)
{
    pthread_mutex_lock(&s->mu);
    bool wanted = s->walk_wanted && !walking;
    if (wanted) {
        struct kvcm_ev marker = { .kind = EV_MARKER };
        s->walk_wanted = false;
        s->dirty = false;   /* the walk sees everything dropped so far */
        if (!kvcm_ring_push(s, &marker))
            log_error("kvcm: no room for the resync marker (a bug): the walk goes on without it");
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return wanted;
}

bool kvcm_shared_walk_end(struct kvcm_shared *s, struct kvcm_ev *result, size_t n, bool incomplete)
{
    pthread_mutex_lock(&s->mu);
    free(s->walk_result);
    s->walk_result = result;
    s->walk_n = n;
    s->walk_ready = true;
    if (incomplete)
        s->dirty = true;
    bool again = s->walk_wanted;   /* asked while this walk ran (not expected): do not lose it */
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return again;
}

void kvcm_shared_node(struct kvcm_shared *s, const struct kvcm_node_status *node)
{
    pthread_mutex_lock(&s->mu);
    s->node = *node;
    pthread_mutex_unlock(&s->mu);
}

/* --- the publisher's side --------------------------------------------------------------------- */

int kvcm_shared_take(struct kvcm_shared *s, struct kvcm_ev *out, size_t max, struct kvcm_dep **deps,
                    size_t *ndeps)
{
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    *ndeps = s->ndeps;
    memcpy(deps, s->deps, s->ndeps * sizeof deps[0]);
    while (s->count > 0 && n < max) {
        out[n++] = s->ring[s->head];
        s->head = (s->head + 1) % s->cap;
        s->count--;
    }
    s->deps_added = false;
    for (size_t i = 0; i < s->ndeps; i++) {
        struct kvcm_dep *d = s->deps[i];
        if (d->reinstance)
            d->instance_ok = false;   /* straight to registerInstance */
        if (d->reregister || d->reinstance)
            d->node_ok = false;
        d->reregister = d->reinstance = false;
    }
    pthread_mutex_unlock(&s->mu);
    return (int)n;
}

void kvcm_shared_dirty(struct kvcm_shared *s)
{
    pthread_mutex_lock(&s->mu);
    s->dirty = true;
    pthread_mutex_unlock(&s->mu);
}

bool kvcm_shared_take_walk(struct kvcm_shared *s, struct kvcm_ev **res, size_t *n, struct kvcm_dep **deps,
                          size_t *ndeps)
{
    pthread_mutex_lock(&s->mu);
    bool ready = s->walk_ready;
    if (ready) {
        *res = s->walk_result;
        *n = s->walk_n;
        s->walk_result = NULL;
        s->walk_ready = false;
        *ndeps = s->ndeps;
        memcpy(deps, s->deps, s->ndeps * sizeof deps[0]);
    }
    pthread_mutex_unlock(&s->mu);
    return ready;
}

bool kvcm_shared_ask_walk(struct kvcm_shared *s)
{
    pthread_mutex_lock(&s->mu);
    bool ask = s->dirty;
    if (ask)
        s->walk_wanted = true;
    pthread_mutex_unlock(&s->mu);
    if (ask) {
        uint64_t one = 1;
        if (write(s->efd, &one, sizeof one) < 0)
            log_warn("kvcm: cannot ask the loop for a walk: %s", strerror(errno));
    }
    return ask;
}

void kvcm_shared_progress(struct kvcm_shared *s)
{
    pthread_mutex_lock(&s->mu);
    s->progress_ms = clock_now_ms();
    pthread_mutex_unlock(&s->mu);
}

void kvcm_shared_announced_dep(struct kvcm_shared *s, struct kvcm_dep *d)
{
    pthread_mutex_lock(&s->mu);
    d->announced = true;
    pthread_mutex_unlock(&s->mu);
}

void kvcm_shared_registered_dep(struct kvcm_shared *s, struct kvcm_dep *d)
{
    pthread_mutex_lock(&s->mu);
    d->heartbeat_ok = true;
    pthread_mutex_unlock(&s->mu);
}

void kvcm_shared_snapshot_sent(struct kvcm_shared *s)
{
    pthread_mutex_lock(&s->mu);
    s->snapshots++;
    s->generation++;
    s->last_snapshot_unix_ms = kvcm_unix_ms();
    pthread_mutex_unlock(&s->mu);
}

/* An absolute CLOCK_REALTIME deadline ms from now (pthread_cond_timedwait). */
static struct timespec kvcm_deadline(uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000u);
    ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

void kvcm_shared_sleep(struct kvcm_shared *s, bool caught_up, bool awaiting_walk, bool resyncing,
                      uint64_t wait_ms)
{
    pthread_mutex_lock(&s->mu);
    if (caught_up && s->count == 0 && !s->dirty && !s->deps_added)
        s->work_since_ms = 0;   /* nothing waits */
    else
        kvcm_work_arrived(s);
    bool told = s->deps_added;
    for (size_t i = 0; i < s->ndeps && !told; i++)
        told = s->deps[i]->reregister || s->deps[i]->reinstance;
    if (!s->stop && s->count == 0 && !told && !(awaiting_walk && s->walk_ready) &&
        !(s->dirty && !resyncing)) {
        struct timespec ts = kvcm_deadline(wait_ms);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
}

/* --- the heartbeat's side ----------------------------------------------------------------------- */

bool kvcm_shared_beat_wait(struct kvcm_shared *s, struct kvcm_beat *b)
{
    pthread_mutex_lock(&s->mu);
    struct timespec ts = kvcm_deadline(s->conf.st.heartbeat_interval_ms);
    while (!s->stop && pthread_cond_timedwait(&s->hb_cv, &s->mu, &ts) != ETIMEDOUT) {}
    bool go = !s->stop;
    if (go) {
        b->ndeps = s->ndeps;
        memcpy(b->deps, s->deps, s->ndeps * sizeof b->deps[0]);
        for (size_t i = 0; i < s->ndeps; i++)
            b->ok[i] = s->deps[i]->heartbeat_ok;
        b->node = s->node;
        b->generation = s->generation;
        b->queued = s->count;
    }
    pthread_mutex_unlock(&s->mu);
    return go;
}

void kvcm_shared_beat_done(struct kvcm_shared *s, struct kvcm_dep *d, int status)
{
    pthread_mutex_lock(&s->mu);
    if (status == KVCM_OK) {
        s->heartbeats_ok++;
    } else {
        s->heartbeats_failed++;
        if (status == KVCM_NODE_NOT_REGISTERED || status == KVCM_INSTANCE_NOT_EXIST) {
            d->heartbeat_ok = false;
            if (status == KVCM_INSTANCE_NOT_EXIST)
                d->reinstance = true;   /* NODE_REGISTER would fail the same way */
            else
                d->reregister = true;
            pthread_cond_broadcast(&s->cv);
        }
    }
    pthread_mutex_unlock(&s->mu);
}
