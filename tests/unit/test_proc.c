/* Unit tests of tests/common/proc.c, the tests' one launcher of child
 * processes: what a child gets (arguments, environment, its own pid in
 * pid_env, stdin from a file, descriptors passed at 3.. and nothing else, the
 * descriptor limit, another user), what comes back (exit status, stdout and
 * stderr, together or apart, the announcement of a server), that a program
 * that cannot be run is proc_spawn's own error naming the cause, and that a
 * child that hangs or ignores SIGTERM is killed at the deadline. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/proc.h"

#define RUN_MS 10000

static int exit_of(int st)
{
    ck_assert_msg(st >= 0, "%s", proc_error());
    ck_assert_msg(WIFEXITED(st), "status 0x%x", st);
    return WEXITSTATUS(st);
}

START_TEST(run_captures_stdout_stderr_and_the_exit_code)
{
    const char *argv[] = { "sh", "-c", "echo out; echo err >&2; exit 3", NULL };
    char *out, *err;
    ck_assert_int_eq(exit_of(proc_run(&(struct proc_opts){ .argv = argv }, RUN_MS, &out, &err)), 3);
    ck_assert_str_eq(out, "out\n");
    ck_assert_str_eq(err, "err\n");
    free(out);
    free(err);

    /* stderr where stdout goes */
    const char *both[] = { "sh", "-c", "echo a; echo b >&2; echo c", NULL };
    ck_assert_int_eq(exit_of(proc_run(&(struct proc_opts){ .argv = both, .err = PROC_TO_STDOUT }, RUN_MS, &out,
                                      NULL)),
                     0);
    ck_assert_str_eq(out, "a\nb\nc\n");
    free(out);
    ck_assert_int_eq(proc_exit_code(0x0300), 3);
    ck_assert_int_eq(proc_exit_code(SIGKILL), PROC_EXIT_SIGNAL_BASE + SIGKILL);
    ck_assert_int_eq(proc_exit_code(PROC_TIMEOUT), PROC_TIMEOUT);
}
END_TEST

