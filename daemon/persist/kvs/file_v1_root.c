/* kvs/file root: the process-wide state of one root directory, shared by
 * every handle opened on it — its creation (the .lock) and end, the LRU of
 * known block files with their bytes, and the namespace directories. All
 * lru_* and fns_* functions run with the root's mutex held. */
#include "persist/kvs/file_v1.h"
#include "persist/kvs/file_fs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"

/* ---- the LRU and the namespace directories ---------------------------------------- */

static size_t ent_hash(const struct froot *r, const struct fns *f, int64_t key)
{
    return (size_t)(mix64((uint64_t)key ^ ((uint64_t)(uintptr_t)f * 0x9e3779b97f4a7c15ull)) &
                    (r->nbuckets - 1));
}

/* All lru_* and fns_* helpers: r->mu held. */
struct lru_ent *file_lru_find(struct froot *r, const struct fns *f, int64_t key)
{
    for (struct lru_ent *e = r->tab[ent_hash(r, f, key)]; e; e = e->hnext)
        if (e->ns == f && e->key == key)
            return e;
    return NULL;
}

void file_list_unlink(struct lru_ent *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

void file_list_push_front(struct froot *r, struct lru_ent *e)
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
void file_lru_detach(struct froot *r, struct lru_ent *e)
{
    struct lru_ent **pp = &r->tab[ent_hash(r, e->ns, e->key)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    file_list_unlink(e);
    r->used -= e->size;
    r->count--;
}

void file_lru_drop(struct froot *r, const struct fns *f, int64_t key)
{
    struct lru_ent *e = file_lru_find(r, f, key);
    if (e) {
        file_lru_detach(r, e);
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
void file_lru_note(struct froot *r, struct fns *f, int64_t key, uint64_t size, int front)
{
    struct lru_ent *e = file_lru_find(r, f, key);
    if (e) {
        if (front) {
            r->used = r->used - e->size + size;
            e->size = size;
            file_list_unlink(e);
            file_list_push_front(r, e);
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
        file_list_push_front(r, e);
    else
        list_push_back(r, e);
    r->used += size;
    r->count++;
}

struct fns *file_fns_get(struct froot *r, const char *dir, uint32_t rank)
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

/* ---- a root's creation and end ---------------------------------------------------- */

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

void file_root_free(struct froot *r)
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
struct froot *file_root_create(const char *path, char *err, size_t errlen, int *rc)
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
        *rc = kvs_fs_errno_code(e);
        file_root_free(r);
        return NULL;
    }
    if (flock(r->lockfd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: %s is in use by another process (%s is locked: %s)",
                   path, lock, strerror(e));
        *rc = -KVNODE_EIO;
        file_root_free(r);
        return NULL;
    }
    return r;
nomem:
    errmsg_set(err, errlen, "kvs file: out of memory");
    if (r)
        file_root_free(r);
    return NULL;
}
