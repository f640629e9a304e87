/* harness: see harness.h. */
#include "../common/rmtree.h"
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------- */
/* errors */

static _Thread_local char kvh_errbuf[4096];

const char *kvh_error(void) { return kvh_errbuf; }

static void kvh_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void kvh_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvh_errbuf, sizeof kvh_errbuf, fmt, ap);
    va_end(ap);
}

static const char *kvh_connect_error(void)
{
    const char *m = kvnode_connect_error();
    return (m && *m) ? m : "(no message)";
}

/* ------------------------------------------------------------------------- */
/* time */

uint64_t kvh_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvh_now_ms(void) { return kvh_now_ns() / 1000000ull; }

void kvh_sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ------------------------------------------------------------------------- */
/* exit-time cleanup of daemons a failed test left behind */

#define KVH_MAX_DAEMONS 32

struct kvh_reg {
    int   used;
    pid_t pid;                 /* > 0 while not reaped */
    char  dir[PATH_MAX];
    char  log[PATH_MAX];
};

static pthread_mutex_t kvh_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvh_reg kvh_regs[KVH_MAX_DAEMONS];
static pid_t kvh_reg_owner;    /* process that registered (children must not clean up) */
static int kvh_reg_atexit;

static void kvh_print_file(const char *path, const char *why)
{
    fprintf(stderr, "----- %s: %s -----\n", why, path);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "(cannot open: %s)\n", strerror(errno));
    } else {
        char buf[4096];
        size_t n;
        /* Keep the tail readable: skip ahead when the log is huge. */
        if (fseek(f, 0, SEEK_END) == 0) {
            long sz = ftell(f);
            if (sz > 64 * 1024) {
                fseek(f, sz - 64 * 1024, SEEK_SET);
                fprintf(stderr, "(... first %ld bytes skipped ...)\n", sz - 64 * 1024);
            } else {
                fseek(f, 0, SEEK_SET);
            }
        }
        while ((n = fread(buf, 1, sizeof buf, f)) > 0)
            fwrite(buf, 1, n, stderr);
        fclose(f);
    }
    fprintf(stderr, "----- end of log -----\n");
}

/* Every daemon directory lives under one root made when the program starts
 * (before Check forks a process per test), and the starting process removes
 * the root when it exits. Check ends a failed test's process with _exit(),
 * so that process cleans up nothing: its daemons die with it
 * (PR_SET_PDEATHSIG) and their directories are found here, their logs
 * printed, and removed. */
static char kvh_root[PATH_MAX];
static pid_t kvh_root_owner;

static void kvh_root_cleanup(void)
{
    if (getpid() != kvh_root_owner || !kvh_root[0])
        return;
    DIR *dir = opendir(kvh_root);
    if (dir) {
        struct dirent *de;
        while ((de = readdir(dir)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            char log[PATH_MAX + 300];
            snprintf(log, sizeof log, "%s/%s/kvnoded.log", kvh_root, de->d_name);
            if (access(log, R_OK) == 0)
                kvh_print_file(log, "kvnoded log left by a failed or killed test");
        }
        closedir(dir);
    }
    test_rmtree(kvh_root);
    kvh_root[0] = '\0';
}

__attribute__((constructor)) static void kvh_root_init(void)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 64)
        tmp = "/tmp";
    snprintf(kvh_root, sizeof kvh_root, "%s/kvnode-it-XXXXXX", tmp);
    if (!mkdtemp(kvh_root)) {
        kvh_root[0] = '\0';
        return;
    }
    kvh_root_owner = getpid();
    atexit(kvh_root_cleanup);
}

static void kvh_cleanup_at_exit(void)
{
    if (getpid() != kvh_reg_owner)
        return;
    pthread_mutex_lock(&kvh_reg_lock);
    for (int i = 0; i < KVH_MAX_DAEMONS; i++) {
        struct kvh_reg *r = &kvh_regs[i];
        if (!r->used)
            continue;
        if (r->pid > 0) {
            kvh_print_file(r->log, "kvnoded still running at exit (killed)");
            proc_stop(&r->pid, SIGKILL, KVH_STOP_TIMEOUT_MS);
            r->pid = 0;
        }
        test_rmtree(r->dir);
        r->used = 0;
    }
    pthread_mutex_unlock(&kvh_reg_lock);
}

static void kvh_reg_add(kvh_daemon *d)
{
    pthread_mutex_lock(&kvh_reg_lock);
    if (!kvh_reg_atexit || kvh_reg_owner != getpid()) {
        /* A forked test process starts with the parent's table: forget it. */
        if (kvh_reg_owner != getpid())
            memset(kvh_regs, 0, sizeof kvh_regs);
        kvh_reg_owner = getpid();
        if (!kvh_reg_atexit) {
            atexit(kvh_cleanup_at_exit);
            kvh_reg_atexit = 1;
        }
    }
    d->reg = -1;
    for (int i = 0; i < KVH_MAX_DAEMONS; i++) {
        if (!kvh_regs[i].used) {
            kvh_regs[i].used = 1;
            kvh_regs[i].pid = d->pid;
            snprintf(kvh_regs[i].dir, sizeof kvh_regs[i].dir, "%s", d->dir);
            snprintf(kvh_regs[i].log, sizeof kvh_regs[i].log, "%s", d->log);
            d->reg = i;
            break;
        }
    }
    pthread_mutex_unlock(&kvh_reg_lock);
}

