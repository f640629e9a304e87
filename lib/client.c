/* client: libkvnode, the engine side of the kvnode protocol (see kvnode.h).
 *
 * This file owns a client's life: connect, the HELLO exchange, the arena
 * mappings, CUDA, prefault, pin_host, close, and the error messages. The
 * requests after HELLO go through client_async.c (see client_internal.h for
 * who owns what).
 *
 * One client = one unix-socket connection. The HELLO reply brings the arena
 * fds (SCM_RIGHTS); they are mapped once and locations are turned into
 * pointers inside those mappings. Any event that may leave the byte stream
 * out of step (timeout, EOF, oversized or undecodable frame, a reply id no
 * request is waiting for) marks the client dead: later calls fail with
 * -KVNODE_ECLOSED. A reader (KVNODE_CONNECT_READER, confirmed by the HELLO
 * reply) is passed read-only fds and maps them PROT_READ.
 *
 * GPU memory (HBM tier): a client that declares a CUDA device looks for a
 * CUDA runtime and driver at run time (cudart.c, never linked) and tells the
 * daemon whether it can open CUDA IPC handles and import VMM fds. HBM arenas
 * then come as an fd to map (the daemon's simulated devices: host memory,
 * used like the host arena), or as device memory opened or mapped by
 * client_gpu.c. When that fails, the client does not fail: it closes the
 * connection and connects again host-only, telling the daemon why
 * (HelloRequest.hbm_unusable), and kvnode_last_error says so. Device memory
 * is never touched by the CPU.
 *
 * Error messages are kept per thread (a thread sees the message of its own
 * last failed call on a client) and per client (the last of any thread). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "prefault.h"

static _Thread_local char client_connect_err[CLIENT_MSG_MAX];

/* This thread's last message and the client it is about (its serial too:
 * a new client may get the address of a closed one). */
static _Thread_local struct {
    const kvnode_client *owner;
    uint64_t serial;
    char msg[CLIENT_MSG_MAX];
} client_thread_err;
static uint64_t client_serials;

static int client_thread_err_is(const kvnode_client *c)
{
    return client_thread_err.owner == c && client_thread_err.serial == c->serial;
}

void client_seterr(kvnode_client *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(client_thread_err.msg, sizeof client_thread_err.msg, fmt, ap);
    va_end(ap);
    client_thread_err.owner = c;
    client_thread_err.serial = c->serial;
    if (c->lock_ready)
        pthread_mutex_lock(&c->lock);
    memcpy(c->err, client_thread_err.msg, sizeof c->err);
    if (c->lock_ready)
        pthread_mutex_unlock(&c->lock);
}

const char *client_errmsg(const kvnode_client *c)
{
    return client_thread_err_is(c) ? client_thread_err.msg : "";
}

/* Forget this thread's message about c (connected, or being freed). */
static void client_clear_thread_err(const kvnode_client *c)
{
    if (client_thread_err_is(c)) {
        client_thread_err.owner = NULL;
        client_thread_err.msg[0] = '\0';
    }
}

/* Undo the host arenas' mappings and registrations (the GPU ones are
 * client_gpu_free's). */
static void client_release_arenas(kvnode_client *c)
{
    const char *step;
    int prev = -1, entered = 0;
    size_t i;

    for (i = 0; i < c->n_arenas; i++) {
        struct client_arena *a = &c->arenas[i];

        if (!a->base || a->gpu || !a->pinned)
            continue;
        if (!entered) {
            entered = 1;
            (void)client_cuda_enter(c, &prev, &step);   /* best effort */
        }
        if (c->rt.host_unregister(a->base) != CUDART_SUCCESS)
            client_cuda_failed(c);
        a->pinned = 0;
    }
    if (entered)
        client_cuda_leave(c, prev);
    client_gpu_free(c);
    for (i = 0; i < c->n_arenas; i++) {
        struct client_arena *a = &c->arenas[i];

        if (a->base && !a->gpu)
            munmap(a->base, (size_t)a->size);
        a->base = NULL;
    }
}

