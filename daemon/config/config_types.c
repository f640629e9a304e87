/* config_types: one table of functions per option type (struct opt_type in
 * config_internal.h): parse text into a value, check its range and shape,
 * store it into and load it from struct kvn_config, format it back into
 * text that parses to the same value, compare two values. config.c's
 * option table names a type per row; nothing else switches on the type. */
#include "config/config.h"
#include "config/config_internal.h"
#include "config/kvcm_config.h"
#include "core/log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* -- string types: the text is the value; the field a char array -- */

static void str_store(struct kvn_config *cfg, const struct opt_def *o, const struct opt_value *v)
{
    char *field = (char *)cfg + o->offset;
    /* Checked shorter than the field, so it fits; zero the tail so equal
     * configs stay byte-equal. */
    memset(field, 0, o->width);
    memcpy(field, v->s, strlen(v->s));
}

/* buf (len bytes) receives a NUL-terminated copy of the field. A field
 * without a terminator (a struct built by code) comes out as long as the
 * field, which the checks then reject as too long. */
static void str_load(const struct kvn_config *cfg, const struct opt_def *o, struct opt_value *v, char *buf,
                     size_t len)
{
    const char *field = (const char *)cfg + o->offset;
    size_t n = strnlen(field, o->width);
    if (n >= len)
        n = len - 1;
    memcpy(buf, field, n);
    buf[n] = '\0';
    v->s = buf;
}

static void str_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    (void)o;
    snprintf(buf, len, "%s", v->s);
}

static bool str_equal(const struct opt_value *a, const struct opt_value *b)
{
    return strcmp(a->s, b->s) == 0;
}

#define STRING_TYPE(check_fn) { .check = check_fn, .store = str_store, .load = str_load, .format = str_format, \
                                .equal = str_equal }

static int path_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    (void)shown;
    size_t n = strlen(v->s);
    if (n == 0 && o->empty_ok)
        return 0;
    if (n == 0) {
        snprintf(problem, len, "empty path (expected the path of the unix socket)");
        return -1;
    }
    if (n >= SUN_PATH_SIZE) {
        snprintf(problem, len,
                 "path too long (%zu bytes; a unix socket path must be shorter than %zu bytes, "
                 "the size of sun_path including the terminating NUL)", n, SUN_PATH_SIZE);
        return -1;
    }
    return 0;
}
const struct opt_type T_PATH = STRING_TYPE(path_check);

static int dir_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    (void)shown;
    size_t n = strlen(v->s);
    if (n >= o->width) {
        snprintf(problem, len, "path too long (%zu bytes; at most %zu)", n, o->width - 1);
        return -1;
    }
    return 0;
}
const struct opt_type T_DIR = STRING_TYPE(dir_check);

static int url_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    (void)shown;
    size_t n = strlen(v->s);
    if (n >= o->width) {
        snprintf(problem, len, "URL too long (%zu bytes; at most %zu)", n, o->width - 1);
        return -1;
    }
    if (config_url_has_credentials(v->s, n)) {
        snprintf(problem, len, "credentials in the URL are not accepted (%s; the rtp-llm KVS protocol "
                 "carries no credentials: restrict access to the store's control plane by network)",
                 CREDENTIALS_HINT);
        return -1;
    }
    return 0;
}
const struct opt_type T_URL = STRING_TYPE(url_check);

/* Shorter than the field; "" is left to config_validate (it decides when a
 * value is required). 1: go on checking, 0: accepted as it is, -1: refused. */
static int text_length_check(const struct opt_def *o, const char *s, char *problem, size_t len)
{
    size_t n = strlen(s);
    if (n >= o->width) {
        snprintf(problem, len, "value too long (%zu bytes; at most %zu)", n, o->width - 1);
        return -1;
    }
    return n > 0;
}

/* A name or template: no blanks or control characters (they could not be
 * written back into the file unchanged, and no KVCM name has them); '#'
 * refused where KVCM does not accept it. */
static int text_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    int rc = text_length_check(o, v->s, problem, len);
    if (rc <= 0)
        return rc;
    for (const unsigned char *p = (const unsigned char *)v->s; *p; p++) {
        if (isspace(*p) || iscntrl(*p)) {
            snprintf(problem, len, "invalid value '" SHOWN "' (blanks and control characters are not allowed)",
                     shown);
            return -1;
        }
        if (*p == '#' && o->no_hash) {
            snprintf(problem, len, "invalid value '" SHOWN "' (KVCM does not accept '#' in a medium name)", shown);
            return -1;
        }
    }
    return 0;
}
const struct opt_type T_TEXT = STRING_TYPE(text_check);

