/* Protocol tests of lib/client.c against a fake daemon running in a thread
 * of this process. The fake speaks the real framing (lib/wire.c), passes
 * memfd arenas with SCM_RIGHTS in the HELLO reply, keeps a tiny key store
 * in those arenas, and misbehaves on request when the first key of a
 * request is one of the KEY_* values below. What is proven:
 *   - locations become pointers into the shared memfds (bytes written by
 *     one side are seen by the other), with the right tier and device;
 *   - HELLO carries the layout / observer / version / name fields, and a bad
 *     HELLO reply (error, oversized, fd mismatch, wrong size...) fails connect;
 *   - daemon errors surface through kvnode_last_error; timeouts give
 *     ETIMEDOUT, EOF gives ECLOSED, oversized / undecodable / mismatched
 *     replies give EPROTO, and each of these leaves the client unusable;
 *   - copying and inline calls split into chunks within max_keys and
 *     max_frame_bytes; no fd leaks;
 *   - readers (KVNODE_CONNECT_READER): HELLO carries the flag, a confirmed
 *     reader maps its arenas PROT_READ (a write faults), an older daemon's
 *     silence leaves an ordinary client, a reply claiming reader unasked or
 *     an unknown flag fails the connect;
 *   - GPU (HBM) arenas: HELLO declares the CUDA device (argument or
 *     KVNODE_CUDA_DEVICE) and whether a CUDA runtime was found; a simulated
 *     device's arena (an fd) is mapped; a CUDA IPC handle is checked, opened
 *     on the client's device through the runtime (a fake one, injected with
 *     cudart_set_override, since the test machine has no GPU) and fails the
 *     connect clearly without one; one that cannot be opened leaves the
 *     client connected host-only after a second HELLO saying why; copying
 *     calls use cudaMemcpyAsync on the client's own stream (or the caller's)
 *     for device memory (and for every block with KVNODE_BATCH_DEVICE),
 *     synchronised before the lease ends; put_commit_stream / get_end_stream
 *     wait for the caller's stream; the end of the connection (GoingAway,
 *     EOF) closes the IPC handle before the socket; kvnode_pin_host
 *     registers the host arena. (tests/unit/test_client_cuda.c runs the GPU
 *     path through the strict fake CUDA library.) */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudart.h"
#include "fake_server_io.h"
#include "kvnode.h"
#include "wire.h"

#define NSLOTS 64                /* blocks per memfd arena */
#define SERVER_WAIT_MS 10000     /* the fake never blocks longer than this */

/* First key of a request that makes the fake misbehave. */
enum {
    KEY_ERR = -1000,        /* error reply ENOSPC with a message */
    KEY_WRONG_ID,           /* reply with another request id */
    KEY_SILENT,             /* never reply */
    KEY_OVERSIZE,           /* header announcing a frame over the client's limit */
    KEY_HANGUP,             /* close the connection */
    KEY_BAD_OFFSET,         /* location past the end of the arena */
    KEY_BAD_ARENA,          /* location in an arena HELLO did not announce */
    KEY_UNMAPPED,           /* location in an arena passed without fd */
    KEY_GARBAGE,            /* undecodable payload */
    KEY_EXTRA_FD,           /* normal match reply with an fd attached */
    KEY_WRONG_RESULT,       /* reply carrying another result type */
    KEY_SHORT_BLOB,         /* get_inline blob one byte short */
    KEY_GOING_AWAY,         /* no reply: GoingAway (id 0), as a stopping daemon sends */
    KEY_EOF,                /* no reply: the daemon dies (its socket shut down) */
    KEY_GOING_AWAY_ID,      /* GoingAway as the reply to this request (id not 0) */
    KEY_BAD_BITMAP,         /* a per-key MATCH/DELETE answered with a bitmap one byte short */
    KEY_BITMAP_LIES,        /* ... with a bitmap whose bits do not add up to its count */
};

/* How the fake lends its GPU arena (arena 2, slots index 1). */
enum hbm_mode {
    HBM_FD,                 /* a memfd to map: the daemon's simulated device */
    HBM_IPC,                /* a 64-byte CUDA IPC handle, no fd */
    HBM_IPC_LEN,            /* a handle of hbm_handle_len bytes */
    HBM_IPC_AND_FD,         /* a 64-byte handle and an fd */
};

/* The fake's IPC handle: this magic, then the address of its "device memory". */
#define FAKE_IPC_MAGIC "kvnode-fake-ipc"

enum hello_mode {
    HM_OK, HM_ERROR, HM_OVERSIZE, HM_FD_MISMATCH, HM_BAD_BLOCK_BYTES, HM_BAD_VERSION,
    HM_REFUSE, HM_SHORT_FILE, HM_COUNT
};

struct slot {
    int64_t key;
    int state;          /* 0 free, 1 reserved, 2 stored */
    uint64_t lease;
};

struct fake {
    char dir[64], path[108];
    int lfd, cfd;
    pthread_t thr;
    int running;
    /* configuration */
    int hello_mode;
    int hbm_mode, hbm_device;
    int reply_reader;       /* 0: echo HELLO's reader; 1: always say reader; -1: never (older daemon) */
    int honour_ipc;         /* lend no IPC handle to a HELLO without cuda_ipc (as kvnoded) */
    int per_key;            /* HELLO offers per-key MATCH/DELETE (0: an older daemon) */
    int reconnects;         /* connections to accept after the first one ends */
    void (*on_eof)(struct fake *f);         /* called when the client's connection ends */
    unsigned eof_mark;                      /* what on_eof saw */
    size_t hbm_handle_len;
    uint64_t block_bytes;
    uint32_t max_frame, max_keys;
    /* arena 1 = host (index 0), arena 2 = hbm on device 0 (index 1); arena 3 has no fd */
    int memfd[2];
    uint8_t *mem[2];
    size_t mem_size;
    struct slot slots[2][NSLOTS];
    uint64_t next_lease;
    uint64_t get_leases[256];
    size_t n_get_leases;
    /* what the fake saw */
    int hello_seen, hello_has_layout;
    Kvnode__Request *hello;                 /* kept for field checks */
    Kvnode__Request *hello2;                /* the HELLO of the reconnection, if any */
    uint64_t expect_id;
    unsigned ops[32];
    size_t max_keys_in_op[32];
    uint32_t max_frame_seen;
    uint64_t last_lease[32];
    char bad[256];                          /* first server-side violation */
};

static void fake_bad(struct fake *f, const char *msg)
{
    if (!f->bad[0])
        snprintf(f->bad, sizeof f->bad, "%s", msg);
}

static void fill_pattern(uint8_t *p, size_t n, int64_t key)
{
    size_t j;

    for (j = 0; j < n; j++)
        p[j] = (uint8_t)((uint64_t)key * 131u + j * 7u + 1u);
}

static int check_pattern(const uint8_t *p, size_t n, int64_t key)
{
    size_t j;

    for (j = 0; j < n; j++)
        if (p[j] != (uint8_t)((uint64_t)key * 131u + j * 7u + 1u))
            return 0;
    return 1;
}

static struct slot *fake_find(struct fake *f, int64_t key, int state, int *arena_idx, size_t *idx)
{
    int a;
    size_t i;

    for (a = 0; a < 2; a++)
        for (i = 0; i < NSLOTS; i++)
            if (f->slots[a][i].state == state && f->slots[a][i].key == key) {
                *arena_idx = a;
                *idx = i;
                return &f->slots[a][i];
            }
    return NULL;
}

static struct slot *fake_alloc(struct fake *f, int a, size_t *idx)
{
    size_t i;

    for (i = 0; i < NSLOTS; i++)
        if (f->slots[a][i].state == 0) {
            *idx = i;
            return &f->slots[a][i];
        }
    return NULL;
}

/* Store key with its pattern in arena index a (before the thread starts). */
static void fake_preload(struct fake *f, int a, int64_t key)
{
    size_t i;
    struct slot *s = fake_alloc(f, a, &i);

    ck_assert_ptr_nonnull(s);
    s->key = key;
    s->state = 2;
    fill_pattern(f->mem[a] + i * f->block_bytes, (size_t)f->block_bytes, key);
}

/* --- fake server I/O ------------------------------------------------------------ */

static int fake_read_full(int fd, uint8_t *buf, size_t n)
{
    return fake_io_read_full(fd, buf, n, SERVER_WAIT_MS);
}

static int fake_write_full(int fd, const uint8_t *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);

        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            return -1;
        }
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Send a frame, optionally with fds attached to its first byte. */
static void fake_send_frame(struct fake *f, const uint8_t *frame, size_t len, const int *fds,
                            size_t nfds)
{
    if (nfds > 0) {
        ssize_t w = fake_io_send_fds(f->cfd, frame, len, fds, nfds);

        if (w <= 0) {
            fake_bad(f, "sendmsg with fds failed");
            return;
        }
        frame += w;
        len -= (size_t)w;
    }
    if (fake_write_full(f->cfd, frame, len) < 0)
        fake_bad(f, "send failed");
}

static void fake_reply(struct fake *f, Kvnode__Response *r, const int *fds, size_t nfds)
{
    uint8_t *frame;
    size_t len;
    int rc = wire_pack(&r->base, f->max_frame, &frame, &len);

    if (rc < 0) {
        fake_bad(f, "reply does not fit in max_frame");
        return;
    }
    fake_send_frame(f, frame, len, fds, nfds);
    free(frame);
}

static void fake_reply_error(struct fake *f, uint64_t id, int code, const char *msg)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__Error e = KVNODE__ERROR__INIT;

    e.code = code;
    e.message = (char *)msg;
    r.id = id;
    r.error = &e;
    fake_reply(f, &r, NULL, 0);
}

/* --- fake server behaviour ------------------------------------------------------- */

static void fake_hello(struct fake *f, Kvnode__Request *req)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__HelloReply h = KVNODE__HELLO_REPLY__INIT;
    Kvnode__Arena a[3] = {KVNODE__ARENA__INIT, KVNODE__ARENA__INIT, KVNODE__ARENA__INIT};
    Kvnode__Arena *ap[3] = {&a[0], &a[1], &a[2]};
    uint8_t hdr[WIRE_HEADER_BYTES], handle[128];
    size_t nfds;

    f->hello_seen = 1;
    f->hello_has_layout = req->hello->layout != NULL;
    switch (f->hello_mode) {
    case HM_ERROR:
        fake_reply_error(f, req->id, -KVNODE_ELAYOUT, "layout conflicts: test");
        return;
    case HM_REFUSE:
        fake_reply_error(f, 0, -KVNODE_ELIMIT, "too many clients (test)");
        return;
    case HM_OVERSIZE:
        wire_put_len(hdr, (1u << 20) + 1);
        fake_send_frame(f, hdr, sizeof hdr, NULL, 0);
        return;
    default:
        break;
    }
    a[0].id = 1; a[0].tier = KVNODE__TIER__TIER_HOST; a[0].device = -1;
    a[0].size = f->mem_size; a[0].fd_index = 0;
    a[1].id = 2; a[1].tier = KVNODE__TIER__TIER_HBM; a[1].device = f->hbm_device;
    a[1].size = f->mem_size; a[1].fd_index = 1;
    if (f->hbm_mode != HBM_FD && f->honour_ipc && !req->hello->cuda_ipc) {
        a[1].fd_index = -1;     /* not lent to this client */
    } else if (f->hbm_mode != HBM_FD) {
        uintptr_t addr = (uintptr_t)f->mem[1];

        memset(handle, 0, sizeof handle);
        memcpy(handle, FAKE_IPC_MAGIC, sizeof FAKE_IPC_MAGIC);
        memcpy(handle + 32, &addr, sizeof addr);
        a[1].cuda_ipc_handle.data = handle;
        a[1].cuda_ipc_handle.len = f->hbm_mode == HBM_IPC_LEN ? f->hbm_handle_len : 64;
        if (f->hbm_mode != HBM_IPC_AND_FD)
            a[1].fd_index = -1;
    }
    a[2].id = 3; a[2].tier = KVNODE__TIER__TIER_HOST; a[2].device = -1;
    a[2].size = f->mem_size; a[2].fd_index = -1;
    if (f->hello_mode == HM_SHORT_FILE)
        a[0].size = f->mem_size * 2;
    h.version = f->hello_mode == HM_BAD_VERSION ? 2 : 1;
    h.server_version = (char *)"fake";
    h.namespace_id = 5;
    h.deployment_id = (char *)"m-fake";
    h.block_bytes = req->hello->layout ? req->hello->layout->block_bytes : 0;
    if (f->hello_mode == HM_BAD_BLOCK_BYTES)
        h.block_bytes += 1;
    h.n_arenas = 3;
    h.arenas = ap;
    h.max_frame_bytes = f->max_frame;
    h.max_keys = f->max_keys;
    h.reader = f->reply_reader > 0 || (f->reply_reader == 0 && req->hello->reader);
    h.per_key = f->per_key;
    r.id = req->id;
    r.result_case = KVNODE__RESPONSE__RESULT_HELLO;
    r.hello = &h;
    nfds = f->hbm_mode == HBM_IPC || f->hbm_mode == HBM_IPC_LEN ||
           (f->hbm_mode != HBM_FD && f->honour_ipc && !req->hello->cuda_ipc) ? 1 : 2;
    fake_reply(f, &r, f->memfd, f->hello_mode == HM_FD_MISMATCH ? 0 : nfds);
}

static void fake_location(struct fake *f, int a, size_t i, Kvnode__Location *l)
{
    l->arena = (uint32_t)a + 1;
    l->offset = i * f->block_bytes;
    l->present = 1;
}

static uint64_t fake_new_get_lease(struct fake *f)
{
    uint64_t lease = f->next_lease++;

    if (f->n_get_leases < sizeof f->get_leases / sizeof f->get_leases[0])
        f->get_leases[f->n_get_leases++] = lease;
    return lease;
}

