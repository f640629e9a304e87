/* Requests not waited for (issue 32, item 5): kvnode_get_end and
 * kvnode_put_commit_nowait send and return; the daemon applies them before
 * the client's next request; an error reply is kept for a later call;
 * kvnode_flush and kvnode_close wait for the replies. */
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvnode.h"

#define BB 4096u
#define N 8

static kvnode_layout layout(void)
{
    return kvh_layout("pipe", BB, 1, 0);
}

static long long requests_ok(const kvh_daemon *d, const char *op)
{
    char path[64];
    json_t *st = kvh_stats(d);
    long long v;

    ck_assert_ptr_nonnull(st);
    snprintf(path, sizeof path, "requests.%s.ok", op);
    v = kvh_json_int_or(st, path, 0);
    json_decref(st);
    return v;
}

/* A GET batch costs one round trip: get_end returns while the daemon is
 * stopped (SIGSTOP), so it cannot have waited for a reply (the synchronous
 * end of before could only time out); the daemon applies it before the next
 * request, whose answer then sees the lease gone. */
START_TEST(a_get_batch_is_one_round_trip)
{
    kvh_daemon d;
    kvnode_client *c;
    kvnode_layout l = layout();
    kvnode_key keys[N];
    kvnode_loc locs[N];
    kvnode_lease lease;
    size_t got;

    ck_assert_msg(kvh_start(&d, "") == 0, "%s", kvh_error());
    ck_assert_int_eq(kvh_connect(&d, &l, &c), 0);
    kvnode_set_timeout(c, 3000);
    kvh_chain(keys, N, 1);
    ck_assert_int_eq(kvh_put(c, keys, N, 7), 0);
    for (int round = 0; round < 20; round++) {
        ck_assert_int_eq(kvnode_get_begin(c, keys, N, &lease, locs, &got), 0);
        ck_assert_uint_eq(got, N);
        ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
        int rc = kvnode_get_end(c, lease);
        ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
        ck_assert_msg(rc == 0, "get_end with the daemon stopped: %d %s", rc,
                      kvnode_last_error(c));
    }
    /* In order: the next request is handled after the 20 ends. */
    json_t *st = kvh_stats_client(c);
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(kvh_json_int(st, "leases.read"), 0);
    ck_assert_int_eq(kvh_json_int_or(st, "requests.get_end.ok", 0), 20);
    json_decref(st);
    ck_assert_int_eq(kvnode_flush(c), 0);
    kvnode_close(c);
    ck_assert_int_eq(kvh_stat(&d, "leases.reaped_total"), 0);
    ck_assert_int_eq(kvh_stop(&d, 0), 0);
    kvh_destroy(&d);
}
END_TEST

/* An end that could fail for a reason the caller must see waits and answers
 * for itself: a lease never got, one ended already, one the reaper may have
 * taken (3/4 of its TTL gone). (A kept error of an end not waited for is
 * tested against a fake daemon: tests/unit/test_client_proto.c.) */
START_TEST(ends_that_may_fail_wait_for_their_answer)
{
    kvh_daemon d;
    kvnode_client *c;
    kvnode_layout l = layout();
    kvnode_key keys[N], fresh[N];
    kvnode_loc locs[N];
    kvnode_lease lease, wl;
    size_t got;
    long long last;

    ck_assert_msg(kvh_start(&d, "leases.read_ttl=200ms\nleases.write_ttl=200ms\n"
                                "leases.reaper_interval=20ms\n") == 0, "%s", kvh_error());
    ck_assert_int_eq(kvh_connect(&d, &l, &c), 0);
    kvh_chain(keys, N, 2);
    kvh_chain(fresh, N, 3);
    ck_assert_int_eq(kvh_put(c, keys, N, 7), 0);

    ck_assert_int_eq(kvnode_get_end(c, 987654321), -KVNODE_ENOLEASE);
    ck_assert_int_eq(kvnode_put_commit_nowait(c, 987654321), -KVNODE_ENOLEASE);
    ck_assert_int_eq(kvnode_get_begin(c, keys, N, &lease, locs, &got), 0);
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    ck_assert_int_eq(kvnode_get_end(c, lease), -KVNODE_ENOLEASE);      /* twice */
    /* A read lease is not a write lease: that commit waits too. */
    ck_assert_int_eq(kvnode_get_begin(c, keys, N, &lease, locs, &got), 0);
    ck_assert_int_eq(kvnode_put_commit_nowait(c, lease), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);

    /* Reaped: the holder learns it from the end itself. */
    ck_assert_int_eq(kvnode_get_begin(c, keys, N, &lease, locs, &got), 0);
    ck_assert_int_eq(kvnode_put_begin(c, fresh, N, KVNODE_TIER_HOST, &wl, locs), 0);
    ck_assert_msg(kvh_wait_stat(&d, "leases.read", 0, 5000, &last) == 0, "%lld left", last);
    ck_assert_msg(kvh_wait_stat(&d, "leases.write", 0, 5000, &last) == 0, "%lld left", last);
    ck_assert_int_eq(kvnode_get_end(c, lease), -KVNODE_ENOLEASE);
    ck_assert_int_eq(kvnode_put_commit_nowait(c, wl), -KVNODE_ENOLEASE);
    ck_assert_int_eq(kvnode_flush(c), 0);
    kvnode_close(c);
    ck_assert_int_eq(kvh_stop(&d, 0), 0);
    kvh_destroy(&d);
}
END_TEST

