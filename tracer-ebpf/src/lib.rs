//! The ABI shared by the eBPF programs (`src/main.rs`) and userspace
//! (`tracer`): map keys and values, counter indices, the probe kinds, and
//! the names of the object's maps and programs. One module per topic under
//! `abi/`, all re-exported here.
//!
//! Every type is `#[repr(C)]`, made of plain integers and has no padding
//! holes, so the kernel and userspace agree on its bytes.
#![cfg_attr(not(test), no_std)]

/// Defines ids numbered from 0 in the order listed: one `u32` constant per
/// id, `COUNT`, and the array `$table` of what each id stands for, by
/// index. One list, so an id and its entry cannot drift apart.
macro_rules! id_table {
    (
        $(#[$table_doc:meta])*
        $table:ident: [$entry:ty] {
            $($(#[$doc:meta])* $id:ident => $value:expr,)*
        }
    ) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[repr(u32)]
        enum Id {
            $($id,)*
            COUNT,
        }
        $($(#[$doc])* pub const $id: u32 = Id::$id as u32;)*
        pub const COUNT: u32 = Id::COUNT as u32;
        $(#[$table_doc])*
        pub const $table: [$entry; COUNT as usize] = [$($value,)*];
    };
}

mod abi {
    pub mod events;
    pub mod exceptions;
    pub mod gpu;
    pub mod live;
    pub mod malloc;
    pub mod mappings;
    pub mod names;
    pub mod python;
    pub mod runs;
    pub mod sampling;
    pub mod stacks;
    pub mod stats;
    pub mod unwind;
    pub mod unwind_walk;
}

pub use abi::{
    events::*, exceptions::*, gpu::*, live::*, malloc::*, mappings::*, names::*, python::*,
    runs::*, sampling, stacks::*, stats::*, unwind::*, unwind_walk,
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for UnwindRow {}
    unsafe impl aya::Pod for UnwindMapping {}
    unsafe impl aya::Pod for UnwindMappings {}
    unsafe impl aya::Pod for UnwindTable {}
    unsafe impl aya::Pod for LiveKey {}
    unsafe impl aya::Pod for LiveAlloc {}
    unsafe impl aya::Pod for ByStackKey {}
    unsafe impl aya::Pod for StackTotals {}
    unsafe impl aya::Pod for Pending {}
    unsafe impl aya::Pod for SignalLevel {}
    unsafe impl aya::Pod for GpuPending {}
    unsafe impl aya::Pod for VmmHandle {}
    unsafe impl aya::Pod for RareEvent {}
    unsafe impl aya::Pod for OpenedFile {}
    unsafe impl aya::Pod for SyscallFieldOffsets {}
    unsafe impl aya::Pod for MappingEvent {}
    unsafe impl aya::Pod for StackCopy {}
    unsafe impl aya::Pod for GoStackSwitch {}
    unsafe impl aya::Pod for StackFree {}
    unsafe impl aya::Pod for CopyRef {}
    unsafe impl aya::Pod for StackFrames {}
    unsafe impl aya::Pod for PythonStack {}
    unsafe impl aya::Pod for PythonOffsets {}
    unsafe impl aya::Pod for PythonThreadMiss {}
    unsafe impl aya::Pod for ReturnSlot {}
    unsafe impl aya::Pod for ExceptionUnwind {}
    unsafe impl aya::Pod for ProgramRuns {}
    unsafe impl aya::Pod for ReturnInstanceOffsets {}
}
