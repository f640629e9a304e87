/* The strict fake CUDA's own tests (tests/fakecuda/, issue 28 part A): every
 * rule it enforces, through its real entry points, with a second process
 * where the rule is about two.
 *
 * Each test body runs in a process of its own (forked here, whatever
 * CK_FORK says) with a fresh state folder, because the fake reads its
 * environment once per process; CHECK failures print and exit that process.
 * A fork child of a process that used the fake starts as a new process
 * would (no contexts, no allocations) and reads the environment again, which
 * is how a child here gets another FAKECUDA_PIDNS. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda.h"
#include "fakecuda_env.h"
#include "fakecuda_internal.h"
#include "../common/rmtree.h"

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d (pid %d): CHECK failed: %s\n", __FILE__, __LINE__, \
                    (int)getpid(), #cond);                                          \
            _exit(1);                                                               \
        }                                                                           \
    } while (0)

#define CHECK_EQ(a, b)                                                                      \
    do {                                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                                 \
        if (a_ != b_) {                                                                     \
            fprintf(stderr, "%s:%d (pid %d): %s is %lld, expected %lld\n", __FILE__, __LINE__, \
                    (int)getpid(), #a, a_, b_);                                             \
            _exit(1);                                                                       \
        }                                                                                   \
    } while (0)

#define MIB (1024ull * 1024ull)
#define KIND_H2D 1
#define KIND_D2H 2
#define KIND_D2D 3

static char g_dir[64];

/* Runs body in a child process with a fresh FAKECUDA_DIR; the test fails
 * unless it exits 0. */
static void run_isolated(void (*body)(void))
{
    int status = 0;
    pid_t pid;

    snprintf(g_dir, sizeof g_dir, "/tmp/fakecuda-test.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    fflush(NULL);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (fakecuda_setup(g_dir) != 0)
            _exit(2);
        body();
        exit(0);    /* exit, not _exit: leak checkers run on the body too */
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        setenv("FAKECUDA_DIR", g_dir, 1);
        fakecuda_env_print_violations(stderr);
        unsetenv("FAKECUDA_DIR");
    }
    test_rmtree(g_dir);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "test body failed (status %#x)", status);
}

/* A second process: fn runs in a fork child, which exits 0 when fn returns. */
static pid_t spawn(void (*fn)(int rd, int wr), int pipes[4])
{
    pid_t pid;

    CHECK(pipe(pipes) == 0 && pipe(pipes + 2) == 0);
    fflush(NULL);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(pipes[1]);
        close(pipes[2]);
        fn(pipes[0], pipes[3]);
        /* _exit: LeakSanitizer in a fork child of a process with threads
         * only warns about threads that are not there. */
        fflush(NULL);
        _exit(0);
    }
    close(pipes[0]);
    close(pipes[3]);
    return pid;
}

static void send_byte(int fd, char c)
{
    CHECK(write(fd, &c, 1) == 1);
}

static char recv_byte(int fd)
{
    char c = 0;

    CHECK(read(fd, &c, 1) == 1);
    return c;
}

static void reap(pid_t pid)
{
    int status = 0;

    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- configuration ------------------------------------------------------------ */

static void child_no_vmm(int rd, int wr)
{
    int v = -1;

    (void)rd, (void)wr;
    setenv("FAKECUDA_NO_VMM", "1", 1);
    /* The driver half alone wants cuInit first. */
    CHECK_EQ(cuDeviceGetAttribute(&v, 102, 0), 3);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDeviceGetAttribute(&v, 102, 0), 0);
    CHECK_EQ(v, 0);
    CHECK_EQ(cuDeviceGetAttribute(&v, 103, 0), 0);
    CHECK_EQ(v, 0);
}

/* A bad value is refused (with a message): no devices, not a guess. */
static void child_bad_env(int rd, int wr)
{
    static const char *const bad[][2] = {
        { "FAKECUDA_COMPUTE_MODE", "0,7" }, { "FAKECUDA_DEVICES", "0000:3B:00.0,zz" },
        { "FAKECUDA_BUSID_FORMAT", "mixed" }, { "FAKECUDA_MEM_BYTES", "1G" },
        { "FAKECUDA_COPY_DELAY_MS", "-5" }, { "FAKECUDA_MIG", "0,0,1" },
    };
    int n = -1, status;
    size_t i;

    (void)rd, (void)wr;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pid_t pid;

        fflush(NULL);
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            setenv(bad[i][0], bad[i][1], 1);
            CHECK_EQ(cudaGetDeviceCount(&n), 100);
            fflush(NULL);
            _exit(0);
        }
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

