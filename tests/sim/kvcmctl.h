/* Header-only helper for Check tests that drive the KVCM simulator (tests/sim/kvcm_sim.c)
 * as a child process: tests/sim/test_kvcm_sim.c and the daemon's KVCM publisher tests.
 *
 * kvcmctl_start() runs the simulator with --http (default 127.0.0.1:0, an ephemeral port)
 * plus any extra arguments, optionally under valgrind, and reads its "http=HOST:PORT"
 * announcement with a deadline. kvcmctl_stop_ok() sends SIGTERM and requires a clean exit 0
 * (under valgrind: no error and no definite leak, else exit 99). The binary is $KVCM_SIM,
 * else kvcm-sim next to $KVS_SIM (tests/run-tests.sh exports that), else $BUILD/kvcm-sim,
 * else build/kvcm-sim.
 *
 * kvcmctl_http() asks the simulator's own endpoints through kvh_http_try (kvh_http.h, the
 * tests' one HTTP helper); kvcmctl_state(), kvcmctl_recorded(), kvcmctl_control() and
 * kvcmctl_reporter() wrap GET /state, GET /recorded, POST /control. kvcmctl_exchange()
 * sends raw bytes (requests no client library would send).
 *
 * Everything is static inline; failures are Check assertions. Needs jansson. */
#ifndef KVNODE_TESTS_KVCMCTL_H
#define KVNODE_TESTS_KVCMCTL_H

#include <check.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "simctl.h"   /* the launcher, clock, sleep, valgrind switch and reaping are shared */

/* Default deadline of one kvcmctl_http() call. */
#define KVCMCTL_HTTP_MS     30000u

struct kvcmctl {
    pid_t pid;
    char  http[64];           /* HOST:PORT as announced */
    char  base[128];          /* http://HOST:PORT */
};

struct kvcmctl_opts {
    const char        *http_addr;  /* --http value; NULL: 127.0.0.1:0 (ephemeral) */
    bool               valgrind;   /* run the simulator under valgrind (errors -> exit 99) */
    const char *const *extra;      /* NULL-terminated extra arguments, or NULL */
};

/* The simulator binary (see the header comment). */
static inline const char *kvcmctl_bin(char *buf, size_t cap)
{
    const char *e = getenv("KVCM_SIM");
    if (e && *e)
        return e;
    e = getenv("KVS_SIM");
    const char *slash = e ? strrchr(e, '/') : NULL;
    if (slash) {
        snprintf(buf, cap, "%.*s/kvcm-sim", (int)(slash - e), e);
        if (access(buf, X_OK) == 0)
            return buf;
    }
    e = getenv("BUILD");
    snprintf(buf, cap, "%s/kvcm-sim", e && *e ? e : "build");
    return buf;
}

/* Start the simulator as described by o (NULL: all defaults). */
static inline void kvcmctl_start(struct kvcmctl *k, const struct kvcmctl_opts *o)
{
    static const struct kvcmctl_opts defaults = { 0 };
    if (!o)
        o = &defaults;
    memset(k, 0, sizeof *k);
    char binbuf[512];
    const char *argv[48];
    int n = 0;
    argv[n++] = kvcmctl_bin(binbuf, sizeof binbuf);
    argv[n++] = "--http";
    argv[n++] = o->http_addr ? o->http_addr : "127.0.0.1:0";
    for (const char *const *e = o->extra; e && *e && n < 46; e++)
        argv[n++] = *e;
    argv[n] = NULL;

    static const char *const announce[] = { "http=", NULL };
    char out[1024];
    k->pid = simctl_spawn(argv, o->valgrind, announce, out, sizeof out, "kvcm-sim");
    simctl_announced(out, "http=", k->http, sizeof k->http);
    snprintf(k->base, sizeof k->base, "http://%s", k->http);
}

/* Signal it (SIGTERM, or SIGKILL when hard) and reap it (see simctl_reap_pid). */
static inline int kvcmctl_reap(struct kvcmctl *k, bool hard)
{
    return simctl_reap_pid(&k->pid, hard);
}

/* SIGTERM and require exit status 0. */
static inline void kvcmctl_stop_ok(struct kvcmctl *k)
{
    int st = kvcmctl_reap(k, false);
    ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "kvcm-sim did not exit 0 on SIGTERM (status 0x%x)", st);
}

/* ---- a minimal HTTP/1.1 client ------------------------------------------------------- */

