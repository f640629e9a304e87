/* Unit tests for daemon/mem/numa.c on a fake sysfs (tests/common/fake_sysfs.h):
 * which PCI devices count as GPUs and on which node, the per-GPU plan
 * (regions in proportion to each node's GPUs, whole slabs), the fallbacks
 * (off, one node, interleave), finding a client's region by PCI bus id or
 * ordinal, and real mbind/set_mempolicy calls on this machine's node 0. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mem/numa.h"
#include "../common/fake_sysfs.h"

#define MiB (UINT64_C(1) << 20)
#define MPOL_PREFERRED_ 1
#define MPOL_F_ADDR_ (1 << 1)

static char root[256];

/* Two nodes; GPUs 3b (node 0, VGA), 3c (node 0), af (node 1), d8 (node
 * unknown), e0 (a node that does not exist); an NVIDIA audio function and
 * an Intel GPU that are not counted. */
static void make_machine(void)
{
    snprintf(root, sizeof root, "%s/kvnode-numa-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(root));
    ck_assert_int_eq(fake_sysfs_nodes(root, 2), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:af:00.0", "0x10de\n", "0x030200\n", 1), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:3b:00.0", "0x10de\n", "0x030000\n", 0), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:3c:00.0", "0x10de\n", "0x030200\n", 0), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:3b:00.1", "0x10de\n", "0x040300\n", 0), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:00:02.0", "0x8086\n", "0x030000\n", 0), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:d8:00.0", "0x10de\n", "0x030200\n", -1), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:e0:00.0", "0x10de\n", "0x030200\n", 5), 0);
}

static void teardown(void)
{
    fake_sysfs_remove(root);
}

START_TEST(topology_counts_gpus_and_nodes)
{
    struct numa_topology t;
    make_machine();
    numa_read_topology(root, &t);
    ck_assert_uint_eq(t.nodes, 2);
    ck_assert_uint_eq(t.node_mask, 3);
    ck_assert_uint_eq(t.ngpus, 5);
    const char *ids[] = { "0000:3b:00.0", "0000:3c:00.0", "0000:af:00.0", "0000:d8:00.0", "0000:e0:00.0" };
    const int nodes[] = { 0, 0, 1, -1, -1 };
    for (int i = 0; i < 5; i++) {
        ck_assert_str_eq(t.gpus[i].bus_id, ids[i]);
        ck_assert_int_eq(t.gpus[i].node, nodes[i]);
    }
    /* $KVNODE_SYSFS_ROOT is where a NULL root looks. */
    setenv("KVNODE_SYSFS_ROOT", root, 1);
    numa_read_topology(NULL, &t);
    unsetenv("KVNODE_SYSFS_ROOT");
    ck_assert_uint_eq(t.ngpus, 5);
    teardown();
}
END_TEST

START_TEST(plan_splits_by_gpus_per_node)
{
    struct numa_topology t;
    struct numa_plan p;
    make_machine();
    numa_read_topology(root, &t);
    numa_plan_make(&t, true, 96 * MiB, MiB, &p);
    ck_assert_int_eq(p.mode, NUMA_MODE_PER_GPU);
    ck_assert_str_eq(numa_mode_name(p.mode), "per GPU");
    ck_assert_uint_eq(p.nregions, 2);
    ck_assert_int_eq(p.regions[0].node, 0);
    ck_assert_uint_eq(p.regions[0].gpus, 2);
    ck_assert_uint_eq(p.regions[0].start, 0);
    ck_assert_uint_eq(p.regions[0].end, 64 * MiB);
    ck_assert_int_eq(p.regions[1].node, 1);
    ck_assert_uint_eq(p.regions[1].gpus, 1);
    ck_assert_uint_eq(p.regions[1].start, 64 * MiB);
    ck_assert_uint_eq(p.regions[1].end, 96 * MiB);
    ck_assert_uint_eq(numa_region_end(&p, 10 * MiB), 64 * MiB);
    ck_assert_uint_eq(numa_region_end(&p, 70 * MiB), 96 * MiB);
    ck_assert_uint_eq(numa_region_end(&p, 96 * MiB), UINT64_MAX);

    /* Rounding: 3 slabs for 2:1 -> 2 and 1; 2 slabs -> 1 and 1 (each node
     * gets a slab); 1 slab cannot hold two regions: interleave. */
    numa_plan_make(&t, true, 3 * MiB + 5, MiB, &p);
    ck_assert_uint_eq(p.regions[0].end, 2 * MiB);
    ck_assert_uint_eq(p.regions[1].end, 3 * MiB);
    numa_plan_make(&t, true, 2 * MiB, MiB, &p);
    ck_assert_uint_eq(p.regions[0].end, MiB);
    ck_assert_uint_eq(p.regions[1].end, 2 * MiB);
    numa_plan_make(&t, true, MiB, MiB, &p);
    ck_assert_int_eq(p.mode, NUMA_MODE_INTERLEAVE);
    teardown();
}
END_TEST

