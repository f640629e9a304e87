/* Access control: allow_uids / allow_gids decide who is served (checked on
 * accept with SO_PEERCRED), refusals are explained and counted, the lists
 * reload, and socket_group owns the socket file. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tenants_util.h"

#define NOBODY 65534

struct try_as_arg {
    const kvh_daemon *d;
    uid_t uid;
};

/* The child of try_as: connect with a layout and put one block. */
static int connect_and_put(void *arg)
{
    const struct try_as_arg *a = arg;
    kvnode_layout l = kvh_layout("access", 4096, 1, 0);
    kvnode_client *c;
    int rc = kvnode_connect(a->d->sock, &l, &c);
    if (rc == -KVNODE_EDENIED) {
        char want[32];
        snprintf(want, sizeof want, "uid %d", (int)a->uid);
        return strstr(kvnode_connect_error(), want) ? 1 : 11;
    }
    if (rc != 0)
        return 12;
    kvnode_key k = 1;
    rc = kvh_put(c, &k, 1, 7);
    kvnode_close(c);
    return rc == 0 ? 0 : 13;
}

/* In a child running as uid/gid (no supplementary groups), connect with a
 * layout and put one block. Exit 0: served; 1: refused with EDENIED and a
 * message naming the uid; anything else: unexpected. */
static int try_as(const kvh_daemon *d, uid_t uid, gid_t gid)
{
    struct try_as_arg a = { d, uid };
    pid_t pid = tenants_spawn_as(connect_and_put, &a, uid, gid, NULL, 0);
    int st = proc_wait(&pid, 10000);
    ck_assert_msg(st >= 0, "child: %s", proc_error());
    ck_assert_msg(WIFEXITED(st), "child died: status %d", st);
    return WEXITSTATUS(st);
}

START_TEST(allow_lists_decide_who_is_served)
{
    TENANTS_NEEDS_ROOT("access: the allow-list test");
    kvh_daemon d;
    tenants_start(&d, "server.socket_mode=0666\nserver.allow_uids=root\n");

    /* Not listed: refused, explained, counted; root still served. */
    ck_assert_int_eq(try_as(&d, NOBODY, NOBODY), 1);
    ck_assert_int_eq(KVH_STAT(&d, "clients.denied_total"), 1);
    ck_assert_int_eq(try_as(&d, 0, 0), 0);
    char *log = kvh_read_log(&d);
    ck_assert_ptr_nonnull(strstr(log, "access denied: uid 65534"));
    free(log);

    /* Listing the group lets it in, after a reload. */
    ck_assert_int_eq(kvh_rewrite_config(&d, "server.socket_mode=0666\nserver.allow_uids=root\n"
                                            "server.allow_gids=65534\n"), 0);
    kvnode_client *c;
    ck_assert_int_eq(kvnode_connect(d.sock, NULL, &c), 0);
    KVH_OK(c, kvnode_reload(c, NULL));
    kvnode_close(c);
    ck_assert_int_eq(try_as(&d, NOBODY, NOBODY), 0);
    ck_assert_int_eq(try_as(&d, 4242, 4242), 1);

    /* Listing the uid works too; empty lists let anyone in. */
    ck_assert_int_eq(kvh_rewrite_config(&d, "server.socket_mode=0666\nserver.allow_uids=4242\n"), 0);
    ck_assert_int_eq(kvnode_connect(d.sock, NULL, &c), 0);
    KVH_OK(c, kvnode_reload(c, NULL));
    kvnode_close(c);
    ck_assert_int_eq(try_as(&d, 4242, 4242), 0);
    ck_assert_int_eq(try_as(&d, NOBODY, NOBODY), 1);
    ck_assert_int_eq(kvh_rewrite_config(&d, "server.socket_mode=0666\n"), 0);
    ck_assert_int_eq(kvnode_connect(d.sock, NULL, &c), 0);
    KVH_OK(c, kvnode_reload(c, NULL));
    kvnode_close(c);
    ck_assert_int_eq(try_as(&d, NOBODY, NOBODY), 0);
    ck_assert_int_eq(KVH_STAT(&d, "clients.denied_total"), 3);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(socket_mode_and_group_apply_to_the_socket_file)
{
    kvh_daemon d;
    gid_t gid = getegid();
    char cfg[128];
    snprintf(cfg, sizeof cfg, "server.socket_mode=0640\nserver.socket_group=%d\n", (int)gid);
    KVH_START(&d, cfg);
    struct stat st;
    ck_assert_int_eq(stat(d.sock, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0640);
    ck_assert_uint_eq(st.st_gid, gid);
    KVH_STOP_DESTROY(&d);
    if (geteuid() == 0) {
        KVH_START(&d, "server.socket_group=65534\n");
        ck_assert_int_eq(stat(d.sock, &st), 0);
        ck_assert_uint_eq(st.st_gid, 65534);
        KVH_STOP_DESTROY(&d);
    }
}
END_TEST

int main(void)
{
    const TTest *const tests[] = {
        allow_lists_decide_who_is_served,
        socket_mode_and_group_apply_to_the_socket_file,
    };
    return kvh_run_suite("daemon_access", "access", 30, tests, sizeof tests / sizeof tests[0]);
}
