/* config: kvnode.conf parsing (libinih), command-line overrides, defaults and
 * validation. Owns struct kvn_config; the daemon keeps one effective copy on
 * the loop thread. Parsing never touches a running config: a reload builds a
 * new struct and swaps it only when the whole file is valid. */
#ifndef KVNODE_CONFIG_H
#define KVNODE_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define CONFIG_ERR_MAX 2048
#define CONFIG_LISTEN_MAX 160   /* [admin] listen text, NUL included */
#define CONFIG_IDLIST_MAX 512   /* allow_uids / allow_gids text, NUL included */
#define CONFIG_NAME_MAX   64    /* socket_group text, NUL included */
#define CONFIG_IDS_MAX    64    /* ids in one allow list */
#define CONFIG_URL_MAX    512   /* [persist] url text, one [kvcm] endpoint, NUL included */
#define CONFIG_OBJECT_NS_MAX 128 /* [persist] object_namespace, NUL included (V6D_OBJECT_NS_MAX) */
#define CONFIG_KVCM_ENDPOINTS_TEXT 1024 /* [kvcm] endpoints text, NUL included */
#define CONFIG_KVCM_ENDPOINTS_MAX  8    /* URLs in [kvcm] endpoints */
#define CONFIG_KVCM_NAME_MAX     128    /* [kvcm] instance_group, host_ip_port text, NUL included */
#define CONFIG_KVCM_MEDIUM_MAX    32    /* [kvcm] medium_hbm / medium_host text, NUL included */
#define CONFIG_KVCM_TEMPLATE_MAX 256    /* [kvcm] instance_id / spec_name / location_uri, NUL included */
#define CONFIG_HBM_DEVICES_MAX 16

/* Parsed forms of the list and address options. config_resolve fills them
 * from the text options once the configuration is complete (the daemon's
 * last step after defaults, file and overrides), so the modules use these
 * and never parse the text again; the text stays what /config prints and
 * what a reload compares. Until config_resolve they are zero. */
enum { CONFIG_LISTEN_OFF = 0, CONFIG_LISTEN_TCP = 1, CONFIG_LISTEN_UNIX = 2 };
struct config_listen {           /* [admin] listen: config_parse_listen */
    int      kind;               /* CONFIG_LISTEN_* */
    char     host[64];           /* TCP: without brackets */
    uint16_t port;               /* TCP */
    char     path[108];          /* UNIX */
};
struct config_idlist {           /* [server] allow_uids / allow_gids: config_parse_idlist */
    size_t   n;                  /* 0: the list is empty */
    uint32_t id[CONFIG_IDS_MAX];
};
struct config_devices {          /* [hbm] devices: config_hbm_devices */
    size_t   n;                  /* 0: every visible device ("all") */
    int      dev[CONFIG_HBM_DEVICES_MAX];
};
struct config_urllist {          /* [kvcm] endpoints: config_kvcm_endpoints */
    size_t   n;
    char     url[CONFIG_KVCM_ENDPOINTS_MAX][CONFIG_URL_MAX];
};

struct kvn_config {
    /* [server] */
    char     socket_path[PATH_MAX];  /* unix socket engines connect to */
    unsigned socket_mode;            /* permission bits of the socket file, e.g. 0660 */
    char     socket_group[CONFIG_NAME_MAX]; /* group owning the socket file ("": leave it) */
    char     allow_uids[CONFIG_IDLIST_MAX]; /* users allowed to connect ("": anyone) */
    char     allow_gids[CONFIG_IDLIST_MAX]; /* groups allowed to connect ("": anyone) */
    uint32_t socket_gid;             /* socket_group resolved (when it is set; config_resolve) */
    struct config_idlist allow_uid_list; /* allow_uids resolved */
    struct config_idlist allow_gid_list; /* allow_gids resolved */
    uint32_t max_frame_bytes;        /* largest accepted frame (header excluded) */
    uint32_t max_keys_per_request;   /* largest key chain in one request */
    uint32_t max_clients;            /* connections beyond this are refused */
    uint32_t max_namespaces;         /* distinct (deployment, tp_rank) pairs */
    uint32_t request_timeout_ms;     /* bound on a deferred reply (promotion waits) */
    uint32_t shutdown_timeout_ms;    /* SIGTERM: bound on finishing in-flight work */
    uint32_t frame_timeout_ms;       /* a frame in progress that stops arriving is dropped */
    uint64_t max_buffered_input_bytes; /* room for frames being received, all clients together */
    uint32_t worker_stall_timeout_ms; /* a worker silent this long is stalled (/readyz, watchdog) */

