/* devmem sim backend (see devmem.h): host memory stands in for device
 * memory. A region is a sealed memfd, set up like the host arena's
 * (arena_create_host), so clients map HBM-tier regions the same way they
 * map the host arena; copies are memcpy on the calling thread.
 *
 * The variables are read once, at open: the workers that sleep on them
 * never call getenv, which races with setenv in tests.
 * KVNODE_DEVMEM_SIM_STICKY_DIR names a folder where a file sticky-<device>
 * gives that device a sticky error (as CUDA's illegal address, 700) at its
 * next copy: the device is down from then on (devmem_device_down). */
#include "gpu/devmem_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"

#define SIM_DELAY_MAX_MS 60000u

struct sim_devmem {
    struct devmem base;
    unsigned pin_delay_ms;
    unsigned copy_delay_ms;
    char sticky_dir[512];   /* "" : no simulated sticky errors */
    /* Per device: 1 once down; down_why is written before (release). */
    atomic_int down[DEVMEM_SIM_DEVICES];
    char down_why[DEVMEM_SIM_DEVICES][700];
    pthread_mutex_t down_lock;
};

struct sim_stream {
    struct devmem_stream base;
};

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Unset or empty: 0. Otherwise decimal digits only, at most SIM_DELAY_MAX_MS. */
static int parse_delay(const char *name, unsigned *out, char *why, size_t whylen)
{
    const char *v = getenv(name);
    unsigned long n = 0;

    *out = 0;
    if (!v || !*v)
        return 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9' || n > SIM_DELAY_MAX_MS) {
            n = SIM_DELAY_MAX_MS + 1;
            break;
        }
        n = n * 10 + (unsigned long)(*p - '0');
    }
    if (n > SIM_DELAY_MAX_MS) {
        errmsg_set(why, whylen, "devmem sim: %s=\"%.32s\" is not a delay in milliseconds (0..%u)",
                   name, v, SIM_DELAY_MAX_MS);
        return -KVNODE_EINVAL;
    }
    *out = (unsigned)n;
    return 0;
}

/* -KVNODE_EIO once the device is down, or now goes down: sticky-<device>
 * exists. Every copy call on a device asks first. */
static int sim_sticky(struct devmem *dm, int device, char *why, size_t whylen)
{
    struct sim_devmem *s = (struct sim_devmem *)dm;
    char path[600];

    if (!s->sticky_dir[0])
        return 0;
    if (!atomic_load_explicit(&s->down[device], memory_order_acquire)) {
        snprintf(path, sizeof path, "%s/sticky-%d", s->sticky_dir, device);
        if (access(path, F_OK) != 0)
            return 0;
        pthread_mutex_lock(&s->down_lock);
        if (!atomic_load(&s->down[device])) {
            snprintf(s->down_why[device], sizeof s->down_why[device],
                     "an illegal memory access was encountered (sticky error 700, simulated by %s)",
                     path);
            atomic_store_explicit(&s->down[device], 1, memory_order_release);
        }
        pthread_mutex_unlock(&s->down_lock);
    }
    errmsg_set(why, whylen, "devmem sim: GPU %d is down: %s", device, s->down_why[device]);
    return -KVNODE_EIO;
}

static bool sim_device_down(struct devmem *dm, int device, char *why, size_t whylen)
{
    struct sim_devmem *s = (struct sim_devmem *)dm;

    if (!atomic_load_explicit(&s->down[device], memory_order_acquire))
        return false;
    errmsg_set(why, whylen, "%s", s->down_why[device]);
    return true;
}

static void sim_close(struct devmem *dm)
{
    pthread_mutex_destroy(&((struct sim_devmem *)dm)->down_lock);
    free(dm);
}

