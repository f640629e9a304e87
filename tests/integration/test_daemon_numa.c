/* Integration: memory.numa = auto places each GPU's share of the host tier
 * on that GPU's NUMA node (issue 16 item 3), on a fake two-node machine
 * ($KVNODE_SYSFS_ROOT, tests/common/fake_sysfs.h): GPUs 0000:3b:00.0 and
 * 0000:3c:00.0 on node 0, 0000:af:00.0 on node 1, a 96 MiB tier.
 *
 * - /stats: tiers.host.numa "per GPU", two regions: node 0 with 2 GPUs and
 *   64 MiB bound to node 0 (placed), node 1 with 1 GPU and 32 MiB (placed
 *   only where the real machine has a node 1);
 * - a client on GPU 2 (node 1, named by ordinal: no CUDA runtime here)
 *   gets its blocks in [64, 96) MiB, a client on GPU 0 below 64 MiB (their
 *   offsets in the client's own mapping), the regions' used_bytes say so;
 * - when node 1's share is full, GPU 2's puts go on into node 0's share:
 *   nothing refused, every block byte-exact;
 * - memory.numa = off on the same machine: "off", no regions;
 * - blocks demoted from a (simulated) GPU's HBM go to that GPU's share:
 *   device 1 is 0000:af:00.0 on node 1 on a machine of GPUs 3b (node 0) and
 *   af (node 1), so its demoted blocks land in the second half of the tier,
 *   byte-exact. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "../common/fake_sysfs.h"

#define BB (256u * 1024u)
#define MiB (1ull << 20)
#define TIER "memory.host_bytes=96MiB\nmemory.slab_bytes=1MiB\nadmin.listen=127.0.0.1:0\n"

static char root[256];
static char env_root[300];
static const char *env[2];

static void make_machine(void)
{
    snprintf(root, sizeof root, "%s/kvnode-numa-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(root));
    ck_assert_int_eq(fake_sysfs_nodes(root, 2), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:3b:00.0", "0x10de\n", "0x030200\n", 0), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:3c:00.0", "0x10de\n", "0x030200\n", 0), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:af:00.0", "0x10de\n", "0x030200\n", 1), 0);
    snprintf(env_root, sizeof env_root, "KVNODE_SYSFS_ROOT=%s", root);
    env[0] = env_root;
    env[1] = NULL;
}

static void wait_populated(const kvh_daemon *d)
{
    uint64_t t0 = kvh_now_ms();
    for (;;) {
        json_t *st = kvh_stats(d);
        ck_assert_msg(st != NULL, "stats: %s", kvh_error());
        const char *s = json_string_value(kvh_json_get(st, "tiers.host.populate_state"));
        bool done = s && strcmp(s, "done") == 0;
        json_decref(st);
        if (done)
            return;
        ck_assert_msg(kvh_now_ms() - t0 < 20000, "population did not finish");
        kvh_sleep_ms(20);
    }
}

/* Put keys[0..n) and return how many landed in [lo, hi) of the host arena. */
static size_t put_count_in(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed,
                           uint64_t lo, uint64_t hi)
{
    kvnode_loc locs[64];
    kvnode_lease lease;
    size_t got = 0, inside = 0;
    ck_assert_uint_le(n, 64);
    ck_assert_msg(kvh_put(c, keys, n, seed) == 0, "put: %s", kvh_error());
    KVH_OK(c, kvnode_get_begin(c, keys, n, &lease, locs, &got));
    ck_assert_uint_eq(got, n);
    for (size_t i = 0; i < got; i++) {
        uint64_t off = kvh_host_offset(locs[i].ptr);
        ck_assert_msg(off != UINT64_MAX, "block %zu is in no mapping of the host memfd", i);
        inside += off >= lo && off + BB <= hi;
    }
    KVH_OK(c, kvnode_get_end(c, lease));
    ck_assert_msg(kvh_get_zc_verify(c, keys, n, seed, &got) == 0 && got == n, "verify: %s",
                  kvh_error());
    return inside;
}

