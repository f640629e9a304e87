/* Unit tests for daemon/mem/arena.c: host memfd arena and slab allocator. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mem/arena.h"
#include "kvnode.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

/* Check's ck_assert_* records every passing check through a file, far too
 * slow for loops over millions of blocks: REQUIRE only reports failures. */
#define REQUIRE(cond, fmt, ...)                                              \
    do {                                                                     \
        if (!(cond))                                                         \
            ck_abort_msg("line %d: " fmt " [%s]", __VA_ARGS__, #cond);       \
    } while (0)

static struct arena *make_arena(uint64_t bytes, uint64_t slab)
{
    struct arena *a = NULL;
    char err[256] = "";
    int rc = arena_create_host(7, bytes, slab, ARENA_HUGE_OFF, &a, err, sizeof(err));
    ck_assert_msg(rc == 0, "arena_create_host(%llu, %llu): %d %s", (unsigned long long)bytes,
                  (unsigned long long)slab, rc, err);
    ck_assert_ptr_nonnull(a);
    return a;
}

static uint32_t class_for(struct arena *a, uint64_t block_bytes)
{
    uint32_t cls = UINT32_MAX;
    int rc = arena_class_for(a, block_bytes, &cls);
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_lt(cls, arena_class_count(a));
    return cls;
}

static uint64_t round_stride(uint64_t b)
{
    return (b + ARENA_STRIDE_ALIGN - 1) / ARENA_STRIDE_ALIGN * ARENA_STRIDE_ALIGN;
}

/* --- creation and accessors --------------------------------------------- */

START_TEST(test_create_basic)
{
    /* 5.5 slabs: rounded down to 5 whole slabs. */
    uint64_t slab = 2 * MiB;
    struct arena *a = make_arena(5 * slab + slab / 2, slab);
    struct arena_stats st;
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.slabs_total, 5);
    ck_assert_uint_eq(st.slabs_free, 5);
    ck_assert_uint_eq(st.slab_bytes, slab);
    ck_assert_uint_eq(st.capacity, 5 * slab);
    ck_assert_uint_eq(st.used_bytes, 0);
    ck_assert_uint_eq(st.blocks, 0);
    ck_assert_uint_eq(arena_size(a), 5 * slab);
    ck_assert_uint_eq(arena_id(a), 7);
    ck_assert_int_eq(arena_tier(a), KVNODE_TIER_HOST);
    ck_assert_int_eq(arena_device(a), -1);
    ck_assert_int_ge(arena_fd(a), 0);
    ck_assert_ptr_nonnull(arena_base(a));
    ck_assert_uint_eq(arena_class_count(a), 0);
    ck_assert_uint_eq(arena_bad_frees(a), 0);
    arena_destroy(a);
    arena_destroy(NULL);
}
END_TEST

static void expect_create_error(uint64_t bytes, uint64_t slab, int code, const char *needle)
{
    struct arena *a = (struct arena *)(uintptr_t)1;
    char err[256] = "";
    int rc = arena_create_host(1, bytes, slab, ARENA_HUGE_OFF, &a, err, sizeof(err));
    ck_assert_int_eq(rc, -code);
    ck_assert_ptr_null(a);
    ck_assert_msg(strstr(err, needle) != NULL, "message '%s' lacks '%s'", err, needle);
}

START_TEST(test_create_errors)
{
    expect_create_error(1 * MiB, 2 * MiB, KVNODE_EINVAL, "1048576");    /* smaller than a slab */
    expect_create_error(0, 2 * MiB, KVNODE_EINVAL, "smaller than one slab");
    expect_create_error(64 * MiB, 0, KVNODE_EINVAL, "slab_bytes 0");
    expect_create_error(64 * MiB, 1000, KVNODE_EINVAL, "slab_bytes 1000");
    expect_create_error(64 * MiB, 2 * MiB + 1, KVNODE_EINVAL, "2097153");
    /* err may be NULL. */
    struct arena *a = NULL;
    ck_assert_int_eq(arena_create_host(1, 0, 2 * MiB, ARENA_HUGE_OFF, &a, NULL, 0), -KVNODE_EINVAL);
    ck_assert_ptr_null(a);
}
END_TEST

/* --- the memfd ------------------------------------------------------------ */

START_TEST(test_memfd_sealed_cloexec_shared)
{
    uint64_t slab = 1 * MiB;
    struct arena *a = make_arena(4 * slab, slab);
    int fd = arena_fd(a);

    int seals = fcntl(fd, F_GET_SEALS);
    ck_assert_int_ge(seals, 0);
    ck_assert_int_ne(seals & F_SEAL_SHRINK, 0);
    ck_assert_int_ne(seals & F_SEAL_GROW, 0);
    ck_assert_int_ne(seals & F_SEAL_SEAL, 0);
    ck_assert_int_eq(seals & F_SEAL_WRITE, 0);    /* the daemon and clients write */
    /* Sealed seals: no seal can be added or taken away. */
    ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    ck_assert_int_eq(errno, EPERM);

    /* The size can neither shrink nor grow. */
    ck_assert_int_eq(ftruncate(fd, (off_t)(2 * slab)), -1);
    ck_assert_int_eq(errno, EPERM);
    ck_assert_int_eq(ftruncate(fd, (off_t)(8 * slab)), -1);
    ck_assert_int_eq(errno, EPERM);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    ck_assert_uint_eq((uint64_t)sb.st_size, arena_size(a));

    int fdflags = fcntl(fd, F_GETFD);
    ck_assert_int_ge(fdflags, 0);
    ck_assert_int_ne(fdflags & FD_CLOEXEC, 0);

    /* A second mapping of the fd (what a client does) sees the daemon's
     * writes and the daemon sees the client's. */
    unsigned char *other = mmap(NULL, (size_t)arena_size(a), PROT_READ | PROT_WRITE, MAP_SHARED,
                                fd, 0);
    ck_assert_ptr_ne(other, MAP_FAILED);
    ck_assert_ptr_ne(other, arena_base(a));
    unsigned char *base = arena_base(a);
    uint64_t last = arena_size(a) - 1;
    base[0] = 0xa5;
    base[last] = 0x5a;
    memcpy(base + 3 * slab + 17, "kvnode", 6);
    ck_assert_uint_eq(other[0], 0xa5);
    ck_assert_uint_eq(other[last], 0x5a);
    ck_assert_int_eq(memcmp(other + 3 * slab + 17, "kvnode", 6), 0);
    other[slab] = 0x42;
    ck_assert_uint_eq(base[slab], 0x42);
    ck_assert_int_eq(munmap(other, (size_t)arena_size(a)), 0);
    arena_destroy(a);
}
END_TEST

