/* Integration: kvnoded with hbm.backend = cuda against the strict fake CUDA
 * library (tests/fakecuda): the daemon is started with the fake's folder on
 * LD_LIBRARY_PATH (its dlopen("libcuda.so.1") finds the fake) and its own
 * FAKECUDA_DIR, where the fake writes ctx-<physical device>-<pid> for every
 * context a process creates. Clients are raw HELLOs (raw_request.h) with the
 * GPU fields set by hand, so the bus id spellings and capabilities are
 * exactly what each test says. Two fake GPUs: 0000:3B:00.0 and 0000:5E:00.0.
 *
 * - no HBM tier, pin_host auto or on: the daemon sees both GPUs (backend
 *   cuda, 2 visible), pins nothing and creates no context at all, not even
 *   when a client on a GPU connects (issue 28 item 5);
 * - HBM on device 1 only: pinning runs with device 1's context; no context
 *   on device 0 (item 5);
 * - the HBM arena goes to a client whose bus id names device 1 in another
 *   spelling (nvidia-smi's 8-digit domain, lower case; and a daemon whose
 *   driver spells it nvidia-smi's way against a client in upper case) as a
 *   VMM fd (Arena.cuda_vmm); a client whose bus id matches no HBM GPU gets
 *   none, even with the daemon's ordinal of that GPU as its device; only
 *   without a bus id the ordinal decides (item 9); a VMM arena is not
 *   offered to a client that can only open legacy IPC handles;
 * - FAKECUDA_NO_VMM: the arena is a legacy IPC handle (64 bytes, no fd) for
 *   cuda_ipc clients, nothing for a client that only imports VMM handles;
 * - HelloRequest.hbm_unusable: counted in /stats gpu.hbm_unusable_clients
 *   with the latest in gpu.hbm_unusable_last, logged at most once a minute
 *   (the second within the minute is not);
 * - a GPU in EXCLUSIVE_PROCESS compute mode is left out with the message,
 *   without a context; the other serves;
 * - a region the GPU has no room for is retried for hbm.alloc_retry, each
 *   wait logged, then required = on fails the start saying so. */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda_daemon.h"
#include "harness.h"
#include "raw_request.h"
#include "../common/rmtree.h"

#define CUDA_CONF "memory.host_bytes=4MiB\nmemory.slab_bytes=256KiB\nhbm.backend=cuda\n"
#define BUS0 "0000:3B:00.0"
#define BUS1 "0000:5E:00.0"

static char fake_dir[PATH_MAX];
static char ld_path[2 * PATH_MAX + 32], dir_env[PATH_MAX + 32];

/* A fresh state folder and the environment entries that point a daemon at
 * the fake (fakecuda_daemon.h). */
static void fake_setup(void)
{
    fakecuda_daemon_env(fake_dir, ld_path, dir_env);
}

/* Start with the fake and up to 3 more environment entries (NULL ends). */
static void start_cuda(kvh_daemon *d, const char *conf, const char *e1, const char *e2)
{
    const char *env[] = { ld_path, dir_env, e1, e2, NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(d, conf, &o) == 0, "start: %s", kvh_error());
}

static bool has_context(int physical, pid_t pid)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/ctx-%d-%d", fake_dir, physical, (int)pid);
    return access(p, F_OK) == 0;
}

static void assert_no_violations(void)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/violations", fake_dir);
    size_t n = 0;
    char *text = access(p, F_OK) == 0 ? kvh_read_file(p, &n) : NULL;
    ck_assert_msg(n == 0, "the fake recorded violations:\n%s", text ? text : "");
    free(text);
}

static long long jint(json_t *o, const char *path)
{
    long long v = kvh_json_int(o, path);
    ck_assert_msg(v >= 0, "%s: %s", path, kvh_error());
    return v;
}

