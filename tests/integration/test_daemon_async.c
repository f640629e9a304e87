/* Integration: the asynchronous, thread-safe libkvnode against a real kvnoded.
 *
 * - Batched copies: 64 pages of 64 KiB go in with one kvnode_submit_put and
 *   come back byte-exact with one kvnode_submit_get (and with the
 *   synchronous kvnode_put_batch / kvnode_get_batch); MATCH and DELETE
 *   tickets count what the daemon holds; the eventfd is readable exactly
 *   while completions wait.
 * - Many threads on one client: 8 threads each write, match and read back
 *   their own chain through the one connection, first alone (the waiting
 *   callers read the socket in turn), then while the main thread keeps
 *   asynchronous MATCH tickets in flight (the I/O thread reads); every
 *   figure is exact and each thread's kvnode_last_error is its own.
 * - Daemon death mid-flight: with the daemon stopped (SIGSTOP) and tickets
 *   and a blocking call in flight, SIGKILL completes every ticket with
 *   -KVNODE_ECLOSED and returns the blocking call; nothing hangs.
 * - kvnode_cancel with tickets in flight, then kvnode_close: every ticket
 *   completes with an error; the daemon frees the connection's leases. */
#include <check.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define PAGES 64
#define PAGE_BYTES 65536u
#define WAIT_MS 10000

static int event_ready(kvnode_client *c, int timeout_ms)
{
    struct pollfd pf = { .fd = kvnode_event_fd(c), .events = POLLIN };

    return poll(&pf, 1, timeout_ms);
}

/* Wait for one completion (deadline WAIT_MS). */
static kvnode_completion wait_one(kvnode_client *c)
{
    kvnode_completion comp;

    memset(&comp, 0, sizeof comp);
    for (;;) {
        ck_assert_msg(event_ready(c, WAIT_MS) == 1, "no completion within %d ms", WAIT_MS);
        if (kvnode_drain(c, &comp, 1) == 1)
            return comp;
    }
}

static void **alloc_pages(size_t n, size_t bytes)
{
    void **p = calloc(n, sizeof *p);

    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) {
        p[i] = calloc(1, bytes);
        ck_assert_ptr_nonnull(p[i]);
    }
    return p;
}

static void free_pages(void **p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(p[i]);
    free(p);
}