static void body_environment(void)
{
    char bus[32], name[96];
    int n = -1, v = -1, pipes[4];

    setenv("FAKECUDA_DEVICES", "0000:3b:00.0,0000:5e:00.0,0000:af:00.0", 1);
    setenv("CUDA_VISIBLE_DEVICES", "2,0", 1);
    setenv("FAKECUDA_BUSID_FORMAT", "nvsmi", 1);
    setenv("FAKECUDA_COMPUTE_MODE", "0,0,3", 1);
    setenv("FAKECUDA_MIG", "0,0,1", 1);
    setenv("FAKECUDA_DRIVER_VERSION", "12040", 1);
    CHECK_EQ(cudaGetDeviceCount(&n), 0);
    CHECK_EQ(n, 2);
    CHECK_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, 0), 0);
    CHECK(strcmp(bus, "00000000:AF:00.0") == 0);
    CHECK_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, 1), 0);
    CHECK(strcmp(bus, "00000000:3B:00.0") == 0);
    CHECK_EQ(cudaDeviceGetAttribute(&v, 20, 0), 0);
    CHECK_EQ(v, 3);
    CHECK_EQ(cudaDeviceGetAttribute(&v, 20, 1), 0);
    CHECK_EQ(v, 0);
    CHECK_EQ(cudaDeviceGetAttribute(&v, 33, 0), 0);
    CHECK_EQ(v, 0xAF);
    {
        union { char name[256]; unsigned char raw[1100]; } prop;
        size_t total;

        memset(&prop, 0, sizeof prop);
        CHECK_EQ(cudaGetDeviceProperties(&prop, 1), 0);
        CHECK(strcmp(prop.name, "NVIDIA H100 80GB HBM3") == 0);
        memcpy(&total, prop.raw + 288, sizeof total);     /* totalGlobalMem */
        CHECK_EQ(total, 1ull << 30);
    }

    /* The runtime's first call initialised the driver too. */
    CHECK_EQ(cuDeviceGetCount(&n), 0);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDeviceGetCount(&n), 0);
    CHECK_EQ(n, 2);
    CHECK_EQ(cuDeviceGetName(name, sizeof name, 0), 0);
    CHECK(strstr(name, "MIG") != NULL);
    CHECK_EQ(cuDeviceGetName(name, sizeof name, 1), 0);
    CHECK(strstr(name, "MIG") == NULL);
    CHECK_EQ(cuDriverGetVersion(&v), 0);
    CHECK_EQ(v, 12040);
    CHECK_EQ(cuDeviceGetAttribute(&v, 102, 1), 0);
    CHECK_EQ(v, 1);
    CHECK_EQ(cuDeviceGetAttribute(&v, 103, 1), 0);
    CHECK_EQ(v, 1);
    CHECK_EQ(cuDeviceGet(&v, 2), 101);

    /* cudaGetLastError returns the last error once; Peek leaves it. */
    CHECK_EQ(cudaSetDevice(2), 101);
    CHECK_EQ(cudaPeekAtLastError(), 101);
    CHECK_EQ(cudaGetLastError(), 101);
    CHECK_EQ(cudaGetLastError(), 0);
    CHECK(strcmp(cudaGetErrorName(101), "cudaErrorInvalidDevice") == 0);

    /* A fork child reads the environment again. */
    reap(spawn(child_no_vmm, pipes));
    unsetenv("FAKECUDA_DEVICES");
    unsetenv("FAKECUDA_COMPUTE_MODE");
    unsetenv("FAKECUDA_MIG");
    reap(spawn(child_bad_env, pipes));
    CHECK_EQ(fakecuda_violations(), 0);
}

static void body_old_driver_and_fail_list(void)
{
    CUmemAllocationProp prop = { .type = 1, .requestedHandleTypes = 1, .location = { 1, 0 } };
    size_t g = 0;
    void *p = NULL;
    CUdeviceptr d = 0;
    CUcontext ctx;
    int v = -1;

    setenv("FAKECUDA_DRIVER_VERSION", "10010", 1);
    setenv("FAKECUDA_FAIL", "cuMemAlloc,cudaMalloc", 1);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDeviceGetAttribute(&v, 102, 0), 0);
    CHECK_EQ(v, 0);
    CHECK_EQ(cuMemGetAllocationGranularity(&g, &prop, 0), 801);
    CHECK_EQ(cudaMalloc(&p, 4096), 999);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    CHECK_EQ(cuCtxSetCurrent(ctx), 0);
    CHECK_EQ(cuMemAlloc_v2(&d, 4096), 999);
}

static void child_fails_too(int rd, int wr)
{
    size_t free_b, total;
    CUcontext ctx;

    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    CHECK_EQ(cuCtxSetCurrent(ctx), 0);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 999);
    send_byte(wr, 'f');
    recv_byte(rd);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 0);
}

/* Failures switched on and off while processes run ($FAKECUDA_DIR/fail). */
static void body_fail_file(void)
{
    size_t free_b, total;
    int pipes[4];
    CUcontext ctx;
    pid_t pid;

    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    CHECK_EQ(cuCtxSetCurrent(ctx), 0);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 0);
    CHECK_EQ(fakecuda_set_fail("cuMemAlloc, cuMemGetInfo"), 0);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 999);
    pid = spawn(child_fails_too, pipes);
    CHECK_EQ(recv_byte(pipes[2]), 'f');
    CHECK_EQ(fakecuda_set_fail(NULL), 0);
    send_byte(pipes[1], 'g');
    reap(pid);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 0);
}

/* One object under every soname: the driver and runtime halves share state,
 * and a library's RTLD_NOLOAD lookup finds the process's own copy. */
static void body_one_object(void)
{
    const char *names[] = { "libcuda.so.1", "libcuda.so", "libcudart.so", "libcudart.so.12" };
    size_t i;

    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);

        CHECK(h != NULL);
        CHECK(dlsym(h, "cuInit") == (void *)cuInit);
        CHECK(dlsym(h, "cudaMalloc") == (void *)cudaMalloc);
        dlclose(h);
    }
}

static void body_no_state_dir(void)
{
    int n = -1;

    unsetenv("FAKECUDA_DIR");
    CHECK_EQ(cudaGetDeviceCount(&n), 100);
    CHECK_EQ(cuInit(0), 100);
    CHECK_EQ(cuDriverGetVersion(&n), 0);
}

/* ---- contexts ----------------------------------------------------------------------- */

static void *register_on_a_thread(void *arg)
{
    return (void *)(intptr_t)cudaHostRegister(arg, 4096, 0);
}

static void child_visible_1(int rd, int wr)
{
    static char buf[8192] __attribute__((aligned(4096)));
    pthread_t t;
    void *rc;

    (void)rd, (void)wr;
    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    CHECK(pthread_create(&t, NULL, register_on_a_thread, buf) == 0);
    CHECK(pthread_join(t, &rc) == 0);
    CHECK_EQ((intptr_t)rc, 0);
    /* Device 0 of this process is physical device 1. */
    CHECK_EQ(fakecuda_context_count(getpid(), 1), 1);
    CHECK_EQ(fakecuda_context_count(getpid(), 0), 0);
}

/* The daemon's pinning thread: cudaHostRegister with no cudaSetDevice makes
 * a context on device 0. */
