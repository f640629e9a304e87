/* fakecuda.c: the strict fake CUDA's configuration (environment, read once per
 * process), what a fork child starts from, the files it shares with other
 * processes in $FAKECUDA_DIR (the directory lock, violations), error strings
 * and the test-only helpers. See GPU28.md part A and tests/fakecuda/fakecuda.h. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda_env.h"
#include "fakecuda_internal.h"

struct fc_state fc = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .live_fd = -1,
};

/* ---- configuration -------------------------------------------------------- */

unsigned long long fc_hash(const char *s)
{
    unsigned long long h = 1469598103934665603ULL;

    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ULL;
    return h;
}

/* The environment is input from outside: a bad value is refused with a
 * message naming it (and the fake then has no devices). */

/* An unsigned number from variable name (def when unset or empty). */
static bool env_number(const char *name, unsigned long long def, unsigned long long max,
                       unsigned long long *out)
{
    const char *s = getenv(name);
    char *end;

    *out = def;
    if (!s || !*s)
        return true;
    errno = 0;
    *out = strtoull(s, &end, 10);
    if (errno || *end || *s == '-' || *out > max) {
        fprintf(stderr, "fakecuda: %s=%s is not a number from 0 to %llu: no devices\n", name, s, max);
        return false;
    }
    return true;
}

/* A comma list of per-device values from 0 to max (missing ones 0). */
static bool env_list(const char *name, int max, int *out, int n)
{
    const char *s = getenv(name), *p;
    int i = 0;

    for (p = s; p && *p; i++) {
        char *end;
        long v = strtol(p, &end, 10);

        if (end == p || v < 0 || v > max || (*end && *end != ',') || i >= n) {
            fprintf(stderr, "fakecuda: %s=%s: entry %d is not a number from 0 to %d (one per device, "
                    "at most %d): no devices\n", name, s, i + 1, max, n);
            return false;
        }
        out[i] = (int)v;
        p = *end ? end + 1 : end;
    }
    return true;
}

