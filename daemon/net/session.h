/* session: what one engine connection is bound to — its peer identity
 * (filled by the server at accept), its tenant (decided once, at accept, by
 * the handler's admit), its namespace and leases (ops). The
 * server embeds one in each connection and hands it to its handler (ops),
 * which owns everything in it but the identity.
 *
 * Loop thread only. */
#ifndef KVNODE_SESSION_H
#define KVNODE_SESSION_H

#include <stdbool.h>
#include <sys/types.h>

#include "mem/lease.h"
#include "mem/namespace.h"

struct ops_pending;
struct tenant;

struct session {
    bool          hello_done;
    bool          observer;       /* HELLO without a layout */
    bool          reader;         /* declared at HELLO: lent memory read-only, may not write */
    bool          hbm_lent;       /* HELLO lent it an HBM arena: the stop tells it to let go (GoingAway)
                                     and waits for its close before HBM is freed */
    struct tenant *tenant;        /* whose memory it is served from; never changes */
    struct kv_namespace *ns;
    struct lease_list leases;
    struct ops_pending *pending;  /* a request answered later (waits for the store) */
    pid_t pid;
    uid_t uid;
    gid_t gid;
    char  name[64];
};

#endif
