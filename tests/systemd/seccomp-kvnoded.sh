#!/usr/bin/env bash
# Runs kvnoded ($KVNODE_WRAPPED) under the unit's system-call filter for
# tests/systemd/security.sh: seccomp-run ($KVNODE_SECCOMP_RUN) loads the allow
# list $KVNODE_SECCOMP_LIST (other calls fail with EPERM, as under the unit)
# and execs kvnoded with its own pid (the tests signal it).
exec "$KVNODE_SECCOMP_RUN" "$KVNODE_SECCOMP_LIST" "$KVNODE_WRAPPED" "$@"
