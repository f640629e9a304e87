/* kvs/file root: what every handle on one root directory shares in this
 * process — the .lock, the segment list (with live bytes), the keydir, the
 * direct-I/O probe — and the capacity policy (whole least-recently-written
 * segments dropped); a root of the file-per-block store of 0.1.0-pre is
 * refused. r->mu guards O(1) bookkeeping, never I/O. */
#include "persist/kvs/file_internal.h"
#include "persist/kvs/file_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "core/log.h"
#include "kvnode.h"

#define KD_MIN_BUCKETS ((size_t)1 << 14)

void seg_path(const struct seg_root *r, uint64_t id, bool hint, char *buf, size_t len)
{
    if (hint)
        snprintf(buf, len, "%s/" SEG_HINT_FMT, r->path, id);
    else
        snprintf(buf, len, "%s/" SEG_NAME_FMT, r->path, id);
}

/* ---- namespaces ----------------------------------------------------------------------- */

struct seg_ns *seg_ns_get(struct seg_root *r, uint64_t fp, uint32_t rank)
{
    for (struct seg_ns *n = r->nss; n; n = n->next)
        if (n->fingerprint == fp && n->rank == rank)
            return n;
    struct seg_ns *n = calloc(1, sizeof(*n));
    if (!n)
        return NULL;
    n->fingerprint = fp;
    n->rank = rank;
    n->next = r->nss;
    r->nss = n;
    return n;
}

/* ---- keydir ---------------------------------------------------------------------------- */

static size_t kd_hash(const struct seg_ns *ns, int64_t key)
{
    uint64_t x = (uint64_t)key ^ (ns->fingerprint * UINT64_C(0x9e3779b97f4a7c15)) ^ ns->rank;
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return (size_t)x;
}

struct kd_ent *seg_kd_find(struct seg_root *r, const struct seg_ns *ns, int64_t key)
{
    for (struct kd_ent *e = r->tab[kd_hash(ns, key) & r->mask]; e; e = e->next)
        if (e->key == key && e->ns == ns)
            return e;
    return NULL;
}

/* Doubling; the scan's reverse-binary cursor (file_recover.c) survives it. */
static void kd_grow(struct seg_root *r)
{
    size_t nb = (r->mask + 1) * 2;
    struct kd_ent **t = calloc(nb, sizeof(*t));
    if (!t)
        return;                    /* longer chains, still correct */
    for (size_t i = 0; i <= r->mask; i++)
        for (struct kd_ent *e = r->tab[i], *nx; e; e = nx) {
            nx = e->next;
            size_t b = kd_hash(e->ns, e->key) & (nb - 1);
            e->next = t[b];
            t[b] = e;
        }
    free(r->tab);
    r->tab = t;
    r->mask = nb - 1;
}

static void unlink_ent(struct seg_root *r, struct kd_ent *e)
{
    struct kd_ent **pp = &r->tab[kd_hash(e->ns, e->key) & r->mask];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    r->count--;
}

/* e leaves its segment's live set (no-op for stale entries and tombstones). */
static void ent_unlive(struct seg_root *r, struct kd_ent *e)
{
    if (e->kind != KD_BLOCK || e->seg->dropped)
        return;
    uint64_t b = seg_rec_len(e->size);
    e->seg->live_bytes -= b;
    e->seg->live_count--;
    r->st.blocks--;
    r->st.bytes -= b;
    seg_reclaim_if_dead(r, e->seg);
}

void seg_kd_remove(struct seg_root *r, struct kd_ent *e)
{
    ent_unlive(r, e);
    unlink_ent(r, e);
    free(e);
}