static void kvh_reg_update(kvh_daemon *d, int remove_entry)
{
    if (d->reg < 0)
        return;
    pthread_mutex_lock(&kvh_reg_lock);
    struct kvh_reg *r = &kvh_regs[d->reg];
    if (r->used && strcmp(r->dir, d->dir) == 0) {
        r->pid = d->pid;
        if (remove_entry)
            r->used = 0;
    }
    pthread_mutex_unlock(&kvh_reg_lock);
    if (remove_entry)
        d->reg = -1;
}

/* ------------------------------------------------------------------------- */
/* configuration */

struct kvh_kv { char section[64], key[64], value[PATH_MAX]; };

static int kvh_parse_assignments(const char *config, struct kvh_kv *kv, int *n, int max)
{
    const char *p = config ? config : "";
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[PATH_MAX + 256];
        if (len >= sizeof line) {
            kvh_set_error("config line too long");
            return -1;
        }
        memcpy(line, p, len);
        line[len] = '\0';
        p += len + (eol ? 1 : 0);

        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        char *end = s + strlen(s);
        while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
            *--end = '\0';
        if (!*s || *s == '#' || *s == ';')
            continue;
        char *eq = strchr(s, '=');
        /* The last dot before '=': tenant.NAME.key is [tenant.NAME] key. */
        char *dot = eq ? memrchr(s, '.', (size_t)(eq - s)) : NULL;
        if (!eq || !dot) {
            kvh_set_error("config line '%s' is not section.key=value", s);
            return -1;
        }
        *eq = '\0';
        *dot = '\0';
        char *key = dot + 1, *val = eq + 1;
        char *kend = key + strlen(key);
        while (kend > key && (kend[-1] == ' ' || kend[-1] == '\t'))
            *--kend = '\0';
        while (*val == ' ' || *val == '\t')
            val++;
        if (strlen(s) >= sizeof kv[0].section || strlen(key) >= sizeof kv[0].key ||
            strlen(val) >= sizeof kv[0].value) {
            kvh_set_error("config entry %s.%s too long", s, key);
            return -1;
        }
        int i;
        for (i = 0; i < *n; i++)
            if (strcmp(kv[i].section, s) == 0 && strcmp(kv[i].key, key) == 0)
                break;
        if (i == *n) {
            if (*n >= max) {
                kvh_set_error("too many config entries");
                return -1;
            }
            (*n)++;
            memcpy(kv[i].section, s, strlen(s) + 1);     /* lengths checked above */
            memcpy(kv[i].key, key, strlen(key) + 1);
        }
        memcpy(kv[i].value, val, strlen(val) + 1);
    }
    return 0;
}

static int kvh_write_config(kvh_daemon *d, const char *config)
{
    enum { MAXKV = 64 };
    struct kvh_kv *kv = calloc(MAXKV, sizeof *kv);
    int n = 0;
    if (!kv) {
        kvh_set_error("out of memory");
        return -1;
    }
    char defaults[PATH_MAX + 256];
    snprintf(defaults, sizeof defaults,
             "server.socket_path=%s/kvnode.sock\n"
             "memory.host_bytes=64MiB\n"
             "memory.pin_host=off\n"
             /* The same pages whatever the machine offers; huge-page tests opt in. */
             "memory.huge_pages=off\n"
             "log.level=info\n"
             "admin.listen=off\n"
             /* No store unless a test opts in with persist.* assignments. */
             "persist.backend=off\n", d->dir);
    if (kvh_parse_assignments(defaults, kv, &n, MAXKV) != 0 ||
        kvh_parse_assignments(config, kv, &n, MAXKV) != 0) {
        free(kv);
        return -1;
    }

    FILE *f = fopen(d->conf, "w");
    if (!f) {
        kvh_set_error("cannot write %s: %s", d->conf, strerror(errno));
        free(kv);
        return -1;
    }
    fprintf(f, "# generated by tests/integration/harness.c\n");
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i; j++)
            if (strcmp(kv[j].section, kv[i].section) == 0)
                first = 0;
        if (!first)
            continue;
        fprintf(f, "\n[%s]\n", kv[i].section);
        for (int j = i; j < n; j++)
            if (strcmp(kv[j].section, kv[i].section) == 0)
                fprintf(f, "%s = %s\n", kv[j].key, kv[j].value);
    }
    for (int i = 0; i < n; i++)
        if (strcmp(kv[i].section, "server") == 0 && strcmp(kv[i].key, "socket_path") == 0)
            snprintf(d->sock, sizeof d->sock, "%s", kv[i].value);
    free(kv);
    if (fclose(f) != 0) {
        kvh_set_error("cannot write %s: %s", d->conf, strerror(errno));
        return -1;
    }
    return 0;
}

