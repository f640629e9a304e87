/* libkvnode's GPU path through the strict fake CUDA (tests/fakecuda), the
 * library an engine's process would have: libkvnode finds it at run time
 * and this test makes its own CUDA calls through the same object.
 *
 * (The program is linked with the fake's folder as its RPATH, which dlopen
 * searches before the system's folders, so no CUDA toolkit or GPU is used
 * even where one is installed.)
 *
 * The daemon is a small fake in another process (this program run with
 * --fake-daemon), because CUDA's rules are per process: it lends its GPU
 * memory as the real one does (a VMM allocation's POSIX fd, or a legacy IPC
 * handle), keeps a few blocks, copies a block's bytes out of its memory at
 * PUT_COMMIT as write-through does (GET_INLINE answers with those bytes),
 * and on request says GoingAway, then frees its GPU memory once the
 * connection has closed. It prints what it saw (HELLOs, what the fake
 * counted) on stdout when the client has gone. What is proven (issue 28):
 *   - a VMM arena is imported and mapped on the client's device, byte-exact
 *     both ways, from another PID namespace too; HELLO says cuda_vmm;
 *   - GPU memory that cannot be mapped (legacy IPC across PID namespaces, a
 *     failing cuMemMap) leaves the client connected host-only, saying why to
 *     the daemon (hbm_unusable) and in kvnode_last_error;
 *   - get_batch(DEVICE) returns with dst complete (read on a fresh
 *     non-blocking stream while copies take 200 ms); put_batch_stream is
 *     ordered after the caller's stream; put_commit_stream commits what the
 *     caller's stream wrote;
 *   - a reader pins its read-only host mapping;
 *   - GoingAway fails calls with ESHUTDOWN and the client lets the GPU
 *     memory go before the daemon frees it (no free-while-mapped; device
 *     memory back to zero), without kvnode_close.
 * Every test ends with the fake's violation log empty. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/proc.h"
#include "../common/rmtree.h"
#include "../fakecuda/fakecuda_env.h"
#include "../fakecuda/fakecuda_check.h"
#include "fake_server_io.h"
#include "kvnode.h"
#include "wire.h"

#define BB 4096u                /* block bytes */
#define NSLOTS 16               /* blocks per arena */
#define COPY_DELAY "200"        /* FAKECUDA_COPY_DELAY_MS of every test */
#define WAIT_MS 20000           /* the fake daemon's every wait */

enum { KEY_GOING_AWAY = -2000 };

/* --- CUDA through the fake, by dlsym (no toolkit headers) ----------------- */

typedef unsigned long long cu_ptr;
typedef unsigned long long cu_handle;
struct cu_location { int type, id; };
struct cu_prop {
    int type, handle_types;
    struct cu_location loc;
    void *win32;
    unsigned char flags[8];
};
struct cu_access { struct cu_location loc; int flags; };

static struct {
    int (*cudaSetDevice)(int);
    int (*cudaMalloc)(void **, size_t);
    int (*cudaFree)(void *);
    int (*cudaMemcpy)(void *, const void *, size_t, int);
    int (*cudaMemcpyAsync)(void *, const void *, size_t, int, void *);
    int (*cudaMemset)(void *, int, size_t);
    int (*cudaStreamCreateWithFlags)(void **, unsigned);
    int (*cudaStreamDestroy)(void *);
    int (*cudaStreamSynchronize)(void *);
    int (*cudaDeviceSynchronize)(void);
    int (*cudaIpcGetMemHandle)(void *handle, void *ptr);
    int (*cuInit)(unsigned);
    int (*cuDeviceGet)(int *, int);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuMemGetAllocationGranularity)(size_t *, const struct cu_prop *, int);
    int (*cuMemCreate)(cu_handle *, size_t, const struct cu_prop *, unsigned long long);
    int (*cuMemExportToShareableHandle)(void *, cu_handle, int, unsigned long long);
    int (*cuMemAddressReserve)(cu_ptr *, size_t, size_t, cu_ptr, unsigned long long);
    int (*cuMemAddressFree)(cu_ptr, size_t);
    int (*cuMemMap)(cu_ptr, size_t, size_t, cu_handle, unsigned long long);
    int (*cuMemUnmap)(cu_ptr, size_t);
    int (*cuMemSetAccess)(cu_ptr, size_t, const struct cu_access *, size_t);
    int (*cuMemRelease)(cu_handle);
    int (*cuMemGetInfo_v2)(size_t *, size_t *);
} cu;

/* Load the fake (the same object libkvnode finds: the RPATH). NULL, or
 * what is missing. */
static const char *cu_try_load(void)
{
    void *rt = dlopen("libcudart.so", RTLD_NOW | RTLD_GLOBAL);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);

    if (!rt || !drv)
        return "the fake CUDA is not where this test's RPATH says (build tests/fakecuda)";
