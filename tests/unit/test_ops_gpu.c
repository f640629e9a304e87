/* Unit tests of which HBM arena HELLO lends a client: the client's own GPU,
 * found by PCI bus id compared as numbers (an engine whose
 * CUDA_VISIBLE_DEVICES renumbers the GPUs still gets its own, whichever tool
 * spelled the id); by ordinal only when the client sent no bus id; never
 * another GPU's, never to a client without a device. */
#include <check.h>
#include <stdlib.h>

#include "cache/cache.h"
#include "kvnode.h"
#include "net/ops.h"

static struct cache_arena_info hbm(int device, const char *bus)
{
    struct cache_arena_info a = { .id = (uint32_t)device + 1, .tier = KVNODE_TIER_HBM,
                                  .device = device, .size = 1u << 20, .fd = -1,
                                  .pci_bus_id = bus };
    return a;
}

START_TEST(matches_by_bus_id_whatever_the_ordinal)
{
    struct cache_arena_info gpu3 = hbm(3, "0000:3B:00.0");
    /* A container that sees only this GPU calls it device 0. */
    ck_assert(ops_arena_is_clients_gpu(&gpu3, 0, "0000:3b:00.0"));
    ck_assert(ops_arena_is_clients_gpu(&gpu3, 3, "0000:3B:00.0"));
    /* Same ordinal, another GPU: not lent. */
    ck_assert(!ops_arena_is_clients_gpu(&gpu3, 3, "0000:5E:00.0"));
}
END_TEST

START_TEST(bus_ids_compare_as_numbers)
{
    struct cache_arena_info gpu = hbm(1, "0000:5E:00.0");
    /* nvidia-smi's 8-digit domain, sysfs's lower case. */
    ck_assert(ops_arena_is_clients_gpu(&gpu, 0, "00000000:5E:00.0"));
    ck_assert(ops_arena_is_clients_gpu(&gpu, 0, "0000:5e:00.0"));
    ck_assert(ops_arena_is_clients_gpu(&gpu, 7, "00000000:5e:00.0"));
    /* Another function, device, bus or domain is another GPU. */
    ck_assert(!ops_arena_is_clients_gpu(&gpu, 1, "0000:5E:00.1"));
    ck_assert(!ops_arena_is_clients_gpu(&gpu, 1, "0000:5E:01.0"));
    ck_assert(!ops_arena_is_clients_gpu(&gpu, 1, "0000:5F:00.0"));
    ck_assert(!ops_arena_is_clients_gpu(&gpu, 1, "0001:5E:00.0"));
    /* Not bus ids: no match, and no ordinal guess either. */
    ck_assert(!ops_arena_is_clients_gpu(&gpu, 1, "0000:5E:00"));
    ck_assert(!ops_arena_is_clients_gpu(&gpu, 1, " 0000:5E:00.0"));
    ck_assert(!ops_arena_is_clients_gpu(&gpu, 1, "0000:5E:00.0x"));
    ck_assert(!ops_arena_is_clients_gpu(&gpu, 1, "GPU-1"));
}
END_TEST

START_TEST(ordinal_only_without_a_bus_id)
{
    struct cache_arena_info known = hbm(1, "0000:3B:00.0"), unknown = hbm(1, "");
    ck_assert(ops_arena_is_clients_gpu(&known, 1, ""));
    ck_assert(ops_arena_is_clients_gpu(&known, 1, NULL));
    ck_assert(!ops_arena_is_clients_gpu(&known, 0, NULL));
    /* A client that names its GPU gets that GPU or none: an arena whose
     * bus id the daemon could not read is not guessed by ordinal. */
    ck_assert(!ops_arena_is_clients_gpu(&unknown, 1, "0000:3B:00.0"));
    ck_assert(!ops_arena_is_clients_gpu(&unknown, 2, "0000:3B:00.0"));
    ck_assert(!ops_arena_is_clients_gpu(&known, 1, "0000:99:00.0"));
    struct cache_arena_info sim = hbm(0, "sim:0");
    ck_assert(ops_arena_is_clients_gpu(&sim, 0, ""));
    ck_assert(ops_arena_is_clients_gpu(&sim, 5, "sim:0"));
    ck_assert(!ops_arena_is_clients_gpu(&sim, 0, "sim:1"));
    ck_assert(!ops_arena_is_clients_gpu(&sim, 0, "0000:3B:00.0"));
}
END_TEST

START_TEST(never_without_a_device_or_for_host_memory)
{
    struct cache_arena_info gpu0 = hbm(0, "0000:3B:00.0");
    struct cache_arena_info host = { .id = 0, .tier = KVNODE_TIER_HOST, .device = -1, .fd = 3 };
    ck_assert(!ops_arena_is_clients_gpu(&gpu0, -1, "0000:3B:00.0"));
    ck_assert(!ops_arena_is_clients_gpu(&gpu0, -1, NULL));
    ck_assert(!ops_arena_is_clients_gpu(&host, 0, NULL));
    ck_assert(!ops_arena_is_clients_gpu(&host, -1, NULL));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_gpu");
    TCase *tc = tcase_create("lending");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, matches_by_bus_id_whatever_the_ordinal);
    tcase_add_test(tc, bus_ids_compare_as_numbers);
    tcase_add_test(tc, ordinal_only_without_a_bus_id);
    tcase_add_test(tc, never_without_a_device_or_for_host_memory);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
