/* client_gpu: the CUDA side of a libkvnode client (see client_internal.h).
 *
 * Owns the runtime and driver tables a client found at connect (cudart.c),
 * the GPU arenas lent to it and their release, the client's own stream, and
 * every copy that touches device memory.
 *
 * GPU arenas come two ways: a legacy cudaIpcMemHandle_t (opened once per
 * process, shared by its connections: cudart_ipc_acquire), or a CUDA VMM
 * allocation exported as a POSIX fd (Arena.cuda_vmm), imported here with
 * cuMemImportFromShareableHandle and mapped on the client's device (address
 * reserved at the allocation granularity, cuMemMap, cuMemSetAccess
 * read-write, the handle released at once so that unmapping frees it).
 * Only the fd form crosses PID namespaces (engines in containers). Whatever
 * fails here is not an error of the connection: the caller reconnects
 * host-only and says why (client.c).
 *
 * The arenas are released when the connection ends, not only at
 * kvnode_close: the daemon may be stopping (GoingAway) and needs its GPU
 * memory unmapped everywhere before it frees it, or be gone and restarted
 * with a new allocation of the same size. A client lent device memory runs
 * its I/O thread from the connect on, so the end is seen while the engine is
 * idle; the thread that sees it (or the last call still copying) releases,
 * and only then shuts the socket down: the daemon learns that the memory is
 * no longer mapped here when it sees the connection close.
 *
 * Copies: device memory is copied with cudaMemcpyAsync on a stream, never
 * the legacy default stream, and that stream is synchronised before the
 * call returns (so before the lease that covers the block ends): the
 * caller's stream for the _stream calls, else the client's own non-blocking
 * stream, created on first use. The device form of the gathered calls
 * (copy_device.c) queues its pieces through a client_copier and stages
 * through the client's pinned buffer (client_stage_get). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"

/* --- runtime helpers ------------------------------------------------------- */

/* After a failed runtime call: clear the thread's last CUDA error, so that
 * the engine's own cudaGetLastError() does not report ours. */
void client_cuda_failed(kvnode_client *c)
{
    if (c->rt.get_last_error)
        (void)c->rt.get_last_error();
}

/* Make the client's CUDA device current on this thread (when it declared
 * one: IPC mappings and pinned memory belong to that device's context).
 * *prev is what client_cuda_leave restores (-1: nothing). 0, or the
 * cudaError_t with *step naming the failed call. */
int client_cuda_enter(kvnode_client *c, int *prev, const char **step)
{
    int err;

    *prev = -1;
    if (c->cuda_device < 0)
        return CUDART_SUCCESS;
    *step = "cudaGetDevice";
    err = c->rt.get_device(prev);
    if (err == CUDART_SUCCESS && *prev != c->cuda_device) {
        *step = "cudaSetDevice";
        err = c->rt.set_device(c->cuda_device);
        if (err == CUDART_SUCCESS)
            return 0;
    }
    *prev = -1;     /* failed, or already current: nothing to restore */
    if (err != CUDART_SUCCESS)
        client_cuda_failed(c);
    return err;
}

void client_cuda_leave(kvnode_client *c, int prev)
{
    if (prev >= 0 && c->rt.set_device(prev) != CUDART_SUCCESS)
        client_cuda_failed(c);
}

void client_gpu_load(kvnode_client *c)
{
    c->have_rt = cudart_load(&c->rt, c->rt_why, sizeof c->rt_why) == 0;
    /* VMM arenas need the runtime too: every copy of them goes through it. */
    if (c->have_rt)
        c->have_drv = cudrv_load(&c->drv, c->drv_why, sizeof c->drv_why) == 0;
    else
        snprintf(c->drv_why, sizeof c->drv_why, "%s", c->rt_why);
}

/* --- driver context -------------------------------------------------------- */

/* Make the device's primary context (the runtime's) current for driver
 * calls, retaining it on first use (released by client_gpu_free). */
