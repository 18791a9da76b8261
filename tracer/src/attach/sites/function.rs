//! A function tracer hooks (an allocator, a CUDA entry point, a runtime's
//! family: `family`) and the eBPF programs that trace it.
use tracer_ebpf::program;

use crate::model::allocators::{Allocator, AllocatorCall};

/// The return program shared by the malloc family.
const ALLOC_RETURN_PROGRAM: &str = program::ALLOC_RETURN;

/// A hooked function and the eBPF programs that trace it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookedFunction {
    pub name: &'static str,
    /// The uprobe program at its entry, where the arguments are needed.
    pub entry_program: Option<&'static str>,
    /// The uretprobe program, where the result is needed.
    pub return_program: Option<&'static str>,
    /// Attach cookie of the entry probe (CUDA: API and memory kind).
    pub cookie: u64,
}

impl HookedFunction {
    /// An allocator function, traced by the entry program of its call's
    /// shape (tracer-ebpf's malloc programs).
    pub const fn allocator(allocator: &Allocator) -> HookedFunction {
        let (entry_program, has_return) = match allocator.call {
            AllocatorCall::Malloc => (program::MALLOC_ENTER, true),
            AllocatorCall::Calloc => (program::CALLOC_ENTER, true),
            AllocatorCall::Realloc => (program::REALLOC_ENTER, true),
            AllocatorCall::ReallocArray => (program::REALLOCARRAY_ENTER, true),
            AllocatorCall::Free => (program::FREE_ENTER, false),
            AllocatorCall::PosixMemalign => (program::POSIX_MEMALIGN_ENTER, true),
            AllocatorCall::Aligned => (program::ALIGNED_ENTER, true),
            AllocatorCall::Pvalloc => (program::PVALLOC_ENTER, true),
        };
        HookedFunction {
            name: allocator.name,
            entry_program: Some(entry_program),
            return_program: if has_return {
                Some(ALLOC_RETURN_PROGRAM)
            } else {
                None
            },
            cookie: 0,
        }
    }
}
