/* Integration: starting over a stale socket and next to a live daemon.
 *
 * - A daemon killed with SIGKILL leaves its socket file behind; a new daemon
 *   on the same path replaces it and serves (stats pid is the new one).
 * - A second daemon started on the socket of a live one refuses to start
 *   (exit status 1, its stderr names the socket path) and the first keeps
 *   serving on that path, for clients connected before and after.
 * - --check-config refuses a file with a NUL byte (exit 2, naming the line),
 *   credentials in persist.url (without echoing them) and a host tier larger
 *   than this machine can give (naming both sizes); the daemon itself
 *   refuses such a tier before reserving it (exit status 1), and announces
 *   the tier it reserves before reserving it. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    /* The host tier is announced before it is reserved (harness: 64MiB). */
    char *log = kvh_read_log(&a);
    ck_assert_msg(log != NULL, "%s", kvh_error());
    ck_assert_msg(strstr(log, "memory: reserving 67108864 bytes (64MiB) of host memory for memory.host_bytes; "),
                  "no line before reserving the host tier:\n%s", log);
    free(log);
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

/* Runs `kvnoded --check-config args...` (at most 8 args) with stdout and
 * stderr into one buffer; returns its exit status (-1: did not exit within
 * 10 s, killed) and the output in *out (malloc'd). */
static int run_check_config(const char *const *args, char **out)
{
    const char *argv[12] = { kvh_daemon_path(), "--check-config" };
    size_t n = 2;
    for (; args[n - 2] && n < 11; n++)
        argv[n] = args[n - 2];
    argv[n] = NULL;
    int status = proc_run(&(struct proc_opts){ .argv = argv, .err = PROC_TO_STDOUT }, 10000, out, NULL);
    ck_assert_msg(status != -1, "%s", proc_error());
    ck_assert_msg(*out != NULL, "no output captured");
    if (status == PROC_TIMEOUT)
        return -1;
    return proc_exit_code(status);
}

START_TEST(check_config_refuses_nul_byte)
{
    char dir[PATH_MAX], conf[PATH_MAX + 16], want[PATH_MAX + 64];
    ck_assert_msg(kvh_mkdtemp(dir, sizeof dir) == 0, "%s", kvh_error());
    snprintf(conf, sizeof conf, "%s/kvnode.conf", dir);
    /* A valid file whose last line is binary garbage starting with a NUL. */
    static const char text[] = "[memory]\nhost_bytes = 64MiB\nhigh_watermark = 0.97\0garbage\n";
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, sizeof text - 1, f), sizeof text - 1);
    ck_assert_int_eq(fclose(f), 0);

    char *out;
    int st = run_check_config((const char *const[]){ "-c", conf, NULL }, &out);
    ck_assert_msg(st == 2, "--check-config of a file with a NUL byte: exit status %d, expected 2:\n%s", st, out);
    snprintf(want, sizeof want, "%s:3: NUL byte in the line", conf);
    ck_assert_msg(strstr(out, want), "'%s' missing from:\n%s", want, out);
    ck_assert_msg(!strstr(out, "high_watermark = 0.97"), "an effective config was printed:\n%s", out);
    free(out);
}
END_TEST

START_TEST(check_config_refuses_url_credentials)
{
    char *out;
    int st = run_check_config((const char *const[]){ "--set", "persist.backend=v6d", "--set",
                                                     "persist.url=http://kvs:s3cret@10.0.0.9:8080", "--set",
                                                     "persist.socket_path=/run/v6d.sock", NULL }, &out);
    ck_assert_msg(st == 2, "credentials in persist.url: exit status %d, expected 2:\n%s", st, out);
    ck_assert_msg(strstr(out, "persist.url: credentials in the URL are not accepted"), "%s", out);
    ck_assert_msg(!strstr(out, "s3cret"), "the password is shown:\n%s", out);
    free(out);
}
END_TEST