START_TEST(blocks_land_on_their_gpus_node)
{
    kvh_daemon d;
    kvh_spawn_opts o = { .env = env };
    bool real_node1 = access("/sys/devices/system/node/node1", F_OK) == 0;

    make_machine();
    ck_assert_msg(kvh_start_ex(&d, TIER, &o) == 0, "kvnoded did not start: %s", kvh_error());
    wait_populated(&d);
    json_t *st = kvh_stats(&d);
    ck_assert_str_eq(json_string_value(kvh_json_get(st, "tiers.host.numa")), "per GPU");
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.0.node"), 0);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.0.gpus"), 2);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.0.capacity_bytes"), (long long)(64 * MiB));
    ck_assert(json_is_true(kvh_json_get(st, "tiers.host.numa_regions.0.placed")));
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.1.node"), 1);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.1.gpus"), 1);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.1.capacity_bytes"), (long long)(32 * MiB));
    ck_assert(json_is_true(kvh_json_get(st, "tiers.host.numa_regions.1.placed")) == real_node1);
    ck_assert_ptr_null(kvh_json_get(st, "tiers.host.numa_regions.2"));
    json_decref(st);

    kvnode_layout la = kvh_layout("numa-a", BB, 1, 0);
    kvnode_client *on_node1, *on_node0;
    KVH_OK(NULL, kvnode_connect_device(d.sock, &la, 2, &on_node1));
    KVH_OK(NULL, kvnode_connect_device(d.sock, &la, 0, &on_node0));

    kvnode_key k1[16], k0[16];
    kvh_chain(k1, 16, 1);
    kvh_chain(k0, 16, 2);
    ck_assert_uint_eq(put_count_in(on_node1, k1, 16, 11, 64 * MiB, 96 * MiB), 16);
    ck_assert_uint_eq(put_count_in(on_node0, k0, 16, 12, 0, 64 * MiB), 16);
    st = kvh_stats(&d);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.1.used_bytes"), 16 * BB);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.0.used_bytes"), 16 * BB);
    json_decref(st);

    /* Fill node 1's share (128 blocks of 256 KiB), then 8 more spill over. */
    size_t in_node1 = 16;
    for (uint64_t round = 0; round < 7; round++) {
        kvnode_key k[16];
        kvh_chain(k, 16, 100 + round);
        in_node1 += put_count_in(on_node1, k, 16, 200 + round, 64 * MiB, 96 * MiB);
    }
    ck_assert_uint_eq(in_node1, 128);
    kvnode_key spill[16];
    kvh_chain(spill, 16, 500);
    ck_assert_uint_eq(put_count_in(on_node1, spill, 16, 501, 0, 64 * MiB), 16);
    st = kvh_stats(&d);
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.1.used_bytes"), (long long)(32 * MiB));
    ck_assert_int_eq(kvh_json_int(st, "tiers.host.numa_regions.0.used_bytes"), 32 * BB);
    json_decref(st);
    /* The first blocks are still there, byte-exact. */
    size_t got;
    ck_assert_msg(kvh_get_zc_verify(on_node1, k1, 16, 11, &got) == 0 && got == 16, "%s", kvh_error());
    ck_assert_msg(kvh_get_zc_verify(on_node0, k0, 16, 12, &got) == 0 && got == 16, "%s", kvh_error());

    kvnode_close(on_node1);
    kvnode_close(on_node0);
    ck_assert_int_eq(kvh_stop(&d, 10000), 0);
    kvh_destroy(&d);
    fake_sysfs_remove(root);
}
END_TEST