START_TEST(stdin_from_a_file_and_output_into_files)
{
    char dir[] = "/tmp/kvnode-proc-XXXXXX", in[64], out[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    FILE *f = fopen(in, "w");
    ck_assert_ptr_nonnull(f);
    fputs("hello\n", f);
    ck_assert_int_eq(fclose(f), 0);
    const char *cat[] = { "cat", NULL };
    ck_assert_int_eq(exit_of(proc_run(&(struct proc_opts){ .argv = cat, .in = PROC_FILE, .in_path = in,
                                                           .out = PROC_FILE, .out_path = out },
                                      RUN_MS, NULL, NULL)),
                     0);
    f = fopen(out, "r");
    ck_assert_ptr_nonnull(f);
    char line[32] = "";
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    fclose(f);
    ck_assert_str_eq(line, "hello\n");
    /* a stdin that cannot be opened: nothing starts */
    char *text = NULL;
    ck_assert_int_eq(proc_run(&(struct proc_opts){ .argv = cat, .in = PROC_FILE, .in_path = "/nonexistent/in" },
                              RUN_MS, &text, NULL),
                     -1);
    ck_assert_ptr_null(text);
    ck_assert_msg(strstr(proc_error(), "/nonexistent/in") && strstr(proc_error(), strerror(ENOENT)), "%s",
                  proc_error());
    unlink(in);
    unlink(out);
    rmdir(dir);
}
END_TEST

START_TEST(a_program_that_cannot_run_is_a_spawn_error)
{
    const char *argv[] = { "/nonexistent/kvnode-prog", "x", NULL };
    ck_assert_int_eq(proc_spawn(&(struct proc_opts){ .argv = argv }, NULL), -1);
    ck_assert_msg(strstr(proc_error(), "exec /nonexistent/kvnode-prog") && strstr(proc_error(), strerror(ENOENT)),
                  "%s", proc_error());
    const char *in_path[] = { "kvnode-no-such-program-in-path", NULL };
    ck_assert_int_eq(proc_run(&(struct proc_opts){ .argv = in_path }, RUN_MS, NULL, NULL), -1);
    ck_assert_msg(strstr(proc_error(), "exec kvnode-no-such-program-in-path"), "%s", proc_error());
    /* a stream that cannot be a pipe without somewhere to hand it back */
    const char *sh[] = { "true", NULL };
    ck_assert_int_eq(proc_spawn(&(struct proc_opts){ .argv = sh, .out = PROC_PIPE }, NULL), -1);
    ck_assert_int_eq(proc_spawn(&(struct proc_opts){ 0 }, NULL), -1);
}
END_TEST

START_TEST(a_hang_is_killed_at_the_deadline)
{
    struct timespec t0, t1;
    const char *argv[] = { "sh", "-c", "echo started; exec sleep 60", NULL };
    char *out;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(proc_run(&(struct proc_opts){ .argv = argv }, 300, &out, NULL), PROC_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_str_eq(out, "started\n");   /* what it printed before the deadline */
    free(out);
    ck_assert_msg(strstr(proc_error(), "did not finish within 300 ms"), "%s", proc_error());
    ck_assert_int_lt(t1.tv_sec - t0.tv_sec, 30);   /* killed, not waited out */
}
END_TEST

/* A child that ignores SIGTERM and says so on the pipe at *arg. */
static int ignore_term(void *arg)
{
    signal(SIGTERM, SIG_IGN);
    if (write(*(int *)arg, "i", 1) != 1)
        return 1;
    for (;;)
        pause();
}

START_TEST(stop_signals_then_kills)
{
    const char *argv[] = { "sleep", "60", NULL };
    pid_t pid = proc_spawn(&(struct proc_opts){ .argv = argv }, NULL);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(proc_wait(&pid, 0), PROC_TIMEOUT);   /* running */
    int st = proc_stop(&pid, SIGTERM, RUN_MS);
    ck_assert(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
    ck_assert_int_eq(pid, 0);
    ck_assert_int_eq(proc_stop(&pid, SIGTERM, RUN_MS), -1);   /* nothing left to stop */

    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid = proc_spawn(&(struct proc_opts){ .fn = ignore_term, .arg = &p[1] }, NULL);
    ck_assert_int_gt(pid, 0);
    struct pollfd pf = { .fd = p[0], .events = POLLIN };
    char c;
    ck_assert_int_eq(poll(&pf, 1, RUN_MS), 1);
    ck_assert_int_eq(read(p[0], &c, 1), 1);
    ck_assert_int_eq(proc_stop(&pid, SIGTERM, 200), PROC_TIMEOUT);
    ck_assert_int_eq(pid, 0);   /* SIGKILLed and reaped */
    close(p[0]);
    close(p[1]);
}
END_TEST

static int exit_42(void *arg)
{
    (void)arg;
    return 42;
}

START_TEST(a_function_child_exits_with_its_result)
{
    pid_t pid = proc_spawn(&(struct proc_opts){ .fn = exit_42 }, NULL);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(exit_of(proc_wait(&pid, RUN_MS)), 42);
}
END_TEST

START_TEST(environment_and_own_pid)
{
    const char *argv[] = { "sh", "-c", "echo \"$KVNODE_PROC_T $KVNODE_PROC_PID $$ ${HOME:+home}\"", NULL };
    const char *env[] = { "KVNODE_PROC_T=value", NULL };
    const char *pid_env[] = { "KVNODE_PROC_PID", NULL };
    struct proc_pipes pp;
    pid_t pid = proc_spawn(&(struct proc_opts){ .argv = argv, .env = env, .pid_env = pid_env, .out = PROC_PIPE },
                           &pp);
    ck_assert_int_gt(pid, 0);
    char buf[128], want[128];
    const char *const nl[] = { "value", NULL };
    ck_assert_msg(proc_read_announce(pp.out, nl, buf, sizeof buf, RUN_MS) == 0, "%s", proc_error());
    close(pp.out);
    snprintf(want, sizeof want, "value %d %d %s\n", (int)pid, (int)pid, getenv("HOME") ? "home" : "");
    ck_assert_str_eq(buf, want);   /* inherited entries stay */
    ck_assert_int_eq(exit_of(proc_wait(&pid, RUN_MS)), 0);
}
END_TEST

START_TEST(passed_descriptors_and_nothing_else)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    int stray = open("/dev/null", O_RDONLY);   /* inheritable, not passed */
    ck_assert_int_ge(stray, 0);
    char script[256];
    snprintf(script, sizeof script,
             "echo three >&3 && echo four >&4 && exec 3>&- 4>&- && "
             "if [ -e /proc/self/fd/%d ]; then echo leaked; fi; ulimit -n",
             stray);
    const char *argv[] = { "sh", "-c", script, NULL };
    char *out;
    ck_assert_int_eq(exit_of(proc_run(&(struct proc_opts){ .argv = argv, .pass_fd = p[1], .pass_count = 2,
                                                           .close_fds = true, .nofile = 77 },
                                      RUN_MS, &out, NULL)),
                     0);
    /* valgrind only emulates RLIMIT_NOFILE for the process it runs: a
     * program exec'd from it gets valgrind's own limit, not the one set. */
    const char *vg = getenv("VALGRIND");
    if (!(vg && strcmp(vg, "1") == 0))
        ck_assert_str_eq(out, "77\n");
    free(out);
    close(p[1]);
    char got[32] = "";
    ssize_t n = read(p[0], got, sizeof got - 1);
    ck_assert_int_eq(n, 11);
    ck_assert_str_eq(got, "three\nfour\n");
    close(p[0]);
    close(stray);
}
END_TEST

static int report_ids(void *arg)
{
    (void)arg;
    return getuid() == 65534 && geteuid() == 65534 && getgid() == 65534 && getegid() == 65534 &&
                   getgroups(0, NULL) == 0
               ? 0
               : 1;
}

START_TEST(another_user)
{
    struct proc_opts o = { .fn = report_ids, .as_user = true, .uid = 65534, .gid = 65534 };
    pid_t pid = proc_spawn(&o, NULL);
    if (geteuid() != 0) {
        ck_assert_int_eq(pid, -1);
        ck_assert_msg(strstr(proc_error(), "needs root"), "%s", proc_error());
        return;
    }
    ck_assert_msg(pid > 0, "%s", proc_error());
    ck_assert_int_eq(exit_of(proc_wait(&pid, RUN_MS)), 0);
}
END_TEST

START_TEST(announcement)
{
    const char *argv[] = { "sh", "-c", "echo http=127.0.0.1:5; echo socket=/x; exec sleep 60", NULL };
    static const char *const keys[] = { "http=", "socket=", NULL };
    struct proc_pipes pp;
    pid_t pid = proc_spawn(&(struct proc_opts){ .argv = argv, .out = PROC_PIPE }, &pp);
    ck_assert_int_gt(pid, 0);
    char buf[256];
    ck_assert_msg(proc_read_announce(pp.out, keys, buf, sizeof buf, RUN_MS) == 0, "%s", proc_error());
    close(pp.out);
    ck_assert_str_eq(buf, "http=127.0.0.1:5\nsocket=/x\n");
    ck_assert(WIFSIGNALED(proc_stop(&pid, SIGTERM, RUN_MS)));

    /* one that exits half-way, and one that never says it */
    const char *quits[] = { "sh", "-c", "echo http=127.0.0.1:5", NULL };
    pid = proc_spawn(&(struct proc_opts){ .argv = quits, .out = PROC_PIPE }, &pp);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(proc_read_announce(pp.out, keys, buf, sizeof buf, RUN_MS), -1);
    ck_assert_msg(strstr(proc_error(), "exited before announcing itself"), "%s", proc_error());
    close(pp.out);
    ck_assert_int_eq(exit_of(proc_wait(&pid, RUN_MS)), 0);
    const char *silent[] = { "sleep", "60", NULL };
    pid = proc_spawn(&(struct proc_opts){ .argv = silent, .out = PROC_PIPE }, &pp);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(proc_read_announce(pp.out, keys, buf, sizeof buf, 200), -1);
    ck_assert_msg(strstr(proc_error(), "did not announce itself within 200 ms"), "%s", proc_error());
    close(pp.out);
    ck_assert(WIFSIGNALED(proc_stop(&pid, SIGTERM, RUN_MS)));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proc");
    TCase *tc = tcase_create("proc");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, run_captures_stdout_stderr_and_the_exit_code);
    tcase_add_test(tc, stdin_from_a_file_and_output_into_files);
    tcase_add_test(tc, a_program_that_cannot_run_is_a_spawn_error);
    tcase_add_test(tc, a_hang_is_killed_at_the_deadline);
    tcase_add_test(tc, stop_signals_then_kills);
    tcase_add_test(tc, a_function_child_exits_with_its_result);
    tcase_add_test(tc, environment_and_own_pid);
    tcase_add_test(tc, passed_descriptors_and_nothing_else);
    tcase_add_test(tc, another_user);
    tcase_add_test(tc, announcement);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
