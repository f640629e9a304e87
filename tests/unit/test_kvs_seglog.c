/* Unit tests of the segment log's own rules (daemon/persist/kvs/file*.c,
 * format in file.h): the record and hint codecs, the generation rule across
 * handles and restarts (an older write or a delete never loses to an older
 * record), torn tails, kill -9 of a writing process and of one whose
 * capacity drops and reclaims segments all the time (every acknowledged
 * block byte-exact or, under capacity, a miss; never other bytes), and the
 * refusal of a root of the file-per-block store of 0.1.0-pre. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/rmtree.h"
#include "kvnode.h"
#include "persist/kvs/file.h"
#include "persist/kvs/file_internal.h"
#include "persist/kvs/kvs.h"
#include "persist/kvs/crc32c.h"
#include "core/le.h"

#include "kvs_testutil.h"

static const struct kvs_backend *be;
static char tmpdir[1024];
static char root[2048];
static char err[512];

static struct kvs_store *open_at(const struct kvs_backend *b, uint64_t capacity, int fsync_policy)
{
    struct kvs_config cfg = { .backend = b->name, .path = root, .capacity_bytes = capacity,
                              .fsync_policy = fsync_policy };
    struct kvs_store *s = NULL;
    int rc = b->open(&cfg, &s, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %d %s", rc, err);
    return s;
}

static struct kvs_store *open_store(uint64_t capacity, int fsync_policy)
{
    return open_at(be, capacity, fsync_policy);
}

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/kvs-seglog-XXXXXX", t && *t ? t : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(root, sizeof(root), "%s/root", tmpdir);
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

static int check_block(struct kvs_store *s, struct tns *t, int64_t key, uint32_t salt)
{
    return kvs_test_check_block(be, s, t, key, salt, err, sizeof(err));
}

static void on_found(void *arg, const struct kvs_found *f)
{
    (void)f;
    (*(int *)arg)++;
}

/* Scan to the end; the number of blocks reported. */
static int scan_count(struct kvs_store *s, size_t budget)
{
    struct kvs_scan *cur = NULL;
    int n = 0, rc, calls = 0;
    do {
        rc = be->scan(s, &cur, budget, on_found, &n, err, sizeof(err));
        ck_assert_int_lt(++calls, 1000000);
    } while (rc == 0);
    ck_assert_int_eq(rc, 1);
    return n;
}

/* ---- formats ---------------------------------------------------------------------- */

START_TEST(test_record_codec)
{
    uint8_t b[SEG_REC_HDR];
    struct seg_rec in = { .type = SEG_REC_BLOCK, .rank = 3, .fingerprint = 0x1122334455667788ull,
                          .key = -5, .check = 0xfeedfacecafebeefull, .size = 65536,
                          .seq = (7ull << 40) | 9, .crc = 0xdeadbeef },
                   out;
    seg_rec_encode(b, &in);
    ck_assert_ptr_null(seg_rec_decode(b, &out));
    ck_assert_uint_eq(out.type, in.type);
    ck_assert_uint_eq(out.rank, 3);
    ck_assert_uint_eq(out.fingerprint, in.fingerprint);
    ck_assert_int_eq(out.key, -5);
    ck_assert_uint_eq(out.size, 65536);
    ck_assert_uint_eq(out.seq, in.seq);
    ck_assert_uint_eq(out.crc, 0xdeadbeef);
    ck_assert_uint_eq(out.check, 0xfeedfacecafebeefull);
    ck_assert_uint_eq(le_get16(b + 4), SEG_VERSION);
    ck_assert_uint_eq(seg_rec_len(65536), 64 + 65536);
    ck_assert_uint_eq(seg_rec_len(1), 128);
    ck_assert_uint_eq(seg_rec_len(0), 64);
    /* every single-bit flip anywhere in the header is caught */
    int caught = 0;
    for (size_t i = 0; i < SEG_REC_HDR; i++)
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            caught += seg_rec_decode(b, &out) != NULL;
            b[i] ^= (uint8_t)(1u << bit);
        }
    ck_assert_int_eq(caught, SEG_REC_HDR * 8);
    /* well-formed but meaningless: refused too */
    struct seg_rec tomb = { .type = SEG_REC_TOMB, .size = 5 };
    seg_rec_encode(b, &tomb);
    ck_assert_ptr_nonnull(seg_rec_decode(b, &out));
    struct seg_rec lay = { .type = SEG_REC_LAYOUT, .size = 10 };
    seg_rec_encode(b, &lay);
    ck_assert_ptr_nonnull(seg_rec_decode(b, &out));
    struct seg_rec bad = { .type = 9 };
    seg_rec_encode(b, &bad);
    ck_assert_ptr_nonnull(seg_rec_decode(b, &out));

    uint8_t h[SEG_HINT_HDR];
    uint64_t id, len;
    uint32_t nl, ne;
    unsigned version = 0;
    seg_hint_hdr_encode(h, 42, 1u << 20, 2, 1000);
    ck_assert_ptr_null(seg_hint_hdr_decode(h, &id, &len, &nl, &ne, &version));
    ck_assert_uint_eq(version, SEG_VERSION);
    ck_assert_uint_eq(id, 42);
    ck_assert_uint_eq(len, 1u << 20);
    ck_assert_uint_eq(nl, 2);
    ck_assert_uint_eq(ne, 1000);
    h[9] ^= 1;
    ck_assert_ptr_nonnull(seg_hint_hdr_decode(h, &id, &len, &nl, &ne, &version));
    struct seg_hint_ent e = { .type = SEG_REC_TOMB, .rank = 1, .crc = 7, .fingerprint = 8,
                              .size = 0, .seq = 99, .off = 4096, .key = INT64_MIN,
                              .check = 0x0123456789abcdefull }, e2;
    uint8_t eb[SEG_HINT_ENT];
    seg_hint_ent_encode(eb, &e);
    seg_hint_ent_decode(eb, SEG_VERSION, &e2);
    ck_assert_uint_eq(e2.check, e.check);
    /* a version-1 entry (56 bytes) has no word: 0, whatever follows it */
    seg_hint_ent_decode(eb, SEG_VERSION_V1, &e2);
    ck_assert_uint_eq(e2.check, 0);
    ck_assert_int_eq(e2.key, e.key);
    seg_hint_ent_decode(eb, SEG_VERSION, &e2);
    ck_assert_uint_eq(e2.type, e.type);
    ck_assert_uint_eq(e2.rank, e.rank);
    ck_assert_uint_eq(e2.crc, e.crc);
    ck_assert_uint_eq(e2.fingerprint, e.fingerprint);
    ck_assert_uint_eq(e2.size, e.size);
    ck_assert_uint_eq(e2.seq, e.seq);
    ck_assert_uint_eq(e2.off, e.off);
    ck_assert_int_eq(e2.key, e.key);
}
END_TEST

