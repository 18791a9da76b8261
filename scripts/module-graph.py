#!/usr/bin/env python3
"""The file graph of a crate's `use crate::` / `use super::` lines (and
inline `crate::a::b` paths), and its circles.

usage: scripts/module-graph.py [--check] [CRATE_SRC ...]
       (--check: print only circles, layer failures and the count)
       (default: tracer/src tracer-ebpf/src xtask/src)

A node is a file's module path (`attach::forks`, `cli`). An edge a -> b
means a names b; a path into a module's child counts as the child when that
child is a file, else as the module. A child naming its own parent (a
`mod.rs` re-export) and a parent naming its children are the tree itself
and are not edges. Prints the edges between top-level modules, the
file-level edges inside each module, and every circle (strongly connected
set of two or more).

The layers (`cargo xtask lint` runs this script): in tracer/src a
top-level module may only name modules of a lower or equal RANK, `output`
is named only by the verbs, and in tracer-ebpf/src a program module names
no other program module (but `exits`, the one dispatcher that clears
every family's maps). ALLOWED lists today's exceptions, each to be
removed by the house redesign (issue 46): an edge against the layers
that is not in it fails, and so does an entry of it that no longer
occurs, so the list only shrinks. Exits 1 on a circle or either failure.
"""
import os
import re
import sys


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def expand(text):
    """`a::{b, c::{d}}` -> [a::b, a::c::d]."""
    text = re.sub(r"\s+", "", text)
    out = []

    def rec(prefix, s):
        i = s.find("{")
        if i < 0:
            out.append(prefix + s)
            return
        depth, j = 0, i
        while j < len(s):
            if s[j] == "{":
                depth += 1
            elif s[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        head, inner = s[:i], s[i + 1 : j]
        parts, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        parts.append(cur)
        for p in parts:
            if p:
                rec(prefix + head, p)

    rec("", text)
    return out


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return "\n".join(re.sub(r"//.*", "", line) for line in src.splitlines())


def paths_in(src):
    src = strip_comments(src)
    for m in re.finditer(r"\buse\s+([^;]+);", src):
        for p in expand(m.group(1)):
            yield re.sub(r"\bas\w+$", "", p) if "::" in p else p
    for m in re.finditer(r"(?<![\w:])((?:crate|super)(?:::\w+)+)", src):
        yield m.group(1)


def graph(root):
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(d, n)
                files[module_of(root, p)] = p
    mods = set(files)
    edges = set()
    for mod, path in files.items():
        src = open(path, encoding="utf-8").read()
        for p in paths_in(src):
            parts = p.split("::")
            if parts[0] not in ("crate", "super"):
                continue
            if parts[0] == "crate":
                base = ()
            else:
                base = mod
                while parts and parts[0] == "super":
                    base = base[:-1]
                    parts = parts[1:]
                parts = ["crate"] + parts
            full = base + tuple(x for x in parts[1:] if x != "self")
            # the longest prefix that is a file
            target = None
            for k in range(len(full), 0, -1):
                if full[:k] in mods:
                    target = full[:k]
                    break
            if target is None or target == mod:
                continue
            # the tree itself: parent <-> child
            if target == mod[: len(target)] or mod == target[: len(mod)]:
                continue
            edges.add((mod, target))
    return mods, edges


def sccs(nodes, edges):
    adj = {n: [] for n in nodes}
    for a, b in edges:
        adj[a].append(b)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
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

    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return out


# tracer/src, top to bottom: a module may name those below it (or beside).
RANKS = {
    "tracer/src": {
        "cli": 100,
        "record": 90, "top": 90, "analyze": 90, "serve": 90,
        "output": 80,
        "session": 70,
        "report": 65,
        "collect": 60,
        "runtimes": 55,
        "attach": 50,
        "unwind": 45,
        "holders": 40,
        "symbolize": 38,
        "debug_files": 36,
        "recording": 30,
        "target_memory": 25,
        "target_files": 22,
        "tracefs": 21,
        "procfs": 20,
        "config": 10,
        "model": 5,
        "error": 0,
    },
}
# Modules only the verbs may name.
ONLY_FROM = {"tracer/src": {"output": {"record", "top", "analyze", "serve"}}}
# tracer-ebpf/src: the modules that hold programs.
PROGRAMS = {
    "tracer-ebpf/src": {
        "exceptions", "exits", "floor", "forks", "gpu", "libraries", "malloc",
        "mappings", "signals", "spawn", "tensors",
    },
}
DISPATCHERS = {"tracer-ebpf/src": {"exits"}}
# Edges against the layers that exist today (a -> b); the redesign removes them.
ALLOWED = {
    "tracer/src": set(),
}


def layer_failures(root, top):
    """Edges of `top` (top-level a -> b) against the layers, and ALLOWED
    entries that no longer occur."""
    key = next((k for k in (RANKS.keys() | PROGRAMS.keys()) if root.rstrip("/").endswith(k)), None)
    if key is None:
        return []
    ranks = RANKS.get(key, {})
    only_from = ONLY_FROM.get(key, {})
    programs = PROGRAMS.get(key, set())
    dispatchers = DISPATCHERS.get(key, set())
    allowed = ALLOWED.get(key, set())
    failures, used = [], set()
    for a, b in top:
        bad = []
        if a in ranks and b in ranks and ranks[b] > ranks[a]:
            bad.append(f"{a} (rank {ranks[a]}) names {b} above it (rank {ranks[b]})")
        if b in only_from and a not in only_from[b]:
            bad.append(f"{a} names {b}, which only {', '.join(sorted(only_from[b]))} may")
        if a in programs and b in programs and a not in dispatchers:
            bad.append(f"program module {a} names program module {b}")
        for unknown in (m for m in (a, b) if ranks and m not in ranks):
            bad.append(f"{unknown} has no rank in RANKS (scripts/module-graph.py)")
        if bad and (a, b) in allowed:
            used.add((a, b))
        elif bad:
            failures.extend(bad)
    failures.extend(
        f"ALLOWED lists {a} -> {b}, which no longer goes against the layers: remove it"
        for a, b in sorted(allowed - used)
    )
    return failures


def name(m):
    return "::".join(m) or "crate"


def main():
    args = sys.argv[1:]
    check = "--check" in args
    args = [arg for arg in args if arg != "--check"]
    roots = args or ["tracer/src", "tracer-ebpf/src", "xtask/src"]
    say = (lambda *_: None) if check else print
    circles = 0
    failures = 0
    for root in roots:
        mods, edges = graph(root)
        say(f"== {root}")
        top = sorted({(a[0], b[0]) for a, b in edges if a and b and a[0] != b[0]})
        say("-- top-level modules (a -> b: a uses b)")
        for a in sorted({a for a, _ in top}):
            say(f"  {a} -> {', '.join(b for x, b in top if x == a)}")
        top_nodes = {m[0] for m in mods if m}
        for c in sccs(top_nodes, set(top)):
            circles += 1
            print("  CIRCLE (top level):", " <-> ".join(c))
        for failure in sorted(set(layer_failures(root, top))):
            failures += 1
            print("  LAYERS:", failure)
        say("-- files inside one module")
        inner = sorted(
            (a, b) for a, b in edges if len(a) > 1 and len(b) > 1 and a[:-1] == b[:-1]
        )
        for a in sorted({a for a, _ in inner}):
            say(f"  {name(a)} -> {', '.join(b[-1] for x, b in inner if x == a)}")
        for c in sccs(mods, edges):
            # a circle between files is reported once, at file level
            circles += 1
            print("  CIRCLE (files):", " <-> ".join(name(m) for m in c))
    print(f"circles: {circles}, layer failures: {failures}")
    sys.exit(1 if circles or failures else 0)


if __name__ == "__main__":
    main()
