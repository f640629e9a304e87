/* kvs/v6d: the rtp-llm KVS backend — open, close, health, and put / get /
 * exists in batches over one lease each (every granted lease is ended); del
 * and scan have nothing to send. Protocol and behaviour: see v6d.h; what the
 * pieces share: v6d_internal.h. */
#include "persist/kvs/v6d_internal.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/curlinit.h"
#include "core/errmsg.h"
#include "kvnode.h"

#define KEY_MAX     (V6D_STORE_NS_MAX + V6D_DEPLOYMENT_ID_MAX + 96)

static atomic_uint next_handle_id;

/* ---- backend ---------------------------------------------------------------------- */

static void v6d_close(struct kvs_store *s)
{
    if (!s)
        return;
    v6d_dp_down(s);
    if (s->curl)
        curl_easy_cleanup(s->curl);
    curl_slist_free_all(s->hdrs);
    free(s->body);
    free(s->base_url);
    free(s->sock_path);
    free(s);
}

static int v6d_open(const struct kvs_config *cfg, struct kvs_store **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    if (!cfg->url || !*cfg->url || !cfg->socket_path || !*cfg->socket_path) {
        errmsg_set(err, errlen, "v6d: %s%s%s required", !cfg->url || !*cfg->url ? "url" : "",
                   (!cfg->url || !*cfg->url) && (!cfg->socket_path || !*cfg->socket_path)
                       ? " and " : "",
                   !cfg->socket_path || !*cfg->socket_path ? "socket_path" : "");
        return -KVNODE_EINVAL;
    }
    CURLcode curl_init_rc = curlinit_once();
    if (curl_init_rc != CURLE_OK) {
        errmsg_set(err, errlen, "v6d: curl_global_init: %s", curl_easy_strerror(curl_init_rc));
        return -KVNODE_EIO;
    }
    struct kvs_store *s = calloc(1, sizeof *s);
    if (!s) {
        errmsg_set(err, errlen, "v6d: out of memory");
        return -KVNODE_ENOMEM;
    }
    s->dp_fd = -1;
    s->id = atomic_fetch_add(&next_handle_id, 1) + 1;
    s->connect_timeout_ms = cfg->connect_timeout_ms ? cfg->connect_timeout_ms
                                                    : V6D_DEFAULT_CONNECT_TIMEOUT_MS;
    s->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : V6D_DEFAULT_TIMEOUT_MS;
    if ((cfg->object_namespace && strlen(cfg->object_namespace) >= V6D_OBJECT_NS_MAX) ||
        (cfg->tenant && strlen(cfg->tenant) >= NS_TENANT_MAX)) {
        errmsg_set(err, errlen, "v6d: object namespace of %zu bytes (at most %d) or tenant name of %zu "
                   "(at most %d)", cfg->object_namespace ? strlen(cfg->object_namespace) : 0,
                   V6D_OBJECT_NS_MAX - 1, cfg->tenant ? strlen(cfg->tenant) : 0, NS_TENANT_MAX - 1);
        free(s);
        return -KVNODE_EINVAL;
    }
    /* A named tenant's objects live under a namespace of its own. */
    v6d_tenant_object_ns(cfg->object_namespace, cfg->tenant, s->object_ns, sizeof s->object_ns);
    s->base_url = strdup(cfg->url);
    s->sock_path = strdup(cfg->socket_path);
    s->curl = curl_easy_init();
    s->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h2 = s->hdrs ? curl_slist_append(s->hdrs, "Expect:") : NULL;
    if (!s->base_url || !s->sock_path || !s->curl || !h2) {
        errmsg_set(err, errlen, "v6d: out of memory");
        v6d_close(s);
        return -KVNODE_ENOMEM;
    }
    s->hdrs = h2;
    size_t ul = strlen(s->base_url);
    while (ul > 0 && s->base_url[ul - 1] == '/')
        s->base_url[--ul] = '\0';
    CURL *c = s->curl;
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)s->connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)s->timeout_ms);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, s->hdrs);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, v6d_body_sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
    int rc = v6d_dp_connect(s, err, errlen);
    if (rc < 0) {
        v6d_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

static int v6d_health(struct kvs_store *s, char *err, size_t errlen)
{
    int rc = v6d_http_expect(s, "health", NULL, 200, err, errlen);
    if (rc < 0)
        return rc;
    if (!v6d_dp_alive(s) && (rc = v6d_dp_connect(s, err, errlen)) < 0)
        return rc;
    return 0;
}

/* Best-effort end of a lease after a failure (err keeps the first failure):
 * a create lease is discarded — only discarded, as rtp-llm's client does: a
 * discarded lease is gone — and a read lease released. */
static void abandon(struct kvs_store *s, const char *lease_id, bool discard)
{
    char ignore[64];
    if (!lease_id[0])
        return;
    v6d_lease_call(s, discard ? "discard" : "release", lease_id, NULL, ignore, sizeof ignore);
}

/* The distinct object keys of a batch: keys[0..m) with their strings,
 * first[j] the first item of key j, slot[i] the key of item i. */
struct batch {
    char (*k)[KEY_MAX];
    const char **keys;
    size_t *first, *slot;
    struct v6d_obj *objs;
    size_t m;
};

static void batch_free(struct batch *b)
{
    free(b->k);
    free(b->keys);
    free(b->first);
    free(b->slot);
    free(b->objs);
}

static void batch_fail(struct kvs_item *it, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        it[i].rc = rc;
}

/* put: every item must be one whole block (a get's len is only what the
 * caller expects: an object of another size is a miss). */
static int batch_make(struct kvs_store *s, struct kvs_item *it, size_t n, struct batch *b,
                      bool put, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    b->k = malloc(n * sizeof *b->k);
    b->keys = malloc(n * sizeof *b->keys);
    b->first = malloc(n * sizeof *b->first);
    b->slot = malloc(n * sizeof *b->slot);
    b->objs = malloc(n * sizeof *b->objs);
    const char *what = put ? "put" : "get";
    if (!b->k || !b->keys || !b->first || !b->slot || !b->objs) {
        errmsg_set(err, errlen, "v6d %s: out of memory", what);
        return -KVNODE_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        if (it[i].len == 0 || (put && it[i].len != it[i].ns->layout->block_bytes)) {
            errmsg_set(err, errlen, "v6d %s: %zu bytes for a block of %" PRIu64, what, it[i].len,
                       it[i].ns->layout->block_bytes);
            return -KVNODE_EINVAL;
        }
        if (v6d_object_key(s->object_ns, it[i].ns, it[i].key, it[i].check, b->k[b->m],
                           KEY_MAX) >= KEY_MAX) {
            errmsg_set(err, errlen, "v6d %s: object key too long", what);
            return -KVNODE_EINVAL;
        }
        size_t j;
        for (j = 0; j < b->m; j++)   /* batches are small (PERSIST_BATCH_MAX) */
            if (strcmp(b->k[j], b->k[b->m]) == 0)
                break;
        if (j == b->m) {
            b->keys[j] = b->k[j];
            b->first[j] = i;
            b->m++;
        }
        b->slot[i] = j;
    }
    return 0;
}

/* rtp-llm's store (KVSClient::store): one acquire(create, ignore_existing)
 * for every object, copy, seal, release; on any failure after the acquire
 * only discard. An empty lease_id means everything exists already; objects
 * left out of a non-empty lease exist too (their old bytes stay). */
static int v6d_put_batch(struct kvs_store *s, struct kvs_item *it, size_t n, char *err,
                         size_t errlen)
{
    struct batch b;
    char rid[64], lease[LEASE_MAX] = "";
    json_t *req = NULL;
    int rc = n ? batch_make(s, it, n, &b, true, err, errlen) : 0;
    if (n == 0)
        return 0;
    if (rc < 0)
        goto fail;
    if ((rc = v6d_dp_ensure(s, err, errlen)) < 0)
        goto fail;
    v6d_next_request_id(s, rid, sizeof rid);
    json_t *keys = json_array(), *metas = json_array();
    for (size_t j = 0; keys && metas && j < b.m; j++)
        if (json_array_append_new(keys, json_string(b.keys[j])) < 0 ||
            json_array_append_new(metas, json_pack("{s:I, s:s}", "size",
                                                   (json_int_t)it[b.first[j]].len,
                                                   "layout", V6D_LAYOUT)) < 0)
            break;
    if (keys && metas && json_array_size(keys) == b.m && json_array_size(metas) == b.m)
        req = json_pack("{s:s, s:o, s:o, s:i, s:s, s:b}", "scope", "create", "object_keys", keys,
                        "object_metas", metas, "term", V6D_TERM_S, "request_id", rid,
                        "ignore_existing", 1);
    else {
        json_decref(keys);
        json_decref(metas);
    }
    if (!req) {
        errmsg_set(err, errlen, "v6d put: out of memory");
        rc = -KVNODE_ENOMEM;
        goto fail;
    }
    rc = v6d_acquire(s, req, b.keys, b.m, true, lease, b.objs, err, errlen);
    json_decref(req);
    if (rc < 0)
        goto fail;
    if (!lease[0])
        goto ok;                                      /* everything is stored already */
    for (size_t j = 0; j < b.m; j++) {
        const struct v6d_obj *o = &b.objs[j];
        size_t len = it[b.first[j]].len;
        if (o->present && (o->size != len || o->offset > s->map_size ||
                           o->size > s->map_size - o->offset)) {
            errmsg_set(err, errlen, "v6d put: store gave %" PRIu64 " bytes at offset %" PRIu64
                       " for %s (block %zu bytes, mapping %zu bytes): refused", o->size,
                       o->offset, b.keys[j], len, s->map_size);
            rc = -KVNODE_EPROTO;
            goto fail;
        }
    }
    if (!v6d_dp_alive(s)) {
        errmsg_set(err, errlen, "v6d put: data-plane connection lost (store restarted?)");
        rc = -KVNODE_ECLOSED;
        goto fail;
    }
    for (size_t j = 0; j < b.m; j++)
        if (b.objs[j].present)
            memcpy(s->map + b.objs[j].offset, it[b.first[j]].src, it[b.first[j]].len);
    if ((rc = v6d_lease_call(s, "seal", lease, rid, err, errlen)) < 0)
        goto fail;
    /* Sealed objects stay after release; a failed release only leaves the
     * lease to its term (rtp-llm logs it and goes on). */
    char ignore[64];
    v6d_lease_call(s, "release", lease, NULL, ignore, sizeof ignore);
ok:
    batch_fail(it, n, 0);
    batch_free(&b);
    return 0;
fail:
    abandon(s, lease, true);
    batch_fail(it, n, rc);
    batch_free(&b);
    return rc;
}

static int v6d_read_acquire(struct kvs_store *s, const char *const *keys, size_t n,
                            char *lease, struct v6d_obj *objs, char *err, size_t errlen)
{
    char rid[64];
    v6d_next_request_id(s, rid, sizeof rid);
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, json_string(keys[i])) < 0) {
            json_decref(arr);
            arr = NULL;
        }
    json_t *req = arr ? json_pack("{s:s, s:o, s:i, s:s, s:i, s:s, s:b}", "scope", "read",
                                  "object_keys", arr, "term", V6D_TERM_S, "peer", "local",
                                  "wait_timeout", 0, "request_id", rid, "best_effort", 1)
                      : NULL;
    if (!req) {
        lease[0] = '\0';
        errmsg_set(err, errlen, "v6d: out of memory");
        return -KVNODE_ENOMEM;
    }
    int rc = v6d_acquire(s, req, keys, n, false, lease, objs, err, errlen);
    json_decref(req);
    return rc;
}

