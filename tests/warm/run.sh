#!/usr/bin/env bash
# Warm restarts (issue 33 item 2): tests/warm/launcher.py plays systemd (the
# notify socket with its fd store, LISTEN_FDS/LISTEN_FDNAMES) around kvnoded:
# blocks put, SIGTERM, a start with the handed-over fds serves every block
# byte-exact and says so in STATS; a corrupted, unsealed, truncated or missing
# snapshot, another memory.slab_bytes or another
# memory.host_bytes starts cold; with the file store adopted blocks are not
# read back; then `kvnoded --takeover` (old daemon exits 0, blocks byte-exact; a
# takeover from another uid refused). Run by
# `make check` as a script test; every daemon it starts it stops.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
timeout 300 /usr/bin/python3 tests/warm/launcher.py "$BUILD" "$@"
