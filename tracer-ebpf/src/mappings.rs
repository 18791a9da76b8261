//! The mapping programs: tracepoints on the entry and exit of mmap, munmap,
//! mremap, brk and mprotect, filtered to the traced processes (TARGETS).
//!
//! Mapping calls are rare next to malloc calls (each costs the target a
//! system call and page-table work), so every successful one goes to
//! userspace as one `MappingEvent`, without waking it. The range
//! arithmetic (partial unmaps, moves, MAP_FIXED replacing, protection
//! changes) lives in userspace, where a B-tree handles 100 k mappings in
//! microseconds; the kernel only carries the arguments from entry to exit,
//! takes the stack and notes whether the thread was inside an allocator
//! call (`inside_allocator_call`): such a mapping is the allocator's.
//!
//! `--resident` adds madvise (advice that gives pages back, or asks for
//! huge pages) and the user page faults of the traced processes: each
//! fault goes to userspace with its stack (the same walk as a mapping
//! call's), which charges the page to that stack on its first touch.
use aya_ebpf::{
    Global,
    bindings::{BPF_ANY, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_probe_read_kernel,
        bpf_probe_read_user, bpf_task_pt_regs,
    },
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap, RingBuf},
    programs::TracePointContext,
};
use tracer_ebpf::{
    MappingEvent, NO_STACK, SyscallFieldOffsets, advice, counted, mapping_call, stat, target,
};

use crate::{counters::count, pending::PENDING, runs::counted_run};

/// Where the tracepoint fields are, read from tracefs by userspace.
#[unsafe(no_mangle)]
static SYSCALL_FIELD_OFFSETS: Global<SyscallFieldOffsets> = Global::new(SyscallFieldOffsets {
    mmap_addr: 0,
    mmap_len: 0,
    mmap_prot: 0,
    mmap_flags: 0,
    mmap_fd: 0,
    munmap_addr: 0,
    munmap_len: 0,
    mremap_addr: 0,
    mremap_old_len: 0,
    mremap_new_len: 0,
    mprotect_start: 0,
    mprotect_len: 0,
    mprotect_prot: 0,
    madvise_start: 0,
    madvise_len: 0,
    madvise_behavior: 0,
    fault_address: 0,
    fault_error_code: 0,
    exit_ret: 0,
    syscall_nr: 0,
    brk_syscall: 0,
});

/// The traced processes (tgid -> `tracer_ebpf::target`), filled by
/// userspace.
#[map]
pub(crate) static TARGETS: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Per thread (pid_tgid): the mapping call between its entry and exit.
/// Preallocated (an LRU map): room for 4096 threads inside a mapping call at
/// once (16 Ki entries cost every attach 10 ms).
#[map]
static MAPPING_PENDING: LruHashMap<u64, MappingEvent> = LruHashMap::with_max_entries(4096, 0);

/// Successful mapping calls, drained by userspace on a timer.
#[map]
static MAPPING_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Results in `[-4095, -1]` are errors.
const MAX_ERRNO: u64 = 4095;

#[inline(always)]
fn field(ctx: &TracePointContext, offset: u64) -> u64 {
    unsafe { ctx.read_at::<u64>(offset as usize) }.unwrap_or(0)
}

/// Starts following a mapping call of a target thread; `with_stack` takes
/// its user stack (calls that add mappings).
#[inline(always)]
fn enter(ctx: &TracePointContext, mut event: MappingEvent, with_stack: bool) {
    let thread = bpf_get_current_pid_tgid();
    let tgid = (thread >> 32) as u32;
    let Some(&how) = (unsafe { TARGETS.get(&tgid) }) else {
        return;
    };
    event.tgid = tgid;
    event.stack_id = NO_STACK;
    if inside_allocator_call(thread) {
        event.in_allocator = 1;
    } else if with_stack && how & target::RESIDENT == 0 {
        take_stack(ctx, tgid, &mut event, true);
    }
    if MAPPING_PENDING
        .insert(&thread, &event, BPF_ANY as u64)
        .is_err()
    {
        count(stat::DROP_MAPPING_PENDING_FULL);
    }
}

