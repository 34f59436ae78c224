#!/usr/bin/env python3
"""The layers hold: no file of src/worker calls a function of a file that
calls back into it, directly or around a circle, and no module of
python/unisum imports one that imports it back (issue 48).

C: a function defined without `static` in one .c file of a folder and
named (called, or taken by address) in another is an edge from the second
file to the first; comments and strings are left out.  The connection
layer's calls up go through a table of pointers (w->up) that worker.c
fills, so they are no edge: that is the point of the table.

src/worker is held to more: the order worker_int.h lists its files in,
lowest first; a file may call only files earlier in it.  Before that list
come the local path and tune.c, after it api.c (worker_int.h says so).

Python: every import of a unisum module, at the top or inside a function,
is an edge (an import inside `if TYPE_CHECKING:` is for the type checker
only, and is none).  `from unisum.torch import _core` imports the module
_core; `from unisum.torch import push_pull` the package's __init__.

src/server and src/rendezvous are held to having no circle too.  Exits 1
naming each circle and the calls or imports that close it.  The other
folders of src/ are printed, and not yet held to it.
"""

import ast
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELD = ["src/worker", "src/server", "src/rendezvous"]


def _strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


def c_edges(folder):
    """{file: {file it calls: [functions]}} among the .c files of folder."""
    files = sorted(glob.glob(os.path.join(ROOT, folder, "*.c")))
    text = {os.path.basename(f): _strip(open(f).read()) for f in files}
    defined = {}
    for name, body in text.items():
        for m in re.finditer(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b(\w+)\s*\([^;{]*\)\s*\{", body,
                             re.M):
            defined.setdefault(m.group(1), name)
    edges = {}
    for name, body in text.items():
        words = set(re.findall(r"\b\w+\b", body))
        for fn in words & set(defined):
            if defined[fn] != name:
                edges.setdefault(name, {}).setdefault(defined[fn], []).append(fn)
    return edges


# What worker_int.h's list leaves out: the local path and autotune's
# search first, the C API last.
_WORKER_FIRST = ["local_arena.c", "local_wait.c", "local_reduce.c", "local.c", "tune.c"]
_WORKER_LAST = ["api.c"]


def worker_order():
    """src/worker's files, lowest first, as worker_int.h lists them."""
    text = open(os.path.join(ROOT, "src", "worker", "worker_int.h")).read()
    m = re.search(r"lowest first:.*?\n \*\n((?: \*   [^\n]*\n)+)", text, re.S)
    if m is None:
        return None
    listed = re.findall(r"(\w+\.c)", m.group(1))
    return _WORKER_FIRST + listed + _WORKER_LAST


def order_breaks(edges, order):
    """Each call of a file to one that comes later in `order`, and each
    file of the folder that `order` leaves out."""
    out = []
    files = set(edges) | {b for a in edges for b in edges[a]}
    for f in sorted(files - set(order)):
        out.append("%s is in no layer of worker_int.h's list" % f)
    for a in sorted(edges):
        for b, via in sorted(edges[a].items()):
            if a in order and b in order and order.index(b) > order.index(a):
                out.append("%s calls %s, a later layer: %s" % (a, b, ", ".join(sorted(set(via)))))
    return out


def _module_of(path):
    rel = os.path.relpath(path, os.path.join(ROOT, "python"))[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _type_checking_only(tree):
    """The import nodes inside `if TYPE_CHECKING:` blocks."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for inner in node.body:
                skip.update(id(n) for n in ast.walk(inner))
    return skip


def py_edges():
    """{module: {module it imports: [line numbers]}} within unisum."""
    paths = sorted(glob.glob(os.path.join(ROOT, "python", "unisum", "**", "*.py"), recursive=True))
    modules = {_module_of(p): p for p in paths}
    edges = {}
    for mod, path in modules.items():
        tree = ast.parse(open(path).read(), path)
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                sub = [node.module + "." + a.name for a in node.names]
                targets = [t for t in sub if t in modules] or [node.module]
            for t in targets:
                if t in modules and t != mod:
                    edges.setdefault(mod, {}).setdefault(t, []).append(str(node.lineno))
    return edges


def circles(edges):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    nodes = set(edges) | {b for a in edges for b in edges[a]}

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def report(title, edges, held):
    found = circles(edges)
    for comp in found:
        print("%s %s: a circle of %d: %s" % ("FAIL" if held else "note", title, len(comp),
                                           ", ".join(comp)))
        for a in comp:
            for b, via in sorted(edges.get(a, {}).items()):
                if b in comp:
                    print("    %s -> %s: %s" % (a, b, ", ".join(sorted(set(via)))))
    return len(found) if held else 0


def main():
    bad = 0
    folders = sorted(os.path.relpath(d, ROOT) for d in glob.glob(os.path.join(ROOT, "src", "*"))
                     if os.path.isdir(d))
    for folder in folders:
        bad += report(folder, c_edges(folder), folder in HELD)
    order = worker_order()
    if order is None:
        print("FAIL src/worker: worker_int.h's list of layers is not found")
        bad += 1
    else:
        breaks = order_breaks(c_edges("src/worker"), order)
        for b in breaks:
            print("FAIL src/worker: " + b)
        bad += len(breaks)
    bad += report("python/unisum", py_edges(), True)
    print("%d circles or calls out of order where the layers are held (%s, python/unisum)"
          % (bad, ", ".join(HELD)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
