//! The CUDA probes: API ids and names, attach cookies, the per-thread call
//! in progress and cuMemCreate's physical memory.

use crate::LiveAlloc;

/// The CUDA entry points tracer hooks, by the id a GPU stack carries in
/// the STACK_API map; [`GPU_API_NAMES`] names them.
pub mod gpu_api {
    pub const CUDA_MALLOC: u32 = 0;
    pub const CUDA_MALLOC_MANAGED: u32 = 1;
    pub const CUDA_MALLOC_HOST: u32 = 2;
    pub const CUDA_HOST_ALLOC: u32 = 3;
    pub const CUDA_MALLOC_PITCH: u32 = 4;
    pub const CUDA_MALLOC_ASYNC: u32 = 5;
    pub const CUDA_MALLOC_FROM_POOL_ASYNC: u32 = 6;
    pub const CUDA_FREE: u32 = 7;
    pub const CUDA_FREE_HOST: u32 = 8;
    pub const CUDA_FREE_ASYNC: u32 = 9;
    pub const CU_MEM_ALLOC: u32 = 10;
    pub const CU_MEM_ALLOC_PITCH: u32 = 11;
    pub const CU_MEM_ALLOC_MANAGED: u32 = 12;
    pub const CU_MEM_ALLOC_HOST: u32 = 13;
    pub const CU_MEM_HOST_ALLOC: u32 = 14;
    pub const CU_MEM_ALLOC_ASYNC: u32 = 15;
    pub const CU_MEM_ALLOC_FROM_POOL_ASYNC: u32 = 16;
    pub const CU_MEM_FREE: u32 = 17;
    pub const CU_MEM_FREE_HOST: u32 = 18;
    pub const CU_MEM_FREE_ASYNC: u32 = 19;
    pub const CU_MEM_CREATE: u32 = 20;
    pub const CU_MEM_RELEASE: u32 = 21;
    pub const CU_MEM_MAP: u32 = 22;
    pub const CU_MEM_UNMAP: u32 = 23;
    pub const CU_CTX_DESTROY: u32 = 24;
    pub const CU_DEVICE_PRIMARY_CTX_RESET: u32 = 25;
    pub const CUDA_DEVICE_RESET: u32 = 26;
    pub const COUNT: u32 = 27;

    /// Whether the memory an allocation API hands out belongs to a CUDA
    /// context, and goes with it when the context is destroyed or reset.
    /// Stream-ordered allocations (pools) and cuMemCreate's physical memory
    /// do not: "cuCtxDestroy() will not destroy memory allocations by
    /// cuMemCreate(), cuMemAllocAsync() and cuMemAllocFromPoolAsync()"
    /// (CUDA driver API).
    pub const fn owned_by_context(api: u32) -> bool {
        !matches!(
            api,
            CUDA_MALLOC_ASYNC
                | CUDA_MALLOC_FROM_POOL_ASYNC
                | CU_MEM_ALLOC_ASYNC
                | CU_MEM_ALLOC_FROM_POOL_ASYNC
                | CU_MEM_CREATE
        )
    }
}

/// The exported symbol of each `gpu_api` id, by index.
pub const GPU_API_NAMES: [&str; gpu_api::COUNT as usize] = [
    "cudaMalloc",
    "cudaMallocManaged",
    "cudaMallocHost",
    "cudaHostAlloc",
    "cudaMallocPitch",
    "cudaMallocAsync",
    "cudaMallocFromPoolAsync",
    "cudaFree",
    "cudaFreeHost",
    "cudaFreeAsync",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemFree_v2",
    "cuMemFreeHost",
    "cuMemFreeAsync",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuCtxDestroy_v2",
    "cuDevicePrimaryCtxReset_v2",
    "cudaDeviceReset",
];

/// The attach cookie of a CUDA probe: which API it is on and, for an
/// allocation, which kind of memory it hands out.
pub const fn gpu_cookie(api: u32, kind: u32) -> u64 {
    (kind as u64) << 32 | api as u64
}

/// What the CUDA return probe must do with a pending call.
pub mod gpu_call {
    /// The address is written to the out-parameter `pointer`; `size` bytes.
    pub const ALLOC: u32 = 1;
    /// cuMemAllocPitch/cudaMallocPitch: `size` rows of the pitch written to
    /// the out-parameter `pitch_pointer`.
    pub const PITCH: u32 = 2;
    /// cuMemCreate: the handle of `size` physical bytes is written to the
    /// out-parameter `pointer`.
    pub const CREATE: u32 = 3;
    /// Frees the block at address `pointer`.
    pub const FREE: u32 = 4;
    /// cuMemRelease of handle `handle`.
    pub const RELEASE: u32 = 5;
    /// cuMemMap of handle `handle` at address `pointer`.
    pub const MAP: u32 = 6;
    /// cuMemUnmap of the mapping at address `pointer`.
    pub const UNMAP: u32 = 7;
    /// Destroys or resets a CUDA context: the context epoch ends.
    pub const DESTROY_CONTEXT: u32 = 8;
}

/// Per thread: the outermost CUDA call in progress, from its entry probe to
/// its return probe. Kept apart from [`crate::Pending`] so that a malloc inside a
/// CUDA call (or a CUDA call inside a malloc hook) never touches it; calls
/// nested in it (the driver under the runtime) only move `depth`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuPending {
    /// Out-parameter (ALLOC, PITCH, CREATE) or address (FREE, MAP, UNMAP).
    pub pointer: u64,
    /// Requested bytes; PITCH: the number of rows.
    pub size: u64,
    /// PITCH: where the pitch in bytes is written.
    pub pitch_pointer: u64,
    /// RELEASE, MAP: the physical memory handle.
    pub handle: u64,
    /// A `gpu_call` value.
    pub call: u32,
    /// CUDA calls in progress on this thread, the outermost included.
    pub depth: u32,
    pub kind: u32,
    /// A `gpu_api` id.
    pub api: u32,
}

/// Value of the VMM_HANDLES map: physical memory made by cuMemCreate. It
/// stays allocated while its handle is unreleased or any mapping of it
/// remains, so `holders` counts both; the memory is freed when it drops
/// to zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmmHandle {
    pub block: LiveAlloc,
    pub holders: u64,
}
