/* Unit tests of daemon/tenants/tenants.c (issue 15) on a private libevent loop, with
 * configurations built in code: without sections one tenant "default" with
 * everything; with sections each tenant its own cache (own memfd, own
 * namespaces: the same layout is another deployment), "default" what is
 * left (none: no cache); a peer's tenant (a uid listed wins over a gid,
 * primary or supplementary, else "default"); reload moves uids and limits,
 * and a section added by a reload is not served until a restart. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "cache/cache.h"
#include "config/config.h"
#include "kvnode.h"
#include "core/log.h"
#include "mem/index.h"
#include "tenants/tenants.h"

static struct event_base *base;

static void setup(void)
{
    log_set_level(LOG_LEVEL_ERROR);
    base = event_base_new();
    ck_assert_ptr_nonnull(base);
}

static void teardown(void)
{
    event_base_free(base);
}

/* Defaults, a small host tier, then "section.key=value" overrides, resolved. */
static struct kvn_config *config_with(const char *const *overrides)
{
    struct kvn_config *cfg = malloc(sizeof *cfg);
    char err[CONFIG_ERR_MAX];
    ck_assert_ptr_nonnull(cfg);
    config_defaults(cfg);
    cfg->host_bytes = 8u << 20;
    cfg->slab_bytes = 1u << 20;
    cfg->pin_host = CONFIG_PIN_OFF;
    cfg->persist_backend = CONFIG_BACKEND_OFF;
    for (size_t i = 0; overrides && overrides[i]; i++)
        ck_assert_msg(config_apply_override(cfg, overrides[i], err, sizeof err) == 0, "%s: %s",
                      overrides[i], err);
    ck_assert_msg(config_resolve(cfg, err, sizeof err) == 0, "%s", err);
    return cfg;
}

static int host_fd(struct cache *c)
{
    struct cache_arena_info a[INDEX_MAX_ARENAS];
    ck_assert_uint_ge(cache_arenas(c, a, INDEX_MAX_ARENAS), 1);
    return a[0].fd;
}

START_TEST(no_sections_one_default_tenant_with_everything)
{
    struct kvn_config *cfg = config_with(NULL);
    struct tenants *ts;
    char err[512];

    ck_assert_int_eq(tenants_create(base, cfg, NULL, &ts, err, sizeof err), 0);
    ck_assert(!tenants_configured(ts));
    ck_assert_uint_eq(tenants_count(ts), 1);
    struct tenant *t = tenants_default(ts);
    ck_assert_str_eq(t->name, "default");
    ck_assert(!t->named);
    ck_assert_uint_eq(t->host_bytes, 8u << 20);
    ck_assert_uint_eq(cache_host_size(t->cache), 8u << 20);
    ck_assert_uint_eq(t->max_clients, cfg->max_clients);
    ck_assert_uint_eq(t->max_namespaces, cfg->max_namespaces);
    ck_assert_ptr_eq(tenants_for_peer(ts, 0, 0, NULL, 0), t);
    ck_assert_ptr_eq(tenants_for_peer(ts, 4242, 4242, NULL, 0), t);
    struct cache *caches[4];
    ck_assert_uint_eq(tenants_caches(ts, caches, 4), 1);
    ck_assert_ptr_eq(caches[0], t->cache);
    tenants_destroy(ts);
    free(cfg);
}
END_TEST

