/* kvs/v6d: the `v6d` backend — rtp-llm's vineyard-based KV store (KVS),
 * spoken exactly as docs/PROTOCOLS.md §3 describes it.
 *
 * Control plane: HTTP/JSON (GET health, POST acquire/seal/release/discard)
 * through one persistent libcurl easy handle per store handle (connections are
 * reused; connect and total timeouts from kvs_config, defaults
 * V6D_DEFAULT_CONNECT_TIMEOUT_MS / V6D_DEFAULT_TIMEOUT_MS; response bodies
 * over V6D_MAX_HTTP_BODY are aborted). Statuses are exact: health 200,
 * acquire 200, seal/release/discard 204; anything else fails with the status
 * and the first bytes of the body in the message.
 *
 * Data plane: at open each handle connects the store's unix socket (non-
 * blocking connect, one deadline of timeout_ms over the whole handshake),
 * registers, asks for the arena fd, receives it by SCM_RIGHTS and maps
 * [0,size) read-write shared. Replies over V6D_MAX_FRAME are refused before
 * anything is allocated. Each handle does its own handshake and has its own
 * mapping (simplest; the kernel shares the pages). The data-plane socket stays
 * open for the handle's life: when the store closes it (store stopped or
 * restarted) the mapping is stale, so every call checks the socket after
 * acquire and before touching the mapping; a dead socket fails the call
 * (-KVNODE_ECLOSED, leases released) and the next call redoes the handshake.
 *
 * Object keys (rtp-llm v1 format, exactly as rtp-llm's KVSConnector builds
 * them, so that kvnode and rtp-llm engines find each other's objects):
 *   <ns>/v<version>/<deployment_id>/tp-<rank>/group-<g>/block-<key>
 * with '/', ' ', '\t', '\n' in each part replaced by '_' and key in signed
 * decimal; ns = [persist] object_namespace (default V6D_DEFAULT_OBJECT_NS,
 * rtp-llm's kvs_object_namespace), for a named tenant's store followed by
 * V6D_TENANT_NS_SEP and the tenant's name (v6d_tenant_object_ns), version =
 * V6D_KEY_VERSION, group = V6D_KEY_GROUP. deployment_id: the engine's own when the layout's extra
 * carries an item "kvs_deployment_id=<id>" (items separated by ';': rtp-llm
 * hashes its checkpoint path and other settings kvnode never sees, so only
 * the engine can supply its id), else "<model>-<hex>" with hex =
 * v6d_rtp_hash_string of kvnode's canonical layout string (namespace.c).
 * Tenants (issue 15) are kept apart by the namespace part, which only the
 * operator sets, not by the deployment part, which engines choose (their
 * kvs_deployment_id, their layout): two tenants' objects can never share a
 * key whatever the engines send, and an rtp-llm engine shares a tenant's
 * objects by using that tenant's namespace as its kvs_object_namespace.
 * The tenant "default" keeps object_namespace as it is (what a node wrote
 * before tenants stays found).
 *
 * put:  one block is a batch of one (put_batch).
 * put_batch: acquire(create, ignore_existing) for every object -> (empty
 *       lease_id: all stored already, success) -> size/bounds checks -> copy
 *       each returned object -> seal -> release (a failed release is ignored:
 *       sealed objects stay). Objects the reply leaves out exist already.
 *       Any failure after the acquire: discard only (no release: a discarded
 *       lease is gone), every item fails with the error. A null entry or an
 *       invalid handle in a create reply is a protocol error (rtp-llm's
 *       client fails the store on it too).
 * get / get_batch: acquire(read, best_effort) for every object -> per
 *       object: absent: KVS_MISS; server size != len: KVS_MISS (never reads
 *       past the object); offset+size outside the mapping: -KVNODE_EPROTO;
 *       else copy -> one release. Every granted lease is ended on every
 *       path. A lease granted after the client gave up (timeout) cannot be
 *       known to it and ends at its term (V6D_TERM_S).
 * del:  the protocol cannot delete a sealed object (discard ends unsealed
 *       create leases only): returns 0 and sends nothing; keeps_deleted is
 *       set so that persist hides deleted keys (tombstones, persist.h).
 * scan: the store keeps no layouts we could enumerate: returns 1 at once
 *       (complete, nothing found).
 * health: GET health == 200 and the data-plane mapping is present. */
