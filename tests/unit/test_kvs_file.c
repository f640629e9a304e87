/* Unit tests of the `file` KV-store backend, the segment log
 * (daemon/persist/kvs/file*.c): round trips, atomic overwrite, integrity
 * checks (every kind of damage to a stored payload reads as KVS_CORRUPT and
 * drops the key), stale hint temporaries, the incremental recovery scan,
 * capacity (whole segments dropped), no paths from names, disk full, and
 * several threads sharing one root. Crash, torn-tail and hint cases, and
 * the refusal of a 0.1.0-pre root: test_kvs_seglog.c. Each test works in
 * its own mkdtemp() directory under $TMPDIR, removed afterwards. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/rmtree.h"
#include "kvnode.h"
#include "persist/kvs/crc32c.h"
#include "persist/kvs/file.h"
#include "persist/kvs/kvs.h"
#include "mem/namespace.h"

#include "kvs_testutil.h"
#include "../common/proc.h"

static const struct kvs_backend *be;
static char tmpdir[1024];       /* the test's own directory */
static char root[2048];         /* the store's root, inside it */
static char err[512];

static struct kvs_store *open_store(uint64_t capacity, int fsync_policy)
{
    struct kvs_config cfg = { .backend = "file", .path = root, .capacity_bytes = capacity,
                              .fsync_policy = fsync_policy };
    struct kvs_store *s = NULL;
    int rc = be->open(&cfg, &s, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return s;
}

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/kvs-file-XXXXXX", t && *t ? t : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(root, sizeof(root), "%s/store/root", tmpdir);   /* open makes it (mkdir -p) */
    be = kvs_backend_find("file");
    ck_assert_ptr_nonnull(be);
}

static void teardown(void)
{
    test_rmtree(tmpdir);
}

static int put_block(struct kvs_store *s, struct tns *t, int64_t key, uint32_t salt)
{
    return kvs_test_put_block(be, s, t, key, salt, err, sizeof(err));
}

/* 0 when the block reads back byte-exact with salt; else get's result or -999. */
static int check_block(struct kvs_store *s, struct tns *t, int64_t key, uint32_t salt)
{
    return kvs_test_check_block(be, s, t, key, salt, err, sizeof(err));
}

static int path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Entries of dir: temporaries (*.tmp), segments (seg-*.log), directories. */
struct dir_count {
    size_t temps, segs, dirs, other;
};

static struct dir_count count_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    struct dir_count n = { 0 };
    if (!d)
        return n;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (de->d_name[0] == '.' && (l == 1 || strcmp(de->d_name, "..") == 0))
            continue;
        if (de->d_type == DT_DIR)
            n.dirs++;
        else if (l > 4 && strcmp(de->d_name + l - 4, ".tmp") == 0)
            n.temps++;
        else if (strncmp(de->d_name, "seg-", 4) == 0 && strcmp(de->d_name + l - 4, ".log") == 0)
            n.segs++;
        else if (de->d_name[0] != '.')          /* .lock is the root's own */
            n.other++;
    }
    closedir(d);
    return n;
}

static void dir_of(const char *path, char *out)
{
    snprintf(out, PATH_MAX, "%s", path);
    *strrchr(out, '/') = '\0';
}

static int locate(struct kvs_store *s, const struct tns *t, int64_t key, char *p, uint64_t *off)
{
    return kvs_file_locate(s, &t->ns, key, p, PATH_MAX, off);
}

/* ------------------------------------------------------------------------------- */

START_TEST(test_find_and_crc)
{
    uint8_t buf[1000];
    ck_assert_ptr_nonnull(kvs_backend_find("file"));
    ck_assert_str_eq(kvs_backend_find("file")->name, "file");
    ck_assert_ptr_null(kvs_backend_find("nope"));
    ck_assert_ptr_null(kvs_backend_find(NULL));
    ck_assert_uint_eq(crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(crc32c_sw(0, "123456789", 9), 0xE3069283u);
    fill(buf, sizeof(buf), 7, 7);
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n + off <= sizeof(buf); n += 37)
            ck_assert_uint_eq(crc32c(0, buf + off, n), crc32c_sw(0, buf + off, n));
    /* incremental == one shot */
    ck_assert_uint_eq(crc32c(crc32c(0, buf, 100), buf + 100, 900), crc32c(0, buf, 1000));
    /* Long buffers (the hardware path's three interleaved streams and their
     * combination), at odd offsets and lengths around its stripe sizes. */
    size_t big_len = (1u << 20) + 64;
    uint8_t *big = malloc(big_len);
    ck_assert_ptr_nonnull(big);
    fill(big, big_len, 11, 3);
    static const size_t lens[] = { 767, 768, 769, 3 * 256 * 5 + 17, 12287, 12288, 12289, 24576 + 5,
                                   65536, 65536 + 48 + 7, 1u << 20 };
    for (size_t off = 0; off < 3; off++)
        for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
            ck_assert_msg(crc32c(5, big + off, lens[i]) == crc32c_sw(5, big + off, lens[i]),
                          "offset %zu length %zu", off, lens[i]);
    free(big);
}
END_TEST

