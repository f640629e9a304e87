/* Integration: the /stats and /metrics documents, key by key, against the
 * golden copies in tests/golden/ (stats.txt, metrics.txt).
 *
 * A fixed run of traffic (host and simulated HBM tiers, a write_through file
 * store, puts, gets, matches, deletes, re-puts) is done against a fresh
 * daemon; both documents are then flattened to one line per value (/stats:
 * "path<TAB>type<TAB>value", /metrics: each line as it is) and compared line
 * by line with the golden copies. Values that depend on time, the machine or
 * the temporary directory (uptime, latencies, addresses, paths, RSS, ...)
 * are masked as "*": their key stays compared, the value is not.
 *
 * This pins the documents while the code that produces them is restructured:
 * a renamed, lost or added key, or a counter that changed, fails here.
 * A deliberate change of the documents is recorded with
 *   KVNODE_UPDATE_GOLDEN=1 build/tests/test_daemon_statsdoc
 * and reviewed in the diff of tests/golden/. */
#include <check.h>

#include <fnmatch.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../common/kvh_http.h"

#define BB    (16u << 10)   /* block bytes */
#define CHAIN 16            /* keys per chain */

/* /stats paths (fnmatch patterns over the flattened path) whose values vary
 * from run to run. */
static const char *const stats_volatile[] = {
    "admin", "socket", "pid", "version", "uptime_s", "*.last_error", "*seconds*",
    "admin_connections.accepted_total", "kvs_server.http_address", "kvs_server.socket_path",
    "tiers.host.numa",   /* "one node" here, "interleaved" on a machine of several */
    /* the file store: O_DIRECT where the file system takes it (padding) */
    "persist.file.direct_io", "persist.file.disk_bytes",
    NULL,
};

/* /metrics series (fnmatch patterns over the series name with its labels)
 * whose values vary from run to run. */
static const char *const metrics_volatile[] = {
    "kvnode_build_info*", "kvnode_uptime_seconds*", "kvnode_start_time_seconds*", "*_seconds_bucket*",
    "*_seconds_sum*", "process_*", "kvnode_admin_connections_accepted_total*",
    "kvnode_persist_file_direct_io*", "kvnode_persist_file_bytes{kind=\"disk\"}*", NULL,
};

static bool matches_any(const char *const *pats, const char *s)
{
    for (size_t i = 0; pats[i]; i++)
        if (fnmatch(pats[i], s, 0) == 0)
            return true;
    return false;
}

/* ---- flattening ---------------------------------------------------------------- */

struct lines {
    char **v;
    size_t n, cap;
};

static void lines_add(struct lines *l, char *s)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        ck_assert_ptr_nonnull(l->v);
    }
    l->v[l->n++] = s;
}

static int cmp_line(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void lines_sort(struct lines *l)
{
    if (l->n)
        qsort(l->v, l->n, sizeof *l->v, cmp_line);
}

static void lines_free(struct lines *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
}

static void flatten(json_t *v, const char *path, struct lines *out)
{
    char sub[512], *line = NULL;
    const char *type = "null";
    char value[256] = "";

    if (json_is_object(v)) {
        const char *k;
        json_t *e;
        if (json_object_size(v) == 0)
            type = "object";
        json_object_foreach(v, k, e) {
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
            flatten(e, sub, out);
        }
        if (json_object_size(v) > 0)
            return;
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        if (json_array_size(v) == 0)
            type = "array";
        json_array_foreach(v, i, e) {
            snprintf(sub, sizeof sub, "%s.%zu", path, i);
            flatten(e, sub, out);
        }
        if (json_array_size(v) > 0)
            return;
    } else if (json_is_integer(v)) {
        type = "int";
        snprintf(value, sizeof value, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    } else if (json_is_real(v)) {
        type = "real";
        snprintf(value, sizeof value, "%.6g", json_real_value(v));
    } else if (json_is_string(v)) {
        type = "string";
        snprintf(value, sizeof value, "%s", json_string_value(v));
    } else if (json_is_boolean(v)) {
        type = "bool";
        snprintf(value, sizeof value, "%s", json_is_true(v) ? "true" : "false");
    }
    if (matches_any(stats_volatile, path))
        snprintf(value, sizeof value, "*");
    ck_assert_int_ge(asprintf(&line, "%s\t%s\t%s", path, type, value), 0);
    lines_add(out, line);
}

/* Each line of the page; a sample's value is masked when its series is
 * volatile. */
static void metrics_lines(const char *page, struct lines *out)
{
    const char *p = page;

    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, len);
        ck_assert_ptr_nonnull(line);
        if (line[0] != '#') {
            char *sp = strrchr(line, ' ');
            if (sp) {
                *sp = '\0';
                if (matches_any(metrics_volatile, line)) {
                    char *masked = NULL;
                    ck_assert_int_ge(asprintf(&masked, "%s *", line), 0);
                    free(line);
                    line = masked;
                } else {
                    *sp = ' ';
                }
            }
        }
        if (len > 0)
            lines_add(out, line);
        else
            free(line);
        p += len + (nl ? 1 : 0);
    }
}