static void body_runtime_default_device(void)
{
    static char buf[8192] __attribute__((aligned(4096)));
    int pipes[4], dev = -1;
    pthread_t t;
    void *rc;

    CHECK_EQ(fakecuda_context_count(getpid(), -1), 0);
    CHECK_EQ(cudaGetDevice(&dev), 0);       /* asks, creates nothing */
    CHECK_EQ(dev, 0);
    CHECK_EQ(fakecuda_context_count(getpid(), -1), 0);
    CHECK(pthread_create(&t, NULL, register_on_a_thread, buf) == 0);
    CHECK(pthread_join(t, &rc) == 0);
    CHECK_EQ((intptr_t)rc, 0);
    CHECK_EQ(fakecuda_context_count(getpid(), 0), 1);
    CHECK_EQ(fakecuda_context_count(getpid(), 1), 0);
    CHECK_EQ(fakecuda_env_has_context(getpid(), 0), 1);
    CHECK_EQ(fakecuda_context_count(0, -1), 1);
    reap(spawn(child_visible_1, pipes));
    /* cudaFree(NULL): the idiom that makes the current device's context. */
    CHECK_EQ(cudaSetDevice(1), 0);
    CHECK_EQ(fakecuda_context_count(getpid(), 1), 1);
    CHECK_EQ(fakecuda_violations(), 0);
}

static void body_cuda_free_null(void)
{
    CHECK_EQ(cudaFree(NULL), 0);
    CHECK_EQ(fakecuda_context_count(getpid(), 0), 1);
}

static void body_driver_contexts(void)
{
    CUcontext ctx = NULL, cur = NULL;
    CUdeviceptr d = 0;
    int dev = -1;

    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuMemAlloc_v2(&d, 4096), 201);
    CHECK_EQ(fakecuda_violations_of("no-context"), 1);
    CHECK_EQ(cuCtxGetCurrent(&cur), 0);
    CHECK(cur == NULL);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 1), 0);
    CHECK_EQ(fakecuda_context_count(getpid(), 1), 1);
    CHECK_EQ(cuCtxPushCurrent_v2(ctx), 0);
    CHECK_EQ(cuCtxGetDevice(&dev), 0);
    CHECK_EQ(dev, 1);
    CHECK_EQ(cuMemAlloc_v2(&d, 4096), 0);
    CHECK_EQ(cuMemFree_v2(d), 0);
    CHECK_EQ(cuCtxPopCurrent_v2(&cur), 0);
    CHECK(cur == ctx);
    CHECK_EQ(cuCtxGetDevice(&dev), 201);
    CHECK_EQ(cuDevicePrimaryCtxRelease_v2(1), 0);
    CHECK_EQ(fakecuda_context_count(getpid(), 1), 0);
    CHECK_EQ(fakecuda_context_count(getpid(), 0), 0);
    CHECK_EQ(fakecuda_violations_of("no-context"), 2);
    CHECK_EQ(fakecuda_violations(), 2);
}

/* ---- legacy IPC ------------------------------------------------------------------------ */

static cudaIpcMemHandle_t g_handle;
static unsigned char g_pattern[64 * 1024];

static void child_ipc_open(int rd, int wr)
{
    static unsigned char back[sizeof g_pattern];
    void *p = NULL, *q = NULL;

    (void)rd, (void)wr;
    CHECK_EQ(cudaIpcOpenMemHandle(&p, g_handle, 1), 0);
    CHECK_EQ(cudaMemcpy(back, p, sizeof back, KIND_D2H), 0);
    CHECK(memcmp(back, g_pattern, sizeof back) == 0);
    CHECK_EQ(cudaIpcOpenMemHandle(&q, g_handle, 1), 208);
    CHECK_EQ(cudaIpcCloseMemHandle(p), 0);
    CHECK_EQ(cudaIpcCloseMemHandle(p), 1);
}

static void child_ipc_other_pidns(int rd, int wr)
{
    void *p = NULL;

    (void)rd, (void)wr;
    setenv("FAKECUDA_PIDNS", "container-1", 1);
    CHECK_EQ(cudaIpcOpenMemHandle(&p, g_handle, 1), 205);
}

static void body_ipc(void)
{
    void *d = NULL, *p = NULL;
    int pipes[4];
    size_t i;

    for (i = 0; i < sizeof g_pattern; i++)
        g_pattern[i] = (unsigned char)(i * 7 + 3);
    CHECK_EQ(cudaMalloc(&d, sizeof g_pattern), 0);
    CHECK_EQ(cudaMemcpy(d, g_pattern, sizeof g_pattern, KIND_H2D), 0);
    CHECK_EQ(cudaDeviceSynchronize(), 0);
    CHECK_EQ(cudaIpcGetMemHandle(&g_handle, d), 0);
    /* The creator cannot open its own handle. */
    CHECK_EQ(cudaIpcOpenMemHandle(&p, g_handle, 1), 201);
    CHECK_EQ(fakecuda_violations_of("ipc-open-twice"), 1);
    reap(spawn(child_ipc_open, pipes));
    CHECK_EQ(fakecuda_violations_of("ipc-open-twice"), 2);
    reap(spawn(child_ipc_other_pidns, pipes));
    CHECK_EQ(fakecuda_violations_of("ipc-pidns"), 1);
    CHECK_EQ(cudaFree(d), 0);
    CHECK_EQ(fakecuda_violations_of("free-while-mapped"), 0);
    CHECK_EQ(fakecuda_violations(), 3);
}

static void child_open_and_hold(int rd, int wr)
{
    void *p = NULL;

    CHECK_EQ(cudaIpcOpenMemHandle(&p, g_handle, 1), 0);
    send_byte(wr, 'o');
    recv_byte(rd);
    /* Exits without closing: a dead process holds nothing. */
}

