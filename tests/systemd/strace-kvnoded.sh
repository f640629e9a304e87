#!/usr/bin/env bash
# Runs kvnoded ($KVNODE_WRAPPED) under strace for tests/systemd/security.sh:
# -D keeps kvnoded's own pid (the tests signal it), -f follows its threads,
# and a count of every system call goes to $KVNODE_STRACE_DIR/kvnoded.PID.
# (Not $KVNODED_REAL: with it the suites assume valgrind and wait 10x longer.)
exec strace -D -f -qq -c -o "$KVNODE_STRACE_DIR/kvnoded.$$" "$KVNODE_WRAPPED" "$@"
