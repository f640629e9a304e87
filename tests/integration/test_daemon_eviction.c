/* Integration: eviction under memory pressure.
 *
 * A small host tier (8 MiB of 1 MiB slabs = 128 blocks of 64 KiB, watermarks
 * 0.95 / 0.90):
 * - blocks pinned by a read lease survive any amount of new puts byte-exact
 *   and stay matchable; after get_end they become evictable;
 * - when every slot is pinned or reserved, put_begin fails with ENOSPC and a
 *   message, reserves nothing (all-or-nothing), and the space comes back when
 *   the leases end;
 * - eviction removes a chain's leaves before its root: while a chain is being
 *   evicted, what is left of it is always a prefix (match == blocks left),
 *   also for a chain stored root-first in pieces and then read (a GET
 *   refreshes a chain tail-first);
 * - a put into a full tier is handed slots that ascend, one after the other
 *   within a slab, though its victims leave leaves-first (descending): a
 *   copy into ascending blocks is what the hardware prefetches best. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define BB 65536
#define SMALL_TIER "memory.host_bytes=8MiB\nmemory.slab_bytes=1MiB\n" \
                   "memory.high_watermark=0.95\nmemory.low_watermark=0.90\n" \
                   "leases.max_reserved_per_client=1\n"

/* Wait until background eviction has stopped (dropped_total unchanged over
 * two reads 30 ms apart). */
static void settle(const kvh_daemon *d)
{
    uint64_t deadline = kvh_now_ms() + 3000;
    long long prev = KVH_STAT(d, "evictions.host.dropped_total");
    for (;;) {
        kvh_sleep_ms(30);
        long long cur = KVH_STAT(d, "evictions.host.dropped_total");
        if (cur == prev)
            return;
        prev = cur;
        ck_assert_msg(kvh_now_ms() < deadline, "eviction did not settle within 3 s");
    }
}

static long long capacity_blocks(const kvh_daemon *d)
{
    long long cap = KVH_STAT(d, "tiers.host.capacity_bytes");
    ck_assert_msg(cap >= 64LL * BB && cap <= 8LL << 20, "capacity_bytes %lld for host_bytes=8MiB", cap);
    ck_assert_msg(KVH_STAT(d, "tiers.host.slab_bytes") == 1 << 20, "slab_bytes is not 1 MiB");
    return cap / BB;
}

/* Put `blocks` new blocks in chains of `per` keys (chain ids from *next). */
static void fill(kvnode_client *c, long long blocks, size_t per, uint64_t *next)
{
    kvnode_key keys[16];
    ck_assert(per <= 16);
    for (long long done = 0; done < blocks; done += (long long)per) {
        kvh_chain(keys, per, (*next)++);
        int rc = kvh_put(c, keys, per, 8);
        ck_assert_msg(rc == 0, "filler put #%lld: %s", done / (long long)per, kvh_error());
    }
}

