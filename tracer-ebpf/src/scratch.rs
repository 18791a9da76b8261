//! STACK_SCRATCH: per CPU, where a user stack is walked (by frame
//! pointers in `stacks.rs`, or through unwind tables in `unwind.rs`)
//! before it is looked up and stored. Below both, so that neither
//! imports the other for it.
use aya_ebpf::{macros::map, maps::PerCpuArray};
use tracer_ebpf::StackFrames;

/// Per CPU, where a stack is walked before it is looked up.
#[map]
static STACK_SCRATCH: PerCpuArray<StackFrames> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's stack scratch.
#[inline(always)]
pub(crate) fn scratch() -> Option<*mut StackFrames> {
    STACK_SCRATCH.get_ptr_mut(0)
}