static int template_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem,
                          size_t len)
{
    int rc = text_length_check(o, v->s, problem, len);
    if (rc <= 0)
        return rc;
    if (text_check(o, v, shown, problem, len) < 0)
        return -1;
    return kvcm_config_check_template(o->key, o->vars, v->s, problem, len);
}
const struct opt_type T_TEMPLATE = STRING_TYPE(template_check);

static int hostport_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem,
                          size_t len)
{
    int rc = text_length_check(o, v->s, problem, len);
    if (rc <= 0)
        return rc;
    return kvcm_config_check_host_ip_port(v->s, shown, problem, len);
}
const struct opt_type T_HOSTPORT = STRING_TYPE(hostport_check);

static int urllist_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem,
                         size_t len)
{
    (void)shown;
    memset(&v->parsed, 0, sizeof v->parsed);
    int rc = text_length_check(o, v->s, problem, len);
    if (rc <= 0)
        return rc;
    return kvcm_config_split_endpoints(v->s, &v->parsed.urls, CONFIG_KVCM_ENDPOINTS_MAX, problem, len);
}
const struct opt_type T_URLLIST = STRING_TYPE(urllist_check);

static int devices_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem,
                         size_t len)
{
    (void)shown;
    memset(&v->parsed, 0, sizeof v->parsed);
    if (strlen(v->s) >= o->width) {
        snprintf(problem, len, "list too long (at most %zu bytes)", o->width - 1);
        return -1;
    }
    struct config_devices *d = &v->parsed.devices;
    return config_hbm_devices(v->s, d->dev, CONFIG_HBM_DEVICES_MAX, &d->n, problem, len);
}
const struct opt_type T_DEVICES = STRING_TYPE(devices_check);

static int idlist_check(const struct opt_def *o, struct opt_value *v, int groups, char *problem, size_t len)
{
    memset(&v->parsed, 0, sizeof v->parsed);
    if (strlen(v->s) >= o->width) {
        snprintf(problem, len, "list too long (at most %zu bytes)", o->width - 1);
        return -1;
    }
    struct config_idlist *l = &v->parsed.ids;
    return config_parse_idlist(v->s, groups, l->id, CONFIG_IDS_MAX, &l->n, problem, len);
}

static int users_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    (void)shown;
    return idlist_check(o, v, 0, problem, len);
}
const struct opt_type T_USERS = STRING_TYPE(users_check);

static int groups_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    (void)shown;
    return idlist_check(o, v, 1, problem, len);
}
const struct opt_type T_GROUPS = STRING_TYPE(groups_check);

static int group_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    (void)shown;
    memset(&v->parsed, 0, sizeof v->parsed);
    if (strlen(v->s) >= o->width) {
        snprintf(problem, len, "group name too long (at most %zu bytes)", o->width - 1);
        return -1;
    }
    return v->s[0] ? config_parse_group(v->s, &v->parsed.gid, problem, len) : 0;
}
const struct opt_type T_GROUP = STRING_TYPE(group_check);

static int listen_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    memset(&v->parsed, 0, sizeof v->parsed);
    if (strlen(v->s) >= o->width) {
        snprintf(problem, len, "invalid address '" SHOWN "' (too long)", shown);
        return -1;
    }
    return config_parse_listen(v->s, &v->parsed.listen, problem, len);
}
const struct opt_type T_LISTEN = STRING_TYPE(listen_check);

/* -- unsigned integer types: a uint32_t or uint64_t field -- */

static void uint_store(struct kvn_config *cfg, const struct opt_def *o, const struct opt_value *v)
{
    char *field = (char *)cfg + o->offset;
    if (o->width == sizeof(uint64_t)) {
        uint64_t u = v->u;
        memcpy(field, &u, sizeof u);
    } else {
        uint32_t u = (uint32_t)v->u;   /* ranges keep 32-bit fields below 2^32 */
        memcpy(field, &u, sizeof u);
    }
}

static void uint_load(const struct kvn_config *cfg, const struct opt_def *o, struct opt_value *v, char *buf,
                      size_t len)
{
    (void)buf, (void)len;
    const char *field = (const char *)cfg + o->offset;
    if (o->width == sizeof(uint64_t)) {
        memcpy(&v->u, field, sizeof v->u);
    } else {
        uint32_t u;
        memcpy(&u, field, sizeof u);
        v->u = u;
    }
}