/* The read-only reopen lent to readers: O_RDONLY and close-on-exec, the same
 * memory, never mappable for writing; the memfd's mode is 0400 so no other
 * user can reopen it for writing through /proc. */
static void expect_readonly_twin(int fd, int ro, unsigned char *base, uint64_t size)
{
    ck_assert_int_ge(ro, 0);
    ck_assert_int_ne(ro, fd);
    ck_assert_int_eq(fcntl(ro, F_GETFL) & O_ACCMODE, O_RDONLY);
    ck_assert_int_ne(fcntl(ro, F_GETFD) & FD_CLOEXEC, 0);
    struct stat sa, sb;
    ck_assert_int_eq(fstat(fd, &sa), 0);
    ck_assert_int_eq(fstat(ro, &sb), 0);
    ck_assert_msg(sa.st_ino == sb.st_ino && sa.st_dev == sb.st_dev, "not the same memory");
    ck_assert_uint_eq(sb.st_mode & 07777, 0400);
    errno = 0;
    ck_assert_ptr_eq(mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0), MAP_FAILED);
    ck_assert_int_eq(errno, EACCES);
    unsigned char *view = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, ro, 0);
    ck_assert_ptr_ne(view, MAP_FAILED);
    base[size - 1] = 0x77;
    ck_assert_uint_eq(view[size - 1], 0x77);
    errno = 0;
    ck_assert_int_eq(mprotect(view, (size_t)size, PROT_READ | PROT_WRITE), -1);
    ck_assert_int_eq(errno, EACCES);
    ck_assert_int_eq(munmap(view, (size_t)size), 0);
}

START_TEST(test_memfd_readonly_twin)
{
    uint64_t slab = 1 * MiB;
    struct arena *a = make_arena(4 * slab, slab);
    ck_assert_str_eq(arena_fd_readonly_why(a), "");
    expect_readonly_twin(arena_fd(a), arena_fd_readonly(a), arena_base(a), arena_size(a));
    arena_destroy(a);

    /* An arena over someone else's memfd (simulated HBM) reopens it too and
     * closes only its own copy. */
    int fd = memfd_create("test-over", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)(2 * slab)), 0);
    unsigned char *base = mmap(NULL, (size_t)(2 * slab), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(base, MAP_FAILED);
    char err[256] = "";
    ck_assert_int_eq(arena_create_over(1, KVNODE_TIER_HBM, 0, base, fd, 2 * slab, slab, &a, err,
                                       sizeof err), 0);
    int ro = arena_fd_readonly(a);
    expect_readonly_twin(fd, ro, base, 2 * slab);
    arena_destroy(a);
    ck_assert_int_eq(fcntl(ro, F_GETFD), -1);       /* the reopen is closed */
    ck_assert_int_ge(fcntl(fd, F_GETFD), 0);        /* the owner's memfd is not */
    munmap(base, (size_t)(2 * slab));
    close(fd);

    /* No fd: no reopen, and the reason says so. */
    ck_assert_int_eq(arena_create_over(2, KVNODE_TIER_HBM, 0, (void *)(uintptr_t)4096, -1, slab,
                                       slab, &a, err, sizeof err), 0);
    ck_assert_int_eq(arena_fd_readonly(a), -1);
    ck_assert_msg(strstr(arena_fd_readonly_why(a), "no descriptor"), "%s", arena_fd_readonly_why(a));
    arena_destroy(a);
}
END_TEST

/* --- size classes ------------------------------------------------------- */

START_TEST(test_class_for)
{
    uint64_t slab = 2 * MiB;
    struct arena *a = make_arena(4 * slab, slab);
    uint32_t cls = 99;

    ck_assert_int_eq(arena_class_for(a, 0, &cls), -KVNODE_ETOOBIG);
    ck_assert_int_eq(arena_class_for(a, slab + 1, &cls), -KVNODE_ETOOBIG);
    ck_assert_int_eq(arena_class_for(a, UINT64_MAX, &cls), -KVNODE_ETOOBIG);
    ck_assert_uint_eq(arena_class_count(a), 0);

    uint32_t whole = class_for(a, slab);
    ck_assert_uint_eq(arena_class_stride(a, whole), slab);
    ck_assert_uint_eq(arena_class_blocks_per_slab(a, whole), 1);

    /* 100000 and 100001 round up to the same stride: one class. */
    uint32_t odd = class_for(a, 100000);
    ck_assert_uint_eq(arena_class_stride(a, odd), 100096);
    ck_assert_uint_eq(arena_class_stride(a, odd) % ARENA_STRIDE_ALIGN, 0);
    ck_assert_uint_eq(class_for(a, 100001), odd);
    ck_assert_uint_eq(class_for(a, 100096), odd);
    ck_assert_uint_ne(class_for(a, 100097), odd);
    ck_assert_uint_eq(arena_class_blocks_per_slab(a, odd), slab / 100096);
    ck_assert_uint_eq(class_for(a, 100000), odd);
    ck_assert_uint_eq(arena_class_count(a), 3);
    arena_destroy(a);
}
END_TEST

