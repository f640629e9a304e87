/* Unit tests for daemon/core/liveness.c: the worker liveness registry behind the
 * systemd watchdog and /readyz, with real threads that beat and one that
 * stops. Every test unregisters what it registered (CK_FORK=no shares the
 * registry between tests, e.g. under helgrind). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/liveness.h"

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0) {}
}

START_TEST(test_register_check_unregister)
{
    char stalled[128];
    uint64_t t0 = liveness_now_ms();

    ck_assert(liveness_check(t0, 1000, stalled, sizeof stalled));   /* none registered */
    ck_assert_str_eq(stalled, "");
    struct liveness_entry *a = liveness_register("persist");
    struct liveness_entry *b = liveness_register("kvcm");
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_ne(a, b);
    ck_assert(liveness_check(liveness_now_ms(), 1000, stalled, sizeof stalled));
    ck_assert_str_eq(stalled, "");

    /* Seen from 5 s later both are stale, in registration order. */
    ck_assert(!liveness_check(t0 + 5000, 1000, stalled, sizeof stalled));
    ck_assert_str_eq(stalled, "persist, kvcm");

    /* Beating moves a worker's timestamp; the other stays stale. */
    sleep_ms(30);
    liveness_heartbeat(b);
    uint64_t now = liveness_now_ms();
    ck_assert(!liveness_check(now, 20, stalled, sizeof stalled));
    ck_assert_str_eq(stalled, "persist");
    ck_assert(liveness_check(now, 10000, NULL, 0));    /* NULL buffer is fine */

    liveness_unregister(a);
    ck_assert(liveness_check(now, 20, stalled, sizeof stalled));
    ck_assert_str_eq(stalled, "");
    liveness_unregister(b);
    liveness_unregister(NULL);
    liveness_heartbeat(NULL);
    ck_assert_uint_eq(liveness_snapshot(now, NULL, 0), 0);
}
END_TEST

START_TEST(test_names_and_limits)
{
    char small[10];
    struct liveness_entry *w[LIVENESS_MAX];

    ck_assert_ptr_null(liveness_register(NULL));
    ck_assert_ptr_null(liveness_register(""));
    for (size_t i = 0; i < LIVENESS_MAX; i++) {
        char name[LIVENESS_NAME_MAX];
        snprintf(name, sizeof name, "worker-%zu", i);
        w[i] = liveness_register(name);
        ck_assert_ptr_nonnull(w[i]);
    }
    ck_assert_ptr_null(liveness_register("one-too-many"));
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), LIVENESS_MAX);

    /* A short buffer holds a cut, terminated list. */
    ck_assert(!liveness_check(liveness_now_ms() + 60000, 1000, small, sizeof small));
    ck_assert_uint_eq(strlen(small), sizeof small - 1);
    ck_assert(strncmp(small, "worker-0,", 9) == 0);

    for (size_t i = 0; i < LIVENESS_MAX; i++)
        liveness_unregister(w[i]);
    /* Freed slots are reused; long names are cut to LIVENESS_NAME_MAX - 1. */
    struct liveness_entry *l = liveness_register("a-very-long-worker-name-that-does-not-fit-in-the-table");
    ck_assert_ptr_nonnull(l);
    struct liveness_info info[2];
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), info, 2), 1);
    ck_assert_uint_eq(strlen(info[0].name), LIVENESS_NAME_MAX - 1);
    ck_assert(strncmp(info[0].name, "a-very-long-worker-name", 23) == 0);
    ck_assert_uint_lt(info[0].age_ms, 1000);
    liveness_unregister(l);
}
END_TEST

/* --- real threads ---------------------------------------------------------- */

struct beater {
    const char *name;
    struct liveness_entry *w;
    unsigned beats_before_stopping;   /* 0: beat until told to stop */
    atomic_bool *stop;
};

