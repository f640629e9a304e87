/* namespace: layout fingerprints and the namespace registry (see namespace.h).
 *
 * Canonical layout string, version 1, exactly:
 *
 *   kvnode-layout-v1|model=<model>|dtype=<dtype>|block_tokens=<u>|num_layers=<u>
 *   |kv_heads=<u>|head_dim=<u>|tp_size=<u>|extra=<extra>
 *
 * (one line, no spaces or newline between the parts), numbers in unsigned
 * decimal, strings verbatim. tp_rank is left out so every rank of a
 * deployment shares the fingerprint; block_bytes is left out so that a rank
 * announcing a different block size for the same deployment is detected as
 * a conflict instead of silently becoming another deployment. Changing this
 * text changes every deployment id (and persisted object keys): bump the
 * version prefix if it ever has to change.
 *
 * Identity string (issue 27). The fingerprint hashes (tenant, layout); in
 * the v1 string a field may contain '|' and so imitate the fields after it
 * or a tenant's "|tenant=NAME" suffix. So:
 *
 * - no '|' in model, dtype and extra (tenant names never have one): the v1
 *   string, followed by "|tenant=<name>" for a named tenant -- exactly what
 *   earlier versions hashed, so the ids of existing stores stay. Unambiguous:
 *   split at '|' it has 9 parts (10 with a tenant), each "label=value";
 * - otherwise, version 2, every string length-prefixed (bytes, decimal):
 *
 *   kvnode-layout-v2|tenant=<n>:<tenant>|model=<n>:<model>|dtype=<n>:<dtype>
 *   |block_tokens=<u>|num_layers=<u>|kv_heads=<u>|head_dim=<u>|tp_size=<u>
 *   |extra=<n>:<extra>
 *
 *   (tenant "" for "default"). Read left to right, each length says where
 *   its field ends, so no content can be taken for a label.
 *
 * - a layout with a revision (issue 31; "" is none), version 3: version 2's
 *   text under its own prefix, then "|revision=<n>:<revision>":
 *
 *   kvnode-layout-v3|tenant=<n>:<tenant>|...|extra=<n>:<extra>|revision=<n>:<revision>
 *
 *   A layout without a revision keeps its v1 or v2 string, so the blocks
 *   stored before revisions existed stay found.
 *
 * The three never meet: they differ in the version byte. Together they are
 * one-to-one on (tenant, layout without tp_rank and block_bytes).
 *
 * fingerprint = FNV-1a 64 of the identity string (offset 0xcbf29ce484222325,
 * prime 0x100000001b3); deployment_id = "<model>-<fingerprint, lowercase
 * hex, no padding>" with '/', ' ', '\t', '\n' in the model replaced by '_'.
 *
 * The registry is an array of records; id = index + 1. A record is never
 * freed while the daemon runs (pointers stay valid), but one that is idle —
 * no client, nothing in memory, nothing in the store, no request pointing at
 * it (refs) — is reused for a new namespace once there are max_namespaces
 * records. Only active namespaces
 * (a client bound, or blocks in memory) count against max_namespaces;
 * store-only ones do not, and records of both kinds together are bounded by
 * NS_RECORDS_MAX. Lookups are linear: they happen on HELLO and recovery only. */
#include "mem/namespace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errmsg.h"
#include "kvnode.h"

/* The standard basis 14695981039346656037, not rtp-llm's (docs/PROTOCOLS.md §4.3). */
#define NS_FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define NS_FNV_PRIME  UINT64_C(0x100000001b3)    /* 1099511628211 */
/* Fixed text, 5 numbers of at most 10 digits, 4 lengths and the strings. */
#define NS_IDENTITY_MAX (NS_MODEL_MAX + NS_DTYPE_MAX + NS_EXTRA_MAX + NS_TENANT_MAX + NS_REVISION_MAX + 256)

struct ns_registry {
    struct kv_namespace **items;
    size_t count, cap;
    uint32_t max;       /* active namespaces */
    char tenant[NS_TENANT_MAX];   /* "": "default" (fingerprints as before tenants) */
};

/* The fields are fixed arrays filled from the wire: never read past them
 * even when a caller forgot the terminator (validation refuses that). */
static int ns_field_len(const char *s, size_t max)
{
    return (int)strnlen(s, max);
}

