/* kvs/file: the embedded segment-log backend — open and close (the roots in
 * use by this process), health, put and put_batch, get and get_batch, del,
 * exists, and the extras of file.h. Format and policies: file.h; what the
 * pieces share: file_internal.h. */
#include "persist/kvs/file_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"
#include "persist/kvs/crc32c.h"
#include "persist/kvs/file_fs.h"

static pthread_mutex_t roots_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seg_root *roots;

/* ---- open, close, health ---------------------------------------------------------------- */

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
    if (cfg->direct_io < KVS_DIRECT_AUTO || cfg->direct_io > KVS_DIRECT_OFF) {
        errmsg_set(err, errlen, "kvs file: invalid direct_io setting %d", cfg->direct_io);
        return -KVNODE_EINVAL;
    }
    if (cfg->segment_bytes && cfg->segment_bytes < KVS_FILE_SEGMENT_BYTES_MIN) {
        errmsg_set(err, errlen, "kvs file: segment size %" PRIu64 " is below the minimum of %"
                   PRIu64 " bytes", cfg->segment_bytes, KVS_FILE_SEGMENT_BYTES_MIN);
        return -KVNODE_EINVAL;
    }
    if ((rc = kvs_fs_root(cfg->path, real, err, errlen)) < 0)
        return rc;
    struct file_store *s = calloc(1, sizeof(*s));
    if (!s) {
        errmsg_set(err, errlen, "kvs file: out of memory");
        return -KVNODE_ENOMEM;
    }
    s->w.fd = -1;
    pthread_mutex_lock(&roots_mu);
    struct seg_root *r;
    for (r = roots; r; r = r->next)
        if (strcmp(r->path, real) == 0)
            break;
    if (!r) {
        r = seg_root_create(real, cfg->tenant, cfg->direct_io, err, errlen, &rc);
        if (!r) {
            pthread_mutex_unlock(&roots_mu);
            free(s);
            return rc;
        }
        r->next = roots;
        roots = r;
    }
    r->refs++;
    pthread_mutex_unlock(&roots_mu);

    pthread_mutex_lock(&r->mu);
    r->capacity = cfg->capacity_bytes;
    r->direct_io = cfg->direct_io;
    r->segment_bytes = cfg->segment_bytes ? cfg->segment_bytes : KVS_FILE_SEGMENT_BYTES_DEFAULT;
    /* Capacity drops whole segments: keep several of them under it. */
    if (r->capacity && r->segment_bytes > r->capacity / 8)
        r->segment_bytes = r->capacity / 8 > 4096 ? r->capacity / 8 : 4096;
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
    seg_writer_close(s);
    free(s->w.nss);
    free(s->w.ents);
    free(s->buf);
    pthread_mutex_lock(&roots_mu);
    if (--s->r->refs == 0) {
        struct seg_root **pp = &roots;
        while (*pp != s->r)
            pp = &(*pp)->next;
        *pp = s->r->next;
        seg_root_free(s->r);
    }
    pthread_mutex_unlock(&roots_mu);
    free(s);
}

static int file_health(struct kvs_store *ks, char *err, size_t errlen)
{
    return kvs_fs_dir_health(FS(ks)->r->path, err, errlen);
}

/* ---- checks ---------------------------------------------------------------------------- */

static int check_ns(const struct kvs_ns *ns, char *err, size_t errlen)
{
    if (!ns || !ns->layout) {
        errmsg_set(err, errlen, "kvs file: call without a namespace");
        return -KVNODE_EINVAL;
    }
    return 0;
}

static int check_item(const struct kvs_item *it, bool write, char *err, size_t errlen)
{
    int rc = check_ns(it->ns, err, errlen);
    if (rc)
        return rc;
    if ((write ? !it->src : !it->dst) || it->len == 0 || it->len != it->ns->layout->block_bytes) {
        errmsg_set(err, errlen, "kvs file: block of %zu bytes, layout says %" PRIu64, it->len,
                   it->ns->layout->block_bytes);
        return -KVNODE_EINVAL;
    }
    return 0;
}

/* The namespace of a call, if this root has seen it. */
static struct seg_ns *find_ns(struct seg_root *r, const struct kvs_ns *ns)
{
    for (struct seg_ns *n = r->nss; n; n = n->next)
        if (n->fingerprint == ns->fingerprint && n->rank == ns->layout->tp_rank)
            return n;
    return NULL;
}

/* ---- put ----------------------------------------------------------------------------------- */