/* ---- golden files ------------------------------------------------------------- */

static void golden_path(const char *name, char *buf, size_t len)
{
    const char *srcdir = getenv("KVNODE_SRCDIR");
    snprintf(buf, len, "%s/tests/golden/%s", srcdir && *srcdir ? srcdir : ".", name);
}

static bool updating(void)
{
    const char *u = getenv("KVNODE_UPDATE_GOLDEN");
    return u && strcmp(u, "1") == 0;
}

/* Compare got with the golden file line by line (or write it when
 * updating); the assertion lists the first differences. */
static void compare_golden(const char *name, struct lines *got)
{
    char path[PATH_MAX];
    golden_path(name, path, sizeof path);
    lines_sort(got);
    if (updating()) {
        FILE *f = fopen(path, "w");
        ck_assert_msg(f != NULL, "cannot write %s", path);
        for (size_t i = 0; i < got->n; i++)
            fprintf(f, "%s\n", got->v[i]);
        ck_assert_int_eq(fclose(f), 0);
        fprintf(stderr, "statsdoc: wrote %zu lines to %s\n", got->n, path);
        return;
    }
    char *text = kvh_read_file(path, NULL);
    ck_assert_msg(text != NULL, "golden file: %s", kvh_error());
    struct lines want = { 0 };
    metrics_lines(text, &want);   /* splits lines; golden values are already masked */
    free(text);
    lines_sort(&want);

    char report[4096] = "";
    size_t used = 0, diffs = 0, i = 0, j = 0;
    while (i < want.n || j < got->n) {
        int c = i >= want.n ? 1 : j >= got->n ? -1 : strcmp(want.v[i], got->v[j]);
        if (c == 0) {
            i++;
            j++;
            continue;
        }
        diffs++;
        if (used < sizeof report - 300)
            used += (size_t)snprintf(report + used, sizeof report - used, "\n  %s %s",
                                     c < 0 ? "golden only:" : "now only:   ", c < 0 ? want.v[i] : got->v[j]);
        /* both lists are sorted: step past the smaller line */
        if (c < 0)
            i++;
        else
            j++;
    }
    lines_free(&want);
    ck_assert_msg(diffs == 0, "%s: %zu lines differ from tests/golden/%s (KVNODE_UPDATE_GOLDEN=1 records a "
                  "deliberate change):%s", name, diffs, name, report);
}

/* ---- /stats over HTTP (polling it over the engine socket would add
 * observer connections, and their counts, to the documents) ---- */

static json_t *http_stats(const char *admin)
{
    char *body = NULL;
    ck_assert_int_eq(kvh_http_req(admin, "GET", "/stats", &body, NULL, 0), 200);
    json_error_t jerr;
    json_t *st = body ? json_loads(body, 0, &jerr) : NULL;
    ck_assert_msg(st != NULL, "/stats is not JSON: %s", body ? jerr.text : "no body");
    free(body);
    return st;
}

static void wait_http_stat(const char *admin, const char *path, long long want)
{
    long long v = -1;
    for (uint64_t until = kvh_now_ms() + 20000; kvh_now_ms() < until; kvh_sleep_ms(20)) {
        json_t *st = http_stats(admin);
        v = kvh_json_int(st, path);
        json_decref(st);
        if (v == want)
            return;
    }
    ck_abort_msg("%s = %lld after 20 s, want %lld", path, v, want);
}

/* ---- the traffic ---------------------------------------------------------------- */

