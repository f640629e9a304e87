/* persist_internal: what the pieces of the persistence worker pool share —
 * struct persist, the jobs it hands to its queues, and the functions one
 * piece calls in another. Private to the files of daemon/persist/ (kvs/ is
 * the backends' own); everything else goes through persist.h.
 *
 *   persist.c  the pool's lifetime (create, destroy, drain) and what it says
 *              about itself: backend, lookup, counters, last error, names
 *   request.c  the requests the loop submits: write, read, delete, exists
 *   worker.c   the request workers: reopen, batching, the backend calls; each
 *              result applied on the loop (counters, state, callback)
 *   health.c   failure kinds, the OK / DEGRADED state and the health probe
 *   tombs.c    tombstones: deleted keys hidden when the store keeps them
 *   scan.c     the recovery scan, on a thread of its own
 *
 * Built on workq (workq.h): one queue "persist" of [persist] workers threads
 * for the requests and health probes, and, once persist_scan_start is
 * called, a queue "persist-scan" of one thread for the recovery scan.
 *
 * Ownership and threads. A request is a malloc'ed struct pjob embedding its
 * workq_job. run() executes on a worker and touches only the job and the
 * thread's own context (struct pworker in worker.c: its kvs_store handle);
 * the struct persist fields it reads (be, kcfg) are written once before the
 * threads start and never again. done() executes on the loop: it moves the
 * job's results into the counters, the state and last_error, runs the
 * caller's callback and frees the job. So counters need no lock or atomic:
 * only the loop touches them. The health job and the scan job are embedded in struct
 * persist (at most one of each is outstanding) and follow the same rule.
 *
 * Callbacks (done, found, finished) run from workq's completion handler on
 * the loop: they may submit requests but must not call persist_destroy
 * (workq_destroy cannot run inside a done() of its own queue). */
#ifndef KVNODE_PERSIST_INTERNAL_H
#define KVNODE_PERSIST_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "persist/persist.h"
#include "core/keyfifo.h"
#include "core/workq.h"

#define PERSIST_ERR_MAX      512

/* One request (or the health probe). */
struct pjob {
    struct workq_job job;          /* first: the workq hands this pointer back */
    struct persist  *p;
    int              op;           /* enum persist_op */
    struct kvs_ns    ns;
    int64_t          key;
    uint64_t         check;        /* write/read: the key's check word (0: none) */
    const void      *wdata;        /* write: the caller's */
    struct devmem   *dm;           /* write: wdata is device memory of dm's `device` */
    bool             probe;        /* write: the write probe's (persist_write_probe) */
    int              device;
    void            *rdata;        /* read: the caller's, filled by the worker */
    size_t           len;
    size_t           n;            /* delete/exists */
    bool             purge_all;    /* delete: every block of ns the store holds (kvs purge) */
    int64_t         *keys;         /* copies, allocated with the job */
    uint64_t        *checks;       /* delete/exists: the keys' words, allocated with the job */
    uint8_t         *present;      /* exists: the caller's, filled on the loop in done() */
    uint8_t         *wpresent;     /* exists: the worker's, allocated with the job */
    persist_done_fn  done;
    void            *arg;
    /* results, written by run() and read by done() */
    int              rc;
    int              kind;         /* enum persist_failure_kind when rc < 0 */
    uint64_t         ndeleted;     /* delete: keys the store's del returned 0 for */
    char             err[PERSIST_ERR_MAX];
};

/* The recovery scan's chunk job (one, reused for every chunk). */
struct pscan_job {
    struct workq_job  job;         /* first */
    struct persist   *p;
    struct kvs_found *v;           /* this chunk's blocks (the array is kept across chunks) */
    size_t            n, cap;
    bool              oom;
    int               rc;          /* the backend's scan result, or < 0 */
    int               kind;
    char              err[PERSIST_ERR_MAX];
};

/* Tombstones (loop thread): keys deleted while the store keeps them
 * (keeps_deleted), at most cap of them, the oldest forgotten first to make
 * room (a core/keyfifo, made at the first delete). A re-put removes its key. */
struct tombs {
    struct keyfifo *set;           /* NULL: none yet */
    size_t          cap;
};

