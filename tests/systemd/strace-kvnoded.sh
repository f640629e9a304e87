#!/usr/bin/env bash
# Runs the real kvnoded ($KVNODED_REAL) under strace for tests/systemd/security.sh:
# -D keeps kvnoded's own pid (the tests signal it), -f follows its threads,
# and a count of every system call goes to $KVNODE_STRACE_DIR/kvnoded.PID.
exec strace -D -f -qq -c -o "$KVNODE_STRACE_DIR/kvnoded.$$" "$KVNODED_REAL" "$@"
