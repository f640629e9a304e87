/* kvs/file log: appending — a handle's open segment, batches built in an
 * aligned buffer and written as one large pwrite (O_DIRECT where the root
 * takes it), fsync per policy, the keydir updated after the write, segment
 * rotation and hint files. Worker threads; r->mu only for bookkeeping. */
#include "persist/kvs/file_internal.h"
#include "core/le.h"
#include "persist/kvs/file_fs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"
#include "persist/kvs/crc32c.h"

#define SEG_BUF_BYTES ((size_t)4 << 20)   /* one batch write at most (unless a block is larger) */

struct pending {                   /* a record in the buffer, applied after the write */
    size_t item;                   /* SIZE_MAX: a layout record */
    struct seg_ns *ns;
    uint8_t kind;
    uint64_t off, size, seq;
    uint32_t crc;
};

static int write_full(int fd, const uint8_t *p, size_t len, uint64_t off, bool direct)
{
    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (direct && (size_t)n < len) {
            /* The file could not grow by all of it (disk full, RLIMIT_FSIZE):
             * the rest would be unaligned for O_DIRECT; write_seg() asks the
             * page cache for the real cause. */
            errno = EINVAL;
            return -1;
        }
        if (n == 0) {
            errno = EIO;
            return -1;
        }
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static int buf_reserve(struct file_store *s, size_t need)
{
    if (s->buflen + need <= s->bufcap)
        return 0;
    size_t cap = s->bufcap ? s->bufcap : SEG_BUF_BYTES;
    while (cap < s->buflen + need)
        cap *= 2;
    void *b = NULL;
    if (posix_memalign(&b, SEG_DIO_ALIGN, cap) != 0)
        return -KVNODE_ENOMEM;
    if (s->buflen)
        memcpy(b, s->buf, s->buflen);
    free(s->buf);
    s->buf = b;
    s->bufcap = cap;
    return 0;
}

static int hint_note(struct seg_writer *w, const struct pending *p)
{
    if (w->nents == w->capents) {
        size_t cap = w->capents ? w->capents * 2 : 1024;
        struct seg_hint_ent *v = realloc(w->ents, cap * sizeof(*v));
        if (!v)
            return -1;
        w->ents = v;
        w->capents = cap;
    }
    w->ents[w->nents++] = (struct seg_hint_ent){ .type = p->kind == KD_TOMB ? SEG_REC_TOMB
                                                         : SEG_REC_BLOCK,
                                                 .rank = p->ns->rank, .crc = p->crc,
                                                 .fingerprint = p->ns->fingerprint,
                                                 .size = p->size, .seq = p->seq, .off = p->off,
                                                 .key = 0, .check = 0 };
    return 0;
}

/* ---- hint files and segment ends ---------------------------------------------------------- */

void seg_hint_write(struct seg_root *r, uint64_t id, uint64_t seg_len, struct seg_ns *const *nss,
                    size_t nnss, const struct seg_hint_ent *ents, size_t nents, bool sync)
{
    size_t len = SEG_HINT_HDR + nnss * SEG_LAYOUT_SIZE + nents * SEG_HINT_ENT + 4;
    uint8_t *b, *p;
    char tmp[PATH_MAX + 8], fin[PATH_MAX];
    /* Hint files hold version-1 layouts: a segment naming a layout with a
     * revision has none, and recovery reads the segment. */
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < nnss; i++) {
        if (nss[i]->layout.revision[0]) {
            pthread_mutex_unlock(&r->mu);
            return;
        }
    }
    pthread_mutex_unlock(&r->mu);
    b = malloc(len);
    if (!b)
        return;                    /* no hint: recovery reads the segment */
    seg_hint_hdr_encode(b, id, seg_len, (uint32_t)nnss, (uint32_t)nents);
    p = b + SEG_HINT_HDR;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < nnss; i++, p += SEG_LAYOUT_SIZE)
        seg_layout_encode(p, &nss[i]->layout, nss[i]->fingerprint);
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < nents; i++, p += SEG_HINT_ENT)
        seg_hint_ent_encode(p, &ents[i]);
    le_put32(p, crc32c(0, b, (size_t)(p - b)));
    seg_path(r, id, true, fin, sizeof fin);
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        bool ok = write_full(fd, b, len, 0, false) == 0 && (!sync || fdatasync(fd) == 0);
        close(fd);
        if (!ok || rename(tmp, fin) < 0)
            unlink(tmp);
    }
    free(b);
}

