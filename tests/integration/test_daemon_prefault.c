/* kvnode_prefault (issue 16, item 4): a client populates its own page tables
 * for the lent host arena, against a real daemon. Residency is read from
 * /proc/self/smaps (Rss of the client's mapping counts the pages mapped in
 * this process; mincore would not do: it reports the page cache, which the
 * daemon has filled already):
 *
 * - a fresh client's mapping holds (almost) nothing; after
 *   kvnode_prefault(KVNODE_PREFAULT_WAIT) it holds all of the arena, and
 *   kvnode_prefault_progress says ended with done == total == the arena;
 * - in the background (kvnode_prefault(c, 0) and KVNODE_CONNECT_PREFAULT)
 *   progress reaches the arena size and the mapping becomes resident;
 * - a reader's prefault populates its read-only mapping, which stays
 *   read-only (mprotect PROT_WRITE fails with EACCES) and reads byte-exact;
 * - kvnode_close while a prefault of a 256 MiB arena runs returns, and
 *   leaves neither the thread nor the mapping behind;
 * - misuse: unknown flags (-KVNODE_EINVAL), an observer (-KVNODE_ESTATE),
 *   progress before any prefault (0, total 0). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define BLOCK   (1u << 20)
#define NKEYS   4u
#define SEED    UINT64_C(0xFA17)
#define ARENA   (64ull << 20)
#define CONF    "memory.host_bytes=64MiB\nmemory.slab_bytes=1MiB\n"
#define BIG_ARENA (256ull << 20)
#define BIG_CONF  "memory.host_bytes=256MiB\nmemory.slab_bytes=1MiB\n"

struct mapping {
    uintptr_t start, end;
    uint64_t rss;       /* bytes */
};

/* The smaps entry of this process that holds p; 0 on success. */
static int find_mapping(const void *p, struct mapping *m)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0, found = -1;

    ck_assert_msg(f != NULL, "open /proc/self/smaps: %s", strerror(errno));
    while (fgets(line, sizeof line, f)) {
        uintptr_t s, e;
        unsigned long long kb;

        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &s, &e) == 2 && strchr(line, ' ') &&
            line[strcspn(line, " ") - 1] != ':') {
            in = (uintptr_t)p >= s && (uintptr_t)p < e;
            if (in) {
                m->start = s;
                m->end = e;
            }
        } else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1) {
            m->rss = kb * 1024;
            found = 0;
            in = 0;
        }
    }
    fclose(f);
    return found;
}

static int mapped(uintptr_t start)
{
    struct mapping m;
    return find_mapping((const void *)start, &m) == 0 && m.start == start;
}

