/* takeover: warm restarts without systemd (`kvnoded --takeover SOCKET`).
 *
 * Every daemon listens on a control socket beside its engine socket,
 * <engine socket>.takeover (mode 0600). A peer whose SO_PEERCRED uid is the
 * daemon's effective uid or root may send "TAKEOVER 1\n": the daemon answers
 * "OK\n", stops as on SIGTERM and, at the end of its clean stop, sends
 * "FDS <n>\n" and n names, one a line, with the n descriptors of its
 * hand-over (warm_build: the snapshot and each tenant's host memfd) as
 * SCM_RIGHTS on the same connection, which it keeps open until it exits.
 * Anyone else gets "ERR <reason>\n" and the daemon goes on as it was.
 *
 * The new daemon (takeover_request) connects, asks, waits for the
 * descriptors and then for the end of the connection (the old process has
 * exited: its engine socket path and store are free), and starts with them.
 *
 * Loop thread (main) only. */
#ifndef KVNODE_TAKEOVER_H
#define KVNODE_TAKEOVER_H

#include <stdbool.h>
#include <stddef.h>

#include "sdnotify.h"

struct event_base;
struct kvn_config;
struct tenants;
struct takeover;

#define TAKEOVER_SUFFIX ".takeover"

/* The running daemon's side: the control socket at engine_path +
 * TAKEOVER_SUFFIX; begin_stop(arg) runs on the loop when a peer is admitted.
 * 0, or -1 with err set. */
int  takeover_listen(struct event_base *base, const char *engine_path, void (*begin_stop)(void *arg), void *arg,
                     struct takeover **out, char *err, size_t errlen);
/* At the end of a clean stop: when a peer asked, the hand-over goes to it
 * (true, whatever it held: nothing when warm_build had nothing); false: no
 * peer (the caller may hand over to systemd). The listener is closed. */
bool takeover_handover(struct takeover *tk, struct tenants *ts, const struct kvn_config *cfg);
/* Closes the listener (its path unlinked), before the loop is freed; the
 * peer's connection is left for the process's exit to close, which is how
 * the new daemon learns the old one is gone. NULL ok. */
void takeover_destroy(struct takeover *tk);

/* The new daemon's side, before anything is created: ask the daemon on
 * engine_path to stop and hand over; wait for its descriptors (at most
 * stop_ms) and for it to exit. 0 with fds/n set (n may be 0: it had nothing
 * to hand over); -1 with err when the request was refused or failed before
 * the old daemon began to stop (it is still running then). */
int  takeover_request(const char *engine_path, unsigned stop_ms, struct sdn_fd *fds, size_t max, size_t *n,
                      char *err, size_t errlen);

#endif
