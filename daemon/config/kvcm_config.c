/* kvcm_config: see kvcm_config.h. The [kvcm] option checks moved here from
 * config.c so that what KVCM accepts is decided next to the code that talks
 * to it; config.c's table still owns parsing, storing and printing. Built on
 * config_values (lists, URLs, durations, the error collector) only. */
#include "config/kvcm_config.h"

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "config/config_text.h"
#include "config/config_values.h"

const char *const kvcm_config_storage_names[2] = { "ST_EVENT_REPORT_L1P5", "ST_EVENT_REPORT_L2" };
_Static_assert(CONFIG_KVCM_STORAGE_L1P5 == 0 && CONFIG_KVCM_STORAGE_L2 == 1,
               "kvcm_config_storage_names follows CONFIG_KVCM_STORAGE_*");

/* Template placeholders, in KVCM_VAR_* bit order. */
static const struct {
    const char *name;
    unsigned bit;
} kvcm_placeholders[] = {
    { "model", KVCM_VAR_MODEL }, { "dtype", KVCM_VAR_DTYPE }, { "block_tokens", KVCM_VAR_BLOCK_TOKENS },
    { "tp_size", KVCM_VAR_TP_SIZE }, { "fingerprint", KVCM_VAR_FINGERPRINT }, { "host_ip_port", KVCM_VAR_HOST_IP_PORT },
    { "medium", KVCM_VAR_MEDIUM }, { "block_bytes", KVCM_VAR_BLOCK_BYTES }, { "key", KVCM_VAR_KEY },
};
#define KV_NPLACEHOLDERS (sizeof kvcm_placeholders / sizeof kvcm_placeholders[0])

#define HOSTPORT_HINT "expected HOST:PORT with a port 1..65535, e.g. 10.0.0.5:8088, node7.example:8088 " \
                      "or [fd00::5]:8088"
#define ENDPOINT_HINT "expected http://HOST:PORT or https://HOST:PORT, e.g. http://10.0.0.7:6382"

const char *config_kvcm_storage_type_name(int storage_type)
{
    if (storage_type < 0 || storage_type >= (int)(sizeof kvcm_config_storage_names /
                                                  sizeof kvcm_config_storage_names[0]))
        return "";
    return kvcm_config_storage_names[storage_type];
}

/* Index of the placeholder spelled s[0..n), or -1. */
static int kvcm_placeholder(const char *s, size_t n)
{
    for (size_t i = 0; i < KV_NPLACEHOLDERS; i++)
        if (strlen(kvcm_placeholders[i].name) == n && memcmp(kvcm_placeholders[i].name, s, n) == 0)
            return (int)i;
    return -1;
}

/* "{a}, {b} and {c}": the placeholders in mask. */
static void kvcm_placeholder_list(unsigned mask, char *buf, size_t len)
{
    size_t total = 0, k = 0, used = 0;
    for (size_t i = 0; i < KV_NPLACEHOLDERS; i++)
        if (mask & kvcm_placeholders[i].bit)
            total++;
    buf[0] = '\0';
    for (size_t i = 0; i < KV_NPLACEHOLDERS && used < len; i++) {
        if (!(mask & kvcm_placeholders[i].bit))
            continue;
        k++;
        int n = snprintf(buf + used, len - used, "%s{%s}", k == 1 ? "" : k == total ? " and " : ", ",
                         kvcm_placeholders[i].name);
        if (n > 0)
            used += (size_t)n;
    }
}