void seg_writer_close(struct file_store *s)
{
    struct seg_writer *w = &s->w;
    if (!w->seg)
        return;
    if (w->seg->len > 0)
        seg_hint_write(s->r, w->seg->id, w->seg->len, w->nss, w->nnss, w->ents, w->nents,
                       s->fsync_policy != KVS_FSYNC_NEVER);
    close(w->fd);
    pthread_mutex_lock(&s->r->mu);
    w->seg->open = false;
    seg_reclaim_if_dead(s->r, w->seg);
    pthread_mutex_unlock(&s->r->mu);
    seg_drain_unlinks(s->r);
    w->seg = NULL;
    w->fd = -1;
    w->nnss = 0;
    w->nents = 0;
}

static int writer_open(struct file_store *s, char *err, size_t errlen)
{
    struct seg_root *r = s->r;
    struct seg_writer *w = &s->w;
    char path[PATH_MAX];

    pthread_mutex_lock(&r->mu);
    uint64_t id = r->next_id++;
    struct seg *sg = seg_add(r, id);
    if (sg)
        sg->open = true;
    bool direct = r->direct_ok && r->direct_io != KVS_DIRECT_OFF;
    pthread_mutex_unlock(&r->mu);
    if (!sg) {
        errmsg_set(err, errlen, "kvs file: out of memory");
        return -KVNODE_ENOMEM;
    }
    seg_path(r, id, false, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct && errno == EINVAL) {
        direct = false;
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        int e = errno;
        pthread_mutex_lock(&r->mu);
        sg->open = false;
        seg_mark_dropped(r, sg);
        pthread_mutex_unlock(&r->mu);
        seg_drain_unlinks(r);
        errmsg_set(err, errlen, "kvs file: cannot create segment %s: %s", path, strerror(e));
        return kvs_fs_errno_code(e);
    }
    if (s->fsync_policy == KVS_FSYNC_ALWAYS) {
        int dfd = open(r->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    w->seg = sg;
    w->fd = fd;
    w->direct = direct;
    w->nnss = 0;
    w->nents = 0;
    s->buflen = 0;
    s->buf_off = 0;
    return 0;
}

/* ---- a batch ------------------------------------------------------------------------------- */

struct batch {
    struct pending *v;
    size_t n, cap;
};

static int batch_add(struct batch *b, struct pending p)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        struct pending *v = realloc(b->v, cap * sizeof(*v));
        if (!v)
            return -KVNODE_ENOMEM;
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = p;
    return 0;
}

static bool writer_has_ns(const struct seg_writer *w, const struct seg_ns *ns)
{
    for (size_t i = 0; i < w->nnss; i++)
        if (w->nss[i] == ns)
            return true;
    return false;
}

static int writer_note_ns(struct seg_writer *w, struct seg_ns *ns)
{
    if (w->nnss == w->capnss) {
        size_t cap = w->capnss ? w->capnss * 2 : 8;
        struct seg_ns **v = realloc(w->nss, cap * sizeof(*v));
        if (!v)
            return -KVNODE_ENOMEM;
        w->nss = v;
        w->capnss = cap;
    }
    w->nss[w->nnss++] = ns;
    return 0;
}

/* The buffer to the open segment. A direct write the kernel refuses
 * (EINVAL, or a short write: e.g. cut by RLIMIT_FSIZE or a full disk) is
 * tried once more through the page cache, which reports the real cause
 * (ENOSPC, EFBIG) or succeeds. */
static int write_seg(struct file_store *s)
{
    struct seg_writer *w = &s->w;
    if (write_full(w->fd, s->buf, s->buflen, s->buf_off, w->direct) == 0)
        return 0;
    if (!w->direct || errno != EINVAL)
        return -1;
    char path[PATH_MAX];
    seg_path(s->r, w->seg->id, false, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = write_full(fd, s->buf, s->buflen, s->buf_off, false);
    int e = errno;
    if (rc == 0 && s->fsync_policy != KVS_FSYNC_NEVER)
        rc = fdatasync(fd);
    close(fd);
    errno = e;
    return rc;
}

/* Write the buffer, then make its records visible. Every item of the batch
 * gets rc (0 or the failure). */
static int flush(struct file_store *s, struct batch *b, struct kvs_item *items, char *err,
                 size_t errlen)
{
    struct seg_root *r = s->r;
    struct seg_writer *w = &s->w;
    int rc = 0;

    if (b->n == 0)
        return 0;
    if (w->direct && (s->buflen % SEG_DIO_ALIGN)) {
        size_t pad = SEG_DIO_ALIGN - s->buflen % SEG_DIO_ALIGN;   /* a multiple of 64 */
        struct seg_rec h = { .type = SEG_REC_PAD, .size = pad - SEG_REC_HDR };
        memset(s->buf + s->buflen, 0, pad);
        seg_rec_encode(s->buf + s->buflen, &h);
        s->buflen += pad;
    }
    /* Room is taken under the same lock that found it, so writers racing
     * each other cannot all pass the capacity; a failed write gives it back. */
    pthread_mutex_lock(&r->mu);
    bool room = seg_make_room(r, s->buflen);
    if (room)
        r->st.disk_bytes += s->buflen;
    pthread_mutex_unlock(&r->mu);
    seg_drain_unlinks(r);
    if (!room) {
        errmsg_set(err, errlen, "kvs file: %zu bytes more would pass the capacity of %s (%" PRIu64
                   " bytes) and no closed segment is left to drop; raise persist.capacity or "
                   "lower persist.segment_bytes", s->buflen, r->path, r->capacity);
        rc = -KVNODE_ENOSPC;
    } else if (write_seg(s) < 0 ||
               (s->fsync_policy != KVS_FSYNC_NEVER && fdatasync(w->fd) < 0)) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: write of %zu bytes to segment %016" PRIx64 " in %s "
                   "failed: %s", s->buflen, w->seg->id, r->path, strerror(e));
        rc = kvs_fs_errno_code(e);
    }
    if (rc == 0) {
        pthread_mutex_lock(&r->mu);
        w->seg->len = s->buf_off + s->buflen;
        pthread_mutex_unlock(&r->mu);
        for (size_t i = 0; i < b->n; i++) {
            struct pending *p = &b->v[i];
            if (p->item == SIZE_MAX)
                continue;
            pthread_mutex_lock(&r->mu);
            if (p->kind == KD_TOMB)
                w->seg->tombs++;
            seg_kd_apply(r, p->ns, items[p->item].key, items[p->item].check, p->kind, w->seg,
                         p->off, p->size, p->crc, p->seq);
            pthread_mutex_unlock(&r->mu);
            if (hint_note(w, p) == 0) {
                w->ents[w->nents - 1].key = items[p->item].key;
                w->ents[w->nents - 1].check = items[p->item].check;
            }
            items[p->item].rc = 0;
        }
        seg_drain_unlinks(r);
        s->buf_off += s->buflen;
    } else {
        if (room) {
            pthread_mutex_lock(&r->mu);
            r->st.disk_bytes -= s->buflen;
            pthread_mutex_unlock(&r->mu);
        }
        for (size_t i = 0; i < b->n; i++)
            if (b->v[i].item != SIZE_MAX)
                items[b->v[i].item].rc = rc;
        /* The segment's tail may hold part of this write: the next one goes
         * over it; a restart cuts what stays (torn tail). */
    }
    s->buflen = 0;
    b->n = 0;
    return rc;
}

