/* kvs/v6d keys: rtp-llm's object keys — its string hash, the deployment
 * part (the engine's own id or kvnode's), the key itself (format: see
 * v6d.h). Pure functions, any thread. */
#include "persist/kvs/v6d.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "mem/namespace.h"

/* ---- object keys --------------------------------------------------------------- */

/* rtp-llm's hashString (KVSConnector.cc:26-35 @85c02327f, PR #1154): FNV-1a
 * over the bytes, prime 1099511628211, but the offset basis its code has is
 * 1469598103934665603 — one digit short of the standard FNV-1a basis
 * 14695981039346656037 (namespace.c's ns_fnv1a64 uses that one). It is what
 * rtp-llm engines put in their object keys, so keys that must be theirs use
 * it as it is: "fixing" it would make every key differ from rtp-llm's. */
#define V6D_RTP_HASH_BASIS UINT64_C(1469598103934665603)
#define V6D_RTP_HASH_PRIME UINT64_C(1099511628211)

uint64_t v6d_rtp_hash_string(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = V6D_RTP_HASH_BASIS;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= V6D_RTP_HASH_PRIME;
    }
    return h;
}

/* The value of the extra item "kvs_deployment_id=<id>" (items separated by
 * ';'): a pointer into extra and its length, or NULL. */
static const char *engine_deployment_id(const char *extra, size_t extra_max, size_t *len)
{
    static const char tag[] = V6D_EXTRA_DEPLOYMENT_ID "=";
    size_t n = strnlen(extra, extra_max);
    for (size_t at = 0; at < n;) {
        const char *item = extra + at;
        const char *semi = memchr(item, ';', n - at);
        size_t ilen = semi ? (size_t)(semi - item) : n - at;
        if (ilen >= sizeof tag - 1 && memcmp(item, tag, sizeof tag - 1) == 0) {
            *len = ilen - (sizeof tag - 1);
            return item + sizeof tag - 1;
        }
        at += ilen + 1;
    }
    return NULL;
}

size_t v6d_deployment_id(const struct ns_layout *l, char *buf, size_t len)
{
    size_t idlen = 0;
    const char *id = engine_deployment_id(l->extra, sizeof l->extra, &idlen);
    int n;
    /* A revision (issue 31) is no part of rtp-llm's id: it is added, so
     * two revisions of a model never share objects. */
    size_t rl = strnlen(l->revision, sizeof l->revision);
    if (rl == sizeof l->revision)
        rl--;
    if (id && idlen > 0) {
        n = rl ? snprintf(buf, len, "%.*s-rev-%" PRIx64, (int)idlen, id, ns_fnv1a64(l->revision, rl))
               : snprintf(buf, len, "%.*s", (int)idlen, id);
    } else {
        char canon[NS_MODEL_MAX + NS_DTYPE_MAX + NS_EXTRA_MAX + NS_REVISION_MAX + 256];
        size_t cl = ns_canonical_string(l, canon, sizeof canon);
        if (rl && cl < sizeof canon) {
            int m = snprintf(canon + cl, sizeof canon - cl, "|revision=%.*s", (int)rl, l->revision);
            cl += m < 0 ? 0 : (size_t)m;
        }
        if (cl >= sizeof canon)
            cl = sizeof canon - 1;
        n = snprintf(buf, len, "%.*s-%" PRIx64, (int)strnlen(l->model, sizeof l->model),
                     l->model, v6d_rtp_hash_string(canon, cl));
    }
    return n < 0 ? 0 : (size_t)n;
}

size_t v6d_tenant_object_ns(const char *object_ns, const char *tenant, char *buf, size_t len)
{
    const char *ns = object_ns && *object_ns ? object_ns : V6D_DEFAULT_OBJECT_NS;
    int n = tenant && *tenant ? snprintf(buf, len, "%s" V6D_TENANT_NS_SEP "%s", ns, tenant)
                              : snprintf(buf, len, "%s", ns);
    return n < 0 ? 0 : (size_t)n;
}

static size_t put_part(char *buf, size_t len, size_t at, const char *s)
{
    for (; *s; s++, at++)
        if (at + 1 < len)
            buf[at] = (*s == '/' || *s == ' ' || *s == '\t' || *s == '\n') ? '_' : *s;
    return at;
}

size_t v6d_object_key(const char *object_ns, const struct kvs_ns *ns, int64_t key, uint64_t check,
                      char *buf, size_t len)
{
    char ver[16], dep[V6D_DEPLOYMENT_ID_MAX], rank[32], grp[32], blk[64];
    snprintf(ver, sizeof ver, "v%d", V6D_KEY_VERSION);
    v6d_deployment_id(ns->layout, dep, sizeof dep);
    snprintf(rank, sizeof rank, "tp-%" PRIu32, ns->layout->tp_rank);
    snprintf(grp, sizeof grp, "group-%d", V6D_KEY_GROUP);
    if (check)
        snprintf(blk, sizeof blk, "block-%" PRId64 V6D_CHECK_SEP "%016" PRIx64, key, check);
    else
        snprintf(blk, sizeof blk, "block-%" PRId64, key);
    const char *parts[] = { object_ns && *object_ns ? object_ns : V6D_DEFAULT_OBJECT_NS, ver,
                            dep, rank, grp, blk };
    size_t at = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (i) {
            if (at + 1 < len)
                buf[at] = '/';
            at++;
        }
        at = put_part(buf, len, at, parts[i]);
    }
    if (len)
        buf[at < len ? at : len - 1] = '\0';
    return at;
}
