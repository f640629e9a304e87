#!/usr/bin/env bash
# The tree's shape (issue 14): no include cycle between the modules of daemon/
# and lib/ (scripts/include-cycles.py), and no source file in daemon/ over
# MAX_LINES lines, so that no module grows back into a second core. Run by
# `make check` as a script test; prints what is wrong and exits 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
MAX_LINES=${MAX_LINES:-900}
fail=0
if ! /usr/bin/python3 scripts/include-cycles.py .; then
  echo "layout: include cycle(s) above; a module may not depend on one that depends on it" >&2
  fail=1
fi
while read -r n f; do
  [[ $f == total ]] && continue
  if (( n > MAX_LINES )); then
    echo "layout: $f has $n lines (more than $MAX_LINES): split it by concern behind a private *_internal.h" >&2
    fail=1
  fi
done < <(find daemon -name '*.[ch]' -print0 | xargs -0 wc -l)
(( fail == 0 )) && echo "layout: no include cycle; every daemon/ file within $MAX_LINES lines"
exit $fail