/* Returns 1 when the fake should stop answering (terminal misbehaviour). */
static int fake_special(struct fake *f, Kvnode__Request *req, int64_t k0)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    uint8_t hdr[WIRE_HEADER_BYTES];
    static const uint8_t garbage[4 + 16] = {16, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

    switch (k0) {
    case KEY_ERR:
        fake_reply_error(f, req->id, -KVNODE_ENOSPC, "host tier full (test)");
        return 0;
    case KEY_SILENT:
        return 1;
    case KEY_OVERSIZE:
        wire_put_len(hdr, f->max_frame + 4096 + 1);
        fake_send_frame(f, hdr, sizeof hdr, NULL, 0);
        return 1;
    case KEY_HANGUP:
    case KEY_EOF:
        shutdown(f->cfd, SHUT_RDWR);
        return 1;
    case KEY_GOING_AWAY: {
        Kvnode__GoingAway g = KVNODE__GOING_AWAY__INIT;
        g.unmap_within_ms = 5000;
        g.reason = (char *)"SIGTERM";
        r.id = 0;
        r.result_case = KVNODE__RESPONSE__RESULT_GOING_AWAY;
        r.going_away = &g;
        fake_reply(f, &r, NULL, 0);
        return 1;
    }
    case KEY_GOING_AWAY_ID: {
        Kvnode__GoingAway g = KVNODE__GOING_AWAY__INIT;
        g.unmap_within_ms = 5000;
        r.id = req->id;
        r.result_case = KVNODE__RESPONSE__RESULT_GOING_AWAY;
        r.going_away = &g;
        fake_reply(f, &r, NULL, 0);
        return 0;
    }
    case KEY_GARBAGE:
        fake_send_frame(f, garbage, sizeof garbage, NULL, 0);
        return 1;
    case KEY_WRONG_ID: {
        Kvnode__PingReply p = KVNODE__PING_REPLY__INIT;
        r.id = req->id + 100;
        r.result_case = KVNODE__RESPONSE__RESULT_PING;
        r.ping = &p;
        fake_reply(f, &r, NULL, 0);
        return 1;
    }
    case KEY_WRONG_RESULT: {
        Kvnode__PingReply p = KVNODE__PING_REPLY__INIT;
        r.id = req->id;
        r.result_case = KVNODE__RESPONSE__RESULT_PING;
        r.ping = &p;
        fake_reply(f, &r, NULL, 0);
        return 0;
    }
    default:
        return -1;  /* not special */
    }
}

static void fake_bad_location(struct fake *f, Kvnode__Request *req, int64_t k0)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__GetBeginReply g = KVNODE__GET_BEGIN_REPLY__INIT;
    Kvnode__PutBeginReply p = KVNODE__PUT_BEGIN_REPLY__INIT;
    Kvnode__Location l = KVNODE__LOCATION__INIT, *lp = &l;

    l.present = 1;
    l.arena = k0 == KEY_BAD_ARENA ? 99 : k0 == KEY_UNMAPPED ? 3 : 1;
    l.offset = k0 == KEY_BAD_OFFSET ? f->mem_size - f->block_bytes + 1 : 0;
    r.id = req->id;
    if (req->op_case == KVNODE__REQUEST__OP_GET_BEGIN) {
        g.lease = fake_new_get_lease(f);
        g.n_locations = 1;
        g.locations = &lp;
        r.result_case = KVNODE__RESPONSE__RESULT_GET_BEGIN;
        r.get_begin = &g;
    } else {
        p.lease = f->next_lease++;
        p.n_locations = 1;
        p.locations = &lp;
        r.result_case = KVNODE__RESPONSE__RESULT_PUT_BEGIN;
        r.put_begin = &p;
    }
    fake_reply(f, &r, NULL, 0);
}

static void fake_match(struct fake *f, Kvnode__Request *req, const int64_t *keys, size_t n)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__MatchReply m = KVNODE__MATCH_REPLY__INIT;
    int a, extra[1];
    size_t i, idx;

    uint8_t bits[NSLOTS / 8 + 2] = { 0 };

    if (req->match->per_key && n <= NSLOTS) {
        /* per key: a bit for every stored key; the special keys answer wrongly */
        for (i = 0; i < n; i++) {
            if (fake_find(f, keys[i], 2, &a, &idx)) {
                bits[i / 8] |= (uint8_t)(1u << (i % 8));
                m.matched++;
            }
        }
        m.present.data = bits;
        m.present.len = (n + 7) / 8;
        if (keys[0] == KEY_BAD_BITMAP)
            m.present.len--;
        else if (keys[0] == KEY_BITMAP_LIES)
            m.matched++;
    } else {
        for (i = 0; i < n && fake_find(f, keys[i], 2, &a, &idx); i++)
            ;
        m.matched = (uint32_t)i;
    }
    r.id = req->id;
    r.result_case = KVNODE__RESPONSE__RESULT_MATCH;
    r.match = &m;
    if (n > 0 && keys[0] == KEY_EXTRA_FD) {
        extra[0] = f->memfd[0];
        fake_reply(f, &r, extra, 1);
    } else {
        fake_reply(f, &r, NULL, 0);
    }
}

static void fake_get_begin(struct fake *f, Kvnode__Request *req)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__GetBeginReply g = KVNODE__GET_BEGIN_REPLY__INIT;
    Kvnode__Location l[NSLOTS * 2], *lp[NSLOTS * 2];
    size_t i, n = req->get_begin->n_keys;

    for (i = 0; i < n && i < NSLOTS * 2; i++) {
        int a;
        size_t idx;

        if (!fake_find(f, req->get_begin->keys[i], 2, &a, &idx))
            break;
        kvnode__location__init(&l[i]);
        fake_location(f, a, idx, &l[i]);
        lp[i] = &l[i];
    }
    g.lease = i > 0 ? fake_new_get_lease(f) : 0;
    g.n_locations = i;
    g.locations = lp;
    r.id = req->id;
    r.result_case = KVNODE__RESPONSE__RESULT_GET_BEGIN;
    r.get_begin = &g;
    fake_reply(f, &r, NULL, 0);
}

static void fake_put_begin(struct fake *f, Kvnode__Request *req)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__PutBeginReply p = KVNODE__PUT_BEGIN_REPLY__INIT;
    Kvnode__Location l[NSLOTS * 2], *lp[NSLOTS * 2];
    int tier_a = req->put_begin->tier == KVNODE__TIER__TIER_HBM ? 1 : 0;
    uint64_t lease = f->next_lease++;
    size_t i, n = req->put_begin->n_keys, reserved = 0;

    if (n > NSLOTS * 2) {
        fake_reply_error(f, req->id, -KVNODE_ETOOBIG, "too many keys for the fake");
        return;
    }
    for (i = 0; i < n; i++) {
        int a;
        size_t idx;
        struct slot *s;

        kvnode__location__init(&l[i]);
        lp[i] = &l[i];
        if (fake_find(f, req->put_begin->keys[i], 2, &a, &idx))
            continue;   /* present = false */
        s = fake_alloc(f, tier_a, &idx);
        if (!s) {
            fake_bad(f, "fake arena full");
            continue;
        }
        s->key = req->put_begin->keys[i];
        s->state = 1;
        s->lease = lease;
        fake_location(f, tier_a, idx, &l[i]);
        reserved++;
    }
    p.lease = reserved ? lease : 0;
    p.n_locations = n;
    p.locations = lp;
    r.id = req->id;
    r.result_case = KVNODE__RESPONSE__RESULT_PUT_BEGIN;
    r.put_begin = &p;
    fake_reply(f, &r, NULL, 0);
}

static void fake_lease_op(struct fake *f, Kvnode__Request *req)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__LeaseReply lr = KVNODE__LEASE_REPLY__INIT;
    uint64_t lease = req->get_end->lease;   /* same type in all three ops */
    uint32_t blocks = 0;
    int a;
    size_t i;

    if (lease == 0)
        fake_bad(f, "client sent a lease op for lease 0");
    f->last_lease[req->op_case] = lease;
    if (req->op_case == KVNODE__REQUEST__OP_GET_END) {
        for (i = 0; i < f->n_get_leases; i++)
            if (f->get_leases[i] == lease)
                break;
        if (i == f->n_get_leases) {
            fake_reply_error(f, req->id, -KVNODE_ENOLEASE, "unknown lease (test)");
            return;
        }
        f->get_leases[i] = f->get_leases[--f->n_get_leases];
        blocks = 1;
    } else {
        for (a = 0; a < 2; a++)
            for (i = 0; i < NSLOTS; i++) {
                struct slot *s = &f->slots[a][i];
                if (s->state == 1 && s->lease == lease) {
                    s->state = req->op_case == KVNODE__REQUEST__OP_PUT_COMMIT ? 2 : 0;
                    blocks++;
                }
            }
        if (blocks == 0) {
            fake_reply_error(f, req->id, -KVNODE_ENOLEASE, "unknown lease (test)");
            return;
        }
    }
    lr.blocks = blocks;
    r.id = req->id;
    r.result_case = (Kvnode__Response__ResultCase)req->op_case;
    r.get_end = &lr;
    fake_reply(f, &r, NULL, 0);
}

static void fake_get_inline(struct fake *f, Kvnode__Request *req)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__GetInlineReply g = KVNODE__GET_INLINE_REPLY__INIT;
    ProtobufCBinaryData b[NSLOTS * 2];
    size_t i, n = req->get_inline->n_keys;

    for (i = 0; i < n && i < NSLOTS * 2; i++) {
        int a;
        size_t idx;

        if (!fake_find(f, req->get_inline->keys[i], 2, &a, &idx))
            break;
        b[i].data = f->mem[a] + idx * f->block_bytes;
        b[i].len = (size_t)f->block_bytes;
    }
    if (n > 0 && req->get_inline->keys[0] == KEY_SHORT_BLOB) {
        b[0].data = f->mem[0];
        b[0].len = (size_t)f->block_bytes - 1;
        i = 1;
    }
    g.n_blocks = i;
    g.blocks = b;
    r.id = req->id;
    r.result_case = KVNODE__RESPONSE__RESULT_GET_INLINE;
    r.get_inline = &g;
    fake_reply(f, &r, NULL, 0);
}

static void fake_put_inline(struct fake *f, Kvnode__Request *req)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__PutInlineReply p = KVNODE__PUT_INLINE_REPLY__INIT;
    const Kvnode__PutInlineRequest *q = req->put_inline;
    size_t i;

    if (q->n_blocks != q->n_keys) {
        fake_reply_error(f, req->id, -KVNODE_EINVAL, "blocks != keys");
        return;
    }
    for (i = 0; i < q->n_keys; i++) {
        int a;
        size_t idx;
        struct slot *s;

        if (q->blocks[i].len != f->block_bytes) {
            fake_bad(f, "put_inline blob of the wrong size");
            continue;
        }
        if (fake_find(f, q->keys[i], 2, &a, &idx)) {
            p.existing++;
            continue;
        }
        s = fake_alloc(f, 0, &idx);
        if (!s) {
            fake_bad(f, "fake arena full");
            continue;
        }
        s->key = q->keys[i];
        s->state = 2;
        memcpy(f->mem[0] + idx * f->block_bytes, q->blocks[i].data, q->blocks[i].len);
        p.stored++;
    }
    r.id = req->id;
    r.result_case = KVNODE__RESPONSE__RESULT_PUT_INLINE;
    r.put_inline = &p;
    fake_reply(f, &r, NULL, 0);
}

static void fake_delete(struct fake *f, Kvnode__Request *req)
{
    Kvnode__Response r = KVNODE__RESPONSE__INIT;
    Kvnode__DeleteReply d = KVNODE__DELETE_REPLY__INIT;
    size_t i;

    for (i = 0; i < req->delete_->n_keys; i++) {
        int a;
        size_t idx;
        struct slot *s = fake_find(f, req->delete_->keys[i], 2, &a, &idx);

        if (s) {
            s->state = 0;
            d.deleted++;
        }
    }
    r.id = req->id;
    r.result_case = KVNODE__RESPONSE__RESULT_DELETE;
    r.delete_ = &d;
    fake_reply(f, &r, NULL, 0);
}

/* Keys of a request, for the special-key check and the max_keys bookkeeping. */
static size_t fake_req_keys(Kvnode__Request *req, const int64_t **keys)
{
    switch (req->op_case) {
    case KVNODE__REQUEST__OP_MATCH:      *keys = req->match->keys; return req->match->n_keys;
    case KVNODE__REQUEST__OP_GET_BEGIN:  *keys = req->get_begin->keys; return req->get_begin->n_keys;
    case KVNODE__REQUEST__OP_PUT_BEGIN:  *keys = req->put_begin->keys; return req->put_begin->n_keys;
    case KVNODE__REQUEST__OP_GET_INLINE: *keys = req->get_inline->keys; return req->get_inline->n_keys;
    case KVNODE__REQUEST__OP_PUT_INLINE: *keys = req->put_inline->keys; return req->put_inline->n_keys;
    case KVNODE__REQUEST__OP_DELETE:     *keys = req->delete_->keys; return req->delete_->n_keys;
    default:                             *keys = NULL; return 0;
    }
}

