/* kvs/file recovery: the scan callback — loading every segment found at
 * open (its hint file, else its records, a torn tail cut), then reporting
 * the keydir in budgets.
 * On the persist-scan thread; writes and reads go on meanwhile. */
#include "persist/kvs/file_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/le.h"
#include "core/errmsg.h"
#include "core/log.h"
#include "kvnode.h"
#include "persist/kvs/crc32c.h"

enum { PH_LOAD, PH_REPORT };

struct kvs_scan {
    int phase;
    uint64_t cursor;               /* report: reverse-binary bucket cursor */
    bool cursor_started;
};

/* ---- loading a segment from its hint ---------------------------------------------------------- */

static void count(struct seg_root *r, uint64_t *ctr, uint64_t by)
{
    pthread_mutex_lock(&r->mu);
    *ctr += by;
    pthread_mutex_unlock(&r->mu);
}

static void apply(struct seg_root *r, struct seg_ns *ns, const struct seg_hint_ent *e,
                  struct seg *sg)
{
    pthread_mutex_lock(&r->mu);
    if (e->type == SEG_REC_TOMB)
        sg->tombs++;
    seg_kd_apply(r, ns, e->key, e->check, e->type == SEG_REC_TOMB ? KD_TOMB : KD_BLOCK, sg,
                 e->off, e->size, e->crc, e->seq);
    pthread_mutex_unlock(&r->mu);
}

/* The namespace of a record carrying fingerprint fp (disk[i]: what the
 * records of v[i] carry). */
static struct seg_ns *ns_of(struct seg_ns **v, const uint64_t *disk, size_t n, uint64_t fp, uint32_t rank)
{
    for (size_t i = 0; i < n; i++)
        if (disk[i] == fp && v[i]->rank == rank)
            return v[i];
    return NULL;
}

/* A namespace whose layout another segment (or a write) made known. */
static struct seg_ns *ns_known(struct seg_root *r, uint64_t fp, uint32_t rank)
{
    struct seg_ns *found = NULL;
    pthread_mutex_lock(&r->mu);
    for (struct seg_ns *n = r->nss; n && !found; n = n->next)
        if (n->fingerprint == fp && n->rank == rank && n->layout_known)
            found = n;
    pthread_mutex_unlock(&r->mu);
    return found;
}

/* The namespace of a layout record, under l's current identity: records a
 * version before issue 27 wrote for a layout with '|' carry its old
 * fingerprint (seg_layout_decode) and are indexed as l's all the same, so
 * the keydir, hints written from now on and new records use the current one. */
static struct seg_ns *ns_learn(struct seg_root *r, const struct ns_layout *l)
{
    uint64_t fp = ns_fingerprint_tenant(l, r->tenant);
    pthread_mutex_lock(&r->mu);
    struct seg_ns *ns = seg_ns_get(r, fp, l->tp_rank);
    if (ns && !ns->layout_known) {
        ns->layout = *l;
        ns->layout_known = true;
    }
    pthread_mutex_unlock(&r->mu);
    return ns;
}

