/* Asynchronous calls of libkvnode (client_async.c) against a scripted fake
 * daemon in a thread of this process. The fake answers HELLO (no arenas),
 * then collects a given number of MATCH requests and answers them in an
 * order the test chooses, or misbehaves. What is proven:
 *   - replies are matched to tickets by request id, not by order: answered
 *     in reverse, the completions come in reverse with each ticket's own
 *     count; synchronous calls from several threads get their own replies;
 *   - the eventfd is readable exactly while completions wait to be drained;
 *   - the daemon dying with requests in flight completes every ticket with
 *     -KVNODE_ECLOSED (no hang), and later submits fail at once;
 *   - a reply id nobody waits for fails every ticket with -KVNODE_EPROTO;
 *   - kvnode_cancel completes every ticket with -KVNODE_ECLOSED and
 *     "cancelled"; kvnode_close with tickets in flight frees them (valgrind);
 *   - argument errors: NULL ticket, unknown flags, KVNODE_BATCH_DEVICE
 *     without a CUDA runtime, observer clients;
 *   - the receive buffer (one recvmsg reads as many frames as came): replies
 *     sent in one write, one of them larger than the buffer's first size,
 *     and replies that trickle in a few bytes at a time all reach their
 *     own tickets. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kvnode.h"
#include "wire.h"

#define BB 4096u
#define MAX_REQ 64
#define WAIT_MS 10000

enum fake_mode {
    FM_REVERSE,         /* answer the collected requests last first */
    FM_HANGUP,          /* close the connection once they arrived */
    FM_BAD_ID,          /* answer with an id no request has */
    FM_SILENT,          /* never answer */
    FM_COALESCED,       /* answer last first, every frame in one write, one frame 200 KiB */
    FM_TRICKLE,         /* answer in order, a few bytes per write */
};

struct fake {
    char dir[64], path[108];
    int lfd, cfd;
    pthread_t thr;
    int mode;
    size_t expect;                  /* MATCH requests to collect before answering */
    uint64_t ids[MAX_REQ];          /* in arrival order */
    uint32_t nkeys[MAX_REQ];
    size_t got;
    int done;                       /* [mu] the fake thread finished its script */
    int joined;
    pthread_mutex_t mu;
    char bad[128];
};

static const kvnode_layout layout = {
    .model = "async-test", .dtype = "bf16", .block_tokens = 16, .block_bytes = BB,
    .num_layers = 2, .kv_heads = 2, .head_dim = 64, .tp_size = 1, .tp_rank = 0,
};

static int read_full(int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        ssize_t r;

        if (poll(&pf, 1, WAIT_MS) <= 0)
            return -1;
        r = read(fd, p, n);
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static Kvnode__Request *fake_recv(int fd)
{
    uint8_t hdr[4], *buf;
    uint32_t len;
    Kvnode__Request *req;

    if (read_full(fd, hdr, 4) < 0 || wire_frame_len(hdr, 1u << 20, &len) < 0)
        return NULL;
    buf = malloc(len);
    if (!buf || read_full(fd, buf, len) < 0) {
        free(buf);
        return NULL;
    }
    req = wire_unpack_request(buf, len);
    free(buf);
    return req;
}

static void fake_send(int fd, const Kvnode__Response *resp)
{
    uint8_t *frame;
    size_t len;

    if (wire_pack(&resp->base, 1u << 20, &frame, &len) == 0) {
        if (send(fd, frame, len, MSG_NOSIGNAL) != (ssize_t)len) {
            /* the client went away: the test says what it expected */
        }
        free(frame);
    }
}

static void fake_answer_match(int fd, uint64_t id, uint32_t matched)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__MatchReply m = KVNODE__MATCH_REPLY__INIT;

    m.matched = matched;
    m.host = matched;
    resp.id = id;
    resp.result_case = KVNODE__RESPONSE__RESULT_MATCH;
    resp.match = &m;
    fake_send(fd, &resp);
}

