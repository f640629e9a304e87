/* Integration: leases whose holder goes away or forgets them.
 *
 * - A client process killed with SIGKILL while holding a read lease and a
 *   write lease: the daemon ends both at once (stats leases back to 0 within
 *   a short deadline), frees the reserved slots (used_bytes drops by them),
 *   leaves the reserved keys invisible and writable by others, and the
 *   blocks that were pinned become evictable.
 * - The reaper (read_ttl = write_ttl = 200ms, interval 20ms): a lease held
 *   past its TTL is ended (reaped_total grows); using it afterwards is
 *   ENOLEASE; a reaped write reservation's keys never become visible. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define BB 65536
#define N 8

/* In the child (kvh_spawn_holder): a read lease on R and a write lease on W. */
static int hold_leases(const kvh_daemon *d, char *msg, size_t len)
{
    kvnode_layout l = kvh_layout("lease-kill", BB, 1, 0);
    kvnode_client *c;
    kvnode_key r[N], w[N];
    kvh_chain(r, N, 1);
    kvh_chain(w, N, 2);
    if (kvh_connect(d, &l, &c) != 0 || kvh_put(c, r, N, 1) != 0) {
        snprintf(msg, len, "%s", kvh_error());
        return -1;
    }
    kvnode_loc locs[N];
    kvnode_lease lr, lw;
    size_t got;
    int rc = kvnode_get_begin(c, r, N, &lr, locs, &got);
    if (rc != 0 || got != N) {
        snprintf(msg, len, "get_begin rc %d got %zu: %s", rc, got, kvnode_last_error(c));
        return -1;
    }
    rc = kvnode_put_begin(c, w, N, KVNODE_TIER_HOST, &lw, locs);
    if (rc != 0) {
        snprintf(msg, len, "put_begin rc %d: %s", rc, kvnode_last_error(c));
        return -1;
    }
    for (size_t i = 0; i < N; i++) {
        if (!locs[i].ptr) {
            snprintf(msg, len, "put_begin: no slot for key %zu", i);
            return -1;
        }
        kvh_fill(locs[i].ptr, BB, w[i], 2);
    }
    return 0;
}