/* One acquire(read) for every object, copy what is there, one release. Per
 * item: 0, KVS_MISS (absent, or of another size: never read past an
 * object), -KVNODE_EPROTO (outside the mapping). */
static int v6d_get_batch(struct kvs_store *s, struct kvs_item *it, size_t n, char *err,
                         size_t errlen)
{
    struct batch b;
    char lease[LEASE_MAX] = "";
    int rc = n ? batch_make(s, it, n, &b, false, err, errlen) : 0;
    if (n == 0)
        return 0;
    if (rc < 0)
        goto fail;
    if ((rc = v6d_dp_ensure(s, err, errlen)) < 0)
        goto fail;
    if ((rc = v6d_read_acquire(s, b.keys, b.m, lease, b.objs, err, errlen)) < 0)
        goto fail;
    if (!v6d_dp_alive(s)) {
        errmsg_set(err, errlen, "v6d get: data-plane connection lost (store restarted?)");
        rc = -KVNODE_ECLOSED;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {   /* a key asked twice is copied twice */
        const struct v6d_obj *o = &b.objs[b.slot[i]];
        const char *key = b.keys[b.slot[i]];
        if (!o->present) {
            it[i].rc = KVS_MISS;
        } else if (o->offset > s->map_size || o->size > s->map_size - o->offset) {
            errmsg_set(err, errlen, "v6d get: object %s at %" PRIu64 "+%" PRIu64
                       " lies outside the %zu-byte mapping", key, o->offset, o->size,
                       s->map_size);
            it[i].rc = -KVNODE_EPROTO;
        } else if (o->size != it[i].len) {
            errmsg_set(err, errlen, "v6d get: object %s holds %" PRIu64 " bytes, expected %zu: "
                       "treated as a miss", key, o->size, it[i].len);
            it[i].rc = KVS_MISS;
        } else {
            memcpy(it[i].dst, s->map + o->offset, it[i].len);
            it[i].rc = 0;
        }
    }
    if (lease[0]) {
        char ignore[64];
        v6d_lease_call(s, "release", lease, NULL, ignore, sizeof ignore);
    }
    batch_free(&b);
    return 0;
fail:
    abandon(s, lease, false);
    batch_fail(it, n, rc);
    batch_free(&b);
    return rc;
}

static int v6d_put(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                   const void *data, size_t len, char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .check = check, .src = data, .len = len };
    v6d_put_batch(s, &it, 1, err, errlen);
    return it.rc;
}

