/* kvs/redis: the Redis Cluster backend (see redis.h): keys, values and their
 * checks, and the kvs_backend calls as pipelined batches over rcl_run. */
#include "persist/kvs/redis.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/le.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "persist/kvs/crc32c.h"
#include "persist/kvs/redis_cluster.h"

#define KEY_MAX (32 + NS_TENANT_MAX + NS_EXTRA_MAX + 160)

struct kvs_store {
    struct rcl *cl;
    char tenant[NS_TENANT_MAX];
};

static const char *tenant_or_default(const char *t)
{
    return t && *t ? t : "default";
}

size_t redis_block_key(const char *tenant, const struct kvs_ns *ns, int64_t key, char *buf,
                       size_t len)
{
    int w = snprintf(buf, len, REDIS_KEY_PREFIX "/%s/%s/%" PRIu32 "/%" PRId64,
                     tenant_or_default(tenant), ns->deployment_id ? ns->deployment_id : "",
                     ns->layout->tp_rank, key);
    return w < 0 ? len : (size_t)w;
}

size_t redis_header_len(const char *tenant)
{
    return REDIS_HDR_FIXED + strlen(tenant_or_default(tenant));
}


enum { OFF_VERSION = 4, OFF_HLEN = 6, OFF_FP = 8, OFF_KEY = 16, OFF_SIZE = 24, OFF_RANK = 32,
       OFF_TLEN = 36, OFF_CRC = 40, OFF_CHECK = 48 };

/* CRC of a value: header (fixed bytes of its version) with its CRC field as
 * 0, tenant, payload. */
static uint32_t value_crc(const uint8_t *hdr, size_t fixed_len, size_t hlen, const void *payload,
                          size_t len)
{
    uint8_t fixed[REDIS_HDR_FIXED];
    memcpy(fixed, hdr, fixed_len);
    le_put32(fixed + OFF_CRC, 0);
    uint32_t crc = crc32c(0, fixed, fixed_len);
    crc = crc32c(crc, hdr + fixed_len, hlen - fixed_len);
    return crc32c(crc, payload, len);
}

/* The fixed header bytes of a value version (0: unknown version). */
static size_t fixed_len_of(unsigned version)
{
    return version == REDIS_VERSION ? REDIS_HDR_FIXED
           : version == REDIS_VERSION_V1 ? REDIS_HDR_FIXED_V1 : 0;
}

int redis_header_word(const uint8_t *hdr, size_t hlen, uint64_t *word)
{
    *word = 0;
    if (hlen == 0)
        return KVS_MISS;
    if (hlen < REDIS_HDR_FIXED_V1 || memcmp(hdr, REDIS_MAGIC, 4) != 0)
        return KVS_CORRUPT;
    size_t fixed = fixed_len_of(le_get16(hdr + OFF_VERSION));
    if (fixed == 0 || hlen < fixed)
        return KVS_CORRUPT;
    if (fixed == REDIS_HDR_FIXED)
        *word = le_get64(hdr + OFF_CHECK);
    return 0;
}

void redis_header_make(const char *tenant, const struct kvs_ns *ns, int64_t key, uint64_t check,
                       const void *payload, size_t len, uint8_t *hdr)
{
    const char *t = tenant_or_default(tenant);
    size_t tl = strlen(t), hlen = REDIS_HDR_FIXED + tl;
    memset(hdr, 0, REDIS_HDR_FIXED);
    memcpy(hdr, REDIS_MAGIC, 4);
    le_put16(hdr + OFF_VERSION, REDIS_VERSION);
    le_put16(hdr + OFF_HLEN, (uint16_t)hlen);
    le_put64(hdr + OFF_FP, ns->fingerprint);
    le_put64(hdr + OFF_KEY, (uint64_t)key);
    le_put64(hdr + OFF_SIZE, len);
    le_put32(hdr + OFF_RANK, ns->layout->tp_rank);
    le_put16(hdr + OFF_TLEN, (uint16_t)tl);
    le_put64(hdr + OFF_CHECK, check);
    memcpy(hdr + REDIS_HDR_FIXED, t, tl);
    le_put32(hdr + OFF_CRC, value_crc(hdr, REDIS_HDR_FIXED, hlen, payload, len));
}

/* The checks of a value of vlen bytes whose header (its first min(vlen,
 * header length) bytes) is at h and whose payload is at payload, or right
 * after the header in h when payload is NULL. *payload_at: where the payload
 * starts in the value. */