static int client_drv_enter(kvnode_client *c, const char **step)
{
    int err;

    if (!c->drv_ctx) {
        *step = "cuDeviceGet";
        err = c->drv.device_get(&c->drv_dev, c->cuda_device);
        if (err != CUDRV_SUCCESS)
            return err;
        *step = "cuDevicePrimaryCtxRetain";
        err = c->drv.primary_ctx_retain(&c->drv_ctx, c->drv_dev);
        if (err != CUDRV_SUCCESS) {
            c->drv_ctx = NULL;
            return err;
        }
    }
    *step = "cuCtxPushCurrent";
    return c->drv.ctx_push(c->drv_ctx);
}

static void client_drv_leave(kvnode_client *c)
{
    void *ctx;

    (void)c->drv.ctx_pop(&ctx);
}

/* --- opening GPU arenas ---------------------------------------------------- */

/* Say why arena a cannot be used here (c->hbm_unusable) and return 1: the
 * caller reconnects host-only. verb/kind: "open"/"IPC", "map"/"VMM". */
static int client_gpu_unusable(kvnode_client *c, const Kvnode__Arena *a, const char *verb,
                               const char *kind, const char *step, const char *text)
{
    snprintf(c->hbm_unusable, sizeof c->hbm_unusable, "cannot %s GPU arena %" PRIu32
             " (device %" PRId32 ", %" PRIu64 " bytes, CUDA %s) on CUDA device %d: %s: %s",
             verb, a->id, a->device, a->size, kind, c->cuda_device, step, text);
    return 1;
}

int client_gpu_open_ipc(kvnode_client *c, const Kvnode__Arena *a, struct client_arena *ca)
{
    cudart_ipc_handle h;
    const char *step = "cudaIpcOpenMemHandle";
    char text[192];
    void *p = NULL;
    int prev, err;

    if (!c->have_rt || c->hbm_unusable[0]) {
        client_seterr(c, "protocol: arena %" PRIu32 " (device %" PRId32 ") is lent as CUDA IPC "
                      "memory, but this client told the daemon it cannot open CUDA IPC handles: %s",
                      a->id, a->device, c->cuda_device < 0 ? "it declared no CUDA device"
                      : c->hbm_unusable[0] ? "it reconnected host-only" : c->rt_why);
        return -KVNODE_EPROTO;
    }
    memcpy(h.reserved, a->cuda_ipc_handle.data, sizeof h.reserved);
    err = client_cuda_enter(c, &prev, &step);
    if (err == CUDART_SUCCESS) {
        step = "cudaIpcOpenMemHandle";
        err = cudart_ipc_acquire(&c->rt, &h, CUDART_IPC_LAZY_PEER_ACCESS, &p);
        if (err != CUDART_SUCCESS)
            client_cuda_failed(c);
        else if (!p)
            (void)snprintf(text, sizeof text, "it returned a NULL pointer");
    }
    client_cuda_leave(c, prev);
    if (err != CUDART_SUCCESS || !p) {
        if (err != CUDART_SUCCESS)
            cudart_error_text(&c->rt, err, text, sizeof text);
        return client_gpu_unusable(c, a, "open", "IPC", step, text);
    }
    ca->base = p;
    ca->gpu = CLIENT_GPU_IPC;
    return 0;
}

