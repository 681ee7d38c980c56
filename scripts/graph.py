# SPDX-License-Identifier: Apache-2.0
"""graph — the C sources' dependency graph, and its circles.

    python3 scripts/graph.py [--calls BUILD_DIR] [--files] [ROOT]

Without --calls, an arrow A -> B means A has `#include "B"` (resolved by
basename among the tree's .c/.h files; <...> includes are the system's).
With --calls BUILD_DIR, an arrow A -> B also means that A's object file
(under BUILD_DIR, as CMake names it) uses a symbol that B's defines (nm):
the link-level ties that includes do not show, such as a front calling
the constructors its backends define.

It prints the arrows between folders (or files, with --files), then every
circle: a set of files that reach one another (Tarjan's strongly connected
components), with the arrows inside it. Exit 0; the graph is a report, not a
check.
"""
import argparse
import collections
import os
import re
import subprocess
import sys

DIRS = ("src", "agents", "tools", "tests", "bench", "python")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    out = []
    for top in DIRS:
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith((".c", ".h")):
                    out.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(out)


def include_arrows(root, files):
    by_name = collections.defaultdict(list)
    for f in files:
        by_name[os.path.basename(f)].append(f)
    arrows = set()
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            for inc in INCLUDE.findall(fh.read()):
                cands = by_name.get(os.path.basename(inc), [])
                # the one beside f first, else the one under src/, else any
                cands = sorted(cands, key=lambda c: (os.path.dirname(c) != os.path.dirname(f),
                                                     not c.startswith("src/"), c))
                if cands and cands[0] != f:
                    arrows.add((f, cands[0]))
    return arrows


def nm(obj):
    r = subprocess.run(["nm", "--defined-only", "-g", obj], capture_output=True, text=True)
    defined = {l.split()[-1] for l in r.stdout.splitlines() if len(l.split()) == 3}
    r = subprocess.run(["nm", "-u", obj], capture_output=True, text=True)
    used = {l.split()[-1] for l in r.stdout.splitlines() if l.split()}
    return defined, used


def call_arrows(root, build, files):
    objs = {}
    for d, _, names in os.walk(os.path.join(build, "CMakeFiles")):
        for n in names:
            if n.endswith(".c.o"):
                p = os.path.join(d, n)
                # CMakeFiles/<target>.dir/<source path>.o
                rel = p.split(".dir" + os.sep, 1)[-1][:-2]
                if rel in files and rel not in objs:
                    objs[rel] = p
    if not objs:
        sys.exit(f"graph: no object files of the tree under {build}/CMakeFiles (build it first)")
    owner = {}
    table = {f: nm(o) for f, o in objs.items()}
    for f, (defined, _) in table.items():
        for s in defined:
            owner.setdefault(s, f)
    arrows = set()
    for f, (_, used) in table.items():
        for s in used:
            g = owner.get(s)
            if g and g != f:
                arrows.add((f, g))
    return arrows


def unit(f):
    """A .c and its .h are one room: arrows between them are not circles."""
    return f[:-2] if f.endswith((".c", ".h")) else f


def circles(arrows):
    graph = collections.defaultdict(set)
    for a, b in arrows:
        if unit(a) != unit(b):
            graph[unit(a)].add(unit(b))
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):  # iterative Tarjan
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(list(graph)):
        if v not in index:
            strong(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=".")
    ap.add_argument("--calls", metavar="BUILD_DIR", help="add link-level arrows from BUILD_DIR's objects")
    ap.add_argument("--files", action="store_true", help="arrows between files, not folders")
    a = ap.parse_args()
    files = sources(a.root)
    arrows = include_arrows(a.root, files)
    if a.calls:
        arrows |= call_arrows(a.root, a.calls, set(files))
    # tests, benches and python are users, not parts: only their own circles count
    lib = {(x, y) for x, y in arrows
           if not x.startswith(("tests/", "bench/", "python/")) or x.split("/")[1:2] == y.split("/")[1:2]}
    key = (lambda f: f) if a.files else os.path.dirname
    summary = collections.Counter((key(x), key(y)) for x, y in lib if key(x) != key(y))
    print(f"arrows ({'files' if a.files else 'folders'}; count of file arrows):")
    for (x, y), n in sorted(summary.items()):
        print(f"  {x} -> {y}  {n}")
    cs = circles(lib)
    print(f"circles: {len(cs)}")
    for c in cs:
        members = set(c)
        inside = sorted((x, y) for x, y in lib if unit(x) in members and unit(y) in members
                        and unit(x) != unit(y))
        print(f"  {len(c)} files: " + " ".join(c))
        for x, y in inside:
            print(f"    {x} -> {y}")


if __name__ == "__main__":
    main()