/* ---- check words (issue 19) and the version-1 format ------------------------------------ */

/* Rewrite every record header of the segment files in root as version 1
 * (no check word), and the hint files as version 1 (56-byte entries), as a
 * kvnode from before check words wrote them. Returns the hint files. */
static int downgrade_root_to_v1(void)
{
    int hints = 0;
    DIR *d = opendir(root);
    struct dirent *de;
    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)) != NULL) {
        char p[PATH_MAX + 300];
        bool hint = strstr(de->d_name, ".hint") != NULL, log = strstr(de->d_name, ".log") != NULL;
        if (!hint && !log)
            continue;
        snprintf(p, sizeof p, "%s/%s", root, de->d_name);
        int fd = open(p, O_RDWR);
        ck_assert_int_ge(fd, 0);
        struct stat st;
        ck_assert_int_eq(fstat(fd, &st), 0);
        size_t len = (size_t)st.st_size, out = 0;
        uint8_t *b = malloc(len ? len : 1);
        ck_assert_int_eq(pread(fd, b, len, 0), (ssize_t)len);
        if (log) {
            struct seg_rec r;
            for (size_t at = 0; at + SEG_REC_HDR <= len;) {
                ck_assert_ptr_null(seg_rec_decode(b + at, &r));
                ck_assert_uint_eq(r.check, 0);      /* words of 0 only: v1 has none */
                le_put16(b + at + 4, SEG_VERSION_V1);
                memset(b + at + 48, 0, 12);
                le_put32(b + at + 60, crc32c(0, b + at, 60));
                at += seg_rec_len(r.size);
            }
            out = len;
        } else {
            uint64_t id, sl;
            uint32_t nl, ne;
            unsigned v;
            ck_assert_ptr_null(seg_hint_hdr_decode(b, &id, &sl, &nl, &ne, &v));
            ck_assert_uint_eq(v, SEG_VERSION);
            le_put16(b + 4, SEG_VERSION_V1);
            le_put32(b + 36, crc32c(0, b, 36));
            out = SEG_HINT_HDR + (size_t)nl * SEG_LAYOUT_SIZE;
            for (uint32_t i = 0; i < ne; i++, out += SEG_HINT_ENT_V1)
                memmove(b + out, b + SEG_HINT_HDR + (size_t)nl * SEG_LAYOUT_SIZE +
                                     (size_t)i * SEG_HINT_ENT, SEG_HINT_ENT_V1);
            le_put32(b + out, crc32c(0, b, out));
            out += 4;
            hints++;
        }
        ck_assert_int_eq(pwrite(fd, b, out, 0), (ssize_t)out);
        ck_assert_int_eq(ftruncate(fd, (off_t)out), 0);
        close(fd);
        free(b);
    }
    closedir(d);
    return hints;
}

static void remove_hints(void)
{
    DIR *d = opendir(root);
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strstr(de->d_name, ".hint")) {
            char p[PATH_MAX + 300];
            snprintf(p, sizeof p, "%s/%s", root, de->d_name);
            unlink(p);
        }
    closedir(d);
}

static void on_found_check(void *arg, const struct kvs_found *f)
{
    uint64_t *sum = arg;
    *sum += f->check;
}

/* The sum of the check words a full scan reports. */
static uint64_t scan_checks(struct kvs_store *s)
{
    struct kvs_scan *cur = NULL;
    uint64_t sum = 0;
    int rc;
    while ((rc = be->scan(s, &cur, 64, on_found_check, &sum, err, sizeof err)) == 0)
        ;
    ck_assert_int_eq(rc, 1);
    return sum;
}

/* A block's word goes to disk with it and comes back (from the hint file,
 * then from the records alone); a get, exists or delete with another word
 * does not see it. */