    /* [memory] */
    uint64_t host_bytes;             /* size of the host-memory tier (memfd arena) */
    uint64_t slab_bytes;             /* allocator slab; largest block size accepted */
    double   high_watermark;         /* fraction of host_bytes that starts eviction */
    double   low_watermark;          /* eviction stops below this fraction */
    int      pin_host;               /* CONFIG_PIN_{AUTO,ON,OFF}: cudaHostRegister the arena */
    uint64_t namespace_quota;        /* host-tier bytes one namespace may hold (0: no quota) */
    uint64_t pin_chunk_bytes;        /* pin_host registers the arena in chunks of this (restart) */

    /* [hbm] (restart-only except the watermarks) */
    int      hbm_backend;            /* CONFIG_HBM_*: auto (cuda when a GPU is visible), cuda, sim, none */
    uint64_t hbm_bytes;              /* GPU memory owned per device, 0: no HBM tier */
    char     hbm_devices[CONFIG_IDLIST_MAX]; /* "all", or device ordinals (config_hbm_devices) */
    struct config_devices hbm_device_list;   /* hbm_devices parsed */
    double   hbm_high_watermark;     /* fraction of a device's arena that starts demotion (reloadable) */
    double   hbm_low_watermark;      /* demotion stops below this fraction (reloadable) */
    int      hbm_required;           /* 1: start fails when HBM is asked for (bytes > 0) and unavailable */
    uint64_t hbm_copy_batch_bytes;   /* largest demotion batch (one transfer job) */

    /* [leases] */
    uint32_t read_lease_ttl_ms;      /* reaper ends read leases older than this */
    uint32_t write_lease_ttl_ms;     /* reaper aborts write leases older than this */
    uint32_t reaper_interval_ms;     /* how often the reaper runs */
    uint32_t max_leases_per_client;  /* open leases per connection */
    double   max_reserved_per_client; /* share of the host tier one connection may hold
                                         in uncommitted put reservations */

    /* [log] */
    int      log_level;              /* LOG_LEVEL_* */

    /* [admin] */
    char     admin_listen[CONFIG_LISTEN_MAX]; /* "HOST:PORT", "unix:PATH" or "off" */
    struct config_listen admin_listen_addr;   /* admin_listen parsed */
    uint32_t admin_max_connections;  /* admin connections beyond this are refused */
    uint32_t admin_request_timeout_ms; /* a request must arrive whole within this */

    /* [persist] */
    int      persist_backend;        /* CONFIG_BACKEND_*: off, file (default), v6d (restart) */
    int      persist_policy;         /* CONFIG_POLICY_*: when blocks are written (reloadable) */
    char     persist_path[PATH_MAX]; /* file: root directory (restart) */
    uint64_t persist_capacity;       /* file: bytes on disk before LRU eviction, 0: none (restart) */
    int      persist_fsync;          /* KVS_FSYNC_* values: never, batch, always (restart) */
    uint32_t persist_workers;        /* worker threads (restart) */
    uint32_t persist_queue;          /* outstanding store jobs before drops (restart) */
    char     persist_url[CONFIG_URL_MAX];   /* v6d: control-plane base URL (restart) */
    char     persist_socket[PATH_MAX];      /* v6d: data-plane unix socket (restart) */
    uint32_t persist_connect_timeout_ms;    /* v6d: connect bound (restart) */
    uint32_t persist_timeout_ms;            /* v6d: bound on one store call (restart) */
    int      persist_lookup;         /* CONFIG_LOOKUP_*: ask the store about keys the index
                                        lacks (auto: only for stores no scan can enumerate) */
    char     persist_object_namespace[CONFIG_OBJECT_NS_MAX]; /* v6d: first part of every object
                                        key, rtp-llm's kvs_object_namespace (restart) */
    uint32_t persist_tombstones;     /* deleted keys hidden from lookups when the store cannot
                                        delete them (v6d), oldest forgotten first (restart) */

