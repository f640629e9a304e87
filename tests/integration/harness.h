/* harness: run a real kvnoded for integration tests and the benchmark.
 *
 * kvh_start() creates a fresh temporary directory, writes a configuration
 * into it (socket at <dir>/kvnode.sock unless the caller overrides
 * server.socket_path), starts $KVNODED (default "build/kvnoded") with its
 * stderr in <dir>/kvnoded.log, and waits (10 s deadline) until the socket
 * accepts connections. kvh_stop() sends SIGTERM and reaps the daemon within a
 * deadline (SIGKILL after it) and reports how it ended; kvh_destroy() also
 * removes the directory. Daemons still running when the process exits are
 * killed (their log is printed) and their directories removed, so a failed
 * test leaves nothing behind: all daemon directories live under one root
 * directory made at program start (before Check forks a process per test);
 * daemons die with the process that started them (PR_SET_PDEATHSIG), and
 * when the program exits it prints the log of every daemon directory a
 * failed test left and removes the root.
 *
 * The daemon, and every other child a test runs, is started through
 * tests/common/proc.h (included here), the tests' one launcher.
 *
 * Every wait here has a deadline. Functions return 0 / a value >= 0 on
 * success and -1 on failure with a message in kvh_error() (thread-local).
 * Nothing here depends on Check; tests wrap calls with ck_assert. */
#ifndef KVNODE_TEST_HARNESS_H
#define KVNODE_TEST_HARNESS_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#include <jansson.h>

#include "kvnode.h"

#include "../common/proc.h"

#define KVH_READY_TIMEOUT_MS 10000
#define KVH_STOP_TIMEOUT_MS  10000

/* Exit status codes reported by kvh_stop / kvh_wait_exit besides 0..255. */
#define KVH_EXIT_SIGNAL_BASE PROC_EXIT_SIGNAL_BASE   /* 128 + signal number when killed */
#define KVH_EXIT_TIMEOUT     (-2)     /* did not exit before the deadline */

typedef struct kvh_daemon {
    char  dir[PATH_MAX];     /* private temporary directory */
    char  sock[PATH_MAX];    /* socket path the daemon listens on */
    char  conf[PATH_MAX];    /* generated configuration file */
    char  log[PATH_MAX];     /* daemon's stderr */
    pid_t pid;               /* > 0 while running (not yet reaped) */
    int   status;            /* how it ended: exit code, 128+signal, KVH_EXIT_TIMEOUT; -1 unknown */
    int   reg;               /* private: slot in the harness's exit-cleanup table, -1 none */
} kvh_daemon;

/* Message of the last failed harness call in this thread. */
const char *kvh_error(void);

/* A client process that dies holding leases: hold(d, msg, len) runs in a
 * forked child (killed with the test process, PR_SET_PDEATHSIG); it takes
 * its leases and returns 0 to report them held (the child then waits to be
 * killed), or -1 with msg set. The parent waits up to 10 s for the report.
 * The child's pid, or -1 with kvh_error() set (the child is reaped). */
typedef int (*kvh_hold_fn)(const kvh_daemon *d, char *msg, size_t len);
pid_t kvh_spawn_holder(const kvh_daemon *d, kvh_hold_fn hold);

/* Path of the daemon binary ($KVNODED or "build/kvnoded"). */
const char *kvh_daemon_path(void);

/* Start a daemon. `config` holds "section.key=value" lines
 * ("tenant.NAME.key=value" for a [tenant.NAME] section) separated by
 * newlines (blank lines and lines starting with '#' or ';' are ignored); they
 * override the harness defaults (a small host tier, pin_host=off, log level
 * info, admin.listen=off: tests opt in to an admin listener). kvh_start waits until the socket is connectable; on failure the
 * daemon is killed, its log is printed to stderr and -1 is returned.
 * The daemon gets SIGKILL when the calling *thread* exits
 * (PR_SET_PDEATHSIG): start daemons from a thread that outlives them. */
int  kvh_start(kvh_daemon *d, const char *config);
/* Rewrite d's configuration file (same defaults + `config`), e.g. before a
 * reload. The daemon is not told. */
