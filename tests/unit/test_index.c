/* Unit tests for daemon/mem/index.c: hash table (incl. incremental rehash) and
 * per-(arena, class) LRU lists.
 *
 * KVNODE_TEST_KEYS (env) sets the size of the big table tests (default
 * 200000); keep it >= 20000 so several growths happen. */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mem/arena.h"
#include "mem/index.h"

/* Fail only when cond is false: ck_assert on every iteration of a 200k loop
 * costs a pipe write each in fork mode. */
#define FAIL_IF_NOT(cond, ...)                  \
    do {                                        \
        if (!(cond))                            \
            ck_abort_msg(__VA_ARGS__);          \
    } while (0)

static const uint32_t test_ns[] = {0, 1, 7, UINT32_MAX};
#define TEST_NNS (sizeof test_ns / sizeof test_ns[0])

static size_t test_keys_total(void)
{
    const char *s = getenv("KVNODE_TEST_KEYS");
    long v = s ? strtol(s, NULL, 10) : 0;
    return v >= 20000 ? (size_t)v : 200000;
}

static uint64_t test_rng_state = 0x2545f4914f6cdd1dull;

static uint64_t test_rand(void)
{
    uint64_t x = test_rng_state;     /* xorshift64: deterministic across runs */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    test_rng_state = x;
    return x;
}

static void test_shuffle(size_t *a, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(test_rand() % i);
        size_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static int test_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* n distinct keys spread over the whole int64 range, negative ones included,
 * plus the extremes. */
static int64_t *test_make_keys(size_t n)
{
    int64_t *k = malloc(n * sizeof *k);
    ck_assert_ptr_nonnull(k);
    k[0] = INT64_MIN;
    k[1] = INT64_MAX;
    k[2] = 0;
    k[3] = -1;
    for (size_t i = 4; i < n; i++)
        k[i] = (int64_t)((uint64_t)i * 0x9e3779b97f4a7c15ull);   /* odd multiplier: a bijection */
    int64_t *s = malloc(n * sizeof *s);
    ck_assert_ptr_nonnull(s);
    for (size_t i = 0; i < n; i++)
        s[i] = k[i];
    qsort(s, n, sizeof *s, test_cmp_i64);
    size_t neg = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            FAIL_IF_NOT(s[i] != s[i - 1], "test keys not distinct");
        neg += s[i] < 0;
    }
    free(s);
    ck_assert_uint_gt(neg, n / 4);
    return k;
}

/* Every (ns, key) with ents[i] != NULL must look up to exactly ents[i];
 * returns how many lookups ran while a rehash was in progress. */
static size_t test_verify(struct kv_index *ix, const int64_t *keys, struct index_entry **ents, size_t nkeys)
{
    size_t during = 0;
    for (size_t i = 0; i < nkeys; i++) {
        for (size_t j = 0; j < TEST_NNS; j++) {
            struct index_entry *want = ents[i * TEST_NNS + j];
            struct index_stats st;
            index_get_stats(ix, &st);
            during += st.rehash_buckets != 0;
            struct index_entry *got = index_lookup(ix, test_ns[j], keys[i]);
            FAIL_IF_NOT(got == want, "lookup ns=%u key=%lld: got %p want %p", (unsigned)test_ns[j],
                        (long long)keys[i], (void *)got, (void *)want);
            if (got)
                FAIL_IF_NOT(got->ns == test_ns[j] && got->key == keys[i], "entry has wrong ns/key");
        }
    }
    return during;
}

START_TEST(test_create_rounding)
{
    struct kv_index *ix = NULL;
    struct index_stats st;
    ck_assert_int_eq(index_create(0, &ix), 0);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.buckets, 64);
    ck_assert_uint_eq(st.entries, 0);
    ck_assert_uint_eq(st.rehash_buckets, 0);
    ck_assert_ptr_null(index_lookup(ix, 0, 0));
    index_destroy(ix);

    ck_assert_int_eq(index_create(1000, &ix), 0);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.buckets, 1024);
    index_destroy(ix);

    ck_assert_int_eq(index_create(4096, &ix), 0);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.buckets, 4096);
    index_destroy(ix);
    index_destroy(NULL);
}
END_TEST

START_TEST(test_insert_lookup_many)
{
    size_t total = test_keys_total();
    size_t nkeys = total / TEST_NNS;
    int64_t *keys = test_make_keys(nkeys);
    struct index_entry **ents = calloc(nkeys * TEST_NNS, sizeof *ents);
    ck_assert_ptr_nonnull(ents);

    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(64, &ix), 0);

    size_t growths = 0, growths_seen_mid = 0, lookups_mid = 0;
    size_t prev_buckets = 64;
    for (size_t i = 0; i < nkeys; i++) {
        for (size_t j = 0; j < TEST_NNS; j++) {
            struct index_stats before, after;
            index_get_stats(ix, &before);
            struct index_entry *e = index_insert(ix, test_ns[j], keys[i]);
            FAIL_IF_NOT(e != NULL, "insert failed");
            FAIL_IF_NOT(e->ns == test_ns[j] && e->key == keys[i], "insert set wrong ns/key");
            FAIL_IF_NOT(e->state == 0 && e->pins == 0 && e->on_lru == 0 && e->lru_stamp == 0 &&
                            e->lru_prev == 0 && e->lru_next == 0 && e->offset == 0,
                        "new entry not zeroed");
            ents[i * TEST_NNS + j] = e;
            index_get_stats(ix, &after);
            FAIL_IF_NOT(after.entries == i * TEST_NNS + j + 1, "count %zu after %zu inserts",
                        after.entries, i * TEST_NNS + j + 1);
            if (before.rehash_buckets == 0 && after.rehash_buckets != 0) {
                /* A growth just started: it doubles and is incremental, so
                 * one insert must not have finished it on a big table. */
                growths++;
                ck_assert_uint_eq(after.rehash_buckets, after.buckets * 2);
                ck_assert_uint_eq(after.buckets, prev_buckets);
                if (after.buckets >= 1024)
                    growths_seen_mid++;
                /* Each lookup migrates a bucket, so this pass runs partly
                 * during the rehash and usually finishes it. */
                lookups_mid += test_verify(ix, keys, ents, i + 1);
            }
            if (after.buckets != prev_buckets) {
                ck_assert_uint_eq(after.buckets, prev_buckets * 2);
                prev_buckets = after.buckets;
                test_verify(ix, keys, ents, i + 1);     /* right after the swap */
            }
        }
    }
    ck_assert_uint_ge(growths, 8);              /* 64 -> >= 16384 buckets */
    ck_assert_uint_ge(growths_seen_mid, 4);
    ck_assert_uint_gt(lookups_mid, 0);          /* some checks really ran mid-rehash */
    ck_assert_uint_eq(index_count(ix), nkeys * TEST_NNS);

    /* Final: every key in every namespace, distinct entries per namespace. */
    test_verify(ix, keys, ents, nkeys);
    for (size_t i = 0; i < nkeys; i++)
        for (size_t j = 1; j < TEST_NNS; j++)
            FAIL_IF_NOT(ents[i * TEST_NNS + j] != ents[i * TEST_NNS], "same key, ns share an entry");

    /* Keys and namespaces never inserted. */
    ck_assert_ptr_null(index_lookup(ix, 2, keys[5]));
    ck_assert_ptr_null(index_lookup(ix, 0, (int64_t)((uint64_t)(nkeys + 10) * 0x9e3779b97f4a7c15ull)));
    ck_assert_ptr_null(index_lookup(ix, 0, -2));

    /* Load factor stays near 1. */
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_le(st.entries, st.buckets * 2);
    ck_assert_uint_ge(st.entries * 2, st.buckets);

    /* Unlink everything in random order, checking the rest stays reachable. */
    size_t n = nkeys * TEST_NNS;
    size_t *order = malloc(n * sizeof *order);
    ck_assert_ptr_nonnull(order);
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    test_shuffle(order, n);
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        struct index_entry *e = ents[i];
        FAIL_IF_NOT(index_lookup(ix, e->ns, e->key) == e, "entry lost before unlink");
        index_unlink(ix, e);
        FAIL_IF_NOT(e->hash_next == 0, "unlinked entry still chained");
        FAIL_IF_NOT(index_lookup(ix, test_ns[i % TEST_NNS], keys[i / TEST_NNS]) == NULL,
                    "unlinked entry still found");
        ents[i] = NULL;
        index_entry_free(ix, e);
        FAIL_IF_NOT(index_count(ix) == n - k - 1, "count after unlink");
        if ((k + 1) % (n / 2) == 0)
            test_verify(ix, keys, ents, nkeys);
    }
    ck_assert_uint_eq(index_count(ix), 0);
    test_verify(ix, keys, ents, nkeys);

    free(order);
    free(ents);
    free(keys);
    index_destroy(ix);
}
END_TEST

