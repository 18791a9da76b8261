#!/usr/bin/env bash
# Checks tracer's GPU memory tracing against PyTorch and CuPy on a real CUDA
# machine (not run in CI: it needs an NVIDIA GPU, root, and torch and cupy
# in python3).
#
# First it checks that eBPF uprobes load on this kernel (tracer on a sleep
# for a second), and stops if they do not. Then, for each mode of
# scripts/gpu_check_workload.py, it starts the workload, which loads its
# framework and CUDA and allocates nothing, attaches `tracer record --pid`,
# lets the workload leak from one Python line while it frees its
# temporaries, stops tracer while the workload still holds its memory, and
# checks the JSON report against the workload's own figures
# (scripts/gpu_check_verify.py):
#   torch-nocache    gpu-device = the live tensors, under the leaking line
#   torch-caching    gpu-tensor = memory_allocated(), gpu-device =
#                    memory_reserved(), the leaking line's gpu-tensor = the leak
#   torch-expandable the same with expandable segments (cuMemCreate/cuMemMap)
#   torch-late       the same, torch imported after tracer attached
#   cupy             gpu-device = cupy.cuda.runtime.malloc's kept buffers
#   s3               a graph executor's replaced pool buffers: exact, flagged
#
# Usage: sudo scripts/gpu-check.sh [MODE...]   (after `cargo xtask build`)
# TRACER: the tracer binary; GPU_CHECK_OUT: where logs and reports go (a
# temporary directory, removed, by default); GPU_CHECK_FAKE=1: rehearse on
# tests/fixtures/cuda's fake libraries (after `cargo xtask setup`).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
tracer=${TRACER:-$here/../target/release/tracer}
python=${PYTHON:-python3}
modes=${*:-torch-nocache torch-caching torch-expandable torch-late cupy s3}
if [ -n "${GPU_CHECK_OUT:-}" ]; then
    work=$GPU_CHECK_OUT
    mkdir -p "$work"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"

[ "$(id -u)" = 0 ] || { echo "gpu-check: run as root" >&2; exit 2; }
[ -x "$tracer" ] || { echo "gpu-check: build tracer first (cargo xtask build)" >&2; exit 2; }

# Waits up to $2 seconds for the file $1 (or, with $3, for $3 in file $1).
wait_file() {
    local deadline=$((SECONDS + $2))
    until [ -e "$1" ] && { [ -z "${3:-}" ] || grep -q -- "$3" "$1"; }; do
        [ $SECONDS -ge $deadline ] && return 1
        sleep 0.1
    done
}

ebpf_check() {
    echo "gpu-check: kernel $(uname -r)"
    sleep 30 &
    local sleeper=$!
    if ! timeout 60 "$tracer" record --pid "$sleeper" --duration 1s >"$work/ebpf-check.txt" 2>&1; then
        echo "gpu-check: STOP: eBPF uprobes cannot be used on this machine (kernel $(uname -r)):"
        cat "$work/ebpf-check.txt"
        ls -l /sys/kernel/btf/vmlinux /sys/bus/event_source/devices/uprobe/type 2>&1
        kill "$sleeper"
        return 1
    fi
    kill "$sleeper"
    echo "gpu-check: eBPF uprobes load here"
}

# What this machine runs: GPU, driver, Python, torch, cupy and the
# libc10_cuda.so whose code tracer's caching-allocator probes were read off.
environment() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    "$python" - <<'PY' 2>&1
import hashlib, os, sys
print("python", sys.version.split()[0], sys.executable, os.path.realpath(sys.executable))
try:
    import torch
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
    digest = hashlib.sha256(open(library, "rb").read()).hexdigest()
    print("torch", torch.__version__, "cuda", torch.version.cuda, library, "sha256", digest)
except Exception as error:
    print("torch:", error)
try:
    import cupy
    print("cupy", cupy.__version__, "cuda runtime", cupy.cuda.runtime.runtimeGetVersion())
except Exception as error:
    print("cupy:", error)
PY
}

# One mode: workload, tracer attached by --pid, report, check.
run_mode() {
    local mode=$1 dir="$work/$1"
    local -a env=() args=()
    case $mode in
        torch-nocache) env=(PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
        torch-expandable) env=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
        # `import torch` makes about 2 million heap allocations with distinct
        # Python stacks: traced, they fill the stack table (--max-stacks)
        # before the workload starts (seen on an H200: stack_table_full
        # 1 820 435, the leak counted exactly but without its stack), before
        # stack eviction. GPU_CHECK_LATE_ARGS replaces these options (set
        # it empty for tracer's defaults).
        torch-late) args=(${GPU_CHECK_LATE_ARGS---min-size 1048576}) ;;
    esac
    mkdir -p "$dir"
    echo "gpu-check: == $mode ${env[*]}"
    local started=$SECONDS
    env "${env[@]}" "$python" "$here/gpu_check_workload.py" "$mode" "$dir" >"$dir/workload.log" 2>&1 &
    local workload=$!
    if ! wait_file "$dir/ready" 120; then
        echo "FAIL $mode: the workload did not start"; cat "$dir/workload.log"
        kill "$workload"; return 1
    fi
    "$tracer" record --pid "$workload" --interval 250ms --top 0 -v "${args[@]}" \
        --json "$dir/report.json" >"$dir/report.txt" 2>"$dir/tracer.err" &
    local tracer_pid=$!
    if ! wait_file "$dir/tracer.err" 120 "tracer: attached"; then
        echo "FAIL $mode: tracer did not attach"; cat "$dir/tracer.err"
        kill "$workload" "$tracer_pid"; return 1
    fi
    local attached=$SECONDS
    # Stacks are walked by frame pointers until the unwind tables are in.
    wait_file "$dir/tracer.err" 30 "every table ready" ||
        echo "gpu-check: $mode: unwind tables not all ready after 30 s"
    local tables=$SECONDS
    touch "$dir/go"
    if ! wait_file "$dir/truth.json" 240; then
        echo "FAIL $mode: the workload did not finish"; cat "$dir/workload.log"
        kill "$workload" "$tracer_pid"; return 1
    fi
    # Stopped at once: tracer's last snapshot is the final state, and the
    # leak still grows in the second half of its window.
    kill -INT "$tracer_pid"
    wait "$tracer_pid"
    local tracer_status=$?
    touch "$dir/stop"
    wait "$workload"
    echo "gpu-check: $mode: started and attached in $((attached - started)) s, tables" \
        "in $((tables - attached)) s more, the mode $((SECONDS - started)) s; tracer exit $tracer_status"
    grep -E "Python frames|hooked|warning|error" "$dir/tracer.err" | head -20
    [ "$tracer_status" = 0 ] && [ -s "$dir/report.json" ] ||
        { echo "FAIL $mode: no report"; tail -20 "$dir/tracer.err"; return 1; }
    "$python" "$here/gpu_check_verify.py" "$dir/report.json" "$dir/truth.json"
}

ebpf_check || exit 3
[ "${GPU_CHECK_FAKE:-}" = 1 ] || environment
status=0
for mode in $modes; do
    run_mode "$mode" || status=1
done
[ "$status" = 0 ] && echo "gpu-check: OK" || echo "gpu-check: FAILED"
exit "$status"
