#!/usr/bin/env python3
"""Where a run's configuration goes: the modules `record::run`'s `config`
passes through, in the order control takes it there.

usage: scripts/config-flow.py [--check N] [--calls] [CRATE_SRC]
       (default CRATE_SRC: tracer/src; --calls also prints each call
       that passes the config on, indented by depth; --check N exits 1
       when the config goes back up to a higher layer more than N times)

The config types are the structs of CRATE_SRC/config/*.rs whose name ends
in `Config` (RecordConfig, Config, ...). A function holds the config
through each parameter whose type names one. A call passes it on when an
argument (less `&`, `mut`, `*`, `.clone()`) is such a parameter or a field
path from it whose type is again a config type (`&config.trace`, where
RecordConfig.trace: Config); plain fields (`config.top`, `&config.wrappers`)
are values, not the config, and are not followed. Neither are locals bound
to the config (`let trace = &config.trace;`), closures or trait objects
that capture it, nor `self` fields holding it.

Callees: `a::b::f(` is resolved like rustc would, roughly: `crate::`,
`super::`, `self::`, the file's `use` items (and a module's `pub use`
re-exports), a child module, then the caller's own module. `Type::f(`,
`self.f(` and `x.f(` are resolved by name among the functions that take a
config parameter (narrowed to `impl Type` / the caller's own impl where
that leaves any); a name with several candidates follows all of them and is
reported on stderr. A callee that takes no config parameter is skipped and
reported. Files named *tests*.rs and `#[cfg(test)]` items are skipped.

From `record::run` the calls are followed depth first, in source order,
each function once per call path (a function already on the path is not
entered again). A call from module A into a function of module B != A is
an entry into B; when it returns, control is back in A (a return). A
module is a file's module path (`attach::spawn`, `session::holders`). A
move, by call or by return, to a module whose top-level module has a higher
RANK (scripts/module-graph.py) than the one it left is a return to a higher
layer (so `session -> record` counts); moves inside one top-level module
never do. A re-entry is an entry into a module the config had left before.
"""
import argparse
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("module_graph", os.path.join(HERE, "module-graph.py"))
module_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(module_graph)
expand, module_of = module_graph.expand, module_graph.module_of
RANKS = module_graph.RANKS["tracer/src"]
LITERAL = re.compile(r"""//[^\n]*|/\*.*?\*/|(?<!\w)b?r(#*)".*?"\1|"(?:\\.|[^"\\])*"|'(?:\\.[^']*|[^\\'])'""", re.S)
KEYWORDS = {"if", "while", "match", "for", "return", "loop", "in", "as", "fn", "let", "move", "else"}


def blank(src):
    """Comments out, string and char literals emptied (offsets and lines kept)."""
    def sub(m):
        inner = re.sub(r"[^\n]", " ", m.group()[1:-1])
        return " " + inner + " " if m.group().startswith("/") else m.group()[0] + inner + m.group()[-1]
    return LITERAL.sub(sub, src)


def close(src, i):
    """Index of the bracket closing the one at src[i]."""
    pair = {"(": ")", "{": "}", "[": "]"}[src[i]]
    depth = 0
    for j in range(i, len(src)):
        depth += (src[j] == src[i]) - (src[j] == pair)
        if depth == 0:
            return j
    return len(src) - 1


def split_top(text, opening="([{", closing=")]}"):
    """`a, f(b, c)` -> [a, f(b, c)]; a parameter list passes `<` and `>` too."""
    parts, depth, cur = [], 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            depth += (ch in opening) - (ch in closing)
            cur += ch
    return [p for p in parts if p]


def drop_tests(src):
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]", src))):
        j = m.end()
        semi, brace = src.find(";", j), src.find("{", j)
        end = semi if brace < 0 or 0 <= semi < brace else close(src, brace)
        src = src[: m.start()] + re.sub(r"[^\n]", " ", src[m.start() : end + 1]) + src[end + 1 :]
    return src


class Fn:
    """A function: its module, name, `impl` type (None when free), config
    parameters (name -> config type), body, the line of its `{`, its file."""

    def __init__(self, *fields):
        self.mod, self.name, self.impl, self.held, self.body, self.line, self.path = fields

    def __repr__(self):
        return "::".join(self.mod + ((self.impl,) if self.impl else ()) + (self.name,))


