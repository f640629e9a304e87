/* Integration: starting over a stale socket and next to a live daemon.
 *
 * - A daemon killed with SIGKILL leaves its socket file behind; a new daemon
 *   on the same path replaces it and serves (stats pid is the new one).
 * - A second daemon started on the socket of a live one refuses to start
 *   (exit status 1, its stderr names the socket path) and the first keeps
 *   serving on that path, for clients connected before and after. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

#define BB 4096

static void assert_serves(const kvh_daemon *d, const char *what)
{
    kvnode_layout l = kvh_layout("life", BB, 1, 0);
    kvnode_client *c;
    int rc = kvh_connect(d, &l, &c);
    ck_assert_msg(rc == 0, "%s: %s", what, kvh_error());
    kvnode_key keys[3];
    kvh_chain(keys, 3, 5);
    rc = kvh_put(c, keys, 3, 5);
    ck_assert_msg(rc == 0, "%s: %s", what, kvh_error());
    size_t got;
    rc = kvh_get_zc_verify(c, keys, 3, 5, &got);
    ck_assert_msg(rc == 0 && got == 3, "%s: rc %d got %zu: %s", what, rc, got, kvh_error());
    json_t *st = kvh_stats_client(c);
    ck_assert_msg(st != NULL, "%s: %s", what, kvh_error());
    ck_assert_msg(kvh_json_int(st, "pid") == (long long)d->pid, "%s: served by pid %lld, expected %d", what,
                  kvh_json_int(st, "pid"), (int)d->pid);
    json_t *sock = json_object_get(st, "socket");
    ck_assert_msg(json_is_string(sock) && strcmp(json_string_value(sock), d->sock) == 0,
                  "%s: stats socket is not %s", what, d->sock);
    json_decref(st);
    kvnode_close(c);
}

static int is_socket(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode);
}

START_TEST(restart_over_stale_socket)
{
    kvh_daemon a, b;
    KVH_START(&a, NULL);
    assert_serves(&a, "first daemon");
    int st = kvh_kill(&a, SIGKILL);
    ck_assert_int_eq(st, KVH_EXIT_SIGNAL_BASE + SIGKILL);
    ck_assert_msg(is_socket(a.sock), "SIGKILL should leave the socket file %s behind", a.sock);
    /* Nobody listens there now. */
    ck_assert_int_lt(kvh_raw_connect(a.sock), 0);

    char cfg[PATH_MAX + 64];
    snprintf(cfg, sizeof cfg, "server.socket_path=%s\n", a.sock);
    KVH_START(&b, cfg);
    ck_assert_str_eq(b.sock, a.sock);
    assert_serves(&b, "daemon started over the stale socket");
    KVH_STOP_DESTROY(&b);
    kvh_destroy(&a);
}
END_TEST

START_TEST(second_daemon_on_live_socket_refuses)
{
    kvh_daemon a, b;
    KVH_START(&a, NULL);
    kvnode_layout l = kvh_layout("life", BB, 1, 0);
    kvnode_client *early;
    KVH_CONNECT(&a, &l, &early);

    char cfg[PATH_MAX + 64];
    snprintf(cfg, sizeof cfg, "server.socket_path=%s\n", a.sock);
    ck_assert_msg(kvh_spawn(&b, cfg) == 0, "%s", kvh_error());
    int st = kvh_wait_exit(&b, 10000);
    if (st != 1)
        kvh_print_log(&b, "second kvnoded");
    ck_assert_msg(st == 1, "second daemon on a live socket: exit status %d, expected 1", st);
    char *log = kvh_read_log(&b);
    ck_assert_msg(log != NULL, "%s", kvh_error());
    ck_assert_msg(strstr(log, a.sock) != NULL, "the refusal does not name the socket %s:\n%s", a.sock, log);
    free(log);

    /* The first daemon was not disturbed. */
    ck_assert_msg(is_socket(a.sock), "the refused daemon removed %s", a.sock);
    KVH_OK(early, kvnode_ping(early));
    assert_serves(&a, "first daemon after the refused start");
    kvnode_close(early);

    KVH_STOP_OK(&a);
    kvh_destroy(&b);
    kvh_destroy(&a);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        restart_over_stale_socket,
        second_daemon_on_live_socket_refuses,
    };
    return kvh_run_suite("daemon_lifecycle", "lifecycle", 30, tests, sizeof tests / sizeof tests[0]);
}