/* The MATCH answer for (id, matched) as a frame, padded to at least pad
 * bytes with a field the client does not know (protobuf skips it). */
static void frame_match(uint64_t id, uint32_t matched, size_t pad, uint8_t **out, size_t *len)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__MatchReply m = KVNODE__MATCH_REPLY__INIT;
    uint8_t *frame;
    size_t n;

    m.matched = matched;
    m.host = matched;
    resp.id = id;
    resp.result_case = KVNODE__RESPONSE__RESULT_MATCH;
    resp.match = &m;
    ck_assert_int_eq(wire_pack(&resp.base, 1u << 20, &frame, &n), 0);
    if (pad > n) {
        /* field 1000, length-delimited: tag varint 0xc2 0x3e, then the length */
        size_t body = pad - n, extra = 2 + 3 + body;
        uint8_t *f2 = malloc(n + extra);
        ck_assert_ptr_nonnull(f2);
        memcpy(f2, frame, n);
        f2[n] = 0xc2;
        f2[n + 1] = 0x3e;
        f2[n + 2] = (uint8_t)(0x80 | (body & 0x7f));
        f2[n + 3] = (uint8_t)(0x80 | ((body >> 7) & 0x7f));
        f2[n + 4] = (uint8_t)(body >> 14);
        memset(f2 + n + 5, 0x5a, body);
        wire_put_len(f2, (uint32_t)(n + extra - WIRE_HEADER_BYTES));
        free(frame);
        frame = f2;
        n += extra;
    }
    *out = frame;
    *len = n;
}

static void fake_send_bytes(int fd, const uint8_t *p, size_t n, size_t piece)
{
    for (size_t off = 0; off < n; off += piece) {
        size_t k = n - off < piece ? n - off : piece;
        if (send(fd, p + off, k, MSG_NOSIGNAL) != (ssize_t)k)
            return;     /* the client went away: the test says what it expected */
        if (piece < n)
            usleep(100);
    }
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    Kvnode__Request *req;
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__HelloReply h = KVNODE__HELLO_REPLY__INIT;
    struct pollfd pf = { .fd = f->lfd, .events = POLLIN };

    if (poll(&pf, 1, WAIT_MS) <= 0 || (f->cfd = accept(f->lfd, NULL, NULL)) < 0) {
        snprintf(f->bad, sizeof f->bad, "no connection");
        goto out;
    }
    req = fake_recv(f->cfd);
    if (!req || req->op_case != KVNODE__REQUEST__OP_HELLO) {
        snprintf(f->bad, sizeof f->bad, "no HELLO");
        if (req)
            kvnode__request__free_unpacked(req, NULL);
        goto out;
    }
    h.version = 1;
    h.namespace_id = 1;
    h.block_bytes = BB;
    h.max_frame_bytes = 1u << 20;
    h.max_keys = 64;
    resp.id = req->id;
    resp.result_case = KVNODE__RESPONSE__RESULT_HELLO;
    resp.hello = &h;
    fake_send(f->cfd, &resp);
    kvnode__request__free_unpacked(req, NULL);
    while (f->got < f->expect) {
        req = fake_recv(f->cfd);
        if (!req) {
            snprintf(f->bad, sizeof f->bad, "request %zu did not come", f->got);
            goto out;
        }
        if (req->op_case != KVNODE__REQUEST__OP_MATCH) {
            snprintf(f->bad, sizeof f->bad, "request %zu is op %d", f->got, (int)req->op_case);
            kvnode__request__free_unpacked(req, NULL);
            goto out;
        }
        f->ids[f->got] = req->id;
        f->nkeys[f->got] = (uint32_t)req->match->n_keys;
        f->got++;
        kvnode__request__free_unpacked(req, NULL);
    }
    switch (f->mode) {
    case FM_REVERSE:
        /* Each answer is the request's own key count: tells them apart. */
        for (size_t i = f->got; i-- > 0;)
            fake_answer_match(f->cfd, f->ids[i], f->nkeys[i]);
        break;
    case FM_BAD_ID:
        fake_answer_match(f->cfd, 999999, 1);
        break;
    case FM_COALESCED: {
        uint8_t *all = NULL;
        size_t total = 0;
        for (size_t i = f->got; i-- > 0;) {
            uint8_t *fr;
            size_t n;
            frame_match(f->ids[i], f->nkeys[i], i == f->got / 2 ? 200u << 10 : 0, &fr, &n);
            all = realloc(all, total + n);
            memcpy(all + total, fr, n);
            total += n;
            free(fr);
        }
        fake_send_bytes(f->cfd, all, total, total);
        free(all);
        break;
    }
    case FM_TRICKLE:
        for (size_t i = 0; i < f->got; i++) {
            uint8_t *fr;
            size_t n;
            frame_match(f->ids[i], f->nkeys[i], 0, &fr, &n);
            fake_send_bytes(f->cfd, fr, n, 3);
            free(fr);
        }
        break;
    case FM_HANGUP:
        close(f->cfd);
        f->cfd = -1;
        break;
    default:
        break;
    }
out:
    pthread_mutex_lock(&f->mu);
    f->done = 1;
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static struct fake *fake_start(int mode, size_t expect)
{
    struct fake *f = calloc(1, sizeof *f);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };

    ck_assert_ptr_nonnull(f);
    f->mode = mode;
    f->expect = expect;
    f->cfd = -1;
    pthread_mutex_init(&f->mu, NULL);
    snprintf(f->dir, sizeof f->dir, "/tmp/kvn-async-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/s", f->dir);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", f->path);
    f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(f->lfd, 0);
    ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(f->lfd, 4), 0);
    ck_assert_int_eq(pthread_create(&f->thr, NULL, fake_main, f), 0);
    return f;
}

