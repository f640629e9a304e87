/* proc: the tests' child processes (see proc.h). Owns fork/exec, the child's
 * setup between them, the environment it gets, and waiting for it with a
 * deadline. */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------- */
/* errors and time */

static _Thread_local char proc_errbuf[1024];

const char *proc_error(void) { return proc_errbuf; }

static void proc_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void proc_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(proc_errbuf, sizeof proc_errbuf, fmt, ap);
    va_end(ap);
}

static uint64_t proc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void proc_sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Milliseconds left until deadline (0 when passed). */
static int proc_left_ms(uint64_t deadline)
{
    uint64_t now = proc_now_ms();
    return now >= deadline ? 0 : (int)(deadline - now);
}

/* ------------------------------------------------------------------------- */
/* the environment */

/* The environment of a child with env or pid_env, built before fork (the
 * child only writes its pid into the pid slots: no allocation after fork). */
#define PROC_MAX_PID_ENV 8
struct proc_env {
    char **envp;                        /* NULL: inherit environ */
    char *pid_slot[PROC_MAX_PID_ENV];   /* "NAME=" + room for digits, in envp */
    size_t npid;
};

static void proc_env_free(struct proc_env *e)
{
    if (e->envp) {
        for (size_t i = 0; e->envp[i]; i++)
            free(e->envp[i]);
        free(e->envp);
    }
    memset(e, 0, sizeof *e);
}

static int proc_env_overridden(const char *entry, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t l = strcspn(names[i], "=");
        if (strncmp(entry, names[i], l) == 0 && entry[l] == '=')
            return 1;
    }
    return 0;
}

static int proc_env_build(const struct proc_opts *o, struct proc_env *e)
{
    extern char **environ;
    const char *names[64];
    size_t nn = 0, n = 0, cap;

    memset(e, 0, sizeof *e);
    if (!o->env && !o->pid_env)
        return 0;
    for (size_t i = 0; o->env && o->env[i] && nn < 60; i++)
        names[nn++] = o->env[i];
    for (size_t i = 0; o->pid_env && o->pid_env[i] && nn < 60; i++)
        names[nn++] = o->pid_env[i];
    for (cap = 0; environ[cap]; cap++) {}
    cap += nn + 1;
    e->envp = calloc(cap, sizeof *e->envp);
    if (!e->envp)
        goto oom;
    for (size_t i = 0; environ[i]; i++)
        if (!proc_env_overridden(environ[i], names, nn) && !(e->envp[n++] = strdup(environ[i])))
            goto oom;
    for (size_t i = 0; i < nn; i++) {
        int is_pid = !strchr(names[i], '=');
        size_t l = strlen(names[i]) + (is_pid ? 24 : 1);
        if (!(e->envp[n] = malloc(l)))
            goto oom;
        snprintf(e->envp[n], l, "%s%s", names[i], is_pid ? "=" : "");
        if (is_pid) {
            if (e->npid == PROC_MAX_PID_ENV) {
                proc_set_error("more than %d pid_env names", PROC_MAX_PID_ENV);
                proc_env_free(e);
                return -1;
            }
            e->pid_slot[e->npid++] = e->envp[n];
        }
        n++;
    }
    return 0;
oom:
    proc_set_error("out of memory");
    proc_env_free(e);
    return -1;
}

