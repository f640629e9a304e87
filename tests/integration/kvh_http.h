/* kvh_http: a minimal libcurl GET/request helper for integration tests that
 * talk to the admin HTTP listener. Header-only: only tests that link libcurl
 * include it (the benchmark, which shares harness.c, does not). */
#ifndef KVH_HTTP_H
#define KVH_HTTP_H

#include <check.h>
#include <curl/curl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvh_http_body { char *p; size_t n; };

static inline size_t kvh_http_sink(char *p, size_t size, size_t n, void *arg)
{
    struct kvh_http_body *b = arg;
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

/* GET (or `method`) http://ADDR/path; ADDR "unix:PATH" goes over that socket.
 * Returns the status code; *body (malloc'd, may be NULL) and *ctype (static
 * copy) when asked. */
static inline long kvh_http_req(const char *addr, const char *method, const char *path, char **body, char *ctype,
                     size_t ctlen)
{
    char url[512];
    struct kvh_http_body b = { NULL, 0 };
    long code = -1;
    CURL *h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    bool is_unix = strncmp(addr, "unix:", 5) == 0;
    snprintf(url, sizeof url, "http://%s%s", is_unix ? "localhost" : addr, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (is_unix)
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, addr + 5);
    if (method)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kvh_http_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(h);
    ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method ? method : "GET", url, curl_easy_strerror(rc));
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (ctype) {
        char *ct = NULL;
        curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
        snprintf(ctype, ctlen, "%s", ct ? ct : "");
    }
    curl_easy_cleanup(h);
    if (body)
        *body = b.p ? b.p : strdup("");
    else
        free(b.p);
    return code;
}

#endif
