/* Fuzz target: kvnode.conf parsing (daemon/config/config.c).
 *
 * The bytes are a config file (in a memfd, loaded through /proc/self/fd) on
 * top of the defaults, and also, up to the first NUL, one command-line
 * override. Must hold for any input:
 *  - a failed load or override leaves the struct untouched and says why
 *    (a non-empty, terminated message);
 *  - config_validate answers 0, or -1 with a message;
 *  - whatever parsed is written by config_write as text that parses back,
 *    on fresh defaults, to an equal struct (every field, [tenant.NAME]
 *    sections included). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config/config.h"
#include "fuzz.h"

static int memfd_with(const void *data, size_t size, char *path, size_t pathlen)
{
    int fd = memfd_create("kvnode-fuzz-config", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    const uint8_t *p = data;
    while (size > 0) {
        ssize_t w = write(fd, p, size);
        if (w < 0 && errno == EINTR)
            continue;
        FUZZ_CHECK(w > 0);
        p += w;
        size -= (size_t)w;
    }
    snprintf(path, pathlen, "/proc/self/fd/%d", fd);
    return fd;
}

static void check_msg(const char *err)
{
    FUZZ_CHECK(memchr(err, '\0', CONFIG_ERR_MAX) != NULL);
    FUZZ_CHECK(err[0] != '\0');
}

static void check_equal(const struct kvn_config *a, const struct kvn_config *b)
{
    FUZZ_CHECK(strcmp(a->socket_path, b->socket_path) == 0);
    FUZZ_CHECK(a->socket_mode == b->socket_mode);
    FUZZ_CHECK(strcmp(a->socket_group, b->socket_group) == 0);
    FUZZ_CHECK(strcmp(a->allow_uids, b->allow_uids) == 0);
    FUZZ_CHECK(strcmp(a->allow_gids, b->allow_gids) == 0);
    FUZZ_CHECK(a->max_frame_bytes == b->max_frame_bytes);
    FUZZ_CHECK(a->max_keys_per_request == b->max_keys_per_request);
    FUZZ_CHECK(a->max_clients == b->max_clients);
    FUZZ_CHECK(a->max_namespaces == b->max_namespaces);
    FUZZ_CHECK(a->request_timeout_ms == b->request_timeout_ms);
    FUZZ_CHECK(a->shutdown_timeout_ms == b->shutdown_timeout_ms);
    FUZZ_CHECK(a->host_bytes == b->host_bytes);
    FUZZ_CHECK(a->slab_bytes == b->slab_bytes);
    FUZZ_CHECK(a->high_watermark == b->high_watermark);
    FUZZ_CHECK(a->low_watermark == b->low_watermark);
    FUZZ_CHECK(a->pin_host == b->pin_host);
    FUZZ_CHECK(a->namespace_quota == b->namespace_quota);
    FUZZ_CHECK(a->pin_chunk_bytes == b->pin_chunk_bytes);
    FUZZ_CHECK(a->hbm_backend == b->hbm_backend);
    FUZZ_CHECK(a->hbm_bytes == b->hbm_bytes);
    FUZZ_CHECK(strcmp(a->hbm_devices, b->hbm_devices) == 0);
    FUZZ_CHECK(a->hbm_high_watermark == b->hbm_high_watermark);
    FUZZ_CHECK(a->hbm_low_watermark == b->hbm_low_watermark);
    FUZZ_CHECK(a->hbm_required == b->hbm_required);
    FUZZ_CHECK(a->hbm_copy_batch_bytes == b->hbm_copy_batch_bytes);
    FUZZ_CHECK(a->read_lease_ttl_ms == b->read_lease_ttl_ms);
    FUZZ_CHECK(a->write_lease_ttl_ms == b->write_lease_ttl_ms);
    FUZZ_CHECK(a->reaper_interval_ms == b->reaper_interval_ms);
    FUZZ_CHECK(a->max_leases_per_client == b->max_leases_per_client);
    FUZZ_CHECK(a->log_level == b->log_level);
    FUZZ_CHECK(strcmp(a->admin_listen, b->admin_listen) == 0);
    FUZZ_CHECK(a->persist_backend == b->persist_backend);
    FUZZ_CHECK(a->persist_policy == b->persist_policy);
    FUZZ_CHECK(strcmp(a->persist_path, b->persist_path) == 0);
    FUZZ_CHECK(a->persist_capacity == b->persist_capacity);
    FUZZ_CHECK(a->persist_fsync == b->persist_fsync);
    FUZZ_CHECK(a->persist_workers == b->persist_workers);
    FUZZ_CHECK(a->persist_queue == b->persist_queue);
    FUZZ_CHECK(strcmp(a->persist_url, b->persist_url) == 0);
    FUZZ_CHECK(strcmp(a->persist_socket, b->persist_socket) == 0);
    FUZZ_CHECK(a->persist_connect_timeout_ms == b->persist_connect_timeout_ms);
    FUZZ_CHECK(a->persist_timeout_ms == b->persist_timeout_ms);
    FUZZ_CHECK(a->persist_lookup == b->persist_lookup);
    FUZZ_CHECK(a->kvcm.enabled == b->kvcm.enabled);
    FUZZ_CHECK(strcmp(a->kvcm.endpoints, b->kvcm.endpoints) == 0);
    FUZZ_CHECK(strcmp(a->kvcm.instance_group, b->kvcm.instance_group) == 0);
    FUZZ_CHECK(strcmp(a->kvcm.instance_id, b->kvcm.instance_id) == 0);
    FUZZ_CHECK(strcmp(a->kvcm.host_ip_port, b->kvcm.host_ip_port) == 0);
    FUZZ_CHECK(a->kvcm.storage_type == b->kvcm.storage_type);
    FUZZ_CHECK(strcmp(a->kvcm.medium_hbm, b->kvcm.medium_hbm) == 0);
    FUZZ_CHECK(strcmp(a->kvcm.medium_host, b->kvcm.medium_host) == 0);
    FUZZ_CHECK(strcmp(a->kvcm.spec_name, b->kvcm.spec_name) == 0);
    FUZZ_CHECK(strcmp(a->kvcm.location_uri, b->kvcm.location_uri) == 0);
    FUZZ_CHECK(a->kvcm.request_timeout_ms == b->kvcm.request_timeout_ms);
    FUZZ_CHECK(a->kvcm.connect_timeout_ms == b->kvcm.connect_timeout_ms);
    FUZZ_CHECK(a->kvcm.snapshot_timeout_ms == b->kvcm.snapshot_timeout_ms);
    FUZZ_CHECK(a->kvcm.flush_interval_ms == b->kvcm.flush_interval_ms);
    FUZZ_CHECK(a->kvcm.batch_events == b->kvcm.batch_events);
    FUZZ_CHECK(a->kvcm.queue_events == b->kvcm.queue_events);
    FUZZ_CHECK(a->kvcm.heartbeat_interval_ms == b->kvcm.heartbeat_interval_ms);
    FUZZ_CHECK(a->kvcm.retry_base_ms == b->kvcm.retry_base_ms);
    FUZZ_CHECK(a->kvcm.retry_max_ms == b->kvcm.retry_max_ms);
    FUZZ_CHECK(a->kvcm.snapshot_interval_ms == b->kvcm.snapshot_interval_ms);
    FUZZ_CHECK(a->kvcm.host_down_timeout_ms == b->kvcm.host_down_timeout_ms);
    FUZZ_CHECK(a->kvcm.query_deadline_ms == b->kvcm.query_deadline_ms);
    FUZZ_CHECK(a->kvcm.query_max_hosts == b->kvcm.query_max_hosts);
    FUZZ_CHECK(a->kvcm.query_breaker_failures == b->kvcm.query_breaker_failures);
    FUZZ_CHECK(a->kvcm.query_breaker_open_ms == b->kvcm.query_breaker_open_ms);
    FUZZ_CHECK(a->kvcm.query_negative_ttl_ms == b->kvcm.query_negative_ttl_ms);
    FUZZ_CHECK(a->ntenants == b->ntenants);
    FUZZ_CHECK(a->ntenants <= CONFIG_TENANTS_MAX);
    for (uint32_t i = 0; i < a->ntenants; i++) {
        const struct config_tenant *ta = &a->tenants[i], *tb = &b->tenants[i];
        FUZZ_CHECK(strcmp(ta->name, tb->name) == 0);
        FUZZ_CHECK(strcmp(ta->uids, tb->uids) == 0);
        FUZZ_CHECK(strcmp(ta->gids, tb->gids) == 0);
        FUZZ_CHECK(ta->host_bytes == tb->host_bytes);
        FUZZ_CHECK(ta->host_share == tb->host_share);
        FUZZ_CHECK(ta->hbm_bytes == tb->hbm_bytes);
        FUZZ_CHECK(ta->hbm_share == tb->hbm_share);
        FUZZ_CHECK(ta->max_namespaces == tb->max_namespaces);
        FUZZ_CHECK(ta->max_clients == tb->max_clients);
        FUZZ_CHECK(ta->max_reserved_per_client == tb->max_reserved_per_client);
        FUZZ_CHECK(ta->inherited == tb->inherited);
    }
}

/* cfg parsed: validate it, write it, parse the text back, compare. */
static void check_parsed(const struct kvn_config *cfg)
{
    char err[CONFIG_ERR_MAX];
    err[0] = '\0';
    int v = config_validate(cfg, err, sizeof err);
    FUZZ_CHECK(v == 0 || v == -1);
    if (v)
        check_msg(err);

    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    FUZZ_CHECK(mem != NULL);
    config_write(cfg, mem);
    FUZZ_CHECK(fclose(mem) == 0);

    char path[64];
    int fd = memfd_with(text, len, path, sizeof path);
    struct kvn_config back;
    config_defaults(&back);
    int rc = config_load_file(&back, path, err, sizeof err);
    close(fd);
    if (rc != 0)
        fprintf(stderr, "config_write output does not parse back: %s\n--- text:\n%s---\n", err,
                text);
    FUZZ_CHECK(rc == 0);
    check_equal(cfg, &back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[CONFIG_ERR_MAX];
    char path[64];
    struct kvn_config cfg, before;

    /* as a file */
    config_defaults(&cfg);
    before = cfg;
    int fd = memfd_with(data, size, path, sizeof path);
    memset(err, 0x55, sizeof err);
    int rc = config_load_file(&cfg, path, err, sizeof err);
    close(fd);
    FUZZ_CHECK(rc == 0 || rc == -1);
    if (rc == 0) {
        check_parsed(&cfg);
    } else {
        check_msg(err);
        FUZZ_CHECK(memcmp(&cfg, &before, sizeof cfg) == 0);
    }

    /* as one override (up to the first NUL) */
    char *s = malloc(size + 1);
    FUZZ_CHECK(s != NULL);
    memcpy(s, data, size);
    s[size] = '\0';
    config_defaults(&cfg);
    before = cfg;
    memset(err, 0x55, sizeof err);
    rc = config_apply_override(&cfg, s, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == -1);
    if (rc == 0) {
        check_parsed(&cfg);
    } else {
        check_msg(err);
        FUZZ_CHECK(memcmp(&cfg, &before, sizeof cfg) == 0);
    }
    free(s);
    return 0;
}