int kvcm_config_check_template(const char *key, unsigned vars, const char *t, char *problem, size_t len)
{
    char allowed[192];
    kvcm_placeholder_list(vars, allowed, sizeof allowed);
    for (const char *p = t; *p; p++) {
        if (*p == '}') {
            snprintf(problem, len, "invalid template '%.*s%s': '}' without '{' (%s may use %s)", VALUE_SHOW, t,
                     strlen(t) > VALUE_SHOW ? "..." : "", key, allowed);
            return -1;
        }
        if (*p != '{')
            continue;
        const char *end = p + 1 + strcspn(p + 1, "{}");
        if (*end != '}') {
            snprintf(problem, len, "invalid template '%.*s%s': '{' without '}' (%s may use %s)", VALUE_SHOW, t,
                     strlen(t) > VALUE_SHOW ? "..." : "", key, allowed);
            return -1;
        }
        size_t n = (size_t)(end - p - 1);
        int i = kvcm_placeholder(p + 1, n);
        if (i < 0 || !(vars & kvcm_placeholders[i].bit)) {
            snprintf(problem, len, "%s placeholder '{%.*s}' (%s may use %s)", i < 0 ? "unknown" : "unavailable",
                     (int)(n < 64 ? n : 64), p + 1, key, allowed);
            return -1;
        }
        p = end;
    }
    return 0;
}

unsigned kvcm_config_template_vars(const char *t)
{
    unsigned vars = 0;
    for (const char *p = strchr(t, '{'); p; p = strchr(p + 1, '{')) {
        size_t n = strcspn(p + 1, "{}");
        int i = p[1 + n] == '}' ? kvcm_placeholder(p + 1, n) : -1;
        if (i >= 0)
            vars |= kvcm_placeholders[i].bit;
    }
    return vars;
}

/* Loopback, unspecified and "localhost" names: they name every machine. */
static const char *kvcm_not_unique(const char *host, int family, const void *addr)
{
    if (family == AF_INET) {
        uint32_t a = ntohl(((const struct in_addr *)addr)->s_addr);
        if (a == 0)
            return "the unspecified address";
        if ((a >> 24) == 127)
            return "a loopback address";
        return NULL;
    }
    if (family == AF_INET6) {
        const struct in6_addr *a6 = addr;
        if (IN6_IS_ADDR_UNSPECIFIED(a6))
            return "the unspecified address";
        if (IN6_IS_ADDR_LOOPBACK(a6))
            return "a loopback address";
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            struct in_addr a4;
            memcpy(&a4.s_addr, &a6->s6_addr[12], 4);
            return kvcm_not_unique(host, AF_INET, &a4);
        }
        return NULL;
    }
    static const char *const names[] = { "localhost", "localhost.localdomain", "localhost4",
                                         "localhost4.localdomain4", "localhost6", "localhost6.localdomain6",
                                         "ip6-localhost", "ip6-loopback" };
    size_t n = strlen(host);
    if (n > 0 && host[n - 1] == '.')
        n--;   /* "localhost." is the same name */
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && strncasecmp(host, names[i], n) == 0)
            return "a name for loopback";
    if (n > 10 && strncasecmp(host + n - 10, ".localhost", 10) == 0)
        return "a name for loopback";
    return NULL;
}

/* Host part of an endpoint or host_ip_port, host[0..n): a DNS name, an IPv4
 * literal, or (bracketed) an IPv6 literal. Returns the address family
 * (AF_UNSPEC for a name) with the address in addr, or -1. */
