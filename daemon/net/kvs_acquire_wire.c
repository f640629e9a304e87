/* kvs_acquire_wire: the /acquire body and reply as bytes (see
 * kvs_acquire_wire.h). The fixed-shape scanner only ever accepts or bails:
 * every message naming a problem comes from the jansson path, so the two
 * cannot disagree on an error. */
#include "net/kvs_acquire_wire.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "net/kvs_server.h"

#define WIRE_SKIP_DEPTH 16   /* nesting of a member the scanner skips; deeper: jansson */

/* --- the fixed-shape scanner ------------------------------------------------------ */

struct scan {
    const char *p, *end;
};

static void scan_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static bool scan_char(struct scan *s, char c)
{
    scan_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

/* A string of printable ASCII without escapes (anything else: jansson). */
static bool scan_str(struct scan *s, struct kvs_str *out)
{
    if (!scan_char(s, '"'))
        return false;
    const char *b = s->p, *q = memchr(b, '"', (size_t)(s->end - b));
    if (!q)
        return false;
    for (const char *c = b; c < q; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x80 || *c == '\\')
            return false;
    out->s = b;
    out->len = (size_t)(q - b);
    s->p = q + 1;
    return true;
}

static bool scan_is(struct kvs_str a, const char *lit)
{
    return a.len == strlen(lit) && memcmp(a.s, lit, a.len) == 0;
}

/* A non-negative integer up to INT64_MAX (jansson's range); not followed by
 * a fraction or an exponent. */
static bool scan_uint(struct scan *s, uint64_t *v)
{
    uint64_t x = 0;
    scan_ws(s);
    const char *b = s->p;
    if (b >= s->end || *b < '0' || *b > '9')
        return false;
    if (*b == '0') {
        s->p++;
    } else {
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
            if (x > ((uint64_t)INT64_MAX - 9) / 10)
                return false;
            x = x * 10 + (uint64_t)(*s->p++ - '0');
        }
    }
    if (s->p < s->end && ((*s->p >= '0' && *s->p <= '9') || *s->p == '.' || *s->p == 'e' || *s->p == 'E'))
        return false;
    *v = x;
    return true;
}

static bool scan_word(struct scan *s, const char *w)
{
    size_t n = strlen(w);
    scan_ws(s);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0)
        return false;
    s->p += n;
    return true;
}

/* Any value the scanner can vouch for: plain strings, small integers,
 * literals, arrays and objects of them. */
static bool scan_skip(struct scan *s, int depth)
{
    struct kvs_str tmp;
    uint64_t v;
    scan_ws(s);
    if (s->p >= s->end || depth > WIRE_SKIP_DEPTH)
        return false;
    switch (*s->p) {
    case '"':
        return scan_str(s, &tmp);
    case 't':
        return scan_word(s, "true");
    case 'f':
        return scan_word(s, "false");
    case 'n':
        return scan_word(s, "null");
    case '-':
        s->p++;
        return scan_uint(s, &v);
    case '[':
        s->p++;
        if (scan_char(s, ']'))
            return true;
        do {
            if (!scan_skip(s, depth + 1))
                return false;
        } while (scan_char(s, ','));
        return scan_char(s, ']');
    case '{':
        s->p++;
        if (scan_char(s, '}'))
            return true;
        do {
            if (!scan_str(s, &tmp) || !scan_char(s, ':') || !scan_skip(s, depth + 1))
                return false;
        } while (scan_char(s, ','));
        return scan_char(s, '}');
    default:
        return scan_uint(s, &v);
    }
}

static bool wire_grow(void **p, size_t *cap, size_t need, size_t each)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap * 2 : 256;
    void *q = realloc(*p, c * each);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

static bool scan_keys(struct scan *s, struct kvs_acquire_req *r, size_t max)
{
    size_t cap = 0;
    if (!scan_char(s, '['))
        return false;
    if (scan_char(s, ']'))
        return true;
    do {
        if (r->n == max || !wire_grow((void **)&r->keys, &cap, r->n + 1, sizeof *r->keys) ||
            !scan_str(s, &r->keys[r->n]))
            return false;
        r->n++;
    } while (scan_char(s, ','));
    return scan_char(s, ']');
}

