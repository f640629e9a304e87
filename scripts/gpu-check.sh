#!/usr/bin/env bash
# gpu-check.sh [--sim] [--keep] [--only LIST] [--list]: the GPU path, one
# PASS/FAIL/SKIP line per behaviour, in one command (about 5 minutes on one
# H100; well under a minute with --sim).
#
# Behaviours (issue 28 item 8), in the order they run:
#   preflight    driver vs runtime versions, compute mode, MIG (reported by
#                nvidia-smi and CUDA; nothing is changed)
#   identity     the daemon's bus id is nvidia-smi's; a client with another
#                CUDA_VISIBLE_DEVICES is lent the right GPU's HBM, one on a
#                GPU that serves none gets no HBM; kvnoded holds a context
#                only on its HBM GPU (nvidia-smi --query-compute-apps; under
#                --sim the fake's ctx-<dev>-<pid> files)
#   batch        kvnode_get_batch / kvnode_put_batch(DEVICE), plain and
#                _stream, both ways, byte-exact
#   completion   cudaStreamQuery right after get_batch(DEVICE) returns, dst
#                read on a fresh non-blocking stream, commits ordered after
#                the stream, and a put/delete race (RACE_SECONDS)
#   store        write-through of HBM and device-batch blocks, then the
#                store's contents after a restart
#   restart      a daemon restart under a live client holding leases: old
#                calls fail cleanly, the new daemon gets its HBM, GPU memory
#                returns to its baseline
#   death        a client killed holding leases and HBM mappings
#   reader-pin   a reader client pins its read-only host arena
#   churn        200 connects from 4 processes, each mapping HBM
#   pidns        an engine in another PID namespace (unshare --user --pid
#                --fork --map-root-user; --sim: also FAKECUDA_PIDNS=other)
#                is served HBM (the VMM fd path)
#   demotion     demotion while the daemon still pins its host arena, with a
#                pin chunk that is not a multiple of the slab
#   vllm         kvnode.vllm's device path (tests/gpu/vllm_device.py): one
#                engine's connector saves its KV cache's blocks from GPU memory,
#                another's loads them into its own, byte-exact, through vLLM's
#                calls: a cross-layer cache, per-layer NHD into per-layer HND
#                and back (libkvnode's device gathered calls); each load's
#                bandwidth next to cudaMemcpy (SKIP without torch for
#                /usr/bin/python3)
#
# Each behaviour runs kvnode-gpu-check (tests/bench/gpu_check.c), an engine
# process that links libkvnode.so and dlopens the CUDA runtime, against a
# kvnoded this script starts (hbm.backend=cuda, hbm.required=on,
# memory.pin_host=on, a write_through file store, in a temporary directory).
#
# --sim: no GPU: every behaviour runs with hbm.backend=cuda against the
# strict fake CUDA library ($BUILD/tests/fakecuda, through LD_LIBRARY_PATH;
# two fake GPUs, the daemon serves the second), and a behaviour fails when
# the fake recorded a violation of CUDA's rules ($FAKECUDA_DIR/violations)
# while it ran. `make check` runs it (tests/gpu/run-sim.sh).
# --only LIST: run only these behaviours (comma or space separated).
# --list: print the behaviours and exit. --keep: keep the temporary directory.
#
# Exit status: 0 nothing failed (SKIP lines say what this machine cannot
# do); 1 a behaviour failed; 2 usage, or this machine cannot run the check.
#
# Environment (defaults: GPU / --sim):
#   BUILD=DIR            build directory (build / build)
#   NOBUILD=1            use the binaries already in $BUILD
#   GPU_CHECK_DEVICE     the GPU kvnoded serves (0 / 1: the fake's second)
#   HBM_BYTES            hbm.bytes (1GiB / 32MiB)
#   HOST_BYTES           memory.host_bytes (4GiB / 64MiB)
#   BLOCKS, BLOCK_BYTES  blocks per step and block size (64, 1MiB / 8, 256KiB)
#   RACE_SECONDS         the put/delete race (20 / 2)
#   CUDA_RUNTIME_DIR     a folder holding libcudart.so* (default: the loader's
#                        path, else $CUDA_HOME/lib64, else a pip wheel's)
set -euo pipefail
cd "$(dirname "$0")/.."

PROG=gpu-check.sh
ALL_BEHAVIOURS=(preflight identity batch completion store restart death reader-pin churn pidns demotion vllm)
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

