//! PENDING: the malloc family's allocator call in progress on each thread.
//! The malloc programs keep it; the signal tracepoints set it aside around
//! a handler, and the mapping tracepoints read it to tell an allocator's
//! own mappings apart.
use aya_ebpf::{helpers::bpf_probe_read_user, macros::map, maps::LruHashMap};
use tracer_ebpf::Pending;

/// Per thread (pid_tgid): the allocator call in progress. LRU, so the
/// entries of threads that exited make room by themselves.
#[map]
pub(crate) static PENDING: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(16384, 0);

/// Whether a call entered with its stack pointer at `marked_sp` and the
/// return address `marked_return` there is still in progress when the
/// thread's stack pointer is `sp`: `sp` is below it and the word is still
/// in place (or the uprobe trampoline's, which a return probe writes over
/// it).
#[inline(always)]
pub(crate) fn still_inside(marked_sp: u64, marked_return: u64, sp: u64) -> bool {
    marked_sp != 0
        && sp < marked_sp
        && unsafe { bpf_probe_read_user(marked_sp as *const u64) }
            .is_ok_and(|word| word == marked_return || tracer_ebpf::is_uprobe_trampoline(word))
}

/// Whether the thread whose user stack pointer is `sp` is inside an
/// allocator call of the malloc family: an outermost call in progress
/// (recorded or not), an unrecorded call whose return was skipped, or a
/// free (which has no return probe) that has not returned yet.
#[inline(always)]
pub(crate) fn inside_allocator_call(pending: &Pending, sp: u64) -> bool {
    pending.depth > 0
        || still_inside(pending.unrecorded_sp, pending.unrecorded_return, sp)
        || still_inside(pending.free_sp, pending.free_return, sp)
}