START_TEST(test_class_limit)
{
    uint64_t slab = 1 * MiB;
    struct arena *a = make_arena(2 * slab, slab);
    for (uint32_t i = 0; i < ARENA_MAX_CLASSES; i++) {
        uint32_t cls = UINT32_MAX;
        ck_assert_int_eq(arena_class_for(a, (uint64_t)(i + 1) * ARENA_STRIDE_ALIGN, &cls), 0);
        ck_assert_uint_eq(cls, i);
    }
    ck_assert_uint_eq(arena_class_count(a), ARENA_MAX_CLASSES);
    uint32_t cls = 12345;
    ck_assert_int_eq(arena_class_for(a, (ARENA_MAX_CLASSES + 1) * ARENA_STRIDE_ALIGN, &cls),
                     -KVNODE_ELIMIT);
    ck_assert_uint_eq(cls, 12345);
    /* Existing strides are still found at the limit. */
    ck_assert_int_eq(arena_class_for(a, 3 * ARENA_STRIDE_ALIGN - 7, &cls), 0);
    ck_assert_uint_eq(cls, 2);
    ck_assert_uint_eq(arena_class_count(a), ARENA_MAX_CLASSES);
    /* An unknown class cannot allocate. */
    uint64_t off;
    ck_assert_int_eq(arena_alloc(a, ARENA_MAX_CLASSES, &off), -KVNODE_EINVAL);
    ck_assert_int_eq(arena_can_alloc(a, ARENA_MAX_CLASSES), 0);
    arena_destroy(a);
}
END_TEST

/* --- allocation ----------------------------------------------------------- */

struct blk {
    uint64_t off, len;
    uint32_t cls;
};

static int blk_cmp(const void *x, const void *y)
{
    const struct blk *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off;
}

static int u64_cmp(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

static uint64_t pattern_word(uint64_t off, uint64_t i)
{
    uint64_t x = off * UINT64_C(0x9e3779b97f4a7c15) ^ (i + 1) * UINT64_C(0xbf58476d1ce4e5b9);
    return x ^ (x >> 29);
}

/* Fill each block's block_bytes with a pattern unique to the block. */
static void blocks_write(struct arena *a, const struct blk *b, size_t n)
{
    unsigned char *base = arena_base(a);
    for (size_t k = 0; k < n; k++) {
        for (uint64_t i = 0; i + 8 <= b[k].len; i += 8) {
            uint64_t w = pattern_word(b[k].off, i);
            memcpy(base + b[k].off + i, &w, 8);
        }
        base[b[k].off + b[k].len - 1] = (unsigned char)(b[k].off >> 8);
    }
}

static void blocks_verify(struct arena *a, const struct blk *b, size_t n)
{
    const unsigned char *base = arena_base(a);
    for (size_t k = 0; k < n; k++) {
        for (uint64_t i = 0; i + 8 <= b[k].len - 1; i += 8) {
            uint64_t w;
            memcpy(&w, base + b[k].off + i, 8);
            REQUIRE(w == pattern_word(b[k].off, i), "block at %llu overwritten at +%llu",
                    __LINE__, (unsigned long long)b[k].off, (unsigned long long)i);
        }
        REQUIRE(base[b[k].off + b[k].len - 1] == (unsigned char)(b[k].off >> 8),
                "block at %llu: last byte overwritten", __LINE__, (unsigned long long)b[k].off);
    }
}

/* Offsets in range, aligned, inside one slab, at a stride boundary of their
 * slab, pairwise non-overlapping (sorted check). Sorts b. */
static void blocks_check_layout(struct arena *a, struct blk *b, size_t n)
{
    struct arena_stats st;
    arena_get_stats(a, &st);
    uint64_t slab = st.slab_bytes;
    for (size_t k = 0; k < n; k++) {
        uint64_t stride = arena_class_stride(a, b[k].cls);
        unsigned long long o = b[k].off;
        REQUIRE(o % ARENA_STRIDE_ALIGN == 0, "offset %llu", __LINE__, o);
        REQUIRE(o + b[k].len <= st.capacity, "offset %llu", __LINE__, o);
        REQUIRE((o % slab) % stride == 0, "offset %llu", __LINE__, o);
        REQUIRE(o % slab + stride <= slab, "offset %llu", __LINE__, o);
    }
    qsort(b, n, sizeof(*b), blk_cmp);
    for (size_t k = 1; k < n; k++)
        REQUIRE(b[k - 1].off + arena_class_stride(a, b[k - 1].cls) <= b[k].off,
                "blocks at %llu and %llu overlap", __LINE__, (unsigned long long)b[k - 1].off,
                (unsigned long long)b[k].off);
}

/* One class alone fills exactly slabs * (slab / stride) blocks. */
static void fill_one_class(uint64_t block_bytes)
{
    uint64_t slab = 2 * MiB;
    uint32_t nslabs = 6;
    struct arena *a = make_arena(nslabs * slab, slab);
    uint32_t cls = class_for(a, block_bytes);
    uint64_t stride = round_stride(block_bytes);
    uint64_t expect = nslabs * (slab / stride);

    struct blk *b = calloc(expect + 1, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    size_t n = 0;
    for (;;) {
        int can = arena_can_alloc(a, cls);
        uint64_t off;
        int rc = arena_alloc(a, cls, &off);
        REQUIRE(can == (rc == 0), "can_alloc %d, alloc %d", __LINE__, can, rc);
        if (rc != 0) {
            ck_assert_int_eq(rc, -KVNODE_ENOSPC);
            break;
        }
        REQUIRE(n < expect, "more blocks than capacity", __LINE__);
        b[n++] = (struct blk){off, block_bytes, cls};
    }
    ck_assert_uint_eq(n, expect);
    ck_assert_int_eq(arena_can_alloc(a, cls), 0);
    struct arena_stats st;
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.blocks, expect);
    ck_assert_uint_eq(st.used_bytes, expect * stride);
    ck_assert_uint_eq(st.slabs_free, 0);
    ck_assert_uint_eq(arena_class_slabs(a, cls), nslabs);
    ck_assert_uint_eq(arena_class_blocks(a, cls), expect);

    blocks_write(a, b, n);
    blocks_check_layout(a, b, n);
    blocks_verify(a, b, n);

    for (size_t k = 0; k < n; k++)
        arena_free(a, b[k].off);
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.blocks, 0);
    ck_assert_uint_eq(st.used_bytes, 0);
    ck_assert_uint_eq(st.slabs_free, nslabs);
    ck_assert_uint_eq(arena_class_slabs(a, cls), 0);
    ck_assert_uint_eq(arena_bad_frees(a), 0);
    free(b);
    arena_destroy(a);
}