static void body_free_while_mapped(void)
{
    size_t free_b = 0, total = 0;
    void *d = NULL, *d2 = NULL;
    int pipes[4];
    pid_t pid;

    setenv("FAKECUDA_MEM_BYTES", "3145728", 1);
    CHECK_EQ(cudaMalloc(&d, 2 * MIB), 0);
    CHECK_EQ(cudaIpcGetMemHandle(&g_handle, d), 0);
    pid = spawn(child_open_and_hold, pipes);
    CHECK_EQ(recv_byte(pipes[2]), 'o');
    CHECK_EQ(cudaFree(d), 0);
    CHECK_EQ(fakecuda_violations_of("free-while-mapped"), 1);
    /* Still counted while the other process has it open. */
    CHECK_EQ(cudaMalloc(&d2, 2 * MIB), 2);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 0);
    CHECK_EQ(total, 3 * MIB);
    CHECK_EQ(free_b, 1 * MIB);
    send_byte(pipes[1], 'c');
    reap(pid);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 0);
    CHECK_EQ(free_b, 3 * MIB);
    CHECK_EQ(cudaMalloc(&d2, 2 * MIB), 0);
    CHECK_EQ(cudaFree(d2), 0);
    CHECK_EQ(fakecuda_violations(), 1);
}

/* ---- VMM ------------------------------------------------------------------------------- */

static int g_vmm_fd = -1;

static CUmemAllocationProp vmm_prop(void)
{
    CUmemAllocationProp prop;

    memset(&prop, 0, sizeof prop);
    prop.type = 1;                  /* CU_MEM_ALLOCATION_TYPE_PINNED */
    prop.requestedHandleTypes = 1;  /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
    prop.location.type = 1;         /* CU_MEM_LOCATION_TYPE_DEVICE */
    prop.location.id = 0;
    return prop;
}

static CUdeviceptr vmm_map(CUmemGenericAllocationHandle h, size_t size)
{
    CUmemAccessDesc acc = { .location = { 1, 0 }, .flags = 3 };
    CUdeviceptr va = 0;

    CHECK_EQ(cuMemAddressReserve(&va, size, 0, 0, 0), 0);
    CHECK_EQ(cuMemMap(va, size, 0, h, 0), 0);
    CHECK_EQ(cuMemSetAccess(va, size, &acc, 1), 0);
    return va;
}

static void child_vmm_import(int rd, int wr)
{
    static unsigned char back[sizeof g_pattern];
    CUmemGenericAllocationHandle h = 0;
    cudaIpcMemHandle_t unused;
    CUcontext ctx;
    CUdeviceptr va;

    (void)unused;
    /* Another PID namespace: legacy IPC would fail, the fd does not. */
    setenv("FAKECUDA_PIDNS", "container-2", 1);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    CHECK_EQ(cuCtxSetCurrent(ctx), 0);
    CHECK_EQ(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)g_vmm_fd, 1), 0);
    va = vmm_map(h, 4 * MIB);
    CHECK_EQ(cuMemcpyDtoH_v2(back, va, sizeof back), 0);
    CHECK(memcmp(back, g_pattern, sizeof back) == 0);
    send_byte(wr, 'm');
    recv_byte(rd);
    CHECK_EQ(cuMemUnmap(va, 4 * MIB), 0);
    CHECK_EQ(cuMemAddressFree(va, 4 * MIB), 0);
    CHECK_EQ(cuMemRelease(h), 0);
}

static void body_vmm(void)
{
    CUmemAllocationProp prop = vmm_prop();
    CUmemGenericAllocationHandle h = 0;
    size_t g = 0, free_b = 0, total = 0;
    CUcontext ctx;
    CUdeviceptr va = 0;
    int pipes[4];
    size_t i;
    pid_t pid;

    for (i = 0; i < sizeof g_pattern; i++)
        g_pattern[i] = (unsigned char)(i * 13 + 1);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    CHECK_EQ(cuCtxSetCurrent(ctx), 0);
    CHECK_EQ(cuMemGetAllocationGranularity(&g, &prop, 0), 0);
    CHECK_EQ(g, 2 * MIB);
    CHECK_EQ(cuMemCreate(&h, g + 4096, &prop, 0), 1);
    CHECK_EQ(cuMemCreate(&h, 4 * MIB, &prop, 0), 0);
    CHECK_EQ(cuMemExportToShareableHandle(&g_vmm_fd, h, 1, 0), 0);
    CHECK(g_vmm_fd >= 0);
    CHECK_EQ(cuMemAddressReserve(&va, 4 * MIB, 0, 0, 0), 0);
    CHECK_EQ(cuMemMap(va, 4 * MIB, 0, h, 0), 0);
    /* No access set yet: not usable. */
    CHECK_EQ(cuMemcpyHtoD_v2(va, g_pattern, sizeof g_pattern), 1);
    CHECK_EQ(cuMemUnmap(va, 4 * MIB), 0);
    CHECK_EQ(cuMemAddressFree(va, 4 * MIB), 0);
    va = vmm_map(h, 4 * MIB);
    CHECK_EQ(cuMemcpyHtoD_v2(va, g_pattern, sizeof g_pattern), 0);
    CHECK_EQ(cuCtxSynchronize(), 0);

    pid = spawn(child_vmm_import, pipes);
    CHECK_EQ(recv_byte(pipes[2]), 'm');
    /* Releasing while an importer maps it is legal; the memory stays. */
    CHECK_EQ(cuMemUnmap(va, 4 * MIB), 0);
    CHECK_EQ(cuMemAddressFree(va, 4 * MIB), 0);
    CHECK_EQ(cuMemRelease(h), 0);
    CHECK_EQ(cuMemRelease(h), 1);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 0);
    CHECK_EQ(total - free_b, 4 * MIB);
    send_byte(pipes[1], 'r');
    reap(pid);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 0);
    CHECK_EQ(free_b, total);
    close(g_vmm_fd);
    CHECK_EQ(fakecuda_violations(), 0);
}

/* A real child PID namespace (where the system lets this test make one):
 * the fake names and tracks processes by their outer pid and a lock, so the
 * engine inside neither mistakes the daemon outside for dead (and drops its
 * allocations) nor opens its legacy handle, and imports its VMM fd. */
