//! The CUDA driver and runtime functions tracer hooks, each with its eBPF
//! entry program (one per call shape, see tracer-ebpf's `gpu.rs`) and the
//! attach cookie that tells that program which API it is on and which kind
//! of memory the call hands out.
//!
//! They are looked up like the allocator functions, in every mapped object:
//! the runtime may be a system library, a pip wheel's, or linked into a
//! framework's own shared object. `cuMemAddressReserve` is not hooked: it
//! reserves address space, not memory. Context destruction and reset are
//! hooked too: they release the memory the context owns without a free.
//!
//! PyTorch's caching allocator, which hands tensors blocks of the
//! segments it cudaMallocs, is a runtime's family (`runtimes::torch`,
//! through `family`).
use aya::Ebpf;
use tracer_ebpf::{
    ByStackKey, GPU_API_NAMES, LiveKey, VmmHandle, gpu_api as api, gpu_cookie, kind, map, program,
};

use super::{Source, remove_entries};
use crate::attach::sites::function::HookedFunction;

/// The CUDA calls.
pub struct CudaCalls;

impl Source for CudaCalls {
    fn name(&self) -> &'static str {
        "CUDA calls"
    }

    fn functions(&self) -> Vec<HookedFunction> {
        CUDA_FUNCTIONS.to_vec()
    }

    /// The virtual memory handles and mappings (cuMemCreate, cuMemMap)
    /// and the API of each GPU stack.
    fn forget(&self, ebpf: &mut Ebpf, pid: u32) {
        remove_entries::<LiveKey, VmmHandle>(ebpf, map::VMM_HANDLES, |key| key.tgid == pid);
        remove_entries::<LiveKey, u64>(ebpf, map::VMM_MAPPINGS, |key| key.tgid == pid);
        remove_entries::<ByStackKey, u32>(ebpf, map::STACK_API, |key| key.tgid == pid);
    }
}

/// The return program shared by every CUDA function.
const GPU_RETURN_PROGRAM: &str = program::GPU_RETURN;

/// A CUDA function handing out memory of `memory_kind`, or, for frees,
/// unmaps, releases and context destructions, taking it back
/// (`memory_kind` is then unused).
const fn cuda(api_id: u32, entry_program: &'static str, memory_kind: u32) -> HookedFunction {
    HookedFunction {
        name: GPU_API_NAMES[api_id as usize],
        entry_program: Some(entry_program),
        return_program: Some(GPU_RETURN_PROGRAM),
        cookie: gpu_cookie(api_id, memory_kind),
    }
}

const DEVICE: u32 = kind::GPU_DEVICE;
const MANAGED: u32 = kind::GPU_MANAGED;
const PINNED: u32 = kind::GPU_HOST_PINNED;

/// Whether `name` is one of the CUDA calls this source traces.
pub fn is_cuda_function(name: &str) -> bool {
    CUDA_FUNCTIONS.iter().any(|function| function.name == name)
}

