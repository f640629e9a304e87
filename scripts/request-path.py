#!/usr/bin/env python3
"""The GET and PUT paths stay readable top-down (issue 29).

docs/ARCHITECTURE.md walks a request in two sections, "## Follow a GET" and
"## Follow a PUT": numbered steps naming, in backticks, a file (relative to
daemon/, e.g. `cache/read.c`) and the functions of that file the step runs
(`cache_get()`); a step may wrap over indented lines. This script checks, for both sections:

  - every named file exists and every named function is defined in the file
    named before it in the same section, so the walk cannot go stale;
  - every named function has at most MAX_PARAMS parameters (more travel in a
    request struct);
  - every function defined in a file either section names is at most
    MAX_LINES lines, counted from its first line to its closing brace.

Prints each problem and exits 1; exits 0 and says what it checked otherwise.

    scripts/request-path.py [ROOT]      (ROOT: the tree, default .)
"""
import os
import re
import sys

MAX_LINES = 80
MAX_PARAMS = 6
SECTIONS = ('Follow a GET', 'Follow a PUT')
STEP = re.compile(r'^\s*\d+\.\s')
TICK = re.compile(r'`([^`]+)`')
FILE = re.compile(r'^[\w./-]+\.[ch]$')
FUNC = re.compile(r'^(\w+)\(\)$')
# A definition starts at column 0 with a return type and the name, and its
# parameter list is followed by "{" (possibly lines later); a ";" first means
# a declaration.
DEF_START = re.compile(r'^(?!typedef\b|#|return\b|if\b|while\b|for\b|switch\b|else\b)'
                       r'[A-Za-z_][\w \t*]*?\b(\w+)\s*\(')


def sections(doc):
    """{title: [(file, [functions])]} for the two walk sections."""
    out, title, steps = {}, None, []
    for line in doc.splitlines():
        if line.startswith('## '):
            title = line[3:].strip() if line[3:].strip() in SECTIONS else None
            if title:
                out[title] = []
                steps.append((title, []))
            continue
        if title is None:
            continue
        if STEP.match(line):
            steps[-1][1].append(line)
        elif line.startswith((' ', '\t')) and line.strip() and steps[-1][1]:
            steps[-1][1][-1] += ' ' + line.strip()    # a step wrapped over lines
    for title, lines in steps:
        for step in lines:
            walk(out[title], step)
    return out


def walk(steps, line):
    """Append the files and functions one numbered step names."""
    current = None
    for token in TICK.findall(line):
        token = token.strip()
        if FILE.match(token):
            current = token
            steps.append((current, []))
        elif (m := FUNC.match(token)) and current is not None:
            steps[-1][1].append(m.group(1))


def definitions(text):
    """{name: (first line, lines, parameters)} of the functions defined in a C file."""
    lines = text.split('\n')
    out, i = {}, 0
    while i < len(lines):
        m = DEF_START.match(lines[i])
        if not m:
            i += 1
            continue
        sig, j = lines[i], i
        while '{' not in lines[j] and ';' not in lines[j] and j + 1 < len(lines):
            j += 1
            sig += ' ' + lines[j]
        head = sig.split('{')[0]
        if ';' in head or ')' not in head:
            i = j + 1
            continue
        k = j
        while k < len(lines) and lines[k].rstrip() != '}':
            k += 1
        params = head[head.index('(') + 1: head.rindex(')')].strip()
        depth, count = 0, (0 if params in ('', 'void') else 1)
        for ch in params:
            depth += ch == '('
            depth -= ch == ')'
            count += ch == ',' and depth == 0
        out[m.group(1)] = (i + 1, k - i + 1, count)
        i = k + 1
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else '.'
    doc_path = os.path.join(root, 'docs', 'ARCHITECTURE.md')
    with open(doc_path) as f:
        walks = sections(f.read())
    problems, named, files = [], 0, {}
    for title in SECTIONS:
        steps = walks.get(title)
        if not steps:
            problems.append(f'docs/ARCHITECTURE.md has no "## {title}" section with numbered steps')
            continue
        for path, funcs in steps:
            full = os.path.join(root, 'daemon', path)
            if not os.path.isfile(full):
                problems.append(f'{title}: daemon/{path} does not exist')
                continue
            if path not in files:
                with open(full, errors='replace') as f:
                    files[path] = definitions(f.read())
            for fn in funcs:
                named += 1
                d = files[path].get(fn)
                if d is None:
                    problems.append(f'{title}: {fn}() is not defined in daemon/{path}')
                elif d[2] > MAX_PARAMS:
                    problems.append(f'{title}: daemon/{path}:{d[0]} {fn}() takes {d[2]} parameters '
                                    f'(more than {MAX_PARAMS}: pass a request struct)')
    for path, defs in sorted(files.items()):
        for fn, (line, n, _) in sorted(defs.items(), key=lambda kv: kv[1][0]):
            if n > MAX_LINES:
                problems.append(f'daemon/{path}:{line} {fn}() is {n} lines (more than {MAX_LINES}); '
                                f'the file is on the request path: split it into named steps')
    for p in problems:
        print('request-path:', p, file=sys.stderr)
    if problems:
        return 1
    print(f'request-path: {named} steps named in {len(files)} files, all defined; '
          f'every function of those files within {MAX_LINES} lines')
    return 0


if __name__ == '__main__':
    sys.exit(main())
