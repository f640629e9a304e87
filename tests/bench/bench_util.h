/* What the benchmark programs share: failing loudly. Define BENCH_NAME (the
 * program's name, for messages) before including. */
#ifndef KVNODE_BENCH_UTIL_H
#define KVNODE_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "kvnode.h"

#ifndef BENCH_NAME
#error "define BENCH_NAME before including bench_util.h"
#endif

_Noreturn static inline void die(const char *what, const char *detail)
{
    fprintf(stderr, BENCH_NAME ": %s: %s\n", what, detail);
    exit(1);
}

/* die() naming the call, the code and the client's last error when rc != 0. */
static inline void check(kvnode_client *c, int rc, const char *what)
{
    if (rc != 0) {
        char m[512];
        snprintf(m, sizeof m, "%d (%s): %s", rc, kvnode_strerror(rc), kvnode_last_error(c));
        die(what, m);
    }
}

#endif
