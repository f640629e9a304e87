/* kvh_http: the tests' one libcurl request helper, kvh_http_try (the admin
 * HTTP listener, the simulators' endpoints, the persistence benchmark's
 * reading of the KVS simulator). Header-only: only programs that link
 * libcurl include it (the benchmark that shares harness.c without libcurl
 * does not). kvh_http_try needs no Check; the asserting kvh_http_req exists
 * where check.h was included first.
 *
 * Requests no client library would send go over raw sockets on purpose: a
 * Content-Length over the limit (kvcmctl_exchange in tests/sim/kvcmctl.h),
 * header blocks that never end from many connections held open at once
 * (the slow-client attacks of tests/integration/test_daemon_dos.c). */
#ifndef KVH_HTTP_H
#define KVH_HTTP_H

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
 * req_body (not NULL) is sent as application/json. Returns the status code,
 * -1 when no answer came within timeout_ms (*rc_out says why, e.g.
 * CURLE_OPERATION_TIMEDOUT; CURLE_URL_MALFORMAT: the URL does not fit;
 * CURLE_FAILED_INIT: no handle); *body (malloc'd,
 * may be NULL) and *ctype (static copy) when asked. The one place the tests
 * make a libcurl request. */
static inline long kvh_http_try(const char *addr, const char *method, const char *path, const char *req_body,
                                char **body, char *ctype, size_t ctlen, long timeout_ms, CURLcode *rc_out)
{
    struct curl_slist *hdrs = NULL;
    char url[512];
    struct kvh_http_body b = { NULL, 0 };
    long code = -1;
    bool is_unix = strncmp(addr, "unix:", 5) == 0;
    int ul = snprintf(url, sizeof url, "http://%s%s", is_unix ? "localhost" : addr, path);
    CURL *h = ul > 0 && (size_t)ul < sizeof url ? curl_easy_init() : NULL;
    if (!h) {
        if (rc_out)
            *rc_out = ul > 0 && (size_t)ul < sizeof url ? CURLE_FAILED_INIT : CURLE_URL_MALFORMAT;
        if (body)
            *body = NULL;
        if (ctype && ctlen)
            ctype[0] = '\0';
        return -1;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (is_unix)
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, addr + 5);
    if (method)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (req_body) {
        hdrs = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, req_body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(req_body));
    }
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kvh_http_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(h);
    if (rc_out)
        *rc_out = rc;
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (ctype) {
        char *ct = NULL;
        if (rc == CURLE_OK)
            curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
        snprintf(ctype, ctlen, "%s", ct ? ct : "");
    }
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    if (body)
        *body = b.p ? b.p : strdup("");
    else
        free(b.p);
    return code;
}

#ifdef CHECK_H
/* kvh_http_try with a 10 s bound; no answer fails the test. */
static inline long kvh_http_req(const char *addr, const char *method, const char *path, char **body, char *ctype,
                                size_t ctlen)
{
    CURLcode rc = CURLE_OK;
    long code = kvh_http_try(addr, method, path, NULL, body, ctype, ctlen, 10000L, &rc);
    ck_assert_msg(rc == CURLE_OK, "%s http://%s%s: %s", method ? method : "GET", addr, path,
                  curl_easy_strerror(rc));
    return code;
}

#endif

#endif