static int sim_region_alloc(struct devmem *dm, int device, uint64_t bytes, struct devmem_region *out,
                            char *why, size_t whylen)
{
    int rc = -KVNODE_EIO;
    int fd;
    void *base;

    (void)dm;
    fd = memfd_create("kvnode-hbm-sim", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        errmsg_set(why, whylen, "devmem sim: memfd_create: %s", strerror(errno));
        return -KVNODE_EIO;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        errmsg_set(why, whylen, "devmem sim: ftruncate memfd to %llu bytes: %s",
                   (unsigned long long)bytes, strerror(errno));
        goto fail;
    }
    /* Reserve the pages now, as real device memory would be: a shortage
     * fails here, not on a later copy. */
    if (fallocate(fd, 0, 0, (off_t)bytes) != 0) {
        rc = errno == ENOSPC || errno == ENOMEM ? -KVNODE_ENOMEM : -KVNODE_EIO;
        errmsg_set(why, whylen, "devmem sim: cannot reserve %llu bytes for device %d: %s",
                   (unsigned long long)bytes, device, strerror(errno));
        goto fail;
    }
    /* Clients map the fd: its size must never change under them. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        errmsg_set(why, whylen, "devmem sim: sealing memfd: %s", strerror(errno));
        goto fail;
    }
    base = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        if (errno == ENOMEM)
            rc = -KVNODE_ENOMEM;
        errmsg_set(why, whylen, "devmem sim: mmap of %llu bytes: %s", (unsigned long long)bytes,
                   strerror(errno));
        goto fail;
    }
    out->device = device;
    out->base = base;
    out->size = bytes;
    out->fd = fd;
    out->ipc_len = 0;
    out->host_access = true;
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "sim:%d", device);
    return 0;

fail:
    close(fd);
    return rc;
}

static void sim_region_free(struct devmem *dm, struct devmem_region *r)
{
    (void)dm;
    munmap(r->base, (size_t)r->size);
    if (r->fd >= 0)
        close(r->fd);
}

static int sim_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen)
{
    struct sim_devmem *s = (struct sim_devmem *)dm;

    (void)ptr;
    (void)len;
    (void)why;
    (void)whylen;
    if (s->pin_delay_ms)
        sleep_ms(s->pin_delay_ms);
    return 0;
}

static void sim_host_unregister(struct devmem *dm, void *ptr)
{
    (void)dm;
    (void)ptr;
}

static int sim_stream_create(struct devmem *dm, int device, struct devmem_stream **out,
                             char *why, size_t whylen)
{
    struct sim_stream *s;
    int rc = sim_sticky(dm, device, why, whylen);

    if (rc < 0)
        return rc;
    s = calloc(1, sizeof(*s));
    if (!s) {
        errmsg_set(why, whylen, "devmem sim: out of memory for a stream on device %d", device);
        return -KVNODE_ENOMEM;
    }
    *out = &s->base;
    return 0;
}

static void sim_stream_destroy(struct devmem_stream *s)
{
    free(s);
}

static int sim_copy_async(struct devmem_stream *s, void *dst, const void *src, size_t len,
                          char *why, size_t whylen)
{
    int rc = sim_sticky(s->dm, s->device, why, whylen);

    if (rc < 0)
        return rc;
    memcpy(dst, src, len);
    return 0;
}

static int sim_stream_wait(struct devmem_stream *s, char *why, size_t whylen)
{
    struct sim_devmem *dm = (struct sim_devmem *)s->dm;

    if (dm->copy_delay_ms)
        sleep_ms(dm->copy_delay_ms);
    return sim_sticky(s->dm, s->device, why, whylen);
}

static int sim_copy_to_host(struct devmem *dm, int device, void *dst, const void *src, size_t len,
                            char *why, size_t whylen)
{
    int rc = sim_sticky(dm, device, why, whylen);

    if (rc < 0)
        return rc;
    memcpy(dst, src, len);
    return 0;
}

static const struct devmem_ops sim_ops = {
    .kind = DEVMEM_SIM,
    .close = sim_close,
    .region_alloc = sim_region_alloc,
    .region_free = sim_region_free,
    .host_register = sim_host_register,
    .host_unregister = sim_host_unregister,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .copy_async = sim_copy_async,
    .stream_wait = sim_stream_wait,
    .copy_to_host = sim_copy_to_host,
    .device_down = sim_device_down,
};

int devmem_sim_open(struct devmem **out, char *why, size_t whylen)
{
    struct sim_devmem *s;
    unsigned pin_ms, copy_ms;
    int rc;

    if ((rc = parse_delay("KVNODE_DEVMEM_SIM_PIN_DELAY_MS", &pin_ms, why, whylen)) < 0 ||
        (rc = parse_delay("KVNODE_DEVMEM_SIM_COPY_DELAY_MS", &copy_ms, why, whylen)) < 0)
        return rc;
    const char *sticky = getenv("KVNODE_DEVMEM_SIM_STICKY_DIR");
    if (sticky && strlen(sticky) >= sizeof s->sticky_dir) {
        errmsg_set(why, whylen, "devmem sim: KVNODE_DEVMEM_SIM_STICKY_DIR is longer than %zu bytes",
                   sizeof s->sticky_dir - 1);
        return -KVNODE_EINVAL;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        errmsg_set(why, whylen, "devmem sim: out of memory");
        return -KVNODE_ENOMEM;
    }
    pthread_mutex_init(&s->down_lock, NULL);
    s->base.ops = &sim_ops;
    s->base.ndev = DEVMEM_SIM_DEVICES;
    s->pin_delay_ms = pin_ms;
    s->copy_delay_ms = copy_ms;
    snprintf(s->sticky_dir, sizeof s->sticky_dir, "%s", sticky ? sticky : "");
    *out = &s->base;
    return 0;
}