static int file_put_batch(struct kvs_store *ks, struct kvs_item *items, size_t n, char *err,
                          size_t errlen)
{
    struct file_store *s = FS(ks);
    struct kvs_item *ok = malloc((n ? n : 1) * sizeof(*ok));
    uint8_t *kinds = malloc(n ? n : 1);
    size_t *back = malloc((n ? n : 1) * sizeof(*back));
    size_t m = 0;
    int rc;

    if (!ok || !kinds || !back) {
        free(ok), free(kinds), free(back);
        for (size_t i = 0; i < n; i++)
            items[i].rc = -KVNODE_ENOMEM;
        errmsg_set(err, errlen, "kvs file: out of memory");
        return -KVNODE_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        if ((items[i].rc = check_item(&items[i], true, err, errlen)) != 0)
            continue;
        pthread_mutex_lock(&s->r->mu);
        bool too_big = s->r->capacity && seg_rec_len(items[i].len) > s->r->capacity;
        pthread_mutex_unlock(&s->r->mu);
        if (too_big) {
            errmsg_set(err, errlen, "kvs file: block of %zu bytes exceeds the capacity of %s",
                       items[i].len, s->r->path);
            items[i].rc = -KVNODE_ENOSPC;
            continue;
        }
        ok[m] = items[i];
        kinds[m] = KD_BLOCK;
        back[m++] = i;
    }
    rc = m ? seg_append(s, ok, kinds, m, err, errlen) : 0;
    bool any = false;
    const struct kvs_item *failed = NULL;
    for (size_t k = 0; k < m; k++) {
        items[back[k]].rc = ok[k].rc;
        any = any || ok[k].rc == 0;
        if (ok[k].rc < 0 && !failed)
            failed = &ok[k];
    }
    if (failed && err && errlen) {
        /* Which namespace's writes failed, for the operator. */
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        errmsg_set(err, errlen, "%s (deployment %s, tp_rank %u)", why,
                   failed->ns->deployment_id ? failed->ns->deployment_id : "?",
                   failed->ns->layout->tp_rank);
    }
    free(ok), free(kinds), free(back);
    /* Items carry their own results; the call failed as a whole only when
     * nothing reached the store. */
    if (any || m == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (items[i].rc == 0)
            items[i].rc = rc;
    return rc;
}

static int file_put(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, uint64_t check,
                    const void *data, size_t len, char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .check = check, .src = data, .len = len };
    int rc = check_item(&it, true, err, errlen);
    if (rc)
        return rc;
    rc = file_put_batch(ks, &it, 1, err, errlen);
    return rc < 0 ? rc : it.rc;
}

/* ---- get ------------------------------------------------------------------------------------ */

static int get_one(struct file_store *s, struct kvs_item *it, char *err, size_t errlen)
{
    struct seg_root *r = s->r;
    int rc = check_item(it, false, err, errlen);
    if (rc)
        return rc;
    pthread_mutex_lock(&r->mu);
    struct seg_ns *ns = find_ns(r, it->ns);
    struct kd_ent *e = ns ? seg_kd_find(r, ns, it->key) : NULL;
    if (e && (e->kind != KD_BLOCK || e->seg->dropped)) {
        if (e->seg->dropped || r->recovered)
            seg_kd_remove(r, e);
        e = NULL;
    }
    if (!e) {
        pthread_mutex_unlock(&r->mu);
        return KVS_MISS;
    }
    if (e->check != it->check) {   /* another prefix's block: kept */
        pthread_mutex_unlock(&r->mu);
        return KVS_MISMATCH;
    }
    struct seg *sg = e->seg;
    uint64_t off = e->off, size = e->size, seq = e->seq;
    uint32_t crc = e->crc;
    sg->refs++;
    int fd = sg->rfd;
    pthread_mutex_unlock(&r->mu);

    const char *why = NULL;
    if (size != it->len) {
        why = "stored payload size differs from the block size";
    } else {
        if (fd < 0) {
            char path[PATH_MAX];
            seg_path(r, sg->id, false, path, sizeof path);
            int nfd = open(path, O_RDONLY | O_CLOEXEC);
            int open_errno = errno;
            pthread_mutex_lock(&r->mu);
            if (nfd >= 0 && sg->rfd < 0)
                sg->rfd = nfd;
            else if (nfd >= 0)
                close(nfd);
            fd = sg->rfd;
            /* Dropped (capacity) since the lookup and already unlinked: the
             * block left the store, a miss like any evicted one. */
            bool gone = fd < 0 && open_errno == ENOENT && sg->dropped;
            if (gone)
                seg_unref(r, sg);
            pthread_mutex_unlock(&r->mu);
            if (gone)
                return KVS_MISS;
        }
        if (fd < 0) {
            why = "segment file cannot be opened";
        } else {
            size_t got = 0;
            while (got < size) {
                ssize_t k = pread(fd, (uint8_t *)it->dst + got, size - got,
                                  (off_t)(off + SEG_REC_HDR + got));
                if (k < 0 && errno == EINTR)
                    continue;
                if (k < 0) {
                    int e2 = errno;
                    pthread_mutex_lock(&r->mu);
                    seg_unref(r, sg);
                    pthread_mutex_unlock(&r->mu);
                    errmsg_set(err, errlen, "kvs file: read of segment %016" PRIx64 " in %s "
                               "failed: %s", sg->id, r->path, strerror(e2));
                    return kvs_fs_errno_code(e2);
                }
                if (k == 0)
                    break;
                got += (size_t)k;
            }
            if (got != size)
                why = "short payload (segment cut)";
            else if (crc32c(0, it->dst, size) != crc)
                why = "payload checksum mismatch";
        }
    }
    pthread_mutex_lock(&r->mu);
    seg_unref(r, sg);
    if (why) {
        struct kd_ent *cur = seg_kd_find(r, ns, it->key);
        if (cur && cur->seq == seq)
            seg_kd_remove(r, cur);
        r->st.corrupt++;
    }
    pthread_mutex_unlock(&r->mu);
    if (why) {
        char path[PATH_MAX];
        seg_drain_unlinks(r);
        seg_path(r, sg->id, false, path, sizeof path);
        errmsg_set(err, errlen, "kvs file: key %" PRId64 " in %s at offset %" PRIu64 ": %s "
                   "(dropped from the index)", it->key, path, off, why);
        return KVS_CORRUPT;
    }
    return 0;
}

