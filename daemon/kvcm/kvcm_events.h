/* kvcm_events: the loop side of the KVCM publisher. Owns the caches' block
 * observers, the resync walk the publisher asks for (which cache it is in,
 * the buffer it fills) and the timer that refreshes the node status the
 * heartbeat reports; hands all of it to kvcm_shared (events into the
 * bounded queue, a walk's result, the status) and never sees the threads.
 * Loop thread only. */
#ifndef KVNODE_KVCM_EVENTS_H
#define KVNODE_KVCM_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "kvcm/kvcm_shared.h"
#include "kvcm/kvcm_types.h"

struct event_base;
struct cache;
struct kvcm_events;

/* The loop events on base for n caches (at most KVCM_MAX_CACHES): walk
 * requests on s's eventfd, and the status callback every interval_ms (run
 * once now). -1 when they cannot be made. */
int  kvcm_events_create(struct event_base *base, struct kvcm_shared *s, struct cache *const *caches,
                        size_t n, uint32_t interval_ms, kvcm_status_fn status, void *status_arg,
                        struct kvcm_events **out);
/* The caches' block observers on ... */
void kvcm_events_attach(struct kvcm_events *e);
/* ... and off, a walk in progress cancelled. */
void kvcm_events_detach(struct kvcm_events *e);
void kvcm_events_destroy(struct kvcm_events *e);

#endif
