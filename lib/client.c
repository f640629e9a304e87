/* client: libkvnode, the engine side of the kvnode protocol (see kvnode.h).
 *
 * One client = one unix-socket connection, used synchronously: a call sends
 * one request and reads frames until its response arrives. The HELLO reply
 * brings the arena fds (SCM_RIGHTS); they are mapped once and locations are
 * turned into pointers inside those mappings. Any event that may leave the
 * byte stream out of step (timeout, EOF, oversized or undecodable frame,
 * unexpected response id) marks the client dead: later calls fail with
 * -KVNODE_ECLOSED instead of reading someone else's reply. A reader
 * (KVNODE_CONNECT_READER, confirmed by the HELLO reply) is passed read-only
 * fds and maps them PROT_READ.
 *
 * GPU memory (HBM tier): a client that declares a CUDA device looks for a
 * CUDA runtime at run time (cudart.c, never linked) and tells the daemon
 * whether it can open CUDA IPC handles. HBM arenas then come either as an
 * fd to map (the daemon's simulated devices: host memory, used like the
 * host arena) or as a cudaIpcMemHandle_t opened here into a device pointer.
 * Device memory is never touched by the CPU: the copying calls move it with
 * cudaMemcpy. */
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

#include "cudart.h"
#include "kvnode.h"
#include "prefault.h"
#include "wire.h"

#define CLIENT_DEFAULT_SOCKET   "/run/kvnode/kvnode.sock"
#define CLIENT_DEFAULT_TIMEOUT  10000
#define CLIENT_PRE_HELLO_MAX    (1u << 20)   /* receive/send limit until HELLO says more */
#define CLIENT_RECV_HEADROOM    4096u        /* reply envelope beyond max_frame_bytes */
#define CLIENT_MAX_FDS          16
#define CLIENT_MSG_MAX          512
/* Conservative framing overheads used to size inline chunks. */
#define CLIENT_INLINE_OVERHEAD  64u          /* id, oneof tag/length, field headers */
#define CLIENT_INLINE_PER_BLOCK 24u          /* key varint + blob tag + blob length */
/* Inline frames aim at this size even when the daemon allows more: buffers
 * this small are recycled by malloc instead of being mapped fresh (and
 * page-faulted) for every frame, which is what made big frames slow. */
#define CLIENT_INLINE_TARGET    (4u << 20)

struct client_arena {
    uint32_t id;
    int tier;
    int device;
    uint64_t size;
    uint8_t *base;      /* NULL when the daemon passed neither fd nor IPC handle */
    int ipc;            /* base is a device pointer (cudaIpcOpenMemHandle), not a mapping */
    int pinned;         /* base is registered with cudaHostRegister (kvnode_pin_host) */
};

/* Memory reused from call to call, so that large replies (inline GET) do
 * not pay for fresh, page-faulting allocations every time: the receive
 * buffer, and a bump allocator protobuf-c unpacks replies into. */
struct client_scratch {
    uint8_t *buf;
    size_t cap, used;
    size_t overflow;            /* bytes that did not fit (malloc'ed) */
    unsigned live;              /* unpacked replies not yet freed */
};

struct kvnode_client {
    int fd;
    int timeout_ms;
    uint64_t next_id;
    int observer;
    int dead;                   /* stream unusable: every call -> ECLOSED */
    uint64_t block_bytes;
    uint32_t send_max;          /* daemon's max_frame_bytes */
    uint32_t recv_max;          /* send_max + headroom */
    uint32_t max_keys;
    uint32_t namespace_id;
    struct client_arena *arenas;
    size_t n_arenas;
    int rx_fds[CLIENT_MAX_FDS]; /* fds received with the current frame */
    size_t n_rx_fds;
    int rx_ctrunc;              /* the kernel dropped some passed fds */
    char dead_msg[CLIENT_MSG_MAX];
    char err[CLIENT_MSG_MAX];
    uint8_t *rx_buf, *tx_buf;   /* frame buffers reused across calls */
    size_t rx_cap, tx_cap;
    struct client_scratch scratch;
    ProtobufCAllocator unpack_alloc;
    int cuda_device;            /* declared in HELLO; -1: none */
    int reader_asked;           /* HELLO declared the client a reader (KVNODE_CONNECT_READER) */
    int reader;                 /* the daemon confirmed it: arenas are mapped PROT_READ */
    int have_rt;                /* rt holds a CUDA runtime */
    struct cudart rt;
    char rt_why[256];           /* why there is no runtime (when have_rt is 0) */
    struct prefault *prefault;  /* kvnode_prefault's walk; stopped before the unmap */
};

/* Largest scratch kept between calls; bigger replies use malloc. */
#define CLIENT_SCRATCH_MAX (16u << 20)

static void *client_scratch_alloc(void *data, size_t size)
{
    struct client_scratch *s = data;
    size_t at = (s->used + 15u) & ~(size_t)15u;

    if (s->buf && at <= s->cap && size <= s->cap - at) {
        s->used = at + size;
        return s->buf + at;
    }
    s->overflow += size + 16u;
    return malloc(size ? size : 1);
}

static void client_scratch_free(void *data, void *ptr)
{
    struct client_scratch *s = data;

    if (s->buf && (uint8_t *)ptr >= s->buf && (uint8_t *)ptr < s->buf + s->cap)
        return;   /* reclaimed wholesale when the last reply is freed */
    free(ptr);
}

/* Free a reply; when none is left, rewind the scratch and grow it to fit
 * what the last replies needed. */
static void client_response_free(kvnode_client *c, Kvnode__Response *resp)
{
    struct client_scratch *s = &c->scratch;

    if (!resp)
        return;
    kvnode__response__free_unpacked(resp, &c->unpack_alloc);
    if (s->live > 0)
        s->live--;
    if (s->live > 0)
        return;
    if (s->overflow > 0) {
        size_t want = s->used + s->overflow;
        if (want <= CLIENT_SCRATCH_MAX) {
            uint8_t *nb = malloc(want);
            if (nb) {
                free(s->buf);
                s->buf = nb;
                s->cap = want;
            }
        }
    }
    s->used = 0;
    s->overflow = 0;
}