/* Handle one request; 1 when the fake should stop answering. */
static int fake_handle(struct fake *f, Kvnode__Request *req)
{
    const int64_t *keys;
    size_t n = fake_req_keys(req, &keys);
    int op = (int)req->op_case, sp;

    if (req->id != f->expect_id)
        fake_bad(f, "request ids are not 1, 2, 3, ...");
    f->expect_id = req->id + 1;
    if (op < 0 || op >= 32) {
        fake_bad(f, "bad op");
        return 1;
    }
    f->ops[op]++;
    if (n > f->max_keys_in_op[op])
        f->max_keys_in_op[op] = n;
    if (op == KVNODE__REQUEST__OP_HELLO) {
        if (f->hello2 || (f->hello && f->hello_seen))
            fake_bad(f, "second HELLO");
        else if (f->hello)
            f->hello2 = req;    /* the reconnection's; freed by fake_stop */
        else
            f->hello = req;     /* kept; freed by fake_stop */
        fake_hello(f, req);
        return f->hello_mode != HM_OK;
    }
    if (!f->hello || !f->hello_seen)
        fake_bad(f, "first request is not HELLO");
    if (n > 0 && (sp = fake_special(f, req, keys[0])) >= 0)
        return sp;
    if (n > 0 && (keys[0] == KEY_BAD_OFFSET || keys[0] == KEY_BAD_ARENA ||
                  keys[0] == KEY_UNMAPPED) &&
        (op == KVNODE__REQUEST__OP_GET_BEGIN || op == KVNODE__REQUEST__OP_PUT_BEGIN)) {
        fake_bad_location(f, req, keys[0]);
        return 0;
    }
    switch (op) {
    case KVNODE__REQUEST__OP_MATCH:      fake_match(f, req, keys, n); break;
    case KVNODE__REQUEST__OP_GET_BEGIN:  fake_get_begin(f, req); break;
    case KVNODE__REQUEST__OP_PUT_BEGIN:  fake_put_begin(f, req); break;
    case KVNODE__REQUEST__OP_GET_END:
    case KVNODE__REQUEST__OP_PUT_COMMIT:
    case KVNODE__REQUEST__OP_PUT_ABORT:  fake_lease_op(f, req); break;
    case KVNODE__REQUEST__OP_GET_INLINE: fake_get_inline(f, req); break;
    case KVNODE__REQUEST__OP_PUT_INLINE: fake_put_inline(f, req); break;
    case KVNODE__REQUEST__OP_DELETE:     fake_delete(f, req); break;
    case KVNODE__REQUEST__OP_STATS: {
        Kvnode__Response r = KVNODE__RESPONSE__INIT;
        Kvnode__StatsReply s = KVNODE__STATS_REPLY__INIT;
        s.json = (char *)"{\"fake\":true}";
        r.id = req->id;
        r.result_case = KVNODE__RESPONSE__RESULT_STATS;
        r.stats = &s;
        fake_reply(f, &r, NULL, 0);
        break;
    }
    case KVNODE__REQUEST__OP_PING: {
        Kvnode__Response r = KVNODE__RESPONSE__INIT;
        Kvnode__PingReply p = KVNODE__PING_REPLY__INIT;
        p.nonce = req->ping->nonce;
        r.id = req->id;
        r.result_case = KVNODE__RESPONSE__RESULT_PING;
        r.ping = &p;
        fake_reply(f, &r, NULL, 0);
        break;
    }
    default:
        fake_bad(f, "unexpected op");
        return 1;
    }
    return 0;
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    struct pollfd p = { .fd = f->lfd, .events = POLLIN };
    int stop = 0;

    if (poll(&p, 1, SERVER_WAIT_MS) <= 0) {
        fake_bad(f, "no client connected");
        return NULL;
    }
    f->cfd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (f->cfd < 0) {
        fake_bad(f, "accept failed");
        return NULL;
    }
    for (;;) {
        if (f->cfd < 0) {
            /* The client connects again (host-only after a GPU arena failed). */
            p.revents = 0;
            if (poll(&p, 1, SERVER_WAIT_MS) <= 0) {
                fake_bad(f, "the client did not connect again");
                return NULL;
            }
            f->cfd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
            if (f->cfd < 0) {
                fake_bad(f, "accept failed");
                return NULL;
            }
            f->expect_id = 1;
            f->hello_seen = 0;
            stop = 0;
        }
        uint8_t hdr[WIRE_HEADER_BYTES], *payload;
        uint32_t len;
        Kvnode__Request *req;

        if (fake_read_full(f->cfd, hdr, sizeof hdr) < 0) {
            if (f->on_eof)
                f->on_eof(f);
            if (f->reconnects-- > 0) {
                close(f->cfd);
                f->cfd = -1;
                continue;
            }
            break;      /* EOF: the client closed */
        }
        if (stop)
            continue;   /* after a terminal misbehaviour: drain until EOF */
        if (wire_frame_len(hdr, f->max_frame, &len) < 0) {
            fake_bad(f, "client frame over max_frame_bytes (or empty)");
            break;
        }
        if (len > f->max_frame_seen)
            f->max_frame_seen = len;
        payload = malloc(len);
        if (!payload || fake_read_full(f->cfd, payload, len) < 0) {
            free(payload);
            fake_bad(f, "short request frame");
            break;
        }
        req = wire_unpack_request(payload, len);
        free(payload);
        if (!req) {
            fake_bad(f, "undecodable request");
            break;
        }
        stop = fake_handle(f, req);
        if (req != f->hello && req != f->hello2)
            kvnode__request__free_unpacked(req, NULL);
    }
    close(f->cfd);
    f->cfd = -1;
    return NULL;
}

static struct fake *fake_start(int hello_mode, uint64_t block_bytes, uint32_t max_frame,
                               uint32_t max_keys)
{
    struct fake *f = calloc(1, sizeof *f);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int a;

    ck_assert_ptr_nonnull(f);
    f->hello_mode = hello_mode;
    f->block_bytes = block_bytes;
    f->max_frame = max_frame;
    f->max_keys = max_keys;
    f->mem_size = NSLOTS * (size_t)block_bytes;
    f->next_lease = 1000;
    f->expect_id = 1;
    f->cfd = -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/kvnode-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/kvnode.sock", f->dir);
    for (a = 0; a < 2; a++) {
        f->memfd[a] = memfd_create(a ? "fake-hbm" : "fake-host", MFD_CLOEXEC);
        ck_assert_int_ge(f->memfd[a], 0);
        ck_assert_int_eq(ftruncate(f->memfd[a], (off_t)f->mem_size), 0);
        f->mem[a] = mmap(NULL, f->mem_size, PROT_READ | PROT_WRITE, MAP_SHARED, f->memfd[a], 0);
        ck_assert(f->mem[a] != MAP_FAILED);
    }
    f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(f->lfd, 0);
    memcpy(sa.sun_path, f->path, strlen(f->path) + 1);
    ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(f->lfd, 4), 0);
    return f;
}

/* Preloading happens between fake_start and fake_run. */
static void fake_run(struct fake *f)
{
    ck_assert_int_eq(pthread_create(&f->thr, NULL, fake_main, f), 0);
    f->running = 1;
}

/* Join the thread (the client must be closed), check the fake saw no
 * protocol violation, release everything. */
static void fake_stop(struct fake *f)
{
    char bad[256];
    int a;

    if (f->running)
        ck_assert_int_eq(pthread_join(f->thr, NULL), 0);
    memcpy(bad, f->bad, sizeof bad);
    close(f->lfd);
    unlink(f->path);
    rmdir(f->dir);
    for (a = 0; a < 2; a++) {
        munmap(f->mem[a], f->mem_size);
        close(f->memfd[a]);
    }
    if (f->hello)
        kvnode__request__free_unpacked(f->hello, NULL);
    if (f->hello2)
        kvnode__request__free_unpacked(f->hello2, NULL);
    free(f);
    ck_assert_msg(bad[0] == 0, "fake daemon saw: %s", bad);
}

/* --- client helpers --------------------------------------------------------------- */

#define BB 4096u                    /* default block_bytes */
#define MAXF (256u * 1024u)         /* default max_frame_bytes */

static const kvnode_layout test_layout = {
    .model = "qwen2-7b", .dtype = "bf16", .block_tokens = 16, .block_bytes = BB,
    .num_layers = 28, .kv_heads = 4, .head_dim = 128, .tp_size = 2, .tp_rank = 1,
    .extra = NULL,
};

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static kvnode_client *connect_ok(struct fake *f, const kvnode_layout *layout)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect(f->path, layout, &c);

    ck_assert_msg(rc == 0, "connect: %s (%s)", kvnode_strerror(rc), kvnode_connect_error());
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(kvnode_last_error(c), "");
    return c;
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* --- tests -------------------------------------------------------------------------- */

START_TEST(test_hello_fields_and_basic_calls)
{
    int fds0 = count_fds();
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    char *json = NULL;
    const Kvnode__HelloRequest *h;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_uint_eq(kvnode_block_bytes(c), BB);
    ck_assert_int_eq(kvnode_ping(c), 0);
    ck_assert_int_eq(kvnode_stats_json(c, &json), 0);
    ck_assert_str_eq(json, "{\"fake\":true}");
    free(json);
    ck_assert_int_eq(kvnode_ping(c), 0);
    kvnode_close(c);

    ck_assert_ptr_nonnull(f->hello);
    h = f->hello->hello;
    ck_assert_uint_eq(h->min_version, 1);
    ck_assert_uint_eq(h->max_version, 1);
    ck_assert_int_eq(h->cuda_device, -1);
    ck_assert_str_eq(h->client_name, program_invocation_short_name);
    ck_assert_ptr_nonnull(h->layout);
    ck_assert_str_eq(h->layout->model, "qwen2-7b");
    ck_assert_str_eq(h->layout->dtype, "bf16");
    ck_assert_str_eq(h->layout->extra, "");
    ck_assert_uint_eq(h->layout->block_tokens, 16);
    ck_assert_uint_eq(h->layout->block_bytes, BB);
    ck_assert_uint_eq(h->layout->num_layers, 28);
    ck_assert_uint_eq(h->layout->kv_heads, 4);
    ck_assert_uint_eq(h->layout->head_dim, 128);
    ck_assert_uint_eq(h->layout->tp_size, 2);
    ck_assert_uint_eq(h->layout->tp_rank, 1);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_PING], 2);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_STATS], 1);
    ck_assert_uint_eq(f->expect_id, 5);     /* ids 1..4 seen in order */
    fake_stop(f);
    ck_assert_int_eq(count_fds(), fds0);    /* arena fds closed after mmap */
}
END_TEST

/* A daemon from before check words (its HELLO does not offer them, as this
 * fake's): every _checked call with words fails with EVERSION before anything
 * is sent, saying why; without words (NULL) they are the plain calls. */
START_TEST(test_checked_calls_need_a_daemon_with_check_words)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[2] = {100, 101};
    uint64_t w[2] = {7, 8};
    kvnode_tiers t;
    kvnode_lease lease = 1;
    kvnode_loc loc[2];
    kvnode_ticket ticket = 9;
    size_t got = 9;
    uint8_t b0[BB], b1[BB];
    void *dst[2] = {b0, b1};
    const void *src[2] = {b0, b1};

    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_has_check_words(c), 0);
    ck_assert_int_eq(kvnode_match_checked(c, k, w, 2, &t), -KVNODE_EVERSION);
    ck_assert_msg(strstr(kvnode_last_error(c), "too old to honour check words"), "message: %s",
                  kvnode_last_error(c));
    ck_assert_int_eq(kvnode_get_begin_checked(c, k, w, 2, &lease, loc, &got), -KVNODE_EVERSION);
    ck_assert(lease == 0 && got == 0);
    ck_assert_int_eq(kvnode_put_begin_checked(c, k, w, 2, KVNODE_TIER_HOST, &lease, loc),
                     -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_get_batch_checked(c, k, w, 2, dst, 0, &got), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_put_batch_checked(c, k, w, 2, src, 0), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_get_inline_checked(c, k, w, 2, dst, &got), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_put_inline_checked(c, k, w, 2, src), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_delete_checked(c, k, w, 2, &got), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_submit_match_checked(c, k, w, 2, NULL, &ticket), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_submit_delete_checked(c, k, w, 2, NULL, &ticket), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_submit_get_checked(c, k, w, 2, dst, 0, NULL, &ticket), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_submit_put_checked(c, k, w, 2, src, 0, NULL, &ticket), -KVNODE_EVERSION);
    ck_assert_uint_eq(ticket, 0);
    ck_assert_uint_eq(kvnode_pending(c), 0);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_MATCH] + f->ops[KVNODE__REQUEST__OP_GET_BEGIN] +
                      f->ops[KVNODE__REQUEST__OP_PUT_BEGIN] + f->ops[KVNODE__REQUEST__OP_DELETE], 0);
    /* without words: the plain request goes out */
    ck_assert_int_eq(kvnode_match_checked(c, k, NULL, 2, &t), 0);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_MATCH], 1);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

/* A daemon from before per-key answers (its HELLO does not offer them):
 * kvnode_exists, kvnode_delete_each and their submit_ forms fail with
 * EVERSION before anything is sent, their arrays all false. */
START_TEST(test_per_key_calls_need_a_daemon_with_per_key)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[2] = {100, 101};
    bool out[2] = {true, true};
    kvnode_ticket ticket = 9;
    size_t got = 9;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_has_per_key(c), 0);
    ck_assert_int_eq(kvnode_exists(c, k, NULL, 2, out, &got), -KVNODE_EVERSION);
    ck_assert_msg(strstr(kvnode_last_error(c), "too old to answer per key"), "message: %s",
                  kvnode_last_error(c));
    ck_assert(!out[0] && !out[1] && got == 0);
    ck_assert_int_eq(kvnode_delete_each(c, k, NULL, 2, out, &got), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_exists(c, k, NULL, 0, NULL, &got), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_submit_exists(c, k, NULL, 2, out, NULL, &ticket), -KVNODE_EVERSION);
    ck_assert_int_eq(kvnode_submit_delete_each(c, k, NULL, 2, out, NULL, &ticket),
                     -KVNODE_EVERSION);
    ck_assert_uint_eq(ticket, 0);
    ck_assert_uint_eq(kvnode_pending(c), 0);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_MATCH] + f->ops[KVNODE__REQUEST__OP_DELETE], 0);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

/* A per-key reply is checked before the caller sees it: a bitmap of the
 * wrong length, or one whose bits are not its count, is a protocol error
 * (synchronous: EPROTO, the array all false; asynchronous: the completion). */
START_TEST(test_per_key_bitmap_checked)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[10] = {100, 101, 102, 103, 104, 105, 106, 107, 108, 109};
    bool out[10];
    size_t got = 9;
    kvnode_ticket ticket = 0;
    kvnode_completion comp;

    f->per_key = 1;
    fake_preload(f, 0, 101);
    fake_preload(f, 0, 109);
    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_has_per_key(c), 1);
    ck_assert_int_eq(kvnode_exists(c, k, NULL, 10, out, &got), 0);
    ck_assert_uint_eq(got, 2);
    for (size_t i = 0; i < 10; i++)
        ck_assert_msg(out[i] == (i == 1 || i == 9), "key %zu", i);
    k[0] = KEY_BAD_BITMAP;
    ck_assert_int_eq(kvnode_exists(c, k, NULL, 10, out, &got), -KVNODE_EPROTO);
    ck_assert_msg(strstr(kvnode_last_error(c), "bitmap of 1 bytes"), "message: %s",
                  kvnode_last_error(c));
    for (size_t i = 0; i < 10; i++)
        ck_assert(!out[i]);
    ck_assert_uint_eq(got, 0);
    k[0] = KEY_BITMAP_LIES;
    ck_assert_int_eq(kvnode_exists(c, k, NULL, 10, out, &got), -KVNODE_EPROTO);
    memset(out, 1, sizeof out);
    ck_assert_int_eq(kvnode_submit_exists(c, k, NULL, 10, out, NULL, &ticket), 0);
    struct pollfd pfd = { .fd = kvnode_event_fd(c), .events = POLLIN };
    ck_assert_int_eq(poll(&pfd, 1, SERVER_WAIT_MS), 1);
    ck_assert_uint_eq(kvnode_drain(c, &comp, 1), 1);
    ck_assert_uint_eq(comp.ticket, ticket);
    ck_assert_int_eq(comp.op, KVNODE_OP_EXISTS);
    ck_assert_int_eq(comp.rc, -KVNODE_EPROTO);
    ck_assert(out[0] && out[9]);        /* untouched on failure */
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_observer_client)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {100};
    kvnode_lease lease = 1;
    kvnode_loc loc[1];
    size_t got = 9, m = 9;
    char *json = NULL;
    uint8_t buf[BB];
    void *dst[1] = {buf};
    const void *src[1] = {buf};

    fake_run(f);
    c = connect_ok(f, NULL);
    ck_assert_uint_eq(kvnode_block_bytes(c), 0);
    ck_assert_int_eq(kvnode_match(c, k, 1, &m), -KVNODE_ESTATE);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "observer"));
    ck_assert_int_eq(kvnode_get_begin(c, k, 1, &lease, loc, &got), -KVNODE_ESTATE);
    ck_assert(lease == 0 && got == 0);
    ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HOST, &lease, loc), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_get_end(c, 5), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_put_commit(c, 5), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_put_abort(c, 5), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_get(c, k, 1, dst, &got), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_put(c, k, 1, src), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_get_inline(c, k, 1, dst, &got), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_put_inline(c, k, 1, src), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_delete(c, k, 1, &got), -KVNODE_ESTATE);
    ck_assert_int_eq(kvnode_get_end(c, 0), 0);
    ck_assert_int_eq(kvnode_stats_json(c, &json), 0);
    free(json);
    ck_assert_int_eq(kvnode_ping(c), 0);
    kvnode_close(c);
    ck_assert(!f->hello_has_layout);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_MATCH], 0);   /* refused locally */
    fake_stop(f);
}
END_TEST

