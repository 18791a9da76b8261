"""Writes a seed of the python_threads fuzz target from the memory of the
Python running it: its _PyRuntime, interpreters and thread states (three
threads started for it), each at its address, in the image format of
fuzz/src/lib.rs. Usage: python3.X python_threads_seed.py OUT
"""
import ctypes
import struct
import sys
import threading

# (runtime_interpreters, interpreter_next, interpreter_threads, thread_next,
# thread_native_id) as tracer's python/layout.rs has them.
TABLES = {
    (3, 11): (40, 0, 16, 8, 160),
    (3, 12): (40, 0, 72, 8, 144),
}


def words(address, count):
    return struct.unpack(f"<{count}Q", ctypes.string_at(address, 8 * count))


def main(out):
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    version = sys.version_info[:2]
    if version >= (3, 13):
        offsets = words(runtime, 73)
        fields = (offsets[5], offsets[8], offsets[9], offsets[21], offsets[25])
        header_version = 0
        runtime_bytes = 73 * 8
    else:
        fields = TABLES[version]
        header_version = version[1]
        runtime_bytes = 64
    interpreters_at, interp_next, interp_threads, thread_next, native_id = fields
    ranges = [(runtime, max(runtime_bytes, interpreters_at + 8))]
    interpreter = words(runtime + interpreters_at, 1)[0]
    while interpreter:
        ranges.append((interpreter, max(interp_next, interp_threads) + 8))
        thread = words(interpreter + interp_threads, 1)[0]
        while thread:
            ranges.append((thread, max(thread_next, native_id) + 8))
            thread = words(thread + thread_next, 1)[0]
        interpreter = words(interpreter + interp_next, 1)[0]
    stop.set()
    image = b""
    for address, length in sorted(set(ranges)):
        image += struct.pack("<QH", address, length) + ctypes.string_at(address, length)
    with open(out, "wb") as file:
        file.write(struct.pack("<BQQ", header_version, runtime, 0) + image)


main(sys.argv[1])
