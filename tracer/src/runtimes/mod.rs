//! The language runtimes tracer understands, one folder each: what a
//! runtime needs from the lower layers is asked through a seam each of
//! them defines, and implemented here; what the collector asks of it
//! through a run is [`Runtime`].
//!
//! - the unwinder's seam: `unwind::runtime_code` (which objects a runtime
//!   built, how its code switches stacks to call native code, a walker of
//!   its frames in a copied stack): Go (`go/`).
//! - attach's allocator seam: `attach::family` (a family of functions a
//!   runtime allocates with, where its symbols hide, their arguments and
//!   throws): PyTorch's caching allocator (`torch/`), CPython's
//!   (`python/objects.rs`, hooked on request: `--python-objects`); and
//!   where a runtime installs libraries (`python/wheels.rs`).
//! - the holders scan's: `holders::runtime_heaps::RuntimeHeap` (the live
//!   objects of a runtime's own allocator): pymalloc (`python/pools.rs`).
//! - the symbolizer's: `symbolize::jit::JitNames` (names of JIT code): the
//!   perf maps JIT runtimes write (`jit/`).
//! - the collector's: [`Runtime`] (found in a target before its
//!   allocators are hooked, attached after, looked at again after an
//!   exec, kept current at each snapshot, its notes at the end): CPython
//!   (`python/`, with its kernel maps in `python/kernel.rs`); and
//!   [`StoredStacks`], the stacks of a runtime's frames its kernel program
//!   stores apart from the native stack, which the collector's stack
//!   table holds and merges in: CPython's (`python/mod.rs`' `Stacks`).
//!
//! [`register`], [`jit_names`], [`heaps`] and [`Runtimes`] are the
//! registrations: a new runtime is
//! a folder here (and, for what the kernel must know, a file in
//! `tracer-ebpf/src/`) plus a line in each. docs/development.md ("Adding
//! a runtime") walks through them.
pub mod go;
pub mod jit;
pub mod python;
pub mod torch;

use anyhow::Result;

use crate::{
    attach::Probes,
    config::PythonOptions,
    model::{Frame, run::NoticedBy},
};

/// Registers every runtime with the layers below that ask them; before
/// any object of a target is read (`main`, and `Collector::new` for the
/// library's users). Later calls change nothing.
pub fn register() {
    crate::unwind::runtime_code::register(vec![&go::Go]);
    crate::attach::sites::family::register(crate::attach::sites::family::Registration {
        families: vec![&torch::CACHING_ALLOCATOR, &python::objects::OBJECTS],
        library_dirs: vec![python::wheels::wheel_dirs],
    });
}

/// The namers of JIT code, for a new symbolizer.
pub fn jit_names() -> Vec<Box<dyn crate::symbolize::jit::JitNames>> {
    vec![Box::new(jit::PerfMaps::default())]
}

/// The runtimes' heaps (their own allocators' objects, their objects by
/// type), for the holders scan.
pub fn heaps() -> Vec<&'static dyn crate::holders::runtime_heaps::RuntimeHeap> {
    vec![&python::heap::PythonHeap]
}

/// A language runtime through a run, as the collector drives it: each
/// call gets the probes (to set the runtime's kernel maps, or hook its
/// allocator) and, where it has something to say, `notices`, lines the
/// collector passes on (warnings, "frames on from now").
pub trait Runtime {
    /// Before the allocator probes of `pid` are attached: finds the
    /// runtime in it and tells the kernel what its walk needs, so that
    /// the first allocations get its frames. An error stops the attach
    /// (the runtime was asked for and is not there).
    fn detect(&mut self, pid: u32, probes: &mut Probes, notices: &mut Vec<String>) -> Result<()>;
    /// After the allocator probes of `pid`: hooks what the runtime
    /// allocates with. A failure is a notice.
    fn attach(
        &mut self,
        pid: u32,
        probes: &mut Probes,
        noticed_by: NoticedBy,
        notices: &mut Vec<String>,
    );
    /// `pid` replaced its image (in spawn mode, while the loader gate
    /// holds the new image, so that its first allocations get the
    /// runtime's frames).
    fn after_exec(
        &mut self,
        pid: u32,
        probes: &mut Probes,
        noticed_by: NoticedBy,
        notices: &mut Vec<String>,
    );
    /// At each snapshot: keeps what the kernel knows of the `live`
    /// targets current, and finds the runtime in those that loaded it
    /// since.
    fn tick(&mut self, live: &[u32], probes: &mut Probes, notices: &mut Vec<String>);
    /// At the end, before the last snapshot.
    fn finish(&mut self, probes: &mut Probes, notices: &mut Vec<String>);
    /// The runtime's part of the attach line, if it has one.
    fn summary(&self) -> Option<String>;
    /// Lines printed after the attach line (targets it cannot read).
    fn attach_notes(&self) -> Vec<String>;
}

