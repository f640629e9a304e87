/* Integration: limits one client cannot use to lock the others out.
 *
 * - namespaces: registering server.max_namespaces throwaway layouts (one
 *   HELLO and one block each) does not refuse new deployments for good: an
 *   idle namespace whose blocks are in the store is released when a new one
 *   needs its place, namespaces known only from the store (after a restart)
 *   do not count, and the refusal while every namespace is really in use
 *   says how to recover;
 * - reservations: one connection cannot reserve more than
 *   leases.max_reserved_per_client of the host tier (on by default), so
 *   another deployment's puts still find room. */
#include <check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define BB 65536

static int tmo(int ms)
{
    const char *v = getenv("KVNODED_REAL");
    return v && *v ? ms * 10 : ms;
}

static void start_with(kvh_daemon *d, const char *store, const char *extra)
{
    char *cfg = NULL;
    ck_assert_int_ge(asprintf(&cfg, "persist.backend=file\npersist.path=%s\n%s", store, extra), 0);
    int rc = kvh_start(d, cfg);
    free(cfg);
    ck_assert_msg(rc == 0, "kvnoded did not start: %s", kvh_error());
}

/* HELLO with model `model`, put one block, leave. */
static void throwaway(const kvh_daemon *d, const char *model)
{
    kvnode_layout l = kvh_layout(model, BB, 1, 0);
    kvnode_client *c;
    kvnode_key k = 4242;
    KVH_CONNECT(d, &l, &c);
    ck_assert_msg(kvh_put(c, &k, 1, 1) == 0, "%s", kvh_error());
    kvnode_close(c);
}

START_TEST(namespace_turnover_never_locks_out)
{
    char store[PATH_MAX], model[32];
    kvh_daemon d, d2;
    const char *extra = "server.max_namespaces=4\nmemory.host_bytes=16MiB\n";
    ck_assert_msg(kvh_mkdtemp(store, sizeof store) == 0, "%s", kvh_error());
    start_with(&d, store, extra);

    /* Fill the limit with throwaway deployments, then keep turning over. */
    for (int i = 0; i < 12; i++) {
        snprintf(model, sizeof model, "throwaway-%d", i);
        throwaway(&d, model);
        /* Written to the store: the namespace can be released. */
        ck_assert_msg(kvh_wait_stat(&d, "persist.written_blocks_total", i + 1, tmo(10000), NULL) == 0,
                      "%s", kvh_error());
    }
    ck_assert_int_ge(KVH_STAT(&d, "namespaces_reclaimed_total"), 8);
    ck_assert_int_le(KVH_STAT(&d, "namespaces_active"), 4);

    /* Four deployments really in use: the fifth is refused, and told how to recover. */
    kvnode_client *in_use[4];
    for (int i = 0; i < 4; i++) {
        snprintf(model, sizeof model, "serving-%d", i);
        kvnode_layout l = kvh_layout(model, BB, 1, 0);
        KVH_CONNECT(&d, &l, &in_use[i]);
    }
    kvnode_layout extra_l = kvh_layout("one-too-many", BB, 1, 0);
    kvnode_client *c = NULL;
    char sock[PATH_MAX];
    snprintf(sock, sizeof sock, "%s", d.sock);
    int rc = kvnode_connect(sock, &extra_l, &c);
    ck_assert_int_eq(rc, -KVNODE_ELIMIT);
    const char *why = kvnode_connect_error();
    ck_assert_msg(strstr(why, "server.max_namespaces") && strstr(why, "disconnect"), "error: %s", why);
    /* One engine leaves: its place is free again. */
    kvnode_close(in_use[0]);
    kvh_sleep_ms(100);
    KVH_CONNECT(&d, &extra_l, &c);
    kvnode_close(c);
    for (int i = 1; i < 4; i++)
        kvnode_close(in_use[i]);
    KVH_STOP_OK(&d);

    /* After a restart the recovery scan knows every deployment of the store;
     * they do not count until a client binds them. */
    start_with(&d2, store, extra);
    ck_assert_msg(kvh_wait_stat(&d2, "persist.recovery.indexed", 12, tmo(10000), NULL) == 0, "%s",
                  kvh_error());
    for (int i = 0; i < 4; i++) {
        snprintf(model, sizeof model, "after-restart-%d", i);
        kvnode_layout l = kvh_layout(model, BB, 1, 0);
        KVH_CONNECT(&d2, &l, &in_use[i]);
    }
    ck_assert_int_eq(KVH_STAT(&d2, "namespaces_active"), 4);
    for (int i = 0; i < 4; i++)
        kvnode_close(in_use[i]);
    KVH_STOP_DESTROY(&d2);
    kvh_destroy(&d);
}
END_TEST

START_TEST(one_client_cannot_reserve_the_tier)
{
    char store[PATH_MAX];
    kvh_daemon d;
    enum { N = 120 };   /* of the 128 blocks the 8 MiB tier holds */
    ck_assert_msg(kvh_mkdtemp(store, sizeof store) == 0, "%s", kvh_error());
    start_with(&d, store, "memory.host_bytes=8MiB\nmemory.slab_bytes=1MiB\n");
    kvnode_layout la = kvh_layout("hog", BB, 1, 0), lb = kvh_layout("neighbour", BB, 1, 0);
    kvnode_client *a, *b;
    KVH_CONNECT(&d, &la, &a);
    KVH_CONNECT(&d, &lb, &b);

    static kvnode_key keys[N];
    static kvnode_loc locs[N];
    kvnode_lease lease = 0;
    kvh_chain(keys, N, 1);
    /* The default share (a quarter of the tier, 32 blocks) and no more. */
    int rc = kvnode_put_begin(a, keys, N, KVNODE_TIER_HOST, &lease, locs);
    ck_assert_msg(rc == -KVNODE_ELIMIT, "reserving %d of 128 blocks: rc %d", N, rc);
    ck_assert_msg(strstr(kvnode_last_error(a), "leases.max_reserved_per_client"), "%s", kvnode_last_error(a));
    kvnode_lease held[4];
    for (int i = 0; i < 4; i++)
        KVH_OK(a, kvnode_put_begin(a, keys + 8 * i, 8, KVNODE_TIER_HOST, &held[i], locs));
    rc = kvnode_put_begin(a, keys + 32, 1, KVNODE_TIER_HOST, &lease, locs);
    ck_assert_int_eq(rc, -KVNODE_ELIMIT);
    ck_assert_int_eq(KVH_STAT(&d, "leases.reservations_refused_total"), 2);
    ck_assert_int_eq(KVH_STAT(&d, "leases.max_reserved_per_client_bytes"), 2 << 20);

    /* The neighbour still puts. */
    kvnode_key kb[16];
    kvh_chain(kb, 16, 99);
    ck_assert_msg(kvh_put(b, kb, 16, 5) == 0, "%s", kvh_error());
    ck_assert_uint_eq(kvh_match(b, kb, 16), 16);

    /* Committing gives the hog its share back. */
    for (int i = 0; i < 4; i++)
        KVH_OK(a, kvnode_put_commit(a, held[i]));
    KVH_OK(a, kvnode_put_begin(a, keys + 32, 8, KVNODE_TIER_HOST, &lease, locs));
    KVH_OK(a, kvnode_put_abort(a, lease));
    kvnode_close(a);
    kvnode_close(b);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        namespace_turnover_never_locks_out,
        one_client_cannot_reserve_the_tier,
    };
    return kvh_run_suite("daemon_limits", "limits", 120, tests, sizeof tests / sizeof tests[0]);
}