int kvh_rewrite_config(kvh_daemon *d, const char *config)
{
    return kvh_write_config(d, config);
}

/* ------------------------------------------------------------------------- */
/* daemon processes */

const char *kvh_daemon_path(void)
{
    const char *p = getenv("KVNODED");
    return (p && *p) ? p : "build/kvnoded";
}

/* Socket activation: bind and listen on d->sock as systemd would. */
static int kvh_listen_socket(const kvh_daemon *d)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(d->sock) >= sizeof sa.sun_path) {
        kvh_set_error("socket path too long: %s", d->sock);
        return -1;
    }
    memcpy(sa.sun_path, d->sock, strlen(d->sock) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, SOMAXCONN) < 0) {
        kvh_set_error("cannot listen on %s: %s", d->sock, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

int kvh_spawn(kvh_daemon *d, const char *config)
{
    return kvh_spawn_ex(d, config, NULL);
}

int kvh_spawn_ex(kvh_daemon *d, const char *config, const kvh_spawn_opts *opts)
{
    static const kvh_spawn_opts plain = { 0 };
    int lfd = -1;

    if (!opts)
        opts = &plain;
    memset(d, 0, sizeof *d);
    d->status = -1;
    d->reg = -1;

    int dl;
    if (kvh_root[0]) {
        dl = snprintf(d->dir, sizeof d->dir, "%s/d-XXXXXX", kvh_root);
    } else {
        const char *tmp = getenv("TMPDIR");
        dl = snprintf(d->dir, sizeof d->dir, "%s/kvnode-it-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    }
    if (dl < 0 || (size_t)dl >= sizeof d->dir) {
        kvh_set_error("temporary directory path too long");
        d->dir[0] = '\0';
        return -1;
    }
    if (!mkdtemp(d->dir)) {
        kvh_set_error("mkdtemp %s: %s", d->dir, strerror(errno));
        d->dir[0] = '\0';
        return -1;
    }
    int l1 = snprintf(d->conf, sizeof d->conf, "%s/kvnode.conf", d->dir);
    int l2 = snprintf(d->log, sizeof d->log, "%s/kvnoded.log", d->dir);
    if (l1 < 0 || (size_t)l1 >= sizeof d->conf || l2 < 0 || (size_t)l2 >= sizeof d->log) {
        kvh_set_error("temporary directory path too long: %s", d->dir);
        test_rmtree(d->dir);
        return -1;
    }
    if (kvh_write_config(d, config) != 0) {
        test_rmtree(d->dir);
        return -1;
    }

    const char *bin = kvh_daemon_path();
    if (access(bin, X_OK) != 0) {
        kvh_set_error("daemon binary %s not executable (%s); set KVNODED", bin, strerror(errno));
        test_rmtree(d->dir);
        return -1;
    }

    /* Socket activation adds LISTEN_FDS=<n> and LISTEN_PID=<the daemon's pid>
     * to the caller's entries. */
    const char *env[64], *pid_env[16];
    char listen_fds[32];
    size_t ne = 0, np = 0;
    for (size_t i = 0; opts->env && opts->env[i] && ne < 60; i++)
        env[ne++] = opts->env[i];
    for (size_t i = 0; opts->pid_env && opts->pid_env[i] && np < 12; i++)
        pid_env[np++] = opts->pid_env[i];
    if (opts->listen_fds > 0) {
        snprintf(listen_fds, sizeof listen_fds, "LISTEN_FDS=%d", opts->listen_fds);
        env[ne++] = listen_fds;
        pid_env[np++] = "LISTEN_PID";
        if ((lfd = kvh_listen_socket(d)) < 0) {
            test_rmtree(d->dir);
            return -1;
        }
    }
    env[ne] = NULL;
    pid_env[np] = NULL;

    /* stdin /dev/null, stdout and stderr into the log, inherited sockets at
     * 3.., nothing else. */
    const char *argv[] = { bin, "--config", d->conf, NULL };
    struct proc_opts po = {
        .argv = argv,
        .env = ne ? env : NULL,
        .pid_env = np ? pid_env : NULL,
        .in = PROC_NULL,
        .out = PROC_FILE,
        .out_path = d->log,
        .err = PROC_TO_STDOUT,
        .pass_fd = lfd,
        .pass_count = lfd >= 0 ? opts->listen_fds : 0,
        .close_fds = true,
        .nofile = opts->nofile,
    };
    pid_t pid = proc_spawn(&po, NULL);
    if (lfd >= 0)
        close(lfd);
    if (pid < 0) {
        kvh_set_error("cannot start %s: %s", bin, proc_error());
        test_rmtree(d->dir);
        return -1;
    }
    d->pid = pid;
    kvh_reg_add(d);
    return 0;
}

static int kvh_sockaddr(struct sockaddr_un *sa, const char *path)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path, sizeof sa->sun_path, "%s", path);
    if (n < 0 || (size_t)n >= sizeof sa->sun_path) {
        kvh_set_error("socket path too long for AF_UNIX: %s", path);
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

static int kvh_try_connect(const char *path)
{
    struct sockaddr_un sa;
    if (kvh_sockaddr(&sa, path) != 0)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    close(fd);
    return rc;
}

int kvh_wait_exit(kvh_daemon *d, int timeout_ms)
{
    if (d->pid <= 0)
        return d->status;
    pid_t pid = d->pid;
    int ws = proc_wait(&d->pid, timeout_ms);
    if (ws == PROC_TIMEOUT) {
        kvh_set_error("kvnoded (pid %d) did not exit within %d ms", (int)pid, timeout_ms);
        return KVH_EXIT_TIMEOUT;
    }
    if (ws < 0)
        kvh_set_error("%s", proc_error());
    d->status = proc_exit_code(ws);
    kvh_reg_update(d, 0);
    return d->status;
}

int kvh_wait_ready(kvh_daemon *d, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        if (d->pid <= 0) {
            kvh_set_error("kvnoded is not running");
            return -1;
        }
        if (kvh_try_connect(d->sock) == 0)
            return 0;
        int st = kvh_wait_exit(d, 0);
        if (st != KVH_EXIT_TIMEOUT) {
            kvh_set_error("kvnoded exited with status %d before its socket %s was connectable "
                          "(log printed above)", st, d->sock);
            kvh_print_log(d, "kvnoded exited during start");
            return -1;
        }
        if (kvh_now_ms() >= deadline) {
            kvh_set_error("kvnoded socket %s not connectable within %d ms (log printed above)",
                          d->sock, timeout_ms);
            kvh_print_log(d, "kvnoded did not become ready");
            return -1;
        }
        kvh_sleep_ms(10);
    }
}

int kvh_start(kvh_daemon *d, const char *config)
{
    return kvh_start_ex(d, config, NULL);
}

int kvh_start_ex(kvh_daemon *d, const char *config, const kvh_spawn_opts *opts)
{
    if (kvh_spawn_ex(d, config, opts) != 0)
        return -1;
    if (kvh_wait_ready(d, KVH_READY_TIMEOUT_MS) != 0) {
        char saved[sizeof kvh_errbuf];
        snprintf(saved, sizeof saved, "%s", kvh_errbuf);
        kvh_destroy(d);
        snprintf(kvh_errbuf, sizeof kvh_errbuf, "%s", saved);
        return -1;
    }
    return 0;
}

/* d's end after proc_stop returned ws. */
static int kvh_stopped(kvh_daemon *d, int ws)
{
    d->status = ws == PROC_TIMEOUT ? KVH_EXIT_TIMEOUT : proc_exit_code(ws);
    kvh_reg_update(d, 0);
    return d->status;
}

int kvh_kill(kvh_daemon *d, int sig)
{
    if (d->pid <= 0)
        return d->status;
    return kvh_stopped(d, proc_stop(&d->pid, sig, KVH_STOP_TIMEOUT_MS));
}

int kvh_stop(kvh_daemon *d, int timeout_ms)
{
    if (d->pid <= 0)
        return d->status;
    if (timeout_ms <= 0)
        timeout_ms = KVH_STOP_TIMEOUT_MS;
    pid_t pid = d->pid;
    int st = kvh_stopped(d, proc_stop(&d->pid, SIGTERM, timeout_ms));
    if (st == KVH_EXIT_TIMEOUT)
        fprintf(stderr, "harness: kvnoded (pid %d) ignored SIGTERM for %d ms: SIGKILL\n", (int)pid, timeout_ms);
    if (st != 0) {
        char why[128];
        snprintf(why, sizeof why, "kvnoded stop: status %d", st);
        kvh_print_log(d, why);
    }
    return st;
}

void kvh_destroy(kvh_daemon *d)
{
    if (d->pid > 0)
        kvh_kill(d, SIGKILL);
    kvh_reg_update(d, 1);
    test_rmtree(d->dir);
    d->dir[0] = '\0';
}

void kvh_print_log(const kvh_daemon *d, const char *why)
{
    kvh_print_file(d->log, why ? why : "kvnoded log");
}

char *kvh_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvh_set_error("open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap + 1);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        kvh_set_error("read %s: out of memory", path);
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

char *kvh_read_log(const kvh_daemon *d)
{
    return kvh_read_file(d->log, NULL);
}

int kvh_mkdtemp(char *buf, size_t len)
{
    const char *tmp = getenv("TMPDIR");
    int n = kvh_root[0] ? snprintf(buf, len, "%s/t-XXXXXX", kvh_root)
                        : snprintf(buf, len, "%s/kvnode-it-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (n < 0 || (size_t)n >= len) {
        kvh_set_error("temporary directory path too long");
        return -1;
    }
    if (!mkdtemp(buf)) {
        kvh_set_error("mkdtemp %s: %s", buf, strerror(errno));
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* layouts, clients, contents */

kvnode_layout kvh_layout(const char *model, uint64_t block_bytes, uint32_t tp_size, uint32_t tp_rank)
{
    kvnode_layout l = {
        .model = model, .dtype = "bf16", .block_tokens = 16, .block_bytes = block_bytes,
        .num_layers = 4, .kv_heads = 8, .head_dim = 128, .tp_size = tp_size, .tp_rank = tp_rank,
        .extra = NULL,
    };
    return l;
}

int kvh_connect(const kvh_daemon *d, const kvnode_layout *layout, kvnode_client **out)
{
    *out = NULL;
    int rc = kvnode_connect(d->sock, layout, out);
    if (rc != 0) {
        kvh_set_error("kvnode_connect(%s, %s) -> %d (%s): %s", d->sock,
                      layout ? layout->model : "observer", rc, kvnode_strerror(rc),
                      kvh_connect_error());
        if (*out) {
            kvnode_close(*out);
            *out = NULL;
        }
        return rc;
    }
    if (!*out) {
        kvh_set_error("kvnode_connect returned 0 but no client");
        return -KVNODE_EINTERNAL;
    }
    return 0;
}

static uint64_t kvh_splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t kvh_seed_of(kvnode_key key, uint64_t seed)
{
    uint64_t s = (uint64_t)key ^ (seed * 0xd1342543de82ef95ull) ^ 0x5851f42d4c957f2dull;
    return kvh_splitmix64(&s) | 1u;
}

static inline uint64_t kvh_xorshift(uint64_t *x)
{
    uint64_t v = *x;
    v ^= v << 13;
    v ^= v >> 7;
    v ^= v << 17;
    *x = v;
    return v;
}

void kvh_fill(void *buf, size_t len, kvnode_key key, uint64_t seed)
{
    uint64_t x = kvh_seed_of(key, seed);
    unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = kvh_xorshift(&x);
        memcpy(p + i, &v, 8);
    }
    if (i < len) {
        uint64_t v = kvh_xorshift(&x);
        memcpy(p + i, &v, len - i);
    }
}

int kvh_verify(const void *buf, size_t len, kvnode_key key, uint64_t seed)
{
    uint64_t x = kvh_seed_of(key, seed);
    const unsigned char *p = buf;
    size_t i = 0;
    for (; i < len; i += 8) {
        uint64_t v = kvh_xorshift(&x);
        size_t n = len - i < 8 ? len - i : 8;
        if (memcmp(p + i, &v, n) != 0) {
            const unsigned char *e = (const unsigned char *)&v;
            size_t j = 0;
            while (j < n && p[i + j] == e[j])
                j++;
            kvh_set_error("block of key %lld (seed %llu, %zu bytes) differs at offset %zu: "
                          "got 0x%02x expected 0x%02x",
                          (long long)key, (unsigned long long)seed, len, i + j, p[i + j], e[j]);
            return -1;
        }
    }
    return 0;
}

static uint64_t kvh_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvh_chain(kvnode_key *keys, size_t n, uint64_t chain)
{
    /* Independent per (chain, i): chains never share keys by construction
     * (a counter-based stream would make chain c+1 a shifted chain c). */
    uint64_t h = kvh_mix64(chain ^ 0x632be59bd9b4e019ull);
    for (size_t i = 0; i < n; i++)
        keys[i] = (kvnode_key)kvh_mix64(h ^ kvh_mix64((uint64_t)i + 0x9e3779b97f4a7c15ull));
}

static int kvh_lib_error(kvnode_client *c, const char *what, int rc)
{
    kvh_set_error("%s -> %d (%s): %s", what, rc, kvnode_strerror(rc), kvnode_last_error(c));
    return rc;
}

static int kvh_put_common(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed, int inline_)
{
    size_t bb = (size_t)kvnode_block_bytes(c);
    if (n == 0)
        return inline_ ? kvnode_put_inline(c, keys, 0, NULL) : kvnode_put(c, keys, 0, NULL);
    unsigned char *buf = malloc(n * bb);
    const void **src = malloc(n * sizeof *src);
    if (!buf || !src) {
        free(buf);
        free(src);
        kvh_set_error("out of memory");
        return -KVNODE_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        kvh_fill(buf + i * bb, bb, keys[i], seed);
        src[i] = buf + i * bb;
    }
    int rc = inline_ ? kvnode_put_inline(c, keys, n, src) : kvnode_put(c, keys, n, src);
    if (rc != 0)
        kvh_lib_error(c, inline_ ? "kvnode_put_inline" : "kvnode_put", rc);
    free(buf);
    free(src);
    return rc;
}

int kvh_put(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed)
{
    return kvh_put_common(c, keys, n, seed, 0);
}

int kvh_put_inline(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed)
{
    return kvh_put_common(c, keys, n, seed, 1);
}

int kvh_get_verify(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed, int inline_,
                   size_t *got)
{
    size_t bb = (size_t)kvnode_block_bytes(c);
    *got = 0;
    unsigned char *buf = malloc(n * bb + 1);
    void **dst = malloc((n + 1) * sizeof *dst);
    if (!buf || !dst) {
        free(buf);
        free(dst);
        kvh_set_error("out of memory");
        return -KVNODE_ENOMEM;
    }
    memset(buf, 0xA5, n * bb);   /* stale bytes must not pass for data */
    for (size_t i = 0; i < n; i++)
        dst[i] = buf + i * bb;
    size_t g = (size_t)-1;
    int rc = inline_ ? kvnode_get_inline(c, keys, n, dst, &g) : kvnode_get(c, keys, n, dst, &g);
    if (rc != 0) {
        kvh_lib_error(c, inline_ ? "kvnode_get_inline" : "kvnode_get", rc);
    } else if (g > n) {
        kvh_set_error("get returned got=%zu for %zu keys", g, n);
        rc = KVH_MISMATCH;
    } else {
        *got = g;
        for (size_t i = 0; i < g; i++) {
            if (kvh_verify(dst[i], bb, keys[i], seed) != 0) {
                char m[sizeof kvh_errbuf];
                snprintf(m, sizeof m, "%s", kvh_errbuf);
                kvh_set_error("%s: key #%zu: %s", inline_ ? "kvnode_get_inline" : "kvnode_get", i, m);
                rc = KVH_MISMATCH;
                break;
            }
        }
    }
    free(buf);
    free(dst);
    return rc;
}

int kvh_get_zc_verify(kvnode_client *c, const kvnode_key *keys, size_t n, uint64_t seed, size_t *got)
{
    size_t bb = (size_t)kvnode_block_bytes(c);
    *got = 0;
    kvnode_loc *locs = calloc(n + 1, sizeof *locs);
    if (!locs) {
        kvh_set_error("out of memory");
        return -KVNODE_ENOMEM;
    }
    kvnode_lease lease = 0;
    size_t g = (size_t)-1;
    int rc = kvnode_get_begin(c, keys, n, &lease, locs, &g);
    if (rc != 0) {
        kvh_lib_error(c, "kvnode_get_begin", rc);
        free(locs);
        return rc;
    }
    if (g > n || (g == 0) != (lease == 0)) {
        kvh_set_error("kvnode_get_begin: got=%zu of %zu keys with lease %llu", g, n,
                      (unsigned long long)lease);
        rc = KVH_MISMATCH;
    }
    for (size_t i = 0; rc == 0 && i < g; i++) {
        if (!locs[i].ptr) {
            kvh_set_error("kvnode_get_begin: locs[%zu].ptr is NULL", i);
            rc = KVH_MISMATCH;
        } else if (kvh_verify(locs[i].ptr, bb, keys[i], seed) != 0) {
            char m[sizeof kvh_errbuf];
            snprintf(m, sizeof m, "%s", kvh_errbuf);
            kvh_set_error("kvnode_get_begin: key #%zu: %s", i, m);
            rc = KVH_MISMATCH;
        }
    }
    if (lease != 0) {
        int erc = kvnode_get_end(c, lease);
        if (erc != 0 && rc == 0)
            rc = kvh_lib_error(c, "kvnode_get_end", erc);
    }
    if (rc == 0)
        *got = g;
    free(locs);
    return rc;
}

long kvh_match(kvnode_client *c, const kvnode_key *keys, size_t n)
{
    size_t m = (size_t)-1;
    int rc = kvnode_match(c, keys, n, &m);
    if (rc != 0)
        return kvh_lib_error(c, "kvnode_match", rc);
    if (m > n) {
        kvh_set_error("kvnode_match: matched=%zu of %zu keys", m, n);
        return -KVNODE_EINTERNAL;
    }
    return (long)m;
}

/* ------------------------------------------------------------------------- */
/* stats */

json_t *kvh_stats_client(kvnode_client *c)
{
    char *text = NULL;
    int rc = kvnode_stats_json(c, &text);
    if (rc != 0) {
        kvh_set_error("kvnode_stats_json -> %d (%s): %s", rc, kvnode_strerror(rc), kvnode_last_error(c));
        free(text);
        return NULL;
    }
    if (!text) {
        kvh_set_error("kvnode_stats_json returned no text");
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root)
        kvh_set_error("stats JSON does not parse (%s at line %d col %d): %.300s",
                      jerr.text, jerr.line, jerr.column, text);
    free(text);
    return root;
}

json_t *kvh_stats(const kvh_daemon *d)
{
    kvnode_client *c;
    if (kvh_connect(d, NULL, &c) != 0)
        return NULL;
    json_t *root = kvh_stats_client(c);
    kvnode_close(c);
    return root;
}

json_t *kvh_json_get(json_t *root, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = root;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ".", &save); tok && cur; tok = strtok_r(NULL, ".", &save)) {
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long idx = strtoul(tok, &end, 10);
            cur = (*tok && !*end) ? json_array_get(cur, idx) : NULL;
        } else {
            cur = NULL;
        }
    }
    return cur;
}

long long kvh_json_int(json_t *root, const char *path)
{
    json_t *v = kvh_json_get(root, path);
    if (json_is_integer(v))
        return (long long)json_integer_value(v);
    if (json_is_real(v))
        return (long long)json_real_value(v);
    kvh_set_error("stats has no number at '%s'", path);
    return -1;
}

long long kvh_json_int_or(json_t *root, const char *path, long long dflt)
{
    if (!kvh_json_get(root, path))
        return dflt;
    return kvh_json_int(root, path);
}

long long kvh_stat(const kvh_daemon *d, const char *path)
{
    json_t *root = kvh_stats(d);
    if (!root)
        return -1;
    long long v = kvh_json_int(root, path);
    json_decref(root);
    return v;
}

int kvh_wait_stat(const kvh_daemon *d, const char *path, long long want, int timeout_ms,
                  long long *last)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    long long v = -1;
    for (;;) {
        v = kvh_stat(d, path);
        if (last)
            *last = v;
        if (v == want)
            return 0;
        if (kvh_now_ms() >= deadline) {
            kvh_set_error("stat %s is %lld, expected %lld within %d ms", path, v, want, timeout_ms);
            return -1;
        }
        kvh_sleep_ms(10);
    }
}

json_t *kvh_stats_namespace(json_t *root, const char *model, uint32_t tp_rank)
{
    json_t *arr = json_object_get(root, "namespaces");
    size_t i;
    json_t *ns;
    json_array_foreach(arr, i, ns) {
        json_t *m = json_object_get(ns, "model");
        json_t *r = json_object_get(ns, "tp_rank");
        if (json_is_string(m) && strcmp(json_string_value(m), model) == 0 &&
            json_is_integer(r) && json_integer_value(r) == (json_int_t)tp_rank)
            return ns;
    }
    kvh_set_error("stats has no namespace model=%s tp_rank=%u", model, tp_rank);
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* raw socket */

int kvh_raw_connect(const char *sock_path)
{
    struct sockaddr_un sa;
    if (kvh_sockaddr(&sa, sock_path) != 0)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        kvh_set_error("socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        kvh_set_error("connect %s: %s", sock_path, strerror(errno));
        close(fd);
        return -1;
    }
    struct timeval tv = { .tv_sec = 5 };
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

int kvh_raw_send(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            kvh_set_error("send: %s", strerror(errno));
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int kvh_raw_send_frame(int fd, const void *payload, uint32_t len)
{
    uint8_t hdr[4] = { (uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24) };
    if (kvh_raw_send(fd, hdr, 4) != 0)
        return -1;
    return len ? kvh_raw_send(fd, payload, len) : 0;
}

/* Read exactly len bytes before deadline. 1 ok, 0 EOF at offset 0, -1 error. */
static int kvh_raw_read_full(int fd, uint8_t *buf, size_t len, uint64_t deadline)
{
    size_t got = 0;
    while (got < len) {
        uint64_t now = kvh_now_ms();
        if (now >= deadline) {
            kvh_set_error("timed out reading from the daemon (%zu of %zu bytes)", got, len);
            return -1;
        }
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int pr = poll(&pfd, 1, (int)(deadline - now));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        char cbuf[CMSG_SPACE(sizeof(int) * 32)];
        struct iovec iov = { .iov_base = buf + got, .iov_len = len - got };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
                             .msg_control = cbuf, .msg_controllen = sizeof cbuf };
        ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            if (errno == ECONNRESET && got == 0)
                return 0;
            kvh_set_error("recv: %s", strerror(errno));
            return -1;
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < nfd; i++) {
                    int rfd;
                    memcpy(&rfd, CMSG_DATA(cm) + i * sizeof(int), sizeof rfd);
                    close(rfd);
                }
            }
        }
        if (n == 0) {
            if (got == 0)
                return 0;
            kvh_set_error("connection closed in the middle of a frame (%zu of %zu bytes)", got, len);
            return -1;
        }
        got += (size_t)n;
    }
    return 1;
}