sim=0 keep=0 only=""
while (($#)); do
  case $1 in
    --sim) sim=1 ;;
    --keep) keep=1 ;;
    --only) [[ $# -ge 2 ]] || { echo "$PROG: --only needs a list" >&2; exit 2; }; only=$2; shift ;;
    --list) printf '%s\n' "${ALL_BEHAVIOURS[@]}"; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$PROG: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
selected=("${ALL_BEHAVIOURS[@]}")
if [[ -n $only ]]; then
  read -r -a selected <<<"${only//,/ }"
  for b in "${selected[@]}"; do
    [[ " ${ALL_BEHAVIOURS[*]} " == *" $b "* ]] || { echo "$PROG: unknown behaviour '$b'" >&2; exit 2; }
  done
fi

say() { echo "$PROG: $*"; }
cannot() { echo "$PROG: cannot run here: $*" >&2; exit 2; }

BUILD=${BUILD:-build}
if [[ $sim == 1 ]]; then
  DEVICE=${GPU_CHECK_DEVICE:-1}
  HBM_BYTES=${HBM_BYTES:-32MiB} HOST_BYTES=${HOST_BYTES:-64MiB}
  BLOCKS=${BLOCKS:-8} BLOCK_BYTES=${BLOCK_BYTES:-262144} RACE_SECONDS=${RACE_SECONDS:-2}
  TIMEOUT=${BEHAVIOUR_TIMEOUT:-60} READY_TIMEOUT=${READY_TIMEOUT:-20}
else
  DEVICE=${GPU_CHECK_DEVICE:-0}
  HBM_BYTES=${HBM_BYTES:-1GiB} HOST_BYTES=${HOST_BYTES:-4GiB}
  BLOCKS=${BLOCKS:-64} BLOCK_BYTES=${BLOCK_BYTES:-1048576} RACE_SECONDS=${RACE_SECONDS:-20}
  TIMEOUT=${BEHAVIOUR_TIMEOUT:-120} READY_TIMEOUT=${READY_TIMEOUT:-120}
fi
STOP_TIMEOUT=${STOP_TIMEOUT:-30}
kvnoded=$BUILD/kvnoded kvnodectl=$BUILD/kvnodectl checker=$BUILD/kvnode-gpu-check
fakelib=$BUILD/tests/fakecuda slowpin=$BUILD/tests/gpu/slowpin

# --- build --------------------------------------------------------------------
if [[ ${NOBUILD:-0} != 1 ]]; then
  targets=(all "$checker")
  [[ $sim == 1 ]] && targets+=("$slowpin/libcuda.so.1")
  say "building: make BUILD=$BUILD ${targets[*]}"
  if ! blog=$(make -j"$(nproc)" "BUILD=$BUILD" "${targets[@]}" 2>&1); then
    tail -n 40 <<<"$blog" >&2
    cannot "the build failed (make BUILD=$BUILD ${targets[*]})"
  fi
fi
for b in "$kvnoded" "$kvnodectl" "$checker"; do
  [[ -x $b ]] || cannot "$b is not built (make BUILD=$BUILD all $checker)"
done
command -v jq >/dev/null 2>&1 || cannot "jq is needed to read /stats"

# --- the environment every process shares -----------------------------------------
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvnode-gpu-check.XXXXXX")
sock=$dir/kvnode.sock admin=$dir/admin.sock
mkdir -p "$dir/store" "$dir/sync"
if [[ $sim == 1 ]]; then
  fake_ok=0
  [[ -e $fakelib/libcudart.so && -e $fakelib/libcuda.so.1 ]] && fake_ok=1
  export LD_LIBRARY_PATH=$PWD/$fakelib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export FAKECUDA_DIR=$dir/fake
  export FAKECUDA_DEVICES=${FAKECUDA_DEVICES:-0000:3B:00.0,0000:5E:00.0}
  export FAKECUDA_COPY_DELAY_MS=${FAKECUDA_COPY_DELAY_MS:-3}
  # Room for one daemon's HBM and the checkers' buffers, not for two
  # daemons' HBM: a restarted daemon gets its memory only when the old
  # region was given back.
  export FAKECUDA_MEM_BYTES=${FAKECUDA_MEM_BYTES:-$((56 << 20))}
  mkdir -p "$FAKECUDA_DIR"
  unset CUDA_VISIBLE_DEVICES FAKECUDA_PIDNS FAKECUDA_FAIL FAKECUDA_BUSID_FORMAT
else
  command -v nvidia-smi >/dev/null 2>&1 ||
    cannot "no nvidia-smi: this machine has no NVIDIA driver (the CPU run: $0 --sim)"
  nvidia-smi -L >/dev/null 2>&1 || cannot "nvidia-smi sees no GPU: $(nvidia-smi -L 2>&1 | head -n 1)"
  # CUDA numbers devices as nvidia-smi does.
  export CUDA_DEVICE_ORDER=PCI_BUS_ID
  unset CUDA_VISIBLE_DEVICES
  if [[ -n ${CUDA_RUNTIME_DIR:-} ]]; then
    export LD_LIBRARY_PATH=$CUDA_RUNTIME_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  elif ! ldconfig -p 2>/dev/null | grep -q 'libcudart\.so'; then
    for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda*/lib64 \
             "$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.dirname(nvidia.cuda_runtime.__file__) + "/lib")' 2>/dev/null || true)"; do
      if compgen -G "$d/libcudart.so*" >/dev/null; then
        export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        break
      fi
    done
  fi
fi
salt=$(( (RANDOM << 16) ^ RANDOM ^ $$ ))

dpid="" dlog="" nstart=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $dpid ]] && kill -0 "$dpid" 2>/dev/null; then
    kill -TERM "$dpid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$dpid" 2>/dev/null || true
    wait "$dpid" 2>/dev/null || true
  fi
  if [[ $keep == 1 ]]; then echo "$PROG: kept $dir" >&2; else rm -rf "$dir"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the daemon ------------------------------------------------------------------