START_TEST(async_batches_round_trip_byte_exact)
{
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=64MiB\n");
    kvnode_layout lay = kvh_layout("async-rt", PAGE_BYTES, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);

    kvnode_key keys[PAGES];
    kvh_chain(keys, PAGES, 4242);
    void **src = alloc_pages(PAGES, PAGE_BYTES), **dst = alloc_pages(PAGES, PAGE_BYTES);
    for (size_t i = 0; i < PAGES; i++)
        kvh_fill(src[i], PAGE_BYTES, keys[i], 7);

    kvnode_ticket t;
    ck_assert_int_eq(event_ready(c, 0), 0);
    KVH_OK(c, kvnode_submit_put(c, keys, PAGES, (const void *const *)src, 0, &d, &t));
    kvnode_completion comp = wait_one(c);
    ck_assert_uint_eq(comp.ticket, t);
    ck_assert_int_eq(comp.op, KVNODE_OP_PUT);
    ck_assert_msg(comp.rc == 0, "put: %s", comp.error);
    ck_assert_uint_eq(comp.count, PAGES);
    ck_assert_ptr_eq(comp.user, &d);
    ck_assert_int_eq(event_ready(c, 0), 0);

    KVH_OK(c, kvnode_submit_match(c, keys, PAGES, NULL, &t));
    comp = wait_one(c);
    ck_assert_int_eq(comp.rc, 0);
    ck_assert_int_eq(comp.op, KVNODE_OP_MATCH);
    ck_assert_uint_eq(comp.count, PAGES);

    KVH_OK(c, kvnode_submit_get(c, keys, PAGES, dst, 0, NULL, &t));
    comp = wait_one(c);
    ck_assert_msg(comp.rc == 0, "get: %s", comp.error);
    ck_assert_int_eq(comp.op, KVNODE_OP_GET);
    ck_assert_uint_eq(comp.count, PAGES);
    for (size_t i = 0; i < PAGES; i++)
        ck_assert_msg(kvh_verify(dst[i], PAGE_BYTES, keys[i], 7) == 0, "page %zu: %s", i,
                      kvh_error());

    /* The synchronous batch calls move the same pages. */
    kvnode_key keys2[PAGES];
    kvh_chain(keys2, PAGES, 4343);
    for (size_t i = 0; i < PAGES; i++) {
        kvh_fill(src[i], PAGE_BYTES, keys2[i], 8);
        memset(dst[i], 0, PAGE_BYTES);
    }
    KVH_OK(c, kvnode_put_batch(c, keys2, PAGES, (const void *const *)src, 0));
    size_t got = 0;
    KVH_OK(c, kvnode_get_batch(c, keys2, PAGES, dst, 0, &got));
    ck_assert_uint_eq(got, PAGES);
    for (size_t i = 0; i < PAGES; i++)
        ck_assert_msg(kvh_verify(dst[i], PAGE_BYTES, keys2[i], 8) == 0, "page %zu: %s", i,
                      kvh_error());

    /* Half the chain deleted: a get stops at the gap. */
    KVH_OK(c, kvnode_submit_delete(c, keys + PAGES / 2, PAGES / 2, NULL, &t));
    comp = wait_one(c);
    ck_assert_int_eq(comp.rc, 0);
    ck_assert_int_eq(comp.op, KVNODE_OP_DELETE);
    ck_assert_uint_eq(comp.count, PAGES / 2);
    KVH_OK(c, kvnode_submit_get(c, keys, PAGES, dst, 0, NULL, &t));
    comp = wait_one(c);
    ck_assert_int_eq(comp.rc, 0);
    ck_assert_uint_eq(comp.count, PAGES / 2);
    ck_assert_uint_eq(kvnode_pending(c), 0);

    json_t *st = kvh_stats_client(c);
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(kvh_json_int(st, "frames.rejected_total"), 0);
    json_decref(st);
    free_pages(src, PAGES);
    free_pages(dst, PAGES);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

#define THREADS 8
#define CHAIN 32
#define ROUNDS 10
#define SMALL_BYTES 4096u

struct worker {
    kvnode_client *c;
    int idx;
    char fail[256];
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    kvnode_key keys[CHAIN], many[1000];
    static _Thread_local uint8_t in[CHAIN][SMALL_BYTES], out[CHAIN][SMALL_BYTES];
    const void *src[CHAIN];
    void *dst[CHAIN];
    size_t n;
    int rc;

    kvh_chain(keys, CHAIN, 9000 + (uint64_t)w->idx);
    for (size_t i = 0; i < CHAIN; i++) {
        kvh_fill(in[i], SMALL_BYTES, keys[i], (uint64_t)w->idx);
        src[i] = in[i];
        dst[i] = out[i];
    }
    memset(many, 0, sizeof many);
    for (int r = 0; r < ROUNDS; r++) {
        if ((rc = kvnode_put(w->c, keys, CHAIN, src)) != 0) {
            snprintf(w->fail, sizeof w->fail, "round %d put: %d %s", r, rc,
                     kvnode_last_error(w->c));
            return NULL;
        }
        if ((rc = kvnode_match(w->c, keys, CHAIN, &n)) != 0 || n != CHAIN) {
            snprintf(w->fail, sizeof w->fail, "round %d match: %d matched %zu", r, rc, n);
            return NULL;
        }
        memset(out, 0, sizeof out);
        if ((rc = kvnode_get(w->c, keys, CHAIN, dst, &n)) != 0 || n != CHAIN) {
            snprintf(w->fail, sizeof w->fail, "round %d get: %d got %zu", r, rc, n);
            return NULL;
        }
        for (size_t i = 0; i < CHAIN; i++) {
            if (kvh_verify(out[i], SMALL_BYTES, keys[i], (uint64_t)w->idx) != 0) {
                snprintf(w->fail, sizeof w->fail, "round %d block %zu: %s", r, i, kvh_error());
                return NULL;
            }
        }
        /* A failure of this thread's own: its message is this thread's. */
        if (r % 5 == 0) {
            rc = kvnode_match(w->c, many, 1000, &n);
            if (rc != -KVNODE_ETOOBIG || !strstr(kvnode_last_error(w->c), "1000 keys")) {
                snprintf(w->fail, sizeof w->fail, "round %d oversized match: %d %s", r, rc,
                         kvnode_last_error(w->c));
                return NULL;
            }
        }
    }
    return NULL;
}

START_TEST(many_threads_one_client)
{
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=64MiB\nserver.max_keys_per_request=256\n");
    kvnode_layout lay = kvh_layout("async-mt", SMALL_BYTES, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);

    pthread_t thr[THREADS];
    struct worker w[THREADS];
    /* Phase 1, blocking calls only: the waiting threads take turns reading
     * the socket (the client has no thread yet). */
    for (int i = 0; i < THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].c = c;
        w[i].idx = i;
        ck_assert_int_eq(pthread_create(&thr[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(thr[i], NULL);
        ck_assert_msg(w[i].fail[0] == '\0', "phase 1, thread %d: %s", i, w[i].fail);
    }
    /* Phase 2, the same with asynchronous tickets in flight (the I/O thread
     * reads for everyone). */
    for (int i = 0; i < THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].c = c;
        w[i].idx = i;
        ck_assert_int_eq(pthread_create(&thr[i], NULL, worker_main, &w[i]), 0);
    }
    /* Meanwhile: asynchronous MATCHes of thread 0's chain, 4 in flight. */
    kvnode_key keys0[CHAIN];
    kvh_chain(keys0, CHAIN, 9000);
    size_t submitted = 0, completed = 0;
    for (int r = 0; r < 50; r++) {
        kvnode_ticket t;
        for (int k = 0; k < 4; k++, submitted++)
            KVH_OK(c, kvnode_submit_match(c, keys0, CHAIN, NULL, &t));
        while (completed < submitted) {
            kvnode_completion comp = wait_one(c);
            ck_assert_msg(comp.rc == 0, "async match: %s", comp.error);
            ck_assert_uint_le(comp.count, CHAIN);   /* thread 0 may not have written yet */
            completed++;
        }
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(thr[i], NULL);
        ck_assert_msg(w[i].fail[0] == '\0', "thread %d: %s", i, w[i].fail);
    }
    size_t n = 0;
    KVH_OK(c, kvnode_match(c, keys0, CHAIN, &n));
    ck_assert_uint_eq(n, CHAIN);
    ck_assert_uint_eq(kvnode_pending(c), 0);
    json_t *st = kvh_stats_client(c);
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(kvh_json_int(st, "frames.rejected_total"), 0);
    json_decref(st);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

struct blocked_call {
    kvnode_client *c;
    const kvnode_key *keys;
    int rc;
};

static void *blocked_match_main(void *arg)
{
    struct blocked_call *b = arg;
    size_t n;

    b->rc = kvnode_match(b->c, b->keys, CHAIN, &n);
    return NULL;
}

START_TEST(daemon_death_mid_flight)
{
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=64MiB\n");
    kvnode_layout lay = kvh_layout("async-death", SMALL_BYTES, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &lay, &c);
    kvnode_set_timeout(c, 60000);   /* the death, not a timeout, must end them */

    kvnode_key keys[CHAIN];
    kvh_chain(keys, CHAIN, 777);
    ck_assert_int_eq(kvh_put(c, keys, CHAIN, 3), 0);
    void **dst = alloc_pages(CHAIN, SMALL_BYTES);

    ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
    enum { N = 40 };
    kvnode_ticket t;
    for (int i = 0; i < N; i++)
        KVH_OK(c, kvnode_submit_match(c, keys, CHAIN, NULL, &t));
    KVH_OK(c, kvnode_submit_get(c, keys, CHAIN, dst, 0, NULL, &t));
    KVH_OK(c, kvnode_submit_put(c, keys, CHAIN, (const void *const *)dst, 0, NULL, &t));
    struct blocked_call b = { .c = c, .keys = keys, .rc = 1 };
    pthread_t thr;
    ck_assert_int_eq(pthread_create(&thr, NULL, blocked_match_main, &b), 0);
    kvh_sleep_ms(100);
    ck_assert_int_eq(event_ready(c, 0), 0);        /* the daemon is stopped */
    ck_assert_uint_eq(kvnode_pending(c), N + 2);

    uint64_t t0 = kvh_now_ms();
    ck_assert_int_eq(kvh_kill(&d, SIGKILL), KVH_EXIT_SIGNAL_BASE + SIGKILL);
    size_t failed = 0;
    for (int i = 0; i < N + 2; i++) {
        kvnode_completion comp = wait_one(c);
        ck_assert_int_eq(comp.rc, -KVNODE_ECLOSED);
        ck_assert_msg(strstr(comp.error, "closed") != NULL, "error: %s", comp.error);
        failed++;
    }
    ck_assert_uint_eq(failed, N + 2);
    pthread_join(thr, NULL);
    ck_assert_int_eq(b.rc, -KVNODE_ECLOSED);
    ck_assert_uint_lt(kvh_now_ms() - t0, WAIT_MS);
    ck_assert_uint_eq(kvnode_pending(c), 0);
    ck_assert_int_eq(kvnode_submit_match(c, keys, CHAIN, NULL, &t), -KVNODE_ECLOSED);
    kvnode_close(c);
    free_pages(dst, CHAIN);
    kvh_destroy(&d);
}
END_TEST

START_TEST(cancel_then_close_frees_leases)
{
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=64MiB\n");
    kvnode_layout lay = kvh_layout("async-cancel", SMALL_BYTES, 1, 0);
    kvnode_client *c, *c2;
    KVH_CONNECT(&d, &lay, &c);
    KVH_CONNECT(&d, &lay, &c2);

    kvnode_key keys[CHAIN];
    kvh_chain(keys, CHAIN, 555);
    ck_assert_int_eq(kvh_put(c, keys, CHAIN, 4), 0);
    /* c holds a read lease on the chain, and tickets are in flight */
    kvnode_loc locs[CHAIN];
    kvnode_lease lease = 0;
    size_t got = 0;
    KVH_OK(c, kvnode_get_begin(c, keys, CHAIN, &lease, locs, &got));
    ck_assert_uint_eq(got, CHAIN);
    ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
    enum { N = 20 };
    kvnode_ticket t;
    for (int i = 0; i < N; i++)
        KVH_OK(c, kvnode_submit_match(c, keys, CHAIN, NULL, &t));
    kvnode_cancel(c);
    for (int i = 0; i < N; i++) {
        kvnode_completion comp = wait_one(c);
        ck_assert_int_eq(comp.rc, -KVNODE_ECLOSED);
        ck_assert_msg(strstr(comp.error, "cancelled") != NULL, "error: %s", comp.error);
    }
    ck_assert_int_eq(kvnode_get_end(c, lease), -KVNODE_ECLOSED);
    kvnode_close(c);
    ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
    /* The daemon ended c's read lease with its connection: c2 may delete
     * the whole chain at once (pinned blocks would be freed only later,
     * but the index forgets them either way) and nothing stays pinned. */
    ck_assert_int_eq(kvh_wait_stat(&d, "leases.read", 0, WAIT_MS, NULL), 0);
    size_t deleted = 0;
    KVH_OK(c2, kvnode_delete(c2, keys, CHAIN, &deleted));
    ck_assert_uint_eq(deleted, CHAIN);
    kvnode_close(c2);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* A batch larger than what one connection may hold in uncommitted put
 * reservations (leases.max_reserved_per_client: a quarter of a 16 MiB tier,
 * 4 blocks of 1 MiB) is put in chunks under that limit, not refused whole
 * (found by the SGLang/LMCache adapters: a put of 12 pages of 1 MiB failed
 * with KVNODE_ELIMIT). */
START_TEST(put_batch_stays_under_the_reservation_limit)
{
    enum { N = 12, BIG = 1u << 20 };
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=16MiB\nmemory.slab_bytes=1MiB\n");
    kvnode_layout l = kvh_layout("async-big", BIG, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    kvnode_key keys[N];
    kvh_chain(keys, N, 77);
    void **src = alloc_pages(N, BIG), **dst = alloc_pages(N, BIG);
    for (size_t i = 0; i < N; i++)
        kvh_fill(src[i], BIG, keys[i], 5);
    KVH_OK(c, kvnode_put_batch(c, keys, N, (const void *const *)src, 0));
    size_t got = 0;
    KVH_OK(c, kvnode_get_batch(c, keys, N, dst, 0, &got));
    ck_assert_uint_eq(got, N);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(kvh_verify(dst[i], BIG, keys[i], 5) == 0, "block %zu differs", i);
    ck_assert_int_eq(KVH_STAT(&d, "leases.reservations_refused_total"), 0);
    free_pages(src, N);
    free_pages(dst, N);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        async_batches_round_trip_byte_exact,
        many_threads_one_client,
        daemon_death_mid_flight,
        cancel_then_close_frees_leases,
        put_batch_stays_under_the_reservation_limit,
    };
    return kvh_run_suite("daemon_async", "async", 60, tests, sizeof tests / sizeof tests[0]);
}