static const char *jstr(json_t *o, const char *path)
{
    const char *s = json_string_value(kvh_json_get(o, path));
    return s ? s : "(none)";
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* --- a client's HELLO, by hand ------------------------------------------------------ */

struct gpu_hello {
    int device;
    const char *bus_id;      /* NULL: none */
    bool ipc, vmm;
    const char *unusable;    /* NULL: none */
    const char *name;
};

/* The HBM arena the daemon lent (NULL when none); the reply is *out. */
static const Kvnode__Arena *hello(const kvh_daemon *d, const struct gpu_hello *g, Kvnode__Response **out)
{
    kvnode_layout l = kvh_layout("cuda-it", 16384, 1, 0);
    Kvnode__Layout pl = raw_layout(&l);
    Kvnode__HelloRequest h = KVNODE__HELLO_REQUEST__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.layout = &pl;
    h.client_name = (char *)(g->name ? g->name : "cuda-it");
    h.cuda_device = g->device;
    h.cuda_pci_bus_id = (char *)(g->bus_id ? g->bus_id : "");
    h.cuda_ipc = g->ipc;
    h.cuda_vmm = g->vmm;
    h.hbm_unusable = (char *)(g->unusable ? g->unusable : "");
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    req.id = 1;
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &h;
    int fd = kvh_raw_connect(d->sock);
    ck_assert_msg(fd >= 0, "%s", kvh_error());
    raw_send_request(fd, &req);
    uint8_t *payload;
    uint32_t len;
    ck_assert_msg(kvh_raw_recv_frame(fd, &payload, &len, 1u << 20, 5000) == 1, "HELLO: %s", kvh_error());
    close(fd);
    Kvnode__Response *resp = kvnode__response__unpack(NULL, len, payload);
    free(payload);
    ck_assert_msg(resp && !resp->error && resp->result_case == KVNODE__RESPONSE__RESULT_HELLO, "HELLO failed: %s",
                  resp && resp->error ? resp->error->message : "undecodable");
    *out = resp;
    const Kvnode__Arena *hbm = NULL;
    for (size_t i = 0; i < resp->hello->n_arenas; i++)
        if (resp->hello->arenas[i]->tier == KVNODE__TIER__TIER_HBM) {
            ck_assert_msg(!hbm, "two HBM arenas lent to one client");
            hbm = resp->hello->arenas[i];
        }
    return hbm;
}

static void expect_vmm_arena(const kvh_daemon *d, const struct gpu_hello *g)
{
    Kvnode__Response *r;
    const Kvnode__Arena *a = hello(d, g, &r);
    ck_assert_msg(a, "client on %s (device %d) was lent no HBM", g->bus_id ? g->bus_id : "(no bus id)", g->device);
    ck_assert_msg(a->cuda_vmm && a->fd_index >= 0, "HBM not lent as a VMM fd (cuda_vmm %d, fd_index %d)",
                  (int)a->cuda_vmm, (int)a->fd_index);
    ck_assert_uint_eq(a->cuda_ipc_handle.len, 0);
    ck_assert_int_eq(a->device, g->device);   /* named as the client numbers it */
    ck_assert_uint_ge(a->size, 4u << 20);
    kvnode__response__free_unpacked(r, NULL);
}

static void expect_no_hbm(const kvh_daemon *d, const struct gpu_hello *g, const char *why)
{
    Kvnode__Response *r;
    const Kvnode__Arena *a = hello(d, g, &r);
    ck_assert_msg(!a, "%s: HBM lent (device %d, bus id %s)", why, g->device, g->bus_id ? g->bus_id : "(none)");
    ck_assert_uint_ge(r->hello->n_arenas, 1);   /* host memory still */
    kvnode__response__free_unpacked(r, NULL);
}

/* --- tests ---------------------------------------------------------------------------- */

START_TEST(no_hbm_no_context)
{
    static const char *const confs[] = { CUDA_CONF "memory.pin_host=auto\n", CUDA_CONF "memory.pin_host=on\n" };
    for (size_t i = 0; i < 2; i++) {
        fake_setup();
        kvh_daemon d;
        start_cuda(&d, confs[i], NULL, NULL);
        json_t *st = kvh_stats(&d);
        ck_assert_msg(st, "%s", kvh_error());
        ck_assert_str_eq(jstr(st, "gpu.backend"), "cuda");
        ck_assert_int_eq(jint(st, "gpu.devices_visible"), 2);
        ck_assert_int_eq(jint(st, "gpu.hbm_arenas"), 0);
        ck_assert_str_eq(jstr(st, "tiers.host.pin_state"), "off");
        json_decref(st);
        /* An engine on a GPU connects: host memory only, still no context. */
        struct gpu_hello g = { .device = 0, .bus_id = BUS0, .ipc = true, .vmm = true };
        expect_no_hbm(&d, &g, "no HBM tier");
        ck_assert_msg(!has_context(0, d.pid) && !has_context(1, d.pid),
                      "%s: the daemon without an HBM tier created a context", confs[i]);
        char *log = kvh_read_log(&d);
        ck_assert_msg(log && strstr(log, "no HBM tier") && strstr(log, "per process"), "log:\n%s", log ? log : "");
        free(log);
        KVH_STOP_DESTROY(&d);
        ck_assert(!has_context(0, d.pid) && !has_context(1, d.pid));
        assert_no_violations();
    }
}
END_TEST

START_TEST(hbm_on_device_1_only)
{
    fake_setup();
    kvh_daemon d;
    start_cuda(&d, CUDA_CONF "hbm.bytes=4MiB\nhbm.devices=1\nmemory.pin_host=auto\n", NULL, NULL);
    json_t *st = NULL;
    uint64_t deadline = kvh_now_ms() + 10000;
    for (;;) {
        st = kvh_stats(&d);
        ck_assert_msg(st, "%s", kvh_error());
        if (strcmp(jstr(st, "tiers.host.pin_state"), "done") == 0)
            break;
        ck_assert_msg(strcmp(jstr(st, "tiers.host.pin_state"), "running") == 0, "pin_state %s",
                      jstr(st, "tiers.host.pin_state"));
        json_decref(st);
        ck_assert_msg(kvh_now_ms() < deadline, "host arena not pinned within 10 s");
        kvh_sleep_ms(20);
    }
    ck_assert_int_eq(jint(st, "gpu.hbm_arenas"), 1);
    json_decref(st);
    ck_assert_msg(has_context(1, d.pid), "no context on device 1, which serves HBM");
    ck_assert_msg(!has_context(0, d.pid), "a context on device 0, which serves no HBM");

    /* Its arena, to the clients on that GPU however they spell it. */
    struct gpu_hello nvsmi = { .device = 0, .bus_id = "00000000:5E:00.0", .vmm = true, .ipc = true };
    expect_vmm_arena(&d, &nvsmi);
    struct gpu_hello lower = { .device = 3, .bus_id = "0000:5e:00.0", .vmm = true };
    expect_vmm_arena(&d, &lower);
    /* No bus id: the daemon's ordinal. */
    struct gpu_hello ordinal = { .device = 1, .vmm = true };
    expect_vmm_arena(&d, &ordinal);
    /* A bus id of no HBM GPU: nothing, whatever the ordinal. */
    struct gpu_hello other = { .device = 1, .bus_id = BUS0, .vmm = true, .ipc = true };
    expect_no_hbm(&d, &other, "bus id of the GPU without HBM");
    struct gpu_hello unknown = { .device = 1, .bus_id = "0000:99:00.0", .vmm = true, .ipc = true };
    expect_no_hbm(&d, &unknown, "bus id of no GPU");
    struct gpu_hello bad = { .device = 1, .bus_id = "GPU-5e", .vmm = true, .ipc = true };
    expect_no_hbm(&d, &bad, "a bus id that is not one");
    /* A VMM region is not a legacy IPC allocation. */
    struct gpu_hello ipc_only = { .device = 0, .bus_id = BUS1, .ipc = true };
    expect_no_hbm(&d, &ipc_only, "client without VMM import");
    ck_assert(!has_context(0, d.pid));
    KVH_STOP_DESTROY(&d);
    assert_no_violations();
}
END_TEST

START_TEST(driver_spelling_nvsmi_client_upper)
{
    fake_setup();
    kvh_daemon d;
    start_cuda(&d, CUDA_CONF "hbm.bytes=4MiB\nhbm.devices=1\n", "FAKECUDA_BUSID_FORMAT=nvsmi", NULL);
    struct gpu_hello upper = { .device = 0, .bus_id = BUS1, .vmm = true };
    expect_vmm_arena(&d, &upper);
    struct gpu_hello other = { .device = 1, .bus_id = BUS0, .vmm = true };
    expect_no_hbm(&d, &other, "bus id of the GPU without HBM");
    KVH_STOP_DESTROY(&d);
    assert_no_violations();
}
END_TEST

START_TEST(legacy_ipc_without_vmm)
{
    fake_setup();
    kvh_daemon d;
    start_cuda(&d, CUDA_CONF "hbm.bytes=4MiB\nhbm.devices=0\n", "FAKECUDA_NO_VMM=1", NULL);
    struct gpu_hello ipc = { .device = 0, .bus_id = BUS0, .ipc = true, .vmm = true };
    Kvnode__Response *r;
    const Kvnode__Arena *a = hello(&d, &ipc, &r);
    ck_assert_msg(a, "no HBM lent through legacy IPC");
    ck_assert(!a->cuda_vmm);
    ck_assert_int_eq(a->fd_index, -1);
    ck_assert_uint_eq(a->cuda_ipc_handle.len, 64);
    kvnode__response__free_unpacked(r, NULL);
    struct gpu_hello vmm_only = { .device = 0, .bus_id = BUS0, .vmm = true };
    expect_no_hbm(&d, &vmm_only, "client without a CUDA runtime for IPC");
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, "legacy CUDA IPC"), "log:\n%s", log ? log : "");
    free(log);
    KVH_STOP_DESTROY(&d);
    assert_no_violations();
}
END_TEST

