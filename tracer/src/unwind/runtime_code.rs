//! The unwinder's side of the runtime seam: code a language runtime
//! generates and walks its own way (Go's, set up with frame pointers the
//! prologue check does not know, and calling C on another stack).
//!
//! A runtime (`crate::runtimes`, above this layer) implements
//! [`RuntimeCode`] and is registered once, at start
//! (`runtimes::register`); the unwinder then asks each registered runtime
//! which objects it built ([`ManagedCode`], read with the object), how
//! their code switches stacks to call native code (for the kernel's copy),
//! and for a walker of their frames in a copied stack ([`CodeWalker`]).
//! Nothing here names a runtime.
use std::{ops::Range, sync::OnceLock};

use framehop::{FrameAddress, x86_64::UnwindRegsX86_64};
use tracer_ebpf::GoStackSwitch;

use super::{MAX_FRAMES, ObjectInfo, Unwound};

/// A language runtime's code, as the unwinder needs it.
pub trait RuntimeCode: Send + Sync {
    /// Whether the runtime built `elf`, and where its own code lies.
    fn recognize(&self, elf: &object::File<'_>) -> Option<ManagedCode>;
    /// How the runtime's code in `object` (one it recognized) calls
    /// native code on the thread's system stack, in object addresses;
    /// None when it does not (or cannot be read).
    fn stack_switch(&self, object: &ObjectInfo) -> Option<GoStackSwitch>;
    /// A walker of the runtime's frames in `object` (one it recognized),
    /// mapped with its address 0 at `base`.
    fn walker(&self, object: &ObjectInfo, base: u64) -> Option<Box<dyn CodeWalker>>;
}

/// The code of a runtime in an object: all of it keeps frame pointers,
/// set up the runtime's own way; native code linked in beside it (cgo's C)
/// lies outside `text` and is checked as any other.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ManagedCode {
    /// The registered runtime that recognized it (its index).
    pub runtime: usize,
    /// The runtime's code, in object addresses; None when the object
    /// does not say (then all of it is the runtime's).
    pub text: Option<Range<u64>>,
}

/// Walks a runtime's frames in a copied stack.
pub trait CodeWalker: Send + Sync {
    /// Whether `address` lies in the runtime's code.
    fn contains(&self, address: u64) -> bool;
    /// The runtime's frames from `frame` (a return address into its code,
    /// kept already) outwards, kept in `unwound` (with
    /// [`Unwound::keep`]); `regs` are the registers in that frame.
    /// Returns the native caller and its registers when its code returns
    /// into native code, for the native frames to be unwound from their
    /// unwind information; None when the walk ends here (`unwound` says
    /// why, when it stopped early).
    fn walk(
        &self,
        stack: &dyn CopiedStack,
        frame: u64,
        regs: UnwindRegsX86_64,
        unwound: &mut Unwound,
    ) -> Option<(FrameAddress, UnwindRegsX86_64)>;
}

/// The memory of one copied stack, as a walker reads it.
pub trait CopiedStack {
    /// The word at `address`, in either copied stack.
    fn read(&self, address: u64) -> Option<u64>;
    /// Whether `address`, unreadable, lies beyond a copy that stopped at
    /// its size limit: the stack goes on there.
    fn beyond_copy(&self, address: u64) -> bool;
    /// The stack pointer of the stack switched from, at the switch whose
    /// call into native code has its CFA at `cfa` (`switch` read from the
    /// runtime's code).
    fn switched_from_sp(&self, switch: &GoStackSwitch, cfa: u64) -> Option<u64>;
}

impl Unwound {
    /// Keeps `address` as the next frame; false once the stack is as deep
    /// as a stack is kept.
    pub fn keep(&mut self, address: u64) -> bool {
        self.addresses.push(address);
        self.addresses.len() < MAX_FRAMES
    }
}

static REGISTERED: OnceLock<Vec<&'static dyn RuntimeCode>> = OnceLock::new();

/// Registers the runtimes whose code the unwinder knows; the first call
/// decides (later ones, the same list, change nothing).
pub fn register(runtimes: Vec<&'static dyn RuntimeCode>) {
    let _ = REGISTERED.set(runtimes);
}

/// The runtimes registered (none before [`register`]).
fn registered() -> &'static [&'static dyn RuntimeCode] {
    REGISTERED.get().map_or(&[], Vec::as_slice)
}

/// The runtime that built `elf`, if one registered did.
pub(super) fn recognize(elf: &object::File<'_>) -> Option<ManagedCode> {
    registered()
        .iter()
        .enumerate()
        .find_map(|(index, runtime)| {
            let mut code = runtime.recognize(elf)?;
            code.runtime = index;
            Some(code)
        })
}

/// The walker of `object`'s runtime code, mapped at `base`.
pub(super) fn walker(object: &ObjectInfo, base: u64) -> Option<Box<dyn CodeWalker>> {
    let managed = object.managed.as_ref()?;
    registered().get(managed.runtime)?.walker(object, base)
}

/// How `object`'s runtime code switches stacks to call native code, in
/// object addresses.
pub(super) fn object_stack_switch(object: &ObjectInfo) -> Option<GoStackSwitch> {
    let managed = object.managed.as_ref()?;
    registered().get(managed.runtime)?.stack_switch(object)
}