/* --- connect --------------------------------------------------------------- */

static int client_env_timeout(void)
{
    const char *s = getenv("KVNODE_TIMEOUT_MS");
    char *end;
    long v;

    if (!s || !*s)
        return CLIENT_DEFAULT_TIMEOUT;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v <= 0 || v > INT_MAX)
        return CLIENT_DEFAULT_TIMEOUT;
    return (int)v;
}

#define CLIENT_BUSY_POLL_US     50u
#define CLIENT_BUSY_POLL_MAX_US 10000u

/* The spin bound: $KVNODE_BUSY_POLL_US when it is a number in 0..10000
 * (else ignored), otherwise the flag's default. */
static unsigned client_busy_poll(unsigned flags)
{
    const char *s = getenv("KVNODE_BUSY_POLL_US");
    char *end;
    long v;

    if (s && *s) {
        errno = 0;
        v = strtol(s, &end, 10);
        if (!errno && !*end && v >= 0 && v <= (long)CLIENT_BUSY_POLL_MAX_US)
            return (unsigned)v;
    }
    return (flags & KVNODE_CONNECT_BUSY_POLL) ? CLIENT_BUSY_POLL_US : 0;
}

unsigned kvnode_busy_poll_us(const kvnode_client *c)
{
    return c ? c->busy_poll_us : 0;
}

static int client_open_socket(kvnode_client *c, const char *path, int64_t deadline)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };

    if (strlen(path) >= sizeof sa.sun_path) {
        client_seterr(c, "connect %s: socket path too long", path);
        return -KVNODE_ECONNECT;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0) {
        client_seterr(c, "socket: %s", strerror(errno));
        return -KVNODE_EIO;
    }
    for (;;) {
        int err;
        socklen_t elen = sizeof err;

        if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN) {
            /* Unix sockets say EAGAIN while the listen backlog is full: retry. */
            if (client_remaining_ms(deadline) == 0)
                break;
            poll(NULL, 0, 10);
            continue;
        }
        if (errno != EINPROGRESS)
            break;
        if (client_wait(c, POLLOUT, deadline, "connect") < 0) {
            client_seterr(c, "connect %s: timed out after %d ms", path, c->timeout_ms);
            return -KVNODE_ECONNECT;
        }
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0)
            break;
        if (err == 0)
            return 0;
        errno = err;
        break;
    }
    client_seterr(c, "connect %s: %s", path,
                  errno == EAGAIN ? "timed out (listen backlog full)" : strerror(errno));
    return -KVNODE_ECONNECT;
}

static int client_validate_layout(kvnode_client *c, const kvnode_layout *l)
{
    if (!l->model) {
        client_seterr(c, "layout.model is NULL");
        return -KVNODE_EINVAL;
    }
    if (!l->dtype) {
        client_seterr(c, "layout.dtype is NULL");
        return -KVNODE_EINVAL;
    }
    return 0;
}

/* Check the HELLO reply, map the arenas whose fds came with it and open
 * those lent as GPU memory. 0; 1 when GPU memory cannot be used here
 * (c->hbm_unusable says why); or a negative code. On failure client_free
 * (or client_reset) undoes it all. */