#define CU_SYM(h, name) do { *(void **)&cu.name = dlsym(h, #name); \
        if (!cu.name) return "the fake CUDA lacks " #name; } while (0)
    CU_SYM(rt, cudaSetDevice); CU_SYM(rt, cudaMalloc); CU_SYM(rt, cudaFree);
    CU_SYM(rt, cudaMemcpy); CU_SYM(rt, cudaMemcpyAsync); CU_SYM(rt, cudaMemset);
    CU_SYM(rt, cudaStreamCreateWithFlags); CU_SYM(rt, cudaStreamDestroy);
    CU_SYM(rt, cudaStreamSynchronize); CU_SYM(rt, cudaDeviceSynchronize);
    CU_SYM(rt, cudaIpcGetMemHandle);
    CU_SYM(drv, cuInit); CU_SYM(drv, cuDeviceGet); CU_SYM(drv, cuDevicePrimaryCtxRetain);
    CU_SYM(drv, cuCtxSetCurrent); CU_SYM(drv, cuMemGetAllocationGranularity);
    CU_SYM(drv, cuMemCreate); CU_SYM(drv, cuMemExportToShareableHandle);
    CU_SYM(drv, cuMemAddressReserve); CU_SYM(drv, cuMemAddressFree); CU_SYM(drv, cuMemMap);
    CU_SYM(drv, cuMemUnmap); CU_SYM(drv, cuMemSetAccess); CU_SYM(drv, cuMemRelease);
    CU_SYM(drv, cuMemGetInfo_v2);
#undef CU_SYM
    return NULL;
}

static void cu_load(void)
{
    const char *why = cu_try_load();

    ck_assert_msg(why == NULL, "%s", why);
}

#define CU_OK(call) do { int cu_err_ = (call); \
        ck_assert_msg(cu_err_ == 0, "%s failed: %d", #call, cu_err_); } while (0)

static void fill_pattern(uint8_t *p, size_t n, int64_t key)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(key * 31 + (int64_t)i * 7 + 1);
}

static int check_pattern(const uint8_t *p, size_t n, int64_t key)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(key * 31 + (int64_t)i * 7 + 1))
            return 0;
    return 1;
}

/* --- the fake daemon (this program with --fake-daemon) ---------------------- */

struct fd_slot { int64_t key; int state; };     /* 0 free, 1 reserved, 2 stored */

static struct {
    int mode;                   /* 'v' VMM, 'i' legacy IPC, 'n' no GPU memory */
    int reader;                 /* grant reader requests */
    int lfd, cfd;
    int memfd;
    uint8_t *host;
    void *dev;                  /* its own view of the GPU arena */
    size_t dev_size;
    cu_handle vmm;
    int vmm_fd;
    unsigned char ipc[64];
    struct fd_slot slots[2][NSLOTS];
    uint8_t stored[2][NSLOTS][BB];  /* what "write-through" read at commit */
    uint64_t next_lease, expect_id;
    int lent_gpu;               /* this connection was lent the GPU arena */
    int going_away;
} fdm;

static void fdm_die(const char *what)
{
    printf("fatal %s (errno %d)\n", what, errno);
    fflush(stdout);
    _exit(3);
}

static int fdm_read_full(uint8_t *buf, size_t n)
{
    return fake_io_read_full(fdm.cfd, buf, n, WAIT_MS);
}

static void fdm_reply(Kvnode__Response *r, const int *fds, size_t nfds)
{
    uint8_t *frame;
    size_t len, off = 0;

    if (wire_pack(&r->base, 1u << 20, &frame, &len) < 0)
        fdm_die("pack");
    while (off < len) {
        ssize_t w = fake_io_send_fds(fdm.cfd, frame + off, len - off, fds, off == 0 ? nfds : 0);

        if (w <= 0)
            fdm_die("send");
        off += (size_t)w;
    }
    free(frame);
}

/* Bytes of slot i of arena a (0 host, 1 GPU) into buf: the GPU's with a
 * synchronous D2H copy, which returns with them (complete). */
static void fdm_read_slot(int a, size_t i, uint8_t *buf)
{
    if (a == 0)
        memcpy(buf, fdm.host + i * BB, BB);
    else if (cu.cudaMemcpy(buf, (uint8_t *)fdm.dev + i * BB, BB, 4) != 0)
        fdm_die("cudaMemcpy D2H");
}

static void fdm_preload(int a, size_t i, int64_t key)
{
    uint8_t buf[BB];

    fill_pattern(buf, BB, key);
    if (a == 0)
        memcpy(fdm.host + i * BB, buf, BB);
    else if (cu.cudaMemcpy((uint8_t *)fdm.dev + i * BB, buf, BB, 4) != 0 ||
             cu.cudaDeviceSynchronize() != 0)
        fdm_die("cudaMemcpy H2D");
    fdm.slots[a][i].key = key;
    fdm.slots[a][i].state = 2;
    memcpy(fdm.stored[a][i], buf, BB);
}

static struct fd_slot *fdm_find(int64_t key, int *a, size_t *i)
{
    for (*a = 0; *a < 2; (*a)++)
        for (*i = 0; *i < NSLOTS; (*i)++)
            if (fdm.slots[*a][*i].state == 2 && fdm.slots[*a][*i].key == key &&
                (*a == 0 || fdm.lent_gpu))
                return &fdm.slots[*a][*i];
    return NULL;
}

