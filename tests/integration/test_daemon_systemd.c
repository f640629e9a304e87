/* Integration: systemd integration of the real daemon, with a test
 * NOTIFY_SOCKET (an abstract unix datagram socket) standing in for systemd.
 *
 * - Start: READY=1 with STATUS "serving on <socket>: host 0 B of 64.0 MiB
 *   used, 0 clients, 0 namespaces"; the periodic refresh then reports the
 *   client and namespace a test connection adds (STATUS only, no READY);
 *   SIGTERM: STOPPING=1, exit 0.
 * - SIGHUP with a valid change: RELOADING=1 with MONOTONIC_USEC inside the
 *   window of the signal (same CLOCK_MONOTONIC), then READY=1 and a plain
 *   STATUS; with an invalid file: RELOADING=1, then READY=1 whose STATUS
 *   names the failed reload, and the daemon keeps serving.
 * - Watchdog: WATCHDOG_USEC=200000 with WATCHDOG_PID = the daemon's pid ->
 *   WATCHDOG=1 repeatedly (every ~100 ms); WATCHDOG_PID of another process
 *   -> no pings at all.
 * - Socket activation: the test binds and listens on the socket and passes
 *   it at fd 3 with LISTEN_FDS=1 LISTEN_PID=<daemon pid>: a put/get round
 *   trip works through it, no lock file is made, and after SIGTERM the socket
 *   file is still there (systemd's, not the daemon's to unlink).
 *   LISTEN_FDS=2 -> exit 1 naming the count; LISTEN_PID of another process
 *   -> LISTEN_FDS ignored, the daemon binds (and later removes) its own.
 * - systemd-analyze verify accepts systemd/kvnoded.service and
 *   kvnoded.socket (tests/verify-units.sh; skipped, saying so, when
 *   systemd-analyze is not installed). */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

#define BB 65536
#define WAIT_MS 20000      /* generous: valgrind runs */

/* --- a stand-in for systemd's notification socket ---------------------------- */

struct notifier {
    int fd;
    char env[128];            /* "NOTIFY_SOCKET=@name" */
};

static void notifier_open(struct notifier *n)
{
    static int counter;
    char name[96];
    struct sockaddr_un sa;
    int len = snprintf(name, sizeof name, "kvnode-it-notify-%d-%d", (int)getpid(), counter++);

    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path + 1, name, (size_t)len);         /* abstract: leading NUL */
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(n->fd, 0);
    ck_assert_msg(bind(n->fd, (struct sockaddr *)&sa,
                       (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)) == 0,
                  "bind notify socket: %s", strerror(errno));
    snprintf(n->env, sizeof n->env, "NOTIFY_SOCKET=@%s", name);
}

static void notifier_close(struct notifier *n)
{
    close(n->fd);
    n->fd = -1;
}

/* Next datagram within timeout_ms into buf ('\0'-terminated): 1, or 0 on timeout. */
static int notifier_recv(struct notifier *n, char *buf, size_t len, int timeout_ms)
{
    struct pollfd p = { .fd = n->fd, .events = POLLIN };
    int rc = poll(&p, 1, timeout_ms);
    if (rc <= 0)
        return 0;
    ssize_t r = recv(n->fd, buf, len - 1, 0);
    ck_assert_msg(r >= 0, "recv: %s", strerror(errno));
    buf[r] = '\0';
    return 1;
}

/* The value of line "NAME=..." in a datagram (points into msg), or NULL. */
static const char *msg_field(const char *msg, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = msg; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, nl) == 0 && p[nl] == '=')
            return p + nl + 1;
    return NULL;
}

/* A copy of the value up to the end of its line. */
static void msg_value(const char *msg, const char *name, char *out, size_t len)
{
    const char *v = msg_field(msg, name);
    ck_assert_msg(v != NULL, "no %s= in \"%s\"", name, msg);
    size_t l = strcspn(v, "\n");
    snprintf(out, len, "%.*s", (int)l, v);
}

/* Read datagrams until one has NAME=VALUE (value NULL: any); it is left in
 * buf. Fails the test on timeout, naming the last datagram seen. */