int kvh_raw_recv_frame(int fd, uint8_t **payload, uint32_t *len, uint32_t max_len, int timeout_ms)
{
    *payload = NULL;
    *len = 0;
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    uint8_t hdr[4];
    int r = kvh_raw_read_full(fd, hdr, 4, deadline);
    if (r <= 0)
        return r;
    uint32_t n = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
    if (n > max_len) {
        kvh_set_error("daemon sent a frame of %u bytes (limit %u)", n, max_len);
        return -1;
    }
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        kvh_set_error("out of memory");
        return -1;
    }
    if (n) {
        r = kvh_raw_read_full(fd, buf, n, deadline);
        if (r <= 0) {
            if (r == 0)
                kvh_set_error("connection closed after a frame header");
            free(buf);
            return -1;
        }
    }
    *payload = buf;
    *len = n;
    return 1;
}

int kvh_raw_wait_eof(int fd, int timeout_ms)
{
    uint64_t deadline = kvh_now_ms() + (uint64_t)timeout_ms;
    uint8_t buf[4096];
    for (;;) {
        uint64_t now = kvh_now_ms();
        if (now >= deadline) {
            kvh_set_error("the daemon did not close the connection within %d ms", timeout_ms);
            return -1;
        }
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int pr = poll(&pfd, 1, (int)(deadline - now));
        if (pr <= 0)
            continue;
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0)
            return 0;
        if (n < 0 && errno == ECONNRESET)
            return 0;
        if (n < 0 && errno != EINTR && errno != EAGAIN) {
            kvh_set_error("recv: %s", strerror(errno));
            return -1;
        }
    }
}

