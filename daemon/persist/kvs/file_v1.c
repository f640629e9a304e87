/* kvs/file: the embedded file backend — open and close (the roots in use
 * by this process), health, put, get, del, exists, and the extras of file.h.
 * Format and policies: see file_v1.h. */
#include "persist/kvs/file_v1.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"
#include "persist/kvs/crc32c.h"
#include "persist/kvs/file_fs.h"

static pthread_mutex_t roots_mu = PTHREAD_MUTEX_INITIALIZER;
static struct froot *roots;

/* ---- the backend ------------------------------------------------------------------ */

static int file_open(const struct kvs_config *cfg, struct kvs_store **out, char *err,
                     size_t errlen)
{
    char real[PATH_MAX];
    int rc;

    *out = NULL;
    if (!cfg || !cfg->path || !*cfg->path) {
        errmsg_set(err, errlen, "kvs file: no root directory configured (persist path is empty)");
        return -KVNODE_EINVAL;
    }
    if (cfg->fsync_policy < KVS_FSYNC_NEVER || cfg->fsync_policy > KVS_FSYNC_ALWAYS) {
        errmsg_set(err, errlen, "kvs file: invalid fsync policy %d", cfg->fsync_policy);
        return -KVNODE_EINVAL;
    }
    if ((rc = kvs_fs_root(cfg->path, real, err, errlen)) < 0)
        return rc;
    struct file_v1_store *s = calloc(1, sizeof(*s));
    if (!s) {
        errmsg_set(err, errlen, "kvs file: out of memory");
        return -KVNODE_ENOMEM;
    }
    if (cfg->tenant)
        snprintf(s->tenant, sizeof s->tenant, "%s", cfg->tenant);
    pthread_mutex_lock(&roots_mu);
    struct froot *r;
    for (r = roots; r; r = r->next)
        if (strcmp(r->path, real) == 0)
            break;
    if (!r) {
        r = file_root_create(real, err, errlen, &rc);
        if (!r) {
            pthread_mutex_unlock(&roots_mu);
            free(s);
            return rc;
        }
        r->next = roots;
        roots = r;
    }
    r->refs++;
    s->id = r->next_handle++;
    pthread_mutex_unlock(&roots_mu);

    pthread_mutex_lock(&r->mu);
    r->capacity = cfg->capacity_bytes;
    pthread_mutex_unlock(&r->mu);
    s->r = r;
    s->fsync_policy = cfg->fsync_policy;
    *out = (struct kvs_store *)s;
    return 0;
}

static void file_close(struct kvs_store *ks)
{
    struct file_v1_store *s = FS1(ks);
    if (!s)
        return;
    pthread_mutex_lock(&roots_mu);
    if (--s->r->refs == 0) {
        struct froot **pp = &roots;
        while (*pp != s->r)
            pp = &(*pp)->next;
        *pp = s->r->next;
        file_root_free(s->r);
    }
    pthread_mutex_unlock(&roots_mu);
    free(s);
}

static int file_health(struct kvs_store *ks, char *err, size_t errlen)
{
    return kvs_fs_dir_health(FS1(ks)->r->path, err, errlen);
}

static int check_len(const struct kvs_ns *ns, const void *data, size_t len, char *err,
                     size_t errlen)
{
    if (!data || len == 0 || len != ns->layout->block_bytes) {
        errmsg_set(err, errlen, "kvs file: block of %zu bytes, layout says %" PRIu64, len,
                   ns->layout->block_bytes);
        return -KVNODE_EINVAL;
    }
    return 0;
}

