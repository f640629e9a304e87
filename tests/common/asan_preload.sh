# Sourced by test scripts that run python3 (or another program built without
# sanitizers) against libkvnode: asan_preload LIB prints the ASan runtime to
# LD_PRELOAD when LIB is a sanitizer build (its runtime must be loaded
# first), nothing otherwise.
asan_preload() {
  # grep reads all of ldd's output (no -q): under pipefail, ldd killed by
  # SIGPIPE after an early match would read as "no ASan".
  if ldd "$1" 2>/dev/null | grep libasan >/dev/null; then
    ${CC:-cc} -print-file-name=libasan.so
  fi
}