/* {size: 1..UINT32_MAX, layout?: KVS_LAYOUT_NAME, anything else} */
static bool scan_meta(struct scan *s, uint64_t *size)
{
    bool seen_size = false, seen_layout = false;
    if (!scan_char(s, '{') || scan_char(s, '}'))
        return false;
    do {
        struct kvs_str name, layout;
        if (!scan_str(s, &name) || !scan_char(s, ':'))
            return false;
        if (scan_is(name, "size")) {
            if (seen_size || !scan_uint(s, size) || *size == 0 || *size > UINT32_MAX)
                return false;
            seen_size = true;
        } else if (scan_is(name, "layout")) {
            if (seen_layout || !scan_str(s, &layout) || !scan_is(layout, KVS_LAYOUT_NAME))
                return false;
            seen_layout = true;
        } else if (!scan_skip(s, 1)) {
            return false;
        }
    } while (scan_char(s, ','));
    return seen_size && scan_char(s, '}');
}

static bool scan_metas(struct scan *s, uint64_t **sizes, size_t *n, size_t max)
{
    size_t cap = 0;
    if (!scan_char(s, '['))
        return false;
    if (scan_char(s, ']'))
        return true;
    do {
        if (*n == max || !wire_grow((void **)sizes, &cap, *n + 1, sizeof **sizes) || !scan_meta(s, &(*sizes)[*n]))
            return false;
        (*n)++;
    } while (scan_char(s, ','));
    return scan_char(s, ']');
}

/* One top-level member; false: leave the body to jansson. */
static bool scan_member(struct scan *s, struct kvs_acquire_req *r, const struct kvs_acquire_limits *lim,
                        unsigned *seen, size_t *nmetas)
{
    struct kvs_str name, scope;
    unsigned bit;
    if (!scan_str(s, &name) || !scan_char(s, ':'))
        return false;
    bit = scan_is(name, "scope") ? 1 : scan_is(name, "object_keys") ? 2 : scan_is(name, "object_metas") ? 4
        : scan_is(name, "term") ? 8 : 0;
    if (*seen & bit)
        return false;   /* jansson: the last one counts */
    *seen |= bit;
    switch (bit) {
    case 1:
        if (!scan_str(s, &scope) || !(scan_is(scope, "read") || scan_is(scope, "create")))
            return false;
        r->create = scope.s[0] == 'c';
        return true;
    case 2:
        return scan_keys(s, r, lim->max_keys);
    case 4:
        return scan_metas(s, &r->sizes, nmetas, lim->max_keys);
    case 8:
        if (scan_word(s, "null"))
            return true;
        r->has_term = true;
        return scan_uint(s, &r->term_s) && r->term_s <= lim->max_term_s;
    default:
        return scan_skip(s, 1);
    }
}

static bool wire_scan(struct kvs_acquire_req *r, size_t len, const struct kvs_acquire_limits *lim)
{
    struct scan s = { r->text, r->text + len };
    unsigned seen = 0;
    size_t nmetas = 0;
    if (!scan_char(&s, '{'))
        return false;
    if (!scan_char(&s, '}')) {
        do {
            if (!scan_member(&s, r, lim, &seen, &nmetas))
                return false;
        } while (scan_char(&s, ','));
        if (!scan_char(&s, '}'))
            return false;
    }
    scan_ws(&s);
    if (s.p != s.end || !(seen & 1) || !(seen & 2))
        return false;
    if (r->create && (!(seen & 4) || nmetas != r->n))
        return false;
    if (!r->create) {
        free(r->sizes);   /* a read's object_metas are not used */
        r->sizes = NULL;
    }
    return true;
}

/* --- the general path (jansson) ---------------------------------------------------- */

static int wire_fail(char *msg, size_t msglen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int wire_fail(char *msg, size_t msglen, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msglen, fmt, ap);
    va_end(ap);
    return status;
}

