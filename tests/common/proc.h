/* proc: the tests' one way to run a child process. The harness starts the
 * daemon with it (tests/integration/harness.c), simctl.h the simulators,
 * tests run kvnodectl, kvnoded --check-config and helper scripts with it, and
 * test code that must run in another process (as another user, a client that
 * dies holding leases, the soak's workers) runs as its function.
 *
 * Every child dies with the thread that started it (PR_SET_PDEATHSIG), so a
 * failed test leaves none behind. proc_spawn() reports a child that could
 * not be set up or exec'd as its own failure (the reason in proc_error()),
 * not as a later exit status 127. Every wait has a deadline: a child that
 * hangs fails the test instead of stalling it.
 *
 * Statuses are waitpid()'s (WIFEXITED etc. apply); PROC_TIMEOUT when the
 * deadline passed, -1 on an error. Nothing here depends on Check: functions
 * return -1 with a message in proc_error() (thread-local); tests wrap calls
 * with ck_assert. */
#ifndef KVNODE_TESTS_PROC_H
#define KVNODE_TESTS_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define PROC_TIMEOUT          (-2)     /* the child did not exit before the deadline */
#define PROC_EXIT_SIGNAL_BASE 128      /* proc_exit_code(): 128 + signal number when killed */
#define PROC_START_TIMEOUT_MS 10000    /* proc_spawn: the child has this long to exec */
#define PROC_KILL_WAIT_MS     10000    /* how long a SIGKILLed child has to be reaped */

/* Where a child's standard stream goes. */
enum proc_io {
    PROC_INHERIT = 0,   /* the test's own */
    PROC_NULL,          /* /dev/null */
    PROC_FILE,          /* in_path read; out_path / err_path created or truncated (0644) and appended to */
    PROC_PIPE,          /* stdout / stderr only: a pipe whose read end proc_spawn hands back */
    PROC_TO_STDOUT,     /* stderr only: wherever stdout goes */
};

struct proc_opts {
    const char *const *argv;     /* program and arguments (NULL-terminated); argv[0] without a '/'
                                  * is looked up in PATH */
    int (*fn)(void *arg);        /* instead of argv: run fn(arg) in the child, which then exits
                                  * with its result (no exec; every descriptor is kept) */
    void *arg;
    const char *const *env;      /* "NAME=VALUE" entries (NULL-terminated; NULL: none) added to the
                                  * environment, replacing inherited ones */
    const char *const *pid_env;  /* names (NULL-terminated) set to the child's own pid, e.g.
                                  * "WATCHDOG_PID" */
    bool as_user;                /* become uid/gid (real, effective and saved), with the
                                  * supplementary groups below (none by default): needs root */
    uid_t uid;
    gid_t gid;
    const gid_t *groups;         /* with as_user: ngroups supplementary groups (NULL / 0: none) */
    size_t ngroups;
    enum proc_io in, out, err;   /* default PROC_INHERIT */
    const char *in_path, *out_path, *err_path;
    int pass_fd;                 /* with pass_count > 0: pass_fd at descriptor 3 and dups of it at
                                  * 4..2+pass_count, inherited (systemd's LISTEN_FDS) */
    int pass_count;
    bool close_fds;              /* close every other descriptor above 2 before exec */
    unsigned long nofile;        /* > 0: the soft RLIMIT_NOFILE (the hard one stays: valgrind
                                  * refuses changes of it) */
};

/* Read ends of PROC_PIPE streams, -1 for the others. */
struct proc_pipes {
    int out, err;
};

/* Message of the last failed proc call in this thread. */
const char *proc_error(void);

/* Start a child as o describes. Exec'd children start with no signal blocked
 * and SIGPIPE, SIGTERM and SIGINT at their defaults. Returns its pid, or -1
 * (nothing left running) with proc_error() naming what failed: a file that
 * could not be opened, the exec, the identity or limit change. pipes may be
 * NULL when no stream is PROC_PIPE; the caller closes the read ends. */
pid_t proc_spawn(const struct proc_opts *o, struct proc_pipes *pipes);

/* Reap *pid within timeout_ms (0: only look) without signalling it. Returns
 * its wait status and sets *pid to 0; PROC_TIMEOUT while it still runs
 * (*pid kept); -1 on an error (*pid set to 0: there is nothing to wait for). */
int proc_wait(pid_t *pid, int timeout_ms);

/* Send sig to *pid and reap it within timeout_ms; when that passes, SIGKILL
 * and reap (PROC_KILL_WAIT_MS). Returns the wait status, or PROC_TIMEOUT
 * when SIGKILL was needed; -1 when there was no child (*pid <= 0). */
int proc_stop(pid_t *pid, int sig, int timeout_ms);

/* Run a child to its end within timeout_ms: proc_spawn, with stdout into *out
 * and stderr into *err when those are not NULL (malloc'd, NUL-terminated,
 * "" when it printed nothing; what it printed before a timeout too), then
 * proc_wait. Returns the wait status, PROC_TIMEOUT when the deadline passed
 * (the child is killed), -1 when it could not be started (*out, *err NULL). */
int proc_run(const struct proc_opts *o, int timeout_ms, char **out, char **err);

/* Read a starting child's announcement from fd (its stdout pipe) into buf
 * (NUL-terminated) until each of keys (NULL-terminated, e.g. "http=") begins
 * a whole line. 0, or -1 when it exits first, the deadline passes or buf
 * fills up. */
int proc_read_announce(int fd, const char *const *keys, char *buf, size_t cap, int timeout_ms);

/* A wait status as one number: the exit code, PROC_EXIT_SIGNAL_BASE + the
 * signal when killed; negative values (PROC_TIMEOUT, -1) as they are. */
int proc_exit_code(int status);

#endif