START_TEST(test_fill_single_class)
{
    static const uint64_t sizes[] = {64 * KiB, 1 * MiB, 100000, 256, 2 * MiB, 700 * KiB};
    fill_one_class(sizes[_i]);
}
END_TEST

/* Three classes share one arena, allocated round-robin until every class
 * is refused: then every slab is owned and every owned slab is full. */
START_TEST(test_multi_class_fill)
{
    uint64_t slab = 2 * MiB;
    uint32_t nslabs = 12;
    struct arena *a = make_arena(nslabs * slab, slab);
    const uint64_t sizes[3] = {64 * KiB, 1 * MiB, 100000};
    uint32_t cls[3];
    for (int c = 0; c < 3; c++)
        cls[c] = class_for(a, sizes[c]);
    ck_assert_uint_eq(arena_class_count(a), 3);

    size_t cap = nslabs * (slab / ARENA_STRIDE_ALIGN);
    struct blk *b = calloc(cap, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    size_t n = 0;
    int open[3] = {1, 1, 1};
    while (open[0] || open[1] || open[2]) {
        for (int c = 0; c < 3; c++) {
            if (!open[c])
                continue;
            uint64_t off;
            int can = arena_can_alloc(a, cls[c]);
            int rc = arena_alloc(a, cls[c], &off);
            REQUIRE(can == (rc == 0), "can_alloc %d, alloc %d", __LINE__, can, rc);
            if (rc == -KVNODE_ENOSPC) {
                open[c] = 0;
                continue;
            }
            REQUIRE(rc == 0, "alloc %d", __LINE__, rc);
            REQUIRE(n < cap, "more blocks than slots", __LINE__);
            b[n++] = (struct blk){off, sizes[c], cls[c]};
        }
    }

    struct arena_stats st;
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.slabs_free, 0);
    uint32_t slabs_sum = 0;
    uint64_t used = 0, blocks = 0;
    for (int c = 0; c < 3; c++) {
        uint64_t per = slab / round_stride(sizes[c]);
        ck_assert_uint_eq(arena_class_blocks_per_slab(a, cls[c]), per);
        ck_assert_uint_gt(arena_class_slabs(a, cls[c]), 0);
        /* Refused only once all its slabs were full. */
        ck_assert_uint_eq(arena_class_blocks(a, cls[c]), arena_class_slabs(a, cls[c]) * per);
        slabs_sum += arena_class_slabs(a, cls[c]);
        blocks += arena_class_blocks(a, cls[c]);
        used += arena_class_blocks(a, cls[c]) * round_stride(sizes[c]);
    }
    ck_assert_uint_eq(slabs_sum, nslabs);
    ck_assert_uint_eq(blocks, n);
    ck_assert_uint_eq(st.blocks, n);
    ck_assert_uint_eq(st.used_bytes, used);

    blocks_write(a, b, n);
    blocks_check_layout(a, b, n);
    blocks_verify(a, b, n);

    /* Free every other block, verify the rest survived, refill the holes:
     * the class reuses its own slabs without taking new ones. */
    for (size_t k = 0; k < n; k += 2)
        arena_free(a, b[k].off);
    for (size_t k = 1; k < n; k += 2)
        blocks_verify(a, &b[k], 1);
    uint32_t slabs_before[3];
    for (int c = 0; c < 3; c++)
        slabs_before[c] = arena_class_slabs(a, cls[c]);
    for (size_t k = 0; k < n; k += 2) {
        uint64_t off;
        int rc = arena_alloc(a, b[k].cls, &off);
        REQUIRE(rc == 0, "refill %zu: %d", __LINE__, k, rc);
        b[k].off = off;
    }
    for (int c = 0; c < 3; c++) {
        ck_assert_uint_eq(arena_class_slabs(a, cls[c]), slabs_before[c]);
        ck_assert_int_eq(arena_can_alloc(a, cls[c]), 0);
    }
    blocks_write(a, b, n);
    blocks_check_layout(a, b, n);
    blocks_verify(a, b, n);

    for (size_t k = 0; k < n; k++)
        arena_free(a, b[k].off);
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.slabs_free, nslabs);
    ck_assert_uint_eq(st.blocks, 0);
    ck_assert_uint_eq(st.used_bytes, 0);
    for (int c = 0; c < 3; c++) {
        ck_assert_uint_eq(arena_class_slabs(a, cls[c]), 0);
        ck_assert_uint_eq(arena_class_blocks(a, cls[c]), 0);
        ck_assert_int_eq(arena_can_alloc(a, cls[c]), 1);
    }
    ck_assert_uint_eq(arena_bad_frees(a), 0);
    free(b);
    arena_destroy(a);
}
END_TEST

