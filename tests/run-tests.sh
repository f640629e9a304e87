#!/usr/bin/env bash
# Run the test programs, TEST_JOBS at a time, each with a hard timeout; print
# each one's output in one piece when it ends, then one summary line.
# Usage: run-tests.sh BIN...   (BUILD=<build dir> in the environment)
# TEST_JOBS: how many run at once (default: twice the CPU count, as most
# suites spend their time waiting on daemons, sockets and timers).
# The longest suites start first: the order comes from the durations the last
# run recorded ($BUILD/tests/durations), else from the list below.
# VALGRIND=1 runs every test binary, and every daemon the integration tests
# start, under valgrind; any error or definite leak fails the suite.
set -u
BUILD=${BUILD:-build}
export KVNODED="$PWD/$BUILD/kvnoded" KVNODECTL="$PWD/$BUILD/kvnodectl"
export KVS_SIM=${KVS_SIM:-"$PWD/$BUILD/kvs-sim"}   # KVS protocol simulator (tests/sim)
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}
per_binary_timeout=${TEST_TIMEOUT:-300}
ncpu=$(nproc 2>/dev/null || echo 2)
jobs=${TEST_JOBS:-$((ncpu * 2))}
runner=()
if [[ ${VALGRIND:-0} == 1 ]]; then
  export KVNODED_REAL="$KVNODED" KVNODED="$PWD/tests/valgrind-kvnoded.sh" CK_FORK=no
  export CK_DEFAULT_TIMEOUT=600
  per_binary_timeout=900
  jobs=${TEST_JOBS:-$ncpu}   # valgrind keeps a CPU busy: no more than one suite per CPU
  runner=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect
          --show-leak-kinds=definite,indirect)
fi
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "run-tests.sh: TEST_JOBS must be a positive integer, not '$jobs'" >&2; exit 2; }

# Seconds each suite took in a full run on a 2-core machine (longest first);
# used until the first run here has recorded its own figures.
static_durations="
test_daemon_kvcm 25
test_daemon_persist_v6d 25
test_persist 13
test_daemon_dos 11
test_daemon_hbm 11
test_daemon_kvcm_query 10
test_daemon_systemd 8
test_daemon_persist_file 7
test_daemon_nolost 6
test_kvcm_client 6
test_kvs_v6d 6
test_workq 6
test_kvs_sim 4
test_cache_hbm 3
"
durations_file="$BUILD/tests/durations"
declare -A expected=()
while read -r name secs; do
  [[ -n ${name:-} ]] && expected[$name]=$secs
done <<<"$static_durations"
if [[ -r $durations_file ]]; then
  while read -r name secs; do
    [[ -n ${name:-} && $secs =~ ^[0-9]+$ ]] && expected[$name]=$secs
  done <"$durations_file"
fi

# Suites that compare one tenant's latency idle and under another's load:
# they run after all the others, one at a time, so that a neighbouring suite
# (four at once on 2 cores, slower still under ASan) is not part of "load".
solo_suites=" test_kvs_fair "

# A suite's name: the program's, or for scripts tests/<dir>/x.sh -> test_<dir>.
suite_name() {
  local t=$1
  if [[ $t == *.sh ]]; then
    local d=${t%/*}; echo "test_${d##*/}"
  else
    basename "$t"
  fi
}

# Longest expected first (unknown ones after the known, in the given order).
ordered=()
while read -r _ _ t; do ordered+=("$t"); done < <(
  i=0
  for t in "$@"; do
    n=$(suite_name "$t")
    printf '%s %s %s\n' "${expected[$n]:--1}" "$i" "$t"
    i=$((i + 1))
  done | sort -k1,1nr -k2,2n)

logdir=$(mktemp -d "${TMPDIR:-/tmp}/kvnode-tests.XXXXXX")
trap 'rm -rf "$logdir"' EXIT

# run_one NAME PROGRAM: runs one suite into $logdir/NAME.log, its exit status
# into $logdir/NAME.rc and its seconds into $logdir/NAME.secs.
run_one() {
  local name=$1 t=$2 rc=0 start=$SECONDS
  local run=("${runner[@]}")
  [[ "$t" == *.sh ]] && run=(bash)   # scripts: valgrind would trace bash, not our code
  timeout --kill-after=10 "$per_binary_timeout" "${run[@]}" "$t" >"$logdir/$name.log" 2>&1 || rc=$?
  [[ $rc -eq 124 ]] && echo "*** $name timed out after ${per_binary_timeout}s" >>"$logdir/$name.log"
  echo $((SECONDS - start)) >"$logdir/$name.secs"
  echo "$rc" >"$logdir/$name.rc"
}

passed=0 failed=0 failed_names=()
declare -A running=() launched=()   # pid -> suite name; names started

# finish PID: prints the suite's output in one piece and counts it.
finish() {
  local pid=$1 name=${running[$1]} rc secs
  unset "running[$pid]"
  rc=$(cat "$logdir/$name.rc" 2>/dev/null || echo 1)
  secs=$(cat "$logdir/$name.secs" 2>/dev/null || echo 0)
  echo "=== $name (${secs}s)"
  cat "$logdir/$name.log"
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); failed_names+=("$name")
  fi
}

# start PROGRAM LIMIT: runs one suite once fewer than LIMIT suites run.
start() {
  local t=$1 limit=$2 name
  while [[ ${#running[@]} -ge $limit ]]; do
    wait -n -p done_pid "${!running[@]}"
    finish "$done_pid"
  done
  name=$(suite_name "$t")
  [[ -n ${launched[$name]:-} ]] && name="$name-${#launched[@]}"   # two scripts in one folder
  launched[$name]=1
  run_one "$name" "$t" &
  running[$!]=$name
}

solo=()
for t in "${ordered[@]}"; do
  if [[ $solo_suites == *" $(suite_name "$t") "* ]]; then
    solo+=("$t")
    continue
  fi
  start "$t" "$jobs"
done
for t in "${solo[@]}"; do
  start "$t" 1
done
while [[ ${#running[@]} -gt 0 ]]; do
  wait -n -p done_pid "${!running[@]}"
  finish "$done_pid"
done

# Record the durations for the next run's order (suites not run keep theirs;
# valgrind's would mislead a normal run).
if [[ -d $BUILD/tests && ${VALGRIND:-0} != 1 ]]; then
  for f in "$logdir"/*.secs; do
    [[ -e $f ]] || continue
    n=${f##*/}; expected[${n%.secs}]=$(cat "$f")
  done
  for n in "${!expected[@]}"; do echo "$n ${expected[$n]}"; done |
    sort -k2,2nr >"$durations_file.tmp" && mv "$durations_file.tmp" "$durations_file"
fi

echo
[[ $failed -gt 0 ]] && echo "failed: ${failed_names[*]}"
echo "test suites: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