int  kvh_rewrite_config(kvh_daemon *d, const char *config);
/* Same without waiting for the socket (for daemons expected to fail). */
int  kvh_spawn(kvh_daemon *d, const char *config);
/* Extra process setup for kvh_spawn_ex / kvh_start_ex (systemd tests,
 * descriptor limits). */
typedef struct kvh_spawn_opts {
    const char *const *env;      /* "NAME=VALUE" entries (NULL-terminated; NULL: none) added to
                                  * the daemon's environment, replacing inherited ones */
    const char *const *pid_env;  /* names (NULL-terminated) set to the daemon's own pid, in the
                                  * child after fork, e.g. "WATCHDOG_PID" */
    int listen_fds;              /* > 0: socket activation. The harness binds and listens on
                                  * d->sock itself and passes that socket at fd 3 (and dups of it
                                  * at 4.. when > 1) with LISTEN_FDS=<n> LISTEN_PID=<daemon pid> */
    unsigned long nofile;        /* > 0: the daemon's soft RLIMIT_NOFILE (set in the
                                  * child before exec), e.g. to run it out of descriptors */
} kvh_spawn_opts;
/* kvh_spawn / kvh_start with opts (NULL: same as without). */
int  kvh_spawn_ex(kvh_daemon *d, const char *config, const kvh_spawn_opts *opts);
int  kvh_start_ex(kvh_daemon *d, const char *config, const kvh_spawn_opts *opts);
/* Wait until d's socket accepts a connection (or the daemon exits). */
int  kvh_wait_ready(kvh_daemon *d, int timeout_ms);
/* Reap the daemon within timeout_ms without signalling it; returns its
 * status (see kvh_daemon.status) or KVH_EXIT_TIMEOUT (then it is still running). */
int  kvh_wait_exit(kvh_daemon *d, int timeout_ms);
/* SIGTERM, wait up to timeout_ms (<= 0: KVH_STOP_TIMEOUT_MS), then SIGKILL.
 * Returns the status: 0 for a graceful stop, KVH_EXIT_TIMEOUT when SIGKILL
 * was needed. Prints the log when the status is not 0. */
int  kvh_stop(kvh_daemon *d, int timeout_ms);
/* Send sig and reap (SIGKILL: simulate a crash). Returns the status. */
int  kvh_kill(kvh_daemon *d, int sig);
/* Stop (if running) and remove the directory. */
void kvh_destroy(kvh_daemon *d);
/* Print the daemon's log to stderr with a heading. */
void kvh_print_log(const kvh_daemon *d, const char *why);
/* Read the whole log into a malloc()ed string (NULL on error). */
char *kvh_read_log(const kvh_daemon *d);
/* Make a fresh empty directory (its path into buf) under the harness's
 * root, so it is removed with everything in it when the program exits: e.g.
 * a persistent store that outlives one daemon. 0, or -1 with kvh_error(). */
int  kvh_mkdtemp(char *buf, size_t len);
/* Read a whole file into a malloc()ed buffer with a '\0' after its *len
 * bytes (len may be NULL). NULL with kvh_error() set on error. */
char *kvh_read_file(const char *path, size_t *len);

/* --- layouts and block contents ------------------------------------------ */

/* A layout with fixed shape fields (bf16, 16 tokens, 4 layers, 8 heads, 128
 * dim) and the given model / block size / TP. Strings are not copied. */
kvnode_layout kvh_layout(const char *model, uint64_t block_bytes, uint32_t tp_size, uint32_t tp_rank);

/* Connect a client bound to layout (NULL: observer). Returns 0 or the
 * negative kvnode_connect code with kvh_error() set. */
int  kvh_connect(const kvh_daemon *d, const kvnode_layout *layout, kvnode_client **out);

/* Deterministic content of a block from (key, seed). */
void kvh_fill(void *buf, size_t len, kvnode_key key, uint64_t seed);
/* 0 when buf holds exactly kvh_fill(key, seed); otherwise -1 and
 * kvh_error() names the first differing byte offset. */
