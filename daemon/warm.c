/* warm: see warm.h. */
#include "warm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "config/config.h"
#include "core/log.h"
#include "kvnode.h"
#include "mem/namespace.h"
#include "persist/kvs/crc32c.h"
#include "tenants/tenants.h"

#define WARM_MAGIC "KVNWARM"      /* 8 bytes with its NUL */
#define WARM_VERSION 1u
/* Far beyond any real index (a block record is 40 bytes). */
#define WARM_MAX_BYTES (UINT64_C(64) << 30)

/* Native byte order and layout: a snapshot goes from one process to the
 * next on the same machine; the record sizes are checked, so a build whose
 * records differ refuses it rather than misreading it. */
struct warm_header {
    char     magic[8];
    uint32_t version;
    uint32_t crc;               /* CRC-32C of every byte after this field */
    uint64_t total_bytes;
    char     build[64];         /* KVNODE_VERSION_STRING of the writer */
    uint64_t slab_bytes;        /* memory.slab_bytes */
    int32_t  huge_pages;        /* memory.huge_pages */
    uint32_t ntenants;
    uint32_t layout_bytes;      /* sizeof (struct ns_layout) */
    uint32_t block_bytes;       /* sizeof (struct cache_ho_block) */
};
struct warm_tenant_rec {
    char     name[CONFIG_TENANT_NAME_MAX];
    uint64_t host_bytes;
    uint64_t reserved;          /* of its host memfd (the rest is reserved at adoption) */
    uint64_t nns, nblocks;
    /* then nns layouts, nns fingerprints, nblocks blocks */
};

struct warm_snapshot {
    void  *map;
    size_t len;
    struct cache_ho ho[TENANTS_MAX];
};

static struct warm_status ws = { .state = "none", .source = "" };
/* The names handed over at this start (removed from systemd's store). */
static char received[WARM_FDS_MAX][SDN_FDNAME_MAX];
static size_t nreceived;
static double opened_at;   /* warm_open's start: warm_finish counts from it */

const struct warm_status *warm_status(void) { return &ws; }

static double warm_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void warm_close_fds(struct sdn_fd *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fds[i].fd >= 0) {
            close(fds[i].fd);
            fds[i].fd = -1;
        }
}

static size_t warm_tenant_section(const struct warm_tenant_rec *t)
{
    return sizeof *t + (size_t)t->nns * (sizeof(struct ns_layout) + sizeof(uint64_t)) +
           (size_t)t->nblocks * sizeof(struct cache_ho_block);
}

/* ---- stop: the snapshot ---------------------------------------------- */

