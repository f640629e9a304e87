/* Integration: the stop tells the clients lent HBM to let go of it before
 * it is freed (issue 28 item 4), on the `sim` GPU backend (HBM lent as
 * memfds). Raw sockets: the test decides when a client closes.
 *
 * - On SIGTERM a connection lent an HBM arena receives an unsolicited
 *   Response{id 0, going_away{unmap_within_ms = hbm.release_timeout,
 *   reason}}; its later requests are refused with KVNODE_ESHUTDOWN; a
 *   host-only connection and an observer get no notice, only the close.
 *   The daemon waits for the HBM client; once it closes, the daemon exits 0
 *   well before the timeout (30 s) and logs that every client lent HBM let
 *   go of it before HBM was freed.
 * - A client lent HBM that never closes: the daemon closes it once
 *   hbm.release_timeout (2 s) has passed (never before), exits 0, and logs
 *   how many clients still held HBM when it was freed.
 * - hbm.release_timeout = 0 (set by a reload: the option is reloadable): the
 *   notice (unmap_within_ms 0) is sent and the connection closed at once,
 *   without waiting; the log counts the client as still holding HBM.
 * - /stats: clients.hbm_lent counts the connections lent HBM; during the
 *   stop (over an admin connection opened before it), going_away_total says
 *   how many were told and hbm_lent how many still hold it.
 * - hbm.backend = cuda through the strict fake CUDA (tests/fakecuda; the
 *   suite re-executes itself with the fake on LD_LIBRARY_PATH, the daemon
 *   inherits it): an engine process lent a legacy IPC handle opens it
 *   (cudaIpcOpenMemHandle) and is stopped (SIGSTOP) when the daemon gets
 *   SIGTERM, so it reads the notice late; resumed, it closes the handle and
 *   its connection, and only then is the allocation freed: the fake records
 *   no free-while-mapped (a daemon that frees at once does: cuMemFree of an
 *   allocation another live process has open). A connection lent a VMM fd
 *   gets the notice too. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "raw_request.h"
#include "../fakecuda/fakecuda_env.h"

#define BB (16u << 10)
#define SIM_CONF "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\nhbm.backend=sim\nhbm.bytes=1MiB\n"

/* A raw connection bound to the test layout on `device` (-1: host only);
 * asserts whether HBM was lent. */
static int connect_on_device(const kvh_daemon *d, int device, const char *name)
{
    kvnode_layout l = kvh_layout("going-away", BB, 1, 0);
    int fd = kvh_raw_connect(d->sock);
    ck_assert_msg(fd >= 0, "connect: %s", kvh_error());
    size_t hbm = raw_hello_device(fd, &l, name, device);
    ck_assert_msg(hbm == (device >= 0 ? 1u : 0u), "%s: HELLO lent %zu HBM arenas", name, hbm);
    return fd;
}

/* A raw observer connection (HELLO without a layout). */
static int connect_observer(const kvh_daemon *d)
{
    int fd = kvh_raw_connect(d->sock);
    ck_assert_msg(fd >= 0, "connect: %s", kvh_error());
    Kvnode__HelloRequest h = KVNODE__HELLO_REQUEST__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.client_name = (char *)"observer";
    h.cuda_device = -1;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    req.id = 1;
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &h;
    raw_send_request(fd, &req);
    uint8_t *payload;
    uint32_t len;
    ck_assert_int_eq(kvh_raw_recv_frame(fd, &payload, &len, 1u << 20, 5000), 1);
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_msg(resp && !resp->error && resp->result_case == KVNODE__RESPONSE__RESULT_HELLO, "observer HELLO");
    kvnode__response__free_unpacked(resp, NULL);
    return fd;
}

/* The next frame on fd, decoded (within 10 s); NULL on EOF. */
static Kvnode__Response *next_response(int fd)
{
    uint8_t *payload;
    uint32_t len;
    int r = kvh_raw_recv_frame(fd, &payload, &len, 1u << 20, 10000);
    ck_assert_msg(r >= 0, "receive: %s", kvh_error());
    if (r == 0)
        return NULL;
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_msg(resp != NULL, "undecodable response");
    return resp;
}