pub const CUDA_FUNCTIONS: [HookedFunction; api::COUNT as usize] = [
    cuda(api::CUDA_MALLOC, program::GPU_ALLOC_ENTER, DEVICE),
    cuda(api::CUDA_MALLOC_MANAGED, program::GPU_ALLOC_ENTER, MANAGED),
    cuda(api::CUDA_MALLOC_HOST, program::GPU_ALLOC_ENTER, PINNED),
    cuda(api::CUDA_HOST_ALLOC, program::GPU_ALLOC_ENTER, PINNED),
    cuda(api::CUDA_MALLOC_PITCH, program::GPU_PITCH_ENTER, DEVICE),
    cuda(api::CUDA_MALLOC_ASYNC, program::GPU_ALLOC_ENTER, DEVICE),
    cuda(
        api::CUDA_MALLOC_FROM_POOL_ASYNC,
        program::GPU_ALLOC_ENTER,
        DEVICE,
    ),
    cuda(api::CUDA_FREE, program::GPU_FREE_ENTER, DEVICE),
    cuda(api::CUDA_FREE_HOST, program::GPU_FREE_ENTER, PINNED),
    cuda(api::CUDA_FREE_ASYNC, program::GPU_FREE_ENTER, DEVICE),
    cuda(api::CU_MEM_ALLOC, program::GPU_ALLOC_ENTER, DEVICE),
    cuda(api::CU_MEM_ALLOC_PITCH, program::GPU_PITCH_ENTER, DEVICE),
    cuda(api::CU_MEM_ALLOC_MANAGED, program::GPU_ALLOC_ENTER, MANAGED),
    cuda(api::CU_MEM_ALLOC_HOST, program::GPU_ALLOC_ENTER, PINNED),
    cuda(api::CU_MEM_HOST_ALLOC, program::GPU_ALLOC_ENTER, PINNED),
    cuda(api::CU_MEM_ALLOC_ASYNC, program::GPU_ALLOC_ENTER, DEVICE),
    cuda(
        api::CU_MEM_ALLOC_FROM_POOL_ASYNC,
        program::GPU_ALLOC_ENTER,
        DEVICE,
    ),
    cuda(api::CU_MEM_FREE, program::GPU_FREE_ENTER, DEVICE),
    cuda(api::CU_MEM_FREE_HOST, program::GPU_FREE_ENTER, PINNED),
    cuda(api::CU_MEM_FREE_ASYNC, program::GPU_FREE_ENTER, DEVICE),
    cuda(api::CU_MEM_CREATE, program::GPU_CREATE_ENTER, DEVICE),
    cuda(api::CU_MEM_RELEASE, program::GPU_RELEASE_ENTER, DEVICE),
    cuda(api::CU_MEM_MAP, program::GPU_MAP_ENTER, DEVICE),
    cuda(api::CU_MEM_UNMAP, program::GPU_UNMAP_ENTER, DEVICE),
    cuda(api::CU_CTX_DESTROY, program::GPU_CONTEXT_ENTER, DEVICE),
    cuda(
        api::CU_DEVICE_PRIMARY_CTX_RESET,
        program::GPU_CONTEXT_ENTER,
        DEVICE,
    ),
    cuda(api::CUDA_DEVICE_RESET, program::GPU_CONTEXT_ENTER, DEVICE),
];

/// The name of a `gpu_api` id, `None` for one this build does not know.
pub fn api_name(api_id: u32) -> Option<&'static str> {
    GPU_API_NAMES.get(api_id as usize).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_is_hooked_once_under_its_own_name() {
        for (index, function) in CUDA_FUNCTIONS.iter().enumerate() {
            assert_eq!(function.name, GPU_API_NAMES[index]);
            assert_eq!(function.cookie as u32, index as u32, "{}", function.name);
        }
        assert_eq!(api_name(api::CU_MEM_CREATE), Some("cuMemCreate"));
        assert_eq!(api_name(api::COUNT), None);
    }

    #[test]
    fn cookies_carry_the_memory_kind() {
        let kind_of = |name: &str| {
            let function = CUDA_FUNCTIONS.iter().find(|f| f.name == name).unwrap();
            (function.cookie >> 32) as u32
        };
        assert_eq!(kind_of("cudaMallocHost"), kind::GPU_HOST_PINNED);
        assert_eq!(kind_of("cuMemAllocManaged"), kind::GPU_MANAGED);
        assert_eq!(kind_of("cuMemAllocPitch_v2"), kind::GPU_DEVICE);
    }

    #[test]
    fn stream_ordered_and_vmm_memory_outlive_contexts() {
        let outliving: Vec<&str> = CUDA_FUNCTIONS
            .iter()
            .map(|function| function.cookie as u32)
            .filter(|&api_id| !api::owned_by_context(api_id))
            .filter_map(api_name)
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
}
