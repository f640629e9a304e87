/* kvnodectl: the commands that act on the daemon or reach its admin
 * listener: ping, reload, purge (engine socket) and metrics (HTTP, libcurl). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "ctl.h"

/* ------------------------------------------------------------------------ */
/* ping                                                                      */

int cmd_ping(const struct ctl *x)
{
    kvnode_client *c;
    int ex = ctl_connect(x, NULL, false, &c);
    if (ex)
        return ex;
    int rc = kvnode_ping(c);
    ex = rc < 0 ? lib_error(rc, c) : EXIT_OK;
    kvnode_close(c);
    if (!ex) {
        if (x->json) {
            json_t *o = json_pack("{s:b,s:s}", "alive", 1, "socket", x->socket);
            if (!o)
                oom();
            print_json(o, JSON_COMPACT);
            json_decref(o);
        } else {
            printf("kvnoded at %s is alive\n", x->socket);
        }
    }
    return ex;
}

/* ------------------------------------------------------------------------ */
/* purge                                                                     */

/* purge deployment ID [tenant NAME] | purge model NAME [tenant NAME] */
int cmd_purge(const struct ctl *x, char **args, int nargs)
{
    const char *dep = NULL, *model = NULL, *tenant = NULL;
    uint32_t namespaces = 0;
    uint64_t blocks = 0;

    if (nargs != 2 && nargs != 4)
        return usage_error("purge: expected 'deployment ID' or 'model NAME', then optionally 'tenant NAME'");
    for (int i = 0; i < nargs; i += 2) {
        const char *what = args[i], *val = args[i + 1];
        if (!*val)
            return usage_error("purge: %s: empty value", what);
        if (i == 0 && strcmp(what, "deployment") == 0)
            dep = val;
        else if (i == 0 && strcmp(what, "model") == 0)
            model = val;
        else if (i == 2 && strcmp(what, "tenant") == 0)
            tenant = val;
        else
            return usage_error("purge: unexpected '%s' (expected %s)", what,
                               i == 0 ? "'deployment' or 'model'" : "'tenant'");
    }
    kvnode_client *c;
    int ex = ctl_connect(x, NULL, false, &c);
    if (ex)
        return ex;
    int rc = kvnode_purge(c, tenant, dep, model, &namespaces, &blocks);
    if (rc < 0) {
        ex = lib_error(rc, c);
        kvnode_close(c);
        return ex;
    }
    kvnode_close(c);
    if (x->json) {
        json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:I}", "scope", dep ? "deployment" : "model",
                              "name", dep ? dep : model, "tenant", tenant ? tenant : "",
                              "namespaces", (json_int_t)namespaces, "blocks", (json_int_t)blocks);
        if (!o)
            oom();
        print_json(o, JSON_COMPACT);
        json_decref(o);
    } else {
        printf("purged %s %s%s%s: %" PRIu32 " namespaces, %" PRIu64 " blocks\n",
               dep ? "deployment" : "model", dep ? dep : model, tenant ? " of tenant " : "",
               tenant ? tenant : "", namespaces, blocks);
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* reload                                                                    */

int cmd_reload(const struct ctl *x)
{
    kvnode_client *c;
    char *not_applied = NULL;
    int ex = ctl_connect(x, NULL, false, &c);
    if (ex)
        return ex;
    int rc = kvnode_reload(c, &not_applied);
    if (rc < 0 && rc != -KVNODE_EINVAL) {
        ex = lib_error(rc, c);
        kvnode_close(c);
        return ex;
    }
    if (x->json) {
        json_t *o = json_pack("{s:b,s:s?,s:s?}", "applied", rc == 0,
                              "error", rc == 0 ? NULL : kvnode_last_error(c),
                              "not_applied", not_applied);
        if (!o)
            oom();
        print_json(o, JSON_COMPACT);
        json_decref(o);
    } else if (rc == 0) {
        printf("configuration reloaded\n");
        if (not_applied)
            printf("not applied (restart needed): %s\n", not_applied);
    } else {
        fprintf(stderr, "kvnodectl: reload failed; the running configuration is kept:\n%s\n",
                kvnode_last_error(c));
    }
    free(not_applied);
    kvnode_close(c);
    return rc == 0 ? EXIT_OK : EXIT_ERR;
}

/* ------------------------------------------------------------------------ */
/* metrics                                                                   */

/* metrics: GET /metrics from the admin listener ("HOST:PORT", "[V6]:PORT",
 * "unix:PATH" or an http:// URL); its address comes from --admin or the
 * stats document's "admin" field. */
static size_t metrics_sink(char *p, size_t size, size_t n, void *arg)
{
    return fwrite(p, size, n, arg);
}

int cmd_metrics(const struct ctl *x)
{
    json_t *doc = NULL;
    char *addr, *url;
    int ex = EXIT_OK;

    if (x->admin) {
        addr = xasprintf("%s", x->admin);
    } else {
        ex = fetch_stats(x, &doc);
        if (ex)
            return ex;
        const char *a = json_string_value(json_object_get(doc, "admin"));
        if (!a || !*a) {
            fprintf(stderr, PROG ": the daemon has no admin listener ([admin] listen = off); "
                    "pass --admin ADDR\n");
            json_decref(doc);
            return EXIT_ERR;
        }
        addr = xasprintf("%s", a);
        json_decref(doc);
    }
    bool is_unix = strncmp(addr, "unix:", 5) == 0;
    if (is_unix)
        url = xasprintf("http://localhost/metrics");
    else if (strncmp(addr, "http://", 7) == 0)
        url = xasprintf("%s%s", addr, addr[strlen(addr) - 1] == '/' ? "metrics" : "/metrics");
    else
        url = xasprintf("http://%s/metrics", addr);

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, PROG ": cannot initialise libcurl\n");
        free(addr);
        free(url);
        return EXIT_ERR;
    }
    CURL *h = curl_easy_init();
    char errbuf[CURL_ERROR_SIZE] = "";
    long status = 0;
    if (!h)
        oom();
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (is_unix)
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, addr + 5);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(x->timeout_ms > 0 ? x->timeout_ms : 10000));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, metrics_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, stdout);
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK) {
        fprintf(stderr, PROG ": cannot fetch %s%s%s: %s\n", url, is_unix ? " via " : "", is_unix ? addr : "",
                errbuf[0] ? errbuf : curl_easy_strerror(rc));
        ex = EXIT_CONNECT;
    } else if (status != 200) {
        fprintf(stderr, PROG ": %s answered HTTP %ld\n", url, status);
        ex = EXIT_ERR;
    } else if (fflush(stdout) != 0) {
        fprintf(stderr, PROG ": writing the output: %s\n", strerror(errno));
        ex = EXIT_ERR;
    }
    curl_easy_cleanup(h);
    curl_global_cleanup();
    free(addr);
    free(url);
    return ex;
}
