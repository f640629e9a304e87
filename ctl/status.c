/* kvnodectl: the observer commands that render the daemon's stats document:
 * status (a summary), stats (every counter), namespaces (a table). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"

/* ------------------------------------------------------------------------ */
/* formatting                                                                */

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

int cmd_status(const struct ctl *x)
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
            if (json_object_get(tier, "reserved_bytes")) {
                json_object_set_new(o, "reserved_bytes", jcopy(tier, "reserved_bytes"));
                json_object_set_new(o, "populate_state", jcopy(tier, "populate_state"));
                if (json_object_get(tier, "populate_error"))
                    json_object_set_new(o, "populate_error", jcopy(tier, "populate_error"));
            }
            if (json_object_get(tier, "pinned_bytes")) {
                json_object_set_new(o, "pinned_bytes", jcopy(tier, "pinned_bytes"));
                json_object_set_new(o, "pin_state", jcopy(tier, "pin_state"));
            }
            json_object_set_new(jt, name, o);
        }
        json_object_set_new(out, "tiers", jt);
        json_object_set_new(out, "namespaces",
                            json_is_array(nss) ? json_integer((json_int_t)json_array_size(nss)) : json_null());
        if (json_is_array(json_object_get(doc, "tenants")))
            json_object_set_new(out, "tenants", jcopy(doc, "tenants"));
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

    struct kv_line lines[64 + 17];   /* a line per tenant (at most 17) besides the rest */
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
        const char *pop = jstr(tier, "populate_state");
        if (pop && jint(tier, "reserved_bytes", &v) && jint(tier, "capacity_bytes", &v2)) {
            const char *perr = jstr(tier, "populate_error");
            fmt_bytes((uint64_t)v, b1, sizeof b1);
            fmt_bytes((uint64_t)v2, b2, sizeof b2);
            lines[n].label = xasprintf("reserved");
            lines[n++].value = perr ? xasprintf("%s of %s (%s: %s)", b1, b2, pop, perr)
                                    : xasprintf("%s of %s (%s)", b1, b2, pop);
        }
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
    /* A node with [tenant.NAME] sections: each tenant's memory and load. */
    json_t *tenants = json_object_get(doc, "tenants"), *tn;
    size_t ti;
    json_array_foreach(tenants, ti, tn) {
        long long blocks = 0, nsc = 0, cl = 0, ev = 0, hu = 0, hc = 0;
        jint(tn, "host_used_bytes", &hu);
        jint(tn, "host_capacity_bytes", &hc);
        jint(tn, "blocks", &blocks);
        jint(tn, "namespaces", &nsc);
        jint(tn, "clients", &cl);
        jint(tn, "evictions_total", &ev);
        fmt_bytes((uint64_t)hu, b1, sizeof b1);
        fmt_bytes((uint64_t)hc, b2, sizeof b2);
        lines[n].label = xasprintf("tenant %s", jstr(tn, "name") ? jstr(tn, "name") : "-");
        lines[n++].value = xasprintf("host %s / %s used, %lld blocks, %lld namespaces, %lld clients, "
                                     "%lld evicted", b1, b2, blocks, nsc, cl, ev);
        if (ti >= 16)
            break;
    }
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

int cmd_stats(const struct ctl *x)
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

int cmd_namespaces(const struct ctl *x)
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
