/* tenants: see tenants.h. */
#include "tenants/tenants.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "core/clock.h"
#include "core/errmsg.h"
#include "core/log.h"
#include "gpu/gpu.h"
#include "kvcm/kvcm.h"
#include "mem/namespace.h"
#include "kvnode.h"
#include "persist/persist.h"

_Static_assert(TENANTS_MAX <= GPU_MAX_CACHES, "the GPU side serves every tenant's cache");
_Static_assert(TENANTS_MAX <= KVCM_MAX_CACHES, "KVCM observes every tenant's cache");
_Static_assert(CONFIG_TENANT_NAME_MAX <= NS_TENANT_MAX, "a tenant's name fits a namespace's identity");

struct tenants {
    const struct kvn_config *cfg;           /* the effective config (tenants_apply_config) */
    bool configured;                        /* cfg had sections at start */
    size_t n;                               /* [0] "default", then the sections */
    struct tenant t[TENANTS_MAX];
    /* cfg->tenants[i]'s running tenant (NULL: a section added by a reload,
     * not served until a restart) */
    struct tenant *by_section[CONFIG_TENANTS_MAX];
};

/* A tenant's part of a log line: "tenant NAME: " for a named one. */
static const char *tenant_who(const struct tenant *t, char *buf, size_t len)
{
    return log_tenant_prefix(t->named ? t->name : NULL, buf, len);
}

/* The section called name in cfg, or NULL. */
static const struct config_tenant *tenants_section(const struct kvn_config *cfg, const char *name)
{
    for (uint32_t i = 0; i < cfg->ntenants && i < CONFIG_TENANTS_MAX; i++)
        if (strcmp(cfg->tenants[i].name, name) == 0)
            return &cfg->tenants[i];
    return NULL;
}

/* The limits of t in cfg: a section's own, or [server] / [leases] for
 * "default"; the node-wide connection and unread-reply bounds are shared
 * the way memory is, "default" taking what the sections leave. */
static void tenant_limits(struct tenant *t, const struct kvn_config *cfg)
{
    const struct config_tenant *sec = t->named ? tenants_section(cfg, t->name) : NULL;

    if (t->named && !sec)
        return;   /* gone from the file: keep what runs */
    t->max_clients = sec ? sec->max_clients : config_tenant_default_clients(cfg);
    if (sec) {
        t->max_output_bytes = config_tenant_share_of(cfg, t->host_bytes, cfg->max_buffered_output_bytes);
    } else {
        uint64_t taken = 0;
        for (uint32_t i = 0; i < cfg->ntenants && i < CONFIG_TENANTS_MAX; i++)
            taken += config_tenant_share_of(cfg, cfg->tenants[i].host_bytes, cfg->max_buffered_output_bytes);
        t->max_output_bytes = taken < cfg->max_buffered_output_bytes ? cfg->max_buffered_output_bytes - taken : 0;
    }
    t->max_namespaces = sec ? sec->max_namespaces : cfg->max_namespaces;
    t->max_reserved_per_client = sec ? sec->max_reserved_per_client : cfg->max_reserved_per_client;
}

/* The configuration t's cache and store are built from: cfg with t's memory,
 * limits and store root. For "default" on a node without sections this is
 * cfg itself, field for field. */
static int tenant_view(const struct tenant *t, const struct kvn_config *cfg, struct kvn_config *view,
                       char *err, size_t errlen)
{
    *view = *cfg;
    view->host_bytes = t->host_bytes;
    view->hbm_bytes = t->hbm_bytes;
    view->max_namespaces = t->max_namespaces;
    view->max_reserved_per_client = t->max_reserved_per_client;
    if (!t->named)
        return 0;
    /* A named tenant's file store is a root of its own below the default's. */
    int n = snprintf(view->persist_path, sizeof view->persist_path, "%s/tenants/%s",
                     cfg->persist_path, t->name);
    if (n < 0 || (size_t)n >= sizeof view->persist_path) {
        errmsg_set(err, errlen, "tenant %s: its store root %s/tenants/%s is longer than %zu bytes; "
                   "shorten persist.path", t->name, cfg->persist_path, t->name,
                   sizeof view->persist_path - 1);
        return -1;
    }
    /* The disk bound is shared the way memory is: each root gets its
     * tenant's share of persist.capacity (at least a byte: 0 means none). */
    if (cfg->persist_capacity > 0 && cfg->host_bytes > 0) {
        double share = (double)t->host_bytes / (double)cfg->host_bytes;
        uint64_t cap = (uint64_t)((double)cfg->persist_capacity * share);
        view->persist_capacity = cap ? cap : 1;
    }
    return 0;
}

