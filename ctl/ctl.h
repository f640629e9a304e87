/* kvnodectl's private header: what the files of ctl/ share. kvnodectl talks to
 * kvnoded through the public client API (lib/kvnode.h) only; see kvnodectl(1).
 *
 *   kvnodectl.c  options, --help, argument order, the command table, main()
 *   util.c       allocation, error reports, the connection to the daemon, its
 *                stats document, JSON output
 *   status.c     status, stats, namespaces: rendering the stats document
 *                (JSON field readers, aligned tables, byte and time formats)
 *   admin.c      ping, reload (engine socket), metrics (admin HTTP, libcurl)
 *   data.c       match, delete, put, get: the data commands and their keys
 *
 * Single-threaded; each command owns what it allocates until it returns. */
#ifndef KVNODE_CTL_H
#define KVNODE_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kvnode.h"

#define PROG "kvnodectl"

/* Exit statuses, as kvnodectl(1) lists them. */
enum {
    EXIT_OK = 0,
    EXIT_ERR = 1,       /* daemon, library or local I/O error */
    EXIT_USAGE = 2,
    EXIT_PARTIAL = 3,   /* get/match (--require-all) found fewer keys than asked */
    EXIT_CONNECT = 4,
};

/* Which command-specific options were given (global ones are not tracked). */
enum {
    F_LAYOUT      = 1u << 0,
    F_KEYS_FILE   = 1u << 1,
    F_KEYS_OUT    = 1u << 2,
    F_OUTPUT      = 1u << 3,
    F_SIZE        = 1u << 4,
    F_REQUIRE_ALL = 1u << 5,
    F_INLINE      = 1u << 6,
    F_ADMIN       = 1u << 7,
};

/* What main() parsed from the command line; the commands only read it. */
struct ctl {
    const char *socket;
    int json;
    int timeout_ms;              /* 0: library default / KVNODE_TIMEOUT_MS */
    unsigned given;              /* F_* */
    const char *given_name[8];   /* option spelling per F_* bit, for messages */
    kvnode_layout layout;
    const char *revision;        /* --revision: the model revision (NULL: none) */
    const char *keys_file, *keys_out, *output;
    uint64_t size;
    int require_all, use_inline;
    const char *admin;           /* metrics: admin address (else from stats) */
};

/* util.c */
void oom(void) __attribute__((noreturn));
void *xreallocarray(void *p, size_t n, size_t size);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints the message and the --help hint; returns EXIT_USAGE. */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "what: strerror(errno)"; returns EXIT_ERR. */
int io_error(const char *what);
/* A failed call on a connected client; returns EXIT_ERR. */
int lib_error(int rc, const kvnode_client *c);
/* layout NULL: an observer connection. reader: the commands that only read
 * (match, get) connect as readers (KVNODE_CONNECT_READER: memory lent
 * read-only). Returns an exit code; *c NULL on failure. */
int ctl_connect(const struct ctl *x, const kvnode_layout *layout, bool reader, kvnode_client **c);
/* The stats document (a JSON object) of an observer connection. Returns an exit code. */
int fetch_stats(const struct ctl *x, json_t **doc);
int print_json(json_t *doc, size_t flags);

/* status.c */
int cmd_status(const struct ctl *x);
int cmd_stats(const struct ctl *x);
int cmd_namespaces(const struct ctl *x);

/* admin.c */
int cmd_ping(const struct ctl *x);
int cmd_reload(const struct ctl *x);
int cmd_purge(const struct ctl *x, char **args, int nargs);
int cmd_metrics(const struct ctl *x);

/* data.c: args are the operands after the command (keys, or put's FILE). */
int cmd_match(const struct ctl *x, char **args, int nargs);
int cmd_delete(const struct ctl *x, char **args, int nargs);
int cmd_put(const struct ctl *x, char **args, int nargs);
int cmd_get(const struct ctl *x, char **args, int nargs);

#endif
