/* kvcm_config: the [kvcm] section -- its settings (struct kvcm_config,
 * embedded in struct kvn_config as `kvcm`), the option checks, and the
 * helpers the KVCM code calls at run time (config_kvcm_expand,
 * config_kvcm_endpoints, config_kvcm_storage_type_name) -- next to the code
 * that uses the options. config.c's table names these checks for the
 * [kvcm] rows (parse/check step) and calls kvcm_config_validate from
 * config_validate (the rules between [kvcm] options). Built on
 * config_values.h only: config includes this header, never the reverse.
 * Pure functions, any thread. */
#ifndef KVNODE_KVCM_CONFIG_H
#define KVNODE_KVCM_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "config/config_values.h"

#define CONFIG_KVCM_ENDPOINTS_TEXT 1024 /* [kvcm] endpoints text, NUL included */
#define CONFIG_KVCM_ENDPOINTS_MAX  8    /* URLs in [kvcm] endpoints */
#define CONFIG_KVCM_NAME_MAX     128    /* [kvcm] instance_group, host_ip_port text, NUL included */
#define CONFIG_KVCM_MEDIUM_MAX    32    /* [kvcm] medium_hbm / medium_host text, NUL included */
#define CONFIG_KVCM_TEMPLATE_MAX 256    /* [kvcm] instance_id / spec_name / location_uri, NUL included */

struct config_urllist {          /* [kvcm] endpoints: config_kvcm_endpoints */
    size_t   n;
    char     url[CONFIG_KVCM_ENDPOINTS_MAX][CONFIG_URL_MAX];
};

/* [kvcm] storage_type, in the order of config_kvcm_storage_type_name(). */
enum { CONFIG_KVCM_STORAGE_L1P5 = 0, CONFIG_KVCM_STORAGE_L2 = 1 };

/* [kvcm] (every option restart-only; nothing is sent unless enabled). */
struct kvcm_config {
    int      enabled;                /* 0 off (default), 1 on: publish to and query KVCM */
    char     endpoints[CONFIG_KVCM_ENDPOINTS_TEXT]; /* base URLs, comma/blank separated
                                        (config_kvcm_endpoints splits them) */
    struct config_urllist endpoint_list; /* endpoints split (config_resolve) */
    char     instance_group[CONFIG_KVCM_NAME_MAX];  /* registerInstance instance_group */
    char     instance_id[CONFIG_KVCM_TEMPLATE_MAX]; /* template of the instance id, per deployment */
    char     host_ip_port[CONFIG_KVCM_NAME_MAX];    /* this daemon's reporter identity, HOST:PORT */
    int      storage_type;           /* CONFIG_KVCM_STORAGE_*: reportEvent storage_type */
    char     medium_hbm[CONFIG_KVCM_MEDIUM_MAX];    /* medium name of the GPU (HBM) tier */
    char     medium_host[CONFIG_KVCM_MEDIUM_MAX];   /* medium name of the host-memory tier */
    char     spec_name[CONFIG_KVCM_TEMPLATE_MAX];   /* template of the location spec name */
    char     location_uri[CONFIG_KVCM_TEMPLATE_MAX];/* template of a block's location URI */
    uint32_t request_timeout_ms;     /* bound on one KVCM call (snapshots excepted) */
    uint32_t connect_timeout_ms;     /* bound on connecting to KVCM */
    uint32_t snapshot_timeout_ms;    /* bound on one snapshot upload */
    uint32_t flush_interval_ms;      /* longest an event waits before its batch is sent */
    uint32_t batch_events;           /* events per ADD/DELETE request, at most */
    uint32_t queue_events;           /* publisher queue; overflow -> drop + resync snapshot */
    uint32_t heartbeat_interval_ms;  /* heartbeat period (own thread) */
    uint32_t retry_base_ms;          /* first retry delay after a failure ... */
    uint32_t retry_max_ms;           /* ... doubling up to this */
    uint32_t snapshot_interval_ms;   /* periodic full snapshot */
    uint32_t host_down_timeout_ms;   /* bound on HOST_DOWN at stop */
    uint32_t stall_timeout_ms;       /* work waiting longer without reaching KVCM: STALLED */
    uint32_t query_deadline_ms;      /* remote prefix query: one deadline per request */
    uint32_t query_max_hosts;        /* peer hosts returned per query, at most */
    uint32_t query_breaker_failures; /* consecutive failures that open the breaker */
    uint32_t query_breaker_open_ms;  /* how long an open breaker answers locally */
    uint32_t query_negative_ttl_ms;  /* how long a failed leader lookup is remembered */
};

/* ---- the option checks (config.c's table, config_types.c) ---- */

