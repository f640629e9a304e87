/* Reload: a valid change is applied, an invalid file keeps the running
 * configuration with its errors reported, a restart-only change is reported
 * and not applied; SIGHUP and kvnodectl's RELOAD take the same path; only
 * root or the daemon's user may reload. Tenants: users and limits apply,
 * sizes and the set of tenants wait for a restart, a conflict between what
 * is kept and what is new refuses the reload. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "../common/kvh_http.h"

static double stat_real(const kvh_daemon *d, const char *path)
{
    json_t *root = kvh_stats(d);
    ck_assert_msg(root != NULL, "stats: %s", kvh_error());
    json_t *v = kvh_json_get(root, path);
    ck_assert_msg(json_is_number(v), "stat %s missing", path);
    double out = json_number_value(v);
    json_decref(root);
    return out;
}

/* Send SIGHUP and wait (bounded) until the log shows `what` `times` times. */
static void hup_and_wait(kvh_daemon *d, const char *what, int times)
{
    ck_assert_int_eq(kill(d->pid, SIGHUP), 0);
    for (int i = 0; i < 500; i++) {
        char *log = kvh_read_log(d);
        int n = 0;
        for (const char *p = log; p && (p = strstr(p, what)) != NULL; p++)
            n++;
        free(log);
        if (n >= times)
            return;
        kvh_sleep_ms(10);
    }
    ck_abort_msg("no '%s' in the log after SIGHUP", what);
}

static kvnode_client *observer(const kvh_daemon *d)
{
    kvnode_client *c;
    int rc = kvnode_connect(d->sock, NULL, &c);
    ck_assert_msg(rc == 0, "connect: %s", kvnode_connect_error());
    return c;
}

START_TEST(valid_invalid_and_restart_only_changes)
{
    kvh_daemon d;
    KVH_START(&d, "memory.high_watermark=0.95\n");
    kvnode_client *c = observer(&d);
    char *not_applied = (char *)1;

    /* A valid change applies at once. */
    ck_assert_int_eq(kvh_rewrite_config(&d, "memory.high_watermark=0.8\nmemory.low_watermark=0.7\n"), 0);
    KVH_OK(c, kvnode_reload(c, &not_applied));
    ck_assert_ptr_null(not_applied);
    ck_assert_double_eq_tol(stat_real(&d, "tiers.host.high_watermark"), 0.8, 1e-9);
    ck_assert_double_eq_tol(stat_real(&d, "tiers.host.low_watermark"), 0.7, 1e-9);

    /* A restart-only change is reported and not applied; the rest is. */
    ck_assert_int_eq(kvh_rewrite_config(&d, "memory.host_bytes=128MiB\nmemory.high_watermark=0.85\n"
                                            "memory.low_watermark=0.7\n"), 0);
    KVH_OK(c, kvnode_reload(c, &not_applied));
    ck_assert_ptr_nonnull(not_applied);
    ck_assert_str_eq(not_applied, "memory.host_bytes");
    free(not_applied);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.capacity_bytes"), 64ll << 20);
    ck_assert_double_eq_tol(stat_real(&d, "tiers.host.high_watermark"), 0.85, 1e-9);

    /* An invalid file changes nothing and says every problem. */
    ck_assert_int_eq(kvh_rewrite_config(&d, "memory.high_watermark=7\nmemory.bogus=1\n"), 0);
    ck_assert_int_eq(kvnode_reload(c, &not_applied), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "high_watermark"));
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "bogus"));
    ck_assert_double_eq_tol(stat_real(&d, "tiers.host.high_watermark"), 0.85, 1e-9);

    /* SIGHUP takes the same path: invalid -> still serving, logged. */
    hup_and_wait(&d, "reload failed", 2);
    ck_assert_int_eq(kvnode_ping(c), 0);
    char *log = kvh_read_log(&d);
    ck_assert_ptr_nonnull(log);
    ck_assert_ptr_nonnull(strstr(log, "memory.host_bytes changed but needs a restart"));
    free(log);
    /* ...and a valid one applies. */
    ck_assert_int_eq(kvh_rewrite_config(&d, "memory.high_watermark=0.9\nmemory.low_watermark=0.5\n"), 0);
    hup_and_wait(&d, "configuration reloaded", 3);
    ck_assert_int_eq(kvnode_ping(c), 0);
    ck_assert_double_eq_tol(stat_real(&d, "tiers.host.low_watermark"), 0.5, 1e-9);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* The child of only_root_or_the_daemon_user_may_reload, as uid 65534: 0
 * when its RELOAD is refused naming that uid. */
static int reload_denied(void *arg)
{
    const kvh_daemon *d = arg;
    kvnode_client *c;
    if (kvnode_connect(d->sock, NULL, &c) != 0)
        return 11;
    int rc = kvnode_reload(c, NULL);
    int denied = rc == -KVNODE_EDENIED && strstr(kvnode_last_error(c), "uid 65534") != NULL;
    kvnode_close(c);
    return denied ? 0 : 12;
}

