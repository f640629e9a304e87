/* devmem_spy: watches the devmem calls the daemon's code makes, for unit
 * tests linked with DEVMEM_SPY_WRAP (Makefile: the linker's --wrap of
 * devmem_host_register, devmem_host_unregister and devmem_copy_async), and
 * checks them against the driver's rule that a copy's host range is wholly
 * inside one registration or outside every one ("copy-straddles-pin" of the
 * strict fake CUDA): a range partly registered, or spanning two
 * registrations, is counted as a violation (the copy still runs: the sim
 * does not refuse it). Copies can also be made to fail, on every device or
 * one. Include in one file of the test binary.
 *
 * Registrations happen on the pinning thread and copies on copy workers:
 * everything here is under one mutex. */
#ifndef KVNODE_TEST_DEVMEM_SPY_H
#define KVNODE_TEST_DEVMEM_SPY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/errmsg.h"
#include "gpu/devmem_internal.h"
#include "kvnode.h"

#define SPY_MAX_REGS 4096

static pthread_mutex_t spy_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { const char *p; size_t len; } spy_regs[SPY_MAX_REGS];
static size_t spy_nregs;
static uint64_t spy_violations;
static char spy_first_violation[256];
static uint64_t spy_copies[DEVMEM_MAX_DEVICES];   /* devmem_copy_async calls per device */
static atomic_int spy_fail_device = -2;            /* -2 none, -1 every device, else that one */

int  __real_devmem_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen);
void __real_devmem_host_unregister(struct devmem *dm, void *ptr);
int  __real_devmem_copy_async(struct devmem_stream *s, void *dst, const void *src, size_t len,
                              char *why, size_t whylen);
int  __wrap_devmem_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen);
void __wrap_devmem_host_unregister(struct devmem *dm, void *ptr);
int  __wrap_devmem_copy_async(struct devmem_stream *s, void *dst, const void *src, size_t len,
                              char *why, size_t whylen);

static inline void spy_reset(void)
{
    pthread_mutex_lock(&spy_mu);
    spy_nregs = 0;
    spy_violations = 0;
    spy_first_violation[0] = '\0';
    memset(spy_copies, 0, sizeof spy_copies);
    pthread_mutex_unlock(&spy_mu);
    atomic_store(&spy_fail_device, -2);
}

int __wrap_devmem_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen)
{
    int rc = __real_devmem_host_register(dm, ptr, len, why, whylen);
    pthread_mutex_lock(&spy_mu);
    if (rc == 0 && spy_nregs < SPY_MAX_REGS) {
        spy_regs[spy_nregs].p = ptr;
        spy_regs[spy_nregs].len = len;
        spy_nregs++;
    }
    pthread_mutex_unlock(&spy_mu);
    return rc;
}

void __wrap_devmem_host_unregister(struct devmem *dm, void *ptr)
{
    pthread_mutex_lock(&spy_mu);
    for (size_t i = 0; i < spy_nregs; i++) {
        if (spy_regs[i].p == ptr) {
            spy_regs[i] = spy_regs[--spy_nregs];
            break;
        }
    }
    pthread_mutex_unlock(&spy_mu);
    __real_devmem_host_unregister(dm, ptr);
}

/* Under spy_mu: [p, p+len) touches registrations without lying inside one. */
static void spy_check_range(const char *what, const char *p, size_t len)
{
    size_t touched = 0, inside = 0;

    for (size_t i = 0; i < spy_nregs; i++) {
        const char *rp = spy_regs[i].p;
        size_t rl = spy_regs[i].len;
        if (p < rp + rl && rp < p + len) {
            touched++;
            if (p >= rp && p + len <= rp + rl)
                inside++;
        }
    }
    if (touched == 0 || (touched == 1 && inside == 1))
        return;
    if (spy_violations++ == 0)
        snprintf(spy_first_violation, sizeof spy_first_violation,
                 "%s %p+%zu touches %zu registrations%s", what, (const void *)p, len, touched,
                 touched == 1 ? " and unregistered memory" : "");
}

int __wrap_devmem_copy_async(struct devmem_stream *s, void *dst, const void *src, size_t len,
                             char *why, size_t whylen)
{
    int fail = atomic_load(&spy_fail_device);
    int dev = s ? s->device : -1;

    pthread_mutex_lock(&spy_mu);
    if (dev >= 0 && dev < DEVMEM_MAX_DEVICES)
        spy_copies[dev]++;
    if (len > 0 && dst && src) {
        spy_check_range("copy destination", dst, len);
        spy_check_range("copy source", src, len);
    }
    pthread_mutex_unlock(&spy_mu);
    if (fail == -1 || (fail >= 0 && fail == dev)) {
        errmsg_set(why, whylen, "devmem spy: copy failure injected on device %d", dev);
        return -KVNODE_EIO;
    }
    return __real_devmem_copy_async(s, dst, src, len, why, whylen);
}

static inline uint64_t spy_violation_count(char *first, size_t len)
{
    pthread_mutex_lock(&spy_mu);
    uint64_t n = spy_violations;
    if (first && len)
        snprintf(first, len, "%s", spy_first_violation);
    pthread_mutex_unlock(&spy_mu);
    return n;
}

static inline uint64_t spy_copy_count(int device)
{
    pthread_mutex_lock(&spy_mu);
    uint64_t n = spy_copies[device];
    pthread_mutex_unlock(&spy_mu);
    return n;
}

#endif
