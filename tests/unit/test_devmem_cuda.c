/* Unit tests of the devmem cuda backend (gpu/devmem_cuda.c over
 * gpu/cudadrv.c) through the strict fake CUDA library (tests/fakecuda): the
 * program re-executes itself with the fake's folder on LD_LIBRARY_PATH, so
 * the backend's dlopen("libcuda.so.1") finds the fake, and each test gets its
 * own FAKECUDA_DIR (set in the forked test process before its first CUDA
 * call: the fake reads its configuration at first use, so every test runs
 * in a process of its own even where CK_FORK=no). Facts the fake shares
 * are files there: ctx-<physical device>-<pid> for every context a process
 * created, violations for every rule broken, sticky-<physical device> to make
 * a device's contexts fail.
 *
 * - a VMM region is exported as a POSIX fd that another process imports,
 *   maps and reads byte-exact (what the daemon copied in on its stream);
 * - FAKECUDA_NO_VMM=1: a legacy region (no fd, a 64-byte IPC handle) that
 *   another process opens and reads byte-exact; a failed VMM export falls
 *   back to a legacy region too;
 * - open creates no context; a region, a stream and pinning on device 1
 *   create one on device 1 only; pinning without a pin device fails and
 *   creates none;
 * - compute mode 3 and 2 refused with a message naming the mode, before any
 *   context; the other device still serves;
 * - a MIG instance refused with a message;
 * - a sticky error marks the device down (devmem_device_down, with the
 *   error), later calls on it fail at once, the other device still works;
 *   the sim backend is never down;
 * - a driver older than 11.0 is refused with both versions named;
 * - no room on the device: -KVNODE_ENOMEM (what gpu.c retries).
 * No test may leave a violation in the fake's file. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/cudadrv.h"
#include "gpu/devmem.h"
#include "kvnode.h"
#include "../common/proc.h"
#include "../common/rmtree.h"
#include "../fakecuda/fakecuda_env.h"
#include "../fakecuda/fakecuda_check.h"

#define MiB (1024u * 1024u)

static char fake_dir[PATH_MAX];

/* --- the fake's environment ------------------------------------------------------ */

/* A fresh state folder for this test (fakecuda_setup: every other FAKECUDA_*
 * setting unset), with env (NULL-terminated "NAME=VALUE") set. */
static void fake_setup(const char *const *env)
{
    const char *tmp = getenv("TMPDIR");

    snprintf(fake_dir, sizeof fake_dir, "%s/kvnode-fakecuda-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(fake_dir));
    ck_assert_int_eq(fakecuda_setup(fake_dir), 0);
    for (size_t i = 0; env && env[i]; i++) {
        char name[64];
        const char *eq = strchr(env[i], '=');
        ck_assert_ptr_nonnull(eq);
        snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
        setenv(name, eq + 1, 1);
    }
}

static void fake_teardown(void)
{
    test_rmtree(fake_dir);
    fake_dir[0] = '\0';
}

static bool has_context(int physical, pid_t pid)
{
    return fakecuda_env_has_context(pid, physical) == 1;
}

static void assert_no_violations(void)
{
    int n = fakecuda_env_violations(NULL);
    if (n != 0) {
        char p[PATH_MAX + 32], text[4096] = "";
        snprintf(p, sizeof p, "%s/violations", fake_dir);
        FILE *f = fopen(p, "r");
        if (f) {
            text[fread(text, 1, sizeof text - 1, f)] = '\0';
            fclose(f);
        }
        ck_abort_msg("the fake recorded %d violation(s):\n%s", n, text);
    }
}

static void make_sticky(int physical)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/sticky-%d", fake_dir, physical);
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    ck_assert_int_ge(fd, 0);
    close(fd);
}

static struct devmem *open_cuda(void)
{
    struct devmem *dm = NULL;
    char why[512] = "";
    int rc = devmem_open(DEVMEM_CUDA, &dm, why, sizeof why);
    ck_assert_msg(rc == 0, "devmem_open(cuda) through the fake: %d %s", rc, why);
    ck_assert_int_eq(devmem_kind(dm), DEVMEM_CUDA);
    ck_assert_int_eq(devmem_device_count(dm), 2);
    return dm;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131u + seed * 7u + (i >> 12));
}

