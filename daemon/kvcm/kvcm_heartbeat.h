/* kvcm_heartbeat: the heartbeat thread (see kvcm_heartbeat.c). Owns its
 * thread and its kvcm_client; what it reports and learns goes through
 * kvcm_shared. Started and ended by kvcm.c; stop it with kvcm_shared_stop
 * before joining. */
#ifndef KVNODE_KVCM_HEARTBEAT_H
#define KVNODE_KVCM_HEARTBEAT_H

#include "kvcm/kvcm_shared.h"

struct kvcm_heartbeat;

/* The thread; -1 when it cannot start (no memory, no thread). */
int  kvcm_heartbeat_start(struct kvcm_shared *s, struct kvcm_heartbeat **out);
/* Wait for the thread to end (after kvcm_shared_stop) and free it. NULL: nothing. */
void kvcm_heartbeat_join(struct kvcm_heartbeat *h);

#endif