static bool load_config(struct fc_config *c)
{
    const char *dir = getenv("FAKECUDA_DIR");
    const char *devs = getenv("FAKECUDA_DEVICES");
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    const char *s;
    int modes[FC_MAX_DEVICES] = { 0 }, migs[FC_MAX_DEVICES] = { 0 };
    unsigned long long v;
    struct stat st;
    int i;

    memset(c, 0, sizeof *c);
    if (!dir || !*dir || strlen(dir) >= sizeof c->dir) {
        fprintf(stderr, "fakecuda: FAKECUDA_DIR is not set (or too long): no devices\n");
        return false;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "fakecuda: FAKECUDA_DIR=%s is not a directory: no devices\n", dir);
        return false;
    }
    {
        /* Absolute, so a process that changes directory keeps its state. */
        char *abs = realpath(dir, NULL);

        if (!abs || strlen(abs) >= sizeof c->dir) {
            fprintf(stderr, "fakecuda: FAKECUDA_DIR=%s: cannot resolve it: no devices\n", dir);
            free(abs);
            return false;
        }
        snprintf(c->dir, sizeof c->dir, "%s", abs);
        free(abs);
    }
    if (!devs || !*devs)
        devs = "0000:3B:00.0,0000:5E:00.0";
    for (s = devs; *s;) {
        struct fc_phys *p = &c->phys[c->nphys];
        int used = 0;

        if (c->nphys == FC_MAX_DEVICES ||
            sscanf(s, "%x:%x:%x.%x%n", &p->domain, &p->bus, &p->dev, &p->fn, &used) != 4 ||
            (s[used] && s[used] != ',') || p->bus > 0xff || p->dev > 0x1f || p->fn > 7) {
            fprintf(stderr, "fakecuda: FAKECUDA_DEVICES entry '%.*s' is not a PCI bus id "
                    "(domain:bus:device.function, at most %d): no devices\n",
                    (int)strcspn(s, ","), s, FC_MAX_DEVICES);
            return false;
        }
        c->nphys++;
        s += used;
        if (*s == ',')
            s++;
    }
    if (!env_list("FAKECUDA_COMPUTE_MODE", 3, modes, c->nphys) || !env_list("FAKECUDA_MIG", 1, migs, c->nphys))
        return false;
    for (i = 0; i < c->nphys; i++) {
        if (modes[i] == 1) {
            fprintf(stderr, "fakecuda: FAKECUDA_COMPUTE_MODE: 1 (exclusive thread) no longer exists; "
                    "use 0, 2 or 3: no devices\n");
            return false;
        }
        c->phys[i].compute_mode = modes[i];
        c->phys[i].mig = migs[i] != 0;
    }
    if (!vis) {
        for (i = 0; i < c->nphys; i++)
            c->vis[c->nvis++] = i;
    } else {
        /* As CUDA does: the list ends at the first entry that is not a
         * valid index (or repeats one). */
        for (s = vis; *s && c->nvis < FC_MAX_DEVICES;) {
            char *end;
            long n;
            int j;

            while (isspace((unsigned char)*s))
                s++;
            n = strtol(s, &end, 10);
            if (end == s || n < 0 || n >= c->nphys)
                break;
            for (j = 0; j < c->nvis && c->vis[j] != n; j++) {}
            if (j < c->nvis)
                break;
            c->vis[c->nvis++] = (int)n;
            s = end;
            while (isspace((unsigned char)*s))
                s++;
            if (*s != ',')
                break;
            s++;
        }
    }
    s = getenv("FAKECUDA_BUSID_FORMAT");
    if (!s || !*s || !strcmp(s, "upper")) {
        c->busid_format = 0;
    } else if (!strcmp(s, "lower")) {
        c->busid_format = 1;
    } else if (!strcmp(s, "nvsmi")) {
        c->busid_format = 2;
    } else {
        fprintf(stderr, "fakecuda: FAKECUDA_BUSID_FORMAT=%s is not upper, lower or nvsmi: no devices\n", s);
        return false;
    }
    if (!env_number("FAKECUDA_DRIVER_VERSION", 12080, 1000000, &v))
        return false;
    c->driver_version = (int)v;
    if (!env_number("FAKECUDA_NO_VMM", 0, 1, &v))
        return false;
    c->no_vmm = v == 1;
    if (!env_number("FAKECUDA_MEM_BYTES", 1ULL << 30, 1ULL << 50, &c->mem_bytes))
        return false;
    if (!env_number("FAKECUDA_COPY_DELAY_MS", 0, 600000, &v))
        return false;
    c->delay_ms = (unsigned)v;
    s = getenv("FAKECUDA_PIDNS");
    if (s && *s)
        c->pidns = fc_hash(s);
    else
        c->pidns = stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    s = getenv("FAKECUDA_FAIL");
    if (s && strlen(s) + 3 > sizeof c->fail) {
        fprintf(stderr, "fakecuda: FAKECUDA_FAIL is longer than %zu characters: no devices\n", sizeof c->fail - 3);
        return false;
    }
    snprintf(c->fail, sizeof c->fail, ",%s,", s ? s : "");
    return true;
}

static void fork_prepare(void)
{
    pthread_mutex_lock(&fc.lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&fc.lock);
}

/* A fork child starts as a new process would: no contexts, streams,
 * allocations or registrations of its own (the parent's stay reachable in
 * graveyards), and the environment is read again at its first call. */
static void fork_child(void)
{
    /* This thread took fc.lock in fork_prepare: it owns it here too. The
     * condition variable may count waiters that are not in this process. */
    pthread_mutex_unlock(&fc.lock);
    pthread_cond_init(&fc.cv, NULL);
    fc.loaded = false;
    fc.cfg_ok = false;
    fc.drv_inited = false;
    fc.gen++;
    /* The parent's liveness lock is shared with this copy of its fd: let
     * go of it, or the parent would live as long as this child. */
    if (fc.live_fd >= 0)
        close(fc.live_fd);
    fc.live_fd = -1;
    fc.self_pid = 0;
    fc.self_key[0] = '\0';
    memset(fc.ctx, 0, sizeof fc.ctx);
    fc_stream_fork_reset();
    fc_mem_fork_reset();
}

