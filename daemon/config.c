/* config: kvnode.conf parsing (libinih), overrides, defaults, validation.
 *
 * Every option is one row of config_options[]: name, type, field, range and
 * whether it can change on reload. Parsing, validation, config_write and the
 * reload check all walk that table, so they cannot disagree.
 *
 * No global state: each call works on caller-owned structs, and a load
 * parses into a scratch copy that replaces *cfg only when the whole file is
 * valid, so a reload can never leave a half-applied configuration. */
#include "config.h"
#include "kvs/kvs.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <grp.h>
#include <pwd.h>
#include <errno.h>
#include <sys/types.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <ini.h>

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

#define MS_PER_S UINT64_C(1000)
#define MS_PER_M (60 * MS_PER_S)
#define MS_PER_H (60 * MS_PER_M)

/* sun_path holds the socket path including its terminating NUL. */
#define SUN_PATH_SIZE sizeof(((struct sockaddr_un *)0)->sun_path)

#define PROBLEM_MAX 400   /* one "<problem>" text */
#define ERRLINE_MAX 640   /* one error line: location + option + problem */
#define VALUE_SHOW  80    /* longest value echoed back in a message ... */
#define SHOWN "%.83s"     /* ... plus "...": the format for it */

enum opt_type {
    OPT_PATH,       /* char[PATH_MAX], shorter than sun_path */
    OPT_MODE,       /* octal permission bits */
    OPT_SIZE,       /* bytes with optional binary suffix */
    OPT_COUNT,      /* plain unsigned integer */
    OPT_DURATION,   /* milliseconds with optional ms/s/m/h suffix */
    OPT_FRACTION,   /* double within (dmin, dmax) open/closed per flags */
    OPT_PIN,        /* CONFIG_PIN_* */
    OPT_LEVEL,      /* LOG_LEVEL_* */
    OPT_LISTEN,     /* char[CONFIG_LISTEN_MAX]: config_parse_listen */
    OPT_USERS,      /* char[CONFIG_IDLIST_MAX]: user names or uids, config_parse_idlist */
    OPT_GROUPS,     /* char[CONFIG_IDLIST_MAX]: group names or gids */
    OPT_GROUP,      /* char[CONFIG_NAME_MAX]: one group name or gid, or empty */
    OPT_ENUM,       /* int: index into names[] (case-insensitive) */
    OPT_DIR,        /* char[PATH_MAX], any path shorter than the field, or empty */
    OPT_URL,        /* char[CONFIG_URL_MAX], shorter than the field, or empty */
    OPT_TEXT,       /* char[]: a name without blanks or control characters (no '#'
                       when no_hash), shorter than the field, or empty */
    OPT_TEMPLATE,   /* char[]: like OPT_TEXT, with {placeholders} from the vars mask */
    OPT_HOSTPORT,   /* char[]: HOST:PORT naming this host uniquely, or empty */
    OPT_URLLIST,    /* char[]: up to CONFIG_KVCM_ENDPOINTS_MAX http(s) URLs, or empty */
    OPT_DEVICES,    /* char[CONFIG_IDLIST_MAX]: "all" or device ordinals, config_hbm_devices */
};

struct opt_def {
    const char *section;
    const char *key;
    enum opt_type type;
    size_t offset;      /* of the field in struct kvn_config */
    size_t width;       /* sizeof the field (integers: 4 or 8) */
    uint64_t min, max;  /* inclusive, for integer types */
    uint64_t multiple;  /* OPT_SIZE: value must be a multiple (0: any) */
    double dmin, dmax;  /* OPT_FRACTION bounds ... */
    bool dmin_open, dmax_open;  /* ... and whether each excludes its end */
    bool restart;       /* a change needs a restart; not applied on reload */
    bool empty_ok;      /* OPT_PATH: "" is accepted (config_validate decides when it is needed) */
    const char *const *names;   /* OPT_ENUM: the value i is spelled names[i] ... */
    int nnames;                 /* ... for 0 <= i < nnames */
    bool no_hash;       /* OPT_TEXT: '#' is refused (KVCM does not accept it there) */
    unsigned vars;      /* OPT_TEMPLATE: the KV_* placeholders allowed */
};

#define FIELD(f) .offset = offsetof(struct kvn_config, f), .width = sizeof(((struct kvn_config *)0)->f)
#define NAMES(a) .names = a, .nnames = (int)(sizeof a / sizeof a[0])

/* [persist] enumerations, spelled in the order of their values. */
static const char *const backend_names[] = { "off", "file", "v6d" };
static const char *const policy_names[] = { "write_through", "write_back", "off" };
static const char *const fsync_names[] = { "never", "batch", "always" };
static const char *const lookup_names[] = { "auto", "on", "off" };
_Static_assert(CONFIG_BACKEND_OFF == 0 && CONFIG_BACKEND_FILE == 1 && CONFIG_BACKEND_V6D == 2,
               "backend_names follows CONFIG_BACKEND_*");
_Static_assert(CONFIG_POLICY_WRITE_THROUGH == 0 && CONFIG_POLICY_WRITE_BACK == 1 && CONFIG_POLICY_OFF == 2,
               "policy_names follows CONFIG_POLICY_*");
_Static_assert(KVS_FSYNC_NEVER == 0 && KVS_FSYNC_BATCH == 1 && KVS_FSYNC_ALWAYS == 2,
               "fsync_names and persist_fsync follow KVS_FSYNC_*");
_Static_assert(CONFIG_LOOKUP_AUTO == 0 && CONFIG_LOOKUP_ON == 1 && CONFIG_LOOKUP_OFF == 2,
               "lookup_names follows CONFIG_LOOKUP_*");

/* [hbm] backend, spelled in the order of CONFIG_HBM_*. */
static const char *const hbm_backend_names[] = { "auto", "cuda", "sim", "none" };
_Static_assert(CONFIG_HBM_AUTO == 0 && CONFIG_HBM_CUDA == 1 && CONFIG_HBM_SIM == 2 && CONFIG_HBM_NONE == 3,
               "hbm_backend_names follows CONFIG_HBM_*");

/* [kvcm] enabled, [hbm] required. */
static const char *const onoff_names[] = { "off", "on" };
static const char *const storage_names[] = { "ST_EVENT_REPORT_L1P5", "ST_EVENT_REPORT_L2" };
_Static_assert(CONFIG_KVCM_STORAGE_L1P5 == 0 && CONFIG_KVCM_STORAGE_L2 == 1,
               "storage_names follows CONFIG_KVCM_STORAGE_*");

/* [kvcm] template placeholders: one bit each, in kvcm_placeholders[] order. */
enum {
    KV_MODEL = 1u << 0, KV_DTYPE = 1u << 1, KV_BLOCK_TOKENS = 1u << 2, KV_TP_SIZE = 1u << 3,
    KV_FINGERPRINT = 1u << 4, KV_HOST_IP_PORT = 1u << 5, KV_MEDIUM = 1u << 6, KV_BLOCK_BYTES = 1u << 7,
    KV_KEY = 1u << 8,
};
#define KV_DEPLOYMENT (KV_MODEL | KV_DTYPE | KV_BLOCK_TOKENS | KV_TP_SIZE | KV_FINGERPRINT)

