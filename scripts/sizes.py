#!/usr/bin/env python3
"""Wide structs and long files, and whether each says why.

usage: scripts/sizes.py [--check] [CRATE_SRC ...]
       (default: tracer/src tracer-ebpf/src xtask/src)

A struct may hold more than MAX_FIELDS fields only with a reason written
at its definition: a doc-comment line starting `Wide:` (a serialized
form whose fields are its keys, a layout the kernel or CPython fixes, one
field per command-line flag). A file may run past MAX_LINES lines before
its `#[cfg(test)]` module only with a reason in its module doc: a
`//! Long:` line (one concern that does not split without scattering it,
or the seam that will split it); files named *tests*.rs are tests and not
counted. Prints every wide struct and long file, its size and its reason;
with --check, exits 1 when one has none (issue 46).
"""
import os
import re
import sys

MAX_FIELDS = 10
MAX_LINES = 500
STRUCT = re.compile(
    r"((?:^[ \t]*(?:///|#\[)[^\n]*\n)*)^[ \t]*(?:pub(?:\([^)]*\))?\s+)?struct\s+(\w+)[^;{(]*\{",
    re.M,
)


def sources(root):
    for directory, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            if name.endswith(".rs"):
                path = os.path.join(directory, name)
                yield path, name, open(path, encoding="utf-8").read()


def wide_structs(root):
    """(place, size, reason) of each struct of more than MAX_FIELDS fields."""
    for path, _, src in sources(root):
        for m in STRUCT.finditer(src):
            depth, j = 1, m.end()
            while depth:
                depth += {"{": 1, "}": -1}.get(src[j], 0)
                j += 1
            body = re.sub(r"//[^\n]*", "", src[m.end() : j - 1])
            fields = re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?\w+\s*:(?!:)", body, re.M)
            if len(fields) > MAX_FIELDS:
                reason = re.search(r"^[ \t]*///\s*Wide:\s*(.+)$", m.group(1), re.M)
                yield f"{path}: {m.group(2)}", f"{len(fields)} fields", reason and reason.group(1).strip()


def long_files(root):
    """(place, size, reason) of each file of more than MAX_LINES lines."""
    for path, name, src in sources(root):
        if "tests" in name:
            continue
        lines = src.split("\n")
        end = next((i for i, line in enumerate(lines) if line.startswith("#[cfg(test)]")), len(lines))
        if end > MAX_LINES:
            reason = next((m.group(1) for line in lines if (m := re.match(r"//!\s*Long:\s*(.+)", line))), None)
            yield path, f"{end} lines", reason


def main():
    args = sys.argv[1:]
    check = "--check" in args
    roots = [a for a in args if a != "--check"] or ["tracer/src", "tracer-ebpf/src", "xtask/src"]
    failed = False
    for what, marker, find in [
        ("wide types", "`Wide:`", wide_structs),
        ("long files", "`//! Long:`", long_files),
    ]:
        missing = 0
        for root in roots:
            for place, size, reason in find(root):
                if reason:
                    if not check:
                        print(f"{place}: {size}: {reason}")
                else:
                    missing += 1
                    print(f"{place}: {size}, and no {marker} reason")
        print(f"{what} without a reason: {missing}")
        failed |= missing > 0
    if check and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