/* kvnode_close waits for the ends and commits it did not wait for: the
 * daemon ends every lease by request, none is reaped with the connection. */
START_TEST(close_waits_for_what_was_not_waited_for)
{
    kvh_daemon d;
    kvnode_client *c;
    kvnode_layout l = layout();
    kvnode_key keys[N], fresh[N];
    kvnode_loc locs[N];
    kvnode_lease lease;
    size_t got;

    ck_assert_msg(kvh_start(&d, "") == 0, "%s", kvh_error());
    ck_assert_int_eq(kvh_connect(&d, &l, &c), 0);
    kvh_chain(keys, N, 4);
    kvh_chain(fresh, N, 5);
    ck_assert_int_eq(kvh_put(c, keys, N, 7), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(kvnode_get_begin(c, keys, N, &lease, locs, &got), 0);
        ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    }
    ck_assert_int_eq(kvnode_put_begin(c, fresh, N, KVNODE_TIER_HOST, &lease, locs), 0);
    for (int i = 0; i < N; i++)
        kvh_fill(locs[i].ptr, BB, fresh[i], 9);
    ck_assert_int_eq(kvnode_put_commit_nowait(c, lease), 0);
    kvnode_close(c);
    ck_assert_int_eq(kvh_stat(&d, "leases.read"), 0);
    ck_assert_int_eq(kvh_stat(&d, "leases.write"), 0);
    ck_assert_int_eq(kvh_stat(&d, "leases.reaped_total"), 0);
    ck_assert_int_eq(requests_ok(&d, "get_end"), 3);
    ck_assert_int_eq(requests_ok(&d, "put_commit"), 2);     /* kvh_put's and ours */

    /* What was committed is there, byte for byte. */
    static uint8_t want[N][BB], have[N][BB];
    void *out[N];
    ck_assert_int_eq(kvh_connect(&d, &l, &c), 0);
    for (int i = 0; i < N; i++) {
        kvh_fill(want[i], BB, fresh[i], 9);
        out[i] = have[i];
    }
    ck_assert_int_eq(kvnode_get(c, fresh, N, out, &got), 0);
    ck_assert_uint_eq(got, N);
    ck_assert_int_eq(memcmp(want, have, sizeof want), 0);
    kvnode_close(c);
    ck_assert_int_eq(kvh_stop(&d, 0), 0);
    kvh_destroy(&d);
}
END_TEST

/* put_commit_nowait then put_begin (and get_begin) at once: the daemon
 * commits first, so a get right after sees every block, byte-exact. */