START_TEST(numa_off_places_nothing)
{
    kvh_daemon d;
    kvh_spawn_opts o = { .env = env };

    make_machine();
    ck_assert_msg(kvh_start_ex(&d, TIER "memory.numa=off\n", &o) == 0, "kvnoded did not start: %s",
                  kvh_error());
    json_t *st = kvh_stats(&d);
    ck_assert_str_eq(json_string_value(kvh_json_get(st, "tiers.host.numa")), "off");
    ck_assert_ptr_null(kvh_json_get(st, "tiers.host.numa_regions"));
    json_decref(st);
    ck_assert_int_eq(kvh_stop(&d, 10000), 0);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, "memory.numa=off"), "the log does not say memory.numa=off");
    free(log);
    kvh_destroy(&d);
    fake_sysfs_remove(root);
}
END_TEST

START_TEST(demoted_blocks_go_to_their_gpus_node)
{
    kvh_daemon d;
    const char *envs[] = { env_root, NULL };
    kvh_spawn_opts o = { .env = envs };
    enum { HBB = 16u << 10, N = 64 };   /* 1 MiB of HBM: 64 blocks, high watermark 90% */

    snprintf(root, sizeof root, "%s/kvnode-numa-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(root));
    ck_assert_int_eq(fake_sysfs_nodes(root, 2), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:3b:00.0", "0x10de\n", "0x030200\n", 0), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:af:00.0", "0x10de\n", "0x030200\n", 1), 0);
    snprintf(env_root, sizeof env_root, "KVNODE_SYSFS_ROOT=%s", root);
    ck_assert_msg(kvh_start_ex(&d, "memory.host_bytes=8MiB\nmemory.slab_bytes=256KiB\n"
                                   "hbm.backend=sim\nhbm.bytes=1MiB\nadmin.listen=127.0.0.1:0\n", &o) == 0,
                  "kvnoded did not start: %s", kvh_error());
    kvnode_layout la = kvh_layout("numa-hbm", HBB, 1, 0);
    kvnode_client *c;
    KVH_OK(NULL, kvnode_connect_device(d.sock, &la, 1, &c));
    kvnode_key keys[N];
    kvnode_loc locs[N];
    kvnode_lease lease;
    kvh_chain(keys, N, 7);
    KVH_OK(c, kvnode_put_begin(c, keys, N, KVNODE_TIER_HBM, &lease, locs));
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(locs[i].tier, KVNODE_TIER_HBM);
        kvh_fill(locs[i].ptr, HBB, keys[i], 70);
    }
    KVH_OK(c, kvnode_put_commit(c, lease));

    /* Demotion brings device 1's arena down to its low watermark. */
    long long demoted = 0, region0 = -1, region1 = -1;
    uint64_t t0 = kvh_now_ms();
    while (kvh_now_ms() - t0 < 10000) {
        json_t *st = kvh_stats(&d);
        demoted = kvh_json_int(st, "demotions.blocks_total");
        region0 = kvh_json_int(st, "tiers.host.numa_regions.0.used_bytes");
        region1 = kvh_json_int(st, "tiers.host.numa_regions.1.used_bytes");
        json_decref(st);
        if (demoted > 0 && region1 == demoted * HBB)
            break;
        kvh_sleep_ms(20);
    }
    ck_assert_msg(demoted > 0, "nothing was demoted");
    ck_assert_int_eq(region1, demoted * HBB);
    ck_assert_int_eq(region0, 0);
    size_t got;
    ck_assert_msg(kvh_get_zc_verify(c, keys, N, 70, &got) == 0 && got == N, "verify: %s", kvh_error());
    kvnode_close(c);
    ck_assert_int_eq(kvh_stop(&d, 10000), 0);
    kvh_destroy(&d);
    fake_sysfs_remove(root);
}
END_TEST

static Suite *numa_suite(void)
{
    Suite *s = suite_create("daemon_numa");
    TCase *tc = tcase_create("placement");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, blocks_land_on_their_gpus_node);
    tcase_add_test(tc, numa_off_places_nothing);
    tcase_add_test(tc, demoted_blocks_go_to_their_gpus_node);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(numa_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