static int file_get(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, uint64_t check,
                    void *data, size_t len, char *err, size_t errlen)
{
    struct kvs_item it = { .ns = ns, .key = key, .check = check, .dst = data, .len = len };
    return get_one(FS(ks), &it, err, errlen);
}

static int file_get_batch(struct kvs_store *ks, struct kvs_item *items, size_t n, char *err,
                          size_t errlen)
{
    for (size_t i = 0; i < n; i++)
        items[i].rc = get_one(FS(ks), &items[i], err, errlen);
    return 0;
}

/* ---- del, exists ------------------------------------------------------------------------------ */

static int file_del(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, uint64_t check,
                    char *err, size_t errlen)
{
    struct file_store *s = FS(ks);
    int rc = check_ns(ns, err, errlen);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->r->mu);
    struct seg_ns *sn = find_ns(s->r, ns);
    struct kd_ent *e = sn ? seg_kd_find(s->r, sn, key) : NULL;
    /* An older copy may still be on disk; another word's block is kept. */
    bool needed = (e || !s->r->recovered) && !(e && e->kind == KD_BLOCK && e->check != check);
    pthread_mutex_unlock(&s->r->mu);
    if (!needed)
        return 0;
    struct kvs_item it = { .ns = ns, .key = key, .check = check };
    uint8_t kind = KD_TOMB;
    rc = seg_append(s, &it, &kind, 1, err, errlen);
    return rc < 0 ? rc : it.rc;
}

static int file_exists(struct kvs_store *ks, const struct kvs_ns *ns, const int64_t *keys,
                       const uint64_t *checks, size_t n, uint8_t *present, char *err,
                       size_t errlen)
{
    struct seg_root *r = FS(ks)->r;
    int rc = check_ns(ns, err, errlen);
    if (rc)
        return rc;
    if (n && (!keys || !present)) {
        errmsg_set(err, errlen, "kvs file: exists without keys");
        return -KVNODE_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&r->mu);
        struct seg_ns *sn = find_ns(r, ns);
        struct kd_ent *e = sn ? seg_kd_find(r, sn, keys[i]) : NULL;
        bool held = e && e->kind == KD_BLOCK && !e->seg->dropped;
        present[i] = !held ? KVS_ABSENT
                     : e->check == (checks ? checks[i] : 0) ? KVS_PRESENT : KVS_PRESENT_OTHER_WORD;
        pthread_mutex_unlock(&r->mu);
    }
    return 0;
}

/* ---- extras (file.h) ---------------------------------------------------------------------------- */

void kvs_file_stats(struct kvs_store *ks, struct kvs_file_stats *out)
{
    struct seg_root *r = FS(ks)->r;
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    out->capacity_bytes = r->capacity;
    out->direct_io = r->direct_ok && r->direct_io != KVS_DIRECT_OFF;
    pthread_mutex_unlock(&r->mu);
}

static int locate(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, bool hint,
                  char *path, size_t len, uint64_t *offset)
{
    struct seg_root *r = FS(ks)->r;
    pthread_mutex_lock(&r->mu);
    struct seg_ns *sn = find_ns(r, ns);
    struct kd_ent *e = sn ? seg_kd_find(r, sn, key) : NULL;
    if (!e || e->kind != KD_BLOCK || e->seg->dropped) {
        pthread_mutex_unlock(&r->mu);
        return KVS_MISS;
    }
    uint64_t id = e->seg->id;
    if (offset)
        *offset = e->off;
    pthread_mutex_unlock(&r->mu);
    char p[PATH_MAX];
    seg_path(r, id, hint, p, sizeof p);
    if (strlen(p) >= len)
        return -KVNODE_EINVAL;
    memcpy(path, p, strlen(p) + 1);
    return 0;
}

int kvs_file_locate(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, char *path,
                    size_t len, uint64_t *offset)
{
    return locate(ks, ns, key, false, path, len, offset);
}

int kvs_file_locate_hint(struct kvs_store *ks, const struct kvs_ns *ns, int64_t key, char *path,
                         size_t len)
{
    return locate(ks, ns, key, true, path, len, NULL);
}

const struct kvs_backend kvs_backend_file = {
    .name = "file",
    .open = file_open,
    .health = file_health,
    .put = file_put,
    .get = file_get,
    .del = file_del,
    .exists = file_exists,
    .scan = seg_scan,
    .close = file_close,
    .put_batch = file_put_batch,
    .get_batch = file_get_batch,
};
