/* Fuzz target: what the `file` KV-store backend reads back from disk
 * (daemon/persist/kvs/file.c: block headers, payload checks, layout records, the
 * recovery scan).
 *
 * Per input, in a fresh store under this process's temporary directory: two
 * real blocks are put (known patterns), then the bytes replace one of them
 * (as its block file), are written as the block file of a key never put, and
 * as the namespace's layout file; get and a full scan run over that. Must
 * hold for any input:
 *  - get answers 0, KVS_MISS or KVS_CORRUPT; 0 only with exactly the payload
 *    the file holds and a file of header + block_bytes; KVS_CORRUPT removes
 *    the file (the next get is a miss);
 *  - the untouched block still reads back as its pattern (before the scan:
 *    exactly; after: the pattern or a miss, never other bytes);
 *  - the scan ends (0/1, bounded calls) and reports only blocks with a
 *    valid layout that hashes to the fingerprint, of that layout's block
 *    size, rank 0, and keys that exist.
 *
 * KVNODE_FUZZ_SEED_DIR=DIR in the environment: the first input also copies
 * the real block and layout files there (how the seed corpus was made). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "persist/kvs/file.h"
#include "persist/kvs/kvs.h"
#include "mem/namespace.h"

#define BB 64u                             /* block_bytes of the namespace */
#define K_GOOD   ((int64_t)0x1234)
#define K_VICTIM ((int64_t)-42)
#define K_STRAY  ((int64_t)7)
#define K_NEVER  ((int64_t)99)

static char tmpdir[PATH_MAX - 64];
static char root[PATH_MAX];
static struct ns_layout layout;
static struct kvs_ns ns;
static char depid[NS_DEPLOYMENT_ID_MAX];

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    remove(p);
    return 0;
}