static int kvcm_parse_host(const char *host, size_t n, bool bracketed, char *buf, size_t buflen, void *addr)
{
    if (n == 0 || n >= buflen)
        return -1;
    memcpy(buf, host, n);
    buf[n] = '\0';
    if (bracketed)
        return inet_pton(AF_INET6, buf, addr) == 1 ? AF_INET6 : -1;
    if (strspn(buf, "0123456789.") == n)
        return inet_pton(AF_INET, buf, addr) == 1 ? AF_INET : -1;
    if (strspn(buf, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != n || buf[0] == '.' ||
        buf[0] == '-' || strstr(buf, ".."))
        return -1;
    return AF_UNSPEC;
}

/* DIGITS in 1..65535, s[0..n). */
static bool kvcm_port_ok(const char *s, size_t n)
{
    if (n == 0 || n > 5 || strspn(s, "0123456789") < n)
        return false;
    unsigned long v = 0;
    for (size_t i = 0; i < n; i++)
        v = v * 10 + (unsigned long)(s[i] - '0');
    return v >= 1 && v <= 65535;
}

int kvcm_config_check_host_ip_port(const char *s, const char *shown, char *problem, size_t len)
{
    char host[CONFIG_KVCM_NAME_MAX];
    unsigned char addr[sizeof(struct in6_addr)];

    if (strchr(s, '#')) {
        snprintf(problem, len, "invalid value '" SHOWN "' (KVCM does not accept '#' in host_ip_port)", shown);
        return -1;
    }
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || !kvcm_port_ok(colon + 1, strlen(colon + 1))) {
        snprintf(problem, len, "invalid value '" SHOWN "' (" HOSTPORT_HINT ")", shown);
        return -1;
    }
    const char *h = s, *h_end = colon;
    bool bracketed = *h == '[';
    if (bracketed) {
        if (h_end[-1] != ']' || h_end - h < 3) {
            snprintf(problem, len, "invalid value '" SHOWN "' (an IPv6 host goes in brackets: [fd00::5]:8088)",
                     shown);
            return -1;
        }
        h++;
        h_end--;
    } else if (memchr(h, ':', (size_t)(h_end - h))) {
        snprintf(problem, len, "invalid value '" SHOWN "' (an IPv6 host goes in brackets: [fd00::5]:8088)", shown);
        return -1;
    }
    int family = kvcm_parse_host(h, (size_t)(h_end - h), bracketed, host, sizeof host, addr);
    if (family < 0) {
        snprintf(problem, len, "invalid value '" SHOWN "' (the host must be a DNS name, an IPv4 address or "
                 "[IPv6]; " HOSTPORT_HINT ")", shown);
        return -1;
    }
    const char *why = kvcm_not_unique(host, family, addr);
    if (why) {
        snprintf(problem, len, "'" SHOWN "' is not unique-looking (%s): KVCM tells reporters apart by "
                 "host_ip_port, and daemons reporting the same one overwrite each other's blocks and snapshots; "
                 "use this host's routable address or name and a port unique to this daemon", shown, why);
        return -1;
    }
    return 0;
}

/* One endpoint, s[0..n): http(s)://AUTHORITY[/PATH] with no query or
 * fragment. Returns the length without trailing '/' after the authority, or
 * 0 when invalid. */
static size_t kvcm_endpoint_shape(const char *s, size_t n)
{
    char host[256];
    unsigned char addr[sizeof(struct in6_addr)];
    size_t a = n >= 7 && strncasecmp(s, "http://", 7) == 0 ? 7 : n >= 8 && strncasecmp(s, "https://", 8) == 0 ? 8 : 0;
    if (a == 0 || memchr(s, '?', n) || memchr(s, '#', n))
        return 0;
    size_t e = a;
    while (e < n && s[e] != '/')
        e++;
    const char *auth = s + a, *auth_end = s + e;
    const char *host_end = auth_end, *port = NULL;
    bool bracketed = *auth == '[';
    if (bracketed) {
        const char *close = memchr(auth, ']', (size_t)(auth_end - auth));
        if (!close)
            return 0;
        host_end = close;
        if (close + 1 < auth_end) {
            if (close[1] != ':')
                return 0;
            port = close + 2;
        }
        auth++;
    } else {
        const char *colon = memchr(auth, ':', (size_t)(auth_end - auth));
        if (colon) {
            host_end = colon;
            port = colon + 1;
        }
    }
    if (kvcm_parse_host(auth, (size_t)(host_end - auth), bracketed, host, sizeof host, addr) < 0)
        return 0;
    if (port && !kvcm_port_ok(port, (size_t)(auth_end - port)))
        return 0;
    while (n > e && s[n - 1] == '/')
        n--;
    return n;
}

