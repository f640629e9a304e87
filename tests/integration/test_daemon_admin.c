/* Integration: the admin HTTP endpoints of a real kvnoded.
 *
 * /metrics is parsed by the reference Prometheus text-format parser
 * (tests/integration/parse_metrics.py, python3-prometheus-client) and its
 * counters are checked against the operations this test performed; /healthz,
 * /readyz, /stats (same document as the STATS op), /config, 404 and 405, a
 * unix-socket admin listener and `kvnodectl metrics`. HTTP goes through
 * libcurl. */
#include <check.h>

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "../common/kvh_http.h"

#define BLOCK (64u << 10)

/* ---- HTTP ------------------------------------------------------------------ */

/* ---- metrics parsing -------------------------------------------------------- */

static const char *python(void)
{
    const char *p = getenv("KVNODE_PYTHON");
    if (p && *p)
        return p;
    /* Debian's interpreter, where python3-prometheus-client is installed. */
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

/* The page parsed by the reference parser: {"families": ..., "samples": ...}. */
static json_t *parse_metrics(const kvh_daemon *d, const char *text)
{
    char in[PATH_MAX + 16], script[PATH_MAX];
    snprintf(in, sizeof in, "%s/metrics.txt", d->dir);
    FILE *f = fopen(in, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    ck_assert_int_eq(fclose(f), 0);
    const char *srcdir = getenv("KVNODE_SRCDIR");
    snprintf(script, sizeof script, "%s/tests/integration/parse_metrics.py", srcdir && *srcdir ? srcdir : ".");
    const char *argv[] = { python(), script, NULL };
    char *out = NULL;
    int st = proc_run(&(struct proc_opts){ .argv = argv, .in = PROC_FILE, .in_path = in }, 30000, &out, NULL);
    ck_assert_msg(st == 0, "%s %s < %s failed (status %d%s%s): the page does not parse", argv[0], script, in, st,
                  st < 0 ? ": " : "", st < 0 ? proc_error() : "");
    json_error_t err;
    json_t *doc = json_loads(out, 0, &err);
    free(out);
    ck_assert_msg(doc != NULL, "parser output is not JSON: %s", err.text);
    return doc;
}

/* Value of the sample `name` whose labels are exactly `labels` (NULL-terminated
 * key/value pairs); -1 when there is none. */
static double sample(json_t *doc, const char *name, const char *const *labels)
{
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(doc, "samples"), i, s) {
        if (strcmp(json_string_value(json_array_get(s, 0)), name) != 0)
            continue;
        json_t *l = json_array_get(s, 1);
        size_t nl = 0;
        bool same = true;
        for (; labels && labels[nl]; nl += 2) {
            const char *v = json_string_value(json_object_get(l, labels[nl]));
            if (!v || strcmp(v, labels[nl + 1]) != 0)
                same = false;
        }
        if (same && json_object_size(l) == nl / 2)
            return json_number_value(json_array_get(s, 2));
    }
    return -1;
}

#define L(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define ASSERT_SAMPLE(doc, name, labels, want) do { \
        double v_ = sample((doc), (name), (labels)); \
        ck_assert_msg(v_ == (double)(want), "%s%s = %g, want %g", (name), #labels, v_, (double)(want)); \
    } while (0)

static char *admin_addr(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    const char *a = json_string_value(json_object_get(st, "admin"));
    ck_assert_msg(a != NULL, "stats has no \"admin\" address");
    char *copy = strdup(a);
    json_decref(st);
    return copy;
}

/* ---- tests ------------------------------------------------------------------ */

START_TEST(test_metrics_count_what_was_done)
{
    kvh_daemon d;
    KVH_START(&d, "admin.listen=127.0.0.1:0\n");
    char *addr = admin_addr(&d);
    ck_assert_msg(strncmp(addr, "127.0.0.1:", 10) == 0 && strcmp(addr, "127.0.0.1:0") != 0,
                  "admin address '%s' is not the bound ephemeral port", addr);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, addr), "the log does not name the admin address %s", addr);
    free(log);

    kvnode_layout lay = kvh_layout("admin-model", BLOCK, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvnode_key a[6], b[3];
    kvh_chain(a, 6, 11);
    kvh_chain(b, 3, 22);

    /* 4 blocks committed: one put_begin, one put_commit. */
    KVH_OK(c, kvh_put(c, a, 4, 7));
    /* match a[0..6): 4 matched, a[4] absent, a[5] beyond the gap. */
    ck_assert_int_eq(kvh_match(c, a, 6), 4);
    /* b reserved, not committed: match b: b[0] writing, 2 beyond the gap. */
    kvnode_lease wl;
    kvnode_loc locs[6];
    KVH_OK(c, kvnode_put_begin(c, b, 3, KVNODE_TIER_HOST, &wl, locs));
    ck_assert_int_eq(kvh_match(c, b, 3), 0);
    /* get_begin a[0..6): 4 matched, 1 absent, 1 beyond; then get_end. */
    kvnode_lease rl;
    size_t got;
    KVH_OK(c, kvnode_get_begin(c, a, 6, &rl, locs, &got));
    ck_assert_uint_eq(got, 4);
    KVH_OK(c, kvnode_get_end(c, rl));
    /* An error: a lease that does not exist. */
    ck_assert_int_eq(kvnode_get_end(c, 0x1234567), -KVNODE_ENOLEASE);
    KVH_OK(c, kvnode_put_abort(c, wl));

    char *page, ctype[128];
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/metrics", &page, ctype, sizeof ctype), 200);
    ck_assert_str_eq(ctype, "text/plain; version=0.0.4; charset=utf-8");
    json_t *m = parse_metrics(&d, page);

    /* Every family has HELP and TYPE (the parser keeps them). */
    json_t *fams = json_object_get(m, "families");
    const char *want_fams[][2] = {
        { "kvnode_build_info", "gauge" }, { "kvnode_uptime_seconds", "gauge" },
        { "kvnode_tier_capacity_bytes", "gauge" }, { "kvnode_namespace_blocks", "gauge" },
        { "kvnode_namespace_bytes", "gauge" }, { "kvnode_requests", "counter" },
        { "kvnode_request_duration_seconds", "histogram" }, { "kvnode_keys", "counter" },
        { "kvnode_evictions", "counter" }, { "kvnode_leases", "gauge" },
        { "kvnode_leases_reaped", "counter" }, { "kvnode_clients", "gauge" },
        { "kvnode_clients_refused", "counter" }, { "kvnode_frames_rejected", "counter" },
        { "kvnode_worker_up", "gauge" }, { "kvnode_reloads", "counter" },
    };
    for (size_t i = 0; i < sizeof want_fams / sizeof want_fams[0]; i++) {
        json_t *f = json_object_get(fams, want_fams[i][0]);
        ck_assert_msg(f != NULL, "family %s missing", want_fams[i][0]);
        ck_assert_str_eq(json_string_value(json_object_get(f, "type")), want_fams[i][1]);
        ck_assert_msg(strlen(json_string_value(json_object_get(f, "help"))) > 0, "%s has no HELP", want_fams[i][0]);
    }

    /* admin_addr's observer connection: one hello and one stats. */
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "hello", "status", "ok"), 2);
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "stats", "status", "ok"), 1);
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "put_begin", "status", "ok"), 2);
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "put_commit", "status", "ok"), 1);
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "put_abort", "status", "ok"), 1);
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "match", "status", "ok"), 2);
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "get_begin", "status", "ok"), 1);
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "get_end", "status", "ok"), 1);
    ASSERT_SAMPLE(m, "kvnode_requests_total", L("op", "get_end", "status", "enolease"), 1);

    ASSERT_SAMPLE(m, "kvnode_keys_total", L("result", "matched"), 8);
    ASSERT_SAMPLE(m, "kvnode_keys_total", L("result", "missed", "reason", "absent"), 2);
    ASSERT_SAMPLE(m, "kvnode_keys_total", L("result", "missed", "reason", "writing"), 1);
    ASSERT_SAMPLE(m, "kvnode_keys_total", L("result", "missed", "reason", "beyond_gap"), 4);

    json_t *st = kvh_stats(&d);
    ck_assert_ptr_nonnull(st);
    json_t *ns = kvh_stats_namespace(st, "admin-model", 0);
    ck_assert_ptr_nonnull(ns);
    const char *dep = json_string_value(json_object_get(ns, "deployment_id"));
    ASSERT_SAMPLE(m, "kvnode_namespace_blocks", L("tier", "host", "namespace", dep, "tp_rank", "0"), 4);
    ASSERT_SAMPLE(m, "kvnode_namespace_bytes", L("tier", "host", "namespace", dep, "tp_rank", "0"), 4 * BLOCK);
    ASSERT_SAMPLE(m, "kvnode_tier_capacity_bytes", L("tier", "host"), 64 << 20);
    ASSERT_SAMPLE(m, "kvnode_evictions_total", L("tier", "host", "action", "drop"), 0);
    ASSERT_SAMPLE(m, "kvnode_evictions_total", L("tier", "host", "action", "quota"), 0);
    ASSERT_SAMPLE(m, "kvnode_leases", L("kind", "read"), 0);
    ASSERT_SAMPLE(m, "kvnode_leases", L("kind", "write"), 0);
    ASSERT_SAMPLE(m, "kvnode_leases_reaped_total", L("kind", "read"), 0);
    ASSERT_SAMPLE(m, "kvnode_clients", NULL, 1);
    ASSERT_SAMPLE(m, "kvnode_worker_up", L("worker", "loop"), 1);
    ASSERT_SAMPLE(m, "kvnode_reloads_total", L("result", "ok"), 0);
    ASSERT_SAMPLE(m, "kvnode_reloads_total", L("result", "failed"), 0);
    ASSERT_SAMPLE(m, "kvnode_build_info", L("version", kvnode_version()), 1);

    /* Each op's histogram counts its requests: _count and the +Inf bucket. */
    const char *ops[] = { "hello", "stats", "put_begin", "put_commit", "put_abort", "match", "get_begin",
                          "get_end", "delete" };
    const double n_ops[] = { 2, 1, 2, 1, 1, 2, 1, 2, 0 };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        ASSERT_SAMPLE(m, "kvnode_request_duration_seconds_count", L("op", ops[i]), n_ops[i]);
        ASSERT_SAMPLE(m, "kvnode_request_duration_seconds_bucket", L("op", ops[i], "le", "+Inf"), n_ops[i]);
        double sum = sample(m, "kvnode_request_duration_seconds_sum", L("op", ops[i]));
        ck_assert_msg(n_ops[i] == 0 ? sum == 0 : sum > 0 && sum < 10, "%s latency sum %g", ops[i], sum);
    }
    json_decref(m);
    free(page);

    /* /stats is the STATS document (fields that do not move by themselves). */
    char *text;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/stats", &text, ctype, sizeof ctype), 200);
    ck_assert_str_eq(ctype, "application/json");
    json_error_t jerr;
    json_t *hs = json_loads(text, 0, &jerr);
    ck_assert_msg(hs != NULL, "/stats is not JSON: %s", jerr.text);
    free(text);
    json_decref(st);
    st = kvh_stats_client(c);
    ck_assert_ptr_nonnull(st);
    const char *same[] = { "version", "pid", "socket", "tiers", "namespaces", "leases", "evictions", "keys",
                           "admin", "reloads" };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        ck_assert_msg(json_equal(json_object_get(hs, same[i]), json_object_get(st, same[i])),
                      "/stats and STATS differ in \"%s\"", same[i]);
    ck_assert_ptr_nonnull(json_object_get(hs, "requests"));
    json_decref(hs);
    json_decref(st);

    /* /config, /healthz, /readyz, 404, 405. */
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/config", &text, NULL, 0), 200);
    ck_assert_msg(strstr(text, "host_bytes = 64MiB") && strstr(text, "[admin]"), "/config: %s", text);
    free(text);
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/healthz", &text, NULL, 0), 200);
    ck_assert_str_eq(text, "ok\n");
    free(text);
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/readyz", &text, NULL, 0), 200);
    free(text);
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/nope", NULL, NULL, 0), 404);
    ck_assert_int_eq(kvh_http_req(addr, "POST", "/metrics", NULL, NULL, 0), 405);
    ck_assert_int_eq(kvh_http_req(addr, "DELETE", "/stats", NULL, NULL, 0), 405);

    kvnode_close(c);
    free(addr);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(test_unix_listener_and_kvnodectl)
{
    kvh_daemon d;
    char dir[] = "/tmp/kvnode-admin-XXXXXX", conf[128], addr[96], cmd[PATH_MAX * 2];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(addr, sizeof addr, "unix:%s/admin.sock", dir);
    snprintf(conf, sizeof conf, "admin.listen=%s\n", addr);
    KVH_START(&d, conf);

    char *a = admin_addr(&d);
    ck_assert_str_eq(a, addr);
    free(a);
    char *text;
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/healthz", &text, NULL, 0), 200);
    free(text);
    ck_assert_int_eq(kvh_http_req(addr, NULL, "/metrics", &text, NULL, 0), 200);
    json_t *m = parse_metrics(&d, text);
    ASSERT_SAMPLE(m, "kvnode_worker_up", L("worker", "loop"), 1);
    json_decref(m);
    free(text);

    /* kvnodectl metrics finds the address in the stats and prints the page. */
    const char *ctl = getenv("KVNODECTL");
    if (ctl && access(ctl, X_OK) == 0) {
        const char *m_argv[] = { ctl, "-S", d.sock, "metrics", NULL };
        char *buf = NULL;
        ck_assert_int_eq(proc_run(&(struct proc_opts){ .argv = m_argv }, 10000, &buf, NULL), 0);
        ck_assert_msg(strstr(buf, "# TYPE kvnode_requests_total counter\n") &&
                      strstr(buf, "# TYPE kvnode_request_duration_seconds histogram\n") &&
                      strstr(buf, "kvnode_worker_up{worker=\"loop\"} 1\n"), "kvnodectl metrics printed:\n%s", buf);
        free(buf);
        /* --admin given explicitly (its "# TYPE " lines counted), and a wrong one fails with exit 4. */
        const char *a_argv[] = { ctl, "-S", d.sock, "metrics", "--admin", addr, NULL };
        ck_assert_int_eq(proc_run(&(struct proc_opts){ .argv = a_argv }, 10000, &buf, NULL), 0);
        int families = 0;
        for (const char *l = buf; l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
            families += strncmp(l, "# TYPE ", 7) == 0;
        free(buf);
        ck_assert_msg(families >= 16, "kvnodectl metrics --admin: %d families", families);
        snprintf(cmd, sizeof cmd, "unix:%s/nothing.sock", dir);
        const char *w_argv[] = { ctl, "-S", d.sock, "metrics", "--admin", cmd, NULL };
        int st = proc_run(&(struct proc_opts){ .argv = w_argv, .err = PROC_NULL }, 10000, NULL, NULL);
        ck_assert_int_eq(WEXITSTATUS(st), 4);
    } else {
        fprintf(stderr, "test_daemon_admin: kvnodectl part SKIPPED: $KVNODECTL is not an executable\n");
    }

    KVH_STOP_OK(&d);
    /* The daemon removes its admin socket at exit. */
    snprintf(cmd, sizeof cmd, "%s/admin.sock", dir);
    ck_assert_msg(access(cmd, F_OK) != 0, "%s left behind", cmd);
    kvh_destroy(&d);
    rmdir(dir);
}
END_TEST

START_TEST(test_admin_off_and_bad_address)
{
    kvh_daemon d;
    /* The harness default: no admin listener, "admin": null in the stats. */
    KVH_START(&d, NULL);
    json_t *st = kvh_stats(&d);
    ck_assert_ptr_nonnull(st);
    ck_assert(json_is_null(json_object_get(st, "admin")));
    json_decref(st);
    KVH_STOP_DESTROY(&d);

    /* An address that cannot be bound stops the daemon at start, with a message. */
    ck_assert_int_eq(kvh_spawn(&d, "admin.listen=192.0.2.1:9\n"), 0);
    int status = kvh_wait_exit(&d, 10000);
    ck_assert_msg(status != 0 && status != KVH_EXIT_TIMEOUT, "status %d", status);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, "admin listen 192.0.2.1:9"), "log: %s", log ? log : "");
    free(log);
    kvh_destroy(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = { test_metrics_count_what_was_done, test_unix_listener_and_kvnodectl,
                                   test_admin_off_and_bad_address };
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = kvh_run_suite("daemon_admin", "admin", 60, tests, sizeof tests / sizeof tests[0]);
    curl_global_cleanup();
    return rc;
}
