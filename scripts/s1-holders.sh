#!/usr/bin/env bash
# usage: scripts/s1-holders.sh VENV OVERLAY BEFORE AFTER OUT [tracer args...]
#
# The S1 figures of `record --holders` (docs/holders.md): the export loop
# (tests/fixtures/python/s1_export.py) under VENV's python with the bug put
# back (OVERLAY from scripts/s1-overlay.sh), BEFORE exports before tracer
# attaches, AFTER exports while it records, then the report. Writes
# OUT/report.json, OUT/report.txt, OUT/tracer.err, OUT/answers (the
# workload's own lines) and OUT/tracer-peak-rss (VmHWM, KiB).
set -euo pipefail
venv=$1; overlay=$2; before=$3; after=$4; out=$5; shift 5
root=$(cd "$(dirname "$0")/.." && pwd)
tracer=${TRACER:-$root/target/release/tracer}
mkdir -p "$out"
coproc LOOP { PYTHONPATH=$overlay exec "$venv/bin/python" "$root/tests/fixtures/python/s1_export.py"; }
read -r ready <&"${LOOP[0]}"
echo "$ready" | tee "$out/answers"
pid=$(echo "$ready" | sed 's/.*pid=\([0-9]*\).*/\1/')
echo "export $before" >&"${LOOP[1]}"
read -r answer <&"${LOOP[0]}"; echo "$answer" | tee -a "$out/answers"
"$tracer" record --pid "$pid" --holders --json "$out/report.json" -v "$@" >"$out/report.txt" 2>"$out/tracer.err" &
tpid=$!
for _ in $(seq 1200); do grep -q "every table ready" "$out/tracer.err" 2>/dev/null && break; sleep 0.5; done
echo "export $after" >&"${LOOP[1]}"
read -r answer <&"${LOOP[0]}"; echo "$answer" | tee -a "$out/answers"
grep VmRSS "/proc/$pid/status" | tee -a "$out/answers"
sleep 2
kill -INT "$tpid"
hwm=0
while kill -0 "$tpid" 2>/dev/null; do
  now=$(awk '/VmHWM/ {print $2}' "/proc/$tpid/status" 2>/dev/null || echo 0)
  [ "${now:-0}" -gt "$hwm" ] && hwm=$now
  sleep 0.2
done
wait "$tpid" || true
echo "$hwm" >"$out/tracer-peak-rss"
echo quit >&"${LOOP[1]}"; read -r bye <&"${LOOP[0]}" || true
wait || true
echo "tracer peak RSS ${hwm} KiB; report in $out"
