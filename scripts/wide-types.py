#!/usr/bin/env python3
"""Structs of more than MAX_FIELDS fields, and whether each says why.

usage: scripts/wide-types.py [--check] [CRATE_SRC ...]
       (default: tracer/src tracer-ebpf/src xtask/src)

A struct may hold more than MAX_FIELDS fields only with a reason written
at its definition: a doc-comment line starting `Wide:` (a serialized
form whose fields are its keys, a layout the kernel or CPython fixes, one
field per command-line flag). Prints every wide struct, its field count
and its reason; with --check, exits 1 when one has none (issue 46).
"""
import os
import re
import sys

MAX_FIELDS = 10
STRUCT = re.compile(
    r"((?:^[ \t]*(?:///|#\[)[^\n]*\n)*)^[ \t]*(?:pub(?:\([^)]*\))?\s+)?struct\s+(\w+)[^;{(]*\{",
    re.M,
)


def wide_structs(root):
    for directory, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(directory, name)
            src = open(path, encoding="utf-8").read()
            for m in STRUCT.finditer(src):
                depth, j = 1, m.end()
                while depth:
                    depth += {"{": 1, "}": -1}.get(src[j], 0)
                    j += 1
                body = re.sub(r"//[^\n]*", "", src[m.end() : j - 1])
                fields = re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?\w+\s*:(?!:)", body, re.M)
                if len(fields) > MAX_FIELDS:
                    reason = re.search(r"^[ \t]*///\s*Wide:\s*(.+)$", m.group(1), re.M)
                    yield path, m.group(2), len(fields), reason and reason.group(1).strip()


def main():
    args = sys.argv[1:]
    check = "--check" in args
    roots = [a for a in args if a != "--check"] or ["tracer/src", "tracer-ebpf/src", "xtask/src"]
    missing = 0
    for root in roots:
        for path, name, count, reason in wide_structs(root):
            if reason:
                if not check:
                    print(f"{path}: {name}: {count} fields: {reason}")
            else:
                missing += 1
                print(f"{path}: {name}: {count} fields, and no `Wide:` reason")
    print(f"wide types without a reason: {missing}")
    if check and missing:
        sys.exit(1)


if __name__ == "__main__":
    main()
