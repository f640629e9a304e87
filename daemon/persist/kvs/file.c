/* kvs/file: the embedded file backend. Format and policies: see file.h. */
#include "persist/kvs/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"
#include "persist/kvs/crc32c.h"
#include "mem/namespace.h"

#define HDR_SIZE     KVS_FILE_HEADER_SIZE
#define HDR_VERSION  1u
#define LAYOUT_VERSION 1u
#define LAYOUT_SIZE  (4 + 2 + 2 + 8 + 8 + 6 * 4 + NS_MODEL_MAX + NS_DTYPE_MAX + NS_EXTRA_MAX + 4)
#define LAYOUT_NAME  "layout"
#define LOCK_NAME    ".lock"
#define TMP_PREFIX   ".tmp-"
/* The health probe calls the store full below this much free space. */
#define FILE_HEALTH_MIN_FREE (UINT64_C(1) << 20)
#define DIR_MAX      NS_DEPLOYMENT_ID_MAX   /* sanitized deployment dir name, with NUL */

/* ---- little-endian encoding ---------------------------------------------- */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- block header ---------------------------------------------------------- */

struct blk_hdr {
    uint64_t fingerprint;
    int64_t  key;
    uint64_t size;
    uint32_t rank;
    uint32_t crc;
};

static void hdr_encode(uint8_t b[HDR_SIZE], const struct blk_hdr *h)
{
    memset(b, 0, HDR_SIZE);
    memcpy(b, "KVNB", 4);
    put16(b + 4, HDR_VERSION);
    put16(b + 6, HDR_SIZE);
    put64(b + 8, h->fingerprint);
    put64(b + 16, (uint64_t)h->key);
    put64(b + 24, h->size);
    put32(b + 32, h->rank);
    put32(b + 36, h->crc);
    put32(b + 60, crc32c(0, b, 60));
}

/* NULL when the header is well formed, else why not. */
static const char *hdr_decode(const uint8_t b[HDR_SIZE], struct blk_hdr *h)
{
    if (memcmp(b, "KVNB", 4) != 0)
        return "bad magic";
    if (get16(b + 4) != HDR_VERSION)
        return "unknown format version";
    if (get16(b + 6) != HDR_SIZE)
        return "bad header size";
    if (get32(b + 60) != crc32c(0, b, 60))
        return "header checksum mismatch";
    for (int i = 40; i < 60; i++)
        if (b[i])
            return "reserved header bytes set";
    h->fingerprint = get64(b + 8);
    h->key = (int64_t)get64(b + 16);
    h->size = get64(b + 24);
    h->rank = get32(b + 32);
    h->crc = get32(b + 36);
    return NULL;
}

/* ---- layout record ----------------------------------------------------------- */

static void put_str(uint8_t **p, const char *s, size_t max)
{
    size_t n = strnlen(s, max);
    if (n == max)
        n = max - 1;
    memset(*p, 0, max);
    memcpy(*p, s, n);
    *p += max;
}

static void layout_encode(uint8_t b[LAYOUT_SIZE], const struct ns_layout *l, uint64_t fp)
{
    uint8_t *p = b;
    memcpy(p, "KVNL", 4);
    put16(p + 4, LAYOUT_VERSION);
    put16(p + 6, LAYOUT_SIZE);
    put64(p + 8, fp);
    put64(p + 16, l->block_bytes);
    put32(p + 24, l->block_tokens);
    put32(p + 28, l->num_layers);
    put32(p + 32, l->kv_heads);
    put32(p + 36, l->head_dim);
    put32(p + 40, l->tp_size);
    put32(p + 44, l->tp_rank);
    p += 48;
    put_str(&p, l->model, NS_MODEL_MAX);
    put_str(&p, l->dtype, NS_DTYPE_MAX);
    put_str(&p, l->extra, NS_EXTRA_MAX);
    put32(p, crc32c(0, b, (size_t)(p - b)));
}

static int get_str(const uint8_t **p, char *out, size_t max)
{
    if (memchr(*p, 0, max) == NULL)
        return -1;
    memcpy(out, *p, max);
    *p += max;
    return 0;
}

