#!/usr/bin/env bash
# contrib/grafana/kvnode.json and contrib/prometheus/kvnode-rules.yml (issue 33
# item 3; run by `make check`): the dashboard is valid JSON whose panels all
# have queries, every kvnode_* metric name the two files use exists in /metrics
# of a kvnoded started on a temp dir (tests/contrib/check_metrics.py), and
# `promtool check rules` passes the rules and the dashboard's queries where
# promtool is installed (Debian's prometheus package; SKIPPED otherwise). Self-test in the same daemon run:
# copies of both files with a name kvnoded does not export must be reported.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
dash=contrib/grafana/kvnode.json
rules=contrib/prometheus/kvnode-rules.yml
fail=0
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# The dashboard: JSON, every panel but rows has at least one query.
if ! /usr/bin/python3 - "$dash" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
bad = [p.get("title") for p in d["panels"] if p.get("type") != "row" and not any(t.get("expr") for t in p.get("targets", []))]
if bad:
    sys.exit("contrib: panels without a query: %s" % bad)
print("contrib: %s: %d panels" % (sys.argv[1], sum(p.get("type") != "row" for p in d["panels"])))
EOF
then
  fail=1
fi

if [[ ! -x $BUILD/kvnoded ]]; then
  echo "contrib: $BUILD/kvnoded is not built (make all)" >&2
  exit 1
fi
sed 's/kvnode_persist_healthy/kvnode_no_such_metric_json/' "$dash" >"$tmp/bogus.json"
sed 's/kvnode_persist_healthy == 0/kvnode_no_such_metric_rules == 0/' "$rules" >"$tmp/bogus.yml"
timeout 120 /usr/bin/python3 tests/contrib/check_metrics.py "$BUILD/kvnoded" "$dash" "$rules" \
  "$tmp/bogus.json" "$tmp/bogus.yml" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
# Exactly the two planted names are unknown; both real files pass.
if (( rc != 1 )) ||
   [[ $(grep -c "which kvnoded's /metrics does not have" "$tmp/out") -ne 2 ]] ||
   ! grep -q "bogus.json uses kvnode_no_such_metric_json" "$tmp/out" ||
   ! grep -q "bogus.yml uses kvnode_no_such_metric_rules" "$tmp/out" ||
   ! grep -q "^check_metrics: $dash: all" "$tmp/out" ||
   ! grep -q "^check_metrics: $rules: all" "$tmp/out"; then
  echo "contrib: the dashboard or the rules use a metric kvnoded does not export, or the check" \
       "did not catch the planted name (exit $rc, output above)" >&2
  fail=1
fi

if command -v promtool >/dev/null; then
  promtool check rules "$rules" || { echo "contrib: promtool check rules $rules failed" >&2; fail=1; }
  # The dashboard's queries parse too: each one as a recording rule (JSON is
  # YAML), Grafana's variables replaced by what they stand for.
  /usr/bin/python3 - "$dash" >"$tmp/dash-rules.yml" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", []) if t.get("expr")]
exprs = [e.replace("$__rate_interval", "5m").replace("$instance", ".*") for e in exprs]
rules = [{"record": "kvnode:dashboard_query_%d" % i, "expr": e} for i, e in enumerate(exprs)]
print(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}, indent=1))
EOF
  promtool check rules "$tmp/dash-rules.yml" ||
    { echo "contrib: a query of $dash does not parse (promtool, output above)" >&2; fail=1; }
else
  echo "contrib: SKIPPED promtool check rules (the rules and the dashboard's queries): promtool is not" \
       "installed (Debian: apt install prometheus)"
fi
exit $fail
