/* Header-only helper for Check tests that drive the KVS protocol simulator
 * (tests/sim/kvs_sim.c) as a child process: tests/sim/test_kvs_sim.c and
 * tests/unit/test_kvs_v6d.c.
 *
 * simctl_start() makes a fresh mkdtemp() directory under $TMPDIR (unless told
 * to keep the one from an earlier start), runs $KVS_SIM (default
 * build/kvs-sim) with --http and --socket plus any extra arguments, optionally
 * under valgrind, and reads its "http=" / "socket=" announcement with a
 * deadline. simctl_stop() sends SIGTERM (or SIGKILL), reaps it with a
 * deadline and removes the socket and, unless kept, the directory.
 * simctl_stop_ok() requires a clean exit 0 on SIGTERM. simctl_spawn() is the
 * launcher both simulators' helpers use (kvcmctl.h too), on top of
 * tests/common/proc.h, the tests' one way to run a child; simctl_state()
 * asks through kvh_http.h, the tests' one libcurl helper.
 *
 * Everything is static inline; failures are Check assertions. */
#ifndef KVNODE_TESTS_SIMCTL_H
#define KVNODE_TESTS_SIMCTL_H

#include <check.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "../common/kvh_http.h"   /* the one HTTP request helper */
#include "../common/proc.h"       /* the one child-process launcher */

/* How long the simulator has to announce itself, and to exit once signalled. */
#define SIMCTL_DEADLINE_MS 20000u

struct simctl {
    pid_t pid;
    char  dir[64];
    char  sock[96];           /* fits sockaddr_un.sun_path */
    char  http[64];           /* HOST:PORT as announced */
    char  base[128];          /* http://HOST:PORT */
};

struct simctl_opts {
    const char        *dir_prefix; /* mkdtemp name under $TMPDIR; NULL: "kvs-sim-test" */
    const char        *http_addr;  /* --http value; NULL: 127.0.0.1:0 (ephemeral) */
    bool               keep_dir;   /* reuse s->dir and s->sock from an earlier start */
    bool               valgrind;   /* run the simulator under valgrind (errors -> exit 99) */
    const char *const *extra;      /* NULL-terminated extra arguments, or NULL */
};

static inline uint64_t simctl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void simctl_sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* VALGRIND=1 in the environment. */
static inline bool simctl_under_valgrind(void)
{
    const char *v = getenv("VALGRIND");
    return v && strcmp(v, "1") == 0;
}

/* mkdtemp() "$TMPDIR/<prefix>.XXXXXX" into dir (a short $TMPDIR only, so that
 * socket paths inside still fit sun_path; else /tmp). */