static int fake_done(struct fake *f)
{
    int d;

    pthread_mutex_lock(&f->mu);
    d = f->done;
    pthread_mutex_unlock(&f->mu);
    return d;
}

/* After this the fake's fields may be read without a race. */
static void fake_join(struct fake *f)
{
    if (!f->joined)
        pthread_join(f->thr, NULL);
    f->joined = 1;
}

static void fake_stop(struct fake *f)
{
    fake_join(f);
    pthread_mutex_destroy(&f->mu);
    if (f->cfd >= 0)
        close(f->cfd);
    close(f->lfd);
    unlink(f->path);
    rmdir(f->dir);
    free(f);
}

static kvnode_client *connect_ok(struct fake *f)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect(f->path, &layout, &c);

    ck_assert_msg(rc == 0, "connect: %s", kvnode_connect_error());
    return c;
}

static int event_ready(kvnode_client *c, int timeout_ms)
{
    struct pollfd pf = { .fd = kvnode_event_fd(c), .events = POLLIN };

    return poll(&pf, 1, timeout_ms);
}

/* Drain until want completions came (deadline WAIT_MS). */
static size_t drain_all(kvnode_client *c, kvnode_completion *out, size_t want)
{
    size_t got = 0;

    while (got < want) {
        if (event_ready(c, WAIT_MS) <= 0)
            break;
        got += kvnode_drain(c, out + got, want - got);
    }
    return got;
}

static void submit_matches(kvnode_client *c, size_t n, kvnode_ticket *t)
{
    kvnode_key keys[MAX_REQ];

    for (size_t i = 0; i < MAX_REQ; i++)
        keys[i] = (kvnode_key)(i + 1);
    /* request i has i + 1 keys */
    for (size_t i = 0; i < n; i++) {
        int rc = kvnode_submit_match(c, keys, i + 1, (void *)(uintptr_t)(100 + i), &t[i]);
        ck_assert_msg(rc == 0, "submit %zu: %s", i, kvnode_last_error(c));
        ck_assert_uint_gt(t[i], 0);
    }
}