static int client_setup(kvnode_client *c, const Kvnode__HelloReply *h, const kvnode_layout *layout)
{
    size_t i, j, nfd = 0;

    if (h->version != WIRE_PROTOCOL_VERSION) {
        client_seterr(c, "protocol: daemon chose version %" PRIu32 ", library speaks %u",
                      h->version, WIRE_PROTOCOL_VERSION);
        return -KVNODE_EPROTO;
    }
    if (h->max_frame_bytes == 0 || h->max_frame_bytes > WIRE_FRAME_LIMIT) {
        client_seterr(c, "protocol: HELLO reply max_frame_bytes %" PRIu32 " out of range",
                      h->max_frame_bytes);
        return -KVNODE_EPROTO;
    }
    if (h->reader && !c->reader_asked) {
        client_seterr(c, "protocol: the daemon holds this client to reading, which it did not ask for");
        return -KVNODE_EPROTO;
    }
    /* A reader's fds are read-only: a writable mapping of them fails. */
    c->reader = h->reader && layout;
    if (layout) {
        if (h->block_bytes != layout->block_bytes) {
            client_seterr(c, "protocol: daemon block_bytes %" PRIu64 " differs from the layout's %"
                          PRIu64, h->block_bytes, layout->block_bytes);
            return -KVNODE_EPROTO;
        }
        if (h->max_keys == 0) {
            client_seterr(c, "protocol: HELLO reply max_keys is 0");
            return -KVNODE_EPROTO;
        }
    }
    for (i = 0; i < h->n_arenas; i++) {
        const Kvnode__Arena *a = h->arenas[i];

        if (a->tier != KVNODE__TIER__TIER_HOST && a->tier != KVNODE__TIER__TIER_HBM) {
            client_seterr(c, "protocol: arena %" PRIu32 " has tier %d", a->id, (int)a->tier);
            return -KVNODE_EPROTO;
        }
        if (a->size == 0 || a->size > (uint64_t)SIZE_MAX || a->fd_index < -1 ||
            a->fd_index >= (int32_t)c->n_rx_fds) {
            client_seterr(c, "protocol: arena %" PRIu32 " (size %" PRIu64 ", fd_index %" PRId32
                          ") is invalid with %zu fds passed", a->id, a->size, a->fd_index,
                          c->n_rx_fds);
            return -KVNODE_EPROTO;
        }
        if (a->tier == KVNODE__TIER__TIER_HBM && a->device < 0) {
            client_seterr(c, "protocol: GPU arena %" PRIu32 " has device %" PRId32, a->id,
                          a->device);
            return -KVNODE_EPROTO;
        }
        if (a->cuda_ipc_handle.len > 0) {
            if (a->cuda_ipc_handle.len != CUDART_IPC_HANDLE_BYTES) {
                client_seterr(c, "protocol: arena %" PRIu32 " has a cuda_ipc_handle of %zu bytes, "
                              "not %d", a->id, a->cuda_ipc_handle.len, CUDART_IPC_HANDLE_BYTES);
                return -KVNODE_EPROTO;
            }
            if (a->tier != KVNODE__TIER__TIER_HBM || a->fd_index >= 0) {
                client_seterr(c, "protocol: arena %" PRIu32 " has a cuda_ipc_handle but %s",
                              a->id, a->fd_index >= 0 ? "also an fd" : "is host memory");
                return -KVNODE_EPROTO;
            }
        }
        if (a->cuda_vmm && (a->tier != KVNODE__TIER__TIER_HBM || a->fd_index < 0 ||
                            a->cuda_ipc_handle.len > 0)) {
            client_seterr(c, "protocol: arena %" PRIu32 " is lent as CUDA VMM memory but %s",
                          a->id, a->tier != KVNODE__TIER__TIER_HBM ? "is host memory"
                          : a->fd_index < 0 ? "has no fd" : "also has a cuda_ipc_handle");
            return -KVNODE_EPROTO;
        }
        for (j = 0; j < i; j++) {
            if (h->arenas[j]->id == a->id ||
                (a->fd_index >= 0 && h->arenas[j]->fd_index == a->fd_index)) {
                client_seterr(c, "protocol: arena %" PRIu32 " repeats an id or fd_index", a->id);
                return -KVNODE_EPROTO;
            }
        }
        if (a->fd_index >= 0)
            nfd++;
    }
    if (nfd != c->n_rx_fds) {
        client_seterr(c, "protocol: HELLO reply names %zu arena fds but %zu were passed", nfd,
                      c->n_rx_fds);
        return -KVNODE_EPROTO;
    }
    if (h->n_arenas > 0) {
        c->arenas = calloc(h->n_arenas, sizeof *c->arenas);
        if (!c->arenas) {
            client_seterr(c, "out of memory");
            return -KVNODE_ENOMEM;
        }
    }
    for (i = 0; i < h->n_arenas; i++) {
        const Kvnode__Arena *a = h->arenas[i];
        struct client_arena *ca = &c->arenas[c->n_arenas++];
        struct stat st;
        void *p;
        int fd;

        ca->id = a->id;
        ca->tier = (int)a->tier;
        ca->device = a->device;
        ca->size = a->size;
        if (a->cuda_ipc_handle.len > 0 || a->cuda_vmm) {
            int rc = a->cuda_vmm ? client_gpu_open_vmm(c, a, ca, c->rx_fds[a->fd_index])
                                 : client_gpu_open_ipc(c, a, ca);
            if (rc != 0)
                return rc;      /* 1: unusable here, the caller reconnects host-only */
            c->gpu_mapped = 1;
            continue;
        }
        if (a->fd_index < 0)
            continue;
        fd = c->rx_fds[a->fd_index];
        if (fstat(fd, &st) < 0) {
            client_seterr(c, "fstat of arena %" PRIu32 " fd: %s", a->id, strerror(errno));
            return -KVNODE_EIO;
        }
        /* Touching a mapping past the end of a file raises SIGBUS: refuse it now. */
        if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < a->size) {
            client_seterr(c, "protocol: arena %" PRIu32 " claims %" PRIu64 " bytes but its file "
                          "has %jd", a->id, a->size, (intmax_t)st.st_size);
            return -KVNODE_EPROTO;
        }
        p = mmap(NULL, (size_t)a->size, c->reader ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED,
                 fd, 0);
        if (p == MAP_FAILED) {
            client_seterr(c, "mmap of arena %" PRIu32 " (%" PRIu64 " bytes): %s", a->id, a->size,
                          strerror(errno));
            return -KVNODE_EIO;
        }
        ca->base = p;
    }
    client_drop_fds(c);     /* mappings keep the memory; the fds are not needed */
    c->send_max = h->max_frame_bytes;
    c->recv_max = h->max_frame_bytes + CLIENT_RECV_HEADROOM;
    c->max_keys = h->max_keys;
    c->max_reserved = h->max_reserved_bytes;
    c->read_ttl_ms = h->read_lease_ttl_ms;
    c->write_ttl_ms = h->write_lease_ttl_ms;
    c->check_words = h->check_words ? 1 : 0;
    c->per_key = h->per_key ? 1 : 0;
    c->namespace_id = h->namespace_id;
    snprintf(c->deployment_id, sizeof c->deployment_id, "%s", h->deployment_id ? h->deployment_id : "");
    c->block_bytes = layout ? h->block_bytes : 0;
    return 0;
}