static int wire_metas(json_t *metas, struct kvs_acquire_req *r, char *msg, size_t msglen)
{
    if (r->n == 0)
        return 0;
    if (!(r->sizes = malloc(r->n * sizeof *r->sizes)))
        return wire_fail(msg, msglen, 500, "out of memory");
    for (size_t i = 0; i < r->n; i++) {
        json_t *m = json_array_get(metas, i), *sz = json_object_get(m, "size");
        const char *layout = json_string_value(json_object_get(m, "layout"));
        if (!json_is_integer(sz) || json_integer_value(sz) <= 0 || json_integer_value(sz) > (json_int_t)UINT32_MAX)
            return wire_fail(msg, msglen, 400, "object_metas[%zu].size must be an integer from 1 to %u", i,
                             UINT32_MAX);
        if (layout && strcmp(layout, KVS_LAYOUT_NAME) != 0)
            return wire_fail(msg, msglen, 400, "object_metas[%zu].layout is '%.64s'; this server stores %s objects",
                             i, layout, KVS_LAYOUT_NAME);
        r->sizes[i] = (uint64_t)json_integer_value(sz);
    }
    return 0;
}

static int wire_json_fields(json_t *body, struct kvs_acquire_req *r, const struct kvs_acquire_limits *lim,
                            char *msg, size_t msglen)
{
    const char *scope = json_string_value(json_object_get(body, "scope"));
    json_t *keys = json_object_get(body, "object_keys"), *metas = json_object_get(body, "object_metas");
    json_t *term = json_object_get(body, "term");

    if (!scope || (strcmp(scope, "read") != 0 && strcmp(scope, "create") != 0))
        return wire_fail(msg, msglen, 400, "\"scope\" must be \"read\" or \"create\"");
    r->create = scope[0] == 'c';
    if (!json_is_array(keys))
        return wire_fail(msg, msglen, 400, "\"object_keys\" must be an array of strings");
    if (json_array_size(keys) > lim->max_keys)
        return wire_fail(msg, msglen, 413, "%zu object keys in one request; [kvs_server] max_keys is %zu",
                         json_array_size(keys), lim->max_keys);
    if (r->create && (!json_is_array(metas) || json_array_size(metas) != json_array_size(keys)))
        return wire_fail(msg, msglen, 400, "a create needs \"object_metas\": one {size, layout} per object key");
    if (term && !json_is_null(term)) {
        if (!json_is_integer(term) || json_integer_value(term) < 0 ||
            (uint64_t)json_integer_value(term) > lim->max_term_s)
            return wire_fail(msg, msglen, 400, "\"term\" must be an integer number of seconds from 0 to %" PRIu64
                             " ([kvs_server] max_term)", lim->max_term_s);
        r->has_term = true;
        r->term_s = (uint64_t)json_integer_value(term);
    }
    r->n = json_array_size(keys);
    if (!(r->keys = malloc((r->n ? r->n : 1) * sizeof *r->keys)))
        return wire_fail(msg, msglen, 500, "out of memory");
    for (size_t i = 0; i < r->n; i++) {
        json_t *k = json_array_get(keys, i);
        if (!json_is_string(k))
            return wire_fail(msg, msglen, 400, "object_keys[%zu] is not a string", i);
        r->keys[i] = (struct kvs_str){ json_string_value(k), json_string_length(k) };
    }
    return r->create ? wire_metas(metas, r, msg, msglen) : 0;
}

static int wire_json(const char *body, size_t len, struct kvs_acquire_req *r, const struct kvs_acquire_limits *lim,
                     char *msg, size_t msglen)
{
    json_error_t jerr;
    json_t *j = json_loadb(body, len, 0, &jerr);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return wire_fail(msg, msglen, 400, "the body must be a JSON object (%s)",
                         j ? "it is another JSON value" : jerr.text);
    }
    r->tree = j;
    return wire_json_fields(j, r, lim, msg, msglen);
}

int kvs_acquire_req_parse_owned(char *text, size_t len, const struct kvs_acquire_limits *lim,
                                struct kvs_acquire_req *out, char *msg, size_t msglen)
{
    struct kvs_acquire_req *r = out;
    memset(r, 0, sizeof *r);
    r->text = text;
    if (!lim->general_only && wire_scan(r, len, lim)) {
        r->fast = true;
        return 0;
    }
    free(r->keys);
    free(r->sizes);
    memset(r, 0, sizeof *r);
    int status = wire_json(text, len, r, lim, msg, msglen);   /* the tree keeps its own strings */
    free(text);
    if (status != 0)
        kvs_acquire_req_free(r);
    return status;
}