static _Thread_local char client_connect_err[CLIENT_MSG_MAX];

static void client_seterr(kvnode_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void client_seterr(kvnode_client *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

/* Record why the stream is unusable; the message is also the call's error. */
static void client_kill(kvnode_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void client_kill(kvnode_client *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->dead_msg, sizeof c->dead_msg, fmt, ap);
    va_end(ap);
    c->dead = 1;
    snprintf(c->err, sizeof c->err, "%s", c->dead_msg);
}

/* --- time ------------------------------------------------------------------ */

static int64_t client_now_ms(void)
{
    struct timespec ts;

    /* CLOCK_MONOTONIC cannot fail on Linux with a valid pointer. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int client_remaining_ms(int64_t deadline)
{
    int64_t left = deadline - client_now_ms();

    if (left <= 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* Wait for `events` on c->fd until the deadline. 0 ready, or a negative code
 * (connection marked dead). */
static int client_wait(kvnode_client *c, short events, int64_t deadline, const char *what)
{
    for (;;) {
        struct pollfd p = { .fd = c->fd, .events = events };
        int left = client_remaining_ms(deadline);
        int n;

        if (left == 0) {
            client_kill(c, "timed out after %d ms waiting to %s", c->timeout_ms, what);
            return -KVNODE_ETIMEDOUT;
        }
        n = poll(&p, 1, left);
        if (n > 0)
            return 0;   /* readable/writable or error: the I/O call will tell */
        if (n < 0 && errno != EINTR) {
            client_kill(c, "poll: %s", strerror(errno));
            return -KVNODE_EIO;
        }
    }
}

/* --- frame I/O --------------------------------------------------------------- */

static int client_send_all(kvnode_client *c, const uint8_t *buf, size_t len, int64_t deadline)
{
    while (len > 0) {
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = client_wait(c, POLLOUT, deadline, "send a request");
            if (rc < 0)
                return rc;
            continue;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            client_kill(c, "daemon closed the connection");
            return -KVNODE_ECLOSED;
        }
        client_kill(c, "send: %s", n < 0 ? strerror(errno) : "wrote nothing");
        return -KVNODE_EIO;
    }
    return 0;
}

/* Keep fds passed with a frame; close what does not fit. */
static void client_take_fds(kvnode_client *c, struct msghdr *mh)
{
    struct cmsghdr *cm;

    if (mh->msg_flags & MSG_CTRUNC)
        c->rx_ctrunc = 1;
    for (cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        size_t nfd, i;

        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
            cm->cmsg_len < CMSG_LEN(0))
            continue;
        nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (i = 0; i < nfd; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (c->n_rx_fds < CLIENT_MAX_FDS) {
                c->rx_fds[c->n_rx_fds++] = fd;
            } else {
                c->rx_ctrunc = 1;
                close(fd);
            }
        }
    }
}

static void client_drop_fds(kvnode_client *c)
{
    size_t i;

    for (i = 0; i < c->n_rx_fds; i++)
        close(c->rx_fds[i]);
    c->n_rx_fds = 0;
    c->rx_ctrunc = 0;
}

/* Read exactly len bytes with recvmsg(), collecting passed fds. */
static int client_recv_all(kvnode_client *c, uint8_t *buf, size_t len, int64_t deadline)
{
    while (len > 0) {
        union {
            char buf[CMSG_SPACE(sizeof(int) * CLIENT_MAX_FDS)];
            struct cmsghdr align;
        } cbuf;
        struct iovec iov = { .iov_base = buf, .iov_len = len };
        struct msghdr mh = { 0 };
        ssize_t n;

        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = sizeof cbuf.buf;
        n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n > 0) {
            client_take_fds(c, &mh);
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) {
            client_kill(c, "daemon closed the connection");
            return -KVNODE_ECLOSED;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = client_wait(c, POLLIN, deadline, "receive a reply");
            if (rc < 0)
                return rc;
            continue;
        }
        if (errno == ECONNRESET) {
            client_kill(c, "daemon closed the connection");
            return -KVNODE_ECLOSED;
        }
        client_kill(c, "recvmsg: %s", strerror(errno));
        return -KVNODE_EIO;
    }
    return 0;
}

/* Read one response frame and decode it. */
static int client_recv_response(kvnode_client *c, int64_t deadline, Kvnode__Response **out)
{
    uint8_t hdr[WIRE_HEADER_BYTES];
    uint32_t len;
    uint8_t *payload;
    int rc;

    *out = NULL;
    rc = client_recv_all(c, hdr, sizeof hdr, deadline);
    if (rc < 0)
        return rc;
    rc = wire_frame_len(hdr, c->recv_max, &len);
    if (rc == -KVNODE_ETOOBIG) {
        uint32_t claimed = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                           (uint32_t)hdr[3] << 24;
        client_kill(c, "protocol: reply frame of %" PRIu32 " bytes exceeds the limit of %" PRIu32,
                    claimed, c->recv_max);
        return -KVNODE_EPROTO;
    }
    if (rc < 0) {
        client_kill(c, "protocol: empty reply frame");
        return -KVNODE_EPROTO;
    }
    if (len > c->rx_cap) {
        payload = realloc(c->rx_buf, len);
        if (payload) {
            c->rx_buf = payload;
            c->rx_cap = len;
        }
    } else {
        payload = c->rx_buf;
    }
    if (!payload || len > c->rx_cap) {
        /* The unread payload would desync the stream. */
        client_kill(c, "out of memory for a reply of %" PRIu32 " bytes", len);
        return -KVNODE_ENOMEM;
    }
    rc = client_recv_all(c, payload, len, deadline);
    if (rc < 0)
        return rc;
    *out = wire_unpack_response_with(payload, len, &c->unpack_alloc);
    if (*out)
        c->scratch.live++;
    if (!*out) {
        client_kill(c, "protocol: undecodable reply frame of %" PRIu32 " bytes", len);
        return -KVNODE_EPROTO;
    }
    if (c->rx_ctrunc) {
        client_response_free(c, *out);
        *out = NULL;
        client_kill(c, "protocol: more passed fds than the library accepts (%d)", CLIENT_MAX_FDS);
        return -KVNODE_EPROTO;
    }
    return 0;
}

