/* Unit tests for daemon/mem/index_table.h and the index's use of it:
 * tags that collide, full groups and their chains, deletes inside a group,
 * growth held off by a walk, the pipeline's hints, growth finished by a
 * background caller. */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mem/index.h"
#include "mem/index_table.h"

#define FAIL_IF_NOT(cond, ...)                  \
    do {                                        \
        if (!(cond))                            \
            ck_abort_msg(__VA_ARGS__);          \
    } while (0)

static unsigned popcount(unsigned m)
{
    return (unsigned)__builtin_popcount(m);
}

/* One group, ids whose hashes are equal (same group, same tag). */
START_TEST(test_group_equal_tags)
{
    struct itab t;
    ck_assert_int_eq(itab_init(&t, 4), 0);
    ck_assert_uint_eq((uintptr_t)t.g % 64, 0);
    uint64_t h = (0xabull << 56) | 2;
    struct itab_group *g = itab_home(&t, h);
    ck_assert_ptr_eq(g, &t.g[2]);
    ck_assert_uint_eq(itab_first(&t, h), 0);
    for (uint32_t id = 1; id <= ITAB_SLOTS; id++)
        ck_assert(itab_put(g, h, id));
    ck_assert(!itab_put(g, h, 99));            /* full: the caller chains it */
    ck_assert_uint_eq(popcount(itab_match(g, itab_tag(h))), ITAB_SLOTS);
    ck_assert_uint_eq(itab_match(g, 0), 0);
    ck_assert_uint_eq(itab_first(&t, h), 1);
    /* Delete inside the group: only that id goes, the others keep their slots. */
    ck_assert(itab_take(g, h, 5));
    ck_assert(!itab_take(g, h, 5));
    ck_assert(!itab_take(g, h, 99));
    ck_assert_uint_eq(popcount(itab_match(g, itab_tag(h))), ITAB_SLOTS - 1);
    ck_assert_uint_eq(popcount(itab_match(g, 0)), 1);
    for (uint32_t id = 1; id <= ITAB_SLOTS; id++) {
        bool there = false;
        for (unsigned m = itab_match(g, itab_tag(h)); m; m &= m - 1)
            there |= g->id[__builtin_ctz(m)] == id;
        FAIL_IF_NOT(there == (id != 5), "id %u there %d", id, there);
    }
    ck_assert(itab_put(g, h, 42));             /* the freed slot is taken again */
    ck_assert(!itab_put(g, h, 43));
    /* Another tag in the same group does not match these; tag 0 is never made. */
    ck_assert_uint_eq(itab_match(g, itab_tag(h ^ (1ull << 60))), 0);
    ck_assert_uint_eq(itab_tag(2), 1);
    ck_assert_uint_ne(itab_tag(0), 0);
    /* The other groups stayed empty. */
    ck_assert_uint_eq(itab_match(&t.g[0], 0), ITAB_SLOT_MASK);
    ck_assert_uint_eq(itab_match(&t.g[3], 0), ITAB_SLOT_MASK);
    itab_free(&t);
    itab_free(&t);
}
END_TEST

/* Keys of ns 1 whose hashes in ix (64 buckets: 8 groups) fall in group 0;
 * same_tag: and have the first one's tag too. */
static size_t test_keys_in_group0(struct kv_index *ix, int64_t *out, size_t want, bool same_tag)
{
    size_t n = 0;
    uint8_t tag = 0;
    for (int64_t k = 1; n < want && k < 50000000; k++) {
        uint64_t h = index_key_hash(ix, 1, k);
        if ((h & 7) != 0)
            continue;
        if (same_tag && n > 0 && itab_tag(h) != tag)
            continue;
        tag = itab_tag(h);
        out[n++] = k;
    }
    return n;
}

static void test_all_found(struct kv_index *ix, const int64_t *keys, struct index_entry **e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct index_entry *got = index_lookup(ix, 1, keys[i]);
        FAIL_IF_NOT(got == e[i], "key %zu (%lld): got %p want %p", i, (long long)keys[i], (void *)got,
                    (void *)e[i]);
    }
}

/* Entries whose hashes share group and tag: each is found (a tag match is
 * only a candidate), a delete among them takes only its own. */
START_TEST(test_index_equal_tags)
{
    struct kv_index *ix;
    ck_assert_int_eq(index_create(64, &ix), 0);
    int64_t keys[4];
    struct index_entry *e[4];
    ck_assert_uint_eq(test_keys_in_group0(ix, keys, 4, true), 4);
    for (int i = 0; i < 4; i++)
        ck_assert_ptr_nonnull(e[i] = index_insert(ix, 1, keys[i]));
    test_all_found(ix, keys, e, 4);
    ck_assert_ptr_null(index_lookup(ix, 2, keys[0]));   /* same key, other ns */
    index_unlink(ix, e[1]);
    ck_assert_uint_eq(e[1]->hash_next, 0);
    index_entry_free(ix, e[1]);
    e[1] = NULL;
    test_all_found(ix, keys, e, 4);
    ck_assert_uint_eq(index_count(ix), 3);
    ck_assert_ptr_nonnull(e[1] = index_insert(ix, 1, keys[1]));
    test_all_found(ix, keys, e, 4);
    index_destroy(ix);
}
END_TEST