int kvs_acquire_req_parse(const char *body, size_t len, const struct kvs_acquire_limits *lim,
                          struct kvs_acquire_req *out, char *msg, size_t msglen)
{
    char *text = malloc(len ? len : 1);
    if (!text) {
        memset(out, 0, sizeof *out);
        return wire_fail(msg, msglen, 500, "out of memory");
    }
    memcpy(text, body, len);
    return kvs_acquire_req_parse_owned(text, len, lim, out, msg, msglen);
}

void kvs_acquire_req_free(struct kvs_acquire_req *r)
{
    free(r->keys);
    free(r->sizes);
    free(r->text);
    json_decref(r->tree);
    memset(r, 0, sizeof *r);
}

/* --- the reply ------------------------------------------------------------------- */

static char *put_lit(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

static char *put_u64(char *p, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* s as a JSON string's contents, escaped as jansson escapes (at most 6
 * bytes per byte). */
static char *put_escaped(char *p, struct kvs_str s)
{
    static const char hex[] = "0123456789abcdef";
    size_t plain = 0;   /* keys rarely need escaping: copy the run that does not at once */
    while (plain < s.len && (unsigned char)s.s[plain] >= 0x20 && s.s[plain] != '"' && s.s[plain] != '\\')
        plain++;
    memcpy(p, s.s, plain);
    p += plain;
    for (size_t i = plain; i < s.len; i++) {
        unsigned char c = (unsigned char)s.s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *p++ = (char)c;
            continue;
        }
        *p++ = '\\';
        switch (c) {
        case '"': *p++ = '"'; break;
        case '\\': *p++ = '\\'; break;
        case '\b': *p++ = 'b'; break;
        case '\f': *p++ = 'f'; break;
        case '\n': *p++ = 'n'; break;
        case '\r': *p++ = 'r'; break;
        case '\t': *p++ = 't'; break;
        default:
            p = put_lit(p, "u00");
            *p++ = hex[c >> 4];
            *p++ = hex[c & 15];
        }
    }
    return p;
}

/* Room for more bytes after the objects (doubling). 0 or -1. */
static int kvs_reply_room(struct kvs_reply *r, size_t more)
{
    size_t need = KVS_REPLY_HEAD + r->len + more;
    if (need <= r->cap)
        return 0;
    size_t cap = r->cap ? r->cap : 4096;
    while (cap < need)
        cap *= 2;
    char *p = realloc(r->p, cap);
    if (!p)
        return -1;
    r->p = p;
    r->cap = cap;
    return 0;
}

int kvs_reply_object(struct kvs_reply *r, bool first, struct kvs_str key, uint64_t offset, uint64_t size)
{
    if (kvs_reply_room(r, key.len * 6 + 192) < 0)
        return -1;
    char *start = r->p + KVS_REPLY_HEAD + r->len, *p = start;
    if (!first)
        *p++ = ',';
    p = put_lit(p, "{\"key\":\"");
    p = put_escaped(p, key);
    p = put_lit(p, "\",\"blobs\":[{\"type\":\"vineyard\",\"handle\":{\"data_offset\":");
    p = put_u64(p, offset);
    p = put_lit(p, ",\"data_size\":");
    p = put_u64(p, size);
    p = put_lit(p, ",\"object_id\":");
    p = put_u64(p, offset);
    p = put_lit(p, "}}],\"meta\":{\"size\":");
    p = put_u64(p, size);
    p = put_lit(p, "}}");
    r->len += (size_t)(p - start);
    return 0;
}

int kvs_reply_wrap(struct kvs_reply *r, const char *lease_id, size_t *off, size_t *len)
{
    char head[KVS_REPLY_HEAD];
    int n = snprintf(head, sizeof head, "{\"lease\":{\"lease_id\":\"%s\"},\"objects\":[", lease_id);
    if (n < 0 || (size_t)n >= sizeof head || kvs_reply_room(r, 2) < 0)
        return -1;
    memcpy(r->p + KVS_REPLY_HEAD - (size_t)n, head, (size_t)n);
    memcpy(r->p + KVS_REPLY_HEAD + r->len, "]}", 2);
    *off = KVS_REPLY_HEAD - (size_t)n;
    *len = (size_t)n + r->len + 2;
    return 0;
}