START_TEST(pinned_blocks_are_never_evicted)
{
    kvh_daemon d;
    KVH_START(&d, SMALL_TIER);
    kvnode_layout l = kvh_layout("ev-pin", BB, 1, 0);
    kvnode_client *c, *o;
    KVH_CONNECT(&d, &l, &c);
    KVH_CONNECT(&d, &l, &o);
    long long cap = capacity_blocks(&d);

    kvnode_key pinned[16];
    kvh_chain(pinned, 16, 1);
    int rc = kvh_put(c, pinned, 16, 7);
    ck_assert_msg(rc == 0, "%s", kvh_error());
    kvnode_loc locs[16];
    kvnode_lease lease;
    size_t got;
    KVH_OK(c, kvnode_get_begin(c, pinned, 16, &lease, locs, &got));
    ck_assert_uint_eq(got, 16);
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 1);
    long long dropped0 = KVH_STAT(&d, "evictions.host.dropped_total");

    /* Three times the tier's capacity of new blocks. */
    uint64_t next = 1000;
    fill(c, 3 * cap, 8, &next);
    settle(&d);

    json_t *st = kvh_stats(&d);
    ck_assert_msg(st != NULL, "%s", kvh_error());
    long long dropped = kvh_json_int(st, "evictions.host.dropped_total");
    ck_assert_msg(dropped > dropped0, "nothing was evicted after %lld puts into %lld slots (dropped %lld)",
                  3 * cap, cap, dropped);
    ck_assert_int_le(kvh_json_int(st, "tiers.host.used_bytes"), kvh_json_int(st, "tiers.host.capacity_bytes"));
    ck_assert_int_le(kvh_json_int(st, "tiers.host.blocks"), cap);
    json_decref(st);

    /* The pinned blocks are intact where the lease said they are... */
    for (size_t i = 0; i < 16; i++)
        ck_assert_msg(kvh_verify(locs[i].ptr, BB, pinned[i], 7) == 0, "pinned block %zu: %s", i, kvh_error());
    /* ...and still stored for everybody. */
    long m = kvh_match(o, pinned, 16);
    ck_assert_msg(m == 16, "pinned chain: match %ld of 16 after pressure", m);
    rc = kvh_get_zc_verify(o, pinned, 16, 7, &got);
    ck_assert_msg(rc == 0 && got == 16, "pinned chain read by another client: rc %d got %zu: %s", rc, got,
                  kvh_error());

    /* Unpinned, they are ordinary blocks: more pressure evicts them. */
    KVH_OK(c, kvnode_get_end(c, lease));
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 0);
    dropped0 = KVH_STAT(&d, "evictions.host.dropped_total");
    fill(c, 3 * cap, 8, &next);
    settle(&d);
    m = kvh_match(o, pinned, 16);
    ck_assert_msg(m >= 0 && m < 16, "after get_end and %lld more puts the chain still matches %ld of 16",
                  3 * cap, m);
    ck_assert_int_gt(KVH_STAT(&d, "evictions.host.dropped_total"), dropped0);

    kvnode_close(c);
    kvnode_close(o);
    KVH_STOP_DESTROY(&d);
}
END_TEST

#define MAXRES 64