static const char *layout_decode(const uint8_t *b, size_t n, struct ns_layout *l, uint64_t *fp)
{
    char verr[128];
    const uint8_t *p = b + 48;
    if (n != LAYOUT_SIZE)
        return "bad size";
    if (memcmp(b, "KVNL", 4) != 0)
        return "bad magic";
    if (get16(b + 4) != LAYOUT_VERSION)
        return "unknown format version";
    if (get16(b + 6) != LAYOUT_SIZE)
        return "bad record size";
    if (get32(b + LAYOUT_SIZE - 4) != crc32c(0, b, LAYOUT_SIZE - 4))
        return "checksum mismatch";
    memset(l, 0, sizeof(*l));
    *fp = get64(b + 8);
    l->block_bytes = get64(b + 16);
    l->block_tokens = get32(b + 24);
    l->num_layers = get32(b + 28);
    l->kv_heads = get32(b + 32);
    l->head_dim = get32(b + 36);
    l->tp_size = get32(b + 40);
    l->tp_rank = get32(b + 44);
    if (get_str(&p, l->model, NS_MODEL_MAX) || get_str(&p, l->dtype, NS_DTYPE_MAX) ||
        get_str(&p, l->extra, NS_EXTRA_MAX))
        return "unterminated string";
    if (ns_layout_validate(l, verr, sizeof(verr)) != 0)
        return "invalid layout";
    if (ns_fingerprint(l) != *fp)
        return "fingerprint does not match the layout";
    return NULL;
}

static int layout_equal(const struct ns_layout *a, const struct ns_layout *b)
{
    return a->block_tokens == b->block_tokens && a->block_bytes == b->block_bytes &&
           a->num_layers == b->num_layers && a->kv_heads == b->kv_heads &&
           a->head_dim == b->head_dim && a->tp_size == b->tp_size && a->tp_rank == b->tp_rank &&
           strncmp(a->model, b->model, NS_MODEL_MAX) == 0 &&
           strncmp(a->dtype, b->dtype, NS_DTYPE_MAX) == 0 &&
           strncmp(a->extra, b->extra, NS_EXTRA_MAX) == 0;
}

/* ---- process-wide state per root ---------------------------------------------- */

struct fns {                       /* a namespace directory */
    struct fns *next;
    char dir[DIR_MAX];             /* sanitized deployment dir name (immutable) */
    uint32_t rank;                 /* immutable */
    char *path;                    /* <root>/<dir>/tp-<rank> (immutable) */
    int layout_known;              /* under mu: layout is what the layout file holds */
    struct ns_layout layout;       /* under mu */
};

struct lru_ent {
    struct lru_ent *hnext;         /* hash chain (victim list once detached) */
    struct lru_ent *prev, *next;   /* LRU list: root.head.next is the most recent */
    struct fns *ns;
    int64_t key;
    uint64_t size;
};

struct froot {
    struct froot *next;            /* under roots_mu */
    int refs;                      /* under roots_mu */
    uint32_t next_handle;          /* under roots_mu */
    char *path;                    /* realpath (immutable) */
    int lockfd;
    uint64_t instance;             /* names this process's temporary files */
    pthread_mutex_t mu;            /* everything below */
    struct fns *nss;
    struct lru_ent **tab;
    size_t nbuckets, count;
    struct lru_ent head;
    uint64_t used, pending, capacity;
    struct kvs_file_stats st;
};

static pthread_mutex_t roots_mu = PTHREAD_MUTEX_INITIALIZER;
static struct froot *roots;

struct file_store {
    struct froot *r;
    int fsync_policy;
    uint32_t id;
    uint64_t seq;
    struct fns *last_ns;           /* the namespace of the previous call */
};

static struct file_store *FS(struct kvs_store *s) { return (struct file_store *)s; }

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return x;
}

static size_t ent_hash(const struct froot *r, const struct fns *f, int64_t key)
{
    return (size_t)(mix64((uint64_t)key ^ ((uint64_t)(uintptr_t)f * 0x9e3779b97f4a7c15ull)) &
                    (r->nbuckets - 1));
}

