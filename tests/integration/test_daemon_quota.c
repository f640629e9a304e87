/* Integration: memory.namespace_quota on a real daemon, through libkvnode.
 *
 * A small host tier (8 MiB of 1 MiB slabs = 128 blocks of 64 KiB) shared by
 * two namespaces:
 * - a namespace at its quota evicts its own oldest blocks, leaves first, and
 *   never the other namespace's (even when those are older); the evictions
 *   are counted in evictions.host.quota_total and in /metrics as
 *   kvnode_evictions_total{tier="host",action="quota"};
 * - when everything it holds is pinned, its put fails with ENOSPC and a
 *   message naming the quota, reserves nothing, and the other namespace
 *   still puts;
 * - a reload changes the quota: a lowered one applies at the namespace's
 *   next put (no sweep on reload), 0 lifts it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "harness.h"
#include "../common/kvh_http.h"

#define BB 65536
#define SMALL_TIER "memory.host_bytes=8MiB\nmemory.slab_bytes=1MiB\nadmin.listen=127.0.0.1:0\n"

static json_t *ns_stats(const kvh_daemon *d, const char *model, json_t **root)
{
    *root = kvh_stats(d);
    ck_assert_msg(*root != NULL, "stats: %s", kvh_error());
    json_t *ns = kvh_stats_namespace(*root, model, 0);
    ck_assert_msg(ns != NULL, "%s", kvh_error());
    return ns;
}

static long long ns_stat(const kvh_daemon *d, const char *model, const char *key)
{
    json_t *root, *ns = ns_stats(d, model, &root);
    json_t *v = json_object_get(ns, key);
    ck_assert_msg(json_is_integer(v), "namespace %s: no integer \"%s\"", model, key);
    long long out = json_integer_value(v);
    json_decref(root);
    return out;
}

/* GET /metrics from the daemon's admin listener (malloc'd body). */
static char *get_metrics(const kvh_daemon *d)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    const char *addr = json_string_value(json_object_get(st, "admin"));
    ck_assert_msg(addr != NULL, "stats has no \"admin\" address");
    char *text = NULL;
    long code = kvh_http_req(addr, NULL, "/metrics", &text, NULL, 0);
    json_decref(st);
    ck_assert_msg(code == 200, "GET /metrics: status %ld", code);
    return text;
}

