#!/bin/bash
# Cost of Python frames per allocation (README, "Python frames"): runs
# tests/fixtures/python/bench_loop.py at Python depth 10 and 50 under
# `tracer record` with and without Python frames, and bare.
# Usage (root, after `cargo build --release -p tracer`):
#   scripts/python-cost.sh [ITERATIONS] [extra tracer args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tracer=$root/target/release/tracer
loop=$root/tests/fixtures/python/bench_loop.py
iterations=${1:-200000}
shift || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() { # depth, then tracer args ("bare": no tracer)
    local depth=$1
    shift
    mkfifo "$work/in"
    /usr/bin/python3.11 "$loop" "$depth" "$iterations" <"$work/in" >"$work/out" &
    local python=$!
    exec 8>"$work/in"
    while [ ! -s "$work/out" ]; do sleep 0.05; done
    local tracer_pid=""
    if [ "$1" != bare ]; then
        "$tracer" record -p "$(head -1 "$work/out")" "$@" >/dev/null 2>"$work/err" &
        tracer_pid=$!
        until grep -qs "attached" "$work/err"; do sleep 0.1; done
    fi
    echo go >&8
    exec 8>&-
    wait "$python"
    if [ -n "$tracer_pid" ]; then
        kill -INT "$tracer_pid"
        wait "$tracer_pid" || true
    fi
    echo "depth $depth, $*: $(tail -n +2 "$work/out" | tr '\n' ' ')ns per iteration"
    rm -f "$work/in" "$work/out" "$work/err"
}

for depth in 10 50; do
    run "$depth" bare
    run "$depth" --python off "$@"
    run "$depth" --python auto "$@"
done
