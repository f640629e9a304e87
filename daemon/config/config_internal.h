/* config_internal: what the pieces of the config module share and nothing
 * else includes -- config.c (the option table, file and override parsing,
 * validation, output, reload) and config_types.c (one table of functions per
 * option type). Both build on config_values.h (values as text and back, the
 * error collector) and config_text.h (units, how messages show a value);
 * the [kvcm] checks are kvcm_config.h's. */
#ifndef KVNODE_CONFIG_INTERNAL_H
#define KVNODE_CONFIG_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "config/config_text.h"
#include "config/config_values.h"

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
    /* share: the uint32_t field that takes N of "N%" (0: a size), and the
     * option N% is a share of ("memory.host_bytes"), for messages */
    size_t share_offset;
    const char *share_of;
    /* [tenant.NAME] limits: unset (0), they take the option of this section
     * and the same key, whose type and range they share; inherit_bit is the
     * CONFIG_TENANT_INHERIT_* bit that records it */
    const char *inherit;
    unsigned inherit_bit;
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
extern const struct opt_type T_SHARE;     /* a size (uint64_t field) or "N%" (N into share_offset) */

/* ---- through the type (config_types.c) ---- */

/* Range and shape checks on a value. `shown` is the value as the user
 * wrote it, or NULL to format it (validating a struct built in code). */
int config_check_value(const struct opt_def *o, struct opt_value *v, const char *shown, char *problem, size_t len);
/* Text -> value, then the same checks as config_validate. */
int config_parse_value(const struct opt_def *o, const char *text, struct opt_value *v, char *problem, size_t len);

/* ---- the option table (config.c) ---- */

#define PROBLEM_MAX 400   /* one "<problem>" text */

/* The row of [section] key, or NULL. */
const struct opt_def *config_find_option(const char *section, const char *key);

/* ---- [tenant.NAME] sections (config_tenant.c) ---- */

#define TENANT_PREFIX "tenant."
#define TENANT_PREFIX_LEN (sizeof TENANT_PREFIX - 1)

/* Whether the section name s[0..len) is "tenant." followed by anything. */
bool config_tenant_section(const char *s, size_t len);
/* The index of the tenant NAME (s[0..len), the part after "tenant.") in
 * cfg, added with every key unset when cfg has none of that name. -1 with
 * problem set when NAME is invalid or CONFIG_TENANTS_MAX are there. */
int config_tenant_find_or_add(struct kvn_config *cfg, const char *s, size_t len, char *problem, size_t plen);
/* The index of the tenant NAME, or -1. */
int config_tenant_find(const struct kvn_config *cfg, const char *name);
/* The row of a tenant section's key as it applies to tenant i (offsets
 * into cfg->tenants[i], the inherited type and range); false for an unknown
 * key. */
bool config_tenant_option(const char *key, size_t i, struct opt_def *out);
/* Whether some tenant row has this key (for "it belongs in" hints). */
bool config_tenant_key_known(const char *key);
/* "uids, gids, ... or max_reserved_per_client", for messages. */
const char *config_tenant_keys_hint(void);
/* The [tenant.NAME] checks of config_validate (field by field and between
 * sections); with `resolved`, the tenants' parsed forms go into it. */
void config_tenant_check(const struct kvn_config *cfg, struct kvn_config *resolved, struct errbuf *errors);
/* config_write's [tenant.NAME] sections. */
void config_tenant_write(const struct kvn_config *cfg, FILE *out);
/* The tenants' part of config_restart_required: the count, names appended
 * to buf at *used. */
int config_tenant_restart_required(const struct kvn_config *running, const struct kvn_config *next, char *buf,
                                   size_t buflen, size_t *used);
/* The tenants' part of config_keep_restart_only. */
void config_tenant_keep_restart_only(struct kvn_config *next, const struct kvn_config *running);

#endif
