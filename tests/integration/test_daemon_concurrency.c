/* Integration: 64 concurrent clients on one namespace.
 *
 * 64 threads, each with its own kvnode_client, run random match / get
 * (zero-copy, copying, inline) / put (zero-copy with commit or abort,
 * copying, inline) / delete on windows of one shared array of 256 keys,
 * for a bounded number of operations (400 each) and time (6 s). A block's
 * bytes depend only on its key, so whoever wrote it, every block read must
 * be byte-exact.
 * Asserts: zero mismatches, no call fails (the tier is large enough that no
 * error is expected), every client was served, no lease is left behind,
 * and the daemon counted no failed request. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NTHREADS   64
#define NKEYS      256
#define MAXCHAIN   16
#define BB         16384
#define MAX_OPS    400
#define MAX_MS     6000
#define SEED       0   /* content is a function of the key alone */

static kvh_daemon daemon_;
static kvnode_key space[NKEYS];
static kvnode_layout layout_;

struct worker {
    pthread_t tid;
    unsigned id;
    uint64_t rng;
    long ops, reads_verified;
    long errors, mismatches;
    char first_problem[512];
};

static uint64_t rnd(struct worker *w)
{
    uint64_t x = w->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return w->rng = x;
}

static void problem(struct worker *w, int mismatch, const char *what, int rc, const char *detail)
{
    if (mismatch)
        w->mismatches++;
    else
        w->errors++;
    if (!w->first_problem[0])
        snprintf(w->first_problem, sizeof w->first_problem, "thread %u op %ld: %s -> %d (%s): %s", w->id,
                 w->ops, what, rc, kvnode_strerror(rc), detail);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    kvnode_client *c;
    if (kvh_connect(&daemon_, &layout_, &c) != 0) {
        problem(w, 0, "connect", -1, kvh_error());
        return NULL;
    }
    kvnode_loc locs[MAXCHAIN];
    uint64_t deadline = kvh_now_ms() + MAX_MS;
    for (w->ops = 0; w->ops < MAX_OPS && kvh_now_ms() < deadline; w->ops++) {
        size_t len = 1 + rnd(w) % MAXCHAIN;
        size_t start = rnd(w) % (NKEYS - len + 1);
        const kvnode_key *keys = space + start;
        unsigned op = (unsigned)(rnd(w) % 100);
        int rc;
        size_t got;
        kvnode_lease lease;

        if (op < 20) {                               /* match */
            long m = kvh_match(c, keys, len);
            if (m < 0)
                problem(w, 0, "match", (int)m, kvh_error());
        } else if (op < 40) {                        /* zero-copy get */
            rc = kvh_get_zc_verify(c, keys, len, SEED, &got);
            if (rc)
                problem(w, rc == KVH_MISMATCH, "get_begin/verify/get_end", rc, kvh_error());
            else
                w->reads_verified += (long)got;
        } else if (op < 50) {                        /* kvnode_get */
            rc = kvh_get_verify(c, keys, len, SEED, 0, &got);
            if (rc)
                problem(w, rc == KVH_MISMATCH, "kvnode_get/verify", rc, kvh_error());
            else
                w->reads_verified += (long)got;
        } else if (op < 58) {                        /* kvnode_get_inline */
            rc = kvh_get_verify(c, keys, len, SEED, 1, &got);
            if (rc)
                problem(w, rc == KVH_MISMATCH, "kvnode_get_inline/verify", rc, kvh_error());
            else
                w->reads_verified += (long)got;
        } else if (op < 78) {                        /* zero-copy put, commit or abort */
            rc = kvnode_put_begin(c, keys, len, KVNODE_TIER_HOST, &lease, locs);
            if (rc) {
                problem(w, 0, "put_begin", rc, kvnode_last_error(c));
                continue;
            }
            size_t slots = 0;
            for (size_t i = 0; i < len; i++) {
                if (locs[i].ptr) {
                    kvh_fill(locs[i].ptr, BB, keys[i], SEED);
                    slots++;
                }
            }
            if ((slots == 0) != (lease == 0))
                problem(w, 0, "put_begin", 0, slots ? "slots but lease 0" : "no slot but a lease");
            if (lease) {
                int abort_it = rnd(w) % 10 == 0;
                rc = abort_it ? kvnode_put_abort(c, lease) : kvnode_put_commit(c, lease);
                if (rc)
                    problem(w, 0, abort_it ? "put_abort" : "put_commit", rc, kvnode_last_error(c));
            }
        } else if (op < 86) {                        /* kvnode_put */
            rc = kvh_put(c, keys, len, SEED);
            if (rc)
                problem(w, 0, "kvnode_put", rc, kvh_error());
        } else if (op < 92) {                        /* kvnode_put_inline */
            rc = kvh_put_inline(c, keys, len, SEED);
            if (rc)
                problem(w, 0, "kvnode_put_inline", rc, kvh_error());
        } else {                                     /* delete a few */
            size_t deleted;
            size_t dn = len < 4 ? len : 4;
            rc = kvnode_delete(c, keys, dn, &deleted);
            if (rc)
                problem(w, 0, "delete", rc, kvnode_last_error(c));
            else if (deleted > dn)
                problem(w, 0, "delete", 0, "deleted more keys than asked");
        }
    }
    kvnode_close(c);
    return NULL;
}

