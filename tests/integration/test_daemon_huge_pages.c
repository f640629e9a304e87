/* memory.huge_pages: `on` without huge pages fails the start naming the
 * reason; `auto` falls back and says so in the log and /stats; with a small
 * hugetlb pool reserved for the test (root only: vm.nr_hugepages, restored
 * by an unchecked fixture in the runner process, so even a failed or
 * timed-out test gives the pages back) the host arena is backed by it. */
#include <check.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>

#include "harness.h"

#define MiB (UINT64_C(1) << 20)
#define POOL_PAGES 64u                 /* 64 x 2MiB = 128MiB, only while this test runs */
#define HOST_BYTES (64 * MiB)          /* the daemon's host tier: 32 pages of the pool */
#define BLOCK (256u * 1024u)

static const char *const nr_hugepages_path = "/proc/sys/vm/nr_hugepages";
/* The hugetlb pool is the machine's, not this run's: two runs of this suite
 * at once (two checkouts tested side by side) take turns, by this lock held
 * for the whole run (a fixed path: TMPDIR may differ between the runs). */
static const char *const pool_lock_path = "/tmp/kvnode-tests-hugetlb.lock";

/* One "Key:   N" figure of /proc/meminfo; -1 when absent. */
static long long meminfo_field(const char *key)
{
    size_t len;
    char *text = kvh_read_file("/proc/meminfo", &len);
    long long v = -1;
    char *p = text ? strstr(text, key) : NULL;
    if (p)
        v = strtoll(p + strlen(key), NULL, 10);
    free(text);
    return v;
}

/* The selected word of shmem_enabled, "" when unreadable. */
static void shmem_thp(char *out, size_t len)
{
    size_t n;
    char *text = kvh_read_file("/sys/kernel/mm/transparent_hugepage/shmem_enabled", &n);
    char *l = text ? strchr(text, '[') : NULL, *r = l ? strchr(l, ']') : NULL;
    snprintf(out, len, "%.*s", l && r ? (int)(r - l - 1) : 0, l && r ? l + 1 : "");
    free(text);
}

static bool shmem_thp_allowed(void)
{
    char thp[32];
    shmem_thp(thp, sizeof thp);
    return strcmp(thp, "always") == 0 || strcmp(thp, "within_size") == 0 || strcmp(thp, "advise") == 0 ||
           strcmp(thp, "force") == 0;
}

