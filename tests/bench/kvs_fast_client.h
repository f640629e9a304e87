/* kvs_fast_client: the benchmark's client of the KVS front end, costing what
 * rtp-llm's KVSClient (@85c02327f) costs. That client writes its requests
 * with rapidjson's Writer, parses replies with rapidjson and keys the
 * results by key; kvs_client.h (jansson trees, a linear search per key) costs
 * several times more per call and would be counted against the server. Here:
 *   - requests are written straight into a buffer, members in rtp-llm's order
 *     (docs/reference rtp-llm-kvs-client.md §2.2), strings escaped;
 *   - the /acquire reply is read by a strict one-pass parser of the
 *     documented shape (§2.3): any malformed JSON, a member of the wrong type,
 *     a float or a negative where an integer is due, a blob not "vineyard", a
 *     duplicate key: the reply is refused with the reason;
 *   - objects are found by key in a hash table, O(1) per key;
 *   - the transport is kvs_client.h's: a fresh curl easy handle (a new TCP
 *     connection) per call, rtp-llm's headers and timeout.
 * The benchmark checks this reader against jansson at start (bench_kvs.c).
 * Header-only, benchmark use only; the tests keep kvs_client.h. */
#ifndef KVNODE_BENCH_KVS_FAST_CLIENT_H
#define KVNODE_BENCH_KVS_FAST_CLIENT_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- growable buffer, JSON writing --------------------------------------- */

typedef struct kvsf_buf {
    char *p;
    size_t n, cap;
} kvsf_buf;

static inline bool kvsf_reserve(kvsf_buf *b, size_t more)
{
    if (b->n + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more + 1)
        cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q)
        return false;
    b->p = q;
    b->cap = cap;
    return true;
}

/* Unchecked appends: the caller reserved room. */
static inline void kvsf_put(kvsf_buf *b, const char *s, size_t len)
{
    memcpy(b->p + b->n, s, len);
    b->n += len;
}

static inline void kvsf_put_u64(kvsf_buf *b, uint64_t v)
{
    char t[20];
    int i = 20;
    do {
        t[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    kvsf_put(b, t + i, (size_t)(20 - i));
}

/* A JSON string as rapidjson's Writer escapes it: '"', '\\' and control
 * characters; other bytes (UTF-8 included) as they are. Reserves itself. */
static inline bool kvsf_put_string(kvsf_buf *b, const char *s, size_t len)
{
    if (!kvsf_reserve(b, 6 * len + 2))
        return false;
    b->p[b->n++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            b->p[b->n++] = (char)c;
            continue;
        }
        b->p[b->n++] = '\\';
        switch (c) {
        case '"': b->p[b->n++] = '"'; break;
        case '\\': b->p[b->n++] = '\\'; break;
        case '\b': b->p[b->n++] = 'b'; break;
        case '\f': b->p[b->n++] = 'f'; break;
        case '\n': b->p[b->n++] = 'n'; break;
        case '\r': b->p[b->n++] = 'r'; break;
        case '\t': b->p[b->n++] = 't'; break;
        default:
            b->n += (size_t)sprintf(b->p + b->n, "u%04x", (unsigned)c);
        }
    }
    b->p[b->n++] = '"';
    return true;
}

#define KVSF_PUT_LIT(b, lit) kvsf_put((b), (lit), sizeof(lit) - 1)

/* rtp-llm's /acquire body (§2.2), into b (reset first). scope "read":
 * scope, object_keys, term, peer, wait_timeout, request_id, best_effort.
 * "create": scope, object_keys, object_metas (one {size, layout} per key),
 * term, request_id, ignore_existing. false when out of memory. */
static inline bool kvsf_acquire_body(kvsf_buf *b, bool create, const char *const *keys, size_t n, uint64_t size,
                                     int term, const char *request_id)
{
    b->n = 0;
    if (!kvsf_reserve(b, 64))
        return false;
    if (create)
        KVSF_PUT_LIT(b, "{\"scope\":\"create\",\"object_keys\":[");
    else
        KVSF_PUT_LIT(b, "{\"scope\":\"read\",\"object_keys\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) {
            if (!kvsf_reserve(b, 1))
                return false;
            b->p[b->n++] = ',';
        }
        if (!kvsf_put_string(b, keys[i], strlen(keys[i])))
            return false;
    }
    if (!kvsf_reserve(b, 64 + n * 72))
        return false;
    if (create) {
        KVSF_PUT_LIT(b, "],\"object_metas\":[");
        for (size_t i = 0; i < n; i++) {
            KVSF_PUT_LIT(b, "{\"size\":");
            kvsf_put_u64(b, size);
            KVSF_PUT_LIT(b, ",\"layout\":\"rtp_llm_group_block_v1\"}");
            if (i + 1 < n)
                b->p[b->n++] = ',';
        }
    }
    KVSF_PUT_LIT(b, "],\"term\":");
    kvsf_put_u64(b, (uint64_t)(term < 0 ? 0 : term));
    if (!create)
        KVSF_PUT_LIT(b, ",\"peer\":\"local\",\"wait_timeout\":0");
    KVSF_PUT_LIT(b, ",\"request_id\":");
    if (!kvsf_put_string(b, request_id, strlen(request_id)) || !kvsf_reserve(b, 32))
        return false;
    if (create)
        KVSF_PUT_LIT(b, ",\"ignore_existing\":true}");
    else
        KVSF_PUT_LIT(b, ",\"best_effort\":true}");
    b->p[b->n] = '\0';
    return true;
}