/* A slab emptied by one class goes back to the pool at once and is taken
 * by another class. */
START_TEST(test_slab_reused_by_other_class)
{
    uint64_t slab = 1 * MiB;
    struct arena *a = make_arena(2 * slab, slab);
    uint32_t small = class_for(a, 64 * KiB);
    uint32_t big = class_for(a, 512 * KiB);

    uint64_t s1, s2;
    ck_assert_int_eq(arena_alloc(a, small, &s1), 0);
    ck_assert_int_eq(arena_alloc(a, small, &s2), 0);
    ck_assert_uint_eq(s1 / slab, s2 / slab);    /* same slab */
    uint64_t small_slab = s1 / slab;

    uint64_t b1, b2, b3;
    ck_assert_int_eq(arena_alloc(a, big, &b1), 0);
    ck_assert_int_eq(arena_alloc(a, big, &b2), 0);
    ck_assert_uint_ne(b1 / slab, small_slab);
    ck_assert_uint_eq(b2 / slab, b1 / slab);
    ck_assert_int_eq(arena_can_alloc(a, big), 0);
    ck_assert_int_eq(arena_alloc(a, big, &b3), -KVNODE_ENOSPC);

    arena_free(a, s1);
    ck_assert_int_eq(arena_can_alloc(a, big), 0);   /* slab still holds s2 */
    ck_assert_uint_eq(arena_class_slabs(a, small), 1);
    arena_free(a, s2);
    ck_assert_uint_eq(arena_class_slabs(a, small), 0);
    struct arena_stats st;
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.slabs_free, 1);

    ck_assert_int_eq(arena_can_alloc(a, big), 1);
    ck_assert_int_eq(arena_alloc(a, big, &b3), 0);
    ck_assert_uint_eq(b3 / slab, small_slab);
    ck_assert_uint_eq(arena_class_slabs(a, big), 2);
    /* small now has neither a partial slab nor a free one. */
    ck_assert_int_eq(arena_can_alloc(a, small), 0);
    uint64_t x;
    ck_assert_int_eq(arena_alloc(a, small, &x), -KVNODE_ENOSPC);
    arena_destroy(a);
}
END_TEST

/* A freed slot is reused before another slab is taken. */
START_TEST(test_free_slot_reused)
{
    uint64_t slab = 1 * MiB;
    struct arena *a = make_arena(4 * slab, slab);
    uint32_t cls = class_for(a, 4096);
    uint64_t off[10];
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(arena_alloc(a, cls, &off[i]), 0);
    ck_assert_uint_eq(arena_class_slabs(a, cls), 1);
    arena_free(a, off[4]);
    ck_assert_uint_eq(arena_class_blocks(a, cls), 9);
    uint64_t again;
    ck_assert_int_eq(arena_alloc(a, cls, &again), 0);
    ck_assert_uint_eq(again, off[4]);
    ck_assert_uint_eq(arena_class_slabs(a, cls), 1);
    arena_destroy(a);
}
END_TEST

/* Frees of offsets that are not allocated are counted and change nothing;
 * the allocator still hands out every slot exactly once afterwards. */