struct persist {
    struct event_base        *base;
    const struct kvs_backend *be;
    struct kvs_config         kcfg;        /* strings point at the copies below */
    char                      path[PATH_MAX];
    char                      url[CONFIG_URL_MAX];
    char                      sock[PATH_MAX];
    char                      object_ns[CONFIG_OBJECT_NS_MAX];
    char                      redis_nodes[CONFIG_REDIS_NODES_MAX];
    char                      redis_user[CONFIG_REDIS_USER_MAX];
    char                      redis_password[512];   /* REDIS_PASSWORD_MAX; zeroed when freed */
    char                      tenant[CONFIG_TENANT_NAME_MAX];  /* "": "default" */
    char                      qname[CONFIG_TENANT_NAME_MAX + 16];      /* "persist[.<tenant>]" */
    char                      scan_qname[CONFIG_TENANT_NAME_MAX + 16]; /* "persist-scan[.<tenant>]" */
    int                       lookup;      /* CONFIG_LOOKUP_* */
    unsigned                  workers;
    uint32_t                  sim_write_delay_ms; /* tests: KVNODE_PERSIST_SIM_WRITE_DELAY_MS */
    size_t                    capacity;

    struct workq             *q;
    struct event             *health_ev;   /* EV_PERSIST timer, pending while degraded */
    struct pjob               health;
    bool                      health_busy;
    persist_write_probe_fn    write_probe;     /* the cache's (persist_set_write_probe) */
    void                     *write_probe_arg;

    struct workq             *scan_q;
    struct event             *scan_reap_ev; /* destroys scan_q after the scan ended */
    struct pscan_job          scan;
    bool                      scan_started;
    persist_found_fn          scan_found_fn;
    persist_done_fn           scan_finished_fn;
    void                     *scan_arg;

    struct tombs              tombs;
    struct kvs_store         *file_stats;  /* file backend: the probe handle, kept open for
                                              kvs_file_stats (a mutex held for a copy) */

    bool                      destroying;
    bool                      writes_failing;  /* the last write failed (see State) */
    struct persist_counters   c;
    char                      last_error[PERSIST_ERR_MAX];
};

/* --- health.c ---------------------------------------------------------------------- */

/* The failure kind of a backend call's negative result. */
int  persist_failure_kind(int rc);
/* Arm the health probe timer (while degraded, unless stopping). */
void persist_health_arm(struct persist *p);
/* A call (op) that reached the store succeeded: OK, unless a failed write
 * still waits for a successful one (see health.c). */
void persist_state_ok(struct persist *p, int op);
/* A call failed: counted, last_error set, DEGRADED unless the failure is not
 * the store's (kind CORRUPT, -KVNODE_EINVAL, -KVNODE_ENOMEM). */
void persist_state_failed(struct persist *p, int op, int rc, int kind, const char *err);
/* A probe's result (the health job's, or a write probe's), counted. */
void persist_probe_result(struct persist *p, int kind, int rc);
/* The health_ev timer: submits the health probe while degraded. */
void persist_health_cb(evutil_socket_t fd, short what, void *arg);

/* --- worker.c ---------------------------------------------------------------------- */

/* The request threads' hooks (workq_thread_hooks; arg: the persist): each
 * thread's context (struct pworker) with its own backend handle. */
int  persist_worker_init(void *arg, unsigned idx, void **ctx);
void persist_worker_fini(void *arg, void *ctx);
/* A request's (or the probe's) run() on a worker and done() on the loop. */
void persist_job_run(struct workq_job *j, void *ctx);
void persist_job_done(struct workq_job *j);

/* --- tombs.c ----------------------------------------------------------------------- */

/* Whether a tombstone hides (ns, key). */
bool persist_tomb_hidden(const struct persist *p, const struct kvs_ns *ns, int64_t key,
                         uint64_t check);
/* Forget the key's tombstone, if any (a re-put). */
void persist_tomb_remove(struct persist *p, const struct kv_namespace *ns, int64_t key,
                         uint64_t check);

/* --- scan.c ------------------------------------------------------------------------ */

/* scan_reap_ev: destroys scan_q once the scan ended. */
void persist_scan_reap_cb(evutil_socket_t fd, short what, void *arg);

#endif