/* The tenants' memory: each section its own, "default" what is left. */
static int tenants_layout(struct tenants *ts, const struct kvn_config *cfg, char *err, size_t errlen)
{
    uint64_t host_left = cfg->host_bytes, hbm_left = cfg->hbm_bytes;
    struct tenant *def = &ts->t[0];

    snprintf(def->name, sizeof def->name, "%s", CONFIG_TENANT_DEFAULT);
    ts->n = 1;
    for (uint32_t i = 0; i < cfg->ntenants && i < CONFIG_TENANTS_MAX; i++) {
        const struct config_tenant *sec = &cfg->tenants[i];
        struct tenant *t = &ts->t[ts->n++];
        if (sec->host_bytes > host_left || sec->hbm_bytes > hbm_left) {
            errmsg_set(err, errlen, "tenant %s: the sections ask for more memory than "
                       "memory.host_bytes / hbm.bytes hold", sec->name);
            return -1;
        }
        snprintf(t->name, sizeof t->name, "%s", sec->name);
        t->named = true;
        t->host_bytes = sec->host_bytes;
        t->hbm_bytes = sec->hbm_bytes;
        host_left -= sec->host_bytes;
        hbm_left -= sec->hbm_bytes;
        ts->by_section[i] = t;
    }
    /* What is left, the config's way (less than one slab: none at all). */
    config_tenant_default_bytes(cfg, &def->host_bytes, &def->hbm_bytes);
    if (ts->configured && host_left > 0 && def->host_bytes == 0)
        log_info("tenant default: the %" PRIu64 " bytes of memory.host_bytes the sections leave "
                 "are less than a slab; clients of no section are refused", host_left);
    for (size_t i = 0; i < ts->n; i++)
        tenant_limits(&ts->t[i], cfg);
    if (ts->configured && def->max_clients == 0)
        log_info("tenant default: the sections' max_clients take all %u of server.max_clients; clients of no "
                 "section (root's kvnodectl status too) are refused until a section's max_clients is lowered",
                 cfg->max_clients);
    return 0;
}

/* Close what warm still holds (every fd taken). */
static void tenants_warm_close(struct tenants_warm *warm)
{
    for (size_t i = 0; i < warm->n; i++) {
        if (warm->t[i].fd >= 0)
            close(warm->t[i].fd);
        warm->t[i].fd = -1;
    }
}

/* The hand-over of t, NULL when there is none. */
static struct tenants_warm_one *tenants_warm_of(struct tenants_warm *warm, const struct tenant *t)
{
    for (size_t i = 0; warm && i < warm->n; i++)
        if (warm->t[i].fd >= 0 && strcmp(warm->t[i].name, t->name) == 0)
            return &warm->t[i];
    return NULL;
}

/* Before any cache exists: tenants that are gone have their blocks dropped;
 * the others must have the geometry and blocks they can adopt, else
 * nothing is adopted. */
static bool tenants_warm_check(struct tenants *ts, const struct kvn_config *cfg, struct tenants_warm *warm)
{
    char e[384];
    for (size_t i = 0; i < warm->n; i++) {
        struct tenants_warm_one *w = &warm->t[i];
        const struct tenant *t = NULL;
        for (size_t k = 0; k < ts->n && !t; k++)
            if (strcmp(ts->t[k].name, w->name) == 0 && ts->t[k].host_bytes > 0)
                t = &ts->t[k];
        if (!t) {
            log_info("warm restart: tenant %s is not configured (or has no host memory): its %zu blocks "
                     "are dropped", w->name, w->ho->n);
            warm->dropped_blocks += w->ho->n;
            close(w->fd);
            w->fd = -1;
        } else if (w->host_bytes != t->host_bytes) {
            snprintf(warm->why, sizeof warm->why, "tenant %s: its host tier was %" PRIu64 " bytes, it is %"
                     PRIu64 " now", w->name, w->host_bytes, t->host_bytes);
            return false;
        } else if (cache_handover_check(w->ho, t->named ? t->name : NULL, t->host_bytes, cfg->slab_bytes, e,
                                        sizeof e) < 0) {
            snprintf(warm->why, sizeof warm->why, "tenant %s: %.400s", w->name, e);
            return false;
        }
    }
    return true;
}

