#!/usr/bin/env bash
# Run each test binary with a hard timeout; print one summary line.
# Usage: run-tests.sh BIN...   (BUILD=<build dir> in the environment)
# VALGRIND=1 runs every test binary, and every daemon the integration tests
# start, under valgrind; any error or definite leak fails the suite.
set -u
BUILD=${BUILD:-build}
export KVNODED="$PWD/$BUILD/kvnoded" KVNODECTL="$PWD/$BUILD/kvnodectl"
export KVS_SIM=${KVS_SIM:-"$PWD/$BUILD/kvs-sim"}   # KVS protocol simulator (tests/sim)
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}
per_binary_timeout=${TEST_TIMEOUT:-300}
runner=()
if [[ ${VALGRIND:-0} == 1 ]]; then
  export KVNODED_REAL="$KVNODED" KVNODED="$PWD/tests/valgrind-kvnoded.sh" CK_FORK=no
  export CK_DEFAULT_TIMEOUT=600
  per_binary_timeout=900
  runner=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect
          --show-leak-kinds=definite,indirect)
fi
passed=0 failed=0 failed_names=()
for t in "$@"; do
  echo "=== $(basename "$t")"
  run=("${runner[@]}")
  [[ "$t" == *.sh ]] && run=(bash)   # scripts: valgrind would trace bash, not our code
  if timeout --kill-after=10 "$per_binary_timeout" "${run[@]}" "$t"; then
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
