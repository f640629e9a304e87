/* Unit tests for daemon/mem/lease.c: ids, id lookup, expiry heap, owner lists,
 * counts. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "mem/lease.h"

/* Fail only when cond is false (cheap in big loops, unlike ck_assert). */
#define FAIL_IF_NOT(cond, ...)                  \
    do {                                        \
        if (!(cond))                            \
            ck_abort_msg(__VA_ARGS__);          \
    } while (0)

static uint64_t test_rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t test_rand(void)
{
    uint64_t x = test_rng_state;     /* xorshift64: deterministic */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    test_rng_state = x;
    return x;
}

static void test_shuffle(struct lease **a, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(test_rand() % i);
        struct lease *t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static int test_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Take every expired lease at now_ms in heap order, checking expiry never
 * goes down; returns how many were drained. */
static size_t test_drain(struct lease_table *t, uint64_t now_ms)
{
    size_t n = 0;
    uint64_t last = 0;
    struct lease *l;
    while ((l = lease_first_expired(t, now_ms)) != NULL) {
        FAIL_IF_NOT(l->expires_ms <= now_ms, "returned an unexpired lease");
        FAIL_IF_NOT(l->expires_ms >= last, "expiry order broken: %llu after %llu",
                    (unsigned long long)l->expires_ms, (unsigned long long)last);
        last = l->expires_ms;
        lease_destroy(t, l);
        n++;
    }
    return n;
}

START_TEST(test_create_fields)
{
    struct lease_table *t = NULL;
    ck_assert_int_eq(lease_table_create(&t), 0);
    ck_assert_uint_eq(lease_count(t, 0), 0);
    ck_assert_ptr_null(lease_first_expired(t, UINT64_MAX));

    struct lease_list owner = {0};
    struct lease *l = lease_create(t, LEASE_WRITE, 42, &owner, 1000, 250, 5);
    ck_assert_ptr_nonnull(l);
    ck_assert_uint_ne(l->id, 0);
    ck_assert_int_eq(l->kind, LEASE_WRITE);
    ck_assert_uint_eq(l->ns, 42);
    ck_assert_uint_eq(l->created_ms, 1000);
    ck_assert_uint_eq(l->expires_ms, 1250);
    ck_assert_uint_eq(l->n, 5);
    ck_assert_ptr_nonnull(l->entries);
    for (size_t i = 0; i < 5; i++)
        ck_assert_ptr_null(l->entries[i]);
    l->entries[4] = (struct index_entry *)&owner;   /* writable, any pointer */
    ck_assert_ptr_eq(owner.head, l);
    ck_assert_uint_eq(owner.count, 1);

    /* n == 0 and no owner (internal lease). */
    struct lease *z = lease_create(t, LEASE_READ, 0, NULL, 0, 10, 0);
    ck_assert_ptr_nonnull(z);
    ck_assert_uint_eq(z->n, 0);
    ck_assert_uint_eq(owner.count, 1);

    /* TTL saturates instead of wrapping into the past. */
    struct lease *s = lease_create(t, LEASE_READ, 0, NULL, 100, UINT64_MAX, 1);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(s->expires_ms, UINT64_MAX);

    /* Invalid kinds are refused. */
    ck_assert_ptr_null(lease_create(t, 0, 0, &owner, 0, 1, 0));
    ck_assert_ptr_null(lease_create(t, 3, 0, &owner, 0, 1, 0));
    ck_assert_uint_eq(lease_count(t, 0), 3);
    ck_assert_uint_eq(owner.count, 1);

    /* Expiry boundary: due exactly at expires_ms, not a ms before. */
    ck_assert_ptr_null(lease_first_expired(t, 9));
    ck_assert_ptr_eq(lease_first_expired(t, 10), z);
    lease_destroy(t, z);
    ck_assert_ptr_null(lease_first_expired(t, 1249));
    ck_assert_ptr_eq(lease_first_expired(t, 1250), l);
    lease_destroy(t, l);
    ck_assert_ptr_null(owner.head);
    ck_assert_uint_eq(owner.count, 0);
    ck_assert_ptr_null(lease_first_expired(t, UINT64_MAX - 1));
    ck_assert_ptr_eq(lease_first_expired(t, UINT64_MAX), s);
    lease_table_destroy(t);     /* s still live: freed here (valgrind) */
    lease_table_destroy(NULL);
}
END_TEST

START_TEST(test_expiry_order)
{
    struct lease_table *t = NULL;
    ck_assert_int_eq(lease_table_create(&t), 0);
    enum { N = 20000 };
    uint64_t now = 5000, maxexp = 0;
    for (size_t i = 0; i < N; i++) {
        uint64_t ttl = test_rand() % 100000;     /* duplicates included */
        struct lease *l = lease_create(t, (i & 1) ? LEASE_READ : LEASE_WRITE, 1, NULL, now, ttl, i % 3);
        FAIL_IF_NOT(l != NULL, "create failed");
        if (l->expires_ms > maxexp)
            maxexp = l->expires_ms;
        now += test_rand() % 3;                  /* creation times move too */
    }
    ck_assert_uint_eq(lease_count(t, 0), N);
    /* Reap in steps as a timer would: nothing beyond the step is returned. */
    size_t drained = 0;
    for (uint64_t step = 5000; step <= maxexp + 10000; step += 10000)
        drained += test_drain(t, step);
    ck_assert_uint_eq(drained, N);
    ck_assert_uint_eq(lease_count(t, 0), 0);
    ck_assert_ptr_null(lease_first_expired(t, UINT64_MAX));
    lease_table_destroy(t);
}
END_TEST

/* Random destroys from the middle of the heap keep it valid. */
START_TEST(test_destroy_middle)
{
    struct lease_table *t = NULL;
    ck_assert_int_eq(lease_table_create(&t), 0);
    enum { N = 20000 };
    struct lease **ls = malloc(N * sizeof *ls);
    uint64_t *ids = malloc(N * sizeof *ids);
    ck_assert_ptr_nonnull(ls);
    ck_assert_ptr_nonnull(ids);
    for (size_t i = 0; i < N; i++) {
        ls[i] = lease_create(t, LEASE_READ, 0, NULL, 0, 1 + test_rand() % 50000, 1);
        FAIL_IF_NOT(ls[i] != NULL, "create failed");
    }
    test_shuffle(ls, N);
    /* Destroy 60% in random order, interleaved with new short and long leases. */
    size_t live = N, extra = 0;
    for (size_t i = 0; i < N * 6 / 10; i++) {
        lease_destroy(t, ls[i]);
        ls[i] = NULL;
        live--;
        if (i % 10 == 0) {
            FAIL_IF_NOT(lease_create(t, LEASE_WRITE, 0, NULL, 0, test_rand() % 60000, 0) != NULL,
                        "create failed");
            extra++;
        }
    }
    ck_assert_uint_eq(lease_count(t, 0), live + extra);
    ck_assert_uint_eq(lease_count(t, LEASE_READ), live);
    ck_assert_uint_eq(lease_count(t, LEASE_WRITE), extra);
    /* Survivors are still findable; remember their ids. */
    size_t k = 0;
    for (size_t i = N * 6 / 10; i < N; i++) {
        FAIL_IF_NOT(lease_find(t, ls[i]->id) == ls[i], "survivor not found");
        ids[k++] = ls[i]->id;
    }
    /* Drain: sorted, and exactly the survivors plus the extras. */
    size_t drained = 0, survivors_seen = 0;
    uint64_t last = 0;
    struct lease *l;
    qsort(ids, k, sizeof *ids, test_cmp_u64);
    while ((l = lease_first_expired(t, UINT64_MAX)) != NULL) {
        FAIL_IF_NOT(l->expires_ms >= last, "expiry order broken after middle destroys");
        last = l->expires_ms;
        if (bsearch(&l->id, ids, k, sizeof *ids, test_cmp_u64))
            survivors_seen++;
        lease_destroy(t, l);
        drained++;
    }
    ck_assert_uint_eq(drained, live + extra);
    ck_assert_uint_eq(survivors_seen, live);
    free(ids);
    free(ls);
    lease_table_destroy(t);
}
END_TEST

START_TEST(test_ids_find)
{
    struct lease_table *t = NULL;
    ck_assert_int_eq(lease_table_create(&t), 0);
    enum { N = 50000 };
    struct lease **ls = malloc(N * sizeof *ls);
    uint64_t *ids = malloc(N * sizeof *ids);
    ck_assert_ptr_nonnull(ls);
    ck_assert_ptr_nonnull(ids);
    for (size_t i = 0; i < N; i++) {
        ls[i] = lease_create(t, LEASE_READ, (uint32_t)i, NULL, 0, 1000, 0);
        FAIL_IF_NOT(ls[i] != NULL, "create failed");
        FAIL_IF_NOT(ls[i]->id != 0, "id 0");
        ids[i] = ls[i]->id;
        /* Find works while the id table is growing. */
        FAIL_IF_NOT(lease_find(t, ids[i / 2]) == ls[i / 2], "find during growth");
    }
    /* Every id findable (the table grew several times). */
    for (size_t i = 0; i < N; i++)
        FAIL_IF_NOT(lease_find(t, ids[i]) == ls[i], "find id %zu", i);
    ck_assert_ptr_null(lease_find(t, 0));
    qsort(ids, N, sizeof *ids, test_cmp_u64);
    for (size_t i = 1; i < N; i++)
        FAIL_IF_NOT(ids[i] != ids[i - 1], "duplicate lease id");
    /* An id no lease has. */
    uint64_t absent = ids[N - 1] + 1;
    while (bsearch(&absent, ids, N, sizeof *ids, test_cmp_u64))
        absent++;
    ck_assert_ptr_null(lease_find(t, absent));
    ck_assert_ptr_null(lease_find(t, ~ids[0]));

    /* Destroyed ids are gone; the others stay. */
    for (size_t i = 0; i < N; i += 3) {
        uint64_t id = ls[i]->id;
        lease_destroy(t, ls[i]);
        ls[i] = NULL;
        FAIL_IF_NOT(lease_find(t, id) == NULL, "destroyed id still found");
    }
    for (size_t i = 0; i < N; i++)
        if (ls[i])
            FAIL_IF_NOT(lease_find(t, ls[i]->id) == ls[i], "survivor lost");
    /* New leases never reuse a live id. */
    for (size_t i = 0; i < 1000; i++) {
        struct lease *n = lease_create(t, LEASE_WRITE, 0, NULL, 0, 1, 0);
        ck_assert_ptr_nonnull(n);
        FAIL_IF_NOT(lease_find(t, n->id) == n, "new id collides");
    }
    free(ids);
    free(ls);
    lease_table_destroy(t);
}
END_TEST

/* Two tables draw different random high halves. */
START_TEST(test_ids_random_per_table)
{
    struct lease_table *a = NULL, *b = NULL;
    ck_assert_int_eq(lease_table_create(&a), 0);
    ck_assert_int_eq(lease_table_create(&b), 0);
    struct lease *la = lease_create(a, LEASE_READ, 0, NULL, 0, 1, 0);
    struct lease *lb = lease_create(b, LEASE_READ, 0, NULL, 0, 1, 0);
    ck_assert_ptr_nonnull(la);
    ck_assert_ptr_nonnull(lb);
    /* 1 in 2^32 chance of a false failure with getrandom. */
    ck_assert_uint_ne(la->id >> 32, lb->id >> 32);
    struct lease *la2 = lease_create(a, LEASE_READ, 0, NULL, 0, 1, 0);
    ck_assert_ptr_nonnull(la2);
    ck_assert_uint_eq(la2->id >> 32, la->id >> 32);
    ck_assert_uint_ne(la2->id, la->id);
    lease_table_destroy(a);
    lease_table_destroy(b);
}
END_TEST

/* Walk an owner's list: every lease once, count matches, links consistent. */
static size_t test_walk_owner(struct lease_list *o, struct lease **want, size_t nwant)
{
    size_t n = 0;
    struct lease *prev = NULL;
    for (struct lease *l = o->head; l; l = l->owner_next) {
        FAIL_IF_NOT(l->owner == o, "lease in wrong owner's list");
        FAIL_IF_NOT(l->owner_prev == prev, "owner_prev broken");
        int found = 0;
        for (size_t i = 0; i < nwant; i++)
            found += want[i] == l;
        FAIL_IF_NOT(found == 1, "unexpected lease in owner list");
        prev = l;
        n++;
        FAIL_IF_NOT(n <= nwant, "owner list too long (loop?)");
    }
    return n;
}

START_TEST(test_owner_lists)
{
    struct lease_table *t = NULL;
    ck_assert_int_eq(lease_table_create(&t), 0);
    struct lease_list a = {0}, b = {0};
    enum { NA = 50, NB = 30, NI = 7 };
    struct lease *la[NA], *lb[NB], *li[NI];
    for (int i = 0; i < NA; i++)
        ck_assert_ptr_nonnull(la[i] = lease_create(t, i % 4 ? LEASE_READ : LEASE_WRITE, 1, &a,
                                                   0, 100 + (uint64_t)i, 1));
    for (int i = 0; i < NB; i++)
        ck_assert_ptr_nonnull(lb[i] = lease_create(t, LEASE_READ, 2, &b, 0, 50 + (uint64_t)i, 2));
    for (int i = 0; i < NI; i++)
        ck_assert_ptr_nonnull(li[i] = lease_create(t, LEASE_READ, 3, NULL, 0, 10, 0));
    ck_assert_uint_eq(a.count, NA);
    ck_assert_uint_eq(b.count, NB);
    ck_assert_uint_eq(test_walk_owner(&a, la, NA), NA);
    ck_assert_uint_eq(test_walk_owner(&b, lb, NB), NB);

    /* Destroy from head, middle and tail of a's list. */
    struct lease *head = a.head, *tail = a.head, *mid = a.head->owner_next->owner_next;
    while (tail->owner_next)
        tail = tail->owner_next;
    struct lease *gone[] = {head, mid, tail};
    for (int g = 0; g < 3; g++) {
        lease_destroy(t, gone[g]);
        for (int i = 0; i < NA; i++)
            if (la[i] == gone[g])
                la[i] = NULL;
    }
    ck_assert_uint_eq(a.count, NA - 3);
    struct lease *rest[NA];
    size_t nrest = 0;
    for (int i = 0; i < NA; i++)
        if (la[i])
            rest[nrest++] = la[i];
    ck_assert_uint_eq(test_walk_owner(&a, rest, nrest), NA - 3);
    ck_assert_uint_eq(test_walk_owner(&b, lb, NB), NB);

    /* A connection closing: destroy everything it owns through its head. */
    size_t writes_in_a = 0, nids = 0;
    uint64_t a_ids[NA];
    for (struct lease *l = a.head; l; l = l->owner_next) {
        writes_in_a += l->kind == LEASE_WRITE;
        a_ids[nids++] = l->id;
    }
    size_t total_before = lease_count(t, 0), writes_before = lease_count(t, LEASE_WRITE);
    while (a.head)
        lease_destroy(t, a.head);
    ck_assert_uint_eq(a.count, 0);
    ck_assert_uint_eq(lease_count(t, 0), total_before - (NA - 3));
    ck_assert_uint_eq(lease_count(t, LEASE_WRITE), writes_before - writes_in_a);
    ck_assert_uint_eq(lease_count(t, LEASE_WRITE), 0);
    ck_assert_uint_eq(nids, NA - 3);
    for (size_t i = 0; i < nids; i++)
        ck_assert_ptr_null(lease_find(t, a_ids[i]));
    /* b and the internal leases are untouched, and still expire in order. */
    ck_assert_uint_eq(test_walk_owner(&b, lb, NB), NB);
    for (int i = 0; i < NB; i++)
        ck_assert_ptr_eq(lease_find(t, lb[i]->id), lb[i]);
    for (int i = 0; i < NI; i++)
        ck_assert_ptr_eq(lease_find(t, li[i]->id), li[i]);
    ck_assert_uint_eq(test_drain(t, 10), NI);
    ck_assert_uint_eq(b.count, NB);
    ck_assert_uint_eq(test_drain(t, 1000), NB);
    ck_assert_uint_eq(b.count, 0);
    ck_assert_ptr_null(b.head);
    lease_table_destroy(t);
}
END_TEST

START_TEST(test_counts_by_kind)
{
    struct lease_table *t = NULL;
    ck_assert_int_eq(lease_table_create(&t), 0);
    struct lease_list o = {0};
    struct lease *r[10], *w[4];
    for (int i = 0; i < 10; i++)
        ck_assert_ptr_nonnull(r[i] = lease_create(t, LEASE_READ, 0, &o, 0, 5, 0));
    for (int i = 0; i < 4; i++)
        ck_assert_ptr_nonnull(w[i] = lease_create(t, LEASE_WRITE, 0, NULL, 0, 5, 3));
    ck_assert_uint_eq(lease_count(t, 0), 14);
    ck_assert_uint_eq(lease_count(t, LEASE_READ), 10);
    ck_assert_uint_eq(lease_count(t, LEASE_WRITE), 4);
    ck_assert_uint_eq(lease_count(t, 99), 0);
    ck_assert_uint_eq(lease_count(t, -1), 0);
    lease_destroy(t, r[3]);
    lease_destroy(t, w[0]);
    lease_destroy(t, w[2]);
    ck_assert_uint_eq(lease_count(t, 0), 11);
    ck_assert_uint_eq(lease_count(t, LEASE_READ), 9);
    ck_assert_uint_eq(lease_count(t, LEASE_WRITE), 2);
    ck_assert_uint_eq(o.count, 9);
    lease_table_destroy(t);     /* remaining leases freed here */
}
END_TEST

static Suite *lease_suite(void)
{
    Suite *s = suite_create("lease");
    TCase *tc = tcase_create("lease");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_create_fields);
    tcase_add_test(tc, test_expiry_order);
    tcase_add_test(tc, test_destroy_middle);
    tcase_add_test(tc, test_ids_find);
    tcase_add_test(tc, test_ids_random_per_table);
    tcase_add_test(tc, test_owner_lists);
    tcase_add_test(tc, test_counts_by_kind);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(lease_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