/* Copy a pattern into the region on a stream, as the copier does. */
static void write_pattern(struct devmem *dm, struct devmem_region *r, size_t n, unsigned seed)
{
    char why[512];
    uint8_t *src = malloc(n);
    struct devmem_stream *s = NULL;
    ck_assert_ptr_nonnull(src);
    fill(src, n, seed);
    ck_assert_msg(devmem_stream_create(dm, r->device, &s, why, sizeof why) == 0, "stream: %s", why);
    ck_assert_msg(devmem_copy_async(s, r->base, src, n, why, sizeof why) == 0, "copy: %s", why);
    ck_assert_msg(devmem_stream_wait(s, why, sizeof why) == 0, "wait: %s", why);
    devmem_stream_destroy(s);
    free(src);
}

static void check_pattern(struct devmem *dm, struct devmem_region *r, size_t n, unsigned seed)
{
    char why[512];
    uint8_t *want = malloc(n), *got = malloc(n);
    ck_assert(want && got);
    fill(want, n, seed);
    memset(got, 0, n);
    ck_assert_msg(devmem_copy_to_host(dm, r->device, got, r->base, n, why, sizeof why) == 0, "copy out: %s", why);
    ck_assert_msg(memcmp(want, got, n) == 0, "the region does not hold what was copied in");
    free(want);
    free(got);
}

/* --- the other process: an engine importing what the daemon lends ---------------- */

static int child_fail(const char *what, const struct cudadrv *a, CUresult e)
{
    char ebuf[128];
    fprintf(stderr, "importer: %s: %s\n", what, a ? cudadrv_error(a, e, ebuf, sizeof ebuf) : "");
    return 1;
}

static int child_verify(const struct cudadrv *a, CUdeviceptr p, size_t n, unsigned seed)
{
    uint8_t *want = malloc(n), *got = malloc(n);
    CUresult e;
    if (!want || !got)
        return child_fail("out of memory", NULL, 0);
    fill(want, n, seed);
    if ((e = a->cuMemcpyDtoH(got, p, n)) != CUDA_SUCCESS)
        return child_fail("cuMemcpyDtoH", a, e);
    if (memcmp(want, got, n) != 0)
        return child_fail("the bytes read differ from those the daemon wrote", NULL, 0);
    free(want);
    free(got);
    return 0;
}

static int child_context(struct cudadrv *a, int device)
{
    char why[512];
    CUdevice dev;
    CUcontext ctx;
    CUresult e;
    if (cudadrv_load(a, NULL, why, sizeof why) < 0) {
        fprintf(stderr, "importer: %s\n", why);
        return 1;
    }
    if ((e = a->cuDeviceGet(&dev, device)) != CUDA_SUCCESS)
        return child_fail("cuDeviceGet", a, e);
    if ((e = a->cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS)
        return child_fail("cuDevicePrimaryCtxRetain", a, e);
    if ((e = a->cuCtxSetCurrent(ctx)) != CUDA_SUCCESS)
        return child_fail("cuCtxSetCurrent", a, e);
    return 0;
}

/* argv: --import-vmm DEVICE SIZE SEED; the handle's fd is 3. */
static int child_import_vmm(char **argv)
{
    struct cudadrv a;
    int device = atoi(argv[2]);
    size_t size = strtoull(argv[3], NULL, 10), gran = 0;
    unsigned seed = (unsigned)atoi(argv[4]);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CUresult e;

    if (child_context(&a, device) != 0)
        return 1;
    if (!a.has_vmm)
        return child_fail("the driver has no VMM calls", NULL, 0);
    if ((e = a.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)3, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) !=
        CUDA_SUCCESS)
        return child_fail("cuMemImportFromShareableHandle", &a, e);
    CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                 .location = { CU_MEM_LOCATION_TYPE_DEVICE, device } };
    if ((e = a.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) != CUDA_SUCCESS)
        return child_fail("cuMemGetAllocationGranularity", &a, e);
    if (gran == 0 || size % gran != 0)
        return child_fail("the lent size is not a multiple of the granularity", NULL, 0);
    if ((e = a.cuMemAddressReserve(&va, size, gran, 0, 0)) != CUDA_SUCCESS)
        return child_fail("cuMemAddressReserve", &a, e);
    if ((e = a.cuMemMap(va, size, 0, h, 0)) != CUDA_SUCCESS)
        return child_fail("cuMemMap", &a, e);
    CUmemAccessDesc acc = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, device },
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    if ((e = a.cuMemSetAccess(va, size, &acc, 1)) != CUDA_SUCCESS)
        return child_fail("cuMemSetAccess", &a, e);
    if (child_verify(&a, va, size, seed) != 0)
        return 1;
    a.cuMemUnmap(va, size);
    a.cuMemAddressFree(va, size);
    a.cuMemRelease(h);
    return 0;
}