/* This process's outer pid and start time, and its live-<key> lock. */
static void identity(void)
{
    char buf[1024];
    unsigned long long start = 0;
    FILE *f;
    char *rp;
    int i;

    fc.self_pid = (int)getpid();
    f = fopen("/proc/self/status", "re");
    if (f) {
        while (fgets(buf, sizeof buf, f))
            if (!strncmp(buf, "NSpid:", 6)) {
                fc.self_pid = atoi(buf + 6);
                break;
            }
        fclose(f);
    }
    f = fopen("/proc/self/stat", "re");
    if (f) {
        if (fgets(buf, sizeof buf, f) && (rp = strrchr(buf, ')'))) {
            /* Field 22 (starttime); rp is at the end of field 2. */
            for (i = 2; i < 22 && rp; i++)
                rp = strchr(rp + 1, ' ');
            if (rp)
                start = strtoull(rp + 1, NULL, 10);
        }
        fclose(f);
    }
    snprintf(fc.self_key, sizeof fc.self_key, "%d.%llu", fc.self_pid, start);
    if (fc.cfg_ok) {
        char p[PATH_MAX];

        fc_path(p, sizeof p, "live-%s", fc.self_key);
        fc.live_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fc.live_fd >= 0)
            while (flock(fc.live_fd, LOCK_SH) != 0 && errno == EINTR) {}
    }
}

bool fc_load(void)
{
    static bool atfork_done;    /* survives fork: the handlers do too */

    pthread_mutex_lock(&fc.lock);
    if (!fc.loaded) {
        int i;

        if (!atfork_done) {
            pthread_atfork(fork_prepare, fork_parent, fork_child);
            atfork_done = true;
        }
        fc.cfg_ok = load_config(&fc.cfg);
        identity();
        for (i = 0; i < FC_MAX_DEVICES; i++)
            fc.ctx[i].phys = i;
        fc.loaded = true;
    }
    pthread_mutex_unlock(&fc.lock);
    return fc.cfg_ok;
}

/* Whether list (",a,b,") names the entry point, or its name without _v2. */
static bool listed(const char *list, const char *name)
{
    char key[80];
    size_t n = strlen(name);

    snprintf(key, sizeof key, ",%s,", name);
    if (strstr(list, key))
        return true;
    if (n > 3 && !strcmp(name + n - 3, "_v2")) {
        snprintf(key, sizeof key, ",%.*s,", (int)(n - 3), name);
        return strstr(list, key) != NULL;
    }
    return false;
}

/* $FAKECUDA_DIR/fail: entry points that fail from now on, changed while
 * processes run (FAKECUDA_FAIL is read once); re-read when it changes. */
static bool fail_file_lists(const char *name)
{
    static struct {
        bool present;
        struct stat st;
        char list[1024];
    } cache;
    char p[PATH_MAX];
    struct stat st;
    bool hit;

    fc_path(p, sizeof p, "fail");
    pthread_mutex_lock(&fc.lock);
    if (stat(p, &st) != 0) {
        cache.present = false;
    } else if (!cache.present || st.st_ino != cache.st.st_ino || st.st_size != cache.st.st_size ||
               st.st_mtim.tv_sec != cache.st.st_mtim.tv_sec || st.st_mtim.tv_nsec != cache.st.st_mtim.tv_nsec) {
        FILE *f = fopen(p, "re");
        size_t n = 0, i;

        cache.list[0] = ',';
        if (f) {
            n = fread(cache.list + 1, 1, sizeof cache.list - 3, f);
            fclose(f);
        }
        for (i = 1; i <= n; i++)
            if (strchr(" \t\r\n", cache.list[i]))
                cache.list[i] = ',';
        cache.list[n + 1] = ',';
        cache.list[n + 2] = '\0';
        cache.st = st;
        cache.present = true;
    }
    hit = cache.present && listed(cache.list, name);
    pthread_mutex_unlock(&fc.lock);
    return hit;
}

