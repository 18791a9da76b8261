//! C++ exceptions (and forced unwinds) through return-probed frames.
//!
//! A return probe replaces the return address of the probed call with the
//! address of the kernel's uprobe trampoline; an unwinder that meets that
//! address finds no unwind information for it and terminates the program
//! (`std::terminate`). So `unwind_start`, a uprobe on the unwinder's entry
//! points (`_Unwind_RaiseException`, `_Unwind_Resume_or_Rethrow`,
//! `_Unwind_ForcedUnwind`: rare calls, made only when something throws),
//! walks the thread's pending return instances (`current->utask->
//! return_instances`, at offsets userspace read from the kernel's BTF),
//! and, if any of their stack words still holds the trampoline, stops
//! the process (a SIGSTOP sent to the thread itself, delivered before the
//! unwinder's first instruction runs; its default action stops every
//! thread of the process), marks it held in EXCEPTION_HELD and sends the
//! words' addresses and original values to userspace (EXCEPTION_UNWINDS).
//! Userspace writes the original return addresses back and lets the
//! process go on (`tracer/src/attach/safety/exceptions.rs`). The kernel drops
//! the return instances left behind by itself at the next trampoline hit
//! below them, as it does after a longjmp.
//!
//! The kernel does not let a program write user memory here
//! (`bpf_probe_write_user` is refused under lockdown=integrity), and a
//! uprobe program cannot change registers: the write is userspace's.
//!
//! The thread's allocator call in progress (PENDING) will never see its
//! return: it is dropped (`calls_left_by_exception`), so a request that
//! threw is never counted.
use aya_ebpf::{
    Global,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_user, bpf_send_signal_thread,
    },
    macros::{map, uprobe},
    maps::{HashMap, RingBuf},
    programs::ProbeContext,
};
use tracer_ebpf::{
    ExceptionUnwind, RETURN_SLOTS, ReturnInstanceOffsets, ReturnSlot, counted, stat,
};

use crate::{counters::count, pending::PENDING, runs::counted_run};

const SIGSTOP: u32 = 19;

/// Where the pending return instances are, in this kernel's layout (set
/// at load time; all zero when unknown).
#[unsafe(no_mangle)]
static RETURN_INSTANCE_OFFSETS: Global<ReturnInstanceOffsets> =
    Global::new(ReturnInstanceOffsets {
        task_utask: 0,
        utask_return_instances: 0,
        instance_func: 0,
        instance_stack: 0,
        instance_original: 0,
        instance_next: 0,
    });

/// Unwinds whose return addresses userspace is to put back (woken at
/// once: the process is stopped meanwhile).
#[map]
static EXCEPTION_UNWINDS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Threads (pid_tgid) whose process this file stopped, with when
/// (`bpf_ktime_get_ns`): userspace, or its watchdog, resumes them.
#[map]
static EXCEPTION_HELD: HashMap<u64, u64> = HashMap::with_max_entries(1024, 0);

/// A kernel word at `address`, 0 when it cannot be read.
#[inline(always)]
fn kernel_word(address: u64) -> u64 {
    unsafe { bpf_probe_read_kernel(address as *const u64) }.unwrap_or(0)
}

#[uprobe]
pub fn unwind_start(_ctx: ProbeContext) -> u32 {
    counted_run(counted::UNWIND_START, || {
        let thread = bpf_get_current_pid_tgid();
        count(stat::EXCEPTION_UNWINDS);
        if let Some(pending) = PENDING.get_ptr_mut(&thread) {
            let pending = unsafe { &mut *pending };
            if pending.depth > 0 {
                count(stat::CALLS_LEFT_BY_EXCEPTION);
                pending.depth = 0;
            }
        }
        let offsets = RETURN_INSTANCE_OFFSETS.load();
        if !offsets.known() {
            return 0;
        }
        let task = unsafe { bpf_get_current_task() };
        let utask = kernel_word(task + offsets.task_utask as u64);
        if utask == 0 {
            return 0;
        }
        let mut instance = kernel_word(utask + offsets.utask_return_instances as u64);
        if instance == 0 {
            return 0;
        }
        let Some(mut entry) = EXCEPTION_UNWINDS.reserve::<ExceptionUnwind>(0) else {
            count(stat::DROP_EXCEPTION_RESTORE_LOST);
            return 0;
        };
        let message = entry.as_mut_ptr();
        let mut filled = 0usize;
        for index in 0..RETURN_SLOTS {
            if instance == 0 {
                break;
            }
            let stack = kernel_word(instance + offsets.instance_stack as u64);
            let original = kernel_word(instance + offsets.instance_original as u64);
            let function = kernel_word(instance + offsets.instance_func as u64);
            instance = kernel_word(instance + offsets.instance_next as u64);
            // Only a word that still holds the trampoline needs its return
            // address back (a chained instance shares its word).
            let holds_trampoline = unsafe { bpf_probe_read_user(stack as *const u64) }
                .is_ok_and(tracer_ebpf::is_uprobe_trampoline);
            let slot = ReturnSlot {
                stack: if holds_trampoline { stack } else { 0 },
                original,
                function,
            };
            unsafe { (*message).slots[index] = slot };
            if holds_trampoline {
                filled = index + 1;
            }
        }
        if filled == 0 {
            entry.discard(0);
            return 0;
        }
        let now = unsafe { bpf_ktime_get_ns() };
        unsafe {
            (*message).thread = thread;
            (*message).held_since_ns = now;
            (*message).count = filled as u32;
            (*message).cut = u32::from(instance != 0);
        }
        if EXCEPTION_HELD.insert(&thread, &now, 0).is_err() {
            entry.discard(0);
            count(stat::DROP_EXCEPTION_RESTORE_LOST);
            return 0;
        }
        // Stopped before the message is sent: userspace's SIGCONT, which
        // follows the message, always comes after the stop.
        // The stop goes to this thread, not to the process: a process-wide
        // SIGSTOP that another thread sent and has not taken yet makes this
        // one "already pending", and then nothing interrupts this thread on
        // its way back to user space: it would run the unwinder before the
        // stop reached it.
        if unsafe { bpf_send_signal_thread(SIGSTOP) } != 0 {
            let _ = EXCEPTION_HELD.remove(&thread);
            entry.discard(0);
            count(stat::DROP_EXCEPTION_RESTORE_LOST);
            return 0;
        }
        entry.submit(0);
        0
    })
}
