/* kvcm: publisher and heartbeat threads keeping KVCM's view of this node
 * current (see kvcm.h). */
#include "kvcm/kvcm.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "cache/cache.h"
#include "core/clock.h"
#include "kvcm/kvcm_config.h"
#include "core/errmsg.h"
#include "kvcm/kvcm_client.h"
#include "kvcm/keyset.h"
#include "kvnode.h"
#include "core/log.h"


enum { EV_BLOCK = 1, EV_MARKER = 2 };

/* Media, as enum cache_medium numbers them (0: not complete). */
enum { MED_NONE = CACHE_MEDIUM_NONE, MED_HBM = CACHE_MEDIUM_HBM, MED_DRAM = CACHE_MEDIUM_HOST,
       MED_COUNT };
/* A pending delta (keyset value): the key's medium now in the low bits, plus
 * the media KVCM may still hold it in and must be told to drop. */
#define PEND_MEDIUM   0x3u
#define PEND_DROP(m)  (uint8_t)(0x4u << (m))   /* m = MED_HBM or MED_DRAM */

struct kvcm_ev {
    uint32_t dep;
    uint8_t  kind;
    uint8_t  medium;                          /* EV_BLOCK: MED_*; MED_NONE: not complete */
    int64_t  key;
};

/* One deployment = one KVCM instance. Immutable after creation except where
 * marked. */
struct kvcm_dep {
    uint64_t fingerprint;
    struct ns_layout layout;
    char deployment_id[NS_DEPLOYMENT_ID_MAX];
    char instance_id[CONFIG_KVCM_TEMPLATE_MAX];
    char spec_name[CONFIG_KVCM_TEMPLATE_MAX];
    char uri[MED_COUNT][CONFIG_KVCM_TEMPLATE_MAX]; /* per medium, when the template has no {key} */
    bool uri_per_key;
    uint64_t spec_bytes;                      /* block_bytes x tp_size */
    const char *refused;                      /* why it is never published (its instance id is
                                                 another deployment's), NULL: it is */
    char refused_text[2 * KVCM_ERR_MAX];
    /* publisher thread only */
    bool instance_ok, node_ok, need_snapshot, failed_terminal;
    struct keyset mirror;                     /* complete keys (what KVCM should hold): medium */
    struct keyset pending;                    /* deltas not sent yet (PEND_*) */
    uint64_t last_snapshot_ms, next_try_ms;
    /* under mu */
    bool heartbeat_ok;                        /* NODE_REGISTER went through: heartbeat it */
    bool announced;                           /* KVCM may know us: HOST_DOWN at stop */
    bool reregister;                          /* the heartbeat learnt KVCM forgot our node */
    bool reinstance;                          /* ... or the whole instance */
};

struct kvcm {
    struct event_base *base;
    struct cache *cache;
    struct kvcm_settings st;
    char endpoints[KVCM_MAX_ENDPOINTS][CONFIG_URL_MAX];
    char text[9][CONFIG_KVCM_TEMPLATE_MAX];   /* owned copies of the settings' strings */
    const char *medium_name[MED_COUNT];       /* wire names, by MED_* */
    /* "<host_ip_port>-<epoch>-<thread>": unique across restarts and threads */
    char trace_pub[CONFIG_KVCM_NAME_MAX + 40], trace_hb[CONFIG_KVCM_NAME_MAX + 40],
         trace_down[CONFIG_KVCM_NAME_MAX + 40];
    uint64_t epoch;

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

    /* loop thread */
    int efd;                                  /* publisher -> loop: walk wanted */
    struct event *efd_ev, *status_ev;
    struct cache_walk *walk;
    struct kvcm_ev *walk_buf;
    size_t walk_len, walk_cap;
    bool walk_oom;
    kvcm_status_fn status_fn;
    void *status_arg;

    /* publisher thread */
    bool resyncing;                           /* a walk was asked for and not yet taken: at most
                                                 one marker is ever in the ring */
    bool awaiting_walk;                       /* its marker was dequeued: later events wait in
                                                 post for the walk's result */
    struct kvcm_ev *post, *batch;
    size_t post_n, post_cap;
    uint32_t backoff_ms;

    /* Not in the liveness registry: a call may rightly block for up to
     * snapshot_timeout, and KVCM being slow must never stop the watchdog. */
    pthread_t pub_thread, hb_thread;
    bool pub_started, hb_started;
};

const char *kvcm_state_name(int state)
{
    static const char *const names[] = { "DISABLED", "STARTING", "REGISTERING", "RESYNCING",
                                         "READY", "DEGRADED", "STOPPED", "STALLED" };
    return state >= 0 && state <= KVCM_STATE_STALLED ? names[state] : "UNKNOWN";
}