CUresult fc_enter(const char *name, bool need_init)
{
    if (!fc_load())
        return need_init ? FC_ERR_NOT_INITIALIZED : FC_ERR_NO_DEVICE;
    if (listed(fc.cfg.fail, name) || fail_file_lists(name))
        return FC_ERR_UNKNOWN;
    /* The runtime initialises the driver (cuInit) on its first call. */
    if (!strncmp(name, "cuda", 4) && fc.cfg.nvis > 0)
        __atomic_store_n(&fc.drv_inited, true, __ATOMIC_RELAXED);
    if (need_init && !__atomic_load_n(&fc.drv_inited, __ATOMIC_RELAXED))
        return FC_ERR_NOT_INITIALIZED;
    return FC_SUCCESS;
}

/* ---- files in $FAKECUDA_DIR ---------------------------------------------- */

int fc_path(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(buf, len, "%s/", fc.cfg.dir);

    if (n < 0 || (size_t)n >= len)
        return -1;
    va_start(ap, fmt);
    n = vsnprintf(buf + n, len - (size_t)n, fmt, ap);
    va_end(ap);
    return n < 0 ? -1 : 0;
}

/* The directory's lock: every read-modify of the shared files holds it.
 * Taken only with fc.lock held, which fork's prepare handler takes too, so
 * no fork child inherits a held flock. */
int fc_dir_lock(void)
{
    char p[PATH_MAX];
    int fd;

    fc_path(p, sizeof p, ".lock");
    fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0)
        while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
    return fd;
}

void fc_dir_unlock(int fd)
{
    if (fd >= 0)
        close(fd);
}

bool fc_key_alive(const char *dir, const char *key)
{
    char p[PATH_MAX];
    bool alive;
    int fd;

    if (!strcmp(key, fc.self_key))
        return true;
    snprintf(p, sizeof p, "%s/live-%s", dir, key);
    fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return false;
    alive = flock(fd, LOCK_EX | LOCK_NB) != 0;
    if (!alive) {
        unlink(p);      /* its owner is gone and the key is never reused */
        flock(fd, LOCK_UN);
    }
    close(fd);
    return alive;
}

void fc_violation(const char *rule, const char *fmt, ...)
{
    char line[1024], p[PATH_MAX];
    va_list ap;
    int n, fd;

    n = snprintf(line, sizeof line, "pid=%d rule=%s ", fc.self_pid ? fc.self_pid : (int)getpid(), rule);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    n = (int)strlen(line);
    line[n++] = '\n';
    fprintf(stderr, "fakecuda: violation: %.*s", n, line);
    if (!fc.cfg_ok)
        return;
    fc_path(p, sizeof p, "violations");
    fd = open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        /* One O_APPEND write per line: lines of several processes never mix. */
        if (write(fd, line, (size_t)n) != n)
            fprintf(stderr, "fakecuda: cannot append to %s\n", p);
        close(fd);
    }
}

/* ---- error strings ---------------------------------------------------------------- */

static const struct fc_error {
    int code;
    const char *drv, *rt, *text;
} errors[] = {
    { 0, "CUDA_SUCCESS", "cudaSuccess", "no error" },
    { 1, "CUDA_ERROR_INVALID_VALUE", "cudaErrorInvalidValue", "invalid argument" },
    { 2, "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation", "out of memory" },
    { 3, "CUDA_ERROR_NOT_INITIALIZED", "cudaErrorInitializationError", "initialization error" },
    { 21, "CUDA_ERROR_INVALID_VALUE", "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy" },
    { 46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "cudaErrorDevicesUnavailable",
      "CUDA-capable device(s) is/are busy or unavailable" },
    { 100, "CUDA_ERROR_NO_DEVICE", "cudaErrorNoDevice", "no CUDA-capable device is detected" },
    { 101, "CUDA_ERROR_INVALID_DEVICE", "cudaErrorInvalidDevice", "invalid device ordinal" },
    { 201, "CUDA_ERROR_INVALID_CONTEXT", "cudaErrorDeviceUninitialized", "invalid device context" },
    { 205, "CUDA_ERROR_MAP_FAILED", "cudaErrorMapBufferObjectFailed", "mapping of buffer object failed" },
    { 208, "CUDA_ERROR_ALREADY_MAPPED", "cudaErrorAlreadyMapped", "resource already mapped" },
    { 400, "CUDA_ERROR_INVALID_HANDLE", "cudaErrorInvalidResourceHandle", "invalid resource handle" },
    { 600, "CUDA_ERROR_NOT_READY", "cudaErrorNotReady", "device not ready" },
    { 700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cudaErrorIllegalAddress",
      "an illegal memory access was encountered" },
    { 712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "cudaErrorHostMemoryAlreadyRegistered",
      "part or all of the requested memory range is already mapped" },
    { 713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "cudaErrorHostMemoryNotRegistered",
      "pointer does not correspond to a registered memory region" },
    { 801, "CUDA_ERROR_NOT_SUPPORTED", "cudaErrorNotSupported", "operation not supported" },
    { 999, "CUDA_ERROR_UNKNOWN", "cudaErrorUnknown", "unknown error" },
};
#define NERRORS (sizeof errors / sizeof errors[0])