bool seg_kd_apply(struct seg_root *r, struct seg_ns *ns, int64_t key, uint64_t check, uint8_t kind,
                  struct seg *sg, uint64_t off, uint64_t size, uint32_t crc, uint64_t seq)
{
    struct kd_ent *e = seg_kd_find(r, ns, key);
    if (e && e->seq >= seq && !e->seg->dropped)
        return false;              /* a newer write (or delete) already holds the key */
    if (e)
        ent_unlive(r, e);
    if (kind == KD_TOMB && r->recovered) {
        /* Nothing older can turn up any more: the key is simply absent. */
        if (e) {
            unlink_ent(r, e);
            free(e);
        }
        return true;
    }
    if (!e) {
        if (!(e = calloc(1, sizeof(*e))))
            return false;
        e->ns = ns;
        e->key = key;
        if (r->count >= r->mask + 1)
            kd_grow(r);
        size_t b = kd_hash(ns, key) & r->mask;
        e->next = r->tab[b];
        r->tab[b] = e;
        r->count++;
    }
    e->kind = kind;
    e->check = check;
    e->seg = sg;
    e->off = off;
    e->size = size;
    e->crc = crc;
    e->seq = seq;
    if (kind == KD_BLOCK) {
        uint64_t b = seg_rec_len(size);
        sg->live_bytes += b;
        sg->live_count++;
        r->st.blocks++;
        r->st.bytes += b;
    }
    return true;
}

/* ---- segments -------------------------------------------------------------------------- */

struct seg *seg_add(struct seg_root *r, uint64_t id)
{
    if (r->nsegs == r->capsegs) {
        size_t cap = r->capsegs ? r->capsegs * 2 : 64;
        struct seg **v = realloc(r->segs, cap * sizeof(*v));
        if (!v)
            return NULL;
        r->segs = v;
        r->capsegs = cap;
    }
    struct seg *sg = calloc(1, sizeof(*sg));
    if (!sg)
        return NULL;
    sg->id = id;
    sg->rfd = -1;
    r->segs[r->nsegs++] = sg;
    r->st.segments++;
    return sg;
}

static void queue_unlink(struct seg_root *r, uint64_t id)
{
    /* Kept on the root; the next caller outside the lock removes the files. */
    if (r->nunlink == r->capunlink) {
        size_t cap = r->capunlink ? r->capunlink * 2 : 16;
        uint64_t *v = realloc(r->unlink_ids, cap * sizeof(*v));
        if (!v)
            return;                /* the files stay; the next start drops them again */
        r->unlink_ids = v;
        r->capunlink = cap;
    }
    r->unlink_ids[r->nunlink++] = id;
}

void seg_mark_dropped(struct seg_root *r, struct seg *sg)
{
    if (sg->dropped)
        return;
    sg->dropped = true;
    r->st.blocks -= sg->live_count;
    r->st.bytes -= sg->live_bytes;
    r->st.disk_bytes -= sg->len;
    r->st.segments--;
    if (sg->refs == 0 && sg->rfd >= 0) {
        close(sg->rfd);
        sg->rfd = -1;
    }
    queue_unlink(r, sg->id);
}

void seg_unref(struct seg_root *r, struct seg *sg)
{
    (void)r;
    if (--sg->refs == 0 && sg->dropped && sg->rfd >= 0) {
        close(sg->rfd);
        sg->rfd = -1;
    }
}

static bool is_oldest(const struct seg_root *r, const struct seg *sg)
{
    for (size_t i = 0; i < r->nsegs; i++)
        if (!r->segs[i]->dropped)
            return r->segs[i] == sg;
    return false;
}

void seg_reclaim_if_dead(struct seg_root *r, struct seg *sg)
{
    /* A tombstone must outlive the records it hides: a segment holding
     * tombstones goes only once it is the oldest one left. */
    if (sg->open || sg->dropped || sg->loading || sg->live_count || r->load_busy)
        return;
    if (sg->tombs && !is_oldest(r, sg))
        return;
    r->st.segments_reclaimed++;
    seg_mark_dropped(r, sg);
}

void seg_unlink_files(const struct seg_root *r, uint64_t id)
{
    char p[PATH_MAX];
    seg_path(r, id, true, p, sizeof p);
    unlink(p);
    seg_path(r, id, false, p, sizeof p);
    unlink(p);
}

void seg_drain_unlinks(struct seg_root *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t *ids = r->unlink_ids;
    size_t n = r->nunlink;
    r->unlink_ids = NULL;
    r->nunlink = r->capunlink = 0;
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < n; i++)
        seg_unlink_files(r, ids[i]);
    free(ids);
}