size_t ns_canonical_string(const struct ns_layout *l, char *buf, size_t len)
{
    int n = snprintf(buf, len,
                     "kvnode-layout-v1|model=%.*s|dtype=%.*s|block_tokens=%" PRIu32
                     "|num_layers=%" PRIu32 "|kv_heads=%" PRIu32 "|head_dim=%" PRIu32
                     "|tp_size=%" PRIu32 "|extra=%.*s",
                     ns_field_len(l->model, NS_MODEL_MAX), l->model,
                     ns_field_len(l->dtype, NS_DTYPE_MAX), l->dtype,
                     l->block_tokens, l->num_layers, l->kv_heads, l->head_dim, l->tp_size,
                     ns_field_len(l->extra, NS_EXTRA_MAX), l->extra);
    return n < 0 ? 0 : (size_t)n;
}

uint64_t ns_fnv1a64(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = NS_FNV_OFFSET;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= NS_FNV_PRIME;
    }
    return h;
}

/* Whether the v1 string of l is unambiguous (no '|' in its strings) and
 * says everything (no revision). */
bool ns_identity_is_v1(const struct ns_layout *l)
{
    return !l->revision[0] && !memchr(l->model, '|', (size_t)ns_field_len(l->model, NS_MODEL_MAX)) &&
           !memchr(l->dtype, '|', (size_t)ns_field_len(l->dtype, NS_DTYPE_MAX)) &&
           !memchr(l->extra, '|', (size_t)ns_field_len(l->extra, NS_EXTRA_MAX));
}

/* The v1 string, then "|tenant=<name>" for a named tenant. */
static size_t ns_identity_v1(const struct ns_layout *l, const char *tenant, char *buf, size_t len)
{
    size_t n = ns_canonical_string(l, buf, len);
    if (!tenant || !*tenant)
        return n;
    int m = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, "|tenant=%.*s",
                     ns_field_len(tenant, NS_TENANT_MAX), tenant);
    return n + (m < 0 ? 0 : (size_t)m);
}

/* Version 2, or with a revision version 3 (version 2's fields, then the revision). */
static size_t ns_identity_v2(const struct ns_layout *l, const char *tenant, char *buf, size_t len)
{
    int tl = tenant ? ns_field_len(tenant, NS_TENANT_MAX) : 0;
    int ml = ns_field_len(l->model, NS_MODEL_MAX), dl = ns_field_len(l->dtype, NS_DTYPE_MAX);
    int el = ns_field_len(l->extra, NS_EXTRA_MAX);
    int rl = ns_field_len(l->revision, NS_REVISION_MAX);
    int n = snprintf(buf, len,
                     "kvnode-layout-v%c|tenant=%d:%.*s|model=%d:%.*s|dtype=%d:%.*s|block_tokens=%" PRIu32
                     "|num_layers=%" PRIu32 "|kv_heads=%" PRIu32 "|head_dim=%" PRIu32
                     "|tp_size=%" PRIu32 "|extra=%d:%.*s",
                     rl ? '3' : '2', tl, tl, tenant ? tenant : "", ml, ml, l->model, dl, dl, l->dtype,
                     l->block_tokens, l->num_layers, l->kv_heads, l->head_dim, l->tp_size,
                     el, el, l->extra);
    if (n < 0)
        return 0;
    if (!rl)
        return (size_t)n;
    size_t at = (size_t)n;
    int m = snprintf(at < len ? buf + at : NULL, at < len ? len - at : 0, "|revision=%d:%.*s",
                     rl, rl, l->revision);
    return at + (m < 0 ? 0 : (size_t)m);
}

size_t ns_identity_string(const struct ns_layout *l, const char *tenant, char *buf, size_t len)
{
    return ns_identity_is_v1(l) ? ns_identity_v1(l, tenant, buf, len) : ns_identity_v2(l, tenant, buf, len);
}

/* FNV-1a of what one of the builders above writes; the buffer fits the
 * bounded fields, but never hash past it. */
static uint64_t ns_hash_identity(size_t (*build)(const struct ns_layout *, const char *, char *, size_t),
                                 const struct ns_layout *l, const char *tenant)
{
    char buf[NS_IDENTITY_MAX];
    size_t n = build(l, tenant, buf, sizeof buf);
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    return ns_fnv1a64(buf, n);
}

uint64_t ns_fingerprint(const struct ns_layout *l)
{
    return ns_fingerprint_tenant(l, NULL);
}