daemon_args=(--set "server.socket_path=$sock" --set "admin.listen=unix:$admin"
             --set hbm.backend=cuda --set "hbm.bytes=$HBM_BYTES" --set "hbm.devices=$DEVICE"
             --set hbm.required=on --set memory.pin_host=on --set "memory.host_bytes=$HOST_BYTES"
             --set persist.backend=file --set "persist.path=$dir/store"
             --set persist.policy=write_through --set persist.fsync=never --set log.level=info)
# Under the test suite the host tier takes ordinary pages: a hugetlb pool
# another suite reserved meanwhile is not this check's.
[[ $sim == 1 ]] && daemon_args+=(--set memory.huge_pages=off)

# start_daemon [--set k=v ...]: start kvnoded and wait until it answers; 1 when it does not.
start_daemon() {
  nstart=$((nstart + 1))
  dlog=$dir/kvnoded-$nstart.log
  local denv=()
  [[ -n ${DAEMON_ENV:-} ]] && read -r -a denv <<<"$DAEMON_ENV"
  env "${denv[@]}" "$kvnoded" "${daemon_args[@]}" "$@" >"$dlog" 2>&1 &
  dpid=$!
  local deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$dpid" 2>/dev/null; then
      local st=0; wait "$dpid" || st=$?; dpid=""
      why="kvnoded exited during its start (status $st): $(grep -m1 -iE 'error|fail|refus' "$dlog" || tail -n 1 "$dlog")"
      return 1
    fi
    if [[ -S $sock ]] && "$kvnodectl" -S "$sock" ping >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.05
  done
  why="kvnoded not ready within ${READY_TIMEOUT}s"
  return 1
}