static const struct opt_def config_options[] = {
    { "server", "socket_path", OPT_PATH, FIELD(socket_path), .restart = true },
    { "server", "socket_mode", OPT_MODE, FIELD(socket_mode), .min = 0, .max = 0777, .restart = true },
    { "server", "socket_group", OPT_GROUP, FIELD(socket_group), .restart = true },
    { "server", "allow_uids", OPT_USERS, FIELD(allow_uids) },
    { "server", "allow_gids", OPT_GROUPS, FIELD(allow_gids) },
    { "server", "max_frame_bytes", OPT_SIZE, FIELD(max_frame_bytes), .min = 4 * KIB, .max = GIB },
    { "server", "max_keys_per_request", OPT_COUNT, FIELD(max_keys_per_request), .min = 1, .max = 1048576 },
    { "server", "max_clients", OPT_COUNT, FIELD(max_clients), .min = 1, .max = 65536 },
    { "server", "max_namespaces", OPT_COUNT, FIELD(max_namespaces), .min = 1, .max = 65536, .restart = true },
    { "server", "request_timeout", OPT_DURATION, FIELD(request_timeout_ms), .min = 10, .max = 10 * MS_PER_M },
    { "server", "shutdown_timeout", OPT_DURATION, FIELD(shutdown_timeout_ms), .min = 0, .max = 10 * MS_PER_M },
    { "server", "frame_timeout", OPT_DURATION, FIELD(frame_timeout_ms), .min = 100, .max = 10 * MS_PER_M },
    { "server", "max_buffered_input_bytes", OPT_SIZE, FIELD(max_buffered_input_bytes), .min = MIB,
      .max = GIB << 10 },
    /* Above twice the idle workers' 1 s heartbeat, so an idle one is never taken for stalled. */
    { "server", "worker_stall_timeout", OPT_DURATION, FIELD(worker_stall_timeout_ms), .min = 2 * MS_PER_S,
      .max = 10 * MS_PER_M },

    { "memory", "host_bytes", OPT_SIZE, FIELD(host_bytes), .min = 64 * KIB, .max = UINT64_MAX, .restart = true },
    { "memory", "slab_bytes", OPT_SIZE, FIELD(slab_bytes), .min = 64 * KIB, .max = GIB, .multiple = 256,
      .restart = true },
    { "memory", "high_watermark", OPT_FRACTION, FIELD(high_watermark), .dmin = 0.0, .dmax = 1.0,
      .dmin_open = true },
    { "memory", "low_watermark", OPT_FRACTION, FIELD(low_watermark), .dmin = 0.0, .dmax = 1.0,
      .dmax_open = true },
    { "memory", "pin_host", OPT_PIN, FIELD(pin_host), .restart = true },
    { "memory", "namespace_quota", OPT_SIZE, FIELD(namespace_quota), .min = 0, .max = UINT64_MAX },
    /* Whole MiB, so every chunk starts and ends on a page boundary (4KiB to
     * 64KiB pages): cudaHostRegister cannot register one page twice. */
    { "memory", "pin_chunk_bytes", OPT_SIZE, FIELD(pin_chunk_bytes), .min = MIB, .max = GIB << 10,
      .multiple = MIB, .restart = true },

    /* [hbm]: the GPU tier. Its arenas and copy workers are set up once, at
     * start; only the demotion watermarks change live. */
    { "hbm", "backend", OPT_ENUM, FIELD(hbm_backend), NAMES(hbm_backend_names), .restart = true },
    { "hbm", "bytes", OPT_SIZE, FIELD(hbm_bytes), .min = 0, .max = UINT64_MAX, .restart = true },
    { "hbm", "devices", OPT_DEVICES, FIELD(hbm_devices), .restart = true },
    { "hbm", "high_watermark", OPT_FRACTION, FIELD(hbm_high_watermark), .dmin = 0.0, .dmax = 1.0,
      .dmin_open = true },
    { "hbm", "low_watermark", OPT_FRACTION, FIELD(hbm_low_watermark), .dmin = 0.0, .dmax = 1.0,
      .dmax_open = true },
    { "hbm", "required", OPT_ENUM, FIELD(hbm_required), NAMES(onoff_names), .restart = true },
    { "hbm", "copy_batch_bytes", OPT_SIZE, FIELD(hbm_copy_batch_bytes), .min = MIB, .max = 4 * GIB,
      .restart = true },

    { "leases", "read_ttl", OPT_DURATION, FIELD(read_lease_ttl_ms), .min = 10, .max = MS_PER_H },
    { "leases", "write_ttl", OPT_DURATION, FIELD(write_lease_ttl_ms), .min = 10, .max = MS_PER_H },
    { "leases", "reaper_interval", OPT_DURATION, FIELD(reaper_interval_ms), .min = 10, .max = MS_PER_M },
    { "leases", "max_per_client", OPT_COUNT, FIELD(max_leases_per_client), .min = 1, .max = 1048576 },
    { "leases", "max_reserved_per_client", OPT_FRACTION, FIELD(max_reserved_per_client), .dmin = 0.0,
      .dmax = 1.0, .dmin_open = true },

    { "log", "level", OPT_LEVEL, FIELD(log_level) },

    { "admin", "listen", OPT_LISTEN, FIELD(admin_listen), .restart = true },
    { "admin", "max_connections", OPT_COUNT, FIELD(admin_max_connections), .min = 1, .max = 4096 },
    { "admin", "request_timeout", OPT_DURATION, FIELD(admin_request_timeout_ms), .min = 100, .max = 10 * MS_PER_M },

    { "persist", "backend", OPT_ENUM, FIELD(persist_backend), NAMES(backend_names), .restart = true },
    { "persist", "policy", OPT_ENUM, FIELD(persist_policy), NAMES(policy_names) },
    { "persist", "path", OPT_DIR, FIELD(persist_path), .restart = true },
    { "persist", "capacity", OPT_SIZE, FIELD(persist_capacity), .min = 0, .max = UINT64_MAX, .restart = true },
    { "persist", "fsync", OPT_ENUM, FIELD(persist_fsync), NAMES(fsync_names), .restart = true },
    { "persist", "workers", OPT_COUNT, FIELD(persist_workers), .min = 1, .max = 32, .restart = true },
    { "persist", "queue", OPT_COUNT, FIELD(persist_queue), .min = 16, .max = 1048576, .restart = true },
    { "persist", "url", OPT_URL, FIELD(persist_url), .restart = true },
    { "persist", "socket_path", OPT_PATH, FIELD(persist_socket), .empty_ok = true, .restart = true },
    { "persist", "connect_timeout", OPT_DURATION, FIELD(persist_connect_timeout_ms), .min = 10,
      .max = MS_PER_M, .restart = true },
    { "persist", "timeout", OPT_DURATION, FIELD(persist_timeout_ms), .min = 10, .max = 10 * MS_PER_M,
      .restart = true },
    { "persist", "lookup", OPT_ENUM, FIELD(persist_lookup), NAMES(lookup_names), .restart = true },
    { "persist", "object_namespace", OPT_TEXT, FIELD(persist_object_namespace), .restart = true },
    { "persist", "tombstones", OPT_COUNT, FIELD(persist_tombstones), .min = 0, .max = 16777216,
      .restart = true },

    /* Every [kvcm] option is restart-only: the publisher, heartbeat and query
     * threads take their settings once, at start. */
    { "kvcm", "enabled", OPT_ENUM, FIELD(kvcm_enabled), NAMES(onoff_names), .restart = true },
    { "kvcm", "endpoints", OPT_URLLIST, FIELD(kvcm_endpoints), .restart = true },
    { "kvcm", "instance_group", OPT_TEXT, FIELD(kvcm_instance_group), .restart = true },
    { "kvcm", "instance_id", OPT_TEMPLATE, FIELD(kvcm_instance_id), .vars = KV_DEPLOYMENT, .restart = true },
    { "kvcm", "host_ip_port", OPT_HOSTPORT, FIELD(kvcm_host_ip_port), .restart = true },
    { "kvcm", "storage_type", OPT_ENUM, FIELD(kvcm_storage_type), NAMES(storage_names), .restart = true },
    { "kvcm", "medium_hbm", OPT_TEXT, FIELD(kvcm_medium_hbm), .no_hash = true, .restart = true },
    { "kvcm", "medium_host", OPT_TEXT, FIELD(kvcm_medium_host), .no_hash = true, .restart = true },
    { "kvcm", "spec_name", OPT_TEMPLATE, FIELD(kvcm_spec_name), .vars = KV_DEPLOYMENT | KV_BLOCK_BYTES,
      .restart = true },
    { "kvcm", "location_uri", OPT_TEMPLATE, FIELD(kvcm_location_uri),
      .vars = KV_HOST_IP_PORT | KV_MEDIUM | KV_BLOCK_BYTES | KV_KEY, .restart = true },
    { "kvcm", "request_timeout", OPT_DURATION, FIELD(kvcm_request_timeout_ms), .min = 10, .max = 10 * MS_PER_M,
      .restart = true },
    { "kvcm", "connect_timeout", OPT_DURATION, FIELD(kvcm_connect_timeout_ms), .min = 10, .max = MS_PER_M,
      .restart = true },
    { "kvcm", "snapshot_timeout", OPT_DURATION, FIELD(kvcm_snapshot_timeout_ms), .min = 10, .max = 10 * MS_PER_M,
      .restart = true },
    { "kvcm", "flush_interval", OPT_DURATION, FIELD(kvcm_flush_interval_ms), .min = 1, .max = 10 * MS_PER_S,
      .restart = true },
    { "kvcm", "batch_events", OPT_COUNT, FIELD(kvcm_batch_events), .min = 1, .max = 16384, .restart = true },
    { "kvcm", "queue_events", OPT_COUNT, FIELD(kvcm_queue_events), .min = 1, .max = 1048576, .restart = true },
    { "kvcm", "heartbeat_interval", OPT_DURATION, FIELD(kvcm_heartbeat_interval_ms), .min = 10, .max = MS_PER_M,
      .restart = true },
    { "kvcm", "retry_base", OPT_DURATION, FIELD(kvcm_retry_base_ms), .min = 1, .max = MS_PER_M, .restart = true },
    { "kvcm", "retry_max", OPT_DURATION, FIELD(kvcm_retry_max_ms), .min = 1, .max = MS_PER_H, .restart = true },
    { "kvcm", "snapshot_interval", OPT_DURATION, FIELD(kvcm_snapshot_interval_ms), .min = 100, .max = 24 * MS_PER_H,
      .restart = true },
    { "kvcm", "host_down_timeout", OPT_DURATION, FIELD(kvcm_host_down_timeout_ms), .min = 10, .max = MS_PER_M,
      .restart = true },
    { "kvcm", "stall_timeout", OPT_DURATION, FIELD(kvcm_stall_timeout_ms), .min = 100, .max = MS_PER_H,
      .restart = true },
    { "kvcm", "query_deadline", OPT_DURATION, FIELD(kvcm_query_deadline_ms), .min = 1, .max = 10 * MS_PER_S,
      .restart = true },
    { "kvcm", "query_max_hosts", OPT_COUNT, FIELD(kvcm_query_max_hosts), .min = 1, .max = 64, .restart = true },
    { "kvcm", "query_breaker_failures", OPT_COUNT, FIELD(kvcm_query_breaker_failures), .min = 1, .max = 1000,
      .restart = true },
    { "kvcm", "query_breaker_open", OPT_DURATION, FIELD(kvcm_query_breaker_open_ms), .min = 10,
      .max = 10 * MS_PER_M, .restart = true },
    { "kvcm", "query_negative_ttl", OPT_DURATION, FIELD(kvcm_query_negative_ttl_ms), .min = 1,
      .max = 10 * MS_PER_M, .restart = true },
};