/* Error code from the daemon: negative KVNODE_E*; anything else is malformed. */
static int client_error_code(const Kvnode__Error *e)
{
    return e->code < 0 ? e->code : -KVNODE_EPROTO;
}

/* Send req and wait for its response with the expected result case.
 * On success *out is the response (caller frees). Fds passed with a HELLO
 * reply stay in c->rx_fds for client_setup; any other passed fd is closed. */
static int client_call(kvnode_client *c, Kvnode__Request *req, int expect,
                       Kvnode__Response **out)
{
    int64_t deadline = client_now_ms() + c->timeout_ms;
    Kvnode__Response *resp;
    uint8_t *frame;
    size_t frame_len;
    const char *op = wire_op_name((int)req->op_case);
    int rc;

    *out = NULL;
    if (c->dead) {
        client_seterr(c, "connection unusable: %s", c->dead_msg);
        return -KVNODE_ECLOSED;
    }
    client_drop_fds(c);
    req->id = c->next_id++;
    rc = wire_pack_reuse(&req->base, c->send_max, &c->tx_buf, &c->tx_cap, &frame_len);
    frame = c->tx_buf;
    if (rc < 0)
        c->next_id--;   /* nothing was sent: keep the ids the daemon sees dense */
    if (rc == -KVNODE_ETOOBIG) {
        client_seterr(c, "%s request of %zu bytes exceeds the frame limit of %" PRIu32 " bytes",
                      op, protobuf_c_message_get_packed_size(&req->base), c->send_max);
        return rc;
    }
    if (rc < 0) {
        client_seterr(c, "cannot pack a %s request: %s", op, kvnode_strerror(rc));
        return rc;
    }
    rc = client_send_all(c, frame, frame_len, deadline);
    if (rc == -KVNODE_ECLOSED) {
        /* A daemon that refuses a connection says why and closes at once,
         * maybe before our request went out: its reason is still waiting in
         * the receive queue, and it is the better error to report. */
        int64_t brief = client_now_ms() + 100;
        if (client_recv_response(c, brief < deadline ? brief : deadline, &resp) == 0) {
            if (resp->id == 0 && resp->error) {
                rc = client_error_code(resp->error);
                client_kill(c, "daemon: %s", resp->error->message);
            }
            client_response_free(c, resp);
        }
        client_drop_fds(c);
        if (rc == -KVNODE_ECLOSED)
            client_kill(c, "daemon closed the connection");
        return rc;
    }
    if (rc < 0)
        return rc;
    rc = client_recv_response(c, deadline, &resp);
    if (rc < 0) {
        client_drop_fds(c);
        return rc;
    }
    if (resp->id != req->id) {
        /* id 0 is the daemon refusing the connection (then it closes). */
        if (resp->id == 0 && resp->error) {
            rc = client_error_code(resp->error);
            client_kill(c, "daemon: %s", resp->error->message);
        } else {
            rc = -KVNODE_EPROTO;
            client_kill(c, "protocol: reply id %" PRIu64 " to %s request %" PRIu64, resp->id,
                        op, req->id);
        }
        client_response_free(c, resp);
        client_drop_fds(c);
        return rc;
    }
    if (resp->error) {
        rc = client_error_code(resp->error);
        client_seterr(c, "%s", resp->error->message[0] ? resp->error->message
                                                        : kvnode_strerror(rc));
        client_response_free(c, resp);
        client_drop_fds(c);
        return rc;
    }
    if ((int)resp->result_case != expect) {
        client_seterr(c, "protocol: %s reply carries result %d", op, (int)resp->result_case);
        client_response_free(c, resp);
        client_drop_fds(c);
        return -KVNODE_EPROTO;
    }
    if (expect != KVNODE__RESPONSE__RESULT_HELLO)
        client_drop_fds(c);     /* only HELLO may pass fds */
    *out = resp;
    return 0;
}

/* --- helpers for the calls ---------------------------------------------------- */

/* Common entry checks for the namespace calls. */
static int client_check_ns(kvnode_client *c, size_t n, const char *what)
{
    if (c->dead) {
        client_seterr(c, "connection unusable: %s", c->dead_msg);
        return -KVNODE_ECLOSED;
    }
    if (c->observer) {
        client_seterr(c, "%s: an observer client (no layout) may only call stats, ping and reload", what);
        return -KVNODE_ESTATE;
    }
    if (n > c->max_keys) {
        client_seterr(c, "%s: %zu keys exceed the daemon's max_keys of %" PRIu32, what, n,
                      c->max_keys);
        return -KVNODE_ETOOBIG;
    }
    return 0;
}

static const struct client_arena *client_find_arena(const kvnode_client *c, uint32_t id)
{
    size_t i;

    for (i = 0; i < c->n_arenas; i++)
        if (c->arenas[i].id == id)
            return &c->arenas[i];
    return NULL;
}

/* Turn a daemon location into a pointer, checking it lies inside the mapping. */
static int client_resolve(kvnode_client *c, const Kvnode__Location *l, kvnode_loc *out)
{
    const struct client_arena *a = client_find_arena(c, l->arena);

    if (!a) {
        client_seterr(c, "protocol: location in unknown arena %" PRIu32, l->arena);
        return -KVNODE_EPROTO;
    }
    if (!a->base) {
        client_seterr(c, "protocol: location in arena %" PRIu32 ", which was not passed to "
                      "this client", l->arena);
        return -KVNODE_EPROTO;
    }
    if (l->offset > a->size || a->size - l->offset < c->block_bytes) {
        client_seterr(c, "protocol: block at offset %" PRIu64 " overruns arena %" PRIu32
                      " of %" PRIu64 " bytes", l->offset, l->arena, a->size);
        return -KVNODE_EPROTO;
    }
    out->ptr = a->base + l->offset;
    out->tier = a->tier;
    out->device = a->device;
    return 0;
}

/* --- CUDA ------------------------------------------------------------------ */

/* After a failed runtime call: clear the thread's last CUDA error, so that
 * the engine's own cudaGetLastError() does not report ours. */
static void client_cuda_failed(kvnode_client *c)
{
    if (c->rt.get_last_error)
        (void)c->rt.get_last_error();
}