START_TEST(plan_fallbacks)
{
    struct numa_topology t;
    struct numa_plan p;
    make_machine();
    numa_read_topology(root, &t);
    numa_plan_make(&t, false, 96 * MiB, MiB, &p);
    ck_assert_int_eq(p.mode, NUMA_MODE_OFF);
    ck_assert_str_eq(numa_mode_name(p.mode), "off");
    ck_assert_uint_eq(p.nregions, 0);

    /* No GPU with a known node: the whole arena interleaved. */
    for (size_t i = 0; i < t.ngpus; i++)
        t.gpus[i].node = -1;
    numa_plan_make(&t, true, 96 * MiB, MiB, &p);
    ck_assert_int_eq(p.mode, NUMA_MODE_INTERLEAVE);
    ck_assert_str_eq(numa_mode_name(p.mode), "interleaved");
    ck_assert_uint_eq(p.node_mask, 3);
    teardown();

    /* One node (and a machine without the node directory at all). */
    snprintf(root, sizeof root, "%s/kvnode-numa-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(root));
    numa_read_topology(root, &t);
    ck_assert_uint_eq(t.nodes, 1);
    ck_assert_uint_eq(t.ngpus, 0);
    ck_assert_int_eq(fake_sysfs_nodes(root, 1), 0);
    ck_assert_int_eq(fake_sysfs_pci(root, "0000:3b:00.0", "0x10de\n", "0x030200\n", 0), 0);
    numa_read_topology(root, &t);
    numa_plan_make(&t, true, 96 * MiB, MiB, &p);
    ck_assert_int_eq(p.mode, NUMA_MODE_ONE_NODE);
    ck_assert_str_eq(numa_mode_name(p.mode), "one node");
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, "0000:3b:00.0", 0), -1);
    teardown();
}
END_TEST

START_TEST(region_of_a_clients_gpu)
{
    struct numa_topology t;
    struct numa_plan p;
    make_machine();
    numa_read_topology(root, &t);
    numa_plan_make(&t, true, 96 * MiB, MiB, &p);
    /* By PCI bus id, as CUDA spells it (upper case, 8-digit domain too). */
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, "0000:AF:00.0", 0), 1);
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, "00000000:3b:00.0", 2), 0);
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, "0000:3c:00.0", -1), 0);
    /* A bus id this machine lacks: no guess from the ordinal. */
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, "0000:99:00.0", 2), -1);
    /* No usable bus id ("sim:1", "", NULL): the ordinal in PCI order. */
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, "sim:1", 1), 0);
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, "", 2), 1);
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, NULL, 2), 1);
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, NULL, 3), -1);   /* node unknown */
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, NULL, 4), -1);   /* node does not exist */
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, NULL, 9), -1);
    ck_assert_int_eq(numa_region_of_gpu(&p, &t, NULL, -1), -1);
    teardown();
}
END_TEST

/* Real system calls: node 0 exists on every Linux machine; node 1 may not. */
START_TEST(apply_binds_regions)
{
    struct numa_topology t;
    struct numa_plan p;
    int mode = -1;
    uint64_t mask[2] = { 0, 0 };   /* 65 bits asked for: two words */
    bool real_node1 = access("/sys/devices/system/node/node1", F_OK) == 0;

    make_machine();
    numa_read_topology(root, &t);
    numa_plan_make(&t, true, 4 * MiB, MiB, &p);
    ck_assert_uint_eq(p.nregions, 2);
    char *base = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(base != MAP_FAILED);
    numa_plan_apply(&p, base, 4 * MiB, "the test's");
    ck_assert_msg(p.regions[0].placed, "node 0: %s", p.regions[0].why);
    ck_assert_int_eq(syscall(SYS_get_mempolicy, &mode, mask, 65ul, base, MPOL_F_ADDR_), 0);
    ck_assert_int_eq(mode, MPOL_PREFERRED_);
    ck_assert_uint_eq(mask[0], 1);
    if (!real_node1) {
        ck_assert(!p.regions[1].placed);
        ck_assert_msg(strstr(p.regions[1].why, "node 1") != NULL, "why: %s", p.regions[1].why);
    }

    /* The thread's policy follows the region; back to default after. */
    int last = NUMA_THREAD_UNSET;
    ck_assert_int_eq(numa_thread_policy(&p, 0, &last), 0);
    ck_assert_int_eq(last, 0);
    ck_assert_int_eq(syscall(SYS_get_mempolicy, &mode, mask, 65ul, NULL, 0), 0);
    ck_assert_int_eq(mode, MPOL_PREFERRED_);
    ck_assert_uint_eq(mask[0], 1);
    ck_assert_int_eq(numa_thread_policy(NULL, 0, &last), 0);
    ck_assert_int_eq(last, NUMA_THREAD_DEFAULT);
    ck_assert_int_eq(syscall(SYS_get_mempolicy, &mode, mask, 65ul, NULL, 0), 0);
    ck_assert_int_eq(mode, 0);
    munmap(base, 4 * MiB);
    teardown();
}
END_TEST

static Suite *numa_suite(void)
{
    Suite *s = suite_create("numa");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, topology_counts_gpus_and_nodes);
    tcase_add_test(tc, plan_splits_by_gpus_per_node);
    tcase_add_test(tc, plan_fallbacks);
    tcase_add_test(tc, region_of_a_clients_gpu);
    tcase_add_test(tc, apply_binds_regions);
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