/* All lru_* and fns_* helpers: r->mu held. */
static struct lru_ent *lru_find(struct froot *r, const struct fns *f, int64_t key)
{
    for (struct lru_ent *e = r->tab[ent_hash(r, f, key)]; e; e = e->hnext)
        if (e->ns == f && e->key == key)
            return e;
    return NULL;
}

static void list_unlink(struct lru_ent *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static void list_push_front(struct froot *r, struct lru_ent *e)
{
    e->prev = &r->head;
    e->next = r->head.next;
    r->head.next->prev = e;
    r->head.next = e;
}

static void list_push_back(struct froot *r, struct lru_ent *e)
{
    e->next = &r->head;
    e->prev = r->head.prev;
    r->head.prev->next = e;
    r->head.prev = e;
}

/* Detach e from the hash and the list and drop its bytes; the caller frees it. */
static void lru_detach(struct froot *r, struct lru_ent *e)
{
    struct lru_ent **pp = &r->tab[ent_hash(r, e->ns, e->key)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    list_unlink(e);
    r->used -= e->size;
    r->count--;
}

static void lru_drop(struct froot *r, const struct fns *f, int64_t key)
{
    struct lru_ent *e = lru_find(r, f, key);
    if (e) {
        lru_detach(r, e);
        free(e);
    }
}

static void lru_grow(struct froot *r)
{
    size_t n = r->nbuckets * 2;
    struct lru_ent **tab = calloc(n, sizeof(*tab));
    if (!tab)
        return;                    /* longer chains, still correct */
    struct lru_ent **old = r->tab;
    size_t oldn = r->nbuckets;
    r->tab = tab;
    r->nbuckets = n;
    for (size_t i = 0; i < oldn; i++)
        for (struct lru_ent *e = old[i], *nx; e; e = nx) {
            nx = e->hnext;
            size_t h = ent_hash(r, e->ns, e->key);
            e->hnext = tab[h];
            tab[h] = e;
        }
    free(old);
}

/* Record (f, key) of `size` bytes: as most recent (front) or, for what a
 * scan finds, as least recent (back; an entry already known keeps its
 * place). */
static void lru_note(struct froot *r, struct fns *f, int64_t key, uint64_t size, int front)
{
    struct lru_ent *e = lru_find(r, f, key);
    if (e) {
        if (front) {
            r->used = r->used - e->size + size;
            e->size = size;
            list_unlink(e);
            list_push_front(r, e);
        }
        return;
    }
    if (r->count >= r->nbuckets)
        lru_grow(r);
    e = malloc(sizeof(*e));
    if (!e)
        return;                    /* untracked: not evictable, not counted */
    e->ns = f;
    e->key = key;
    e->size = size;
    size_t h = ent_hash(r, f, key);
    e->hnext = r->tab[h];
    r->tab[h] = e;
    if (front)
        list_push_front(r, e);
    else
        list_push_back(r, e);
    r->used += size;
    r->count++;
}

static struct fns *fns_get(struct froot *r, const char *dir, uint32_t rank)
{
    struct fns *f;
    for (f = r->nss; f; f = f->next)
        if (f->rank == rank && strcmp(f->dir, dir) == 0)
            return f;
    f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    snprintf(f->dir, sizeof(f->dir), "%s", dir);
    f->rank = rank;
    size_t n = strlen(r->path) + strlen(dir) + 32;
    f->path = malloc(n);
    if (!f->path) {
        free(f);
        return NULL;
    }
    snprintf(f->path, n, "%s/%s/tp-%" PRIu32, r->path, dir, rank);
    f->next = r->nss;
    r->nss = f;
    return f;
}

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

static int block_path(const struct fns *f, int64_t key, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/%02x/%016" PRIx64 ".blk", f->path, key_bucket(key),
                     (uint64_t)key);
    return (n < 0 || (size_t)n >= len) ? -KVNODE_EINVAL : 0;
}

static int errno_code(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return -KVNODE_ENOSPC;
    case ENOMEM:
        return -KVNODE_ENOMEM;
    default:
        return -KVNODE_EIO;
    }
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
static ssize_t read_full(int fd, void *buf, size_t len)
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

static int mkdir_p(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, mode) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, mode) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* The parent directory of path (into buf). */
static void parent_of(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash && slash != buf)
        *slash = '\0';
}