#ifndef KVNODE_KVS_V6D_H
#define KVNODE_KVS_V6D_H

#include <stddef.h>
#include <stdint.h>

#include "persist/kvs/kvs.h"

#define V6D_DEFAULT_OBJECT_NS "rtp_llm"    /* rtp-llm's kvs_object_namespace default */
#define V6D_OBJECT_NS_MAX   128           /* bytes, NUL included */
#define V6D_TENANT_NS_SEP   ".tenant-"    /* <object_namespace>.tenant-<NAME>: a named tenant's */
/* A store's namespace part: object_namespace plus a tenant's suffix. */
#define V6D_STORE_NS_MAX    (V6D_OBJECT_NS_MAX + sizeof V6D_TENANT_NS_SEP + NS_TENANT_MAX)
#define V6D_EXTRA_DEPLOYMENT_ID "kvs_deployment_id"  /* layout extra item naming the id */
#define V6D_DEPLOYMENT_ID_MAX NS_EXTRA_MAX
#define V6D_KEY_VERSION     1
#define V6D_KEY_GROUP       0
#define V6D_LAYOUT          "rtp_llm_group_block_v1"
#define V6D_TERM_S          60          /* lease term asked for (seconds) */
#define V6D_MAX_HTTP_BODY   (1u << 20)  /* control-plane reply cap */
#define V6D_MAX_FRAME       (16u << 20) /* data-plane reply cap */
#define V6D_DEFAULT_CONNECT_TIMEOUT_MS 1000u
#define V6D_DEFAULT_TIMEOUT_MS         12000u
#define V6D_EXISTS_CHUNK    128         /* keys per acquire in exists() */

/* One object of an acquire reply, as matched to a requested key. */
struct v6d_obj {
    int present;                /* 0: null, absent, or object_id UINT64_MAX */
    uint64_t offset, size;      /* size: meta.size when > 0, else data_size */
};

/* Parse an acquire reply for the n requested keys: objects are matched by
 * key (never by position); null or missing objects are absent. lease_id gets
 * the lease (possibly "") whenever the reply names one, even when the rest
 * is malformed, so a caller can still release it (lease_id[0] == '\0'
 * otherwise). Integers may be any JSON number type; negative, non-integral or
 * inexact values, blobs[0] of a type other than "vineyard", unknown or
 * duplicate keys are protocol errors. 0 or -KVNODE_EPROTO with err set. */
int v6d_parse_acquire_reply(const char *body, size_t len, const char *const *keys, size_t n,
                            char *lease_id, size_t lease_cap, struct v6d_obj *objs,
                            char *err, size_t errlen);

/* rtp-llm's hashString: FNV-1a with rtp-llm's offset basis 1469598103934665603
 * (see v6d_keys.c for why that constant and not the standard one). */
uint64_t v6d_rtp_hash_string(const void *data, size_t len);
/* The deployment part of l's object keys (see above); returns the length
 * snprintf would need. */
size_t v6d_deployment_id(const struct ns_layout *l, char *buf, size_t len);
/* The namespace part of the object keys of tenant's store: object_ns
 * (NULL or "": V6D_DEFAULT_OBJECT_NS) for "default" (tenant NULL or ""),
 * else object_ns V6D_TENANT_NS_SEP tenant. Returns the length snprintf
 * would need. */
size_t v6d_tenant_object_ns(const char *object_ns, const char *tenant, char *buf, size_t len);
/* The object key of (ns, key) under object_ns (NULL or "":
 * V6D_DEFAULT_OBJECT_NS); returns the length snprintf would need. A block
 * with a check word (check != 0, issue 19) has the word in its key's last
 * part, "block-<key>" V6D_CHECK_SEP "<word, 16 hex digits>": rtp-llm, which
 * has no words, never reads it, and two words never share an object; word
 * 0 is rtp-llm's key exactly. */
#define V6D_CHECK_SEP "-check-"
size_t v6d_object_key(const char *object_ns, const struct kvs_ns *ns, int64_t key, uint64_t check,
                      char *buf, size_t len);

#endif