static int client_hello(kvnode_client *c, const kvnode_layout *layout)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__HelloRequest hello = KVNODE__HELLO_REQUEST__INIT;
    Kvnode__Layout lo = KVNODE__LAYOUT__INIT;
    Kvnode__Response *resp;
    int rc;

    hello.min_version = WIRE_PROTOCOL_VERSION;
    hello.max_version = WIRE_PROTOCOL_VERSION;
    hello.client_name = program_invocation_short_name && *program_invocation_short_name
                            ? program_invocation_short_name : (char *)"libkvnode";
    hello.cuda_device = c->cuda_device;
    /* After a GPU arena could not be mapped: host-only, and why. */
    hello.cuda_ipc = c->have_rt && !c->hbm_unusable[0];
    hello.cuda_vmm = c->have_drv && !c->hbm_unusable[0];
    hello.hbm_unusable = c->hbm_unusable;
    hello.reader = c->reader_asked;
    /* The GPU's bus id lets the daemon find it whatever this process's
     * CUDA_VISIBLE_DEVICES numbers it as. */
    char bus[32] = "";
    if (c->have_rt && c->cuda_device >= 0 && c->rt.pci_bus_id &&
        c->rt.pci_bus_id(bus, (int)sizeof bus, c->cuda_device) != CUDART_SUCCESS) {
        bus[0] = '\0';
        client_cuda_failed(c);
    }
    bus[sizeof bus - 1] = '\0';
    hello.cuda_pci_bus_id = bus;
    if (layout) {
        lo.model = (char *)(uintptr_t)layout->model;
        lo.dtype = (char *)(uintptr_t)layout->dtype;
        lo.block_tokens = layout->block_tokens;
        lo.block_bytes = layout->block_bytes;
        lo.num_layers = layout->num_layers;
        lo.kv_heads = layout->kv_heads;
        lo.head_dim = layout->head_dim;
        lo.tp_size = layout->tp_size;
        lo.tp_rank = layout->tp_rank;
        lo.extra = layout->extra ? (char *)(uintptr_t)layout->extra : (char *)"";
        lo.revision = c->revision;
        hello.layout = &lo;
    }
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &hello;
    rc = client_call_direct(c, &req, KVNODE__RESPONSE__RESULT_HELLO, &resp);
    if (rc < 0)
        return rc;
    rc = client_setup(c, resp->hello, layout);
    wire_free_response(resp);
    client_drop_fds(c);
    return rc;
}