START_TEST(hbm_unusable_counted_and_logged)
{
    fake_setup();
    kvh_daemon d;
    start_cuda(&d, CUDA_CONF "hbm.bytes=4MiB\nhbm.devices=1\n", NULL, NULL);
    struct gpu_hello g = { .device = 0, .bus_id = BUS1, .unusable = "cuMemMap: CUDA_ERROR_INVALID_VALUE (test)",
                           .name = "engine-unusable" };
    expect_no_hbm(&d, &g, "a client that reconnected host-only");
    g.unusable = "cuMemImportFromShareableHandle: CUDA_ERROR_UNKNOWN (again)";
    expect_no_hbm(&d, &g, "a client that reconnected host-only");
    json_t *st = kvh_stats(&d);
    ck_assert_msg(st, "%s", kvh_error());
    ck_assert_int_eq(jint(st, "gpu.hbm_unusable_clients"), 2);
    const char *last = jstr(st, "gpu.hbm_unusable_last");
    ck_assert_msg(strstr(last, "engine-unusable") && strstr(last, "(again)"), "hbm_unusable_last: %s", last);
    json_decref(st);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && count(log, "could not use the GPU memory lent to it") == 1,
                  "expected one log line within a minute:\n%s", log ? log : "");
    free(log);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(exclusive_process_gpu_left_out)
{
    fake_setup();
    kvh_daemon d;
    start_cuda(&d, CUDA_CONF "hbm.bytes=4MiB\n", "FAKECUDA_COMPUTE_MODE=3,0", NULL);
    json_t *st = kvh_stats(&d);
    ck_assert_msg(st, "%s", kvh_error());
    ck_assert_int_eq(jint(st, "gpu.hbm_arenas"), 1);
    json_decref(st);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, "GPU 0") && strstr(log, "EXCLUSIVE_PROCESS") &&
                  strstr(log, "engines could not share it"), "log:\n%s", log ? log : "");
    free(log);
    ck_assert_msg(!has_context(0, d.pid), "a context on the EXCLUSIVE_PROCESS GPU");
    ck_assert(has_context(1, d.pid));
    KVH_STOP_DESTROY(&d);
    assert_no_violations();
}
END_TEST

