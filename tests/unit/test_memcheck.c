/* Unit tests for daemon/memcheck.c: the admission check of the memory tiers
 * against fake /proc/meminfo, /proc/self/cgroup and cgroup trees (v2 and
 * v1) in a temporary directory. Nothing here reserves memory. */
#include "config/config.h"
#include "memcheck.h"
#include "../common/proc.h"

#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)

static char base[256];   /* made once, in the runner: removed even after a failed test */
static char root[300];   /* per-test fake filesystem, under base */
static char meminfo[340], self_cgroup[340], cgroup_root[340];
static struct memcheck_sources src;

/* Writes text to root/rel, making the directories on the way. */
static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        ck_assert_msg(mkdir(path, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", path, strerror(errno));
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* A meminfo with the given MemTotal and MemAvailable (bytes, whole KiB). */
static void put_meminfo(uint64_t total, uint64_t available)
{
    char text[512];
    snprintf(text, sizeof text,
             "MemTotal:       %" PRIu64 " kB\nMemFree:        1024 kB\nMemAvailable:   %" PRIu64 " kB\n"
             "Buffers:          0 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n",
             total / 1024, available / 1024);
    put("proc/meminfo", text);
}

static void remove_tree(const char *dir)
{
    const char *rm[] = { "rm", "-rf", dir, NULL };
    ck_assert_int_eq(proc_run(&(struct proc_opts){ .argv = rm }, 5000, NULL, NULL), 0);
}

static void make_base(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(base, sizeof base, "%s/kvnode-memcheck-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(base));
}

static void remove_base(void)
{
    remove_tree(base);
}

static void setup(void)
{
    snprintf(root, sizeof root, "%s/t-XXXXXX", base);
    ck_assert_ptr_nonnull(mkdtemp(root));
    snprintf(meminfo, sizeof meminfo, "%s/proc/meminfo", root);
    snprintf(self_cgroup, sizeof self_cgroup, "%s/proc/self/cgroup", root);
    snprintf(cgroup_root, sizeof cgroup_root, "%s/sys/fs/cgroup", root);
    src = (struct memcheck_sources){ .meminfo = meminfo, .self_cgroup = self_cgroup, .cgroup_root = cgroup_root };
}

static void teardown(void)
{
    remove_tree(root);
}

/* A config with the given host tier (default 16MiB slabs). */
static struct kvn_config host_tier(uint64_t host_bytes)
{
    struct kvn_config c;
    config_defaults(&c);
    c.host_bytes = host_bytes;
    return c;
}

START_TEST(test_margin)
{
    /* 1/64 of the memory, at least 256MiB. */
    ck_assert_uint_eq(memcheck_margin(GIB), 256 * MIB);
    ck_assert_uint_eq(memcheck_margin(16 * GIB), 256 * MIB);
    ck_assert_uint_eq(memcheck_margin(24 * GIB), 384 * MIB);
    ck_assert_uint_eq(memcheck_margin(2 * TIB), 32 * GIB);
    ck_assert_uint_eq(memcheck_margin(MEMCHECK_UNKNOWN), 256 * MIB);
}
END_TEST

START_TEST(test_meminfo_only)
{
    /* 32GiB machine, 20GiB available, no cgroup limit anywhere (v2 "max"). */
    put_meminfo(32 * GIB, 20 * GIB);
    put("proc/self/cgroup", "0::/system.slice/kvnoded.service\n");
    put("sys/fs/cgroup/system.slice/kvnoded.service/memory.max", "max\n");
    put("sys/fs/cgroup/system.slice/kvnoded.service/memory.current", "1048576\n");
    struct memcheck_room room;
    memcheck_probe(&src, &room);
    ck_assert_uint_eq(room.mem_total, 32 * GIB);
    ck_assert_uint_eq(room.mem_available, 20 * GIB);
    ck_assert_uint_eq(room.cgroup_limit, MEMCHECK_UNKNOWN);
    ck_assert_str_eq(room.unread, "");

    /* The margin is 512MiB (32GiB / 64): 20GiB - 512MiB = 19968MiB fits, one slab more does not. */
    char msg[2048];
    struct kvn_config c = host_tier(19968 * MIB);
    ck_assert_msg(memcheck_admit(&c, &room, msg, sizeof msg) == 0, "%s", msg);
    ck_assert_msg(strstr(msg, "memory: reserving 20937965568 bytes (19.5GiB) of host memory for memory.host_bytes; "
                              "19.5GiB may be reserved (MemAvailable 20GiB, no cgroup memory limit"), "%s", msg);
    c = host_tier(19968 * MIB + 16 * MIB);
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
    ck_assert_msg(strstr(msg, "memory.host_bytes: 19.5GiB (20954742784 bytes) exceeds the host memory this machine "
                              "can give: MemAvailable is 20GiB (21474836480 bytes, /proc/meminfo) and 512MiB is "
                              "kept free, which leaves 19.5GiB; lower memory.host_bytes to at most 19968MiB"), "%s",
                  msg);

    /* 100TiB is refused whatever the machine. */
    c = host_tier(100 * TIB);
    c.slab_bytes = GIB;
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
    ck_assert_msg(strstr(msg, "memory.host_bytes: 100TiB (109951162777600 bytes) exceeds"), "%s", msg);
}
END_TEST

START_TEST(test_cgroup_v2_limit_wins)
{
    /* MemAvailable 20GiB, but the service may hold 4GiB and holds 1GiB, of
     * which 512MiB is page cache: 4GiB - 512MiB - 256MiB margin = 3328MiB. */
    put_meminfo(32 * GIB, 20 * GIB);
    put("proc/self/cgroup", "0::/system.slice/kvnoded.service\n");
    put("sys/fs/cgroup/system.slice/kvnoded.service/memory.max", "4294967296\n");
    put("sys/fs/cgroup/system.slice/kvnoded.service/memory.current", "1073741824\n");
    put("sys/fs/cgroup/system.slice/kvnoded.service/memory.stat",
        "anon 268435456\nfile 805306368\nshmem 268435456\nactive_file 268435456\ninactive_file 268435456\n");
    struct memcheck_room room;
    memcheck_probe(&src, &room);
    ck_assert_uint_eq(room.cgroup_limit, 4 * GIB);
    ck_assert_uint_eq(room.cgroup_usage, 512 * MIB);
    char want[1024];
    snprintf(want, sizeof want, "%s/system.slice/kvnoded.service/memory.max", cgroup_root);
    ck_assert_str_eq(room.cgroup_file, want);

    char msg[2048];
    struct kvn_config c = host_tier(3328 * MIB);
    ck_assert_msg(memcheck_admit(&c, &room, msg, sizeof msg) == 0, "%s", msg);
    c = host_tier(3344 * MIB);
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
    snprintf(want, sizeof want,
             "memory.host_bytes: 3.3GiB (3506438144 bytes) exceeds what kvnoded's cgroup may still hold: its "
             "memory limit is 4GiB (4294967296 bytes, %s/system.slice/kvnoded.service/memory.max), 512MiB of it "
             "is in use, and 256MiB is kept free, which leaves 3.2GiB; lower memory.host_bytes to at most 3328MiB, "
             "or raise the limit", cgroup_root);
    ck_assert_msg(strstr(msg, want), "'%s' missing from:\n%s", want, msg);

    /* Without memory.stat, the whole usage counts. */
    char stat[600];
    snprintf(stat, sizeof stat, "%s/system.slice/kvnoded.service/memory.stat", cgroup_root);
    ck_assert_int_eq(unlink(stat), 0);
    memcheck_probe(&src, &room);
    ck_assert_uint_eq(room.cgroup_usage, GIB);
    c = host_tier(3328 * MIB);
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
}
END_TEST

START_TEST(test_cgroup_ancestor_and_v1)
{
    /* The leaf has no limit; its parent slice has 2GiB, the one above 1TiB:
     * the tightest ancestor binds. */
    put_meminfo(64 * GIB, 60 * GIB);
    put("proc/self/cgroup", "0::/kv.slice/kvnoded.service/\n");
    put("sys/fs/cgroup/kv.slice/kvnoded.service/memory.max", "max\n");
    put("sys/fs/cgroup/kv.slice/memory.max", "2147483648\n");
    put("sys/fs/cgroup/kv.slice/memory.current", "0\n");
    put("sys/fs/cgroup/memory.max", "1099511627776\n");
    struct memcheck_room room;
    memcheck_probe(&src, &room);
    ck_assert_uint_eq(room.cgroup_limit, 2 * GIB);
    char want[1024], msg[2048];
    snprintf(want, sizeof want, "%s/kv.slice/memory.max", cgroup_root);
    ck_assert_str_eq(room.cgroup_file, want);
    struct kvn_config c = host_tier(2 * GIB);
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
    ck_assert_msg(strstr(msg, want), "%s", msg);

    /* cgroup v1: the memory hierarchy's limit; v1's "no limit" value is none. */
    teardown();
    setup();
    put_meminfo(64 * GIB, 60 * GIB);
    put("proc/self/cgroup", "9:pids:/\n4:cpu,memory:/jobs/42\n1:name=systemd:/\n0::/\n");
    put("sys/fs/cgroup/memory/jobs/42/memory.limit_in_bytes", "9223372036854771712\n");
    put("sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", "8589934592\n");
    put("sys/fs/cgroup/memory/jobs/memory.usage_in_bytes", "2147483648\n");
    put("sys/fs/cgroup/memory/jobs/memory.stat",
        "cache 1073741824\nactive_file 1\ntotal_active_file 536870912\ntotal_inactive_file 536870912\n");
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    memcheck_probe(&src, &room);
    ck_assert_uint_eq(room.cgroup_limit, 8 * GIB);
    ck_assert_uint_eq(room.cgroup_usage, GIB);
    snprintf(want, sizeof want, "%s/memory/jobs/memory.limit_in_bytes", cgroup_root);
    ck_assert_str_eq(room.cgroup_file, want);
    /* 8GiB - 1GiB - 256MiB */
    c = host_tier(7 * GIB - 256 * MIB);
    ck_assert_msg(memcheck_admit(&c, &room, msg, sizeof msg) == 0, "%s", msg);
    c = host_tier(7 * GIB - 240 * MIB);
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
    ck_assert_msg(strstr(msg, "lower memory.host_bytes to at most 6912MiB"), "%s", msg);
}
END_TEST

START_TEST(test_unreadable)
{
    /* Nothing readable: nothing refuses, and the log line says what was not checked. */
    struct memcheck_room room;
    memcheck_probe(&src, &room);
    ck_assert_uint_eq(room.mem_available, MEMCHECK_UNKNOWN);
    ck_assert_uint_eq(room.cgroup_limit, MEMCHECK_UNKNOWN);
    ck_assert_msg(strstr(room.unread, meminfo) && strstr(room.unread, self_cgroup), "%s", room.unread);
    char msg[2048];
    struct kvn_config c = host_tier(64 * GIB);
    ck_assert_msg(memcheck_admit(&c, &room, msg, sizeof msg) == 0, "%s", msg);
    ck_assert_msg(strstr(msg, "an unknown amount") && strstr(msg, "not checked: "), "%s", msg);

    /* A cgroup path outside our namespace's view ("/../..") is not followed. */
    put_meminfo(32 * GIB, 20 * GIB);
    put("proc/self/cgroup", "0::/../../system.slice\n");
    put("sys/fs/cgroup/memory.max", "1073741824\n");
    memcheck_probe(&src, &room);
    ck_assert_uint_eq(room.cgroup_limit, MEMCHECK_UNKNOWN);
    ck_assert_msg(strstr(room.unread, "cgroup path '/../../system.slice'"), "%s", room.unread);
}
END_TEST

START_TEST(test_demand)
{
    char what[200];
    struct kvn_config c = host_tier(GIB + 5 * MIB);   /* whole 16MiB slabs: 1GiB */
    ck_assert_uint_eq(memcheck_demand(&c, what, sizeof what), GIB);
    ck_assert_str_eq(what, "memory.host_bytes");

    /* hbm.backend = sim keeps each simulated GPU's region in host memory. */
    c.hbm_backend = CONFIG_HBM_SIM;
    c.hbm_bytes = 512 * MIB;
    ck_assert_uint_eq(memcheck_demand(&c, what, sizeof what), GIB + 2 * 512 * MIB);   /* "all": 2 devices */
    ck_assert_msg(strstr(what, "memory.host_bytes + hbm.bytes x 2"), "%s", what);
    snprintf(c.hbm_devices, sizeof c.hbm_devices, "1, 7");   /* 7 is not simulated: left out at start */
    /* memcheck reads the parsed list (hbm_device_list), which config_resolve
     * fills before main.c asks for admission. */
    char problem[CONFIG_ERR_MAX];
    ck_assert_msg(config_resolve(&c, problem, sizeof problem) == 0, "%s", problem);
    ck_assert_uint_eq(memcheck_demand(&c, what, sizeof what), GIB + 512 * MIB);
    c.hbm_backend = CONFIG_HBM_CUDA;   /* device memory is not host memory */
    ck_assert_uint_eq(memcheck_demand(&c, what, sizeof what), GIB);

    /* The sim regions count toward the refusal, which names hbm.bytes too. */
    put_meminfo(16 * GIB, 2 * GIB);
    struct memcheck_room room;
    memcheck_probe(&src, &room);
    c = host_tier(GIB);
    ck_assert_int_eq(memcheck_admit(&c, &room, what, sizeof what), 0);
    c.hbm_backend = CONFIG_HBM_SIM;
    c.hbm_bytes = 512 * MIB;
    char msg[2048];
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
    ck_assert_msg(strstr(msg, "2GiB (2147483648 bytes) exceeds") && strstr(msg, "lower memory.host_bytes (or hbm.bytes)"),
                  "%s", msg);
}
END_TEST

/* With memory.huge_pages auto or on, a host arena the hugetlb pool can hold
 * is held against the pool (its pages are not in MemAvailable). */
START_TEST(test_hugetlb_pool)
{
    char text[512], msg[2048];
    struct memcheck_room room;
    /* 4GiB available; 8192 free 2MiB pages (16GiB), 1024 of them reserved by someone: 14GiB usable. */
    snprintf(text, sizeof text, "MemTotal:       %" PRIu64 " kB\nMemAvailable:   %" PRIu64 " kB\n"
             "HugePages_Total:    8192\nHugePages_Free:     8192\nHugePages_Rsvd:     1024\n"
             "Hugepagesize:       2048 kB\n", 32 * GIB / 1024, 4 * GIB / 1024);
    put("proc/meminfo", text);
    put("proc/self/cgroup", "0::/\n");
    memcheck_probe(&src, &room);
    ck_assert_uint_eq(room.hugetlb_page, 2 * MIB);
    ck_assert_uint_eq(room.hugetlb_free, 14 * GIB);

    struct kvn_config c = host_tier(12 * GIB);
    c.huge_pages = CONFIG_HUGE_AUTO;
    ck_assert_msg(memcheck_admit(&c, &room, msg, sizeof msg) == 0, "%s", msg);
    ck_assert_msg(strstr(msg, "memory.host_bytes comes from the hugetlb pool (14GiB free), not MemAvailable"),
                  "%s", msg);
    c.huge_pages = CONFIG_HUGE_ON;
    ck_assert_msg(memcheck_admit(&c, &room, msg, sizeof msg) == 0, "%s", msg);
    /* off: ordinary pages, held against MemAvailable. */
    c.huge_pages = CONFIG_HUGE_OFF;
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
    ck_assert_msg(strstr(msg, "exceeds the host memory this machine can give: MemAvailable is 4GiB"), "%s", msg);
    /* More than the pool holds: the arena would get ordinary pages, so MemAvailable decides. */
    c = host_tier(15 * GIB);
    c.huge_pages = CONFIG_HUGE_AUTO;
    ck_assert_int_eq(memcheck_admit(&c, &room, msg, sizeof msg), -1);
    ck_assert_msg(strstr(msg, "memory.host_bytes: 15GiB"), "%s", msg);
}
END_TEST

START_TEST(test_format_size)
{
    char buf[32];
    memcheck_format_size(64 * MIB, buf, sizeof buf);
    ck_assert_str_eq(buf, "64MiB");
    memcheck_format_size(100 * TIB, buf, sizeof buf);
    ck_assert_str_eq(buf, "100TiB");
    memcheck_format_size(GIB + GIB / 2, buf, sizeof buf);
    ck_assert_str_eq(buf, "1.5GiB");
    memcheck_format_size(1000, buf, sizeof buf);
    ck_assert_str_eq(buf, "1000B");
    memcheck_format_size(MEMCHECK_UNKNOWN, buf, sizeof buf);
    ck_assert_str_eq(buf, "unknown");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("memcheck");
    TCase *tc = tcase_create("memcheck");
    tcase_set_timeout(tc, 10);
    tcase_add_unchecked_fixture(tc, make_base, remove_base);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_margin);
    tcase_add_test(tc, test_meminfo_only);
    tcase_add_test(tc, test_cgroup_v2_limit_wins);
    tcase_add_test(tc, test_cgroup_ancestor_and_v1);
    tcase_add_test(tc, test_unreadable);
    tcase_add_test(tc, test_demand);
    tcase_add_test(tc, test_hugetlb_pool);
    tcase_add_test(tc, test_format_size);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