START_TEST(test_bad_free_ignored)
{
    uint64_t slab = 1 * MiB;
    uint32_t nslabs = 3;
    struct arena *a = make_arena(nslabs * slab, slab);
    uint32_t cls = class_for(a, 100000);
    uint64_t stride = arena_class_stride(a, cls);
    uint64_t o1, o2;
    ck_assert_int_eq(arena_alloc(a, cls, &o1), 0);
    ck_assert_int_eq(arena_alloc(a, cls, &o2), 0);

    struct arena_stats before, after;
    arena_get_stats(a, &before);
    arena_free(a, arena_size(a));            /* out of range */
    arena_free(a, UINT64_MAX);
    arena_free(a, o1 + 256);                 /* inside a block */
    arena_free(a, 2 * slab);                 /* slab owned by no class */
    arena_free(a, o2 + stride);              /* never allocated slot */
    arena_free(a, (slab / stride) * stride); /* tail of the slab past the last block */
    arena_get_stats(a, &after);
    ck_assert_uint_eq(arena_bad_frees(a), 6);
    ck_assert_mem_eq(&before, &after, sizeof(before));

    arena_free(a, o1);
    arena_free(a, o1);                       /* double free */
    ck_assert_uint_eq(arena_bad_frees(a), 7);
    ck_assert_uint_eq(arena_class_blocks(a, cls), 1);
    arena_free(a, o2);
    arena_free(a, o2);                       /* slab already back in the pool */
    ck_assert_uint_eq(arena_bad_frees(a), 8);
    arena_get_stats(a, &after);
    ck_assert_uint_eq(after.slabs_free, nslabs);
    ck_assert_uint_eq(after.blocks, 0);

    /* Capacity is intact and every slot comes out once. */
    uint64_t expect = nslabs * (slab / stride);
    struct blk *b = calloc(expect, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    size_t n = 0;
    uint64_t off;
    while (arena_alloc(a, cls, &off) == 0) {
        REQUIRE(n < expect, "more blocks than capacity", __LINE__);
        b[n++] = (struct blk){off, 100000, cls};
    }
    ck_assert_uint_eq(n, expect);
    blocks_check_layout(a, b, n);
    free(b);
    arena_destroy(a);
}
END_TEST

/* Random alloc/free across classes against a shadow model of what is
 * allocated: offsets never repeat while live, counters agree throughout. */
START_TEST(test_random_against_model)
{
    uint64_t slab = 256 * KiB;
    uint32_t nslabs = 16;
    struct arena *a = make_arena(nslabs * slab, slab);
    const uint64_t sizes[4] = {256, 4096, 100000, 256 * KiB};
    uint32_t cls[4];
    for (int c = 0; c < 4; c++)
        cls[c] = class_for(a, sizes[c]);

    /* Per 256-byte cell: the class (1-based) of the live block starting
     * there, and whether any live block covers it. */
    size_t cells = nslabs * slab / ARENA_STRIDE_ALIGN;
    unsigned char *start = calloc(cells, 1), *covered = calloc(cells, 1);
    uint64_t *offs = calloc(cells, sizeof(*offs));
    ck_assert_ptr_nonnull(start);
    ck_assert_ptr_nonnull(covered);
    ck_assert_ptr_nonnull(offs);
    size_t nlive = 0;
    uint64_t used = 0, rng = 88172645463325252ULL;

    for (int step = 0; step < 60000; step++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        int c = (int)(rng % 4);
        if (nlive > 0 && (rng >> 8) % 100 < 45) {
            size_t k = (size_t)((rng >> 16) % nlive);
            uint64_t off = offs[k];
            int oc = start[off / ARENA_STRIDE_ALIGN] - 1;
            uint64_t stride = round_stride(sizes[oc]);
            arena_free(a, off);
            start[off / ARENA_STRIDE_ALIGN] = 0;
            memset(covered + off / ARENA_STRIDE_ALIGN, 0, stride / ARENA_STRIDE_ALIGN);
            offs[k] = offs[--nlive];
            used -= stride;
        } else {
            uint64_t off;
            int can = arena_can_alloc(a, cls[c]);
            int rc = arena_alloc(a, cls[c], &off);
            REQUIRE(can == (rc == 0), "can_alloc %d, alloc %d", __LINE__, can, rc);
            if (rc != 0) {
                REQUIRE(rc == -KVNODE_ENOSPC, "alloc %d", __LINE__, rc);
                continue;
            }
            uint64_t stride = round_stride(sizes[c]);
            unsigned long long o = off;
            REQUIRE(o % ARENA_STRIDE_ALIGN == 0, "offset %llu", __LINE__, o);
            REQUIRE(o + stride <= nslabs * slab, "offset %llu", __LINE__, o);
            REQUIRE(o % slab + stride <= slab, "offset %llu", __LINE__, o);
            for (uint64_t p = off / ARENA_STRIDE_ALIGN; p < (off + stride) / ARENA_STRIDE_ALIGN; p++) {
                REQUIRE(covered[p] == 0, "block at %llu overlaps a live block at cell %llu",
                        __LINE__, o, (unsigned long long)p);
                covered[p] = 1;
            }
            start[off / ARENA_STRIDE_ALIGN] = (unsigned char)(c + 1);
            offs[nlive++] = off;
            used += stride;
        }
        struct arena_stats st;
        arena_get_stats(a, &st);
        REQUIRE(st.blocks == nlive, "step %d", __LINE__, step);
        REQUIRE(st.used_bytes == used, "step %d", __LINE__, step);
        uint32_t owned = 0;
        for (int k = 0; k < 4; k++)
            owned += arena_class_slabs(a, cls[k]);
        REQUIRE(owned + st.slabs_free == nslabs, "step %d", __LINE__, step);
    }
    for (size_t k = 0; k < nlive; k++)
        arena_free(a, offs[k]);
    struct arena_stats st;
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.slabs_free, nslabs);
    ck_assert_uint_eq(st.blocks, 0);
    ck_assert_uint_eq(arena_bad_frees(a), 0);
    free(start);
    free(covered);
    free(offs);
    arena_destroy(a);
}
END_TEST

/* Slabs of more than 64*64 minimum-stride slots use three bitmap levels:
 * fill and drain a 4 MiB slab of 256-byte blocks in a scrambled order. */
START_TEST(test_deep_bitmap)
{
    uint64_t slab = 4 * MiB;
    struct arena *a = make_arena(2 * slab, slab);
    uint32_t cls = class_for(a, 256);
    size_t per = slab / 256, n = 2 * per;
    uint64_t *off = calloc(n, sizeof(*off));
    ck_assert_ptr_nonnull(off);
    for (size_t k = 0; k < n; k++) {
        int rc = arena_alloc(a, cls, &off[k]);
        REQUIRE(rc == 0, "alloc %zu: %d", __LINE__, k, rc);
        /* Lowest free slot first, slab 0 first: offsets are sequential. */
        REQUIRE(off[k] == k * 256, "block %zu at %llu", __LINE__, k, (unsigned long long)off[k]);
    }
    uint64_t x;
    ck_assert_int_eq(arena_alloc(a, cls, &x), -KVNODE_ENOSPC);
    /* Free a scattered set over both slabs: the allocator hands back
     * exactly that set (in its own order), then is full again. */
    uint64_t freed[16], got[16];
    size_t nfreed = 0;
    for (size_t k = 7; k < n; k += 4099)
        arena_free(a, freed[nfreed++] = off[k]);
    ck_assert_uint_eq(nfreed, 8);
    for (size_t k = 0; k < nfreed; k++)
        ck_assert_int_eq(arena_alloc(a, cls, &got[k]), 0);
    ck_assert_int_eq(arena_alloc(a, cls, &x), -KVNODE_ENOSPC);
    qsort(got, nfreed, sizeof(got[0]), u64_cmp);
    ck_assert_mem_eq(got, freed, nfreed * sizeof(got[0]));   /* freed[] is ascending */
    for (size_t k = 0; k < n; k++)
        arena_free(a, off[(k * 7919) % n]);   /* 7919 is prime, n a power of 2 */
    struct arena_stats st;
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.slabs_free, 2);
    ck_assert_uint_eq(st.blocks, 0);
    ck_assert_uint_eq(arena_bad_frees(a), 0);
    free(off);
    arena_destroy(a);
}
END_TEST