START_TEST(enospc_when_everything_is_pinned_or_reserved)
{
    kvh_daemon d;
    KVH_START(&d, SMALL_TIER);
    kvnode_layout l = kvh_layout("ev-full", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    long long cap = capacity_blocks(&d);
    size_t half = (size_t)cap / 2;

    /* Pin half of the tier. */
    kvnode_key *pinned = calloc(half, sizeof *pinned);
    kvnode_loc *plocs = calloc(half, sizeof *plocs);
    ck_assert(pinned && plocs);
    kvh_chain(pinned, half, 1);
    int rc = kvh_put(c, pinned, half, 3);
    ck_assert_msg(rc == 0, "%s", kvh_error());
    kvnode_lease plead;
    size_t got;
    KVH_OK(c, kvnode_get_begin(c, pinned, half, &plead, plocs, &got));
    ck_assert_uint_eq(got, half);

    /* Reserve the rest, 8 slots at a time, until the daemon says ENOSPC. */
    kvnode_lease leases[MAXRES];
    int nres = 0;
    long long reserved = 0, used_before = 0;
    for (;;) {
        ck_assert_msg(nres < MAXRES && reserved <= cap, "put_begin keeps reserving: %lld slots pinned or "
                      "reserved in a %lld-slot tier", (long long)half + reserved, cap);
        kvnode_key keys[8];
        kvnode_loc locs[8];
        kvh_chain(keys, 8, 100 + (uint64_t)nres);
        used_before = KVH_STAT(&d, "tiers.host.used_bytes");
        kvnode_lease lease = 0;
        rc = kvnode_put_begin(c, keys, 8, KVNODE_TIER_HOST, &lease, locs);
        if (rc != 0)
            break;
        ck_assert(lease != 0);
        for (int i = 0; i < 8; i++)
            ck_assert_ptr_nonnull(locs[i].ptr);
        leases[nres++] = lease;
        reserved += 8;
    }
    ck_assert_msg(rc == -KVNODE_ENOSPC, "full tier: put_begin -> %d (%s): %s, expected ENOSPC", rc,
                  kvnode_strerror(rc), kvnode_last_error(c));
    const char *msg = kvnode_last_error(c);
    ck_assert_msg(msg && *msg, "ENOSPC without a message");
    long long held = (long long)half + reserved;
    ck_assert_msg(held >= cap - 8 && held <= cap,
                  "ENOSPC with %lld of %lld slots pinned or reserved (refused too early?)", held, cap);
    /* All-or-nothing: the refused request reserved nothing. */
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.used_bytes"), used_before);
    ck_assert_int_eq(KVH_STAT(&d, "leases.write"), nres);
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 1);

    /* The copying put fails the same way. */
    kvnode_key more[8];
    kvh_chain(more, 8, 999);
    rc = kvh_put(c, more, 8, 3);
    ck_assert_msg(rc == -KVNODE_ENOSPC, "full tier: kvnode_put -> %d: %s", rc, kvh_error());
    /* Keys that are already stored need no space: still answered. */
    kvnode_lease none = 99;
    kvnode_loc nlocs[8];
    KVH_OK(c, kvnode_put_begin(c, pinned, 8, KVNODE_TIER_HOST, &none, nlocs));
    for (int i = 0; i < 8; i++)
        ck_assert_ptr_null(nlocs[i].ptr);
    ck_assert(none == 0);
    /* The pinned blocks are untouched. */
    for (size_t i = 0; i < half; i++)
        ck_assert_msg(kvh_verify(plocs[i].ptr, BB, pinned[i], 3) == 0, "pinned %zu: %s", i, kvh_error());

    /* Ending the leases gives the space back. */
    for (int i = 0; i < nres; i++)
        KVH_OK(c, kvnode_put_abort(c, leases[i]));
    KVH_OK(c, kvnode_get_end(c, plead));
    ck_assert_int_eq(KVH_STAT(&d, "leases.write"), 0);
    ck_assert_int_eq(KVH_STAT(&d, "leases.read"), 0);
    kvnode_key *fresh = calloc(half, sizeof *fresh);
    ck_assert_ptr_nonnull(fresh);
    kvh_chain(fresh, half, 2);
    rc = kvh_put(c, fresh, half, 4);
    ck_assert_msg(rc == 0, "put after the leases ended: %s", kvh_error());
    rc = kvh_get_zc_verify(c, fresh, half, 4, &got);
    ck_assert_msg(rc == 0 && got == half, "rc %d got %zu: %s", rc, got, kvh_error());

    free(pinned);
    free(plocs);
    free(fresh);
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

#define CHAIN 32

static long long ns_blocks(json_t *st, const char *model)
{
    json_t *ns = kvh_stats_namespace(st, model, 0);
    ck_assert_msg(ns != NULL, "%s", kvh_error());
    return kvh_json_int(ns, "blocks");
}

START_TEST(chains_are_evicted_leaves_first)
{
    kvh_daemon d;
    KVH_START(&d, SMALL_TIER);
    /* Three namespaces with the same block size share one LRU order; their
     * block counts show how much of each chain is left without touching it. */
    kvnode_layout ls = kvh_layout("lf-single", BB, 1, 0);
    kvnode_layout lt = kvh_layout("lf-touched", BB, 1, 0);
    kvnode_layout lf = kvh_layout("lf-filler", BB, 1, 0);
    kvnode_client *cs, *ct, *cf;
    KVH_CONNECT(&d, &ls, &cs);
    KVH_CONNECT(&d, &lt, &ct);
    KVH_CONNECT(&d, &lf, &cf);
    long long cap = capacity_blocks(&d);

    /* S: one put (commit refreshes tail-first: S[0] newest of S). */
    kvnode_key s[CHAIN], t[CHAIN];
    kvh_chain(s, CHAIN, 1);
    kvh_chain(t, CHAIN, 2);
    int rc = kvh_put(cs, s, CHAIN, 5);
    ck_assert_msg(rc == 0, "%s", kvh_error());
    /* T: stored root-first in four pieces (so T[0..8) is T's oldest piece),
     * then read as a whole chain, which must refresh it tail-first. */
    for (size_t i = 0; i < CHAIN; i += 8) {
        rc = kvh_put(ct, t + i, 8, 6);
        ck_assert_msg(rc == 0, "%s", kvh_error());
    }
    size_t got;
    rc = kvh_get_zc_verify(ct, t, CHAIN, 6, &got);
    ck_assert_msg(rc == 0 && got == CHAIN, "rc %d got %zu: %s", rc, got, kvh_error());
    /* Oldest to newest now: S[31]..S[0], T[31]..T[0]. */

    /* Fill to just under the high watermark, then one block at a time. */
    uint64_t next = 1000;
    long long used_blocks = 2 * CHAIN;
    long long bulk = ((cap * 90 / 100) - used_blocks) / 8 * 8;
    if (bulk > 0)
        fill(cf, bulk, 8, &next);
    int checked_s = 0, checked_t = 0;
    for (int i = 0; i < 4 * cap && !checked_t; i++) {
        fill(cf, 1, 1, &next);
        settle(&d);
        json_t *st = kvh_stats(&d);
        ck_assert_msg(st != NULL, "%s", kvh_error());
        long long bs = ns_blocks(st, "lf-single"), bt = ns_blocks(st, "lf-touched");
        json_decref(st);
        if (!checked_s && bs < CHAIN) {
            ck_assert_msg(bt == CHAIN, "LRU order: T lost blocks (%lld left) before the older S", bt);
            ck_assert_msg(bs > 0, "S was evicted completely in one round; cannot see the order");
            long m = kvh_match(cs, s, CHAIN);
            ck_assert_msg(m == bs, "S (stored in one put): %lld blocks left but match = %ld: "
                          "eviction did not remove the leaves first", bs, m);
            checked_s = 1;   /* match refreshed S: T is the oldest now */
        } else if (checked_s && bt < CHAIN) {
            ck_assert_msg(bt > 0, "T was evicted completely in one round; cannot see the order");
            long m = kvh_match(ct, t, CHAIN);
            ck_assert_msg(m == bt, "T (stored root-first, then read): %lld blocks left but match = %ld: "
                          "the read did not refresh the chain tail-first", bt, m);
            checked_t = 1;
        }
    }
    ck_assert_msg(checked_s && checked_t, "the chains were never partly evicted (S %d, T %d)", checked_s,
                  checked_t);
    ck_assert_int_gt(KVH_STAT(&d, "evictions.host.dropped_total"), 0);

    kvnode_close(cs);
    kvnode_close(ct);
    kvnode_close(cf);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* No background eviction (high watermark 1): every victim is taken on demand by the put. */
#define FULL_TIER "memory.host_bytes=8MiB\nmemory.slab_bytes=1MiB\n" \
                  "memory.high_watermark=1\nmemory.low_watermark=0.9\n"

START_TEST(a_put_into_a_full_tier_gets_ascending_slots)
{
    kvh_daemon d;
    KVH_START(&d, FULL_TIER);
    kvnode_layout l = kvh_layout("asc", BB, 1, 0);
    kvnode_client *c;
    KVH_CONNECT(&d, &l, &c);
    long long cap = capacity_blocks(&d);
    uint64_t next = 1;
    fill(c, cap, 16, &next);   /* every slot taken, one 16-block chain per slab */
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.used_bytes"), cap * BB);
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.dropped_total"), 0);

    /* 24 blocks: the oldest chain's slab and half of the next one's. */
    enum { N = 24 };
    kvnode_key keys[N];
    kvnode_loc locs[N];
    kvnode_lease lease;
    kvh_chain(keys, N, 9999);
    int rc = kvnode_put_begin(c, keys, N, KVNODE_TIER_HOST, &lease, locs);
    ck_assert_msg(rc == 0, "put_begin into the full tier: %s", kvnode_last_error(c));
    uint64_t slab = 1 << 20, prev = 0;
    for (size_t i = 0; i < N; i++) {
        ck_assert_msg(locs[i].ptr != NULL, "key %zu got no slot", i);
        uint64_t off = kvh_host_offset(locs[i].ptr);
        /* Each slot right after the previous one, or the first of its slab. */
        ck_assert_msg(i == 0 || off == prev + BB || off % slab == 0,
                      "key %zu at offset %llu after key %zu at %llu: the put's slots do not ascend", i,
                      (unsigned long long)off, i - 1, (unsigned long long)prev);
        prev = off;
    }
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.dropped_total"), N);
    rc = kvnode_put_commit(c, lease);
    ck_assert_msg(rc == 0, "put_commit: %s", kvnode_last_error(c));
    kvnode_close(c);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        pinned_blocks_are_never_evicted,
        enospc_when_everything_is_pinned_or_reserved,
        chains_are_evicted_leaves_first,
        a_put_into_a_full_tier_gets_ascending_slots,
    };
    return kvh_run_suite("daemon_eviction", "eviction", 30, tests, sizeof tests / sizeof tests[0]);
}
