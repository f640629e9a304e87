#!/usr/bin/env bash
# gpu-check.sh [--sim] [--store] [--keep] [--suite]: the GPU (HBM) tier end to end.
#
# On a GPU machine (default): checks nvidia-smi and the CUDA toolkit, builds
# with CUDA=1 into $BUILD (default build-gpu), starts kvnoded with
# hbm.backend=cuda, hbm.required=on (the start fails without GPU memory),
# memory.pin_host=on (the host arena is page-locked by a background thread,
# chunk by chunk), no persistent store (--store: a write_through file store)
# and the admin listener on a unix socket, all in a temporary directory; waits until it is ready (socket,
# kvnodectl ping, /readyz); runs kvnode-gpu-check (tests/bench/gpu_check.c)
# as a second process declaring CUDA device $GPU_CHECK_DEVICE: HBM puts land
# in GPU memory, gets read them back byte-exact through CUDA IPC (also on a
# second connection), and it prints device-to-device, host-to-device and
# demotion bandwidth next to same-run cudaMemcpy peaks; then checks /stats
# (tiers.hbm has the device, lent through CUDA IPC, demotions happened and
# none failed, the host arena ends up pinned), stops the daemon with SIGTERM
# and requires exit status 0. --suite then runs `make CUDA=1 check` and
# `make CUDA=1 bench` on that build, as the earlier version of this script
# always did.
#
# --sim: the dry run for machines without a GPU (also run by `make check`,
# through tests/gpu/run-sim.sh): the same flow on the CPU with
# hbm.backend=sim (two simulated devices lent as mapped memfds), a build
# with the default CUDA detection into $BUILD (default build-gpu-sim),
# smaller sizes, and kvnode-gpu-check --sim (no CUDA calls; its figures are
# memcpy figures). It exercises the daemon's sim backend, the HBM mapping
# path of libkvnode, the demotion worker and the background pinning thread
# (each chunk delayed by KVNODE_DEVMEM_SIM_PIN_DELAY_MS so pinning really
# outlives the start).
#
# --store: the same with persist.backend=file, persist.policy=write_through
# (a store in the temporary directory), where every committed block is
# pinned until its write lands: demotion must still bring HBM under the
# high watermark, every block must be written (HBM ones through a device
# copy) and no write may fail. `make check` runs --sim both ways.
#
# --keep keeps the temporary directory (daemon log, stats, checker output).
# Exit status: 0 all passed; 1 a check failed (the daemon log is printed);
# 2 this machine cannot run the check (no GPU, toolkit or binaries) or usage.
#
# Environment (defaults: GPU / --sim):
#   BUILD=DIR            build directory (build-gpu / build-gpu-sim)
#   NOBUILD=1            do not run make: use the binaries already in $BUILD
#   CUDA_HOME            CUDA toolkit (/usr/local/cuda)
#   GPU_CHECK_DEVICE     CUDA device to check (0); GPU mode gives kvnoded only it
#   HBM_BYTES            hbm.bytes per device (1GiB / 64MiB)
#   HOST_BYTES           memory.host_bytes (2GiB / 256MiB)
#   PIN_CHUNK_BYTES      memory.pin_chunk_bytes (256MiB / 16MiB)
#   COPY_BATCH_BYTES     hbm.copy_batch_bytes (64MiB / 4MiB)
#   BLOCKS, BLOCK_BYTES  blocks per phase and block size of the checker (256, 1MiB / 64, 256KiB)
#   ITERS                timed rounds per bandwidth figure (20 / 8)
#   PIN_TIMEOUT          seconds the host arena may take to be pinned (300 / 20)
set -euo pipefail
cd "$(dirname "$0")/.."

PROG=gpu-check.sh
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

sim=0 keep=0 suite=0 store=0
for a in "$@"; do
  case $a in
    --sim) sim=1 ;;
    --store) store=1 ;;
    --keep) keep=1 ;;
    --suite) suite=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$PROG: unknown argument '$a'" >&2; usage >&2; exit 2 ;;
  esac
done

say() { echo "$PROG: $*"; }
die() { echo "$PROG: FAIL: $*" >&2; exit 1; }
cannot() { echo "$PROG: FAIL (cannot run here): $*" >&2; exit 2; }

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
DEVICE=${GPU_CHECK_DEVICE:-0}
if [[ $sim == 1 ]]; then
  BUILD=${BUILD:-build-gpu-sim}
  HBM_BYTES=${HBM_BYTES:-64MiB} HOST_BYTES=${HOST_BYTES:-256MiB}
  PIN_CHUNK_BYTES=${PIN_CHUNK_BYTES:-16MiB} COPY_BATCH_BYTES=${COPY_BATCH_BYTES:-4MiB}
  BLOCKS=${BLOCKS:-64} BLOCK_BYTES=${BLOCK_BYTES:-256KiB} ITERS=${ITERS:-8}
  PIN_TIMEOUT=${PIN_TIMEOUT:-20} READY_TIMEOUT=${READY_TIMEOUT:-20}
  backend=sim
