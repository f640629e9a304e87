/* config: kvnode.conf parsing (libinih), overrides, defaults, validation.
 *
 * Every option is one row of config_options[]: name, type, default, field,
 * range and whether it can change on reload. Each type is one small table
 * of functions (struct opt_type: parse, check, store, load, format, equal;
 * config_types.c), built on the value parsers of config_values.c.
 * Defaults, parsing, validation, config_write and the reload check all walk
 * the option table through those, so they cannot disagree, and a new option
 * is one row (plus its field, conf/kvnode.conf and kvnode.conf(5)).
 *
 * List and address options (allow lists, socket_group, [admin] listen,
 * [hbm] devices, [kvcm] endpoints) are stored twice: the text as written,
 * and the parsed form the modules use, which config_resolve fills once the
 * whole configuration is known (their check step computes it).
 *
 * The [kvcm] option checks live next to the KVCM code, in
 * kvcm_config.c; the rows here name them.
 *
 * No global state: each call works on caller-owned structs, and a load
 * parses into a scratch copy that replaces *cfg only when the whole file is
 * valid, so a reload can never leave a half-applied configuration. */
#include "config/config.h"
#include "config/config_types.h"
#include "config/kvcm_config.h"
#include "core/hostport.h"
#include "core/log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#define FIELD(f) .offset = offsetof(struct kvn_config, f), .width = sizeof(((struct kvn_config *)0)->f)
#define PARSED(f) .parsed_offset = offsetof(struct kvn_config, f), \
                  .parsed_width = sizeof(((struct kvn_config *)0)->f)
#define NAMES(a) .names = a, .nnames = (int)(sizeof a / sizeof a[0])

/* [persist] enumerations, spelled in the order of their values. */
static const char *const backend_names[] = { "off", "file", "v6d", "redis" };
static const char *const policy_names[] = { "write_through", "write_back", "off" };
static const char *const fsync_names[] = { "never", "batch", "always" };
static const char *const lookup_names[] = { "auto", "on", "off" };
static const char *const direct_io_names[] = { "auto", "on", "off" };
_Static_assert(CONFIG_BACKEND_OFF == 0 && CONFIG_BACKEND_FILE == 1 && CONFIG_BACKEND_V6D == 2 &&
               CONFIG_BACKEND_REDIS == 3,
               "backend_names follows CONFIG_BACKEND_*");
_Static_assert(CONFIG_POLICY_WRITE_THROUGH == 0 && CONFIG_POLICY_WRITE_BACK == 1 && CONFIG_POLICY_OFF == 2,
               "policy_names follows CONFIG_POLICY_*");
_Static_assert(CONFIG_FSYNC_NEVER == 0 && CONFIG_FSYNC_BATCH == 1 && CONFIG_FSYNC_ALWAYS == 2,
               "fsync_names and persist_fsync follow CONFIG_FSYNC_*");
_Static_assert(CONFIG_DIRECT_AUTO == 0 && CONFIG_DIRECT_ON == 1 && CONFIG_DIRECT_OFF == 2,
               "direct_io_names and persist_direct_io follow CONFIG_DIRECT_*");
_Static_assert(CONFIG_LOOKUP_AUTO == 0 && CONFIG_LOOKUP_ON == 1 && CONFIG_LOOKUP_OFF == 2,
               "lookup_names follows CONFIG_LOOKUP_*");

/* [memory] pin_host, spelled in the order of CONFIG_PIN_*. */
static const char *const pin_names[] = { "auto", "on", "off" };
static const char *const huge_pages_names[] = { "off", "auto", "on" };
/* [memory] numa, spelled in the order of CONFIG_NUMA_*. */
static const char *const numa_names[] = { "auto", "off" };
_Static_assert(CONFIG_NUMA_AUTO == 0 && CONFIG_NUMA_OFF == 1, "numa_names follows CONFIG_NUMA_*");
_Static_assert(CONFIG_PIN_AUTO == 0 && CONFIG_PIN_ON == 1 && CONFIG_PIN_OFF == 2, "pin_names follows CONFIG_PIN_*");

/* [hbm] backend, spelled in the order of CONFIG_HBM_*. */
static const char *const hbm_backend_names[] = { "auto", "cuda", "sim", "none" };
_Static_assert(CONFIG_HBM_AUTO == 0 && CONFIG_HBM_CUDA == 1 && CONFIG_HBM_SIM == 2 && CONFIG_HBM_NONE == 3,
               "hbm_backend_names follows CONFIG_HBM_*");

/* [kvcm] enabled, [hbm] required. */
static const char *const onoff_names[] = { "off", "on" };