static int file_put(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, uint64_t check,
                    const void *data, size_t len, char *err, size_t errlen)
{
    struct file_v1_store *s = FS1(ks);
    struct froot *r = s->r;
    struct fns *f;
    char path[PATH_MAX], dir[PATH_MAX];
    int rc;

    /* This format predates check words: its blocks all have word 0. */
    if (check != 0) {
        errmsg_set(err, errlen, "kvs file_v1: the file-per-block format has no check words");
        return -KVNODE_EINVAL;
    }
    if ((rc = file_check_ns(ns, err, errlen)) || (rc = check_len(ns, data, len, err, errlen)) ||
        (rc = file_resolve_ns(s, ns, &f, err, errlen)) ||
        (rc = file_ensure_layout(s, f, ns, err, errlen)))
        return rc;
    if (file_block_path(f, key, path, sizeof(path))) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", f->path);
        return -KVNODE_EINVAL;
    }
    file_parent_of(path, dir, sizeof(dir));

    /* Make room: take victims off the LRU under the lock, unlink them after. */
    uint64_t need = HDR_SIZE + (uint64_t)len;
    struct lru_ent *victims = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->capacity && need > r->capacity) {
        pthread_mutex_unlock(&r->mu);
        errmsg_set(err, errlen, "kvs file: block of %" PRIu64 " bytes exceeds the capacity of %s"
                   " (%" PRIu64 " bytes)", need, r->path, r->capacity);
        return -KVNODE_ENOSPC;
    }
    struct lru_ent *own = file_lru_find(r, f, key);
    if (own) {                     /* replaced in place: never its own victim */
        file_list_unlink(own);
        file_list_push_front(r, own);
    }
    uint64_t old = own ? own->size : 0;
    while (r->capacity && r->used - old + r->pending + need > r->capacity &&
           r->head.prev != &r->head && r->head.prev != own) {
        struct lru_ent *v = r->head.prev;
        file_lru_detach(r, v);
        r->st.evicted++;
        r->st.evicted_bytes += v->size;
        v->hnext = victims;
        victims = v;
    }
    r->pending += need;
    pthread_mutex_unlock(&r->mu);

    while (victims) {
        struct lru_ent *v = victims;
        char vpath[PATH_MAX];
        victims = v->hnext;
        if (file_block_path(v->ns, v->key, vpath, sizeof(vpath)) == 0)
            unlink(vpath);
        free(v);
    }

    uint8_t hdr[HDR_SIZE];
    struct blk_hdr h = { .fingerprint = ns->fingerprint, .key = key, .size = len,
                         .rank = ns->layout->tp_rank, .crc = crc32c(0, data, len) };
    file_hdr_encode(hdr, &h);
    rc = file_write_atomic(s, dir, path, hdr, sizeof(hdr), data, len, err, errlen);

    pthread_mutex_lock(&r->mu);
    r->pending -= need;
    if (rc == 0)
        file_lru_note(r, f, key, need, 1);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* Remove the bad copy open as fd (only if path still names that file). */
static void remove_bad(struct froot *r, struct fns *f, int64_t key, const char *path, int fd)
{
    struct stat a, b;
    if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
        unlink(path);
    pthread_mutex_lock(&r->mu);
    file_lru_drop(r, f, key);
    r->st.corrupt++;
    pthread_mutex_unlock(&r->mu);
}

static int file_get(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, uint64_t check,
                    void *data, size_t len, char *err, size_t errlen)
{
    struct file_v1_store *s = FS1(ks);
    struct froot *r = s->r;
    struct fns *f;
    char path[PATH_MAX];
    uint8_t hb[HDR_SIZE];
    struct blk_hdr h;
    struct stat st;
    const char *why = NULL;
    int rc;

    if ((rc = file_check_ns(ns, err, errlen)) || (rc = check_len(ns, data, len, err, errlen)) ||
        (rc = file_resolve_ns(s, ns, &f, err, errlen)))
        return rc;
    if (check != 0)
        return KVS_MISS;           /* word-0 blocks only */
    if (file_block_path(f, key, path, sizeof(path))) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", f->path);
        return -KVNODE_EINVAL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR) {
            pthread_mutex_lock(&r->mu);
            file_lru_drop(r, f, key);
            pthread_mutex_unlock(&r->mu);
            return KVS_MISS;
        }
        errmsg_set(err, errlen, "kvs file: cannot open %s: %s", path, strerror(e));
        return kvs_fs_errno_code(e);
    }
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        errmsg_set(err, errlen, "kvs file: cannot stat %s: %s", path, strerror(e));
        return kvs_fs_errno_code(e);
    }
    ssize_t n = file_read_full(fd, hb, sizeof(hb));
    if (n < 0)
        goto ioerr;
    if (n != (ssize_t)sizeof(hb))
        why = "short header";
    else if ((why = file_hdr_decode(hb, &h)) != NULL)
        ;
    else if (h.fingerprint != ns->fingerprint)
        why = "foreign deployment fingerprint";
    else if (h.rank != ns->layout->tp_rank)
        why = "foreign tp rank";
    else if (h.key != key)
        why = "foreign key";
    else if (h.size != len)
        why = "payload size differs from the block size";
    else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != HDR_SIZE + (uint64_t)len)
        why = "file size does not match the header";
    if (!why) {
        n = file_read_full(fd, data, len);
        if (n < 0)
            goto ioerr;
        if ((size_t)n != len)
            why = "short payload";
        else if (crc32c(0, data, len) != h.crc)
            why = "payload checksum mismatch";
    }
    if (why) {
        remove_bad(r, f, key, path, fd);
        close(fd);
        errmsg_set(err, errlen, "kvs file: %s: %s (removed)", path, why);
        return KVS_CORRUPT;
    }
    close(fd);
    pthread_mutex_lock(&r->mu);
    file_lru_note(r, f, key, (uint64_t)st.st_size, 1);
    pthread_mutex_unlock(&r->mu);
    return 0;