# stop_daemon: SIGTERM, wait; 1 (why set) unless it exits 0 in time. stop_secs: how long it took.
stop_daemon() {
  stop_secs=0
  [[ -n $dpid ]] || return 0
  local t0=$SECONDS st=0 e0=$EPOCHREALTIME
  kill -TERM "$dpid" 2>/dev/null || true
  while kill -0 "$dpid" 2>/dev/null && ((SECONDS - t0 < STOP_TIMEOUT)); do sleep 0.05; done
  if kill -0 "$dpid" 2>/dev/null; then
    kill -KILL "$dpid" 2>/dev/null || true
    wait "$dpid" 2>/dev/null || true
    dpid=""
    why="kvnoded still running ${STOP_TIMEOUT}s after SIGTERM"
    return 1
  fi
  wait "$dpid" || st=$?
  dpid=""
  stop_secs=$(awk -v a="$e0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
  ((st == 0)) || { why="kvnoded exited with status $st after SIGTERM"; return 1; }
}

stats() { "$kvnodectl" -S "$sock" stats --json; }

# gc NAME BEHAVIOUR [args...]: run the checker (output in $dir/NAME.out);
# its status; its RESULT line in $res.
gc() {
  local name=$1; shift
  local b=$1; shift
  local st=0
  timeout -k 5 "$TIMEOUT" "$checker" "$b" --socket "$sock" --device "${GC_DEVICE:-$DEVICE}" \
    --blocks "$BLOCKS" --block-bytes "$BLOCK_BYTES" --salt "$salt" --timeout "$TIMEOUT" "$@" \
    >"$dir/$name.out" 2>&1 || st=$?
  # The last verdict: a behaviour's own children print theirs first.
  res=$(grep '^RESULT ' "$dir/$name.out" | tail -n 1 | sed -E 's/^RESULT [A-Z]+: //' || true)
  if [[ -z $res ]]; then
    if ((st == 124 || st == 137)); then res="timed out after ${TIMEOUT}s"
    else res="no verdict (status $st): $(tail -n 1 "$dir/$name.out")"; fi
    ((st == 0)) && st=1
  fi
  return "$st"
}

# Numbers of a PCI bus id ("0000:3B:00.0", "00000000:3b:00.0") as "d:b:d.f" in hex.
busnorm() {
  local s=${1,,} dom bus devfn
  IFS=: read -r dom bus devfn <<<"$s"
  [[ -n $devfn ]] || { echo "?$1"; return; }
  printf '%x:%x:%x.%x\n' "0x$dom" "0x$bus" "0x${devfn%%.*}" "0x${devfn##*.}"
}

# GPU memory in use on the HBM device, in bytes (nvidia-smi; --sim: the fake's count).
gpu_mem_used() {
  if [[ $sim == 1 ]]; then
    GC_DEVICE=$DEVICE gc meminfo meminfo >/dev/null 2>&1 || { echo "?"; return; }
    sed -n 's/^used_bytes=\([0-9]*\).*/\1/p' "$dir/meminfo.out"
  else
    local mib
    mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$DEVICE" 2>/dev/null | tr -d ' ')
    [[ $mib =~ ^[0-9]+$ ]] && echo $((mib << 20)) || echo "?"
  fi
}

# Waits until gpu_mem_used reads $1 (within $2 bytes); mem_now is the last reading.
mem_settles_at() {
  local want=$1 tol=$2 deadline=$((SECONDS + 15))
  while :; do
    mem_now=$(gpu_mem_used)
    if [[ $mem_now =~ ^[0-9]+$ && $want =~ ^[0-9]+$ ]]; then
      local d=$((mem_now - want)); ((d < 0)) && d=$((-d))
      ((d <= tol)) && return 0
    fi
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}
mem_tol=0
[[ $sim == 0 ]] && mem_tol=$((64 << 20))

viol_seen=0
# new_violations: viol = the violations the fake recorded since the last
# call ("" in GPU mode). Not for $(...): it keeps its place in viol_seen.
new_violations() {
  viol=""
  [[ $sim == 1 && -s $FAKECUDA_DIR/violations ]] || return 0
  local n
  n=$(wc -l <"$FAKECUDA_DIR/violations")
  if ((n > viol_seen)); then
    viol=$(tail -n +"$((viol_seen + 1))" "$FAKECUDA_DIR/violations" | head -n "$((n - viol_seen))")
    viol_seen=$n
  fi
}

# --- behaviours: each sets verdict (PASS/FAIL/SKIP) and why ---------------------------

b_preflight() {
  local info=""
  if [[ $sim == 0 ]]; then
    local smi cudav
    smi=$(nvidia-smi --query-gpu=index,pci.bus_id,driver_version,compute_mode,mig.mode.current,name,memory.used,memory.total --format=csv,noheader 2>&1)
    cudav=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
    while IFS= read -r l; do echo "    nvidia-smi: $l"; done <<<"$smi"
    local line mode mig
    line=$(awk -F', ' -v d="$DEVICE" '$1 == d' <<<"$smi")
    [[ -n $line ]] || { verdict=FAIL why="nvidia-smi lists no GPU $DEVICE"; return; }
    mode=$(cut -d, -f4 <<<"$line" | tr -d ' ') mig=$(cut -d, -f5 <<<"$line" | tr -d ' ')
    info="nvidia-smi: driver $(cut -d, -f3 <<<"$line" | tr -d ' '), CUDA $cudav, GPU $DEVICE compute mode $mode, MIG $mig"
    case $mode in
      Default) ;;
      *) verdict=FAIL why="$info: kvnoded refuses HBM on a GPU in $mode mode"; return ;;
    esac
    [[ $mig == Enabled ]] && { verdict=FAIL why="$info: MIG is enabled on GPU $DEVICE"; return; }
  fi
  if ! gc preflight preflight; then
    verdict=FAIL why="$res${info:+ ($info)}"; return
  fi
  grep -E '^(versions|device) ' "$dir/preflight.out" | sed 's/^/    /'
  verdict=PASS why="$res${info:+; $info}"
}