static void in_new_pid_namespace(void)
{
    static unsigned char back[sizeof g_pattern];
    CUmemGenericAllocationHandle h = 0;
    size_t free_b = 0, total = 0;
    CUcontext ctx;
    CUdeviceptr va;
    void *p = NULL;

    CHECK_EQ(getpid(), 1);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    CHECK_EQ(cuCtxSetCurrent(ctx), 0);
    CHECK_EQ(cuMemGetInfo_v2(&free_b, &total), 0);
    CHECK_EQ(total - free_b, 6 * MIB);
    CHECK_EQ(fakecuda_env_has_context(1, 0), 0);    /* named by its outer pid */
    CHECK_EQ(cudaIpcOpenMemHandle(&p, g_handle, 1), 205);
    CHECK_EQ(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)g_vmm_fd, 1), 0);
    va = vmm_map(h, 4 * MIB);
    CHECK_EQ(cuMemcpyDtoH_v2(back, va, sizeof back), 0);
    CHECK(memcmp(back, g_pattern, sizeof back) == 0);
    CHECK_EQ(cuMemUnmap(va, 4 * MIB), 0);
    CHECK_EQ(cuMemAddressFree(va, 4 * MIB), 0);
    CHECK_EQ(cuMemRelease(h), 0);
}

static void child_unshare(int rd, int wr)
{
    pid_t pid;

    (void)rd, (void)wr;
    if (unshare(CLONE_NEWPID) != 0) {
        fprintf(stderr, "test_fakecuda: no PID namespace here (%s): real_pid_namespace checks nothing\n",
                strerror(errno));
        return;
    }
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        in_new_pid_namespace();
        fflush(NULL);
        _exit(0);
    }
    reap(pid);
}

static void body_real_pid_namespace(void)
{
    CUmemAllocationProp prop = vmm_prop();
    CUmemGenericAllocationHandle h = 0;
    CUcontext ctx;
    CUdeviceptr va;
    void *d = NULL;
    int pipes[4];
    size_t i;

    for (i = 0; i < sizeof g_pattern; i++)
        g_pattern[i] = (unsigned char)(i * 5 + 2);
    CHECK_EQ(cudaMalloc(&d, 2 * MIB), 0);
    CHECK_EQ(cudaIpcGetMemHandle(&g_handle, d), 0);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    CHECK_EQ(cuMemCreate(&h, 4 * MIB, &prop, 0), 0);
    CHECK_EQ(cuMemExportToShareableHandle(&g_vmm_fd, h, 1, 0), 0);
    va = vmm_map(h, 4 * MIB);
    CHECK_EQ(cudaMemcpy((void *)(uintptr_t)va, g_pattern, sizeof g_pattern, KIND_H2D), 0);
    CHECK_EQ(cudaDeviceSynchronize(), 0);
    reap(spawn(child_unshare, pipes));
    CHECK_EQ(cudaFree(d), 0);
    CHECK_EQ(cuMemUnmap(va, 4 * MIB), 0);
    CHECK_EQ(cuMemAddressFree(va, 4 * MIB), 0);
    CHECK_EQ(cuMemRelease(h), 0);
    close(g_vmm_fd);
    CHECK_EQ(fakecuda_violations_of("free-while-mapped"), 0);
    CHECK(fakecuda_violations_of("ipc-pidns") <= 1);
}

/* ---- host registration and copies -------------------------------------------------------- */

static void body_register(void)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *ro, *rw;
    void *d = NULL;

    ro = mmap(NULL, 4 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    rw = mmap(NULL, 8 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(ro != MAP_FAILED && rw != MAP_FAILED);
    CHECK_EQ(cudaHostRegister(ro, 4 * pg, 1), 1);
    CHECK_EQ(fakecuda_violations_of("register-readonly"), 1);
    CHECK_EQ(cudaHostRegister(ro, 4 * pg, 1 | 8), 0);
    CHECK_EQ(cudaHostRegister(rw, 4 * pg, 0), 0);
    CHECK_EQ(cudaHostRegister(rw + 2 * pg, 4 * pg, 0), 712);
    CHECK_EQ(cudaHostRegister(rw + 4 * pg, 4 * pg, 0), 0);
    CHECK_EQ(cudaHostUnregister(rw + pg), 713);

    CHECK_EQ(cudaMalloc(&d, 8 * pg), 0);
    /* Spans two registrations. */
    CHECK_EQ(cudaMemcpy(d, rw + 3 * pg, 2 * pg, KIND_H2D), 1);
    CHECK_EQ(fakecuda_violations_of("copy-straddles-pin"), 1);
    CHECK_EQ(cudaMemcpy(d, rw, 4 * pg, KIND_H2D), 0);
    CHECK_EQ(cudaHostUnregister(rw + 4 * pg), 0);
    /* Partly registered. */
    CHECK_EQ(cudaMemcpy(rw + 3 * pg, d, 2 * pg, KIND_D2H), 1);
    CHECK_EQ(fakecuda_violations_of("copy-straddles-pin"), 2);
    CHECK_EQ(cudaMemcpy(rw + 4 * pg, d, 2 * pg, KIND_D2H), 0);
    /* A host pointer passed as the device side. */
    CHECK_EQ(cudaMemcpy(rw, rw + 4 * pg, pg, KIND_D2H), 1);
    CHECK_EQ(fakecuda_violations_of("copy-direction"), 1);
    CHECK_EQ(cudaHostUnregister(rw), 0);
    CHECK_EQ(cudaHostUnregister(ro), 0);
    CHECK_EQ(cudaFree(d), 0);
    CHECK_EQ(fakecuda_violations(), 5);
}

/* Non-portable registrations pin for the current device only; portable and
 * cudaHostAlloc memory for every device. */
static void body_register_per_device(void)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), free_b = 0, total = 0;
    struct cudaPointerAttributes at;
    unsigned char *rw, *pinned = NULL;
    void *d1 = NULL;

    rw = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(rw != MAP_FAILED);
    CHECK_EQ(cudaHostRegister(rw, 2 * pg, 0), 0);     /* device 0's */
    CHECK_EQ(cudaPointerGetAttributes(&at, rw), 0);
    CHECK_EQ(at.type, 1);
    CHECK_EQ(cudaSetDevice(1), 0);
    CHECK_EQ(cudaPointerGetAttributes(&at, rw), 0);
    CHECK_EQ(at.type, 0);
    CHECK_EQ(cudaMalloc(&d1, 4 * pg), 0);
    CHECK_EQ(cudaPointerGetAttributes(&at, d1), 0);
    CHECK_EQ(at.type, 2);
    CHECK_EQ(at.device, 1);
    /* Half registered for device 0 is wholly pageable to device 1. */
    CHECK_EQ(cudaMemcpy(d1, rw + pg, 2 * pg, KIND_H2D), 0);
    CHECK_EQ(cudaSetDevice(0), 0);
    CHECK_EQ(cudaMemcpy(d1, rw + pg, 2 * pg, KIND_H2D), 1);
    CHECK_EQ(fakecuda_violations_of("copy-straddles-pin"), 1);
    CHECK_EQ(cudaHostAlloc((void **)&pinned, 2 * pg, 0), 0);
    CHECK_EQ(cudaSetDevice(1), 0);
    CHECK_EQ(cudaPointerGetAttributes(&at, pinned), 0);
    CHECK_EQ(at.type, 1);
    CHECK_EQ(cudaHostUnregister(pinned), 713);
    CHECK_EQ(cudaMemGetInfo(&free_b, &total), 0);
    CHECK_EQ(total - free_b, 4 * pg);
    CHECK_EQ(cudaFree(d1), 0);
    CHECK_EQ(cudaMemGetInfo(&free_b, &total), 0);
    CHECK_EQ(free_b, total);
    CHECK_EQ(cudaFreeHost(pinned), 0);
    CHECK_EQ(cudaFreeHost(rw), 1);
    CHECK_EQ(cudaHostUnregister(rw), 0);
    CHECK_EQ(fakecuda_violations(), 1);
}

