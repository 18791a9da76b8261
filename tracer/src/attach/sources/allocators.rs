//! The allocator calls: malloc, free and their family (`model::allocators`
//! names them and their call shapes; tracer-ebpf/src/malloc.rs has one
//! program per shape) in whichever object defines them, and the families
//! runtimes register (`sites::family`), looked up in every object.
use super::Source;
use crate::{
    attach::sites::{family, function::HookedFunction},
    model::allocators::all_allocators,
};

/// The allocator calls.
pub struct AllocatorCalls;

impl Source for AllocatorCalls {
    fn name(&self) -> &'static str {
        "allocator calls"
    }

    fn functions(&self) -> Vec<HookedFunction> {
        all_allocators()
            .map(HookedFunction::allocator)
            .chain(family::everywhere())
            .collect()
    }
}