/* Make the client's CUDA device current on this thread (when it declared
 * one: IPC mappings and pinned memory belong to that device's context).
 * *prev is what client_cuda_leave restores (-1: nothing). 0, or the
 * cudaError_t with *step naming the failed call. */
static int client_cuda_enter(kvnode_client *c, int *prev, const char **step)
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

static void client_cuda_leave(kvnode_client *c, int prev)
{
    if (prev >= 0 && c->rt.set_device(prev) != CUDART_SUCCESS)
        client_cuda_failed(c);
}

/* Open an arena lent as a CUDA IPC handle: base becomes a device pointer. */
static int client_open_ipc(kvnode_client *c, const Kvnode__Arena *a, struct client_arena *ca)
{
    cudart_ipc_handle h;
    const char *step = "cudaIpcOpenMemHandle";
    char text[192];
    void *p = NULL;
    int prev, err;

    if (!c->have_rt) {
        client_seterr(c, "protocol: arena %" PRIu32 " (device %" PRId32 ") is lent as CUDA IPC "
                      "memory, but this client told the daemon it cannot open CUDA IPC handles: %s",
                      a->id, a->device, c->cuda_device < 0 ? "it declared no CUDA device"
                                                           : c->rt_why);
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
        client_seterr(c, "cannot open GPU arena %" PRIu32 " (device %" PRId32 ", %" PRIu64
                      " bytes, CUDA IPC) on CUDA device %d: %s: %s", a->id, a->device, a->size,
                      c->cuda_device, step, text);
        return -KVNODE_EIO;
    }
    ca->base = p;
    ca->ipc = 1;
    return 0;
}

/* Undo every mapping, IPC opening and host registration of the arenas. */
static void client_release_arenas(kvnode_client *c)
{
    const char *step;
    int prev = -1, entered = 0;
    size_t i;

    for (i = 0; i < c->n_arenas; i++) {
        struct client_arena *a = &c->arenas[i];

        if (!a->base || (!a->ipc && !a->pinned))
            continue;
        if (!entered) {
            entered = 1;
            (void)client_cuda_enter(c, &prev, &step);   /* best effort */
        }
        if ((a->ipc ? cudart_ipc_release(&c->rt, a->base) : c->rt.host_unregister(a->base)) !=
            CUDART_SUCCESS)
            client_cuda_failed(c);
        a->pinned = 0;
    }
    if (entered)
        client_cuda_leave(c, prev);
    for (i = 0; i < c->n_arenas; i++) {
        struct client_arena *a = &c->arenas[i];

        if (a->base && !a->ipc)
            munmap(a->base, (size_t)a->size);
        a->base = NULL;
    }
}

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

/* Copy one block per slot with a non-NULL ptr, between the slot and user[i]
 * (to_slots: user -> slot). Mapped memory (host arenas, simulated devices)
 * is memcpy'ed; device memory goes through cudaMemcpy. `first` numbers the
 * blocks in messages. */
static int client_copy_blocks(kvnode_client *c, const kvnode_loc *locs, size_t n,
                              void *const *user, int to_slots, size_t first, const char *what)
{
    const struct client_arena *a = NULL;
    size_t i, bb = (size_t)c->block_bytes;
    const char *step = "cudaMemcpy";
    int prev = -1, entered = 0, err = CUDART_SUCCESS;
    char text[192];

    for (i = 0; i < n; i++) {
        void *slot = locs[i].ptr;

        if (!slot)
            continue;
        a = client_arena_at(c, slot);
        if (!a || !a->ipc) {
            if (to_slots)
                memcpy(slot, user[i], bb);
            else
                memcpy(user[i], slot, bb);
            continue;
        }
        if (!entered) {
            entered = 1;
            err = client_cuda_enter(c, &prev, &step);
            if (err != CUDART_SUCCESS)
                break;
        }
        step = "cudaMemcpy";
        err = to_slots ? c->rt.copy(slot, user[i], bb, CUDART_MEMCPY_DEFAULT)
                       : c->rt.copy(user[i], slot, bb, CUDART_MEMCPY_DEFAULT);
        if (err != CUDART_SUCCESS) {
            client_cuda_failed(c);
            break;
        }
    }
    if (entered)
        client_cuda_leave(c, prev);
    if (err == CUDART_SUCCESS)
        return 0;
    client_seterr(c, "%s: %s of block %zu (GPU arena %" PRIu32 ", device %d) failed: %s", what,
                  step, first + i, a->id, a->device, cudart_error_text(&c->rt, err, text,
                                                                       sizeof text));
    return -KVNODE_EIO;
}

static int client_lease_op(kvnode_client *c, kvnode_lease lease, int op, const char *what)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__LeaseRequest lr = KVNODE__LEASE_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (lease == 0)
        return 0;   /* nothing was pinned or reserved */
    rc = client_check_ns(c, 0, what);
    if (rc < 0)
        return rc;
    lr.lease = lease;
    req.op_case = (Kvnode__Request__OpCase)op;
    switch (op) {
    case KVNODE__REQUEST__OP_GET_END:    req.get_end = &lr; break;
    case KVNODE__REQUEST__OP_PUT_COMMIT: req.put_commit = &lr; break;
    default:                             req.put_abort = &lr; break;
    }
    rc = client_call(c, &req, op, &resp);   /* result cases equal op cases */
    if (rc < 0)
        return rc;
    client_response_free(c, resp);
    return 0;
}

/* Best-effort release of a lease we cannot hand to the caller; the message
 * of the original failure is kept. */
static void client_lease_drop(kvnode_client *c, kvnode_lease lease, int op)
{
    char saved[CLIENT_MSG_MAX];

    if (lease == 0 || c->dead)
        return;
    memcpy(saved, c->err, sizeof saved);
    (void)client_lease_op(c, lease, op, "release");
    memcpy(c->err, saved, sizeof saved);
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
 * those lent as CUDA IPC handles. On failure client_free undoes it all. */
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
        if (a->cuda_ipc_handle.len > 0) {
            int rc = client_open_ipc(c, a, ca);
            if (rc < 0)
                return rc;
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
    c->namespace_id = h->namespace_id;
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
    hello.cuda_ipc = c->have_rt;
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
        hello.layout = &lo;
    }
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &hello;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_HELLO, &resp);
    if (rc < 0)
        return rc;
    rc = client_setup(c, resp->hello, layout);
    client_response_free(c, resp);
    client_drop_fds(c);
    return rc;
}