static int value_check_parts(const char *tenant, const struct kvs_ns *ns, int64_t key,
                             uint64_t check, size_t len, const uint8_t *h, const void *payload,
                             size_t vlen, size_t *payload_at, char *err, size_t errlen)
{
    const char *t = tenant_or_default(tenant);
    size_t tl = strlen(t), fixed = 0, hlen = 0;
    const char *bad = NULL;
    if (vlen < REDIS_HDR_FIXED_V1 || memcmp(h, REDIS_MAGIC, 4) != 0)
        bad = "no kvnode header";
    else if ((fixed = fixed_len_of(le_get16(h + OFF_VERSION))) == 0 || vlen < fixed)
        bad = "header version";
    else if (le_get16(h + OFF_HLEN) != (hlen = fixed + tl) || le_get16(h + OFF_TLEN) != tl ||
             vlen < hlen || memcmp(h + fixed, t, tl) != 0)
        bad = "tenant";
    else if (le_get64(h + OFF_FP) != ns->fingerprint || le_get32(h + OFF_RANK) != ns->layout->tp_rank)
        bad = "deployment or rank";
    else if ((int64_t)le_get64(h + OFF_KEY) != key)
        bad = "block key";
    else if (le_get64(h + OFF_SIZE) != len || vlen - hlen != len)
        bad = "size";
    else if (le_get32(h + OFF_CRC) != value_crc(h, fixed, hlen, payload ? payload : h + hlen, len))
        bad = "CRC-32C";
    if (!bad) {
        *payload_at = hlen;
        /* Version 1 values predate check words: word 0. */
        uint64_t word = fixed == REDIS_HDR_FIXED ? le_get64(h + OFF_CHECK) : 0;
        if (word != check) {
            errmsg_set(err, errlen, "redis: key %" PRId64 " is stored under another check word "
                       "(another prefix's block: kept)", key);
            return KVS_MISMATCH;
        }
        return 0;
    }
    errmsg_set(err, errlen, "redis: stored value of key %" PRId64 " (%zu bytes): %s does not match; "
               "deleted", key, vlen, bad);
    return KVS_CORRUPT;
}

int redis_value_check(const char *tenant, const struct kvs_ns *ns, int64_t key, uint64_t check,
                      size_t len, const void *value, size_t vlen, size_t *payload_at, char *err,
                      size_t errlen)
{
    return value_check_parts(tenant, ns, key, check, len, value, NULL, vlen, payload_at, err,
                             errlen);
}

int redis_password_load(const char *path, char *buf, size_t len, char *err, size_t errlen)
{
    buf[0] = '\0';
    if (!path || !*path) {
        const char *env = getenv(REDIS_PASSWORD_ENV);
        if (env && strlen(env) >= len) {
            errmsg_set(err, errlen, "$%s: longer than %zu bytes", REDIS_PASSWORD_ENV, len - 1);
            return -KVNODE_EINVAL;
        }
        snprintf(buf, len, "%s", env ? env : "");
        return 0;
    }
    FILE *f = fopen(path, "re");
    if (!f) {
        errmsg_set(err, errlen, "password_file %s: %s (make it readable by kvnoded, mode 0600)",
                   path, strerror(errno));
        return -KVNODE_EINVAL;
    }
    size_t n = fread(buf, 1, len - 1, f);
    int bad = ferror(f) || (n == len - 1 && fgetc(f) != EOF);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (bad || buf[0] == '\0') {
        memset(buf, 0, len);
        errmsg_set(err, errlen, "password_file %s: %s", path,
                   bad ? "unreadable or longer than the limit" : "empty first line");
        return -KVNODE_EINVAL;
    }
    return 0;
}

/* ---- backend -------------------------------------------------------------------------- */

static void redis_close(struct kvs_store *s)
{
    if (!s)
        return;
    rcl_destroy(s->cl);
    free(s);
}