/// The user stack of the current thread, from its registers at the
/// system call or fault: copied, walked through unwind tables, or by
/// frame pointers; `leaf_caller` also keeps the word at the stack pointer
/// for a frame-pointer walk (a leaf syscall wrapper's caller).
#[inline(always)]
fn take_stack(ctx: &TracePointContext, tgid: u32, event: &mut MappingEvent, leaf_caller: bool) {
    // A copied stack is unwound through the syscall wrapper itself.
    match crate::stacks::copy_at_syscall(tgid) {
        Some(stack_ref) => event.stack_id = stack_ref,
        None => {
            match crate::stacks::walk_at_syscall(ctx, tgid, event.call == mapping_call::FAULT) {
                // Walked through the wrapper by its table.
                Some(stack_id) => event.stack_id = stack_id,
                None => {
                    event.stack_id = crate::stacks::walk_frame_pointers(ctx);
                    if leaf_caller {
                        event.caller_address = word_at_user_sp();
                    }
                }
            }
        }
    }
}

/// Sends the pending call of this thread if it succeeded.
#[inline(always)]
fn exit(ctx: &TracePointContext) {
    let thread = bpf_get_current_pid_tgid();
    let Some(pending) = (unsafe { MAPPING_PENDING.get(&thread) }) else {
        return;
    };
    let mut event = *pending;
    let _ = MAPPING_PENDING.remove(&thread);
    let result = field(ctx, SYSCALL_FIELD_OFFSETS.load().exit_ret);
    if result >= MAX_ERRNO.wrapping_neg() {
        return;
    }
    event.result = result;
    count(stat::MAPPING_CALLS);
    if MAPPING_EVENTS
        .output::<MappingEvent>(&event, BPF_RB_NO_WAKEUP as u64)
        .is_err()
    {
        count(stat::DROP_MAPPING_EVENTS);
    }
}

/// Whether the thread is inside a traced allocator call: any call of the
/// malloc family (free and operator delete included, recorded or not), or
/// a CUDA call. A mapping made there is the allocator's own (a glibc
/// arena, a large block, pinned host memory), counted once, as the
/// allocator's blocks.
#[inline(always)]
fn inside_allocator_call(thread: u64) -> bool {
    if let Some(pending) = unsafe { PENDING.get(&thread) } {
        if pending.depth > 0 {
            return true;
        }
        if (pending.unrecorded_sp != 0 || pending.free_sp != 0)
            && let Some(sp) = user_sp()
            && crate::pending::inside_allocator_call(pending, sp)
        {
            return true;
        }
    }
    crate::gpu_pending::inside_gpu_call(thread)
}

/// The user stack pointer of the current thread at its system call.
#[inline(always)]
fn user_sp() -> Option<u64> {
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u64;
        bpf_probe_read_kernel(regs.add(crate::stacks::PT_REGS_SP_INDEX)).ok()
    }
}

/// The word at the user stack pointer: a leaf syscall wrapper's return
/// address (userspace keeps it only when the innermost frame is one).
#[inline(always)]
fn word_at_user_sp() -> u64 {
    let Some(sp) = user_sp() else {
        return 0;
    };
    unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
}

/// mmap and brk, the calls that add mappings and take a stack: one
/// program on both tracepoints (`__syscall_nr` tells them apart), as its
/// stack walk is the costliest verification of the mapping programs,
/// done once instead of twice at every attach.
#[tracepoint]
pub fn mmap_enter(ctx: TracePointContext) -> u32 {
    counted_run(counted::MMAP_ENTER, || {
        let offsets = SYSCALL_FIELD_OFFSETS.load();
        let syscall =
            unsafe { ctx.read_at::<i32>(offsets.syscall_nr as usize) }.map_or(-1, i64::from);
        let event = if syscall == offsets.brk_syscall as i64 {
            MappingEvent {
                call: mapping_call::BRK,
                ..MappingEvent::default()
            }
        } else {
            MappingEvent {
                call: mapping_call::MMAP,
                address: field(&ctx, offsets.mmap_addr),
                length: field(&ctx, offsets.mmap_len),
                prot: field(&ctx, offsets.mmap_prot),
                flags: field(&ctx, offsets.mmap_flags),
                fd: field(&ctx, offsets.mmap_fd),
                ..MappingEvent::default()
            }
        };
        enter(&ctx, event, true);
        0
    })
}

