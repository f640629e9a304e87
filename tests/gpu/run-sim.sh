#!/usr/bin/env bash
# `make check` script test: the CPU dry run of the GPU check
# (scripts/gpu-check.sh --sim) against the binaries of this build ($BUILD,
# default build): kvnoded with hbm.backend=sim and background pinning, and
# kvnode-gpu-check --sim as the second process; once without a store and
# once with a write_through file store (--store). Nothing is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/../.."
env BUILD="${BUILD:-build}" NOBUILD=1 bash scripts/gpu-check.sh --sim
exec env BUILD="${BUILD:-build}" NOBUILD=1 bash scripts/gpu-check.sh --sim --store
