#!/usr/bin/env bash
# The tree's shape (issues 14, 29): no include cycle between the modules of
# daemon/ and lib/, none between their folders (the top level of daemon/
# counting as one: every include points down the layers of
# docs/ARCHITECTURE.md), both by scripts/include-cycles.py, and no source file
# in daemon/ over MAX_LINES lines, so that no module grows back into a second
# core. A self-test first shows the script fails on a two-folder cycle and a
# folder<->top-level cycle and passes a one-way tree. The GET and PUT walks of
# docs/ARCHITECTURE.md stay true and short (issue 29): scripts/request-path.py,
# self-tested the same way. Run by `make check` as a script test; prints what
# is wrong and exits 1. Every man page carries one .TH date (issue 33).
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

# request-path.py on a small tree: a walk naming a function that is not
# there, one of 7 parameters and a file holding an 81-line function must fail
# (each named); the same walk over short functions must pass.
pathtest() {   # pathtest NAME WANT_RC BODY_LINES PARAMS MISSING...
  local name=$1 want=$2 body=$3 params=$4 tmp rc
  shift 4
  tmp=$(mktemp -d) || return 1
  mkdir -p "$tmp/docs" "$tmp/daemon/x"
  { printf 'int step_one(%s)\n{\n' "$params"
    for ((i = 0; i < body; i++)); do printf '    (void)0;\n'; done
    printf '    return 0;\n}\n\nstatic int step_two(void)\n{\n    return 1;\n}\n'; } >"$tmp/daemon/x/a.c"
  { printf '# t\n\n## Follow a GET\n\n1. `x/a.c` `step_one()` -- one\n'
    printf '2. `x/a.c` the second step,\n   wrapped: `step_two()` %s\n\n' "$*"
    printf '## Follow a PUT\n\n1. `x/a.c` `step_two()`\n\n## Next\n'; } >"$tmp/docs/ARCHITECTURE.md"
  /usr/bin/python3 scripts/request-path.py "$tmp" >"$tmp.out" 2>&1
  rc=$?
  if (( rc != want )); then
    echo "layout: self-test '$name': request-path.py exited $rc, expected $want:" >&2
    cat "$tmp.out" >&2
    fail=1
  fi
  rm -rf "$tmp" "$tmp.out"
}
pathtest "short steps" 0 3 "int a, int b"
pathtest "81-line function" 1 77 "int a"
pathtest "7 parameters" 1 3 "int a, int b, int c, int d, int e, int f, int g"
pathtest "missing function" 1 3 "void" '`step_three()`'

if ! /usr/bin/python3 scripts/request-path.py .; then
  echo "layout: the GET/PUT walks of docs/ARCHITECTURE.md (\"Follow a GET\", \"Follow a PUT\") name" \
       "functions that are gone, take over 6 parameters, or sit in a file with a function over 80 lines" >&2
  fail=1
fi

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
# One date in every man page (issue 33): the .TH lines' third field agree.
man_dates=$(sed -n -E 's/^\.TH +[^ ]+ +[^ ]+ +("[^"]*"|[^ ]+).*/\1/p' man/*.[0-9] | tr -d '"' | sort -u)
if [[ $(wc -l <<<"$man_dates") -ne 1 || -z $man_dates ]]; then
  echo "layout: the man pages' .TH dates differ (give them all one date):" >&2
  grep -H '^\.TH' man/*.[0-9] >&2
  fail=1
fi

(( fail == 0 )) && echo "layout: no include cycle between modules or folders; every daemon/ file within $MAX_LINES lines;" \
    "the GET/PUT walks hold; one date in every man page"
exit $fail