static bool uint_equal(const struct opt_value *a, const struct opt_value *b)
{
    return a->u == b->u;
}

#define UINT_TYPE(parse_fn, check_fn, format_fn) { .parse = parse_fn, .check = check_fn, .store = uint_store, \
                                                   .load = uint_load, .format = format_fn, .equal = uint_equal }

static int mode_parse(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                      char *problem, size_t len)
{
    (void)o, (void)shown, (void)problem, (void)len;
    if (config_parse_mode(text, &v->u) < 0)
        v->u = UINT64_MAX;   /* reported by the range check */
    return 0;
}

static int mode_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    if (v->u > o->max) {
        snprintf(problem, len, "invalid mode '" SHOWN "' (expected octal permission bits up to 0777, e.g. 0660)",
                 shown);
        return -1;
    }
    return 0;
}

static void mode_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    (void)o;
    snprintf(buf, len, "%04" PRIo64, v->u);
}
const struct opt_type T_MODE = UINT_TYPE(mode_parse, mode_check, mode_format);

static int count_parse(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                       char *problem, size_t len)
{
    if (config_parse_count(text, &v->u) < 0) {
        snprintf(problem, len, "invalid value '" SHOWN "' (expected an integer in %" PRIu64 "..%" PRIu64 ")",
                 shown, o->min, o->max);
        return -1;
    }
    return 0;
}

static int count_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    if (v->u < o->min || v->u > o->max) {
        snprintf(problem, len, "invalid value '" SHOWN "' (expected an integer in %" PRIu64 "..%" PRIu64 ")",
                 shown, o->min, o->max);
        return -1;
    }
    return 0;
}

static void count_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    (void)o;
    snprintf(buf, len, "%" PRIu64, v->u);
}
const struct opt_type T_COUNT = UINT_TYPE(count_parse, count_check, count_format);

static int size_parse(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                      char *problem, size_t len)
{
    (void)o;
    int rc = config_scan_size(text, &v->u);
    if (rc == -ERANGE) {
        snprintf(problem, len, "invalid size '" SHOWN "' (too large)", shown);
        return -1;
    }
    if (rc < 0) {
        snprintf(problem, len,
                 "invalid size '" SHOWN "' (expected a whole number of bytes, optionally with a "
                 "K/KiB, M/MiB, G/GiB or T/TiB suffix and no space, e.g. 64MiB)", shown);
        return -1;
    }
    return 0;
}

/* "at least LO" or "LO..HI", in the option's own units. */
static void scaled_range(const struct opt_def *o, void (*format)(uint64_t, char *, size_t), char *buf, size_t len)
{
    char lo[32], hi[32];
    format(o->min, lo, sizeof lo);
    format(o->max, hi, sizeof hi);
    if (o->max == UINT64_MAX)
        snprintf(buf, len, "at least %s", lo);
    else
        snprintf(buf, len, "%s..%s", lo, hi);
}

static int size_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    char range[96];
    if (v->u < o->min || v->u > o->max) {
        scaled_range(o, config_format_size, range, sizeof range);
        snprintf(problem, len, "size '" SHOWN "' out of range (expected %s)", shown, range);
        return -1;
    }
    if (o->multiple && v->u % o->multiple != 0) {
        snprintf(problem, len, "size '" SHOWN "' is not a multiple of %" PRIu64 " bytes", shown, o->multiple);
        return -1;
    }
    return 0;
}

static void size_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    (void)o;
    config_format_size(v->u, buf, len);
}
const struct opt_type T_SIZE = UINT_TYPE(size_parse, size_check, size_format);

/* -- size or share: "N%" of another option (o->share_of), N into the
 * uint32_t at o->share_offset (v->i; 0 there: a size, in the uint64_t
 * field as T_SIZE keeps it) -- */

static int share_parse(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                       char *problem, size_t len)
{
    size_t n = strlen(text);
    v->i = 0;
    if (n == 0 || text[n - 1] != '%')
        return size_parse(o, text, shown, v, problem, len);
    char digits[24];
    uint64_t pct = 0;
    bool ok = n - 1 < sizeof digits;
    if (ok) {
        memcpy(digits, text, n - 1);
        digits[n - 1] = '\0';
        ok = config_parse_count(digits, &pct) == 0;
    }
    if (!ok) {
        snprintf(problem, len, "invalid share '" SHOWN "' (expected a whole percentage of %s from 1%% to 100%%, "
                 "e.g. 25%%, or a size)", shown, o->share_of);
        return -1;
    }
    v->u = 0;
    v->i = pct == 0 ? -1 : pct > 100 ? 101 : (int)pct;   /* out of range: reported by the check */
    return 0;
}