/* The GoingAway notice is the next frame on fd: id 0, unmap_within_ms as
 * configured, a reason. */
static void expect_going_away(int fd, uint32_t unmap_within_ms)
{
    Kvnode__Response *resp = next_response(fd);
    ck_assert_msg(resp != NULL, "the connection lent HBM was closed without a GoingAway notice");
    ck_assert_msg(resp->result_case == KVNODE__RESPONSE__RESULT_GOING_AWAY,
                  "expected GoingAway, got result %d (error %s)", (int)resp->result_case,
                  resp->error ? resp->error->message : "none");
    ck_assert_uint_eq(resp->id, 0);
    ck_assert_ptr_null(resp->error);
    ck_assert_uint_eq(resp->going_away->unmap_within_ms, unmap_within_ms);
    ck_assert_msg(resp->going_away->reason && strstr(resp->going_away->reason, "stopping"),
                  "reason: %s", resp->going_away->reason ? resp->going_away->reason : "(none)");
    kvnode__response__free_unpacked(resp, NULL);
}

/* A connection not lent HBM: closed by the stop with no frame at all. */
static void expect_closed_without_notice(int fd, const char *who)
{
    Kvnode__Response *resp = next_response(fd);
    ck_assert_msg(resp == NULL, "%s got a frame at the stop (result %d)", who, resp ? (int)resp->result_case : 0);
}

static void send_ping(int fd, uint64_t id)
{
    Kvnode__PingRequest p = KVNODE__PING_REQUEST__INIT;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    req.id = id;
    req.op_case = KVNODE__REQUEST__OP_PING;
    req.ping = &p;
    raw_send_request(fd, &req);
}

static void assert_log_has(const kvh_daemon *d, const char *what)
{
    char *log = kvh_read_log(d);
    ck_assert_ptr_nonnull(log);
    if (!strstr(log, what))
        kvh_print_log(d, "log without the expected line");
    ck_assert_msg(strstr(log, what) != NULL, "the log lacks \"%s\"", what);
    free(log);
}

/* Wait (10 s at most) until the log has `what`. */
static void wait_log(const kvh_daemon *d, const char *what)
{
    for (uint64_t deadline = kvh_now_ms() + 10000;; kvh_sleep_ms(10)) {
        char *log = kvh_read_log(d);
        bool found = log && strstr(log, what);
        free(log);
        if (found)
            return;
        ck_assert_msg(kvh_now_ms() < deadline, "no \"%s\" in the log", what);
    }
}

START_TEST(notice_reaches_the_client_lent_hbm_and_its_close_ends_the_wait)
{
    kvh_daemon d;
    KVH_START(&d, SIM_CONF "hbm.release_timeout=30s\nserver.shutdown_timeout=2s\n");
    int hbm = connect_on_device(&d, 0, "hbm-client");
    int host = connect_on_device(&d, -1, "host-client");
    int obs = connect_observer(&d);

    ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
    expect_going_away(hbm, 30000);
    expect_closed_without_notice(host, "the host-only client");
    expect_closed_without_notice(obs, "the observer");
    /* Leases are void: what it asks now is refused, not served. */
    send_ping(hbm, 7);
    Kvnode__Response *resp = next_response(hbm);
    ck_assert_msg(resp != NULL, "closed instead of answering");
    ck_assert_uint_eq(resp->id, 7);
    ck_assert_msg(resp->error && resp->error->code == -KVNODE_ESHUTDOWN, "PING after the notice: %s",
                  resp->error ? resp->error->message : "served");
    kvnode__response__free_unpacked(resp, NULL);
    /* Still waiting for it (its 30 s are far from over). */
    ck_assert_int_eq(kvh_wait_exit(&d, 200), KVH_EXIT_TIMEOUT);

    close(hbm);
    int st = kvh_wait_exit(&d, 15000);
    ck_assert_msg(st == 0, "kvnoded exit status %d after the HBM client closed", st);
    assert_log_has(&d, "told 1 client lent HBM to unmap it");
    assert_log_has(&d, "freeing HBM: every client lent it (1) had closed");
    close(host);
    close(obs);
    kvh_destroy(&d);
}
END_TEST