START_TEST(test_get_begin_points_into_shared_arenas)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[5] = {100, 101, 200, 102, 103};
    kvnode_loc loc[5];
    kvnode_lease lease = 0;
    size_t got = 0, m = 0, i;
    uint64_t l;

    fake_preload(f, 0, 999);        /* occupy slot 0 so offsets are not all 0 */
    fake_preload(f, 0, 100);
    fake_preload(f, 0, 101);
    fake_preload(f, 1, 200);        /* hbm arena */
    fake_preload(f, 0, 103);        /* after the gap: not part of the prefix */
    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_match(c, k, 5, &m), 0);
    ck_assert_uint_eq(m, 3);
    ck_assert_int_eq(kvnode_get_begin(c, k, 5, &lease, loc, &got), 0);
    ck_assert_uint_eq(got, 3);
    ck_assert(lease != 0);
    for (i = 0; i < 3; i++) {
        ck_assert_ptr_nonnull(loc[i].ptr);
        ck_assert_msg(check_pattern(loc[i].ptr, BB, k[i]), "block %zu bytes differ", i);
    }
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HOST);
    ck_assert_int_eq(loc[0].device, -1);
    ck_assert_int_eq(loc[2].tier, KVNODE_TIER_HBM);
    ck_assert_int_eq(loc[2].device, 0);
    /* Not a copy: a daemon-side write shows through the client's pointer. */
    ck_assert(loc[0].ptr != (void *)(f->mem[0] + BB));
    f->mem[0][BB] ^= 0xff;
    ck_assert_uint_eq(((uint8_t *)loc[0].ptr)[0], f->mem[0][BB]);
    f->mem[0][BB] ^= 0xff;
    l = lease;
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    ck_assert_int_eq(kvnode_get_end(c, 0), 0);      /* no round trip */
    /* nothing cached: lease 0, got 0 */
    k[0] = 555;
    ck_assert_int_eq(kvnode_get_begin(c, k, 1, &lease, loc, &got), 0);
    ck_assert(lease == 0 && got == 0);
    kvnode_close(c);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_GET_END], 1);
    ck_assert(f->last_lease[KVNODE__REQUEST__OP_GET_END] == l);
    fake_stop(f);
}
END_TEST

START_TEST(test_put_begin_writes_reach_daemon)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[3] = {100, 300, 301}, kh[1] = {400}, ka[1] = {500};
    kvnode_loc loc[3];
    kvnode_lease lease = 0;
    size_t i, m, got;
    int a;
    unsigned commits;

    fake_preload(f, 0, 100);
    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_put_begin(c, k, 3, KVNODE_TIER_HOST, &lease, loc), 0);
    ck_assert(lease != 0);
    ck_assert_ptr_null(loc[0].ptr);             /* already stored */
    for (i = 1; i < 3; i++) {
        ck_assert_ptr_nonnull(loc[i].ptr);
        ck_assert_int_eq(loc[i].tier, KVNODE_TIER_HOST);
        fill_pattern(loc[i].ptr, BB, k[i]);
    }
    ck_assert_int_eq(kvnode_put_commit(c, lease), 0);
    /* The bytes written through the client's mapping are in the daemon's. */
    for (i = 1; i < 3; i++) {
        size_t idx;
        ck_assert_ptr_nonnull(fake_find(f, k[i], 2, &a, &idx));
        ck_assert(check_pattern(f->mem[a] + idx * BB, BB, k[i]));
    }
    ck_assert_int_eq(kvnode_match(c, k, 3, &m), 0);
    ck_assert_uint_eq(m, 3);

    /* hbm tier request */
    ck_assert_int_eq(kvnode_put_begin(c, kh, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HBM);
    ck_assert_int_eq(loc[0].device, 0);
    fill_pattern(loc[0].ptr, BB, kh[0]);
    ck_assert_int_eq(kvnode_put_commit(c, lease), 0);
    ck_assert_int_eq(kvnode_get_begin(c, kh, 1, &lease, loc, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert(check_pattern(loc[0].ptr, BB, kh[0]));
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);

    /* abort frees the reservation */
    ck_assert_int_eq(kvnode_put_begin(c, ka, 1, KVNODE_TIER_HOST, &lease, loc), 0);
    ck_assert_int_eq(kvnode_put_abort(c, lease), 0);
    ck_assert_int_eq(kvnode_match(c, ka, 1, &m), 0);
    ck_assert_uint_eq(m, 0);

    /* all present: lease 0, every ptr NULL, committing lease 0 is local */
    commits = f->ops[KVNODE__REQUEST__OP_PUT_COMMIT];
    ck_assert_int_eq(kvnode_put_begin(c, k, 3, KVNODE_TIER_HOST, &lease, loc), 0);
    ck_assert(lease == 0);
    for (i = 0; i < 3; i++)
        ck_assert_ptr_null(loc[i].ptr);
    ck_assert_int_eq(kvnode_put_commit(c, lease), 0);
    ck_assert_int_eq(kvnode_put_abort(c, lease), 0);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_PUT_COMMIT], commits);
    kvnode_close(c);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_PUT_ABORT], 1);
    fake_stop(f);
}
END_TEST

START_TEST(test_copying_get_put_split_by_max_keys)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 4);
    kvnode_client *c;
    kvnode_key k[12];
    uint8_t *src_buf = malloc(12 * BB), *dst_buf = calloc(12, BB);
    const void *src[12];
    void *dst[12];
    size_t i, got = 0, m, del;

    ck_assert_ptr_nonnull(src_buf);
    ck_assert_ptr_nonnull(dst_buf);
    for (i = 0; i < 12; i++) {
        k[i] = 7000 + (int64_t)i;
        fill_pattern(src_buf + i * BB, BB, k[i]);
        src[i] = src_buf + i * BB;
        dst[i] = dst_buf + i * BB;
    }
    fake_preload(f, 0, k[3]);       /* one already stored: its slot is skipped */
    fake_run(f);
    c = connect_ok(f, &test_layout);

    /* zero-copy calls refuse more than max_keys */
    ck_assert_int_eq(kvnode_match(c, k, 5, &m), -KVNODE_ETOOBIG);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "max_keys"));
    ck_assert_int_eq(kvnode_delete(c, k, 5, &del), -KVNODE_ETOOBIG);

    ck_assert_int_eq(kvnode_put(c, k, 10, src), 0);            /* chunks 4, 4, 2 */
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_PUT_BEGIN], 3);
    ck_assert_uint_eq(f->max_keys_in_op[KVNODE__REQUEST__OP_PUT_BEGIN], 4);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_PUT_COMMIT], 3);

    ck_assert_int_eq(kvnode_get(c, k, 12, dst, &got), 0);      /* 4, 4, then 2 of 4: stop */
    ck_assert_uint_eq(got, 10);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_GET_BEGIN], 3);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_GET_END], 3);
    for (i = 0; i < 10; i++)
        ck_assert_msg(check_pattern(dst[i], BB, k[i]), "block %zu", i);
    for (i = 10; i < 12; i++)
        ck_assert_uint_eq(((uint8_t *)dst[i])[0], 0);

    /* a short first chunk stops the get at once */
    k[1] = 99999;
    ck_assert_int_eq(kvnode_get(c, k, 12, dst, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_GET_BEGIN], 4);
    kvnode_close(c);
    fake_stop(f);
    free(src_buf);
    free(dst_buf);
}
END_TEST

START_TEST(test_inline_split_by_frame_size)
{
    /* 16 KiB frames, 1 KiB blocks: at most 15 blocks per request. */
    const uint32_t maxf = 16384, bb = 1024;
    struct fake *f = fake_start(HM_OK, bb, maxf, 1000);
    kvnode_layout lay = test_layout;
    kvnode_client *c;
    enum { N = 45 };
    kvnode_key k[N];
    uint8_t *src_buf = malloc(N * bb), *dst_buf = calloc(N, bb);
    const void *src[N];
    void *dst[N];
    size_t i, got = 0;
    unsigned puts;

    ck_assert_ptr_nonnull(src_buf);
    ck_assert_ptr_nonnull(dst_buf);
    lay.block_bytes = bb;
    for (i = 0; i < N; i++) {
        k[i] = 8000 + (int64_t)i;
        fill_pattern(src_buf + i * bb, bb, k[i]);
        src[i] = src_buf + i * bb;
        dst[i] = dst_buf + i * bb;
    }
    fake_run(f);
    c = connect_ok(f, &lay);
    ck_assert_int_eq(kvnode_put_inline(c, k, 40, src), 0);
    puts = f->ops[KVNODE__REQUEST__OP_PUT_INLINE];
    ck_assert_uint_ge(puts, 3);             /* 40 blocks of 1 KiB need >= 3 frames */
    ck_assert_uint_le(f->max_frame_seen, maxf);
    ck_assert_int_eq(kvnode_get_inline(c, k, N, dst, &got), 0);
    ck_assert_uint_eq(got, 40);
    for (i = 0; i < 40; i++)
        ck_assert_msg(check_pattern(dst[i], bb, k[i]), "block %zu", i);
    ck_assert_uint_eq(((uint8_t *)dst[40])[0], 0);
    /* the get stops at the first short chunk, never asking past it */
    ck_assert_uint_ge(f->ops[KVNODE__REQUEST__OP_GET_INLINE], 3);
    ck_assert_uint_le(f->max_keys_in_op[KVNODE__REQUEST__OP_GET_INLINE], 15);
    /* wrong blob size -> EPROTO, client still usable */
    k[0] = KEY_SHORT_BLOB;
    ck_assert_int_eq(kvnode_get_inline(c, k, 1, dst, &got), -KVNODE_EPROTO);
    ck_assert_uint_eq(got, 0);
    ck_assert_int_eq(kvnode_ping(c), 0);
    kvnode_close(c);
    fake_stop(f);
    free(src_buf);
    free(dst_buf);
}
END_TEST

START_TEST(test_error_reply_surfaces_message)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {KEY_ERR};
    kvnode_loc loc[1];
    kvnode_lease lease = 7;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HOST, &lease, loc), -KVNODE_ENOSPC);
    ck_assert(lease == 0);
    ck_assert_str_eq(kvnode_last_error(c), "host tier full (test)");
    ck_assert_int_eq(kvnode_get_end(c, 12345), -KVNODE_ENOLEASE);
    ck_assert_str_eq(kvnode_last_error(c), "unknown lease (test)");
    ck_assert_int_eq(kvnode_ping(c), 0);        /* still usable */
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_timeout_then_closed)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {KEY_SILENT};
    size_t m;
    int64_t t0, dt;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    kvnode_set_timeout(c, 200);
    kvnode_set_timeout(c, 0);                   /* ignored */
    t0 = now_ms();
    ck_assert_int_eq(kvnode_match(c, k, 1, &m), -KVNODE_ETIMEDOUT);
    dt = now_ms() - t0;
    ck_assert_int_ge(dt, 150);
    ck_assert_int_lt(dt, 5000);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "timed out"));
    /* a late reply could desync the stream: the client is done */
    ck_assert_int_eq(kvnode_ping(c), -KVNODE_ECLOSED);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "timed out"));
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_env_socket_and_timeout)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c = NULL;
    kvnode_key k[1] = {KEY_SILENT};
    size_t m;
    int64_t t0;

    fake_run(f);
    ck_assert_int_eq(setenv("KVNODE_SOCKET", f->path, 1), 0);
    ck_assert_int_eq(setenv("KVNODE_TIMEOUT_MS", "150", 1), 0);
    ck_assert_int_eq(kvnode_connect(NULL, &test_layout, &c), 0);
    unsetenv("KVNODE_SOCKET");
    unsetenv("KVNODE_TIMEOUT_MS");
    t0 = now_ms();
    ck_assert_int_eq(kvnode_match(c, k, 1, &m), -KVNODE_ETIMEDOUT);
    ck_assert_int_lt(now_ms() - t0, 5000);      /* not the 10 s default */
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

/* Loop over the reply faults that leave the stream unusable. */
static const struct {
    int64_t key;
    int rc;
    const char *msg;                /* expected in kvnode_last_error */
} fatal_cases[] = {
    {KEY_HANGUP, -KVNODE_ECLOSED, "closed"},
    {KEY_OVERSIZE, -KVNODE_EPROTO, "exceeds"},
    {KEY_WRONG_ID, -KVNODE_EPROTO, "id"},
    {KEY_GARBAGE, -KVNODE_EPROTO, "undecodable"},
};

