/* fakecuda_env.h: how a C test points itself (and what it starts) at the
 * strict fake CUDA. Header-only (static functions), so a test needs no link
 * with the fake to set it up or to read its state folder.
 *
 *   int main(int argc, char **argv) {
 *       fakecuda_reexec(argc, argv);    // in-process dlopen("libcuda.so.1") needs it
 *       ...
 *       fakecuda_setup(dir);            // before the first CUDA call of the process
 *
 * fakecuda_setup(dir): creates dir (mode 0700; an existing one is kept),
 * sets FAKECUDA_DIR=dir and unsets every other FAKECUDA_* variable and
 * CUDA_VISIBLE_DEVICES, so the test starts from the defaults (set what it
 * needs after). Child processes inherit the environment. 0, or -1.
 *
 * fakecuda_reexec(argc, argv): glibc reads LD_LIBRARY_PATH only when a
 * program starts, so when it does not already name the fake's folder this
 * re-executes the program (the file /proc/self/exe names) with it prepended.
 * The folder is $FAKECUDA_LIBDIR, else <folder of the test binary>/fakecuda
 * (test binaries are $(BUILD)/tests/test_x, the fake $(BUILD)/tests/fakecuda/).
 * Returns -1 when the exec failed, 0 when nothing was needed. Needed even by
 * a program linked with the fake and an rpath when it is built with ASan:
 * ASan's dlopen interceptor makes libasan the caller, whose search path
 * lacks the rpath. Under valgrind the re-executed program runs without it
 * (valgrind does not follow exec unless --trace-children=yes). */
#ifndef FAKECUDA_ENV_H
#define FAKECUDA_ENV_H

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

static inline int fakecuda_setup(const char *dir)
{
    static const char *const vars[] = {
        "FAKECUDA_DEVICES", "FAKECUDA_BUSID_FORMAT", "FAKECUDA_COMPUTE_MODE", "FAKECUDA_MIG",
        "FAKECUDA_DRIVER_VERSION", "FAKECUDA_NO_VMM", "FAKECUDA_MEM_BYTES", "FAKECUDA_PIDNS",
        "FAKECUDA_COPY_DELAY_MS", "FAKECUDA_FAIL", "CUDA_VISIBLE_DEVICES",
    };
    size_t i;

    if (!dir || (mkdir(dir, 0700) != 0 && errno != EEXIST))
        return -1;
    for (i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    return setenv("FAKECUDA_DIR", dir, 1);
}

/* The fake's folder into buf; 0, or -1. */
static inline int fakecuda_libdir(char *buf, size_t len)
{
    const char *env = getenv("FAKECUDA_LIBDIR");
    char exe[PATH_MAX];
    ssize_t n;
    char *slash;

    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return 0;
    }
    n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    return snprintf(buf, len, "%s/fakecuda", exe) < (int)len ? 0 : -1;
}

static inline int fakecuda_reexec(int argc, char **argv)
{
    const char *old = getenv("LD_LIBRARY_PATH");
    char dir[PATH_MAX], exe[PATH_MAX], *val;
    size_t dlen;
    ssize_t n;
    const char *p;

    (void)argc;
    /* Found already (the program's RPATH): no exec, so valgrind keeps
     * watching this process. ASan's dlopen interceptor hides the RPATH. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h && dlsym(h, "fakecuda_violations"))
        return 0;
    if (fakecuda_libdir(dir, sizeof dir) != 0)
        return -1;
    dlen = strlen(dir);
    for (p = old; p && *p;) {
        size_t l = strcspn(p, ":");

        if (l == dlen && !strncmp(p, dir, l))
            return 0;
        p += l;
        if (*p == ':')
            p++;
    }
    val = malloc(dlen + (old ? strlen(old) : 0) + 2);
    if (!val)
        return -1;
    sprintf(val, "%s%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
    setenv("LD_LIBRARY_PATH", val, 1);
    free(val);
    /* The link's target, not /proc/self/exe itself: under valgrind that
     * would be valgrind's own tool binary. */
    n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = '\0';
    fflush(NULL);
    execve(exe, argv, environ);
    return -1;
}

/* For tests that do not link the fake: lines of $FAKECUDA_DIR/violations
 * (of one rule, or all with NULL); 0 when absent, -1 when unreadable. */
static inline int fakecuda_env_violations(const char *rule)
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

/* Copies $FAKECUDA_DIR/violations to f (for a failing test's log). */
static inline void fakecuda_env_print_violations(FILE *f)
{
    const char *dir = getenv("FAKECUDA_DIR");
    char p[PATH_MAX], line[1200];
    FILE *v;

    if (!dir)
        return;
    snprintf(p, sizeof p, "%s/violations", dir);
    v = fopen(p, "re");
    if (!v)
        return;
    while (fgets(line, sizeof line, v))
        fprintf(f, "fakecuda violation: %s", line);
    fclose(v);
}

/* Whether process pid ever had a context on the physical device (its
 * ctx-<physical>-<pid> file): 1, 0, or -1 without FAKECUDA_DIR. */
static inline int fakecuda_env_has_context(pid_t pid, int physical)
{
    const char *dir = getenv("FAKECUDA_DIR");
    char p[PATH_MAX];

    if (!dir)
        return -1;
    snprintf(p, sizeof p, "%s/ctx-%d-%d", dir, physical, (int)pid);
    return access(p, F_OK) == 0;
}

#endif
