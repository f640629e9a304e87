/* namespace: layout fingerprints and the registry of namespaces.
 *
 * A deployment is a layout without its TP rank, within a tenant, identified
 * by the FNV-1a 64 fingerprint of an identity string that includes the
 * tenant and everything that changes block bytes except block_bytes itself;
 * block_bytes must then agree across every namespace of the deployment, and
 * an engine announcing the same deployment with a different block size is
 * refused. A namespace is
 * (deployment, tp_rank) and owns the blocks its engines put. Namespaces
 * outlive the connections that created them.
 *
 * The registry: loop thread only. The identity functions are pure (store
 * workers check records with them). */
#ifndef KVNODE_NAMESPACE_H
#define KVNODE_NAMESPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NS_MODEL_MAX 128
#define NS_DTYPE_MAX 32
#define NS_EXTRA_MAX 256
#define NS_REVISION_MAX 128
#define NS_DEPLOYMENT_ID_MAX (NS_MODEL_MAX + 20)

struct ns_layout {
    char     model[NS_MODEL_MAX];
    char     dtype[NS_DTYPE_MAX];
    uint32_t block_tokens;
    uint64_t block_bytes;
    uint32_t num_layers, kv_heads, head_dim, tp_size, tp_rank;
    char     extra[NS_EXTRA_MAX];
    /* The model's weights revision (issue 31), "" when none: part of the
     * identity only when set, so a layout without one keeps the id it had. */
    char     revision[NS_REVISION_MAX];
};

#define NS_MAX_HBM_ARENAS 16            /* one per GPU (DEVMEM_MAX_DEVICES) */

struct kv_namespace {
    uint32_t id;                        /* 1-based; the record of an idle namespace may be
                                           reused, id and all, for a new one */
    struct ns_layout layout;
    uint64_t fingerprint;               /* deployment fingerprint */
    char     deployment_id[NS_DEPLOYMENT_ID_MAX]; /* <model>-<fp lowercase hex> */
    uint32_t cls;                       /* host arena size class (set by the cache;
                                           UINT32_MAX until then) */
    uint32_t hbm_cls[NS_MAX_HBM_ARENAS]; /* size class in HBM arena i + 1 (set by the
                                           cache at bind; UINT32_MAX: none) */
    uint64_t blocks;                    /* sealed blocks in memory */
    uint64_t bytes;                     /* their bytes (block_bytes each) */
    uint64_t reserved;                  /* bytes of slots reserved by writers, not
                                           yet committed (block_bytes each) */
    uint64_t stored;                    /* blocks known only in the persistent store
                                           (ghosts, incl. those being promoted) */
    uint32_t clients;                   /* connections bound now */
    uint32_t refs;                      /* store requests and waits that point at it
                                           (the cache's); while > 0 it is not reused */
    struct kv_namespace *sibling;       /* next namespace (TP rank) of the same deployment:
                                           a ring, itself when it is the only one */
    uint32_t ranks;                     /* namespaces in that ring (same in each) */
    uint32_t purges;                    /* purges begun (write leases note it at put_begin:
                                           one begun before a purge seals nothing) */
};

/* Canonical layout string, version 1 (without tp_rank and block_bytes);
 * returns the length snprintf would need. Strings are included verbatim, so
 * it is ambiguous when one holds '|': v6d object keys (rtp-llm's hash) use
 * it as it is; fingerprints use ns_identity_string. */
size_t ns_canonical_string(const struct ns_layout *l, char *buf, size_t len);
uint64_t ns_fnv1a64(const void *data, size_t len);
#define NS_TENANT_MAX 32                /* tenant names, NUL included */
/* A deployment's identity (issue 27) is (tenant, layout without tp_rank and
 * block_bytes), written so that no field's content can imitate another
 * field or the tenant (namespace.c has the text): the v1 string, with
 * "|tenant=<name>" for a named tenant, when model, dtype and extra hold no
 * '|' (what every version computed, so existing ids stay); else version 2,
 * each string length-prefixed; a layout with a revision (issue 31):
 * version 3, version 2's fields and the revision, length-prefixed. tenant
 * NULL or "": the tenant "default". Returns the length snprintf would need. */