/* ---- transport ------------------------------------------------------------- */

/* What curl saw of one call (CURLINFO_*_TIME_T, microseconds from the start). */
typedef struct kvsf_curl_times {
    int64_t connect_us, starttransfer_us, total_us;
} kvsf_curl_times;

static inline size_t kvsf_write_cb(char *ptr, size_t sz, size_t nm, void *arg)
{
    kvsf_buf *b = arg;
    if (!kvsf_reserve(b, sz * nm))
        return 0;
    kvsf_put(b, ptr, sz * nm);
    b->p[b->n] = '\0';
    return sz * nm;
}

/* One POST as rtp-llm sends it (body NULL: GET). The reply body goes to out
 * (reset first). 0 with *status set, -1 on a transport error. */
static inline int kvsf_call(const char *url, const char *route, const char *body, size_t body_len, kvsf_buf *out,
                            long *status, kvsf_curl_times *times)
{
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = NULL;
    char full[320];
    out->n = 0;
    *status = 0;
    if (!h)
        return -1;
    if (strncmp(url, "unix:", 5) == 0) {
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, url + 5);
        snprintf(full, sizeof full, "http://localhost/%s", route);
    } else {
        snprintf(full, sizeof full, "%s/%s", url, route);
    }
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 12000L);   /* rtp-llm's kvs_timeout_ms */
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kvsf_write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    if (body) {
        hdr = curl_slist_append(hdr, "Content-Type: application/json");
        hdr = curl_slist_append(hdr, "Accept: application/json");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)body_len);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    }
    CURLcode cc = curl_easy_perform(h);
    if (cc == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
        if (times) {
            curl_off_t v = 0;
            curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &v);
            times->connect_us = (int64_t)v;
            curl_easy_getinfo(h, CURLINFO_STARTTRANSFER_TIME_T, &v);
            times->starttransfer_us = (int64_t)v;
            curl_easy_getinfo(h, CURLINFO_TOTAL_TIME_T, &v);
            times->total_us = (int64_t)v;
        }
    }
    if (out->p)
        out->p[out->n] = '\0';
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return cc == CURLE_OK ? 0 : -1;
}

/* seal / release / discard as rtp-llm sends them: {"lease_id", "request_id"}
 * for seal, {"lease_id"} alone for the others (request_id NULL). The
 * status, -1 on a transport error. */
static inline long kvsf_lease_call(const char *url, const char *route, const char *lease, const char *request_id)
{
    kvsf_buf b = { 0 }, out = { 0 };
    long st = -1;
    bool ok = kvsf_reserve(&b, 16);
    if (ok) {
        KVSF_PUT_LIT(&b, "{\"lease_id\":");
        ok = kvsf_put_string(&b, lease, strlen(lease)) && kvsf_reserve(&b, 16);
    }
    if (ok && request_id) {
        KVSF_PUT_LIT(&b, ",\"request_id\":");
        ok = kvsf_put_string(&b, request_id, strlen(request_id)) && kvsf_reserve(&b, 2);
    }
    if (ok) {
        b.p[b.n++] = '}';
        b.p[b.n] = '\0';
        if (kvsf_call(url, route, b.p, b.n, &out, &st, NULL) < 0)
            st = -1;
    }
    free(b.p);
    free(out.p);
    return st;
}

