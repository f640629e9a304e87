/* persist: the persistence worker pool — see persist.h; how its pieces
 * share the work is in persist_internal.h. This file owns the pool's
 * lifetime (create, destroy, drain) and what it says about itself: the
 * backend, the lookup rule, the counters, the last error, the names of
 * states, failure kinds and ops. */
#include "persist/persist_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errmsg.h"
#include "kvnode.h"
#include "core/log.h"
#include "persist/kvs/redis.h"

/* config names the store's values itself (it sits below persist). */
_Static_assert((int)KVS_FSYNC_NEVER == (int)CONFIG_FSYNC_NEVER && (int)KVS_FSYNC_BATCH == (int)CONFIG_FSYNC_BATCH &&
               (int)KVS_FSYNC_ALWAYS == (int)CONFIG_FSYNC_ALWAYS, "persist_fsync is passed on as a KVS_FSYNC_*");
_Static_assert((int)KVS_DIRECT_AUTO == (int)CONFIG_DIRECT_AUTO && (int)KVS_DIRECT_ON == (int)CONFIG_DIRECT_ON &&
               (int)KVS_DIRECT_OFF == (int)CONFIG_DIRECT_OFF, "persist_direct_io is passed on as a KVS_DIRECT_*");

/* --- names --------------------------------------------------------------------- */

const char *persist_state_name(int state)
{
    switch (state) {
    case PERSIST_STATE_OFF: return "off";
    case PERSIST_STATE_OK: return "ok";
    case PERSIST_STATE_DEGRADED: return "degraded";
    default: return "unknown";
    }
}

const char *persist_failure_kind_name(int kind)
{
    static const char *const names[PERSIST_FAIL_KINDS] = {
        [PERSIST_FAIL_TIMEOUT] = "timeout",         [PERSIST_FAIL_NOSPACE] = "nospace",
        [PERSIST_FAIL_CORRUPT] = "corrupt",         [PERSIST_FAIL_UNAVAILABLE] = "unavailable",
        [PERSIST_FAIL_PROTOCOL] = "protocol",       [PERSIST_FAIL_IO] = "io",
    };
    return kind >= 0 && kind < PERSIST_FAIL_KINDS ? names[kind] : "unknown";
}

const char *persist_op_name(int op)
{
    static const char *const names[PERSIST_OPS] = {
        [PERSIST_OP_WRITE] = "write",   [PERSIST_OP_READ] = "read",
        [PERSIST_OP_DELETE] = "delete", [PERSIST_OP_EXISTS] = "exists",
        [PERSIST_OP_SCAN] = "scan",     [PERSIST_OP_HEALTH] = "health",
    };
    return op >= 0 && op < PERSIST_OPS ? names[op] : "unknown";
}

/* --- lifetime ---------------------------------------------------------------------- */

static void persist_free(struct persist *p)
{
    if (p->file_stats)             /* after the workers: the root's last handle may go here */
        p->be->close(p->file_stats);
    keyfifo_destroy(p->tombs.set);
    if (p->health_ev)
        event_free(p->health_ev);
    if (p->scan_reap_ev)
        event_free(p->scan_reap_ev);
    free(p->scan.v);
    explicit_bzero(p->redis_password, sizeof p->redis_password);
    free(p);
}

int persist_create(struct event_base *base, const struct kvn_config *cfg, struct persist **out,
                   char *err, size_t errlen)
{
    return persist_create_tenant(base, cfg, NULL, out, err, errlen);
}

int persist_create_tenant(struct event_base *base, const struct kvn_config *cfg, const char *tenant,
                          struct persist **out, char *err, size_t errlen)
{
    const char *name;
    char e[PERSIST_ERR_MAX] = "";
    struct kvs_store *probe = NULL;
    struct persist *p;
    int rc;

    if (out)
        *out = NULL;
    if (!base || !cfg || !out) {
        errmsg_set(err, errlen, "persist: invalid arguments");
        return -KVNODE_EINVAL;
    }
    switch (cfg->persist_backend) {
    case CONFIG_BACKEND_OFF: return 0;
    case CONFIG_BACKEND_FILE: name = "file"; break;
    case CONFIG_BACKEND_V6D: name = "v6d"; break;
    case CONFIG_BACKEND_REDIS: name = "redis"; break;
    default:
        errmsg_set(err, errlen, "persist.backend: unknown backend %d", cfg->persist_backend);
        return -KVNODE_EINVAL;
    }
    const struct kvs_backend *be = kvs_backend_find(name);
    if (!be) {
        errmsg_set(err, errlen, "persist.backend %s: kvnoded was built without %s support", name,
                   name);
        return -KVNODE_EINVAL;
    }
    if (cfg->persist_workers == 0 || cfg->persist_workers > WORKQ_MAX_THREADS) {
        errmsg_set(err, errlen, "persist.workers: %u (must be 1..%u)", cfg->persist_workers,
                   WORKQ_MAX_THREADS);
        return -KVNODE_EINVAL;
    }
    if (cfg->persist_queue == 0) {
        errmsg_set(err, errlen, "persist.queue: 0 (must be at least 1)");
        return -KVNODE_EINVAL;
    }

