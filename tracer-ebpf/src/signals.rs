//! Signal handlers that interrupt an allocator call on their own thread.
//!
//! Only the outermost allocator call on a thread counts (see `malloc.rs`), so
//! a handler that allocates while its thread is inside malloc would see its
//! malloc taken for an internal, nested call and lost. When the kernel
//! delivers a signal to a thread that has allocator state, that state is
//! set aside (one level per handler) and the handler starts with a clean
//! slate; when the handler returns through rt_sigreturn, the interrupted
//! call's state comes back. A handler that leaves by longjmp never returns
//! through rt_sigreturn: its level is restored at the thread's next
//! sigreturn, and the rare mix-up is bounded to that thread.
//!
//! Both tracepoints fire for every process on the machine, but do nothing
//! more than one hash lookup for threads tracer does not trace (only traced
//! threads have PENDING state).
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use tracer_ebpf::{Pending, SignalLevel, counted};

use crate::{pending::PENDING, runs::counted_run};

/// The allocator state of interrupted calls, per thread and handler level.
#[map]
static SIGNAL_SAVED: LruHashMap<SignalLevel, Pending> = LruHashMap::with_max_entries(4096, 0);

#[tracepoint]
pub fn signal_deliver(_ctx: TracePointContext) -> u32 {
    counted_run(counted::SIGNAL_DELIVER, || {
        let thread = bpf_get_current_pid_tgid();
        let Some(pending) = PENDING.get_ptr_mut(&thread) else {
            return 0;
        };
        let pending = unsafe { &mut *pending };
        let level = SignalLevel {
            thread,
            level: pending.signal_level,
            pad: 0,
        };
        if SIGNAL_SAVED.insert(&level, &*pending, 0).is_ok() {
            pending.signal_level += 1;
            pending.depth = 0;
            // The handler's own calls are not inside the interrupted ones.
            pending.unrecorded_sp = 0;
            pending.free_sp = 0;
        }
        0
    })
}

#[tracepoint]
pub fn signal_return(_ctx: TracePointContext) -> u32 {
    counted_run(counted::SIGNAL_RETURN, || {
        let thread = bpf_get_current_pid_tgid();
        let Some(pending) = PENDING.get_ptr_mut(&thread) else {
            return 0;
        };
        let pending = unsafe { &mut *pending };
        if pending.signal_level == 0 {
            return 0;
        }
        let level = SignalLevel {
            thread,
            level: pending.signal_level - 1,
            pad: 0,
        };
        if let Some(saved) = SIGNAL_SAVED.get_ptr(&level) {
            // The interrupted call's state, with the handler's random state
            // kept so sampling decisions never repeat.
            let random_state = pending.random_state;
            unsafe { *pending = *saved };
            pending.random_state = random_state;
            let _ = SIGNAL_SAVED.remove(&level);
        } else {
            pending.signal_level -= 1;
            pending.depth = 0;
        }
        0
    })
}
