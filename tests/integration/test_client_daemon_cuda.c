/* Integration: libkvnode against kvnoded with hbm.backend = cuda, both
 * running on the strict fake CUDA (tests/fakecuda) with one state folder, so
 * that the daemon's GPU memory is the memory the client maps. The test
 * process is the engine: libkvnode finds the fake through this program's
 * RPATH, and the test's own CUDA calls go to the same object. What is
 * proven (issue 28, the client's side with the real daemon):
 *   - the HBM arena comes as a VMM fd and is mapped on the client's device:
 *     a put to the HBM tier written with cudaMemcpyAsync and committed with
 *     kvnode_put_commit_stream is read back byte-exact by get_batch(DEVICE)
 *     and by the daemon itself (get_inline);
 *   - an engine in another PID namespace against a daemon that can only
 *     lend legacy IPC connects host-only, and the daemon counts it
 *     (gpu.hbm_unusable_clients) with the reason;
 *   - the same engine is served the GPU memory when the daemon lends VMM;
 *   - a daemon stopping under an idle engine (legacy IPC and VMM): the
 *     engine's libkvnode lets the memory go on the GoingAway and closes, so
 *     the stop ends without waiting hbm.release_timeout, frees nothing still
 *     mapped, and the engine's next call says "daemon stopping".
 * Every test ends with the fake's violation log empty (but for the one
 * refusal a real driver returns to the container engine). */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda_daemon.h"
#include "harness.h"
#include "../common/rmtree.h"
#include "../fakecuda/fakecuda_env.h"
#include "../fakecuda/fakecuda_check.h"

#define CUDA_CONF "memory.host_bytes=4MiB\nmemory.slab_bytes=256KiB\nhbm.backend=cuda\n" \
                  "hbm.bytes=4MiB\nhbm.devices=0\n"
#define BB 16384u

static char fake_dir[PATH_MAX];
static char ld_path[2 * PATH_MAX + 32], dir_env[PATH_MAX + 32];

static struct {
    int (*cudaMalloc)(void **, size_t);
    int (*cudaFree)(void *);
    int (*cudaMemset)(void *, int, size_t);
    int (*cudaMemcpyAsync)(void *, const void *, size_t, int, void *);
    int (*cudaStreamCreateWithFlags)(void **, unsigned);
    int (*cudaStreamSynchronize)(void *);
    int (*cudaStreamDestroy)(void *);
    int (*cudaDeviceSynchronize)(void);
} cu;

/* The fake for this process (RPATH) and the environment entries that point
 * a daemon at it (fakecuda_daemon.h). */
static void fake_setup(void)
{
    void *h;

    fakecuda_daemon_env(fake_dir, ld_path, dir_env);
    ck_assert_int_eq(fakecuda_setup(fake_dir), 0);
    ck_assert_int_eq(setenv("FAKECUDA_COPY_DELAY_MS", "100", 1), 0);
    h = dlopen("libcudart.so", RTLD_NOW | RTLD_GLOBAL);
    ck_assert_msg(h, "the fake CUDA is not where this test's RPATH says: %s", dlerror());
#define SYM(name) do { *(void **)&cu.name = dlsym(h, #name); ck_assert_ptr_nonnull(cu.name); } while (0)
    SYM(cudaMalloc); SYM(cudaFree); SYM(cudaMemset); SYM(cudaMemcpyAsync);
    SYM(cudaStreamCreateWithFlags); SYM(cudaStreamSynchronize); SYM(cudaStreamDestroy);
    SYM(cudaDeviceSynchronize);
#undef SYM
}

static void start_cuda(kvh_daemon *d, const char *conf, const char *e1)
{
    /* The daemon is in this test's PID namespace unless e1 says otherwise. */
    const char *env[] = { ld_path, dir_env, "FAKECUDA_PIDNS=", "FAKECUDA_COPY_DELAY_MS=100", e1,
                          NULL };
    kvh_spawn_opts o = { .env = env };
    ck_assert_msg(kvh_start_ex(d, conf, &o) == 0, "start: %s", kvh_error());
}

/* Each line of the fake's violation log must name `allowed` (NULL: none). */
static int violations_only(const char *allowed)
{
    char p[PATH_MAX + 32], line[512];
    int n = 0;
    FILE *f;

    snprintf(p, sizeof p, "%s/violations", fake_dir);
    if (!(f = fopen(p, "r")))
        return 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        ck_assert_msg(allowed && strstr(line, allowed), "the fake recorded: %s", line);
    }
    fclose(f);
    return n;
}