#define CONFIG_NOPTIONS (sizeof config_options / sizeof config_options[0])

static const char *const config_sections[] = { "server", "memory", "hbm", "leases", "log", "admin", "persist",
                                               "kvcm" };
#define SECTIONS_HINT "[server], [memory], [hbm], [leases], [log], [admin], [persist] or [kvcm]"

/* Room for a NUL-terminated copy of any string field plus one byte, so a
 * field without a terminator (a struct built by code) loads as too long. */
#define VALUE_MAX (PATH_MAX + 1)

union opt_value {
    uint64_t u;
    double d;
    int i;
    const char *s;
};

void config_defaults(struct kvn_config *cfg)
{
    /* Zero everything first: the unused tail of socket_path stays NUL, so
     * two configs with equal settings compare equal byte for byte. */
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->socket_path, sizeof cfg->socket_path, "%s", "/run/kvnode/kvnode.sock");
    cfg->socket_mode = 0660;
    cfg->max_frame_bytes = 64 * MIB;
    cfg->max_keys_per_request = 4096;
    cfg->max_clients = 1024;
    cfg->max_namespaces = 256;
    cfg->request_timeout_ms = 5 * MS_PER_S;
    cfg->shutdown_timeout_ms = 10 * MS_PER_S;
    cfg->frame_timeout_ms = 10 * MS_PER_S;
    cfg->max_buffered_input_bytes = 256 * MIB;
    cfg->worker_stall_timeout_ms = 10 * MS_PER_S;

    cfg->host_bytes = GIB;
    cfg->slab_bytes = 16 * MIB;
    cfg->high_watermark = 0.95;
    cfg->low_watermark = 0.90;
    cfg->pin_host = CONFIG_PIN_AUTO;
    cfg->namespace_quota = 0;
    cfg->pin_chunk_bytes = GIB;

    /* [hbm]: no GPU memory unless the operator gives kvnode some. */
    cfg->hbm_backend = CONFIG_HBM_AUTO;
    cfg->hbm_bytes = 0;
    snprintf(cfg->hbm_devices, sizeof cfg->hbm_devices, "%s", "all");
    cfg->hbm_high_watermark = 0.90;
    cfg->hbm_low_watermark = 0.80;
    cfg->hbm_required = 0;
    cfg->hbm_copy_batch_bytes = 64 * MIB;

    cfg->read_lease_ttl_ms = 30 * MS_PER_S;
    cfg->write_lease_ttl_ms = 30 * MS_PER_S;
    cfg->reaper_interval_ms = 1 * MS_PER_S;
    cfg->max_leases_per_client = 1024;
    cfg->max_reserved_per_client = 0.25;

    cfg->log_level = LOG_LEVEL_INFO;

    snprintf(cfg->admin_listen, sizeof cfg->admin_listen, "%s", "127.0.0.1:9180");
    cfg->admin_max_connections = 64;
    cfg->admin_request_timeout_ms = 5 * MS_PER_S;

    cfg->persist_backend = CONFIG_BACKEND_FILE;
    cfg->persist_policy = CONFIG_POLICY_WRITE_THROUGH;
    snprintf(cfg->persist_path, sizeof cfg->persist_path, "%s", "/var/lib/kvnode");
    cfg->persist_capacity = 0;
    cfg->persist_fsync = KVS_FSYNC_BATCH;
    cfg->persist_workers = 2;
    cfg->persist_queue = 4096;
    /* persist_url, persist_socket: empty (zeroed above) */
    cfg->persist_connect_timeout_ms = 1 * MS_PER_S;
    cfg->persist_timeout_ms = 5 * MS_PER_S;
    cfg->persist_lookup = CONFIG_LOOKUP_AUTO;
    snprintf(cfg->persist_object_namespace, sizeof cfg->persist_object_namespace, "%s", "rtp_llm");
    cfg->persist_tombstones = 65536;

    /* [kvcm]: off; the timings are the reference publisher's (PROTOCOLS.md §2).
     * endpoints and host_ip_port have no default: zeroed above. */
    cfg->kvcm_enabled = 0;
    snprintf(cfg->kvcm_instance_group, sizeof cfg->kvcm_instance_group, "%s", "default");
    /* The fingerprint keeps deployments that differ only in their shape
     * (layers, heads, extra) apart: one instance id each. */
    snprintf(cfg->kvcm_instance_id, sizeof cfg->kvcm_instance_id, "%s", "{model}_{block_tokens}_{fingerprint}");
    cfg->kvcm_storage_type = CONFIG_KVCM_STORAGE_L1P5;
    snprintf(cfg->kvcm_medium_hbm, sizeof cfg->kvcm_medium_hbm, "%s", "hbm");
    snprintf(cfg->kvcm_medium_host, sizeof cfg->kvcm_medium_host, "%s", "dram");
    snprintf(cfg->kvcm_spec_name, sizeof cfg->kvcm_spec_name, "%s", "rtp_llm_hbm_{block_tokens}");
    snprintf(cfg->kvcm_location_uri, sizeof cfg->kvcm_location_uri, "%s",
             "rtp-llm://{host_ip_port}/{medium}?size={block_bytes}");
    cfg->kvcm_request_timeout_ms = 1500;
    cfg->kvcm_connect_timeout_ms = 500;
    cfg->kvcm_snapshot_timeout_ms = 30 * MS_PER_S;
    cfg->kvcm_flush_interval_ms = 20;
    cfg->kvcm_batch_events = 1000;
    cfg->kvcm_queue_events = 100000;
    cfg->kvcm_heartbeat_interval_ms = 1 * MS_PER_S;
    cfg->kvcm_retry_base_ms = 500;
    cfg->kvcm_retry_max_ms = 30 * MS_PER_S;
    cfg->kvcm_snapshot_interval_ms = 300 * MS_PER_S;
    cfg->kvcm_host_down_timeout_ms = 500;
    cfg->kvcm_stall_timeout_ms = 60 * MS_PER_S;
    cfg->kvcm_query_deadline_ms = 20;
    cfg->kvcm_query_max_hosts = 8;
    cfg->kvcm_query_breaker_failures = 5;
    cfg->kvcm_query_breaker_open_ms = 10 * MS_PER_S;
    cfg->kvcm_query_negative_ttl_ms = 1 * MS_PER_S;
}

/* ---- lookup ------------------------------------------------------------ */

static bool config_section_known(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof config_sections / sizeof config_sections[0]; i++)
        if (strlen(config_sections[i]) == len && memcmp(config_sections[i], name, len) == 0)
            return true;
    return false;
}

static const struct opt_def *config_find_option(const char *section, const char *key)
{
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++)
        if (strcmp(config_options[i].section, section) == 0 && strcmp(config_options[i].key, key) == 0)
            return &config_options[i];
    return NULL;
}

/* The section a misplaced key belongs to, for a "did you mean" hint. */
static const char *config_home_section(const char *key)
{
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++)
        if (strcmp(config_options[i].key, key) == 0)
            return config_options[i].section;
    return NULL;
}

