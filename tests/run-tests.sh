#!/usr/bin/env bash
# Run each test binary with a hard timeout; print one summary line.
# Usage: run-tests.sh BIN...   (BUILD=<build dir> in the environment)
set -u
BUILD=${BUILD:-build}
export KVNODED="$PWD/$BUILD/kvnoded" KVNODECTL="$PWD/$BUILD/kvnodectl"
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}
per_binary_timeout=${TEST_TIMEOUT:-300}
passed=0 failed=0 failed_names=()
for t in "$@"; do
  echo "=== $(basename "$t")"
  if timeout --kill-after=10 "$per_binary_timeout" "$t"; then
    passed=$((passed + 1))
  else
    rc=$?
    [[ $rc -eq 124 ]] && echo "*** $(basename "$t") timed out after ${per_binary_timeout}s"
    failed=$((failed + 1)); failed_names+=("$(basename "$t")")
  fi
done
echo
[[ $failed -gt 0 ]] && echo "failed: ${failed_names[*]}"
echo "test suites: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
