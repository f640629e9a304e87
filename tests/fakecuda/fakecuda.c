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

#include "fakecuda_internal.h"

struct fc_state fc = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
};

/* ---- configuration -------------------------------------------------------- */

unsigned long long fc_hash(const char *s)
{
    unsigned long long h = 1469598103934665603ULL;

    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ULL;
    return h;
}

/* Comma list of small integers into out[]; missing entries stay as they are. */
static void parse_int_list(const char *s, int *out, int max)
{
    int i = 0;

    while (s && *s && i < max) {
        char *end;
        long v = strtol(s, &end, 10);

        if (end != s)
            out[i] = (int)v;
        i++;
        s = strchr(s, ',');
        if (s)
            s++;
    }
}

static bool load_config(struct fc_config *c)
{
    const char *dir = getenv("FAKECUDA_DIR");
    const char *devs = getenv("FAKECUDA_DEVICES");
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    const char *s;
    int modes[FC_MAX_DEVICES] = { 0 }, migs[FC_MAX_DEVICES] = { 0 };
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
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    if (!devs || !*devs)
        devs = "0000:3B:00.0,0000:5E:00.0";
    for (s = devs; s && *s && c->nphys < FC_MAX_DEVICES;) {
        struct fc_phys *p = &c->phys[c->nphys];

        if (sscanf(s, "%x:%x:%x.%x", &p->domain, &p->bus, &p->dev, &p->fn) != 4) {
            fprintf(stderr, "fakecuda: FAKECUDA_DEVICES entry '%.*s' is not a PCI bus id\n",
                    (int)strcspn(s, ","), s);
            return false;
        }
        c->nphys++;
        s = strchr(s, ',');
        if (s)
            s++;
    }
    parse_int_list(getenv("FAKECUDA_COMPUTE_MODE"), modes, FC_MAX_DEVICES);
    parse_int_list(getenv("FAKECUDA_MIG"), migs, FC_MAX_DEVICES);
    for (i = 0; i < c->nphys; i++) {
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
            long v;
            int j;

            while (isspace((unsigned char)*s))
                s++;
            v = strtol(s, &end, 10);
            if (end == s || v < 0 || v >= c->nphys)
                break;
            for (j = 0; j < c->nvis && c->vis[j] != v; j++) {}
            if (j < c->nvis)
                break;
            c->vis[c->nvis++] = (int)v;
            s = end;
            while (isspace((unsigned char)*s))
                s++;
            if (*s != ',')
                break;
            s++;
        }
    }
    s = getenv("FAKECUDA_BUSID_FORMAT");
    c->busid_format = !s || !strcmp(s, "upper") ? 0 : !strcmp(s, "lower") ? 1 : !strcmp(s, "nvsmi") ? 2 : 0;
    s = getenv("FAKECUDA_DRIVER_VERSION");
    c->driver_version = s && *s ? atoi(s) : 12080;
    s = getenv("FAKECUDA_NO_VMM");
    c->no_vmm = s && !strcmp(s, "1");
    s = getenv("FAKECUDA_MEM_BYTES");
    c->mem_bytes = s && *s ? strtoull(s, NULL, 10) : (1ULL << 30);
    s = getenv("FAKECUDA_PIDNS");
    if (s && *s)
        c->pidns = fc_hash(s);
    else
        c->pidns = stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    s = getenv("FAKECUDA_COPY_DELAY_MS");
    c->delay_ms = s && *s ? (unsigned)strtoul(s, NULL, 10) : 0;
    s = getenv("FAKECUDA_FAIL");
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
    pthread_mutex_init(&fc.lock, NULL);
    pthread_cond_init(&fc.cv, NULL);
    fc.loaded = false;
    fc.cfg_ok = false;
    fc.drv_inited = false;
    fc.gen++;
    memset(fc.ctx, 0, sizeof fc.ctx);
    fc_stream_fork_reset();
    fc_mem_fork_reset();
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
        for (i = 0; i < FC_MAX_DEVICES; i++)
            fc.ctx[i].phys = i;
        fc.loaded = true;
    }
    pthread_mutex_unlock(&fc.lock);
    return fc.cfg_ok;
}