static const struct opt_def config_options[] = {
    { "server", "socket_path", &T_PATH, "/run/kvnode/kvnode.sock", FIELD(socket_path), .restart = true },
    { "server", "socket_mode", &T_MODE, "0660", FIELD(socket_mode), .min = 0, .max = 0777, .restart = true },
    { "server", "socket_group", &T_GROUP, "", FIELD(socket_group), PARSED(socket_gid), .restart = true },
    { "server", "allow_uids", &T_USERS, "", FIELD(allow_uids), PARSED(allow_uid_list) },
    { "server", "allow_gids", &T_GROUPS, "", FIELD(allow_gids), PARSED(allow_gid_list) },
    { "server", "max_frame_bytes", &T_SIZE, "64MiB", FIELD(max_frame_bytes), .min = 4 * KIB, .max = GIB },
    { "server", "max_keys_per_request", &T_COUNT, "4096", FIELD(max_keys_per_request), .min = 1, .max = 1048576 },
    { "server", "max_clients", &T_COUNT, "1024", FIELD(max_clients), .min = CONFIG_MAX_CLIENTS_MIN,
      .max = CONFIG_MAX_CLIENTS_MAX },
    { "server", "max_namespaces", &T_COUNT, "256", FIELD(max_namespaces), .min = CONFIG_MAX_NAMESPACES_MIN,
      .max = CONFIG_MAX_NAMESPACES_MAX, .restart = true },
    { "server", "request_timeout", &T_DURATION, "5s", FIELD(request_timeout_ms), .min = 10, .max = 10 * MS_PER_M },
    { "server", "shutdown_timeout", &T_DURATION, "10s", FIELD(shutdown_timeout_ms), .min = 0, .max = 10 * MS_PER_M },
    { "server", "frame_timeout", &T_DURATION, "10s", FIELD(frame_timeout_ms), .min = 100, .max = 10 * MS_PER_M },
    { "server", "max_buffered_input_bytes", &T_SIZE, "256MiB", FIELD(max_buffered_input_bytes), .min = MIB,
      .max = GIB << 10 },
    /* Reloadable: a connection's deadline is set at accept, from the value then. */
    { "server", "hello_timeout", &T_DURATION, "5s", FIELD(hello_timeout_ms), .min = 100, .max = 10 * MS_PER_M },
    { "server", "max_buffered_output_bytes", &T_SIZE, "1GiB", FIELD(max_buffered_output_bytes), .min = MIB,
      .max = GIB << 10 },
    /* Above twice the idle workers' 1 s heartbeat, so an idle one is never taken for stalled. */
    { "server", "worker_stall_timeout", &T_DURATION, "10s", FIELD(worker_stall_timeout_ms), .min = 2 * MS_PER_S,
      .max = 10 * MS_PER_M },

    { "memory", "host_bytes", &T_SIZE, "1GiB", FIELD(host_bytes), .min = 64 * KIB, .max = UINT64_MAX,
      .restart = true },
    { "memory", "slab_bytes", &T_SIZE, "16MiB", FIELD(slab_bytes), .min = 64 * KIB, .max = GIB, .multiple = 256,
      .restart = true },
    { "memory", "high_watermark", &T_FRACTION, "0.95", FIELD(high_watermark), .dmin = 0.0, .dmax = 1.0,
      .dmin_open = true },
    { "memory", "low_watermark", &T_FRACTION, "0.9", FIELD(low_watermark), .dmin = 0.0, .dmax = 1.0,
      .dmax_open = true },
    { "memory", "pin_host", &T_ENUM, "auto", FIELD(pin_host), NAMES(pin_names), .restart = true },
    /* Restart-only: the arena's memfd is created once, at start. */
    { "memory", "huge_pages", &T_ENUM, "auto", FIELD(huge_pages), NAMES(huge_pages_names), .restart = true },
    { "memory", "numa", &T_ENUM, "auto", FIELD(numa), NAMES(numa_names), .restart = true },
    { "memory", "namespace_quota", &T_SIZE, "0", FIELD(namespace_quota), .min = 0, .max = UINT64_MAX },
    /* Whole MiB, so every chunk starts and ends on a page boundary (4KiB to
     * 64KiB pages): cudaHostRegister cannot register one page twice. */
    { "memory", "pin_chunk_bytes", &T_SIZE, "1GiB", FIELD(pin_chunk_bytes), .min = MIB, .max = GIB << 10,
      .multiple = MIB, .restart = true },

    /* [hbm]: the GPU tier, no GPU memory unless the operator gives kvnode
     * some. Its arenas and copy workers are set up once, at start; only the
     * demotion watermarks and the stop's release_timeout change live. */
    { "hbm", "backend", &T_ENUM, "auto", FIELD(hbm_backend), NAMES(hbm_backend_names), .restart = true },
    { "hbm", "bytes", &T_SIZE, "0", FIELD(hbm_bytes), .min = 0, .max = UINT64_MAX, .restart = true },
    { "hbm", "devices", &T_DEVICES, "all", FIELD(hbm_devices), PARSED(hbm_device_list), .restart = true },
    { "hbm", "high_watermark", &T_FRACTION, "0.9", FIELD(hbm_high_watermark), .dmin = 0.0, .dmax = 1.0,
      .dmin_open = true },
    { "hbm", "low_watermark", &T_FRACTION, "0.8", FIELD(hbm_low_watermark), .dmin = 0.0, .dmax = 1.0,
      .dmax_open = true },
    { "hbm", "required", &T_ENUM, "off", FIELD(hbm_required), NAMES(onoff_names), .restart = true },
    { "hbm", "copy_batch_bytes", &T_SIZE, "64MiB", FIELD(hbm_copy_batch_bytes), .min = MIB, .max = 4 * GIB,
      .restart = true },
    { "hbm", "release_timeout", &T_DURATION, "5s", FIELD(hbm_release_timeout_ms), .min = 0, .max = 10 * MS_PER_M },
    /* Engines of a daemon that just stopped may still map its HBM: a restart waits for it. */
    { "hbm", "alloc_retry", &T_DURATION, "10s", FIELD(hbm_alloc_retry_ms), .min = 0, .max = 10 * MS_PER_M,
      .restart = true },

    { "leases", "read_ttl", &T_DURATION, "30s", FIELD(read_lease_ttl_ms), .min = 10, .max = MS_PER_H },
    { "leases", "write_ttl", &T_DURATION, "30s", FIELD(write_lease_ttl_ms), .min = 10, .max = MS_PER_H },
    { "leases", "reaper_interval", &T_DURATION, "1s", FIELD(reaper_interval_ms), .min = 10, .max = MS_PER_M },
    { "leases", "max_per_client", &T_COUNT, "1024", FIELD(max_leases_per_client), .min = 1, .max = 1048576 },
    { "leases", "max_reserved_per_client", &T_FRACTION, "0.25", FIELD(max_reserved_per_client),
      CONFIG_MAX_RESERVED_RANGE },

    { "log", "level", &T_LEVEL, "info", FIELD(log_level) },

    { "admin", "listen", &T_LISTEN, "127.0.0.1:9180", FIELD(admin_listen), PARSED(admin_listen_addr),
      .restart = true },
    { "admin", "max_connections", &T_COUNT, "64", FIELD(admin_max_connections), .min = 1, .max = 4096 },
    { "admin", "request_timeout", &T_DURATION, "5s", FIELD(admin_request_timeout_ms), .min = 100,
      .max = 10 * MS_PER_M },

    { "persist", "backend", &T_ENUM, "file", FIELD(persist_backend), NAMES(backend_names), .restart = true },
    { "persist", "policy", &T_ENUM, "write_through", FIELD(persist_policy), NAMES(policy_names) },
    { "persist", "path", &T_DIR, "/var/lib/kvnode", FIELD(persist_path), .restart = true },
    { "persist", "capacity", &T_SIZE, "0", FIELD(persist_capacity), .min = 0, .max = UINT64_MAX, .restart = true },
    { "persist", "fsync", &T_ENUM, "batch", FIELD(persist_fsync), NAMES(fsync_names), .restart = true },
    { "persist", "segment_bytes", &T_SIZE, "256MiB", FIELD(persist_segment_bytes), .min = 1 << 20,
      .max = UINT64_C(1) << 40, .restart = true },
    { "persist", "direct_io", &T_ENUM, "auto", FIELD(persist_direct_io), NAMES(direct_io_names), .restart = true },
    { "persist", "workers", &T_COUNT, "2", FIELD(persist_workers), .min = 1, .max = 32, .restart = true },
    { "persist", "queue", &T_COUNT, "4096", FIELD(persist_queue), .min = 16, .max = 1048576, .restart = true },
    { "persist", "url", &T_URL, "", FIELD(persist_url), .restart = true },
    { "persist", "socket_path", &T_PATH, "", FIELD(persist_socket), .empty_ok = true, .restart = true },
    { "persist", "connect_timeout", &T_DURATION, "1s", FIELD(persist_connect_timeout_ms), .min = 10,
      .max = MS_PER_M, .restart = true },
    { "persist", "timeout", &T_DURATION, "5s", FIELD(persist_timeout_ms), .min = 10, .max = 10 * MS_PER_M,
      .restart = true },
    { "persist", "lookup", &T_ENUM, "auto", FIELD(persist_lookup), NAMES(lookup_names), .restart = true },
    /* Reloadable: the cache reads it at each MATCH/GET, the misses it holds
     * keep their age, so a new value applies to them at once. */
    { "persist", "lookup_negative_ttl", &T_DURATION, "1s", FIELD(persist_lookup_negative_ttl_ms), .min = 0,
      .max = MS_PER_H },
    { "persist", "object_namespace", &T_TEXT, "rtp_llm", FIELD(persist_object_namespace), .restart = true },
    { "persist", "tombstones", &T_COUNT, "65536", FIELD(persist_tombstones), .min = 0, .max = 16777216,
      .restart = true },
    { "persist", "nodes", &T_TEXT, "", FIELD(persist_nodes), .restart = true },
    { "persist", "user", &T_TEXT, "", FIELD(persist_user), .restart = true },
    { "persist", "password_file", &T_PATH, "", FIELD(persist_password_file), .empty_ok = true,
      .restart = true },

    /* [kvs_server]: rtp-llm's KVS protocol served (issue 18); off by default,
     * restart-only (the listeners are set up once, at start). */
    { "kvs_server", "enabled", &T_ENUM, "off", FIELD(kvs_enabled), NAMES(onoff_names), .restart = true },
    { "kvs_server", "listen", &T_LISTEN, "127.0.0.1:8080", FIELD(kvs_listen), PARSED(kvs_listen_addr),
      .restart = true },
    { "kvs_server", "socket_path", &T_PATH, "/run/kvnode/kvs.sock", FIELD(kvs_socket_path), .restart = true },
    { "kvs_server", "max_body_bytes", &T_SIZE, "16MiB", FIELD(kvs_max_body_bytes), .min = 4 * KIB, .max = GIB,
      .restart = true },
    { "kvs_server", "max_keys", &T_COUNT, "65536", FIELD(kvs_max_keys), .min = 1, .max = 1048576, .restart = true },
    { "kvs_server", "max_leases", &T_COUNT, "4096", FIELD(kvs_max_leases), .min = 1, .max = 1048576,
      .restart = true },
    { "kvs_server", "default_term", &T_DURATION, "60s", FIELD(kvs_default_term_ms), .min = MS_PER_S,
      .max = MS_PER_H, .restart = true },
    { "kvs_server", "max_term", &T_DURATION, "10m", FIELD(kvs_max_term_ms), .min = MS_PER_S, .max = MS_PER_H,
      .restart = true },
    { "kvs_server", "tp_size", &T_COUNT, "1", FIELD(kvs_tp_size), .min = 1, .max = 1024, .restart = true },
    { "kvs_server", "max_connections", &T_COUNT, "1024", FIELD(kvs_max_connections), .min = 1, .max = 65536 },
    { "kvs_server", "request_timeout", &T_DURATION, "10s", FIELD(kvs_request_timeout_ms), .min = 100,
      .max = MS_PER_H },
    { "kvs_server", "max_output_bytes", &T_SIZE, "32MiB", FIELD(kvs_max_output_bytes), .min = 64 * KIB,
      .max = 4 * GIB },
    { "kvs_server", "max_output_total_bytes", &T_SIZE, "256MiB", FIELD(kvs_max_output_total_bytes), .min = 64 * KIB,
      .max = 64 * GIB },
    { "kvs_server", "max_input_total_bytes", &T_SIZE, "256MiB", FIELD(kvs_max_input_total_bytes), .min = 64 * KIB,
      .max = 64 * GIB },

    /* [kvcm]: off by default; the timings are the reference publisher's
     * (docs/PROTOCOLS.md §2); endpoints and host_ip_port have no default. Every
     * [kvcm] option is restart-only: the publisher, heartbeat and query
     * threads take their settings once, at start. */
    { "kvcm", "enabled", &T_ENUM, "off", FIELD(kvcm.enabled), NAMES(onoff_names), .restart = true },
    { "kvcm", "endpoints", &T_URLLIST, "", FIELD(kvcm.endpoints), PARSED(kvcm.endpoint_list), .restart = true },
    { "kvcm", "instance_group", &T_TEXT, "default", FIELD(kvcm.instance_group), .restart = true },
    /* The fingerprint keeps deployments that differ only in their shape
     * (layers, heads, extra) apart: one instance id each. */
    { "kvcm", "instance_id", &T_TEMPLATE, "{model}_{block_tokens}_{fingerprint}", FIELD(kvcm.instance_id),
      .vars = KVCM_VARS_DEPLOYMENT, .restart = true },
    { "kvcm", "host_ip_port", &T_HOSTPORT, "", FIELD(kvcm.host_ip_port), .restart = true },
    { "kvcm", "storage_type", &T_ENUM, "ST_EVENT_REPORT_L1P5", FIELD(kvcm.storage_type),
      NAMES(kvcm_config_storage_names), .restart = true },
    { "kvcm", "medium_hbm", &T_TEXT, "hbm", FIELD(kvcm.medium_hbm), .no_hash = true, .restart = true },
    { "kvcm", "medium_host", &T_TEXT, "dram", FIELD(kvcm.medium_host), .no_hash = true, .restart = true },
    { "kvcm", "spec_name", &T_TEMPLATE, "rtp_llm_hbm_{block_tokens}", FIELD(kvcm.spec_name),
      .vars = KVCM_VARS_DEPLOYMENT | KVCM_VAR_BLOCK_BYTES, .restart = true },
    { "kvcm", "location_uri", &T_TEMPLATE, "rtp-llm://{host_ip_port}/{medium}?size={block_bytes}",
      FIELD(kvcm.location_uri), .vars = KVCM_VAR_HOST_IP_PORT | KVCM_VAR_MEDIUM | KVCM_VAR_BLOCK_BYTES | KVCM_VAR_KEY,
      .restart = true },
    { "kvcm", "request_timeout", &T_DURATION, "1500ms", FIELD(kvcm.request_timeout_ms), .min = 10,
      .max = 10 * MS_PER_M, .restart = true },
    { "kvcm", "connect_timeout", &T_DURATION, "500ms", FIELD(kvcm.connect_timeout_ms), .min = 10, .max = MS_PER_M,
      .restart = true },
    { "kvcm", "snapshot_timeout", &T_DURATION, "30s", FIELD(kvcm.snapshot_timeout_ms), .min = 10,
      .max = 10 * MS_PER_M, .restart = true },
    { "kvcm", "flush_interval", &T_DURATION, "20ms", FIELD(kvcm.flush_interval_ms), .min = 1, .max = 10 * MS_PER_S,
      .restart = true },
    { "kvcm", "batch_events", &T_COUNT, "1000", FIELD(kvcm.batch_events), .min = 1, .max = 16384, .restart = true },
    { "kvcm", "queue_events", &T_COUNT, "100000", FIELD(kvcm.queue_events), .min = 1, .max = 1048576,
      .restart = true },
    { "kvcm", "heartbeat_interval", &T_DURATION, "1s", FIELD(kvcm.heartbeat_interval_ms), .min = 10,
      .max = MS_PER_M, .restart = true },
    { "kvcm", "retry_base", &T_DURATION, "500ms", FIELD(kvcm.retry_base_ms), .min = 1, .max = MS_PER_M,
      .restart = true },
    { "kvcm", "retry_max", &T_DURATION, "30s", FIELD(kvcm.retry_max_ms), .min = 1, .max = MS_PER_H,
      .restart = true },
    { "kvcm", "snapshot_interval", &T_DURATION, "5m", FIELD(kvcm.snapshot_interval_ms), .min = 100,
      .max = 24 * MS_PER_H, .restart = true },
    { "kvcm", "host_down_timeout", &T_DURATION, "500ms", FIELD(kvcm.host_down_timeout_ms), .min = 10,
      .max = MS_PER_M, .restart = true },
    { "kvcm", "stall_timeout", &T_DURATION, "1m", FIELD(kvcm.stall_timeout_ms), .min = 100, .max = MS_PER_H,
      .restart = true },
    { "kvcm", "query_deadline", &T_DURATION, "20ms", FIELD(kvcm.query_deadline_ms), .min = 1,
      .max = 10 * MS_PER_S, .restart = true },
    { "kvcm", "query_max_hosts", &T_COUNT, "8", FIELD(kvcm.query_max_hosts), .min = 1, .max = 64,
      .restart = true },
    { "kvcm", "query_breaker_failures", &T_COUNT, "5", FIELD(kvcm.query_breaker_failures), .min = 1, .max = 1000,
      .restart = true },
    { "kvcm", "query_breaker_open", &T_DURATION, "10s", FIELD(kvcm.query_breaker_open_ms), .min = 10,
      .max = 10 * MS_PER_M, .restart = true },
    { "kvcm", "query_negative_ttl", &T_DURATION, "1s", FIELD(kvcm.query_negative_ttl_ms), .min = 1,
      .max = 10 * MS_PER_M, .restart = true },
};