static int redis_open(const struct kvs_config *cfg, struct kvs_store **out, char *err,
                      size_t errlen)
{
    *out = NULL;
    if (cfg->tenant && strlen(cfg->tenant) >= NS_TENANT_MAX) {
        errmsg_set(err, errlen, "redis: tenant name of %zu bytes (at most %d)", strlen(cfg->tenant),
                   NS_TENANT_MAX - 1);
        return -KVNODE_EINVAL;
    }
    struct kvs_store *s = calloc(1, sizeof *s);
    if (!s) {
        errmsg_set(err, errlen, "redis: out of memory");
        return -KVNODE_ENOMEM;
    }
    snprintf(s->tenant, sizeof s->tenant, "%s", cfg->tenant ? cfg->tenant : "");
    const struct rcl_config rc = { .seeds = cfg->redis_nodes, .user = cfg->redis_user,
                                   .password = cfg->redis_password,
                                   .connect_timeout_ms = cfg->connect_timeout_ms,
                                   .timeout_ms = cfg->timeout_ms };
    char e[200];
    int r = rcl_create(&rc, &s->cl, e, sizeof e);
    if (r < 0) {
        errmsg_set(err, errlen, "redis: nodes: %s", e);
        free(s);
        return r;
    }
    /* A cluster that does not answer yet is no configuration error (the
     * caller starts degraded and opens again later); a refused password is. */
    if ((r = rcl_refresh(s->cl, err, errlen)) < 0) {
        redis_close(s);
        return r == -KVNODE_EDENIED ? -KVNODE_EINVAL : r;
    }
    *out = s;
    return 0;
}

static int redis_health(struct kvs_store *s, char *err, size_t errlen)
{
    return rcl_refresh(s->cl, err, errlen);
}

/* Run cmds, then fill each item's rc from its reply with fn. */
static void free_replies(struct rcl_cmd *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cmds[i].reply) {
            freeReplyObject(cmds[i].reply);
            cmds[i].reply = NULL;
        }
}

struct keys {
    char (*k)[KEY_MAX];
    struct rcl_cmd *cmds;
};

static int keys_make(struct kvs_store *s, struct kvs_item *it, size_t n, struct keys *b,
                     const char *verb, char *err, size_t errlen)
{
    b->k = malloc(n * sizeof *b->k);
    b->cmds = calloc(n, sizeof *b->cmds);
    if (!b->k || !b->cmds) {
        errmsg_set(err, errlen, "redis %s: out of memory", verb);
        return -KVNODE_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        size_t kl = redis_block_key(s->tenant, it[i].ns, it[i].key, b->k[i], KEY_MAX);
        if (kl >= KEY_MAX) {
            errmsg_set(err, errlen, "redis %s: key too long", verb);
            return -KVNODE_EINVAL;
        }
        b->cmds[i].argc = 2;
        b->cmds[i].argv[0] = verb;
        b->cmds[i].argvlen[0] = strlen(verb);
        b->cmds[i].argv[1] = b->k[i];
        b->cmds[i].argvlen[1] = kl;
    }
    return 0;
}

static void keys_free(struct keys *b, size_t n)
{
    if (b->cmds)
        free_replies(b->cmds, n);
    free(b->k);
    free(b->cmds);
}

static void items_fail(struct kvs_item *it, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        it[i].rc = rc;
}