/* The row of code, NULL when unknown; the driver API never names 21. */
static const struct fc_error *find_error(int code, bool driver)
{
    size_t i;

    for (i = 0; i < NERRORS; i++)
        if (errors[i].code == code && !(driver && code == 21))
            return &errors[i];
    return NULL;
}

CUresult cuGetErrorString(CUresult error, const char **str)
{
    const struct fc_error *e;

    if (!str)
        return FC_ERR_INVALID_VALUE;
    e = find_error(error, true);
    *str = e ? e->text : NULL;
    return e ? FC_SUCCESS : FC_ERR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **str)
{
    const struct fc_error *e;

    if (!str)
        return FC_ERR_INVALID_VALUE;
    e = find_error(error, true);
    *str = e ? e->drv : NULL;
    return e ? FC_SUCCESS : FC_ERR_INVALID_VALUE;
}

const char *cudaGetErrorString(cudaError_t error)
{
    const struct fc_error *e = find_error(error, false);

    return e ? e->text : "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error)
{
    const struct fc_error *e = find_error(error, false);

    return e ? e->rt : "unrecognized error code";
}

/* ---- test-only helpers -------------------------------------------------------------- */

int fakecuda_violations(void)
{
    return fakecuda_env_violations(NULL);
}

int fakecuda_violations_of(const char *rule)
{
    return fakecuda_env_violations(rule);
}

int fakecuda_context_count(pid_t pid, int physical)
{
    const char *dir = getenv("FAKECUDA_DIR");
    struct dirent *de;
    DIR *d;
    int n = 0;

    if (!dir || !(d = opendir(dir)))
        return -1;
    while ((de = readdir(d))) {
        char p[PATH_MAX], key[48] = "";
        int ph, pi;
        FILE *f;

        if (sscanf(de->d_name, "ctx-%d-%d", &ph, &pi) != 2)
            continue;
        if (physical >= 0 && ph != physical)
            continue;
        if (pid > 0) {
            n += pi == (int)pid;
            continue;
        }
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        f = fopen(p, "re");
        if (f) {
            if (fgets(key, sizeof key, f))
                key[strcspn(key, "\n")] = '\0';
            fclose(f);
        }
        n += key[0] && fc_key_alive(dir, key);
    }
    closedir(d);
    return n;
}

int fakecuda_set_fail(const char *names)
{
    const char *dir = getenv("FAKECUDA_DIR");
    char p[PATH_MAX], tmp[PATH_MAX];
    FILE *f;

    if (!dir)
        return -1;
    snprintf(p, sizeof p, "%s/fail", dir);
    if (!names || !*names)
        return unlink(p) == 0 || errno == ENOENT ? 0 : -1;
    snprintf(tmp, sizeof tmp, "%s/.fail.%d", dir, (int)getpid());
    f = fopen(tmp, "we");
    if (!f)
        return -1;
    fprintf(f, "%s\n", names);
    if (fclose(f) != 0 || rename(tmp, p) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

int fakecuda_make_sticky(int physical)
{
    const char *dir = getenv("FAKECUDA_DIR");
    char p[PATH_MAX];
    int fd;

    if (!dir || physical < 0)
        return -1;
    snprintf(p, sizeof p, "%s/sticky-%d", dir, physical);
    fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}