static void notifier_wait(struct notifier *n, const char *name, const char *value,
                          char *buf, size_t len, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    char last[1024] = "(none)";
    for (;;) {
        uint64_t now = kvh_now_ms();
        ck_assert_msg(now < deadline, "no %s=%s from the daemon within %d ms (last datagram: \"%s\")",
                      name, value ? value : "*", timeout_ms, last);
        if (!notifier_recv(n, buf, len, (int)(deadline - now)))
            continue;
        snprintf(last, sizeof last, "%s", buf);
        const char *v = msg_field(buf, name);
        if (v && (!value || (strncmp(v, value, strlen(value)) == 0 &&
                             (v[strlen(value)] == '\n' || v[strlen(value)] == '\0'))))
            return;
    }
}

static int log_has(const kvh_daemon *d, const char *what)
{
    char *log = kvh_read_log(d);
    int found = log && strstr(log, what) != NULL;
    free(log);
    return found;
}

static void put_get_round_trip(const kvh_daemon *d, uint64_t seed)
{
    kvnode_layout l = kvh_layout("sd", BB, 1, 0);
    kvnode_client *c;
    kvnode_key keys[8];
    size_t got = 0;

    KVH_CONNECT(d, &l, &c);
    kvh_chain(keys, 8, seed);
    ck_assert_msg(kvh_put(c, keys, 8, seed) == 0, "put: %s", kvh_error());
    ck_assert_msg(kvh_get_zc_verify(c, keys, 8, seed, &got) == 0 && got == 8,
                  "get: got %zu: %s", got, kvh_error());
    kvnode_close(c);
}

/* --- tests ------------------------------------------------------------------------ */

START_TEST(test_notify_ready_status_stopping)
{
    struct notifier n;
    kvh_daemon d;
    char msg[1024], status[512], want[PATH_MAX + 128];

    notifier_open(&n);
    const char *env[] = { n.env, NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(&d, NULL, &o) == 0, "start: %s", kvh_error());

    notifier_wait(&n, "READY", "1", msg, sizeof msg, WAIT_MS);
    msg_value(msg, "STATUS", status, sizeof status);
    snprintf(want, sizeof want, "serving on %s: host 0 B of 64.0 MiB used, 0 clients, 0 namespaces",
             d.sock);
    ck_assert_str_eq(status, want);

    /* The refresh timer (every 5 s) reports the new client and namespace. */
    kvnode_layout l = kvh_layout("sd", BB, 1, 0);
    kvnode_client *c;
    kvnode_key keys[4];
    KVH_CONNECT(&d, &l, &c);
    kvh_chain(keys, 4, 3);
    ck_assert_msg(kvh_put(c, keys, 4, 3) == 0, "put: %s", kvh_error());
    uint64_t deadline = kvh_now_ms() + 12000;
    int seen = 0;
    while (!seen && kvh_now_ms() < deadline) {
        if (!notifier_recv(&n, msg, sizeof msg, 500))
            continue;
        ck_assert_msg(msg_field(msg, "READY") == NULL, "READY=1 again without a reload: \"%s\"", msg);
        const char *st = msg_field(msg, "STATUS");
        seen = st && strstr(st, ", 1 client, 1 namespace") && strstr(st, "host 256.0 KiB of 64.0 MiB");
    }
    ck_assert_msg(seen, "no refreshed STATUS with the client and its 4 blocks (last: \"%s\")", msg);
    kvnode_close(c);

    KVH_STOP_OK(&d);
    notifier_wait(&n, "STOPPING", "1", msg, sizeof msg, 5000);
    msg_value(msg, "STATUS", status, sizeof status);
    ck_assert_msg(strncmp(status, "stopping", 8) == 0, "STATUS with STOPPING=1: \"%s\"", status);
    kvh_destroy(&d);
    notifier_close(&n);
}
END_TEST

