#!/usr/bin/env bash
# usage: scripts/s1-overlay.sh VENV OUT
#
# The S1 bug on a current iree-turbine, without touching VENV: OUT/iree
# becomes a tree of symbolic links to VENV's iree package in which only
# iree/compiler/extras/fx_importer.py is a patched copy, with the line of
# the affected versions back in RefTracker.track (iree-turbine issue 281):
# `weakref.finalize(referrent, self._ref_finalizer, ref_id)`. Run the
# workload with PYTHONPATH=OUT (tests/fixtures/python/s1_export.py).
set -euo pipefail
venv=$1; out=$2
site=$(echo "$venv"/lib/python3*/site-packages)
[ -f "$site/iree/compiler/extras/fx_importer.py" ] || { echo "no iree-turbine in $venv" >&2; exit 1; }
rm -rf "$out/iree"
mkdir -p "$out"
cp -rs "$site/iree" "$out/iree"
file=iree/compiler/extras/fx_importer.py
rm -f "$out/$file" "$out"/iree/compiler/extras/__pycache__/fx_importer.*
python3 - "$site/$file" "$out/$file" <<'PY'
import sys
source, target = sys.argv[1:]
text = open(source).read()
old = """        # if referrent is not Empty:
        #    weakref.finalize(referrent, self._ref_finalizer, ref_id)
        self._refs[ref_id] = info
        return info

    # def _ref_finalizer(self, ref_id: int):
    #    del self._refs[ref_id]
"""
new = """        if referrent is not Empty:
            weakref.finalize(referrent, self._ref_finalizer, ref_id)
        self._refs[ref_id] = info
        return info

    def _ref_finalizer(self, ref_id: int):
        del self._refs[ref_id]
"""
if old not in text:
    sys.exit(f"{source}: RefTracker.track is not the one this patch knows")
open(target, "w").write(text.replace(old, new))
PY
echo "$out/$file: weakref.finalize is back in RefTracker.track"
