/* populate: background reservation and population of a host arena (see
 * populate.h).
 *
 * Threads take chunk indices in order from an atomic counter; a finished
 * chunk is flagged, and under the mutex (never taken by the loop) the
 * contiguous prefix of finished chunks is advanced and published to the
 * arena. A chunk that fails ends the job: the prefix never passes it.
 * Chunk 0 is smaller (at most POPULATE_FIRST_BYTES) and done before
 * populate_start returns, so a small tier is whole before the daemon serves
 * and a large one starts with room for its first puts and promotions.
 *
 * How a chunk is had: fallocate() allocates (and zeroes) its pages in the
 * memfd, charged to the daemon, so nothing can take them away and no client
 * ever meets SIGBUS there. The daemon's own page tables are then left to
 * fill on first touch, like every client's: on this project's 2-core VM,
 * fallocate of 4 GiB took 1.1 s and faulting the mapping in
 * (MADV_POPULATE_WRITE or MAP_POPULATE) 2.5-7 s more, for memory the daemon
 * itself rarely touches (clients read and write blocks through their own
 * mappings). Two cases fault instead: a THP arena (fallocate without a
 * mapping allocates small pages under shmem_enabled=advise; the fault path
 * of a MADV_HUGEPAGE mapping makes huge ones), and a filesystem without
 * fallocate (EOPNOTSUPP). */
#include "mem/populate.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/errmsg.h"
#include "core/liveness.h"
#include "core/log.h"
#include "kvnode.h"
#include "mem/arena.h"
#include "mem/numa.h"

#define POPULATE_THREAD_NAME "kvnode-populate"
#define POPULATE_MAX_THREADS 8u
#define POPULATE_FIRST_BYTES (UINT64_C(64) << 20)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct populate_worker {
    struct populate       *p;
    struct liveness_entry *w;
    pthread_t              tid;
    int                    policy;    /* numa_thread_policy's memory */
};

struct populate {
    struct arena    *a;
    int              fd;
    char            *base;
    uint64_t         size, chunk, nchunks;
    uint64_t         first;           /* bytes of chunk 0 */
    uint64_t         delay_ms;        /* test-only slowdown per chunk */
    uint64_t         fail_at;         /* test-only: chunks from this offset fail (0: none) */
    uint64_t         start_ms;
    bool             by_fault;        /* THP: populate by faulting, not fallocate */
    struct numa_plan plan;            /* where each range goes (numa_thread_policy) */
    char             label[80];
    _Atomic uint64_t next;            /* next chunk to hand out */
    atomic_bool     *done;            /* per chunk */
    pthread_mutex_t  mu;              /* prefix, why */
    uint64_t         prefix;          /* chunks 0..prefix-1 done */
    atomic_bool      stop, failed;
    atomic_int       state;
    _Atomic uint64_t reserved;
    _Atomic uint64_t end_ms;
    unsigned         nthreads;
    struct populate_worker workers[POPULATE_MAX_THREADS];
    char             why[256];
};

unsigned populate_default_threads(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned n = cores > 0 ? (unsigned)(cores / 4) : 1u;
    return n < 1 ? 1u : n > POPULATE_MAX_THREADS ? POPULATE_MAX_THREADS : n;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *s = getenv(name);
    char *end;
    if (!s || !*s)
        return dflt;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    return errno || *end ? dflt : (uint64_t)v;
}

/* Fault every page of [p, p+len) in writable: MADV_POPULATE_WRITE (Linux
 * 5.14), else one write per page (the range holds no block yet). 0, or the
 * errno that says the memory cannot be had (ENOMEM, EFAULT: SIGBUS). */
static int populate_pages(char *p, uint64_t len)
{
    if (madvise(p, (size_t)len, MADV_POPULATE_WRITE) == 0)
        return 0;
    if (errno != EINVAL)   /* EINVAL: a kernel older than 5.14 */
        return errno;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    for (uint64_t off = 0; off < len; off += (uint64_t)page)
        ((volatile char *)p)[off] = 0;
    return 0;
}

void populate_touch(void *p, size_t len)
{
    static long page;
    if (!page)
        page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
    (void)madvise((void *)a, len + ((uintptr_t)p - a), MADV_POPULATE_WRITE);
}

static void sleep_beating(struct populate_worker *pw, uint64_t ms)
{
    while (ms > 0 && !atomic_load(&pw->p->stop)) {
        uint64_t step = ms < 100 ? ms : 100;
        struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)(step * 1000000u) };
        nanosleep(&ts, NULL);
        liveness_heartbeat(pw->w);
        ms -= step;
    }
}

static uint64_t chunk_start(const struct populate *p, uint64_t i)
{
    return i == 0 ? 0 : p->first + (i - 1) * p->chunk;
}

static uint64_t chunk_end(const struct populate *p, uint64_t i)
{
    uint64_t end = p->first + i * p->chunk;
    return end < p->size ? end : p->size;
}