static int v6d_get(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                   void *data, size_t len, char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .check = check, .dst = data, .len = len };
    v6d_get_batch(s, &it, 1, err, errlen);
    return it.rc;
}

/* No delete in the protocol for a sealed object (discard ends unsealed
 * create leases only): nothing to send. The backend says so
 * (keeps_deleted), and persist hides deleted keys with tombstones. */
static int v6d_del(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                   char *err, size_t errlen)
{
    (void)s; (void)ns; (void)key; (void)check; (void)err; (void)errlen;
    return 0;
}

#define CHECK_AT(checks, i) ((checks) ? (checks)[i] : 0)

static int v6d_exists(struct kvs_store *s, const struct kvs_ns *ns, const int64_t *keys,
                      const uint64_t *checks, size_t n, uint8_t *present, char *err, size_t errlen)
{
    char (*k)[KEY_MAX] = NULL;
    const char **kp = NULL;
    size_t *map = NULL;
    struct v6d_obj *objs = NULL;
    char lease[LEASE_MAX] = "";
    int rc = 0;
    memset(present, 0, n);
    if (n == 0)
        return 0;
    size_t chunk = n < V6D_EXISTS_CHUNK ? n : V6D_EXISTS_CHUNK;
    k = malloc(chunk * sizeof *k);
    kp = malloc(chunk * sizeof *kp);
    map = malloc(chunk * sizeof *map);
    objs = malloc(chunk * sizeof *objs);
    if (!k || !kp || !map || !objs) {
        errmsg_set(err, errlen, "v6d exists: out of memory");
        rc = -KVNODE_ENOMEM;
        goto out;
    }
    if ((rc = v6d_dp_ensure(s, err, errlen)) < 0)
        goto out;
    for (size_t at = 0; at < n;) {
        size_t m = 0;
        /* up to `chunk` distinct keys (the store wants distinct object_keys) */
        size_t i;
        for (i = at; i < n && m < chunk; i++) {
            bool dup = false;
            for (size_t j = at; j < i && !dup; j++)
                dup = keys[j] == keys[i] && CHECK_AT(checks, j) == CHECK_AT(checks, i);
            if (dup)
                continue;
            /* A word is part of the object key: another word's block is
             * another object, absent here (never KVS_PRESENT_OTHER_WORD). */
            if (v6d_object_key(s->object_ns, ns, keys[i], CHECK_AT(checks, i), k[m],
                               KEY_MAX) >= KEY_MAX) {
                errmsg_set(err, errlen, "v6d exists: object key too long");
                rc = -KVNODE_EINVAL;
                goto out;
            }
            kp[m] = k[m];
            map[m++] = i;
        }
        rc = v6d_read_acquire(s, kp, m, lease, objs, err, errlen);
        if (rc < 0) {
            abandon(s, lease, false);
            goto out;
        }
        for (size_t j = 0; j < m; j++)
            if (objs[j].present)
                for (size_t q = at; q < i; q++)
                    if (keys[q] == keys[map[j]] && CHECK_AT(checks, q) == CHECK_AT(checks, map[j]))
                        present[q] = 1;
        if (lease[0] && (rc = v6d_lease_call(s, "release", lease, NULL, err, errlen)) < 0)
            goto out;
        at = i;
    }
out:
    if (rc < 0)
        memset(present, 0, n);
    free(k);
    free(kp);
    free(map);
    free(objs);
    return rc;
}

static int v6d_scan(struct kvs_store *s, struct kvs_scan **cursor, size_t budget,
                    void (*found)(void *arg, const struct kvs_found *f), void *arg, char *err,
                    size_t errlen)
{
    (void)s; (void)budget; (void)found; (void)arg; (void)err; (void)errlen;
    *cursor = NULL;
    return 1;   /* nothing we could enumerate: complete, nothing found */
}

const struct kvs_backend kvs_backend_v6d = {
    .name = "v6d",
    .open = v6d_open,
    .health = v6d_health,
    .put = v6d_put,
    .get = v6d_get,
    .del = v6d_del,
    .exists = v6d_exists,
    .scan = v6d_scan,
    .close = v6d_close,
    .put_batch = v6d_put_batch,
    .get_batch = v6d_get_batch,
    .keeps_deleted = true,
};