static void rm_tree(const char *path)
{
    nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static void cleanup(void)
{
    if (tmpdir[0])
        rm_tree(tmpdir);
}

static void init_once(void)
{
    if (tmpdir[0])
        return;
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/kvnode-fuzz-kvs-XXXXXX", t && *t ? t : "/tmp");
    FUZZ_CHECK(mkdtemp(tmpdir) != NULL);
    snprintf(root, sizeof root, "%s/root", tmpdir);
    atexit(cleanup);

    snprintf(layout.model, sizeof layout.model, "demo");
    snprintf(layout.dtype, sizeof layout.dtype, "bf16");
    layout.block_tokens = 16;
    layout.block_bytes = BB;
    layout.num_layers = 2;
    layout.kv_heads = 1;
    layout.head_dim = 16;
    layout.tp_size = 1;
    layout.tp_rank = 0;
    ns.layout = &layout;
    ns.fingerprint = ns_fingerprint(&layout);
    ns_deployment_id(&layout, ns.fingerprint, depid, sizeof depid);
    ns.deployment_id = depid;
}

static void pattern(uint8_t *p, int64_t key)
{
    uint64_t x = (uint64_t)key * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < BB; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static void write_file(const char *path, const void *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FUZZ_CHECK(fd >= 0);
    const uint8_t *p = data;
    while (size > 0) {
        ssize_t w = write(fd, p, size);
        if (w < 0 && errno == EINTR)
            continue;
        FUZZ_CHECK(w > 0);
        p += w;
        size -= (size_t)w;
    }
    FUZZ_CHECK(close(fd) == 0);
}

static void copy_file(const char *from, const char *to)
{
    uint8_t buf[4096];
    int fd = open(from, O_RDONLY | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf);
    FUZZ_CHECK(n > 0);
    close(fd);
    write_file(to, buf, (size_t)n);
}

static void block_path(struct kvs_store *s, int64_t key, char *buf, size_t len)
{
    FUZZ_CHECK(kvs_file_block_path(s, &ns, key, buf, len) == 0);
}

/* Write the bytes as key's block file (its bucket directory made if needed). */
static void plant(struct kvs_store *s, int64_t key, const uint8_t *data, size_t size)
{
    char path[PATH_MAX], dir[PATH_MAX];
    block_path(s, key, path, sizeof path);
    snprintf(dir, sizeof dir, "%s", path);
    mkdir(dirname(dir), 0755);
    write_file(path, data, size);
}

static int get(struct kvs_store *s, int64_t key, uint8_t *out)
{
    char err[512];
    int rc = kvs_backend_file.get(s, &ns, key, out, BB, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == KVS_MISS || rc == KVS_CORRUPT);
    return rc;
}

static void expect_pattern(struct kvs_store *s, int64_t key, int may_miss)
{
    uint8_t want[BB], got[BB];
    pattern(want, key);
    int rc = get(s, key, got);
    if (may_miss && rc == KVS_MISS)
        return;
    FUZZ_CHECK(rc == 0);
    FUZZ_CHECK(memcmp(got, want, BB) == 0);
}

static void on_found(void *arg, const struct kvs_found *f)
{
    char verr[128];
    (*(size_t *)arg)++;
    FUZZ_CHECK(ns_layout_validate(&f->layout, verr, sizeof verr) == 0);
    FUZZ_CHECK(ns_fingerprint(&f->layout) == f->fingerprint);
    FUZZ_CHECK(f->size == f->layout.block_bytes);
    FUZZ_CHECK(f->layout.tp_rank == 0);
    FUZZ_CHECK(f->key == K_GOOD || f->key == K_VICTIM || f->key == K_STRAY);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512], path[PATH_MAX], lpath[PATH_MAX], dir[PATH_MAX];
    uint8_t buf[BB], pat[BB];
    struct kvs_store *s = NULL;

    init_once();
    struct kvs_config cfg = { .backend = "file", .path = root, .fsync_policy = KVS_FSYNC_NEVER };
    int rc = kvs_backend_file.open(&cfg, &s, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "open %s: %s\n", root, err);
    FUZZ_CHECK(rc == 0);

    pattern(pat, K_GOOD);
    FUZZ_CHECK(kvs_backend_file.put(s, &ns, K_GOOD, pat, BB, err, sizeof err) == 0);
    pattern(pat, K_VICTIM);
    FUZZ_CHECK(kvs_backend_file.put(s, &ns, K_VICTIM, pat, BB, err, sizeof err) == 0);
    block_path(s, K_VICTIM, path, sizeof path);
    snprintf(dir, sizeof dir, "%s", path);
    snprintf(lpath, sizeof lpath, "%s/layout", dirname(dirname(dir)));

    static int dumped;
    const char *seeds = getenv("KVNODE_FUZZ_SEED_DIR");
    if (seeds && *seeds && !dumped) {
        char to[PATH_MAX];
        dumped = 1;
        snprintf(to, sizeof to, "%s/block", seeds);
        copy_file(path, to);
        snprintf(to, sizeof to, "%s/layout", seeds);
        copy_file(lpath, to);
    }

    /* the bytes as a block file over a real one */
    write_file(path, data, size);
    rc = get(s, K_VICTIM, buf);
    if (rc == 0) {
        FUZZ_CHECK(size == KVS_FILE_HEADER_SIZE + BB);
        FUZZ_CHECK(memcmp(buf, data + KVS_FILE_HEADER_SIZE, BB) == 0);
        uint8_t again[BB];
        FUZZ_CHECK(get(s, K_VICTIM, again) == 0 && memcmp(again, buf, BB) == 0);
    } else if (rc == KVS_CORRUPT) {
        FUZZ_CHECK(access(path, F_OK) != 0 && errno == ENOENT);
        FUZZ_CHECK(get(s, K_VICTIM, buf) == KVS_MISS);
    }
    expect_pattern(s, K_GOOD, 0);
    FUZZ_CHECK(get(s, K_NEVER, buf) == KVS_MISS);

    /* the bytes as a stray block file and as the layout record; scan all */
    plant(s, K_STRAY, data, size);
    write_file(lpath, data, size);
    struct kvs_scan *cur = NULL;
    size_t found = 0, calls = 0;
    do {
        rc = kvs_backend_file.scan(s, &cur, 2, on_found, &found, err, sizeof err);
        FUZZ_CHECK(rc == 0 || rc == 1);
        FUZZ_CHECK(++calls < 10000);
    } while (rc == 0);
    FUZZ_CHECK(cur == NULL);
    FUZZ_CHECK(found <= 3);
    expect_pattern(s, K_GOOD, 1);

    kvs_backend_file.close(s);
    rm_tree(root);
    return 0;
}