START_TEST(a_client_that_never_closes_is_waited_for_release_timeout)
{
    kvh_daemon d;
    KVH_START(&d, SIM_CONF "hbm.release_timeout=2s\nserver.shutdown_timeout=2s\n");
    int hbm = connect_on_device(&d, 0, "stubborn");
    int host = connect_on_device(&d, -1, "host-client");

    uint64_t t0 = kvh_now_ms();
    ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
    expect_going_away(hbm, 2000);
    expect_closed_without_notice(host, "the host-only client");
    /* It never closes: the daemon does, once the 2 s have passed. */
    ck_assert_msg(kvh_raw_wait_eof(hbm, 15000) == 0, "%s", kvh_error());
    int st = kvh_wait_exit(&d, 15000);
    uint64_t took = kvh_now_ms() - t0;
    ck_assert_msg(st == 0, "kvnoded exit status %d", st);
    ck_assert_msg(took >= 1900, "kvnoded stopped after %llu ms, before hbm.release_timeout (2 s)",
                  (unsigned long long)took);
    assert_log_has(&d, "still connected after hbm.release_timeout (2000 ms)");
    assert_log_has(&d, "freeing HBM while 1 client lent it still held it");
    close(hbm);
    close(host);
    kvh_destroy(&d);
}
END_TEST

START_TEST(release_timeout_zero_notifies_without_waiting)
{
    kvh_daemon d;
    KVH_START(&d, SIM_CONF "hbm.release_timeout=30s\n");
    int hbm = connect_on_device(&d, 0, "hbm-client");
    ck_assert_int_eq(kvh_rewrite_config(&d, SIM_CONF "hbm.release_timeout=0\n"), 0);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    wait_log(&d, "configuration reloaded");

    ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
    expect_going_away(hbm, 0);
    ck_assert_msg(next_response(hbm) == NULL, "more than the notice came");
    int st = kvh_wait_exit(&d, 15000);
    ck_assert_msg(st == 0, "kvnoded exit status %d", st);
    assert_log_has(&d, "freeing HBM while 1 client lent it still held it");
    close(hbm);
    kvh_destroy(&d);
}
END_TEST

/* GET path over an open HTTP/1.1 connection to the admin socket (kept
 * alive): the JSON body. */