START_TEST(sections_get_their_own_caches)
{
    const char *const o[] = { "memory.host_bytes=16MiB", "tenant.a.uids=100", "tenant.a.host_bytes=4MiB",
                              "tenant.b.gids=200", "tenant.b.host_bytes=6MiB", "tenant.b.max_clients=3",
                              NULL };
    struct kvn_config *cfg = config_with(o);
    struct tenants *ts;
    char err[512];

    ck_assert_int_eq(tenants_create(base, cfg, NULL, &ts, err, sizeof err), 0);
    ck_assert(tenants_configured(ts));
    ck_assert_uint_eq(tenants_count(ts), 3);
    struct tenant *d = tenants_at(ts, 0), *a = tenants_at(ts, 1), *b = tenants_at(ts, 2);
    ck_assert_str_eq(a->name, "a");
    ck_assert_str_eq(b->name, "b");
    ck_assert_uint_eq(cache_host_size(a->cache), 4u << 20);
    ck_assert_uint_eq(cache_host_size(b->cache), 6u << 20);
    ck_assert_uint_eq(cache_host_size(d->cache), 6u << 20);   /* what is left */
    ck_assert_uint_eq(b->max_clients, 3);
    ck_assert_uint_eq(a->max_clients, cfg->max_clients / 4); /* its memory's share: 4 MiB of 16 */
    ck_assert_uint_eq(d->max_clients, cfg->max_clients - cfg->max_clients / 4 - 3);   /* what is left */
    /* Three memfds: nothing of one tenant's in another's mapping. */
    ck_assert_int_ne(host_fd(a->cache), host_fd(b->cache));
    ck_assert_int_ne(host_fd(a->cache), host_fd(d->cache));

    /* The same layout bound in two tenants: two deployments. */
    struct ns_layout l = { .model = "m", .dtype = "bf16", .block_tokens = 16, .block_bytes = 65536,
                           .num_layers = 2, .kv_heads = 2, .head_dim = 64, .tp_size = 1 };
    struct kv_namespace *nd, *na, *nb;
    ck_assert_int_eq(cache_bind(d->cache, &l, &nd, err, sizeof err), 0);
    ck_assert_int_eq(cache_bind(a->cache, &l, &na, err, sizeof err), 0);
    ck_assert_int_eq(cache_bind(b->cache, &l, &nb, err, sizeof err), 0);
    ck_assert_uint_eq(nd->fingerprint, ns_fingerprint(&l));
    ck_assert_uint_eq(na->fingerprint, ns_fingerprint_tenant(&l, "a"));
    ck_assert_str_ne(na->deployment_id, nb->deployment_id);
    ck_assert_str_ne(na->deployment_id, nd->deployment_id);
    cache_unbind(d->cache, nd);
    cache_unbind(a->cache, na);
    cache_unbind(b->cache, nb);

    /* A listed uid wins over a listed gid; neither: "default". */
    ck_assert_ptr_eq(tenants_for_peer(ts, 100, 200, NULL, 0), a);
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 200, NULL, 0), b);
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 7, NULL, 0), d);
    struct cache *caches[4];
    ck_assert_uint_eq(tenants_caches(ts, caches, 4), 3);
    tenants_destroy(ts);
    free(cfg);
}
END_TEST

START_TEST(default_without_memory_has_no_cache)
{
    const char *const o[] = { "tenant.a.uids=100", "tenant.a.host_bytes=4MiB",
                              "tenant.b.uids=101", "tenant.b.host_bytes=4MiB", NULL };
    struct kvn_config *cfg = config_with(o);
    struct tenants *ts;
    char err[512];

    ck_assert_int_eq(tenants_create(base, cfg, NULL, &ts, err, sizeof err), 0);
    ck_assert_uint_eq(tenants_default(ts)->host_bytes, 0);
    ck_assert_ptr_null(tenants_default(ts)->cache);
    struct cache *caches[4];
    ck_assert_uint_eq(tenants_caches(ts, caches, 4), 2);
    tenants_destroy(ts);
    free(cfg);
}
END_TEST

START_TEST(reload_moves_uids_and_limits)
{
    const char *const o[] = { "memory.host_bytes=16MiB", "tenant.a.uids=100", "tenant.a.host_bytes=4MiB",
                              "tenant.b.uids=101", "tenant.b.host_bytes=4MiB", NULL };
    const char *const o2[] = { "memory.host_bytes=16MiB", "tenant.a.uids=100 101", "tenant.a.host_bytes=4MiB",
                               "tenant.a.max_clients=2", "tenant.a.max_namespaces=7",
                               "tenant.b.uids=102", "tenant.b.host_bytes=4MiB",
                               "tenant.c.uids=103", "tenant.c.host_bytes=4MiB", NULL };
    struct kvn_config *cfg = config_with(o), *next = config_with(o2);
    struct tenants *ts;
    char err[512];

    ck_assert_int_eq(tenants_create(base, cfg, NULL, &ts, err, sizeof err), 0);
    struct tenant *d = tenants_at(ts, 0), *a = tenants_at(ts, 1), *b = tenants_at(ts, 2);
    ck_assert_ptr_eq(tenants_for_peer(ts, 101, 0, NULL, 0), b);
    tenants_apply_config(ts, next);
    ck_assert_ptr_eq(tenants_for_peer(ts, 101, 0, NULL, 0), a);
    ck_assert_ptr_eq(tenants_for_peer(ts, 102, 0, NULL, 0), b);
    /* c came with the reload: not served until a restart. */
    ck_assert_ptr_eq(tenants_for_peer(ts, 103, 0, NULL, 0), d);
    ck_assert_uint_eq(tenants_count(ts), 3);
    ck_assert_uint_eq(a->max_clients, 2);
    ck_assert_uint_eq(a->max_namespaces, 7);
    tenants_destroy(ts);
    free(cfg);
    free(next);
}
END_TEST

