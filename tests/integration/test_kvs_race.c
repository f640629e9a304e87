/* Integration tests of the KVS front end (issue 30): a create racing an
 * unsealed create of the same keys is never told they exist (item 2), and a
 * /seal after the lease's term answers 410, not 404.
 *
 * Writer A opens a create lease on keys K and does not seal it; writer B
 * (another thread, rtp-llm's store() sequence) creates K. Whatever B is told
 * is stored must read back: objects B's reply leaves out are A's sealed
 * bytes, objects it returns are B's once B sealed. Every wait is bounded;
 * assertions are on statuses, counters and bytes. The daemon runs with the
 * file store only so that /stats counts the creates that wait
 * (persist.put_waits_total). */
#include <check.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvs_client.h"
#include "kvs_env.h"
#include "tenants_util.h"

#define DEP     "race-test-0123456789"
#define BLOCK   8192u
#define NKEYS   4
#define B_UID   65534      /* tenant b; root is tenant "default" */

/* timeout: server.request_timeout (how long a create waits); extra: more
 * assignments. */
static void env_start(kvs_env *e, const char *timeout, const char *extra)
{
    char conf[PATH_MAX * 2 + 1024];
    kvs_env_init(e);
    snprintf(conf, sizeof conf, "leases.reaper_interval=100ms\nserver.request_timeout=%s\n"
             "persist.backend=file\npersist.path=%s\npersist.fsync=never\n%s", timeout, e->dir, extra);
    kvs_env_boot(e, conf);
}

static void okey(char *buf, size_t len, int64_t block)
{
    snprintf(buf, len, "rtp_llm/v1/" DEP "/tp-0/group-0/block-%" PRId64, block);
}

/* The keys and each writer's bytes. */
typedef struct race {
    char names[NKEYS][128];
    const char *keys[NKEYS];
    uint8_t a[NKEYS][BLOCK], b[NKEYS][BLOCK];
} race;

static void race_init(race *r, int64_t first)
{
    for (int i = 0; i < NKEYS; i++) {
        okey(r->names[i], sizeof r->names[i], first + i);
        r->keys[i] = r->names[i];
        bfill(r->a[i], BLOCK, first + i, 0xA);
        bfill(r->b[i], BLOCK, first + i, 0xB);
    }
}

/* Writer B: rtp-llm's store() of the race's keys with B's bytes, keeping
 * what it was told: told[i] 1 = left out (exists), 2 = written by B. */
typedef struct writer_b {
    kvsc *c;
    race *r;
    long acquire_status, store_status;
    int told[NKEYS];
    volatile int done;
} writer_b;

static void *writer_b_run(void *arg)
{
    writer_b *w = arg;
    char *body = kvsc_acquire_body("create", w->r->keys, NKEYS, BLOCK, 60);
    char lease[64];
    kvsc_reply rep;

    w->store_status = -1;
    if (!body || kvsc_call(w->c->url, "acquire", body, &rep) < 0) {
        free(body);
        w->done = 1;
        return NULL;
    }
    free(body);
    w->acquire_status = rep.status;
    if (rep.status != 200) {
        w->store_status = rep.status;
        kvsc_reply_free(&rep);
        w->done = 1;
        return NULL;
    }
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&rep));
    for (int i = 0; i < NKEYS; i++) {
        uint64_t off, sz;
        w->told[i] = 1;
        if (!kvsc_object(&rep, w->r->keys[i], &off, &sz) || off + BLOCK > w->c->size)
            continue;
        memcpy(w->c->base + off, w->r->b[i], BLOCK);
        w->told[i] = 2;
    }
    kvsc_reply_free(&rep);
    w->store_status = 0;
    if (*lease) {
        long st = kvsc_lease_call(w->c, "seal", lease);
        w->store_status = st == 204 ? 0 : st;
        if (st == 204)
            kvsc_lease_call(w->c, "release", lease);
        else
            kvsc_lease_call(w->c, "discard", lease);
    }
    w->done = 1;
    return NULL;
}

/* Until B is answered or its create is waiting (persist.put_waits_total
 * above waits0); bounded. true when B waits. */
static bool b_waits(kvs_env *e, writer_b *w, long long waits0)
{
    for (int i = 0; i < 1000 && !w->done; i++) {
        if (kvh_stat(&e->d, "persist.put_waits_total") > waits0)
            return true;
        usleep(10 * 1000);
    }
    ck_assert_msg(w->done, "writer B neither answered nor waited in 10 s");
    return false;
}