START_TEST(test_roundtrip)
{
    static const uint64_t sizes[] = { 1, 4096, 65536 + 13, 1u << 20 };
    struct kvs_store *s = open_store(0, KVS_FSYNC_ALWAYS);
    struct tns t[8];
    int n = 0;
    ck_assert_int_eq(be->health(s, err, sizeof(err)), 0);
    for (size_t i = 0; i < 4; i++)
        for (uint32_t rank = 0; rank < 2; rank++) {
            char model[32];
            snprintf(model, sizeof(model), "model-%zu", i);
            mkns(&t[n++], model, sizes[i], rank);
        }
    for (int i = 0; i < n; i++)
        for (int64_t key = -3; key <= 3; key++)
            ck_assert_int_eq(put_block(s, &t[i], key * 1000003, (uint32_t)i), 0);
    for (int i = 0; i < n; i++)
        for (int64_t key = -3; key <= 3; key++)
            ck_assert_int_eq(check_block(s, &t[i], key * 1000003, (uint32_t)i), 0);
    ck_assert_int_eq(check_block(s, &t[0], 42, 0), KVS_MISS);
    ck_assert_int_eq(check_block(s, &t[0], INT64_MIN, 0), KVS_MISS);
    ck_assert_int_eq(put_block(s, &t[0], INT64_MIN, 9), 0);
    ck_assert_int_eq(put_block(s, &t[0], INT64_MAX, 9), 0);
    ck_assert_int_eq(check_block(s, &t[0], INT64_MIN, 9), 0);
    ck_assert_int_eq(check_block(s, &t[0], INT64_MAX, 9), 0);

    /* the layout: records in one segment file directly under the root, no
     * directory per namespace, no temporary left */
    char p[PATH_MAX], d[PATH_MAX], real_root[PATH_MAX];
    uint64_t off = 1;
    ck_assert_int_eq(locate(s, &t[3], 0, p, &off), 0);
    ck_assert_ptr_nonnull(realpath(root, real_root));
    dir_of(p, d);
    ck_assert_str_eq(d, real_root);
    ck_assert_uint_eq(off % 64, 0);
    struct dir_count dc = count_dir(root);
    ck_assert_uint_eq(dc.temps, 0);
    ck_assert_uint_eq(dc.dirs, 0);
    ck_assert_uint_eq(dc.segs, 1);                     /* one handle: one open segment */
    be->close(s);
}
END_TEST