static inline void simctl_mkdtemp(char *dir, size_t size, const char *prefix)
{
    const char *tmp = getenv("TMPDIR");
    int w = snprintf(dir, size, "%s/%s.XXXXXX",
                     tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp", prefix);
    ck_assert(w > 0 && (size_t)w < size);
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
}

/* The tests' one launcher of a simulator: runs argv (under valgrind when
 * asked; errors or definite leaks make it exit 99) through proc_spawn (a
 * child that dies with the test), its stdout on a pipe, and reads that until
 * each of the announce keys (e.g. "http=") has a whole line or the deadline
 * passes. Returns the pid; what it printed, NUL-terminated, is in out.
 * Shared with kvcmctl.h. */
static inline pid_t simctl_spawn(const char *const *argv, bool valgrind, const char *const *announce, char *out,
                                 size_t cap, const char *what)
{
    const char *full[64];
    int n = 0;
    if (valgrind) {
        static const char *const vg[] = { "valgrind", "-q", "--error-exitcode=99", "--leak-check=full",
                                          "--errors-for-leak-kinds=definite,indirect",
                                          "--show-leak-kinds=definite,indirect" };
        for (size_t i = 0; i < sizeof vg / sizeof vg[0]; i++)
            full[n++] = vg[i];
    }
    for (const char *const *a = argv; *a && n < 63; a++)
        full[n++] = *a;
    full[n] = NULL;

    struct proc_pipes pipes;
    pid_t pid = proc_spawn(&(struct proc_opts){ .argv = full, .out = PROC_PIPE }, &pipes);
    ck_assert_msg(pid > 0, "%s: %s", what, proc_error());
    int rc = proc_read_announce(pipes.out, announce, out, cap, (int)SIMCTL_DEADLINE_MS);
    close(pipes.out);
    ck_assert_msg(rc == 0, "%s (%s) %s", what, argv[0], proc_error());
    return pid;
}

/* The value of "key=VALUE\n" in an announcement, into buf. */
static inline void simctl_announced(const char *out, const char *key, char *buf, size_t len)
{
    const char *at = strstr(out, key);
    ck_assert_msg(at, "no %s in the announcement", key);
    at += strlen(key);
    snprintf(buf, len, "%.*s", (int)strcspn(at, "\n"), at);
}

static inline void simctl_start(struct simctl *s, const struct simctl_opts *o)
{
    static const struct simctl_opts defaults = { 0 };
    if (!o)
        o = &defaults;
    if (!o->keep_dir) {
        memset(s, 0, sizeof *s);
        simctl_mkdtemp(s->dir, sizeof s->dir, o->dir_prefix ? o->dir_prefix : "kvs-sim-test");
        snprintf(s->sock, sizeof s->sock, "%s/kvs.sock", s->dir);
    }

    const char *bin = getenv("KVS_SIM");
    if (!bin || !*bin)
        bin = "build/kvs-sim";
    const char *argv[40];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--http";
    argv[n++] = o->http_addr ? o->http_addr : "127.0.0.1:0";
    argv[n++] = "--socket";
    argv[n++] = s->sock;
    for (const char *const *e = o->extra; e && *e && n < 38; e++)
        argv[n++] = *e;
    argv[n] = NULL;

    static const char *const announce[] = { "http=", "socket=", NULL };
    char out[1024], sock[sizeof s->sock + 8];
    s->pid = simctl_spawn(argv, o->valgrind, announce, out, sizeof out, "simulator");
    simctl_announced(out, "http=", s->http, sizeof s->http);
    snprintf(s->base, sizeof s->base, "http://%s", s->http);
    simctl_announced(out, "socket=", sock, sizeof sock);
    ck_assert_str_eq(sock, s->sock);
}

/* Signal the child *pid (SIGTERM, or SIGKILL when hard) and reap it; *pid
 * becomes 0. Returns the wait status, -1 when it had to be killed after the
 * deadline or was not running. Shared with kvcmctl.h. */
static inline int simctl_reap_pid(pid_t *pid, bool hard)
{
    if (*pid <= 0)
        return -1;
    int st = proc_stop(pid, hard ? SIGKILL : SIGTERM, (int)SIMCTL_DEADLINE_MS);
    *pid = 0;
    return st < 0 ? -1 : st;
}

static inline int simctl_reap(struct simctl *s, bool hard)
{
    return simctl_reap_pid(&s->pid, hard);
}

/* simctl_reap, then remove the socket, and the directory unless keep_dir. */
static inline int simctl_stop(struct simctl *s, bool hard, bool keep_dir)
{
    int st = simctl_reap(s, hard);
    unlink(s->sock);
    if (!keep_dir)
        rmdir(s->dir);
    return st;
}

/* SIGTERM, require exit status 0 and that the simulator removed its socket. */
static inline void simctl_stop_ok(struct simctl *s)
{
    int st = simctl_reap(s, false);
    bool left = access(s->sock, F_OK) == 0;
    simctl_stop(s, false, false);
    ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "simulator did not exit 0 on SIGTERM (status 0x%x)", st);
    ck_assert_msg(!left, "the simulator left its socket behind");
}

/* ---- state ------------------------------------------------------------------ */

/* A number from the simulator's GET /_sim/state (-1 on failure). */
static inline long long simctl_state(const struct simctl *s, const char *field)
{
    char *body = NULL;
    long status = kvh_http_try(s->http, NULL, "/_sim/state", NULL, &body, NULL, 0, 30000L, NULL);
    long long v = -1;
    json_t *doc = status == 200 && body ? json_loads(body, 0, NULL) : NULL;
    if (json_is_integer(json_object_get(doc, field)))
        v = (long long)json_integer_value(json_object_get(doc, field));
    json_decref(doc);
    free(body);
    return v;
}

#endif /* KVNODE_TESTS_SIMCTL_H */