/* After fork: write the child's pid into the pid slots (async-signal-safe). */
static void proc_env_set_pid(struct proc_env *e, pid_t pid)
{
    for (size_t i = 0; i < e->npid; i++) {
        char digits[24], *p = e->pid_slot[i] + strlen(e->pid_slot[i]);
        int nd = 0;
        unsigned long v = (unsigned long)pid;
        do {
            digits[nd++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        while (nd)
            *p++ = digits[--nd];
        *p = '\0';
    }
}

/* ------------------------------------------------------------------------- */
/* the child, between fork and exec: async-signal-safe calls only */

/* What the child failed at; it writes this to the report pipe and exits. */
enum proc_stage {
    PROC_STAGE_STREAMS,
    PROC_STAGE_PASS_FDS,
    PROC_STAGE_NOFILE,
    PROC_STAGE_SETGROUPS,
    PROC_STAGE_SETGID,
    PROC_STAGE_SETUID,
    PROC_STAGE_EXEC,
};

static const char *const proc_stage_names[] = {
    [PROC_STAGE_STREAMS] = "redirecting stdin/stdout/stderr",
    [PROC_STAGE_PASS_FDS] = "passing descriptors",
    [PROC_STAGE_NOFILE] = "setrlimit(RLIMIT_NOFILE) (above the hard limit?)",
    [PROC_STAGE_SETGROUPS] = "setgroups (needs root)",
    [PROC_STAGE_SETGID] = "setresgid (needs root)",
    [PROC_STAGE_SETUID] = "setresuid (needs root)",
    [PROC_STAGE_EXEC] = "exec",
};

struct proc_report {
    int stage;
    int err;
};

/* Descriptors the parent opened for the child (-1: inherit). */
struct proc_child_fds {
    int in, out, err;
    int report;          /* write end of the report pipe (close-on-exec) */
};

static void proc_child_fail(int report, enum proc_stage stage) __attribute__((noreturn));
static void proc_child_fail(int report, enum proc_stage stage)
{
    struct proc_report r = { (int)stage, errno };
    ssize_t w = write(report, &r, sizeof r);
    (void)w;
    _exit(stage == PROC_STAGE_EXEC ? 127 : 126);
}

/* fd onto target, inherited across exec. */
static int proc_dup_to(int fd, int target)
{
    if (fd == target)
        return fcntl(target, F_SETFD, 0);
    return dup2(fd, target) < 0 ? -1 : 0;
}

/* Serializes proc_spawn: a child forked by another thread meanwhile would
 * hold a copy of this spawn's report pipe and keep it from reading EOF. */
static pthread_mutex_t proc_spawn_lock = PTHREAD_MUTEX_INITIALIZER;

static void proc_child(const struct proc_opts *o, struct proc_child_fds *f, struct proc_env *env,
                       pid_t parent) __attribute__((noreturn));
static void proc_child(const struct proc_opts *o, struct proc_child_fds *f, struct proc_env *env, pid_t parent)
{
    /* The child dies with the test, whatever happens. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    /* A fn child may start children of its own. */
    proc_spawn_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;

    int npass = o->pass_count > 0 ? o->pass_count : 0;
    if (f->report < 3 + npass) {   /* keep it clear of the descriptors it must not clobber */
        int moved = fcntl(f->report, F_DUPFD_CLOEXEC, 3 + npass);
        if (moved < 0)
            proc_child_fail(f->report, PROC_STAGE_PASS_FDS);
        close(f->report);
        f->report = moved;
    }
    if ((f->in >= 0 && proc_dup_to(f->in, 0) != 0) || (f->out >= 0 && proc_dup_to(f->out, 1) != 0) ||
        (o->err == PROC_TO_STDOUT && proc_dup_to(1, 2) != 0) || (f->err >= 0 && proc_dup_to(f->err, 2) != 0))
        proc_child_fail(f->report, PROC_STAGE_STREAMS);
    for (int i = 0; i < npass; i++)
        if (proc_dup_to(o->pass_fd, 3 + i) != 0)
            proc_child_fail(f->report, PROC_STAGE_PASS_FDS);
    if (o->close_fds) {
        unsigned first = 3u + (unsigned)npass, keep = (unsigned)f->report;
        if (first < keep)
            close_range(first, keep - 1, 0);
        close_range(keep + 1, ~0u, 0);
    }
    if (o->nofile > 0) {
        /* The soft limit only, as systemd's LimitNOFILE=soft:hard would;
         * valgrind refuses any change of the hard limit. */
        struct rlimit rl = { 0 };
        int rc = getrlimit(RLIMIT_NOFILE, &rl);
        if (rc == 0 && rl.rlim_max != RLIM_INFINITY && rl.rlim_max < o->nofile) {
            errno = EINVAL;   /* above the hard limit */
            rc = -1;
        }
        if (rc == 0) {
            rl.rlim_cur = o->nofile;
            rc = setrlimit(RLIMIT_NOFILE, &rl);
        }
        if (rc != 0)
            proc_child_fail(f->report, PROC_STAGE_NOFILE);
    }
    if (o->as_user) {
        if (setgroups(o->groups ? o->ngroups : 0, o->groups) != 0)
            proc_child_fail(f->report, PROC_STAGE_SETGROUPS);
        if (setresgid(o->gid, o->gid, o->gid) != 0)
            proc_child_fail(f->report, PROC_STAGE_SETGID);
        if (setresuid(o->uid, o->uid, o->uid) != 0)
            proc_child_fail(f->report, PROC_STAGE_SETUID);
    }
    if (env->envp)
        proc_env_set_pid(env, getpid());

    if (o->fn) {
        close(f->report);   /* set up: proc_spawn returns */
        int rc = o->fn(o->arg);
        fflush(stdout);     /* the parent flushed before fork: this is the child's own output */
        fflush(stderr);
        _exit(rc);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    char *const *argv = (char *const *)o->argv;
    bool search = strchr(o->argv[0], '/') == NULL;
    if (env->envp) {
        if (search)
            execvpe(argv[0], argv, env->envp);
        else
            execve(argv[0], argv, env->envp);
    } else {
        if (search)
            execvp(argv[0], argv);
        else
            execv(argv[0], argv);
    }
    proc_child_fail(f->report, PROC_STAGE_EXEC);
}

/* ------------------------------------------------------------------------- */
/* starting */

static void proc_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Open the child's end of one stream (parent side): -1 for PROC_INHERIT
 * and PROC_TO_STDOUT; the parent's end of a pipe into *pipe_read. */
static int proc_stream(enum proc_io io, const char *path, bool input, int *child_fd, int *pipe_read,
                       const char *name)
{
    *child_fd = -1;
    switch (io) {
    case PROC_INHERIT:
    case PROC_TO_STDOUT:
        if (io == PROC_TO_STDOUT && strcmp(name, "stderr") != 0) {
            proc_set_error("%s cannot go to stdout", name);
            return -1;
        }
        return 0;
    case PROC_NULL:
        path = "/dev/null";
        break;
    case PROC_FILE:
        if (!path) {
            proc_set_error("%s is PROC_FILE without a path", name);
            return -1;
        }
        break;
    case PROC_PIPE: {
        int p[2];
        if (input || !pipe_read) {
            proc_set_error("%s cannot be a pipe here", name);
            return -1;
        }
        if (pipe2(p, O_CLOEXEC) != 0) {
            proc_set_error("pipe for %s: %s", name, strerror(errno));
            return -1;
        }
        *pipe_read = p[0];
        *child_fd = p[1];
        return 0;
    }
    default:
        proc_set_error("%s: unknown stream kind %d", name, (int)io);
        return -1;
    }
    int fd = input ? open(path, O_RDONLY | O_CLOEXEC)
                   : open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        proc_set_error("open %s for the child's %s: %s", path, name, strerror(errno));
        return -1;
    }
    *child_fd = fd;
    return 0;
}

/* What the child is, for messages. */
static const char *proc_what(const struct proc_opts *o)
{
    return o->fn ? "child function" : o->argv[0];
}

/* After fork: the child's report. 0 once it exec'd (or its function
 * started); -1 with the reason (the child is reaped). */
static int proc_await_start(const struct proc_opts *o, pid_t *pid, int report)
{
    struct proc_report r;
    size_t got = 0;
    uint64_t deadline = proc_now_ms() + PROC_START_TIMEOUT_MS;
    for (;;) {
        struct pollfd p = { .fd = report, .events = POLLIN };
        int left = proc_left_ms(deadline);
        int pr = left > 0 ? poll(&p, 1, left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            proc_stop(pid, SIGKILL, 0);
            proc_set_error("%s did not start within %d ms", proc_what(o), PROC_START_TIMEOUT_MS);
            return -1;
        }
        ssize_t n = read(report, (char *)&r + got, sizeof r - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 && got == 0)
            return 0;   /* closed on exec: running */
        if (n > 0 && (got += (size_t)n) < sizeof r)
            continue;
        break;
    }
    proc_wait(pid, PROC_KILL_WAIT_MS);   /* it exits right after its report */
    if (got == sizeof r && r.stage >= 0 && r.stage <= PROC_STAGE_EXEC)
        proc_set_error("%s %s: %s", proc_stage_names[r.stage], proc_what(o), strerror(r.err));
    else
        proc_set_error("%s: a garbled report from the starting child", proc_what(o));
    return -1;
}

pid_t proc_spawn(const struct proc_opts *o, struct proc_pipes *pipes)
{
    struct proc_pipes own = { -1, -1 };
    struct proc_child_fds f = { -1, -1, -1, -1 };
    struct proc_env env = { 0 };
    int report_read = -1;
    pid_t pid = -1;

    if (pipes)
        *pipes = own;
    if (!o->fn == !(o->argv && o->argv[0])) {
        proc_set_error("proc_spawn needs exactly one of argv and fn");
        return -1;
    }
    if (o->pass_count > 0 && o->pass_fd < 0) {
        proc_set_error("pass_count %d without a pass_fd", o->pass_count);
        return -1;
    }
    if (proc_env_build(o, &env) != 0)
        return -1;
    pthread_mutex_lock(&proc_spawn_lock);
    int p[2];
    if (proc_stream(o->in, o->in_path, true, &f.in, NULL, "stdin") != 0 ||
        proc_stream(o->out, o->out_path, false, &f.out, pipes ? &own.out : NULL, "stdout") != 0 ||
        proc_stream(o->err, o->err_path, false, &f.err, pipes ? &own.err : NULL, "stderr") != 0)
        goto out;
    if (pipe2(p, O_CLOEXEC) != 0) {
        proc_set_error("pipe: %s", strerror(errno));
        goto out;
    }
    report_read = p[0];
    f.report = p[1];

    fflush(stdout);   /* nothing buffered is written twice */
    fflush(stderr);
    pid_t parent = getpid();
    pid = fork();
    if (pid < 0) {
        proc_set_error("fork: %s", strerror(errno));
        goto out;
    }
    if (pid == 0)
        proc_child(o, &f, &env, parent);
    proc_close(&f.report);
    if (proc_await_start(o, &pid, report_read) != 0)
        pid = -1;
out:
    proc_close(&f.in);
    proc_close(&f.out);
    proc_close(&f.err);
    proc_close(&f.report);
    proc_close(&report_read);
    pthread_mutex_unlock(&proc_spawn_lock);
    proc_env_free(&env);
    if (pid < 0) {
        proc_close(&own.out);
        proc_close(&own.err);
    } else if (pipes) {
        *pipes = own;
    }
    return pid;
}

/* ------------------------------------------------------------------------- */
/* waiting */

int proc_wait(pid_t *pid, int timeout_ms)
{
    if (*pid <= 0) {
        proc_set_error("no child to wait for");
        return -1;
    }
    uint64_t deadline = proc_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        int ws;
        pid_t r = waitpid(*pid, &ws, WNOHANG);
        if (r == *pid) {
            *pid = 0;
            return ws;
        }
        if (r < 0 && errno != EINTR) {
            proc_set_error("waitpid %d: %s", (int)*pid, strerror(errno));
            *pid = 0;
            return -1;
        }
        int left = proc_left_ms(deadline);
        if (left == 0) {
            proc_set_error("pid %d did not exit within %d ms", (int)*pid, timeout_ms);
            return PROC_TIMEOUT;
        }
        proc_sleep_ms(left < 5 ? (unsigned)left : 5u);
    }
}

int proc_stop(pid_t *pid, int sig, int timeout_ms)
{
    if (*pid <= 0) {
        proc_set_error("no child to stop");
        return -1;
    }
    pid_t was = *pid;
    kill(*pid, sig);
    int st = proc_wait(pid, timeout_ms);
    if (st != PROC_TIMEOUT)
        return st;
    kill(*pid, SIGKILL);
    if (proc_wait(pid, PROC_KILL_WAIT_MS) == PROC_TIMEOUT)
        proc_set_error("pid %d survived SIGKILL for %d ms", (int)was, PROC_KILL_WAIT_MS);
    else
        proc_set_error("pid %d did not exit within %d ms of signal %d: SIGKILL", (int)was, timeout_ms, sig);
    return PROC_TIMEOUT;
}

int proc_exit_code(int status)
{
    if (status < 0)
        return status;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return PROC_EXIT_SIGNAL_BASE + WTERMSIG(status);
    return -1;
}

/* ------------------------------------------------------------------------- */
/* output */

struct proc_buf {
    char *p;
    size_t n, cap;
};

/* Read what is there into b; false at EOF or on an error. Past an
 * allocation failure the bytes are read and dropped. */
static bool proc_drain(int fd, struct proc_buf *b)
{
    char chunk[4096];
    ssize_t r = read(fd, chunk, sizeof chunk);
    if (r < 0)
        return errno == EINTR || errno == EAGAIN;
    if (r == 0)
        return false;
    if (b->n + (size_t)r + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + (size_t)r + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return true;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, chunk, (size_t)r);
    b->n += (size_t)r;
    b->p[b->n] = '\0';
    return true;
}

static char *proc_buf_take(struct proc_buf *b)
{
    char *p = b->p ? b->p : strdup("");
    b->p = NULL;
    return p;
}

int proc_run(const struct proc_opts *o, int timeout_ms, char **out, char **err)
{
    struct proc_opts c = *o;
    struct proc_pipes p;
    struct proc_buf ob = { 0 }, eb = { 0 };

    if (out) {
        *out = NULL;
        c.out = PROC_PIPE;
    }
    if (err) {
        *err = NULL;
        c.err = PROC_PIPE;
    }
    uint64_t deadline = proc_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    pid_t pid = proc_spawn(&c, &p);
    if (pid < 0)
        return -1;
    while (p.out >= 0 || p.err >= 0) {
        struct pollfd pf[2];
        int n = 0;
        if (p.out >= 0)
            pf[n++] = (struct pollfd){ .fd = p.out, .events = POLLIN };
        if (p.err >= 0)
            pf[n++] = (struct pollfd){ .fd = p.err, .events = POLLIN };
        int left = proc_left_ms(deadline);
        if (left == 0)
            break;
        int pr = poll(pf, (nfds_t)n, left);
        if (pr < 0 && errno != EINTR)
            break;
        for (int i = 0; pr > 0 && i < n; i++) {
            if (!pf[i].revents)
                continue;
            bool is_out = pf[i].fd == p.out;
            if (!proc_drain(pf[i].fd, is_out ? &ob : &eb))
                proc_close(is_out ? &p.out : &p.err);
        }
    }
    proc_close(&p.out);
    proc_close(&p.err);
    int st = proc_wait(&pid, proc_left_ms(deadline));
    if (st == PROC_TIMEOUT) {
        proc_stop(&pid, SIGKILL, 0);
        proc_set_error("%s did not finish within %d ms (killed)", proc_what(o), timeout_ms);
    }
    if (out)
        *out = proc_buf_take(&ob);
    if (err)
        *err = proc_buf_take(&eb);
    free(ob.p);
    free(eb.p);
    return st;
}

int proc_read_announce(int fd, const char *const *keys, char *buf, size_t cap, int timeout_ms)
{
    size_t len = 0;
    uint64_t deadline = proc_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    buf[0] = '\0';
    for (;;) {
        bool all = true;
        for (const char *const *k = keys; *k && all; k++) {
            const char *at = strstr(buf, *k);
            all = at && strchr(at, '\n');
        }
        if (all)
            return 0;
        int left = proc_left_ms(deadline);
        if (left == 0 || len >= cap - 1) {
            proc_set_error("did not announce itself within %d ms (printed: %s)", timeout_ms, buf);
            return -1;
        }
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, left) <= 0)
            continue;
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            proc_set_error("exited before announcing itself (printed: %s)", buf);
            return -1;
        }
        len += (size_t)r;
        buf[len] = '\0';
    }
}
