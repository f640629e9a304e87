/* kvnodectl: operator command-line tool of kvnoded.
 *
 * Observer commands (status, stats, namespaces, ping, reload) connect without a layout
 * and read the daemon's statistics document; data commands (match, put, get,
 * delete) bind the namespace given by the layout options and move blocks with
 * the public client API (lib/kvnode.h) only. The put/get keying (one FNV-1a
 * digest per block as a "token", block_tokens 1) is a smoke test of the
 * daemon, not any engine's keying; see kvnodectl(1).
 *
 * Exit codes: 0 ok, 1 daemon/library/I-O error, 2 usage, 3 partial result,
 * 4 cannot connect. Single-threaded; owns nothing beyond one command. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>
#include <sys/stat.h>

#include <curl/curl.h>
#include <jansson.h>

#include "kvnode.h"

#ifndef KVNODE_VERSION_STRING
#define KVNODE_VERSION_STRING "unknown"
#endif

#define PROG "kvnodectl"
#define DEFAULT_SOCKET "/run/kvnode/kvnode.sock"

enum {
    EXIT_OK = 0,
    EXIT_ERR = 1,       /* daemon, library or local I/O error */
    EXIT_USAGE = 2,
    EXIT_PARTIAL = 3,   /* get/match (--require-all) found fewer keys than asked */
    EXIT_CONNECT = 4,
};

/* Keys per request and bytes per batch; a request refused as too big is
 * retried with half as many keys. */
#define BATCH_KEYS  256u
#define BATCH_BYTES (64u << 20)

/* ------------------------------------------------------------------------ */
/* options                                                                   */

enum {
    OPT_JSON = 256, OPT_MODEL, OPT_DTYPE, OPT_BLOCK_TOKENS, OPT_BLOCK_BYTES,
    OPT_LAYERS, OPT_KV_HEADS, OPT_HEAD_DIM, OPT_TP_SIZE, OPT_TP_RANK, OPT_EXTRA,
    OPT_KEYS_FILE, OPT_KEYS_OUT, OPT_SIZE, OPT_REQUIRE_ALL, OPT_INLINE, OPT_ADMIN,
};

static const char short_opts[] = "+S:t:hVo:";
static const struct option long_opts[] = {
    {"socket",       required_argument, NULL, 'S'},
    {"json",         no_argument,       NULL, OPT_JSON},
    {"timeout",      required_argument, NULL, 't'},
    {"help",         no_argument,       NULL, 'h'},
    {"version",      no_argument,       NULL, 'V'},
    {"model",        required_argument, NULL, OPT_MODEL},
    {"dtype",        required_argument, NULL, OPT_DTYPE},
    {"block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS},
    {"block-bytes",  required_argument, NULL, OPT_BLOCK_BYTES},
    {"layers",       required_argument, NULL, OPT_LAYERS},
    {"kv-heads",     required_argument, NULL, OPT_KV_HEADS},
    {"head-dim",     required_argument, NULL, OPT_HEAD_DIM},
    {"tp-size",      required_argument, NULL, OPT_TP_SIZE},
    {"tp-rank",      required_argument, NULL, OPT_TP_RANK},
    {"extra",        required_argument, NULL, OPT_EXTRA},
    {"keys-file",    required_argument, NULL, OPT_KEYS_FILE},
    {"keys-out",     required_argument, NULL, OPT_KEYS_OUT},
    {"output",       required_argument, NULL, 'o'},
    {"size",         required_argument, NULL, OPT_SIZE},
    {"require-all",  no_argument,       NULL, OPT_REQUIRE_ALL},
    {"inline",       no_argument,       NULL, OPT_INLINE},
    {"admin",        required_argument, NULL, OPT_ADMIN},
    {NULL, 0, NULL, 0},
};

/* Which command-specific options were given (global ones are not tracked). */
enum {
    F_LAYOUT      = 1u << 0,
    F_KEYS_FILE   = 1u << 1,
    F_KEYS_OUT    = 1u << 2,
    F_OUTPUT      = 1u << 3,
    F_SIZE        = 1u << 4,
    F_REQUIRE_ALL = 1u << 5,
    F_INLINE      = 1u << 6,
    F_ADMIN       = 1u << 7,
};

struct ctl {
    const char *socket;
    int json;
    int timeout_ms;              /* 0: library default / KVNODE_TIMEOUT_MS */
    unsigned given;              /* F_* */
    const char *given_name[8];   /* option spelling per F_* bit, for messages */
    kvnode_layout layout;
    const char *keys_file, *keys_out, *output;
    uint64_t size;
    int require_all, use_inline;
    const char *admin;           /* metrics: admin address (else from stats) */
};

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */

static void oom(void)
{
    fputs(PROG ": out of memory\n", stderr);
    exit(EXIT_ERR);
}

static void *xreallocarray(void *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        oom();
    size_t bytes = n * size;
    p = realloc(p, bytes ? bytes : 1);
    if (!p)
        oom();
    return p;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        oom();
    return s;
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs(PROG ": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nTry '" PROG " --help' for more information.\n", stderr);
    return EXIT_USAGE;
}

static int io_error(const char *what)
{
    fprintf(stderr, PROG ": %s: %s\n", what, strerror(errno));
    return EXIT_ERR;
}

/* A failed call on a connected client. */
static int lib_error(int rc, const kvnode_client *c)
{
    const char *msg = c ? kvnode_last_error(c) : NULL;
    if (msg && *msg)
        fprintf(stderr, PROG ": %s: %s\n", kvnode_strerror(rc), msg);
    else
        fprintf(stderr, PROG ": %s\n", kvnode_strerror(rc));
    return EXIT_ERR;
}

/* A failed kvnode_connect: exit 1 when the daemon or library rejected what we
 * asked for (layout, argument, memory), 4 for every other failure. */
static int connect_error(int rc, const char *path)
{
    const char *msg = kvnode_connect_error();
    if (msg && *msg)
        fprintf(stderr, PROG ": %s: %s\n", kvnode_strerror(rc), msg);
    else
        fprintf(stderr, PROG ": %s: %s\n", kvnode_strerror(rc), path);
    if (rc == -KVNODE_ELAYOUT || rc == -KVNODE_EINVAL || rc == -KVNODE_ENOMEM)
        return EXIT_ERR;
    return EXIT_CONNECT;
}

/* Unsigned decimal with no sign, no junk, within max. */
static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

static bool parse_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    if (!parse_u64(s, UINT32_MAX, &v))
        return false;
    *out = (uint32_t)v;
    return true;
}

/* SIZE: decimal bytes with an optional binary suffix: K, M, G, T, with or
 * without "iB" (KiB, MiB, ...), or B; case-insensitive. K = 1024. */
static bool parse_size(const char *s, uint64_t *out)
{
    static const char *const units[] = {"", "k", "m", "g", "t"};
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return false;
    unsigned shift = 0;
    if (*end) {
        size_t i, n = sizeof units / sizeof units[0];
        for (i = 1; i < n; i++)
            if (tolower((unsigned char)*end) == units[i][0])
                break;
        if (i < n) {
            shift = 10 * (unsigned)i;
            end++;
            if (strcasecmp(end, "ib") == 0)
                end += 2;
        } else if (strcasecmp(end, "b") == 0) {
            end++;
        }
        if (*end)
            return false;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return false;
    *out = (uint64_t)v << shift;
    return true;
}

/* A signed decimal key, surrounding blanks allowed. */
static bool parse_key(const char *s, kvnode_key *out)
{
    while (*s == ' ' || *s == '\t')
        s++;
    if (!((*s >= '0' && *s <= '9') || ((*s == '-' || *s == '+') && s[1] >= '0' && s[1] <= '9')))
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno)
        return false;
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')
        end++;
    if (*end)
        return false;
    *out = (kvnode_key)v;
    return true;
}