/* A peer's groups are its primary and its supplementary ones, as admission
 * (server.c) counts them: a supplementary group listed by a section makes
 * the peer that tenant's; a uid listed still wins; among group matches the
 * first section in file order wins, whichever of the peer's groups matched. */
START_TEST(supplementary_groups_count_as_admission_counts_them)
{
    const char *const o[] = { "memory.host_bytes=16MiB", "tenant.a.uids=100", "tenant.a.gids=300",
                              "tenant.a.host_bytes=4MiB", "tenant.b.gids=200 250", "tenant.b.host_bytes=4MiB",
                              NULL };
    struct kvn_config *cfg = config_with(o);
    struct tenants *ts;
    char err[512];

    ck_assert_int_eq(tenants_create(base, cfg, NULL, &ts, err, sizeof err), 0);
    struct tenant *d = tenants_at(ts, 0), *a = tenants_at(ts, 1), *b = tenants_at(ts, 2);
    const gid_t in_b[] = { 7, 250, 900 }, in_a_and_b[] = { 200, 300 }, in_none[] = { 1, 2, 3 };
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 7, in_b, 3), b);
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 7, in_b + 1, 1), b);
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 7, in_b, 1), d);          /* 7 alone: no section */
    ck_assert_ptr_eq(tenants_for_peer(ts, 100, 7, in_b, 3), a);        /* the uid wins */
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 7, in_a_and_b, 2), a);    /* a comes first in the file */
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 200, in_a_and_b + 1, 1), a);
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 7, in_none, 3), d);
    ck_assert_ptr_eq(tenants_for_peer(ts, 7, 7, NULL, 0), d);
    tenants_destroy(ts);
    free(cfg);
}
END_TEST

/* Warm restarts: n blocks (keys 1..n) put into t's cache, committed. */
static void put_blocks(struct cache *c, size_t n)
{
    const struct ns_layout l = { .model = "m", .dtype = "bf16", .block_tokens = 16, .block_bytes = 65536,
                                 .num_layers = 1, .kv_heads = 1, .head_dim = 1, .tp_size = 1 };
    struct kv_namespace *ns;
    struct lease_list owner = { 0 };
    int64_t keys[32];
    struct cache_loc locs[32];
    uint64_t lid;
    uint32_t blocks;
    char err[512];
    ck_assert_uint_le(n, 32);
    ck_assert_int_eq(cache_bind(c, &l, &ns, err, sizeof err), 0);
    for (size_t i = 0; i < n; i++)
        keys[i] = 1 + (int64_t)i;
    struct cache_put_req req = { .ns = ns, .owner = &owner, .keys = keys, .n = n, .tier = KVNODE_TIER_HOST };
    ck_assert_int_eq(cache_put_begin(c, &req, &lid, locs, err, sizeof err), 0);
    ck_assert_int_eq(cache_lease_end(c, &owner, lid, LEASE_WRITE, true, &blocks, err, sizeof err), 0);
    ck_assert_uint_eq(blocks, n);
    cache_release_owner(c, &owner);
    cache_unbind(c, ns);
}

/* What a stopping daemon of ts hands over, each tenant's memfd duplicated. */
static void hand_over(struct tenants *ts, struct tenants_warm *tw, struct cache_ho *hos)
{
    memset(tw, 0, sizeof *tw);
    for (size_t i = 0; i < tenants_count(ts); i++) {
        struct tenant *t = tenants_at(ts, i);
        if (!t->cache)
            continue;
        ck_assert_int_eq(cache_handover_collect(t->cache, &hos[tw->n]), 0);
        struct tenants_warm_one *w = &tw->t[tw->n];
        snprintf(w->name, sizeof w->name, "%s", t->name);
        w->host_bytes = t->host_bytes;
        w->fd = dup(host_fd(t->cache));
        w->ho = &hos[tw->n++];
    }
}