/* From the hint file: the number of entries, or -1 (missing or bad). */
static long load_hint(struct seg_root *r, struct seg *sg)
{
    char p[PATH_MAX];
    struct stat st;
    seg_path(r, sg->id, true, p, sizeof p);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) < 0 || st.st_size < (off_t)(SEG_HINT_HDR + 4)) {
        close(fd);
        return -1;
    }
    size_t len = (size_t)st.st_size;
    uint8_t *b = malloc(len);
    ssize_t got = b ? pread(fd, b, len, 0) : -1;
    close(fd);
    uint64_t id, seg_len;
    uint32_t nl, ne;
    unsigned version = 0;
    if (got != (ssize_t)len || seg_hint_hdr_decode(b, &id, &seg_len, &nl, &ne, &version) != NULL ||
        id != sg->id || seg_len != sg->len ||
        (uint64_t)SEG_HINT_HDR + (uint64_t)nl * SEG_LAYOUT_SIZE +
            (uint64_t)ne * seg_hint_ent_size(version) + 4 != len ||
        le_get32(b + len - 4) != crc32c(0, b, len - 4) || nl > 4096) {
        free(b);
        return -1;
    }
    struct seg_ns *nss[4096];
    uint64_t disk[4096];
    const uint8_t *q = b + SEG_HINT_HDR;
    for (uint32_t i = 0; i < nl; i++, q += SEG_LAYOUT_SIZE) {
        struct ns_layout l;
        if (seg_layout_decode(q, SEG_LAYOUT_SIZE, r->tenant, &l, &disk[i]) != NULL ||
            !(nss[i] = ns_learn(r, &l))) {
            free(b);
            return -1;
        }
    }
    for (uint32_t i = 0; i < ne; i++, q += seg_hint_ent_size(version)) {
        struct seg_hint_ent e;
        seg_hint_ent_decode(q, version, &e);
        struct seg_ns *ns = ns_of(nss, disk, nl, e.fingerprint, e.rank);
        if (!ns || (e.type != SEG_REC_BLOCK && e.type != SEG_REC_TOMB) ||
            e.off + seg_rec_len(e.size) > seg_len)
            continue;              /* cannot be: the CRC held */
        apply(r, ns, &e, sg);
    }
    free(b);
    return (long)ne;
}

/* ---- resynchronising after a bad header -------------------------------------------------- */

/* Payload bytes one segment's resynchronisation may check, beyond which the
 * rest of the segment is left unread (not cut): bounds a segment crafted to
 * make the scan check the same bytes again and again. */
#define RESYNC_BUDGET(len) (2 * (len) + (UINT64_C(64) << 20))

/* A walk over one segment's records. */
struct walk {
    struct seg_root *r;
    const uint8_t *m;
    uint64_t len;
    uint64_t check_left;           /* RESYNC_BUDGET, spent by whole_record */
    struct seg_ns *nss[256];       /* namespaces named by its layout records */
    uint64_t disk[256];            /* the fingerprint the records of nss[i] carry */
    size_t nnss;
    uint64_t skipped, skipped_bytes;   /* bad records jumped over */
    bool gave_up;                  /* the budget ran out */
};

static void walk_learn(struct walk *w, const uint8_t *payload, uint64_t size)
{
    struct ns_layout l;
    uint64_t fp;
    struct seg_ns *ns;
    if (seg_layout_decode(payload, size, w->r->tenant, &l, &fp) == NULL &&
        (ns = ns_learn(w->r, &l)) && !ns_of(w->nss, w->disk, w->nnss, fp, l.tp_rank) &&
        w->nnss < 256) {
        w->disk[w->nnss] = fp;
        w->nss[w->nnss++] = ns;
    }
}

/* Whether a whole record starts at pos: a good header, its length within
 * the segment, and its payload right (block: the CRC; layout: it decodes,
 * its own CRC and fingerprint, as the header's namespace; pad: zeros; a
 * tombstone has none). What a resynchronisation may land on: a header
 * alone could be bytes inside another record's payload. */
static bool whole_record(struct walk *w, uint64_t pos)
{
    struct seg_rec h;
    if (pos + SEG_REC_HDR > w->len || seg_rec_decode(w->m + pos, &h) != NULL ||
        seg_rec_len(h.size) > w->len - pos)
        return false;
    if (h.type == SEG_REC_TOMB)
        return true;
    if (h.size > w->check_left) {
        w->gave_up = true;
        return false;
    }
    w->check_left -= h.size;
    const uint8_t *p = w->m + pos + SEG_REC_HDR;
    if (h.type == SEG_REC_BLOCK)
        return crc32c(0, p, h.size) == h.crc;
    if (h.type == SEG_REC_LAYOUT) {
        struct ns_layout l;
        uint64_t fp;
        return seg_layout_decode(p, h.size, w->r->tenant, &l, &fp) == NULL &&
               fp == h.fingerprint && l.tp_rank == h.rank;
    }
    for (uint64_t i = 0; i < h.size; i++)
        if (p[i])
            return false;
    return true;
}