else
  BUILD=${BUILD:-build-gpu}
  HBM_BYTES=${HBM_BYTES:-1GiB} HOST_BYTES=${HOST_BYTES:-2GiB}
  PIN_CHUNK_BYTES=${PIN_CHUNK_BYTES:-256MiB} COPY_BATCH_BYTES=${COPY_BATCH_BYTES:-64MiB}
  BLOCKS=${BLOCKS:-256} BLOCK_BYTES=${BLOCK_BYTES:-1MiB} ITERS=${ITERS:-20}
  PIN_TIMEOUT=${PIN_TIMEOUT:-300} READY_TIMEOUT=${READY_TIMEOUT:-120}
  backend=cuda
fi
STOP_TIMEOUT=${STOP_TIMEOUT:-30}
kvnoded=$BUILD/kvnoded kvnodectl=$BUILD/kvnodectl checker=$BUILD/kvnode-gpu-check

# --- prerequisites and build ---------------------------------------------------
if [[ $sim == 0 ]]; then
  command -v nvidia-smi >/dev/null 2>&1 ||
    cannot "no nvidia-smi: this machine has no NVIDIA driver (for the CPU dry run: $0 --sim)"
  gpus=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1) ||
    cannot "nvidia-smi sees no GPU: $gpus (for the CPU dry run: $0 --sim)"
  [[ -n $gpus ]] || cannot "nvidia-smi lists no GPU (for the CPU dry run: $0 --sim)"
  say "GPUs:"; while IFS= read -r l; do echo "    $l"; done <<<"$gpus"
  [[ -e $CUDA_HOME/include/cuda_runtime_api.h && -e $CUDA_HOME/lib64/libcudart_static.a ]] ||
    cannot "no CUDA toolkit at CUDA_HOME=$CUDA_HOME (cuda_runtime_api.h, lib64/libcudart_static.a)"
  make_args=(CUDA=1 "CUDA_HOME=$CUDA_HOME" "BUILD=$BUILD")
else
  make_args=("BUILD=$BUILD")      # the default CUDA detection: whatever `make` picks
fi
if [[ ${NOBUILD:-0} == 1 ]]; then
  for b in "$kvnoded" "$kvnodectl" "$checker"; do
    [[ -x $b ]] || cannot "NOBUILD=1 but $b is not built (make ${make_args[*]} all $checker)"
  done
else
  say "building: make ${make_args[*]} all $checker"
  if ! blog=$(make -j"$(nproc)" "${make_args[@]}" all "$checker" 2>&1); then
    tail -n 40 <<<"$blog" >&2
    die "build failed (make ${make_args[*]} all $checker)"
  fi
fi

# --- helpers -------------------------------------------------------------------
# jvals FILE PATH...: the value at each PATH (dot-separated keys, numbers
# index arrays) of a JSON file, one per line: strings bare, anything else as
# JSON, null when absent. One process per document: jq, else python3.
if command -v jq >/dev/null 2>&1; then
  jvals() {
    local f=$1 filter="" p; shift
    for p in "$@"; do
      p=$(sed -E 's/\.([0-9]+)/[\1]/g; s/^/./' <<<"$p")
      filter+="${filter:+, }(try ($p) catch null | if type == \"string\" then . else tojson end)"
    done
    jq -r "$filter" "$f"
  }
elif command -v python3 >/dev/null 2>&1; then
  jvals() {
    python3 - "$@" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for path in sys.argv[2:]:
    v = doc
    for k in path.split("."):
        if isinstance(v, list) and k.isdigit() and int(k) < len(v):
            v = v[int(k)]
        elif isinstance(v, dict) and k in v:
            v = v[k]
        else:
            v = None
            break
    print(v if isinstance(v, str) else json.dumps(v))
PY
  }
else
  cannot "neither jq nor python3 is installed (needed to read /stats)"
fi
jget() { jvals "$1" "$2"; }
have_curl=0
command -v curl >/dev/null 2>&1 && have_curl=1

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvnode-gpu-check.XXXXXX")
sock=$dir/kvnode.sock admin=$dir/admin.sock log=$dir/kvnoded.log
pid=

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  if [[ $rc != 0 && -s $log ]]; then
    echo "----- kvnoded log ($log) -----" >&2
    cat "$log" >&2
    echo "----- end of kvnoded log -----" >&2
  fi
  if [[ $keep == 1 ]]; then
    echo "$PROG: kept $dir" >&2
  else
    rm -rf "$dir"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