int client_gpu_open_vmm(kvnode_client *c, const Kvnode__Arena *a, struct client_arena *ca, int fd)
{
    struct cudrv_alloc_prop prop;
    struct cudrv_access_desc access;
    const char *step = "cuInit";
    size_t gran = 0, size = (size_t)a->size;
    cudrv_handle handle = 0;
    cudrv_ptr va = 0;
    int err, reserved = 0, imported = 0, mapped = 0;
    char text[192];

    if (!c->have_drv || c->hbm_unusable[0]) {
        client_seterr(c, "protocol: arena %" PRIu32 " (device %" PRId32 ") is lent as CUDA VMM "
                      "memory, but this client told the daemon it cannot import it: %s", a->id,
                      a->device, c->cuda_device < 0 ? "it declared no CUDA device"
                      : c->hbm_unusable[0] ? "it reconnected host-only" : c->drv_why);
        return -KVNODE_EPROTO;
    }
    err = client_drv_enter(c, &step);
    if (err != CUDRV_SUCCESS) {
        return client_gpu_unusable(c, a, "map", "VMM", step,
                                   cudrv_error_text(&c->drv, err, text, sizeof text));
    }
    memset(&prop, 0, sizeof prop);
    prop.type = CUDRV_ALLOCATION_PINNED;
    prop.requested_handle_types = CUDRV_HANDLE_POSIX_FD;
    prop.location.type = CUDRV_LOCATION_DEVICE;
    prop.location.id = c->drv_dev;
    step = "cuMemGetAllocationGranularity";
    err = c->drv.granularity(&gran, &prop, CUDRV_GRANULARITY_MINIMUM);
    if (err == CUDRV_SUCCESS && (gran == 0 || size % gran != 0)) {
        client_drv_leave(c);
        snprintf(c->hbm_unusable, sizeof c->hbm_unusable, "cannot map GPU arena %" PRIu32
                 " (CUDA VMM): its %" PRIu64 " bytes are not a multiple of CUDA device %d's "
                 "allocation granularity of %zu bytes", a->id, a->size, c->cuda_device, gran);
        return 1;
    }
    if (err == CUDRV_SUCCESS) {
        step = "cuMemImportFromShareableHandle";
        err = c->drv.import(&handle, (void *)(uintptr_t)fd, CUDRV_HANDLE_POSIX_FD);
        imported = err == CUDRV_SUCCESS;
    }
    if (err == CUDRV_SUCCESS) {
        step = "cuMemAddressReserve";
        err = c->drv.address_reserve(&va, size, gran, 0, 0);
        reserved = err == CUDRV_SUCCESS;
    }
    if (err == CUDRV_SUCCESS) {
        step = "cuMemMap";
        err = c->drv.map(va, size, 0, handle, 0);
        mapped = err == CUDRV_SUCCESS;
    }
    if (err == CUDRV_SUCCESS) {
        memset(&access, 0, sizeof access);
        access.location.type = CUDRV_LOCATION_DEVICE;
        access.location.id = c->drv_dev;
        access.flags = CUDRV_ACCESS_READWRITE;
        step = "cuMemSetAccess";
        err = c->drv.set_access(va, size, &access, 1);
    }
    if (err != CUDRV_SUCCESS)
        cudrv_error_text(&c->drv, err, text, sizeof text);
    /* The mapping keeps the memory: unmapping it then frees this process's share. */
    if (imported)
        (void)c->drv.release(handle);
    if (err != CUDRV_SUCCESS && mapped)
        (void)c->drv.unmap(va, size);
    if (err != CUDRV_SUCCESS && reserved)
        (void)c->drv.address_free(va, size);
    client_drv_leave(c);
    if (err != CUDRV_SUCCESS)
        return client_gpu_unusable(c, a, "map", "VMM", step, text);
    ca->base = (uint8_t *)(uintptr_t)va;
    ca->gpu = CLIENT_GPU_VMM;
    return 0;
}

/* --- releasing them -------------------------------------------------------- */

/* Close or unmap every GPU arena still open. Only one thread at a time. */
static void client_gpu_release_arenas(kvnode_client *c)
{
    const char *step;
    int prev = -1, entered = 0, drv = 0;
    size_t i;

    for (i = 0; i < c->n_arenas; i++) {
        struct client_arena *a = &c->arenas[i];

        if (!a->base || !a->gpu || a->gpu_released)
            continue;
        if (a->gpu == CLIENT_GPU_IPC) {
            if (!entered) {
                entered = 1;
                (void)client_cuda_enter(c, &prev, &step);   /* best effort */
            }
            if (cudart_ipc_release(&c->rt, a->base) != CUDART_SUCCESS)
                client_cuda_failed(c);
        } else {
            if (!drv && client_drv_enter(c, &step) != CUDRV_SUCCESS)
                continue;   /* no context: nothing can be unmapped (the driver is gone) */
            drv = 1;
            (void)c->drv.unmap((cudrv_ptr)(uintptr_t)a->base, (size_t)a->size);
            (void)c->drv.address_free((cudrv_ptr)(uintptr_t)a->base, (size_t)a->size);
        }
        a->gpu_released = 1;
    }
    if (drv)
        client_drv_leave(c);
    if (entered)
        client_cuda_leave(c, prev);
}