static void client_free(kvnode_client *c)
{
    prefault_stop(c->prefault);     /* before the mappings it walks go */
    client_drop_fds(c);
    client_release_arenas(c);
    free(c->arenas);
    if (c->fd >= 0)
        close(c->fd);
    free(c->rx_buf);
    free(c->tx_buf);
    free(c->scratch.buf);
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

#define CLIENT_CONNECT_KNOWN (KVNODE_CONNECT_READER | KVNODE_CONNECT_PREFAULT)

static size_t client_host_arenas(const kvnode_client *c);

int kvnode_connect_flags(const char *socket_path, const kvnode_layout *layout, int cuda_device,
                         unsigned flags, kvnode_client **out)
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
                 "KVNODE_CONNECT_READER, KVNODE_CONNECT_PREFAULT)",
                 flags & ~(unsigned)CLIENT_CONNECT_KNOWN, (unsigned)CLIENT_CONNECT_KNOWN);
        return -KVNODE_EINVAL;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(client_connect_err, sizeof client_connect_err, "out of memory");
        return -KVNODE_ENOMEM;
    }
    c->fd = -1;
    c->next_id = 1;
    c->unpack_alloc.alloc = client_scratch_alloc;
    c->unpack_alloc.free = client_scratch_free;
    c->unpack_alloc.allocator_data = &c->scratch;
    c->timeout_ms = client_env_timeout();
    c->observer = layout == NULL;
    c->cuda_device = layout ? cuda_device : -1;     /* observers lend no memory */
    c->reader_asked = layout && (flags & KVNODE_CONNECT_READER);
    c->send_max = CLIENT_PRE_HELLO_MAX;
    c->recv_max = CLIENT_PRE_HELLO_MAX;
    if (!socket_path || !*socket_path) {
        socket_path = getenv("KVNODE_SOCKET");
        if (!socket_path || !*socket_path)
            socket_path = CLIENT_DEFAULT_SOCKET;
    }
    /* A runtime found now decides whether the daemon may lend this client
     * GPU memory as CUDA IPC handles (else only mapped, simulated devices). */
    if (c->cuda_device >= 0)
        c->have_rt = cudart_load(&c->rt, c->rt_why, sizeof c->rt_why) == 0;
    deadline = client_now_ms() + c->timeout_ms;
    rc = layout ? client_validate_layout(c, layout) : 0;
    if (rc == 0)
        rc = client_open_socket(c, socket_path, deadline);
    if (rc == 0)
        rc = client_hello(c, layout);
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

static size_t client_host_arenas(const kvnode_client *c)
{
    size_t i, n = 0;

    for (i = 0; i < c->n_arenas; i++)
        if (c->arenas[i].tier == KVNODE_TIER_HOST && c->arenas[i].base && !c->arenas[i].ipc)
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

            if (a->tier == KVNODE_TIER_HOST && a->base && !a->ipc) {
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
        err = c->rt.host_register(a->base, (size_t)a->size, CUDART_HOST_REGISTER_PORTABLE);
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
    return c ? c->err : client_connect_err;
}

void kvnode_set_timeout(kvnode_client *c, int timeout_ms)
{
    if (c && timeout_ms > 0)
        c->timeout_ms = timeout_ms;
}

/* --- zero-copy calls --------------------------------------------------------- */

/* match and delete: n keys in, a count of at most n out (*count). `del`
 * picks the op; `out_name` names the output argument in errors. */
static int client_count_call(kvnode_client *c, const kvnode_key *keys, size_t n, size_t *count,
                             int del, const char *out_name, kvnode_tiers *tiers)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__MatchRequest m = KVNODE__MATCH_REQUEST__INIT;
    Kvnode__DeleteRequest d = KVNODE__DELETE_REQUEST__INIT;
    const char *what = del ? "delete" : "match";
    Kvnode__Response *resp;
    uint32_t answered;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!count || (!keys && n > 0)) {
        client_seterr(c, "%s: NULL %s", what, count ? "keys" : out_name);
        return -KVNODE_EINVAL;
    }
    *count = 0;
    rc = client_check_ns(c, n, what);
    if (rc < 0 || n == 0)
        return rc;
    if (del) {
        d.n_keys = n;
        d.keys = (int64_t *)(uintptr_t)keys;
        req.op_case = KVNODE__REQUEST__OP_DELETE;
        req.delete_ = &d;
    } else {
        m.n_keys = n;
        m.keys = (int64_t *)(uintptr_t)keys;
        req.op_case = KVNODE__REQUEST__OP_MATCH;
        req.match = &m;
    }
    rc = client_call(c, &req, del ? KVNODE__RESPONSE__RESULT_DELETE : KVNODE__RESPONSE__RESULT_MATCH,
                     &resp);
    if (rc < 0)
        return rc;
    answered = del ? resp->delete_->deleted : resp->match->matched;
    if (answered > n) {
        client_seterr(c, "protocol: %s of %zu keys answered %" PRIu32, what, n, answered);
        rc = -KVNODE_EPROTO;
    } else if (tiers && (uint64_t)resp->match->hbm + resp->match->host + resp->match->store !=
                            answered) {
        client_seterr(c, "protocol: match of %zu keys answered %" PRIu32 " = %" PRIu32 " hbm + %"
                      PRIu32 " host + %" PRIu32 " store", n, answered, resp->match->hbm,
                      resp->match->host, resp->match->store);
        rc = -KVNODE_EPROTO;
    } else {
        *count = answered;
        if (tiers) {
            tiers->hbm = resp->match->hbm;
            tiers->host = resp->match->host;
            tiers->store = resp->match->store;
        }
    }
    client_response_free(c, resp);
    return rc;
}

int kvnode_match(kvnode_client *c, const kvnode_key *keys, size_t n, size_t *matched)
{
    return client_count_call(c, keys, n, matched, 0, "matched", NULL);
}

