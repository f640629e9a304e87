/* config_internal: what the pieces of the config module share and nothing
 * else includes -- config.c (the option table, file and override parsing,
 * validation, output, reload), config_types.c (one table of functions per
 * option type), config_values.c (values as text and back) and
 * kvcm/kvcm_config.c (the [kvcm] checks). */
#ifndef KVNODE_CONFIG_INTERNAL_H
#define KVNODE_CONFIG_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "config.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

#define MS_PER_S UINT64_C(1000)
#define MS_PER_M (60 * MS_PER_S)
#define MS_PER_H (60 * MS_PER_M)

/* sun_path holds the socket path including its terminating NUL. */
#define SUN_PATH_SIZE sizeof(((struct sockaddr_un *)0)->sun_path)

/* Room for a NUL-terminated copy of any string field plus one byte, so a
 * field without a terminator (a struct built by code) loads as too long. */
#define VALUE_MAX (PATH_MAX + 1)

/* One option's value on its way between text and struct kvn_config. */
struct opt_value {
    uint64_t u;         /* mode, size, count, duration */
    double d;           /* fraction */
    int i;              /* enum, log level */
    const char *s;      /* string types: the text */
    union {             /* list/address types: the parsed form (check fills it,
                           config_resolve stores it) */
        uint32_t gid;
        struct config_idlist ids;
        struct config_listen listen;
        struct config_devices devices;
        struct config_urllist urls;
    } parsed;
};

struct opt_def;

/* What an option type does. `shown` is the value as messages print it. */
struct opt_type {
    /* Text -> value; fails only on text of the wrong shape (range problems
     * are check's). NULL: the text is the value. */
    int  (*parse)(const struct opt_def *o, const char *text, const char *shown, struct opt_value *v,
                  char *problem, size_t len);
    /* Range and shape of a value, from text or from a struct built by code. */
    int  (*check)(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len);
    void (*store)(struct kvn_config *cfg, const struct opt_def *o, const struct opt_value *v);
    /* Field -> value; string types copy into buf (len bytes). */
    void (*load)(const struct kvn_config *cfg, const struct opt_def *o, struct opt_value *v, char *buf,
                 size_t len);
    /* Value -> text that parses back to it. */
    void (*format)(const struct opt_def *o, const struct opt_value *v, char *buf, size_t len);
    bool (*equal)(const struct opt_value *a, const struct opt_value *b);
};

struct opt_def {
    const char *section;
    const char *key;
    const struct opt_type *type;
    const char *def;    /* the default, spelled as in kvnode.conf */
    size_t offset;      /* of the field in struct kvn_config */
    size_t width;       /* sizeof the field (integers: 4 or 8) */
    size_t parsed_offset, parsed_width; /* list/address types: the parsed form's field */
    uint64_t min, max;  /* inclusive, for integer types */
    uint64_t multiple;  /* size: value must be a multiple (0: any) */
    double dmin, dmax;  /* fraction bounds ... */
    bool dmin_open, dmax_open;  /* ... and whether each excludes its end */
    bool restart;       /* a change needs a restart; not applied on reload */
    bool empty_ok;      /* socket path: "" is accepted (config_validate decides when it is needed) */
    const char *const *names;   /* enum: the value i is spelled names[i] ... */
    int nnames;                 /* ... for 0 <= i < nnames */
    bool no_hash;       /* text: '#' is refused (KVCM does not accept it there) */
    unsigned vars;      /* template: the KVCM_VAR_* placeholders allowed */
};

