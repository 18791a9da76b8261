//! The symbolizer's side of the runtime seam: names of JIT-compiled code,
//! which no file on disk has, given by the runtime that compiled it
//! (`runtimes::jit`: the perf maps Node, Java and Python 3.12 write). The
//! symbolizer asks them for an address no object names.

/// Names a runtime gives its JIT code.
pub trait JitNames: Send {
    /// Reads what `pid`'s runtime said since the last call; called while
    /// the process lives, at each refresh of its mappings.
    fn refresh(&mut self, pid: u32);
    /// The JIT function at `address` in `pid`, if its runtime named it.
    fn name(&self, pid: u32, address: u64) -> Option<String>;
    /// Forgets a process that exited (`--comm`: a service restarted for
    /// days must not keep every run's names).
    fn forget(&mut self, pid: u32);
}