START_TEST(test_fatal_reply_faults)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {fatal_cases[_i].key};
    size_t m = 5;
    int64_t t0;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    t0 = now_ms();
    ck_assert_int_eq(kvnode_match(c, k, 1, &m), fatal_cases[_i].rc);
    /* Answered at once: the oversized header was refused without waiting
     * for (or allocating) its payload. */
    ck_assert_int_lt(now_ms() - t0, 5000);
    ck_assert_uint_eq(m, 0);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), fatal_cases[_i].msg));
    ck_assert_int_eq(kvnode_ping(c), -KVNODE_ECLOSED);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "unusable"));
    ck_assert_int_eq(kvnode_match(c, k, 1, &m), -KVNODE_ECLOSED);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_bad_locations_release_lease)
{
    static const int64_t bad[3] = {KEY_BAD_OFFSET, KEY_BAD_ARENA, KEY_UNMAPPED};
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_loc loc[1];
    kvnode_lease lease;
    size_t got;
    int i;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    for (i = 0; i < 3; i++) {
        kvnode_key k[1] = {bad[i]};

        lease = 1;
        got = 1;
        ck_assert_int_eq(kvnode_get_begin(c, k, 1, &lease, loc, &got), -KVNODE_EPROTO);
        ck_assert(lease == 0 && got == 0);
        ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "arena"));
        ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_GET_END], (unsigned)i + 1);
        ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HOST, &lease, loc),
                         -KVNODE_EPROTO);
        ck_assert(lease == 0);
        ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_PUT_ABORT], (unsigned)i + 1);
    }
    ck_assert_int_eq(kvnode_ping(c), 0);        /* a bad message does not kill the stream */
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_wrong_result_type)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {KEY_WRONG_RESULT};
    size_t m;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_match(c, k, 1, &m), -KVNODE_EPROTO);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "protocol"));
    ck_assert_int_eq(kvnode_ping(c), 0);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_unexpected_fd_is_closed)
{
    int fds0 = count_fds();
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {KEY_EXTRA_FD};
    size_t m = 9;
    int i;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    for (i = 0; i < 5; i++) {
        ck_assert_int_eq(kvnode_match(c, k, 1, &m), 0);
        ck_assert_uint_eq(m, 0);
    }
    kvnode_close(c);
    fake_stop(f);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

START_TEST(test_delete)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[3] = {100, 101, 999};
    size_t del = 9, m = 9;

    fake_preload(f, 0, 100);
    fake_preload(f, 0, 101);
    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_delete(c, k, 3, &del), 0);
    ck_assert_uint_eq(del, 2);
    ck_assert_int_eq(kvnode_match(c, k, 3, &m), 0);
    ck_assert_uint_eq(m, 0);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_argument_checks)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[2] = {1, 2};
    kvnode_loc loc[2];
    kvnode_lease lease = 5;
    size_t n = 5;
    uint8_t buf[BB];
    void *dst[2] = {buf, NULL};
    const void *src[2] = {buf, NULL};
    char **nojson = NULL;
    unsigned i, total = 0;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    /* n == 0: valid, answered locally */
    ck_assert_int_eq(kvnode_match(c, NULL, 0, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kvnode_get_begin(c, NULL, 0, &lease, NULL, &n), 0);
    ck_assert(lease == 0 && n == 0);
    lease = 5;
    ck_assert_int_eq(kvnode_put_begin(c, NULL, 0, KVNODE_TIER_HOST, &lease, NULL), 0);
    ck_assert(lease == 0);
    ck_assert_int_eq(kvnode_get(c, NULL, 0, NULL, &n), 0);
    ck_assert_int_eq(kvnode_put(c, NULL, 0, NULL), 0);
    ck_assert_int_eq(kvnode_get_inline(c, NULL, 0, NULL, &n), 0);
    ck_assert_int_eq(kvnode_put_inline(c, NULL, 0, NULL), 0);
    ck_assert_int_eq(kvnode_delete(c, NULL, 0, &n), 0);
    /* NULL arrays with n > 0 */
    ck_assert_int_eq(kvnode_match(c, NULL, 1, &n), -KVNODE_EINVAL);
    ck_assert_str_ne(kvnode_last_error(c), "");
    ck_assert_int_eq(kvnode_match(c, k, 1, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_get_begin(c, k, 1, &lease, NULL, &n), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HOST, &lease, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_put_begin(c, k, 1, 7, &lease, loc), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "tier"));
    ck_assert_int_eq(kvnode_get(c, k, 2, dst, &n), -KVNODE_EINVAL);     /* dst[1] NULL */
    ck_assert_int_eq(kvnode_put(c, k, 2, src), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_get_inline(c, k, 1, NULL, &n), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_put_inline(c, NULL, 1, src), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_delete(c, NULL, 1, &n), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_stats_json(c, nojson), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_match(NULL, k, 1, &n), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_ping(NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_get_end(NULL, 1), -KVNODE_EINVAL);
    kvnode_set_timeout(NULL, 5);
    ck_assert_uint_eq(kvnode_block_bytes(NULL), 0);
    kvnode_close(NULL);
    ck_assert_int_eq(kvnode_ping(c), 0);
    kvnode_close(c);
    for (i = 0; i < 32; i++)
        if (i != KVNODE__REQUEST__OP_HELLO && i != KVNODE__REQUEST__OP_PING)
            total += f->ops[i];
    ck_assert_uint_eq(total, 0);    /* none of the above reached the daemon */
    fake_stop(f);
}
END_TEST

/* A request over the daemon's max_frame_bytes is refused before sending and
 * leaves the client usable; an inline block that cannot fit is ETOOBIG. */
START_TEST(test_request_over_frame_limit)
{
    struct fake *f = fake_start(HM_OK, BB, 1024, 1000);
    kvnode_client *c;
    kvnode_key k[200];
    uint8_t buf[BB];
    const void *src[1] = {buf};
    void *dst[1] = {buf};
    size_t i, m = 7, got = 7;

    for (i = 0; i < 200; i++)
        k[i] = INT64_MIN + (int64_t)i;     /* 10-byte varints: 2000 bytes */
    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_match(c, k, 200, &m), -KVNODE_ETOOBIG);
    ck_assert_uint_eq(m, 0);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "frame limit"));
    ck_assert_int_eq(kvnode_put_inline(c, k, 1, src), -KVNODE_ETOOBIG);
    ck_assert_int_eq(kvnode_get_inline(c, k, 1, dst, &got), -KVNODE_ETOOBIG);
    ck_assert_uint_eq(got, 0);
    ck_assert_int_eq(kvnode_match(c, k, 10, &m), 0);       /* fits: fine */
    ck_assert_int_eq(kvnode_ping(c), 0);
    kvnode_close(c);
    ck_assert_uint_eq(f->ops[KVNODE__REQUEST__OP_MATCH], 1);
    fake_stop(f);       /* also checks the ids it saw stayed 1, 2, 3, ... */
}
END_TEST

static const struct {
    int mode;
    int rc;
    const char *msg;
} hello_cases[] = {
    {HM_ERROR, -KVNODE_ELAYOUT, "layout conflicts: test"},
    {HM_REFUSE, -KVNODE_ELIMIT, "too many clients (test)"},
    {HM_OVERSIZE, -KVNODE_EPROTO, "exceeds"},
    {HM_FD_MISMATCH, -KVNODE_EPROTO, "fd"},
    {HM_BAD_BLOCK_BYTES, -KVNODE_EPROTO, "block_bytes"},
    {HM_BAD_VERSION, -KVNODE_EPROTO, "version"},
    {HM_SHORT_FILE, -KVNODE_EPROTO, "arena 1"},
};

START_TEST(test_hello_failures)
{
    int fds0 = count_fds();
    struct fake *f = fake_start(hello_cases[_i].mode, BB, MAXF, 64);
    kvnode_client *c = (kvnode_client *)&fds0;   /* must become NULL */
    int rc;

    fake_run(f);
    rc = kvnode_connect(f->path, &test_layout, &c);
    ck_assert_int_eq(rc, hello_cases[_i].rc);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(kvnode_connect_error(), hello_cases[_i].msg) != NULL,
                  "connect error '%s' lacks '%s'", kvnode_connect_error(), hello_cases[_i].msg);
    ck_assert_str_eq(kvnode_last_error(NULL), kvnode_connect_error());
    fake_stop(f);
    ck_assert_int_eq(count_fds(), fds0);        /* passed fds closed, mappings gone */
}
END_TEST

/* What a forked child writing one byte at p ends with: its exit code, or
 * 128 + the signal that killed it. */
static int child_write(void *p)
{
    pid_t pid = fork();
    int st;

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct rlimit none = { 0, 0 };
        setrlimit(RLIMIT_CORE, &none);      /* meant to fault: no core file */
        signal(SIGSEGV, SIG_DFL);           /* die by the signal, also under ASan (which catches it) */
        *(volatile uint8_t *)p ^= 0xff;
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

START_TEST(test_reader_maps_read_only)
{
    int fds0 = count_fds();
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c = NULL;
    kvnode_key k = 100;
    kvnode_loc loc;
    kvnode_lease lease = 0;
    size_t got = 0;

    fake_preload(f, 0, 100);
    fake_run(f);
    ck_assert_int_eq(kvnode_connect_flags(f->path, &test_layout, -1, KVNODE_CONNECT_READER, &c), 0);
    ck_assert_int_eq(kvnode_is_reader(c), 1);
    ck_assert_int_eq(kvnode_get_begin(c, &k, 1, &lease, &loc, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert(check_pattern(loc.ptr, BB, k));
    /* PROT_READ, even over this fake's writable memfd. */
    ck_assert_int_eq(child_write(loc.ptr), 128 + SIGSEGV);
    ck_assert(check_pattern(loc.ptr, BB, k));
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    kvnode_close(c);
    ck_assert(f->hello->hello->reader);
    fake_stop(f);
    ck_assert_int_eq(count_fds(), fds0);

    /* An observer sends no reader flag and is no reader. */
    f = fake_start(HM_OK, BB, MAXF, 64);
    fake_run(f);
    ck_assert_int_eq(kvnode_connect_flags(f->path, NULL, -1, KVNODE_CONNECT_READER, &c), 0);
    ck_assert_int_eq(kvnode_is_reader(c), 0);
    kvnode_close(c);
    ck_assert(!f->hello->hello->reader);
    fake_stop(f);
}
END_TEST

START_TEST(test_reader_flag_not_granted_or_unasked)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c = NULL;
    kvnode_key k = 100;
    kvnode_loc loc;
    kvnode_lease lease = 0;
    size_t got = 0;

    /* A daemon that predates readers ignores the flag: an ordinary client. */
    f->reply_reader = -1;
    fake_preload(f, 0, 100);
    fake_run(f);
    ck_assert_int_eq(kvnode_connect_flags(f->path, &test_layout, -1, KVNODE_CONNECT_READER, &c), 0);
    ck_assert_int_eq(kvnode_is_reader(c), 0);
    ck_assert_int_eq(kvnode_get_begin(c, &k, 1, &lease, &loc, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert_int_eq(child_write(loc.ptr), 0);
    ck_assert(!check_pattern(loc.ptr, BB, k));      /* the write landed */
    ((uint8_t *)loc.ptr)[0] ^= 0xff;
    ck_assert(check_pattern(loc.ptr, BB, k));
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    kvnode_close(c);
    fake_stop(f);

    /* A reply that holds an ordinary client to reading is a protocol error. */
    f = fake_start(HM_OK, BB, MAXF, 64);
    f->reply_reader = 1;
    fake_run(f);
    c = (kvnode_client *)&got;
    ck_assert_int_eq(kvnode_connect(f->path, &test_layout, &c), -KVNODE_EPROTO);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(kvnode_connect_error(), "did not ask"), "%s", kvnode_connect_error());
    fake_stop(f);

    /* Flags this library does not know (0x2 is KVNODE_CONNECT_PREFAULT, 0x4
     * KVNODE_CONNECT_BUSY_POLL). */
    c = (kvnode_client *)&got;
    ck_assert_int_eq(kvnode_connect_flags("/nonexistent/kvnode.sock", &test_layout, -1, 0x1Eu, &c),
                     -KVNODE_EINVAL);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(kvnode_connect_error(), "unknown flags 0x18"), "%s", kvnode_connect_error());
    ck_assert_int_eq(kvnode_is_reader(NULL), 0);
}
END_TEST

START_TEST(test_connect_errors)
{
    kvnode_client *c = NULL;
    kvnode_layout lay = test_layout;
    char longpath[200];

    ck_assert_int_eq(kvnode_connect("/nonexistent-kvnode/x.sock", &test_layout, &c),
                     -KVNODE_ECONNECT);
    ck_assert_ptr_null(c);
    ck_assert_str_eq(kvnode_connect_error(),
                     "connect /nonexistent-kvnode/x.sock: No such file or directory");
    lay.model = NULL;
    ck_assert_int_eq(kvnode_connect("/nonexistent-kvnode/x.sock", &lay, &c), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvnode_connect_error(), "model"));
    lay.model = "m";
    lay.dtype = NULL;
    ck_assert_int_eq(kvnode_connect("/nonexistent-kvnode/x.sock", &lay, &c), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvnode_connect_error(), "dtype"));
    ck_assert_int_eq(kvnode_connect("/x", &test_layout, NULL), -KVNODE_EINVAL);
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[0] = '/';
    longpath[sizeof longpath - 1] = 0;
    ck_assert_int_eq(kvnode_connect(longpath, &test_layout, &c), -KVNODE_ECONNECT);
    ck_assert_ptr_nonnull(strstr(kvnode_connect_error(), "too long"));
    ck_assert_ptr_null(c);
}
END_TEST

/* --- GPU (HBM) arenas and the CUDA runtime ---------------------------------------------- */

/* A fake CUDA runtime: IPC handles made by the fake daemon open to its own
 * "device memory" (the memfd mapping behind arena 2); it records every call. */
static struct {
    int current;                    /* the current device */
    int fail_open, fail_copy, fail_register, fail_get_device, fail_sync;
    unsigned opens, closes, registers, unregisters, copies, sets, last_error_calls;
    unsigned streams_made, streams_gone, syncs;     /* cudaStreamCreate/Destroy/Synchronize */
    void *copy_stream;              /* the stream of the last cudaMemcpyAsync */
    void *sync_stream;              /* the stream of the last cudaStreamSynchronize */
    int sync_device;                /* the current device then */
    int open_device;                /* current device during ipc_open */
    unsigned open_flags, register_flags;
    int copy_kind, register_device;
    void *opened, *closed, *registered, *unregistered;
    size_t register_size;
} frt;

static int frt_ipc_open(void **ptr, cudart_ipc_handle h, unsigned int flags)
{
    uintptr_t addr;

    frt.opens++;
    frt.open_device = frt.current;
    frt.open_flags = flags;
    if (frt.fail_open || memcmp(h.reserved, FAKE_IPC_MAGIC, sizeof FAKE_IPC_MAGIC) != 0)
        return 400;                 /* cudaErrorInvalidResourceHandle */
    memcpy(&addr, h.reserved + 32, sizeof addr);
    *ptr = frt.opened = (void *)addr;
    return 0;
}

static int frt_ipc_close(void *ptr)
{
    frt.closes++;
    frt.closed = ptr;
    return 0;
}