bool seg_make_room(struct seg_root *r, uint64_t need)
{
    if (!r->capacity)
        return true;
    /* Oldest first. A segment holding tombstones goes in the first pass
     * only when it is the oldest left (its tombstones could hide records in
     * an older one, an open one say); in the second, if still short, any. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < r->nsegs && r->st.disk_bytes + need > r->capacity; i++) {
            struct seg *sg = r->segs[i];
            if (sg->dropped || sg->open || sg->loading)
                continue;
            if (pass == 0 && sg->tombs && !is_oldest(r, sg))
                continue;
            r->st.evicted += sg->live_count;
            r->st.evicted_bytes += sg->live_bytes;
            r->st.segments_dropped++;
            seg_mark_dropped(r, sg);
        }
    return r->st.disk_bytes + need <= r->capacity;
}

/* ---- a root's creation and end -------------------------------------------------------- */

void seg_root_free(struct seg_root *r)
{
    if (r->tab)
        for (size_t i = 0; i <= r->mask; i++)
            for (struct kd_ent *e = r->tab[i], *nx; e; e = nx) {
                nx = e->next;
                free(e);
            }
    free(r->tab);
    for (size_t i = 0; i < r->nsegs; i++) {
        if (r->segs[i]->rfd >= 0)
            close(r->segs[i]->rfd);
        free(r->segs[i]);
    }
    free(r->segs);
    for (struct seg_ns *n = r->nss, *nx; n; n = nx) {
        nx = n->next;
        free(n);
    }
    free(r->unlink_ids);
    if (r->lockfd >= 0)
        close(r->lockfd);
    pthread_mutex_destroy(&r->mu);
    free(r->path);
    free(r);
}

static int cmp_seg(const void *a, const void *b)
{
    const struct seg *x = *(struct seg *const *)a, *y = *(struct seg *const *)b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Does the file system take O_DIRECT writes here? One aligned write to a
 * probe file answers it. */
static bool probe_direct(const char *root)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/.direct-probe", root);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    bool ok = false;
    if (fd >= 0) {
        void *b = NULL;
        if (posix_memalign(&b, SEG_DIO_ALIGN, SEG_DIO_ALIGN) == 0) {
            memset(b, 0, SEG_DIO_ALIGN);
            ok = pwrite(fd, b, SEG_DIO_ALIGN, 0) == (ssize_t)SEG_DIO_ALIGN;
            free(b);
        }
        close(fd);
    }
    unlink(p);
    return ok;
}

/* The segments of the root as they are on disk (readdir: O(files), no data
 * read). */
static int list_segments(struct seg_root *r, char *err, size_t errlen)
{
    DIR *d = opendir(r->path);
    struct dirent *de;
    uint64_t max_id = 0;
    if (!d) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot list %s: %s", r->path, strerror(e));
        return kvs_fs_errno_code(e);
    }
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        uint64_t id;
        char tail[8];
        if (n[0] == '.')
            continue;
        if (sscanf(n, "seg-%16" SCNx64 ".%7s", &id, tail) == 2 && strlen(n) == 4 + 16 + 4 &&
            strcmp(tail, "log") == 0) {
            struct stat st;
            if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
                continue;
            struct seg *sg = seg_add(r, id);
            if (!sg) {
                closedir(d);
                errmsg_set(err, errlen, "kvs file: out of memory");
                return -KVNODE_ENOMEM;
            }
            sg->len = (uint64_t)st.st_size;
            sg->loading = true;
            r->st.disk_bytes += sg->len;
            if (id > max_id)
                max_id = id;
            continue;
        }
        if (strstr(n, ".hint.tmp"))        /* a hint write cut short: redone from the log */
            unlinkat(dirfd(d), n, 0);
    }
    closedir(d);
    if (r->nsegs > 1)
        qsort(r->segs, r->nsegs, sizeof(*r->segs), cmp_seg);
    r->nloading = r->nsegs;
    r->next_id = max_id + 1;
    r->epoch = max_id + 1;
    r->recovered = r->nsegs == 0;
    return 0;
}

/* A rank directory of the file-per-block store of 0.1.0-pre (tp-<digits>,
 * a directory) in directory `name` of the root: its name into rank. */