/* ---- the /acquire reply -------------------------------------------------- */

typedef struct kvsf_object {
    const char *key;        /* decoded, NUL-terminated (in the reply's text) */
    size_t key_len;         /* a key may hold "\u0000": compare by length */
    uint64_t offset;        /* blobs[0].handle.data_offset */
    uint64_t data_size;     /* blobs[0].handle.data_size */
    uint64_t bytes;         /* meta.size when present and > 0, else data_size (rtp-llm's rule) */
    bool has_object_id;
    uint64_t object_id;
} kvsf_object;

typedef struct kvsf_reply {
    kvsf_buf text;          /* the reply; strings are decoded in place */
    const char *lease_id;   /* "" when the lease says so */
    size_t lease_len;
    kvsf_object *objs;      /* non-null entries, in reply order */
    size_t n, cap;
    size_t nulls;           /* null entries (misses of a read) */
    uint32_t *slots;        /* hash table: index + 1 into objs, 0 empty */
    size_t mask;
} kvsf_reply;

static inline void kvsf_reply_free(kvsf_reply *r)
{
    free(r->text.p);
    free(r->objs);
    free(r->slots);
    memset(r, 0, sizeof *r);
}

static inline uint64_t kvsf_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* The object of key, NULL when the reply has none. */
static inline const kvsf_object *kvsf_find(const kvsf_reply *r, const char *key, size_t len)
{
    if (!r->slots)
        return NULL;
    for (size_t i = kvsf_hash(key, len) & r->mask;; i = (i + 1) & r->mask) {
        uint32_t s = r->slots[i];
        if (!s)
            return NULL;
        const kvsf_object *o = &r->objs[s - 1];
        if (o->key_len == len && memcmp(o->key, key, len) == 0)
            return o;
    }
}

/* The parser: one pass, strings decoded in place (as rapidjson's insitu
 * mode). Every function returns false with p->err set on the first fault. */
typedef struct kvsf_parser {
    char *s, *end;
    char err[160];
} kvsf_parser;

#define KVSF_FAIL(p, what, at) \
    (snprintf((p)->err, sizeof (p)->err, "%s at byte %td", (what), (at)), false)

static inline void kvsf_ws(kvsf_parser *p)
{
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

/* Expect byte c (after whitespace). */
static inline bool kvsf_expect(kvsf_parser *p, char c, const char *start)
{
    kvsf_ws(p);
    if (p->s >= p->end || *p->s != c) {
        char m[48];
        snprintf(m, sizeof m, "expected '%c'", c);
        return KVSF_FAIL(p, m, p->s - start);
    }
    p->s++;
    return true;
}

static inline int kvsf_hex4(const char *s)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Length of a valid UTF-8 sequence at s (first byte >= 0x80), 0 if invalid. */
static inline size_t kvsf_utf8_len(const unsigned char *s, const unsigned char *end)
{
    unsigned c = s[0];
    size_t n;
    unsigned min;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, min = 0x10000;
    else
        return 0;
    if ((size_t)(end - s) < n)
        return 0;
    unsigned v = c & (0x3f >> (n - 1));
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    return n;
}

static inline char *kvsf_put_utf8(char *w, unsigned v)
{
    if (v < 0x80) {
        *w++ = (char)v;
    } else if (v < 0x800) {
        *w++ = (char)(0xc0 | (v >> 6));
        *w++ = (char)(0x80 | (v & 0x3f));
    } else if (v < 0x10000) {
        *w++ = (char)(0xe0 | (v >> 12));
        *w++ = (char)(0x80 | ((v >> 6) & 0x3f));
        *w++ = (char)(0x80 | (v & 0x3f));
    } else {
        *w++ = (char)(0xf0 | (v >> 18));
        *w++ = (char)(0x80 | ((v >> 12) & 0x3f));
        *w++ = (char)(0x80 | ((v >> 6) & 0x3f));
        *w++ = (char)(0x80 | (v & 0x3f));
    }
    return w;
}

/* A string at p->s (after whitespace), decoded in place and NUL-terminated
 * (the decoded text is never longer than the escaped one). */
static inline bool kvsf_string(kvsf_parser *p, const char *start, const char **out, size_t *len)
{
    if (!kvsf_expect(p, '"', start))
        return false;
    char *w = p->s, *r = p->s, *begin = p->s;
    while (r < p->end) {
        unsigned char c = (unsigned char)*r;
        if (c == '"') {
            *w = '\0';
            *out = begin;
            *len = (size_t)(w - begin);
            p->s = r + 1;
            return true;
        }
        if (c < 0x20)
            return KVSF_FAIL(p, "control character in a string", r - start);
        if (c >= 0x80) {
            size_t n = kvsf_utf8_len((const unsigned char *)r, (const unsigned char *)p->end);
            if (!n)
                return KVSF_FAIL(p, "invalid UTF-8 in a string", r - start);
            memmove(w, r, n);
            w += n;
            r += n;
            continue;
        }
        if (c != '\\') {
            *w++ = (char)c;
            r++;
            continue;
        }
        if (r + 1 >= p->end)
            break;
        char e = r[1];
        r += 2;
        switch (e) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            int v = p->end - r >= 4 ? kvsf_hex4(r) : -1;
            if (v < 0)
                return KVSF_FAIL(p, "bad \\u escape", r - 2 - start);
            r += 4;
            if (v >= 0xdc00 && v <= 0xdfff)
                return KVSF_FAIL(p, "lone low surrogate", r - 6 - start);
            if (v >= 0xd800 && v <= 0xdbff) {
                int lo = p->end - r >= 6 && r[0] == '\\' && r[1] == 'u' ? kvsf_hex4(r + 2) : -1;
                if (lo < 0xdc00 || lo > 0xdfff)
                    return KVSF_FAIL(p, "lone high surrogate", r - 6 - start);
                r += 6;
                v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
            }
            w = kvsf_put_utf8(w, (unsigned)v);
            break;
        }
        default:
            return KVSF_FAIL(p, "bad escape", r - 2 - start);
        }
    }
    return KVSF_FAIL(p, "unterminated string", r - start);
}

