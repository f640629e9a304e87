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
 * simctl_stop_ok() requires a clean exit 0 on SIGTERM.
 *
 * Everything is static inline; failures are Check assertions. */
#ifndef KVNODE_TESTS_SIMCTL_H
#define KVNODE_TESTS_SIMCTL_H

#include <check.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

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

/* Start the simulator as described by o (NULL: all defaults). */
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
    char addr[64];
    snprintf(addr, sizeof addr, "%s", o->http_addr ? o->http_addr : "127.0.0.1:0");
    const char *argv[40];
    int n = 0;
    if (o->valgrind) {
        argv[n++] = "valgrind";
        argv[n++] = "-q";
        argv[n++] = "--error-exitcode=99";
        argv[n++] = "--leak-check=full";
        argv[n++] = "--errors-for-leak-kinds=definite,indirect";
        argv[n++] = "--show-leak-kinds=definite,indirect";
    }
    argv[n++] = bin;
    argv[n++] = "--http";
    argv[n++] = addr;
    argv[n++] = "--socket";
    argv[n++] = s->sock;
    for (const char *const *e = o->extra; e && *e && n < 38; e++)
        argv[n++] = *e;
    argv[n] = NULL;

    int pfd[2];
    ck_assert(pipe(pfd) == 0);
    pid_t parent = getpid();
    s->pid = fork();
    ck_assert(s->pid >= 0);
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);

    /* Read "http=..." and "socket=..." with a deadline. */
    char buf[1024];
    size_t len = 0;
    bool have_http = false, have_sock = false;
    uint64_t deadline = simctl_now_ms() + SIMCTL_DEADLINE_MS;
    while (!(have_http && have_sock)) {
        int left = (int)(deadline - simctl_now_ms());
        ck_assert_msg(left > 0 && len < sizeof buf - 1, "simulator did not announce itself");
        struct pollfd p = { .fd = pfd[0], .events = POLLIN };
        if (poll(&p, 1, left) <= 0)
            continue;
        ssize_t r = read(pfd[0], buf + len, sizeof buf - 1 - len);
        ck_assert_msg(r > 0, "simulator exited before announcing itself");
        len += (size_t)r;
        buf[len] = '\0';
        char *h = strstr(buf, "http=");
        if (h && strchr(h, '\n')) {
            snprintf(s->http, sizeof s->http, "%.*s", (int)strcspn(h + 5, "\n"), h + 5);
            snprintf(s->base, sizeof s->base, "http://%s", s->http);
            have_http = true;
        }
        char *so = strstr(buf, "socket=");
        if (so && strchr(so, '\n')) {
            ck_assert(strncmp(so + 7, s->sock, strlen(s->sock)) == 0);
            have_sock = true;
        }
    }
    close(pfd[0]);
}

/* Signal the child *pid (SIGTERM, or SIGKILL when hard) and reap it; *pid
 * becomes 0. Returns the wait status, -1 when it had to be killed after the
 * deadline or was not running. Shared with kvcmctl.h. */
static inline int simctl_reap_pid(pid_t *pid, bool hard)
{
    int st = -1;
    if (*pid > 0) {
        kill(*pid, hard ? SIGKILL : SIGTERM);
        uint64_t deadline = simctl_now_ms() + SIMCTL_DEADLINE_MS;
        for (;;) {
            pid_t r = waitpid(*pid, &st, WNOHANG);
            if (r == *pid)
                break;
            if (simctl_now_ms() > deadline) {
                kill(*pid, SIGKILL);
                waitpid(*pid, &st, 0);
                st = -1;
                break;
            }
            simctl_sleep_ms(10);
        }
        *pid = 0;
    }
    return st;
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

/* ---- libcurl body collector --------------------------------------------------- */

struct simctl_body { char *p; size_t n; };

/* CURLOPT_WRITEFUNCTION: append to a struct simctl_body, NUL-terminated. */
static inline size_t simctl_body_sink(char *p, size_t size, size_t n, void *arg)
{
    struct simctl_body *b = arg;
    size_t add = size * n;
    char *q = realloc(b->p, b->n + add + 1);
    if (!q)
        return 0;
    memcpy(q + b->n, p, add);
    b->p = q;
    b->n += add;
    b->p[b->n] = '\0';
    return add;
}

/* ---- state ------------------------------------------------------------------ */

/* A number from the simulator's GET /_sim/state (-1 on failure). */
static inline long long simctl_state(const struct simctl *s, const char *field)
{
    char url[256];
    snprintf(url, sizeof url, "%s/_sim/state", s->base);
    struct simctl_body b = { NULL, 0 };
    CURL *c = curl_easy_init();
    ck_assert(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, simctl_body_sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    long status = -1;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    long long v = -1;
    json_t *doc = status == 200 && b.p ? json_loads(b.p, 0, NULL) : NULL;
    if (json_is_integer(json_object_get(doc, field)))
        v = (long long)json_integer_value(json_object_get(doc, field));
    json_decref(doc);
    free(b.p);
    return v;
}

#endif /* KVNODE_TESTS_SIMCTL_H */
