/* seccomp-run: runs a program under an allow list of system calls, as
 * systemd/kvnoded.service's SystemCallFilter= with SystemCallErrorNumber=EPERM
 * does (any other call fails with EPERM), with no capabilities
 * (CapabilityBoundingSet=: the bounding set emptied, so even root's exec gets
 * none) and NoNewPrivileges=, for tests/systemd/security.sh, where systemd
 * itself cannot start the unit.
 *
 *   seccomp-run LIST PROGRAM [ARG]...
 *
 * LIST: one system call name a line (scripts/unit-syscalls.py --list); names
 * this kernel or architecture lacks are skipped, as systemd skips them.
 * libseccomp is opened at run time: only its runtime library is installed
 * (systemd depends on it), not its header. Exits 125 when it cannot load the
 * filter, else as PROGRAM. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define SCMP_ACT_ALLOW    0x7fff0000U
#define SCMP_ACT_ERRNO(e) (0x00050000U | ((uint32_t)(e) & 0x0000ffffU))

typedef void *(*init_fn)(uint32_t def_action);
typedef int (*resolve_fn)(const char *name);
typedef int (*rule_add_fn)(void *ctx, uint32_t action, int syscall, unsigned int arg_cnt, ...);
typedef int (*load_fn)(void *ctx);

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: seccomp-run LIST PROGRAM [ARG]...\n");
        return 125;
    }
    void *lib = dlopen("libseccomp.so.2", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "seccomp-run: %s\n", dlerror());
        return 125;
    }
    init_fn init = (init_fn)dlsym(lib, "seccomp_init");
    resolve_fn resolve = (resolve_fn)dlsym(lib, "seccomp_syscall_resolve_name");
    rule_add_fn rule_add = (rule_add_fn)dlsym(lib, "seccomp_rule_add");
    load_fn load = (load_fn)dlsym(lib, "seccomp_load");
    if (!init || !resolve || !rule_add || !load) {
        fprintf(stderr, "seccomp-run: libseccomp.so.2 lacks a function: %s\n", dlerror());
        return 125;
    }
    FILE *f = fopen(argv[1], "re");
    if (!f) {
        fprintf(stderr, "seccomp-run: %s: %s\n", argv[1], strerror(errno));
        return 125;
    }
    void *ctx = init(SCMP_ACT_ERRNO(EPERM));
    if (!ctx) {
        fprintf(stderr, "seccomp-run: seccomp_init failed\n");
        fclose(f);
        return 125;
    }
    char name[128];
    unsigned allowed = 0;
    while (fscanf(f, "%127s", name) == 1) {
        int nr = resolve(name);
        if (nr < 0)             /* not a call of this architecture */
            continue;
        if (rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) == 0)
            allowed++;
    }
    fclose(f);
    if (allowed == 0) {
        fprintf(stderr, "seccomp-run: %s allows no system call of this architecture\n", argv[1]);
        return 125;
    }
    /* As CapabilityBoundingSet= (empty): up to the first capability this
     * kernel does not know (EINVAL). */
    for (int cap = 0; cap < 64; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0)
            continue;
        if (errno == EINVAL)
            break;
        fprintf(stderr, "seccomp-run: cannot drop capability %d from the bounding set: %s\n", cap,
                strerror(errno));
        return 125;
    }
    /* As NoNewPrivileges=yes: also what lets an unprivileged process load it. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || load(ctx) != 0) {
        fprintf(stderr, "seccomp-run: cannot load the filter: %s\n", strerror(errno));
        return 125;
    }
    execv(argv[2], argv + 2);
    fprintf(stderr, "seccomp-run: %s: %s\n", argv[2], strerror(errno));
    return 127;
}