static int frt_host_register(void *ptr, size_t size, unsigned int flags)
{
    frt.registers++;
    frt.register_device = frt.current;
    frt.register_flags = flags;
    if (frt.fail_register)
        return 2;                   /* cudaErrorMemoryAllocation */
    frt.registered = ptr;
    frt.register_size = size;
    return 0;
}

static int frt_host_unregister(void *ptr)
{
    frt.unregisters++;
    frt.unregistered = ptr;
    return 0;
}

static int frt_copy(void *dst, const void *src, size_t n, int kind)
{
    frt.copies++;
    frt.copy_kind = kind;
    if (frt.fail_copy)
        return 700;                 /* cudaErrorIllegalAddress */
    memcpy(dst, src, n);
    return 0;
}

/* Copies land at once: the order of copies and syncs is what is checked. */
static int frt_copy_async(void *dst, const void *src, size_t n, int kind, void *stream)
{
    frt.copy_stream = stream;
    return frt_copy(dst, src, n, kind);
}

static int frt_stream_create(void **stream, unsigned int flags)
{
    ck_assert_uint_eq(flags, 1);    /* cudaStreamNonBlocking */
    frt.streams_made++;
    *stream = &frt.streams_made;
    return 0;
}

static int frt_stream_destroy(void *stream)
{
    ck_assert_ptr_eq(stream, &frt.streams_made);
    frt.streams_gone++;
    return 0;
}

static int frt_stream_sync(void *stream)
{
    frt.syncs++;
    frt.sync_stream = stream;
    frt.sync_device = frt.current;
    return frt.fail_sync ? 700 : 0;     /* cudaErrorIllegalAddress */
}

static int frt_set_device(int d)
{
    frt.sets++;
    frt.current = d;
    return 0;
}

static int frt_get_device(int *d)
{
    if (frt.fail_get_device)
        return 35;                  /* cudaErrorInsufficientDriver */
    *d = frt.current;
    return 0;
}

static const char *frt_error_string(int err)
{
    switch (err) {
    case 2:   return "fake: out of memory";
    case 35:  return "fake: CUDA driver version is insufficient for CUDA runtime version";
    case 400: return "fake: invalid resource handle";
    case 700: return "fake: an illegal memory access was encountered";
    default:  return "fake: unknown";
    }
}

/* A bus id per device, as cudaDeviceGetPCIBusId writes it. */
static int frt_pci_bus_id(char *buf, int len, int device)
{
    snprintf(buf, (size_t)len, "0000:%02X:00.0", 0x10 + device);
    return 0;
}

static int frt_get_last_error(void)
{
    frt.last_error_calls++;
    return 0;
}

static const struct cudart fake_runtime = {
    .ipc_open = frt_ipc_open, .ipc_close = frt_ipc_close,
    .host_register = frt_host_register, .host_unregister = frt_host_unregister,
    .copy = frt_copy, .set_device = frt_set_device, .get_device = frt_get_device,
    .error_string = frt_error_string, .get_last_error = frt_get_last_error,
    .pci_bus_id = frt_pci_bus_id, .copy_async = frt_copy_async,
    .stream_create = frt_stream_create, .stream_destroy = frt_stream_destroy,
    .stream_sync = frt_stream_sync, .lib = "fake-cudart",
};
static const struct cudart no_runtime;          /* ipc_open NULL: "not installed" */

/* Every test of this case starts with the fake runtime reset and no
 * KVNODE_CUDA_DEVICE, and leaves the normal runtime search behind (the
 * tests may share one process: CK_FORK=no). */
static void hbm_setup(void)
{
    memset(&frt, 0, sizeof frt);
    unsetenv("KVNODE_CUDA_DEVICE");
    cudart_set_override(NULL);
}

static void hbm_teardown(void)
{
    cudart_set_override(NULL);
    unsetenv("KVNODE_CUDA_DEVICE");
}

static kvnode_client *connect_dev_ok(struct fake *f, const kvnode_layout *layout, int dev)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect_device(f->path, layout, dev, &c);

    ck_assert_msg(rc == 0, "connect: %s (%s)", kvnode_strerror(rc), kvnode_connect_error());
    ck_assert_ptr_nonnull(c);
    return c;
}

START_TEST(test_hbm_sim_arena_is_mapped)
{
    int fds0 = count_fds();
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[2] = {100, 200}, kp[1] = {300};
    kvnode_loc loc[2];
    kvnode_lease lease = 0;
    size_t got = 0, idx;
    uint8_t buf[2][BB];
    void *dst[2] = {buf[0], buf[1]};
    int a;

    cudart_set_override(&no_runtime);
    f->hbm_device = 3;
    fake_preload(f, 0, 100);
    fake_preload(f, 1, 999);        /* slot 0: offsets are not all 0 */
    fake_preload(f, 1, 200);
    fake_run(f);
    c = connect_dev_ok(f, &test_layout, 3);
    ck_assert_int_eq(kvnode_cuda_device(c), 3);
    ck_assert_int_eq(kvnode_get_begin(c, k, 2, &lease, loc, &got), 0);
    ck_assert_uint_eq(got, 2);
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HOST);
    ck_assert_int_eq(loc[0].device, -1);
    ck_assert_int_eq(loc[1].tier, KVNODE_TIER_HBM);
    ck_assert_int_eq(loc[1].device, 3);
    ck_assert(check_pattern(loc[1].ptr, BB, 200));
    /* A mapping of the daemon's memory, not a copy: each side sees the other's writes. */
    ck_assert(loc[1].ptr != (void *)(f->mem[1] + BB));
    f->mem[1][BB] ^= 0x5a;
    ck_assert_uint_eq(((uint8_t *)loc[1].ptr)[0], f->mem[1][BB]);
    ((uint8_t *)loc[1].ptr)[1] ^= 0xa5;
    ck_assert_uint_eq(f->mem[1][BB + 1], ((uint8_t *)loc[1].ptr)[1]);
    f->mem[1][BB] ^= 0x5a;
    ((uint8_t *)loc[1].ptr)[1] ^= 0xa5;
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    /* the copying get reads a simulated device with memcpy */
    ck_assert_int_eq(kvnode_get(c, k, 2, dst, &got), 0);
    ck_assert_uint_eq(got, 2);
    ck_assert(check_pattern(buf[0], BB, 100) && check_pattern(buf[1], BB, 200));
    /* a put to the HBM tier lands in the device's arena */
    ck_assert_int_eq(kvnode_put_begin(c, kp, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HBM);
    ck_assert_int_eq(loc[0].device, 3);
    fill_pattern(loc[0].ptr, BB, 300);
    ck_assert_int_eq(kvnode_put_commit(c, lease), 0);
    ck_assert_ptr_nonnull(fake_find(f, 300, 2, &a, &idx));
    ck_assert_int_eq(a, 1);
    ck_assert(check_pattern(f->mem[1] + idx * BB, BB, 300));
    ck_assert_int_eq(kvnode_pin_host(c), -KVNODE_ESTATE);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "no CUDA runtime (libcudart not found)"));
    kvnode_close(c);
    ck_assert_int_eq(f->hello->hello->cuda_device, 3);
    ck_assert(!f->hello->hello->cuda_ipc);      /* no runtime: no IPC handles please */
    ck_assert_str_eq(f->hello->hello->cuda_pci_bus_id, "");   /* and no bus id */
    fake_stop(f);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

/* Malformed IPC arenas fail the connect before any runtime is asked. */
static const struct {
    int mode;
    size_t len;
    const char *msg;
} bad_ipc_cases[] = {
    {HBM_IPC_LEN, 63, "cuda_ipc_handle of 63 bytes, not 64"},
    {HBM_IPC_LEN, 65, "cuda_ipc_handle of 65 bytes, not 64"},
    {HBM_IPC_LEN, 1, "cuda_ipc_handle of 1 bytes, not 64"},
    {HBM_IPC_AND_FD, 64, "also an fd"},
};

START_TEST(test_hbm_bad_ipc_handle)
{
    int fds0 = count_fds();
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c = (kvnode_client *)&fds0;

    cudart_set_override(&fake_runtime);
    f->hbm_mode = bad_ipc_cases[_i].mode;
    f->hbm_handle_len = bad_ipc_cases[_i].len;
    fake_run(f);
    ck_assert_int_eq(kvnode_connect_device(f->path, &test_layout, 0, &c), -KVNODE_EPROTO);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(kvnode_connect_error(), bad_ipc_cases[_i].msg) != NULL,
                  "connect error '%s' lacks '%s'", kvnode_connect_error(), bad_ipc_cases[_i].msg);
    ck_assert_ptr_nonnull(strstr(kvnode_connect_error(), "arena 2"));
    ck_assert_uint_eq(frt.opens, 0);
    fake_stop(f);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

/* No runtime, yet the daemon lends an IPC handle: a clear protocol error. */
START_TEST(test_hbm_ipc_without_runtime)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c = NULL;
    const char *e;

    cudart_set_override(&no_runtime);
    f->hbm_mode = HBM_IPC;
    fake_run(f);
    ck_assert_int_eq(kvnode_connect_device(f->path, &test_layout, 0, &c), -KVNODE_EPROTO);
    ck_assert_ptr_null(c);
    e = kvnode_connect_error();
    ck_assert_msg(strstr(e, "arena 2 (device 0)") && strstr(e, "CUDA IPC") &&
                  strstr(e, "no CUDA runtime (libcudart not found)"), "error: %s", e);
    ck_assert_int_eq(f->hello->hello->cuda_device, 0);
    ck_assert(!f->hello->hello->cuda_ipc);
    fake_stop(f);
}
END_TEST

/* The same with whatever this machine has: no libcudart on the loader path
 * (no runtime: EPROTO), or a runtime without a GPU/driver, or a GPU that
 * rejects the fake handle (EIO). Both say which arena. */
START_TEST(test_hbm_ipc_this_machine)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c = NULL;
    struct cudart rt;
    char why[256];
    int have_rt = cudart_load(&rt, why, sizeof why) == 0, rc;

    f->hbm_mode = HBM_IPC;
    f->honour_ipc = have_rt;
    f->reconnects = have_rt;
    fake_run(f);
    rc = kvnode_connect_device(f->path, &test_layout, 0, &c);
    ck_assert_int_eq(f->hello->hello->cuda_device, 0);
    ck_assert_int_eq(f->hello->hello->cuda_ipc, have_rt);
    if (have_rt) {
        /* no GPU here: the fake handle cannot be opened, host-only it is */
        ck_assert_int_eq(rc, 0);
        ck_assert_msg(strstr(kvnode_last_error(c), "HBM unusable (cannot open GPU arena 2 "
                             "(device 0") != NULL, "error: %s", kvnode_last_error(c));
        kvnode_close(c);
    } else {
        ck_assert_int_eq(rc, -KVNODE_EPROTO);
        ck_assert_ptr_null(c);
        ck_assert_msg(strstr(kvnode_connect_error(), "libcudart not found") != NULL,
                      "error: %s", kvnode_connect_error());
        ck_assert_ptr_nonnull(strstr(why, "libcudart not found"));
    }
    fake_stop(f);
}
END_TEST

/* KVNODE_BATCH_DEVICE: the caller's pages are GPU memory, so every block,
 * host-tier ones included, moves with cudaMemcpy(Default); without the flag
 * host blocks are memcpy'ed. A failed copy names the caller's memory. */
START_TEST(test_batch_device_pointers)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[2] = {100, 101}, kn[2] = {500, 501};
    uint8_t buf[2][BB];
    void *dst[2] = {buf[0], buf[1]};
    const void *src[2] = {buf[0], buf[1]};
    size_t got = 0, i;

    cudart_set_override(&fake_runtime);
    frt.current = 5;
    f->hbm_mode = HBM_IPC;
    f->hbm_device = 1;
    fake_preload(f, 0, 100);
    fake_preload(f, 0, 101);
    fake_run(f);
    c = connect_dev_ok(f, &test_layout, 1);

    memset(buf, 0, sizeof buf);
    ck_assert_int_eq(kvnode_get_batch(c, k, 2, dst, KVNODE_BATCH_DEVICE, &got), 0);
    ck_assert_uint_eq(got, 2);
    for (i = 0; i < 2; i++)
        ck_assert_msg(check_pattern(buf[i], BB, k[i]), "block %zu differs", i);
    ck_assert_uint_eq(frt.copies, 2);               /* both host blocks by cudaMemcpyAsync */
    ck_assert_int_eq(frt.copy_kind, 4);
    ck_assert_int_eq(frt.current, 5);               /* the caller's device restored */
    /* on the client's own non-blocking stream, synchronised before get_end */
    ck_assert_uint_eq(frt.streams_made, 1);
    ck_assert_ptr_eq(frt.copy_stream, &frt.streams_made);
    ck_assert_uint_eq(frt.syncs, 1);

    /* put from "device" pages, read back with plain memcpy */
    for (i = 0; i < 2; i++)
        fill_pattern(buf[i], BB, kn[i]);
    ck_assert_int_eq(kvnode_put_batch(c, kn, 2, src, KVNODE_BATCH_DEVICE), 0);
    ck_assert_uint_eq(frt.copies, 4);
    memset(buf, 0, sizeof buf);
    ck_assert_int_eq(kvnode_get_batch(c, kn, 2, dst, 0, &got), 0);
    ck_assert_uint_eq(got, 2);
    ck_assert_uint_eq(frt.copies, 4);               /* host to host: memcpy */
    for (i = 0; i < 2; i++)
        ck_assert_msg(check_pattern(buf[i], BB, kn[i]), "block %zu differs", i);

    frt.fail_copy = 1;
    ck_assert_int_eq(kvnode_get_batch(c, k, 2, dst, KVNODE_BATCH_DEVICE, &got), -KVNODE_EIO);
    ck_assert_uint_eq(got, 0);
    ck_assert_msg(strstr(kvnode_last_error(c), "get: cudaMemcpyAsync of block 0 (to or from the "
                         "caller's GPU memory, device 1) failed") != NULL,
                  "error: %s", kvnode_last_error(c));
    ck_assert_uint_eq(f->n_get_leases, 0);          /* the lease was ended */
    frt.fail_copy = 0;

    /* the _stream calls queue on the caller's stream (NULL: the legacy one) */
    frt.syncs = 0;
    memset(buf, 0, sizeof buf);
    ck_assert_int_eq(kvnode_get_batch_stream(c, k, 2, dst, KVNODE_BATCH_DEVICE, (void *)&frt,
                                             &got), 0);
    ck_assert_uint_eq(got, 2);
    ck_assert_ptr_eq(frt.copy_stream, &frt);
    ck_assert_uint_eq(frt.syncs, 1);
    for (i = 0; i < 2; i++)
        ck_assert_msg(check_pattern(buf[i], BB, k[i]), "block %zu differs", i);
    kn[0] = 600;
    kn[1] = 601;
    ck_assert_int_eq(kvnode_put_batch_stream(c, kn, 2, src, KVNODE_BATCH_DEVICE, NULL), 0);
    ck_assert_ptr_null(frt.copy_stream);
    ck_assert_uint_eq(frt.syncs, 2);
    ck_assert_uint_eq(frt.streams_made, 1);
    kvnode_close(c);
    ck_assert_uint_eq(frt.streams_gone, 1);          /* the client's stream goes with it */
    fake_stop(f);
}
END_TEST