static kvnode_client *connect_gpu(const kvh_daemon *d, const kvnode_layout *l)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect_device(d->sock, l, 0, &c);

    ck_assert_msg(rc == 0, "connect: %s", kvnode_connect_error());
    return c;
}

/* connect_gpu, with the GPU's memory served (no error kept). */
static kvnode_client *connect_served(const kvh_daemon *d, const kvnode_layout *l)
{
    kvnode_client *c = connect_gpu(d, l);

    ck_assert_str_eq(kvnode_last_error(c), "");
    return c;
}

/* A put of key asking for the GPU tier lands in tier want (aborted). */
static void expect_hbm_put_in(kvnode_client *c, kvnode_key key, int want)
{
    kvnode_key k[1] = {key};
    kvnode_loc loc[1];
    kvnode_lease lease;

    ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    ck_assert_int_eq(loc[0].tier, want);
    ck_assert_int_eq(kvnode_put_abort(c, lease), 0);
}

START_TEST(vmm_put_commit_stream_and_get_batch_device)
{
    kvnode_layout l = kvh_layout("cuda-client", BB, 1, 0);
    kvnode_key k[2] = {501, 502};
    kvnode_loc loc[2];
    kvnode_lease lease;
    uint8_t src[2][BB], buf[BB], *d;
    void *s, *dst[2], *in[1] = {buf};
    size_t got = 0;
    kvnode_tiers t;
    kvnode_client *c;
    kvh_daemon dm;

    fake_setup();
    start_cuda(&dm, CUDA_CONF, NULL);
    c = connect_served(&dm, &l);
    ck_assert_int_eq(kvnode_put_begin(c, k, 2, KVNODE_TIER_HBM, &lease, loc), 0);
    ck_assert_int_eq(cu.cudaStreamCreateWithFlags(&s, 1), 0);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(loc[i].tier, KVNODE_TIER_HBM);
        kvh_fill(src[i], BB, k[i], 7);
        ck_assert_int_eq(cu.cudaMemcpyAsync(loc[i].ptr, src[i], BB, 4, s), 0);
    }
    ck_assert_int_eq(kvnode_put_commit_stream(c, lease, s), 0);
    /* stored in the GPU tier; copied to host memory (device to host) */
    ck_assert_int_eq(kvnode_match_tiers(c, k, 2, &t), 0);
    ck_assert_uint_eq(t.hbm, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(kvnode_get(c, &k[i], 1, in, &got), 0);
        ck_assert_uint_eq(got, 1);
        ck_assert_msg(kvh_verify(buf, BB, k[i], 7) == 0, "block %d stale", i);
    }
    /* the engine's: device to device, complete on return */
    ck_assert_int_eq(cu.cudaMalloc((void **)&d, 2 * BB), 0);
    ck_assert_int_eq(cu.cudaMemset(d, 0, 2 * BB), 0);
    ck_assert_int_eq(cu.cudaDeviceSynchronize(), 0);
    dst[0] = d;
    dst[1] = d + BB;
    ck_assert_int_eq(kvnode_get_batch(c, k, 2, dst, KVNODE_BATCH_DEVICE, &got), 0);
    ck_assert_uint_eq(got, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(cu.cudaMemcpyAsync(buf, dst[i], BB, 4, s), 0);
        ck_assert_int_eq(cu.cudaStreamSynchronize(s), 0);
        ck_assert_msg(kvh_verify(buf, BB, k[i], 7) == 0, "dst block %d stale", i);
    }
    ck_assert_int_eq(cu.cudaFree(d), 0);
    ck_assert_int_eq(cu.cudaStreamDestroy(s), 0);
    kvnode_close(c);
    KVH_STOP_DESTROY(&dm);
    ck_assert_int_eq(violations_only(NULL), 0);
    test_rmtree(fake_dir);
}
END_TEST

/* An engine in a container: legacy IPC cannot reach it (host-only, counted
 * by the daemon with the reason); VMM can. */
