//! GPU_PENDING: the CUDA call in progress on each thread. The CUDA
//! programs (`gpu.rs`) keep it; the mapping tracepoints read it to tell
//! the driver's own mappings apart.
use aya_ebpf::{macros::map, maps::LruHashMap};
use tracer_ebpf::GpuPending;

/// Per thread (pid_tgid): the CUDA call in progress. LRU maps are always
/// preallocated: room for 4096 threads inside a CUDA call at once.
#[map]
pub(crate) static GPU_PENDING: LruHashMap<u64, GpuPending> = LruHashMap::with_max_entries(4096, 0);

/// Whether a traced CUDA call is in progress on this thread (its
/// mappings are the driver's: pinned host memory, counted as such).
#[inline(always)]
pub(crate) fn inside_gpu_call(thread: u64) -> bool {
    unsafe { GPU_PENDING.get(&thread) }.is_some_and(|pending| pending.depth > 0)
}