static json_t *admin_get_json(int fd, const char *path)
{
    char req[256], buf[1 << 16];
    size_t have = 0;
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: kvnode\r\n\r\n", path);
    ck_assert_int_eq(kvh_raw_send(fd, req, (size_t)n), 0);
    uint64_t deadline = kvh_now_ms() + 10000;
    for (;;) {
        buf[have] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        const char *cl = strcasestr(buf, "Content-Length:");
        if (end && cl && have >= (size_t)(end + 4 - buf) + strtoul(cl + 15, NULL, 10))
            break;
        ck_assert_msg(kvh_now_ms() < deadline && have < sizeof buf - 1, "no whole answer to GET %s", path);
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = recv(fd, buf + have, sizeof buf - 1 - have, 0);
        ck_assert_msg(r > 0, "the admin connection ended: %s", r < 0 ? strerror(errno) : "EOF");
        have += (size_t)r;
    }
    ck_assert_msg(strncmp(buf, "HTTP/1.1 200", 12) == 0, "GET %s: %.40s", path, buf);
    json_t *doc = json_loads(strstr(buf, "\r\n\r\n") + 4, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    return doc;
}

START_TEST(stats_count_the_clients_lent_hbm_and_the_notices)
{
    kvh_daemon d;
    char conf[PATH_MAX + 256], admin_sock[PATH_MAX + 16];
    char dir[PATH_MAX];
    ck_assert_int_eq(kvh_mkdtemp(dir, sizeof dir), 0);
    snprintf(admin_sock, sizeof admin_sock, "%s/admin.sock", dir);
    snprintf(conf, sizeof conf, SIM_CONF "hbm.release_timeout=30s\nadmin.listen=unix:%s\n", admin_sock);
    KVH_START(&d, conf);
    int hbm = connect_on_device(&d, 0, "hbm-client");
    int host = connect_on_device(&d, -1, "host-client");
    ck_assert_int_eq(KVH_STAT(&d, "clients.hbm_lent"), 1);
    ck_assert_int_eq(KVH_STAT(&d, "clients.going_away_total"), 0);

    int admin = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    ck_assert_uint_lt(strlen(admin_sock), sizeof sa.sun_path);
    memcpy(sa.sun_path, admin_sock, strlen(admin_sock) + 1);
    ck_assert_int_eq(connect(admin, (struct sockaddr *)&sa, sizeof sa), 0);
    json_t *doc = admin_get_json(admin, "/stats");
    ck_assert_int_eq(kvh_json_int(doc, "clients.hbm_lent"), 1);
    json_decref(doc);

    ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
    expect_going_away(hbm, 30000);
    expect_closed_without_notice(host, "the host-only client");
    /* The stop waits for the HBM client: the admin connection opened
     * before it still answers. */
    doc = admin_get_json(admin, "/stats");
    ck_assert_int_eq(kvh_json_int(doc, "clients.going_away_total"), 1);
    ck_assert_int_eq(kvh_json_int(doc, "clients.hbm_lent"), 1);
    ck_assert_int_eq(kvh_json_int(doc, "clients.connected"), 1);
    json_decref(doc);

    close(hbm);
    int st = kvh_wait_exit(&d, 15000);
    ck_assert_msg(st == 0, "kvnoded exit status %d", st);
    close(admin);
    close(host);
    kvh_destroy(&d);
}
END_TEST

/* --- hbm.backend = cuda, through the strict fake CUDA --------------------- */

#define CUDA_CONF "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\nhbm.backend=cuda\nhbm.bytes=2MiB\n" \
                  "hbm.required=on\nhbm.devices=0\nhbm.release_timeout=30s\n"

/* The fake's state folder for this test (FAKECUDA_DIR; the daemon and the
 * engine process inherit it). legacy: no VMM, so HBM is lent as legacy IPC
 * handles. */
static void fake_setup(bool legacy)
{
    char dir[PATH_MAX];
    ck_assert_int_eq(kvh_mkdtemp(dir, sizeof dir), 0);
    ck_assert_int_eq(fakecuda_setup(dir), 0);
    if (legacy)
        ck_assert_int_eq(setenv("FAKECUDA_NO_VMM", "1", 1), 0);
}

/* HELLO on GPU 0 saying what the client can import (cuda_ipc, cuda_vmm):
 * the HBM arena lent, its legacy IPC handle copied into ipc (64 bytes) when
 * it came as one. */
static Kvnode__Arena hello_cuda(int fd, bool ipc_ok, bool vmm_ok, uint8_t ipc[64])
{
    kvnode_layout l = kvh_layout("going-away-cuda", BB, 1, 0);
    Kvnode__Layout pl = raw_layout(&l);
    Kvnode__HelloRequest h = KVNODE__HELLO_REQUEST__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.layout = &pl;
    h.client_name = (char *)"cuda-engine";
    h.cuda_device = 0;
    h.cuda_ipc = ipc_ok;
    h.cuda_vmm = vmm_ok;
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    req.id = 1;
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &h;
    raw_send_request(fd, &req);
    Kvnode__Response *resp = next_response(fd);
    ck_assert_msg(resp && !resp->error && resp->result_case == KVNODE__RESPONSE__RESULT_HELLO, "HELLO: %s",
                  resp && resp->error ? resp->error->message : "no reply");
    Kvnode__Arena hbm = KVNODE__ARENA__INIT;
    for (size_t i = 0; i < resp->hello->n_arenas; i++) {
        const Kvnode__Arena *a = resp->hello->arenas[i];
        if (a->tier != KVNODE__TIER__TIER_HBM)
            continue;
        hbm = *a;
        hbm.cuda_ipc_handle.data = NULL;
        if (a->cuda_ipc_handle.len == 64)
            memcpy(ipc, a->cuda_ipc_handle.data, 64);
    }
    kvnode__response__free_unpacked(resp, NULL);
    return hbm;
}

/* The engine: a process of its own with the legacy IPC handle open, which
 * on the notice (or the connection's end) closes the handle, then its
 * connection: the order libkvnode keeps. */
typedef struct { unsigned char reserved[64]; } ipc_handle;
struct engine {
    int fd;
    void *dev;
    int (*ipc_close)(void *);
};

static void *engine_watch(void *arg)
{
    struct engine *e = arg;
    for (;;) {
        uint8_t *payload;
        uint32_t len;
        if (kvh_raw_recv_frame(e->fd, &payload, &len, 1u << 20, 600000) != 1)
            break;
        Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
        free(payload);
        bool notice = resp && resp->result_case == KVNODE__RESPONSE__RESULT_GOING_AWAY;
        if (resp)
            kvnode__response__free_unpacked(resp, NULL);
        if (notice)
            break;
    }
    e->ipc_close(e->dev);
    close(e->fd);
    return NULL;
}

static int hold_ipc_engine(const kvh_daemon *d, char *msg, size_t len)
{
    static struct engine e;
    void *rt = dlopen("libcudart.so.12", RTLD_NOW);
    int (*set_device)(int) = rt ? (int (*)(int))dlsym(rt, "cudaSetDevice") : NULL;
    int (*ipc_open)(void **, ipc_handle, unsigned) =
        rt ? (int (*)(void **, ipc_handle, unsigned))dlsym(rt, "cudaIpcOpenMemHandle") : NULL;
    e.ipc_close = rt ? (int (*)(void *))dlsym(rt, "cudaIpcCloseMemHandle") : NULL;
    if (!set_device || !ipc_open || !e.ipc_close) {
        snprintf(msg, len, "the fake CUDA runtime: %s", dlerror());
        return -1;
    }
    e.fd = kvh_raw_connect(d->sock);
    if (e.fd < 0) {
        snprintf(msg, len, "connect: %s", kvh_error());
        return -1;
    }
    ipc_handle h;
    Kvnode__Arena a = hello_cuda(e.fd, true, false, h.reserved);
    if (a.tier != KVNODE__TIER__TIER_HBM || a.cuda_ipc_handle.len != 64) {
        snprintf(msg, len, "no HBM arena lent as a legacy IPC handle");
        return -1;
    }
    int rc = set_device(0);
    if (rc == 0)
        rc = ipc_open(&e.dev, h, 1 /* cudaIpcMemLazyEnablePeerAccess */);
    if (rc != 0) {
        snprintf(msg, len, "cudaIpcOpenMemHandle -> %d", rc);
        return -1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, engine_watch, &e) != 0) {
        snprintf(msg, len, "pthread_create failed");
        return -1;
    }
    return 0;
}