START_TEST(test_reverse_replies_complete_by_id)
{
    enum { N = 8 };
    struct fake *f = fake_start(FM_REVERSE, N);
    kvnode_client *c = connect_ok(f);
    kvnode_ticket t[N];
    kvnode_completion comp[N];

    ck_assert_int_ge(kvnode_event_fd(c), 0);
    ck_assert_int_eq(event_ready(c, 0), 0);        /* nothing yet */
    submit_matches(c, N, t);
    ck_assert_uint_eq(drain_all(c, comp, N), N);
    for (size_t i = 0; i < N; i++) {
        size_t req = N - 1 - i;                     /* answered last first */
        ck_assert_uint_eq(comp[i].ticket, t[req]);
        ck_assert_int_eq(comp[i].rc, 0);
        ck_assert_int_eq(comp[i].op, KVNODE_OP_MATCH);
        ck_assert_uint_eq(comp[i].count, req + 1);
        ck_assert_ptr_eq(comp[i].user, (void *)(uintptr_t)(100 + req));
    }
    /* the ids went out in submission order */
    fake_join(f);
    for (size_t i = 1; i < N; i++)
        ck_assert_uint_eq(f->ids[i], f->ids[i - 1] + 1);
    ck_assert_int_eq(event_ready(c, 0), 0);        /* drained: not readable */
    ck_assert_uint_eq(kvnode_pending(c), 0);
    ck_assert_uint_eq(kvnode_drain(c, comp, N), 0);
    kvnode_close(c);
    fake_join(f);
    ck_assert_str_eq(f->bad, "");
    fake_stop(f);
}
END_TEST

/* Frames that come several to a read, one larger than the receive
 * buffer's first size, or a few bytes at a time: each reaches its ticket. */
START_TEST(test_replies_coalesced_large_or_split)
{
    enum { N = 8 };
    for (int mode = FM_COALESCED; mode <= FM_TRICKLE; mode++) {
        struct fake *f = fake_start(mode, N);
        kvnode_client *c = connect_ok(f);
        kvnode_ticket t[N];
        kvnode_completion comp[N];

        submit_matches(c, N, t);
        ck_assert_uint_eq(drain_all(c, comp, N), N);
        for (size_t i = 0; i < N; i++) {
            size_t req = mode == FM_COALESCED ? N - 1 - i : i;
            ck_assert_msg(comp[i].rc == 0, "mode %d reply %zu: %s", mode, i, comp[i].error);
            ck_assert_uint_eq(comp[i].ticket, t[req]);
            ck_assert_uint_eq(comp[i].count, req + 1);
        }
        kvnode_close(c);
        fake_join(f);
        ck_assert_str_eq(f->bad, "");
        fake_stop(f);
    }
}
END_TEST

struct sync_arg {
    kvnode_client *c;
    size_t nkeys;
    size_t matched;
    int rc;
};

static void *sync_match_main(void *arg)
{
    struct sync_arg *a = arg;
    kvnode_key keys[MAX_REQ];

    for (size_t i = 0; i < a->nkeys; i++)
        keys[i] = (kvnode_key)(i + 1);
    a->rc = kvnode_match(a->c, keys, a->nkeys, &a->matched);
    return NULL;
}

/* Blocking calls from several threads, answered in reverse: each gets the
 * answer to its own request. */
START_TEST(test_sync_threads_get_their_own_reply)
{
    enum { N = 6 };
    struct fake *f = fake_start(FM_REVERSE, N);
    kvnode_client *c = connect_ok(f);
    pthread_t thr[N];
    struct sync_arg a[N];

    for (size_t i = 0; i < N; i++) {
        a[i] = (struct sync_arg){ .c = c, .nkeys = i + 1, .matched = 999, .rc = 1 };
        ck_assert_int_eq(pthread_create(&thr[i], NULL, sync_match_main, &a[i]), 0);
    }
    for (size_t i = 0; i < N; i++) {
        pthread_join(thr[i], NULL);
        ck_assert_int_eq(a[i].rc, 0);
        ck_assert_uint_eq(a[i].matched, i + 1);
    }
    kvnode_close(c);
    fake_join(f);
    ck_assert_str_eq(f->bad, "");
    fake_stop(f);
}
END_TEST

