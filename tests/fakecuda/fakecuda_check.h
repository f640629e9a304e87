/* fakecuda_check.h: running a Check suite whose tests use the strict fake
 * CUDA. The fake reads its settings once per process, so every test runs in
 * a fresh child whatever CK_FORK says (make valgrind sets no; valgrind
 * follows the forks). */
#ifndef FAKECUDA_CHECK_H
#define FAKECUDA_CHECK_H

#include <check.h>
#include <stdlib.h>

/* Runs s (freed) a process per test; EXIT_SUCCESS when every test passed. */
static inline int fakecuda_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    int failed;

    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
