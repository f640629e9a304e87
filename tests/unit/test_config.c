/* Unit tests for daemon/config/config.c and daemon/log.c.
 *
 * Run from the repository root (the Makefile does): the shipped
 * conf/kvnode.conf and man/kvnode.conf.5 are checked against the parser. */
#include "config/config.h"
#include "core/log.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <pwd.h>
#include <regex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

/* ---- helpers ------------------------------------------------------------- */

/* Writes `text` to a fresh mkstemp file; path receives its name. */
static void temp_write(const char *text, char *path, size_t len)
{
    const char *dir = getenv("TMPDIR");
    snprintf(path, len, "%s/kvnode-test-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    ck_assert_msg(fd >= 0, "mkstemp: %s", strerror(errno));
    size_t n = strlen(text);
    ck_assert_int_eq(write(fd, text, n), (ssize_t)n);
    ck_assert_int_eq(close(fd), 0);
}

/* Loads `text` as a config file on top of *cfg; the temp file is gone again
 * before any assertion can fail. path (may be NULL) receives its name. */
static int load_text(struct kvn_config *cfg, const char *text, char *err, size_t errlen, char *path,
                     size_t pathlen)
{
    char tmp[256];
    temp_write(text, tmp, sizeof tmp);
    int rc = config_load_file(cfg, tmp, err, errlen);
    unlink(tmp);
    if (path)
        snprintf(path, pathlen, "%s", tmp);
    return rc;
}

/* Like load_text with n bytes that may hold NUL bytes. */
static int load_bytes(struct kvn_config *cfg, const char *bytes, size_t n, char *err, size_t errlen, char *path,
                      size_t pathlen)
{
    char tmp[256];
    const char *dir = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/kvnode-test-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(tmp);
    ck_assert_msg(fd >= 0, "mkstemp: %s", strerror(errno));
    ssize_t w = write(fd, bytes, n);
    close(fd);
    int rc = w == (ssize_t)n ? config_load_file(cfg, tmp, err, errlen) : -2;
    unlink(tmp);
    ck_assert_msg(w == (ssize_t)n, "write %s: %s", tmp, strerror(errno));
    if (path)
        snprintf(path, pathlen, "%s", tmp);
    return rc;
}

/* Whole file into a malloc'd string, or NULL. */
static char *file_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        fwrite(chunk, 1, n, mem);
    fclose(f);
    fclose(mem);
    return buf;
}

/* The repository file `rel`, whether tests run from the root or below it. */
static char *repo_slurp(const char *rel, char *found, size_t foundlen)
{
    const char *prefixes[] = { "", "../", "../../" };
    const char *srcdir = getenv("KVNODE_SRCDIR");
    if (srcdir && *srcdir) {
        snprintf(found, foundlen, "%s/%s", srcdir, rel);
        char *text = file_slurp(found);
        if (text)
            return text;
    }
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        snprintf(found, foundlen, "%s%s", prefixes[i], rel);
        char *text = file_slurp(found);
        if (text)
            return text;
    }
    ck_abort_msg("cannot find %s (run from the repository root or set KVNODE_SRCDIR)", rel);
    return NULL;
}

static char *config_to_text(const struct kvn_config *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(mem);
    config_write(cfg, mem);
    fclose(mem);
    return buf;
}

static void assert_config_equal(const struct kvn_config *a, const struct kvn_config *b)
{
    ck_assert_str_eq(a->socket_path, b->socket_path);
    ck_assert_uint_eq(a->socket_mode, b->socket_mode);
    ck_assert_str_eq(a->socket_group, b->socket_group);
    ck_assert_str_eq(a->allow_uids, b->allow_uids);
    ck_assert_str_eq(a->allow_gids, b->allow_gids);
    ck_assert_uint_eq(a->max_frame_bytes, b->max_frame_bytes);
    ck_assert_uint_eq(a->max_keys_per_request, b->max_keys_per_request);
    ck_assert_uint_eq(a->max_clients, b->max_clients);
    ck_assert_uint_eq(a->max_namespaces, b->max_namespaces);
    ck_assert_uint_eq(a->request_timeout_ms, b->request_timeout_ms);
    ck_assert_uint_eq(a->shutdown_timeout_ms, b->shutdown_timeout_ms);
    ck_assert_uint_eq(a->frame_timeout_ms, b->frame_timeout_ms);
    ck_assert_uint_eq(a->max_buffered_input_bytes, b->max_buffered_input_bytes);
    ck_assert_uint_eq(a->hello_timeout_ms, b->hello_timeout_ms);
    ck_assert_uint_eq(a->max_buffered_output_bytes, b->max_buffered_output_bytes);
    ck_assert_uint_eq(a->worker_stall_timeout_ms, b->worker_stall_timeout_ms);
    ck_assert_uint_eq(a->host_bytes, b->host_bytes);
    ck_assert_uint_eq(a->slab_bytes, b->slab_bytes);
    ck_assert(a->high_watermark == b->high_watermark);
    ck_assert(a->low_watermark == b->low_watermark);
    ck_assert_int_eq(a->pin_host, b->pin_host);
    ck_assert_int_eq(a->numa, b->numa);
    ck_assert_uint_eq(a->namespace_quota, b->namespace_quota);
    ck_assert_uint_eq(a->pin_chunk_bytes, b->pin_chunk_bytes);
    ck_assert_int_eq(a->huge_pages, b->huge_pages);
    ck_assert_int_eq(a->hbm_backend, b->hbm_backend);
    ck_assert_uint_eq(a->hbm_bytes, b->hbm_bytes);
    ck_assert_str_eq(a->hbm_devices, b->hbm_devices);
    ck_assert(a->hbm_high_watermark == b->hbm_high_watermark);
    ck_assert(a->hbm_low_watermark == b->hbm_low_watermark);
    ck_assert_int_eq(a->hbm_required, b->hbm_required);
    ck_assert_uint_eq(a->hbm_copy_batch_bytes, b->hbm_copy_batch_bytes);
    ck_assert_uint_eq(a->hbm_release_timeout_ms, b->hbm_release_timeout_ms);
    ck_assert_uint_eq(a->hbm_alloc_retry_ms, b->hbm_alloc_retry_ms);
    ck_assert_uint_eq(a->read_lease_ttl_ms, b->read_lease_ttl_ms);
    ck_assert_uint_eq(a->write_lease_ttl_ms, b->write_lease_ttl_ms);
    ck_assert_uint_eq(a->reaper_interval_ms, b->reaper_interval_ms);
    ck_assert_uint_eq(a->max_leases_per_client, b->max_leases_per_client);
    ck_assert_int_eq(a->log_level, b->log_level);
    ck_assert_str_eq(a->admin_listen, b->admin_listen);
    ck_assert_uint_eq(a->admin_max_connections, b->admin_max_connections);
    ck_assert_uint_eq(a->admin_request_timeout_ms, b->admin_request_timeout_ms);
    ck_assert_int_eq(a->persist_backend, b->persist_backend);
    ck_assert_int_eq(a->persist_policy, b->persist_policy);
    ck_assert_str_eq(a->persist_path, b->persist_path);
    ck_assert_uint_eq(a->persist_capacity, b->persist_capacity);
    ck_assert_int_eq(a->persist_fsync, b->persist_fsync);
    ck_assert_uint_eq(a->persist_segment_bytes, b->persist_segment_bytes);
    ck_assert_int_eq(a->persist_direct_io, b->persist_direct_io);
    ck_assert_uint_eq(a->persist_workers, b->persist_workers);
    ck_assert_uint_eq(a->persist_queue, b->persist_queue);
    ck_assert_str_eq(a->persist_url, b->persist_url);
    ck_assert_str_eq(a->persist_socket, b->persist_socket);
    ck_assert_uint_eq(a->persist_connect_timeout_ms, b->persist_connect_timeout_ms);
    ck_assert_uint_eq(a->persist_timeout_ms, b->persist_timeout_ms);
    ck_assert_int_eq(a->persist_lookup, b->persist_lookup);
    ck_assert_uint_eq(a->persist_lookup_negative_ttl_ms, b->persist_lookup_negative_ttl_ms);
    ck_assert_str_eq(a->persist_object_namespace, b->persist_object_namespace);
    ck_assert_uint_eq(a->persist_tombstones, b->persist_tombstones);
    ck_assert_int_eq(a->kvcm.enabled, b->kvcm.enabled);
    ck_assert_str_eq(a->kvcm.endpoints, b->kvcm.endpoints);
    ck_assert_str_eq(a->kvcm.instance_group, b->kvcm.instance_group);
    ck_assert_str_eq(a->kvcm.instance_id, b->kvcm.instance_id);
    ck_assert_str_eq(a->kvcm.host_ip_port, b->kvcm.host_ip_port);
    ck_assert_int_eq(a->kvcm.storage_type, b->kvcm.storage_type);
    ck_assert_str_eq(a->kvcm.medium_hbm, b->kvcm.medium_hbm);
    ck_assert_str_eq(a->kvcm.medium_host, b->kvcm.medium_host);
    ck_assert_str_eq(a->kvcm.spec_name, b->kvcm.spec_name);
    ck_assert_str_eq(a->kvcm.location_uri, b->kvcm.location_uri);
    ck_assert_uint_eq(a->kvcm.request_timeout_ms, b->kvcm.request_timeout_ms);
    ck_assert_uint_eq(a->kvcm.connect_timeout_ms, b->kvcm.connect_timeout_ms);
    ck_assert_uint_eq(a->kvcm.snapshot_timeout_ms, b->kvcm.snapshot_timeout_ms);
    ck_assert_uint_eq(a->kvcm.flush_interval_ms, b->kvcm.flush_interval_ms);
    ck_assert_uint_eq(a->kvcm.batch_events, b->kvcm.batch_events);
    ck_assert_uint_eq(a->kvcm.queue_events, b->kvcm.queue_events);
    ck_assert_uint_eq(a->kvcm.heartbeat_interval_ms, b->kvcm.heartbeat_interval_ms);
    ck_assert_uint_eq(a->kvcm.retry_base_ms, b->kvcm.retry_base_ms);
    ck_assert_uint_eq(a->kvcm.retry_max_ms, b->kvcm.retry_max_ms);
    ck_assert_uint_eq(a->kvcm.snapshot_interval_ms, b->kvcm.snapshot_interval_ms);
    ck_assert_uint_eq(a->kvcm.host_down_timeout_ms, b->kvcm.host_down_timeout_ms);
    ck_assert_uint_eq(a->kvcm.stall_timeout_ms, b->kvcm.stall_timeout_ms);
    ck_assert_uint_eq(a->kvcm.query_deadline_ms, b->kvcm.query_deadline_ms);
    ck_assert_uint_eq(a->kvcm.query_max_hosts, b->kvcm.query_max_hosts);
    ck_assert_uint_eq(a->kvcm.query_breaker_failures, b->kvcm.query_breaker_failures);
    ck_assert_uint_eq(a->kvcm.query_breaker_open_ms, b->kvcm.query_breaker_open_ms);
    ck_assert_uint_eq(a->kvcm.query_negative_ttl_ms, b->kvcm.query_negative_ttl_ms);
    /* Both went through config_defaults (zeroed) and the parser (zero-filled
     * path tail), so they are byte-identical too. */
    ck_assert(memcmp(a, b, sizeof *a) == 0);
}

static unsigned count_lines(const char *s)
{
    unsigned n = *s ? 1 : 0;
    for (; *s; s++)
        if (*s == '\n')
            n++;
    return n;
}

/* Every option, as documented (section, key). */
static const char *const all_options[][2] = {
    { "server", "socket_path" }, { "server", "socket_mode" }, { "server", "socket_group" },
    { "server", "allow_uids" }, { "server", "allow_gids" }, { "server", "max_frame_bytes" },
    { "server", "max_keys_per_request" }, { "server", "max_clients" }, { "server", "max_namespaces" },
    { "server", "request_timeout" }, { "server", "shutdown_timeout" }, { "server", "frame_timeout" },
    { "server", "max_buffered_input_bytes" }, { "server", "hello_timeout" },
    { "server", "max_buffered_output_bytes" }, { "server", "worker_stall_timeout" },
    { "memory", "host_bytes" }, { "memory", "slab_bytes" }, { "memory", "high_watermark" },
    { "memory", "low_watermark" }, { "memory", "pin_host" }, { "memory", "namespace_quota" },
    { "memory", "pin_chunk_bytes" }, { "memory", "huge_pages" }, { "memory", "numa" },
    { "hbm", "backend" }, { "hbm", "bytes" }, { "hbm", "devices" }, { "hbm", "high_watermark" },
    { "hbm", "low_watermark" }, { "hbm", "required" }, { "hbm", "copy_batch_bytes" },
    { "hbm", "release_timeout" },
    { "hbm", "alloc_retry" },
    { "leases", "read_ttl" }, { "leases", "write_ttl" }, { "leases", "reaper_interval" },
    { "leases", "max_per_client" },
    { "leases", "max_reserved_per_client" },
    { "log", "level" },
    { "admin", "listen" }, { "admin", "max_connections" }, { "admin", "request_timeout" },
    { "persist", "backend" }, { "persist", "policy" }, { "persist", "path" }, { "persist", "capacity" },
    { "persist", "fsync" }, { "persist", "segment_bytes" }, { "persist", "direct_io" },
    { "persist", "workers" }, { "persist", "queue" }, { "persist", "url" },
    { "persist", "socket_path" }, { "persist", "connect_timeout" }, { "persist", "timeout" },
    { "persist", "lookup" }, { "persist", "lookup_negative_ttl" }, { "persist", "object_namespace" }, { "persist", "tombstones" },
    { "persist", "nodes" }, { "persist", "user" }, { "persist", "password_file" },
    { "kvs_server", "enabled" }, { "kvs_server", "listen" }, { "kvs_server", "socket_path" },
    { "kvs_server", "max_body_bytes" }, { "kvs_server", "max_keys" }, { "kvs_server", "max_leases" },
    { "kvs_server", "default_term" }, { "kvs_server", "max_term" }, { "kvs_server", "tp_size" },
    { "kvs_server", "max_connections" }, { "kvs_server", "request_timeout" },
    { "kvs_server", "max_output_bytes" }, { "kvs_server", "max_output_total_bytes" },
    { "kvs_server", "max_input_total_bytes" },
    { "kvcm", "enabled" }, { "kvcm", "endpoints" }, { "kvcm", "instance_group" }, { "kvcm", "instance_id" },
    { "kvcm", "host_ip_port" }, { "kvcm", "storage_type" }, { "kvcm", "medium_hbm" }, { "kvcm", "medium_host" },
    { "kvcm", "spec_name" }, { "kvcm", "location_uri" }, { "kvcm", "request_timeout" },
    { "kvcm", "connect_timeout" }, { "kvcm", "snapshot_timeout" }, { "kvcm", "flush_interval" },
    { "kvcm", "batch_events" }, { "kvcm", "queue_events" }, { "kvcm", "heartbeat_interval" },
    { "kvcm", "retry_base" }, { "kvcm", "retry_max" }, { "kvcm", "snapshot_interval" },
    { "kvcm", "host_down_timeout" }, { "kvcm", "stall_timeout" }, { "kvcm", "query_deadline" },
    { "kvcm", "query_max_hosts" },
    { "kvcm", "query_breaker_failures" }, { "kvcm", "query_breaker_open" }, { "kvcm", "query_negative_ttl" },
};
#define NOPTIONS (sizeof all_options / sizeof all_options[0])

/* ---- defaults ------------------------------------------------------------ */

START_TEST(test_defaults)
{
    struct kvn_config c;
    memset(&c, 0xAB, sizeof c);
    config_defaults(&c);
    ck_assert_str_eq(c.socket_path, "/run/kvnode/kvnode.sock");
    ck_assert_uint_eq(c.socket_mode, 0660);
    ck_assert_uint_eq(c.max_frame_bytes, 64 * MIB);
    ck_assert_uint_eq(c.max_keys_per_request, 4096);
    ck_assert_uint_eq(c.max_clients, 1024);
    ck_assert_uint_eq(c.max_namespaces, 256);
    ck_assert_uint_eq(c.request_timeout_ms, 5000);
    ck_assert_uint_eq(c.shutdown_timeout_ms, 10000);
    ck_assert_uint_eq(c.frame_timeout_ms, 10000);
    ck_assert_uint_eq(c.max_buffered_input_bytes, 256 * MIB);
    ck_assert_uint_eq(c.hello_timeout_ms, 5000);
    ck_assert_uint_eq(c.max_buffered_output_bytes, GIB);
    ck_assert_uint_eq(c.worker_stall_timeout_ms, 10000);
    ck_assert_uint_eq(c.host_bytes, GIB);
    ck_assert_uint_eq(c.slab_bytes, 16 * MIB);
    ck_assert_double_eq(c.high_watermark, 0.95);
    ck_assert_double_eq(c.low_watermark, 0.90);
    ck_assert_int_eq(c.pin_host, CONFIG_PIN_AUTO);
    ck_assert_int_eq(c.numa, CONFIG_NUMA_AUTO);
    ck_assert_uint_eq(c.namespace_quota, 0);
    ck_assert_uint_eq(c.pin_chunk_bytes, GIB);
    ck_assert_int_eq(c.huge_pages, CONFIG_HUGE_AUTO);
    /* [hbm]: no GPU memory is taken unless the operator gives some. */
    ck_assert_int_eq(c.hbm_backend, CONFIG_HBM_AUTO);
    ck_assert_uint_eq(c.hbm_bytes, 0);
    ck_assert_str_eq(c.hbm_devices, "all");
    for (size_t i = strlen(c.hbm_devices); i < sizeof c.hbm_devices; i++)
        ck_assert_int_eq(c.hbm_devices[i], 0);
    ck_assert_double_eq(c.hbm_high_watermark, 0.90);
    ck_assert_double_eq(c.hbm_low_watermark, 0.80);
    ck_assert_int_eq(c.hbm_required, 0);
    ck_assert_uint_eq(c.hbm_copy_batch_bytes, 64 * MIB);
    ck_assert_uint_eq(c.hbm_release_timeout_ms, 5000);
    ck_assert_uint_eq(c.hbm_alloc_retry_ms, 10000);
    ck_assert_uint_eq(c.read_lease_ttl_ms, 30000);
    ck_assert_uint_eq(c.write_lease_ttl_ms, 30000);
    ck_assert_uint_eq(c.reaper_interval_ms, 1000);
    ck_assert_uint_eq(c.max_leases_per_client, 1024);
    ck_assert_int_eq(c.log_level, LOG_LEVEL_INFO);
    ck_assert_str_eq(c.admin_listen, "127.0.0.1:9180");
    ck_assert_uint_eq(c.admin_max_connections, 64);
    ck_assert_uint_eq(c.admin_request_timeout_ms, 5000);
    ck_assert_int_eq(c.persist_backend, CONFIG_BACKEND_FILE);
    ck_assert_int_eq(c.persist_policy, CONFIG_POLICY_WRITE_THROUGH);
    ck_assert_str_eq(c.persist_path, "/var/lib/kvnode");
    ck_assert_uint_eq(c.persist_capacity, 0);
    ck_assert_int_eq(c.persist_fsync, 1);   /* KVS_FSYNC_BATCH */
    ck_assert_uint_eq(c.persist_segment_bytes, 256u << 20);
    ck_assert_int_eq(c.persist_direct_io, 0);   /* KVS_DIRECT_AUTO */
    ck_assert_uint_eq(c.persist_workers, 2);
    ck_assert_uint_eq(c.persist_queue, 4096);
    ck_assert_str_eq(c.persist_url, "");
    ck_assert_str_eq(c.persist_socket, "");
    ck_assert_uint_eq(c.persist_connect_timeout_ms, 1000);
    ck_assert_uint_eq(c.persist_timeout_ms, 5000);
    ck_assert_int_eq(c.persist_lookup, CONFIG_LOOKUP_AUTO);
    ck_assert_uint_eq(c.persist_lookup_negative_ttl_ms, 1000);
    ck_assert_str_eq(c.persist_object_namespace, "rtp_llm");   /* rtp-llm's kvs_object_namespace */
    ck_assert_uint_eq(c.persist_tombstones, 65536);
    /* [kvs_server]: off; rtp-llm's default KVS_V6D_URL port and lease term. */
    ck_assert_int_eq(c.kvs_enabled, 0);
    ck_assert_str_eq(c.kvs_listen, "127.0.0.1:8080");
    ck_assert_str_eq(c.kvs_socket_path, "/run/kvnode/kvs.sock");
    ck_assert_uint_eq(c.kvs_max_body_bytes, 16 * MIB);
    ck_assert_uint_eq(c.kvs_max_keys, 65536);
    ck_assert_uint_eq(c.kvs_max_leases, 4096);
    ck_assert_uint_eq(c.kvs_default_term_ms, 60000);
    ck_assert_uint_eq(c.kvs_max_term_ms, 600000);
    ck_assert_uint_eq(c.kvs_tp_size, 1);
    ck_assert_uint_eq(c.kvs_max_connections, 1024);
    ck_assert_uint_eq(c.kvs_request_timeout_ms, 10000);
    ck_assert_uint_eq(c.kvs_max_output_bytes, 32ull << 20);
    ck_assert_uint_eq(c.kvs_max_input_total_bytes, 256ull << 20);
    ck_assert_uint_eq(c.kvs_max_output_total_bytes, 256ull << 20);
    /* [kvcm]: off, and the reference publisher's timings (docs/PROTOCOLS.md §2). */
    ck_assert_int_eq(c.kvcm.enabled, 0);
    ck_assert_str_eq(c.kvcm.endpoints, "");
    ck_assert_str_eq(c.kvcm.instance_group, "default");
    ck_assert_str_eq(c.kvcm.instance_id, "{model}_{block_tokens}_{fingerprint}");
    ck_assert_str_eq(c.kvcm.host_ip_port, "");
    ck_assert_int_eq(c.kvcm.storage_type, CONFIG_KVCM_STORAGE_L1P5);
    ck_assert_str_eq(config_kvcm_storage_type_name(c.kvcm.storage_type), "ST_EVENT_REPORT_L1P5");
    ck_assert_str_eq(config_kvcm_storage_type_name(CONFIG_KVCM_STORAGE_L2), "ST_EVENT_REPORT_L2");
    ck_assert_str_eq(config_kvcm_storage_type_name(2), "");
    ck_assert_str_eq(config_kvcm_storage_type_name(-1), "");
    ck_assert_str_eq(c.kvcm.medium_hbm, "hbm");
    ck_assert_str_eq(c.kvcm.medium_host, "dram");
    ck_assert_str_eq(c.kvcm.spec_name, "rtp_llm_hbm_{block_tokens}");
    ck_assert_str_eq(c.kvcm.location_uri, "rtp-llm://{host_ip_port}/{medium}?size={block_bytes}");
    ck_assert_uint_eq(c.kvcm.request_timeout_ms, 1500);
    ck_assert_uint_eq(c.kvcm.connect_timeout_ms, 500);
    ck_assert_uint_eq(c.kvcm.snapshot_timeout_ms, 30000);
    ck_assert_uint_eq(c.kvcm.flush_interval_ms, 20);
    ck_assert_uint_eq(c.kvcm.batch_events, 1000);
    ck_assert_uint_eq(c.kvcm.queue_events, 100000);
    ck_assert_uint_eq(c.kvcm.heartbeat_interval_ms, 1000);
    ck_assert_uint_eq(c.kvcm.retry_base_ms, 500);
    ck_assert_uint_eq(c.kvcm.retry_max_ms, 30000);
    ck_assert_uint_eq(c.kvcm.snapshot_interval_ms, 300000);
    ck_assert_uint_eq(c.kvcm.host_down_timeout_ms, 500);
    ck_assert_uint_eq(c.kvcm.stall_timeout_ms, 60000);
    ck_assert_uint_eq(c.kvcm.query_deadline_ms, 20);
    ck_assert_uint_eq(c.kvcm.query_max_hosts, 8);
    ck_assert_uint_eq(c.kvcm.query_breaker_failures, 5);
    ck_assert_uint_eq(c.kvcm.query_breaker_open_ms, 10000);
    ck_assert_uint_eq(c.kvcm.query_negative_ttl_ms, 1000);
    for (size_t i = 0; i < sizeof c.kvcm.endpoints; i++)
        ck_assert_int_eq(c.kvcm.endpoints[i], 0);
    for (size_t i = 0; i < sizeof c.kvcm.host_ip_port; i++)
        ck_assert_int_eq(c.kvcm.host_ip_port[i], 0);
    for (size_t i = strlen(c.kvcm.location_uri); i < sizeof c.kvcm.location_uri; i++)
        ck_assert_int_eq(c.kvcm.location_uri[i], 0);
    /* The path's tail is zeroed, so equal configs are byte-equal. */
    for (size_t i = strlen(c.socket_path); i < sizeof c.socket_path; i++)
        ck_assert_int_eq(c.socket_path[i], 0);
    for (size_t i = strlen(c.persist_path); i < sizeof c.persist_path; i++)
        ck_assert_int_eq(c.persist_path[i], 0);
    for (size_t i = 0; i < sizeof c.persist_url; i++)
        ck_assert_int_eq(c.persist_url[i], 0);
    for (size_t i = 0; i < sizeof c.persist_socket; i++)
        ck_assert_int_eq(c.persist_socket[i], 0);

    char err[CONFIG_ERR_MAX];
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "defaults invalid: %s", err);
}
END_TEST

/* ---- one good value per option --------------------------------------------- */

enum field_kind { F_STR, F_UINT, F_U32, F_U64, F_DBL, F_INT };

struct good_case {
    const char *section, *key, *value;
    size_t offset;
    enum field_kind kind;
    uint64_t u;
    double d;
    const char *s;
};

#define OFF(f) offsetof(struct kvn_config, f)
#define A10 "aaaaaaaaaa"
#define PATH107 "/tmp/" A10 A10 A10 A10 A10 A10 A10 A10 A10 A10 "aa"
static const char path107[] = PATH107;
static const char path108[] = PATH107 "a";
_Static_assert(sizeof path107 == 108 && sizeof path108 == 109, "107- and 108-byte paths");

