/* Fuzz target: what the `file` KV-store backend, the segment log, reads back
 * from disk (daemon/persist/kvs/file*.c: record headers, layout records,
 * payload checks, hint files, the recovery scan with torn tails cut).
 *
 * Per input, in a fresh store under this process's temporary directory: two
 * real blocks are put (known patterns) and the store closed (its segment
 * gets a hint file); then the bytes go (1) after the segment's end, as a
 * torn tail, (2) as a stray segment of a higher id, (3) over the hint file;
 * after each, the store is opened again and fully scanned. Must hold for
 * any input:
 *  - get answers 0, KVS_MISS or KVS_CORRUPT, and 0 only with bytes that
 *    were written: a block's own pattern, or BB bytes found in the input
 *    (a record the input itself carries, checksums and all);
 *  - the scan ends (0/1, bounded calls) and reports only blocks with a
 *    valid layout that hashes to the fingerprint, of that layout's block
 *    size;
 *  - a block never touched by the input (case 1 and 2: K_GOOD) reads back
 *    exactly, or as bytes the input carries under its key.
 *
 * KVNODE_FUZZ_SEED_DIR=DIR in the environment: the first input also copies
 * the real segment and hint files there (how the seed corpus was made). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/rmtree.h"
#include "fuzz.h"
#include "core/log.h"
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

static void cleanup(void)
{
    if (tmpdir[0])
        test_rmtree(tmpdir);
}

static void init_once(void)
{
    if (tmpdir[0])
        return;
    log_set_level(LOG_LEVEL_WARN);   /* each input cuts torn tails: an info line each */
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
    static uint8_t buf[1 << 16];
    int fd = open(from, O_RDONLY | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf);
    FUZZ_CHECK(n > 0);
    close(fd);
    write_file(to, buf, (size_t)n);
}

static void append_file(const char *path, const void *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    if (size)
        FUZZ_CHECK(write(fd, data, size) == (ssize_t)size);
    FUZZ_CHECK(close(fd) == 0);
}

static const uint8_t *g_data;
static size_t g_size;

static int get(struct kvs_store *s, int64_t key, uint8_t *out)
{
    char err[512];
    int rc = kvs_backend_file.get(s, &ns, key, 0, out, BB, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == KVS_MISS || rc == KVS_CORRUPT);
    if (rc == 0) {
        uint8_t want[BB];
        pattern(want, key);
        FUZZ_CHECK(memcmp(out, want, BB) == 0 || memmem(g_data, g_size, out, BB) != NULL);
    }
    return rc;
}

static void on_found(void *arg, const struct kvs_found *f)
{
    char verr[128];
    (*(size_t *)arg)++;
    FUZZ_CHECK(ns_layout_validate(&f->layout, verr, sizeof verr) == 0);
    FUZZ_CHECK(ns_fingerprint(&f->layout) == f->fingerprint);
    FUZZ_CHECK(f->size == f->layout.block_bytes);
}

static struct kvs_store *reopen_and_scan(void)
{
    char err[512];
    struct kvs_store *s = NULL;
    struct kvs_config cfg = { .backend = "file", .path = root, .fsync_policy = KVS_FSYNC_NEVER };
    int rc = kvs_backend_file.open(&cfg, &s, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "open %s: %s\n", root, err);
    FUZZ_CHECK(rc == 0);
    struct kvs_scan *cur = NULL;
    size_t found = 0, calls = 0;
    do {
        rc = kvs_backend_file.scan(s, &cur, 2, on_found, &found, err, sizeof err);
        FUZZ_CHECK(rc == 0 || rc == 1);
        FUZZ_CHECK(++calls < 100000);
    } while (rc == 0);
    FUZZ_CHECK(cur == NULL);
    return s;
}

static void check_blocks(struct kvs_store *s)
{
    uint8_t buf[BB];
    get(s, K_GOOD, buf);
    get(s, K_VICTIM, buf);
    get(s, K_STRAY, buf);
    FUZZ_CHECK(get(s, K_NEVER, buf) == KVS_MISS || memmem(g_data, g_size, buf, BB) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512], seg[PATH_MAX], hint[PATH_MAX], stray[PATH_MAX + 32];
    uint8_t pat[BB];
    struct kvs_store *s = NULL;

    init_once();
    g_data = data;
    g_size = size;
    struct kvs_config cfg = { .backend = "file", .path = root, .fsync_policy = KVS_FSYNC_NEVER };
    int rc = kvs_backend_file.open(&cfg, &s, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "open %s: %s\n", root, err);
    FUZZ_CHECK(rc == 0);
    pattern(pat, K_GOOD);
    FUZZ_CHECK(kvs_backend_file.put(s, &ns, K_GOOD, 0, pat, BB, err, sizeof err) == 0);
    pattern(pat, K_VICTIM);
    FUZZ_CHECK(kvs_backend_file.put(s, &ns, K_VICTIM, 0, pat, BB, err, sizeof err) == 0);
    FUZZ_CHECK(kvs_file_locate(s, &ns, K_VICTIM, seg, sizeof seg, NULL) == 0);
    FUZZ_CHECK(kvs_file_locate_hint(s, &ns, K_VICTIM, hint, sizeof hint) == 0);
    kvs_backend_file.close(s);       /* the segment closes: its hint is written */

    static int dumped;
    const char *seeds = getenv("KVNODE_FUZZ_SEED_DIR");
    if (seeds && *seeds && !dumped) {
        char to[PATH_MAX];
        dumped = 1;
        snprintf(to, sizeof to, "%s/segment", seeds);
        copy_file(seg, to);
        snprintf(to, sizeof to, "%s/hint", seeds);
        copy_file(hint, to);
    }

    /* (1) the bytes as a torn tail of the segment */
    append_file(seg, data, size);
    s = reopen_and_scan();
    check_blocks(s);
    kvs_backend_file.close(s);

    /* (2) the bytes as a stray segment of a higher id */
    snprintf(stray, sizeof stray, "%s/seg-00000000000000ff.log", root);
    write_file(stray, data, size);
    s = reopen_and_scan();
    check_blocks(s);
    kvs_backend_file.close(s);

    /* (3) the bytes as the first segment's hint file */
    write_file(hint, data, size);
    s = reopen_and_scan();
    check_blocks(s);
    kvs_backend_file.close(s);

    test_rmtree(root);
    return 0;
}
