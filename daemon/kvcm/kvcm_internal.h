/* kvcm_internal: what the pieces of the KVCM publisher share -- struct kvcm,
 * its deployments and queued events, and the functions one piece calls in
 * another. Private to these files; everything else goes through kvcm.h.
 *
 *   kvcm.c            state and errors, the stall clock, start and stop
 *                     (HOST_DOWN), the stats
 *   kvcm_events.c     the loop side: deployments, the bounded event queue,
 *                     the resync walk, the node status the heartbeat sends
 *   kvcm_publisher.c  the publisher thread: registration, snapshots,
 *                     coalesced ADD/DELETE batches, retries and backoff
 *   kvcm_heartbeat.c  the heartbeat thread
 *
 * Which thread touches which field is said at the field (see struct kvcm). */
#ifndef KVNODE_KVCM_INTERNAL_H
#define KVNODE_KVCM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "cache/cache.h"
#include "kvcm/kvcm.h"
#include "config/kvcm_config.h"
#include "kvcm/keyset.h"

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
    struct cache *caches[KVCM_MAX_CACHES];    /* one per tenant; walked one after another */
    size_t ncaches;
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
    size_t walk_cache;                        /* caches[walk_cache] is being walked */
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

/* ---- kvcm.c ---- */

/* Wall-clock ms (snapshot times, the epoch). */
uint64_t kvcm_unix_ms(void);
/* Record an error and a state (logged when either changed). */
void kvcm_set_error(struct kvcm *k, int state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A new state, unless stopped. */
void kvcm_set_state(struct kvcm *k, int state);
/* Work is waiting (under mu): the stall clock starts unless it runs. */
void kvcm_work_arrived(struct kvcm *k);

/* ---- kvcm_events.c (loop thread) ---- */

/* The publisher asked for a walk (its eventfd). */
void kvcm_efd_cb(evutil_socket_t fd, short what, void *arg);
/* Refresh the node status the heartbeat reports (a timer; also at start). */
void kvcm_status_cb(evutil_socket_t fd, short what, void *arg);

/* ---- the threads' bodies (arg: struct kvcm) ---- */

void *kvcm_publisher_main(void *arg);   /* kvcm_publisher.c */
void *kvcm_heartbeat_main(void *arg);   /* kvcm_heartbeat.c */

#endif
