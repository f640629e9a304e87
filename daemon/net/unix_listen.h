/* unix_listen: a listening unix stream socket at a path for the daemon's
 * side doors (admin and KVS HTTP on unix:PATH, the KVS data plane): a stale
 * socket file left by a dead process is replaced, a live listener or a file
 * that is not a socket never is. (The engine socket adds a lock file and a
 * group: net/server.c.) */
#ifndef KVNODE_UNIX_LISTEN_H
#define KVNODE_UNIX_LISTEN_H

#include <stddef.h>

/* Bind path (mode, listen backlog; non-blocking, close-on-exec). what names
 * the option in errors ("admin listen unix:/run/a.sock"). The listening fd,
 * or -1 with err set. The caller unlinks path when done. */
int unix_listen(const char *path, unsigned mode, int backlog, const char *what, char *err, size_t errlen);

#endif
