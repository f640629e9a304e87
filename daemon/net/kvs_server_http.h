/* kvs_server_http: the bounds of the KVS front end's HTTP connections that
 * depend on who holds them (issue 30). Owns each tenant's count of open
 * HTTP connections and its share of [kvs_server] max_connections, applied
 * at accept through httpd's admit hook:
 *  - a connection's tenant is established at accept (the TCP peer's uid
 *    from the identify hook, or a unix peer's SO_PEERCRED) and counted
 *    against its share until it closes;
 *  - the shares add up to the total: a named tenant's is in proportion to
 *    its host memory (at least 1), "default" gets what the sections leave,
 *    less a reserve of max_connections / 32 for connections whose tenant
 *    cannot be established (they only ever get /health and 403s), so one
 *    tenant at its share never leaves another without a connection.
 * Loop thread only. */
#ifndef KVNODE_KVS_SERVER_HTTP_H
#define KVNODE_KVS_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tenants/tenants.h"

struct kvn_config;
struct httpd_peer;

struct kvs_http_conns {
    struct kvn_config *const *cfg;     /* read at each accept (reloads) */
    struct tenants *tenants;
    struct tenant *tenant[TENANTS_MAX];
    uint32_t open[TENANTS_MAX];        /* open connections of tenant[i] */
    size_t ntenants;
    uint32_t untenanted;               /* open connections without a tenant */
    uint64_t tenant_limit;             /* refused at accept: at the tenant's share, or the reserve full */
};

void kvs_http_conns_init(struct kvs_http_conns *hc, struct kvn_config *const *cfg, struct tenants *ts);
/* httpd's admit and release hooks (arg: the struct kvs_http_conns). */
int  kvs_http_admit(void *arg, int fd, const struct httpd_peer *peer, void **token, char *why, size_t whylen);
void kvs_http_release(void *arg, void *token);
/* t's share of [kvs_server] max_connections. */
uint32_t kvs_http_share(const struct kvn_config *cfg, struct tenants *ts, const struct tenant *t);

#endif