START_TEST(test_namespaces_independent)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_BATCH);
    struct tns a, b, a1;
    mkns(&a, "alpha", 4096, 0);
    mkns(&b, "beta", 4096, 0);
    mkns(&a1, "alpha", 4096, 1);
    ck_assert_int_eq(put_block(s, &a, 5, 1), 0);
    ck_assert_int_eq(put_block(s, &b, 5, 2), 0);
    ck_assert_int_eq(put_block(s, &a1, 5, 3), 0);
    ck_assert_int_eq(check_block(s, &a, 5, 1), 0);
    ck_assert_int_eq(check_block(s, &b, 5, 2), 0);
    ck_assert_int_eq(check_block(s, &a1, 5, 3), 0);
    ck_assert_int_eq(be->del(s, &a.ns, 5, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(check_block(s, &a, 5, 1), KVS_MISS);
    ck_assert_int_eq(check_block(s, &b, 5, 2), 0);
    ck_assert_int_eq(check_block(s, &a1, 5, 3), 0);
    be->close(s);
}
END_TEST

START_TEST(test_exists_del)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns a;
    int64_t keys[] = { 1, 2, 3, -4 };
    uint8_t present[4];
    mkns(&a, "m", 512, 0);
    ck_assert_int_eq(be->exists(s, &a.ns, keys, NULL, 4, present, err, sizeof(err)), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(present[i], 0);
    ck_assert_int_eq(put_block(s, &a, 2, 0), 0);
    ck_assert_int_eq(put_block(s, &a, -4, 0), 0);
    ck_assert_int_eq(be->exists(s, &a.ns, keys, NULL, 4, present, err, sizeof(err)), 0);
    ck_assert_int_eq(present[0], 0);
    ck_assert_int_eq(present[1], 1);
    ck_assert_int_eq(present[2], 0);
    ck_assert_int_eq(present[3], 1);
    ck_assert_int_eq(be->del(s, &a.ns, 2, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(be->del(s, &a.ns, 2, 0, err, sizeof(err)), 0);     /* absent: fine */
    ck_assert_int_eq(be->del(s, &a.ns, 999, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(be->exists(s, &a.ns, keys, NULL, 4, present, err, sizeof(err)), 0);
    ck_assert_int_eq(present[1], 0);
    ck_assert_int_eq(present[3], 1);
    be->close(s);
}
END_TEST

struct ow_arg {
    struct kvs_store *s;
    struct tns *t;
    volatile int stop;
    int bad;
    int reads;
};

static void *ow_reader(void *p)
{
    struct ow_arg *a = p;
    size_t len = a->t->l.block_bytes;
    uint8_t *b = malloc(len), *v1 = malloc(len), *v2 = malloc(len);
    char e[256];
    fill(v1, len, 77, 1);
    fill(v2, len, 77, 2);
    for (int i = 0; i < 200; i++) {
        int rc = be->get(a->s, &a->t->ns, 77, 0, b, len, e, sizeof(e));
        if (rc != 0 || (memcmp(b, v1, len) != 0 && memcmp(b, v2, len) != 0))
            a->bad++;
        a->reads++;
    }
    free(b);
    free(v1);
    free(v2);
    return NULL;
}

START_TEST(test_overwrite_atomic)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER), *s2 = open_store(0, KVS_FSYNC_NEVER);
    struct tns a;
    struct ow_arg arg;
    pthread_t th;
    mkns(&a, "ow", 65536, 0);
    ck_assert_int_eq(put_block(s, &a, 77, 1), 0);
    ck_assert_int_eq(put_block(s, &a, 77, 2), 0);
    ck_assert_int_eq(check_block(s, &a, 77, 2), 0);
    /* a reader (own handle) always sees the old or the new block, whole */
    memset(&arg, 0, sizeof(arg));
    arg.s = s2;
    arg.t = &a;
    ck_assert_int_eq(pthread_create(&th, NULL, ow_reader, &arg), 0);
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(put_block(s, &a, 77, 1 + (uint32_t)(i & 1)), 0);
    pthread_join(th, NULL);
    ck_assert_int_eq(arg.reads, 200);
    ck_assert_int_eq(arg.bad, 0);
    ck_assert_uint_eq(count_dir(root).temps, 0);
    be->close(s2);
    be->close(s);
}
END_TEST

START_TEST(test_size_mismatch)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns a, big;
    char p[PATH_MAX];
    uint64_t off;
    uint8_t buf[8192];
    mkns(&a, "sz", 4096, 0);
    mkns(&big, "sz", 8192, 0);       /* same deployment, another block size */
    ck_assert_uint_eq(a.ns.fingerprint, big.ns.fingerprint);
    ck_assert_int_eq(put_block(s, &a, 1, 0), 0);
    ck_assert_int_eq(locate(s, &a, 1, p, &off), 0);
    /* len != layout block_bytes: a caller bug, the copy stays */
    ck_assert_int_eq(be->get(s, &a.ns, 1, 0, buf, 100, err, sizeof(err)), -KVNODE_EINVAL);
    ck_assert_int_eq(be->put(s, &a.ns, 1, 0, buf, 100, err, sizeof(err)), -KVNODE_EINVAL);
    ck_assert_int_eq(locate(s, &a, 1, p, &off), 0);
    ck_assert_int_eq(check_block(s, &a, 1, 0), 0);
    /* stored size != the (new) block size: corrupt, dropped from the index */
    ck_assert_int_eq(be->get(s, &big.ns, 1, 0, buf, 8192, err, sizeof(err)), KVS_CORRUPT);
    ck_assert_int_eq(locate(s, &a, 1, p, &off), KVS_MISS);
    ck_assert_int_eq(check_block(s, &a, 1, 0), KVS_MISS);
    be->close(s);
}
END_TEST

/* Damage the stored copy of key 9 with `how`; expect KVS_CORRUPT, the key
 * dropped from the index (a miss next), and key 10 (stored after it)
 * intact unless the damage reached it. */
static void damage_case(int how)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns a, other;
    struct kvs_file_stats st;
    char p[PATH_MAX], q[PATH_MAX];
    uint64_t rec, rec10;
    int fd;
    uint8_t byte;
    mkns(&a, "dmg", 4096, 0);
    mkns(&other, "dmg-other", 4096, 0);
    ck_assert_int_eq(put_block(s, &a, 9, 0), 0);
    ck_assert_int_eq(put_block(s, &a, 10, 0), 0);
    ck_assert_int_eq(locate(s, &a, 9, p, &rec), 0);
    ck_assert_int_eq(locate(s, &a, 10, q, &rec10), 0);
    ck_assert_str_eq(p, q);
    off_t off = 0;
    switch (how) {
    case 0: off = (off_t)rec + 64 + 1234; break;        /* a payload byte */
    case 1: off = (off_t)rec + 64; break;               /* the first payload byte */
    case 2: off = (off_t)rec + 64 + 4095; break;        /* the last payload byte */
    default: break;
    }
    if (how <= 2) {
        fd = open(p, O_RDWR);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(pread(fd, &byte, 1, off), 1);
        byte ^= 0x40;
        ck_assert_int_eq(pwrite(fd, &byte, 1, off), 1);
        close(fd);
    } else if (how == 3) {
        ck_assert_int_eq(truncate(p, (off_t)rec + 64 + 4000), 0);   /* cut inside the payload */
    } else if (how == 4) {
        ck_assert_int_eq(truncate(p, (off_t)rec + 10), 0);          /* cut inside the header */
    } else if (how == 5) {
        /* a well-formed payload of another key where key 9's was */
        uint8_t b10[4096];
        fd = open(p, O_RDWR);
        ck_assert_int_eq(pread(fd, b10, sizeof b10, (off_t)rec10 + 64), 4096);
        ck_assert_int_eq(pwrite(fd, b10, sizeof b10, (off_t)rec + 64), 4096);
        close(fd);
    } else if (how == 6) {
        /* zeros (a hole) over the payload */
        uint8_t z[4096] = { 0 };
        fd = open(p, O_RDWR);
        ck_assert_int_eq(pwrite(fd, z, sizeof z, (off_t)rec + 64), 4096);
        close(fd);
    } else if (how == 7) {
        /* the segment file replaced by another (no data at that offset) */
        ck_assert_int_eq(unlink(p), 0);
        ck_assert_int_eq(close(open(p, O_CREAT | O_WRONLY, 0644)), 0);
    }
    ck_assert_int_eq(check_block(s, &a, 9, 0), KVS_CORRUPT);
    ck_assert_msg(strstr(err, p) != NULL, "message names the segment: %s", err);
    ck_assert_int_eq(locate(s, &a, 9, q, &rec), KVS_MISS);
    ck_assert_int_eq(check_block(s, &a, 9, 0), KVS_MISS);
    if (how != 3 && how != 4 && how != 7)
        ck_assert_int_eq(check_block(s, &a, 10, 0), 0);
    else
        ck_assert_int_eq(check_block(s, &a, 10, 0), KVS_CORRUPT);   /* cut too: never wrong bytes */
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.corrupt, how == 3 || how == 4 || how == 7 ? 2 : 1);
    be->close(s);
}

START_TEST(test_corrupt)
{
    damage_case(_i);
}
END_TEST

/* ---- scan ---------------------------------------------------------------------- */

struct seen {
    int n, calls_over_budget;
    struct kvs_found f[256];
};

