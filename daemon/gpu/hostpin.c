/* hostpin: chunked background registration of host memory (see hostpin.h).
 *
 * Chunks are registered in order from base, so the registered ones are
 * always chunks 0..nreg-1: nreg is written by the thread only (or by start
 * before the thread exists) and read by stop after the join. Readers on
 * other threads see state and pinned_bytes through atomics; why is written
 * before state becomes FAILED (release) and never changes afterwards. */
#include "gpu/hostpin.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "gpu/devmem.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "core/log.h"
#include "core/liveness.h"

#define HOSTPIN_THREAD_NAME "kvnode-pin"

struct hostpin {
    struct devmem *dm;
    char          *base;
    uint64_t       len, chunk;
    uint64_t       nreg;           /* chunks registered (see above) */
    uint64_t       start_ms;
    struct liveness_entry *w;
    pthread_t      tid;
    bool           thread;         /* joinable (main thread) */
    atomic_bool    stop;
    atomic_int     state;
    _Atomic uint64_t pinned;
    char           why[256];
};

static uint64_t chunk_len(const struct hostpin *hp, uint64_t i)
{
    uint64_t off = i * hp->chunk;
    return hp->len - off < hp->chunk ? hp->len - off : hp->chunk;
}

static int register_chunk(struct hostpin *hp, char *why, size_t whylen)
{
    uint64_t off = hp->nreg * hp->chunk, n = chunk_len(hp, hp->nreg);
    int rc = devmem_host_register(hp->dm, hp->base + off, (size_t)n, why, whylen);

    if (rc == 0) {
        hp->nreg++;
        atomic_fetch_add(&hp->pinned, n);
    }
    return rc;
}

static void log_done(struct hostpin *hp)
{
    double s = (double)(clock_now_ms() - hp->start_ms) / 1000.0;
    log_info("hostpin: %.2f GiB (%llu bytes) of host memory pinned for GPU copies in %.2f s",
             (double)hp->len / (1024.0 * 1024.0 * 1024.0), (unsigned long long)hp->len, s);
}