/* argv: --import-ipc DEVICE SIZE SEED HEX(handle). */
static int child_import_ipc(char **argv)
{
    struct cudadrv a;
    int device = atoi(argv[2]);
    size_t size = strtoull(argv[3], NULL, 10);
    unsigned seed = (unsigned)atoi(argv[4]);
    CUipcMemHandle h;
    CUdeviceptr p;
    CUresult e;

    if (strlen(argv[5]) != 2 * sizeof h)
        return child_fail("bad handle argument", NULL, 0);
    for (size_t i = 0; i < sizeof h; i++) {
        unsigned v;
        sscanf(argv[5] + 2 * i, "%2x", &v);
        h.reserved[i] = (char)v;
    }
    if (child_context(&a, device) != 0)
        return 1;
    CUresult (*open_ipc)(CUdeviceptr *, CUipcMemHandle, unsigned) =
        (CUresult (*)(CUdeviceptr *, CUipcMemHandle, unsigned))dlsym(a.lib, "cuIpcOpenMemHandle_v2");
    CUresult (*close_ipc)(CUdeviceptr) = (CUresult (*)(CUdeviceptr))dlsym(a.lib, "cuIpcCloseMemHandle");
    if (!open_ipc || !close_ipc)
        return child_fail("no cuIpcOpenMemHandle_v2 / cuIpcCloseMemHandle", NULL, 0);
    if ((e = open_ipc(&p, h, 1)) != CUDA_SUCCESS)
        return child_fail("cuIpcOpenMemHandle_v2", &a, e);
    if (child_verify(&a, p, size, seed) != 0)
        return 1;
    close_ipc(p);
    return 0;
}

/* This program (the link's target: under valgrind /proc/self/exe is valgrind's tool). */
static const char *self_path(void)
{
    static char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert_int_gt(n, 0);
    exe[n] = '\0';
    return exe;
}

static void run_importer(const char **argv, int pass_fd)
{
    argv[0] = self_path();
    struct proc_opts o = { .argv = argv, .pass_fd = pass_fd, .pass_count = pass_fd >= 0 ? 1 : 0 };
    char *err = NULL;
    int st = proc_run(&o, 20000, NULL, &err);
    ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the importing process failed (status %d): %s",
                  st, err ? err : proc_error());
    free(err);
}

/* --- tests ------------------------------------------------------------------------ */

START_TEST(vmm_region_is_an_fd_another_process_imports)
{
    fake_setup(NULL);
    struct devmem *dm = open_cuda();
    struct devmem_region r;
    char why[512];
    const uint64_t asked = 3 * MiB + 5;
    int rc = devmem_region_alloc(dm, 1, asked, &r, why, sizeof why);
    ck_assert_msg(rc == 0, "region_alloc: %d %s", rc, why);
    ck_assert(r.vmm);
    ck_assert_int_ge(r.fd, 0);
    ck_assert_uint_eq(r.ipc_len, 0);
    ck_assert(!r.host_access);
    ck_assert_uint_ge(r.size, asked);
    ck_assert_str_eq(r.pci_bus_id, "0000:5E:00.0");
    write_pattern(dm, &r, (size_t)r.size, 11);
    check_pattern(dm, &r, (size_t)r.size, 11);

    char size[32];
    snprintf(size, sizeof size, "%llu", (unsigned long long)r.size);
    const char *argv[] = { NULL, "--import-vmm", "1", size, "11", NULL };
    run_importer(argv, r.fd);

    devmem_region_free(dm, &r);
    ck_assert_int_eq(r.fd, -1);
    devmem_close(dm);
    assert_no_violations();
    fake_teardown();
}
END_TEST