def parse(root, parts=False):
    files, fns, uses, ctypes = [], [], {}, {}
    for d, _, names in sorted(os.walk(root)):
        for n in sorted(names):
            if n.endswith(".rs") and "tests" not in n:
                p = os.path.join(d, n)
                files.append((module_of(root, p), p, drop_tests(blank(open(p, encoding="utf-8").read()))))
    for mod, _, src in files:
        if mod[:1] == ("config",):
            pattern = r"\b(?:struct|enum)\s+(\w+)\b[^{;]*\{" if parts else r"\bstruct\s+(\w*Config)\b[^{;]*\{"
            for m in re.finditer(pattern, src):
                fields = src[m.end() : close(src, m.end() - 1)]
                ctypes[m.group(1)] = dict(re.findall(r"(\w+)\s*:\s*([^,]+)", fields))
    for mod, path, src in files:
        uses.setdefault(mod, {})
        for m in re.finditer(r"\buse\s+([^;]+);", src):
            for p in expand(re.sub(r"\s+as\s+", "@", m.group(1))):
                p, _, alias = p.partition("@")
                parts = p.split("::")
                if parts[-1] == "self":
                    parts = parts[:-1]
                if parts and parts[-1] != "*" and alias != "_":
                    uses[mod][alias or parts[-1]] = parts
        impls = [(m.start(), close(src, m.end() - 1), re.findall(r"(\w+)\s*(?:<[^{]*)?$", m.group(2))[-1])
                 for m in re.finditer(r"(?m)^\s*(?:unsafe\s+)?impl\b(<[^{]*?>)?\s*([^{;]+)\{", src)]
        for m in re.finditer(r"\bfn\s+(\w+)\s*(?:<[^(]*>)?\s*\(", src):
            pend = close(src, m.end() - 1)
            semi, brace = src.find(";", pend), src.find("{", pend)
            if brace < 0 or 0 <= semi < brace:
                continue
            held = {}
            for param in split_top(src[m.end() : pend].replace("->", ""), "(<[{", ")>]}"):
                name, _, ty = param.partition(":")
                found = [t for t in re.findall(r"\w+", ty) if t in ctypes]
                if found:
                    held[name.split()[-1]] = found[-1]
            impl = next((t for s, e, t in impls if s < m.start() < e), None)
            fns.append(Fn(mod, m.group(1), impl, held, src[brace : close(src, brace) + 1],
                          src.count("\n", 0, brace) + 1, path))
    return {mod for mod, _, _ in files}, fns, uses, ctypes


def is_config(arg, held, ctypes):
    arg = re.sub(r"^(&\s*(mut\s+)?|\*)+|\.clone\(\)$", "", arg.strip()).strip()
    m = re.fullmatch(r"(\w+)((?:\s*\.\s*\w+)*)", arg)
    if not m or m.group(1) not in held:
        return False
    ty = held[m.group(1)]
    for field in re.findall(r"\w+", m.group(2)):
        ty = next((t for t in re.findall(r"\w+", ctypes.get(ty, {}).get(field, "")) if t in ctypes), None)
        if ty is None:
            return False
    return True


