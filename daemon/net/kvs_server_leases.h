/* kvs_server_leases: what the KVS front end's leases are named and counted
 * by (issue 30). Owns
 *  - lease ids: 128 bits from the kernel's random generator, nothing else
 *    in them (no counter, no address), written on the wire as 32 lower-case
 *    hex digits (rtp-llm's client takes lease_id as an opaque string);
 *  - each tenant's count of open leases and its share of [kvs_server]
 *    max_leases: a named tenant's memory's share (at least 1), "default"
 *    what the sections' shares leave, so that the shares add up to the
 *    total and one tenant at its share never leaves another without room;
 *  - the ids of the last KVS_ENDED_KEEP unsealed create leases that ended
 *    at their term, for KVS_ENDED_KEEP_MS, so that a late /seal of one is
 *    told 410 (past its term) rather than 404 — by its own tenant only: to
 *    another tenant it stays as unknown as an id never granted.
 * kvs_server.c keeps the lease table itself. Loop thread only. */
#ifndef KVNODE_KVS_SERVER_LEASES_H
#define KVNODE_KVS_SERVER_LEASES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tenants/tenants.h"

#define KVS_LEASE_ID_HEX 32   /* hex digits of a lease id on the wire */

struct kvs_lease_id {
    uint64_t hi, lo;
};

#define KVS_ENDED_KEEP     1024                /* ended ids remembered, all tenants together */
#define KVS_ENDED_KEEP_MS  (10u * 60u * 1000u)  /* for at most this long (the longest term) */

/* An unsealed create lease that ended at its term. */
struct kvs_ended {
    struct kvs_lease_id id;
    const struct tenant *tenant;   /* compared, never followed (NULL: empty) */
    uint64_t at_ms;
};

/* Random bytes drawn ahead (one getrandom per 256 ids), the open leases
 * of each tenant that has had one, and the leases ended at their term. */
struct kvs_leases {
    uint8_t pool[4096];
    size_t pool_used;              /* bytes of pool already given out */
    struct tenant *tenant[TENANTS_MAX];
    uint32_t open[TENANTS_MAX];    /* open leases of tenant[i] */
    size_t ntenants;
    struct kvs_ended ended[KVS_ENDED_KEEP];   /* a ring, oldest overwritten */
    size_t ended_next;
};

void kvs_leases_init(struct kvs_leases *ls);

/* Whether t may open one more lease: 0, or 503 with msg naming the bound
 * reached (the total [kvs_server] max_leases with open_total leases open,
 * t's share of it, or the kernel's random generator not ready yet). */
int  kvs_leases_room(struct kvs_leases *ls, const struct kvn_config *cfg, struct tenants *ts, struct tenant *t,
                     uint64_t open_total, char *msg, size_t msglen);
/* A new id (after kvs_leases_room said yes) and t's lease opened. */
struct kvs_lease_id kvs_leases_open(struct kvs_leases *ls, struct tenant *t);
/* t's lease ended. */
void kvs_leases_close(struct kvs_leases *ls, struct tenant *t);

/* Lease id of t ended at its term at now_ms (the oldest such id forgotten
 * when KVS_ENDED_KEEP are kept). */
void kvs_leases_note_ended(struct kvs_leases *ls, const struct kvs_lease_id *id, const struct tenant *t,
                           uint64_t now_ms);
/* Whether id is t's lease that ended at its term within KVS_ENDED_KEEP_MS
 * of now_ms (and is still among the ids kept). O(KVS_ENDED_KEEP). */
bool kvs_leases_ended(const struct kvs_leases *ls, const struct kvs_lease_id *id, const struct tenant *t,
                      uint64_t now_ms);

/* id as KVS_LEASE_ID_HEX hex digits and a NUL. */
void kvs_lease_id_format(const struct kvs_lease_id *id, char *out);
/* s (len bytes): exactly KVS_LEASE_ID_HEX hex digits (either case). */
bool kvs_lease_id_parse(const char *s, size_t len, struct kvs_lease_id *out);

static inline bool kvs_lease_id_eq(const struct kvs_lease_id *a, const struct kvs_lease_id *b)
{
    return a->hi == b->hi && a->lo == b->lo;
}

#endif
