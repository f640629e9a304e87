/* tenants_util: what the tenant integration tests need to act as other users
 * against a real daemon: the root guard, opening the daemon's temporary
 * directories to them, running a function as another uid (and groups) in a
 * child (tests/common/proc.h), and one tenant's line of /stats.
 *
 * Used by test_daemon_tenants_reload.c for now; test_daemon_tenants.c has its
 * own copies of open_dirs / tenant_stats and can switch to these.
 *
 * Header-only (static inline); failures are Check assertions. Include check.h
 * and harness.h first. */
#ifndef KVNODE_TESTS_TENANTS_UTIL_H
#define KVNODE_TESTS_TENANTS_UTIL_H

#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* Acting as other users needs root (as test_daemon_access): run as root in
 * CI; elsewhere the test says so and passes without checking. */
#define TENANTS_NEEDS_ROOT(what) do { \
        if (geteuid() != 0) { \
            fprintf(stderr, "tenants: %s needs root to act as other users; checked as root in CI\n", what); \
            return; \
        } \
    } while (0)

/* Let other users reach the daemon's socket through its temporary directories. */
static inline void tenants_open_dirs(const kvh_daemon *d)
{
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", d->dir);
    *strrchr(parent, '/') = '\0';
    ck_assert_int_eq(chmod(parent, 0755), 0);
    ck_assert_int_eq(chmod(d->dir, 0755), 0);
}

/* Run fn(arg) in a child as uid, with primary group gid and the ngroups
 * supplementary groups (NULL / 0: none); its exit code (it must exit, within
 * 60 s). */
static inline int tenants_run_as(int (*fn)(void *), void *arg, uid_t uid, gid_t gid, const gid_t *groups,
                                 size_t ngroups)
{
    pid_t pid = proc_spawn(&(struct proc_opts){ .fn = fn, .arg = arg, .as_user = true, .uid = uid, .gid = gid,
                                                .groups = groups, .ngroups = ngroups }, NULL);
    ck_assert_msg(pid > 0, "%s", proc_error());
    int st = proc_wait(&pid, 60000);
    ck_assert_msg(st >= 0, "child: %s", proc_error());
    ck_assert_msg(WIFEXITED(st), "child uid %d died: status %d", (int)uid, st);
    return WEXITSTATUS(st);
}

/* The "tenants" line of tenant `name` in a stats document (a reference into st). */
static inline json_t *tenants_line(json_t *st, const char *name)
{
    json_t *arr = kvh_json_get(st, "tenants"), *t;
    size_t i;
    json_array_foreach(arr, i, t)
        if (strcmp(json_string_value(json_object_get(t, "name")), name) == 0)
            return t;
    ck_abort_msg("no tenant %s in the stats", name);
    return NULL;
}

/* One figure of tenant `name`'s line, from the daemon's STATS (as root). */
static inline long long tenants_stat(const kvh_daemon *d, const char *name, const char *key)
{
    json_t *st = kvh_stats(d);
    ck_assert_msg(st != NULL, "stats: %s", kvh_error());
    long long v = kvh_json_int(tenants_line(st, name), key);
    json_decref(st);
    ck_assert_msg(v >= 0, "tenant %s: no %s", name, key);
    return v;
}

#endif