/* t's cache: over its hand-over when there is one. 0, or -1 with err; a
 * hand-over that cannot be adopted is 1, with warm->why set. */
static int tenant_create_cache(struct tenant *t, struct event_base *base, const struct kvn_config *view,
                               struct tenants_warm *warm, char *err, size_t errlen)
{
    struct tenants_warm_one *w = tenants_warm_of(warm, t);
    const char *name = t->named ? t->name : NULL;
    char who[CONFIG_TENANT_NAME_MAX + 16], e[512];

    if (!w) {
        if (cache_create_tenant(base, view, name, &t->cache, e, sizeof e) == 0)
            return 0;
        errmsg_set(err, errlen, "%s%s", tenant_who(t, who, sizeof who), e);
        return -1;
    }
    int fd = w->fd;
    w->fd = -1;
    if (cache_create_adopting(base, view, name, fd, w->ho->reserved, &t->cache, e, sizeof e) < 0 ||
        cache_adopt(t->cache, w->ho, e, sizeof e) < 0) {
        snprintf(warm->why, sizeof warm->why, "tenant %s: %.400s", t->name, e);
        return 1;
    }
    return 0;
}

int tenants_create(struct event_base *base, const struct kvn_config *cfg, struct tenants_warm *warm,
                   struct tenants **out, char *err, size_t errlen)
{
    struct tenants *ts = calloc(1, sizeof *ts);
    struct kvn_config *view = malloc(sizeof *view);
    int rc = 0;

    *out = ts;
    if (!ts || !view) {
        free(view);
        if (warm)
            tenants_warm_close(warm);
        errmsg_set(err, errlen, "out of memory");
        return -1;
    }
    ts->cfg = cfg;
    ts->configured = cfg->ntenants > 0;
    if (tenants_layout(ts, cfg, err, errlen) < 0) {
        free(view);
        if (warm)
            tenants_warm_close(warm);
        return -1;
    }
    if (warm && !tenants_warm_check(ts, cfg, warm))
        tenants_warm_close(warm);
    for (size_t i = 0; i < ts->n && rc >= 0; i++) {
        struct tenant *t = &ts->t[i];
        if (t->host_bytes == 0)
            continue;
        if ((rc = tenant_view(t, cfg, view, err, errlen)) < 0)
            break;
        if ((rc = tenant_create_cache(t, base, view, warm, err, errlen)) > 0) {
            /* Not all of it could be adopted: none of it is, every tenant cold. */
            tenants_warm_close(warm);
            for (size_t k = 0; k <= i; k++) {
                cache_destroy(ts->t[k].cache);
                ts->t[k].cache = NULL;
            }
            rc = 0;
            i = (size_t)-1;
            continue;
        }
        if (rc == 0 && t->named)
            log_info("tenant %s: host tier %" PRIu64 " MiB%s", t->name, t->host_bytes >> 20,
                     t->hbm_bytes ? ", HBM per device as below" : "");
    }
    if (warm) {
        warm->adopted = rc == 0 && warm->why[0] == '\0';
        tenants_warm_close(warm);
    }
    free(view);
    return rc < 0 ? -1 : 0;
}

int tenants_start_gpu(struct tenants *ts, struct event_base *base, const struct kvn_config *cfg,
                      struct gpu **out, char *err, size_t errlen)
{
    struct gpu_cache caches[GPU_MAX_CACHES];
    size_t n = 0;

    for (size_t i = 0; i < ts->n; i++) {
        struct tenant *t = &ts->t[i];
        if (!t->cache)
            continue;
        caches[n++] = (struct gpu_cache){ .cache = t->cache, .ops = &cache_gpu_ops, .hbm_bytes = t->hbm_bytes,
                                          .name = t->named ? t->name : NULL };
    }
    return gpu_start(base, cfg, caches, n, out, err, errlen);
}

