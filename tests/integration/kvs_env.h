/* kvs_env: a daemon serving the KVS front end for one integration test (HTTP
 * on loopback TCP, the data plane on a unix socket in the test's temp dir),
 * its stats and the object bytes the KVS suites write. Include after
 * harness.h and kvs_client.h. */
#ifndef KVNODE_TEST_KVS_ENV_H
#define KVNODE_TEST_KVS_ENV_H

#include <check.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "harness.h"

typedef struct kvs_env {
    kvh_daemon d;
    char dir[PATH_MAX];
    char kvs_sock[PATH_MAX + 16];
    char url[PATH_MAX + 16];
} kvs_env;

/* The temp dir and the data plane's socket path, before the daemon starts
 * (a test that names files in e->dir writes its options after this). */
static inline void kvs_env_init(kvs_env *e)
{
    memset(e, 0, sizeof *e);
    ck_assert_msg(kvh_mkdtemp(e->dir, sizeof e->dir) == 0, "%s", kvh_error());
    snprintf(e->kvs_sock, sizeof e->kvs_sock, "%s/kvs.sock", e->dir);
}

/* Start the daemon with the front end on and extra (more assignments, may
 * be ""), and read its HTTP address into e->url. */
static inline void kvs_env_boot(kvs_env *e, const char *extra)
{
    char conf[PATH_MAX * 4 + 1024];
    snprintf(conf, sizeof conf, "kvs_server.enabled=on\nkvs_server.listen=127.0.0.1:0\n"
             "kvs_server.socket_path=%s\n%s", e->kvs_sock, extra);
    KVH_START(&e->d, conf);
    json_t *st = kvh_stats(&e->d);
    ck_assert_ptr_nonnull(st);
    const char *addr = json_string_value(kvh_json_get(st, "kvs_server.http_address"));
    ck_assert_msg(addr && strncmp(addr, "127.0.0.1:", 10) == 0, "kvs_server.http_address: %s", addr ? addr : "-");
    snprintf(e->url, sizeof e->url, "http://%s", addr);
    json_decref(st);
}

/* kvs_env_init + kvs_env_boot with the reaper every 100 ms (leases that
 * pass their term end promptly), then extra. */
static inline void kvs_env_start(kvs_env *e, const char *extra)
{
    char conf[PATH_MAX * 2 + 1024];
    kvs_env_init(e);
    snprintf(conf, sizeof conf, "leases.reaper_interval=100ms\n%s", extra);
    kvs_env_boot(e, conf);
}

/* kvs_server.<path> of the stats document. */
static inline long long kvs_stat(kvs_env *e, const char *path)
{
    char full[128];
    snprintf(full, sizeof full, "kvs_server.%s", path);
    return kvh_stat(&e->d, full);
}

/* Deterministic bytes of object `key` for writer `salt`. */
static inline void bfill(uint8_t *p, size_t len, int64_t key, uint32_t salt)
{
    uint64_t x = (uint64_t)key * 0x9e3779b97f4a7c15ull + salt + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* A connection to a "unix:PATH" listen (flags: e.g. SOCK_NONBLOCK). Over a
 * unix socket the kernel buffers a fixed amount (net.core.wmem_default),
 * unlike loopback TCP, whose buffers grow with the window. */
static inline int kvs_connect_unix(const char *url, int flags)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    ck_assert_msg(strncmp(url, "unix:", 5) == 0 && strlen(url + 5) < sizeof sa.sun_path, "url %s", url);
    memcpy(sa.sun_path, url + 5, strlen(url + 5) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* kvs_server.<path> once it stops changing (the same for 300 ms; 10 s at most). */
static inline long long kvs_stat_settled(kvs_env *e, const char *path)
{
    long long was = -2, now = kvs_stat(e, path);
    uint64_t t0 = kvh_now_ms();
    while (now != was && kvh_now_ms() - t0 < 10000) {
        kvh_sleep_ms(300);
        was = now;
        now = kvs_stat(e, path);
    }
    return now;
}

/* POST /acquire body on a raw connection (the whole request sent). */
static inline void kvs_send_acquire(int fd, const char *body)
{
    size_t blen = strlen(body);
    char head[256];
    int hl = snprintf(head, sizeof head, "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n", blen);
    ck_assert_int_eq(send(fd, head, (size_t)hl, MSG_NOSIGNAL), hl);
    for (size_t off = 0; off < blen;) {
        ssize_t n = send(fd, body + off, blen - off, MSG_NOSIGNAL);
        ck_assert_int_gt(n, 0);
        off += (size_t)n;
    }
}

#endif