struct seen {
    const int64_t *keys;
    size_t n;
    unsigned *count;
};

static void test_count_seen(void *arg, struct index_entry *e)
{
    struct seen *s = arg;
    for (size_t i = 0; i < s->n; i++)
        if (s->keys[i] == e->key && e->ns == 1)
            s->count[i]++;
}

/* More keys in one group than it has slots: the rest are chained; every
 * one is found, walked once, and deletes in any order (slot or chain)
 * leave the others found. */
START_TEST(test_index_full_group_chain)
{
    enum { N = 40 };   /* < 64 buckets: no growth */
    struct kv_index *ix;
    ck_assert_int_eq(index_create(64, &ix), 0);
    int64_t keys[N];
    struct index_entry *e[N];
    unsigned count[N] = {0};
    ck_assert_uint_eq(test_keys_in_group0(ix, keys, N, false), N);
    for (int i = 0; i < N; i++)
        ck_assert_ptr_nonnull(e[i] = index_insert(ix, 1, keys[i]));
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.buckets, 64);
    ck_assert_uint_eq(st.rehash_buckets, 0);
    test_all_found(ix, keys, e, N);

    struct seen s = { keys, N, count };
    struct index_walk w;
    index_walk_begin(ix, &w);
    while (index_walk_step(ix, &w, 1, test_count_seen, &s))
        ;
    for (int i = 0; i < N; i++)
        FAIL_IF_NOT(count[i] == 1, "key %d walked %u times", i, count[i]);

    /* Unlink a chained one, a slot one, the chain's head, ... in a fixed shuffle. */
    static const int order[N] = {39, 0, 20, 5, 38, 11, 12, 1, 30, 2, 25, 3, 37, 4, 21, 6, 36, 7, 22, 8,
                                 35, 9, 23, 10, 34, 13, 24, 14, 33, 15, 26, 16, 32, 17, 27, 18, 31, 19, 28, 29};
    for (int k = 0; k < N; k++) {
        int i = order[k];
        index_unlink(ix, e[i]);
        FAIL_IF_NOT(e[i]->hash_next == 0, "unlinked entry %d still chained", i);
        index_entry_free(ix, e[i]);
        e[i] = NULL;
        test_all_found(ix, keys, e, N);
        if (k == N / 2) {   /* half of them back, into free slots or the chain */
            for (int j = 0; j < N; j++)
                if (!e[j])
                    ck_assert_ptr_nonnull(e[j] = index_insert(ix, 1, keys[j]));
            test_all_found(ix, keys, e, N);
            for (int j = 0; j <= k; j++) {
                index_unlink(ix, e[order[j]]);
                index_entry_free(ix, e[order[j]]);
                e[order[j]] = NULL;
            }
            test_all_found(ix, keys, e, N);
        }
    }
    ck_assert_uint_eq(index_count(ix), 0);
    index_destroy(ix);
}
END_TEST

/* An open walk holds growth off: inserts far past the table's slots go to
 * the groups' chains, all found, the walk sees each entry linked for the
 * whole walk once; closed, the index grows and rehashes again. */
START_TEST(test_index_growth_held_by_walk)
{
    enum { BEFORE = 60, DURING = 3000 };
    struct kv_index *ix;
    ck_assert_int_eq(index_create(64, &ix), 0);
    int64_t *keys = malloc((BEFORE + DURING) * sizeof *keys);
    struct index_entry **e = malloc((BEFORE + DURING) * sizeof *e);
    unsigned *count = calloc(BEFORE + DURING, sizeof *count);
    ck_assert(keys && e && count);
    for (int i = 0; i < BEFORE + DURING; i++)
        keys[i] = (int64_t)(i + 1) * 7919;
    for (int i = 0; i < BEFORE; i++)
        ck_assert_ptr_nonnull(e[i] = index_insert(ix, 1, keys[i]));
    struct seen s = { keys, BEFORE, count };
    struct index_walk w;
    index_walk_begin(ix, &w);
    bool more = index_walk_step(ix, &w, 8, test_count_seen, &s);
    for (int i = BEFORE; i < BEFORE + DURING; i++) {
        ck_assert_ptr_nonnull(e[i] = index_insert(ix, 1, keys[i]));
        if (i % 500 == 0 && more)
            more = index_walk_step(ix, &w, 8, test_count_seen, &s);
    }
    struct index_stats st;
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.buckets, 64);
    ck_assert_uint_eq(st.rehash_buckets, 0);
    test_all_found(ix, keys, e, BEFORE + DURING);
    while (more)
        more = index_walk_step(ix, &w, 8, test_count_seen, &s);
    for (int i = 0; i < BEFORE; i++)
        FAIL_IF_NOT(count[i] == 1, "key %d walked %u times", i, count[i]);

    /* Closed: the next insert starts a growth, lookups finish it (and the ones after). */
    int64_t extra = -1;
    struct index_entry *x = index_insert(ix, 1, extra);
    ck_assert_ptr_nonnull(x);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.rehash_buckets, 128);
    for (int r = 0; r < 20 && (st.rehash_buckets || st.entries > st.buckets); r++) {
        test_all_found(ix, keys, e, BEFORE + DURING);
        ck_assert_ptr_eq(index_lookup(ix, 1, extra), x);
        index_insert(ix, 2, (int64_t)r);   /* an insert starts the next growth */
        index_get_stats(ix, &st);
    }
    ck_assert_uint_ge(st.buckets, BEFORE + DURING);
    test_all_found(ix, keys, e, BEFORE + DURING);
    free(keys);
    free(e);
    free(count);
    index_destroy(ix);
}
END_TEST

