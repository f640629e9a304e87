/* fakecuda.h: the test-only helpers the strict fake CUDA library
 * (libfakecuda.so, also loaded as libcuda.so.1 / libcudart.so) exports, for
 * tests that link it. Everything they report lives in $FAKECUDA_DIR, so they
 * see every process that used the same state folder. Tests that only dlopen
 * the fake (or none at all) read the same facts with fakecuda_env.h. */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <sys/types.h>

/* Lines in $FAKECUDA_DIR/violations (every process, every rule); 0 when the
 * file is absent, -1 when it cannot be read or FAKECUDA_DIR is unset. */
int fakecuda_violations(void);

/* The same, only the lines of one rule ("ipc-open-twice", "ipc-pidns",
 * "free-while-mapped", "register-readonly", "register-overlap",
 * "copy-straddles-pin", "copy-direction", "no-context"). */
int fakecuda_violations_of(const char *rule);

/* Primary contexts recorded as ctx-<physical>-<pid> files. pid > 0: that
 * process's (kept after it exits, so a test can ask about a daemon it has
 * stopped); pid <= 0: those of live processes. physical < 0: every device. */
int fakecuda_context_count(pid_t pid, int physical);

/* Creates sticky-<physical>: from the next call on, every context of any
 * process on that physical device fails with 700 (illegal address), for the
 * rest of that process's life. 0, or -1. */
int fakecuda_make_sticky(int physical);

/* Entry points that fail with 999 (CUDA_ERROR_UNKNOWN / cudaErrorUnknown)
 * from the next call on, in every process of the state folder: a comma
 * list like FAKECUDA_FAIL (written to $FAKECUDA_DIR/fail, which a script
 * may write too); NULL or "" ends the failures. 0, or -1. */
int fakecuda_set_fail(const char *names);

#endif