static void *pin_main(void *arg)
{
    struct hostpin *hp = arg;
    uint64_t nchunks = (hp->len + hp->chunk - 1) / hp->chunk;
    char why[sizeof hp->why];

    pthread_setname_np(pthread_self(), HOSTPIN_THREAD_NAME);
    liveness_heartbeat(hp->w);
    while (hp->nreg < nchunks) {
        if (atomic_load(&hp->stop)) {
            atomic_store(&hp->state, HOSTPIN_STOPPED);
            break;
        }
        if (register_chunk(hp, why, sizeof why) < 0) {
            errmsg_set(hp->why, sizeof hp->why, "pinning %llu bytes at offset %llu: %s",
                       (unsigned long long)chunk_len(hp, hp->nreg),
                       (unsigned long long)(hp->nreg * hp->chunk), why);
            log_warn("hostpin: host memory only partly pinned (%llu of %llu bytes), GPU copies "
                     "from the rest are slower: %s",
                     (unsigned long long)atomic_load(&hp->pinned), (unsigned long long)hp->len,
                     hp->why);
            atomic_store(&hp->state, HOSTPIN_FAILED);
            break;
        }
        liveness_heartbeat(hp->w);
    }
    if (hp->nreg == nchunks) {
        atomic_store(&hp->state, HOSTPIN_DONE);
        log_done(hp);
    }
    liveness_unregister(hp->w);
    hp->w = NULL;
    return NULL;
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int hostpin_start(struct devmem *dm, void *base, uint64_t len, uint64_t chunk_bytes,
                  uint64_t align_bytes, bool first_sync, struct hostpin **out, char *why, size_t whylen)
{
    long page = sysconf(_SC_PAGESIZE);
    struct hostpin *hp;
    sigset_t all, old;
    char e[200];
    int rc;

    if (out)
        *out = NULL;
    if (!dm || !base || len == 0 || chunk_bytes == 0 || !out) {
        errmsg_set(why, whylen, "hostpin: needs a backend, a non-empty range, a chunk size and "
                   "an output pointer");
        return -KVNODE_EINVAL;
    }
    if (page <= 0)
        page = 4096;
    if ((uintptr_t)base % (uint64_t)page != 0 || chunk_bytes % (uint64_t)page != 0) {
        errmsg_set(why, whylen, "hostpin: base and chunk size (%llu) must be multiples of the "
                   "page size (%ld)", (unsigned long long)chunk_bytes, page);
        return -KVNODE_EINVAL;
    }
    if (align_bytes > 0) {
        /* A multiple of both the page and the slab, so chunk boundaries
         * are slab boundaries and no page is in two chunks. */
        uint64_t unit = align_bytes / gcd_u64(align_bytes, (uint64_t)page);
        if (unit > UINT64_MAX / (uint64_t)page) {
            errmsg_set(why, whylen, "hostpin: slab size %llu has no common multiple with the page "
                       "size (%ld) that fits", (unsigned long long)align_bytes, page);
            return -KVNODE_EINVAL;
        }
        unit *= (uint64_t)page;
        if (chunk_bytes % unit != 0) {
            uint64_t up = chunk_bytes / unit + 1;
            chunk_bytes = up > UINT64_MAX / unit ? unit : up * unit;
        }
    }
    if (len > (uint64_t)SIZE_MAX - (uint64_t)(uintptr_t)base) {
        errmsg_set(why, whylen, "hostpin: range of %llu bytes does not fit the address space",
                   (unsigned long long)len);
        return -KVNODE_EINVAL;
    }
    if (!devmem_can_pin(dm)) {
        errmsg_set(why, whylen, "hostpin: devmem backend %s cannot pin host memory",
                   devmem_kind_name(devmem_kind(dm)));
        return -KVNODE_EINVAL;
    }
    if (!(hp = calloc(1, sizeof(*hp)))) {
        errmsg_set(why, whylen, "hostpin: out of memory");
        return -KVNODE_ENOMEM;
    }
    hp->dm = dm;
    hp->base = base;
    hp->len = len;
    hp->chunk = chunk_bytes;
    hp->start_ms = clock_now_ms();
    atomic_init(&hp->stop, false);
    atomic_init(&hp->state, HOSTPIN_RUNNING);
    atomic_init(&hp->pinned, 0);

    if (first_sync) {
        if (register_chunk(hp, e, sizeof e) < 0) {
            errmsg_set(why, whylen, "hostpin: pinning the first %llu bytes of host memory: %s",
                       (unsigned long long)chunk_len(hp, 0), e);
            free(hp);
            return -KVNODE_EIO;
        }
        if (hp->nreg * hp->chunk >= len) {
            atomic_store(&hp->state, HOSTPIN_DONE);
            log_done(hp);
            *out = hp;
            return 0;
        }
    }

    /* Registered here so it is watched from the start; the thread unregisters. */
    hp->w = liveness_register(HOSTPIN_THREAD_NAME);
    /* The thread inherits a mask blocking every signal: they are the loop's. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&hp->tid, NULL, pin_main, hp);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errmsg_set(why, whylen, "hostpin: cannot start the pinning thread: %s", strerror(rc));
        liveness_unregister(hp->w);
        for (uint64_t i = 0; i < hp->nreg; i++)
            devmem_host_unregister(dm, hp->base + i * hp->chunk);
        free(hp);
        return -KVNODE_ENOMEM;
    }
    hp->thread = true;
    *out = hp;
    return 0;
}

void hostpin_progress(struct hostpin *hp, struct hostpin_progress *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof(*out));
    if (!hp) {
        out->state = HOSTPIN_STOPPED;
        return;
    }
    out->state = atomic_load(&hp->state);
    out->pinned_bytes = atomic_load(&hp->pinned);
    out->total_bytes = hp->len;
    if (out->state == HOSTPIN_FAILED)
        memcpy(out->why, hp->why, sizeof out->why);
}

uint64_t hostpin_chunk_bytes(const struct hostpin *hp)
{
    return hp ? hp->chunk : 0;
}

void hostpin_cancel(struct hostpin *hp)
{
    if (!hp || !hp->thread)
        return;
    atomic_store(&hp->stop, true);
    pthread_join(hp->tid, NULL);
    hp->thread = false;
}

void hostpin_stop(struct hostpin *hp)
{
    if (!hp)
        return;
    hostpin_cancel(hp);
    if (atomic_load(&hp->state) == HOSTPIN_STOPPED)
        log_info("hostpin: stopped after pinning %llu of %llu bytes",
                 (unsigned long long)atomic_load(&hp->pinned), (unsigned long long)hp->len);
    for (uint64_t i = 0; i < hp->nreg; i++)
        devmem_host_unregister(hp->dm, hp->base + i * hp->chunk);
    free(hp);
}