START_TEST(check_config_refuses_host_bytes_over_machine)
{
    /* 100TiB (whole 1GiB slabs) is more than any machine this runs on has:
     * the check is of the file on this machine, so it fails and names both
     * sizes. --check-config reserves nothing, so this is safe to run. */
    char *out;
    int st = run_check_config((const char *const[]){ "--set", "memory.host_bytes=100TiB", "--set",
                                                     "memory.slab_bytes=1GiB", NULL }, &out);
    ck_assert_msg(st == 2, "host_bytes = 100TiB: exit status %d, expected 2:\n%s", st, out);
    ck_assert_msg(strstr(out, "memory.host_bytes: 100TiB (109951162777600 bytes) exceeds"), "%s", out);
    ck_assert_msg(strstr(out, "MemAvailable"), "the available memory is not named:\n%s", out);
    ck_assert_msg(strstr(out, "lower memory.host_bytes"), "no remedy given:\n%s", out);
    free(out);

    /* A size that fits passes and prints the effective configuration. */
    st = run_check_config((const char *const[]){ "--set", "memory.host_bytes=64MiB", NULL }, &out);
    ck_assert_msg(st == 0, "host_bytes = 64MiB: exit status %d:\n%s", st, out);
    ck_assert_msg(strstr(out, "host_bytes = 64MiB"), "%s", out);
    free(out);
}
END_TEST

/* MemAvailable from /proc/meminfo, in bytes (0 when unreadable). */
static unsigned long long mem_available(void)
{
    char *text = kvh_read_file("/proc/meminfo", NULL);
    unsigned long long kb = 0;
    const char *line = text ? strstr(text, "\nMemAvailable:") : NULL;
    if (!line || sscanf(line + 1, "MemAvailable: %llu kB", &kb) != 1)
        kb = 0;
    free(text);
    return kb * 1024;
}

START_TEST(start_refuses_host_bytes_over_available)
{
    /* Twice what the machine has available: the admission check must refuse
     * before anything is reserved. A binary without the check would reserve
     * it and bring in the OOM killer, so --check-config (which reserves
     * nothing) must refuse it first, or the daemon is not started at all. */
    unsigned long long avail = mem_available();
    ck_assert_msg(avail > 0, "cannot read MemAvailable from /proc/meminfo");
    /* Whole 16MiB slabs (the default slab_bytes): what is reserved is what is asked. */
    unsigned long long ask_mib = (2 * avail / (1024 * 1024) / 16 + 1) * 16;
    char set[64], want[96];
    snprintf(set, sizeof set, "memory.host_bytes=%lluMiB", ask_mib);
    char *out;
    int st = run_check_config((const char *const[]){ "--set", set, NULL }, &out);
    free(out);
    ck_assert_msg(st == 2, "--check-config accepts %s (exit status %d): this kvnoded has no admission check; "
                  "not starting it, it would reserve twice the available memory", set, st);

    char cfg[96];
    snprintf(cfg, sizeof cfg, "%s\n", set);
    kvh_daemon d;
    ck_assert_msg(kvh_spawn(&d, cfg) == 0, "%s", kvh_error());
    st = kvh_wait_exit(&d, 10000);
    if (st != 1)
        kvh_print_log(&d, "kvnoded asked for twice MemAvailable");
    ck_assert_msg(st == 1, "host_bytes = %lluMiB (MemAvailable %llu bytes): exit status %d, expected 1", ask_mib,
                  avail, st);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log != NULL, "%s", kvh_error());
    snprintf(want, sizeof want, "refusing to start: memory.host_bytes: ");
    ck_assert_msg(strstr(log, want), "'%s' missing from:\n%s", want, log);
    snprintf(want, sizeof want, "(%llu bytes) exceeds the host memory this machine can give: MemAvailable is ",
             ask_mib << 20);
    ck_assert_msg(strstr(log, want), "'%s' missing from:\n%s", want, log);
    ck_assert_msg(strstr(log, " bytes, /proc/meminfo)"), "the available figure is not named:\n%s", log);
    ck_assert_msg(strstr(log, "lower memory.host_bytes to at most "), "no remedy:\n%s", log);
    ck_assert_msg(!strstr(log, "memory: reserving"), "it went on to reserve:\n%s", log);
    free(log);
    kvh_destroy(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        restart_over_stale_socket,
        second_daemon_on_live_socket_refuses,
        check_config_refuses_nul_byte,
        check_config_refuses_url_credentials,
        check_config_refuses_host_bytes_over_machine,
        start_refuses_host_bytes_over_available,
    };
    return kvh_run_suite("daemon_lifecycle", "lifecycle", 30, tests, sizeof tests / sizeof tests[0]);
}