b_identity() {
  local want got parts=() doc
  doc=$(stats) || { verdict=FAIL why="kvnodectl stats failed"; return; }
  local nh
  nh=$(jq '.tiers.hbm | length' <<<"$doc")
  got=$(jq -r '.tiers.hbm[0].pci_bus_id // ""' <<<"$doc")
  ((nh == 1)) || { verdict=FAIL why="/stats tiers.hbm has $nh entries, expected 1 (hbm.devices=$DEVICE)"; return; }
  if [[ $sim == 1 ]]; then
    IFS=, read -r -a fdevs <<<"$FAKECUDA_DEVICES"
    want=${fdevs[$DEVICE]}
  else
    want=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$DEVICE" | tr -d ' ')
  fi
  [[ $(busnorm "$got") == "$(busnorm "$want")" ]] ||
    { verdict=FAIL why="the daemon's HBM device has bus id '$got', nvidia-smi's GPU $DEVICE is '$want'"; return; }
  parts+=("bus id $got = $want")

  # Clients numbering the GPUs otherwise.
  local others=() uuid_hbm="" i
  if [[ $sim == 1 ]]; then
    for i in "${!fdevs[@]}"; do [[ $i != "$DEVICE" ]] && others+=("$i"); done
    uuid_hbm=$DEVICE
  else
    mapfile -t idx < <(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')
    for i in "${idx[@]}"; do [[ $i != "$DEVICE" ]] && others+=("$i"); done
    uuid_hbm=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$DEVICE" | tr -d ' ')
  fi
  # The client's bus id is spelled as nvidia-smi does under --sim.
  if ! CUDA_VISIBLE_DEVICES=$uuid_hbm FAKECUDA_BUSID_FORMAT=nvsmi GC_DEVICE=0 gc identity-a identity --expect hbm; then
    verdict=FAIL why="CUDA_VISIBLE_DEVICES=$uuid_hbm: $res"; return
  fi
  parts+=("CUDA_VISIBLE_DEVICES=$uuid_hbm device 0 lent HBM")
  if ((${#others[@]})); then
    # The unserved GPU at the served GPU's ordinal: a daemon that fell back
    # to the ordinal would lend it the wrong GPU's memory.
    local o=${others[0]} order=() n
    n=$((${#others[@]} + 1))
    for ((i = 0; i < n; i++)); do order+=("$i"); done
    order[DEVICE]=$o order[o]=$DEVICE
    local swapped
    swapped=$(IFS=,; echo "${order[*]}")
    if ! CUDA_VISIBLE_DEVICES=$swapped GC_DEVICE=$DEVICE gc identity-b identity --expect none; then
      verdict=FAIL why="CUDA_VISIBLE_DEVICES=$swapped device $DEVICE (GPU $o, which kvnoded does not serve): $res"; return
    fi
    parts+=("CUDA_VISIBLE_DEVICES=$swapped device $DEVICE (GPU $o) none")
  else
    parts+=("one GPU: no unserved GPU to try")
  fi

  # Contexts of kvnoded.
  if [[ $sim == 1 ]]; then
    local ctx=() f
    for f in "$FAKECUDA_DIR"/ctx-*-"$dpid"; do [[ -e $f ]] && ctx+=("${f##*/}"); done
    [[ ${#ctx[@]} == 1 && ${ctx[0]} == "ctx-$DEVICE-$dpid" ]] ||
      { verdict=FAIL why="kvnoded (pid $dpid) has contexts: ${ctx[*]:-none} (want only ctx-$DEVICE-$dpid)"; return; }
    parts+=("kvnoded context only on device $DEVICE")
  else
    local apps bad=""
    apps=$(nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader 2>/dev/null | tr -d ' ')
    if ! grep -q "^$dpid," <<<"$apps"; then
      parts+=("context check not possible: nvidia-smi does not list kvnoded's pid $dpid (PID namespace?)")
    else
      while IFS=, read -r p b; do
        [[ $p == "$dpid" && $(busnorm "$b") != "$(busnorm "$want")" ]] && bad+=" $b"
      done <<<"$apps"
      [[ -z $bad ]] || { verdict=FAIL why="kvnoded has a context on GPU(s)$bad, which it does not serve"; return; }
      parts+=("kvnoded's only context is on $want")
    fi
  fi
  join_parts "${parts[@]}"
  verdict=PASS why=$joined
}

b_batch() { if gc batch batch; then verdict=PASS; else verdict=FAIL; fi; why=$res; }

b_completion() {
  if gc completion completion --seconds "$RACE_SECONDS"; then verdict=PASS; else verdict=FAIL; fi
  why=$res
}

b_store() {
  gc store-put store-put || { verdict=FAIL why="before the restart: $res"; return; }
  stop_daemon || { verdict=FAIL; return; }
  start_daemon || { verdict=FAIL why="restart on the store: $why"; return; }
  gc store-verify store-verify || { verdict=FAIL why="after the restart: $res"; return; }
  verdict=PASS why=$res
}

# restart_once LABEL: the client holding leases across a stop and a start;
# 1 with why set when something failed, else rsum says what happened.
restart_once() {
  local label=$1 m_before cpid st=0 out=$dir/restart-${1// /-}.out
  rm -f "$dir/sync/restart."*
  m_before=$(gpu_mem_used)
  label+=" (lent by $(stats | jq -r '.tiers.hbm[0].lent_by // "nothing"'))"
  "$checker" restart --socket "$sock" --device "$DEVICE" --blocks "$BLOCKS" --block-bytes "$BLOCK_BYTES" \
    --salt "$salt" --sync "$dir/sync" --timeout "$TIMEOUT" >"$out" 2>&1 &
  cpid=$!
  local t0=$SECONDS
  while [[ ! -e $dir/sync/restart.ready ]] && kill -0 "$cpid" 2>/dev/null && ((SECONDS - t0 < TIMEOUT)); do
    sleep 0.05
  done
  if [[ ! -e $dir/sync/restart.ready ]]; then
    kill "$cpid" 2>/dev/null || true; wait "$cpid" 2>/dev/null || true
    why="$label: the client did not take its leases: $(grep -m1 '^RESULT' "$out" || tail -n 1 "$out")"
    return 1
  fi
  if ! stop_daemon; then
    touch "$dir/sync/restart.go"; wait "$cpid" || true
    why="$label: stopping under a live client: $why"; return 1
  fi
  local stop_took=$stop_secs old_log=$dlog notice
  # What the stop said of the clients lent HBM (kvnoded's log lines):
  # "stop: told N client(s) lent HBM to unmap it ...", and a warning when it
  # freed HBM that a client still held.
  if grep -q 'freeing HBM while' "$old_log"; then
    touch "$dir/sync/restart.go"; wait "$cpid" || true
    why="$label: $(grep -m1 -o 'stop: freeing HBM while.*' "$old_log")"; return 1
  fi
  notice=$(grep -m1 -oE 'told [0-9]+ clients? lent HBM' "$old_log" || echo "no notice to clients lent HBM")
  if ! start_daemon; then
    touch "$dir/sync/restart.go"; wait "$cpid" || true
    why="$label: the new daemon did not start while the old client lived: $why"; return 1
  fi
  touch "$dir/sync/restart.go"
  wait "$cpid" || st=$?
  res=$(grep '^RESULT ' "$out" | tail -n 1 | sed -E 's/^RESULT [A-Z]+: //' || true)
  ((st == 0)) || { why="$label: ${res:-the client failed (status $st)}"; return 1; }
  if ! mem_settles_at "$m_before" "$mem_tol"; then
    why="$label: GPU memory in use $mem_now bytes after the restart, $m_before before it"; return 1
  fi
  rsum="$label: $res; stopped in ${stop_took}s under the client ($notice); GPU memory $m_before bytes before and after"
}

b_restart() {
  local parts=()
  restart_once "$([[ $sim == 1 ]] && echo VMM || echo "GPU $DEVICE")" || { verdict=FAIL; return; }
  parts+=("$rsum")
  if [[ $sim == 1 ]]; then
    # Legacy CUDA IPC (a driver without VMM): the old daemon may free its
    # memory only once the client has closed its handle.
    stop_daemon || { verdict=FAIL; return; }
    DAEMON_ENV=FAKECUDA_NO_VMM=1
    start_daemon || { DAEMON_ENV=""; verdict=FAIL why="legacy IPC: start: $why"; return; }
    FAKECUDA_NO_VMM=1 restart_once "legacy IPC" || { DAEMON_ENV=""; verdict=FAIL; return; }
    DAEMON_ENV=""
    parts+=("$rsum")
  fi
  # Without any daemon: back to the baseline taken before the first start.
  stop_daemon || { verdict=FAIL; return; }
  local ok=1 m_base
  mem_settles_at "$mem_baseline" "$mem_tol" || ok=0
  m_base=$mem_now
  start_daemon || { verdict=FAIL why="restart for the next behaviours: $why"; return; }
  ((ok)) || { verdict=FAIL why="with no daemon running, $m_base bytes of GPU memory in use, $mem_baseline before the first start"; return; }
  parts+=("$m_base bytes with no daemon (baseline $mem_baseline)")
  join_parts "${parts[@]}"
  verdict=PASS why=$joined
}

# join_parts PART...: joined = the parts separated by "; ".
join_parts() {
  joined=$1; shift
  local p
  for p in "$@"; do joined+="; $p"; done
}

b_death() { if gc death death; then verdict=PASS; else verdict=FAIL; fi; why=$res; }
b_reader_pin() { if gc reader-pin reader-pin; then verdict=PASS; else verdict=FAIL; fi; why=$res; }
b_churn() {
  if gc churn churn --procs 4 --connects 50; then verdict=PASS; else verdict=FAIL; fi
  why=$res
}

b_pidns() {
  local how=() desc=""
  if unshare --user --pid --fork --map-root-user true 2>/dev/null; then
    how=(unshare --user --pid --fork --map-root-user) desc="unshare --user --pid"
  fi
  if [[ $sim == 1 ]]; then
    desc="${desc:+$desc + }FAKECUDA_PIDNS=other"
  elif ((${#how[@]} == 0)); then
    verdict=SKIP why="unshare --user --pid --fork --map-root-user is not permitted here: $(unshare --user --pid --fork --map-root-user true 2>&1 | head -n 1)"
    return
  fi
  local st=0
  FAKECUDA_PIDNS=other timeout -k 5 "$TIMEOUT" "${how[@]}" "$checker" pidns --socket "$sock" \
    --device "$DEVICE" --blocks "$BLOCKS" --block-bytes "$BLOCK_BYTES" --salt "$salt" \
    >"$dir/pidns.out" 2>&1 || st=$?
  res=$(grep -m1 '^RESULT ' "$dir/pidns.out" | sed -E 's/^RESULT [A-Z]+: //' || true)
  [[ -n $res ]] || res="no verdict (status $st): $(tail -n 1 "$dir/pidns.out")"
  if ((st == 0)); then verdict=PASS why="$desc: $res"; else verdict=FAIL why="$desc: $res"; fi
}

b_demotion() {
  # A pin chunk that is not a multiple of the slab (nor of the block: 3 blocks
  # of 384 KiB / 1.5 MiB are 1.1 MiB / 4.5 MiB short of 3 slabs), and
  # pinning that outlasts the start: on a GPU a large host arena; under --sim
  # every registration delayed (tests/gpu/slowpin.c in front of the fake).
  local slab=2MiB chunk=7MiB host=256MiB bb=393216 denv=()
  if [[ $sim == 0 ]]; then
    slab=16MiB chunk=56MiB host=${DEMOTION_HOST_BYTES:-16GiB} bb=1572864
  else
    [[ -e $slowpin/libcuda.so.1 ]] ||
      { verdict=FAIL why="$slowpin/libcuda.so.1 is not built (make BUILD=$BUILD $slowpin/libcuda.so.1)"; return; }
    denv=("LD_LIBRARY_PATH=$PWD/$slowpin:$LD_LIBRARY_PATH" "GPU_CHECK_PIN_DELAY_MS=${GPU_CHECK_PIN_DELAY_MS:-250}")
  fi
  stop_daemon || { verdict=FAIL; return; }
  if ! DAEMON_ENV="${denv[*]}" start_daemon --set "memory.slab_bytes=$slab" \
        --set "memory.pin_chunk_bytes=$chunk" --set "memory.host_bytes=$host" \
        --set hbm.copy_batch_bytes=1MiB; then
    verdict=FAIL why="start with slab $slab, pin chunk $chunk: $why"; return
  fi
  if gc demotion demotion --block-bytes "$bb"; then verdict=PASS; else verdict=FAIL; fi
  why="slab $slab, pin chunk $chunk, blocks of $((bb >> 10)) KiB: $res"
}

b_vllm() {
  local st=0 lib=$PWD/$BUILD/libkvnode.so.0 pre=()
  # a sanitizer build's libkvnode needs its runtime loaded before python3 starts
  . tests/common/asan_preload.sh
  local asan; asan=$(asan_preload "$lib")
  [[ -n $asan ]] && pre=("LD_PRELOAD=$asan" "ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}")
  timeout -k 5 "$TIMEOUT" env "${pre[@]}" KVNODE_LIBRARY="$lib" /usr/bin/python3 \
    tests/gpu/vllm_device.py --socket "$sock" --device "$DEVICE" --blocks "$BLOCKS" \
    --salt "$salt" >"$dir/vllm.out" 2>&1 || st=$?
  res=$(grep '^RESULT ' "$dir/vllm.out" | tail -n 1 | sed -E 's/^RESULT [A-Z]+: //' || true)
  [[ -n $res ]] || res="no verdict (status $st): $(tail -n 1 "$dir/vllm.out")"
  case $st in
    0) verdict=PASS ;;
    3) verdict=SKIP ;;
    *) verdict=FAIL ;;
  esac
  why=$res
}

# --- run ---------------------------------------------------------------------------
say "$([[ $sim == 1 ]] && echo "sim: hbm.backend=cuda against the strict fake CUDA ($fakelib), FAKECUDA_DIR=$FAKECUDA_DIR" || echo "GPU $DEVICE")"
t_all=$SECONDS
npass=0 nfail=0 nskip=0
table=()
report() {   # report NAME: one table line (and on FAIL what the checker and daemon said)
  local name=$1 line
  line=$(printf '%-4s  %-11s  %s' "$verdict" "$name" "$why")
  echo "$line"
  table+=("$line")
  case $verdict in
    PASS) npass=$((npass + 1)) ;;
    SKIP) nskip=$((nskip + 1)) ;;
    *) nfail=$((nfail + 1))
       for f in "$dir/$name"*.out; do
         [[ -s $f ]] && { grep -v '^RESULT' "$f" | tail -n 8 | sed "s|^|      ${f##*/}: |" || true; }
       done
       [[ -n $dlog && -s $dlog ]] && { grep -iE 'error|warn|fail' "$dlog" | tail -n 8 | sed 's/^/      kvnoded: /' || true; } ;;
  esac
  return 0
}

mem_baseline=""
daemon_up=0
if [[ $sim == 1 && $fake_ok == 0 ]]; then
  for b in "${selected[@]}"; do
    verdict=FAIL why="the strict fake CUDA library is not built ($fakelib/libcudart.so, libcuda.so.1)"
    report "$b"
  done
else
  [[ " ${selected[*]} " == *" restart "* ]] && mem_baseline=$(gpu_mem_used)
  for b in "${selected[@]}"; do
    verdict=FAIL why="" res=""
    if [[ $b != preflight && $daemon_up == 0 ]]; then
      if start_daemon; then
        daemon_up=1
      else
        why="kvnoded (hbm.backend=cuda, hbm.devices=$DEVICE, hbm.required=on) did not start: $why"
        report "$b"
        continue
      fi
    fi
    "b_${b//-/_}"
    new_violations
    if [[ -n $viol ]]; then
      verdict=FAIL why="the fake CUDA recorded violations: $(head -n 3 <<<"$viol" | tr '\n' ' ')${why:+ (behaviour: $why)}"
    fi
    if [[ $b != preflight && ( -z $dpid || $(kill -0 "$dpid" 2>/dev/null && echo up) != up ) ]]; then
      [[ $verdict == FAIL ]] || { verdict=FAIL why="kvnoded died: $(tail -n 1 "$dlog")"; }
      daemon_up=0 dpid=""
    fi
    report "$b"
  done
  if [[ -n $dpid ]]; then
    stop_daemon || { verdict=FAIL; report stop; }
  fi
fi

echo
say "summary ($([[ $sim == 1 ]] && echo "--sim, strict fake CUDA" || echo "GPU $DEVICE"), $((SECONDS - t_all)) s):"
printf '  %s\n' "${table[@]}"
say "$npass passed, $nfail failed, $nskip skipped"
((nfail == 0))