START_TEST(pipelined_commits_are_byte_exact)
{
    enum { ROUNDS = 40 };
    kvh_daemon d;
    kvnode_client *c;
    kvnode_layout l = layout();
    kvnode_key keys[N];
    kvnode_loc locs[N];
    kvnode_lease lease, rl;
    size_t got;
    static uint8_t want[N][BB];

    ck_assert_msg(kvh_start(&d, "") == 0, "%s", kvh_error());
    ck_assert_int_eq(kvh_connect(&d, &l, &c), 0);
    for (int r = 0; r < ROUNDS; r++) {
        kvh_chain(keys, N, 100 + (uint64_t)r);
        ck_assert_int_eq(kvnode_put_begin(c, keys, N, KVNODE_TIER_HOST, &lease, locs), 0);
        ck_assert_uint_ne(lease, 0);
        for (int i = 0; i < N; i++) {
            ck_assert_ptr_nonnull(locs[i].ptr);
            kvh_fill(locs[i].ptr, BB, keys[i], (uint64_t)r);
        }
        ck_assert_int_eq(kvnode_put_commit_nowait(c, lease), 0);
        if (r % 2) {
            /* Read back at once: committed before this get_begin. */
            ck_assert_int_eq(kvnode_get_begin(c, keys, N, &rl, locs, &got), 0);
            ck_assert_uint_eq(got, N);
            for (int i = 0; i < N; i++) {
                kvh_fill(want[i], BB, keys[i], (uint64_t)r);
                ck_assert_int_eq(memcmp(locs[i].ptr, want[i], BB), 0);
            }
            ck_assert_int_eq(kvnode_get_end(c, rl), 0);
        }
    }
    ck_assert_int_eq(kvnode_flush(c), 0);
    for (int r = 0; r < ROUNDS; r++) {
        kvh_chain(keys, N, 100 + (uint64_t)r);
        ck_assert_int_eq(kvnode_get_begin(c, keys, N, &rl, locs, &got), 0);
        ck_assert_uint_eq(got, N);
        for (int i = 0; i < N; i++) {
            kvh_fill(want[i], BB, keys[i], (uint64_t)r);
            ck_assert_int_eq(memcmp(locs[i].ptr, want[i], BB), 0);
        }
        ck_assert_int_eq(kvnode_get_end(c, rl), 0);
    }
    ck_assert_int_eq(kvnode_flush(c), 0);
    ck_assert_int_eq(requests_ok(&d, "put_commit"), ROUNDS);
    ck_assert_int_eq(kvh_stat(&d, "leases.write"), 0);
    kvnode_close(c);
    ck_assert_int_eq(kvh_stop(&d, 0), 0);
    kvh_destroy(&d);
}
END_TEST

/* The daemon dies between a request not waited for and the next call: that
 * call, kvnode_flush and kvnode_close end cleanly with -KVNODE_ECLOSED. */
START_TEST(a_daemon_that_dies_in_between_gives_a_clean_error)
{
    kvh_daemon d;
    kvnode_client *c, *c2;
    kvnode_layout l = layout();
    kvnode_key keys[N], fresh[N];
    kvnode_loc locs[N];
    kvnode_lease lease, wl;
    size_t got, matched;

    ck_assert_msg(kvh_start(&d, "") == 0, "%s", kvh_error());
    ck_assert_int_eq(kvh_connect(&d, &l, &c), 0);
    ck_assert_int_eq(kvh_connect(&d, &l, &c2), 0);
    kvh_chain(keys, N, 6);
    kvh_chain(fresh, N, 7);
    ck_assert_int_eq(kvh_put(c, keys, N, 7), 0);
    ck_assert_int_eq(kvnode_get_begin(c, keys, N, &lease, locs, &got), 0);
    ck_assert_int_eq(kvnode_put_begin(c2, fresh, N, KVNODE_TIER_HOST, &wl, locs), 0);
    /* Stopped, so neither request is answered before it dies. */
    ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
    ck_assert_int_eq(kvnode_get_end(c, lease), 0);
    ck_assert_int_eq(kvnode_put_commit_nowait(c2, wl), 0);
    kvh_kill(&d, SIGKILL);
    ck_assert_int_eq(kvnode_match(c, keys, N, &matched), -KVNODE_ECLOSED);
    ck_assert_int_eq(kvnode_flush(c), -KVNODE_ECLOSED);
    ck_assert_int_eq(kvnode_flush(c2), -KVNODE_ECLOSED);
    ck_assert_int_eq(kvnode_ping(c2), -KVNODE_ECLOSED);
    kvnode_close(c);
    kvnode_close(c2);
    kvh_destroy(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_pipeline");
    TCase *tc = tcase_create("pipeline");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_get_batch_is_one_round_trip);
    tcase_add_test(tc, ends_that_may_fail_wait_for_their_answer);
    tcase_add_test(tc, close_waits_for_what_was_not_waited_for);
    tcase_add_test(tc, pipelined_commits_are_byte_exact);
    tcase_add_test(tc, a_daemon_that_dies_in_between_gives_a_clean_error);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
