/* fakecuda_daemon: how an integration test points the kvnoded it starts at
 * the strict fake CUDA (the environment entries for kvh_spawn_opts.env). */
#ifndef KVNODE_TEST_FAKECUDA_DAEMON_H
#define KVNODE_TEST_FAKECUDA_DAEMON_H

#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* A fresh state folder into dir (PATH_MAX bytes), and the entries that
 * point a daemon at the fake and at dir into ld_path ("LD_LIBRARY_PATH=...",
 * 2 * PATH_MAX + 32 bytes) and dir_env ("FAKECUDA_DIR=...", PATH_MAX + 32
 * bytes). The fake's folder: $FAKECUDA_LIBDIR, else <folder of
 * kvnoded>/tests/fakecuda (the real kvnoded's under `make valgrind`, where
 * $KVNODED is a wrapper script). */
static inline void fakecuda_daemon_env(char dir[PATH_MAX], char ld_path[2 * PATH_MAX + 32],
                                       char dir_env[PATH_MAX + 32])
{
    char daemon[PATH_MAX], libdir[PATH_MAX + 32];
    const char *env_dir = getenv("FAKECUDA_LIBDIR"), *real = getenv("KVNODED_REAL");
    const char *bin = real && *real ? real : kvh_daemon_path();

    ck_assert_int_eq(kvh_mkdtemp(dir, PATH_MAX), 0);
    ck_assert_msg(realpath(bin, daemon), "realpath %s", bin);
    *strrchr(daemon, '/') = '\0';
    if (env_dir && *env_dir)
        snprintf(libdir, sizeof libdir, "%s", env_dir);
    else
        snprintf(libdir, sizeof libdir, "%s/tests/fakecuda", daemon);
    ck_assert_msg(access(libdir, F_OK) == 0, "no fake CUDA library in %s (make builds it)", libdir);
    snprintf(ld_path, 2 * PATH_MAX + 32, "LD_LIBRARY_PATH=%s", libdir);
    snprintf(dir_env, PATH_MAX + 32, "FAKECUDA_DIR=%s", dir);
}

#endif