START_TEST(test_daemon_death_fails_every_ticket)
{
    enum { N = 10 };
    struct fake *f = fake_start(FM_HANGUP, N);
    kvnode_client *c = connect_ok(f);
    kvnode_ticket t[N], t2 = 7;
    kvnode_completion comp[N];
    kvnode_key k = 1;
    size_t m;

    submit_matches(c, N, t);
    ck_assert_uint_eq(drain_all(c, comp, N), N);
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(comp[i].rc, -KVNODE_ECLOSED);
        ck_assert_msg(strstr(comp[i].error, "closed") != NULL, "error: %s", comp[i].error);
        ck_assert_uint_eq(comp[i].count, 0);
    }
    ck_assert_uint_eq(kvnode_pending(c), 0);
    ck_assert_int_eq(kvnode_submit_match(c, &k, 1, NULL, &t2), -KVNODE_ECLOSED);
    ck_assert_uint_eq(t2, 0);
    ck_assert_int_eq(kvnode_match(c, &k, 1, &m), -KVNODE_ECLOSED);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "unusable"));
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_unknown_reply_id_fails_every_ticket)
{
    enum { N = 4 };
    struct fake *f = fake_start(FM_BAD_ID, N);
    kvnode_client *c = connect_ok(f);
    kvnode_ticket t[N];
    kvnode_completion comp[N];

    submit_matches(c, N, t);
    ck_assert_uint_eq(drain_all(c, comp, N), N);
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(comp[i].rc, -KVNODE_EPROTO);
        ck_assert_msg(strstr(comp[i].error, "reply id 999999") != NULL, "error: %s",
                      comp[i].error);
    }
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_cancel_completes_every_ticket)
{
    enum { N = 12 };
    struct fake *f = fake_start(FM_SILENT, N);
    kvnode_client *c = connect_ok(f);
    kvnode_ticket t[N];
    kvnode_completion comp[N];
    uint8_t page[BB];
    void *dst[1] = { page };
    kvnode_key k = 1;

    submit_matches(c, N, t);
    while (!fake_done(f))
        usleep(1000);                       /* all N reached the fake */
    ck_assert_uint_eq(kvnode_pending(c), N);
    ck_assert_int_eq(event_ready(c, 0), 0); /* silent: nothing completed */
    kvnode_cancel(c);
    ck_assert_uint_eq(drain_all(c, comp, N), N);
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(comp[i].rc, -KVNODE_ECLOSED);
        ck_assert_msg(strstr(comp[i].error, "cancelled") != NULL, "error: %s", comp[i].error);
    }
    ck_assert_uint_eq(kvnode_pending(c), 0);
    ck_assert_int_eq(kvnode_submit_get(c, &k, 1, dst, 0, NULL, &t[0]), -KVNODE_ECLOSED);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

/* Close with tickets in flight and completions not drained: nothing leaks
 * (valgrind) and close does not wait for the silent daemon. */
