#!/usr/bin/env python3
"""Every metric name contrib/grafana/kvnode.json and contrib/prometheus/kvnode-rules.yml
use is one a running kvnoded exports.

  check_metrics.py KVNODED [FILE]...

Starts KVNODED on a temp dir with every part that has metrics of its own on
(host and simulated HBM tiers, the file store, KVCM pointed at a closed port,
the KVS front end, a tenant section; admin port on 127.0.0.1:0), reads
/metrics, stops it, and checks each kvnode_* name in the dashboard's queries
(every "expr" and the variables' queries) and in the rules file (the whole
text: expressions and annotations) against the names /metrics has (families
and sample names such as _bucket). Without FILEs the two contrib files are
checked. Prints each unknown name with the file; exit 1. Exit 2 when the
daemon cannot be started or read.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NAME = re.compile(r"\bkvnode_[a-z0-9_]+\b")
DEFAULT_FILES = ["contrib/grafana/kvnode.json", "contrib/prometheus/kvnode-rules.yml"]


def dashboard_queries(doc):
    """Every query string of a Grafana dashboard: targets' expr, variables' query."""
    found = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in ("expr", "definition") and isinstance(v, str):
                found.append(v)
            elif k == "query" and isinstance(v, str):
                found.append(v)
            else:
                found.extend(dashboard_queries(v))
    elif isinstance(doc, list):
        for v in doc:
            found.extend(dashboard_queries(v))
    return found


def names_used(path):
    with open(path) as f:
        text = f.read()
    if path.endswith(".json"):
        text = "\n".join(dashboard_queries(json.loads(text)))
    # Rules: comments name no metric a rule uses.
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    return set(NAME.findall(text))


def scrape(kvnoded):
    with tempfile.TemporaryDirectory(prefix="kvnode-contrib.") as d:
        opts = ["server.socket_path=" + os.path.join(d, "kvnode.sock"), "memory.host_bytes=64MiB",
                "memory.slab_bytes=1MiB", "memory.huge_pages=off", "memory.pin_host=off",
                "hbm.backend=sim", "hbm.bytes=8MiB",
                "persist.backend=file", "persist.path=" + os.path.join(d, "store"), "persist.fsync=never",
                "admin.listen=127.0.0.1:0",
                "kvcm.enabled=on", "kvcm.endpoints=http://127.0.0.1:1", "kvcm.host_ip_port=10.9.8.7:7000",
                "kvs_server.enabled=on", "kvs_server.listen=127.0.0.1:0",
                "kvs_server.socket_path=" + os.path.join(d, "kvs.sock"),
                "tenant.ops.uids=65534", "tenant.ops.host_bytes=16MiB", "log.level=info"]
        argv = [kvnoded]
        for o in opts:
            argv += ["-s", o]
        log_path = os.path.join(d, "kvnoded.log")
        with open(log_path, "w+") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=d)
            try:
                addr, deadline = None, time.monotonic() + 30
                while addr is None:
                    if proc.poll() is not None:
                        log.seek(0)
                        sys.exit("check_metrics: kvnoded exited with %d:\n%s" % (proc.returncode, log.read()))
                    if time.monotonic() > deadline:
                        log.seek(0)
                        sys.exit("check_metrics: kvnoded logged no admin address in 30 s:\n" + log.read())
                    log.seek(0)
                    m = re.search(r"admin HTTP on (\S+)", log.read())
                    addr = m.group(1) if m else None
                    if addr is None:
                        time.sleep(0.05)
                with urllib.request.urlopen("http://%s/metrics" % addr, timeout=10) as r:
                    page = r.read().decode()
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    sys.exit("check_metrics: kvnoded did not stop within 30 s of SIGTERM")
            if rc != 0:
                log.seek(0)
                sys.exit("check_metrics: kvnoded exited %d at stop:\n%s" % (rc, log.read()))
    names = set()
    for line in page.splitlines():
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    kvnoded, files = os.path.abspath(sys.argv[1]), sys.argv[2:] or [os.path.join(ROOT, f) for f in DEFAULT_FILES]
    exported = scrape(kvnoded)
    if len(exported) < 50:
        print("check_metrics: /metrics had only %d names" % len(exported), file=sys.stderr)
        return 2
    bad = 0
    for path in files:
        used = names_used(path)
        if not used:
            print("check_metrics: %s uses no kvnode_* metric" % path, file=sys.stderr)
            bad += 1
        for n in sorted(used - exported):
            print("check_metrics: %s uses %s, which kvnoded's /metrics does not have" % (path, n),
                  file=sys.stderr)
            bad += 1
        if not used - exported:
            print("check_metrics: %s: all %d metric names exist in /metrics" % (os.path.relpath(path, ROOT), len(used)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