START_TEST(no_room_retried_then_required_fails)
{
    fake_setup();
    kvh_daemon d;
    const char *env[] = { ld_path, dir_env, "FAKECUDA_MEM_BYTES=4194304", NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_int_eq(kvh_spawn_ex(&d, CUDA_CONF "hbm.bytes=8MiB\nhbm.devices=0\nhbm.required=on\n"
                                  "hbm.alloc_retry=700ms\n", &o), 0);
    int stv = kvh_wait_exit(&d, 20000);
    char *log = kvh_read_log(&d);
    ck_assert_msg(stv > 0 && stv < KVH_EXIT_SIGNAL_BASE, "status %d; log:\n%s", stv, log ? log : "");
    ck_assert_msg(log && count(log, "trying again") >= 2 && strstr(log, "hbm.alloc_retry") &&
                  strstr(log, "hbm.required") && strstr(log, "OUT_OF_MEMORY"), "log:\n%s", log ? log : "");
    free(log);
    kvh_destroy(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon_cuda");
    TCase *tc = tcase_create("fake");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, no_hbm_no_context);
    tcase_add_test(tc, hbm_on_device_1_only);
    tcase_add_test(tc, driver_spelling_nvsmi_client_upper);
    tcase_add_test(tc, legacy_ipc_without_vmm);
    tcase_add_test(tc, hbm_unusable_counted_and_logged);
    tcase_add_test(tc, exclusive_process_gpu_left_out);
    tcase_add_test(tc, no_room_retried_then_required_fails);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