START_TEST(test_close_with_tickets_in_flight)
{
    enum { N = 5 };
    struct fake *f = fake_start(FM_SILENT, N);
    kvnode_client *c = connect_ok(f);
    kvnode_ticket t[N];

    kvnode_set_timeout(c, 60000);
    submit_matches(c, N, t);
    while (!fake_done(f))
        usleep(1000);
    ck_assert_uint_eq(kvnode_pending(c), N);
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

START_TEST(test_argument_errors)
{
    struct fake *f = fake_start(FM_SILENT, 0);
    kvnode_client *c = connect_ok(f), *obs = NULL;
    kvnode_ticket t = 5;
    uint8_t page[BB];
    void *dst[2] = { page, NULL };
    const void *src[1] = { page };
    kvnode_key k[2] = { 1, 2 };
    size_t got = 9;

    ck_assert_int_eq(kvnode_submit_match(c, k, 1, NULL, NULL), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_submit_match(c, NULL, 1, NULL, &t), -KVNODE_EINVAL);
    ck_assert_uint_eq(t, 0);
    ck_assert_int_eq(kvnode_submit_get(c, k, 2, dst, 0, NULL, &t), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "page pointer 1 is NULL"));
    ck_assert_int_eq(kvnode_submit_put(c, k, 1, src, 0x10, NULL, &t), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "unknown flags 0x10"));
    ck_assert_int_eq(kvnode_get_batch(c, k, 1, dst, KVNODE_BATCH_DEVICE, &got),
                     -KVNODE_ESTATE);
    ck_assert_uint_eq(got, 0);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "declared no CUDA device"));
    ck_assert_int_eq(kvnode_put_batch(c, k, 1, src, KVNODE_BATCH_DEVICE), -KVNODE_ESTATE);
    /* keys over max_keys (64) are refused at submit */
    {
        kvnode_key many[65] = { 0 };
        ck_assert_int_eq(kvnode_submit_match(c, many, 65, NULL, &t), -KVNODE_ETOOBIG);
        ck_assert_ptr_nonnull(strstr(kvnode_last_error(c), "max_keys"));
    }
    /* an empty batch completes at once with count 0 */
    {
        kvnode_completion comp;
        ck_assert_int_eq(kvnode_submit_match(c, k, 0, NULL, &t), 0);
        ck_assert_uint_gt(t, 0);
        ck_assert_int_eq(event_ready(c, 0), 1);
        ck_assert_uint_eq(kvnode_drain(c, &comp, 1), 1);
        ck_assert_uint_eq(comp.ticket, t);
        ck_assert_int_eq(comp.rc, 0);
        ck_assert_uint_eq(comp.count, 0);
    }
    ck_assert_int_eq(kvnode_event_fd(NULL), -KVNODE_EINVAL);
    ck_assert_uint_eq(kvnode_drain(NULL, NULL, 0), 0);
    kvnode_cancel(NULL);
    kvnode_close(c);
    fake_stop(f);
    (void)obs;
}
END_TEST

/* A ticket whose reply does not come within the client's timeout completes
 * with -KVNODE_ETIMEDOUT at about that time (the I/O thread was asleep with
 * no deadline when it was submitted), and so does a blocking call. */
START_TEST(test_timeout_completes_ticket)
{
    enum { N = 3 };
    struct fake *f = fake_start(FM_SILENT, N);
    kvnode_client *c = connect_ok(f);
    kvnode_ticket t[N];
    kvnode_completion comp[N];
    struct timespec t0, t1;
    long ms;

    kvnode_set_timeout(c, 200);
    usleep(50000);                  /* whoever reads the socket is asleep in poll() */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    submit_matches(c, N, t);
    ck_assert_uint_eq(drain_all(c, comp, N), N);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(comp[i].rc, -KVNODE_ETIMEDOUT);
        ck_assert_msg(strstr(comp[i].error, "timed out after 200 ms") != NULL, "error: %s",
                      comp[i].error);
    }
    ck_assert_int_ge(ms, 150);
    ck_assert_int_lt(ms, 1000);     /* the deadline, not a fallback long after it */
    kvnode_close(c);
    fake_stop(f);
}
END_TEST

static Suite *async_suite(void)
{
    Suite *s = suite_create("client_async");
    TCase *tc = tcase_create("async");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_reverse_replies_complete_by_id);
    tcase_add_test(tc, test_replies_coalesced_large_or_split);
    tcase_add_test(tc, test_sync_threads_get_their_own_reply);
    tcase_add_test(tc, test_daemon_death_fails_every_ticket);
    tcase_add_test(tc, test_unknown_reply_id_fails_every_ticket);
    tcase_add_test(tc, test_cancel_completes_every_ticket);
    tcase_add_test(tc, test_close_with_tickets_in_flight);
    tcase_add_test(tc, test_argument_errors);
    tcase_add_test(tc, test_timeout_completes_ticket);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(async_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
