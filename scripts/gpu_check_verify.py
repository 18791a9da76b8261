"""Checks one tracer JSON report of scripts/gpu-check.sh against the ground
truth its workload wrote (scripts/gpu_check_workload.py): prints every
figure, traced next to true, one `PASS` or `FAIL` line each, and exits 1
on any failure.

  python3 gpu_check_verify.py REPORT.json TRUTH.json
"""
import json
import os
import sys

report = json.load(open(sys.argv[1]))
truth = json.load(open(sys.argv[2]))
mode = truth["mode"]
failures = 0


def check(what, traced, expected, ok=None):
    global failures
    ok = traced == expected if ok is None else ok
    failures += not ok
    difference = ""
    if isinstance(traced, int) and isinstance(expected, int):
        difference = f" (difference {traced - expected:+d} B)"
    print(f"{'PASS' if ok else 'FAIL'} {mode}: {what}: traced {traced}, expected {expected}{difference}")


def total(kind):
    return report["totals"].get(kind, {}).get("live_bytes", 0)


def python_frames(stack):
    return [f for f in stack["frames"] if f.get("language") == "python"]


def workload_frame(frame, function, line):
    """A frame of the workload's `function` (its qualified name's last part,
    or a comprehension inside it), at `line` if given."""
    name = frame.get("function") or ""
    return (
        os.path.basename(frame.get("file") or "") == "gpu_check_workload.py"
        and (line is None or frame.get("line") == line)
        and (name.split(".")[-1] == function or f"{function}.<locals>" in name)
    )


def through(kind, function, line=None):
    """The stacks of `kind` whose Python frames hold `function` (at `line`)."""
    return [
        stack
        for stack in report["stacks"]
        if stack["kind"] == kind
        and any(workload_frame(f, function, line) for f in python_frames(stack))
    ]


def live(stacks):
    return sum(s["live_bytes"] for s in stacks), sum(s["live_allocs"] for s in stacks)


def named_leak(kind, api=None):
    """The leak, exact, under its Python line, flagged."""
    function, line = truth["leak_function"], truth["leak_line"]
    stacks = through(kind, function, line)
    bytes_, blocks = live(stacks)
    check(f"{kind} under {function} line {line}", (bytes_, blocks),
          (truth["leaked_bytes"], truth["leaked_blocks"]))
    # Flagged as a stack, or as the site its stacks share (stacks walked
    # before and after the unwind tables were in differ in native frames).
    groups = [
        group
        for group in report.get("suspected_leak_groups", [])
        if group["kind"] == kind
        and any(workload_frame(f, function, line) for f in python_frames(group))
    ]
    check(f"{kind} leak flagged (suspected_leak)",
          any(s["suspected_leak"] for s in stacks) or bool(groups), True)
    if api:
        apis = sorted({s.get("api") for s in stacks})
        check(f"{kind} leak made by", apis, [api], ok=any(a in apis for a in api.split("|")))
    churn = live(through(kind, truth["churn_function"]))
    check(f"{kind} left under {truth['churn_function']} (freed)", churn, (0, 0))


def nocache():
    check("gpu-device total = the live tensors", total("gpu-device"), truth["leaked_bytes"])
    print(f"INFO {mode}: torch.cuda.memory_allocated() = {truth['memory_allocated']} "
          "(the uncached allocator keeps no statistics)")
    named_leak("gpu-device", "cudaMalloc|cuMemAlloc_v2")
    check("no gpu-tensor (no caching allocator)", total("gpu-tensor"), 0)


def caching():
    check("gpu-tensor total = memory_allocated()", total("gpu-tensor"), truth["memory_allocated"])
    check("gpu-device total = memory_reserved()", total("gpu-device"), truth["memory_reserved"])
    named_leak("gpu-tensor")


def cupy():
    check("gpu-device total = the kept buffers", total("gpu-device"), truth["leaked_bytes"])
    named_leak("gpu-device", "cudaMalloc|cuMemAlloc_v2")


def late():
    caching()
    hooked = [
        library["noticed_by"]
        for library in report["libraries"]
        if os.path.basename(library["path"]).startswith("libc10_cuda.so")
    ]
    check("libc10_cuda.so hooked once loaded, after attach", hooked, ["not at attach"],
          ok=bool(hooked) and "attach" not in hooked)


CHECKS = {
    "torch-nocache": nocache,
    "torch-caching": caching,
    "torch-expandable": caching,
    "torch-late": late,
    "cupy": cupy,
    "s3": cupy,
}

CHECKS[mode]()
print(f"INFO {mode}: totals {json.dumps(report['totals'])}")
print(f"INFO {mode}: truth {json.dumps(truth)}")
events = {k: v for k, v in report["events"].items() if v and ("gpu" in k or "python" in k)}
print(f"INFO {mode}: GPU and Python events {json.dumps(events)}; drops {json.dumps(report['drops'])}")
for library in report["libraries"]:
    if any(name in library["path"] for name in ("cuda", "c10", "cupy")):
        print(f"INFO {mode}: hooked {os.path.basename(library['path'])} ({library.get('noticed_by')})")
for stack in report["stacks"]:
    if stack["kind"].startswith("gpu"):
        where = [f"{f.get('function')}:{f.get('line')}" for f in python_frames(stack)][:3]
        print(f"INFO {mode}: stack {stack['kind']} {stack['live_bytes']} B in "
              f"{stack['live_allocs']} via {stack.get('api')} leak={stack['suspected_leak']} "
              f"at {where} native {[f.get('function') for f in stack['frames'][:3]]}")
sys.exit(1 if failures else 0)