static uint64_t kvcm_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void kvcm_set_error(struct kvcm *k, int state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kvcm_set_error(struct kvcm *k, int state, const char *fmt, ...)
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

static void kvcm_set_state(struct kvcm *k, int state)
{
    pthread_mutex_lock(&k->mu);
    if (k->state != KVCM_STATE_STOPPED)
        k->state = state;
    pthread_mutex_unlock(&k->mu);
}

/* Work is waiting (under mu): the stall clock starts unless it runs. */
static void kvcm_work_arrived(struct kvcm *k)
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
 * would erase the other's blocks. */
static int kvcm_dep_index(struct kvcm *k, const struct kv_namespace *ns)
{
    for (size_t i = 0; i < k->ndeps; i++)
        if (k->deps[i]->fingerprint == ns->fingerprint)
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
static void kvcm_efd_cb(evutil_socket_t fd, short what, void *arg)
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
    if (wanted && cache_walk_complete(k->cache, kvcm_walk_found, kvcm_walk_done, k, &k->walk) < 0) {
        log_error("kvcm: cannot start a walk of the index: out of memory");
        k->walk_oom = true;
        kvcm_walk_done(k);
    }
}

static void kvcm_status_cb(evutil_socket_t fd, short what, void *arg)
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

static void *kvcm_publisher_main(void *arg)
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

/* --- heartbeat thread --------------------------------------------------------------- */

static void *kvcm_heartbeat_main(void *arg)
{
    struct kvcm *k = arg;
    struct kvcm_client *cl = NULL;
    struct kvcm_client_config cc = {
        .endpoints = (const char *const *)k->st.endpoints, .n_endpoints = k->st.n_endpoints,
        .connect_timeout_ms = k->st.connect_timeout_ms, .request_timeout_ms = k->st.request_timeout_ms,
        .max_response_bytes = 1u << 20, .trace_prefix = k->trace_hb,
    };
    char err[256];
    sigset_t all;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    if (kvcm_client_create(&cc, &cl, err, sizeof err) < 0) {
        kvcm_set_error(k, KVCM_STATE_DEGRADED, "cannot create the KVCM heartbeat client: %s", err);
        return NULL;
    }
    kvcm_client_set_cancel(cl, &k->cancel);
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)(k->st.heartbeat_interval_ms / 1000u);
        ts.tv_nsec += (long)(k->st.heartbeat_interval_ms % 1000u) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!k->stop && pthread_cond_timedwait(&k->hb_cv, &k->mu, &ts) != ETIMEDOUT) {}
        if (k->stop)
            break;
        struct kvcm_dep *deps[KVCM_MAX_DEPLOYMENTS];
        bool ok[KVCM_MAX_DEPLOYMENTS];
        size_t ndeps = k->ndeps;
        memcpy(deps, k->deps, ndeps * sizeof deps[0]);
        for (size_t i = 0; i < ndeps; i++)
            ok[i] = deps[i]->heartbeat_ok;
        struct kvcm_node_status node = k->node;
        uint64_t generation = k->generation, queued = k->count;
        pthread_mutex_unlock(&k->mu);

        for (size_t i = 0; i < ndeps; i++) {
            if (!ok[i])
                continue;
            char buf[32];
            json_t *status = json_object(), *events = json_array();
#define KVCM_STATUS_U(name, v) do { snprintf(buf, sizeof buf, "%" PRIu64, (uint64_t)(v)); \
                                    json_object_set_new(status, name, json_string(buf)); } while (0)
            KVCM_STATUS_U("epoch", k->epoch);
            KVCM_STATUS_U("generation", generation);
            KVCM_STATUS_U("host_blocks", node.host_blocks);
            KVCM_STATUS_U("host_free_bytes", node.host_free_bytes);
            KVCM_STATUS_U("store_blocks", node.store_blocks);
            KVCM_STATUS_U("clients", node.clients);
            KVCM_STATUS_U("queue", queued);
#undef KVCM_STATUS_U
            json_array_append_new(events, kvcm_event_heartbeat(status));
            struct kvcm_result r;
            int st = kvcm_report_events(cl, deps[i]->instance_id, k->st.host_ip_port,
                                        k->st.storage_type, events, k->st.request_timeout_ms, &r);
            json_decref(events);
            pthread_mutex_lock(&k->mu);
            if (st == KVCM_OK) {
                k->heartbeats_ok++;
            } else {
                k->heartbeats_failed++;
                if (st == KVCM_NODE_NOT_REGISTERED || st == KVCM_INSTANCE_NOT_EXIST) {
                    deps[i]->heartbeat_ok = false;
                    if (st == KVCM_INSTANCE_NOT_EXIST)
                        deps[i]->reinstance = true;   /* NODE_REGISTER would fail the same way */
                    else
                        deps[i]->reregister = true;
                    pthread_cond_broadcast(&k->cv);
                }
            }
            pthread_mutex_unlock(&k->mu);
        }
        pthread_mutex_lock(&k->mu);
    }
    pthread_mutex_unlock(&k->mu);
    kvcm_client_destroy(cl);
    return NULL;
}

/* --- lifecycle ------------------------------------------------------------------------ */

static const char *kvcm_own(struct kvcm *k, int slot, const char *s)
{
    snprintf(k->text[slot], sizeof k->text[slot], "%s", s ? s : "");
    return k->text[slot];
}

int kvcm_create(struct event_base *base, struct cache *cache, const struct kvcm_settings *st,
                kvcm_status_fn status, void *status_arg, struct kvcm **out, char *err, size_t errlen)
{
    struct kvcm *k = calloc(1, sizeof *k);
    struct timeval tv;

    *out = NULL;
    if (!k) {
        errmsg_set(err, errlen, "kvcm: out of memory");
        return -KVNODE_ENOMEM;
    }
    k->base = base;
    k->cache = cache;
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
    cache_set_block_observer(cache, kvcm_block_event, kvcm_deployment_event, k);
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
    cache_set_block_observer(k->cache, NULL, NULL, NULL);
    if (k->walk) {
        cache_walk_cancel(k->cache, k->walk);
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
    if (k->cache)
        cache_set_block_observer(k->cache, NULL, NULL, NULL);
    if (k->walk)
        cache_walk_cancel(k->cache, k->walk);
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