static int warm_write_snapshot(const void *buf, size_t len)
{
    int fd = memfd_create(WARM_FD_SNAPSHOT, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    const char *p = buf;
    size_t done = 0;

    if (fd < 0)
        return -1;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    /* Nobody changes it from here on, not even its holder. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The snapshot's bytes for the caches' hand-overs (hos[i] of tenant ts[i]). */
static char *warm_serialise(struct tenants *ts, const struct kvn_config *cfg, const struct cache_ho *hos,
                            size_t *len)
{
    struct warm_header h = { .magic = WARM_MAGIC, .version = WARM_VERSION, .slab_bytes = cfg->slab_bytes,
                             .huge_pages = cfg->huge_pages, .layout_bytes = sizeof(struct ns_layout),
                             .block_bytes = sizeof(struct cache_ho_block) };
    size_t total = sizeof h;
    char *buf, *p;

    snprintf(h.build, sizeof h.build, "%s", KVNODE_VERSION_STRING);
    for (size_t i = 0; i < tenants_count(ts); i++) {
        if (!tenants_at(ts, i)->cache)
            continue;
        struct warm_tenant_rec r = { .nns = hos[i].nns, .nblocks = hos[i].n };
        total += warm_tenant_section(&r);
        h.ntenants++;
    }
    h.total_bytes = total;
    if (!(buf = calloc(1, total)))
        return NULL;
    p = buf + sizeof h;
    for (size_t i = 0; i < tenants_count(ts); i++) {
        const struct tenant *t = tenants_at(ts, i);
        if (!t->cache)
            continue;
        struct warm_tenant_rec r = { .host_bytes = t->host_bytes, .reserved = hos[i].reserved, .nns = hos[i].nns,
                                     .nblocks = hos[i].n };
        snprintf(r.name, sizeof r.name, "%s", t->name);
        memcpy(p, &r, sizeof r);
        p += sizeof r;
        if (hos[i].n == 0)
            continue;   /* nothing collected: no arrays to copy */
        memcpy(p, hos[i].layouts, hos[i].nns * sizeof *hos[i].layouts);
        p += hos[i].nns * sizeof *hos[i].layouts;
        memcpy(p, hos[i].fingerprints, hos[i].nns * sizeof *hos[i].fingerprints);
        p += hos[i].nns * sizeof *hos[i].fingerprints;
        memcpy(p, hos[i].blocks, hos[i].n * sizeof *hos[i].blocks);
        p += hos[i].n * sizeof *hos[i].blocks;
    }
    memcpy(buf, &h, sizeof h);
    size_t after = offsetof(struct warm_header, crc) + sizeof h.crc;
    h.crc = crc32c(0, buf + after, total - after);
    memcpy(buf, &h, sizeof h);
    *len = total;
    return buf;
}

/* The host memfd of a cache, -1 when it has none. */
static int warm_host_fd(struct cache *c)
{
    struct cache_arena_info a[17];
    size_t n = cache_arenas(c, a, sizeof a / sizeof a[0]);
    for (size_t i = 0; i < n; i++)
        if (a[i].tier == KVNODE_TIER_HOST)
            return a[i].fd;
    return -1;
}

size_t warm_build(struct tenants *ts, const struct kvn_config *cfg, struct sdn_fd *fds)
{
    struct cache_ho hos[TENANTS_MAX];
    size_t n = 0, len = 0, ntenants = tenants_count(ts);
    char *buf = NULL;
    const char *fail = NULL;

    memset(hos, 0, sizeof hos);
    for (size_t i = 0; i < ntenants && !fail; i++) {
        struct tenant *t = tenants_at(ts, i);
        if (t->cache && cache_handover_collect(t->cache, &hos[i]) < 0)
            fail = "out of memory collecting the index";
        ws.handed_blocks += hos[i].n;
        ws.handed_bytes += hos[i].bytes;
    }
    if (!fail && !(buf = warm_serialise(ts, cfg, hos, &len)))
        fail = "out of memory for the snapshot";
    if (!fail && (fds[0].fd = warm_write_snapshot(buf, len)) < 0)
        fail = "cannot write the snapshot's memfd";
    if (!fail) {
        snprintf(fds[0].name, sizeof fds[0].name, "%s", WARM_FD_SNAPSHOT);
        n = 1;
    }
    for (size_t i = 0; !fail && i < ntenants && n < WARM_FDS_MAX; i++) {
        const struct tenant *t = tenants_at(ts, i);
        int host = t->cache ? warm_host_fd(t->cache) : -1;
        if (host < 0)
            continue;
        if ((fds[n].fd = fcntl(host, F_DUPFD_CLOEXEC, 3)) < 0) {
            fail = "cannot duplicate a host memfd";
            break;
        }
        snprintf(fds[n].name, sizeof fds[n].name, "%s%s", WARM_FD_HOST_PREFIX, t->name);
        n++;
    }
    for (size_t i = 0; i < ntenants; i++)
        cache_ho_free(&hos[i]);
    free(buf);
    if (fail) {
        log_warn("warm restart: nothing handed over: %s (%s); the next start is cold", fail, strerror(errno));
        warm_close_fds(fds, n);
        return 0;
    }
    return n;
}

void warm_handed_over(void) { ws.handed_over = true; }

void warm_handover_systemd(struct tenants *ts, const struct kvn_config *cfg)
{
    struct sdn_fd fds[WARM_FDS_MAX];
    size_t n;

    if (!sdn_under_systemd() || !(n = warm_build(ts, cfg, fds)))
        return;
    /* systemd 254 and later say how many the store takes; 252 does not. */
    const char *max = getenv("FDSTORE");
    if (max && strtoul(max, NULL, 10) < n) {
        log_warn("warm restart: the unit's fd store takes %s descriptors, a hand-over needs %zu: nothing "
                 "handed over, the next start is cold (raise FileDescriptorStoreMax=)", max, n);
        warm_close_fds(fds, n);
        return;
    }
    ws.handed_over = true;
    for (size_t i = 0; i < n; i++) {
        int rc = sdn_fdstore(fds[i].fd, fds[i].name);
        if (rc <= 0) {
            log_warn("warm restart: systemd did not take %s (%s): the next start is cold", fds[i].name,
                     rc < 0 ? strerror(-rc) : "no NOTIFY_SOCKET");
            ws.handed_over = false;
            break;
        }
    }
    /* systemd holds its own copies now. */
    warm_close_fds(fds, n);
    log_info("warm restart: %" PRIu64 " host blocks (%" PRIu64 " bytes) and %zu descriptors handed to systemd's "
             "fd store (FileDescriptorStoreMax= in the unit must allow %zu)", ws.handed_blocks, ws.handed_bytes,
             n, n);
}

/* ---- start: reading and checking ------------------------------------- */

static int warm_refuse(struct sdn_fd *fds, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int warm_refuse(struct sdn_fd *fds, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ws.why, sizeof ws.why, fmt, ap);
    va_end(ap);
    ws.state = "refused";
    log_warn("warm restart refused, starting cold: %s", ws.why);
    warm_close_fds(fds, n);
    return 0;
}

/* The tenant records of the mapping into snap->ho, names into tw. */
static const char *warm_parse(struct warm_snapshot *snap, const struct warm_header *h, struct tenants_warm *tw)
{
    const char *p = (const char *)snap->map + sizeof *h, *end = (const char *)snap->map + snap->len;

    if (h->ntenants > TENANTS_MAX)
        return "more tenants than a daemon has";
    for (uint32_t i = 0; i < h->ntenants; i++) {
        struct warm_tenant_rec r;
        if ((size_t)(end - p) < sizeof r)
            return "a tenant record runs past the end";
        memcpy(&r, p, sizeof r);
        if (!memchr(r.name, 0, sizeof r.name) || r.name[0] == '\0')
            return "a tenant's name is not a string";
        if (r.nns > NS_RECORDS_MAX || r.nblocks > (uint64_t)(end - p) / sizeof(struct cache_ho_block) ||
            warm_tenant_section(&r) > (size_t)(end - p))
            return "a tenant's records run past the end";
        for (uint32_t k = 0; k < i; k++)
            if (strcmp(tw->t[k].name, r.name) == 0)
                return "a tenant twice";
        p += sizeof r;
        struct cache_ho *ho = &snap->ho[i];
        ho->nns = r.nns;
        ho->layouts = (struct ns_layout *)(uintptr_t)p;
        p += r.nns * sizeof(struct ns_layout);
        ho->fingerprints = (uint64_t *)(uintptr_t)p;
        p += r.nns * sizeof(uint64_t);
        ho->n = r.nblocks;
        ho->reserved = r.reserved;
        ho->blocks = (struct cache_ho_block *)(uintptr_t)p;
        p += r.nblocks * sizeof(struct cache_ho_block);
        struct tenants_warm_one *w = &tw->t[tw->n++];
        snprintf(w->name, sizeof w->name, "%s", r.name);
        w->host_bytes = r.host_bytes;
        w->fd = -1;
        w->ho = ho;
    }
    return p == end ? NULL : "bytes after the last tenant";
}

/* The header: everything but the tenants. NULL, or what is wrong. */
static const char *warm_check_header(const struct warm_header *h, const void *map, size_t len,
                                     const struct kvn_config *cfg, char *why, size_t whylen)
{
    if (memcmp(h->magic, WARM_MAGIC, sizeof h->magic) != 0)
        return "not a kvnode snapshot (magic)";
    if (h->version != WARM_VERSION) {
        snprintf(why, whylen, "snapshot format %u, this daemon reads %u", h->version, WARM_VERSION);
        return why;
    }
    if (h->total_bytes != len)
        return "its size is not the one its header gives";
    size_t after = offsetof(struct warm_header, crc) + sizeof h->crc;
    if (crc32c(0, (const char *)map + after, len - after) != h->crc)
        return "checksum mismatch";
    if (h->layout_bytes != sizeof(struct ns_layout) || h->block_bytes != sizeof(struct cache_ho_block))
        return "its records are not this build's";
    if (h->slab_bytes != cfg->slab_bytes || h->huge_pages != cfg->huge_pages) {
        snprintf(why, whylen, "memory.slab_bytes / memory.huge_pages changed (%" PRIu64 " / %d then, %" PRIu64
                 " / %d now)", h->slab_bytes, h->huge_pages, cfg->slab_bytes, cfg->huge_pages);
        return why;
    }
    return NULL;
}

/* The snapshot fd: sealed against writes and resizing, and mapped. */
static const char *warm_map(int fd, struct warm_snapshot *snap)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    int need = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;

    if (seals < 0 || (seals & need) != need)
        return "the snapshot is not a memfd sealed against writes and resizing";
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(struct warm_header) ||
        (uint64_t)st.st_size > WARM_MAX_BYTES)
        return "the snapshot's size is not one a snapshot has";
    snap->len = (size_t)st.st_size;
    snap->map = mmap(NULL, snap->len, PROT_READ, MAP_SHARED, fd, 0);
    if (snap->map == MAP_FAILED) {
        snap->map = NULL;
        return "cannot map the snapshot";
    }
    return NULL;
}