static int share_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    if (v->i == 0)
        return size_check(o, v, shown, problem, len);
    if (v->i < 1 || v->i > 100) {
        snprintf(problem, len, "share '" SHOWN "' out of range (expected 1%% to 100%% of %s)", shown, o->share_of);
        return -1;
    }
    return 0;
}

static void share_store(struct kvn_config *cfg, const struct opt_def *o, const struct opt_value *v)
{
    uint64_t bytes = v->i ? 0 : v->u;   /* a share's bytes: config_resolve's */
    uint32_t pct = (uint32_t)v->i;
    memcpy((char *)cfg + o->offset, &bytes, sizeof bytes);
    memcpy((char *)cfg + o->share_offset, &pct, sizeof pct);
}

static void share_load(const struct kvn_config *cfg, const struct opt_def *o, struct opt_value *v, char *buf,
                       size_t len)
{
    (void)buf, (void)len;
    uint32_t pct;
    memcpy(&v->u, (const char *)cfg + o->offset, sizeof v->u);
    memcpy(&pct, (const char *)cfg + o->share_offset, sizeof pct);
    v->i = pct > INT_MAX ? INT_MAX : (int)pct;   /* out of range: reported by the check */
}

static void share_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    if (v->i)
        snprintf(buf, len, "%d%%", v->i);
    else
        size_format(o, v, buf, len);
}

static bool share_equal(const struct opt_value *a, const struct opt_value *b)
{
    return a->i == b->i && (a->i != 0 || a->u == b->u);
}

const struct opt_type T_SHARE = { .parse = share_parse, .check = share_check, .store = share_store,
                                  .load = share_load, .format = share_format, .equal = share_equal };

static int duration_parse(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                          char *problem, size_t len)
{
    (void)o;
    int rc = config_scan_duration(text, &v->u);
    if (rc == -ERANGE || (rc == 0 && v->u > UINT32_MAX)) {
        snprintf(problem, len, "invalid duration '" SHOWN "' (too large)", shown);
        return -1;
    }
    if (rc < 0) {
        snprintf(problem, len,
                 "invalid duration '" SHOWN "' (expected a whole number with a ms, s, m or h suffix, "
                 "e.g. 500ms or 30s; a bare number is milliseconds)", shown);
        return -1;
    }
    return 0;
}

static int duration_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem,
                          size_t len)
{
    char range[96];
    if (v->u < o->min || v->u > o->max) {
        scaled_range(o, config_format_duration, range, sizeof range);
        snprintf(problem, len, "duration '" SHOWN "' out of range (expected %s)", shown, range);
        return -1;
    }
    return 0;
}

static void duration_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    (void)o;
    config_format_duration(v->u, buf, len);
}
const struct opt_type T_DURATION = UINT_TYPE(duration_parse, duration_check, duration_format);

/* -- fraction: a double field -- */

static int fraction_parse(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                          char *problem, size_t len)
{
    (void)o, (void)shown, (void)problem, (void)len;
    if (config_parse_fraction(text, &v->d) < 0)
        v->d = NAN;   /* reported by the range check */
    return 0;
}

static int fraction_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem,
                          size_t len)
{
    bool lo_ok = o->dmin_open ? v->d > o->dmin : v->d >= o->dmin;
    bool hi_ok = o->dmax_open ? v->d < o->dmax : v->d <= o->dmax;
    if (!isfinite(v->d) || !lo_ok || !hi_ok) {
        char lo[32], hi[32];
        config_format_fraction(o->dmin, lo, sizeof lo);
        config_format_fraction(o->dmax, hi, sizeof hi);
        snprintf(problem, len, "invalid value '" SHOWN "' (expected a fraction in %c%s, %s%c)", shown,
                 o->dmin_open ? '(' : '[', lo, hi, o->dmax_open ? ')' : ']');
        return -1;
    }
    return 0;
}

static void fraction_store(struct kvn_config *cfg, const struct opt_def *o, const struct opt_value *v)
{
    memcpy((char *)cfg + o->offset, &v->d, sizeof v->d);
}

static void fraction_load(const struct kvn_config *cfg, const struct opt_def *o, struct opt_value *v, char *buf,
                          size_t len)
{
    (void)buf, (void)len;
    memcpy(&v->d, (const char *)cfg + o->offset, sizeof v->d);
}

