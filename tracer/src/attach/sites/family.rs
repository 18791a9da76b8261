//! The allocator seam: a family of functions a runtime or library
//! allocates with, beyond the allocators and CUDA entry points attach
//! knows itself (`symbols::hooked_functions`), described once: what to
//! look for, where its symbols hide, what each function's arguments and
//! throws are; and where a runtime installs libraries its programs may
//! load ([`library_dirs`]). A runtime (`crate::runtimes`, above this layer) registers
//! its families once, at start (`runtimes::register`: PyTorch's caching
//! allocator is `runtimes::torch`); the site search, the prologue check
//! and the held-back throwing returns ask them. Nothing here names one.
use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::attach::sites::function::HookedFunction;

/// A family of hooked functions.
#[derive(Debug)]
pub struct HookFamily {
    /// What the family is, for messages.
    pub name: &'static str,
    /// Its functions, each with its eBPF programs.
    pub functions: &'static [HookedFunction],
    /// Looked for in every object a target maps (else hooked on request,
    /// by the runtime, in the objects it names: `--python-objects`).
    pub everywhere: bool,
    /// Its entry programs read arguments a prologue may move (the malloc
    /// family's programs do: the moved registers go in the cookie).
    pub reads_moved_arguments: bool,
    /// Whether the file named so may define them unexported (only its
    /// full symbol table lists them); other files are searched in their
    /// dynamic symbol table alone.
    pub unexported_in: Option<fn(&str) -> bool>,
    /// Said when such a file lists none of them (a stripped build).
    pub missing: &'static str,
    /// Integer arguments of each function (`prologue::argument_registers`).
    pub signatures: &'static [(&'static str, usize)],
    /// The return-probed ones that can throw (`held_back`).
    pub throwing: &'static [&'static str],
}

impl HookFamily {
    pub fn contains(&self, function: &HookedFunction) -> bool {
        self.functions.contains(function)
    }
}

/// What the runtimes give attach, once, at start.
pub struct Registration {
    /// The families they hook.
    pub families: Vec<&'static HookFamily>,
    /// Where they install libraries their programs may load.
    pub library_dirs: Vec<LibraryDirs>,
}

static REGISTERED: OnceLock<Registration> = OnceLock::new();

/// Registers what the runtimes give attach; the first call decides (later
/// ones, the same lists, change nothing).
pub fn register(registration: Registration) {
    let _ = REGISTERED.set(registration);
}

/// The families registered (none before [`register`]).
pub fn registered() -> &'static [&'static HookFamily] {
    REGISTERED
        .get()
        .map_or(&[], |registration| registration.families.as_slice())
}

/// The family that may define functions unexported in the file named
/// `file_name`, if one does.
pub fn unexported_in(file_name: &str) -> Option<&'static HookFamily> {
    registered().iter().copied().find(|family| {
        family
            .unexported_in
            .is_some_and(|defines| defines(file_name))
    })
}

/// The registered family `function` is of, if any.
pub fn of(function: &HookedFunction) -> Option<&'static HookFamily> {
    registered()
        .iter()
        .copied()
        .find(|family| family.contains(function))
}

/// The functions of the families looked for in every object.
pub fn everywhere() -> impl Iterator<Item = HookedFunction> {
    registered()
        .iter()
        .filter(|family| family.everywhere)
        .flat_map(|family| family.functions.iter().copied())
}

/// The argument count of `name`, if a registered family gives it.
pub fn signature(name: &str) -> Option<usize> {
    registered()
        .iter()
        .flat_map(|family| family.signatures)
        .find(|(function, _)| *function == name)
        .map(|&(_, count)| count)
}

/// Whether `name` is a registered family's function that can throw.
pub fn throws(name: &str) -> bool {
    registered()
        .iter()
        .any(|family| family.throwing.contains(&name))
}

/// Where a runtime installs libraries a target of it may load (Python's
/// nvidia wheels), from the target's executable: for the libraries hooked
/// ahead of their mapping (`ahead`).
pub type LibraryDirs = fn(pid: u32, executable: &Path) -> Vec<PathBuf>;

/// The directories every registered runtime gives for `executable`.
pub fn library_dirs(pid: u32, executable: &Path) -> Vec<PathBuf> {
    REGISTERED
        .get()
        .map_or(&[][..], |registration| registration.library_dirs.as_slice())
        .iter()
        .flat_map(|finder| finder(pid, executable))
        .collect()
}