static bool is_negative_number(const char *s)
{
    if (s[0] != '-' || !s[1])
        return false;
    for (s++; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

struct keyvec { kvnode_key *v; size_t n, cap; };

static void keyvec_push(struct keyvec *kv, kvnode_key k)
{
    if (kv->n == kv->cap) {
        kv->cap = kv->cap ? 2 * kv->cap : 64;
        kv->v = xreallocarray(kv->v, kv->cap, sizeof *kv->v);
    }
    kv->v[kv->n++] = k;
}

/* One decimal key per line; blank lines and lines starting with '#' are
 * skipped. "-" is standard input. Returns an exit code. */
static int read_keys_file(const char *path, struct keyvec *kv)
{
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "r");
    if (!f)
        return io_error(path);
    char *line = NULL;
    size_t cap = 0;
    unsigned long lineno = 0;
    int rc = EXIT_OK;
    errno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0')
            continue;
        kvnode_key k;
        if (!parse_key(p, &k)) {
            p[strcspn(p, "\r\n")] = '\0';
            rc = usage_error("%s:%lu: invalid key '%s' (expected a signed 64-bit decimal integer)",
                             is_stdin ? "<stdin>" : path, lineno, p);
            break;
        }
        keyvec_push(kv, k);
    }
    if (rc == EXIT_OK && ferror(f))
        rc = io_error(path);
    free(line);
    if (!is_stdin)
        fclose(f);
    return rc;
}