/* ---- sticky errors and compute modes ----------------------------------------------------- */

static void child_sticky(int rd, int wr)
{
    void *d = NULL;

    CHECK_EQ(cudaSetDevice(0), 0);
    CHECK_EQ(cudaMalloc(&d, 4096), 0);
    send_byte(wr, 'a');
    recv_byte(rd);
    CHECK_EQ(cudaMalloc(&d, 4096), 700);
    CHECK_EQ(cudaGetLastError(), 700);
    CHECK_EQ(cudaGetLastError(), 700);
}

static void body_sticky(void)
{
    char p[PATH_MAX];
    void *d = NULL, *d2 = NULL;
    int pipes[4];
    pid_t pid;

    CHECK_EQ(cudaSetDevice(0), 0);
    CHECK_EQ(cudaMalloc(&d, 4096), 0);
    pid = spawn(child_sticky, pipes);
    CHECK_EQ(recv_byte(pipes[2]), 'a');
    CHECK_EQ(fakecuda_make_sticky(0), 0);
    send_byte(pipes[1], 'b');
    reap(pid);
    CHECK_EQ(cudaMalloc(&d2, 4096), 700);
    CHECK_EQ(cudaFree(d), 700);
    CHECK_EQ(cudaGetLastError(), 700);
    CHECK_EQ(cudaGetLastError(), 700);
    /* For the life of the process, even once the flag is gone. */
    snprintf(p, sizeof p, "%s/sticky-0", g_dir);
    CHECK(unlink(p) == 0);
    CHECK_EQ(cudaMalloc(&d2, 4096), 700);
    /* Another device's context is not hit. */
    CHECK_EQ(cudaSetDevice(1), 0);
    CHECK_EQ(cudaMalloc(&d2, 4096), 0);
    CHECK_EQ(cudaFree(d2), 0);
}

static void child_exclusive_first(int rd, int wr)
{
    (void)rd, (void)wr;
    CHECK_EQ(cudaSetDevice(0), 0);
}

static void child_exclusive_second(int rd, int wr)
{
    CUcontext ctx;
    void *d = NULL;

    (void)rd, (void)wr;
    CHECK_EQ(cudaSetDevice(0), 46);
    CHECK_EQ(cudaGetLastError(), 46);
    CHECK_EQ(cudaMalloc(&d, 4096), 46);
    CHECK_EQ(cudaSetDevice(1), 46);
    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 46);
    CHECK_EQ(fakecuda_context_count(getpid(), -1), 0);
}

static void body_compute_modes(void)
{
    int pipes[4];

    setenv("FAKECUDA_COMPUTE_MODE", "3,2", 1);
    /* A process that had the device and exited does not hold it. */
    reap(spawn(child_exclusive_first, pipes));
    CHECK_EQ(cudaSetDevice(0), 0);
    reap(spawn(child_exclusive_second, pipes));
    CHECK_EQ(cudaSetDevice(1), 46);
    CHECK_EQ(fakecuda_context_count(0, 0), 1);
    CHECK_EQ(fakecuda_violations(), 0);
}

/* ---- streams ------------------------------------------------------------------------------ */

#define N 4096

/* The two checks that a copy has NOT landed yet: the delay (1 s) is far
 * longer than the few calls between the copy and the look, so they hold
 * on a loaded machine too; every other stream check below is an ordering
 * (deterministic) and runs with a short delay. */