void client_gpu_end(kvnode_client *c)
{
    pthread_mutex_lock(&c->lock);
    if (!c->dead || !c->gpu_mapped || c->gpu_users > 0 || c->gpu_releasing) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    c->gpu_releasing = 1;
    pthread_mutex_unlock(&c->lock);
    client_gpu_release_arenas(c);
    pthread_mutex_lock(&c->lock);
    c->gpu_mapped = 0;
    c->gpu_releasing = 0;
    /* Now the daemon may see the end (client_kill_locked left the socket
     * open): it frees the memory once every mapping of it is gone. */
    if (c->fd >= 0)
        shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&c->lock);
}

/* The client's staging buffer unregistered (when CUDA pinned it) and freed. */
static void client_stage_drop(kvnode_client *c)
{
    const char *step;
    int prev;

    if (!c->stage)
        return;
    if (c->stage_pinned && client_cuda_enter(c, &prev, &step) == CUDART_SUCCESS) {
        if (c->rt.host_unregister(c->stage) != CUDART_SUCCESS)
            client_cuda_failed(c);
        client_cuda_leave(c, prev);
    }
    free(c->stage);
    c->stage = NULL;
    c->stage_bytes = 0;
    c->stage_pinned = 0;
}

void client_gpu_free(kvnode_client *c)
{
    const char *step;
    int prev;

    if (c->stream) {
        if (client_cuda_enter(c, &prev, &step) == CUDART_SUCCESS) {
            if (c->rt.stream_destroy(c->stream) != CUDART_SUCCESS)
                client_cuda_failed(c);
            client_cuda_leave(c, prev);
        }
        c->stream = NULL;
    }
    client_stage_drop(c);
    client_gpu_release_arenas(c);
    c->gpu_mapped = 0;
    if (c->drv_ctx) {
        (void)c->drv.primary_ctx_release(c->drv_dev);
        c->drv_ctx = NULL;
    }
}

/* A copying call is about to use the GPU arenas: 0, or -KVNODE_ECLOSED when
 * the connection has ended (they are released or about to be). */
static int client_gpu_hold(kvnode_client *c)
{
    int ok;

    pthread_mutex_lock(&c->lock);
    ok = c->gpu_mapped && !c->dead;
    if (ok)
        c->gpu_users++;
    pthread_mutex_unlock(&c->lock);
    return ok ? 0 : client_check_alive(c) < 0 ? -KVNODE_ECLOSED : -KVNODE_ESTATE;
}

static void client_gpu_drop(kvnode_client *c)
{
    pthread_mutex_lock(&c->lock);
    c->gpu_users--;
    pthread_mutex_unlock(&c->lock);
    client_gpu_end(c);      /* the connection may have ended meanwhile */
}

/* --- copies ---------------------------------------------------------------- */

/* The arena whose memory holds p, or NULL. */
static const struct client_arena *client_arena_at(const kvnode_client *c, const void *p)
{
    uintptr_t v = (uintptr_t)p;
    size_t i;

    for (i = 0; i < c->n_arenas; i++) {
        const struct client_arena *a = &c->arenas[i];

        if (a->base && v >= (uintptr_t)a->base && v - (uintptr_t)a->base < a->size)
            return a;
    }
    return NULL;
}

/* The client's own stream (non-blocking: never ordered with the legacy
 * default stream), created on first use with the client's device current. */
static int client_own_stream(kvnode_client *c, void **stream)
{
    void *made = NULL;
    int err;

    pthread_mutex_lock(&c->lock);
    *stream = c->stream;
    pthread_mutex_unlock(&c->lock);
    if (*stream)
        return CUDART_SUCCESS;
    /* Made outside the lock (a first CUDA call may take long); a thread
     * that lost the race destroys its own. */
    err = c->rt.stream_create(&made, CUDART_STREAM_NON_BLOCKING);
    if (err != CUDART_SUCCESS)
        return err;
    pthread_mutex_lock(&c->lock);
    if (!c->stream) {
        c->stream = made;
        made = NULL;
    }
    *stream = c->stream;
    pthread_mutex_unlock(&c->lock);
    if (made && c->rt.stream_destroy(made) != CUDART_SUCCESS)
        client_cuda_failed(c);
    return CUDART_SUCCESS;
}