/* Unlink while a growth is in progress and check both halves of the table. */
START_TEST(test_unlink_during_rehash)
{
    size_t nkeys = 5000;
    int64_t *keys = test_make_keys(nkeys);
    struct index_entry **ents = calloc(nkeys * TEST_NNS, sizeof *ents);
    ck_assert_ptr_nonnull(ents);
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(16384, &ix), 0);

    /* Fill to just past the growth trigger (load factor 1). */
    size_t inserted = 0;
    struct index_stats st;
    for (size_t i = 0; i < nkeys; i++) {
        for (size_t j = 0; j < TEST_NNS; j++) {
            ents[i * TEST_NNS + j] = index_insert(ix, test_ns[j], keys[i]);
            ck_assert_ptr_nonnull(ents[i * TEST_NNS + j]);
            inserted++;
        }
        index_get_stats(ix, &st);
        if (st.rehash_buckets)
            break;
    }
    ck_assert_uint_eq(st.buckets, 16384);
    ck_assert_uint_eq(st.rehash_buckets, 32768);
    size_t used_keys = inserted / TEST_NNS;

    /* Unlink every other entry; each unlink moves one bucket, so the rehash
     * is still running for most of these. */
    size_t removed = 0, removed_mid = 0;
    for (size_t i = 0; i < inserted; i += 2) {
        index_get_stats(ix, &st);
        removed_mid += st.rehash_buckets != 0;
        index_unlink(ix, ents[i]);
        index_entry_free(ix, ents[i]);
        ents[i] = NULL;
        removed++;
    }
    ck_assert_uint_gt(removed_mid, removed / 2);
    ck_assert_uint_eq(index_count(ix), inserted - removed);
    test_verify(ix, keys, ents, used_keys);
    /* Lookups above may have finished it; verify again after more work. */
    for (size_t i = 0; i < 40000; i++)
        (void)index_lookup(ix, 3, (int64_t)i);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.rehash_buckets, 0);
    ck_assert_uint_eq(st.buckets, 32768);
    test_verify(ix, keys, ents, used_keys);

    /* Double unlink is harmless and does not change the count. */
    struct index_entry *e = ents[1];
    index_unlink(ix, e);
    size_t c = index_count(ix);
    index_unlink(ix, e);
    ck_assert_uint_eq(index_count(ix), c);
    index_entry_free(ix, e);
    ents[1] = NULL;
    test_verify(ix, keys, ents, used_keys);

    /* Re-insert an unlinked key: found again, a new entry. */
    struct index_entry *n = index_insert(ix, test_ns[0], keys[0]);
    ck_assert_ptr_nonnull(n);
    ck_assert_ptr_eq(index_lookup(ix, test_ns[0], keys[0]), n);
    ents[0] = n;
    test_verify(ix, keys, ents, used_keys);

    free(ents);
    free(keys);
    index_destroy(ix);     /* frees the remaining entries (valgrind: no leak) */
}
END_TEST

/* index_destroy in the middle of a growth frees entries in both tables. */
/* One use that is a chain of its own (index_lru_chain_begin): it marks an
 * entry listed in place whatever the use before it did. */
static void test_touch(struct kv_index *ix, struct index_entry *e)
{
    index_lru_chain_begin(ix);
    index_lru_touch(ix, e);
}

START_TEST(test_destroy_mid_rehash)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(1024, &ix), 0);
    struct index_stats st = {0};
    for (int64_t k = 0; k < 1025; k++) {
        struct index_entry *e = index_insert(ix, (uint32_t)(k & 3), -k);
        ck_assert_ptr_nonnull(e);
        e->arena = (uint32_t)(k & 1);
        e->cls = (uint32_t)(k % 5);
        if (k % 3)
            test_touch(ix, e);
    }
    index_get_stats(ix, &st);
    ck_assert_uint_ne(st.rehash_buckets, 0);
    ck_assert_uint_eq(st.entries, 1025);
    ck_assert_uint_eq(st.lru_entries, 1025 - 342);
    index_destroy(ix);
}
END_TEST

static struct index_entry *test_new(struct kv_index *ix, uint32_t ns, int64_t key, uint32_t arena_id, uint32_t cls)
{
    struct index_entry *e = index_insert(ix, ns, key);
    ck_assert_ptr_nonnull(e);
    e->arena = arena_id;
    e->cls = cls;
    return e;
}

/* Pop the oldest of (arena, cls) n times; it must be want[0..n-1]. */
static void test_expect_oldest_order(struct kv_index *ix, uint32_t arena_id, uint32_t cls,
                                     struct index_entry **want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct index_entry *o = index_lru_oldest(ix, arena_id, cls);
        ck_assert_msg(o == want[i], "oldest #%zu: got key %lld, want key %lld", i,
                      o ? (long long)o->key : -999LL, (long long)want[i]->key);
        index_lru_remove(ix, o);
        ck_assert_uint_eq(o->on_lru, 0);
    }
    ck_assert_ptr_null(index_lru_oldest(ix, arena_id, cls));
}