    /* [kvcm] (every option restart-only; nothing is sent unless enabled) */
    int      kvcm_enabled;           /* 0 off (default), 1 on: publish to and query KVCM */
    char     kvcm_endpoints[CONFIG_KVCM_ENDPOINTS_TEXT]; /* base URLs, comma/blank separated
                                        (config_kvcm_endpoints splits them) */
    struct config_urllist kvcm_endpoint_list; /* kvcm_endpoints split */
    char     kvcm_instance_group[CONFIG_KVCM_NAME_MAX];  /* registerInstance instance_group */
    char     kvcm_instance_id[CONFIG_KVCM_TEMPLATE_MAX]; /* template of the instance id, per deployment */
    char     kvcm_host_ip_port[CONFIG_KVCM_NAME_MAX];    /* this daemon's reporter identity, HOST:PORT */
    int      kvcm_storage_type;      /* CONFIG_KVCM_STORAGE_*: reportEvent storage_type */
    char     kvcm_medium_hbm[CONFIG_KVCM_MEDIUM_MAX];    /* medium name of the GPU (HBM) tier */
    char     kvcm_medium_host[CONFIG_KVCM_MEDIUM_MAX];   /* medium name of the host-memory tier */
    char     kvcm_spec_name[CONFIG_KVCM_TEMPLATE_MAX];   /* template of the location spec name */
    char     kvcm_location_uri[CONFIG_KVCM_TEMPLATE_MAX];/* template of a block's location URI */
    uint32_t kvcm_request_timeout_ms;     /* bound on one KVCM call (snapshots excepted) */
    uint32_t kvcm_connect_timeout_ms;     /* bound on connecting to KVCM */
    uint32_t kvcm_snapshot_timeout_ms;    /* bound on one snapshot upload */
    uint32_t kvcm_flush_interval_ms;      /* longest an event waits before its batch is sent */
    uint32_t kvcm_batch_events;           /* events per ADD/DELETE request, at most */
    uint32_t kvcm_queue_events;           /* publisher queue; overflow -> drop + resync snapshot */
    uint32_t kvcm_heartbeat_interval_ms;  /* heartbeat period (own thread) */
    uint32_t kvcm_retry_base_ms;          /* first retry delay after a failure ... */
    uint32_t kvcm_retry_max_ms;           /* ... doubling up to this */
    uint32_t kvcm_snapshot_interval_ms;   /* periodic full snapshot */
    uint32_t kvcm_host_down_timeout_ms;   /* bound on HOST_DOWN at stop */
    uint32_t kvcm_stall_timeout_ms;       /* work waiting longer without reaching KVCM: STALLED */
    uint32_t kvcm_query_deadline_ms;      /* remote prefix query: one deadline per request */
    uint32_t kvcm_query_max_hosts;        /* peer hosts returned per query, at most */
    uint32_t kvcm_query_breaker_failures; /* consecutive failures that open the breaker */
    uint32_t kvcm_query_breaker_open_ms;  /* how long an open breaker answers locally */
    uint32_t kvcm_query_negative_ttl_ms;  /* how long a failed leader lookup is remembered */
};

enum { CONFIG_BACKEND_OFF = 0, CONFIG_BACKEND_FILE = 1, CONFIG_BACKEND_V6D = 2 };
/* write_through: persist on commit; write_back: persist when a block leaves
 * memory; off: write nothing (the store still serves reads and deletes). */
enum { CONFIG_POLICY_WRITE_THROUGH = 0, CONFIG_POLICY_WRITE_BACK = 1, CONFIG_POLICY_OFF = 2 };
enum { CONFIG_LOOKUP_AUTO = 0, CONFIG_LOOKUP_ON = 1, CONFIG_LOOKUP_OFF = 2 };

enum { CONFIG_PIN_AUTO = 0, CONFIG_PIN_ON = 1, CONFIG_PIN_OFF = 2 };
enum { CONFIG_HBM_AUTO = 0, CONFIG_HBM_CUDA = 1, CONFIG_HBM_SIM = 2, CONFIG_HBM_NONE = 3 };

/* [kvcm] storage_type, in the order of config_kvcm_storage_type_name(). */
enum { CONFIG_KVCM_STORAGE_L1P5 = 0, CONFIG_KVCM_STORAGE_L2 = 1 };

/* Embedded defaults (the values conf/kvnode.conf documents), one per row of
 * the option table. */
void config_defaults(struct kvn_config *cfg);

/* The option table, in config_write order: the i-th option's section and
 * key; false past the last one. For tests and tools that check the
 * documentation covers every option. */
bool config_option_at(size_t i, const char **section, const char **key);

/* Parse `path` on top of *cfg. On failure returns -1, leaves *cfg untouched
 * and writes to err one message with one line per problem ("kvnode.conf:12:
 * [memory] host_bytes: invalid size 'abc' (...)"), including syntax errors,
 * unknown sections/keys and an unopenable file ("<path>: cannot open: <strerror>").
 * A repeated key is not an error: the last one wins. Per-field ranges are
 * checked here; cross-field rules only in config_validate (overrides may
 * still change the outcome). */
int config_load_file(struct kvn_config *cfg, const char *path, char *err, size_t errlen);

/* Apply one "section.key=value" override (command line; blanks around the
 * parts are ignored). Same value checks; errors name the option
 * ("override memory.host_bytes: invalid size ..."). *cfg untouched on -1. */
int config_apply_override(struct kvn_config *cfg, const char *assignment, char *err, size_t errlen);

