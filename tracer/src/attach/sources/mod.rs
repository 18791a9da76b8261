//! The event sources: each kind of event tracer's kernel programs see in
//! a target. The allocator and CUDA calls are uprobes (`cuda` lists the
//! CUDA functions); the mapping calls are tracepoints (`mappings`); the
//! tasks followed processes fork are a tracepoint too (`forks`).
pub mod cuda;
pub(in crate::attach) mod forks;
pub mod mappings;