START_TEST(test_lru_chain_leaf_first)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    enum { N = 32 };
    struct index_entry *chain[N], *want[N];
    for (int i = 0; i < N; i++)
        chain[i] = test_new(ix, 5, 1000 + i, 2, 3);     /* chain[0] is the root */

    ck_assert_ptr_null(index_lru_oldest(ix, 2, 3));
    /* Refresh tail-first, as a commit/get does. */
    uint64_t last = 0;
    for (int i = N - 1; i >= 0; i--) {
        test_touch(ix, chain[i]);
        ck_assert_uint_eq(chain[i]->on_lru, 1);
        ck_assert_uint_gt(chain[i]->lru_stamp, last);
        last = chain[i]->lru_stamp;
    }
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.lru_entries, N);
    /* Parents are newer than children. */
    for (int i = 0; i + 1 < N; i++)
        ck_assert_uint_gt(chain[i]->lru_stamp, chain[i + 1]->lru_stamp);
    ck_assert_ptr_eq(index_lru_oldest(ix, 2, 3), chain[N - 1]);
    ck_assert_ptr_eq(index_lru_oldest_in_arena(ix, 2), chain[N - 1]);
    /* Other lists are empty. */
    ck_assert_ptr_null(index_lru_oldest(ix, 2, 4));
    ck_assert_ptr_null(index_lru_oldest(ix, 3, 3));
    ck_assert_ptr_null(index_lru_oldest_in_arena(ix, 0));

    /* Refreshing the chain again (a later hit) keeps the leaf-first order. */
    for (int i = N - 1; i >= 0; i--)
        test_touch(ix, chain[i]);
    for (int i = 0; i < N; i++)
        want[i] = chain[N - 1 - i];
    test_expect_oldest_order(ix, 2, 3, want, N);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.lru_entries, 0);
    index_destroy(ix);
}
END_TEST

/* A chain committed tail-first, then pinned (taken off the orders) and let go
 * in a shuffled order, as a batch's store writes land: each entry comes back
 * at its own stamp's place, so the leaves still leave first. */
START_TEST(test_lru_add_keeps_place_whatever_the_order)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    enum { N = 64 };
    struct index_entry *chain[N], *want[N + 1];
    struct index_entry *other = test_new(ix, 5, 1, 2, 3);
    for (int i = 0; i < N; i++)
        chain[i] = test_new(ix, 5, 1000 + i, 2, 3);
    for (int i = N - 1; i >= 0; i--)
        test_touch(ix, chain[i]);
    uint64_t stamps[N];
    for (int i = 0; i < N; i++) {
        stamps[i] = chain[i]->lru_stamp;
        index_lru_remove(ix, chain[i]);    /* pinned by a write */
    }
    test_touch(ix, other);            /* used meanwhile: newest */
    int order[N];
    for (int i = 0; i < N; i++)
        order[i] = i;
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(test_rand() % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < N; i++) {          /* the root's write lands first */
        if (order[i] == 0) {
            order[i] = order[0];
            order[0] = 0;
            break;
        }
    }
    for (int i = 0; i < N; i++) {
        index_lru_add(ix, chain[order[i]]);
        index_lru_add(ix, chain[order[i]]);   /* listed: no-op */
    }
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(chain[i]->lru_stamp, stamps[i]);   /* no pin drop restamps */
    ck_assert_uint_eq(index_lru_count_in_ns(ix, 5), N + 1);
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 5), chain[N - 1]);
    ck_assert_ptr_eq(index_lru_oldest_in_arena(ix, 2), chain[N - 1]);
    for (int i = 0; i < N; i++)
        want[i] = chain[N - 1 - i];
    want[N] = other;
    test_expect_oldest_order(ix, 2, 3, want, N + 1);
    ck_assert_uint_eq(index_lru_count_in_ns(ix, 5), 0);
    index_destroy(ix);
}
END_TEST

/* index_lru_use on a pinned entry only stamps it; it takes the new place
 * when added back. */
START_TEST(test_lru_use_while_pinned)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    struct index_entry *a = test_new(ix, 1, 1, 0, 0), *b = test_new(ix, 1, 2, 0, 0);
    test_touch(ix, a);
    test_touch(ix, b);
    index_lru_remove(ix, a);
    index_lru_use(ix, a);
    ck_assert_uint_eq(a->on_lru, 0);
    ck_assert_uint_gt(a->lru_stamp, b->lru_stamp);
    index_lru_add(ix, a);
    struct index_entry *want[] = { b, a };
    test_expect_oldest_order(ix, 0, 0, want, 2);
    index_destroy(ix);
}
END_TEST

/* Random touches, uses, removals and adds over two classes and namespaces:
 * every order's oldest is the listed entry of least stamp, and the counts
 * match, at every step (a model of the orders beside the index). */
START_TEST(test_lru_random_against_model)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    enum { N = 300, STEPS = 20000 };
    struct index_entry *e[N];
    for (int i = 0; i < N; i++)
        e[i] = test_new(ix, 1 + (uint32_t)(i % 3), i, 4, (uint32_t)(i % 2));
    for (int s = 0; s < STEPS; s++) {
        struct index_entry *x = e[test_rand() % N];
        switch (test_rand() % 4) {
        case 0: test_touch(ix, x); break;
        case 1: index_lru_use(ix, x); break;
        case 2: index_lru_remove(ix, x); break;
        default: index_lru_add(ix, x); break;
        }
        if (s % 7 == 0) {   /* a class change while unlisted (a demotion) */
            struct index_entry *y = e[test_rand() % N];
            if (!y->on_lru)
                y->cls = (uint32_t)(test_rand() % 2);
        }
        struct index_entry *min_cls[2] = { NULL, NULL }, *min_ns[4] = { NULL }, *min_all = NULL;
        size_t ns_count[4] = { 0 };
        for (int i = 0; i < N; i++) {
            struct index_entry *y = e[i];
            if (!y->on_lru)
                continue;
            if (!min_cls[y->cls] || y->lru_stamp < min_cls[y->cls]->lru_stamp)
                min_cls[y->cls] = y;
            if (!min_ns[y->ns] || y->lru_stamp < min_ns[y->ns]->lru_stamp)
                min_ns[y->ns] = y;
            if (!min_all || y->lru_stamp < min_all->lru_stamp)
                min_all = y;
            ns_count[y->ns]++;
        }
        /* Entries never used share stamp 0: any of them is the oldest. */
        for (uint32_t c = 0; c < 2; c++) {
            struct index_entry *o = index_lru_oldest(ix, 4, c);
            FAIL_IF_NOT(o == min_cls[c] || (o && min_cls[c] && o->on_lru && o->cls == c &&
                                            o->lru_stamp == min_cls[c]->lru_stamp),
                        "step %d: oldest of class %u", s, c);
        }
        for (uint32_t n = 1; n < 4; n++) {
            struct index_entry *o = index_lru_oldest_in_ns(ix, n);
            FAIL_IF_NOT(o == min_ns[n] || (o && min_ns[n] && o->on_lru && o->ns == n &&
                                           o->lru_stamp == min_ns[n]->lru_stamp),
                        "step %d: oldest of ns %u", s, n);
            FAIL_IF_NOT(index_lru_count_in_ns(ix, n) == ns_count[n], "step %d: count of ns %u", s, n);
        }
        struct index_entry *o = index_lru_oldest_in_arena(ix, 4);
        FAIL_IF_NOT(o == min_all || (o && min_all && o->on_lru && o->lru_stamp == min_all->lru_stamp),
                    "step %d: oldest of the arena", s);
    }
    index_destroy(ix);
}
END_TEST

