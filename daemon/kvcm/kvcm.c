/* kvcm: publisher and heartbeat threads keeping KVCM's view of this node
 * current (see kvcm.h). This file, the door: builds the pieces below it in
 * order (the shared state, the publisher's buffers, the loop events, the
 * two threads, then the caches' observers), ends them in reverse, and sends
 * HOST_DOWN at stop. It owns only the handles (struct kvcm). */
#include "kvcm/kvcm.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "core/log.h"
#include "kvcm/kvcm_client.h"
#include "kvcm/kvcm_events.h"
#include "kvcm/kvcm_heartbeat.h"
#include "kvcm/kvcm_publisher.h"
#include "kvcm/kvcm_shared.h"
#include "kvnode.h"

struct kvcm {
    struct kvcm_shared *shared;
    struct kvcm_publisher *pub;
    struct kvcm_events *events;
    struct kvcm_heartbeat *hb;
};

int kvcm_create(struct event_base *base, struct cache *const *caches, size_t n,
                const struct kvcm_settings *st, kvcm_status_fn status, void *status_arg,
                struct kvcm **out, char *err, size_t errlen)
{
    struct kvcm *k = calloc(1, sizeof *k);

    *out = NULL;
    if (!k || n > KVCM_MAX_CACHES) {
        free(k);
        errmsg_set(err, errlen, k ? "kvcm: more caches than it serves" : "kvcm: out of memory");
        return -KVNODE_ENOMEM;
    }
    int rc = kvcm_shared_create(st, &k->shared, err, errlen);
    if (rc < 0) {
        free(k);
        return rc;
    }
    if (kvcm_publisher_create(k->shared, &k->pub) < 0) {
        errmsg_set(err, errlen, "kvcm: cannot set up the publisher queue: out of memory");
        kvcm_destroy(k);
        return -KVNODE_ENOMEM;
    }
    const struct kvcm_settings *own = &kvcm_shared_conf(k->shared)->st;
    if (kvcm_events_create(base, k->shared, caches, n, own->heartbeat_interval_ms, status, status_arg,
                           &k->events) < 0) {
        errmsg_set(err, errlen, "kvcm: cannot create loop events");
        kvcm_destroy(k);
        return -KVNODE_ENOMEM;
    }
    if (kvcm_publisher_start(k->pub) < 0) {
        errmsg_set(err, errlen, "kvcm: cannot start the publisher thread");
        kvcm_destroy(k);
        return -KVNODE_EIO;
    }
    if (kvcm_heartbeat_start(k->shared, &k->hb) < 0) {
        errmsg_set(err, errlen, "kvcm: cannot start the heartbeat thread");
        kvcm_destroy(k);
        return -KVNODE_EIO;
    }
    kvcm_events_attach(k->events);
    log_info("kvcm: publishing to %s as %s (%s), epoch %" PRIu64, own->endpoints[0], own->host_ip_port,
             own->storage_type, kvcm_shared_conf(k->shared)->epoch);
    *out = k;
    return 0;
}

/* Observers off, walk cancelled, both threads ended (calls in flight abandoned). */
static void kvcm_quiesce(struct kvcm *k)
{
    kvcm_events_detach(k->events);
    kvcm_shared_stop(k->shared);
    kvcm_publisher_join(k->pub);
    kvcm_heartbeat_join(k->hb);
    k->hb = NULL;
}

/* HOST_DOWN, alone in its request, to every instance KVCM may know (also
 * when the last call failed), all within host_down_timeout. */
static void kvcm_host_down(struct kvcm *k)
{
    const struct kvcm_conf *c = kvcm_shared_conf(k->shared);
    const char *ids[KVCM_MAX_DEPLOYMENTS];
    size_t n = kvcm_shared_announced(k->shared, ids, KVCM_MAX_DEPLOYMENTS);
    struct kvcm_client *cl = NULL;
    char err[256];

    uint64_t deadline = clock_now_ms() + c->st.host_down_timeout_ms;
    struct kvcm_client_config cc = {
        .endpoints = (const char *const *)c->st.endpoints, .n_endpoints = c->st.n_endpoints,
        .connect_timeout_ms = c->st.host_down_timeout_ms, .request_timeout_ms = c->st.host_down_timeout_ms,
        .max_response_bytes = 1u << 20, .trace_prefix = c->trace_down,
    };
    if (kvcm_client_create(&cc, &cl, err, sizeof err) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        uint64_t now = clock_now_ms();
        if (now >= deadline) {
            log_warn("kvcm: no time left for HOST_DOWN of instance %s", ids[i]);
            continue;
        }
        json_t *events = json_array();
        struct kvcm_result r;
        json_array_append_new(events, kvcm_event_host_down());
        int st = kvcm_report_events(cl, ids[i], c->st.host_ip_port, c->st.storage_type, events,
                                    (uint32_t)(deadline - now), &r);
        json_decref(events);
        if (st == KVCM_OK)
            log_info("kvcm: HOST_DOWN sent for instance %s", ids[i]);
        else
            log_warn("kvcm: HOST_DOWN for instance %s failed: %s: %s", ids[i], kvcm_status_name(st),
                     r.message);
    }
    kvcm_client_destroy(cl);
}

void kvcm_stop(struct kvcm *k)
{
    if (!k)
        return;
    kvcm_quiesce(k);
    kvcm_host_down(k);
    kvcm_shared_stopped(k->shared);
}

void kvcm_stop_handed_over(struct kvcm *k)
{
    if (!k)
        return;
    kvcm_quiesce(k);
    kvcm_shared_stopped(k->shared);
}

void kvcm_destroy(struct kvcm *k)
{
    if (!k)
        return;
    kvcm_quiesce(k);
    kvcm_events_destroy(k->events);   /* its events watch the state's eventfd */
    kvcm_publisher_destroy(k->pub);
    kvcm_shared_destroy(k->shared);
    free(k);
}

void kvcm_resync(struct kvcm *k)
{
    if (k)
        kvcm_shared_dirty(k->shared);
}

uint64_t kvcm_epoch(const struct kvcm *k)
{
    return k ? kvcm_shared_conf(k->shared)->epoch : 0;
}

bool kvcm_stalled(struct kvcm *k, char *why, size_t len)
{
    return k ? kvcm_shared_stalled(k->shared, why, len) : false;
}

void kvcm_get_stats(struct kvcm *k, struct kvcm_stats *out)
{
    out->on = k != NULL;
    out->state = KVCM_STATE_DISABLED;
    if (k)
        kvcm_shared_stats(k->shared, out);
}