START_TEST(killed_client_leaves_nothing_pinned_or_reserved)
{
    kvh_daemon d;
    KVH_START(&d, "memory.host_bytes=8MiB\nmemory.slab_bytes=1MiB\n");
    long long used0 = KVH_STAT(&d, "tiers.host.used_bytes");

    pid_t pid = kvh_spawn_holder(&d, hold_leases);
    ck_assert_msg(pid > 0, "%s", kvh_error());

    kvnode_key r[N], w[N];
    kvh_chain(r, N, 1);
    kvh_chain(w, N, 2);
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 1);
    ck_assert_int_eq(KVH_STAT(&d, "leases.write"), 1);
    long long used1 = KVH_STAT(&d, "tiers.host.used_bytes");
    ck_assert_int_eq(used1 - used0, 2 * N * BB);

    kvnode_layout l = kvh_layout("lease-kill", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    /* While the child lives, W is being written: no slots for us. */
    kvnode_loc locs[N];
    kvnode_lease lease = 0;
    KVH_OK(c, kvnode_put_begin(c, w, N, KVNODE_TIER_HOST, &lease, locs));
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(locs[i].ptr == NULL, "key %zu reserved by the live child got a second slot", i);
    if (lease)
        KVH_OK(c, kvnode_put_abort(c, lease));

    int ws = proc_stop(&pid, SIGKILL, KVH_STOP_TIMEOUT_MS);
    ck_assert_msg(ws >= 0, "%s", proc_error());
    ck_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);

    long long last;
    ck_assert_msg(kvh_wait_stat(&d, "leases.read", 0, 3000, &last) == 0,
                  "read lease of the killed client still counted: %lld", last);
    ck_assert_msg(kvh_wait_stat(&d, "leases.write", 0, 3000, &last) == 0,
                  "write lease of the killed client still counted: %lld", last);
    ck_assert_msg(kvh_wait_stat(&d, "tiers.host.used_bytes", used0 + N * BB, 3000, &last) == 0,
                  "used_bytes %lld, expected %lld once the reservation is freed", last,
                  used0 + (long long)N * BB);

    /* Nothing half-written became visible; the keys are free again. */
    long m = kvh_match(c, w, N);
    ck_assert_msg(m == 0, "reserved keys of the killed client visible: match %ld", m);
    KVH_OK(c, kvnode_put_begin(c, w, N, KVNODE_TIER_HOST, &lease, locs));
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(locs[i].ptr != NULL, "key %zu still reserved after its writer died", i);
    KVH_OK(c, kvnode_put_abort(c, lease));
    /* R is still stored (a read lease only pinned it). */
    size_t got;
    int rc = kvh_get_zc_verify(c, r, N, 1, &got);
    ck_assert_msg(rc == 0 && got == N, "rc %d got %zu: %s", rc, got, kvh_error());

    /* And no longer pinned: pressure evicts it. */
    long long cap = KVH_STAT(&d, "tiers.host.capacity_bytes") / BB;
    kvnode_key keys[8];
    for (long long i = 0; i < 3 * cap; i += 8) {
        kvh_chain(keys, 8, 1000 + (uint64_t)i);
        rc = kvh_put(c, keys, 8, 3);
        ck_assert_msg(rc == 0, "filler: %s", kvh_error());
    }
    kvh_sleep_ms(100);
    m = kvh_match(c, r, N);
    ck_assert_msg(m >= 0 && m < N, "blocks pinned by the dead client survived %lld puts: match %ld",
                  3 * cap, m);
    ck_assert_int_gt(KVH_STAT(&d, "evictions.host.dropped_total"), 0);

    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(reaper_ends_expired_leases)
{
    kvh_daemon d;
    KVH_START(&d, "leases.read_ttl=200ms\nleases.write_ttl=200ms\nleases.reaper_interval=20ms\n");
    kvnode_layout l = kvh_layout("lease-ttl", BB, 1, 0);
    kvnode_client *c, *o;
    KVH_CONNECT(&d, &l, &c);
    KVH_CONNECT(&d, &l, &o);

    kvnode_key r[N], w[N];
    kvh_chain(r, N, 1);
    kvh_chain(w, N, 2);
    int rc = kvh_put(c, r, N, 1);
    ck_assert_msg(rc == 0, "%s", kvh_error());
    long long used0 = KVH_STAT(&d, "tiers.host.used_bytes");
    long long reaped0 = KVH_STAT(&d, "leases.reaped_total");

    /* Leases ended in time are not reaped. */
    kvnode_loc locs[N];
    kvnode_lease lr, lw;
    size_t got;
    KVH_OK(c, kvnode_get_begin(c, r, N, &lr, locs, &got));
    KVH_OK(c, kvnode_get_end(c, lr));
    rc = kvh_put(c, w, 1, 2);   /* put_begin + commit well within the TTL */
    ck_assert_msg(rc == 0, "%s", kvh_error());
    size_t deleted;
    KVH_OK(c, kvnode_delete(c, w, 1, &deleted));
    used0 = KVH_STAT(&d, "tiers.host.used_bytes");

    /* Now hold one of each past the TTL. */
    uint64_t t0 = kvh_now_ms();
    KVH_OK(c, kvnode_get_begin(c, r, N, &lr, locs, &got));
    ck_assert_uint_eq(got, N);
    KVH_OK(c, kvnode_put_begin(c, w, N, KVNODE_TIER_HOST, &lw, locs));
    for (size_t i = 0; i < N; i++) {
        ck_assert_ptr_nonnull(locs[i].ptr);
        kvh_fill(locs[i].ptr, BB, w[i], 2);
    }
    json_t *st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    if (kvh_now_ms() - t0 < 100) {  /* not reaped early (skip on a very slow machine) */
        ck_assert_int_eq(kvh_json_int(st, "leases.read"), 1);
        ck_assert_int_eq(kvh_json_int(st, "leases.write"), 1);
        ck_assert_int_eq(kvh_json_int(st, "leases.reaped_total"), reaped0);
    }
    json_decref(st);

    long long last;
    ck_assert_msg(kvh_wait_stat(&d, "leases.read", 0, 3000, &last) == 0,
                  "read lease not reaped 3 s after a 200ms TTL (%lld left)", last);
    ck_assert_msg(kvh_wait_stat(&d, "leases.write", 0, 3000, &last) == 0,
                  "write lease not reaped 3 s after a 200ms TTL (%lld left)", last);
    /* (a few ms of slack for millisecond rounding on both sides) */
    ck_assert_msg(kvh_now_ms() - t0 >= 195, "leases reaped before their 200ms TTL (after %llu ms)",
                  (unsigned long long)(kvh_now_ms() - t0));
    ck_assert_int_ge(KVH_STAT(&d, "leases.reaped_total"), reaped0 + 2);

    /* The holder learns it on its next use. */
    rc = kvnode_get_end(c, lr);
    ck_assert_msg(rc == -KVNODE_ENOLEASE, "get_end of a reaped lease -> %d (%s)", rc, kvnode_strerror(rc));
    rc = kvnode_put_commit(c, lw);
    ck_assert_msg(rc == -KVNODE_ENOLEASE, "put_commit of a reaped lease -> %d (%s)", rc,
                  kvnode_strerror(rc));
    rc = kvnode_put_abort(c, lw);
    ck_assert_msg(rc == -KVNODE_ENOLEASE, "put_abort of a reaped lease -> %d (%s)", rc,
                  kvnode_strerror(rc));

    /* The reservation was aborted: invisible, slots freed, keys writable. */
    long m = kvh_match(o, w, N);
    ck_assert_msg(m == 0, "keys of a reaped write lease are visible: match %ld", m);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.used_bytes"), used0);
    /* The read lease only unpinned R. */
    rc = kvh_get_zc_verify(o, r, N, 1, &got);
    ck_assert_msg(rc == 0 && got == N, "rc %d got %zu: %s", rc, got, kvh_error());
    rc = kvh_put(o, w, N, 3);
    ck_assert_msg(rc == 0, "%s", kvh_error());
    rc = kvh_get_zc_verify(c, w, N, 3, &got);
    ck_assert_msg(rc == 0 && got == N, "rc %d got %zu: %s", rc, got, kvh_error());
    /* The client whose leases were reaped is still served. */
    KVH_OK(c, kvnode_ping(c));

    kvnode_close(c);
    kvnode_close(o);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        killed_client_leaves_nothing_pinned_or_reserved,
        reaper_ends_expired_leases,
    };
    return kvh_run_suite("daemon_leases", "leases", 30, tests, sizeof tests / sizeof tests[0]);
}
