/* Unit tests for daemon/net/unix_listen.c: a listening unix socket at a path
 * never replaces a live listener or a file that is not a socket, and does
 * replace a stale socket file; the mode is applied; a path too long for
 * sockaddr_un is refused naming the limit. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "net/unix_listen.h"

static char dir[256];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "%s/kvnode-ul-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static int connect_to(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    close(fd);
    return rc;
}

START_TEST(listens_replaces_stale_never_live)
{
    char path[300], err[256];
    struct stat st;
    make_dir();
    snprintf(path, sizeof path, "%s/a.sock", dir);

    int fd = unix_listen(path, 0640, 8, "test listen", err, sizeof err);
    ck_assert_msg(fd >= 0, "%s", err);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert(S_ISSOCK(st.st_mode));
    ck_assert_int_eq(st.st_mode & 0777, 0640);
    ck_assert_int_eq(connect_to(path), 0);

    /* Live: refused, and the file is left alone. */
    ck_assert_int_eq(unix_listen(path, 0640, 8, "test listen", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "test listen: another process is listening there"), "%s", err);
    ck_assert_int_eq(connect_to(path), 0);

    /* Stale (the listener closed, the file stays): replaced. */
    close(fd);
    ck_assert_int_ne(connect_to(path), 0);
    fd = unix_listen(path, 0600, 8, "test listen", err, sizeof err);
    ck_assert_msg(fd >= 0, "%s", err);
    ck_assert_int_eq(connect_to(path), 0);
    close(fd);
    unlink(path);

    /* Not a socket: refused, the file kept. */
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("data", f);
    fclose(f);
    ck_assert_int_eq(unix_listen(path, 0600, 8, "test listen", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "exists and is not a socket"), "%s", err);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert(S_ISREG(st.st_mode));
    unlink(path);

    /* Too long for sockaddr_un. */
    char longp[200];
    memset(longp, 'x', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = '\0';
    ck_assert_int_eq(unix_listen(longp, 0600, 8, "test listen", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "1 to 107 bytes"), "%s", err);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("unix_listen");
    TCase *tc = tcase_create("unix_listen");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, listens_replaces_stale_never_live);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