int  kvh_verify(const void *buf, size_t len, kvnode_key key, uint64_t seed);
/* A chain of n distinct keys derived from `chain` (keys[i] = f(chain, i)). */
void kvh_chain(kvnode_key *keys, size_t n, uint64_t chain);

/* Copying helpers over a client's namespace (block size kvnode_block_bytes).
 * They return 0, a negative KVNODE_E* code from the library, or
 * KVH_MISMATCH when a block read back differs; kvh_error() explains. */
#define KVH_MISMATCH 1
/* kvnode_put of blocks kvh_fill(keys[i], seed). */
int  kvh_put(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed);
/* kvnode_put_inline of the same. */
int  kvh_put_inline(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed);
/* kvnode_get (inline != 0: kvnode_get_inline) and verify the *got blocks. */
int  kvh_get_verify(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed, int inline_,
                    size_t *got);
/* get_begin, verify the *got blocks in place, get_end. */
int  kvh_get_zc_verify(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed, size_t *got);
/* kvnode_match; returns the matched count or a negative code. */
long kvh_match(kvnode_client *c, const kvnode_key *keys, size_t n);

/* --- stats ------------------------------------------------------------------ */

/* The daemon's stats (observer connection opened and closed here). */
/* Offset of p in this process's mapping of the daemon's host memfd (from
 * /proc/self/maps); UINT64_MAX when p is in none. */
uint64_t kvh_host_offset(const void *p);
json_t *kvh_stats(const kvh_daemon *d);
/* Same over an existing client. */
json_t *kvh_stats_client(kvnode_client *c);
/* Value at a dotted path ("tiers.host.blocks", "namespaces.0.id"), or NULL. */
json_t *kvh_json_get(json_t *root, const char *path);
/* Integer at path (real numbers are truncated); -1 with kvh_error() set
 * when missing or not a number. */
long long kvh_json_int(json_t *root, const char *path);
/* Integer at path, or dflt when the path is absent (e.g. "requests.<op>"
 * entries appear only once that op was used); -1 when present but not a number. */
long long kvh_json_int_or(json_t *root, const char *path, long long dflt);
/* Fetch stats and return one integer; -1 on any failure. */
long long kvh_stat(const kvh_daemon *d, const char *path);
/* Poll the stat until it equals want (every 10 ms, up to timeout_ms).
 * Returns 0, or -1 with the last value in *last (if not NULL). */
int  kvh_wait_stat(const kvh_daemon *d, const char *path, long long want, int timeout_ms,
                   long long *last);
/* The namespace object of `model` with tp_rank (NULL when absent); the
 * returned reference belongs to root. */
json_t *kvh_stats_namespace(json_t *root, const char *model, uint32_t tp_rank);

/* --- raw socket ------------------------------------------------------------- */

/* Connect to the socket without libkvnode (blocking fd, close-on-exec). */
int  kvh_raw_connect(const char *sock_path);
/* Send all bytes (MSG_NOSIGNAL). 0, or -1 (e.g. EPIPE when the peer closed). */
int  kvh_raw_send(int fd, const void *buf, size_t len);
/* Send a 4-byte little-endian length followed by payload. */
int  kvh_raw_send_frame(int fd, const void *payload, uint32_t len);
/* Receive one frame within timeout_ms: 1 and a malloc()ed *payload (any fds
 * passed with it are closed), 0 on orderly EOF before a header, -1 on error,
 * timeout or a frame longer than max_len. */
int  kvh_raw_recv_frame(int fd, uint8_t **payload, uint32_t *len, uint32_t max_len, int timeout_ms);
/* Wait until the peer closes (read returns 0 or ECONNRESET), discarding
 * data. 0 when closed, -1 on timeout. */
int  kvh_raw_wait_eof(int fd, int timeout_ms);

/* --- the daemon process ------------------------------------------------------ */

/* A "Field:   N kB" line of /proc/<pid>/status (e.g. "VmRSS", "RssAnon") in
 * KiB; -1 with kvh_error() set when it cannot be read. */
long long kvh_proc_status_kib(pid_t pid, const char *field);
/* CPU time the process has used (utime + stime of /proc/<pid>/stat), in
 * clock ticks (sysconf(_SC_CLK_TCK) per second); -1 with kvh_error() set. */
