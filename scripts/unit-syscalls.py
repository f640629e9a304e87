#!/usr/bin/env python3
"""Does systemd/kvnoded.service's SystemCallFilter= allow every system call kvnoded makes?

  unit-syscalls.py [--source TREE] [--strace DIR] [--list] UNIT

The unit's SystemCallFilter= lines are read as systemd reads them (an allow
list gets @default implicitly; "~" entries then take calls away, later plain
entries add them back; an empty assignment resets), with the groups expanded by
`systemd-analyze syscall-filter` of the systemd installed here. Checked against:
  --source TREE: every syscall(SYS_x, ...) in TREE/daemon and TREE/lib (the
                 calls glibc has no wrapper for, such as mbind, set_mempolicy);
  --strace DIR:  the summaries `strace -c` wrote of traced daemon runs into
                 DIR (tests/systemd/strace-kvnoded.sh), one call per table row.
Each call the filter does not allow is printed with where it was seen; exit 1.
--list prints the allowed calls instead. Exit 2 on bad input.
"""
import argparse
import os
import re
import subprocess
import sys


def groups_from_systemd():
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"], check=True,
                         capture_output=True, text=True).stdout
    groups, cur = {}, None
    for line in out.splitlines():
        if line.startswith("@"):
            cur = groups.setdefault(line.split()[0], [])
        elif line.startswith("#") or not line.strip():
            cur = None if line.startswith("#") else cur
        elif cur is not None and not line.strip().startswith("#"):
            cur.append(line.strip())
    return groups


def expand(name, groups, seen=None):
    if not name.startswith("@"):
        return {name}
    if name not in groups:
        sys.exit(f"unit-syscalls: unknown system call group {name}")
    seen = seen or set()
    if name in seen:
        return set()
    seen.add(name)
    calls = set()
    for item in groups[name]:
        calls |= expand(item, groups, seen)
    return calls


def unit_filter(path):
    """The SystemCallFilter= assignments of the [Service] section, in order."""
    values, section = [], None
    with open(path) as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    for line in lines:
        s = line.strip()
        if s.startswith("[") and s.endswith("]"):
            section = s
        elif section == "[Service]" and s.startswith("SystemCallFilter="):
            values.append(s[len("SystemCallFilter="):].strip())
    return values


def allowed_calls(values, groups):
    allow_list, calls = None, set()
    for v in values:
        if not v:
            allow_list, calls = None, set()
            continue
        invert = v.startswith("~")
        words = v.lstrip("~").split()
        if allow_list is None:
            allow_list = not invert
            if allow_list:
                calls = expand("@default", groups)
        for w in words:
            w = w.split(":")[0]          # name:errno
            names = expand(w, groups)
            # allow list: "~" removes, plain adds; deny list: "~" adds to the
            # denied set, plain removes from it.
            if allow_list != invert:
                calls |= names
            else:
                calls -= names
    if allow_list is None:
        return None, set()
    return allow_list, calls


SYSCALL_RE = re.compile(r"\bsyscall\s*\(\s*(?:SYS|__NR)_([a-z0-9_]+)")


def source_calls(tree):
    found = {}
    for top in ("daemon", "lib"):
        for root, _, files in os.walk(os.path.join(tree, top)):
            for fn in sorted(files):
                if not fn.endswith((".c", ".h")):
                    continue
                p = os.path.join(root, fn)
                with open(p, errors="replace") as f:
                    text = f.read()
                # Comments do not call anything.
                text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
                for i, line in enumerate(text.splitlines(), 1):
                    for m in SYSCALL_RE.finditer(line):
                        found.setdefault(m.group(1), f"{os.path.relpath(p, tree)}:{i}")
    return found


ROW_RE = re.compile(r"^\s*[0-9.]+\s+[0-9.]+\s+[0-9]+\s+[0-9]+\s+(?:[0-9]+\s+)?([a-z_0-9]+)\s*$")


def strace_calls(paths):
    found = {}
    for p in paths:
        with open(p) as f:
            for line in f:
                m = ROW_RE.match(line)
                if m and m.group(1) != "total":
                    found.setdefault(m.group(1), f"traced run {os.path.basename(p)}")
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("unit")
    ap.add_argument("--source")
    ap.add_argument("--strace")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    groups = groups_from_systemd()
    allow_list, calls = allowed_calls(unit_filter(a.unit), groups)
    if allow_list is None:
        print(f"unit-syscalls: {a.unit} has no SystemCallFilter=", file=sys.stderr)
        return 1
    if not allow_list:
        print(f"unit-syscalls: {a.unit}'s SystemCallFilter= is a deny list; kvnoded's is an allow list",
              file=sys.stderr)
        return 1
    if a.list:
        print("\n".join(sorted(calls)))
        return 0
    seen = {}
    if a.source:
        seen.update(source_calls(a.source))
    if a.strace:
        seen.update(strace_calls(sorted(os.path.join(a.strace, f) for f in os.listdir(a.strace))))
    if not seen:
        print("unit-syscalls: nothing to check (no --source calls, no strace rows)", file=sys.stderr)
        return 2
    missing = sorted(c for c in seen if c not in calls)
    for c in missing:
        print(f"unit-syscalls: {a.unit}'s SystemCallFilter= does not allow {c}, which kvnoded makes: {seen[c]}",
              file=sys.stderr)
    if missing:
        return 1
    print(f"unit-syscalls: SystemCallFilter= allows all {len(seen)} system calls checked "
          f"({len(calls)} allowed in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
