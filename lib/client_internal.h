/* client_internal: what the files of libkvnode's client share (not installed).
 *
 *   client.c        connect (and the host-only reconnect), HELLO, host arena
 *                   mappings, prefault, pin_host, close
 *   client_gpu.c    CUDA: the runtime/driver in use, GPU arenas (IPC, VMM) and
 *                   their release when the connection ends, the client's
 *                   stream, copies to and from device memory
 *   client_io.c     blocking frame I/O on the socket: the HELLO exchange before
 *                   the I/O thread runs, and the fd-passing helpers it reuses
 *   client_async.c  the submit/complete machinery: reading the socket (a waiting
 *                   caller, or the I/O thread), requests in flight by id,
 *                   the completion queue and its eventfd
 *   client_submit.c the public asynchronous calls: submit, the GET/PUT
 *                   worker, drain, pending, cancel
 *   client_ops.c    the synchronous calls, each one request through client_call;
 *                   the leases the client holds (may an end go unwaited?)
 *
 * Locking: c->lock guards every field marked [lock]; fields set during
 * connect and never changed afterwards (arenas, limits, rt) are read freely. */
#ifndef KVNODE_CLIENT_INTERNAL_H
#define KVNODE_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "cudart.h"
#include "kvnode.h"
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
/* Inline frames aim at this size even when the daemon allows more. */
#define CLIENT_INLINE_TARGET    (4u << 20)

/* How a GPU arena reached this process (client_arena.gpu). */
enum { CLIENT_GPU_NONE = 0, CLIENT_GPU_IPC, CLIENT_GPU_VMM };

struct client_arena {
    uint32_t id;
    int tier;
    int device;
    uint64_t size;
    uint8_t *base;      /* NULL when the daemon passed neither fd nor IPC handle */
    int gpu;            /* CLIENT_GPU_IPC / _VMM: base is a device pointer (opened or
                         * mapped on the client's device), not a host mapping */
    int gpu_released;   /* that device mapping is gone (the connection ended) */
    int pinned;         /* base is registered with cudaHostRegister (kvnode_pin_host) */
};

/* The stream a copying call queues its CUDA copies on: the caller's
 * (kvnode_*_batch_stream) or, when given none, the client's own. */
struct client_stream {
    int callers;        /* 1: `stream` is the caller's (NULL = legacy default stream) */
    void *stream;
};

struct client_slot;     /* a request in flight (client_async.c) */

/* A lease this client got (get_begin / put_begin) and has not ended: when
 * it was asked for, so that an end may go without waiting only while the
 * daemon cannot have reaped it (client_lease_young_locked). */
struct client_lease {
    uint64_t lease;
    int64_t asked_ms;           /* client_now_ms() before the request was sent */
    int write;
};
/* At most this many are remembered; a lease not remembered ends waiting. */
#define CLIENT_LEASES_MAX 4096
struct client_tx;       /* bytes queued for the socket */
struct client_done;     /* a completion waiting for kvnode_drain */
struct client_job;      /* a GET/PUT batch waiting for the worker */