int tenants_start_persist(struct tenants *ts, struct event_base *base, const struct kvn_config *cfg,
                          char *err, size_t errlen)
{
    struct kvn_config *view = malloc(sizeof *view);
    char who[CONFIG_TENANT_NAME_MAX + 16], e[1024];

    if (!view) {
        errmsg_set(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < ts->n; i++) {
        struct tenant *t = &ts->t[i];
        if (!t->cache)
            continue;
        if (tenant_view(t, cfg, view, err, errlen) < 0) {
            free(view);
            return -1;
        }
        if (persist_create_tenant(base, view, t->named ? t->name : NULL, &t->persist, e, sizeof e) < 0) {
            errmsg_set(err, errlen, "%s%s", tenant_who(t, who, sizeof who), e);
            free(view);
            return -1;
        }
        cache_set_persist(t->cache, t->persist);
    }
    free(view);
    return 0;
}

/* --- recovery ------------------------------------------------------------------- */

/* What a tenant's store scan finds becomes ghost entries of its own cache. */
static void tenants_recovery_found(void *arg, const struct kvs_found *blocks, size_t n)
{
    struct tenant *t = arg;
    cache_add_stored(t->cache, blocks, n);
}

static void tenants_recovery_finished(void *arg, int rc)
{
    struct tenant *t = arg;
    struct persist_counters pc;
    char who[CONFIG_TENANT_NAME_MAX + 16];

    persist_get_counters(t->persist, &pc);
    tenant_who(t, who, sizeof who);
    if (rc == 0)
        log_info("%srecovery: the store scan found %llu blocks in %.1f s", who,
                 (unsigned long long)pc.scan_found,
                 (double)(pc.scan_finished_ms - pc.scan_started_ms) / 1000.0);
    else if (rc != -KVNODE_ESHUTDOWN)
        log_warn("%srecovery: the store scan stopped after %llu blocks: %s (%s)", who,
                 (unsigned long long)pc.scan_found, kvnode_strerror(rc),
                 persist_last_error(t->persist));
}

void tenants_start_recovery(struct tenants *ts)
{
    char who[CONFIG_TENANT_NAME_MAX + 16];

    for (size_t i = 0; i < ts->n; i++) {
        struct tenant *t = &ts->t[i];
        if (!t->persist || !persist_enumerable(t->persist))
            continue;
        if (persist_scan_start(t->persist, tenants_recovery_found, tenants_recovery_finished, t) < 0)
            log_warn("%srecovery: cannot start the store scan; blocks on disk are found by GET only",
                     tenant_who(t, who, sizeof who));
    }
}

/* --- stop ----------------------------------------------------------------------- */

void tenants_stop_persist(struct tenants *ts, unsigned timeout_ms)
{
    uint64_t deadline = clock_now_ms() + timeout_ms, lost = 0;
    char who[CONFIG_TENANT_NAME_MAX + 16];
    size_t with_store = 0, done = 0;

    if (!ts)
        return;
    for (size_t i = 0; i < ts->n; i++)
        with_store += ts->t[i].persist != NULL;
    /* One bound for all, shared out: each tenant gets an equal part of what
     * the ones before it left, so one tenant's full disk cannot take every
     * other tenant's time (with one tenant: the whole bound). */
    for (size_t i = 0; i < ts->n; i++) {
        struct tenant *t = &ts->t[i];
        if (!t->persist)
            continue;
        uint64_t now = clock_now_ms();
        unsigned left = now < deadline ? (unsigned)(deadline - now) : 0;
        unsigned share = left / (unsigned)(with_store - done++);
        tenant_who(t, who, sizeof who);
        if (cache_persist_flush(t->cache, share, who) < 0) {
            struct persist_counters pc;
            persist_get_counters(t->persist, &pc);
            log_warn("%sshutdown: the store did not take every committed block within %u ms (%zu "
                     "requests still queued); abandoning them", who, share, pc.queue_depth);
        }
    }
    /* Nothing lands after this: what lacks a copy now is lost, counted. */
    for (size_t i = 0; i < ts->n; i++)
        persist_stop(ts->t[i].persist);
    for (size_t i = 0; i < ts->n; i++) {
        if (!ts->t[i].persist)
            continue;
        lost += cache_persist_unwritten(ts->t[i].cache, tenant_who(&ts->t[i], who, sizeof who));
        persist_destroy(ts->t[i].persist);
        ts->t[i].persist = NULL;
        cache_set_persist(ts->t[i].cache, NULL);
    }
    if (lost > 0 && ts->n > 1)
        log_warn("shutdown: %" PRIu64 " committed blocks of all tenants could not be written", lost);
}

void tenants_destroy(struct tenants *ts)
{
    if (!ts)
        return;
    for (size_t i = 0; i < ts->n; i++) {
        persist_destroy(ts->t[i].persist);
        cache_destroy(ts->t[i].cache);
    }
    free(ts);
}

/* --- reload ----------------------------------------------------------------------- */

void tenants_apply_config(struct tenants *ts, const struct kvn_config *cfg)
{
    struct kvn_config *view = malloc(sizeof *view);
    char ignored[256];

    ts->cfg = cfg;
    memset(ts->by_section, 0, sizeof ts->by_section);
    for (uint32_t i = 0; i < cfg->ntenants && i < CONFIG_TENANTS_MAX; i++)
        for (size_t j = 1; j < ts->n; j++)
            if (strcmp(ts->t[j].name, cfg->tenants[i].name) == 0)
                ts->by_section[i] = &ts->t[j];
    for (size_t i = 0; i < ts->n; i++) {
        struct tenant *t = &ts->t[i];
        tenant_limits(t, cfg);
        /* Out of memory: the limits above apply; the cache keeps its settings. */
        if (t->cache && view && tenant_view(t, cfg, view, ignored, sizeof ignored) == 0)
            cache_apply_config(t->cache, view);
    }
    free(view);
}

/* --- lookups ---------------------------------------------------------------------- */

struct tenant *tenants_for_peer(struct tenants *ts, uid_t uid, gid_t gid, const gid_t *groups, size_t ngroups)
{
    const struct kvn_config *cfg = ts->cfg;
    uint32_t n = cfg->ntenants < CONFIG_TENANTS_MAX ? cfg->ntenants : CONFIG_TENANTS_MAX;

    for (uint32_t i = 0; i < n; i++)
        if (ts->by_section[i] && config_idlist_has(&cfg->tenants[i].uid_list, (uint32_t)uid))
            return ts->by_section[i];
    /* The groups admission looks at: primary and supplementary alike. */
    for (uint32_t i = 0; i < n; i++)
        if (ts->by_section[i] && config_idlist_has_group(&cfg->tenants[i].gid_list, gid, groups, ngroups))
            return ts->by_section[i];
    return &ts->t[0];
}

bool tenants_configured(const struct tenants *ts)
{
    return ts->configured;
}

size_t tenants_count(const struct tenants *ts)
{
    return ts->n;
}

struct tenant *tenants_at(const struct tenants *ts, size_t i)
{
    return i < ts->n ? (struct tenant *)&ts->t[i] : NULL;
}

static uint32_t tenant_named_share(const struct kvn_config *cfg, const struct tenant *t, uint32_t pool)
{
    uint64_t share = config_tenant_share_of(cfg, t->host_bytes, pool);
    if (t->host_bytes == 0)
        return 0;
    return share ? (uint32_t)share : 1;
}

uint32_t tenants_share_of(const struct tenants *ts, const struct kvn_config *cfg, const struct tenant *t,
                          uint32_t pool)
{
    uint64_t taken = 0;

    if (t->named)
        return tenant_named_share(cfg, t, pool);
    for (size_t i = 0; i < ts->n; i++)
        if (ts->t[i].named)
            taken += tenant_named_share(cfg, &ts->t[i], pool);
    return taken < pool ? (uint32_t)(pool - taken) : 0;
}

struct tenant *tenants_default(const struct tenants *ts)
{
    return (struct tenant *)&ts->t[0];
}

bool tenants_cache_totals(const struct tenants *ts, struct cache_stats *out)
{
    struct cache_stats *x = malloc(sizeof *x);
    bool first = true;

    memset(out, 0, sizeof *out);
    for (size_t i = 0; x && i < ts->n; i++) {
        if (!ts->t[i].cache)
            continue;
        cache_get_stats(ts->t[i].cache, x);
        cache_stats_add(out, x, first);
        first = false;
    }
    free(x);
    return !first;
}

size_t tenants_caches(const struct tenants *ts, struct cache **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < ts->n && n < max; i++)
        if (ts->t[i].cache)
            out[n++] = ts->t[i].cache;
    return n;
}