/* Write a + b to `final` atomically: a unique temporary file in `dir` (made
 * when missing), fsync per policy, rename. The temporary file never
 * survives a failure. */
static int write_atomic(struct file_store *s, const char *dir, const char *final, const void *a,
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
        if (mkdir_p(dir, 0755) < 0) {
            int e = errno;
            errmsg_set(err, errlen, "kvs file: cannot create directory %s: %s", dir, strerror(e));
            return errno_code(e);
        }
        if (s->fsync_policy == KVS_FSYNC_ALWAYS) {
            char parent[PATH_MAX];
            parent_of(dir, parent, sizeof(parent));
            fsync_dir(parent);
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot create %s: %s", tmp, strerror(e));
        return errno_code(e);
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
        return errno_code(e);
    }
    if (s->fsync_policy == KVS_FSYNC_ALWAYS && fsync_dir(dir) < 0) {
        e = errno;
        errmsg_set(err, errlen, "kvs file: fsync of directory %s failed: %s", dir, strerror(e));
        return errno_code(e);
    }
    return 0;
}

/* ---- namespaces ---------------------------------------------------------------- */

static int check_ns(const struct kvs_ns *ns, char *err, size_t errlen)
{
    if (!ns || !ns->layout) {
        errmsg_set(err, errlen, "kvs file: no namespace");
        return -KVNODE_EINVAL;
    }
    return 0;
}

static int resolve_ns(struct file_store *s, const struct kvs_ns *ns, struct fns **out, char *err,
                      size_t errlen)
{
    char idbuf[NS_DEPLOYMENT_ID_MAX + 32], dir[DIR_MAX];
    const char *id = ns->deployment_id;
    int rc = check_ns(ns, err, errlen);
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
        f = fns_get(s->r, dir, rank);
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
static int layout_file_matches(const char *path, const struct ns_layout *l, uint64_t fp)
{
    uint8_t b[LAYOUT_SIZE + 1];
    struct ns_layout got;
    uint64_t gfp;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    ssize_t n = read_full(fd, b, sizeof(b));
    close(fd);
    if (n < 0 || layout_decode(b, (size_t)n, &got, &gfp) != NULL)
        return -1;
    return (gfp == fp && layout_equal(&got, l)) ? 0 : -1;
}

/* Make f's directory and its layout file (once per process unless the
 * layout changes, e.g. a new block size for the deployment). */
static int ensure_layout(struct file_store *s, struct fns *f, const struct kvs_ns *ns, char *err,
                         size_t errlen)
{
    struct froot *r = s->r;
    pthread_mutex_lock(&r->mu);
    int known = f->layout_known && layout_equal(&f->layout, ns->layout);
    pthread_mutex_unlock(&r->mu);
    if (known)
        return 0;

    char path[PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s/" LAYOUT_NAME, f->path);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", f->path);
        return -KVNODE_EINVAL;
    }
    if (layout_file_matches(path, ns->layout, ns->fingerprint) != 0) {
        uint8_t rec[LAYOUT_SIZE];
        if (mkdir_p(f->path, 0755) < 0) {
            int e = errno;
            errmsg_set(err, errlen, "kvs file: cannot create directory %s: %s", f->path,
                       strerror(e));
            return errno_code(e);
        }
        if (s->fsync_policy == KVS_FSYNC_ALWAYS) {
            char parent[PATH_MAX];
            parent_of(f->path, parent, sizeof(parent));
            fsync_dir(parent);
            fsync_dir(r->path);
        }
        layout_encode(rec, ns->layout, ns->fingerprint);
        int rc = write_atomic(s, f->path, path, rec, sizeof(rec), NULL, 0, err, errlen);
        if (rc)
            return rc;
    }
    pthread_mutex_lock(&r->mu);
    f->layout = *ns->layout;
    f->layout_known = 1;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* ---- the backend ------------------------------------------------------------------ */

static uint64_t random_instance(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)getpid());
    }
    return v;
}