START_TEST(container_engine_ipc_host_only_vmm_served)
{
    kvnode_layout l = kvh_layout("cuda-container", BB, 1, 0);
    kvnode_key k[1] = {601};
    size_t got = 0;
    kvnode_client *c;
    kvh_daemon dm;
    json_t *st;
    const char *e;

    fake_setup();
    ck_assert_int_eq(setenv("FAKECUDA_PIDNS", "engine-container", 1), 0);
    start_cuda(&dm, CUDA_CONF, "FAKECUDA_NO_VMM=1");
    c = connect_gpu(&dm, &l);
    e = kvnode_last_error(c);
    ck_assert_msg(strstr(e, "HBM unusable (") == e && strstr(e, "cudaIpcOpenMemHandle") &&
                  strstr(e, "; connected host-only"), "last error: %s", e);
    ck_assert_int_eq(kvh_put(c, k, 1, 3), 0);
    ck_assert_int_eq(kvh_get_verify(c, k, 1, 3, 0, &got), 0);
    ck_assert_uint_eq(got, 1);
    /* a put to the GPU tier lands in host memory */
    expect_hbm_put_in(c, 603, KVNODE_TIER_HOST);
    st = kvh_stats(&dm);
    ck_assert_msg(st, "%s", kvh_error());
    ck_assert_int_eq(kvh_json_int(st, "gpu.hbm_unusable_clients"), 1);
    ck_assert_msg(strstr(json_string_value(kvh_json_get(st, "gpu.hbm_unusable_last")),
                         "cudaIpcOpenMemHandle"), "hbm_unusable_last: %s",
                  json_string_value(kvh_json_get(st, "gpu.hbm_unusable_last")));
    json_decref(st);
    kvnode_close(c);
    KVH_STOP_DESTROY(&dm);
    ck_assert_int_eq(violations_only("rule=ipc-pidns"), 1);

    /* the daemon lends VMM: the same engine is served */
    start_cuda(&dm, CUDA_CONF, NULL);
    c = connect_served(&dm, &l);
    expect_hbm_put_in(c, 602, KVNODE_TIER_HBM);
    kvnode_close(c);
    KVH_STOP_DESTROY(&dm);
    ck_assert_int_eq(violations_only("rule=ipc-pidns"), 1);
    test_rmtree(fake_dir);
}
END_TEST

/* A daemon that stops while an idle engine maps its GPU memory: its notice
 * (GoingAway) makes the engine's libkvnode let the memory go and close, so
 * the daemon stops at once, frees nothing still mapped (legacy IPC: no
 * free-while-mapped; VMM: the device's memory all back), and the engine's
 * next call fails with ESHUTDOWN, "daemon stopping". */
START_TEST(stop_under_an_idle_engine)
{
    kvnode_layout l = kvh_layout("cuda-stop", BB, 1, 0);
    kvnode_key k[1] = {701};
    kvnode_loc loc[1];
    kvnode_lease lease;
    kvnode_client *c;
    kvh_daemon dm;
    size_t matched;
    char *log;
    int rc;

    fake_setup();
    start_cuda(&dm, CUDA_CONF "hbm.release_timeout=60s\n", _i == 0 ? "FAKECUDA_NO_VMM=1" : NULL);
    c = connect_served(&dm, &l);
    ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HBM);
    ck_assert_int_eq(kvnode_put_commit(c, lease), 0);
    /* the engine does nothing now; the stop must not wait for release_timeout */
    ck_assert_int_eq(kvh_stop(&dm, 30000), 0);
    log = kvh_read_log(&dm);
    ck_assert_msg(log && strstr(log, "every client lent it (1) had closed its connection"),
                  "log:\n%s", log ? log : "");
    free(log);
    ck_assert_int_eq(violations_only(NULL), 0);
    rc = kvnode_match(c, k, 1, &matched);
    ck_assert_msg(rc == -KVNODE_ESHUTDOWN || rc == -KVNODE_ECLOSED, "match: %d", rc);
    ck_assert_msg(strstr(kvnode_last_error(c), "daemon stopping") != NULL, "error: %s",
                  kvnode_last_error(c));
    kvnode_close(c);
    kvh_destroy(&dm);
    ck_assert_int_eq(violations_only(NULL), 0);
    test_rmtree(fake_dir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("client_daemon_cuda");
    TCase *tc = tcase_create("fakecuda");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, vmm_put_commit_stream_and_get_batch_device);
    tcase_add_test(tc, container_engine_ipc_host_only_vmm_served);
    tcase_add_loop_test(tc, stop_under_an_idle_engine, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fakecuda_run_suite(suite());
}