struct kvnode_client {
    uint64_t serial;            /* unique per client in this process (thread-local messages) */
    int fd;
    int timeout_ms;
    uint64_t next_id;           /* [lock] after HELLO */
    int observer;
    int dead;                   /* [lock] stream unusable: every call -> ECLOSED */
    int dead_rc;                /* [lock] the code requests in flight failed with */
    uint64_t block_bytes;
    uint32_t send_max;          /* daemon's max_frame_bytes */
    uint32_t recv_max;          /* send_max + headroom */
    uint32_t max_keys;
    uint64_t max_reserved;      /* daemon's max_reserved_bytes (0: not said) */
    uint32_t read_ttl_ms;       /* HelloReply.read_lease_ttl_ms (0: not said) */
    uint32_t write_ttl_ms;      /* HelloReply.write_lease_ttl_ms (0: not said) */
    int check_words;            /* the daemon honours check words (HelloReply.check_words) */
    int per_key;                /* the daemon answers MATCH/DELETE per key (HelloReply.per_key) */
    uint32_t namespace_id;
    char revision[128];         /* the model revision sent at HELLO ("" none; issue 31) */
    char deployment_id[160];    /* HelloReply.deployment_id ("" for observers) */
    struct client_arena *arenas;
    size_t n_arenas;
    int rx_fds[CLIENT_MAX_FDS]; /* fds received with the current frame (HELLO, or I/O thread) */
    size_t n_rx_fds;
    int rx_ctrunc;              /* the kernel dropped some passed fds */
    char dead_msg[CLIENT_MSG_MAX];  /* [lock] */
    char err[CLIENT_MSG_MAX];   /* [lock] last error of any thread (see kvnode_last_error) */
    uint8_t *rx_buf, *tx_buf;   /* frame buffers reused: rx by the I/O thread, tx under lock */
    size_t rx_cap, tx_cap;
    int cuda_device;            /* declared in HELLO; -1: none */
    int reader_asked;           /* HELLO declared the client a reader (KVNODE_CONNECT_READER) */
    unsigned busy_poll_us;      /* a synchronous caller spins this long before poll sleeps */
    int reader;                 /* the daemon confirmed it: arenas are mapped PROT_READ */
    int have_rt;                /* rt holds a CUDA runtime */
    struct cudart rt;
    char rt_why[256];           /* why there is no runtime (when have_rt is 0) */
    int have_drv;               /* drv holds the driver's VMM calls (HELLO cuda_vmm) */
    struct cudrv drv;
    char drv_why[256];          /* why not (when have_drv is 0) */
    int drv_dev;                /* the CUdevice of cuda_device */
    void *drv_ctx;              /* its primary context, retained while VMM arenas are mapped */
    /* Set when a GPU arena could not be mapped: the connection was redone
     * host-only (HELLO without cuda_ipc/cuda_vmm, this as hbm_unusable). */
    char hbm_unusable[CLIENT_MSG_MAX];
    void *stream;               /* [lock] the client's non-blocking stream (NULL: none yet) */
    int stage_busy;             /* [lock] a call uses `stage` */
    void *stage;                /* pinned staging of the device gathers (its user's) */
    size_t stage_bytes;
    int stage_pinned;           /* stage is registered (cudaHostRegister) */
    int gpu_mapped;             /* [lock] device arenas are open (released at the end) */
    int gpu_users;              /* [lock] calls copying to or from them now */
    int gpu_releasing;          /* [lock] a thread is releasing them */
    struct prefault *prefault;  /* kvnode_prefault's walk; stopped before the unmap */

    /* asynchronous machinery (client_async.c) */
    pthread_mutex_t lock;
    pthread_cond_t cond;        /* a request finished */
    pthread_cond_t job_cond;    /* a job came for the worker, or it must leave */
    int lock_ready;             /* lock and cond are initialised */
    int event_fd;               /* eventfd: readable while completions wait to be drained */
    int wake_fd;                /* eventfd: wakes the I/O thread (bytes to send, stop) */
    pthread_t io_thread, worker;
    int io_running, worker_running;     /* [lock] */
    int driving;                /* [lock] a synchronous caller runs client_io_step */
    int io_wanted;              /* [lock] callers waiting to start the I/O thread */
    int64_t poll_deadline;      /* [lock] the deadline whoever is in poll() sleeps until
                                 * (INT64_MAX: none; INT64_MIN: nobody in poll) */
    int stopping;               /* [lock] kvnode_close: threads leave */
    int tx_broken;              /* [lock] send saw EPIPE: the I/O thread reads what is left */
    struct client_slot *slots;  /* [lock] requests in flight */
    size_t n_slots;             /* [lock] */
    struct client_tx *tx_head, *tx_tail;    /* [lock] */
    struct client_done *done_head, *done_tail;  /* [lock] */
    size_t n_done;              /* [lock] */
    struct client_job *job_head, *job_tail; /* [lock] */
    uint64_t next_ticket;       /* [lock] */
    size_t tickets_open;        /* [lock] submitted, not yet drained */
    /* Deferred requests (kvnode_get_end, kvnode_put_commit_nowait): sent,
     * their reply consumed by whoever reads the socket; the first error is
     * kept until a call returns it (client_take_deferred_locked). */
    size_t n_deferred;          /* [lock] deferred requests without a reply */
    struct client_lease *leases;    /* [lock] leases this client got and has not ended */
    size_t n_leases, cap_leases;    /* [lock] */
    int deferred_rc;            /* [lock] 0, or the first deferred error not yet returned */
    char deferred_msg[CLIENT_MSG_MAX];  /* [lock] its message */
    /* I/O thread's receive state: rx_buf[rx_off, rx_len) is read and not
     * yet dispatched (a frame begun, or frames of the same read) */
    size_t rx_len, rx_off;
    /* A lone synchronous caller blocks in recvmsg rather than poll + recvmsg
     * (client_io_step): the socket's O_NONBLOCK is cleared then (every other
     * call passes MSG_DONTWAIT) and SO_RCVTIMEO bounds the wait. */
    int sock_blocking;          /* O_NONBLOCK cleared on c->fd */
    int rcvtimeo_ms;            /* SO_RCVTIMEO now set on c->fd (0: none) */
};