int kvcm_config_split_endpoints(const char *text, struct config_urllist *list, size_t max, char *problem,
                                size_t len)
{
    struct {
        const char *s;
        size_t n;
    } seen[CONFIG_KVCM_ENDPOINTS_MAX];
    size_t count = 0;
    const char *p = text;
    char scratch[8];

    if (!problem) {
        problem = scratch;
        len = sizeof scratch;
    }
    memset(list, 0, sizeof *list);
    const char *start;
    size_t elen;
    while (config_list_next(&p, &start, &elen)) {
        if (count == CONFIG_KVCM_ENDPOINTS_MAX || count == max) {
            snprintf(problem, len, "too many endpoints (at most %zu)",
                     max < CONFIG_KVCM_ENDPOINTS_MAX ? max : (size_t)CONFIG_KVCM_ENDPOINTS_MAX);
            return -1;
        }
        size_t ulen = elen;
        while (ulen > 0 && start[ulen - 1] == '/')
            ulen--;
        if (ulen >= CONFIG_URL_MAX) {
            snprintf(problem, len, "endpoint too long (%zu bytes; at most %d)", ulen, CONFIG_URL_MAX - 1);
            return -1;
        }
        if (config_url_has_credentials(start, elen)) {
            snprintf(problem, len, "credentials in endpoint %zu are not accepted (%s; KVCM's HTTP API takes "
                     "none: restrict access to it by network)", count + 1, CREDENTIALS_HINT);
            return -1;
        }
        ulen = kvcm_endpoint_shape(start, elen);
        if (ulen == 0) {
            snprintf(problem, len, "invalid endpoint '%.*s%s' (" ENDPOINT_HINT ")", (int)(elen < VALUE_SHOW ? elen : VALUE_SHOW),
                     start, elen > VALUE_SHOW ? "..." : "");
            return -1;
        }
        for (size_t i = 0; i < count; i++) {
            if (seen[i].n == ulen && strncasecmp(seen[i].s, start, ulen) == 0) {
                snprintf(problem, len, "endpoint '%.*s%s' listed twice", (int)(ulen < VALUE_SHOW ? ulen : VALUE_SHOW),
                         start, ulen > VALUE_SHOW ? "..." : "");
                return -1;
            }
        }
        seen[count].s = start;
        seen[count].n = ulen;
        memcpy(list->url[count], start, ulen);
        count++;
        list->n = count;
    }
    return 0;
}

int config_kvcm_endpoints(const struct kvcm_config *kc, char out[][CONFIG_URL_MAX], size_t max, size_t *n)
{
    struct config_urllist list;
    *n = 0;
    size_t tlen = strnlen(kc->endpoints, sizeof kc->endpoints);
    if (tlen == sizeof kc->endpoints)
        return -1;   /* no terminator: a struct built by code */
    if (kvcm_config_split_endpoints(kc->endpoints, &list, max, NULL, 0) < 0)
        return -1;
    for (size_t i = 0; i < list.n; i++)
        memcpy(out[i], list.url[i], sizeof list.url[i]);
    *n = list.n;
    return 0;
}

/* Appends s[0..n) to out; -1 when it does not fit with its NUL. */
static int kvcm_append(char *out, size_t len, size_t *used, const char *s, size_t n)
{
    if (n >= len - *used)
        return -1;
    memcpy(out + *used, s, n);
    *used += n;
    out[*used] = '\0';
    return 0;
}

