//! PENDING: the malloc family's allocator call in progress on each thread.
//! The malloc programs keep it; the signal tracepoints set it aside around
//! a handler, and the mapping tracepoints read it to tell an allocator's
//! own mappings apart.
use aya_ebpf::{macros::map, maps::LruHashMap};
use tracer_ebpf::Pending;

/// Per thread (pid_tgid): the allocator call in progress. LRU, so the
/// entries of threads that exited make room by themselves.
#[map]
pub(crate) static PENDING: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(16384, 0);
