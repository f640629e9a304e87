/* config_values: kvnode.conf values as text and back -- sizes, durations,
 * fractions, modes, counts, user and group lists, device lists, listen
 * addresses -- and the error collector; see config_values.h. Below the
 * option table: nothing here knows struct kvn_config. Pure functions (the
 * id lists ask the user/group database), any thread. */
#include "config/config_values.h"
#include "config/config_text.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <grp.h>
#include <pwd.h>
#include <sys/types.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

struct unit {
    const char *name;
    uint64_t factor;
};

/* Binary multiples only: "K", "KB" and "KiB" all mean 1024. */
static const struct unit size_units[] = {
    { "", 1 }, { "b", 1 },
    { "k", KIB }, { "kb", KIB }, { "kib", KIB },
    { "m", MIB }, { "mb", MIB }, { "mib", MIB },
    { "g", GIB }, { "gb", GIB }, { "gib", GIB },
    { "t", GIB << 10 }, { "tb", GIB << 10 }, { "tib", GIB << 10 },
    { "p", GIB << 20 }, { "pb", GIB << 20 }, { "pib", GIB << 20 },
    { "e", GIB << 30 }, { "eb", GIB << 30 }, { "eib", GIB << 30 },
    { NULL, 0 },
};

static const struct unit duration_units[] = {
    { "", 1 }, { "ms", 1 }, { "s", MS_PER_S }, { "m", MS_PER_M }, { "h", MS_PER_H },
    { NULL, 0 },
};

/* DIGITS [UNIT], nothing else: no sign, no fraction, no spaces. Returns 0,
 * -EINVAL for malformed text, -ERANGE when the product overflows uint64. */
static int config_parse_scaled(const char *text, const struct unit *units, uint64_t *out)
{
    if (!text)
        return -EINVAL;
    const char *p = text;
    uint64_t v = 0;
    if (!isdigit((unsigned char)*p))
        return -EINVAL;
    bool overflow = false;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            overflow = true;
        else
            v = v * 10 + d;
    }
    for (const struct unit *u = units; u->name; u++) {
        if (strcasecmp(p, u->name) != 0)
            continue;
        if (overflow || (u->factor > 1 && v > UINT64_MAX / u->factor))
            return -ERANGE;
        *out = v * u->factor;
        return 0;
    }
    return -EINVAL;
}

int config_parse_size(const char *text, uint64_t *out)
{
    uint64_t v;
    if (config_parse_scaled(text, size_units, &v) < 0)
        return -1;
    *out = v;
    return 0;
}