static void root_free(struct froot *r)
{
    for (struct lru_ent *e = r->head.next, *nx; e != &r->head; e = nx) {
        nx = e->next;
        free(e);
    }
    for (struct fns *f = r->nss, *nx; f; f = nx) {
        nx = f->next;
        free(f->path);
        free(f);
    }
    free(r->tab);
    if (r->lockfd >= 0)
        close(r->lockfd);
    pthread_mutex_destroy(&r->mu);
    free(r->path);
    free(r);
}

/* roots_mu held. */
static struct froot *root_create(const char *path, char *err, size_t errlen, int *rc)
{
    struct froot *r = calloc(1, sizeof(*r));
    char lock[PATH_MAX];
    *rc = -KVNODE_ENOMEM;
    if (!r)
        goto nomem;
    r->lockfd = -1;
    pthread_mutex_init(&r->mu, NULL);
    r->head.next = r->head.prev = &r->head;
    r->nbuckets = 1024;
    r->tab = calloc(r->nbuckets, sizeof(*r->tab));
    r->path = strdup(path);
    if (!r->tab || !r->path)
        goto nomem;
    r->instance = random_instance();
    int n = snprintf(lock, sizeof(lock), "%s/" LOCK_NAME, path);
    r->lockfd = (n < 0 || (size_t)n >= sizeof(lock)) ? (errno = ENAMETOOLONG, -1)
                : open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (r->lockfd < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot open %s: %s", lock, strerror(e));
        *rc = errno_code(e);
        root_free(r);
        return NULL;
    }
    if (flock(r->lockfd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: %s is in use by another process (%s is locked: %s)",
                   path, lock, strerror(e));
        *rc = -KVNODE_EIO;
        root_free(r);
        return NULL;
    }
    return r;
nomem:
    errmsg_set(err, errlen, "kvs file: out of memory");
    if (r)
        root_free(r);
    return NULL;
}

static int file_open(const struct kvs_config *cfg, struct kvs_store **out, char *err,
                     size_t errlen)
{
    char real[PATH_MAX];
    struct stat st;
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
    if (mkdir_p(cfg->path, 0755) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot create root directory %s: %s", cfg->path,
                   strerror(e));
        return errno_code(e);
    }
    if (!realpath(cfg->path, real) || stat(real, &st) < 0 || !S_ISDIR(st.st_mode)) {
        errmsg_set(err, errlen, "kvs file: root %s is not a directory", cfg->path);
        return -KVNODE_EIO;
    }
    if (access(real, W_OK | X_OK) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: root directory %s is not writable: %s", real,
                   strerror(e));
        return -KVNODE_EIO;
    }
    struct file_store *s = calloc(1, sizeof(*s));
    if (!s) {
        errmsg_set(err, errlen, "kvs file: out of memory");
        return -KVNODE_ENOMEM;
    }
    pthread_mutex_lock(&roots_mu);
    struct froot *r;
    for (r = roots; r; r = r->next)
        if (strcmp(r->path, real) == 0)
            break;
    if (!r) {
        r = root_create(real, err, errlen, &rc);
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
    struct file_store *s = FS(ks);
    if (!s)
        return;
    pthread_mutex_lock(&roots_mu);
    if (--s->r->refs == 0) {
        struct froot **pp = &roots;
        while (*pp != s->r)
            pp = &(*pp)->next;
        *pp = s->r->next;
        root_free(s->r);
    }
    pthread_mutex_unlock(&roots_mu);
    free(s);
}