START_TEST(test_notify_reload_valid_and_invalid)
{
    struct notifier n;
    kvh_daemon d;
    char msg[1024], status[512], usec[64];

    notifier_open(&n);
    const char *env[] = { n.env, NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(&d, NULL, &o) == 0, "start: %s", kvh_error());
    notifier_wait(&n, "READY", "1", msg, sizeof msg, WAIT_MS);

    /* A valid change. */
    ck_assert_msg(kvh_rewrite_config(&d, "log.level=debug") == 0, "%s", kvh_error());
    uint64_t t0 = kvh_now_ns() / 1000;
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    notifier_wait(&n, "RELOADING", "1", msg, sizeof msg, WAIT_MS);
    uint64_t t1 = kvh_now_ns() / 1000;
    msg_value(msg, "MONOTONIC_USEC", usec, sizeof usec);
    uint64_t v = strtoull(usec, NULL, 10);
    ck_assert_msg(v >= t0 && v <= t1, "MONOTONIC_USEC=%s not within [%" PRIu64 ", %" PRIu64 "]",
                  usec, t0, t1);
    notifier_wait(&n, "READY", "1", msg, sizeof msg, WAIT_MS);
    msg_value(msg, "STATUS", status, sizeof status);
    ck_assert_msg(strncmp(status, "serving on ", 11) == 0 && !strstr(status, "reload failed"),
                  "STATUS after a good reload: \"%s\"", status);
    ck_assert(log_has(&d, "configuration reloaded"));

    /* An invalid file: the old config is kept, READY=1 all the same. */
    ck_assert_msg(kvh_rewrite_config(&d, "log.level=loudest") == 0, "%s", kvh_error());
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    notifier_wait(&n, "RELOADING", "1", msg, sizeof msg, WAIT_MS);
    ck_assert_ptr_nonnull(msg_field(msg, "MONOTONIC_USEC"));
    notifier_wait(&n, "READY", "1", msg, sizeof msg, WAIT_MS);
    msg_value(msg, "STATUS", status, sizeof status);
    ck_assert_msg(strncmp(status, "serving on ", 11) == 0 && strstr(status, "; last reload failed: "),
                  "STATUS after a failed reload: \"%s\"", status);
    ck_assert(log_has(&d, "reload failed"));
    put_get_round_trip(&d, 11);

    KVH_STOP_OK(&d);
    notifier_wait(&n, "STOPPING", "1", msg, sizeof msg, 5000);
    kvh_destroy(&d);
    notifier_close(&n);
}
END_TEST

START_TEST(test_watchdog_pings)
{
    struct notifier n;
    kvh_daemon d;
    char msg[1024];

    notifier_open(&n);
    const char *env[] = { n.env, "WATCHDOG_USEC=200000", NULL };
    const char *pid_env[] = { "WATCHDOG_PID", NULL };
    kvh_spawn_opts o = { .env = env, .pid_env = pid_env };
    ck_assert_msg(kvh_start_ex(&d, NULL, &o) == 0, "start: %s", kvh_error());
    notifier_wait(&n, "READY", "1", msg, sizeof msg, WAIT_MS);

    /* Every 100 ms: at least 5 in 1.5 s even on a slow (valgrind) run. */
    int pings = 0;
    uint64_t end = kvh_now_ms() + 1500;
    while (kvh_now_ms() < end)
        if (notifier_recv(&n, msg, sizeof msg, 100) && msg_field(msg, "WATCHDOG"))
            pings++;
    ck_assert_msg(pings >= 5, "only %d WATCHDOG=1 in 1.5 s with WATCHDOG_USEC=200000", pings);
    ck_assert(log_has(&d, "systemd watchdog: 200 ms"));
    put_get_round_trip(&d, 5);
    KVH_STOP_DESTROY(&d);
    notifier_close(&n);
}
END_TEST

START_TEST(test_watchdog_other_pid_ignored)
{
    struct notifier n;
    kvh_daemon d;
    char msg[1024];

    notifier_open(&n);
    const char *env[] = { n.env, "WATCHDOG_USEC=200000", "WATCHDOG_PID=1", NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(&d, NULL, &o) == 0, "start: %s", kvh_error());
    notifier_wait(&n, "READY", "1", msg, sizeof msg, WAIT_MS);
    uint64_t end = kvh_now_ms() + 800;
    while (kvh_now_ms() < end)
        if (notifier_recv(&n, msg, sizeof msg, 100))
            ck_assert_msg(!msg_field(msg, "WATCHDOG"), "WATCHDOG=1 meant for pid 1: \"%s\"", msg);
    ck_assert(!log_has(&d, "systemd watchdog"));
    KVH_STOP_DESTROY(&d);
    notifier_close(&n);
}
END_TEST