int client_copy_blocks(kvnode_client *c, const kvnode_loc *locs, size_t n, void *const *user,
                       int to_slots, int user_device, size_t first, const char *what,
                       const struct client_stream *st)
{
    const struct client_arena *a = NULL;
    size_t i, bb = (size_t)c->block_bytes, queued = 0;
    const char *step = "cudaMemcpyAsync";
    int prev = -1, entered = 0, held = 0, err = CUDART_SUCCESS, rc;
    void *stream = st && st->callers ? st->stream : NULL;
    char text[192];

    for (i = 0; i < n; i++) {
        void *slot = locs[i].ptr;

        if (!slot)
            continue;
        a = client_arena_at(c, slot);
        if (!user_device && (!a || !a->gpu)) {
            if (to_slots)
                memcpy(slot, user[i], bb);
            else
                memcpy(user[i], slot, bb);
            continue;
        }
        if (a && a->gpu && !held) {
            rc = client_gpu_hold(c);
            if (rc < 0) {
                client_seterr(c, "%s: GPU arena %" PRIu32 " was released: the connection ended",
                              what, a->id);
                err = -1;
                break;
            }
            held = 1;
        }
        if (!entered) {
            entered = 1;
            err = client_cuda_enter(c, &prev, &step);
            if (err == CUDART_SUCCESS && !(st && st->callers)) {
                step = "cudaStreamCreateWithFlags";
                err = client_own_stream(c, &stream);
            }
            if (err != CUDART_SUCCESS) {
                client_cuda_failed(c);
                break;
            }
        }
        step = "cudaMemcpyAsync";
        err = to_slots ? c->rt.copy_async(slot, user[i], bb, CUDART_MEMCPY_DEFAULT, stream)
                       : c->rt.copy_async(user[i], slot, bb, CUDART_MEMCPY_DEFAULT, stream);
        if (err != CUDART_SUCCESS) {
            client_cuda_failed(c);
            break;
        }
        queued++;
    }
    /* Whatever was queued completes before the lease can end, even after a
     * failure: no copy may touch a block the daemon has taken back. */
    if (queued > 0) {
        int serr = c->rt.stream_sync(stream);

        if (serr != CUDART_SUCCESS) {
            client_cuda_failed(c);
            if (err == CUDART_SUCCESS) {
                err = serr;
                step = "cudaStreamSynchronize";
                i = n;
            }
        }
    }
    if (entered)
        client_cuda_leave(c, prev);
    if (held)
        client_gpu_drop(c);
    if (err == CUDART_SUCCESS)
        return 0;
    if (err < 0)
        return -KVNODE_ECLOSED;
    cudart_error_text(&c->rt, err, text, sizeof text);
    if (i == n)
        client_seterr(c, "%s: %s after the copies of blocks %zu..%zu failed: %s", what, step,
                      first, first + n - 1, text);
    else if (!a || !a->gpu)
        client_seterr(c, "%s: %s of block %zu (to or from the caller's GPU memory, device %d) "
                      "failed: %s", what, step, first + i, c->cuda_device, text);
    else
        client_seterr(c, "%s: %s of block %zu (GPU arena %" PRIu32 ", device %d) failed: %s",
                      what, step, first + i, a->id, a->device, text);
    return -KVNODE_EIO;
}

int client_stream_wait(kvnode_client *c, void *stream, const char *what)
{
    const char *step = "cudaStreamSynchronize";
    char text[192];
    int prev, err;

    if (!c->have_rt) {
        client_seterr(c, "%s: waiting for a CUDA stream needs a client with a CUDA device and a "
                      "CUDA runtime: %s", what, c->cuda_device < 0 ? "it declared no CUDA "
                      "device (kvnode_connect_device)" : c->rt_why);
        return -KVNODE_ESTATE;
    }
    err = client_cuda_enter(c, &prev, &step);
    if (err == CUDART_SUCCESS) {
        step = "cudaStreamSynchronize";
        err = c->rt.stream_sync(stream);
        if (err != CUDART_SUCCESS)
            client_cuda_failed(c);
        client_cuda_leave(c, prev);
    }
    if (err == CUDART_SUCCESS)
        return 0;
    client_seterr(c, "%s: %s of the caller's stream (CUDA device %d) failed: %s", what, step,
                  c->cuda_device, cudart_error_text(&c->rt, err, text, sizeof text));
    return -KVNODE_EIO;
}