START_TEST(test_documents_match_the_golden_copies)
{
    char store[PATH_MAX], kvs_dir[PATH_MAX], conf[2 * PATH_MAX + 768];
    kvh_daemon d;

    ck_assert_msg(kvh_mkdtemp(store, sizeof store) == 0, "%s", kvh_error());
    ck_assert_msg(kvh_mkdtemp(kvs_dir, sizeof kvs_dir) == 0, "%s", kvh_error());
    snprintf(conf, sizeof conf,
             "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\n"
             "hbm.backend=sim\nhbm.bytes=1MiB\n"
             "admin.listen=127.0.0.1:0\n"
             "kvs_server.enabled=on\nkvs_server.listen=127.0.0.1:0\nkvs_server.socket_path=%s/kvs.sock\n"
             "persist.backend=file\npersist.path=%s\npersist.policy=write_through\npersist.fsync=never\n"
             "persist.workers=1\n", kvs_dir, store);
    KVH_START(&d, conf);
    json_t *first = kvh_stats(&d);   /* one observer connection: its HELLO and STATS are in the documents */
    ck_assert_msg(first != NULL, "stats: %s", kvh_error());
    char *admin = strdup(json_string_value(json_object_get(first, "admin")));
    json_decref(first);
    ck_assert_ptr_nonnull(admin);

    kvnode_layout host = kvh_layout("statsdoc-host", BB, 1, 0);
    kvnode_layout dev = kvh_layout("statsdoc-hbm", BB, 1, 0);
    kvnode_client *c = NULL, *g = NULL;
    KVH_CONNECT(&d, &host, &c);
    ck_assert_int_eq(kvnode_connect_device(d.sock, &dev, 0, &g), 0);

    kvnode_key a[CHAIN], b[CHAIN];
    kvh_chain(a, CHAIN, 1);
    kvh_chain(b, CHAIN, 2);
    size_t got = 0;
    ck_assert_msg(kvh_put(c, a, CHAIN, 10) == 0, "%s", kvh_error());
    ck_assert_msg(kvh_put_inline(g, b, CHAIN / 2, 20) == 0, "%s", kvh_error());
    ck_assert_msg(kvh_get_verify(c, a, CHAIN, 10, 1, &got) == 0 && got == CHAIN, "%s", kvh_error());
    ck_assert_msg(kvh_get_zc_verify(c, a, CHAIN / 2, 10, &got) == 0 && got == CHAIN / 2, "%s", kvh_error());
    ck_assert_msg(kvh_get_verify(g, b, CHAIN / 2, 20, 0, &got) == 0 && got == CHAIN / 2, "%s", kvh_error());
    ck_assert_int_eq(kvh_match(c, a, CHAIN), CHAIN);
    ck_assert_int_eq(kvh_match(g, b, CHAIN), CHAIN / 2);
    size_t deleted = 0;
    KVH_OK(c, kvnode_delete(c, a + CHAIN - 4, 4, &deleted));
    ck_assert_uint_eq(deleted, 4);
    ck_assert_int_eq(kvh_match(c, a, CHAIN), CHAIN - 4);
    ck_assert_msg(kvh_put(c, a + CHAIN - 4, 4, 10) == 0, "%s", kvh_error());

    /* Every write and delete has reached the store: the documents are still. */
    wait_http_stat(admin, "persist.written_blocks_total", CHAIN + 4 + CHAIN / 2);
    wait_http_stat(admin, "persist.queue_depth", 0);
    kvnode_close(g);
    kvnode_close(c);
    wait_http_stat(admin, "clients.connected", 0);

    char *page = NULL;
    ck_assert_int_eq(kvh_http_req(admin, "GET", "/metrics", &page, NULL, 0), 200);
    ck_assert_ptr_nonnull(page);
    json_t *http_st = http_stats(admin);

    struct lines sl = { 0 }, ml = { 0 };
    flatten(http_st, "", &sl);
    metrics_lines(page, &ml);
    compare_golden("stats.txt", &sl);
    compare_golden("metrics.txt", &ml);

    lines_free(&sl);
    lines_free(&ml);
    json_decref(http_st);
    free(page);
    free(admin);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = { test_documents_match_the_golden_copies };
    return kvh_run_suite("daemon_statsdoc", "statsdoc", 60, tests, sizeof tests / sizeof tests[0]);
}