#[tracepoint]
pub fn munmap_enter(ctx: TracePointContext) -> u32 {
    counted_run(counted::MUNMAP_ENTER, || {
        let offsets = SYSCALL_FIELD_OFFSETS.load();
        let event = MappingEvent {
            call: mapping_call::MUNMAP,
            address: field(&ctx, offsets.munmap_addr),
            length: field(&ctx, offsets.munmap_len),
            ..MappingEvent::default()
        };
        enter(&ctx, event, false);
        0
    })
}

#[tracepoint]
pub fn mremap_enter(ctx: TracePointContext) -> u32 {
    counted_run(counted::MREMAP_ENTER, || {
        let offsets = SYSCALL_FIELD_OFFSETS.load();
        let event = MappingEvent {
            call: mapping_call::MREMAP,
            address: field(&ctx, offsets.mremap_addr),
            length: field(&ctx, offsets.mremap_old_len),
            new_length: field(&ctx, offsets.mremap_new_len),
            ..MappingEvent::default()
        };
        enter(&ctx, event, false);
        0
    })
}

#[tracepoint]
pub fn mprotect_enter(ctx: TracePointContext) -> u32 {
    counted_run(counted::MPROTECT_ENTER, || {
        let offsets = SYSCALL_FIELD_OFFSETS.load();
        let event = MappingEvent {
            call: mapping_call::MPROTECT,
            address: field(&ctx, offsets.mprotect_start),
            length: field(&ctx, offsets.mprotect_len),
            prot: field(&ctx, offsets.mprotect_prot),
            ..MappingEvent::default()
        };
        enter(&ctx, event, false);
        0
    })
}

/// One exit program for every mapping call: what to send is pending.
#[tracepoint]
pub fn mapping_exit(ctx: TracePointContext) -> u32 {
    counted_run(counted::MAPPING_EXIT, || {
        exit(&ctx);
        0
    })
}

/// madvise (`--resident` only): its advice tells userspace whether the
/// range's pages were given back, or may be huge pages.
#[tracepoint]
pub fn madvise_enter(ctx: TracePointContext) -> u32 {
    counted_run(counted::MADVISE_ENTER, || {
        let offsets = SYSCALL_FIELD_OFFSETS.load();
        let advice = field(&ctx, offsets.madvise_behavior);
        if !advice::is_followed(advice) {
            return 0;
        }
        let event = MappingEvent {
            call: mapping_call::MADVISE,
            address: field(&ctx, offsets.madvise_start),
            length: field(&ctx, offsets.madvise_len),
            prot: advice,
            ..MappingEvent::default()
        };
        enter(&ctx, event, false);
        0
    })
}

/// The page fault error code's bit for a write access (x86).
const FAULT_WRITE: u64 = 1 << 1;

/// A user page fault of a target (`--resident`): sent with its stack, no
/// matter whether the page is new (userspace charges a page once, at its
/// first fault, and ignores the faults of pages it holds).
#[tracepoint]
pub fn page_fault(ctx: TracePointContext) -> u32 {
    counted_run(counted::PAGE_FAULT, || {
        let thread = bpf_get_current_pid_tgid();
        let tgid = (thread >> 32) as u32;
        let Some(&how) = (unsafe { TARGETS.get(&tgid) }) else {
            return 0;
        };
        if how & target::RESIDENT == 0 {
            return 0;
        }
        let offsets = SYSCALL_FIELD_OFFSETS.load();
        let address = field(&ctx, offsets.fault_address);
        let shift = (how >> target::SAMPLE_SHIFT_BIT) & 0x7f;
        let shift = if shift > target::MAX_SAMPLE_SHIFT {
            target::MAX_SAMPLE_SHIFT
        } else {
            shift
        };
        if !target::page_sampled(address, shift) {
            return 0;
        }
        let write = field(&ctx, offsets.fault_error_code) & FAULT_WRITE != 0;
        let mut event = MappingEvent {
            tgid,
            call: mapping_call::FAULT,
            address,
            length: 4096,
            prot: write as u64,
            new_length: u64::from(shift),
            stack_id: NO_STACK,
            ..MappingEvent::default()
        };
        take_stack(&ctx, tgid, &mut event, false);
        count(stat::PAGE_FAULTS);
        if MAPPING_EVENTS
            .output::<MappingEvent>(&event, BPF_RB_NO_WAKEUP as u64)
            .is_err()
        {
            count(stat::DROP_FAULT_EVENTS);
        }
        0
    })
}
