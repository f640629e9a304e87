/* kvcm_publisher: the publisher thread (see kvcm_publisher.c): registers
 * each deployment, sends snapshots and coalesced ADD/DELETE batches of what
 * the loop queued in kvcm_shared. Owns its thread and what only it touches
 * (its batch, the events waiting for a walk, its backoff). Started and
 * ended by kvcm.c; stop it with kvcm_shared_stop before joining. */
#ifndef KVNODE_KVCM_PUBLISHER_H
#define KVNODE_KVCM_PUBLISHER_H

#include "kvcm/kvcm_shared.h"

struct kvcm_publisher;

/* Its buffers (batch_events, queue_events of s's settings); -1: no memory. */
int  kvcm_publisher_create(struct kvcm_shared *s, struct kvcm_publisher **out);
/* The thread; -1 when it cannot start. */
int  kvcm_publisher_start(struct kvcm_publisher *p);
/* Wait for the thread to end (after kvcm_shared_stop). */
void kvcm_publisher_join(struct kvcm_publisher *p);
void kvcm_publisher_destroy(struct kvcm_publisher *p);

#endif
