/* Unit tests for daemon/gpu/devmem*.c: backend choice, the none and sim
 * backends, and the cuda backend as far as the machine allows (it fails
 * cleanly without a GPU; with one, it is exercised lightly). */
#include <check.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "gpu/devmem.h"
#include "kvnode.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

static struct devmem *open_kind(int kind)
{
    struct devmem *dm = NULL;
    char why[256] = "";
    int rc = devmem_open(kind, &dm, why, sizeof why);
    ck_assert_msg(rc == 0, "devmem_open(%s): %d %s", devmem_kind_name(kind), rc, why);
    ck_assert_ptr_nonnull(dm);
    return dm;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31u + seed);
}

/* --- opening ------------------------------------------------------------- */

START_TEST(test_kind_names)
{
    ck_assert_str_eq(devmem_kind_name(DEVMEM_NONE), "none");
    ck_assert_str_eq(devmem_kind_name(DEVMEM_SIM), "sim");
    ck_assert_str_eq(devmem_kind_name(DEVMEM_CUDA), "cuda");
    ck_assert_str_eq(devmem_kind_name(42), "unknown");

    struct devmem *dm = (struct devmem *)1;
    char why[128] = "";
    ck_assert_int_eq(devmem_open(42, &dm, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_ptr_null(dm);
    ck_assert_msg(strstr(why, "42") != NULL, "why: %s", why);
    ck_assert_int_eq(devmem_open(DEVMEM_SIM, NULL, why, sizeof why), -KVNODE_EINVAL);
    devmem_close(NULL);
}
END_TEST

START_TEST(test_none)
{
    struct devmem *dm = open_kind(DEVMEM_NONE);
    struct devmem_region r;
    struct devmem_stream *s = (struct devmem_stream *)1;
    char why[256] = "";
    uint8_t a[16] = { 0 }, b[16] = { 0 };

    ck_assert_int_eq(devmem_kind(dm), DEVMEM_NONE);
    ck_assert_int_eq(devmem_device_count(dm), 0);
    ck_assert(!devmem_can_pin(dm));

    ck_assert_int_eq(devmem_region_alloc(dm, 0, MiB, &r, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_msg(strstr(why, "no GPU") != NULL, "why: %s", why);
    ck_assert_ptr_null(r.base);
    ck_assert_int_eq(r.fd, -1);
    devmem_region_free(dm, &r);   /* a failed region frees as a no-op */

    why[0] = '\0';
    ck_assert_int_eq(devmem_host_register(dm, a, sizeof a, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_str_ne(why, "");
    devmem_host_unregister(dm, a);

    why[0] = '\0';
    ck_assert_int_eq(devmem_stream_create(dm, 0, &s, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_str_ne(why, "");

    why[0] = '\0';
    ck_assert_int_eq(devmem_copy_to_host(dm, 0, a, b, sizeof a, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_str_ne(why, "");
    devmem_close(dm);
}
END_TEST

START_TEST(test_sim_open)
{
    struct devmem *dm = open_kind(DEVMEM_SIM);
    ck_assert_int_eq(devmem_kind(dm), DEVMEM_SIM);
    ck_assert_int_eq(devmem_device_count(dm), DEVMEM_SIM_DEVICES);
    ck_assert(devmem_can_pin(dm));
    devmem_close(dm);
}
END_TEST

START_TEST(test_auto)
{
    struct devmem *dm = NULL;
    char why[256] = "";
    int rc = devmem_open_auto(&dm, why, sizeof why);

    ck_assert_msg(rc == 0, "devmem_open_auto: %d %s", rc, why);
    ck_assert_ptr_nonnull(dm);
    if (devmem_kind(dm) == DEVMEM_NONE) {
        /* No GPU (or no CUDA build): the reason cuda was not chosen. */
        ck_assert_msg(why[0] != '\0', "auto chose none without a reason");
        ck_assert_int_eq(devmem_device_count(dm), 0);
    } else {
        ck_assert_int_eq(devmem_kind(dm), DEVMEM_CUDA);
        ck_assert_int_gt(devmem_device_count(dm), 0);
    }
    devmem_close(dm);
}
END_TEST

/* The cuda backend: fails with a reason here (no CUDA driver to load: the
 * suite runs without the fake's folder on LD_LIBRARY_PATH; test_devmem_cuda
 * runs it through the fake); on a GPU machine, one region, one stream and a
 * pin round trip. */
START_TEST(test_cuda)
{
    struct devmem *dm = NULL;
    char why[256] = "";
    int rc = devmem_open(DEVMEM_CUDA, &dm, why, sizeof why);

    if (rc < 0) {
        ck_assert_ptr_null(dm);
        ck_assert_msg(why[0] != '\0', "cuda open failed (%d) without a reason", rc);
        ck_assert_msg(strstr(why, "CUDA driver") != NULL || strstr(why, "GPU") != NULL, "why: %s", why);
        return;
    }
    ck_assert_int_eq(devmem_kind(dm), DEVMEM_CUDA);
    ck_assert_int_gt(devmem_device_count(dm), 0);
    ck_assert(devmem_can_pin(dm));

    const size_t n = 4 * MiB;
    struct devmem_region r;
    rc = devmem_region_alloc(dm, 0, n, &r, why, sizeof why);
    ck_assert_msg(rc == 0, "region_alloc: %d %s", rc, why);
    ck_assert_ptr_nonnull(r.base);
    if (r.vmm) {
        ck_assert_int_ge(r.fd, 0);
        ck_assert_uint_eq(r.ipc_len, 0);
    } else {
        ck_assert_int_eq(r.fd, -1);
        ck_assert_uint_eq(r.ipc_len, DEVMEM_IPC_HANDLE_BYTES);
    }
    ck_assert(!r.host_access);

    uint8_t *src = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *dst = malloc(n), *dst2 = malloc(n);
    ck_assert(src != MAP_FAILED && dst && dst2);
    fill(src, n, 5);
    memset(dst, 0, n);
    memset(dst2, 0, n);
    ck_assert_int_eq(devmem_set_pin_device(dm, 0, why, sizeof why), 0);
    rc = devmem_host_register(dm, src, n, why, sizeof why);
    ck_assert_msg(rc == 0, "host_register: %d %s", rc, why);

    struct devmem_stream *s = NULL;
    rc = devmem_stream_create(dm, 0, &s, why, sizeof why);
    ck_assert_msg(rc == 0, "stream_create: %d %s", rc, why);
    ck_assert_int_eq(devmem_copy_async(s, r.base, src, n, why, sizeof why), 0);
    ck_assert_int_eq(devmem_copy_async(s, dst, r.base, n / 2, why, sizeof why), 0);
    rc = devmem_stream_wait(s, why, sizeof why);
    ck_assert_msg(rc == 0, "stream_wait: %d %s", rc, why);
    ck_assert(memcmp(dst, src, n / 2) == 0);
    rc = devmem_copy_to_host(dm, 0, dst2, r.base, n, why, sizeof why);
    ck_assert_msg(rc == 0, "copy_to_host: %d %s", rc, why);
    ck_assert(memcmp(dst2, src, n) == 0);

    devmem_stream_destroy(s);
    devmem_host_unregister(dm, src);
    devmem_region_free(dm, &r);
    ck_assert_ptr_null(r.base);
    munmap(src, n);
    free(dst);
    free(dst2);
    devmem_close(dm);
}
END_TEST

/* --- sim regions ---------------------------------------------------------- */

START_TEST(test_sim_region)
{
    struct devmem *dm = open_kind(DEVMEM_SIM);
    struct devmem_region r;
    char why[256] = "";
    const uint64_t n = 2 * MiB + 4 * KiB;
    struct stat st;

    int rc = devmem_region_alloc(dm, 1, n, &r, why, sizeof why);
    ck_assert_msg(rc == 0, "region_alloc: %d %s", rc, why);
    ck_assert_int_eq(r.device, 1);
    ck_assert_ptr_nonnull(r.base);
    ck_assert_uint_eq(r.size, n);
    ck_assert_int_ge(r.fd, 0);
    ck_assert_uint_eq(r.ipc_len, 0);
    ck_assert(r.host_access);

    /* A sealed memfd of exactly the region's size, close-on-exec. */
    ck_assert_int_eq(fstat(r.fd, &st), 0);
    ck_assert_int_eq(st.st_size, (off_t)n);
    int seals = fcntl(r.fd, F_GET_SEALS);
    ck_assert_int_ge(seals, 0);
    ck_assert_int_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    ck_assert(fcntl(r.fd, F_GETFD) & FD_CLOEXEC);
    ck_assert_int_ne(ftruncate(r.fd, (off_t)(n / 2)), 0);
    ck_assert_int_ne(ftruncate(r.fd, (off_t)(n * 2)), 0);

    /* A client's mapping of the fd is the same memory as base. */
    uint8_t *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
    ck_assert(m != MAP_FAILED);
    fill(r.base, n, 1);
    ck_assert(memcmp(m, r.base, n) == 0);
    fill(m, 4096, 9);
    ck_assert(memcmp(m, r.base, 4096) == 0);
    munmap(m, n);

    devmem_region_free(dm, &r);
    ck_assert_ptr_null(r.base);
    ck_assert_int_eq(r.fd, -1);
    devmem_region_free(dm, &r);   /* twice: no-op */
    devmem_close(dm);
}
END_TEST

START_TEST(test_sim_bad_args)
{
    struct devmem *dm = open_kind(DEVMEM_SIM);
    struct devmem_region r;
    struct devmem_stream *s = NULL;
    char why[256] = "";
    uint8_t a[64], b[64];

    int bad[] = { -1, DEVMEM_SIM_DEVICES, DEVMEM_MAX_DEVICES, 1000 };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        ck_assert_int_eq(devmem_region_alloc(dm, bad[i], MiB, &r, why, sizeof why), -KVNODE_EINVAL);
        ck_assert_msg(strstr(why, "out of range") != NULL, "why: %s", why);
        ck_assert_ptr_null(r.base);
        ck_assert_int_eq(r.fd, -1);
        why[0] = '\0';
        ck_assert_int_eq(devmem_stream_create(dm, bad[i], &s, why, sizeof why), -KVNODE_EINVAL);
        ck_assert_ptr_null(s);
        ck_assert_msg(strstr(why, "out of range") != NULL, "why: %s", why);
        why[0] = '\0';
        ck_assert_int_eq(devmem_copy_to_host(dm, bad[i], a, b, sizeof a, why, sizeof why),
                         -KVNODE_EINVAL);
        ck_assert_str_ne(why, "");
    }
    ck_assert_int_eq(devmem_region_alloc(dm, 0, 0, &r, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(devmem_region_alloc(dm, 0, MiB, NULL, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(devmem_copy_to_host(dm, 0, NULL, b, sizeof a, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(devmem_copy_to_host(dm, 0, a, NULL, 0, why, sizeof why), 0);
    ck_assert_int_eq(devmem_host_register(dm, NULL, 10, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(devmem_host_register(dm, a, 0, why, sizeof why), -KVNODE_EINVAL);

    ck_assert_int_eq(devmem_stream_create(dm, 0, &s, why, sizeof why), 0);
    ck_assert_int_eq(devmem_copy_async(s, a, NULL, 1, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(devmem_copy_async(NULL, a, b, 1, why, sizeof why), -KVNODE_EINVAL);
    ck_assert_int_eq(devmem_stream_wait(NULL, why, sizeof why), -KVNODE_EINVAL);
    devmem_stream_destroy(s);
    devmem_stream_destroy(NULL);
    devmem_close(dm);
}
END_TEST

START_TEST(test_sim_copies)
{
    struct devmem *dm = open_kind(DEVMEM_SIM);
    struct devmem_region r0, r1;
    struct devmem_stream *s0 = NULL, *s1 = NULL;
    char why[256] = "";
    const size_t n = MiB;
    uint8_t *host = malloc(n), *back = malloc(n), *back2 = malloc(n);

    ck_assert(host && back && back2);
    ck_assert_int_eq(devmem_region_alloc(dm, 0, n, &r0, why, sizeof why), 0);
    ck_assert_int_eq(devmem_region_alloc(dm, 1, n, &r1, why, sizeof why), 0);
    ck_assert_int_eq(devmem_stream_create(dm, 0, &s0, why, sizeof why), 0);
    ck_assert_int_eq(devmem_stream_create(dm, 1, &s1, why, sizeof why), 0);
    fill(host, n, 3);
    memset(back, 0, n);
    memset(back2, 0, n);

    /* host -> dev0 in two halves, dev0 -> dev1, dev1 -> host. */
    ck_assert_int_eq(devmem_copy_async(s0, r0.base, host, n / 2, why, sizeof why), 0);
    ck_assert_int_eq(devmem_copy_async(s0, (uint8_t *)r0.base + n / 2, host + n / 2, n / 2,
                                       why, sizeof why), 0);
    ck_assert_int_eq(devmem_stream_wait(s0, why, sizeof why), 0);
    ck_assert_int_eq(devmem_copy_async(s1, r1.base, r0.base, n, why, sizeof why), 0);
    ck_assert_int_eq(devmem_copy_async(s1, back, r1.base, n, why, sizeof why), 0);
    ck_assert_int_eq(devmem_copy_async(s1, back, r1.base, 0, why, sizeof why), 0);
    ck_assert_int_eq(devmem_stream_wait(s1, why, sizeof why), 0);
    ck_assert(memcmp(back, host, n) == 0);

    ck_assert_int_eq(devmem_copy_to_host(dm, 1, back2, r1.base, n, why, sizeof why), 0);
    ck_assert(memcmp(back2, host, n) == 0);

    devmem_stream_destroy(s0);
    devmem_stream_destroy(s1);
    devmem_region_free(dm, &r0);
    devmem_region_free(dm, &r1);
    free(host);
    free(back);
    free(back2);
    devmem_close(dm);
}
END_TEST

/* --- delays from the environment (read at open) ---------------------------- */

START_TEST(test_sim_pin_delay)
{
    struct devmem *dm;
    char why[256] = "";
    long page = sysconf(_SC_PAGESIZE);
    void *buf = mmap(NULL, (size_t)page * 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t t0;

    ck_assert(buf != MAP_FAILED);
    unsetenv("KVNODE_DEVMEM_SIM_PIN_DELAY_MS");
    dm = open_kind(DEVMEM_SIM);
    t0 = clock_now_ms();
    ck_assert_int_eq(devmem_host_register(dm, buf, (size_t)page * 4, why, sizeof why), 0);
    ck_assert_uint_lt(clock_now_ms() - t0, 50);
    devmem_host_unregister(dm, buf);
    devmem_close(dm);

    setenv("KVNODE_DEVMEM_SIM_PIN_DELAY_MS", "120", 1);
    dm = open_kind(DEVMEM_SIM);
    unsetenv("KVNODE_DEVMEM_SIM_PIN_DELAY_MS");   /* read at open: no effect on dm */
    t0 = clock_now_ms();
    ck_assert_int_eq(devmem_host_register(dm, buf, (size_t)page * 4, why, sizeof why), 0);
    ck_assert_uint_ge(clock_now_ms() - t0, 115);
    devmem_host_unregister(dm, buf);
    devmem_close(dm);
    munmap(buf, (size_t)page * 4);
}
END_TEST

START_TEST(test_sim_copy_delay)
{
    struct devmem *dm;
    struct devmem_stream *s = NULL;
    char why[256] = "";
    uint8_t a[32] = { 1, 2, 3 }, b[32] = { 0 };
    uint64_t t0;

    setenv("KVNODE_DEVMEM_SIM_COPY_DELAY_MS", "100", 1);
    dm = open_kind(DEVMEM_SIM);
    unsetenv("KVNODE_DEVMEM_SIM_COPY_DELAY_MS");
    ck_assert_int_eq(devmem_stream_create(dm, 0, &s, why, sizeof why), 0);
    ck_assert_int_eq(devmem_copy_async(s, b, a, sizeof a, why, sizeof why), 0);
    t0 = clock_now_ms();
    ck_assert_int_eq(devmem_stream_wait(s, why, sizeof why), 0);
    ck_assert_uint_ge(clock_now_ms() - t0, 95);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    devmem_stream_destroy(s);
    devmem_close(dm);
}
END_TEST

START_TEST(test_sim_bad_env)
{
    const char *vars[] = { "KVNODE_DEVMEM_SIM_PIN_DELAY_MS", "KVNODE_DEVMEM_SIM_COPY_DELAY_MS" };
    const char *bad[] = { "abc", "-1", "+5", " 5", "5 ", "10ms", "60001", "99999999999999999999" };

    for (size_t v = 0; v < 2; v++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            struct devmem *dm = (struct devmem *)1;
            char why[256] = "";
            setenv(vars[v], bad[i], 1);
            ck_assert_int_eq(devmem_open(DEVMEM_SIM, &dm, why, sizeof why), -KVNODE_EINVAL);
            ck_assert_ptr_null(dm);
            ck_assert_msg(strstr(why, vars[v]) != NULL, "why: %s", why);
        }
        /* Bounds and empty (= unset) are accepted. */
        setenv(vars[v], "0", 1);
        devmem_close(open_kind(DEVMEM_SIM));
        setenv(vars[v], "", 1);
        devmem_close(open_kind(DEVMEM_SIM));
        setenv(vars[v], "60000", 1);
        devmem_close(open_kind(DEVMEM_SIM));
        unsetenv(vars[v]);
    }
}
END_TEST

static Suite *devmem_suite(void)
{
    Suite *s = suite_create("devmem");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kind_names);
    tcase_add_test(tc, test_none);
    tcase_add_test(tc, test_sim_open);
    tcase_add_test(tc, test_auto);
    tcase_add_test(tc, test_cuda);
    tcase_add_test(tc, test_sim_region);
    tcase_add_test(tc, test_sim_bad_args);
    tcase_add_test(tc, test_sim_copies);
    tcase_add_test(tc, test_sim_pin_delay);
    tcase_add_test(tc, test_sim_copy_delay);
    tcase_add_test(tc, test_sim_bad_env);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(devmem_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