static long long read_nr_hugepages(void)
{
    FILE *f = fopen(nr_hugepages_path, "re");
    long long v = -1;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static int write_nr_hugepages(long long v)
{
    FILE *f = fopen(nr_hugepages_path, "we");
    if (!f)
        return -1;
    int ok = fprintf(f, "%lld\n", v) > 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* `on` asks for more than the pool has, with shmem THP off: the start fails
 * naming both. */
START_TEST(test_on_without_huge_pages_fails)
{
    char thp[32];
    shmem_thp(thp, sizeof thp);
    if (shmem_thp_allowed()) {
        fprintf(stderr, "SKIP test_on_without_huge_pages_fails: shmem_enabled is '%s', so `on` would use "
                "transparent huge pages\n", thp);
        return;
    }
    long long free_pages = meminfo_field("HugePages_Free:");
    long long page_kb = meminfo_field("Hugepagesize:");
    ck_assert_msg(free_pages >= 0 && page_kb == 2048, "meminfo: HugePages_Free %lld Hugepagesize %lld kB",
                  free_pages, page_kb);
    /* More than the pool holds: 32 pages beyond what is free. */
    uint64_t want = ((uint64_t)free_pages + 32) * 2 * MiB;
    if (want > 1024 * MiB) {
        fprintf(stderr, "SKIP test_on_without_huge_pages_fails: the hugetlb pool has %lld free pages; asking "
                "for more would take over 1GiB\n", free_pages);
        return;
    }
    char conf[128];
    snprintf(conf, sizeof conf, "memory.huge_pages=on\nmemory.host_bytes=%" PRIu64 "MiB\nmemory.slab_bytes=2MiB",
             want / MiB);
    kvh_daemon d;
    ck_assert_msg(kvh_spawn(&d, conf) == 0, "spawn: %s", kvh_error());
    int st = kvh_wait_exit(&d, 10000);
    char *log = kvh_read_log(&d);
    ck_assert_msg(st != KVH_EXIT_TIMEOUT && st != 0, "huge_pages = on without huge pages: status %d; log:\n%s",
                  st, log ? log : "");
    char pool[128], shm[96];
    snprintf(pool, sizeof pool, "the hugetlb pool has %lld free 2MiB pages, %" PRIu64 " needed", free_pages,
             want / (2 * MiB));
    snprintf(shm, sizeof shm, "shmem_enabled is '%s'", thp);
    ck_assert_msg(log && strstr(log, "memory.huge_pages = on"), "log does not name the option:\n%s", log);
    ck_assert_msg(strstr(log, pool), "log does not say '%s':\n%s", pool, log);
    ck_assert_msg(strstr(log, shm), "log does not say '%s':\n%s", shm, log);
    free(log);
    kvh_destroy(&d);
}
END_TEST

/* `auto` uses what the machine offers, and says which. */
START_TEST(test_auto_falls_back)
{
    long long free_pages = meminfo_field("HugePages_Free:") - meminfo_field("HugePages_Rsvd:");
    const char *want = free_pages >= (long long)(HOST_BYTES / (2 * MiB)) ? "hugetlb 2MiB"
                     : shmem_thp_allowed() ? "thp" : "off";
    long long want_page = strcmp(want, "off") == 0 ? sysconf(_SC_PAGESIZE) : (long long)(2 * MiB);
    kvh_daemon d;
    ck_assert_msg(kvh_start(&d, "memory.huge_pages=auto") == 0, "start: %s", kvh_error());
    json_t *s = kvh_stats(&d);
    ck_assert_msg(s, "stats: %s", kvh_error());
    json_t *hp = kvh_json_get(s, "tiers.host.huge_pages");
    ck_assert_msg(hp && json_is_string(hp), "/stats has no tiers.host.huge_pages");
    ck_assert_str_eq(json_string_value(hp), want);
    ck_assert_int_eq(kvh_json_int(s, "tiers.host.page_size"), want_page);
    json_decref(s);
    char *log = kvh_read_log(&d);
    if (strcmp(want, "off") == 0)
        ck_assert_msg(log && strstr(log, "host memory: ordinary pages") && strstr(log, "no huge pages: "),
                      "the log does not say auto fell back to ordinary pages:\n%s", log ? log : "");
    else
        ck_assert_msg(log && strstr(log, want), "the log does not say '%s':\n%s", want, log ? log : "");
    free(log);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* The pool for test_hugetlb_pool: reserved and restored in the runner
 * process (unchecked fixture), so the pages go back whatever the test did. */
static long long pool_old = -1;
static char pool_skip[256];

static void pool_reserve(void)
{
    pool_skip[0] = '\0';
    pool_old = -1;
    if (geteuid() != 0) {
        snprintf(pool_skip, sizeof pool_skip, "not root: cannot write %s", nr_hugepages_path);
        return;
    }
    if (meminfo_field("Hugepagesize:") != 2048) {
        snprintf(pool_skip, sizeof pool_skip, "the default huge page size is not 2MiB");
        return;
    }
    long long old = read_nr_hugepages();
    long long free_before = meminfo_field("HugePages_Free:");
    if (old < 0 || free_before < 0) {
        snprintf(pool_skip, sizeof pool_skip, "cannot read %s or HugePages_Free", nr_hugepages_path);
        return;
    }
    pool_old = old;
    if (write_nr_hugepages(old + POOL_PAGES) != 0) {
        snprintf(pool_skip, sizeof pool_skip, "cannot write %s", nr_hugepages_path);
        return;
    }
    long long got = meminfo_field("HugePages_Free:") - free_before;
    if (got < POOL_PAGES)
        snprintf(pool_skip, sizeof pool_skip, "the kernel gave %lld of %u huge pages asked for (fragmented "
                 "memory?)", got, POOL_PAGES);
}

static void pool_restore(void)
{
    if (pool_old < 0)
        return;
    if (write_nr_hugepages(pool_old) != 0 || read_nr_hugepages() != pool_old)
        fprintf(stderr, "WARNING: could not restore %s to %lld (now %lld): restore it by hand\n",
                nr_hugepages_path, pool_old, read_nr_hugepages());
    pool_old = -1;
}

START_TEST(test_hugetlb_pool)
{
    if (pool_skip[0]) {
        fprintf(stderr, "SKIP test_hugetlb_pool: %s\n", pool_skip);
        return;
    }
    long long free_before = meminfo_field("HugePages_Free:");
    kvh_daemon d;
    ck_assert_msg(kvh_start(&d, "memory.huge_pages=on\nmemory.host_bytes=64MiB") == 0, "start: %s", kvh_error());
    long long free_during = meminfo_field("HugePages_Free:");
    ck_assert_msg(free_before - free_during == (long long)(HOST_BYTES / (2 * MiB)),
                  "HugePages_Free %lld before the daemon, %lld while it runs: expected a drop of %" PRIu64,
                  free_before, free_during, HOST_BYTES / (2 * MiB));

    json_t *s = kvh_stats(&d);
    ck_assert_msg(s, "stats: %s", kvh_error());
    ck_assert_str_eq(json_string_value(kvh_json_get(s, "tiers.host.huge_pages")), "hugetlb 2MiB");
    ck_assert_int_eq(kvh_json_int(s, "tiers.host.page_size"), (long long)(2 * MiB));
    ck_assert_int_eq(kvh_json_int(s, "tiers.host.capacity_bytes"), (long long)HOST_BYTES);
    json_decref(s);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, "host memory: hugetlb 2MiB pages"), "log:\n%s", log ? log : "");
    free(log);

    /* A client maps the hugetlb memfd; blocks come back byte-exact, inline and zero-copy. */
    kvnode_layout lay = kvh_layout("huge-model", BLOCK, 1, 0);
    kvnode_client *c;
    ck_assert_msg(kvh_connect(&d, &lay, &c) == 0, "connect: %s", kvh_error());
    kvnode_key keys[16];
    kvh_chain(keys, 16, 0x4855474531ULL);
    KVH_OK(c, kvh_put(c, keys, 16, 11));
    size_t got = 0;
    KVH_OK(c, kvh_get_verify(c, keys, 16, 11, 1, &got));
    ck_assert_uint_eq(got, 16);
    KVH_OK(c, kvh_get_zc_verify(c, keys, 16, 11, &got));
    ck_assert_uint_eq(got, 16);
    kvnode_close(c);

    KVH_STOP_DESTROY(&d);
    ck_assert_int_eq(meminfo_field("HugePages_Free:"), free_before);
}
END_TEST

/* Each tenant's arena comes from the pool too: three of 16MiB, 8 pages each. */
START_TEST(test_hugetlb_pool_tenants)
{
    if (pool_skip[0]) {
        fprintf(stderr, "SKIP test_hugetlb_pool_tenants: %s\n", pool_skip);
        return;
    }
    long long free_before = meminfo_field("HugePages_Free:");
    kvh_daemon d;
    ck_assert_msg(kvh_start(&d, "memory.huge_pages=on\nmemory.host_bytes=48MiB\nmemory.slab_bytes=1MiB\n"
                                "tenant.alpha.uids=65534\ntenant.alpha.host_bytes=16MiB\n"
                                "tenant.beta.uids=65533\ntenant.beta.host_bytes=16MiB\n") == 0,
                  "start: %s", kvh_error());
    long long free_during = meminfo_field("HugePages_Free:");
    ck_assert_msg(free_before - free_during == 24, "HugePages_Free %lld before, %lld while the daemon runs: "
                  "expected 3 arenas x 8 pages = 24", free_before, free_during);
    char *log = kvh_read_log(&d);
    ck_assert_msg(log && strstr(log, "tenant alpha: host memory: hugetlb 2MiB pages") &&
                  strstr(log, "tenant beta: host memory: hugetlb 2MiB pages"), "log:\n%s", log ? log : "");
    free(log);
    json_t *s = kvh_stats(&d);
    ck_assert_msg(s, "stats: %s", kvh_error());
    ck_assert_str_eq(json_string_value(kvh_json_get(s, "tiers.host.huge_pages")), "hugetlb 2MiB");
    json_decref(s);
    KVH_STOP_DESTROY(&d);
    ck_assert_int_eq(meminfo_field("HugePages_Free:"), free_before);
}
END_TEST

int main(void)
{
    int lock = open(pool_lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (lock < 0 || flock(lock, LOCK_EX) != 0)
        fprintf(stderr, "warning: cannot lock %s (%m): another run of this suite may change the hugetlb pool "
                "meanwhile\n", pool_lock_path);
    Suite *s = suite_create("daemon_huge_pages");
    TCase *tc = tcase_create("fallback");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_on_without_huge_pages_fails);
    tcase_add_test(tc, test_auto_falls_back);
    suite_add_tcase(s, tc);

    TCase *pool = tcase_create("hugetlb_pool");
    tcase_set_timeout(pool, 30);
    tcase_add_unchecked_fixture(pool, pool_reserve, pool_restore);
    tcase_add_test(pool, test_hugetlb_pool);
    tcase_add_test(pool, test_hugetlb_pool_tenants);
    suite_add_tcase(s, pool);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (lock >= 0)
        close(lock);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