/* errors (client.c) */
void client_seterr(kvnode_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* This thread's last message for c (what kvnode_last_error(c) gives it). */
const char *client_errmsg(const kvnode_client *c);
int64_t client_now_ms(void);
int client_remaining_ms(int64_t deadline);

/* CUDA (client_gpu.c) */
void client_cuda_failed(kvnode_client *c);
int client_cuda_enter(kvnode_client *c, int *prev, const char **step);
void client_cuda_leave(kvnode_client *c, int prev);
/* Look for the runtime (and with it the driver's VMM calls) at connect. */
void client_gpu_load(kvnode_client *c);
/* Open or map a GPU arena lent as an IPC handle / a VMM fd (fd: the
 * received descriptor, closed by the caller). 0; 1 when it cannot be mapped
 * here (c->hbm_unusable says why: the caller reconnects host-only); or a
 * negative code for a protocol error. */
int client_gpu_open_ipc(kvnode_client *c, const Kvnode__Arena *a, struct client_arena *ca);
int client_gpu_open_vmm(kvnode_client *c, const Kvnode__Arena *a, struct client_arena *ca, int fd);
/* When the connection has ended (c->dead) and no call copies to or from the
 * GPU arenas: release them (IPC close / VMM unmap). Called by the I/O thread
 * when it leaves and by the last copying call; any thread, without c->lock. */
void client_gpu_end(kvnode_client *c);
/* Release what is left at kvnode_close (threads joined, or at a failed
 * connect): GPU arenas, the stream, the primary context. */
void client_gpu_free(kvnode_client *c);
/* Copy one block per slot with a non-NULL ptr between the slot and user[i]
 * (to_slots: user -> slot): memcpy for mapped memory, cudaMemcpyAsync on
 * st's stream for device memory (the slot's, or the user's with
 * user_device), which is synchronised before this returns. `first` numbers
 * the blocks in messages. 0 or a negative code with the error set. */
int client_copy_blocks(kvnode_client *c, const kvnode_loc *locs, size_t n, void *const *user,
                       int to_slots, int user_device, size_t first, const char *what,
                       const struct client_stream *st);
/* Copies of pieces on one stream (copy_device.c): open enters the client's
 * device (and, gpu_blocks, holds its GPU arenas); queue is cudaMemcpyAsync
 * (cudaMemcpyDefault); sync waits for what was queued; close syncs, leaves
 * and, after any failure, sets the error ("<what>: <step> ... failed: ...").
 * Each returns 0 or a negative code (-KVNODE_EIO; open -KVNODE_ECLOSED too);
 * after a failed open the copier is closed already. */
struct client_copier {
    kvnode_client *c;
    void *stream;
    const char *what, *step;
    int prev, entered, held, err;
    size_t queued;
};
int client_copier_open(kvnode_client *c, struct client_copier *k, void *stream, int gpu_blocks,
                       const char *what);
int client_copier_queue(struct client_copier *k, void *dst, const void *src, size_t len);
int client_copier_sync(struct client_copier *k);
int client_copier_close(struct client_copier *k);
/* Where piece `piece` of a gathered block goes in the block (copy.c). */
struct copy_place {
    size_t off, len, piece;
};
/* The device form of a gathered batch (copy_device.c): plan once per call
 * from the pieces' places in the block (`order`, sorted by offset) and their
 * distances (piece_at; NULL: pieces given per block), then move each lease's
 * blocks (locs, n of them) to (to_blocks) or from the pieces in device memory
 * on `stream`, synchronised before this returns. 0 or a negative code with
 * the error set. */
struct copy_dev_plan {
    int staged;             /* through pinned host memory (see copy_device.c) */
    size_t nsrc;            /* pieces in the caller's order (by distance), runs merged */
    struct copy_place *src; /* off: distance, len: run bytes, piece: offset in the stage */
    size_t *stage_off;      /* per piece: where it lies in a staged block */
};
int copy_dev_plan_make(struct copy_dev_plan *p, const ptrdiff_t *piece_at, size_t m,
                       const struct copy_place *order);
void copy_dev_plan_free(struct copy_dev_plan *p);
int copy_dev_run(kvnode_client *c, const struct copy_dev_plan *p, const kvnode_loc *locs,
                 size_t n, const void *const *pieces, const ptrdiff_t *piece_at, size_t m,
                 const struct copy_place *order, int to_blocks, void *stream, const char *what);
/* Host memory of at least `bytes` for staged copies, pinned when it can be
 * (NULL: out of memory); give it back with client_stage_put(c, p, *owned). */
void *client_stage_get(kvnode_client *c, size_t bytes, int *owned);
void client_stage_put(kvnode_client *c, void *p, int owned);
/* cudaStreamSynchronize(stream) on the client's device, for the calls that
 * end a lease after the caller's GPU work. 0 or -KVNODE_ESTATE / -KVNODE_EIO
 * with the error set. */
int client_stream_wait(kvnode_client *c, void *stream, const char *what);

/* blocking frame I/O, only before the I/O thread runs (client_io.c) */
int client_wait(kvnode_client *c, short events, int64_t deadline, const char *what);
void client_take_fds(kvnode_client *c, struct msghdr *mh);
void client_drop_fds(kvnode_client *c);
int client_error_code(const Kvnode__Error *e);
/* Send req and wait for its reply, doing the I/O on this thread (HELLO). */
int client_call_direct(kvnode_client *c, Kvnode__Request *req, int expect,
                       Kvnode__Response **out);
/* Mark the stream unusable from the HELLO path (no thread runs yet). */
void client_kill_direct(kvnode_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* What client_async.c and client_submit.c share. */
struct client_done {
    struct client_done *next;
    kvnode_completion comp;
};

struct client_slot {
    struct client_slot *next;
    uint64_t id;
    int64_t deadline;
    int timeout_ms;
    int done, rc;
    Kvnode__Response *resp;         /* synchronous: the reply */
    char err[CLIENT_MSG_MAX];
    struct client_done *async;      /* asynchronous: the completion to fill */
    size_t n;                       /* keys of the asynchronous request */
    bool *each;                     /* asynchronous per-key MATCH/DELETE: the caller's answer */
    int deferred;                   /* fire-and-forget: nobody waits; an error is kept in
                                     * c->deferred_rc (the slot is malloc()ed, freed at its end) */
    uint64_t lease;                 /* deferred: the lease it ends, for the message */
    int op;                         /* deferred: its op (KVNODE__REQUEST__OP_*) */
};

struct client_tx {
    struct client_tx *next;
    size_t len, off;
    uint8_t data[];
};

struct client_job {
    struct client_job *next;
    struct client_done *done;
    unsigned flags;
    size_t n;
    kvnode_key *keys;
    uint64_t *checks;           /* NULL: no check words */
    void **pages;
};

/* asynchronous machinery (client_async.c); *_locked: c->lock held */
void client_push_done_locked(kvnode_client *c, struct client_done *d);
/* Pack req under a fresh id and send it as the request of s. */
int client_submit_locked(kvnode_client *c, Kvnode__Request *req, struct client_slot *s);
void client_kill_locked(kvnode_client *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int client_thread_start(pthread_t *t, void *(*fn)(void *), kvnode_client *c);
int client_ensure_io_locked(kvnode_client *c);
int client_async_init(kvnode_client *c);
int client_async_start(kvnode_client *c);      /* after HELLO: the I/O thread */
void client_async_stop(kvnode_client *c);      /* fail what is in flight, join threads, free */
/* Send req (its id is set here) and wait until its reply, an error or the
 * end of the connection. Thread-safe. *out is the reply (free with
 * client_response_free). */
int client_call(kvnode_client *c, Kvnode__Request *req, int expect, Kvnode__Response **out);
/* Send req without waiting for its reply (a lease end or commit): the reply
 * is read later by whoever drives the socket; an error reply is kept for the
 * client's next call. 0, or a negative code with the error set (nothing
 * sent; a deferred error of an earlier request is returned first). */
int client_call_deferred(kvnode_client *c, Kvnode__Request *req, uint64_t lease);
/* Wait until every deferred request has its reply (or the connection
 * ended, or the client's timeout passed: the connection is then ended),
 * then return the kept deferred error, if any. */
int client_flush(kvnode_client *c);
/* Remember a lease got by a request sent at asked_ms; forget one (any end
 * of it). client_lease_young_locked: forgets it and says 1 when the client
 * got it (as a write lease or not) and it is younger than 3/4 of the
 * daemon's TTL for it, so that the daemon cannot have reaped it yet. */
void client_lease_note(kvnode_client *c, uint64_t lease, int64_t asked_ms, int write);
void client_lease_forget_locked(kvnode_client *c, uint64_t lease);
int client_lease_young_locked(kvnode_client *c, uint64_t lease, int write);
/* A kept deferred error: return it (error set, cleared) or 0. */
int client_take_deferred_locked(kvnode_client *c, char *msg, size_t cap);

/* A MATCH (del false) or DELETE request of keys[0..n) and their check words
 * (checks NULL: none) in req, its body in *m or *d (the caller's, which must
 * outlive req). */
static inline void client_keys_request(Kvnode__Request *req, Kvnode__MatchRequest *m, Kvnode__DeleteRequest *d,
                                       int del, const kvnode_key *keys, const uint64_t *checks,
                                       size_t n)
{
    if (del) {
        d->n_keys = n;
        d->keys = (int64_t *)(uintptr_t)keys;
        d->n_checks = checks ? n : 0;
        d->checks = (uint64_t *)(uintptr_t)checks;
        req->op_case = KVNODE__REQUEST__OP_DELETE;
        req->delete_ = d;
    } else {
        m->n_keys = n;
        m->keys = (int64_t *)(uintptr_t)keys;
        m->n_checks = checks ? n : 0;
        m->checks = (uint64_t *)(uintptr_t)checks;
        req->op_case = KVNODE__REQUEST__OP_MATCH;
        req->match = m;
    }
}
/* A per-key answer (MatchReply.present, DeleteReply.each: bit i of byte
 * i / 8, least significant first) of n keys into out[0..n). 0, or -1 when
 * its length is not (n + 7) / 8, a bit past n is set, or the bits set are
 * not `count` (the reply's matched / deleted). */
static inline int client_each_unpack(const ProtobufCBinaryData *bits, size_t n, uint32_t count,
                                     bool *out)
{
    size_t set = 0;

    if (bits->len != (n + 7) / 8 || (n % 8 && bits->data[n / 8] >> (n % 8)))
        return -1;
    for (size_t i = 0; i < n; i++) {
        out[i] = (bits->data[i / 8] >> (i % 8)) & 1u;
        set += out[i];
    }
    return set == count ? 0 : -1;
}
void client_response_free(kvnode_client *c, Kvnode__Response *resp);
/* 0, or -KVNODE_ECLOSED with the error set when the stream is unusable. */
int client_check_alive(kvnode_client *c);
uint64_t client_peek_id(kvnode_client *c);

/* shared by the synchronous calls and the GET/PUT worker (client_ops.c) */
int client_get_batch(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                     void *const *dst, unsigned flags, const struct client_stream *st,
                     size_t *got);
int client_put_batch(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                     const void *const *src, unsigned flags, const struct client_stream *st,
                     size_t *stored);
/* Entry checks of a namespace call of n keys: the connection alive, not an
 * observer, n within max_keys, and no check words (checks not NULL) for a
 * daemon that does not honour them (-KVNODE_EVERSION). 0 or a negative code
 * with the error set. */
int client_check_ns(kvnode_client *c, size_t n, const uint64_t *checks, const char *what);

#endif