START_TEST(test_check_words_persist)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns t;
    const uint64_t wa = 0xa1a2a3a4a5a6a7a8ull;
    mkns(&t, "words", 4096, 0);
    uint8_t *b = malloc(4096), *got = malloc(4096);
    fill(b, 4096, 11, 5);
    ck_assert_int_eq(be->put(s, &t.ns, 11, wa, b, 4096, err, sizeof err), 0);
    ck_assert_int_eq(put_block(s, &t, 12, 1), 0);                       /* word 0 */
    be->close(s);
    for (int round = 0; round < 2; round++) {
        s = open_store(0, KVS_FSYNC_NEVER);
        ck_assert_uint_eq(scan_checks(s), wa);
        memset(got, 0, 4096);
        ck_assert_int_eq(be->get(s, &t.ns, 11, wa, got, 4096, err, sizeof err), 0);
        ck_assert_int_eq(memcmp(got, b, 4096), 0);
        ck_assert_int_eq(be->get(s, &t.ns, 11, 0, got, 4096, err, sizeof err), KVS_MISMATCH);
        ck_assert_int_eq(be->get(s, &t.ns, 11, wa + 1, got, 4096, err, sizeof err), KVS_MISMATCH);
        ck_assert_int_eq(check_block(s, &t, 12, 1), 0);
        int64_t keys[3] = { 11, 11, 12 };
        uint64_t checks[3] = { wa, 7, 0 };
        uint8_t present[3];
        ck_assert_int_eq(be->exists(s, &t.ns, keys, checks, 3, present, err, sizeof err), 0);
        ck_assert_uint_eq(present[0], KVS_PRESENT);
        ck_assert_uint_eq(present[1], KVS_PRESENT_OTHER_WORD);
        ck_assert_uint_eq(present[2], KVS_PRESENT);
        /* a delete with another word leaves the block */
        ck_assert_int_eq(be->del(s, &t.ns, 11, 7, err, sizeof err), 0);
        ck_assert_int_eq(be->get(s, &t.ns, 11, wa, got, 4096, err, sizeof err), 0);
        be->close(s);
        remove_hints();
    }
    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 64), 2);
    ck_assert_int_eq(be->del(s, &t.ns, 11, wa, err, sizeof err), 0);
    ck_assert_int_eq(be->get(s, &t.ns, 11, wa, got, 4096, err, sizeof err), KVS_MISS);
    be->close(s);
    free(b);
    free(got);
}
END_TEST

/* A root written before check words (version-1 records and hint files)
 * still loads, every block with word 0. */
START_TEST(test_v1_segments_load)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns t;
    mkns(&t, "oldfmt", 4096, 1);
    for (int64_t k = 1; k <= 5; k++)
        ck_assert_int_eq(put_block(s, &t, k, 3), 0);
    be->close(s);
    ck_assert_int_ge(downgrade_root_to_v1(), 1);
    for (int round = 0; round < 2; round++) {   /* from the v1 hints, then from v1 records */
        s = open_store(0, KVS_FSYNC_NEVER);
        ck_assert_int_eq(scan_count(s, 64), 5);
        for (int64_t k = 1; k <= 5; k++)
            ck_assert_int_eq(check_block(s, &t, k, 3), 0);
        uint8_t *got = malloc(4096);
        ck_assert_int_eq(be->get(s, &t.ns, 3, 9, got, 4096, err, sizeof err), KVS_MISMATCH);
        free(got);
        be->close(s);
        remove_hints();
    }
    /* and the store writes on over them, in the new format */
    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 64), 5);
    uint8_t *b = malloc(4096);
    fill(b, 4096, 6, 4);
    ck_assert_int_eq(be->put(s, &t.ns, 6, 42, b, 4096, err, sizeof err), 0);
    be->close(s);
    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_uint_eq(scan_checks(s), 42);
    ck_assert_int_eq(check_block(s, &t, 2, 3), 0);
    be->close(s);
    free(b);
}
END_TEST

/* ---- generations ------------------------------------------------------------------------ */

START_TEST(test_generations)
{
    /* Handle a's open segment has the lower id; b writes k first, then a
     * overwrites it: a's record is the newer one, after a restart too. */
    struct kvs_store *a = open_store(0, KVS_FSYNC_NEVER), *b = open_store(0, KVS_FSYNC_NEVER);
    struct tns t;
    char pa[PATH_MAX], pb[PATH_MAX];
    mkns(&t, "gen", 4096, 0);
    ck_assert_int_eq(put_block(a, &t, 1, 0), 0);
    ck_assert_int_eq(kvs_file_locate(a, &t.ns, 1, pa, sizeof pa, NULL), 0);
    ck_assert_int_eq(put_block(b, &t, 77, 1), 0);
    ck_assert_int_eq(kvs_file_locate(b, &t.ns, 77, pb, sizeof pb, NULL), 0);
    ck_assert_int_lt(strcmp(pa, pb), 0);               /* a's segment sorts (and is numbered) first */
    ck_assert_int_eq(put_block(a, &t, 77, 2), 0);
    ck_assert_int_eq(check_block(b, &t, 77, 2), 0);
    /* a delete through b, then a write of another key, a delete of it
     * through a, and its write again through b */
    ck_assert_int_eq(put_block(a, &t, 5, 1), 0);
    ck_assert_int_eq(be->del(b, &t.ns, 5, 0, err, sizeof err), 0);
    ck_assert_int_eq(put_block(b, &t, 6, 1), 0);
    ck_assert_int_eq(be->del(a, &t.ns, 6, 0, err, sizeof err), 0);
    ck_assert_int_eq(put_block(b, &t, 6, 3), 0);
    be->close(a);
    be->close(b);

    for (int round = 0; round < 2; round++) {
        struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
        ck_assert_int_eq(scan_count(s, 2), 3);         /* 1, 77, 6 */
        ck_assert_int_eq(check_block(s, &t, 77, 2), 0);
        ck_assert_int_eq(check_block(s, &t, 5, 1), KVS_MISS);
        ck_assert_int_eq(check_block(s, &t, 6, 3), 0);
        ck_assert_int_eq(check_block(s, &t, 1, 0), 0);
        be->close(s);
        /* and once more with every hint gone: the records alone say the same */
        DIR *d = opendir(root);
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (strstr(de->d_name, ".hint")) {
                char p[PATH_MAX + 300];
                snprintf(p, sizeof p, "%s/%s", root, de->d_name);
                unlink(p);
            }
        closedir(d);
    }
    /* Writes of a later run win over every record of an earlier one, even
     * when the later run's first segment comes after many. */
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 100), 3);
    ck_assert_int_eq(put_block(s, &t, 77, 9), 0);
    be->close(s);
    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 100), 3);
    ck_assert_int_eq(check_block(s, &t, 77, 9), 0);
    be->close(s);
}
END_TEST

