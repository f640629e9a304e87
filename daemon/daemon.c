/* daemon: see daemon.h. */
#include "daemon.h"

#include <stdio.h>
#include <stdlib.h>

#include "cache/cache.h"
#include "mem/arena.h"
#include "mem/index.h"
#include "mem/populate.h"
#include "persist/persist.h"
#include "kvcm/kvcm.h"
#include "kvcm/query.h"
#include "kvnode.h"
#include "core/log.h"
#include "net/server.h"
#include "tenants/tenants.h"

int daemon_load_config(const struct daemon *d, struct kvn_config *cfg, char *err, size_t errlen)
{
    config_defaults(cfg);
    if (d->config_path && config_load_file(cfg, d->config_path, err, errlen) < 0)
        return -1;
    for (int i = 0; i < d->noverrides; i++)
        if (config_apply_override(cfg, d->overrides[i], err, errlen) < 0)
            return -1;
    /* Checks everything and fills the parsed forms the modules read. */
    return config_resolve(cfg, err, errlen);
}

/* What the KVCM heartbeat reports (once per heartbeat interval, on the loop). */
static void daemon_kvcm_status(void *arg, struct kvcm_node_status *out)
{
    struct daemon *d = arg;
    struct cache_stats *cs = malloc(sizeof *cs);
    struct server_stats ss = { 0 };

    if (!cs)
        return;
    tenants_cache_totals(d->tenants, cs);
    if (d->server)
        server_get_stats(d->server, &ss);
    out->host_blocks = cs->host.blocks;
    out->host_free_bytes = cs->host.capacity > cs->host.used_bytes ? cs->host.capacity - cs->host.used_bytes : 0;
    out->store_blocks = cs->has_store ? cs->store_blocks : 0;
    out->clients = ss.connected;
    free(cs);
}

int daemon_start_kvcm(struct daemon *d, char *err, size_t errlen)
{
    const struct kvn_config *cfg = d->cfg;
    struct kvcm_settings st = {
        .instance_group = cfg->kvcm.instance_group,
        .instance_id_template = cfg->kvcm.instance_id,
        .host_ip_port = cfg->kvcm.host_ip_port,
        .storage_type = config_kvcm_storage_type_name(cfg->kvcm.storage_type),
        .medium_hbm = cfg->kvcm.medium_hbm,
        .medium_host = cfg->kvcm.medium_host,
        .spec_name_template = cfg->kvcm.spec_name,
        .location_uri_template = cfg->kvcm.location_uri,
        .connect_timeout_ms = cfg->kvcm.connect_timeout_ms,
        .request_timeout_ms = cfg->kvcm.request_timeout_ms,
        .snapshot_timeout_ms = cfg->kvcm.snapshot_timeout_ms,
        .flush_interval_ms = cfg->kvcm.flush_interval_ms,
        .heartbeat_interval_ms = cfg->kvcm.heartbeat_interval_ms,
        .snapshot_interval_ms = cfg->kvcm.snapshot_interval_ms,
        .retry_base_ms = cfg->kvcm.retry_base_ms,
        .retry_max_ms = cfg->kvcm.retry_max_ms,
        .host_down_timeout_ms = cfg->kvcm.host_down_timeout_ms,
        .batch_events = cfg->kvcm.batch_events,
        .queue_events = cfg->kvcm.queue_events,
        .stall_timeout_ms = cfg->kvcm.stall_timeout_ms,
    };
    /* The media this node reports: the GPU tier's when it has one (the GPU
     * backend is up by now), host memory's always. */
    struct cache_arena_info arenas[INDEX_MAX_ARENAS];
    struct cache *caches[KVCM_MAX_CACHES];
    size_t ncaches = tenants_caches(d->tenants, caches, KVCM_MAX_CACHES);
    for (size_t c = 0; c < ncaches; c++) {
        size_t narenas = cache_arenas(caches[c], arenas, INDEX_MAX_ARENAS);
        for (size_t i = 0; i < narenas; i++)
            if (arenas[i].tier == KVNODE_TIER_HBM)
                st.has_hbm = true;
    }

    if (!cfg->kvcm.enabled) {
        log_info("kvcm: off ([kvcm] enabled = off): nothing is published to or asked of KVCM");
        return 0;
    }
    /* [kvcm] endpoints as split when the config was parsed. */
    if (cfg->kvcm.endpoint_list.n == 0) {
        snprintf(err, errlen, "[kvcm] endpoints: no valid endpoint");
        return -1;
    }
    for (size_t i = 0; i < cfg->kvcm.endpoint_list.n && i < KVCM_MAX_ENDPOINTS; i++)
        st.endpoints[st.n_endpoints++] = cfg->kvcm.endpoint_list.url[i];
    if (kvcm_create(d->base, caches, ncaches, &st, daemon_kvcm_status, d, &d->kvcm, err, errlen) < 0)
        return -1;
    struct kvcm_query_settings qs = {
        .endpoints = st.endpoints, .n_endpoints = st.n_endpoints,
        .host_ip_port = cfg->kvcm.host_ip_port, .instance_id_template = cfg->kvcm.instance_id,
        .connect_timeout_ms = cfg->kvcm.connect_timeout_ms,
        .deadline_ms = cfg->kvcm.query_deadline_ms, .max_hosts = cfg->kvcm.query_max_hosts,
        .breaker_failures = cfg->kvcm.query_breaker_failures,
        .breaker_open_ms = cfg->kvcm.query_breaker_open_ms,
        .negative_ttl_ms = cfg->kvcm.query_negative_ttl_ms,
        .epoch = kvcm_epoch(d->kvcm),
    };
    return kvcm_querier_create(d->base, &qs, &d->querier, err, errlen) < 0 ? -1 : 0;
}

size_t daemon_ready_notes(void *arg, char *msg, size_t used, size_t cap)
{
    const struct daemon *d = arg;
    char who[LOG_TENANT_PREFIX_MAX];
    /* A degraded store costs persistence only, a stalled KVCM publisher
     * only what routers know of this node: engines are still served from
     * memory, so the node stays ready and says what is wrong. */
    char kvcm_why[640];
    for (size_t i = 0; i < tenants_count(d->tenants) && used < cap; i++) {
        const struct tenant *t = tenants_at(d->tenants, i);
        struct persist_counters pc;
        char pwhy[256];
        /* Short host memory is served from what was reserved: ready, and why. */
        if (t->cache && cache_populate_state(t->cache, pwhy, sizeof pwhy) == POPULATE_FAILED) {
            struct arena_stats hs;
            cache_host_stats(t->cache, &hs);
            used += (size_t)snprintf(msg + used, cap - used,
                                     "; %shost memory stays at %llu of %llu bytes: %.200s",
                                     log_tenant_prefix(t->named ? t->name : NULL, who, sizeof who),
                                     (unsigned long long)hs.reserved_bytes,
                                     (unsigned long long)hs.capacity, pwhy);
            if (used >= cap)
                break;
        }
        if (!t->persist)
            continue;
        persist_get_counters(t->persist, &pc);
        if (pc.state == PERSIST_STATE_DEGRADED)
            used += (size_t)snprintf(msg + used, cap - used, "; %spersistent store degraded: %.300s",
                                     log_tenant_prefix(t->named ? t->name : NULL, who, sizeof who),
                                     persist_last_error(t->persist));
    }
    if (used < cap && kvcm_stalled(d->kvcm, kvcm_why, sizeof kvcm_why))
        used += (size_t)snprintf(msg + used, cap - used, "; KVCM publisher stalled: %s", kvcm_why);
    return used;
}