int kvnode_match_remote(kvnode_client *c, const kvnode_key *keys, size_t n, size_t max_hosts,
                        kvnode_remote_match *out)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__MatchRemoteRequest m = KVNODE__MATCH_REMOTE_REQUEST__INIT;
    Kvnode__Response *resp;
    const Kvnode__MatchRemoteReply *r;
    int rc;

    if (out)
        memset(out, 0, sizeof *out);
    if (!c)
        return -KVNODE_EINVAL;
    if (!out || (!keys && n > 0)) {
        client_seterr(c, "match_remote: NULL %s", out ? "keys" : "out");
        return -KVNODE_EINVAL;
    }
    rc = client_check_ns(c, n, "match_remote");
    if (rc < 0)
        return rc;
    m.n_keys = n;
    m.keys = (int64_t *)(uintptr_t)keys;
    m.max_hosts = max_hosts > UINT32_MAX ? UINT32_MAX : (uint32_t)max_hosts;
    req.op_case = KVNODE__REQUEST__OP_MATCH_REMOTE;
    req.match_remote = &m;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_MATCH_REMOTE, &resp);
    if (rc < 0)
        return rc;
    r = resp->match_remote;
    if (r->matched > n || r->n_peers > KVNODE_MAX_PEERS) {
        client_seterr(c, "protocol: match_remote of %zu keys answered %" PRIu32 " with %zu peers",
                      n, r->matched, r->n_peers);
        client_response_free(c, resp);
        return -KVNODE_EPROTO;
    }
    out->matched = r->matched;
    out->remote_ok = r->remote_ok ? 1 : 0;
    snprintf(out->why, sizeof out->why, "%s", r->why ? r->why : "");
    for (size_t i = 0; i < r->n_peers; i++) {
        const Kvnode__PeerMatch *p = r->peers[i];
        if (!p || !p->host_ip_port || p->matched > n)
            continue;
        snprintf(out->peers[out->npeers].host_ip_port, sizeof out->peers[0].host_ip_port, "%s",
                 p->host_ip_port);
        out->peers[out->npeers++].matched = p->matched;
    }
    client_response_free(c, resp);
    return 0;
}

int kvnode_match_tiers(kvnode_client *c, const kvnode_key *keys, size_t n, kvnode_tiers *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (c && !out) {
        client_seterr(c, "match_tiers: NULL out");
        return -KVNODE_EINVAL;
    }
    return client_count_call(c, keys, n, out ? &out->matched : NULL, 0, "matched", out);
}

int kvnode_get_begin(kvnode_client *c, const kvnode_key *keys, size_t n,
                     kvnode_lease *lease, kvnode_loc *locs, size_t *got)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__GetBeginRequest g = KVNODE__GET_BEGIN_REQUEST__INIT;
    Kvnode__Response *resp;
    const Kvnode__GetBeginReply *r;
    size_t i;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!lease || !got || ((!keys || !locs) && n > 0)) {
        client_seterr(c, "get_begin: NULL argument");
        return -KVNODE_EINVAL;
    }
    *lease = 0;
    *got = 0;
    rc = client_check_ns(c, n, "get_begin");
    if (rc < 0 || n == 0)
        return rc;
    g.n_keys = n;
    g.keys = (int64_t *)(uintptr_t)keys;
    req.op_case = KVNODE__REQUEST__OP_GET_BEGIN;
    req.get_begin = &g;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_GET_BEGIN, &resp);
    if (rc < 0)
        return rc;
    r = resp->get_begin;
    if (r->n_locations > n || (r->lease == 0 && r->n_locations > 0)) {
        client_seterr(c, "protocol: get_begin of %zu keys answered %zu locations under lease %"
                      PRIu64, n, r->n_locations, r->lease);
        rc = -KVNODE_EPROTO;
    }
    for (i = 0; rc == 0 && i < r->n_locations; i++)
        rc = client_resolve(c, r->locations[i], &locs[i]);
    if (rc == 0 && r->n_locations > 0) {
        *lease = r->lease;
        *got = r->n_locations;
    } else {
        /* Nothing usable reached the caller: do not leave blocks pinned. */
        client_lease_drop(c, r->lease, KVNODE__REQUEST__OP_GET_END);
    }
    client_response_free(c, resp);
    return rc;
}

int kvnode_get_end(kvnode_client *c, kvnode_lease lease)
{
    return client_lease_op(c, lease, KVNODE__REQUEST__OP_GET_END, "get_end");
}

int kvnode_put_begin(kvnode_client *c, const kvnode_key *keys, size_t n, int tier,
                     kvnode_lease *lease, kvnode_loc *locs)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__PutBeginRequest p = KVNODE__PUT_BEGIN_REQUEST__INIT;
    Kvnode__Response *resp;
    const Kvnode__PutBeginReply *r;
    size_t i, present = 0;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!lease || ((!keys || !locs) && n > 0)) {
        client_seterr(c, "put_begin: NULL argument");
        return -KVNODE_EINVAL;
    }
    *lease = 0;
    if (tier != KVNODE_TIER_HOST && tier != KVNODE_TIER_HBM) {
        client_seterr(c, "put_begin: tier %d is neither KVNODE_TIER_HOST nor KVNODE_TIER_HBM",
                      tier);
        return -KVNODE_EINVAL;
    }
    rc = client_check_ns(c, n, "put_begin");
    if (rc < 0 || n == 0)
        return rc;
    p.n_keys = n;
    p.keys = (int64_t *)(uintptr_t)keys;
    p.tier = (Kvnode__Tier)tier;
    req.op_case = KVNODE__REQUEST__OP_PUT_BEGIN;
    req.put_begin = &p;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_PUT_BEGIN, &resp);
    if (rc < 0)
        return rc;
    r = resp->put_begin;
    if (r->n_locations != n) {
        client_seterr(c, "protocol: put_begin of %zu keys answered %zu locations", n,
                      r->n_locations);
        rc = -KVNODE_EPROTO;
    }
    for (i = 0; rc == 0 && i < n; i++) {
        if (r->locations[i]->present) {
            rc = client_resolve(c, r->locations[i], &locs[i]);
            present++;
        } else {
            locs[i] = (kvnode_loc){ .ptr = NULL, .tier = 0, .device = -1 };
        }
    }
    if (rc == 0 && present > 0 && r->lease == 0) {
        client_seterr(c, "protocol: put_begin reserved %zu slots without a lease", present);
        rc = -KVNODE_EPROTO;
    }
    if (rc == 0)
        *lease = r->lease;
    else
        client_lease_drop(c, r->lease, KVNODE__REQUEST__OP_PUT_ABORT);
    client_response_free(c, resp);
    return rc;
}