/* Capacity never drops a segment whose tombstone hides a record in an
 * older segment while others can go: a deleted key stays deleted after a
 * restart. */
START_TEST(test_capacity_keeps_tombstones)
{
    const uint64_t cap = 64 * 1024;
    struct kvs_store *a = open_store(cap, KVS_FSYNC_NEVER), *b = open_store(cap, KVS_FSYNC_NEVER);
    struct tns t;
    struct kvs_file_stats st;
    mkns(&t, "captomb", 1024, 0);
    ck_assert_int_eq(put_block(a, &t, 1, 1), 0);        /* in a's segment, which stays open */
    ck_assert_int_eq(put_block(a, &t, 2, 1), 0);        /* and keeps it alive */
    ck_assert_int_eq(be->del(b, &t.ns, 1, 0, err, sizeof err), 0);   /* a tombstone in b's */
    for (int64_t k = 100; k < 400; k++)                 /* b's segments fill, close, get dropped */
        ck_assert_int_eq(put_block(b, &t, k, 2), 0);
    kvs_file_stats(b, &st);
    ck_assert_uint_gt(st.segments_dropped, 10);
    ck_assert_uint_le(st.disk_bytes, cap);
    be->close(b);
    be->close(a);
    struct kvs_store *s = open_store(cap, KVS_FSYNC_NEVER);
    int n = scan_count(s, 64);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(check_block(s, &t, 1, 1), KVS_MISS);
    ck_assert_int_eq(check_block(s, &t, 2, 1), 0);
    ck_assert_int_eq(check_block(s, &t, 399, 2), 0);
    be->close(s);
}
END_TEST

/* A tombstone for a block in a newer segment (another handle's: each
 * persist worker writes its own segment) must not go with its own, older
 * segment while the block's segment lives: once the older segment was dead
 * but for tombstones and the oldest left it was reclaimed, and after a
 * restart the deleted block came back (issue 31: a purge's deletes ran on
 * one worker, the blocks had been written by another). */
START_TEST(test_tombstone_for_a_newer_segment)
{
    struct kvs_store *a = open_store(0, KVS_FSYNC_NEVER), *b = open_store(0, KVS_FSYNC_NEVER);
    struct tns t;
    mkns(&t, "newertomb", 1024, 0);
    ck_assert_int_eq(put_block(a, &t, 1, 1), 0);        /* a's segment: the older one */
    ck_assert_int_eq(put_block(b, &t, 10, 1), 0);       /* b's, newer: deleted below */
    ck_assert_int_eq(put_block(b, &t, 11, 1), 0);       /* keeps b's segment alive */
    ck_assert_int_eq(be->del(a, &t.ns, 10, 0, err, sizeof err), 0);
    ck_assert_int_eq(be->del(a, &t.ns, 1, 0, err, sizeof err), 0);
    ck_assert_int_eq(check_block(a, &t, 10, 1), KVS_MISS);
    be->close(a);                                       /* a's segment closes */
    be->close(b);
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    scan_count(s, 64);
    ck_assert_int_eq(check_block(s, &t, 10, 1), KVS_MISS);
    ck_assert_int_eq(check_block(s, &t, 1, 1), KVS_MISS);
    ck_assert_int_eq(check_block(s, &t, 11, 1), 0);
    be->close(s);
}
END_TEST

/* ---- torn tails --------------------------------------------------------------------------- */