/* IPC arenas through the (fake) runtime: opened on the client's device,
 * device pointers in the locations, cudaMemcpy in the copying calls, closed
 * by kvnode_close; the caller's current device is left as it was. */
START_TEST(test_hbm_ipc_with_runtime)
{
    int fds0 = count_fds();
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[3] = {100, 200, 201}, kp[1] = {300}, kh[2] = {400, 401};
    kvnode_loc loc[3];
    kvnode_lease lease = 0;
    size_t got = 0, idx, i;
    uint8_t buf[3][BB];
    void *dst[3] = {buf[0], buf[1], buf[2]};
    const void *src[2] = {buf[0], buf[1]};
    int a;

    cudart_set_override(&fake_runtime);
    frt.current = 5;
    f->hbm_mode = HBM_IPC;
    f->hbm_device = 1;
    fake_preload(f, 0, 100);
    fake_preload(f, 1, 999);
    fake_preload(f, 1, 200);
    fake_preload(f, 1, 201);
    fake_run(f);
    c = connect_dev_ok(f, &test_layout, 1);
    ck_assert_int_eq(f->hello->hello->cuda_device, 1);
    ck_assert(f->hello->hello->cuda_ipc);
    /* the GPU's bus id goes along, so the daemon finds it whatever its ordinal here */
    ck_assert_str_eq(f->hello->hello->cuda_pci_bus_id, "0000:11:00.0");
    ck_assert_uint_eq(frt.opens, 1);
    ck_assert_int_eq(frt.open_device, 1);           /* opened on the client's device */
    ck_assert_uint_eq(frt.open_flags, 1);           /* cudaIpcMemLazyEnablePeerAccess */
    ck_assert_int_eq(frt.current, 5);               /* and the caller's device restored */
    ck_assert_ptr_eq(frt.opened, f->mem[1]);

    ck_assert_int_eq(kvnode_get_begin(c, k, 3, &lease, loc, &got), 0);
    ck_assert_uint_eq(got, 3);
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HOST);
    for (i = 1; i < 3; i++) {
        ck_assert_int_eq(loc[i].tier, KVNODE_TIER_HBM);
        ck_assert_int_eq(loc[i].device, 1);
        ck_assert_ptr_nonnull(fake_find(f, k[i], 2, &a, &idx));
        ck_assert_ptr_eq(loc[i].ptr, f->mem[1] + idx * BB);     /* the "device pointer" */
    }
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);

    /* kvnode_get: host blocks by memcpy, device blocks by cudaMemcpy(Default) */
    memset(buf, 0, sizeof buf);
    ck_assert_int_eq(kvnode_get(c, k, 3, dst, &got), 0);
    ck_assert_uint_eq(got, 3);
    for (i = 0; i < 3; i++)
        ck_assert_msg(check_pattern(buf[i], BB, k[i]), "block %zu differs", i);
    ck_assert_uint_eq(frt.copies, 2);
    ck_assert_int_eq(frt.copy_kind, 4);
    ck_assert_int_eq(frt.current, 5);

    /* a failed cudaMemcpy fails the get and releases the lease */
    frt.fail_copy = 1;
    ck_assert_int_eq(kvnode_get(c, k, 3, dst, &got), -KVNODE_EIO);
    ck_assert_uint_eq(got, 0);
    ck_assert_msg(strstr(kvnode_last_error(c), "get: cudaMemcpyAsync of block 1 (GPU arena 2, device 1) "
                         "failed: fake: an illegal memory access was encountered (cudaError 700)"),
                  "error: %s", kvnode_last_error(c));
    ck_assert_uint_ge(frt.last_error_calls, 1);     /* the thread's CUDA error cleared */
    ck_assert_uint_eq(f->n_get_leases, 0);
    ck_assert_int_eq(frt.current, 5);
    frt.fail_copy = 0;

    /* put_begin in the HBM tier: a device pointer; kvnode_put stays on the host */
    ck_assert_int_eq(kvnode_put_begin(c, kp, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    ck_assert_int_eq(loc[0].tier, KVNODE_TIER_HBM);
    ck_assert_int_eq(loc[0].device, 1);
    ck_assert((uint8_t *)loc[0].ptr >= f->mem[1] && (uint8_t *)loc[0].ptr < f->mem[1] + f->mem_size);
    ck_assert_int_eq(kvnode_put_abort(c, lease), 0);
    fill_pattern(buf[0], BB, 400);
    fill_pattern(buf[1], BB, 401);
    frt.copies = 0;
    ck_assert_int_eq(kvnode_put(c, kh, 2, src), 0);
    ck_assert_uint_eq(frt.copies, 0);
    for (i = 0; i < 2; i++) {
        ck_assert_ptr_nonnull(fake_find(f, kh[i], 2, &a, &idx));
        ck_assert_int_eq(a, 0);
        ck_assert(check_pattern(f->mem[0] + idx * BB, BB, kh[i]));
    }
    kvnode_close(c);
    ck_assert_uint_eq(frt.closes, 1);
    ck_assert_ptr_eq(frt.closed, f->mem[1]);
    ck_assert_uint_eq(frt.unregisters, 0);
    ck_assert_int_eq(frt.current, 5);
    fake_stop(f);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

/* put_commit_stream / get_end_stream wait for the caller's stream on the
 * client's device, then commit / end; a failed wait leaves the lease as it
 * was (the caller's writes may still run); without a runtime: ESTATE. */
START_TEST(test_commit_and_end_after_stream)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {700};
    kvnode_loc loc[1];
    kvnode_lease lease;
    size_t got = 0, idx;
    int a;

    cudart_set_override(&fake_runtime);
    frt.current = 3;
    f->hbm_mode = HBM_IPC;
    f->hbm_device = 1;
    fake_run(f);
    c = connect_dev_ok(f, &test_layout, 1);
    ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    fill_pattern(loc[0].ptr, BB, 700);
    ck_assert_int_eq(kvnode_put_commit_stream(c, lease, (void *)&frt), 0);
    ck_assert_uint_eq(frt.syncs, 1);
    ck_assert_ptr_eq(frt.sync_stream, &frt);
    ck_assert_int_eq(frt.sync_device, 1);           /* on the client's device */
    ck_assert_int_eq(frt.current, 3);               /* the caller's restored */
    ck_assert_ptr_nonnull(fake_find(f, 700, 2, &a, &idx));
    ck_assert_int_eq(kvnode_get_begin(c, k, 1, &lease, loc, &got), 0);
    ck_assert_int_eq(kvnode_get_end_stream(c, lease, NULL), 0);
    ck_assert_uint_eq(frt.syncs, 2);
    ck_assert_ptr_null(frt.sync_stream);            /* NULL: the legacy default stream */
    ck_assert_uint_eq(f->n_get_leases, 0);
    ck_assert_int_eq(kvnode_put_commit_stream(c, 0, NULL), 0);     /* lease 0: nothing */
    ck_assert_uint_eq(frt.syncs, 2);

    /* the wait fails: EIO naming it, and the lease is still the caller's */
    k[0] = 701;
    ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HBM, &lease, loc), 0);
    frt.fail_sync = 1;
    ck_assert_int_eq(kvnode_put_commit_stream(c, lease, NULL), -KVNODE_EIO);
    ck_assert_msg(strstr(kvnode_last_error(c), "put_commit: cudaStreamSynchronize of the "
                         "caller's stream (CUDA device 1) failed: fake: an illegal memory access"),
                  "error: %s", kvnode_last_error(c));
    ck_assert_ptr_nonnull(fake_find(f, 701, 1, &a, &idx));     /* still reserved */
    frt.fail_sync = 0;
    ck_assert_int_eq(kvnode_put_abort(c, lease), 0);
    ck_assert_ptr_null(fake_find(f, 701, 1, &a, &idx));
    kvnode_close(c);
    fake_stop(f);

    /* no CUDA runtime: nothing to wait with */
    f = fake_start(HM_OK, BB, MAXF, 64);
    cudart_set_override(&no_runtime);
    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_put_begin(c, k, 1, KVNODE_TIER_HOST, &lease, loc), 0);
    ck_assert_int_eq(kvnode_put_commit_stream(c, lease, NULL), -KVNODE_ESTATE);
    ck_assert_msg(strstr(kvnode_last_error(c), "put_commit: waiting for a CUDA stream needs a "
                         "client with a CUDA device") != NULL, "error: %s", kvnode_last_error(c));
    ck_assert_int_eq(kvnode_put_commit(c, lease), 0);
    ck_assert_int_eq(kvnode_put_commit_stream(NULL, 1, NULL), -KVNODE_EINVAL);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

/* Two connections of one process share one opening of a handle. */
START_TEST(test_hbm_ipc_handle_shared_in_process)
{
    static uint8_t devmem[64];
    uintptr_t addr = (uintptr_t)devmem;
    cudart_ipc_handle h, other;
    void *p1 = NULL, *p2 = NULL, *p3 = NULL;

    memset(&h, 0, sizeof h);
    memcpy(h.reserved, FAKE_IPC_MAGIC, sizeof FAKE_IPC_MAGIC);
    memcpy(h.reserved + 32, &addr, sizeof addr);
    ck_assert_int_eq(cudart_ipc_acquire(&fake_runtime, &h, 1, &p1), 0);
    ck_assert_int_eq(cudart_ipc_acquire(&fake_runtime, &h, 1, &p2), 0);
    ck_assert_ptr_eq(p1, devmem);
    ck_assert_ptr_eq(p2, p1);
    ck_assert_uint_eq(frt.opens, 1);
    /* A different handle is a different opening (and a bad one fails). */
    other = h;
    other.reserved[0] ^= 1;
    ck_assert_int_eq(cudart_ipc_acquire(&fake_runtime, &other, 1, &p3), 400);
    ck_assert_ptr_null(p3);
    ck_assert_uint_eq(frt.opens, 2);
    ck_assert_int_eq(cudart_ipc_release(&fake_runtime, p1), 0);
    ck_assert_uint_eq(frt.closes, 0);             /* still used by the second */
    ck_assert_int_eq(cudart_ipc_release(&fake_runtime, p2), 0);
    ck_assert_uint_eq(frt.closes, 1);
    ck_assert_ptr_eq(frt.closed, devmem);
    /* Open again after the last release: a fresh opening. */
    ck_assert_int_eq(cudart_ipc_acquire(&fake_runtime, &h, 1, &p1), 0);
    ck_assert_uint_eq(frt.opens, 3);
    ck_assert_int_eq(cudart_ipc_release(&fake_runtime, p1), 0);
    ck_assert_uint_eq(frt.closes, 2);
}
END_TEST

/* An IPC handle that cannot be opened (another PID namespace, a MIG slice,
 * no driver...) leaves the client connected host-only: it connects again
 * without cuda_ipc, tells the daemon why, and says so in kvnode_last_error.
 * (Before issue 28 the connect failed with EIO: host memory lost too.) */
/* The daemon frees lent GPU memory once the connection has closed: by then
 * the client must have closed its IPC handle. */
static void mark_ipc_closes(struct fake *f)
{
    f->eof_mark = __atomic_load_n(&frt.closes, __ATOMIC_SEQ_CST);
}

/* The end of the connection releases its GPU memory at once, not at
 * kvnode_close: a stopping daemon's GoingAway (calls in flight fail with
 * ESHUTDOWN, "daemon stopping") or a daemon that dies (EOF). Before issue 28
 * GoingAway was an unknown reply id (EPROTO) and the handle stayed open
 * until kvnode_close, so the daemon freed memory still mapped here. */
START_TEST(test_hbm_released_when_connection_ends)
{
    static const int64_t keys[2] = {KEY_GOING_AWAY, KEY_EOF};
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {keys[_i]};
    size_t matched = 9;
    int rc;

    cudart_set_override(&fake_runtime);
    f->hbm_mode = HBM_IPC;
    f->on_eof = mark_ipc_closes;
    f->eof_mark = 99;
    fake_run(f);
    c = connect_dev_ok(f, &test_layout, 0);
    ck_assert_uint_eq(frt.opens, 1);
    ck_assert_int_eq(kvnode_ping(c), 0);
    ck_assert_uint_eq(frt.closes, 0);
    rc = kvnode_match(c, k, 1, &matched);
    if (_i == 0) {
        ck_assert_int_eq(rc, -KVNODE_ESHUTDOWN);
        ck_assert_msg(strstr(kvnode_last_error(c), "daemon stopping (SIGTERM)") != NULL,
                      "error: %s", kvnode_last_error(c));
    } else {
        ck_assert_int_eq(rc, -KVNODE_ECLOSED);
    }
    if (_i == 0) {
        /* released by the client's thread while the engine does nothing,
         * before the connection closes: the daemon sees the end, then frees */
        ck_assert_int_eq(pthread_join(f->thr, NULL), 0);
        f->running = 0;
        ck_assert_uint_eq(f->eof_mark, 1);
    }
    ck_assert_int_eq(kvnode_ping(c), -KVNODE_ECLOSED);
    kvnode_close(c);
    ck_assert_uint_eq(frt.closes, 1);       /* once */
    ck_assert_ptr_eq(frt.closed, f->mem[1]);
    fake_stop(f);
}
END_TEST

/* GoingAway is sent unasked (id 0): one that answers a request is a
 * protocol error that ends the connection, and with it the GPU memory,
 * rather than a wrong reply to that one call that left the memory mapped. */
START_TEST(test_going_away_with_id_ends_connection)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    kvnode_key k[1] = {KEY_GOING_AWAY_ID};
    size_t matched = 9;

    cudart_set_override(&fake_runtime);
    f->hbm_mode = HBM_IPC;
    f->on_eof = mark_ipc_closes;
    f->eof_mark = 99;
    fake_run(f);
    c = connect_dev_ok(f, &test_layout, 0);
    ck_assert_int_eq(kvnode_match(c, k, 1, &matched), -KVNODE_EPROTO);
    ck_assert_msg(strstr(kvnode_last_error(c), "GoingAway") != NULL, "error: %s",
                  kvnode_last_error(c));
    ck_assert_int_eq(kvnode_ping(c), -KVNODE_ECLOSED);
    /* released before the daemon sees the connection close */
    ck_assert_int_eq(pthread_join(f->thr, NULL), 0);
    f->running = 0;
    ck_assert_uint_eq(f->eof_mark, 1);
    kvnode_close(c);
    ck_assert_uint_eq(frt.closes, 1);
    fake_stop(f);
}
END_TEST