int kvnode_put_commit(kvnode_client *c, kvnode_lease lease)
{
    return client_lease_op(c, lease, KVNODE__REQUEST__OP_PUT_COMMIT, "put_commit");
}

int kvnode_put_abort(kvnode_client *c, kvnode_lease lease)
{
    return client_lease_op(c, lease, KVNODE__REQUEST__OP_PUT_ABORT, "put_abort");
}

/* --- copying conveniences ---------------------------------------------------- */

/* Every block pointer of a copying call must be usable. */
static int client_check_blocks(kvnode_client *c, const void *const *blocks, size_t n,
                               const char *what)
{
    size_t i;

    if (!blocks && n > 0) {
        client_seterr(c, "%s: NULL block array", what);
        return -KVNODE_EINVAL;
    }
    for (i = 0; i < n; i++) {
        if (!blocks[i]) {
            client_seterr(c, "%s: block pointer %zu is NULL", what, i);
            return -KVNODE_EINVAL;
        }
    }
    return 0;
}

/* Keys per inline chunk so that a frame carrying that many blocks stays under
 * the daemon's max_frame_bytes (and max_keys). 0: one block does not fit. */
static size_t client_inline_chunk(const kvnode_client *c)
{
    uint64_t per = c->block_bytes + CLIENT_INLINE_PER_BLOCK;
    uint64_t k;

    if (c->send_max <= CLIENT_INLINE_OVERHEAD)
        return 0;
    k = (c->send_max - CLIENT_INLINE_OVERHEAD) / per;
    if (k > 1 && k * per > CLIENT_INLINE_TARGET)
        k = CLIENT_INLINE_TARGET / per > 1 ? CLIENT_INLINE_TARGET / per : 1;
    return k < c->max_keys ? (size_t)k : c->max_keys;
}

/* Common entry of the copying calls: argument and state checks without the
 * max_keys limit (they split into chunks). When n > 0 and all is well, *cap
 * is the most keys one chunk may have (at most n): max_keys, or with
 * inline_ as many blocks as fit in a frame. */
static int client_copy_entry(kvnode_client *c, const kvnode_key *keys, size_t n,
                             const void *const *blocks, int inline_, size_t *cap,
                             const char *what)
{
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!keys && n > 0) {
        client_seterr(c, "%s: NULL keys", what);
        return -KVNODE_EINVAL;
    }
    rc = client_check_blocks(c, blocks, n, what);
    if (rc == 0)
        rc = client_check_ns(c, 0, what);
    if (rc < 0 || n == 0)
        return rc;
    *cap = inline_ ? client_inline_chunk(c) : c->max_keys;
    if (*cap == 0) {
        client_seterr(c, "%s: a block of %" PRIu64 " bytes does not fit in a frame of %"
                      PRIu32 " bytes", what, c->block_bytes, c->send_max);
        return -KVNODE_ETOOBIG;
    }
    if (*cap > n)
        *cap = n;
    return 0;
}

/* client_copy_entry for the gets, which also zero *got. */
static int client_get_entry(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                            size_t *got, int inline_, size_t *cap, const char *what)
{
    if (!c)
        return -KVNODE_EINVAL;
    if (!got) {
        client_seterr(c, "%s: NULL got", what);
        return -KVNODE_EINVAL;
    }
    *got = 0;
    return client_copy_entry(c, keys, n, (const void *const *)dst, inline_, cap, what);
}

/* malloc that names the failure in c's error message. */
static void *client_malloc(kvnode_client *c, size_t size)
{
    void *p = malloc(size);

    if (!p)
        client_seterr(c, "out of memory");
    return p;
}

int kvnode_get(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst, size_t *got)
{
    kvnode_loc *locs;
    size_t done = 0, cap;
    int rc;

    rc = client_get_entry(c, keys, n, dst, got, 0, &cap, "get");
    if (rc < 0 || n == 0)
        return rc;
    locs = client_malloc(c, cap * sizeof *locs);
    if (!locs)
        return -KVNODE_ENOMEM;
    while (done < n) {
        size_t chunk = n - done < cap ? n - done : cap, g = 0;
        kvnode_lease lease;

        rc = kvnode_get_begin(c, keys + done, chunk, &lease, locs, &g);
        if (rc < 0)
            break;
        rc = client_copy_blocks(c, locs, g, dst + done, 0, done, "get");
        if (rc < 0) {
            client_lease_drop(c, lease, KVNODE__REQUEST__OP_GET_END);
            break;
        }
        /* The copies are only trustworthy if the pin held until the end. */
        rc = kvnode_get_end(c, lease);
        if (rc < 0)
            break;
        done += g;
        if (g < chunk)
            break;
    }
    free(locs);
    *got = done;
    return rc;
}

int kvnode_put(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src)
{
    kvnode_loc *locs;
    size_t done = 0, cap;
    int rc;

    rc = client_copy_entry(c, keys, n, src, 0, &cap, "put");
    if (rc < 0 || n == 0)
        return rc;
    locs = client_malloc(c, cap * sizeof *locs);
    if (!locs)
        return -KVNODE_ENOMEM;
    while (done < n) {
        size_t chunk = n - done < cap ? n - done : cap;
        kvnode_lease lease;

        /* Host slots (CPU copies); client_copy_blocks would cope with others. */
        rc = kvnode_put_begin(c, keys + done, chunk, KVNODE_TIER_HOST, &lease, locs);
        if (rc < 0)
            break;
        rc = client_copy_blocks(c, locs, chunk, (void *const *)(uintptr_t)(src + done), 1, done,
                                "put");
        if (rc < 0) {
            client_lease_drop(c, lease, KVNODE__REQUEST__OP_PUT_ABORT);
            break;
        }
        rc = kvnode_put_commit(c, lease);
        if (rc < 0)
            break;
        done += chunk;
    }
    free(locs);
    return rc;
}