static inline int kvcmctl_connect(const struct kvcmctl *k, uint64_t deadline)
{
    char host[64];
    const char *colon = strrchr(k->http, ':');
    ck_assert(colon && (size_t)(colon - k->http) < sizeof host);
    snprintf(host, sizeof host, "%.*s", (int)(colon - k->http), k->http);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
        return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return -1;
    struct pollfd p = { .fd = fd, .events = POLLOUT };
    int left = (int)(deadline - simctl_now_ms());
    int err = 0;
    socklen_t el = sizeof err;
    if (left <= 0 || poll(&p, 1, left) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Send raw request bytes, read the whole answer (until the server closes) into *resp
 * (malloc'd, NUL-terminated). Returns bytes read, -1 on a connect or I/O failure or the
 * deadline. An answer-less close yields 0. */
static inline long kvcmctl_exchange(const struct kvcmctl *k, const char *req, size_t len,
                                    char **resp, unsigned timeout_ms)
{
    uint64_t deadline = simctl_now_ms() + timeout_ms;
    *resp = NULL;
    int fd = kvcmctl_connect(k, deadline);
    if (fd < 0)
        return -1;
    size_t off = 0, cap = 4096, got = 0;
    char *buf = malloc(cap);
    ck_assert(buf);
    long rc = -1;
    while (off < len) {
        struct pollfd p = { .fd = fd, .events = POLLOUT };
        int left = (int)(deadline - simctl_now_ms());
        if (left <= 0 || poll(&p, 1, left) != 1)
            goto out;
        ssize_t w = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (w <= 0)
            break;   /* the server may have answered and closed early: read what it sent */
        off += (size_t)w;
    }
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int left = (int)(deadline - simctl_now_ms());
        if (left <= 0 || poll(&p, 1, left) != 1)
            goto out;
        if (got + 4096 > cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            ck_assert(nb);
            buf = nb;
        }
        ssize_t r = recv(fd, buf + got, cap - got - 1, 0);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (r < 0 && errno != ECONNRESET)
            goto out;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    rc = (long)got;
out:
    close(fd);
    buf[got] = '\0';
    if (rc < 0) {
        free(buf);
        return -1;
    }
    *resp = buf;
    return rc;
}

/* One request (JSON body; GETs carry an empty one); returns the HTTP status (-1: no
 * answer) and the body in *out (malloc'd, NUL-terminated; may be NULL when out is NULL). */
static inline int kvcmctl_http(const struct kvcmctl *k, const char *method, const char *path,
                               const char *body, char **out)
{
    return (int)kvh_http_try(k->http, method, path, body ? body : "", out, NULL, 0, KVCMCTL_HTTP_MS, NULL);
}

/* GET a simulator endpoint, require 200 and a JSON document. */
static inline json_t *kvcmctl_get_json(const struct kvcmctl *k, const char *path)
{
    char *out = NULL;
    int st = kvcmctl_http(k, "GET", path, NULL, &out);
    ck_assert_msg(st == 200, "GET %s: status %d", path, st);
    json_error_t err;
    json_t *doc = json_loads(out, 0, &err);
    ck_assert_msg(doc != NULL, "GET %s: not JSON: %s", path, err.text);
    free(out);
    return doc;
}

/* GET /state (with block_specs when specs). */
static inline json_t *kvcmctl_state(const struct kvcmctl *k, bool specs)
{
    return kvcmctl_get_json(k, specs ? "/state?specs=1" : "/state");
}

/* GET /recorded?since=SEQ. */
static inline json_t *kvcmctl_recorded(const struct kvcmctl *k, long long since)
{
    char path[64];
    snprintf(path, sizeof path, "/recorded?since=%lld", since);
    return kvcmctl_get_json(k, path);
}

/* POST /control with a JSON text; require 200; returns the new settings. */
static inline json_t *kvcmctl_control(const struct kvcmctl *k, const char *json)
{
    char *out = NULL;
    int st = kvcmctl_http(k, "POST", "/control", json, &out);
    ck_assert_msg(st == 200, "POST /control %s: status %d: %s", json, st, out);
    json_t *doc = json_loads(out, 0, NULL);
    ck_assert(doc);
    free(out);
    return doc;
}

/* A reporter's entry in a /state document (borrowed), or NULL. storage_type by name. */
static inline json_t *kvcmctl_reporter(json_t *state, const char *instance_id,
                                       const char *storage_type, const char *host_ip_port)
{
    char id[512];
    snprintf(id, sizeof id, "%s#%s#%s", instance_id, storage_type, host_ip_port);
    return json_object_get(json_object_get(state, "reporters"), id);
}

#endif /* KVNODE_TESTS_KVCMCTL_H */
