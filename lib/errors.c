/* errors: names of the KVNODE_E* codes. */
#include <limits.h>

#include "kvnode.h"

static const char *const errors_text[] = {
    [KVNODE_OK]        = "success",
    [KVNODE_EINVAL]    = "invalid argument or request",
    [KVNODE_ENOMEM]    = "out of memory",
    [KVNODE_ENOSPC]    = "tier full: nothing evictable",
    [KVNODE_ENOLEASE]  = "unknown, expired or foreign lease",
    [KVNODE_ELAYOUT]   = "layout invalid or conflicts with a registered one",
    [KVNODE_EVERSION]  = "no common protocol version",
    [KVNODE_EPROTO]    = "malformed frame or message",
    [KVNODE_ETOOBIG]   = "frame, key count or block over a limit",
    [KVNODE_ETIMEDOUT] = "timed out",
    [KVNODE_ECONNECT]  = "cannot connect to the daemon",
    [KVNODE_ECLOSED]   = "connection closed",
    [KVNODE_EIO]       = "system call failed",
    [KVNODE_ESTATE]    = "operation not valid in this state",
    [KVNODE_ELIMIT]    = "a per-client limit was reached",
    [KVNODE_EDENIED]   = "refused by access control",
    [KVNODE_EINTERNAL] = "internal daemon error",
    [KVNODE_ESHUTDOWN] = "daemon is shutting down",
};

const char *kvnode_strerror(int rc)
{
    unsigned idx;

    /* Codes are returned negated; accept either sign. INT_MIN has no positive twin. */
    if (rc == INT_MIN)
        return "unknown error";
    idx = (unsigned)(rc < 0 ? -rc : rc);
    if (idx >= sizeof errors_text / sizeof errors_text[0] || !errors_text[idx])
        return "unknown error";
    return errors_text[idx];
}
