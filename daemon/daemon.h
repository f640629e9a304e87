/* daemon: the process-wide wiring context of kvnoded — the loop, the
 * effective configuration and the modules built from it. main.c owns it;
 * reload, systemd notification and the stats read it; the admin endpoints
 * and the KVS front end get what they need of it at creation, not the struct.
 *
 * Loop thread only. */
#ifndef KVNODE_DAEMON_H
#define KVNODE_DAEMON_H

#include <stdint.h>

#include "config/config.h"

#define DAEMON_MAX_OVERRIDES 64

struct event_base;
struct tenants;
struct ops;
struct server;
struct admin;
struct kvs_server;
struct persist;
struct kvcm;
struct kvcm_querier;
struct gpu;

struct daemon {
    struct event_base *base;
    struct kvn_config *cfg;                 /* effective config (swapped on reload) */
    const char *config_path;                /* NULL: built-in defaults only */
    const char *overrides[DAEMON_MAX_OVERRIDES];
    int noverrides;
    struct tenants *tenants;                /* each tenant's cache and store ("default" alone
                                               on a node without [tenant.NAME] sections) */
    struct gpu *gpu;                        /* HBM arenas, host pinning, copy workers */
    struct kvcm *kvcm;                      /* NULL when [kvcm] enabled = off */
    struct kvcm_querier *querier;           /* MATCH_REMOTE's KVCM queries; NULL when off */
    struct ops *ops;
    struct server *server;
    struct admin *admin;                    /* NULL when [admin] listen = off */
    struct kvs_server *kvs;                 /* NULL when [kvs_server] enabled = off */
    /* reload outcome, shown in stats */
    uint64_t reloads_ok, reloads_failed;
    char last_reload_error[CONFIG_ERR_MAX];  /* "" after a successful reload */
};

/* Defaults + file + overrides, validated. 0, or -1 with err set. */
int daemon_load_config(const struct daemon *d, struct kvn_config *cfg, char *err, size_t errlen);

/* Start the KVCM publisher when [kvcm] enabled = on (d->kvcm stays NULL
 * otherwise). 0, or -1 with err set. */
int daemon_start_kvcm(struct daemon *d, char *err, size_t errlen);

/* /readyz's notes (admin_deps.ready_notes; arg: the daemon): each tenant's
 * host memory short of its size, each degraded store, a stalled KVCM
 * publisher, appended to msg as "; ..." (used of cap bytes taken). */
size_t daemon_ready_notes(void *arg, char *msg, size_t used, size_t cap);

#endif