/* Undo a connection whose GPU arenas could not be used, so that the
 * client can connect again: arenas, fds, socket, the stream's state. */
static void client_reset(kvnode_client *c)
{
    client_drop_fds(c);
    client_release_arenas(c);
    free(c->arenas);
    c->arenas = NULL;
    c->n_arenas = 0;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->next_id = 1;
    c->send_max = CLIENT_PRE_HELLO_MAX;
    c->recv_max = CLIENT_PRE_HELLO_MAX;
    c->rx_len = c->rx_off = 0;
    c->sock_blocking = c->rcvtimeo_ms = 0;
}

static void client_free(kvnode_client *c)
{
    /* A clean close leaves no lease behind: the deferred lease ends and
     * commits are waited for (within the client's timeout) before the
     * connection goes. */
    if (c->lock_ready)
        (void)client_flush(c);
    /* First: no thread may copy into or out of the arenas once they go. */
    client_async_stop(c);
    prefault_stop(c->prefault);     /* before the mappings it walks go */
    client_drop_fds(c);
    client_release_arenas(c);
    free(c->arenas);
    free(c->leases);
    if (c->fd >= 0)
        close(c->fd);
    free(c->rx_buf);
    free(c->tx_buf);
    client_clear_thread_err(c);
    free(c);
}

const char *kvnode_connect_error(void)
{
    return client_connect_err;
}

/* KVNODE_CUDA_DEVICE: unset or empty: -1; "-1": -1; else a decimal ordinal
 * >= 0 with nothing around it. Anything else is an error. */
static int client_env_device(int *device)
{
    const char *s = getenv("KVNODE_CUDA_DEVICE");
    long v = 0;
    size_t i;

    *device = -1;
    if (!s || !*s || strcmp(s, "-1") == 0)
        return 0;
    for (i = 0; s[i]; i++) {
        if (s[i] < '0' || s[i] > '9' || v > (INT_MAX - (s[i] - '0')) / 10) {
            v = -1;
            break;
        }
        v = v * 10 + (s[i] - '0');
    }
    if (v < 0) {
        snprintf(client_connect_err, sizeof client_connect_err,
                 "KVNODE_CUDA_DEVICE=\"%.64s%s\" is not a CUDA device ordinal (an integer >= 0, "
                 "or -1 for none)", s, strlen(s) > 64 ? "..." : "");
        return -KVNODE_EINVAL;
    }
    *device = (int)v;
    return 0;
}

int kvnode_connect(const char *socket_path, const kvnode_layout *layout, kvnode_client **out)
{
    int device = -1, rc;

    if (out)
        *out = NULL;
    /* Observers lend no memory: the variable is for engines. */
    if (layout && out) {
        rc = client_env_device(&device);
        if (rc < 0)
            return rc;
    }
    return kvnode_connect_device(socket_path, layout, device, out);
}