size_t ns_identity_string(const struct ns_layout *l, const char *tenant, char *buf, size_t len);
/* Whether l's identity is the v1 string (no '|' in model, dtype, extra; no
 * revision). */
bool ns_identity_is_v1(const struct ns_layout *l);
/* FNV-1a 64 of ns_identity_string: the same layout in two tenants is two
 * deployments (other deployment ids, store keys and KVCM instances), and no
 * layout of one tenant has another's identity. */
uint64_t ns_fingerprint_tenant(const struct ns_layout *l, const char *tenant);
/* ns_fingerprint_tenant(l, NULL): the tenant "default". */
uint64_t ns_fingerprint(const struct ns_layout *l);
/* The fingerprint versions before issue 27 gave every layout: FNV-1a 64 of
 * the v1 string (+ "|tenant=<name>"). Equal to ns_fingerprint_tenant when
 * ns_identity_is_v1; otherwise what records of l written by those versions
 * carry (the file store recognises them at recovery). */
uint64_t ns_fingerprint_v1(const struct ns_layout *l, const char *tenant);
/* Every field of the identity is equal (tp_rank and block_bytes aside):
 * where a fingerprint match decides something, this confirms it. */
bool ns_same_deployment(const struct ns_layout *a, const struct ns_layout *b);
/* "<model>-<fingerprint lowercase hex>", '/', ' ', '\t', '\n' in the model
 * replaced by '_'; returns the length snprintf would need. */
size_t ns_deployment_id(const struct ns_layout *l, uint64_t fingerprint, char *buf, size_t len);
/* Check field ranges (non-empty model/dtype, block_tokens/bytes > 0,
 * tp_rank < tp_size, ...). 0 or -KVNODE_ELAYOUT with err naming the field. */
int ns_layout_validate(const struct ns_layout *l, char *err, size_t errlen);

struct ns_registry;

int  ns_registry_create(uint32_t max_namespaces, struct ns_registry **out);
/* The same for a tenant's namespaces (NULL or "": "default"): their
 * fingerprints are ns_fingerprint_tenant(l, tenant), and the limit message
 * names [tenant.NAME] max_namespaces. */
int  ns_registry_create_tenant(uint32_t max_namespaces, const char *tenant, struct ns_registry **out);
/* A new max_namespaces (reload): namespaces already active stay; new ones
 * are refused while the active ones reach it. 0, or -KVNODE_EINVAL for 0. */
int  ns_registry_set_max(struct ns_registry *r, uint32_t max_namespaces);
/* The tenant the registry was created for ("" for "default"). */
const char *ns_registry_tenant(const struct ns_registry *r);
void ns_registry_destroy(struct ns_registry *r);

/* Records (active and store-only namespaces together): the id space. */
#define NS_RECORDS_MAX 65536u

/* Find or create the namespace for l. *created says which. Errors:
 * -KVNODE_ELAYOUT (invalid, or same deployment with another block_bytes:
 * the message names both sizes), -KVNODE_ELIMIT (max_namespaces active
 * namespaces, and l's is not one of them: the message says how to recover;
 * or NS_RECORDS_MAX records). A new namespace may reuse the record (and id)
 * of an idle one (see namespace.c). */
int  ns_bind(struct ns_registry *r, const struct ns_layout *l, struct kv_namespace **out, int *created,
             char *err, size_t errlen);
/* The same; counted = false (recovery: a namespace known only from the
 * store) skips the max_namespaces check. */
int  ns_bind_ex(struct ns_registry *r, const struct ns_layout *l, bool counted, struct kv_namespace **out,
                int *created, char *err, size_t errlen);
/* Whether ns counts against max_namespaces: a client is bound to it, or it
 * has blocks in memory or reserved. */
bool ns_active(const struct kv_namespace *ns);
size_t ns_active_count(const struct ns_registry *r);
struct kv_namespace *ns_get(struct ns_registry *r, uint32_t id);
size_t ns_count(const struct ns_registry *r);
/* i in [0, ns_count): namespaces in creation order. */
struct kv_namespace *ns_at(struct ns_registry *r, size_t i);

#endif