static void on_found(void *arg, const struct kvs_found *f)
{
    struct seen *sn = arg;
    ck_assert_int_lt(sn->n, 256);
    sn->f[sn->n++] = *f;
}

static int scan_all(struct kvs_store *s, size_t budget, struct seen *sn, int *calls)
{
    struct kvs_scan *cur = NULL;
    int rc;
    *calls = 0;
    do {
        int before = sn->n;
        rc = be->scan(s, &cur, budget, on_found, sn, err, sizeof(err));
        (*calls)++;
        if ((size_t)(sn->n - before) > budget)
            sn->calls_over_budget++;
        ck_assert_int_lt(*calls, 100000);
    } while (rc == 0);
    ck_assert_ptr_null(cur);
    return rc;
}

static int seen_has(const struct seen *sn, const struct tns *t, int64_t key)
{
    int hits = 0;
    for (int i = 0; i < sn->n; i++)
        if (sn->f[i].key == key && sn->f[i].fingerprint == t->ns.fingerprint &&
            sn->f[i].layout.tp_rank == t->l.tp_rank) {
            ck_assert_uint_eq(sn->f[i].size, t->l.block_bytes);
            ck_assert_str_eq(sn->f[i].layout.model, t->l.model);
            ck_assert_str_eq(sn->f[i].layout.dtype, t->l.dtype);
            ck_assert_uint_eq(sn->f[i].layout.block_bytes, t->l.block_bytes);
            ck_assert_uint_eq(sn->f[i].layout.tp_size, t->l.tp_size);
            ck_assert_uint_eq(ns_fingerprint(&sn->f[i].layout), t->ns.fingerprint);
            hits++;
        }
    return hits;
}