    if (!(p = calloc(1, sizeof *p))) {
        errmsg_set(err, errlen, "persist: out of memory");
        return -KVNODE_ENOMEM;
    }
    p->base = base;
    p->be = be;
    p->lookup = cfg->persist_lookup;
    p->workers = cfg->persist_workers;
    /* Test-only: a store slower than the puts, whatever the disk (0..10000 ms). */
    const char *delay = getenv("KVNODE_PERSIST_SIM_WRITE_DELAY_MS");
    if (delay && *delay) {
        char *end;
        unsigned long ms = strtoul(delay, &end, 10);
        p->sim_write_delay_ms = *end == '\0' && ms <= 10000 ? (uint32_t)ms : 0;
    }
    p->capacity = cfg->persist_queue;
    /* Own copies: the config may be replaced by a reload while we run. */
    snprintf(p->path, sizeof p->path, "%s", cfg->persist_path);
    snprintf(p->url, sizeof p->url, "%s", cfg->persist_url);
    snprintf(p->sock, sizeof p->sock, "%s", cfg->persist_socket);
    snprintf(p->object_ns, sizeof p->object_ns, "%s", cfg->persist_object_namespace);
    snprintf(p->redis_nodes, sizeof p->redis_nodes, "%s", cfg->persist_nodes);
    snprintf(p->redis_user, sizeof p->redis_user, "%s", cfg->persist_user);
    if (cfg->persist_backend == CONFIG_BACKEND_REDIS &&
        (rc = redis_password_load(cfg->persist_password_file, p->redis_password,
                                  sizeof p->redis_password, e, sizeof e)) < 0) {
        errmsg_set(err, errlen, "persist.%s", e);
        persist_free(p);
        return rc;
    }
    p->tombs.cap = cfg->persist_tombstones;
    if (tenant && *tenant) {
        snprintf(p->tenant, sizeof p->tenant, "%s", tenant);
        snprintf(p->qname, sizeof p->qname, "persist.%s", tenant);
        snprintf(p->scan_qname, sizeof p->scan_qname, "persist-scan.%s", tenant);
    } else {
        snprintf(p->qname, sizeof p->qname, "persist");
        snprintf(p->scan_qname, sizeof p->scan_qname, "persist-scan");
    }
    p->kcfg.tenant = p->tenant;
    p->kcfg.backend = be->name;
    p->kcfg.path = p->path;
    p->kcfg.capacity_bytes = cfg->persist_capacity;
    p->kcfg.fsync_policy = cfg->persist_fsync;
    p->kcfg.segment_bytes = cfg->persist_segment_bytes;
    p->kcfg.direct_io = cfg->persist_direct_io;
    p->kcfg.url = p->url;
    p->kcfg.socket_path = p->sock;
    p->kcfg.object_namespace = p->object_ns;
    p->kcfg.redis_nodes = p->redis_nodes;
    p->kcfg.redis_user = p->redis_user;
    p->kcfg.redis_password = p->redis_password;
    p->kcfg.connect_timeout_ms = cfg->persist_connect_timeout_ms;
    p->kcfg.timeout_ms = cfg->persist_timeout_ms;
    p->health_ev = event_new(base, -1, EV_PERSIST, persist_health_cb, p);
    p->scan_reap_ev = event_new(base, -1, 0, persist_scan_reap_cb, p);
    if (!p->health_ev || !p->scan_reap_ev) {
        persist_free(p);
        errmsg_set(err, errlen, "persist: cannot create the loop events");
        return -KVNODE_ENOMEM;
    }

