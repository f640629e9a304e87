/* Integration: prefix semantics of chains, two-phase puts and namespaces.
 *
 * - match/get answer with the longest stored prefix; a deleted key is a gap.
 * - put_begin reserves only keys that are not stored yet (NULL ptr for the
 *   others) and for keys another client is writing; put_abort makes nothing
 *   visible and frees the slots; an ended lease is ENOLEASE.
 * - Namespaces of different TP ranks do not see each other's keys.
 * - The same deployment announced with another block size is refused with
 *   ELAYOUT and a message naming both sizes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define BB 16384

static void assert_match(kvnode_client *c, const kvnode_key *keys, size_t n, long want, const char *what)
{
    long m = kvh_match(c, keys, n);
    ck_assert_msg(m == want, "%s: match = %ld, expected %ld (%s)", what, m, want, m < 0 ? kvh_error() : "");
}

static void assert_get(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed, size_t want,
                       const char *what)
{
    size_t got;
    int rc = kvh_get_zc_verify(c, keys, n, seed, &got);
    ck_assert_msg(rc == 0 && got == want, "%s: get_begin rc %d got %zu, expected %zu: %s", what, rc, got,
                  want, kvh_error());
    rc = kvh_get_verify(c, keys, n, seed, 0, &got);
    ck_assert_msg(rc == 0 && got == want, "%s: kvnode_get rc %d got %zu, expected %zu: %s", what, rc, got,
                  want, kvh_error());
    rc = kvh_get_verify(c, keys, n, seed, 1, &got);
    ck_assert_msg(rc == 0 && got == want, "%s: kvnode_get_inline rc %d got %zu, expected %zu: %s", what,
                  rc, got, want, kvh_error());
}

START_TEST(longest_prefix_and_gaps)
{
    kvh_daemon d;
    KVH_START(&d, NULL);
    kvnode_layout l = kvh_layout("px", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);

    kvnode_key keys[10];
    kvh_chain(keys, 10, 1);

    /* Nothing stored: 0, and get_begin returns no lease. */
    assert_match(c, keys, 10, 0, "empty");
    kvnode_loc locs[10];
    kvnode_lease lease = 99;
    size_t got = 99;
    KVH_OK(c, kvnode_get_begin(c, keys, 10, &lease, locs, &got));
    ck_assert_uint_eq(got, 0);
    ck_assert_msg(lease == 0, "get_begin with nothing matched returned lease %llu",
                  (unsigned long long)lease);

    int rc = kvh_put(c, keys, 5, 1);
    ck_assert_msg(rc == 0, "put keys[0..5): %s", kvh_error());
    assert_match(c, keys, 10, 5, "keys[0..5) stored, 10-key chain");
    assert_match(c, keys, 5, 5, "keys[0..5) stored, 5-key chain");
    assert_match(c, keys + 5, 5, 0, "keys[5..10) not stored");
    assert_get(c, keys, 10, 1, 5, "keys[0..5) stored");

    /* A gap at keys[2]: the prefix ends there even though 3 and 4 exist. */
    size_t deleted = 99;
    KVH_OK(c, kvnode_delete(c, keys + 2, 1, &deleted));
    ck_assert_uint_eq(deleted, 1);
    assert_match(c, keys, 10, 2, "keys[2] deleted");
    assert_get(c, keys, 10, 1, 2, "keys[2] deleted");
    assert_match(c, keys + 3, 2, 2, "keys[3..5) still stored");
    KVH_OK(c, kvnode_delete(c, keys + 2, 1, &deleted));
    ck_assert_uint_eq(deleted, 0);

    /* put_begin over the partially stored chain: slots only for 2 and 5..9. */
    memset(locs, 0, sizeof locs);
    lease = 0;
    KVH_OK(c, kvnode_put_begin(c, keys, 10, KVNODE_TIER_HOST, &lease, locs));
    ck_assert_msg(lease != 0, "put_begin with 6 new keys returned lease 0");
    for (size_t i = 0; i < 10; i++) {
        int stored = i < 5 && i != 2;
        if (stored) {
            ck_assert_msg(locs[i].ptr == NULL, "put_begin gave a slot for already stored keys[%zu]", i);
        } else {
            ck_assert_msg(locs[i].ptr != NULL, "put_begin gave no slot for new keys[%zu]", i);
            kvh_fill(locs[i].ptr, BB, keys[i], 1);
        }
    }
    /* Reserved but not committed: still invisible. */
    assert_match(c, keys, 10, 2, "keys[2] reserved, not committed");
    KVH_OK(c, kvnode_put_commit(c, lease));
    assert_match(c, keys, 10, 10, "after commit");
    assert_get(c, keys, 10, 1, 10, "after commit");

    /* Everything stored: no slot and no lease. */
    memset(locs, 0xff, sizeof locs);
    lease = 99;
    KVH_OK(c, kvnode_put_begin(c, keys, 10, KVNODE_TIER_HOST, &lease, locs));
    for (size_t i = 0; i < 10; i++)
        ck_assert_msg(locs[i].ptr == NULL, "put_begin gave a slot for stored keys[%zu]", i);
    ck_assert_msg(lease == 0, "put_begin of stored keys returned lease %llu", (unsigned long long)lease);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(put_abort_makes_nothing_visible)
{
    kvh_daemon d;
    KVH_START(&d, NULL);
    kvnode_layout l = kvh_layout("px-abort", BB, 1, 0);
    kvnode_client *c, *o;
    KVH_CONNECT(&d, &l, &c);
    KVH_CONNECT(&d, &l, &o);

    kvnode_key keys[6];
    kvh_chain(keys, 6, 2);
    long long used0 = KVH_STAT(&d, "tiers.host.used_bytes");

    kvnode_loc locs[6];
    kvnode_lease lease = 0;
    KVH_OK(c, kvnode_put_begin(c, keys, 6, KVNODE_TIER_HOST, &lease, locs));
    ck_assert(lease != 0);
    for (size_t i = 0; i < 6; i++) {
        ck_assert_ptr_nonnull(locs[i].ptr);
        kvh_fill(locs[i].ptr, BB, keys[i], 3);
    }
    ck_assert_int_eq(KVH_STAT(&d, "leases.write"), 1);
    ck_assert_msg(KVH_STAT(&d, "tiers.host.used_bytes") > used0, "reserved slots do not count as used");
    KVH_OK(c, kvnode_put_abort(c, lease));

    assert_match(c, keys, 6, 0, "after abort (writer)");
    assert_match(o, keys, 6, 0, "after abort (other client)");
    assert_get(o, keys, 6, 3, 0, "after abort");
    ck_assert_int_eq(KVH_STAT(&d, "leases.write"), 0);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.used_bytes"), used0);

    /* The ended lease is gone for every lease operation. */
    int rc = kvnode_put_commit(c, lease);
    ck_assert_msg(rc == -KVNODE_ENOLEASE, "commit after abort -> %d (%s)", rc, kvnode_strerror(rc));
    rc = kvnode_put_abort(c, lease);
    ck_assert_msg(rc == -KVNODE_ENOLEASE, "abort after abort -> %d (%s)", rc, kvnode_strerror(rc));

    /* The keys are free to be written again, by anyone. */
    memset(locs, 0, sizeof locs);
    KVH_OK(o, kvnode_put_begin(o, keys, 6, KVNODE_TIER_HOST, &lease, locs));
    for (size_t i = 0; i < 6; i++) {
        ck_assert_msg(locs[i].ptr != NULL, "aborted keys[%zu] still reserved", i);
        kvh_fill(locs[i].ptr, BB, keys[i], 4);
    }
    KVH_OK(o, kvnode_put_commit(o, lease));
    assert_get(c, keys, 6, 4, 6, "rewritten after abort");
    rc = kvnode_put_commit(o, lease);
    ck_assert_msg(rc == -KVNODE_ENOLEASE, "second commit -> %d (%s)", rc, kvnode_strerror(rc));

    /* get_end twice: the second is ENOLEASE. */
    size_t got;
    KVH_OK(c, kvnode_get_begin(c, keys, 6, &lease, locs, &got));
    ck_assert_uint_eq(got, 6);
    KVH_OK(c, kvnode_get_end(c, lease));
    rc = kvnode_get_end(c, lease);
    ck_assert_msg(rc == -KVNODE_ENOLEASE, "second get_end -> %d (%s)", rc, kvnode_strerror(rc));

    kvnode_close(c);
    kvnode_close(o);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(put_begin_skips_keys_being_written)
{
    kvh_daemon d;
    KVH_START(&d, NULL);
    kvnode_layout l = kvh_layout("px-race", BB, 1, 0);
    kvnode_client *a, *b;
    KVH_CONNECT(&d, &l, &a);
    KVH_CONNECT(&d, &l, &b);

    kvnode_key keys[6];
    kvh_chain(keys, 6, 3);

    kvnode_loc la[6], lb[6];
    kvnode_lease lease_a = 0, lease_b = 0;
    KVH_OK(a, kvnode_put_begin(a, keys, 4, KVNODE_TIER_HOST, &lease_a, la));
    ck_assert(lease_a != 0);
    for (size_t i = 0; i < 4; i++)
        ck_assert_ptr_nonnull(la[i].ptr);

    /* B asks for 6: the 4 that A is writing get no slot. */
    memset(lb, 0, sizeof lb);
    KVH_OK(b, kvnode_put_begin(b, keys, 6, KVNODE_TIER_HOST, &lease_b, lb));
    for (size_t i = 0; i < 4; i++)
        ck_assert_msg(lb[i].ptr == NULL, "B got a slot for keys[%zu] that A is writing", i);
    for (size_t i = 4; i < 6; i++)
        ck_assert_msg(lb[i].ptr != NULL, "B got no slot for new keys[%zu]", i);
    ck_assert(lease_b != 0);
    ck_assert_msg(la[0].ptr != lb[4].ptr && la[3].ptr != lb[5].ptr, "A and B share a slot");
    assert_match(b, keys, 6, 0, "nothing committed");

    for (size_t i = 4; i < 6; i++)
        kvh_fill(lb[i].ptr, BB, keys[i], 5);
    KVH_OK(b, kvnode_put_commit(b, lease_b));
    /* B's blocks are sealed, but the prefix starts with A's pending keys. */
    assert_match(b, keys, 6, 0, "B committed, A pending");
    assert_match(b, keys + 4, 2, 2, "B's keys");

    for (size_t i = 0; i < 4; i++)
        kvh_fill(la[i].ptr, BB, keys[i], 5);
    KVH_OK(a, kvnode_put_commit(a, lease_a));
    assert_match(b, keys, 6, 6, "both committed");
    assert_get(b, keys, 6, 5, 6, "both committed");
    assert_get(a, keys, 6, 5, 6, "both committed (A)");

    kvnode_close(a);
    kvnode_close(b);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(tp_ranks_are_separate_namespaces)
{
    kvh_daemon d;
    KVH_START(&d, NULL);
    kvnode_layout l0 = kvh_layout("px-tp", BB, 2, 0);
    kvnode_layout l1 = kvh_layout("px-tp", BB, 2, 1);
    kvnode_client *r0, *r1;
    KVH_CONNECT(&d, &l0, &r0);
    KVH_CONNECT(&d, &l1, &r1);

    kvnode_key keys[8];
    kvh_chain(keys, 8, 4);
    int rc = kvh_put(r0, keys, 8, 10);
    ck_assert_msg(rc == 0, "rank 0 put: %s", kvh_error());
    assert_match(r0, keys, 8, 8, "rank 0 own keys");
    assert_match(r1, keys, 8, 0, "rank 1 must not see rank 0's keys");
    assert_get(r1, keys, 8, 10, 0, "rank 1 must not read rank 0's keys");

    /* Rank 1 stores the same keys with its own bytes; each reads its own. */
    kvnode_loc locs[8];
    kvnode_lease lease;
    KVH_OK(r1, kvnode_put_begin(r1, keys, 8, KVNODE_TIER_HOST, &lease, locs));
    for (size_t i = 0; i < 8; i++) {
        ck_assert_msg(locs[i].ptr != NULL, "rank 1: key %zu reported stored (rank 0's)", i);
        kvh_fill(locs[i].ptr, BB, keys[i], 11);
    }
    KVH_OK(r1, kvnode_put_commit(r1, lease));
    assert_get(r0, keys, 8, 10, 8, "rank 0 after rank 1 put");
    assert_get(r1, keys, 8, 11, 8, "rank 1 after its put");

    size_t deleted;
    KVH_OK(r1, kvnode_delete(r1, keys, 1, &deleted));
    ck_assert_uint_eq(deleted, 1);
    assert_match(r1, keys, 8, 0, "rank 1 after deleting its root");
    assert_match(r0, keys, 8, 8, "rank 0 after rank 1 deleted its root");

    json_t *st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    json_t *n0 = kvh_stats_namespace(st, "px-tp", 0), *n1 = kvh_stats_namespace(st, "px-tp", 1);
    ck_assert_msg(n0 && n1, "%s", kvh_error());
    ck_assert_int_ne(kvh_json_int(n0, "id"), kvh_json_int(n1, "id"));
    json_t *d0 = json_object_get(n0, "deployment_id"), *d1 = json_object_get(n1, "deployment_id");
    ck_assert(json_is_string(d0) && json_is_string(d1));
    ck_assert_str_eq(json_string_value(d0), json_string_value(d1));
    ck_assert_int_eq(kvh_json_int(n0, "blocks"), 8);
    ck_assert_int_eq(kvh_json_int(n1, "blocks"), 7);
    ck_assert_int_eq(kvh_json_int(n0, "tp_size"), 2);
    json_decref(st);

    kvnode_close(r0);
    kvnode_close(r1);
    KVH_STOP_DESTROY(&d);
}
END_TEST

static void assert_elayout(const kvh_daemon *d, const kvnode_layout *l, const char *what)
{
    kvnode_client *c = (kvnode_client *)&c; /* must be reset to NULL on failure */
    int rc = kvnode_connect(d->sock, l, &c);
    const char *msg = kvnode_connect_error();
    ck_assert_msg(rc == -KVNODE_ELAYOUT, "%s: connect -> %d (%s), expected ELAYOUT", what, rc,
                  kvnode_strerror(rc));
    ck_assert_msg(c == NULL, "%s: failed connect left a client object", what);
    ck_assert_msg(msg != NULL && strstr(msg, "100000") && strstr(msg, "200000"),
                  "%s: message should name both block sizes (100000, 200000): '%s'", what,
                  msg ? msg : "(null)");
}

START_TEST(same_deployment_other_block_size_is_elayout)
{
    kvh_daemon d;
    KVH_START(&d, NULL);
    kvnode_layout a0 = kvh_layout("px-lay", 100000, 2, 0);
    kvnode_layout b0 = kvh_layout("px-lay", 200000, 2, 0);
    kvnode_layout b1 = kvh_layout("px-lay", 200000, 2, 1);
    kvnode_layout a1 = kvh_layout("px-lay", 100000, 2, 1);
    kvnode_layout other = kvh_layout("px-lay-other", 200000, 2, 0);

    kvnode_client *ca, *ca1, *co;
    KVH_CONNECT(&d, &a0, &ca);
    assert_elayout(&d, &b0, "same rank, other block size");
    assert_elayout(&d, &b1, "other rank, other block size");
    KVH_CONNECT(&d, &a1, &ca1);   /* same deployment, same size, other rank: fine */
    KVH_CONNECT(&d, &other, &co); /* another model with 200000: fine */
    KVH_OK(ca, kvnode_ping(ca));

    /* Namespaces outlive their clients: still refused with nobody bound. */
    kvnode_close(ca);
    kvnode_close(ca1);
    assert_elayout(&d, &b0, "after the first clients left");

    kvnode_close(co);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        longest_prefix_and_gaps,
        put_abort_makes_nothing_visible,
        put_begin_skips_keys_being_written,
        tp_ranks_are_separate_namespaces,
        same_deployment_other_block_size_is_elayout,
    };
    return kvh_run_suite("daemon_prefix", "prefix", 20, tests, sizeof tests / sizeof tests[0]);
}