START_TEST(cuda_legacy_ipc_engine_unmaps_before_hbm_is_freed)
{
    kvh_daemon d;
    fake_setup(true);
    KVH_START(&d, CUDA_CONF);
    pid_t engine = kvh_spawn_holder(&d, hold_ipc_engine);
    ck_assert_msg(engine > 0, "%s", kvh_error());
    ck_assert_int_eq(KVH_STAT(&d, "clients.hbm_lent"), 1);

    /* Busy elsewhere when the daemon is told to stop: it reads the notice late. */
    ck_assert_int_eq(kill(engine, SIGSTOP), 0);
    ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
    wait_log(&d, "received SIGTERM");
    /* A daemon that did not wait would be gone in this time. */
    int st = kvh_wait_exit(&d, 3000);
    ck_assert_int_eq(kill(engine, SIGCONT), 0);
    if (st == KVH_EXIT_TIMEOUT)
        st = kvh_wait_exit(&d, 15000);
    ck_assert_msg(st == 0, "kvnoded exit status %d", st);
    int violations = fakecuda_env_violations(NULL);
    if (violations != 0)
        fakecuda_env_print_violations(stderr);
    ck_assert_msg(violations == 0, "the fake CUDA recorded %d violations (printed above)", violations);
    assert_log_has(&d, "freeing HBM: every client lent it (1) had closed");
    ck_assert_int_ge(proc_stop(&engine, SIGKILL, 10000), 0);
    kvh_destroy(&d);
}
END_TEST