/* The pipeline's hint is the key's own entry but for a stranger's tag
 * met first, in a table at rest and in the middle of a growth. */
START_TEST(test_prefetch_hints)
{
    enum { N = 5000 };
    struct kv_index *ix;
    ck_assert_int_eq(index_create(64, &ix), 0);
    ck_assert_uint_eq(index_prefetch_first(ix, index_key_hash(ix, 1, 5)), 0);   /* empty index */
    static struct index_entry *e[N];
    for (int i = 0; i < N; i++)
        ck_assert_ptr_nonnull(e[i] = index_insert(ix, 1, (int64_t)i * 31 + 3));
    for (int pass = 0; pass < 2; pass++) {
        struct index_stats st;
        index_get_stats(ix, &st);
        size_t own = 0;
        for (int i = 0; i < N; i++) {
            uint64_t h = index_key_hash(ix, 1, (int64_t)i * 31 + 3);
            index_prefetch_bucket(ix, h);
            own += index_prefetch_first(ix, h) == e[i]->id;
            FAIL_IF_NOT(index_lookup_hashed(ix, 1, (int64_t)i * 31 + 3, h) == e[i], "key %d lost", i);
        }
        ck_assert_uint_ge(own, N * 9 / 10);
        if (pass == 0) {   /* grow: insert until a rehash runs */
            int64_t k = -1;
            do {
                ck_assert_ptr_nonnull(index_insert(ix, 2, k--));
                index_get_stats(ix, &st);
            } while (!st.rehash_buckets);
        }
    }
    index_destroy(ix);
}
END_TEST

/* A background caller finishes a growth in O(buckets) steps of its own
 * (index_grow_step), none while a walk is open; every entry stays found. */
START_TEST(test_grow_step_finishes_growth)
{
    enum { STEP = 64 };
    struct kv_index *ix;
    ck_assert_int_eq(index_create(1024, &ix), 0);
    ck_assert(index_grow_step(ix, STEP));      /* nothing to do */
    struct index_stats st;
    size_t n = 0;
    do {
        ck_assert_ptr_nonnull(index_insert(ix, 1, (int64_t)n++ * 131));
        index_get_stats(ix, &st);
    } while (!st.rehash_buckets);
    ck_assert_uint_eq(st.buckets, 1024);
    struct index_walk w;
    index_walk_begin(ix, &w);
    for (int i = 0; i < 100; i++)
        ck_assert(!index_grow_step(ix, STEP));
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.rehash_buckets, 2048);
    index_walk_end(ix, &w);
    size_t steps = 1;
    while (!index_grow_step(ix, STEP))
        steps++;
    ck_assert_uint_le(steps, 1024 / STEP + 1);
    index_get_stats(ix, &st);
    ck_assert_uint_eq(st.buckets, 2048);
    ck_assert_uint_eq(st.rehash_buckets, 0);
    for (size_t k = 0; k < n; k++)
        FAIL_IF_NOT(index_lookup(ix, 1, (int64_t)k * 131) != NULL, "key %zu lost", k);
    index_destroy(ix);
}
END_TEST

static Suite *index_table_suite(void)
{
    Suite *s = suite_create("index_table");
    TCase *tc = tcase_create("groups");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_group_equal_tags);
    tcase_add_test(tc, test_index_equal_tags);
    tcase_add_test(tc, test_index_full_group_chain);
    tcase_add_test(tc, test_index_growth_held_by_walk);
    tcase_add_test(tc, test_prefetch_hints);
    tcase_add_test(tc, test_grow_step_finishes_growth);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(index_table_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