START_TEST(test_lru_retouch_moves_to_tail)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    struct index_entry *a = test_new(ix, 1, 1, 0, 0);
    struct index_entry *b = test_new(ix, 1, 2, 0, 0);
    struct index_entry *c = test_new(ix, 1, 3, 0, 0);
    struct index_entry *d = test_new(ix, 1, 4, 0, 0);
    test_touch(ix, a);
    test_touch(ix, b);
    test_touch(ix, c);
    test_touch(ix, d);
    ck_assert_ptr_eq(index_lru_oldest(ix, 0, 0), a);
    test_touch(ix, a);             /* head -> tail */
    ck_assert_ptr_eq(index_lru_oldest(ix, 0, 0), b);
    test_touch(ix, c);             /* middle -> tail */
    uint64_t s = c->lru_stamp;
    test_touch(ix, c);             /* tail -> tail: restamped */
    ck_assert_uint_gt(c->lru_stamp, s);
    /* A touch rewrote no list: c is still between b and d (marked, it
     * moves when it reaches the oldest end). Order now: b d a c. */
    ck_assert_ptr_eq(index_lru_next(ix, b), c);
    ck_assert_ptr_eq(index_lru_next(ix, c), d);
    ck_assert_uint_eq(c->ref_cls, 1);
    ck_assert_uint_eq(c->ref_ns, 1);
    struct index_entry *want[] = {b, d, a, c};
    test_expect_oldest_order(ix, 0, 0, want, 4);
    index_destroy(ix);
}
END_TEST

START_TEST(test_lru_remove)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    struct index_entry *e[5];
    for (int i = 0; i < 5; i++) {
        e[i] = test_new(ix, 0, i, 1, 7);
        test_touch(ix, e[i]);
    }
    index_lru_remove(ix, e[0]);     /* head */
    ck_assert_uint_eq(e[0]->on_lru, 0);
    ck_assert_ptr_eq(index_lru_oldest(ix, 1, 7), e[1]);
    index_lru_remove(ix, e[2]);     /* middle */
    index_lru_remove(ix, e[4]);     /* tail */
    index_lru_remove(ix, e[4]);     /* not listed: no-op */
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.lru_entries, 2);
    /* The entry stays in the table, just not on the LRU. */
    ck_assert_ptr_eq(index_lookup(ix, 0, 2), e[2]);

    /* Unlink removes from the LRU too. */
    index_unlink(ix, e[1]);
    ck_assert_uint_eq(e[1]->on_lru, 0);
    ck_assert_ptr_eq(index_lru_oldest(ix, 1, 7), e[3]);
    ck_assert_ptr_eq(index_lru_oldest_in_arena(ix, 1), e[3]);
    index_entry_free(ix, e[1]);

    /* Removed entries come back as newest when touched again. */
    test_touch(ix, e[0]);
    struct index_entry *want[] = {e[3], e[0]};
    test_expect_oldest_order(ix, 1, 7, want, 2);
    index_destroy(ix);
}
END_TEST

START_TEST(test_lru_oldest_in_arena)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    const uint32_t classes[] = {0, 5, ARENA_MAX_CLASSES - 1, 17};
    enum { PER = 6, NCLS = 4 };
    struct index_entry *e[NCLS * PER];
    /* Interleave touches over classes so the global order crosses lists;
     * an arena-0 and an arena-7 entry are touched in between as noise. */
    struct index_entry *noise0 = test_new(ix, 9, -1, 0, 5);
    struct index_entry *noise7 = test_new(ix, 9, -2, INDEX_MAX_ARENAS - 1, 5);
    test_touch(ix, noise0);
    for (int k = 0; k < NCLS * PER; k++) {
        uint32_t cls = classes[(k * 7 + k / 3) % NCLS];
        e[k] = test_new(ix, 3, -(int64_t)k - 10, 4, cls);
        test_touch(ix, e[k]);
        if (k == 10)
            test_touch(ix, noise7);
    }
    /* Re-touch two early ones: they become the newest. */
    test_touch(ix, e[0]);
    test_touch(ix, e[2]);
    struct index_entry *want[NCLS * PER];
    int w = 0;
    for (int k = 0; k < NCLS * PER; k++)
        if (k != 0 && k != 2)
            want[w++] = e[k];
    want[w++] = e[0];
    want[w++] = e[2];

    for (int i = 0; i < w; i++) {
        struct index_entry *o = index_lru_oldest_in_arena(ix, 4);
        ck_assert_msg(o == want[i], "step %d: got key %lld want %lld", i,
                      o ? (long long)o->key : -999LL, (long long)want[i]->key);
        ck_assert_ptr_eq(index_lru_oldest(ix, 4, o->cls), o);
        index_lru_remove(ix, o);
    }
    ck_assert_ptr_null(index_lru_oldest_in_arena(ix, 4));
    ck_assert_ptr_eq(index_lru_oldest_in_arena(ix, 0), noise0);
    ck_assert_ptr_eq(index_lru_oldest_in_arena(ix, INDEX_MAX_ARENAS - 1), noise7);
    /* Out of range arena / class: nothing, no crash. */
    ck_assert_ptr_null(index_lru_oldest_in_arena(ix, INDEX_MAX_ARENAS));
    ck_assert_ptr_null(index_lru_oldest(ix, 0, ARENA_MAX_CLASSES));
    index_destroy(ix);
}
END_TEST

/* An entry touched after its arena/class changed (e.g. demoted) moves lists;
 * out-of-range ids are never listed. */
