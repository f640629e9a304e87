#!/usr/bin/env bash
# Python binding suite (tests/python): pytest against a daemon the fixture
# starts itself (KVNODED, default build/kvnoded). Run by `make check` as a
# script test; exits non-zero when any test fails. The binding loads the
# libkvnode of the same build ($BUILD); a sanitizer build's library needs its
# runtime loaded first, so it is preloaded (leak checks off: they would
# report the interpreter's own allocations).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
export KVNODED=${KVNODED:-$PWD/$build/kvnoded}
export KVNODE_LIBRARY=${KVNODE_LIBRARY:-$PWD/$build/libkvnode.so.0}
. tests/common/asan_preload.sh
preload=$(asan_preload "$KVNODE_LIBRARY")
[[ -n "$preload" ]] && export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
exec env ${preload:+LD_PRELOAD="$preload"} PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python
