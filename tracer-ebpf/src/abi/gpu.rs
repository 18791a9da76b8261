//! The CUDA probes: API ids and names, attach cookies, the per-thread call
//! in progress and cuMemCreate's physical memory; PyTorch's CUDA caching
//! allocator, whose blocks are the gpu-tensor kind.

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

/// PyTorch's CUDA caching allocator (`libc10_cuda.so`): the functions
/// that hand a block to a tensor and take it back, and where a block keeps
/// what tracer reads. Read off the code of torch 2.11.0+cu130's
/// libc10_cuda.so: `NativeCachingAllocator::malloc` calls `MALLOC` with
/// (this, size, stream) and reads the device address at `BLOCK_ADDRESS`
/// of the `Block *` it returns in %rax; `FREE` gets (this, block) and
/// clears `BLOCK_ALLOCATED`, the stats taking `BLOCK_SIZE` off. The
/// layout is `struct Block` of c10/cuda/CUDACachingAllocator.cpp (device,
/// stream, stream_uses, size, requested_size, pool, ptr, allocated),
/// unchanged from PyTorch 2.1 to 2.11.
pub mod caching_allocator {
    /// `DeviceCachingAllocator::malloc(size_t, cudaStream_t)`, returning
    /// the `Block *` handed out.
    pub const MALLOC: &str =
        "_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator6mallocEmP11CUstream_st";
    /// `DeviceCachingAllocator::free(Block *)`.
    pub const FREE: &str = "_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator4freeEPNS2_12_GLOBAL__N_15BlockE";
    /// The library that defines them, unexported (its full symbol table).
    pub const LIBRARY_PREFIX: &str = "libc10_cuda.so";
    /// `Block::size`: the bytes `torch.cuda.memory_allocated()` counts
    /// (the request rounded up, or the whole block when it is not split).
    pub const BLOCK_SIZE: u64 = 0x38;
    /// `Block::ptr`: the device address.
    pub const BLOCK_ADDRESS: u64 = 0x50;
    /// `Block::allocated`: 1 while a tensor holds the block.
    pub const BLOCK_ALLOCATED: u64 = 0x58;
    /// Every block is a multiple of this (`kMinBlockSize`).
    pub const MIN_BLOCK_BYTES: u64 = 512;
    /// Set in a block's LIVE address: blocks are kept apart from the
    /// gpu-device segments they are carved from (a segment's first block
    /// starts at the segment's address). Device addresses stay below 2^47.
    pub const ADDRESS_TAG: u64 = 1 << 63;

    /// Whether what was read from a `Block` is one handed to a tensor:
    /// allocated, at an address, of a whole number of minimal blocks. A
    /// PyTorch whose `Block` moved its fields fails this (counted as
    /// `gpu_tensor_block_unreadable`) instead of counting garbage.
    pub const fn is_handed_out(size: u64, address: u64, allocated: u8) -> bool {
        allocated == 1
            && address != 0
            && address < ADDRESS_TAG
            && size != 0
            && size.is_multiple_of(MIN_BLOCK_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::gpu_api::*;
    use super::*;

    #[test]
    fn a_handed_out_block_is_allocated_and_whole() {
        use caching_allocator::is_handed_out;
        assert!(is_handed_out(64 << 20, 0x7f00_0000_0000, 1));
        assert!(is_handed_out(512, 0x7f00_0000_0200, 1));
        assert!(!is_handed_out(512, 0x7f00_0000_0200, 0), "free block");
        assert!(
            !is_handed_out(4, 0x7f00_0000_0200, 1),
            "a request, not a block"
        );
        assert!(!is_handed_out(0, 0x7f00_0000_0200, 1));
        assert!(!is_handed_out(512, 0, 1));
        assert!(!is_handed_out(512, caching_allocator::ADDRESS_TAG, 1));
    }

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
