#!/usr/bin/env bash
# Runs the real kvnoded ($KVNODED_REAL) under valgrind for `make valgrind`:
# any memory error or definite leak makes the daemon exit 99, which the
# integration tests see as a failed stop.
exec valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --show-leak-kinds=definite,indirect "$KVNODED_REAL" "$@"
