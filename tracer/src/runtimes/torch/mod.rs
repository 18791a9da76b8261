//! PyTorch's CUDA caching allocator: it hands tensors blocks of the
//! segments it cudaMallocs, so the segments (gpu-device, from the CUDA
//! entry points) say little of which tensors hold the memory. Its
//! `DeviceCachingAllocator::malloc` and `free`, unexported functions of
//! `libc10_cuda.so`, are hooked as a family of their own (the allocator
//! seam, `attach::family`), their blocks being the gpu-tensor kind: the
//! kernel side is `tracer-ebpf/src/tensors.rs` (the `Block` it reads,
//! `tracer_ebpf::caching_allocator`).
use tracer_ebpf::{caching_allocator, program};

use crate::attach::{sites::family::HookFamily, sites::function::HookedFunction};

/// The block `malloc` returns (no argument is needed: no entry program),
/// the block `free` takes.
const FUNCTIONS: [HookedFunction; 2] = [
    HookedFunction {
        name: caching_allocator::MALLOC,
        entry_program: None,
        return_program: Some(program::TENSOR_MALLOC_RETURN),
        cookie: 0,
    },
    HookedFunction {
        name: caching_allocator::FREE,
        entry_program: Some(program::TENSOR_FREE_ENTER),
        return_program: None,
        cookie: 0,
    },
];

/// Whether the file named `file_name` may define the caching allocator's
/// functions, which only its full symbol table lists.
fn may_define_caching_allocator(file_name: &str) -> bool {
    file_name.starts_with(caching_allocator::LIBRARY_PREFIX)
}

/// The caching allocator, as attach hooks it.
pub static CACHING_ALLOCATOR: HookFamily = HookFamily {
    name: "PyTorch's caching allocator",
    functions: &FUNCTIONS,
    everywhere: true,
    // Its programs read the `Block` (`tensors.rs`), not a moved argument.
    reads_moved_arguments: false,
    unexported_in: Some(may_define_caching_allocator),
    missing: "tensor blocks (gpu-tensor) are not followed, only the segments it allocates \
              (gpu-device)",
    // (this, size, stream), (this, block).
    signatures: &[(caching_allocator::MALLOC, 3), (caching_allocator::FREE, 2)],
    // malloc throws c10::OutOfMemoryError (`torch.cuda.OutOfMemoryError`).
    throwing: &[caching_allocator::MALLOC],
};

#[cfg(test)]
mod tests {
    use crate::attach::{sites::family, sites::prologue};

    #[test]
    fn the_caching_allocator_is_found_in_its_library_and_its_malloc_throws() {
        crate::runtimes::register();
        let family = family::unexported_in("libc10_cuda.so").expect("registered");
        assert_eq!(family.name, super::CACHING_ALLOCATOR.name);
        assert!(family::unexported_in("libc10.so").is_none());
        assert!(family::of(&super::FUNCTIONS[1]).is_some());
        assert!(family::throws(tracer_ebpf::caching_allocator::MALLOC));
        assert!(!family::throws(tracer_ebpf::caching_allocator::FREE));
        assert_eq!(
            prologue::argument_registers(tracer_ebpf::caching_allocator::MALLOC).len(),
            3
        );
    }
}