/* Every field's range again (for structs built by code) plus cross-field
 * checks: low_watermark < high_watermark, slab_bytes <= host_bytes, at most
 * 2^32-1 slabs, socket_path non-empty and shorter than sun_path (108 bytes
 * including the NUL); [persist]: path non-empty when backend = file, url
 * (http:// or https://) and socket_path non-empty when backend = v6d;
 * [kvcm] with enabled = on: every required field (endpoints, host_ip_port,
 * instance_group, instance_id, medium_hbm, medium_host, spec_name,
 * location_uri) non-empty, each missing one named on its own line, media
 * distinct, retry_base <= retry_max, batch_events <= queue_events (with
 * kvcm off its fields are only range-checked); [hbm]: low_watermark <
 * high_watermark, bytes 0 or at least memory.slab_bytes (at most 2^32-1
 * slabs), devices parses (config_hbm_devices).
 * 0, or -1 with one line per problem in err. */
int config_validate(const struct kvn_config *cfg, char *err, size_t errlen);

/* config_validate, then fill the parsed forms (allow_uid_list,
 * allow_gid_list, socket_gid, admin_listen_addr, hbm_device_list,
 * kvcm_endpoint_list) from their text options. 0, or -1 with err set as
 * config_validate sets it and *cfg untouched. */
int config_resolve(struct kvn_config *cfg, char *err, size_t errlen);

/* Write the effective configuration in kvnode.conf syntax, every option,
 * sizes and durations in the largest exact unit; the output parses back to
 * an identical struct. */
void config_write(const struct kvn_config *cfg, FILE *out);

/* Reload support: how many restart-only options differ between the running
 * and the next config (0: the whole change can be applied live); their
 * "section.key" names go comma-separated into buf (may be NULL). */
int config_restart_required(const struct kvn_config *running, const struct kvn_config *next,
                            char *buf, size_t buflen);
/* Copy every restart-only option of `running` into `next`, so a reload
 * leaves them as they run. */
void config_keep_restart_only(struct kvn_config *next, const struct kvn_config *running);
/* true for a known option that may change on reload, false otherwise. */
bool config_option_reloadable(const char *section, const char *key);

/* An [admin] listen address, parsed (struct config_listen above): "off";
 * "unix:PATH" (PATH non-empty and shorter than sun_path); or "HOST:PORT" with
 * HOST an IPv4 literal, "localhost", or a bracketed IPv6 literal
 * ("[::1]:9180"), and PORT 0..65535 (0: an ephemeral port chosen at bind
 * time). 0, or -1 with problem set. */
int config_parse_listen(const char *text, struct config_listen *out, char *problem, size_t len);

/* Helpers shared with kvnodectl-style parsing; 0 on success, -1 on bad input.
 * Grammar: DIGITS[UNIT] and nothing else -- no sign, no fraction ("1.5G" is
 * rejected: write 1536M), no space before the unit ("12 KiB" is rejected).
 * Sizes: no unit or B = bytes; K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB, P.., E..
 * are all binary (1K = 1024) and case-insensitive; overflow of 64 bits
 * (e.g. "20EiB") is rejected. Durations: ms, s, m, h (case-insensitive); a
 * bare number is milliseconds; the result must fit in 32 bits of ms. */
int config_parse_size(const char *text, uint64_t *out);      /* "1GiB", "512M", "4096" */
int config_parse_duration_ms(const char *text, uint32_t *out); /* "30s", "500ms", "2m", "100" (ms) */

/* Resolve an allow list ("alice, 1001 bob", names or numbers; groups when
 * `groups`) into ids. 0, or -1 with problem naming the bad entry. */
int config_parse_idlist(const char *text, int groups, uint32_t *ids, size_t max, size_t *n,
                        char *problem, size_t len);
/* Resolve a group name or number. 0, or -1 with problem set. */
int config_parse_group(const char *text, uint32_t *gid, char *problem, size_t len);

/* [hbm] devices: "all" (or empty) gives *n = 0 (every visible device);
 * otherwise distinct ordinals 0..CONFIG_HBM_DEVICES_MAX-1 separated by
 * commas and/or blanks. 0, or -1 with problem naming the bad entry. */
int config_hbm_devices(const char *text, int *out, size_t max, size_t *n, char *problem, size_t len);

/* ---- [kvcm] helpers (defined in kvcm/kvcm_config.c) ---- */

/* The wire name of a storage type: "ST_EVENT_REPORT_L1P5", "ST_EVENT_REPORT_L2"
 * ("" for a value out of range). */
const char *config_kvcm_storage_type_name(int storage_type);

/* Split [kvcm] endpoints into base URLs (commas and/or blanks separate them;
 * a trailing '/' is dropped, so "<url>/api/<rpc>" can be appended). Each is
 * http:// or https://, a host (name, IPv4 or [IPv6]), an optional :PORT
 * (1..65535) and an optional path; no URL twice; at most
 * CONFIG_KVCM_ENDPOINTS_MAX. 0 with *n set (0 for an empty list), or -1 when
 * the text is invalid or holds more than max URLs. */
int config_kvcm_endpoints(const struct kvn_config *cfg, char out[][CONFIG_URL_MAX], size_t max, size_t *n);

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