stats() {   # stats FILE: the daemon's /stats document into FILE
  "$kvnodectl" -S "$sock" stats --json >"$1" 2>"$dir/kvnodectl.err" ||
    die "kvnodectl stats --json: $(cat "$dir/kvnodectl.err")"
}

# --- start the daemon ----------------------------------------------------------
args=(--set "server.socket_path=$sock" --set "admin.listen=unix:$admin"
      --set "hbm.backend=$backend" --set "hbm.bytes=$HBM_BYTES" --set hbm.required=on
      --set "hbm.copy_batch_bytes=$COPY_BATCH_BYTES"
      --set memory.pin_host=on --set "memory.host_bytes=$HOST_BYTES"
      --set "memory.pin_chunk_bytes=$PIN_CHUNK_BYTES"
      --set log.level=info)
# Under the test suite (--sim) the host tier takes ordinary pages: a hugetlb
# pool another suite reserved for itself meanwhile is not this check's.
[[ $backend == sim ]] && args+=(--set memory.huge_pages=off)
if [[ $store == 1 ]]; then
  mkdir -p "$dir/store"
  args+=(--set persist.backend=file --set "persist.path=$dir/store"
         --set persist.policy=write_through --set persist.fsync=never)
  store_desc="a write_through file store in $dir/store"
else
  args+=(--set persist.backend=off)
  store_desc="no store"
fi
denv=()
if [[ $sim == 1 ]]; then
  # Pinning the sim arena costs nothing: delay each chunk so the background
  # thread is still at work when the daemon is ready.
  denv=(env "KVNODE_DEVMEM_SIM_PIN_DELAY_MS=${KVNODE_DEVMEM_SIM_PIN_DELAY_MS:-40}")
else
  args+=(--set "hbm.devices=$DEVICE")
fi
say "starting $kvnoded (hbm.backend=$backend, hbm.bytes=$HBM_BYTES per device, host $HOST_BYTES, pin_host=on, $store_desc) in $dir"
"${denv[@]}" "$kvnoded" "${args[@]}" >"$log" 2>&1 &
pid=$!
t0=$(date +%s.%N)
deadline=$((SECONDS + READY_TIMEOUT))
ready=0
while ((SECONDS < deadline)); do
  if ! kill -0 "$pid" 2>/dev/null; then
    st=0; wait "$pid" || st=$?; pid=
    die "kvnoded exited during its start (status $st)"
  fi
  if [[ -S $sock ]] && "$kvnodectl" -S "$sock" ping >/dev/null 2>&1; then
    if [[ $have_curl == 0 ]] ||
       curl -sf --max-time 2 --unix-socket "$admin" http://kvnode/readyz >/dev/null 2>&1; then
      ready=1; break
    fi
  fi
  sleep 0.05
done
[[ $ready == 1 ]] || die "kvnoded not ready within ${READY_TIMEOUT}s (socket $sock, admin $admin)"
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
stats "$dir/stats-ready.json"
mapfile -t v < <(jvals "$dir/stats-ready.json" tiers.host.pin_state tiers.host.pinned_bytes \
                 tiers.host.capacity_bytes)
say "kvnoded ready after $took s; host arena pinning: ${v[0]}, ${v[1]} of ${v[2]} bytes pinned so far"
if [[ $have_curl == 1 ]]; then
  curl -sf --max-time 5 --unix-socket "$admin" http://kvnode/stats >"$dir/admin-stats.json" ||
    die "admin /stats over $admin failed"
  [[ $(jget "$dir/admin-stats.json" tiers.hbm.0.capacity_bytes) != null ]] ||
    die "admin /stats has no tiers.hbm"
fi

# --- the second process ----------------------------------------------------------
gargs=(--socket "$sock" --device "$DEVICE" --blocks "$BLOCKS" --block-bytes "$BLOCK_BYTES"
       --iters "$ITERS")
genv=()
if [[ $sim == 1 ]]; then
  gargs+=(--sim)