long long kvh_proc_cpu_ticks(pid_t pid);

/* --- time ------------------------------------------------------------------- */

uint64_t kvh_now_ms(void);
uint64_t kvh_now_ns(void);
void     kvh_sleep_ms(unsigned ms);

/* --- Check conveniences (only when check.h was included first) ------------- */
#ifdef CHECK_H
#define KVH_START(d, config) \
    ck_assert_msg(kvh_start((d), (config)) == 0, "kvnoded did not start: %s", kvh_error())
#define KVH_STOP_OK(d) do { \
        int kvh_st_ = kvh_stop((d), 0); \
        ck_assert_msg(kvh_st_ == 0, "kvnoded did not stop gracefully: status %d (see log above)", kvh_st_); \
    } while (0)
/* End of a test: the daemon stops gracefully, then its directory is removed. */
#define KVH_STOP_DESTROY(d) do { \
        KVH_STOP_OK(d); \
        kvh_destroy(d); \
    } while (0)
#define KVH_CONNECT(d, layout, cp) do { \
        int kvh_rc_ = kvh_connect((d), (layout), (cp)); \
        ck_assert_msg(kvh_rc_ == 0, "connect: %s", kvh_error()); \
    } while (0)
/* Assert a libkvnode call returned 0, naming the daemon's message. */
#define KVH_OK(c, call) do { \
        int kvh_rc_ = (call); \
        ck_assert_msg(kvh_rc_ == 0, "%s -> %d (%s): %s", #call, kvh_rc_, \
                      kvnode_strerror(kvh_rc_), kvnode_last_error(c)); \
    } while (0)
#define KVH_STAT(d, path) ({ \
        long long kvh_v_ = kvh_stat((d), (path)); \
        ck_assert_msg(kvh_v_ >= 0, "stat %s: %s", (path), kvh_error()); \
        kvh_v_; })

/* kvh_put, asserting it succeeded. */
#define KVH_PUT_OK(c, keys, n, seed) do { \
        int kvh_rc_ = kvh_put((c), (keys), (n), (seed)); \
        ck_assert_msg(kvh_rc_ == 0, "put: %s", kvh_error()); \
    } while (0)
/* GET keys[0..n) and verify the bytes of what came (kvh_get_verify, not
 * inline), asserting the call succeeded: how many came. */
#define KVH_GET_VERIFIED(c, keys, n, seed) ({ \
        size_t kvh_got_ = 0; \
        int kvh_rc_ = kvh_get_verify((c), (keys), (n), (seed), 0, &kvh_got_); \
        ck_assert_msg(kvh_rc_ == 0, "get: %s", kvh_error()); \
        kvh_got_; })
/* kvnode_match_tiers, asserting it succeeded and its figures add up. */
#define KVH_TIERS(c, keys, n) ({ \
        kvnode_tiers kvh_t_; \
        memset(&kvh_t_, 0xff, sizeof kvh_t_); \
        KVH_OK((c), kvnode_match_tiers((c), (keys), (n), &kvh_t_)); \
        ck_assert_msg(kvh_t_.matched == kvh_t_.hbm + kvh_t_.host + kvh_t_.store && kvh_t_.matched <= (n), \
                      "match_tiers: matched %zu = hbm %zu + host %zu + store %zu?", kvh_t_.matched, \
                      kvh_t_.hbm, kvh_t_.host, kvh_t_.store); \
        kvh_t_; })

/* A test program's main(): one suite `suite` holding one test case `tcase`
 * (timeout_s seconds per test) with the n tests (START_TEST names), run with
 * CK_NORMAL output. Returns EXIT_SUCCESS when none failed, else EXIT_FAILURE. */
static inline int kvh_run_suite(const char *suite, const char *tcase, double timeout_s,
                                const TTest *const tests[], size_t n)
{
    Suite *s = suite_create(suite);
    TCase *tc = tcase_create(tcase);
    tcase_set_timeout(tc, timeout_s);
    for (size_t i = 0; i < n; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
#endif

#endif