uint64_t ns_fingerprint_tenant(const struct ns_layout *l, const char *tenant)
{
    return ns_hash_identity(ns_identity_string, l, tenant);
}

uint64_t ns_fingerprint_v1(const struct ns_layout *l, const char *tenant)
{
    return ns_hash_identity(ns_identity_v1, l, tenant);
}

size_t ns_deployment_id(const struct ns_layout *l, uint64_t fingerprint, char *buf, size_t len)
{
    char model[NS_MODEL_MAX];
    int mlen = ns_field_len(l->model, NS_MODEL_MAX);
    if (mlen == NS_MODEL_MAX)
        mlen--;
    for (int i = 0; i < mlen; i++) {
        char c = l->model[i];
        model[i] = (c == '/' || c == ' ' || c == '\t' || c == '\n') ? '_' : c;
    }
    model[mlen] = '\0';
    int n = snprintf(buf, len, "%s-%" PRIx64, model, fingerprint);
    return n < 0 ? 0 : (size_t)n;
}

/* 0 when s is a terminated, non-empty (if required) string without control
 * characters; otherwise err names the field. */
static int ns_check_string(const char *name, const char *s, size_t max, int required,
                           int allow_ctl, char *err, size_t errlen)
{
    size_t n = strnlen(s, max);
    if (n == max) {
        errmsg_set(err, errlen, "layout: %s is longer than %zu bytes", name, max - 1);
        return -KVNODE_ELAYOUT;
    }
    if (required && n == 0) {
        errmsg_set(err, errlen, "layout: %s is empty", name);
        return -KVNODE_ELAYOUT;
    }
    if (allow_ctl)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f) {
            errmsg_set(err, errlen, "layout: %s contains control character 0x%02x at byte %zu",
                       name, c, i);
            return -KVNODE_ELAYOUT;
        }
    }
    return 0;
}

int ns_layout_validate(const struct ns_layout *l, char *err, size_t errlen)
{
    int rc;
    if ((rc = ns_check_string("model", l->model, NS_MODEL_MAX, 1, 0, err, errlen)) != 0)
        return rc;
    if ((rc = ns_check_string("dtype", l->dtype, NS_DTYPE_MAX, 1, 0, err, errlen)) != 0)
        return rc;
    /* extra is free-form; it only has to fit. */
    if ((rc = ns_check_string("extra", l->extra, NS_EXTRA_MAX, 0, 1, err, errlen)) != 0)
        return rc;
    if ((rc = ns_check_string("revision", l->revision, NS_REVISION_MAX, 0, 0, err, errlen)) != 0)
        return rc;
    if (l->block_tokens == 0) {
        errmsg_set(err, errlen, "layout: block_tokens must be > 0");
        return -KVNODE_ELAYOUT;
    }
    if (l->block_bytes == 0) {
        errmsg_set(err, errlen, "layout: block_bytes must be > 0");
        return -KVNODE_ELAYOUT;
    }
    if (l->tp_size == 0) {
        errmsg_set(err, errlen, "layout: tp_size must be >= 1");
        return -KVNODE_ELAYOUT;
    }
    if (l->tp_rank >= l->tp_size) {
        errmsg_set(err, errlen, "layout: tp_rank %" PRIu32 " is not below tp_size %" PRIu32,
                   l->tp_rank, l->tp_size);
        return -KVNODE_ELAYOUT;
    }
    return 0;
}

int ns_registry_create(uint32_t max_namespaces, struct ns_registry **out)
{
    return ns_registry_create_tenant(max_namespaces, NULL, out);
}

int ns_registry_set_max(struct ns_registry *r, uint32_t max_namespaces)
{
    if (max_namespaces == 0)
        return -KVNODE_EINVAL;
    r->max = max_namespaces;
    return 0;
}

const char *ns_registry_tenant(const struct ns_registry *r)
{
    return r->tenant;
}

int ns_registry_create_tenant(uint32_t max_namespaces, const char *tenant, struct ns_registry **out)
{
    *out = NULL;
    if (max_namespaces == 0)
        return -KVNODE_EINVAL;
    struct ns_registry *r = calloc(1, sizeof(*r));
    if (!r)
        return -KVNODE_ENOMEM;
    r->cap = max_namespaces < NS_RECORDS_MAX ? max_namespaces : NS_RECORDS_MAX;
    r->items = calloc(r->cap, sizeof(*r->items));
    if (!r->items) {
        free(r);
        return -KVNODE_ENOMEM;
    }
    r->max = max_namespaces;
    if (tenant)
        snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    *out = r;
    return 0;
}