static void fraction_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    (void)o;
    config_format_fraction(v->d, buf, len);
}

static bool fraction_equal(const struct opt_value *a, const struct opt_value *b)
{
    return a->d == b->d;
}

const struct opt_type T_FRACTION = { .parse = fraction_parse, .check = fraction_check,
                                            .store = fraction_store, .load = fraction_load,
                                            .format = fraction_format, .equal = fraction_equal };

/* -- named values: an int field -- */

static int enum_index(const struct opt_def *o, const char *text)
{
    for (int i = 0; i < o->nnames; i++)
        if (strcasecmp(text, o->names[i]) == 0)
            return i;
    return -1;
}

/* "expected a, b or c" */
static void enum_hint(const struct opt_def *o, char *buf, size_t len)
{
    size_t used = 0;
    int n = snprintf(buf, len, "expected");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < o->nnames && used < len; i++) {
        n = snprintf(buf + used, len - used, "%s%s", i == 0 ? " " : i == o->nnames - 1 ? " or " : ", ",
                     o->names[i]);
        if (n > 0)
            used += (size_t)n;
    }
}


static void int_store(struct kvn_config *cfg, const struct opt_def *o, const struct opt_value *v)
{
    memcpy((char *)cfg + o->offset, &v->i, sizeof v->i);
}

static void int_load(const struct kvn_config *cfg, const struct opt_def *o, struct opt_value *v, char *buf,
                     size_t len)
{
    (void)buf, (void)len;
    memcpy(&v->i, (const char *)cfg + o->offset, sizeof v->i);
}

static bool int_equal(const struct opt_value *a, const struct opt_value *b)
{
    return a->i == b->i;
}

static int enum_parse(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                      char *problem, size_t len)
{
    (void)shown, (void)problem, (void)len;
    v->i = enum_index(o, text);   /* -1 is reported by the check */
    return 0;
}

static int enum_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    if (v->i < 0 || v->i >= o->nnames) {
        char hint[96];
        enum_hint(o, hint, sizeof hint);
        snprintf(problem, len, "invalid value '" SHOWN "' (%s)", shown, hint);
        return -1;
    }
    return 0;
}

static void enum_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    if (v->i >= 0 && v->i < o->nnames)
        snprintf(buf, len, "%s", o->names[v->i]);
    else
        snprintf(buf, len, "%d", v->i);
}

const struct opt_type T_ENUM = { .parse = enum_parse, .check = enum_check, .store = int_store,
                                        .load = int_load, .format = enum_format, .equal = int_equal };

static int level_parse(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                       char *problem, size_t len)
{
    (void)o, (void)shown, (void)problem, (void)len;
    v->i = log_level_parse(text);   /* -1 is reported by the check */
    return 0;
}

static int level_check(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len)
{
    (void)o;
    if (v->i < LOG_LEVEL_ERROR || v->i > LOG_LEVEL_DEBUG) {
        snprintf(problem, len, "invalid value '" SHOWN "' (expected error, warn, info or debug)", shown);
        return -1;
    }
    return 0;
}

static void level_format(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len)
{
    (void)o;
    if (v->i >= LOG_LEVEL_ERROR && v->i <= LOG_LEVEL_DEBUG)
        snprintf(buf, len, "%s", log_level_name(v->i));
    else
        snprintf(buf, len, "%d", v->i);
}

const struct opt_type T_LEVEL = { .parse = level_parse, .check = level_check, .store = int_store,
                                         .load = int_load, .format = level_format, .equal = int_equal };

/* -- through the type -- */

/* Range and shape checks on a value. `shown` is the value as the user
 * wrote it, or NULL to format it (validating a struct built in code). */
int config_check_value(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem,
                              size_t len)
{
    char text[VALUE_MAX + 16], showbuf[VALUE_SHOW + 8];
    if (!shown) {
        o->type->format(o, v, text, sizeof text);
        shown = config_show(text, showbuf, sizeof showbuf);
    }
    return o->type->check(o, v, shown, problem, len);
}

/* Text -> value, then the same checks as config_validate. */
int config_parse_value(const struct opt_def *o, const char *text, struct opt_value *v, char *problem,
                              size_t len)
{
    char showbuf[VALUE_SHOW + 8];
    const char *shown = config_show(text, showbuf, sizeof showbuf);

    if (o->type->parse) {
        if (o->type->parse(o, text, shown, v, problem, len) < 0)
            return -1;
    } else {
        v->s = text;
    }
    return config_check_value(o, v, shown, problem, len);
}