long long kvh_proc_status_kib(pid_t pid, const char *field)
{
    char path[64], line[256];
    size_t flen = strlen(field);
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        kvh_set_error("open %s: %s", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        long long kib;
        if (strncmp(line, field, flen) == 0 && line[flen] == ':' &&
            sscanf(line + flen + 1, "%lld", &kib) == 1) {
            fclose(f);
            return kib;
        }
    }
    fclose(f);
    kvh_set_error("%s has no %s line", path, field);
    return -1;
}

long long kvh_proc_cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvh_set_error("open %s: %s", path, strerror(errno));
        return -1;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        kvh_set_error("read %s: %s", path, n < 0 ? strerror(errno) : "empty");
        return -1;
    }
    buf[n] = '\0';
    /* The command name may hold blanks and parentheses: fields count from
     * the last ')'. utime and stime are fields 14 and 15, the 12th and 13th
     * after the state (field 3). */
    char *p = strrchr(buf, ')');
    unsigned long long utime, stime;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2) {
        kvh_set_error("cannot parse %s", path);
        return -1;
    }
    return (long long)(utime + stime);
}

/* The holder's child: take the leases, report on the pipe, wait to be killed. */
struct kvh_holder {
    const kvh_daemon *d;
    kvh_hold_fn hold;
    int report;            /* write end of the pipe the parent reads */
};

