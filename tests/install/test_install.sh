#!/usr/bin/env bash
# `make install` lays out a tree a package could ship, keeps an operator's
# config, and `make uninstall` removes what it installed; every man page
# renders. The libraries go to LIBDIR: by default Debian's multiarch folder
# here (usr/lib/<multiarch>), or where LIBDIR= says (a lib64 under another
# PREFIX), with a kvnode.pc that names it, a Python package that loads the
# library from it, and examples/five_lines.c compiling and linking with the
# README's pkg-config line (issue 33). Run by `make check` (BUILD names the
# build directory).
set -u
BUILD=${BUILD:-build}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

make --no-print-directory -s BUILD="$BUILD" install DESTDIR="$root" PREFIX=/usr >"$root.log" 2>&1 ||
  { cat "$root.log"; fail "make install"; }
rm -f "$root.log"
# Debian (this machine, CI): the multiarch folder.
multiarch=$(${CC:-cc} -print-multiarch 2>/dev/null)
libdir=usr/lib/${multiarch:?cc -print-multiarch printed nothing}
for f in usr/sbin/kvnoded usr/bin/kvnodectl $libdir/libkvnode.so.0 $libdir/libkvnode.so $libdir/libkvnode.a \
         $libdir/pkgconfig/kvnode.pc usr/include/kvnode.h usr/share/man/man1/kvnodectl.1 \
         usr/share/man/man3/libkvnode.3 usr/share/man/man5/kvnode.conf.5 usr/share/man/man8/kvnoded.8 \
         usr/lib/systemd/system/kvnoded.service usr/lib/systemd/system/kvnoded.socket \
         usr/lib/sysusers.d/kvnode.conf usr/lib/tmpfiles.d/kvnode.conf etc/kvnode/kvnode.conf \
         usr/lib/python3/dist-packages/kvnode/__init__.py usr/lib/python3/dist-packages/kvnode/_lib.py \
         usr/lib/python3/dist-packages/kvnode/sglang.py usr/lib/python3/dist-packages/kvnode/lmcache.py; do
  [[ -e "$root/$f" ]] || fail "missing $f"
done
[[ -x "$root/usr/sbin/kvnoded" ]] || fail "kvnoded not executable"
grep -q '^ExecStart=/usr/sbin/kvnoded ' "$root/usr/lib/systemd/system/kvnoded.service" ||
  fail "service ExecStart does not point at /usr/sbin/kvnoded"
# kvnoded, not an engine, is the OOM killer's victim (kvnoded(8) "OOM score").
grep -Eq '^OOMScoreAdjust=([1-9][0-9]{0,2}|1000)$' "$root/usr/lib/systemd/system/kvnoded.service" ||
  fail "service lacks a positive OOMScoreAdjust="
grep -q '^prefix=/usr$' "$root/$libdir/pkgconfig/kvnode.pc" || fail "pkg-config prefix is not /usr"
grep -qx "libdir=/$libdir" "$root/$libdir/pkgconfig/kvnode.pc" || fail "pkg-config libdir is not /$libdir"
for d in usr/lib/libkvnode.so.0 usr/lib/pkgconfig; do [[ -e "$root/$d" ]] && fail "$d installed beside $libdir"; done
# The shipped config serves the service's socket and store, and parses.
grep -q '^socket_path' "$root/etc/kvnode/kvnode.conf" && fail "installed config pins a socket_path"
grep -q '^path' "$root/etc/kvnode/kvnode.conf" && fail "installed config pins a [persist] path"
grep -qx '#path = /var/lib/kvnode' "$root/etc/kvnode/kvnode.conf" ||
  fail "installed config lacks '#path = /var/lib/kvnode'"
effective=$("$root/usr/sbin/kvnoded" --check-config -c "$root/etc/kvnode/kvnode.conf") ||
  fail "installed config does not validate"
grep -q '^socket_path = /run/kvnode/kvnode.sock' <<<"$effective" ||
  fail "installed config does not parse to the service socket"
grep -qx 'path = /var/lib/kvnode' <<<"$effective" || fail "installed config does not parse to the service store"
# The installed Python package is found by Debian's python3 there and loads the
# libkvnode installed beside it (no KVNODE_LIBRARY, not run from the tree).
. "$(dirname "$0")/../common/asan_preload.sh"
preload=$(asan_preload "$root/$libdir/libkvnode.so.0")
loaded=$(cd "$root" && env -u KVNODE_LIBRARY PYTHONPATH="$root/usr/lib/python3/dist-packages" \
         ${preload:+LD_PRELOAD="$preload"} ASAN_OPTIONS=detect_leaks=0 \
         /usr/bin/python3 -c 'import kvnode; print(kvnode.__file__); print(kvnode.library_path())' 2>&1) ||
  fail "installed Python package does not import: $loaded"
[[ "$loaded" == "$root/usr/lib/python3/dist-packages/kvnode/__init__.py"$'\n'"$root/$libdir/libkvnode.so.0" ]] ||
  fail "installed Python package: unexpected module or library: $loaded"