/* A JSON number's extent at p->s; *integer: no fraction, no exponent. */
static inline bool kvsf_number(kvsf_parser *p, const char *start, bool *negative, bool *integer, const char **digits,
                               size_t *ndigits)
{
    char *s = p->s;
    *negative = s < p->end && *s == '-';
    if (*negative)
        s++;
    *digits = s;
    if (s >= p->end || *s < '0' || *s > '9')
        return KVSF_FAIL(p, "expected a number", s - start);
    if (*s == '0')
        s++;
    else
        while (s < p->end && *s >= '0' && *s <= '9')
            s++;
    *ndigits = (size_t)(s - *digits);
    *integer = true;
    if (s < p->end && *s == '.') {
        *integer = false;
        if (++s >= p->end || *s < '0' || *s > '9')
            return KVSF_FAIL(p, "bad fraction", s - start);
        while (s < p->end && *s >= '0' && *s <= '9')
            s++;
    }
    if (s < p->end && (*s == 'e' || *s == 'E')) {
        *integer = false;
        if (++s < p->end && (*s == '+' || *s == '-'))
            s++;
        if (s >= p->end || *s < '0' || *s > '9')
            return KVSF_FAIL(p, "bad exponent", s - start);
        while (s < p->end && *s >= '0' && *s <= '9')
            s++;
    }
    p->s = s;
    return true;
}

/* A JSON integer >= 0 that fits uint64 (getJsonUint64's rule: floats,
 * negatives and strings are refused). */
static inline bool kvsf_uint(kvsf_parser *p, const char *start, uint64_t *v)
{
    kvsf_ws(p);
    const char *at = p->s, *d;
    bool neg, integer;
    size_t nd;
    if (!kvsf_number(p, start, &neg, &integer, &d, &nd))
        return false;
    if (!integer || (neg && !(nd == 1 && d[0] == '0')))   /* "-0" is 0, for rapidjson and jansson too */
        return KVSF_FAIL(p, "expected an integer >= 0", at - start);
    uint64_t x = 0;
    for (size_t i = 0; i < nd; i++) {
        unsigned dig = (unsigned)(d[i] - '0');
        if (x > (UINT64_MAX - dig) / 10)
            return KVSF_FAIL(p, "integer out of range", at - start);
        x = x * 10 + dig;
    }
    *v = x;
    return true;
}

