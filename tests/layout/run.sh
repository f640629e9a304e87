#!/usr/bin/env bash
# The tree's shape (issues 14, 29): no include cycle between the modules of
# daemon/ and lib/, none between their folders (the top level of daemon/
# counting as one: every include points down the layers of
# docs/ARCHITECTURE.md), both by scripts/include-cycles.py, and no source file
# in daemon/ over MAX_LINES lines, so that no module grows back into a second
# core. A self-test first shows the script fails on a two-folder cycle and a
# folder<->top-level cycle and passes a one-way tree. Run by `make check` as a
# script test; prints what is wrong and exits 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
MAX_LINES=${MAX_LINES:-900}
fail=0

# Self-test on small trees: each file is "path: the headers it includes".
selftest() {   # selftest NAME WANT_RC SPEC...
  local name=$1 want=$2 tmp rc
  shift 2
  tmp=$(mktemp -d) || return 1
  for spec in "$@"; do
    local path=${spec%%:*} incs=${spec#*:}
    mkdir -p "$tmp/$(dirname "$path")"
    : >"$tmp/$path"
    for inc in $incs; do printf '#include "%s"\n' "$inc" >>"$tmp/$path"; done
  done
  /usr/bin/python3 scripts/include-cycles.py "$tmp" >"$tmp.out" 2>&1
  rc=$?
  if (( rc != want )) || { (( want == 1 )) && ! grep -q 'cycle between folders' "$tmp.out"; }; then
    echo "layout: self-test '$name': include-cycles.py exited $rc, expected $want:" >&2
    cat "$tmp.out" >&2
    fail=1
  fi
  rm -rf "$tmp" "$tmp.out"
}
# a/one.c -> b/two.h and b/three.c -> a/four.h: no module cycle, a folder one.
selftest "two folders" 1 "daemon/a/one.c:b/two.h" "daemon/b/two.h:" "daemon/b/three.c:a/four.h" "daemon/a/four.h:"
selftest "folder and top level" 1 "daemon/top.c:a/one.h" "daemon/a/one.h:" "daemon/a/two.c:other.h" "daemon/other.h:"
selftest "one way" 0 "daemon/top.c:a/one.h b/two.h" "daemon/a/one.h:b/two.h" "daemon/b/two.h:" "daemon/b/two.c:b/two.h"

if ! /usr/bin/python3 scripts/include-cycles.py .; then
  echo "layout: include cycle(s) above; a module may not depend on one that depends on it, and a" \
       "folder may include only from the folders below it (docs/ARCHITECTURE.md, \"Layout of the tree\")" >&2
  fail=1
fi
while read -r n f; do
  [[ $f == total ]] && continue
  if (( n > MAX_LINES )); then
    echo "layout: $f has $n lines (more than $MAX_LINES): split it by concern behind a private *_internal.h" >&2
    fail=1
  fi
done < <(find daemon -name '*.[ch]' -print0 | xargs -0 wc -l)
(( fail == 0 )) && echo "layout: no include cycle between modules or folders; every daemon/ file within $MAX_LINES lines"
exit $fail
