/* kvs/file I/O: paths of blocks and namespace directories, small I/O
 * helpers, the atomic write (temporary file, fsync per policy, rename), and
 * resolving a call's namespace to its directory and layout file. Worker
 * threads; no lock held across I/O. */
#include "persist/kvs/file_v1.h"
#include "persist/kvs/file_fs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"

/* ---- paths and small I/O helpers ----------------------------------------------- */

/* Map a deployment id to one safe directory name (see file.h). */
static void sanitize(const char *in, char *out, size_t outlen)
{
    size_t n = 0;
    for (; in[n] && n + 1 < outlen; n++) {
        unsigned char c = (unsigned char)in[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-' || c == '+' || c == '=' || c == ',' || c == '@';
        out[n] = ok ? (char)c : '_';
    }
    out[n] = '\0';
    if (n == 0)
        snprintf(out, outlen, "_");
    else if (out[0] == '.')
        out[0] = '_';
}

static unsigned key_bucket(int64_t key) { return (unsigned)(mix64((uint64_t)key) >> 56); }

int file_block_path(const struct fns *f, int64_t key, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/%02x/%016" PRIx64 ".blk", f->path, key_bucket(key),
                     (uint64_t)key);
    return (n < 0 || (size_t)n >= len) ? -KVNODE_EINVAL : 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0) {
            errno = EIO;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Bytes read (< len only at end of file) or -1. */
ssize_t file_read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, p + got, len - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

static int fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* The parent directory of path (into buf). */
void file_parent_of(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash && slash != buf)
        *slash = '\0';
}

/* Write a + b to `final` atomically: a unique temporary file in `dir` (made
 * when missing), fsync per policy, rename. The temporary file never
 * survives a failure. */
int file_write_atomic(struct file_v1_store *s, const char *dir, const char *final, const void *a,
                      size_t alen, const void *b, size_t blen, char *err, size_t errlen)
{
    char tmp[PATH_MAX];
    int n = snprintf(tmp, sizeof(tmp), "%s/" TMP_PREFIX "%016" PRIx64 "-%" PRIu32 "-%" PRIu64,
                     dir, s->r->instance, s->id, ++s->seq);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", dir);
        return -KVNODE_EINVAL;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {
        if (kvs_fs_mkdir_p(dir, 0755) < 0) {
            int e = errno;
            errmsg_set(err, errlen, "kvs file: cannot create directory %s: %s", dir, strerror(e));
            return kvs_fs_errno_code(e);
        }
        if (s->fsync_policy == KVS_FSYNC_ALWAYS) {
            char parent[PATH_MAX];
            file_parent_of(dir, parent, sizeof(parent));
            fsync_dir(parent);
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot create %s: %s", tmp, strerror(e));
        return kvs_fs_errno_code(e);
    }
    const char *what = "write";
    int rc = write_all(fd, a, alen);
    if (rc == 0 && blen)
        rc = write_all(fd, b, blen);
    if (rc == 0 && s->fsync_policy >= KVS_FSYNC_BATCH) {
        what = "fsync";
        rc = fsync(fd);
    }
    int e = errno;
    if (close(fd) < 0 && rc == 0) {
        what = "close";
        rc = -1;
        e = errno;
    }
    if (rc == 0 && rename(tmp, final) < 0) {
        what = "rename";
        rc = -1;
        e = errno;
    }
    if (rc < 0) {
        unlink(tmp);
        errmsg_set(err, errlen, "kvs file: %s of %s failed: %s", what, final, strerror(e));
        return kvs_fs_errno_code(e);
    }
    if (s->fsync_policy == KVS_FSYNC_ALWAYS && fsync_dir(dir) < 0) {
        e = errno;
        errmsg_set(err, errlen, "kvs file: fsync of directory %s failed: %s", dir, strerror(e));
        return kvs_fs_errno_code(e);
    }
    return 0;
}

/* ---- namespaces ---------------------------------------------------------------- */

int file_check_ns(const struct kvs_ns *ns, char *err, size_t errlen)
{
    if (!ns || !ns->layout) {
        errmsg_set(err, errlen, "kvs file: no namespace");
        return -KVNODE_EINVAL;
    }
    return 0;
}

int file_resolve_ns(struct file_v1_store *s, const struct kvs_ns *ns, struct fns **out, char *err,
                    size_t errlen)
{
    char idbuf[NS_DEPLOYMENT_ID_MAX + 32], dir[DIR_MAX];
    const char *id = ns->deployment_id;
    int rc = file_check_ns(ns, err, errlen);
    if (rc)
        return rc;
    if (!id || !*id) {
        ns_deployment_id(ns->layout, ns->fingerprint, idbuf, sizeof(idbuf));
        id = idbuf;
    }
    sanitize(id, dir, sizeof(dir));
    uint32_t rank = ns->layout->tp_rank;
    struct fns *f = s->last_ns;
    if (!f || f->rank != rank || strcmp(f->dir, dir) != 0) {
        pthread_mutex_lock(&s->r->mu);
        f = file_fns_get(s->r, dir, rank);
        pthread_mutex_unlock(&s->r->mu);
        if (!f) {
            errmsg_set(err, errlen, "kvs file: out of memory");
            return -KVNODE_ENOMEM;
        }
        s->last_ns = f;
    }
    *out = f;
    return 0;
}

/* 0 when path holds a valid layout record equal to l (fingerprint fp). */
static int layout_file_matches(const char *path, const char *tenant, const struct ns_layout *l,
                               uint64_t fp)
{
    uint8_t b[LAYOUT_SIZE + 1];
    struct ns_layout got;
    uint64_t gfp;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    ssize_t n = file_read_full(fd, b, sizeof(b));
    close(fd);
    if (n < 0 || file_layout_decode(b, (size_t)n, tenant, &got, &gfp) != NULL)
        return -1;
    return (gfp == fp && file_layout_equal(&got, l)) ? 0 : -1;
}

/* Make f's directory and its layout file (once per process unless the
 * layout changes, e.g. a new block size for the deployment). */
int file_ensure_layout(struct file_v1_store *s, struct fns *f, const struct kvs_ns *ns, char *err,
                       size_t errlen)
{
    struct froot *r = s->r;
    pthread_mutex_lock(&r->mu);
    int known = f->layout_known && file_layout_equal(&f->layout, ns->layout);
    pthread_mutex_unlock(&r->mu);
    if (known)
        return 0;

    char path[PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s/" LAYOUT_NAME, f->path);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", f->path);
        return -KVNODE_EINVAL;
    }
    if (layout_file_matches(path, s->tenant, ns->layout, ns->fingerprint) != 0) {
        uint8_t rec[LAYOUT_SIZE];
        if (kvs_fs_mkdir_p(f->path, 0755) < 0) {
            int e = errno;
            errmsg_set(err, errlen, "kvs file: cannot create directory %s: %s", f->path,
                       strerror(e));
            return kvs_fs_errno_code(e);
        }
        if (s->fsync_policy == KVS_FSYNC_ALWAYS) {
            char parent[PATH_MAX];
            file_parent_of(f->path, parent, sizeof(parent));
            fsync_dir(parent);
            fsync_dir(r->path);
        }
        file_layout_encode(rec, ns->layout, ns->fingerprint);
        int rc = file_write_atomic(s, f->path, path, rec, sizeof(rec), NULL, 0, err, errlen);
        if (rc)
            return rc;
    }
    pthread_mutex_lock(&r->mu);
    f->layout = *ns->layout;
    f->layout_known = 1;
    pthread_mutex_unlock(&r->mu);
    return 0;
}
