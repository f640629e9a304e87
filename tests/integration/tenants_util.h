/* tenants_util: what the integration tests need to act as other users
 * against a real daemon: the root guard, opening the daemon's temporary
 * directories to them, running a function as another uid (and groups) in a
 * child (tests/common/proc.h), and one tenant's line of the stats.
 *
 * Used by test_daemon_tenants.c, test_daemon_tenants_reload.c,
 * test_daemon_readers.c, test_daemon_access.c and the tenant tests of
 * test_daemon_persist_v6d.c.
 *
 * Header-only (static inline: the integration-test rule links harness.c and
 * proc.c only); failures are Check assertions. Include check.h and harness.h
 * first. */
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

/* Acting as other users needs root: run as root in CI; elsewhere the test
 * says so (what: "suite: the test") and passes without checking. */
#define TENANTS_NEEDS_ROOT(what) do { \
        if (geteuid() != 0) { \
            fprintf(stderr, "%s needs root to act as other users; checked as root in CI\n", what); \
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

/* Start a daemon with conf whose socket other users can reach. */
static inline void tenants_start(kvh_daemon *d, const char *conf)
{
    KVH_START(d, conf);
    tenants_open_dirs(d);
}

/* Start fn(arg) in a child as uid, with primary group gid and the ngroups
 * supplementary groups (NULL / 0: none); its pid (asserted started). */
static inline pid_t tenants_spawn_as(int (*fn)(void *), void *arg, uid_t uid, gid_t gid, const gid_t *groups,
                                     size_t ngroups)
{
    pid_t pid = proc_spawn(&(struct proc_opts){ .fn = fn, .arg = arg, .as_user = true, .uid = uid, .gid = gid,
                                                .groups = groups, .ngroups = ngroups }, NULL);
    ck_assert_msg(pid > 0, "%s", proc_error());
    return pid;
}

/* fn(arg) as uid with its own gid (no supplementary groups), waited for
 * within timeout_ms: its wait status (proc_wait's: < 0 when it did not end);
 * the caller asserts on it. */
static inline int tenants_status_as(int (*fn)(void *), void *arg, uid_t uid, int timeout_ms)
{
    pid_t pid = tenants_spawn_as(fn, arg, uid, uid, NULL, 0);
    return proc_wait(&pid, timeout_ms);
}

/* Run fn(arg) in a child as uid, with primary group gid and the ngroups
 * supplementary groups (NULL / 0: none); its exit code (it must exit, within
 * 60 s). */
static inline int tenants_run_as(int (*fn)(void *), void *arg, uid_t uid, gid_t gid, const gid_t *groups,
                                 size_t ngroups)
{
    pid_t pid = tenants_spawn_as(fn, arg, uid, gid, groups, ngroups);
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
