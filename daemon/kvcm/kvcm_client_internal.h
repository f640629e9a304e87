/* kvcm_client_internal: what the two pieces of the KVCM client share.
 * Private to them; everything else goes through kvcm_client.h.
 *
 *   kvcm_client.c      the client object and its cancel flag, statuses,
 *                      results, the HTTP POST, leader discovery, and one RPC
 *                      with leader handling under one deadline (kvcm_call)
 *   kvcm_client_rpc.c  the RPCs (registerInstance, reportEvent,
 *                      getHostCacheState) and the EventItem builders
 *
 * A client is used by one thread at a time (see kvcm_client.h). */
#ifndef KVNODE_KVCM_CLIENT_INTERNAL_H
#define KVNODE_KVCM_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "kvcm/kvcm_client.h"

/* A non-negative int64/uint64 as the protobuf JSON mapping sends it: a decimal string or a
 * JSON integer. *out untouched on failure. */
bool kvcm_json_u64(json_t *v, uint64_t *out);

/* r zeroed, status KVCM_TRANSPORT: what a call says until it has an answer. */
void kvcm_result_reset(struct kvcm_result *r);
/* r->status = status, r->message from fmt. */
void kvcm_result_fail(struct kvcm_result *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One RPC with leader handling; returns the reply (any status) or NULL (r says why). */
json_t *kvcm_call(struct kvcm_client *c, const char *rpc, json_t *doc, uint32_t timeout_ms,
                  struct kvcm_result *r);

#endif