static void *beater_main(void *arg)
{
    struct beater *b = arg;
    b->w = liveness_register(b->name);
    for (unsigned n = 0; !atomic_load(b->stop); n++) {
        if (b->beats_before_stopping && n == b->beats_before_stopping)
            return NULL;          /* "dies" (returns) without unregistering */
        liveness_heartbeat(b->w);
        sleep_ms(5);
    }
    return NULL;
}

START_TEST(test_threads_stalled_worker_detected)
{
    enum { N = 4 };
    atomic_bool stop = false;
    struct beater b[N] = {
        { .name = "persist", .stop = &stop },
        { .name = "kvcm-publish", .stop = &stop },
        { .name = "stuck-writer", .beats_before_stopping = 10, .stop = &stop },
        { .name = "gpu-copy", .stop = &stop },
    };
    pthread_t th[N];
    char stalled[256];

    for (int i = 0; i < N; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, beater_main, &b[i]), 0);
    /* All four register and beat within ~50 ms. */
    uint64_t deadline = liveness_now_ms() + 5000;
    while (liveness_snapshot(liveness_now_ms(), NULL, 0) < N && liveness_now_ms() < deadline)
        sleep_ms(1);
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), N);

    /* The stuck writer stops beating after ~50 ms; the others keep going.
     * Poll: under valgrind a thread may be late, but only the stuck one
     * stays late forever. */
    bool found = false;
    deadline = liveness_now_ms() + 10000;
    while (!found && liveness_now_ms() < deadline) {
        sleep_ms(20);
        if (!liveness_check(liveness_now_ms(), 300, stalled, sizeof stalled) &&
            strcmp(stalled, "stuck-writer") == 0)
            found = true;
    }
    ck_assert_msg(found, "stalled worker not reported alone (last: \"%s\")", stalled);
    ck_assert(pthread_join(th[2], NULL) == 0);   /* it really has returned */

    /* Once the dead worker is unregistered, the live ones pass. */
    liveness_unregister(b[2].w);
    found = false;
    deadline = liveness_now_ms() + 10000;
    while (!found && liveness_now_ms() < deadline) {
        found = liveness_check(liveness_now_ms(), 300, stalled, sizeof stalled);
        sleep_ms(20);
    }
    ck_assert_msg(found, "live workers reported stalled: \"%s\"", stalled);

    struct liveness_info info[N];
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), info, N), N - 1);
    for (int i = 0; i < N - 1; i++)
        ck_assert_str_ne(info[i].name, "stuck-writer");

    atomic_store(&stop, true);
    for (int i = 0; i < N; i++) {
        if (i == 2)
            continue;
        ck_assert(pthread_join(th[i], NULL) == 0);
        liveness_unregister(b[i].w);
    }
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
}
END_TEST

/* Many threads registering, beating and unregistering at once. */
static void *churn_main(void *arg)
{
    char name[LIVENESS_NAME_MAX];
    snprintf(name, sizeof name, "churn-%d", *(int *)arg);
    for (int i = 0; i < 200; i++) {
        struct liveness_entry *w = liveness_register(name);
        if (!w)
            return (void *)1;
        liveness_heartbeat(w);
        liveness_check(liveness_now_ms(), 1000, NULL, 0);
        liveness_unregister(w);
    }
    return NULL;
}

START_TEST(test_threads_register_churn)
{
    enum { N = 8 };
    pthread_t th[N];
    int ids[N];
    for (int i = 0; i < N; i++) {
        ids[i] = i;
        ck_assert_int_eq(pthread_create(&th[i], NULL, churn_main, &ids[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        void *rv;
        ck_assert(pthread_join(th[i], &rv) == 0);
        ck_assert_ptr_null(rv);
    }
    ck_assert_uint_eq(liveness_snapshot(liveness_now_ms(), NULL, 0), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("workers");
    TCase *tc = tcase_create("workers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_register_check_unregister);
    tcase_add_test(tc, test_names_and_limits);
    tcase_add_test(tc, test_threads_stalled_worker_detected);
    tcase_add_test(tc, test_threads_register_churn);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