rm -rf "$root/usr/lib/python3/dist-packages/kvnode/__pycache__"
# The README's C example builds against the staged install with pkg-config, and
# the program runs against the installed libkvnode.so (here to its connect,
# which fails without a daemon: exit 1, nothing else).
san=; [[ -n "$preload" ]] && san=-fsanitize=address,undefined
pcflags=$(PKG_CONFIG_PATH="$root/$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root" pkg-config --cflags --libs kvnode) ||
  fail "pkg-config --cflags --libs kvnode"
${CC:-cc} $san -o "$root/five_lines" "$(dirname "$0")/../../examples/five_lines.c" $pcflags 2>&1 || fail "examples/five_lines.c does not build with pkg-config"
if [[ -x "$root/five_lines" ]]; then
  out=$(cd "$root" && LD_LIBRARY_PATH="$root/$libdir" ASAN_OPTIONS=detect_leaks=0 timeout 20 ./five_lines 2>&1); rc=$?
  [[ $rc -eq 1 && -z "$out" ]] || fail "five_lines without a daemon: exit $rc (expected 1), output: $out"
  LD_LIBRARY_PATH="$root/$libdir" ldd "$root/five_lines" | grep -q "$root/$libdir/libkvnode.so.0" || fail "five_lines did not link the installed libkvnode.so"
  rm -f "$root/five_lines"
fi
# An operator's config survives a reinstall.
echo "# edited by the operator" >>"$root/etc/kvnode/kvnode.conf"
make --no-print-directory -s BUILD="$BUILD" install DESTDIR="$root" PREFIX=/usr >/dev/null 2>&1 || fail "reinstall"
grep -q 'edited by the operator' "$root/etc/kvnode/kvnode.conf" || fail "reinstall overwrote the config"
# Every man page renders without warnings.
for m in "$root"/usr/share/man/man*/*; do
  out=$(MANWIDTH=80 man -l --warnings "$m" 2>&1 >/dev/null) || fail "man -l $m"
  [[ -z "$out" ]] || fail "man -l $m warns: $out"
done
make --no-print-directory -s BUILD="$BUILD" uninstall DESTDIR="$root" PREFIX=/usr >/dev/null 2>&1 || fail "make uninstall"
left=$(cd "$root" && find . -type f | sort)
[[ "$left" == "./etc/kvnode/kvnode.conf" ]] || fail "uninstall left: $left"

# LIBDIR= given: another prefix's lib64, named by kvnode.pc, found by the package.
alt=$(mktemp -d); trap 'rm -rf "$root" "$alt"' EXIT
make --no-print-directory -s BUILD="$BUILD" install DESTDIR="$alt" PREFIX=/opt/kvnode LIBDIR=/opt/kvnode/lib64 \
  >"$alt.log" 2>&1 || { cat "$alt.log"; fail "make install LIBDIR=/opt/kvnode/lib64"; }
rm -f "$alt.log"
for f in libkvnode.so.0 libkvnode.so libkvnode.a pkgconfig/kvnode.pc; do
  [[ -e "$alt/opt/kvnode/lib64/$f" ]] || fail "LIBDIR=/opt/kvnode/lib64: missing opt/kvnode/lib64/$f"
done
grep -qx 'libdir=/opt/kvnode/lib64' "$alt/opt/kvnode/lib64/pkgconfig/kvnode.pc" 2>/dev/null ||
  fail "LIBDIR=/opt/kvnode/lib64: kvnode.pc does not name it"
pydir=$(cd "$alt" && ls -d opt/kvnode/lib/python3*/dist-packages 2>/dev/null | head -1)
loaded=$(cd "$alt" && env -u KVNODE_LIBRARY PYTHONPATH="$alt/$pydir" ${preload:+LD_PRELOAD="$preload"} \
         ASAN_OPTIONS=detect_leaks=0 /usr/bin/python3 -c 'import kvnode; print(kvnode.library_path())' 2>&1) ||
  fail "LIBDIR=/opt/kvnode/lib64: the Python package does not import: $loaded"
[[ "$loaded" == "$alt/opt/kvnode/lib64/libkvnode.so.0" ]] ||
  fail "LIBDIR=/opt/kvnode/lib64: the Python package loaded $loaded"
rm -rf "$alt/$pydir/kvnode/__pycache__"
make --no-print-directory -s BUILD="$BUILD" uninstall DESTDIR="$alt" PREFIX=/opt/kvnode LIBDIR=/opt/kvnode/lib64 \
  >/dev/null 2>&1 || fail "make uninstall LIBDIR=/opt/kvnode/lib64"
left=$(cd "$alt" && find . -type f | sort)
[[ "$left" == "./etc/kvnode/kvnode.conf" ]] || fail "uninstall LIBDIR=/opt/kvnode/lib64 left: $left"

if [[ $fails -eq 0 ]]; then echo "install: 1 passed, 0 failed"; else echo "install: 0 passed, 1 failed"; fi
[[ $fails -eq 0 ]]