/* The header at pos is bad: where the next whole record starts, or len
 * when none does (the rest is a torn tail). The bad header's own length
 * is tried first (a byte flipped anywhere but in the size): taken when a
 * whole record follows there, so the bad record's payload is never read
 * as records. Else the scan goes on in steps of the record alignment. A
 * layout record's payload checks itself (CRC, and a fingerprint that must
 * match the layout and the tenant): learned even under a bad header, so
 * the blocks after it keep their namespace. Each byte is stepped over once
 * per bad header and a jump only goes forward: linear in the segment.
 * What the scan cannot rule out: a block crafted to hold whole records,
 * whose own header is bad in its size too (or never reached the disk),
 * is read as those records. They carry only bytes this root's tenant
 * wrote, checksums and all, and name only its namespaces (a layout checks
 * the tenant): no tenant reaches another's keys this way. */
static uint64_t resync(struct walk *w, uint64_t pos)
{
    const uint8_t *m = w->m;
    uint64_t len = w->len;
    if (pos + SEG_REC_HDR + SEG_LAYOUT_SIZE <= len)
        walk_learn(w, m + pos + SEG_REC_HDR, SEG_LAYOUT_SIZE);
    if (pos + SEG_REC_HDR + SEG_LAYOUT_SIZE_V2 <= len)
        walk_learn(w, m + pos + SEG_REC_HDR, SEG_LAYOUT_SIZE_V2);
    uint64_t size = le_get64(m + pos + 24);
    if (size <= len - pos) {
        uint64_t end = pos + seg_rec_len(size);
        if (end == len || (end < len && whole_record(w, end)))
            return end;
    }
    for (uint64_t q = pos + SEG_REC_ALIGN; q + SEG_REC_HDR <= len && !w->gave_up;
         q += SEG_REC_ALIGN)
        if (whole_record(w, q))
            return q;
    return len;
}

/* ---- loading a segment without its hint -------------------------------------------------------- */

/* Record by record, headers only: the number of records indexed. A good
 * header whose record runs past the end is a torn tail (its length is
 * known, so nothing in its payload is read as records); a bad header is
 * skipped to the next whole record (resync); what follows the last good
 * record is cut. */