static uint64_t adopted(struct tenant *t)
{
    struct cache_stats *st = malloc(sizeof *st);
    cache_get_stats(t->cache, st);
    uint64_t n = st->adopted_blocks;
    free(st);
    return n;
}

/* A tenant no longer configured has its blocks dropped; the others keep theirs. */
START_TEST(warm_restart_drops_the_blocks_of_a_tenant_that_is_gone)
{
    const char *const before[] = { "memory.host_bytes=16MiB", "tenant.a.uids=100", "tenant.a.host_bytes=8MiB",
                                   NULL };
    const char *const after[] = { "memory.host_bytes=8MiB", NULL };   /* default: 8MiB both times */
    struct kvn_config *c1 = config_with(before), *c2 = config_with(after);
    struct tenants *ts, *ts2;
    struct tenants_warm tw;
    struct cache_ho hos[TENANTS_MAX];
    char err[512];

    ck_assert_int_eq(tenants_create(base, c1, NULL, &ts, err, sizeof err), 0);
    put_blocks(tenants_at(ts, 0)->cache, 5);
    put_blocks(tenants_at(ts, 1)->cache, 7);
    hand_over(ts, &tw, hos);
    ck_assert_uint_eq(tw.n, 2);
    ck_assert_int_eq(tenants_create(base, c2, &tw, &ts2, err, sizeof err), 0);
    ck_assert_msg(tw.adopted, "not adopted: %s", tw.why);
    ck_assert_uint_eq(tw.dropped_blocks, 7);
    ck_assert_uint_eq(tenants_count(ts2), 1);
    ck_assert_uint_eq(adopted(tenants_at(ts2, 0)), 5);
    for (size_t i = 0; i < tw.n; i++) {
        ck_assert_int_eq(tw.t[i].fd, -1);   /* every fd taken */
        cache_ho_free(&hos[i]);
    }
    tenants_destroy(ts2);
    tenants_destroy(ts);
    free(c1);
    free(c2);
}
END_TEST

/* One tenant's geometry changed: nothing is adopted, by any tenant. */
START_TEST(warm_restart_is_all_or_nothing)
{
    const char *const before[] = { "memory.host_bytes=16MiB", "tenant.a.uids=100", "tenant.a.host_bytes=8MiB",
                                   NULL };
    const char *const after[] = { "memory.host_bytes=16MiB", "tenant.a.uids=100", "tenant.a.host_bytes=4MiB",
                                  NULL };
    struct kvn_config *c1 = config_with(before), *c2 = config_with(after);
    struct tenants *ts, *ts2;
    struct tenants_warm tw;
    struct cache_ho hos[TENANTS_MAX];
    char err[512];

    ck_assert_int_eq(tenants_create(base, c1, NULL, &ts, err, sizeof err), 0);
    put_blocks(tenants_at(ts, 0)->cache, 5);
    put_blocks(tenants_at(ts, 1)->cache, 7);
    hand_over(ts, &tw, hos);
    ck_assert_int_eq(tenants_create(base, c2, &tw, &ts2, err, sizeof err), 0);
    ck_assert(!tw.adopted);
    ck_assert_msg(strstr(tw.why, "host tier") != NULL, "why: %s", tw.why);
    for (size_t i = 0; i < tenants_count(ts2); i++)
        ck_assert_uint_eq(adopted(tenants_at(ts2, i)), 0);
    for (size_t i = 0; i < tw.n; i++) {
        ck_assert_int_eq(tw.t[i].fd, -1);
        cache_ho_free(&hos[i]);
    }
    tenants_destroy(ts2);
    tenants_destroy(ts);
    free(c1);
    free(c2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tenants");
    TCase *tc = tcase_create("tenants");
    tcase_set_timeout(tc, 30);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, warm_restart_drops_the_blocks_of_a_tenant_that_is_gone);
    tcase_add_test(tc, warm_restart_is_all_or_nothing);
    tcase_add_test(tc, no_sections_one_default_tenant_with_everything);
    tcase_add_test(tc, sections_get_their_own_caches);
    tcase_add_test(tc, default_without_memory_has_no_cache);
    tcase_add_test(tc, reload_moves_uids_and_limits);
    tcase_add_test(tc, supplementary_groups_count_as_admission_counts_them);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