static int redis_put_batch(struct kvs_store *s, struct kvs_item *it, size_t n, char *err,
                           size_t errlen)
{
    struct keys b = { 0 };
    char **vals = calloc(n ? n : 1, sizeof *vals);
    struct iovec (*iov)[3] = malloc((n ? n : 1) * sizeof *iov);
    size_t hlen = redis_header_len(s->tenant);
    int rc = vals && iov ? keys_make(s, it, n, &b, "SET", err, errlen) : -KVNODE_ENOMEM;
    if (!vals || !iov)
        errmsg_set(err, errlen, "redis SET: out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (it[i].len != it[i].ns->layout->block_bytes) {
            errmsg_set(err, errlen, "redis SET: %zu bytes for a block of %" PRIu64, it[i].len,
                       it[i].ns->layout->block_bytes);
            rc = -KVNODE_EINVAL;
            break;
        }
        /* SET <key> <header + payload> in RESP, sent with writev: the
         * prefix and header from here, the payload from where it is. */
        size_t kl = b.cmds[i].argvlen[1], vl = hlen + it[i].len;
        char *f = vals[i] = malloc(96 + kl + hlen);
        if (!f) {
            errmsg_set(err, errlen, "redis SET: out of memory");
            rc = -KVNODE_ENOMEM;
            break;
        }
        int pl = snprintf(f, 64, "*3\r\n$3\r\nSET\r\n$%zu\r\n", kl);
        memcpy(f + pl, b.k[i], kl);
        int vh = snprintf(f + pl + kl, 32, "\r\n$%zu\r\n", vl);
        uint8_t *hdr = (uint8_t *)f + pl + kl + vh;
        redis_header_make(s->tenant, it[i].ns, it[i].key, it[i].check, it[i].src, it[i].len, hdr);
        iov[i][0] = (struct iovec){ .iov_base = f, .iov_len = (size_t)pl + kl + (size_t)vh + hlen };
        iov[i][1] = (struct iovec){ .iov_base = (void *)it[i].src, .iov_len = it[i].len };
        iov[i][2] = (struct iovec){ .iov_base = (void *)"\r\n", .iov_len = 2 };
        b.cmds[i].iov = iov[i];
        b.cmds[i].iovcnt = 3;
    }
    if (rc == 0) {
        rc = rcl_run(s->cl, b.cmds, n, err, errlen);
        bool any_ok = false;
        for (size_t i = 0; i < n; i++) {
            redisReply *r = b.cmds[i].reply;
            if (!r) {
                it[i].rc = b.cmds[i].rc;
            } else if (r->type == REDIS_REPLY_ERROR) {
                /* OOM: maxmemory with noeviction; the store is full. */
                errmsg_set(err, errlen, "redis SET: %.160s", r->str);
                it[i].rc = strncmp(r->str, "OOM", 3) == 0 ? -KVNODE_ENOSPC : -KVNODE_EIO;
            } else {
                it[i].rc = 0;
                any_ok = true;
            }
        }
        if (rc == 0 || any_ok)
            rc = 0;
        else
            items_fail(it, n, rc);
    } else {
        items_fail(it, n, rc);
    }
    for (size_t i = 0; vals && i < n; i++)
        free(vals[i]);
    free(vals);
    free(iov);
    keys_free(&b, n);
    return rc;
}

/* Delete the values that failed their check (best effort: a failure leaves
 * them to be found corrupt again). */
static void delete_corrupt(struct kvs_store *s, struct keys *b, const struct kvs_item *it,
                           size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (it[i].rc == KVS_CORRUPT)
            m++;
    struct rcl_cmd *dels = m ? calloc(m, sizeof *dels) : NULL;
    if (!dels)
        return;
    m = 0;
    for (size_t i = 0; i < n; i++)
        if (it[i].rc == KVS_CORRUPT) {
            dels[m].argc = 2;
            dels[m].argv[0] = "DEL";
            dels[m].argvlen[0] = 3;
            dels[m].argv[1] = b->cmds[i].argv[1];
            dels[m].argvlen[1] = b->cmds[i].argvlen[1];
            m++;
        }
    char ignore[64];
    rcl_run(s->cl, dels, m, ignore, sizeof ignore);
    free_replies(dels, m);
    free(dels);
}

/* GET: each value is read from the socket straight into its header buffer
 * and the item's dst (rcl_cmd sink), then checked there; a value that fails
 * its check leaves dst with its bytes (the caller does not use dst unless
 * the item's rc is 0). */
