#!/usr/bin/env python3
"""Include cycles in daemon/ and lib/: between modules, and between folders.

A module is a .c/.h pair (daemon/net/ops.c + daemon/net/ops.h); a private header
named <module>_impl.h, _internal.h or _private.h belongs to its module. There
is an edge x -> y when a file of x includes "y.h". Every strongly connected
component of more than one module is a cycle; it is printed and the exit
status is 1. Header-only cycles (x.h includes y.h includes x.h) are checked
the same way.

Folders too: every folder of daemon/ and lib/ is a node (daemon/persist/kvs is
one of its own; the files directly in daemon/, the top level, are the node
"daemon"), with an edge X -> Y when a file of X includes a header of Y. The
folders are layered so that every include points down (docs/ARCHITECTURE.md,
"Layout of the tree"); a cycle between folders, or between a folder and the
top level, is printed with a few of the includes that make each of its edges,
and the exit status is 1 as well.

    scripts/include-cycles.py [ROOT]      (ROOT: the tree, default .)
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
PRIVATE = ('_impl', '_internal', '_private')


def read_tree(root):
    files = {}
    for top in ('daemon', 'lib'):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if name.endswith(('.c', '.h')):
                    path = os.path.relpath(os.path.join(dirpath, name), root)
                    with open(os.path.join(root, path), errors='replace') as f:
                        files[path] = [m.group(1) for line in f if (m := INCLUDE.match(line))]
    return files


def resolve(files, src, name):
    """Where `#include "name"` in src points: its own folder first, then -Ilib -Idaemon."""
    for base in (os.path.dirname(src), 'lib', 'daemon'):
        path = os.path.normpath(os.path.join(base, name))
        if path in files:
            return path
    return None  # a generated or system header


def module(path):
    stem = os.path.splitext(path)[0]
    for suffix in PRIVATE:
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def graph(files, headers_only):
    g = {}
    for path, includes in files.items():
        if headers_only and not path.endswith('.h'):
            continue
        src = path if headers_only else module(path)
        g.setdefault(src, set())
        for name in includes:
            target = resolve(files, path, name)
            if target is None:
                continue
            dst = target if headers_only else module(target)
            g.setdefault(dst, set())
            if dst != src:
                g[src].add(dst)
    return g


def folder_graph(files):
    """Folder -> {folder: [example "file -> header" includes]}."""
    g = {}
    for path, includes in files.items():
        src = os.path.dirname(path)
        g.setdefault(src, {})
        for name in includes:
            target = resolve(files, path, name)
            if target is None:
                continue
            dst = os.path.dirname(target)
            g.setdefault(dst, {})
            if dst != src:
                g[src].setdefault(dst, []).append(f'{path} includes {target}')
    return g


def folder_name(folder):
    return folder + '/ (top level)' if folder == 'daemon' else folder + '/'


def cycles(g):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else '.'
    files = read_tree(root)
    found = 0
    for title, headers_only in (('headers', True), ('modules', False)):
        g = graph(files, headers_only)
        cs = cycles(g)
        print(f'{title}: {len(g)} nodes, {sum(len(e) for e in g.values())} edges, {len(cs)} cycle(s)')
        for comp in cs:
            edges = [f'{a} -> {b}' for a in comp for b in sorted(g[a]) if b in comp]
            print('  cycle:', ', '.join(edges))
        found += len(cs)
    fg = folder_graph(files)
    cs = cycles({f: set(to) for f, to in fg.items()})
    print(f'folders: {len(fg)} nodes, {sum(len(e) for e in fg.values())} edges, {len(cs)} cycle(s)')
    for comp in cs:
        print('  cycle between folders:', ', '.join(folder_name(f) for f in comp))
        for a in comp:
            for b in sorted(fg[a]):
                if b not in comp:
                    continue
                ex = sorted(fg[a][b])
                more = f' (and {len(ex) - 3} more)' if len(ex) > 3 else ''
                print(f'    {folder_name(a)} -> {folder_name(b)}: {"; ".join(ex[:3])}{more}')
    found += len(cs)
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