START_TEST(legacy_ipc_without_vmm)
{
    const char *env[] = { "FAKECUDA_NO_VMM=1", NULL };
    fake_setup(env);
    struct devmem *dm = open_cuda();
    struct devmem_region r;
    char why[512];
    const uint64_t n = 2 * MiB;
    int rc = devmem_region_alloc(dm, 0, n, &r, why, sizeof why);
    ck_assert_msg(rc == 0, "region_alloc: %d %s", rc, why);
    ck_assert(!r.vmm);
    ck_assert_int_eq(r.fd, -1);
    ck_assert_uint_eq(r.ipc_len, DEVMEM_IPC_HANDLE_BYTES);
    ck_assert_uint_eq(r.size, n);
    write_pattern(dm, &r, n, 5);
    check_pattern(dm, &r, n, 5);

    char size[32], hex[2 * DEVMEM_IPC_HANDLE_BYTES + 1];
    snprintf(size, sizeof size, "%llu", (unsigned long long)n);
    for (size_t i = 0; i < DEVMEM_IPC_HANDLE_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", r.ipc_handle[i]);
    const char *argv[] = { NULL, "--import-ipc", "0", size, "5", hex, NULL };
    run_importer(argv, -1);

    devmem_region_free(dm, &r);
    devmem_close(dm);
    assert_no_violations();
    fake_teardown();
}
END_TEST

/* A device that says it has VMM but whose export fails still serves, through legacy IPC. */
START_TEST(vmm_failure_falls_back_to_legacy)
{
    const char *env[] = { "FAKECUDA_FAIL=cuMemExportToShareableHandle", NULL };
    fake_setup(env);
    struct devmem *dm = open_cuda();
    struct devmem_region r;
    char why[512];
    int rc = devmem_region_alloc(dm, 0, 2 * MiB, &r, why, sizeof why);
    ck_assert_msg(rc == 0, "region_alloc: %d %s", rc, why);
    ck_assert(!r.vmm);
    ck_assert_int_eq(r.fd, -1);
    ck_assert_uint_eq(r.ipc_len, DEVMEM_IPC_HANDLE_BYTES);
    write_pattern(dm, &r, 2 * MiB, 4);
    check_pattern(dm, &r, 2 * MiB, 4);
    devmem_region_free(dm, &r);
    devmem_close(dm);
    assert_no_violations();
    fake_teardown();
}
END_TEST

START_TEST(contexts_only_where_there_is_work)
{
    fake_setup(NULL);
    pid_t me = getpid();
    struct devmem *dm = open_cuda();
    char why[512];
    ck_assert_msg(!has_context(0, me) && !has_context(1, me), "devmem_open created a context");

    /* Pinning before a device is chosen fails and takes no context. */
    size_t n = 2 * MiB;
    void *host = aligned_alloc(4096, n);
    ck_assert_ptr_nonnull(host);
    ck_assert_int_lt(devmem_host_register(dm, host, n, why, sizeof why), 0);
    ck_assert_msg(strstr(why, "no GPU chosen"), "why: %s", why);
    ck_assert(!has_context(0, me) && !has_context(1, me));

    struct devmem_region r;
    ck_assert_msg(devmem_region_alloc(dm, 1, 2 * MiB, &r, why, sizeof why) == 0, "%s", why);
    ck_assert_int_eq(devmem_set_pin_device(dm, 1, why, sizeof why), 0);
    ck_assert_msg(devmem_host_register(dm, host, n, why, sizeof why) == 0, "host_register: %s", why);
    write_pattern(dm, &r, 2 * MiB, 3);
    check_pattern(dm, &r, 2 * MiB, 3);
    ck_assert_msg(has_context(1, me), "no context on the device given work");
    ck_assert_msg(!has_context(0, me), "a context on device 0, which was given no work");

    devmem_host_unregister(dm, host);
    devmem_region_free(dm, &r);
    devmem_close(dm);
    free(host);
    ck_assert(!has_context(0, me));
    assert_no_violations();
    fake_teardown();
}
END_TEST

static void refused_mode(const char *modes, int refused, const char *word)
{
    char env0[64];
    snprintf(env0, sizeof env0, "FAKECUDA_COMPUTE_MODE=%s", modes);
    const char *env[] = { env0, NULL };
    fake_setup(env);
    pid_t me = getpid();
    struct devmem *dm = open_cuda();
    struct devmem_region r;
    char why[512] = "", gpu[16];
    int rc = devmem_region_alloc(dm, refused, 2 * MiB, &r, why, sizeof why);
    ck_assert_int_eq(rc, -KVNODE_EDENIED);
    snprintf(gpu, sizeof gpu, "GPU %d", refused);
    ck_assert_msg(strstr(why, gpu) && strstr(why, word) && strstr(why, "HBM off"), "why: %s", why);
    ck_assert_int_lt(devmem_set_pin_device(dm, refused, why, sizeof why), 0);
    ck_assert_msg(!has_context(refused, me), "a context on the refused device");
    /* The other device serves. */
    ck_assert_msg(devmem_region_alloc(dm, 1 - refused, 2 * MiB, &r, why, sizeof why) == 0, "%s", why);
    devmem_region_free(dm, &r);
    devmem_close(dm);
    ck_assert(!has_context(refused, me));
    assert_no_violations();
    fake_teardown();
}

START_TEST(exclusive_process_refused)
{
    refused_mode("0,3", 1, "EXCLUSIVE_PROCESS");
}
END_TEST

START_TEST(prohibited_refused)
{
    refused_mode("2,0", 0, "PROHIBITED");
}
END_TEST

START_TEST(mig_instance_refused)
{
    const char *env[] = { "FAKECUDA_MIG=1,0", NULL };
    fake_setup(env);
    pid_t me = getpid();
    struct devmem *dm = open_cuda();
    struct devmem_region r;
    char why[512] = "";
    ck_assert_int_eq(devmem_region_alloc(dm, 0, 2 * MiB, &r, why, sizeof why), -KVNODE_EDENIED);
    ck_assert_msg(strstr(why, "GPU 0") && strstr(why, "MIG") && strstr(why, "HBM off"), "why: %s", why);
    ck_assert(!has_context(0, me));
    ck_assert_msg(devmem_region_alloc(dm, 1, 2 * MiB, &r, why, sizeof why) == 0, "%s", why);
    devmem_region_free(dm, &r);
    devmem_close(dm);
    assert_no_violations();
    fake_teardown();
}
END_TEST

START_TEST(sticky_error_marks_the_device_down)
{
    fake_setup(NULL);
    struct devmem *dm = open_cuda();
    struct devmem_region r0, r1;
    char why[512] = "";
    ck_assert_msg(devmem_region_alloc(dm, 0, 2 * MiB, &r0, why, sizeof why) == 0, "%s", why);
    ck_assert_msg(devmem_region_alloc(dm, 1, 2 * MiB, &r1, why, sizeof why) == 0, "%s", why);
    ck_assert(!devmem_device_down(dm, 0, why, sizeof why));
    ck_assert(!devmem_device_down(dm, 1, why, sizeof why));
    ck_assert(!devmem_device_down(dm, 7, why, sizeof why));

    make_sticky(0);
    uint8_t buf[4096];
    struct devmem_stream *s = NULL;
    ck_assert_msg(devmem_stream_create(dm, 0, &s, why, sizeof why) < 0 ||
                  devmem_copy_async(s, buf, r0.base, sizeof buf, why, sizeof why) < 0 ||
                  devmem_stream_wait(s, why, sizeof why) < 0, "a copy on a device with a sticky error succeeded");
    devmem_stream_destroy(s);
    char down[512] = "";
    ck_assert_msg(devmem_device_down(dm, 0, down, sizeof down), "device 0 not down after: %s", why);
    ck_assert_msg(strstr(down, "ILLEGAL_ADDRESS") || strstr(down, "700"), "down why: %s", down);
    /* Later calls fail at once, saying so; device 1 goes on. */
    ck_assert_int_lt(devmem_copy_to_host(dm, 0, buf, r0.base, sizeof buf, why, sizeof why), 0);
    ck_assert_msg(strstr(why, "down"), "why: %s", why);
    ck_assert_int_lt(devmem_stream_create(dm, 0, &s, why, sizeof why), 0);
    ck_assert(!devmem_device_down(dm, 1, why, sizeof why));
    write_pattern(dm, &r1, 2 * MiB, 9);
    check_pattern(dm, &r1, 2 * MiB, 9);
    devmem_region_free(dm, &r0);
    devmem_region_free(dm, &r1);
    devmem_close(dm);
    fake_teardown();

    struct devmem *sim = NULL;
    ck_assert_int_eq(devmem_open(DEVMEM_SIM, &sim, why, sizeof why), 0);
    ck_assert(!devmem_device_down(sim, 0, why, sizeof why));
    devmem_close(sim);
}
END_TEST

START_TEST(driver_too_old_is_named)
{
    const char *env[] = { "FAKECUDA_DRIVER_VERSION=10010", NULL };
    fake_setup(env);
    struct devmem *dm = NULL;
    char why[512] = "";
    ck_assert_int_eq(devmem_open(DEVMEM_CUDA, &dm, why, sizeof why), -KVNODE_EIO);
    ck_assert_ptr_null(dm);
    ck_assert_msg(strstr(why, "10.1") && strstr(why, "11.0") && strstr(why, "driver"), "why: %s", why);
    ck_assert(!has_context(0, getpid()) && !has_context(1, getpid()));
    fake_teardown();
}
END_TEST

START_TEST(no_room_is_enomem)
{
    const char *env[] = { "FAKECUDA_MEM_BYTES=8388608", NULL };
    fake_setup(env);
    struct devmem *dm = open_cuda();
    struct devmem_region r;
    char why[512] = "";
    ck_assert_int_eq(devmem_region_alloc(dm, 0, 16 * MiB, &r, why, sizeof why), -KVNODE_ENOMEM);
    ck_assert_msg(strstr(why, "OUT_OF_MEMORY") || strstr(why, "out of memory"), "why: %s", why);
    ck_assert_ptr_null(r.base);
    ck_assert_int_eq(r.fd, -1);
    devmem_close(dm);
    assert_no_violations();
    fake_teardown();
}
END_TEST

int main(int argc, char **argv)
{
    if (fakecuda_reexec(argc, argv) < 0) {
        fprintf(stderr, "test_devmem_cuda: cannot re-execute with the fake CUDA library on LD_LIBRARY_PATH\n");
        return EXIT_FAILURE;
    }
    if (argc >= 5 && strcmp(argv[1], "--import-vmm") == 0)
        return child_import_vmm(argv);
    if (argc >= 6 && strcmp(argv[1], "--import-ipc") == 0)
        return child_import_ipc(argv);

    Suite *s = suite_create("devmem_cuda");
    TCase *tc = tcase_create("fake");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, vmm_region_is_an_fd_another_process_imports);
    tcase_add_test(tc, legacy_ipc_without_vmm);
    tcase_add_test(tc, vmm_failure_falls_back_to_legacy);
    tcase_add_test(tc, contexts_only_where_there_is_work);
    tcase_add_test(tc, exclusive_process_refused);
    tcase_add_test(tc, prohibited_refused);
    tcase_add_test(tc, mig_instance_refused);
    tcase_add_test(tc, sticky_error_marks_the_device_down);
    tcase_add_test(tc, driver_too_old_is_named);
    tcase_add_test(tc, no_room_is_enomem);
    suite_add_tcase(s, tc);
    return fakecuda_run_suite(s);
}
