/* kvcm_heartbeat: the heartbeat thread. EVENT_HEARTBEAT for every
 * registered deployment each heartbeat_interval, on its own kvcm_client so
 * it never waits behind a snapshot; a reply saying KVCM forgot the node or
 * the instance tells the publisher to register again. */
#include "kvcm/kvcm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kvcm/kvcm_client.h"

/* --- heartbeat thread --------------------------------------------------------------- */

void *kvcm_heartbeat_main(void *arg)
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