START_TEST(test_lru_class_change)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    struct index_entry *a = test_new(ix, 0, 1, 0, 1);
    struct index_entry *b = test_new(ix, 0, 2, 0, 1);
    test_touch(ix, a);
    test_touch(ix, b);
    a->arena = 1;                       /* a is the head of (0,1) */
    a->cls = 2;
    test_touch(ix, a);
    ck_assert_ptr_eq(index_lru_oldest(ix, 0, 1), b);
    ck_assert_ptr_eq(index_lru_prev(ix, b), NULL);
    ck_assert_ptr_eq(index_lru_oldest(ix, 1, 2), a);
    b->cls = 3;                         /* b is head and tail of (0,1) */
    index_lru_remove(ix, b);
    ck_assert_ptr_null(index_lru_oldest(ix, 0, 1));
    ck_assert_ptr_null(index_lru_oldest(ix, 0, 3));

    struct index_entry *c = test_new(ix, 0, 3, INDEX_MAX_ARENAS, 0);
    test_touch(ix, c);
    ck_assert_uint_eq(c->on_lru, 0);
    ck_assert_uint_ne(c->lru_stamp, 0);
    struct index_entry *d = test_new(ix, 0, 4, 0, ARENA_MAX_CLASSES);
    test_touch(ix, d);
    ck_assert_uint_eq(d->on_lru, 0);
    a->cls = ARENA_MAX_CLASSES + 5;     /* listed entry moved out of range */
    test_touch(ix, a);
    ck_assert_uint_eq(a->on_lru, 0);
    ck_assert_ptr_null(index_lru_oldest(ix, 1, 2));
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.lru_entries, 0);
    index_destroy(ix);
}
END_TEST

/* Many entries over several classes in random touch order: draining by
 * oldest_in_arena yields strictly increasing stamps and every listed entry. */
START_TEST(test_lru_random_drain)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    enum { N = 3000 };
    struct index_entry **e = malloc(N * sizeof *e);
    ck_assert_ptr_nonnull(e);
    for (int i = 0; i < N; i++)
        e[i] = test_new(ix, 0, i, 6, (uint32_t)(test_rand() % ARENA_MAX_CLASSES));
    for (int r = 0; r < 3 * N; r++)
        test_touch(ix, e[test_rand() % N]);
    for (int i = 0; i < N; i += 7)
        index_lru_remove(ix, e[i]);
    size_t listed = 0;
    for (int i = 0; i < N; i++)
        listed += e[i]->on_lru;
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.lru_entries, listed);
    uint64_t last = 0;
    size_t drained = 0;
    struct index_entry *o;
    while ((o = index_lru_oldest_in_arena(ix, 6)) != NULL) {
        FAIL_IF_NOT(o->lru_stamp > last, "stamps not increasing");
        last = o->lru_stamp;
        index_lru_remove(ix, o);
        drained++;
    }
    ck_assert_uint_eq(drained, listed);
    free(e);
    index_destroy(ix);
}
END_TEST

/* Per-namespace lists: the oldest of a namespace over every arena and class,
 * in touch order; namespaces interleaved in time stay separate. */
START_TEST(test_lru_ns_order)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    enum { N = 24 };
    struct index_entry *a[N], *b[N];
    /* Interleave two namespaces over two arenas and several classes. */
    for (int i = 0; i < N; i++) {
        a[i] = test_new(ix, 1, 100 + i, (uint32_t)(i % 2), (uint32_t)(i % 3));
        b[i] = test_new(ix, 2, 100 + i, 0, (uint32_t)(i % 3));     /* same keys, other ns */
    }
    ck_assert_ptr_null(index_lru_oldest_in_ns(ix, 1));
    for (int i = N - 1; i >= 0; i--) {    /* tail-first, alternating */
        test_touch(ix, a[i]);
        test_touch(ix, b[i]);
    }
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 1), a[N - 1]);
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 2), b[N - 1]);
    ck_assert_ptr_null(index_lru_oldest_in_ns(ix, 0));
    ck_assert_ptr_null(index_lru_oldest_in_ns(ix, 3));
    ck_assert_ptr_null(index_lru_oldest_in_ns(ix, INDEX_MAX_NAMESPACES));
    ck_assert_ptr_null(index_lru_oldest_in_ns(ix, UINT32_MAX));
    /* A re-touch makes a leaf the newest of its namespace only. */
    test_touch(ix, a[N - 1]);
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 1), a[N - 2]);
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 2), b[N - 1]);
    /* Drain namespace 1 by its oldest: stamps increase, namespace 2 and the
     * class lists keep exactly namespace 2's entries. */
    uint64_t last = 0;
    size_t drained = 0;
    struct index_entry *o;
    while ((o = index_lru_oldest_in_ns(ix, 1)) != NULL) {
        ck_assert_uint_eq(o->ns, 1);
        ck_assert_uint_gt(o->lru_stamp, last);
        last = o->lru_stamp;
        index_lru_remove(ix, o);
        ck_assert_uint_eq(o->on_lru, 0);
        ck_assert_ptr_null(index_ns_prev(ix, o));
        ck_assert_ptr_null(index_ns_next(ix, o));
        drained++;
    }
    ck_assert_uint_eq(drained, N);
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 1), NULL);
    ck_assert_ptr_null(index_lru_oldest_in_arena(ix, 1));   /* only ns 1 was in arena 1 */
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.lru_entries, N);
    for (int i = N - 1; i >= 0; i--) {
        o = index_lru_oldest_in_ns(ix, 2);
        ck_assert_ptr_eq(o, b[i]);
        ck_assert_ptr_eq(index_lru_oldest_in_arena(ix, 0), b[i]);
        index_lru_remove(ix, o);
    }
    ck_assert_ptr_null(index_lru_oldest_in_ns(ix, 2));
    index_destroy(ix);
}
END_TEST

/* Removal and unlink take an entry off both lists: head, middle, tail. */
START_TEST(test_lru_ns_remove_and_unlink)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    struct index_entry *e[6], *x = test_new(ix, 4, 99, 0, 2);
    for (int i = 0; i < 6; i++) {
        e[i] = test_new(ix, 3, i, 0, (uint32_t)(i % 2));
        test_touch(ix, e[i]);
        if (i == 2)
            test_touch(ix, x);      /* another namespace in between */
    }
    index_lru_remove(ix, e[0]);         /* head of ns 3 and of class 0 */
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 3), e[1]);
    ck_assert_ptr_eq(index_lru_oldest(ix, 0, 0), e[2]);
    index_unlink(ix, e[3]);             /* middle: off both lists and the table */
    ck_assert_uint_eq(e[3]->on_lru, 0);
    ck_assert_ptr_null(index_lookup(ix, 3, 3));
    ck_assert_ptr_eq(index_ns_next(ix, e[2]), e[4]);
    ck_assert_ptr_eq(index_ns_prev(ix, e[4]), e[2]);
    ck_assert_ptr_eq(index_lru_oldest(ix, 0, 1), e[1]);
    ck_assert_ptr_eq(index_lru_next(ix, e[1]), e[5]);
    index_entry_free(ix, e[3]);
    index_unlink(ix, e[5]);             /* tail */
    ck_assert_ptr_null(index_ns_next(ix, e[4]));
    index_entry_free(ix, e[5]);
    /* Touching the ns head moves it to the ns tail (and its class tail). */
    test_touch(ix, e[1]);
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 3), e[2]);
    ck_assert_ptr_null(index_ns_next(ix, e[4]));   /* moved into the heap (order_settle) */
    struct index_entry *want[] = { e[2], e[4], e[1] };
    for (int i = 0; i < 3; i++) {
        struct index_entry *o = index_lru_oldest_in_ns(ix, 3);
        ck_assert_ptr_eq(o, want[i]);
        index_lru_remove(ix, o);
    }
    ck_assert_ptr_null(index_lru_oldest_in_ns(ix, 3));
    ck_assert_ptr_null(index_lru_oldest(ix, 0, 0));
    ck_assert_ptr_null(index_lru_oldest(ix, 0, 1));
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 4), x);
    /* A namespace id beyond the lists' range is on neither list. */
    struct index_entry *far = test_new(ix, INDEX_MAX_NAMESPACES, 1, 0, 0);
    test_touch(ix, far);
    ck_assert_uint_eq(far->on_lru, 0);
    ck_assert_ptr_null(index_lru_oldest(ix, 0, 0));
    /* A large id inside the range grows the heads on demand. */
    ck_assert_int_eq(index_ns_reserve(ix, 8), 0);
    struct index_entry *big = test_new(ix, INDEX_MAX_NAMESPACES - 1, 1, 0, 0);
    test_touch(ix, big);
    ck_assert_uint_eq(big->on_lru, 1);
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, INDEX_MAX_NAMESPACES - 1), big);
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 4), x);     /* survived the move */
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.lru_entries, 2);
    index_destroy(ix);
}
END_TEST