    /* Probe once here so a bad file root fails the start with a clear message. */
    rc = be->open(&p->kcfg, &probe, e, sizeof e);
    if (rc < 0) {
        probe = NULL;
        if (be == &kvs_backend_file) {
            errmsg_set(err, errlen, "persist.path %s: %s", p->path, e);
            persist_free(p);
            return rc;
        }
        if (rc == -KVNODE_EINVAL) {   /* a configuration error, not a store that is down */
            errmsg_set(err, errlen, "persist: %s", e);
            persist_free(p);
            return rc;
        }
        if (cfg->persist_backend == CONFIG_BACKEND_REDIS)
            log_warn("persist: the redis store (nodes %s) does not answer: %s; starting degraded, "
                     "the workers will retry", p->redis_nodes, e);
        else
            log_warn("persist: the %s store (%s, socket %s) does not answer: %s; starting degraded, "
                     "the workers will retry", be->name, p->url, p->sock, e);
        p->c.failures[PERSIST_OP_HEALTH][PERSIST_FAIL_UNAVAILABLE]++;
        errmsg_set(p->last_error, sizeof p->last_error, "%s: %s",
                   persist_op_name(PERSIST_OP_HEALTH), e);
        p->c.state = PERSIST_STATE_DEGRADED;
    } else {
        p->c.state = PERSIST_STATE_OK;
    }

    const struct workq_thread_hooks hooks = { persist_worker_init, persist_worker_fini, p };
    rc = workq_create_hooks(base, p->qname, p->workers, p->capacity, &hooks, &p->q, e, sizeof e);
    /* Closed only now that the workers hold their own handles, so a file
     * root stays held (locked, one LRU) from the probe on. */
    if (probe && be == &kvs_backend_file)
        p->file_stats = probe;
    else if (probe)
        be->close(probe);
    if (rc < 0) {
        errmsg_set(err, errlen, "persist: %s", e);
        persist_free(p);
        return rc;
    }
    if (p->c.state == PERSIST_STATE_DEGRADED)
        persist_health_arm(p);
    char who[LOG_TENANT_PREFIX_MAX];
    log_info("%spersist: %s store, %u workers, queue %zu%s", log_tenant_prefix(p->tenant, who, sizeof who), be->name, p->workers, p->capacity,
             p->c.state == PERSIST_STATE_DEGRADED ? " (degraded)" : "");
    *out = p;
    return 0;
}

void persist_stop(struct persist *p)
{
    if (!p)
        return;
    p->destroying = true;
    event_del(p->health_ev);
    /* The requests first (each destroy waits for its running job, so the
     * queued requests are taken before a scan chunk is waited for): those
     * that ran get their result, the queued ones -KVNODE_ESHUTDOWN. Then the
     * scan: its chunk job, if any, ends with finished(-KVNODE_ESHUTDOWN) and
     * the thread's fini hook frees the cursor. */
    workq_destroy(p->q);
    p->q = NULL;
    if (p->scan_q) {
        workq_destroy(p->scan_q);
        p->scan_q = NULL;
    }
}

void persist_destroy(struct persist *p)
{
    if (!p)
        return;
    persist_stop(p);
    persist_free(p);
}

int persist_drain(struct persist *p, unsigned timeout_ms)
{
    /* The requests only: a scan is abandoned by persist_destroy, not waited for. */
    return p ? workq_drain(p->q, timeout_ms) : 0;
}

bool persist_enumerable(const struct persist *p)
{
    /* v6d keeps no layouts and a Redis cluster is not listed: their scans find nothing */
    return p && strcmp(p->be->name, "v6d") != 0 && strcmp(p->be->name, "redis") != 0;
}

bool persist_lookup_on_miss(const struct persist *p)
{
    if (!p)
        return false;
    switch (p->lookup) {
    case CONFIG_LOOKUP_ON: return true;
    case CONFIG_LOOKUP_OFF: return false;
    default: return !persist_enumerable(p);
    }
}

bool persist_reads_find(const struct persist *p)
{
    return p && p->be->reads_find;
}

const char *persist_backend_name(const struct persist *p)
{
    return p ? p->be->name : "off";
}

void persist_get_counters(const struct persist *p, struct persist_counters *out)
{
    if (!p) {
        memset(out, 0, sizeof *out);
        out->state = PERSIST_STATE_OFF;
        return;
    }
    *out = p->c;
    out->queue_depth = workq_pending(p->q);
    out->queue_capacity = p->capacity;
    out->workers = p->workers;
    out->file_on = p->file_stats != NULL;
    if (p->file_stats)
        kvs_file_stats(p->file_stats, &out->file);
}

const char *persist_last_error(const struct persist *p)
{
    return p ? p->last_error : "";
}