void ns_registry_destroy(struct ns_registry *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->count; i++)
        free(r->items[i]);
    free(r->items);
    free(r);
}

bool ns_same_deployment(const struct ns_layout *a, const struct ns_layout *b)
{
    return strncmp(a->model, b->model, NS_MODEL_MAX) == 0 &&
           strncmp(a->dtype, b->dtype, NS_DTYPE_MAX) == 0 &&
           strncmp(a->extra, b->extra, NS_EXTRA_MAX) == 0 &&
           strncmp(a->revision, b->revision, NS_REVISION_MAX) == 0 &&
           a->block_tokens == b->block_tokens && a->num_layers == b->num_layers &&
           a->kv_heads == b->kv_heads && a->head_dim == b->head_dim && a->tp_size == b->tp_size;
}

bool ns_active(const struct kv_namespace *ns)
{
    return ns->clients > 0 || ns->blocks > 0 || ns->reserved > 0;
}

/* Nothing in or about to be in memory or the store, and nothing refers to it. */
static bool ns_reusable(const struct kv_namespace *ns)
{
    return !ns_active(ns) && ns->stored == 0 && ns->refs == 0;
}

size_t ns_active_count(const struct ns_registry *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->count; i++)
        n += ns_active(r->items[i]);
    return n;
}

/* Take ns out of its deployment's ring of ranks. */
static void ns_ring_leave(struct kv_namespace *ns)
{
    struct kv_namespace *prev = ns;
    while (prev->sibling != ns)
        prev = prev->sibling;
    if (prev != ns) {
        prev->sibling = ns->sibling;
        struct kv_namespace *o = prev;
        do {
            o->ranks--;
            o = o->sibling;
        } while (o != prev);
    }
    ns->sibling = ns;
    ns->ranks = 1;
}

/* A record for a new namespace: an idle one reused, or a new one. */
static struct kv_namespace *ns_record(struct ns_registry *r, char *err, size_t errlen)
{
    /* Below max_namespaces records ids are handed out fresh (ids stay
     * stable while there is room); from there on idle records are reused. */
    for (size_t i = 0; i < r->count && r->count >= r->max; i++) {
        struct kv_namespace *ns = r->items[i];
        if (ns_reusable(ns)) {
            uint32_t id = ns->id;
            ns_ring_leave(ns);
            memset(ns, 0, sizeof *ns);
            ns->id = id;
            return ns;
        }
    }
    if (r->count >= NS_RECORDS_MAX) {
        errmsg_set(err, errlen, "namespace records exhausted: %u namespaces known (in use or only in "
                   "the store); delete the blocks of deployments no longer served", NS_RECORDS_MAX);
        return NULL;
    }
    if (r->count == r->cap) {
        size_t cap = r->cap * 2 < NS_RECORDS_MAX ? r->cap * 2 : NS_RECORDS_MAX;
        struct kv_namespace **items = realloc(r->items, cap * sizeof *items);
        if (!items) {
            errmsg_set(err, errlen, "out of memory creating a namespace");
            return NULL;
        }
        r->items = items;
        r->cap = cap;
    }
    struct kv_namespace *ns = calloc(1, sizeof(*ns));
    if (!ns) {
        errmsg_set(err, errlen, "out of memory creating a namespace");
        return NULL;
    }
    ns->id = (uint32_t)(r->count + 1);
    r->items[r->count++] = ns;
    return ns;
}

static int ns_limit_error(const struct ns_registry *r, char *err, size_t errlen)
{
    char option[NS_TENANT_MAX + 32];
    if (r->tenant[0])
        snprintf(option, sizeof option, "[tenant.%s] max_namespaces", r->tenant);
    else
        snprintf(option, sizeof option, "server.max_namespaces");
    errmsg_set(err, errlen, "namespace limit reached: %" PRIu32 " namespaces in use "
               "(%s); a namespace stops counting once no client is bound to it "
               "and none of its blocks is in memory (blocks only in the store do not count): "
               "disconnect engines of deployments no longer served or delete their blocks, or raise "
               "%s (%s)", r->max, option, option, r->tenant[0] ? "reload" : "restart");
    return -KVNODE_ELIMIT;
}