START_TEST(test_torn_tail)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns t;
    struct kvs_file_stats st;
    char seg[PATH_MAX], hint[PATH_MAX];
    uint64_t off9;
    mkns(&t, "torn", 8192, 0);
    for (int64_t k = 0; k < 10; k++)
        ck_assert_int_eq(put_block(s, &t, k, 1), 0);
    ck_assert_int_eq(kvs_file_locate(s, &t.ns, 9, seg, sizeof seg, &off9), 0);
    ck_assert_int_eq(kvs_file_locate_hint(s, &t.ns, 9, hint, sizeof hint), 0);
    be->close(s);
    /* as a crash leaves it: no hint, the last record cut in its payload,
     * then some garbage */
    ck_assert_int_eq(unlink(hint), 0);
    ck_assert_int_eq(truncate(seg, (off_t)(off9 + 64 + 5000)), 0);
    FILE *f = fopen(seg, "ab");
    ck_assert_int_eq(fwrite("garbage!", 1, 8, f), 8);
    fclose(f);

    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 4), 9);
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.torn_tails, 1);
    ck_assert_uint_eq(st.torn_bytes, 64 + 5000 + 8);
    struct stat sb;
    ck_assert_int_eq(stat(seg, &sb), 0);
    ck_assert_int_eq(sb.st_size, (off_t)off9);          /* cut at the last whole record */
    for (int64_t k = 0; k < 9; k++)
        ck_assert_int_eq(check_block(s, &t, k, 1), 0);
    ck_assert_int_eq(check_block(s, &t, 9, 1), KVS_MISS);
    /* the store goes on: new writes land after the cut, in a new segment */
    ck_assert_int_eq(put_block(s, &t, 9, 2), 0);
    ck_assert_int_eq(check_block(s, &t, 9, 2), 0);
    be->close(s);
    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 4), 10);
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.torn_tails, 0);
    ck_assert_int_eq(check_block(s, &t, 9, 2), 0);
    be->close(s);
}
END_TEST

/* ---- a bad header in a segment without a hint: resynchronisation ---------------------------- */

#define RS_BLOCKS 128
#define RS_BB     4096u

/* Put RS_BLOCKS blocks (keys 0..127, salt 5) into one segment, close, and
 * remove the hint file; out: the segment's path and each block record's
 * header offset. */
static void resync_fill(struct tns *t, char *seg, size_t seglen, uint64_t offs[RS_BLOCKS])
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    mkns(t, "resync", RS_BB, 0);
    for (int64_t k = 0; k < RS_BLOCKS; k++)
        ck_assert_int_eq(put_block(s, t, k, 5), 0);
    char first[PATH_MAX];
    for (int64_t k = 0; k < RS_BLOCKS; k++) {
        ck_assert_int_eq(kvs_file_locate(s, &t->ns, k, seg, seglen, &offs[k]), 0);
        if (k == 0)
            snprintf(first, sizeof first, "%s", seg);
        ck_assert_str_eq(seg, first);                   /* one segment */
    }
    be->close(s);
    remove_hints();
}

static void flip_at(const char *path, uint64_t off, uint8_t mask)
{
    int fd = open(path, O_RDWR);
    uint8_t c;
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, &c, 1, (off_t)off), 1);
    c ^= mask;
    ck_assert_int_eq(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
}

/* One flipped byte in a record header of a segment without its hint (in
 * the magic, type, key, size (low and high byte), sequence, payload CRC or
 * header CRC): recovery skips that record and no other. Issue 27 item 5.
 * Records: the segment's layout record (first; its payload checks itself,
 * so every block keeps its namespace), blocks 0, 63 and 127. */
START_TEST(test_header_flip_loses_only_its_record)
{
    static const int64_t recs[] = { -1, 0, 63, RS_BLOCKS - 1 };
    static const unsigned bytes[] = { 0, 6, 17, 24, 26, 31, 35, 45, 61 };
    const int nbytes = (int)(sizeof bytes / sizeof bytes[0]);
    int64_t k = recs[_i / nbytes];
    unsigned byte = bytes[_i % nbytes];
    struct tns t;
    char seg[PATH_MAX];
    uint64_t offs[RS_BLOCKS];
    resync_fill(&t, seg, sizeof seg, offs);
    ck_assert_uint_eq(offs[0], seg_rec_len(SEG_LAYOUT_SIZE));   /* the layout record first */
    flip_at(seg, (k < 0 ? 0 : offs[k]) + byte, 0x10);
    int want = k < 0 ? RS_BLOCKS : RS_BLOCKS - 1;
    for (int round = 0; round < 2; round++) {           /* and again: the result holds */
        struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
        int found = scan_count(s, 64);
        ck_assert_msg(found == want, "record %lld byte %u, round %d: %d found", (long long)k, byte,
                      round, found);
        for (int64_t j = 0; j < RS_BLOCKS; j++) {
            int rc = check_block(s, &t, j, 5);
            ck_assert_msg(rc == (j == k ? KVS_MISS : 0), "record %lld byte %u: block %lld: %d",
                          (long long)k, byte, (long long)j, rc);
        }
        struct kvs_file_stats st;
        kvs_file_stats(s, &st);
        /* the last record's loss may read as a torn tail (nothing follows it) */
        uint64_t rl = k < 0 ? seg_rec_len(SEG_LAYOUT_SIZE) : seg_rec_len(RS_BB);
        ck_assert_uint_eq(st.resync_records + st.torn_tails, 1);
        ck_assert_uint_eq(st.resync_bytes + st.torn_bytes, rl);
        if (k < RS_BLOCKS - 1)
            ck_assert_uint_eq(st.resync_records, 1);
        be->close(s);
    }
}
END_TEST

/* A block whose bytes hold a whole, valid record of another key (header
 * and payload CRCs right) is never indexed as that key: not when the
 * containing record is the torn tail (its header is good, so its length
 * is known), and not when its own header has a flipped byte (the record
 * that follows it confirms where it ends). */