START_TEST(test_scan)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns t[3];
    struct seen *sn = calloc(1, sizeof(*sn));
    struct kvs_file_stats st;
    char junk[PATH_MAX + 64], tmp[PATH_MAX + 64], readme[PATH_MAX + 64];
    int calls;
    mkns(&t[0], "scan-a", 1024, 0);
    mkns(&t[1], "scan-a", 1024, 1);
    mkns(&t[2], "scan-b", 2048, 0);
    for (int i = 0; i < 3; i++)
        for (int64_t k = 0; k < 20; k++)
            ck_assert_int_eq(put_block(s, &t[i], k * 7919 - 50, 0), 0);
    be->close(s);

    /* junk that must not be reported: a segment of garbage, a hint file cut
     * short by a crash, a file that is not ours */
    snprintf(junk, sizeof(junk), "%s/seg-00000000000000ff.log", root);
    FILE *f = fopen(junk, "w");
    ck_assert_ptr_nonnull(f);
    fputs("this is not a segment, not at all; it is long enough to hold a record header ......", f);
    fclose(f);
    snprintf(tmp, sizeof(tmp), "%s/seg-00000000000000fe.hint.tmp", root);
    ck_assert_int_eq(close(open(tmp, O_CREAT | O_WRONLY, 0644)), 0);
    snprintf(readme, sizeof(readme), "%s/README", root);
    ck_assert_int_eq(close(open(readme, O_CREAT | O_WRONLY, 0644)), 0);

    s = open_store(0, KVS_FSYNC_NEVER);
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.blocks, 0);                   /* a new process knows nothing yet */
    ck_assert(!path_exists(tmp));                      /* the hint temporary went at open */
    ck_assert_int_eq(scan_all(s, 3, sn, &calls), 1);
    ck_assert_int_eq(sn->calls_over_budget, 0);
    ck_assert_int_ge(calls, 20);
    ck_assert_int_eq(sn->n, 60);
    for (int i = 0; i < 3; i++)
        for (int64_t k = 0; k < 20; k++)
            ck_assert_int_eq(seen_has(sn, &t[i], k * 7919 - 50), 1);
    ck_assert(!path_exists(junk));                     /* cut to nothing, then removed */
    ck_assert(path_exists(readme));
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.blocks, 60);
    ck_assert_uint_eq(st.bytes, 40 * (64 + 1024) + 20 * (64 + 2048));
    ck_assert_uint_eq(st.torn_tails, 1);
    ck_assert_uint_eq(st.hints_loaded, 1);             /* the closed segment: from its hint */
    ck_assert_uint_eq(st.hints_bad, 1);                /* the garbage one: read, cut */
    for (int i = 0; i < 3; i++)
        for (int64_t k = 0; k < 20; k++)
            ck_assert_int_eq(check_block(s, &t[i], k * 7919 - 50, 0), 0);

    /* a second scan (the keydir already knows everything) finds the same; one
     * big budget finishes in one call */
    memset(sn, 0, sizeof(*sn));
    ck_assert_int_eq(scan_all(s, 1000, sn, &calls), 1);
    ck_assert_int_eq(calls, 1);
    ck_assert_int_eq(sn->n, 60);
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.blocks, 60);

    /* abandoning a scan frees its cursor */
    struct kvs_scan *cur = NULL;
    memset(sn, 0, sizeof(*sn));
    ck_assert_int_eq(be->scan(s, &cur, 2, on_found, sn, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(cur);
    ck_assert_int_eq(be->scan(s, &cur, 0, on_found, sn, err, sizeof(err)), 1);
    ck_assert_ptr_null(cur);

    be->close(s);
    free(sn);
}
END_TEST

/* Tenants (issue 15): a named tenant's root lives in <default root>/tenants/
 * <NAME>; its records carry the tenant's fingerprint. Each scan finds its
 * own tenant's blocks only, the same layout and key in both included. */
static struct kvs_store *open_tenant_store(const char *path, const char *tenant)
{
    struct kvs_config cfg = { .backend = "file", .path = path, .fsync_policy = KVS_FSYNC_NEVER,
                              .tenant = tenant };
    struct kvs_store *s = NULL;
    int rc = be->open(&cfg, &s, err, sizeof(err));
    ck_assert_msg(rc == 0, "open %s: %d %s", path, rc, err);
    return s;
}

START_TEST(test_tenant_roots)
{
    char troot[PATH_MAX];
    struct tns d, a;
    struct seen *sn = calloc(1, sizeof(*sn));
    int calls;

    snprintf(troot, sizeof troot, "%s/tenants/alpha", root);
    struct kvs_store *sd = open_tenant_store(root, NULL), *sa = open_tenant_store(troot, "alpha");
    mkns(&d, "same-model", 1024, 0);
    mkns(&a, "same-model", 1024, 0);
    a.ns.fingerprint = ns_fingerprint_tenant(&a.l, "alpha");
    ns_deployment_id(&a.l, a.ns.fingerprint, a.id, sizeof(a.id));
    ck_assert_int_eq(put_block(sd, &d, 7, 1), 0);
    ck_assert_int_eq(put_block(sa, &a, 7, 2), 0);
    ck_assert_int_eq(check_block(sd, &d, 7, 1), 0);
    ck_assert_int_eq(check_block(sa, &a, 7, 2), 0);

    /* The default root's scan leaves tenants/ alone. */
    ck_assert_int_eq(scan_all(sd, 16, sn, &calls), 1);
    ck_assert_int_eq(sn->n, 1);
    ck_assert_uint_eq(sn->f[0].fingerprint, ns_fingerprint(&d.l));
    memset(sn, 0, sizeof(*sn));
    ck_assert_int_eq(scan_all(sa, 16, sn, &calls), 1);
    ck_assert_int_eq(sn->n, 1);
    ck_assert_uint_eq(sn->f[0].fingerprint, ns_fingerprint_tenant(&a.l, "alpha"));
    be->close(sa);

    /* The same root opened for another tenant finds nothing of alpha's. */
    struct kvs_store *sb = open_tenant_store(troot, "beta");
    memset(sn, 0, sizeof(*sn));
    ck_assert_int_eq(scan_all(sb, 16, sn, &calls), 1);
    ck_assert_int_eq(sn->n, 0);
    be->close(sb);
    be->close(sd);
    free(sn);
}
END_TEST

/* Issue 27: a layout with '|' in a string has a new identity; what a version
 * before it wrote (layout records and records carrying the old fingerprint,
 * ns_fingerprint_v1) is found at recovery under the new one and reads back
 * byte-exact, from the hint and, without it, from the records (which write a
 * hint in the new terms). New writes go under the new fingerprint. Default
 * root and a tenant's, _i picks which. */
START_TEST(test_old_identity_recovered)
{
    const char *tenant = _i ? "alpha" : NULL;
    char troot[PATH_MAX], hint[PATH_MAX];
    snprintf(troot, sizeof troot, "%s%s", root, _i ? "/tenants/alpha" : "");
    struct tns old, cur;
    mkns(&old, "pipe-model", 1024, 1);
    snprintf(old.l.extra, sizeof old.l.extra, "rope=yarn|tenant=b");
    cur = old;
    cur.ns.layout = &cur.l;
    cur.ns.deployment_id = cur.id;
    old.ns.layout = &old.l;
    old.ns.deployment_id = old.id;
    old.ns.fingerprint = ns_fingerprint_v1(&old.l, tenant);
    cur.ns.fingerprint = ns_fingerprint_tenant(&cur.l, tenant);
    ck_assert_uint_ne(old.ns.fingerprint, cur.ns.fingerprint);
    ns_deployment_id(&old.l, old.ns.fingerprint, old.id, sizeof old.id);
    ns_deployment_id(&cur.l, cur.ns.fingerprint, cur.id, sizeof cur.id);

    /* as the old version wrote it */
    struct kvs_store *s = open_tenant_store(troot, tenant);
    for (int64_t k = 0; k < 12; k++)
        ck_assert_int_eq(put_block(s, &old, k * 31 - 5, 9), 0);
    ck_assert_int_eq(kvs_file_locate_hint(s, &old.ns, -5, hint, sizeof(hint)), 0);
    be->close(s);

    struct seen *sn = calloc(1, sizeof(*sn));
    for (int round = 0; round < 3; round++) {
        if (round == 1)
            ck_assert_int_eq(unlink(hint), 0);          /* from the records */
        s = open_tenant_store(troot, tenant);
        int calls;
        memset(sn, 0, sizeof(*sn));
        ck_assert_int_eq(scan_all(s, 5, sn, &calls), 1);
        ck_assert_int_eq(sn->n, 12);
        for (int i = 0; i < sn->n; i++) {
            ck_assert_uint_eq(sn->f[i].fingerprint, cur.ns.fingerprint);
            ck_assert_str_eq(sn->f[i].layout.extra, cur.l.extra);
            ck_assert_uint_eq(sn->f[i].layout.tp_rank, 1);
        }
        struct kvs_file_stats st;
        kvs_file_stats(s, &st);
        /* round 1 reads the old segment's records (round 0's own segment has a hint) */
        ck_assert_uint_eq(st.hints_bad, (round == 1 ? 1u : 0u));
        ck_assert_uint_ge(st.hints_loaded, 1);
        ck_assert_uint_eq(st.corrupt, 0);
        for (int64_t k = 0; k < 12; k++)
            ck_assert_msg(check_block(s, &cur, k * 31 - 5, 9) == 0, "round %d key %lld: %s", round,
                          (long long)(k * 31 - 5), err);
        if (round == 0) {   /* a new write goes under the current identity */
            ck_assert_int_eq(put_block(s, &cur, 1000, 3), 0);
            ck_assert_int_eq(check_block(s, &cur, 1000, 3), 0);
            ck_assert_int_eq(be->del(s, &cur.ns, 1000, 0, err, sizeof(err)), 0);
        }
        be->close(s);
    }
    free(sn);
}
END_TEST

/* A closed segment's hint file deleted or with one flipped byte: the scan
 * reads the segment instead and finds exactly the same blocks, then writes
 * a good hint again for the next start. */
static void hint_case(int how)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns a;
    struct seen *sn = calloc(1, sizeof(*sn));
    struct kvs_file_stats st;
    char hint[PATH_MAX];
    int calls;
    mkns(&a, "hint", 1024, 0);
    for (int64_t k = 0; k < 30; k++)
        ck_assert_int_eq(put_block(s, &a, k, 4), 0);
    ck_assert_int_eq(be->del(s, &a.ns, 7, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(kvs_file_locate_hint(s, &a.ns, 3, hint, sizeof(hint)), 0);
    be->close(s);
    ck_assert(path_exists(hint));
    if (how == 0) {
        ck_assert_int_eq(unlink(hint), 0);
    } else {
        struct stat hs;
        ck_assert_int_eq(stat(hint, &hs), 0);
        int fd = open(hint, O_RDWR);
        uint8_t b;
        off_t off = how == 1 ? 20 : hs.st_size / 2;    /* header / an entry */
        ck_assert_int_eq(pread(fd, &b, 1, off), 1);
        b ^= 0x01;
        ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
        close(fd);
    }
    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_all(s, 7, sn, &calls), 1);
    ck_assert_int_eq(sn->n, 29);
    ck_assert_int_eq(seen_has(sn, &a, 7), 0);          /* the tombstone holds */
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.hints_bad, 1);
    ck_assert_uint_eq(st.hints_loaded, 0);
    ck_assert_uint_eq(st.torn_tails, 0);
    for (int64_t k = 0; k < 30; k++)
        ck_assert_int_eq(check_block(s, &a, k, 4), k == 7 ? KVS_MISS : 0);
    be->close(s);
    /* rewritten: the next start reads it */
    ck_assert(path_exists(hint));
    s = open_store(0, KVS_FSYNC_NEVER);
    memset(sn, 0, sizeof(*sn));
    ck_assert_int_eq(scan_all(s, 7, sn, &calls), 1);
    ck_assert_int_eq(sn->n, 29);
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.hints_loaded, 1);
    ck_assert_uint_eq(st.hints_bad, 0);
    be->close(s);
    free(sn);
}

