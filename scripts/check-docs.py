#!/usr/bin/env python3
"""Checks that no fact of a former README was lost when it moved into
docs/: every sentence of its prose, every list item, table row and code
line must be found (whitespace, line breaks and link targets aside) in
README.md or a page under docs/.

usage: scripts/check-docs.py [REV]

REV is the commit whose README.md is the former one (default 04a307d, the
last with the long README); at a merge, `scripts/check-docs.py main`
checks the rows another branch added to the README. Prints each unit not
found (and every link between the pages whose file or heading is
missing) and exits 1 if there is one, except the units in REWORDED (the
README's own rewritten lines, each with where its fact is now).
"""
import glob
import os
import re
import subprocess
import sys

# Lines of the former README that were rewritten on purpose, with where
# their fact now is.
REWORDED = {
    # Set-up: the demo installs less now; the test set-up the rest.
    "missing first (nightly Rust with rust-src, bpf-linker, tracefs, gcc/g++, bpftool and Go for `go tool pprof` in the tests) and compile the test fixtures:": "README Set-up",
    # Layout: cli no longer holds the configs (tracer/src/config).
    "tracer/ the userspace program, one module per stage: cli (verbs,": "docs/development.md",
    "flags, configs), attach (load the eBPF object, choose": "docs/development.md",
    # "below" was the README's order; now a link to performance.md.
    "scraped every second; see Performance below).": "docs/fleets.md",
    # Issue 39: CPython 3.9 (Debian 11's) is read too.
    "For a target running CPython 3.10, 3.11, 3.12 or 3.13 (a `python3.X` executable with libpython linked in, as Debian's, or a `libpython3.X.so`), every stack names the Python functions that made the allocation, with their file and line (`--python auto`, the default; the attach line says `Python frames on (PID N CPython 3.11.2)` or `no CPython found: native frames only`):": "docs/python.md",
    "`--python on`: an error when the target runs no CPython tracer can read. 3.10, 3.11 and 3.12 use offset tables shipped with tracer; 3.13 reads every offset from the `_Py_DebugOffsets` at the start of `_PyRuntime` (cookie `xdebugpy`).": "docs/python.md",
    "Other versions (3.9 and older, 3.14) are reported once as unknown layouts (native frames as before).": "docs/python.md",
    "Each table is unit-tested against the bytes of a real code object, frame and thread state of its version (`scripts/python-layout-dump.py`), and each line-table decoder against real `co_linetable` bytes.": "docs/python.md",
    # Issue 39: `cargo xtask dist` joined the list; the DaemonSet's image is
    # the dist's Containerfile.
    "`cargo xtask setup` does the installing alone (`--dry-run` shows what it would do), `cargo xtask build` builds `target/release/tracer`, `cargo xtask bench` measures the overhead (see Performance), and `cargo xtask lint` runs clippy and rustfmt.": "README Set-up",
    "image: registry.example.com/tracer:0.1.0 # tracer in a small image": "docs/fleets.md",
    "xtask/ cargo xtask: setup, build, demo, test, bench, soak, lint": "docs/development.md",
}


def normalize(text):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links
    text = text.replace("**", "")
    return re.sub(r"\s+", " ", text).strip()


def units(markdown):
    """(kind, text) for each code line, table row, heading and prose
    sentence."""
    out = []
    in_code = False
    block = []

    def flush():
        if block:
            prose = normalize(" ".join(block))
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", prose):
                if sentence:
                    out.append(("prose", sentence))
            block.clear()

    for line in markdown.splitlines():
        if line.startswith("```"):
            flush()
            in_code = not in_code
            continue
        if in_code:
            if line.strip():
                out.append(("code", normalize(line)))
            continue
        stripped = line.strip()
        if not stripped:
            flush()
        elif stripped.startswith("|"):
            flush()
            out.append(("table", normalize(stripped)))
        elif stripped.startswith("#"):
            flush()
            out.append(("heading", normalize(stripped.lstrip("#"))))
        elif re.match(r"^(- |\d+\. )", stripped):
            flush()
            block.append(re.sub(r"^(- |\d+\. )", "", stripped))
        else:
            block.append(stripped)
    flush()
    return out


def corpus(root):
    texts = []
    for path in [os.path.join(root, "README.md")] + sorted(
        glob.glob(os.path.join(root, "docs", "*.md"))
    ):
        markdown = open(path, encoding="utf-8").read()
        # code lines as they are (a YAML list keeps its "- ")
        texts.append("\n".join(normalize(line) for line in markdown.splitlines()))
        markdown = "\n".join(
            re.sub(r"^\s*(- |\d+\. )", "", line) for line in markdown.splitlines()
        )
        texts.append(normalize(markdown.replace("**", "")))
    return "\n".join(texts)


def slug(heading):
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def broken_links(root):
    """Links between README.md and docs/ whose file or heading is missing."""
    broken = []
    pages = [os.path.join(root, "README.md")] + sorted(
        glob.glob(os.path.join(root, "docs", "*.md"))
    )
    for page in pages:
        text = open(page, encoding="utf-8").read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(full):
                broken.append(f"{os.path.relpath(page, root)}: {target} (no such file)")
                continue
            if anchor and full.endswith(".md"):
                headings = [
                    slug(line.lstrip("#"))
                    for line in open(full, encoding="utf-8").read().splitlines()
                    if line.startswith("#")
                ]
                if anchor not in headings:
                    broken.append(f"{os.path.relpath(page, root)}: {target} (no such heading)")
    return broken


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rev = sys.argv[1] if len(sys.argv) > 1 else "04a307d"
    old = subprocess.run(
        ["git", "-C", root, "show", f"{rev}:README.md"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    new = corpus(root)
    reworded = {normalize(key) for key in REWORDED}
    missing = []
    checked = 0
    for kind, text in units(old):
        checked += 1
        if text in new or text in reworded:
            continue
        if any(text in normalize(key) or normalize(key) in text for key in REWORDED):
            continue
        missing.append((kind, text))
    for kind, text in missing:
        print(f"not found ({kind}): {text}")
    print(f"{checked} units of {rev}:README.md checked, {len(missing)} not found")
    broken = broken_links(root)
    for link in broken:
        print(f"broken link: {link}")
    sys.exit(1 if missing or broken else 0)


if __name__ == "__main__":
    main()