static int file_health(struct kvs_store *ks, char *err, size_t errlen)
{
    struct file_store *s = FS(ks);
    struct stat st;
    if (stat(s->r->path, &st) < 0 || !S_ISDIR(st.st_mode)) {
        errmsg_set(err, errlen, "kvs file: root %s is gone or not a directory", s->r->path);
        return -KVNODE_EIO;
    }
    if (access(s->r->path, W_OK | X_OK) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: root %s is not writable: %s", s->r->path, strerror(e));
        return -KVNODE_EIO;
    }
    /* A writable directory on a full disk is not healthy: writes fail. */
    struct statvfs vfs;
    if (statvfs(s->r->path, &vfs) == 0 &&
        (uint64_t)vfs.f_bavail * vfs.f_frsize < FILE_HEALTH_MIN_FREE) {
        errmsg_set(err, errlen, "kvs file: the file system of %s is full (%" PRIu64 " bytes free)",
                   s->r->path, (uint64_t)vfs.f_bavail * vfs.f_frsize);
        return -KVNODE_ENOSPC;
    }
    return 0;
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

static int file_put(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, const void *data,
                    size_t len, char *err, size_t errlen)
{
    struct file_store *s = FS(ks);
    struct froot *r = s->r;
    struct fns *f;
    char path[PATH_MAX], dir[PATH_MAX];
    int rc;

    if ((rc = check_ns(ns, err, errlen)) || (rc = check_len(ns, data, len, err, errlen)) ||
        (rc = resolve_ns(s, ns, &f, err, errlen)) || (rc = ensure_layout(s, f, ns, err, errlen)))
        return rc;
    if (block_path(f, key, path, sizeof(path))) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", f->path);
        return -KVNODE_EINVAL;
    }
    parent_of(path, dir, sizeof(dir));

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
    struct lru_ent *own = lru_find(r, f, key);
    if (own) {                     /* replaced in place: never its own victim */
        list_unlink(own);
        list_push_front(r, own);
    }
    uint64_t old = own ? own->size : 0;
    while (r->capacity && r->used - old + r->pending + need > r->capacity &&
           r->head.prev != &r->head && r->head.prev != own) {
        struct lru_ent *v = r->head.prev;
        lru_detach(r, v);
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
        if (block_path(v->ns, v->key, vpath, sizeof(vpath)) == 0)
            unlink(vpath);
        free(v);
    }

    uint8_t hdr[HDR_SIZE];
    struct blk_hdr h = { .fingerprint = ns->fingerprint, .key = key, .size = len,
                         .rank = ns->layout->tp_rank, .crc = crc32c(0, data, len) };
    hdr_encode(hdr, &h);
    rc = write_atomic(s, dir, path, hdr, sizeof(hdr), data, len, err, errlen);

    pthread_mutex_lock(&r->mu);
    r->pending -= need;
    if (rc == 0)
        lru_note(r, f, key, need, 1);
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
    lru_drop(r, f, key);
    r->st.corrupt++;
    pthread_mutex_unlock(&r->mu);
}

static int file_get(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, void *data,
                    size_t len, char *err, size_t errlen)
{
    struct file_store *s = FS(ks);
    struct froot *r = s->r;
    struct fns *f;
    char path[PATH_MAX];
    uint8_t hb[HDR_SIZE];
    struct blk_hdr h;
    struct stat st;
    const char *why = NULL;
    int rc;

    if ((rc = check_ns(ns, err, errlen)) || (rc = check_len(ns, data, len, err, errlen)) ||
        (rc = resolve_ns(s, ns, &f, err, errlen)))
        return rc;
    if (block_path(f, key, path, sizeof(path))) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", f->path);
        return -KVNODE_EINVAL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR) {
            pthread_mutex_lock(&r->mu);
            lru_drop(r, f, key);
            pthread_mutex_unlock(&r->mu);
            return KVS_MISS;
        }
        errmsg_set(err, errlen, "kvs file: cannot open %s: %s", path, strerror(e));
        return errno_code(e);
    }
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        errmsg_set(err, errlen, "kvs file: cannot stat %s: %s", path, strerror(e));
        return errno_code(e);
    }
    ssize_t n = read_full(fd, hb, sizeof(hb));
    if (n < 0)
        goto ioerr;
    if (n != (ssize_t)sizeof(hb))
        why = "short header";
    else if ((why = hdr_decode(hb, &h)) != NULL)
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
        n = read_full(fd, data, len);
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
    lru_note(r, f, key, (uint64_t)st.st_size, 1);
    pthread_mutex_unlock(&r->mu);
    return 0;
ioerr:
    {
        int e = errno;
        close(fd);
        errmsg_set(err, errlen, "kvs file: read of %s failed: %s", path, strerror(e));
        return errno_code(e);
    }
}

