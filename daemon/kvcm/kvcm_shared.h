/* kvcm_shared: what the loop, the publisher thread and the heartbeat thread
 * share, and its one owner. struct kvcm_shared (private to kvcm_shared.c)
 * holds, under one mutex held for O(1) (plus a deployment's first sight):
 * the deployments, the bounded event queue, the walk the loop hands the
 * publisher, the node status, the state and last error, the stall clock
 * and the counters. The pieces above reach it only through these
 * functions, each for one of them:
 *   kvcm.c            create, stop (HOST_DOWN), destroy; the stats
 *   kvcm_events.c     (loop) block events in, a walk's start and result, status
 *   kvcm_publisher.c  take the queue, ask for a walk, report progress, sleep
 *   kvcm_heartbeat.c  wait for the beat, record its result
 * The settings (struct kvcm_conf) are fixed at create and read freely. */
#ifndef KVNODE_KVCM_SHARED_H
#define KVNODE_KVCM_SHARED_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"
#include "kvcm/keyset.h"
#include "config/kvcm_config.h"
#include "kvcm/kvcm_types.h"
#include "mem/namespace.h"

struct kvcm_shared;

/* Media, as enum cache_medium numbers them (0: not complete). */
enum { MED_NONE = CACHE_MEDIUM_NONE, MED_HBM = CACHE_MEDIUM_HBM, MED_DRAM = CACHE_MEDIUM_HOST,
       MED_COUNT };

/* One entry of the queue: a key's medium now, or the resync marker. */
enum { EV_BLOCK = 1, EV_MARKER = 2 };
struct kvcm_ev {
    uint32_t dep;
    uint8_t  kind;
    uint8_t  medium;                          /* EV_BLOCK: MED_*; MED_NONE: not complete */
    int64_t  key;
};

/* The settings as kvcm keeps them: its own copies of the strings. */
struct kvcm_conf {
    struct kvcm_settings st;                  /* strings point into the copies below */
    char endpoints[KVCM_MAX_ENDPOINTS][CONFIG_URL_MAX];
    char text[9][CONFIG_KVCM_TEMPLATE_MAX];
    const char *medium_name[MED_COUNT];       /* wire names, by MED_* */
    uint64_t epoch;                           /* per boot: older incarnations' trace ids differ */
    /* "<host_ip_port>-<epoch>-<thread>": unique across restarts and threads */
    char trace_pub[CONFIG_KVCM_NAME_MAX + 40], trace_hb[CONFIG_KVCM_NAME_MAX + 40],
         trace_down[CONFIG_KVCM_NAME_MAX + 40];
};

/* One deployment = one KVCM instance, made on first sight (under the
 * mutex) and kept until destroy. Immutable after creation except where
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
    /* the publisher thread's own */
    bool instance_ok, node_ok, need_snapshot, failed_terminal;
    struct keyset mirror;                     /* complete keys (what KVCM should hold): medium */
    struct keyset pending;                    /* deltas not sent yet (kvcm_publisher.c's PEND_*) */
    uint64_t last_snapshot_ms, next_try_ms;
    /* kvcm_shared.c's (under its mutex) */
    bool heartbeat_ok;                        /* NODE_REGISTER went through: heartbeat it */
    bool announced;                           /* KVCM may know us: HOST_DOWN at stop */
    bool reregister;                          /* the heartbeat learnt KVCM forgot our node */
    bool reinstance;                          /* ... or the whole instance */
};

/* ---- kvcm.c: life and the door's reads ---- */

/* Copies the settings, makes the queue (queue_events, plus a slot for the
 * marker) and the walk eventfd. 0, or a negative KVNODE_E* with err set. */
int  kvcm_shared_create(const struct kvcm_settings *st, struct kvcm_shared **out, char *err,
                       size_t errlen);
const struct kvcm_conf *kvcm_shared_conf(const struct kvcm_shared *s);
/* Set by stop: calls in flight give up (kvcm_client_set_cancel). */
atomic_bool *kvcm_shared_cancel(struct kvcm_shared *s);
/* Tell both threads to end and abandon calls in flight. */
void kvcm_shared_stop(struct kvcm_shared *s);
/* After HOST_DOWN: the state is STOPPED for good. */
void kvcm_shared_stopped(struct kvcm_shared *s);
/* The instance ids KVCM may know (threads ended): HOST_DOWN goes to these.
 * Pointers into the deployments (they live as long as s). */
size_t kvcm_shared_announced(struct kvcm_shared *s, const char **ids, size_t max);
void kvcm_shared_stats(struct kvcm_shared *s, struct kvcm_stats *out);
bool kvcm_shared_stalled(struct kvcm_shared *s, char *why, size_t len);
void kvcm_shared_destroy(struct kvcm_shared *s);