static const struct good_case good_cases[] = {
    { "server", "socket_path", "/tmp/kvnode test.sock", OFF(socket_path), F_STR, .s = "/tmp/kvnode test.sock" },
    { "server", "socket_path", "run/k.sock ; trailing comment", OFF(socket_path), F_STR, .s = "run/k.sock" },
    { "server", "socket_path", path107, OFF(socket_path), F_STR, .s = path107 },
    { "server", "socket_mode", "0600", OFF(socket_mode), F_UINT, .u = 0600 },
    { "server", "socket_mode", "777", OFF(socket_mode), F_UINT, .u = 0777 },
    { "server", "socket_group", "root", OFF(socket_group), F_STR, .s = "root" },
    { "server", "socket_group", "0", OFF(socket_group), F_STR, .s = "0" },
    { "server", "allow_uids", "root, 1000 65534", OFF(allow_uids), F_STR, .s = "root, 1000 65534" },
    { "server", "allow_uids", "", OFF(allow_uids), F_STR, .s = "" },
    { "server", "allow_gids", "root,4242", OFF(allow_gids), F_STR, .s = "root,4242" },
    { "server", "max_frame_bytes", "1MiB", OFF(max_frame_bytes), F_U32, .u = MIB },
    { "server", "max_frame_bytes", "4096", OFF(max_frame_bytes), F_U32, .u = 4096 },
    { "server", "max_frame_bytes", "1g", OFF(max_frame_bytes), F_U32, .u = GIB },
    { "server", "max_keys_per_request", "16", OFF(max_keys_per_request), F_U32, .u = 16 },
    { "server", "max_keys_per_request", "1048576", OFF(max_keys_per_request), F_U32, .u = 1048576 },
    { "server", "max_clients", "1", OFF(max_clients), F_U32, .u = 1 },
    { "server", "max_namespaces", "65536", OFF(max_namespaces), F_U32, .u = 65536 },
    { "server", "request_timeout", "250ms", OFF(request_timeout_ms), F_U32, .u = 250 },
    { "server", "request_timeout", "10m", OFF(request_timeout_ms), F_U32, .u = 600000 },
    { "server", "shutdown_timeout", "0", OFF(shutdown_timeout_ms), F_U32, .u = 0 },
    { "server", "frame_timeout", "100ms", OFF(frame_timeout_ms), F_U32, .u = 100 },
    { "server", "frame_timeout", "10m", OFF(frame_timeout_ms), F_U32, .u = 600000 },
    { "server", "max_buffered_input_bytes", "1MiB", OFF(max_buffered_input_bytes), F_U64, .u = MIB },
    { "server", "max_buffered_input_bytes", "1048577", OFF(max_buffered_input_bytes), F_U64, .u = MIB + 1 },
    { "server", "max_buffered_input_bytes", "1TiB", OFF(max_buffered_input_bytes), F_U64, .u = GIB << 10 },
    { "server", "hello_timeout", "100ms", OFF(hello_timeout_ms), F_U32, .u = 100 },
    { "server", "hello_timeout", "10m", OFF(hello_timeout_ms), F_U32, .u = 600000 },
    { "server", "max_buffered_output_bytes", "1MiB", OFF(max_buffered_output_bytes), F_U64, .u = MIB },
    { "server", "max_buffered_output_bytes", "1TiB", OFF(max_buffered_output_bytes), F_U64, .u = GIB << 10 },
    { "server", "worker_stall_timeout", "2s", OFF(worker_stall_timeout_ms), F_U32, .u = 2000 },
    { "server", "worker_stall_timeout", "10m", OFF(worker_stall_timeout_ms), F_U32, .u = 600000 },
    { "memory", "host_bytes", "2GiB", OFF(host_bytes), F_U64, .u = 2 * GIB },
    { "memory", "host_bytes", "3T", OFF(host_bytes), F_U64, .u = 3 * (GIB << 10) },
    { "memory", "slab_bytes", "256KiB", OFF(slab_bytes), F_U64, .u = 256 * KIB },
    { "memory", "slab_bytes", "65792", OFF(slab_bytes), F_U64, .u = 65792 },
    { "memory", "high_watermark", "1", OFF(high_watermark), F_DBL, .d = 1.0 },
    { "memory", "high_watermark", "0.5", OFF(high_watermark), F_DBL, .d = 0.5 },
    { "memory", "low_watermark", "0", OFF(low_watermark), F_DBL, .d = 0.0 },
    { "memory", "low_watermark", ".25", OFF(low_watermark), F_DBL, .d = 0.25 },
    { "memory", "pin_host", "off", OFF(pin_host), F_INT, .u = CONFIG_PIN_OFF },
    { "memory", "pin_host", "ON", OFF(pin_host), F_INT, .u = CONFIG_PIN_ON },
    { "memory", "pin_host", "auto", OFF(pin_host), F_INT, .u = CONFIG_PIN_AUTO },
    { "memory", "numa", "off", OFF(numa), F_INT, .u = CONFIG_NUMA_OFF },
    { "memory", "numa", "auto", OFF(numa), F_INT, .u = CONFIG_NUMA_AUTO },
    { "memory", "namespace_quota", "0", OFF(namespace_quota), F_U64, .u = 0 },
    { "memory", "namespace_quota", "8MiB", OFF(namespace_quota), F_U64, .u = 8 * MIB },
    { "memory", "namespace_quota", "65537", OFF(namespace_quota), F_U64, .u = 65537 },
    { "memory", "namespace_quota", "2T", OFF(namespace_quota), F_U64, .u = 2 * (GIB << 10) },
    { "memory", "huge_pages", "off", OFF(huge_pages), F_INT, .u = CONFIG_HUGE_OFF },
    { "memory", "huge_pages", "On", OFF(huge_pages), F_INT, .u = CONFIG_HUGE_ON },
    { "memory", "huge_pages", "auto", OFF(huge_pages), F_INT, .u = CONFIG_HUGE_AUTO },
    { "memory", "pin_chunk_bytes", "1MiB", OFF(pin_chunk_bytes), F_U64, .u = MIB },
    { "memory", "pin_chunk_bytes", "256M", OFF(pin_chunk_bytes), F_U64, .u = 256 * MIB },
    { "memory", "pin_chunk_bytes", "3145728", OFF(pin_chunk_bytes), F_U64, .u = 3 * MIB },
    { "memory", "pin_chunk_bytes", "1TiB", OFF(pin_chunk_bytes), F_U64, .u = GIB << 10 },
    { "hbm", "backend", "auto", OFF(hbm_backend), F_INT, .u = CONFIG_HBM_AUTO },
    { "hbm", "backend", "cuda", OFF(hbm_backend), F_INT, .u = CONFIG_HBM_CUDA },
    { "hbm", "backend", "SIM", OFF(hbm_backend), F_INT, .u = CONFIG_HBM_SIM },
    { "hbm", "backend", "none", OFF(hbm_backend), F_INT, .u = CONFIG_HBM_NONE },
    { "hbm", "bytes", "0", OFF(hbm_bytes), F_U64, .u = 0 },
    { "hbm", "bytes", "16GiB", OFF(hbm_bytes), F_U64, .u = 16 * GIB },
    { "hbm", "bytes", "65537", OFF(hbm_bytes), F_U64, .u = 65537 },   /* whole slabs: validate decides */
    { "hbm", "bytes", "2T", OFF(hbm_bytes), F_U64, .u = 2 * (GIB << 10) },
    { "hbm", "devices", "all", OFF(hbm_devices), F_STR, .s = "all" },
    { "hbm", "devices", "ALL", OFF(hbm_devices), F_STR, .s = "ALL" },
    { "hbm", "devices", "", OFF(hbm_devices), F_STR, .s = "" },
    { "hbm", "devices", "0", OFF(hbm_devices), F_STR, .s = "0" },
    { "hbm", "devices", "0,1 3", OFF(hbm_devices), F_STR, .s = "0,1 3" },
    { "hbm", "devices", "15, 2,\t7", OFF(hbm_devices), F_STR, .s = "15, 2,\t7" },
    { "hbm", "devices", "3 ; the big one", OFF(hbm_devices), F_STR, .s = "3" },
    { "hbm", "high_watermark", "1", OFF(hbm_high_watermark), F_DBL, .d = 1.0 },
    { "hbm", "high_watermark", "0.75", OFF(hbm_high_watermark), F_DBL, .d = 0.75 },
    { "hbm", "low_watermark", "0", OFF(hbm_low_watermark), F_DBL, .d = 0.0 },
    { "hbm", "low_watermark", ".5", OFF(hbm_low_watermark), F_DBL, .d = 0.5 },
    { "hbm", "required", "on", OFF(hbm_required), F_INT, .u = 1 },
    { "hbm", "required", "Off", OFF(hbm_required), F_INT, .u = 0 },
    { "hbm", "copy_batch_bytes", "1MiB", OFF(hbm_copy_batch_bytes), F_U64, .u = MIB },
    { "hbm", "copy_batch_bytes", "4GiB", OFF(hbm_copy_batch_bytes), F_U64, .u = 4 * GIB },
    { "hbm", "copy_batch_bytes", "1048577", OFF(hbm_copy_batch_bytes), F_U64, .u = MIB + 1 },
    { "hbm", "release_timeout", "0", OFF(hbm_release_timeout_ms), F_U32, .u = 0 },
    { "hbm", "release_timeout", "10m", OFF(hbm_release_timeout_ms), F_U32, .u = 600000 },
    { "hbm", "release_timeout", "250ms", OFF(hbm_release_timeout_ms), F_U32, .u = 250 },
    { "hbm", "alloc_retry", "0", OFF(hbm_alloc_retry_ms), F_U32, .u = 0 },
    { "hbm", "alloc_retry", "10m", OFF(hbm_alloc_retry_ms), F_U32, .u = 600000 },
    { "leases", "read_ttl", "1h", OFF(read_lease_ttl_ms), F_U32, .u = 3600000 },
    { "leases", "write_ttl", "10ms", OFF(write_lease_ttl_ms), F_U32, .u = 10 },
    { "leases", "write_ttl", "45s", OFF(write_lease_ttl_ms), F_U32, .u = 45000 },
    { "leases", "reaper_interval", "1m", OFF(reaper_interval_ms), F_U32, .u = 60000 },
    { "leases", "reaper_interval", "100", OFF(reaper_interval_ms), F_U32, .u = 100 },
    { "leases", "max_per_client", "1048576", OFF(max_leases_per_client), F_U32, .u = 1048576 },
    { "log", "level", "debug", OFF(log_level), F_INT, .u = LOG_LEVEL_DEBUG },
    { "log", "level", "Error", OFF(log_level), F_INT, .u = LOG_LEVEL_ERROR },
    { "admin", "listen", "off", OFF(admin_listen), F_STR, .s = "off" },
    { "admin", "listen", "127.0.0.1:0", OFF(admin_listen), F_STR, .s = "127.0.0.1:0" },
    { "admin", "listen", "0.0.0.0:65535", OFF(admin_listen), F_STR, .s = "0.0.0.0:65535" },
    { "admin", "listen", "localhost:9180", OFF(admin_listen), F_STR, .s = "localhost:9180" },
    { "admin", "listen", "[::1]:9180", OFF(admin_listen), F_STR, .s = "[::1]:9180" },
    { "admin", "listen", "unix:/run/kvnode/admin.sock", OFF(admin_listen), F_STR, .s = "unix:/run/kvnode/admin.sock" },
    { "admin", "max_connections", "1", OFF(admin_max_connections), F_U32, .u = 1 },
    { "admin", "max_connections", "4096", OFF(admin_max_connections), F_U32, .u = 4096 },
    { "admin", "request_timeout", "100ms", OFF(admin_request_timeout_ms), F_U32, .u = 100 },
    { "admin", "request_timeout", "10m", OFF(admin_request_timeout_ms), F_U32, .u = 600000 },
    { "persist", "backend", "off", OFF(persist_backend), F_INT, .u = CONFIG_BACKEND_OFF },
    { "persist", "backend", "file", OFF(persist_backend), F_INT, .u = CONFIG_BACKEND_FILE },
    { "persist", "backend", "v6d", OFF(persist_backend), F_INT, .u = CONFIG_BACKEND_V6D },
    { "persist", "backend", "V6D", OFF(persist_backend), F_INT, .u = CONFIG_BACKEND_V6D },
    { "persist", "policy", "write_through", OFF(persist_policy), F_INT, .u = CONFIG_POLICY_WRITE_THROUGH },
    { "persist", "policy", "write_back", OFF(persist_policy), F_INT, .u = CONFIG_POLICY_WRITE_BACK },
    { "persist", "policy", "Off", OFF(persist_policy), F_INT, .u = CONFIG_POLICY_OFF },
    { "persist", "path", "/data/kvnode", OFF(persist_path), F_STR, .s = "/data/kvnode" },
    { "persist", "path", "var", OFF(persist_path), F_STR, .s = "var" },
    { "persist", "path", "/mnt/with space/kv ; comment", OFF(persist_path), F_STR, .s = "/mnt/with space/kv" },
    { "persist", "path", "", OFF(persist_path), F_STR, .s = "" },   /* validate decides */
    { "persist", "path", PATH107 "/longer/than/a/socket/path", OFF(persist_path), F_STR,
      .s = PATH107 "/longer/than/a/socket/path" },
    { "persist", "capacity", "0", OFF(persist_capacity), F_U64, .u = 0 },
    { "persist", "capacity", "100GiB", OFF(persist_capacity), F_U64, .u = 100 * GIB },
    { "persist", "capacity", "4097", OFF(persist_capacity), F_U64, .u = 4097 },
    { "persist", "fsync", "never", OFF(persist_fsync), F_INT, .u = 0 },
    { "persist", "fsync", "batch", OFF(persist_fsync), F_INT, .u = 1 },
    { "persist", "fsync", "ALWAYS", OFF(persist_fsync), F_INT, .u = 2 },
    { "persist", "segment_bytes", "1MiB", OFF(persist_segment_bytes), F_U64, .u = 1u << 20 },
    { "persist", "segment_bytes", "1GiB", OFF(persist_segment_bytes), F_U64, .u = GIB },
    { "persist", "direct_io", "auto", OFF(persist_direct_io), F_INT, .u = 0 },
    { "persist", "direct_io", "on", OFF(persist_direct_io), F_INT, .u = 1 },
    { "persist", "direct_io", "OFF", OFF(persist_direct_io), F_INT, .u = 2 },
    { "persist", "workers", "1", OFF(persist_workers), F_U32, .u = 1 },
    { "persist", "workers", "32", OFF(persist_workers), F_U32, .u = 32 },
    { "persist", "queue", "16", OFF(persist_queue), F_U32, .u = 16 },
    { "persist", "queue", "1048576", OFF(persist_queue), F_U32, .u = 1048576 },
    { "persist", "url", "http://127.0.0.1:8080", OFF(persist_url), F_STR, .s = "http://127.0.0.1:8080" },
    { "persist", "url", "https://kvs.example/v1/", OFF(persist_url), F_STR, .s = "https://kvs.example/v1/" },
    { "persist", "url", "", OFF(persist_url), F_STR, .s = "" },
    { "persist", "socket_path", "/run/v6d/v6d.sock", OFF(persist_socket), F_STR, .s = "/run/v6d/v6d.sock" },
    { "persist", "socket_path", path107, OFF(persist_socket), F_STR, .s = path107 },
    { "persist", "socket_path", "", OFF(persist_socket), F_STR, .s = "" },
    { "persist", "connect_timeout", "10ms", OFF(persist_connect_timeout_ms), F_U32, .u = 10 },
    { "persist", "connect_timeout", "1m", OFF(persist_connect_timeout_ms), F_U32, .u = 60000 },
    { "persist", "timeout", "10ms", OFF(persist_timeout_ms), F_U32, .u = 10 },
    { "persist", "timeout", "10m", OFF(persist_timeout_ms), F_U32, .u = 600000 },
    { "persist", "timeout", "2500", OFF(persist_timeout_ms), F_U32, .u = 2500 },
    { "persist", "lookup", "auto", OFF(persist_lookup), F_INT, .u = CONFIG_LOOKUP_AUTO },
    { "persist", "lookup", "on", OFF(persist_lookup), F_INT, .u = CONFIG_LOOKUP_ON },
    { "persist", "lookup", "OFF", OFF(persist_lookup), F_INT, .u = CONFIG_LOOKUP_OFF },
    { "persist", "lookup_negative_ttl", "0", OFF(persist_lookup_negative_ttl_ms), F_U32, .u = 0 },
    { "persist", "lookup_negative_ttl", "200ms", OFF(persist_lookup_negative_ttl_ms), F_U32, .u = 200 },
    { "persist", "lookup_negative_ttl", "1h", OFF(persist_lookup_negative_ttl_ms), F_U32, .u = 3600000 },
    { "persist", "object_namespace", "kvnode", OFF(persist_object_namespace), F_STR, .s = "kvnode" },
    { "persist", "object_namespace", "rtp_llm", OFF(persist_object_namespace), F_STR, .s = "rtp_llm" },
    { "persist", "tombstones", "0", OFF(persist_tombstones), F_U32, .u = 0 },
    { "persist", "tombstones", "16777216", OFF(persist_tombstones), F_U32, .u = 16777216 },
    { "persist", "backend", "redis", OFF(persist_backend), F_INT, .u = CONFIG_BACKEND_REDIS },
    { "persist", "nodes", "10.0.0.1:6379,10.0.0.2:6380", OFF(persist_nodes), F_STR,
      .s = "10.0.0.1:6379,10.0.0.2:6380" },
    { "persist", "user", "kvnode", OFF(persist_user), F_STR, .s = "kvnode" },
    { "persist", "password_file", "/etc/kvnode/redis.pw", OFF(persist_password_file), F_STR,
      .s = "/etc/kvnode/redis.pw" },
    { "kvcm", "enabled", "on", OFF(kvcm.enabled), F_INT, .u = 1 },
    { "kvcm", "enabled", "OFF", OFF(kvcm.enabled), F_INT, .u = 0 },
    { "kvcm", "endpoints", "http://10.0.0.7:6382", OFF(kvcm.endpoints), F_STR, .s = "http://10.0.0.7:6382" },
    { "kvcm", "endpoints", "http://kvcm-0:6382, http://kvcm-1:6382 https://[fd00::1]:6382/base/", OFF(kvcm.endpoints),
      F_STR, .s = "http://kvcm-0:6382, http://kvcm-1:6382 https://[fd00::1]:6382/base/" },
    { "kvcm", "endpoints", "HTTP://kvcm.example", OFF(kvcm.endpoints), F_STR, .s = "HTTP://kvcm.example" },
    { "kvcm", "endpoints", "", OFF(kvcm.endpoints), F_STR, .s = "" },
    { "kvcm", "instance_group", "prod-a", OFF(kvcm.instance_group), F_STR, .s = "prod-a" },
    { "kvcm", "instance_group", "", OFF(kvcm.instance_group), F_STR, .s = "" },
    { "kvcm", "instance_id", "{model}-{dtype}-tp{tp_size}-{fingerprint}_{block_tokens}", OFF(kvcm.instance_id), F_STR,
      .s = "{model}-{dtype}-tp{tp_size}-{fingerprint}_{block_tokens}" },
    { "kvcm", "instance_id", "fixed_id", OFF(kvcm.instance_id), F_STR, .s = "fixed_id" },
    { "kvcm", "host_ip_port", "10.0.0.5:8088", OFF(kvcm.host_ip_port), F_STR, .s = "10.0.0.5:8088" },
    { "kvcm", "host_ip_port", "node7.example.com:1", OFF(kvcm.host_ip_port), F_STR, .s = "node7.example.com:1" },
    { "kvcm", "host_ip_port", "[fd00::5]:65535", OFF(kvcm.host_ip_port), F_STR, .s = "[fd00::5]:65535" },
    { "kvcm", "host_ip_port", "kv_node-3:8088", OFF(kvcm.host_ip_port), F_STR, .s = "kv_node-3:8088" },
    { "kvcm", "host_ip_port", "", OFF(kvcm.host_ip_port), F_STR, .s = "" },
    { "kvcm", "storage_type", "ST_EVENT_REPORT_L2", OFF(kvcm.storage_type), F_INT, .u = CONFIG_KVCM_STORAGE_L2 },
    { "kvcm", "storage_type", "st_event_report_l1p5", OFF(kvcm.storage_type), F_INT, .u = CONFIG_KVCM_STORAGE_L1P5 },
    { "kvcm", "medium_hbm", "gpu", OFF(kvcm.medium_hbm), F_STR, .s = "gpu" },
    { "kvcm", "medium_host", "host_dram", OFF(kvcm.medium_host), F_STR, .s = "host_dram" },
    { "kvcm", "spec_name", "kvnode_{model}_{block_bytes}", OFF(kvcm.spec_name), F_STR, .s = "kvnode_{model}_{block_bytes}" },
    { "kvcm", "location_uri", "kvnode://{host_ip_port}/{medium}/{key}?size={block_bytes}", OFF(kvcm.location_uri),
      F_STR, .s = "kvnode://{host_ip_port}/{medium}/{key}?size={block_bytes}" },
    { "kvcm", "request_timeout", "10ms", OFF(kvcm.request_timeout_ms), F_U32, .u = 10 },
    { "kvcm", "request_timeout", "10m", OFF(kvcm.request_timeout_ms), F_U32, .u = 600000 },
    { "kvcm", "connect_timeout", "1m", OFF(kvcm.connect_timeout_ms), F_U32, .u = 60000 },
    { "kvcm", "snapshot_timeout", "2m", OFF(kvcm.snapshot_timeout_ms), F_U32, .u = 120000 },
    { "kvcm", "flush_interval", "1", OFF(kvcm.flush_interval_ms), F_U32, .u = 1 },
    { "kvcm", "flush_interval", "10s", OFF(kvcm.flush_interval_ms), F_U32, .u = 10000 },
    { "kvcm", "batch_events", "1", OFF(kvcm.batch_events), F_U32, .u = 1 },
    { "kvcm", "batch_events", "16384", OFF(kvcm.batch_events), F_U32, .u = 16384 },
    { "kvcm", "queue_events", "1", OFF(kvcm.queue_events), F_U32, .u = 1 },
    { "kvcm", "queue_events", "1048576", OFF(kvcm.queue_events), F_U32, .u = 1048576 },
    { "kvcm", "heartbeat_interval", "10ms", OFF(kvcm.heartbeat_interval_ms), F_U32, .u = 10 },
    { "kvcm", "heartbeat_interval", "1m", OFF(kvcm.heartbeat_interval_ms), F_U32, .u = 60000 },
    { "kvcm", "retry_base", "1ms", OFF(kvcm.retry_base_ms), F_U32, .u = 1 },
    { "kvcm", "retry_max", "1h", OFF(kvcm.retry_max_ms), F_U32, .u = 3600000 },
    { "kvcm", "snapshot_interval", "100ms", OFF(kvcm.snapshot_interval_ms), F_U32, .u = 100 },
    { "kvcm", "snapshot_interval", "24h", OFF(kvcm.snapshot_interval_ms), F_U32, .u = 86400000 },
    { "kvcm", "host_down_timeout", "10ms", OFF(kvcm.host_down_timeout_ms), F_U32, .u = 10 },
    { "kvcm", "host_down_timeout", "1m", OFF(kvcm.host_down_timeout_ms), F_U32, .u = 60000 },
    { "kvcm", "stall_timeout", "100ms", OFF(kvcm.stall_timeout_ms), F_U32, .u = 100 },
    { "kvcm", "stall_timeout", "1h", OFF(kvcm.stall_timeout_ms), F_U32, .u = 3600000 },
    { "kvcm", "query_deadline", "1ms", OFF(kvcm.query_deadline_ms), F_U32, .u = 1 },
    { "kvcm", "query_deadline", "10s", OFF(kvcm.query_deadline_ms), F_U32, .u = 10000 },
    { "kvcm", "query_max_hosts", "1", OFF(kvcm.query_max_hosts), F_U32, .u = 1 },
    { "kvcm", "query_max_hosts", "64", OFF(kvcm.query_max_hosts), F_U32, .u = 64 },
    { "kvcm", "query_breaker_failures", "1000", OFF(kvcm.query_breaker_failures), F_U32, .u = 1000 },
    { "kvcm", "query_breaker_open", "10ms", OFF(kvcm.query_breaker_open_ms), F_U32, .u = 10 },
    { "kvcm", "query_breaker_open", "10m", OFF(kvcm.query_breaker_open_ms), F_U32, .u = 600000 },
    { "kvcm", "query_negative_ttl", "1ms", OFF(kvcm.query_negative_ttl_ms), F_U32, .u = 1 },
    { "kvcm", "query_negative_ttl", "10m", OFF(kvcm.query_negative_ttl_ms), F_U32, .u = 600000 },
};
#define NGOOD (sizeof good_cases / sizeof good_cases[0])

static void assert_field(const struct kvn_config *c, const struct good_case *g)
{
    const char *field = (const char *)c + g->offset;
    switch (g->kind) {
    case F_STR:
        ck_assert_str_eq(field, g->s);
        break;
    case F_UINT: {
        unsigned v;
        memcpy(&v, field, sizeof v);
        ck_assert_uint_eq(v, g->u);
        break;
    }
    case F_U32: {
        uint32_t v;
        memcpy(&v, field, sizeof v);
        ck_assert_uint_eq(v, g->u);
        break;
    }
    case F_U64: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        ck_assert_uint_eq(v, g->u);
        break;
    }
    case F_DBL: {
        double v;
        memcpy(&v, field, sizeof v);
        ck_assert_double_eq(v, g->d);
        break;
    }
    case F_INT: {
        int v;
        memcpy(&v, field, sizeof v);
        ck_assert_int_eq(v, (int)g->u);
        break;
    }
    }
}

START_TEST(test_good_value_file)
{
    const struct good_case *g = &good_cases[_i];
    char text[512], err[CONFIG_ERR_MAX];
    snprintf(text, sizeof text, "[%s]\n%s = %s\n", g->section, g->key, g->value);
    struct kvn_config c;
    config_defaults(&c);
    int rc = load_text(&c, text, err, sizeof err, NULL, 0);
    ck_assert_msg(rc == 0, "%s.%s = %s: %s", g->section, g->key, g->value, err);
    assert_field(&c, g);
}
END_TEST

START_TEST(test_good_value_override)
{
    const struct good_case *g = &good_cases[_i];
    char assign[512], err[CONFIG_ERR_MAX];
    /* An override has no inline comments: strip the file-only one. */
    char value[256];
    snprintf(value, sizeof value, "%s", g->value);
    char *semi = strstr(value, " ;");
    if (semi)
        *semi = '\0';
    snprintf(assign, sizeof assign, "%s.%s=%s", g->section, g->key, value);
    struct kvn_config c;
    config_defaults(&c);
    int rc = config_apply_override(&c, assign, err, sizeof err);
    ck_assert_msg(rc == 0, "%s: %s", assign, err);
    assert_field(&c, g);
}
END_TEST

/* ---- one bad value per option ---------------------------------------------- */

struct bad_case {
    const char *section, *key, *value;
    const char *expect;   /* also in the message */
};

