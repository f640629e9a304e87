/* kvcm_heartbeat: the heartbeat thread. EVENT_HEARTBEAT for every
 * registered deployment each heartbeat_interval, on its own kvcm_client so
 * it never waits behind a snapshot; a reply saying KVCM forgot the node or
 * the instance tells the publisher (through kvcm_shared) to register again. */
#include "kvcm/kvcm_heartbeat.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvcm/kvcm_client.h"

struct kvcm_heartbeat {
    struct kvcm_shared *s;
    /* Not in the liveness registry: KVCM being slow must never stop the watchdog. */
    pthread_t thread;
};

/* One EVENT_HEARTBEAT for d; its KVCM_* status. */
static int kvcm_beat_one(const struct kvcm_conf *c, struct kvcm_client *cl, const struct kvcm_dep *d,
                         const struct kvcm_beat *b)
{
    char buf[32];
    json_t *status = json_object(), *events = json_array();
#define KVCM_STATUS_U(name, v) do { snprintf(buf, sizeof buf, "%" PRIu64, (uint64_t)(v)); \
                                    json_object_set_new(status, name, json_string(buf)); } while (0)
    KVCM_STATUS_U("epoch", c->epoch);
    KVCM_STATUS_U("generation", b->generation);
    KVCM_STATUS_U("host_blocks", b->node.host_blocks);
    KVCM_STATUS_U("host_free_bytes", b->node.host_free_bytes);
    KVCM_STATUS_U("store_blocks", b->node.store_blocks);
    KVCM_STATUS_U("clients", b->node.clients);
    KVCM_STATUS_U("queue", b->queued);
#undef KVCM_STATUS_U
    json_array_append_new(events, kvcm_event_heartbeat(status));
    struct kvcm_result r;
    int st = kvcm_report_events(cl, d->instance_id, c->st.host_ip_port, c->st.storage_type, events,
                                c->st.request_timeout_ms, &r);
    json_decref(events);
    return st;
}

static void *kvcm_heartbeat_main(void *arg)
{
    struct kvcm_heartbeat *h = arg;
    const struct kvcm_conf *c = kvcm_shared_conf(h->s);
    struct kvcm_client *cl = NULL;
    struct kvcm_client_config cc = {
        .endpoints = (const char *const *)c->st.endpoints, .n_endpoints = c->st.n_endpoints,
        .connect_timeout_ms = c->st.connect_timeout_ms, .request_timeout_ms = c->st.request_timeout_ms,
        .max_response_bytes = 1u << 20, .trace_prefix = c->trace_hb,
    };
    char err[256];
    sigset_t all;
    struct kvcm_beat b;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    if (kvcm_client_create(&cc, &cl, err, sizeof err) < 0) {
        kvcm_shared_error(h->s, KVCM_STATE_DEGRADED, "cannot create the KVCM heartbeat client: %s", err);
        return NULL;
    }
    kvcm_client_set_cancel(cl, kvcm_shared_cancel(h->s));
    while (kvcm_shared_beat_wait(h->s, &b))
        for (size_t i = 0; i < b.ndeps; i++)
            if (b.ok[i])
                kvcm_shared_beat_done(h->s, b.deps[i], kvcm_beat_one(c, cl, b.deps[i], &b));
    kvcm_client_destroy(cl);
    return NULL;
}

int kvcm_heartbeat_start(struct kvcm_shared *s, struct kvcm_heartbeat **out)
{
    struct kvcm_heartbeat *h = calloc(1, sizeof *h);
    *out = NULL;
    if (!h)
        return -1;
    h->s = s;
    if (pthread_create(&h->thread, NULL, kvcm_heartbeat_main, h) != 0) {
        free(h);
        return -1;
    }
    *out = h;
    return 0;
}

void kvcm_heartbeat_join(struct kvcm_heartbeat *h)
{
    if (!h)
        return;
    pthread_join(h->thread, NULL);
    free(h);
}