START_TEST(test_embedded_record_not_indexed)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns t;
    char seg[PATH_MAX];
    uint64_t off;
    mkns(&t, "embed", 8192, 0);
    uint8_t *b = calloc(1, 8192);
    struct seg_rec h = { .type = SEG_REC_BLOCK, .fingerprint = t.ns.fingerprint, .rank = 0,
                         .key = 999, .size = 4096, .seq = UINT64_MAX >> 1 };
    fill(b + SEG_REC_HDR, 4096, 999, 7);
    h.crc = crc32c(0, b + SEG_REC_HDR, 4096);
    seg_rec_encode(b, &h);
    ck_assert_int_eq(put_block(s, &t, 1, 1), 0);
    ck_assert_int_eq(be->put(s, &t.ns, 2, 0, b, 8192, err, sizeof err), 0);
    ck_assert_int_eq(put_block(s, &t, 3, 1), 0);
    ck_assert_int_eq(kvs_file_locate(s, &t.ns, 2, seg, sizeof seg, &off), 0);
    be->close(s);
    remove_hints();

    /* the containing record's header flipped (its key) */
    flip_at(seg, off + 17, 0x01);
    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 64), 2);
    ck_assert_int_eq(check_block(s, &t, 1, 1), 0);
    ck_assert_int_eq(check_block(s, &t, 3, 1), 0);
    uint8_t *got = malloc(8192);
    ck_assert_int_eq(be->get(s, &t.ns, 999, 0, got, 8192, err, sizeof err), KVS_MISS);
    be->close(s);

    /* the containing record as a torn tail: cut after the embedded copy */
    flip_at(seg, off + 17, 0x01);
    ck_assert_int_eq(truncate(seg, (off_t)(off + SEG_REC_HDR + 6000)), 0);
    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 64), 1);
    ck_assert_int_eq(be->get(s, &t.ns, 999, 0, got, 8192, err, sizeof err), KVS_MISS);
    struct kvs_file_stats st;
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.torn_tails, 1);
    ck_assert_uint_eq(st.resync_records, 0);
    struct stat sb;
    ck_assert_int_eq(stat(seg, &sb), 0);
    ck_assert_int_eq(sb.st_size, (off_t)off);
    be->close(s);
    free(got);
    free(b);
}
END_TEST

/* A segment crafted to make resynchronisation expensive: after a bad
 * header, a good block header every 64 bytes, each claiming the rest of
 * the segment as its payload, none with the right CRC. Recovery checks a
 * bounded number of payload bytes (about twice the segment), then leaves
 * the rest unread: it ends, the blocks before the damage are kept, and the
 * file is not cut (no torn tail: the bytes were not understood). */
START_TEST(test_resync_is_bounded)
{
    struct kvs_store *s = open_store(0, KVS_FSYNC_NEVER);
    struct tns t;
    char seg[PATH_MAX];
    uint64_t off;
    mkns(&t, "bounded", 4096, 0);
    ck_assert_int_eq(put_block(s, &t, 1, 1), 0);
    ck_assert_int_eq(put_block(s, &t, 2, 1), 0);
    ck_assert_int_eq(kvs_file_locate(s, &t.ns, 2, seg, sizeof seg, &off), 0);
    be->close(s);
    remove_hints();

    struct stat sb;
    ck_assert_int_eq(stat(seg, &sb), 0);
    const size_t nhdr = 100000, extra = (nhdr + 1) * SEG_REC_HDR;
    uint8_t *b = calloc(1, extra);
    memset(b, 'X', SEG_REC_HDR);                       /* the bad header */
    for (size_t i = 1; i <= nhdr; i++) {
        struct seg_rec h = { .type = SEG_REC_BLOCK, .fingerprint = t.ns.fingerprint, .key = 1000 + (int64_t)i,
                             .size = extra - (i + 1) * SEG_REC_HDR, .seq = 1ull << 50, .crc = 0 };
        seg_rec_encode(b + i * SEG_REC_HDR, &h);
    }
    int fd = open(seg, O_WRONLY | O_APPEND);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, b, extra), (ssize_t)extra);
    close(fd);
    free(b);

    s = open_store(0, KVS_FSYNC_NEVER);
    ck_assert_int_eq(scan_count(s, 64), 2);
    ck_assert_int_eq(check_block(s, &t, 1, 1), 0);
    ck_assert_int_eq(check_block(s, &t, 2, 1), 0);
    struct kvs_file_stats st;
    kvs_file_stats(s, &st);
    ck_assert_uint_eq(st.torn_tails, 0);
    ck_assert_uint_eq(st.resync_records, 0);
    struct stat sa;
    ck_assert_int_eq(stat(seg, &sa), 0);
    ck_assert_int_eq(sa.st_size, sb.st_size + (off_t)extra);
    be->close(s);
}
END_TEST

/* ---- kill -9 ------------------------------------------------------------------------------- */

#define KB 4096u

struct ack {
    int64_t key;
    uint32_t salt;
};

/* The child: writes (key, salt) blocks over NKEYS keys and reports each
 * acknowledged write on fd; runs until killed. */
static void child_writer(int fd, uint64_t capacity, int nkeys)
{
    struct kvs_config cfg = { .backend = "file", .path = root, .capacity_bytes = capacity,
                              .fsync_policy = KVS_FSYNC_NEVER };
    struct kvs_store *s = NULL;
    char e[256];
    if (be->open(&cfg, &s, e, sizeof e) != 0)
        _exit(2);
    struct tns t;
    mkns(&t, "kill", KB, 0);
    uint8_t *b = malloc(KB);
    for (uint32_t salt = 1;; salt++)
        for (int64_t k = 0; k < nkeys; k++) {
            fill(b, KB, k, salt);
            if (be->put(s, &t.ns, k, 0, b, KB, e, sizeof e) != 0)
                _exit(3);
            struct ack a;
            memset(&a, 0, sizeof a);       /* the padding too: it goes through a pipe */
            a.key = k;
            a.salt = salt;
            if (write(fd, &a, sizeof a) != (ssize_t)sizeof a)
                _exit(4);
        }
}