static void fdm_hello(const Kvnode__Request *req)
{
    const Kvnode__HelloRequest *h = req->hello;
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__HelloReply hr = KVNODE__HELLO_REPLY__INIT;
    Kvnode__Arena a[2] = {KVNODE__ARENA__INIT, KVNODE__ARENA__INIT};
    Kvnode__Arena *ap[2] = {&a[0], &a[1]};
    int fds[2], nfds = 1, reader = fdm.reader && h->reader;

    printf("hello device=%d ipc=%d vmm=%d reader=%d unusable=%s\n", h->cuda_device, h->cuda_ipc,
           h->cuda_vmm, h->reader, h->hbm_unusable ? h->hbm_unusable : "");
    fflush(stdout);
    fds[0] = fdm.memfd;
    if (reader) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fdm.memfd);
        fds[0] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[0] < 0)
            fdm_die("reopen read-only");
    }
    a[0].id = 1; a[0].tier = KVNODE__TIER__TIER_HOST; a[0].device = -1;
    a[0].size = NSLOTS * BB; a[0].fd_index = 0;
    hr.n_arenas = 1;
    fdm.lent_gpu = (fdm.mode == 'v' && h->cuda_vmm) || (fdm.mode == 'i' && h->cuda_ipc);
    if (fdm.lent_gpu) {
        a[1].id = 2; a[1].tier = KVNODE__TIER__TIER_HBM; a[1].device = h->cuda_device;
        a[1].size = fdm.dev_size;
        a[1].fd_index = -1;
        if (fdm.mode == 'v') {
            a[1].cuda_vmm = 1;
            a[1].fd_index = 1;
            fds[nfds++] = fdm.vmm_fd;
        } else {
            a[1].cuda_ipc_handle.data = fdm.ipc;
            a[1].cuda_ipc_handle.len = sizeof fdm.ipc;
        }
        hr.n_arenas = 2;
    }
    hr.version = 1;
    hr.server_version = (char *)"fake-cuda-daemon";
    hr.namespace_id = 1;
    hr.deployment_id = (char *)"m-fake";
    hr.block_bytes = BB;
    hr.arenas = ap;
    hr.max_frame_bytes = 1u << 20;
    hr.max_keys = NSLOTS;
    hr.reader = reader;
    r.id = req->id;
    r.result_case = KVNODE__RESPONSE__RESULT_HELLO;
    r.hello = &hr;
    fdm_reply(&r, fds, (size_t)nfds);
    if (reader)
        close(fds[0]);
}

static void fdm_request(Kvnode__Request *req)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__Location locs[NSLOTS], *lp[NSLOTS];
    Kvnode__GetBeginReply g = KVNODE__GET_BEGIN_REPLY__INIT;
    Kvnode__PutBeginReply p = KVNODE__PUT_BEGIN_REPLY__INIT;
    Kvnode__LeaseReply l = KVNODE__LEASE_REPLY__INIT;
    Kvnode__GetInlineReply gi = KVNODE__GET_INLINE_REPLY__INIT;
    Kvnode__MatchReply m = KVNODE__MATCH_REPLY__INIT;
    Kvnode__PingReply pg = KVNODE__PING_REPLY__INIT;
    ProtobufCBinaryData blobs[NSLOTS];
    size_t i, n = 0, idx;
    int a;

    r.id = req->id;
    r.result_case = (Kvnode__Response__ResultCase)req->op_case;    /* cases are equal */
    switch (req->op_case) {
    case KVNODE__REQUEST__OP_MATCH:
        if (req->match->n_keys > 0 && req->match->keys[0] == KEY_GOING_AWAY) {
            Kvnode__Response ga = KVNODE__RESPONSE__INIT;
            Kvnode__GoingAway gw = KVNODE__GOING_AWAY__INIT;

            gw.unmap_within_ms = 5000;
            gw.reason = (char *)"SIGTERM";
            ga.result_case = KVNODE__RESPONSE__RESULT_GOING_AWAY;
            ga.going_away = &gw;
            fdm_reply(&ga, NULL, 0);
            fdm.going_away = 1;
            return;     /* no reply: the daemon is stopping */
        }
        for (i = 0; i < req->match->n_keys && fdm_find(req->match->keys[i], &a, &idx); i++)
            ;
        m.matched = (uint32_t)i;
        r.match = &m;
        break;
    case KVNODE__REQUEST__OP_GET_BEGIN:
        for (i = 0; i < req->get_begin->n_keys && i < NSLOTS &&
                    fdm_find(req->get_begin->keys[i], &a, &idx); i++) {
            kvnode__location__init(&locs[i]);
            locs[i].arena = (uint32_t)a + 1;
            locs[i].offset = idx * BB;
            locs[i].present = 1;
            lp[i] = &locs[i];
        }
        g.lease = i > 0 ? ++fdm.next_lease : 0;
        g.n_locations = i;
        g.locations = lp;
        r.get_begin = &g;
        break;
    case KVNODE__REQUEST__OP_PUT_BEGIN:
        for (i = 0; i < req->put_begin->n_keys && i < NSLOTS; i++) {
            int want = req->put_begin->tier == KVNODE__TIER__TIER_HBM && fdm.lent_gpu;

            kvnode__location__init(&locs[i]);
            lp[i] = &locs[i];
            if (fdm_find(req->put_begin->keys[i], &a, &idx))
                continue;
            for (idx = 0; idx < NSLOTS && fdm.slots[want][idx].state != 0; idx++)
                ;
            if (idx == NSLOTS)
                fdm_die("arena full");
            fdm.slots[want][idx].key = req->put_begin->keys[i];
            fdm.slots[want][idx].state = 1;
            locs[i].arena = (uint32_t)want + 1;
            locs[i].offset = idx * BB;
            locs[i].present = 1;
            n++;
        }
        p.lease = n > 0 ? ++fdm.next_lease : 0;
        p.n_locations = i;
        p.locations = lp;
        r.put_begin = &p;
        break;
    case KVNODE__REQUEST__OP_PUT_COMMIT:
    case KVNODE__REQUEST__OP_PUT_ABORT:
        /* One lease at a time in these tests: every reserved slot is its. */
        for (a = 0; a < 2; a++)
            for (idx = 0; idx < NSLOTS; idx++) {
                if (fdm.slots[a][idx].state != 1)
                    continue;
                if (req->op_case == KVNODE__REQUEST__OP_PUT_COMMIT) {
                    fdm_read_slot(a, idx, fdm.stored[a][idx]);      /* write-through */
                    fdm.slots[a][idx].state = 2;
                } else {
                    fdm.slots[a][idx].state = 0;
                }
            }
        /* fall through */
    case KVNODE__REQUEST__OP_GET_END:
        r.put_commit = &l;      /* one LeaseReply whatever the case */
        break;
    case KVNODE__REQUEST__OP_GET_INLINE:
        for (i = 0; i < req->get_inline->n_keys && i < NSLOTS &&
                    fdm_find(req->get_inline->keys[i], &a, &idx); i++) {
            blobs[i].data = fdm.stored[a][idx];
            blobs[i].len = BB;
        }
        gi.n_blocks = i;
        gi.blocks = blobs;
        r.get_inline = &gi;
        break;
    case KVNODE__REQUEST__OP_PING:
        pg.nonce = req->ping->nonce;
        r.ping = &pg;
        break;
    default:
        fdm_die("unexpected request");
    }
    fdm_reply(&r, NULL, 0);
}