START_TEST(quota_evicts_own_blocks_only)
{
    kvh_daemon d;
    KVH_START(&d, SMALL_TIER "memory.namespace_quota=1MiB\n");   /* 16 blocks */
    kvnode_layout la = kvh_layout("quota-a", BB, 1, 0), lb = kvh_layout("quota-b", BB, 1, 0);
    kvnode_client *a, *b;
    KVH_CONNECT(&d, &la, &a);
    KVH_CONNECT(&d, &lb, &b);
    kvnode_key kb[12], ka1[10], ka2[10], more[2];
    kvh_chain(kb, 12, 1);
    kvh_chain(ka1, 10, 2);
    kvh_chain(ka2, 10, 3);
    kvh_chain(more, 2, 4);

    /* B first, so B's blocks are the oldest of the tier. */
    ck_assert_msg(kvh_put(b, kb, 12, 11) == 0, "%s", kvh_error());
    ck_assert_msg(kvh_put(a, ka1, 10, 12) == 0, "%s", kvh_error());
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.quota_total"), 0);
    ck_assert_msg(kvh_put(a, ka2, 10, 13) == 0, "%s", kvh_error());   /* A: 20 > 16 */
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.quota_total"), 4);
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.dropped_total"), 0);
    ck_assert_int_eq(ns_stat(&d, "quota-a", "bytes"), 16 * BB);
    ck_assert_int_eq(ns_stat(&d, "quota-a", "quota_bytes"), 1 << 20);
    ck_assert_int_eq(ns_stat(&d, "quota-b", "bytes"), 12 * BB);
    ck_assert_int_eq(kvh_match(a, ka1, 10), 6);     /* its leaves went */
    ck_assert_int_eq(kvh_match(a, ka2, 10), 10);
    size_t got;
    ck_assert_msg(kvh_get_verify(b, kb, 12, 11, 0, &got) == 0 && got == 12, "B: got %zu: %s", got,
                  kvh_error());

    /* Pin all of A: its next put is refused whole, naming the quota. */
    kvnode_loc l1[10], l2[10], wl[2];
    kvnode_lease r1, r2, w = 77;
    KVH_OK(a, kvnode_get_begin(a, ka1, 6, &r1, l1, &got));
    ck_assert_uint_eq(got, 6);
    KVH_OK(a, kvnode_get_begin(a, ka2, 10, &r2, l2, &got));
    ck_assert_uint_eq(got, 10);
    int rc = kvnode_put_begin(a, more, 2, KVNODE_TIER_HOST, &w, wl);
    ck_assert_int_eq(rc, -KVNODE_ENOSPC);
    ck_assert_msg(strstr(kvnode_last_error(a), "is at its quota: memory.namespace_quota = 1MiB, 1MiB held"),
                  "%s", kvnode_last_error(a));
    ck_assert_int_eq(KVH_STAT(&d, "leases.write"), 0);
    ck_assert_int_eq(ns_stat(&d, "quota-a", "reserved_bytes"), 0);
    ck_assert_int_eq(KVH_STAT(&d, "tiers.host.blocks"), 28);
    /* B is not held back. */
    kvnode_key kb2[4];
    kvh_chain(kb2, 4, 5);
    ck_assert_msg(kvh_put(b, kb2, 4, 14) == 0, "%s", kvh_error());
    ck_assert_int_eq(kvh_match(b, kb, 12), 12);
    /* Unpinned, A makes room from its own blocks again. */
    KVH_OK(a, kvnode_get_end(a, r1));
    KVH_OK(a, kvnode_get_end(a, r2));
    ck_assert_msg(kvh_put(a, more, 2, 15) == 0, "%s", kvh_error());
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.quota_total"), 6);
    ck_assert_int_eq(ns_stat(&d, "quota-a", "blocks"), 16);
    ck_assert_int_eq(ns_stat(&d, "quota-b", "blocks"), 16);

    char *m = get_metrics(&d);
    ck_assert_msg(strstr(m, "\nkvnode_evictions_total{tier=\"host\",action=\"quota\"} 6\n"), "%s", m);
    ck_assert_msg(strstr(m, "\nkvnode_evictions_total{tier=\"host\",action=\"drop\"} 0\n"), "%s", m);
    free(m);

    kvnode_close(a);
    kvnode_close(b);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(reload_changes_the_quota)
{
    kvh_daemon d;
    KVH_START(&d, SMALL_TIER);
    kvnode_layout la = kvh_layout("quota-r", BB, 1, 0);
    kvnode_client *a;
    KVH_CONNECT(&d, &la, &a);
    kvnode_key k[8];
    for (uint64_t ch = 0; ch < 5; ch++) {
        kvh_chain(k, 8, 100 + ch);
        ck_assert_msg(kvh_put(a, k, 8, ch) == 0, "%s", kvh_error());
    }
    ck_assert_int_eq(ns_stat(&d, "quota-r", "blocks"), 40);   /* no quota by default */
    ck_assert_int_eq(ns_stat(&d, "quota-r", "quota_bytes"), 0);

    /* Lowered to 4 blocks: applied, but nothing is evicted until A puts. */
    char *not_applied = (char *)1;
    ck_assert_int_eq(kvh_rewrite_config(&d, SMALL_TIER "memory.namespace_quota=256KiB\n"), 0);
    KVH_OK(a, kvnode_reload(a, &not_applied));
    ck_assert_ptr_null(not_applied);
    ck_assert_int_eq(ns_stat(&d, "quota-r", "quota_bytes"), 256 << 10);
    ck_assert_int_eq(ns_stat(&d, "quota-r", "blocks"), 40);
    kvnode_key one[1];
    kvh_chain(one, 1, 200);
    ck_assert_msg(kvh_put(a, one, 1, 9) == 0, "%s", kvh_error());
    ck_assert_int_eq(ns_stat(&d, "quota-r", "blocks"), 4);
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.quota_total"), 37);
    ck_assert_int_eq(kvh_match(a, one, 1), 1);
    /* A put larger than the quota is refused, saying so. */
    kvh_chain(k, 8, 300);
    kvnode_loc wl[8];
    kvnode_lease w;
    ck_assert_int_eq(kvnode_put_begin(a, k, 8, KVNODE_TIER_HOST, &w, wl), -KVNODE_ENOSPC);
    ck_assert_msg(strstr(kvnode_last_error(a), "8 blocks of 64KiB do not fit in memory.namespace_quota = 256KiB"),
                  "%s", kvnode_last_error(a));
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.quota_total"), 37);   /* refused before evicting */
    ck_assert_int_eq(ns_stat(&d, "quota-r", "blocks"), 4);

    /* 0 lifts it. */
    ck_assert_int_eq(kvh_rewrite_config(&d, SMALL_TIER "memory.namespace_quota=0\n"), 0);
    KVH_OK(a, kvnode_reload(a, NULL));
    ck_assert_msg(kvh_put(a, k, 8, 10) == 0, "%s", kvh_error());
    ck_assert_int_eq(ns_stat(&d, "quota-r", "blocks"), 12);
    ck_assert_int_eq(ns_stat(&d, "quota-r", "quota_bytes"), 0);
    ck_assert_int_eq(KVH_STAT(&d, "evictions.host.quota_total"), 37);

    kvnode_close(a);
    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        quota_evicts_own_blocks_only,
        reload_changes_the_quota,
    };
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = kvh_run_suite("daemon_quota", "quota", 30, tests, sizeof tests / sizeof tests[0]);
    curl_global_cleanup();
    return rc;
}
