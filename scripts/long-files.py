#!/usr/bin/env python3
"""Source files of more than MAX_LINES lines (their tests left out), and
whether each says why at its top.

usage: scripts/long-files.py [--check] [CRATE_SRC ...]
       (default: tracer/src tracer-ebpf/src xtask/src)

A file may run past MAX_LINES lines before its `#[cfg(test)]` module only
with a reason in its module doc: a `//! Long:` line (one concern that
does not split without scattering it, or the seam that will split it).
Files named *tests*.rs are tests and not counted. Prints every long file,
its length and its reason; with --check, exits 1 when one has none
(issue 46).
"""
import os
import re
import sys

MAX_LINES = 500


def long_files(root):
    for directory, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            if not name.endswith(".rs") or "tests" in name:
                continue
            path = os.path.join(directory, name)
            lines = open(path, encoding="utf-8").read().split("\n")
            end = next((i for i, line in enumerate(lines) if line.startswith("#[cfg(test)]")), len(lines))
            if end > MAX_LINES:
                reason = next((m.group(1) for line in lines if (m := re.match(r"//!\s*Long:\s*(.+)", line))), None)
                yield path, end, reason


def main():
    args = sys.argv[1:]
    check = "--check" in args
    roots = [a for a in args if a != "--check"] or ["tracer/src", "tracer-ebpf/src", "xtask/src"]
    missing = 0
    for root in roots:
        for path, count, reason in long_files(root):
            if reason:
                if not check:
                    print(f"{path}: {count} lines: {reason}")
            else:
                missing += 1
                print(f"{path}: {count} lines, and no `//! Long:` reason")
    print(f"long files without a reason: {missing}")
    if check and missing:
        sys.exit(1)


if __name__ == "__main__":
    main()