else
  # libkvnode finds the CUDA runtime at run time (dlopen libcudart.so*).
  genv=(env "LD_LIBRARY_PATH=$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi
say "running ${genv[*]:+${genv[*]} }$checker ${gargs[*]}"
set +e
"${genv[@]}" "$checker" "${gargs[@]}" 2>&1 | tee "$dir/gpu-check.out"
st=${PIPESTATUS[0]}
set -e
((st == 0)) || die "kvnode-gpu-check failed (status $st): $(grep -m1 'FAIL' "$dir/gpu-check.out" || tail -n 1 "$dir/gpu-check.out")"
kill -0 "$pid" 2>/dev/null || die "kvnoded died while the checker ran"

# --- what the daemon says ----------------------------------------------------------
stats "$dir/stats.json"
s=$dir/stats.json
mapfile -t v < <(jvals "$s" tiers.hbm.0.device tiers.hbm.0.lent_by tiers.hbm.1.device \
                 tiers.hbm.1.lent_by tiers.hbm.2.device demotions.bytes_total \
                 demotions.failed_total demotions.batches_total)
want_lent=cuda_ipc want_n=1
[[ $sim == 1 ]] && want_lent=fd want_n=2
nhbm=0 found=0
for i in 0 1 2; do
  [[ ${v[2 * i]} == null ]] && break
  nhbm=$((nhbm + 1))
  [[ ${v[2 * i]} == "$DEVICE" ]] && found=1
  ((i < 2)) && [[ ${v[2 * i + 1]} != "$want_lent" ]] &&
    die "/stats tiers.hbm[$i] is lent by '${v[2 * i + 1]}', expected '$want_lent'"
done
((nhbm == want_n)) || die "/stats tiers.hbm has $nhbm device(s), expected $want_n"
((found)) || die "/stats tiers.hbm has no entry for device $DEVICE"
dem_bytes=${v[5]} dem_failed=${v[6]}
[[ $dem_bytes =~ ^[0-9]+$ && $dem_bytes -gt 0 ]] || die "/stats demotions.bytes_total is '$dem_bytes': nothing was demoted"
[[ $dem_failed == 0 ]] || die "/stats demotions.failed_total is $dem_failed"
say "/stats: tiers.hbm has $nhbm device(s) lent by $want_lent (device $DEVICE among them); $dem_bytes bytes demoted in ${v[7]} batches, none failed"
mapfile -t v < <(jvals "$s" persist.backend persist.state persist.written_blocks_total \
                 tiers.hbm.0.used_bytes tiers.hbm.0.capacity_bytes demotions.high_watermark)
if [[ $store == 1 ]]; then
  [[ ${v[0]} == file ]] || die "/stats persist.backend is '${v[0]}', expected 'file' (--store)"
  [[ ${v[1]} == ok ]] || die "/stats persist.state is '${v[1]}', expected 'ok'"
  [[ ${v[2]} =~ ^[0-9]+$ && ${v[2]} -gt 0 ]] || die "/stats persist.written_blocks_total is '${v[2]}': nothing was written"
  say "/stats: the file store is ok, ${v[2]} blocks written; HBM ${v[3]} of ${v[4]} bytes used (high watermark ${v[5]})"
fi

# The host arena: pinned in the background, eventually whole.
deadline=$((SECONDS + PIN_TIMEOUT))
while :; do
  stats "$dir/stats-pin.json"
  mapfile -t v < <(jvals "$dir/stats-pin.json" tiers.host.pin_state tiers.host.pinned \
                   tiers.host.pinned_bytes tiers.host.capacity_bytes tiers.host.pin_error)
  [[ ${v[0]} == failed ]] && die "host arena pinning failed: ${v[4]}"
  [[ ${v[0]} == "done" && ${v[1]} == true ]] && break
  ((SECONDS < deadline)) ||
    die "host arena not pinned within ${PIN_TIMEOUT}s (pin_state ${v[0]}, ${v[2]} of ${v[3]} bytes)"
  sleep 0.2
done
[[ ${v[2]} == "${v[3]}" ]] || die "pin_state done but pinned_bytes ${v[2]} != host capacity ${v[3]}"
say "host arena pinned: ${v[2]} bytes (pin_state done)"

# --- stop ---------------------------------------------------------------------------
kill -TERM "$pid"
deadline=$((SECONDS + STOP_TIMEOUT))
while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
kill -0 "$pid" 2>/dev/null && die "kvnoded still running ${STOP_TIMEOUT}s after SIGTERM"
st=0; wait "$pid" || st=$?; pid=
((st == 0)) || die "kvnoded exited with status $st after SIGTERM (expected 0)"
say "kvnoded stopped on SIGTERM with status 0"

if [[ $suite == 1 ]]; then
  say "running the suite and the benchmark on this build: make ${make_args[*]} check bench"
  make "${make_args[@]}" check
  make "${make_args[@]}" bench
fi
say "PASS ($([[ $sim == 1 ]] && echo "sim dry run: no GPU was used" || echo "CUDA device $DEVICE"), $store_desc)"