static void chunk_done(struct populate *p, uint64_t i)
{
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->done[i], true);
    while (p->prefix < p->nchunks && atomic_load(&p->done[p->prefix]))
        p->prefix++;
    uint64_t bytes = p->prefix ? chunk_end(p, p->prefix - 1) : 0;
    atomic_store(&p->reserved, bytes);
    arena_mark_reserved(p->a, bytes);
    if (p->prefix == p->nchunks && atomic_load(&p->state) == POPULATE_RUNNING) {
        atomic_store(&p->end_ms, clock_now_ms());
        atomic_store(&p->state, POPULATE_DONE);
        log_info("populate: %s host memory: %.2f GiB reserved and populated in %.2f s (%u thread%s)",
                 p->label, (double)p->size / (1024.0 * 1024.0 * 1024.0),
                 (double)(clock_now_ms() - p->start_ms) / 1000.0, p->nthreads,
                 p->nthreads == 1 ? "" : "s");
    }
    pthread_mutex_unlock(&p->mu);
}

static void chunk_failed(struct populate *p, uint64_t off, uint64_t len, int err)
{
    pthread_mutex_lock(&p->mu);
    if (!atomic_exchange(&p->failed, true)) {
        errmsg_set(p->why, sizeof p->why, "cannot reserve %llu bytes at offset %llu: %s",
                   (unsigned long long)len, (unsigned long long)off, strerror(err));
        atomic_store(&p->end_ms, clock_now_ms());
        atomic_store(&p->state, POPULATE_FAILED);
        log_warn("populate: %s host memory stays at %llu of %llu bytes (blocks are placed only "
                 "there; free memory or lower memory.host_bytes and restart): %s", p->label,
                 (unsigned long long)atomic_load(&p->reserved), (unsigned long long)p->size,
                 p->why);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Reserve [off, off+len), on the NUMA node the plan gives it (hugetlbfs
 * allocates by the thread's policy). 0 or errno. */
static int reserve_range(struct populate *p, int *policy, uint64_t off, uint64_t len)
{
    while (len > 0) {
        uint64_t end = numa_region_end(&p->plan, off);
        uint64_t part = end - off < len ? end - off : len;
        int err = numa_thread_policy(&p->plan, off, policy);
        if (err)
            log_warn("populate: %s host memory at offset %llu: cannot set the thread's NUMA "
                     "policy (%s); the kernel's default applies", p->label,
                     (unsigned long long)off, strerror(err));
        if (p->by_fault || fallocate(p->fd, 0, (off_t)off, (off_t)part) != 0) {
            if (!p->by_fault && errno != EOPNOTSUPP)
                return errno;
            if ((err = populate_pages(p->base + off, part)) != 0)
                return err;
        }
        off += part;
        len -= part;
    }
    return 0;
}

/* Reserve chunk i; 0, or -1 when it cannot be had (the job is then
 * FAILED). pw: the worker that beats and is slowed (NULL: the synchronous
 * first chunk, on the caller's thread, whose policy is put back). */
static int do_chunk(struct populate *p, struct populate_worker *pw, uint64_t i)
{
    uint64_t off = chunk_start(p, i), len = chunk_end(p, i) - off;
    int own_policy = NUMA_THREAD_UNSET;
    if (p->fail_at && off + len > p->fail_at) {
        chunk_failed(p, off, len, ENOSPC);
        return -1;
    }
    int err = reserve_range(p, pw ? &pw->policy : &own_policy, off, len);
    if (!pw && own_policy != NUMA_THREAD_UNSET && own_policy != NUMA_THREAD_DEFAULT)
        numa_thread_policy(NULL, 0, &own_policy);
    if (err) {
        chunk_failed(p, off, len, err);
        return -1;
    }
    if (pw) {
        liveness_heartbeat(pw->w);
        if (p->delay_ms)
            sleep_beating(pw, p->delay_ms);
    }
    chunk_done(p, i);
    return 0;
}

static void *populate_main(void *arg)
{
    struct populate_worker *pw = arg;
    struct populate *p = pw->p;

    pthread_setname_np(pthread_self(), POPULATE_THREAD_NAME);
    liveness_heartbeat(pw->w);
    while (!atomic_load(&p->stop) && !atomic_load(&p->failed)) {
        uint64_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->nchunks || do_chunk(p, pw, i) < 0)
            break;
    }
    liveness_unregister(pw->w);
    pw->w = NULL;
    return NULL;
}

int populate_start(struct arena *a, const struct numa_plan *plan, unsigned threads, const char *label,
                   struct populate **out, char *why, size_t whylen)
{
    long page = sysconf(_SC_PAGESIZE);
    struct populate *p;
    sigset_t all, old;

    *out = NULL;
    if (page <= 0)
        page = 4096;
    /* Huge pages: fallocate and MADV_POPULATE_WRITE of a hugetlb mapping
     * work in whole huge pages only. */
    if (arena_page_size(a) > (uint64_t)page)
        page = (long)arena_page_size(a);
    if (!(p = calloc(1, sizeof *p))) {
        errmsg_set(why, whylen, "populate: out of memory");
        return -KVNODE_ENOMEM;
    }
    p->a = a;
    p->fd = arena_fd(a);
    p->base = arena_base(a);
    p->size = arena_size(a);
    p->chunk = env_u64("KVNODE_POPULATE_SIM_CHUNK_BYTES", POPULATE_CHUNK_BYTES);
    if (p->chunk == 0 || p->chunk % (uint64_t)page != 0)
        p->chunk = POPULATE_CHUNK_BYTES;
    if (p->chunk % (uint64_t)page != 0)   /* 1GiB pages */
        p->chunk = (uint64_t)page;
    p->delay_ms = env_u64("KVNODE_POPULATE_SIM_DELAY_MS", 0);
    p->fail_at = env_u64("KVNODE_POPULATE_SIM_FAIL_AT_BYTES", 0);
    p->first = p->chunk < POPULATE_FIRST_BYTES ? p->chunk : POPULATE_FIRST_BYTES;
    if (p->first % (uint64_t)page != 0)
        p->first = (uint64_t)page;
    if (p->first > p->size)
        p->first = p->size;
    p->nchunks = 1 + (p->size - p->first + p->chunk - 1) / p->chunk;
    p->start_ms = clock_now_ms();
    p->by_fault = strcmp(arena_huge_pages(a), "thp") == 0;
    if (plan)
        p->plan = *plan;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->nthreads = threads < 1 ? 1 : threads > POPULATE_MAX_THREADS ? POPULATE_MAX_THREADS : threads;
    if (p->nthreads > p->nchunks - 1 && p->nchunks > 1)
        p->nthreads = (unsigned)(p->nchunks - 1);
    atomic_init(&p->next, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->failed, false);
    atomic_init(&p->state, POPULATE_RUNNING);
    atomic_init(&p->reserved, 0);
    atomic_init(&p->end_ms, 0);
    pthread_mutex_init(&p->mu, NULL);
    if (!(p->done = calloc(p->nchunks, sizeof *p->done))) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        errmsg_set(why, whylen, "populate: out of memory");
        return -KVNODE_ENOMEM;
    }
    for (uint64_t i = 0; i < p->nchunks; i++)
        atomic_init(&p->done[i], false);
    /* The first chunk now: a failure leaves the job FAILED, not the start. */
    atomic_store(&p->next, 1);
    if (do_chunk(p, NULL, 0) < 0 || p->nchunks == 1) {
        p->nthreads = 0;
        *out = p;
        return 0;
    }

    /* Threads inherit a mask blocking every signal: they are the loop's. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    unsigned started = 0;
    for (; started < p->nthreads; started++) {
        struct populate_worker *pw = &p->workers[started];
        pw->p = p;
        pw->policy = NUMA_THREAD_UNSET;
        pw->w = liveness_register(POPULATE_THREAD_NAME);
        int rc = pthread_create(&pw->tid, NULL, populate_main, pw);
        if (rc != 0) {
            liveness_unregister(pw->w);
            if (started == 0) {
                pthread_sigmask(SIG_SETMASK, &old, NULL);
                errmsg_set(why, whylen, "populate: cannot start a thread: %s", strerror(rc));
                free(p->done);
                pthread_mutex_destroy(&p->mu);
                free(p);
                return -KVNODE_ENOMEM;
            }
            break;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    p->nthreads = started;
    *out = p;
    return 0;
}

void populate_progress(struct populate *p, struct populate_progress *out)
{
    memset(out, 0, sizeof *out);
    if (!p) {
        out->state = POPULATE_DONE;
        return;
    }
    out->state = atomic_load(&p->state);
    out->reserved_bytes = atomic_load(&p->reserved);
    out->total_bytes = p->size;
    uint64_t end = atomic_load(&p->end_ms);
    out->seconds = (double)((end ? end : clock_now_ms()) - p->start_ms) / 1000.0;
    if (out->state == POPULATE_FAILED) {
        pthread_mutex_lock(&p->mu);
        memcpy(out->why, p->why, sizeof out->why);
        pthread_mutex_unlock(&p->mu);
    }
}

void populate_stop(struct populate *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, true);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->workers[i].tid, NULL);
    if (atomic_load(&p->state) == POPULATE_RUNNING) {
        atomic_store(&p->state, POPULATE_STOPPED);
        log_info("populate: %s host memory: stopped after %llu of %llu bytes", p->label,
                 (unsigned long long)atomic_load(&p->reserved), (unsigned long long)p->size);
    }
    free(p->done);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