/* Every object B was told is stored reads back byte-exact: those it wrote
 * with B's bytes, those left out with want_out's (the first writer's). */
static void check_b_told_truth(kvsc *c, writer_b *w, race *r, const uint8_t (*want_out)[BLOCK])
{
    static uint8_t got[NKEYS][BLOCK];
    uint8_t *out[NKEYS];
    bool found[NKEYS];
    size_t hits = 0;

    for (int i = 0; i < NKEYS; i++)
        out[i] = got[i];
    ck_assert_int_eq(kvsc_read(c, r->keys, NKEYS, out, BLOCK, 60, &hits, found), 0);
    for (int i = 0; i < NKEYS; i++) {
        if (w->told[i] == 0)
            continue;
        ck_assert_msg(found[i], "writer B was told %s %s, but a read misses it", r->keys[i],
                      w->told[i] == 1 ? "exists (left out of its create)" : "is stored (it sealed it)");
        const uint8_t *want = w->told[i] == 2 ? r->b[i] : want_out[i];
        ck_assert_msg(memcmp(got[i], want, BLOCK) == 0, "%s reads back other bytes than %s", r->keys[i],
                      w->told[i] == 2 ? "writer B's" : "writer A's");
    }
}

/* A opens a create lease on K; B creates K. B is not told K exists while
 * A's lease is open: it waits, A writes and seals, and then B is told K
 * exists (it does: A's bytes, byte-exact). */