static int redis_get_batch(struct kvs_store *s, struct kvs_item *it, size_t n, char *err,
                           size_t errlen)
{
    struct keys b = { 0 };
    size_t hlen = redis_header_len(s->tenant);
    uint8_t (*hdrs)[REDIS_HDR_FIXED + NS_TENANT_MAX] = malloc((n ? n : 1) * sizeof *hdrs);
    int rc = hdrs ? keys_make(s, it, n, &b, "GET", err, errlen) : -KVNODE_ENOMEM;
    if (!hdrs)
        errmsg_set(err, errlen, "redis GET: out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        b.cmds[i].sink[0] = (struct iovec){ .iov_base = hdrs[i], .iov_len = hlen };
        b.cmds[i].sink[1] = (struct iovec){ .iov_base = it[i].dst, .iov_len = it[i].len };
        b.cmds[i].sinkcnt = 2;
        b.cmds[i].sink_len = hlen + it[i].len;
    }
    if (rc == 0)
        rc = rcl_run(s->cl, b.cmds, n, err, errlen);
    if (rc < 0 && !b.cmds) {
        items_fail(it, n, rc);
        keys_free(&b, n);
        free(hdrs);
        return rc;
    }
    bool any_ok = false, corrupt = false;
    for (size_t i = 0; i < n; i++) {
        redisReply *r = b.cmds[i].reply;
        if (!r) {
            it[i].rc = b.cmds[i].rc < 0 ? b.cmds[i].rc : rc;
            continue;
        }
        any_ok = true;
        if (b.cmds[i].sunk) {
            size_t at = 0;
            it[i].rc = value_check_parts(s->tenant, it[i].ns, it[i].key, it[i].check, it[i].len,
                                         hdrs[i], it[i].dst, r->len, &at, err, errlen);
            if (it[i].rc == KVS_CORRUPT)
                corrupt = true;   /* a mismatched word is another prefix's: not deleted */
        } else if (r->type == REDIS_REPLY_NIL) {
            it[i].rc = KVS_MISS;        /* never written, deleted or evicted by the cluster */
        } else if (r->type != REDIS_REPLY_STRING) {
            errmsg_set(err, errlen, "redis GET: %.160s", r->type == REDIS_REPLY_ERROR ? r->str
                                                                               : "not a string");
            it[i].rc = -KVNODE_EIO;
            if (r->type != REDIS_REPLY_ERROR) {   /* another type under our key: remove it */
                it[i].rc = KVS_CORRUPT;
                corrupt = true;
            }
        } else {
            size_t at = 0;
            it[i].rc = redis_value_check(s->tenant, it[i].ns, it[i].key, it[i].check, it[i].len,
                                         r->str, r->len, &at, err, errlen);
            if (it[i].rc == 0)
                memcpy(it[i].dst, r->str + at, it[i].len);
            else if (it[i].rc == KVS_CORRUPT)
                corrupt = true;   /* a mismatched word is another prefix's: not deleted */
        }
    }
    if (corrupt)
        delete_corrupt(s, &b, it, n);
    keys_free(&b, n);
    free(hdrs);
    return any_ok ? 0 : rc;
}

static int redis_put(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                     const void *data, size_t len, char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .check = check, .src = data, .len = len };
    int rc = redis_put_batch(s, &it, 1, err, errlen);
    return rc < 0 ? rc : it.rc;
}

static int redis_get(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                     void *data, size_t len, char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .check = check, .dst = data, .len = len };
    int rc = redis_get_batch(s, &it, 1, err, errlen);
    return rc < 0 ? rc : it.rc;
}

/* What redis_words found under a key. */
enum { WORD_NONE = 0, WORD_SET = 1, WORD_BAD = 2 };

/* The check word of each item's stored value: GETRANGE of its header (a
 * header-sized prefix, never the block), pipelined. held[i]: WORD_SET with
 * words[i] set, WORD_NONE (no value), or WORD_BAD (not a kvnode value: its
 * GET finds it corrupt and removes it). */
static int redis_words(struct kvs_store *s, struct kvs_item *it, size_t n, uint64_t *words,
                       uint8_t *held, char *err, size_t errlen)
{
    struct keys b = { 0 };
    char (*frames)[64 + KEY_MAX] = malloc((n ? n : 1) * sizeof *frames);
    struct iovec *iov = malloc((n ? n : 1) * sizeof *iov);
    char end[24];
    int el = snprintf(end, sizeof end, "%zu", redis_header_len(s->tenant) - 1);
    int rc = frames && iov ? keys_make(s, it, n, &b, "GETRANGE", err, errlen) : -KVNODE_ENOMEM;
    if (!frames || !iov)
        errmsg_set(err, errlen, "redis GETRANGE: out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        /* GETRANGE <key> 0 <header length - 1> in RESP (four arguments). */
        size_t kl = b.cmds[i].argvlen[1];
        int fl = snprintf(frames[i], sizeof frames[i], "*4\r\n$8\r\nGETRANGE\r\n$%zu\r\n%.*s\r\n"
                          "$1\r\n0\r\n$%d\r\n%s\r\n", kl, (int)kl, b.k[i], el, end);
        iov[i] = (struct iovec){ .iov_base = frames[i], .iov_len = (size_t)fl };
        b.cmds[i].iov = &iov[i];
        b.cmds[i].iovcnt = 1;
    }
    if (rc == 0)
        rc = rcl_run(s->cl, b.cmds, n, err, errlen);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        redisReply *r = b.cmds[i].reply;
        if (r->type != REDIS_REPLY_STRING) {
            errmsg_set(err, errlen, "redis GETRANGE: %.160s",
                       r->type == REDIS_REPLY_ERROR ? r->str : "not a string");
            rc = -KVNODE_EIO;
            break;
        }
        int w = redis_header_word((const uint8_t *)r->str, r->len, &words[i]);
        held[i] = w == 0 ? WORD_SET : w == KVS_MISS ? WORD_NONE : WORD_BAD;
    }
    keys_free(&b, n);
    free(frames);
    free(iov);
    return rc;
}

