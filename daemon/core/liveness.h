/* liveness: the liveness registry of the daemon's threads besides the loop
 * (store workers, copiers, the KVCM query worker). Each worker registers under a name and
 * calls liveness_heartbeat() from its own thread whenever it makes progress or
 * wakes up idle (at least every few seconds); liveness_check() tells whether
 * every registered worker beat recently. The systemd watchdog pings only
 * while it does, and /readyz reports not-ready when it does not.
 *
 * Every function is thread-safe. A handle is valid from liveness_register()
 * until liveness_unregister(); a worker that dies without unregistering simply
 * stops beating and is reported as stalled. */
#ifndef KVNODE_LIVENESS_H
#define KVNODE_LIVENESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every worker of every tenant's store (up to 17 x (32 + 1)), the copiers,
 * the pinning threads and the query worker. */
#define LIVENESS_MAX      640
#define LIVENESS_NAME_MAX  32   /* bytes, with the terminating NUL; longer names are cut */
/* A worker silent for longer than [server] worker_stall_timeout (at least 2 s)
 * is stalled (systemd watchdog, /readyz): beat at least every second, idle or
 * not. */

struct liveness_entry;

/* Register a worker (its heartbeat starts at now). NULL when the table is
 * full or name is NULL/empty. */
struct liveness_entry *liveness_register(const char *name);
/* Record that the worker is alive (CLOCK_MONOTONIC now). Any thread, lock-free. */
void liveness_heartbeat(struct liveness_entry *w);
/* Forget the worker (NULL is ignored). The handle is invalid afterwards. */
void liveness_unregister(struct liveness_entry *w);

/* true when every registered worker beat within max_age_ms of now_ms
 * (liveness_now_ms() clock). Otherwise false, and the stalled workers' names,
 * comma-separated (cut to fit), go to stalled (when not NULL and len > 0;
 * "" when all are alive). */
bool liveness_check(uint64_t now_ms, uint64_t max_age_ms, char *stalled, size_t len);

/* One registered worker, for metrics. */
struct liveness_info {
    char     name[LIVENESS_NAME_MAX];
    uint64_t age_ms;          /* since its last heartbeat */
};
/* Copy up to max workers into out; returns how many are registered. */
size_t liveness_snapshot(uint64_t now_ms, struct liveness_info *out, size_t max);

/* The clock heartbeats use (CLOCK_MONOTONIC, milliseconds). */
uint64_t liveness_now_ms(void);

#endif
