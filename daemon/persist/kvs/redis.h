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
 * payload. Header (little-endian): magic "KVNR", version u16 (2), header
 * length u16, deployment fingerprint u64, key i64, payload size u64, tp rank
 * u32, tenant length u16, reserved u16 (0), CRC-32C u32 over the header
 * (this field as 0), the tenant and the payload, reserved u32 (0), the
 * block's check word u64 (0: none). Version 1 values (REDIS_HDR_FIXED_V1
 * bytes: no check word) are still read, as word 0. A value that does not
 * match what was asked for (any field, its length, the CRC) is KVS_CORRUPT
 * and is deleted; one that matches but for its check word belongs to another
 * prefix: KVS_MISMATCH, and it is kept.
 *
 * put_batch / get_batch: one pipelined round trip per shard (SET / GET per
 * key); exists: GETRANGE of the header (its check word) per key; del:
 * GETRANGE of the header, then DEL of the keys whose word is the caller's
 * (two round trips: a put of another word between them is deleted too).
 * scan finds nothing (a cluster cannot be listed cheaply): MATCH and GET
 * look unknown keys up (lookup = auto).
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
#define REDIS_VERSION     2
#define REDIS_HDR_FIXED   56u
#define REDIS_VERSION_V1  1         /* before check words */
#define REDIS_HDR_FIXED_V1 48u
#define REDIS_KEY_PREFIX  "kvnode"
#define REDIS_PASSWORD_ENV "KVNODE_REDIS_PASSWORD"
#define REDIS_PASSWORD_MAX 512      /* bytes read from password_file, NUL included */

/* The Redis key of (ns, key) in tenant's store (NULL/"": "default");
 * returns the length snprintf would need. */
size_t redis_block_key(const char *tenant, const struct kvs_ns *ns, int64_t key, char *buf,
                       size_t len);
/* Header bytes for a block written now (the tenant's name included). */
size_t redis_header_len(const char *tenant);
/* Write the header of (ns, key, check, payload) into hdr (redis_header_len bytes). */
void redis_header_make(const char *tenant, const struct kvs_ns *ns, int64_t key, uint64_t check,
                       const void *payload, size_t len, uint8_t *hdr);
/* Check a stored value (version 2, or 1: word 0) against what was asked
 * for; 0 when it is that block (payload at value + *payload_at), KVS_MISMATCH
 * when it is but for its check word (another prefix's: keep it), else
 * KVS_CORRUPT with err naming the mismatch. */
int redis_value_check(const char *tenant, const struct kvs_ns *ns, int64_t key, uint64_t check,
                      size_t len, const void *value, size_t vlen, size_t *payload_at, char *err,
                      size_t errlen);
/* The check word in the first hlen bytes of a value (a GETRANGE of its
 * header): 0 and *word set, or KVS_MISS (empty: no such key) or
 * KVS_CORRUPT (not a kvnode header). */
int redis_header_word(const uint8_t *hdr, size_t hlen, uint64_t *word);

/* The password for AUTH: the file's first line when path is set (a missing
 * or unreadable file is an error), else $KVNODE_REDIS_PASSWORD, else "".
 * 0 or -KVNODE_EINVAL with err naming the file (never its contents). */
int redis_password_load(const char *path, char *buf, size_t len, char *err, size_t errlen);

/* The routing counters of a handle opened by kvs_backend_redis (tests). */
struct rcl_counters;
void redis_get_counters(struct kvs_store *s, struct rcl_counters *out);

#endif
