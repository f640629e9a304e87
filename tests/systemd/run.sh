#!/usr/bin/env bash
# The shipped unit lets kvnoded open its sockets (issue 30 item 8: with
# AF_NETLINK missing from RestrictAddressFamilies= the KVS front end's TCP
# peer lookup failed, so every /acquire got 403 under the unit).
# scripts/unit-families.py finds every family the daemon opens (socket() and
# socketpair() calls in daemon/ and lib/, and the libraries kvnoded links) and
# fails, naming the family and where it is opened, when
# systemd/kvnoded.service's RestrictAddressFamilies= does not allow it, or
# allows one nothing opens. Self-tests first: the unit with each needed family
# removed must fail naming it, and a small tree shows calls in comments and
# strings are ignored, a call split over lines is found, a call whose family
# is a variable needs a "unit-families:" note, getifaddrs() needs AF_NETLINK,
# a library the table does not know fails, and RestrictAddressFamilies= is
# read as systemd does (several lines, a reset, a deny list). Then `systemd-analyze
# verify` (tests/verify-units.sh) when it and the built daemon are here.
# Run by `make check` as a script test; prints what is wrong and exits 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
check=(/usr/bin/python3 scripts/unit-families.py)
fail=0
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# expect NAME WANT_RC WANT_TEXT ARGS...: the check exits WANT_RC and, when
# WANT_TEXT is not empty, says it.
expect() {
  local name=$1 want=$2 text=$3 rc
  shift 3
  "${check[@]}" "$@" >"$tmp/out" 2>&1
  rc=$?
  if (( rc != want )) || { [[ -n $text ]] && ! grep -qF -- "$text" "$tmp/out"; }; then
    echo "systemd: self-test '$name': unit-families.py exited $rc, expected $want${text:+ saying '$text'}:" >&2
    cat "$tmp/out" >&2
    fail=1
  fi
}

# The shipped unit without each family the daemon needs.
needed=$("${check[@]}" --needed .) || { echo "systemd: unit-families.py --needed failed" >&2; exit 1; }
[[ $needed == *AF_UNIX* ]] || { echo "systemd: unit-families.py finds no AF_UNIX socket in the daemon" >&2; exit 1; }
removed=0
for fam in $needed; do
  sed -E "/^RestrictAddressFamilies=/ s/([= ])$fam( |\$)/\\1/" systemd/kvnoded.service >"$tmp/kvnoded.service"
  cmp -s systemd/kvnoded.service "$tmp/kvnoded.service" && continue   # not there: the real check below says so
  expect "unit without $fam" 1 "does not allow $fam, which kvnoded opens" . "$tmp/kvnoded.service"
  removed=$((removed + 1))
done
(( removed > 0 )) || { echo "systemd: self-test: no needed family found to remove from the unit" >&2; fail=1; }

# A small tree: a Makefile linking libsystemd (AF_UNIX) and one source file.
mkdir -p "$tmp/t/daemon/x" "$tmp/t/lib"
echo 'DAEMON_PKGS := libsystemd jansson' >"$tmp/t/Makefile"
cat >"$tmp/t/daemon/x/a.c" <<'EOF'
/* socket(AF_PACKET, SOCK_RAW, 0) in a comment opens nothing */
static const char *s = "socket(AF_CAN, SOCK_RAW, 0)";
int a(void)
{
    return socket(
        PF_NETLINK, SOCK_DGRAM, 0) + socketpair(AF_UNIX, SOCK_STREAM, 0, fds) + x->socket(AF_X25);
}
EOF
unit() { printf '[Unit]\nDescription=t\n[Service]\nExecStart=/bin/true\n%s\n' "$@" >"$tmp/t.service"; }
unit 'RestrictAddressFamilies=AF_UNIX AF_NETLINK'
expect "small tree" 0 "allows AF_NETLINK AF_UNIX" "$tmp/t" "$tmp/t.service"
unit 'RestrictAddressFamilies=AF_UNIX'
expect "call over two lines" 1 "does not allow AF_NETLINK, which kvnoded opens: daemon/x/a.c:5" "$tmp/t" "$tmp/t.service"
unit 'RestrictAddressFamilies=AF_UNIX' 'RestrictAddressFamilies=AF_NETLINK AF_INET'
expect "one too many" 1 "allows AF_INET, which nothing kvnoded runs opens" "$tmp/t" "$tmp/t.service"
unit 'RestrictAddressFamilies=AF_INET' 'RestrictAddressFamilies=' 'RestrictAddressFamilies=AF_UNIX AF_NETLINK'
expect "reset by an empty assignment" 0 "" "$tmp/t" "$tmp/t.service"
unit 'RestrictAddressFamilies=~AF_PACKET'
expect "deny list" 1 "is a deny list" "$tmp/t" "$tmp/t.service"
unit 'NoNewPrivileges=yes'
expect "no restriction" 1 "no RestrictAddressFamilies= allow list" "$tmp/t" "$tmp/t.service"
printf 'int b(int fam)\n{\n    return socket(fam, SOCK_STREAM, 0);\n}\n' >"$tmp/t/lib/b.c"
unit 'RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET6'
expect "family in a variable" 1 "lib/b.c:3 (socket(fam, ...)): the family is not an AF_/PF_ constant" \
  "$tmp/t" "$tmp/t.service"
printf 'int b(int fam)\n{\n    /* unit-families: AF_INET6 */\n    return socket(fam, SOCK_STREAM, 0);\n}\n' >"$tmp/t/lib/b.c"
expect "family in a variable, noted" 0 "allows AF_INET6 AF_NETLINK AF_UNIX" "$tmp/t" "$tmp/t.service"
printf 'struct ifaddrs;\nint c(struct ifaddrs **ifa) { return getifaddrs(ifa); }\n' >"$tmp/t/lib/c.c"
unit 'RestrictAddressFamilies=AF_UNIX AF_INET6'
expect "libc call that opens a socket" 1 "does not allow AF_NETLINK" "$tmp/t" "$tmp/t.service"
expect "libc call that opens a socket, named" 1 "lib/c.c:2 (getifaddrs())" "$tmp/t" "$tmp/t.service"
echo 'DAEMON_PKGS += libfoo' >>"$tmp/t/Makefile"
expect "unknown library" 1 "kvnoded links libfoo" "$tmp/t" "$tmp/t.service"

# The real tree and unit.
if ! "${check[@]}" .; then
  echo "systemd: systemd/kvnoded.service must allow (RestrictAddressFamilies=) every socket family kvnoded" \
       "opens and no other; see the lines above" >&2
  fail=1
fi

# The unit parses (an unknown family name is a warning there, and a failure here).
if [[ -x $BUILD/kvnoded ]]; then
  bash tests/verify-units.sh "$BUILD/kvnoded"
  case $? in
    0) ;;
    77) echo "systemd: SKIPPED systemd-analyze verify: systemd-analyze is not installed" ;;
    *) fail=1 ;;
  esac
else
  echo "systemd: SKIPPED systemd-analyze verify: $BUILD/kvnoded is not built (verify needs ExecStart's binary)"
fi
exit $fail