int kvnode_connect_device(const char *socket_path, const kvnode_layout *layout, int cuda_device,
                          kvnode_client **out)
{
    return kvnode_connect_flags(socket_path, layout, cuda_device, 0, out);
}

#define CLIENT_CONNECT_KNOWN (KVNODE_CONNECT_READER | KVNODE_CONNECT_PREFAULT | KVNODE_CONNECT_BUSY_POLL)

static size_t client_host_arenas(const kvnode_client *c);

int kvnode_connect_flags(const char *socket_path, const kvnode_layout *layout, int cuda_device,
                         unsigned flags, kvnode_client **out)
{
    return kvnode_connect_revision(socket_path, layout, NULL, cuda_device, flags, out);
}

int kvnode_connect_revision(const char *socket_path, const kvnode_layout *layout, const char *revision,
                            int cuda_device, unsigned flags, kvnode_client **out)
{
    kvnode_client *c;
    int64_t deadline;
    int rc;

    if (!out) {
        snprintf(client_connect_err, sizeof client_connect_err, "kvnode_connect: out is NULL");
        return -KVNODE_EINVAL;
    }
    *out = NULL;
    if (cuda_device < -1) {
        snprintf(client_connect_err, sizeof client_connect_err,
                 "kvnode_connect_device: cuda_device %d is not a CUDA device ordinal (>= 0, or -1 "
                 "for none)", cuda_device);
        return -KVNODE_EINVAL;
    }
    if (flags & ~(unsigned)CLIENT_CONNECT_KNOWN) {
        snprintf(client_connect_err, sizeof client_connect_err,
                 "kvnode_connect_flags: unknown flags 0x%x (this libkvnode knows 0x%x: "
                 "KVNODE_CONNECT_READER, KVNODE_CONNECT_PREFAULT, KVNODE_CONNECT_BUSY_POLL)",
                 flags & ~(unsigned)CLIENT_CONNECT_KNOWN, (unsigned)CLIENT_CONNECT_KNOWN);
        return -KVNODE_EINVAL;
    }
    if (revision && strlen(revision) >= sizeof c->revision) {
        snprintf(client_connect_err, sizeof client_connect_err,
                 "kvnode_connect_revision: revision is %zu bytes long; the limit is %zu",
                 strlen(revision), sizeof c->revision - 1);
        return -KVNODE_EINVAL;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(client_connect_err, sizeof client_connect_err, "out of memory");
        return -KVNODE_ENOMEM;
    }
    if (revision && layout)
        snprintf(c->revision, sizeof c->revision, "%s", revision);
    c->serial = __atomic_add_fetch(&client_serials, 1, __ATOMIC_RELAXED);
    c->fd = -1;
    c->next_id = 1;
    c->event_fd = -1;
    c->wake_fd = -1;
    c->timeout_ms = client_env_timeout();
    c->observer = layout == NULL;
    c->cuda_device = layout ? cuda_device : -1;     /* observers lend no memory */
    c->reader_asked = layout && (flags & KVNODE_CONNECT_READER);
    c->busy_poll_us = client_busy_poll(flags);
    c->send_max = CLIENT_PRE_HELLO_MAX;
    c->recv_max = CLIENT_PRE_HELLO_MAX;
    if (!socket_path || !*socket_path) {
        socket_path = getenv("KVNODE_SOCKET");
        if (!socket_path || !*socket_path)
            socket_path = CLIENT_DEFAULT_SOCKET;
    }
    /* A runtime (and driver) found now decides whether the daemon may lend
     * this client GPU memory as CUDA IPC handles or VMM fds (else only
     * mapped, simulated devices). */
    if (c->cuda_device >= 0)
        client_gpu_load(c);
    deadline = client_now_ms() + c->timeout_ms;
    rc = client_async_init(c);
    if (rc == 0 && layout)
        rc = client_validate_layout(c, layout);
    if (rc == 0)
        rc = client_open_socket(c, socket_path, deadline);
    if (rc == 0)
        rc = client_hello(c, layout);
    if (rc > 0) {
        /* GPU memory is unusable here (another PID namespace, a MIG slice,
         * a driver too old...): host memory still is. Connect again without
         * it, telling the daemon why. */
        client_reset(c);
        deadline = client_now_ms() + c->timeout_ms;
        rc = client_open_socket(c, socket_path, deadline);
        if (rc == 0)
            rc = client_hello(c, layout);
        if (rc > 0) {
            client_seterr(c, "protocol: the daemon lent GPU memory again to a client that "
                          "reconnected host-only");
            rc = -KVNODE_EPROTO;
        }
    }
    if (rc == 0)
        rc = client_async_start(c);
    if (rc < 0) {
        snprintf(client_connect_err, sizeof client_connect_err, "%s", c->err);
        client_free(c);
        return rc;
    }
    /* Best effort: a client without a host arena has nothing to populate. */
    if ((flags & KVNODE_CONNECT_PREFAULT) && client_host_arenas(c) > 0 &&
        kvnode_prefault(c, 0) < 0) {
        snprintf(client_connect_err, sizeof client_connect_err, "%s", c->err);
        client_free(c);
        return -KVNODE_EIO;
    }
    client_clear_thread_err(c);
    if (c->hbm_unusable[0])
        client_seterr(c, "HBM unusable (%s); connected host-only", c->hbm_unusable);
    client_clear_thread_err(c);     /* the client's message, not a failure of this thread */
    *out = c;
    return 0;
}