START_TEST(test_hbm_ipc_open_fails)
{
    int fds0 = count_fds();
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c = NULL;
    kvnode_key k[1] = {100};
    uint8_t buf[BB];
    void *dst[1] = {buf};
    size_t got = 0;
    const char *e;

    cudart_set_override(&fake_runtime);
    frt.current = 0;
    frt.fail_open = 1;
    f->hbm_mode = HBM_IPC;
    f->hbm_device = 1;
    f->honour_ipc = 1;
    f->reconnects = 1;
    fake_preload(f, 0, 100);
    fake_run(f);
    ck_assert_int_eq(kvnode_connect_device(f->path, &test_layout, 1, &c), 0);
    ck_assert_ptr_nonnull(c);
    e = kvnode_last_error(c);
    ck_assert_msg(strstr(e, "HBM unusable (cannot open GPU arena 2 (device 1, ") == e &&
                  strstr(e, "on CUDA device 1: cudaIpcOpenMemHandle: fake: invalid resource "
                         "handle (cudaError 400)); connected host-only"), "error: %s", e);
    ck_assert_uint_eq(frt.last_error_calls, 1);
    ck_assert_int_eq(frt.current, 0);
    ck_assert_uint_eq(frt.opens, 1);
    /* the daemon heard why, and lent no GPU memory the second time */
    ck_assert(f->hello->hello->cuda_ipc);
    ck_assert_str_eq(f->hello->hello->hbm_unusable, "");
    ck_assert_ptr_nonnull(f->hello2);
    ck_assert(!f->hello2->hello->cuda_ipc);
    ck_assert(!f->hello2->hello->cuda_vmm);
    ck_assert_int_eq(f->hello2->hello->cuda_device, 1);
    ck_assert_msg(strstr(f->hello2->hello->hbm_unusable, "cudaIpcOpenMemHandle: fake: invalid "
                         "resource handle") != NULL, "hbm_unusable: %s",
                  f->hello2->hello->hbm_unusable);
    /* host memory works */
    ck_assert_int_eq(kvnode_get(c, k, 1, dst, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert(check_pattern(buf, BB, 100));
    ck_assert_int_eq(kvnode_ping(c), 0);
    kvnode_close(c);
    ck_assert_uint_eq(frt.closes, 0);
    fake_stop(f);

    /* a runtime without a driver fails at the first call: host-only too */
    f = fake_start(HM_OK, BB, MAXF, 64);
    memset(&frt, 0, sizeof frt);
    frt.fail_get_device = 1;
    f->hbm_mode = HBM_IPC;
    f->honour_ipc = 1;
    f->reconnects = 1;
    fake_run(f);
    ck_assert_int_eq(kvnode_connect_device(f->path, &test_layout, 0, &c), 0);
    e = kvnode_last_error(c);
    ck_assert_msg(strstr(e, "HBM unusable (cannot open GPU arena 2 (device 0, ") &&
                  strstr(e, "cudaGetDevice: fake: CUDA driver version is insufficient") &&
                  strstr(e, "; connected host-only"), "error: %s", e);
    ck_assert_uint_eq(frt.opens, 0);
    kvnode_close(c);
    fake_stop(f);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

START_TEST(test_pin_host)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    void *host;
    kvnode_key k[1] = {100};
    kvnode_loc loc[1];
    kvnode_lease lease;
    size_t got;

    cudart_set_override(&fake_runtime);
    frt.current = 4;
    fake_preload(f, 0, 100);
    fake_run(f);
    c = connect_dev_ok(f, &test_layout, 2);
    ck_assert_int_eq(kvnode_get_begin(c, k, 1, &lease, loc, &got), 0);
    host = (uint8_t *)loc[0].ptr;   /* slot 0 of the host arena: its mapping's start */
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    ck_assert_int_eq(kvnode_pin_host(c), 0);
    ck_assert_uint_eq(frt.registers, 1);            /* the host arena only */
    ck_assert_ptr_eq(frt.registered, host);
    ck_assert_uint_eq(frt.register_size, f->mem_size);
    ck_assert_uint_eq(frt.register_flags, 1);       /* cudaHostRegisterPortable */
    ck_assert_int_eq(frt.register_device, 2);       /* on the client's device */
    ck_assert_int_eq(frt.current, 4);
    ck_assert_int_eq(kvnode_pin_host(c), 0);        /* idempotent */
    ck_assert_uint_eq(frt.registers, 1);
    ck_assert_uint_eq(frt.unregisters, 0);
    kvnode_close(c);
    ck_assert_uint_eq(frt.unregisters, 1);
    ck_assert_ptr_eq(frt.unregistered, host);
    ck_assert_int_eq(frt.current, 4);
    fake_stop(f);

    /* no device declared: the runtime is found on demand, the device left alone */
    memset(&frt, 0, sizeof frt);
    frt.current = 6;
    f = fake_start(HM_OK, BB, MAXF, 64);
    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert(!f->hello->hello->cuda_ipc);  /* HELLO went out before */
    ck_assert_int_eq(kvnode_pin_host(c), 0);
    ck_assert_int_eq(frt.register_device, 6);
    ck_assert_uint_eq(frt.sets, 0);
    kvnode_close(c);
    ck_assert_uint_eq(frt.unregisters, 1);
    fake_stop(f);

    /* CUDA refuses: EIO naming the call, nothing left registered */
    memset(&frt, 0, sizeof frt);
    frt.fail_register = 1;
    f = fake_start(HM_OK, BB, MAXF, 64);
    fake_run(f);
    c = connect_ok(f, &test_layout);
    ck_assert_int_eq(kvnode_pin_host(c), -KVNODE_EIO);
    ck_assert_msg(strstr(kvnode_last_error(c), "pin_host: cudaHostRegister of host arena 1 (") &&
                  strstr(kvnode_last_error(c), "fake: out of memory (cudaError 2)"),
                  "error: %s", kvnode_last_error(c));
    ck_assert_uint_eq(frt.last_error_calls, 1);
    ck_assert_int_eq(kvnode_ping(c), 0);    /* the connection is fine */
    kvnode_close(c);
    ck_assert_uint_eq(frt.unregisters, 0);
    fake_stop(f);

    ck_assert_int_eq(kvnode_pin_host(NULL), -KVNODE_EINVAL);
}
END_TEST

/* kvnode_pin_host with whatever this machine has: pinned (a GPU), or a
 * clear error (no runtime: ESTATE; a runtime without a GPU: EIO). */
START_TEST(test_pin_host_this_machine)
{
    struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
    kvnode_client *c;
    int rc;

    fake_run(f);
    c = connect_ok(f, &test_layout);
    rc = kvnode_pin_host(c);
    if (rc == -KVNODE_ESTATE)
        ck_assert_msg(strstr(kvnode_last_error(c), "no CUDA runtime (libcudart not found") != NULL,
                      "error: %s", kvnode_last_error(c));
    else if (rc == -KVNODE_EIO)
        ck_assert_msg(strstr(kvnode_last_error(c), "pin_host: cuda") != NULL,
                      "error: %s", kvnode_last_error(c));
    else
        ck_assert_int_eq(rc, 0);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

/* The device HELLO declares: kvnode_connect_device's argument, or
 * KVNODE_CUDA_DEVICE for kvnode_connect; observers declare none. */
START_TEST(test_cuda_device_declared)
{
    static const struct {
        const char *env;    /* NULL: unset */
        int api;            /* -2: kvnode_connect, else kvnode_connect_device(api) */
        int observer;
        int want;
    } cases[] = {
        {NULL, -2, 0, -1}, {"2", -2, 0, 2}, {"0", -2, 0, 0}, {"-1", -2, 0, -1}, {"", -2, 0, -1},
        {"17", -2, 0, 17}, {"9", 4, 0, 4}, {NULL, -1, 0, -1}, {"5", -2, 1, -1},
        {"junk", -2, 1, -1}, {NULL, 3, 1, -1},
    };
    size_t i;

    cudart_set_override(&no_runtime);
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct fake *f = fake_start(HM_OK, BB, MAXF, 64);
        const kvnode_layout *lay = cases[i].observer ? NULL : &test_layout;
        kvnode_client *c = NULL;
        int rc;

        fake_run(f);
        if (cases[i].env)
            ck_assert_int_eq(setenv("KVNODE_CUDA_DEVICE", cases[i].env, 1), 0);
        else
            unsetenv("KVNODE_CUDA_DEVICE");
        rc = cases[i].api == -2 ? kvnode_connect(f->path, lay, &c)
                                : kvnode_connect_device(f->path, lay, cases[i].api, &c);
        ck_assert_msg(rc == 0, "case %zu: %s", i, kvnode_connect_error());
        ck_assert_int_eq(kvnode_cuda_device(c), cases[i].want);
        kvnode_close(c);
        ck_assert_msg(f->hello->hello->cuda_device == cases[i].want, "case %zu: HELLO said %d", i,
                      f->hello->hello->cuda_device);
        ck_assert(!f->hello->hello->cuda_ipc);
        fake_stop(f);
    }
    ck_assert_int_eq(kvnode_cuda_device(NULL), -1);
}
END_TEST

START_TEST(test_cuda_device_invalid)
{
    static const char *const bad[] = {"abc", "1x", " 1", "1 ", "-2", "+1", "0x1", "2147483648",
                                      "99999999999999999999", "1.0"};
    kvnode_client *c = (kvnode_client *)&c;
    size_t i;

    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(setenv("KVNODE_CUDA_DEVICE", bad[i], 1), 0);
        c = (kvnode_client *)&c;
        /* fails before connecting: no daemon needed */
        ck_assert_int_eq(kvnode_connect("/nonexistent-kvnode/x.sock", &test_layout, &c),
                         -KVNODE_EINVAL);
        ck_assert_ptr_null(c);
        ck_assert_msg(strstr(kvnode_connect_error(), "KVNODE_CUDA_DEVICE=\"") &&
                      strstr(kvnode_connect_error(), bad[i]) &&
                      strstr(kvnode_connect_error(), "not a CUDA device ordinal"),
                      "'%s': %s", bad[i], kvnode_connect_error());
        ck_assert_str_eq(kvnode_last_error(NULL), kvnode_connect_error());
    }
    unsetenv("KVNODE_CUDA_DEVICE");
    ck_assert_int_eq(setenv("KVNODE_CUDA_DEVICE", "2147483647", 1), 0);
    ck_assert_int_eq(kvnode_connect("/nonexistent-kvnode/x.sock", &test_layout, &c),
                     -KVNODE_ECONNECT);     /* INT_MAX parses */
    unsetenv("KVNODE_CUDA_DEVICE");
    c = (kvnode_client *)&c;
    ck_assert_int_eq(kvnode_connect_device("/nonexistent-kvnode/x.sock", &test_layout, -2, &c),
                     -KVNODE_EINVAL);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(kvnode_connect_error(), "cuda_device -2"));
    ck_assert_int_eq(kvnode_connect_device("/x", &test_layout, 0, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_connect("/x", &test_layout, NULL), -KVNODE_EINVAL);
}
END_TEST

static Suite *client_suite(void)
{
    Suite *s = suite_create("client_proto");
    TCase *tc = tcase_create("calls");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hello_fields_and_basic_calls);
    tcase_add_test(tc, test_observer_client);
    tcase_add_test(tc, test_checked_calls_need_a_daemon_with_check_words);
    tcase_add_test(tc, test_per_key_calls_need_a_daemon_with_per_key);
    tcase_add_test(tc, test_per_key_bitmap_checked);
    tcase_add_test(tc, test_get_begin_points_into_shared_arenas);
    tcase_add_test(tc, test_put_begin_writes_reach_daemon);
    tcase_add_test(tc, test_copying_get_put_split_by_max_keys);
    tcase_add_test(tc, test_inline_split_by_frame_size);
    tcase_add_test(tc, test_delete);
    tcase_add_test(tc, test_argument_checks);
    tcase_add_test(tc, test_request_over_frame_limit);
    suite_add_tcase(s, tc);

    tc = tcase_create("faults");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_error_reply_surfaces_message);
    tcase_add_test(tc, test_timeout_then_closed);
    tcase_add_test(tc, test_env_socket_and_timeout);
    tcase_add_loop_test(tc, test_fatal_reply_faults, 0,
                        (int)(sizeof fatal_cases / sizeof fatal_cases[0]));
    tcase_add_test(tc, test_bad_locations_release_lease);
    tcase_add_test(tc, test_wrong_result_type);
    tcase_add_test(tc, test_unexpected_fd_is_closed);
    suite_add_tcase(s, tc);

    tc = tcase_create("connect");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_hello_failures, 0,
                        (int)(sizeof hello_cases / sizeof hello_cases[0]));
    tcase_add_test(tc, test_connect_errors);
    tcase_add_test(tc, test_reader_maps_read_only);
    tcase_add_test(tc, test_reader_flag_not_granted_or_unasked);
    suite_add_tcase(s, tc);

    tc = tcase_create("hbm");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, hbm_setup, hbm_teardown);
    tcase_add_test(tc, test_hbm_sim_arena_is_mapped);
    tcase_add_loop_test(tc, test_hbm_bad_ipc_handle, 0,
                        (int)(sizeof bad_ipc_cases / sizeof bad_ipc_cases[0]));
    tcase_add_test(tc, test_hbm_ipc_without_runtime);
    tcase_add_test(tc, test_hbm_ipc_this_machine);
    tcase_add_test(tc, test_hbm_ipc_with_runtime);
    tcase_add_test(tc, test_batch_device_pointers);
    tcase_add_test(tc, test_hbm_ipc_open_fails);
    tcase_add_test(tc, test_hbm_ipc_handle_shared_in_process);
    tcase_add_loop_test(tc, test_hbm_released_when_connection_ends, 0, 2);
    tcase_add_test(tc, test_going_away_with_id_ends_connection);
    tcase_add_test(tc, test_commit_and_end_after_stream);
    tcase_add_test(tc, test_pin_host);
    tcase_add_test(tc, test_pin_host_this_machine);
    tcase_add_test(tc, test_cuda_device_declared);
    tcase_add_test(tc, test_cuda_device_invalid);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(client_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