/* Serve one connection until the client closes it. */
static void fdm_serve(void)
{
    struct pollfd pl = { .fd = fdm.lfd, .events = POLLIN };

    if (poll(&pl, 1, WAIT_MS) <= 0)
        fdm_die("no client");
    fdm.cfd = accept4(fdm.lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fdm.cfd < 0)
        fdm_die("accept");
    fdm.expect_id = 1;
    for (;;) {
        uint8_t hdr[WIRE_HEADER_BYTES], *payload;
        Kvnode__Request *req;
        uint32_t len;

        if (fdm_read_full(hdr, sizeof hdr) < 0)
            break;
        if (wire_frame_len(hdr, 1u << 20, &len) < 0)
            fdm_die("frame");
        payload = malloc(len);
        if (!payload || fdm_read_full(payload, len) < 0)
            fdm_die("short frame");
        req = wire_unpack_request(payload, len);
        free(payload);
        if (!req || req->id != fdm.expect_id++)
            fdm_die("bad request");
        if (req->op_case == KVNODE__REQUEST__OP_HELLO)
            fdm_hello(req);
        else
            fdm_request(req);
        kvnode__request__free_unpacked(req, NULL);
    }
    close(fdm.cfd);
    fdm.cfd = -1;
    /* Slots reserved by the gone connection are free again. */
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < NSLOTS; i++)
            if (fdm.slots[a][i].state == 1)
                fdm.slots[a][i].state = 0;
}

/* Allocate the GPU arena as kvnoded does (VMM with a POSIX fd, or legacy). */
static void fdm_gpu(void)
{
    void *ctx;
    int dev;

    if (cu.cuInit(0) != 0 || cu.cuDeviceGet(&dev, 0) != 0 ||
        cu.cuDevicePrimaryCtxRetain(&ctx, dev) != 0 || cu.cuCtxSetCurrent(ctx) != 0 ||
        cu.cudaSetDevice(0) != 0)
        fdm_die("CUDA init");
    fdm.dev_size = NSLOTS * BB;
    if (fdm.mode == 'v') {
        struct cu_prop prop = { .type = 1, .handle_types = 1, .loc = { 1, dev } };
        struct cu_access acc = { .loc = { 1, dev }, .flags = 3 };
        cu_ptr va = 0;
        size_t gran;

        if (cu.cuMemGetAllocationGranularity(&gran, &prop, 0) != 0)
            fdm_die("granularity");
        fdm.dev_size = (fdm.dev_size + gran - 1) / gran * gran;
        if (cu.cuMemCreate(&fdm.vmm, fdm.dev_size, &prop, 0) != 0 ||
            cu.cuMemExportToShareableHandle(&fdm.vmm_fd, fdm.vmm, 1, 0) != 0 ||
            cu.cuMemAddressReserve(&va, fdm.dev_size, gran, 0, 0) != 0 ||
            cu.cuMemMap(va, fdm.dev_size, 0, fdm.vmm, 0) != 0 ||
            cu.cuMemSetAccess(va, fdm.dev_size, &acc, 1) != 0)
            fdm_die("VMM allocation");
        fdm.dev = (void *)(uintptr_t)va;
    } else if (fdm.mode == 'i') {
        if (cu.cudaMalloc(&fdm.dev, fdm.dev_size) != 0 ||
            cu.cudaIpcGetMemHandle(fdm.ipc, fdm.dev) != 0)
            fdm_die("cudaMalloc / cudaIpcGetMemHandle");
    }
}

