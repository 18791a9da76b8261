//! The ABI shared by the eBPF programs (`src/main.rs`) and userspace
//! (`tracer`): map keys and values, counter indices and the probe kinds.
//! One module per topic under `abi/`, all re-exported here.
//!
//! Every type is `#[repr(C)]`, made of plain integers and has no padding
//! holes, so the kernel and userspace agree on its bytes.
#![no_std]

mod abi {
    pub mod events;
    pub mod gpu;
    pub mod live;
    pub mod malloc;
    pub mod mappings;
    pub mod sampling;
    pub mod stacks;
    pub mod stats;
}

pub use abi::{events::*, gpu::*, live::*, malloc::*, mappings::*, sampling, stacks::*, stats::*};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for LiveKey {}
    unsafe impl aya::Pod for LiveAlloc {}
    unsafe impl aya::Pod for StackKey {}
    unsafe impl aya::Pod for StackTotals {}
    unsafe impl aya::Pod for Pending {}
    unsafe impl aya::Pod for GpuPending {}
    unsafe impl aya::Pod for VmmHandle {}
    unsafe impl aya::Pod for Event {}
    unsafe impl aya::Pod for SyscallFieldOffsets {}
    unsafe impl aya::Pod for MappingEvent {}
    unsafe impl aya::Pod for StackCopy {}
    unsafe impl aya::Pod for StackFree {}
}
