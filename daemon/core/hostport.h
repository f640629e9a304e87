/* hostport: "host:port" text parsed into a host string and a port, one at a
 * time or as a comma/space-separated list of seed nodes. Owned here (below
 * config and persist) so that config can check [persist] nodes with the very
 * parser the redis backend connects with. Pure functions, any thread. */
#ifndef KVNODE_HOSTPORT_H
#define KVNODE_HOSTPORT_H

#include <stddef.h>

#define HOSTPORT_HOST_MAX  256     /* bytes of one host, its NUL included */
#define HOSTPORT_SEEDS_MAX 16      /* nodes one seed list may name */

/* "host:port" at p (len bytes; the last ':' splits, so IPv6 works; a
 * "@cport" suffix is ignored): 0 with host (hostlen bytes) and port 1..65535
 * set, or -1. */
int hostport_parse(const char *p, size_t len, char *host, size_t hostlen, int *port);

/* Parse seeds (validated: host non-empty, port 1..65535, at most
 * HOSTPORT_SEEDS_MAX); 0 or -KVNODE_EINVAL with err set. hosts[i] gets
 * HOSTPORT_HOST_MAX bytes. */
int hostport_parse_seeds(const char *seeds, char (*hosts)[HOSTPORT_HOST_MAX], int *ports, size_t *n,
                         char *err, size_t errlen);

#endif