/* Human byte count: "512 B", "64.0 KiB", "1.5 GiB". */
static void fmt_bytes(uint64_t v, char *buf, size_t len)
{
    static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (v < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", v);
        return;
    }
    double d = (double)v / 1024.0;
    size_t u = 0;
    while (d >= 1024.0 && u + 1 < sizeof unit / sizeof unit[0]) {
        d /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", d, unit[u]);
}

static void fmt_duration(double s, char *buf, size_t len)
{
    if (s < 60.0) {
        snprintf(buf, len, "%.1fs", s);
        return;
    }
    uint64_t t = (uint64_t)s;
    uint64_t d = t / 86400, h = t / 3600 % 24, m = t / 60 % 60, sec = t % 60;
    if (d)
        snprintf(buf, len, "%" PRIu64 "d %" PRIu64 "h %" PRIu64 "m %" PRIu64 "s", d, h, m, sec);
    else if (h)
        snprintf(buf, len, "%" PRIu64 "h %" PRIu64 "m %" PRIu64 "s", h, m, sec);
    else
        snprintf(buf, len, "%" PRIu64 "m %" PRIu64 "s", m, sec);
}

/* Put every data byte to out, then check the stream (flush included). */
static bool write_all(FILE *out, const void *p, size_t n)
{
    return fwrite(p, 1, n, out) == n;
}

/* ------------------------------------------------------------------------ */
/* JSON access (missing or mistyped fields read as absent)                   */

static bool jnum(const json_t *o, const char *key, double *v)
{
    json_t *x = json_is_object(o) ? json_object_get(o, key) : NULL;
    if (!json_is_number(x))
        return false;
    *v = json_number_value(x);
    return true;
}

static bool jint(const json_t *o, const char *key, long long *v)
{
    json_t *x = json_is_object(o) ? json_object_get(o, key) : NULL;
    if (json_is_integer(x)) {
        *v = json_integer_value(x);
        return true;
    }
    if (json_is_real(x)) {
        double d = json_real_value(x);
        if (d >= -9.2e18 && d <= 9.2e18 && d == (double)(long long)d) {
            *v = (long long)d;
            return true;
        }
    }
    return false;
}

static const char *jstr(const json_t *o, const char *key)
{
    json_t *x = json_is_object(o) ? json_object_get(o, key) : NULL;
    return json_is_string(x) ? json_string_value(x) : NULL;
}

static json_t *jobj(const json_t *o, const char *key)
{
    json_t *x = json_is_object(o) ? json_object_get(o, key) : NULL;
    return json_is_object(x) ? x : NULL;
}

/* Integer field as text, "-" when missing. */
static char *cell_int(const json_t *o, const char *key)
{
    long long v;
    return jint(o, key, &v) ? xasprintf("%lld", v) : xasprintf("-");
}

static char *cell_bytes(const json_t *o, const char *key)
{
    long long v;
    char b[32];
    if (!jint(o, key, &v) || v < 0)
        return xasprintf("-");
    fmt_bytes((uint64_t)v, b, sizeof b);
    return xasprintf("%s", b);
}

static char *cell_str(const json_t *o, const char *key)
{
    const char *s = jstr(o, key);
    return xasprintf("%s", s && *s ? s : "-");
}

/* Field copied for machine output; null when missing. */
static json_t *jcopy(const json_t *o, const char *key)
{
    json_t *x = json_is_object(o) ? json_object_get(o, key) : NULL;
    return x ? json_deep_copy(x) : json_null();
}

static int print_json(json_t *doc, size_t flags)
{
    char *s = json_dumps(doc, flags | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (!s)
        oom();
    puts(s);
    free(s);
    return EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* aligned tables                                                            */

struct table {
    size_t ncols, nrows, cap;
    const char *const *head;
    const char *align;           /* per column: 'l' or 'r' */
    char **cells;                /* nrows * ncols, malloc()ed */
};

static void table_row(struct table *t, char **row)
{
    if (t->nrows == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 8;
        t->cells = xreallocarray(t->cells, t->cap * t->ncols, sizeof *t->cells);
    }
    memcpy(t->cells + t->nrows * t->ncols, row, t->ncols * sizeof *row);
    t->nrows++;
}

static void table_print(const struct table *t, FILE *out)
{
    size_t *w = xreallocarray(NULL, t->ncols, sizeof *w);
    for (size_t c = 0; c < t->ncols; c++) {
        w[c] = strlen(t->head[c]);
        for (size_t r = 0; r < t->nrows; r++) {
            size_t l = strlen(t->cells[r * t->ncols + c]);
            if (l > w[c])
                w[c] = l;
        }
    }
    for (size_t r = 0; r <= t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *s = r == 0 ? t->head[c] : t->cells[(r - 1) * t->ncols + c];
            bool last = c + 1 == t->ncols;
            if (t->align[c] == 'r')
                fprintf(out, "%*s", (int)w[c], s);
            else
                fprintf(out, "%-*s", last ? 0 : (int)w[c], s);
            fputs(last ? "\n" : "  ", out);
        }
    }
    free(w);
}

static void table_free(struct table *t)
{
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
}

/* ------------------------------------------------------------------------ */
/* connection                                                                */

static void apply_timeout_env(const struct ctl *x)
{
    /* The library reads KVNODE_TIMEOUT_MS; setting it makes -t bound the
     * connect handshake too, not only the calls after it. */
    if (x->timeout_ms > 0) {
        char b[16];
        snprintf(b, sizeof b, "%d", x->timeout_ms);
        setenv("KVNODE_TIMEOUT_MS", b, 1);
    }
}

static int ctl_connect(const struct ctl *x, const kvnode_layout *layout, kvnode_client **c)
{
    apply_timeout_env(x);
    /* kvnodectl reads blocks with the CPU: it declares no GPU, whatever
     * KVNODE_CUDA_DEVICE says, and is never lent HBM. */
    int rc = kvnode_connect_device(x->socket, layout, -1, c);
    if (rc < 0) {
        *c = NULL;
        return connect_error(rc, x->socket);
    }
    if (x->timeout_ms > 0)
        kvnode_set_timeout(*c, x->timeout_ms);
    if (layout) {
        uint64_t bb = kvnode_block_bytes(*c);
        if (bb && bb != layout->block_bytes) {
            fprintf(stderr, PROG ": daemon reports %" PRIu64 " bytes per block, expected %" PRIu64 "\n",
                    bb, layout->block_bytes);
            kvnode_close(*c);
            *c = NULL;
            return EXIT_ERR;
        }
    }
    return EXIT_OK;
}

/* Fetch and parse the stats document of an observer connection. */
static int fetch_stats(const struct ctl *x, json_t **doc)
{
    kvnode_client *c;
    int ex = ctl_connect(x, NULL, &c);
    if (ex)
        return ex;
    char *text = NULL;
    int rc = kvnode_stats_json(c, &text);
    if (rc < 0) {
        ex = lib_error(rc, c);
        kvnode_close(c);
        free(text);
        return ex;
    }
    kvnode_close(c);
    json_error_t err;
    *doc = json_loads(text ? text : "", 0, &err);
    free(text);
    if (!*doc) {
        fprintf(stderr, PROG ": daemon sent invalid stats JSON: %s (line %d, column %d)\n",
                err.text, err.line, err.column);
        return EXIT_ERR;
    }
    if (!json_is_object(*doc)) {
        fprintf(stderr, PROG ": daemon sent a stats document that is not a JSON object\n");
        json_decref(*doc);
        *doc = NULL;
        return EXIT_ERR;
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* status                                                                    */

struct kv_line { char *label, *value; };

/* One tier's figures for status --json. */
static json_t *status_tier_json(json_t *tier)
{
    json_t *o = json_object();
    long long v, v2;
    if (!o)
        oom();
    json_object_set_new(o, "used_bytes", jcopy(tier, "used_bytes"));
    json_object_set_new(o, "capacity_bytes", jcopy(tier, "capacity_bytes"));
    if (jint(tier, "used_bytes", &v) && jint(tier, "capacity_bytes", &v2) && v2 > 0)
        json_object_set_new(o, "used_percent",
                            json_real((double)(long long)(10000.0 * (double)v / (double)v2 + 0.5) / 100.0));
    else
        json_object_set_new(o, "used_percent", json_null());
    json_object_set_new(o, "blocks", jcopy(tier, "blocks"));
    return o;
}

/* "U / C used (P%), B blocks" for a tier with memory. */
static char *status_tier_line(json_t *tier)
{
    char b1[32], b2[32], pct[32] = "-";
    long long v, v2;
    char *blocks = cell_int(tier, "blocks"), *line;
    bool have_used = jint(tier, "used_bytes", &v) && v >= 0;
    bool have_cap = jint(tier, "capacity_bytes", &v2) && v2 >= 0;
    if (have_used)
        fmt_bytes((uint64_t)v, b1, sizeof b1);
    if (have_cap)
        fmt_bytes((uint64_t)v2, b2, sizeof b2);
    if (have_used && have_cap && v2 > 0)
        snprintf(pct, sizeof pct, "%.1f%%", 100.0 * (double)v / (double)v2);
    if (!have_cap && !have_used)   /* the store tier: blocks known only there */
        line = xasprintf("%s blocks only in the store", blocks);
    else
        line = xasprintf("%s / %s used (%s), %s blocks", have_used ? b1 : "-", have_cap ? b2 : "-",
                         pct, blocks);
    free(blocks);
    return line;
}

static int cmd_status(const struct ctl *x)
{
    json_t *doc;
    int ex = fetch_stats(x, &doc);
    if (ex)
        return ex;

    json_t *tiers = jobj(doc, "tiers"), *clients = jobj(doc, "clients"), *leases = jobj(doc, "leases");
    json_t *nss = json_object_get(doc, "namespaces");
    long long v, v2;
    double d;

    if (x->json) {
        json_t *out = json_object(), *jt = json_object();
        if (!out || !jt)
            oom();
        json_object_set_new(out, "version", jcopy(doc, "version"));
        json_object_set_new(out, "protocol", jcopy(doc, "protocol"));
        json_object_set_new(out, "pid", jcopy(doc, "pid"));
        json_object_set_new(out, "uptime_s", jcopy(doc, "uptime_s"));
        json_object_set_new(out, "socket", jstr(doc, "socket") ? jcopy(doc, "socket")
                                                               : json_string(x->socket));
        const char *name;
        json_t *tier;
        json_object_foreach(tiers, name, tier) {
            if (json_is_array(tier)) {   /* hbm: one per device */
                json_t *arr = json_array(), *dev;
                size_t i;
                if (!arr)
                    oom();
                json_array_foreach(tier, i, dev) {
                    json_t *o = status_tier_json(dev);
                    json_object_set_new(o, "device", jcopy(dev, "device"));
                    json_array_append_new(arr, o);
                }
                json_object_set_new(jt, name, arr);
                continue;
            }
            json_t *o = status_tier_json(tier);
            if (json_object_get(tier, "pinned_bytes")) {
                json_object_set_new(o, "pinned_bytes", jcopy(tier, "pinned_bytes"));
                json_object_set_new(o, "pin_state", jcopy(tier, "pin_state"));
            }
            json_object_set_new(jt, name, o);
        }
        json_object_set_new(out, "tiers", jt);
        json_object_set_new(out, "namespaces",
                            json_is_array(nss) ? json_integer((json_int_t)json_array_size(nss)) : json_null());
        json_object_set_new(out, "clients_connected", jcopy(clients, "connected"));
        json_object_set_new(out, "leases_read", jcopy(leases, "read"));
        json_object_set_new(out, "leases_write", jcopy(leases, "write"));
        json_object_set_new(out, "reaped_total", jcopy(leases, "reaped_total"));
        json_object_set_new(out, "admin", jcopy(doc, "admin"));
        json_object_set_new(out, "reloads", jcopy(doc, "reloads"));
        if (jobj(doc, "kvcm"))
            json_object_set_new(out, "kvcm", jcopy(doc, "kvcm"));
        json_t *persist = jobj(doc, "persist");
        if (persist) {
            json_t *p = json_object();
            if (!p)
                oom();
            static const char *const keep[] = { "backend", "policy", "state", "last_error",
                                                 "queue_depth", "queue_capacity",
                                                 "written_blocks_total", "read_blocks_total",
                                                 "dropped_total", "promotions_total",
                                                 "wait_timeouts_total", "recovery" };
            for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
                if (json_object_get(persist, keep[i]))
                    json_object_set_new(p, keep[i], jcopy(persist, keep[i]));
            json_object_set_new(out, "persist", p);
        }
        print_json(out, JSON_COMPACT);
        json_decref(out);
        json_decref(doc);
        return EXIT_OK;
    }

    struct kv_line lines[64];
    size_t n = 0;
    char b1[32], b2[32];
    const char *s = jstr(doc, "version");

    lines[n].label = xasprintf("version");
    if (jint(doc, "protocol", &v))
        lines[n++].value = xasprintf("%s (protocol %lld)", s ? s : "-", v);
    else
        lines[n++].value = xasprintf("%s", s ? s : "-");
    lines[n].label = xasprintf("pid");
    lines[n++].value = cell_int(doc, "pid");
    lines[n].label = xasprintf("uptime");
    if (jnum(doc, "uptime_s", &d) && d >= 0) {
        fmt_duration(d, b1, sizeof b1);
        lines[n++].value = xasprintf("%s", b1);
    } else {
        lines[n++].value = xasprintf("-");
    }
    lines[n].label = xasprintf("socket");
    s = jstr(doc, "socket");
    lines[n++].value = xasprintf("%s", s ? s : x->socket);

    const char *name;
    json_t *tier;
    size_t ntiers = 0;
    json_object_foreach(tiers, name, tier) {
        if (n + 8 >= sizeof lines / sizeof lines[0])
            break;
        ntiers++;
        if (json_is_array(tier)) {   /* hbm: one line per device */
            json_t *dev;
            size_t i;
            json_array_foreach(tier, i, dev) {
                if (n + 8 >= sizeof lines / sizeof lines[0])
                    break;
                lines[n].label = jint(dev, "device", &v) ? xasprintf("tier %s (GPU %lld)", name, v)
                                                         : xasprintf("tier %s", name);
                lines[n++].value = status_tier_line(dev);
            }
            continue;
        }
        lines[n].label = xasprintf("tier %s", name);
        lines[n++].value = status_tier_line(tier);
        const char *pin = jstr(tier, "pin_state");
        if (pin && strcmp(pin, "off") != 0 && jint(tier, "pinned_bytes", &v) &&
            jint(tier, "capacity_bytes", &v2)) {
            fmt_bytes((uint64_t)v, b1, sizeof b1);
            fmt_bytes((uint64_t)v2, b2, sizeof b2);
            lines[n].label = xasprintf("pinned");
            lines[n++].value = xasprintf("%s of %s (%s)", b1, b2, pin);
        }
    }
    if (!ntiers) {
        lines[n].label = xasprintf("tiers");
        lines[n++].value = xasprintf("-");
    }
    lines[n].label = xasprintf("namespaces");
    lines[n++].value = json_is_array(nss) ? xasprintf("%zu", json_array_size(nss)) : xasprintf("-");
    long long rd, wr;
    lines[n].label = xasprintf("clients");
    lines[n++].value = jint(clients, "connected", &v) ? xasprintf("%lld connected", v) : xasprintf("-");
    lines[n].label = xasprintf("leases");
    if (jint(leases, "read", &rd) && jint(leases, "write", &wr))
        lines[n++].value = xasprintf("%lld read, %lld write", rd, wr);
    else
        lines[n++].value = xasprintf("-");
    lines[n].label = xasprintf("reaped");
    lines[n++].value = jint(leases, "reaped_total", &v) ? xasprintf("%lld leases in total", v) : xasprintf("-");
    json_t *persist = jobj(doc, "persist");
    if (persist) {
        const char *state = jstr(persist, "state"), *backend = jstr(persist, "backend");
        lines[n].label = xasprintf("persist");
        if (!state || strcmp(state, "off") == 0) {
            lines[n++].value = xasprintf("off");
        } else {
            long long q = 0, qc = 0, wr_ = 0, rd_ = 0, dr = 0, pr = 0, to = 0;
            jint(persist, "queue_depth", &q);
            jint(persist, "queue_capacity", &qc);
            jint(persist, "written_blocks_total", &wr_);
            jint(persist, "read_blocks_total", &rd_);
            jint(persist, "dropped_total", &dr);
            jint(persist, "promotions_total", &pr);
            jint(persist, "wait_timeouts_total", &to);
            const char *policy = jstr(persist, "policy"), *lerr = jstr(persist, "last_error");
            lines[n++].value = xasprintf("%s store, %s, %s; queue %lld/%lld; %lld blocks written, "
                                         "%lld read, %lld dropped; %lld promotions, %lld timed out%s%s",
                                         backend ? backend : "-", policy ? policy : "-", state, q, qc,
                                         wr_, rd_, dr, pr, to, lerr && *lerr ? "\n    last error: " : "",
                                         lerr && *lerr ? lerr : "");
            json_t *rec = jobj(persist, "recovery");
            lines[n].label = xasprintf("recovery");
            if (rec && jint(rec, "found", &v)) {
                bool running = json_is_true(json_object_get(rec, "running"));
                bool complete = json_is_true(json_object_get(rec, "complete"));
                lines[n++].value = xasprintf("%s, %lld blocks found", running ? "scanning the store" :
                                             complete ? "complete" : "not run", v);
            } else {
                lines[n++].value = xasprintf("-");
            }
        }
    }
    json_t *kvcm = jobj(doc, "kvcm");
    if (kvcm) {
        const char *state = jstr(kvcm, "state"), *lerr = jstr(kvcm, "last_error");
        lines[n].label = xasprintf("kvcm");
        if (!state || strcmp(state, "DISABLED") == 0) {
            lines[n++].value = xasprintf("off");
        } else {
            long long q = 0, acc = 0, drop = 0, snaps = 0, last = 0;
            jint(kvcm, "queue", &q);
            jint(kvcm, "accepted_total", &acc);
            jint(kvcm, "dropped_total", &drop);
            jint(kvcm, "snapshots_total", &snaps);
            jint(kvcm, "last_snapshot_unix_ms", &last);
            char when[64] = "never";
            if (last > 0) {
                time_t t = (time_t)(last / 1000);
                struct tm tm;
                gmtime_r(&t, &tm);
                strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
            }
            lines[n++].value = xasprintf("%s as %s; queue %lld; %lld events accepted, %lld dropped; "
                                         "%lld snapshots, last %s%s%s", state,
                                         jstr(kvcm, "host_ip_port") ? jstr(kvcm, "host_ip_port") : "-",
                                         q, acc, drop, snaps, when,
                                         lerr && *lerr ? "\n    last error: " : "",
                                         lerr && *lerr ? lerr : "");
        }
    }
    s = jstr(doc, "admin");
    lines[n].label = xasprintf("admin");
    lines[n++].value = xasprintf("%s", s ? s : "off");
    json_t *reloads = jobj(doc, "reloads");
    lines[n].label = xasprintf("reloads");
    if (jint(reloads, "ok_total", &v) && jint(reloads, "failed_total", &v2)) {
        s = jstr(reloads, "last_error");
        if (s && *s) {
            /* The running configuration is the old one: say why, every line. */
            size_t extra = 0;
            for (const char *p = s; *p; p++)
                extra += *p == '\n';
            char *why = malloc(strlen(s) + 4 * extra + 1), *q = why;
            if (!why)
                oom();
            for (const char *p = s; *p; p++) {
                *q++ = *p;
                if (*p == '\n')
                    q = memcpy(q, "    ", 4) + 4;
            }
            *q = '\0';
            lines[n++].value = xasprintf("%lld ok, %lld failed; the last one failed and the previous "
                                         "configuration is running:\n    %s", v, v2, why);
            free(why);
        }
        else
            lines[n++].value = xasprintf("%lld ok, %lld failed", v, v2);
    } else {
        lines[n++].value = xasprintf("-");
    }

    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (strlen(lines[i].label) > w)
            w = strlen(lines[i].label);
    for (size_t i = 0; i < n; i++) {
        printf("%-*s  %s\n", (int)w, lines[i].label, lines[i].value);
        free(lines[i].label);
        free(lines[i].value);
    }
    json_decref(doc);
    return EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* stats                                                                     */

static bool is_scalar(const json_t *v)
{
    return !json_is_object(v) && !json_is_array(v);
}

static void print_scalar(FILE *out, const char *key, const json_t *v)
{
    if (json_is_string(v)) {
        fputs(json_string_value(v), out);
    } else if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        fprintf(out, "%" JSON_INTEGER_FORMAT, i);
        size_t kl = key ? strlen(key) : 0;
        if (i >= 1024 && kl >= 5 && strcmp(key + kl - 5, "bytes") == 0) {
            char b[32];
            fmt_bytes((uint64_t)i, b, sizeof b);
            fprintf(out, " (%s)", b);
        }
    } else if (json_is_real(v)) {
        fprintf(out, "%.15g", json_real_value(v));
    } else if (json_is_true(v)) {
        fputs("true", out);
    } else if (json_is_false(v)) {
        fputs("false", out);
    } else {
        fputs("-", out);
    }
}

/* Array of scalars on one line: "a, b, c". */
static void print_scalar_list(FILE *out, const json_t *arr)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (i)
            fputs(", ", out);
        print_scalar(out, NULL, v);
    }
}

static bool all_scalars(const json_t *arr)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
        if (!is_scalar(v))
            return false;
    return true;
}

/* Members of obj, one per line, "key: value" aligned; nested objects and
 * arrays as indented sections. dash: obj is an array element, first line
 * starts with "- " (YAML-like). */
static void dump_members(FILE *out, const json_t *obj, int indent, bool dash)
{
    const char *key;
    json_t *v;
    int width = 0;
    json_object_foreach((json_t *)obj, key, v)
        if (is_scalar(v) || json_object_size(v) == 0 || json_array_size(v) == 0 ||
            (json_is_array(v) && all_scalars(v)))
            if ((int)strlen(key) > width)
                width = (int)strlen(key);
    int body = indent + (dash ? 2 : 0);
    bool first = true;
    json_object_foreach((json_t *)obj, key, v) {
        if (dash && first)
            fprintf(out, "%*s- ", indent, "");
        else
            fprintf(out, "%*s", body, "");
        first = false;
        if (json_is_object(v) && json_object_size(v)) {
            fprintf(out, "%s:\n", key);
            dump_members(out, v, body + 2, false);
        } else if (json_is_array(v) && json_array_size(v) && !all_scalars(v)) {
            fprintf(out, "%s:\n", key);
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) {
                if (json_is_object(e) && json_object_size(e)) {
                    dump_members(out, e, body + 2, true);
                } else {
                    fprintf(out, "%*s- ", body + 2, "");
                    if (json_is_array(e) && all_scalars(e))
                        print_scalar_list(out, e);
                    else if (is_scalar(e))
                        print_scalar(out, NULL, e);
                    else {
                        char *s = json_dumps(e, JSON_COMPACT | JSON_ENCODE_ANY);
                        fputs(s ? s : "-", out);
                        free(s);
                    }
                    fputc('\n', out);
                }
            }
        } else {
            fprintf(out, "%s:%*s ", key, width - (int)strlen(key), "");
            if (json_is_object(v))
                fputs("(none)", out);
            else if (json_is_array(v))
                json_array_size(v) ? print_scalar_list(out, v) : (void)fputs("(none)", out);
            else
                print_scalar(out, key, v);
            fputc('\n', out);
        }
    }
}