/* Free the GPU arena, as a stopping daemon does once its clients closed. */
static void fdm_gpu_free(void)
{
    size_t free_b = 0, total = 0;

    if (fdm.mode == 'v') {
        cu.cuMemUnmap((cu_ptr)(uintptr_t)fdm.dev, fdm.dev_size);
        cu.cuMemAddressFree((cu_ptr)(uintptr_t)fdm.dev, fdm.dev_size);
        cu.cuMemRelease(fdm.vmm);
        close(fdm.vmm_fd);
    } else if (fdm.mode == 'i') {
        cu.cudaFree(fdm.dev);
    }
    if (fdm.mode != 'n' && cu.cuMemGetInfo_v2(&free_b, &total) == 0)
        printf("device-used %zu\n", total - free_b);
}

/* argv: --fake-daemon <socket> <mode v|i|n> <connections> <reader 0|1> */
static int fake_daemon_main(int argc, char **argv)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int conns;

    if (argc < 6)
        return 2;
    memset(&fdm, 0, sizeof fdm);
    fdm.mode = argv[3][0];
    conns = atoi(argv[4]);
    fdm.reader = atoi(argv[5]);
    if (cu_try_load())
        fdm_die(cu_try_load());
    fdm.memfd = memfd_create("fake-host", MFD_CLOEXEC);
    if (fdm.memfd < 0 || ftruncate(fdm.memfd, NSLOTS * BB) < 0)
        fdm_die("memfd");
    fdm.host = mmap(NULL, NSLOTS * BB, PROT_READ | PROT_WRITE, MAP_SHARED, fdm.memfd, 0);
    if (fdm.host == MAP_FAILED)
        fdm_die("mmap");
    if (fdm.mode != 'n')
        fdm_gpu();
    for (int i = 0; i < 4; i++)
        fdm_preload(0, (size_t)i, 100 + i);
    if (fdm.mode != 'n')
        for (int i = 0; i < 4; i++)
            fdm_preload(1, (size_t)i, 200 + i);
    fdm.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", argv[2]);
    if (fdm.lfd < 0 || bind(fdm.lfd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
        listen(fdm.lfd, 4) < 0)
        fdm_die("listen");
    printf("ready\n");
    fflush(stdout);
    while (conns-- > 0)
        fdm_serve();
    if (fdm.going_away)
        fdm_gpu_free();
    printf("done\n");
    fflush(stdout);
    return 0;
}

/* --- the test side --------------------------------------------------------- */

static char self_path[PATH_MAX];    /* this program (not valgrind's, when under it) */
static char state_dir[64];      /* FAKECUDA_DIR of the test */
static char sock_path[108];
static pid_t daemon_pid;
static int daemon_out = -1;

static const kvnode_layout layout = {
    .model = "m", .dtype = "bf16", .block_tokens = 16, .block_bytes = BB, .num_layers = 1,
    .kv_heads = 1, .head_dim = 1, .tp_size = 1, .tp_rank = 0, .extra = NULL,
};

/* Each test: a fresh fake state folder, copies that take COPY_DELAY ms.
 * Set before this process's first CUDA call (the fake reads them once). */