#define CONFIG_NOPTIONS (sizeof config_options / sizeof config_options[0])

static const char *const config_sections[] = { "server", "memory", "hbm", "leases", "log", "admin", "persist",
                                               "kvs_server", "kvcm" };
#define SECTIONS_HINT "[server], [memory], [hbm], [leases], [log], [admin], [persist], [kvs_server], [kvcm] or " \
    "[tenant.NAME]"

/* ---- lookup ------------------------------------------------------------ */

static bool config_section_known(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof config_sections / sizeof config_sections[0]; i++)
        if (strlen(config_sections[i]) == len && memcmp(config_sections[i], name, len) == 0)
            return true;
    return false;
}

/* The row of [section] key, or NULL. */
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
    return config_tenant_key_known(key) ? "tenant.NAME" : NULL;
}

static void config_unknown_key_problem(const char *key, char *buf, size_t len)
{
    const char *home = config_home_section(key);
    if (home)
        snprintf(buf, len, "unknown key (it belongs in [%s])", home);
    else
        snprintf(buf, len, "unknown key");
}

/* ---- defaults and the table ------------------------------------------------ */

void config_defaults(struct kvn_config *cfg)
{
    /* Zero everything first: the unused tail of socket_path stays NUL, so
     * two configs with equal settings compare equal byte for byte. */
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
        const struct opt_def *o = &config_options[i];
        struct opt_value v = { 0 };
        char problem[PROBLEM_MAX];
        if (config_parse_value(o, o->def, &v, problem, sizeof problem) < 0) {
            /* A default its own row refuses is a bug in the table. */
            fprintf(stderr, "kvnode: built-in default of [%s] %s is invalid: %s\n", o->section, o->key, problem);
            abort();
        }
        o->type->store(cfg, o, &v);
    }
}