int kvnode_get_inline(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                      size_t *got)
{
    size_t done = 0, cap;
    int rc;

    rc = client_get_entry(c, keys, n, dst, got, 1, &cap, "get_inline");
    if (rc < 0 || n == 0)
        return rc;
    while (done < n) {
        Kvnode__Request req = KVNODE__REQUEST__INIT;
        Kvnode__GetInlineRequest g = KVNODE__GET_INLINE_REQUEST__INIT;
        Kvnode__Response *resp;
        const Kvnode__GetInlineReply *r;
        size_t chunk = n - done < cap ? n - done : cap, i, nblocks;

        g.n_keys = chunk;
        g.keys = (int64_t *)(uintptr_t)(keys + done);
        req.op_case = KVNODE__REQUEST__OP_GET_INLINE;
        req.get_inline = &g;
        rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_GET_INLINE, &resp);
        if (rc < 0)
            break;
        r = resp->get_inline;
        if (r->n_blocks > chunk) {
            client_seterr(c, "protocol: get_inline of %zu keys answered %zu blocks", chunk,
                          r->n_blocks);
            rc = -KVNODE_EPROTO;
        }
        for (i = 0; rc == 0 && i < r->n_blocks; i++) {
            if (r->blocks[i].len != c->block_bytes) {
                client_seterr(c, "protocol: get_inline block %zu has %zu bytes, expected %"
                              PRIu64, done + i, r->blocks[i].len, c->block_bytes);
                rc = -KVNODE_EPROTO;
            }
        }
        nblocks = r->n_blocks;
        if (rc == 0) {
            for (i = 0; i < nblocks; i++)
                memcpy(dst[done + i], r->blocks[i].data, r->blocks[i].len);
            done += nblocks;
        }
        client_response_free(c, resp);
        if (rc < 0 || nblocks < chunk)   /* a short chunk ends the prefix */
            break;
    }
    *got = done;
    return rc;
}

int kvnode_put_inline(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src)
{
    ProtobufCBinaryData *blobs;
    size_t done = 0, cap;
    int rc;

    rc = client_copy_entry(c, keys, n, src, 1, &cap, "put_inline");
    if (rc < 0 || n == 0)
        return rc;
    blobs = client_malloc(c, cap * sizeof *blobs);
    if (!blobs)
        return -KVNODE_ENOMEM;
    while (done < n) {
        Kvnode__Request req = KVNODE__REQUEST__INIT;
        Kvnode__PutInlineRequest p = KVNODE__PUT_INLINE_REQUEST__INIT;
        Kvnode__Response *resp;
        size_t chunk = n - done < cap ? n - done : cap, i;

        for (i = 0; i < chunk; i++) {
            /* protobuf-c only reads .data when packing. */
            blobs[i].data = (uint8_t *)(uintptr_t)src[done + i];
            blobs[i].len = (size_t)c->block_bytes;
        }
        p.n_keys = chunk;
        p.keys = (int64_t *)(uintptr_t)(keys + done);
        p.n_blocks = chunk;
        p.blocks = blobs;
        req.op_case = KVNODE__REQUEST__OP_PUT_INLINE;
        req.put_inline = &p;
        rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_PUT_INLINE, &resp);
        if (rc < 0)
            break;
        client_response_free(c, resp);
        done += chunk;
    }
    free(blobs);
    return rc;
}

/* --- delete / stats / ping --------------------------------------------------- */

int kvnode_delete(kvnode_client *c, const kvnode_key *keys, size_t n, size_t *deleted)
{
    return client_count_call(c, keys, n, deleted, 1, "deleted", NULL);
}

int kvnode_stats_json(kvnode_client *c, char **json)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__StatsRequest s = KVNODE__STATS_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    if (!json) {
        client_seterr(c, "stats: NULL json");
        return -KVNODE_EINVAL;
    }
    *json = NULL;
    req.op_case = KVNODE__REQUEST__OP_STATS;
    req.stats = &s;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_STATS, &resp);
    if (rc < 0)
        return rc;
    *json = strdup(resp->stats->json ? resp->stats->json : "");
    client_response_free(c, resp);
    if (!*json) {
        client_seterr(c, "out of memory");
        return -KVNODE_ENOMEM;
    }
    return 0;
}

int kvnode_ping(kvnode_client *c)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__PingRequest p = KVNODE__PING_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (!c)
        return -KVNODE_EINVAL;
    /* Distinct per call, so a stale echo cannot pass. */
    p.nonce = (c->next_id * UINT64_C(0x9e3779b97f4a7c15)) ^ (uint64_t)(uintptr_t)c;
    req.op_case = KVNODE__REQUEST__OP_PING;
    req.ping = &p;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_PING, &resp);
    if (rc < 0)
        return rc;
    if (resp->ping->nonce != p.nonce) {
        client_seterr(c, "protocol: ping nonce %" PRIu64 " echoed as %" PRIu64, p.nonce,
                      resp->ping->nonce);
        rc = -KVNODE_EPROTO;
    }
    client_response_free(c, resp);
    return rc;
}

int kvnode_reload(kvnode_client *c, char **not_applied)
{
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__ReloadRequest r = KVNODE__RELOAD_REQUEST__INIT;
    Kvnode__Response *resp;
    int rc;

    if (not_applied)
        *not_applied = NULL;
    if (!c)
        return -KVNODE_EINVAL;
    req.op_case = KVNODE__REQUEST__OP_RELOAD;
    req.reload = &r;
    rc = client_call(c, &req, KVNODE__RESPONSE__RESULT_RELOAD, &resp);
    if (rc < 0)
        return rc;
    if (not_applied && resp->reload->not_applied && *resp->reload->not_applied) {
        *not_applied = strdup(resp->reload->not_applied);
        if (!*not_applied) {
            client_seterr(c, "out of memory");
            rc = -KVNODE_ENOMEM;
        }
    }
    client_response_free(c, resp);
    return rc;
}