int config_parse_duration_ms(const char *text, uint32_t *out)
{
    uint64_t v;
    if (config_parse_scaled(text, duration_units, &v) < 0 || v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int config_scan_size(const char *text, uint64_t *out)
{
    return config_parse_scaled(text, size_units, out);
}

int config_scan_duration(const char *text, uint64_t *out)
{
    return config_parse_scaled(text, duration_units, out);
}

/* Largest unit that divides v exactly, so the text parses back to v. */
static void config_format_scaled(uint64_t v, const char *const *names, const uint64_t *factors, size_t n,
                                 char *buf, size_t len)
{
    for (size_t i = 0; i < n; i++) {
        if (v != 0 && v % factors[i] == 0) {
            snprintf(buf, len, "%" PRIu64 "%s", v / factors[i], names[i]);
            return;
        }
    }
    snprintf(buf, len, "%" PRIu64 "%s", v, names[n - 1]);
}

void config_format_size(uint64_t v, char *buf, size_t len)
{
    static const char *const names[] = { "EiB", "PiB", "TiB", "GiB", "MiB", "KiB", "" };
    static const uint64_t factors[] = { GIB << 30, GIB << 20, GIB << 10, GIB, MIB, KIB, 1 };
    config_format_scaled(v, names, factors, 7, buf, len);
}

void config_format_duration(uint64_t ms, char *buf, size_t len)
{
    static const char *const names[] = { "h", "m", "s", "ms" };
    static const uint64_t factors[] = { MS_PER_H, MS_PER_M, MS_PER_S, 1 };
    if (ms == 0) {
        snprintf(buf, len, "0s");
        return;
    }
    config_format_scaled(ms, names, factors, 4, buf, len);
}

/* Shortest %g text that reads back as exactly d. */
void config_format_fraction(double d, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

/* A decimal number as strtod reads it, minus what it also accepts but a
 * fraction never is: "inf", "nan", hex floats, surrounding spaces. */
int config_parse_fraction(const char *text, double *out)
{
    if (!*text || strspn(text, "0123456789.eE+-") != strlen(text))
        return -1;
    char *end;
    errno = 0;
    double d = strtod(text, &end);
    if (*end || errno == ERANGE || !isfinite(d))
        return -1;
    *out = d;
    return 0;
}

int config_parse_mode(const char *text, uint64_t *out)
{
    if (!*text || strspn(text, "01234567") != strlen(text) || strlen(text) > 6)
        return -1;
    *out = strtoull(text, NULL, 8);
    return 0;
}

int config_parse_count(const char *text, uint64_t *out)
{
    uint64_t v;
    if (config_parse_scaled(text, (const struct unit[]){ { "", 1 }, { NULL, 0 } }, &v) < 0)
        return -1;
    *out = v;
    return 0;
}

/* One id: a number, or a name the user/group database knows. */
static int config_resolve_id(const char *name, int group, uint32_t *id, char *problem, size_t len)
{
    char *end;
    unsigned long v;
    char buf[4096];
    int rc;

    errno = 0;
    v = strtoul(name, &end, 10);
    if (*name >= '0' && *name <= '9' && *end == '\0' && errno == 0 && v < UINT32_MAX) {
        *id = (uint32_t)v;
        return 0;
    }
    if (group) {
        struct group gr, *res = NULL;
        rc = getgrnam_r(name, &gr, buf, sizeof buf, &res);
        if (rc == 0 && res) {
            *id = (uint32_t)res->gr_gid;
            return 0;
        }
    } else {
        struct passwd pw, *res = NULL;
        rc = getpwnam_r(name, &pw, buf, sizeof buf, &res);
        if (rc == 0 && res) {
            *id = (uint32_t)res->pw_uid;
            return 0;
        }
    }
    snprintf(problem, len, "unknown %s '%.64s' (expected a %s name or a number)", group ? "group" : "user",
             name, group ? "group" : "user");
    return -1;
}

int config_parse_idlist(const char *text, int groups, uint32_t *ids, size_t max, size_t *n,
                        char *problem, size_t len)
{
    const char *p = text;

    *n = 0;
    while (*p) {
        char name[CONFIG_NAME_MAX];
        size_t k = 0;
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        while (*p && *p != ',' && *p != ' ' && *p != '\t') {
            if (k + 1 >= sizeof name) {
                snprintf(problem, len, "entry too long in '%.64s'", text);
                return -1;
            }
            name[k++] = *p++;
        }
        name[k] = '\0';
        if (*n == max) {
            snprintf(problem, len, "too many entries (at most %zu)", max);
            return -1;
        }
        if (config_resolve_id(name, groups, &ids[*n], problem, len) < 0)
            return -1;
        (*n)++;
    }
    return 0;
}

int config_parse_group(const char *text, uint32_t *gid, char *problem, size_t len)
{
    return config_resolve_id(text, 1, gid, problem, len);
}

bool config_list_next(const char **p, const char **start, size_t *len)
{
    *p += strspn(*p, ", \t");
    if (!**p)
        return false;
    *start = *p;
    *p += strcspn(*p, ", \t");
    *len = (size_t)(*p - *start);
    return true;
}

#define DEVICES_HINT "expected all, or device ordinals 0..%d separated by commas or blanks, e.g. 0,1"

int config_hbm_devices(const char *text, int *out, size_t max, size_t *n, char *problem, size_t len)
{
    bool seen[CONFIG_HBM_DEVICES_MAX] = { false };
    size_t count = 0;
    char scratch[8];

    if (!problem || len == 0) {
        problem = scratch;
        len = sizeof scratch;
    }
    if (n)
        *n = 0;
    if (!text) {
        snprintf(problem, len, "no device list");
        return -1;
    }
    const char *p = text + strspn(text, " \t");
    size_t rest = strlen(p);
    while (rest > 0 && (p[rest - 1] == ' ' || p[rest - 1] == '\t'))
        rest--;
    if (rest == 0 || (rest == 3 && strncasecmp(p, "all", 3) == 0))
        return 0;   /* every visible device */
    const char *start;
    size_t elen;
    while (config_list_next(&p, &start, &elen)) {
        int shown = (int)(elen < 32 ? elen : 32);
        const char *more = elen > 32 ? "..." : "";
        if (elen == 3 && strncasecmp(start, "all", 3) == 0) {
            snprintf(problem, len, "'all' cannot be combined with device ordinals (" DEVICES_HINT ")",
                     CONFIG_HBM_DEVICES_MAX - 1);
            return -1;
        }
        if (strspn(start, "0123456789") < elen) {
            snprintf(problem, len, "invalid device '%.*s%s' (" DEVICES_HINT ")", shown, start, more,
                     CONFIG_HBM_DEVICES_MAX - 1);
            return -1;
        }
        unsigned long v = 0;
        for (size_t i = 0; i < elen && v < CONFIG_HBM_DEVICES_MAX; i++)
            v = v * 10 + (unsigned long)(start[i] - '0');
        if (v >= CONFIG_HBM_DEVICES_MAX) {
            snprintf(problem, len, "device '%.*s%s' out of range (device ordinals are 0..%d)", shown, start, more,
                     CONFIG_HBM_DEVICES_MAX - 1);
            return -1;
        }
        if (seen[v]) {
            snprintf(problem, len, "device %lu listed twice", v);
            return -1;
        }
        if (count == max) {
            snprintf(problem, len, "too many devices (at most %zu)", max);
            return -1;
        }
        seen[v] = true;
        if (out)
            out[count] = (int)v;
        count++;
    }
    if (count == 0) {
        snprintf(problem, len, "no device in '%.*s' (" DEVICES_HINT ")", VALUE_SHOW, text,
                 CONFIG_HBM_DEVICES_MAX - 1);
        return -1;
    }
    if (n)
        *n = count;
    return 0;
}

#define LISTEN_HINT "expected off, unix:PATH or HOST:PORT, e.g. 127.0.0.1:9180"

int config_parse_listen(const char *text, struct config_listen *out, char *problem, size_t len)
{
    char showbuf[VALUE_SHOW + 8];
    const char *shown = config_show(text, showbuf, sizeof showbuf);

    memset(out, 0, sizeof *out);
    if (strcasecmp(text, "off") == 0) {
        out->kind = CONFIG_LISTEN_OFF;
        return 0;
    }
    if (strncmp(text, "unix:", 5) == 0) {
        size_t n = strlen(text + 5);
        if (n == 0) {
            snprintf(problem, len, "invalid address '" SHOWN "' (empty socket path after unix:)", shown);
            return -1;
        }
        if (n >= SUN_PATH_SIZE || n >= sizeof out->path) {
            snprintf(problem, len, "invalid address '" SHOWN "' (socket path of %zu bytes; it must be "
                     "shorter than %zu bytes)", shown, n, SUN_PATH_SIZE);
            return -1;
        }
        out->kind = CONFIG_LISTEN_UNIX;
        memcpy(out->path, text + 5, n + 1);
        return 0;
    }
    const char *colon = strrchr(text, ':');
    const char *host = text, *host_end = colon;
    if (!colon || colon == text) {
        snprintf(problem, len, "invalid address '" SHOWN "' (" LISTEN_HINT ")", shown);
        return -1;
    }
    if (*host == '[') {
        if (host_end[-1] != ']' || host_end - host < 3) {
            snprintf(problem, len, "invalid address '" SHOWN "' (an IPv6 host goes in brackets: [::1]:9180)",
                     shown);
            return -1;
        }
        host++;
        host_end--;
    }
    size_t hlen = (size_t)(host_end - host);
    char hostbuf[sizeof out->host];
    if (hlen >= sizeof hostbuf) {
        snprintf(problem, len, "invalid address '" SHOWN "' (host too long)", shown);
        return -1;
    }
    memcpy(hostbuf, host, hlen);
    hostbuf[hlen] = '\0';
    struct in_addr a4;
    struct in6_addr a6;
    bool ok = strcmp(hostbuf, "localhost") == 0 ||
              (host == text && inet_pton(AF_INET, hostbuf, &a4) == 1) ||
              (host != text && inet_pton(AF_INET6, hostbuf, &a6) == 1);
    if (!ok) {
        snprintf(problem, len, "invalid address '" SHOWN "' (the host must be an IPv4 address, "
                 "localhost or [IPv6]; " LISTEN_HINT ")", shown);
        return -1;
    }
    uint64_t port;
    if (config_parse_count(colon + 1, &port) < 0 || port > 65535) {
        snprintf(problem, len, "invalid address '" SHOWN "' (the port must be 0..65535; 0 picks a free one)",
                 shown);
        return -1;
    }
    out->kind = CONFIG_LISTEN_TCP;
    memcpy(out->host, hostbuf, hlen + 1);
    out->port = (uint16_t)port;
    return 0;
}

/* ---- messages ----------------------------------------------------------- */

/* The value as the user typed it, cut to a sane length for a message. */
const char *config_show(const char *text, char *buf, size_t len)
{
    size_t n = strlen(text);
    if (n <= VALUE_SHOW)
        return text;
    snprintf(buf, len, "%.*s...", VALUE_SHOW, text);
    return buf;
}

bool config_url_has_credentials(const char *s, size_t n)
{
    const char *end = s + n;
    const char *sep = memmem(s, n, "://", 3);
    const char *auth = sep ? sep + 3 : s;
    for (const char *p = auth; p < end && *p != '/' && *p != '?' && *p != '#'; p++)
        if (*p == '@')
            return true;
    return false;
}

/* ---- error collection ---------------------------------------------------- */

#define ERRBUF_RESERVE 40
#define ERRLINE_MAX 640   /* one error line: location + option + problem */

void config_errbuf_init(struct errbuf *eb, char *buf, size_t cap)
{
    *eb = (struct errbuf){ .buf = buf, .cap = buf ? cap : 0 };
    if (eb->cap)
        buf[0] = '\0';
}

void config_errbuf_add(struct errbuf *eb, const char *fmt, ...)
{
    char line[ERRLINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);

    eb->count++;
    if (eb->cap == 0)
        return;
    size_t need = (eb->len ? 1 : 0) + strlen(line);
    if (eb->dropped == 0 && eb->len + need + ERRBUF_RESERVE < eb->cap) {
        if (eb->len)
            eb->buf[eb->len++] = '\n';
        memcpy(eb->buf + eb->len, line, strlen(line) + 1);
        eb->len += strlen(line);
    } else if (eb->len == 0) {
        /* A tiny buffer still gets (the start of) the first error. */
        snprintf(eb->buf, eb->cap, "%s", line);
        eb->len = strlen(eb->buf);
    } else {
        eb->dropped++;
    }
}

void config_errbuf_finish(struct errbuf *eb)
{
    if (eb->dropped && eb->cap > eb->len)
        snprintf(eb->buf + eb->len, eb->cap - eb->len, "\n(%u more errors not shown)", eb->dropped);
}

/* ---- id lists --------------------------------------------------------------------- */

bool config_idlist_has(const struct config_idlist *l, uint32_t id)
{
    for (size_t i = 0; i < l->n && i < CONFIG_IDS_MAX; i++)
        if (l->id[i] == id)
            return true;
    return false;
}

static int config_gid_cmp(const void *a, const void *b)
{
    gid_t x = *(const gid_t *)a, y = *(const gid_t *)b;
    return x < y ? -1 : x > y;
}

bool config_idlist_has_group(const struct config_idlist *l, gid_t gid, const gid_t *groups, size_t ngroups)
{
    for (size_t i = 0; i < l->n && i < CONFIG_IDS_MAX; i++) {
        gid_t g = (gid_t)l->id[i];
        if (g == gid || (ngroups && bsearch(&g, groups, ngroups, sizeof *groups, config_gid_cmp)))
            return true;
    }
    return false;
}

bool config_peer_admitted(const struct config_idlist *uids, const struct config_idlist *gids, uid_t uid, gid_t gid,
                          const gid_t *groups, size_t ngroups)
{
    if (uids->n == 0 && gids->n == 0)
        return true;
    return uid == 0 || uid == geteuid() || config_idlist_has(uids, (uint32_t)uid) ||
           config_idlist_has_group(gids, gid, groups, ngroups);
}