/* Template placeholders, one bit each: which ones an option may use. */
enum {
    KVCM_VAR_MODEL = 1u << 0, KVCM_VAR_DTYPE = 1u << 1, KVCM_VAR_BLOCK_TOKENS = 1u << 2,
    KVCM_VAR_TP_SIZE = 1u << 3, KVCM_VAR_FINGERPRINT = 1u << 4, KVCM_VAR_HOST_IP_PORT = 1u << 5,
    KVCM_VAR_MEDIUM = 1u << 6, KVCM_VAR_BLOCK_BYTES = 1u << 7, KVCM_VAR_KEY = 1u << 8,
};
/* What identifies a deployment: instance_id's placeholders. */
#define KVCM_VARS_DEPLOYMENT (KVCM_VAR_MODEL | KVCM_VAR_DTYPE | KVCM_VAR_BLOCK_TOKENS | KVCM_VAR_TP_SIZE | \
                              KVCM_VAR_FINGERPRINT)

/* The wire names of [kvcm] storage_type, in CONFIG_KVCM_STORAGE_* order. */
extern const char *const kvcm_config_storage_names[2];

/* Option `key`'s template t: every '{' opens a placeholder in `vars`,
 * closed by '}'; no stray '}'. 0, or -1 with problem set. */
int kvcm_config_check_template(const char *key, unsigned vars, const char *t, char *problem, size_t len);

/* The KVCM_VAR_* placeholders template t uses (placeholders it does not
 * know, and braces out of place, count as none). */
unsigned kvcm_config_template_vars(const char *t);

/* host_ip_port s (non-empty): HOST:PORT, port 1..65535, naming this host
 * uniquely (no loopback, unspecified or localhost names). `shown` is s as
 * messages print it. 0, or -1 with problem set. */
int kvcm_config_check_host_ip_port(const char *s, const char *shown, char *problem, size_t len);

/* Split an endpoints list (see config_kvcm_endpoints) into list, which is
 * zeroed first. 0, or -1 with problem (may be NULL) set. */
int kvcm_config_split_endpoints(const char *text, struct config_urllist *list, size_t max, char *problem,
                                size_t len);

/* The rules between [kvcm] options, with enabled = on: every required field
 * set (each missing one on its own line), media distinct, retry_base <=
 * retry_max, batch_events <= queue_events. Off: nothing. */
void kvcm_config_validate(const struct kvcm_config *kc, struct errbuf *errors);

/* ---- at run time (the KVCM code, any thread) ---- */

/* The wire name of a storage type: "ST_EVENT_REPORT_L1P5", "ST_EVENT_REPORT_L2"
 * ("" for a value out of range). */
const char *config_kvcm_storage_type_name(int storage_type);

/* Split [kvcm] endpoints into base URLs (commas and/or blanks separate them;
 * a trailing '/' is dropped, so "<url>/api/<rpc>" can be appended). Each is
 * http:// or https://, a host (name, IPv4 or [IPv6]), an optional :PORT
 * (1..65535) and an optional path; no URL twice; at most
 * CONFIG_KVCM_ENDPOINTS_MAX. 0 with *n set (0 for an empty list), or -1 when
 * the text is invalid or holds more than max URLs. */
int config_kvcm_endpoints(const struct kvcm_config *kc, char out[][CONFIG_URL_MAX], size_t max, size_t *n);

/* The values a [kvcm] template may refer to. Which placeholders each option
 * accepts is checked when it is parsed:
 *   instance_id:  {model} {dtype} {block_tokens} {tp_size} {fingerprint}
 *   spec_name:    the same and {block_bytes}
 *   location_uri: {host_ip_port} {medium} {block_bytes} {key}
 * Templates have no escapes: '{' always opens a placeholder and a '}' outside
 * one is an error. */
struct config_kvcm_vars {
    const char *model;          /* {model}: the layout's model name, verbatim */
    const char *dtype;          /* {dtype} */
    uint32_t    block_tokens;   /* {block_tokens}: tokens per block */
    uint32_t    tp_size;        /* {tp_size} */
    uint64_t    fingerprint;    /* {fingerprint}: deployment fingerprint, lowercase hex
                                   without padding (as in deployment ids) */
    const char *host_ip_port;   /* {host_ip_port}: the configured identity */
    const char *medium;         /* {medium}: medium_hbm or medium_host */
    uint64_t    block_bytes;    /* {block_bytes}: bytes of one block across the
                                   deployment's TP ranks (block_bytes x tp_size, the
                                   size registered in location_spec_infos) */
    int64_t     key;            /* {key}: block key, signed decimal (the wire form) */
};

/* Expand `tmpl` into out (len bytes, NUL included). Returns the length of
 * the result, or -1 -- out then holds "" -- when the template has an
 * unknown placeholder or a stray brace, a string it refers to is NULL, or
 * the result does not fit. */
int config_kvcm_expand(const char *tmpl, const struct config_kvcm_vars *vars, char *out, size_t len);

#endif