static void kill_case(uint64_t capacity, int nkeys, int acks_before_kill)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(p[0]);
        child_writer(p[1], capacity, nkeys);
        _exit(0);
    }
    close(p[1]);
    uint32_t *last = calloc((size_t)nkeys, sizeof *last);
    int acks = 0;
    struct ack a;
    while (acks < acks_before_kill && read(p[0], &a, sizeof a) == (ssize_t)sizeof a) {
        last[a.key] = a.salt;
        acks++;
    }
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status));
    while (read(p[0], &a, sizeof a) == (ssize_t)sizeof a) {   /* acks still in the pipe */
        last[a.key] = a.salt;
        acks++;
    }
    close(p[0]);
    ck_assert_int_ge(acks, acks_before_kill);

    struct kvs_store *s = open_store(capacity, KVS_FSYNC_NEVER);
    struct tns t;
    mkns(&t, "kill", KB, 0);
    int found = scan_count(s, 64);
    int wrong = 0, present = 0, missing = 0;
    uint8_t *got = malloc(KB), *want = malloc(KB);
    for (int64_t k = 0; k < nkeys; k++) {
        int rc = be->get(s, &t.ns, k, 0, got, KB, err, sizeof err);
        if (rc == KVS_MISS) {
            missing += last[k] != 0;
            continue;
        }
        ck_assert_msg(rc == 0, "key %lld: %d %s", (long long)k, rc, err);
        present++;
        /* the last acknowledged version, or the one in flight at the kill */
        fill(want, KB, k, last[k]);
        if (memcmp(got, want, KB) != 0) {
            fill(want, KB, k, last[k] + 1);
            wrong += memcmp(got, want, KB) != 0;
        }
    }
    ck_assert_int_eq(wrong, 0);
    ck_assert_int_eq(found, present);
    if (!capacity) {
        ck_assert_int_eq(missing, 0);                   /* every acknowledged block is there */
    } else {
        struct kvs_file_stats st;
        kvs_file_stats(s, &st);
        ck_assert_uint_le(st.disk_bytes, capacity);
        ck_assert_int_gt(present, 0);
    }
    free(got);
    free(want);
    free(last);
    be->close(s);
}

START_TEST(test_kill_during_writes)
{
    kill_case(0, 300, 600 + 211 * _i);
}
END_TEST

START_TEST(test_kill_during_compaction)
{
    /* 64 KiB of capacity for 200 blocks of 4 KiB: segments are dropped
     * (capacity) and reclaimed (overwritten) all the time. */
    kill_case(64 * 1024, 200, 500 + 137 * _i);
}
END_TEST

/* ---- a root of the file-per-block store (0.1.0-pre) is refused ------------------------- */

static void write_file(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, p, n), (ssize_t)n);
    close(fd);
}

/* Every path under root with its type, size, mtime and bytes, in one string. */
static char tree_buf[1 << 16];
static size_t tree_len;

static int tree_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    tree_len += (size_t)snprintf(tree_buf + tree_len, sizeof tree_buf - tree_len, "%s %d %lld %lld.%09ld:",
                                 path, flag, (long long)st->st_size, (long long)st->st_mtim.tv_sec,
                                 st->st_mtim.tv_nsec);
    if (flag == FTW_F) {
        int fd = open(path, O_RDONLY);
        ck_assert_int_ge(fd, 0);
        ssize_t n = read(fd, tree_buf + tree_len, sizeof tree_buf - tree_len - 1);
        ck_assert_int_ge(n, 0);
        tree_len += (size_t)n;
        close(fd);
    }
    ck_assert_uint_lt(tree_len, sizeof tree_buf - 1024);
    return 0;
}

static char *tree_of(const char *dir)
{
    tree_len = 0;
    ck_assert_int_eq(nftw(dir, tree_one, 16, FTW_PHYS), 0);
    return strndup(tree_buf, tree_len);
}

/* What kvnode 0.1.0-pre left on disk: <root>/<deployment dir>/tp-<rank>/
 * holding the layout file and <bb>/<key>.blk block files (64-byte "KVNB"
 * header, then the payload). Opening such a root fails, saying what it is,
 * and changes nothing in it; the daemon start fails with it (issue 29). */
/* Layout records of a layout with a model revision (issue 31): version 2,
 * the revision after extra; one without keeps version 1, byte for byte. */