static long load_records(struct seg_root *r, struct seg *sg)
{
    char p[PATH_MAX];
    seg_path(r, sg->id, false, p, sizeof p);
    int fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return 0;
    uint64_t len = sg->len, pos = 0, good_end = 0, bad = 0, first_bad = 0;
    const char *first_why = NULL;
    const uint8_t *m = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    if (m == MAP_FAILED) {
        close(fd);
        return 0;
    }
    if (m)
        madvise((void *)m, len, MADV_SEQUENTIAL);
    struct walk *w = calloc(1, sizeof(*w));
    if (!w) {
        if (m)
            munmap((void *)m, len);
        close(fd);
        return 0;                  /* loaded at the next start */
    }
    *w = (struct walk){ .r = r, .m = m, .len = len, .check_left = RESYNC_BUDGET(len) };
    size_t nents = 0, capents = 0;
    struct seg_hint_ent *ents = NULL;
    long n = 0;
    while (pos + SEG_REC_HDR <= len) {
        struct seg_rec h;
        const char *why = seg_rec_decode(m + pos, &h);
        if (!why && seg_rec_len(h.size) > len - pos)
            break;                 /* a torn tail: cut below */
        if (why) {
            uint64_t q = resync(w, pos);
            if (q >= len)
                break;             /* nothing whole after it: a torn tail */
            if (!first_why) {
                first_why = why;
                first_bad = pos;
            }
            w->skipped++;
            w->skipped_bytes += q - pos;
            pos = q;
            continue;
        }
        /* Headers only: a payload is checked by the get that reads it. A
         * layout record's payload carries its own CRC (seg_layout_decode). */
        if (h.type == SEG_REC_LAYOUT) {
            walk_learn(w, m + pos + SEG_REC_HDR, h.size);
        } else if (h.type != SEG_REC_PAD) {
            struct seg_ns *ns = ns_of(w->nss, w->disk, w->nnss, h.fingerprint, h.rank);
            /* Its layout record lost (a bad payload): the header's
             * fingerprint names the namespace as well, when it is known
             * (under its current identity). */
            if (!ns && w->nnss < 256 && (ns = ns_known(r, h.fingerprint, h.rank))) {
                w->disk[w->nnss] = h.fingerprint;
                w->nss[w->nnss++] = ns;
            }
            /* The hint written below pairs it with nss' current identities. */
            struct seg_hint_ent e = { .type = h.type, .rank = h.rank, .crc = h.crc,
                                      .fingerprint = ns ? ns->fingerprint : h.fingerprint,
                                      .size = h.size, .seq = h.seq, .off = pos, .key = h.key,
                                      .check = h.check };
            if (ns) {
                apply(r, ns, &e, sg);
                n++;
                if (nents == capents) {
                    size_t cap = capents ? capents * 2 : 1024;
                    struct seg_hint_ent *v = realloc(ents, cap * sizeof(*v));
                    if (v) {
                        ents = v;
                        capents = cap;
                    }
                }
                if (nents < capents)
                    ents[nents++] = e;
            } else {
                bad++;             /* no layout record names its namespace */
            }
        }
        pos += seg_rec_len(h.size);
        good_end = pos;
    }
    if (m)
        munmap((void *)m, len);
    if (w->gave_up) {
        log_warn("kvs file: segment %s: too much damage to resynchronise within %" PRIu64
                 " bytes of checks; its records after offset %" PRIu64 " are not loaded (the file "
                 "is left as it is)", p, RESYNC_BUDGET(len), good_end);
    } else if (good_end < len) {
        if (ftruncate(fd, (off_t)good_end) == 0) {
            pthread_mutex_lock(&r->mu);
            r->st.torn_tails++;
            r->st.torn_bytes += len - good_end;
            r->st.disk_bytes -= len - good_end;
            sg->len = good_end;
            pthread_mutex_unlock(&r->mu);
            log_info("kvs file: segment %s: cut a torn tail of %" PRIu64 " bytes", p,
                     len - good_end);
        }
    }
    close(fd);
    if (w->skipped) {
        pthread_mutex_lock(&r->mu);
        r->st.resync_records += w->skipped;
        r->st.resync_bytes += w->skipped_bytes;
        pthread_mutex_unlock(&r->mu);
        log_warn("kvs file: segment %s: skipped %" PRIu64 " record(s) with a bad header (%" PRIu64
                 " bytes; the first at offset %" PRIu64 ": %s), resynchronised on the next whole "
                 "record", p, w->skipped, w->skipped_bytes, first_bad, first_why);
    }
    bad += w->skipped;
    if (bad)
        count(r, &r->st.corrupt, bad);
    /* Closed from now on: index it so the next start reads the hint. */
    if (bad == 0 && !w->gave_up && nents == (size_t)n && sg->len)
        seg_hint_write(r, sg->id, sg->len, w->nss, w->nnss, ents, nents, true);
    free(ents);
    free(w);
    return n;
}

static size_t load_step(struct seg_root *r, size_t budget)
{
    size_t done = 0;
    while (done < budget) {
        pthread_mutex_lock(&r->mu);
        if (r->load_next >= r->nloading) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        struct seg *sg = r->segs[r->load_next++];
        r->load_busy++;
        pthread_mutex_unlock(&r->mu);
        long n = load_hint(r, sg);
        if (n >= 0) {
            count(r, &r->st.hints_loaded, 1);
        } else {
            count(r, &r->st.hints_bad, 1);
            n = load_records(r, sg);
        }
        pthread_mutex_lock(&r->mu);
        sg->loading = false;
        r->load_busy--;
        if (r->load_next >= r->nloading && r->load_busy == 0) {
            r->recovered = true;
            for (size_t i = 0; i < r->nloading; i++)
                seg_reclaim_if_dead(r, r->segs[i]);
        }
        pthread_mutex_unlock(&r->mu);
        seg_drain_unlinks(r);
        done += (size_t)n + 1;
    }
    return done;
}

/* ---- reporting ------------------------------------------------------------------------------ */