static const struct bad_case bad_cases[] = {
    { "server", "socket_path", "", "empty path" },
    { "server", "socket_path", path108, "shorter than 108 bytes" },
    { "server", "socket_mode", "1777", "'1777'" },
    { "server", "socket_mode", "0o660", "'0o660'" },
    { "server", "socket_mode", "u=rw", "'u=rw'" },
    { "server", "socket_group", "no-such-group-kvn", "unknown group 'no-such-group-kvn'" },
    { "server", "allow_uids", "root nobody-kvn-x", "unknown user 'nobody-kvn-x'" },
    { "server", "allow_uids", "-5", "unknown user '-5'" },
    { "server", "allow_gids", "root,no-such-group-kvn", "unknown group 'no-such-group-kvn'" },
    { "server", "max_frame_bytes", "4095", "out of range (expected 4KiB..1GiB)" },
    { "server", "max_frame_bytes", "2GiB", "out of range" },
    { "server", "max_frame_bytes", "64 MiB", "'64 MiB'" },
    { "server", "max_keys_per_request", "0", "1..1048576" },
    { "server", "max_keys_per_request", "1048577", "'1048577'" },
    { "server", "max_keys_per_request", "ten", "'ten'" },
    { "server", "max_clients", "65537", "1..65536" },
    { "server", "max_clients", "-1", "'-1'" },
    { "server", "max_namespaces", "0", "'0'" },
    { "server", "request_timeout", "9ms", "out of range (expected 10ms..10m)" },
    { "server", "request_timeout", "11m", "'11m'" },
    { "server", "request_timeout", "5 s", "invalid duration '5 s'" },
    { "server", "shutdown_timeout", "601s", "out of range (expected 0s..10m)" },
    { "server", "shutdown_timeout", "-1", "invalid duration '-1'" },
    { "server", "frame_timeout", "99ms", "out of range (expected 100ms..10m)" },
    { "server", "frame_timeout", "11m", "'11m'" },
    { "server", "frame_timeout", "0", "out of range" },
    { "server", "max_buffered_input_bytes", "1023KiB", "out of range (expected 1MiB..1TiB)" },
    { "server", "max_buffered_input_bytes", "2TiB", "out of range (expected 1MiB..1TiB)" },
    { "server", "max_buffered_input_bytes", "1.5G", "invalid size '1.5G'" },
    { "server", "hello_timeout", "99ms", "out of range (expected 100ms..10m)" },
    { "server", "hello_timeout", "0", "out of range" },
    { "server", "max_buffered_output_bytes", "1023KiB", "out of range (expected 1MiB..1TiB)" },
    { "server", "max_buffered_output_bytes", "2TiB", "out of range (expected 1MiB..1TiB)" },
    { "server", "worker_stall_timeout", "1999ms", "out of range (expected 2s..10m)" },
    { "server", "worker_stall_timeout", "11m", "out of range (expected 2s..10m)" },
    { "server", "worker_stall_timeout", "0", "out of range" },
    { "memory", "host_bytes", "32KiB", "at least 64KiB" },
    { "memory", "host_bytes", "1.5G", "invalid size '1.5G'" },
    { "memory", "host_bytes", "20EiB", "too large" },
    { "memory", "host_bytes", "", "invalid size ''" },
    { "memory", "slab_bytes", "65600", "not a multiple of 256" },
    { "memory", "slab_bytes", "2GiB", "out of range (expected 64KiB..1GiB)" },
    { "memory", "high_watermark", "1.5", "invalid value '1.5' (expected a fraction in (0, 1])" },
    { "memory", "high_watermark", "0", "(0, 1]" },
    { "memory", "high_watermark", "nan", "'nan'" },
    { "memory", "high_watermark", "inf", "'inf'" },
    { "memory", "high_watermark", "0x1p-1", "'0x1p-1'" },
    { "memory", "high_watermark", "95%", "'95%'" },
    { "memory", "low_watermark", "1", "[0, 1)" },
    { "memory", "low_watermark", "-0.1", "'-0.1'" },
    { "memory", "low_watermark", "0.5 # half", "'#' starts a comment only at the beginning" },
    { "memory", "pin_host", "yes", "expected auto, on or off" },
    { "memory", "huge_pages", "2MiB", "expected off, auto or on" },
    { "memory", "numa", "interleave", "expected auto or off" },
    { "memory", "namespace_quota", "1.5G", "invalid size '1.5G'" },
    { "memory", "namespace_quota", "-1", "invalid size '-1'" },
    { "memory", "namespace_quota", "20EiB", "too large" },
    { "memory", "namespace_quota", "", "invalid size ''" },
    { "memory", "pin_chunk_bytes", "512KiB", "size '512KiB' out of range (expected 1MiB..1TiB)" },
    { "memory", "pin_chunk_bytes", "0", "out of range (expected 1MiB..1TiB)" },
    { "memory", "pin_chunk_bytes", "2TiB", "'2TiB' out of range" },
    { "memory", "pin_chunk_bytes", "1048577", "size '1048577' is not a multiple of 1048576 bytes" },
    { "memory", "pin_chunk_bytes", "1.5G", "invalid size '1.5G'" },
    { "hbm", "backend", "gpu", "invalid value 'gpu' (expected auto, cuda, sim or none)" },
    { "hbm", "backend", "", "invalid value '' (expected auto, cuda, sim or none)" },
    { "hbm", "backend", "off", "expected auto, cuda, sim or none" },
    { "hbm", "bytes", "-1", "invalid size '-1'" },
    { "hbm", "bytes", "8 GiB", "invalid size '8 GiB'" },
    { "hbm", "bytes", "20EiB", "too large" },
    { "hbm", "bytes", "", "invalid size ''" },
    { "hbm", "devices", "16", "device '16' out of range (device ordinals are 0..15)" },
    { "hbm", "devices", "0,1,99999999999999999999999", "device '99999999999999999999999' out of range" },
    { "hbm", "devices", "0,1,1", "device 1 listed twice" },
    { "hbm", "devices", "2 02", "device 2 listed twice" },
    { "hbm", "devices", "0,gpu1", "invalid device 'gpu1' (expected all, or device ordinals 0..15 separated by "
      "commas or blanks, e.g. 0,1)" },
    { "hbm", "devices", "-1", "invalid device '-1'" },
    { "hbm", "devices", "0-3", "invalid device '0-3'" },
    { "hbm", "devices", "0;1", "invalid device '0;1'" },
    { "hbm", "devices", "all,0", "'all' cannot be combined with device ordinals" },
    { "hbm", "devices", "1 all", "'all' cannot be combined with device ordinals" },
    { "hbm", "devices", ", ,", "no device in ', ,'" },
    { "hbm", "high_watermark", "0", "invalid value '0' (expected a fraction in (0, 1])" },
    { "hbm", "high_watermark", "1.01", "(0, 1]" },
    { "hbm", "high_watermark", "90%", "'90%'" },
    { "hbm", "low_watermark", "1", "invalid value '1' (expected a fraction in [0, 1))" },
    { "hbm", "low_watermark", "nan", "'nan'" },
    { "hbm", "required", "yes", "invalid value 'yes' (expected off or on)" },
    { "hbm", "required", "auto", "expected off or on" },
    { "hbm", "copy_batch_bytes", "1023KiB", "size '1023KiB' out of range (expected 1MiB..4GiB)" },
    { "hbm", "copy_batch_bytes", "4097MiB", "out of range (expected 1MiB..4GiB)" },
    { "hbm", "copy_batch_bytes", "0", "out of range" },
    { "hbm", "release_timeout", "601s", "out of range (expected 0s..10m)" },
    { "hbm", "release_timeout", "soon", "invalid duration 'soon'" },
    { "hbm", "alloc_retry", "11m", "out of range" },
    { "leases", "read_ttl", "5ms", "out of range (expected 10ms..1h)" },
    { "leases", "read_ttl", "1.5s", "'1.5s'" },
    { "leases", "write_ttl", "2h", "'2h'" },
    { "leases", "write_ttl", "0", "out of range" },
    { "leases", "reaper_interval", "61s", "out of range (expected 10ms..1m)" },
    { "leases", "reaper_interval", "1d", "invalid duration '1d'" },
    { "leases", "max_per_client", "0", "1..1048576" },
    { "log", "level", "verbose", "expected error, warn, info or debug" },
    { "admin", "listen", "9180", "expected off, unix:PATH or HOST:PORT" },
    { "admin", "listen", "127.0.0.1:65536", "the port must be 0..65535" },
    { "admin", "listen", "127.0.0.1:", "the port must be 0..65535" },
    { "admin", "listen", "127.0.0.1:http", "the port must be 0..65535" },
    { "admin", "listen", "example.com:9180", "the host must be an IPv4 address" },
    { "admin", "listen", "::1:9180", "the host must be an IPv4 address" },
    { "admin", "listen", "[::1:9180", "in brackets" },
    { "admin", "listen", "unix:", "empty socket path" },
    { "admin", "listen", "unix:" PATH107 "a", "it must be shorter than 108 bytes" },
    { "admin", "max_connections", "0", "invalid value '0' (expected an integer in 1..4096)" },
    { "admin", "max_connections", "4097", "1..4096" },
    { "admin", "request_timeout", "50ms", "out of range (expected 100ms..10m)" },
    { "admin", "request_timeout", "1h", "'1h'" },
    { "persist", "backend", "nfs", "invalid value 'nfs' (expected off, file, v6d or redis)" },
    { "persist", "backend", "", "invalid value '' (expected off, file, v6d or redis)" },
    { "persist", "backend", "1", "expected off, file, v6d or redis" },
    { "persist", "nodes", "a:1 b:2", "blanks and control characters are not allowed" },
    { "persist", "policy", "write-through", "invalid value 'write-through' (expected write_through, write_back or off)" },
    { "persist", "policy", "lazy", "expected write_through, write_back or off" },
    { "persist", "fsync", "sometimes", "invalid value 'sometimes' (expected never, batch or always)" },
    { "persist", "fsync", "2", "expected never, batch or always" },
    { "persist", "segment_bytes", "64KiB", "out of range" },
    { "persist", "direct_io", "maybe", "invalid value 'maybe' (expected auto, on or off)" },
    { "persist", "workers", "0", "invalid value '0' (expected an integer in 1..32)" },
    { "persist", "workers", "33", "1..32" },
    { "persist", "workers", "two", "'two'" },
    { "persist", "queue", "15", "invalid value '15' (expected an integer in 16..1048576)" },
    { "persist", "queue", "1048577", "16..1048576" },
    { "persist", "capacity", "1.5T", "invalid size '1.5T'" },
    { "persist", "capacity", "-1", "invalid size '-1'" },
    { "persist", "capacity", "20EiB", "too large" },
    { "persist", "socket_path", path108, "shorter than 108 bytes" },
    { "persist", "connect_timeout", "9ms", "out of range (expected 10ms..1m)" },
    { "persist", "connect_timeout", "61s", "'61s'" },
    { "persist", "connect_timeout", "1.5s", "invalid duration '1.5s'" },
    { "persist", "timeout", "0", "out of range (expected 10ms..10m)" },
    { "persist", "timeout", "11m", "'11m'" },
    { "persist", "lookup", "yes", "invalid value 'yes' (expected auto, on or off)" },
    { "persist", "lookup_negative_ttl", "61m", "out of range (expected 0s..1h)" },
    { "persist", "lookup_negative_ttl", "-1s", "'-1s'" },
    { "persist", "tombstones", "16777217", "0..16777216" },
    { "persist", "object_namespace", "rtp llm", "blanks and control characters are not allowed" },
    { "kvcm", "enabled", "yes", "invalid value 'yes' (expected off or on)" },
    { "kvcm", "enabled", "", "invalid value '' (expected off or on)" },
    { "kvcm", "endpoints", "kvcm:6382", "invalid endpoint 'kvcm:6382' (expected http://HOST:PORT or https://HOST:PORT" },
    { "kvcm", "endpoints", "http://a:1, ftp://b:2", "invalid endpoint 'ftp://b:2'" },
    { "kvcm", "endpoints", "http://a:0", "invalid endpoint 'http://a:0'" },
    { "kvcm", "endpoints", "http://a:65536", "invalid endpoint 'http://a:65536'" },
    { "kvcm", "endpoints", "http://", "invalid endpoint 'http://'" },
    { "kvcm", "endpoints", "http://:6382", "invalid endpoint 'http://:6382'" },
    { "kvcm", "endpoints", "http://a:1?x=1", "invalid endpoint 'http://a:1?x=1'" },
    { "kvcm", "endpoints", "http://[::1:6382", "invalid endpoint 'http://[::1:6382'" },
    { "kvcm", "endpoints", "http://[zz]:6382", "invalid endpoint 'http://[zz]:6382'" },
    { "kvcm", "endpoints", "http://a:1,http://A:1/", "endpoint 'http://A:1' listed twice" },
    { "kvcm", "endpoints", "http://h1 http://h2 http://h3 http://h4 http://h5 http://h6 http://h7 http://h8 http://h9",
      "too many endpoints (at most 8)" },
    { "kvcm", "instance_group", "a b", "invalid value 'a b' (blanks and control characters are not allowed)" },
    { "kvcm", "instance_id", "{model}_{rank}", "unknown placeholder '{rank}' (instance_id may use {model}, {dtype}, "
      "{block_tokens}, {tp_size} and {fingerprint})" },
    { "kvcm", "instance_id", "{model}_{key}", "unavailable placeholder '{key}' (instance_id may use" },
    { "kvcm", "instance_id", "{model", "invalid template '{model': '{' without '}'" },
    { "kvcm", "instance_id", "model}", "invalid template 'model}': '}' without '{'" },
    { "kvcm", "instance_id", "{}", "unknown placeholder '{}'" },
    { "kvcm", "instance_id", "{{model}}", "'{' without '}'" },
    { "kvcm", "spec_name", "spec_{medium}", "unavailable placeholder '{medium}' (spec_name may use {model}, {dtype}, "
      "{block_tokens}, {tp_size}, {fingerprint} and {block_bytes})" },
    { "kvcm", "location_uri", "x://{host}/", "unknown placeholder '{host}' (location_uri may use {host_ip_port}, "
      "{medium}, {block_bytes} and {key})" },
    { "kvcm", "location_uri", "x://{model}/", "unavailable placeholder '{model}'" },
    { "kvcm", "host_ip_port", "localhost:8088", "'localhost:8088' is not unique-looking (a name for loopback)" },
    { "kvcm", "host_ip_port", "127.0.0.1:8088", "not unique-looking (a loopback address)" },
    { "kvcm", "host_ip_port", "127.8.9.10:1", "not unique-looking (a loopback address)" },
    { "kvcm", "host_ip_port", "0.0.0.0:8088", "not unique-looking (the unspecified address)" },
    { "kvcm", "host_ip_port", "[::1]:8088", "not unique-looking (a loopback address)" },
    { "kvcm", "host_ip_port", "[::]:8088", "not unique-looking (the unspecified address)" },
    { "kvcm", "host_ip_port", "[::ffff:127.0.0.1]:8088", "not unique-looking (a loopback address)" },
    { "kvcm", "host_ip_port", "LocalHost.:8088", "not unique-looking (a name for loopback)" },
    { "kvcm", "host_ip_port", "node.localhost:8088", "not unique-looking (a name for loopback)" },
    { "kvcm", "host_ip_port", "ip6-localhost:8088", "not unique-looking (a name for loopback)" },
    { "kvcm", "host_ip_port", "node#1:8088", "invalid value 'node#1:8088' (KVCM does not accept '#' in host_ip_port)" },
    { "kvcm", "host_ip_port", "10.0.0.5", "invalid value '10.0.0.5' (expected HOST:PORT with a port 1..65535" },
    { "kvcm", "host_ip_port", "10.0.0.5:", "expected HOST:PORT with a port 1..65535" },
    { "kvcm", "host_ip_port", "10.0.0.5:0", "expected HOST:PORT with a port 1..65535" },
    { "kvcm", "host_ip_port", "10.0.0.5:65536", "expected HOST:PORT with a port 1..65535" },
    { "kvcm", "host_ip_port", "10.0.0.5:http", "expected HOST:PORT with a port 1..65535" },
    { "kvcm", "host_ip_port", ":8088", "expected HOST:PORT with a port 1..65535" },
    { "kvcm", "host_ip_port", "fd00::5:8088", "an IPv6 host goes in brackets" },
    { "kvcm", "host_ip_port", "[fd00::5:8088", "an IPv6 host goes in brackets" },
    { "kvcm", "host_ip_port", "300.1.1.1:80", "the host must be a DNS name, an IPv4 address or [IPv6]" },
    { "kvcm", "host_ip_port", "bad host:80", "the host must be a DNS name" },
    { "kvcm", "host_ip_port", "-node:80", "the host must be a DNS name" },
    { "kvcm", "storage_type", "L2", "invalid value 'L2' (expected ST_EVENT_REPORT_L1P5 or ST_EVENT_REPORT_L2)" },
    { "kvcm", "medium_hbm", "hbm#0", "invalid value 'hbm#0' (KVCM does not accept '#' in a medium name)" },
    { "kvcm", "medium_host", "dr am", "blanks and control characters are not allowed" },
    { "kvcm", "request_timeout", "9ms", "out of range (expected 10ms..10m)" },
    { "kvcm", "connect_timeout", "61s", "out of range (expected 10ms..1m)" },
    { "kvcm", "snapshot_timeout", "11m", "out of range (expected 10ms..10m)" },
    { "kvcm", "flush_interval", "0", "out of range (expected 1ms..10s)" },
    { "kvcm", "flush_interval", "20 ms", "invalid duration '20 ms'" },
    { "kvcm", "batch_events", "0", "invalid value '0' (expected an integer in 1..16384)" },
    { "kvcm", "batch_events", "16385", "1..16384" },
    { "kvcm", "queue_events", "1048577", "invalid value '1048577' (expected an integer in 1..1048576)" },
    { "kvcm", "heartbeat_interval", "2m", "out of range (expected 10ms..1m)" },
    { "kvcm", "retry_base", "0", "out of range (expected 1ms..1m)" },
    { "kvcm", "retry_max", "2h", "out of range (expected 1ms..1h)" },
    { "kvcm", "snapshot_interval", "99ms", "out of range (expected 100ms..24h)" },
    { "kvcm", "snapshot_interval", "25h", "'25h'" },
    { "kvcm", "host_down_timeout", "5ms", "out of range (expected 10ms..1m)" },
    { "kvcm", "stall_timeout", "99ms", "out of range (expected 100ms..1h)" },
    { "kvcm", "query_deadline", "0", "out of range (expected 1ms..10s)" },
    { "kvcm", "query_deadline", "11s", "'11s'" },
    { "kvcm", "query_max_hosts", "65", "invalid value '65' (expected an integer in 1..64)" },
    { "kvcm", "query_max_hosts", "0", "1..64" },
    { "kvcm", "query_breaker_failures", "1001", "1..1000" },
    { "kvcm", "query_breaker_open", "9ms", "out of range (expected 10ms..10m)" },
    { "kvcm", "query_negative_ttl", "0", "out of range (expected 1ms..10m)" },
};
#define NBAD (sizeof bad_cases / sizeof bad_cases[0])

START_TEST(test_bad_value_file)
{
    const struct bad_case *b = &bad_cases[_i];
    char text[512], err[CONFIG_ERR_MAX], path[256], where[512];
    /* The bad line is line 4. */
    snprintf(text, sizeof text, "# comment\n\n[%s]\n%s = %s\n", b->section, b->key, b->value);
    struct kvn_config c, before;
    config_defaults(&c);
    before = c;
    int rc = load_text(&c, text, err, sizeof err, path, sizeof path);
    ck_assert_msg(rc == -1, "%s.%s = '%s' accepted", b->section, b->key, b->value);
    snprintf(where, sizeof where, "%s:4: [%s] %s: ", path, b->section, b->key);
    ck_assert_msg(strncmp(err, where, strlen(where)) == 0, "error '%s' does not start with '%s'", err, where);
    ck_assert_msg(strstr(err, b->expect), "error '%s' lacks '%s'", err, b->expect);
    ck_assert_uint_eq(count_lines(err), 1);
    /* A failed load leaves the config alone. */
    ck_assert(memcmp(&c, &before, sizeof c) == 0);
}
END_TEST

START_TEST(test_bad_value_override)
{
    const struct bad_case *b = &bad_cases[_i];
    if (strstr(b->value, " #"))
        return;   /* '#' comments are a file-syntax matter */
    char assign[512], err[CONFIG_ERR_MAX], where[128];
    snprintf(assign, sizeof assign, "%s.%s=%s", b->section, b->key, b->value);
    struct kvn_config c, before;
    config_defaults(&c);
    before = c;
    ck_assert_int_eq(config_apply_override(&c, assign, err, sizeof err), -1);
    snprintf(where, sizeof where, "override %s.%s: ", b->section, b->key);
    ck_assert_msg(strncmp(err, where, strlen(where)) == 0, "error '%s' does not start with '%s'", err, where);
    ck_assert_msg(strstr(err, b->expect), "error '%s' lacks '%s'", err, b->expect);
    ck_assert(memcmp(&c, &before, sizeof c) == 0);
}
END_TEST

/* ---- file-level behaviour -------------------------------------------------- */

START_TEST(test_unknown_key_and_section)
{
    char err[CONFIG_ERR_MAX], path[256], want[512];
    struct kvn_config c;
    config_defaults(&c);
    int rc = load_text(&c,
                       "[memory]\n"          /* 1 */
                       "hots_bytes = 1GiB\n" /* 2 */
                       "read_ttl = 5s\n"     /* 3: lives in [leases] */
                       "[cache]\n"           /* 4 */
                       "size = 1\n"          /* 5: not reported again */
                       "[log]\n"             /* 6 */
                       "level = warn\n",     /* 7 */
                       err, sizeof err, path, sizeof path);
    ck_assert_int_eq(rc, -1);
    snprintf(want, sizeof want, "%s:2: [memory] hots_bytes: unknown key", path);
    ck_assert_msg(strstr(err, want), "%s", err);
    snprintf(want, sizeof want, "%s:3: [memory] read_ttl: unknown key (it belongs in [leases])", path);
    ck_assert_msg(strstr(err, want), "%s", err);
    snprintf(want, sizeof want, "%s:4: [cache]: unknown section", path);
    ck_assert_msg(strstr(err, want), "%s", err);
    ck_assert_msg(!strstr(err, ":5:"), "keys of an unknown section reported one by one: %s", err);
    ck_assert_uint_eq(count_lines(err), 3);
}
END_TEST

START_TEST(test_key_outside_section)
{
    char err[CONFIG_ERR_MAX], path[256], want[512];
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "host_bytes = 2GiB\n[memory]\n", err, sizeof err, path, sizeof path), -1);
    snprintf(want, sizeof want, "%s:1: host_bytes: key outside any section", path);
    ck_assert_msg(strstr(err, want), "%s", err);
}
END_TEST

START_TEST(test_syntax_errors)
{
    char err[CONFIG_ERR_MAX], path[256], want[512];
    struct kvn_config c;
    config_defaults(&c);
    int rc = load_text(&c,
                       "[server]\n"            /* 1 */
                       "max_clients\n"         /* 2: no '=' */
                       "[memory\n"             /* 3: no ']' */
                       "host_bytes = 1\n"      /* 4: under the broken header: ignored */
                       "[leases] read_ttl=1\n" /* 5: text after the header */
                       "[log]\n"               /* 6 */
                       "level = debug\n",      /* 7 */
                       err, sizeof err, path, sizeof path);
    ck_assert_int_eq(rc, -1);
    snprintf(want, sizeof want, "%s:2: syntax error", path);
    ck_assert_msg(strstr(err, want), "%s", err);
    snprintf(want, sizeof want, "%s:3: syntax error: missing ']'", path);
    ck_assert_msg(strstr(err, want), "%s", err);
    snprintf(want, sizeof want, "%s:5: syntax error: unexpected text after section header", path);
    ck_assert_msg(strstr(err, want), "%s", err);
    ck_assert_uint_eq(count_lines(err), 3);
}
END_TEST

START_TEST(test_many_errors_all_reported)
{
    char err[CONFIG_ERR_MAX], path[256], want[512];
    struct kvn_config c;
    config_defaults(&c);
    int rc = load_text(&c,
                       "[server]\n"                 /* 1 */
                       "max_clients = 0\n"          /* 2 */
                       "socket_mode = 999\n"        /* 3 */
                       "[memory]\n"                 /* 4 */
                       "host_bytes = 1GiB\n"        /* 5: fine */
                       "high_watermark = 1.5\n"     /* 6 */
                       "bogus = 1\n"                /* 7 */
                       "[nope]\n"                   /* 8 */
                       "[leases]\n"                 /* 9 */
                       "read_ttl = forever\n"       /* 10 */
                       "[log]\n"                    /* 11 */
                       "level = loud\n",            /* 12 */
                       err, sizeof err, path, sizeof path);
    ck_assert_int_eq(rc, -1);
    const char *expect[] = {
        ":2: [server] max_clients: ", ":3: [server] socket_mode: ", ":6: [memory] high_watermark: ",
        ":7: [memory] bogus: unknown key", ":8: [nope]: unknown section", ":10: [leases] read_ttl: ",
        ":12: [log] level: ",
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        snprintf(want, sizeof want, "%s%s", path, expect[i]);
        ck_assert_msg(strstr(err, want), "'%s' missing from:\n%s", want, err);
    }
    ck_assert_uint_eq(count_lines(err), 7);
    /* Errors come in file order. */
    const char *first = strstr(err, ":2: "), *last = strstr(err, ":12: ");
    ck_assert(first && last && first < last);
}
END_TEST

START_TEST(test_error_buffer_limits)
{
    /* 300 bad lines overflow CONFIG_ERR_MAX: the message stays bounded and
     * says how many were left out. */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    fputs("[server]\n", mem);
    for (int i = 0; i < 300; i++)
        fputs("max_clients = 0\n", mem);
    fclose(mem);

    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, text, err, sizeof err, NULL, 0), -1);
    ck_assert_uint_lt(strlen(err), sizeof err);
    ck_assert_msg(strstr(err, "more errors not shown)"), "%s", err);

    /* A tiny buffer gets the start of the first error, NUL-terminated. */
    char tiny[16];
    memset(tiny, 'x', sizeof tiny);
    ck_assert_int_eq(load_text(&c, text, tiny, sizeof tiny, NULL, 0), -1);
    ck_assert_uint_eq(strlen(tiny), sizeof tiny - 1);

    /* No buffer at all still fails. */
    ck_assert_int_eq(load_text(&c, text, NULL, 0, NULL, 0), -1);
    free(text);
}
END_TEST

START_TEST(test_missing_file)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_int_eq(config_load_file(&c, "/nonexistent/kvnode.conf", err, sizeof err), -1);
    ck_assert_str_eq(err, "/nonexistent/kvnode.conf: cannot open: No such file or directory");

    /* A directory opens but cannot be read. */
    ck_assert_int_eq(config_load_file(&c, "/", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/: read error: Is a directory"), "%s", err);
}
END_TEST

START_TEST(test_file_syntax_details)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    /* BOM, CRLF, indentation, ';' and '#' comments, ':' separator, a
     * repeated section and a repeated key (the last wins), an empty file
     * section: all accepted. */
    int rc = load_text(&c,
                       "\xEF\xBB\xBF# kvnode\r\n"
                       "[memory]\r\n"
                       "    host_bytes = 2GiB\r\n"
                       "\tslab_bytes: 1MiB ; inline comment\r\n"
                       "; another comment\n"
                       "[log]\n"
                       "[memory]\n"
                       "host_bytes = 3GiB\n"
                       "  [leases]\n"
                       "read_ttl=2s\n",
                       err, sizeof err, NULL, 0);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_uint_eq(c.host_bytes, 3 * GIB);
    ck_assert_uint_eq(c.slab_bytes, MIB);
    ck_assert_uint_eq(c.read_lease_ttl_ms, 2000);

    /* An indented line is a key of its own, never a continuation of the
     * previous value (inih's multi-line mode). */
    config_defaults(&c);
    rc = load_text(&c, "[memory]\nhost_bytes = 2GiB\n   slab_bytes = 1MiB\n", err, sizeof err, NULL, 0);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_uint_eq(c.host_bytes, 2 * GIB);
    ck_assert_uint_eq(c.slab_bytes, MIB);

    /* An empty file changes nothing. */
    struct kvn_config d;
    config_defaults(&d);
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "", err, sizeof err, NULL, 0), 0);
    assert_config_equal(&c, &d);
}
END_TEST