bool config_option_at(size_t i, const char **section, const char **key)
{
    if (i >= CONFIG_NOPTIONS)
        return false;
    *section = config_options[i].section;
    *key = config_options[i].key;
    return true;
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
        config_errbuf_add(pc->errors, "%s:%u: line too long (%zu characters; at most %zu)", pc->path, pc->lineno,
                   n, maxlen - 2);
        return "";
    }
    if (n == 0 || *s == ';' || *s == '#')
        return s;
    if (*s == '[') {
        const char *end = config_ini_scan(s + 1, "]");
        if (*end != ']') {
            config_errbuf_add(pc->errors, "%s:%u: syntax error: missing ']' in section header '%.*s'", pc->path,
                       pc->lineno, VALUE_SHOW, s);
            return "[!]";
        }
        const char *rest = end + 1;
        while (isspace((unsigned char)*rest))
            rest++;
        if (*rest && *rest != ';' && *rest != '#') {
            config_errbuf_add(pc->errors, "%s:%u: syntax error: unexpected text after section header '%.*s'",
                       pc->path, pc->lineno, VALUE_SHOW, s);
            return "[!]";
        }
        size_t len = (size_t)(end - (s + 1));
        int shown = (int)(len < VALUE_SHOW ? len : VALUE_SHOW);
        if (config_tenant_section(s + 1, len)) {
            /* Added here, so a section without keys is one too (and is told
             * what it lacks); a repeated one is the same section. */
            char problem[PROBLEM_MAX];
            if (config_tenant_find_or_add(pc->cfg, s + 1 + TENANT_PREFIX_LEN, len - TENANT_PREFIX_LEN, problem,
                                          sizeof problem) < 0) {
                config_errbuf_add(pc->errors, "%s:%u: [%.*s]: %s", pc->path, pc->lineno, shown, s + 1, problem);
                return "[!]";
            }
        } else if (!config_section_known(s + 1, len)) {
            config_errbuf_add(pc->errors, "%s:%u: [%.*s]: unknown section (expected " SECTIONS_HINT ")", pc->path,
                       pc->lineno, shown, s + 1);
        }
        return s;
    }
    const char *sep = config_ini_scan(s, "=:");
    if (*sep != '=' && *sep != ':') {
        config_errbuf_add(pc->errors, "%s:%u: syntax error: expected 'key = value', '[section]' or a comment, got '%.*s'",
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
        config_errbuf_add(pc->errors, "%s:%u: NUL byte in the line (byte %zu); kvnode.conf must be text", pc->path,
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
        config_errbuf_add(pc->errors, "%s:%u: %s: key outside any section (expected under " SECTIONS_HINT ")",
                   pc->path, pc->lineno, name);
        return 1;
    }
    struct opt_def tenant_row;
    const struct opt_def *o;
    if (config_tenant_section(section, strlen(section))) {
        /* Added by config_check_line at its header; not there: the header
         * was refused and reported. */
        int t = config_tenant_find(pc->cfg, section + TENANT_PREFIX_LEN);
        if (t < 0)
            return 1;
        if (!config_tenant_option(name, (size_t)t, &tenant_row)) {
            config_errbuf_add(pc->errors, "%s:%u: [%s] %s: unknown key (a tenant section takes %s)", pc->path,
                              pc->lineno, section, name, config_tenant_keys_hint());
            return 1;
        }
        o = &tenant_row;
    } else {
        if (!config_section_known(section, strlen(section)))
            return 1;   /* the section header was reported once, at its line */
        o = config_find_option(section, name);
        if (!o) {
            config_unknown_key_problem(name, problem, sizeof problem);
            config_errbuf_add(pc->errors, "%s:%u: [%s] %s: %s", pc->path, pc->lineno, section, name, problem);
            return 1;
        }
    }
    struct opt_value v = { 0 };
    if (config_parse_value(o, value, &v, problem, sizeof problem) < 0) {
        /* inih treats '#' as a comment only at the start of a line. */
        bool hash = strstr(value, " #") || strstr(value, "\t#");
        config_errbuf_add(pc->errors, "%s:%u: [%s] %s: %s%s", pc->path, pc->lineno, section, name, problem,
                   hash ? "; note: '#' starts a comment only at the beginning of a line, use ';' after a value"
                        : "");
        return 1;
    }
    o->type->store(pc->cfg, o, &v);
    /* Always "success": errors are collected above; a 0 would only make
     * inih remember the first one. */
    return 1;
}

int config_load_file(struct kvn_config *cfg, const char *path, char *err, size_t errlen)
{
    struct errbuf errors;
    config_errbuf_init(&errors, err, errlen);

    FILE *f = fopen(path, "re");
    if (!f) {
        config_errbuf_add(&errors, "%s: cannot open: %s", path, strerror(errno));
        config_errbuf_finish(&errors);
        return -1;
    }
    struct kvn_config scratch = *cfg;
    struct parse_ctx pc = { .cfg = &scratch, .path = path, .errors = &errors, .file = f };
    int rc = ini_parse_stream(config_read_line, &pc, config_handle_entry, &pc);
    free(pc.line);
    fclose(f);

    if (pc.read_errno)
        config_errbuf_add(&errors, "%s: read error: %s", path, strerror(pc.read_errno));
    else if (rc == -2)
        config_errbuf_add(&errors, "%s: out of memory while parsing", path);
    else if (rc != 0 && errors.count == 0)
        /* inih saw a problem the line check let through; still report it. */
        config_errbuf_add(&errors, "%s:%d: syntax error", path, rc);

    if (errors.count) {
        config_errbuf_finish(&errors);
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
    config_errbuf_init(&errors, err, errlen);
    char problem[PROBLEM_MAX];
    const char *shown = assignment ? assignment : "";

    const char *eq = assignment ? strchr(assignment, '=') : NULL;
    const char *dot = eq ? memchr(assignment, '.', (size_t)(eq - assignment)) : NULL;
    if (!eq || !dot) {
        config_errbuf_add(&errors, "override '%.*s': expected SECTION.KEY=VALUE, e.g. memory.host_bytes=2GiB",
                   VALUE_SHOW, shown);
        goto fail;
    }
    const char *sec = assignment, *sec_end = dot;
    const char *key = dot + 1, *key_end = eq;
    const char *val = eq + 1, *val_end = eq + 1 + strlen(eq + 1);
    config_trim(&sec, &sec_end);
    /* tenant.NAME.key: the section runs to the last dot (keys have none). */
    const char *last = memrchr(dot + 1, '.', (size_t)(eq - dot - 1));
    if (last && (size_t)(sec_end - sec) == TENANT_PREFIX_LEN - 1 &&
        memcmp(sec, TENANT_PREFIX, TENANT_PREFIX_LEN - 1) == 0) {
        sec_end = last;
        key = last + 1;
    }
    config_trim(&key, &key_end);
    config_trim(&val, &val_end);

    char section[TENANT_PREFIX_LEN + CONFIG_TENANT_NAME_MAX], name[64], value[PATH_MAX];
    if (sec == sec_end || key == key_end) {
        config_errbuf_add(&errors, "override '%.*s': empty %s (expected SECTION.KEY=VALUE)", VALUE_SHOW, shown,
                   sec == sec_end ? "section" : "key");
        goto fail;
    }
    size_t seclen = (size_t)(sec_end - sec);
    bool tenant = config_tenant_section(sec, seclen);
    if (tenant && seclen >= sizeof section) {
        config_errbuf_add(&errors, "override '%.*s': invalid tenant name '%.*s' (1 to %d letters, digits, '_' or "
                          "'-')", VALUE_SHOW, shown, (int)(seclen - TENANT_PREFIX_LEN < VALUE_SHOW ?
                          seclen - TENANT_PREFIX_LEN : VALUE_SHOW), sec + TENANT_PREFIX_LEN,
                          CONFIG_TENANT_NAME_MAX - 1);
        goto fail;
    }
    if (!tenant && (seclen >= sizeof section || !config_section_known(sec, seclen))) {
        config_errbuf_add(&errors, "override '%.*s': unknown section [%.*s] (expected " SECTIONS_HINT ")", VALUE_SHOW,
                   shown, (int)seclen, sec);
        goto fail;
    }
    memcpy(section, sec, seclen);
    section[seclen] = '\0';
    const struct opt_def *o = NULL;
    struct opt_def tenant_row;
    if ((size_t)(key_end - key) < sizeof name) {
        memcpy(name, key, (size_t)(key_end - key));
        name[key_end - key] = '\0';
        /* Parsing does not depend on which tenant: the row of the first. */
        if (tenant)
            o = config_tenant_option(name, 0, &tenant_row) ? &tenant_row : NULL;
        else
            o = config_find_option(section, name);
    }
    if (!o) {
        if (tenant)
            snprintf(problem, sizeof problem, "unknown key (a tenant section takes %s)", config_tenant_keys_hint());
        else if ((size_t)(key_end - key) < sizeof name)
            config_unknown_key_problem(name, problem, sizeof problem);
        else
            snprintf(problem, sizeof problem, "unknown key");
        config_errbuf_add(&errors, "override %s.%.*s: %s", section, (int)(key_end - key), key, problem);
        goto fail;
    }
    if ((size_t)(val_end - val) >= sizeof value) {
        config_errbuf_add(&errors, "override %s.%s: value too long", section, name);
        goto fail;
    }
    memcpy(value, val, (size_t)(val_end - val));
    value[val_end - val] = '\0';

    struct opt_value v = { 0 };
    if (config_parse_value(o, value, &v, problem, sizeof problem) < 0) {
        config_errbuf_add(&errors, "override %s.%s: %s", section, name, problem);
        goto fail;
    }
    if (tenant) {
        int t = config_tenant_find_or_add(cfg, section + TENANT_PREFIX_LEN, seclen - TENANT_PREFIX_LEN, problem,
                                          sizeof problem);
        if (t < 0) {
            config_errbuf_add(&errors, "override %s.%s: [%s]: %s", section, name, section, problem);
            goto fail;
        }
        config_tenant_option(name, (size_t)t, &tenant_row);
    }
    o->type->store(cfg, o, &v);
    return 0;

fail:
    config_errbuf_finish(&errors);
    return -1;
}


/* ---- validation, output, reload ------------------------------------------ */

/* The rules between [memory], [hbm] and [persist] options. */
static void config_validate_cross(const struct kvn_config *cfg, struct errbuf *errors)
{
    if (!(cfg->low_watermark < cfg->high_watermark)) {
        char lo[32], hi[32];
        config_format_fraction(cfg->low_watermark, lo, sizeof lo);
        config_format_fraction(cfg->high_watermark, hi, sizeof hi);
        config_errbuf_add(errors, "[memory] low_watermark: %s must be below high_watermark (%s)", lo, hi);
    }
    if (cfg->slab_bytes > cfg->host_bytes) {
        char slab[32], host[32];
        config_format_size(cfg->slab_bytes, slab, sizeof slab);
        config_format_size(cfg->host_bytes, host, sizeof host);
        config_errbuf_add(errors, "[memory] slab_bytes: %s exceeds host_bytes (%s); the arena must hold at least "
                                  "one slab", slab, host);
    } else if (cfg->slab_bytes > 0 && cfg->host_bytes / cfg->slab_bytes > UINT32_MAX) {
        /* The arena counts slabs in 32 bits. */
        config_errbuf_add(errors, "[memory] host_bytes: more than %" PRIu32 " slabs of slab_bytes; raise slab_bytes",
                          UINT32_MAX);
    }

    /* [hbm]: like [memory]. bytes is rounded down to whole slabs, so a
     * non-zero size must hold at least one. */
    if (!(cfg->hbm_low_watermark < cfg->hbm_high_watermark)) {
        char lo[32], hi[32];
        config_format_fraction(cfg->hbm_low_watermark, lo, sizeof lo);
        config_format_fraction(cfg->hbm_high_watermark, hi, sizeof hi);
        config_errbuf_add(errors, "[hbm] low_watermark: %s must be below high_watermark (%s)", lo, hi);
    }
    if (cfg->hbm_bytes > 0 && cfg->hbm_bytes < cfg->slab_bytes) {
        char hbm[32], slab[32];
        config_format_size(cfg->hbm_bytes, hbm, sizeof hbm);
        config_format_size(cfg->slab_bytes, slab, sizeof slab);
        config_errbuf_add(errors, "[hbm] bytes: %s is less than [memory] slab_bytes (%s); each device's arena must "
                                  "hold at least one slab (or set bytes = 0 for no HBM tier)", hbm, slab);
    } else if (cfg->slab_bytes > 0 && cfg->hbm_bytes / cfg->slab_bytes > UINT32_MAX) {
        config_errbuf_add(errors, "[hbm] bytes: more than %" PRIu32 " slabs of [memory] slab_bytes; raise slab_bytes",
                          UINT32_MAX);
    }

    /* [persist]: what the configured backend needs. */
    if (cfg->persist_backend == CONFIG_BACKEND_FILE && cfg->persist_path[0] == '\0')
        config_errbuf_add(errors, "[persist] path: required when backend = file (the directory the blocks are "
                                  "stored under)");
    if (cfg->persist_backend == CONFIG_BACKEND_V6D) {
        size_t n = strnlen(cfg->persist_url, sizeof cfg->persist_url);
        const char *url = cfg->persist_url;
        size_t scheme = strncasecmp(url, "http://", 7) == 0 ? 7 : strncasecmp(url, "https://", 8) == 0 ? 8 : 0;
        if (n == 0)
            config_errbuf_add(errors, "[persist] url: required when backend = v6d (the store's control-plane "
                                      "URL, e.g. http://127.0.0.1:8080)");
        else if (n < sizeof cfg->persist_url && !config_url_has_credentials(url, n) &&
                 (scheme == 0 || url[scheme] == '\0' || url[scheme] == '/'))
            config_errbuf_add(errors, "[persist] url: invalid URL '%.*s%s' (backend = v6d needs http://HOST[:PORT] "
                                      "or https://HOST[:PORT], optionally with a path)",
                              VALUE_SHOW, url, n > VALUE_SHOW ? "..." : "");
        if (cfg->persist_socket[0] == '\0')
            config_errbuf_add(errors, "[persist] socket_path: required when backend = v6d (the store's data-plane "
                                      "unix socket)");
        if (cfg->persist_object_namespace[0] == '\0')
            config_errbuf_add(errors, "[persist] object_namespace: required when backend = v6d (the first part of "
                                      "every object key; rtp-llm engines use rtp_llm)");
    }
    if (cfg->persist_backend == CONFIG_BACKEND_REDIS) {
        char (*hosts)[HOSTPORT_HOST_MAX] = malloc(HOSTPORT_SEEDS_MAX * sizeof *hosts);
        int ports[HOSTPORT_SEEDS_MAX];
        size_t n;
        char why[160];
        if (!hosts)
            config_errbuf_add(errors, "[persist] nodes: out of memory");
        else if (hostport_parse_seeds(cfg->persist_nodes, hosts, ports, &n, why, sizeof why) < 0)
            config_errbuf_add(errors, "[persist] nodes: %s; backend = redis needs the cluster's seed nodes "
                                      "(or one plain server), e.g. nodes = 10.0.0.1:6379,10.0.0.2:6379", why);
        free(hosts);
    }

    /* [kvs_server]: the control plane finds its client's tenant through the
     * kernel's socket table, which only a loopback peer is in; the two
     * sockets must be distinct from the engines' and the admin socket. */
    struct config_listen kvs_listen = { 0 };
    char kvs_problem[PROBLEM_MAX];
    /* Parsed here: the parsed fields are filled only once every check passed. */
    if (cfg->kvs_enabled && config_parse_listen(cfg->kvs_listen, &kvs_listen, kvs_problem, sizeof kvs_problem) == 0) {
        const struct config_listen *l = &kvs_listen;
        if (l->kind == CONFIG_LISTEN_OFF)
            config_errbuf_add(errors, "[kvs_server] listen: required when enabled = on (e.g. 127.0.0.1:8080, "
                                      "the KVS_V6D_URL engines are given)");
        else if (l->kind == CONFIG_LISTEN_TCP && strcmp(l->host, "127.0.0.1") != 0 &&
                 strcmp(l->host, "localhost") != 0 && strcmp(l->host, "::1") != 0)
            config_errbuf_add(errors, "[kvs_server] listen: %s is not a loopback address; the KVS front end "
                                      "serves engines on this node only (use 127.0.0.1:PORT, [::1]:PORT or "
                                      "unix:PATH)", l->host);
        if (cfg->kvs_socket_path[0] == '\0')
            config_errbuf_add(errors, "[kvs_server] socket_path: required when enabled = on (the "
                                      "KVS_V6D_SOCKET_PATH engines are given)");
        else if (strcmp(cfg->kvs_socket_path, cfg->socket_path) == 0 ||
                 (l->kind == CONFIG_LISTEN_UNIX && strcmp(cfg->kvs_socket_path, l->path) == 0))
            config_errbuf_add(errors, "[kvs_server] socket_path: %s is already [server] socket_path or "
                                      "[kvs_server] listen; give the data plane a path of its own",
                              cfg->kvs_socket_path);
        if (cfg->kvs_default_term_ms > cfg->kvs_max_term_ms)
            config_errbuf_add(errors, "[kvs_server] default_term: %" PRIu32 "ms is above max_term (%" PRIu32
                                      "ms)", cfg->kvs_default_term_ms, cfg->kvs_max_term_ms);
    }
}

/* Every check, field by field and between fields. With `resolved`, each
 * list/address option's parsed form goes into it too. */
static int config_check_all(const struct kvn_config *cfg, struct kvn_config *resolved, char *err, size_t errlen)
{
    struct errbuf errors;
    config_errbuf_init(&errors, err, errlen);
    char problem[PROBLEM_MAX], text[VALUE_MAX];

    /* Field checks again: a struct built or edited by code skipped the parser. */
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
        const struct opt_def *o = &config_options[i];
        struct opt_value v = { 0 };
        o->type->load(cfg, o, &v, text, sizeof text);
        if (config_check_value(o, &v, NULL, problem, sizeof problem) < 0)
            config_errbuf_add(&errors, "[%s] %s: %s", o->section, o->key, problem);
        else if (resolved && o->parsed_width)
            memcpy((char *)resolved + o->parsed_offset, &v.parsed, o->parsed_width);
    }
    config_validate_cross(cfg, &errors);
    kvcm_config_validate(&cfg->kvcm, &errors);
    config_tenant_check(cfg, resolved, &errors);

    if (errors.count) {
        config_errbuf_finish(&errors);
        return -1;
    }
    return 0;
}

int config_validate(const struct kvn_config *cfg, char *err, size_t errlen)
{
    return config_check_all(cfg, NULL, err, errlen);
}

int config_resolve(struct kvn_config *cfg, char *err, size_t errlen)
{
    struct kvn_config next = *cfg;
    if (config_check_all(cfg, &next, err, errlen) < 0)
        return -1;
    *cfg = next;
    return 0;
}

void config_write(const struct kvn_config *cfg, FILE *out)
{
    const char *section = NULL;
    char text[VALUE_MAX + 16], field[VALUE_MAX];
    fprintf(out, "# kvnoded effective configuration; see kvnode.conf(5)\n");
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
        const struct opt_def *o = &config_options[i];
        if (!section || strcmp(section, o->section) != 0) {
            section = o->section;
            fprintf(out, "\n[%s]\n", section);
        }
        struct opt_value v = { 0 };
        o->type->load(cfg, o, &v, field, sizeof field);
        o->type->format(o, &v, text, sizeof text);
        fprintf(out, "%s = %s\n", o->key, text);
    }
    config_tenant_write(cfg, out);
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
        struct opt_value va = { 0 }, vb = { 0 };
        o->type->load(running, o, &va, a, sizeof a);
        o->type->load(next, o, &vb, b, sizeof b);
        if (o->type->equal(&va, &vb))
            continue;
        changed++;
        if (buf && used < buflen) {
            int n = snprintf(buf + used, buflen - used, "%s%s.%s", used ? ", " : "", o->section, o->key);
            if (n > 0)
                used += (size_t)n;
        }
    }
    return changed + config_tenant_restart_required(running, next, buf, buflen, &used);
}

void config_keep_restart_only(struct kvn_config *next, const struct kvn_config *running)
{
    for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
        const struct opt_def *o = &config_options[i];
        if (!o->restart)
            continue;
        memcpy((char *)next + o->offset, (const char *)running + o->offset, o->width);
        if (o->parsed_width)
            memcpy((char *)next + o->parsed_offset, (const char *)running + o->parsed_offset, o->parsed_width);
    }
    config_tenant_keep_restart_only(next, running);
}

bool config_option_reloadable(const char *section, const char *key)
{
    struct opt_def tenant_row;
    const struct opt_def *o;
    if (strcmp(section, "tenant") == 0 || config_tenant_section(section, strlen(section)))
        o = config_tenant_option(key, 0, &tenant_row) ? &tenant_row : NULL;
    else
        o = config_find_option(section, key);
    return o && !o->restart;
}