START_TEST(test_hint_fallback)
{
    hint_case(_i);
}
END_TEST

/* ---- capacity ------------------------------------------------------------------------ */

START_TEST(test_capacity_segments)
{
    const uint64_t cap = 64 * 1024;
    struct kvs_store *s = open_store(cap, KVS_FSYNC_NEVER);
    struct tns a;
    struct kvs_file_stats st;
    mkns(&a, "cap", 4096, 0);
    /* 40 blocks of 4 KiB into 64 KiB: the oldest segments go, whole */
    for (int64_t k = 0; k < 40; k++) {
        ck_assert_int_eq(put_block(s, &a, k, 0), 0);
        kvs_file_stats(s, &st);
        ck_assert_uint_le(st.disk_bytes, cap);
    }
    kvs_file_stats(s, &st);
    ck_assert_uint_gt(st.segments_dropped, 0);
    ck_assert_uint_eq(st.blocks + st.evicted, 40);     /* every block: live or counted */
    ck_assert_int_eq(check_block(s, &a, 0, 0), KVS_MISS);     /* least recently written */
    ck_assert_int_eq(check_block(s, &a, 39, 0), 0);           /* most recently written */
    int live = 0;
    for (int64_t k = 0; k < 40; k++) {
        int rc = check_block(s, &a, k, 0);
        ck_assert(rc == 0 || rc == KVS_MISS);
        live += rc == 0;
    }
    ck_assert_uint_eq((uint64_t)live, st.blocks);
    /* the dropped segments' files are gone */
    ck_assert_uint_eq(count_dir(root).segs, st.segments);
    /* a block bigger than the whole store */
    struct tns huge;
    mkns(&huge, "cap-huge", 2 * cap, 0);
    ck_assert_int_eq(put_block(s, &huge, 1, 0), -KVNODE_ENOSPC);
    be->close(s);

    /* after a restart the scan rebuilds the keydir with the same live set */
    struct seen *sn = calloc(1, sizeof(*sn));
    int calls;
    s = open_store(cap, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_all(s, 2, sn, &calls), 1);
    ck_assert_int_eq(sn->n, live);
    ck_assert_int_eq(put_block(s, &a, 100, 0), 0);
    kvs_file_stats(s, &st);
    ck_assert_uint_le(st.disk_bytes, cap);
    be->close(s);
    free(sn);

    /* overwrites and deletes empty segments, which then go without any
     * capacity pressure (nothing evicted) */
    s = open_store(0, KVS_FSYNC_NEVER);
    struct tns b;
    mkns(&b, "reclaim", 1u << 20, 0);
    /* 1 MiB blocks into 1 MiB segments (the minimum): one block each */
    struct kvs_config cfg = { .backend = "file", .path = root, .fsync_policy = KVS_FSYNC_NEVER,
                              .segment_bytes = 1u << 20 };
    be->close(s);
    ck_assert_int_eq(be->open(&cfg, &s, err, sizeof(err)), 0);
    for (uint32_t i = 0; i < 6; i++)
        ck_assert_int_eq(put_block(s, &b, 1, i), 0);
    ck_assert_int_eq(check_block(s, &b, 1, 5), 0);
    kvs_file_stats(s, &st);
    ck_assert_uint_ge(st.segments_reclaimed, 4);
    ck_assert_uint_eq(st.evicted, 0);
    be->close(s);
}
END_TEST

