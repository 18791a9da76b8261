//! The language runtimes tracer understands, one folder each: what a
//! runtime needs from the lower layers is asked through a seam each of
//! them defines, and implemented here.
//!
//! - the unwinder's: `unwind::runtime_code` (which objects a runtime
//!   built, how its code switches stacks to call native code, a walker of
//!   its frames in a copied stack): Go (`go/`).
//!
//! [`register`] is the one registration: a new runtime is a folder here
//! (and, for what the kernel must know, a file in `tracer-ebpf/src/`)
//! plus a line in it. docs/development.md ("Adding a runtime") walks
//! through one.
pub mod go;

/// Registers every runtime with the layers that ask them; before any
/// object of a target is read (`main`, and `Collector::new` for the
/// library's users). Later calls change nothing.
pub fn register() {
    crate::unwind::runtime_code::register(vec![&go::Go]);
}