/* A deferred arena places nothing until reserved; then only slabs wholly
 * inside the reserved part, and a freed slab is reused before the bound. */
/* arena_free_slots counts the class's free slots and a slab's worth per
 * free slab inside the reserved part, whatever other classes hold. */
START_TEST(test_free_slots)
{
    struct arena *a;
    char err[256];
    uint64_t offs[8], off;
    ck_assert_int_eq(arena_create_host_deferred(3, 4 * MiB, MiB, ARENA_HUGE_OFF, &a, err, sizeof err), 0);
    uint32_t q = class_for(a, MiB / 4), h = class_for(a, MiB / 2);
    ck_assert_uint_eq(arena_free_slots(a, q), 0);             /* nothing reserved yet */
    arena_mark_reserved(a, 3 * MiB);
    ck_assert_uint_eq(arena_free_slots(a, q), 12);
    ck_assert_uint_eq(arena_free_slots(a, h), 6);
    ck_assert_uint_eq(arena_free_slots(a, 99), 0);            /* unknown class */
    ck_assert_int_eq(arena_alloc(a, q, &offs[0]), 0);         /* q takes a slab: 3 of its 4 left */
    ck_assert_uint_eq(arena_free_slots(a, q), 11);
    ck_assert_uint_eq(arena_free_slots(a, h), 4);
    ck_assert_int_eq(arena_alloc(a, h, &offs[1]), 0);
    ck_assert_uint_eq(arena_free_slots(a, q), 7);
    ck_assert_uint_eq(arena_free_slots(a, h), 3);
    for (int i = 2; i < 5; i++)
        ck_assert_int_eq(arena_alloc(a, q, &offs[i]), 0);     /* q's slab full */
    ck_assert_uint_eq(arena_free_slots(a, q), 4);
    arena_mark_reserved(a, 4 * MiB);
    ck_assert_uint_eq(arena_free_slots(a, q), 8);
    for (uint64_t n = arena_free_slots(a, q); n > 0; n--) {
        ck_assert(arena_can_alloc(a, q));
        ck_assert_int_eq(arena_alloc(a, q, &off), 0);
    }
    ck_assert(!arena_can_alloc(a, q));
    ck_assert_uint_eq(arena_free_slots(a, h), 1);             /* h's own slab's last slot */
    arena_free(a, offs[0]);
    ck_assert_uint_eq(arena_free_slots(a, q), 1);
    arena_destroy(a);
}
END_TEST

START_TEST(test_deferred_reserved_bound)
{
    struct arena *a;
    char err[256];
    uint32_t cls;
    uint64_t off, offs[8];
    struct arena_stats st;

    ck_assert_int_eq(arena_create_host_deferred(3, 8 * MiB, MiB, ARENA_HUGE_OFF, &a, err, sizeof err), 0);
    ck_assert_int_eq(arena_class_for(a, MiB, &cls), 0);
    ck_assert_int_eq(arena_reserved(a), 0);
    ck_assert(!arena_can_alloc(a, cls));
    ck_assert_int_eq(arena_alloc(a, cls, &off), -KVNODE_ENOSPC);
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.capacity, 8 * MiB);
    ck_assert_uint_eq(st.reserved_bytes, 0);
    ck_assert_uint_eq(st.slabs_free, 0);

    arena_mark_reserved(a, 2 * MiB + MiB / 2);    /* 2 whole slabs */
    ck_assert(arena_can_alloc(a, cls));
    ck_assert_int_eq(arena_alloc(a, cls, &offs[0]), 0);
    ck_assert_int_eq(arena_alloc(a, cls, &offs[1]), 0);
    ck_assert_uint_eq(offs[0], 0);
    ck_assert_uint_eq(offs[1], MiB);
    ck_assert(!arena_can_alloc(a, cls));
    ck_assert_int_eq(arena_alloc(a, cls, &off), -KVNODE_ENOSPC);
    arena_free(a, offs[0]);
    ck_assert_int_eq(arena_alloc(a, cls, &off), 0);
    ck_assert_uint_eq(off, 0);

    arena_mark_reserved(a, UINT64_MAX);            /* clamped to the size */
    for (int i = 2; i < 8; i++) {
        ck_assert_int_eq(arena_alloc(a, cls, &offs[i]), 0);
        ck_assert_uint_eq(offs[i], (uint64_t)i * MiB);
    }
    ck_assert_int_eq(arena_alloc(a, cls, &off), -KVNODE_ENOSPC);
    arena_get_stats(a, &st);
    ck_assert_uint_eq(st.reserved_bytes, 8 * MiB);
    ck_assert_uint_eq(st.slabs_free, 0);
    arena_destroy(a);
}
END_TEST

/* Regions: validation, placement in the wanted region, fallback to the
 * others when it is full, a freed slab going back to its own region. */