static inline bool kvsf_literal(kvsf_parser *p, const char *start, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(p->end - p->s) < n || memcmp(p->s, lit, n) != 0)
        return KVSF_FAIL(p, "bad literal", p->s - start);
    p->s += n;
    return true;
}

/* Any JSON value, validated and skipped (members this client does not read). */
static inline bool kvsf_skip(kvsf_parser *p, const char *start, int depth)
{
    kvsf_ws(p);
    if (p->s >= p->end)
        return KVSF_FAIL(p, "expected a value", p->s - start);
    if (depth > 64)
        return KVSF_FAIL(p, "nested too deep", p->s - start);
    const char *str;
    size_t len;
    switch (*p->s) {
    case '"':
        return kvsf_string(p, start, &str, &len);
    case 't':
        return kvsf_literal(p, start, "true");
    case 'f':
        return kvsf_literal(p, start, "false");
    case 'n':
        return kvsf_literal(p, start, "null");
    case '[':
        p->s++;
        kvsf_ws(p);
        if (p->s < p->end && *p->s == ']')
            return p->s++, true;
        do {
            if (!kvsf_skip(p, start, depth + 1))
                return false;
            kvsf_ws(p);
        } while (p->s < p->end && *p->s == ',' && p->s++);
        return kvsf_expect(p, ']', start);
    case '{':
        p->s++;
        kvsf_ws(p);
        if (p->s < p->end && *p->s == '}')
            return p->s++, true;
        do {
            if (!kvsf_string(p, start, &str, &len) || !kvsf_expect(p, ':', start) || !kvsf_skip(p, start, depth + 1))
                return false;
            kvsf_ws(p);
        } while (p->s < p->end && *p->s == ',' && p->s++);
        return kvsf_expect(p, '}', start);
    default: {
        bool neg, integer;
        const char *d;
        size_t nd;
        return kvsf_number(p, start, &neg, &integer, &d, &nd);
    }
    }
}

/* The members of an object, one callback per member with p->s at its value;
 * the callback consumes the value. A member name seen twice is refused. */
typedef bool (*kvsf_member_fn)(kvsf_parser *p, const char *start, const char *name, size_t len, void *arg);

static inline bool kvsf_object_members(kvsf_parser *p, const char *start, kvsf_member_fn fn, void *arg)
{
    if (!kvsf_expect(p, '{', start))
        return false;
    kvsf_ws(p);
    if (p->s < p->end && *p->s == '}')
        return p->s++, true;
    do {
        const char *name;
        size_t len;
        if (!kvsf_string(p, start, &name, &len) || !kvsf_expect(p, ':', start) || !fn(p, start, name, len, arg))
            return false;
        kvsf_ws(p);
    } while (p->s < p->end && *p->s == ',' && p->s++);
    return kvsf_expect(p, '}', start);
}

#define KVSF_IS(name, len, lit) ((len) == sizeof(lit) - 1 && memcmp((name), (lit), sizeof(lit) - 1) == 0)

/* Which members of an object were seen (bit per member), to refuse twice. */
static inline bool kvsf_once(kvsf_parser *p, const char *start, unsigned *seen, unsigned bit)
{
    if (*seen & bit)
        return KVSF_FAIL(p, "member given twice", p->s - start);
    *seen |= bit;
    return true;
}

struct kvsf_handle_ctx { kvsf_object *o; unsigned seen; };

static inline bool kvsf_handle_member(kvsf_parser *p, const char *start, const char *name, size_t len, void *arg)
{
    struct kvsf_handle_ctx *h = arg;
    if (KVSF_IS(name, len, "data_offset"))
        return kvsf_once(p, start, &h->seen, 1) && kvsf_uint(p, start, &h->o->offset);
    if (KVSF_IS(name, len, "data_size"))
        return kvsf_once(p, start, &h->seen, 2) && kvsf_uint(p, start, &h->o->data_size);
    if (KVSF_IS(name, len, "object_id")) {
        const char *at = p->s;
        if (!kvsf_once(p, start, &h->seen, 4) || !kvsf_uint(p, start, &h->o->object_id))
            return false;
        if (h->o->object_id == UINT64_MAX)
            return KVSF_FAIL(p, "object_id is UINT64_MAX", at - start);
        h->o->has_object_id = true;
        return true;
    }
    return kvsf_skip(p, start, 4);
}

struct kvsf_blob_ctx { kvsf_object *o; unsigned seen; };