/* Whether a tombstone of it must go to a segment newer than the writer's:
 * the block it hides is in a newer one (another handle's). A segment dead
 * but for tombstones is reclaimed once it is the oldest left
 * (seg_reclaim_if_dead), which is safe only while every tombstone is newer,
 * by segment, than what it hides. */
static bool tomb_needs_newer_segment(struct file_store *s, const struct kvs_item *it)
{
    struct seg_root *r = s->r;
    bool newer = false;
    pthread_mutex_lock(&r->mu);
    struct seg_ns *ns = seg_ns_get(r, it->ns->fingerprint, it->ns->layout->tp_rank);
    struct kd_ent *e = ns ? seg_kd_find(r, ns, it->key) : NULL;
    if (e && e->kind == KD_BLOCK && s->w.seg && e->seg->id > s->w.seg->id)
        newer = true;
    pthread_mutex_unlock(&r->mu);
    return newer;
}

int seg_append(struct file_store *s, struct kvs_item *items, const uint8_t *kinds, size_t n,
               char *err, size_t errlen)
{
    struct seg_root *r = s->r;
    struct seg_writer *w = &s->w;
    struct batch b = { 0 };
    int rc = 0, first_rc = 0;

    pthread_mutex_lock(&r->mu);
    uint64_t seq0 = (r->epoch << SEG_EPOCH_SHIFT) | (r->counter + 1);
    r->counter += n;
    uint64_t seg_bytes = r->segment_bytes;
    pthread_mutex_unlock(&r->mu);

    for (size_t i = 0; i < n; i++) {
        struct kvs_item *it = &items[i];
        const struct ns_layout *l = it->ns->layout;
        uint64_t psize = kinds[i] == KD_TOMB ? 0 : it->len;
        uint64_t need = seg_rec_len(psize) + seg_rec_len(seg_layout_size(l));

        if (!w->seg && (rc = writer_open(s, err, errlen)) < 0)
            goto fail_rest;
        if ((s->buf_off + s->buflen > 0 && s->buf_off + s->buflen + need > seg_bytes) ||
            (kinds[i] == KD_TOMB && tomb_needs_newer_segment(s, it))) {
            if ((rc = flush(s, &b, items, err, errlen)) < 0 && !first_rc)
                first_rc = rc;
            seg_writer_close(s);
            if ((rc = writer_open(s, err, errlen)) < 0)
                goto fail_rest;
        }
        if (s->buflen + need + SEG_DIO_ALIGN > SEG_BUF_BYTES && s->buflen > 0 &&
            (rc = flush(s, &b, items, err, errlen)) < 0 && !first_rc)
            first_rc = rc;
        if ((rc = buf_reserve(s, need + SEG_DIO_ALIGN)) < 0) {
            errmsg_set(err, errlen, "kvs file: out of memory for a batch buffer");
            goto fail_rest;
        }
        pthread_mutex_lock(&r->mu);
        struct seg_ns *ns = seg_ns_get(r, it->ns->fingerprint, l->tp_rank);
        if (ns && !ns->layout_known) {
            ns->layout = *l;
            ns->layout_known = true;
        }
        pthread_mutex_unlock(&r->mu);
        if (!ns) {
            errmsg_set(err, errlen, "kvs file: out of memory");
            rc = -KVNODE_ENOMEM;
            goto fail_rest;
        }
        if (!writer_has_ns(w, ns)) {
            if (writer_note_ns(w, ns) < 0) {
                rc = -KVNODE_ENOMEM;
                goto fail_rest;
            }
            uint8_t *p = s->buf + s->buflen;
            size_t lsize = seg_layout_size(l);
            struct seg_rec h = { .type = SEG_REC_LAYOUT, .fingerprint = ns->fingerprint,
                                 .rank = ns->rank, .size = lsize };
            memset(p, 0, seg_rec_len(lsize));
            seg_layout_encode(p + SEG_REC_HDR, l, ns->fingerprint);
            h.crc = crc32c(0, p + SEG_REC_HDR, lsize);
            seg_rec_encode(p, &h);
            s->buflen += seg_rec_len(lsize);
        }
        uint8_t *p = s->buf + s->buflen;
        struct seg_rec h = { .type = kinds[i] == KD_TOMB ? SEG_REC_TOMB : SEG_REC_BLOCK,
                             .fingerprint = ns->fingerprint, .rank = ns->rank, .key = it->key,
                             .check = it->check, .size = psize, .seq = seq0 + i,
                             .crc = psize ? crc32c(0, it->src, psize) : 0 };
        uint64_t rl = seg_rec_len(psize);
        if (psize) {
            memcpy(p + SEG_REC_HDR, it->src, psize);
            memset(p + SEG_REC_HDR + psize, 0, rl - SEG_REC_HDR - psize);
        }
        seg_rec_encode(p, &h);
        rc = batch_add(&b, (struct pending){ .item = i, .ns = ns, .kind = kinds[i],
                                             .off = s->buf_off + s->buflen, .size = psize,
                                             .seq = h.seq, .crc = h.crc });
        if (rc < 0)
            goto fail_rest;
        s->buflen += rl;
        continue;
fail_rest:
        for (size_t j = i; j < n; j++)
            items[j].rc = rc;
        n = i;
        break;
    }
    if ((rc = flush(s, &b, items, err, errlen)) < 0 && !first_rc)
        first_rc = rc;
    free(b.v);
    return first_rc;
}