START_TEST(cuda_vmm_client_gets_the_notice)
{
    kvh_daemon d;
    fake_setup(false);
    KVH_START(&d, CUDA_CONF);
    int fd = kvh_raw_connect(d.sock);
    ck_assert_msg(fd >= 0, "connect: %s", kvh_error());
    uint8_t ipc[64];
    Kvnode__Arena a = hello_cuda(fd, true, true, ipc);
    ck_assert_msg(a.tier == KVNODE__TIER__TIER_HBM && a.cuda_vmm, "no HBM arena lent as a VMM fd");

    ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
    expect_going_away(fd, 30000);
    close(fd);
    int st = kvh_wait_exit(&d, 15000);
    ck_assert_msg(st == 0, "kvnoded exit status %d", st);
    ck_assert_int_eq(fakecuda_env_violations(NULL), 0);
    assert_log_has(&d, "freeing HBM: every client lent it (1) had closed");
    kvh_destroy(&d);
}
END_TEST

/* A client told to go away that keeps sending and reads nothing: its
 * refusals are replies like any other, held to
 * server.max_buffered_output_bytes; the connection is closed at the bound,
 * not buffered for the whole hbm.release_timeout. */
START_TEST(a_client_flooding_after_the_notice_is_held_to_the_output_bound)
{
    enum { N = 200000 };     /* ~6 MB of requests, ~28 MB of refusals */
    kvh_daemon d;
    KVH_START(&d, SIM_CONF "hbm.release_timeout=60s\nserver.max_buffered_output_bytes=1MiB\n");
    int fd = connect_on_device(&d, 0, "flooder");
    ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
    expect_going_away(fd, 60000);

    uint8_t *all = malloc((size_t)N * 32);
    ck_assert_ptr_nonnull(all);
    size_t total = 0;
    int64_t keys[1] = { 1 };
    for (int i = 0; i < N; i++) {
        Kvnode__GetInlineRequest g = KVNODE__GET_INLINE_REQUEST__INIT;
        g.n_keys = 1;
        g.keys = keys;
        Kvnode__Request req = KVNODE__REQUEST__INIT;
        req.id = (uint64_t)i + 1;
        req.op_case = KVNODE__REQUEST__OP_GET_INLINE;
        req.get_inline = &g;
        size_t len = kvnode__request__get_packed_size(&req);
        all[total] = (uint8_t)len;
        all[total + 1] = all[total + 2] = all[total + 3] = 0;
        kvnode__request__pack(&req, all + total + 4);
        total += 4 + len;
    }
    /* The daemon may close it mid-way: that is the point, not an error. */
    for (size_t at = 0; at < total;) {
        ssize_t n = send(fd, all + at, total - at, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        at += (size_t)n;
    }
    free(all);
    /* Closed at the bound, long before the 60 s of hbm.release_timeout. */
    ck_assert_msg(kvh_raw_wait_eof(fd, 20000) == 0, "%s", kvh_error());
    int st = kvh_wait_exit(&d, 20000);
    ck_assert_msg(st == 0, "kvnoded exit status %d", st);
    assert_log_has(&d, "it reads no replies");
    close(fd);
    kvh_destroy(&d);
}
END_TEST

int main(int argc, char **argv)
{
    /* The daemon and the engine process find the fake through LD_LIBRARY_PATH. */
    fakecuda_reexec(argc, argv);
    const TTest *const tests[] = { notice_reaches_the_client_lent_hbm_and_its_close_ends_the_wait,
                                   a_client_that_never_closes_is_waited_for_release_timeout,
                                   release_timeout_zero_notifies_without_waiting,
                                   stats_count_the_clients_lent_hbm_and_the_notices,
                                   cuda_legacy_ipc_engine_unmaps_before_hbm_is_freed,
                                   cuda_vmm_client_gets_the_notice,
                                   a_client_flooding_after_the_notice_is_held_to_the_output_bound };
    return kvh_run_suite("daemon_going_away", "going_away", 60, tests, sizeof tests / sizeof tests[0]);
}