/// The runtimes a run drives, one field each.
pub struct Runtimes {
    pub python: python::Python,
}

impl Runtimes {
    pub fn new(python: PythonOptions) -> Runtimes {
        Runtimes {
            python: python::Python::new(python),
        }
    }

    /// Each runtime, in the order they are asked.
    pub fn each(&mut self) -> [&mut dyn Runtime; 1] {
        [&mut self.python]
    }

    /// The same, to read.
    pub fn each_ref(&self) -> [&dyn Runtime; 1] {
        [&self.python]
    }

    /// The runtime whose kernel program stores stacks (one: the tag a
    /// native stack ends with names one table, PYTHON_STACKS).
    pub fn stored_stacks(&mut self) -> &mut dyn StoredStacks {
        &mut self.python.stacks
    }

    /// `frames` with the stored stack their tag frame names merged in;
    /// `resolve` names a stored stack the runtime does not know yet
    /// (from the kernel's tables).
    pub fn merge_stored(
        &mut self,
        pid: u32,
        frames: Vec<Frame>,
        resolve: impl FnOnce(&mut dyn StoredStacks, u32),
    ) -> Vec<Frame> {
        self.python.merge(pid, frames, resolve)
    }
}

/// The stacks of a runtime's own frames that its kernel program stores
/// apart from the native stack (CPython's, walked from the thread state
/// into PYTHON_STACKS), each native stack tagged with its stored stack's
/// id as its last frame ([`stored_stack_tag`]). The collector holds the
/// ids in its stack table beside the native ones (learnt, unlinked and
/// evicted the same way: `collect::stack_table`) and asks the runtime to
/// name them.
pub trait StoredStacks {
    /// Whether no process runs the runtime (no stored stack to name).
    fn is_empty(&self) -> bool;
    /// Whether `pid` runs it.
    fn runs_in(&self, pid: u32) -> bool;
    /// Names stored stack `id` of `pid` from what the kernel stored,
    /// while the process lives.
    fn resolve(&mut self, pid: u32, id: u32, stack: &tracer_ebpf::PythonStack);
    /// Whether stack `id` of `pid` was named already.
    fn knows(&self, pid: u32, id: u32) -> bool;
    /// Whether named stack `id` of `pid` reaches where the runtime started
    /// it (not cut, its outermost frame the runtime's start); None: not
    /// named.
    fn reaches_start(&self, pid: u32, id: u32) -> Option<bool>;
    /// Forgets stack `id` of `pid`: the kernel evicted it, and the id
    /// will name other frames.
    fn forget(&mut self, pid: u32, id: u32);
}

/// The stored stack a native stack's frames end with (its tag), if any.
pub fn stored_stack_tag(addresses: &[u64]) -> Option<u32> {
    addresses
        .last()
        .and_then(|&last| tracer_ebpf::python_stack_of_frame(last))
}

/// The tag frame of stored stack `id`, as a native stack ends with it.
pub fn stored_stack_frame(id: u32) -> u64 {
    tracer_ebpf::PYTHON_FRAME_TAG | u64::from(id)
}

/// Whether `address` is a stored stack's tag, not a return address.
pub fn is_stored_stack_tag(address: u64) -> bool {
    tracer_ebpf::python_stack_of_frame(address).is_some()
}

/// A stack's return addresses without its stored stack's tag frame.
pub fn without_stored_tag(mut addresses: Vec<u64>) -> Vec<u64> {
    addresses.retain(|&address| !is_stored_stack_tag(address));
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored stack's tag frame names it, and is no return address.
    #[test]
    fn a_tag_frame_names_its_stored_stack() {
        let tag = stored_stack_frame(7);
        assert!(is_stored_stack_tag(tag));
        assert_eq!(stored_stack_tag(&[0x40_1000, 0x40_2000, tag]), Some(7));
        assert_eq!(stored_stack_tag(&[0x40_1000, 0x40_2000]), None);
        assert_eq!(stored_stack_tag(&[]), None);
        assert_eq!(
            without_stored_tag(vec![0x40_1000, tag]),
            vec![0x40_1000],
            "the tag is no return address"
        );
    }
}
