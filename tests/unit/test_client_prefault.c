/* lib/prefault.c on its own: the walk over a memfd mapping makes every page
 * resident in this process (smaps Rss of the mapping), by MADV_POPULATE_* and
 * by the page-touching path older kernels get (PREFAULT_TOUCH forces it);
 * the walks leave the bytes as they were, and after a writer's walk (either
 * path) writing every page takes almost no page faults; a stop in the middle joins the thread; a walk the
 * mapping refuses (writable over PROT_READ) fails with a message instead of
 * falling back to touching (which would fault). */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "prefault.h"

#define SIZE (32u << 20)

static uint64_t rss_of(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0;
    uint64_t rss = UINT64_MAX;

    ck_assert(f != NULL);
    while (fgets(line, sizeof line, f)) {
        uintptr_t s, e;
        unsigned long long kb;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &s, &e) == 2 && strchr(line, '-') &&
            strchr(line, '-') < strchr(line, ' '))
            in = (uintptr_t)p >= s && (uintptr_t)p < e;
        else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1) {
            rss = kb * 1024;
            in = 0;
        }
    }
    fclose(f);
    return rss;
}

/* A filled memfd of SIZE bytes, mapped with prot; the page cache is full,
 * this mapping's page tables empty. */
static uint8_t *fresh_mapping(int prot)
{
    int fd = memfd_create("prefault-test", 0);
    uint8_t *w, *p;

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, SIZE), 0);
    w = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert(w != MAP_FAILED);
    for (size_t i = 0; i < SIZE; i++)
        w[i] = (uint8_t)(i * 7 + 3);
    munmap(w, SIZE);
    p = mmap(NULL, SIZE, prot, MAP_SHARED, fd, 0);
    ck_assert(p != MAP_FAILED);
    close(fd);
    ck_assert_uint_eq(rss_of(p), 0);
    return p;
}

static void check_bytes(const uint8_t *p)
{
    for (size_t i = 0; i < SIZE; i += 4093)
        ck_assert_uint_eq(p[i], (uint8_t)(i * 7 + 3));
}

static void walk(unsigned flags, int prot)
{
    uint8_t *p = fresh_mapping(prot);
    struct prefault_range r = { p, SIZE };
    struct prefault *pf = prefault_start(&r, 1, flags | PREFAULT_WAIT);
    uint64_t done = 0, total = 0;

    ck_assert_ptr_nonnull(pf);
    ck_assert_int_eq(prefault_state(pf, &done, &total), 1);
    ck_assert_uint_eq(done, SIZE);
    ck_assert_uint_eq(total, SIZE);
    ck_assert_str_eq(prefault_error(pf), "");
    ck_assert_uint_eq(rss_of(p), SIZE);
    check_bytes(p);
    if (prot & PROT_WRITE) {
        /* Writable already: writing every page takes (almost) no faults. */
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        for (size_t i = 0; i < SIZE; i += page)
            ((volatile uint8_t *)p)[i] = p[i];
        getrusage(RUSAGE_SELF, &r1);
        ck_assert_msg(r1.ru_minflt - r0.ru_minflt < (long)(SIZE / page / 64),
                      "%ld faults writing %zu prefaulted pages", r1.ru_minflt - r0.ru_minflt,
                      (size_t)(SIZE / page));
        check_bytes(p);
    }
    prefault_stop(pf);
    munmap(p, SIZE);
}

START_TEST(populate_write) { walk(PREFAULT_WRITE, PROT_READ | PROT_WRITE); }
END_TEST
START_TEST(populate_read) { walk(0, PROT_READ); }
END_TEST
START_TEST(touch_write) { walk(PREFAULT_WRITE | PREFAULT_TOUCH, PROT_READ | PROT_WRITE); }
END_TEST
START_TEST(touch_read) { walk(PREFAULT_TOUCH, PROT_READ); }
END_TEST

START_TEST(stop_in_background)
{
    uint8_t *p = fresh_mapping(PROT_READ | PROT_WRITE);
    struct prefault_range r = { p, SIZE };
    struct prefault *pf = prefault_start(&r, 1, PREFAULT_WRITE);
    uint64_t total = 0;

    ck_assert_ptr_nonnull(pf);
    ck_assert_int_ge(prefault_state(pf, NULL, &total), 0);
    ck_assert_uint_eq(total, SIZE);
    prefault_stop(pf);          /* joins: the mapping may go now */
    munmap(p, SIZE);
}
END_TEST

START_TEST(error_is_reported)
{
    /* A writable walk over a read-only mapping: MADV_POPULATE_WRITE fails
     * (EFAULT); the walk names it instead of crashing. */
    uint8_t *p = fresh_mapping(PROT_READ);
    struct prefault_range r = { p, SIZE };
    struct prefault *pf;

    if (madvise(p, 0, 23 /* MADV_POPULATE_WRITE */) != 0) {
        fprintf(stderr, "error_is_reported: this kernel has no MADV_POPULATE_WRITE; skipped\n");
        munmap(p, SIZE);
        return;
    }
    pf = prefault_start(&r, 1, PREFAULT_WRITE | PREFAULT_WAIT);
    ck_assert_ptr_nonnull(pf);
    ck_assert_int_eq(prefault_state(pf, NULL, NULL), -1);
    ck_assert_ptr_nonnull(strstr(prefault_error(pf), "MADV_POPULATE_WRITE of 4194304 bytes at "
                                 "offset 0 failed: Invalid argument"));
    prefault_stop(pf);
    munmap(p, SIZE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("prefault");
    TCase *tc = tcase_create("prefault");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, populate_write);
    tcase_add_test(tc, populate_read);
    tcase_add_test(tc, touch_write);
    tcase_add_test(tc, touch_read);
    tcase_add_test(tc, stop_in_background);
    tcase_add_test(tc, error_is_reported);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