/* Random touches and removals over many namespaces: every namespace list
 * holds exactly the listed entries of that namespace, and drains oldest
 * first (a touch marks an entry in place; its move waits for the oldest end). */
START_TEST(test_lru_ns_random)
{
    struct kv_index *ix = NULL;
    ck_assert_int_eq(index_create(0, &ix), 0);
    enum { N = 2000, NNS = 9 };
    struct index_entry **e = malloc(N * sizeof *e);
    ck_assert_ptr_nonnull(e);
    for (int i = 0; i < N; i++)
        e[i] = test_new(ix, 1 + (uint32_t)(test_rand() % NNS), i, (uint32_t)(test_rand() % 2),
                        (uint32_t)(test_rand() % 4));
    for (int r = 0; r < 4 * N; r++) {
        struct index_entry *t = e[test_rand() % N];
        if (test_rand() % 5 == 0)
            index_lru_remove(ix, t);
        else
            test_touch(ix, t);
    }
    size_t listed = 0;
    for (int i = 0; i < N; i++)
        listed += e[i]->on_lru;
    size_t seen = 0;
    for (uint32_t ns = 1; ns <= NNS; ns++) {
        uint64_t last = 0;
        size_t drained = 0, here = index_lru_count_in_ns(ix, ns);
        for (struct index_entry *o; (o = index_lru_oldest_in_ns(ix, ns)); drained++) {
            FAIL_IF_NOT(o->ns == ns && o->on_lru, "wrong entry on a namespace order");
            FAIL_IF_NOT(o->lru_stamp > last, "namespace order not oldest first");
            last = o->lru_stamp;
            index_lru_remove(ix, o);
        }
        ck_assert_uint_eq(drained, here);
        seen += here;
    }
    ck_assert_uint_eq(seen, listed);
    ck_assert_uint_eq(index_lru_count_in_ns(ix, NNS + 1), 0);
    ck_assert_uint_eq(index_lru_count_in_ns(ix, UINT32_MAX), 0);
    free(e);
    index_destroy(ix);
}
END_TEST


/* A walk opened in the middle of a rehash visits every entry linked for the
 * whole walk exactly once, while inserts and unlinks go on between steps. */
struct walk_seen {
    uint8_t *count;     /* by key, for keys below n */
    size_t n;
};

static void walk_count(void *arg, struct index_entry *e)
{
    struct walk_seen *ws = arg;
    if (e->key >= 0 && (size_t)e->key < ws->n && ws->count[e->key] < 255)
        ws->count[e->key]++;
}

START_TEST(test_walk_during_rehash)
{
    struct kv_index *ix;
    const size_t n = 5000, extra = 20000;
    struct walk_seen ws = { calloc(n + extra, 1), n + extra };
    struct index_walk w;
    struct index_stats st;
    size_t inserted = 0;

    ck_assert_ptr_nonnull(ws.count);
    ck_assert_int_eq(index_create(64, &ix), 0);
    /* Grow until a rehash is in progress. */
    for (size_t k = 0; k < n; k++)
        ck_assert_ptr_nonnull(index_insert(ix, 1, (int64_t)k));
    index_get_stats(ix, &st);
    while (st.rehash_buckets == 0) {
        ck_assert_ptr_nonnull(index_insert(ix, 2, (int64_t)inserted++));
        index_get_stats(ix, &st);
    }
    index_walk_begin(ix, &w);
    size_t buckets_before = st.buckets, added = 0;
    /* Keys of ns 1 below n stay linked for the whole walk, except every
     * tenth, unlinked during it; ns 3 entries come and go. */
    int steps = 0;
    while (index_walk_step(ix, &w, 7, walk_count, &ws)) {
        for (int j = 0; j < 5 && added < extra; j++, added++)
            ck_assert_ptr_nonnull(index_insert(ix, 3, (int64_t)(n + added)));
        if (steps % 3 == 0 && (size_t)(steps / 3) * 10 < n) {
            struct index_entry *e = index_lookup(ix, 1, (int64_t)((steps / 3) * 10));
            if (e) {
                index_unlink(ix, e);
                index_entry_free(ix, e);
            }
        }
        steps++;
    }
    ck_assert_int_gt(steps, 10);
    for (size_t k = 0; k < n; k++) {
        bool unlinked = k % 10 == 0 && k / 10 < (size_t)(steps / 3 + 1);
        if (!unlinked)
            FAIL_IF_NOT(ws.count[k] == 1, "key %zu seen %u times", k, ws.count[k]);
        else
            FAIL_IF_NOT(ws.count[k] <= 1, "unlinked key %zu seen %u times", k, ws.count[k]);
    }
    /* Frozen meanwhile; once closed, the rehash goes on and completes. */
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.buckets, buckets_before);
    for (size_t k = 0; k < 100000 && st.rehash_buckets; k++) {
        index_lookup(ix, 1, 1);
        index_get_stats(ix, &st);
    }
    ck_assert_uint_eq(st.rehash_buckets, 0);
    for (size_t k = 0; k < added; k++)
        FAIL_IF_NOT(index_lookup(ix, 3, (int64_t)(n + k)) != NULL, "ns 3 key %zu lost", k);
    /* An abandoned walk unfreezes too. */
    index_walk_begin(ix, &w);
    index_walk_end(ix, &w);
    index_walk_end(ix, &w);
    index_destroy(ix);
    free(ws.count);
}
END_TEST

/* A freed entry comes back zeroed, and every live entry keeps its fields
 * while thousands of others (several chunks) are made, freed and made
 * again. */
