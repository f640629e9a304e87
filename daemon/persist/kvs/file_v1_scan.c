/* kvs/file scan: the recovery scan — walks root / deployment / tp-<rank> /
 * bucket directories a budget at a time, reports valid blocks (and adds them
 * to the LRU as least recent), removes bad block files and stale temporary
 * files, skips namespaces without a valid layout file. */
#include "persist/kvs/file_v1.h"
#include "persist/kvs/file_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"

/* ---- recovery scan ------------------------------------------------------------------ */

struct kvs_scan {
    DIR *d_root, *d_dep, *d_ns, *d_bkt;
    const char *tenant;            /* the store's (its handle outlives the scan) */
    char dep[DIR_MAX];
    struct fns *f;                 /* namespace being walked (d_ns) */
    struct ns_layout layout;
    uint64_t fp;
};

static void scan_free(struct kvs_scan *c)
{
    if (!c)
        return;
    if (c->d_bkt)
        closedir(c->d_bkt);
    if (c->d_ns)
        closedir(c->d_ns);
    if (c->d_dep)
        closedir(c->d_dep);
    if (c->d_root)
        closedir(c->d_root);
    free(c);
}

static DIR *open_sub(DIR *parent, const char *name)
{
    int fd = openat(dirfd(parent), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    DIR *d = fdopendir(fd);
    if (!d)
        close(fd);
    return d;
}

static struct dirent *next_entry(DIR *d)
{
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
            return de;
    return NULL;                   /* end, or an unreadable directory: skipped */
}

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* A temporary file in d: remove it unless this process's instance is
 * writing it. */
static void scan_temp(struct froot *r, DIR *d, const char *name)
{
    const char *p = name + strlen(TMP_PREFIX);
    if (strlen(p) > 16 && is_hex(p, 16) && p[16] == '-' && strtoull(p, NULL, 16) == r->instance)
        return;
    if (unlinkat(dirfd(d), name, 0) == 0) {
        pthread_mutex_lock(&r->mu);
        r->st.temps_removed++;
        pthread_mutex_unlock(&r->mu);
    }
}

/* Load the layout of namespace directory tp-<rank> of c->d_dep. */
static int scan_layout(struct kvs_scan *c, const char *name, uint32_t rank)
{
    char rel[64];
    uint8_t b[LAYOUT_SIZE + 1];
    snprintf(rel, sizeof(rel), "%s/" LAYOUT_NAME, name);
    int fd = openat(dirfd(c->d_dep), rel, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = file_read_full(fd, b, sizeof(b));
    close(fd);
    if (n < 0 || file_layout_decode(b, (size_t)n, c->tenant, &c->layout, &c->fp) != NULL ||
        c->layout.tp_rank != rank)
        return -1;
    return 0;
}

/* One file of a bucket directory: 1 when reported. */
static int scan_file(struct froot *r, struct kvs_scan *c, const char *name,
                     void (*found)(void *arg, const struct kvs_found *f), void *arg)
{
    size_t n = strlen(name);
    if (strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0) {
        scan_temp(r, c->d_bkt, name);
        return 0;
    }
    if (n != 20 || !is_hex(name, 16) || strcmp(name + 16, ".blk") != 0)
        return 0;                  /* not ours */
    int64_t key = (int64_t)strtoull(name, NULL, 16);
    uint8_t hb[HDR_SIZE];
    struct blk_hdr h;
    struct stat st;
    int bad = 1;
    int fd = openat(dirfd(c->d_bkt), name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;                  /* gone meanwhile */
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        file_read_full(fd, hb, sizeof(hb)) == HDR_SIZE && file_hdr_decode(hb, &h) == NULL &&
        h.fingerprint == c->fp && h.rank == c->layout.tp_rank &&
        h.key == key && h.size == c->layout.block_bytes &&
        (uint64_t)st.st_size == HDR_SIZE + h.size)
        bad = 0;
    close(fd);
    if (bad) {
        unlinkat(dirfd(c->d_bkt), name, 0);
        pthread_mutex_lock(&r->mu);
        r->st.scan_bad++;
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    file_lru_note(r, c->f, key, (uint64_t)st.st_size, 0);
    pthread_mutex_unlock(&r->mu);
    struct kvs_found kf = { .layout = c->layout, .fingerprint = c->fp, .key = key,
                            .size = h.size };
    found(arg, &kf);
    return 1;
}

int file_scan(struct kvs_store *ks, struct kvs_scan **cursor, size_t budget,
              void (*found)(void *arg, const struct kvs_found *f), void *arg, char *err,
              size_t errlen)
{
    struct file_v1_store *s = FS1(ks);
    struct froot *r = s->r;
    struct kvs_scan *c = *cursor;
    struct dirent *de;
    size_t reported = 0, work = 0;
    /* directory entries looked at per call (junk, temporary files, dirs) */
    size_t limit = budget > SIZE_MAX / 8 ? SIZE_MAX : budget * 4 + 64;

    if (budget == 0) {
        scan_free(c);
        *cursor = NULL;
        return 1;
    }
    if (!found) {
        errmsg_set(err, errlen, "kvs file: scan without a callback");
        return -KVNODE_EINVAL;
    }
    if (!c) {
        c = calloc(1, sizeof(*c));
        if (!c) {
            errmsg_set(err, errlen, "kvs file: out of memory");
            return -KVNODE_ENOMEM;
        }
        c->tenant = s->tenant;
        c->d_root = opendir(r->path);
        if (!c->d_root) {
            int e = errno;
            free(c);
            errmsg_set(err, errlen, "kvs file: cannot read %s: %s", r->path, strerror(e));
            return kvs_fs_errno_code(e);
        }
        *cursor = c;
    }
    while (reported < budget && work < limit) {
        work++;
        if (c->d_bkt) {
            if (!(de = next_entry(c->d_bkt))) {
                closedir(c->d_bkt);
                c->d_bkt = NULL;
            } else {
                reported += (size_t)scan_file(r, c, de->d_name, found, arg);
            }
        } else if (c->d_ns) {
            if (!(de = next_entry(c->d_ns))) {
                closedir(c->d_ns);
                c->d_ns = NULL;
            } else if (strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0) {
                scan_temp(r, c->d_ns, de->d_name);
            } else if (strlen(de->d_name) == 2 && is_hex(de->d_name, 2)) {
                c->d_bkt = open_sub(c->d_ns, de->d_name);
            }
        } else if (c->d_dep) {
            char *end;
            if (!(de = next_entry(c->d_dep))) {
                closedir(c->d_dep);
                c->d_dep = NULL;
                continue;
            }
            if (strncmp(de->d_name, "tp-", 3) != 0 || !(de->d_name[3] >= '0' && de->d_name[3] <= '9'))
                continue;
            errno = 0;
            unsigned long rank = strtoul(de->d_name + 3, &end, 10);
            if (*end || errno || rank > UINT32_MAX || strlen(de->d_name) > 16)
                continue;
            if (scan_layout(c, de->d_name, (uint32_t)rank) != 0) {
                pthread_mutex_lock(&r->mu);
                r->st.scan_bad_layout++;
                pthread_mutex_unlock(&r->mu);
                continue;
            }
            pthread_mutex_lock(&r->mu);
            c->f = file_fns_get(r, c->dep, (uint32_t)rank);
            if (c->f && !c->f->layout_known) {
                c->f->layout = c->layout;
                c->f->layout_known = 1;
            }
            pthread_mutex_unlock(&r->mu);
            if (c->f)
                c->d_ns = open_sub(c->d_dep, de->d_name);
        } else {
            if (!(de = next_entry(c->d_root))) {
                scan_free(c);
                *cursor = NULL;
                return 1;
            }
            /* Named tenants' roots live below the default's: theirs to scan. */
            if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof(c->dep) ||
                strcmp(de->d_name, TENANTS_DIR) == 0)
                continue;
            memcpy(c->dep, de->d_name, strlen(de->d_name) + 1);
            c->d_dep = open_sub(c->d_root, de->d_name);
        }
    }
    return 0;
}
