#!/usr/bin/env bash
# Install the Debian packages kvnode needs to build and test. Idempotent:
# when everything is present it only checks and exits (well under a second).
set -euo pipefail

packages=(
  gcc make pkg-config
  libevent-dev libprotobuf-c-dev protobuf-c-compiler
  libjansson-dev libcurl4-openssl-dev libinih-dev libsystemd-dev libhiredis-dev redis-server redis-tools
  check python3 python3-prometheus-client python3-pytest python3-numpy python3-torch man-db groff-base procps systemd
  python3-venv python3-pip python3-setuptools python3-wheel
  strace
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "deps: missing: ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=sudo
  else
    echo "deps: not root: install them with" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "deps: installed ${missing[*]}"
