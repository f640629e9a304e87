/* kvs_server_http: per-tenant HTTP connection counts of the KVS front end
 * (see kvs_server_http.h). */
#include "net/kvs_server_http.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "config/config.h"
#include "config/config_tenant.h"
#include "net/httpd.h"
#include "net/kvs_server.h"

void kvs_http_conns_init(struct kvs_http_conns *hc, struct kvn_config *const *cfg, struct tenants *ts)
{
    memset(hc, 0, sizeof *hc);
    hc->cfg = cfg;
    hc->tenants = ts;
}

/* Connections kept for clients whose tenant cannot be established. */
static uint32_t kvs_http_reserve(const struct kvn_config *cfg)
{
    return cfg->kvs_max_connections / 32;
}

static uint32_t kvs_http_named_share(const struct kvn_config *cfg, const struct tenant *t, uint32_t pool)
{
    uint64_t share = config_tenant_share_of(cfg, t->host_bytes, pool);
    if (t->host_bytes == 0)
        return 0;
    return share ? (uint32_t)share : 1;
}

uint32_t kvs_http_share(const struct kvn_config *cfg, struct tenants *ts, const struct tenant *t)
{
    uint32_t pool = cfg->kvs_max_connections - kvs_http_reserve(cfg);
    uint64_t taken = 0;

    if (t->named)
        return kvs_http_named_share(cfg, t, pool);
    for (size_t i = 0; i < tenants_count(ts); i++) {
        const struct tenant *o = tenants_at(ts, i);
        if (o->named)
            taken += kvs_http_named_share(cfg, o, pool);
    }
    return taken < pool ? (uint32_t)(pool - taken) : 0;
}

static uint32_t *kvs_http_count(struct kvs_http_conns *hc, struct tenant *t)
{
    for (size_t i = 0; i < hc->ntenants; i++)
        if (hc->tenant[i] == t)
            return &hc->open[i];
    if (hc->ntenants == TENANTS_MAX)
        return NULL;
    hc->tenant[hc->ntenants] = t;
    hc->open[hc->ntenants] = 0;
    return &hc->open[hc->ntenants++];
}

/* The tenant of the client on fd (peer: what the identify hook established
 * for a TCP one); NULL with why when none. */
static struct tenant *kvs_http_tenant(struct kvs_http_conns *hc, int fd, const struct httpd_peer *peer, char *why,
                                      size_t whylen)
{
    const struct kvn_config *cfg = *hc->cfg;

    if (cfg->kvs_listen_addr.kind == CONFIG_LISTEN_UNIX) {
        struct ucred cred;
        return fd >= 0 ? kvs_server_unix_tenant(cfg, hc->tenants, fd, &cred, why, whylen) : NULL;
    }
    if (!peer || !peer->known) {
        snprintf(why, whylen, "%s", peer ? peer->why : "the connection's owner is not known");
        return NULL;
    }
    return kvs_server_tenant(cfg, hc->tenants, peer->uid, (gid_t)-1, NULL, 0, false, why, whylen);
}

int kvs_http_admit(void *arg, int fd, const struct httpd_peer *peer, void **token, char *why, size_t whylen)
{
    struct kvs_http_conns *hc = arg;
    const struct kvn_config *cfg = *hc->cfg;
    char who[256] = "";
    struct tenant *t = kvs_http_tenant(hc, fd, peer, who, sizeof who);
    uint32_t *open = t ? kvs_http_count(hc, t) : &hc->untenanted;
    uint32_t share = t ? kvs_http_share(cfg, hc->tenants, t) : kvs_http_reserve(cfg);

    if (open && *open < share) {
        (*open)++;
        *token = open;
        return 0;
    }
    hc->tenant_limit++;
    if (t)
        snprintf(why, whylen, "tenant %s holds %u KVS HTTP connections, its share of kvs_server.max_connections "
                 "(%u of %u, in proportion to its host memory); close some or try again later", t->name,
                 open ? *open : 0, share, cfg->kvs_max_connections);
    else
        snprintf(why, whylen, "the tenant of this client cannot be established (%.160s), and %u such connections "
                 "are open (kvs_server.max_connections / 32); try again later", who, share);
    return -1;
}

void kvs_http_release(void *arg, void *token)
{
    uint32_t *open = token;
    (void)arg;
    if (*open)
        (*open)--;
}