static int redis_del(struct kvs_store *s, const struct kvs_ns *ns, int64_t key, uint64_t check,
                     char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .check = check };
    struct keys b = { 0 };
    uint64_t word = 0;
    uint8_t held = 0;
    int rc = redis_words(s, &it, 1, &word, &held, err, errlen);
    if (rc < 0 || (held == WORD_SET && word != check))
        return rc;                 /* another prefix's block: kept */
    rc = keys_make(s, &it, 1, &b, "DEL", err, errlen);
    if (rc == 0 && (rc = rcl_run(s->cl, b.cmds, 1, err, errlen)) == 0 &&
        b.cmds[0].reply->type == REDIS_REPLY_ERROR) {
        errmsg_set(err, errlen, "redis DEL: %.160s", b.cmds[0].reply->str);
        rc = -KVNODE_EIO;
    }
    keys_free(&b, 1);
    return rc;
}

static int redis_exists(struct kvs_store *s, const struct kvs_ns *ns, const int64_t *keys,
                        const uint64_t *checks, size_t n, uint8_t *present, char *err,
                        size_t errlen)
{
    if (n == 0)
        return 0;
    struct kvs_item *it = calloc(n, sizeof *it);
    uint64_t *words = calloc(n, sizeof *words);
    if (!it || !words) {
        free(it);
        free(words);
        errmsg_set(err, errlen, "redis GETRANGE: out of memory");
        return -KVNODE_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        it[i].ns = ns;
        it[i].key = keys[i];
    }
    /* One GETRANGE per key, pipelined: the word decides, not the key alone. */
    int rc = redis_words(s, it, n, words, present, err, errlen);
    for (size_t i = 0; rc == 0 && i < n; i++)
        present[i] = present[i] == WORD_NONE ? KVS_ABSENT
                     : present[i] == WORD_BAD || words[i] == (checks ? checks[i] : 0)
                         ? KVS_PRESENT : KVS_PRESENT_OTHER_WORD;
    free(words);
    free(it);
    return rc;
}

static int redis_scan(struct kvs_store *s, struct kvs_scan **cursor, size_t budget,
                      void (*found)(void *arg, const struct kvs_found *f), void *arg, char *err,
                      size_t errlen)
{
    (void)s; (void)budget; (void)found; (void)arg; (void)err; (void)errlen;
    *cursor = NULL;    /* not listable: lookups find blocks instead */
    return 1;
}

/* Every key of ns: "kvnode/<tenant>/<deployment id>/<rank>/" and anything
 * after it, the glob's special bytes in the parts escaped. */
static int redis_purge(struct kvs_store *s, const struct kvs_ns *ns, uint64_t *removed, char *err,
                       size_t errlen)
{
    char prefix[512], pattern[2 * 512 + 2];
    int w = snprintf(prefix, sizeof prefix, REDIS_KEY_PREFIX "/%s/%s/%" PRIu32 "/",
                     tenant_or_default(s->tenant), ns->deployment_id ? ns->deployment_id : "",
                     ns->layout->tp_rank);
    size_t n = 0;
    if (w < 0 || (size_t)w >= sizeof prefix) {
        errmsg_set(err, errlen, "redis: the key prefix of %s is too long", ns->deployment_id);
        return -KVNODE_EINVAL;
    }
    for (int i = 0; i < w; i++) {
        if (strchr("*?[]\\", prefix[i]))
            pattern[n++] = '\\';
        pattern[n++] = prefix[i];
    }
    pattern[n++] = '*';
    pattern[n] = '\0';
    return rcl_scan_unlink(s->cl, pattern, n, removed, err, errlen);
}

void redis_get_counters(struct kvs_store *s, struct rcl_counters *out)
{
    rcl_get_counters(s->cl, out);
}

const struct kvs_backend kvs_backend_redis = {
    .name = "redis",
    .open = redis_open,
    .health = redis_health,
    .put = redis_put,
    .get = redis_get,
    .del = redis_del,
    .exists = redis_exists,
    .scan = redis_scan,
    .close = redis_close,
    .put_batch = redis_put_batch,
    .get_batch = redis_get_batch,
    .purge = redis_purge,
    .keeps_deleted = false,
    .reads_find = true,
};