START_TEST(sixty_four_clients_random_ops)
{
    KVH_START(&daemon_, "server.max_clients=256\nmemory.host_bytes=64MiB\n");
    layout_ = kvh_layout("conc", BB, 1, 0);
    kvh_chain(space, NKEYS, 7);

    static struct worker w[NTHREADS];
    memset(w, 0, sizeof w);
    for (unsigned i = 0; i < NTHREADS; i++) {
        w[i].id = i;
        w[i].rng = 0x9e3779b97f4a7c15ull * (i + 1) | 1;
        ck_assert_int_eq(pthread_create(&w[i].tid, NULL, worker_main, &w[i]), 0);
    }
    long ops = 0, errors = 0, mismatches = 0, verified = 0, min_ops = MAX_OPS;
    const char *first = NULL;
    for (unsigned i = 0; i < NTHREADS; i++) {
        pthread_join(w[i].tid, NULL);
        ops += w[i].ops;
        errors += w[i].errors;
        mismatches += w[i].mismatches;
        verified += w[i].reads_verified;
        if (w[i].ops < min_ops)
            min_ops = w[i].ops;
        if (!first && w[i].first_problem[0])
            first = w[i].first_problem;
    }
    fprintf(stderr, "concurrency: %d clients, %ld ops (min %ld per client), %ld blocks read and verified\n",
            NTHREADS, ops, min_ops, verified);
    ck_assert_msg(mismatches == 0, "%ld byte mismatches; first: %s", mismatches, first);
    ck_assert_msg(errors == 0, "%ld failed calls; first: %s", errors, first);
    /* Progress, not speed (under valgrind a client may get few turns). */
    ck_assert_msg(min_ops >= 1, "a client made no operation in %d ms", MAX_MS);
    ck_assert_msg(verified > 0, "no block was ever read back");

    /* Every client is gone: nothing pinned or reserved remains. */
    long long last;
    ck_assert_msg(kvh_wait_stat(&daemon_, "leases.read", 0, 3000, &last) == 0, "read leases left: %lld", last);
    ck_assert_msg(kvh_wait_stat(&daemon_, "leases.write", 0, 3000, &last) == 0, "write leases left: %lld", last);
    json_t *st = kvh_stats(&daemon_);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    json_t *reqs = json_object_get(st, "requests");
    const char *op;
    json_t *v;
    json_object_foreach(reqs, op, v) {
        long long e = kvh_json_int(v, "error");
        ck_assert_msg(e == 0, "daemon counted %lld failed '%s' requests", e, op);
    }
    ck_assert_int_ge(kvh_json_int(st, "clients.accepted_total"), NTHREADS);
    ck_assert_int_eq(kvh_json_int(st, "clients.refused_total"), 0);
    json_decref(st);

    /* What is stored at the end is still exact. */
    kvnode_client *c;
    KVH_CONNECT(&daemon_, &layout_, &c);
    long stored = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t got;
        int rc = kvh_get_verify(c, space + i, 1, SEED, 0, &got);
        ck_assert_msg(rc == 0, "final read of key %zu: %s", i, kvh_error());
        stored += (long)got;
    }
    st = kvh_stats(&daemon_);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    json_t *ns = kvh_stats_namespace(st, "conc", 0);
    ck_assert_msg(ns != NULL, "%s", kvh_error());
    ck_assert_int_eq(kvh_json_int(ns, "blocks"), stored);
    json_decref(st);
    kvnode_close(c);

    KVH_STOP_DESTROY(&daemon_);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = { sixty_four_clients_random_ops };
    return kvh_run_suite("daemon_concurrency", "concurrency", 40, tests, sizeof tests / sizeof tests[0]);
}