static void warm_snapshot_free(struct warm_snapshot *snap)
{
    if (!snap)
        return;
    if (snap->map)
        munmap(snap->map, snap->len);
    free(snap);
}

int warm_open(const struct sdn_fd *in, size_t n, const char *source, const struct kvn_config *cfg,
              struct tenants_warm *tw, struct warm_snapshot **out)
{
    struct sdn_fd fds[WARM_FDS_MAX];
    struct warm_snapshot *snap = NULL;
    struct warm_header h;
    const char *bad;
    char why[256];
    int snap_fd = -1;
    *out = NULL;
    opened_at = warm_now();
    memset(tw, 0, sizeof *tw);
    if (n == 0)
        return 0;
    ws.source = source;
    for (size_t i = 0; i < n && nreceived < WARM_FDS_MAX; i++)
        snprintf(received[nreceived++], SDN_FDNAME_MAX, "%s", in[i].name);
    memcpy(fds, in, (n < WARM_FDS_MAX ? n : WARM_FDS_MAX) * sizeof *fds);
    for (size_t i = WARM_FDS_MAX; i < n; i++)
        close(in[i].fd);
    if (n > WARM_FDS_MAX)
        return warm_refuse(fds, WARM_FDS_MAX, "%zu descriptors handed over, at most %u", n, WARM_FDS_MAX);
    for (size_t i = 0; i < n; i++)
        if (strcmp(fds[i].name, WARM_FD_SNAPSHOT) == 0)
            snap_fd = fds[i].fd;
    if (snap_fd < 0)
        return warm_refuse(fds, n, "host memory was handed over without its snapshot (%s)", WARM_FD_SNAPSHOT);
    if (!(snap = calloc(1, sizeof *snap)))
        return warm_refuse(fds, n, "out of memory");
    if ((bad = warm_map(snap_fd, snap)) != NULL) {
        warm_snapshot_free(snap);
        return warm_refuse(fds, n, "%s", bad);
    }
    memcpy(&h, snap->map, sizeof h);
    snprintf(ws.from_version, sizeof ws.from_version, "%.63s", memchr(h.build, 0, sizeof h.build) ? h.build : "?");
    if ((bad = warm_check_header(&h, snap->map, snap->len, cfg, why, sizeof why)) != NULL ||
        (bad = warm_parse(snap, &h, tw)) != NULL) {
        warm_snapshot_free(snap);
        memset(tw, 0, sizeof *tw);
        return warm_refuse(fds, n, "%s", bad);
    }
    /* Each tenant's memory, by name; any other descriptor is not ours. */
    for (size_t k = 0; k < tw->n; k++) {
        char name[SDN_FDNAME_MAX];
        snprintf(name, sizeof name, "%s%s", WARM_FD_HOST_PREFIX, tw->t[k].name);
        for (size_t i = 0; i < n; i++)
            if (fds[i].fd >= 0 && strcmp(fds[i].name, name) == 0) {
                tw->t[k].fd = fds[i].fd;
                fds[i].fd = -1;
            }
        if (tw->t[k].fd < 0) {
            for (size_t j = 0; j < tw->n; j++)
                if (tw->t[j].fd >= 0)
                    close(tw->t[j].fd);
            warm_snapshot_free(snap);
            memset(tw, 0, sizeof *tw);
            return warm_refuse(fds, n, "the host memory of tenant %s was not handed over", name + strlen(WARM_FD_HOST_PREFIX));
        }
    }
    warm_close_fds(fds, n);   /* the snapshot's and any stray one */
    *out = snap;
    return 1;
}