class Flow:
    def __init__(self, root, parts=False):
        self.mods, self.fns, self.uses, self.ctypes = parse(root, parts)
        self.calls = {}

    def in_module(self, mod, name, seen=()):
        """Free functions `name` of module `mod`, through its `use` items."""
        own = [f for f in self.fns if f.mod == mod and f.name == name and f.impl is None]
        if own or (mod, name) in seen or name not in self.uses.get(mod, {}):
            return own
        return self.by_path(mod, self.uses[mod][name], seen + ((mod, name),))

    def by_path(self, mod, parts, seen=()):
        parts = list(parts)
        if parts[0] == "crate":
            base, parts = (), parts[1:]
        elif parts[0] in ("super", "self"):
            base = mod
            while parts and parts[0] in ("super", "self"):
                base, parts = (base[:-1] if parts[0] == "super" else base), parts[1:]
        elif len(parts) > 1 and parts[0] in self.uses.get(mod, {}):
            return self.by_path(mod, self.uses[mod][parts[0]] + parts[1:], seen)
        elif len(parts) > 1 and mod + (parts[0],) in self.mods:
            base = mod
        elif len(parts) == 1:
            return self.in_module(mod, parts[0], seen)
        else:
            base = ()
        full = base + tuple(parts)
        for k in range(len(full) - 1, -1, -1):
            if full[:k] in self.mods:
                rest = full[k:]
                if len(rest) == 1:
                    return self.in_module(full[:k], rest[0], seen)
                if len(rest) == 2:
                    return self.methods(rest[1], rest[0])
                return []
        return []

    def methods(self, name, impl=None):
        cands = [f for f in self.fns if f.name == name and f.impl and f.held]
        narrowed = [f for f in cands if f.impl == impl]
        return narrowed or cands

    def calls_of(self, fn):
        if id(fn) in self.calls:
            return self.calls[id(fn)]
        out, body = [], fn.body
        for m in re.finditer(r"(\.\s*)?((?:\w+\s*::\s*)*\w+)\s*(?:::\s*<[^()]*>\s*)?\(", body):
            args = split_top(body[m.end() : close(body, m.end() - 1)])
            if not fn.held or not any(is_config(a, fn.held, self.ctypes) for a in args):
                continue
            parts = re.findall(r"\w+", m.group(2))
            if parts[-1] in KEYWORDS:
                continue
            if m.group(1):
                recv = re.search(r"(\w+)\s*$", body[: m.start()])
                cands = self.methods(parts[-1], fn.impl if recv and recv.group(1) == "self" else None)
            elif parts[0] == "Self":
                cands = self.methods(parts[-1], fn.impl)
            else:
                cands = self.by_path(fn.mod, parts)
            where = f"{fn.path}:{fn.line + body.count(chr(10), 0, m.start())}"
            say = lambda why: print(f"config-flow: {where}: {m.group(2)}(...) {why}", file=sys.stderr)
            if not cands or not all(c.held for c in cands):
                say(f"passes the config to {', '.join(map(repr, cands)) or 'nothing known'} "
                    "(no config parameter)")
            cands = [c for c in cands if c.held]
            if len(cands) > 1:
                say(f"is ambiguous: {', '.join(map(repr, cands))}")
            out.extend((c, where) for c in cands)
        self.calls[id(fn)] = out
        return out

    def walk(self, start):
        path, log, left, stack = [start.mod], [], set(), [start]
        counts = {"entries": 0, "returns to a higher layer": 0, "re-entries": 0}

        def move(to, entry):
            rank = lambda m: RANKS.get(m[0] if m else "", -1)
            if rank(to) > rank(path[-1]) and to[:1] != path[-1][:1]:
                counts["returns to a higher layer"] += 1
            left.add(path[-1])
            if entry:
                counts["entries"] += 1
                counts["re-entries"] += to in left
            path.append(to)

        def visit(fn):
            for callee, where in self.calls_of(fn):
                if callee in stack or len(path) > 100000:
                    continue
                log.append(f"{'  ' * len(stack)}{callee!r}  ({where})")
                if callee.mod != fn.mod:
                    move(callee.mod, True)
                stack.append(callee)
                visit(callee)
                stack.pop()
                if path[-1] != fn.mod:
                    move(fn.mod, False)

        visit(start)
        return path, log, counts


def main():
    parser = argparse.ArgumentParser(description="Where record::run's config goes.")
    parser.add_argument("root", nargs="?", default="tracer/src")
    parser.add_argument("--check", type=int, metavar="N", help="exit 1 past N returns to a higher layer")
    parser.add_argument("--calls", action="store_true", help="print each call passing the config on")
    parser.add_argument("--parts", action="store_true",
                        help="follow the config's parts too: every struct and enum of config/ (Schedule, Probing, Show, Sampling, Targets...)")
    args = parser.parse_args()
    flow = Flow(args.root, args.parts)
    start = next(f for f in flow.fns if f.mod == ("record",) and f.name == "run" and not f.impl)
    path, log, counts = flow.walk(start)
    if args.calls:
        print(repr(start), *log, sep="\n")
    print(" -> ".join("::".join(m) or "crate" for m in path))
    print(f"modules: {len(set(path))} (distinct, the start included)")
    print("\n".join(f"{key}: {value}" for key, value in counts.items()))
    if args.check is not None and counts["returns to a higher layer"] > args.check:
        sys.exit(f"config-flow: more than {args.check} returns to a higher layer")


if __name__ == "__main__":
    main()