/* The types (config_types.c). */
extern const struct opt_type T_PATH;      /* unix socket path, shorter than sun_path */
extern const struct opt_type T_MODE;      /* octal permission bits */
extern const struct opt_type T_SIZE;      /* bytes with optional binary suffix */
extern const struct opt_type T_COUNT;     /* plain unsigned integer */
extern const struct opt_type T_DURATION;  /* milliseconds with optional ms/s/m/h suffix */
extern const struct opt_type T_FRACTION;  /* double within (dmin, dmax) open/closed per flags */
extern const struct opt_type T_ENUM;      /* int: index into names[] (case-insensitive) */
extern const struct opt_type T_LEVEL;     /* LOG_LEVEL_* */
extern const struct opt_type T_LISTEN;    /* config_parse_listen; parsed: struct config_listen */
extern const struct opt_type T_USERS;     /* user names or uids; parsed: struct config_idlist */
extern const struct opt_type T_GROUPS;    /* group names or gids; parsed: struct config_idlist */
extern const struct opt_type T_GROUP;     /* one group name or gid, or empty; parsed: the gid */
extern const struct opt_type T_DIR;       /* any path shorter than the field, or empty */
extern const struct opt_type T_URL;       /* shorter than the field, no credentials, or empty */
extern const struct opt_type T_TEXT;      /* a name without blanks or control characters, or empty */
extern const struct opt_type T_TEMPLATE;  /* like T_TEXT, with {placeholders} from the vars mask */
extern const struct opt_type T_HOSTPORT;  /* HOST:PORT naming this host uniquely, or empty */
extern const struct opt_type T_URLLIST;   /* http(s) URLs, or empty; parsed: struct config_urllist */
extern const struct opt_type T_DEVICES;   /* "all" or device ordinals; parsed: struct config_devices */

/* ---- messages ---- */

#define VALUE_SHOW  80    /* longest value echoed back in a message ... */
#define SHOWN "%.83s"     /* ... plus "...": the format for it */

#define CREDENTIALS_HINT "not shown here; credentials in a URL would be printed by /config, --check-config " \
                         "and in logs"

/* The value as the user typed it, cut to VALUE_SHOW characters plus "..."
 * (into buf when cut). */
const char *config_show(const char *text, char *buf, size_t len);

/* Collects one error per line into the caller's buffer. Room for a final
 * "(N more errors not shown)" line is always kept free. */
struct errbuf {
    char *buf;
    size_t cap, len;
    unsigned count, dropped;
};

__attribute__((format(printf, 2, 3)))
void config_errbuf_add(struct errbuf *eb, const char *fmt, ...);

/* ---- values (config_values.c) ---- */

/* DIGITS[UNIT] as config_parse_size / config_parse_duration_ms read it, the
 * result in bytes / ms without their range limits. 0, -EINVAL for malformed
 * text, -ERANGE when it overflows 64 bits. */
int config_scan_size(const char *text, uint64_t *out);
int config_scan_duration(const char *text, uint64_t *out);
/* Plain digits; -1 otherwise. */
int config_parse_count(const char *text, uint64_t *out);
/* Octal digits, at most 6; -1 otherwise. */
int config_parse_mode(const char *text, uint64_t *out);
/* A finite decimal number (no inf, nan, hex or blanks); -1 otherwise. */
int config_parse_fraction(const char *text, double *out);

/* The largest exact unit ("64MiB", "1500ms", "0s"); shortest %g that reads
 * back as exactly d. */
void config_format_size(uint64_t v, char *buf, size_t len);
void config_format_duration(uint64_t ms, char *buf, size_t len);
void config_format_fraction(double d, char *buf, size_t len);

/* The next item of a list whose items are separated by commas and/or
 * blanks: *start and *len receive it and *p moves past it; false (nothing
 * set) when only separators are left. */
bool config_list_next(const char **p, const char **start, size_t *len);

/* True when the URL s[0..n) carries userinfo ("user:password@") in its
 * authority: after an optional "scheme://", before the first '/', '?' or
 * '#'. Such a URL is refused, not stored: /config, --check-config and error
 * messages print URLs, so a password in one would reach every reader. */
bool config_url_has_credentials(const char *s, size_t n);

/* ---- through the type (config_types.c) ---- */

/* Range and shape checks on a value. `shown` is the value as the user
 * wrote it, or NULL to format it (validating a struct built in code). */
int config_check_value(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len);
/* Text -> value, then the same checks as config_validate. */
int config_parse_value(const struct opt_def *o, const char *text, struct opt_value *v, char *problem, size_t len);

#endif