START_TEST(test_regions_place_and_fall_back)
{
    struct arena *a = make_arena(8 * MiB, MiB);
    uint32_t cls = class_for(a, MiB / 2);
    uint64_t bad[2] = { 3 * MiB + 1, 8 * MiB }, short_end[2] = { 3 * MiB, 7 * MiB };
    uint64_t ends[2] = { 6 * MiB, 8 * MiB }, off, offs[4];
    struct arena_region_stats rs;
    char err[256];

    ck_assert_uint_eq(arena_region_count(a), 1);
    ck_assert_int_eq(arena_set_regions(a, 0, ends, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_int_eq(arena_set_regions(a, ARENA_MAX_REGIONS + 1, ends, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_int_eq(arena_set_regions(a, 2, bad, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_msg(strstr(err, "whole slabs") != NULL, "err: %s", err);
    ck_assert_int_eq(arena_set_regions(a, 2, short_end, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_int_eq(arena_set_regions(a, 2, ends, err, sizeof err), 0);
    ck_assert_uint_eq(arena_region_count(a), 2);
    ck_assert_uint_eq(arena_region_of(a, 6 * MiB - 1), 0);
    ck_assert_uint_eq(arena_region_of(a, 6 * MiB), 1);

    /* Region 1 (slabs 6, 7) first, in order, then region 0. */
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(arena_alloc_near(a, cls, 1, &offs[i]), 0);
        ck_assert_uint_eq(offs[i], 6 * MiB + (uint64_t)i * (MiB / 2));
    }
    arena_get_region_stats(a, 1, &rs);
    ck_assert_uint_eq(rs.start, 6 * MiB);
    ck_assert_uint_eq(rs.end, 8 * MiB);
    ck_assert_uint_eq(rs.used_bytes, 2 * MiB);
    ck_assert_uint_eq(rs.slabs_free, 0);
    ck_assert_int_eq(arena_alloc_near(a, cls, 1, &off), 0);
    ck_assert_uint_eq(arena_region_of(a, off), 0);
    arena_get_region_stats(a, 0, &rs);
    ck_assert_uint_eq(rs.used_bytes, MiB / 2);
    ck_assert_uint_eq(rs.slabs_free, 5);
    /* Once placed, regions are fixed. */
    ck_assert_int_eq(arena_set_regions(a, 2, ends, err, sizeof err), -KVNODE_EINVAL);

    /* A slab emptied in region 1 goes back to region 1. */
    arena_free(a, offs[2]);
    arena_free(a, offs[3]);
    arena_get_region_stats(a, 1, &rs);
    ck_assert_uint_eq(rs.slabs_free, 1);
    ck_assert_int_eq(arena_alloc_near(a, cls, 1, &off), 0);
    ck_assert_uint_eq(off, 7 * MiB);
    /* No preference: a partly used slab (region 0's comes first), never a
     * new slab while one has room. */
    ck_assert_int_eq(arena_alloc(a, cls, &off), 0);
    ck_assert_uint_eq(off, MiB / 2);
    arena_get_region_stats(a, 0, &rs);
    ck_assert_uint_eq(rs.slabs_free, 5);
    ck_assert_uint_eq(arena_bad_frees(a), 0);
    arena_destroy(a);
}
END_TEST

/* ANY takes a new slab from the region with the most free ones; the
 * reserved prefix holds per region (region 1 waits for population). */
START_TEST(test_regions_reserved_and_any)
{
    struct arena *a;
    char err[256];
    uint32_t cls;
    uint64_t ends[2] = { 2 * MiB, 8 * MiB }, off;

    ck_assert_int_eq(arena_create_host_deferred(3, 8 * MiB, MiB, ARENA_HUGE_OFF, &a, err, sizeof err), 0);
    ck_assert_int_eq(arena_set_regions(a, 2, ends, err, sizeof err), 0);
    ck_assert_int_eq(arena_class_for(a, MiB, &cls), 0);
    arena_mark_reserved(a, 3 * MiB);              /* region 0 and one slab of region 1 */
    ck_assert_int_eq(arena_alloc(a, cls, &off), 0);
    ck_assert_uint_eq(off, 2 * MiB);              /* region 1 has more free slabs */
    ck_assert_int_eq(arena_alloc_near(a, cls, 1, &off), 0);
    ck_assert_uint_eq(arena_region_of(a, off), 0); /* region 1's next slab is not reserved */
    ck_assert_int_eq(arena_alloc_near(a, cls, 1, &off), 0);
    ck_assert_uint_eq(arena_region_of(a, off), 0);
    ck_assert_int_eq(arena_alloc_near(a, cls, 0, &off), -KVNODE_ENOSPC);
    ck_assert(!arena_can_alloc(a, cls));
    arena_mark_reserved(a, 8 * MiB);
    ck_assert(arena_can_alloc(a, cls));
    ck_assert_int_eq(arena_alloc_near(a, cls, 0, &off), 0);
    ck_assert_uint_eq(off, 3 * MiB);              /* region 0 full: region 1 */
    arena_destroy(a);
}
END_TEST

static Suite *arena_suite(void)
{
    Suite *s = suite_create("arena");
    TCase *tc = tcase_create("host");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_create_basic);
    tcase_add_test(tc, test_create_errors);
    tcase_add_test(tc, test_memfd_sealed_cloexec_shared);
    tcase_add_test(tc, test_memfd_readonly_twin);
    tcase_add_test(tc, test_class_for);
    tcase_add_test(tc, test_class_limit);
    tcase_add_loop_test(tc, test_fill_single_class, 0, 6);
    tcase_add_test(tc, test_multi_class_fill);
    tcase_add_test(tc, test_slab_reused_by_other_class);
    tcase_add_test(tc, test_free_slot_reused);
    tcase_add_test(tc, test_bad_free_ignored);
    tcase_add_test(tc, test_random_against_model);
    tcase_add_test(tc, test_deep_bitmap);
    tcase_add_test(tc, test_deferred_reserved_bound);
    tcase_add_test(tc, test_free_slots);
    tcase_add_test(tc, test_regions_place_and_fall_back);
    tcase_add_test(tc, test_regions_reserved_and_any);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(arena_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