ioerr:
    {
        int e = errno;
        close(fd);
        errmsg_set(err, errlen, "kvs file: read of %s failed: %s", path, strerror(e));
        return kvs_fs_errno_code(e);
    }
}

static int file_del(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, uint64_t check,
                    char *err, size_t errlen)
{
    struct file_v1_store *s = FS1(ks);
    struct fns *f;
    char path[PATH_MAX];
    int rc = file_resolve_ns(s, ns, &f, err, errlen);
    if (rc || check != 0)
        return rc;                 /* word-0 blocks only: nothing of another word's here */
    if (file_block_path(f, key, path, sizeof(path))) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", f->path);
        return -KVNODE_EINVAL;
    }
    pthread_mutex_lock(&s->r->mu);
    file_lru_drop(s->r, f, key);
    pthread_mutex_unlock(&s->r->mu);
    if (unlink(path) < 0 && errno != ENOENT && errno != ENOTDIR) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot remove %s: %s", path, strerror(e));
        return kvs_fs_errno_code(e);
    }
    return 0;
}

static int file_exists(struct kvs_store *ks, const struct kvs_ns *ns, const int64_t *keys,
                       const uint64_t *checks, size_t n, uint8_t *present, char *err,
                       size_t errlen)
{
    struct file_v1_store *s = FS1(ks);
    struct fns *f;
    char path[PATH_MAX];
    int rc = file_resolve_ns(s, ns, &f, err, errlen);
    if (rc)
        return rc;
    if (n && (!keys || !present)) {
        errmsg_set(err, errlen, "kvs file: exists without keys");
        return -KVNODE_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        present[i] = 0;
        if (file_block_path(f, keys[i], path, sizeof(path)))
            continue;
        if (stat(path, &st) == 0) {
            bool held = S_ISREG(st.st_mode) && (uint64_t)st.st_size > HDR_SIZE;
            present[i] = !held ? KVS_ABSENT
                         : checks && checks[i] ? KVS_PRESENT_OTHER_WORD : KVS_PRESENT;
        } else if (errno != ENOENT && errno != ENOTDIR) {
            int e = errno;
            errmsg_set(err, errlen, "kvs file: cannot stat %s: %s", path, strerror(e));
            return kvs_fs_errno_code(e);
        }
    }
    return 0;
}

/* ---- extras (file_v1.h) ------------------------------------------------------------------ */

void kvs_file_v1_stats(struct kvs_store *ks, struct kvs_file_v1_stats *out)
{
    struct froot *r = FS1(ks)->r;
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    out->blocks = r->count;
    out->bytes = r->used;
    out->capacity_bytes = r->capacity;
    pthread_mutex_unlock(&r->mu);
}

int kvs_file_v1_block_path(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, char *buf,
                        size_t len)
{
    struct fns *f;
    int rc = file_resolve_ns(FS1(ks), ns, &f, NULL, 0);
    if (rc)
        return rc;
    return file_block_path(f, key, buf, len);
}

const struct kvs_backend kvs_file_v1_backend = {
    .name = "file-v1",
    .open = file_open,
    .health = file_health,
    .put = file_put,
    .get = file_get,
    .del = file_del,
    .exists = file_exists,
    .scan = file_scan,
    .close = file_close,
};
