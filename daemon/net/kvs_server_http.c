/* kvs_server_http: the bounds of the KVS front end's HTTP connections that
 * depend on who holds them (issue 30; declared in kvs_server.h). Owns each
 * tenant's count of open HTTP connections and its share of [kvs_server]
 * max_connections, applied at accept through httpd's admit hook:
 *  - a connection's tenant is established at accept (the TCP peer's uid
 *    from the identify hook, or a unix peer's SO_PEERCRED) and counted
 *    against its share until it closes;
 *  - the shares add up to the total: a named tenant's is in proportion to
 *    its host memory (at least 1), "default" gets what the sections leave,
 *    less a reserve of max_connections / 32 for connections whose tenant
 *    cannot be established (they only ever get /health and 403s), so one
 *    tenant at its share never leaves another without a connection.
 * And the front end's side of the output caps ([kvs_server]
 * max_output_bytes, max_output_total_bytes; httpd counts the bytes, per
 * connection, per tenant and in all): a tenant's connections are httpd's
 * group of its slot here, and may hold its share of max_output_total_bytes
 * in unsent replies (the same shares as the connections', after a reserve
 * of 1/32 for clients without a tenant), so one tenant whose clients do
 * not read never has another's replies refused. The same for the bytes of
 * requests being received ([kvs_server] max_input_total_bytes): a tenant's
 * slow uploads hold at most its share of them.
 * Loop thread only. */
#include "net/kvs_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <jansson.h>

#include "config/config.h"
#include "core/log.h"
#include "net/httpd.h"
#include "tenants/tenants.h"

/* A connection's httpd group: its tenant's slot, or the untenanted one. */
#define KVS_HTTP_UNTENANTED_GROUP TENANTS_MAX
_Static_assert(KVS_HTTP_UNTENANTED_GROUP < HTTPD_MAX_GROUPS, "httpd counts output for every tenant's slot");

struct kvs_http_conns {
    struct kvn_config *const *cfg;     /* read at each accept (reloads) */
    struct tenants *tenants;
    struct tenant *tenant[TENANTS_MAX];
    uint32_t open[TENANTS_MAX];        /* open connections of tenant[i] */
    size_t ntenants;
    uint32_t untenanted;               /* open connections without a tenant */
    uint64_t tenant_limit;             /* refused at accept: at the tenant's share, or the reserve full */
};

struct kvs_http_conns *kvs_http_conns_new(struct kvn_config *const *cfg, struct tenants *ts)
{
    struct kvs_http_conns *hc = calloc(1, sizeof *hc);
    if (hc) {
        hc->cfg = cfg;
        hc->tenants = ts;
    }
    return hc;
}

void kvs_http_conns_free(struct kvs_http_conns *hc) { free(hc); }

uint64_t kvs_http_tenant_limit(const struct kvs_http_conns *hc) { return hc ? hc->tenant_limit : 0; }

/* Connections kept for clients whose tenant cannot be established. */
static uint32_t kvs_http_reserve(const struct kvn_config *cfg)
{
    return cfg->kvs_max_connections / 32;
}

/* t's share of [kvs_server] max_connections, less the reserve. */
static uint32_t kvs_http_share(const struct kvn_config *cfg, struct tenants *ts, const struct tenant *t)
{
    return tenants_share_of(ts, cfg, t, cfg->kvs_max_connections - kvs_http_reserve(cfg));
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

int kvs_http_admit(void *arg, int fd, const struct httpd_peer *peer, void **token, uint32_t *group, char *why,
                   size_t whylen)
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
        *group = t ? (uint32_t)(open - hc->open) : KVS_HTTP_UNTENANTED_GROUP;
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

/* A group's (tenant's) share of the node-wide byte bound total: total / 32
 * is kept for clients whose tenant is not known (and is their bound), the
 * rest shared as memory is (tenants_share_of); UINT64_MAX: no bound. */
static uint64_t kvs_http_group_share(struct kvs_http_conns *hc, uint64_t total, uint32_t group, char *who,
                                     size_t wholen)
{
    uint64_t reserve = total / 32;
    if (total == 0)
        return UINT64_MAX;
    if (group >= hc->ntenants) {
        snprintf(who, wholen, "clients whose tenant is not known");
        return reserve;
    }
    uint64_t pool = (total - reserve) >> 10;   /* tenants_share_of counts in 32 bits: in KiB */
    snprintf(who, wholen, "tenant %s", hc->tenant[group]->name);
    return (uint64_t)tenants_share_of(hc->tenants, *hc->cfg, hc->tenant[group],
                                      pool < UINT32_MAX ? (uint32_t)pool : UINT32_MAX) << 10;
}

uint64_t kvs_http_group_output(void *arg, uint32_t group, char *who, size_t wholen)
{
    struct kvs_http_conns *hc = arg;
    return kvs_http_group_share(hc, (*hc->cfg)->kvs_max_output_total_bytes, group, who, wholen);
}

uint64_t kvs_http_group_input(void *arg, uint32_t group, char *who, size_t wholen)
{
    struct kvs_http_conns *hc = arg;
    return kvs_http_group_share(hc, (*hc->cfg)->kvs_max_input_total_bytes, group, who, wholen);
}

void kvs_http_release(void *arg, void *token)
{
    uint32_t *open = token;
    (void)arg;
    if (*open)
        (*open)--;
}

char *kvs_http_bound_reply(struct evhttp_request *req, int *code, char *text)
{
    char why[384];
    int status = httpd_reply_room(req, strlen(text), why, sizeof why);

    if (status == 0)
        return text;
    free(text);
    log_debug("kvs front end: %d %s", status, why);
    *code = status;
    json_t *err = json_pack("{s:s}", "error", why);
    text = err ? json_dumps(err, JSON_COMPACT) : NULL;
    json_decref(err);
    return text;
}
