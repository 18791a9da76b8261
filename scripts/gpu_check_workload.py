"""The workloads of scripts/gpu-check.sh, one per mode, each leaking from one
named Python line while it frees its temporaries, and writing its own
ground truth. Run as `python3 gpu_check_workload.py MODE WORKDIR`.

It loads its framework and initializes CUDA first, allocating nothing (but
torch-late), then writes WORKDIR/ready and waits for WORKDIR/go (tracer
attaches by --pid in between: everything allocated is seen). After LEAK_COUNT rounds it writes
WORKDIR/truth.json and waits for WORKDIR/stop, holding its memory while
tracer writes its report.

Modes:
  torch-nocache    PYTORCH_NO_CUDA_MEMORY_CACHING=1: each tensor a cudaMalloc
  torch-caching    PyTorch's default caching allocator
  torch-expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  torch-late       the caching allocator, torch imported only after tracer
                   attached (libc10_cuda and CUDA hooked as they are loaded)
  cupy             cupy.cuda.runtime.malloc (cudaMalloc) kept
  s3               a graph executor (TVM's shape) whose share_params replaces
                   pooled device buffers without freeing the originals, on
                   cupy.cuda.runtime.malloc

With GPU_CHECK_FAKE=1 it runs on tests/fixtures/cuda's fake libraries
(scripts/gpu_check_fakes.py), to rehearse the script without a GPU.
"""
import json
import os
import sys
import time

MODE, WORK = sys.argv[1], sys.argv[2]
COUNT = int(os.environ.get("LEAK_COUNT", "10"))
LEAK_BYTES = int(os.environ.get("LEAK_MIB", "64")) << 20
PAUSE_S = 0.3
FAKE = os.environ.get("GPU_CHECK_FAKE") == "1"


def marked_line(marker):
    """The line of this file that ends with `marker`."""
    with open(os.path.abspath(__file__)) as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith(marker):
                return number
    raise SystemExit(f"no line marked {marker}")


def wait_for(name, timeout_s=600):
    path = os.path.join(WORK, name)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{MODE}: no {name} after {timeout_s} s")
        time.sleep(0.05)


def touch(name, text=""):
    with open(os.path.join(WORK, name) + ".part", "w") as out:
        out.write(text)
    os.rename(os.path.join(WORK, name) + ".part", os.path.join(WORK, name))


def load_framework():
    """torch or cupy (or their stand-ins), CUDA initialized, nothing allocated."""
    global torch, runtime
    if FAKE:
        import gpu_check_fakes as fakes

        torch, runtime = fakes.torch, fakes.runtime
    elif MODE.startswith("torch"):
        import torch

        torch.cuda.init()
        torch.cuda.current_device()
    else:
        import cupy
        from cupy.cuda import runtime

        runtime.getDeviceCount()
        cupy.cuda.Device(0).use()


kept = []


def leak_tensor():
    kept.append(torch.empty(LEAK_BYTES, dtype=torch.uint8, device="cuda"))  # LEAK-TORCH


def torch_temporaries():
    ones = torch.ones(16 << 20, dtype=torch.uint8, device="cuda")
    doubled = ones * 2
    small = torch.empty(1000, dtype=torch.uint8, device="cuda")
    del ones, doubled, small


def leak_cupy():
    kept.append(runtime.malloc(LEAK_BYTES))  # LEAK-CUPY


def cupy_temporaries():
    for size in (16 << 20, 1000):
        runtime.free(runtime.malloc(size))


POOL_ENTRIES, SHARED_PARAMS, ENTRY_BYTES = 8, 3, 4 << 20


class Executor:
    """TVM's graph executor: a storage pool, params shared into it."""

    def setup_storage(self):
        self.pool = [runtime.malloc((i + 1) * ENTRY_BYTES) for i in range(POOL_ENTRIES)]  # SETUP-STORAGE

    def share_params(self):
        for entry in range(SHARED_PARAMS):
            self.pool[entry] = runtime.malloc((entry + 1) * ENTRY_BYTES)  # SHARE-PARAMS

    def destroy(self):
        for address in self.pool:
            runtime.free(address)
        self.pool = []


def s3_round():
    executor = Executor()
    executor.setup_storage()
    executor.share_params()
    executor.destroy()


ROUNDS = {
    "torch": (leak_tensor, torch_temporaries, "leak_tensor", "# LEAK-TORCH"),
    "cupy": (leak_cupy, cupy_temporaries, "leak_cupy", "# LEAK-CUPY"),
    "s3": (s3_round, lambda: None, "setup_storage", "# SETUP-STORAGE"),
}


def main():
    leak, temporaries, function, marker = ROUNDS[MODE.split("-")[0]]
    late = MODE == "torch-late"
    if not late:
        load_framework()
    print(f"{MODE}: ready pid={os.getpid()}", flush=True)
    touch("ready", str(os.getpid()))
    wait_for("go")
    if late:
        load_framework()
    for _ in range(COUNT):
        leak()
        temporaries()
        if MODE.startswith("torch"):
            torch.cuda.synchronize()
        time.sleep(PAUSE_S)
    truth = {
        "mode": MODE,
        "pid": os.getpid(),
        "rounds": COUNT,
        "leak_function": function,
        "leak_line": marked_line(marker),
        "churn_function": "share_params" if MODE == "s3" else temporaries.__name__,
    }
    if MODE == "s3":
        per_round = sum((entry + 1) * ENTRY_BYTES for entry in range(SHARED_PARAMS))
        truth.update(leaked_bytes=COUNT * per_round, leaked_blocks=COUNT * SHARED_PARAMS)
    elif MODE == "cupy":
        truth.update(leaked_bytes=COUNT * LEAK_BYTES, leaked_blocks=COUNT)
    else:
        stats = torch.cuda.memory_stats()
        truth.update(
            leaked_bytes=sum(t.untyped_storage().nbytes() for t in kept),
            leaked_blocks=len(kept),
            memory_allocated=torch.cuda.memory_allocated(),
            memory_reserved=torch.cuda.memory_reserved(),
            segments=stats.get("segment.all.current"),
            blocks=stats.get("allocation.all.current"),
            torch=str(torch.__version__),
        )
    print(f"{MODE}: truth {json.dumps(truth)}", flush=True)
    touch("truth.json", json.dumps(truth))
    wait_for("stop")


main()
