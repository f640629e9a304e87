/* hostport: see hostport.h. Moved from persist/kvs/redis_cluster.c. */
#include "core/hostport.h"

#include <string.h>

#include "core/errmsg.h"
#include "kvnode.h"

int hostport_parse(const char *p, size_t len, char *host, size_t hostlen, int *port)
{
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (p[i] == ':')
            colon = p + i;
    if (!colon || colon == p || (size_t)(colon - p) >= hostlen)
        return -1;
    size_t hl = (size_t)(colon - p);
    long v = 0;
    const char *q = colon + 1;
    if (q == p + len)
        return -1;
    for (; q < p + len; q++) {
        if (*q == '@')         /* host:port@cport (CLUSTER NODES style) */
            break;
        if (*q < '0' || *q > '9' || (v = v * 10 + (*q - '0')) > 65535)
            return -1;
    }
    if (v < 1)
        return -1;
    memcpy(host, p, hl);
    host[hl] = '\0';
    *port = (int)v;
    return 0;
}

int hostport_parse_seeds(const char *seeds, char (*hosts)[HOSTPORT_HOST_MAX], int *ports, size_t *n,
                         char *err, size_t errlen)
{
    *n = 0;
    const char *p = seeds ? seeds : "";
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, ", ");
        if (*n == HOSTPORT_SEEDS_MAX) {
            errmsg_set(err, errlen, "more than %d seed nodes", HOSTPORT_SEEDS_MAX);
            return -KVNODE_EINVAL;
        }
        if (hostport_parse(p, len, hosts[*n], HOSTPORT_HOST_MAX, &ports[*n]) < 0) {
            errmsg_set(err, errlen, "seed node '%.*s' is not HOST:PORT (port 1..65535)",
                       (int)(len > 80 ? 80 : len), p);
            return -KVNODE_EINVAL;
        }
        (*n)++;
        p += len;
    }
    if (*n == 0) {
        errmsg_set(err, errlen, "no seed nodes (HOST:PORT[,HOST:PORT...])");
        return -KVNODE_EINVAL;
    }
    return 0;
}