/* ---- paths ------------------------------------------------------------------------------ */

START_TEST(test_sanitize)
{
    /* Names from engines never become paths: whatever the model or the
     * deployment id, only segment files appear, directly under the root. */
    static const char *ids[] = { "../../escape", "..", ".", "", "/abs/olute", "a/../../b",
                                 "x\ny z", ".hidden", "ok-123" };
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    char up[PATH_MAX + 16];
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        struct tns t;
        mkns(&t, "../../model", 256, 0);
        snprintf(t.id, sizeof(t.id), "%s", ids[i]);
        ck_assert_int_eq(put_block(s, &t, (int64_t)i, 0), 0);
        ck_assert_int_eq(check_block(s, &t, (int64_t)i, 0), 0);
    }
    struct tns t;
    mkns(&t, "../../../etc/x", 256, 0);
    ck_assert_int_eq(put_block(s, &t, 1, 0), 0);
    struct dir_count dc = count_dir(root);
    ck_assert_uint_eq(dc.dirs, 0);
    ck_assert_uint_eq(dc.segs, 1);
    ck_assert_uint_eq(dc.other, 0);
    snprintf(up, sizeof(up), "%s/escape", tmpdir);
    ck_assert(!path_exists(up));
    snprintf(up, sizeof(up), "%s/store/escape", tmpdir);
    ck_assert(!path_exists(up));
    be->close(s);
}
END_TEST