static int file_del(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, char *err,
                    size_t errlen)
{
    struct file_store *s = FS(ks);
    struct fns *f;
    char path[PATH_MAX];
    int rc = resolve_ns(s, ns, &f, err, errlen);
    if (rc)
        return rc;
    if (block_path(f, key, path, sizeof(path))) {
        errmsg_set(err, errlen, "kvs file: path too long under %s", f->path);
        return -KVNODE_EINVAL;
    }
    pthread_mutex_lock(&s->r->mu);
    lru_drop(s->r, f, key);
    pthread_mutex_unlock(&s->r->mu);
    if (unlink(path) < 0 && errno != ENOENT && errno != ENOTDIR) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot remove %s: %s", path, strerror(e));
        return errno_code(e);
    }
    return 0;
}

static int file_exists(struct kvs_store *ks, const struct kvs_ns *ns, const int64_t *keys,
                       size_t n, uint8_t *present, char *err, size_t errlen)
{
    struct file_store *s = FS(ks);
    struct fns *f;
    char path[PATH_MAX];
    int rc = resolve_ns(s, ns, &f, err, errlen);
    if (rc)
        return rc;
    if (n && (!keys || !present)) {
        errmsg_set(err, errlen, "kvs file: exists without keys");
        return -KVNODE_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        present[i] = 0;
        if (block_path(f, keys[i], path, sizeof(path)))
            continue;
        if (stat(path, &st) == 0) {
            present[i] = S_ISREG(st.st_mode) && (uint64_t)st.st_size > HDR_SIZE;
        } else if (errno != ENOENT && errno != ENOTDIR) {
            int e = errno;
            errmsg_set(err, errlen, "kvs file: cannot stat %s: %s", path, strerror(e));
            return errno_code(e);
        }
    }
    return 0;
}

/* ---- recovery scan ------------------------------------------------------------------ */

struct kvs_scan {
    DIR *d_root, *d_dep, *d_ns, *d_bkt;
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
    ssize_t n = read_full(fd, b, sizeof(b));
    close(fd);
    if (n < 0 || layout_decode(b, (size_t)n, &c->layout, &c->fp) != NULL ||
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
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && read_full(fd, hb, sizeof(hb)) == HDR_SIZE &&
        hdr_decode(hb, &h) == NULL && h.fingerprint == c->fp && h.rank == c->layout.tp_rank &&
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
    lru_note(r, c->f, key, (uint64_t)st.st_size, 0);
    pthread_mutex_unlock(&r->mu);
    struct kvs_found kf = { .layout = c->layout, .fingerprint = c->fp, .key = key,
                            .size = h.size };
    found(arg, &kf);
    return 1;
}

static int file_scan(struct kvs_store *ks, struct kvs_scan **cursor, size_t budget,
                     void (*found)(void *arg, const struct kvs_found *f), void *arg, char *err,
                     size_t errlen)
{
    struct file_store *s = FS(ks);
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
        c->d_root = opendir(r->path);
        if (!c->d_root) {
            int e = errno;
            free(c);
            errmsg_set(err, errlen, "kvs file: cannot read %s: %s", r->path, strerror(e));
            return errno_code(e);
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
            c->f = fns_get(r, c->dep, (uint32_t)rank);
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
            if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof(c->dep))
                continue;
            memcpy(c->dep, de->d_name, strlen(de->d_name) + 1);
            c->d_dep = open_sub(c->d_root, de->d_name);
        }
    }
    return 0;
}

/* ---- extras (file.h) ------------------------------------------------------------------ */

void kvs_file_stats(struct kvs_store *ks, struct kvs_file_stats *out)
{
    struct froot *r = FS(ks)->r;
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    out->blocks = r->count;
    out->bytes = r->used;
    out->capacity_bytes = r->capacity;
    pthread_mutex_unlock(&r->mu);
}

int kvs_file_block_path(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, char *buf,
                        size_t len)
{
    struct fns *f;
    int rc = resolve_ns(FS(ks), ns, &f, NULL, 0);
    if (rc)
        return rc;
    return block_path(f, key, buf, len);
}

const struct kvs_backend kvs_backend_file = {
    .name = "file",
    .open = file_open,
    .health = file_health,
    .put = file_put,
    .get = file_get,
    .del = file_del,
    .exists = file_exists,
    .scan = file_scan,
    .close = file_close,
};