static void body_streams(void)
{
    static unsigned char host[N];
    unsigned char *a = NULL, *b = NULL, *pinned = NULL;
    cudaStream_t nb;
    CUstream cs;

    setenv("FAKECUDA_COPY_DELAY_MS", "1000", 1);
    CHECK_EQ(cudaMalloc((void **)&a, N), 0);
    CHECK_EQ(cudaMalloc((void **)&b, N), 0);
    CHECK_EQ(cudaMallocHost((void **)&pinned, N), 0);
    /* The fake's device memory is a host mapping: set a's bytes directly. */
    memset(a, 0xAB, N);

    /* D2D cudaMemcpy returns before the copy lands (legacy stream). */
    CHECK_EQ(cudaMemcpy(b, a, N, KIND_D2D), 0);
    CHECK_EQ(cudaStreamQuery(NULL), 600);
    CHECK(b[0] == 0 && b[N - 1] == 0);
    CHECK_EQ(cudaStreamSynchronize(NULL), 0);
    CHECK(b[0] == 0xAB && b[N - 1] == 0xAB);
    CHECK_EQ(cudaStreamQuery(NULL), 0);

    /* A fresh non-blocking stream is not ordered after the legacy stream:
     * its read starts at once and sees the bytes from before the D2D. */
    memset(a, 0xCD, N);
    CHECK_EQ(cudaMemcpy(b, a, N, KIND_D2D), 0);
    CHECK_EQ(cudaStreamCreateWithFlags(&nb, 1), 0);
    CHECK_EQ(cudaMemcpyAsync(host, b, N, KIND_D2H, nb), 0);    /* pageable: returns complete */
    CHECK(host[0] == 0xAB && host[N - 1] == 0xAB);
    CHECK_EQ(cudaStreamSynchronize(NULL), 0);
    CHECK(b[0] == 0xCD && b[N - 1] == 0xCD);
    CHECK_EQ(cudaStreamDestroy(nb), 0);

    /* An H2D from pageable memory returns once staged, before it lands;
     * an asynchronous one from pinned memory at once. */
    memset(host, 0x77, N);
    CHECK_EQ(cudaMemcpy(a, host, N, KIND_H2D), 0);
    memset(host, 0x00, N);      /* staged: the device gets the bytes of the call */
    CHECK(a[0] == 0xCD);
    CHECK_EQ(cudaStreamSynchronize(NULL), 0);
    CHECK(a[0] == 0x77 && a[N - 1] == 0x77);
    CHECK_EQ(cuStreamCreate(&cs, 1), 0);
    memset(pinned, 0x55, N);
    CHECK_EQ(cuMemcpyHtoDAsync_v2((CUdeviceptr)(uintptr_t)a, pinned, N, cs), 0);
    CHECK_EQ(cuStreamQuery(cs), 600);
    CHECK_EQ(cuStreamSynchronize(cs), 0);
    CHECK(a[0] == 0x55 && a[N - 1] == 0x55);
    CHECK_EQ(cuStreamDestroy_v2(cs), 0);
    CHECK_EQ(cudaFreeHost(pinned), 0);
    CHECK_EQ(cudaFree(a), 0);
    CHECK_EQ(cudaFree(b), 0);
    CHECK_EQ(fakecuda_violations(), 0);
}

/* Orderings: events across non-blocking streams, the legacy stream and
 * blocking streams both ways, cudaMemset on the legacy stream. */
static void body_events(void)
{
    static unsigned char host[N];
    unsigned char *a = NULL, *b = NULL;
    cudaStream_t s1, s2;
    cudaEvent_t e;

    setenv("FAKECUDA_COPY_DELAY_MS", "100", 1);
    CHECK_EQ(cudaMalloc((void **)&a, N), 0);
    CHECK_EQ(cudaMalloc((void **)&b, N), 0);
    memset(a, 0x5A, N);
    CHECK_EQ(cudaStreamCreateWithFlags(&s1, 1), 0);
    CHECK_EQ(cudaStreamCreateWithFlags(&s2, 1), 0);
    CHECK_EQ(cudaEventCreateWithFlags(&e, 2), 0);
    CHECK_EQ(cudaEventQuery(e), 0);     /* never recorded */
    CHECK_EQ(cudaMemcpyAsync(b, a, N, KIND_D2D, s1), 0);
    CHECK_EQ(cudaEventRecord(e, s1), 0);
    CHECK_EQ(cudaStreamWaitEvent(s2, e, 0), 0);
    CHECK_EQ(cudaMemcpyAsync(host, b, N, KIND_D2H, s2), 0);
    CHECK(host[0] == 0x5A && host[N - 1] == 0x5A);
    CHECK_EQ(cudaEventQuery(e), 0);
    CHECK_EQ(cudaEventSynchronize(e), 0);
    CHECK_EQ(cudaStreamQuery(s1), 0);
    CHECK_EQ(cudaEventDestroy(e), 0);
    CHECK_EQ(cudaStreamDestroy(s1), 0);
    CHECK_EQ(cudaStreamDestroy(s2), 0);
    CHECK_EQ(cudaStreamDestroy(s2), 400);

    /* A blocking stream waits for the legacy stream's earlier copy. */
    memset(a, 0xEF, N);
    CHECK_EQ(cudaMemcpy(b, a, N, KIND_D2D), 0);
    CHECK_EQ(cudaStreamCreate(&s1), 0);
    CHECK_EQ(cudaMemcpyAsync(host, b, N, KIND_D2H, s1), 0);
    CHECK(host[0] == 0xEF && host[N - 1] == 0xEF);
    CHECK_EQ(cudaStreamDestroy(s1), 0);

    /* The legacy stream waits for a blocking stream's earlier work: a
     * synchronous D2H (which returns complete) sees its D2D. */
    memset(a, 0x3C, N);
    CHECK_EQ(cudaStreamCreate(&s1), 0);
    CHECK_EQ(cudaMemcpyAsync(b, a, N, KIND_D2D, s1), 0);
    CHECK_EQ(cudaMemcpy(host, b, N, KIND_D2H), 0);
    CHECK(host[0] == 0x3C && host[N - 1] == 0x3C);
    /* cudaMemset is ordered on the legacy stream too. */
    CHECK_EQ(cudaMemset(b, 0x11, N), 0);
    CHECK_EQ(cudaMemcpy(host, b, N, KIND_D2H), 0);
    CHECK(host[0] == 0x11 && host[N - 1] == 0x11);
    CHECK_EQ(cudaStreamDestroy(s1), 0);
    CHECK_EQ(cudaFree(a), 0);
    CHECK_EQ(cudaFree(b), 0);
    CHECK_EQ(fakecuda_violations(), 0);
}

