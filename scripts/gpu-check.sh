#!/usr/bin/env bash
# Checks tracer's GPU memory tracing on a real CUDA machine (not run in CI:
# it needs an NVIDIA GPU, root and PyTorch with CUDA in python3).
#
# For each allocator configuration (plain, and
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), it runs a Python
# program under `tracer record` that imports torch only after tracer has
# attached (so libcudart/libcuda are hooked after attach, as in real
# services), leaks LEAK_COUNT tensors of LEAK_MIB MiB from one function
# while churning short-lived tensors, empties the cache and exits. Then it
# asserts on the JSON report:
#   - the CUDA libraries were hooked after attach;
#   - the live gpu-device bytes cover the leaked bytes, within what the CUDA
#     context and the caching allocator may keep;
#   - the top gpu-device stack holds the leak, was made by cudaMalloc
#     (plain) or cuMemCreate (expandable segments), and starts in
#     PyTorch's caching allocator (libc10_cuda), the native caller;
#   - it is a suspected leak (steady growth).
#
# Usage: sudo scripts/gpu-check.sh     (after `cargo xtask build`)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tracer=${TRACER:-$root/target/release/tracer}
leak_count=${LEAK_COUNT:-8}
leak_mib=${LEAK_MIB:-64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

[ "$(id -u)" = 0 ] || { echo "gpu-check: run as root" >&2; exit 2; }
[ -x "$tracer" ] || { echo "gpu-check: build tracer first (cargo xtask build)" >&2; exit 2; }
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "gpu-check: python3 has no PyTorch with a usable CUDA device" >&2
    exit 2
}

cat > "$work/leak.py" <<'PY'
import os, sys, time

time.sleep(3)  # tracer is attached by now; CUDA is loaded after attach
import torch

count, mib = int(sys.argv[1]), int(sys.argv[2])
kept = []

def leak_tensors():
    kept.append(torch.empty(mib << 20, dtype=torch.uint8, device="cuda"))

def churn():
    for _ in range(20):
        torch.empty(1 << 20, dtype=torch.uint8, device="cuda").fill_(1)

torch.zeros(1, device="cuda")  # context
for _ in range(count):
    leak_tensors()
    churn()
    torch.cuda.synchronize()
    time.sleep(0.5)
torch.cuda.empty_cache()
print(f"leaked_bytes={count * (mib << 20)}", flush=True)
time.sleep(1.5)
PY

cat > "$work/check.py" <<'PY'
import json, sys

report, mode, leaked = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
api = "cuMemCreate" if mode == "expandable" else "cudaMalloc"
failures = []

def check(condition, message):
    if not condition:
        failures.append(message)

later = [l for l in report["libraries"] if l["noticed_by"] != "attach"]
check(any("libcudart" in l["path"] or "libcuda.so" in l["path"] for l in later),
      f"no CUDA library hooked after attach: {[l['path'] for l in report['libraries']]}")
live = report["totals"].get("gpu-device", {}).get("live_bytes", 0)
check(leaked <= live <= leaked + (512 << 20), f"gpu-device live {live} vs leaked {leaked}")
device = [s for s in report["stacks"] if s["kind"] == "gpu-device"]
check(device, "no gpu-device stack")
if device:
    top = device[0]
    frames = [(f.get("function") or "?", f.get("module") or "?") for f in top["frames"]]
    check(top["live_bytes"] >= leaked, f"top stack holds {top['live_bytes']} < {leaked}")
    check(top.get("api") == api, f"top stack made by {top.get('api')}, expected {api}")
    check(frames and "libc10_cuda" in frames[0][1], f"top stack starts at {frames[:3]}")
    check(top["suspected_leak"], "top stack is not a suspected leak")
    print(f"{mode}: top gpu-device stack {top['live_bytes']} bytes via {top.get('api')}, "
          f"frames {frames[:4]}")
for failure in failures:
    print(f"FAIL ({mode}): {failure}")
sys.exit(1 if failures else 0)
PY

status=0
for mode in plain expandable; do
    conf=""
    [ "$mode" = expandable ] && conf="expandable_segments:True"
    echo "gpu-check: $mode (PYTORCH_CUDA_ALLOC_CONF=$conf)"
    PYTORCH_CUDA_ALLOC_CONF=$conf "$tracer" record --interval 250ms --top 20 \
        --json "$work/$mode.json" -- python3 "$work/leak.py" "$leak_count" "$leak_mib" \
        > "$work/$mode.txt"
    python3 "$work/check.py" "$work/$mode.json" "$mode" \
        "$((leak_count * (leak_mib << 20)))" || { status=1; cat "$work/$mode.txt"; }
done
[ "$status" = 0 ] && echo "gpu-check: OK"
exit "$status"