void warm_finish(struct warm_snapshot *snap, const struct tenants_warm *tw, struct tenants *ts)
{
    if (snap && tw->adopted) {
        struct cache_stats *cs = malloc(sizeof *cs);
        if (cs && tenants_cache_totals(ts, cs)) {
            ws.blocks = cs->adopted_blocks;
            ws.bytes = cs->adopted_bytes;
        }
        free(cs);
        ws.state = "adopted";
        ws.dropped_blocks = tw->dropped_blocks;
        log_info("warm restart: adopted %" PRIu64 " host blocks (%" PRIu64 " bytes) handed over by kvnoded %s "
                 "(%s)%s", ws.blocks, ws.bytes, ws.from_version, ws.source,
                 tw->dropped_blocks ? "; blocks of tenants no longer configured dropped" : "");
    } else if (snap) {
        ws.state = "refused";
        snprintf(ws.why, sizeof ws.why, "%s", tw->why);
        log_warn("warm restart refused, starting cold: %s", ws.why);
    }
    warm_snapshot_free(snap);
    if (nreceived)
        ws.seconds = warm_now() - opened_at;   /* reading, checking, adopting (tenants_create) */
    /* Under systemd the store still holds what it passed: let go of it
     * (after a cold start that is the old memory itself). */
    if (strcmp(ws.source, "systemd") == 0)
        for (size_t i = 0; i < nreceived; i++)
            sdn_fdstore_remove(received[i]);
}