static bool holds_rank_dir(int dirfd, const char *name, char *rank, size_t len)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *de;
    bool found = false;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    while (!found && (de = readdir(d)) != NULL)
        found = strncmp(de->d_name, "tp-", 3) == 0 && de->d_name[3] &&
                strspn(de->d_name + 3, "0123456789") == strlen(de->d_name + 3) &&
                (de->d_type == DT_DIR || de->d_type == DT_UNKNOWN);
    if (found)
        snprintf(rank, len, "%s", de->d_name);
    closedir(d);
    return found;
}

/* That store kept <root>/<deployment dir>/tp-<rank>/ trees (the segment log
 * makes no directory but tenants/); nothing reads or migrates it any more.
 * Checked before the .lock is made: a refused root is left as it was. */
static int refuse_file_per_block(const char *path, char *err, size_t errlen)
{
    DIR *d = opendir(path);
    struct dirent *de;
    char rank[NAME_MAX + 1];
    if (!d)
        return 0;                  /* list_segments says why */
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || strcmp(de->d_name, SEG_TENANTS_DIR) == 0 ||
            (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) ||
            !holds_rank_dir(dirfd(d), de->d_name, rank, sizeof rank))
            continue;
        errmsg_set(err, errlen, "kvs file: %s: this is a file-per-block store of kvnode 0.1.0-pre "
                   "(it holds %s/%s, a deployment's rank directory of that format); this version "
                   "reads only the segment log and does not migrate it: move it aside or delete it",
                   path, de->d_name, rank);
        closedir(d);
        return -KVNODE_EINVAL;
    }
    closedir(d);
    return 0;
}

/* roots_mu held. */
struct seg_root *seg_root_create(const char *path, const char *tenant, int direct_io, char *err,
                                 size_t errlen, int *rc)
{
    struct seg_root *r = calloc(1, sizeof(*r));
    char lock[PATH_MAX];
    *rc = -KVNODE_ENOMEM;
    if (!r) {
        errmsg_set(err, errlen, "kvs file: out of memory");
        return NULL;
    }
    r->lockfd = -1;
    pthread_mutex_init(&r->mu, NULL);
    r->mask = KD_MIN_BUCKETS - 1;
    r->tab = calloc(KD_MIN_BUCKETS, sizeof(*r->tab));
    r->path = strdup(path);
    if (tenant)
        snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    if (!r->tab || !r->path) {
        errmsg_set(err, errlen, "kvs file: out of memory");
        seg_root_free(r);
        return NULL;
    }
    if ((*rc = refuse_file_per_block(path, err, errlen)) < 0) {
        seg_root_free(r);
        return NULL;
    }
    int n = snprintf(lock, sizeof(lock), "%s/" SEG_LOCK_NAME, path);
    r->lockfd = (n < 0 || (size_t)n >= sizeof(lock)) ? (errno = ENAMETOOLONG, -1)
                : open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (r->lockfd < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot open %s: %s", lock, strerror(e));
        *rc = kvs_fs_errno_code(e);
        seg_root_free(r);
        return NULL;
    }
    if (flock(r->lockfd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: %s is in use by another process (%s is locked: %s)",
                   path, lock, strerror(e));
        *rc = -KVNODE_EIO;
        seg_root_free(r);
        return NULL;
    }
    if ((*rc = list_segments(r, err, errlen)) < 0) {
        seg_root_free(r);
        return NULL;
    }
    r->direct_ok = direct_io != KVS_DIRECT_OFF && probe_direct(path);
    if (direct_io == KVS_DIRECT_ON && !r->direct_ok) {
        errmsg_set(err, errlen, "kvs file: the file system of %s refuses O_DIRECT writes and "
                   "persist.direct_io = on; set it to auto (buffered I/O there) or use another "
                   "file system", path);
        *rc = -KVNODE_EINVAL;
        seg_root_free(r);
        return NULL;
    }
    if (direct_io == KVS_DIRECT_AUTO && !r->direct_ok)
        log_info("kvs file: %s does not take O_DIRECT writes; segments are written through the "
                 "page cache", path);
    *rc = 0;
    return r;
}