/* ---- any piece ---- */

/* Wall-clock ms (snapshot times, the epoch). */
uint64_t kvcm_unix_ms(void);
/* Record an error and a state (logged when either changed). */
void kvcm_shared_error(struct kvcm_shared *s, int state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A new state, unless stopped. */
void kvcm_shared_set_state(struct kvcm_shared *s, int state);

/* ---- kvcm_events.c (loop thread) ---- */

/* A key's completeness and medium (enum cache_medium) into the queue; when
 * it is full, dropped and counted, and the publisher will resync. */
void kvcm_shared_block(struct kvcm_shared *s, const struct kv_namespace *ns, int64_t key, int medium);
/* A deployment whose TP group connected: registered on first sight. */
void kvcm_shared_deployment(struct kvcm_shared *s, const struct kv_namespace *ns);
/* The deployment index of ns, made on first sight; -1: none (full, or a
 * template does not expand). */
int  kvcm_shared_dep_of(struct kvcm_shared *s, const struct kv_namespace *ns);
/* The eventfd by which the publisher asks the loop for a walk. */
int  kvcm_shared_walk_fd(const struct kvcm_shared *s);
/* The loop takes the publisher's request: true when a walk must start now
 * (wanted, and none running), the marker then queued. */
bool kvcm_shared_walk_begin(struct kvcm_shared *s, bool walking);
/* A walk ended: its result (taken over; malloc'd) for the publisher;
 * incomplete: some was lost, walk again. True when another walk was asked
 * for meanwhile. */
bool kvcm_shared_walk_end(struct kvcm_shared *s, struct kvcm_ev *result, size_t n, bool incomplete);
/* The node status the heartbeat reports. */
void kvcm_shared_node(struct kvcm_shared *s, const struct kvcm_node_status *node);

/* ---- kvcm_publisher.c ---- */

/* Up to max queued events into out, the deployments into deps (*ndeps);
 * what the heartbeat learnt is applied to them (instance_ok / node_ok
 * cleared). -1 once stopped. */
int  kvcm_shared_take(struct kvcm_shared *s, struct kvcm_ev *out, size_t max, struct kvcm_dep **deps,
                     size_t *ndeps);
/* Events were lost on the publisher's side: resync. */
void kvcm_shared_dirty(struct kvcm_shared *s);
/* The walk's result once it is ready (taken over: free it), and the
 * deployments again (the walk may have found new ones). */
bool kvcm_shared_take_walk(struct kvcm_shared *s, struct kvcm_ev **res, size_t *n,
                          struct kvcm_dep **deps, size_t *ndeps);
/* Events were dropped: ask the loop for a walk (the caller has none
 * outstanding). True when it asked. */
bool kvcm_shared_ask_walk(struct kvcm_shared *s);
/* Something reached KVCM: the stall clock restarts. */
void kvcm_shared_progress(struct kvcm_shared *s);
/* NODE_REGISTER goes out for d (HOST_DOWN at stop from now on) ... */
void kvcm_shared_announced_dep(struct kvcm_shared *s, struct kvcm_dep *d);
/* ... and went through: the heartbeat beats it. */
void kvcm_shared_registered_dep(struct kvcm_shared *s, struct kvcm_dep *d);
/* A snapshot went through: counters, generation, its time. */
void kvcm_shared_snapshot_sent(struct kvcm_shared *s);
/* The end of a pass: the stall clock stops when caught_up and nothing is
 * queued; then sleep up to wait_ms unless there is work already (events,
 * a deployment, the heartbeat's news, the awaited walk's result, or a walk
 * to ask for when not resyncing). */
void kvcm_shared_sleep(struct kvcm_shared *s, bool caught_up, bool awaiting_walk, bool resyncing,
                      uint64_t wait_ms);

/* ---- kvcm_heartbeat.c ---- */

/* What one beat reports: the deployments (and whether each is registered),
 * the node status, the generation and the queue length. */
struct kvcm_beat {
    struct kvcm_dep *deps[KVCM_MAX_DEPLOYMENTS];
    bool ok[KVCM_MAX_DEPLOYMENTS];
    size_t ndeps;
    struct kvcm_node_status node;
    uint64_t generation, queued;
};
/* Sleep one heartbeat interval, then fill b. False once stopped. */
bool kvcm_shared_beat_wait(struct kvcm_shared *s, struct kvcm_beat *b);
/* The answer (a KVCM_* status) for d; KVCM forgetting the node or the
 * instance makes the publisher register it again. */
void kvcm_shared_beat_done(struct kvcm_shared *s, struct kvcm_dep *d, int status);

#endif