static uint64_t rev64(uint64_t v)
{
    v = ((v >> 1) & UINT64_C(0x5555555555555555)) | ((v & UINT64_C(0x5555555555555555)) << 1);
    v = ((v >> 2) & UINT64_C(0x3333333333333333)) | ((v & UINT64_C(0x3333333333333333)) << 2);
    v = ((v >> 4) & UINT64_C(0x0f0f0f0f0f0f0f0f)) | ((v & UINT64_C(0x0f0f0f0f0f0f0f0f)) << 4);
    v = ((v >> 8) & UINT64_C(0x00ff00ff00ff00ff)) | ((v & UINT64_C(0x00ff00ff00ff00ff)) << 8);
    v = ((v >> 16) & UINT64_C(0x0000ffff0000ffff)) | ((v & UINT64_C(0x0000ffff0000ffff)) << 16);
    return (v >> 32) | (v << 32);
}

/* One budget of keydir entries; 1 when every bucket was visited. The
 * reverse-binary cursor visits every entry present throughout, even when
 * the table doubles between calls (an entry may come twice). */
static int report_step(struct seg_root *r, struct kvs_scan *c, size_t budget,
                       void (*found)(void *arg, const struct kvs_found *f), void *arg)
{
    struct kvs_found *v = malloc(budget * sizeof(*v));
    size_t n = 0;
    int done = 0;
    if (!v)
        return -KVNODE_ENOMEM;
    pthread_mutex_lock(&r->mu);
    do {
        uint64_t m = r->mask;
        size_t want = 0;
        for (struct kd_ent *e = r->tab[c->cursor & m], *nx; e; e = nx) {
            nx = e->next;
            if (e->seg->dropped || e->kind == KD_TOMB)
                seg_kd_remove(r, e);   /* stale, or a tombstone whose work is done */
            else if (e->ns->layout_known)
                want++;
        }
        if (n > 0 && n + want > budget)
            break;                 /* this bucket next time: never more than budget */
        if (n + want > budget) {   /* one chain longer than the budget: all of it */
            struct kvs_found *w = realloc(v, (n + want) * sizeof(*v));
            if (!w)
                break;
            v = w;
        }
        for (struct kd_ent *e = r->tab[c->cursor & m]; e; e = e->next)
            if (e->ns->layout_known)
                v[n++] = (struct kvs_found){ .layout = e->ns->layout,
                                             .fingerprint = e->ns->fingerprint, .key = e->key,
                                             .check = e->check, .size = e->size };
        c->cursor |= ~m;
        c->cursor = rev64(c->cursor);
        c->cursor++;
        c->cursor = rev64(c->cursor);
        if (c->cursor == 0)
            done = 1;
    } while (!done && n < budget);
    pthread_mutex_unlock(&r->mu);
    seg_drain_unlinks(r);
    for (size_t i = 0; i < n && found; i++)
        found(arg, &v[i]);
    free(v);
    return done;
}

/* ---- the scan callback ------------------------------------------------------------------------ */

int seg_scan(struct kvs_store *ks, struct kvs_scan **cursor, size_t budget,
             void (*found)(void *arg, const struct kvs_found *f), void *arg, char *err,
             size_t errlen)
{
    struct seg_root *r = FS(ks)->r;
    struct kvs_scan *c = *cursor;

    if (budget == 0) {
        if (c)
            free(c);
        *cursor = NULL;
        return 1;
    }
    if (!c) {
        if (!(c = calloc(1, sizeof(*c)))) {
            errmsg_set(err, errlen, "kvs file: out of memory");
            return -KVNODE_ENOMEM;
        }
        c->phase = PH_LOAD;
        *cursor = c;
    }
    if (c->phase == PH_LOAD) {
        load_step(r, budget);
        pthread_mutex_lock(&r->mu);
        bool over = r->recovered;
        pthread_mutex_unlock(&r->mu);
        if (!over)
            return 0;              /* more to load, or another scan still loading */
        c->phase = PH_REPORT;
    }
    int rc = report_step(r, c, budget, found, arg);
    if (rc < 0)
        goto fail;
    if (rc == 1) {
        free(c);
        *cursor = NULL;
    }
    return rc;
fail:
    errmsg_set(err, errlen, "kvs file: recovery scan of %s: out of memory", r->path);
    free(c);
    *cursor = NULL;
    return -KVNODE_ENOMEM;
}
