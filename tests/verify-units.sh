#!/usr/bin/env bash
# `systemd-analyze verify` of systemd/kvnoded.service and kvnoded.socket.
# verify insists that ExecStart's binary exists, so the units are checked as
# copies whose ExecStart points at the built daemon (argument 1, default
# build/kvnoded); man pages are not looked up (--man=no: not installed here).
# Any output from verify counts as a failure. Exit 77 when the tool is absent.
# The service must also make kvnoded, not an engine, the OOM killer's first
# victim: OOMScoreAdjust= positive (its memfd arena is not counted as its own).
set -euo pipefail
cd "$(dirname "$0")/.."
oom=$(sed -n 's/^OOMScoreAdjust=//p' systemd/kvnoded.service)
[[ $oom =~ ^[0-9]+$ && $oom -ge 1 && $oom -le 1000 ]] ||
  { echo "verify-units: kvnoded.service needs OOMScoreAdjust=1..1000 (has '${oom}')" >&2; exit 1; }
bin=$(realpath "${1:-build/kvnoded}")
command -v systemd-analyze >/dev/null || { echo "verify-units: systemd-analyze not installed"; exit 77; }
[[ -x $bin ]] || { echo "verify-units: $bin is not executable" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|^ExecStart=/usr/sbin/kvnoded |ExecStart=$bin |" systemd/kvnoded.service > "$tmp/kvnoded.service"
grep -q "^ExecStart=$bin " "$tmp/kvnoded.service" || { echo "verify-units: no ExecStart=/usr/sbin/kvnoded line" >&2; exit 1; }
cp systemd/kvnoded.socket "$tmp/"
out=$(systemd-analyze verify --man=no "$tmp/kvnoded.service" "$tmp/kvnoded.socket" 2>&1) && rc=0 || rc=$?
if [[ $rc -ne 0 || -n $out ]]; then
  echo "verify-units: systemd-analyze verify failed (rc $rc):" >&2
  echo "$out" >&2
  exit 1
fi
echo "verify-units: kvnoded.service and kvnoded.socket verified"
