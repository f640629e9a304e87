#!/usr/bin/env bash
# Real-GPU check (run where a GPU and the CUDA toolkit exist; CI has neither):
# builds with CUDA, starts kvnoded with memory.pin_host=on, which fails the
# start unless cudaHostRegister pinned the host arena, checks that stats say
# so, runs the integration suites against that build, and prints the
# benchmark. Exit 0 only when all of that held.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -e /usr/local/cuda/include/cuda_runtime_api.h || -n "${CUDA_HOME:-}" ]] || {
  echo "gpu-check: no CUDA toolkit found" >&2; exit 2; }
make CUDA=1 BUILD=build-gpu all >/dev/null
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
build-gpu/kvnoded --set server.socket_path="$dir/s.sock" --set memory.host_bytes=1GiB \
    --set memory.pin_host=on >"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S "$dir/s.sock" ]] && break; sleep 0.1; done
if ! build-gpu/kvnodectl -S "$dir/s.sock" stats --json | grep -q '"pinned": *true'; then
  cat "$dir/log" >&2; echo "gpu-check: host arena is not pinned" >&2; exit 1
fi
echo "gpu-check: host arena pinned"
kill -TERM "$pid"; wait "$pid"
make CUDA=1 BUILD=build-gpu check
make CUDA=1 BUILD=build-gpu bench