START_TEST(test_entry_reuse)
{
    struct kv_index *ix;
    enum { N = 5000 };
    static struct index_entry *e[N];
    ck_assert_int_eq(index_create(64, &ix), 0);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            e[i] = index_insert(ix, 7, (int64_t)i);
            ck_assert_ptr_nonnull(e[i]);
            ck_assert_int_eq(e[i]->state, 0);
            ck_assert_uint_eq(e[i]->check, 0);
            ck_assert_uint_eq(e[i]->offset, 0);
            ck_assert_ptr_null(index_lru_prev(ix, e[i]));
            e[i]->offset = (uint64_t)i * 4096 + (uint64_t)round;
            e[i]->check = ~(uint64_t)i;
            e[i]->pins = 3;
        }
        for (int i = 0; i < N; i++) {
            ck_assert_ptr_eq(index_lookup(ix, 7, (int64_t)i), e[i]);
            ck_assert_uint_eq(e[i]->offset, (uint64_t)i * 4096 + (uint64_t)round);
            ck_assert_uint_eq(e[i]->check, ~(uint64_t)i);
        }
        for (int i = 0; i < N; i++) {
            index_unlink(ix, e[i]);
            index_entry_free(ix, e[i]);
        }
        ck_assert_uint_eq(index_count(ix), 0);
    }
    index_destroy(ix);
}
END_TEST

/* Issue 32's bound: at 1 M listed blocks the index holds at most 96 bytes
 * per block, counting its entry chunks, buckets, chunk table and orders. */
START_TEST(test_bytes_per_block_at_1m)
{
    enum { N = 1 << 20 };
    struct kv_index *ix;
    ck_assert_int_eq(index_create(0, &ix), 0);
    struct index_stats st0;
    index_get_stats(ix, &st0);
    for (int i = 0; i < N; i++) {
        struct index_entry *e = index_insert(ix, 1 + (uint32_t)(i & 3), (int64_t)i * 0x9e3779b97f4a7c15ll);
        ck_assert_ptr_nonnull(e);
        e->state = ENTRY_SEALED;
        e->arena = 0;
        e->cls = (uint8_t)(i % 3);
        test_touch(ix, e);
    }
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.entries, N);
    ck_assert_uint_eq(st.lru_entries, N);
    double per_block = (double)(st.bytes - st0.bytes) / N;
    printf("index: %.1f B per block at %d blocks (%zu buckets)\n", per_block, N, st.buckets);
    ck_assert_double_le(per_block, 96.0);
    ck_assert_double_ge(per_block, (double)sizeof(struct index_entry));
    /* Every entry still found, and the orders intact (oldest first). */
    for (int i = 0; i < N; i += 4099)
        ck_assert_ptr_nonnull(index_lookup(ix, 1 + (uint32_t)(i & 3), (int64_t)i * 0x9e3779b97f4a7c15ll));
    ck_assert_int_eq((int)index_lru_count_in_ns(ix, 1), N / 4);
    index_destroy(ix);
}
END_TEST

/* After every entry was used (marked in place), index_lru_settle_arena moves
 * at most its budget per call, so the moves take many calls; then the
 * oldest are exactly in the order of the uses. */
START_TEST(test_lru_settle_spreads_the_moves)
{
    enum { N = 100000, BUDGET = 1000 };
    struct kv_index *ix;
    struct index_entry **e = malloc(N * sizeof *e);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(index_create(0, &ix), 0);
    for (int i = 0; i < N; i++) {
        e[i] = test_new(ix, 1, i, 0, (uint32_t)(i % 2));
        test_touch(ix, e[i]);
    }
    for (size_t i = N; i > 1; i--) {
        size_t j = (size_t)(test_rand() % i);
        struct index_entry *t = e[i - 1];
        e[i - 1] = e[j];
        e[j] = t;
    }
    for (int i = 0; i < N; i++)
        test_touch(ix, e[i]);      /* marks, moves nothing */
    int calls = 0;
    while (!index_lru_settle_arena(ix, 0, BUDGET))
        calls++;
    ck_assert_int_ge(calls, N / BUDGET - 1);
    ck_assert(index_lru_settle_arena(ix, 0, BUDGET));
    ck_assert(index_lru_settle_arena(ix, 5, BUDGET));        /* nothing listed there */
    for (int i = 0; i < N; i++) {
        struct index_entry *o = index_lru_oldest_in_arena(ix, 0);
        ck_assert_ptr_eq(o, e[i]);
        index_lru_remove(ix, o);
    }
    ck_assert_ptr_null(index_lru_oldest_in_arena(ix, 0));
    free(e);
    index_destroy(ix);
}
END_TEST

/* An eviction call after more uses than its budget: it moves at most
 * INDEX_OLDEST_SETTLE_BUDGET marked entries (counted in index_stats), takes
 * the oldest of those it moved, and is exact again once the rest settled. */
START_TEST(test_lru_oldest_budget)
{
    enum { N = 20000 };
    struct kv_index *ix;
    struct index_entry **e = malloc(N * sizeof *e);
    struct index_stats st;
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(index_create(0, &ix), 0);
    for (int i = 0; i < N; i++) {
        e[i] = test_new(ix, 1, i, 0, 0);
        test_touch(ix, e[i]);
    }
    for (int i = N; i-- > 0;)
        test_touch(ix, e[i]);           /* all marked, newest first: reversed */
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.settle_moves, 0);
    /* Exact LRU would be e[N - 1], N moves away. */
    struct index_entry *o = index_lru_oldest(ix, 0, 0);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.settle_moves, INDEX_OLDEST_SETTLE_BUDGET);
    ck_assert_uint_eq(st.oldest_moves_max, INDEX_OLDEST_SETTLE_BUDGET);
    ck_assert_uint_eq(st.oldest_forced, 1);
    /* The oldest used of the moved ones: the last of the first BUDGET. */
    ck_assert_ptr_eq(o, e[INDEX_OLDEST_SETTLE_BUDGET - 1]);
    /* The next BUDGET - 1 calls answer from what that sweep moved, with no
     * moves; the one after sweeps the next BUDGET (older ones among them). */
    for (unsigned i = 0; i + 1 < INDEX_OLDEST_SETTLE_BUDGET; i++) {
        struct index_entry *v = index_lru_oldest_in_arena(ix, 0);
        ck_assert_ptr_eq(v, e[INDEX_OLDEST_SETTLE_BUDGET - 1 - i]);
        index_lru_remove(ix, v);
    }
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.settle_moves, INDEX_OLDEST_SETTLE_BUDGET);
    ck_assert_ptr_eq(index_lru_oldest(ix, 0, 0), e[2 * INDEX_OLDEST_SETTLE_BUDGET - 1]);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.settle_moves, 2 * INDEX_OLDEST_SETTLE_BUDGET);
    ck_assert_uint_eq(st.oldest_moves_max, INDEX_OLDEST_SETTLE_BUDGET);
    ck_assert_uint_eq(st.oldest_forced, INDEX_OLDEST_SETTLE_BUDGET + 1);
    /* The namespace's order has a sweep of its own, from e[BUDGET - 1] (the
     * ones before it left both orders): e[BUDGET - 1 .. 2 BUDGET - 2]. */
    ck_assert_ptr_eq(index_lru_oldest_in_ns(ix, 1), e[2 * INDEX_OLDEST_SETTLE_BUDGET - 2]);
    index_get_stats(ix, &st);
    ck_assert_uint_le(st.oldest_moves_max, INDEX_OLDEST_SETTLE_BUDGET);
    /* Settled in the background: exact again, no call forced. */
    while (!index_lru_settle_arena(ix, 0, 4096))
        ;
    index_get_stats(ix, &st);
    size_t forced = st.oldest_forced;
    ck_assert_ptr_eq(index_lru_oldest(ix, 0, 0), e[N - 1]);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.oldest_forced, forced);
    index_destroy(ix);
    free(e);
}
END_TEST