START_TEST(test_long_line)
{
    char text[1024], err[CONFIG_ERR_MAX], path[256], want[512];
    char path_value[400];
    memset(path_value, 'a', sizeof path_value - 1);
    path_value[sizeof path_value - 1] = '\0';
    snprintf(text, sizeof text, "[server]\nsocket_path = /%s\nmax_clients = 0\n", path_value);
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, text, err, sizeof err, path, sizeof path), -1);
    snprintf(want, sizeof want, "%s:2: line too long", path);
    ck_assert_msg(strstr(err, want), "%s", err);
    /* Line counting survives the long line. */
    snprintf(want, sizeof want, "%s:3: [server] max_clients: ", path);
    ck_assert_msg(strstr(err, want), "%s", err);
}
END_TEST

/* A NUL byte ends a C string: inih would see only the text before it and
 * silently drop the rest of the line. Refused, naming the line. */
START_TEST(test_nul_byte)
{
    char err[CONFIG_ERR_MAX], path[256], want[512];
    struct kvn_config c, before;
    config_defaults(&c);
    before = c;
    static const char value_nul[] = "[memory]\nhigh_watermark = 0.5\0garbage\nlow_watermark = 0.25\n";
    ck_assert_int_eq(load_bytes(&c, value_nul, sizeof value_nul - 1, err, sizeof err, path, sizeof path), -1);
    snprintf(want, sizeof want, "%s:2: NUL byte in the line (byte 21)", path);
    ck_assert_msg(strstr(err, want), "'%s' missing from:\n%s", want, err);
    ck_assert_uint_eq(count_lines(err), 1);
    /* Nothing of the file applies, not even the good line after it. */
    ck_assert(c.high_watermark == before.high_watermark);
    ck_assert(c.low_watermark == before.low_watermark);

    /* A good file that ends in binary garbage: the garbage line is named,
     * even when the NUL is its first byte or the last byte of the file. */
    static const char tail_garbage[] = "[server]\nmax_clients = 7\n\0\x01\xff\xfe\n\x7f";
    config_defaults(&c);
    ck_assert_int_eq(load_bytes(&c, tail_garbage, sizeof tail_garbage - 1, err, sizeof err, path, sizeof path), -1);
    snprintf(want, sizeof want, "%s:3: NUL byte in the line (byte 1)", path);
    ck_assert_msg(strstr(err, want), "'%s' missing from:\n%s", want, err);
    ck_assert_uint_eq(c.max_clients, 1024);
    static const char last_byte[] = "[server]\nmax_clients = 7\n; comment\0";
    ck_assert_int_eq(load_bytes(&c, last_byte, sizeof last_byte - 1, err, sizeof err, path, sizeof path), -1);
    snprintf(want, sizeof want, "%s:3: NUL byte in the line (byte 10)", path);
    ck_assert_msg(strstr(err, want), "'%s' missing from:\n%s", want, err);

    /* Line counting goes on after the NUL line: later problems keep their lines. */
    static const char two[] = "[server]\nmax_clients = 7\0\nmax_clients = 0\n";
    ck_assert_int_eq(load_bytes(&c, two, sizeof two - 1, err, sizeof err, path, sizeof path), -1);
    snprintf(want, sizeof want, "%s:2: NUL byte in the line", path);
    ck_assert_msg(strstr(err, want), "'%s' missing from:\n%s", want, err);
    snprintf(want, sizeof want, "%s:3: [server] max_clients: ", path);
    ck_assert_msg(strstr(err, want), "'%s' missing from:\n%s", want, err);
    ck_assert_uint_eq(count_lines(err), 2);
}
END_TEST

START_TEST(test_parse_into_fresh_struct)
{
    /* Loading parses on top of the given struct and touches nothing else:
     * two independent structs, loaded from different files, stay apart. */
    char err[CONFIG_ERR_MAX];
    struct kvn_config a, b;
    config_defaults(&a);
    config_defaults(&b);
    ck_assert_int_eq(load_text(&a, "[server]\nmax_clients = 7\n", err, sizeof err, NULL, 0), 0);
    ck_assert_int_eq(load_text(&b, "[leases]\nmax_per_client = 9\n", err, sizeof err, NULL, 0), 0);
    ck_assert_uint_eq(a.max_clients, 7);
    ck_assert_uint_eq(a.max_leases_per_client, 1024);
    ck_assert_uint_eq(b.max_clients, 1024);
    ck_assert_uint_eq(b.max_leases_per_client, 9);
    /* Values not in the file keep what the struct had, not the defaults. */
    ck_assert_int_eq(load_text(&a, "[leases]\nmax_per_client = 3\n", err, sizeof err, NULL, 0), 0);
    ck_assert_uint_eq(a.max_clients, 7);
    ck_assert_uint_eq(a.max_leases_per_client, 3);
}
END_TEST

/* ---- size and duration parsers ---------------------------------------------- */

struct size_case {
    const char *text;
    int rc;
    uint64_t value;
};

/* Decisions: binary units only, case-insensitive; whole numbers only ("1.5G"
 * is rejected); no sign; no blank anywhere ("12 KiB" is rejected; the file
 * parser trims blanks around a value before this runs). */
static const struct size_case size_cases[] = {
    { "0", 0, 0 },
    { "1", 0, 1 },
    { "4096", 0, 4096 },
    { "007", 0, 7 },
    { "1B", 0, 1 },
    { "1k", 0, KIB },
    { "1K", 0, KIB },
    { "1KB", 0, KIB },
    { "1KiB", 0, KIB },
    { "1kib", 0, KIB },
    { "512M", 0, 512 * MIB },
    { "64MB", 0, 64 * MIB },
    { "64MiB", 0, 64 * MIB },
    { "1G", 0, GIB },
    { "1GB", 0, GIB },
    { "1GiB", 0, GIB },
    { "1GIB", 0, GIB },
    { "3T", 0, 3 * (GIB << 10) },
    { "1TiB", 0, GIB << 10 },
    { "1PiB", 0, GIB << 20 },
    { "15EiB", 0, UINT64_C(15) << 60 },
    { "18446744073709551615", 0, UINT64_MAX },
    { "16EiB", -1, 0 },
    { "20EiB", -1, 0 },
    { "18446744073709551616", -1, 0 },
    { "99999999999999999999999", -1, 0 },
    { "17179869184G", -1, 0 },
    { "-1", -1, 0 },
    { "+1", -1, 0 },
    { "1.5G", -1, 0 },
    { "0.5", -1, 0 },
    { "", -1, 0 },
    { "12 KiB", -1, 0 },
    { " 12", -1, 0 },
    { "12 ", -1, 0 },
    { "KiB", -1, 0 },
    { "1X", -1, 0 },
    { "1KiBB", -1, 0 },
    { "1iB", -1, 0 },
    { "0x10", -1, 0 },
    { "1e3", -1, 0 },
};

START_TEST(test_parse_size)
{
    for (size_t i = 0; i < sizeof size_cases / sizeof size_cases[0]; i++) {
        const struct size_case *s = &size_cases[i];
        uint64_t v = 12345;
        int rc = config_parse_size(s->text, &v);
        ck_assert_msg(rc == s->rc, "config_parse_size('%s') = %d, want %d", s->text, rc, s->rc);
        if (rc == 0)
            ck_assert_msg(v == s->value, "config_parse_size('%s') = %" PRIu64 ", want %" PRIu64, s->text, v,
                          s->value);
        else
            ck_assert_msg(v == 12345, "config_parse_size('%s') wrote its output on failure", s->text);
    }
    uint64_t v;
    ck_assert_int_eq(config_parse_size(NULL, &v), -1);
}
END_TEST

struct duration_case {
    const char *text;
    int rc;
    uint32_t value;
};

static const struct duration_case duration_cases[] = {
    { "0", 0, 0 },
    { "100", 0, 100 },
    { "500ms", 0, 500 },
    { "500MS", 0, 500 },
    { "30s", 0, 30000 },
    { "30S", 0, 30000 },
    { "2m", 0, 120000 },
    { "1h", 0, 3600000 },
    { "1193h", 0, UINT32_C(4294800000) },
    { "4294967295", 0, UINT32_MAX },
    { "4294967295ms", 0, UINT32_MAX },
    { "1194h", -1, 0 },
    { "4294967296", -1, 0 },
    { "99999999999999999999h", -1, 0 },
    { "-1", -1, 0 },
    { "1.5s", -1, 0 },
    { "", -1, 0 },
    { "5 s", -1, 0 },
    { "5sec", -1, 0 },
    { "1d", -1, 0 },
    { "1h30m", -1, 0 },
    { "ms", -1, 0 },
    { "s", -1, 0 },
    { "10us", -1, 0 },
};

START_TEST(test_parse_duration)
{
    for (size_t i = 0; i < sizeof duration_cases / sizeof duration_cases[0]; i++) {
        const struct duration_case *d = &duration_cases[i];
        uint32_t v = 777;
        int rc = config_parse_duration_ms(d->text, &v);
        ck_assert_msg(rc == d->rc, "config_parse_duration_ms('%s') = %d, want %d", d->text, rc, d->rc);
        if (rc == 0)
            ck_assert_msg(v == d->value, "config_parse_duration_ms('%s') = %u, want %u", d->text, v, d->value);
        else
            ck_assert_msg(v == 777, "config_parse_duration_ms('%s') wrote its output on failure", d->text);
    }
}
END_TEST

/* ---- overrides ------------------------------------------------------------ */

START_TEST(test_override_good)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_msg(config_apply_override(&c, "memory.host_bytes=2GiB", err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(c.host_bytes, 2 * GIB);
    /* Blanks around the parts are ignored, as in the file. */
    ck_assert_msg(config_apply_override(&c, " leases . read_ttl =  1m ", err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(c.read_lease_ttl_ms, 60000);
    /* Only the first '=' splits: the value may contain more. */
    ck_assert_msg(config_apply_override(&c, "server.socket_path=/tmp/a=b.sock", err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.socket_path, "/tmp/a=b.sock");
    /* Overrides apply on top of a loaded file. */
    ck_assert_int_eq(load_text(&c, "[log]\nlevel = warn\n", err, sizeof err, NULL, 0), 0);
    ck_assert_int_eq(config_apply_override(&c, "log.level=debug", err, sizeof err), 0);
    ck_assert_int_eq(c.log_level, LOG_LEVEL_DEBUG);
}
END_TEST

struct override_case {
    const char *assignment, *expect;
};

static const struct override_case override_errors[] = {
    { "nokey", "override 'nokey': expected SECTION.KEY=VALUE" },
    { "memory", "override 'memory': expected SECTION.KEY=VALUE" },
    { "memory.host_bytes", "override 'memory.host_bytes': expected SECTION.KEY=VALUE" },
    { "host_bytes=1GiB", "override 'host_bytes=1GiB': expected SECTION.KEY=VALUE" },
    { "memory.=1", "override 'memory.=1': empty key" },
    { ".host_bytes=1", "override '.host_bytes=1': empty section" },
    { "x.y=1", "override 'x.y=1': unknown section [x]" },
    { "memory.bogus=1", "override memory.bogus: unknown key" },
    { "memory.read_ttl=1s", "override memory.read_ttl: unknown key (it belongs in [leases])" },
    { "memory.host_bytes=", "override memory.host_bytes: invalid size ''" },
    { "memory.host_bytes=abc", "override memory.host_bytes: invalid size 'abc'" },
    { "", "expected SECTION.KEY=VALUE" },
};

START_TEST(test_override_errors)
{
    const struct override_case *o = &override_errors[_i];
    char err[CONFIG_ERR_MAX];
    struct kvn_config c, before;
    config_defaults(&c);
    before = c;
    ck_assert_msg(config_apply_override(&c, o->assignment, err, sizeof err) == -1, "'%s' accepted", o->assignment);
    ck_assert_msg(strstr(err, o->expect), "'%s': got '%s', want '%s'", o->assignment, err, o->expect);
    ck_assert(memcmp(&c, &before, sizeof c) == 0);
}
END_TEST

/* ---- validation --------------------------------------------------------------- */

START_TEST(test_validate_cross_field)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;

    config_defaults(&c);
    c.low_watermark = 0.95;
    c.high_watermark = 0.9;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[memory] low_watermark: 0.95 must be below high_watermark (0.9)"), "%s", err);

    config_defaults(&c);
    c.low_watermark = c.high_watermark;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "low_watermark"), "%s", err);

    /* The file parser alone cannot see this: each value is in range. */
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "[memory]\nhigh_watermark = 0.5\nlow_watermark = 0.6\n", err, sizeof err,
                               NULL, 0), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);

    config_defaults(&c);
    c.host_bytes = 8 * MIB;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[memory] slab_bytes: 16MiB exceeds host_bytes (8MiB)"), "%s", err);
    c.host_bytes = 16 * MIB;   /* exactly one slab is fine */
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);

    /* The arena counts slabs in 32 bits. */
    config_defaults(&c);
    c.slab_bytes = 64 * KIB;
    c.host_bytes = (UINT64_C(1) << 32) * 64 * KIB;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[memory] host_bytes: more than 4294967295 slabs"), "%s", err);
    c.host_bytes -= 64 * KIB;
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);

    /* [hbm] watermarks: the same rule as [memory]'s, checked on their own. */
    config_defaults(&c);
    c.hbm_low_watermark = 0.95;
    c.hbm_high_watermark = 0.9;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[hbm] low_watermark: 0.95 must be below high_watermark (0.9)"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 1);
    c.hbm_low_watermark = c.hbm_high_watermark;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[hbm] low_watermark: 0.9 must be below high_watermark (0.9)"), "%s", err);
    /* [memory]'s are not [hbm]'s: each pair is checked against itself. */
    config_defaults(&c);
    c.hbm_high_watermark = 0.5;
    c.hbm_low_watermark = 0.4;
    c.low_watermark = 0.92;
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "[hbm]\nhigh_watermark = 0.5\nlow_watermark = 0.6\n", err, sizeof err, NULL, 0),
                     0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[hbm] low_watermark: 0.6 must be below high_watermark (0.5)"), "%s", err);

    /* [hbm] bytes: 0 (no tier) or at least one slab; both options named. */
    config_defaults(&c);
    c.hbm_bytes = 8 * MIB;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[hbm] bytes: 8MiB is less than [memory] slab_bytes (16MiB)"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 1);
    c.hbm_bytes = 16 * MIB;   /* exactly one slab is fine */
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    c.hbm_bytes = 16 * MIB + 1;   /* rounded down to whole slabs, like host_bytes */
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    c.hbm_bytes = 0;
    c.slab_bytes = GIB;   /* no HBM tier: slab_bytes does not matter to it */
    c.host_bytes = GIB;
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    c.hbm_bytes = 1;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[hbm] bytes: 1 is less than [memory] slab_bytes (1GiB)"), "%s", err);
    /* Through a file and an override: each value alone is in range. */
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "[hbm]\nbytes = 1MiB\n", err, sizeof err, NULL, 0), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[hbm] bytes: 1MiB is less than [memory] slab_bytes (16MiB)"), "%s", err);
    ck_assert_int_eq(config_apply_override(&c, "memory.slab_bytes=1MiB", err, sizeof err), 0);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    /* The arena counts slabs in 32 bits, as the host arena does. */
    config_defaults(&c);
    c.slab_bytes = 64 * KIB;
    c.hbm_bytes = (UINT64_C(1) << 32) * 64 * KIB;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[hbm] bytes: more than 4294967295 slabs"), "%s", err);
    c.hbm_bytes -= 64 * KIB;
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
}
END_TEST

START_TEST(test_validate_socket_path)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;

    config_defaults(&c);
    c.socket_path[0] = '\0';
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[server] socket_path: empty path"), "%s", err);

    config_defaults(&c);
    snprintf(c.socket_path, sizeof c.socket_path, "%s", path108);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[server] socket_path: path too long (108 bytes; a unix socket path must be "
                              "shorter than 108 bytes"), "%s", err);

    snprintf(c.socket_path, sizeof c.socket_path, "%s", path107);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);

    /* No terminator at all: rejected, and nothing reads past the field. */
    memset(c.socket_path, 'a', sizeof c.socket_path);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "socket_path: path too long"), "%s", err);
}
END_TEST

