#!/usr/bin/env bash
# The whole test suite under load, to find flaky tests: ROUNDS rounds, each
# running `make test` in two fresh clones of the current commit at once while
# a CPU hog (HOGS busy loops, default 1) runs beside them. Prints one line per run and a summary; the
# logs of failed runs are kept (their paths are printed).
# Usage: scripts/suite-under-load.sh [ROUNDS]   (default 5: 10 runs)
# Needs nothing but git and what `make test` installs; run it on an otherwise
# idle machine, it takes about 5 minutes a round on 2 cores.
set -u
rounds=${1:-5}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [ROUNDS]" >&2; exit 2; }
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel) || exit 2
commit=$(git -C "$repo" rev-parse HEAD)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvnode-load.XXXXXX")
hog_pids=()
stop_hogs() { [[ ${#hog_pids[@]} -gt 0 ]] && kill "${hog_pids[@]}" 2>/dev/null; wait "${hog_pids[@]}" 2>/dev/null; hog_pids=(); }
trap 'stop_hogs; rm -rf "$work/clone-"*' EXIT
trap 'exit 130' INT TERM

runs=0 passed=0 failed=0 kept=()
for ((r = 1; r <= rounds; r++)); do
  for s in a b; do
    rm -rf "$work/clone-$s"
    git clone -q --no-hardlinks "$repo" "$work/clone-$s" && git -C "$work/clone-$s" checkout -q "$commit" || exit 2
  done
  for ((i = 0; i < ${HOGS:-1}; i++)); do (while :; do :; done) & hog_pids+=($!); done
  pids=()
  for s in a b; do
    (cd "$work/clone-$s" && timeout 1800 make test >"$work/round-$r-$s.log" 2>&1) & pids+=($!)
  done
  i=0
  for s in a b; do
    rc=0; wait "${pids[$i]}" || rc=$?; i=$((i + 1)); runs=$((runs + 1))
    summary=$(grep -E '^test suites:' "$work/round-$r-$s.log" | tail -1)
    if [[ $rc -eq 0 ]]; then
      passed=$((passed + 1)); rm -f "$work/round-$r-$s.log"
      echo "round $r run $s: passed (${summary:-no summary})"
    else
      failed=$((failed + 1)); kept+=("$work/round-$r-$s.log")
      echo "round $r run $s: FAILED rc=$rc (${summary:-no summary}) $(grep -E '^failed:' "$work/round-$r-$s.log" | tail -1)"
    fi
  done
  stop_hogs
done
echo "commit $commit: $passed passed, $failed failed (of $runs runs under load)"
[[ ${#kept[@]} -gt 0 ]] && printf 'log of a failed run: %s\n' "${kept[@]}"
[[ $failed -eq 0 ]]