void kvnode_close(kvnode_client *c)
{
    if (c)
        client_free(c);
}

uint64_t kvnode_block_bytes(const kvnode_client *c)
{
    return c ? c->block_bytes : 0;
}

int kvnode_cuda_device(const kvnode_client *c)
{
    return c ? c->cuda_device : -1;
}

int kvnode_is_reader(const kvnode_client *c)
{
    return c ? c->reader : 0;
}

int kvnode_has_check_words(const kvnode_client *c)
{
    return c ? c->check_words : 0;
}

int kvnode_has_per_key(const kvnode_client *c)
{
    return c ? c->per_key : 0;
}

static size_t client_host_arenas(const kvnode_client *c)
{
    size_t i, n = 0;

    for (i = 0; i < c->n_arenas; i++)
        if (c->arenas[i].tier == KVNODE_TIER_HOST && c->arenas[i].base && !c->arenas[i].gpu)
            n++;
    return n;
}

int kvnode_prefault(kvnode_client *c, unsigned flags)
{
    struct prefault_range ranges[CLIENT_MAX_FDS];
    size_t i, n = 0;
    int state;

    if (!c)
        return -KVNODE_EINVAL;
    if (flags & ~(unsigned)KVNODE_PREFAULT_WAIT) {
        client_seterr(c, "prefault: unknown flags 0x%x (this libkvnode knows 0x%x: "
                      "KVNODE_PREFAULT_WAIT)", flags & ~(unsigned)KVNODE_PREFAULT_WAIT,
                      (unsigned)KVNODE_PREFAULT_WAIT);
        return -KVNODE_EINVAL;
    }
    if (!c->prefault) {
        /* GPU arenas are left alone: IPC memory is not the CPU's to touch,
         * and simulated devices stand in for it. */
        for (i = 0; i < c->n_arenas && n < CLIENT_MAX_FDS; i++) {
            const struct client_arena *a = &c->arenas[i];

            if (a->tier == KVNODE_TIER_HOST && a->base && !a->gpu) {
                ranges[n].base = a->base;
                ranges[n].size = a->size;
                n++;
            }
        }
        if (n == 0) {
            client_seterr(c, "prefault: the daemon passed this client no host arena to map (an "
                          "observer, or a client that only uses the inline calls)");
            return -KVNODE_ESTATE;
        }
        c->prefault = prefault_start(ranges, n, (c->reader ? 0u : (unsigned)PREFAULT_WRITE) |
                                     ((flags & KVNODE_PREFAULT_WAIT) ? (unsigned)PREFAULT_WAIT : 0u));
        if (!c->prefault) {
            client_seterr(c, "prefault: cannot start its thread: %s", strerror(errno));
            return -KVNODE_EIO;
        }
    } else if (flags & KVNODE_PREFAULT_WAIT) {
        /* A background walk runs or ran: wait for it by finishing it here. */
        prefault_join(c->prefault);
    }
    state = prefault_state(c->prefault, NULL, NULL);
    if (state < 0) {
        client_seterr(c, "%s", prefault_error(c->prefault));
        return -KVNODE_EIO;
    }
    return 0;
}