START_TEST(test_validate_field_ranges)
{
    /* Structs edited by code get the parser's range checks too, all reported. */
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    c.max_clients = 0;
    c.socket_mode = 01777;
    c.slab_bytes = 100000;
    c.high_watermark = 1.5;
    c.pin_host = 9;
    c.log_level = -1;
    c.reaper_interval_ms = 5;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    const char *expect[] = {
        "[server] max_clients: invalid value '0'", "[server] socket_mode: invalid mode '1777'",
        "[memory] slab_bytes: size '100000' is not a multiple of 256", "[memory] high_watermark: invalid value '1.5'",
        "[memory] pin_host: invalid value '9'", "[log] level: invalid value '-1'",
        "[leases] reaper_interval: duration '5ms' out of range",
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        ck_assert_msg(strstr(err, expect[i]), "'%s' missing from:\n%s", expect[i], err);
    ck_assert_uint_eq(count_lines(err), 7);
}
END_TEST

START_TEST(test_validate_hbm)
{
    /* Structs edited by code: every [hbm] field range-checked, all reported. */
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    c.pin_chunk_bytes = MIB + 4096;
    c.hbm_backend = 4;
    snprintf(c.hbm_devices, sizeof c.hbm_devices, "0,0");
    c.hbm_high_watermark = 0;
    c.hbm_low_watermark = -0.5;
    c.hbm_required = 2;
    c.hbm_copy_batch_bytes = 8 * GIB;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    const char *expect[] = {
        "[memory] pin_chunk_bytes: size '1028KiB' is not a multiple of 1048576 bytes",
        "[hbm] backend: invalid value '4' (expected auto, cuda, sim or none)",
        "[hbm] devices: device 0 listed twice",
        "[hbm] high_watermark: invalid value '0' (expected a fraction in (0, 1])",
        "[hbm] low_watermark: invalid value '-0.5' (expected a fraction in [0, 1))",
        "[hbm] required: invalid value '2' (expected off or on)",
        "[hbm] copy_batch_bytes: size '8GiB' out of range (expected 1MiB..4GiB)",
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        ck_assert_msg(strstr(err, expect[i]), "'%s' missing from:\n%s", expect[i], err);
    /* -0.5 < 0: the watermark rule holds, so nothing more is reported. */
    ck_assert_uint_eq(count_lines(err), 7);

    config_defaults(&c);
    c.pin_chunk_bytes = 0;
    c.hbm_backend = -1;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[memory] pin_chunk_bytes: size '0' out of range (expected 1MiB..1TiB)"), "%s", err);
    ck_assert_msg(strstr(err, "[hbm] backend: invalid value '-1'"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 2);

    /* A devices field without a terminator is rejected, never read past. */
    config_defaults(&c);
    memset(c.hbm_devices, '1', sizeof c.hbm_devices);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[hbm] devices: list too long (at most 511 bytes)"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 1);

    /* Every backend validates with bytes > 0 and required = on: whether the
     * GPU is there is the daemon's business at start, not the config's. */
    for (int b = CONFIG_HBM_AUTO; b <= CONFIG_HBM_NONE; b++) {
        config_defaults(&c);
        c.hbm_backend = b;
        c.hbm_bytes = 4 * GIB;
        c.hbm_required = 1;
        ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "backend %d: %s", b, err);
    }
}
END_TEST

START_TEST(test_hbm_devices)
{
    int dev[CONFIG_HBM_DEVICES_MAX];
    size_t n = 99;
    char problem[256];

    /* "all", any case, or empty: every visible device (n = 0). */
    const char *all[] = { "all", "ALL", "All", "", "  ", " all\t" };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        n = 99;
        ck_assert_msg(config_hbm_devices(all[i], dev, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem) == 0,
                      "'%s': %s", all[i], problem);
        ck_assert_uint_eq(n, 0);
    }

    /* Commas and/or blanks separate; order is kept. */
    ck_assert_int_eq(config_hbm_devices("0,1 3", dev, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(dev[0], 0);
    ck_assert_int_eq(dev[1], 1);
    ck_assert_int_eq(dev[2], 3);
    ck_assert_int_eq(config_hbm_devices(" ,7,,\t2 , 15,", dev, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(dev[0], 7);
    ck_assert_int_eq(dev[1], 2);
    ck_assert_int_eq(dev[2], 15);
    ck_assert_int_eq(config_hbm_devices("007", dev, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(dev[0], 7);

    /* Every ordinal once: CONFIG_HBM_DEVICES_MAX of them. */
    char list[128] = "";
    for (int i = CONFIG_HBM_DEVICES_MAX - 1; i >= 0; i--) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%d", used ? " " : "", i);
    }
    ck_assert_msg(config_hbm_devices(list, dev, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem) == 0, "%s",
                  problem);
    ck_assert_uint_eq(n, CONFIG_HBM_DEVICES_MAX);
    ck_assert_int_eq(dev[0], CONFIG_HBM_DEVICES_MAX - 1);
    ck_assert_int_eq(dev[CONFIG_HBM_DEVICES_MAX - 1], 0);
    /* Fewer slots than devices: refused, not cut short. */
    n = 99;
    ck_assert_int_eq(config_hbm_devices("0 1 2", dev, 2, &n, problem, sizeof problem), -1);
    ck_assert_str_eq(problem, "too many devices (at most 2)");
    ck_assert_uint_eq(n, 0);
    /* Check only: no output array. */
    ck_assert_int_eq(config_hbm_devices("4 5", NULL, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem), 0);
    ck_assert_uint_eq(n, 2);

    /* Bad lists: -1, *n = 0, and the problem names the bad entry. */
    struct {
        const char *text, *expect;
    } bad[] = {
        { "16", "device '16' out of range (device ordinals are 0..15)" },
        { "1,1", "device 1 listed twice" },
        { "3 03", "device 3 listed twice" },
        { "0 x", "invalid device 'x' (expected all, or device ordinals 0..15" },
        { "+1", "invalid device '+1'" },
        { "1.0", "invalid device '1.0'" },
        { "cuda:0", "invalid device 'cuda:0'" },
        { "all 0", "'all' cannot be combined with device ordinals" },
        { "all,all", "'all' cannot be combined with device ordinals" },
        { "allx", "invalid device 'allx'" },
        { ",", "no device in ','" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = 99;
        ck_assert_msg(config_hbm_devices(bad[i].text, dev, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem) == -1,
                      "'%s' accepted", bad[i].text);
        ck_assert_msg(strstr(problem, bad[i].expect), "'%s': got '%s', want '%s'", bad[i].text, problem,
                      bad[i].expect);
        ck_assert_uint_eq(n, 0);
    }
    /* No problem buffer, no text: still an answer, never a crash. */
    ck_assert_int_eq(config_hbm_devices("zz", dev, CONFIG_HBM_DEVICES_MAX, &n, NULL, 0), -1);
    ck_assert_int_eq(config_hbm_devices(NULL, dev, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem), -1);
    char tiny[8];
    ck_assert_int_eq(config_hbm_devices("0 99", dev, CONFIG_HBM_DEVICES_MAX, &n, tiny, sizeof tiny), -1);
    ck_assert_uint_eq(strlen(tiny), sizeof tiny - 1);

    /* The defaults' "all", as the daemon reads it. */
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_int_eq(config_hbm_devices(c.hbm_devices, dev, CONFIG_HBM_DEVICES_MAX, &n, problem, sizeof problem), 0);
    ck_assert_uint_eq(n, 0);
}
END_TEST

START_TEST(test_validate_persist)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;

    /* v6d without url and socket_path: both named, one line each. */
    config_defaults(&c);
    c.persist_backend = CONFIG_BACKEND_V6D;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[persist] url: required when backend = v6d"), "%s", err);
    ck_assert_msg(strstr(err, "[persist] socket_path: required when backend = v6d"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 2);

    /* ... and reported together with unrelated problems. */
    c.max_clients = 0;
    c.low_watermark = 0.99;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[server] max_clients: "), "%s", err);
    ck_assert_msg(strstr(err, "[memory] low_watermark: "), "%s", err);
    ck_assert_uint_eq(count_lines(err), 4);

    /* The same through the file parser: each value alone is fine. */
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "[persist]\nbackend = v6d\nurl = http://127.0.0.1:8080\n", err, sizeof err,
                               NULL, 0), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[persist] socket_path: required when backend = v6d"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 1);
    ck_assert_int_eq(config_apply_override(&c, "persist.socket_path=/run/v6d.sock", err, sizeof err), 0);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    /* v6d needs an object namespace (the default is rtp-llm's); blanks are refused. */
    ck_assert_int_eq(config_apply_override(&c, "persist.object_namespace=", err, sizeof err), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[persist] object_namespace: required when backend = v6d"), "%s", err);
    ck_assert_int_ne(config_apply_override(&c, "persist.object_namespace=a b", err, sizeof err), 0);
    ck_assert_msg(strstr(err, "blanks"), "%s", err);
    ck_assert_int_eq(config_apply_override(&c, "persist.object_namespace=rtp_llm", err, sizeof err), 0);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);

    /* v6d needs an http(s) URL with a host. */
    const char *bad_urls[] = { "ftp://kvs:21", "127.0.0.1:8080", "http://", "https:///x", "http:/x" };
    for (size_t i = 0; i < sizeof bad_urls / sizeof bad_urls[0]; i++) {
        snprintf(c.persist_url, sizeof c.persist_url, "%s", bad_urls[i]);
        ck_assert_msg(config_validate(&c, err, sizeof err) == -1, "url '%s' accepted", bad_urls[i]);
        char want[128];
        snprintf(want, sizeof want, "[persist] url: invalid URL '%s' (", bad_urls[i]);
        ck_assert_msg(strstr(err, want), "%s", err);
        ck_assert_uint_eq(count_lines(err), 1);
    }
    const char *good_urls[] = { "http://kvs", "https://10.0.0.1:443/api", "HTTP://localhost:8080/" };
    for (size_t i = 0; i < sizeof good_urls / sizeof good_urls[0]; i++) {
        memset(c.persist_url, 0, sizeof c.persist_url);
        snprintf(c.persist_url, sizeof c.persist_url, "%s", good_urls[i]);
        ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "url '%s': %s", good_urls[i], err);
    }

    /* Without v6d the URL and socket are not used, so not checked. */
    c.persist_backend = CONFIG_BACKEND_FILE;
    snprintf(c.persist_url, sizeof c.persist_url, "not a url");
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);

    /* file needs a path; off needs nothing. */
    config_defaults(&c);
    ck_assert_int_eq(config_apply_override(&c, "persist.path=", err, sizeof err), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[persist] path: required when backend = file"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 1);
    c.persist_backend = CONFIG_BACKEND_OFF;
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    c.persist_backend = CONFIG_BACKEND_V6D;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_uint_eq(count_lines(err), 2);   /* url, socket_path; path is not needed */
    ck_assert_msg(!strstr(err, "[persist] path"), "%s", err);
    /* redis: the seed nodes are required and each is HOST:PORT. */
    c.persist_backend = CONFIG_BACKEND_REDIS;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[persist] nodes: no seed nodes") && strstr(err, "backend = redis"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 1);
    snprintf(c.persist_nodes, sizeof c.persist_nodes, "10.0.0.1:6379,10.0.0.2");
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[persist] nodes: seed node '10.0.0.2' is not HOST:PORT"), "%s", err);
    snprintf(c.persist_nodes, sizeof c.persist_nodes, "10.0.0.1:6379,10.0.0.2:7000");
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    c.persist_nodes[0] = '\0';

    /* Field ranges of structs edited by code. */
    config_defaults(&c);
    c.persist_backend = 4;
    c.persist_policy = -1;
    c.persist_fsync = 7;
    c.persist_lookup = 3;
    c.persist_workers = 0;
    c.persist_queue = 15;
    c.persist_connect_timeout_ms = 60001;
    c.persist_timeout_ms = 9;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    const char *expect[] = {
        "[persist] backend: invalid value '4' (expected off, file, v6d or redis)",
        "[persist] policy: invalid value '-1' (expected write_through, write_back or off)",
        "[persist] fsync: invalid value '7' (expected never, batch or always)",
        "[persist] lookup: invalid value '3' (expected auto, on or off)",
        "[persist] workers: invalid value '0'", "[persist] queue: invalid value '15'",
        "[persist] connect_timeout: duration '60001ms' out of range", "[persist] timeout: duration '9ms' out of range",
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        ck_assert_msg(strstr(err, expect[i]), "'%s' missing from:\n%s", expect[i], err);
    ck_assert_uint_eq(count_lines(err), 8);

    /* String fields without a terminator are rejected, never read past. */
    config_defaults(&c);
    memset(c.persist_path, 'p', sizeof c.persist_path);
    memset(c.persist_url, 'u', sizeof c.persist_url);
    memset(c.persist_socket, 's', sizeof c.persist_socket);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[persist] path: path too long"), "%s", err);
    ck_assert_msg(strstr(err, "[persist] url: URL too long (512 bytes; at most 511)"), "%s", err);
    ck_assert_msg(strstr(err, "[persist] socket_path: path too long"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 3);
    c.persist_backend = CONFIG_BACKEND_V6D;   /* the cross-checks see them too */
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_uint_eq(count_lines(err), 3);

    /* Longer values than one file line can hold come from overrides. */
    char assign[700];
    memset(assign, 0, sizeof assign);
    snprintf(assign, sizeof assign, "persist.url=http://");
    memset(assign + strlen(assign), 'h', 600);
    config_defaults(&c);
    ck_assert_int_eq(config_apply_override(&c, assign, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "override persist.url: URL too long (607 bytes; at most 511)"), "%s", err);
    memset(assign, 0, sizeof assign);
    snprintf(assign, sizeof assign, "persist.path=/");
    memset(assign + strlen(assign), 'd', 600);
    ck_assert_msg(config_apply_override(&c, assign, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(strlen(c.persist_path), 601);
}
END_TEST

/* persist.url is printed by /config, --check-config and in store errors:
 * credentials in it ("user:password@host") are refused, and the error never
 * echoes them. The same for [kvcm] endpoints. */
START_TEST(test_url_credentials)
{
    char err[CONFIG_ERR_MAX], path[256], want[512];
    struct kvn_config c;

    const char *with_credentials[] = {
        "http://alice:s3cret@kvs:8080", "https://alice:s3cret@10.0.0.1/api", "http://s3cret@kvs",
        "HTTP://alice:s3cret@[fd00::1]:80", "http://:s3cret@kvs", "alice:s3cret@kvs:8080",
    };
    for (size_t i = 0; i < sizeof with_credentials / sizeof with_credentials[0]; i++) {
        char assign[256];
        snprintf(assign, sizeof assign, "persist.url=%s", with_credentials[i]);
        config_defaults(&c);
        ck_assert_msg(config_apply_override(&c, assign, err, sizeof err) == -1, "'%s' accepted", assign);
        ck_assert_msg(strstr(err, "override persist.url: credentials in the URL are not accepted"), "%s", err);
        ck_assert_msg(!strstr(err, "s3cret"), "the error shows the password: %s", err);
        ck_assert_str_eq(c.persist_url, "");

        /* A file line: the same, with file and line. */
        char text[256];
        snprintf(text, sizeof text, "[persist]\nbackend = v6d\nurl = %s\nsocket_path = /run/v6d.sock\n",
                 with_credentials[i]);
        ck_assert_int_eq(load_text(&c, text, err, sizeof err, path, sizeof path), -1);
        snprintf(want, sizeof want, "%s:3: [persist] url: credentials in the URL are not accepted", path);
        ck_assert_msg(strstr(err, want), "'%s' missing from:\n%s", want, err);
        ck_assert_msg(!strstr(err, "s3cret"), "the error shows the password: %s", err);
        ck_assert_uint_eq(count_lines(err), 1);

        /* A struct edited by code: config_validate, whatever the backend,
         * and the v6d URL check does not echo it either. */
        for (int backend = CONFIG_BACKEND_OFF; backend <= CONFIG_BACKEND_V6D; backend++) {
            config_defaults(&c);
            c.persist_backend = backend;
            snprintf(c.persist_socket, sizeof c.persist_socket, "/run/v6d.sock");
            snprintf(c.persist_url, sizeof c.persist_url, "%s", with_credentials[i]);
            ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
            ck_assert_msg(strstr(err, "[persist] url: credentials in the URL are not accepted"), "%s", err);
            ck_assert_msg(!strstr(err, "s3cret"), "the error shows the password: %s", err);
            ck_assert_uint_eq(count_lines(err), 1);
        }
    }
    /* The message says where the store's access control belongs instead. */
    config_defaults(&c);
    ck_assert_int_eq(config_apply_override(&c, "persist.url=http://u:p@kvs", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "carries no credentials"), "%s", err);

    /* '@' outside the authority is not userinfo. */
    const char *fine[] = { "http://kvs:8080/v1/@store", "https://kvs/api?owner=a@b", "http://kvs#x@y" };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        char assign[256];
        snprintf(assign, sizeof assign, "persist.url=%s", fine[i]);
        config_defaults(&c);
        ck_assert_msg(config_apply_override(&c, assign, err, sizeof err) == 0, "'%s': %s", assign, err);
        ck_assert_str_eq(c.persist_url, fine[i]);
    }

    /* [kvcm] endpoints: refused as before, now without echoing the password. */
    config_defaults(&c);
    ck_assert_int_eq(config_apply_override(&c, "kvcm.endpoints=http://kvcm-0:6382, http://bob:s3cret@kvcm-1:6382",
                                           err, sizeof err), -1);
    ck_assert_msg(strstr(err, "override kvcm.endpoints: credentials in endpoint 2 are not accepted"), "%s", err);
    ck_assert_msg(!strstr(err, "s3cret"), "the error shows the password: %s", err);
    memset(c.kvcm.endpoints, 0, sizeof c.kvcm.endpoints);
    snprintf(c.kvcm.endpoints, sizeof c.kvcm.endpoints, "https://bob:s3cret@kvcm-1");
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[kvcm] endpoints: credentials in endpoint 1 are not accepted"), "%s", err);
    ck_assert_msg(!strstr(err, "s3cret"), "the error shows the password: %s", err);
}
END_TEST


/* ---- [kvs_server] ------------------------------------------------------------------- */

START_TEST(test_validate_kvs_server)
{
    struct kvn_config c;
    char err[CONFIG_ERR_MAX];

    /* Off: nothing is checked. */
    config_defaults(&c);
    snprintf(c.kvs_listen, sizeof c.kvs_listen, "10.0.0.1:8080");
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    /* On: loopback only, a data-plane path of its own, default_term <= max_term. */
    c.kvs_enabled = 1;
    snprintf(c.socket_path, sizeof c.socket_path, "/tmp/x.sock");
    snprintf(c.kvs_socket_path, sizeof c.kvs_socket_path, "/tmp/x.sock");
    c.kvs_default_term_ms = 120000;
    c.kvs_max_term_ms = 60000;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[kvs_server] listen: 10.0.0.1 is not a loopback address"), "%s", err);
    ck_assert_msg(strstr(err, "[kvs_server] socket_path: /tmp/x.sock is already [server] socket_path"), "%s", err);
    ck_assert_msg(strstr(err, "[kvs_server] default_term: 120000ms is above max_term (60000ms)"), "%s", err);
    config_defaults(&c);
    c.kvs_enabled = 1;
    snprintf(c.kvs_listen, sizeof c.kvs_listen, "off");
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[kvs_server] listen: required when enabled = on"), "%s", err);
    ck_assert_int_eq(load_text(&c, "[kvs_server]\ntp_size = 0\n", err, sizeof err, NULL, 0), -1);
    ck_assert_msg(strstr(err, "tp_size"), "%s", err);
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "[kvs_server]\nenabled = on\nlisten = [::1]:0\nsocket_path = /tmp/k.sock\n"
                                   "tp_size = 4\n", err, sizeof err, NULL, 0), 0);
    ck_assert_msg(config_resolve(&c, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.kvs_enabled, 1);
    ck_assert_uint_eq(c.kvs_tp_size, 4);
    ck_assert_int_eq(c.kvs_listen_addr.kind, CONFIG_LISTEN_TCP);
    ck_assert_str_eq(c.kvs_listen_addr.host, "::1");
}
END_TEST

/* ---- [kvcm] ----------------------------------------------------------------------- */

/* A struct with every [kvcm] field set to a good, non-default value. */
static void kvcm_fill(struct kvn_config *c)
{
    /* Zero the string fields first, as the parser does, so the result
     * compares byte for byte with a parsed copy. */
    memset(c->kvcm.endpoints, 0, sizeof c->kvcm.endpoints);
    memset(c->kvcm.instance_group, 0, sizeof c->kvcm.instance_group);
    memset(c->kvcm.instance_id, 0, sizeof c->kvcm.instance_id);
    memset(c->kvcm.host_ip_port, 0, sizeof c->kvcm.host_ip_port);
    memset(c->kvcm.medium_hbm, 0, sizeof c->kvcm.medium_hbm);
    memset(c->kvcm.medium_host, 0, sizeof c->kvcm.medium_host);
    memset(c->kvcm.spec_name, 0, sizeof c->kvcm.spec_name);
    memset(c->kvcm.location_uri, 0, sizeof c->kvcm.location_uri);
    c->kvcm.enabled = 1;
    snprintf(c->kvcm.endpoints, sizeof c->kvcm.endpoints, "http://kvcm-0:6382, https://kvcm-1.example/meta/");
    snprintf(c->kvcm.instance_group, sizeof c->kvcm.instance_group, "prod-a");
    snprintf(c->kvcm.instance_id, sizeof c->kvcm.instance_id, "{model}-{fingerprint}_{block_tokens}");
    snprintf(c->kvcm.host_ip_port, sizeof c->kvcm.host_ip_port, "10.1.2.3:18088");
    c->kvcm.storage_type = CONFIG_KVCM_STORAGE_L2;
    snprintf(c->kvcm.medium_hbm, sizeof c->kvcm.medium_hbm, "gpu");
    snprintf(c->kvcm.medium_host, sizeof c->kvcm.medium_host, "host");
    snprintf(c->kvcm.spec_name, sizeof c->kvcm.spec_name, "kvnode_{block_tokens}_{block_bytes}");
    snprintf(c->kvcm.location_uri, sizeof c->kvcm.location_uri, "kvnode://{host_ip_port}/{medium}/{key}");
    c->kvcm.request_timeout_ms = 2500;
    c->kvcm.connect_timeout_ms = 250;
    c->kvcm.snapshot_timeout_ms = 90000;
    c->kvcm.flush_interval_ms = 5;
    c->kvcm.batch_events = 64;
    c->kvcm.queue_events = 128;
    c->kvcm.heartbeat_interval_ms = 200;
    c->kvcm.retry_base_ms = 100;
    c->kvcm.retry_max_ms = 5000;
    c->kvcm.snapshot_interval_ms = 3600000;
    c->kvcm.host_down_timeout_ms = 250;
    c->kvcm.stall_timeout_ms = 45000;
    c->kvcm.query_deadline_ms = 50;
    c->kvcm.query_max_hosts = 3;
    c->kvcm.query_breaker_failures = 2;
    c->kvcm.query_breaker_open_ms = 1500;
    c->kvcm.query_negative_ttl_ms = 200;
}

START_TEST(test_validate_kvcm)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;

    /* On with the defaults: the two fields without one are named, one line
     * each, in one message. */
    config_defaults(&c);
    ck_assert_int_eq(config_apply_override(&c, "kvcm.enabled=on", err, sizeof err), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[kvcm] endpoints: required when enabled = on ("), "%s", err);
    ck_assert_msg(strstr(err, "[kvcm] host_ip_port: required when enabled = on ("), "%s", err);
    ck_assert_msg(strstr(err, "unique per daemon"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 2);

    /* Every required field empty: every one named, with unrelated problems too. */
    const char *required[] = { "endpoints", "host_ip_port", "instance_group", "instance_id", "medium_hbm",
                               "medium_host", "spec_name", "location_uri" };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        char assign[64];
        snprintf(assign, sizeof assign, "kvcm.%s=", required[i]);
        ck_assert_msg(config_apply_override(&c, assign, err, sizeof err) == 0, "%s: %s", assign, err);
    }
    c.max_clients = 0;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        char want[96];
        snprintf(want, sizeof want, "[kvcm] %s: required when enabled = on", required[i]);
        ck_assert_msg(strstr(err, want), "'%s' missing from:\n%s", want, err);
    }
    ck_assert_msg(strstr(err, "[server] max_clients: "), "%s", err);
    ck_assert_uint_eq(count_lines(err), 9);
    ck_assert_msg(!strstr(err, "more errors not shown"), "%s", err);

    /* Off: none of it is required. */
    c.max_clients = 1;
    c.kvcm.enabled = 0;
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);

    /* The same through a file: each value alone is fine. */
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "[kvcm]\nenabled = on\nendpoints = http://kvcm:6382\n", err, sizeof err, NULL, 0),
                     0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[kvcm] host_ip_port: required when enabled = on"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 1);
    ck_assert_int_eq(config_apply_override(&c, "kvcm.host_ip_port=10.0.0.5:8088", err, sizeof err), 0);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);

    /* Cross-checks, when on. */
    config_defaults(&c);
    kvcm_fill(&c);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    c.kvcm.retry_base_ms = 40000;
    c.kvcm.retry_max_ms = 30000;
    c.kvcm.batch_events = 2000;
    c.kvcm.queue_events = 1000;
    snprintf(c.kvcm.medium_host, sizeof c.kvcm.medium_host, "gpu");
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[kvcm] retry_base: 40s exceeds retry_max (30s)"), "%s", err);
    ck_assert_msg(strstr(err, "[kvcm] batch_events: 2000 exceeds queue_events (1000)"), "%s", err);
    ck_assert_msg(strstr(err, "[kvcm] medium_host: 'gpu' is also medium_hbm"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 3);
    c.kvcm.enabled = 0;   /* off: not used, not cross-checked */
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);

    /* Off, fields are still range-checked (structs edited by code). */
    config_defaults(&c);
    c.kvcm.enabled = 2;
    c.kvcm.storage_type = 2;
    c.kvcm.query_max_hosts = 65;
    c.kvcm.batch_events = 0;
    c.kvcm.flush_interval_ms = 0;
    snprintf(c.kvcm.host_ip_port, sizeof c.kvcm.host_ip_port, "localhost:8088");
    snprintf(c.kvcm.endpoints, sizeof c.kvcm.endpoints, "kvcm:6382");
    snprintf(c.kvcm.instance_id, sizeof c.kvcm.instance_id, "{rank}");
    snprintf(c.kvcm.medium_hbm, sizeof c.kvcm.medium_hbm, "a#b");
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    const char *expect[] = {
        "[kvcm] enabled: invalid value '2' (expected off or on)",
        "[kvcm] storage_type: invalid value '2' (expected ST_EVENT_REPORT_L1P5 or ST_EVENT_REPORT_L2)",
        "[kvcm] query_max_hosts: invalid value '65'", "[kvcm] batch_events: invalid value '0'",
        "[kvcm] flush_interval: duration '0s' out of range",
        "[kvcm] host_ip_port: 'localhost:8088' is not unique-looking", "[kvcm] endpoints: invalid endpoint 'kvcm:6382'",
        "[kvcm] instance_id: unknown placeholder '{rank}'", "[kvcm] medium_hbm: invalid value 'a#b'",
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        ck_assert_msg(strstr(err, expect[i]), "'%s' missing from:\n%s", expect[i], err);
    ck_assert_uint_eq(count_lines(err), 9);

    /* String fields without a terminator are rejected, never read past. */
    config_defaults(&c);
    memset(c.kvcm.endpoints, 'e', sizeof c.kvcm.endpoints);
    memset(c.kvcm.host_ip_port, 'h', sizeof c.kvcm.host_ip_port);
    memset(c.kvcm.location_uri, 'u', sizeof c.kvcm.location_uri);
    memset(c.kvcm.medium_host, 'm', sizeof c.kvcm.medium_host);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[kvcm] endpoints: value too long (1024 bytes; at most 1023)"), "%s", err);
    ck_assert_msg(strstr(err, "[kvcm] host_ip_port: value too long (128 bytes; at most 127)"), "%s", err);
    ck_assert_msg(strstr(err, "[kvcm] location_uri: value too long (256 bytes; at most 255)"), "%s", err);
    ck_assert_msg(strstr(err, "[kvcm] medium_host: value too long (32 bytes; at most 31)"), "%s", err);
    ck_assert_uint_eq(count_lines(err), 4);
    size_t n = 99;
    char urls[CONFIG_KVCM_ENDPOINTS_MAX][CONFIG_URL_MAX];
    ck_assert_int_eq(config_kvcm_endpoints(&c.kvcm, urls, CONFIG_KVCM_ENDPOINTS_MAX, &n), -1);
    ck_assert_uint_eq(n, 0);

    /* Longer values than a file line holds come from overrides. */
    char assign[1200];
    memset(assign, 0, sizeof assign);
    snprintf(assign, sizeof assign, "kvcm.endpoints=http://");
    memset(assign + strlen(assign), 'h', 1100);
    config_defaults(&c);
    ck_assert_int_eq(config_apply_override(&c, assign, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "override kvcm.endpoints: value too long (1107 bytes; at most 1023)"), "%s", err);
    memset(assign, 0, sizeof assign);
    snprintf(assign, sizeof assign, "kvcm.endpoints=http://");
    memset(assign + strlen(assign), 'h', 600);
    ck_assert_int_eq(config_apply_override(&c, assign, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "override kvcm.endpoints: endpoint too long (607 bytes; at most 511)"), "%s", err);
}
END_TEST

START_TEST(test_kvcm_host_ip_port)
{
    char err[CONFIG_ERR_MAX], assign[256];
    struct kvn_config c;
    const char *good[] = { "10.0.0.5:8088", "192.168.7.21:1", "kvnode-3.rack7.example.com:65535", "node7:8088",
                           "[fd00::5]:8088", "[2001:db8::1]:443", "128.0.0.1:80", "my-localhost-box:1",
                           "localhost-7:9" };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        config_defaults(&c);
        snprintf(assign, sizeof assign, "kvcm.host_ip_port=%s", good[i]);
        ck_assert_msg(config_apply_override(&c, assign, err, sizeof err) == 0, "%s: %s", assign, err);
        ck_assert_str_eq(c.kvcm.host_ip_port, good[i]);
        c.kvcm.enabled = 1;
        snprintf(c.kvcm.endpoints, sizeof c.kvcm.endpoints, "http://kvcm:6382");
        ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s: %s", good[i], err);
    }

    /* Refused: and the message says why uniqueness matters. */
    struct {
        const char *value, *expect;
    } bad[] = {
        { "localhost:8088", "(a name for loopback)" },
        { "127.0.0.1:8088", "(a loopback address)" },
        { "[::1]:8088", "(a loopback address)" },
        { "0.0.0.0:8088", "(the unspecified address)" },
        { "node#1:8088", "'#'" },
        { "node7", "expected HOST:PORT with a port 1..65535" },
        { "node7:", "expected HOST:PORT with a port 1..65535" },
        { "10.0.0.5:99999", "expected HOST:PORT with a port 1..65535" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        config_defaults(&c);
        snprintf(assign, sizeof assign, "kvcm.host_ip_port=%s", bad[i].value);
        ck_assert_msg(config_apply_override(&c, assign, err, sizeof err) == -1, "%s accepted", assign);
        ck_assert_msg(strstr(err, bad[i].expect), "%s: %s", assign, err);
        ck_assert_msg(strncmp(err, "override kvcm.host_ip_port: ", 28) == 0, "%s", err);
        ck_assert_str_eq(c.kvcm.host_ip_port, "");
        if (strstr(bad[i].expect, "address") || strstr(bad[i].expect, "loopback"))
            ck_assert_msg(strstr(err, "is not unique-looking") &&
                          strstr(err, "overwrite each other's blocks and snapshots") &&
                          strstr(err, "a port unique to this daemon"), "%s", err);
    }
}
END_TEST

START_TEST(test_kvcm_endpoints)
{
    char urls[CONFIG_KVCM_ENDPOINTS_MAX][CONFIG_URL_MAX];
    size_t n = 99;
    struct kvn_config c;

    /* Default: none. */
    config_defaults(&c);
    ck_assert_int_eq(config_kvcm_endpoints(&c.kvcm, urls, CONFIG_KVCM_ENDPOINTS_MAX, &n), 0);
    ck_assert_uint_eq(n, 0);

    /* Commas and/or blanks separate; trailing slashes go; the rest is kept. */
    snprintf(c.kvcm.endpoints, sizeof c.kvcm.endpoints,
             " http://kvcm-0:6382/,https://kvcm-1.example:443/prefix//  http://[fd00::7]:6382 ,,\tHTTP://10.0.0.9 ,");
    ck_assert_int_eq(config_kvcm_endpoints(&c.kvcm, urls, CONFIG_KVCM_ENDPOINTS_MAX, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_str_eq(urls[0], "http://kvcm-0:6382");
    ck_assert_str_eq(urls[1], "https://kvcm-1.example:443/prefix");
    ck_assert_str_eq(urls[2], "http://[fd00::7]:6382");
    ck_assert_str_eq(urls[3], "HTTP://10.0.0.9");
    /* Fewer slots than URLs: refused, not cut short. */
    ck_assert_int_eq(config_kvcm_endpoints(&c.kvcm, urls, 3, &n), -1);
    ck_assert_uint_eq(n, 0);

    /* Exactly CONFIG_KVCM_ENDPOINTS_MAX, through the parser; one more is refused. */
    char list[512] = "", err[CONFIG_ERR_MAX], assign[600];
    for (int i = 0; i < CONFIG_KVCM_ENDPOINTS_MAX; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%shttp://kvcm-%d:6382", i ? "," : "", i);
    }
    snprintf(assign, sizeof assign, "kvcm.endpoints=%s", list);
    config_defaults(&c);
    ck_assert_msg(config_apply_override(&c, assign, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(config_kvcm_endpoints(&c.kvcm, urls, CONFIG_KVCM_ENDPOINTS_MAX, &n), 0);
    ck_assert_uint_eq(n, CONFIG_KVCM_ENDPOINTS_MAX);
    ck_assert_str_eq(urls[7], "http://kvcm-7:6382");
    snprintf(assign, sizeof assign, "kvcm.endpoints=%s http://kvcm-8:6382", list);
    ck_assert_int_eq(config_apply_override(&c, assign, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "override kvcm.endpoints: too many endpoints (at most 8)"), "%s", err);
    snprintf(c.kvcm.endpoints, sizeof c.kvcm.endpoints, "%s http://kvcm-8:6382", list);
    ck_assert_int_eq(config_kvcm_endpoints(&c.kvcm, urls, CONFIG_KVCM_ENDPOINTS_MAX, &n), -1);

    /* Invalid text (a struct edited by code) is refused by the splitter too. */
    const char *bad[] = { "kvcm:6382", "http://a:1 http://a:1/", "http://a:1 ftp://b", "http://a b" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(c.kvcm.endpoints, 0, sizeof c.kvcm.endpoints);
        snprintf(c.kvcm.endpoints, sizeof c.kvcm.endpoints, "%s", bad[i]);
        ck_assert_msg(config_kvcm_endpoints(&c.kvcm, urls, CONFIG_KVCM_ENDPOINTS_MAX, &n) == -1, "'%s' accepted", bad[i]);
    }
}
END_TEST

START_TEST(test_kvcm_expand)
{
    struct kvn_config c;
    config_defaults(&c);
    const struct config_kvcm_vars v = {
        .model = "qwen2-7b", .dtype = "bf16", .block_tokens = 16, .tp_size = 2, .fingerprint = UINT64_C(0xabc123),
        .host_ip_port = "10.0.0.5:8088", .medium = "hbm", .block_bytes = 131072, .key = -4211,
    };
    char out[256];

    /* The defaults give rtp-llm's names, and an instance id that carries the
     * deployment's fingerprint; the URI follows the medium. */
    ck_assert_int_eq(config_kvcm_expand(c.kvcm.instance_id, &v, out, sizeof out), 18);
    ck_assert_str_eq(out, "qwen2-7b_16_abc123");
    ck_assert_int_eq(config_kvcm_expand(c.kvcm.spec_name, &v, out, sizeof out), 14);
    ck_assert_str_eq(out, "rtp_llm_hbm_16");
    ck_assert_int_eq(config_kvcm_expand(c.kvcm.location_uri, &v, out, sizeof out), 39);
    ck_assert_str_eq(out, "rtp-llm://10.0.0.5:8088/hbm?size=131072");
    struct config_kvcm_vars dram = v;
    dram.medium = "dram";
    ck_assert_int_eq(config_kvcm_expand(c.kvcm.location_uri, &dram, out, sizeof out), 40);
    ck_assert_str_eq(out, "rtp-llm://10.0.0.5:8088/dram?size=131072");

    /* Every placeholder, repeated ones, literal text around them. */
    ck_assert_int_gt(config_kvcm_expand("{model}|{dtype}|{block_tokens}|{tp_size}|{fingerprint}|{host_ip_port}|"
                                        "{medium}|{block_bytes}|{key}|{model}", &v, out, sizeof out), 0);
    ck_assert_str_eq(out, "qwen2-7b|bf16|16|2|abc123|10.0.0.5:8088|hbm|131072|-4211|qwen2-7b");
    struct config_kvcm_vars w = v;
    w.key = INT64_MIN;
    w.fingerprint = UINT64_MAX;
    w.block_bytes = UINT64_MAX;
    ck_assert_int_gt(config_kvcm_expand("{key}/{fingerprint}/{block_bytes}", &w, out, sizeof out), 0);
    ck_assert_str_eq(out, "-9223372036854775808/ffffffffffffffff/18446744073709551615");
    w.fingerprint = 0x1;   /* no padding, as in deployment ids */
    ck_assert_int_eq(config_kvcm_expand("{fingerprint}", &w, out, sizeof out), 1);
    ck_assert_str_eq(out, "1");
    ck_assert_int_eq(config_kvcm_expand("plain", &v, out, sizeof out), 5);
    ck_assert_str_eq(out, "plain");
    ck_assert_int_eq(config_kvcm_expand("", &v, out, sizeof out), 0);
    ck_assert_str_eq(out, "");

    /* Unknown placeholders and stray braces: -1 and an empty result. */
    const char *bad[] = { "{rank}", "a}", "{model", "{}", "{{model}}", "x{model}{", "{Model}", "{ model}" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(out, 'x', sizeof out);
        ck_assert_msg(config_kvcm_expand(bad[i], &v, out, sizeof out) == -1, "'%s' expanded to '%s'", bad[i], out);
        ck_assert_str_eq(out, "");
    }

    /* Overflow: the result and its NUL must fit. */
    char small[12];
    ck_assert_int_eq(config_kvcm_expand("{model}_{block_tokens}", &v, small, 11), -1);
    ck_assert_str_eq(small, "");
    ck_assert_int_eq(config_kvcm_expand("{model}_{block_tokens}", &v, small, 12), 11);
    ck_assert_str_eq(small, "qwen2-7b_16");
    ck_assert_int_eq(config_kvcm_expand("0123456789ab", &v, small, sizeof small), -1);
    ck_assert_int_eq(config_kvcm_expand("0123456789a", &v, small, sizeof small), 11);
    ck_assert_int_eq(config_kvcm_expand("{block_bytes}", &v, small, 6), -1);
    ck_assert_int_eq(config_kvcm_expand("x", &v, small, 0), -1);
    ck_assert_int_eq(config_kvcm_expand("x", &v, NULL, 8), -1);
    ck_assert_int_eq(config_kvcm_expand(NULL, &v, small, sizeof small), -1);
    ck_assert_int_eq(config_kvcm_expand("x", NULL, small, sizeof small), -1);

    /* A NULL string is an error only where the template uses it. */
    struct config_kvcm_vars partial = { .host_ip_port = "h:1", .medium = "dram", .block_bytes = 4096, .key = 7 };
    ck_assert_int_gt(config_kvcm_expand(c.kvcm.location_uri, &partial, out, sizeof out), 0);
    ck_assert_str_eq(out, "rtp-llm://h:1/dram?size=4096");
    ck_assert_int_eq(config_kvcm_expand(c.kvcm.instance_id, &partial, out, sizeof out), -1);
    ck_assert_int_eq(config_kvcm_expand("{dtype}", &partial, out, sizeof out), -1);
}
END_TEST

/* ---- config_write --------------------------------------------------------------- */

static void assert_round_trip(const struct kvn_config *c)
{
    char *text = config_to_text(c);
    char err[CONFIG_ERR_MAX];
    struct kvn_config back;
    config_defaults(&back);
    /* Start from different values so a missing option cannot go unnoticed. */
    back.max_clients = 3;
    back.high_watermark = 0.33;
    back.log_level = LOG_LEVEL_ERROR;
    snprintf(back.socket_path, sizeof back.socket_path, "elsewhere");
    memset(back.socket_path + 9, 0, sizeof back.socket_path - 9);
    back.persist_backend = CONFIG_BACKEND_OFF == c->persist_backend ? CONFIG_BACKEND_FILE : CONFIG_BACKEND_OFF;
    back.persist_lookup = CONFIG_LOOKUP_OFF == c->persist_lookup ? CONFIG_LOOKUP_ON : CONFIG_LOOKUP_OFF;
    back.persist_workers = c->persist_workers == 7 ? 8 : 7;
    snprintf(back.persist_url, sizeof back.persist_url, "http://elsewhere");
    snprintf(back.persist_socket, sizeof back.persist_socket, "/tmp/elsewhere.sock");
    snprintf(back.persist_object_namespace, sizeof back.persist_object_namespace, "elsewhere");
    back.persist_tombstones = c->persist_tombstones == 7 ? 8 : 7;
    back.persist_lookup_negative_ttl_ms = c->persist_lookup_negative_ttl_ms == 7 ? 8 : 7;
    back.kvcm.enabled = !c->kvcm.enabled;
    snprintf(back.kvcm.endpoints, sizeof back.kvcm.endpoints, "http://elsewhere:1");
    snprintf(back.kvcm.host_ip_port, sizeof back.kvcm.host_ip_port, "elsewhere:1");
    back.kvcm.query_max_hosts = c->kvcm.query_max_hosts == 7 ? 8 : 7;
    back.pin_chunk_bytes = c->pin_chunk_bytes == 7 * MIB ? 8 * MIB : 7 * MIB;
    back.hbm_backend = c->hbm_backend == CONFIG_HBM_SIM ? CONFIG_HBM_CUDA : CONFIG_HBM_SIM;
    back.hbm_bytes = c->hbm_bytes == 3 * GIB ? 5 * GIB : 3 * GIB;
    snprintf(back.hbm_devices, sizeof back.hbm_devices, "9");
    back.hbm_high_watermark = 0.44;
    back.hbm_low_watermark = 0.22;
    back.hbm_required = !c->hbm_required;
    back.hbm_copy_batch_bytes = c->hbm_copy_batch_bytes == 3 * MIB ? 5 * MIB : 3 * MIB;
    back.hbm_alloc_retry_ms = c->hbm_alloc_retry_ms == 1500 ? 2500 : 1500;
    int rc = load_text(&back, text, err, sizeof err, NULL, 0);
    ck_assert_msg(rc == 0, "config_write output does not parse: %s\n%s", err, text);
    assert_config_equal(c, &back);
    char *again = config_to_text(&back);
    ck_assert_str_eq(text, again);
    free(again);
    free(text);
}

START_TEST(test_write_round_trip_defaults)
{
    struct kvn_config c;
    config_defaults(&c);
    assert_round_trip(&c);

    char *text = config_to_text(&c);
    /* Every option is written, in its readable form. */
    for (size_t i = 0; i < NOPTIONS; i++) {
        char key[64];
        snprintf(key, sizeof key, "\n%s = ", all_options[i][1]);
        ck_assert_msg(strstr(text, key), "config_write lacks %s.%s:\n%s", all_options[i][0], all_options[i][1], text);
    }
    const char *forms[] = { "\n[server]\n", "\n[memory]\n", "\n[leases]\n", "\n[log]\n",
                            "socket_mode = 0660\n", "max_frame_bytes = 64MiB\n", "request_timeout = 5s\n",
                            "shutdown_timeout = 10s\nframe_timeout = 10s\nmax_buffered_input_bytes = 256MiB\n"
                            "hello_timeout = 5s\nmax_buffered_output_bytes = 1GiB\nworker_stall_timeout = 10s\n",
                            "\n[admin]\nlisten = 127.0.0.1:9180\nmax_connections = 64\nrequest_timeout = 5s\n",
                            "host_bytes = 1GiB\n", "slab_bytes = 16MiB\n", "high_watermark = 0.95\n",
                            "low_watermark = 0.9\n", "pin_host = auto\n", "reaper_interval = 1s\n",
                            "namespace_quota = 0\npin_chunk_bytes = 1GiB\n\n[hbm]\nbackend = auto\nbytes = 0\n"
                            "devices = all\nhigh_watermark = 0.9\nlow_watermark = 0.8\nrequired = off\n"
                            "copy_batch_bytes = 64MiB\nrelease_timeout = 5s\nalloc_retry = 10s\n\n[leases]\n",
                            "level = info\n", "\n[persist]\n", "backend = file\n", "policy = write_through\n",
                            "path = /var/lib/kvnode\n", "capacity = 0\n", "fsync = batch\n", "workers = 2\n",
                            "queue = 4096\n", "\nurl = \n", "connect_timeout = 1s\n", "timeout = 5s\n",
                            "lookup = auto\n", "\n[kvcm]\nenabled = off\nendpoints = \ninstance_group = default\n"
                            "instance_id = {model}_{block_tokens}_{fingerprint}\nhost_ip_port = \n"
                            "storage_type = ST_EVENT_REPORT_L1P5\nmedium_hbm = hbm\nmedium_host = dram\n"
                            "spec_name = rtp_llm_hbm_{block_tokens}\n"
                            "location_uri = rtp-llm://{host_ip_port}/{medium}?size={block_bytes}\n"
                            "request_timeout = 1500ms\nconnect_timeout = 500ms\nsnapshot_timeout = 30s\n"
                            "flush_interval = 20ms\nbatch_events = 1000\nqueue_events = 100000\n"
                            "heartbeat_interval = 1s\nretry_base = 500ms\nretry_max = 30s\n"
                            "snapshot_interval = 5m\nhost_down_timeout = 500ms\nstall_timeout = 1m\n"
                            "query_deadline = 20ms\n"
                            "query_max_hosts = 8\nquery_breaker_failures = 5\nquery_breaker_open = 10s\n"
                            "query_negative_ttl = 1s\n" };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        ck_assert_msg(strstr(text, forms[i]), "config_write lacks '%s':\n%s", forms[i], text);
    /* Exactly one line per option, plus the comment, blanks and headers. */
    unsigned assignments = 0;
    for (const char *p = text; (p = strstr(p, " = ")); p++)
        assignments++;
    ck_assert_uint_eq(assignments, NOPTIONS);
    free(text);
}
END_TEST

START_TEST(test_write_round_trip_custom)
{
    struct kvn_config c;
    config_defaults(&c);
    snprintf(c.socket_path, sizeof c.socket_path, "/tmp/with space/k=v:x.sock");
    c.socket_mode = 0;
    c.max_frame_bytes = 4097;
    c.max_keys_per_request = 1;
    c.max_clients = 65536;
    c.max_namespaces = 3;
    c.request_timeout_ms = 1500;
    c.shutdown_timeout_ms = 0;
    c.hbm_release_timeout_ms = 250;
    c.frame_timeout_ms = 2500;
    c.max_buffered_input_bytes = 3 * MIB + 1;
    c.hello_timeout_ms = 1500;
    c.max_buffered_output_bytes = 5 * MIB;
    c.worker_stall_timeout_ms = 2500;
    c.admin_max_connections = 7;
    c.admin_request_timeout_ms = 90000;
    c.host_bytes = 1536 * MIB + 256;
    c.slab_bytes = 65792;
    c.high_watermark = 0.123456789012345;
    c.low_watermark = 0.1 + 0.2 - 0.3;   /* not a "nice" decimal */
    c.pin_host = CONFIG_PIN_ON;
    c.namespace_quota = 3 * MIB;
    c.read_lease_ttl_ms = 90000;
    c.write_lease_ttl_ms = 3600000;
    c.reaper_interval_ms = 10;
    c.max_leases_per_client = 1048576;
    c.log_level = LOG_LEVEL_DEBUG;
    memset(c.admin_listen, 0, sizeof c.admin_listen);   /* the parser zero-fills the tail */
    snprintf(c.admin_listen, sizeof c.admin_listen, "[::1]:0");
    c.persist_backend = CONFIG_BACKEND_V6D;
    c.persist_policy = CONFIG_POLICY_WRITE_BACK;
    memset(c.persist_path, 0, sizeof c.persist_path);
    snprintf(c.persist_path, sizeof c.persist_path, "rel/with space/k=v;x");
    c.persist_capacity = 5 * GIB + 512;
    c.persist_fsync = 2;   /* always */
    c.persist_workers = 32;
    c.persist_queue = 16;
    snprintf(c.persist_url, sizeof c.persist_url, "https://kvs.example:8443/v1?a=b");
    snprintf(c.persist_socket, sizeof c.persist_socket, "/run/v6d/data.sock");
    c.persist_connect_timeout_ms = 250;
    c.persist_timeout_ms = 120000;
    c.persist_lookup = CONFIG_LOOKUP_ON;
    snprintf(c.persist_object_namespace, sizeof c.persist_object_namespace, "team-a.kv");
    c.persist_tombstones = 1000;
    c.persist_lookup_negative_ttl_ms = 250;
    c.pin_chunk_bytes = 3 * MIB;
    c.hbm_backend = CONFIG_HBM_SIM;
    c.hbm_bytes = 2 * GIB + 65536;
    memset(c.hbm_devices, 0, sizeof c.hbm_devices);
    snprintf(c.hbm_devices, sizeof c.hbm_devices, "1, 0\t15");
    c.hbm_high_watermark = 0.875;
    c.hbm_low_watermark = 0.1 + 0.2 - 0.3;
    c.hbm_required = 1;
    c.hbm_copy_batch_bytes = 4 * GIB;
    c.hbm_alloc_retry_ms = 2500;
    kvcm_fill(&c);
    c.kvs_enabled = 1;
    memset(c.kvs_listen, 0, sizeof c.kvs_listen);
    snprintf(c.kvs_listen, sizeof c.kvs_listen, "unix:/run/kvnode/kvs http.sock");
    snprintf(c.kvs_socket_path, sizeof c.kvs_socket_path, "/run/kvnode/kvs data.sock");
    c.kvs_max_body_bytes = 4097;
    c.kvs_max_keys = 12000;
    c.kvs_max_leases = 1;
    c.kvs_default_term_ms = 1500;
    c.kvs_max_term_ms = 3600000;
    c.kvs_tp_size = 8;
    c.kvs_max_connections = 3;
    c.kvs_request_timeout_ms = 250;
    char err[CONFIG_ERR_MAX];
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    assert_round_trip(&c);

    char *text = config_to_text(&c);
    const char *forms[] = { "socket_mode = 0000\n", "max_frame_bytes = 4097\n", "request_timeout = 1500ms\n",
                            "frame_timeout = 2500ms\nmax_buffered_input_bytes = 3145729\nhello_timeout = 1500ms\n"
                            "max_buffered_output_bytes = 5MiB\nworker_stall_timeout = 2500ms\n",
                            "max_connections = 7\nrequest_timeout = 90s\n",
                            "shutdown_timeout = 0s\n", "read_ttl = 90s\n", "write_ttl = 1h\n",
                            "pin_host = on\n", "level = debug\n", "namespace_quota = 3MiB\n",
                            "backend = v6d\n", "policy = write_back\n", "\npath = rel/with space/k=v;x\n",
                            "capacity = 5368709632\n", "fsync = always\n", "workers = 32\n", "queue = 16\n",
                            "url = https://kvs.example:8443/v1?a=b\n", "socket_path = /run/v6d/data.sock\n",
                            "connect_timeout = 250ms\n", "timeout = 2m\n", "lookup = on\n",
                            "pin_chunk_bytes = 3MiB\n", "\n[hbm]\nbackend = sim\nbytes = 2097216KiB\n"
                            "devices = 1, 0\t15\nhigh_watermark = 0.875\n",
                            "\nrequired = on\ncopy_batch_bytes = 4GiB\nrelease_timeout = 250ms\nalloc_retry = 2500ms\n"
                            "\n[leases]\n",
                            "\n[kvcm]\nenabled = on\nendpoints = http://kvcm-0:6382, https://kvcm-1.example/meta/\n"
                            "instance_group = prod-a\ninstance_id = {model}-{fingerprint}_{block_tokens}\n"
                            "host_ip_port = 10.1.2.3:18088\nstorage_type = ST_EVENT_REPORT_L2\nmedium_hbm = gpu\n"
                            "medium_host = host\nspec_name = kvnode_{block_tokens}_{block_bytes}\n"
                            "location_uri = kvnode://{host_ip_port}/{medium}/{key}\nrequest_timeout = 2500ms\n"
                            "connect_timeout = 250ms\nsnapshot_timeout = 90s\nflush_interval = 5ms\n"
                            "batch_events = 64\nqueue_events = 128\nheartbeat_interval = 200ms\n"
                            "retry_base = 100ms\nretry_max = 5s\nsnapshot_interval = 1h\n"
                            "host_down_timeout = 250ms\nstall_timeout = 45s\nquery_deadline = 50ms\n"
                            "query_max_hosts = 3\n"
                            "query_breaker_failures = 2\nquery_breaker_open = 1500ms\nquery_negative_ttl = 200ms\n" };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        ck_assert_msg(strstr(text, forms[i]), "config_write lacks '%s':\n%s", forms[i], text);
    free(text);

    c.pin_host = CONFIG_PIN_OFF;
    c.log_level = LOG_LEVEL_ERROR;
    c.host_bytes = UINT64_C(5) << 40;
    c.persist_backend = CONFIG_BACKEND_OFF;
    c.persist_policy = CONFIG_POLICY_OFF;
    memset(c.persist_path, 0, sizeof c.persist_path);   /* not needed without the file backend */
    c.persist_fsync = 0;   /* never */
    c.persist_lookup = CONFIG_LOOKUP_OFF;
    c.persist_capacity = 7 * (GIB << 10);
    c.pin_chunk_bytes = GIB << 10;
    c.hbm_backend = CONFIG_HBM_NONE;
    c.hbm_bytes = 0;
    memset(c.hbm_devices, 0, sizeof c.hbm_devices);   /* empty: all devices */
    c.hbm_required = 0;
    c.hbm_copy_batch_bytes = MIB;
    /* kvcm off with its fields still set, and with them empty. */
    c.kvcm.enabled = 0;
    assert_round_trip(&c);
    memset(c.kvcm.endpoints, 0, sizeof c.kvcm.endpoints);
    memset(c.kvcm.host_ip_port, 0, sizeof c.kvcm.host_ip_port);
    memset(c.kvcm.instance_group, 0, sizeof c.kvcm.instance_group);
    c.kvcm.storage_type = CONFIG_KVCM_STORAGE_L1P5;
    assert_round_trip(&c);
}
END_TEST

/* ---- the shipped files -------------------------------------------------------- */

START_TEST(test_shipped_conf_parses)
{
    char path[512], err[CONFIG_ERR_MAX];
    char *text = repo_slurp("conf/kvnode.conf", path, sizeof path);
    free(text);
    struct kvn_config c;
    config_defaults(&c);
    int rc = config_load_file(&c, path, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(c.host_bytes, GIB);
    ck_assert_str_eq(c.socket_path, "run/kvnode.sock");
    ck_assert_int_eq(c.persist_backend, CONFIG_BACKEND_FILE);
    ck_assert_str_eq(c.persist_path, "var");   /* make run stores into ./var */
}
END_TEST

START_TEST(test_shipped_conf_documents_defaults)
{
    /* Uncommenting every "#key = value" line must give exactly the built-in
     * defaults (plus the three deliberate settings), and every option must be
     * present in the file. */
    char path[512], err[CONFIG_ERR_MAX];
    char *text = repo_slurp("conf/kvnode.conf", path, sizeof path);
    char *out = NULL;
    size_t outlen = 0;
    FILE *mem = open_memstream(&out, &outlen);
    regex_t commented;
    ck_assert_int_eq(regcomp(&commented, "^#[a-z_]+ =( |$)", REG_EXTENDED | REG_NOSUB), 0);
    char *save = NULL;
    unsigned uncommented = 0;
    bool tenant_example = false;   /* an example, not defaults: test_tenant_conf_example's */
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        tenant_example |= strncmp(line, "#[tenant.", 9) == 0;
        if (!tenant_example && regexec(&commented, line, 0, NULL, 0) == 0) {
            line++;
            uncommented++;
        }
        fprintf(mem, "%s\n", line);
    }
    fclose(mem);
    regfree(&commented);
    free(text);

    struct kvn_config c, want;
    config_defaults(&c);
    c.max_clients = 1;   /* proves the commented default is really read */
    int rc = load_text(&c, out, err, sizeof err, NULL, 0);
    ck_assert_msg(rc == 0, "uncommented conf/kvnode.conf: %s", err);
    config_defaults(&want);
    memset(want.socket_path, 0, sizeof want.socket_path);
    snprintf(want.socket_path, sizeof want.socket_path, "run/kvnode.sock");
    memset(want.persist_path, 0, sizeof want.persist_path);
    snprintf(want.persist_path, sizeof want.persist_path, "var");
    assert_config_equal(&c, &want);
    /* all but socket_path, host_bytes and [persist] path */
    ck_assert_uint_eq(uncommented, NOPTIONS - 3);

    for (size_t i = 0; i < NOPTIONS; i++) {
        char key[64], hdr[32];
        snprintf(key, sizeof key, "\n%s =", all_options[i][1]);
        snprintf(hdr, sizeof hdr, "\n[%s]\n", all_options[i][0]);
        const char *section = strstr(out, hdr);
        ck_assert_msg(section, "conf/kvnode.conf lacks [%s]", all_options[i][0]);
        /* The key is documented in its own section, before the next one. */
        const char *found = strstr(section, key);
        const char *next = strstr(section + 1, "\n[");
        ck_assert_msg(found && (!next || found < next), "conf/kvnode.conf lacks %s in [%s]", all_options[i][1],
                      all_options[i][0]);
    }
    free(out);
}
END_TEST

START_TEST(test_man_page_lists_options)
{
    char path[512];
    char *man = repo_slurp("man/kvnode.conf.5", path, sizeof path);
    for (size_t i = 0; i < NOPTIONS; i++) {
        char key[64], hdr[32];
        /* The entry is in the option's own subsection (socket_path is in two). */
        snprintf(hdr, sizeof hdr, "\n.SS [%s]\n", all_options[i][0]);
        const char *section = strstr(man, hdr);
        ck_assert_msg(section, "%s lacks a subsection '.SS [%s]'", path, all_options[i][0]);
        snprintf(key, sizeof key, "\n.TP\n.B %s\n", all_options[i][1]);
        const char *entry = strstr(section, key);
        const char *next = strstr(section + 1, "\n.S");
        ck_assert_msg(entry && (!next || entry < next), "%s lacks an entry '.B %s' under [%s]", path,
                      all_options[i][1], all_options[i][0]);
        entry += strlen("\n.TP");
        /* The reload column matches the code. */
        bool restart = config_option_reloadable(all_options[i][0], all_options[i][1]) == false;
        /* The entry runs to the next paragraph, subsection or section. */
        const char *end = entry + strlen(entry);
        const char *stops[] = { "\n.TP", "\n.SS", "\n.SH" };
        for (size_t j = 0; j < sizeof stops / sizeof stops[0]; j++) {
            const char *stop = strstr(entry + 1, stops[j]);
            if (stop && stop < end)
                end = stop;
        }
        const char *mark = strstr(entry, "restart required");
        bool says_restart = mark && mark < end;
        ck_assert_msg(restart == says_restart, "%s: %s.%s restart marking disagrees with the code", path,
                      all_options[i][0], all_options[i][1]);
    }
    free(man);
}
END_TEST

/* ---- reload helpers --------------------------------------------------------------- */

START_TEST(test_restart_required)
{
    const char *restart[] = { "server.socket_path", "server.socket_mode", "server.socket_group", "memory.host_bytes",
                              "memory.slab_bytes", "server.max_namespaces", "memory.pin_host", "admin.listen",
                              "persist.backend", "persist.path", "persist.capacity", "persist.fsync",
                              "persist.segment_bytes", "persist.direct_io",
                              "persist.workers", "persist.queue", "persist.url", "persist.socket_path",
                              "persist.connect_timeout", "persist.timeout", "persist.lookup",
                              "persist.object_namespace", "persist.tombstones", "persist.nodes",
                              "persist.user", "persist.password_file",
                              /* [kvs_server]: all but the connection limits; its listeners are set up once */
                              "kvs_server.enabled", "kvs_server.listen", "kvs_server.socket_path",
                              "kvs_server.max_body_bytes", "kvs_server.max_keys", "kvs_server.max_leases",
                              "kvs_server.default_term", "kvs_server.max_term", "kvs_server.tp_size",
                              "memory.pin_chunk_bytes", "memory.huge_pages", "memory.numa",
                              /* [hbm]: all but the demotion watermarks */
                              "hbm.backend", "hbm.bytes", "hbm.devices", "hbm.required", "hbm.copy_batch_bytes",
                              "hbm.alloc_retry",
                              /* [kvcm]: all of it; its threads read their settings once */
                              "kvcm.enabled", "kvcm.endpoints", "kvcm.instance_group", "kvcm.instance_id",
                              "kvcm.host_ip_port", "kvcm.storage_type", "kvcm.medium_hbm", "kvcm.medium_host",
                              "kvcm.spec_name", "kvcm.location_uri", "kvcm.request_timeout",
                              "kvcm.connect_timeout", "kvcm.snapshot_timeout", "kvcm.flush_interval",
                              "kvcm.batch_events", "kvcm.queue_events", "kvcm.heartbeat_interval",
                              "kvcm.retry_base", "kvcm.retry_max", "kvcm.snapshot_interval",
                              "kvcm.host_down_timeout", "kvcm.stall_timeout", "kvcm.query_deadline",
                              "kvcm.query_max_hosts",
                              "kvcm.query_breaker_failures", "kvcm.query_breaker_open",
                              "kvcm.query_negative_ttl" };
    for (size_t i = 0; i < NOPTIONS; i++) {
        bool want_restart = false;
        char name[64];
        snprintf(name, sizeof name, "%s.%s", all_options[i][0], all_options[i][1]);
        for (size_t j = 0; j < sizeof restart / sizeof restart[0]; j++)
            if (strcmp(name, restart[j]) == 0)
                want_restart = true;
        ck_assert_msg(config_option_reloadable(all_options[i][0], all_options[i][1]) == !want_restart,
                      "%s.%s", all_options[i][0], all_options[i][1]);
    }
    ck_assert(!config_option_reloadable("memory", "bogus"));
    ck_assert(!config_option_reloadable("leases", "host_bytes"));
    /* [persist]: only the write policy and the TTL of cached misses change live. */
    ck_assert(config_option_reloadable("persist", "policy"));
    ck_assert(!config_option_reloadable("persist", "backend"));
    ck_assert(!config_option_reloadable("persist", "path"));
    ck_assert(!config_option_reloadable("persist", "lookup"));
    ck_assert(config_option_reloadable("persist", "lookup_negative_ttl"));
    ck_assert(!config_option_reloadable("persist", "bogus"));

    struct kvn_config a, b;
    char names[256];
    config_defaults(&a);
    b = a;
    ck_assert_int_eq(config_restart_required(&a, &b, names, sizeof names), 0);
    ck_assert_str_eq(names, "");
    b.max_clients = 5;         /* reloadable */
    b.read_lease_ttl_ms = 10;  /* reloadable */
    b.log_level = LOG_LEVEL_DEBUG;
    ck_assert_int_eq(config_restart_required(&a, &b, names, sizeof names), 0);
    b.host_bytes = 2 * GIB;
    b.pin_host = CONFIG_PIN_OFF;
    snprintf(b.socket_path, sizeof b.socket_path, "/tmp/other.sock");
    ck_assert_int_eq(config_restart_required(&a, &b, names, sizeof names), 3);
    ck_assert_str_eq(names, "server.socket_path, memory.host_bytes, memory.pin_host");
    ck_assert_int_eq(config_restart_required(&a, &b, NULL, 0), 3);

    /* [persist]: a new policy applies live; a new store needs a restart. */
    b = a;
    b.persist_policy = CONFIG_POLICY_WRITE_BACK;
    ck_assert_int_eq(config_restart_required(&a, &b, names, sizeof names), 0);
    b.persist_backend = CONFIG_BACKEND_V6D;
    snprintf(b.persist_path, sizeof b.persist_path, "/srv/kv");
    snprintf(b.persist_url, sizeof b.persist_url, "http://kvs:8080");
    b.persist_fsync = 2;
    b.persist_timeout_ms = 1000;
    b.persist_lookup = CONFIG_LOOKUP_ON;
    ck_assert_int_eq(config_restart_required(&a, &b, names, sizeof names), 6);
    ck_assert_str_eq(names, "persist.backend, persist.path, persist.fsync, persist.url, persist.timeout, "
                            "persist.lookup");
    /* A reload keeps the running store and takes the new policy. */
    config_keep_restart_only(&b, &a);
    ck_assert_int_eq(config_restart_required(&a, &b, NULL, 0), 0);
    ck_assert_int_eq(b.persist_backend, CONFIG_BACKEND_FILE);
    ck_assert_str_eq(b.persist_path, a.persist_path);
    ck_assert_int_eq(b.persist_policy, CONFIG_POLICY_WRITE_BACK);

    /* [kvcm]: switching it on, or any of its settings, waits for a restart;
     * a reload keeps the running values. */
    b = a;
    kvcm_fill(&b);
    b.max_clients = 77;   /* reloadable, applied */
    char all[1024];
    ck_assert_int_eq(config_restart_required(&a, &b, all, sizeof all), 27);
    ck_assert_msg(strncmp(all, "kvcm.enabled, kvcm.endpoints, kvcm.instance_group, ", 51) == 0, "%s", all);
    ck_assert_msg(strstr(all, ", kvcm.query_breaker_open, kvcm.query_negative_ttl") != NULL, "%s", all);
    config_keep_restart_only(&b, &a);
    ck_assert_int_eq(config_restart_required(&a, &b, NULL, 0), 0);
    ck_assert_int_eq(b.kvcm.enabled, 0);
    ck_assert_str_eq(b.kvcm.endpoints, "");
    ck_assert_uint_eq(b.kvcm.flush_interval_ms, 20);
    ck_assert_uint_eq(b.max_clients, 77);
    ck_assert(!config_option_reloadable("kvcm", "flush_interval"));
    ck_assert(!config_option_reloadable("kvcm", "bogus"));

    /* [hbm]: new watermarks apply live; the tier's shape waits for a restart. */
    ck_assert(config_option_reloadable("hbm", "high_watermark"));
    ck_assert(config_option_reloadable("hbm", "low_watermark"));
    ck_assert(!config_option_reloadable("hbm", "bytes"));
    ck_assert(!config_option_reloadable("hbm", "bogus"));
    ck_assert(!config_option_reloadable("memory", "pin_chunk_bytes"));
    b = a;
    b.hbm_high_watermark = 0.7;
    b.hbm_low_watermark = 0.6;
    ck_assert_int_eq(config_restart_required(&a, &b, names, sizeof names), 0);
    ck_assert_str_eq(names, "");
    b.pin_chunk_bytes = 2 * MIB;
    b.hbm_backend = CONFIG_HBM_SIM;
    b.hbm_bytes = 4 * GIB;
    snprintf(b.hbm_devices, sizeof b.hbm_devices, "0,1");
    b.hbm_required = 1;
    b.hbm_copy_batch_bytes = 16 * MIB;
    ck_assert_int_eq(config_restart_required(&a, &b, names, sizeof names), 6);
    ck_assert_str_eq(names, "memory.pin_chunk_bytes, hbm.backend, hbm.bytes, hbm.devices, hbm.required, "
                            "hbm.copy_batch_bytes");
    config_keep_restart_only(&b, &a);
    ck_assert_int_eq(config_restart_required(&a, &b, NULL, 0), 0);
    ck_assert_uint_eq(b.pin_chunk_bytes, GIB);
    ck_assert_int_eq(b.hbm_backend, CONFIG_HBM_AUTO);
    ck_assert_uint_eq(b.hbm_bytes, 0);
    ck_assert_str_eq(b.hbm_devices, "all");
    ck_assert_int_eq(b.hbm_required, 0);
    ck_assert_uint_eq(b.hbm_copy_batch_bytes, 64 * MIB);
    ck_assert_double_eq(b.hbm_high_watermark, 0.7);   /* reloadable, applied */
    ck_assert_double_eq(b.hbm_low_watermark, 0.6);
}
END_TEST

/* ---- log ------------------------------------------------------------------------ */

START_TEST(test_log_level_parse)
{
    ck_assert_int_eq(log_level_parse("error"), LOG_LEVEL_ERROR);
    ck_assert_int_eq(log_level_parse("warn"), LOG_LEVEL_WARN);
    ck_assert_int_eq(log_level_parse("info"), LOG_LEVEL_INFO);
    ck_assert_int_eq(log_level_parse("debug"), LOG_LEVEL_DEBUG);
    ck_assert_int_eq(log_level_parse("DEBUG"), LOG_LEVEL_DEBUG);
    ck_assert_int_eq(log_level_parse("warning"), -1);
    ck_assert_int_eq(log_level_parse(""), -1);
    ck_assert_int_eq(log_level_parse("info "), -1);
    ck_assert_int_eq(log_level_parse(NULL), -1);
    for (int l = LOG_LEVEL_ERROR; l <= LOG_LEVEL_DEBUG; l++)
        ck_assert_int_eq(log_level_parse(log_level_name(l)), l);
    ck_assert_str_eq(log_level_name(7), "unknown");
    ck_assert_str_eq(log_level_name(-1), "unknown");

    int saved = log_get_level();
    log_set_level(LOG_LEVEL_WARN);
    ck_assert_int_eq(log_get_level(), LOG_LEVEL_WARN);
    log_set_level(99);
    ck_assert_int_eq(log_get_level(), LOG_LEVEL_DEBUG);
    log_set_level(-5);
    ck_assert_int_eq(log_get_level(), LOG_LEVEL_ERROR);
    log_set_level(saved);
}
END_TEST

/* Runs fn with stderr redirected into a temp file; returns what was written. */
static char *capture_stderr(void (*fn)(void *), void *arg, bool journal)
{
    char path[256];
    temp_write("", path, sizeof path);
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
    close(fd);

    char *old_env = getenv("JOURNAL_STREAM") ? strdup(getenv("JOURNAL_STREAM")) : NULL;
    if (journal) {
        struct stat st;
        fstat(STDERR_FILENO, &st);
        char env[64];
        snprintf(env, sizeof env, "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
        setenv("JOURNAL_STREAM", env, 1);
    } else {
        /* Set, but naming another file: must be ignored. */
        setenv("JOURNAL_STREAM", "1:1", 1);
    }
    log_init();
    fn(arg);

    dup2(saved, STDERR_FILENO);
    close(saved);
    if (old_env)
        setenv("JOURNAL_STREAM", old_env, 1);
    else
        unsetenv("JOURNAL_STREAM");
    free(old_env);
    log_init();

    char *text = file_slurp(path);
    unlink(path);
    ck_assert_ptr_nonnull(text);
    return text;
}

static void log_some(void *arg)
{
    (void)arg;
    int saved = log_get_level();
    log_set_level(LOG_LEVEL_INFO);
    errno = EAGAIN;
    log_warn("hello %d", 42);
    ck_assert_int_eq(errno, EAGAIN);   /* logging keeps errno */
    log_debug("hidden %d", 1);         /* above the level */
    log_msg(LOG_LEVEL_DEBUG, "hidden too");
    log_error("two\nlines");
    log_info("ends with newline\n");
    log_set_level(LOG_LEVEL_DEBUG);
    log_debug("shown");
    log_set_level(saved);
}

START_TEST(test_log_format_plain)
{
    char *text = capture_stderr(log_some, NULL, false);
    regex_t re;
    const char *ts = "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z kvnoded\\[[0-9]+\\] ";
    char pattern[512];
    snprintf(pattern, sizeof pattern,
             "^%swarn: hello 42\n%serror: two\n%serror: lines\n%sinfo: ends with newline\n%sdebug: shown\n$",
             ts, ts, ts, ts, ts);
    ck_assert_int_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    ck_assert_msg(regexec(&re, text, 0, NULL, 0) == 0, "unexpected log output:\n%s", text);
    regfree(&re);
    char pid[32];
    snprintf(pid, sizeof pid, " kvnoded[%ld] ", (long)getpid());
    ck_assert_msg(strstr(text, pid), "no pid in:\n%s", text);
    free(text);
}
END_TEST

START_TEST(test_log_format_journal)
{
    char *text = capture_stderr(log_some, NULL, true);
    ck_assert_str_eq(text, "<4>warn: hello 42\n"
                           "<3>error: two\n"
                           "<3>error: lines\n"
                           "<6>info: ends with newline\n"
                           "<7>debug: shown\n");
    free(text);
}
END_TEST

#define LOG_THREADS 8
#define LOG_LINES   2000

static void *log_thread(void *arg)
{
    long id = (long)(intptr_t)arg;
    for (int i = 0; i < LOG_LINES; i++)
        log_info("thread %ld line %d %s", id, i, "payload-payload-payload-payload-payload-payload");
    return NULL;
}

static void log_from_threads(void *arg)
{
    (void)arg;
    pthread_t t[LOG_THREADS];
    for (long i = 0; i < LOG_THREADS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, log_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < LOG_THREADS; i++)
        pthread_join(t[i], NULL);
}

START_TEST(test_log_threads_whole_lines)
{
    int saved = log_get_level();
    log_set_level(LOG_LEVEL_INFO);
    char *text = capture_stderr(log_from_threads, NULL, false);
    log_set_level(saved);
    regex_t re;
    ck_assert_int_eq(regcomp(&re,
                             "^[0-9T:.Z-]{24} kvnoded\\[[0-9]+\\] info: thread [0-9]+ line [0-9]+ "
                             "payload-payload-payload-payload-payload-payload$",
                             REG_EXTENDED | REG_NOSUB), 0);
    unsigned lines = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        ck_assert_msg(regexec(&re, line, 0, NULL, 0) == 0, "torn line: '%s'", line);
        lines++;
    }
    regfree(&re);
    ck_assert_uint_eq(lines, LOG_THREADS * LOG_LINES);
    free(text);
}
END_TEST

/* ---- the option table --------------------------------------------------------- */

/* The text between "\n[section]\n" and the next section header in a
 * kvnode.conf-style file, or NULL. *end receives its end. */
static const char *conf_section(const char *text, const char *section, const char **end)
{
    char hdr[48];
    snprintf(hdr, sizeof hdr, "\n[%s]\n", section);
    const char *start = strstr(text, hdr);
    if (!start)
        return NULL;
    const char *next = strstr(start + 1, "\n[");
    *end = next ? next : start + strlen(start);
    return start;
}

START_TEST(test_table_options_documented)
{
    /* Every row of the option table -- not a list kept by hand -- appears
     * in conf/kvnode.conf (as "key =" or "#key =" in its section) and in
     * kvnode.conf(5) (".B key" under ".SS [section]"). */
    char cpath[512], mpath[512];
    char *conf = repo_slurp("conf/kvnode.conf", cpath, sizeof cpath);
    char *man = repo_slurp("man/kvnode.conf.5", mpath, sizeof mpath);
    const char *section, *key;
    size_t n = 0;
    for (; config_option_at(n, &section, &key); n++) {
        char plain[80], commented[80];
        const char *end;
        const char *s = conf_section(conf, section, &end);
        ck_assert_msg(s, "%s lacks [%s]", cpath, section);
        snprintf(plain, sizeof plain, "\n%s =", key);
        snprintf(commented, sizeof commented, "\n#%s =", key);
        const char *a = strstr(s, plain), *b = strstr(s, commented);
        ck_assert_msg((a && a < end) || (b && b < end), "%s lacks %s in [%s]", cpath, key, section);

        char hdr[48], entry[80];
        snprintf(hdr, sizeof hdr, "\n.SS [%s]\n", section);
        const char *ms = strstr(man, hdr);
        ck_assert_msg(ms, "%s lacks a subsection '.SS [%s]'", mpath, section);
        const char *mnext = strstr(ms + 1, "\n.S");
        snprintf(entry, sizeof entry, "\n.TP\n.B %s\n", key);
        const char *e = strstr(ms, entry);
        ck_assert_msg(e && (!mnext || e < mnext), "%s lacks an entry '.B %s' under [%s]", mpath, key, section);

        /* The hand-kept list the other shipped-file tests walk has it too. */
        bool listed = false;
        for (size_t i = 0; i < NOPTIONS && !listed; i++)
            listed = strcmp(all_options[i][0], section) == 0 && strcmp(all_options[i][1], key) == 0;
        ck_assert_msg(listed, "all_options lacks %s.%s", section, key);
    }
    ck_assert_uint_eq(n, NOPTIONS);
    ck_assert(!config_option_at(n, &section, &key));

    /* The keys of [tenant.NAME]: "#key =" in the example of conf/kvnode.conf,
     * ".B key" in the TENANTS section of kvnode.conf(5), marked restart
     * required there exactly when the code says so. */
    const char *example = strstr(conf, "\n#[tenant.");
    ck_assert_msg(example, "%s has no commented-out [tenant.NAME] example", cpath);
    const char *tenants = strstr(man, "\n.SH TENANTS\n");
    ck_assert_msg(tenants, "%s lacks a section '.SH TENANTS'", mpath);
    const char *tenants_end = strstr(tenants + 1, "\n.SH ");
    size_t k = 0;
    for (; config_tenant_option_at(k, &key); k++) {
        char commented[80], entry[80];
        snprintf(commented, sizeof commented, "\n#%s =", key);
        ck_assert_msg(strstr(example, commented), "%s: the tenant example lacks %s", cpath, key);
        snprintf(entry, sizeof entry, "\n.TP\n.B %s\n", key);
        const char *e = strstr(tenants, entry);
        ck_assert_msg(e && (!tenants_end || e < tenants_end), "%s lacks an entry '.B %s' under TENANTS", mpath, key);
        const char *e_end = tenants_end ? tenants_end : e + strlen(e);
        const char *stop = strstr(e + 1, "\n.TP");
        if (stop && stop < e_end)
            e_end = stop;
        const char *mark = strstr(e, "restart required");
        ck_assert_msg((mark && mark < e_end) == !config_option_reloadable("tenant", key),
                      "%s: tenant %s restart marking disagrees with the code", mpath, key);
    }
    ck_assert_uint_eq(k, 7);
    free(conf);
    free(man);
}
END_TEST

START_TEST(test_resolve_parsed_forms)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_int_eq(config_resolve(&c, err, sizeof err), 0);
    /* Defaults: "all" devices, the loopback admin port, empty allow lists. */
    ck_assert_uint_eq(c.hbm_device_list.n, 0);
    ck_assert_int_eq(c.admin_listen_addr.kind, CONFIG_LISTEN_TCP);
    ck_assert_str_eq(c.admin_listen_addr.host, "127.0.0.1");
    ck_assert_uint_eq(c.admin_listen_addr.port, 9180);
    ck_assert_uint_eq(c.allow_uid_list.n, 0);
    ck_assert_uint_eq(c.allow_gid_list.n, 0);
    ck_assert_uint_eq(c.kvcm.endpoint_list.n, 0);

    const char *sets[] = { "server.allow_uids=root, 1000 65534", "server.allow_gids=0,4242",
                           "server.socket_group=0", "admin.listen=[::1]:0", "hbm.devices=1, 0\t15",
                           "kvcm.endpoints=http://kvcm-0:6382, https://[fd00::1]:6382/base/" };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        ck_assert_msg(config_apply_override(&c, sets[i], err, sizeof err) == 0, "%s: %s", sets[i], err);
    ck_assert_int_eq(config_resolve(&c, err, sizeof err), 0);
    ck_assert_uint_eq(c.allow_uid_list.n, 3);
    ck_assert_uint_eq(c.allow_uid_list.id[0], 0);
    ck_assert_uint_eq(c.allow_uid_list.id[1], 1000);
    ck_assert_uint_eq(c.allow_uid_list.id[2], 65534);
    ck_assert_uint_eq(c.allow_gid_list.n, 2);
    ck_assert_uint_eq(c.allow_gid_list.id[0], 0);
    ck_assert_uint_eq(c.allow_gid_list.id[1], 4242);
    ck_assert_uint_eq(c.socket_gid, 0);
    ck_assert_int_eq(c.admin_listen_addr.kind, CONFIG_LISTEN_TCP);
    ck_assert_str_eq(c.admin_listen_addr.host, "::1");
    ck_assert_uint_eq(c.admin_listen_addr.port, 0);
    ck_assert_uint_eq(c.hbm_device_list.n, 3);
    ck_assert_int_eq(c.hbm_device_list.dev[0], 1);
    ck_assert_int_eq(c.hbm_device_list.dev[1], 0);
    ck_assert_int_eq(c.hbm_device_list.dev[2], 15);
    ck_assert_uint_eq(c.kvcm.endpoint_list.n, 2);
    ck_assert_str_eq(c.kvcm.endpoint_list.url[0], "http://kvcm-0:6382");
    ck_assert_str_eq(c.kvcm.endpoint_list.url[1], "https://[fd00::1]:6382/base");
    /* The text is kept as written: /config prints it. */
    ck_assert_str_eq(c.hbm_devices, "1, 0\t15");

    ck_assert_int_eq(config_apply_override(&c, "admin.listen=unix:/run/kvnode/admin.sock", err, sizeof err), 0);
    ck_assert_int_eq(config_resolve(&c, err, sizeof err), 0);
    ck_assert_int_eq(c.admin_listen_addr.kind, CONFIG_LISTEN_UNIX);
    ck_assert_str_eq(c.admin_listen_addr.path, "/run/kvnode/admin.sock");

    /* A failed resolve says what config_validate says and changes nothing. */
    char verr[CONFIG_ERR_MAX];
    snprintf(c.hbm_devices, sizeof c.hbm_devices, "0,0");
    struct kvn_config before = c;
    ck_assert_int_eq(config_validate(&c, verr, sizeof verr), -1);
    ck_assert_int_eq(config_resolve(&c, err, sizeof err), -1);
    ck_assert_str_eq(err, verr);
    ck_assert_str_eq(err, "[hbm] devices: device 0 listed twice");
    ck_assert(memcmp(&c, &before, sizeof c) == 0);
}
END_TEST

/* ---- [tenant.NAME] sections ---------------------------------------------------- */

/* Two tenants on 1GiB of host memory and 2GiB of HBM per device. */
static const char two_tenants[] =
    "[server]\n"
    "max_clients = 100\n"
    "[memory]\n"
    "host_bytes = 1GiB\n"
    "[hbm]\n"
    "backend = sim\n"
    "bytes = 2GiB\n"
    "[tenant.team-a]\n"
    "uids = root, 1001 1002\n"
    "host_bytes = 33%\n"
    "hbm_bytes = 50%\n"
    "max_namespaces = 8\n"
    "[tenant.Team_B]\n"
    "gids = 4242, 0\n"
    "host_bytes = 512MiB\n"
    "max_clients = 7\n"
    "max_reserved_per_client = 0.5\n"
    "[leases]\n"
    "max_reserved_per_client = 0.125\n"
    "[tenant.team-a]\n"            /* the same section again: keys merge, the last wins */
    "max_namespaces = 9\n";

/* two_tenants parsed and resolved into *c. */
static void load_two_tenants(struct kvn_config *c)
{
    char err[CONFIG_ERR_MAX];
    config_defaults(c);
    ck_assert_msg(load_text(c, two_tenants, err, sizeof err, NULL, 0) == 0, "%s", err);
    ck_assert_msg(config_resolve(c, err, sizeof err) == 0, "%s", err);
}

START_TEST(test_tenant_parse)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_msg(load_text(&c, two_tenants, err, sizeof err, NULL, 0) == 0, "%s", err);
    /* Parsed, not resolved: a share is a share, unset limits are 0. */
    ck_assert_uint_eq(c.ntenants, 2);
    ck_assert_str_eq(c.tenants[0].name, "team-a");
    ck_assert_str_eq(c.tenants[1].name, "Team_B");
    ck_assert_uint_eq(c.tenants[0].host_share, 33);
    ck_assert_uint_eq(c.tenants[0].host_bytes, 0);
    ck_assert_uint_eq(c.tenants[0].max_clients, 0);
    ck_assert_uint_eq(c.tenants[0].uid_list.n, 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), 0);

    ck_assert_msg(config_resolve(&c, err, sizeof err) == 0, "%s", err);
    const struct config_tenant *a = &c.tenants[0], *b = &c.tenants[1];
    ck_assert_str_eq(a->uids, "root, 1001 1002");
    ck_assert_uint_eq(a->uid_list.n, 3);
    ck_assert_uint_eq(a->uid_list.id[0], 0);
    ck_assert_uint_eq(a->uid_list.id[1], 1001);
    ck_assert_uint_eq(a->uid_list.id[2], 1002);
    ck_assert_uint_eq(a->gid_list.n, 0);
    /* 33% of 1GiB = 354334801.92 bytes, down to whole 64KiB: 5406 x 64KiB. */
    ck_assert_uint_eq(a->host_bytes, UINT64_C(5406) * 64 * KIB);
    ck_assert_uint_eq(a->host_share, 33);
    ck_assert_uint_eq(a->hbm_bytes, GIB);   /* 50% of 2GiB */
    ck_assert_uint_eq(a->hbm_share, 50);
    ck_assert_uint_eq(a->max_namespaces, 9);  /* the repeated section's value */
    /* its memory's share of [server] max_clients (100): 5406 x 64KiB of 1GiB, 32.99 */
    ck_assert_uint_eq(a->max_clients, 32);
    ck_assert_double_eq(a->max_reserved_per_client, 0.125);   /* [leases], set after the section */
    ck_assert_uint_eq(a->inherited, CONFIG_TENANT_INHERIT_MAX_CLIENTS | CONFIG_TENANT_INHERIT_MAX_RESERVED);

    ck_assert_uint_eq(b->uid_list.n, 0);
    ck_assert_uint_eq(b->gid_list.n, 2);
    ck_assert_uint_eq(b->gid_list.id[0], 4242);
    ck_assert_uint_eq(b->gid_list.id[1], 0);
    ck_assert_uint_eq(b->host_bytes, 512 * MIB);
    ck_assert_uint_eq(b->host_share, 0);
    ck_assert_uint_eq(b->hbm_bytes, 0);        /* default: no HBM */
    ck_assert_uint_eq(b->max_namespaces, 256); /* [server] max_namespaces default */
    ck_assert_uint_eq(b->max_clients, 7);
    ck_assert_double_eq(b->max_reserved_per_client, 0.5);
    ck_assert_uint_eq(b->inherited, CONFIG_TENANT_INHERIT_MAX_NAMESPACES);

    /* What "default" gets: the rest, per tier. */
    uint64_t host, hbm;
    config_tenant_default_bytes(&c, &host, &hbm);
    ck_assert_uint_eq(host, GIB - UINT64_C(5406) * 64 * KIB - 512 * MIB);
    ck_assert_uint_eq(hbm, GIB);

    /* Resolving again changes nothing; the inherited limits follow their
     * option, the explicit ones stay. */
    struct kvn_config again = c;
    ck_assert_int_eq(config_resolve(&again, err, sizeof err), 0);
    ck_assert(memcmp(&again, &c, sizeof c) == 0);
    again.max_clients = 55;
    again.max_namespaces = 300;
    ck_assert_int_eq(config_resolve(&again, err, sizeof err), 0);
    ck_assert_uint_eq(again.tenants[0].max_clients, 18);   /* its share of 55 */
    ck_assert_uint_eq(again.tenants[0].max_namespaces, 9);
    ck_assert_uint_eq(again.tenants[1].max_clients, 7);
    ck_assert_uint_eq(again.tenants[1].max_namespaces, 300);

    /* No sections: "default" has everything; less than a slab left is none. */
    config_defaults(&c);
    config_tenant_default_bytes(&c, &host, NULL);
    ck_assert_uint_eq(host, GIB);
    ck_assert_msg(load_text(&c, "[tenant.x]\nuids = 1\nhost_bytes = 1016MiB\n", err, sizeof err, NULL, 0) == 0,
                  "%s", err);
    ck_assert_int_eq(config_resolve(&c, err, sizeof err), 0);
    config_tenant_default_bytes(&c, &host, &hbm);
    ck_assert_uint_eq(host, 0);   /* 8MiB left, below slab_bytes (16MiB) */
    ck_assert_uint_eq(hbm, 0);
}
END_TEST

struct tenant_bad_case {
    const char *text;     /* appended to a valid base */
    const char *expect;   /* in the error */
};

/* Base: 1GiB host, 1GiB HBM, slab 16MiB, tenant a with uid 1001 and 256MiB. */
#define TENANT_BASE "[memory]\nhost_bytes = 1GiB\n[hbm]\nbytes = 1GiB\n" \
                    "[tenant.a]\nuids = 1001\nhost_bytes = 256MiB\ngids = 5000\n"

static const struct tenant_bad_case tenant_bad_cases[] = {
    /* names and sections */
    { "[tenant.a.b]\nuids = 7\nhost_bytes = 64MiB\n", ":9: [tenant.a.b]: invalid tenant name 'a.b' (1 to 31 letters, "
                                                      "digits, '_' or '-')" },
    { "[tenant.]\n", ":9: [tenant.]: invalid tenant name ''" },
    { "[tenant.a b]\n", "invalid tenant name 'a b'" },
    { "[tenant.abcdefghijklmnopqrstuvwxyz012345]\n", "invalid tenant name 'abcdefghijklmnopqrstuvwxyz012345'" },
    { "[tenant.default]\nuids = 7\n", ":9: [tenant.default]: 'default' is reserved" },
    { "[tenant.DEFAULT]\n", "'DEFAULT' is reserved" },
    { "[tenant]\n", ":9: [tenant]: unknown section (expected [server], [memory], [hbm], [leases], [log], [admin], "
                    "[persist], [kvs_server], [kvcm] or [tenant.NAME])" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 64MiB\nbogus = 1\n",
      ":12: [tenant.b] bogus: unknown key (a tenant section takes uids, gids, host_bytes, hbm_bytes, "
      "max_namespaces, max_clients or max_reserved_per_client)" },
    { "[server]\nuids = 7\n", ":10: [server] uids: unknown key (it belongs in [tenant.NAME])" },
    /* users */
    { "[tenant.b]\nhost_bytes = 64MiB\n", "[tenant.b] uids: neither uids nor gids lists anyone" },
    { "[tenant.b]\nuids = ,\ngids = \nhost_bytes = 64MiB\n", "[tenant.b] uids: neither uids nor gids lists anyone" },
    { "[tenant.b]\nuids = no-such-user-kvnode\nhost_bytes = 64MiB\n",
      ":10: [tenant.b] uids: unknown user 'no-such-user-kvnode'" },
    { "[tenant.b]\ngids = no-such-group-kvnode\nhost_bytes = 64MiB\n",
      ":10: [tenant.b] gids: unknown group 'no-such-group-kvnode'" },
    { "[tenant.b]\nuids = 7, 1001\nhost_bytes = 64MiB\n",
      "[tenant.b] uids: uid 1001 is also in [tenant.a]; a user belongs to one tenant at most" },
    { "[tenant.b]\ngids = 5000\nhost_bytes = 64MiB\n",
      "[tenant.b] gids: gid 5000 is also in [tenant.a]; a group belongs to one tenant at most" },
    { "[server]\nallow_uids = 7\n",
      "[tenant.a] uids: uid 1001 is not admitted by [server] allow_uids (7): its clients would be refused; add "
      "it to allow_uids or remove it from the tenant" },
    { "[server]\nallow_uids = 7\nallow_gids = 5000\n",
      "[tenant.a] uids: uid 1001 is not admitted by [server] allow_uids (7) nor, through its groups, by "
      "allow_gids (5000)" },
    { "[server]\nallow_gids = 5000\n", "[tenant.a] uids: uid 1001 is not admitted by [server] allow_uids (empty) "
                                       "nor, through its groups, by allow_gids (5000)" },
    /* sizes */
    { "[tenant.b]\nuids = 7\n", "[tenant.b] host_bytes: required (a size of at least 64KiB, e.g. 4GiB, or a share "
                                "of memory.host_bytes, e.g. 25%)" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 0%\n", ":11: [tenant.b] host_bytes: share '0%' out of range (expected "
                                                 "1% to 100% of memory.host_bytes)" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 101%\n", "share '101%' out of range" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 99999999999999999999999%\n", "invalid share" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 12.5%\n", "invalid share '12.5%' (expected a whole percentage of "
                                                    "memory.host_bytes from 1% to 100%, e.g. 25%, or a size)" },
    { "[tenant.b]\nuids = 7\nhost_bytes = %\n", "invalid share '%'" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 0\n", "host_bytes: size '0' out of range (expected at least 64KiB)" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 1MiB\n", "[tenant.b] host_bytes: 1MiB is less than [memory] slab_bytes "
                                                   "(16MiB); its arena must hold at least one slab" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 1%\n", "[tenant.b] host_bytes: 10432KiB is less than [memory] slab_bytes" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 64MiB\nhbm_bytes = 1MiB\n",
      "[tenant.b] hbm_bytes: 1MiB is less than [memory] slab_bytes (16MiB)" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 64MiB\nhbm_bytes = 1G B\n", "[tenant.b] hbm_bytes: invalid size '1G B'" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 1GiB\n", "[tenant.NAME] host_bytes: the tenants take 1280MiB together, "
                                                   "more than [memory] host_bytes (1GiB)" },
    { "[tenant.b]\nuids = 7\nhost_bytes = 76%\n", "the tenants take 1059008KiB together, more than [memory] "
                                                  "host_bytes (1GiB)" },
    { "[tenant.a]\nhbm_bytes = 768MiB\n[tenant.b]\nuids = 7\nhost_bytes = 64MiB\nhbm_bytes = 50%\n",
      "[tenant.NAME] hbm_bytes: the tenants take 1280MiB per device together, more than [hbm] bytes (1GiB)" },
    { "[hbm]\nbytes = 0\n[tenant.a]\nhbm_bytes = 16MiB\n",
      "the tenants take 16MiB per device together, more than [hbm] bytes (0)" },
    /* limits: the ranges of the options they default to */
    { "[tenant.a]\nmax_clients = 0\n", ":10: [tenant.a] max_clients: invalid value '0' (expected an integer in "
                                       "1..65536)" },
    { "[tenant.a]\nmax_namespaces = 65537\n", "[tenant.a] max_namespaces: invalid value '65537' (expected an "
                                              "integer in 1..65536)" },
    { "[tenant.a]\nmax_reserved_per_client = 1.5\n", "[tenant.a] max_reserved_per_client: invalid value '1.5' "
                                                     "(expected a fraction in (0, 1])" },
    { "[tenant.a]\nmax_reserved_per_client = 0\n", "expected a fraction in (0, 1]" },
    /* KVCM: the same layout in two tenants differs only in its fingerprint */
    { "[kvcm]\nenabled = on\nendpoints = http://10.0.0.7:6382\nhost_ip_port = 10.0.0.5:7000\n"
      "instance_id = {model}_{block_tokens}\n",
      "[kvcm] instance_id: '{model}_{block_tokens}' has no {fingerprint}, and the node has [tenant.NAME] sections: "
      "two tenants serving the same layout would publish as one KVCM instance" },
};
#define NTENANT_BAD (sizeof tenant_bad_cases / sizeof tenant_bad_cases[0])

START_TEST(test_tenant_rules)
{
    const struct tenant_bad_case *b = &tenant_bad_cases[_i];
    char text[1024], err[CONFIG_ERR_MAX];
    struct kvn_config c;
    /* The base is valid. */
    config_defaults(&c);
    ck_assert_msg(load_text(&c, TENANT_BASE, err, sizeof err, NULL, 0) == 0, "%s", err);
    ck_assert_msg(config_resolve(&c, err, sizeof err) == 0, "%s", err);

    snprintf(text, sizeof text, "%s%s", TENANT_BASE, b->text);
    config_defaults(&c);
    struct kvn_config before = c;
    int rc = load_text(&c, text, err, sizeof err, NULL, 0);
    if (rc == 0) {
        /* A rule between options: config_validate's, and config_resolve's. */
        before = c;
        ck_assert_msg(config_validate(&c, err, sizeof err) == -1, "accepted:\n%s", text);
        char rerr[CONFIG_ERR_MAX];
        ck_assert_int_eq(config_resolve(&c, rerr, sizeof rerr), -1);
        ck_assert_str_eq(rerr, err);
    }
    ck_assert(memcmp(&c, &before, sizeof c) == 0);
    ck_assert_msg(strstr(err, b->expect), "got:\n%s\nwant: %s", err, b->expect);
}
END_TEST

START_TEST(test_tenant_limit)
{
    /* CONFIG_TENANTS_MAX sections are fine; one more is refused at its
     * header, naming the limit, and only once however many keys follow. */
    char text[8192], err[CONFIG_ERR_MAX], path[256], want[512];
    size_t used = (size_t)snprintf(text, sizeof text, "[memory]\nhost_bytes = 1GiB\n");
    for (int i = 0; i < CONFIG_TENANTS_MAX; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "[tenant.t%d]\nuids = %d\nhost_bytes = 16MiB\n",
                                 i, 2000 + i);
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_msg(load_text(&c, text, err, sizeof err, NULL, 0) == 0, "%s", err);
    ck_assert_msg(config_resolve(&c, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(c.ntenants, CONFIG_TENANTS_MAX);
    ck_assert_str_eq(c.tenants[15].name, "t15");
    ck_assert_uint_eq(c.tenants[15].uid_list.id[0], 2015);

    /* Line 2 + 3 x 16 + 1 = 51: the 17th header. */
    snprintf(text + used, sizeof text - used, "[tenant.t16]\nuids = 3000\nhost_bytes = 16MiB\n[tenant.t0]\n");
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, text, err, sizeof err, path, sizeof path), -1);
    snprintf(want, sizeof want, "%s:51: [tenant.t16]: more than 16 tenant sections (at most 16, CONFIG_TENANTS_MAX)",
             path);
    ck_assert_msg(strstr(err, want), "%s", err);
    ck_assert_uint_eq(count_lines(err), 1);

    /* The same through overrides. */
    config_defaults(&c);
    for (int i = 0; i < CONFIG_TENANTS_MAX; i++) {
        char set[64];
        snprintf(set, sizeof set, "tenant.o%d.uids=%d", i, 2000 + i);
        ck_assert_msg(config_apply_override(&c, set, err, sizeof err) == 0, "%s", err);
    }
    struct kvn_config before = c;
    ck_assert_int_eq(config_apply_override(&c, "tenant.o16.uids=1", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "override tenant.o16.uids: [tenant.o16]: more than 16 tenant sections"), "%s", err);
    ck_assert(memcmp(&c, &before, sizeof c) == 0);
    ck_assert_int_eq(config_apply_override(&c, "tenant.o3.uids=77", err, sizeof err), 0);   /* one of them */
    ck_assert_str_eq(c.tenants[3].uids, "77");

    /* A struct built by code: too many, a bad name, a name twice. */
    config_defaults(&c);
    c.ntenants = CONFIG_TENANTS_MAX + 1;
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[tenant.NAME]: 17 sections, more than 16 (CONFIG_TENANTS_MAX)"), "%s", err);
    config_defaults(&c);
    ck_assert_msg(load_text(&c, TENANT_BASE "[tenant.b]\nuids = 7\nhost_bytes = 64MiB\n", err, sizeof err, NULL,
                            0) == 0, "%s", err);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), 0);
    snprintf(c.tenants[1].name, sizeof c.tenants[1].name, "a");
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[tenant.a]: two tenants of this name"), "%s", err);
    snprintf(c.tenants[1].name, sizeof c.tenants[1].name, "x/y");
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[tenant.x/y]: invalid tenant name 'x/y'"), "%s", err);
}
END_TEST

static const struct override_case tenant_override_errors[] = {
    { "tenant.uids=1", "override 'tenant.uids=1': unknown section [tenant]" },
    { "tenant.a.bogus=1", "override tenant.a.bogus: unknown key (a tenant section takes uids, gids" },
    { "tenant.a.host_bytes=0%", "override tenant.a.host_bytes: share '0%' out of range" },
    { "tenant.a.max_clients=0", "override tenant.a.max_clients: invalid value '0' (expected an integer in 1..65536)" },
    { "tenant.default.uids=1", "override tenant.default.uids: [tenant.default]: 'default' is reserved" },
    { "tenant.a/b.uids=1", "override tenant.a/b.uids: [tenant.a/b]: invalid tenant name 'a/b'" },
    { "tenant..uids=1", "override tenant..uids: [tenant.]: invalid tenant name ''" },
    { "tenant.abcdefghijklmnopqrstuvwxyz0123456789.uids=1",
      "override 'tenant.abcdefghijklmnopqrstuvwxyz0123456789.uids=1': invalid tenant name "
      "'abcdefghijklmnopqrstuvwxyz0123456789'" },
};

START_TEST(test_tenant_override)
{
    char err[CONFIG_ERR_MAX];
    struct kvn_config c;
    config_defaults(&c);
    const char *sets[] = { " tenant.a.uids = 1001 ", "tenant.a.host_bytes=25%", "tenant.b.gids=7",
                           "tenant.b.host_bytes=64MiB", "tenant.a.max_clients=3", "tenant.b.hbm_bytes=0" };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        ck_assert_msg(config_apply_override(&c, sets[i], err, sizeof err) == 0, "%s: %s", sets[i], err);
    ck_assert_msg(config_resolve(&c, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(c.ntenants, 2);
    ck_assert_str_eq(c.tenants[0].name, "a");
    ck_assert_uint_eq(c.tenants[0].uid_list.id[0], 1001);
    ck_assert_uint_eq(c.tenants[0].host_bytes, 256 * MIB);
    ck_assert_uint_eq(c.tenants[0].max_clients, 3);
    ck_assert_str_eq(c.tenants[1].name, "b");
    ck_assert_uint_eq(c.tenants[1].gid_list.id[0], 7);
    ck_assert_uint_eq(c.tenants[1].host_bytes, 64 * MIB);

    for (size_t i = 0; i < sizeof tenant_override_errors / sizeof tenant_override_errors[0]; i++) {
        const struct override_case *o = &tenant_override_errors[i];
        struct kvn_config before = c;
        ck_assert_msg(config_apply_override(&c, o->assignment, err, sizeof err) == -1, "'%s' accepted",
                      o->assignment);
        ck_assert_msg(strstr(err, o->expect), "'%s': got '%s', want '%s'", o->assignment, err, o->expect);
        ck_assert(memcmp(&c, &before, sizeof c) == 0);
    }
}
END_TEST

/* With KVCM on, tenants need {fingerprint} in [kvcm] instance_id (the one
 * refusal is test_tenant_rules'): the default has it and is accepted, and
 * so is any template with it; without tenants a template without it stays
 * valid (a clash is refused at run time, naming both deployments). */
START_TEST(test_tenant_kvcm_instance_id)
{
    static const char kvcm_on[] = "[kvcm]\nenabled = on\nendpoints = http://10.0.0.7:6382\n"
                                  "host_ip_port = 10.0.0.5:7000\n";
    static const struct {
        const char *text;
        int valid;
    } cases[] = {
        { TENANT_BASE, 1 },                                              /* the default template */
        { TENANT_BASE "[kvcm]\ninstance_id = {fingerprint}\n", 1 },
        { TENANT_BASE "[kvcm]\ninstance_id = x_{tp_size}_{fingerprint}_{model}\n", 1 },
        { TENANT_BASE "[kvcm]\ninstance_id = {model}_{tp_size}\n", 0 },
        { TENANT_BASE "[kvcm]\ninstance_id = fingerprint\n", 0 },      /* a word, not the placeholder */
        { "[kvcm]\ninstance_id = {model}_{block_tokens}\n", 1 },          /* no tenants */
    };
    char text[1024], err[CONFIG_ERR_MAX];
    struct kvn_config c;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "%s%s", kvcm_on, cases[i].text);
        config_defaults(&c);
        ck_assert_msg(load_text(&c, text, err, sizeof err, NULL, 0) == 0, "%s", err);
        int rc = config_validate(&c, err, sizeof err);
        ck_assert_msg(rc == (cases[i].valid ? 0 : -1), "case %zu: %d: %s", i, rc, err);
        if (!cases[i].valid) {
            ck_assert_msg(strstr(err, "has no {fingerprint}") && strstr(err, "add {fingerprint}"), "%s", err);
            ck_assert_uint_eq(count_lines(err), 1);
        }
    }
    /* KVCM off: nothing is published, the template does not matter. */
    snprintf(text, sizeof text, "%s[kvcm]\ninstance_id = {model}\n", TENANT_BASE);
    config_defaults(&c);
    ck_assert_msg(load_text(&c, text, err, sizeof err, NULL, 0) == 0, "%s", err);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
}
END_TEST

START_TEST(test_tenant_admission_by_group)
{
    /* allow_gids admits a tenant user through its primary group (from the
     * user database), as the server does on accept. */
    struct passwd *pw = getpwnam("nobody");
    if (!pw)
        return;   /* no such user here: nothing to look up */
    char text[512], err[CONFIG_ERR_MAX];
    struct kvn_config c;
    snprintf(text, sizeof text, "[server]\nallow_uids = 7\nallow_gids = %u\n[tenant.n]\nuids = nobody\n"
             "host_bytes = 64MiB\n", (unsigned)pw->pw_gid);
    config_defaults(&c);
    ck_assert_msg(load_text(&c, text, err, sizeof err, NULL, 0) == 0, "%s", err);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    /* Without its group listed it is refused. */
    snprintf(text, sizeof text, "[server]\nallow_uids = 7\nallow_gids = %u\n[tenant.n]\nuids = nobody\n"
             "host_bytes = 64MiB\n", (unsigned)pw->pw_gid + 1);
    config_defaults(&c);
    ck_assert_msg(load_text(&c, text, err, sizeof err, NULL, 0) == 0, "%s", err);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "is not admitted by [server] allow_uids (7)"), "%s", err);
    /* root is always admitted. */
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "[server]\nallow_uids = 7\n[tenant.r]\nuids = 0\nhost_bytes = 64MiB\n", err,
                               sizeof err, NULL, 0), 0);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
}
END_TEST

START_TEST(test_tenant_round_trip)
{
    struct kvn_config c, back;
    char err[CONFIG_ERR_MAX];
    load_two_tenants(&c);
    char *text = config_to_text(&c);
    const char *forms[] = {
        "\n\n[tenant.team-a]\nuids = root, 1001 1002\ngids = \nhost_bytes = 33%\n"
        "; host_bytes: 345984KiB, 33% of memory.host_bytes\nhbm_bytes = 50%\n"
        "; hbm_bytes: 1GiB, 50% of hbm.bytes\nmax_namespaces = 9\n"
        "; max_clients: 32, its memory's share of [server] max_clients (100)\n"
        "; max_reserved_per_client: 0.125, from [leases] max_reserved_per_client\n",
        "\n\n[tenant.Team_B]\nuids = \ngids = 4242, 0\nhost_bytes = 512MiB\nhbm_bytes = 0\n"
        "; max_namespaces: 256, from [server] max_namespaces\nmax_clients = 7\nmax_reserved_per_client = 0.5\n",
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        ck_assert_msg(strstr(text, forms[i]), "config_write lacks '%s':\n%s", forms[i], text);
    /* After [kvcm], team-a first. */
    const char *kvcm = strstr(text, "\n[kvcm]\n"), *ta = strstr(text, "\n[tenant.team-a]\n");
    const char *tb = strstr(text, "\n[tenant.Team_B]\n");
    ck_assert(kvcm && ta && tb && kvcm < ta && ta < tb);

    /* Parsed back and resolved: the same struct, byte for byte, and the same text. */
    config_defaults(&back);
    ck_assert_msg(load_text(&back, text, err, sizeof err, NULL, 0) == 0, "%s\n%s", err, text);
    ck_assert_msg(config_resolve(&back, err, sizeof err) == 0, "%s", err);
    assert_config_equal(&c, &back);
    char *again = config_to_text(&back);
    ck_assert_str_eq(text, again);
    free(again);
    free(text);

    /* Unresolved (as parsed) round-trips too, an unset host_bytes included. */
    config_defaults(&c);
    ck_assert_int_eq(load_text(&c, "[tenant.u]\nuids = 1\n", err, sizeof err, NULL, 0), 0);
    text = config_to_text(&c);
    ck_assert_msg(strstr(text, "\n[tenant.u]\nuids = 1\ngids = \n; host_bytes: not set (required)\nhbm_bytes = 0\n"),
                  "%s", text);
    config_defaults(&back);
    ck_assert_msg(load_text(&back, text, err, sizeof err, NULL, 0) == 0, "%s", err);
    ck_assert(memcmp(&c, &back, sizeof c) == 0);
    free(text);
}
END_TEST

START_TEST(test_tenant_reload)
{
    /* Reloadable: uids, gids and the limits; restart-only: the sizes and
     * the set of tenants. */
    const char *reloadable[] = { "uids", "gids", "max_namespaces", "max_clients", "max_reserved_per_client" };
    const char *restart[] = { "host_bytes", "hbm_bytes" };
    for (size_t i = 0; i < sizeof reloadable / sizeof reloadable[0]; i++) {
        ck_assert_msg(config_option_reloadable("tenant", reloadable[i]), "%s", reloadable[i]);
        ck_assert_msg(config_option_reloadable("tenant.a", reloadable[i]), "%s", reloadable[i]);
    }
    for (size_t i = 0; i < sizeof restart / sizeof restart[0]; i++)
        ck_assert_msg(!config_option_reloadable("tenant.a", restart[i]), "%s", restart[i]);
    ck_assert(!config_option_reloadable("tenant", "bogus"));

    struct kvn_config running, next;
    char names[512], err[CONFIG_ERR_MAX];
    load_two_tenants(&running);
    next = running;
    ck_assert_int_eq(config_restart_required(&running, &next, names, sizeof names), 0);

    /* team-a: new users, limits and host share; Team_B gone; team-c new. */
    config_defaults(&next);
    ck_assert_msg(load_text(&next,
                            "[server]\nmax_clients = 100\nmax_namespaces = 512\n[memory]\nhost_bytes = 1GiB\n"
                            "[hbm]\nbackend = sim\nbytes = 2GiB\n"
                            "[tenant.team-c]\nuids = 3000\nhost_bytes = 64MiB\n"
                            "[tenant.team-a]\nuids = 1001, 4242\nhost_bytes = 40%\nhbm_bytes = 1GiB\n"
                            "max_clients = 5\n",
                            err, sizeof err, NULL, 0) == 0, "%s", err);
    ck_assert_msg(config_resolve(&next, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(config_restart_required(&running, &next, names, sizeof names), 4);
    ck_assert_str_eq(names, "server.max_namespaces, tenant.team-a.host_bytes, tenant.Team_B, tenant.team-c");
    /* hbm_bytes 50% of 2GiB and 1GiB are the same bytes: no change. */

    config_keep_restart_only(&next, &running);
    ck_assert_msg(config_resolve(&next, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(config_restart_required(&running, &next, NULL, 0), 0);
    ck_assert_uint_eq(next.ntenants, 2);
    const struct config_tenant *a = &next.tenants[0], *b = &next.tenants[1];
    ck_assert_str_eq(a->name, "team-a");
    ck_assert_str_eq(a->uids, "1001, 4242");          /* applied */
    ck_assert_uint_eq(a->uid_list.n, 2);
    ck_assert_uint_eq(a->uid_list.id[1], 4242);
    ck_assert_uint_eq(a->max_clients, 5);
    ck_assert_uint_eq(a->host_bytes, running.tenants[0].host_bytes);   /* kept: 33% */
    ck_assert_uint_eq(a->host_share, 33);
    ck_assert_uint_eq(a->hbm_share, 50);
    /* Unset in the new section: inherited again, from the running
     * max_namespaces (restart-only, kept at 256). */
    ck_assert_uint_eq(next.max_namespaces, 256);
    ck_assert_uint_eq(a->max_namespaces, 256);
    ck_assert_str_eq(b->name, "Team_B");               /* removal waits for the restart */
    ck_assert_str_eq(b->gids, "4242, 0");
    ck_assert_uint_eq(b->max_namespaces, 256);
    ck_assert_uint_eq(b->max_clients, 7);

    /* Sections in another order: gid precedence would change; kept. */
    config_defaults(&next);
    ck_assert_int_eq(load_text(&next, two_tenants, err, sizeof err, NULL, 0), 0);
    struct config_tenant swap = next.tenants[0];
    next.tenants[0] = next.tenants[1];
    next.tenants[1] = swap;
    ck_assert_int_eq(config_resolve(&next, err, sizeof err), 0);
    ck_assert_int_eq(config_restart_required(&running, &next, names, sizeof names), 1);
    ck_assert_str_eq(names, "tenant.order");
    config_keep_restart_only(&next, &running);
    ck_assert_str_eq(next.tenants[0].name, "team-a");

    /* A uid moved from a removed tenant into a kept one: the merge breaks the
     * one-tenant-per-uid rule, which resolving it again reports. */
    config_defaults(&next);
    ck_assert_int_eq(load_text(&next, "[server]\nmax_clients = 100\n[memory]\nhost_bytes = 1GiB\n"
                                      "[hbm]\nbackend = sim\nbytes = 2GiB\n"
                                      "[tenant.team-a]\nuids = 1001\ngids = 4242\nhost_bytes = 33%\n"
                                      "hbm_bytes = 50%\n", err, sizeof err, NULL, 0), 0);
    ck_assert_msg(config_resolve(&next, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(config_restart_required(&running, &next, names, sizeof names), 1);
    ck_assert_str_eq(names, "tenant.Team_B");
    config_keep_restart_only(&next, &running);
    ck_assert_int_eq(config_resolve(&next, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "[tenant.Team_B] gids: gid 4242 is also in [tenant.team-a]"), "%s", err);
}
END_TEST

START_TEST(test_tenant_conf_example)
{
    /* The commented-out example in conf/kvnode.conf: uncommented, it is two
     * valid tenants on the file's own settings. */
    char path[512], err[CONFIG_ERR_MAX];
    char *text = repo_slurp("conf/kvnode.conf", path, sizeof path);
    char *out = NULL;
    size_t outlen = 0;
    FILE *mem = open_memstream(&out, &outlen);
    regex_t example;
    ck_assert_int_eq(regcomp(&example, "^#(\\[tenant\\.[A-Za-z0-9_-]+\\]|[a-z_]+ =( .*)?)$", REG_EXTENDED | REG_NOSUB),
                     0);
    bool in_example = false;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "#[tenant.", 9) == 0)
            in_example = true;
        if (in_example && regexec(&example, line, 0, NULL, 0) == 0)
            line++;
        fprintf(mem, "%s\n", line);
    }
    fclose(mem);
    regfree(&example);
    free(text);
    ck_assert_msg(in_example, "%s has no [tenant.NAME] example", path);
    struct kvn_config c;
    config_defaults(&c);
    ck_assert_msg(load_text(&c, out, err, sizeof err, NULL, 0) == 0, "uncommented example: %s", err);
    ck_assert_msg(config_resolve(&c, err, sizeof err) == 0, "uncommented example: %s", err);
    /* As its comment says: half, 256MiB, and 256MiB left for "default". */
    ck_assert_uint_eq(c.ntenants, 2);
    ck_assert_str_eq(c.tenants[0].name, "team-a");
    ck_assert_uint_eq(c.tenants[0].uid_list.n, 2);
    ck_assert_uint_eq(c.tenants[0].host_bytes, 512 * MIB);
    ck_assert_str_eq(c.tenants[1].name, "team-b");
    ck_assert_uint_eq(c.tenants[1].gid_list.id[0], 2001);
    ck_assert_uint_eq(c.tenants[1].host_bytes, 256 * MIB);
    uint64_t rest;
    config_tenant_default_bytes(&c, &rest, NULL);
    ck_assert_uint_eq(rest, 256 * MIB);
    free(out);
}
END_TEST

/* ---- suite ------------------------------------------------------------------------ */

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");

    TCase *tc = tcase_create("defaults");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_defaults);
    suite_add_tcase(s, tc);

    tc = tcase_create("options");
    tcase_set_timeout(tc, 10);
    tcase_add_loop_test(tc, test_good_value_file, 0, NGOOD);
    tcase_add_loop_test(tc, test_good_value_override, 0, NGOOD);
    tcase_add_loop_test(tc, test_bad_value_file, 0, NBAD);
    tcase_add_loop_test(tc, test_bad_value_override, 0, NBAD);
    suite_add_tcase(s, tc);

    tc = tcase_create("file");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_unknown_key_and_section);
    tcase_add_test(tc, test_key_outside_section);
    tcase_add_test(tc, test_syntax_errors);
    tcase_add_test(tc, test_many_errors_all_reported);
    tcase_add_test(tc, test_error_buffer_limits);
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_file_syntax_details);
    tcase_add_test(tc, test_long_line);
    tcase_add_test(tc, test_nul_byte);
    tcase_add_test(tc, test_parse_into_fresh_struct);
    suite_add_tcase(s, tc);

    tc = tcase_create("parsers");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_parse_size);
    tcase_add_test(tc, test_parse_duration);
    suite_add_tcase(s, tc);

    tc = tcase_create("override");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_override_good);
    tcase_add_loop_test(tc, test_override_errors, 0, sizeof override_errors / sizeof override_errors[0]);
    suite_add_tcase(s, tc);

    tc = tcase_create("validate");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_validate_cross_field);
    tcase_add_test(tc, test_validate_socket_path);
    tcase_add_test(tc, test_validate_field_ranges);
    tcase_add_test(tc, test_validate_hbm);
    tcase_add_test(tc, test_hbm_devices);
    tcase_add_test(tc, test_validate_persist);
    tcase_add_test(tc, test_url_credentials);
    tcase_add_test(tc, test_validate_kvcm);
    tcase_add_test(tc, test_validate_kvs_server);
    suite_add_tcase(s, tc);

    tc = tcase_create("kvcm");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_kvcm_host_ip_port);
    tcase_add_test(tc, test_kvcm_endpoints);
    tcase_add_test(tc, test_kvcm_expand);
    suite_add_tcase(s, tc);

    tc = tcase_create("write");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_write_round_trip_defaults);
    tcase_add_test(tc, test_write_round_trip_custom);
    suite_add_tcase(s, tc);

    tc = tcase_create("shipped");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_shipped_conf_parses);
    tcase_add_test(tc, test_shipped_conf_documents_defaults);
    tcase_add_test(tc, test_man_page_lists_options);
    tcase_add_test(tc, test_table_options_documented);
    suite_add_tcase(s, tc);

    tc = tcase_create("resolve");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_resolve_parsed_forms);
    suite_add_tcase(s, tc);

    tc = tcase_create("reload");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_restart_required);
    suite_add_tcase(s, tc);

    tc = tcase_create("tenants");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_tenant_parse);
    tcase_add_loop_test(tc, test_tenant_rules, 0, NTENANT_BAD);
    tcase_add_test(tc, test_tenant_limit);
    tcase_add_test(tc, test_tenant_override);
    tcase_add_test(tc, test_tenant_admission_by_group);
    tcase_add_test(tc, test_tenant_kvcm_instance_id);
    tcase_add_test(tc, test_tenant_round_trip);
    tcase_add_test(tc, test_tenant_reload);
    tcase_add_test(tc, test_tenant_conf_example);
    suite_add_tcase(s, tc);

    tc = tcase_create("log");
    tcase_set_timeout(tc, 60);   /* the thread test is slow under valgrind */
    tcase_add_test(tc, test_log_level_parse);
    tcase_add_test(tc, test_log_format_plain);
    tcase_add_test(tc, test_log_format_journal);
    tcase_add_test(tc, test_log_threads_whole_lines);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(config_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
