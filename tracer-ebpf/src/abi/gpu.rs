//! The CUDA probes: API ids and names, attach cookies, the per-thread call
//! in progress and cuMemCreate's physical memory.

use crate::LiveAlloc;

/// The CUDA entry points tracer hooks, by the id a GPU stack carries in
/// the STACK_API map; [`GPU_API_NAMES`] names them.
pub mod gpu_api {
    id_table! {
        /// The exported symbol of each `gpu_api` id, by index.
        GPU_API_NAMES: [&str] {
            CUDA_MALLOC => "cudaMalloc",
            CUDA_MALLOC_MANAGED => "cudaMallocManaged",
            CUDA_MALLOC_HOST => "cudaMallocHost",
            CUDA_HOST_ALLOC => "cudaHostAlloc",
            CUDA_MALLOC_PITCH => "cudaMallocPitch",
            CUDA_MALLOC_ASYNC => "cudaMallocAsync",
            CUDA_MALLOC_FROM_POOL_ASYNC => "cudaMallocFromPoolAsync",
            CUDA_FREE => "cudaFree",
            CUDA_FREE_HOST => "cudaFreeHost",
            CUDA_FREE_ASYNC => "cudaFreeAsync",
            CU_MEM_ALLOC => "cuMemAlloc_v2",
            CU_MEM_ALLOC_PITCH => "cuMemAllocPitch_v2",
            CU_MEM_ALLOC_MANAGED => "cuMemAllocManaged",
            CU_MEM_ALLOC_HOST => "cuMemAllocHost_v2",
            CU_MEM_HOST_ALLOC => "cuMemHostAlloc",
            CU_MEM_ALLOC_ASYNC => "cuMemAllocAsync",
            CU_MEM_ALLOC_FROM_POOL_ASYNC => "cuMemAllocFromPoolAsync",
            CU_MEM_FREE => "cuMemFree_v2",
            CU_MEM_FREE_HOST => "cuMemFreeHost",
            CU_MEM_FREE_ASYNC => "cuMemFreeAsync",
            CU_MEM_CREATE => "cuMemCreate",
            CU_MEM_RELEASE => "cuMemRelease",
            CU_MEM_MAP => "cuMemMap",
            CU_MEM_UNMAP => "cuMemUnmap",
            CU_CTX_DESTROY => "cuCtxDestroy_v2",
            CU_DEVICE_PRIMARY_CTX_RESET => "cuDevicePrimaryCtxReset_v2",
            CUDA_DEVICE_RESET => "cudaDeviceReset",
        }
    }

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

pub use gpu_api::GPU_API_NAMES;

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

#[cfg(test)]
mod tests {
    use super::gpu_api::*;
    use super::*;

    #[test]
    fn each_gpu_api_id_indexes_its_symbol() {
        assert_eq!(GPU_API_NAMES.len(), COUNT as usize);
        assert_eq!(GPU_API_NAMES[CUDA_MALLOC as usize], "cudaMalloc");
        assert_eq!(GPU_API_NAMES[CU_MEM_CREATE as usize], "cuMemCreate");
        assert_eq!(GPU_API_NAMES[CUDA_DEVICE_RESET as usize], "cudaDeviceReset");
        let names: std::collections::HashSet<&str> = GPU_API_NAMES.iter().copied().collect();
        assert_eq!(names.len(), GPU_API_NAMES.len(), "a symbol listed twice");
    }

    #[test]
    fn pools_and_physical_memory_outlive_their_context() {
        let outliving: Vec<&str> = (0..COUNT)
            .filter(|&api| !owned_by_context(api))
            .map(|api| GPU_API_NAMES[api as usize])
            .collect();
        assert_eq!(
            outliving,
            [
                "cudaMallocAsync",
                "cudaMallocFromPoolAsync",
                "cuMemAllocAsync",
                "cuMemAllocFromPoolAsync",
                "cuMemCreate"
            ]
        );
    }

    #[test]
    fn a_cookie_holds_the_kind_above_the_api() {
        let cookie = gpu_cookie(CU_MEM_MAP, 3);
        assert_eq!(cookie >> 32, 3);
        assert_eq!(cookie as u32, CU_MEM_MAP);
        assert_ne!(gpu_cookie(1, 2), gpu_cookie(2, 1));
    }
}