static int threads_of_self(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;

    ck_assert(d != NULL);
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* Pointer to the first of NKEYS blocks put by a writer, as client c maps it
 * (get_begin resolves it without touching the memory). */
static void *block_ptr(kvnode_client *c, const kvnode_key *keys, kvnode_lease *lease)
{
    kvnode_loc locs[NKEYS];
    size_t got = 0;

    KVH_OK(c, kvnode_get_begin(c, keys, NKEYS, lease, locs, &got));
    ck_assert_uint_eq(got, NKEYS);
    ck_assert_int_eq(locs[0].tier, KVNODE_TIER_HOST);
    return locs[0].ptr;
}

static void wait_prefault(kvnode_client *c, uint64_t want_total)
{
    uint64_t done = 0, total = 0;
    int rc = 0, i;

    for (i = 0; i < 2000 && (rc = kvnode_prefault_progress(c, &done, &total)) == 0; i++)
        usleep(5000);
    ck_assert_msg(rc == 1, "prefault did not end in 10 s: rc %d, %" PRIu64 " of %" PRIu64
                  " bytes", rc, done, total);
    ck_assert_uint_eq(total, want_total);
    ck_assert_uint_eq(done, want_total);
}

/* A daemon (conf), a writer that put NKEYS blocks of keys; returns it. */
static kvnode_client *start_with_blocks(kvh_daemon *d, const char *conf, kvnode_layout *l,
                                        kvnode_key *keys)
{
    kvnode_client *w;

    KVH_START(d, conf);
    *l = kvh_layout("prefault-7b", BLOCK, 1, 0);
    KVH_CONNECT(d, l, &w);
    kvh_chain(keys, NKEYS, 16);
    ck_assert_int_eq(kvh_put(w, keys, NKEYS, SEED), 0);
    return w;
}

START_TEST(prefault_makes_mapping_resident)
{
    kvh_daemon d;
    kvnode_layout l;
    kvnode_key keys[NKEYS];
    kvnode_client *w = start_with_blocks(&d, CONF, &l, keys), *c;
    kvnode_lease lease;
    struct mapping m;
    uint64_t done = 1, total = 1;
    size_t got;

    KVH_CONNECT(&d, &l, &c);
    ck_assert_int_eq(kvnode_prefault_progress(c, &done, &total), 0);
    ck_assert_uint_eq(done, 0);
    ck_assert_uint_eq(total, 0);
    ck_assert_int_eq(find_mapping(block_ptr(c, keys, &lease), &m), 0);
    KVH_OK(c, kvnode_get_end(c, lease));
    ck_assert_uint_eq(m.end - m.start, ARENA);
    fprintf(stderr, "prefault: fresh mapping Rss %" PRIu64 " of %" PRIu64 " bytes\n", m.rss,
            (uint64_t)ARENA);
    ck_assert_uint_lt(m.rss, ARENA / 16);      /* nothing touched yet */

    KVH_OK(c, kvnode_prefault(c, KVNODE_PREFAULT_WAIT));
    ck_assert_int_eq(kvnode_prefault_progress(c, &done, &total), 1);
    ck_assert_uint_eq(total, ARENA);
    ck_assert_uint_eq(done, ARENA);
    ck_assert_int_eq(find_mapping((void *)m.start, &m), 0);
    fprintf(stderr, "prefault: after prefault Rss %" PRIu64 " of %" PRIu64 " bytes\n", m.rss,
            (uint64_t)ARENA);
    ck_assert_uint_eq(m.rss, ARENA);
    KVH_OK(c, kvnode_prefault(c, 0));           /* again: a no-op */
    ck_assert_int_eq(kvh_get_zc_verify(c, keys, NKEYS, SEED, &got), 0);
    ck_assert_uint_eq(got, NKEYS);
    kvnode_close(c);
    kvnode_close(w);
    KVH_STOP_OK(&d);
    kvh_destroy(&d);
}
END_TEST

START_TEST(prefault_in_background_and_by_connect_flag)
{
    kvh_daemon d;
    kvnode_layout l;
    kvnode_key keys[NKEYS];
    kvnode_client *w = start_with_blocks(&d, CONF, &l, keys), *c, *f = NULL;
    kvnode_lease lease;
    struct mapping m;
    int rc;

    KVH_CONNECT(&d, &l, &c);
    KVH_OK(c, kvnode_prefault(c, 0));
    wait_prefault(c, ARENA);
    ck_assert_int_eq(find_mapping(block_ptr(c, keys, &lease), &m), 0);
    KVH_OK(c, kvnode_get_end(c, lease));
    ck_assert_uint_eq(m.rss, ARENA);

    rc = kvnode_connect_flags(d.sock, &l, -1, KVNODE_CONNECT_PREFAULT, &f);
    ck_assert_msg(rc == 0, "connect: %s", kvnode_connect_error());
    ck_assert_int_eq(kvnode_is_reader(f), 0);
    wait_prefault(f, ARENA);
    ck_assert_int_eq(find_mapping(block_ptr(f, keys, &lease), &m), 0);
    KVH_OK(f, kvnode_get_end(f, lease));
    ck_assert_uint_eq(m.rss, ARENA);
    kvnode_close(f);
    kvnode_close(c);
    kvnode_close(w);
    KVH_STOP_OK(&d);
    kvh_destroy(&d);
}
END_TEST

START_TEST(reader_prefault_stays_read_only)
{
    kvh_daemon d;
    kvnode_layout l;
    kvnode_key keys[NKEYS];
    kvnode_client *w = start_with_blocks(&d, CONF, &l, keys), *r = NULL;
    kvnode_lease lease;
    struct mapping m;
    size_t got;
    int rc;

    rc = kvnode_connect_flags(d.sock, &l, -1, KVNODE_CONNECT_READER | KVNODE_CONNECT_PREFAULT, &r);
    ck_assert_msg(rc == 0, "reader connect: %s", kvnode_connect_error());
    ck_assert_int_eq(kvnode_is_reader(r), 1);
    wait_prefault(r, ARENA);
    ck_assert_int_eq(find_mapping(block_ptr(r, keys, &lease), &m), 0);
    KVH_OK(r, kvnode_get_end(r, lease));
    fprintf(stderr, "prefault: reader Rss %" PRIu64 " of %" PRIu64 " bytes\n", m.rss,
            (uint64_t)ARENA);
    ck_assert_uint_eq(m.rss, ARENA);
    errno = 0;
    ck_assert_int_eq(mprotect((void *)m.start, m.end - m.start, PROT_READ | PROT_WRITE), -1);
    ck_assert_int_eq(errno, EACCES);
    ck_assert_int_eq(kvh_get_zc_verify(r, keys, NKEYS, SEED, &got), 0);
    ck_assert_uint_eq(got, NKEYS);
    kvnode_close(r);
    kvnode_close(w);
    KVH_STOP_OK(&d);
    kvh_destroy(&d);
}
END_TEST

START_TEST(close_during_prefault_returns_and_leaves_nothing)
{
    kvh_daemon d;
    kvnode_layout l;
    kvnode_key keys[NKEYS];
    kvnode_client *w = start_with_blocks(&d, BIG_CONF, &l, keys), *c;
    kvnode_lease lease;
    struct mapping m;
    struct timespec t0, t1;
    uint64_t done = 0, total = 0;
    int threads = threads_of_self();
    double ms;

    KVH_CONNECT(&d, &l, &c);
    ck_assert_int_eq(find_mapping(block_ptr(c, keys, &lease), &m), 0);
    KVH_OK(c, kvnode_get_end(c, lease));
    ck_assert_uint_eq(m.end - m.start, BIG_ARENA);
    KVH_OK(c, kvnode_prefault(c, 0));
    ck_assert_int_eq(threads_of_self(), threads + 1);
    /* Close in the middle of the walk, once it has begun. */
    for (int i = 0; i < 2000 && kvnode_prefault_progress(c, &done, &total) == 0 && done == 0; i++)
        usleep(500);
    ck_assert_int_ge(kvnode_prefault_progress(c, &done, &total), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvnode_close(c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    fprintf(stderr, "prefault: close after %" PRIu64 " of %" PRIu64 " bytes took %.1f ms\n",
            done, total, ms);
    ck_assert_uint_eq(total, BIG_ARENA);
    ck_assert_int_eq(threads_of_self(), threads);  /* the walk was joined */
    ck_assert(!mapped(m.start));                     /* and the arena unmapped */
    kvnode_close(w);
    KVH_STOP_OK(&d);
    kvh_destroy(&d);
}
END_TEST

START_TEST(prefault_misuse)
{
    kvh_daemon d;
    kvnode_layout l;
    kvnode_key keys[NKEYS];
    kvnode_client *w = start_with_blocks(&d, CONF, &l, keys), *o, *x = NULL;
    int rc;

    ck_assert_int_eq(kvnode_prefault(w, 1u << 7), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(w), "unknown flags"));
    ck_assert_int_eq(kvnode_prefault(NULL, 0), -KVNODE_EINVAL);
    ck_assert_int_eq(kvnode_prefault_progress(NULL, NULL, NULL), 0);
    rc = kvnode_connect_flags(d.sock, &l, -1, 1u << 7, &x);
    ck_assert_int_eq(rc, -KVNODE_EINVAL);
    ck_assert_ptr_null(x);
    ck_assert_ptr_nonnull(strstr(kvnode_connect_error(), "KVNODE_CONNECT_PREFAULT"));
    KVH_CONNECT(&d, NULL, &o);
    ck_assert_int_eq(kvnode_prefault(o, 0), -KVNODE_ESTATE);
    ck_assert_ptr_nonnull(strstr(kvnode_last_error(o), "no host arena"));
    kvnode_close(o);
    /* An observer asking for it at connect: nothing to populate, no error. */
    rc = kvnode_connect_flags(d.sock, NULL, -1, KVNODE_CONNECT_PREFAULT, &x);
    ck_assert_msg(rc == 0, "observer connect: %s", kvnode_connect_error());
    ck_assert_int_eq(kvnode_prefault_progress(x, NULL, NULL), 0);
    kvnode_close(x);
    kvnode_close(w);
    KVH_STOP_OK(&d);
    kvh_destroy(&d);
}
END_TEST

int main(void)
{
    const TTest *tests[] = { prefault_makes_mapping_resident,
                             prefault_in_background_and_by_connect_flag,
                             reader_prefault_stays_read_only,
                             close_during_prefault_returns_and_leaves_nothing, prefault_misuse };
    return kvh_run_suite("prefault", "prefault", 60, tests, sizeof tests / sizeof tests[0]);
}
