"""Stand-ins for the slices of torch and cupy that scripts/gpu_check_workload.py
uses, on tests/fixtures/cuda's fake libraries (`cargo xtask setup` builds them
into target/fixtures/cuda): `GPU_CHECK_FAKE=1 scripts/gpu-check.sh` rehearses
the whole check on a machine without a GPU. Tensors come from the fake
caching allocator (libc10_cuda.so), or from cudaMalloc under
PYTORCH_NO_CUDA_MEMORY_CACHING=1 as torch's own do; cupy's runtime.malloc
is the fake runtime's cudaMalloc.
"""
import ctypes
import os
import types

_DIR = os.environ.get(
    "GPU_CHECK_FAKE_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "../target/fixtures/cuda"),
)
_cudart = ctypes.CDLL(os.path.join(_DIR, "libcudart.so.12"))
_c10 = ctypes.CDLL(os.path.join(_DIR, "libc10_cuda.so"))
_c10.c10_alloc.restype = ctypes.c_void_p
_c10.c10_alloc.argtypes = [ctypes.c_size_t]
_c10.c10_free.argtypes = [ctypes.c_void_p]
_c10.c10_allocated.restype = ctypes.c_size_t
_c10.c10_reserved.restype = ctypes.c_size_t
_UNCACHED = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"


def _malloc(size):
    address = ctypes.c_void_p()
    if _cudart.cudaMalloc(ctypes.byref(address), ctypes.c_size_t(size)) != 0:
        raise MemoryError(size)
    return address.value


def _free(address):
    _cudart.cudaFree(ctypes.c_void_p(address))


runtime = types.SimpleNamespace(malloc=_malloc, free=_free)


class _Storage:
    def __init__(self, size):
        self.size = size
        self.address = _malloc(size) if _UNCACHED else _c10.c10_alloc(size)

    def nbytes(self):
        return self.size

    def __del__(self):
        if _UNCACHED:
            _free(self.address)
        else:
            _c10.c10_free(self.address)


class _Tensor:
    def __init__(self, size):
        self.storage = _Storage(size)

    def untyped_storage(self):
        return self.storage

    def __mul__(self, _factor):
        return _Tensor(self.storage.size)


def _tensor(size, dtype=None, device=None):
    return _Tensor(size)


_cuda = types.SimpleNamespace(
    synchronize=lambda: None,
    memory_allocated=lambda: 0 if _UNCACHED else _c10.c10_allocated(),
    memory_reserved=lambda: 0 if _UNCACHED else _c10.c10_reserved(),
    memory_stats=dict,
)
torch = types.SimpleNamespace(
    empty=_tensor, ones=_tensor, uint8="uint8", cuda=_cuda, __version__="fake"
)