int ns_bind(struct ns_registry *r, const struct ns_layout *l, struct kv_namespace **out, int *created,
            char *err, size_t errlen)
{
    return ns_bind_ex(r, l, true, out, created, err, errlen);
}

int ns_bind_ex(struct ns_registry *r, const struct ns_layout *l, bool counted, struct kv_namespace **out,
               int *created, char *err, size_t errlen)
{
    if (out)
        *out = NULL;
    if (created)
        *created = 0;
    int rc = ns_layout_validate(l, err, errlen);
    if (rc != 0)
        return rc;
    uint64_t fp = ns_fingerprint_tenant(l, r->tenant);

    /* Every namespace with this fingerprint has the same fields and
     * block_bytes (bind refuses anything else), so the first one with the
     * fingerprint decides a conflict. */
    struct kv_namespace *sib = NULL;
    for (size_t i = 0; i < r->count; i++) {
        struct kv_namespace *ns = r->items[i];
        if (ns->fingerprint != fp)
            continue;
        sib = ns;
        if (!ns_same_deployment(&ns->layout, l)) {
            char mine[NS_DEPLOYMENT_ID_MAX];
            ns_deployment_id(l, fp, mine, sizeof(mine));
            errmsg_set(err, errlen,
                       "layout conflict: %s has the fingerprint of registered deployment %s "
                       "but a different layout", mine, ns->deployment_id);
            return -KVNODE_ELAYOUT;
        }
        if (ns->layout.block_bytes != l->block_bytes) {
            errmsg_set(err, errlen,
                       "layout conflict: deployment %s already registered with block_bytes %"
                       PRIu64 ", engine announced %" PRIu64,
                       ns->deployment_id, ns->layout.block_bytes, l->block_bytes);
            return -KVNODE_ELAYOUT;
        }
        if (ns->layout.tp_rank == l->tp_rank) {
            /* Binding a namespace that does not count yet makes it count. */
            if (counted && !ns_active(ns) && ns_active_count(r) >= r->max)
                return ns_limit_error(r, err, errlen);
            if (out)
                *out = ns;
            return 0;
        }
    }

    if (counted && ns_active_count(r) >= r->max)
        return ns_limit_error(r, err, errlen);
    struct kv_namespace *ns = ns_record(r, err, errlen);
    if (!ns)
        return r->count >= NS_RECORDS_MAX ? -KVNODE_ELIMIT : -KVNODE_ENOMEM;
    /* The record may have been the sibling found above: look again. */
    sib = NULL;
    for (size_t i = 0; i < r->count && !sib; i++)
        if (r->items[i] != ns && r->items[i]->fingerprint == fp)
            sib = r->items[i];
    ns->layout = *l;
    /* Terminate the copies: validation proved they fit. */
    ns->layout.model[NS_MODEL_MAX - 1] = '\0';
    ns->layout.dtype[NS_DTYPE_MAX - 1] = '\0';
    ns->layout.extra[NS_EXTRA_MAX - 1] = '\0';
    ns->layout.revision[NS_REVISION_MAX - 1] = '\0';
    ns->fingerprint = fp;
    ns_deployment_id(l, fp, ns->deployment_id, sizeof(ns->deployment_id));
    ns->cls = UINT32_MAX;   /* no size class until the cache assigns one */
    /* Join the deployment's ring of ranks. */
    if (sib) {
        ns->sibling = sib->sibling;
        sib->sibling = ns;
        uint32_t ranks = sib->ranks + 1;
        struct kv_namespace *o = ns;
        do {
            o->ranks = ranks;
            o = o->sibling;
        } while (o != ns);
    } else {
        ns->sibling = ns;
        ns->ranks = 1;
    }
    if (out)
        *out = ns;
    if (created)
        *created = 1;
    return 0;
}

struct kv_namespace *ns_get(struct ns_registry *r, uint32_t id)
{
    if (id == 0 || id > r->count)
        return NULL;
    return r->items[id - 1];
}

size_t ns_count(const struct ns_registry *r) { return r->count; }

struct kv_namespace *ns_at(struct ns_registry *r, size_t i)
{
    return i < r->count ? r->items[i] : NULL;
}