/* Chains (entry i + 1 is entry i's child) refreshed tail-first the way the
 * cache does (prefix MATCHes, read leases that pin a prefix and release it
 * tail-first, re-puts of what went), with long runs of uses between bursts
 * of evictions so that most eviction calls meet more marked entries than
 * their budget: every victim is a chain's last entry present (leaves before
 * roots), whichever of the class and the namespace orders it came from. */
START_TEST(test_lru_bounded_leaves_first)
{
    enum { C = 1000, L = 16, ROUNDS = 30 };
    static struct index_entry *e[C][L];
    static int pinned[C];               /* pinned prefix length, 0: none */
    struct kv_index *ix;
    struct index_stats st;
    ck_assert_int_eq(index_create(0, &ix), 0);
    static int order[C];
    size_t evictions = 0;
    for (int c = 0; c < C; c++)
        order[c] = c;
    for (int r = 0; r < ROUNDS; r++) {
        /* Put back what is missing; the whole chain refreshed tail-first. */
        for (int c = 0; c < C; c++) {
            if (e[c][L - 1])
                continue;
            for (int i = 0; i < L; i++)
                if (!e[c][i])
                    e[c][i] = test_new(ix, 1 + (uint32_t)(c % 3), (int64_t)c * L + i, 0, 0);
            index_lru_chain_begin(ix);
            for (int i = L; i-- > 0;) {
                if (e[c][i]->pins)
                    index_lru_use(ix, e[c][i]);
                else
                    index_lru_touch(ix, e[c][i]);   /* sealed: listed */
            }
        }
        /* Every other round, every chain MATCHed whole in a random order:
         * the runs of marked entries at the oldest ends outgrow the budget. */
        for (int c = C; r % 2 == 0 && c > 1; c--) {
            int j = (int)(test_rand() % (uint64_t)c), t = order[c - 1];
            order[c - 1] = order[j];
            order[j] = t;
        }
        for (int p = 0; r % 2 == 0 && p < C; p++) {
            index_lru_chain_begin(ix);
            for (int i = L; i-- > 0;)
                if (e[order[p]][i])
                    index_lru_use(ix, e[order[p]][i]);
        }
        /* Uses: prefix MATCHes, leases taken and ended. */
        for (int u = 0; u < 3 * C; u++) {
            int c = (int)(test_rand() % C), d = 1 + (int)(test_rand() % L);
            int op = (int)(test_rand() % 8);
            if (op == 0 && !pinned[c]) {
                pinned[c] = d;          /* a read lease on the prefix */
                for (int i = 0; i < d; i++)
                    if (e[c][i] && e[c][i]->pins++ == 0)
                        index_lru_remove(ix, e[c][i]);
            } else if (op == 1 && pinned[c]) {
                index_lru_chain_begin(ix);
                for (int i = pinned[c]; i-- > 0;) {
                    if (!e[c][i])
                        continue;
                    index_lru_use(ix, e[c][i]);
                    if (--e[c][i]->pins == 0)
                        index_lru_add(ix, e[c][i]);
                }
                pinned[c] = 0;
            } else {
                index_lru_chain_begin(ix);
                for (int i = d; i-- > 0;)
                    if (e[c][i])
                        index_lru_use(ix, e[c][i]);
            }
        }
        /* A burst of evictions: by class, by arena or by namespace. */
        for (int v = 0; v < C * L / 8; v++) {
            int how = (int)(test_rand() % 3);
            struct index_entry *o = how == 0 ? index_lru_oldest(ix, 0, 0)
                                  : how == 1 ? index_lru_oldest_in_arena(ix, 0)
                                             : index_lru_oldest_in_ns(ix, 1 + (uint32_t)(test_rand() % 3));
            if (!o)
                continue;
            ck_assert_uint_eq(o->pins, 0);
            int64_t k = o->key;
            int c = (int)(k / L), i = (int)(k % L);
            ck_assert_ptr_eq(e[c][i], o);
            ck_assert_msg(i == L - 1 || !e[c][i + 1], "round %d: key %lld (chain %d, #%d) evicted before its child",
                          r, (long long)k, c, i);
            index_unlink(ix, o);
            index_entry_free(ix, o);
            e[c][i] = NULL;
            evictions++;
        }
    }
    index_get_stats(ix, &st);
    ck_assert_uint_gt(st.oldest_forced, 0);     /* the bound was met */
    ck_assert_uint_le(st.oldest_moves_max, INDEX_OLDEST_SETTLE_BUDGET);
    ck_assert_uint_gt(evictions, (size_t)C * L);
    index_destroy(ix);
}
END_TEST


static Suite *index_suite(void)
{
    Suite *s = suite_create("index");
    TCase *tc = tcase_create("hash");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_create_rounding);
    tcase_add_test(tc, test_insert_lookup_many);
    tcase_add_test(tc, test_unlink_during_rehash);
    tcase_add_test(tc, test_destroy_mid_rehash);
    suite_add_tcase(s, tc);

    tc = tcase_create("lru");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_lru_chain_leaf_first);
    tcase_add_test(tc, test_lru_add_keeps_place_whatever_the_order);
    tcase_add_test(tc, test_lru_use_while_pinned);
    tcase_add_test(tc, test_lru_random_against_model);
    tcase_add_test(tc, test_lru_retouch_moves_to_tail);
    tcase_add_test(tc, test_lru_remove);
    tcase_add_test(tc, test_lru_oldest_in_arena);
    tcase_add_test(tc, test_lru_class_change);
    tcase_add_test(tc, test_lru_random_drain);
    tcase_add_test(tc, test_lru_ns_order);
    tcase_add_test(tc, test_lru_ns_remove_and_unlink);
    tcase_add_test(tc, test_lru_ns_random);
    tcase_add_test(tc, test_walk_during_rehash);
    tcase_add_test(tc, test_entry_reuse);
    tcase_add_test(tc, test_lru_settle_spreads_the_moves);
    tcase_add_test(tc, test_lru_oldest_budget);
    tcase_add_test(tc, test_lru_bounded_leaves_first);
    tcase_add_test(tc, test_bytes_per_block_at_1m);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(index_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