START_TEST(create_racing_an_unsealed_create_waits_for_its_seal)
{
    static race r;
    kvs_env e;
    kvsc a, b;
    kvsc_reply ra;
    char why[256], lease[64];
    pthread_t th;

    env_start(&e, "8s", "");
    race_init(&r, 1000);
    ck_assert_msg(kvsc_open(&a, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    ck_assert_msg(kvsc_open(&b, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    char *body = kvsc_acquire_body("create", r.keys, NKEYS, BLOCK, 60);
    ck_assert_int_eq(kvsc_call(e.url, "acquire", body, &ra), 0);
    free(body);
    ck_assert_int_eq(ra.status, 200);
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&ra));
    ck_assert_str_ne(lease, "");

    long long waits0 = kvh_stat(&e.d, "persist.put_waits_total");
    ck_assert_int_ge(waits0, 0);
    writer_b w = { .c = &b, .r = &r };
    ck_assert_int_eq(pthread_create(&th, NULL, writer_b_run, &w), 0);
    bool waited = b_waits(&e, &w, waits0);
    if (!waited) {
        /* B was answered while A's lease is open and unsealed. */
        pthread_join(th, NULL);
        ck_assert_int_eq(w.store_status, 0);
        check_b_told_truth(&b, &w, &r, r.a);
    }
    for (int i = 0; i < NKEYS; i++) {
        uint64_t off, sz;
        ck_assert(kvsc_object(&ra, r.keys[i], &off, &sz));
        memcpy(a.base + off, r.a[i], BLOCK);
    }
    kvsc_reply_free(&ra);
    ck_assert_int_eq(kvsc_lease_call(&a, "seal", lease), 204);
    ck_assert_int_eq(kvsc_lease_call(&a, "release", lease), 204);
    if (waited)
        pthread_join(th, NULL);
    ck_assert_int_eq(w.acquire_status, 200);
    ck_assert_int_eq(w.store_status, 0);
    for (int i = 0; i < NKEYS; i++)
        ck_assert_msg(w.told[i] == 1, "%s: A sealed it, yet B was given it to write", r.keys[i]);
    check_b_told_truth(&b, &w, &r, r.a);
    kvsc_close(&a);
    kvsc_close(&b);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* A opens a create lease on K (term 1 s) and dies without sealing. B's
 * create of K is not told K exists: once A's lease ends at its term, B
 * gets K to write, seals, and reads back its own bytes. */
START_TEST(create_racing_a_dead_writer_gets_the_keys)
{
    static race r;
    kvs_env e;
    kvsc a, b;
    kvsc_reply ra;
    char why[256];
    pthread_t th;

    env_start(&e, "8s", "");
    race_init(&r, 2000);
    ck_assert_msg(kvsc_open(&a, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    ck_assert_msg(kvsc_open(&b, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    char *body = kvsc_acquire_body("create", r.keys, NKEYS, BLOCK, 1);
    ck_assert_int_eq(kvsc_call(e.url, "acquire", body, &ra), 0);
    free(body);
    ck_assert_int_eq(ra.status, 200);
    ck_assert_str_ne(kvsc_lease_id(&ra), "");
    kvsc_reply_free(&ra);
    kvsc_close(&a);   /* A dies: no seal, no discard */

    writer_b w = { .c = &b, .r = &r };
    ck_assert_int_eq(pthread_create(&th, NULL, writer_b_run, &w), 0);
    for (int i = 0; i < 1500 && !w.done; i++)
        usleep(10 * 1000);
    ck_assert_msg(w.done, "writer B not answered in 15 s");
    pthread_join(th, NULL);
    ck_assert_int_eq(w.acquire_status, 200);
    ck_assert_int_eq(w.store_status, 0);
    check_b_told_truth(&b, &w, &r, r.a);
    for (int i = 0; i < NKEYS; i++)
        ck_assert_msg(w.told[i] == 2, "%s: its only writer died unsealed, yet B was not given it to write",
                      r.keys[i]);
    /* A's lease ended at its term (by the reaper or the front end's sweep, whichever ran first). */
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.leases_expired_total", 1, 10000, NULL) == 0,
                  "writer A's lease was not counted as expired at its term");
    kvsc_close(&b);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* A's lease stays open past B's wait (server.request_timeout 300 ms): B's
 * create gets 503 with nothing reserved, so rtp-llm's store() fails and
 * claims nothing; B's store retried after A sealed is told K exists, and it
 * does, with A's bytes. */
START_TEST(create_that_waits_too_long_fails_and_a_retry_succeeds)
{
    static race r;
    kvs_env e;
    kvsc a, b;
    kvsc_reply ra;
    char why[256], lease[64];
    const uint8_t *bb[NKEYS];

    env_start(&e, "300ms", "");
    race_init(&r, 5000);
    for (int i = 0; i < NKEYS; i++)
        bb[i] = r.b[i];
    ck_assert_msg(kvsc_open(&a, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    ck_assert_msg(kvsc_open(&b, e.url, e.kvs_sock, why, sizeof why) == 0, "%s", why);
    char *body = kvsc_acquire_body("create", r.keys, NKEYS, BLOCK, 60);
    ck_assert_int_eq(kvsc_call(e.url, "acquire", body, &ra), 0);
    free(body);
    ck_assert_int_eq(ra.status, 200);
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&ra));
    long long reserved = kvh_stat(&e.d, "leases.write");
    ck_assert_int_eq(kvsc_store(&b, r.keys, NKEYS, bb, BLOCK, 60), 503);
    ck_assert_int_eq(kvh_stat(&e.d, "leases.write"), reserved);   /* B holds nothing */
    for (int i = 0; i < NKEYS; i++) {
        uint64_t off, sz;
        ck_assert(kvsc_object(&ra, r.keys[i], &off, &sz));
        memcpy(a.base + off, r.a[i], BLOCK);
    }
    kvsc_reply_free(&ra);
    ck_assert_int_eq(kvsc_lease_call(&a, "seal", lease), 204);
    ck_assert_int_eq(kvsc_lease_call(&a, "release", lease), 204);
    ck_assert_int_eq(kvsc_store(&b, r.keys, NKEYS, bb, BLOCK, 60), 0);
    writer_b w = { .c = &b, .r = &r, .told = { 1, 1, 1, 1 } };
    check_b_told_truth(&b, &w, &r, r.a);
    kvsc_close(&a);
    kvsc_close(&b);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* A lease call whose status and error text go into err. */
static long lease_call(const char *url, const char *route, const char *lease, char *err, size_t errlen)
{
    char body[192];
    kvsc_reply r;
    snprintf(body, sizeof body, "{\"lease_id\":\"%s\",\"request_id\":\"kvs_store_test\"}", lease);
    if (kvsc_call(url, route, body, &r) < 0)
        return -1;
    snprintf(err, errlen, "%s", json_string_value(json_object_get(r.body, "error")) ?: "");
    kvsc_reply_free(&r);
    return r.status;
}

/* /seal of a create lease past its term answers 410 (the docs' status),
 * also once the sweep has freed its record; /release and /discard of an
 * ended lease, and an id never granted, stay 404 (as documented). */
START_TEST(lease_calls_after_the_term_answer_410)
{
    static race r;
    kvs_env e;
    kvsc_reply rep;
    char lease[3][64], err[256];
    const char *routes[3] = { "seal", "release", "discard" };

    env_start(&e, "8s", "");
    race_init(&r, 3000);
    for (int i = 0; i < 3; i++) {
        const char *k[1] = { r.keys[i] };
        char *body = kvsc_acquire_body("create", k, 1, BLOCK, 1);
        ck_assert_int_eq(kvsc_call(e.url, "acquire", body, &rep), 0);
        free(body);
        ck_assert_int_eq(rep.status, 200);
        snprintf(lease[i], sizeof lease[i], "%s", kvsc_lease_id(&rep));
        kvsc_reply_free(&rep);
    }
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.leases_open", 0, 10000, NULL) == 0,
                  "the leases were not swept after their term");
    for (int i = 0; i < 3; i++) {
        long st = lease_call(e.url, routes[i], lease[i], err, sizeof err), want = i == 0 ? 410 : 404;
        ck_assert_msg(st == want, "/%s after the term answered %ld (%s), not %ld", routes[i], st, err, want);
    }
    long st = lease_call(e.url, "seal", "0123456789abcdef0123456789abcdef", err, sizeof err);
    ck_assert_msg(st == 404, "/seal of an id never granted answered %ld (%s)", st, err);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

/* Tenant b's /seal of the expired lease and of an id never granted. */
static int b_seals(void *arg)
{
    const char *const *a = arg;   /* url, the expired lease */
    char err_a[256], err_u[256];
    long sa = lease_call(a[0], "seal", a[1], err_a, sizeof err_a);
    long su = lease_call(a[0], "seal", "0123456789abcdef0123456789abcdef", err_u, sizeof err_u);
    if (sa != 404 || su != 404 || strcmp(err_a, err_u) != 0) {
        fprintf(stderr, "tenant b: /seal of a's expired lease answered %ld '%s'; of an unknown one %ld '%s'\n", sa,
                err_a, su, err_u);
        return 10;
    }
    return 0;
}

/* The 410 is its own tenant's: to another tenant a lease past its term is
 * as unknown as an id never granted (404, the same text). */
START_TEST(an_expired_lease_is_unknown_to_another_tenant)
{
    static race r;
    kvs_env e;
    kvsc_reply rep;
    char lease[64], err[256];
    const char *k[1];

    TENANTS_NEEDS_ROOT("kvs_race: an_expired_lease_is_unknown_to_another_tenant");
    env_start(&e, "8s", "memory.host_bytes=96MiB\nmemory.slab_bytes=1MiB\ntenant.b.uids=65534\n"
                  "tenant.b.host_bytes=16MiB\n");
    tenants_open_dirs(&e.d);
    race_init(&r, 4000);
    k[0] = r.keys[0];
    char *body = kvsc_acquire_body("create", k, 1, BLOCK, 1);
    ck_assert_int_eq(kvsc_call(e.url, "acquire", body, &rep), 0);
    free(body);
    ck_assert_int_eq(rep.status, 200);
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&rep));
    kvsc_reply_free(&rep);
    ck_assert_msg(kvh_wait_stat(&e.d, "kvs_server.leases_open", 0, 10000, NULL) == 0,
                  "the lease was not swept after its term");
    const char *args[2] = { e.url, lease };
    ck_assert_int_eq(tenants_run_as(b_seals, args, B_UID, B_UID, NULL, 0), 0);
    long st = lease_call(e.url, "seal", lease, err, sizeof err);
    ck_assert_msg(st == 410, "its own tenant's /seal after the term answered %ld (%s)", st, err);
    KVH_STOP_DESTROY(&e.d);
}
END_TEST

static Suite *kvs_race_suite(void)
{
    Suite *s = suite_create("kvs_race");
    TCase *tc = tcase_create("kvs_race");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, create_racing_an_unsealed_create_waits_for_its_seal);
    tcase_add_test(tc, create_racing_a_dead_writer_gets_the_keys);
    tcase_add_test(tc, create_that_waits_too_long_fails_and_a_retry_succeeds);
    tcase_add_test(tc, lease_calls_after_the_term_answer_410);
    tcase_add_test(tc, an_expired_lease_is_unknown_to_another_tenant);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(kvs_race_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
