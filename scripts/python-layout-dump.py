#!/usr/bin/env python3
"""Dumps the bytes tracer/src/python/real_bytes.rs tests against: run with a
CPython 3.10-3.13 (`scripts/python-layout-dump.py`), paste its output. It
reads, with ctypes, the code object of its own function `leak`, the frame
`leak` runs in (found from the thread state as tracer's kernel walk finds it),
and the thread state."""
import ctypes, sys, threading
api = ctypes.pythonapi
api.PyThreadState_Get.restype = ctypes.c_void_p
V = sys.version_info
tag = f"{V.major}_{V.minor}"
layout = {  # code_header, thread_frame, frame_indirect, current_frame, thread id offset
    (3,10): dict(header=128, thread_frame=24, indirect=0, current=0, tid=176),
    (3,11): dict(header=192, thread_frame=56, indirect=1, current=8, tid=160),
    (3,12): dict(header=200, thread_frame=56, indirect=1, current=0, tid=144),
    (3,13): dict(header=200, thread_frame=72, indirect=0, current=0, tid=160),
}[(V.major, V.minor)]
def rust_bytes(name, b):
    return f"const {name}: [u8; {len(b)}] = {list(b)};"
def leak(n):
    t = api.PyThreadState_Get()
    # No Python call in between (a lambda would be the current frame).
    frame = ctypes.c_uint64.from_address(t + layout["thread_frame"]).value
    if layout["indirect"]:
        frame = ctypes.c_uint64.from_address(frame + layout["current"]).value
    return t, frame, ctypes.string_at(frame, 128), ctypes.string_at(t, 256)
t, frame, frame_bytes, thread_bytes = leak(1)
co = leak.__code__
out = []
out.append(f"// CPython {sys.version.split()[0]}")
out.append(rust_bytes(f"CODE_{tag}", ctypes.string_at(id(co), layout["header"])))
out.append(f"const CODE_{tag}_FIELDS: (u64, u64, u64, u64, i32) = ({id(co.co_filename)}, {id(co.co_name)}, {id(getattr(co, 'co_qualname', co.co_name))}, {id(co.co_linetable)}, {co.co_firstlineno});")
out.append(rust_bytes(f"FRAME_{tag}", frame_bytes))
out.append(f"const FRAME_{tag}_CODE: u64 = {id(co)};")
out.append(rust_bytes(f"THREAD_{tag}", thread_bytes))
tid_value = threading.get_ident() if V < (3, 11) else threading.get_native_id()
out.append(f"const THREAD_{tag}_ID: u64 = {tid_value};")
print("\n".join(out))
