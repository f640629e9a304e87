/* fuzz: what every fuzz target (tests/fuzz/fuzz_*.c) shares.
 *
 * A target defines LLVMFuzzerTestOneInput(); the same file is linked either
 * with libFuzzer (`make fuzz`: clang -fsanitize=fuzzer,address,undefined,
 * into $(BUILD)/fuzz/) or with tests/fuzz/replay.c (`make check`: any
 * compiler, replays tests/fuzz/corpus/<target>/ plus fixed-seed mutations).
 * A target must accept any bytes; FUZZ_CHECK states what must hold whatever
 * the input was, and abort()s (a crash for libFuzzer, a failed test for the
 * replay) when it does not. */
#ifndef KVNODE_FUZZ_H
#define KVNODE_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond);    \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

#endif