START_TEST(test_socket_activation)
{
    struct notifier n;
    kvh_daemon d;
    char msg[1024], status[512], lock[PATH_MAX + 8];
    struct stat st;

    notifier_open(&n);
    const char *env[] = { n.env, NULL };
    kvh_spawn_opts o = { .env = env, .listen_fds = 1 };
    ck_assert_msg(kvh_start_ex(&d, NULL, &o) == 0, "start: %s", kvh_error());
    notifier_wait(&n, "READY", "1", msg, sizeof msg, WAIT_MS);
    msg_value(msg, "STATUS", status, sizeof status);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "serving on %s: ", d.sock);
    ck_assert_msg(strncmp(status, want, strlen(want)) == 0, "STATUS \"%s\"", status);
    ck_assert(log_has(&d, "socket activation: serving on the socket systemd passed (fd 3, "));

    put_get_round_trip(&d, 7);
    json_t *stats = kvh_stats(&d);
    ck_assert_msg(stats != NULL, "%s", kvh_error());
    ck_assert_str_eq(json_string_value(json_object_get(stats, "socket")), d.sock);
    json_decref(stats);
    snprintf(lock, sizeof lock, "%s.lock", d.sock);
    ck_assert_msg(access(lock, F_OK) != 0, "an inherited socket got a lock file %s", lock);

    KVH_STOP_OK(&d);
    ck_assert_msg(stat(d.sock, &st) == 0 && S_ISSOCK(st.st_mode),
                  "the inherited socket %s was removed: %s", d.sock, strerror(errno));
    kvh_destroy(&d);
    notifier_close(&n);
}
END_TEST

START_TEST(test_socket_activation_two_fds_refused)
{
    kvh_daemon d;
    kvh_spawn_opts o = { .listen_fds = 2 };

    ck_assert_msg(kvh_spawn_ex(&d, NULL, &o) == 0, "spawn: %s", kvh_error());
    int st = kvh_wait_exit(&d, WAIT_MS);
    ck_assert_msg(st == 1, "exit status %d with LISTEN_FDS=2, expected 1", st);
    ck_assert(log_has(&d, "systemd passed 2 sockets"));
    kvh_destroy(&d);
}
END_TEST

START_TEST(test_socket_activation_other_pid_ignored)
{
    kvh_daemon d;
    struct stat st;
    const char *env[] = { "LISTEN_FDS=1", "LISTEN_PID=1", NULL };
    kvh_spawn_opts o = { .env = env };

    ck_assert_msg(kvh_start_ex(&d, NULL, &o) == 0, "start: %s", kvh_error());
    put_get_round_trip(&d, 9);
    ck_assert(!log_has(&d, "socket activation"));
    KVH_STOP_OK(&d);
    ck_assert_msg(stat(d.sock, &st) != 0, "the daemon's own socket %s was left behind", d.sock);
    kvh_destroy(&d);
}
END_TEST

START_TEST(test_units_verify)
{
    const char *bin = getenv("KVNODED_REAL");      /* valgrind runs wrap KVNODED in a script */
    char cmd[PATH_MAX + 64];
    if (!bin || !*bin)
        bin = kvh_daemon_path();
    snprintf(cmd, sizeof cmd, "tests/verify-units.sh '%s'", bin);
    const char *argv[] = { "tests/verify-units.sh", bin, NULL };
    int rc = proc_run(&(struct proc_opts){ .argv = argv }, 50000, NULL, NULL);
    ck_assert_msg(rc >= 0 && WIFEXITED(rc), "cannot run %s: %s", cmd, proc_error());
    if (WEXITSTATUS(rc) == 77) {
        fprintf(stderr, "test_units_verify: SKIPPED: systemd-analyze is not installed\n");
        return;
    }
    ck_assert_msg(WEXITSTATUS(rc) == 0, "%s failed (exit %d; output above)", cmd, WEXITSTATUS(rc));
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        test_notify_ready_status_stopping,
        test_notify_reload_valid_and_invalid,
        test_watchdog_pings,
        test_watchdog_other_pid_ignored,
        test_socket_activation,
        test_socket_activation_two_fds_refused,
        test_socket_activation_other_pid_ignored,
        test_units_verify,
    };
    return kvh_run_suite("daemon_systemd", "systemd", 60, tests, sizeof tests / sizeof tests[0]);
}