/* A synchronous H2D from pinned memory returns complete; event timing; the
 * driver's explicit variants on the runtime's (primary) context. */
static void body_sync_copies(void)
{
    unsigned char *d = NULL, *pinned = NULL;
    cudaEvent_t e0, e1;
    float ms = -1;
    CUstream cs;
    CUcontext ctx;

    setenv("FAKECUDA_COPY_DELAY_MS", "100", 1);
    CHECK_EQ(cudaMalloc((void **)&d, N), 0);
    CHECK_EQ(cudaMallocHost((void **)&pinned, N), 0);
    CHECK_EQ(cudaEventCreate(&e0), 0);
    CHECK_EQ(cudaEventCreate(&e1), 0);
    CHECK_EQ(cudaEventElapsedTime(&ms, e0, e1), 400);
    CHECK_EQ(cudaEventRecord(e0, NULL), 0);
    memset(pinned, 0x66, N);
    CHECK_EQ(cudaMemcpy(d, pinned, N, KIND_H2D), 0);
    CHECK(d[0] == 0x66 && d[N - 1] == 0x66);
    CHECK_EQ(cudaEventRecord(e1, NULL), 0);
    CHECK_EQ(cudaEventSynchronize(e1), 0);
    CHECK_EQ(cudaEventElapsedTime(&ms, e0, e1), 0);
    CHECK(ms > 0);

    CHECK_EQ(cuInit(0), 0);
    CHECK_EQ(cuCtxGetCurrent(&ctx), 0);
    CHECK(ctx != NULL);
    CHECK_EQ(cuStreamCreate(&cs, 1), 0);
    CHECK_EQ(cuMemsetD8Async((CUdeviceptr)(uintptr_t)d, 0x44, N, cs), 0);
    CHECK_EQ(cuMemcpyDtoHAsync_v2(pinned, (CUdeviceptr)(uintptr_t)d, N, cs), 0);
    CHECK_EQ(cuStreamSynchronize(cs), 0);
    CHECK(pinned[0] == 0x44 && pinned[N - 1] == 0x44);
    CHECK_EQ(cuMemcpyDtoD_v2((CUdeviceptr)(uintptr_t)d, (CUdeviceptr)(uintptr_t)d, N), 0);
    CHECK_EQ(cuStreamDestroy_v2(cs), 0);
    CHECK_EQ(cudaEventDestroy(e0), 0);
    CHECK_EQ(cudaEventDestroy(e1), 0);
    CHECK_EQ(cudaFreeHost(pinned), 0);
    CHECK_EQ(cudaFree(d), 0);
    CHECK_EQ(fakecuda_violations(), 0);
}

START_TEST(environment) { run_isolated(body_environment); }
END_TEST
START_TEST(old_driver_and_fail_list) { run_isolated(body_old_driver_and_fail_list); }
END_TEST
START_TEST(fail_file) { run_isolated(body_fail_file); }
END_TEST
START_TEST(one_object) { run_isolated(body_one_object); }
END_TEST
START_TEST(no_state_dir) { run_isolated(body_no_state_dir); }
END_TEST
START_TEST(register_per_device) { run_isolated(body_register_per_device); }
END_TEST
START_TEST(sync_copies) { run_isolated(body_sync_copies); }
END_TEST
START_TEST(runtime_default_device) { run_isolated(body_runtime_default_device); }
END_TEST
START_TEST(cuda_free_null) { run_isolated(body_cuda_free_null); }
END_TEST
START_TEST(driver_contexts) { run_isolated(body_driver_contexts); }
END_TEST
START_TEST(ipc) { run_isolated(body_ipc); }
END_TEST
START_TEST(free_while_mapped) { run_isolated(body_free_while_mapped); }
END_TEST
START_TEST(vmm) { run_isolated(body_vmm); }
END_TEST
START_TEST(real_pid_namespace) { run_isolated(body_real_pid_namespace); }
END_TEST
START_TEST(host_register) { run_isolated(body_register); }
END_TEST
START_TEST(sticky) { run_isolated(body_sticky); }
END_TEST
START_TEST(compute_modes) { run_isolated(body_compute_modes); }
END_TEST
START_TEST(streams) { run_isolated(body_streams); }
END_TEST
START_TEST(events) { run_isolated(body_events); }
END_TEST

#if defined(__SANITIZE_ADDRESS__)
#define BUILT_WITH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUILT_WITH_ASAN 1
#endif
#endif

int main(int argc, char **argv)
{
    Suite *s = suite_create("fakecuda");
    TCase *tc = tcase_create("rules");
    SRunner *sr;
    int failed;

#ifdef BUILT_WITH_ASAN
    /* dlopen by name from an ASan program needs LD_LIBRARY_PATH (see
     * fakecuda_env.h); elsewhere the rpath serves, and valgrind stays on. */
    fakecuda_reexec(argc, argv);
#else
    (void)argc, (void)argv;
#endif

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, environment);
    tcase_add_test(tc, old_driver_and_fail_list);
    tcase_add_test(tc, fail_file);
    tcase_add_test(tc, one_object);
    tcase_add_test(tc, no_state_dir);
    tcase_add_test(tc, runtime_default_device);
    tcase_add_test(tc, cuda_free_null);
    tcase_add_test(tc, driver_contexts);
    tcase_add_test(tc, ipc);
    tcase_add_test(tc, free_while_mapped);
    tcase_add_test(tc, vmm);
    tcase_add_test(tc, real_pid_namespace);
    tcase_add_test(tc, host_register);
    tcase_add_test(tc, register_per_device);
    tcase_add_test(tc, sticky);
    tcase_add_test(tc, compute_modes);
    tcase_add_test(tc, streams);
    tcase_add_test(tc, events);
    tcase_add_test(tc, sync_copies);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