static void setup(void)
{
    snprintf(state_dir, sizeof state_dir, "/tmp/kvnode-fakecuda-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(state_dir));
    snprintf(sock_path, sizeof sock_path, "%s/kvnode.sock", state_dir);
    ck_assert_int_eq(fakecuda_setup(state_dir), 0);    /* the fake's defaults, this folder */
    ck_assert_int_eq(setenv("FAKECUDA_COPY_DELAY_MS", COPY_DELAY, 1), 0);
    unsetenv("KVNODE_CUDA_DEVICE");
}

static void teardown(void)
{
    if (daemon_pid > 0)
        proc_stop(&daemon_pid, SIGKILL, 5000);
    if (daemon_out >= 0)
        close(daemon_out);
    daemon_out = -1;
    test_rmtree(state_dir);
}

/* Start the fake daemon; pidns: its FAKECUDA_PIDNS (NULL: this process's). */
static void daemon_start(char mode, int conns, int reader, const char *pidns)
{
    char m[2] = {mode, 0}, n[16], r[4], ns[64], buf[256];
    const char *argv[] = {self_path, "--fake-daemon", sock_path, m, n, r, NULL};
    const char *env[] = {ns, "FAKECUDA_FAIL=", NULL};
    const char *keys[] = {"ready", NULL};
    struct proc_opts o = { .argv = argv, .env = pidns ? env : env + 1, .out = PROC_PIPE };
    struct proc_pipes pp;

    snprintf(n, sizeof n, "%d", conns);
    snprintf(r, sizeof r, "%d", reader);
    snprintf(ns, sizeof ns, "FAKECUDA_PIDNS=%s", pidns ? pidns : "");
    daemon_pid = proc_spawn(&o, &pp);
    ck_assert_msg(daemon_pid > 0, "fake daemon: %s", proc_error());
    daemon_out = pp.out;
    ck_assert_msg(proc_read_announce(daemon_out, keys, buf, sizeof buf, WAIT_MS) == 0,
                  "fake daemon did not start: %s", buf);
}

/* Wait for the fake daemon to end (the client gone) and return what it said. */
static char *daemon_report(void)
{
    static char out[4096];
    size_t got = 0;
    ssize_t r;
    int status = proc_wait(&daemon_pid, WAIT_MS);

    ck_assert_msg(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "fake daemon status %d", status);
    while (got < sizeof out - 1 && (r = read(daemon_out, out + got, sizeof out - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = 0;
    return out;
}

/* The fake's log of broken CUDA rules: every line must name `allowed` (NULL:
 * the log must be empty). Returns how many lines it has. */
static int assert_violations_only(const char *allowed)
{
    char path[128], line[512];
    int n = 0;
    FILE *f;

    snprintf(path, sizeof path, "%s/violations", state_dir);
    f = fopen(path, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        ck_assert_msg(allowed && strstr(line, allowed), "fake CUDA recorded a violation: %s",
                      line);
    }
    fclose(f);
    return n;
}

static void assert_no_violations(void)
{
    assert_violations_only(NULL);
}

static kvnode_client *connect_dev(unsigned flags)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect_flags(sock_path, &layout, 0, flags, &c);

    ck_assert_msg(rc == 0, "connect: %s: %s", kvnode_strerror(rc), kvnode_connect_error());
    return c;
}

/* Read n bytes of device memory on a fresh non-blocking stream: what a
 * kernel of the engine's own streams would see now. */
static void read_device_fresh(void *host, const void *dev, size_t n)
{
    void *s;

    CU_OK(cu.cudaStreamCreateWithFlags(&s, 1));
    CU_OK(cu.cudaMemcpyAsync(host, dev, n, 4, s));
    CU_OK(cu.cudaStreamSynchronize(s));
    CU_OK(cu.cudaStreamDestroy(s));
}

/* A VMM arena: mapped on the client's device, byte-exact both ways. */
static void vmm_round_trip(const char *pidns)
{
    kvnode_client *c;
    kvnode_key k[2] = {100, 200}, kp[1] = {300};
    kvnode_loc loc[2];
    kvnode_lease lease;
    uint8_t buf[2][BB];
    void *dst[2] = {buf[0], buf[1]};
    size_t got = 0;
    char *rep;

    daemon_start('v', 1, 0, pidns);
    cu_load();
    c = connect_dev(0);
    ck_assert_str_eq(kvnode_last_error(c), "");
    ck_assert_int_eq(kvnode_get_begin(c, k, 2, &lease, loc, &got), 0);
    ck_assert_uint_eq(got, 2);
    ck_assert_int_eq(loc[1].tier, KVNODE_TIER_HBM);
    ck_assert_int_eq(loc[1].device, 0);
    read_device_fresh(buf[1], loc[1].ptr, BB);       /* a device pointer of this process */
    ck_assert(check_pattern(buf[1], BB, 200));
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    memset(buf, 0, sizeof buf);
    ck_assert_int_eq(kvnode_get(c, k, 2, dst, &got), 0);
    ck_assert_uint_eq(got, 2);
    ck_assert(check_pattern(buf[0], BB, 100) && check_pattern(buf[1], BB, 200));
    /* a put into the GPU tier, seen by the daemon's write-through at commit */
    ck_assert_int_eq(kvnode_put_begin(c, kp, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HBM);
    fill_pattern(buf[0], BB, 300);
    CU_OK(cu.cudaMemcpy(loc[0].ptr, buf[0], BB, 4));
    CU_OK(cu.cudaDeviceSynchronize());
    ck_assert_int_eq(kvnode_put_commit(c, lease), 0);
    memset(buf, 0, sizeof buf);
    ck_assert_int_eq(kvnode_get_inline(c, kp, 1, dst, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert(check_pattern(buf[0], BB, 300));
    kvnode_close(c);
    rep = daemon_report();
    ck_assert_msg(strstr(rep, "hello device=0 ipc=1 vmm=1 reader=0 unusable=\n") != NULL,
                  "daemon saw: %s", rep);
    assert_no_violations();
}

START_TEST(test_vmm_arena_mapped)
{
    vmm_round_trip(NULL);
}
END_TEST

/* An engine in a container: another PID namespace. VMM fds cross it. */
START_TEST(test_vmm_arena_from_another_pid_namespace)
{
    vmm_round_trip("container-ns");
}
END_TEST

/* Legacy IPC does not cross PID namespaces: the client connects host-only
 * and says why. (Before issue 28 the whole connect failed with EIO.) */
START_TEST(test_ipc_other_pid_namespace_host_only)
{
    kvnode_client *c;
    kvnode_key k[2] = {100, 101};
    uint8_t buf[2][BB];
    void *dst[2] = {buf[0], buf[1]};
    size_t got = 0;
    const char *e;
    char *rep;

    daemon_start('i', 2, 0, "container-ns");
    cu_load();
    c = connect_dev(0);
    e = kvnode_last_error(c);
    ck_assert_msg(strstr(e, "HBM unusable (") == e && strstr(e, "cudaIpcOpenMemHandle") &&
                  strstr(e, "; connected host-only"), "last error: %s", e);
    ck_assert_int_eq(kvnode_get(c, k, 2, dst, &got), 0);
    ck_assert_uint_eq(got, 2);
    ck_assert(check_pattern(buf[0], BB, 100) && check_pattern(buf[1], BB, 101));
    kvnode_close(c);
    rep = daemon_report();
    ck_assert_msg(strstr(rep, "hello device=0 ipc=1 vmm=1 reader=0 unusable=\n") &&
                  strstr(rep, "hello device=0 ipc=0 vmm=0 reader=0 unusable=cannot open GPU "
                         "arena 2"), "daemon saw: %s", rep);
    /* the one refusal, which a real driver returns in a container too */
    ck_assert_int_eq(assert_violations_only("rule=ipc-pidns"), 1);
}
END_TEST

/* Any failure to map a VMM arena: host-only too, naming the call. */
START_TEST(test_vmm_map_fails_host_only)
{
    kvnode_client *c;
    const char *e;
    char *rep;

    daemon_start('v', 2, 0, NULL);
    ck_assert_int_eq(setenv("FAKECUDA_FAIL", "cuMemMap", 1), 0);   /* this process only */
    cu_load();
    c = connect_dev(0);
    e = kvnode_last_error(c);
    ck_assert_msg(strstr(e, "HBM unusable (cannot map GPU arena 2 (") == e &&
                  strstr(e, "CUDA VMM) on CUDA device 0: cuMemMap: ") &&
                  strstr(e, "; connected host-only"), "last error: %s", e);
    ck_assert_int_eq(kvnode_ping(c), 0);
    kvnode_close(c);
    rep = daemon_report();
    ck_assert_msg(strstr(rep, "hello device=0 ipc=0 vmm=0 reader=0 unusable=cannot map GPU arena "
                         "2 ("), "daemon saw: %s", rep);
    assert_no_violations();
}
END_TEST

/* get_batch(DEVICE) returns with dst complete, whichever stream the engine
 * reads it on (before: cudaMemcpy from pageable host memory, which returns
 * before the device write lands, and the lease ended at once). */
START_TEST(test_get_batch_device_complete)
{
    kvnode_client *c;
    kvnode_key kh[3] = {100, 101, 102}, kg[2] = {200, 201};
    uint8_t *d, buf[BB];
    void *dst[3];
    size_t got = 0, i;

    daemon_start('v', 1, 0, NULL);
    cu_load();
    c = connect_dev(0);
    CU_OK(cu.cudaMalloc((void **)&d, 3 * BB));
    CU_OK(cu.cudaMemset(d, 0, 3 * BB));
    CU_OK(cu.cudaDeviceSynchronize());
    for (i = 0; i < 3; i++)
        dst[i] = d + i * BB;
    /* host blocks: host to device */
    ck_assert_int_eq(kvnode_get_batch(c, kh, 3, dst, KVNODE_BATCH_DEVICE, &got), 0);
    ck_assert_uint_eq(got, 3);
    for (i = 0; i < 3; i++) {
        read_device_fresh(buf, dst[i], BB);
        ck_assert_msg(check_pattern(buf, BB, kh[i]), "block %zu of dst is stale", i);
    }
    /* GPU blocks: device to device */
    CU_OK(cu.cudaMemset(d, 0, 3 * BB));
    CU_OK(cu.cudaDeviceSynchronize());
    ck_assert_int_eq(kvnode_get_batch(c, kg, 2, dst, KVNODE_BATCH_DEVICE, &got), 0);
    ck_assert_uint_eq(got, 2);
    for (i = 0; i < 2; i++) {
        read_device_fresh(buf, dst[i], BB);
        ck_assert_msg(check_pattern(buf, BB, kg[i]), "GPU block %zu of dst is stale", i);
    }
    CU_OK(cu.cudaFree(d));
    kvnode_close(c);
    daemon_report();
    assert_no_violations();
}
END_TEST

/* The _stream calls are ordered after the caller's work on its stream: a
 * put of device blocks the caller is still writing stores the new bytes,
 * and put_commit_stream commits what the caller's copy into a lent GPU
 * slot wrote. */
START_TEST(test_stream_calls_ordered_after_caller)
{
    kvnode_client *c;
    kvnode_key kp[1] = {400}, kc[1] = {401};
    kvnode_loc loc[1];
    kvnode_lease lease;
    uint8_t *d, src_host[BB], buf[BB];
    void *s, *dst[1] = {buf};
    const void *src[1];
    size_t got = 0;

    daemon_start('v', 1, 0, NULL);
    cu_load();
    c = connect_dev(0);
    CU_OK(cu.cudaStreamCreateWithFlags(&s, 1));
    CU_OK(cu.cudaMalloc((void **)&d, BB));
    CU_OK(cu.cudaMemset(d, 0, BB));
    CU_OK(cu.cudaDeviceSynchronize());
    fill_pattern(src_host, BB, 400);
    CU_OK(cu.cudaMemcpyAsync(d, src_host, BB, 4, s));     /* lands 200 ms later */
    src[0] = d;
    ck_assert_int_eq(kvnode_put_batch_stream(c, kp, 1, src, KVNODE_BATCH_DEVICE, s), 0);
    ck_assert_int_eq(kvnode_get_inline(c, kp, 1, dst, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert_msg(check_pattern(buf, BB, 400), "put_batch_stream stored stale bytes");

    ck_assert_int_eq(kvnode_put_begin(c, kc, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HBM);
    fill_pattern(src_host, BB, 401);
    CU_OK(cu.cudaMemcpyAsync(loc[0].ptr, src_host, BB, 4, s));
    ck_assert_int_eq(kvnode_put_commit_stream(c, lease, s), 0);
    ck_assert_int_eq(kvnode_get_inline(c, kc, 1, dst, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert_msg(check_pattern(buf, BB, 401), "put_commit_stream committed stale bytes");

    /* get_end_stream: the lease outlives the caller's reads */
    ck_assert_int_eq(kvnode_get_begin(c, kc, 1, &lease, loc, &got), 0);
    CU_OK(cu.cudaMemcpyAsync(d, loc[0].ptr, BB, 4, s));
    ck_assert_int_eq(kvnode_get_end_stream(c, lease, s), 0);
    read_device_fresh(buf, d, BB);
    ck_assert(check_pattern(buf, BB, 401));
    CU_OK(cu.cudaFree(d));
    CU_OK(cu.cudaStreamDestroy(s));
    kvnode_close(c);
    daemon_report();
    assert_no_violations();
}
END_TEST

/* A reader's host mapping is read-only: CUDA registers it only with
 * cudaHostRegisterReadOnly (before: EIO, and a violation). */
START_TEST(test_reader_pins_read_only)
{
    kvnode_client *c;

    daemon_start('n', 1, 1, NULL);
    cu_load();
    c = connect_dev(KVNODE_CONNECT_READER);
    ck_assert(kvnode_is_reader(c));
    ck_assert_msg(kvnode_pin_host(c) == 0, "pin_host: %s", kvnode_last_error(c));
    kvnode_close(c);
    daemon_report();
    assert_no_violations();
}
END_TEST

/* GoingAway: calls fail with ESHUTDOWN, and the client lets the GPU memory
 * go before the connection closes, without kvnode_close: the daemon then
 * frees it with no process still mapping it (legacy: no free-while-mapped;
 * VMM: the device's memory back to nothing). */
START_TEST(test_going_away_releases_gpu_memory)
{
    const char mode = _i == 0 ? 'i' : 'v';
    kvnode_client *c;
    kvnode_key k[1] = {KEY_GOING_AWAY};
    size_t matched;
    char *rep;

    daemon_start(mode, 1, 0, NULL);
    cu_load();
    c = connect_dev(0);
    ck_assert_str_eq(kvnode_last_error(c), "");
    ck_assert_int_eq(kvnode_match(c, k, 1, &matched), -KVNODE_ESHUTDOWN);
    ck_assert_msg(strstr(kvnode_last_error(c), "daemon stopping") != NULL, "error: %s",
                  kvnode_last_error(c));
    rep = daemon_report();      /* before kvnode_close: the daemon has freed */
    ck_assert_msg(strstr(rep, "device-used 0\n") != NULL, "daemon saw: %s", rep);
    assert_no_violations();
    ck_assert_int_eq(kvnode_ping(c), -KVNODE_ECLOSED);
    kvnode_close(c);
    assert_no_violations();
}
END_TEST

static Suite *cuda_suite(void)
{
    Suite *s = suite_create("client_cuda");
    TCase *tc = tcase_create("fakecuda");

    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_vmm_arena_mapped);
    tcase_add_test(tc, test_vmm_arena_from_another_pid_namespace);
    tcase_add_test(tc, test_ipc_other_pid_namespace_host_only);
    tcase_add_test(tc, test_vmm_map_fails_host_only);
    tcase_add_test(tc, test_get_batch_device_complete);
    tcase_add_test(tc, test_stream_calls_ordered_after_caller);
    tcase_add_test(tc, test_reader_pins_read_only);
    tcase_add_loop_test(tc, test_going_away_releases_gpu_memory, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--fake-daemon") == 0)
        return fake_daemon_main(argc, argv);
    /* valgrind answers this readlink with the program it runs, where an exec
     * of /proc/self/exe would start valgrind's own tool. */
    ssize_t len = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (len <= 0)
        return EXIT_FAILURE;
    self_path[len] = 0;
    return fakecuda_run_suite(cuda_suite());
}
