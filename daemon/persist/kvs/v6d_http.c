/* kvs/v6d HTTP: the control plane — one call over the handle's libcurl easy
 * handle with its reply body capped, exact status checks, the lease calls
 * (seal, release, discard) and acquire. Worker threads, one handle each. */
#include "persist/kvs/v6d_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"

/* ---- control plane ------------------------------------------------------------- */

size_t v6d_body_sink(char *p, size_t size, size_t nmemb, void *arg)
{
    struct kvs_store *s = arg;
    size_t add = size * nmemb;
    if (add > V6D_MAX_HTTP_BODY - s->body_len) {
        s->body_overflow = true;
        return 0;                                    /* aborts the transfer */
    }
    if (s->body_len + add + 1 > s->body_cap) {
        size_t cap = s->body_cap ? s->body_cap : 4096;
        while (cap < s->body_len + add + 1)
            cap *= 2;
        char *q = realloc(s->body, cap);
        if (!q)
            return 0;
        s->body = q;
        s->body_cap = cap;
    }
    memcpy(s->body + s->body_len, p, add);
    s->body_len += add;
    s->body[s->body_len] = '\0';
    return add;
}

/* One call: GET when json is NULL, else POST json. 0 with *status, or < 0. */
static int http_call(struct kvs_store *s, const char *name, const char *json, long *status,
                     char *err, size_t errlen)
{
    char url[1024];
    if ((size_t)snprintf(url, sizeof url, "%s/%s", s->base_url, name) >= sizeof url) {
        errmsg_set(err, errlen, "%s: URL too long", name);
        return -KVNODE_EINVAL;
    }
    s->body_len = 0;
    s->body_overflow = false;
    if (s->body)
        s->body[0] = '\0';
    curl_easy_setopt(s->curl, CURLOPT_URL, url);
    if (json) {
        curl_easy_setopt(s->curl, CURLOPT_POST, 1L);
        curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS, json);
        curl_easy_setopt(s->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(json));
    } else {
        curl_easy_setopt(s->curl, CURLOPT_HTTPGET, 1L);
    }
    CURLcode c = curl_easy_perform(s->curl);
    if (c != CURLE_OK) {
        if (s->body_overflow) {
            errmsg_set(err, errlen, "%s: reply body over %u bytes refused", name,
                       V6D_MAX_HTTP_BODY);
            return -KVNODE_ETOOBIG;
        }
        errmsg_set(err, errlen, "%s: %s (%s)", name, curl_easy_strerror(c), url);
        if (c == CURLE_OPERATION_TIMEDOUT)
            return -KVNODE_ETIMEDOUT;
        if (c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST)
            return -KVNODE_ECONNECT;
        return -KVNODE_EIO;
    }
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, status);
    return 0;
}

/* A call that must answer `want`. */
int v6d_http_expect(struct kvs_store *s, const char *name, const char *json, long want,
                    char *err, size_t errlen)
{
    long st = 0;
    int rc = http_call(s, name, json, &st, err, errlen);
    if (rc < 0)
        return rc;
    if (st != want) {
        char sn[SNIPPET];
        errmsg_snippet(s->body ? s->body : "", s->body_len, sn, sizeof sn);
        errmsg_set(err, errlen, "%s: HTTP %ld (expected %ld): %s", name, st, want, sn);
        return -KVNODE_EIO;
    }
    return 0;
}

int v6d_lease_call(struct kvs_store *s, const char *name, const char *lease_id,
                   const char *request_id, char *err, size_t errlen)
{
    json_t *doc = request_id ? json_pack("{s:s, s:s}", "lease_id", lease_id, "request_id",
                                         request_id)
                             : json_pack("{s:s}", "lease_id", lease_id);
    char *js = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!js) {
        errmsg_set(err, errlen, "%s: out of memory", name);
        return -KVNODE_ENOMEM;
    }
    int rc = v6d_http_expect(s, name, js, 204, err, errlen);
    free(js);
    return rc;
}

void v6d_next_request_id(struct kvs_store *s, char *buf, size_t len)
{
    snprintf(buf, len, "%ld-%u-%" PRIu64, (long)getpid(), s->id, ++s->counter);
}

/* acquire: POST body, expect 200, parse for keys. rc < 0 with lease_id set
 * means a lease was granted and must still be ended. */
int v6d_acquire(struct kvs_store *s, json_t *req, const char *const *keys, size_t n,
                bool create, char *lease_id, struct v6d_obj *objs, char *err, size_t errlen)
{
    lease_id[0] = '\0';
    char *js = json_dumps(req, JSON_COMPACT);
    if (!js) {
        errmsg_set(err, errlen, "acquire: out of memory");
        return -KVNODE_ENOMEM;
    }
    int rc = v6d_http_expect(s, "acquire", js, 200, err, errlen);
    free(js);
    if (rc < 0)
        return rc;
    return v6d_parse_acquire(s->body ? s->body : "", s->body_len, keys, n, lease_id, LEASE_MAX,
                             objs, create, err, errlen);
}