static inline bool kvsf_blob_member(kvsf_parser *p, const char *start, const char *name, size_t len, void *arg)
{
    struct kvsf_blob_ctx *b = arg;
    if (KVSF_IS(name, len, "type")) {
        const char *t, *at = p->s;
        size_t tl;
        if (!kvsf_once(p, start, &b->seen, 1) || !kvsf_string(p, start, &t, &tl))
            return false;
        return KVSF_IS(t, tl, "vineyard") || KVSF_FAIL(p, "blob type is not \"vineyard\"", at - start);
    }
    if (KVSF_IS(name, len, "handle")) {
        struct kvsf_handle_ctx h = { b->o, 0 };
        const char *at = p->s;
        if (!kvsf_once(p, start, &b->seen, 2) || !kvsf_object_members(p, start, kvsf_handle_member, &h))
            return false;
        return (h.seen & 3) == 3 || KVSF_FAIL(p, "handle without data_offset and data_size", at - start);
    }
    return kvsf_skip(p, start, 3);
}

/* blobs: a non-empty array; blobs[0] is read, the rest only validated. */
static inline bool kvsf_blobs(kvsf_parser *p, const char *start, kvsf_object *o)
{
    if (!kvsf_expect(p, '[', start))
        return false;
    struct kvsf_blob_ctx b = { o, 0 };
    const char *at = p->s;
    if (!kvsf_object_members(p, start, kvsf_blob_member, &b))
        return false;
    if ((b.seen & 3) != 3)
        return KVSF_FAIL(p, "blob without type and handle", at - start);
    kvsf_ws(p);
    while (p->s < p->end && *p->s == ',') {
        p->s++;
        if (!kvsf_skip(p, start, 3))
            return false;
        kvsf_ws(p);
    }
    return kvsf_expect(p, ']', start);
}

struct kvsf_meta_ctx { uint64_t size; unsigned seen; };

static inline bool kvsf_meta_member(kvsf_parser *p, const char *start, const char *name, size_t len, void *arg)
{
    struct kvsf_meta_ctx *m = arg;
    if (KVSF_IS(name, len, "size"))
        return kvsf_once(p, start, &m->seen, 1) && kvsf_uint(p, start, &m->size);
    return kvsf_skip(p, start, 3);
}

struct kvsf_entry_ctx { kvsf_object *o; unsigned seen; uint64_t meta_size; };

static inline bool kvsf_entry_member(kvsf_parser *p, const char *start, const char *name, size_t len, void *arg)
{
    struct kvsf_entry_ctx *e = arg;
    if (KVSF_IS(name, len, "key"))
        return kvsf_once(p, start, &e->seen, 1) && kvsf_string(p, start, &e->o->key, &e->o->key_len);
    if (KVSF_IS(name, len, "blobs"))
        return kvsf_once(p, start, &e->seen, 2) && kvsf_blobs(p, start, e->o);
    if (KVSF_IS(name, len, "meta")) {
        struct kvsf_meta_ctx m = { 0, 0 };
        if (!kvsf_once(p, start, &e->seen, 4) || !kvsf_object_members(p, start, kvsf_meta_member, &m))
            return false;
        e->meta_size = m.size;
        return true;
    }
    return kvsf_skip(p, start, 2);
}

/* Add o to the table; a key given twice is refused. */
static inline bool kvsf_insert(kvsf_parser *p, const char *start, kvsf_reply *r, size_t idx, const char *at)
{
    const kvsf_object *o = &r->objs[idx];
    size_t i = kvsf_hash(o->key, o->key_len) & r->mask;
    for (; r->slots[i]; i = (i + 1) & r->mask) {
        const kvsf_object *q = &r->objs[r->slots[i] - 1];
        if (q->key_len == o->key_len && memcmp(q->key, o->key, o->key_len) == 0)
            return KVSF_FAIL(p, "the same key twice in objects", at - start);
    }
    r->slots[i] = (uint32_t)idx + 1;
    return true;
}