int kvnode_prefault_progress(const kvnode_client *c, uint64_t *done, uint64_t *total)
{
    int state;

    if (done)
        *done = 0;
    if (total)
        *total = 0;
    if (!c || !c->prefault)
        return 0;
    state = prefault_state(c->prefault, done, total);
    return state < 0 ? -KVNODE_EIO : state;
}

int kvnode_pin_host(kvnode_client *c)
{
    const struct client_arena *bad = NULL;
    const char *step = "cudaHostRegister";
    size_t i, nhost = 0;
    int prev, err;
    char text[192];

    if (!c)
        return -KVNODE_EINVAL;
    for (i = 0; i < c->n_arenas; i++)
        if (c->arenas[i].tier == KVNODE_TIER_HOST && c->arenas[i].base)
            nhost++;
    if (nhost == 0) {
        client_seterr(c, "pin_host: the daemon passed this client no host arena");
        return -KVNODE_ESTATE;
    }
    if (!c->have_rt) {
        if (cudart_load(&c->rt, c->rt_why, sizeof c->rt_why) < 0) {
            client_seterr(c, "pin_host: %s", c->rt_why);
            return -KVNODE_ESTATE;
        }
        c->have_rt = 1;
    }
    err = client_cuda_enter(c, &prev, &step);
    for (i = 0; err == CUDART_SUCCESS && i < c->n_arenas; i++) {
        struct client_arena *a = &c->arenas[i];

        if (a->tier != KVNODE_TIER_HOST || !a->base || a->pinned)
            continue;
        step = "cudaHostRegister";
        /* A reader's mapping is PROT_READ: CUDA registers it only read-only. */
        err = c->rt.host_register(a->base, (size_t)a->size, CUDART_HOST_REGISTER_PORTABLE |
                                  (c->reader ? CUDART_HOST_REGISTER_READ_ONLY : 0u));
        if (err == CUDART_SUCCESS)
            a->pinned = 2;      /* by this call: undone if a later one fails */
        else
            bad = a;
    }
    if (err != CUDART_SUCCESS)
        client_cuda_failed(c);
    for (i = 0; i < c->n_arenas; i++) {
        struct client_arena *a = &c->arenas[i];

        if (a->pinned == 2 && err != CUDART_SUCCESS &&
            c->rt.host_unregister(a->base) != CUDART_SUCCESS)
            client_cuda_failed(c);
        if (a->pinned == 2)
            a->pinned = err == CUDART_SUCCESS;
    }
    client_cuda_leave(c, prev);
    if (err == CUDART_SUCCESS)
        return 0;
    cudart_error_text(&c->rt, err, text, sizeof text);
    if (bad)
        client_seterr(c, "pin_host: %s of host arena %" PRIu32 " (%" PRIu64 " bytes) failed: %s",
                      step, bad->id, bad->size, text);
    else
        client_seterr(c, "pin_host: %s (CUDA device %d) failed: %s", step, c->cuda_device, text);
    return -KVNODE_EIO;
}

const char *kvnode_last_error(const kvnode_client *c)
{
    if (!c)
        return client_connect_err;
    /* This thread's own last failure on c; else the last of any thread. */
    return client_thread_err_is(c) ? client_thread_err.msg : c->err;
}

void kvnode_set_timeout(kvnode_client *c, int timeout_ms)
{
    if (c && timeout_ms > 0) {
        pthread_mutex_lock(&c->lock);
        c->timeout_ms = timeout_ms;
        pthread_mutex_unlock(&c->lock);
    }
}