static int cmd_stats(const struct ctl *x)
{
    json_t *doc;
    int ex = fetch_stats(x, &doc);
    if (ex)
        return ex;
    if (x->json)
        print_json(doc, JSON_INDENT(2));
    else
        dump_members(stdout, doc, 0, false);
    json_decref(doc);
    return EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* namespaces                                                                */

static int cmd_namespaces(const struct ctl *x)
{
    json_t *doc;
    int ex = fetch_stats(x, &doc);
    if (ex)
        return ex;
    json_t *nss = json_object_get(doc, "namespaces");
    if (!json_is_array(nss))
        nss = NULL;
    if (x->json) {
        json_t *empty = json_array();
        if (!empty)
            oom();
        print_json(nss ? nss : empty, JSON_INDENT(2));
        json_decref(empty);
        json_decref(doc);
        return EXIT_OK;
    }
    if (!nss || json_array_size(nss) == 0) {
        puts("no namespaces");
        json_decref(doc);
        return EXIT_OK;
    }
    static const char *const head[] = {"ID", "DEPLOYMENT", "TP", "BLOCK_TOKENS", "BLOCK_BYTES",
                                       "BLOCKS", "BYTES", "CLIENTS"};
    struct table t = {.ncols = 8, .head = head, .align = "rlrrrrrr"};
    size_t i;
    json_t *ns;
    json_array_foreach(nss, i, ns) {
        long long r, sz;
        char *tp;
        if (jint(ns, "tp_rank", &r) && jint(ns, "tp_size", &sz))
            tp = xasprintf("%lld/%lld", r, sz);
        else
            tp = xasprintf("-");
        char *row[8] = {cell_int(ns, "id"), cell_str(ns, "deployment_id"), tp,
                        cell_int(ns, "block_tokens"), cell_bytes(ns, "block_bytes"),
                        cell_int(ns, "blocks"), cell_bytes(ns, "bytes"), cell_int(ns, "clients")};
        table_row(&t, row);
    }
    table_print(&t, stdout);
    table_free(&t);
    json_decref(doc);
    return EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* ping                                                                      */

static int cmd_ping(const struct ctl *x)
{
    kvnode_client *c;
    int ex = ctl_connect(x, NULL, &c);
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
/* reload                                                                    */

static int cmd_reload(const struct ctl *x)
{
    kvnode_client *c;
    char *not_applied = NULL;
    int ex = ctl_connect(x, NULL, &c);
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
/* data commands                                                             */

static size_t batch_keys(const kvnode_layout *l)
{
    uint64_t by_bytes = BATCH_BYTES / l->block_bytes;
    if (by_bytes < 1)
        by_bytes = 1;
    return by_bytes < BATCH_KEYS ? (size_t)by_bytes : BATCH_KEYS;
}

/* Keys from the command line and/or --keys-file (not both). */
static int collect_keys(const struct ctl *x, char **args, int nargs, struct keyvec *kv)
{
    if (nargs > 0 && x->keys_file)
        return usage_error("give keys either as arguments or with --keys-file, not both");
    if (x->keys_file) {
        int ex = read_keys_file(x->keys_file, kv);
        if (ex)
            return ex;
        if (kv->n == 0)
            return usage_error("%s: no keys", x->keys_file);
        return EXIT_OK;
    }
    if (nargs == 0)
        return usage_error("no keys given (arguments or --keys-file)");
    for (int i = 0; i < nargs; i++) {
        kvnode_key k;
        if (!parse_key(args[i], &k))
            return usage_error("invalid key '%s' (expected a signed 64-bit decimal integer)", args[i]);
        keyvec_push(kv, k);
    }
    return EXIT_OK;
}

static const char *ns_desc(const kvnode_layout *l, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s tp %" PRIu32 "/%" PRIu32, l->model, l->dtype, l->tp_rank, l->tp_size);
    return buf;
}

/* match and delete: send the keys in batches (a batch refused as too big is
 * retried with half as many keys). match stops at the first key that is not
 * stored, so *count is the length of the stored prefix; delete goes through
 * every key and *count is how many were deleted. *nkeys: the keys given. */
static int match_or_delete(const struct ctl *x, char **args, int nargs, bool del, size_t *count,
                           size_t *nkeys, kvnode_tiers *tiers)
{
    struct keyvec kv = {0};
    int ex = collect_keys(x, args, nargs, &kv);
    if (ex) {
        free(kv.v);
        return ex;
    }
    kvnode_client *c;
    if ((ex = ctl_connect(x, &x->layout, &c))) {
        free(kv.v);
        return ex;
    }
    size_t batch = BATCH_KEYS, done = 0, total = 0;
    while (done < kv.n) {
        size_t n = kv.n - done < batch ? kv.n - done : batch, k = 0;
        kvnode_tiers t;
        int rc = del ? kvnode_delete(c, kv.v + done, n, &k) : kvnode_match_tiers(c, kv.v + done, n, &t);
        if (!del && rc == 0) {
            k = t.matched;
            tiers->hbm += t.hbm;
            tiers->host += t.host;
            tiers->store += t.store;
        }
        if (rc == -KVNODE_ETOOBIG && batch > 1) {
            batch /= 2;
            continue;
        }
        if (rc < 0) {
            ex = lib_error(rc, c);
            break;
        }
        total += k < n ? k : n;
        done += n;
        if (!del && k < n)
            break;
    }
    kvnode_close(c);
    *count = total;
    *nkeys = kv.n;
    free(kv.v);
    return ex;
}

static int cmd_match(const struct ctl *x, char **args, int nargs)
{
    size_t matched, nkeys;
    kvnode_tiers t = { 0 };
    int ex = match_or_delete(x, args, nargs, false, &matched, &nkeys, &t);
    if (ex)
        return ex;
    if (x->json)
        printf("{\"matched\":%zu,\"keys\":%zu,\"hbm\":%zu,\"host\":%zu,\"store\":%zu}\n",
               matched, nkeys, t.hbm, t.host, t.store);
    else if (t.store || t.hbm)
        printf("matched %zu of %zu (%zu in GPU memory, %zu in host memory, %zu only in the store)\n",
               matched, nkeys, t.hbm, t.host, t.store);
    else
        printf("matched %zu of %zu\n", matched, nkeys);
    return x->require_all && matched < nkeys ? EXIT_PARTIAL : EXIT_OK;
}

static int cmd_delete(const struct ctl *x, char **args, int nargs)
{
    size_t deleted, nkeys;
    int ex = match_or_delete(x, args, nargs, true, &deleted, &nkeys, NULL);
    if (ex)
        return ex;
    if (x->json)
        printf("{\"deleted\":%zu,\"keys\":%zu}\n", deleted, nkeys);
    else
        printf("deleted %zu of %zu\n", deleted, nkeys);
    return EXIT_OK;
}

static uint64_t fnv1a64(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Read one block: up to len bytes, the rest zero-filled. Returns the data
 * bytes read (0 at end of file); *err on a read error. */
static size_t read_block(FILE *f, unsigned char *buf, size_t len, bool *err)
{
    size_t got = fread(buf, 1, len, f);
    if (got < len) {
        if (ferror(f))
            *err = true;
        memset(buf + got, 0, len - got);
    }
    return got;
}

static int cmd_put(const struct ctl *x, char **args, int nargs)
{
    if (nargs != 1)
        return usage_error(nargs ? "put takes one FILE" : "put: missing FILE");
    const kvnode_layout *l = &x->layout;
    const char *path = args[0];
    bool is_stdin = strcmp(path, "-") == 0;
    const char *disp = is_stdin ? "<stdin>" : path;
    if (l->block_bytes > SIZE_MAX / 2)
        return usage_error("--block-bytes %" PRIu64 " is too large for this machine", l->block_bytes);
    size_t bb = (size_t)l->block_bytes;

    int ex = EXIT_OK;
    FILE *in = NULL, *spool = NULL, *keys_out = NULL;
    kvnode_client *c = NULL;
    unsigned char *buf = NULL;
    const void **src = NULL;
    int64_t *tokens = NULL;
    kvnode_key *keys = NULL;
    size_t n = 0, cap = 0, stored = 0;
    uint64_t total = 0;
    bool err = false;

    in = is_stdin ? stdin : fopen(path, "rb");
    if (!in)
        return io_error(path);
    if (x->keys_out && !(keys_out = fopen(x->keys_out, "w"))) {
        ex = io_error(x->keys_out);
        goto out;
    }
    if ((ex = ctl_connect(x, l, &c)))
        goto out;

    /* Pass 1: one digest per block. Input that cannot be read twice (a pipe)
     * is spooled to an anonymous temporary file. */
    struct stat st;
    if (fstat(fileno(in), &st) == 0 && !S_ISREG(st.st_mode) && !(spool = tmpfile())) {
        ex = io_error("temporary file");
        goto out;
    }
    size_t batch = batch_keys(l);
    buf = xreallocarray(NULL, batch, bb);
    for (;;) {
        size_t got = read_block(in, buf, bb, &err);
        if (err) {
            ex = io_error(disp);
            goto out;
        }
        if (got == 0)
            break;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            tokens = xreallocarray(tokens, cap, sizeof *tokens);
        }
        tokens[n++] = (int64_t)fnv1a64(buf, bb);
        total += got;
        if (spool && !write_all(spool, buf, bb)) {
            ex = io_error("temporary file");
            goto out;
        }
        if (got < bb)
            break;
    }
    keys = xreallocarray(NULL, n, sizeof *keys);
    if (n && kvnode_hash_tokens(tokens, n, 1, keys, n) != n) {
        fprintf(stderr, PROG ": kvnode_hash_tokens returned fewer keys than blocks\n");
        ex = EXIT_ERR;
        goto out;
    }

    /* Pass 2: store batch by batch (the digest is checked again, so a file
     * changed in between is refused rather than stored under wrong keys). */
    FILE *data = spool ? spool : in;
    if (n && (fflush(data) != 0 || fseeko(data, 0, SEEK_SET) != 0)) {
        ex = io_error(spool ? "temporary file" : disp);
        goto out;
    }
    clearerr(data);
    src = xreallocarray(NULL, batch, sizeof *src);
    size_t done = 0, req = batch;
    while (done < n) {
        size_t m = n - done < batch ? n - done : batch;
        for (size_t i = 0; i < m; i++) {
            unsigned char *b = buf + i * bb;
            read_block(data, b, bb, &err);
            if (err) {
                ex = io_error(spool ? "temporary file" : disp);
                goto out;
            }
            if ((int64_t)fnv1a64(b, bb) != tokens[done + i]) {
                fprintf(stderr, PROG ": %s: changed while it was being read\n", disp);
                ex = EXIT_ERR;
                goto out;
            }
            src[i] = b;
        }
        /* A request refused as too big is retried with half as many keys. */
        int rc = 0;
        size_t k = 0;
        while (k < m) {
            size_t r = m - k < req ? m - k : req;
            rc = x->use_inline ? kvnode_put_inline(c, keys + done + k, r, src + k)
                               : kvnode_put(c, keys + done + k, r, src + k);
            if (rc == -KVNODE_ETOOBIG && req > 1) {
                req /= 2;
                continue;
            }
            if (rc < 0)
                break;
            k += r;
        }
        done += k;
        stored = done;
        if (rc < 0) {
            ex = lib_error(rc, c);
            if (stored)
                fprintf(stderr, PROG ": %zu of %zu blocks were stored before the error\n", stored, n);
            goto out;
        }
    }

    FILE *kout = keys_out ? keys_out : stdout;
    for (size_t i = 0; i < n; i++)
        fprintf(kout, "%" PRId64 "\n", (int64_t)keys[i]);
    if (keys_out) {
        int werr = ferror(keys_out);
        int cerr = fclose(keys_out);
        keys_out = NULL;
        if (werr || cerr) {
            if (werr)
                errno = EIO;
            ex = io_error(x->keys_out);
            goto out;
        }
    }
    /* When the keys go to standard output the summary goes to stderr. */
    FILE *sum = x->keys_out ? stdout : stderr;
    char nsb[512];
    if (x->json)
        fprintf(sum, "{\"stored\":%zu,\"bytes\":%" PRIu64 ",\"block_bytes\":%" PRIu64 "}\n", n, total,
                l->block_bytes);
    else
        fprintf(sum, "stored %zu block%s (%" PRIu64 " bytes) in namespace %s\n", n, n == 1 ? "" : "s",
                total, ns_desc(l, nsb, sizeof nsb));
out:
    if (c)
        kvnode_close(c);
    if (keys_out)
        fclose(keys_out);
    if (spool)
        fclose(spool);
    if (in && !is_stdin)
        fclose(in);
    free(buf);
    free(src);
    free(tokens);
    free(keys);
    return ex;
}

static int cmd_get(const struct ctl *x, char **args, int nargs)
{
    if (!x->output)
        return usage_error("get: -o OUT is required");
    const kvnode_layout *l = &x->layout;
    if (l->block_bytes > SIZE_MAX / 2)
        return usage_error("--block-bytes %" PRIu64 " is too large for this machine", l->block_bytes);
    size_t bb = (size_t)l->block_bytes;
    struct keyvec kv = {0};
    int ex = collect_keys(x, args, nargs, &kv);
    if (ex) {
        free(kv.v);
        return ex;
    }
    bool to_stdout = strcmp(x->output, "-") == 0;
    kvnode_client *c = NULL;
    FILE *out = NULL;
    unsigned char *buf = NULL;
    void **dst = NULL;
    size_t got_total = 0;
    uint64_t written = 0, limit = (x->given & F_SIZE) ? x->size : UINT64_MAX;

    if ((ex = ctl_connect(x, l, &c)))
        goto done;
    out = to_stdout ? stdout : fopen(x->output, "wb");
    if (!out) {
        ex = io_error(x->output);
        goto done;
    }
    size_t batch = batch_keys(l);
    buf = xreallocarray(NULL, batch, bb);
    dst = xreallocarray(NULL, batch, sizeof *dst);
    for (size_t i = 0; i < batch; i++)
        dst[i] = buf + i * bb;
    while (got_total < kv.n) {
        size_t n = kv.n - got_total < batch ? kv.n - got_total : batch, got = 0;
        int rc = x->use_inline ? kvnode_get_inline(c, kv.v + got_total, n, dst, &got)
                               : kvnode_get(c, kv.v + got_total, n, dst, &got);
        if (rc == -KVNODE_ETOOBIG && batch > 1) {
            batch /= 2;
            continue;
        }
        if (rc < 0) {
            ex = lib_error(rc, c);
            goto done;
        }
        if (got > n)
            got = n;
        uint64_t want = (uint64_t)got * bb;
        if (want > limit - written)
            want = limit - written;
        if (want && !write_all(out, buf, (size_t)want)) {
            ex = io_error(x->output);
            goto done;
        }
        written += want;
        got_total += got;
        if (got < n)
            break;
    }
    if (to_stdout ? fflush(out) != 0 : fclose(out) != 0) {
        if (!to_stdout)
            out = NULL;
        ex = io_error(x->output);
        goto done;
    }
    if (!to_stdout)
        out = NULL;
    FILE *sum = to_stdout ? stderr : stdout;
    if (x->json)
        fprintf(sum, "{\"got\":%zu,\"keys\":%zu,\"bytes\":%" PRIu64 "}\n", got_total, kv.n, written);
    else
        fprintf(sum, "got %zu of %zu blocks\n", got_total, kv.n);
    if (got_total < kv.n)
        ex = EXIT_PARTIAL;
done:
    if (c)
        kvnode_close(c);
    if (out && !to_stdout)
        fclose(out);
    free(buf);
    free(dst);
    free(kv.v);
    return ex;
}

/* ------------------------------------------------------------------------ */
/* argument handling                                                         */

static void print_help(void)
{
    fputs(
"Usage: " PROG " [OPTION]... COMMAND [ARG]...\n"
"Operator tool of kvnoded, the node-local KV-cache daemon.\n"
"\n"
"Commands:\n"
"  status                        summary: version, uptime, tiers, namespaces, clients, leases\n"
"  stats                         the daemon's whole statistics document\n"
"  namespaces                    table of the namespaces\n"
"  ping                          check that the daemon answers\n"
"  reload                        make the daemon re-read its config file (root or its user)\n"
"  metrics [--admin ADDR]        print the Prometheus metrics from the admin HTTP listener\n"
"  match  LAYOUT KEY...          length of the cached prefix of a key chain\n"
"  put    LAYOUT FILE            store FILE as a chain of blocks; print the keys\n"
"  get    LAYOUT -o OUT KEY...   read a chain of blocks into OUT\n"
"  delete LAYOUT KEY...          remove keys\n"
"\n"
"Global options:\n"
"  -S, --socket PATH       daemon socket (default $KVNODE_SOCKET, else " DEFAULT_SOCKET ")\n"
"      --json              machine-readable output\n"
"  -t, --timeout MS        per-call timeout in milliseconds (default $KVNODE_TIMEOUT_MS, else 10000)\n"
"  -h, --help              show this help and exit\n"
"  -V, --version           show the version and exit\n"
"\n"
"Layout options (match, put, get, delete):\n"
"      --model M           model name (required)\n"
"      --dtype D           data type (default bf16)\n"
"      --block-tokens N    tokens per block (default 16)\n"
"      --block-bytes SIZE  bytes of one block (required)\n"
"      --layers N, --kv-heads N, --head-dim N   (default 1 each)\n"
"      --tp-size N         tensor-parallel size (default 1)\n"
"      --tp-rank N         tensor-parallel rank (default 0)\n"
"      --extra S           free-form layout discriminator\n"
"\n"
"Command options:\n"
"      --keys-file F       keys, one decimal per line ('-': stdin) (match, get, delete)\n"
"      --require-all       match: exit 3 unless every key is cached\n"
"      --keys-out F        put: write the keys to F instead of standard output\n"
"  -o, --output OUT        get: output file ('-': standard output)\n"
"      --size BYTES        get: truncate the output to BYTES\n"
"      --inline            put, get: move the bytes inside the messages (no shared memory)\n"
"      --admin ADDR        metrics: admin address (HOST:PORT or unix:PATH; default: asked\n"
"                          from the daemon's stats)\n"
"\n"
"SIZE and BYTES take the suffixes K, M, G, T (powers of 1024; KiB, MiB, ... also accepted).\n"
"Put negative keys after '--' or in a keys file if they could be taken for options.\n"
"Exit status: 0 ok, 1 error, 2 usage error, 3 partial result, 4 cannot connect.\n"
"See kvnodectl(1).\n", stdout);
}

static const struct option *find_long(const char *name, size_t len)
{
    const struct option *hit = NULL;
    for (const struct option *o = long_opts; o->name; o++) {
        if (strncmp(o->name, name, len) != 0)
            continue;
        if (strlen(o->name) == len)
            return o;
        if (hit)
            return NULL;   /* ambiguous: getopt_long will say so */
        hit = o;
    }
    return hit;
}

/* Reorder argv to: options (with their values) "--" operands, so options may
 * come before or after the command and negative keys ("-42") are operands,
 * not options. Returns a malloc()ed vector of argc+2 entries (NULL-ended);
 * *missing names a last option that lacks its required value. */
static char **reorder_args(int argc, char **argv, int *nargc, const char **missing)
{
    char **opts = xreallocarray(NULL, (size_t)argc + 2, sizeof *opts);
    char **ops = xreallocarray(NULL, (size_t)argc + 1, sizeof *ops);
    int no = 0, np = 0;
    bool end = false;
    *missing = NULL;
    opts[no++] = (char *)PROG;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (end || a[0] != '-' || a[1] == '\0' || is_negative_number(a)) {
            ops[np++] = a;
        } else if (strcmp(a, "--") == 0) {
            end = true;
        } else if (a[1] == '-') {
            opts[no++] = a;
            const char *eq = strchr(a + 2, '=');
            const struct option *o = find_long(a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
            if (!eq && o && o->has_arg == required_argument) {
                if (i + 1 >= argc) {
                    *missing = a;
                    break;
                }
                opts[no++] = argv[++i];
            }
        } else {
            opts[no++] = a;
            for (const char *p = a + 1; *p; p++) {
                const char *s = strchr(short_opts + 1, *p);
                if (s && *s != ':' && s[1] == ':') {
                    if (p[1] == '\0') {
                        if (i + 1 >= argc)
                            *missing = a;
                        else
                            opts[no++] = argv[++i];
                    }
                    break;
                }
            }
        }
    }
    opts[no++] = (char *)"--";
    memcpy(opts + no, ops, (size_t)np * sizeof *ops);
    opts[no + np] = NULL;
    free(ops);
    *nargc = no + np;
    return opts;
}

static void mark(struct ctl *x, unsigned flag, const char *spelling)
{
    x->given |= flag;
    for (unsigned b = 0; b < 8; b++)
        if (flag == 1u << b)
            x->given_name[b] = spelling;
}

struct command {
    const char *name;
    unsigned allowed;   /* F_* */
    int (*run)(const struct ctl *, char **, int);
    int (*run_noargs)(const struct ctl *);   /* instead of run: takes no arguments */
};

/* metrics: GET /metrics from the admin listener ("HOST:PORT", "[V6]:PORT",
 * "unix:PATH" or an http:// URL); its address comes from --admin or the
 * stats document's "admin" field. */
static size_t metrics_sink(char *p, size_t size, size_t n, void *arg)
{
    return fwrite(p, size, n, arg);
}

static int cmd_metrics(const struct ctl *x)
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

static const struct command commands[] = {
    {"status",     0, NULL, cmd_status},
    {"stats",      0, NULL, cmd_stats},
    {"namespaces", 0, NULL, cmd_namespaces},
    {"ping",       0, NULL, cmd_ping},
    {"reload",     0, NULL, cmd_reload},
    {"metrics",    F_ADMIN, NULL, cmd_metrics},
    {"match",      F_LAYOUT | F_KEYS_FILE | F_REQUIRE_ALL, cmd_match, NULL},
    {"put",        F_LAYOUT | F_KEYS_OUT | F_INLINE, cmd_put, NULL},
    {"get",        F_LAYOUT | F_KEYS_FILE | F_OUTPUT | F_SIZE | F_INLINE, cmd_get, NULL},
    {"delete",     F_LAYOUT | F_KEYS_FILE, cmd_delete, NULL},
};

int main(int argc, char **argv)
{
    struct ctl x = {0};
    x.layout.dtype = "bf16";
    x.layout.block_tokens = 16;
    x.layout.num_layers = x.layout.kv_heads = x.layout.head_dim = 1;
    x.layout.tp_size = 1;
    const char *env = getenv("KVNODE_SOCKET");
    x.socket = env && *env ? env : DEFAULT_SOCKET;

    int nargc, ex = EXIT_OK;
    const char *missing;
    char **nargv = reorder_args(argc, argv, &nargc, &missing);
    if (missing) {
        free(nargv);
        return usage_error("option '%s' requires an argument", missing);
    }
    bool help = false, version = false;
    int opt;
    uint64_t u64;
    uint32_t *u32 = NULL;
    while ((opt = getopt_long(nargc, nargv, short_opts, long_opts, NULL)) != -1) {
        switch (opt) {
        case 'S':
            if (!*optarg) {
                ex = usage_error("--socket: empty path");
                goto out;
            }
            x.socket = optarg;
            break;
        case OPT_JSON: x.json = 1; break;
        case 't':
            if (!parse_u64(optarg, INT_MAX, &u64) || u64 == 0) {
                ex = usage_error("--timeout: '%s' is not a positive number of milliseconds", optarg);
                goto out;
            }
            x.timeout_ms = (int)u64;
            break;
        case 'h': help = true; break;
        case 'V': version = true; break;
        case OPT_MODEL:
            if (!*optarg) {
                ex = usage_error("--model: empty name");
                goto out;
            }
            x.layout.model = optarg;
            mark(&x, F_LAYOUT, "--model");
            break;
        case OPT_DTYPE:
            if (!*optarg) {
                ex = usage_error("--dtype: empty name");
                goto out;
            }
            x.layout.dtype = optarg;
            mark(&x, F_LAYOUT, "--dtype");
            break;
        case OPT_EXTRA:
            x.layout.extra = optarg;
            mark(&x, F_LAYOUT, "--extra");
            break;
        case OPT_BLOCK_BYTES:
            if (!parse_size(optarg, &u64) || u64 == 0) {
                ex = usage_error("--block-bytes: invalid size '%s' (expected e.g. 65536, 64K or 2MiB)",
                                 optarg);
                goto out;
            }
            x.layout.block_bytes = u64;
            mark(&x, F_LAYOUT, "--block-bytes");
            break;
        case OPT_BLOCK_TOKENS: u32 = &x.layout.block_tokens; goto number;
        case OPT_LAYERS:       u32 = &x.layout.num_layers;   goto number;
        case OPT_KV_HEADS:     u32 = &x.layout.kv_heads;     goto number;
        case OPT_HEAD_DIM:     u32 = &x.layout.head_dim;     goto number;
        case OPT_TP_SIZE:      u32 = &x.layout.tp_size;      goto number;
        case OPT_TP_RANK:      u32 = &x.layout.tp_rank;      goto number;
        number:
            if (!parse_u32(optarg, u32)) {
                ex = usage_error("invalid number '%s' (expected 0..%u)", optarg, UINT32_MAX);
                goto out;
            }
            mark(&x, F_LAYOUT, "layout options");
            break;
        case OPT_KEYS_FILE: x.keys_file = optarg; mark(&x, F_KEYS_FILE, "--keys-file"); break;
        case OPT_KEYS_OUT:  x.keys_out = optarg;  mark(&x, F_KEYS_OUT, "--keys-out");   break;
        case 'o':           x.output = optarg;    mark(&x, F_OUTPUT, "--output");       break;
        case OPT_SIZE:
            if (!parse_size(optarg, &x.size)) {
                ex = usage_error("--size: invalid size '%s'", optarg);
                goto out;
            }
            mark(&x, F_SIZE, "--size");
            break;
        case OPT_REQUIRE_ALL: x.require_all = 1; mark(&x, F_REQUIRE_ALL, "--require-all"); break;
        case OPT_INLINE:      x.use_inline = 1;  mark(&x, F_INLINE, "--inline");          break;
        case OPT_ADMIN:
            if (!*optarg) {
                ex = usage_error("--admin: empty address");
                goto out;
            }
            x.admin = optarg;
            mark(&x, F_ADMIN, "--admin");
            break;
        default:
            /* getopt_long printed what was wrong */
            fputs("Try '" PROG " --help' for more information.\n", stderr);
            ex = EXIT_USAGE;
            goto out;
        }
    }
    if (help) {
        print_help();
        goto out;
    }
    if (version) {
        printf(PROG " %s (libkvnode %s)\n", KVNODE_VERSION_STRING, kvnode_version());
        goto out;
    }
    if (optind >= nargc) {
        ex = usage_error("missing command");
        goto out;
    }
    const char *name = nargv[optind];
    const struct command *cmd = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0)
            cmd = &commands[i];
    if (!cmd) {
        ex = usage_error("unknown command '%s'", name);
        goto out;
    }
    unsigned extra = x.given & ~cmd->allowed;
    if (extra) {
        for (unsigned b = 0; b < 8; b++)
            if (extra & (1u << b)) {
                ex = usage_error("%s cannot be used with %s", x.given_name[b], cmd->name);
                goto out;
            }
    }
    if (cmd->allowed & F_LAYOUT) {
        if (!x.layout.model) {
            ex = usage_error("%s: --model is required", cmd->name);
            goto out;
        }
        if (!x.layout.block_bytes) {
            ex = usage_error("%s: --block-bytes is required", cmd->name);
            goto out;
        }
        if (!x.layout.block_tokens || !x.layout.tp_size) {
            ex = usage_error("--block-tokens and --tp-size must be at least 1");
            goto out;
        }
        if (x.layout.tp_rank >= x.layout.tp_size) {
            ex = usage_error("--tp-rank %" PRIu32 " is not below --tp-size %" PRIu32, x.layout.tp_rank,
                             x.layout.tp_size);
            goto out;
        }
    }
    char **args = nargv + optind + 1;
    int nargs = nargc - optind - 1;
    if (cmd->run)
        ex = cmd->run(&x, args, nargs);
    else if (nargs)
        ex = usage_error("%s takes no arguments", cmd->name);
    else
        ex = cmd->run_noargs(&x);
out:
    free(nargv);
    /* Data on standard output that could not be written is an error. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (ex == EXIT_OK || ex == EXIT_PARTIAL) {
            fprintf(stderr, PROG ": write error on standard output: %s\n", strerror(errno ? errno : EIO));
            ex = EXIT_ERR;
        }
    }
    return ex;
}
