//! The event-source seam: each kind of event tracer's kernel programs see
//! in a target is a [`Source`], listed once in [`SOURCES`]. Attach asks
//! them what to put on a process and what to take off when it is
//! forgotten; nothing else in attach names one.
//!
//! Every source feeds the collector through one interface, the kernel's
//! live set (tracer-ebpf/src/live.rs): its programs put each block they
//! see handed out in LIVE and add it to its stack's totals in BY_STACK
//! (by process, stack, memory kind and CUDA context epoch), take it off
//! when it is given back, and collect reads both at each snapshot
//! (`kernel_maps`). The one exception is where a block's end cannot be
//! known in the kernel: a mapping call may unmap part of several
//! mappings, so the mapping source sends its calls through a ring
//! (MAPPING_EVENTS) that collect drains into its ledger
//! (`collect::mappings`).
//!
//! - allocator calls (`allocators`): uprobes on malloc and its family in
//!   every object that defines them, and on the families runtimes register
//!   (`sites::family`: PyTorch's caching allocator);
//! - CUDA calls (`cuda`): uprobes on the driver's and runtime's allocation
//!   entry points;
//! - mapping calls (`mappings`): the mmap, munmap, mremap, brk and
//!   mprotect tracepoints, filtered in the kernel to the followed
//!   processes.
//!
//! - page faults (`faults`, `--resident` only): the followed processes'
//!   user page faults and madvise calls, through the mapping calls' ring
//!   and filter, charged to the stack that first touched each page
//!   (`model::resident`).
//!
//! The uprobe sources are attached together (`uprobes`: one reading of
//! each object's symbols for all of them). `forks` is not a source of
//! memory events: it announces the children of followed processes.
//!
//! A new source (page faults, a new API) is a program file in
//! tracer-ebpf/src/ that reports through the live set, a file here that
//! implements `Source`, and its entry in `SOURCES`.
use anyhow::Result;
use aya::{
    Ebpf, Pod,
    maps::{HashMap, MapData},
};

use crate::attach::sites::function::HookedFunction;

pub mod allocators;
pub mod cuda;
pub(in crate::attach) mod faults;
pub(in crate::attach) mod forks;
pub mod mappings;
pub(in crate::attach) mod uprobes;

/// A kind of event in a target, and what attach puts on a process to see
/// it.
pub trait Source: Sync {
    /// What it is, for messages.
    fn name(&self) -> &'static str;

    /// The functions it traces with uprobes, each with its programs:
    /// looked up in every object a target maps and in the libraries it
    /// maps later. None: it sees events of the kernel's.
    fn functions(&self) -> Vec<HookedFunction> {
        Vec::new()
    }

    /// Starts seeing `pid`'s events in the kernel (a tracepoint's filter),
    /// after its uprobes are in place.
    fn follow(&self, _ebpf: &mut Ebpf, _pid: u32) -> Result<()> {
        Ok(())
    }

    /// Removes what its own tables keep of `pid`, a process that exited
    /// and is forgotten (`--comm`); the live set's entries are removed
    /// for every source at once. Best effort: an entry already gone is
    /// fine.
    fn forget(&self, _ebpf: &mut Ebpf, _pid: u32) {}
}

/// Every source, in the order attach puts them on a process.
pub static SOURCES: [&dyn Source; 3] = [
    &allocators::AllocatorCalls,
    &cuda::CudaCalls,
    &mappings::MappingCalls,
];

/// The functions of every uprobe source.
pub fn traced_functions() -> impl Iterator<Item = HookedFunction> {
    SOURCES.iter().flat_map(|source| source.functions())
}

/// Removes the entries of the hash map `name` whose key `matches`: what a
/// source keeps of a forgotten process. A map missing or of another
/// shape is left alone (best effort, as `Source::forget` says).
pub(in crate::attach) fn remove_entries<K: Pod, V: Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    matches: impl Fn(&K) -> bool,
) {
    let Some(map) = ebpf.map_mut(name) else {
        return;
    };
    let Ok(mut table) = HashMap::<&mut MapData, K, V>::try_from(map) else {
        return;
    };
    let keys: Vec<K> = table
        .keys()
        .filter_map(Result::ok)
        .filter(|key| matches(key))
        .collect();
    for key in keys {
        let _ = table.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{attach::sources::cuda::CUDA_FUNCTIONS, model::allocators::all_allocators};

    /// Every allocator and CUDA function is traced once, by the source
    /// of its kind, and no source traces another's.
    #[test]
    fn each_function_is_traced_once_by_its_source() {
        let names = |source: &dyn Source| -> Vec<&str> {
            source
                .functions()
                .iter()
                .map(|function| function.name)
                .collect()
        };
        let allocators = names(&allocators::AllocatorCalls);
        let cuda = names(&cuda::CudaCalls);
        for allocator in all_allocators() {
            assert!(allocators.contains(&allocator.name), "{}", allocator.name);
            assert!(!cuda.contains(&allocator.name), "{}", allocator.name);
        }
        assert_eq!(
            cuda,
            CUDA_FUNCTIONS.iter().map(|f| f.name).collect::<Vec<_>>()
        );
        let traced: Vec<&str> = traced_functions().map(|function| function.name).collect();
        for name in allocators.iter().chain(&cuda) {
            assert_eq!(
                traced.iter().filter(|traced| *traced == name).count(),
                1,
                "{name}"
            );
        }
        assert!(names(&mappings::MappingCalls).is_empty());
        assert_eq!(
            SOURCES.map(|source| source.name()),
            ["allocator calls", "CUDA calls", "mapping calls"]
        );
    }
}