int config_kvcm_expand(const char *tmpl, const struct config_kvcm_vars *vars, char *out, size_t len)
{
    size_t used = 0;
    char num[32];

    if (!out || len == 0)
        return -1;
    out[0] = '\0';
    if (!tmpl || !vars || len > INT_MAX)
        goto fail;
    for (const char *p = tmpl; *p;) {
        const char *brace = p + strcspn(p, "{}");
        if (kvcm_append(out, len, &used, p, (size_t)(brace - p)) < 0)
            goto fail;
        if (!*brace)
            break;
        if (*brace == '}')
            goto fail;
        const char *end = brace + 1 + strcspn(brace + 1, "{}");
        if (*end != '}')
            goto fail;
        int i = kvcm_placeholder(brace + 1, (size_t)(end - brace - 1));
        if (i < 0)
            goto fail;
        const char *val = num;
        switch (kvcm_placeholders[i].bit) {
        case KVCM_VAR_MODEL:        val = vars->model; break;
        case KVCM_VAR_DTYPE:        val = vars->dtype; break;
        case KVCM_VAR_BLOCK_TOKENS: snprintf(num, sizeof num, "%" PRIu32, vars->block_tokens); break;
        case KVCM_VAR_TP_SIZE:      snprintf(num, sizeof num, "%" PRIu32, vars->tp_size); break;
        case KVCM_VAR_FINGERPRINT:  snprintf(num, sizeof num, "%" PRIx64, vars->fingerprint); break;
        case KVCM_VAR_HOST_IP_PORT: val = vars->host_ip_port; break;
        case KVCM_VAR_MEDIUM:       val = vars->medium; break;
        case KVCM_VAR_BLOCK_BYTES:  snprintf(num, sizeof num, "%" PRIu64, vars->block_bytes); break;
        case KVCM_VAR_KEY:          snprintf(num, sizeof num, "%" PRId64, vars->key); break;
        default:              goto fail;
        }
        if (!val || kvcm_append(out, len, &used, val, strlen(val)) < 0)
            goto fail;
        p = end + 1;
    }
    return (int)used;
fail:
    out[0] = '\0';
    return -1;
}

void kvcm_config_validate(const struct kvcm_config *kc, struct errbuf *errors)
{
    /* Every missing field gets its own line, so one failed start names all
     * of them. Off: nothing is required. */
    if (kc->enabled != 1)
        return;
    static const struct {
        size_t offset;
        const char *key, *what;
    } required[] = {
        { offsetof(struct kvcm_config, endpoints), "endpoints",
          "the KVCM servers' base URLs, e.g. http://kvcm-0:6382, http://kvcm-1:6382" },
        { offsetof(struct kvcm_config, host_ip_port), "host_ip_port",
          "HOST:PORT naming this daemon to KVCM, unique per daemon: daemons sharing one overwrite "
          "each other's blocks" },
        { offsetof(struct kvcm_config, instance_group), "instance_group", "e.g. default" },
        { offsetof(struct kvcm_config, instance_id), "instance_id", "a template, e.g. {model}_{block_tokens}" },
        { offsetof(struct kvcm_config, medium_hbm), "medium_hbm", "the GPU tier's medium name, e.g. hbm" },
        { offsetof(struct kvcm_config, medium_host), "medium_host",
          "the host-memory tier's medium name, e.g. dram" },
        { offsetof(struct kvcm_config, spec_name), "spec_name", "a template, e.g. rtp_llm_hbm_{block_tokens}" },
        { offsetof(struct kvcm_config, location_uri), "location_uri",
          "a template, e.g. rtp-llm://{host_ip_port}/hbm?size={block_bytes}" },
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (((const char *)kc)[required[i].offset] == '\0')
            config_errbuf_add(errors, "[kvcm] %s: required when enabled = on (%s)", required[i].key,
                              required[i].what);
    if (kc->medium_hbm[0] &&
        strncmp(kc->medium_hbm, kc->medium_host, sizeof kc->medium_hbm) == 0)
        config_errbuf_add(errors, "[kvcm] medium_host: '%.*s' is also medium_hbm; the two tiers need different "
                                  "medium names", CONFIG_KVCM_MEDIUM_MAX - 1, kc->medium_host);
    if (kc->retry_base_ms > kc->retry_max_ms) {
        char base[32], max[32];
        config_format_duration(kc->retry_base_ms, base, sizeof base);
        config_format_duration(kc->retry_max_ms, max, sizeof max);
        config_errbuf_add(errors, "[kvcm] retry_base: %s exceeds retry_max (%s)", base, max);
    }
    if (kc->batch_events > kc->queue_events)
        config_errbuf_add(errors, "[kvcm] batch_events: %" PRIu32 " exceeds queue_events (%" PRIu32 ")",
                          kc->batch_events, kc->queue_events);
}
