/* sdnotify: systemd integration — Type=notify readiness and STATUS lines, reload
 * and stop notifications, the watchdog, and socket activation. Everything is
 * a no-op when the daemon does not run under systemd (NOTIFY_SOCKET,
 * WATCHDOG_USEC or LISTEN_FDS unset), so the daemon behaves the same from a
 * shell.
 *
 * The watchdog pings (WATCHDOG=1, every half interval) only while the loop
 * thread (the ping timer fires on it) and every registered worker
 * (core/liveness.h) prove they are alive.
 *
 * One per process, like NOTIFY_SOCKET itself. Loop thread only. */
#ifndef KVNODE_SDNOTIFY_H
#define KVNODE_SDNOTIFY_H

#include <stdbool.h>
#include <stddef.h>

struct daemon;

/* Descriptors systemd passed (LISTEN_FDS for this pid, told apart by
 * LISTEN_FDNAMES): *fd = the single socket to serve on (socket activation),
 * or -1 when none was passed; the ones whose name starts with
 * SDN_STORED_PREFIX are the daemon's own, from the fd store (a warm
 * restart's, warm.h), given in stored (at most max; more are closed).
 * -1 with err set when systemd passed more than one socket, or LISTEN_FDS
 * is malformed; 0 otherwise. */
#define SDN_STORED_PREFIX "kvnode-warm-"
#define SDN_FDNAME_MAX 64
struct sdn_fd {
    int  fd;
    char name[SDN_FDNAME_MAX];
};
int  sdn_listen_fd(int *fd, struct sdn_fd *stored, size_t max, size_t *nstored, char *err, size_t errlen);
/* Under systemd (NOTIFY_SOCKET set): hand fd to the service's fd store
 * under name (FDSTORE=1, FDNAME=; FileDescriptorStoreMax= in the unit), or
 * remove the stored fds of that name (FDSTOREREMOVE=1). sdn_fdstore: >0
 * sent, 0 not under systemd, <0 -errno. */
bool sdn_under_systemd(void);
int  sdn_fdstore(int fd, const char *name);
void sdn_fdstore_remove(const char *name);

/* Once listeners and arenas are usable: READY=1 with a STATUS line, then
 * a timer refreshing STATUS (when it changed) and, when systemd asked for
 * one, the watchdog timer. 0, or -1 when a timer cannot be created. */
int  sdn_start(struct daemon *d);
/* RELOADING=1 + MONOTONIC_USEC (start of a reload). */
void sdn_reloading(struct daemon *d);
/* READY=1 + STATUS (end of a reload, whatever its outcome). */
void sdn_ready(struct daemon *d);
/* STOPPING=1 (shutdown begins). */
void sdn_stopping(struct daemon *d);
/* Free the timers (before the loop is freed). */
void sdn_stop(void);

/* The human-readable status line, e.g. "serving on /run/kvnode/kvnode.sock:
 * host 1.2 GiB of 4.0 GiB used, 3 clients, 2 namespaces". */
void sdn_status_line(struct daemon *d, char *buf, size_t len);

#endif