CUresult fc_enter(const char *name, bool need_init)
{
    char key[80];
    size_t n;

    if (!fc_load())
        return need_init ? FC_ERR_NOT_INITIALIZED : FC_ERR_NO_DEVICE;
    snprintf(key, sizeof key, ",%s,", name);
    if (strstr(fc.cfg.fail, key))
        return FC_ERR_UNKNOWN;
    n = strlen(name);
    if (n > 3 && !strcmp(name + n - 3, "_v2")) {
        snprintf(key, sizeof key, ",%.*s,", (int)(n - 3), name);
        if (strstr(fc.cfg.fail, key))
            return FC_ERR_UNKNOWN;
    }
    if (need_init && !fc.drv_inited)
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

/* Alive and not a zombie (a child that exited but was not reaped yet holds
 * nothing on a real GPU either). */
bool fc_pid_alive(pid_t pid)
{
    char p[64], buf[256];
    FILE *f;
    char *rp;
    bool alive = false;

    if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM))
        return false;
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    f = fopen(p, "re");
    if (!f)
        return true;
    if (fgets(buf, sizeof buf, f) && (rp = strrchr(buf, ')')) && rp[1] == ' ')
        alive = rp[2] != 'Z' && rp[2] != 'X';
    fclose(f);
    return alive;
}

void fc_violation(const char *rule, const char *fmt, ...)
{
    char line[1024], p[PATH_MAX];
    va_list ap;
    int n, fd;

    n = snprintf(line, sizeof line, "pid=%d rule=%s ", (int)getpid(), rule);
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

static const struct {
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

CUresult cuGetErrorString(CUresult error, const char **str)
{
    size_t i;

    if (!str)
        return FC_ERR_INVALID_VALUE;
    for (i = 0; i < NERRORS; i++)
        if (errors[i].code == error && error != 21) {
            *str = errors[i].text;
            return FC_SUCCESS;
        }
    *str = NULL;
    return FC_ERR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **str)
{
    size_t i;

    if (!str)
        return FC_ERR_INVALID_VALUE;
    for (i = 0; i < NERRORS; i++)
        if (errors[i].code == error && error != 21) {
            *str = errors[i].drv;
            return FC_SUCCESS;
        }
    *str = NULL;
    return FC_ERR_INVALID_VALUE;
}

const char *cudaGetErrorString(cudaError_t error)
{
    size_t i;

    for (i = 0; i < NERRORS; i++)
        if (errors[i].code == error)
            return errors[i].text;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error)
{
    size_t i;

    for (i = 0; i < NERRORS; i++)
        if (errors[i].code == error)
            return errors[i].rt;
    return "unrecognized error code";
}
/* ---- test-only helpers -------------------------------------------------------------- */

static int count_lines(const char *rule)
{
    const char *dir = getenv("FAKECUDA_DIR");
    char p[PATH_MAX], line[1200], key[96];
    FILE *f;
    int n = 0;

    if (!dir)
        return -1;
    snprintf(p, sizeof p, "%s/violations", dir);
    f = fopen(p, "re");
    if (!f)
        return errno == ENOENT ? 0 : -1;
    snprintf(key, sizeof key, " rule=%s ", rule ? rule : "");
    while (fgets(line, sizeof line, f))
        if (!rule || strstr(line, key))
            n++;
    fclose(f);
    return n;
}

int fakecuda_violations(void)
{
    return count_lines(NULL);
}

int fakecuda_violations_of(const char *rule)
{
    return count_lines(rule);
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
        int ph, p;

        if (sscanf(de->d_name, "ctx-%d-%d", &ph, &p) != 2)
            continue;
        if (physical >= 0 && ph != physical)
            continue;
        if (pid > 0 ? p == (int)pid : fc_pid_alive((pid_t)p))
            n++;
    }
    closedir(d);
    return n;
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
