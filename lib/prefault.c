/* prefault: see prefault.h. The walk goes in chunks so that prefault_stop
 * (kvnode_close) waits for at most one chunk: CHUNK bytes of populate, a few
 * milliseconds. MADV_POPULATE_READ/WRITE (Linux 5.14) fault the pages in
 * without touching them and report errors instead of raising SIGBUS; older
 * kernels do not know them and get one access per page instead. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "prefault.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PREFAULT_CHUNK (4u << 20)

struct prefault {
    struct prefault_range *ranges;
    size_t n;
    int write;
    int touch;                  /* MADV_POPULATE_* not used */
    int threaded;               /* thread must be joined */
    pthread_t thread;
    uint64_t total;
    atomic_uint_fast64_t done;
    atomic_int state;           /* 0 running, 1 ended, -1 failed */
    atomic_int stop;
    char err[256];              /* written before state becomes -1 */
};

/* One read per page, for writers too: the arenas are shared memory (shmem,
 * hugetlbfs), which needs no write notification, so a read fault maps the
 * page writable in a PROT_WRITE mapping already. (An atomic add of 0 would
 * not do: compilers may turn an idempotent RMW into a fence and a load.) */
static void prefault_touch(const uint8_t *p, size_t len, size_t page)
{
    size_t off;

    for (off = 0; off < len; off += page)
        (void)*(volatile const uint8_t *)(p + off);
}

static void *prefault_walk(void *arg)
{
    struct prefault *p = arg;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int advice = p->write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
    int madvise_works;
    size_t i;

    /* An unknown advice fails with EINVAL before the range is looked at; a
     * known one over no bytes succeeds. So EINVAL on a real chunk later is
     * a real error (the mapping does not allow it), not an old kernel. */
    madvise_works = !p->touch && p->n > 0 && madvise(p->ranges[0].base, 0, advice) == 0;

    for (i = 0; i < p->n; i++) {
        uint8_t *base = p->ranges[i].base;
        uint64_t off;

        for (off = 0; off < p->ranges[i].size; off += PREFAULT_CHUNK) {
            size_t len = (size_t)(p->ranges[i].size - off < PREFAULT_CHUNK ?
                                  p->ranges[i].size - off : PREFAULT_CHUNK);

            if (atomic_load(&p->stop))
                return NULL;
            if (madvise_works && madvise(base + off, len, advice) != 0) {
                snprintf(p->err, sizeof p->err, "prefault: %s of %zu bytes at offset %" PRIu64
                         " failed: %s", p->write ? "MADV_POPULATE_WRITE" : "MADV_POPULATE_READ",
                         len, off, strerror(errno));
                atomic_store(&p->state, -1);
                return NULL;
            }
            if (!madvise_works)
                prefault_touch(base + off, len, page);
            atomic_fetch_add(&p->done, len);
        }
    }
    atomic_store(&p->state, 1);
    return NULL;
}

struct prefault *prefault_start(const struct prefault_range *ranges, size_t n, unsigned flags)
{
    struct prefault *p = calloc(1, sizeof *p);
    size_t i;
    int rc;

    if (!p || (n > 0 && !(p->ranges = calloc(n, sizeof *ranges)))) {
        free(p);
        errno = ENOMEM;
        return NULL;
    }
    memcpy(p->ranges, ranges, n * sizeof *ranges);
    p->n = n;
    p->write = (flags & PREFAULT_WRITE) != 0;
    p->touch = (flags & PREFAULT_TOUCH) != 0;
    for (i = 0; i < n; i++)
        p->total += ranges[i].size;
    atomic_init(&p->done, 0);
    atomic_init(&p->state, 0);
    atomic_init(&p->stop, 0);
    if (flags & PREFAULT_WAIT) {
        prefault_walk(p);
        return p;
    }
    rc = pthread_create(&p->thread, NULL, prefault_walk, p);
    if (rc != 0) {
        free(p->ranges);
        free(p);
        errno = rc;
        return NULL;
    }
    p->threaded = 1;
    return p;
}

int prefault_state(const struct prefault *p, uint64_t *done, uint64_t *total)
{
    if (done)
        *done = atomic_load(&p->done);
    if (total)
        *total = p->total;
    return atomic_load(&p->state);
}

const char *prefault_error(const struct prefault *p)
{
    return atomic_load(&p->state) < 0 ? p->err : "";
}

void prefault_join(struct prefault *p)
{
    if (p->threaded)
        pthread_join(p->thread, NULL);
    p->threaded = 0;
}

void prefault_stop(struct prefault *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    prefault_join(p);
    free(p->ranges);
    free(p);
}