/* Grow objs and the table (kept at most half full). */
static inline bool kvsf_grow(kvsf_parser *p, const char *start, kvsf_reply *r)
{
    if (r->n < r->cap)
        return true;
    size_t cap = r->cap ? r->cap * 2 : 256;
    kvsf_object *objs = realloc(r->objs, cap * sizeof *objs);
    uint32_t *slots = calloc(cap * 2, sizeof *slots);
    if (!objs || !slots || cap >= UINT32_MAX / 2) {
        free(slots);
        if (objs)
            r->objs = objs;
        return KVSF_FAIL(p, "out of memory", p->s - start);
    }
    r->objs = objs;
    r->cap = cap;
    free(r->slots);
    r->slots = slots;
    r->mask = cap * 2 - 1;
    for (size_t i = 0; i < r->n; i++)
        if (!kvsf_insert(p, start, r, i, p->s))
            return false;
    return true;
}

static inline bool kvsf_entry(kvsf_parser *p, const char *start, kvsf_reply *r)
{
    kvsf_ws(p);
    if (p->s < p->end && *p->s == 'n') {
        r->nulls++;
        return kvsf_literal(p, start, "null");
    }
    if (!kvsf_grow(p, start, r))
        return false;
    kvsf_object *o = &r->objs[r->n];
    memset(o, 0, sizeof *o);
    struct kvsf_entry_ctx e = { o, 0, 0 };
    const char *at = p->s;
    if (!kvsf_object_members(p, start, kvsf_entry_member, &e))
        return false;
    if ((e.seen & 3) != 3)
        return KVSF_FAIL(p, "object entry without key and blobs", at - start);
    o->bytes = e.meta_size > 0 ? e.meta_size : o->data_size;
    return kvsf_insert(p, start, r, r->n++, at);
}

static inline bool kvsf_objects(kvsf_parser *p, const char *start, kvsf_reply *r)
{
    if (!kvsf_expect(p, '[', start))
        return false;
    kvsf_ws(p);
    if (p->s < p->end && *p->s == ']')
        return p->s++, true;
    do {
        if (!kvsf_entry(p, start, r))
            return false;
        kvsf_ws(p);
    } while (p->s < p->end && *p->s == ',' && p->s++);
    return kvsf_expect(p, ']', start);
}

struct kvsf_top_ctx { kvsf_reply *r; unsigned seen; };

static inline bool kvsf_lease_member(kvsf_parser *p, const char *start, const char *name, size_t len, void *arg)
{
    struct kvsf_top_ctx *t = arg;
    if (KVSF_IS(name, len, "lease_id"))
        return kvsf_once(p, start, &t->seen, 4) && kvsf_string(p, start, &t->r->lease_id, &t->r->lease_len);
    return kvsf_skip(p, start, 2);
}

static inline bool kvsf_top_member(kvsf_parser *p, const char *start, const char *name, size_t len, void *arg)
{
    struct kvsf_top_ctx *t = arg;
    if (KVSF_IS(name, len, "lease")) {
        const char *at = p->s;
        if (!kvsf_once(p, start, &t->seen, 1) || !kvsf_object_members(p, start, kvsf_lease_member, t))
            return false;
        return (t->seen & 4) || KVSF_FAIL(p, "lease without a lease_id", at - start);
    }
    if (KVSF_IS(name, len, "objects"))
        return kvsf_once(p, start, &t->seen, 2) && kvsf_objects(p, start, t->r);
    return kvsf_skip(p, start, 1);
}

/* Parse r->text as an /acquire reply: 0, or -1 with why set. */
static inline int kvsf_parse_acquire(kvsf_reply *r, char *why, size_t whylen)
{
    kvsf_parser p = { .s = r->text.p, .end = r->text.p + r->text.n };
    const char *start = r->text.p;
    struct kvsf_top_ctx t = { r, 0 };
    r->n = r->nulls = 0;
    r->lease_id = "";
    r->lease_len = 0;
    if (r->slots)
        memset(r->slots, 0, (r->mask + 1) * sizeof *r->slots);
    if (!start) {
        snprintf(why, whylen, "empty reply");
        return -1;
    }
    bool ok = kvsf_object_members(&p, start, kvsf_top_member, &t);
    if (ok && (t.seen & 3) != 3)
        ok = KVSF_FAIL(&p, "reply without lease and objects", (ptrdiff_t)0);
    if (ok) {
        kvsf_ws(&p);
        if (p.s != p.end)
            ok = KVSF_FAIL(&p, "trailing bytes after the reply", p.s - start);
    }
    if (!ok) {
        snprintf(why, whylen, "%s", p.err);
        return -1;
    }
    return 0;
}

#endif