static void config_unknown_key_problem(const char *key, char *buf, size_t len)
{
    const char *home = config_home_section(key);
    if (home)
        snprintf(buf, len, "unknown key (it belongs in [%s])", home);
    else
        snprintf(buf, len, "unknown key");
}

/* ---- scalar parsers ------------------------------------------------------ */

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

static void config_format_size(uint64_t v, char *buf, size_t len)
{
    static const char *const names[] = { "EiB", "PiB", "TiB", "GiB", "MiB", "KiB", "" };
    static const uint64_t factors[] = { GIB << 30, GIB << 20, GIB << 10, GIB, MIB, KIB, 1 };
    config_format_scaled(v, names, factors, 7, buf, len);
}

static void config_format_duration(uint64_t ms, char *buf, size_t len)
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
static void config_format_fraction(double d, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

/* A decimal number as strtod reads it, minus what it also accepts but a
 * fraction never is: "inf", "nan", hex floats, surrounding spaces. */
static int config_parse_fraction(const char *text, double *out)
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

static int config_parse_mode(const char *text, uint64_t *out)
{
    if (!*text || strspn(text, "01234567") != strlen(text) || strlen(text) > 6)
        return -1;
    *out = strtoull(text, NULL, 8);
    return 0;
}

static int config_parse_count(const char *text, uint64_t *out)
{
    uint64_t v;
    if (config_parse_scaled(text, (const struct unit[]){ { "", 1 }, { NULL, 0 } }, &v) < 0)
        return -1;
    *out = v;
    return 0;
}

static const char *const pin_names[] = { "auto", "on", "off" };

static int config_parse_enum(const struct opt_def *o, const char *text)
{
    for (int i = 0; i < o->nnames; i++)
        if (strcasecmp(text, o->names[i]) == 0)
            return i;
    return -1;
}

/* "expected a, b or c" */
static void config_enum_hint(const struct opt_def *o, char *buf, size_t len)
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

static int config_parse_pin(const char *text)
{
    for (int i = 0; i < 3; i++)
        if (strcasecmp(text, pin_names[i]) == 0)
            return i;
    return -1;
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
    for (;;) {
        p += strspn(p, ", \t");
        if (!*p)
            break;
        const char *start = p;
        p += strcspn(p, ", \t");
        size_t elen = (size_t)(p - start);
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

static const char *config_show(const char *text, char *buf, size_t len);

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

/* ---- [kvcm] values ------------------------------------------------------- */

/* Template placeholders, in KV_* bit order. */
static const struct {
    const char *name;
    unsigned bit;
} kvcm_placeholders[] = {
    { "model", KV_MODEL }, { "dtype", KV_DTYPE }, { "block_tokens", KV_BLOCK_TOKENS },
    { "tp_size", KV_TP_SIZE }, { "fingerprint", KV_FINGERPRINT }, { "host_ip_port", KV_HOST_IP_PORT },
    { "medium", KV_MEDIUM }, { "block_bytes", KV_BLOCK_BYTES }, { "key", KV_KEY },
};
#define KV_NPLACEHOLDERS (sizeof kvcm_placeholders / sizeof kvcm_placeholders[0])

#define HOSTPORT_HINT "expected HOST:PORT with a port 1..65535, e.g. 10.0.0.5:8088, node7.example:8088 " \
                      "or [fd00::5]:8088"
#define ENDPOINT_HINT "expected http://HOST:PORT or https://HOST:PORT, e.g. http://10.0.0.7:6382"

const char *config_kvcm_storage_type_name(int storage_type)
{
    if (storage_type < 0 || storage_type >= (int)(sizeof storage_names / sizeof storage_names[0]))
        return "";
    return storage_names[storage_type];
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

/* A name or template: no blanks or control characters (they could not be
 * written back into the file unchanged, and no KVCM name has them); '#'
 * refused where KVCM does not accept it. */
static int kvcm_check_name(const struct opt_def *o, const char *s, const char *shown, char *problem, size_t len)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
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

/* Every '{' opens a placeholder the option allows, closed by '}'; no stray '}'. */
static int kvcm_check_template(const struct opt_def *o, const char *t, char *problem, size_t len)
{
    char allowed[192];
    kvcm_placeholder_list(o->vars, allowed, sizeof allowed);
    for (const char *p = t; *p; p++) {
        if (*p == '}') {
            snprintf(problem, len, "invalid template '%.*s%s': '}' without '{' (%s may use %s)", VALUE_SHOW, t,
                     strlen(t) > VALUE_SHOW ? "..." : "", o->key, allowed);
            return -1;
        }
        if (*p != '{')
            continue;
        const char *end = p + 1 + strcspn(p + 1, "{}");
        if (*end != '}') {
            snprintf(problem, len, "invalid template '%.*s%s': '{' without '}' (%s may use %s)", VALUE_SHOW, t,
                     strlen(t) > VALUE_SHOW ? "..." : "", o->key, allowed);
            return -1;
        }
        size_t n = (size_t)(end - p - 1);
        int i = kvcm_placeholder(p + 1, n);
        if (i < 0 || !(o->vars & kvcm_placeholders[i].bit)) {
            snprintf(problem, len, "%s placeholder '{%.*s}' (%s may use %s)", i < 0 ? "unknown" : "unavailable",
                     (int)(n < 64 ? n : 64), p + 1, o->key, allowed);
            return -1;
        }
        p = end;
    }
    return 0;
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

static int kvcm_check_host_ip_port(const char *s, const char *shown, char *problem, size_t len)
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

/* True when the URL s[0..n) carries userinfo ("user:password@") in its
 * authority: after an optional "scheme://", before the first '/', '?' or
 * '#'. Such a URL is refused, not stored: /config, --check-config and error
 * messages print URLs, so a password in one would reach every reader. */
static bool config_url_has_credentials(const char *s, size_t n)
{
    const char *end = s + n;
    const char *sep = memmem(s, n, "://", 3);
    const char *auth = sep ? sep + 3 : s;
    for (const char *p = auth; p < end && *p != '/' && *p != '?' && *p != '#'; p++)
        if (*p == '@')
            return true;
    return false;
}

#define CREDENTIALS_HINT "not shown here; credentials in a URL would be printed by /config, --check-config " \
                         "and in logs"

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

/* Splits an endpoints list (see config_kvcm_endpoints); out may be NULL to
 * check only. problem (may be NULL) says what is wrong. */
static int kvcm_split_endpoints(const char *text, char (*out)[CONFIG_URL_MAX], size_t max, size_t *n,
                                char *problem, size_t len)
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
    *n = 0;
    for (;;) {
        p += strspn(p, ", \t");
        if (!*p)
            break;
        const char *start = p;
        p += strcspn(p, ", \t");
        size_t elen = (size_t)(p - start);
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
        if (out) {
            memcpy(out[count], start, ulen);
            out[count][ulen] = '\0';
        }
        count++;
    }
    *n = count;
    return 0;
}

int config_kvcm_endpoints(const struct kvn_config *cfg, char out[][CONFIG_URL_MAX], size_t max, size_t *n)
{
    *n = 0;
    size_t tlen = strnlen(cfg->kvcm_endpoints, sizeof cfg->kvcm_endpoints);
    if (tlen == sizeof cfg->kvcm_endpoints)
        return -1;   /* no terminator: a struct built by code */
    size_t got;
    if (kvcm_split_endpoints(cfg->kvcm_endpoints, out, max, &got, NULL, 0) < 0)
        return -1;
    *n = got;
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
        case KV_MODEL:        val = vars->model; break;
        case KV_DTYPE:        val = vars->dtype; break;
        case KV_BLOCK_TOKENS: snprintf(num, sizeof num, "%" PRIu32, vars->block_tokens); break;
        case KV_TP_SIZE:      snprintf(num, sizeof num, "%" PRIu32, vars->tp_size); break;
        case KV_FINGERPRINT:  snprintf(num, sizeof num, "%" PRIx64, vars->fingerprint); break;
        case KV_HOST_IP_PORT: val = vars->host_ip_port; break;
        case KV_MEDIUM:       val = vars->medium; break;
        case KV_BLOCK_BYTES:  snprintf(num, sizeof num, "%" PRIu64, vars->block_bytes); break;
        case KV_KEY:          snprintf(num, sizeof num, "%" PRId64, vars->key); break;
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

/* ---- per-option parse / check / store ------------------------------------ */

/* The value as the user typed it, cut to a sane length for a message. */
static const char *config_show(const char *text, char *buf, size_t len)
{
    size_t n = strlen(text);
    if (n <= VALUE_SHOW)
        return text;
    snprintf(buf, len, "%.*s...", VALUE_SHOW, text);
    return buf;
}

static void config_format_value(const struct opt_def *o, const union opt_value *v, char *buf, size_t len)
{
    switch (o->type) {
    case OPT_PATH:
    case OPT_LISTEN:
    case OPT_USERS:
    case OPT_GROUPS:
    case OPT_GROUP:
    case OPT_DIR:
    case OPT_URL:
    case OPT_TEXT:
    case OPT_TEMPLATE:
    case OPT_HOSTPORT:
    case OPT_URLLIST:
    case OPT_DEVICES:  snprintf(buf, len, "%s", v->s); break;
    case OPT_MODE:     snprintf(buf, len, "%04" PRIo64, v->u); break;
    case OPT_SIZE:     config_format_size(v->u, buf, len); break;
    case OPT_COUNT:    snprintf(buf, len, "%" PRIu64, v->u); break;
    case OPT_DURATION: config_format_duration(v->u, buf, len); break;
    case OPT_FRACTION: config_format_fraction(v->d, buf, len); break;
    case OPT_PIN:
        if (v->i >= 0 && v->i < 3)
            snprintf(buf, len, "%s", pin_names[v->i]);
        else
            snprintf(buf, len, "%d", v->i);
        break;
    case OPT_ENUM:
        if (v->i >= 0 && v->i < o->nnames)
            snprintf(buf, len, "%s", o->names[v->i]);
        else
            snprintf(buf, len, "%d", v->i);
        break;
    case OPT_LEVEL:
        if (v->i >= LOG_LEVEL_ERROR && v->i <= LOG_LEVEL_DEBUG)
            snprintf(buf, len, "%s", log_level_name(v->i));
        else
            snprintf(buf, len, "%d", v->i);
        break;
    }
}

static void config_fraction_range(const struct opt_def *o, char *buf, size_t len)
{
    char lo[32], hi[32];
    config_format_fraction(o->dmin, lo, sizeof lo);
    config_format_fraction(o->dmax, hi, sizeof hi);
    snprintf(buf, len, "%c%s, %s%c", o->dmin_open ? '(' : '[', lo, hi, o->dmax_open ? ')' : ']');
}

static void config_scaled_range(const struct opt_def *o, char *buf, size_t len)
{
    char lo[32], hi[32];
    if (o->type == OPT_SIZE) {
        config_format_size(o->min, lo, sizeof lo);
        config_format_size(o->max, hi, sizeof hi);
    } else {
        config_format_duration(o->min, lo, sizeof lo);
        config_format_duration(o->max, hi, sizeof hi);
    }
    if (o->max == UINT64_MAX)
        snprintf(buf, len, "at least %s", lo);
    else
        snprintf(buf, len, "%s..%s", lo, hi);
}

/* Range and shape checks on a parsed value. `shown` is the value as the user
 * wrote it, or NULL to format it (validating a struct built in code). */
static int config_check_value(const struct opt_def *o, const union opt_value *v, const char *shown,
                              char *problem, size_t len)
{
    char text[VALUE_MAX + 16], showbuf[VALUE_SHOW + 8], range[96];
    if (!shown) {
        config_format_value(o, v, text, sizeof text);
        shown = config_show(text, showbuf, sizeof showbuf);
    }
    switch (o->type) {
    case OPT_PATH: {
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
    case OPT_DIR: {
        size_t n = strlen(v->s);
        if (n >= o->width) {
            snprintf(problem, len, "path too long (%zu bytes; at most %zu)", n, o->width - 1);
            return -1;
        }
        return 0;
    }
    case OPT_URL: {
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
    case OPT_TEXT:
    case OPT_TEMPLATE:
    case OPT_HOSTPORT:
    case OPT_URLLIST: {
        size_t n = strlen(v->s);
        if (n >= o->width) {
            snprintf(problem, len, "value too long (%zu bytes; at most %zu)", n, o->width - 1);
            return -1;
        }
        if (n == 0)
            return 0;   /* config_validate decides when it is required */
        if (o->type == OPT_URLLIST)
            return kvcm_split_endpoints(v->s, NULL, CONFIG_KVCM_ENDPOINTS_MAX, &n, problem, len);
        if (o->type == OPT_HOSTPORT)
            return kvcm_check_host_ip_port(v->s, shown, problem, len);
        if (kvcm_check_name(o, v->s, shown, problem, len) < 0)
            return -1;
        return o->type == OPT_TEMPLATE ? kvcm_check_template(o, v->s, problem, len) : 0;
    }
    case OPT_DEVICES: {
        int devices[CONFIG_HBM_DEVICES_MAX];
        size_t n;
        if (strlen(v->s) >= o->width) {
            snprintf(problem, len, "list too long (at most %zu bytes)", o->width - 1);
            return -1;
        }
        return config_hbm_devices(v->s, devices, CONFIG_HBM_DEVICES_MAX, &n, problem, len);
    }
    case OPT_USERS:
    case OPT_GROUPS: {
        uint32_t ids[CONFIG_IDS_MAX];
        size_t n;
        if (strlen(v->s) >= o->width) {
            snprintf(problem, len, "list too long (at most %zu bytes)", o->width - 1);
            return -1;
        }
        return config_parse_idlist(v->s, o->type == OPT_GROUPS, ids, CONFIG_IDS_MAX, &n, problem, len);
    }
    case OPT_GROUP: {
        uint32_t gid;
        if (strlen(v->s) >= o->width) {
            snprintf(problem, len, "group name too long (at most %zu bytes)", o->width - 1);
            return -1;
        }
        return v->s[0] ? config_parse_group(v->s, &gid, problem, len) : 0;
    }
    case OPT_LISTEN: {
        struct config_listen l;
        if (strlen(v->s) >= o->width) {
            snprintf(problem, len, "invalid address '" SHOWN "' (too long)", shown);
            return -1;
        }
        return config_parse_listen(v->s, &l, problem, len);
    }
    case OPT_MODE:
        if (v->u > o->max) {
            snprintf(problem, len, "invalid mode '" SHOWN "' (expected octal permission bits up to 0777, e.g. 0660)",
                     shown);
            return -1;
        }
        return 0;
    case OPT_COUNT:
        if (v->u < o->min || v->u > o->max) {
            snprintf(problem, len, "invalid value '" SHOWN "' (expected an integer in %" PRIu64 "..%" PRIu64 ")",
                     shown, o->min, o->max);
            return -1;
        }
        return 0;
    case OPT_SIZE:
    case OPT_DURATION:
        if (v->u < o->min || v->u > o->max) {
            config_scaled_range(o, range, sizeof range);
            snprintf(problem, len, "%s '" SHOWN "' out of range (expected %s)",
                     o->type == OPT_SIZE ? "size" : "duration", shown, range);
            return -1;
        }
        if (o->multiple && v->u % o->multiple != 0) {
            snprintf(problem, len, "size '" SHOWN "' is not a multiple of %" PRIu64 " bytes", shown, o->multiple);
            return -1;
        }
        return 0;
    case OPT_FRACTION: {
        bool lo_ok = o->dmin_open ? v->d > o->dmin : v->d >= o->dmin;
        bool hi_ok = o->dmax_open ? v->d < o->dmax : v->d <= o->dmax;
        if (!isfinite(v->d) || !lo_ok || !hi_ok) {
            config_fraction_range(o, range, sizeof range);
            snprintf(problem, len, "invalid value '" SHOWN "' (expected a fraction in %s)", shown, range);
            return -1;
        }
        return 0;
    }
    case OPT_PIN:
        if (v->i < 0 || v->i > 2) {
            snprintf(problem, len, "invalid value '" SHOWN "' (expected auto, on or off)", shown);
            return -1;
        }
        return 0;
    case OPT_ENUM:
        if (v->i < 0 || v->i >= o->nnames) {
            config_enum_hint(o, range, sizeof range);
            snprintf(problem, len, "invalid value '" SHOWN "' (%s)", shown, range);
            return -1;
        }
        return 0;
    case OPT_LEVEL:
        if (v->i < LOG_LEVEL_ERROR || v->i > LOG_LEVEL_DEBUG) {
            snprintf(problem, len, "invalid value '" SHOWN "' (expected error, warn, info or debug)", shown);
            return -1;
        }
        return 0;
    }
    return 0;
}

/* Text -> value, then the same checks as config_validate. */
static int config_parse_value(const struct opt_def *o, const char *text, union opt_value *v, char *problem,
                              size_t len)
{
    char showbuf[VALUE_SHOW + 8];
    const char *shown = config_show(text, showbuf, sizeof showbuf);
    int rc;

    switch (o->type) {
    case OPT_PATH:
    case OPT_LISTEN:
    case OPT_USERS:
    case OPT_GROUPS:
    case OPT_GROUP:
    case OPT_DIR:
    case OPT_URL:
    case OPT_TEXT:
    case OPT_TEMPLATE:
    case OPT_HOSTPORT:
    case OPT_URLLIST:
    case OPT_DEVICES:
        v->s = text;
        break;
    case OPT_MODE:
        if (config_parse_mode(text, &v->u) < 0)
            v->u = UINT64_MAX;   /* reported by the range check */
        break;
    case OPT_COUNT:
        if (config_parse_count(text, &v->u) < 0) {
            snprintf(problem, len, "invalid value '" SHOWN "' (expected an integer in %" PRIu64 "..%" PRIu64 ")",
                     shown, o->min, o->max);
            return -1;
        }
        break;
    case OPT_SIZE:
        rc = config_parse_scaled(text, size_units, &v->u);
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
        break;
    case OPT_DURATION:
        rc = config_parse_scaled(text, duration_units, &v->u);
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
        break;
    case OPT_FRACTION:
        if (config_parse_fraction(text, &v->d) < 0)
            v->d = NAN;   /* reported by the range check */
        break;
    case OPT_PIN:
        v->i = config_parse_pin(text);
        break;
    case OPT_ENUM:
        v->i = config_parse_enum(o, text);
        break;
    case OPT_LEVEL:
        v->i = log_level_parse(text);
        break;
    }
    return config_check_value(o, v, shown, problem, len);
}

static void config_store(struct kvn_config *cfg, const struct opt_def *o, const union opt_value *v)
{
    char *field = (char *)cfg + o->offset;
    switch (o->type) {
    case OPT_PATH:
    case OPT_LISTEN:
    case OPT_USERS:
    case OPT_GROUPS:
    case OPT_GROUP:
    case OPT_DIR:
    case OPT_URL:
    case OPT_TEXT:
    case OPT_TEMPLATE:
    case OPT_HOSTPORT:
    case OPT_URLLIST:
    case OPT_DEVICES:
        /* Checked shorter than the field, so it fits; zero the tail so equal
         * configs stay byte-equal. */
        memset(field, 0, o->width);
        memcpy(field, v->s, strlen(v->s));
        break;
    case OPT_MODE:
    case OPT_SIZE:
    case OPT_COUNT:
    case OPT_DURATION:
        if (o->width == sizeof(uint64_t)) {
            uint64_t u = v->u;
            memcpy(field, &u, sizeof u);
        } else {
            uint32_t u = (uint32_t)v->u;   /* ranges keep 32-bit fields below 2^32 */
            memcpy(field, &u, sizeof u);
        }
        break;
    case OPT_FRACTION:
        memcpy(field, &v->d, sizeof v->d);
        break;
    case OPT_PIN:
    case OPT_ENUM:
    case OPT_LEVEL:
        memcpy(field, &v->i, sizeof v->i);
        break;
    }
}

/* path_buf (VALUE_MAX bytes) receives a NUL-terminated copy of a string
 * field. A field without a terminator (a struct built by code) comes out as
 * long as the field, which the checks then reject as too long. */
static void config_load(const struct kvn_config *cfg, const struct opt_def *o, union opt_value *v,
                        char *path_buf, size_t path_len)
{
    const char *field = (const char *)cfg + o->offset;
    switch (o->type) {
    case OPT_PATH:
    case OPT_LISTEN:
    case OPT_USERS:
    case OPT_GROUPS:
    case OPT_GROUP:
    case OPT_DIR:
    case OPT_URL:
    case OPT_TEXT:
    case OPT_TEMPLATE:
    case OPT_HOSTPORT:
    case OPT_URLLIST:
    case OPT_DEVICES: {
        size_t n = strnlen(field, o->width);
        if (n >= path_len)
            n = path_len - 1;
        memcpy(path_buf, field, n);
        path_buf[n] = '\0';
        v->s = path_buf;
        break;
    }
    case OPT_MODE:
    case OPT_SIZE:
    case OPT_COUNT:
    case OPT_DURATION:
        if (o->width == sizeof(uint64_t)) {
            memcpy(&v->u, field, sizeof v->u);
        } else {
            uint32_t u;
            memcpy(&u, field, sizeof u);
            v->u = u;
        }
        break;
    case OPT_FRACTION:
        memcpy(&v->d, field, sizeof v->d);
        break;
    case OPT_PIN:
    case OPT_ENUM:
    case OPT_LEVEL:
        memcpy(&v->i, field, sizeof v->i);
        break;
    }
}

static bool config_value_equal(const struct opt_def *o, const union opt_value *a, const union opt_value *b)
{
    switch (o->type) {
    case OPT_PATH:
    case OPT_LISTEN:
    case OPT_USERS:
    case OPT_GROUPS:
    case OPT_GROUP:
    case OPT_DIR:
    case OPT_URL:
    case OPT_TEXT:
    case OPT_TEMPLATE:
    case OPT_HOSTPORT:
    case OPT_URLLIST:
    case OPT_DEVICES:
        return strcmp(a->s, b->s) == 0;
    case OPT_FRACTION:
        return a->d == b->d;
    case OPT_PIN:
    case OPT_ENUM:
    case OPT_LEVEL:
        return a->i == b->i;
    case OPT_MODE:
    case OPT_SIZE:
    case OPT_COUNT:
    case OPT_DURATION:
        return a->u == b->u;
    }
    return false;
}

/* ---- error collection ---------------------------------------------------- */

/* Collects one error per line into the caller's buffer. Room for a final
 * "(N more errors not shown)" line is always kept free. */
struct errbuf {
    char *buf;
    size_t cap, len;
    unsigned count, dropped;
};

#define ERRBUF_RESERVE 40

static void errbuf_init(struct errbuf *eb, char *buf, size_t cap)
{
    *eb = (struct errbuf){ .buf = buf, .cap = buf ? cap : 0 };
    if (eb->cap)
        buf[0] = '\0';
}

__attribute__((format(printf, 2, 3)))
static void errbuf_add(struct errbuf *eb, const char *fmt, ...)
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

static void errbuf_finish(struct errbuf *eb)
{
    if (eb->dropped && eb->cap > eb->len)
        snprintf(eb->buf + eb->len, eb->cap - eb->len, "\n(%u more errors not shown)", eb->dropped);
}

/* ---- file parsing -------------------------------------------------------- */

struct parse_ctx {
    struct kvn_config *cfg;   /* scratch copy being filled */
    const char *path;
    unsigned lineno;          /* line inih is working on (counted by the reader) */
    struct errbuf *errors;
    FILE *file;
    char *line;               /* getline buffer */
    size_t line_cap;
    int read_errno;
};

/* Mirrors inih's scan for `chars` (ini.c find_chars_or_comment with its
 * default inline comment prefix ';'), so the syntax check below agrees with
 * what inih will do with the line. */
static const char *config_ini_scan(const char *s, const char *chars)
{
    bool was_space = false;
    while (*s && (!chars || !strchr(chars, *s)) && !(was_space && *s == ';')) {
        was_space = isspace((unsigned char)*s);
        s++;
    }
    return s;
}

/* Checks one line's shape and reports what inih would only count: syntax
 * errors, unknown sections, overlong lines. Returns the text to hand inih:
 * the line itself, a blank line (skip it), or a placeholder section that
 * makes the handler ignore the keys under a broken header. */
static const char *config_check_line(struct parse_ctx *pc, char *s, size_t maxlen)
{
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    if (n + 2 > maxlen) {   /* + newline + NUL, as fgets would store it */
        errbuf_add(pc->errors, "%s:%u: line too long (%zu characters; at most %zu)", pc->path, pc->lineno,
                   n, maxlen - 2);
        return "";
    }
    if (n == 0 || *s == ';' || *s == '#')
        return s;
    if (*s == '[') {
        const char *end = config_ini_scan(s + 1, "]");
        if (*end != ']') {
            errbuf_add(pc->errors, "%s:%u: syntax error: missing ']' in section header '%.*s'", pc->path,
                       pc->lineno, VALUE_SHOW, s);
            return "[!]";
        }
        const char *rest = end + 1;
        while (isspace((unsigned char)*rest))
            rest++;
        if (*rest && *rest != ';' && *rest != '#') {
            errbuf_add(pc->errors, "%s:%u: syntax error: unexpected text after section header '%.*s'",
                       pc->path, pc->lineno, VALUE_SHOW, s);
            return "[!]";
        }
        size_t len = (size_t)(end - (s + 1));
        if (!config_section_known(s + 1, len))
            errbuf_add(pc->errors, "%s:%u: [%.*s]: unknown section (expected " SECTIONS_HINT ")", pc->path,
                       pc->lineno, (int)(len < VALUE_SHOW ? len : VALUE_SHOW), s + 1);
        return s;
    }
    const char *sep = config_ini_scan(s, "=:");
    if (*sep != '=' && *sep != ':') {
        errbuf_add(pc->errors, "%s:%u: syntax error: expected 'key = value', '[section]' or a comment, got '%.*s'",
                   pc->path, pc->lineno, VALUE_SHOW, s);
        return "";
    }
    return s;
}

/* inih's fgets-style reader. Counting lines here gives the handler the line
 * number the packaged libinih (built without INI_HANDLER_LINENO) does not
 * pass. Leading blanks are stripped so inih never treats an indented line as
 * a multi-line continuation of the previous value. */
static char *config_read_line(char *str, int num, void *stream)
{
    struct parse_ctx *pc = stream;
    ssize_t n = getline(&pc->line, &pc->line_cap, pc->file);
    if (n < 0) {
        if (ferror(pc->file))
            pc->read_errno = errno ? errno : EIO;
        return NULL;
    }
    pc->lineno++;
    char *s = pc->line;
    /* A NUL would end the line for inih and drop the rest unseen. */
    const char *nul = memchr(s, '\0', (size_t)n);
    if (nul) {
        errbuf_add(pc->errors, "%s:%u: NUL byte in the line (byte %zu); kvnode.conf must be text", pc->path,
                   pc->lineno, (size_t)(nul - s) + 1);
        snprintf(str, (size_t)num, "\n");
        return str;
    }
    if (pc->lineno == 1 && (size_t)n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
        s += 3;   /* UTF-8 byte order mark */
    while (*s == ' ' || *s == '\t')
        s++;
    if (num < 8) {   /* inih never asks for this little; be safe anyway */
        str[0] = '\0';
        return str;
    }
    const char *text = config_check_line(pc, s, (size_t)num);
    snprintf(str, (size_t)num, "%s\n", text);
    return str;
}

static int config_handle_entry(void *user, const char *section, const char *name, const char *value)
{
    struct parse_ctx *pc = user;
    char problem[PROBLEM_MAX];

    if (!*section) {
        errbuf_add(pc->errors, "%s:%u: %s: key outside any section (expected under " SECTIONS_HINT ")",
                   pc->path, pc->lineno, name);
        return 1;
    }
    if (!config_section_known(section, strlen(section)))
        return 1;   /* the section header was reported once, at its line */

    const struct opt_def *o = config_find_option(section, name);
    if (!o) {
        config_unknown_key_problem(name, problem, sizeof problem);
        errbuf_add(pc->errors, "%s:%u: [%s] %s: %s", pc->path, pc->lineno, section, name, problem);
        return 1;
    }
    union opt_value v = { 0 };
    if (config_parse_value(o, value, &v, problem, sizeof problem) < 0) {
        /* inih treats '#' as a comment only at the start of a line. */
        bool hash = strstr(value, " #") || strstr(value, "\t#");
        errbuf_add(pc->errors, "%s:%u: [%s] %s: %s%s", pc->path, pc->lineno, section, name, problem,
                   hash ? "; note: '#' starts a comment only at the beginning of a line, use ';' after a value"
                        : "");
        return 1;
    }
    config_store(pc->cfg, o, &v);
    /* Always "success": errors are collected above; a 0 would only make
     * inih remember the first one. */
    return 1;
}

int config_load_file(struct kvn_config *cfg, const char *path, char *err, size_t errlen)
{
    struct errbuf errors;
    errbuf_init(&errors, err, errlen);

    FILE *f = fopen(path, "re");
    if (!f) {
        errbuf_add(&errors, "%s: cannot open: %s", path, strerror(errno));
        errbuf_finish(&errors);
        return -1;
    }
    struct kvn_config scratch = *cfg;
    struct parse_ctx pc = { .cfg = &scratch, .path = path, .errors = &errors, .file = f };
    int rc = ini_parse_stream(config_read_line, &pc, config_handle_entry, &pc);
    free(pc.line);
    fclose(f);

    if (pc.read_errno)
        errbuf_add(&errors, "%s: read error: %s", path, strerror(pc.read_errno));
    else if (rc == -2)
        errbuf_add(&errors, "%s: out of memory while parsing", path);
    else if (rc != 0 && errors.count == 0)
        /* inih saw a problem the line check let through; still report it. */
        errbuf_add(&errors, "%s:%d: syntax error", path, rc);

    if (errors.count) {
        errbuf_finish(&errors);
        return -1;
    }
    *cfg = scratch;
    return 0;
}

/* ---- overrides ----------------------------------------------------------- */

static void config_trim(const char **start, const char **end)
{
    while (*start < *end && isspace((unsigned char)**start))
        (*start)++;
    while (*end > *start && isspace((unsigned char)(*end)[-1]))
        (*end)--;
}

int config_apply_override(struct kvn_config *cfg, const char *assignment, char *err, size_t errlen)
{
    struct errbuf errors;
    errbuf_init(&errors, err, errlen);
    char problem[PROBLEM_MAX];
    const char *shown = assignment ? assignment : "";

    const char *eq = assignment ? strchr(assignment, '=') : NULL;
    const char *dot = eq ? memchr(assignment, '.', (size_t)(eq - assignment)) : NULL;
    if (!eq || !dot) {
        errbuf_add(&errors, "override '%.*s': expected SECTION.KEY=VALUE, e.g. memory.host_bytes=2GiB",
                   VALUE_SHOW, shown);
        goto fail;
    }
    const char *sec = assignment, *sec_end = dot;
    const char *key = dot + 1, *key_end = eq;
    const char *val = eq + 1, *val_end = eq + 1 + strlen(eq + 1);
    config_trim(&sec, &sec_end);
    config_trim(&key, &key_end);
    config_trim(&val, &val_end);

    char section[32], name[64], value[PATH_MAX];
    if (sec == sec_end || key == key_end) {
        errbuf_add(&errors, "override '%.*s': empty %s (expected SECTION.KEY=VALUE)", VALUE_SHOW, shown,
                   sec == sec_end ? "section" : "key");
        goto fail;
    }
    if ((size_t)(sec_end - sec) >= sizeof section || !config_section_known(sec, (size_t)(sec_end - sec))) {
        errbuf_add(&errors, "override '%.*s': unknown section [%.*s] (expected " SECTIONS_HINT ")", VALUE_SHOW,
                   shown, (int)(sec_end - sec), sec);
        goto fail;
    }
    memcpy(section, sec, (size_t)(sec_end - sec));
    section[sec_end - sec] = '\0';
    const struct opt_def *o = NULL;
    if ((size_t)(key_end - key) < sizeof name) {
        memcpy(name, key, (size_t)(key_end - key));
        name[key_end - key] = '\0';
        o = config_find_option(section, name);
    }
    if (!o) {
        if ((size_t)(key_end - key) < sizeof name)
            config_unknown_key_problem(name, problem, sizeof problem);
        else
            snprintf(problem, sizeof problem, "unknown key");
        errbuf_add(&errors, "override %s.%.*s: %s", section, (int)(key_end - key), key, problem);
        goto fail;
    }
    if ((size_t)(val_end - val) >= sizeof value) {
        errbuf_add(&errors, "override %s.%s: value too long", section, name);
        goto fail;
    }
    memcpy(value, val, (size_t)(val_end - val));
    value[val_end - val] = '\0';

    union opt_value v = { 0 };
    if (config_parse_value(o, value, &v, problem, sizeof problem) < 0) {
        errbuf_add(&errors, "override %s.%s: %s", section, name, problem);
        goto fail;
    }
    config_store(cfg, o, &v);
    return 0;

fail:
    errbuf_finish(&errors);
    return -1;
}

/* ---- validation, output, reload ------------------------------------------ */

int config_validate(const struct kvn_config *cfg, char *err, size_t errlen)
{
    struct errbuf errors;
    errbuf_init(&errors, err, errlen);
    char problem[PROBLEM_MAX], path[VALUE_MAX];

    /* Field checks again: a struct built or edited by code skipped the parser. */
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
        const struct opt_def *o = &config_options[i];
        union opt_value v = { 0 };
        config_load(cfg, o, &v, path, sizeof path);
        if (config_check_value(o, &v, NULL, problem, sizeof problem) < 0)
            errbuf_add(&errors, "[%s] %s: %s", o->section, o->key, problem);
    }

    if (!(cfg->low_watermark < cfg->high_watermark)) {
        char lo[32], hi[32];
        config_format_fraction(cfg->low_watermark, lo, sizeof lo);
        config_format_fraction(cfg->high_watermark, hi, sizeof hi);
        errbuf_add(&errors, "[memory] low_watermark: %s must be below high_watermark (%s)", lo, hi);
    }
    if (cfg->slab_bytes > cfg->host_bytes) {
        char slab[32], host[32];
        config_format_size(cfg->slab_bytes, slab, sizeof slab);
        config_format_size(cfg->host_bytes, host, sizeof host);
        errbuf_add(&errors, "[memory] slab_bytes: %s exceeds host_bytes (%s); the arena must hold at least one slab",
                   slab, host);
    } else if (cfg->slab_bytes > 0 && cfg->host_bytes / cfg->slab_bytes > UINT32_MAX) {
        /* The arena counts slabs in 32 bits. */
        errbuf_add(&errors, "[memory] host_bytes: more than %" PRIu32 " slabs of slab_bytes; raise slab_bytes",
                   UINT32_MAX);
    }

    /* [hbm]: like [memory]. bytes is rounded down to whole slabs, so a
     * non-zero size must hold at least one. */
    if (!(cfg->hbm_low_watermark < cfg->hbm_high_watermark)) {
        char lo[32], hi[32];
        config_format_fraction(cfg->hbm_low_watermark, lo, sizeof lo);
        config_format_fraction(cfg->hbm_high_watermark, hi, sizeof hi);
        errbuf_add(&errors, "[hbm] low_watermark: %s must be below high_watermark (%s)", lo, hi);
    }
    if (cfg->hbm_bytes > 0 && cfg->hbm_bytes < cfg->slab_bytes) {
        char hbm[32], slab[32];
        config_format_size(cfg->hbm_bytes, hbm, sizeof hbm);
        config_format_size(cfg->slab_bytes, slab, sizeof slab);
        errbuf_add(&errors, "[hbm] bytes: %s is less than [memory] slab_bytes (%s); each device's arena must "
                            "hold at least one slab (or set bytes = 0 for no HBM tier)", hbm, slab);
    } else if (cfg->slab_bytes > 0 && cfg->hbm_bytes / cfg->slab_bytes > UINT32_MAX) {
        errbuf_add(&errors, "[hbm] bytes: more than %" PRIu32 " slabs of [memory] slab_bytes; raise slab_bytes",
                   UINT32_MAX);
    }

    /* [persist]: what the configured backend needs. */
    if (cfg->persist_backend == CONFIG_BACKEND_FILE && cfg->persist_path[0] == '\0')
        errbuf_add(&errors, "[persist] path: required when backend = file (the directory the blocks are "
                            "stored under)");
    if (cfg->persist_backend == CONFIG_BACKEND_V6D) {
        size_t n = strnlen(cfg->persist_url, sizeof cfg->persist_url);
        const char *url = cfg->persist_url;
        size_t scheme = strncasecmp(url, "http://", 7) == 0 ? 7 : strncasecmp(url, "https://", 8) == 0 ? 8 : 0;
        if (n == 0)
            errbuf_add(&errors, "[persist] url: required when backend = v6d (the store's control-plane "
                                "URL, e.g. http://127.0.0.1:8080)");
        else if (n < sizeof cfg->persist_url && !config_url_has_credentials(url, n) &&
                 (scheme == 0 || url[scheme] == '\0' || url[scheme] == '/'))
            errbuf_add(&errors, "[persist] url: invalid URL '%.*s%s' (backend = v6d needs http://HOST[:PORT] "
                                "or https://HOST[:PORT], optionally with a path)",
                       VALUE_SHOW, url, n > VALUE_SHOW ? "..." : "");
        if (cfg->persist_socket[0] == '\0')
            errbuf_add(&errors, "[persist] socket_path: required when backend = v6d (the store's data-plane "
                                "unix socket)");
        if (cfg->persist_object_namespace[0] == '\0')
            errbuf_add(&errors, "[persist] object_namespace: required when backend = v6d (the first part of "
                                "every object key; rtp-llm engines use rtp_llm)");
    }

    /* [kvcm]: with enabled = on, every missing field gets its own line, so
     * one failed start names all of them. Off: nothing is required. */
    if (cfg->kvcm_enabled == 1) {
        static const struct {
            size_t offset;
            const char *key, *what;
        } required[] = {
            { offsetof(struct kvn_config, kvcm_endpoints), "endpoints",
              "the KVCM servers' base URLs, e.g. http://kvcm-0:6382, http://kvcm-1:6382" },
            { offsetof(struct kvn_config, kvcm_host_ip_port), "host_ip_port",
              "HOST:PORT naming this daemon to KVCM, unique per daemon: daemons sharing one overwrite "
              "each other's blocks" },
            { offsetof(struct kvn_config, kvcm_instance_group), "instance_group", "e.g. default" },
            { offsetof(struct kvn_config, kvcm_instance_id), "instance_id", "a template, e.g. {model}_{block_tokens}" },
            { offsetof(struct kvn_config, kvcm_medium_hbm), "medium_hbm", "the GPU tier's medium name, e.g. hbm" },
            { offsetof(struct kvn_config, kvcm_medium_host), "medium_host",
              "the host-memory tier's medium name, e.g. dram" },
            { offsetof(struct kvn_config, kvcm_spec_name), "spec_name", "a template, e.g. rtp_llm_hbm_{block_tokens}" },
            { offsetof(struct kvn_config, kvcm_location_uri), "location_uri",
              "a template, e.g. rtp-llm://{host_ip_port}/hbm?size={block_bytes}" },
        };
        for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
            if (((const char *)cfg)[required[i].offset] == '\0')
                errbuf_add(&errors, "[kvcm] %s: required when enabled = on (%s)", required[i].key, required[i].what);
        if (cfg->kvcm_medium_hbm[0] &&
            strncmp(cfg->kvcm_medium_hbm, cfg->kvcm_medium_host, sizeof cfg->kvcm_medium_hbm) == 0)
            errbuf_add(&errors, "[kvcm] medium_host: '%.*s' is also medium_hbm; the two tiers need different "
                                "medium names", CONFIG_KVCM_MEDIUM_MAX - 1, cfg->kvcm_medium_host);
        if (cfg->kvcm_retry_base_ms > cfg->kvcm_retry_max_ms) {
            char base[32], max[32];
            config_format_duration(cfg->kvcm_retry_base_ms, base, sizeof base);
            config_format_duration(cfg->kvcm_retry_max_ms, max, sizeof max);
            errbuf_add(&errors, "[kvcm] retry_base: %s exceeds retry_max (%s)", base, max);
        }
        if (cfg->kvcm_batch_events > cfg->kvcm_queue_events)
            errbuf_add(&errors, "[kvcm] batch_events: %" PRIu32 " exceeds queue_events (%" PRIu32 ")",
                       cfg->kvcm_batch_events, cfg->kvcm_queue_events);
    }

    if (errors.count) {
        errbuf_finish(&errors);
        return -1;
    }
    return 0;
}

void config_write(const struct kvn_config *cfg, FILE *out)
{
    const char *section = NULL;
    char text[VALUE_MAX + 16], path[VALUE_MAX];
    fprintf(out, "# kvnoded effective configuration; see kvnode.conf(5)\n");
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
        const struct opt_def *o = &config_options[i];
        if (!section || strcmp(section, o->section) != 0) {
            section = o->section;
            fprintf(out, "\n[%s]\n", section);
        }
        union opt_value v = { 0 };
        config_load(cfg, o, &v, path, sizeof path);
        config_format_value(o, &v, text, sizeof text);
        fprintf(out, "%s = %s\n", o->key, text);
    }
}

int config_restart_required(const struct kvn_config *running, const struct kvn_config *next, char *buf,
                            size_t buflen)
{
    int changed = 0;
    size_t used = 0;
    char a[VALUE_MAX], b[VALUE_MAX];
    if (buf && buflen)
        buf[0] = '\0';
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
        const struct opt_def *o = &config_options[i];
        if (!o->restart)
            continue;
        union opt_value va = { 0 }, vb = { 0 };
        config_load(running, o, &va, a, sizeof a);
        config_load(next, o, &vb, b, sizeof b);
        if (config_value_equal(o, &va, &vb))
            continue;
        changed++;
        if (buf && used < buflen) {
            int n = snprintf(buf + used, buflen - used, "%s%s.%s", used ? ", " : "", o->section, o->key);
            if (n > 0)
                used += (size_t)n;
        }
    }
    return changed;
}

void config_keep_restart_only(struct kvn_config *next, const struct kvn_config *running)
{
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
        const struct opt_def *o = &config_options[i];
        if (o->restart)
            memcpy((char *)next + o->offset, (const char *)running + o->offset, o->width);
    }
}

bool config_option_reloadable(const char *section, const char *key)
{
    const struct opt_def *o = config_find_option(section, key);
    return o && !o->restart;
}