/* --- copies of pieces (the device form of the gathered calls) --------------- */

int client_copier_open(kvnode_client *c, struct client_copier *k, void *stream, int gpu_blocks,
                       const char *what)
{
    int rc;

    memset(k, 0, sizeof *k);
    k->c = c;
    k->stream = stream;
    k->prev = -1;
    k->what = what;
    k->step = "cudaMemcpyAsync";
    if (gpu_blocks) {
        rc = client_gpu_hold(c);
        if (rc < 0) {
            client_seterr(c, "%s: the GPU arenas were released: the connection ended", what);
            return -KVNODE_ECLOSED;
        }
        k->held = 1;
    }
    k->err = client_cuda_enter(c, &k->prev, &k->step);
    k->entered = 1;
    if (k->err != CUDART_SUCCESS) {
        client_cuda_failed(c);
        return client_copier_close(k);
    }
    return 0;
}

int client_copier_queue(struct client_copier *k, void *dst, const void *src, size_t len)
{
    if (k->err != CUDART_SUCCESS)
        return -KVNODE_EIO;
    k->step = "cudaMemcpyAsync";
    k->err = k->c->rt.copy_async(dst, src, len, CUDART_MEMCPY_DEFAULT, k->stream);
    if (k->err != CUDART_SUCCESS) {
        client_cuda_failed(k->c);
        return -KVNODE_EIO;
    }
    k->queued++;
    return 0;
}

int client_copier_sync(struct client_copier *k)
{
    int err;

    if (k->queued == 0)
        return k->err == CUDART_SUCCESS ? 0 : -KVNODE_EIO;
    k->queued = 0;
    /* even after a failure: nothing queued may outlive the lease it copies */
    err = k->c->rt.stream_sync(k->stream);
    if (err != CUDART_SUCCESS) {
        client_cuda_failed(k->c);
        if (k->err == CUDART_SUCCESS) {
            k->err = err;
            k->step = "cudaStreamSynchronize";
        }
    }
    return k->err == CUDART_SUCCESS ? 0 : -KVNODE_EIO;
}

int client_copier_close(struct client_copier *k)
{
    kvnode_client *c = k->c;
    char text[192];

    (void)client_copier_sync(k);
    if (k->entered)
        client_cuda_leave(c, k->prev);
    k->entered = 0;
    if (k->held)
        client_gpu_drop(c);
    k->held = 0;
    if (k->err == CUDART_SUCCESS)
        return 0;
    client_seterr(c, "%s: %s (CUDA device %d) failed: %s", k->what, k->step, c->cuda_device,
                  cudart_error_text(&c->rt, k->err, text, sizeof text));
    return -KVNODE_EIO;
}

/* Pinned host memory for staged copies: the client's buffer when no other
 * call has it (grown to `bytes`, registered portable; a buffer CUDA would
 * not register is kept pageable: copies from it are slower, not wrong), else
 * one of this call's own (pageable). client_stage_put gives it back. */
void *client_stage_get(kvnode_client *c, size_t bytes, int *owned)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t size = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    const char *step;
    void *p = NULL;
    int mine, prev;

    pthread_mutex_lock(&c->lock);
    mine = !c->stage_busy;
    c->stage_busy |= mine;
    pthread_mutex_unlock(&c->lock);
    *owned = !mine;
    if (!mine)
        return malloc(bytes ? bytes : 1);
    if (c->stage_bytes >= size)
        return c->stage;
    client_stage_drop(c);
    if (posix_memalign(&p, (size_t)page, size) != 0) {
        client_stage_put(c, NULL, 0);
        return NULL;
    }
    c->stage = p;
    c->stage_bytes = size;
    if (client_cuda_enter(c, &prev, &step) == CUDART_SUCCESS) {
        c->stage_pinned = c->rt.host_register(p, size, CUDART_HOST_REGISTER_PORTABLE) ==
                          CUDART_SUCCESS;
        if (!c->stage_pinned)
            client_cuda_failed(c);
        client_cuda_leave(c, prev);
    }
    return p;
}

void client_stage_put(kvnode_client *c, void *p, int owned)
{
    if (owned) {
        free(p);
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->stage_busy = 0;
    pthread_mutex_unlock(&c->lock);
}