START_TEST(test_layout_record_revision)
{
    struct tns t;
    struct ns_layout out;
    uint64_t fp = 0;
    uint8_t a[SEG_LAYOUT_SIZE_V2], b[SEG_LAYOUT_SIZE_V2];
    mkns(&t, "rev", 4096, 1);
    ck_assert_uint_eq(seg_layout_size(&t.l), SEG_LAYOUT_SIZE);
    seg_layout_encode(a, &t.l, t.ns.fingerprint);
    ck_assert_uint_eq(le_get16(a + 4), 1);
    ck_assert_ptr_null(seg_layout_decode(a, SEG_LAYOUT_SIZE, NULL, &out, &fp));
    ck_assert_str_eq(out.revision, "");
    ck_assert_uint_eq(fp, t.ns.fingerprint);

    snprintf(t.l.revision, sizeof t.l.revision, "sha-0123");
    uint64_t rfp = ns_fingerprint(&t.l);
    ck_assert_uint_ne(rfp, t.ns.fingerprint);
    ck_assert_uint_eq(seg_layout_size(&t.l), SEG_LAYOUT_SIZE_V2);
    seg_layout_encode(b, &t.l, rfp);
    ck_assert_uint_eq(le_get16(b + 4), 2);
    ck_assert_ptr_null(seg_layout_decode(b, SEG_LAYOUT_SIZE_V2, NULL, &out, &fp));
    ck_assert_str_eq(out.revision, "sha-0123");
    ck_assert_uint_eq(fp, rfp);
    ck_assert(ns_same_deployment(&out, &t.l));
    /* Cut to version 1's size, or carrying the revision-less fingerprint: refused. */
    ck_assert_ptr_nonnull(seg_layout_decode(b, SEG_LAYOUT_SIZE, NULL, &out, &fp));
    seg_layout_encode(b, &t.l, t.ns.fingerprint);
    ck_assert_ptr_nonnull(seg_layout_decode(b, SEG_LAYOUT_SIZE_V2, NULL, &out, &fp));
    /* One flipped byte of the revision: the CRC. */
    seg_layout_encode(b, &t.l, rfp);
    b[SEG_LAYOUT_SIZE_V2 - 4 - NS_REVISION_MAX] ^= 1;
    ck_assert_ptr_nonnull(seg_layout_decode(b, SEG_LAYOUT_SIZE_V2, NULL, &out, &fp));
}
END_TEST

START_TEST(test_file_per_block_root_refused)
{
    struct tns t;
    char p[PATH_MAX];
    mkns(&t, "old", 256, 0);
    ck_assert_int_eq(mkdir(root, 0755), 0);
    snprintf(p, sizeof p, "%s/%s", root, t.id);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/%s/tp-0", root, t.id);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    uint8_t lay[SEG_LAYOUT_SIZE];
    seg_layout_encode(lay, &t.l, t.ns.fingerprint);     /* the same bytes as 0.1.0-pre's */
    snprintf(p, sizeof p, "%s/%s/tp-0/layout", root, t.id);
    write_file(p, lay, sizeof lay);
    snprintf(p, sizeof p, "%s/%s/tp-0/2a", root, t.id);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    uint8_t blk[64 + 256];
    fill(blk + 64, 256, 42, 1);
    memset(blk, 0, 64);
    memcpy(blk, "KVNB", 4);
    le_put16(blk + 4, 1);
    le_put16(blk + 6, 64);
    le_put64(blk + 8, t.ns.fingerprint);
    le_put64(blk + 16, 42);
    le_put64(blk + 24, 256);
    le_put32(blk + 36, crc32c(0, blk + 64, 256));
    le_put32(blk + 60, crc32c(0, blk, 60));
    snprintf(p, sizeof p, "%s/%s/tp-0/2a/000000000000002a.blk", root, t.id);
    write_file(p, blk, sizeof blk);
    char *before = tree_of(tmpdir);

    for (int round = 0; round < 2; round++) {           /* refused each time, not just once */
        struct kvs_config cfg = { .backend = "file", .path = root, .fsync_policy = KVS_FSYNC_NEVER };
        struct kvs_store *s = NULL;
        err[0] = '\0';
        int rc = be->open(&cfg, &s, err, sizeof err);
        if (rc == 0)
            be->close(s);
        ck_assert_msg(rc < 0, "a file-per-block root opened (rc %d) instead of being refused", rc);
        ck_assert_ptr_null(s);
        ck_assert_msg(strstr(err, root) != NULL, "the message names no root: %s", err);
        ck_assert_msg(strstr(err, "file-per-block store of kvnode 0.1.0-pre") != NULL,
                      "the message does not say what the root is: %s", err);
        ck_assert_msg(strstr(err, t.id) != NULL && strstr(err, "tp-0") != NULL,
                      "the message does not say what was recognised: %s", err);
        ck_assert_msg(strstr(err, "does not migrate it") != NULL &&
                      strstr(err, "move it aside or delete it") != NULL,
                      "the message does not say what to do: %s", err);
        char *after = tree_of(tmpdir);
        ck_assert_msg(strcmp(before, after) == 0, "the refused root was changed");
        free(after);
    }
    free(before);
}
END_TEST

static Suite *seglog_suite(void)
{
    Suite *s = suite_create("kvs_seglog");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_record_codec);
    tcase_add_test(tc, test_check_words_persist);
    tcase_add_test(tc, test_v1_segments_load);
    tcase_add_test(tc, test_generations);
    tcase_add_test(tc, test_torn_tail);
    tcase_add_loop_test(tc, test_header_flip_loses_only_its_record, 0, 36);
    tcase_add_test(tc, test_embedded_record_not_indexed);
    tcase_add_test(tc, test_resync_is_bounded);
    tcase_add_test(tc, test_capacity_keeps_tombstones);
    tcase_add_test(tc, test_tombstone_for_a_newer_segment);
    tcase_add_loop_test(tc, test_kill_during_writes, 0, 3);
    tcase_add_loop_test(tc, test_kill_during_compaction, 0, 3);
    tcase_add_test(tc, test_file_per_block_root_refused);
    tcase_add_test(tc, test_layout_record_revision);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(seglog_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
