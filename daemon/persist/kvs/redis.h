/* kvs/redis: the `redis` backend — a Redis Cluster (or Valkey cluster, or one
 * plain Redis server) as the store, so that kvnoded instances on different
 * nodes share one cache. The cluster does sharding, replication, failover
 * and capacity (maxmemory + an LRU policy: a key it evicted is a miss);
 * routing is redis_cluster.c's.
 *
 * Keys: kvnode/<tenant>/<deployment_id>/<tp_rank>/<block key in signed
 * decimal>, tenant "default" for a single-tenant node; no hash tag, so
 * blocks spread over every shard.
 *
 * Values: a header of REDIS_HDR_FIXED bytes plus the tenant's name, then the
 * payload. Header (little-endian): magic "KVNR", version u16, header length
 * u16, deployment fingerprint u64, key i64, payload size u64, tp rank u32,
 * tenant length u16, reserved u16 (0), CRC-32C u32 over the header (this
 * field as 0), the tenant and the payload, reserved u32 (0). A value that
 * does not match what was asked for (any field, its length, the CRC) is
 * KVS_CORRUPT and is deleted.
 *
 * put_batch / get_batch / exists: one pipelined round trip per shard (SET /
 * GET / EXISTS per key); del: DEL. scan finds nothing (a cluster cannot be
 * listed cheaply): MATCH and GET look unknown keys up (lookup = auto).
 * keeps_deleted is false: DEL removes. Passwords: from [persist]
 * password_file or the environment (KVNODE_REDIS_PASSWORD), for AUTH only.
 * hiredis 0.14 (Debian bookworm) has no TLS: use a private network or a TLS
 * proxy (stunnel, spiped) in front of the cluster. */
#ifndef KVNODE_KVS_REDIS_H
#define KVNODE_KVS_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "persist/kvs/kvs.h"

#define REDIS_MAGIC       "KVNR"
#define REDIS_VERSION     1
#define REDIS_HDR_FIXED   48u
#define REDIS_KEY_PREFIX  "kvnode"
#define REDIS_PASSWORD_ENV "KVNODE_REDIS_PASSWORD"
#define REDIS_PASSWORD_MAX 512      /* bytes read from password_file, NUL included */

/* The Redis key of (ns, key) in tenant's store (NULL/"": "default");
 * returns the length snprintf would need. */
size_t redis_block_key(const char *tenant, const struct kvs_ns *ns, int64_t key, char *buf,
                       size_t len);
/* Header bytes for a block (the tenant's name included). */
size_t redis_header_len(const char *tenant);
/* Write the header of (ns, key, payload) into hdr (redis_header_len bytes). */
void redis_header_make(const char *tenant, const struct kvs_ns *ns, int64_t key,
                       const void *payload, size_t len, uint8_t *hdr);
/* Check a stored value against what was asked for; 0 when it is that
 * block (payload at value + redis_header_len), else KVS_CORRUPT with err
 * naming the mismatch. */
int redis_value_check(const char *tenant, const struct kvs_ns *ns, int64_t key, size_t len,
                      const void *value, size_t vlen, char *err, size_t errlen);

/* The password for AUTH: the file's first line when path is set (a missing
 * or unreadable file is an error), else $KVNODE_REDIS_PASSWORD, else "".
 * 0 or -KVNODE_EINVAL with err naming the file (never its contents). */
int redis_password_load(const char *path, char *buf, size_t len, char *err, size_t errlen);

/* The routing counters of a handle opened by kvs_backend_redis (tests). */
struct rcl_counters;
void redis_get_counters(struct kvs_store *s, struct rcl_counters *out);

#endif