START_TEST(test_open_errors)
{
    struct kvs_config cfg = { .backend = "file", .path = NULL };
    struct kvs_store *s = NULL;
    char file[PATH_MAX + 16];
    ck_assert_int_eq(be->open(&cfg, &s, err, sizeof(err)), -KVNODE_EINVAL);
    ck_assert_ptr_null(s);
    snprintf(file, sizeof(file), "%s/plain", tmpdir);
    ck_assert_int_eq(close(open(file, O_CREAT | O_WRONLY, 0644)), 0);
    cfg.path = file;
    ck_assert_int_lt(be->open(&cfg, &s, err, sizeof(err)), 0);
    ck_assert_msg(strstr(err, file) != NULL, "message names the path: %s", err);
    snprintf(file, sizeof(file), "%s/plain/sub", tmpdir);
    cfg.path = file;
    ck_assert_int_lt(be->open(&cfg, &s, err, sizeof(err)), 0);
    ck_assert_msg(strstr(err, file) != NULL, "message names the path: %s", err);
    cfg.path = root;
    cfg.fsync_policy = 7;
    ck_assert_int_eq(be->open(&cfg, &s, err, sizeof(err)), -KVNODE_EINVAL);
    cfg.fsync_policy = KVS_FSYNC_NEVER;
    cfg.direct_io = 9;
    ck_assert_int_eq(be->open(&cfg, &s, err, sizeof(err)), -KVNODE_EINVAL);
    cfg.direct_io = KVS_DIRECT_AUTO;
    cfg.segment_bytes = 4096;                          /* below the 1 MiB minimum */
    ck_assert_int_eq(be->open(&cfg, &s, err, sizeof(err)), -KVNODE_EINVAL);
    ck_assert_msg(strstr(err, "minimum") != NULL, "%s", err);

    /* the root is locked against other processes while open */
    s = open_store(0, KVS_FSYNC_NEVER);
    snprintf(file, sizeof(file), "%s/.lock", root);
    int fd = open(file, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(flock(fd, LOCK_EX | LOCK_NB), -1);
    ck_assert_int_eq(errno, EWOULDBLOCK);
    close(fd);
    ck_assert_int_eq(be->health(s, err, sizeof(err)), 0);
    be->close(s);
    fd = open(file, O_RDWR);
    ck_assert_int_eq(flock(fd, LOCK_EX | LOCK_NB), 0);   /* released by the last close */
    close(fd);
    /* health notices a vanished root */
    s = open_store(0, KVS_FSYNC_NEVER);
    test_rmtree(root);
    ck_assert_int_lt(be->health(s, err, sizeof(err)), 0);
    be->close(s);
}
END_TEST

/* ---- disk full ------------------------------------------------------------------------- */

static void disk_full_common(struct kvs_store *s, size_t block)
{
    struct tns a, small;
    char real_root[PATH_MAX];
    mkns(&small, "full-small", 1024, 0);
    mkns(&a, "full", block, 0);
    ck_assert_ptr_nonnull(realpath(root, real_root));
    ck_assert_int_eq(put_block(s, &small, 1, 0), 0);
    int prc = put_block(s, &a, 1, 0);
    ck_assert_msg(prc == -KVNODE_ENOSPC, "put: %d %s", prc, err);
    ck_assert_msg(strstr(err, real_root) != NULL, "message names the root: %s", err);
    ck_assert_uint_eq(count_dir(root).temps, 0);
    ck_assert_int_eq(check_block(s, &a, 1, 0), KVS_MISS);
    ck_assert_int_eq(check_block(s, &small, 1, 0), 0);
    /* the store goes on after the failure: a small block fits still */
    ck_assert_int_eq(put_block(s, &small, 2, 0), 0);
    ck_assert_int_eq(check_block(s, &small, 2, 0), 0);
}

START_TEST(test_disk_full_rlimit)
{
    struct rlimit old, lim;
    struct kvs_store *s = open_store(0, KVS_FSYNC_BATCH);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 100000;             /* writes past 100 kB fail with EFBIG */
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    disk_full_common(s, 256 * 1024);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    be->close(s);
}
END_TEST

START_TEST(test_disk_full_tmpfs)
{
    char mnt[1100];
    snprintf(mnt, sizeof(mnt), "%s/mnt", tmpdir);
    ck_assert_int_eq(mkdir(mnt, 0755), 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=256k") != 0) {
        fprintf(stderr, "test_disk_full_tmpfs: cannot mount a tmpfs (%s): skipped\n",
                strerror(errno));
        return;
    }
    snprintf(root, sizeof(root), "%s/root", mnt);
    /* tmpfs took no O_DIRECT before Linux 6.6: direct_io = on then says
     * so and fails the open; where it does, the store uses it */
    struct kvs_config dcfg = { .backend = "file", .path = root, .direct_io = KVS_DIRECT_ON };
    struct kvs_store *s = NULL;
    int drc = be->open(&dcfg, &s, err, sizeof(err));
    if (drc == 0) {
        struct kvs_file_stats st;
        kvs_file_stats(s, &st);
        ck_assert_uint_eq(st.direct_io, 1);
        be->close(s);
    } else {
        ck_assert_int_eq(drc, -KVNODE_EINVAL);
        ck_assert_msg(strstr(err, "O_DIRECT") != NULL, "%s", err);
    }
    s = open_store(0, KVS_FSYNC_ALWAYS);
    disk_full_common(s, 512 * 1024);
    be->close(s);
    ck_assert_int_eq(umount2(mnt, MNT_DETACH), 0);
}
END_TEST

/* ---- threads ------------------------------------------------------------------------- */

#define MT_THREADS 4
#define MT_KEYS    48
#define MT_BLOCK   2048
#define MT_OPS     400

struct mt_arg {
    struct tns *t;
    unsigned seed;
    int bad, ok, miss, errors;
};

/* A self-describing block: byte 0..7 the key, 8..11 the salt, rest fill(). */
static void mt_fill(uint8_t *b, int64_t key, uint32_t salt)
{
    memcpy(b, &key, 8);
    memcpy(b + 8, &salt, 4);
    fill(b + 12, MT_BLOCK - 12, key, salt);
}

static void *mt_worker(void *p)
{
    struct mt_arg *a = p;
    struct kvs_store *s = open_store(16 * (64 + MT_BLOCK), KVS_FSYNC_NEVER);
    uint8_t b[MT_BLOCK], want[MT_BLOCK];
    char e[256];
    for (int i = 0; i < MT_OPS; i++) {
        int64_t key = rand_r(&a->seed) % MT_KEYS;
        int op = rand_r(&a->seed) % 10;
        if (op < 4) {
            mt_fill(b, key, (uint32_t)rand_r(&a->seed));
            if (be->put(s, &a->t->ns, key, 0, b, MT_BLOCK, e, sizeof(e)) != 0)
                a->errors++;
        } else if (op < 9) {
            int rc = be->get(s, &a->t->ns, key, 0, b, MT_BLOCK, e, sizeof(e));
            if (rc == KVS_MISS) {
                a->miss++;
            } else if (rc != 0) {
                a->bad++;
            } else {
                int64_t k;
                uint32_t salt;
                memcpy(&k, b, 8);
                memcpy(&salt, b + 8, 4);
                mt_fill(want, key, salt);
                if (k != key || memcmp(b, want, MT_BLOCK) != 0)
                    a->bad++;
                else
                    a->ok++;
            }
        } else {
            if (be->del(s, &a->t->ns, key, 0, e, sizeof(e)) != 0)
                a->errors++;
        }
    }
    be->close(s);
    return NULL;
}

START_TEST(test_threads)
{
    struct kvs_store *keep = open_store(16 * (64 + MT_BLOCK), KVS_FSYNC_NEVER);
    struct tns t;
    pthread_t th[MT_THREADS];
    struct mt_arg args[MT_THREADS];
    struct kvs_file_stats st;
    mkns(&t, "mt", MT_BLOCK, 0);
    for (int i = 0; i < MT_THREADS; i++) {
        args[i] = (struct mt_arg){ .t = &t, .seed = 1234u + (unsigned)i };
        ck_assert_int_eq(pthread_create(&th[i], NULL, mt_worker, &args[i]), 0);
    }
    int ok = 0;
    for (int i = 0; i < MT_THREADS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(args[i].bad, 0);
        ck_assert_int_eq(args[i].errors, 0);
        ok += args[i].ok;
    }
    ck_assert_int_gt(ok, 0);
    kvs_file_stats(keep, &st);
    ck_assert_uint_le(st.disk_bytes, 16 * (64 + MT_BLOCK));
    ck_assert_uint_eq(st.corrupt, 0);
    be->close(keep);
}
END_TEST

static Suite *kvs_file_suite(void)
{
    Suite *s = suite_create("kvs_file");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_find_and_crc);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_namespaces_independent);
    tcase_add_test(tc, test_exists_del);
    tcase_add_test(tc, test_overwrite_atomic);
    tcase_add_test(tc, test_size_mismatch);
    tcase_add_loop_test(tc, test_corrupt, 0, 8);
    tcase_add_test(tc, test_scan);
    tcase_add_loop_test(tc, test_hint_fallback, 0, 3);
    tcase_add_test(tc, test_tenant_roots);
    tcase_add_loop_test(tc, test_old_identity_recovered, 0, 2);
    tcase_add_test(tc, test_capacity_segments);
    tcase_add_test(tc, test_sanitize);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_disk_full_rlimit);
    tcase_add_test(tc, test_disk_full_tmpfs);
    tcase_add_test(tc, test_threads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(kvs_file_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