static int kvh_holder_main(void *arg)
{
    const struct kvh_holder *h = arg;
    char buf[512] = { 0 };
    buf[0] = 'E';
    if (h->hold(h->d, buf + 1, sizeof buf - 1) == 0) {
        if (write(h->report, "R", 1) != 1)
            return 3;
        for (;;)
            pause();
    }
    if (write(h->report, buf, strlen(buf)) < 0)
        return 3;
    return 1;
}

pid_t kvh_spawn_holder(const kvh_daemon *d, kvh_hold_fn hold)
{
    int pfd[2];
    char buf[512] = { 0 };

    if (pipe2(pfd, O_CLOEXEC) != 0) {
        kvh_set_error("pipe: %s", strerror(errno));
        return -1;
    }
    struct kvh_holder h = { d, hold, pfd[1] };
    pid_t pid = proc_spawn(&(struct proc_opts){ .fn = kvh_holder_main, .arg = &h }, NULL);
    close(pfd[1]);
    if (pid < 0) {
        kvh_set_error("the client process: %s", proc_error());
        close(pfd[0]);
        return -1;
    }
    struct pollfd p = { .fd = pfd[0], .events = POLLIN };
    int pr = poll(&p, 1, 10000);
    ssize_t n = pr > 0 ? read(pfd[0], buf, sizeof buf - 1) : -1;
    close(pfd[0]);
    if (n == 1 && buf[0] == 'R')
        return pid;
    proc_stop(&pid, SIGKILL, KVH_STOP_TIMEOUT_MS);
    kvh_set_error("the client process did not take its leases: %s", n > 1 ? buf + 1 : "(timeout)");
    return -1;
}

uint64_t kvh_host_offset(const void *p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uint64_t off = UINT64_MAX;
    if (!f)
        return off;
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi, foff;
        if (!strstr(line, "kvnode-host") ||
            sscanf(line, "%llx-%llx %*s %llx", &lo, &hi, &foff) != 3)
            continue;
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
            off = (uint64_t)((uintptr_t)p - lo) + foff;
            break;
        }
    }
    fclose(f);
    return off;
}