START_TEST(only_root_or_the_daemon_user_may_reload)
{
    kvh_daemon d;
    KVH_START(&d, "server.socket_mode=0666\n");
    if (geteuid() != 0) {
        /* The test needs to become another user; as a non-root tester the
         * daemon's user is us, so the allowed path is all we can check. */
        kvnode_client *c = observer(&d);
        KVH_OK(c, kvnode_reload(c, NULL));
        kvnode_close(c);
        KVH_STOP_DESTROY(&d);
        return;
    }
    /* Let the other user reach the socket through the temporary dirs. */
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", d.dir);
    *strrchr(parent, '/') = '\0';
    ck_assert_int_eq(chmod(parent, 0755), 0);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    pid_t pid = proc_spawn(&(struct proc_opts){ .fn = reload_denied, .arg = &d, .as_user = true, .uid = 65534,
                                                .gid = 65534 },
                           NULL);
    ck_assert_msg(pid > 0, "%s", proc_error());
    int st = proc_wait(&pid, 10000);
    ck_assert_msg(st >= 0, "child: %s", proc_error());
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* The effective configuration, from the admin listener's /config. */
static char *effective_config(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    const char *addr = json_string_value(json_object_get(st, "admin"));
    ck_assert_msg(addr != NULL, "stats has no \"admin\" address");
    char *text;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/config", &text, NULL, 0), 200);
    json_decref(st);
    return text;
}

/* The [tenant.NAME] section of a config_write text, cut at the next one. */
static char *tenant_section(const char *text, const char *name)
{
    char hdr[64];
    snprintf(hdr, sizeof hdr, "\n[tenant.%s]\n", name);
    const char *s = strstr(text, hdr);
    ck_assert_msg(s != NULL, "no [tenant.%s] in:\n%s", name, text);
    const char *end = strstr(s + 1, "\n[");
    return strndup(s, end ? (size_t)(end - s) : strlen(s));
}

START_TEST(tenant_changes)
{
    /* Tenants a (uid 4242) and b (uid 4343), 16MiB each of the harness's
     * 64MiB; the test's own client is in neither. */
    static const char two[] = "admin.listen=127.0.0.1:0\n"
                              "tenant.a.uids=4242\ntenant.a.host_bytes=16MiB\n"
                              "tenant.b.uids=4343\ntenant.b.host_bytes=25%\n";
    kvh_daemon d;
    KVH_START(&d, two);
    kvnode_client *c = observer(&d);
    char *not_applied = (char *)1;

    /* Users and limits apply; a size, a new tenant, a removed one wait for
     * the restart and are named. */
    ck_assert_int_eq(kvh_rewrite_config(&d, "admin.listen=127.0.0.1:0\n"
                                            "tenant.a.uids=4242 4244\ntenant.a.host_bytes=32MiB\n"
                                            "tenant.a.max_clients=5\n"
                                            "tenant.c.uids=4545\ntenant.c.host_bytes=16MiB\n"), 0);
    KVH_OK(c, kvnode_reload(c, &not_applied));
    ck_assert_ptr_nonnull(not_applied);
    ck_assert_str_eq(not_applied, "tenant.a.host_bytes, tenant.b, tenant.c");
    free(not_applied);
    char *text = effective_config(&d);
    char *a = tenant_section(text, "a"), *b = tenant_section(text, "b");
    ck_assert_msg(strstr(a, "\nuids = 4242 4244\n") && strstr(a, "\nhost_bytes = 16MiB\n") &&
                  strstr(a, "\nmax_clients = 5\n"), "%s", a);
    ck_assert_msg(strstr(b, "\nuids = 4343\n") && strstr(b, "\nhost_bytes = 25%\n"), "%s", b);
    ck_assert_msg(!strstr(text, "[tenant.c]"), "%s", text);
    free(a);
    free(b);
    free(text);

    /* A uid moved into a from b, whose removal waits for the restart: the
     * two would overlap, so the reload is refused and nothing changes. */
    ck_assert_int_eq(kvh_rewrite_config(&d, "admin.listen=127.0.0.1:0\n"
                                            "tenant.a.uids=4242 4343\ntenant.a.host_bytes=16MiB\n"
                                            "tenant.a.max_clients=6\n"), 0);
    ck_assert_int_eq(kvnode_reload(c, &not_applied), -KVNODE_EINVAL);
    const char *why = kvnode_last_error(c);
    ck_assert_msg(strstr(why, "with tenant.b kept as running until a restart, the configuration is invalid") &&
                  strstr(why, "[tenant.b] uids: uid 4343 is also in [tenant.a]"), "%s", why);
    text = effective_config(&d);
    a = tenant_section(text, "a");
    ck_assert_msg(strstr(a, "\nuids = 4242 4244\n") && strstr(a, "\nmax_clients = 5\n"), "%s", a);
    free(a);
    free(text);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        valid_invalid_and_restart_only_changes,
        only_root_or_the_daemon_user_may_reload,
        tenant_changes,
    };
    return kvh_run_suite("daemon_reload", "reload", 30, tests, sizeof tests / sizeof tests[0]);
}
